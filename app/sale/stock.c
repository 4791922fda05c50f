/* stock: the strategy table, and the two safe one-by-one strategies. */
#include "stock.h"
#include "config.h"
#include "store_order.h"
#include "store_steps.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

/* Indexed by enum stock_strategy. */
static const stock_backend *const backends[] = {
    [STOCKS_NAIVE] = &stock_naive,
    [STOCKS_CAS] = &stock_cas,
    [STOCKS_OPTIMISTIC] = &stock_optimistic,
    [STOCKS_PESSIMISTIC] = &stock_pessimistic,
    [STOCKS_BATCHED] = &stock_batched,
    [STOCKS_REDIS] = &stock_redis_first,
};
#define NBACKENDS (sizeof backends / sizeof backends[0])

/* Set by stock_start before any thread serves; read-only after. */
static const stock_backend *be = &stock_optimistic;

int stock_start(int strategy, char *err, size_t errlen)
{
    if (strategy < 0 || (size_t)strategy >= NBACKENDS || backends[strategy] == NULL) {
        snprintf(err, errlen, "unknown stock strategy %d", strategy);
        return -1;
    }
    be = backends[strategy];
    /* The one-statement order has no gap to widen: slowed, it runs step by step. */
    if (be == &stock_optimistic && g_cfg.demo_delay_ms > 0)
        be = &stock_optimistic_steps;
    return be->start != NULL ? be->start(err, errlen) : 0;
}

int stock_alone(void)
{
    return be->alone;
}

int stock_keeps_vouchers(void)
{
    return be->load != NULL;
}

int stock_voucher_loaded(conn_set *cs, const store_voucher *v)
{
    return be->load != NULL ? be->load(cs, v) : 0;
}

store_status stock_voucher_get(conn_set *cs, int64_t voucher_id, store_voucher *out)
{
    return be->voucher != NULL ? be->voucher(cs, voucher_id, out) : STORE_NOT_FOUND;
}

int stock_stats(conn_set *cs, cJSON *root, cJSON *vouchers)
{
    return be->stats != NULL ? be->stats(cs, root, vouchers) : 0;
}

int stock_deferred(void)
{
    return be->deferred;
}

int stock_joinable(void)
{
    return be->join != NULL && (be->joinable == NULL || be->joinable());
}

void stock_settle(conn_set *cs, PGconn *pg, stock_buyer *b, stock_done_fn done, void *arg)
{
    if (be->settle != NULL)
        be->settle(cs, pg, b, done, arg);
    else
        done(cs, arg, store_order_steps(pg, &b->order, &be->step, g_cfg.demo_delay_ms));
}

int stock_join(stock_buyer *b, stock_done_fn done, void *arg)
{
    return be->join != NULL && be->join(b, done, arg);
}

/*---- optimistic: the whole order in one statement ----*/

/* One order statement per voucher in flight from this instance: the others
 * wait on a mutex here rather than in Postgres's row-lock queue, where each
 * waiter costs the database a backend wake-up and a lock-manager round on
 * every commit. Postgres then sees one contender per instance; the rate of
 * the hot row is the same, its CPU cost per order much lower.
 * Not in an unsafe configuration (config_unsafe: a lock that can fail, a
 * demo): one statement at a time would stand in for the user's lock on
 * one instance and hide the race that configuration is run to show. */
#define GATE_STRIPES 64
static pthread_mutex_t gates[GATE_STRIPES];
static pthread_once_t gates_once = PTHREAD_ONCE_INIT;

static void gates_init(void)
{
    for (int i = 0; i < GATE_STRIPES; i++)
        pthread_mutex_init(&gates[i], NULL);
}

/* A buyer may wait at the gate behind a statement that Postgres holds up:
 * its deadline is checked once through it. */
static store_status gated_order_create(conn_set *cs, PGconn *pg, stock_buyer *b)
{
    const store_order *o = &b->order;
    pthread_mutex_t *g;
    store_early e;
    store_status st;

    if (config_unsafe())
        return store_order_create(pg, o);
    pthread_once(&gates_once, gates_init);
    g = &gates[(uint64_t)o->voucher_id % GATE_STRIPES];
    pthread_mutex_lock(g);
    if (stock_past_deadline(b)) {
        pthread_mutex_unlock(g);
        return STORE_UNAVAILABLE;
    }
    if (!g_cfg.early_lock_release) {
        st = store_order_create(pg, o);
        pthread_mutex_unlock(g);
        return st;
    }
    /* Early release: the gate covers the order's commit only; the wait for
     * its flush, sent in the same round trip, runs outside it, so the next
     * buyer's statement overlaps this one's fsync. */
    st = store_order_send_early(pg, o, &e);
    pthread_mutex_unlock(g);
    st = store_order_finish_early(pg, &e, st);
    if (PQpipelineStatus(pg) != PQ_PIPELINE_OFF)
        conn_pg_broken(cs);
    return st;
}

static void optimistic_settle(conn_set *cs, PGconn *pg, stock_buyer *b, stock_done_fn done,
                              void *arg)
{
    done(cs, arg, gated_order_create(cs, pg, b));
}

const stock_backend stock_optimistic = {
    .name = "optimistic",
    .settle = optimistic_settle,
};

/*---- pessimistic: the row locked by the read, then the deduction ----*/

const stock_backend stock_pessimistic =
    STOCK_STEPS("pessimistic", store_stock_read_locked, store_stock_decrement, STORE_SOLD_OUT);
