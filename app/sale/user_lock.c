/* user_lock: the strategy table and the one place a hold changes state. */
#include "user_lock.h"
#include "config.h"
#include "log.h"
#include "util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Indexed by enum lock_strategy. A new backend: its module, its value in
 * config.c's list, and a line here. */
static const user_lock_backend *const backends[] = {
    [LOCKS_NONE] = &user_lock_none,
    [LOCKS_LOCAL] = &user_lock_local,
    [LOCKS_SETNX] = &user_lock_setnx,
    [LOCKS_OWNER] = &user_lock_owner,
    [LOCKS_REENTRANT] = &user_lock_reentrant,
    [LOCKS_ZK] = &user_lock_zk,
    [LOCKS_PG_TABLE] = &user_lock_pg_table,
    [LOCKS_PG_ADVISORY] = &user_lock_pg_advisory,
    [LOCKS_MULTILOCK] = &user_lock_multilock,
    [LOCKS_REDLOCK] = &user_lock_redlock,
};
#define NBACKENDS (sizeof backends / sizeof backends[0])

/* Set by user_lock_start before any thread serves; read-only after. */
static const user_lock_backend *be = &user_lock_reentrant;

int user_lock_start(int strategy, char *err, size_t errlen)
{
    if (strategy < 0 || (size_t)strategy >= NBACKENDS || backends[strategy] == NULL) {
        snprintf(err, errlen, "unknown lock strategy %d", strategy);
        return -1;
    }
    be = backends[strategy];
    return be->start != NULL ? be->start(err, errlen) : 0;
}

void user_lock_stop(void)
{
    if (be->stop != NULL)
        be->stop();
}

int user_lock_tokens(void)
{
    return be->tokens;
}

int user_lock_token_clock(void)
{
    return be->tokens && be->token_clock;
}

int user_lock_fence_key_prefix(char *buf, size_t n)
{
    int len = snprintf(buf, n, "%s" USER_LOCK_KEY_PREFIX, be->fence_prefix != NULL ? be->fence_prefix : "");

    return len >= 0 && (size_t)len < n ? 0 : -1;
}

int user_lock_thread_bound(void)
{
    return be->thread_bound;
}

int user_lock_batchable(void)
{
    return be->acquire_many != NULL && be->release_many != NULL;
}

const char *user_lock_unavailable(void)
{
    return be->unavailable;
}

void user_lock_hold_init(user_lock_hold *h, int64_t user_id, const char *owner)
{
    memset(h, 0, sizeof *h);
    snprintf(h->key, sizeof h->key, USER_LOCK_KEY_PREFIX "%" PRId64, user_id);
    snprintf(h->owner, sizeof h->owner, "%s", owner);
    h->user_id = user_id;
    h->lease_ms = g_cfg.lock_lease_ms;
    h->state = USER_LOCK_FREE;
    h->taken = LOCK_ERR;
    h->token = -1;
    snprintf(h->fence_key, sizeof h->fence_key, "%s%s",
             be->fence_prefix != NULL ? be->fence_prefix : "", h->key);
}

/* A hold is taken once: a second attempt on it is a bug in the caller. */
static void check_free(const user_lock_hold *h)
{
    if (h->state != USER_LOCK_FREE) {
        log_error("user_lock: %s taken twice (state %d)", h->key, (int)h->state);
        abort();
    }
}

lock_status user_lock_acquire(conn_set *cs, user_lock_hold *h, user_lock_id *id)
{
    check_free(h);
    h->taken = be->acquire(cs, h, id);
    if (h->taken == LOCK_OK)
        h->state = USER_LOCK_HELD;
    return h->taken;
}

void user_lock_release(conn_set *cs, user_lock_hold *h)
{
    if (h->state != USER_LOCK_HELD)
        return;
    be->release(cs, h);
    h->state = USER_LOCK_RELEASED;
}

void user_lock_acquire_many(conn_set *cs, user_lock_hold *const *h, user_lock_id *id, size_t n)
{
    for (size_t i = 0; i < n; i++)
        check_free(h[i]);
    if (n == 0)
        return;
    be->acquire_many(cs, h, id, n);
    for (size_t i = 0; i < n; i++)
        if (h[i]->taken == LOCK_OK)
            h[i]->state = USER_LOCK_HELD;
}

void user_lock_release_many(conn_set *cs, user_lock_hold *const *h, size_t n)
{
    user_lock_hold **held;
    unsigned char *done;
    size_t k = 0;

    if (be->release_many == NULL || n == 0)
        return;                               /* each hold's own release does it */
    held = xmalloc(sizeof *held * n);
    done = xcalloc(n, 1);
    for (size_t i = 0; i < n; i++)
        if (h[i]->state == USER_LOCK_HELD)
            held[k++] = h[i];
    if (k > 0)
        be->release_many(cs, held, k, done);
    for (size_t i = 0; i < k; i++)
        if (done[i])
            held[i]->state = USER_LOCK_RELEASED;
    free(done);
    free(held);
}
