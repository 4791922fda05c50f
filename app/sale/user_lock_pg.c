/* user_lock_pg: the "pg-table" and "pg-advisory" strategies, per-user locks in
 * Postgres (pg_lock.h), on the worker's own Postgres session (cs->pg, the one
 * its order transaction runs on; the caller has just checked it).
 *
 * pg-table: a row of tb_lock with an owner, a hold count, an expiry (the
 * lease; in watchdog mode WATCHDOG_TIMEOUT_MS, not renewed) and a token
 * from a sequence. The statement commits on its own, before the order's
 * transaction: the lock outlives a failed transaction and a dropped
 * connection, until its release or its expiry. LOCK_PG_SWEEP_MS > 0 adds a
 * thread that deletes expired rows (tidiness only: the next acquire takes
 * an expired row over anyway).
 *
 * pg-advisory: pg_try_advisory_lock(user id) on the worker's session, so
 * the lock is the session's: released by the same worker after the commit
 * ('thread_bound'), and freed by the server when that connection drops.
 * The order's transaction runs on the same session, so it cannot commit
 * once the lock is gone (a dropped session rolls its transaction back):
 * the lock needs no fencing token. Its cost is the other side of that:
 * no expiry, so a hung holder whose connection stays open keeps the lock,
 * and each holder pins a database connection. The key is the user id
 * itself (a bigint advisory key: no two users share one; the key space is
 * shared with anything else that takes bigint advisory locks in this
 * database). */
#include "user_lock.h"
#include "bgthread.h"
#include "config.h"
#include "log.h"
#include "pg_lock.h"
#include "counters.h"
#include "store.h"
#include "util.h"

#include <stdio.h>
#include <string.h>

#define UNAVAILABLE "database unavailable, retry later"

static void broken_if_bad(conn_set *cs)
{
    if (cs->pg != NULL && PQstatus(cs->pg) == CONNECTION_BAD)
        conn_pg_broken(cs);
}

/*---- pg-table ----*/

/* No watchdog renews a row: watchdog mode gets its lease once. */
static long table_lease_ms(const user_lock_hold *h)
{
    return h->lease_ms > 0 ? h->lease_ms : g_cfg.watchdog_timeout_ms;
}

static bgthread sweeper = BGTHREAD_INIT;

static void sweep_main(bgthread *self, void *arg)
{
    PGconn *pg = NULL;
    char err[256];

    (void)arg;
    while (!bgthread_sleep(self, g_cfg.lock_pg_sweep_ms)) {
        if (pg == NULL && (pg = conn_pg_open(err, sizeof err)) == NULL)
            log_warn("lock sweeper: %s", err);
        if (pg != NULL) {
            long n = pg_lock_table_sweep(pg, store_round_trip_ms());
            if (n > 0)
                log_info("lock sweeper: %ld expired lock row(s) deleted", n);
            if (n < 0 && PQstatus(pg) == CONNECTION_BAD) {
                PQfinish(pg);
                pg = NULL;
            }
        }
    }
    if (pg != NULL)
        PQfinish(pg);
}

static int table_start(char *err, size_t errlen)
{
    if (g_cfg.lock_pg_sweep_ms <= 0)
        return 0;
    if (bgthread_start(&sweeper, "sk-pglock-sweep", sweep_main, NULL, NULL) != 0) {
        snprintf(err, errlen, "cannot start the lock sweeper thread");
        return -1;
    }
    return 0;
}

static void table_stop(void)
{
    bgthread_stop(&sweeper);
}

/* An attempt's outcome, counted; a failed one marks a broken session. */
static lock_status acquire_outcome(conn_set *cs, lock_status st)
{
    st = counters_lock_attempt(st);
    if (st == LOCK_ERR)
        broken_if_bad(cs);
    return st;
}

static lock_status table_acquire(conn_set *cs, user_lock_hold *h, user_lock_id *id)
{
    (void)id;
    return acquire_outcome(cs, pg_lock_table_acquire(cs->pg, store_round_trip_ms(), h->key, h->owner,
                                                 table_lease_ms(h), &h->token, NULL));
}

/* On the worker's session, or a new one when it broke meanwhile; a row
 * that cannot be deleted now expires by itself. */
static void table_release(conn_set *cs, user_lock_hold *h)
{
    PGconn *pg = conn_pg(cs);
    lock_status st;

    if (pg == NULL) {
        log_warn("lock %s not released (database unreachable): it expires by itself", h->key);
        return;
    }
    st = pg_lock_table_release(pg, store_round_trip_ms(), h->key, h->owner, table_lease_ms(h),
                           NULL);
    if (st == LOCK_OK) {
        counters_note(COUNTERS_DEMO_LOCK_RELEASED);
    } else if (st == LOCK_NOT_OWNER) {
        counters_note(COUNTERS_DEMO_LOCK_NOT_OWNER);
        log_warn("lock %s expired during the order (lease %ld ms too short?)", h->key,
                 table_lease_ms(h));
    } else {
        broken_if_bad(cs);
        log_warn("lock %s not released (database error): it expires by itself", h->key);
    }
}

const user_lock_backend user_lock_pg_table = {
    .name = "pg-table",
    .tokens = 1,
    .unavailable = UNAVAILABLE,
    .fence_prefix = "pg:",
    .start = table_start,
    .stop = table_stop,
    .acquire = table_acquire,
    .release = table_release,
};

/*---- pg-advisory ----*/

/* What a hold keeps: the backend (server process) of the session that
 * took it, to release on that session only. */
typedef struct adv_priv {
    int backend_pid;
} adv_priv;

_Static_assert(sizeof(adv_priv) <= USER_LOCK_PRIV_BYTES, "user_lock_hold.priv too small");

static lock_status adv_acquire(conn_set *cs, user_lock_hold *h, user_lock_id *id)
{
    adv_priv *p = (adv_priv *)(void *)h->priv;

    (void)id;
    p->backend_pid = PQbackendPID(cs->pg);
    return acquire_outcome(cs, pg_lock_advisory_try(cs->pg, store_round_trip_ms(), h->user_id));
}

/* The session that took it, or nothing: once that session has ended, the
 * server has freed the lock already. */
static void adv_release(conn_set *cs, user_lock_hold *h)
{
    adv_priv *p = (adv_priv *)(void *)h->priv;
    lock_status st;

    if (cs->pg == NULL || PQstatus(cs->pg) != CONNECTION_OK ||
        PQbackendPID(cs->pg) != p->backend_pid) {
        log_warn("lock %s: its session ended, which released it", h->key);
        return;
    }
    st = pg_lock_advisory_release(cs->pg, store_round_trip_ms(), h->user_id);
    if (st == LOCK_OK) {
        counters_note(COUNTERS_DEMO_LOCK_RELEASED);
    } else if (st == LOCK_NOT_OWNER) {
        counters_note(COUNTERS_DEMO_LOCK_NOT_OWNER);
        log_warn("lock %s was not held by this session", h->key);
    } else {
        /* A session that cannot run the unlock must not live on holding it. */
        log_warn("lock %s: unlock failed: closing the session frees it", h->key);
        conn_pg_broken(cs);
    }
}

const user_lock_backend user_lock_pg_advisory = {
    .name = "pg-advisory",
    .thread_bound = 1,
    .unavailable = UNAVAILABLE,
    .acquire = adv_acquire,
    .release = adv_release,
};
