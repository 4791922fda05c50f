/* store: everything the service asks Postgres, as prepared statements on the
 * caller's (per-thread) connection. Each call is one round trip. */
#ifndef SECKILL_STORE_H
#define SECKILL_STORE_H

#include <stdint.h>
#include <cJSON.h>
#include <libpq-fe.h>


typedef enum store_status {
    STORE_OK = 0,
    STORE_NOT_FOUND,      /* no such voucher */
    STORE_SOLD_OUT,       /* stock > 0 matched no row */
    STORE_DUPLICATE,      /* this user already has an order for this voucher */
    STORE_INVALID,        /* a constraint refused the values (e.g. end before begin) */
    STORE_STALE_TOKEN,    /* a newer lock holder already wrote: this holder's lease is gone */
    STORE_CONFLICT,       /* cas: the stock changed since it was read (not sold out) */
    STORE_NOT_STARTED,    /* the order's transaction ran before the sale window, */
    STORE_ENDED,          /* ... or after it (by Postgres's clock) */
    STORE_STALE_SALE,     /* Redis-first: the orders' sale was ended by a reset */
    STORE_UNAVAILABLE     /* connection lost, timed out or refused: answer 503 */
} store_status;

typedef struct store_voucher {
    int64_t voucher_id;
    char title[256];
    int64_t stock;
    int64_t initial_stock;
    int64_t begin_time;   /* Unix seconds */
    int64_t end_time;
    int64_t sale_gen;     /* the sale: 1 at creation, one more at each reset */
} store_voucher;

/* Every call waits for Postgres at most store_round_trip_ms() per round
 * trip (PG_STATEMENT_TIMEOUT_MS + STORE_SLACK_MS): a server that stopped
 * answering is given up, its connection shut down (CONNECTION_BAD: the
 * caller re-opens it) and the call fails as STORE_UNAVAILABLE. */
#define STORE_SLACK_MS 1000
int store_round_trip_ms(void);

/* Prepares every statement on a fresh session, whose statements then keep
 * generic plans (plan_cache_mode = force_generic_plan). Returns 0 or -1. */
int store_prepare(PGconn *pg);

/* SELECT 1 (readiness). */
store_status store_ping(PGconn *pg);

store_status store_voucher_get(PGconn *pg, int64_t voucher_id, store_voucher *out);

typedef struct store_order {
    int64_t order_id;
    int64_t voucher_id;
    int64_t user_id;
    const char *fence_key;    /* lock key whose token guards the write; NULL: none */
    int64_t fence_token;
    /* Tokens older than this (ms, by Postgres's clock; they are
     * microseconds of the lock service's clock) are refused as stale;
     * 0: no horizon (tokens that are not clock readings). */
    long fence_horizon_ms;
} store_order;

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

/* The users who ordered 'voucher_id' ('*users' malloc'ed, caller frees;
 * set even when empty). */
store_status store_voucher_buyers(PGconn *pg, int64_t voucher_id, int64_t **users, size_t *n);

/* store_voucher_get and store_voucher_buyers read in one snapshot (a
 * read-only REPEATABLE READ transaction): an order committed meanwhile is
 * in both or in neither. '*users' as for store_voucher_buyers (NULL on
 * failure). */
store_status store_voucher_snapshot(PGconn *pg, int64_t voucher_id, store_voucher *v,
                                    int64_t **users, size_t *n);

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

store_status store_voucher_create(PGconn *pg, const char *title, int64_t stock,
                                  int64_t begin_time, int64_t end_time, int64_t *voucher_id);

/* Deletes the voucher's orders, sets stock and initial stock and begins a
 * new sale (sale_gen + 1), in one transaction that locks the voucher row
 * first; 'begin_time'/'end_time' < 0 keep the current times. 'out': the
 * voucher as the reset left it (STORE_OK only). */
store_status store_voucher_reset(PGconn *pg, int64_t voucher_id, int64_t stock,
                                 int64_t begin_time, int64_t end_time, store_voucher *out);

/* Appends one object per voucher to the JSON array 'out' (voucherId, title,
 * initialStock, stock, orders, oversold, duplicateUsers, stockDrift,
 * beginTime, endTime): one pass over the order table. */
store_status store_stats(PGconn *pg, cJSON *out);

#endif
