/* stock: how a buyer's unit of stock is taken and the order written, one
 * interface for every strategy (SECKILL_STOCK):
 *
 *   stock.c       optimistic (one statement, "stock > 0"; the safe
 *                 default) and pessimistic (SELECT ... FOR UPDATE)
 *   stock_demo.c  naive and cas, the demo ladder's broken steps, and any
 *                 strategy slowed by DEMO_DELAY_MS; the default never
 *                 reaches them
 *   batch.c       batched: group commit by a leader worker
 *
 * Every strategy writes the order in one transaction with the fencing
 * token, the duplicate check and the deduction together, and answers with
 * a store_status. */
#ifndef SECKILL_STOCK_H
#define SECKILL_STOCK_H

#include <libpq-fe.h>

#include "conn.h"
#include "store.h"
#include "ulock.h"
#include "util.h"

/* One buyer on the way to the database. Owned by the caller until its
 * 'done' has been called. */
typedef struct stock_buyer {
    store_order order;        /* voucher and user; order id and token once known */
    ulock_hold *hold;         /* the user's lock (may be free: no strategy took it) */
    int lock_pending;         /* deferred strategies: the settling worker takes 'hold'
                                 and the order id itself, with its whole batch's */
    ulock_id id;              /* ... the id's outcome, then */
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
 * been released with the rest of a batch: ulock_release is idempotent). */
typedef void (*stock_done_fn)(conn_set *cs, void *arg, store_status st);

typedef struct stock_backend {
    const char *name;         /* its SECKILL_STOCK value */
    /* done may come later, on another worker (a batch's leader). */
    int deferred;
    /* Settles 'b' and calls 'done' once: before returning, or (deferred)
     * on the worker that settles its batch, after the commit. 'pg' is the
     * caller's connection, just checked (NULL when b->lock_pending). */
    void (*settle)(conn_set *cs, PGconn *pg, stock_buyer *b, stock_done_fn done, void *arg);
    /* Deferred only (may be NULL): for an event thread, hands 'b' to a
     * settling worker already at work for its voucher and returns 1; else
     * returns 0 having done nothing. Never blocks, never does I/O. */
    int (*join)(stock_buyer *b, stock_done_fn done, void *arg);
} stock_backend;

/* Picks the strategy (enum stock_strategy; DEMO_DELAY_MS > 0 picks the
 * stepwise, slowed form). Call once before serving. 0, or -1 with 'err'. */
int stock_start(int strategy, char *err, size_t errlen);

int stock_deferred(void);
int stock_joinable(void);
void stock_settle(conn_set *cs, PGconn *pg, stock_buyer *b, stock_done_fn done, void *arg);
int stock_join(stock_buyer *b, stock_done_fn done, void *arg);

/* The strategies (their modules). */
extern const stock_backend stock_optimistic, stock_pessimistic;
extern const stock_backend stock_naive, stock_cas, stock_optimistic_steps;
extern const stock_backend stock_batched;

#endif
