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
    STORE_UNAVAILABLE     /* connection lost, timed out or refused: answer 503 */
} store_status;

typedef struct store_voucher {
    int64_t voucher_id;
    char title[256];
    int64_t stock;
    int64_t initial_stock;
    int64_t begin_time;   /* Unix seconds */
    int64_t end_time;
} store_voucher;

/* Prepares every statement on a fresh session. Returns 0 or -1. */
int store_prepare(PGconn *pg);

store_status store_voucher_get(PGconn *pg, int64_t voucher_id, store_voucher *out);

/* The whole order in one statement, hence one transaction: duplicate check,
 * optimistic deduction (stock > 0), insert of 'order_id'. A unique violation
 * rolls all of it back and reads as STORE_DUPLICATE. */
store_status store_order_create(PGconn *pg, int64_t order_id, int64_t voucher_id,
                                int64_t user_id);

store_status store_voucher_create(PGconn *pg, const char *title, int64_t stock,
                                  int64_t begin_time, int64_t end_time, int64_t *voucher_id);

/* Deletes the voucher's orders and sets stock and initial stock, in one
 * transaction; 'begin_time'/'end_time' < 0 keep the current times. */
store_status store_voucher_reset(PGconn *pg, int64_t voucher_id, int64_t stock,
                                 int64_t begin_time, int64_t end_time);

/* Appends one object per voucher to the JSON array 'out' (voucherId, title,
 * initialStock, stock, orders, oversold, duplicateUsers, stockDrift). */
store_status store_stats(PGconn *pg, cJSON *out);

#endif
