/* store_voucher: the voucher's rows: read (alone, or with its buyers in
 * one snapshot), created, reset for a new sale, and the per-voucher counts
 * of /stats. */
#ifndef SECKILL_STORE_VOUCHER_H
#define SECKILL_STORE_VOUCHER_H

#include <cJSON.h>
#include "store.h"

typedef struct store_voucher {
    int64_t voucher_id;
    char title[256];
    int64_t stock;
    int64_t initial_stock;
    int64_t begin_time;   /* Unix seconds */
    int64_t end_time;
    int64_t sale_gen;     /* the sale: 1 at creation, one more at each reset */
} store_voucher;

/* Prepares this module's statements on a fresh session (store_prepare).
 * Returns 0 or -1. */
int store_voucher_prepare(PGconn *pg);

store_status store_voucher_get(PGconn *pg, int64_t voucher_id, store_voucher *out);

/* Every voucher's id, ascending ('*ids' malloc'ed, caller frees; set
 * even when empty). */
store_status store_voucher_ids(PGconn *pg, int64_t **ids, size_t *n);

/* The users who ordered 'voucher_id' ('*users' malloc'ed, caller frees;
 * set even when empty). */
store_status store_voucher_buyers(PGconn *pg, int64_t voucher_id, int64_t **users, size_t *n);

/* store_voucher_get and store_voucher_buyers read in one snapshot (a
 * read-only REPEATABLE READ transaction): an order committed meanwhile is
 * in both or in neither. '*users' as for store_voucher_buyers (NULL on
 * failure). */
store_status store_voucher_snapshot(PGconn *pg, int64_t voucher_id, store_voucher *v,
                                    int64_t **users, size_t *n);

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
