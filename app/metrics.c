/* metrics: counters and histograms in the Prometheus text format 0.0.4. */
#include "metrics.h"
#include "config.h"
#include "lock.h"
#include "stats.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <string.h>

/* Fixed buckets (seconds), the same for every histogram. */
static const double bucket_s[] = { 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                   0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5 };
#define NBUCKETS (sizeof bucket_s / sizeof bucket_s[0])

static const int status_of[] = { 200, 201, 400, 401, 403, 404, 405, 409, 413, 414, 431,
                                 500, 502, 503, 504 };
#define NSTATUS (sizeof status_of / sizeof status_of[0])
#define NROUTES (METRICS_MAX_ROUTES + 1)        /* the last one: no route matched */

typedef struct histogram {
    _Atomic uint64_t bucket[NBUCKETS + 1];      /* +1: above the last bound */
    _Atomic uint64_t sum_us;
} histogram;

static const char *const *route_labels;
static int route_n;
static _Atomic uint64_t requests[NROUTES][NSTATUS + 1][API_ERR_COUNT];
static histogram route_latency[NROUTES];
static histogram backend_latency[METRICS_BACKEND_COUNT];
static _Atomic uint64_t backend_errors[METRICS_BACKEND_COUNT];
static const char *const backend_name[METRICS_BACKEND_COUNT] = { "redis", "postgres" };

void metrics_set_routes(const char *const *labels, int n)
{
    route_labels = labels;
    route_n = n < METRICS_MAX_ROUTES ? n : METRICS_MAX_ROUTES;
}

static void observe(histogram *h, int64_t us)
{
    size_t i = 0;

    if (us < 0)
        us = 0;
    while (i < NBUCKETS && (double)us > bucket_s[i] * 1e6)
        i++;
    atomic_fetch_add_explicit(&h->bucket[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_us, (uint64_t)us, memory_order_relaxed);
}

void metrics_request(int route, int status, api_err err, int64_t latency_us)
{
    size_t s = 0;
    int r = route >= 0 && route < route_n ? route : METRICS_MAX_ROUTES;

    while (s < NSTATUS && status_of[s] != status)
        s++;
    if ((unsigned)err >= API_ERR_COUNT)
        err = API_OK;
    atomic_fetch_add_explicit(&requests[r][s][err], 1, memory_order_relaxed);
    observe(&route_latency[r], latency_us);
}

void metrics_backend(enum metrics_backend b, int64_t latency_us, int ok)
{
    if ((unsigned)b >= METRICS_BACKEND_COUNT)
        return;
    observe(&backend_latency[b], latency_us);
    if (!ok)
        atomic_fetch_add_explicit(&backend_errors[b], 1, memory_order_relaxed);
}

void metrics_escape(const char *in, char *buf, size_t n)
{
    size_t o = 0;

    for (; *in != '\0' && o + 3 < n; in++) {
        if (*in == '\\' || *in == '"') {
            buf[o++] = '\\';
            buf[o++] = *in;
        } else if (*in == '\n') {
            buf[o++] = '\\';
            buf[o++] = 'n';
        } else {
            buf[o++] = *in;
        }
    }
    buf[o] = '\0';
}

static void write_histogram(FILE *f, const char *name, const char *labels, const histogram *h)
{
    uint64_t cum = 0;

    for (size_t i = 0; i <= NBUCKETS; i++) {
        cum += atomic_load_explicit(&h->bucket[i], memory_order_relaxed);
        if (i < NBUCKETS)
            fprintf(f, "%s_bucket{%s,le=\"%g\"} %" PRIu64 "\n", name, labels, bucket_s[i], cum);
        else
            fprintf(f, "%s_bucket{%s,le=\"+Inf\"} %" PRIu64 "\n", name, labels, cum);
    }
    fprintf(f, "%s_sum{%s} %.6f\n", name, labels,
            (double)atomic_load_explicit(&h->sum_us, memory_order_relaxed) / 1e6);
    fprintf(f, "%s_count{%s} %" PRIu64 "\n", name, labels, cum);
}

static const char *route_label(int r)
{
    return r < route_n ? route_labels[r] : "unmatched";
}

static void write_counter(FILE *f, const char *name, const char *help, const char *inst,
                          uint64_t v)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s counter\n%s{instance=\"%s\"} %" PRIu64 "\n", name, help,
            name, name, inst, v);
}

void metrics_write(FILE *f, const cJSON *vouchers, int in_progress, int queued)
{
    char inst[160], labels[512], title[600];
    lock_counters lc;
    const cJSON *v;

    metrics_escape(g_cfg.instance_id, inst, sizeof inst);

    fprintf(f, "# HELP seckill_http_in_progress Requests read and not yet answered.\n"
               "# TYPE seckill_http_in_progress gauge\nseckill_http_in_progress{instance=\"%s\"} %d\n",
            inst, in_progress);
    fprintf(f, "# HELP seckill_http_queued Requests waiting for a worker thread.\n"
               "# TYPE seckill_http_queued gauge\nseckill_http_queued{instance=\"%s\"} %d\n",
            inst, queued);

    fprintf(f, "# HELP seckill_http_requests_total HTTP requests answered, by route, status "
               "and error code.\n# TYPE seckill_http_requests_total counter\n");
    for (int r = 0; r < NROUTES; r++) {
        if (r >= route_n && r != METRICS_MAX_ROUTES)
            continue;
        for (size_t s = 0; s <= NSTATUS; s++) {
            for (int e = 0; e < API_ERR_COUNT; e++) {
                uint64_t n = atomic_load_explicit(&requests[r][s][e], memory_order_relaxed);
                char status[8];
                if (n == 0)
                    continue;
                if (s < NSTATUS)
                    snprintf(status, sizeof status, "%d", status_of[s]);
                else
                    snprintf(status, sizeof status, "other");
                fprintf(f,
                        "seckill_http_requests_total{instance=\"%s\",route=\"%s\",status=\"%s\","
                        "code=\"%s\"} %" PRIu64 "\n",
                        inst, route_label(r), status, e == API_OK ? "" : api_err_code(e), n);
            }
        }
    }

    fprintf(f, "# HELP seckill_http_request_duration_seconds Time from the request's headers "
               "to its answer, by route.\n"
               "# TYPE seckill_http_request_duration_seconds histogram\n");
    for (int r = 0; r < NROUTES; r++) {
        if (r >= route_n && r != METRICS_MAX_ROUTES)
            continue;
        snprintf(labels, sizeof labels, "instance=\"%s\",route=\"%s\"", inst, route_label(r));
        write_histogram(f, "seckill_http_request_duration_seconds", labels, &route_latency[r]);
    }

    fprintf(f, "# HELP seckill_backend_call_duration_seconds Redis and Postgres calls, by "
               "service.\n# TYPE seckill_backend_call_duration_seconds histogram\n");
    for (int b = 0; b < METRICS_BACKEND_COUNT; b++) {
        snprintf(labels, sizeof labels, "instance=\"%s\",backend=\"%s\"", inst, backend_name[b]);
        write_histogram(f, "seckill_backend_call_duration_seconds", labels, &backend_latency[b]);
    }
    fprintf(f, "# HELP seckill_backend_errors_total Redis and Postgres calls that failed at the "
               "connection level (refused, timed out, lost).\n"
               "# TYPE seckill_backend_errors_total counter\n");
    for (int b = 0; b < METRICS_BACKEND_COUNT; b++)
        fprintf(f, "seckill_backend_errors_total{instance=\"%s\",backend=\"%s\"} %" PRIu64 "\n",
                inst, backend_name[b], atomic_load(&backend_errors[b]));

    lock_counters_get(&lc);
    write_counter(f, "seckill_lock_acquired_total", "Order lock grants (reentry included).",
                  inst, lc.acquired + stats_event_count(STATS_DEMO_LOCK_ACQUIRED));
    write_counter(f, "seckill_lock_contended_total",
                  "Order lock attempts refused: another owner held it.", inst,
                  lc.contended + stats_event_count(STATS_DEMO_LOCK_CONTENDED));
    write_counter(f, "seckill_lock_released_total", "Order lock releases.", inst,
                  lc.released + stats_event_count(STATS_DEMO_LOCK_RELEASED));
    write_counter(f, "seckill_lock_not_owner_releases_total",
                  "Releases by a non-owner (the lease had expired).", inst,
                  lc.not_owner + stats_event_count(STATS_DEMO_LOCK_NOT_OWNER));
    write_counter(f, "seckill_lock_renewals_total", "Watchdog lease renewals.", inst,
                  lc.renewals);
    write_counter(f, "seckill_lock_waits_total", "Lock attempts that waited for a release.", inst,
                  lc.waits);
    write_counter(f, "seckill_lock_wakeups_total", "Waiters woken by a release message.", inst,
                  lc.wakeups);
    fprintf(f, "# HELP seckill_lock_wakeup_seconds_sum Release message to grant, summed.\n"
               "# TYPE seckill_lock_wakeup_seconds_sum counter\n"
               "seckill_lock_wakeup_seconds_sum{instance=\"%s\"} %.6f\n",
            inst, (double)lc.wake_us_sum / 1e6);
    write_counter(f, "seckill_lock_errors_total", "Redis failures inside lock calls.", inst,
                  lc.errors);
    {
        uint64_t nb, buyers, largest;
        stats_batch_counts(&nb, &buyers, &largest);
        write_counter(f, "seckill_batches_total", "Group commits settled (stock strategy batched).",
                      inst, nb);
        write_counter(f, "seckill_batch_buyers_total", "Buyers settled in group commits.", inst,
                      buyers);
    }
    write_counter(f, "seckill_stale_token_rejections_total",
                  "Order writes refused by Postgres: a newer lock holder already wrote.", inst,
                  stats_event_count(STATS_STALE_TOKEN));

    if (vouchers == NULL)
        return;
    static const struct {
        const char *field, *name, *help;
    } gauges[] = {
        { "stock", "seckill_voucher_stock", "Current stock (Postgres)." },
        { "initialStock", "seckill_voucher_initial_stock", "Stock at creation or reset." },
        { "orders", "seckill_voucher_orders", "Order rows." },
        { "oversold", "seckill_voucher_oversold", "max(0, orders - initial stock): must be 0." },
        { "duplicateUsers", "seckill_voucher_duplicate_users",
          "Users with more than one order: must be 0." },
        { "stockDrift", "seckill_voucher_stock_drift",
          "(initial - stock) - orders: lost updates, must be 0." },
    };
    for (size_t g = 0; g < sizeof gauges / sizeof gauges[0]; g++) {
        fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n", gauges[g].name, gauges[g].help,
                gauges[g].name);
        cJSON_ArrayForEach(v, vouchers) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(v, "voucherId");
            const cJSON *val = cJSON_GetObjectItemCaseSensitive(v, gauges[g].field);
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "title");
            if (!cJSON_IsNumber(id) || !cJSON_IsNumber(val))
                continue;
            metrics_escape(cJSON_IsString(t) ? t->valuestring : "", title, sizeof title);
            fprintf(f, "%s{voucher=\"%.0f\",title=\"%s\"} %.0f\n", gauges[g].name,
                    id->valuedouble, title, val->valuedouble);
        }
    }
}
