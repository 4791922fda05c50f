/* idw: the order id worker.
 *
 * 64 bits: sign 0 | 31 bits of seconds since 2022-01-01T00:00:00Z | 32 bits
 * of a per-day counter from INCR icr:{prefix}:{yyyy:MM:dd} (UTC date of the
 * same clock reading). Unique across instances and threads. */
#ifndef SECKILL_IDW_H
#define SECKILL_IDW_H

#include <stddef.h>
#include <stdint.h>
#include <hiredis/hiredis.h>

#define IDW_EPOCH 1640995200LL   /* 2022-01-01T00:00:00Z */

typedef enum idw_status {
    IDW_OK = 0,
    IDW_REDIS = -1,       /* Redis failed (NULL reply: the context is unusable) */
    IDW_EXHAUSTED = -2,   /* today's count no longer fits in 32 bits */
    IDW_CLOCK = -3        /* clock before the epoch or past the 31-bit range */
} idw_status;

/* (seconds << 32) | count, or -1 when either part is out of range. */
int64_t idw_compose(int64_t seconds, int64_t count);

/* The counter key for Unix time 'now': "icr:<prefix>:<yyyy>:<MM>:<dd>". */
void idw_key(const char *prefix, int64_t now, char *buf, size_t n);

/* Next id with the clock read once. */
idw_status idw_next(redisContext *c, const char *prefix, int64_t *id);

/* Same with an explicit clock reading (tests). */
idw_status idw_next_at(redisContext *c, const char *prefix, int64_t now, int64_t *id);

/* The same, pipelined: idw_send appends the INCR to c's output buffer (no
 * I/O) and returns IDW_OK, or the error idw_recv will return (IDW_CLOCK,
 * or IDW_REDIS when the command cannot be formatted). idw_recv sends what
 * is buffered if need be, reads the INCR's reply (every reply appended
 * before it must have been read) and frees the op: call it exactly once
 * after every send. */
typedef struct idw_op {
    char *key;
    int64_t now, t0;
    idw_status st;
    int sent;
} idw_op;

idw_status idw_send(redisContext *c, const char *prefix, int64_t now, idw_op *op);
idw_status idw_recv(redisContext *c, idw_op *op, int64_t *id);

#endif
