/* fence: the sweeper of tb_lock_fence. */
#include "fence.h"
#include "bgthread.h"
#include "conn.h"
#include "log.h"
#include "counters.h"
#include "store_fence.h"
#include "util.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <libpq-fe.h>

#define FENCE_PAGE 5000               /* keys looked at per statement */
#define FENCE_PERIOD_MIN_MS 100L

static bgthread sweeper = BGTHREAD_INIT;
static long horizon_ms;               /* set before the thread starts */
static char key_prefix[64];           /* likewise */

/* One pass over every key. 0, or -1 when Postgres failed: the connection
 * is dropped and the next pass opens a new one. */
static int sweep_pass(bgthread *self, PGconn **pg)
{
    char err[256], after[sizeof ((store_sweep_page *)0)->last] = "";
    store_sweep_page page;
    int64_t deleted = 0, scanned = 0;

    if (*pg == NULL && (*pg = conn_pg_open(err, sizeof err)) == NULL) {
        log_warn("fence sweep: postgres unavailable: %s", err);
        return -1;
    }
    for (;;) {
        if (store_fence_sweep(*pg, horizon_ms, key_prefix, after, FENCE_PAGE, &page) != STORE_OK) {
            PQfinish(*pg);
            *pg = NULL;
            return -1;
        }
        counters_add(COUNTERS_FENCE_SWEPT, (uint64_t)page.deleted);
        deleted += page.deleted;
        scanned += page.scanned;
        if (page.scanned < FENCE_PAGE || bgthread_stopping(self))
            break;
        memcpy(after, page.last, sizeof after);
    }
    if (deleted > 0)
        log_debug("fence sweep: %" PRId64 " of %" PRId64 " rows deleted (tokens over %ld ms old)",
                  deleted, scanned, 2 * horizon_ms);
    return 0;
}

/* A pass visits every row, so its cost per second is the table's size over
 * the period: once per horizon a row lives at most three horizons and is
 * visited about three times in its life. */
static long sweep_period_ms(long horizon)
{
    return horizon < FENCE_PERIOD_MIN_MS ? FENCE_PERIOD_MIN_MS : horizon;
}

static void sweeper_main(bgthread *self, void *arg)
{
    PGconn *pg = NULL;
    long period = sweep_period_ms(horizon_ms);

    (void)arg;
    while (!bgthread_sleep(self, period))
        sweep_pass(self, &pg);
    if (pg != NULL)
        PQfinish(pg);
}

int fence_start(long horizon, const char *prefix)
{
    if (horizon <= 0) {
        log_error("fence_start: horizon %ld ms", horizon);
        return -1;
    }
    if (strlen(prefix) >= sizeof key_prefix) {
        log_error("fence_start: key prefix '%s' too long", prefix);
        return -1;
    }
    horizon_ms = horizon;
    snprintf(key_prefix, sizeof key_prefix, "%s", prefix);
    if (bgthread_start_logged(&sweeper, "sk-fence-sweep", sweeper_main, NULL, NULL,
                              "fence sweeper") != 0)
        return -1;
    log_info("fence: tokens older than %ld ms refused; rows older than %ld ms swept every "
             "%ld ms", horizon, 2 * horizon, sweep_period_ms(horizon));
    return 0;
}

void fence_stop(void)
{
    bgthread_stop(&sweeper);
}
