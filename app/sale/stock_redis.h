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
 * from a fencing token.
 *
 * The strategy's parts, each with its header (included here for the
 * modules outside the strategy):
 *
 *   stock_redis.c             the strategy's entry points (stock_redis_first,
 *                             stock.h) and admission: one buyer's call, or
 *                             lots of buyers in one call
 *   stock_redis_durability.c  the durability check: CONFIG GET, WAIT
 *   stock_redis_load.c        the voucher's state in Redis and its names:
 *                             loaded, rebuilt from Postgres, retired
 *   stock_redis_watch.c       the stream's backlog and oldest age, the
 *                             watch's verdicts, the figures of /stats
 *
 * Admission in lots: the buyers of every worker and event thread of the
 * process queue in one list, behind one mutex, for the workers that send
 * them (at most REDIS_ADMIT_PIPELINES of them, and at most THREADS - 1). */
#ifndef SECKILL_STOCK_REDIS_H
#define SECKILL_STOCK_REDIS_H

#include <stddef.h>

#include "stock_redis_durability.h"
#include "stock_redis_load.h"
#include "stock_redis_watch.h"

/* Reads the scripts and, when Redis answers, checks its durability
 * setting. Call once before serving. 0, or -1 with 'err'. */
int stock_redis_start(char *err, size_t errlen);

#endif
