/* lock: Redisson-compatible reentrant lock (RLock layout, RFencedLock token). */
#include "lock.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "script.h"
#include "util.h"

#define LOCK_TOKEN_PREFIX   "redisson_lock_token"
#define LOCK_CHANNEL_PREFIX "redisson_lock__channel"
#define LOCK_UNLOCK_MESSAGE "0"   /* LockPubSub.UNLOCK_MESSAGE */

/* Relaxed: these are statistics, nothing is ordered by them. */
static atomic_uint_fast64_t n_acquired;
static atomic_uint_fast64_t n_contended;
static atomic_uint_fast64_t n_released;
static atomic_uint_fast64_t n_not_owner;
static atomic_uint_fast64_t n_renewals;
static atomic_uint_fast64_t n_errors;

static void count(atomic_uint_fast64_t *c)
{
    atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
}

/* Redisson's prefixName(): "prefix:{key}", but "prefix:key" when the key
 * already has a '{', so the key's own hash tag keeps every companion key in
 * the lock's cluster slot. Returns the length it needs (like snprintf). */
static int companion_name(const char *prefix, const char *key, char *buf, size_t n)
{
    if (strchr(key, '{') != NULL)
        return snprintf(buf, n, "%s:%s", prefix, key);
    return snprintf(buf, n, "%s:{%s}", prefix, key);
}

/* Same, in a fresh buffer (caller frees). */
static char *companion_dup(const char *prefix, const char *key)
{
    int need = companion_name(prefix, key, NULL, 0);
    char *s = xmalloc((size_t)(need < 0 ? 0 : need) + 1);
    companion_name(prefix, key, s, (size_t)need + 1);
    return s;
}

void lock_channel_name(const char *key, char *buf, size_t n)
{
    companion_name(LOCK_CHANNEL_PREFIX, key, buf, n);
}

/* Rejects calls that would corrupt the lock (PEXPIRE <= 0 deletes the key;
 * an empty owner would be shared by everyone). */
static int lock_args_ok(const char *fn, const char *key, const char *owner, long lease_ms)
{
    if (key == NULL || key[0] == '\0' || owner == NULL || owner[0] == '\0' || lease_ms <= 0) {
        log_error("%s: bad arguments (key=%s owner=%s lease=%ld)", fn,
                  key ? key : "(null)", owner ? owner : "(null)", lease_ms);
        return 0;
    }
    return 1;
}

lock_status lock_try_acquire(redisContext *c, const char *key, const char *owner,
                             long lease_ms, lock_grant *g)
{
    lock_status st = LOCK_ERR;
    char *token_key = NULL;
    redisReply *r = NULL;
    char lease[24];
    const char *argv[4];
    long long first, second;

    if (!lock_args_ok("lock_try_acquire", key, owner, lease_ms))
        goto cleanup;
    token_key = companion_dup(LOCK_TOKEN_PREFIX, key);
    snprintf(lease, sizeof lease, "%ld", lease_ms);

    argv[0] = key;
    argv[1] = token_key;
    argv[2] = lease;
    argv[3] = owner;
    r = script_run(c, SCRIPT_LOCK_ACQUIRE, 2, 4, argv, NULL);
    if (r == NULL) {
        log_warn("lock acquire %s: redis: %s", key, c->errstr);
        goto cleanup;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        log_warn("lock acquire %s: %s", key, r->str);
        goto cleanup;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_INTEGER ||
        r->element[1]->type != REDIS_REPLY_INTEGER) {
        log_warn("lock acquire %s: unexpected reply type %d", key, r->type);
        goto cleanup;
    }

    /* {-1, token} or {pttl, -1}: a PTTL of -1 (no expiry) is told apart by
     * the token slot, which is >= 1 on every grant. */
    first = r->element[0]->integer;
    second = r->element[1]->integer;
    if (first == -1 && second >= 1) {
        if (g != NULL) {
            g->token = second;
            g->ttl_ms = -1;
        }
        st = LOCK_OK;
    } else if (second == -1) {
        if (g != NULL) {
            g->token = -1;
            g->ttl_ms = first;
        }
        st = LOCK_BUSY;
    } else {
        log_warn("lock acquire %s: unexpected reply {%lld, %lld}", key, first, second);
    }

cleanup:
    if (st == LOCK_OK)
        count(&n_acquired);
    else if (st == LOCK_BUSY)
        count(&n_contended);
    else
        count(&n_errors);
    freeReplyObject(r);
    free(token_key);
    return st;
}

lock_status lock_release(redisContext *c, const char *key, const char *owner,
                         long lease_ms, long *remaining)
{
    lock_status st = LOCK_ERR;
    char *channel = NULL;
    redisReply *r = NULL;
    char lease[24];
    const char *argv[5];

    if (!lock_args_ok("lock_release", key, owner, lease_ms))
        goto cleanup;
    channel = companion_dup(LOCK_CHANNEL_PREFIX, key);
    snprintf(lease, sizeof lease, "%ld", lease_ms);

    /* Order fixed by lock_release.lua; later additions go at the end. */
    argv[0] = key;
    argv[1] = channel;
    argv[2] = LOCK_UNLOCK_MESSAGE;
    argv[3] = lease;
    argv[4] = owner;
    r = script_run(c, SCRIPT_LOCK_RELEASE, 2, 5, argv, NULL);
    if (r == NULL) {
        log_warn("lock release %s: redis: %s", key, c->errstr);
        goto cleanup;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        log_warn("lock release %s: %s", key, r->str);
        goto cleanup;
    }
    if (r->type == REDIS_REPLY_NIL) {
        /* Never held, or the lease ran out first: another owner may hold
         * it now, and the script left it alone. */
        log_debug("lock release %s: not held by %s", key, owner);
        st = LOCK_NOT_OWNER;
        goto cleanup;
    }
    if (r->type != REDIS_REPLY_INTEGER || r->integer < 0) {
        log_warn("lock release %s: unexpected reply type %d", key, r->type);
        goto cleanup;
    }
    if (remaining != NULL)
        *remaining = (long)r->integer;
    st = LOCK_OK;

cleanup:
    if (st == LOCK_OK)
        count(&n_released);
    else if (st == LOCK_NOT_OWNER)
        count(&n_not_owner);
    else
        count(&n_errors);
    freeReplyObject(r);
    free(channel);
    return st;
}

void lock_counters_get(lock_counters *out)
{
    out->acquired = atomic_load_explicit(&n_acquired, memory_order_relaxed);
    out->contended = atomic_load_explicit(&n_contended, memory_order_relaxed);
    out->released = atomic_load_explicit(&n_released, memory_order_relaxed);
    out->not_owner = atomic_load_explicit(&n_not_owner, memory_order_relaxed);
    out->renewals = atomic_load_explicit(&n_renewals, memory_order_relaxed);
    out->errors = atomic_load_explicit(&n_errors, memory_order_relaxed);
}
