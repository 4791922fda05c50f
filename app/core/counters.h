/* counters: the process's counters. Every layer records here; the exposition
 * (exposition.h) alone reads them. A leaf: it knows the API's error codes and
 * the lock library's outcomes (lock_status.h), nothing else. Counters are
 * process-wide relaxed atomics, so recording never blocks a thread.
 *
 * The lock library keeps its own counters (lock_counters_get), so that it
 * can be lifted out whole; the demo lock strategies, which are not part of
 * it, count here. */
#ifndef SECKILL_COUNTERS_H
#define SECKILL_COUNTERS_H

#include <stdint.h>

#include "api_err.h"
#include "lock_status.h"

/* Route indexes 0 .. COUNTERS_MAX_ROUTES - 1 are counted apart; COUNTERS_NO_ROUTE
 * (no route matched) and anything out of range share the last slot. */
#define COUNTERS_MAX_ROUTES 16
#define COUNTERS_NO_ROUTE (-1)
#define COUNTERS_ROUTE_SLOTS (COUNTERS_MAX_ROUTES + 1)

/* One answered request, recorded once: its route, the status sent, its
 * error code (API_OK for a success) and the time from its headers to its
 * answer. */
void counters_request(int route, int status, api_err err, int64_t latency_us);

enum counters_backend { COUNTERS_REDIS, COUNTERS_PG, COUNTERS_BACKEND_COUNT };

/* One call to a backing service and whether it answered (an error reply
 * counts as answered; a dead connection does not). */
void counters_backend(enum counters_backend b, int64_t latency_us, int ok);

/* counters_backend(COUNTERS_REDIS, ...) in the shape of the lock library's
 * observer hook (lock_options.observe). */
void counters_redis_call(int64_t latency_us, int ok);

/* Events counted by the service outside the lock library: the demo
 * ladder's locks, order writes refused for a stale fencing token, and
 * fence rows deleted by the sweep. */
enum counters_event {
    COUNTERS_DEMO_LOCK_ACQUIRED,
    COUNTERS_DEMO_LOCK_CONTENDED,
    COUNTERS_DEMO_LOCK_RELEASED,
    COUNTERS_DEMO_LOCK_NOT_OWNER,
    COUNTERS_STALE_TOKEN,
    COUNTERS_FENCE_SWEPT,
    COUNTERS_STREAM_CLAIMED,      /* redis: a stream entry claimed from an idle consumer */
    COUNTERS_STREAM_DEAD_LETTER,  /* ... moved to the dead-letter stream (never persisted) */
    COUNTERS_STREAM_STALE,        /* ... of a sale since reset: dropped */
    COUNTERS_STREAM_RETRY,        /* a batch Postgres refused for now: kept pending, tried again */
    COUNTERS_EVENT_COUNT
};

void counters_note(enum counters_event ev);
void counters_add(enum counters_event ev, uint64_t n);

/* One attempt of a per-user lock strategy outside the lock library (which
 * counts its own): LOCK_OK counted as acquired, LOCK_BUSY as contended.
 * Returns the outcome as every strategy answers it (user_lock.h): LOCK_OK,
 * LOCK_BUSY, or LOCK_ERR for any other. */
lock_status counters_lock_attempt(lock_status st);

/* Group commit ("batched"): one settled batch of 'buyers'. */
void counters_batch(int buyers);

/* Redis-first: one round trip to Redis carrying 'admissions' (a lot). */
void counters_admit_round(int admissions);

/* Redis-first: one batch of 'n' orders persisted by the consumer; 'lag_us'
 * for each, from its admission (acknowledgement) to its commit. */
void counters_landed_batch(int n);
void counters_landed(int64_t lag_us);

/*---- reading: for the exposition only ----*/

/* Histogram bucket bounds in seconds, the same for every histogram, in
 * increasing order: 0.1 ms to 10 s, and whatever counters_set_buckets added; one
 * more bucket counts what lies above the last bound. */
#define COUNTERS_MAX_BUCKETS 24
extern double counters_bucket_s[COUNTERS_MAX_BUCKETS];
extern int counters_nbuckets;

/* Adds 'n' bounds (seconds; the configured timeouts, so that a call cut by
 * its timeout shows as such) to the standard ones, keeping them sorted and
 * distinct (past COUNTERS_MAX_BUCKETS, the rest is left out). Once, at start,
 * before any thread records. */
void counters_set_buckets(const double *extra, int n);

/* Statuses counted apart, in this order; slot COUNTERS_NSTATUS: any other. */
#define COUNTERS_NSTATUS 15
extern const int counters_status[COUNTERS_NSTATUS];

typedef struct counters_histogram {
    uint64_t bucket[COUNTERS_MAX_BUCKETS + 1];   /* not cumulative; counters_nbuckets + 1 used */
    uint64_t sum_us;
} counters_histogram;

/* Requests answered in route slot 'route' (0 .. COUNTERS_ROUTE_SLOTS - 1),
 * status slot 'status' (0 .. COUNTERS_NSTATUS) with error code 'err'. */
uint64_t counters_requests(int route, int status, api_err err);

void counters_request_latency(int route, counters_histogram *out);
void counters_backend_latency(enum counters_backend b, counters_histogram *out);
uint64_t counters_backend_errors(enum counters_backend b);
uint64_t counters_event_count(enum counters_event ev);

/* Batches settled, buyers settled in them, and the largest batch. */
void counters_batch_counts(uint64_t *batches, uint64_t *buyers, uint64_t *largest);

/* Admission round trips, admissions sent in them, and the largest. */
void counters_admit_counts(uint64_t *rounds, uint64_t *admissions, uint64_t *largest);

/* Orders landed, their batches, the acknowledgement-to-row lag (histogram,
 * largest, last). */
void counters_landed_counts(uint64_t *orders, uint64_t *batches, counters_histogram *lag,
                       uint64_t *max_us, uint64_t *last_us);

#endif
