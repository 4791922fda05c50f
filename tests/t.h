/* t: a tiny test harness for our C tests (in the spirit of hiredis test.c
 * and redis testhelp.h).
 *
 *   static void test_something(void) {
 *       T_ASSERT(1 + 1 == 2);
 *       if (!T_ASSERT(p != NULL)) return;      // stop this case early
 *       T_EQ_I64(f(), 42);                     // prints both values on failure
 *   }
 *   int main(void) { T_RUN(test_something); return t_done(); }
 *
 * Prints "ok - <case>" for a passing case, one "FAIL - <case>: file:line:
 * expr" per failed assertion, and ends with "N passed, M failed" (cases).
 * t_done() returns the exit status: 1 if any case failed.
 *
 * t_redis() connects to REDIS_URL (redis://[[user]:password@]host[:port][/db])
 * and exits with a message when it is unset or unreachable; t_redis_open()
 * returns NULL and the reason instead. */
#ifndef SECKILL_T_H
#define SECKILL_T_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <hiredis/hiredis.h>

typedef struct t_state {
    const char *name;     /* running case */
    int case_failed;
    int passed, failed;
} t_state;

static t_state t_st;

static inline int t_check(int ok, const char *file, int line, const char *expr)
{
    if (!ok) {
        printf("FAIL - %s: %s:%d: %s\n", t_st.name ? t_st.name : "(setup)", file, line, expr);
        fflush(stdout);
        t_st.case_failed = 1;
    }
    return ok;
}

static inline int t_check_i64(int64_t a, int64_t b, const char *file, int line,
                              const char *ea, const char *eb)
{
    if (a != b) {
        printf("FAIL - %s: %s:%d: %s == %s (%lld != %lld)\n",
               t_st.name ? t_st.name : "(setup)", file, line, ea, eb,
               (long long)a, (long long)b);
        fflush(stdout);
        t_st.case_failed = 1;
    }
    return a == b;
}

static inline int t_check_str(const char *a, const char *b, const char *file, int line,
                              const char *ea, const char *eb)
{
    int ok = a != NULL && b != NULL && strcmp(a, b) == 0;
    if (!ok) {
        printf("FAIL - %s: %s:%d: %s == %s (\"%s\" != \"%s\")\n",
               t_st.name ? t_st.name : "(setup)", file, line, ea, eb,
               a ? a : "(null)", b ? b : "(null)");
        fflush(stdout);
        t_st.case_failed = 1;
    }
    return ok;
}

/* Each evaluates to 1 when the check held, so a case can stop early. */
#define T_ASSERT(expr) t_check(!!(expr), __FILE__, __LINE__, #expr)
#define T_EQ_I64(a, b) t_check_i64((int64_t)(a), (int64_t)(b), __FILE__, __LINE__, #a, #b)
#define T_EQ_STR(a, b) t_check_str((a), (b), __FILE__, __LINE__, #a, #b)

static inline void t_run(void (*fn)(void), const char *name)
{
    t_st.name = name;
    t_st.case_failed = 0;
    fn();
    if (t_st.case_failed) {
        t_st.failed++;
    } else {
        t_st.passed++;
        printf("ok - %s\n", name);
    }
    fflush(stdout);
    t_st.name = NULL;
}

#define T_RUN(fn) t_run((fn), #fn)

static inline int t_done(void)
{
    printf("%d passed, %d failed\n", t_st.passed, t_st.failed);
    fflush(stdout);
    return t_st.failed > 0 ? 1 : 0;
}

static inline void t_sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* Monotonic milliseconds, for elapsed times. */
static inline double t_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

/* Directory of the Lua scripts: $LUA_DIR or "lua" (run from the repo root). */
static inline const char *t_lua_dir(void)
{
    const char *d = getenv("LUA_DIR");
    return d != NULL && d[0] != '\0' ? d : "lua";
}

typedef struct t_redis_url {
    char host[256];
    int port;
    char user[128];
    char pass[256];
    int db;
} t_redis_url;

/* Minimal redis:// parser, kept here so the tests do not depend on the
 * module under test elsewhere. Returns 0 or -1. */
static inline int t_parse_redis_url(const char *s, t_redis_url *u)
{
    const char *p, *at, *slash, *colon;
    size_t n;

    memset(u, 0, sizeof *u);
    u->port = 6379;
    if (strncmp(s, "redis://", 8) != 0)
        return -1;
    p = s + 8;
    slash = strchr(p, '/');
    at = strchr(p, '@');
    if (at != NULL && (slash == NULL || at < slash)) {
        colon = memchr(p, ':', (size_t)(at - p));
        if (colon == NULL)
            return -1;
        n = (size_t)(colon - p);
        if (n >= sizeof u->user || (size_t)(at - colon - 1) >= sizeof u->pass)
            return -1;
        memcpy(u->user, p, n);
        memcpy(u->pass, colon + 1, (size_t)(at - colon - 1));
        p = at + 1;
    }
    const char *end = slash != NULL ? slash : p + strlen(p);
    colon = memchr(p, ':', (size_t)(end - p));
    const char *hend = colon != NULL ? colon : end;
    n = (size_t)(hend - p);
    if (n == 0 || n >= sizeof u->host)
        return -1;
    memcpy(u->host, p, n);
    if (colon != NULL) {
        char *e;
        long port = strtol(colon + 1, &e, 10);
        if (e != end || port < 1 || port > 65535)
            return -1;
        u->port = (int)port;
    }
    if (slash != NULL && slash[1] != '\0') {
        char *e;
        long db = strtol(slash + 1, &e, 10);
        if (*e != '\0' || db < 0 || db > 1000000)
            return -1;
        u->db = (int)db;
    }
    return 0;
}

/* A new blocking context on $REDIS_URL with 2 s connect and 5 s command
 * timeouts, authenticated and on the right db, or NULL with the reason in
 * 'err'. Caller frees with redisFree. (The shape of lock_options.connect.) */
static inline redisContext *t_redis_open(char *err, size_t errlen)
{
    const char *url = getenv("REDIS_URL");
    t_redis_url u;
    redisContext *c;
    redisReply *r = NULL;
    struct timeval ct = {2, 0}, ot = {5, 0};

    if (url == NULL || url[0] == '\0') {
        snprintf(err, errlen, "REDIS_URL is not set (e.g. REDIS_URL=redis://127.0.0.1:6379/0)");
        return NULL;
    }
    if (t_parse_redis_url(url, &u) != 0) {
        snprintf(err, errlen, "REDIS_URL %s: cannot parse", url);
        return NULL;
    }
    c = redisConnectWithTimeout(u.host, u.port, ct);
    if (c == NULL || c->err) {
        snprintf(err, errlen, "REDIS_URL %s: %s", url, c ? c->errstr : "out of memory");
        goto fail;
    }
    if (redisSetTimeout(c, ot) != REDIS_OK) {
        snprintf(err, errlen, "REDIS_URL %s: cannot set timeout: %s", url, c->errstr);
        goto fail;
    }
    if (u.pass[0] != '\0') {
        if (u.user[0] != '\0')
            r = redisCommand(c, "AUTH %s %s", u.user, u.pass);
        else
            r = redisCommand(c, "AUTH %s", u.pass);
        if (r == NULL || r->type == REDIS_REPLY_ERROR) {
            snprintf(err, errlen, "REDIS_URL %s: AUTH failed: %s", url, r ? r->str : c->errstr);
            goto fail;
        }
        freeReplyObject(r);
        r = NULL;
    }
    if (u.db != 0) {
        r = redisCommand(c, "SELECT %d", u.db);
        if (r == NULL || r->type == REDIS_REPLY_ERROR) {
            snprintf(err, errlen, "REDIS_URL %s: SELECT failed: %s", url, r ? r->str : c->errstr);
            goto fail;
        }
        freeReplyObject(r);
    }
    return c;
fail:
    freeReplyObject(r);
    if (c != NULL)
        redisFree(c);
    return NULL;
}

/* t_redis_open, or exit when Redis is not usable: the tests cannot run. */
static inline redisContext *t_redis(void)
{
    char err[512];
    redisContext *c = t_redis_open(err, sizeof err);

    if (c == NULL) {
        fprintf(stderr, "%s\n", err);
        exit(2);
    }
    return c;
}

/* Runs a command whose reply the test only needs to be non-error; returns
 * the reply (caller frees) or NULL after recording a failure. */
#define T_CMD(c, ...) t_cmd_checked(__FILE__, __LINE__, (redisReply *)redisCommand((c), __VA_ARGS__))

static inline redisReply *t_cmd_checked(const char *file, int line, redisReply *r)
{
    if (r == NULL) {
        t_check(0, file, line, "redis reply != NULL");
        return NULL;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        char msg[256];
        snprintf(msg, sizeof msg, "redis error: %s", r->str);
        t_check(0, file, line, msg);
        freeReplyObject(r);
        return NULL;
    }
    return r;
}

#endif
