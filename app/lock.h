/* lock: a Redisson-compatible reentrant lock on Redis (SPEC section 3).
 *
 * Layout: a hash at 'key' whose single field is the owner id
 * "<instance uuid>:<thread id>" and whose value is the hold count, with a
 * PEXPIRE lease. Release publishes "0" on "redisson_lock__channel:{<key>}".
 * Every grant also increments "redisson_lock_token:{<key>}" and returns it
 * as a fencing token (Redisson's RFencedLock semantics). */
#ifndef SECKILL_LOCK_H
#define SECKILL_LOCK_H

#include <stddef.h>
#include <stdint.h>
#include <hiredis/hiredis.h>

typedef enum lock_status {
    LOCK_OK = 0,          /* acquired (new or reentry) / released or count decreased */
    LOCK_BUSY = 1,        /* held by another owner */
    LOCK_NOT_OWNER = 2,   /* release by someone who does not hold it: nothing changed */
    LOCK_ERR = -1         /* Redis failed; on a NULL reply the context is unusable */
} lock_status;

typedef struct lock_grant {
    int64_t token;        /* fencing token, strictly increasing per key (LOCK_OK) */
    int64_t ttl_ms;       /* holder's remaining lease (LOCK_BUSY), -1 if none */
} lock_grant;

/* One acquire attempt (no waiting). 'lease_ms' > 0 is a fixed lease.
 * On LOCK_OK fills g->token; on LOCK_BUSY fills g->ttl_ms. 'g' may be NULL. */
lock_status lock_try_acquire(redisContext *c, const char *key, const char *owner,
                             long lease_ms, lock_grant *g);

/* Releases one hold. '*remaining' (may be NULL) gets the hold count left:
 * 0 means the key was deleted and the release published. A second owner's
 * release returns LOCK_NOT_OWNER and changes nothing. 'lease_ms' is the
 * lease reset on a still-held reentrant lock. */
lock_status lock_release(redisContext *c, const char *key, const char *owner,
                         long lease_ms, long *remaining);

/* The pub/sub channel of a lock key: "redisson_lock__channel:{<key>}". */
void lock_channel_name(const char *key, char *buf, size_t n);

/* Process-wide counters (atomics), for /stats and /metrics. */
typedef struct lock_counters {
    uint64_t acquired;        /* grants, reentry included */
    uint64_t contended;       /* attempts refused because another owner held it */
    uint64_t released;        /* successful releases */
    uint64_t not_owner;       /* releases refused: not the holder (lease expired?) */
    uint64_t renewals;        /* watchdog lease renewals */
    uint64_t errors;          /* Redis failures inside lock calls */
} lock_counters;

void lock_counters_get(lock_counters *out);

#endif
