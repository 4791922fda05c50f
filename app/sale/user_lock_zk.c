/* user_lock_zk: the "zk" strategy, ZooKeeper's lock recipe (zk_lock.h).
 *
 * One ZooKeeper session for the whole process, opened at start and shared
 * by every worker: the C client is multi-threaded (its own I/O thread
 * multiplexes every worker's calls on one socket), and each session costs
 * the ensemble a heartbeat and an entry in its session tracker, so one per
 * process rather than one per worker. Each request's hold is a node
 * <root>/lock:order:<user>/<session>-<attempt>-<sequence>; the sale makes
 * one attempt, so a node that is not the first means busy (the node is
 * deleted at once). The fencing token is the node's czxid.
 *
 * The session ends: its nodes are deleted by the server (after the session
 * timeout when this process died, at once on a clean close); a hold taken
 * in it is lost, and a write made after that carries a token lower than the
 * next holder's, which the fence refuses. While the session is
 * disconnected, attempts fail at once with 503 rather than queue. */
#include "user_lock.h"
#include "config.h"
#include "log.h"
#include "counters.h"
#include "zk_lock.h"

#include <stdio.h>

#define ZK_ROOT "/seckill/locks"
#define UNAVAILABLE "lock service (zookeeper) unavailable, retry later"

/* Opened by 'start' before any worker runs; read-only after. */
static zk_lock_client *zk;

static int zk_start(char *err, size_t errlen)
{
    char why[512];

    zk = zk_lock_open(g_cfg.zk_hosts, ZK_ROOT, g_cfg.zk_session_timeout_ms,
                  g_cfg.zk_session_timeout_ms, why, sizeof why);
    if (zk == NULL) {
        snprintf(err, errlen, "ZK_HOSTS=%s: %s", g_cfg.zk_hosts, why);
        return -1;
    }
    log_info("zookeeper: session 0x%llx on %s, timeout %d ms (asked %d)",
             (unsigned long long)zk_lock_session_id(zk), g_cfg.zk_hosts, zk_lock_session_timeout(zk),
             g_cfg.zk_session_timeout_ms);
    return 0;
}

static void zk_stop(void)
{
    zk_lock_close(zk);                 /* a clean close: the server deletes our nodes at once */
    zk = NULL;
}

static lock_status zk_acquire(conn_set *cs, user_lock_hold *h, user_lock_id *id)
{
    zk_lock_grant g;
    lock_status st;

    (void)cs;
    (void)id;
    st = counters_lock_attempt(zk_lock_acquire(zk, h->key, h->owner, 0, &g));
    if (st == LOCK_OK)
        h->token = g.token;
    return st;
}

static void zk_release(conn_set *cs, user_lock_hold *h)
{
    (void)cs;
    switch (zk_lock_release(zk, h->key, h->owner, NULL)) {
    case LOCK_OK:
        counters_note(COUNTERS_DEMO_LOCK_RELEASED);
        break;
    case LOCK_NOT_OWNER:
        counters_note(COUNTERS_DEMO_LOCK_NOT_OWNER);
        log_warn("zookeeper: %s is not held by %s", h->key, h->owner);
        break;
    case LOCK_LOST:
        counters_note(COUNTERS_DEMO_LOCK_NOT_OWNER);
        log_warn("zookeeper: %s was lost with its session during the order", h->key);
        break;
    default:                       /* deleted later by zk_lock, or with the session */
        log_warn("zookeeper: the release of %s failed: retried at a later call", h->key);
        break;
    }
}

const user_lock_backend user_lock_zk = {
    .name = "zk",
    .tokens = 1,
    .unavailable = UNAVAILABLE,
    .fence_prefix = "zk:",
    .start = zk_start,
    .stop = zk_stop,
    .acquire = zk_acquire,
    .release = zk_release,
};
