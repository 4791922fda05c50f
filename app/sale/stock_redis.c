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
 * stream's name, the counter's key, the id's seconds, the number of
 * vouchers and the first count drawn. */
#define ADMIT_HASH_KEY sizeof(((stock_redis_keys *)0)->hash)
#define ADMIT_BUYERS_KEY sizeof(((stock_redis_keys *)0)->buyers)
#define ADMIT_STREAM_KEY sizeof(((stock_redis_stream *)0)->orders)
#define ADMIT_ID_KEY 128
#define ADMIT_INT 24
#define ADMIT_VOUCHER_TEXT (ADMIT_HASH_KEY + ADMIT_BUYERS_KEY + ADMIT_INT)
#define ADMIT_BUYER_TEXT (2 * ADMIT_INT)
#define ADMIT_LOT_TEXT (ADMIT_STREAM_KEY + ADMIT_ID_KEY + 3 * ADMIT_INT)

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

/* Copies 'key' to *cur (room up to 'end'), moves *cur past the NUL; the
 * start. */
static const char *text_str(char **cur, char *end, const char *key)
{
    char *s = *cur;
    int len = snprintf(s, (size_t)(end - s), "%s", key);

    *cur += len < end - s ? len + 1 : end - s;
    return s;
}

/* The arguments of one call for the buyers o[0..n), 1 <= n <= PIPE_MAX,
 * each voucher's keys once (the script counts a voucher's stock per key
 * pair: a voucher listed twice would be sold twice), at clock reading
 * 'now'. 'drawn': the first of n counts drawn before the call, or 0 (the
 * script draws them from the day's counter). With a stream per voucher
 * (a Redis Cluster) the buyers are of one voucher. 0, or -1. */
static int admit_call_build(admit_call *ac, store_order *const *o, int n, int64_t now,
                            int64_t drawn)
{
    int64_t vid[PIPE_MAX];
    int vj[PIPE_MAX];
    int m = 0, a = 0;
    char *cur, *end, key[ADMIT_ID_KEY];
    size_t room;
    stock_redis_stream stream;

    memset(ac, 0, sizeof *ac);
    ac->now = now;
    if (n < 1 || n > PIPE_MAX)
        return -1;
    for (int i = 0; i < n; i++) {
        int j = 0;
        while (j < m && vid[j] != o[i]->voucher_id)
            j++;
        if (j == m)
            vid[m++] = o[i]->voucher_id;
        vj[i] = j + 1;
    }
    stock_redis_stream_of(&stream, vid[0]);
    if (stream.voucher_id != 0 && (m != 1 || drawn <= 0)) {
        log_error("stock_redis: a call on a voucher's own stream takes one voucher and its "
                  "counts drawn before");
        return -1;
    }
    ac->nkeys = 1 + 2 * m + (drawn > 0 ? 0 : 1);
    ac->argc = ac->nkeys + 3 + m + 2 * n;
    ac->argv = xcalloc((size_t)ac->argc, sizeof *ac->argv);
    room = ADMIT_LOT_TEXT + (size_t)m * ADMIT_VOUCHER_TEXT + (size_t)n * ADMIT_BUYER_TEXT;
    cur = ac->text = xcalloc(room, 1);
    end = cur + room;
    ac->argv[a++] = text_str(&cur, end, stream.orders);
    for (int j = 0; j < m; j++) {
        stock_redis_key(key, sizeof key, vid[j], "");
        ac->argv[a++] = text_str(&cur, end, key);
        stock_redis_key(key, sizeof key, vid[j], ":buyers");
        ac->argv[a++] = text_str(&cur, end, key);
    }
    if (drawn <= 0) {
        order_id_key(g_cfg.id_prefix, ac->now, key, sizeof key);
        ac->argv[a++] = text_str(&cur, end, key);
    }
    ac->argv[a++] = text_int(&cur, end, ac->now - (int64_t)ORDER_ID_EPOCH);
    ac->argv[a++] = text_int(&cur, end, m);
    ac->argv[a++] = text_int(&cur, end, drawn > 0 ? drawn : 0);
    for (int j = 0; j < m; j++)
        ac->argv[a++] = text_int(&cur, end, vid[j]);
    for (int i = 0; i < n; i++) {
        ac->argv[a++] = text_int(&cur, end, vj[i]);
        ac->argv[a++] = text_int(&cur, end, o[i]->user_id);
    }
    return 0;
}

/* The connection for a voucher's admissions: on a Redis Cluster, to the
 * master of its slot; else the one Redis's. Borrowed; NULL when
 * unreachable. */
static redisContext *voucher_redis(conn_set *cs, int64_t voucher_id)
{
    char key[ADMIT_HASH_KEY];

    if (!stock_redis_per_voucher())
        return conn_redis(cs);
    stock_redis_key(key, sizeof key, voucher_id, "");
    return conn_redis_key(cs, key);
}

/* Order id counts drawn before the calls that use them: 'n' counts of
 * the day of 'now' from 'first' on. */
typedef struct admit_counts {
    int64_t now, first;
    int n;
} admit_counts;

/* With a stream per voucher (a Redis Cluster, where the day's counter
 * lives in a slot of its own): 'n' counts, one INCRBY on the counter's
 * master; with REDIS_ORDER_DURABILITY=wait, a WAIT there too, so that a
 * failover of the counter's master cannot hand the same counts out again
 * to orders acknowledged meanwhile. Every context cs handed out before may
 * have been freed (a failure drops the handle's connections): take the
 * voucher's again after. 0, or -1 (the clock before the id epoch, the
 * counter unavailable or not acknowledged by a replica). */
static int admit_counts_draw(conn_set *cs, int n, admit_counts *out)
{
    char key[ADMIT_ID_KEY];
    redisContext *c;
    int rc;

    out->now = util_now_s();
    out->n = n;
    out->first = 0;
    if (out->now < ORDER_ID_EPOCH) {
        log_error("stock_redis: clock before the order id epoch");
        return -1;
    }
    if (!stock_redis_per_voucher())
        return 0;
    if (order_id_take_counts(cs, g_cfg.id_prefix, out->now, n, &out->first) != ORDER_ID_OK)
        return -1;
    if (g_cfg.redis_order_durability != DURABILITY_WAIT)
        return 0;
    order_id_key(g_cfg.id_prefix, out->now, key, sizeof key);
    if ((c = conn_redis_key(cs, key)) == NULL)
        return -1;
    if ((rc = stock_redis_durability_wait(c)) != 0 && c->err)
        conn_redis_broken(cs);
    return rc == 0 ? 0 : -1;
}

/* The call for the buyers o[0..n): with 'pre', the counts drawn for them
 * before (at least n); else the clock read, and on a Redis Cluster their
 * counts drawn now. On a cluster *c is then the voucher's connection taken
 * again (the draw may have freed the one the caller held; NULL when
 * unreachable). 0, or -1. */
static int admit_call_prepare(conn_set *cs, redisContext **c, admit_call *ac,
                              store_order *const *o, int n, const admit_counts *pre)
{
    admit_counts own;
    int rc = -1;

    if (pre == NULL) {
        if (admit_counts_draw(cs, n, &own) != 0)
            goto out;
        pre = &own;
    }
    if (pre->n >= n)
        rc = admit_call_build(ac, o, n, pre->now, pre->first);
out:
    if (stock_redis_per_voucher())
        *c = voucher_redis(cs, o[0]->voucher_id);
    return rc;
}

/* Runs the call on *c. On a Redis Cluster a reply that names a
 * redirection (the voucher's slot moved, or is moving) means the script
 * did not run: it is sent again where the node said, or after a pause
 * routed anew, up to ORDER_ID_TRIES sends; *c is the connection of the
 * last send (NULL when none was reachable). The reply, or NULL. */
static redisReply *admit_run(conn_set *cs, redisContext **c, const admit_call *ac)
{
    redisReply *r = NULL;
    rcluster_redirect rd = { .kind = RCLUSTER_NONE };

    for (int tries = 1; *c != NULL; tries++) {
        /* After ASK (ASKING sent), EVAL: one command that ASKING covers. */
        r = rd.kind == RCLUSTER_ASK
                ? script_file_eval(*c, &admit_script, ac->nkeys, ac->argc, ac->argv, NULL)
                : script_file_run(*c, &admit_script, ac->nkeys, ac->argc, ac->argv, NULL);
        if (r == NULL || rcluster_redirect_parse(r, &rd) == RCLUSTER_NONE ||
            tries == ORDER_ID_TRIES)
            break;
        freeReplyObject(r);
        r = NULL;
        *c = conn_redis_resend(cs, &rd, ac->argv[1], tries);
    }
    return r;
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

/* One buyer's call of order_admit.lua, alone, on *c (admit_run: *c
 * follows a redirection): the outcome, the order id when admitted;
 * 'missing' set when the voucher must be rebuilt first. */
static store_status admit(conn_set *cs, redisContext **c, store_order *o, int *missing)
{
    admit_call ac;
    store_status st = STORE_UNAVAILABLE;
    redisReply *r;

    *missing = 0;
    if (admit_call_prepare(cs, c, &ac, &o, 1, NULL) != 0)
        return STORE_UNAVAILABLE;
    r = admit_run(cs, c, &ac);
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
static store_status admit_one(conn_set *cs, redisContext **c, store_order *o)
{
    int missing;
    store_status st = admit(cs, c, o, &missing);

    if (missing && *c != NULL) {
        /* Not in Redis: created before Redis held it, or lost with a Redis
         * that restarted empty; or no such voucher (STORE_NOT_FOUND: 404,
         * as on every other path). */
        st = stock_redis_rebuild(cs, *c, o->voucher_id);
        if (st == STORE_OK) {
            st = admit(cs, c, o, &missing);
            if (missing)
                st = STORE_UNAVAILABLE;
        }
    }
    return st;
}

static void redis_settle_alone(conn_set *cs, stock_buyer *b, stock_done_fn done, void *arg)
{
    redisContext *c = voucher_redis(cs, b->order.voucher_id);
    store_status st = STORE_UNAVAILABLE;

    if (c == NULL || stock_past_deadline(b) || !durable(c))
        goto out;
    counters_admit_round(1);
    st = admit_one(cs, &c, &b->order);
    /* In "wait": on the master that admitted it, the voucher's. */
    if (st == STORE_OK && (c == NULL || stock_redis_durability_wait(c) != 0)) {
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

/* pipe_wait on 'c', the connection that admitted w[0..n); when it was
 * lost (NULL: none reachable after a redirection), none of them is known
 * to have been admitted durably. */
static void pipe_wait_on(redisContext *c, pipe_waiter **w, int n)
{
    if (c != NULL) {
        pipe_wait(c, w, n);
        return;
    }
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

/* Admits w[0..n) in one call of the script on *c (admit_run: *c
 * follows a redirection; Redis forgetting the script costs a second send
 * as EVAL: nothing ran). A call that fails leaves them STORE_UNAVAILABLE:
 * a connection lost after the send may have admitted the whole lot, so a
 * retry answers already_ordered, or sold_out when it took the last unit. */
static void pipe_send(conn_set *cs, redisContext **c, pipe_waiter **w, int n,
                      const admit_counts *pre)
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
    if (ns == 0 || admit_call_prepare(cs, c, &ac, o, ns, pre) != 0)
        return;
    counters_admit_round(ns);
    r = admit_run(cs, c, &ac);
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

/* *c is there and sound. */
static int usable(redisContext *const *c)
{
    return *c != NULL && (*c)->err == 0;
}

/* The buyers of vouchers Redis lost, once the others are answered: the
 * voucher's first buyer here rebuilds it and is admitted alone, the rest
 * are sent again together. A voucher whose rebuild failed fails its other
 * buyers here at once, so a Postgres that does not answer costs one
 * rebuild, not one per buyer. Each call's admitted are waited for (mode
 * "wait") on the connection that admitted them, before *c may move on. */
static void pipe_retry(conn_set *cs, redisContext **c, pipe_waiter **w, int n)
{
    pipe_waiter *again[PIPE_MAX];
    int nagain = 0;

    for (int i = 0; i < n && usable(c); i++) {
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
        pipe_wait_on(*c, &w[i], 1);
    }
    if (nagain > 0 && usable(c)) {
        pipe_send(cs, c, again, nagain, NULL);  /* lost again: unavailable */
        pipe_wait_on(*c, again, nagain);
    }
}

/* Settles and answers the lot w[0..n), all on one connection: the ones
 * Redis decided first, then those of lost vouchers (pipe_retry). 'pre':
 * their order id counts, drawn before (or NULL). */
static void pipe_settle_on(conn_set *cs, pipe_waiter **w, int n, const admit_counts *pre)
{
    pipe_waiter *rare[PIPE_MAX], *done[PIPE_MAX];
    redisContext *c = voucher_redis(cs, w[0]->b->order.voucher_id);
    int nrare = 0, ndone = 0;

    if (c != NULL && durable(c))
        pipe_send(cs, &c, w, n, pre);
    else
        for (int i = 0; i < n; i++)
            w[i]->state = PIPE_UNSENT, w[i]->st = STORE_UNAVAILABLE;
    for (int i = 0; i < n; i++) {
        if (w[i]->state == PIPE_MISSING)
            rare[nrare++] = w[i];
        else
            done[ndone++] = w[i];
    }
    /* In "wait": on the master that admitted them. */
    pipe_wait_on(c, done, ndone);
    pipe_answer(cs, done, ndone);
    if (nrare > 0 && c != NULL) {
        for (int i = 0; i < nrare; i++)
            rare[i]->st = STORE_UNAVAILABLE;
        pipe_retry(cs, &c, rare, nrare);
    }
    pipe_answer(cs, rare, nrare);
    if (c != NULL && c->err)
        conn_redis_broken(cs);
}

/* Settles and answers the lot w[0..n). On one Redis in one call; with a
 * stream per voucher (a Redis Cluster), the lot's order id counts drawn
 * first in one INCRBY, then one call per voucher, each on the master of
 * its slot, in the order of each voucher's first buyer. */
static void pipe_settle(conn_set *cs, pipe_waiter **w, int n)
{
    pipe_waiter *group[PIPE_MAX];
    unsigned char taken[PIPE_MAX] = { 0 };
    admit_counts lot, slice;

    if (!stock_redis_per_voucher()) {
        pipe_settle_on(cs, w, n, NULL);
        return;
    }
    if (admit_counts_draw(cs, n, &lot) != 0)
        lot.n = 0;                              /* none drawn: each call draws its own */
    slice = lot;
    for (int i = 0; i < n; i++) {
        int ng = 0;
        if (taken[i])
            continue;
        for (int j = i; j < n; j++)
            if (!taken[j] && w[j]->b->order.voucher_id == w[i]->b->order.voucher_id) {
                taken[j] = 1;
                group[ng++] = w[j];
            }
        slice.n = lot.n > 0 ? ng : 0;
        pipe_settle_on(cs, group, ng, lot.n > 0 ? &slice : NULL);
        slice.first += ng;
    }
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

/* The voucher as Redis holds it (its stock is the admissions' own). On a
 * Redis Cluster a redirection is followed as admit_run follows one (a
 * voucher whose slot moved is read on its new master at once). */
static store_status redis_voucher(conn_set *cs, int64_t voucher_id, store_voucher *out)
{
    redisContext *c = voucher_redis(cs, voucher_id);
    store_status st = STORE_UNAVAILABLE;
    rcluster_redirect rd;
    char key[ADMIT_HASH_KEY];

    stock_redis_key(key, sizeof key, voucher_id, "");
    for (int tries = 1; c != NULL; tries++) {
        st = stock_redis_voucher(c, voucher_id, out, &rd);
        if (rd.kind == RCLUSTER_NONE || c->err || tries == ORDER_ID_TRIES)
            break;
        c = conn_redis_resend(cs, &rd, key, tries);
    }
    if (c != NULL && c->err)
        conn_redis_broken(cs);
    return st;
}

static int redis_load(conn_set *cs, const store_voucher *v)
{
    redisContext *c = voucher_redis(cs, v->voucher_id);
    int rc;

    if (c == NULL)
        return -1;
    rc = stock_redis_load(c, v);
    /* On a cluster a failure may be a slot that moved: the map is read
     * again at the next use. */
    if (c->err || (rc != 0 && stock_redis_per_voucher()))
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
