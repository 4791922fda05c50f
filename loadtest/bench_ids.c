/* bench_ids: five ways to make order ids, measured the same way
 * (make bench-ids; loadtest/bench_ids.py starts the services and keeps the
 * table).
 *
 *   bench_ids [--threads N] [--seconds S] [--json PATH]
 *
 * Schemes (REDIS_URL and PG_DSN from the environment):
 *   redis        the service's: 31 bits of seconds | 32 bits of a daily
 *                Redis INCR (app/services/order_id.c), one connection per thread
 *   snowflake    41 bits of ms since 2022 | 10 bits worker | 12 bits of a
 *                per-ms sequence, one generator per process (a mutex)
 *   uuid-v4      122 random bits (getrandom)
 *   uuid-v7      48 bits of Unix ms | random (RFC 9562)
 *   seq          a Postgres sequence, nextval() per id, one session per thread
 *   seq-cache    the same with CACHE 100 (each session reserves 100 at a time)
 *   segment      a range of 1000 ids taken from Postgres at a time
 *                (UPDATE ... RETURNING), handed out in memory (a mutex)
 * For each: ids per second from N threads for S seconds (every id kept);
 * its size; duplicates in that run; ids lower than the thread's previous one;
 * across threads, the share of ids lower than an id some thread had already
 * received before this one was asked for (in a second, shorter run); what a
 * restart does (the generator's state lost: Redis's counter flushed within
 * the same second, the snowflake's last timestamp forgotten, the sequence's
 * sessions and the segment reopened); and a clock step back (10 ms for the
 * millisecond schemes, 1 h for the Redis id's seconds), injected into the
 * scheme's clock. Prints a table; --json writes every figure. */
#include <cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#include <hiredis/hiredis.h>
#include <libpq-fe.h>

#include "t.h"
#define BC_TOOL "bench_ids"
#include "bench_c.h"
#include "order_id.h"
#include "util.h"

typedef struct id128 {
    uint64_t hi, lo;          /* 64-bit schemes: hi = 0 */
} id128;

static int cmp_id(const void *a, const void *b)
{
    const id128 *x = a, *y = b;
    if (x->hi != y->hi)
        return x->hi < y->hi ? -1 : 1;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static int lower(id128 a, id128 b)
{
    return cmp_id(&a, &b) < 0;
}

/*---- the injected clock ----*/

static _Atomic int64_t clock_offset_ms;   /* added to the real time */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + atomic_load(&clock_offset_ms);
}

/*---- the schemes ----*/

typedef struct scheme scheme;
typedef bc_conns gen_ctx;     /* a generator's connections */

struct scheme {
    const char *name;
    int bytes;
    int needs_redis, needs_pg;
    /* 0, or -1 when the scheme refuses (clock) or fails */
    int (*next)(gen_ctx *g, id128 *out);
};

static void pg_exec(PGconn *pg, const char *sql)
{
    PGresult *r = PQexec(pg, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK) {
        fprintf(stderr, "bench_ids: %s: %s", sql, PQerrorMessage(pg));
        exit(2);
    }
    PQclear(r);
}

static int pg_int(PGconn *pg, const char *sql, int64_t *v)
{
    PGresult *r = PQexecParams(pg, sql, 0, NULL, NULL, NULL, NULL, 0);
    int ok = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1;
    if (ok)
        *v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return ok ? 0 : -1;
}

/* redis: the service's id, its seconds from the injected clock. */
static int next_redis(gen_ctx *g, id128 *out)
{
    int64_t id;
    if (order_id_next_at(g->redis, "bench", now_ms() / 1000, &id) != ORDER_ID_OK)
        return -1;
    *out = (id128){ 0, (uint64_t)id };
    return 0;
}

/* snowflake: one generator; 'guard' refuses a clock that went back (the
 * usual fix), without it the sequence restarts in an old millisecond. */
#define SF_EPOCH_MS 1640995200000LL
static struct {
    pthread_mutex_t mu;
    int64_t last_ms;
    int seq;
    int guard;
} sf = { PTHREAD_MUTEX_INITIALIZER, -1, 0, 1 };

static int next_snowflake(gen_ctx *g, id128 *out)
{
    int64_t ms;
    int rc = 0;

    (void)g;
    pthread_mutex_lock(&sf.mu);
    ms = now_ms();
    if (ms < sf.last_ms && sf.guard) {
        rc = -1;                              /* refuse until the clock catches up */
    } else {
        if (ms == sf.last_ms) {
            sf.seq = (sf.seq + 1) & 0xfff;
            if (sf.seq == 0) {                /* 4096 in this ms: wait for the next */
                while ((ms = now_ms()) <= sf.last_ms) {
                }
            }
        } else {
            sf.seq = 0;
        }
        sf.last_ms = ms;
        *out = (id128){ 0, (uint64_t)(ms - SF_EPOCH_MS) << 22 | (uint64_t)1 << 12 |
                           (uint64_t)sf.seq };
    }
    pthread_mutex_unlock(&sf.mu);
    return rc;
}

static void random_bytes(unsigned char *b, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(b + got, n - got, 0);
        if (r < 0 && errno != EINTR)
            abort();
        if (r > 0)
            got += (size_t)r;
    }
}

static id128 from_bytes(const unsigned char b[16])
{
    id128 v = { 0, 0 };
    for (int i = 0; i < 8; i++) {
        v.hi = v.hi << 8 | b[i];
        v.lo = v.lo << 8 | b[8 + i];
    }
    return v;
}

static int next_uuid4(gen_ctx *g, id128 *out)
{
    unsigned char b[16];
    (void)g;
    random_bytes(b, sizeof b);
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
    *out = from_bytes(b);
    return 0;
}

static int next_uuid7(gen_ctx *g, id128 *out)
{
    unsigned char b[16];
    uint64_t ms = (uint64_t)now_ms();
    (void)g;
    random_bytes(b, sizeof b);
    for (int i = 0; i < 6; i++)
        b[i] = (unsigned char)(ms >> (40 - 8 * i));
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x70);
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
    *out = from_bytes(b);
    return 0;
}

static int next_seq_named(gen_ctx *g, id128 *out, const char *sql)
{
    int64_t v;
    if (pg_int(g->pg, sql, &v) != 0)
        return -1;
    *out = (id128){ 0, (uint64_t)v };
    return 0;
}

static int next_seq(gen_ctx *g, id128 *out)
{
    return next_seq_named(g, out, "SELECT nextval('bench_id_seq')");
}

static int next_seq_cache(gen_ctx *g, id128 *out)
{
    return next_seq_named(g, out, "SELECT nextval('bench_id_seq_cache')");
}

/* segment: [next, end) in memory, a new range of SEG_STEP when it runs out. */
#define SEG_STEP 1000
static struct {
    pthread_mutex_t mu;
    int64_t next, end;
    uint64_t fetches;
} seg = { PTHREAD_MUTEX_INITIALIZER, 0, 0, 0 };

static int next_segment(gen_ctx *g, id128 *out)
{
    int rc = 0;

    pthread_mutex_lock(&seg.mu);
    if (seg.next >= seg.end) {
        int64_t max;
        /* the fetching thread holds the others back: no double buffer here */
        if (pg_int(g->pg, "UPDATE bench_id_segment SET max_id = max_id + " "1000"
                          " WHERE name = 'order' RETURNING max_id", &max) != 0) {
            rc = -1;
            goto out;
        }
        seg.next = max - SEG_STEP + 1;
        seg.end = max + 1;
        seg.fetches++;
    }
    *out = (id128){ 0, (uint64_t)seg.next++ };
out:
    pthread_mutex_unlock(&seg.mu);
    return rc;
}

static const scheme schemes[] = {
    { "redis", 8, 1, 0, next_redis },
    { "snowflake", 8, 0, 0, next_snowflake },
    { "uuid-v4", 16, 0, 0, next_uuid4 },
    { "uuid-v7", 16, 0, 0, next_uuid7 },
    { "seq", 8, 0, 1, next_seq },
    { "seq-cache", 8, 0, 1, next_seq_cache },
    { "segment", 8, 0, 1, next_segment },
};
#define NSCHEMES (sizeof schemes / sizeof schemes[0])

static void ctx_open(const scheme *s, gen_ctx *g)
{
    bc_conns_open(g, s->needs_redis, s->needs_pg);
}

/*---- the rate run ----*/

static int threads = 8;
static double seconds = 3.0;

#define MAX_PER_THREAD 4000000

typedef struct worker {
    const scheme *s;
    id128 *ids;
    size_t n;
    uint64_t backwards;       /* lower than this thread's previous id */
    int failed;
} worker;

static void *rate_main(void *p)
{
    worker *w = p;
    gen_ctx g;

    ctx_open(w->s, &g);
    pthread_barrier_wait(&bc_start_line);
    double end = t_now_ms() + seconds * 1000.0;
    while (w->n < MAX_PER_THREAD && t_now_ms() < end) {
        for (int i = 0; i < 32 && w->n < MAX_PER_THREAD; i++) {
            if (w->s->next(&g, &w->ids[w->n]) != 0) {
                w->failed = 1;
                goto out;
            }
            if (w->n > 0 && lower(w->ids[w->n], w->ids[w->n - 1]))
                w->backwards++;
            w->n++;
        }
    }
out:
    bc_conns_close(&g);
    return NULL;
}

static uint64_t duplicates(id128 *all, size_t n)
{
    uint64_t d = 0;
    qsort(all, n, sizeof *all, cmp_id);
    for (size_t i = 1; i < n; i++)
        d += cmp_id(&all[i], &all[i - 1]) == 0;
    return d;
}

typedef struct result {
    double per_s;
    uint64_t n, dups, backwards;
    double cross_lower;       /* share of ids below one returned before they were asked for */
    char restart[160], clock[200];
} result;

static int rate(const scheme *s, result *r)
{
    worker *w = xcalloc((size_t)threads, sizeof *w);
    size_t total = 0;
    int failed = 0;

    for (int i = 0; i < threads; i++) {
        w[i].s = s;
        w[i].ids = xmalloc(sizeof(id128) * MAX_PER_THREAD);
    }
    double dt = bc_run_threads(threads, rate_main, w, sizeof *w);
    for (int i = 0; i < threads; i++) {
        total += w[i].n;
        failed |= w[i].failed;
        r->backwards += w[i].backwards;
    }
    id128 *all = xmalloc(sizeof *all * (total + 1));
    size_t k = 0;
    for (int i = 0; i < threads; i++) {
        memcpy(all + k, w[i].ids, sizeof *all * w[i].n);
        k += w[i].n;
        free(w[i].ids);
    }
    r->n = total;
    r->per_s = (double)total / dt;
    r->dups = duplicates(all, total);
    free(all);
    free(w);
    return failed ? -1 : 0;
}

/*---- order in real time: an id asked for after another one was returned
 * should be higher. Each thread reads the highest id returned so far
 * before it asks, and counts an id below that as out of order. ----*/

#define ORDER_PER_THREAD 5000
static pthread_mutex_t order_mu = PTHREAD_MUTEX_INITIALIZER;
static id128 order_max;
static uint64_t order_low, order_n;

static void *order_main(void *p)
{
    const scheme *s = p;
    gen_ctx g;
    id128 v, seen;
    uint64_t low = 0, n = 0;

    ctx_open(s, &g);
    pthread_barrier_wait(&bc_start_line);
    for (int i = 0; i < ORDER_PER_THREAD; i++) {
        pthread_mutex_lock(&order_mu);
        seen = order_max;
        pthread_mutex_unlock(&order_mu);
        if (s->next(&g, &v) != 0)
            break;
        n++;
        low += lower(v, seen);
        pthread_mutex_lock(&order_mu);
        if (lower(order_max, v))
            order_max = v;
        pthread_mutex_unlock(&order_mu);
    }
    pthread_mutex_lock(&order_mu);
    order_low += low;
    order_n += n;
    pthread_mutex_unlock(&order_mu);
    bc_conns_close(&g);
    return NULL;
}

static double cross_order(const scheme *s)
{
    order_max = (id128){ 0, 0 };
    order_low = order_n = 0;
    bc_run_threads(threads, order_main, (void *)s, 0);
    return order_n > 0 ? (double)order_low / (double)order_n : 0;
}

/*---- restart and clock step, per scheme ----*/

/* Ids taken on one context, for the restart and clock scenarios: the
 * highest, how many fell below 'floor', and refusals. */
#define BURST_MAX 400000
typedef struct burst {
    id128 max, *ids;
    int n, below, refused;
} burst;

/* 'n' ids, or as many as 'ms' milliseconds give when ms > 0. */
static void take_burst(const scheme *s, gen_ctx *g, int n, double ms, id128 floor, burst *b)
{
    double end = t_now_ms() + ms;

    if (b->ids == NULL)
        b->ids = xmalloc(sizeof *b->ids * BURST_MAX);
    b->n = b->below = b->refused = 0;
    b->max = (id128){ 0, 0 };
    for (int i = 0; b->n < BURST_MAX && (ms > 0 ? t_now_ms() < end : i < n); i++) {
        id128 v;
        if (s->next(g, &v) != 0) {
            b->refused++;
            continue;
        }
        b->ids[b->n++] = v;
        if (lower(v, floor))
            b->below++;
        if (lower(b->max, v))
            b->max = v;
    }
}

/* Ids of 'b' that 'a' has too (sorts both). */
static int common(burst *a, burst *b)
{
    int c = 0, i = 0, j = 0;
    qsort(a->ids, (size_t)a->n, sizeof *a->ids, cmp_id);
    qsort(b->ids, (size_t)b->n, sizeof *b->ids, cmp_id);
    while (i < a->n && j < b->n) {
        int k = cmp_id(&a->ids[i], &b->ids[j]);
        if (k == 0) {
            c++;
            j++;
        } else if (k < 0) {
            i++;
        } else {
            j++;
        }
    }
    return c;
}

static void scenarios(const scheme *s, result *r)
{
    gen_ctx g;
    static burst a, b;
    id128 zero = { 0, 0 };

    ctx_open(s, &g);
    if (strcmp(s->name, "redis") == 0) {
        /* restart: the day's counter lost (no persistence, or a failover to a
         * replica that had not seen it) within the same second */
        int64_t now = now_ms() / 1000, id;
        redisReply *rr;
        take_burst(s, &g, 0, 0, zero, &a);         /* allocates; takes nothing */
        take_burst(s, &g, 0, 0, zero, &b);
        for (int i = 0; i < 1000; i++)
            if (order_id_next_at(g.redis, "bench-restart", now, &id) == ORDER_ID_OK)
                a.ids[a.n++] = (id128){ 0, (uint64_t)id };
        char key[96];
        order_id_key("bench-restart", now, key, sizeof key);
        rr = redisCommand(g.redis, "DEL %s", key);
        freeReplyObject(rr);
        b.n = 0;
        for (int i = 0; i < 1000; i++)
            if (order_id_next_at(g.redis, "bench-restart", now, &id) == ORDER_ID_OK)
                b.ids[b.n++] = (id128){ 0, (uint64_t)id };
        snprintf(r->restart, sizeof r->restart,
                 "counter lost in the same second: %d of %d ids again", common(&a, &b), b.n);
        rr = redisCommand(g.redis, "DEL %s", key);
        freeReplyObject(rr);
        /* clock one hour back (seconds) */
        take_burst(s, &g, 1000, 0, zero, &a);
        atomic_store(&clock_offset_ms, -3600 * 1000);
        take_burst(s, &g, 1000, 0, a.max, &b);
        atomic_store(&clock_offset_ms, 0);
        snprintf(r->clock, sizeof r->clock, "1 h back: %d of %d ids lower than before, %d again",
                 b.below, b.n, common(&a, &b));
    } else if (strcmp(s->name, "snowflake") == 0) {
        double t0;
        int refused = 0;
        /* guarded: refuses while the clock is behind its last timestamp */
        take_burst(s, &g, 1000, 0, zero, &a);
        atomic_store(&clock_offset_ms, -10);
        t0 = t_now_ms();
        do {
            take_burst(s, &g, 1, 0, a.max, &b);
            refused += b.refused;
        } while (b.refused > 0 && t_now_ms() - t0 < 1000);
        double waited = t_now_ms() - t0;
        atomic_store(&clock_offset_ms, 0);
        /* unguarded: 20 ms of ids, the clock 10 ms back, 10 ms more: the
         * sequence starts again in milliseconds already used */
        pthread_mutex_lock(&sf.mu);
        sf.guard = 0;
        pthread_mutex_unlock(&sf.mu);
        t_sleep_ms(20);
        take_burst(s, &g, 0, 20, zero, &a);
        atomic_store(&clock_offset_ms, -10);
        take_burst(s, &g, 0, 10, a.max, &b);
        atomic_store(&clock_offset_ms, 0);
        int unguarded = common(&a, &b);
        pthread_mutex_lock(&sf.mu);
        sf.guard = 1;
        pthread_mutex_unlock(&sf.mu);
        snprintf(r->clock, sizeof r->clock,
                 "10 ms back: guarded refuses %d calls for %.0f ms; unguarded: %d of %d ids again",
                 refused, waited, unguarded, b.n);
        /* restart while the clock is behind: the guard's memory is gone */
        t_sleep_ms(20);
        take_burst(s, &g, 0, 20, zero, &a);
        pthread_mutex_lock(&sf.mu);
        sf.last_ms = -1;                      /* a new process */
        sf.seq = 0;
        pthread_mutex_unlock(&sf.mu);
        atomic_store(&clock_offset_ms, -10);
        take_burst(s, &g, 0, 10, a.max, &b);
        atomic_store(&clock_offset_ms, 0);
        snprintf(r->restart, sizeof r->restart,
                 "restart 10 ms back in time (guarded): %d of %d ids again", common(&a, &b), b.n);
    } else if (strcmp(s->name, "uuid-v4") == 0) {
        snprintf(r->restart, sizeof r->restart, "no state: nothing");
        snprintf(r->clock, sizeof r->clock, "no clock: nothing");
    } else if (strcmp(s->name, "uuid-v7") == 0) {
        take_burst(s, &g, 0, 20, zero, &a);
        atomic_store(&clock_offset_ms, -10);
        take_burst(s, &g, 0, 10, a.max, &b);
        atomic_store(&clock_offset_ms, 0);
        snprintf(r->restart, sizeof r->restart, "no state: nothing");
        snprintf(r->clock, sizeof r->clock, "10 ms back: %d of %d ids lower than before, %d again",
                 b.below, b.n, common(&a, &b));
    } else if (strcmp(s->name, "segment") == 0) {
        take_burst(s, &g, 10, 0, zero, &a);
        pthread_mutex_lock(&seg.mu);
        int64_t lost = seg.end - seg.next;
        seg.next = seg.end = 0;               /* a new process: the rest of the range is gone */
        pthread_mutex_unlock(&seg.mu);
        take_burst(s, &g, 1, 0, zero, &b);
        snprintf(r->restart, sizeof r->restart,
                 "restart: the segment's %" PRId64 " unused ids skipped (next %" PRIu64
                 " after %" PRIu64 ")", lost, b.ids[0].lo, a.max.lo);
        snprintf(r->clock, sizeof r->clock, "no clock: nothing");
    } else {                                  /* seq, seq-cache: a new session */
        take_burst(s, &g, 10, 0, zero, &a);
        bc_conns_close(&g);
        ctx_open(s, &g);
        take_burst(s, &g, 1, 0, zero, &b);
        snprintf(r->restart, sizeof r->restart,
                 "new session: next %" PRIu64 " after %" PRIu64 " (%" PRIu64 " skipped)",
                 b.ids[0].lo, a.max.lo, b.ids[0].lo - a.max.lo - 1);
        snprintf(r->clock, sizeof r->clock, "no clock: nothing");
    }
    bc_conns_close(&g);
}

/*---- main ----*/

static const char *order_text(const scheme *s, const result *r)
{
    static char buf[96];
    snprintf(buf, sizeof buf, "%s; %.1f%% below an id returned before it was asked for",
             r->backwards == 0 ? "per thread increasing" : "per thread NOT increasing",
             100.0 * r->cross_lower);
    (void)s;
    return buf;
}

int main(int argc, char **argv)
{
    const char *json = NULL;
    const bc_opt opts[] = {
        { "--threads", .i = &threads },
        { "--seconds", .d = &seconds },
        { "--json", .s = &json },
    };
    cJSON *root, *arr;
    PGconn *pg;
    int rc = 0;

    if (bc_parse_opts(argc, argv, opts, sizeof opts / sizeof opts[0]) != 0 || threads < 1 ||
        seconds <= 0) {
        fprintf(stderr, "usage: bench_ids [--threads N] [--seconds S] [--json PATH]\n");
        return 2;
    }
    root = cJSON_CreateObject();
    arr = cJSON_AddArrayToObject(root, "schemes");
    pg = bc_pg_connect();
    pg_exec(pg, "DROP SEQUENCE IF EXISTS bench_id_seq, bench_id_seq_cache");
    pg_exec(pg, "CREATE SEQUENCE bench_id_seq");
    pg_exec(pg, "CREATE SEQUENCE bench_id_seq_cache CACHE 100");
    pg_exec(pg, "CREATE TABLE IF NOT EXISTS bench_id_segment (name text PRIMARY KEY, "
                "max_id bigint NOT NULL)");
    pg_exec(pg, "INSERT INTO bench_id_segment VALUES ('order', 0) ON CONFLICT (name) "
                "DO UPDATE SET max_id = 0");
    printf("%-10s %12s %5s %6s %10s  %s\n", "scheme", "ids/s", "bytes", "dups", "ids",
           "ordering");
    for (size_t i = 0; i < NSCHEMES; i++) {
        const scheme *s = &schemes[i];
        result r;
        memset(&r, 0, sizeof r);
        if (rate(s, &r) != 0) {
            fprintf(stderr, "bench_ids: %s failed\n", s->name);
            rc = 1;
            continue;
        }
        r.cross_lower = cross_order(s);
        scenarios(s, &r);
        printf("%-10s %12.0f %5d %6" PRIu64 " %10" PRIu64 "  %s\n", s->name, r.per_s, s->bytes,
               r.dups, r.n, order_text(s, &r));
        printf("%-10s   restart: %s\n%-10s   clock:   %s\n", "", r.restart, "", r.clock);
        fflush(stdout);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "scheme", s->name);
        cJSON_AddNumberToObject(o, "idsPerS", r.per_s);
        cJSON_AddNumberToObject(o, "bytes", s->bytes);
        cJSON_AddNumberToObject(o, "ids", (double)r.n);
        cJSON_AddNumberToObject(o, "duplicates", (double)r.dups);
        cJSON_AddNumberToObject(o, "perThreadBackwards", (double)r.backwards);
        cJSON_AddNumberToObject(o, "crossThreadLowerShare", r.cross_lower);
        cJSON_AddStringToObject(o, "restart", r.restart);
        cJSON_AddStringToObject(o, "clockStepBack", r.clock);
        if (strcmp(s->name, "segment") == 0)
            cJSON_AddNumberToObject(o, "segmentFetches", (double)seg.fetches);
        cJSON_AddItemToArray(arr, o);
    }
    cJSON_AddNumberToObject(root, "threads", threads);
    cJSON_AddNumberToObject(root, "seconds", seconds);
    if (json != NULL) {
        char *txt = cJSON_Print(root);
        FILE *f = fopen(json, "w");
        if (f == NULL || fputs(txt, f) == EOF)
            rc = 1;
        if (f != NULL)
            fclose(f);
        free(txt);
    }
    cJSON_Delete(root);
    pg_exec(pg, "DROP SEQUENCE IF EXISTS bench_id_seq, bench_id_seq_cache");
    pg_exec(pg, "DROP TABLE IF EXISTS bench_id_segment");
    PQfinish(pg);
    return rc;
}
