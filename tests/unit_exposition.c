/* unit_exposition: the Prometheus label escaping (exposition_escape): backslash,
 * double quote and newline escaped as the text exposition format requires
 * (prometheus.io/docs/instrumenting/exposition_formats), everything else
 * kept, and a short buffer truncated whole, never overrun. */
#include <string.h>

#include "exposition.h"
#include "t.h"

static const char *esc(const char *in, size_t n)
{
    static char buf[256];
    memset(buf, 'x', sizeof buf);
    exposition_escape(in, buf, n);
    return buf;
}

static void test_escapes_the_three_characters(void)
{
    T_EQ_STR(esc("plain-label_1.0", 256), "plain-label_1.0");
    T_EQ_STR(esc("", 256), "");
    T_EQ_STR(esc("a\"b", 256), "a\\\"b");
    T_EQ_STR(esc("a\\b", 256), "a\\\\b");
    T_EQ_STR(esc("a\nb", 256), "a\\nb");
    T_EQ_STR(esc("\"\\\n", 256), "\\\"\\\\\\n");
    /* Tabs, carriage returns and UTF-8 are legal in label values. */
    T_EQ_STR(esc("t\tr\rcaf\xc3\xa9", 256), "t\tr\rcaf\xc3\xa9");
}

static void test_short_buffer_truncates_and_terminates(void)
{
    const char *s = esc("abcdefghij", 5);
    T_ASSERT(strlen(s) < 5);
    T_ASSERT(strncmp(s, "abcdefghij", strlen(s)) == 0);
    T_EQ_I64(s[5], 'x');                       /* nothing written past n */

    /* An escape is never cut in half: no lone backslash at the end. */
    for (size_t n = 1; n < 12; n++) {
        s = esc("\"\"\"\"\"\"", n);
        size_t len = strlen(s);
        if (!T_ASSERT(len < n && len % 2 == 0))
            printf("    n=%zu gave \"%s\"\n", n, s);
        T_EQ_I64(s[n], 'x');
    }
}

int main(void)
{
    T_RUN(test_escapes_the_three_characters);
    T_RUN(test_short_buffer_truncates_and_terminates);
    return t_done();
}
