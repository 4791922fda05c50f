/* bench_locks: one lock backend's figures, measured the same way for each
 * (loadtest/bench_locks.py runs it once per backend, next to each service's
 * own ceiling, and draws the table and the chart: make bench-lock).
 *
 *   bench_locks --backend redis|zk|pg-table|pg-advisory|multilock|redlock [--threads N]
 *               [--seconds S] [--handoffs N] [--lease-ms L] [--json PATH]
 *   bench_locks --zk-ceiling [--threads N] [--seconds S] [--json PATH]
 *   bench_locks --pgbench-scripts DIR
 *
 * Services from the environment: REDIS_URL (and LUA_DIR), ZK_HOSTS, PG_DSN,
 * LOCK_REDIS_NODES (multilock, redlock: redis://host:port,...; each node's
 * timeout LOCK_REDIS_NODE_TIMEOUT_MS, default 50).
 * For the backend:
 *   1. uncontended acquire+release pairs per second: N threads, each its own
 *      key (Redis and Postgres: a connection per thread; ZooKeeper: the one
 *      session of the process, shared, as in the service);
 *   2. contended hand-off: two threads pass one lock back and forth, each
 *      waiting with the backend's own wait (Redis: pub/sub; ZooKeeper: the
 *      predecessor's watch; advisory: pg_advisory_lock blocking in the
 *      server; the lock table and the multi-node locks have none: a try every
 *      millisecond); latency =
 *      release sent -> the waiter holds it, p50/p99/max;
 *   3. release after a crash: a child process takes the lock (lease or
 *      session timeout L ms) and is killed with SIGKILL; the time until
 *      this process gets it (a try every 5 ms); and the same after a clean
 *      exit of the child without an unlock (it closes its connections).
 * --zk-ceiling: ZooKeeper's own create+delete pairs per second (ephemeral
 * nodes, N threads on one session): the recipe's ceiling. --pgbench-scripts:
 * the lock statements (app/lock/pg_lock.c) as pgbench scripts, one key per client. */
#include <cJSON.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "t.h"
#define BC_TOOL "bench_locks"
#include "bench_c.h"
#include "t_lock.h"
#include "t_zk.h"
#include "lock.h"
#include "multi_lock.h"
#include "pg_lock.h"
#include "util.h"
#include "zk_lock.h"

typedef struct opts {
    const char *backend;
    int threads, handoffs;
    double seconds;
    long lease_ms;
    const char *json;
} opts;

static opts o = { NULL, 8, 200, 5.0, 3000, NULL };
#define PG_WAIT_MS 10000     /* the Postgres locks: each statement's bound */
static zk_lock_client *zk;       /* the process's one session (zk) */

/*---- the backends, behind one small table ----*/

typedef struct client {
    bc_conns conn;             /* redis, pg-table, pg-advisory */
    multi_lock_set *nodes;     /* multilock, redlock */
} client;

static int multi(void)
{
    return strcmp(o.backend, "multilock") == 0 || strcmp(o.backend, "redlock") == 0;
}

/* LOCK_REDIS_NODES as an multi_lock_set (a fresh one per client). */
static multi_lock_set *nodes_open(void)
{
    const char *p = getenv("LOCK_REDIS_NODES");
    const char *tmo = getenv("LOCK_REDIS_NODE_TIMEOUT_MS");
    redis_url nodes[MULTI_LOCK_MAX_NODES];
    size_t n = 0;

    memset(nodes, 0, sizeof nodes);
    while (p != NULL && (p = strstr(p, "redis://")) != NULL && n < MULTI_LOCK_MAX_NODES) {
        p += 8;
        size_t hl = strcspn(p, ":,");
        snprintf(nodes[n].host, sizeof nodes[n].host, "%.*s", (int)hl, p);
        nodes[n].port = p[hl] == ':' ? atoi(p + hl + 1) : 6379;
        n++;
    }
    multi_lock_set *s = n > 0 ? multi_lock_set_new(nodes, n, tmo != NULL ? atoi(tmo) : 50) : NULL;
    if (s == NULL) {
        fprintf(stderr, "bench_locks: LOCK_REDIS_NODES: no nodes\n");
        exit(2);
    }
    return s;
}

static void client_open(client *c)
{
    bc_conns_open(&c->conn, strcmp(o.backend, "redis") == 0, strncmp(o.backend, "pg-", 3) == 0);
    c->nodes = multi() ? nodes_open() : NULL;
}

static void client_close(client *c)
{
    bc_conns_close(&c->conn);
    multi_lock_set_free(c->nodes);
}

/* The advisory key of a lock key: its digits. */
static int64_t adv_key(const char *key)
{
    const char *p = key + strlen(key);
    while (p > key && p[-1] >= '0' && p[-1] <= '9')
        p--;
    return strtoll(p, NULL, 10);
}

/* One attempt (wait_ms 0) or a wait: 1 held, 0 busy, -1 error. */
static int take(client *c, const char *key, const char *owner, long wait_ms)
{
    const char *b = o.backend;

    if (strcmp(b, "redis") == 0) {
        redisContext *r = c->conn.redis;
        lock_status st = wait_ms > 0 ? lock_try_lock(r, key, owner, wait_ms, o.lease_ms, NULL)
                                     : lock_try_acquire(r, key, owner, o.lease_ms, NULL);
        return st == LOCK_OK ? 1 : st == LOCK_BUSY ? 0 : -1;
    }
    if (strcmp(b, "zk") == 0) {
        lock_status st = zk_lock_acquire(zk, key, owner, wait_ms, NULL);
        return st == LOCK_OK ? 1 : st == LOCK_BUSY ? 0 : -1;
    }
    if (multi()) {
        multi_lock_quorum q = strcmp(b, "multilock") == 0 ? MULTI_LOCK_ALL : MULTI_LOCK_MAJORITY;
        double end = t_now_ms() + (double)wait_ms;
        for (;;) {                          /* no wait across nodes: try again every ms */
            multi_lock_grant g;
            lock_status st = multi_lock_acquire(c->nodes, q, key, owner, o.lease_ms, &g);
            if (st != LOCK_BUSY)
                return st == LOCK_OK ? 1 : -1;
            if (t_now_ms() >= end)
                return 0;
            t_sleep_ms(1);
        }
    }
    if (strcmp(b, "pg-table") == 0) {
        double end = t_now_ms() + (double)wait_ms;
        for (;;) {                          /* no wait in a table: try again every ms */
            lock_status st = pg_lock_table_acquire(c->conn.pg, PG_WAIT_MS, key, owner, o.lease_ms,
                                               NULL, NULL);
            if (st != LOCK_BUSY)
                return st == LOCK_OK ? 1 : -1;
            if (t_now_ms() >= end)
                return 0;
            t_sleep_ms(1);
        }
    }
    if (wait_ms > 0) {                      /* pg-advisory: the server's blocking wait */
        char k[24];
        const char *v[1] = { k };
        snprintf(k, sizeof k, "%" PRId64, adv_key(key));
        PGresult *r = PQexecParams(c->conn.pg, "SELECT pg_advisory_lock($1::bigint)", 1, NULL,
                                   v, NULL, NULL, 0);
        int ok = PQresultStatus(r) == PGRES_TUPLES_OK;
        PQclear(r);
        return ok ? 1 : -1;
    }
    lock_status st = pg_lock_advisory_try(c->conn.pg, PG_WAIT_MS, adv_key(key));
    return st == LOCK_OK ? 1 : st == LOCK_BUSY ? 0 : -1;
}

static int give(client *c, const char *key, const char *owner)
{
    const char *b = o.backend;

    if (strcmp(b, "redis") == 0)
        return lock_release(c->conn.redis, key, owner, o.lease_ms, NULL) == LOCK_OK ? 0 : -1;
    if (strcmp(b, "zk") == 0)
        return zk_lock_release(zk, key, owner, NULL) == LOCK_OK ? 0 : -1;
    if (multi())
        return multi_lock_release(c->nodes, key, owner, o.lease_ms, ~0u, 0, NULL) > 0 ? 0 : -1;
    if (strcmp(b, "pg-table") == 0)
        return pg_lock_table_release(c->conn.pg, PG_WAIT_MS, key, owner, o.lease_ms, NULL) ==
                       LOCK_OK ? 0 : -1;
    return pg_lock_advisory_release(c->conn.pg, PG_WAIT_MS, adv_key(key)) == LOCK_OK ? 0 : -1;
}

static void open_zk(void)
{
    char err[512];
    const char *hosts = getenv("ZK_HOSTS");

    zk = zk_lock_open(hosts != NULL ? hosts : "", "/seckill-bench/locks", (int)o.lease_ms, 10000,
                  err, sizeof err);
    if (zk == NULL) {
        fprintf(stderr, "bench_locks: ZK_HOSTS: %s\n", err);
        exit(2);
    }
}

/*---- 1. uncontended pairs ----*/

static void *pairs_main(void *p)
{
    bc_pair_thread *t = p;
    client c;
    char key[96], owner[64];

    client_open(&c);
    snprintf(key, sizeof key, "lock:bench:%ld%04d", (long)getpid() % 100000, t->id);
    snprintf(owner, sizeof owner, "bench:%d", t->id);
    pthread_barrier_wait(&bc_start_line);
    double end = t_now_ms() + t->seconds * 1000.0;
    while (t_now_ms() < end) {
        for (int i = 0; i < 16; i++) {
            if (take(&c, key, owner, 0) != 1 || give(&c, key, owner) != 0) {
                t->failed = 1;
                goto out;
            }
            t->pairs++;
        }
    }
out:
    client_close(&c);
    return NULL;
}

/*---- 2. contended hand-off ----*/

typedef struct handoff {
    char key[96];
    atomic_int done;
    _Atomic int64_t released_us;
    double *lat_ms;
    atomic_int failed;
} handoff;

static handoff ho;

static void *handoff_main(void *p)
{
    int id = (int)(intptr_t)p;
    client c;
    char owner[64];

    client_open(&c);
    snprintf(owner, sizeof owner, "bench:h%d", id);
    while (atomic_load(&ho.done) < o.handoffs) {
        if (take(&c, ho.key, owner, 10000) != 1) {
            atomic_store(&ho.failed, 1);
            break;
        }
        int64_t now = util_mono_us();
        int64_t rel = atomic_exchange(&ho.released_us, 0);
        if (rel != 0) {
            int i = atomic_fetch_add(&ho.done, 1);
            if (i < o.handoffs)
                ho.lat_ms[i] = (double)(now - rel) / 1000.0;
        }
        t_sleep_ms(2);                      /* the other one is waiting by now */
        atomic_store(&ho.released_us, util_mono_us());
        if (give(&c, ho.key, owner) != 0) {
            atomic_store(&ho.failed, 1);
            break;
        }
    }
    client_close(&c);
    return NULL;
}

static int bench_handoff(double *p50, double *p99, double *max)
{
    pthread_t t[2];

    snprintf(ho.key, sizeof ho.key, "lock:bench:%ld9999", (long)getpid() % 100000);
    ho.lat_ms = xcalloc((size_t)o.handoffs, sizeof *ho.lat_ms);
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, handoff_main, (void *)(intptr_t)i);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    int n = atomic_load(&ho.done) < o.handoffs ? atomic_load(&ho.done) : o.handoffs;
    *p50 = tl_percentile(ho.lat_ms, (size_t)n, 50);
    *p99 = tl_percentile(ho.lat_ms, (size_t)n, 99);
    *max = tl_percentile(ho.lat_ms, (size_t)n, 100);
    free(ho.lat_ms);
    return atomic_load(&ho.failed) || n < o.handoffs ? -1 : 0;
}

/*---- 3. release after a crash or a clean exit ----*/

static const char *self_path;

/* Child: take 'key', say "held", then sleep (killed) or exit at once. */
static int child_main(const char *key, int clean_exit)
{
    client c;

    if (strcmp(o.backend, "redis") == 0 || multi())
        tl_setup(self_path);
    if (strcmp(o.backend, "zk") == 0)
        open_zk();
    client_open(&c);
    if (take(&c, key, "bench:child", 0) != 1)
        return 1;
    printf("held\n");
    fflush(stdout);
    if (clean_exit) {
        client_close(&c);                   /* no unlock: connections closed */
        if (zk != NULL)
            zk_lock_close(zk);
        if (strcmp(o.backend, "redis") == 0 || multi())
            lock_runtime_stop();
        return 0;
    }
    for (;;)
        pause();
}

/* ms until the lock is ours after the child holding it died; -1 on error. */
static double bench_release_after(int clean_exit)
{
    char key[96], lease[24];
    char *args[] = { (char *)self_path, "--backend", (char *)o.backend, "--lease-ms", lease,
                     clean_exit ? "--child-exit" : "--child", key, NULL };
    client c;
    int out = -1;
    char line[64];
    pid_t pid;
    double t0, got = -1;

    snprintf(key, sizeof key, "lock:bench:%ld%s", (long)getpid() % 100000,
             clean_exit ? "8888" : "7777");
    snprintf(lease, sizeof lease, "%ld", o.lease_ms);
    pid = tl_spawn(args, &out);
    if (pid <= 0 || tl_read_line(out, line, sizeof line, 15000) != 0 ||
        strcmp(line, "held") != 0) {
        fprintf(stderr, "bench_locks: the child did not take the lock\n");
        goto out;
    }
    client_open(&c);
    if (clean_exit) {
        waitpid(pid, NULL, 0);
        pid = -1;
    } else {
        kill(pid, SIGKILL);
    }
    t0 = t_now_ms();
    while (t_now_ms() - t0 < 4.0 * (double)o.lease_ms + 5000) {
        int r = take(&c, key, "bench:after", 0);
        if (r == 1) {
            got = t_now_ms() - t0;
            give(&c, key, "bench:after");
            break;
        }
        if (r < 0)
            break;
        t_sleep_ms(5);
    }
    client_close(&c);
out:
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    if (out >= 0)
        close(out);
    return got;
}

/*---- ZooKeeper's own ceiling ----*/

static atomic_uint_fast64_t zk_ops;
static zhandle_t *zk_raw;

static void *zk_ceiling_main(void *p)
{
    char path[128];
    int id = *(const int *)p;
    uint64_t n = 0;

    snprintf(path, sizeof path, "/seckill-bench/ceiling-%ld-%d", (long)getpid(), id);
    pthread_barrier_wait(&bc_start_line);
    double end = t_now_ms() + o.seconds * 1000.0;
    while (t_now_ms() < end) {
        if (zoo_create(zk_raw, path, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_EPHEMERAL, NULL, 0) != ZOK ||
            zoo_delete(zk_raw, path, -1) != ZOK)
            break;
        n++;
    }
    atomic_fetch_add(&zk_ops, n);
    return NULL;
}

static double zk_ceiling(void)
{
    int *ids = xcalloc((size_t)o.threads, sizeof *ids);   /* each thread's node name */
    const char *hosts = getenv("ZK_HOSTS");

    snprintf(t_zk_hosts, sizeof t_zk_hosts, "%s", hosts != NULL ? hosts : "");
    if ((zk_raw = t_zk_raw(NULL)) == NULL) {
        free(ids);
        return -1;
    }
    zoo_create(zk_raw, "/seckill-bench", NULL, -1, &ZOO_OPEN_ACL_UNSAFE, 0, NULL, 0);
    for (int i = 0; i < o.threads; i++)
        ids[i] = i;
    double dt = bc_run_threads(o.threads, zk_ceiling_main, ids, sizeof *ids);
    zookeeper_close(zk_raw);
    free(ids);
    return (double)atomic_load(&zk_ops) / dt;
}

/*---- pgbench scripts ----*/

/* 'sql' with $1 the client's key, $2 its owner, $3 the lease. */
static int write_script(FILE *f, const char *sql)
{
    for (const char *p = sql; *p; p++) {
        if (p[0] == '$' && p[1] >= '1' && p[1] <= '3') {
            fputs(p[1] == '1' ? "('pgbench-lock-' || CAST(:client_id AS text))" :
                  p[1] == '2' ? "('pgbench-owner-' || CAST(:client_id AS text))" : "30000", f);
            p++;
        } else {
            fputc(*p, f);
        }
    }
    return fputs(";\n", f) == EOF ? -1 : 0;
}

static int pgbench_scripts(const char *dir)
{
    char path[1024];
    FILE *f;
    int rc = 0;

    snprintf(path, sizeof path, "%s/pg-table.sql", dir);
    if ((f = fopen(path, "w")) == NULL)
        return -1;
    rc |= write_script(f, pg_lock_sql_acquire);
    rc |= write_script(f, pg_lock_sql_release);
    rc |= fclose(f);
    snprintf(path, sizeof path, "%s/pg-advisory.sql", dir);
    if ((f = fopen(path, "w")) == NULL)
        return -1;
    fprintf(f, "SELECT pg_try_advisory_lock(CAST(:client_id AS bigint));\n"
               "SELECT pg_advisory_unlock(CAST(:client_id AS bigint));\n");
    rc |= fclose(f);
    return rc;
}

/*---- main ----*/

static int write_json(cJSON *j)
{
    char *s = cJSON_Print(j);
    FILE *f = o.json != NULL ? fopen(o.json, "w") : stdout;
    int rc = f != NULL && s != NULL && fputs(s, f) != EOF ? 0 : -1;

    if (f != NULL && f != stdout)
        fclose(f);
    free(s);
    return rc;
}

int main(int argc, char **argv)
{
    const char *child = NULL, *child_exit = NULL, *scripts = NULL;
    int ceiling = 0;
    const bc_opt args[] = {
        { "--backend", .s = &o.backend },
        { "--threads", .i = &o.threads },
        { "--seconds", .d = &o.seconds },
        { "--handoffs", .i = &o.handoffs },
        { "--lease-ms", .l = &o.lease_ms },
        { "--json", .s = &o.json },
        { "--zk-ceiling", .flag = &ceiling },
        { "--pgbench-scripts", .s = &scripts },
        { "--child", .s = &child },            /* bench_release_after's child */
        { "--child-exit", .s = &child_exit },  /* the same, exiting at once */
    };
    cJSON *j;
    double pairs, p50 = 0, p99 = 0, max = 0, crash, clean;

    self_path = argv[0];
    signal(SIGPIPE, SIG_IGN);
    if (bc_parse_opts(argc, argv, args, sizeof args / sizeof args[0]) != 0)
        return 2;
    j = cJSON_CreateObject();
    if (scripts != NULL)
        return pgbench_scripts(scripts) == 0 ? 0 : 1;
    if (ceiling) {
        double c = zk_ceiling();
        cJSON_AddNumberToObject(j, "zkCreateDeletePerS", c);
        write_json(j);
        cJSON_Delete(j);
        return c > 0 ? 0 : 1;
    }
    if (o.backend == NULL || o.threads < 1 || o.handoffs < 1 || o.lease_ms < 100 ||
        (strcmp(o.backend, "redis") != 0 && strcmp(o.backend, "zk") != 0 &&
         strcmp(o.backend, "pg-table") != 0 && strcmp(o.backend, "pg-advisory") != 0 &&
         !multi())) {
        fprintf(stderr, "usage: bench_locks --backend redis|zk|pg-table|pg-advisory|multilock|"
                        "redlock [--threads N] "
                        "[--seconds S] [--handoffs N] [--lease-ms L] [--json PATH]\n");
        return 2;
    }
    if (child != NULL || child_exit != NULL)
        return child_main(child != NULL ? child : child_exit, child_exit != NULL);
    if (strcmp(o.backend, "redis") == 0 || multi())
        tl_setup(argv[0]);
    if (strcmp(o.backend, "zk") == 0)
        open_zk();
    pairs = bc_pairs_run(o.threads, 0, o.seconds, pairs_main);
    if (pairs < 0 || bench_handoff(&p50, &p99, &max) != 0) {
        fprintf(stderr, "bench_locks: %s: a lock call failed\n", o.backend);
        return 1;
    }
    crash = bench_release_after(0);
    clean = bench_release_after(1);
    cJSON_AddStringToObject(j, "backend", o.backend);
    cJSON_AddNumberToObject(j, "threads", o.threads);
    cJSON_AddNumberToObject(j, "leaseMs", (double)o.lease_ms);
    cJSON_AddNumberToObject(j, "pairsPerS", pairs);
    cJSON_AddNumberToObject(j, "handoffP50Ms", p50);
    cJSON_AddNumberToObject(j, "handoffP99Ms", p99);
    cJSON_AddNumberToObject(j, "handoffMaxMs", max);
    cJSON_AddNumberToObject(j, "freeAfterKillMs", crash);
    cJSON_AddNumberToObject(j, "freeAfterExitMs", clean);
    write_json(j);
    cJSON_Delete(j);
    if (zk != NULL)
        zk_lock_close(zk);
    if (strcmp(o.backend, "redis") == 0 || multi())
        lock_runtime_stop();
    return crash < 0 || clean < 0 ? 1 : 0;
}
