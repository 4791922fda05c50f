/* unit_util: the pure parsers and helpers of util.h (ids, ISO-8601 times,
 * UTF-8, secrets, UUIDs, comma lists, bounded strings). No Redis, no
 * Postgres. */
#include <stdint.h>
#include <string.h>

#include "t.h"
#include "util.h"

/* util_parse_id on a NUL-terminated string; the value, or -1 when refused. */
static int64_t id_of(const char *s)
{
    int64_t v = 0;
    return util_parse_id(s, strlen(s), &v) == 0 ? v : -1;
}

static int64_t u63_of(const char *s)
{
    int64_t v = 0;
    return util_parse_u63(s, strlen(s), &v) == 0 ? v : -1;
}

static int64_t iso_of(const char *s)
{
    int64_t v = 0;
    return util_parse_iso8601(s, &v) == 0 ? v : INT64_MIN;
}

static void test_parse_id_accepts_positive_decimals(void)
{
    T_EQ_I64(id_of("1"), 1);
    T_EQ_I64(id_of("42"), 42);
    T_EQ_I64(id_of("007"), 7);
    T_EQ_I64(id_of("9223372036854775807"), INT64_MAX);
}

static void test_parse_id_refuses_everything_else(void)
{
    static const char *const bad[] = { "", "0", "000", "-1", "+1", " 1", "1 ", "1a", "a1",
                                       "0x10", "1e3", "1.0", "9223372036854775808",
                                       "99999999999999999999" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (!T_ASSERT(id_of(bad[i]) == -1))
            printf("    refused input was \"%s\"\n", bad[i]);
}

static void test_parse_id_reads_only_len_bytes(void)
{
    int64_t v = 0;
    T_EQ_I64(util_parse_id("123/seckill", 3, &v), 0);
    T_EQ_I64(v, 123);
    T_EQ_I64(util_parse_id("123", 0, &v), -1);
    T_EQ_I64(util_parse_id(NULL, 3, &v), -1);
}

static void test_parse_u63_allows_zero(void)
{
    T_EQ_I64(u63_of("0"), 0);
    T_EQ_I64(u63_of("00"), 0);
    T_EQ_I64(u63_of("12"), 12);
    T_EQ_I64(u63_of("-0"), -1);
    T_EQ_I64(u63_of(""), -1);
    T_EQ_I64(u63_of("9223372036854775808"), -1);
}

static void test_iso8601_zones_and_fractions(void)
{
    T_EQ_I64(iso_of("1970-01-01T00:00:00Z"), 0);
    T_EQ_I64(iso_of("2026-11-25T00:00:00Z"), 1795564800);
    T_EQ_I64(iso_of("2026-11-25T00:00:00"), 1795564800);        /* no zone: UTC */
    T_EQ_I64(iso_of("2026-11-25t00:00:00z"), 1795564800);
    T_EQ_I64(iso_of("2026-11-25 00:00:00Z"), 1795564800);
    T_EQ_I64(iso_of("2026-11-25T00:00:00.999Z"), 1795564800);   /* truncated */
    T_EQ_I64(iso_of("2026-11-25T01:30:00+01:30"), 1795564800);
    T_EQ_I64(iso_of("2026-11-25T01:30:00+0130"), 1795564800);
    T_EQ_I64(iso_of("2026-11-24T22:00:00-02:00"), 1795564800);
    T_EQ_I64(iso_of("2024-02-29T12:00:00Z"), 1709208000);       /* leap year */
    T_EQ_I64(iso_of("2016-12-31T23:59:60Z"), 1483228799);       /* leap second folded */
    T_EQ_I64(iso_of("1969-12-31T23:59:59Z"), -1);
}

static void test_iso8601_refuses_malformed(void)
{
    static const char *const bad[] = { "", "2026", "2026-11-25", "2026-11-25T00:00",
                                       "2026-13-01T00:00:00Z", "2026-00-01T00:00:00Z",
                                       "2026-11-31T00:00:00Z", "2023-02-29T00:00:00Z",
                                       "2026-11-25T24:00:00Z", "2026-11-25T00:60:00Z",
                                       "2026-11-25T00:00:61Z", "2026-11-25T00:00:00.Z",
                                       "2026-11-25T00:00:00+24:00", "2026-11-25T00:00:00+01",
                                       "2026-11-25T00:00:00ZZ", "2026-11-25X00:00:00Z",
                                       "26-11-25T00:00:00Z", "2026-1-25T00:00:00Z",
                                       "2026-11-25T00:00:00 Z" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (!T_ASSERT(iso_of(bad[i]) == INT64_MIN))
            printf("    refused input was \"%s\"\n", bad[i]);
    T_EQ_I64(util_parse_iso8601(NULL, &(int64_t){ 0 }), -1);
}

static void test_iso8601_round_trip(void)
{
    char buf[32];
    util_format_iso8601(1795564800, buf, sizeof buf);
    T_EQ_STR(buf, "2026-11-25T00:00:00Z");
    util_format_iso8601(0, buf, sizeof buf);
    T_EQ_STR(buf, "1970-01-01T00:00:00Z");
    for (int64_t t = 0; t < 4102444800LL; t += 86399LL * 37) {
        util_format_iso8601(t, buf, sizeof buf);
        if (!T_EQ_I64(iso_of(buf), t))
            break;
    }
}

static void test_utf8_validation(void)
{
    T_ASSERT(util_utf8_valid("", 0));
    T_ASSERT(util_utf8_valid("plain ascii", 11));
    T_ASSERT(util_utf8_valid("caf\xc3\xa9", 5));                    /* U+00E9 */
    T_ASSERT(util_utf8_valid("\xe2\x82\xac", 3));                   /* U+20AC */
    T_ASSERT(util_utf8_valid("\xf0\x9f\x8e\x81", 4));               /* U+1F381 */
    T_ASSERT(util_utf8_valid("\xf4\x8f\xbf\xbf", 4));               /* U+10FFFF */
    T_ASSERT(!util_utf8_valid("\xc3", 1));                          /* truncated */
    T_ASSERT(!util_utf8_valid("\xc0\xaf", 2));                      /* overlong '/' */
    T_ASSERT(!util_utf8_valid("\xe0\x80\xaf", 3));                  /* overlong */
    T_ASSERT(!util_utf8_valid("\xed\xa0\x80", 3));                  /* surrogate D800 */
    T_ASSERT(!util_utf8_valid("\xf4\x90\x80\x80", 4));              /* above U+10FFFF */
    T_ASSERT(!util_utf8_valid("\x80", 1));                          /* lone continuation */
    T_ASSERT(!util_utf8_valid("\xff", 1));
    T_ASSERT(util_utf8_valid("a\0b", 3));                           /* NUL is valid UTF-8 */
}

static void test_secret_equal(void)
{
    T_ASSERT(util_secret_equal("s3cret", "s3cret"));
    T_ASSERT(util_secret_equal("", ""));
    T_ASSERT(!util_secret_equal("s3cret", "s3cres"));
    T_ASSERT(!util_secret_equal("s3cret", "s3cre"));
    T_ASSERT(!util_secret_equal("s3cre", "s3cret"));
    T_ASSERT(!util_secret_equal("s3cret", ""));
    T_ASSERT(!util_secret_equal("", "x"));
}

static int is_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

static void test_uuid4_format(void)
{
    char a[37], b[37];
    util_uuid4(a);
    util_uuid4(b);
    T_EQ_I64(strlen(a), 36);
    for (int i = 0; i < 36; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23) {
            if (!T_ASSERT(a[i] == '-'))
                break;
        } else if (!T_ASSERT(is_hex(a[i]))) {
            break;
        }
    }
    T_ASSERT(a[14] == '4');                                          /* version 4 */
    T_ASSERT(a[19] == '8' || a[19] == '9' || a[19] == 'a' || a[19] == 'b');   /* RFC 4122 */
    T_ASSERT(strcmp(a, b) != 0);
}

/* util_list: the entries of "a,,b" and "a," joined with '|' after each. */
static void list_of(const char *in, const char *want, int last_empty)
{
    char got[64];
    util_sbuf sb = util_sbuf_init(got, sizeof got);
    util_list it;
    const char *e;
    size_t len;
    int n = 0;

    util_list_init(&it, in);
    while (util_list_next(&it, &e, &len)) {
        util_sbuf_mem(&sb, e, len);
        util_sbuf_str(&sb, "|");
        n++;
        if (it.last && !T_EQ_I64(len == 0, last_empty))
            break;
    }
    T_EQ_STR(got, want);
    T_ASSERT(n > 0);
    T_EQ_I64(util_list_next(&it, &e, &len), 0);
}

static void test_list_entries(void)
{
    list_of("", "|", 1);
    list_of("a", "a|", 0);
    list_of("a,bc", "a|bc|", 0);
    list_of("a,,b", "a||b|", 0);
    list_of("a,", "a||", 1);
    list_of(",a", "|a|", 0);
}

/* util_sbuf: cut at the buffer's end, always terminated, no room: untouched. */
static void test_sbuf_cuts(void)
{
    char b[8];
    util_sbuf sb;

    memset(b, 'x', sizeof b);
    sb = util_sbuf_init(b, 5);
    util_sbuf_str(&sb, "ab");
    util_sbuf_mem(&sb, "cdef", 4);
    T_EQ_STR(b, "abcd");
    T_EQ_I64(sb.len, 4);
    T_EQ_I64(b[5], 'x');
    util_sbuf_str(&sb, "g");
    T_EQ_STR(b, "abcd");
    b[0] = 'x';
    sb = util_sbuf_init(b, 0);
    util_sbuf_str(&sb, "a");
    T_EQ_I64(b[0], 'x');
}

int main(void)
{
    T_RUN(test_parse_id_accepts_positive_decimals);
    T_RUN(test_parse_id_refuses_everything_else);
    T_RUN(test_parse_id_reads_only_len_bytes);
    T_RUN(test_parse_u63_allows_zero);
    T_RUN(test_iso8601_zones_and_fractions);
    T_RUN(test_iso8601_refuses_malformed);
    T_RUN(test_iso8601_round_trip);
    T_RUN(test_utf8_validation);
    T_RUN(test_secret_equal);
    T_RUN(test_uuid4_format);
    T_RUN(test_list_entries);
    T_RUN(test_sbuf_cuts);
    return t_done();
}
