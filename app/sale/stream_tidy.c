/* stream_tidy: consumer names and dead letters of the orders stream (stream_tidy.h). */
#include "stream_tidy.h"
#include "config.h"
#include "log.h"
#include "script.h"
#include "stock_redis.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define TIDY_EVERY_MS 10000

static script_file tidy_script = { .name = "group_tidy" };
static script_file replay_script = { .name = "dead_replay" };

int stream_tidy_load(const char *dir, char *err, size_t errlen)
{
    if (script_file_load(&tidy_script, dir, tidy_script.name, err, errlen) != 0 ||
        script_file_load(&replay_script, dir, replay_script.name, err, errlen) != 0)
        return -1;
    return 0;
}

int stream_tidy_every_ms(void)
{
    /* Each run refreshes the caller's own name: a third of the bound keeps
     * a live consumer's idle well below it. */
    int third = g_cfg.consumer_remove_idle_ms / 3;

    return third < TIDY_EVERY_MS ? third : TIDY_EVERY_MS;
}

int stream_tidy_consumers(redisContext *c, const char *stream, const char *own_name)
{
    char idle[24];
    const char *argv[4] = { stream, STOCK_REDIS_GROUP, idle, own_name };
    redisReply *r;
    int rc = -1;

    snprintf(idle, sizeof idle, "%d", g_cfg.consumer_remove_idle_ms);
    r = script_file_run(c, &tidy_script, 1, 4, argv, NULL);
    if (r == NULL)
        return -1;
    if (r->type == REDIS_REPLY_ERROR) {
        /* No stream or no group yet: the consumer creates them. (A slot
         * that moved: the consumer reads the map again.) */
        if (strncmp(r->str, "NOGROUP", 7) != 0 && strstr(r->str, "no such key") == NULL &&
            rcluster_redirect_parse(r, &(rcluster_redirect){ 0 }) == RCLUSTER_NONE)
            log_warn("stream_tidy: group_tidy: %s", r->str);
        goto out;
    }
    if (r->type != REDIS_REPLY_ARRAY) {
        log_warn("stream_tidy: group_tidy: unexpected reply type %d", r->type);
        goto out;
    }
    for (size_t i = 0; i < r->elements; i++)
        if (r->element[i]->type == REDIS_REPLY_STRING)
            log_info("stream_tidy: consumer %s removed from group %s of %s: idle over %d ms "
                     "with nothing pending", r->element[i]->str, STOCK_REDIS_GROUP,
                     stream, g_cfg.consumer_remove_idle_ms);
    rc = (int)r->elements;
out:
    freeReplyObject(r);
    return rc;
}

/* A dead letter's XADD being built: its arguments, a field and its value
 * at a time, and the text of the numbers among them. */
typedef struct dead_xadd {
    const char *argv[26];
    char num[6][24];
    int argc, nnum;
} dead_xadd;

static void add_str(dead_xadd *x, const char *field, const char *value)
{
    x->argv[x->argc++] = field;
    x->argv[x->argc++] = value;
}

static void add_i64(dead_xadd *x, const char *field, int64_t value)
{
    char *num = x->num[x->nnum++];

    snprintf(num, sizeof x->num[0], "%" PRId64, value);
    add_str(x, field, num);
}

int stream_tidy_dead_append(redisContext *c, const stream_tidy_dead *d)
{
    char cap[24];
    /* "~": Redis removes whole stream nodes only, so the length stays
     * within a node (stream-node-max-entries) of the cap, at a fraction of
     * the cost of an exact trim (https://redis.io/docs/latest/commands/xadd/). */
    dead_xadd x = { .argv = { "XADD", d->dead, "MAXLEN", "~", cap, "*" }, .argc = 6 };

    snprintf(cap, sizeof cap, "%d", g_cfg.dead_letters_max);
    add_str(&x, "entry", d->entry);
    add_i64(&x, "v", d->voucher_id);
    add_i64(&x, "u", d->user_id);
    add_i64(&x, "o", d->order_id);
    if (d->with_id) {
        /* The id's parts, as lua/order_admit.lua wrote them (order_id.h). */
        add_i64(&x, "t", d->order_id >> 32);
        add_i64(&x, "c", (int64_t)(d->order_id & 0xFFFFFFFF));
    }
    add_i64(&x, "g", d->gen);
    add_str(&x, "reason", d->reason);
    add_str(&x, "consumer", d->consumer);
    return redisAppendCommandArgv(c, x.argc, x.argv, NULL) == REDIS_OK ? 0 : -1;
}

int stream_tidy_replay(redisContext *c, const stock_redis_stream *s, int64_t max,
                       stream_tidy_replayed *out)
{
    char n[24];
    const char *argv[3] = { s->dead, s->orders, n };
    redisReply *r;
    int rc = -1;

    memset(out, 0, sizeof *out);
    snprintf(n, sizeof n, "%" PRId64, max);
    r = script_file_run(c, &replay_script, 2, 3, argv, NULL);
    if (r == NULL)
        return -1;
    if (r->type == REDIS_REPLY_ERROR) {
        log_warn("stream_tidy: dead_replay: %s", r->str);
        goto out;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
        r->element[0]->type != REDIS_REPLY_INTEGER || r->element[1]->type != REDIS_REPLY_INTEGER ||
        r->element[2]->type != REDIS_REPLY_INTEGER) {
        log_warn("stream_tidy: dead_replay: unexpected reply");
        goto out;
    }
    out->replayed = r->element[0]->integer;
    out->left = r->element[1]->integer;
    out->unreplayable = r->element[2]->integer;
    rc = 0;
out:
    freeReplyObject(r);
    return rc;
}

/* On a Redis Cluster: every voucher's dead letters, one voucher at a time
 * on its slot's master, the vouchers listed by Postgres. */
static int replay_each(conn_set *cs, int64_t max, stream_tidy_replayed *out)
{
    int64_t *ids = NULL;
    size_t n = 0;
    PGconn *pg = conn_pg(cs);
    int rc = -1;

    if (pg == NULL)
        return -1;
    if (store_voucher_ids(pg, &ids, &n) != STORE_OK) {
        if (PQstatus(pg) != CONNECTION_OK)
            conn_pg_broken(cs);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        stream_tidy_replayed one;
        stock_redis_stream s;
        redisContext *c;
        stock_redis_stream_of(&s, ids[i]);
        if ((c = conn_redis_key(cs, s.dead)) == NULL)
            goto out;
        if (stream_tidy_replay(c, &s, max - out->replayed > 0 ? max - out->replayed : 0,
                               &one) != 0) {
            conn_redis_broken(cs);          /* failed, or a slot that moved: read the map */
            goto out;
        }
        out->replayed += one.replayed;
        out->left += one.left;
        out->unreplayable += one.unreplayable;
    }
    rc = 0;
out:
    free(ids);
    return rc;
}

int stream_tidy_replay_all(conn_set *cs, int64_t max, stream_tidy_replayed *out)
{
    stock_redis_stream s;
    redisContext *c;

    memset(out, 0, sizeof *out);
    if (stock_redis_per_voucher())
        return replay_each(cs, max, out);
    if ((c = conn_redis(cs)) == NULL)
        return -1;
    stock_redis_stream_of(&s, 0);
    if (stream_tidy_replay(c, &s, max, out) != 0) {
        if (c->err)
            conn_redis_broken(cs);
        return -1;
    }
    return 0;
}
