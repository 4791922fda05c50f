/* http_request: a request as the HTTP layer holds it, and the one state it
 * is in. Every change of state goes through one checked, atomic move
 * (http_request_move): a request answered twice, handed off after its
 * answer, or touched after it was given back to libmicrohttpd stops the
 * process with a message instead of corrupting memory.
 *
 * Ownership: a request is made by its event thread when its headers are in
 * (http_request_new) and freed by the same thread when libmicrohttpd
 * completes it (http_request_free). In between it belongs to whoever holds
 * it in its state: its event thread (READING, RESUMED, SENT), the work
 * queue (QUEUED), a worker (ON_WORKER), the thread it was handed to
 * (HANDED). Only the holder touches it; the state itself may be read by
 * any thread. */
#ifndef SECKILL_HTTP_REQUEST_H
#define SECKILL_HTTP_REQUEST_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <microhttpd.h>

#include "api_err.h"

/* Where a request stands. */
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
    /* The HTTP layer's own. */
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

/* The request's deadline on the monotonic clock (util_mono_us): its
 * arrival plus REQUEST_DEADLINE_MS, INT64_MAX when there is none. Work
 * not started by then is answered 503 and not done: the client (nginx,
 * whose read timeout is longer) has given up, and an order it never hears
 * of helps nobody. A request still queued for a worker then is answered
 * so by the worker that takes it. */
int64_t http_deadline_us(const http_req *r);

/* Request header value, or NULL. Borrowed from MHD. */
const char *http_header(http_req *r, const char *name);

/*---- the HTTP layer's own ----*/

/* Sets of states, for http_request_check and http_request_move. */
#define HTTP_REQUEST_BIT(st) (1u << (st))
#define HTTP_REQUEST_LIVE                                                                    \
    (HTTP_REQUEST_BIT(HTTP_ST_READING) | HTTP_REQUEST_BIT(HTTP_ST_QUEUED) |                  \
     HTTP_REQUEST_BIT(HTTP_ST_ON_WORKER) | HTTP_REQUEST_BIT(HTTP_ST_HANDED) |                \
     HTTP_REQUEST_BIT(HTTP_ST_ANSWERED) | HTTP_REQUEST_BIT(HTTP_ST_RESUMED) |                \
     HTTP_REQUEST_BIT(HTTP_ST_SENT))
/* Whoever holds a request in these states may answer it. */
#define HTTP_REQUEST_ANSWERABLE                                                              \
    (HTTP_REQUEST_BIT(HTTP_ST_READING) | HTTP_REQUEST_BIT(HTTP_ST_ON_WORKER) |               \
     HTTP_REQUEST_BIT(HTTP_ST_HANDED))
#define HTTP_REQUEST_ANSWER_MISUSE                                                            \
    "answer by a thread that does not hold the request (answered twice?)"

/* A new request on its event thread, READING, with its request id (nginx's
 * X-Request-Id when it is a sane token, else one made here). Owned by the
 * HTTP layer until http_request_free. */
http_req *http_request_new(struct MHD_Connection *conn, const char *method, const char *url);

/* Its state now (enum http_state). */
int http_request_state(const http_req *r);

/* A misuse (answered twice, handed off after its answer, touched after it
 * was given back): stops the process with 'what' and the state 'st'. */
_Noreturn void http_request_misuse(const http_req *r, int st, const char *what);

/* Stops the process (http_request_misuse) unless 'r' is in one of the
 * states of 'allowed' (a mask of HTTP_REQUEST_BIT). */
void http_request_check(const http_req *r, unsigned allowed, const char *what);

/* The one way a request changes state: from one of 'from' to 'to', in one
 * atomic step, so that two threads cannot both make the same move; any
 * other state is a misuse. Returns the state it left. */
int http_request_move(http_req *r, unsigned from, http_state to, const char *what);

/* Gives an answered, suspended request back to its event thread
 * (ANSWERED -> RESUMED), which sends the answer. The caller must not touch
 * 'r' after this. */
void http_request_resume(http_req *r, const char *what);

/* Completes 'r' (-> DEAD) on its event thread, its body and held answer
 * already released: it waits in a small quarantine before free(), so that
 * a late touch finds it DEAD and stops the process with a message rather
 * than writing into memory that belongs to someone else. */
void http_request_free(http_req *r);

#endif
