/* seckill: a flash-sale service. main wires the modules together: config,
 * scripts, the strategies, the lock library (given its connect function and
 * observer here), the stats publisher, the HTTP daemon, and a clean
 * shutdown. */
#include "bcast.h"
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
#include "rec.h"
#include "script.h"
#include "store_prepare.h"
#include "peers.h"
#include "sentinel.h"
#include "stream_tidy.h"
#include "util.h"
#include "stats.h"
#include "ulock.h"
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

/* With Sentinel: finds the master, or says why not. 0, or an exit code. */
static int start_sentinel(void)
{
    char err[1024];

    switch (sentinel_start(err, sizeof err)) {
    case SENTINEL_STARTED:
        return 0;
    case SENTINEL_UNKNOWN_MASTER:
        log_error("REDIS_SENTINELS: no Sentinel knows a master named '%s' (REDIS_MASTER_NAME): %s",
                  g_cfg.master_name, err);
        return EXIT_CONFIG;
    case SENTINEL_UNREACHABLE:
        log_error("REDIS_SENTINELS: no Sentinel answered (%s): %s", g_cfg.sentinels_text, err);
        return EXIT_UNREACHABLE;
    default:
        log_error("REDIS_SENTINELS: %s", err);
        return 1;
    }
}

/* LOCK_SYNC_REPLICAS above the master's replicas refuses every grant:
 * said once at start (the replicas may still be on their way). */
static void check_sync_replicas(void)
{
    char err[256];
    redisContext *c;
    redisReply *r;
    const char *p;

    if (g_cfg.lock_sync_replicas == 0 || (c = conn_redis_open(err, sizeof err)) == NULL)
        return;
    r = redisCommand(c, "INFO replication");
    if (r != NULL && r->type == REDIS_REPLY_STRING &&
        (p = strstr(r->str, "connected_slaves:")) != NULL &&
        atoi(p + strlen("connected_slaves:")) < g_cfg.lock_sync_replicas)
        log_warn("LOCK_SYNC_REPLICAS=%d but the master has %d replica(s) connected: lock grants "
                 "are refused (503) until enough replicas acknowledge them",
                 g_cfg.lock_sync_replicas, atoi(p + strlen("connected_slaves:")));
    freeReplyObject(r);
    redisFree(c);
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

int main(int argc, char **argv)
{
    char err[512], fence_prefix[64];
    sigset_t sigs;
    int sig, rc, drain_ms;

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
    if (script_load_all(g_cfg.lua_dir, err, sizeof err) != 0 ||
        stream_tidy_load(g_cfg.lua_dir, err, sizeof err) != 0) {
        log_error("lua scripts: %s (set LUA_DIR)", err);
        return EXIT_CONFIG;
    }
    /* Before anything opens a Redis connection: they all ask it where the master is. */
    if ((rc = start_sentinel()) != 0)
        return rc;
    if (order_start(err, sizeof err) != 0) {
        log_error("lock strategy %s: %s", config_lock_name(g_cfg.lock_strategy), err);
        sentinel_stop();
        return EXIT_CONFIG;
    }
    check_sync_replicas();

    conn_set_pg_init(store_prepare);
    {
        /* Every histogram has a bound at each timeout, so that calls cut by
         * one are told from slow ones; the request deadline too, when set. */
        const double timeouts[] = { g_cfg.redis_timeout_ms / 1000.0,
                                    g_cfg.pg_statement_timeout_ms / 1000.0,
                                    (double)g_cfg.pg_connect_timeout_s,
                                    g_cfg.request_deadline_ms / 1000.0 };   /* 0: none */
        rec_set_buckets(timeouts, (int)(sizeof timeouts / sizeof timeouts[0]));
    }

    /* Block the signals in every thread; main alone takes them with sigwait. */
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* Started in this order, stopped in the reverse one. */
    rc = 1;
    if (peers_start() != 0) {
        log_error("cannot start the stats publisher thread");
        goto out_order;
    }
    lock_options lo = {
        .connect = conn_redis_open,
        .command_timeout_ms = g_cfg.redis_timeout_ms,
        .watchdog_timeout_ms = g_cfg.watchdog_timeout_ms,
        .observe = rec_redis_call,
        .stale = redis_stale,
        .sync_replicas = g_cfg.lock_sync_replicas,
        .sync_timeout_ms = g_cfg.lock_sync_timeout_ms,
        .token_ttl_ms = g_cfg.lock_token_ttl_ms,
    };
    if (lock_runtime_start(&lo) != 0) {
        log_error("cannot start the lock renewal thread");
        goto out_peers;
    }
    if (bcast_start() != 0) {
        log_error("cannot start the broadcast subscriber thread");
        goto out_lock;
    }
    if (stats_start() != 0) {
        log_error("cannot start the stats thread");
        goto out_bcast;
    }
    /* Only tokens that are clock readings have an age to sweep by: this
     * strategy's rows, never another lock service's sharing the table. */
    if (g_cfg.fence_horizon_ms > 0 && ulock_token_clock()) {
        if (ulock_fence_key_prefix(fence_prefix, sizeof fence_prefix) != 0) {
            log_error("the lock's fence key prefix does not fit in %zu bytes", sizeof fence_prefix);
            goto out_stats;
        }
        if (fence_start(g_cfg.fence_horizon_ms, fence_prefix) != 0)
            goto out_stats;
    }
    if (consumer_start() != 0) {
        log_error("cannot start the stream consumer thread");
        goto out_fence;
    }
    http_set_worker_init(warm_worker);
    if (http_start(handlers_routes, handlers_route_count) != 0)
        goto out_consumer;
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
        if (sigwait(&sigs, &sig) != 0)
            sig = SIGTERM;
    } while (sig == SIGHUP);
    {
        pthread_t second;
        if (pthread_create(&second, NULL, second_signal_main, &sigs) == 0)
            pthread_detach(second);
    }
    /* SIGINT (Ctrl-C; a restart with no traffic to protect) does not wait
     * for clients to close their idle connections. */
    drain_ms = sig == SIGINT ? 0 : g_cfg.shutdown_drain_ms;
    log_info("signal %d: draining (GET /ready answers 503, no new connections, open ones "
             "closed by their clients within %d ms), finishing requests in flight, then "
             "stopping; a second signal stops at once", sig, drain_ms);
    http_drain(drain_ms, SHUTDOWN_GRACE_MS);
    stats_stop();              /* answers what waits for a snapshot */
    http_stop();
    rc = EXIT_SUCCESS;
out_consumer:
    /* After the last request: what they admitted is persisted by this
     * consumer or, once idle long enough, claimed by another. */
    consumer_stop();
out_fence:
    fence_stop();              /* a no-op when not started */
out_stats:
    stats_stop();              /* a no-op once stopped */
out_bcast:
    bcast_stop();
out_lock:
    lock_runtime_stop();
out_peers:
    peers_stop();
out_order:
    order_stop();
    sentinel_stop();
    if (rc == EXIT_SUCCESS)
        log_info("stopped");
    return rc;
}
