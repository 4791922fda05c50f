/* batch: group commit of buyers, the "batched" stock strategy.
 *
 * Buyers of the same voucher who hold their user lock and their order id
 * queue here; the first becomes the leader, gathers the others for at most
 * BATCH_WINDOW_US or BATCH_MAX buyers, and settles them all in one statement
 * (store_order_batch) on its own connection: one commit, one WAL flush, one
 * hold of the hot row for the whole batch. Each buyer gets its own answer.
 * No worker waits for a batch but its leader: a buyer's request stays
 * suspended in libmicrohttpd, and its answer is sent by the leader, so a
 * batch can hold more buyers than there are workers. */
#ifndef SECKILL_BATCH_H
#define SECKILL_BATCH_H

#include "conn.h"
#include "lock.h"
#include "store.h"

/* A buyer's user lock, released by the leader right after the batch's
 * commit, with the others of the batch in one round trip. 'done' 1: it was
 * sent, and item.st is the outcome (LOCK_ERR: retry with item.rq).
 * 'acquire' 1: the leader also takes it (item.key for item.owner, lease
 * item.lease_ms), with the order's id, for the whole batch in one round
 * trip before the statement, and fills the order's order_id and
 * fence_token; 'taken' then says what came of it: LOCK_OK (held, released
 * as above), LOCK_BUSY (another request of the user holds it: the buyer's
 * result is STORE_DUPLICATE) or LOCK_ERR (STORE_UNAVAILABLE; 'id_failed'
 * when it was the id). */
typedef struct batch_unlock {
    lock_release_item item;
    int done;
    int acquire;
    lock_status taken;
    int id_failed;
} batch_unlock;

/* A buyer's outcome, given on the worker that settled its batch, with that
 * worker's connection set. */
typedef void (*batch_done_fn)(conn_set *cs, void *arg, store_status st);

/* Queues 'o' with the others of its voucher and returns; 'done' is called
 * once with its outcome, after the commit and after 'u' (may be NULL) was
 * released with the rest of the batch. The first buyer of an idle queue
 * becomes its leader: its worker gathers and settles batches until the
 * queue is empty, so it returns only then; the others return at once.
 * 'o' and 'u' must stay valid until 'done' is called. */
void batch_submit(conn_set *cs, store_order *o, batch_unlock *u, batch_done_fn done, void *arg);

/* For an event thread, which must not block nor lead: queues 'o' as
 * batch_submit does when the voucher's queue has a leader at work (it will
 * settle 'o' before it stops), and returns 1; else returns 0 and does
 * nothing (call batch_submit on a worker). Never touches Redis or Postgres;
 * the batches' mutex is never held across I/O. */
int batch_join(store_order *o, batch_unlock *u, batch_done_fn done, void *arg);

/* batch_submit, waiting for the outcome (for a lock that only the thread
 * that took it may release). */
store_status batch_settle(conn_set *cs, store_order *o, batch_unlock *u);

#endif
