/* batch: group commit of buyers, the "batched" stock strategy.
 *
 * Buyers of the same voucher who hold their user lock and their order id
 * queue here; the first becomes the leader, gathers the others for at most
 * BATCH_WINDOW_US or BATCH_MAX buyers, and settles them all in one statement
 * (store_order_batch) on its own connection: one commit, one WAL flush, one
 * hold of the hot row for the whole batch. Each buyer gets its own answer. */
#ifndef SECKILL_BATCH_H
#define SECKILL_BATCH_H

#include "conn.h"
#include "lock.h"
#include "store.h"

/* A buyer's user lock, released by the leader right after the batch's
 * commit, with the others of the batch in one round trip. 'done' 1: it was
 * sent, and item.st is the outcome (LOCK_ERR: retry with item.rq). */
typedef struct batch_unlock {
    lock_release_item item;
    int done;
} batch_unlock;

/* Settles 'o' with the others queued for the same voucher. Blocks the
 * calling worker until its answer is known. 'u' (may be NULL) is released
 * by the leader when the batch settles; it stays the caller's. */
store_status batch_settle(conn_set *cs, const store_order *o, batch_unlock *u);

#endif
