/* http: the libmicrohttpd glue. A few event threads (IO_THREADS, epoll) read
 * requests, collect bodies up to a limit and match a route table by path then
 * method. A route's fast handler runs there and answers what memory alone can
 * (bad input, a voucher known to be sold out); everything else is handed to a
 * pool of worker threads (THREADS) while libmicrohttpd keeps the connection
 * suspended. Workers may block on Redis and Postgres and use their own
 * connection set (conn.h) without locks; event threads never block, so a
 * crowd refused from memory is not queued behind buyers waiting for a commit.
 *
 * The layer's parts, each with its header (included here, so that a caller
 * includes http.h alone):
 *   http_request   the request and its one state (every change one checked move)
 *   http_response  the answers (http_send_*)
 *   http_router    the route table and its matching
 *   http_workers   the work queue, the workers, park and hand-off
 *   http           this one: the daemon, its callbacks, start, drain, stop
 *
 * Threading: http_start, http_drain and http_stop from one thread (main's),
 * in that order; the rest from any thread. */
#ifndef SECKILL_HTTP_H
#define SECKILL_HTTP_H

#include <stddef.h>

#include "http_request.h"
#include "http_response.h"
#include "http_router.h"
#include "http_workers.h"

/* Starts the workers and the daemon on g_cfg.bind:g_cfg.port with 'routes'
 * (borrowed for the daemon's lifetime). Returns 0, or -1 (logged here: a
 * start function logs its own failure). */
int http_start(const http_route *routes, size_t nroutes);

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

/* Requests read and not yet answered, and those of them waiting for a
 * worker (a steady queue means the workers, not the event threads, are the
 * limit). */
void http_load(int *in_progress, int *queued);

#endif
