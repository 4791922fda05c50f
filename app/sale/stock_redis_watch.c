/* stock_redis_watch: the orders stream's figures and the watch
 * (stock_redis_watch.h). */
#include "stock_redis_watch.h"
#include "config.h"
#include "log.h"
#include "stock_redis_durability.h"
#include "stock_redis_load.h"
#include "util.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the watch found last (stock_redis_watch): the stream's unsettled
 * orders and the age of the oldest, -1 until known; and whether the
 * backlog is past STREAM_BACKLOG_MAX (admission answers 503 then). */
static _Atomic int64_t watch_backlog = -1, watch_oldest_ms = -1;
static atomic_int watch_over;

#define BACKLOG_COUNT_MAX 10000       /* undelivered entries /stats counts itself */

/* One group's fields in XINFO GROUPS's reply. */
typedef struct group_info {
    int found;
    int64_t pending, lag;             /* lag: -1 when Redis cannot tell */
    char last[48];                    /* last delivered id */
} group_info;

static void group_info_read(const redisReply *g, group_info *out)
{
    const redisReply *name = NULL, *pending = NULL, *lag = NULL, *last = NULL;

    for (size_t i = 0; g->type == REDIS_REPLY_ARRAY && i + 1 < g->elements; i += 2) {
        const redisReply *k = g->element[i], *v = g->element[i + 1];
        if (k->type != REDIS_REPLY_STRING)
            continue;
        if (strcmp(k->str, "name") == 0)
            name = v;
        else if (strcmp(k->str, "pending") == 0)
            pending = v;
        else if (strcmp(k->str, "lag") == 0)
            lag = v;
        else if (strcmp(k->str, "last-delivered-id") == 0)
            last = v;
    }
    if (name == NULL || name->type != REDIS_REPLY_STRING ||
        strcmp(name->str, STOCK_REDIS_GROUP) != 0 || last == NULL ||
        last->type != REDIS_REPLY_STRING || last->len >= sizeof out->last)
        return;
    out->found = 1;
    out->pending = pending != NULL && pending->type == REDIS_REPLY_INTEGER ? pending->integer : 0;
    out->lag = lag != NULL && lag->type == REDIS_REPLY_INTEGER ? lag->integer : -1;
    memcpy(out->last, last->str, last->len + 1);
}

int64_t stock_redis_id_ms(const char *id)
{
    return id != NULL ? strtoll(id, NULL, 10) : -1;
}

/* The reply's text when it is a string, else NULL. */
static const char *reply_str(const redisReply *r)
{
    return r != NULL && r->type == REDIS_REPLY_STRING ? r->str : NULL;
}

/* The age in ms of the stream's oldest unsettled order: the first pending
 * entry (XPENDING's summary), else the first entry after the group's
 * position 'last' (NULL: no group, every entry is unsettled). 0 when
 * there is none; -1 when Redis failed. */
static int64_t oldest_age_ms(redisContext *c, const char *stream, int64_t pending,
                             const char *last)
{
    redisReply *r;
    int64_t ms = -1, age = -1;

    if (pending > 0) {
        r = redisCommand(c, "XPENDING %s %s", stream, STOCK_REDIS_GROUP);
        if (r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements >= 2)
            ms = stock_redis_id_ms(reply_str(r->element[1]));
    } else {
        r = last != NULL ? redisCommand(c, "XRANGE %s (%s + COUNT 1", stream, last)
                         : redisCommand(c, "XRANGE %s - + COUNT 1", stream);
        if (r != NULL && r->type == REDIS_REPLY_ARRAY)
            ms = r->elements == 0 ? -2
                 : r->element[0]->type == REDIS_REPLY_ARRAY && r->element[0]->elements >= 1
                     ? stock_redis_id_ms(reply_str(r->element[0]->element[0])) : -1;
    }
    if (ms == -2)
        age = 0;
    else if (ms >= 0)
        age = util_wall_ms() > ms ? util_wall_ms() - ms : 0;
    freeReplyObject(r);
    return age;
}

/* The stream's orders not yet settled: delivered and unacknowledged
 * ('pending') plus not delivered yet, and the age of the oldest. Settled
 * entries stay in the stream until stream_trim.lua removes them, so its
 * length is not this. Redis counts the undelivered ones (XINFO GROUPS's
 * lag) unless the stream has XDEL'd entries past the group's position;
 * then they are counted here, up to BACKLOG_COUNT_MAX.
 * 0, or -1 when Redis failed; a figure Redis refused is -1. */
static int stream_backlog(redisContext *c, const char *stream, int64_t *backlog, int64_t *pending,
                          int64_t *oldest)
{
    redisReply *r = redisCommand(c, "XINFO GROUPS %s", stream);
    group_info g = { 0 };
    int rc = -1;

    *backlog = *pending = *oldest = -1;
    if (r == NULL)
        return -1;
    if (r->type == REDIS_REPLY_ERROR) {
        /* A cluster's slot that moved: not this node's to count. */
        if (rcluster_redirect_parse(r, &(rcluster_redirect){ 0 }) != RCLUSTER_NONE)
            goto out;
        if (strstr(r->str, "no such key") != NULL)
            *backlog = *pending = *oldest = 0;  /* no order admitted yet */
        rc = 0;
        goto out;
    }
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements && !g.found; i++)
        group_info_read(r->element[i], &g);
    freeReplyObject(r);
    r = NULL;
    if (!g.found) {                   /* no consumer started yet: nothing delivered */
        r = redisCommand(c, "XLEN %s", stream);
        *backlog = stock_redis_int(r);
        *pending = 0;
        *oldest = *backlog > 0 ? oldest_age_ms(c, stream, 0, NULL) : 0;
        rc = c->err ? -1 : 0;
        goto out;
    }
    if (g.lag < 0) {
        /* Bounded: a backlog above it is reported as unknown (-1). */
        r = redisCommand(c, "XRANGE %s (%s + COUNT %d", stream, g.last,
                         BACKLOG_COUNT_MAX + 1);
        if (r == NULL)
            goto out;
        if (r->type == REDIS_REPLY_ARRAY && r->elements <= BACKLOG_COUNT_MAX)
            g.lag = (int64_t)r->elements;
    }
    *pending = g.pending;
    *backlog = g.lag < 0 ? -1 : g.pending + g.lag;
    *oldest = *backlog == 0 ? 0 : oldest_age_ms(c, stream, g.pending, g.last);
    rc = c->err ? -1 : 0;
out:
    freeReplyObject(r);
    return rc;
}

/* XLEN of 'stream': what bounds a backlog Redis cannot count. */
static int64_t stream_len(redisContext *c, const char *stream)
{
    redisReply *r = redisCommand(c, "XLEN %s", stream);
    int64_t n = r != NULL && r->type == REDIS_REPLY_INTEGER ? r->integer : INT64_MAX;

    freeReplyObject(r);
    return n;
}

/* Remembers what the watch found, and whether the backlog (or, when Redis
 * cannot count it, 'bound') is past STREAM_BACKLOG_MAX. */
static void watch_record(int64_t backlog, int64_t oldest, int64_t bound)
{
    int over, was;

    atomic_store(&watch_backlog, backlog);
    atomic_store(&watch_oldest_ms, oldest);
    over = g_cfg.stream_backlog_max > 0 && bound > g_cfg.stream_backlog_max;
    was = atomic_exchange(&watch_over, over);
    if (over && !was)
        log_error("stock_redis: %" PRId64 " admitted orders are not in Postgres yet (the oldest "
                  "%" PRId64 " ms), over STREAM_BACKLOG_MAX=%d: buyers are answered 503 until "
                  "the consumers catch up", backlog, oldest, g_cfg.stream_backlog_max);
    else if (!over && was)
        log_warn("stock_redis: the stream's backlog is back under STREAM_BACKLOG_MAX (%" PRId64
                 "): admission goes on", backlog);
}

int stock_redis_watch(redisContext *c)
{
    int64_t backlog, pending, oldest, bound;
    int rc = stock_redis_durability_check(c) < 0 ? -1 : 0;

    if (c->err || stream_backlog(c, STOCK_REDIS_STREAM, &backlog, &pending, &oldest) != 0)
        return -1;
    /* A backlog Redis cannot count (-1): the stream's length bounds it. */
    bound = backlog;
    if (bound < 0 && g_cfg.stream_backlog_max > 0)
        bound = stream_len(c, STOCK_REDIS_STREAM);
    watch_record(backlog, oldest, bound);
    return c->err ? -1 : rc;
}

/* Most masters whose durability the watch checks. */
#define WATCH_MASTERS_MAX 64

int stock_redis_watch_cluster(rcluster *rc, const int64_t *ids, size_t n, int listed)
{
    redisContext *masters[WATCH_MASTERS_MAX];
    int slots[WATCH_MASTERS_MAX], nm, rc_dur = 0;
    int64_t backlog = 0, oldest = 0, bound = 0;

    /* Durable only when every master is. */
    if ((nm = rcluster_master_slots(rc, slots, WATCH_MASTERS_MAX)) < 0)
        return -1;
    for (int i = 0; i < nm; i++)
        if ((masters[i] = rcluster_slot_context(rc, slots[i])) == NULL)
            return -1;
    /* The contexts stay valid: no other call on 'rc' in between. */
    if (stock_redis_durability_check_all(masters, nm) < 0)
        rc_dur = -1;
    if (!listed)
        return rc_dur;                      /* no list yet: the backlog is not known */
    for (size_t i = 0; i < n; i++) {
        stock_redis_stream s;
        int64_t b, p, o, add;
        redisContext *c;
        stock_redis_stream_of(&s, ids[i]);
        if ((c = rcluster_slot_context(rc, rcluster_keyslot(s.orders, strlen(s.orders)))) == NULL ||
            stream_backlog(c, s.orders, &b, &p, &o) != 0)
            return -1;
        add = b < 0 && g_cfg.stream_backlog_max > 0 ? stream_len(c, s.orders) : b < 0 ? 0 : b;
        bound = bound > INT64_MAX - add ? INT64_MAX : bound + add;
        backlog = backlog < 0 || b < 0 ? -1 : backlog + b;
        oldest = oldest < 0 || o < 0 ? -1 : o > oldest ? o : oldest;
        if (c->err)
            return -1;
    }
    watch_record(backlog, oldest, bound);
    return rc_dur;
}

void stock_redis_watch_get(stock_redis_figures *out)
{
    out->durable = stock_redis_durability_ok();
    out->over_backlog = atomic_load(&watch_over);
    out->backlog = atomic_load(&watch_backlog);
    out->oldest_ms = atomic_load(&watch_oldest_ms);
}

int stock_redis_over_backlog(void)
{
    return atomic_load(&watch_over);
}

/* Adds to the voucher 'v' (store_stats's object) its Redis side on 'c'
 * and whether both sides agree; 'drained': no order of it unsettled. 0,
 * 1 when Redis does not hold it, -1 when Redis failed. */
static int voucher_side(redisContext *c, cJSON *v, int drained, int *agree)
{
    int64_t id = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(v, "voucherId"));
    int64_t pg_stock = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(v, "stock"));
    int64_t initial = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(v, "initialStock"));
    int64_t orders = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(v, "orders"));
    int64_t rstock, rinitial, rbuyers;
    cJSON *o;
    stock_redis_keys k;
    redisReply *r;

    stock_redis_keys_fill(&k, id);
    r = redisCommand(c, "HMGET %s stock initial", k.hash);
    if (r == NULL)
        return -1;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type == REDIS_REPLY_NIL) {
        freeReplyObject(r);
        return 1;                           /* not loaded: nothing sold through Redis */
    }
    rstock = stock_redis_int(r->element[0]);
    rinitial = stock_redis_int(r->element[1]);
    freeReplyObject(r);
    r = redisCommand(c, "SCARD %s", k.buyers);
    rbuyers = stock_redis_int(r);
    freeReplyObject(r);
    if (c->err)
        return -1;
    /* Drained, both sides must tell the same story: as many orders as
     * units taken, on each side, and as many buyers as orders. */
    *agree = drained && rinitial == initial && rinitial - rstock == rbuyers &&
             initial - pg_stock == orders && rbuyers == orders && rstock == pg_stock;
    o = cJSON_AddObjectToObject(v, "redis");
    cJSON_AddNumberToObject(o, "stock", (double)rstock);
    cJSON_AddNumberToObject(o, "buyers", (double)rbuyers);
    cJSON_AddNumberToObject(o, "undrained", (double)(rbuyers - orders));
    cJSON_AddBoolToObject(o, "agree", *agree);
    return 0;
}

/* The stream figures of /stats, summed over the streams read. */
typedef struct stream_sums {
    int64_t backlog, dead, pending, oldest;
} stream_sums;

/* Reads the backlog and the dead letters of 's' on 'c' and adds them to
 * 'sum' (a figure Redis could not give makes the sum -1). 0, or -1 when
 * Redis failed. 'backlog' this stream's. */
static int stream_add(redisContext *c, const stock_redis_stream *s, stream_sums *sum,
                      int64_t *backlog)
{
    int64_t pending, oldest, dead;
    redisReply *r;

    if (stream_backlog(c, s->orders, backlog, &pending, &oldest) != 0)
        return -1;
    r = redisCommand(c, "XLEN %s", s->dead);
    dead = stock_redis_int(r);
    freeReplyObject(r);
    if (c->err)
        return -1;
    sum->backlog = sum->backlog < 0 || *backlog < 0 ? -1 : sum->backlog + *backlog;
    sum->pending += pending < 0 ? 0 : pending;
    sum->oldest = sum->oldest < 0 || oldest < 0 ? -1 : oldest > sum->oldest ? oldest : sum->oldest;
    sum->dead = sum->dead < 0 || dead < 0 ? -1 : sum->dead + dead;
    return 0;
}

/* The voucher's connection for /stats: its slot's master on a cluster. */
static redisContext *stats_redis(conn_set *cs, const stock_redis_stream *s)
{
    return stock_redis_per_voucher() ? conn_redis_key(cs, s->orders) : conn_redis(cs);
}

int stock_redis_stats(conn_set *cs, cJSON *root, cJSON *vouchers)
{
    cJSON *rf = cJSON_AddObjectToObject(root, "redisFirst"), *v;
    stream_sums sum = { 0 };
    int all_agree = 1, rc = -1;
    int64_t backlog = 0;
    stock_redis_stream s;
    redisContext *c = NULL;

    /* One Redis: one stream for every voucher. A cluster: each voucher's
     * own, read with the voucher's side on its master. */
    if (!stock_redis_per_voucher()) {
        stock_redis_stream_of(&s, 0);
        if ((c = stats_redis(cs, &s)) == NULL || stream_add(c, &s, &sum, &backlog) != 0)
            goto out;
    }
    cJSON_ArrayForEach(v, vouchers) {
        int agree = 0, side;
        if (stock_redis_per_voucher()) {
            stock_redis_stream_of(&s, (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(v,
                                                                               "voucherId")));
            if ((c = stats_redis(cs, &s)) == NULL || stream_add(c, &s, &sum, &backlog) != 0)
                goto out;
        }
        if ((side = voucher_side(c, v, backlog == 0, &agree)) < 0)
            goto out;
        if (side == 0)
            all_agree = all_agree && agree;
    }
    cJSON_AddStringToObject(rf, "durability",
                            config_durability_name(g_cfg.redis_order_durability));
    cJSON_AddBoolToObject(rf, "durable", stock_redis_durability_ok());
    cJSON_AddStringToObject(rf, "durabilityCheck", stock_redis_durability_text());
    cJSON_AddNumberToObject(rf, "backlog", (double)sum.backlog);
    cJSON_AddNumberToObject(rf, "backlogMax", (double)g_cfg.stream_backlog_max);
    cJSON_AddBoolToObject(rf, "overBacklogMax", atomic_load(&watch_over));
    cJSON_AddNumberToObject(rf, "oldestUnsettledMs", (double)sum.oldest);
    cJSON_AddNumberToObject(rf, "pending", (double)sum.pending);
    cJSON_AddNumberToObject(rf, "deadLetters", (double)sum.dead);
    cJSON_AddBoolToObject(rf, "reconciled", all_agree && sum.dead == 0);
    rc = 0;
out:
    /* On a cluster a failure may be a slot that moved (MOVED): the
     * connections dropped and the map read again at the next use. */
    if (c != NULL && (c->err || (rc != 0 && stock_redis_per_voucher())))
        conn_redis_broken(cs);
    return rc;
}
