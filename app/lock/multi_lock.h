/* multi_lock: one lock over several independent Redis masters (no replication
 * between them), two ways, as Redisson's RedissonMultiLock and
 * RedissonRedLock combine single locks:
 *
 *   MULTI_LOCK_ALL       MultiLock: held only when every node granted it. Safe
 *                   while any one node keeps its data; unavailable while
 *                   any one node is down.
 *   MULTI_LOCK_MAJORITY  RedLock (redis.io/docs/manual/patterns/distributed-locks):
 *                   held when a majority (n/2 + 1) granted it and time is
 *                   left: validity = lease - elapsed - drift, where elapsed
 *                   is the attempt's own time on the monotonic clock and
 *                   drift = lease / 100 + 2 ms (the algorithm's allowance for
 *                   clock rate differences between the nodes).
 *
 * On each node the lock is the lock library's reentrant hash (lock.h) under
 * the same key and owner id, so reentry works as with the single lock: the
 * same owner's second grant counts up on every node it reaches, and a
 * release counts down. An attempt asks the nodes one after the other, in
 * the list's order, and stops as soon as the quorum is out of reach
 * (RedissonMultiLock.tryLock does the same): rivals for one key meet at the
 * first node, and its winner meets none further on, where an attempt sent
 * to every node at once let a storm split the nodes and all contenders
 * lose. Each node gets a connect and command timeout far below the lease,
 * so a dead node costs a bounded part of the validity, and each node's
 * attempt carries a deadline that far ahead (lock.h), so a node that
 * stalled and runs it later refuses it. A failed attempt (quorum out of
 * reach, or no validity left) is released on every node that granted it or
 * did not answer, so a loser does not keep a minority for a whole lease.
 *
 * Fencing: neither gives a token that only grows. Each node's counter of
 * grants restarts from nothing when the node restarts without persistence,
 * and no node's counter is shared by every grant (a majority need not
 * include it), so no function of the nodes' counters is monotonic. A fence
 * needs a counter that survives: a consensus service's (ZooKeeper's zxid)
 * or a database sequence.
 *
 * An multi_lock_set is one thread's connections to the nodes: not thread-safe;
 * every thread that locks makes its own. It reconnects lazily: a node whose
 * connection failed is tried again at the next call after RETRY_MS
 * (multi_lock.c), so a node that is down or stalled costs little; one that
 * closed the connection (restarted) is tried again at the next call. */
#ifndef SECKILL_MULTI_LOCK_H
#define SECKILL_MULTI_LOCK_H

#include "redis_url.h"

#include <stddef.h>
#include <stdint.h>

#include "lock_status.h"

#define MULTI_LOCK_MAX_NODES 16

typedef enum multi_lock_quorum { MULTI_LOCK_ALL, MULTI_LOCK_MAJORITY } multi_lock_quorum;

/* multi_lock_acquire's outcomes (lock_status.h):
 *   LOCK_OK    held: the quorum granted it within its validity
 *   LOCK_BUSY  not held: another owner holds it on some node
 *   LOCK_ERR   not held: too many nodes failed, or no validity left */

/* What an attempt saw, node i being bit i. */
typedef struct multi_lock_grant {
    unsigned granted;      /* nodes that granted it (released again when it failed) */
    unsigned busy;         /* nodes where another owner holds it */
    unsigned failed;       /* nodes that failed, were down or did not answer in time */
                           /* (a node in none of the three was not asked) */
    unsigned unanswered;   /* of 'failed': sent the attempt, no answer within the
                              timeout: they may have granted it */
    int64_t elapsed_us;    /* the attempt's time, first node's send to last node's reply */
    int64_t validity_ms;   /* lease - elapsed - drift (may be <= 0) */
} multi_lock_grant;

typedef struct multi_lock_set multi_lock_set;

/* Connections to 'n' (1..MULTI_LOCK_MAX_NODES) nodes, copied; none opened yet.
 * 'timeout_ms': each node's connect and command timeout. */
multi_lock_set *multi_lock_set_new(const redis_url *nodes, size_t n, int timeout_ms);
void multi_lock_set_free(multi_lock_set *s);

/* Grants needed of 'n' nodes: n (ALL) or n / 2 + 1 (MAJORITY). */
size_t multi_lock_needed(multi_lock_quorum q, size_t n);

/* RedLock's clock drift allowance for a lease: lease / 100 + 2 ms. */
long multi_lock_drift_ms(long lease_ms);

/* One attempt, no waiting, with a fixed lease ('lease_ms' > 0). 'g' gets
 * what each node answered (required). Not held: released already. */
lock_status multi_lock_acquire(multi_lock_set *s, multi_lock_quorum q, const char *key, const char *owner,
                          long lease_ms, multi_lock_grant *g);

/* Releases the hold on every node of 'mask' (the nodes that did not answer
 * "busy" at the acquire). Returns how many counted it down; a node that is
 * down keeps it until the lease ends, one that no longer knows the owner
 * (expired, restarted) counts as 'not_owner' (may be NULL). A node whose
 * connection failed is skipped until its reconnect pause ends, except the
 * nodes of 'reach' (the grant's 'unanswered'): a node that ran the attempt
 * but answered late is asked on a new connection at once, or it would keep
 * the hold for the whole lease. */
int multi_lock_release(multi_lock_set *s, const char *key, const char *owner, long lease_ms,
                  unsigned mask, unsigned reach, int *not_owner);

/* Connects to every node once (PING); 0, or -1 with the first node that
 * failed and why in 'err'. For a start-up check. */
int multi_lock_check(multi_lock_set *s, char *err, size_t errlen);

#endif
