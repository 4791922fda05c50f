/* bench_c: what the C load tools (loadtest/bench_ids.c, bench_lock.c,
 * bench_locks.c) share. Include after t.h, with BC_TOOL defined as the
 * tool's name (the prefix of its messages).
 *
 *   bc_parse_opts()     "--name value" options and flags, from a table
 *   bc_run_threads()    N threads released together from bc_start_line,
 *                       timed until the last one is joined
 *   bc_pairs_run()      N threads' uncontended acquire+release pairs per
 *                       second (each thread's loop is the tool's)
 *   bc_pg_connect()     a Postgres session on PG_DSN, or exit 2
 *   bc_conns_open()     a thread's Redis and Postgres connections
 *   bc_conns_close() */
#ifndef SECKILL_BENCH_C_H
#define SECKILL_BENCH_C_H

#ifndef BC_TOOL
#error "define BC_TOOL (the tool's name, for its messages) before including bench_c.h"
#endif

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <hiredis/hiredis.h>
#include <libpq-fe.h>

#include "t.h"
#include "util.h"

/*---- options ----*/

/* One option and where its value goes: exactly one of the pointers is set.
 * 'flag' takes no value and is set to 1; the others take the next argument
 * (atoi, atol, atof, or the argument itself). */
typedef struct bc_opt {
    const char *name;
    int *i;
    long *l;
    double *d;
    const char **s;
    int *flag;
} bc_opt;

/* Parses argv[1..argc-1] against opts[0..n-1]. Returns 0, or -1 after it
 * said why on stderr (an unknown option, a value missing). */
static inline int bc_parse_opts(int argc, char **argv, const bc_opt *opts, size_t n)
{
    for (int i = 1; i < argc; i++) {
        const bc_opt *op = NULL;
        for (size_t k = 0; k < n && op == NULL; k++) {
            if (strcmp(argv[i], opts[k].name) == 0)
                op = &opts[k];
        }
        if (op == NULL) {
            fprintf(stderr, BC_TOOL ": unknown option %s\n", argv[i]);
            return -1;
        }
        if (op->flag != NULL) {
            *op->flag = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, BC_TOOL ": %s needs a value\n", argv[i]);
            return -1;
        }
        const char *v = argv[++i];
        if (op->i != NULL)
            *op->i = atoi(v);
        else if (op->l != NULL)
            *op->l = atol(v);
        else if (op->d != NULL)
            *op->d = atof(v);
        else
            *op->s = v;
    }
    return 0;
}

/*---- threads started together ----*/

/* Each thread of bc_run_threads waits here once, when it is ready (its
 * connections open): the clock starts when all of them are. */
static pthread_barrier_t bc_start_line;

/* Runs fn on n threads, thread i given (char *)args + i * size (size 0:
 * args itself for every thread), and joins them. Returns the seconds from
 * the start line until the last one was joined. Aborts when a thread cannot
 * be created: the others would wait at the start line forever. */
static inline double bc_run_threads(int n, void *(*fn)(void *), void *args, size_t size)
{
    pthread_t *t = xcalloc((size_t)n, sizeof *t);

    if (pthread_barrier_init(&bc_start_line, NULL, (unsigned)n + 1) != 0)
        abort();
    for (int i = 0; i < n; i++) {
        void *arg = size > 0 ? (char *)args + (size_t)i * size : args;
        if (pthread_create(&t[i], NULL, fn, arg) != 0)
            abort();
    }
    pthread_barrier_wait(&bc_start_line);
    double t0 = t_now_ms();
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    double dt = (t_now_ms() - t0) / 1000.0;
    pthread_barrier_destroy(&bc_start_line);
    free(t);
    return dt;
}

/*---- uncontended acquire+release pairs ----*/

/* One thread of a pairs run; its main counts into it. */
typedef struct bc_pair_thread {
    int id;                  /* for its key and owner */
    double seconds;          /* how long it goes on after the start line */
    uint64_t pairs;          /* acquire+release pairs done */
    int failed;              /* a lock call failed: it stopped there */
} bc_pair_thread;

/* Runs fn, a pair thread's main given its bc_pair_thread, on n threads
 * (ids first_id, first_id + 1, ...) for 'seconds' from the start line.
 * Returns the pairs per second of them all, or -1 when one failed. */
static inline double bc_pairs_run(int n, int first_id, double seconds, void *(*fn)(void *))
{
    bc_pair_thread *t = xcalloc((size_t)n, sizeof *t);
    uint64_t total = 0;
    int failed = 0;

    for (int i = 0; i < n; i++) {
        t[i].id = first_id + i;
        t[i].seconds = seconds;
    }
    double dt = bc_run_threads(n, fn, t, sizeof *t);
    for (int i = 0; i < n; i++) {
        total += t[i].pairs;
        failed |= t[i].failed;
    }
    free(t);
    return failed ? -1 : (double)total / dt;
}

/*---- connections ----*/

static inline void bc_pg_quiet(void *arg, const char *msg)
{
    (void)arg;
    (void)msg;
}

/* A session on PG_DSN (libpq's defaults when unset), its notices dropped
 * (the tools print tables); exits 2 when it cannot connect. */
static inline PGconn *bc_pg_connect(void)
{
    PGconn *pg = PQconnectdb(getenv("PG_DSN") != NULL ? getenv("PG_DSN") : "");

    PQsetNoticeProcessor(pg, bc_pg_quiet, NULL);
    if (PQstatus(pg) != CONNECTION_OK) {
        fprintf(stderr, BC_TOOL ": PG_DSN: %s", PQerrorMessage(pg));
        exit(2);
    }
    return pg;
}

/* A thread's connections, each NULL unless asked for; one thread's own. */
typedef struct bc_conns {
    redisContext *redis;     /* REDIS_URL (t_redis) */
    PGconn *pg;              /* PG_DSN */
} bc_conns;

/* Opens the connections asked for; exits when one cannot be opened. */
static inline void bc_conns_open(bc_conns *c, int redis, int pg)
{
    memset(c, 0, sizeof *c);
    if (redis)
        c->redis = t_redis();
    if (pg)
        c->pg = bc_pg_connect();
}

static inline void bc_conns_close(bc_conns *c)
{
    if (c->redis != NULL)
        redisFree(c->redis);
    if (c->pg != NULL)
        PQfinish(c->pg);
    memset(c, 0, sizeof *c);
}

#endif
