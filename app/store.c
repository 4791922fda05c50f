/* store: Postgres access through prepared statements. */
#include "store.h"
#include "log.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct statement {
    const char *name;
    int nparams;
    const char *sql;
} statement;

/* One statement per operation keeps each call to one round trip. */
static const statement statements[] = {
    { "voucher_get", 1,
      "SELECT voucher_id, title, stock, initial_stock,"
      "       extract(epoch FROM begin_time)::bigint, extract(epoch FROM end_time)::bigint"
      "  FROM tb_voucher WHERE voucher_id = $1" },

    /* Duplicate check, deduction and insert in one statement: the row lock
     * taken by the UPDATE is held only until this statement's commit. */
    { "order_create", 3,
      "WITH dup AS ("
      "    SELECT 1 FROM tb_voucher_order WHERE user_id = $2 AND voucher_id = $1 LIMIT 1"
      "), upd AS ("
      "    UPDATE tb_voucher SET stock = stock - 1"
      "     WHERE voucher_id = $1 AND stock > 0 AND NOT EXISTS (SELECT 1 FROM dup)"
      "    RETURNING voucher_id"
      "), ins AS ("
      "    INSERT INTO tb_voucher_order (id, user_id, voucher_id)"
      "    SELECT $3, $2, voucher_id FROM upd RETURNING id"
      ")"
      "SELECT EXISTS (SELECT 1 FROM dup), EXISTS (SELECT 1 FROM ins)" },

    { "voucher_create", 4,
      "INSERT INTO tb_voucher (title, stock, initial_stock, begin_time, end_time)"
      "VALUES ($1, $2, $2, to_timestamp($3), to_timestamp($4)) RETURNING voucher_id" },

    { "voucher_reset", 4,
      "WITH v AS ("
      "    UPDATE tb_voucher SET stock = $2, initial_stock = $2,"
      "           begin_time = COALESCE(to_timestamp($3), begin_time),"
      "           end_time = COALESCE(to_timestamp($4), end_time),"
      "           update_time = now()"
      "     WHERE voucher_id = $1 RETURNING voucher_id"
      "), d AS ("
      "    DELETE FROM tb_voucher_order WHERE voucher_id IN (SELECT voucher_id FROM v)"
      "    RETURNING 1"
      ")"
      "SELECT (SELECT count(*) FROM v), (SELECT count(*) FROM d)" },

    { "stats_vouchers", 0,
      "SELECT v.voucher_id, v.title, v.initial_stock, v.stock,"
      "       COALESCE(o.orders, 0), COALESCE(o.dup_users, 0)"
      "  FROM tb_voucher v LEFT JOIN ("
      "       SELECT voucher_id, sum(n) AS orders, count(*) FILTER (WHERE n > 1) AS dup_users"
      "         FROM (SELECT voucher_id, user_id, count(*) AS n FROM tb_voucher_order"
      "                GROUP BY voucher_id, user_id) per_user"
      "        GROUP BY voucher_id) o USING (voucher_id)"
      " ORDER BY v.voucher_id" },
};

#define NSTATEMENTS (sizeof statements / sizeof statements[0])

int store_prepare(PGconn *pg)
{
    for (size_t i = 0; i < NSTATEMENTS; i++) {
        PGresult *res = PQprepare(pg, statements[i].name, statements[i].sql,
                                  statements[i].nparams, NULL);
        int ok = res != NULL && PQresultStatus(res) == PGRES_COMMAND_OK;
        if (!ok)
            log_error("store: prepare %s: %s", statements[i].name, PQerrorMessage(pg));
        PQclear(res);
        if (!ok)
            return -1;
    }
    return 0;
}

/* Maps a failed result to a status. Constraint violations are answers about
 * the data; everything else (lost connection, timeout, server shutting down,
 * a bug in our SQL) is 503, logged without leaking details to clients. */
static store_status result_error(PGconn *pg, PGresult *res, const char *what)
{
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;

    if (state != NULL) {
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

static PGresult *exec(PGconn *pg, const char *name, int n, const char *const *vals)
{
    return PQexecPrepared(pg, name, n, vals, NULL, NULL, 0);
}

static int64_t get_i64(const PGresult *res, int row, int col)
{
    return strtoll(PQgetvalue(res, row, col), NULL, 10);
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
    out->voucher_id = get_i64(res, 0, 0);
    snprintf(out->title, sizeof out->title, "%s", PQgetvalue(res, 0, 1));
    out->stock = get_i64(res, 0, 2);
    out->initial_stock = get_i64(res, 0, 3);
    out->begin_time = get_i64(res, 0, 4);
    out->end_time = get_i64(res, 0, 5);
    st = STORE_OK;
cleanup:
    PQclear(res);
    return st;
}

store_status store_order_create(PGconn *pg, int64_t order_id, int64_t voucher_id,
                                int64_t user_id)
{
    char v[24], u[24], o[24];
    const char *vals[3] = { v, u, o };
    store_status st;
    PGresult *res;

    snprintf(v, sizeof v, "%" PRId64, voucher_id);
    snprintf(u, sizeof u, "%" PRId64, user_id);
    snprintf(o, sizeof o, "%" PRId64, order_id);
    res = exec(pg, "order_create", 3, vals);
    if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
        st = result_error(pg, res, "order_create");
        goto cleanup;
    }
    if (PQgetvalue(res, 0, 0)[0] == 't')
        st = STORE_DUPLICATE;
    else if (PQgetvalue(res, 0, 1)[0] == 't')
        st = STORE_OK;
    else
        st = STORE_SOLD_OUT;
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
                                 int64_t begin_time, int64_t end_time)
{
    char v[24], s[24], b[24], e[24];
    const char *vals[4] = { v, s, begin_time >= 0 ? b : NULL, end_time >= 0 ? e : NULL };
    store_status st;
    PGresult *res;

    snprintf(v, sizeof v, "%" PRId64, voucher_id);
    snprintf(s, sizeof s, "%" PRId64, stock);
    snprintf(b, sizeof b, "%" PRId64, begin_time);
    snprintf(e, sizeof e, "%" PRId64, end_time);
    res = exec(pg, "voucher_reset", 4, vals);
    if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
        st = result_error(pg, res, "voucher_reset");
        goto cleanup;
    }
    st = get_i64(res, 0, 0) == 1 ? STORE_OK : STORE_NOT_FOUND;
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
    }
    st = STORE_OK;
cleanup:
    PQclear(res);
    return st;
}
