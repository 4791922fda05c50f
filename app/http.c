/* http: libmicrohttpd daemon, body collection, routing, responses, and the
 * hand-off of blocking requests to the worker pool. */
#include "http.h"
#include "config.h"
#include "log.h"
#include "metrics.h"
#include "stats.h"
#include "util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define HTTP_POOL_BYTES (32 * 1024)   /* per connection: request line + headers */

static struct MHD_Daemon *daemon_handle;
static const http_route *route_table;
static size_t route_count;
static _Atomic int in_flight;

/* The work queue: requests suspended by the event threads, FIFO, taken by
 * the workers. 'closing': answer what is still queued with 503 at once. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t ready;
    http_req *head, *tail;
    _Atomic int depth;        /* queued, not yet taken: read by /metrics */
    int closing, stop;
    pthread_t *threads;
    int nthreads;
} wq = { .mu = PTHREAD_MUTEX_INITIALIZER, .ready = PTHREAD_COND_INITIALIZER };

/* Bodies past the limit are drained (so the client reads our 413) up to this
 * many bytes; beyond it the connection is dropped. */
static size_t drain_cap(void)
{
    size_t cap = (size_t)g_cfg.max_body * 4;
    return cap < (8u << 20) ? (8u << 20) : cap;
}

/* Takes nginx's X-Request-Id when it is a sane token, else makes one, so a
 * single order can be followed from nginx's log to ours to its row. */
static void set_request_id(http_req *r)
{
    static _Thread_local uint64_t seq;
    static _Thread_local unsigned tid;
    static _Atomic unsigned next_tid = 1;
    const char *in = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "X-Request-Id");
    size_t n = in ? strlen(in) : 0;
    int ok = n > 0 && n < sizeof r->request_id;

    for (size_t i = 0; ok && i < n; i++)
        ok = (in[i] >= 'a' && in[i] <= 'z') || (in[i] >= 'A' && in[i] <= 'Z') ||
             (in[i] >= '0' && in[i] <= '9') || in[i] == '-' || in[i] == '_' || in[i] == '.' ||
             in[i] == ':';
    if (ok) {
        memcpy(r->request_id, in, n + 1);
        return;
    }
    if (tid == 0)
        tid = atomic_fetch_add(&next_tid, 1);
    snprintf(r->request_id, sizeof r->request_id, "%.48s-%u-%llu", g_cfg.instance_id, tid,
             (unsigned long long)++seq);
}

void http_load(int *in_progress, int *queued)
{
    *in_progress = atomic_load_explicit(&in_flight, memory_order_relaxed);
    *queued = atomic_load_explicit(&wq.depth, memory_order_relaxed);
}

const char *http_header(http_req *r, const char *name)
{
    return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

static enum MHD_Result queue(http_req *r, int status, struct MHD_Response *resp,
                             const char *content_type)
{
    enum MHD_Result ret;

    if (resp == NULL)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    MHD_add_response_header(resp, "X-Instance-Id", g_cfg.instance_id);
    MHD_add_response_header(resp, "X-Request-Id", r->request_id);
    if (status == 503) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", g_cfg.retry_after_s);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, ra);
    }
    if (r->on_worker) {
        /* The connection is suspended: its event thread queues this at resume. */
        if (r->held != NULL) {
            MHD_destroy_response(resp);    /* answered twice: the first one stands */
            return MHD_NO;
        }
        r->status = status;
        r->held = resp;
        return MHD_YES;
    }
    r->status = status;
    ret = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);            /* MHD keeps its own reference */
    return ret;
}

enum MHD_Result http_send_text(http_req *r, int status, const char *content_type, char *text,
                               size_t len)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);

    if (resp == NULL) {
        free(text);
        return MHD_NO;
    }
    return queue(r, status, resp, content_type);
}

enum MHD_Result http_send_json(http_req *r, int status, cJSON *body)
{
    char *text = body ? cJSON_PrintUnformatted(body) : NULL;

    cJSON_Delete(body);
    if (text == NULL)
        return MHD_NO;
    return http_send_text(r, status, "application/json", text, strlen(text));
}

static enum MHD_Result send_error_with(http_req *r, api_err e, const char *message,
                                       const char *hdr_name, const char *hdr_value)
{
    cJSON *o = cJSON_CreateObject();
    struct MHD_Response *resp;
    char *text;
    int status = api_err_status(e);

    cJSON_AddStringToObject(o, "error", api_err_code(e));
    cJSON_AddStringToObject(o, "message", message ? message : api_err_message(e));
    text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (text == NULL)
        return MHD_NO;
    resp = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (resp == NULL) {
        free(text);
        return MHD_NO;
    }
    if (hdr_name != NULL)
        MHD_add_response_header(resp, hdr_name, hdr_value);
    r->err = e;
    return queue(r, status, resp, "application/json");
}

enum MHD_Result http_send_error(http_req *r, api_err e, const char *message)
{
    return send_error_with(r, e, message, NULL, NULL);
}

enum MHD_Result http_send_error_header(http_req *r, api_err e, const char *message,
                                       const char *name, const char *value)
{
    return send_error_with(r, e, message, name, value);
}

/* Matches 'path' against 'pattern' segment by segment; '*' takes one segment
 * (possibly empty) and is returned through arg/arg_len. */
static int route_match(const char *pattern, const char *path, const char **arg, size_t *arg_len)
{
    const char *p = pattern, *s = path;

    while (*p != '\0') {
        if (*p == '*') {
            const char *end = strchr(s, '/');
            size_t n = end ? (size_t)(end - s) : strlen(s);
            *arg = s;
            *arg_len = n;
            s += n;
            p++;
            continue;
        }
        if (*p != *s)
            return 0;
        p++;
        s++;
    }
    return *s == '\0';
}

static int method_is(const char *have, const char *want)
{
    return strcmp(have, want) == 0 ||
           (strcmp(want, MHD_HTTP_METHOD_GET) == 0 && strcmp(have, MHD_HTTP_METHOD_HEAD) == 0);
}

int http_route_find(const http_route *routes, size_t n, const char *method, const char *path,
                    const char **arg, size_t *arg_len, char *allow, size_t allow_len)
{
    int found = HTTP_ROUTE_NONE;

    *arg = path;
    *arg_len = 0;
    if (allow_len > 0)
        allow[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        const char *a = path;
        size_t al = 0;
        if (!route_match(routes[i].pattern, path, &a, &al))
            continue;
        if (method_is(method, routes[i].method)) {
            *arg = a;
            *arg_len = al;
            return (int)i;
        }
        found = HTTP_ROUTE_METHOD - (int)i;
        size_t used = strnlen(allow, allow_len);
        if (used < allow_len)
            snprintf(allow + used, allow_len - used, "%s%s%s", used ? ", " : "", routes[i].method,
                     strcmp(routes[i].method, MHD_HTTP_METHOD_GET) == 0 ? ", HEAD" : "");
    }
    return found;
}

/* ---- the worker pool ---- */

/* Suspends r's connection (unless http_park already did) and queues r.
 * Suspend first: a worker may resume it before this thread is back in MHD. -1 once the workers have stopped
 * (a keep-alive request during shutdown): nothing was done. */
static int wq_push(http_req *r, int suspended)
{
    pthread_mutex_lock(&wq.mu);
    if (wq.stop) {
        pthread_mutex_unlock(&wq.mu);
        return -1;
    }
    if (!suspended)
        MHD_suspend_connection(r->conn);
    r->next = NULL;
    if (wq.tail != NULL)
        wq.tail->next = r;
    else
        wq.head = r;
    wq.tail = r;
    atomic_fetch_add_explicit(&wq.depth, 1, memory_order_relaxed);
    pthread_cond_signal(&wq.ready);
    pthread_mutex_unlock(&wq.mu);
    return 0;
}

/* The next request, or NULL when the pool stops. *closing: answer 503. */
static http_req *wq_pop(int *closing)
{
    http_req *r;

    pthread_mutex_lock(&wq.mu);
    while (wq.head == NULL && !wq.stop)
        pthread_cond_wait(&wq.ready, &wq.mu);
    r = wq.head;
    if (r != NULL) {
        atomic_fetch_sub_explicit(&wq.depth, 1, memory_order_relaxed);
        wq.head = r->next;
        if (wq.head == NULL)
            wq.tail = NULL;
    }
    *closing = wq.closing;
    pthread_mutex_unlock(&wq.mu);
    return r;
}

/* Set by http_later on the worker running the handler. */
static _Thread_local int handed_over;

void http_later(http_req *r)
{
    (void)r;
    handed_over = 1;
}

void http_finish(http_req *r)
{
    /* From here the request is its event thread's again. */
    MHD_resume_connection(r->conn);
}

static void *worker_main(void *arg)
{
    enum MHD_Result ret;
    http_req *r;
    int closing;

    (void)arg;
    while ((r = wq_pop(&closing)) != NULL) {
        handed_over = 0;
        if (closing)
            ret = http_send_error(r, API_UNAVAILABLE, "shutting down, retry later");
        else
            ret = route_table[r->route].fn(r, r->arg, r->arg_len);
        if (handed_over)
            continue;                        /* another thread answers and resumes it */
        r->worker_ret = ret;
        http_finish(r);
    }
    return NULL;
}

static int workers_start(int n)
{
    wq.threads = xcalloc((size_t)n, sizeof *wq.threads);
    for (wq.nthreads = 0; wq.nthreads < n; wq.nthreads++) {
        if (pthread_create(&wq.threads[wq.nthreads], NULL, worker_main, NULL) != 0) {
            log_error("cannot start worker thread %d of %d", wq.nthreads + 1, n);
            return -1;
        }
    }
    return 0;
}

/* Lets the workers empty the queue (503 for what is left), then joins them. */
static void workers_stop(void)
{
    pthread_mutex_lock(&wq.mu);
    wq.closing = 1;
    wq.stop = 1;
    pthread_cond_broadcast(&wq.ready);
    pthread_mutex_unlock(&wq.mu);
    for (int i = 0; i < wq.nthreads; i++)
        pthread_join(wq.threads[i], NULL);
    free(wq.threads);
    wq.threads = NULL;
    wq.nthreads = 0;
}

/* Hands the request to a worker; its answer is queued when it resumes. */
static enum MHD_Result defer(http_req *r, const char *arg, size_t arg_len)
{
    r->arg = arg;
    r->arg_len = arg_len;
    r->deferred = 1;
    r->on_worker = 1;
    r->worker_ret = MHD_YES;
    if (wq_push(r, 0) != 0) {
        r->deferred = 0;
        r->on_worker = 0;
        return http_send_error(r, API_UNAVAILABLE, "shutting down, retry later");
    }
    return MHD_YES;
}

int http_park(http_req *r, const char *arg, size_t arg_len)
{
    int ret = -1;

    pthread_mutex_lock(&wq.mu);
    if (!wq.stop) {
        MHD_suspend_connection(r->conn);
        r->arg = arg;
        r->arg_len = arg_len;
        r->deferred = 1;
        r->on_worker = 1;
        r->worker_ret = MHD_YES;
        ret = 0;
    }
    pthread_mutex_unlock(&wq.mu);
    return ret;
}

void http_unpark(http_req *r)
{
    if (wq_push(r, 1) == 0)
        return;
    /* The workers stopped since http_park: answered here, sent at resume. */
    http_send_error(r, API_UNAVAILABLE, "shutting down, retry later");
    http_finish(r);
}

/* Back on the event thread after the worker: queue what it answered. */
static enum MHD_Result resumed(http_req *r)
{
    struct MHD_Response *resp = r->held;
    enum MHD_Result ret;

    r->on_worker = 0;
    if (resp == NULL)
        return MHD_NO;                       /* no answer could be made: close */
    r->held = NULL;
    ret = MHD_queue_response(r->conn, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    return r->worker_ret == MHD_NO ? MHD_NO : ret;
}

static enum MHD_Result dispatch(http_req *r)
{
    char allow[64];
    const char *arg;
    size_t arg_len;
    int i = http_route_find(route_table, route_count, r->method, r->url, &arg, &arg_len, allow,
                            sizeof allow);

    if (i >= 0) {
        const http_route *rt = &route_table[i];
        r->route = i;
        if (rt->fast != NULL) {
            enum MHD_Result ret = rt->fast(r, arg, arg_len);
            if (r->deferred)
                return MHD_YES;              /* parked: r may be answered already */
            if (ret == MHD_NO || r->status != 0)
                return ret;
        }
        if (rt->fn == NULL)
            return http_send_error(r, API_UNAVAILABLE, "the route left the request unanswered");
        return defer(r, arg, arg_len);
    }
    if (i == HTTP_ROUTE_NONE)
        return http_send_error(r, API_NOT_FOUND, NULL);
    r->route = HTTP_ROUTE_METHOD - i;
    return send_error_with(r, API_METHOD_NOT_ALLOWED, NULL, MHD_HTTP_HEADER_ALLOW, allow);
}

/* What the headers say about the request's framing and identity. The NUL
 * check compares the reported length with the string's: libmicrohttpd
 * 0.9.75 already cuts a value at a NUL (so it never fires there), but a
 * library that kept the bytes would otherwise let "7\09" buy as user 7. */
typedef struct header_scan {
    int user_ids, lengths, chunked, nul;
    char length[32];
    int lengths_differ;
} header_scan;

static enum MHD_Result scan_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                   size_t key_size, const char *value, size_t value_size)
{
    header_scan *h = cls;

    (void)kind;
    if (strlen(key) != key_size || (value != NULL && strlen(value) != value_size))
        h->nul = 1;
    if (strcasecmp(key, "X-User-Id") == 0) {
        h->user_ids++;
    } else if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
        if (h->lengths++ == 0)
            snprintf(h->length, sizeof h->length, "%s", value ? value : "");
        else if (value == NULL || strcmp(h->length, value) != 0)
            h->lengths_differ = 1;
    } else if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
        h->chunked = 1;
    }
    return MHD_YES;
}

/* Refuses requests whose meaning depends on which header a reader believes:
 * the doors of request smuggling and of buying as someone else. 0 = fine. */
static int refuse_ambiguous(http_req *r)
{
    header_scan h = { 0 };

    MHD_get_connection_values_n(r->conn, MHD_HEADER_KIND, scan_header, &h);
    if (h.nul) {
        http_send_error(r, API_BAD_REQUEST, "a header contains a NUL byte");
        return 1;
    }
    if (h.lengths_differ || (h.lengths > 0 && h.chunked)) {
        http_send_error(r, API_BAD_REQUEST, "conflicting Content-Length / Transfer-Encoding");
        return 1;
    }
    if (h.user_ids > 1) {
        http_send_error(r, API_INVALID_USER_ID, "X-User-Id must appear once");
        return 1;
    }
    return 0;
}

/* Routing sees the path exactly as sent: "%2F" is not a separator and "%00"
 * is not the end of the path. Nothing in our API needs escapes. */
static size_t keep_escapes(void *cls, struct MHD_Connection *conn, char *s)
{
    (void)cls;
    (void)conn;
    return strlen(s);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **req_cls)
{
    http_req *r = *req_cls;

    (void)cls;
    (void)version;
    if (r == NULL) {                         /* headers only: the body comes later */
        r = xcalloc(1, sizeof *r);
        r->conn = conn;
        r->method = method;
        r->url = url;
        r->start_us = util_mono_us();
        r->route = METRICS_NO_ROUTE;
        set_request_id(r);
        *req_cls = r;
        atomic_fetch_add(&in_flight, 1);
        if (refuse_ambiguous(r))
            return MHD_YES;                  /* answered; MHD closes after it */
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        int64_t n;
        if (cl != NULL && (util_parse_u63(cl, strlen(cl), &n) != 0 || (uint64_t)n > drain_cap()))
            return http_send_error(r, API_BODY_TOO_LARGE, NULL);   /* MHD closes after it */
        return MHD_YES;
    }
    if (*upload_data_size != 0) {
        size_t n = *upload_data_size;
        r->body_seen += n;
        if (!r->too_large && r->body_len + n > (size_t)g_cfg.max_body) {
            r->too_large = 1;
            free(r->body);
            r->body = NULL;
            r->body_len = 0;
        }
        if (!r->too_large) {
            r->body = xrealloc(r->body, r->body_len + n + 1);
            memcpy(r->body + r->body_len, upload_data, n);
            r->body_len += n;
            r->body[r->body_len] = '\0';
        }
        *upload_data_size = 0;
        if (r->body_seen > drain_cap())
            return MHD_NO;                   /* an endless body: drop the connection */
        return MHD_YES;
    }
    if (r->deferred)
        return resumed(r);
    if (r->status != 0)
        return MHD_YES;                      /* already answered */
    if (r->too_large)
        return http_send_error(r, API_BODY_TOO_LARGE, NULL);
    return dispatch(r);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                         enum MHD_RequestTerminationCode toe)
{
    http_req *r = *req_cls;

    (void)cls;
    (void)conn;
    if (r == NULL)
        return;
    if (r->status != 0) {
        int64_t us = util_mono_us() - r->start_us;
        log_access_line a = {
            .method = r->method, .path = r->url, .instance = g_cfg.instance_id,
            .request_id = r->request_id, .status = r->status, .latency_ms = (double)us / 1000.0,
            .error = r->err != API_OK ? api_err_code(r->err) : NULL,
            .voucher_id = r->voucher_id, .user_id = r->user_id, .order_id = r->order_id,
        };
        stats_record(r->status, r->err);
        metrics_request(r->route, r->status, r->err, us);
        log_access(&a);
    } else {
        log_debug("request %s %s ended without answer (termination %d)", r->method, r->url,
                  (int)toe);
    }
    if (r->held != NULL)
        MHD_destroy_response(r->held);
    free(r->body);
    free(r);
    *req_cls = NULL;
    atomic_fetch_sub(&in_flight, 1);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    char line[512];

    (void)cls;
    vsnprintf(line, sizeof line, fmt, ap);
    line[strcspn(line, "\n")] = '\0';
    log_warn("mhd: %s", line);
}

/* "/voucher/ * /seckill" (no spaces) -> "/voucher/{id}/seckill" for metrics labels. */
static char route_label_buf[METRICS_MAX_ROUTES][64];
static const char *route_labels[METRICS_MAX_ROUTES];

static void set_route_labels(void)
{
    size_t n = route_count < METRICS_MAX_ROUTES ? route_count : METRICS_MAX_ROUTES;

    for (size_t i = 0; i < n; i++) {
        char *o = route_label_buf[i];
        size_t used = 0;
        for (const char *p = route_table[i].pattern; *p && used + 5 < sizeof route_label_buf[i];
             p++) {
            if (*p == '*') {
                memcpy(o + used, "{id}", 4);
                used += 4;
            } else {
                o[used++] = *p;
            }
        }
        o[used] = '\0';
        route_labels[i] = o;
    }
    metrics_set_routes(route_labels, (int)n);
}

int http_start(const http_route *routes, size_t nroutes)
{
    struct sockaddr_in addr;

    route_table = routes;
    route_count = nroutes;
    set_route_labels();
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)g_cfg.port);
    if (inet_pton(AF_INET, g_cfg.bind, &addr.sin_addr) != 1) {
        log_error("invalid BIND address '%s' (IPv4 expected)", g_cfg.bind);
        return -1;
    }
    if (workers_start(g_cfg.threads) != 0) {
        workers_stop();
        return -1;
    }
    daemon_handle = MHD_start_daemon(
        MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG |
            MHD_ALLOW_SUSPEND_RESUME,
        (uint16_t)g_cfg.port, NULL, NULL, on_request, NULL,
        MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned)g_cfg.io_threads,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)g_cfg.max_connections,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)g_cfg.conn_timeout_s,
        /* Request line and headers must fit; nginx in front allows 4 x 8 KiB.
         * MHD zeroes this pool on every keep-alive request and keeps one per
         * connection, so it is kept no larger than that. */
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)HTTP_POOL_BYTES,
        MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024u,
        MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
        MHD_OPTION_UNESCAPE_CALLBACK, keep_escapes, NULL,
        MHD_OPTION_END);
    if (daemon_handle == NULL) {
        log_error("cannot listen on %s:%d (port in use?)", g_cfg.bind, g_cfg.port);
        workers_stop();
        return -1;
    }
    return 0;
}

void http_stop(int grace_ms)
{
    int64_t deadline;
    struct timespec tick = { 0, 10 * 1000 * 1000 };

    if (daemon_handle == NULL)
        return;
    /* Stop accepting; requests already read keep running until answered. */
    MHD_quiesce_daemon(daemon_handle);
    deadline = util_mono_us() + (int64_t)grace_ms * 1000;
    while (atomic_load(&in_flight) > 0 && util_mono_us() < deadline)
        nanosleep(&tick, NULL);
    if (atomic_load(&in_flight) > 0)
        log_warn("shutdown: %d requests still open after %d ms", atomic_load(&in_flight), grace_ms);
    /* libmicrohttpd refuses to stop with a connection still suspended: every
     * queued request is answered (503) and resumed before it is asked to. */
    workers_stop();
    /* The answers the workers made last are sent by the event threads. */
    deadline = util_mono_us() + 1000 * 1000;
    while (atomic_load(&in_flight) > 0 && util_mono_us() < deadline)
        nanosleep(&tick, NULL);
    MHD_stop_daemon(daemon_handle);
    daemon_handle = NULL;
}
