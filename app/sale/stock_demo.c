/* stock_demo: the demo ladder's stock strategies, the steps a flash sale
 * is usually walked through before the safe one. naive reads the stock, checks it in C and writes
 * the value back minus one (lost updates: it oversells); cas writes only
 * if the stock still holds the value read (correct, but under contention
 * most buyers fail). optimistic slowed by DEMO_DELAY_MS runs here too, step
 * by step, since its one statement has no gap to widen. */
#include "stock.h"
#include "config.h"
#include "store_steps.h"

static void settle_steps(conn_set *cs, PGconn *pg, stock_buyer *b, stock_done_fn done,
                         void *arg, const store_stock_step *step)
{
    done(cs, arg, store_order_steps(pg, &b->order, step, g_cfg.demo_delay_ms));
}

static const store_stock_step naive_step = {
    .read = store_stock_read,
    .write = store_stock_write_back,
    .unchanged = STORE_SOLD_OUT,
};

static void naive_settle(conn_set *cs, PGconn *pg, stock_buyer *b, stock_done_fn done, void *arg)
{
    settle_steps(cs, pg, b, done, arg, &naive_step);
}

const stock_backend stock_naive = {
    .name = "naive",
    .settle = naive_settle,
};

/* Lost a compare-and-swap race: stock may remain, so not sold out. */
static const store_stock_step cas_step = {
    .read = store_stock_read,
    .write = store_stock_cas,
    .unchanged = STORE_CONFLICT,
};

static void cas_settle(conn_set *cs, PGconn *pg, stock_buyer *b, stock_done_fn done, void *arg)
{
    settle_steps(cs, pg, b, done, arg, &cas_step);
}

const stock_backend stock_cas = {
    .name = "cas",
    .settle = cas_settle,
};

static const store_stock_step optimistic_step = {
    .write = store_stock_decrement,
    .unchanged = STORE_SOLD_OUT,
};

static void optimistic_steps_settle(conn_set *cs, PGconn *pg, stock_buyer *b,
                                    stock_done_fn done, void *arg)
{
    settle_steps(cs, pg, b, done, arg, &optimistic_step);
}

const stock_backend stock_optimistic_steps = {
    .name = "optimistic",
    .settle = optimistic_steps_settle,
};
