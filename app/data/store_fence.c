/* store_fence: the fence rows' statements (tb_lock_fence). */
#include "store_fence.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* Fencing tokens are microseconds of the lock service's clock
 * (lua/lock_acquire.lua). A token is fresh while the fence horizon (ms; 0:
 * none) has not passed since, by Postgres's clock; an older one is refused
 * like a stale one, so that a row the sweep forgot (fence_sweep: older
 * than two horizons) cannot let its stale holder in. */
#define NOW_US "(extract(epoch FROM statement_timestamp()) * 1000000)::bigint"
#define TOKEN_FRESH(token, horizon) \
    "(" horizon " = 0 OR " token " >= " NOW_US " - " horizon " * 1000)"

static const store_statement statements[] = {
    /* The fence row, advanced by a statement of its own (locked until the
     * commit): before order_create (store_order.c), and first in the
     * step-by-step transaction (store_order_steps), whose other statements
     * follow. */
    { "fence_advance", 3,
      "INSERT INTO tb_lock_fence (lock_key, token) SELECT $1::text, $2::bigint"
      "     WHERE " TOKEN_FRESH("$2::bigint", "$3::bigint")
      "    ON CONFLICT (lock_key) DO UPDATE SET token = EXCLUDED.token"
      "     WHERE tb_lock_fence.token <= EXCLUDED.token RETURNING 1" },

    /* Group commit: the fence rows of the whole batch, then (order_batch,
     * store_batch.c) its orders, in one transaction and one round trip, for
     * the same reason as fence_advance before order_create. Keys in order,
     * so that two batches lock shared rows in the same order. */
    { "fence_batch", 3,
      "INSERT INTO tb_lock_fence (lock_key, token)"
      "SELECT k, t FROM unnest($1::text[], $2::bigint[]) AS r(k, t)"
      " WHERE k IS NOT NULL AND " TOKEN_FRESH("t", "$3::bigint") " ORDER BY k"
      "    ON CONFLICT (lock_key) DO UPDATE SET token = EXCLUDED.token"
      "     WHERE tb_lock_fence.token <= EXCLUDED.token" },

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
};

#define NSTATEMENTS (sizeof statements / sizeof statements[0])

int store_fence_prepare(PGconn *pg)
{
    return store_statements_prepare(pg, statements, NSTATEMENTS);
}

/* fence_advance's parameters, as text. */
typedef struct advance_params {
    char tok[24], horizon[24];
    const char *vals[3];
} advance_params;

static void advance_params_fill(advance_params *p, const store_order *o)
{
    snprintf(p->tok, sizeof p->tok, "%" PRId64, o->fence_token);
    snprintf(p->horizon, sizeof p->horizon, "%ld", o->fence_horizon_ms);
    p->vals[0] = o->fence_key;
    p->vals[1] = p->tok;
    p->vals[2] = p->horizon;
}

int store_fence_send_advance(PGconn *pg, const store_order *o)
{
    advance_params p;

    advance_params_fill(&p, o);
    return PQsendQueryPrepared(pg, "fence_advance", 3, p.vals, NULL, NULL, 0);
}

store_status store_fence_advance(PGconn *pg, const store_order *o)
{
    advance_params p;
    PGresult *res;
    store_status st;

    advance_params_fill(&p, o);
    res = store_exec(pg, "fence_advance", 3, p.vals);
    st = store_rows(pg, res, "fence_advance", STORE_STALE_TOKEN);
    PQclear(res);
    return st;
}

int store_fence_send_batch(PGconn *pg, const char *keys, const char *tokens,
                           const char *horizon_ms)
{
    const char *vals[3] = { keys, tokens, horizon_ms };

    return PQsendQueryPrepared(pg, "fence_batch", 3, vals, NULL, NULL, 0);
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
    res = store_exec(pg, "fence_sweep", 4, vals);
    if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
        st = store_result_error(pg, res, "fence_sweep");
        goto out;
    }
    snprintf(out->last, sizeof out->last, "%s", PQgetvalue(res, 0, 0));
    out->scanned = store_get_i64(res, 0, 1);
    out->deleted = store_get_i64(res, 0, 2);
    /* A key too long for 'last' cannot be resumed after: end the pass. */
    if (strlen(PQgetvalue(res, 0, 0)) >= sizeof out->last)
        out->scanned = 0;
    st = STORE_OK;
out:
    PQclear(res);
    return st;
}
