/* stock: how a buyer's unit of stock is taken and the order written, one
 * interface for every strategy (SECKILL_STOCK):
 *
 *   stock.c       optimistic (one statement, "stock > 0"; the safe
 *                 default) and pessimistic (SELECT ... FOR UPDATE)
 *   stock_demo.c  naive and cas, the demo ladder's broken steps, and any
 *                 strategy slowed by DEMO_DELAY_MS; the default never
 *                 reaches them
 *   batch.c       batched: group commit by a leader worker
 *   stock_redis.c redis: Redis-first admission by a Lua script; the orders
 *                 reach Postgres through a stream (consumer.c)
 *
 * Every Postgres strategy writes the order in one transaction with the
 * fencing token, the duplicate check and the deduction together; the
 * Redis-first one admits in Redis alone (no lock, no Postgres: "alone").
 * Each answers with a store_status. */
#ifndef SECKILL_STOCK_H
#define SECKILL_STOCK_H

#include <cJSON.h>
#include <hiredis/hiredis.h>
#include <libpq-fe.h>

#include "conn.h"
#include "store.h"
#include "store_steps.h"
#include "store_voucher.h"
#include "user_lock.h"
#include "util.h"

/* One buyer on the way to the database. Owned by the caller until its
 * 'done' has been called. */
typedef struct stock_buyer {
    store_order order;        /* voucher and user; order id and token once known */
    user_lock_hold *hold;         /* the user's lock (may be free: no strategy took it) */
    int lock_pending;         /* deferred strategies: the settling worker takes 'hold'
                                 and the order id itself, with its whole batch's */
    user_lock_id id;              /* ... the id's outcome, then */
    int same_thread;          /* 'hold' may be released only by this thread: settle
                                 before returning even when deferred */
    int64_t deadline_us;      /* monotonic; INT64_MAX: none. Not started by then:
                                 STORE_UNAVAILABLE, nothing done, 'late' set */
    int late;
} stock_buyer;

/* 1 (and b->late set) when 'b''s deadline has passed: a strategy checks it
 * right before the statement that would order, and answers
 * STORE_UNAVAILABLE without running it. (Inline: batch.c, which stock.c's
 * table names, uses it too.) */
static inline int stock_past_deadline(stock_buyer *b)
{
    if (util_mono_us() <= b->deadline_us)
        return 0;
    b->late = 1;
    return 1;
}

/* A buyer's outcome, on the worker that settled it, with that worker's
 * connections; the hold is still the caller's to release (it may have
 * been released with the rest of a batch: user_lock_release is idempotent). */
typedef void (*stock_done_fn)(conn_set *cs, void *arg, store_status st);

typedef struct stock_backend {
    const char *name;         /* its SECKILL_STOCK value */
    /* done may come later, on another worker (a batch's leader). */
    int deferred;
    /* Settles 'b' and calls 'done' once: before returning, or (deferred)
     * on the worker that settles its batch, after the commit. 'pg' is the
     * caller's connection, just checked (NULL when b->lock_pending). */
    void (*settle)(conn_set *cs, PGconn *pg, stock_buyer *b, stock_done_fn done, void *arg);
    /* Or, with 'settle' NULL: the buyer's order in store_order_steps'
     * transaction with this stock step, slowed by DEMO_DELAY_MS
     * (STOCK_STEPS). */
    store_stock_step step;
    /* Deferred only (may be NULL): for an event thread, hands 'b' to a
     * settling worker already at work for its voucher and returns 1; else
     * returns 0 having done nothing. Never blocks, never does I/O. */
    int (*join)(stock_buyer *b, stock_done_fn done, void *arg);
    /* Optional, with join: 0 when join is off by configuration. */
    int (*joinable)(void);
    /* Admits without the per-user lock and without Postgres: settle gets
     * no connection and draws the order id itself. */
    int alone;
    /* Optional: at start (0, or -1 with 'err'); after a voucher was
     * created or reset in Postgres (0 or -1); the strategy's own figures
     * for GET /stats (0, or -1 when Redis failed). */
    int (*start)(char *err, size_t errlen);
    int (*load)(conn_set *cs, const store_voucher *v);
    /* The voucher as the strategy keeps it: STORE_OK, STORE_NOT_FOUND
     * when it does not (yet), STORE_UNAVAILABLE. */
    store_status (*voucher)(conn_set *cs, int64_t voucher_id, store_voucher *out);
    int (*stats)(conn_set *cs, cJSON *root, cJSON *vouchers);
} stock_backend;

/* A strategy that runs the order step by step: its name, then its stock
 * step's read (NULL: none), write and 'unchanged' (store_steps.h). */
#define STOCK_STEPS(name_, read_, write_, unchanged_) \
    { .name = name_, .step = { .read = read_, .write = write_, .unchanged = unchanged_ } }

/* Picks the strategy (enum stock_strategy; DEMO_DELAY_MS > 0 picks the
 * stepwise, slowed form). Call once before serving. 0, or -1 with 'err'. */
int stock_start(int strategy, char *err, size_t errlen);

int stock_deferred(void);
int stock_joinable(void);
void stock_settle(conn_set *cs, PGconn *pg, stock_buyer *b, stock_done_fn done, void *arg);
int stock_join(stock_buyer *b, stock_done_fn done, void *arg);
int stock_alone(void);
/* 1 when the strategy keeps its own state of the vouchers (redis). */
int stock_keeps_vouchers(void);
/* The strategy's hooks (no-ops, returning 0, where it has none). */
int stock_voucher_loaded(conn_set *cs, const store_voucher *v);
store_status stock_voucher_get(conn_set *cs, int64_t voucher_id, store_voucher *out);
int stock_stats(conn_set *cs, cJSON *root, cJSON *vouchers);

/* The strategies (their modules). */
extern const stock_backend stock_optimistic, stock_pessimistic;
extern const stock_backend stock_naive, stock_cas, stock_optimistic_steps;
extern const stock_backend stock_batched;
extern const stock_backend stock_redis_first;

#endif
