/* store_fence: the statements of tb_lock_fence, the fencing tokens' rows:
 * one holder's row advanced, a batch's rows advanced, and the sweep of
 * old rows. A token is refused when a newer one was written, or when it
 * is older than the order's fence horizon (store_order). */
#ifndef SECKILL_STORE_FENCE_H
#define SECKILL_STORE_FENCE_H

#include "store.h"

/* Prepares this module's statements on a fresh session (store_prepare).
 * Returns 0 or -1. */
int store_fence_prepare(PGconn *pg);

/* Queues fence_advance for order 'o' (its fence_key not NULL) on a
 * connection in pipeline mode, first in the order's transaction: the row
 * moves to o's token and stays locked until the commit, unless the token
 * is stale (then it returns no row and changes nothing). 1, or 0 when
 * sending failed. */
int store_fence_send_advance(PGconn *pg, const store_order *o);

/* fence_advance as one statement of a transaction the caller opened (o's
 * fence_key not NULL): STORE_OK, STORE_STALE_TOKEN when the token is
 * stale, or the failure. */
store_status store_fence_advance(PGconn *pg, const store_order *o);

/* Queues fence_batch (pipeline mode): the rows of a batch advanced, keys
 * in order. 'keys' and 'tokens' are Postgres array literals, one entry per
 * buyer (NULL keys skipped); 'horizon_ms' is the horizon, as text. 1, or 0
 * when sending failed. */
int store_fence_send_batch(PGconn *pg, const char *keys, const char *tokens,
                           const char *horizon_ms);

/* One page of the sweep of tb_lock_fence: looks at the 'page' keys after
 * 'after' (in key order; "" for the first page) and deletes those that
 * begin with 'prefix' and whose token is more than 2 x 'horizon_ms' old by
 * Postgres's clock. Safe while
 * every writer refuses tokens older than one horizon (store_order's
 * fence_horizon_ms): a forgotten row's stale holder is refused by age.
 * Fills 'out': the last key looked at (resume after it), how many keys
 * were looked at (fewer than 'page': the pass is over) and deleted. */
typedef struct store_sweep_page {
    char last[256];
    int64_t scanned, deleted;
} store_sweep_page;

store_status store_fence_sweep(PGconn *pg, long horizon_ms, const char *prefix, const char *after,
                               int page, store_sweep_page *out);

#endif
