/* stock_redis_watch: the orders stream's figures. The watch, every second
 * on every instance that admits (consumer.h runs it on a thread and a
 * connection of its own, whether or not the instance consumes), runs the
 * durability check (stock_redis_durability.h) and measures the stream's
 * backlog against STREAM_BACKLOG_MAX; admission follows both verdicts.
 * GET /stats gets the same figures read afresh, with each voucher's Redis
 * side against Postgres's.
 *
 * What the watch found last is kept in atomics: written by the watch's one
 * thread, read by any. The other calls work on the caller's connection
 * and leave it to the caller. */
#ifndef SECKILL_STOCK_REDIS_WATCH_H
#define SECKILL_STOCK_REDIS_WATCH_H

#include <stdint.h>
#include <cJSON.h>
#include <hiredis/hiredis.h>

#include "conn.h"
#include "rcluster.h"

/* The watch: the durability check, and the stream's backlog against
 * STREAM_BACKLOG_MAX, whose verdict admission follows (503 past it). 0,
 * or -1 when Redis failed. */
int stock_redis_watch(redisContext *c);

/* The same on a Redis Cluster, through the watch's own routing handle
 * 'rc': the durability check on every master (durable only when each
 * is), and, once 'listed' (the vouchers were listed), the backlog summed
 * over the streams of the vouchers ids[0..n) (each voucher's own, on its
 * slot's master). 0, or -1 when Redis failed or answered a redirection
 * (the caller resets 'rc': the map is read again). */
int stock_redis_watch_cluster(rcluster *rc, const int64_t *ids, size_t n, int listed);

/* What the watch found last; figures -1 until known. */
typedef struct stock_redis_figures {
    int durable;              /* acknowledgement durable as REDIS_ORDER_DURABILITY asks */
    int over_backlog;         /* backlog past STREAM_BACKLOG_MAX: admission refused */
    int64_t backlog;          /* admitted orders not yet settled */
    int64_t oldest_ms;        /* the oldest one's age (0: none) */
} stock_redis_figures;

void stock_redis_watch_get(stock_redis_figures *out);

/* 1 when the watch last found the backlog past STREAM_BACKLOG_MAX. */
int stock_redis_over_backlog(void);

/* The milliseconds of a stream id "<ms>-<seq>"; -1 for NULL. */
int64_t stock_redis_id_ms(const char *id);

/* Adds to each voucher of 'vouchers' (store_stats's array) its Redis side
 * and whether both sides agree, and to 'root' the stream's figures
 * ("redisFirst"; on a Redis Cluster summed over the vouchers' streams),
 * on cs's connections. 0, or -1 when Redis failed (the connection marked
 * broken). */
int stock_redis_stats(conn_set *cs, cJSON *root, cJSON *vouchers);

#endif
