/* stock_demo: the demo ladder's stock strategies, the steps a flash sale
 * is usually walked through before the safe one. naive reads the stock, checks it in C and writes
 * the value back minus one (lost updates: it oversells); cas writes only
 * if the stock still holds the value read (correct, but under contention
 * most buyers fail). optimistic slowed by DEMO_DELAY_MS runs here too, step
 * by step, since its one statement has no gap to widen. */
#include "stock.h"
#include "store_steps.h"

const stock_backend stock_naive =
    STOCK_STEPS("naive", store_stock_read, store_stock_write_back, STORE_SOLD_OUT);

/* Lost a compare-and-swap race: stock may remain, so not sold out. */
const stock_backend stock_cas =
    STOCK_STEPS("cas", store_stock_read, store_stock_cas, STORE_CONFLICT);

const stock_backend stock_optimistic_steps =
    STOCK_STEPS("optimistic", NULL, store_stock_decrement, STORE_SOLD_OUT);
