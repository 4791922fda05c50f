/* ulock: the strategy table and the one place a hold changes state. */
#include "ulock.h"
#include "config.h"
#include "log.h"
#include "util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Indexed by enum lock_strategy. A new backend: its module, its value in
 * config.c's list, and a line here. */
static const ulock_backend *const backends[] = {
    [LOCKS_NONE] = &ulock_none,
    [LOCKS_LOCAL] = &ulock_local,
    [LOCKS_SETNX] = &ulock_setnx,
    [LOCKS_OWNER] = &ulock_owner,
    [LOCKS_REENTRANT] = &ulock_reentrant,
    [LOCKS_ZK] = &ulock_zk,
    [LOCKS_PG_TABLE] = &ulock_pg_table,
    [LOCKS_PG_ADVISORY] = &ulock_pg_advisory,
    [LOCKS_MULTILOCK] = &ulock_multilock,
    [LOCKS_REDLOCK] = &ulock_redlock,
};
#define NBACKENDS (sizeof backends / sizeof backends[0])

/* Set by ulock_start before any thread serves; read-only after. */
static const ulock_backend *be = &ulock_reentrant;

int ulock_start(int strategy, char *err, size_t errlen)
{
    if (strategy < 0 || (size_t)strategy >= NBACKENDS || backends[strategy] == NULL) {
        snprintf(err, errlen, "unknown lock strategy %d", strategy);
        return -1;
    }
    be = backends[strategy];
    return be->start != NULL ? be->start(err, errlen) : 0;
}

void ulock_stop(void)
{
    if (be->stop != NULL)
        be->stop();
}

int ulock_tokens(void)
{
    return be->tokens;
}

int ulock_token_clock(void)
{
    return be->tokens && be->token_clock;
}

int ulock_fence_key_prefix(char *buf, size_t n)
{
    int len = snprintf(buf, n, "%s" ULOCK_KEY_PREFIX, be->fence_prefix != NULL ? be->fence_prefix : "");

    return len >= 0 && (size_t)len < n ? 0 : -1;
}

int ulock_thread_bound(void)
{
    return be->thread_bound;
}

int ulock_batchable(void)
{
    return be->acquire_many != NULL && be->release_many != NULL;
}

const char *ulock_unavailable(void)
{
    return be->unavailable;
}

void ulock_hold_init(ulock_hold *h, int64_t user_id, const char *owner)
{
    memset(h, 0, sizeof *h);
    snprintf(h->key, sizeof h->key, ULOCK_KEY_PREFIX "%" PRId64, user_id);
    snprintf(h->owner, sizeof h->owner, "%s", owner);
    h->user_id = user_id;
    h->lease_ms = g_cfg.lock_lease_ms;
    h->state = ULOCK_FREE;
    h->taken = LOCK_ERR;
    h->token = -1;
    snprintf(h->fence_key, sizeof h->fence_key, "%s%s",
             be->fence_prefix != NULL ? be->fence_prefix : "", h->key);
}

/* A hold is taken once: a second attempt on it is a bug in the caller. */
static void check_free(const ulock_hold *h)
{
    if (h->state != ULOCK_FREE) {
        log_error("ulock: %s taken twice (state %d)", h->key, (int)h->state);
        abort();
    }
}

lock_status ulock_acquire(conn_set *cs, ulock_hold *h, ulock_id *id)
{
    check_free(h);
    h->taken = be->acquire(cs, h, id);
    if (h->taken == LOCK_OK)
        h->state = ULOCK_HELD;
    return h->taken;
}

void ulock_release(conn_set *cs, ulock_hold *h)
{
    if (h->state != ULOCK_HELD)
        return;
    be->release(cs, h);
    h->state = ULOCK_RELEASED;
}

void ulock_acquire_many(conn_set *cs, ulock_hold *const *h, ulock_id *id, size_t n)
{
    for (size_t i = 0; i < n; i++)
        check_free(h[i]);
    if (n == 0)
        return;
    be->acquire_many(cs, h, id, n);
    for (size_t i = 0; i < n; i++)
        if (h[i]->taken == LOCK_OK)
            h[i]->state = ULOCK_HELD;
}

void ulock_release_many(conn_set *cs, ulock_hold *const *h, size_t n)
{
    ulock_hold **held;
    unsigned char *done;
    size_t k = 0;

    if (be->release_many == NULL || n == 0)
        return;                               /* each hold's own release does it */
    held = xmalloc(sizeof *held * n);
    done = xcalloc(n, 1);
    for (size_t i = 0; i < n; i++)
        if (h[i]->state == ULOCK_HELD)
            held[k++] = h[i];
    if (k > 0)
        be->release_many(cs, held, k, done);
    for (size_t i = 0; i < k; i++)
        if (done[i])
            held[i]->state = ULOCK_RELEASED;
    free(done);
    free(held);
}
