/* seckill: a flash-sale service. main wires the modules together: the
 * configuration, then a table of steps (the scripts, Sentinel, the
 * strategies, the lock library given its connect function and observer
 * here, the background threads, the HTTP daemon) started in order and
 * stopped in the reverse one, on a refused start or at the shutdown. */
#include "broadcast.h"
#include "config.h"
#include "config_show.h"
#include "conn.h"
#include "consumer.h"
#include "fence.h"
#include "handlers.h"
#include "http.h"
#include "lock.h"
#include "log.h"
#include "order.h"
#include "counters.h"
#include "script.h"
#include "store_prepare.h"
#include "peers.h"
#include "sentinel.h"
#include "stream_tidy.h"
#include "util.h"
#include "stats.h"
#include "user_lock.h"
#include "version.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <microhttpd.h>

#define SHUTDOWN_GRACE_MS 5000

/* Exit codes of a refused start. */
#define EXIT_CONFIG 2         /* a setting is invalid, or names something that does not exist */
#define EXIT_UNREACHABLE 3    /* no Redis Sentinel answered */

/* The lock library's threads keep connections open: one that leads to a
 * demoted master is re-opened (lock_options.stale). */
static int redis_stale(const redisContext *c)
{
    return !conn_redis_current(c);
}

/* LOCK_SYNC_REPLICAS above the master's replicas refuses every grant:
 * said once at start (the replicas may still be on their way). A warning,
 * never a refusal to start: always 0. */
static int check_sync_replicas(void)
{
    char err[256];
    redisContext *c;
    redisReply *r;
    const char *p;

    if (g_cfg.lock_sync_replicas == 0 || (c = conn_redis_open(err, sizeof err)) == NULL)
        return 0;
    r = redisCommand(c, "INFO replication");
    if (r != NULL && r->type == REDIS_REPLY_STRING &&
        (p = strstr(r->str, "connected_slaves:")) != NULL &&
        atoi(p + strlen("connected_slaves:")) < g_cfg.lock_sync_replicas)
        log_warn("LOCK_SYNC_REPLICAS=%d but the master has %d replica(s) connected: lock grants "
                 "are refused (503) until enough replicas acknowledge them",
                 g_cfg.lock_sync_replicas, atoi(p + strlen("connected_slaves:")));
    freeReplyObject(r);
    redisFree(c);
    return 0;
}

/* After the first SIGTERM or SIGINT: a second one ends the process at once,
 * for a shutdown that is stuck (a request that does not finish). The
 * signals stay blocked in every thread; this one takes them with sigwait. */
static void *second_signal_main(void *arg)
{
    const sigset_t *sigs = arg;
    int sig;

    util_thread_name("sk-signals");
    for (;;) {
        if (sigwait(sigs, &sig) != 0 || sig == SIGHUP)
            continue;
        log_warn("second signal %d during the shutdown: exiting at once, requests in flight "
                 "are cut short", sig);
        _exit(128 + sig);
    }
    return NULL;
}

/* A worker opens its Postgres and Redis connections as it starts, not at
 * its first request: the first second of a sale would otherwise open
 * 2 x THREADS connections per instance at once, and on a busy machine some
 * missed PG_CONNECT_TIMEOUT_S and answered 503. One that fails now is
 * opened again at the first request that needs it. */
static void warm_worker(void)
{
    conn_set *cs = conn_get();

    if (conn_pg(cs) == NULL)
        log_debug("worker: no Postgres connection at start; opened at its first use");
    if (conn_redis(cs) == NULL)
        log_debug("worker: no Redis connection at start; opened at its first use");
}


/*---- the steps ----*/

/* The signals main takes with sigwait: blocked in every thread (the
 * "signals" step is the first). */
static sigset_t signals;

/* How long the drain waits for clients to close their connections: set
 * when the signal that stops the process is known. */
static int drain_ms;

static int start_scripts(void)
{
    char err[512];

    if (script_load_all(g_cfg.lua_dir, err, sizeof err) != 0 ||
        stream_tidy_load(g_cfg.lua_dir, err, sizeof err) != 0) {
        log_error("lua scripts: %s (set LUA_DIR)", err);
        return EXIT_CONFIG;
    }
    return 0;
}

/* With Sentinel: finds the master (sentinel_start says why not). */
static int start_sentinel(void)
{
    switch (sentinel_start()) {
    case SENTINEL_STARTED:
        return 0;
    case SENTINEL_UNKNOWN_MASTER:
        return EXIT_CONFIG;
    case SENTINEL_UNREACHABLE:
        return EXIT_UNREACHABLE;
    default:
        return EXIT_FAILURE;
    }
}

static int start_order(void)
{
    return order_start() == 0 ? 0 : EXIT_CONFIG;
}

static int start_setup(void)
{
    conn_set_pg_init(store_prepare);
    if (g_cfg.pg_ha)
        conn_set_pg_recheck(store_ha_check, 1000);
    {
        /* Every histogram has a bound at each timeout, so that calls cut by
         * one are told from slow ones; the request deadline too, when set. */
        const double timeouts[] = { g_cfg.redis_timeout_ms / 1000.0,
                                    g_cfg.pg_statement_timeout_ms / 1000.0,
                                    (double)g_cfg.pg_connect_timeout_s,
                                    g_cfg.request_deadline_ms / 1000.0 };   /* 0: none */
        counters_set_buckets(timeouts, (int)(sizeof timeouts / sizeof timeouts[0]));
    }
    return 0;
}

/* Blocks the signals in main and so in every thread it starts; main alone
 * takes them with sigwait. */
static int start_signals(void)
{
    sigemptyset(&signals);
    sigaddset(&signals, SIGTERM);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &signals, NULL);
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

static int start_peers(void)
{
    return peers_start() == 0 ? 0 : EXIT_FAILURE;
}

static int start_lock(void)
{
    lock_options lo = {
        .connect = conn_redis_open,
        .command_timeout_ms = g_cfg.redis_timeout_ms,
        .watchdog_timeout_ms = g_cfg.watchdog_timeout_ms,
        .observe = counters_redis_call,
        .stale = redis_stale,
        .sync_replicas = g_cfg.lock_sync_replicas,
        .sync_timeout_ms = g_cfg.lock_sync_timeout_ms,
        .token_ttl_ms = g_cfg.lock_token_ttl_ms,
        .cluster_nodes = g_cfg.cluster_nodes_text,
    };

    return lock_runtime_start(&lo) == 0 ? 0 : EXIT_FAILURE;
}

static int start_bcast(void)
{
    return broadcast_start() == 0 ? 0 : EXIT_FAILURE;
}

static int start_stats(void)
{
    return stats_start() == 0 ? 0 : EXIT_FAILURE;
}

/* Only tokens that are clock readings have an age to sweep by: this
 * strategy's rows, never another lock service's sharing the table. */
static int start_fence(void)
{
    char prefix[64];

    if (g_cfg.fence_horizon_ms <= 0 || !user_lock_token_clock())
        return 0;
    if (user_lock_fence_key_prefix(prefix, sizeof prefix) != 0) {
        log_error("the lock's fence key prefix does not fit in %zu bytes", sizeof prefix);
        return EXIT_FAILURE;
    }
    return fence_start(g_cfg.fence_horizon_ms, prefix) == 0 ? 0 : EXIT_FAILURE;
}

static int start_consumer(void)
{
    return consumer_start() == 0 ? 0 : EXIT_FAILURE;
}

static int start_http(void)
{
    http_set_worker_init(warm_worker);
    return http_start(handlers_routes, handlers_route_count) == 0 ? 0 : EXIT_FAILURE;
}

/* The drain, then the snapshot's waiters (answered by stats_stop: parked
 * requests must be answered before libmicrohttpd can stop), then the
 * daemon. */
static void stop_http(void)
{
    http_drain(drain_ms, SHUTDOWN_GRACE_MS);
    stats_stop();
    http_stop();
}

/* One step of the start. 'start' returns 0, or the exit code of a refused
 * start; a start function logs its own failure, once (main adds nothing).
 * 'stop' (NULL: nothing to undo) is called only when 'start' succeeded. */
typedef struct main_step {
    const char *name;
    int (*start)(void);
    void (*stop)(void);
} main_step;

/* Started in this order, stopped in the reverse one: on a refused start
 * from the step before it, at the end from the last. */
static const main_step steps[] = {
    /* First: every thread started after it inherits the blocked signals,
     * so only main's sigwait takes them. A thread started before would be
     * handed a SIGTERM whenever main is not in sigwait (still starting, or
     * draining) and the process would die of it with no drain. A signal
     * during the start-up waits for the sigwait: every start step is
     * bounded by its timeouts. */
    { "signals", start_signals, NULL },
    { "lua scripts", start_scripts, NULL },
    /* Before anything opens a Redis connection: they all ask it where the master is. */
    { "sentinel", start_sentinel, sentinel_stop },
    { "lock and stock strategies", start_order, order_stop },
    { "replicas check", check_sync_replicas, NULL },
    { "connections and histograms", start_setup, NULL },
    { "stats publisher", start_peers, peers_stop },
    { "lock runtime", start_lock, lock_runtime_stop },
    { "broadcast subscriber", start_bcast, broadcast_stop },
    { "stats", start_stats, stats_stop },
    { "fence sweeper", start_fence, fence_stop },
    /* Stopped after the last request: what they admitted is persisted by
     * this consumer or, once idle long enough, claimed by another. */
    { "stream consumer", start_consumer, consumer_stop },
    { "http", start_http, stop_http },
};

#define N_STEPS (sizeof steps / sizeof steps[0])

/* Stops steps[n-1] down to steps[0]. */
static void stop_steps(size_t n)
{
    while (n > 0) {
        const main_step *s = &steps[--n];
        if (s->stop != NULL) {
            log_debug("stopping: %s", s->name);
            s->stop();
        }
    }
}

/* Starts every step in order. Returns 0, or the failing step's exit code,
 * the steps before it stopped again. */
static int start_steps(void)
{
    for (size_t i = 0; i < N_STEPS; i++) {
        int rc = steps[i].start();
        if (rc != 0) {                       /* logged by the step itself */
            stop_steps(i);
            return rc;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    int sig, rc;

    /* --version needs no configuration: it answers even when the
     * environment holds something config_load would refuse. */
    for (int a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--version") == 0) {
            version_print(stdout);
            return EXIT_SUCCESS;
        }
    }
    rc = config_load(argc, argv);
    if (rc != 0)
        return rc > 0 ? EXIT_SUCCESS : EXIT_CONFIG;
    log_set_level((enum log_level)g_cfg.log_level);
    util_set_test_clock_step_ms(g_cfg.test_clock_step_ms);
    log_set_json(g_cfg.log_format == LOGS_JSON);
    {
        char desc[1400];
        config_show_describe(desc, sizeof desc);
        log_info("seckill %s: config %s", version_string(), desc);
    }
    if ((rc = start_steps()) != 0)
        return rc;
    log_info("seckill %s listening on %s:%d (threads %d, libmicrohttpd %s, owner %s)",
             g_cfg.instance_id, g_cfg.bind, g_cfg.port, g_cfg.threads, MHD_get_version(),
             g_cfg.instance_uuid);
    if (config_unsafe())
        log_warn("UNSAFE demo strategies in force: lock=%s stock=%s delay=%dms pause=%dms "
                 "fencing=%s. This instance can oversell or sell twice to one user; never run "
                 "it for a real sale.",
                 config_lock_name(g_cfg.lock_strategy), config_stock_name(g_cfg.stock_strategy),
                 g_cfg.demo_delay_ms, g_cfg.demo_pause_ms, g_cfg.fencing ? "on" : "OFF");
    if (g_cfg.demo_random_user)
        log_warn("DEMO_RANDOM_USER=1: requests without X-User-Id buy as random new users");

    do {
        if (sigwait(&signals, &sig) != 0)
            sig = SIGTERM;
    } while (sig == SIGHUP);
    {
        pthread_t second;
        if (pthread_create(&second, NULL, second_signal_main, &signals) == 0)
            pthread_detach(second);
    }
    /* SIGINT (Ctrl-C; a restart with no traffic to protect) does not wait
     * for clients to close their idle connections. */
    drain_ms = sig == SIGINT ? 0 : g_cfg.shutdown_drain_ms;
    log_info("signal %d: draining (GET /ready answers 503, no new connections, open ones "
             "closed by their clients within %d ms), finishing requests in flight, then "
             "stopping; a second signal stops at once", sig, drain_ms);
    stop_steps(N_STEPS);
    log_info("stopped");
    return EXIT_SUCCESS;
}
