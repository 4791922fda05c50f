/* order: one buyer's order, from the per-user lock to the answer. The
 * handler validates and reads the voucher; this does the rest, the same
 * steps whatever the strategies: the lock through user_lock.h, the stock and
 * the transaction through stock.h. */
#ifndef SECKILL_ORDER_H
#define SECKILL_ORDER_H

#include <stddef.h>
#include <stdint.h>

#include "api_err.h"
#include "conn.h"
#include "store.h"

/* Starts the lock and stock strategies the instance was configured with.
 * Call once before serving. Returns 0, or -1 (logged here, once: a start
 * function logs its own failure). */
int order_start(void);
void order_stop(void);

/* The API's answer to a Postgres outcome: the one mapping, used by every
 * handler (STORE_OK is API_OK; every failure of the database itself is
 * API_UNAVAILABLE). */
api_err order_store_error(store_status st);

/* The buyer's answer: 'err' API_OK with 'order_id', or the error to answer
 * with; 'message' (may be NULL) is a static human text. */
typedef void (*order_reply_fn)(void *arg, api_err err, const char *message, int64_t order_id);

/* Places the order and calls 'reply' exactly once: on the caller's thread
 * before returning, or - a deferred stock strategy, "batched" - on the
 * worker that settles the order's batch, after its commit and the release
 * of its lock. The caller's worker is free as soon as this returns.
 * 'deadline_us' (monotonic, INT64_MAX: none): an order whose transaction
 * has not started by then is not placed; 'reply' gets API_UNAVAILABLE. */
void order_submit(conn_set *cs, int64_t voucher_id, int64_t user_id, int64_t deadline_us,
                  order_reply_fn reply, void *arg);

/* For an event thread: when order_joinable() and a batch of this voucher
 * has a leader at work (redis: a worker is sending admissions), hands the
 * order to it and returns 1; 'reply' is then called once, on that worker,
 * as with order_submit. Returns
 * 0 otherwise, having done nothing: call order_submit on a worker. Never
 * blocks. */
int order_join(int64_t voucher_id, int64_t user_id, int64_t deadline_us, order_reply_fn reply,
               void *arg);

/* 1 when the strategies in force let a batch's leader take the whole
 * order (lock, id and statement), or the stock strategy admits alone and
 * sends its admissions in lots: then order_join may take it. */
int order_joinable(void);

#endif
