/* store_batch: many orders of one voucher in one transaction and one round
 * trip: group commit (stock strategy "batched") and the Redis-first
 * consumer's batches. */
#ifndef SECKILL_STORE_BATCH_H
#define SECKILL_STORE_BATCH_H

#include "store.h"

/* Prepares this module's statements on a fresh session (store_prepare).
 * Returns 0 or -1. */
int store_batch_prepare(PGconn *pg);

/* Group commit (stock strategy "batched"): settles 'n' buyers of one voucher
 * in one transaction (their fence rows, then one statement), one round
 * trip. Each gets its own answer in 'results' (STORE_OK, STORE_SOLD_OUT for
 * those past the stock, STORE_DUPLICATE, STORE_STALE_TOKEN, and
 * STORE_NOT_STARTED / STORE_ENDED outside the sale window); stock never
 * goes below zero and the first buyers in 'orders' are served first. Users must be distinct within a batch. Returns
 * STORE_OK when the statement ran (then read 'results'), else the failure
 * shared by all (e.g. STORE_DUPLICATE on a unique violation: settle those
 * buyers one by one). */
store_status store_order_batch(PGconn *pg, const store_order *orders, size_t n,
                               store_status *results);

/* store_order_batch in parts, so that a caller can work while the batch's
 * transaction runs: _send queues it on 'pg' and fills 'call' (returns 0,
 * or -1 when it could not be sent); _wait waits at most 'timeout_us' for
 * it (1 once a result has come, the bound has passed or nothing was sent:
 * _recv will not wait long; 0 while it runs); _recv reads it. The round
 * trip's bound counts from the send. 'pg' carries nothing else meanwhile. */
typedef struct store_batch_call {
    int sent;               /* 0: queued; -1: not sent */
    int early;              /* early lock release */
    int64_t t0_us;          /* when it was sent, monotonic */
} store_batch_call;
/* 'early': the batch commits without waiting for its WAL flush (the voucher
 * row is free at the in-memory commit), and a second transaction in the
 * same round trip waits for the flush; an order whose flush wait failed is
 * answered STORE_UNAVAILABLE in 'results'. */
int store_order_batch_send(PGconn *pg, const store_order *orders, size_t n, int early,
                           store_batch_call *call);
int store_order_batch_wait(PGconn *pg, const store_batch_call *call, int64_t timeout_us);
store_status store_order_batch_recv(PGconn *pg, const store_batch_call *call, size_t n,
                                    store_status *results);

/* Redis-first: persists 'n' orders of one voucher admitted in Redis, in
 * one transaction and one round trip (the voucher row locked first): the
 * orders whose id is not there yet are inserted and the stock taken for
 * them by one "stock = stock - n WHERE stock >= n". Idempotent on the order
 * id: an order already there is skipped, and counts as persisted.
 * '*inserted' says how many rows this call wrote. STORE_OK: all of them
 * are there now; STORE_SOLD_OUT: the stock in Postgres is short of them,
 * nothing written; STORE_NOT_FOUND: no such voucher; STORE_DUPLICATE: a
 * user in the batch already has another order of the voucher (the unique
 * constraint), nothing written; STORE_CONFLICT: an order id of the batch
 * belongs to another order (not a re-delivery), nothing written;
 * STORE_STALE_SALE: the orders were admitted in sale 'sale_gen', which a
 * reset has ended (the voucher's sale_gen is newer, in '*pg_sale'), nothing
 * written;
 * STORE_INVALID: 'sale_gen' is newer than the voucher's (Postgres lost a
 * reset), nothing written; STORE_UNAVAILABLE: Postgres failed or refused
 * for now (read-only, a lock or statement timeout, a lost connection):
 * nothing is known to be written, and the same call may be made again. */
store_status store_orders_persist(PGconn *pg, int64_t voucher_id, int64_t sale_gen,
                                  const store_order *orders, size_t n, int64_t *inserted,
                                  int64_t *pg_sale);

#endif
