/* http: libmicrohttpd daemon, body collection, routing, responses, the
 * hand-off of blocking requests to the worker pool, and the one state each
 * request is in. */
#include "http.h"
#include "config.h"
#include "log.h"
#include "rec.h"
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
#include <unistd.h>

/* Under AddressSanitizer, completed requests are also poisoned (req_free):
 * any access to one is reported. */
#if defined(__SANITIZE_ADDRESS__)
#define HTTP_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HTTP_ASAN 1
#endif
#endif
#ifdef HTTP_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define HTTP_POOL_BYTES (32 * 1024)   /* per connection: request line + headers */

static struct MHD_Daemon *daemon_handle;
static const http_route *route_table;
static size_t route_count;
static _Atomic int in_flight;
static _Atomic int open_conns;     /* HTTP connections open now */
static _Atomic int draining;       /* http_drain has begun */

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

/*---- the request's state ----*/

#define BIT(st) (1u << (st))
#define LIVE (BIT(HTTP_ST_READING) | BIT(HTTP_ST_QUEUED) | BIT(HTTP_ST_ON_WORKER) | BIT(HTTP_ST_HANDED) | \
              BIT(HTTP_ST_ANSWERED) | BIT(HTTP_ST_RESUMED) | BIT(HTTP_ST_SENT))
#define ANSWERABLE (BIT(HTTP_ST_READING) | BIT(HTTP_ST_ON_WORKER) | BIT(HTTP_ST_HANDED))
#define ANSWER "answer by a thread that does not hold the request (answered twice?)"

static const char *state_name(int st)
{
    static const char *const names[] = {
        [HTTP_ST_READING] = "reading", [HTTP_ST_QUEUED] = "queued",
        [HTTP_ST_ON_WORKER] = "on a worker", [HTTP_ST_HANDED] = "handed off",
        [HTTP_ST_ANSWERED] = "answered", [HTTP_ST_RESUMED] = "given back to its event thread",
        [HTTP_ST_SENT] = "sent", [HTTP_ST_DEAD] = "completed and freed",
    };
    return st >= HTTP_ST_READING && st <= HTTP_ST_DEAD ? names[st] : "corrupt";
}

/* A misuse of a request (answered twice, handed off after its answer,
 * touched after it was given back): a bug that would otherwise corrupt
 * memory. Stops the process with the reason. */
static void misuse(const http_req *r, int st, const char *what)
{
    log_error("http: %s: request %s is %s", what,
              st == HTTP_ST_DEAD ? "(freed)" : r->request_id, state_name(st));
    abort();
}

static int state_of(const http_req *r)
{
    return atomic_load_explicit(&r->state, memory_order_acquire);
}

/* Checks that 'r' is in one of the states of 'allowed' (a mask of BIT()). */
static void check(const http_req *r, unsigned allowed, const char *what)
{
    int st = state_of(r);

    if (st < HTTP_ST_READING || st > HTTP_ST_DEAD || !(allowed & BIT(st)))
        misuse(r, st, what);
}

/* The one way a request changes state: from one of 'from' to 'to', in one
 * atomic step, so that two threads cannot both make the same move. Returns
 * the state it left. */
static int move(http_req *r, unsigned from, http_state to, const char *what)
{
    int st = state_of(r);

    do {
        if (st < HTTP_ST_READING || st > HTTP_ST_DEAD || !(from & BIT(st)))
            misuse(r, st, what);
    } while (!atomic_compare_exchange_weak_explicit(&r->state, &st, (int)to, memory_order_acq_rel,
                                                    memory_order_acquire));
    return st;
}

/* Gives an answered, suspended request back to its event thread, which
 * sends the answer. The caller must not touch 'r' after this. */
static void resume(http_req *r, const char *what)
{
    struct MHD_Connection *c = r->conn;

    move(r, BIT(HTTP_ST_ANSWERED), HTTP_ST_RESUMED, what);
    MHD_resume_connection(c);
}

/* Completed requests wait here a while before free(): a thread that
 * touches one after its answer (a second answer from a batch's leader, say)
 * then finds it marked HTTP_ST_DEAD and stops with a message, instead of
 * writing into memory that belongs to someone else by then. Each event
 * thread has a lane of its own (no cache line shared on the hot path); the
 * exchange keeps it right should two threads share a lane. */
#define QUARANTINE_LANES 8
#define QUARANTINE_SLOTS 32                /* per lane: 256 bytes, four cache lines */
static struct {
    _Alignas(64) _Atomic(http_req *) slot[QUARANTINE_SLOTS];
} quarantine[QUARANTINE_LANES];
static _Atomic unsigned quarantine_lanes;

static void req_free(http_req *r)
{
    static _Thread_local unsigned lane, next;
    static _Thread_local int have_lane;
    http_req *old;

    if (!have_lane) {
        lane = atomic_fetch_add_explicit(&quarantine_lanes, 1, memory_order_relaxed) %
               QUARANTINE_LANES;
        have_lane = 1;
    }
    move(r, LIVE, HTTP_ST_DEAD, "completion");
    POISON(r, sizeof *r);
    old = atomic_exchange_explicit(&quarantine[lane].slot[next++ % QUARANTINE_SLOTS], r,
                                   memory_order_acq_rel);
    if (old != NULL) {
        UNPOISON(old, sizeof *old);
        free(old);
    }
}

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

int64_t http_deadline_us(const http_req *r)
{
    return g_cfg.request_deadline_ms > 0 ? r->start_us + (int64_t)g_cfg.request_deadline_ms * 1000
                                         : INT64_MAX;
}

const char *http_header(http_req *r, const char *name)
{
    return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

int http_draining(void)
{
    return atomic_load_explicit(&draining, memory_order_relaxed);
}

/* While draining, every answer asks its client to close the connection
 * after it: each open connection then carries at most one more request.
 * Called where an answer is handed to libmicrohttpd (an answer made before
 * the drain began gets it too). */
static void close_if_draining(struct MHD_Response *resp)
{
    if (http_draining() &&
        MHD_get_response_header(resp, MHD_HTTP_HEADER_CONNECTION) == NULL)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
}

/* Makes the answer 'resp' (NULL: none could be built: the connection
 * closes): straight to libmicrohttpd on the event thread, else kept for the
 * event thread; a handed-off request goes back to it at once. */
static http_outcome answer(http_req *r, int status, struct MHD_Response *resp,
                           const char *content_type)
{
    int was;

    if (resp != NULL) {
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
        MHD_add_response_header(resp, "X-Instance-Id", g_cfg.instance_id);
        MHD_add_response_header(resp, "X-Request-Id", r->request_id);
        if (status == 503) {
            char ra[16];
            snprintf(ra, sizeof ra, "%d", g_cfg.retry_after_s);
            MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, ra);
        }
        r->status = status;
    }
    was = move(r, ANSWERABLE, HTTP_ST_ANSWERED, ANSWER);
    if (was == HTTP_ST_READING) {
        /* On the event thread, inside libmicrohttpd's callback. */
        if (resp != NULL)
            close_if_draining(resp);
        if (resp == NULL || MHD_queue_response(r->conn, (unsigned)status, resp) != MHD_YES)
            r->close = 1;
        if (resp != NULL)
            MHD_destroy_response(resp);        /* MHD keeps its own reference */
        move(r, BIT(HTTP_ST_ANSWERED), HTTP_ST_SENT, "answer");
        return HTTP_ANSWERED;
    }
    /* Suspended: the event thread queues it at resume. */
    r->held = resp;
    r->close = resp == NULL;
    if (was == HTTP_ST_HANDED)
        resume(r, "answer");                 /* its holder is done with it */
    return HTTP_ANSWERED;
}

http_outcome http_send_text(http_req *r, int status, const char *content_type, char *text,
                            size_t len)
{
    struct MHD_Response *resp;

    check(r, ANSWERABLE, ANSWER);
    resp = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (resp == NULL)
        free(text);
    return answer(r, status, resp, content_type);
}

http_outcome http_send_json(http_req *r, int status, cJSON *body)
{
    char *text;

    check(r, ANSWERABLE, ANSWER);
    text = body ? cJSON_PrintUnformatted(body) : NULL;
    cJSON_Delete(body);
    if (text == NULL)
        return answer(r, status, NULL, NULL);
    return http_send_text(r, status, "application/json", text, strlen(text));
}

static http_outcome send_error_with(http_req *r, api_err e, const char *message,
                                    const char *hdr_name, const char *hdr_value)
{
    struct MHD_Response *resp = NULL;
    cJSON *o;
    char *text;

    check(r, ANSWERABLE, ANSWER);
    o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "error", api_err_code(e));
    cJSON_AddStringToObject(o, "message", message ? message : api_err_message(e));
    text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (text != NULL) {
        resp = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
        if (resp == NULL)
            free(text);
    }
    if (resp != NULL && hdr_name != NULL)
        MHD_add_response_header(resp, hdr_name, hdr_value);
    r->err = e;
    return answer(r, api_err_status(e), resp, "application/json");
}

http_outcome http_send_error(http_req *r, api_err e, const char *message)
{
    return send_error_with(r, e, message, NULL, NULL);
}

http_outcome http_send_error_header(http_req *r, api_err e, const char *message,
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

/* Queues r for a worker: from the event thread (suspending its connection
 * first: a worker may resume it before this thread is back in MHD), or a
 * parked request nobody took. -1 once the workers have stopped (a
 * keep-alive request during shutdown): nothing was done. */
static int wq_push(http_req *r)
{
    pthread_mutex_lock(&wq.mu);
    if (wq.stop) {
        pthread_mutex_unlock(&wq.mu);
        return -1;
    }
    if (state_of(r) == HTTP_ST_READING)
        MHD_suspend_connection(r->conn);
    move(r, BIT(HTTP_ST_READING) | BIT(HTTP_ST_HANDED), HTTP_ST_QUEUED, "queue");
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

/* The next request, now on this worker, or NULL when the pool stops.
 * *closing: answer 503. */
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
        move(r, BIT(HTTP_ST_QUEUED), HTTP_ST_ON_WORKER, "take from the queue");
    }
    *closing = wq.closing;
    pthread_mutex_unlock(&wq.mu);
    return r;
}

http_outcome http_hand_off(http_req *r)
{
    move(r, BIT(HTTP_ST_ON_WORKER), HTTP_ST_HANDED,
         "hand-off by a thread that does not hold the request");
    return HTTP_HANDED_OFF;
}

static http_worker_init_fn worker_init;   /* set before the workers start */

void http_set_worker_init(http_worker_init_fn fn)
{
    worker_init = fn;
}

static void *worker_main(void *arg)
{
    http_outcome out;
    http_req *r;
    int closing;

    util_thread_name("sk-worker");
    (void)arg;
    if (worker_init != NULL)
        worker_init();
    while ((r = wq_pop(&closing)) != NULL) {
        if (closing)
            out = http_send_error(r, API_UNAVAILABLE, "shutting down, retry later");
        else if (util_mono_us() > http_deadline_us(r))
            out = http_send_error(r, API_UNAVAILABLE, API_LATE_MESSAGE);
        else
            out = route_table[r->route].fn(r, r->arg, r->arg_len);
        if (out == HTTP_HANDED_OFF)
            continue;                        /* another thread answers it: not ours any more */
        if (out != HTTP_ANSWERED)
            misuse(r, state_of(r), "a worker's handler must answer or hand off");
        resume(r, "a worker's handler returned without answering");
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

/* The answer of a request the event thread finished with, as libmicrohttpd
 * wants it: MHD_NO closes the connection. */
static enum MHD_Result mhd_result(const http_req *r)
{
    return r->close ? MHD_NO : MHD_YES;
}

/* Hands the request to a worker; its answer is queued when it resumes. */
static enum MHD_Result defer(http_req *r)
{
    if (wq_push(r) != 0) {
        http_send_error(r, API_UNAVAILABLE, "shutting down, retry later");
        return mhd_result(r);
    }
    return MHD_YES;
}

int http_park(http_req *r)
{
    int ret = -1;

    pthread_mutex_lock(&wq.mu);
    if (!wq.stop) {
        check(r, BIT(HTTP_ST_READING), "park");
        MHD_suspend_connection(r->conn);
        move(r, BIT(HTTP_ST_READING), HTTP_ST_HANDED, "park");
        ret = 0;
    }
    pthread_mutex_unlock(&wq.mu);
    return ret;
}

void http_unpark(http_req *r)
{
    check(r, BIT(HTTP_ST_HANDED), "unpark");
    if (wq_push(r) == 0)
        return;
    /* The workers stopped since http_park: answered here, sent at resume. */
    http_send_error(r, API_UNAVAILABLE, "shutting down, retry later");
}

/* Back on the event thread after the worker or the holder: queue what it
 * answered. */
static enum MHD_Result resumed(http_req *r)
{
    struct MHD_Response *resp = r->held;
    enum MHD_Result ret = MHD_NO;

    move(r, BIT(HTTP_ST_RESUMED), HTTP_ST_SENT, "send");
    r->held = NULL;
    if (resp != NULL) {
        close_if_draining(resp);
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
    int i = http_route_find(route_table, route_count, r->method, r->url, &arg, &arg_len, allow,
                            sizeof allow);

    if (i >= 0) {
        const http_route *rt = &route_table[i];
        r->route = i;
        r->arg = arg;
        r->arg_len = arg_len;
        if (rt->fast != NULL) {
            switch (rt->fast(r, arg, arg_len)) {
            case HTTP_ANSWERED:
                check(r, BIT(HTTP_ST_SENT), "a fast handler returned without answering");
                return mhd_result(r);
            case HTTP_HANDED_OFF:
                /* Parked: r may be answered already, but it is freed only
                 * by this thread, after this callback. */
                check(r, LIVE & ~(BIT(HTTP_ST_READING) | BIT(HTTP_ST_SENT)),
                      "a fast handler returned 'handed off' without parking");
                return MHD_YES;
            case HTTP_PASS:
            default:
                check(r, BIT(HTTP_ST_READING), "a fast handler passed an answered request");
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
        send_error_with(r, API_METHOD_NOT_ALLOWED, NULL, MHD_HTTP_HEADER_ALLOW, allow);
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
        r = xcalloc(1, sizeof *r);
        r->conn = conn;
        r->method = method;
        r->url = url;
        r->start_us = util_mono_us();
        r->route = REC_NO_ROUTE;
        atomic_init(&r->state, HTTP_ST_READING);
        set_request_id(r);
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
    switch (state_of(r)) {
    case HTTP_ST_RESUMED:
        return resumed(r);
    case HTTP_ST_SENT:
        return MHD_YES;                      /* answered before its body was read */
    case HTTP_ST_READING:
        break;
    default:
        misuse(r, state_of(r), "libmicrohttpd called back a suspended request");
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
        rec_request(r->route, r->status, r->err, us);
        log_access(&a);
    } else {
        log_debug("request %s %s ended without answer (termination %d)", r->method, r->url,
                  (int)toe);
    }
    check(r, BIT(HTTP_ST_READING) | BIT(HTTP_ST_RESUMED) | BIT(HTTP_ST_SENT),
          "libmicrohttpd completed a request another thread holds");
    if (r->held != NULL)
        MHD_destroy_response(r->held);
    free(r->body);
    req_free(r);
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

/* "/voucher/ * /seckill" (no spaces) -> "/voucher/{id}/seckill" for metrics labels. */
static char route_label_buf[REC_MAX_ROUTES][64];
static const char *route_labels[REC_MAX_ROUTES];

static void set_route_labels(void)
{
    size_t n = route_count < REC_MAX_ROUTES ? route_count : REC_MAX_ROUTES;

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
}

const char *http_route_label(int i)
{
    return i >= 0 && i < REC_MAX_ROUTES ? route_labels[i] : NULL;
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
        workers_stop();
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
    atomic_store(&draining, 1);
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
    workers_stop();
}

void http_stop(void)
{
    if (daemon_handle == NULL)
        return;
    workers_stop();                          /* when http_drain was not called */
    /* The answers made last are sent by the event threads. */
    wait_zero(&in_flight, util_mono_us() + 1000 * 1000);
    MHD_stop_daemon(daemon_handle);
    daemon_handle = NULL;
}
