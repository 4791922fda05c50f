/* rec: the process's counters. Every layer records here; the exposition
 * (expo.h) alone reads them. A leaf: it knows the API's error codes and
 * nothing else of the service. Counters are process-wide relaxed atomics,
 * so recording never blocks a thread.
 *
 * The lock library keeps its own counters (lock_counters_get), so that it
 * can be lifted out whole; the demo lock strategies, which are not part of
 * it, count here. */
#ifndef SECKILL_REC_H
#define SECKILL_REC_H

#include <stdint.h>

#include "api.h"

/* Route indexes 0 .. REC_MAX_ROUTES - 1 are counted apart; REC_NO_ROUTE
 * (no route matched) and anything out of range share the last slot. */
#define REC_MAX_ROUTES 16
#define REC_NO_ROUTE (-1)
#define REC_ROUTE_SLOTS (REC_MAX_ROUTES + 1)

/* One answered request, recorded once: its route, the status sent, its
 * error code (API_OK for a success) and the time from its headers to its
 * answer. */
void rec_request(int route, int status, api_err err, int64_t latency_us);

enum rec_backend { REC_REDIS, REC_PG, REC_BACKEND_COUNT };

/* One call to a backing service and whether it answered (an error reply
 * counts as answered; a dead connection does not). */
void rec_backend(enum rec_backend b, int64_t latency_us, int ok);

/* rec_backend(REC_REDIS, ...) in the shape of the lock library's
 * observer hook (lock_options.observe). */
void rec_redis_call(int64_t latency_us, int ok);

/* Events counted by the service outside the lock library: the demo
 * ladder's locks, order writes refused for a stale fencing token, and
 * fence rows deleted by the sweep. */
enum rec_event {
    REC_DEMO_LOCK_ACQUIRED,
    REC_DEMO_LOCK_CONTENDED,
    REC_DEMO_LOCK_RELEASED,
    REC_DEMO_LOCK_NOT_OWNER,
    REC_STALE_TOKEN,
    REC_FENCE_SWEPT,
    REC_STREAM_CLAIMED,      /* redis: a stream entry claimed from an idle consumer */
    REC_STREAM_DEAD_LETTER,  /* ... moved to the dead-letter stream (never persisted) */
    REC_STREAM_STALE,        /* ... of a sale since reset: dropped */
    REC_STREAM_RETRY,        /* a batch Postgres refused for now: kept pending, tried again */
    REC_EVENT_COUNT
};

void rec_note(enum rec_event ev);
void rec_add(enum rec_event ev, uint64_t n);

/* Group commit ("batched"): one settled batch of 'buyers'. */
void rec_batch(int buyers);

/* Redis-first: one round trip to Redis carrying 'admissions' (a lot). */
void rec_admit_round(int admissions);

/* Redis-first: one batch of 'n' orders persisted by the consumer; 'lag_us'
 * for each, from its admission (acknowledgement) to its commit. */
void rec_landed_batch(int n);
void rec_landed(int64_t lag_us);

/*---- reading: for the exposition only ----*/

/* Histogram bucket bounds in seconds, the same for every histogram, in
 * increasing order: 0.1 ms to 10 s, and whatever rec_set_buckets added; one
 * more bucket counts what lies above the last bound. */
#define REC_MAX_BUCKETS 24
extern double rec_bucket_s[REC_MAX_BUCKETS];
extern int rec_nbuckets;

/* Adds 'n' bounds (seconds; the configured timeouts, so that a call cut by
 * its timeout shows as such) to the standard ones, keeping them sorted and
 * distinct (past REC_MAX_BUCKETS, the rest is left out). Once, at start,
 * before any thread records. */
void rec_set_buckets(const double *extra, int n);

/* Statuses counted apart, in this order; slot REC_NSTATUS: any other. */
#define REC_NSTATUS 15
extern const int rec_status[REC_NSTATUS];

typedef struct rec_histogram {
    uint64_t bucket[REC_MAX_BUCKETS + 1];   /* not cumulative; rec_nbuckets + 1 used */
    uint64_t sum_us;
} rec_histogram;

/* Requests answered in route slot 'route' (0 .. REC_ROUTE_SLOTS - 1),
 * status slot 'status' (0 .. REC_NSTATUS) with error code 'err'. */
uint64_t rec_requests(int route, int status, api_err err);

void rec_request_latency(int route, rec_histogram *out);
void rec_backend_latency(enum rec_backend b, rec_histogram *out);
uint64_t rec_backend_errors(enum rec_backend b);
uint64_t rec_event_count(enum rec_event ev);

/* Batches settled, buyers settled in them, and the largest batch. */
void rec_batch_counts(uint64_t *batches, uint64_t *buyers, uint64_t *largest);

/* Admission round trips, admissions sent in them, and the largest. */
void rec_admit_counts(uint64_t *rounds, uint64_t *admissions, uint64_t *largest);

/* Orders landed, their batches, the acknowledgement-to-row lag (histogram,
 * largest, last). */
void rec_landed_counts(uint64_t *orders, uint64_t *batches, rec_histogram *lag,
                       uint64_t *max_us, uint64_t *last_us);

#endif
