/* peers: the cluster view of GET /stats. A thread publishes this instance's
 * counters to Redis once a second; any instance reads every live one back,
 * so one GET /stats shows them all behind the same Redis. */
#ifndef SECKILL_PEERS_H
#define SECKILL_PEERS_H

#include <cJSON.h>
#include <hiredis/hiredis.h>

/* Redis keys. Live instances are a sorted set scored by last publish (ms). */
#define PEERS_INSTANCES_KEY "seckill:instances"
#define PEERS_INSTANCE_PREFIX "seckill:instance:"
#define PEERS_LIVE_MS 5000

/* Appends one object per live instance (this one from memory, the others
 * from Redis) to 'instances' and the sums to 'cluster'. Returns 0, or -1 when
 * Redis failed (NULL reply: the context must be discarded). */
int peers_json(redisContext *c, cJSON *instances, cJSON *cluster);

/* Starts / stops the thread that publishes this instance's counters (on a
 * connection of its own). Stopping removes this instance from the view. */
int peers_start(void);
void peers_stop(void);

#endif
