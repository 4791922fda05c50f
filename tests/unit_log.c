/* unit_log: log lines stay whole, whatever the length and bytes of what
 * they carry. A field that does not fit is cut at a character boundary and
 * ends with "…"; the line keeps every other field, and in JSON it stays one
 * valid object (valid UTF-8 included): valid characters are kept, bytes that
 * are not UTF-8 escaped. LOG_LEVEL's names. No Redis, no Postgres. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cJSON.h>

#include "log.h"
#include "t.h"
#include "util.h"

#define ELLIPSIS "\xe2\x80\xa6"

static char out[1 << 16];

/* Runs 'fn' with stderr going to a temporary file; the bytes written are in
 * 'out' (NUL-terminated). */
static size_t capture(void (*fn)(void))
{
    FILE *tmp = tmpfile();
    int saved = dup(STDERR_FILENO);
    size_t n = 0;

    if (!T_ASSERT(tmp != NULL && saved >= 0))
        return 0;
    fflush(stderr);
    dup2(fileno(tmp), STDERR_FILENO);
    fn();
    dup2(saved, STDERR_FILENO);
    close(saved);
    rewind(tmp);
    n = fread(out, 1, sizeof out - 1, tmp);
    out[n] = '\0';
    fclose(tmp);
    return n;
}

/* 1 when 'out' is exactly one line ending in '\n', with no other newline. */
static int one_line(size_t n)
{
    return n > 0 && out[n - 1] == '\n' && memchr(out, '\n', n - 1) == NULL;
}

/* The line in 'out' parsed as one JSON object (NULL when it is not), after
 * checking that it is well-formed UTF-8. */
static cJSON *parse_line(size_t n)
{
    const char *end = NULL;
    cJSON *o;

    if (!T_ASSERT(one_line(n)) || !T_ASSERT(util_utf8_valid(out, n)))
        return NULL;
    out[n - 1] = '\0';
    o = cJSON_ParseWithOpts(out, &end, 1);
    if (!T_ASSERT(o != NULL && cJSON_IsObject(o)))
        printf("    line (%zu bytes): %.80s...%s\n", n, out, n > 60 ? out + n - 60 : "");
    return o;
}

static const char *str_field(const cJSON *o, const char *name)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsString(f) ? f->valuestring : "";
}

static int ends_with(const char *s, const char *tail)
{
    size_t a = strlen(s), b = strlen(tail);
    return a >= b && memcmp(s + a - b, tail, b) == 0;
}

/* A 3,000-byte path: quotes, backslashes, a control byte, an invalid UTF-8
 * byte, then two-byte characters, so that any cut could split one. */
static char long_path[3001];

static void make_long_path(void)
{
    size_t n = 0;

    memcpy(long_path, "/\"\\\x01\xff", 5);
    n = 5;
    while (n + 2 <= 3000) {
        memcpy(long_path + n, "\xc3\xa9", 2);   /* é */
        n += 2;
    }
    long_path[n] = '\0';
}

static void access_long_path(void)
{
    log_access_line a = {
        .method = "GET", .path = long_path, .instance = "seckill-1", .request_id = "rid-1",
        .status = 404, .latency_ms = 1.5, .error = "not_found",
    };
    log_access(&a);
}

static void test_json_access_line_with_a_long_path(void)
{
    size_t n;
    cJSON *o;
    const char *p;

    make_long_path();
    log_set_json(1);
    n = capture(access_long_path);
    if ((o = parse_line(n)) == NULL)
        return;
    p = str_field(o, "path");
    T_ASSERT(strncmp(p, "/\"\\\x01\xef\xbf\xbd\xc3\xa9", 9) == 0);   /* \ufffd for 0xff */
    T_ASSERT(ends_with(p, ELLIPSIS));
    T_ASSERT(strlen(p) < 3000);
    T_EQ_STR(str_field(o, "requestId"), "rid-1");
    T_EQ_STR(str_field(o, "error"), "not_found");
    T_EQ_I64(cJSON_GetObjectItemCaseSensitive(o, "status")->valuedouble, 404);
    cJSON_Delete(o);
}

static void test_text_access_line_with_a_long_path(void)
{
    size_t n;

    make_long_path();
    log_set_json(0);
    n = capture(access_long_path);
    if (!T_ASSERT(one_line(n)) || !T_ASSERT(util_utf8_valid(out, n)))
        return;
    out[n - 1] = '\0';
    T_ASSERT(strstr(out, " info  access GET /\"\\\\x01\\xff\xc3\xa9") != NULL);
    T_ASSERT(strstr(out, ELLIPSIS " 404 1.500ms seckill-1 rid=rid-1 not_found") != NULL);
    T_ASSERT(n < 1600);
}

static char long_msg[5001];

static void msg_long(void)
{
    log_msg(LOG_WARN, "peer said: %s", long_msg);
}

static void test_json_message_of_quotes_and_control_bytes(void)
{
    size_t n;
    cJSON *o;

    /* Each of these doubles or sextuples when escaped. */
    for (size_t i = 0; i < 5000; i++)
        long_msg[i] = i % 2 ? '"' : '\x02';
    long_msg[5000] = '\0';
    log_set_json(1);
    n = capture(msg_long);
    if ((o = parse_line(n)) == NULL)
        return;
    T_EQ_STR(str_field(o, "level"), "warn");
    T_ASSERT(strncmp(str_field(o, "msg"), "peer said: \x02\"\x02\"", 15) == 0);
    T_ASSERT(ends_with(str_field(o, "msg"), ELLIPSIS));
    cJSON_Delete(o);
}

static void msg_multiline(void)
{
    log_msg(LOG_ERROR, "%s", "ERROR:  deadlock detected\nDETAIL:  Process 1 waits\tfor 2.");
}

static void test_text_message_with_newlines_stays_one_line(void)
{
    size_t n;

    log_set_json(0);
    n = capture(msg_multiline);
    if (!T_ASSERT(one_line(n)))
        return;
    T_ASSERT(strstr(out, " error ERROR:  deadlock detected\\nDETAIL:  Process 1 waits\\tfor 2.\n") !=
             NULL);
}

static void test_json_message_with_newlines(void)
{
    size_t n;
    cJSON *o;

    log_set_json(1);
    n = capture(msg_multiline);
    if ((o = parse_line(n)) == NULL)
        return;
    T_EQ_STR(str_field(o, "msg"), "ERROR:  deadlock detected\nDETAIL:  Process 1 waits\tfor 2.");
    cJSON_Delete(o);
}

static void msg_short(void)
{
    log_msg(LOG_INFO, "listening on %s:%d", "127.0.0.1", 8081);
}

static void test_short_lines_are_unchanged(void)
{
    size_t n;
    cJSON *o;

    log_set_json(1);
    n = capture(msg_short);
    if ((o = parse_line(n)) != NULL) {
        T_EQ_STR(str_field(o, "msg"), "listening on 127.0.0.1:8081");
        cJSON_Delete(o);
    }
    log_set_json(0);
    n = capture(msg_short);
    T_ASSERT(one_line(n) && ends_with(out, " info  listening on 127.0.0.1:8081\n"));
}

/* Valid UTF-8 (up to four-byte characters) goes into a line as it is; each
 * byte of a sequence that is not UTF-8 (cut short, a bad continuation byte,
 * overlong, a surrogate, above U+10FFFF) is shown on its own: \xNN in
 * text, U+FFFD in JSON, so the line stays valid UTF-8. */
static const char utf8_mix[] = "ok \xe2\x82\xac \xf0\x9f\x98\x80 |\xf0\x9f\x98|\xe2\x28\xa1|"
                               "\xe0\x80\xaf|\xed\xa0\x80|\xf4\x90\x80\x80|";

static void msg_utf8(void)
{
    log_msg(LOG_WARN, "%s", utf8_mix);
}

static void test_utf8_kept_and_invalid_bytes_escaped(void)
{
    size_t n;
    cJSON *o;

    log_set_json(0);
    n = capture(msg_utf8);
    if (T_ASSERT(one_line(n)) &&
        !T_ASSERT(ends_with(out, " warn  ok \xe2\x82\xac \xf0\x9f\x98\x80 |\\xf0\\x9f\\x98|"
                                 "\\xe2(\\xa1|\\xe0\\x80\\xaf|\\xed\\xa0\\x80|"
                                 "\\xf4\\x90\\x80\\x80|\n")))
        printf("    %s", out);
    log_set_json(1);
    n = capture(msg_utf8);
    if ((o = parse_line(n)) == NULL)
        return;
    if (!T_EQ_STR(str_field(o, "msg"),
                  "ok \xe2\x82\xac \xf0\x9f\x98\x80 |\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd|"
                  "\xef\xbf\xbd(\xef\xbf\xbd|\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd|"
                  "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd|"
                  "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd|"))
        printf("    %s\n", out);
    cJSON_Delete(o);
    log_set_json(0);
}

/* LOG_LEVEL takes the names in any case, and "warning" for warn. */
static void test_level_names(void)
{
    enum log_level l;

    T_EQ_I64(log_parse_level("DEBUG", &l), 0);
    T_EQ_I64(l, LOG_DEBUG);
    T_EQ_I64(log_parse_level("warning", &l), 0);
    T_EQ_I64(l, LOG_WARN);
    T_EQ_I64(log_parse_level("Error", &l), 0);
    T_EQ_I64(l, LOG_ERROR);
    T_EQ_I64(log_parse_level("verbose", &l), -1);
}

int main(void)
{
    log_set_level(LOG_DEBUG);
    T_RUN(test_json_access_line_with_a_long_path);
    T_RUN(test_text_access_line_with_a_long_path);
    T_RUN(test_json_message_of_quotes_and_control_bytes);
    T_RUN(test_text_message_with_newlines_stays_one_line);
    T_RUN(test_json_message_with_newlines);
    T_RUN(test_short_lines_are_unchanged);
    T_RUN(test_utf8_kept_and_invalid_bytes_escaped);
    T_RUN(test_level_names);
    return t_done();
}
