/* fence: the sweeper of tb_lock_fence. */
#include "fence.h"
#include "conn.h"
#include "log.h"
#include "rec.h"
#include "store_fence.h"
#include "util.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <string.h>
#include <time.h>
#include <libpq-fe.h>

#define FENCE_PAGE 5000               /* keys looked at per statement */
#define FENCE_PERIOD_MIN_MS 100L

static pthread_t sweeper;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv;             /* on CLOCK_MONOTONIC: a clock step cannot stall it */
static int stopping, running;         /* under mu */
static long horizon_ms;               /* set before the thread starts */
static char key_prefix[64];           /* likewise */

static int stop_requested(void)
{
    pthread_mutex_lock(&mu);
    int s = stopping;
    pthread_mutex_unlock(&mu);
    return s;
}

/* Waits 'ms' or until fence_stop; returns 1 when stopping. */
static int idle(long ms)
{
    struct timespec until;
    int s;

    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += ms / 1000;
    until.tv_nsec += (ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&mu);
    while (!stopping && pthread_cond_timedwait(&cv, &mu, &until) != ETIMEDOUT)
        ;
    s = stopping;
    pthread_mutex_unlock(&mu);
    return s;
}

/* One pass over every key. 0, or -1 when Postgres failed: the connection
 * is dropped and the next pass opens a new one. */
static int sweep_pass(PGconn **pg)
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
        rec_add(REC_FENCE_SWEPT, (uint64_t)page.deleted);
        deleted += page.deleted;
        scanned += page.scanned;
        if (page.scanned < FENCE_PAGE || stop_requested())
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

static void *sweeper_main(void *arg)
{
    PGconn *pg = NULL;
    long period = sweep_period_ms(horizon_ms);

    util_thread_name("sk-fence-sweep");
    (void)arg;
    while (!idle(period))
        sweep_pass(&pg);
    if (pg != NULL)
        PQfinish(pg);
    return NULL;
}

int fence_start(long horizon, const char *prefix)
{
    pthread_condattr_t ca;
    int rc = -1;

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
    stopping = 0;
    if (pthread_condattr_init(&ca) != 0)
        goto out;
    if (pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 && pthread_cond_init(&cv, &ca) == 0) {
        if (pthread_create(&sweeper, NULL, sweeper_main, NULL) == 0) {
            running = 1;
            rc = 0;
        } else {
            pthread_cond_destroy(&cv);
        }
    }
    pthread_condattr_destroy(&ca);
out:
    if (rc != 0)
        log_error("cannot start the fence sweeper thread");
    else
        log_info("fence: tokens older than %ld ms refused; rows older than %ld ms swept every "
                 "%ld ms", horizon, 2 * horizon, sweep_period_ms(horizon));
    return rc;
}

void fence_stop(void)
{
    if (!running)
        return;
    pthread_mutex_lock(&mu);
    stopping = 1;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
    pthread_join(sweeper, NULL);
    pthread_cond_destroy(&cv);
    running = 0;
}
