/* store_steps: the order as flash-sale tutorials write it, one statement
 * per step in an explicit transaction, and the stock steps it is given
 * (stock strategy "pessimistic", the demo ladder's strategies and any
 * strategy slowed by DEMO_DELAY_MS). */
#ifndef SECKILL_STORE_STEPS_H
#define SECKILL_STORE_STEPS_H

#include "store.h"

/* Prepares this module's statements on a fresh session (store_prepare).
 * Returns 0 or -1. */
int store_steps_prepare(PGconn *pg);

/* The same order as flash-sale tutorials write it, one statement per step in an
 * explicit transaction: BEGIN, fencing token, duplicate check, the stock
 * step of 'stock', insert, COMMIT (ROLLBACK on any refusal). 'delay_ms'
 * sleeps between the stock's read and its write to widen the races (demo
 * ladder). */
typedef struct store_stock_step {
    /* Reads the stock inside the transaction (NULL: no read). A stock of 0
     * or less is STORE_SOLD_OUT. */
    store_status (*read)(PGconn *pg, int64_t voucher_id, int64_t *stock);
    /* Takes one unit; '*rows' 0 when it changed nothing. 'seen' is what
     * read returned (0 without a read). */
    store_status (*write)(PGconn *pg, int64_t voucher_id, int64_t seen, int *rows);
    /* A write that changed nothing: STORE_SOLD_OUT, or STORE_CONFLICT
     * (the stock moved since it was read). */
    store_status unchanged;
} store_stock_step;

store_status store_order_steps(PGconn *pg, const store_order *o, const store_stock_step *stock,
                               int delay_ms);

/* Stock steps. Reads: STORE_NOT_FOUND when there is no such voucher. */
store_status store_stock_read(PGconn *pg, int64_t voucher_id, int64_t *stock);
store_status store_stock_read_locked(PGconn *pg, int64_t voucher_id, int64_t *stock); /* FOR UPDATE */
/* stock = stock - 1 WHERE stock > 0 ('seen' unused). */
store_status store_stock_decrement(PGconn *pg, int64_t voucher_id, int64_t seen, int *rows);
/* Demo ladder only (stock_demo.c): stock = seen - 1, unconditionally (lost
 * updates), or only WHERE stock = seen (compare-and-swap). */
store_status store_stock_write_back(PGconn *pg, int64_t voucher_id, int64_t seen, int *rows);
store_status store_stock_cas(PGconn *pg, int64_t voucher_id, int64_t seen, int *rows);

#endif
