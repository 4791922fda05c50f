/* expo: GET /metrics and the counters of GET /stats, from one reading. */
#include "expo.h"
#include "api.h"
#include "config.h"
#include "http.h"
#include "lock.h"
#include "rec.h"
#include "conn.h"
#include "sentinel.h"

#include <inttypes.h>
#include <stdint.h>
#include <string.h>

/* The statuses GET /stats counts apart, in its order; the rest are "other". */
static const int stats_status[] = { 200, 201, 400, 401, 403, 404, 405, 409, 413, 500, 502,
                                    503, 504 };
#define STATS_NSTATUS (sizeof stats_status / sizeof stats_status[0])

/* The lock figures of every strategy: the lock library's own counters,
 * plus what the demo strategies counted (rec). The only place they meet. */
typedef struct lock_figures {
    lock_counters lib;        /* the library's, as read */
    uint64_t acquired, contended, released, not_owner;   /* library + demo */
    uint64_t stale_tokens;
} lock_figures;

static void lock_figures_get(lock_figures *f)
{
    lock_counters_get(&f->lib);
    f->acquired = f->lib.acquired + rec_event_count(REC_DEMO_LOCK_ACQUIRED);
    f->contended = f->lib.contended + rec_event_count(REC_DEMO_LOCK_CONTENDED);
    f->released = f->lib.released + rec_event_count(REC_DEMO_LOCK_RELEASED);
    f->not_owner = f->lib.not_owner + rec_event_count(REC_DEMO_LOCK_NOT_OWNER);
    f->stale_tokens = rec_event_count(REC_STALE_TOKEN);
}

void expo_escape(const char *in, char *buf, size_t n)
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

/*---- GET /metrics ----*/

static void write_histogram(FILE *f, const char *name, const char *labels,
                            const rec_histogram *h)
{
    uint64_t cum = 0;

    for (size_t i = 0; i <= REC_NBUCKETS; i++) {
        cum += h->bucket[i];
        if (i < REC_NBUCKETS)
            fprintf(f, "%s_bucket{%s,le=\"%g\"} %" PRIu64 "\n", name, labels, rec_bucket_s[i],
                    cum);
        else
            fprintf(f, "%s_bucket{%s,le=\"+Inf\"} %" PRIu64 "\n", name, labels, cum);
    }
    fprintf(f, "%s_sum{%s} %.6f\n", name, labels, (double)h->sum_us / 1e6);
    fprintf(f, "%s_count{%s} %" PRIu64 "\n", name, labels, cum);
}

/* The route slots that have a label: the routes, and "unmatched". */
static const char *route_label(int r)
{
    const char *l = r < REC_MAX_ROUTES ? http_route_label(r) : NULL;

    if (l != NULL)
        return l;
    return r == REC_MAX_ROUTES ? "unmatched" : NULL;
}

static void write_counter(FILE *f, const char *name, const char *help, const char *inst,
                          uint64_t v)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s counter\n%s{instance=\"%s\"} %" PRIu64 "\n", name, help,
            name, name, inst, v);
}

static const char *const backend_name[REC_BACKEND_COUNT] = { "redis", "postgres" };

static void write_requests(FILE *f, const char *inst)
{
    char labels[512];
    rec_histogram h;

    fprintf(f, "# HELP seckill_http_requests_total HTTP requests answered, by route, status "
               "and error code.\n# TYPE seckill_http_requests_total counter\n");
    for (int r = 0; r < REC_ROUTE_SLOTS; r++) {
        if (route_label(r) == NULL)
            continue;
        for (int s = 0; s <= REC_NSTATUS; s++) {
            for (int e = 0; e < API_ERR_COUNT; e++) {
                uint64_t n = rec_requests(r, s, (api_err)e);
                char status[8];
                if (n == 0)
                    continue;
                if (s < REC_NSTATUS)
                    snprintf(status, sizeof status, "%d", rec_status[s]);
                else
                    snprintf(status, sizeof status, "other");
                fprintf(f,
                        "seckill_http_requests_total{instance=\"%s\",route=\"%s\",status=\"%s\","
                        "code=\"%s\"} %" PRIu64 "\n",
                        inst, route_label(r), status, e == API_OK ? "" : api_err_code((api_err)e),
                        n);
            }
        }
    }

    fprintf(f, "# HELP seckill_http_request_duration_seconds Time from the request's headers "
               "to its answer, by route.\n"
               "# TYPE seckill_http_request_duration_seconds histogram\n");
    for (int r = 0; r < REC_ROUTE_SLOTS; r++) {
        if (route_label(r) == NULL)
            continue;
        snprintf(labels, sizeof labels, "instance=\"%s\",route=\"%s\"", inst, route_label(r));
        rec_request_latency(r, &h);
        write_histogram(f, "seckill_http_request_duration_seconds", labels, &h);
    }
}

static void write_backends(FILE *f, const char *inst)
{
    char labels[512];
    rec_histogram h;

    fprintf(f, "# HELP seckill_backend_call_duration_seconds Redis and Postgres calls, by "
               "service.\n# TYPE seckill_backend_call_duration_seconds histogram\n");
    for (int b = 0; b < REC_BACKEND_COUNT; b++) {
        snprintf(labels, sizeof labels, "instance=\"%s\",backend=\"%s\"", inst, backend_name[b]);
        rec_backend_latency((enum rec_backend)b, &h);
        write_histogram(f, "seckill_backend_call_duration_seconds", labels, &h);
    }
    fprintf(f, "# HELP seckill_backend_errors_total Redis and Postgres calls that failed at the "
               "connection level (refused, timed out, lost).\n"
               "# TYPE seckill_backend_errors_total counter\n");
    for (int b = 0; b < REC_BACKEND_COUNT; b++)
        fprintf(f, "seckill_backend_errors_total{instance=\"%s\",backend=\"%s\"} %" PRIu64 "\n",
                inst, backend_name[b], rec_backend_errors((enum rec_backend)b));
}

static void write_locks(FILE *f, const char *inst)
{
    lock_figures lf;
    uint64_t nb, buyers, largest;

    lock_figures_get(&lf);
    write_counter(f, "seckill_lock_acquired_total", "Order lock grants (reentry included).",
                  inst, lf.acquired);
    write_counter(f, "seckill_lock_contended_total",
                  "Order lock attempts refused: another owner held it.", inst, lf.contended);
    write_counter(f, "seckill_lock_released_total", "Order lock releases.", inst, lf.released);
    write_counter(f, "seckill_lock_not_owner_releases_total",
                  "Releases by a non-owner (the lease had expired).", inst, lf.not_owner);
    write_counter(f, "seckill_lock_renewals_total", "Watchdog lease renewals.", inst,
                  lf.lib.renewals);
    write_counter(f, "seckill_lock_waits_total", "Lock attempts that waited for a release.", inst,
                  lf.lib.waits);
    write_counter(f, "seckill_lock_wakeups_total", "Waiters woken by a release message.", inst,
                  lf.lib.wakeups);
    fprintf(f, "# HELP seckill_lock_wakeup_seconds_sum Release message to grant, summed.\n"
               "# TYPE seckill_lock_wakeup_seconds_sum counter\n"
               "seckill_lock_wakeup_seconds_sum{instance=\"%s\"} %.6f\n",
            inst, (double)lf.lib.wake_us_sum / 1e6);
    write_counter(f, "seckill_lock_errors_total", "Redis failures inside lock calls.", inst,
                  lf.lib.errors);
    write_counter(f, "seckill_lock_unsynced_total",
                  "Grants undone: fewer replicas than LOCK_SYNC_REPLICAS acknowledged them.", inst,
                  lf.lib.unsynced);
    rec_batch_counts(&nb, &buyers, &largest);
    write_counter(f, "seckill_batches_total", "Group commits settled (stock strategy batched).",
                  inst, nb);
    write_counter(f, "seckill_batch_buyers_total", "Buyers settled in group commits.", inst,
                  buyers);
    write_counter(f, "seckill_stale_token_rejections_total",
                  "Order writes refused by Postgres: a newer lock holder already wrote.", inst,
                  lf.stale_tokens);
}

static void write_vouchers(FILE *f, const cJSON *vouchers)
{
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
    char title[600];
    const cJSON *v;

    for (size_t g = 0; g < sizeof gauges / sizeof gauges[0]; g++) {
        fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n", gauges[g].name, gauges[g].help,
                gauges[g].name);
        cJSON_ArrayForEach(v, vouchers) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(v, "voucherId");
            const cJSON *val = cJSON_GetObjectItemCaseSensitive(v, gauges[g].field);
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "title");
            if (!cJSON_IsNumber(id) || !cJSON_IsNumber(val))
                continue;
            expo_escape(cJSON_IsString(t) ? t->valuestring : "", title, sizeof title);
            fprintf(f, "%s{voucher=\"%.0f\",title=\"%s\"} %.0f\n", gauges[g].name,
                    id->valuedouble, title, val->valuedouble);
        }
    }
}

/* The Redis master in use, and the failovers this process followed. */
static void write_redis(FILE *f, const char *inst)
{
    sentinel_view sv = { 0 };
    char master[300], esc[640];

    conn_redis_master(master, sizeof master);
    expo_escape(master, esc, sizeof esc);
    if (sentinel_enabled())
        sentinel_view_get(&sv);
    fprintf(f, "# HELP seckill_redis_master The Redis master this instance writes to (1 for the "
               "address in use).\n# TYPE seckill_redis_master gauge\n"
               "seckill_redis_master{instance=\"%s\",address=\"%s\",sentinel=\"%s\"} 1\n",
            inst, esc, sentinel_enabled() ? "yes" : "no");
    write_counter(f, "seckill_redis_failovers_total",
                  "Master changes followed (Sentinel failovers seen since start).", inst,
                  sv.failovers);
    write_counter(f, "seckill_redis_switch_notices_total",
                  "Sentinel +switch-master notices received.", inst, sv.switch_notices);
}

void expo_metrics(FILE *f, const cJSON *vouchers)
{
    char inst[160];
    int in_progress, queued;

    expo_escape(g_cfg.instance_id, inst, sizeof inst);
    http_load(&in_progress, &queued);
    fprintf(f, "# HELP seckill_http_in_progress Requests read and not yet answered.\n"
               "# TYPE seckill_http_in_progress gauge\nseckill_http_in_progress{instance=\"%s\"} %d\n",
            inst, in_progress);
    fprintf(f, "# HELP seckill_http_queued Requests waiting for a worker thread.\n"
               "# TYPE seckill_http_queued gauge\nseckill_http_queued{instance=\"%s\"} %d\n",
            inst, queued);
    write_requests(f, inst);
    write_backends(f, inst);
    write_locks(f, inst);
    write_redis(f, inst);
    if (vouchers != NULL)
        write_vouchers(f, vouchers);
}

/*---- GET /stats ----*/

static cJSON *requests_json(void)
{
    cJSON *req = cJSON_CreateObject(), *st = cJSON_CreateObject(), *er = cJSON_CreateObject();
    uint64_t by_status[STATS_NSTATUS + 1] = { 0 }, by_error[API_ERR_COUNT] = { 0 }, total = 0;
    char key[16];

    for (int r = 0; r < REC_ROUTE_SLOTS; r++) {
        for (int s = 0; s <= REC_NSTATUS; s++) {
            size_t slot = 0;
            while (slot < STATS_NSTATUS && (s == REC_NSTATUS || stats_status[slot] != rec_status[s]))
                slot++;
            for (int e = 0; e < API_ERR_COUNT; e++) {
                uint64_t n = rec_requests(r, s, (api_err)e);
                by_status[slot] += n;
                by_error[e] += n;
                total += n;
            }
        }
    }
    cJSON_AddNumberToObject(req, "total", (double)total);
    for (size_t i = 0; i <= STATS_NSTATUS; i++) {
        if (by_status[i] == 0)
            continue;
        if (i < STATS_NSTATUS)
            snprintf(key, sizeof key, "%d", stats_status[i]);
        else
            snprintf(key, sizeof key, "other");
        cJSON_AddNumberToObject(st, key, (double)by_status[i]);
    }
    for (int e = 1; e < API_ERR_COUNT; e++) {
        if (by_error[e] != 0)
            cJSON_AddNumberToObject(er, api_err_code((api_err)e), (double)by_error[e]);
    }
    cJSON_AddItemToObject(req, "byStatus", st);
    cJSON_AddItemToObject(req, "byError", er);
    return req;
}

static cJSON *lock_json(void)
{
    lock_figures lf;
    const lock_counters *lc = &lf.lib;
    cJSON *o = cJSON_CreateObject();

    lock_figures_get(&lf);
    cJSON_AddNumberToObject(o, "acquired", (double)lf.acquired);
    cJSON_AddNumberToObject(o, "contended", (double)lf.contended);
    cJSON_AddNumberToObject(o, "released", (double)lf.released);
    cJSON_AddNumberToObject(o, "notOwnerReleases", (double)lf.not_owner);
    cJSON_AddNumberToObject(o, "staleTokenRejections", (double)lf.stale_tokens);
    /* Waiting (lock_try_lock with a budget): how often, and how fast a
     * release message turned into a grant. */
    cJSON_AddNumberToObject(o, "waits", (double)lc->waits);
    cJSON_AddNumberToObject(o, "waitAcquired", (double)lc->wait_acquired);
    cJSON_AddNumberToObject(o, "waitTimeouts", (double)lc->wait_timeouts);
    cJSON_AddNumberToObject(o, "wakeups", (double)lc->wakeups);
    cJSON_AddNumberToObject(o, "wakeupMeanMs",
                            lc->wake_samples
                                ? (double)lc->wake_us_sum / (double)lc->wake_samples / 1000.0
                                : 0.0);
    cJSON_AddNumberToObject(o, "wakeupMaxMs", (double)lc->wake_us_max / 1000.0);
    cJSON_AddNumberToObject(o, "renewals", (double)lc->renewals);
    cJSON_AddNumberToObject(o, "errors", (double)lc->errors);
    /* LOCK_SYNC_REPLICAS: grants the replicas did not acknowledge in time. */
    cJSON_AddNumberToObject(o, "unsynced", (double)lc->unsynced);
    return o;
}

/* The Redis master in use and how it was found; failovers followed. */
static cJSON *redis_json(void)
{
    cJSON *o = cJSON_CreateObject();
    sentinel_view sv = { 0 };
    char master[300];

    conn_redis_master(master, sizeof master);
    if (sentinel_enabled())
        sentinel_view_get(&sv);
    cJSON_AddStringToObject(o, "mode", sentinel_enabled() ? "sentinel" : "single");
    cJSON_AddStringToObject(o, "master", master);
    if (sentinel_enabled())
        cJSON_AddStringToObject(o, "masterName", g_cfg.master_name);
    cJSON_AddNumberToObject(o, "failovers", (double)sv.failovers);
    cJSON_AddNumberToObject(o, "switchNotices", (double)sv.switch_notices);
    cJSON_AddNumberToObject(o, "syncReplicas", g_cfg.lock_sync_replicas);
    return o;
}

void expo_counters_json(cJSON *obj)
{
    cJSON *b = cJSON_CreateObject();
    uint64_t n, buyers, largest;

    cJSON_AddItemToObject(obj, "requests", requests_json());
    cJSON_AddItemToObject(obj, "lock", lock_json());
    cJSON_AddItemToObject(obj, "redis", redis_json());
    rec_batch_counts(&n, &buyers, &largest);
    cJSON_AddNumberToObject(b, "batches", (double)n);
    cJSON_AddNumberToObject(b, "buyers", (double)buyers);
    cJSON_AddNumberToObject(b, "largest", (double)largest);
    cJSON_AddItemToObject(obj, "batch", b);
}
