/* store: the driver under the store modules: session set-up, bounded round
 * trips, failed results mapped to a status. */
#include "store.h"
#include "config.h"
#include "log.h"
#include "pg_wait.h"
#include "counters.h"
#include "util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

/* The voucher row locked first, by a statement of its own, in the
 * transaction of store_locked_exec: the statement behind it starts after
 * the lock was granted, so its snapshot holds whatever the row's previous
 * holder committed (store_orders_persist, store_voucher_reset). */
static const store_statement statements[] = {
    { "orders_lock", 1, "SELECT 1 FROM tb_voucher WHERE voucher_id = $1 FOR UPDATE" },
    /* PG_HA (store_ha_confirm): a WAL position ($1, or the primary's insert
     * position now when NULL), and whether a synchronous standby has
     * reported it flushed. */
    { "ha_flushed", 1,
      "SELECT l::text, EXISTS (SELECT 1 FROM pg_stat_replication WHERE flush_lsn >= l"
      "                          AND sync_state IN ('sync', 'quorum'))"
      "  FROM COALESCE($1::pg_lsn, pg_current_wal_insert_lsn()) AS l" },
};

#define NSTATEMENTS (sizeof statements / sizeof statements[0])

/*---- round trips, each with the client's own bound ----*/

/* A connection left in a state nobody can use: shut down, so that it reads
 * as CONNECTION_BAD and is re-opened by its next user. */
static void drop(PGconn *pg)
{
    if (PQsocket(pg) >= 0)
        shutdown(PQsocket(pg), SHUT_RDWR);
    PQconsumeInput(pg);
}

/* A commit waiting for its synchronous standby that is cancelled (by
 * pg_cancel_backend, or a failover tool) still returns success, with only a
 * WARNING: "canceling wait for synchronous replication ... The transaction
 * has already committed locally, but might not have been replicated to the
 * standby" (Postgres, src/backend/replication/syncrep.c). Such a commit can
 * vanish when a standby is promoted, so it is never reported as done: the
 * session that got the warning is shut down and the call fails as
 * unavailable, like a connection lost during COMMIT (the buyer's retry
 * meets the duplicate check). The warning has the generic SQLSTATE 01000
 * (its text follows lc_messages); none of our statements raises another. */
static _Thread_local const PGconn *doubted;

static void on_notice(void *arg, const PGresult *res)
{
    const char *sev = PQresultErrorField(res, PG_DIAG_SEVERITY_NONLOCALIZED);
    const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    const char *msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);

    if (sev != NULL && strcmp(sev, "WARNING") == 0 && state != NULL &&
        strcmp(state, "01000") == 0) {
        doubted = arg;
        log_warn("store: postgres warned \"%s\": the commit may not be on a standby; "
                 "answering 503", msg ? msg : "");
    } else {
        log_debug("store: postgres notice: %s", msg ? msg : "");
    }
}

/* 'res' unless the session was warned (on_notice) while it was read: then
 * NULL, and the session shut down. */
static PGresult *undoubted(PGconn *pg, PGresult *res)
{
    if (doubted != pg)
        return res;
    doubted = NULL;
    PQclear(res);
    drop(pg);
    return NULL;
}

/* statement_timeout (PG_STATEMENT_TIMEOUT_MS) ends a slow statement on the
 * server. A server that cannot answer at all - a stopped or hung process,
 * a host whose kernel still acknowledges while the database is gone - ends
 * nothing, and libpq's blocking calls would wait for it forever (TCP
 * keepalives and tcp_user_timeout, set in conn.c, only catch a peer whose
 * kernel is gone too). So every wait for an answer is bounded (pg_wait.h),
 * a second past the statement timeout: the connection is then shut down
 * and the call fails as unavailable (the statement's outcome is unknown:
 * a retry is safe, it sells or answers already_ordered). */
int store_round_trip_ms(void)
{
    return g_cfg.pg_statement_timeout_ms + STORE_SLACK_MS;
}

/* The session keeps one generic plan per statement (plan_cache_mode,
 * Postgres 12 and later) instead of planning each run: a custom plan for a
 * voucher the statistics have not seen yet (its orders all written since
 * the last ANALYZE, so "voucher_id = <it>" looks rare) read the buyer's
 * duplicate check through idx_voucher_order_voucher, every order of the
 * voucher per buyer, and Postgres chose such plans for a whole sale once
 * the generic one costed more than their average. Every statement of the
 * store modules is a lookup by key, and the probes of the batch statements
 * are written so that their generic plans probe by key
 * (tests/test_store_batch.c). */
int store_session_setup(PGconn *pg)
{
    PGresult *res;
    int ok;

    PQsetNoticeReceiver(pg, on_notice, pg);
    res = PQsendQuery(pg, "SET plan_cache_mode = force_generic_plan")
              ? pg_wait_collect(pg, store_round_trip_ms())
              : NULL;
    ok = PQresultStatus(res) == PGRES_COMMAND_OK;
    if (!ok)
        log_error("store: plan_cache_mode: %s", PQerrorMessage(pg));
    PQclear(res);
    if (!ok || (g_cfg.pg_ha && store_ha_check(pg) != 0))
        return -1;
    return store_statements_prepare(pg, statements, NSTATEMENTS);
}

/*---- PG_HA: sessions whose commits wait for a standby ----*/

static pthread_mutex_t ha_mu = PTHREAD_MUTEX_INITIALIZER;
static char ha_why[256];    /* the last check's refusal; empty: none */

static void ha_note(const char *why)
{
    int changed;

    pthread_mutex_lock(&ha_mu);
    changed = strcmp(ha_why, why) != 0;
    snprintf(ha_why, sizeof ha_why, "%s", why);
    pthread_mutex_unlock(&ha_mu);
    if (changed && why[0] != '\0')
        log_error("store: PG_HA=1 and %s: no order is taken on this session", why);
    else if (changed)
        log_info("store: PG_HA=1: the primary's commits wait for a standby again");
}

/* A commit is acknowledged by a standby only when the session's
 * synchronous_commit is on (or remote_apply) and the primary names a
 * synchronous standby: pg_auto_failover empties synchronous_standby_names
 * when no standby can follow (a new primary before its standbys rejoin,
 * the state it calls wait_primary), and its commits then return at once. */
int store_ha_check(PGconn *pg)
{
    /* A standby that streams as synchronous: a primary that was replaced
     * while its pg_autoctl was gone runs on, writable, with nobody following
     * it, and its commits would wait forever. Without pg_read_all_stats the
     * role sees the rows but not their state and positions, which
     * store_ha_confirm reads: refused. */
    PGresult *res = store_timed_exec(
        pg, "SELECT current_setting('synchronous_commit'),"
            "       current_setting('synchronous_standby_names'), pg_is_in_recovery(),"
            "       (SELECT count(*) FROM pg_stat_replication"
            "         WHERE sync_state IN ('sync', 'quorum')),"
            "       (SELECT count(*) FROM pg_stat_replication WHERE state IS NULL)");
    char why[256] = "";
    const char *sc;
    int rc = -1;

    if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
        snprintf(why, sizeof why, "its settings cannot be read");
        goto out;
    }
    sc = PQgetvalue(res, 0, 0);
    if (strcmp(PQgetvalue(res, 0, 4), "0") != 0)
        snprintf(why, sizeof why,
                 "this role cannot read the standbys' positions in pg_stat_replication, which "
                 "confirm each commit (GRANT pg_read_all_stats TO the role)");
    else if (PQgetvalue(res, 0, 2)[0] == 't')
        snprintf(why, sizeof why, "the server is a standby (read-only)");
    else if (strcmp(sc, "on") != 0 && strcmp(sc, "remote_apply") != 0)
        snprintf(why, sizeof why,
                 "synchronous_commit is '%.32s' for this role: a commit would not wait for a "
                 "standby (ALTER ROLE ... SET synchronous_commit = on)", sc);
    else if (PQgetvalue(res, 0, 1)[0] == '\0')
        snprintf(why, sizeof why,
                 "the primary has no synchronous standby (synchronous_standby_names is empty: "
                 "a standby has yet to rejoin after a failover, or none is up)");
    else if (strcmp(PQgetvalue(res, 0, 3), "0") == 0)
        snprintf(why, sizeof why,
                 "no synchronous standby streams from this primary (it may have been replaced)");
    else
        rc = 0;
out:
    PQclear(res);
    ha_note(why);
    return rc;
}

/* A commit waits for a standby only once the checkpointer has applied the
 * standby list (WalSndCtl->sync_standbys_defined, set by
 * SyncRepUpdateSyncStandbysDefined, "called by checkpointer", in Postgres's
 * src/backend/replication/syncrep.c); until then SHOW and
 * pg_stat_replication already name the standbys, store_ha_check passes,
 * and commits return with no standby. So the commit is confirmed here,
 * after it returned: the insert position read now is past its commit
 * record, and a synchronous standby that reports that position flushed
 * has the commit. Polled (1 ms apart) while the standby catches up, for at
 * most PG_STATEMENT_TIMEOUT_MS. */
store_status store_ha_confirm(PGconn *pg)
{
    int64_t until = util_mono_us() + (int64_t)g_cfg.pg_statement_timeout_ms * 1000;
    char lsn[32];
    const char *vals[1] = { NULL };         /* the first round reads the position */
    PGresult *res = NULL;
    store_status st;

    for (;;) {
        struct timespec ms = { 0, 1000000L };

        PQclear(res);
        res = store_exec(pg, "ha_flushed", 1, vals);
        if ((st = store_rows(pg, res, "ha_flushed", STORE_UNAVAILABLE)) != STORE_OK)
            goto out;
        if (vals[0] == NULL) {
            snprintf(lsn, sizeof lsn, "%s", PQgetvalue(res, 0, 0));
            vals[0] = lsn;
        }
        if (PQgetvalue(res, 0, 1)[0] == 't')
            goto out;
        st = STORE_UNAVAILABLE;
        if (util_mono_us() >= until) {
            log_warn("store: no synchronous standby reported WAL position %s flushed within "
                     "%d ms: the commit before it may be on the primary only; answering 503",
                     lsn, g_cfg.pg_statement_timeout_ms);
            goto out;
        }
        nanosleep(&ms, NULL);
    }
out:
    PQclear(res);
    return st;
}

int store_ha_refusal(char *buf, size_t n)
{
    int refused;

    pthread_mutex_lock(&ha_mu);
    refused = ha_why[0] != '\0';
    snprintf(buf, n, "%s", ha_why);
    pthread_mutex_unlock(&ha_mu);
    return refused;
}

int store_statements_prepare(PGconn *pg, const store_statement *set, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        PGresult *res = PQsendPrepare(pg, set[i].name, set[i].sql, set[i].nparams, NULL)
                            ? pg_wait_collect(pg, store_round_trip_ms())
                            : NULL;
        int ok = res != NULL && PQresultStatus(res) == PGRES_COMMAND_OK;
        if (!ok)
            log_error("store: prepare %s: %s", set[i].name, PQerrorMessage(pg));
        PQclear(res);
        if (!ok)
            return -1;
    }
    return 0;
}

int store_id_taken(const PGresult *res)
{
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    const char *constraint = res ? PQresultErrorField(res, PG_DIAG_CONSTRAINT_NAME) : NULL;

    return state != NULL && constraint != NULL && strcmp(state, "23505") == 0 &&
           strcmp(constraint, "tb_voucher_order_pkey") == 0;
}

/* Constraint violations are answers about the data; everything else (lost
 * connection, timeout, server shutting down, a bug in our SQL) is 503,
 * logged without leaking details to clients. */
store_status store_result_error(PGconn *pg, PGresult *res, const char *what)
{
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;

    /* A server that is no longer the primary (a demoted one answers
     * read-only) or is shutting down: the session is dropped, and the next
     * one goes through the DSN's hosts to the primary (with
     * target_session_attrs=read-write). */
    if (state != NULL && pg != NULL &&
        (strcmp(state, "25006") == 0 || strncmp(state, "57P", 3) == 0)) {
        log_warn("store: %s: the server is not the primary or is stopping (sqlstate %s); "
                 "reconnecting", what, state);
        drop(pg);
        return STORE_UNAVAILABLE;
    }
    if (state != NULL) {
        /* The order id is taken: Redis's id counter went back (a failover
         * to a replica that missed the last increments, or a restart), and
         * this second's count was handed out before. Nothing was written;
         * the buyer may try again (ids carry the second, so at the latest
         * the next second's ids are free). Not "already ordered": it is
         * someone else's order. */
        if (store_id_taken(res)) {
            log_warn("store: %s: order id already taken (Redis's id counter went back: a "
                     "failover or restart lost increments); answering 503", what);
            return STORE_UNAVAILABLE;
        }
        if (strcmp(state, "23505") == 0)       /* unique_violation */
            return STORE_DUPLICATE;
        if (strcmp(state, "23503") == 0)       /* foreign_key_violation */
            return STORE_NOT_FOUND;
        if (strcmp(state, "23514") == 0 || strcmp(state, "22008") == 0 ||
            strcmp(state, "22003") == 0)       /* check, datetime or numeric range */
            return STORE_INVALID;
    }
    log_warn("store: %s failed (sqlstate %s): %s", what, state ? state : "none",
             PQerrorMessage(pg));
    return STORE_UNAVAILABLE;
}

store_status store_rows(PGconn *pg, PGresult *res, const char *what, store_status none)
{
    if (PQresultStatus(res) != PGRES_TUPLES_OK)
        return store_result_error(pg, res, what);
    return PQntuples(res) > 0 ? STORE_OK : none;
}

/* Every call goes through here or store_timed_exec, for the backend
 * metrics (pipelined calls count their round trip themselves). */
static PGresult *observed(PGconn *pg, PGresult *res, int64_t t0)
{
    res = undoubted(pg, res);
    counters_backend(COUNTERS_PG, util_mono_us() - t0, res != NULL && PQstatus(pg) == CONNECTION_OK);
    return res;
}

PGresult *store_exec(PGconn *pg, const char *name, int n, const char *const *vals)
{
    int64_t t0 = util_mono_us();
    PGresult *res = PQsendQueryPrepared(pg, name, n, vals, NULL, NULL, 0)
                        ? pg_wait_collect(pg, store_round_trip_ms())
                        : NULL;
    return observed(pg, res, t0);
}

PGresult *store_timed_exec(PGconn *pg, const char *sql)
{
    int64_t t0 = util_mono_us();
    return observed(pg, PQsendQuery(pg, sql) ? pg_wait_collect(pg, store_round_trip_ms()) : NULL,
                    t0);
}

int64_t store_get_i64(const PGresult *res, int row, int col)
{
    return strtoll(PQgetvalue(res, row, col), NULL, 10);
}

store_status store_ping(PGconn *pg)
{
    PGresult *res = store_timed_exec(pg, "SELECT 1");
    store_status st = PQresultStatus(res) == PGRES_TUPLES_OK
                          ? STORE_OK
                          : store_result_error(pg, res, "ping");
    PQclear(res);
    return st;
}

store_status store_simple(PGconn *pg, const char *sql)
{
    PGresult *res = store_timed_exec(pg, sql);
    store_status st = PQresultStatus(res) == PGRES_COMMAND_OK
                          ? STORE_OK
                          : store_result_error(pg, res, sql);
    PQclear(res);
    return st;
}

/*---- pipeline mode ----*/

/* A segment is one implicit transaction whose COMMIT runs at the Sync: a
 * statement can succeed and its commit still fail (a deferred constraint,
 * a serialization failure, the server shutting down), and that error comes
 * as a result of its own after the statement's; a failed statement skips
 * the rest (PGRES_PIPELINE_ABORTED). Two NULLs in a row mean the
 * connection has nothing more to give (it broke). */
PGresult *store_segment_read_until(PGconn *pg, int64_t until_us, int *synced)
{
    PGresult *kept = NULL, *r;
    int nulls = 0;

    *synced = 0;
    while (nulls < 2) {
        if (pg_wait_input(pg, until_us) != 0)
            break;
        if ((r = PQgetResult(pg)) == NULL) {
            nulls++;
            continue;
        }
        nulls = 0;
        if (PQresultStatus(r) == PGRES_PIPELINE_SYNC) {
            PQclear(r);
            *synced = 1;
            break;
        }
        if (kept != NULL && PQresultStatus(kept) == PGRES_FATAL_ERROR) {
            PQclear(r);
        } else {
            PQclear(kept);
            kept = r;
        }
    }
    if (doubted == pg) {
        *synced = 0;
        kept = undoubted(pg, kept);
    }
    return kept;
}

PGresult *store_segment_read(PGconn *pg, int *synced)
{
    return store_segment_read_until(pg, util_mono_us() + (int64_t)store_round_trip_ms() * 1000,
                                    synced);
}

int store_leave_pipeline(PGconn *pg)
{
    if (PQpipelineStatus(pg) == PQ_PIPELINE_OFF || PQexitPipelineMode(pg))
        return 0;
    log_warn("store: cannot leave pipeline mode: %s", PQerrorMessage(pg));
    drop(pg);
    return -1;
}

store_status store_locked_exec(PGconn *pg, const char *name, int n, const char *const *vals,
                               PGresult **res)
{
    char what[96];
    store_status st;
    int synced = 0;
    int64_t t0 = util_mono_us();

    *res = NULL;
    /* orders_lock, then the statement: one transaction, one round trip. */
    if (!PQenterPipelineMode(pg)) {
        snprintf(what, sizeof what, "%s (pipeline)", name);
        st = store_result_error(pg, NULL, what);
        goto out;
    }
    if (PQsendQueryPrepared(pg, "orders_lock", 1, vals, NULL, NULL, 0) &&
        PQsendQueryPrepared(pg, name, n, vals, NULL, NULL, 0) && PQpipelineSync(pg))
        *res = store_segment_read(pg, &synced);
    counters_backend(COUNTERS_PG, util_mono_us() - t0, synced);
    if (store_leave_pipeline(pg) != 0 || !synced || PQresultStatus(*res) != PGRES_TUPLES_OK)
        st = store_result_error(pg, *res, name);
    else
        st = STORE_OK;
out:
    return st;
}
