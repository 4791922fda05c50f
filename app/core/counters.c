/* counters: relaxed atomic counters and fixed-bucket histograms. */
#include "counters.h"

#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

double counters_bucket_s[COUNTERS_MAX_BUCKETS] = { 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                         0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                         1,      2.5,     5,      10 };
int counters_nbuckets = 16;

const int counters_status[COUNTERS_NSTATUS] = { 200, 201, 400, 401, 403, 404, 405, 409,
                                      413, 414, 431, 500, 502, 503, 504 };

typedef struct histogram {
    _Atomic uint64_t bucket[COUNTERS_MAX_BUCKETS + 1];
    _Atomic uint64_t sum_us;
} histogram;

/* Statistics only: nothing is ordered by them, hence relaxed everywhere. */
static _Atomic uint64_t requests[COUNTERS_ROUTE_SLOTS][COUNTERS_NSTATUS + 1][API_ERR_COUNT];
static histogram route_latency[COUNTERS_ROUTE_SLOTS];
static histogram backend_latency[COUNTERS_BACKEND_COUNT];
static _Atomic uint64_t backend_errors[COUNTERS_BACKEND_COUNT];
static _Atomic uint64_t events[COUNTERS_EVENT_COUNT];
/* Things done in groups: how many groups, members in all, the largest. */
typedef struct group {
    _Atomic uint64_t n, members, largest;
} group;
static group batch_group, admit_group;
static histogram landed_lag;
static _Atomic uint64_t landed_orders, landed_batches, landed_max_us, landed_last_us;

static void observe(histogram *h, int64_t us)
{
    size_t i = 0;

    if (us < 0)
        us = 0;
    while (i < (size_t)counters_nbuckets && (double)us > counters_bucket_s[i] * 1e6)
        i++;
    atomic_fetch_add_explicit(&h->bucket[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_us, (uint64_t)us, memory_order_relaxed);
}

static void snapshot(const histogram *h, counters_histogram *out)
{
    for (size_t i = 0; i <= (size_t)counters_nbuckets; i++)
        out->bucket[i] = atomic_load_explicit(&h->bucket[i], memory_order_relaxed);
    out->sum_us = atomic_load_explicit(&h->sum_us, memory_order_relaxed);
}

void counters_set_buckets(const double *extra, int n)
{
    for (int e = 0; e < n; e++) {
        double b = extra[e];
        int i = 0;

        if (!(b > 0) || counters_nbuckets >= COUNTERS_MAX_BUCKETS)
            continue;
        while (i < counters_nbuckets && counters_bucket_s[i] < b * (1 - 1e-9))
            i++;
        if (i < counters_nbuckets && counters_bucket_s[i] <= b * (1 + 1e-9))
            continue;                          /* already a bound */
        memmove(&counters_bucket_s[i + 1], &counters_bucket_s[i],
                (size_t)(counters_nbuckets - i) * sizeof counters_bucket_s[0]);
        counters_bucket_s[i] = b;
        counters_nbuckets++;
    }
}

static int route_slot(int route)
{
    return route >= 0 && route < COUNTERS_MAX_ROUTES ? route : COUNTERS_MAX_ROUTES;
}

void counters_request(int route, int status, api_err err, int64_t latency_us)
{
    size_t s = 0;
    int r = route_slot(route);

    while (s < COUNTERS_NSTATUS && counters_status[s] != status)
        s++;
    if ((unsigned)err >= API_ERR_COUNT)
        err = API_OK;
    atomic_fetch_add_explicit(&requests[r][s][err], 1, memory_order_relaxed);
    observe(&route_latency[r], latency_us);
}

void counters_backend(enum counters_backend b, int64_t latency_us, int ok)
{
    if ((unsigned)b >= COUNTERS_BACKEND_COUNT)
        return;
    observe(&backend_latency[b], latency_us);
    if (!ok)
        atomic_fetch_add_explicit(&backend_errors[b], 1, memory_order_relaxed);
}

void counters_redis_call(int64_t latency_us, int ok)
{
    counters_backend(COUNTERS_REDIS, latency_us, ok);
}

void counters_note(enum counters_event ev)
{
    counters_add(ev, 1);
}

void counters_add(enum counters_event ev, uint64_t n)
{
    if ((unsigned)ev < COUNTERS_EVENT_COUNT)
        atomic_fetch_add_explicit(&events[ev], n, memory_order_relaxed);
}

lock_status counters_lock_attempt(lock_status st)
{
    if (st == LOCK_OK)
        counters_note(COUNTERS_DEMO_LOCK_ACQUIRED);
    else if (st == LOCK_BUSY)
        counters_note(COUNTERS_DEMO_LOCK_CONTENDED);
    else
        st = LOCK_ERR;
    return st;
}

static void group_add(group *g, int members)
{
    uint64_t n = (uint64_t)members, seen = atomic_load_explicit(&g->largest, memory_order_relaxed);

    atomic_fetch_add_explicit(&g->n, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&g->members, n, memory_order_relaxed);
    while (n > seen && !atomic_compare_exchange_weak_explicit(&g->largest, &seen, n,
                                                              memory_order_relaxed,
                                                              memory_order_relaxed))
        ;
}

static void group_counts(group *g, uint64_t *n, uint64_t *members, uint64_t *largest)
{
    *n = atomic_load_explicit(&g->n, memory_order_relaxed);
    *members = atomic_load_explicit(&g->members, memory_order_relaxed);
    *largest = atomic_load_explicit(&g->largest, memory_order_relaxed);
}

void counters_batch(int buyers)
{
    group_add(&batch_group, buyers);
}

void counters_admit_round(int admissions)
{
    group_add(&admit_group, admissions);
}

uint64_t counters_requests(int route, int status, api_err err)
{
    if (route < 0 || route >= COUNTERS_ROUTE_SLOTS || status < 0 || status > COUNTERS_NSTATUS ||
        (unsigned)err >= API_ERR_COUNT)
        return 0;
    return atomic_load_explicit(&requests[route][status][err], memory_order_relaxed);
}

void counters_request_latency(int route, counters_histogram *out)
{
    snapshot(&route_latency[route_slot(route)], out);
}

void counters_backend_latency(enum counters_backend b, counters_histogram *out)
{
    snapshot(&backend_latency[(unsigned)b < COUNTERS_BACKEND_COUNT ? b : COUNTERS_REDIS], out);
}

uint64_t counters_backend_errors(enum counters_backend b)
{
    return (unsigned)b < COUNTERS_BACKEND_COUNT
               ? atomic_load_explicit(&backend_errors[b], memory_order_relaxed)
               : 0;
}

uint64_t counters_event_count(enum counters_event ev)
{
    return (unsigned)ev < COUNTERS_EVENT_COUNT ? atomic_load_explicit(&events[ev], memory_order_relaxed)
                                          : 0;
}

void counters_batch_counts(uint64_t *b, uint64_t *buyers, uint64_t *largest)
{
    group_counts(&batch_group, b, buyers, largest);
}

void counters_admit_counts(uint64_t *rounds, uint64_t *admissions, uint64_t *largest)
{
    group_counts(&admit_group, rounds, admissions, largest);
}

void counters_landed_batch(int n)
{
    atomic_fetch_add_explicit(&landed_batches, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&landed_orders, (uint64_t)n, memory_order_relaxed);
}

void counters_landed(int64_t lag_us)
{
    uint64_t us = lag_us < 0 ? 0 : (uint64_t)lag_us;
    uint64_t seen = atomic_load_explicit(&landed_max_us, memory_order_relaxed);

    observe(&landed_lag, (int64_t)us);
    atomic_store_explicit(&landed_last_us, us, memory_order_relaxed);
    while (us > seen && !atomic_compare_exchange_weak_explicit(&landed_max_us, &seen, us,
                                                               memory_order_relaxed,
                                                               memory_order_relaxed))
        ;
}

void counters_landed_counts(uint64_t *orders, uint64_t *b, counters_histogram *lag, uint64_t *max_us,
                       uint64_t *last_us)
{
    *orders = atomic_load_explicit(&landed_orders, memory_order_relaxed);
    *b = atomic_load_explicit(&landed_batches, memory_order_relaxed);
    snapshot(&landed_lag, lag);
    *max_us = atomic_load_explicit(&landed_max_us, memory_order_relaxed);
    *last_us = atomic_load_explicit(&landed_last_us, memory_order_relaxed);
}
