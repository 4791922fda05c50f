/* store_voucher: the voucher's rows and the per-voucher stats. */
#include "store_voucher.h"
#include "util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

static const store_statement statements[] = {
    { "voucher_get", 1,
      "SELECT voucher_id, title, stock, initial_stock,"
      "       extract(epoch FROM begin_time)::bigint, extract(epoch FROM end_time)::bigint,"
      "       sale_gen"
      "  FROM tb_voucher WHERE voucher_id = $1" },

    /* Every voucher: the streams a Redis Cluster's consumers read. */
    { "voucher_ids", 0, "SELECT voucher_id FROM tb_voucher ORDER BY voucher_id" },

    /* The buyers of a voucher, to rebuild its Redis state. */
    { "voucher_buyers", 1, "SELECT user_id FROM tb_voucher_order WHERE voucher_id = $1" },

    { "voucher_create", 4,
      "INSERT INTO tb_voucher (title, stock, initial_stock, begin_time, end_time)"
      "VALUES ($1, $2, $2, to_timestamp($3), to_timestamp($4)) RETURNING voucher_id" },

    /* After orders_lock in the same transaction (store_voucher_reset, by
     * store_locked_exec): the DELETE reads the orders committed when the
     * statement starts, so the row lock comes first, in a statement of its
     * own; otherwise a consumer's batch committed while the UPDATE waited
     * for the lock would outlive the reset. */
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

int store_voucher_prepare(PGconn *pg)
{
    return store_statements_prepare(pg, statements, NSTATEMENTS);
}

/* Row 0 of a result whose first columns are voucher_get's. */
static void voucher_read(const PGresult *res, store_voucher *out)
{
    out->voucher_id = store_get_i64(res, 0, 0);
    snprintf(out->title, sizeof out->title, "%s", PQgetvalue(res, 0, 1));
    out->stock = store_get_i64(res, 0, 2);
    out->initial_stock = store_get_i64(res, 0, 3);
    out->begin_time = store_get_i64(res, 0, 4);
    out->end_time = store_get_i64(res, 0, 5);
    out->sale_gen = store_get_i64(res, 0, 6);
}

/* Prepared statement 'name' with the voucher id as its one parameter, its
 * status as store_rows gives it ('none': what no row means). The caller
 * clears '*res'. */
static store_status by_voucher(PGconn *pg, const char *name, int64_t voucher_id,
                               store_status none, PGresult **res)
{
    char id[24];
    const char *vals[1] = { id };

    snprintf(id, sizeof id, "%" PRId64, voucher_id);
    *res = store_exec(pg, name, 1, vals);
    return store_rows(pg, *res, name, none);
}

store_status store_voucher_get(PGconn *pg, int64_t voucher_id, store_voucher *out)
{
    PGresult *res;
    store_status st = by_voucher(pg, "voucher_get", voucher_id, STORE_NOT_FOUND, &res);

    if (st == STORE_OK)
        voucher_read(res, out);
    PQclear(res);
    return st;
}

store_status store_voucher_buyers(PGconn *pg, int64_t voucher_id, int64_t **users, size_t *n)
{
    PGresult *res;
    store_status st;

    *users = NULL;
    *n = 0;
    st = by_voucher(pg, "voucher_buyers", voucher_id, STORE_OK, &res);
    if (st == STORE_OK) {
        *n = (size_t)PQntuples(res);
        *users = xmalloc(sizeof **users * (*n + 1));
        for (size_t i = 0; i < *n; i++)
            (*users)[i] = store_get_i64(res, (int)i, 0);
    }
    PQclear(res);
    return st;
}

store_status store_voucher_ids(PGconn *pg, int64_t **ids, size_t *n)
{
    PGresult *res = store_exec(pg, "voucher_ids", 0, NULL);
    store_status st = store_rows(pg, res, "voucher_ids", STORE_OK);

    *ids = NULL;
    *n = 0;
    if (st == STORE_OK) {
        *n = (size_t)PQntuples(res);
        *ids = xmalloc(sizeof **ids * (*n + 1));
        for (size_t i = 0; i < *n; i++)
            (*ids)[i] = store_get_i64(res, (int)i, 0);
    }
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
    if ((st = store_simple(pg, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")) != STORE_OK)
        goto out;
    open = 1;
    if ((st = store_voucher_get(pg, voucher_id, v)) != STORE_OK ||
        (st = store_voucher_buyers(pg, voucher_id, users, n)) != STORE_OK)
        goto out;
    st = store_simple(pg, "COMMIT");
    open = 0;
out:
    if (open && PQstatus(pg) == CONNECTION_OK) {
        PGresult *res = store_timed_exec(pg, "ROLLBACK");    /* read only: nothing to undo */
        PQclear(res);
    }
    if (st != STORE_OK) {
        free(*users);
        *users = NULL;
        *n = 0;
    }
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
    res = store_exec(pg, "voucher_create", 4, vals);
    if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
        st = store_result_error(pg, res, "voucher_create");
        goto out;
    }
    *voucher_id = store_get_i64(res, 0, 0);
    st = STORE_OK;
out:
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

    snprintf(v, sizeof v, "%" PRId64, voucher_id);
    snprintf(s, sizeof s, "%" PRId64, stock);
    snprintf(b, sizeof b, "%" PRId64, begin_time);
    snprintf(e, sizeof e, "%" PRId64, end_time);
    if ((st = store_locked_exec(pg, "voucher_reset", 4, vals, &res)) != STORE_OK)
        goto out;
    if (PQntuples(res) != 1) {
        st = STORE_NOT_FOUND;
        goto out;
    }
    voucher_read(res, out);
    st = STORE_OK;
out:
    PQclear(res);
    return st;
}

store_status store_stats(PGconn *pg, cJSON *out)
{
    store_status st;
    PGresult *res = store_exec(pg, "stats_vouchers", 0, NULL);

    if ((st = store_rows(pg, res, "stats_vouchers", STORE_OK)) != STORE_OK)
        goto out;
    for (int i = 0; i < PQntuples(res); i++) {
        int64_t initial = store_get_i64(res, i, 2), stock = store_get_i64(res, i, 3);
        int64_t orders = store_get_i64(res, i, 4), dups = store_get_i64(res, i, 5);
        cJSON *v = cJSON_CreateObject();
        char ts[32];

        if (v == NULL) {
            st = STORE_UNAVAILABLE;
            goto out;
        }
        cJSON_AddItemToArray(out, v);
        /* Voucher ids come from a bigserial: small, so JSON numbers are exact. */
        cJSON_AddNumberToObject(v, "voucherId", (double)store_get_i64(res, i, 0));
        cJSON_AddStringToObject(v, "title", PQgetvalue(res, i, 1));
        cJSON_AddNumberToObject(v, "initialStock", (double)initial);
        cJSON_AddNumberToObject(v, "stock", (double)stock);
        cJSON_AddNumberToObject(v, "orders", (double)orders);
        cJSON_AddNumberToObject(v, "oversold", (double)(orders > initial ? orders - initial : 0));
        cJSON_AddNumberToObject(v, "duplicateUsers", (double)dups);
        cJSON_AddNumberToObject(v, "stockDrift", (double)((initial - stock) - orders));
        util_format_iso8601(store_get_i64(res, i, 6), ts, sizeof ts);
        cJSON_AddStringToObject(v, "beginTime", ts);
        util_format_iso8601(store_get_i64(res, i, 7), ts, sizeof ts);
        cJSON_AddStringToObject(v, "endTime", ts);
    }
    st = STORE_OK;
out:
    PQclear(res);
    return st;
}
