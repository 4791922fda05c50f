/* stock_redis: Redis-first admission, the "redis" stock strategy (stock.h).
 *
 * A voucher's stock and buyers live in Redis (loaded when it is created or
 * reset, rebuilt from Postgres when missing). One Lua script
 * (lua/order_admit.lua) decides a lot of buyers atomically, each as if
 * alone - sale window, stock, buyer - and for each admitted one takes the
 * unit, records the buyer, draws the order id and appends the order to the
 * stream STOCK_REDIS_STREAM. Postgres gets the orders
 * later, from the consumers (consumer.h), in batches.
 *
 * A 200 is sent only when the order survives a Redis crash
 * (REDIS_ORDER_DURABILITY): "aof" requires Redis to run with appendonly
 * yes and appendfsync always, which fsyncs the script's writes before its
 * reply is sent (checked at start and every second; a Redis that does not
 * answers 503); "wait" sends WAIT for REDIS_ORDER_WAIT_REPLICAS replicas
 * behind the script; "none" answers at once (unsafe: the ladder's step).
 *
 * Where the per-user lock and the fencing token apply: not here. The
 * script is the one-order-per-user check, atomic in Redis, so a lock
 * around it adds a round trip and no safety; the orders are written to
 * Postgres by consumers, not by lock holders, and their idempotence comes
 * from the order id (and the unique constraint on user and voucher), not
 * from a fencing token. */
#ifndef SECKILL_STOCK_REDIS_H
#define SECKILL_STOCK_REDIS_H

#include <stddef.h>
#include <stdint.h>
#include <cJSON.h>
#include <hiredis/hiredis.h>

#include "store_voucher.h"

#define STOCK_REDIS_STREAM "seckill:orders"       /* admitted orders, until trimmed once settled */
#define STOCK_REDIS_DEAD "seckill:orders:dead"    /* entries no batch could persist */
#define STOCK_REDIS_GROUP "seckill"               /* the consumers' group */

/* "seckill:v:{<id>}" followed by 'suffix' ("" for the hash, ":buyers",
 * ":landed"). */
void stock_redis_key(char *buf, size_t n, int64_t voucher_id, const char *suffix);

/* Reads the scripts and, when Redis answers, checks its durability
 * setting. Call once before serving. 0, or -1 with 'err'. */
int stock_redis_start(char *err, size_t errlen);

/* Checks on 'c' that Redis acknowledges durably as REDIS_ORDER_DURABILITY
 * asks, and remembers the verdict for the admissions (the consumer calls
 * it every second). 0: durable (or none asked); 1: not durable; -1: Redis
 * failed (c->err may be set). */
int stock_redis_check_durability(redisContext *c);

/* The watch, every second on every instance that admits (consumer.h runs
 * it, whether or not the instance consumes): the durability check above,
 * and the stream's backlog against STREAM_BACKLOG_MAX, whose verdict
 * admission follows (503 past it). 0, or -1 when Redis failed. */
int stock_redis_watch(redisContext *c);

/* Drops the voucher's Redis state when it holds an older sale than
 * 'pg_sale' (Postgres's tb_voucher.sale_gen), so that its next buyer
 * rebuilds it from Postgres (lua/stock_retire.lua): for a consumer whose
 * orders Postgres refused as of an older sale. 1 dropped, 0 left as it
 * is, -1 when Redis failed. */
int stock_redis_retire(redisContext *c, int64_t voucher_id, int64_t pg_sale);

/* What the watch found last; figures -1 until known. */
typedef struct stock_redis_figures {
    int durable;              /* acknowledgement durable as REDIS_ORDER_DURABILITY asks */
    int over_backlog;         /* backlog past STREAM_BACKLOG_MAX: admission refused */
    int64_t backlog;          /* admitted orders not yet settled */
    int64_t oldest_ms;        /* the oldest one's age (0: none) */
} stock_redis_figures;

void stock_redis_watch_get(stock_redis_figures *out);

/* The voucher's new sale in Redis, after its creation or reset in
 * Postgres: stock, window and sale (sale_gen) from 'v', no buyers. The
 * previous sale's undrained orders are dropped by the consumers, which
 * compare each order's sale with Postgres's under the voucher row's lock.
 * Redis holding this sale or a newer one already is left as it is. 0, or
 * -1 when Redis failed. */
int stock_redis_load(redisContext *c, const store_voucher *v);

/* Adds to each voucher of 'vouchers' (store_stats's array) its Redis side
 * and whether both sides agree, and to 'root' the stream's figures
 * ("redisFirst"). 0, or -1 when Redis failed. */
int stock_redis_stats(redisContext *c, cJSON *root, cJSON *vouchers);

#endif
