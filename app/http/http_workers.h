/* http_workers: the work queue and the worker threads (THREADS), and the
 * hand-off of a request to another thread.
 *
 * Event threads queue the requests whose route needs a worker, with their
 * connection suspended; workers take them in order (FIFO) and run the
 * route's 'fn', which may block on Redis and Postgres on the worker's own
 * connections (conn.h) without locks. A worker answers (the request goes
 * back to its event thread) or hands the request off to a thread that
 * answers it later.
 *
 * The workers are not bgthreads (bgthread.h): a worker waits for its work
 * queue, not for a time, and a stop first lets them answer what is still
 * queued (503). Threading: start and stop from one thread (main's);
 * the queue, http_park and http_unpark from any thread. */
#ifndef SECKILL_HTTP_WORKERS_H
#define SECKILL_HTTP_WORKERS_H

#include "http_request.h"

/* Runs on each worker thread as it starts, before it takes a request
 * (main opens the thread's connections there). Call before http_start. */
typedef void (*http_worker_init_fn)(void);
void http_set_worker_init(http_worker_init_fn fn);

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

/*---- the HTTP layer's own ----*/

/* Starts 'n' workers on the route table in force (http_router_set).
 * Returns 0, or -1 (logged; those started are left running: stop them
 * with http_workers_stop). */
int http_workers_start(int n);

/* Lets the workers empty the queue (503 for what is left), then joins
 * them. From then on the queue and http_park refuse. Idempotent. */
void http_workers_stop(void);

/* Queues 'r' for a worker: from its event thread (READING: its connection
 * is suspended first, since a worker may resume it before that thread is
 * back in libmicrohttpd), or a parked request nobody took (HANDED).
 * Returns 0, or -1 once the workers have stopped: nothing was done. */
int http_workers_push(http_req *r);

/* Requests queued and not yet taken. Any thread. */
int http_workers_queued(void);

#endif
