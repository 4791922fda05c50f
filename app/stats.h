/* stats: request outcome counters of this instance (atomics), published to
 * Redis once a second so that any instance can show every live instance. */
#ifndef SECKILL_STATS_H
#define SECKILL_STATS_H

#include <stdint.h>
#include <cJSON.h>
#include <hiredis/hiredis.h>

#include "api.h"

/* Events counted outside the lock module: the demo ladder's locks (the
 * reentrant lock counts its own) and fencing-token refusals in Postgres. */
enum stats_event {
    STATS_DEMO_LOCK_ACQUIRED,
    STATS_DEMO_LOCK_CONTENDED,
    STATS_DEMO_LOCK_RELEASED,
    STATS_DEMO_LOCK_NOT_OWNER,
    STATS_STALE_TOKEN,
    STATS_EVENT_COUNT
};

void stats_note(enum stats_event ev);
uint64_t stats_event_count(enum stats_event ev);

/* Group commit ("batched"): one settled batch of 'buyers'. The figures show
 * how well commits are shared (buyers / batches) and the largest batch. */
void stats_note_batch(int buyers);
void stats_batch_counts(uint64_t *batches, uint64_t *buyers, uint64_t *largest);

/* Counts one answered request. Thread-safe, lock-free. */
void stats_record(int status, api_err err);

/* Adds this instance's "requests", "lock" and "batch" objects to 'obj'. */
void stats_self_json(cJSON *obj);

/* Appends one object per live instance (this one from memory, the others
 * from Redis) to 'instances' and the sums to 'cluster'. Returns 0, or -1 when
 * Redis failed (NULL reply: the context must be discarded). */
int stats_cluster_json(redisContext *c, cJSON *instances, cJSON *cluster);

/* Starts / stops the thread that publishes this instance's counters. */
int stats_publisher_start(void);
void stats_publisher_stop(void);

/* Redis keys. Live instances are a sorted set scored by last publish (ms). */
#define STATS_INSTANCES_KEY "seckill:instances"
#define STATS_INSTANCE_PREFIX "seckill:instance:"
#define STATS_LIVE_MS 5000

#endif
