/* exposition: GET /metrics and the counters of GET /stats, from one reading. */
#include "exposition.h"
#include "api_err.h"
#include "config.h"
#include "http.h"
#include "lock.h"
#include "counters.h"
#include "conn.h"
#include "sentinel.h"
#include "stock.h"
#include "stock_redis.h"
#include "util.h"
#include "version.h"

#include <dirent.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* The statuses GET /stats counts apart, in its order; the rest are "other". */
static const int stats_status[] = { 200, 201, 400, 401, 403, 404, 405, 409, 413, 500, 502,
                                    503, 504 };
#define STATS_NSTATUS (sizeof stats_status / sizeof stats_status[0])

/* The lock figures of every strategy: the lock library's own counters,
 * plus what the demo strategies counted (counters). The only place they meet. */
typedef struct lock_figures {
    lock_counters lib;        /* the library's, as read */
    uint64_t acquired, contended, released, not_owner;   /* library + demo */
    uint64_t stale_tokens;
    uint64_t fence_swept;
} lock_figures;

static void lock_figures_get(lock_figures *f)
{
    lock_counters_get(&f->lib);
    f->acquired = f->lib.acquired + counters_event_count(COUNTERS_DEMO_LOCK_ACQUIRED);
    f->contended = f->lib.contended + counters_event_count(COUNTERS_DEMO_LOCK_CONTENDED);
    f->released = f->lib.released + counters_event_count(COUNTERS_DEMO_LOCK_RELEASED);
    f->not_owner = f->lib.not_owner + counters_event_count(COUNTERS_DEMO_LOCK_NOT_OWNER);
    f->stale_tokens = counters_event_count(COUNTERS_STALE_TOKEN);
    f->fence_swept = counters_event_count(COUNTERS_FENCE_SWEPT);
}

void exposition_escape(const char *in, char *buf, size_t n)
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

/* Prometheus's conventions (prometheus.io/docs/practices/naming): no
 * "instance" or "job" label (the scrape attaches them; seckill_instance_info
 * names this instance), label values from small known sets only, "_total"
 * on counters alone, "_sum" and "_count" only inside histograms. */

/* Per-voucher series: the vouchers on sale, coming, or ended within the last
 * hour, at most this many (the newest): a table of past sales must not grow
 * every scrape. seckill_vouchers and seckill_vouchers_violating cover all. */
#define EXPOSITION_MAX_VOUCHERS 50
#define EXPOSITION_VOUCHER_RECENT_S 3600

/* "name{labels,extra}" into 'buf': either part may be empty. */
static void series(char *buf, size_t n, const char *name, const char *labels, const char *extra)
{
    int any = labels[0] != '\0' || extra[0] != '\0';

    snprintf(buf, n, "%s%s%s%s%s%s", name, any ? "{" : "", labels,
             labels[0] != '\0' && extra[0] != '\0' ? "," : "", extra, any ? "}" : "");
}

static void write_histogram(FILE *f, const char *name, const char *labels,
                            const counters_histogram *h)
{
    char sname[256], le[40], full[512];
    uint64_t cum = 0;

    snprintf(sname, sizeof sname, "%s_bucket", name);
    for (int i = 0; i <= counters_nbuckets; i++) {
        cum += h->bucket[i];
        if (i < counters_nbuckets)
            snprintf(le, sizeof le, "le=\"%g\"", counters_bucket_s[i]);
        else
            snprintf(le, sizeof le, "le=\"+Inf\"");
        series(full, sizeof full, sname, labels, le);
        fprintf(f, "%s %" PRIu64 "\n", full, cum);
    }
    snprintf(sname, sizeof sname, "%s_sum", name);
    series(full, sizeof full, sname, labels, "");
    fprintf(f, "%s %.6f\n", full, (double)h->sum_us / 1e6);
    snprintf(sname, sizeof sname, "%s_count", name);
    series(full, sizeof full, sname, labels, "");
    fprintf(f, "%s %" PRIu64 "\n", full, cum);
}

static void family(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* The route slots that have a label: the routes, and "unmatched". */
static const char *route_label(int r)
{
    const char *l = r < COUNTERS_MAX_ROUTES ? http_route_label(r) : NULL;

    if (l != NULL)
        return l;
    return r == COUNTERS_MAX_ROUTES ? "unmatched" : NULL;
}

static void write_counter(FILE *f, const char *name, const char *help, uint64_t v)
{
    family(f, name, "counter", help);
    fprintf(f, "%s %" PRIu64 "\n", name, v);
}

static const char *const backend_name[COUNTERS_BACKEND_COUNT] = { "redis", "postgres" };

static void write_identity(FILE *f)
{
    char version[64], revision[64], inst[160], v_esc[160], r_esc[160];

    version_parts(version, sizeof version, revision, sizeof revision);
    exposition_escape(version, v_esc, sizeof v_esc);
    exposition_escape(revision, r_esc, sizeof r_esc);
    family(f, "seckill_build_info", "gauge",
           "Always 1: the version of this binary and the commit it was built from.");
    fprintf(f, "seckill_build_info{version=\"%s\",revision=\"%s\"} 1\n", v_esc, r_esc);
    exposition_escape(g_cfg.instance_id, inst, sizeof inst);
    family(f, "seckill_instance_info", "gauge",
           "Always 1: this instance's INSTANCE_ID and strategies.");
    fprintf(f, "seckill_instance_info{instance_id=\"%s\",lock_strategy=\"%s\",stock_strategy=\"%s\"} 1\n",
            inst, config_lock_name(g_cfg.lock_strategy), config_stock_name(g_cfg.stock_strategy));
}

/* The process metrics Prometheus's client libraries export under these
 * names, from /proc (Linux). A figure that cannot be read is left out. */
static void write_process(FILE *f)
{
    long page = sysconf(_SC_PAGESIZE), tick = sysconf(_SC_CLK_TCK);
    unsigned long long vm_pages = 0, rss_pages = 0, start_ticks = 0, btime = 0;
    struct rusage ru;
    struct rlimit rl;
    FILE *p;
    DIR *d;
    char line[512];
    int fds = 0;

    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        family(f, "process_cpu_seconds_total", "counter", "User and system CPU time spent, in seconds.");
        fprintf(f, "process_cpu_seconds_total %.6f\n",
                (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                    (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6);
    }
    if ((p = fopen("/proc/self/statm", "r")) != NULL) {
        if (fscanf(p, "%llu %llu", &vm_pages, &rss_pages) == 2 && page > 0) {
            family(f, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
            fprintf(f, "process_resident_memory_bytes %llu\n", rss_pages * (unsigned long long)page);
            family(f, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.");
            fprintf(f, "process_virtual_memory_bytes %llu\n", vm_pages * (unsigned long long)page);
        }
        fclose(p);
    }
    if ((d = opendir("/proc/self/fd")) != NULL) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL)
            fds += e->d_name[0] != '.';
        closedir(d);
        family(f, "process_open_fds", "gauge", "Open file descriptors.");
        fprintf(f, "process_open_fds %d\n", fds - 1);      /* less the directory's own */
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        family(f, "process_max_fds", "gauge", "Most open file descriptors allowed.");
        fprintf(f, "process_max_fds %llu\n", (unsigned long long)rl.rlim_cur);
    }
    /* Start time: ticks after boot (field 22 of /proc/self/stat, counted
     * after the command's closing parenthesis) plus the boot time. */
    if ((p = fopen("/proc/self/stat", "r")) != NULL) {
        if (fgets(line, sizeof line, p) != NULL) {
            char *q = strrchr(line, ')');
            for (int field = 2; q != NULL && field < 22; field++)
                q = strchr(q + 1, ' ');
            if (q != NULL)
                start_ticks = strtoull(q + 1, NULL, 10);
        }
        fclose(p);
    }
    if ((p = fopen("/proc/stat", "r")) != NULL) {
        while (fgets(line, sizeof line, p) != NULL)
            if (sscanf(line, "btime %llu", &btime) == 1)
                break;
        fclose(p);
    }
    if (btime > 0 && start_ticks > 0 && tick > 0) {
        family(f, "process_start_time_seconds", "gauge",
               "Start time of the process since the Unix epoch, in seconds.");
        fprintf(f, "process_start_time_seconds %.2f\n",
                (double)btime + (double)start_ticks / (double)tick);
    }
}

static void write_requests(FILE *f)
{
    char labels[512];
    counters_histogram h;

    family(f, "seckill_http_requests_total", "counter",
           "HTTP requests answered, by route, status and error code.");
    for (int r = 0; r < COUNTERS_ROUTE_SLOTS; r++) {
        if (route_label(r) == NULL)
            continue;
        for (int s = 0; s <= COUNTERS_NSTATUS; s++) {
            for (int e = 0; e < API_ERR_COUNT; e++) {
                uint64_t n = counters_requests(r, s, (api_err)e);
                char status[8];
                if (n == 0)
                    continue;
                if (s < COUNTERS_NSTATUS)
                    snprintf(status, sizeof status, "%d", counters_status[s]);
                else
                    snprintf(status, sizeof status, "other");
                fprintf(f, "seckill_http_requests_total{route=\"%s\",status=\"%s\",code=\"%s\"} %" PRIu64 "\n",
                        route_label(r), status, e == API_OK ? "" : api_err_code((api_err)e), n);
            }
        }
    }

    family(f, "seckill_http_request_duration_seconds", "histogram",
           "Time from the request's headers to its answer, by route.");
    for (int r = 0; r < COUNTERS_ROUTE_SLOTS; r++) {
        if (route_label(r) == NULL)
            continue;
        snprintf(labels, sizeof labels, "route=\"%s\"", route_label(r));
        counters_request_latency(r, &h);
        write_histogram(f, "seckill_http_request_duration_seconds", labels, &h);
    }
}

static void write_backends(FILE *f)
{
    char labels[64];
    counters_histogram h;

    family(f, "seckill_backend_call_duration_seconds", "histogram",
           "Redis and Postgres calls, by service.");
    for (int b = 0; b < COUNTERS_BACKEND_COUNT; b++) {
        snprintf(labels, sizeof labels, "backend=\"%s\"", backend_name[b]);
        counters_backend_latency((enum counters_backend)b, &h);
        write_histogram(f, "seckill_backend_call_duration_seconds", labels, &h);
    }
    family(f, "seckill_backend_errors_total", "counter",
           "Redis and Postgres calls that failed at the connection level (refused, timed out, "
           "lost).");
    for (int b = 0; b < COUNTERS_BACKEND_COUNT; b++)
        fprintf(f, "seckill_backend_errors_total{backend=\"%s\"} %" PRIu64 "\n", backend_name[b],
                counters_backend_errors((enum counters_backend)b));
}

static void write_locks(FILE *f)
{
    lock_figures lf;
    uint64_t nb, buyers, largest;

    lock_figures_get(&lf);
    write_counter(f, "seckill_lock_acquired_total", "Order lock grants (reentry included).",
                  lf.acquired);
    write_counter(f, "seckill_lock_contended_total",
                  "Order lock attempts refused: another owner held it.", lf.contended);
    write_counter(f, "seckill_lock_released_total", "Order lock releases.", lf.released);
    write_counter(f, "seckill_lock_not_owner_releases_total",
                  "Releases by a non-owner (the lease had expired).", lf.not_owner);
    write_counter(f, "seckill_lock_renewals_total", "Watchdog lease renewals.", lf.lib.renewals);
    write_counter(f, "seckill_lock_waits_total", "Lock attempts that waited for a release.",
                  lf.lib.waits);
    write_counter(f, "seckill_lock_wakeups_total", "Waiters woken by a release message.",
                  lf.lib.wakeups);
    family(f, "seckill_lock_wakeup_seconds_total", "counter",
           "Time from a release message to the grant it woke, summed over the wakeups.");
    fprintf(f, "seckill_lock_wakeup_seconds_total %.6f\n", (double)lf.lib.wake_us_sum / 1e6);
    write_counter(f, "seckill_lock_errors_total", "Redis failures inside lock calls.",
                  lf.lib.errors);
    write_counter(f, "seckill_lock_unsynced_total",
                  "Grants undone: fewer replicas than LOCK_SYNC_REPLICAS acknowledged them.",
                  lf.lib.unsynced);
    counters_batch_counts(&nb, &buyers, &largest);
    write_counter(f, "seckill_batches_total", "Group commits settled (stock strategy batched).",
                  nb);
    write_counter(f, "seckill_batch_buyers_total", "Buyers settled in group commits.", buyers);
    write_counter(f, "seckill_stale_token_rejections_total",
                  "Order writes refused by Postgres: a newer lock holder already wrote.",
                  lf.stale_tokens);
    write_counter(f, "seckill_fence_rows_swept_total",
                  "tb_lock_fence rows deleted by this instance's sweep (older than two horizons).",
                  lf.fence_swept);
}

static double field_num(const cJSON *v, const char *name)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(v, name);
    return cJSON_IsNumber(x) ? x->valuedouble : 0;
}

/* Redis-first: the consumer of this instance. */
static void write_stream(FILE *f)
{
    uint64_t orders, nb, max_us, last_us, rounds, admissions, largest;
    counters_histogram lag;

    counters_admit_counts(&rounds, &admissions, &largest);
    write_counter(f, "seckill_redis_admission_round_trips_total",
                  "Round trips to Redis that carried admissions (redis; several in a lot).",
                  rounds);
    write_counter(f, "seckill_redis_admissions_total", "Admissions sent to Redis in them.",
                  admissions);
    counters_landed_counts(&orders, &nb, &lag, &max_us, &last_us);
    write_counter(f, "seckill_stream_orders_landed_total",
                  "Orders persisted from the stream by this instance's consumer (redis).", orders);
    write_counter(f, "seckill_stream_batches_total", "Batches it persisted.", nb);
    write_counter(f, "seckill_stream_claimed_total",
                  "Stream entries it claimed from an idle (crashed) consumer.",
                  counters_event_count(COUNTERS_STREAM_CLAIMED));
    write_counter(f, "seckill_stream_dead_letters_total",
                  "Stream entries it moved to the dead-letter stream: acknowledged orders "
                  "that did not land.", counters_event_count(COUNTERS_STREAM_DEAD_LETTER));
    write_counter(f, "seckill_stream_stale_total", "Stream entries of a sale reset since, dropped.",
                  counters_event_count(COUNTERS_STREAM_STALE));
    write_counter(f, "seckill_stream_retries_total",
                  "Batches Postgres refused for now (read-only, a timeout, a lost connection): "
                  "kept pending and tried again.", counters_event_count(COUNTERS_STREAM_RETRY));
    if (stock_keeps_vouchers()) {
        stock_redis_figures w;
        stock_redis_watch_get(&w);
        family(f, "seckill_stream_backlog", "gauge",
               "Admitted orders not yet in Postgres, as this instance last read it (-1: unknown).");
        fprintf(f, "seckill_stream_backlog %" PRId64 "\n", w.backlog);
        family(f, "seckill_stream_oldest_unsettled_seconds", "gauge",
               "Age of the oldest admitted order not yet in Postgres (0: none; -1: unknown).");
        fprintf(f, "seckill_stream_oldest_unsettled_seconds %.3f\n",
                w.oldest_ms < 0 ? -1.0 : (double)w.oldest_ms / 1000.0);
        family(f, "seckill_stream_backlog_max", "gauge",
               "STREAM_BACKLOG_MAX: past it admission answers 503 (0: no bound).");
        fprintf(f, "seckill_stream_backlog_max %d\n", g_cfg.stream_backlog_max);
        family(f, "seckill_redis_first_admitting", "gauge",
               "1 while this instance admits orders (Redis durable, backlog within its bound).");
        fprintf(f, "seckill_redis_first_admitting %d\n", w.durable && !w.over_backlog);
    }
    family(f, "seckill_stream_ack_to_row_seconds", "histogram",
           "From an order's acknowledgement (its stream entry) to its row's commit.");
    write_histogram(f, "seckill_stream_ack_to_row_seconds", "", &lag);
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
    const cJSON *shown[EXPOSITION_MAX_VOUCHERS];
    int nshown = 0, total = cJSON_GetArraySize(vouchers);
    int64_t now = util_now_s();
    uint64_t oversold = 0, dups = 0, drift = 0;
    const cJSON *v;

    /* The array is in voucher id order: the newest recent ones from its end. */
    for (int i = total - 1; i >= 0 && nshown < EXPOSITION_MAX_VOUCHERS; i--) {
        const cJSON *end;
        int64_t end_s;
        v = cJSON_GetArrayItem(vouchers, i);
        end = cJSON_GetObjectItemCaseSensitive(v, "endTime");
        if (!cJSON_IsString(end) || util_parse_iso8601(end->valuestring, &end_s) != 0 ||
            end_s + EXPOSITION_VOUCHER_RECENT_S >= now)
            shown[nshown++] = v;
    }
    cJSON_ArrayForEach(v, vouchers) {
        oversold += field_num(v, "oversold") != 0;
        dups += field_num(v, "duplicateUsers") != 0;
        drift += field_num(v, "stockDrift") != 0;
    }
    family(f, "seckill_vouchers", "gauge", "Vouchers in Postgres.");
    fprintf(f, "seckill_vouchers %d\n", total);
    family(f, "seckill_vouchers_violating", "gauge",
           "Vouchers (of all, not only those with series) whose invariant is broken: must be 0.");
    fprintf(f, "seckill_vouchers_violating{invariant=\"oversold\"} %" PRIu64 "\n", oversold);
    fprintf(f, "seckill_vouchers_violating{invariant=\"duplicate_users\"} %" PRIu64 "\n", dups);
    fprintf(f, "seckill_vouchers_violating{invariant=\"stock_drift\"} %" PRIu64 "\n", drift);
    for (size_t g = 0; g < sizeof gauges / sizeof gauges[0]; g++) {
        family(f, gauges[g].name, "gauge", gauges[g].help);
        for (int i = nshown - 1; i >= 0; i--)
            fprintf(f, "%s{voucher=\"%.0f\"} %.0f\n", gauges[g].name, field_num(shown[i], "voucherId"),
                    field_num(shown[i], gauges[g].field));
    }
}

/* The Redis master in use, and the failovers this process followed. */
static void write_redis(FILE *f)
{
    sentinel_view sv = { 0 };
    char master[300], esc[640];

    conn_redis_master(master, sizeof master);
    exposition_escape(master, esc, sizeof esc);
    if (sentinel_enabled())
        sentinel_view_get(&sv);
    family(f, "seckill_redis_master", "gauge",
           "The Redis master this instance writes to (1 for the address in use).");
    fprintf(f, "seckill_redis_master{address=\"%s\",sentinel=\"%s\"} 1\n", esc,
            sentinel_enabled() ? "yes" : "no");
    write_counter(f, "seckill_redis_failovers_total",
                  "Master changes followed (Sentinel failovers seen since start).", sv.failovers);
    write_counter(f, "seckill_redis_switch_notices_total",
                  "Sentinel +switch-master notices received.", sv.switch_notices);
    if (conn_redis_cluster()) {
        conn_cluster_counters cc;
        conn_cluster_counters_get(&cc);
        family(f, "seckill_redis_cluster_redirects_total", "counter",
               "Redis Cluster redirections followed (MOVED, ASK; retry: TRYAGAIN, CLUSTERDOWN).");
        fprintf(f, "seckill_redis_cluster_redirects_total{kind=\"moved\"} %llu\n",
                (unsigned long long)cc.moved);
        fprintf(f, "seckill_redis_cluster_redirects_total{kind=\"ask\"} %llu\n",
                (unsigned long long)cc.ask);
        fprintf(f, "seckill_redis_cluster_redirects_total{kind=\"retry\"} %llu\n",
                (unsigned long long)cc.retry);
    }
}

void exposition_metrics(FILE *f, const cJSON *vouchers)
{
    int in_progress, queued;

    write_identity(f);
    write_process(f);
    http_load(&in_progress, &queued);
    family(f, "seckill_http_in_progress", "gauge", "Requests read and not yet answered.");
    fprintf(f, "seckill_http_in_progress %d\n", in_progress);
    family(f, "seckill_http_queued", "gauge", "Requests waiting for a worker thread.");
    fprintf(f, "seckill_http_queued %d\n", queued);
    write_requests(f);
    write_backends(f);
    write_locks(f);
    write_redis(f);
    write_stream(f);
    if (vouchers != NULL)
        write_vouchers(f, vouchers);
}

/*---- GET /stats ----*/

static cJSON *requests_json(void)
{
    cJSON *req = cJSON_CreateObject(), *st = cJSON_CreateObject(), *er = cJSON_CreateObject();
    uint64_t by_status[STATS_NSTATUS + 1] = { 0 }, by_error[API_ERR_COUNT] = { 0 }, total = 0;
    char key[16];

    for (int r = 0; r < COUNTERS_ROUTE_SLOTS; r++) {
        for (int s = 0; s <= COUNTERS_NSTATUS; s++) {
            size_t slot = 0;
            while (slot < STATS_NSTATUS && (s == COUNTERS_NSTATUS || stats_status[slot] != counters_status[s]))
                slot++;
            for (int e = 0; e < API_ERR_COUNT; e++) {
                uint64_t n = counters_requests(r, s, (api_err)e);
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
    cJSON_AddNumberToObject(o, "fenceRowsSwept", (double)lf.fence_swept);
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
    cJSON_AddStringToObject(o, "mode", conn_redis_cluster() ? "cluster"
                                       : sentinel_enabled() ? "sentinel" : "single");
    cJSON_AddStringToObject(o, "master", master);
    if (conn_redis_cluster()) {
        conn_cluster_counters cc;
        cJSON *r = cJSON_AddObjectToObject(o, "redirects");
        conn_cluster_counters_get(&cc);
        cJSON_AddNumberToObject(r, "moved", (double)cc.moved);
        cJSON_AddNumberToObject(r, "ask", (double)cc.ask);
        cJSON_AddNumberToObject(r, "retry", (double)cc.retry);
    }
    if (sentinel_enabled())
        cJSON_AddStringToObject(o, "masterName", g_cfg.master_name);
    cJSON_AddNumberToObject(o, "failovers", (double)sv.failovers);
    cJSON_AddNumberToObject(o, "switchNotices", (double)sv.switch_notices);
    cJSON_AddNumberToObject(o, "syncReplicas", g_cfg.lock_sync_replicas);
    return o;
}

void exposition_counters_json(cJSON *obj)
{
    cJSON *b = cJSON_CreateObject();
    uint64_t n, buyers, largest;

    cJSON_AddItemToObject(obj, "requests", requests_json());
    cJSON_AddItemToObject(obj, "lock", lock_json());
    cJSON_AddItemToObject(obj, "redis", redis_json());
    counters_batch_counts(&n, &buyers, &largest);
    cJSON_AddNumberToObject(b, "batches", (double)n);
    cJSON_AddNumberToObject(b, "buyers", (double)buyers);
    cJSON_AddNumberToObject(b, "largest", (double)largest);
    cJSON_AddItemToObject(obj, "batch", b);
    {
        uint64_t rounds, admissions, most;
        cJSON *a = cJSON_CreateObject();

        counters_admit_counts(&rounds, &admissions, &most);
        cJSON_AddNumberToObject(a, "roundTrips", (double)rounds);
        cJSON_AddNumberToObject(a, "admissions", (double)admissions);
        cJSON_AddNumberToObject(a, "largest", (double)most);
        cJSON_AddItemToObject(obj, "admission", a);
    }
    {
        uint64_t orders, nb, max_us, last_us;
        counters_histogram lag;
        cJSON *c = cJSON_CreateObject();

        counters_landed_counts(&orders, &nb, &lag, &max_us, &last_us);
        cJSON_AddNumberToObject(c, "landed", (double)orders);
        cJSON_AddNumberToObject(c, "batches", (double)nb);
        cJSON_AddNumberToObject(c, "claimed", (double)counters_event_count(COUNTERS_STREAM_CLAIMED));
        cJSON_AddNumberToObject(c, "deadLettered",
                                (double)counters_event_count(COUNTERS_STREAM_DEAD_LETTER));
        cJSON_AddNumberToObject(c, "stale", (double)counters_event_count(COUNTERS_STREAM_STALE));
        cJSON_AddNumberToObject(c, "retries", (double)counters_event_count(COUNTERS_STREAM_RETRY));
        cJSON_AddNumberToObject(c, "lagMsLast", (double)last_us / 1000.0);
        cJSON_AddNumberToObject(c, "lagMsMax", (double)max_us / 1000.0);
        cJSON_AddNumberToObject(c, "lagMsMean",
                                orders > 0 ? (double)lag.sum_us / 1000.0 / (double)orders : 0.0);
        cJSON_AddItemToObject(obj, "consumer", c);
    }
}
