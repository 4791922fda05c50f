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

#include <stddef.h>
#include <stdint.h>
#include <cJSON.h>
#include <microhttpd.h>

#include "api.h"

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
    /* Worker hand-off (http.c's own). */
    int deferred;             /* suspended and queued for a worker */
    int on_worker;            /* suspended: responses are held, then queued at resume */
    struct MHD_Response *held;
    enum MHD_Result worker_ret;
    const char *arg;          /* the route's '*' segment, inside url */
    size_t arg_len;
    struct http_req *next;    /* the work queue's link */
} http_req;

/* A handler answers with one of the http_send_* calls and returns its result.
 * 'arg' is the path segment matched by '*' in the route (may be empty). */
typedef enum MHD_Result (*http_handler)(http_req *r, const char *arg, size_t arg_len);

/* 'fast' (may be NULL) runs on the event thread and must not block: it
 * answers, or returns MHD_YES without answering to pass the request to 'fn'
 * on a worker (what it stored in the request, such as user_id, is kept).
 * 'fn' NULL: 'fast' always answers. */
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

/* Stops accepting, lets requests in flight finish (up to 'grace_ms'; those
 * still queued for a worker then get 503), joins the workers, then closes
 * every connection. */
void http_stop(int grace_ms);

/* For a handler on a worker that hands 'r' to another thread: the worker
 * will not give the request back to its event thread when the handler
 * returns. Whoever holds 'r' then answers with one http_send_* call and
 * calls http_finish(r); 'r' must not be touched after that (it may be freed
 * at once). Call before handing 'r' over. */
void http_later(http_req *r);
void http_finish(http_req *r);

/* For a 'fast' handler that hands 'r' to another thread without a worker:
 * suspends its connection; from then on, as after http_later, whoever holds
 * 'r' answers it and calls http_finish(r), and the handler returns MHD_YES
 * without touching 'r' again. If no one took it after all, http_unpark(r)
 * passes it to the route's 'fn' on a worker (answered 503 if the workers
 * have stopped meanwhile). http_park returns -1, having done nothing, once
 * the workers have stopped; 'arg' is what 'fn' will get. */
int http_park(http_req *r, const char *arg, size_t arg_len);
void http_unpark(http_req *r);

/* Requests read and not yet answered, and those of them waiting for a
 * worker (a steady queue means the workers, not the event threads, are the
 * limit). */
void http_load(int *in_progress, int *queued);

/* Request header value, or NULL. Borrowed from MHD. */
const char *http_header(http_req *r, const char *name);

/* Sends 'body' (taken: freed here) with 'status'. */
enum MHD_Result http_send_json(http_req *r, int status, cJSON *body);

/* Sends 'len' bytes of 'text' (taken: freed here with free()). */
enum MHD_Result http_send_text(http_req *r, int status, const char *content_type, char *text,
                               size_t len);

/* Sends {"error":code,"message":...} with the code's status ('message' NULL:
 * the default text). Adds Retry-After to 503. */
enum MHD_Result http_send_error(http_req *r, api_err e, const char *message);

/* The same with one more response header 'name: value' (both borrowed). */
enum MHD_Result http_send_error_header(http_req *r, api_err e, const char *message,
                                       const char *name, const char *value);

#endif
