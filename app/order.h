/* order: one buyer's order, from the per-user lock to the answer, with the
 * lock and stock strategies the instance was started with (SPEC sections 1
 * and 6). The handler validates and reads the voucher; this does the rest. */
#ifndef SECKILL_ORDER_H
#define SECKILL_ORDER_H

#include <stdint.h>

#include "api.h"
#include "conn.h"
#include "store.h"

/* The API's answer to a Postgres outcome: the one mapping, used by every
 * handler (STORE_OK is API_OK; every failure of the database itself is
 * API_UNAVAILABLE). */
api_err order_store_error(store_status st);

/* Places the order on the caller's connections. Returns API_OK with
 * '*order_id' set, or the error to answer with; '*message' (may stay NULL)
 * is a static human text for the answer. */
api_err order_place(conn_set *cs, int64_t voucher_id, int64_t user_id, int64_t *order_id,
                    const char **message);

#endif
