/* watchdog: lease renewal of watchdog-mode locks (lease -1).
 *
 * One renewal thread per process, with its own Redis connection. Every
 * third of the watchdog timeout it renews every registered lock in batches
 * of up to 100 keys (on a Redis Cluster, of one hash slot), one EVALSHA of
 * lua/lock_renew.lua per batch: a lock
 * whose owner field is still there gets its lease back (PEXPIRE to the
 * full timeout); one whose field is gone is dropped from renewal. A Redis
 * error is logged and the schedule kept. When the process dies the thread
 * dies with it and the lock expires within one timeout.
 *
 * Registration follows the lesson of redisson#7272: wd_begin before the
 * acquire is sent, wd_end after its reply, wd_cancel before a release is
 * sent, so a renewal can never be scheduled after the release. Holds are
 * counted per (key, owner): renewal stops only at the final release. */
#ifndef SECKILL_WATCHDOG_H
#define SECKILL_WATCHDOG_H

#include <stddef.h>
#include <stdint.h>
#include <hiredis/hiredis.h>

#define WD_DEFAULT_TIMEOUT_MS 30000L   /* Redisson's lockWatchdogTimeout */
#define WD_BATCH 100                   /* keys per EVALSHA (lockWatchdogBatchSize) */

/* Opens the renewal thread's connection (see lock_options.connect). */
typedef redisContext *(*wd_connect_fn)(char *err, size_t errlen);
/* 1 when that connection should be opened again (lock_options.stale). */
typedef int (*wd_stale_fn)(const redisContext *c);

/* Starts the renewal thread, which connects with 'connect' (and, before
 * each renewal, re-opens a connection 'stale' (may be NULL) refuses),
 * renewing leases of 'timeout' ms (0: WD_DEFAULT_TIMEOUT_MS). With
 * 'cluster' (Redis Cluster seeds "host:port,...", NULL or empty: none) it
 * routes instead: the locks of one hash slot per EVALSHA, on that slot's
 * master (connections of its own, 'cluster_timeout' ms each). Call once,
 * after script_load_all. Returns 0, or -1 (logged). */
int wd_start(long timeout, wd_connect_fn connect, wd_stale_fn stale, const char *cluster,
             int cluster_timeout);

/* Stops and joins the thread and forgets every registration. Idempotent. */
void wd_stop(void);

/* The watchdog lease in ms: wd_start's, or 30000 before it ran. */
long wd_timeout_ms(void);

/* Before sending a watchdog-mode acquire of 'key' by 'owner'. */
void wd_begin(const char *key, const char *owner);

/* After its reply: 'acquired' = 1 counts one more hold to renew; 0 (busy,
 * or no reply at all) undoes wd_begin. Every wd_begin needs one wd_end. */
void wd_end(const char *key, const char *owner, int acquired);

/* Before sending the release of one watchdog-mode hold: the final one
 * stops renewal at once. Unknown (key, owner) pairs are ignored. */
void wd_cancel(const char *key, const char *owner);

/* Locks registered for renewal (tests). */
int wd_count(void);

typedef struct wd_counters {
    uint64_t renewals;   /* leases renewed (one per key per tick) */
    uint64_t lost;       /* locks dropped because their owner field was gone */
    uint64_t errors;     /* renewal batches that failed (Redis error, no reply) */
    uint64_t ticks;      /* ticks with locks to renew, counted once every batch's
                          * answer is handled (tests wait for them) */
} wd_counters;

void wd_counters_get(wd_counters *out);

#endif
