/* order: lock strategy x stock strategy. Only reentrant + optimistic (the
 * defaults) is safe; the others are the seed notes' broken steps, kept
 * runnable so that a load test can show each failure as numbers. */
#include "order.h"
#include "batch.h"
#include "config.h"
#include "idw.h"
#include "lock.h"
#include "log.h"
#include "script.h"
#include "rec.h"
#include "store.h"
#include "util.h"
#include "vcache.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LOCK_KEY_PREFIX "lock:order:"

/* "owner": lua/owner_release.lua, loaded by order_init. */
static script_file owner_release;

int order_init(char *err, size_t errlen)
{
    return script_file_load(&owner_release, g_cfg.lua_dir, "owner_release", err, errlen);
}

/* "local": an in-process mutex per user, striped. Correct on one instance,
 * useless across two behind nginx: that is what it is here to show. */
#define LOCAL_STRIPES 1024
static pthread_mutex_t local_locks[LOCAL_STRIPES];
static pthread_once_t local_once = PTHREAD_ONCE_INIT;

static void local_init(void)
{
    for (int i = 0; i < LOCAL_STRIPES; i++)
        pthread_mutex_init(&local_locks[i], NULL);
}

static pthread_mutex_t *local_lock_of(int64_t user_id)
{
    pthread_once(&local_once, local_init);
    return &local_locks[(uint64_t)user_id * 0x9e3779b97f4a7c15ULL >> 54];
}

/* One order statement per voucher in flight from this instance: the others
 * wait on a mutex here rather than in Postgres's row-lock queue, where each
 * waiter costs the database a backend wake-up and a lock-manager round on
 * every commit. Postgres then sees one contender per instance; the rate of
 * the hot row is the same, its CPU cost per order much lower. */
#define GATE_STRIPES 64
static pthread_mutex_t gates[GATE_STRIPES];
static pthread_once_t gates_once = PTHREAD_ONCE_INIT;

static void gates_init(void)
{
    for (int i = 0; i < GATE_STRIPES; i++)
        pthread_mutex_init(&gates[i], NULL);
}

static store_status gated_order_create(conn_set *cs, PGconn *pg, const store_order *o)
{
    pthread_mutex_t *g;
    store_early e;
    store_status st;

    pthread_once(&gates_once, gates_init);
    g = &gates[(uint64_t)o->voucher_id % GATE_STRIPES];
    if (!g_cfg.early_lock_release) {
        pthread_mutex_lock(g);
        st = store_order_create(pg, o);
        pthread_mutex_unlock(g);
        return st;
    }
    /* Early release: the gate covers the order's commit only; the wait for
     * its flush, sent in the same round trip, runs outside it, so the next
     * buyer's statement overlaps this one's fsync. */
    pthread_mutex_lock(g);
    st = store_order_send_early(pg, o, &e);
    pthread_mutex_unlock(g);
    st = store_order_finish_early(pg, &e, st);
    if (PQpipelineStatus(pg) != PQ_PIPELINE_OFF)
        conn_pg_broken(cs);
    return st;
}

typedef struct held {
    char key[64];
    char owner[128];          /* the worker's owner id, or this request's own (batched) */
    int kind;                 /* enum lock_strategy actually taken */
    lock_grant grant;
    lock_release_req rq;      /* reentrant: the release, kept across retries */
    batch_unlock unlock;      /* reentrant + batched: released by the batch's leader */
} held;

/* One order in flight: on the heap, since a batched order outlives the
 * worker's call (its batch's leader finishes it). */
typedef struct order_job {
    store_order o;
    held h;
    uint64_t gen;             /* the voucher cache's, when the order began */
    const char *message;
    order_reply_fn reply;
    void *arg;
} order_job;

/* The reentrant lock's attempt with the order id's INCR in the same round
 * trip: INCR first, so that the acquire is the last reply (its NOSCRIPT
 * fallback waits on the connection). A busy lock wastes an id; ids need
 * not be dense. */
static lock_status take_with_id(redisContext *c, const char *key, const char *owner,
                                lock_grant *g, idw_status *is, int64_t *order_id)
{
    idw_op iop;
    lock_acquire_op aop;

    idw_send(c, g_cfg.id_prefix, (int64_t)time(NULL), &iop);
    lock_acquire_send(c, &aop, key, owner, g_cfg.lock_lease_ms);
    *is = idw_recv(c, &iop, order_id);
    return lock_acquire_recv(c, &aop, g);
}

/* Takes the user's lock. API_OK when held (or when the strategy takes none).
 * The reentrant lock also takes the order id: then *id_taken is 1 and *is
 * its outcome. */
static api_err take(conn_set *cs, redisContext *c, int64_t user_id, held *h,
                    int *id_taken, idw_status *is, int64_t *order_id)
{
    redisReply *r = NULL;
    api_err err = API_OK;

    *id_taken = 0;

    snprintf(h->key, sizeof h->key, LOCK_KEY_PREFIX "%" PRId64, user_id);
    h->kind = g_cfg.lock_strategy;
    switch (h->kind) {
    case LOCKS_NONE:
        break;
    case LOCKS_LOCAL:
        /* Blocking, like Java's synchronized: the second request of the user
         * waits, then finds the first one's order. */
        pthread_mutex_lock(local_lock_of(user_id));
        rec_note(REC_DEMO_LOCK_ACQUIRED);
        break;
    case LOCKS_SETNX:
    case LOCKS_OWNER: {
        /* These locks have no watchdog: in watchdog mode they get its lease. */
        long lease = g_cfg.lock_lease_ms > 0 ? g_cfg.lock_lease_ms : g_cfg.watchdog_timeout_ms;
        /* setnx: SET NX EX, whole seconds; owner: SET NX PX with our owner id. */
        if (h->kind == LOCKS_SETNX)
            r = redisCommand(c, "SET %s %s NX EX %ld", h->key, h->owner, (lease + 999) / 1000);
        else
            r = redisCommand(c, "SET %s %s NX PX %ld", h->key, h->owner, lease);
        if (r == NULL || r->type == REDIS_REPLY_ERROR) {
            err = API_UNAVAILABLE;
        } else if (r->type == REDIS_REPLY_NIL) {
            rec_note(REC_DEMO_LOCK_CONTENDED);
            err = API_ALREADY_ORDERED;
        } else {
            rec_note(REC_DEMO_LOCK_ACQUIRED);
        }
        break;
    }
    case LOCKS_REENTRANT:
    default:
        *id_taken = 1;
        lock_release_req_init(&h->rq);
        h->unlock.done = 0;
        switch (take_with_id(c, h->key, h->owner, &h->grant, is, order_id)) {
        case LOCK_OK:
            break;
        case LOCK_BUSY:
            err = API_ALREADY_ORDERED;
            break;
        default:
            /* A lost reply may hide a grant that Redis runs later: release it at
             * the next chance, or the user is locked out for a whole lease. */
            if (c->err) {
                snprintf(cs->orphan_lock, sizeof cs->orphan_lock, "%s", h->key);
                snprintf(cs->orphan_owner, sizeof cs->orphan_owner, "%s", h->owner);
            }
            err = API_UNAVAILABLE;
            break;
        }
        break;
    }
    freeReplyObject(r);
    return err;
}

/* Releases after the transaction ended, whatever its outcome. */
static void give_back(conn_set *cs, int64_t user_id, held *h)
{
    redisContext *c = cs->redis;    /* NULL if it broke meanwhile: leases free it */
    redisReply *r = NULL;
    const char *argv[2];

    switch (h->kind) {
    case LOCKS_NONE:
        return;
    case LOCKS_LOCAL:
        pthread_mutex_unlock(local_lock_of(user_id));
        rec_note(REC_DEMO_LOCK_RELEASED);
        return;
    case LOCKS_SETNX:
        if (c == NULL)
            return;
        /* The bug on show: DEL without an owner check. The GET before it is
         * only there to count the deletes of another holder's lock. */
        r = redisCommand(c, "GET %s", h->key);
        if (r != NULL && (r->type != REDIS_REPLY_STRING || strcmp(r->str, h->owner) != 0))
            rec_note(REC_DEMO_LOCK_NOT_OWNER);
        freeReplyObject(r);
        r = redisCommand(c, "DEL %s", h->key);
        if (r != NULL && r->type == REDIS_REPLY_INTEGER)
            rec_note(REC_DEMO_LOCK_RELEASED);
        break;
    case LOCKS_OWNER:
        if (c == NULL)
            return;
        argv[0] = h->key;
        argv[1] = h->owner;
        r = script_file_run(c, &owner_release, 1, 2, argv, NULL);
        if (r != NULL && r->type == REDIS_REPLY_INTEGER)
            rec_note(r->integer == 1 ? REC_DEMO_LOCK_RELEASED : REC_DEMO_LOCK_NOT_OWNER);
        break;
    case LOCKS_REENTRANT:
    default: {
        lock_status ls = LOCK_ERR;

        /* A lost reply is retried on our connection, then once on a fresh
         * one, with the same request id: the release is idempotent, so the
         * retry cannot free the lock twice nor report "not owner" for our
         * own first release (or for the batch leader's). */
        if (h->unlock.done)
            ls = h->unlock.item.st;
        if (ls == LOCK_ERR) {
            if (c == NULL)
                return;
            ls = lock_release_ex(c, h->key, h->owner, g_cfg.lock_lease_ms, &h->rq, NULL);
        }
        if (ls == LOCK_ERR && c != NULL && c->err) {
            conn_redis_broken(cs);
            if ((c = conn_redis(cs)) == NULL)
                return;                          /* the lease frees it */
            ls = lock_release_ex(c, h->key, h->owner, g_cfg.lock_lease_ms, &h->rq, NULL);
        }
        if (ls == LOCK_NOT_OWNER)
            log_warn("lock %s expired during the order (lease %ld ms too short?)", h->key,
                     g_cfg.lock_lease_ms);
        break;
    }
    }
    if (c != NULL && c->err)
        conn_redis_broken(cs);
    freeReplyObject(r);
}

/* The end of every order: the lock released (if the batch's leader has not
 * already), the outcome mapped, the buyer answered, the job freed. */
static void finish(conn_set *cs, order_job *j, store_status st)
{
    /* 5. Release only now, after the commit or rollback: releasing earlier
     *    lets a second request of the same user in before the order shows. */
    give_back(cs, j->o.user_id, &j->h);

    switch (st) {
    case STORE_OK:
        vcache_mark_ordered(j->o.voucher_id, j->o.user_id, j->gen);
        break;
    case STORE_DUPLICATE:
        /* The database found the user's order. (A batch's own duplicate - the
         * same user twice in one batch - proves nothing yet: not cached.) */
        if (g_cfg.stock_strategy != STOCKS_BATCHED)
            vcache_mark_ordered(j->o.voucher_id, j->o.user_id, j->gen);
        break;
    case STORE_SOLD_OUT:
        /* The database said no stock is left: later buyers of this voucher
         * are refused from memory until a reset. */
        vcache_mark_sold_out(j->o.voucher_id, j->gen);
        break;
    case STORE_CONFLICT:
        /* Lost a compare-and-swap race: stock may remain, so no sold-out flag. */
        j->message = "the stock changed while this order was placed (cas): try again";
        break;
    case STORE_STALE_TOKEN:
        rec_note(REC_STALE_TOKEN);
        log_warn("stale fencing token %" PRId64 " for %s: write refused", j->o.fence_token,
                 j->h.key);
        j->message = "the order lock expired before the write (stale fencing token)";
        break;
    case STORE_UNAVAILABLE:
        if (j->message == NULL)
            j->message = "database unavailable, retry later";
        break;
    default:
        break;
    }
    j->reply(j->arg, order_store_error(st), j->message, j->o.order_id);
    free(j);
}

static void batch_done(conn_set *cs, void *arg, store_status st)
{
    order_job *j = arg;
    batch_unlock *u = &j->h.unlock;

    if (u->acquire && u->taken != LOCK_OK) {
        /* Nothing held, nothing to release. (A grant hidden by a lost reply
         * is left to its lease.) */
        j->h.kind = LOCKS_NONE;
        if (u->taken == LOCK_ERR)
            j->message = "redis unavailable, retry later";
    } else if (u->acquire && u->id_failed) {
        j->message = "order ids unavailable, retry later";
    }
    finish(cs, j, st);
}

/* Answers a buyer refused before anything was held. */
static void refuse(order_job *j, api_err err, const char *message)
{
    j->reply(j->arg, err, message, 0);
    free(j);
}

static order_job *job_new(int64_t voucher_id, int64_t user_id, order_reply_fn reply, void *arg)
{
    order_job *j = xcalloc(1, sizeof *j);

    j->gen = vcache_generation();
    j->reply = reply;
    j->arg = arg;
    j->o.voucher_id = voucher_id;
    j->o.user_id = user_id;
    return j;
}

/* Batched with the reentrant lock (no demo pause): the batch's leader
 * takes the lock and the id with the rest of the batch's in one round
 * trip, runs the statement, releases in one more and answers (app/batch.c). */
int order_joinable(void)
{
    return g_cfg.stock_strategy == STOCKS_BATCHED && g_cfg.lock_strategy == LOCKS_REENTRANT &&
           g_cfg.demo_pause_ms == 0;
}

/* The lock the leader will take for 'j', under the request's own owner id:
 * the thread that queued it (a worker or an event thread) moves on and may
 * queue the same user's next request in the same batch. */
static void leader_lock_init(order_job *j)
{
    held *h = &j->h;

    conn_fresh_owner(h->owner, sizeof h->owner);
    h->kind = LOCKS_REENTRANT;
    snprintf(h->key, sizeof h->key, LOCK_KEY_PREFIX "%" PRId64, j->o.user_id);
    lock_release_req_init(&h->rq);
    h->unlock = (batch_unlock){ .item = { .key = h->key, .owner = h->owner,
                                          .lease_ms = g_cfg.lock_lease_ms, .rq = &h->rq },
                                .acquire = 1 };
    j->o.fence_key = h->key;
}

int order_join(int64_t voucher_id, int64_t user_id, order_reply_fn reply, void *arg)
{
    order_job *j;

    if (!order_joinable())
        return 0;
    j = job_new(voucher_id, user_id, reply, arg);
    leader_lock_init(j);
    if (batch_join(&j->o, &j->h.unlock, batch_done, j))
        return 1;
    free(j);
    return 0;
}

void order_submit(conn_set *cs, int64_t voucher_id, int64_t user_id, order_reply_fn reply,
                  void *arg)
{
    order_job *j = job_new(voucher_id, user_id, reply, arg);
    redisContext *c;
    PGconn *pg;
    store_order *o = &j->o;
    held *h = &j->h;
    store_status st;
    idw_status is = IDW_REDIS;
    int id_taken, batched = g_cfg.stock_strategy == STOCKS_BATCHED;
    api_err err;

    if (order_joinable()) {
        /* This worker touches neither Redis nor Postgres: an outage is the
         * leader's to answer. */
        leader_lock_init(j);
        batch_submit(cs, o, &h->unlock, batch_done, j);
        return;
    }
    /* A batched order keeps its lock after this worker moves on: its own owner. */
    if (batched && g_cfg.lock_strategy != LOCKS_LOCAL)
        conn_fresh_owner(h->owner, sizeof h->owner);
    else
        snprintf(h->owner, sizeof h->owner, "%s", cs->owner);

    if ((pg = conn_pg(cs)) == NULL) {
        refuse(j, API_UNAVAILABLE, "database unavailable, retry later");
        return;
    }
    if ((c = conn_redis(cs)) == NULL) {
        refuse(j, API_UNAVAILABLE, "redis unavailable, retry later");
        return;
    }

    if (cs->orphan_lock[0] != '\0') {
        /* Not ours (LOCK_NOT_OWNER) is the usual answer: nothing was granted. */
        if (lock_release(c, cs->orphan_lock, cs->orphan_owner, g_cfg.lock_lease_ms, NULL) ==
            LOCK_OK)
            log_warn("released %s, granted after its reply was lost", cs->orphan_lock);
        if (c->err) {
            conn_redis_broken(cs);
            refuse(j, API_UNAVAILABLE, "redis unavailable, retry later");
            return;
        }
        cs->orphan_lock[0] = '\0';
    }

    /* 3. The per-user lock, one attempt: busy means a concurrent request of
     *    the same user, so this one is the duplicate. */
    err = take(cs, c, user_id, h, &id_taken, &is, &o->order_id);
    if (err != API_OK) {
        if (c->err)
            conn_redis_broken(cs);
        refuse(j, err, err == API_UNAVAILABLE ? "redis unavailable, retry later" : NULL);
        return;
    }

    if (g_cfg.demo_pause_ms > 0) {           /* a holder stalled past its lease */
        struct timespec ts = { g_cfg.demo_pause_ms / 1000,
                               (long)(g_cfg.demo_pause_ms % 1000) * 1000000L };
        nanosleep(&ts, NULL);
    }

    /* 4. The id before the transaction (no row lock held while Redis
     *    answers; the reentrant lock took it in its round trip), then the
     *    transaction. */
    if (!id_taken)
        is = idw_next(c, g_cfg.id_prefix, &o->order_id);
    if (is != IDW_OK) {
        if (is == IDW_REDIS && c->err)
            conn_redis_broken(cs);
        else if (is != IDW_REDIS)
            log_error("order id: %s", is == IDW_EXHAUSTED ? "today's counter is exhausted"
                                                          : "clock outside the id range");
        j->message = "order ids unavailable, retry later";
        finish(cs, j, STORE_UNAVAILABLE);
        return;
    }
    if (h->kind == LOCKS_REENTRANT) {          /* only this lock hands out tokens */
        o->fence_key = h->key;
        o->fence_token = h->grant.token;
    }
    if (batched && h->kind == LOCKS_REENTRANT) {
        /* Answered by the batch's leader, which also releases the lock. */
        h->unlock.item = (lock_release_item){ .key = h->key, .owner = h->owner,
                                              .lease_ms = g_cfg.lock_lease_ms, .rq = &h->rq };
        batch_submit(cs, o, &h->unlock, batch_done, j);
        return;
    }
    if (batched && h->kind != LOCKS_LOCAL) {
        batch_submit(cs, o, NULL, batch_done, j);
        return;
    }
    if (batched)
        st = batch_settle(cs, o, NULL);      /* the mutex is this thread's to unlock */
    else if (g_cfg.stock_strategy == STOCKS_OPTIMISTIC && g_cfg.demo_delay_ms == 0)
        st = gated_order_create(cs, pg, o);
    else
        st = store_order_steps(pg, o, (enum stock_strategy)g_cfg.stock_strategy,
                               g_cfg.demo_delay_ms);
    finish(cs, j, st);
}

api_err order_store_error(store_status st)
{
    switch (st) {
    case STORE_OK:
        return API_OK;
    case STORE_NOT_FOUND:
        return API_VOUCHER_NOT_FOUND;
    case STORE_SOLD_OUT:
    case STORE_CONFLICT:            /* the buyer lost; the seed notes answer sold out */
        return API_SOLD_OUT;
    case STORE_DUPLICATE:
    case STORE_STALE_TOKEN:         /* another request of this user holds or held the lock */
        return API_ALREADY_ORDERED;
    case STORE_INVALID:
        return API_INVALID_FIELD;
    case STORE_UNAVAILABLE:
    default:
        return API_UNAVAILABLE;
    }
}
