/* stock_redis_load: a voucher's Redis-first state, loaded, rebuilt and
 * retired (stock_redis_load.h). */
#include "stock_redis_load.h"
#include "config.h"
#include "log.h"
#include "script.h"
#include "util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static script_file load_script = { .name = "stock_load" };
static script_file retire_script = { .name = "stock_retire" };

#define REBUILD_ATTEMPTS 5

void stock_redis_key(char *buf, size_t n, int64_t voucher_id, const char *suffix)
{
    snprintf(buf, n, "seckill:v:{%" PRId64 "}%s", voucher_id, suffix);
}

void stock_redis_keys_fill(stock_redis_keys *k, int64_t voucher_id)
{
    stock_redis_key(k->hash, sizeof k->hash, voucher_id, "");
    stock_redis_key(k->buyers, sizeof k->buyers, voucher_id, ":buyers");
    stock_redis_key(k->landed, sizeof k->landed, voucher_id, ":landed");
    stock_redis_stream_of(&k->stream, voucher_id);
}

int stock_redis_per_voucher(void)
{
    return conn_redis_cluster();
}

void stock_redis_stream_of(stock_redis_stream *s, int64_t voucher_id)
{
    if (!stock_redis_per_voucher()) {
        s->voucher_id = 0;
        snprintf(s->orders, sizeof s->orders, "%s", STOCK_REDIS_STREAM);
        snprintf(s->dead, sizeof s->dead, "%s", STOCK_REDIS_DEAD);
        return;
    }
    s->voucher_id = voucher_id;
    stock_redis_key(s->orders, sizeof s->orders, voucher_id, ":orders");
    stock_redis_key(s->dead, sizeof s->dead, voucher_id, ":orders:dead");
}

int64_t stock_redis_int(const redisReply *r)
{
    if (r == NULL)
        return -1;
    if (r->type == REDIS_REPLY_INTEGER)
        return r->integer;
    if (r->type == REDIS_REPLY_STRING)
        return strtoll(r->str, NULL, 10);
    return r->type == REDIS_REPLY_NIL ? 0 : -1;
}

int stock_redis_load_start(char *err, size_t errlen)
{
    if (script_file_load(&load_script, g_cfg.lua_dir, load_script.name, err, errlen) != 0 ||
        script_file_load(&retire_script, g_cfg.lua_dir, retire_script.name, err, errlen) != 0)
        return -1;
    return 0;
}

/* Runs stock_load.lua. Its integer reply, or -2 when Redis failed. */
static int run_load(redisContext *c, const stock_redis_keys *k, const char *mode,
                    const store_voucher *v, int64_t landed, const int64_t *buyers, size_t nbuyers)
{
    size_t argc = 14 + nbuyers, i;
    const char **argv = xmalloc(sizeof *argv * argc);
    char (*num)[24] = xmalloc(sizeof *num * (7 + nbuyers));
    redisReply *r;
    int rc = -2;

    argv[0] = k->hash;
    argv[1] = k->buyers;
    argv[2] = k->stream.orders;
    argv[3] = k->landed;
    argv[4] = mode;
    snprintf(num[0], sizeof num[0], "%" PRId64, v->voucher_id);
    snprintf(num[1], sizeof num[1], "%" PRId64, v->stock);
    snprintf(num[2], sizeof num[2], "%" PRId64, v->initial_stock);
    snprintf(num[3], sizeof num[3], "%" PRId64, v->begin_time);
    snprintf(num[4], sizeof num[4], "%" PRId64, v->end_time);
    snprintf(num[5], sizeof num[5], "%" PRId64, landed);
    snprintf(num[6], sizeof num[6], "%" PRId64, v->sale_gen);
    for (i = 0; i < 6; i++)
        argv[5 + i] = num[i];
    argv[11] = v->title;
    argv[12] = STOCK_REDIS_GROUP;
    argv[13] = num[6];
    for (i = 0; i < nbuyers; i++) {
        snprintf(num[7 + i], sizeof num[7 + i], "%" PRId64, buyers[i]);
        argv[14 + i] = num[7 + i];
    }
    r = script_file_run(c, &load_script, 4, (int)argc, argv, NULL);
    if (r == NULL)
        goto out;
    if (r->type == REDIS_REPLY_INTEGER)
        rc = (int)r->integer;
    else
        log_warn("stock_redis: stock_load: %s", r->type == REDIS_REPLY_ERROR ? r->str : "bad reply");
out:
    freeReplyObject(r);
    free(num);
    free(argv);
    return rc;
}

int stock_redis_load(redisContext *c, const store_voucher *v)
{
    stock_redis_keys k;
    int rc;

    stock_redis_keys_fill(&k, v->voucher_id);
    rc = run_load(c, &k, "fresh", v, 0, NULL, 0);
    if (rc == 0)
        log_info("stock_redis: voucher %" PRId64 ": Redis already holds sale %" PRId64
                 " or a newer one", v->voucher_id, v->sale_gen);
    return rc == 0 || rc == 1 ? 0 : -1;
}

/* GET of an integer key (absent: 0). 0, or -1. */
static int get_int(redisContext *c, const char *key, int64_t *out)
{
    redisReply *r = redisCommand(c, "GET %s", key);
    int rc = -1;

    if (r == NULL)
        return -1;
    if (r->type == REDIS_REPLY_NIL) {
        *out = 0;
        rc = 0;
    } else if (r->type == REDIS_REPLY_STRING) {
        *out = strtoll(r->str, NULL, 10);
        rc = 0;
    }
    freeReplyObject(r);
    return rc;
}

store_status stock_redis_rebuild(conn_set *cs, redisContext *c, int64_t voucher_id)
{
    store_voucher v;
    int64_t landed, *buyers = NULL;
    size_t nbuyers = 0;
    store_status st = STORE_UNAVAILABLE;
    PGconn *pg;
    stock_redis_keys k;

    stock_redis_keys_fill(&k, voucher_id);
    for (int attempt = 0; attempt < REBUILD_ATTEMPTS; attempt++) {
        int rc;
        free(buyers);
        buyers = NULL;
        if (get_int(c, k.landed, &landed) != 0)
            goto out;
        if ((pg = conn_pg(cs)) == NULL)
            goto out;
        /* One snapshot: an order committed between two reads would count
         * as a buyer but not as a unit taken. */
        if ((st = store_voucher_snapshot(pg, voucher_id, &v, &buyers, &nbuyers)) != STORE_OK) {
            if (st == STORE_UNAVAILABLE && PQstatus(pg) != CONNECTION_OK)
                conn_pg_broken(cs);
            goto out;
        }
        rc = run_load(c, &k, "rebuild", &v, landed, buyers, nbuyers);
        if (rc == 0 || rc == 1) {
            if (rc == 1)
                log_info("stock_redis: voucher %" PRId64 " rebuilt from Postgres (%zu buyers)",
                         voucher_id, nbuyers);
            st = STORE_OK;
            goto out;
        }
        st = STORE_UNAVAILABLE;
        if (rc == -2)
            goto out;
    }
    log_warn("stock_redis: voucher %" PRId64 ": orders kept landing while it was rebuilt",
             voucher_id);
out:
    free(buyers);
    return st;
}

store_status stock_redis_voucher(redisContext *c, int64_t voucher_id, store_voucher *out,
                                 rcluster_redirect *rd)
{
    store_status st = STORE_UNAVAILABLE;
    redisReply *r;
    stock_redis_keys k;

    rd->kind = RCLUSTER_NONE;
    stock_redis_keys_fill(&k, voucher_id);
    r = redisCommand(c, "HMGET %s stock initial begin end title", k.hash);
    if (r == NULL || rcluster_redirect_parse(r, rd) != RCLUSTER_NONE)
        goto out;                           /* a cluster's slot that moved: the caller's */
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 5) {
        log_warn("stock_redis: HMGET %s: %s", k.hash, r->type == REDIS_REPLY_ERROR ? r->str : "?");
        goto out;
    }
    st = STORE_NOT_FOUND;
    for (size_t i = 0; i < 5; i++)
        if (r->element[i]->type != REDIS_REPLY_STRING)
            goto out;
    memset(out, 0, sizeof *out);
    out->voucher_id = voucher_id;
    out->stock = stock_redis_int(r->element[0]);
    out->initial_stock = stock_redis_int(r->element[1]);
    out->begin_time = stock_redis_int(r->element[2]);
    out->end_time = stock_redis_int(r->element[3]);
    snprintf(out->title, sizeof out->title, "%s", r->element[4]->str);
    st = STORE_OK;
out:
    freeReplyObject(r);
    return st;
}

int stock_redis_retire(redisContext *c, int64_t voucher_id, int64_t pg_sale)
{
    char num[24];
    const char *argv[3];
    redisReply *r;
    stock_redis_keys k;
    int rc = -1;

    stock_redis_keys_fill(&k, voucher_id);
    snprintf(num, sizeof num, "%" PRId64, pg_sale);
    argv[0] = k.hash;
    argv[1] = k.buyers;
    argv[2] = num;
    r = script_file_run(c, &retire_script, 2, 3, argv, NULL);
    if (r != NULL && r->type == REDIS_REPLY_INTEGER) {
        rc = (int)r->integer;
        if (rc == 1)
            log_warn("stock_redis: voucher %" PRId64 ": Redis held an older sale than Postgres's "
                     "(%" PRId64 "; a reset whose load into Redis failed): dropped, the next "
                     "buyer rebuilds it from Postgres", voucher_id, pg_sale);
    } else if (r != NULL) {
        log_warn("stock_redis: stock_retire: %s", r->type == REDIS_REPLY_ERROR ? r->str : "?");
    }
    freeReplyObject(r);
    return rc;
}
