/* order: the sale's steps, strategy-free. */
#include "order.h"
#include "config.h"
#include "order_id.h"
#include "log.h"
#include "counters.h"
#include "stock.h"
#include "user_lock.h"
#include "util.h"
#include "voucher_cache.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* One order in flight: on the heap, since a deferred order outlives the
 * worker's call (its batch's leader finishes it). */
typedef struct order_job {
    stock_buyer buyer;        /* what the stock strategy sees */
    user_lock_hold hold;          /* the user's lock */
    uint64_t gen;             /* the voucher cache's, when the order began */
    api_err refusal;          /* refused before the database answered (API_OK: not) */
    const char *message;      /* static; NULL: the error code's default */
    order_reply_fn reply;
    void *arg;
} order_job;

int order_start(void)
{
    char err[512];
    int rc = -1;

    if (user_lock_start(g_cfg.lock_strategy, err, sizeof err) != 0)
        goto out;
    if (stock_start(g_cfg.stock_strategy, err, sizeof err) != 0) {
        user_lock_stop();
        goto out;
    }
    rc = 0;
out:
    if (rc != 0)
        log_error("lock strategy %s: %s", config_lock_name(g_cfg.lock_strategy), err);
    return rc;
}

void order_stop(void)
{
    user_lock_stop();
}

int order_joinable(void)
{
    /* A strategy that admits alone takes no lock: the lock's kind does not matter. */
    return stock_joinable() && g_cfg.demo_pause_ms == 0 &&
           (stock_alone() || (user_lock_batchable() && !user_lock_thread_bound()));
}

/* A new job with its lock, not taken. A hold that another thread releases
 * (a deferred strategy's leader) gets an owner id of its own: the worker
 * moves on, and would otherwise be the reentrant holder of the same user's
 * next request. A strategy that admits alone never takes it: no owner.
 * 'cs' may be NULL for either (an event thread). */
static order_job *job_new(conn_set *cs, int64_t voucher_id, int64_t user_id,
                          int64_t deadline_us, order_reply_fn reply, void *arg)
{
    order_job *j = xcalloc(1, sizeof *j);
    char owner[128] = "";
    int alone = stock_alone();

    if (!alone && stock_deferred() && !user_lock_thread_bound())
        conn_fresh_owner(owner, sizeof owner);
    else if (!alone)
        snprintf(owner, sizeof owner, "%s", cs->owner);
    user_lock_hold_init(&j->hold, user_id, owner);
    j->gen = voucher_cache_generation();
    j->reply = reply;
    j->arg = arg;
    j->buyer.order.voucher_id = voucher_id;
    j->buyer.order.user_id = user_id;
    j->buyer.hold = &j->hold;
    j->buyer.same_thread = user_lock_thread_bound();
    j->buyer.deadline_us = deadline_us;
    /* The write checks the grant's token, and its age when the token is a
     * clock reading; FENCING=0 (a demo of a lost lock, unsafe) lets a
     * holder whose lock was lost write anyway. */
    if (user_lock_tokens() && g_cfg.fencing) {
        j->buyer.order.fence_key = j->hold.fence_key;
        if (user_lock_token_clock())
            j->buyer.order.fence_horizon_ms = g_cfg.fence_horizon_ms;
    }
    return j;
}

static int refuse(order_job *j, api_err err, const char *message)
{
    j->refusal = err;
    j->message = message;
    return 0;
}

/* The worker's connections: Postgres for the transaction, Redis for the
 * order id (and the lock, where it lives there). NULL after refusing. */
static PGconn *reach(conn_set *cs, order_job *j)
{
    PGconn *pg = conn_pg(cs);

    if (pg == NULL)
        refuse(j, API_UNAVAILABLE, "database unavailable, retry later");
    /* With a cluster the lock and the id find their own masters. */
    else if (!conn_redis_cluster() && conn_redis(cs) == NULL)
        pg = NULL, refuse(j, API_UNAVAILABLE, "redis unavailable, retry later");
    return pg;
}

/* 3. The user's lock, one attempt: busy means a concurrent request of the
 *    same user, so this one is the duplicate. The order id comes in the same
 *    round trip where the lock lives in the ids' Redis. */
static int take_lock(conn_set *cs, order_job *j)
{
    switch (user_lock_acquire(cs, &j->hold, &j->buyer.id)) {
    case LOCK_OK:
        break;
    case LOCK_BUSY:
        return refuse(j, API_ALREADY_ORDERED, NULL);
    default:
        return refuse(j, API_UNAVAILABLE, user_lock_unavailable());
    }
    j->buyer.order.fence_token = j->hold.token;
    if (g_cfg.demo_pause_ms > 0) {           /* demo: a holder stalled past its lease */
        struct timespec ts = { g_cfg.demo_pause_ms / 1000,
                               (long)(g_cfg.demo_pause_ms % 1000) * 1000000L };
        nanosleep(&ts, NULL);
    }
    return 1;
}

/* 3. The order id, unless the lock's round trip brought it: before the
 *    transaction, so that no row lock is held while Redis answers. */
static int take_id(conn_set *cs, order_job *j)
{
    user_lock_id *id = &j->buyer.id;

    if (!id->taken) {
        id->st = order_id_take(cs, g_cfg.id_prefix, &id->value);
        id->taken = 1;
    }
    if (id->st == ORDER_ID_OK) {
        j->buyer.order.order_id = id->value;
        return 1;
    }
    if (id->st != ORDER_ID_REDIS && id->st != ORDER_ID_MOVED)
        log_error("order id: %s", id->st == ORDER_ID_EXHAUSTED ? "today's counter is exhausted"
                                                         : "clock outside the id range");
    return refuse(j, API_UNAVAILABLE, "order ids unavailable, retry later");
}

/* A batch's leader took the lock and the id: why it refused, if it did. */
static void leader_refusal(order_job *j)
{
    if (!j->buyer.lock_pending)
        return;
    if (j->hold.taken == LOCK_ERR)
        j->message = user_lock_unavailable();
    else if (j->hold.taken == LOCK_OK && (!j->buyer.id.taken || j->buyer.id.st != ORDER_ID_OK))
        j->message = "order ids unavailable, retry later";
}

/* What the database's answer tells this buyer, and the next buyers of the
 * voucher (through the voucher cache). */
static void learn(order_job *j, store_status st)
{
    const store_order *o = &j->buyer.order;

    switch (st) {
    case STORE_OK:
        voucher_cache_mark_ordered(o->voucher_id, o->user_id, j->gen);
        break;
    case STORE_DUPLICATE:
        /* The database found the user's order. (A batch's may be the same
         * user twice in one batch, which proves nothing yet; the
         * Redis-first script's is the buyers set's answer.) */
        if (!stock_deferred() || stock_alone())
            voucher_cache_mark_ordered(o->voucher_id, o->user_id, j->gen);
        break;
    case STORE_SOLD_OUT:
        /* No stock is left: later buyers of this voucher are refused from
         * memory until a reset. */
        voucher_cache_mark_sold_out(o->voucher_id, j->gen);
        break;
    case STORE_CONFLICT:
        /* Lost a compare-and-swap race: stock may remain, so no sold-out flag. */
        j->message = "the stock changed while this order was placed (cas): try again";
        break;
    case STORE_STALE_TOKEN:
        counters_note(COUNTERS_STALE_TOKEN);
        /* A clock token's age tells a paused holder (seconds) from clocks
         * apart (Redis's behind Postgres's: every write refused). */
        if (o->fence_horizon_ms > 0)
            log_warn("stale fencing token %" PRId64 " for %s: write refused (token %.3f s old "
                     "by this instance's clock, horizon %ld ms)", o->fence_token, j->hold.key,
                     (double)(util_wall_ms() * 1000 - o->fence_token) / 1e6, o->fence_horizon_ms);
        else
            log_warn("stale fencing token %" PRId64 " for %s: write refused", o->fence_token,
                     j->hold.key);
        j->message = "the order lock expired before the write (stale fencing token)";
        break;
    case STORE_UNAVAILABLE:
        if (j->buyer.late)
            j->message = API_LATE_MESSAGE;
        else if (j->message == NULL)
            j->message = "database unavailable, retry later";
        break;
    default:
        break;
    }
}

/* PG_HA: a commit is answered as done only once a synchronous standby has
 * it (store_ha_confirm: Postgres may return it without one). A deferred
 * strategy confirms its own commits: a batch's leader before answering
 * the batch, Redis-first's consumer before acknowledging its entries. */
static store_status confirmed(conn_set *cs, store_status st)
{
    if (st != STORE_OK || !g_cfg.pg_ha || stock_deferred())
        return st;
    /* On the session that committed, as it is: conn_pg's periodic check,
     * failing now (the standbys just lost), would close it and answer a
     * quick 503 for an order a standby may already have; the standbys'
     * positions say whether it does. */
    return cs->pg == NULL ? STORE_UNAVAILABLE : store_ha_confirm(cs->pg);
}

/* The end of every order, refused or settled, on whichever worker holds it
 * then. */
static void settled(conn_set *cs, void *arg, store_status st)
{
    order_job *j = arg;
    api_err err = j->refusal;

    /* 5. Release only now, after the commit or rollback: releasing earlier
     *    lets a second request of the same user in before the order shows.
     *    (A batch's leader may have released it already.) */
    user_lock_release(cs, &j->hold);
    if (err == API_OK) {
        leader_refusal(j);
        st = confirmed(cs, st);
        learn(j, st);
        err = order_store_error(st);
    }
    /* 6. The answer. */
    j->reply(j->arg, err, j->message, err == API_OK ? j->buyer.order.order_id : 0);
    free(j);
}

void order_submit(conn_set *cs, int64_t voucher_id, int64_t user_id, int64_t deadline_us,
                  order_reply_fn reply, void *arg)
{
    order_job *j = job_new(cs, voucher_id, user_id, deadline_us, reply, arg);
    PGconn *pg = NULL;

    if (stock_alone()) {
        /* Redis-first: the strategy's script is the whole admission - the
         *    one-order-per-user check included, atomically - and Postgres
         *    gets the order later: no lock, no Postgres on this path. */
        stock_settle(cs, NULL, &j->buyer, settled, j);
    } else if (order_joinable()) {
        /* 3-5 by the batch's leader, for its whole batch at once: this
         * worker touches neither Redis nor Postgres. */
        j->buyer.lock_pending = 1;
        stock_settle(cs, NULL, &j->buyer, settled, j);
    } else if ((pg = reach(cs, j)) != NULL && take_lock(cs, j) && take_id(cs, j) &&
               !stock_past_deadline(&j->buyer)) {
        /* 4. Stock and order in one transaction, the stock strategy's way;
         *    then settled(): 5. release, 6. answer. */
        stock_settle(cs, pg, &j->buyer, settled, j);
    } else {
        /* Refused on the way (j->refusal says why), or too late to start. */
        settled(cs, j, STORE_UNAVAILABLE);
    }
}

int order_join(int64_t voucher_id, int64_t user_id, int64_t deadline_us, order_reply_fn reply,
               void *arg)
{
    order_job *j;

    if (!order_joinable())
        return 0;
    j = job_new(NULL, voucher_id, user_id, deadline_us, reply, arg);
    j->buyer.lock_pending = !stock_alone();
    if (stock_join(&j->buyer, settled, j))
        return 1;
    free(j);
    return 0;
}

api_err order_store_error(store_status st)
{
    switch (st) {
    case STORE_OK:
        return API_OK;
    case STORE_NOT_FOUND:
        return API_VOUCHER_NOT_FOUND;
    case STORE_SOLD_OUT:
    case STORE_CONFLICT:            /* the buyer lost: answered as sold out */
        return API_SOLD_OUT;
    case STORE_DUPLICATE:
    case STORE_STALE_TOKEN:         /* another request of this user holds or held the lock */
        return API_ALREADY_ORDERED;
    case STORE_NOT_STARTED:
        return API_NOT_STARTED;
    case STORE_ENDED:
        return API_ENDED;
    case STORE_INVALID:
        return API_INVALID_FIELD;
    case STORE_UNAVAILABLE:
    default:
        return API_UNAVAILABLE;
    }
}
