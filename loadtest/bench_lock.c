/* bench_lock: the lock's throughput and hand-off latency, next to
 * redis-benchmark running the same acquire script on the same Redis.
 *
 *   bench_lock [--threads N] [--seconds S] [--handoffs N] [--requests N]
 *              [--replicas N] [--sync N] [--sync-timeout MS] [--json PATH]
 *
 * Uses REDIS_URL when set, else starts a throwaway redis-server on a free
 * loopback port (stopped at the end), with --replicas N replicas of it (what
 * a Sentinel setup runs: every write is also sent to them). --sync N: every
 * grant waits for N replicas' acknowledgement (LOCK_SYNC_REPLICAS, WAIT;
 * timeout --sync-timeout, 500 ms). Measures:
 *   1. uncontended acquire+release pairs per second: N threads, each its
 *      own connection and key, for S seconds;
 *   2. contended hand-off: two threads pass one lock back and forth with
 *      lock_try_lock (pub/sub wait); latency = release sent -> the waiter's
 *      lock_try_lock returned, p50/p99/max;
 *   3. redis-benchmark -c N: EVALSHA of lua/lock_acquire.lua (SCRIPT LOAD
 *      first) on one key, and the ratio of our script calls per second
 *      (2 per pair) to its.
 * Prints a table and writes JSON (--json). Exit status 0 unless something
 * failed outright. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cJSON.h>

#include "t.h"
#define BC_TOOL "bench_lock"
#include "bench_c.h"
#include "t_lock.h"
#include "lock.h"
#include "lock_wait.h"
#include "util.h"

#define LEASE_MS 30000L

typedef struct bench_opts {
    int replicas, sync, sync_timeout_ms;
    int threads;
    double seconds;
    int handoffs;
    long requests;
    const char *json;
} bench_opts;

#define MAX_REPLICAS 4
static pid_t redis_pids[1 + MAX_REPLICAS] = { -1, -1, -1, -1, -1 };
static char spawned_url[128];   /* our redis-server, if we started one */

/*---- a throwaway redis-server ----*/

static int free_port(void)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof a;
    int port = -1, fd = socket(AF_INET, SOCK_STREAM, 0);

    if (fd < 0)
        return -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* 1 when the Redis on 'port' answers 'probe' (PING: PONG; otherwise an INFO
 * section that must contain 'want'). */
static int redis_answers(int port, const char *probe, const char *want)
{
    struct timeval tv = {0, 200000};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    int ok = 0;

    if (c != NULL && !c->err) {
        redisReply *r = redisCommand(c, want == NULL ? "PING" : "INFO %s", probe);
        ok = r != NULL && (want == NULL ? r->type == REDIS_REPLY_STATUS
                                        : r->type == REDIS_REPLY_STRING && strstr(r->str, want));
        freeReplyObject(r);
    }
    redisFree(c);
    return ok;
}

/* Starts redis-server number i on a free port, a replica of 'master' when
 * that is not 0, and waits for it (a replica: until its link is up).
 * Returns its port, or -1. */
static int redis_start(int i, int master)
{
    char port_s[16], master_s[16];
    int port = free_port();

    if (port < 0)
        return -1;
    snprintf(port_s, sizeof port_s, "%d", port);
    snprintf(master_s, sizeof master_s, "%d", master);
    redis_pids[i] = fork();
    if (redis_pids[i] < 0)
        return -1;
    if (redis_pids[i] == 0) {
        /* No file anywhere: a replica loads its first sync straight from
         * the socket instead of writing dump.rdb into the current directory. */
        char *args[] = { "redis-server", "--port", port_s, "--bind", "127.0.0.1", "--save", "",
                         "--appendonly", "no", "--daemonize", "no", "--logfile", "",
                         "--loglevel", "warning", "--repl-diskless-load", "on-empty-db",
                         master ? "--replicaof" : NULL, "127.0.0.1", master_s, NULL };
        int devnull = open("/dev/null", 0);
        if (devnull >= 0) {
            dup2(devnull, STDIN_FILENO);
            dup2(devnull, STDOUT_FILENO);
        }
        execvp("redis-server", args);
        _exit(127);
    }
    for (int n = 0; n < 200; n++) {
        if (master ? redis_answers(port, "replication", "master_link_status:up")
                   : redis_answers(port, "", NULL))
            return port;
        t_sleep_ms(50);
    }
    return -1;
}

static void redis_stop(void)
{
    int status;

    for (int i = 0; i <= MAX_REPLICAS; i++) {
        if (redis_pids[i] <= 0)
            continue;
        kill(redis_pids[i], SIGTERM);
        waitpid(redis_pids[i], &status, 0);
        redis_pids[i] = -1;
    }
}

/*---- 1. uncontended pairs ----*/

static void *pairs_main(void *p)
{
    bc_pair_thread *t = p;
    redisContext *c = t_redis();
    char key[96], owner[96];

    snprintf(key, sizeof key, "bench:lock:%ld:u%d", (long)getpid(), t->id);
    tl_owner(owner, sizeof owner, t->id);
    pthread_barrier_wait(&bc_start_line);
    double end = t_now_ms() + t->seconds * 1000.0;
    while (t_now_ms() < end) {
        for (int i = 0; i < 64; i++) {
            if (lock_try_acquire(c, key, owner, LEASE_MS, NULL) != LOCK_OK ||
                lock_release(c, key, owner, LEASE_MS, NULL) != LOCK_OK) {
                t->failed = 1;
                goto cleanup;
            }
            t->pairs++;
        }
    }
cleanup:
    redisFree(c);
    return NULL;
}

/*---- 2. contended hand-off ----*/

typedef struct handoff_shared {
    char key[96];
    int total;                 /* hand-offs to record */
    atomic_int done;           /* recorded so far */
    _Atomic int64_t released_us;   /* when the last holder sent its release; 0 = none */
    double *lat_ms;            /* [total] */
    atomic_int failed;
} handoff_shared;

typedef struct handoff_thread {
    handoff_shared *s;
    int id;
    pthread_t thread;
} handoff_thread;

static void *handoff_main(void *p)
{
    handoff_thread *t = p;
    handoff_shared *s = t->s;
    redisContext *c = t_redis();
    char owner[96];

    tl_owner(owner, sizeof owner, t->id);
    while (atomic_load(&s->done) < s->total) {
        lock_status st = lock_try_lock(c, s->key, owner, 10000, LEASE_MS, NULL);
        int64_t now = util_mono_us();
        if (st != LOCK_OK) {
            atomic_store(&s->failed, 1);
            break;
        }
        int64_t rel = atomic_exchange(&s->released_us, 0);
        if (rel != 0) {
            int i = atomic_fetch_add(&s->done, 1);
            if (i < s->total)
                s->lat_ms[i] = (double)(now - rel) / 1000.0;
        }
        /* Hold long enough for the other thread to be blocked in its wait:
         * this measures the pub/sub hand-off, not a lucky retry. */
        t_sleep_ms(2);
        atomic_store(&s->released_us, util_mono_us());
        if (lock_release(c, s->key, owner, LEASE_MS, NULL) != LOCK_OK) {
            atomic_store(&s->failed, 1);
            break;
        }
    }
    redisFree(c);
    return NULL;
}

static int bench_handoff(const bench_opts *o, double *p50, double *p99, double *max)
{
    handoff_shared s = { .total = o->handoffs };
    handoff_thread t[2];

    snprintf(s.key, sizeof s.key, "bench:lock:%ld:handoff", (long)getpid());
    s.lat_ms = xcalloc((size_t)o->handoffs, sizeof *s.lat_ms);
    for (int i = 0; i < 2; i++) {
        t[i] = (handoff_thread){ .s = &s, .id = 2000 + i };
        if (pthread_create(&t[i].thread, NULL, handoff_main, &t[i]) != 0)
            abort();
    }
    for (int i = 0; i < 2; i++)
        pthread_join(t[i].thread, NULL);
    int n = atomic_load(&s.done) < s.total ? atomic_load(&s.done) : s.total;
    *max = tl_percentile(s.lat_ms, (size_t)n, 100);
    *p99 = tl_percentile(s.lat_ms, (size_t)n, 99);
    *p50 = tl_percentile(s.lat_ms, (size_t)n, 50);
    free(s.lat_ms);
    return atomic_load(&s.failed) || n < s.total ? -1 : 0;
}

/*---- 3. redis-benchmark ----*/

/* SCRIPT LOADs lua/lock_acquire.lua; returns 0 when the server's SHA1 is
 * the one we run. */
static int load_acquire_script(redisContext *c, char sha[41])
{
    char path[1100];
    static char src[65536];
    size_t n;
    FILE *f;
    int rc = -1;

    snprintf(path, sizeof path, "%s/lock_acquire.lua", t_lua_dir());
    f = fopen(path, "rb");
    if (f == NULL)
        return -1;
    n = fread(src, 1, sizeof src, f);
    fclose(f);
    redisReply *r = redisCommand(c, "SCRIPT LOAD %b", src, n);
    if (r != NULL && r->type == REDIS_REPLY_STRING && strlen(r->str) == 40 &&
        strcmp(r->str, script_sha(SCRIPT_LOCK_ACQUIRE)) == 0) {
        memcpy(sha, r->str, 41);
        rc = 0;
    }
    freeReplyObject(r);
    return rc;
}

/* Runs redis-benchmark (-q) with the same connection count and returns its
 * requests per second, or -1. 'line' gets its summary line. */
static double run_redis_benchmark(const bench_opts *o, const char *sha, char *line, size_t n)
{
    const redis_url *u = &g_cfg.redis;
    char cmd[2048], auth[700] = "";
    double rps = -1;
    FILE *p;

    if (u->password[0] != '\0') {
        /* the shell sees these: keep them in single quotes */
        if (strchr(u->password, '\'') != NULL || strchr(u->username, '\'') != NULL)
            return -1;
        snprintf(auth, sizeof auth, "%s%s%s -a '%s' --no-auth-warning",
                 u->username[0] ? "--user '" : "", u->username, u->username[0] ? "'" : "",
                 u->password);
    }
    snprintf(cmd, sizeof cmd,
             "redis-benchmark -h %s -p %d --dbnum %d %s -c %d -n %ld -q "
             "EVALSHA %s 2 bench:rb:%ld redisson_lock_token:{bench:rb:%ld} %ld rb-owner:1 "
             "2>&1",
             u->host, u->port, u->db, auth, o->threads, o->requests, sha, (long)getpid(),
             (long)getpid(), LEASE_MS);
    p = popen(cmd, "r");
    if (p == NULL)
        return -1;
    line[0] = '\0';
    /* -q redraws a progress line with \r, then prints
     * "<command>: <rps> requests per second, ...": split on both. */
    char buf[1024];
    size_t len = 0;
    for (int ch = getc(p); ch != EOF; ch = getc(p)) {
        if (ch != '\r' && ch != '\n') {
            if (len + 1 < sizeof buf)
                buf[len++] = (char)ch;
            continue;
        }
        buf[len] = '\0';
        len = 0;
        char *hit = strstr(buf, " requests per second");
        char *colon = hit != NULL ? strrchr(buf, ':') : NULL;
        if (colon != NULL && colon < hit) {
            rps = strtod(colon + 1, NULL);
            snprintf(line, n, "%s", buf);
        }
    }
    if (pclose(p) != 0)
        rps = -1;
    return rps;
}

/*---- main ----*/

/* The fencing counters have no TTL: remove ours from a shared Redis. */
static void cleanup_keys(redisContext *c, const bench_opts *o)
{
    long pid = (long)getpid();
    redisReply *r;

    for (int i = 0; i < o->threads; i++) {
        r = redisCommand(c, "DEL redisson_lock_token:{bench:lock:%ld:u%d}", pid, 1000 + i);
        freeReplyObject(r);
    }
    r = redisCommand(c, "DEL redisson_lock_token:{bench:lock:%ld:handoff} bench:rb:%ld "
                        "redisson_lock_token:{bench:rb:%ld}", pid, pid, pid);
    freeReplyObject(r);
}

static int parse_opts(int argc, char **argv, bench_opts *o)
{
    const bc_opt opts[] = {
        { "--threads", .i = &o->threads },
        { "--seconds", .d = &o->seconds },
        { "--handoffs", .i = &o->handoffs },
        { "--requests", .l = &o->requests },
        { "--json", .s = &o->json },
        { "--replicas", .i = &o->replicas },
        { "--sync", .i = &o->sync },
        { "--sync-timeout", .i = &o->sync_timeout_ms },
    };

    *o = (bench_opts){ .threads = 4, .seconds = 3, .handoffs = 300, .requests = 100000,
                       .json = NULL, .sync_timeout_ms = 500 };
    if (bc_parse_opts(argc, argv, opts, sizeof opts / sizeof opts[0]) != 0)
        return -1;
    return o->threads > 0 && o->threads <= 256 && o->seconds > 0 && o->handoffs > 0 &&
                   o->requests > 0 && o->replicas >= 0 && o->replicas <= MAX_REPLICAS &&
                   o->sync >= 0 && o->sync_timeout_ms > 0 && o->sync_timeout_ms < 5000 ? 0 : -1;
}

static int write_json(const bench_opts *o, double pairs_s, double p50, double p99, double max,
                      double rb_rps, double ratio, const char *rb_line)
{
    cJSON *j = cJSON_CreateObject();
    char *text;
    FILE *f;
    int rc = -1;

    cJSON_AddStringToObject(j, "redis", g_cfg.redis_url_text);
    cJSON_AddNumberToObject(j, "replicas", o->replicas);
    cJSON_AddNumberToObject(j, "syncReplicas", o->sync);
    cJSON_AddNumberToObject(j, "syncTimeoutMs", o->sync_timeout_ms);
    cJSON_AddNumberToObject(j, "threads", o->threads);
    cJSON_AddNumberToObject(j, "cpus", (double)sysconf(_SC_NPROCESSORS_ONLN));
    cJSON_AddNumberToObject(j, "seconds", o->seconds);
    cJSON_AddNumberToObject(j, "pairsPerSecond", pairs_s);
    cJSON_AddNumberToObject(j, "scriptCallsPerSecond", 2 * pairs_s);
    cJSON_AddNumberToObject(j, "handoffs", o->handoffs);
    cJSON_AddNumberToObject(j, "handoffP50Ms", p50);
    cJSON_AddNumberToObject(j, "handoffP99Ms", p99);
    cJSON_AddNumberToObject(j, "handoffMaxMs", max);
    cJSON_AddNumberToObject(j, "redisBenchmarkRequests", (double)o->requests);
    cJSON_AddNumberToObject(j, "redisBenchmarkEvalshaPerSecond", rb_rps);
    cJSON_AddNumberToObject(j, "ratioOursToRedisBenchmark", ratio);
    cJSON_AddStringToObject(j, "redisBenchmarkLine", rb_line);
    text = cJSON_Print(j);
    f = fopen(o->json, "w");
    if (f != NULL && text != NULL) {
        fprintf(f, "%s\n", text);
        rc = fclose(f) == 0 ? 0 : -1;
    } else if (f != NULL) {
        fclose(f);
    }
    free(text);
    cJSON_Delete(j);
    return rc;
}

int main(int argc, char **argv)
{
    bench_opts o;
    double pairs_s = 0, p50 = 0, p99 = 0, max = 0, rb_rps = -1, ratio = 0;
    char sha[41] = "", rb_line[1024] = "";
    redisContext *c = NULL;
    int rc = 1;

    if (parse_opts(argc, argv, &o) != 0) {
        fprintf(stderr, "usage: bench_lock [--threads N] [--seconds S] [--handoffs N] "
                        "[--requests N] [--replicas N] [--sync N] [--sync-timeout MS] "
                        "[--json PATH]\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    if (getenv("REDIS_URL") == NULL || getenv("REDIS_URL")[0] == '\0') {
        int master = redis_start(0, 0);
        for (int i = 1; master > 0 && i <= o.replicas; i++) {
            if (redis_start(i, master) < 0)
                master = -1;
        }
        if (master < 0) {
            fprintf(stderr, "bench_lock: cannot start redis-server (and its replicas)\n");
            redis_stop();
            return 1;
        }
        snprintf(spawned_url, sizeof spawned_url, "redis://127.0.0.1:%d", master);
        setenv("REDIS_URL", spawned_url, 1);
    } else if (o.replicas > 0) {
        fprintf(stderr, "bench_lock: --replicas starts a throwaway Redis: unset REDIS_URL\n");
        return 2;
    }
    tl_setup(argv[0]);
    lock_sync_set(o.sync, o.sync_timeout_ms);
    c = t_redis();
    printf("bench_lock: Redis %s with %d replica(s), grants wait for %d (WAIT), %d threads, "
           "%ld CPUs\n", g_cfg.redis_url_text, o.replicas, o.sync, o.threads,
           sysconf(_SC_NPROCESSORS_ONLN));

    /* thread ids from 1000: cleanup_keys removes their keys' counters */
    pairs_s = bc_pairs_run(o.threads, 1000, o.seconds, pairs_main);
    if (pairs_s < 0) {
        fprintf(stderr, "bench_lock: uncontended run failed\n");
        goto cleanup;
    }
    if (bench_handoff(&o, &p50, &p99, &max) != 0) {
        fprintf(stderr, "bench_lock: hand-off run failed\n");
        goto cleanup;
    }
    if (load_acquire_script(c, sha) != 0) {
        fprintf(stderr, "bench_lock: SCRIPT LOAD of lock_acquire.lua failed\n");
        goto cleanup;
    }
    rb_rps = run_redis_benchmark(&o, sha, rb_line, sizeof rb_line);
    if (rb_rps <= 0) {
        fprintf(stderr, "bench_lock: redis-benchmark failed (is it installed?)\n");
        goto cleanup;
    }
    ratio = 2 * pairs_s / rb_rps;

    printf("\n%-44s %14s\n", "measure", "value");
    printf("%-44s %14.0f\n", "uncontended acquire+release pairs/s", pairs_s);
    printf("%-44s %14.0f\n", "  = lock script calls/s (2 per pair)", 2 * pairs_s);
    printf("%-44s %14.3f\n", "contended hand-off p50 (ms)", p50);
    printf("%-44s %14.3f\n", "contended hand-off p99 (ms)", p99);
    printf("%-44s %14.3f\n", "contended hand-off max (ms)", max);
    printf("%-44s %14.0f\n", "redis-benchmark EVALSHA acquire/s", rb_rps);
    printf("%-44s %14.2f\n", "ratio ours / redis-benchmark (script calls)", ratio);
    printf("\nredis-benchmark -c %d -n %ld: %s\n", o.threads, o.requests, rb_line);
    if (o.json != NULL) {
        if (write_json(&o, pairs_s, p50, p99, max, rb_rps, ratio, rb_line) != 0) {
            fprintf(stderr, "bench_lock: cannot write %s\n", o.json);
            goto cleanup;
        }
        printf("wrote %s\n", o.json);
    }
    rc = 0;
cleanup:
    if (c != NULL) {
        cleanup_keys(c, &o);
        redisFree(c);
    }
    lock_runtime_stop();
    redis_stop();
    return rc;
}
