/* stock_redis: the "redis" stock strategy's entry points and its
 * admission (stock_redis.h). */
#include "stock_redis.h"
#include "config.h"
#include "order_id.h"
#include "log.h"
#include "counters.h"
#include "script.h"
#include "stock.h"
#include "util.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static script_file admit_script = { .name = "order_admit" };

/* Workers that may send admissions in lots at once (0: each its own
 * buyer's, alone). Set at start, read-only after. */
static int pipe_senders_max;

int stock_redis_start(char *err, size_t errlen)
{
    if (script_file_load(&admit_script, g_cfg.lua_dir, admit_script.name, err, errlen) != 0 ||
        stock_redis_load_start(err, errlen) != 0)
        return -1;
    /* A sender keeps its worker while buyers keep coming: one worker at
     * least stays for the rest (a voucher not in the cache, the admin API). */
    pipe_senders_max = g_cfg.redis_admit_pipelines < g_cfg.threads
                           ? g_cfg.redis_admit_pipelines : g_cfg.threads - 1;
    if (pipe_senders_max < g_cfg.redis_admit_pipelines)
        log_warn("REDIS_ADMIT_PIPELINES=%d with THREADS=%d: %d sender(s), so that a worker "
                 "stays free", g_cfg.redis_admit_pipelines, g_cfg.threads, pipe_senders_max);
    return stock_redis_durability_start(err, errlen);
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

/* Text each argument may take: a voucher's two keys (as stock_redis_keys
 * holds them) and its id; a buyer's voucher index and user id; the
 * counter's key, the id's seconds and the number of vouchers. */
#define ADMIT_HASH_KEY sizeof(((stock_redis_keys *)0)->hash)
#define ADMIT_BUYERS_KEY sizeof(((stock_redis_keys *)0)->buyers)
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
    if (ac->now < ORDER_ID_EPOCH) {
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
    order_id_key(g_cfg.id_prefix, ac->now, cur, ADMIT_ID_KEY);
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
    ac->argv[a++] = text_int(&cur, end, ac->now - (int64_t)ORDER_ID_EPOCH);
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
            (o->order_id = order_id_compose(now - ORDER_ID_EPOCH, e->element[1]->integer)) > 0)
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
    if (stock_redis_over_backlog())
        return 0;
    return stock_redis_durability_holds(c);
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
        st = stock_redis_rebuild(cs, c, o->voucher_id);
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
    counters_admit_round(1);
    st = admit_one(cs, c, &b->order);
    if (st == STORE_OK && stock_redis_durability_wait(c) != 0) {
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
    if (admitted == 0 || stock_redis_durability_wait(c) == 0)
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
    counters_admit_round(ns);
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
    store_status st;

    if (c == NULL)
        return STORE_UNAVAILABLE;
    st = stock_redis_voucher(c, voucher_id, out);
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
