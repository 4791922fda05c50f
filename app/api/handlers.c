/* handlers: the API. Each handler validates, talks to Redis and Postgres
 * through the calling worker's own connections, and answers exactly once.
 * The f_ handlers run on the event threads first and touch memory only. */
#include "handlers.h"
#include "config.h"
#include "conn.h"
#include "broadcast.h"
#include "order.h"
#include "payload.h"
#include "log.h"
#include "stats.h"
#include "stock.h"
#include "stock_redis.h"
#include "store.h"
#include "store_voucher.h"
#include "stream_tidy.h"
#include "util.h"
#include "voucher_cache.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>

/* ---- small helpers ---- */

static http_outcome send_store_error(http_req *r, store_status st)
{
    api_err e = order_store_error(st);
    return http_send_error(r, e, e == API_UNAVAILABLE ? "database unavailable, retry later" : NULL);
}

/* Postgres on this worker, or NULL after answering 503. */
static PGconn *pg_or_respond(http_req *r, conn_set *cs)
{
    PGconn *pg = conn_pg(cs);
    if (pg == NULL)
        http_send_error(r, API_UNAVAILABLE, "database unavailable, retry later");
    return pg;
}

/* A header value's length without trailing spaces and tabs: HTTP's optional
 * whitespace around a field value is not part of it (RFC 9110, 5.5). */
static size_t header_len(const char *v)
{
    size_t n = strlen(v);
    while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t'))
        n--;
    return n;
}

/* A thread-local generator for demo users: no shared state, seeded once. */
static int64_t random_user_id(void)
{
    static _Thread_local uint64_t s;
    while (s == 0 && getrandom(&s, sizeof s, 0) != (ssize_t)sizeof s)
        ;
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    /* Above any realistic real id, below 2^53 so JavaScript reads it exactly. */
    return (int64_t)(1000000000000ULL + s % ((1ULL << 53) - 1000000000000ULL));
}

static void add_voucher_fields(cJSON *o, const store_voucher *v)
{
    char b[32], e[32];

    util_format_iso8601(v->begin_time, b, sizeof b);
    util_format_iso8601(v->end_time, e, sizeof e);
    cJSON_AddNumberToObject(o, "voucherId", (double)v->voucher_id);
    cJSON_AddStringToObject(o, "title", v->title);
    cJSON_AddNumberToObject(o, "stock", (double)v->stock);
    cJSON_AddNumberToObject(o, "initialStock", (double)v->initial_stock);
    cJSON_AddStringToObject(o, "beginTime", b);
    cJSON_AddStringToObject(o, "endTime", e);
}

/* ---- GET /health, /ready ---- */

static http_outcome h_health(http_req *r, const char *arg, size_t arg_len)
{
    cJSON *o = cJSON_CreateObject();

    (void)arg;
    (void)arg_len;
    cJSON_AddStringToObject(o, "status", "ok");
    cJSON_AddStringToObject(o, "instance", g_cfg.instance_id);
    return http_send_json(r, 200, o);
}

/* On the event thread: an instance that is stopping is not ready, whatever
 * its backends say. */
static http_outcome f_ready(http_req *r, const char *arg, size_t arg_len)
{
    (void)arg;
    (void)arg_len;
    if (http_draining())
        return http_send_error(r, API_UNAVAILABLE, "shutting down");
    return HTTP_PASS;
}

/* Redis-first admits while Redis is durable and the orders not yet in
 * Postgres stay within STREAM_BACKLOG_MAX, whether or not Postgres
 * answers: it is ready then, and says how Postgres and the backlog are. */
static http_outcome redis_first_ready(http_req *r, int pg_ok)
{
    stock_redis_figures w;
    cJSON *o;

    stock_redis_watch_get(&w);
    if (!w.durable)
        return http_send_error(r, API_UNAVAILABLE, "redis does not acknowledge orders durably");
    if (w.over_backlog)
        return http_send_error(r, API_UNAVAILABLE,
                               "too many admitted orders not yet in postgres (STREAM_BACKLOG_MAX)");
    o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "ready");
    cJSON_AddStringToObject(o, "postgres", pg_ok ? "ok" : "unreachable: orders queue in redis");
    cJSON_AddStringToObject(o, "redis", "ok");
    cJSON_AddNumberToObject(o, "backlog", (double)w.backlog);
    cJSON_AddNumberToObject(o, "backlogMax", (double)g_cfg.stream_backlog_max);
    cJSON_AddNumberToObject(o, "oldestUnsettledMs", (double)w.oldest_ms);
    return http_send_json(r, 200, o);
}

static http_outcome h_ready(http_req *r, const char *arg, size_t arg_len)
{
    conn_set *cs = conn_get();
    PGconn *pg = conn_pg(cs);
    redisContext *c = conn_redis(cs);
    int pg_ok = 0, redis_ok = 0;
    char why[256];
    cJSON *o;

    (void)arg;
    (void)arg_len;
    if (pg != NULL) {
        pg_ok = store_ping(pg) == STORE_OK;
        if (!pg_ok)
            conn_pg_broken(cs);
    }
    if (c != NULL) {
        redisReply *rep = redisCommand(c, "PING");
        redis_ok = rep != NULL && rep->type == REDIS_REPLY_STATUS;
        freeReplyObject(rep);
        if (!redis_ok)
            conn_redis_broken(cs);
    }
    if (redis_ok && stock_keeps_vouchers())
        return redis_first_ready(r, pg_ok);
    if (!pg_ok && store_ha_refusal(why, sizeof why)) {
        char msg[320];
        snprintf(msg, sizeof msg, "postgres takes no order: %s", why);
        return http_send_error(r, API_UNAVAILABLE, msg);
    }
    if (!pg_ok || !redis_ok)
        return http_send_error(r, API_UNAVAILABLE,
                               !pg_ok && !redis_ok ? "postgres and redis unreachable"
                               : !pg_ok            ? "postgres unreachable"
                                                   : "redis unreachable");
    o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "ready");
    cJSON_AddStringToObject(o, "postgres", "ok");
    cJSON_AddStringToObject(o, "redis", "ok");
    return http_send_json(r, 200, o);
}

/* ---- GET /voucher/{id} ---- */

static http_outcome h_voucher_get(http_req *r, const char *arg, size_t arg_len)
{
    conn_set *cs;
    PGconn *pg;
    store_voucher v;
    store_status st;
    int64_t id;
    cJSON *o;

    if (util_parse_id(arg, arg_len, &id) != 0)
        return http_send_error(r, API_INVALID_VOUCHER_ID, NULL);
    cs = conn_get();
    if ((pg = pg_or_respond(r, cs)) == NULL)
        return HTTP_ANSWERED;
    st = store_voucher_get(pg, id, &v);
    if (st != STORE_OK)
        return send_store_error(r, st);
    o = cJSON_CreateObject();
    add_voucher_fields(o, &v);
    return http_send_json(r, 200, o);
}

/* ---- POST /voucher/{id}/seckill: the sale ---- */

/* The voucher's window and the sold-out fast path. The stock read here only
 * rejects early; the transaction decides. */
static api_err voucher_verdict(const store_voucher *v)
{
    int64_t now = util_now_s();

    if (now < v->begin_time)
        return API_NOT_STARTED;
    if (now > v->end_time)
        return API_ENDED;
    if (v->stock <= 0)
        return API_SOLD_OUT;
    return API_OK;
}

/* The sold-out answers that nginx may repeat by itself for a while (the
 * sold-out edge, nginx/nginx.conf.tmpl): the verdicts above, whose "no
 * stock" is always Postgres's own - the voucher row read with stock 0, or
 * the flag a transaction set when it found none (voucher_cache.h; a reset drops
 * both on every instance). Never a lost compare-and-swap (stock may remain:
 * the transaction's answers carry no header at all) nor any other error.
 * The header's value is how long, in ms: EDGE_SOLD_OUT_MS, and never past
 * the voucher's end, from which on the answer is 'ended'. */
#define EDGE_SOLD_OUT_HEADER "X-Edge-Sold-Out"
#define EDGE_SOLD_OUT_MS 1000

static http_outcome send_verdict(http_req *r, api_err e, const store_voucher *v)
{
    char ms[24];
    int64_t left;

    if (e != API_SOLD_OUT)
        return http_send_error(r, e, NULL);
    left = (v->end_time + 1) * 1000 - util_wall_ms();     /* util_now_s() > end_time */
    if (left <= 0)
        return http_send_error(r, e, NULL);
    snprintf(ms, sizeof ms, "%" PRId64, left < EDGE_SOLD_OUT_MS ? left : EDGE_SOLD_OUT_MS);
    return http_send_error_header(r, e, NULL, EDGE_SOLD_OUT_HEADER, ms);
}

static void seckill_reply(void *arg, api_err err, const char *message, int64_t order_id);

/* On the event thread: 1. validate, 2. refuse from the voucher cache (sold
 * out, outside its window, or this user's order known). What the cache
 * cannot tell (a miss, stock left) goes on to h_seckill, or, batched, to
 * the voucher's batch when one is at work. */
static http_outcome f_seckill(http_req *r, const char *arg, size_t arg_len)
{
    const char *uid_text;
    store_voucher v;
    int64_t voucher_id, user_id;
    api_err e;
    int cached;

    if (util_parse_id(arg, arg_len, &voucher_id) != 0)
        return http_send_error(r, API_INVALID_VOUCHER_ID, NULL);
    uid_text = http_header(r, "X-User-Id");
    if (uid_text == NULL && g_cfg.demo_random_user)
        user_id = random_user_id();
    else if (uid_text == NULL || util_parse_id(uid_text, header_len(uid_text), &user_id) != 0)
        return http_send_error(r, API_INVALID_USER_ID, NULL);
    r->voucher_id = voucher_id;
    r->user_id = user_id;
    cached = voucher_cache_get(voucher_id, &v);
    if (cached && (e = voucher_verdict(&v)) != API_OK)
        return send_verdict(r, e, &v);
    if (voucher_cache_ordered(voucher_id, user_id))
        return http_send_error(r, API_ALREADY_ORDERED, NULL);
    /* Batched, with a batch of this voucher at work: straight into it,
     * without a worker's turn. Parked first: its leader may answer at once. */
    if (cached && order_joinable() && http_park(r) == 0) {
        if (!order_join(voucher_id, user_id, http_deadline_us(r), seckill_reply, r))
            http_unpark(r);                  /* no batch at work after all: to h_seckill */
        return HTTP_HANDED_OFF;
    }
    return HTTP_PASS;                        /* to h_seckill on a worker */
}

/* 6. The answer to a buyer who reached the order, on whichever worker
 * finished it. */
static void seckill_reply(void *arg, api_err err, const char *message, int64_t order_id)
{
    http_req *r = arg;
    char body[160];
    int n;

    stats_touch();                           /* before the answer: /stats shows it then */
    if (err != API_OK) {
        http_send_error(r, err, message);
    } else {
        r->order_id = order_id;
        /* Built by hand: ids pass 2^53, and cJSON numbers are doubles. */
        n = snprintf(body, sizeof body,
                     "{\"orderId\":\"%" PRId64 "\",\"voucherId\":%" PRId64
                     ",\"userId\":%" PRId64 "}",
                     order_id, r->voucher_id, r->user_id);
        http_send_text(r, 200, "application/json", xstrdup(body), (size_t)n);
    }
    /* r is its event thread's again: not to be touched. */
}

/* On a worker, with voucher_id and user_id set by f_seckill. */
static http_outcome h_seckill(http_req *r, const char *arg, size_t arg_len)
{
    conn_set *cs = conn_get();
    PGconn *pg;
    store_voucher v;
    store_status st;
    api_err err;
    http_outcome out;

    (void)arg;
    (void)arg_len;
    /* 2. Again: the cache may have missed on the event thread. */
    if (!voucher_cache_get(r->voucher_id, &v)) {
        uint64_t gen = voucher_cache_generation();
        if (stock_keeps_vouchers()) {
            /* Redis-first: the voucher as Redis holds it, so that a sale
             *    goes on while Postgres is away. Not there: the script
             *    rebuilds it from Postgres (or finds no such voucher). */
            st = stock_voucher_get(cs, r->voucher_id, &v);
            if (st == STORE_NOT_FOUND)
                goto order;
            if (st != STORE_OK)
                return http_send_error(r, API_UNAVAILABLE, "redis unavailable, retry later");
        } else {
            if ((pg = pg_or_respond(r, cs)) == NULL)
                return HTTP_ANSWERED;
            st = store_voucher_get(pg, r->voucher_id, &v);
            if (st != STORE_OK)
                return send_store_error(r, st);
        }
        voucher_cache_put(&v, gen);
    }
    if ((err = voucher_verdict(&v)) != API_OK)
        return send_verdict(r, err, &v);
order:

    /* 3-6. Lock and id, transaction, release, answer (app/sale/order.c): answered
     *    by seckill_reply, here or on the worker that settles the order's
     *    batch. Handed off first: the answer may come before order_submit
     *    returns. */
    out = http_hand_off(r);
    order_submit(cs, r->voucher_id, r->user_id, http_deadline_us(r), seckill_reply, r);
    return out;                              /* r may be answered and gone by now */
}

/* ---- GET /stats, GET /metrics: from the shared snapshot (app/api/stats.c) ---- */

static http_outcome f_stats(http_req *r, const char *arg, size_t arg_len)
{
    (void)arg;
    (void)arg_len;
    return stats_serve(r, STATS_JSON);
}

static http_outcome f_metrics(http_req *r, const char *arg, size_t arg_len)
{
    (void)arg;
    (void)arg_len;
    return stats_serve(r, STATS_METRICS);
}

/* ---- admin API ---- */

/* 403 when the admin API is off, 401 on a missing or wrong token; 0 = pass. */
static int admin_denied(http_req *r)
{
    const char *auth;

    if (g_cfg.admin_token[0] == '\0') {
        http_send_error(r, API_ADMIN_DISABLED, NULL);
        return 1;
    }
    auth = http_header(r, MHD_HTTP_HEADER_AUTHORIZATION);
    /* The scheme's name is case-insensitive (RFC 9110, section 11.1). */
    if (auth == NULL || strncasecmp(auth, "Bearer ", 7) != 0 ||
        !util_secret_equal(g_cfg.admin_token, auth + 7)) {
        http_send_error_header(r, API_UNAUTHORIZED, NULL, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
                               "Bearer realm=\"seckill admin\"");
        return 1;
    }
    return 0;
}

static http_outcome h_admin_create(http_req *r, const char *arg, size_t arg_len)
{
    conn_set *cs;
    PGconn *pg;
    store_voucher v;
    cJSON *o;
    payload_voucher in;
    const char *why;
    api_err err;
    store_status st;
    int64_t id;

    (void)arg;
    (void)arg_len;
    if (admin_denied(r))
        return HTTP_ANSWERED;
    if ((err = payload_voucher_create(r->body, r->body_len, &in, &why)) != API_OK)
        return http_send_error(r, err, why);
    cs = conn_get();
    if ((pg = pg_or_respond(r, cs)) == NULL)
        return HTTP_ANSWERED;
    st = store_voucher_create(pg, in.title, in.stock, in.begin_time, in.end_time, &id);
    if (st != STORE_OK)
        return send_store_error(r, st);
    /* The strategy's own copy (redis): without it the first buyer
     * rebuilds it from Postgres. */
    if (stock_keeps_vouchers() && (store_voucher_get(pg, id, &v) != STORE_OK ||
                                   stock_voucher_loaded(cs, &v) != 0))
        log_warn("admin: voucher %" PRId64 " not loaded into Redis: its first buyer loads it", id);
    stats_touch();
    log_info("admin: voucher %" PRId64 " created, stock %" PRId64, id, in.stock);
    o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "voucherId", (double)id);
    return http_send_json(r, 201, o);
}

/* A reset done in Postgres whose Redis part failed is answered 503 with
 * this header ("postgres"): the sale was reset all the same, and nginx's
 * sold-out edge drops the voucher on it as on a 200. No other answer of
 * the route carries it. */
#define RESET_HEADER "X-Seckill-Reset"

static http_outcome h_admin_reset(http_req *r, const char *arg, size_t arg_len)
{
    conn_set *cs;
    PGconn *pg;
    redisContext *c;
    cJSON *o;
    payload_voucher in;
    const char *why;
    api_err err;
    store_status st;
    store_voucher v;
    int64_t id;
    long long receivers = 0, acked = 0;

    if (admin_denied(r))                        /* first: nothing is told to a stranger */
        return HTTP_ANSWERED;
    if (util_parse_id(arg, arg_len, &id) != 0)
        return http_send_error(r, API_INVALID_VOUCHER_ID, NULL);
    if ((err = payload_voucher_reset(r->body, r->body_len, &in, &why)) != API_OK)
        return http_send_error(r, err, why);
    cs = conn_get();
    if ((pg = pg_or_respond(r, cs)) == NULL)
        return HTTP_ANSWERED;
    st = store_voucher_reset(pg, id, in.stock, in.begin_time, in.end_time, &v);
    if (st != STORE_OK)
        return send_store_error(r, st);
    /* The strategy's own copy (redis): the new sale there too. Reset with
     * orders of the old sale still in the stream: the consumers drop them
     * (their generation is the old one). */
    if (stock_voucher_loaded(cs, &v) != 0) {
        log_error("admin: voucher %" PRId64 " reset in Postgres but not in Redis", id);
        return http_send_error_header(r, API_UNAVAILABLE, "redis unavailable: reset again",
                                      RESET_HEADER, "postgres");
    }
    /* Every instance drops what it cached about vouchers (sold-out flags):
     * a stale flag would undersell. Without Redis the others catch up when
     * their entries expire (VOUCHER_CACHE_TTL_MS). */
    if ((c = conn_redis(cs)) == NULL ||
        broadcast_voucher_reset(c, id, g_cfg.redis_timeout_ms, &receivers, &acked) != 0) {
        if (c != NULL && c->err)
            conn_redis_broken(cs);
        voucher_cache_invalidate_all();
        log_warn("admin: reset of voucher %" PRId64 " not broadcast (redis down); other "
                 "instances notice within %d ms", id, VOUCHER_CACHE_TTL_MS);
    } else if (acked < receivers) {
        log_warn("admin: reset of voucher %" PRId64 ": %lld of %lld instances confirmed within "
                 "%d ms; the others notice within %d ms", id, acked, receivers,
                 g_cfg.redis_timeout_ms, VOUCHER_CACHE_TTL_MS);
    }
    stats_touch();
    log_info("admin: voucher %" PRId64 " reset to stock %" PRId64, id, in.stock);
    o = cJSON_CreateObject();
    add_voucher_fields(o, &v);
    return http_send_json(r, 200, o);
}

/* Dead letters back into the orders stream (the redis stock strategy),
 * once their cause is fixed: up to {"max"} of them, each moved in one
 * atomic step, so a second replay queues nothing twice. */
static http_outcome h_admin_replay(http_req *r, const char *arg, size_t arg_len)
{
    stream_tidy_replayed out;
    cJSON *o;
    const char *why;
    api_err err;
    int64_t max;

    (void)arg;
    (void)arg_len;
    if (admin_denied(r))
        return HTTP_ANSWERED;
    if ((err = payload_replay(r->body, r->body_len, &max, &why)) != API_OK)
        return http_send_error(r, err, why);
    if (stream_tidy_replay_all(conn_get(), max, &out) != 0)
        return http_send_error(r, API_UNAVAILABLE, "redis unavailable, retry later");
    stats_touch();                              /* /stats's dead letters read afresh */
    log_info("admin: %" PRId64 " dead letters replayed, %" PRId64 " left (%" PRId64
             " not replayable)", out.replayed, out.left, out.unreplayable);
    o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "replayed", (double)out.replayed);
    cJSON_AddNumberToObject(o, "left", (double)out.left);
    cJSON_AddNumberToObject(o, "unreplayable", (double)out.unreplayable);
    return http_send_json(r, 200, o);
}

const http_route handlers_routes[] = {
    /* method, pattern, on a worker, on the event thread first */
    { "GET", "/health", NULL, h_health },
    { "GET", "/ready", h_ready, f_ready },
    { "GET", "/stats", NULL, f_stats },
    { "GET", "/metrics", NULL, f_metrics },
    { "GET", "/voucher/*", h_voucher_get, NULL },
    { "POST", "/voucher/*/seckill", h_seckill, f_seckill },
    { "POST", "/admin/vouchers", h_admin_create, NULL },
    { "POST", "/admin/vouchers/*/reset", h_admin_reset, NULL },
    { "POST", "/admin/dead-letters/replay", h_admin_replay, NULL },
};

const size_t handlers_route_count = sizeof handlers_routes / sizeof handlers_routes[0];
