/* user_lock_redisson: the "reentrant" strategy, the safe default. The lock
 * library's Redisson-compatible lock (lock.h) on the worker's own Redis
 * connection: a reentrant hash with a lease, a fencing token per grant,
 * and the order id's INCR in the same round trip as the attempt. */
#include "user_lock.h"
#include "config.h"
#include "lock.h"
#include "log.h"
#include "util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* What a hold keeps: its release request, whose id makes a retried
 * release idempotent. */
typedef struct priv {
    lock_release_req rq;
} priv;

_Static_assert(sizeof(priv) <= USER_LOCK_PRIV_BYTES, "user_lock_hold.priv too small");

static priv *priv_of(user_lock_hold *h)
{
    return (priv *)(void *)h->priv;
}

/* Orphans: locks whose acquire reply was lost (the connection failed after
 * the attempt was sent) may have been granted all the same, and the user
 * would be locked out for a whole lease. Each is released at the next
 * attempt of any worker, or at once on a fresh connection when one opens.
 * Shared by the workers: a batch's leader can leave a whole batch of them
 * and the next attempt comes on any worker. Their owners are never used
 * again (a request's own, or a worker's, renewed: owner_lost), so a
 * release repeated after another lost reply is harmless. */
#define ORPHANS_MAX 4096

typedef struct orphan {
    char key[64];
    char owner[128];
    long lease_ms;
} orphan;

static pthread_mutex_t orphans_mu = PTHREAD_MUTEX_INITIALIZER;
static orphan *orphans;                 /* orphans_mu */
static size_t norphans, orphans_cap;    /* orphans_mu */
static _Atomic size_t orphans_waiting;  /* norphans, for the attempts' fast path */

/* The sale's three outcomes (user_lock.h): a grant undone for want of
 * replicas (LOCK_UNSYNCED) is a failure of the lock's service. */
static lock_status status_of(lock_status st)
{
    return st == LOCK_OK || st == LOCK_BUSY ? st : LOCK_ERR;
}

static void orphan_add(const char *key, const char *owner, long lease_ms)
{
    pthread_mutex_lock(&orphans_mu);
    if (norphans == ORPHANS_MAX) {
        log_warn("%s: too many locks of unknown state waiting for release; left to its lease",
                 key);
    } else {
        if (norphans == orphans_cap) {
            orphans_cap = orphans_cap ? orphans_cap * 2 : 16;
            orphans = xrealloc(orphans, sizeof *orphans * orphans_cap);
        }
        snprintf(orphans[norphans].key, sizeof orphans[norphans].key, "%s", key);
        snprintf(orphans[norphans].owner, sizeof orphans[norphans].owner, "%s", owner);
        orphans[norphans].lease_ms = lease_ms;
        atomic_store(&orphans_waiting, ++norphans);
    }
    pthread_mutex_unlock(&orphans_mu);
}

/* Releases every orphan in one round trip on 'c'. 0, or -1 when Redis
 * failed (those whose release may not have run are kept). */
static int release_orphans(conn_set *cs, redisContext *c)
{
    lock_release_item *items;
    lock_release_req *rqs;
    orphan *list;
    size_t n;
    int rc = 0;

    if (atomic_load(&orphans_waiting) == 0)
        return 0;
    pthread_mutex_lock(&orphans_mu);
    list = orphans;
    n = norphans;
    orphans = NULL;
    norphans = orphans_cap = 0;
    atomic_store(&orphans_waiting, 0);
    pthread_mutex_unlock(&orphans_mu);
    if (n == 0)
        return 0;
    items = xmalloc(sizeof *items * n);
    rqs = xmalloc(sizeof *rqs * n);
    for (size_t i = 0; i < n; i++) {
        lock_release_req_init(&rqs[i]);
        items[i] = (lock_release_item){ .key = list[i].key, .owner = list[i].owner,
                                        .lease_ms = list[i].lease_ms, .rq = &rqs[i] };
    }
    lock_release_many(c, items, n);
    for (size_t i = 0; i < n; i++) {
        /* Not ours (LOCK_NOT_OWNER) is the usual answer: nothing was granted. */
        if (items[i].st == LOCK_OK)
            log_warn("released %s, granted after its reply was lost", items[i].key);
        else if (items[i].st == LOCK_ERR)
            orphan_add(list[i].key, list[i].owner, list[i].lease_ms);
    }
    if (c->err) {
        conn_redis_broken(cs);
        rc = -1;
    }
    free(rqs);
    free(items);
    free(list);
    return rc;
}

/* A reply about hold 'h' was lost: its lock may be held by its owner until
 * the lease ends. When that owner is the worker's own, the worker takes a
 * new one, or its next request of the same user would re-enter that hold
 * (and extend its lease) instead of being refused. */
static void owner_lost(conn_set *cs, const user_lock_hold *h)
{
    if (strcmp(h->owner, cs->owner) == 0)
        conn_renew_owner(cs);
}

/* After a lost reply, the connection just dropped: releases the orphans at
 * once if a fresh connection opens (not while the circuit breaker is
 * open); else the next attempt does. */
static void release_orphans_now(conn_set *cs)
{
    redisContext *c = conn_redis(cs);

    if (c != NULL)
        release_orphans(cs, c);
}

static void warn_expired(const user_lock_hold *h)
{
    log_warn("lock %s expired during the order (lease %ld ms too short?)", h->key, h->lease_ms);
}

/* With a Redis Cluster each lock key goes to the master of its slot
 * ({userId}: the user's), and the id counter's to its own: one attempt
 * or release on its key's master, a redirection followed (the command
 * sent again where the node said, or after a pause routed anew), up to
 * ORDER_ID_TRIES sends. A redirection means nothing ran, so sending again
 * is safe. 'release': NULL for an attempt. */
static lock_status cluster_lock_call(conn_set *cs, const user_lock_hold *h, lock_grant *g,
                                     lock_release_req *release)
{
    redisContext *c = conn_redis_key(cs, h->key);
    rcluster_redirect rd;
    lock_status st = LOCK_ERR;

    for (int tries = 1; c != NULL; tries++) {
        st = release != NULL ? lock_release_ex(c, h->key, h->owner, h->lease_ms, release, NULL)
                             : lock_try_acquire(c, h->key, h->owner, h->lease_ms, g);
        if (st != LOCK_MOVED || !lock_last_redirect(&rd) || tries == ORDER_ID_TRIES)
            break;
        c = conn_redis_resend(cs, &rd, h->key, tries);
    }
    return st;
}

/* Cluster: the orphans, each on its own key's master. */
static int release_orphans_cluster(conn_set *cs)
{
    orphan *list;
    size_t n;
    int rc = 0;

    pthread_mutex_lock(&orphans_mu);
    list = orphans;
    n = norphans;
    orphans = NULL;
    norphans = orphans_cap = 0;
    atomic_store(&orphans_waiting, 0);
    pthread_mutex_unlock(&orphans_mu);
    for (size_t i = 0; i < n; i++) {
        user_lock_hold h = { .lease_ms = list[i].lease_ms };
        lock_release_req rq;
        lock_status st;

        snprintf(h.key, sizeof h.key, "%s", list[i].key);
        snprintf(h.owner, sizeof h.owner, "%s", list[i].owner);
        lock_release_req_init(&rq);
        st = rc == 0 ? cluster_lock_call(cs, &h, NULL, &rq) : LOCK_ERR;
        if (st == LOCK_OK)
            log_warn("released %s, granted after its reply was lost", h.key);
        else if (st != LOCK_NOT_OWNER)
            orphan_add(list[i].key, list[i].owner, list[i].lease_ms);
        /* A master that failed (or cannot be reached): the rest wait for
         * the next attempt, not a connect timeout each. */
        if (rc == 0 && st != LOCK_OK && st != LOCK_NOT_OWNER) {
            if (cs->redis != NULL && cs->redis->err)
                conn_redis_broken(cs);
            rc = -1;
        }
    }
    free(list);
    return rc;
}

/* Cluster: the id, then the attempt, each on its key's master (two round
 * trips: the two keys' slots differ but by chance). */
static lock_status acquire_cluster(conn_set *cs, user_lock_hold *h, user_lock_id *id)
{
    lock_grant g = { -1, -1 };
    lock_status st;

    if (atomic_load(&orphans_waiting) != 0 && release_orphans_cluster(cs) != 0)
        return LOCK_ERR;
    lock_release_req_init(&priv_of(h)->rq);
    if (id != NULL) {
        id->st = order_id_take(cs, g_cfg.id_prefix, &id->value);
        id->taken = 1;
        if (id->st != ORDER_ID_OK)
            return LOCK_ERR;
    }
    st = cluster_lock_call(cs, h, &g, NULL);
    if (st == LOCK_OK)
        h->token = g.token;
    if (st == LOCK_ERR && cs->redis != NULL && cs->redis->err) {
        orphan_add(h->key, h->owner, h->lease_ms);
        owner_lost(cs, h);
        conn_redis_broken(cs);
        release_orphans_cluster(cs);
    } else if (cs->redis != NULL && cs->redis->err) {
        conn_redis_broken(cs);
    }
    return status_of(st);
}

/* Cluster: the release on its key's master; a lost reply retried once on
 * a fresh connection with the same request (idempotent). */
static void release_cluster(conn_set *cs, user_lock_hold *h)
{
    lock_release_req *rq = &priv_of(h)->rq;
    lock_status ls = cluster_lock_call(cs, h, NULL, rq);

    if (ls == LOCK_ERR && cs->redis != NULL && cs->redis->err) {
        conn_redis_broken(cs);
        ls = cluster_lock_call(cs, h, NULL, rq);
    }
    if (ls != LOCK_OK && ls != LOCK_NOT_OWNER)
        owner_lost(cs, h);
    if (ls == LOCK_NOT_OWNER)
        warn_expired(h);
    if (cs->redis != NULL && cs->redis->err)
        conn_redis_broken(cs);
}

/* The attempt with the order id's INCR in the same round trip: INCR
 * first, so that the acquire is the last reply (its NOSCRIPT fallback
 * waits on the connection), then with LOCK_SYNC_REPLICAS the WAIT for the
 * replicas. A busy lock wastes an id; ids need not be dense. */
static lock_status take_with_id(redisContext *c, user_lock_hold *h, lock_grant *g, user_lock_id *id)
{
    order_id_op iop;
    lock_acquire_op aop;

    order_id_send(c, g_cfg.id_prefix, (int64_t)time(NULL), &iop);
    lock_acquire_send(c, &aop, h->key, h->owner, h->lease_ms);
    lock_sync_send(c, &aop, 1);
    id->st = order_id_recv(c, &iop, &id->value);
    id->taken = 1;
    return lock_acquire_recv(c, &aop, g);
}

static lock_status acquire(conn_set *cs, user_lock_hold *h, user_lock_id *id)
{
    redisContext *c = cs->redis;
    lock_grant g = { -1, -1 };
    lock_status st;

    if (conn_redis_cluster())
        return acquire_cluster(cs, h, id);
    if (release_orphans(cs, c) != 0)
        return LOCK_ERR;
    lock_release_req_init(&priv_of(h)->rq);
    st = id != NULL ? take_with_id(c, h, &g, id)
                    : lock_try_acquire(c, h->key, h->owner, h->lease_ms, &g);
    if (st == LOCK_OK)
        h->token = g.token;
    if (st == LOCK_ERR && c->err) {
        orphan_add(h->key, h->owner, h->lease_ms);
        owner_lost(cs, h);
        conn_redis_broken(cs);
        release_orphans_now(cs);
    } else if (c->err) {
        conn_redis_broken(cs);
    }
    return status_of(st);
}

/* A lost reply is retried on the worker's connection, then once on a
 * fresh one, with the same request id: the release is idempotent, so the
 * retry cannot free the lock twice nor report "not owner" for our own
 * first release (or for the batch leader's). */
static void release(conn_set *cs, user_lock_hold *h)
{
    redisContext *c;
    lock_release_req *rq = &priv_of(h)->rq;
    lock_status ls;

    if (conn_redis_cluster()) {
        release_cluster(cs, h);
        return;
    }
    c = cs->redis != NULL ? cs->redis : conn_redis(cs);    /* it broke meanwhile */
    if (c == NULL) {                /* Redis unreachable: the lease frees it */
        owner_lost(cs, h);
        return;
    }
    ls = lock_release_ex(c, h->key, h->owner, h->lease_ms, rq, NULL);
    if (ls == LOCK_ERR && c->err) {
        conn_redis_broken(cs);
        if ((c = conn_redis(cs)) == NULL) {
            owner_lost(cs, h);
            return;
        }
        ls = lock_release_ex(c, h->key, h->owner, h->lease_ms, rq, NULL);
    }
    if (ls == LOCK_ERR)
        owner_lost(cs, h);
    if (ls == LOCK_NOT_OWNER)
        warn_expired(h);
    if (c->err)
        conn_redis_broken(cs);
}

/* Cluster: the n ids of a batch in one pipeline on the counter's master;
 * one answered with a redirection is taken again alone (order_id_take
 * follows it). */
static void ids_many_cluster(conn_set *cs, user_lock_id *id, size_t n)
{
    int64_t now = (int64_t)time(NULL);
    size_t keylen = strlen(g_cfg.id_prefix) + 32, i;
    char *key = xmalloc(keylen);
    order_id_op *ops = xmalloc(sizeof *ops * n);
    redisContext *c;

    order_id_key(g_cfg.id_prefix, now, key, keylen);
    for (i = 0; i < n; i++) {
        id[i].st = ORDER_ID_REDIS;
        id[i].taken = 1;
    }
    if ((c = conn_redis_key(cs, key)) != NULL) {
        int broken;
        for (i = 0; i < n; i++)
            order_id_send(c, g_cfg.id_prefix, now, &ops[i]);
        for (i = 0; i < n; i++)
            id[i].st = order_id_recv(c, &ops[i], &id[i].value);
        /* c is not touched past this point: dropping it (or a call that
         * reads the map again) frees it. */
        if ((broken = c->err != 0))
            conn_redis_broken(cs);
        for (i = 0; i < n && !broken; i++)
            if (id[i].st == ORDER_ID_MOVED &&
                (id[i].st = order_id_take(cs, g_cfg.id_prefix, &id[i].value)) == ORDER_ID_REDIS)
                broken = 1;
    }
    free(ops);
    free(key);
}

/* A batch's outcome into its holds: each attempt's status, and the fencing
 * token of each lock taken. */
static void holds_settle(user_lock_hold *const *h, const lock_status *st, const lock_grant *g,
                         size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h[i]->taken = status_of(st[i]);
        if (st[i] == LOCK_OK)
            h[i]->token = g[i].token;
    }
}

/* Cluster: the next group of a batch's holds h[0..n-1] not yet grouped
 * whose keys share a master (in the map as just read), from *at on: their
 * positions into idx, their count into *m, each marked in 'grouped'; and
 * the connection to that master. NULL when none is left or that master is
 * unreachable (the rest stay ungrouped). */
static redisContext *next_master_group(conn_set *cs, user_lock_hold *const *h, size_t n,
                                       unsigned char *grouped, size_t *at, size_t *idx, size_t *m)
{
    redisContext *c;
    int node;

    while (*at < n && grouped[*at])
        (*at)++;
    if (*at == n || (c = conn_redis_key(cs, h[*at]->key)) == NULL)
        return NULL;
    node = rcluster_slot_node(cs->cluster, rcluster_keyslot(h[*at]->key, strlen(h[*at]->key)));
    *m = 0;
    for (size_t j = *at; j < n; j++)
        if (!grouped[j] &&
            rcluster_slot_node(cs->cluster, rcluster_keyslot(h[j]->key, strlen(h[j]->key))) == node) {
            idx[(*m)++] = j;
            grouped[j] = 1;
        }
    return c;
}

/* Cluster: a batch's ids, then its attempts one master at a time, each
 * master's in one pipeline with one WAIT; an attempt redirected (a slot
 * that moved since the map was read) is taken again alone. */
static void acquire_many_cluster(conn_set *cs, user_lock_hold *const *h, user_lock_id *id,
                                 size_t n)
{
    lock_acquire_op *ops = xmalloc(sizeof *ops * n);
    lock_grant *g = xmalloc(sizeof *g * n), *gg = xmalloc(sizeof *gg * n);
    lock_status *st = xmalloc(sizeof *st * n), *gs = xmalloc(sizeof *gs * n);
    rcluster_redirect *rd = xmalloc(sizeof *rd * n);
    size_t *idx = xmalloc(sizeof *idx * n), i, at = 0, m;
    unsigned char *grouped = xcalloc(n, 1);
    redisContext *c;
    int failed = 0;

    for (i = 0; i < n; i++) {
        lock_release_req_init(&priv_of(h[i])->rq);
        st[i] = LOCK_ERR;
        g[i] = (lock_grant){ -1, -1 };
    }
    if (atomic_load(&orphans_waiting) != 0 && release_orphans_cluster(cs) != 0)
        failed = 1;
    if (!failed)
        ids_many_cluster(cs, id, n);
    while (!failed && (c = next_master_group(cs, h, n, grouped, &at, idx, &m)) != NULL) {
        for (size_t k = 0; k < m; k++)
            lock_acquire_send(c, &ops[k], h[idx[k]]->key, h[idx[k]]->owner, h[idx[k]]->lease_ms);
        lock_sync_send(c, ops, m);
        lock_acquire_recv_many(c, ops, m, gg, gs);
        for (size_t k = 0; k < m; k++) {
            st[idx[k]] = gs[k];
            g[idx[k]] = gg[k];
            if (gs[k] == LOCK_MOVED) {
                rd[idx[k]] = ops[k].redirect;
                /* ":port" names the node that answered: this one. */
                if (rd[idx[k]].host[0] == '\0' && c->connection_type == REDIS_CONN_TCP)
                    snprintf(rd[idx[k]].host, sizeof rd[idx[k]].host, "%s", c->tcp.host);
            }
            /* No answer may hide a grant. */
            if (gs[k] == LOCK_ERR && c->err) {
                orphan_add(h[idx[k]]->key, h[idx[k]]->owner, h[idx[k]]->lease_ms);
                owner_lost(cs, h[idx[k]]);
            }
        }
        if (c->err) {
            conn_redis_broken(cs);
            release_orphans_cluster(cs);
            failed = 1;
        }
    }
    /* Redirected (the slot moved since the map was read): sent again where
     * the node said, then routed anew if need be. */
    for (i = 0; i < n && !failed; i++) {
        if (st[i] != LOCK_MOVED)
            continue;
        if ((c = conn_redis_redirected(cs, &rd[i])) != NULL)
            st[i] = lock_try_acquire(c, h[i]->key, h[i]->owner, h[i]->lease_ms, &g[i]);
        if (st[i] == LOCK_MOVED || c == NULL)
            st[i] = cluster_lock_call(cs, h[i], &g[i], NULL);
        if (cs->redis != NULL && cs->redis->err) {
            if (st[i] == LOCK_ERR) {
                orphan_add(h[i]->key, h[i]->owner, h[i]->lease_ms);
                owner_lost(cs, h[i]);
            }
            conn_redis_broken(cs);
            failed = 1;
        }
    }
    holds_settle(h, st, g, n);
    free(grouped);
    free(idx);
    free(rd);
    free(gs);
    free(st);
    free(gg);
    free(g);
    free(ops);
}

/* Cluster: a settled batch's releases, one master at a time, each in one
 * pipeline. One not done (redirected, or its master unreachable) is left
 * to the hold's own release, which follows redirections. */
static void release_many_cluster(conn_set *cs, user_lock_hold *const *h, size_t n,
                                 unsigned char *done)
{
    lock_release_item *items = xmalloc(sizeof *items * n);
    size_t *idx = xmalloc(sizeof *idx * n), at = 0, m;
    unsigned char *grouped = xcalloc(n, 1);
    redisContext *c;

    while ((c = next_master_group(cs, h, n, grouped, &at, idx, &m)) != NULL) {
        for (size_t k = 0; k < m; k++) {
            user_lock_hold *x = h[idx[k]];
            items[k] = (lock_release_item){ .key = x->key, .owner = x->owner,
                                            .lease_ms = x->lease_ms, .rq = &priv_of(x)->rq };
        }
        lock_release_many(c, items, m);
        for (size_t k = 0; k < m; k++) {
            done[idx[k]] = items[k].st == LOCK_OK || items[k].st == LOCK_NOT_OWNER;
            if (items[k].st == LOCK_NOT_OWNER)
                warn_expired(h[idx[k]]);
        }
        if (c->err) {
            conn_redis_broken(cs);
            break;
        }
    }
    free(grouped);
    free(idx);
    free(items);
}

/* One Redis: every INCR, then every acquire, in one round trip on the
 * leader's connection. */
static void acquire_many_one(conn_set *cs, user_lock_hold *const *h, user_lock_id *id, size_t n)
{
    lock_acquire_op *ops = xmalloc(sizeof *ops * n);
    order_id_op *iops = xmalloc(sizeof *iops * n);
    lock_grant *g = xmalloc(sizeof *g * n);
    lock_status *st = xmalloc(sizeof *st * n);
    int64_t now = (int64_t)time(NULL);
    redisContext *c = conn_redis(cs);
    size_t i;

    for (i = 0; i < n; i++) {
        lock_release_req_init(&priv_of(h[i])->rq);
        st[i] = LOCK_ERR;
    }
    if (c != NULL && release_orphans(cs, c) != 0)
        c = NULL;
    if (c != NULL) {
        for (i = 0; i < n; i++)
            order_id_send(c, g_cfg.id_prefix, now, &iops[i]);
        for (i = 0; i < n; i++)
            lock_acquire_send(c, &ops[i], h[i]->key, h[i]->owner, h[i]->lease_ms);
        lock_sync_send(c, ops, n);
        for (i = 0; i < n; i++) {
            id[i].st = order_id_recv(c, &iops[i], &id[i].value);
            id[i].taken = 1;
        }
        lock_acquire_recv_many(c, ops, n, g, st);
        if (c->err) {
            /* Every attempt without an answer may have been granted. */
            for (i = 0; i < n; i++) {
                if (st[i] == LOCK_ERR) {
                    orphan_add(h[i]->key, h[i]->owner, h[i]->lease_ms);
                    owner_lost(cs, h[i]);
                }
            }
            conn_redis_broken(cs);
            release_orphans_now(cs);
        }
    }
    holds_settle(h, st, g, n);
    free(st);
    free(g);
    free(iops);
    free(ops);
}

static void acquire_many(conn_set *cs, user_lock_hold *const *h, user_lock_id *id, size_t n)
{
    if (conn_redis_cluster())
        acquire_many_cluster(cs, h, id, n);
    else
        acquire_many_one(cs, h, id, n);
}

/* After a batch's commit, in one round trip on the leader's connection.
 * A failure leaves each hold's own release to retry it. */
static void release_many(conn_set *cs, user_lock_hold *const *h, size_t n, unsigned char *done)
{
    lock_release_item *items;
    redisContext *c;

    if (conn_redis_cluster()) {
        release_many_cluster(cs, h, n, done);
        return;
    }
    if ((c = conn_redis(cs)) == NULL)
        return;
    items = xmalloc(sizeof *items * n);
    for (size_t i = 0; i < n; i++)
        items[i] = (lock_release_item){ .key = h[i]->key, .owner = h[i]->owner,
                                        .lease_ms = h[i]->lease_ms, .rq = &priv_of(h[i])->rq };
    lock_release_many(c, items, n);
    for (size_t i = 0; i < n; i++) {
        done[i] = items[i].st != LOCK_ERR;
        if (items[i].st == LOCK_NOT_OWNER)
            warn_expired(h[i]);
    }
    if (c->err)
        conn_redis_broken(cs);
    free(items);
}

const user_lock_backend user_lock_reentrant = {
    .name = "reentrant",
    .tokens = 1,
    .token_clock = 1,         /* lua/lock_acquire.lua: max(counter + 1, Redis's clock in us) */
    .unavailable = "redis unavailable, retry later",
    .acquire = acquire,
    .release = release,
    .acquire_many = acquire_many,
    .release_many = release_many,
};
