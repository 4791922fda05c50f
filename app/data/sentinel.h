/* sentinel: where the Redis master is, when Redis Sentinel watches it
 * (REDIS_SENTINELS, REDIS_MASTER_NAME).
 *
 * The process asks the Sentinels once at start (SENTINEL
 * get-master-addr-by-name) and refuses to start when none answers or none
 * knows the name. Then one thread follows the master: it listens for
 * Sentinel's "+switch-master" notice (one subscription on one Sentinel,
 * moved to the next one when that Sentinel goes away), asks again every
 * second, and at once when a connection reports that the address it was
 * given failed or is no longer the master (sentinel_suspect). Nothing here
 * opens a connection to the master itself: conn does, with the address
 * sentinel_master gives, and checks with ROLE that it reached the master.
 *
 * Callers never wait on a Sentinel: sentinel_master returns the address
 * known now (during a failover: the old one, whose connection then fails
 * fast or times out, and the request gets 503), and the thread updates it.
 *
 * Without REDIS_SENTINELS every function is a no-op and sentinel_enabled
 * is 0. */
#ifndef SECKILL_SENTINEL_H
#define SECKILL_SENTINEL_H

#include <stddef.h>
#include <stdint.h>

typedef enum sentinel_start_status {
    SENTINEL_STARTED = 0,
    SENTINEL_UNREACHABLE = -1,      /* no Sentinel of the list answered */
    SENTINEL_UNKNOWN_MASTER = -2,   /* the ones that answered know no such master */
    SENTINEL_NO_THREAD = -3         /* the follower thread could not start */
} sentinel_start_status;

/* 1 when REDIS_SENTINELS is set. */
int sentinel_enabled(void);

/* Asks the Sentinels for the master of REDIS_MASTER_NAME, then starts the
 * follower thread. A failure is logged here, once (a start function logs
 * its own failure), with what each Sentinel answered. Call once, before
 * any Redis connection is opened. Without REDIS_SENTINELS:
 * SENTINEL_STARTED and nothing runs. */
sentinel_start_status sentinel_start(void);

/* Stops and joins the follower thread. Idempotent. */
void sentinel_stop(void);

/* The master's address as known now ('host' NUL-terminated, at most n-1
 * bytes). Returns its generation: a number that changes every time the
 * master's address does. 0 (and host "") when no master is known. */
uint64_t sentinel_master(char *host, size_t n, int *port);

/* The generation alone (an atomic read; cheap enough for every request). */
uint64_t sentinel_generation(void);

/* A connection to host:port failed, timed out, or found a replica there:
 * the follower asks the Sentinels now (at most every 50 ms). Any thread;
 * never blocks on the network. */
void sentinel_suspect(const char *host, int port);

/* For /stats and /metrics. */
typedef struct sentinel_view {
    char master[300];          /* "host:port" in use, "" when unknown */
    uint64_t failovers;        /* master changes seen since start */
    uint64_t switch_notices;   /* +switch-master notices received */
    uint64_t queries;          /* get-master-addr-by-name asked */
    uint64_t query_errors;     /* ... and no Sentinel answered */
} sentinel_view;

void sentinel_view_get(sentinel_view *v);

#endif
