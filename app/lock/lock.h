/* lock: a Redisson-compatible reentrant lock on Redis.
 *
 * Layout: a hash at 'key' whose single field is the owner id
 * "<instance uuid>:<thread id>" and whose value is the hold count, with a
 * PEXPIRE lease. Release publishes "0" on "redisson_lock__channel:{<key>}".
 * Every grant also returns a fencing token kept in
 * "redisson_lock_token:{<key>}" (Redisson's RFencedLock key): the greater
 * of the counter + 1 and Redis's clock in microseconds, so that a counter
 * lost or brought back lower (restart from an older snapshot, failover to
 * a replica that lagged) still hands out tokens above every earlier one,
 * unless Redis's clock stepped back by more than the time since. Unlike
 * RFencedLock's, the counter may expire (lock_set_token_ttl).
 *
 * Lease: 'lease_ms' > 0 is a fixed lease, never renewed. LOCK_WATCHDOG (-1)
 * is watchdog mode: the lease is the watchdog timeout and the renewal
 * thread (lock_runtime_start) renews it every third of that until the final
 * release, or until the process dies. Release a hold with the same
 * 'lease_ms' it was taken with.
 *
 * Waiting (lock_try_lock) uses the process's one subscriber connection
 * (lock_wait.h), opened when something first waits.
 *
 * The lock library is lock, lock_wait, watchdog and script (with SHA-1): it
 * depends on hiredis and the two leaves util and log, nothing else of the
 * service. Connections passed in as 'c' belong to the caller; the library's
 * own threads open theirs with the caller's connect function. */
#ifndef SECKILL_LOCK_H
#define SECKILL_LOCK_H

#include <stddef.h>
#include <stdint.h>
#include <hiredis/hiredis.h>

#include "lock_status.h"
#include "rcluster.h"

/* Outcomes (lock_status.h): LOCK_OK, LOCK_BUSY, LOCK_NOT_OWNER (release),
 * LOCK_UNSYNCED (acquire, with replica acknowledgement on), LOCK_MOVED (a
 * Redis Cluster node that does not serve the key's slot answered: nothing
 * ran) and LOCK_ERR: Redis failed; on a NULL reply the context is
 * unusable. */

typedef struct lock_grant {
    int64_t token;        /* fencing token (LOCK_OK): strictly increasing per key, see above */
    int64_t ttl_ms;       /* holder's remaining lease (LOCK_BUSY), -1 if none */
} lock_grant;

#define LOCK_WATCHDOG (-1L)   /* lease_ms: watchdog mode */

/* What the library needs from its caller. */
typedef struct lock_options {
    /* Opens a new connection for one of the library's own threads (the
     * subscriber, the renewal thread), connected, authenticated, with its
     * timeouts set; NULL with the reason in 'err' when Redis is down. The
     * library frees it with redisFree. Required. */
    redisContext *(*connect)(char *err, size_t errlen);
    /* The caller's Redis command timeout (ms; 0: unknown): an acquire
     * carries a deadline this far ahead, so that Redis refuses it once the
     * caller has given up on the reply, and a release's result stays
     * readable for a retry 5 times as long (5 s at least). */
    int command_timeout_ms;
    /* Lease of watchdog-mode locks (ms); 0: 30000 (Redisson's default). */
    long watchdog_timeout_ms;
    /* Called after each Redis round trip of the library (may be NULL). */
    void (*observe)(int64_t latency_us, int ok);
    /* Optional: 1 when a connection the library's threads keep open (the
     * subscriber's, the renewal thread's) should be closed and opened
     * again with 'connect', e.g. because it leads to a Redis that a
     * failover has demoted. Checked every loop of those threads. */
    int (*stale)(const redisContext *c);
    /* Replica acknowledgement of grants: see lock_sync_set. */
    int sync_replicas;
    int sync_timeout_ms;
    /* lock_set_token_ttl's value (ms); 0: the counters never expire. */
    long token_ttl_ms;
    /* Redis Cluster seeds ("host:port,..."; NULL or empty: the one Redis of
     * 'connect'): the renewal thread then renews each hash slot's locks on
     * that slot's master. The subscriber still uses 'connect' (PUBLISH
     * reaches every node of a cluster). */
    const char *cluster_nodes;
} lock_options;

/* Configures the library and starts the renewal thread (watchdog); the
 * subscriber thread starts when something first waits. Call once after
 * script_load_all, before other threads use the library. Returns 0, or -1
 * (logged here: a start function logs its own failure). Without it the
 * library still locks and releases on the caller's connections, with no
 * deadline, no renewal and no waiting. */
int lock_runtime_start(const lock_options *o);

/* How long a key's token counter lives after Redis's clock has passed its
 * last token (ms); 0 (the default): it never expires, as Redisson's. Once
 * it expired the next token is the clock again, above every earlier token
 * as long as Redis's clock did not step back by more than 'ms' plus the
 * time since that token. Set before other threads use the library. */
void lock_set_token_ttl(long ms);

/* Stops both threads. Idempotent. Watchdog-mode locks still held are no
 * longer renewed and expire within one watchdog timeout; a later wait
 * works on the holder's TTL alone. */
void lock_runtime_stop(void);

/* A grant counts only once 'replicas' replicas acknowledged it: every
 * acquire attempt is followed by "WAIT replicas timeout_ms" (in the same
 * round trip where the caller pipelines it, lock_sync_send), as Redisson's
 * RLock does since redisson/redisson#2669. When fewer acknowledge within
 * the timeout the grant is undone (the release script, as the holder) and
 * the attempt returns LOCK_UNSYNCED: a failover to a replica that never
 * saw the grant cannot hand the same lock to a second holder. WAIT does
 * not make Redis strongly consistent (redis.io/commands/wait): the
 * acknowledging replica need not be the one promoted, and a replica that
 * acknowledged may lose the write in a crash of its own. 0 (the default):
 * no WAIT. Set by lock_runtime_start; call directly only while no lock
 * call runs (tests, benchmarks). The caller's socket read timeout must
 * exceed 'timeout_ms'. */
void lock_sync_set(int replicas, int timeout_ms);

/* One acquire attempt (no waiting). 'lease_ms' > 0 or LOCK_WATCHDOG.
 * On LOCK_OK fills g->token; on LOCK_BUSY fills g->ttl_ms. 'g' may be NULL.
 * Never retried: a lost reply may hide a grant, which then expires. */
lock_status lock_try_acquire(redisContext *c, const char *key, const char *owner,
                             long lease_ms, lock_grant *g);

/* The same attempt, pipelined behind other commands on 'c'.
 * lock_acquire_send appends it to c's output buffer (no I/O); after the
 * replies of the commands appended before it are read, lock_acquire_recv
 * sends what is buffered if need be and reads the attempt's reply. Call
 * recv exactly once after every send, whatever the send returned (it
 * releases the op's memory), and append nothing after the send but
 * lock_sync_send: a NOSCRIPT answer is re-sent and waited for. 'key' and
 * 'owner' are borrowed until recv returns. With replica acknowledgement on
 * (lock_sync_set), recv waits for it after a grant, with one more round
 * trip unless lock_sync_send put the WAIT in the same one. */
typedef struct lock_acquire_op {
    const char *key, *owner;
    char *token_key;
    char lease[24], deadline[24], token_ttl[24];
    const char *argv[6];
    long lease_ms;                 /* as given: > 0 or LOCK_WATCHDOG */
    int argc, watchdog, sent;
    int wait_follows;              /* a WAIT's reply follows this attempt's */
    int64_t t0;
    rcluster_redirect redirect;    /* after LOCK_MOVED: what the node answered */
} lock_acquire_op;

lock_status lock_acquire_send(redisContext *c, lock_acquire_op *op, const char *key,
                              const char *owner, long lease_ms);
lock_status lock_acquire_recv(redisContext *c, lock_acquire_op *op, lock_grant *g);

/* lock_acquire_send with the deadline 'timeout_ms' (> 0) ahead instead of
 * the caller's command timeout: for a connection with a shorter timeout of
 * its own (multi_lock's nodes), so that a late execution refuses. */
lock_status lock_acquire_send_within(redisContext *c, lock_acquire_op *op, const char *key,
                                     const char *owner, long lease_ms, int timeout_ms);

/* After lock_acquire_send of ops[0..n-1] (and nothing else after them):
 * appends one WAIT that covers them all, when replica acknowledgement is
 * on; a no-op otherwise. Then read them with lock_acquire_recv (n = 1) or
 * lock_acquire_recv_many. */
void lock_sync_send(redisContext *c, lock_acquire_op *ops, size_t n);

/* 'n' attempts in one round trip (a batch's buyers): lock_acquire_send for
 * each (then lock_sync_send), then this once, after every reply appended
 * before them is read. Outcomes go to st[i] and g[i] as for
 * lock_acquire_recv; an attempt answered NOSCRIPT is re-sent alone once
 * every reply is in. One WAIT covers the whole batch. */
void lock_acquire_recv_many(redisContext *c, lock_acquire_op *ops, size_t n, lock_grant *g,
                            lock_status *st);

/* Redisson's tryLock(waitTime, leaseTime): 'wait_ms' 0 is one attempt;
 * > 0 waits up to 'wait_ms' for the holder's release message, retrying
 * after each wake-up and at least once per holder TTL (no polling). After
 * a failed attempt the caller is subscribed first and only then retries,
 * so a release in between is never missed. Returns LOCK_OK, LOCK_BUSY when
 * the budget ran out, or LOCK_ERR (on a NULL reply c->err is set and 'c'
 * must be discarded). 'g' as for lock_try_acquire. */
lock_status lock_try_lock(redisContext *c, const char *key, const char *owner,
                          long wait_ms, long lease_ms, lock_grant *g);

/* A release request: one id per logical release, kept across retries. */
#define LOCK_REQUEST_ID_LEN 37
typedef struct lock_release_req {
    char id[LOCK_REQUEST_ID_LEN];   /* random UUID: the unlock latch's name */
    int renewal_cancelled;          /* internal: watchdog already told */
} lock_release_req;

/* A fresh request (new id). */
void lock_release_req_init(lock_release_req *rq);

/* Releases one hold, idempotently per 'rq': after LOCK_ERR (reply lost,
 * c->err set) call it again with the same 'rq' on a fresh connection; if
 * the first call did reach Redis (within the latch's lifetime, about
 * 5 x REDIS_TIMEOUT_MS and at least 5 s), the retry returns the first
 * result instead of releasing twice or reporting LOCK_NOT_OWNER.
 * '*remaining' (may be NULL) gets the hold count left: 0 means the key was
 * deleted and the release published. A release by a non-holder returns
 * LOCK_NOT_OWNER and changes nothing. 'lease_ms' is the lease the hold was
 * taken with; a still-held reentrant lock gets it back. */
lock_status lock_release_ex(redisContext *c, const char *key, const char *owner,
                            long lease_ms, lock_release_req *rq, long *remaining);

/* Several releases in one round trip (the buyers of a settled batch).
 * Each item as for lock_release_ex; its outcome goes to 'st'. After a lost
 * reply (LOCK_ERR with c->err set) retry an item with lock_release_ex and
 * the same request on a fresh connection. */
typedef struct lock_release_item {
    const char *key, *owner;
    long lease_ms;
    lock_release_req *rq;
    lock_status st;                  /* out */
} lock_release_item;

void lock_release_many(redisContext *c, lock_release_item *items, size_t n);

/* lock_release_ex with a fresh request: for callers that do not retry. */
lock_status lock_release(redisContext *c, const char *key, const char *owner,
                         long lease_ms, long *remaining);

/* After a call of this thread returned LOCK_MOVED (or a release item's
 * status was): the redirection its reply named, for rcluster_redirected.
 * 1, or 0 when no call of this thread met one since the last read. */
int lock_last_redirect(rcluster_redirect *out);

/* The pub/sub channel of a lock key: "redisson_lock__channel:{<key>}". */
void lock_channel_name(const char *key, char *buf, size_t n);

/* Process-wide counters (atomics), for /stats and /metrics. */
typedef struct lock_counters {
    uint64_t acquired;        /* grants, reentry included */
    uint64_t contended;       /* attempts refused because another owner held it */
    uint64_t released;        /* successful releases */
    uint64_t not_owner;       /* releases refused: not the holder (lease expired?) */
    uint64_t renewals;        /* watchdog lease renewals (one per key per tick) */
    uint64_t errors;          /* Redis failures inside lock calls */
    uint64_t waits;           /* lock_try_lock calls that had to wait */
    uint64_t wait_acquired;   /* ... and got the lock within their budget */
    uint64_t wait_timeouts;   /* ... and gave up: budget spent */
    uint64_t wait_us_sum;     /* time spent waiting by those that got it (us) */
    uint64_t wait_us_max;
    uint64_t wakeups;         /* waiters woken by an unlock message */
    uint64_t wake_samples;    /* grants right after such a wake-up ... */
    uint64_t wake_us_sum;     /* ... unlock message received -> lock granted (us) */
    uint64_t wake_us_max;
    uint64_t renew_lost;      /* watchdog locks dropped: owner field gone */
    uint64_t renew_errors;    /* renewal batches that failed (logged, retried next tick) */
    uint64_t subscriber_reconnects;  /* pub/sub connection re-opened after a failure */
    uint64_t unsynced;        /* grants undone: too few replicas acknowledged them */
    uint64_t sync_waits;      /* WAITs sent after grants */
} lock_counters;

void lock_counters_get(lock_counters *out);

/* Testing only: called at two points of lock_try_lock's wait, in the
 * waiting thread; NULL (the default) in production. Set it while no lock
 * call runs. */
enum lock_hook_point {
    LOCK_HOOK_BEFORE_SUBSCRIBE,   /* first attempt refused, not yet subscribed */
    LOCK_HOOK_BEFORE_WAIT         /* a retry refused, about to block */
};
typedef void (*lock_hook_fn)(enum lock_hook_point at, const char *key);
void lock_set_test_hook(lock_hook_fn fn);

#endif
