/* ulock: the sale's per-user lock "lock:order:<user id>", one small
 * interface for every strategy (SECKILL_LOCK). The sale takes, releases
 * and reads fencing tokens only through here; each strategy is one module
 * behind it:
 *
 *   ulock_redisson.c  reentrant: the lock library's Redisson-compatible
 *                     lock (lock.h), the safe default
 *   ulock_demo.c      none, local, setnx, owner: the demo ladder's broken
 *                     steps, which the default never reaches
 *   ulock_zk.c        zk: ZooKeeper's lock recipe (zkl.h)
 *   ulock_pg.c        pg-table and pg-advisory: a lock table and advisory
 *                     locks in Postgres (pgl.h)
 *   ulock_multi.c     multilock and redlock: one lock over several
 *                     independent Redis masters (mlock.h)
 *
 * A strategy is a ulock_backend: acquire one attempt with the configured
 * lease, release once after the transaction, and optionally both for a
 * whole group commit in one round trip. What a backend needs beyond that
 * (connections of its own, nodes, a session) it sets up in 'start' and
 * keeps to itself; per hold it has ULOCK_PRIV_BYTES of private state. So a
 * further backend is one more module and one more entry in ulock.c's table;
 * the sale does not change. For instance: several independent Redis masters
 * (MultiLock, RedLock) keep their connections in the module and the nodes
 * that granted a hold in 'priv'; a ZooKeeper recipe opens its session in
 * 'start' and keeps the hold's node path in 'priv', its sequence number as
 * the token; a Postgres advisory lock, held by the worker's own session
 * (cs->pg, checked by the caller), is 'thread_bound', so the sale releases
 * it on that worker; a grant that must reach replicas before it counts
 * sends WAIT inside 'acquire' and undoes the grant when too few answer. */
#ifndef SECKILL_ULOCK_H
#define SECKILL_ULOCK_H

#include <stddef.h>
#include <stdint.h>

#include "conn.h"
#include "idw.h"
#include "lock_status.h"

#define ULOCK_KEY_PREFIX "lock:order:"

/* An attempt's outcome (lock_status.h), one of three whatever the
 * backend:
 *   LOCK_OK    held
 *   LOCK_BUSY  another owner holds it: a concurrent request of this user
 *   LOCK_ERR   the lock's service failed or is unreachable: answer 503 */

/* Where a hold stands. Only ulock.c moves it. */
typedef enum ulock_state {
    ULOCK_FREE = 0,   /* not taken (never, or the attempt failed) */
    ULOCK_HELD,       /* taken, to be released */
    ULOCK_RELEASED    /* released, or given up to its lease */
} ulock_state;

/* An order id asked for in the lock's round trip: a backend that talks to
 * the worker's Redis (where the ids come from) takes it with the lock and
 * sets 'taken'; other backends leave it, and the sale takes the id itself. */
typedef struct ulock_id {
    int taken;        /* 1: 'st' and 'value' are the id's outcome */
    idw_status st;
    int64_t value;
} ulock_id;

#define ULOCK_PRIV_BYTES 128

/* One hold of one user's lock, from the attempt to the release. Owned by
 * the sale; the backend that took it may use 'priv'. */
typedef struct ulock_hold {
    char key[64];             /* ULOCK_KEY_PREFIX "<user id>" */
    char owner[128];          /* "<instance uuid>:<n>": a worker thread's id, or a request's own */
    int64_t user_id;
    long lease_ms;            /* LOCK_LEASE_MS; -1: renewed by a watchdog */
    ulock_state state;
    lock_status taken;        /* the last attempt's outcome */
    int64_t token;            /* fencing token of the grant (ulock_tokens()) */
    char fence_key[80];       /* the fence's row for this lock: the backend's
                                 fence_prefix, then 'key' (tokens of two services
                                 are not comparable, so each has its own rows) */
    _Alignas(16) unsigned char priv[ULOCK_PRIV_BYTES];
} ulock_hold;

/* A strategy. Every call gets the calling worker's connection set. */
typedef struct ulock_backend {
    const char *name;         /* its SECKILL_LOCK value */
    int tokens;               /* grants carry a fencing token, strictly increasing per key */
    /* ... and each token is at least the lock service's clock at the
     * grant, in Unix microseconds: the fence may then refuse tokens older
     * than FENCE_HORIZON_MS and forget rows older than twice that. A
     * backend whose tokens are plain counters (a ZooKeeper sequence
     * number) leaves it 0: its writes have no horizon and nothing sweeps. */
    int token_clock;
    int thread_bound;         /* a hold may be released only by the thread that took it */
    const char *unavailable;  /* the 503's message when its service fails */
    const char *fence_prefix; /* NULL or "" for Redis's tokens; "<name>:" for another
                                 service's (ulock_hold.fence_key) */
    /* Process start and end (may be NULL): open what the backend keeps for
     * itself, check its configuration. 'start' returns 0, or -1 with the
     * reason in 'err' (the server then refuses to start). */
    int (*start)(char *err, size_t errlen);
    void (*stop)(void);
    /* One attempt, not waiting, with h->lease_ms. The caller has just
     * checked cs->redis and cs->pg (conn_redis, conn_pg). Fills h->token on
     * a grant; may take 'id' (not NULL) in the same round trip. */
    lock_status (*acquire)(conn_set *cs, ulock_hold *h, ulock_id *id);
    /* Releases a held hold, with whatever retries the backend allows; a
     * hold it cannot release is left to its lease. cs->redis may be NULL
     * (it broke meanwhile). */
    void (*release)(conn_set *cs, ulock_hold *h);
    /* Group commit (both NULL when not offered): a batch's leader takes
     * 'n' holds and their ids in one round trip (outcomes in h[i]->taken,
     * tokens in h[i]->token, ids in id[i]), and after its commit releases
     * them in one more, setting done[i] = 1 for each release that needs no
     * retry (0: the hold's own release retries it later). */
    void (*acquire_many)(conn_set *cs, ulock_hold *const *h, ulock_id *id, size_t n);
    void (*release_many)(conn_set *cs, ulock_hold *const *h, size_t n, unsigned char *done);
} ulock_backend;

/* Picks the strategy (enum lock_strategy) and starts it. Call once before
 * serving. Returns 0, or -1 with the reason in 'err'. */
int ulock_start(int strategy, char *err, size_t errlen);
void ulock_stop(void);

/* Properties of the strategy in force. */
int ulock_tokens(void);
int ulock_token_clock(void);
/* The start shared by the strategy's keys in tb_lock_fence (its fence
 * prefix, then ULOCK_KEY_PREFIX): what its sweep may touch. 0, or -1 when
 * it does not fit in 'n' (a cut prefix would widen the sweep). */
int ulock_fence_key_prefix(char *buf, size_t n);
int ulock_thread_bound(void);
int ulock_batchable(void);
const char *ulock_unavailable(void);

/* A hold of user 'user_id''s lock for 'owner' (copied), not taken. */
void ulock_hold_init(ulock_hold *h, int64_t user_id, const char *owner);

/* One attempt (see ulock_backend.acquire); 'id' may be NULL. */
lock_status ulock_acquire(conn_set *cs, ulock_hold *h, ulock_id *id);

/* Releases 'h' if it is held; after the call it is not (released, or left
 * to its lease). Idempotent: a hold that is free or released is left
 * alone, so every path may end with it. */
void ulock_release(conn_set *cs, ulock_hold *h);

/* For a batch's leader (ulock_batchable()): ulock_acquire of 'n' holds
 * with their ids in one round trip; ulock_release of those held in one
 * more, leaving held only those whose release must be retried by
 * ulock_release. */
void ulock_acquire_many(conn_set *cs, ulock_hold *const *h, ulock_id *id, size_t n);
void ulock_release_many(conn_set *cs, ulock_hold *const *h, size_t n);

/* The strategies (their modules). */
extern const ulock_backend ulock_reentrant;
extern const ulock_backend ulock_none, ulock_local, ulock_setnx, ulock_owner;
extern const ulock_backend ulock_zk;
extern const ulock_backend ulock_pg_table, ulock_pg_advisory;
extern const ulock_backend ulock_multilock, ulock_redlock;

#endif
