/* store: the driver under the store modules (store_*.c, which hold what the
 * service asks Postgres, as prepared statements): a session's set-up,
 * round trips bounded in time and counted as backend calls, failed results
 * mapped to a status, and the status and order that they all share. Every
 * call runs on the caller's (per-thread) connection, in one round trip. */
#ifndef SECKILL_STORE_H
#define SECKILL_STORE_H

#include <stddef.h>
#include <stdint.h>
#include <libpq-fe.h>


typedef enum store_status {
    STORE_OK = 0,
    STORE_NOT_FOUND,      /* no such voucher */
    STORE_SOLD_OUT,       /* stock > 0 matched no row */
    STORE_DUPLICATE,      /* this user already has an order for this voucher */
    STORE_INVALID,        /* a constraint refused the values (e.g. end before begin) */
    STORE_STALE_TOKEN,    /* a newer lock holder already wrote: this holder's lease is gone */
    STORE_CONFLICT,       /* cas: the stock changed since it was read (not sold out) */
    STORE_NOT_STARTED,    /* the order's transaction ran before the sale window, */
    STORE_ENDED,          /* ... or after it (by Postgres's clock) */
    STORE_STALE_SALE,     /* Redis-first: the orders' sale was ended by a reset */
    STORE_UNAVAILABLE     /* connection lost, timed out or refused: answer 503 */
} store_status;

/* One buyer's order, as the order statements write it (store_order.h,
 * store_steps.h, store_batch.h). */
typedef struct store_order {
    int64_t order_id;
    int64_t voucher_id;
    int64_t user_id;
    const char *fence_key;    /* lock key whose token guards the write; NULL: none */
    int64_t fence_token;
    /* Tokens older than this (ms, by Postgres's clock; they are
     * microseconds of the lock service's clock) are refused as stale;
     * 0: no horizon (tokens that are not clock readings). */
    long fence_horizon_ms;
} store_order;

/* Every call waits for Postgres at most store_round_trip_ms() per round
 * trip (PG_STATEMENT_TIMEOUT_MS + STORE_SLACK_MS): a server that stopped
 * answering is given up, its connection shut down (CONNECTION_BAD: the
 * caller re-opens it) and the call fails as STORE_UNAVAILABLE. */
#define STORE_SLACK_MS 1000
int store_round_trip_ms(void);

/* PG_HA: 0 when the session's commits wait for a synchronous standby
 * (synchronous_commit on or remote_apply, synchronous_standby_names set,
 * not in recovery); else -1, the reason logged and kept for
 * store_ha_refusal. Run on every new session when PG_HA is set. */
int store_ha_check(PGconn *pg);

/* PG_HA: STORE_OK once a synchronous standby has every commit made on this
 * primary before the call (by any session), STORE_UNAVAILABLE when none
 * reports it within PG_STATEMENT_TIMEOUT_MS or the call fails. Run after a
 * commit reported success, before it is answered as done: a commit can
 * return without a standby while the checks of store_ha_check pass. Needs
 * the positions of pg_stat_replication (superuser or pg_read_all_stats). */
store_status store_ha_confirm(PGconn *pg);

/* 1 and the reason in 'buf' when the last store_ha_check refused; else 0. */
int store_ha_refusal(char *buf, size_t n);

/* SELECT 1 (readiness). */
store_status store_ping(PGconn *pg);

/*---- for the store modules ----*/

/* The voucher's sale window by Postgres's clock, at the start of the
 * statement (after any wait for the fence row): begin_time <= now <=
 * end_time, as the instance checks it. SQL text for the order statements. */
#define STORE_SALE_EARLY "(begin_time > statement_timestamp())"
#define STORE_SALE_LATE "(end_time < statement_timestamp())"
#define STORE_SALE_OPEN \
    "begin_time <= statement_timestamp() AND statement_timestamp() <= end_time"

/* A prepared statement: its name, its number of parameters, its text. */
typedef struct store_statement {
    const char *name;
    int nparams;
    const char *sql;
} store_statement;

/* Sets a fresh session up: generic plans for its statements
 * (plan_cache_mode = force_generic_plan), and the driver's own statement
 * (orders_lock, for store_locked_exec). Returns 0 or -1 (logged). */
int store_session_setup(PGconn *pg);

/* Prepares the 'n' statements of 'set' on the session. Returns 0, or -1
 * (logged) at the first that fails. */
int store_statements_prepare(PGconn *pg, const store_statement *set, size_t n);

/* Runs prepared statement 'name' with 'n' text parameters (NULL: SQL
 * NULL). The result or NULL (connection failed or timed out); caller
 * clears it. */
PGresult *store_exec(PGconn *pg, const char *name, int n, const char *const *vals);

/* Runs 'sql' (no parameters) with the same bound; as store_exec. */
PGresult *store_timed_exec(PGconn *pg, const char *sql);

/* Runs a command outside the prepared set (BEGIN, COMMIT, ROLLBACK):
 * STORE_OK when it completed, else the mapped failure. */
store_status store_simple(PGconn *pg, const char *sql);

/* Maps a failed result ('res' may be NULL) to a status, logging what is
 * not an answer about the data ('what' names the statement). */
store_status store_result_error(PGconn *pg, PGresult *res, const char *what);

/* The result 'res' (may be NULL) of statement 'what' that returns rows:
 * STORE_OK when it returned one or more, 'none' when it returned none
 * (STORE_OK where none is an answer too), else store_result_error's
 * status. The caller still clears 'res'. */
store_status store_rows(PGconn *pg, PGresult *res, const char *what, store_status none);

/* 1 when 'res' (may be NULL) failed because an order id is taken (the
 * order table's primary key). */
int store_id_taken(const PGresult *res);

/* A column of a result as a 64-bit integer. */
int64_t store_get_i64(const PGresult *res, int row, int col);

/* Pipeline mode: reads every result of one segment (its statements and its
 * Sync) until 'until_us' (util_mono_us()); returns the first error among
 * them, else the last result (caller clears; NULL when none came), and sets
 * '*synced' when the Sync was reached. store_segment_read waits one round
 * trip's bound from now. */
PGresult *store_segment_read_until(PGconn *pg, int64_t until_us, int *synced);
PGresult *store_segment_read(PGconn *pg, int *synced);

/* Leaves pipeline mode once every segment was read. 0, or -1 having shut
 * down a connection that could not (CONNECTION_BAD: re-opened by its next
 * user). */
int store_leave_pipeline(PGconn *pg);

/* The row of voucher 'vals[0]' locked by a statement of its own
 * (orders_lock: SELECT ... FOR UPDATE), then prepared statement 'name'
 * with 'vals': one transaction, one round trip (pipelined). The
 * statement's snapshot is taken after the lock was granted, so it sees
 * everything committed by the row's previous holder. STORE_OK when the
 * statement returned rows (PGRES_TUPLES_OK, in '*res'), else the failure
 * as store_result_error maps it, '*res' the failed result or NULL. The
 * caller clears '*res' in both cases. */
store_status store_locked_exec(PGconn *pg, const char *name, int n, const char *const *vals,
                               PGresult **res);

#endif
