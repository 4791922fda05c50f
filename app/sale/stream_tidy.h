/* stream_tidy: the upkeep of the Redis-first orders stream (stock_redis.h):
 * the consumer names of its group, and its dead letters.
 *
 * - Consumer names. Each instance process reads under a name of its own
 *   (consumer.h), so every restart leaves one behind in the group.
 *   lua/group_tidy.lua refreshes the caller's own name (Redis 7.0 does not
 *   on a read that finds nothing new), then removes, atomically, the names
 *   with no pending entry that were idle longer than
 *   CONSUMER_REMOVE_IDLE_MS. A dead consumer's pending entries are claimed
 *   first (XAUTOCLAIM, CONSUMER_CLAIM_IDLE_MS); only then does its name go.
 * - Dead letters. An entry no batch could persist is copied to
 *   STOCK_REDIS_DEAD with the order's fields and its reason; the stream is
 *   capped near DEAD_LETTERS_MAX entries (XADD MAXLEN ~, whole nodes).
 *   lua/dead_replay.lua puts them back in the orders stream once their
 *   cause is fixed, each moved in one atomic step, so a replay repeated
 *   queues nothing twice. */
#ifndef SECKILL_STREAM_TIDY_H
#define SECKILL_STREAM_TIDY_H

#include <stddef.h>
#include <stdint.h>
#include <hiredis/hiredis.h>

#include "conn.h"
#include "stock_redis_load.h"

/* Reads lua/group_tidy.lua and lua/dead_replay.lua from 'dir'. Call once
 * before threads start. 0, or -1 with the reason in 'err'. */
int stream_tidy_load(const char *dir, char *err, size_t errlen);

/* How often the consumer runs stream_tidy_consumers, ms: every 10 s, or
 * every third of CONSUMER_REMOVE_IDLE_MS when that is shorter. */
int stream_tidy_every_ms(void);

/* Refreshes 'own_name' in the group of the orders stream 'stream' and
 * removes the consumers that are gone (group_tidy.lua). The number
 * removed (each logged), or -1 when Redis failed (c->err set when the
 * connection did). */
int stream_tidy_consumers(redisContext *c, const char *stream, const char *own_name);

/* Appends to c's output buffer (no I/O) the XADD of one dead letter to
 * the dead-letter stream 'dead' (stock_redis_stream's), capped near DEAD_LETTERS_MAX entries: the original
 * entry's id, the order's fields and the reason. 't' and 'c' (the order
 * id's seconds and count) are written only when 'with_id' is set: an entry
 * without them is not replayable. 0, or -1 when hiredis cannot format it. */
typedef struct stream_tidy_dead {
    const char *dead;                /* the dead-letter stream */
    const char *entry;               /* the orders stream's entry id */
    int64_t voucher_id, user_id, order_id, gen;
    int with_id;                     /* order_id is a whole id: write t and c */
    const char *reason;
    const char *consumer;            /* the consumer that gave up on it */
} stream_tidy_dead;
int stream_tidy_dead_append(redisContext *c, const stream_tidy_dead *d);

/* What a replay did. */
typedef struct stream_tidy_replayed {
    int64_t replayed;                /* entries put back in the orders stream */
    int64_t left;                    /* dead letters still there after the call */
    int64_t unreplayable;            /* of those, the ones passed over (no t and c) */
} stream_tidy_replayed;

/* Puts up to 'max' dead letters of 's' back in its orders stream
 * (dead_replay.lua). 0, or -1 when Redis failed (c->err set when the
 * connection did). */
int stream_tidy_replay(redisContext *c, const stock_redis_stream *s, int64_t max,
                       stream_tidy_replayed *out);

/* stream_tidy_replay on cs's connections: the one stream on one Redis; on
 * a Redis Cluster each voucher's (listed by Postgres), each on its slot's
 * master, up to 'max' in all; 'out' the sums. 0, or -1 when Redis or
 * Postgres failed (a connection that failed is marked broken). */
int stream_tidy_replay_all(conn_set *cs, int64_t max, stream_tidy_replayed *out);

#endif
