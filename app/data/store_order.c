/* store_order: the one-statement order and its early lock release. */
#include "store_order.h"
#include "log.h"
#include "counters.h"
#include "store_fence.h"
#include "util.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* One statement per operation keeps each call to one round trip. */
static const store_statement statements[] = {
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
     * statement starts (STORE_SALE_OPEN; "sale" says which side it missed): the
     * instance's own check reads its clock, in whole seconds, against a
     * voucher cached for up to a second, before the buyer waited in a
     * queue. */
    { "order_create", 6,
      "WITH fence AS ("
      "    SELECT 1 FROM tb_lock_fence WHERE lock_key = $4::text AND token = $5::bigint"
      "), dup AS ("
      "    SELECT 1 FROM tb_voucher_order WHERE user_id = $2 AND voucher_id = $1 LIMIT 1"
      "), sale AS ("
      "    SELECT " STORE_SALE_EARLY " AS early, " STORE_SALE_LATE " AS late"
      "      FROM tb_voucher WHERE voucher_id = $1"
      "), upd AS ("
      "    UPDATE tb_voucher SET stock = stock - 1"
      "     WHERE voucher_id = $1 AND stock > 0 AND " STORE_SALE_OPEN
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
};

#define NSTATEMENTS (sizeof statements / sizeof statements[0])

int store_order_prepare(PGconn *pg)
{
    return store_statements_prepare(pg, statements, NSTATEMENTS);
}

/* The order statement's parameters, as text. */
typedef struct order_params {
    char v[24], u[24], id[24], tok[24];
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
}

/* The order statement's answer (does not free 'res'). */
static store_status order_result(PGconn *pg, const PGresult *res)
{
    if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
        return store_result_error(pg, (PGresult *)res, "order_create");
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

/* Queues the order's transaction in pipeline mode: fence_advance (when the
 * order carries a fencing token), order_create, and the Sync that commits
 * both. 1, or 0 when sending failed. */
static int send_order(PGconn *pg, const store_order *o, const order_params *p)
{
    if (o->fence_key != NULL && !store_fence_send_advance(pg, o))
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
        return store_result_error(pg, NULL, "order_create (pipeline)");
    if (send_order(pg, o, &p))
        res = store_segment_read(pg, &synced);
    counters_backend(COUNTERS_PG, util_mono_us() - t0, synced);
    st = synced ? order_result(pg, res) : store_result_error(pg, res, "order_create");
    PQclear(res);
    if (store_leave_pipeline(pg) != 0 && st == STORE_OK)
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
        return store_result_error(pg, NULL, "order_create (pipeline)");
    /* Two segments, each with its own Sync, hence its own transaction: the
     * order commits (without waiting for the flush) before the wait runs. */
    if (send_order(pg, o, &p)) {
        e->segments = 1;
        if (PQsendQueryPrepared(pg, "wait_durable", 1, &p.vals[2], NULL, NULL, 0) &&
            PQpipelineSync(pg))
            e->segments = 2;
    }
    if (e->segments == 0)
        return store_result_error(pg, NULL, "order_create (pipeline)");
    res = store_segment_read(pg, &synced);
    e->read = 1;
    counters_backend(COUNTERS_PG, util_mono_us() - e->t0, synced);
    st = synced ? order_result(pg, res) : store_result_error(pg, res, "order_create");
    PQclear(res);
    return st;
}

store_status store_order_finish_early(PGconn *pg, store_early *e, store_status st)
{
    PGresult *res = NULL;
    int synced = 0;
    int64_t t0 = util_mono_us();

    if (e->segments == 2 && e->read == 1) {
        res = store_segment_read(pg, &synced);
        counters_backend(COUNTERS_PG, util_mono_us() - t0, synced);
        if (st == STORE_OK && (!synced || PQresultStatus(res) != PGRES_TUPLES_OK ||
                               PQntuples(res) != 1))
            st = store_result_error(pg, res, "wait_durable");
        else if (st == STORE_OK && PQgetvalue(res, 0, 0)[0] != 't') {
            /* Reported, yet not there: its commit failed after the statement. */
            log_warn("store: order %" PRId64 " reported, but its commit failed", e->order_id);
            st = STORE_UNAVAILABLE;
        }
        PQclear(res);
    } else if (st == STORE_OK) {
        st = STORE_UNAVAILABLE;                  /* the wait was never sent */
    }
    if (store_leave_pipeline(pg) != 0 && st == STORE_OK)
        st = STORE_UNAVAILABLE;
    return st;
}
