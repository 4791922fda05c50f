/* log: leveled lines on stderr. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static int log_level = LOG_INFO;   /* set once before threads start */
static int log_json;

static const char *const level_names[] = { "error", "warn", "info", "debug" };

void log_set_json(int on)
{
    log_json = on;
}

void log_set_level(enum log_level lvl)
{
    log_level = lvl;
}

int log_enabled(enum log_level lvl)
{
    return (int)lvl <= log_level;
}

int log_parse_level(const char *s, enum log_level *out)
{
    for (int i = 0; i <= LOG_DEBUG; i++) {
        if (strcasecmp(s, level_names[i]) == 0) {
            *out = (enum log_level)i;
            return 0;
        }
    }
    if (strcasecmp(s, "warning") == 0) {
        *out = LOG_WARN;
        return 0;
    }
    return -1;
}

/* A line being built. Every variable field is written by add_field with a
 * cap, and the caps add up to less than the buffer, so a line is always
 * whole: its closing brace or its last field is never cut off. 'add' still
 * refuses to run past the end, as a last guard. */
#define LOG_LINE_MAX 4096
#define LOG_MSG_MAX 2048     /* a message, escaped */
#define LOG_PATH_MAX 1024    /* a request path, escaped */
#define LOG_SHORT_MAX 128    /* method, instance, request id, error code */

typedef struct line {
    char b[LOG_LINE_MAX];
    size_t n;
} line;

static void add(line *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void add(line *l, const char *fmt, ...)
{
    va_list ap;
    int w;

    if (l->n >= sizeof l->b - 1)
        return;
    va_start(ap, fmt);
    w = vsnprintf(l->b + l->n, sizeof l->b - l->n, fmt, ap);
    va_end(ap);
    if (w > 0)
        l->n += (size_t)w < sizeof l->b - l->n ? (size_t)w : sizeof l->b - 1 - l->n;
}

/* The length of the well-formed UTF-8 sequence at s (at most 'left' bytes;
 * no overlongs, surrogates or values past U+10FFFF), or 0 when there is
 * none: the byte is then escaped on its own. */
static size_t utf8_len(const unsigned char *s, size_t left)
{
    size_t n;
    unsigned cp;

    if (s[0] < 0x80)
        return 1;
    if (s[0] >= 0xc2 && s[0] <= 0xdf)
        n = 2, cp = s[0] & 0x1fu;
    else if (s[0] >= 0xe0 && s[0] <= 0xef)
        n = 3, cp = s[0] & 0x0fu;
    else if (s[0] >= 0xf0 && s[0] <= 0xf4)
        n = 4, cp = s[0] & 0x07u;
    else
        return 0;
    if (n > left)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3fu);
    }
    if ((n == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (n == 4 && (cp < 0x10000 || cp > 0x10ffff)))
        return 0;
    return n;
}

/* One character of 's' (at most 'left' bytes) as it goes into a line: its
 * bytes in 'out', the input bytes it took in *took. JSON escapes quotes,
 * backslashes and control bytes and turns a byte that is not UTF-8 into
 * U+FFFD; text escapes control bytes (a newline would start a line that is
 * not one) and shows a byte that is not UTF-8 as \xNN. */
static size_t encode_char(const char *s, size_t left, int json, char out[8], size_t *took)
{
    unsigned char c = (unsigned char)s[0];
    size_t u = utf8_len((const unsigned char *)s, left);

    *took = u ? u : 1;
    if (u > 1) {
        memcpy(out, s, u);
        return u;
    }
    if (u == 0)
        return json ? (size_t)snprintf(out, 8, "\\ufffd") : (size_t)snprintf(out, 8, "\\x%02x", c);
    if (c == '\n' || c == '\t' || c == '\r')
        return (size_t)snprintf(out, 8, "\\%c", c == '\n' ? 'n' : c == '\t' ? 't' : 'r');
    if (c < 0x20 || c == 0x7f)
        return json ? (size_t)snprintf(out, 8, "\\u%04x", c) : (size_t)snprintf(out, 8, "\\x%02x", c);
    if (json && (c == '"' || c == '\\')) {
        out[0] = '\\';
        out[1] = (char)c;
        return 2;
    }
    out[0] = (char)c;
    return 1;
}

/* Appends 'len' bytes of 's' as a field of at most 'cap' bytes (JSON: the
 * inside of a string). A field that does not fit is cut between two
 * characters and ends with an ellipsis; so does one whose text was cut
 * before it came here ('cut'). */
#define ELLIPSIS "\xe2\x80\xa6"
static void add_field(line *l, const char *s, size_t len, size_t cap, int json, int cut)
{
    char enc[8];
    size_t total = 0, took, w, i;

    for (i = 0; i < len && total <= cap; i += took)
        total += encode_char(s + i, len - i, json, enc, &took);
    cut = cut || total > cap;
    if (cut)
        cap -= sizeof ELLIPSIS - 1;
    if (l->n + cap + sizeof ELLIPSIS >= sizeof l->b)
        cap = 0;                               /* cannot happen with the caps above */
    for (i = 0, total = 0; i < len; i += took) {
        w = encode_char(s + i, len - i, json, enc, &took);
        if (total + w > cap)
            break;
        memcpy(l->b + l->n, enc, w);
        l->n += w;
        total += w;
    }
    if (cut) {
        memcpy(l->b + l->n, ELLIPSIS, sizeof ELLIPSIS - 1);
        l->n += sizeof ELLIPSIS - 1;
    }
}

static void add_str(line *l, const char *s, size_t cap, int json)
{
    add_field(l, s != NULL ? s : "", s != NULL ? strlen(s) : 0, cap, json, 0);
}

static void add_time(line *l)
{
    struct timespec ts;
    struct tm tm;

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    add(l, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900, tm.tm_mon + 1,
        tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
}

/* One write(2) per line keeps lines whole across threads. */
static void emit(line *l)
{
    if (l->n > sizeof l->b - 1)
        l->n = sizeof l->b - 1;
    l->b[l->n++] = '\n';
    if (write(STDERR_FILENO, l->b, l->n) < 0)
        return;
}

/* A line's start: its time and level, in text or as JSON's first fields. */
static void add_start(line *l, enum log_level lvl)
{
    if (log_json) {
        add(l, "{\"ts\":\"");
        add_time(l);
        add(l, "\",\"level\":\"%s\"", level_names[lvl]);
    } else {
        add_time(l);
        add(l, " %-5s", level_names[lvl]);
    }
}

void log_msg(enum log_level lvl, const char *fmt, ...)
{
    char msg[LOG_MSG_MAX * 2];
    line l = { .n = 0 };
    va_list ap;
    int w;

    if (!log_enabled(lvl))
        return;
    va_start(ap, fmt);
    w = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (w < 0)
        w = 0;
    add_start(&l, lvl);
    add(&l, log_json ? ",\"msg\":\"" : " ");
    add_field(&l, msg, strlen(msg), LOG_MSG_MAX, log_json, (size_t)w >= sizeof msg);
    if (log_json)
        add(&l, "\"}");
    emit(&l);
}

/* A string of the access line: in text 'sep' and the string, in JSON
 * ,"<key>":"<the string>". */
static void add_access_str(line *l, const char *sep, const char *key, const char *s, size_t cap)
{
    if (log_json)
        add(l, ",\"%s\":\"", key);
    else
        add(l, "%s", sep);
    add_str(l, s, cap, log_json);
    if (log_json)
        add(l, "\"");
}

void log_access(const log_access_line *a)
{
    line l = { .n = 0 };

    if (!log_enabled(LOG_INFO))
        return;
    add_start(&l, LOG_INFO);
    add(&l, log_json ? ",\"msg\":\"access\"" : " access");
    add_access_str(&l, " ", "method", a->method, LOG_SHORT_MAX);
    add_access_str(&l, " ", "path", a->path, LOG_PATH_MAX);
    if (log_json)
        add(&l, ",\"status\":%d,\"latencyMs\":%.3f", a->status, a->latency_ms);
    else
        add(&l, " %d %.3fms", a->status, a->latency_ms);
    add_access_str(&l, " ", "instance", a->instance, LOG_SHORT_MAX);
    add_access_str(&l, " rid=", "requestId", a->request_id, LOG_SHORT_MAX);
    if (a->error != NULL)
        add_access_str(&l, " ", "error", a->error, LOG_SHORT_MAX);
    if (log_json) {
        if (a->voucher_id != 0)
            add(&l, ",\"voucherId\":%lld", (long long)a->voucher_id);
        if (a->user_id != 0)
            add(&l, ",\"userId\":%lld", (long long)a->user_id);
        if (a->order_id != 0)   /* a string, like in the API: it passes 2^53 */
            add(&l, ",\"orderId\":\"%lld\"", (long long)a->order_id);
        add(&l, "}");
    } else if (a->order_id != 0) {
        add(&l, " order=%lld user=%lld", (long long)a->order_id, (long long)a->user_id);
    }
    emit(&l);
}
