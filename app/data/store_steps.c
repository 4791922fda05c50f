/* store_steps: the step-by-step order transaction and its stock steps. */
#include "store_steps.h"
#include "store_fence.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* The transaction's first statement is fence_advance (store_fence.c). */
static const store_statement statements[] = {
    /* The step-by-step transaction's duplicate check and sale window (no
     * row: no such voucher), then its stock steps and insert. */
    { "order_check", 2,
      "SELECT EXISTS (SELECT 1 FROM tb_voucher_order WHERE user_id = $2 AND voucher_id = $1),"
      "       " STORE_SALE_EARLY ", " STORE_SALE_LATE
      "  FROM tb_voucher WHERE voucher_id = $1" },
    { "stock_read", 1, "SELECT stock FROM tb_voucher WHERE voucher_id = $1" },
    { "stock_read_locked", 1, "SELECT stock FROM tb_voucher WHERE voucher_id = $1 FOR UPDATE" },
    { "stock_write", 2, "UPDATE tb_voucher SET stock = $2 WHERE voucher_id = $1" },
    { "stock_cas", 3, "UPDATE tb_voucher SET stock = $2 WHERE voucher_id = $1 AND stock = $3" },
    { "stock_decrement", 1,
      "UPDATE tb_voucher SET stock = stock - 1 WHERE voucher_id = $1 AND stock > 0" },
    { "order_insert", 3,
      "INSERT INTO tb_voucher_order (id, user_id, voucher_id) VALUES ($1, $2, $3)" },
};

#define NSTATEMENTS (sizeof statements / sizeof statements[0])

int store_steps_prepare(PGconn *pg)
{
    return store_statements_prepare(pg, statements, NSTATEMENTS);
}

/* One step of the transaction; '*rows' gets the rows returned or affected. */
static store_status step(PGconn *pg, const char *name, int n, const char *const *vals, int *rows,
                         int64_t *first)
{
    PGresult *res = store_exec(pg, name, n, vals);
    ExecStatusType es = PQresultStatus(res);
    store_status st = STORE_OK;

    if (es == PGRES_TUPLES_OK) {
        *rows = PQntuples(res);
        if (first != NULL && *rows > 0)
            *first = store_get_i64(res, 0, 0);
    } else if (es == PGRES_COMMAND_OK) {
        *rows = atoi(PQcmdTuples(res));
    } else {
        st = store_result_error(pg, res, name);
    }
    PQclear(res);
    return st;
}

/* order_check: STORE_OK, or why the order cannot be placed. */
static store_status order_check(PGconn *pg, const char *const *vu)
{
    PGresult *res = store_exec(pg, "order_check", 2, vu);
    store_status st = store_rows(pg, res, "order_check", STORE_NOT_FOUND);

    if (st == STORE_OK && PQgetvalue(res, 0, 1)[0] == 't')
        st = STORE_NOT_STARTED;
    else if (st == STORE_OK && PQgetvalue(res, 0, 2)[0] == 't')
        st = STORE_ENDED;
    else if (st == STORE_OK && PQgetvalue(res, 0, 0)[0] == 't')
        st = STORE_DUPLICATE;
    PQclear(res);
    return st;
}

store_status store_order_steps(PGconn *pg, const store_order *o, const store_stock_step *stock,
                               int delay_ms)
{
    char v[24], u[24], id[24];
    const char *vu[2] = { v, u };
    const char *ins[3] = { id, u, v };
    int64_t seen = 0;
    int rows = 0, open = 0;
    store_status st;

    snprintf(v, sizeof v, "%" PRId64, o->voucher_id);
    snprintf(u, sizeof u, "%" PRId64, o->user_id);
    snprintf(id, sizeof id, "%" PRId64, o->order_id);

    if ((st = store_simple(pg, "BEGIN")) != STORE_OK)
        goto out;
    open = 1;
    if (o->fence_key != NULL && (st = store_fence_advance(pg, o)) != STORE_OK)
        goto out;
    /* The sale window, by Postgres's clock, and one order per user: checked,
     * not enforced (the lock and the unique constraint must do that). */
    if ((st = order_check(pg, vu)) != STORE_OK)
        goto out;
    if (stock->read != NULL) {
        if ((st = stock->read(pg, o->voucher_id, &seen)) != STORE_OK)
            goto out;
        if (seen <= 0) {
            st = STORE_SOLD_OUT;
            goto out;
        }
    }
    if (delay_ms > 0) {
        struct timespec ts = { delay_ms / 1000, (long)(delay_ms % 1000) * 1000000L };
        nanosleep(&ts, NULL);
    }
    if ((st = stock->write(pg, o->voucher_id, seen, &rows)) != STORE_OK)
        goto out;
    if (rows == 0) {
        st = stock->unchanged;
        goto out;
    }
    if ((st = step(pg, "order_insert", 3, ins, &rows, NULL)) != STORE_OK)
        goto out;
    st = store_simple(pg, "COMMIT");
    open = 0;
out:
    /* Every early exit rolls back, so nothing half-done stays behind; a lost
     * connection rolls back on the server by itself. */
    if (open && PQstatus(pg) == CONNECTION_OK) {
        PGresult *res = store_timed_exec(pg, "ROLLBACK");
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
