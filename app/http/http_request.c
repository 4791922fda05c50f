/* http_request: the request's one state, its checked moves, its id, and
 * the quarantine of completed requests (http_request.h). */
#include "http_request.h"
#include "config.h"
#include "log.h"
#include "counters.h"
#include "util.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Under AddressSanitizer, completed requests are also poisoned
 * (http_request_free): any access to one is reported. */
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

void http_request_misuse(const http_req *r, int st, const char *what)
{
    log_error("http: %s: request %s is %s", what,
              st == HTTP_ST_DEAD ? "(freed)" : r->request_id, state_name(st));
    abort();
}

int http_request_state(const http_req *r)
{
    return atomic_load_explicit(&r->state, memory_order_acquire);
}

void http_request_check(const http_req *r, unsigned allowed, const char *what)
{
    int st = http_request_state(r);

    if (st < HTTP_ST_READING || st > HTTP_ST_DEAD || !(allowed & HTTP_REQUEST_BIT(st)))
        http_request_misuse(r, st, what);
}

int http_request_move(http_req *r, unsigned from, http_state to, const char *what)
{
    int st = http_request_state(r);

    do {
        if (st < HTTP_ST_READING || st > HTTP_ST_DEAD || !(from & HTTP_REQUEST_BIT(st)))
            http_request_misuse(r, st, what);
    } while (!atomic_compare_exchange_weak_explicit(&r->state, &st, (int)to, memory_order_acq_rel,
                                                    memory_order_acquire));
    return st;
}

void http_request_resume(http_req *r, const char *what)
{
    struct MHD_Connection *c = r->conn;

    http_request_move(r, HTTP_REQUEST_BIT(HTTP_ST_ANSWERED), HTTP_ST_RESUMED, what);
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

void http_request_free(http_req *r)
{
    static _Thread_local unsigned lane, next;
    static _Thread_local int have_lane;
    http_req *old;

    if (!have_lane) {
        lane = atomic_fetch_add_explicit(&quarantine_lanes, 1, memory_order_relaxed) %
               QUARANTINE_LANES;
        have_lane = 1;
    }
    http_request_move(r, HTTP_REQUEST_LIVE, HTTP_ST_DEAD, "completion");
    POISON(r, sizeof *r);
    old = atomic_exchange_explicit(&quarantine[lane].slot[next++ % QUARANTINE_SLOTS], r,
                                   memory_order_acq_rel);
    if (old != NULL) {
        UNPOISON(old, sizeof *old);
        free(old);
    }
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

http_req *http_request_new(struct MHD_Connection *conn, const char *method, const char *url)
{
    http_req *r = xcalloc(1, sizeof *r);

    r->conn = conn;
    r->method = method;
    r->url = url;
    r->start_us = util_mono_us();
    r->route = COUNTERS_NO_ROUTE;
    atomic_init(&r->state, HTTP_ST_READING);
    set_request_id(r);
    return r;
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
