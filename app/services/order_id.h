/* order_id: the order id worker.
 *
 * 64 bits: sign 0 | 31 bits of seconds since 2022-01-01T00:00:00Z | 32 bits
 * of a per-day counter from INCR icr:{prefix}:{yyyy:MM:dd} (UTC date of the
 * same clock reading). Unique across instances and threads. */
#ifndef SECKILL_ORDER_ID_H
#define SECKILL_ORDER_ID_H

#include <stddef.h>
#include <stdint.h>
#include <hiredis/hiredis.h>

#include "conn.h"
#include "rcluster.h"

#define ORDER_ID_EPOCH 1640995200LL   /* 2022-01-01T00:00:00Z */

typedef enum order_id_status {
    ORDER_ID_OK = 0,
    ORDER_ID_REDIS = -1,       /* Redis failed (NULL reply: the context is unusable) */
    ORDER_ID_EXHAUSTED = -2,   /* today's count no longer fits in 32 bits */
    ORDER_ID_CLOCK = -3,       /* clock before the epoch or past the 31-bit range */
    ORDER_ID_MOVED = -4        /* Redis Cluster: the node asked does not serve the
                                * counter's slot now (op->redirect says what it
                                * answered); nothing counted: route again, retry */
} order_id_status;

/* (seconds << 32) | count, or -1 when either part is out of range. */
int64_t order_id_compose(int64_t seconds, int64_t count);

/* The counter key for Unix time 'now': "icr:<prefix>:<yyyy>:<MM>:<dd>". */
void order_id_key(const char *prefix, int64_t now, char *buf, size_t n);

/* Next id with the clock read once. */
order_id_status order_id_next(redisContext *c, const char *prefix, int64_t *id);

/* Same with an explicit clock reading (tests). */
order_id_status order_id_next_at(redisContext *c, const char *prefix, int64_t now, int64_t *id);

/* The same, pipelined: order_id_send appends the INCR to c's output buffer (no
 * I/O) and returns ORDER_ID_OK, or the error order_id_recv will return (ORDER_ID_CLOCK,
 * or ORDER_ID_REDIS when the command cannot be formatted). order_id_recv sends what
 * is buffered if need be, reads the INCR's reply (every reply appended
 * before it must have been read) and frees the op: call it exactly once
 * after every send. */
typedef struct order_id_op {
    char *key;
    int64_t now, t0;
    order_id_status st;
    int sent;
    rcluster_redirect redirect;   /* ORDER_ID_MOVED: the node's answer */
} order_id_op;

order_id_status order_id_send(redisContext *c, const char *prefix, int64_t now, order_id_op *op);
order_id_status order_id_recv(redisContext *c, order_id_op *op, int64_t *id);

/* How many times a routed call sends its command at most: a redirection
 * is followed, a TRYAGAIN or CLUSTERDOWN waits 10, 20, 40 ... ms. */
#define ORDER_ID_TRIES 5

/* The next id on the worker's connections: with a Redis Cluster, on the
 * master of the counter's slot, its redirections followed (up to
 * ORDER_ID_TRIES sends); else on conn_redis's. A connection that failed is
 * dropped (conn_redis_broken). */
order_id_status order_id_take(conn_set *cs, const char *prefix, int64_t *id);

/* 'n' counts of the day of Unix time 'now' at once (one INCRBY, routed as
 * order_id_take's), for a caller that composes the ids itself with
 * order_id_compose(now - ORDER_ID_EPOCH, count): the first in *first, the
 * others after it. Redis-first admission on a Redis Cluster draws a lot's
 * counts so before its script, whose keys must share the voucher's slot. */
order_id_status order_id_take_counts(conn_set *cs, const char *prefix, int64_t now, int n,
                                     int64_t *first);

#endif
