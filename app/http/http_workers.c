/* http_workers: the work queue, the workers, park and hand-off
 * (http_workers.h). */
#include "http_workers.h"
#include "http_response.h"
#include "http_router.h"
#include "log.h"
#include "util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

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

static http_worker_init_fn worker_init;   /* set before the workers start */

int http_workers_push(http_req *r)
{
    pthread_mutex_lock(&wq.mu);
    if (wq.stop) {
        pthread_mutex_unlock(&wq.mu);
        return -1;
    }
    if (http_request_state(r) == HTTP_ST_READING)
        MHD_suspend_connection(r->conn);
    http_request_move(r, HTTP_REQUEST_BIT(HTTP_ST_READING) | HTTP_REQUEST_BIT(HTTP_ST_HANDED),
                      HTTP_ST_QUEUED, "queue");
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
        http_request_move(r, HTTP_REQUEST_BIT(HTTP_ST_QUEUED), HTTP_ST_ON_WORKER,
                          "take from the queue");
    }
    *closing = wq.closing;
    pthread_mutex_unlock(&wq.mu);
    return r;
}

int http_workers_queued(void)
{
    return atomic_load_explicit(&wq.depth, memory_order_relaxed);
}

http_outcome http_hand_off(http_req *r)
{
    http_request_move(r, HTTP_REQUEST_BIT(HTTP_ST_ON_WORKER), HTTP_ST_HANDED,
                      "hand-off by a thread that does not hold the request");
    return HTTP_HANDED_OFF;
}

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
            out = http_router_route(r->route)->fn(r, r->arg, r->arg_len);
        if (out == HTTP_HANDED_OFF)
            continue;                        /* another thread answers it: not ours any more */
        if (out != HTTP_ANSWERED)
            http_request_misuse(r, http_request_state(r),
                                "a worker's handler must answer or hand off");
        http_request_resume(r, "a worker's handler returned without answering");
    }
    return NULL;
}

int http_workers_start(int n)
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

void http_workers_stop(void)
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

int http_park(http_req *r)
{
    int ret = -1;

    pthread_mutex_lock(&wq.mu);
    if (!wq.stop) {
        http_request_check(r, HTTP_REQUEST_BIT(HTTP_ST_READING), "park");
        MHD_suspend_connection(r->conn);
        http_request_move(r, HTTP_REQUEST_BIT(HTTP_ST_READING), HTTP_ST_HANDED, "park");
        ret = 0;
    }
    pthread_mutex_unlock(&wq.mu);
    return ret;
}

void http_unpark(http_req *r)
{
    http_request_check(r, HTTP_REQUEST_BIT(HTTP_ST_HANDED), "unpark");
    if (http_workers_push(r) == 0)
        return;
    /* The workers stopped since http_park: answered here, sent at resume. */
    http_send_error(r, API_UNAVAILABLE, "shutting down, retry later");
}
