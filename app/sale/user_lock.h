/* user_lock: the sale's per-user lock "lock:order:<user id>", one small
 * interface for every strategy (SECKILL_LOCK). The sale takes, releases
 * and reads fencing tokens only through here; each strategy is one module
 * behind it:
 *
 *   user_lock_redisson.c  reentrant: the lock library's Redisson-compatible
 *                     lock (lock.h), the safe default
 *   user_lock_demo.c      none, local, setnx, owner: the demo ladder's broken
 *                     steps, which the default never reaches
 *   user_lock_zk.c        zk: ZooKeeper's lock recipe (zk_lock.h)
 *   user_lock_pg.c        pg-table and pg-advisory: a lock table and advisory
 *                     locks in Postgres (pg_lock.h)
 *   user_lock_multi.c     multilock and redlock: one lock over several
 *                     independent Redis masters (multi_lock.h)
 *
 * A strategy is a user_lock_backend: acquire one attempt with the configured
 * lease, release once after the transaction, and optionally both for a
 * whole group commit in one round trip. What a backend needs beyond that
 * (connections of its own, nodes, a session) it sets up in 'start' and
 * keeps to itself; per hold it has USER_LOCK_PRIV_BYTES of private state. So a
 * further backend is one more module and one more entry in user_lock.c's table;
 * the sale does not change. For instance: several independent Redis masters
 * (MultiLock, RedLock) keep their connections in the module and the nodes
 * that granted a hold in 'priv'; a ZooKeeper recipe opens its session in
 * 'start' and keeps the hold's node path in 'priv', its sequence number as
 * the token; a Postgres advisory lock, held by the worker's own session
 * (cs->pg, checked by the caller), is 'thread_bound', so the sale releases
 * it on that worker; a grant that must reach replicas before it counts
 * sends WAIT inside 'acquire' and undoes the grant when too few answer. */
#ifndef SECKILL_USER_LOCK_H
#define SECKILL_USER_LOCK_H

#include <stddef.h>
#include <stdint.h>

#include "conn.h"
#include "order_id.h"
#include "lock_status.h"

#define USER_LOCK_KEY_PREFIX "lock:order:"

/* An attempt's outcome (lock_status.h), one of three whatever the
 * backend:
 *   LOCK_OK    held
 *   LOCK_BUSY  another owner holds it: a concurrent request of this user
 *   LOCK_ERR   the lock's service failed or is unreachable: answer 503 */

/* Where a hold stands. Only user_lock.c moves it. */
typedef enum user_lock_state {
    USER_LOCK_FREE = 0,   /* not taken (never, or the attempt failed) */
    USER_LOCK_HELD,       /* taken, to be released */
    USER_LOCK_RELEASED    /* released, or given up to its lease */
} user_lock_state;

/* An order id asked for in the lock's round trip: a backend that talks to
 * the worker's Redis (where the ids come from) takes it with the lock and
 * sets 'taken'; other backends leave it, and the sale takes the id itself. */
typedef struct user_lock_id {
    int taken;        /* 1: 'st' and 'value' are the id's outcome */
    order_id_status st;
    int64_t value;
} user_lock_id;

#define USER_LOCK_PRIV_BYTES 128

/* One hold of one user's lock, from the attempt to the release. Owned by
 * the sale; the backend that took it may use 'priv'. */
typedef struct user_lock_hold {
    char key[64];             /* USER_LOCK_KEY_PREFIX "<user id>" */
    char owner[128];          /* "<instance uuid>:<n>": a worker thread's id, or a request's own */
    int64_t user_id;
    long lease_ms;            /* LOCK_LEASE_MS; -1: renewed by a watchdog */
    user_lock_state state;
    lock_status taken;        /* the last attempt's outcome */
    int64_t token;            /* fencing token of the grant (user_lock_tokens()) */
    char fence_key[80];       /* the fence's row for this lock: the backend's
                                 fence_prefix, then 'key' (tokens of two services
                                 are not comparable, so each has its own rows) */
    _Alignas(16) unsigned char priv[USER_LOCK_PRIV_BYTES];
} user_lock_hold;

/* A strategy. Every call gets the calling worker's connection set. */
typedef struct user_lock_backend {
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
                                 service's (user_lock_hold.fence_key) */
    /* Process start and end (may be NULL): open what the backend keeps for
     * itself, check its configuration. 'start' returns 0, or -1 with the
     * reason in 'err' (the server then refuses to start). */
    int (*start)(char *err, size_t errlen);
    void (*stop)(void);
    /* One attempt, not waiting, with h->lease_ms. The caller has just
     * checked cs->redis and cs->pg (conn_redis, conn_pg). Fills h->token on
     * a grant; may take 'id' (not NULL) in the same round trip. */
    lock_status (*acquire)(conn_set *cs, user_lock_hold *h, user_lock_id *id);
    /* Releases a held hold, with whatever retries the backend allows; a
     * hold it cannot release is left to its lease. cs->redis may be NULL
     * (it broke meanwhile). */
    void (*release)(conn_set *cs, user_lock_hold *h);
    /* Group commit (both NULL when not offered): a batch's leader takes
     * 'n' holds and their ids in one round trip (outcomes in h[i]->taken,
     * tokens in h[i]->token, ids in id[i]), and after its commit releases
     * them in one more, setting done[i] = 1 for each release that needs no
     * retry (0: the hold's own release retries it later). */
    void (*acquire_many)(conn_set *cs, user_lock_hold *const *h, user_lock_id *id, size_t n);
    void (*release_many)(conn_set *cs, user_lock_hold *const *h, size_t n, unsigned char *done);
} user_lock_backend;

/* Picks the strategy (enum lock_strategy) and starts it. Call once before
 * serving. Returns 0, or -1 with the reason in 'err'. */
int user_lock_start(int strategy, char *err, size_t errlen);
void user_lock_stop(void);

/* Properties of the strategy in force. */
int user_lock_tokens(void);
int user_lock_token_clock(void);
/* The start shared by the strategy's keys in tb_lock_fence (its fence
 * prefix, then USER_LOCK_KEY_PREFIX): what its sweep may touch. 0, or -1 when
 * it does not fit in 'n' (a cut prefix would widen the sweep). */
int user_lock_fence_key_prefix(char *buf, size_t n);
int user_lock_thread_bound(void);
int user_lock_batchable(void);
const char *user_lock_unavailable(void);

/* A hold of user 'user_id''s lock for 'owner' (copied), not taken. */
void user_lock_hold_init(user_lock_hold *h, int64_t user_id, const char *owner);

/* One attempt (see user_lock_backend.acquire); 'id' may be NULL. */
lock_status user_lock_acquire(conn_set *cs, user_lock_hold *h, user_lock_id *id);

/* Releases 'h' if it is held; after the call it is not (released, or left
 * to its lease). Idempotent: a hold that is free or released is left
 * alone, so every path may end with it. */
void user_lock_release(conn_set *cs, user_lock_hold *h);

/* For a batch's leader (user_lock_batchable()): user_lock_acquire of 'n' holds
 * with their ids in one round trip; user_lock_release of those held in one
 * more, leaving held only those whose release must be retried by
 * user_lock_release. */
void user_lock_acquire_many(conn_set *cs, user_lock_hold *const *h, user_lock_id *id, size_t n);
void user_lock_release_many(conn_set *cs, user_lock_hold *const *h, size_t n);

/* The strategies (their modules). */
extern const user_lock_backend user_lock_reentrant;
extern const user_lock_backend user_lock_none, user_lock_local, user_lock_setnx, user_lock_owner;
extern const user_lock_backend user_lock_zk;
extern const user_lock_backend user_lock_pg_table, user_lock_pg_advisory;
extern const user_lock_backend user_lock_multilock, user_lock_redlock;

#endif
