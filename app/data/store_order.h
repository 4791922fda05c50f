/* store_order: one buyer's order in one transaction and one round trip
 * (the one-statement order of stock strategy "optimistic" and of the
 * batches settled one by one), with its early lock release. */
#ifndef SECKILL_STORE_ORDER_H
#define SECKILL_STORE_ORDER_H

#include "store.h"

/* Prepares this module's statements on a fresh session (store_prepare).
 * Returns 0 or -1. */
int store_order_prepare(PGconn *pg);

/* The whole order in one transaction and one round trip (pipelined): the
 * fence row advanced by a statement of its own (locked), then one statement
 * with the duplicate check, the optimistic deduction (stock > 0) and the
 * insert, whose snapshot is taken after the fence row was granted. A
 * unique violation rolls all of it back and reads as STORE_DUPLICATE. */
store_status store_order_create(PGconn *pg, const store_order *o);

/* Early lock release, in one round trip. store_order_send_early sends the
 * same transaction, committed without waiting for its WAL flush, and behind
 * it a wait for that flush; it returns the order's outcome as soon as its
 * commit is done, so the voucher row is free for the next buyer while this
 * commit is still being written (a hot row otherwise sells one order per
 * fsync). The outcome is visible to others at once but not yet durable:
 * store_order_finish_early (call it exactly once after every send, with
 * the send's status) reads the wait and returns the status to answer with:
 * STORE_OK only once the commit is on disk and the order's row is there
 * (a commit can fail after its statement succeeded), else
 * STORE_UNAVAILABLE. A
 * crash in between loses the order and its deduction together. If the
 * connection is left in pipeline mode (PQpipelineStatus) it must be
 * re-opened. */
typedef struct store_early {
    int segments;             /* statements sent, each with its Sync */
    int read;                 /* segments read */
    int64_t order_id;
    int64_t t0;
} store_early;

store_status store_order_send_early(PGconn *pg, const store_order *o, store_early *e);
store_status store_order_finish_early(PGconn *pg, store_early *e, store_status st);

#endif
