/* broadcast: instance-to-instance notices over Redis pub/sub. Today one notice:
 * a voucher was reset, so every instance drops its cached voucher state
 * (voucher_cache). One subscriber thread per process, with its own connection; a
 * lost connection also drops the caches, since notices may have been missed. */
#ifndef SECKILL_BROADCAST_H
#define SECKILL_BROADCAST_H

#include <stdint.h>
#include <hiredis/hiredis.h>

#define BROADCAST_RESET_CHANNEL "seckill:voucher-reset"

/* Starts the subscriber thread (bgthread.h). Returns 0, or -1 (logged
 * here: a start function logs its own failure).
 * broadcast_stop stops and joins it, within 200 ms (its poll); idempotent. */
int broadcast_start(void);
void broadcast_stop(void);

/* Announces a reset of 'voucher_id' to every instance (this one included)
 * on the caller's connection, and waits up to 'wait_ms' until every
 * receiver has dropped its cache ('*acked' of '*receivers', PUBLISH's
 * count). Returns 0, or -1 when Redis failed. */
int broadcast_voucher_reset(redisContext *c, int64_t voucher_id, int wait_ms,
                            long long *receivers, long long *acked);

#endif
