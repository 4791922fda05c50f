/* consumer: the Redis-first strategy's way to Postgres (stock_redis.h).
 *
 * Two threads per instance that admits. The watch, on a Redis connection
 * of its own, runs stock_redis_watch every second (Redis's durability and
 * the stream's backlog, whose verdicts admission follows), whatever the
 * consumer waits for. With CONSUMERS=1 the consumer, a member of the group
 * STOCK_REDIS_GROUP on the stream STOCK_REDIS_STREAM with its own Redis and
 * Postgres connections; it checks once a second that its Redis context
 * still leads to the master (a Sentinel failover: it reconnects).
 * It reads up to CONSUMER_BATCH_MAX orders (XREADGROUP), at most once every
 * CONSUMER_LINGER_MS unless its last read was full (a transaction costs
 * Postgres about the same for one order as for a hundred), persists those of
 * each voucher in one transaction (store_orders_persist: one deduction of
 * n units, one multi-row insert, idempotent on the order id), and only
 * after the commit acknowledges them (XACK and the voucher's landed
 * counter in one MULTI). Every 200 ms lua/stream_trim.lua drops the
 * settled entries below every group's oldest pending one, whole stream nodes
 * at a time; the others stay in the stream (an entry pending for long, to
 * a dead consumer, holds everything after it until it is claimed), so the
 * backlog is the group's pending and undelivered entries, not the
 * stream's length.
 *
 * - Postgres down or refusing for now (read-only, a lock or statement
 *   timeout, a serialization failure, a lost connection, a shutdown): the
 *   batch stays pending to this consumer, which tries it again (its own
 *   pending entries first) after a pause that doubles from 50 ms up to
 *   CONSUMER_RETRY_MAX_MS, jittered, for as long as it takes.
 * - A consumer that died with entries delivered to it: another claims them
 *   once they were idle CONSUMER_CLAIM_IDLE_MS (XAUTOCLAIM), a bound above
 *   the slowest batch; a consumer that was only slow and commits them too
 *   takes no second unit (the order id makes the write idempotent).
 * - A poison entry (unreadable, or refused by Postgres for good, a refusal
 *   that recurs: no such voucher, no stock left in Postgres, another order
 *   of the same user, an order id that is another order's) is
 *   moved to STOCK_REDIS_DEAD with its reason and counted
 *   (seckill_stream_dead_letters_total), not retried forever; that stream
 *   is capped near DEAD_LETTERS_MAX (stream_tidy.h).
 * - An entry of a sale that was reset since (its generation is older than
 *   tb_voucher.sale_gen, read under the voucher row's lock) is dropped and
 *   counted; when Redis still holds that older sale (a reset whose load
 *   into Redis failed), Redis's copy of the voucher is dropped so that the
 *   next buyer rebuilds it from Postgres (stock_redis_retire).
 * - The names of consumers that are gone (one per restart) leave the group
 *   once idle with nothing pending (stream_tidy.h, every few seconds). */
#ifndef SECKILL_CONSUMER_H
#define SECKILL_CONSUMER_H

/* Starts the threads when the stock strategy is "redis" (else does
 * nothing): the watch, and the consumer when CONSUMERS is 1. 0, or -1 when
 * a thread cannot start (logged here: a start function logs its own
 * failure). */
int consumer_start(void);

/* Stops the threads, the consumer after its current batch (idempotent). */
void consumer_stop(void);

#endif
