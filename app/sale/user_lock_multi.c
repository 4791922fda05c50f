/* user_lock_multi: the "multilock" and "redlock" strategies, one lock over the
 * independent Redis masters of LOCK_REDIS_NODES (multi_lock.h): MultiLock needs
 * every node, RedLock a majority within the validity time.
 *
 * Each thread that takes or releases a hold has its own connections to the
 * nodes (hiredis contexts are not thread-safe), made at its first call and
 * kept in a list for the process so that 'stop' closes them all. The
 * nodes that did not answer "busy" are kept in the hold's 'priv' and the
 * release goes to them. No fencing token (multi_lock.h says why): a stale
 * holder's write is stopped only by the unique constraint. */
#include "user_lock.h"
#include "config.h"
#include "log.h"
#include "multi_lock.h"
#include "counters.h"
#include "redis_url.h"
#include "util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <netdb.h>
#include <string.h>

typedef struct priv {
    unsigned mask;           /* nodes to release on */
    unsigned reach;          /* of those, nodes that did not answer: asked at once */
} priv;

_Static_assert(sizeof(priv) <= USER_LOCK_PRIV_BYTES, "user_lock_hold.priv too small");

/* Set by 'start' before any worker runs; read-only after. */
static redis_url nodes[MULTI_LOCK_MAX_NODES];
static size_t nnodes;
static multi_lock_quorum quorum;

static pthread_mutex_t sets_mu = PTHREAD_MUTEX_INITIALIZER;
static multi_lock_set *sets[1024];           /* sets_mu: every thread's, for 'stop' */
static size_t nsets;                    /* sets_mu */
static _Thread_local multi_lock_set *my_set;

static multi_lock_set *thread_set(void)
{
    if (my_set != NULL)
        return my_set;
    pthread_mutex_lock(&sets_mu);
    if (nsets < sizeof sets / sizeof sets[0]) {
        my_set = multi_lock_set_new(nodes, nnodes, g_cfg.lock_redis_node_timeout_ms);
        sets[nsets++] = my_set;
    }
    pthread_mutex_unlock(&sets_mu);
    if (my_set == NULL)
        log_error("lock nodes: more than %zu threads", sizeof sets / sizeof sets[0]);
    return my_set;
}

/* Two entries name one server (one failure domain, whatever its db): the
 * same port and the same host name, or an address in common as the
 * resolver answers now (localhost and 127.0.0.1 are one). 'ra', 'rb': the
 * hosts' addresses (NULL: not resolved). */
static int same_server(const redis_url *a, const redis_url *b, const struct addrinfo *ra,
                       const struct addrinfo *rb)
{
    if (a->port != b->port)
        return 0;
    if (strcmp(a->host, b->host) == 0)
        return 1;
    for (const struct addrinfo *x = ra; x != NULL; x = x->ai_next)
        for (const struct addrinfo *y = rb; y != NULL; y = y->ai_next)
            if (x->ai_family == y->ai_family && x->ai_addrlen == y->ai_addrlen &&
                memcmp(x->ai_addr, y->ai_addr, x->ai_addrlen) == 0)
                return 1;
    return 0;
}

/* No server listed twice: each host resolved once (a name that does not
 * resolve is compared by name; the start's PING of each node says more). */
static int check_distinct(char *err, size_t errlen)
{
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
    struct addrinfo *res[MULTI_LOCK_MAX_NODES] = { NULL };
    int rc = 0;

    for (size_t i = 0; i < nnodes; i++)
        if (getaddrinfo(nodes[i].host, NULL, &hints, &res[i]) != 0)
            res[i] = NULL;
    for (size_t i = 1; i < nnodes && rc == 0; i++)
        for (size_t j = 0; j < i && rc == 0; j++)
            if (same_server(&nodes[j], &nodes[i], res[j], res[i])) {
                snprintf(err, errlen, "LOCK_REDIS_NODES: %s:%d is listed twice (as %s:%d: "
                         "it would count twice towards the quorum)", nodes[i].host,
                         nodes[i].port, nodes[j].host, nodes[j].port);
                rc = -1;
            }
    for (size_t i = 0; i < nnodes; i++)
        if (res[i] != NULL)
            freeaddrinfo(res[i]);
    return rc;
}

/* LOCK_REDIS_NODES: redis://host:port[,redis://host:port...], no node twice. */
static int parse_nodes(char *err, size_t errlen)
{
    util_list it;
    const char *p;
    size_t len;

    nnodes = 0;
    if (g_cfg.lock_redis_nodes[0] == '\0') {
        snprintf(err, errlen, "SECKILL_LOCK=%s needs LOCK_REDIS_NODES=redis://host:port,...",
                 config_lock_name(g_cfg.lock_strategy));
        return -1;
    }
    util_list_init(&it, g_cfg.lock_redis_nodes);
    while (util_list_next(&it, &p, &len)) {
        char one[512];
        redis_url u;
        if (len == 0 && it.last && nnodes > 0) {
            snprintf(err, errlen, "invalid LOCK_REDIS_NODES: trailing comma");
            return -1;
        }
        if (len == 0 || len >= sizeof one) {
            snprintf(err, errlen, "invalid LOCK_REDIS_NODES: an empty or too long entry");
            return -1;
        }
        memcpy(one, p, len);
        one[len] = '\0';
        if (redis_url_parse(one, &u) != 0) {
            snprintf(err, errlen, "invalid LOCK_REDIS_NODES entry '%s': expected "
                     "redis://[[user]:password@]host[:port][/db]", one);
            return -1;
        }
        if (nnodes == MULTI_LOCK_MAX_NODES) {
            snprintf(err, errlen, "LOCK_REDIS_NODES: more than %d nodes", MULTI_LOCK_MAX_NODES);
            return -1;
        }
        nodes[nnodes++] = u;
    }
    return check_distinct(err, errlen);
}

static int start(multi_lock_quorum q, size_t min_nodes, char *err, size_t errlen)
{
    multi_lock_set *probe;
    char why[512];
    const char *name = config_lock_name(g_cfg.lock_strategy);

    if (parse_nodes(err, errlen) != 0)
        return -1;
    if (nnodes < min_nodes) {
        snprintf(err, errlen, "SECKILL_LOCK=%s needs at least %zu nodes in LOCK_REDIS_NODES "
                 "(got %zu)", name, min_nodes, nnodes);
        return -1;
    }
    if (g_cfg.lock_lease_ms <= 0) {
        snprintf(err, errlen, "SECKILL_LOCK=%s needs a fixed lease (LOCK_LEASE_MS > 0), "
                 "not the watchdog", name);
        return -1;
    }
    if (g_cfg.lock_sync_replicas > 0) {
        /* WAIT would count replicas of independent masters, which have none */
        snprintf(err, errlen, "SECKILL_LOCK=%s: LOCK_SYNC_REPLICAS is for the single lock's "
                 "replicas; the nodes of LOCK_REDIS_NODES have none", name);
        return -1;
    }
    if ((long)g_cfg.lock_redis_node_timeout_ms * 10 > g_cfg.lock_lease_ms) {
        snprintf(err, errlen, "LOCK_REDIS_NODE_TIMEOUT_MS=%d must be at most a tenth of "
                 "LOCK_LEASE_MS=%ld", g_cfg.lock_redis_node_timeout_ms, g_cfg.lock_lease_ms);
        return -1;
    }
    probe = multi_lock_set_new(nodes, nnodes, g_cfg.lock_redis_node_timeout_ms);
    if (probe == NULL || multi_lock_check(probe, why, sizeof why) != 0) {
        snprintf(err, errlen, "LOCK_REDIS_NODES: %s", probe != NULL ? why : "no nodes");
        multi_lock_set_free(probe);
        return -1;
    }
    multi_lock_set_free(probe);
    quorum = q;
    log_info("%s: %zu Redis nodes, %zu needed, node timeout %d ms, lease %ld ms (drift %ld ms)",
             name, nnodes, multi_lock_needed(quorum, nnodes), g_cfg.lock_redis_node_timeout_ms,
             g_cfg.lock_lease_ms, multi_lock_drift_ms(g_cfg.lock_lease_ms));
    return 0;
}

static int multilock_start(char *err, size_t errlen)
{
    return start(MULTI_LOCK_ALL, 1, err, errlen);
}

static int redlock_start(char *err, size_t errlen)
{
    return start(MULTI_LOCK_MAJORITY, 3, err, errlen);
}

static void multi_stop(void)
{
    pthread_mutex_lock(&sets_mu);
    for (size_t i = 0; i < nsets; i++)
        multi_lock_set_free(sets[i]);
    nsets = 0;
    pthread_mutex_unlock(&sets_mu);
    my_set = NULL;
}

static lock_status multi_acquire(conn_set *cs, user_lock_hold *h, user_lock_id *id)
{
    multi_lock_set *s = thread_set();
    multi_lock_grant g;
    lock_status st;

    (void)cs;
    (void)id;
    if (s == NULL)
        return LOCK_ERR;
    st = counters_lock_attempt(multi_lock_acquire(s, quorum, h->key, h->owner, h->lease_ms, &g));
    if (st == LOCK_OK) {
        ((priv *)(void *)h->priv)->mask = ~g.busy;
        ((priv *)(void *)h->priv)->reach = g.unanswered;
        if (g.failed != 0)
            log_debug("%s: held without %d node(s), %lld ms of validity left", h->key,
                      __builtin_popcount(g.failed), (long long)g.validity_ms);
    }
    return st;
}

static void multi_release(conn_set *cs, user_lock_hold *h)
{
    multi_lock_set *s = thread_set();
    int not_owner = 0, released;

    (void)cs;
    if (s == NULL)
        return;
    released = multi_lock_release(s, h->key, h->owner, h->lease_ms,
                             ((priv *)(void *)h->priv)->mask,
                             ((priv *)(void *)h->priv)->reach, &not_owner);
    if (released > 0)
        counters_note(COUNTERS_DEMO_LOCK_RELEASED);
    if (not_owner > 0) {
        counters_note(COUNTERS_DEMO_LOCK_NOT_OWNER);
        log_warn("%s: %d node(s) no longer knew the hold (lease ended, or the node restarted)",
                 h->key, not_owner);
    }
}

/* The two strategies are one but for their name and their start, which
 * sets the quorum and the least number of nodes. */
#define MULTI_BACKEND(name_, start_)                                                            \
    {                                                                                           \
        .name = name_, .unavailable = "lock service (redis nodes) unavailable, retry later",    \
        .start = start_, .stop = multi_stop, .acquire = multi_acquire, .release = multi_release \
    }

const user_lock_backend user_lock_multilock = MULTI_BACKEND("multilock", multilock_start);
const user_lock_backend user_lock_redlock = MULTI_BACKEND("redlock", redlock_start);
