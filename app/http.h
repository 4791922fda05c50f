/* http: the libmicrohttpd glue. A few event threads (IO_THREADS, epoll) read
 * requests, collect bodies up to a limit and match a route table by path then
 * method. A route's fast handler runs there and answers what memory alone can
 * (bad input, a voucher known to be sold out); everything else is handed to a
 * pool of worker threads (THREADS) while libmicrohttpd keeps the connection
 * suspended. Workers may block on Redis and Postgres and use their own
 * connection set (conn.h) without locks; event threads never block, so a
 * crowd refused from memory is not queued behind buyers waiting for a commit.
 */
#ifndef SECKILL_HTTP_H
#define SECKILL_HTTP_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <cJSON.h>
#include <microhttpd.h>

#include "api.h"

/* Where a request stands. Every change goes through one checked
 * transition in http.c: a request answered twice, handed off after its
 * answer, or touched after it was given back to libmicrohttpd stops the
 * process with a message instead of corrupting memory. */
typedef enum http_state {
    HTTP_ST_READING = 1,     /* its event thread reads it and runs the fast handler */
    HTTP_ST_QUEUED,          /* suspended, in the work queue */
    HTTP_ST_ON_WORKER,       /* suspended, a worker runs the route's handler */
    HTTP_ST_HANDED,          /* suspended, held by another thread, which answers it */
    HTTP_ST_ANSWERED,        /* suspended, its answer made and kept for the event thread */
    HTTP_ST_RESUMED,         /* given back to its event thread: no other thread may touch it */
    HTTP_ST_SENT,            /* its answer is queued in libmicrohttpd */
    HTTP_ST_DEAD             /* completed: freed (after a short quarantine) */
} http_state;

typedef struct http_req {
    struct MHD_Connection *conn;
    const char *method;       /* borrowed from MHD, valid for the request */
    const char *url;          /* path without the query string */
    char *body;               /* NUL-terminated; owned, freed at completion */
    size_t body_len;
    size_t body_seen;         /* bytes received, stored or not */
    int too_large;
    int64_t start_us;
    int status;               /* answer sent, for the access log and stats */
    api_err err;
    int route;                /* index in the route table, or -1 */
    char request_id[96];      /* X-Request-Id (from nginx) or made here */
    int64_t voucher_id;       /* for the access log, when the handler knows them */
    int64_t user_id;
    int64_t order_id;
    /* http.c's own. */
    _Atomic int state;        /* enum http_state */
    struct MHD_Response *held;   /* an answer made while suspended */
    int close;                /* the answer could not be made or queued: close */
    const char *arg;          /* the route's '*' segment, inside url */
    size_t arg_len;
    struct http_req *next;    /* the work queue's link */
} http_req;

/* What a handler did with its request. */
typedef enum http_outcome {
    HTTP_ANSWERED,            /* answered with one http_send_* call */
    HTTP_PASS,                /* fast handler only: not answered, run the route's 'fn' */
    HTTP_HANDED_OFF           /* given to another thread (http_hand_off, http_park):
                                 not this thread's to touch any more */
} http_outcome;

/* A handler answers with one of the http_send_* calls and returns what it
 * returned, or hands the request off and returns HTTP_HANDED_OFF. 'arg' is
 * the path segment matched by '*' in the route (may be empty). */
typedef http_outcome (*http_handler)(http_req *r, const char *arg, size_t arg_len);

/* 'fast' (may be NULL) runs on the event thread and must not block: it
 * answers, parks the request (http_park), or returns HTTP_PASS to pass it
 * to 'fn' on a worker (what it stored in the request, such as user_id, is
 * kept). 'fn' NULL: 'fast' always answers. */
typedef struct http_route {
    const char *method;       /* "GET", "POST"; GET routes also answer HEAD */
    const char *pattern;      /* "/voucher/ * /seckill" without spaces: '*' is one segment */
    http_handler fn;
    http_handler fast;
} http_route;

/* The router, free of MHD state (and so fuzzable). Returns the index of the
 * route that matches 'path' and 'method' (with its '*' segment in arg), or
 * HTTP_ROUTE_NONE when no pattern matches the path, or HTTP_ROUTE_METHOD - i
 * when route i's path matches but no route takes the method; then 'allow'
 * lists the methods that would ("GET, HEAD, POST"). */
#define HTTP_ROUTE_NONE (-1)
#define HTTP_ROUTE_METHOD (-2)
int http_route_find(const http_route *routes, size_t n, const char *method, const char *path,
                    const char **arg, size_t *arg_len, char *allow, size_t allow_len);

/* Starts the workers and the daemon on g_cfg.bind:g_cfg.port with 'routes'
 * (borrowed for the daemon's lifetime). Returns 0 or -1. */
int http_start(const http_route *routes, size_t nroutes);

/* Runs on each worker thread as it starts, before it takes a request
 * (main opens the thread's connections there). Call before http_start. */
typedef void (*http_worker_init_fn)(void);
void http_set_worker_init(http_worker_init_fn fn);

/* The first half of a shutdown: the drain. At once: http_draining() turns
 * 1, every answer carries "Connection: close", and the listening socket is
 * closed (a new connection is refused, so a proxy sends that request
 * elsewhere: it was never sent here). Then it serves what comes on the open
 * connections until their clients have closed them all, 'drain_ms' at most:
 * closing a keep-alive connection from this side could cut a request the
 * proxy is sending at that moment, which it must not resend if it is a
 * POST. Then it lets requests in flight finish ('grace_ms' at most; those
 * still queued for a worker then get 503) and joins the workers. From then
 * on http_park refuses. */
void http_drain(int drain_ms, int grace_ms);

/* The second half, once every request parked by a fast handler has been
 * answered (libmicrohttpd cannot stop with a connection suspended): sends
 * the last answers and closes every connection. */
void http_stop(void);

/* 1 once http_drain has begun: the instance is going away (GET /ready
 * answers 503). */
int http_draining(void);

/* Handing a request to another thread. From then on the holder answers it
 * with exactly one http_send_* call, and that call gives the request back
 * to its event thread: the holder must not touch it after (it may be freed
 * at once; a second answer stops the process).
 *
 * http_hand_off: for a handler on a worker; returns HTTP_HANDED_OFF, for the
 * handler to return without touching 'r' again. Call it before handing 'r'
 * over: the holder may answer before the handler returns.
 *
 * http_park: for a 'fast' handler on the event thread: suspends the
 * connection. Returns 0, or -1 having done nothing once the workers have
 * stopped. The handler then returns HTTP_HANDED_OFF. If no one took it
 * after all, http_unpark(r) passes it to the route's 'fn' on a worker
 * (answered 503 if the workers have stopped meanwhile). */
http_outcome http_hand_off(http_req *r);
int http_park(http_req *r);
void http_unpark(http_req *r);

/* Requests read and not yet answered, and those of them waiting for a
 * worker (a steady queue means the workers, not the event threads, are the
 * limit). */
void http_load(int *in_progress, int *queued);

/* The metrics label of route 'i' ("/voucher/{id}/seckill"), or NULL when
 * there is no such route. Static, set by http_start. */
const char *http_route_label(int i);

/* The request's deadline on the monotonic clock (util_mono_us): its
 * arrival plus REQUEST_DEADLINE_MS, INT64_MAX when there is none. Work
 * not started by then is answered 503 and not done: the client (nginx,
 * whose read timeout is longer) has given up, and an order it never hears
 * of helps nobody. A request still queued for a worker then is answered
 * so by the worker that takes it. */
int64_t http_deadline_us(const http_req *r);

/* Request header value, or NULL. Borrowed from MHD. */
const char *http_header(http_req *r, const char *name);

/* The answers. Each may be called once per request, by whoever holds it
 * (its event thread, its worker, or the thread it was handed to), and
 * returns HTTP_ANSWERED. An answer that cannot be built closes the
 * connection instead. */

/* Sends 'body' (taken: freed here) with 'status'. */
http_outcome http_send_json(http_req *r, int status, cJSON *body);

/* Sends 'len' bytes of 'text' (taken: freed here with free()). */
http_outcome http_send_text(http_req *r, int status, const char *content_type, char *text,
                            size_t len);

/* Sends {"error":code,"message":...} with the code's status ('message' NULL:
 * the default text). Adds Retry-After to 503. */
http_outcome http_send_error(http_req *r, api_err e, const char *message);

/* The same with one more response header 'name: value' (both borrowed). */
http_outcome http_send_error_header(http_req *r, api_err e, const char *message,
                                    const char *name, const char *value);

#endif
