/* peers: the cluster view of GET /stats. A thread publishes this instance's
 * counters to Redis once a second; any instance reads every live one back
 * (stats.c, once per refresh), so one GET /stats shows them all behind the
 * same Redis. */
#ifndef SECKILL_PEERS_H
#define SECKILL_PEERS_H

#include <cJSON.h>
#include <hiredis/hiredis.h>

/* Redis keys. Live instances are a sorted set scored by last publish (ms).
 * One hash tag (conn.h's CONN_HOME_TAG): with a Redis Cluster they share
 * the slot that conn_redis_open's connection serves, and one MGET reads
 * them all. */
#define PEERS_INSTANCES_KEY "{seckill}:instances"
#define PEERS_INSTANCE_PREFIX "{seckill}:instance:"
#define PEERS_LIVE_MS 5000

/* This instance's entry of the view: its identity and counters, read now. */
cJSON *peers_self_json(void);

/* Appends the entry of every other live instance, as it last published
 * itself, to the array 'others'. Returns 0, or -1 when Redis failed (a NULL
 * reply: the context must be discarded). */
int peers_others_json(redisContext *c, cJSON *others);

/* Adds every number of 'instance' into 'cluster', recursively. */
void peers_sum(cJSON *cluster, const cJSON *instance);

/* Drops from a sum what means nothing summed: ports, means and maxima. */
void peers_cluster_tidy(cJSON *cluster);

/* Starts / stops the thread that publishes this instance's counters (on a
 * connection of its own; bgthread.h). Stopping removes this instance from
 * the view. peers_start returns 0, or -1 (logged here: a start
 * function logs its own failure); peers_stop is idempotent. */
int peers_start(void);
void peers_stop(void);

#endif
