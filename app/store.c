/* store: Postgres access through prepared statements. */
#include "store.h"
#include "config.h"
#include "log.h"
#include "pgwait.h"
#include "rec.h"
#include "util.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

typedef struct statement {
    const char *name;
    int nparams;
    const char *sql;
} statement;

/* The voucher's sale window by Postgres's clock, at the start of the
 * statement (after any wait for the fence row): begin_time <= now <=
 * end_time, as the instance checks it. */
#define SALE_EARLY "(begin_time > statement_timestamp())"
#define SALE_LATE "(end_time < statement_timestamp())"
#define SALE_OPEN "begin_time <= statement_timestamp() AND statement_timestamp() <= end_time"

/* Fencing tokens are microseconds of the lock service's clock
 * (lua/lock_acquire.lua). A token is fresh while the fence horizon (ms; 0:
 * none) has not passed since, by Postgres's clock; an older one is refused
 * like a stale one, so that a row the sweep forgot (fence_sweep: older
 * than two horizons) cannot let its stale holder in. */
#define NOW_US "(extract(epoch FROM statement_timestamp()) * 1000000)::bigint"
#define TOKEN_FRESH(token, horizon) \
    "(" horizon " = 0 OR " token " >= " NOW_US " - " horizon " * 1000)"

/* One statement per operation keeps each call to one round trip. */
static const statement statements[] = {
    { "voucher_get", 1,
      "SELECT voucher_id, title, stock, initial_stock,"
      "       extract(epoch FROM begin_time)::bigint, extract(epoch FROM end_time)::bigint,"
      "       sale_gen"
      "  FROM tb_voucher WHERE voucher_id = $1" },

    /* The order, after fence_advance in the same transaction (one round
     * trip, store_order_create): the duplicate check, the deduction and the
     * insert. A statement reads what was committed when it started, so the
     * fence row is locked by a statement of its own first: this one starts
     * after the lock was granted, hence after whoever held it before (an
     * older holder of the same user's lock) committed, and its duplicate
     * check sees that holder's order. The fence row moves only forward;
     * "fence" holds when it carries this holder's token, i.e. no newer
     * holder wrote before us (stale: nothing is written). The row lock
     * taken by the UPDATE is held only until this transaction's commit.
     * The sale window is checked here too, by Postgres's clock when the
     * statement starts (SALE_OPEN; "sale" says which side it missed): the
     * instance's own check reads its clock, in whole seconds, against a
     * voucher cached for up to a second, before the buyer waited in a
     * queue. */
    { "order_create", 6,
      "WITH fence AS ("
      "    SELECT 1 FROM tb_lock_fence WHERE lock_key = $4::text AND token = $5::bigint"
      "), dup AS ("
      "    SELECT 1 FROM tb_voucher_order WHERE user_id = $2 AND voucher_id = $1 LIMIT 1"
      "), sale AS ("
      "    SELECT " SALE_EARLY " AS early, " SALE_LATE " AS late"
      "      FROM tb_voucher WHERE voucher_id = $1"
      "), upd AS ("
      "    UPDATE tb_voucher SET stock = stock - 1"
      "     WHERE voucher_id = $1 AND stock > 0 AND " SALE_OPEN
      "       AND NOT EXISTS (SELECT 1 FROM dup)"
      "       AND ($4::text IS NULL OR EXISTS (SELECT 1 FROM fence))"
      "    RETURNING voucher_id"
      "), ins AS ("
      "    INSERT INTO tb_voucher_order (id, user_id, voucher_id)"
      "    SELECT $3, $2, voucher_id FROM upd RETURNING id"
      "), early AS ("
      /* $6: this transaction commits without waiting for its WAL flush
       * (early lock release: the row lock goes at the in-memory commit);
       * the wait_durable behind it waits for the flush before anyone is
       * told (store_order_send_early). */
      "    SELECT set_config('synchronous_commit', 'off', true) WHERE $6::bool"
      ")"
      "SELECT $4::text IS NOT NULL AND NOT EXISTS (SELECT 1 FROM fence),"
      "       EXISTS (SELECT 1 FROM dup), EXISTS (SELECT 1 FROM ins),"
      "       (SELECT count(*) FROM early),"
      "       EXISTS (SELECT 1 FROM sale WHERE early), EXISTS (SELECT 1 FROM sale WHERE late)" },

    /* A transaction that wrote WAL commits synchronously: its commit flushes
     * the WAL up to its own commit record, so this returns once every commit
     * before it, ours included, is on disk (and replicated, where
     * synchronous_standby_names asks for it). A transactional logical message
     * is the smallest such write (no table, no row: no contention); without
     * a write Postgres would commit it asynchronously. Concurrent callers
     * share one flush (Postgres's group commit). Only when order $1 exists,
     * which the first column says: an order the statement reported but
     * whose commit failed has no row, and must not read as flushed; a
     * refusal wrote nothing that needs waiting for, and then this writes
     * nothing either and returns without a flush. */
    { "wait_durable", 1,
      "SELECT o.found,"
      "       CASE WHEN o.found THEN pg_logical_emit_message(true, 'seckill.durable', '') END"
      "  FROM (SELECT EXISTS (SELECT 1 FROM tb_voucher_order WHERE id = $1) AS found) o" },

    /* The fence row, advanced by a statement of its own (locked until the
     * commit): before order_create, and first in the step-by-step
     * transaction (store_order_steps), whose other statements follow. */
    { "fence_advance", 3,
      "INSERT INTO tb_lock_fence (lock_key, token) SELECT $1::text, $2::bigint"
      "     WHERE " TOKEN_FRESH("$2::bigint", "$3::bigint")
      "    ON CONFLICT (lock_key) DO UPDATE SET token = EXCLUDED.token"
      "     WHERE tb_lock_fence.token <= EXCLUDED.token RETURNING 1" },
    /* The step-by-step transaction's duplicate check and sale window (no
     * row: no such voucher), then its stock steps and insert. */
    { "order_check", 2,
      "SELECT EXISTS (SELECT 1 FROM tb_voucher_order WHERE user_id = $2 AND voucher_id = $1),"
      "       " SALE_EARLY ", " SALE_LATE
      "  FROM tb_voucher WHERE voucher_id = $1" },
    { "stock_read", 1, "SELECT stock FROM tb_voucher WHERE voucher_id = $1" },
    { "stock_read_locked", 1, "SELECT stock FROM tb_voucher WHERE voucher_id = $1 FOR UPDATE" },
    { "stock_write", 2, "UPDATE tb_voucher SET stock = $2 WHERE voucher_id = $1" },
    { "stock_cas", 3, "UPDATE tb_voucher SET stock = $2 WHERE voucher_id = $1 AND stock = $3" },
    { "stock_decrement", 1,
      "UPDATE tb_voucher SET stock = stock - 1 WHERE voucher_id = $1 AND stock > 0" },
    { "order_insert", 3,
      "INSERT INTO tb_voucher_order (id, user_id, voucher_id) VALUES ($1, $2, $3)" },

    /* Group commit: the fence rows of the whole batch, then (order_batch)
     * its orders, in one transaction and one round trip, for the same
     * reason as fence_advance before order_create. Keys in order, so that
     * two batches lock shared rows in the same order. */
    { "fence_batch", 3,
      "INSERT INTO tb_lock_fence (lock_key, token)"
      "SELECT k, t FROM unnest($1::text[], $2::bigint[]) AS r(k, t)"
      " WHERE k IS NOT NULL AND " TOKEN_FRESH("t", "$3::bigint") " ORDER BY k"
      "    ON CONFLICT (lock_key) DO UPDATE SET token = EXCLUDED.token"
      "     WHERE tb_lock_fence.token <= EXCLUDED.token" },

    /* Early lock release for a batch (BATCH_EARLY_LOCK_RELEASE): first in
     * its transaction, so that the commit does not wait for the flush and
     * the voucher row is free at the in-memory commit; wait_durable_any,
     * in a transaction of its own behind it, waits for the flush before
     * anyone is answered. */
    { "async_commit", 0, "SELECT set_config('synchronous_commit', 'off', true)" },
    { "wait_durable_any", 1,
      "SELECT o.found,"
      "       CASE WHEN o.found THEN pg_logical_emit_message(true, 'seckill.durable', '') END"
      "  FROM (SELECT EXISTS (SELECT 1 FROM tb_voucher_order"
      "                        WHERE id = ANY ($1::bigint[])) AS found) o" },

    /* The voucher row is locked first (FOR UPDATE), so 'win' counts against
     * the latest stock; no one wins outside the sale window ('b'efore it
     * began, 'e'nded).
     * "OFFSET 0" keeps each EXISTS a probe per buyer: without it Postgres
     * may turn the probe into a join, and a generic plan costed while the
     * tables were small hashed the fence table and the voucher's orders
     * whole at every batch (tests/test_store_batch.c). The planner leaves
     * an EXISTS with an OFFSET as a subplan (simplify_EXISTS_query in its
     * src/backend/optimizer/plan/subselect.c). */
    { "order_batch", 5,
      "WITH req AS ("
      "    SELECT * FROM unnest($2::bigint[], $3::bigint[], $4::text[], $5::bigint[])"
      "           WITH ORDINALITY AS r(order_id, user_id, lock_key, token, n)"
      "), fenced AS ("
      "    SELECT r.* FROM req r"
      "     WHERE r.lock_key IS NULL OR EXISTS (SELECT 1 FROM tb_lock_fence f"
      "                       WHERE f.lock_key = r.lock_key AND f.token = r.token OFFSET 0)"
      "), fresh AS ("
      "    SELECT f.*, row_number() OVER (ORDER BY f.n) AS rn FROM fenced f"
      "     WHERE NOT EXISTS (SELECT 1 FROM tb_voucher_order o"
      "                        WHERE o.user_id = f.user_id AND o.voucher_id = $1 OFFSET 0)"
      "), v AS ("
      "    SELECT stock, " SALE_EARLY " AS early, " SALE_LATE " AS late"
      "      FROM tb_voucher WHERE voucher_id = $1 FOR UPDATE"
      "), win AS ("
      "    SELECT fr.* FROM fresh fr, v WHERE fr.rn <= v.stock AND NOT v.early AND NOT v.late"
      "), upd AS ("
      "    UPDATE tb_voucher SET stock = stock - (SELECT count(*) FROM win)"
      "     WHERE voucher_id = $1 AND EXISTS (SELECT 1 FROM win) RETURNING stock"
      "), ins AS ("
      "    INSERT INTO tb_voucher_order (id, user_id, voucher_id)"
      "    SELECT order_id, user_id, $1 FROM win RETURNING id"
      ")"
      "SELECT r.n, CASE"
      "    WHEN r.n NOT IN (SELECT n FROM fenced) THEN 's'"
      "    WHEN r.n IN (SELECT n FROM win) THEN 'o'"
      "    WHEN EXISTS (SELECT 1 FROM v WHERE early) THEN 'b'"
      "    WHEN EXISTS (SELECT 1 FROM v WHERE late) THEN 'e'"
      "    WHEN r.n NOT IN (SELECT n FROM fresh) THEN 'd'"
      "    ELSE 'x' END"
      "  FROM req r ORDER BY r.n" },

    /* Redis-first ("redis"): the consumer's batch of orders already
     * admitted in Redis. The voucher row is locked by a statement of its
     * own first (orders_lock), so that this one's snapshot, taken after
     * the lock was granted, sees every order another consumer committed
     * for the voucher before: an entry persisted twice (a consumer that was
     * slow, not dead, when its entries were claimed) is then 'fresh' for
     * one of them only, and the stock is taken once. The deduction is the
     * optimistic one for n units ("stock >= n": the database never goes
     * below zero whatever Redis said); none of the batch lands when it
     * fails. An id already taken by another order (another user or
     * voucher: a Redis that lost its id counter and issued it again) is
     * not a re-delivery: the batch is refused ('clash'), never skipped.
     * The batch's sale ($4) must be the voucher's sale_gen, read under the
     * row lock that a reset takes too (voucher_reset): orders of a sale
     * that a reset ended are never written, and a reset never falls
     * between this read and the commit. Probes per order (OFFSET 0), as in
     * order_batch. */
    { "orders_lock", 1, "SELECT 1 FROM tb_voucher WHERE voucher_id = $1 FOR UPDATE" },
    { "orders_persist", 4,
      "WITH sale AS ("
      "    SELECT sale_gen FROM tb_voucher WHERE voucher_id = $1"
      "), req AS ("
      "    SELECT * FROM unnest($2::bigint[], $3::bigint[]) AS r(order_id, user_id)"
      "), fresh AS ("
      "    SELECT r.* FROM req r"
      "     WHERE NOT EXISTS (SELECT 1 FROM tb_voucher_order o WHERE o.id = r.order_id OFFSET 0)"
      "), clash AS ("
      "    SELECT 1 FROM req r"
      "     WHERE EXISTS (SELECT 1 FROM tb_voucher_order o WHERE o.id = r.order_id"
      "                      AND (o.user_id <> r.user_id OR o.voucher_id <> $1) OFFSET 0)"
      "), upd AS ("
      "    UPDATE tb_voucher SET stock = stock - (SELECT count(*) FROM fresh)"
      "     WHERE voucher_id = $1 AND stock >= (SELECT count(*) FROM fresh)"
      "       AND EXISTS (SELECT 1 FROM fresh) AND NOT EXISTS (SELECT 1 FROM clash)"
      "       AND sale_gen = $4"
      "    RETURNING 1"
      "), ins AS ("
      "    INSERT INTO tb_voucher_order (id, user_id, voucher_id)"
      "    SELECT order_id, user_id, $1 FROM fresh WHERE EXISTS (SELECT 1 FROM upd) RETURNING id"
      ")"
      "SELECT (SELECT count(*) FROM fresh), (SELECT count(*) FROM ins),"
      "       EXISTS (SELECT 1 FROM sale), EXISTS (SELECT 1 FROM clash),"
      "       (SELECT sale_gen FROM sale)" },
    /* The buyers of a voucher, to rebuild its Redis state. */
    { "voucher_buyers", 1, "SELECT user_id FROM tb_voucher_order WHERE voucher_id = $1" },
    /* One page of the fence sweep: the next $3 keys after $1, in key
     * order (the primary key's index: each page is a short transaction,
     * a pass costs one walk of the index); those whose token is more than
     * two horizons ($2 ms) old and that begin with $4 are deleted. A row
     * advanced meanwhile is re-checked on its new version and stays. */
    { "fence_sweep", 4,
      "WITH page AS ("
      "    SELECT lock_key FROM tb_lock_fence WHERE lock_key > $1 ORDER BY lock_key LIMIT $3"
      "), gone AS ("
      "    DELETE FROM tb_lock_fence f USING page"
      "     WHERE f.lock_key = page.lock_key AND starts_with(f.lock_key, $4)"
      "       AND f.token < " NOW_US " - $2::bigint * 2000"
      "    RETURNING 1"
      ")"
      "SELECT (SELECT max(lock_key) FROM page), (SELECT count(*) FROM page),"
      "       (SELECT count(*) FROM gone)" },

    { "voucher_create", 4,
      "INSERT INTO tb_voucher (title, stock, initial_stock, begin_time, end_time)"
      "VALUES ($1, $2, $2, to_timestamp($3), to_timestamp($4)) RETURNING voucher_id" },

    /* After orders_lock in the same transaction (store_voucher_reset): the
     * DELETE reads the orders committed when the statement starts, so the
     * row lock comes first, in a statement of its own; otherwise a
     * consumer's batch committed while the UPDATE waited for the lock
     * would outlive the reset. */
    { "voucher_reset", 4,
      "WITH v AS ("
      "    UPDATE tb_voucher SET stock = $2, initial_stock = $2,"
      "           begin_time = COALESCE(to_timestamp($3), begin_time),"
      "           end_time = COALESCE(to_timestamp($4), end_time),"
      "           sale_gen = sale_gen + 1, update_time = now()"
      "     WHERE voucher_id = $1"
      " RETURNING voucher_id, title, stock, initial_stock,"
      "           extract(epoch FROM begin_time)::bigint, extract(epoch FROM end_time)::bigint,"
      "           sale_gen"
      "), d AS ("
      "    DELETE FROM tb_voucher_order WHERE voucher_id IN (SELECT voucher_id FROM v)"
      "    RETURNING 1"
      ")"
      /* The voucher as voucher_get reads it (no row: no such voucher). */
      "SELECT v.*, (SELECT count(*) FROM d) FROM v" },

    { "stats_vouchers", 0,
      "SELECT v.voucher_id, v.title, v.initial_stock, v.stock,"
      "       COALESCE(o.orders, 0), COALESCE(o.dup_users, 0),"
      "       extract(epoch FROM v.begin_time)::bigint, extract(epoch FROM v.end_time)::bigint"
      "  FROM tb_voucher v LEFT JOIN ("
      "       SELECT voucher_id, sum(n) AS orders, count(*) FILTER (WHERE n > 1) AS dup_users"
      "         FROM (SELECT voucher_id, user_id, count(*) AS n FROM tb_voucher_order"
      "                GROUP BY voucher_id, user_id) per_user"
      "        GROUP BY voucher_id) o USING (voucher_id)"
      " ORDER BY v.voucher_id" },
};

#define NSTATEMENTS (sizeof statements / sizeof statements[0])

/*---- round trips, each with the client's own bound ----*/

/* statement_timeout (PG_STATEMENT_TIMEOUT_MS) ends a slow statement on the
 * server. A server that cannot answer at all - a stopped or hung process,
 * a host whose kernel still acknowledges while the database is gone - ends
 * nothing, and libpq's blocking calls would wait for it forever (TCP
 * keepalives and tcp_user_timeout, set in conn.c, only catch a peer whose
 * kernel is gone too). So every wait for an answer is bounded (pgwait.h),
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
 * the generic one costed more than their average. Every statement here is
 * a lookup by key, and the probes of the batch statements are written so
 * that their generic plans probe by key (tests/test_store_batch.c). */
static int session_setup(PGconn *pg)
{
    PGresult *res = PQsendQuery(pg, "SET plan_cache_mode = force_generic_plan")
                        ? pgwait_collect(pg, store_round_trip_ms())
                        : NULL;
    int ok = PQresultStatus(res) == PGRES_COMMAND_OK;

    if (!ok)
        log_error("store: plan_cache_mode: %s", PQerrorMessage(pg));
    PQclear(res);
    return ok ? 0 : -1;
}

int store_prepare(PGconn *pg)
{
    if (session_setup(pg) != 0)
        return -1;
    for (size_t i = 0; i < NSTATEMENTS; i++) {
        PGresult *res = PQsendPrepare(pg, statements[i].name, statements[i].sql,
                                      statements[i].nparams, NULL)
                            ? pgwait_collect(pg, store_round_trip_ms())
                            : NULL;
        int ok = res != NULL && PQresultStatus(res) == PGRES_COMMAND_OK;
        if (!ok)
            log_error("store: prepare %s: %s", statements[i].name, PQerrorMessage(pg));
        PQclear(res);
        if (!ok)
            return -1;
    }
    return 0;
}

/* The statement failed because an order id is taken (the order table's
 * primary key). */
static int id_taken(const PGresult *res)
{
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    const char *constraint = res ? PQresultErrorField(res, PG_DIAG_CONSTRAINT_NAME) : NULL;

    return state != NULL && constraint != NULL && strcmp(state, "23505") == 0 &&
           strcmp(constraint, "tb_voucher_order_pkey") == 0;
}

/* Maps a failed result to a status. Constraint violations are answers about
 * the data; everything else (lost connection, timeout, server shutting down,
 * a bug in our SQL) is 503, logged without leaking details to clients. */
static store_status result_error(PGconn *pg, PGresult *res, const char *what)
{
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;

    if (state != NULL) {
        /* The order id is taken: Redis's id counter went back (a failover
         * to a replica that missed the last increments, or a restart), and
         * this second's count was handed out before. Nothing was written;
         * the buyer may try again (ids carry the second, so at the latest
         * the next second's ids are free). Not "already ordered": it is
         * someone else's order. */
        if (id_taken(res)) {
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

/* Every call goes through here or timed_exec, for the backend metrics. */
static PGresult *observed(PGconn *pg, PGresult *res, int64_t t0)
{
    rec_backend(REC_PG, util_mono_us() - t0, res != NULL && PQstatus(pg) == CONNECTION_OK);
    return res;
}

static PGresult *exec(PGconn *pg, const char *name, int n, const char *const *vals)
{
    int64_t t0 = util_mono_us();
    PGresult *res = PQsendQueryPrepared(pg, name, n, vals, NULL, NULL, 0)
                        ? pgwait_collect(pg, store_round_trip_ms())
                        : NULL;
    return observed(pg, res, t0);
}

static PGresult *timed_exec(PGconn *pg, const char *sql)
{
    int64_t t0 = util_mono_us();
    return observed(pg, PQsendQuery(pg, sql) ? pgwait_collect(pg, store_round_trip_ms()) : NULL,
                    t0);
}

static int64_t get_i64(const PGresult *res, int row, int col)
{
    return strtoll(PQgetvalue(res, row, col), NULL, 10);
}

/* Row 0 of a result whose first columns are voucher_get's. */
static void voucher_read(const PGresult *res, store_voucher *out)
{
    out->voucher_id = get_i64(res, 0, 0);
    snprintf(out->title, sizeof out->title, "%s", PQgetvalue(res, 0, 1));
    out->stock = get_i64(res, 0, 2);
    out->initial_stock = get_i64(res, 0, 3);
    out->begin_time = get_i64(res, 0, 4);
    out->end_time = get_i64(res, 0, 5);
    out->sale_gen = get_i64(res, 0, 6);
}

store_status store_voucher_get(PGconn *pg, int64_t voucher_id, store_voucher *out)
{
    char id[24];
    const char *vals[1] = { id };
    store_status st;
    PGresult *res;

    snprintf(id, sizeof id, "%" PRId64, voucher_id);
    res = exec(pg, "voucher_get", 1, vals);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        st = result_error(pg, res, "voucher_get");
        goto cleanup;
    }
    if (PQntuples(res) == 0) {
        st = STORE_NOT_FOUND;
        goto cleanup;
    }
    voucher_read(res, out);
    st = STORE_OK;
cleanup:
    PQclear(res);
    return st;
}

/* The order statement's parameters, as text. */
typedef struct order_params {
    char v[24], u[24], id[24], tok[24], horizon[24];
    const char *vals[6];
} order_params;

static void order_params_fill(order_params *p, const store_order *o, int early)
{
    snprintf(p->v, sizeof p->v, "%" PRId64, o->voucher_id);
    snprintf(p->u, sizeof p->u, "%" PRId64, o->user_id);
    snprintf(p->id, sizeof p->id, "%" PRId64, o->order_id);
    snprintf(p->tok, sizeof p->tok, "%" PRId64, o->fence_token);
    p->vals[0] = p->v;
    p->vals[1] = p->u;
    p->vals[2] = p->id;
    p->vals[3] = o->fence_key;
    p->vals[4] = o->fence_key ? p->tok : NULL;
    p->vals[5] = early ? "true" : "false";
    snprintf(p->horizon, sizeof p->horizon, "%ld", o->fence_horizon_ms);
}

/* The order statement's answer (does not free 'res'). */
static store_status order_result(PGconn *pg, const PGresult *res)
{
    if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
        return result_error(pg, (PGresult *)res, "order_create");
    if (PQgetvalue(res, 0, 0)[0] == 't')
        return STORE_STALE_TOKEN;
    if (PQgetvalue(res, 0, 2)[0] == 't')
        return STORE_OK;
    if (PQgetvalue(res, 0, 4)[0] == 't')
        return STORE_NOT_STARTED;
    if (PQgetvalue(res, 0, 5)[0] == 't')
        return STORE_ENDED;
    if (PQgetvalue(res, 0, 1)[0] == 't')
        return STORE_DUPLICATE;
    return STORE_SOLD_OUT;
}

/* Reads every result of one pipeline segment (its statements and its
 * Sync): returns the first error among them, else the last result (caller
 * clears; NULL when none came), and sets *synced when the Sync was
 * reached. A segment is one implicit transaction whose COMMIT runs at the
 * Sync: a statement can succeed and its commit still fail (a deferred
 * constraint, a serialization failure, the server shutting down), and that
 * error comes as a result of its own after the statement's; a failed
 * statement skips the rest (PGRES_PIPELINE_ABORTED). Two NULLs in a row
 * mean the connection has nothing more to give (it broke). */
static PGresult *segment_read_until(PGconn *pg, int64_t until, int *synced)
{
    PGresult *kept = NULL, *r;
    int nulls = 0;

    *synced = 0;
    while (nulls < 2) {
        if (pgwait_input(pg, until) != 0)
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
    return kept;
}

static PGresult *segment_read(PGconn *pg, int *synced)
{
    return segment_read_until(pg, util_mono_us() + (int64_t)store_round_trip_ms() * 1000, synced);
}

/* A connection left in a state nobody can use: shut down, so that it reads
 * as CONNECTION_BAD and is re-opened by its next user. */
static void drop(PGconn *pg)
{
    if (PQsocket(pg) >= 0)
        shutdown(PQsocket(pg), SHUT_RDWR);
    PQconsumeInput(pg);
}

/* Leaves pipeline mode once every segment was read. 0, or -1 having
 * dropped a connection that could not. */
static int leave_pipeline(PGconn *pg)
{
    if (PQpipelineStatus(pg) == PQ_PIPELINE_OFF || PQexitPipelineMode(pg))
        return 0;
    log_warn("store: cannot leave pipeline mode: %s", PQerrorMessage(pg));
    drop(pg);
    return -1;
}

/* Queues the order's transaction in pipeline mode: fence_advance (when the
 * order carries a fencing token), order_create, and the Sync that commits
 * both. 1, or 0 when sending failed. */
static int send_order(PGconn *pg, const order_params *p)
{
    const char *const fence[3] = { p->vals[3], p->vals[4], p->horizon };

    if (p->vals[3] != NULL && !PQsendQueryPrepared(pg, "fence_advance", 3, fence, NULL, NULL, 0))
        return 0;
    return PQsendQueryPrepared(pg, "order_create", 6, p->vals, NULL, NULL, 0) &&
           PQpipelineSync(pg);
}

store_status store_order_create(PGconn *pg, const store_order *o)
{
    order_params p;
    PGresult *res = NULL;
    int synced = 0;
    int64_t t0 = util_mono_us();
    store_status st;

    order_params_fill(&p, o, 0);
    if (!PQenterPipelineMode(pg))
        return result_error(pg, NULL, "order_create (pipeline)");
    if (send_order(pg, &p))
        res = segment_read(pg, &synced);
    rec_backend(REC_PG, util_mono_us() - t0, synced);
    st = synced ? order_result(pg, res) : result_error(pg, res, "order_create");
    PQclear(res);
    if (leave_pipeline(pg) != 0 && st == STORE_OK)
        st = STORE_UNAVAILABLE;
    return st;
}

store_status store_order_send_early(PGconn *pg, const store_order *o, store_early *e)
{
    order_params p;
    PGresult *res;
    int synced;
    store_status st;

    memset(e, 0, sizeof *e);
    e->order_id = o->order_id;
    order_params_fill(&p, o, 1);
    e->t0 = util_mono_us();
    if (!PQenterPipelineMode(pg))
        return result_error(pg, NULL, "order_create (pipeline)");
    /* Two segments, each with its own Sync, hence its own transaction: the
     * order commits (without waiting for the flush) before the wait runs. */
    if (send_order(pg, &p)) {
        e->segments = 1;
        if (PQsendQueryPrepared(pg, "wait_durable", 1, &p.vals[2], NULL, NULL, 0) &&
            PQpipelineSync(pg))
            e->segments = 2;
    }
    if (e->segments == 0)
        return result_error(pg, NULL, "order_create (pipeline)");
    res = segment_read(pg, &synced);
    e->read = 1;
    rec_backend(REC_PG, util_mono_us() - e->t0, synced);
    st = synced ? order_result(pg, res) : result_error(pg, res, "order_create");
    PQclear(res);
    return st;
}

store_status store_order_finish_early(PGconn *pg, store_early *e, store_status st)
{
    PGresult *res = NULL;
    int synced = 0;
    int64_t t0 = util_mono_us();

    if (e->segments == 2 && e->read == 1) {
        res = segment_read(pg, &synced);
        rec_backend(REC_PG, util_mono_us() - t0, synced);
        if (st == STORE_OK && (!synced || PQresultStatus(res) != PGRES_TUPLES_OK ||
                               PQntuples(res) != 1))
            st = result_error(pg, res, "wait_durable");
        else if (st == STORE_OK && PQgetvalue(res, 0, 0)[0] != 't') {
            /* Reported, yet not there: its commit failed after the statement. */
            log_warn("store: order %" PRId64 " reported, but its commit failed", e->order_id);
            st = STORE_UNAVAILABLE;
        }
        PQclear(res);
    } else if (st == STORE_OK) {
        st = STORE_UNAVAILABLE;                  /* the wait was never sent */
    }
    if (leave_pipeline(pg) != 0 && st == STORE_OK)
        st = STORE_UNAVAILABLE;
    return st;
}

store_status store_ping(PGconn *pg)
{
    PGresult *res = timed_exec(pg, "SELECT 1");
    store_status st = PQresultStatus(res) == PGRES_TUPLES_OK ? STORE_OK
                                                             : result_error(pg, res, "ping");
    PQclear(res);
    return st;
}

/* Runs a command outside the prepared set (BEGIN, COMMIT, ROLLBACK). */
static store_status simple(PGconn *pg, const char *sql)
{
    PGresult *res = timed_exec(pg, sql);
    store_status st = PQresultStatus(res) == PGRES_COMMAND_OK ? STORE_OK
                                                              : result_error(pg, res, sql);
    PQclear(res);
    return st;
}

/* One step of the transaction; '*rows' gets the rows returned or affected. */
static store_status step(PGconn *pg, const char *name, int n, const char *const *vals, int *rows,
                         int64_t *first)
{
    PGresult *res = exec(pg, name, n, vals);
    ExecStatusType es = PQresultStatus(res);
    store_status st = STORE_OK;

    if (es == PGRES_TUPLES_OK) {
        *rows = PQntuples(res);
        if (first != NULL && *rows > 0)
            *first = get_i64(res, 0, 0);
    } else if (es == PGRES_COMMAND_OK) {
        *rows = atoi(PQcmdTuples(res));
    } else {
        st = result_error(pg, res, name);
    }
    PQclear(res);
    return st;
}

/* order_check: STORE_OK, or why the order cannot be placed. */
static store_status order_check(PGconn *pg, const char *const *vu)
{
    PGresult *res = exec(pg, "order_check", 2, vu);
    store_status st;

    if (PQresultStatus(res) != PGRES_TUPLES_OK)
        st = result_error(pg, res, "order_check");
    else if (PQntuples(res) == 0)
        st = STORE_NOT_FOUND;
    else if (PQgetvalue(res, 0, 1)[0] == 't')
        st = STORE_NOT_STARTED;
    else if (PQgetvalue(res, 0, 2)[0] == 't')
        st = STORE_ENDED;
    else if (PQgetvalue(res, 0, 0)[0] == 't')
        st = STORE_DUPLICATE;
    else
        st = STORE_OK;
    PQclear(res);
    return st;
}

store_status store_order_steps(PGconn *pg, const store_order *o, const store_stock_step *stock,
                               int delay_ms)
{
    char v[24], u[24], id[24], tok[24], horizon[24];
    const char *vu[2] = { v, u }, *fence[3] = { o->fence_key, tok, horizon };
    const char *ins[3] = { id, u, v };
    int64_t seen = 0;
    int rows = 0, open = 0;
    store_status st;

    snprintf(v, sizeof v, "%" PRId64, o->voucher_id);
    snprintf(u, sizeof u, "%" PRId64, o->user_id);
    snprintf(id, sizeof id, "%" PRId64, o->order_id);
    snprintf(tok, sizeof tok, "%" PRId64, o->fence_token);
    snprintf(horizon, sizeof horizon, "%ld", o->fence_horizon_ms);

    if ((st = simple(pg, "BEGIN")) != STORE_OK)
        goto cleanup;
    open = 1;
    if (o->fence_key != NULL) {
        if ((st = step(pg, "fence_advance", 3, fence, &rows, NULL)) != STORE_OK)
            goto cleanup;
        if (rows == 0) {
            st = STORE_STALE_TOKEN;
            goto cleanup;
        }
    }
    /* The sale window, by Postgres's clock, and one order per user: checked,
     * not enforced (the lock and the unique constraint must do that). */
    if ((st = order_check(pg, vu)) != STORE_OK)
        goto cleanup;
    if (stock->read != NULL) {
        if ((st = stock->read(pg, o->voucher_id, &seen)) != STORE_OK)
            goto cleanup;
        if (seen <= 0) {
            st = STORE_SOLD_OUT;
            goto cleanup;
        }
    }
    if (delay_ms > 0) {
        struct timespec ts = { delay_ms / 1000, (long)(delay_ms % 1000) * 1000000L };
        nanosleep(&ts, NULL);
    }
    if ((st = stock->write(pg, o->voucher_id, seen, &rows)) != STORE_OK)
        goto cleanup;
    if (rows == 0) {
        st = stock->unchanged;
        goto cleanup;
    }
    if ((st = step(pg, "order_insert", 3, ins, &rows, NULL)) != STORE_OK)
        goto cleanup;
    st = simple(pg, "COMMIT");
    open = 0;
cleanup:
    /* Every early exit rolls back, so nothing half-done stays behind; a lost
     * connection rolls back on the server by itself. */
    if (open && PQstatus(pg) == CONNECTION_OK) {
        PGresult *res = timed_exec(pg, "ROLLBACK");
        PQclear(res);
    }
    return st;
}

/* A stock read inside the transaction: its value, or STORE_NOT_FOUND. */
static store_status stock_read(PGconn *pg, const char *name, int64_t voucher_id, int64_t *stock)
{
    char v[24];
    const char *vals[1] = { v };
    int rows = 0;
    store_status st;

    snprintf(v, sizeof v, "%" PRId64, voucher_id);
    if ((st = step(pg, name, 1, vals, &rows, stock)) != STORE_OK)
        return st;
    return rows == 0 ? STORE_NOT_FOUND : STORE_OK;
}

store_status store_stock_read(PGconn *pg, int64_t voucher_id, int64_t *stock)
{
    return stock_read(pg, "stock_read", voucher_id, stock);
}

store_status store_stock_read_locked(PGconn *pg, int64_t voucher_id, int64_t *stock)
{
    return stock_read(pg, "stock_read_locked", voucher_id, stock);
}

store_status store_stock_decrement(PGconn *pg, int64_t voucher_id, int64_t seen, int *rows)
{
    char v[24];
    const char *vals[1] = { v };

    (void)seen;
    snprintf(v, sizeof v, "%" PRId64, voucher_id);
    return step(pg, "stock_decrement", 1, vals, rows, NULL);
}

/* "stock = seen - 1", with the compare ("AND stock = seen") or without. */
static store_status stock_write(PGconn *pg, const char *name, int n, int64_t voucher_id,
                                int64_t seen, int *rows)
{
    char v[24], next[24], was[24];
    const char *vals[3] = { v, next, was };

    snprintf(v, sizeof v, "%" PRId64, voucher_id);
    snprintf(next, sizeof next, "%" PRId64, seen - 1);
    snprintf(was, sizeof was, "%" PRId64, seen);
    return step(pg, name, n, vals, rows, NULL);
}

store_status store_stock_write_back(PGconn *pg, int64_t voucher_id, int64_t seen, int *rows)
{
    return stock_write(pg, "stock_write", 2, voucher_id, seen, rows);
}

store_status store_stock_cas(PGconn *pg, int64_t voucher_id, int64_t seen, int *rows)
{
    return stock_write(pg, "stock_cas", 3, voucher_id, seen, rows);
}

/* Appends "{a,b,...}" of 'n' values to a growing buffer; NULL strings are
 * SQL NULLs. Keys are "lock:order:<digits>": nothing to quote. */
static char *array_text(size_t n, const store_order *o, int field)
{
    size_t cap = 2 + n * 48, len = 0;
    char *buf = xmalloc(cap);

    buf[len++] = '{';
    for (size_t i = 0; i < n; i++) {
        int w;
        if (cap - len < 48) {
            cap *= 2;
            buf = xrealloc(buf, cap);
        }
        if (i > 0)
            buf[len++] = ',';
        switch (field) {
        case 0:
            w = snprintf(buf + len, cap - len, "%" PRId64, o[i].order_id);
            break;
        case 1:
            w = snprintf(buf + len, cap - len, "%" PRId64, o[i].user_id);
            break;
        case 2:
            w = snprintf(buf + len, cap - len, "%s", o[i].fence_key ? o[i].fence_key : "NULL");
            break;
        default:
            w = snprintf(buf + len, cap - len, "%" PRId64, o[i].fence_key ? o[i].fence_token : 0);
            break;
        }
        len += (size_t)w;
    }
    buf[len++] = '}';
    buf[len] = '\0';
    return buf;
}

int store_order_batch_send(PGconn *pg, const store_order *orders, size_t n, int early,
                           store_batch_call *call)
{
    char v[24];
    char *ids = array_text(n, orders, 0), *users = array_text(n, orders, 1);
    char *keys = array_text(n, orders, 2), *tokens = array_text(n, orders, 3);
    char horizon[24];
    const char *vals[6] = { v, ids, users, keys, tokens, horizon };
    int fenced = 0, rc = -1;

    call->t0_us = util_mono_us();
    call->sent = -1;
    call->early = early;
    snprintf(v, sizeof v, "%" PRId64, n > 0 ? orders[0].voucher_id : 0);
    snprintf(horizon, sizeof horizon, "%ld", n > 0 ? orders[0].fence_horizon_ms : 0L);
    for (size_t i = 0; i < n && !fenced; i++)
        fenced = orders[i].fence_key != NULL;
    /* fence_batch, then order_batch, one transaction, one round trip;
     * early, the flush wait follows as a second transaction (a segment of
     * its own), in the same round trip. */
    if (!PQenterPipelineMode(pg)) {
        log_warn("store: order_batch (pipeline): %s", PQerrorMessage(pg));
        goto cleanup;
    }
    if ((!early || PQsendQueryPrepared(pg, "async_commit", 0, NULL, NULL, NULL, 0)) &&
        (!fenced || PQsendQueryPrepared(pg, "fence_batch", 3, &vals[3], NULL, NULL, 0)) &&
        PQsendQueryPrepared(pg, "order_batch", 5, vals, NULL, NULL, 0) && PQpipelineSync(pg) &&
        (!early || (PQsendQueryPrepared(pg, "wait_durable_any", 1, &vals[1], NULL, NULL, 0) &&
                    PQpipelineSync(pg))))
        rc = call->sent = 0;
cleanup:
    free(ids);
    free(users);
    free(keys);
    free(tokens);
    return rc;
}

/* When the batch's round trip must end: its bound counts from the send. */
static int64_t call_until(const store_batch_call *call)
{
    return call->t0_us + (int64_t)store_round_trip_ms() * 1000;
}

int store_order_batch_wait(PGconn *pg, const store_batch_call *call, int64_t timeout_us)
{
    struct pollfd pfd = { .fd = -1, .events = POLLIN };
    int64_t left = call_until(call) - util_mono_us();
    struct timespec ts;
    int rc;

    /* Nothing to wait for, or the bound has passed: _recv says what. */
    if (call->sent != 0 || pg == NULL || (pfd.fd = PQsocket(pg)) < 0 || !PQisBusy(pg) ||
        left <= 0)
        return 1;
    if (timeout_us > left)
        timeout_us = left;
    ts.tv_sec = timeout_us / 1000000;
    ts.tv_nsec = timeout_us % 1000000 * 1000;
    rc = ppoll(&pfd, 1, &ts, NULL);
    if (rc < 0 && errno != EINTR)
        return 1;
    if (rc > 0 && !PQconsumeInput(pg))
        return 1;
    return !PQisBusy(pg);
}

store_status store_order_batch_recv(PGconn *pg, const store_batch_call *call, size_t n,
                                    store_status *results)
{
    store_status st;
    PGresult *res = NULL, *dur = NULL;
    int synced = 0, dsynced = 0, durable;

    if (call->sent == 0)
        res = segment_read_until(pg, call_until(call), &synced);
    if (synced && call->early)
        dur = segment_read_until(pg, call_until(call), &dsynced);
    rec_backend(REC_PG, util_mono_us() - call->t0_us, synced);
    if (leave_pipeline(pg) != 0 || !synced || PQresultStatus(res) != PGRES_TUPLES_OK ||
        (size_t)PQntuples(res) != n) {
        st = result_error(pg, res, "order_batch");
        goto cleanup;
    }
    /* Early: the orders stand only once the flush wait found them. A
     * failed wait leaves them of unknown outcome (503), and none was
     * found when the commit failed after the statement: 503 as well, and
     * never the one-by-one retry, which would find committed orders. */
    durable = !call->early ||
              (dsynced && PQresultStatus(dur) == PGRES_TUPLES_OK && PQntuples(dur) == 1 &&
               PQgetvalue(dur, 0, 0)[0] == 't');
    for (size_t i = 0; i < n; i++) {
        switch (PQgetvalue(res, (int)i, 1)[0]) {
        case 'o':
            results[i] = durable ? STORE_OK : STORE_UNAVAILABLE;
            break;
        case 'd':
            results[i] = STORE_DUPLICATE;
            break;
        case 's':
            results[i] = STORE_STALE_TOKEN;
            break;
        case 'b':
            results[i] = STORE_NOT_STARTED;
            break;
        case 'e':
            results[i] = STORE_ENDED;
            break;
        default:
            results[i] = STORE_SOLD_OUT;
            break;
        }
    }
    if (!durable)
        log_warn("store: a batch's flush wait failed or found none of its orders: its orders "
                 "are answered 503 (%s)", dur != NULL ? PQresultErrorMessage(dur) : "no answer");
    st = STORE_OK;
cleanup:
    PQclear(res);
    PQclear(dur);
    return st;
}

store_status store_order_batch(PGconn *pg, const store_order *orders, size_t n,
                               store_status *results)
{
    store_batch_call call;

    store_order_batch_send(pg, orders, n, 0, &call);
    return store_order_batch_recv(pg, &call, n, results);
}

store_status store_orders_persist(PGconn *pg, int64_t voucher_id, int64_t sale_gen,
                                  const store_order *orders, size_t n, int64_t *inserted,
                                  int64_t *pg_sale)
{
    char v[24], g[24];
    char *ids = array_text(n, orders, 0), *users = array_text(n, orders, 1);
    const char *vals[4] = { v, ids, users, g };
    store_status st;
    PGresult *res = NULL;
    int synced = 0;
    int64_t t0 = util_mono_us(), fresh, now_gen;

    *inserted = 0;
    *pg_sale = 0;
    snprintf(v, sizeof v, "%" PRId64, voucher_id);
    snprintf(g, sizeof g, "%" PRId64, sale_gen);
    /* orders_lock, then orders_persist: one transaction, one round trip. */
    if (!PQenterPipelineMode(pg)) {
        st = result_error(pg, NULL, "orders_persist (pipeline)");
        goto cleanup;
    }
    if (PQsendQueryPrepared(pg, "orders_lock", 1, vals, NULL, NULL, 0) &&
        PQsendQueryPrepared(pg, "orders_persist", 4, vals, NULL, NULL, 0) && PQpipelineSync(pg))
        res = segment_read(pg, &synced);
    rec_backend(REC_PG, util_mono_us() - t0, synced);
    if (leave_pipeline(pg) != 0 || !synced || PQresultStatus(res) != PGRES_TUPLES_OK ||
        PQntuples(res) != 1) {
        st = result_error(pg, res, "orders_persist");
        /* Two orders of the batch with one id (the 'clash' probe sees
         * only rows already there): refused for good, like a clash. */
        if (st == STORE_UNAVAILABLE && id_taken(res))
            st = STORE_CONFLICT;
        goto cleanup;
    }
    fresh = get_i64(res, 0, 0);
    *inserted = get_i64(res, 0, 1);
    now_gen = *pg_sale = get_i64(res, 0, 4);
    if (PQgetvalue(res, 0, 2)[0] != 't')
        st = STORE_NOT_FOUND;
    else if (now_gen > sale_gen)
        st = STORE_STALE_SALE;
    else if (now_gen < sale_gen)
        st = STORE_INVALID;                 /* a sale Postgres never began */
    else if (PQgetvalue(res, 0, 3)[0] == 't')
        st = STORE_CONFLICT;
    else if (*inserted != fresh)
        st = STORE_SOLD_OUT;
    else
        st = STORE_OK;
cleanup:
    PQclear(res);
    free(ids);
    free(users);
    return st;
}

store_status store_voucher_buyers(PGconn *pg, int64_t voucher_id, int64_t **users, size_t *n)
{
    char v[24];
    const char *vals[1] = { v };
    store_status st;
    PGresult *res;

    *users = NULL;
    *n = 0;
    snprintf(v, sizeof v, "%" PRId64, voucher_id);
    res = exec(pg, "voucher_buyers", 1, vals);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        st = result_error(pg, res, "voucher_buyers");
        goto cleanup;
    }
    *n = (size_t)PQntuples(res);
    *users = xmalloc(sizeof **users * (*n + 1));
    for (size_t i = 0; i < *n; i++)
        (*users)[i] = get_i64(res, (int)i, 0);
    st = STORE_OK;
cleanup:
    PQclear(res);
    return st;
}

store_status store_voucher_snapshot(PGconn *pg, int64_t voucher_id, store_voucher *v,
                                    int64_t **users, size_t *n)
{
    store_status st;
    int open = 0;

    *users = NULL;
    *n = 0;
    if ((st = simple(pg, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")) != STORE_OK)
        goto cleanup;
    open = 1;
    if ((st = store_voucher_get(pg, voucher_id, v)) != STORE_OK ||
        (st = store_voucher_buyers(pg, voucher_id, users, n)) != STORE_OK)
        goto cleanup;
    st = simple(pg, "COMMIT");
    open = 0;
cleanup:
    if (open && PQstatus(pg) == CONNECTION_OK) {
        PGresult *res = timed_exec(pg, "ROLLBACK");    /* read only: nothing to undo */
        PQclear(res);
    }
    if (st != STORE_OK) {
        free(*users);
        *users = NULL;
        *n = 0;
    }
    return st;
}

store_status store_fence_sweep(PGconn *pg, long horizon_ms, const char *prefix, const char *after,
                               int page, store_sweep_page *out)
{
    char h[24], n[24];
    const char *vals[4] = { after, h, n, prefix };
    store_status st;
    PGresult *res;

    snprintf(h, sizeof h, "%ld", horizon_ms);
    snprintf(n, sizeof n, "%d", page);
    res = exec(pg, "fence_sweep", 4, vals);
    if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
        st = result_error(pg, res, "fence_sweep");
        goto cleanup;
    }
    snprintf(out->last, sizeof out->last, "%s", PQgetvalue(res, 0, 0));
    out->scanned = get_i64(res, 0, 1);
    out->deleted = get_i64(res, 0, 2);
    /* A key too long for 'last' cannot be resumed after: end the pass. */
    if (strlen(PQgetvalue(res, 0, 0)) >= sizeof out->last)
        out->scanned = 0;
    st = STORE_OK;
cleanup:
    PQclear(res);
    return st;
}

store_status store_voucher_create(PGconn *pg, const char *title, int64_t stock,
                                  int64_t begin_time, int64_t end_time, int64_t *voucher_id)
{
    char s[24], b[24], e[24];
    const char *vals[4] = { title, s, b, e };
    store_status st;
    PGresult *res;

    snprintf(s, sizeof s, "%" PRId64, stock);
    snprintf(b, sizeof b, "%" PRId64, begin_time);
    snprintf(e, sizeof e, "%" PRId64, end_time);
    res = exec(pg, "voucher_create", 4, vals);
    if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
        st = result_error(pg, res, "voucher_create");
        goto cleanup;
    }
    *voucher_id = get_i64(res, 0, 0);
    st = STORE_OK;
cleanup:
    PQclear(res);
    return st;
}

store_status store_voucher_reset(PGconn *pg, int64_t voucher_id, int64_t stock,
                                 int64_t begin_time, int64_t end_time, store_voucher *out)
{
    char v[24], s[24], b[24], e[24];
    const char *vals[4] = { v, s, begin_time >= 0 ? b : NULL, end_time >= 0 ? e : NULL };
    store_status st;
    PGresult *res = NULL;
    int synced = 0;
    int64_t t0 = util_mono_us();

    snprintf(v, sizeof v, "%" PRId64, voucher_id);
    snprintf(s, sizeof s, "%" PRId64, stock);
    snprintf(b, sizeof b, "%" PRId64, begin_time);
    snprintf(e, sizeof e, "%" PRId64, end_time);
    /* orders_lock, then voucher_reset: one transaction, one round trip. */
    if (!PQenterPipelineMode(pg))
        return result_error(pg, NULL, "voucher_reset (pipeline)");
    if (PQsendQueryPrepared(pg, "orders_lock", 1, vals, NULL, NULL, 0) &&
        PQsendQueryPrepared(pg, "voucher_reset", 4, vals, NULL, NULL, 0) && PQpipelineSync(pg))
        res = segment_read(pg, &synced);
    rec_backend(REC_PG, util_mono_us() - t0, synced);
    if (leave_pipeline(pg) != 0 || !synced || PQresultStatus(res) != PGRES_TUPLES_OK) {
        st = result_error(pg, res, "voucher_reset");
        goto cleanup;
    }
    if (PQntuples(res) != 1) {
        st = STORE_NOT_FOUND;
        goto cleanup;
    }
    voucher_read(res, out);
    st = STORE_OK;
cleanup:
    PQclear(res);
    return st;
}

store_status store_stats(PGconn *pg, cJSON *out)
{
    store_status st;
    PGresult *res = exec(pg, "stats_vouchers", 0, NULL);

    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
        st = result_error(pg, res, "stats_vouchers");
        goto cleanup;
    }
    for (int i = 0; i < PQntuples(res); i++) {
        int64_t initial = get_i64(res, i, 2), stock = get_i64(res, i, 3);
        int64_t orders = get_i64(res, i, 4), dups = get_i64(res, i, 5);
        cJSON *v = cJSON_CreateObject();
        char ts[32];

        if (v == NULL) {
            st = STORE_UNAVAILABLE;
            goto cleanup;
        }
        cJSON_AddItemToArray(out, v);
        /* Voucher ids come from a bigserial: small, so JSON numbers are exact. */
        cJSON_AddNumberToObject(v, "voucherId", (double)get_i64(res, i, 0));
        cJSON_AddStringToObject(v, "title", PQgetvalue(res, i, 1));
        cJSON_AddNumberToObject(v, "initialStock", (double)initial);
        cJSON_AddNumberToObject(v, "stock", (double)stock);
        cJSON_AddNumberToObject(v, "orders", (double)orders);
        cJSON_AddNumberToObject(v, "oversold", (double)(orders > initial ? orders - initial : 0));
        cJSON_AddNumberToObject(v, "duplicateUsers", (double)dups);
        cJSON_AddNumberToObject(v, "stockDrift", (double)((initial - stock) - orders));
        util_format_iso8601(get_i64(res, i, 6), ts, sizeof ts);
        cJSON_AddStringToObject(v, "beginTime", ts);
        util_format_iso8601(get_i64(res, i, 7), ts, sizeof ts);
        cJSON_AddStringToObject(v, "endTime", ts);
    }
    st = STORE_OK;
cleanup:
    PQclear(res);
    return st;
}
