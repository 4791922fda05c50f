/* http: the libmicrohttpd daemon: its callbacks (headers, body, the
 * request's completion, connections), routing a request to its fast
 * handler or to the work queue, sending what was answered while it was
 * suspended, and the start, drain and stop (http.h). */
#include "http.h"
#include "config.h"
#include "log.h"
#include "counters.h"
#include "util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define HTTP_POOL_BYTES (32 * 1024)   /* per connection: request line + headers */

#define BIT(st) HTTP_REQUEST_BIT(st)

static struct MHD_Daemon *daemon_handle;
static _Atomic int in_flight;
static _Atomic int open_conns;     /* HTTP connections open now */

/* Bodies past the limit are drained (so the client reads our 413) up to this
 * many bytes; beyond it the connection is dropped. */
static size_t drain_cap(void)
{
    size_t cap = (size_t)g_cfg.max_body * 4;
    return cap < (8u << 20) ? (8u << 20) : cap;
}

void http_load(int *in_progress, int *queued)
{
    *in_progress = atomic_load_explicit(&in_flight, memory_order_relaxed);
    *queued = http_workers_queued();
}

int http_draining(void)
{
    return http_response_closing();
}

/* The answer of a request the event thread finished with, as libmicrohttpd
 * wants it: MHD_NO closes the connection. */
static enum MHD_Result mhd_result(const http_req *r)
{
    return r->close ? MHD_NO : MHD_YES;
}

/* Hands the request to a worker; its answer is queued when it resumes. */
static enum MHD_Result defer(http_req *r)
{
    if (http_workers_push(r) != 0) {
        http_send_error(r, API_UNAVAILABLE, "shutting down, retry later");
        return mhd_result(r);
    }
    return MHD_YES;
}

/* Back on the event thread after the worker or the holder: queue what it
 * answered. */
static enum MHD_Result resumed(http_req *r)
{
    struct MHD_Response *resp = r->held;
    enum MHD_Result ret = MHD_NO;

    http_request_move(r, BIT(HTTP_ST_RESUMED), HTTP_ST_SENT, "send");
    r->held = NULL;
    if (resp != NULL) {
        http_response_close_if_closing(resp);
        ret = MHD_queue_response(r->conn, (unsigned)r->status, resp);
        MHD_destroy_response(resp);
    }
    if (ret != MHD_YES)
        r->close = 1;                        /* no answer could be made: close */
    return mhd_result(r);
}

static enum MHD_Result dispatch(http_req *r)
{
    char allow[64];
    const char *arg;
    size_t arg_len;
    int i = http_router_match(r->method, r->url, &arg, &arg_len, allow, sizeof allow);

    if (i >= 0) {
        const http_route *rt = http_router_route(i);
        r->route = i;
        r->arg = arg;
        r->arg_len = arg_len;
        if (rt->fast != NULL) {
            switch (rt->fast(r, arg, arg_len)) {
            case HTTP_ANSWERED:
                http_request_check(r, BIT(HTTP_ST_SENT),
                                   "a fast handler returned without answering");
                return mhd_result(r);
            case HTTP_HANDED_OFF:
                /* Parked: r may be answered already, but it is freed only
                 * by this thread, after this callback. */
                http_request_check(r,
                                   HTTP_REQUEST_LIVE & ~(BIT(HTTP_ST_READING) | BIT(HTTP_ST_SENT)),
                                   "a fast handler returned 'handed off' without parking");
                return MHD_YES;
            case HTTP_PASS:
            default:
                http_request_check(r, BIT(HTTP_ST_READING),
                                   "a fast handler passed an answered request");
                break;
            }
        }
        if (rt->fn == NULL) {
            http_send_error(r, API_UNAVAILABLE, "the route left the request unanswered");
            return mhd_result(r);
        }
        return defer(r);
    }
    if (i == HTTP_ROUTE_NONE)
        http_send_error(r, API_NOT_FOUND, NULL);
    else {
        r->route = HTTP_ROUTE_METHOD - i;
        http_send_error_header(r, API_METHOD_NOT_ALLOWED, NULL, MHD_HTTP_HEADER_ALLOW, allow);
    }
    return mhd_result(r);
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
        r = http_request_new(conn, method, url);
        *req_cls = r;
        atomic_fetch_add(&in_flight, 1);
        if (refuse_ambiguous(r))
            return MHD_YES;                  /* answered; MHD closes after it */
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        int64_t n;
        if (cl != NULL && (util_parse_u63(cl, strlen(cl), &n) != 0 || (uint64_t)n > drain_cap())) {
            http_send_error(r, API_BODY_TOO_LARGE, NULL);   /* MHD closes after it */
            return mhd_result(r);
        }
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
    /* The whole request is in, or it is back from a worker or a holder. */
    switch (http_request_state(r)) {
    case HTTP_ST_RESUMED:
        return resumed(r);
    case HTTP_ST_SENT:
        return MHD_YES;                      /* answered before its body was read */
    case HTTP_ST_READING:
        break;
    default:
        http_request_misuse(r, http_request_state(r),
                            "libmicrohttpd called back a suspended request");
    }
    if (r->too_large) {
        http_send_error(r, API_BODY_TOO_LARGE, NULL);
        return mhd_result(r);
    }
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
        counters_request(r->route, r->status, r->err, us);
        log_access(&a);
    } else {
        log_debug("request %s %s ended without answer (termination %d)", r->method, r->url,
                  (int)toe);
    }
    http_request_check(r, BIT(HTTP_ST_READING) | BIT(HTTP_ST_RESUMED) | BIT(HTTP_ST_SENT),
                       "libmicrohttpd completed a request another thread holds");
    if (r->held != NULL)
        MHD_destroy_response(r->held);
    free(r->body);
    http_request_free(r);
    *req_cls = NULL;
    atomic_fetch_sub(&in_flight, 1);
}

/* Counts open connections, for the drain. */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode toe)
{
    (void)cls;
    (void)conn;
    (void)socket_ctx;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED)
        atomic_fetch_add(&open_conns, 1);
    else if (toe == MHD_CONNECTION_NOTIFY_CLOSED)
        atomic_fetch_sub(&open_conns, 1);
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

int http_start(const http_route *routes, size_t nroutes)
{
    struct sockaddr_in addr;

    http_router_set(routes, nroutes);
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)g_cfg.port);
    if (inet_pton(AF_INET, g_cfg.bind, &addr.sin_addr) != 1) {
        log_error("invalid BIND address '%s' (IPv4 expected)", g_cfg.bind);
        return -1;
    }
    if (http_workers_start(g_cfg.threads) != 0) {
        http_workers_stop();
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
        /* Request line and headers must fit; nginx in front allows 4 x 6 KiB.
         * MHD zeroes this pool on every keep-alive request and keeps one per
         * connection, so it is kept no larger than that. */
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)HTTP_POOL_BYTES,
        MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024u,
        /* No MHD_OPTION_LISTENING_ADDRESS_REUSE: its 1 is SO_REUSEPORT, which
         * let a second instance given the same PORT start and take half the
         * connections. libmicrohttpd's default, SO_REUSEADDR, still lets a
         * restart bind past connections in TIME_WAIT. */
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, NULL,
        MHD_OPTION_UNESCAPE_CALLBACK, keep_escapes, NULL,
        MHD_OPTION_END);
    if (daemon_handle == NULL) {
        log_error("cannot listen on %s:%d (port in use?)", g_cfg.bind, g_cfg.port);
        http_workers_stop();
        return -1;
    }
    return 0;
}

/* Sleeps in 10 ms steps while *counter > 0, until 'deadline' (monotonic
 * microseconds); returns what is left. */
static int wait_zero(_Atomic int *counter, int64_t deadline)
{
    struct timespec tick = { 0, 10 * 1000 * 1000 };

    while (atomic_load(counter) > 0 && util_mono_us() < deadline)
        nanosleep(&tick, NULL);
    return atomic_load(counter);
}

void http_drain(int drain_ms, int grace_ms)
{
    MHD_socket listener;
    int left;

    if (daemon_handle == NULL || http_draining())
        return;
    http_response_close_begin();
    /* Stop accepting: the listening socket is closed, not just left
     * unread, so that a connection attempt is refused at once instead of
     * waiting in the backlog until the process exits. */
    listener = MHD_quiesce_daemon(daemon_handle);
    if (listener != MHD_INVALID_SOCKET)
        close(listener);
    left = wait_zero(&open_conns, util_mono_us() + (int64_t)drain_ms * 1000);
    if (left > 0)
        log_info("shutdown: %d connections still open after %d ms: closing them once the "
                 "requests in flight are answered", left, drain_ms);
    /* Requests already read keep running until answered. */
    left = wait_zero(&in_flight, util_mono_us() + (int64_t)grace_ms * 1000);
    if (left > 0)
        log_warn("shutdown: %d requests still open after %d ms", left, grace_ms);
    /* libmicrohttpd refuses to stop with a connection still suspended: every
     * queued request is answered (503) and resumed before it is asked to. */
    http_workers_stop();
}

void http_stop(void)
{
    if (daemon_handle == NULL)
        return;
    http_workers_stop();                     /* when http_drain was not called */
    /* The answers made last are sent by the event threads. */
    wait_zero(&in_flight, util_mono_us() + 1000 * 1000);
    MHD_stop_daemon(daemon_handle);
    daemon_handle = NULL;
}
