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

/* A line being built; appends never run past the end (they truncate). */
typedef struct line {
    char b[2048];
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

/* Appends 's' as the inside of a JSON string. */
static void add_json(line *l, const char *s)
{
    for (; *s != '\0' && l->n < sizeof l->b - 8; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            add(l, "\\%c", c);
        else if (c < 0x20)
            add(l, "\\u%04x", c);
        else
            l->b[l->n++] = (char)c;
    }
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
    if (l->n > sizeof l->b - 2)
        l->n = sizeof l->b - 2;
    l->b[l->n++] = '\n';
    if (write(STDERR_FILENO, l->b, l->n) < 0)
        return;
}

void log_msg(enum log_level lvl, const char *fmt, ...)
{
    char msg[1536];
    line l = { .n = 0 };
    va_list ap;

    if (!log_enabled(lvl))
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (log_json) {
        add(&l, "{\"ts\":\"");
        add_time(&l);
        add(&l, "\",\"level\":\"%s\",\"msg\":\"", level_names[lvl]);
        add_json(&l, msg);
        add(&l, "\"}");
    } else {
        add_time(&l);
        add(&l, " %-5s %s", level_names[lvl], msg);
    }
    emit(&l);
}

void log_access(const log_access_line *a)
{
    line l = { .n = 0 };

    if (!log_enabled(LOG_INFO))
        return;
    if (!log_json) {
        add_time(&l);
        add(&l, " info  access %s %s %d %.3fms %s rid=%s", a->method, a->path, a->status,
            a->latency_ms, a->instance, a->request_id);
        if (a->error != NULL)
            add(&l, " %s", a->error);
        if (a->order_id != 0)
            add(&l, " order=%lld user=%lld", (long long)a->order_id, (long long)a->user_id);
        emit(&l);
        return;
    }
    add(&l, "{\"ts\":\"");
    add_time(&l);
    add(&l, "\",\"level\":\"info\",\"msg\":\"access\",\"method\":\"");
    add_json(&l, a->method);
    add(&l, "\",\"path\":\"");
    add_json(&l, a->path);
    add(&l, "\",\"status\":%d,\"latencyMs\":%.3f,\"instance\":\"", a->status, a->latency_ms);
    add_json(&l, a->instance);
    add(&l, "\",\"requestId\":\"");
    add_json(&l, a->request_id);
    add(&l, "\"");
    if (a->error != NULL)
        add(&l, ",\"error\":\"%s\"", a->error);
    if (a->voucher_id != 0)
        add(&l, ",\"voucherId\":%lld", (long long)a->voucher_id);
    if (a->user_id != 0)
        add(&l, ",\"userId\":%lld", (long long)a->user_id);
    if (a->order_id != 0)   /* a string, like in the API: it passes 2^53 */
        add(&l, ",\"orderId\":\"%lld\"", (long long)a->order_id);
    add(&l, "}");
    emit(&l);
}
