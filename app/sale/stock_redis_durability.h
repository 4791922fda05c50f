/* stock_redis_durability: whether Redis acknowledges an admitted order
 * durably, as REDIS_ORDER_DURABILITY asks (stock_redis.h says what each
 * mode means).
 *
 * "aof": CONFIG GET appendonly and appendfsync, at start and then every
 * second (the watch, stock_redis_watch.h); a Redis that refuses CONFIG
 * cannot be checked and counts as not durable. "wait": WAIT for
 * REDIS_ORDER_WAIT_REPLICAS replicas after each admitting call. "none":
 * nothing checked.
 *
 * The verdict is one atomic of the process: written by whoever checked
 * last, read by every worker and by the figures. Each call works on the
 * caller's connection 'c' and leaves it to the caller (c->err set when it
 * failed). */
#ifndef SECKILL_STOCK_REDIS_DURABILITY_H
#define SECKILL_STOCK_REDIS_DURABILITY_H

#include <stddef.h>
#include <hiredis/hiredis.h>

/* At start, once: warns of "none", and checks a Redis that answers (on a
 * connection of its own; on a Redis Cluster, every master) so that the
 * instance refuses to start against one that would lose acknowledged
 * orders; one not up yet is checked when it is. 0, or -1 with 'err'. */
int stock_redis_durability_start(char *err, size_t errlen);

/* Checks on 'c' that Redis acknowledges durably as REDIS_ORDER_DURABILITY
 * asks, and remembers the verdict (logged when it changes). 0: durable
 * (or none asked); 1: not durable; -1: Redis failed. */
int stock_redis_durability_check(redisContext *c);

/* The same for the n masters c[0..n) of a Redis Cluster: durable only when
 * every one is; -1 (the verdict kept as it was) when one failed. */
int stock_redis_durability_check_all(redisContext *const *c, int n);

/* 1 when an admission may be acknowledged as far as the verdict goes: it
 * is durable, or it was not known yet and a check on 'c' says durable (on
 * a Redis Cluster that check is not kept as the verdict: it is one
 * master's). */
int stock_redis_durability_holds(redisContext *c);

/* After a call that admitted orders, in mode "wait": WAIT on 'c'. 0 when
 * the mode asks no WAIT or enough replicas acknowledged; 1 when too few
 * did; -1 when Redis failed (or 'c' had already). */
int stock_redis_durability_wait(redisContext *c);

/* The verdict for the figures: 1 when durable; and in words. */
int stock_redis_durability_ok(void);
const char *stock_redis_durability_text(void);

#endif
