/* stock_redis: Redis-first admission (stock_redis.h). */
#include "stock_redis.h"
#include "config.h"
#include "idw.h"
#include "log.h"
#include "rec.h"
#include "script.h"
#include "stock.h"
#include "util.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static script_file admit_script = { .name = "order_admit" };
static script_file load_script = { .name = "stock_load" };
static script_file retire_script = { .name = "stock_retire" };

/* The durability verdict, shared by the workers and written by whoever
 * checked last (the watch, every second). DUR_UNCHECKED: Redis refuses
 * CONFIG (a managed Redis that renamed or disabled it), so appendfsync
 * cannot be read: not durable for "aof". */
enum durability { DUR_UNKNOWN, DUR_OK, DUR_NOT, DUR_UNCHECKED };
static atomic_int durability = DUR_UNKNOWN;

/* What the watch found last (stock_redis_watch): the stream's unsettled
 * orders and the age of the oldest, -1 until known; and whether the
 * backlog is past STREAM_BACKLOG_MAX (admission answers 503 then). */
static _Atomic int64_t watch_backlog = -1, watch_oldest_ms = -1;
static atomic_int watch_over;

/* Workers that may send admissions in lots at once (0: each its own
 * buyer's, alone). Set at start, read-only after. */
static int pipe_senders_max;

#define REBUILD_ATTEMPTS 5

void stock_redis_key(char *buf, size_t n, int64_t voucher_id, const char *suffix)
{
    snprintf(buf, n, "seckill:v:{%" PRId64 "}%s", voucher_id, suffix);
}

static int mode_is(int m)
{
    return g_cfg.redis_order_durability == m;
}

/* CONFIG GET 'name' on 'c': its value copied to 'out'. 0; 1 when Redis
 * refused the command (an error reply, e.g. CONFIG renamed away); -1 when
 * Redis failed. */
static int config_get(redisContext *c, const char *name, char *out, size_t n)
{
    redisReply *r = redisCommand(c, "CONFIG GET %s", name);
    int rc = -1;

    if (r == NULL)
        return -1;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[1]->type == REDIS_REPLY_STRING) {
        snprintf(out, n, "%s", r->element[1]->str);
        rc = 0;
    } else if (r->type == REDIS_REPLY_ERROR) {
        snprintf(out, n, "%s", r->str);
        rc = 1;
    } else {
        /* A Redis that hides the setting (an empty array): not checkable. */
        snprintf(out, n, "CONFIG GET %s answered no value", name);
        rc = 1;
    }
    freeReplyObject(r);
    return rc;
}

int stock_redis_check_durability(redisContext *c)
{
    char aof[128], fsync[128];
    int verdict, rc, was;

    if (!mode_is(DURABILITY_AOF)) {
        atomic_store(&durability, DUR_OK);
        return 0;
    }
    if ((rc = config_get(c, "appendonly", aof, sizeof aof)) == 0)
        rc = config_get(c, "appendfsync", fsync, sizeof fsync);
    if (rc < 0)
        return -1;
    if (rc == 1)
        verdict = DUR_UNCHECKED;
    else
        verdict = strcmp(aof, "yes") == 0 && strcmp(fsync, "always") == 0 ? DUR_OK : DUR_NOT;
    was = atomic_exchange(&durability, verdict);
    if (was != verdict && verdict == DUR_NOT)
        log_error("stock_redis: Redis runs appendonly %s, appendfsync %s: an order it "
                  "acknowledges may be lost in a crash, so orders are refused (503) until it "
                  "runs appendonly yes, appendfsync always (or set REDIS_ORDER_DURABILITY)",
                  aof, fsync);
    else if (was != verdict && verdict == DUR_UNCHECKED)
        log_error("stock_redis: Redis refuses CONFIG GET (%s), so its appendfsync cannot be "
                  "checked: orders are refused (503). On a Redis without CONFIG (a managed "
                  "one) use REDIS_ORDER_DURABILITY=wait: a replica acknowledges every order",
                  aof);
    else if (was != verdict && verdict == DUR_OK && was != DUR_UNKNOWN)
        log_warn("stock_redis: Redis runs appendonly yes, appendfsync always again: orders "
                 "are admitted");
    return verdict == DUR_OK ? 0 : 1;
}

static const char *durability_text(int d)
{
    switch (d) {
    case DUR_OK:
        return "durable";
    case DUR_NOT:
        return "not durable";
    case DUR_UNCHECKED:
        return "unchecked: CONFIG refused";
    default:
        return "unknown";
    }
}

int stock_redis_start(char *err, size_t errlen)
{
    char why[256];
    redisContext *c;

    if (script_file_load(&admit_script, g_cfg.lua_dir, admit_script.name, err, errlen) != 0 ||
        script_file_load(&load_script, g_cfg.lua_dir, load_script.name, err, errlen) != 0 ||
        script_file_load(&retire_script, g_cfg.lua_dir, retire_script.name, err, errlen) != 0)
        return -1;
    if (mode_is(DURABILITY_NONE))
        log_warn("REDIS_ORDER_DURABILITY=none: an order is answered 200 before Redis made it "
                 "durable; a Redis crash loses the orders of its last fsync interval");
    /* A sender keeps its worker while buyers keep coming: one worker at
     * least stays for the rest (a voucher not in the cache, the admin API). */
    pipe_senders_max = g_cfg.redis_admit_pipelines < g_cfg.threads
                           ? g_cfg.redis_admit_pipelines : g_cfg.threads - 1;
    if (pipe_senders_max < g_cfg.redis_admit_pipelines)
        log_warn("REDIS_ADMIT_PIPELINES=%d with THREADS=%d: %d sender(s), so that a worker "
                 "stays free", g_cfg.redis_admit_pipelines, g_cfg.threads, pipe_senders_max);
    /* Refuse to start against a Redis that would lose acknowledged orders;
     * one that is not up yet is checked when it is. */
    c = conn_redis_open(why, sizeof why);
    if (c == NULL)
        return 0;
    if (stock_redis_check_durability(c) == 1) {
        snprintf(err, errlen, "%s", atomic_load(&durability) == DUR_UNCHECKED
                 ? "REDIS_ORDER_DURABILITY=aof cannot be checked on a Redis that refuses CONFIG: "
                   "use REDIS_ORDER_DURABILITY=wait there"
                 : "REDIS_ORDER_DURABILITY=aof needs Redis with appendonly yes and "
                   "appendfsync always");
        redisFree(c);
        return -1;
    }
    redisFree(c);
    return 0;
}

static int64_t int_reply(redisReply *r);

/* The script's keys for a voucher. */
typedef struct vkeys {
    char hash[64], buyers[72], landed[72];
} vkeys;

static void vkeys_fill(vkeys *k, int64_t voucher_id)
{
    stock_redis_key(k->hash, sizeof k->hash, voucher_id, "");
    stock_redis_key(k->buyers, sizeof k->buyers, voucher_id, ":buyers");
    stock_redis_key(k->landed, sizeof k->landed, voucher_id, ":landed");
}

/* Runs stock_load.lua. Its integer reply, or -2 when Redis failed. */
static int run_load(redisContext *c, const vkeys *k, const char *mode, const store_voucher *v,
                    int64_t landed, const int64_t *buyers, size_t nbuyers)
{
    size_t argc = 14 + nbuyers, i;
    const char **argv = xmalloc(sizeof *argv * argc);
    char (*num)[24] = xmalloc(sizeof *num * (7 + nbuyers));
    redisReply *r;
    int rc = -2;

    argv[0] = k->hash;
    argv[1] = k->buyers;
    argv[2] = STOCK_REDIS_STREAM;
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
        goto cleanup;
    if (r->type == REDIS_REPLY_INTEGER)
        rc = (int)r->integer;
    else
        log_warn("stock_redis: stock_load: %s", r->type == REDIS_REPLY_ERROR ? r->str : "bad reply");
cleanup:
    freeReplyObject(r);
    free(num);
    free(argv);
    return rc;
}

int stock_redis_load(redisContext *c, const store_voucher *v)
{
    vkeys k;
    int rc;

    vkeys_fill(&k, v->voucher_id);
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

/* The voucher's Redis state, rebuilt from Postgres (stock_load.lua says
 * how): STORE_OK when it exists now. */
static store_status rebuild(conn_set *cs, redisContext *c, int64_t voucher_id)
{
    store_voucher v;
    int64_t landed, *buyers = NULL;
    size_t nbuyers = 0;
    store_status st = STORE_UNAVAILABLE;
    PGconn *pg;
    vkeys k;

    vkeys_fill(&k, voucher_id);
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

/* WAIT for the replicas: 0 when enough acknowledged, 1 when too few, -1
 * when Redis failed. */
static int wait_replicas(redisContext *c)
{
    redisReply *r = redisCommand(c, "WAIT %d %d", g_cfg.redis_order_wait_replicas,
                                 g_cfg.redis_order_wait_ms);
    int rc = -1;

    if (r == NULL)
        return -1;
    if (r->type == REDIS_REPLY_INTEGER)
        rc = r->integer >= g_cfg.redis_order_wait_replicas ? 0 : 1;
    else
        log_warn("stock_redis: WAIT: %s", r->type == REDIS_REPLY_ERROR ? r->str : "bad reply");
    freeReplyObject(r);
    return rc;
}

/* One call of order_admit.lua for a lot of buyers (one alone, or a
 * sender's lot): its arguments, kept until its reply is read, since the
 * order ids are composed from 'now'. argv and the text it points into are
 * owned (admit_call_free). */
typedef struct admit_call {
    int64_t now;              /* the lot's clock reading, Unix seconds */
    int nkeys, argc;
    const char **argv;
    char *text;
} admit_call;

/* Most buyers in one call: a sender's lot. */
#define PIPE_MAX 256

/* Text each argument may take: a voucher's two keys (as vkeys holds them)
 * and its id; a buyer's voucher index and user id; the counter's key, the
 * id's seconds and the number of vouchers. */
#define ADMIT_HASH_KEY sizeof(((vkeys *)0)->hash)
#define ADMIT_BUYERS_KEY sizeof(((vkeys *)0)->buyers)
#define ADMIT_ID_KEY 128
#define ADMIT_INT 24
#define ADMIT_VOUCHER_TEXT (ADMIT_HASH_KEY + ADMIT_BUYERS_KEY + ADMIT_INT)
#define ADMIT_BUYER_TEXT (2 * ADMIT_INT)
#define ADMIT_LOT_TEXT (ADMIT_ID_KEY + 2 * ADMIT_INT)

static void admit_call_free(admit_call *ac)
{
    free(ac->argv);
    free(ac->text);
    ac->argv = NULL;
    ac->text = NULL;
}

/* Writes 'x' in decimal at *cur (room up to 'end'), moves *cur past the
 * NUL; the start. */
static const char *text_int(char **cur, char *end, int64_t x)
{
    char *s = *cur;
    int len = snprintf(s, (size_t)(end - s), "%" PRId64, x);

    *cur += len < end - s ? len + 1 : end - s;
    return s;
}

/* The arguments of one call for the buyers o[0..n), 1 <= n <= PIPE_MAX,
 * each voucher's keys once (the script counts a voucher's stock per key
 * pair: a voucher listed twice would be sold twice). 0, or -1 when the
 * clock is before the order id epoch. */
static int admit_call_build(admit_call *ac, store_order *const *o, int n)
{
    int64_t vid[PIPE_MAX];
    int vj[PIPE_MAX];
    int m = 0, a = 0;
    char *cur, *end;
    size_t room;

    memset(ac, 0, sizeof *ac);
    ac->now = util_now_s();
    if (ac->now < IDW_EPOCH) {
        log_error("stock_redis: clock before the order id epoch");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        int j = 0;
        while (j < m && vid[j] != o[i]->voucher_id)
            j++;
        if (j == m)
            vid[m++] = o[i]->voucher_id;
        vj[i] = j + 1;
    }
    ac->nkeys = 2 + 2 * m;
    ac->argc = ac->nkeys + 2 + m + 2 * n;
    ac->argv = xcalloc((size_t)ac->argc, sizeof *ac->argv);
    room = ADMIT_LOT_TEXT + (size_t)m * ADMIT_VOUCHER_TEXT + (size_t)n * ADMIT_BUYER_TEXT;
    cur = ac->text = xcalloc(room, 1);
    end = cur + room;
    ac->argv[a++] = STOCK_REDIS_STREAM;
    idw_key(g_cfg.id_prefix, ac->now, cur, ADMIT_ID_KEY);
    ac->argv[a++] = cur;
    cur += strlen(cur) + 1;
    for (int j = 0; j < m; j++) {
        stock_redis_key(cur, ADMIT_HASH_KEY, vid[j], "");
        ac->argv[a++] = cur;
        cur += strlen(cur) + 1;
        stock_redis_key(cur, ADMIT_BUYERS_KEY, vid[j], ":buyers");
        ac->argv[a++] = cur;
        cur += strlen(cur) + 1;
    }
    ac->argv[a++] = text_int(&cur, end, ac->now - (int64_t)IDW_EPOCH);
    ac->argv[a++] = text_int(&cur, end, m);
    for (int j = 0; j < m; j++)
        ac->argv[a++] = text_int(&cur, end, vid[j]);
    for (int i = 0; i < n; i++) {
        ac->argv[a++] = text_int(&cur, end, vj[i]);
        ac->argv[a++] = text_int(&cur, end, o[i]->user_id);
    }
    return 0;
}

/* The reply 'r' answers a call of 'n' buyers: one element each. */
static int admit_reply_ok(const redisReply *r, int n)
{
    if (r->type == REDIS_REPLY_ARRAY && r->elements == (size_t)n)
        return 1;
    log_warn("stock_redis: order_admit: %s", r->type == REDIS_REPLY_ERROR ? r->str : "bad reply");
    return 0;
}

/* One buyer's outcome, its element 'e' of the call's reply (not freed),
 * and the order id when admitted; 'missing' set when the voucher must be
 * rebuilt first. */
static store_status admit_parse(const redisReply *e, int64_t now, store_order *o, int *missing)
{
    *missing = 0;
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 1 ||
        e->element[0]->type != REDIS_REPLY_INTEGER) {
        log_warn("stock_redis: order_admit: bad reply for a buyer");
        return STORE_UNAVAILABLE;
    }
    switch (e->element[0]->integer) {
    case 0:
        if (e->elements == 3 && e->element[1]->type == REDIS_REPLY_INTEGER &&
            (o->order_id = idw_compose(now - IDW_EPOCH, e->element[1]->integer)) > 0)
            return STORE_OK;
        log_error("stock_redis: order_admit: order id out of range");
        return STORE_UNAVAILABLE;
    case 1:
        return STORE_SOLD_OUT;
    case 2:
        return STORE_DUPLICATE;
    case 3:
        return STORE_NOT_STARTED;
    case 4:
        return STORE_ENDED;
    case -1:
        *missing = 1;
        return STORE_UNAVAILABLE;
    case -2:
        log_error("stock_redis: voucher %" PRId64 ": its Redis hash is malformed", o->voucher_id);
        return STORE_UNAVAILABLE;
    default:
        return STORE_UNAVAILABLE;
    }
}

/* One buyer's call of order_admit.lua, alone: the outcome, the order id
 * when admitted; 'missing' set when the voucher must be rebuilt first. */
static store_status admit(redisContext *c, store_order *o, int *missing)
{
    admit_call ac;
    store_status st = STORE_UNAVAILABLE;
    redisReply *r;

    *missing = 0;
    if (admit_call_build(&ac, &o, 1) != 0)
        return STORE_UNAVAILABLE;
    r = script_file_run(c, &admit_script, ac.nkeys, ac.argc, ac.argv, NULL);
    if (r != NULL && admit_reply_ok(r, 1))
        st = admit_parse(r->element[0], ac.now, o, missing);
    freeReplyObject(r);
    admit_call_free(&ac);
    return st;
}

/* An order may be acknowledged: durable acknowledgement is known to hold
 * (checked once when unknown), and the stream's backlog is within its
 * bound. */
static int durable(redisContext *c)
{
    int d = atomic_load(&durability);

    if (atomic_load(&watch_over))
        return 0;
    return d == DUR_OK || (d == DUR_UNKNOWN && stock_redis_check_durability(c) == 0);
}

/* One buyer alone: admitted, rebuilt first when Redis lost the voucher. */
static store_status admit_one(conn_set *cs, redisContext *c, store_order *o)
{
    int missing;
    store_status st = admit(c, o, &missing);

    if (missing) {
        /* Not in Redis: created before Redis held it, or lost with a Redis
         * that restarted empty; or no such voucher (STORE_NOT_FOUND: 404,
         * as on every other path). */
        st = rebuild(cs, c, o->voucher_id);
        if (st == STORE_OK) {
            st = admit(c, o, &missing);
            if (missing)
                st = STORE_UNAVAILABLE;
        }
    }
    return st;
}

static void redis_settle_alone(conn_set *cs, stock_buyer *b, stock_done_fn done, void *arg)
{
    redisContext *c = conn_redis(cs);
    store_status st = STORE_UNAVAILABLE;

    if (c == NULL || stock_past_deadline(b) || !durable(c))
        goto out;
    rec_admit_round(1);
    st = admit_one(cs, c, &b->order);
    if (st == STORE_OK && mode_is(DURABILITY_WAIT) && wait_replicas(c) != 0) {
        /* Admitted, but not known to survive a failover: not acknowledged.
         * (The order stands: a retry answers already_ordered, or
         * sold_out when it took the last unit.) */
        st = STORE_UNAVAILABLE;
    }
out:
    if (c != NULL && c->err)
        conn_redis_broken(cs);
    done(cs, arg, st);
}

/* ---- Admission in lots (REDIS_ADMIT_PIPELINES > 0) ----
 *
 * Buyers queue here. A worker that finds fewer than pipe_senders_max
 * others sending becomes one: it takes every queued buyer (up to
 * PIPE_MAX), admits them all with one call of the script, answers each
 * buyer, and goes on while buyers are queued. Redis runs the lot in one
 * script and, with appendfsync always, makes it durable with one fsync
 * before it replies; the instance pays one round trip and one write for
 * the lot, not one each, and Redis one script call. There is no gathering
 * window: a buyer who comes while the call is out waits only for the next. */

/* Where a queued buyer's admission stands. */
enum pipe_state {
    PIPE_UNSENT,         /* no verdict: not sent (deadline passed), or the call failed */
    PIPE_SETTLED,        /* 'st' is its outcome */
    PIPE_MISSING         /* Redis lost the voucher: to be rebuilt, then sent again */
};

typedef struct pipe_waiter {
    stock_buyer *b;
    stock_done_fn done;
    void *arg;
    enum pipe_state state;
    store_status st;
    struct pipe_waiter *next;
} pipe_waiter;

/* Shared by the workers and event threads of this process by design: that
 * is what lets their buyers share a call. One mutex guards it. */
static pthread_mutex_t pipe_mu = PTHREAD_MUTEX_INITIALIZER;
static pipe_waiter *pipe_head, *pipe_tail;
static int pipe_senders;

static pipe_waiter *pipe_waiter_new(stock_buyer *b, stock_done_fn done, void *arg)
{
    pipe_waiter *w = xcalloc(1, sizeof *w);

    w->b = b;
    w->done = done;
    w->arg = arg;
    return w;
}

static void pipe_enqueue(pipe_waiter *w)
{
    if (pipe_tail != NULL)
        pipe_tail->next = w;
    else
        pipe_head = w;
    pipe_tail = w;
}

/* In durability "wait": one WAIT for the admitted of w[0..n); when it
 * fails they are not known to survive a failover, so not acknowledged.
 * (The orders stand: a retry answers already_ordered, or sold_out
 * when they took the last units.) */
static void pipe_wait(redisContext *c, pipe_waiter **w, int n)
{
    int admitted = 0;

    for (int i = 0; i < n; i++)
        admitted += w[i]->st == STORE_OK;
    if (admitted == 0 || !mode_is(DURABILITY_WAIT) || (c->err == 0 && wait_replicas(c) == 0))
        return;
    for (int i = 0; i < n; i++)
        if (w[i]->st == STORE_OK)
            w[i]->st = STORE_UNAVAILABLE;
}

/* Answers w[0..n) and frees them. */
static void pipe_answer(conn_set *cs, pipe_waiter **w, int n)
{
    for (int i = 0; i < n; i++) {
        w[i]->done(cs, w[i]->arg, w[i]->st);
        free(w[i]);
    }
}

/* Admits w[0..n) in one call of the script (Redis forgetting the script
 * costs a second send as EVAL: nothing ran). A call that fails leaves
 * them STORE_UNAVAILABLE: a connection lost after the send may have
 * admitted the whole lot, so a retry answers already_ordered, or sold_out
 * when it took the last unit. */
static void pipe_send(redisContext *c, pipe_waiter **w, int n)
{
    pipe_waiter *sent[PIPE_MAX];
    store_order *o[PIPE_MAX];
    admit_call ac;
    redisReply *r;
    int ns = 0;

    for (int i = 0; i < n; i++) {
        w[i]->state = PIPE_UNSENT;
        w[i]->st = STORE_UNAVAILABLE;
        if (stock_past_deadline(w[i]->b))
            continue;
        sent[ns] = w[i];
        o[ns++] = &w[i]->b->order;
    }
    if (ns == 0 || admit_call_build(&ac, o, ns) != 0)
        return;
    rec_admit_round(ns);
    r = script_file_run(c, &admit_script, ac.nkeys, ac.argc, ac.argv, NULL);
    if (r != NULL && admit_reply_ok(r, ns)) {
        for (int i = 0; i < ns; i++) {
            int missing;
            sent[i]->st = admit_parse(r->element[i], ac.now, o[i], &missing);
            sent[i]->state = missing ? PIPE_MISSING : PIPE_SETTLED;
        }
    }
    freeReplyObject(r);
    admit_call_free(&ac);
}

/* The buyers of vouchers Redis lost, once the others are answered: the
 * voucher's first buyer here rebuilds it and is admitted alone, the rest
 * are sent again together. A voucher whose rebuild failed fails its other
 * buyers here at once, so a Postgres that does not answer costs one
 * rebuild, not one per buyer. */
static void pipe_retry(conn_set *cs, redisContext *c, pipe_waiter **w, int n)
{
    pipe_waiter *again[PIPE_MAX];
    int nagain = 0;

    for (int i = 0; i < n && c->err == 0; i++) {
        int first = 1, failed = 0;
        if (stock_past_deadline(w[i]->b)) {
            w[i]->state = PIPE_UNSENT;          /* unavailable, and no voucher's first */
            continue;
        }
        /* The voucher's first buyer here ran its rebuild: unavailable
         * means the rebuild failed, not found that there is no such
         * voucher (any other refusal means it worked). */
        for (int j = 0; j < i && first; j++)
            if (w[j]->state == PIPE_MISSING &&
                w[j]->b->order.voucher_id == w[i]->b->order.voucher_id) {
                first = 0;
                failed = w[j]->st == STORE_UNAVAILABLE || w[j]->st == STORE_NOT_FOUND;
                w[i]->st = w[j]->st == STORE_NOT_FOUND ? STORE_NOT_FOUND : STORE_UNAVAILABLE;
            }
        if (failed)
            continue;                           /* as its voucher's first */
        if (!first) {
            again[nagain++] = w[i];
            continue;
        }
        w[i]->st = admit_one(cs, c, &w[i]->b->order);
    }
    if (nagain > 0 && c->err == 0)
        pipe_send(c, again, nagain);            /* lost again: unavailable */
}

/* Settles and answers the lot w[0..n): the ones Redis decided first, then
 * those of lost vouchers (pipe_retry). */
static void pipe_settle(conn_set *cs, pipe_waiter **w, int n)
{
    pipe_waiter *rare[PIPE_MAX], *done[PIPE_MAX];
    redisContext *c = conn_redis(cs);
    int nrare = 0, ndone = 0;

    if (c != NULL && durable(c))
        pipe_send(c, w, n);
    else
        for (int i = 0; i < n; i++)
            w[i]->state = PIPE_UNSENT, w[i]->st = STORE_UNAVAILABLE;
    for (int i = 0; i < n; i++) {
        if (w[i]->state == PIPE_MISSING)
            rare[nrare++] = w[i];
        else
            done[ndone++] = w[i];
    }
    if (c != NULL)
        pipe_wait(c, done, ndone);
    pipe_answer(cs, done, ndone);
    if (nrare > 0 && c != NULL) {
        for (int i = 0; i < nrare; i++)
            rare[i]->st = STORE_UNAVAILABLE;
        pipe_retry(cs, c, rare, nrare);
        pipe_wait(c, rare, nrare);
    }
    pipe_answer(cs, rare, nrare);
    if (c != NULL && c->err)
        conn_redis_broken(cs);
}

/* Queues 'b'; a worker that becomes a sender returns only once the queue
 * is empty, having answered its buyers and everyone else's it took. */
static void pipe_submit(conn_set *cs, stock_buyer *b, stock_done_fn done, void *arg)
{
    pipe_waiter *me = pipe_waiter_new(b, done, arg), *lot[PIPE_MAX];

    pthread_mutex_lock(&pipe_mu);
    pipe_enqueue(me);
    if (pipe_senders >= pipe_senders_max) {
        pthread_mutex_unlock(&pipe_mu);
        return;                               /* a sender will take it */
    }
    pipe_senders++;
    while (pipe_head != NULL) {
        int n = 0;
        while (pipe_head != NULL && n < PIPE_MAX) {
            lot[n++] = pipe_head;
            pipe_head = pipe_head->next;
        }
        if (pipe_head == NULL)
            pipe_tail = NULL;
        pthread_mutex_unlock(&pipe_mu);
        pipe_settle(cs, lot, n);
        pthread_mutex_lock(&pipe_mu);
    }
    pipe_senders--;
    pthread_mutex_unlock(&pipe_mu);
}

static int redis_joinable(void)
{
    return pipe_senders_max > 0;
}

/* For an event thread: queues 'b' when a sender is at work (it takes 'b'
 * before it stops); never blocks on I/O. */
static int redis_join(stock_buyer *b, stock_done_fn done, void *arg)
{
    pipe_waiter *me = pipe_waiter_new(b, done, arg);
    int queued;

    pthread_mutex_lock(&pipe_mu);
    queued = pipe_senders > 0;
    if (queued)
        pipe_enqueue(me);
    pthread_mutex_unlock(&pipe_mu);
    if (!queued)
        free(me);
    return queued;
}

static void redis_settle(conn_set *cs, PGconn *pg, stock_buyer *b, stock_done_fn done, void *arg)
{
    (void)pg;                                   /* admission needs no Postgres */
    if (pipe_senders_max > 0)
        pipe_submit(cs, b, done, arg);
    else
        redis_settle_alone(cs, b, done, arg);
}

/* The voucher as Redis holds it (its stock is the admissions' own). */
static store_status redis_voucher(conn_set *cs, int64_t voucher_id, store_voucher *out)
{
    redisContext *c = conn_redis(cs);
    store_status st = STORE_UNAVAILABLE;
    redisReply *r;
    vkeys k;

    if (c == NULL)
        return STORE_UNAVAILABLE;
    vkeys_fill(&k, voucher_id);
    r = redisCommand(c, "HMGET %s stock initial begin end title", k.hash);
    if (r == NULL)
        goto out;
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
    out->stock = int_reply(r->element[0]);
    out->initial_stock = int_reply(r->element[1]);
    out->begin_time = int_reply(r->element[2]);
    out->end_time = int_reply(r->element[3]);
    snprintf(out->title, sizeof out->title, "%s", r->element[4]->str);
    st = STORE_OK;
out:
    freeReplyObject(r);
    if (c->err)
        conn_redis_broken(cs);
    return st;
}

static int redis_load(conn_set *cs, const store_voucher *v)
{
    redisContext *c = conn_redis(cs);
    int rc;

    if (c == NULL)
        return -1;
    rc = stock_redis_load(c, v);
    if (c->err)
        conn_redis_broken(cs);
    return rc;
}

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

/* The stream id's milliseconds ("<ms>-<seq>"), of the reply 'id'; -1 when
 * it is not one. */
static int64_t id_ms(const redisReply *id)
{
    return id != NULL && id->type == REDIS_REPLY_STRING ? strtoll(id->str, NULL, 10) : -1;
}

/* The age in ms of the stream's oldest unsettled order: the first pending
 * entry (XPENDING's summary), else the first entry after the group's
 * position 'last' (NULL: no group, every entry is unsettled). 0 when
 * there is none; -1 when Redis failed. */
static int64_t oldest_age_ms(redisContext *c, int64_t pending, const char *last)
{
    redisReply *r;
    int64_t ms = -1, age = -1;

    if (pending > 0) {
        r = redisCommand(c, "XPENDING %s %s", STOCK_REDIS_STREAM, STOCK_REDIS_GROUP);
        if (r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements >= 2)
            ms = id_ms(r->element[1]);
    } else {
        r = last != NULL ? redisCommand(c, "XRANGE %s (%s + COUNT 1", STOCK_REDIS_STREAM, last)
                         : redisCommand(c, "XRANGE %s - + COUNT 1", STOCK_REDIS_STREAM);
        if (r != NULL && r->type == REDIS_REPLY_ARRAY)
            ms = r->elements == 0 ? -2
                 : r->element[0]->type == REDIS_REPLY_ARRAY && r->element[0]->elements >= 1
                     ? id_ms(r->element[0]->element[0]) : -1;
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
static int stream_backlog(redisContext *c, int64_t *backlog, int64_t *pending, int64_t *oldest)
{
    redisReply *r = redisCommand(c, "XINFO GROUPS %s", STOCK_REDIS_STREAM);
    group_info g = { 0 };
    int rc = -1;

    *backlog = *pending = *oldest = -1;
    if (r == NULL)
        return -1;
    if (r->type == REDIS_REPLY_ERROR) {
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
        r = redisCommand(c, "XLEN %s", STOCK_REDIS_STREAM);
        *backlog = int_reply(r);
        *pending = 0;
        *oldest = *backlog > 0 ? oldest_age_ms(c, 0, NULL) : 0;
        rc = c->err ? -1 : 0;
        goto out;
    }
    if (g.lag < 0) {
        /* Bounded: a backlog above it is reported as unknown (-1). */
        r = redisCommand(c, "XRANGE %s (%s + COUNT %d", STOCK_REDIS_STREAM, g.last,
                         BACKLOG_COUNT_MAX + 1);
        if (r == NULL)
            goto out;
        if (r->type == REDIS_REPLY_ARRAY && r->elements <= BACKLOG_COUNT_MAX)
            g.lag = (int64_t)r->elements;
    }
    *pending = g.pending;
    *backlog = g.lag < 0 ? -1 : g.pending + g.lag;
    *oldest = *backlog == 0 ? 0 : oldest_age_ms(c, g.pending, g.last);
    rc = c->err ? -1 : 0;
out:
    freeReplyObject(r);
    return rc;
}

int stock_redis_watch(redisContext *c)
{
    int64_t backlog, pending, oldest, bound;
    int over, was, rc = stock_redis_check_durability(c) < 0 ? -1 : 0;

    if (c->err || stream_backlog(c, &backlog, &pending, &oldest) != 0)
        return -1;
    atomic_store(&watch_backlog, backlog);
    atomic_store(&watch_oldest_ms, oldest);
    /* A backlog Redis cannot count (-1): the stream's length bounds it. */
    bound = backlog;
    if (bound < 0 && g_cfg.stream_backlog_max > 0) {
        redisReply *r = redisCommand(c, "XLEN %s", STOCK_REDIS_STREAM);
        bound = r != NULL && r->type == REDIS_REPLY_INTEGER ? r->integer : INT64_MAX;
        freeReplyObject(r);
    }
    over = g_cfg.stream_backlog_max > 0 && bound > g_cfg.stream_backlog_max;
    was = atomic_exchange(&watch_over, over);
    if (over && !was)
        log_error("stock_redis: %" PRId64 " admitted orders are not in Postgres yet (the oldest "
                  "%" PRId64 " ms), over STREAM_BACKLOG_MAX=%d: buyers are answered 503 until "
                  "the consumers catch up", backlog, oldest, g_cfg.stream_backlog_max);
    else if (!over && was)
        log_warn("stock_redis: the stream's backlog is back under STREAM_BACKLOG_MAX (%" PRId64
                 "): admission goes on", backlog);
    return c->err ? -1 : rc;
}

int stock_redis_retire(redisContext *c, int64_t voucher_id, int64_t pg_sale)
{
    char num[24];
    const char *argv[3];
    redisReply *r;
    vkeys k;
    int rc = -1;

    vkeys_fill(&k, voucher_id);
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

void stock_redis_watch_get(stock_redis_figures *out)
{
    out->durable = atomic_load(&durability) == DUR_OK;
    out->over_backlog = atomic_load(&watch_over);
    out->backlog = atomic_load(&watch_backlog);
    out->oldest_ms = atomic_load(&watch_oldest_ms);
}

static int64_t int_reply(redisReply *r)
{
    if (r == NULL)
        return -1;
    if (r->type == REDIS_REPLY_INTEGER)
        return r->integer;
    if (r->type == REDIS_REPLY_STRING)
        return strtoll(r->str, NULL, 10);
    return r->type == REDIS_REPLY_NIL ? 0 : -1;
}

int stock_redis_stats(redisContext *c, cJSON *root, cJSON *vouchers)
{
    cJSON *rf = cJSON_AddObjectToObject(root, "redisFirst"), *v;
    int64_t backlog, dead, pending, oldest;
    int all_agree = 1;
    redisReply *r;

    if (stream_backlog(c, &backlog, &pending, &oldest) != 0)
        return -1;
    r = redisCommand(c, "XLEN %s", STOCK_REDIS_DEAD);
    dead = int_reply(r);
    freeReplyObject(r);
    if (c->err)
        return -1;
    cJSON_AddStringToObject(rf, "durability",
                            config_durability_name(g_cfg.redis_order_durability));
    cJSON_AddBoolToObject(rf, "durable", atomic_load(&durability) == DUR_OK);
    cJSON_AddStringToObject(rf, "durabilityCheck", durability_text(atomic_load(&durability)));
    cJSON_AddNumberToObject(rf, "backlog", (double)backlog);
    cJSON_AddNumberToObject(rf, "backlogMax", (double)g_cfg.stream_backlog_max);
    cJSON_AddBoolToObject(rf, "overBacklogMax", atomic_load(&watch_over));
    cJSON_AddNumberToObject(rf, "oldestUnsettledMs", (double)oldest);
    cJSON_AddNumberToObject(rf, "pending", (double)(pending < 0 ? 0 : pending));
    cJSON_AddNumberToObject(rf, "deadLetters", (double)dead);

    cJSON_ArrayForEach(v, vouchers) {
        int64_t id = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(v, "voucherId"));
        int64_t pg_stock = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(v, "stock"));
        int64_t initial = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(v, "initialStock"));
        int64_t orders = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(v, "orders"));
        int64_t rstock, rinitial, rbuyers;
        cJSON *o;
        vkeys k;
        int agree;

        vkeys_fill(&k, id);
        r = redisCommand(c, "HMGET %s stock initial", k.hash);
        if (r == NULL)
            return -1;
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type == REDIS_REPLY_NIL) {
            freeReplyObject(r);
            continue;                           /* not loaded: nothing sold through Redis */
        }
        rstock = int_reply(r->element[0]);
        rinitial = int_reply(r->element[1]);
        freeReplyObject(r);
        r = redisCommand(c, "SCARD %s", k.buyers);
        rbuyers = int_reply(r);
        freeReplyObject(r);
        if (c->err)
            return -1;
        /* Drained, both sides must tell the same story: as many orders as
         * units taken, on each side, and as many buyers as orders. */
        agree = backlog == 0 && rinitial == initial && rinitial - rstock == rbuyers &&
                initial - pg_stock == orders && rbuyers == orders && rstock == pg_stock;
        all_agree = all_agree && agree;
        o = cJSON_AddObjectToObject(v, "redis");
        cJSON_AddNumberToObject(o, "stock", (double)rstock);
        cJSON_AddNumberToObject(o, "buyers", (double)rbuyers);
        cJSON_AddNumberToObject(o, "undrained", (double)(rbuyers - orders));
        cJSON_AddBoolToObject(o, "agree", agree);
    }
    cJSON_AddBoolToObject(rf, "reconciled", all_agree && dead == 0);
    return 0;
}

const stock_backend stock_redis_first = {
    .name = "redis",
    .alone = 1,
    .deferred = 1,
    .settle = redis_settle,
    .join = redis_join,
    .joinable = redis_joinable,
    .start = stock_redis_start,
    .load = redis_load,
    .voucher = redis_voucher,
    .stats = stock_redis_stats,
};
