/* store_batch: group commit and the Redis-first consumer's batches. */
#include "store_batch.h"
#include "log.h"
#include "counters.h"
#include "store_fence.h"
#include "util.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* Group commit runs fence_batch (store_fence.c), then order_batch, in one
 * transaction; the Redis-first batch runs behind orders_lock
 * (store_locked_exec). */
static const store_statement statements[] = {
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
      "    SELECT stock, " STORE_SALE_EARLY " AS early, " STORE_SALE_LATE " AS late"
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
     * own first (orders_lock, store_locked_exec), so that this one's
     * snapshot, taken after the lock was granted, sees every order another
     * consumer committed for the voucher before: an entry persisted twice
     * (a consumer that was slow, not dead, when its entries were claimed)
     * is then 'fresh' for one of them only, and the stock is taken once.
     * The deduction is the optimistic one for n units ("stock >= n": the
     * database never goes below zero whatever Redis said); none of the
     * batch lands when it fails. An id already taken by another order
     * (another user or voucher: a Redis that lost its id counter and issued
     * it again) is not a re-delivery: the batch is refused ('clash'), never
     * skipped. The batch's sale ($4) must be the voucher's sale_gen, read
     * under the row lock that a reset takes too (voucher_reset): orders of
     * a sale that a reset ended are never written, and a reset never falls
     * between this read and the commit. Probes per order (OFFSET 0), as in
     * order_batch. */
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
};

#define NSTATEMENTS (sizeof statements / sizeof statements[0])

int store_batch_prepare(PGconn *pg)
{
    return store_statements_prepare(pg, statements, NSTATEMENTS);
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
    const char *vals[5] = { v, ids, users, keys, tokens };
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
        goto out;
    }
    if ((!early || PQsendQueryPrepared(pg, "async_commit", 0, NULL, NULL, NULL, 0)) &&
        (!fenced || store_fence_send_batch(pg, keys, tokens, horizon)) &&
        PQsendQueryPrepared(pg, "order_batch", 5, vals, NULL, NULL, 0) && PQpipelineSync(pg) &&
        (!early || (PQsendQueryPrepared(pg, "wait_durable_any", 1, &vals[1], NULL, NULL, 0) &&
                    PQpipelineSync(pg))))
        rc = call->sent = 0;
out:
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
        res = store_segment_read_until(pg, call_until(call), &synced);
    if (synced && call->early)
        dur = store_segment_read_until(pg, call_until(call), &dsynced);
    counters_backend(COUNTERS_PG, util_mono_us() - call->t0_us, synced);
    if (store_leave_pipeline(pg) != 0 || !synced || PQresultStatus(res) != PGRES_TUPLES_OK ||
        (size_t)PQntuples(res) != n) {
        st = store_result_error(pg, res, "order_batch");
        goto out;
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
out:
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
    int64_t fresh, now_gen;

    *inserted = 0;
    *pg_sale = 0;
    snprintf(v, sizeof v, "%" PRId64, voucher_id);
    snprintf(g, sizeof g, "%" PRId64, sale_gen);
    st = store_locked_exec(pg, "orders_persist", 4, vals, &res);
    if (st == STORE_OK && PQntuples(res) != 1)
        st = store_result_error(pg, res, "orders_persist");
    if (st != STORE_OK) {
        /* Two orders of the batch with one id (the 'clash' probe sees
         * only rows already there): refused for good, like a clash. */
        if (st == STORE_UNAVAILABLE && store_id_taken(res))
            st = STORE_CONFLICT;
        goto out;
    }
    fresh = store_get_i64(res, 0, 0);
    *inserted = store_get_i64(res, 0, 1);
    now_gen = *pg_sale = store_get_i64(res, 0, 4);
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
out:
    PQclear(res);
    free(ids);
    free(users);
    return st;
}

