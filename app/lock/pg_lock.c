/* pg_lock: per-key locks in Postgres (a lock table, advisory locks). */
#include "pg_lock.h"
#include "log.h"
#include "pg_wait.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char pg_lock_sql_acquire[] =
    "INSERT INTO tb_lock AS l (lock_key, owner, holds, token, expires_at)"
    " VALUES ($1, $2, 1, nextval('tb_lock_token_seq'),"
    "         clock_timestamp() + $3::bigint * interval '1 millisecond')"
    " ON CONFLICT (lock_key) DO UPDATE"
    "    SET holds = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_at > clock_timestamp()"
    "                     THEN l.holds + 1 ELSE 1 END,"
    "        owner = EXCLUDED.owner, token = EXCLUDED.token, expires_at = EXCLUDED.expires_at"
    "  WHERE l.expires_at <= clock_timestamp() OR l.owner = EXCLUDED.owner"
    " RETURNING token, holds";

const char pg_lock_sql_release[] =
    "WITH gone AS ("
    "    DELETE FROM tb_lock WHERE lock_key = $1 AND owner = $2"
    "       AND (holds <= 1 OR expires_at <= clock_timestamp())"
    "    RETURNING 0 AS holds, expires_at > clock_timestamp() AS live"
    "), kept AS ("
    "    UPDATE tb_lock SET holds = holds - 1,"
    "           expires_at = clock_timestamp() + $3::bigint * interval '1 millisecond'"
    "     WHERE lock_key = $1 AND owner = $2 AND holds > 1 AND expires_at > clock_timestamp()"
    "    RETURNING holds, true AS live"
    ") SELECT holds, live FROM gone UNION ALL SELECT holds, live FROM kept";

const char pg_lock_sql_sweep[] = "DELETE FROM tb_lock WHERE expires_at <= clock_timestamp()";

const char pg_lock_sql_advisory_try[] = "SELECT pg_try_advisory_lock($1::bigint)";
const char pg_lock_sql_advisory_unlock[] = "SELECT pg_advisory_unlock($1::bigint)";

/* One statement, its answer awaited at most 'wait_ms'; NULL when it
 * failed or timed out. */
static PGresult *run(PGconn *pg, int wait_ms, const char *sql, int n, const char *const *vals)
{
    PGresult *r = PQsendQueryParams(pg, sql, n, NULL, vals, NULL, NULL, 0)
                      ? pg_wait_collect(pg, wait_ms)
                      : NULL;
    ExecStatusType st = PQresultStatus(r);

    if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
        log_warn("postgres lock statement failed: %s", PQerrorMessage(pg));
        PQclear(r);
        return NULL;
    }
    return r;
}

lock_status pg_lock_table_acquire(PGconn *pg, int wait_ms, const char *key, const char *owner,
                              long lease_ms, int64_t *token, int *holds)
{
    char lease[24];
    const char *vals[3] = { key, owner, lease };
    PGresult *r;
    lock_status out;

    snprintf(lease, sizeof lease, "%ld", lease_ms);
    if ((r = run(pg, wait_ms, pg_lock_sql_acquire, 3, vals)) == NULL)
        return LOCK_ERR;
    if (PQntuples(r) == 0) {
        out = LOCK_BUSY;
    } else {
        out = LOCK_OK;
        if (token != NULL)
            *token = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
        if (holds != NULL)
            *holds = atoi(PQgetvalue(r, 0, 1));
    }
    PQclear(r);
    return out;
}

lock_status pg_lock_table_release(PGconn *pg, int wait_ms, const char *key, const char *owner,
                              long lease_ms, int *left)
{
    char lease[24];
    const char *vals[3] = { key, owner, lease };
    PGresult *r;
    lock_status out = LOCK_NOT_OWNER;

    if (left != NULL)
        *left = 0;
    snprintf(lease, sizeof lease, "%ld", lease_ms);
    if ((r = run(pg, wait_ms, pg_lock_sql_release, 3, vals)) == NULL)
        return LOCK_ERR;
    if (PQntuples(r) > 0 && strcmp(PQgetvalue(r, 0, 1), "t") == 0) {
        out = LOCK_OK;
        if (left != NULL)
            *left = atoi(PQgetvalue(r, 0, 0));
    }
    PQclear(r);
    return out;
}

long pg_lock_table_sweep(PGconn *pg, int wait_ms)
{
    PGresult *r = run(pg, wait_ms, pg_lock_sql_sweep, 0, NULL);
    long n;

    if (r == NULL)
        return -1;
    n = strtol(PQcmdTuples(r), NULL, 10);
    PQclear(r);
    return n;
}

/* One boolean answer of an advisory-lock function. */
static lock_status advisory(PGconn *pg, int wait_ms, const char *sql, int64_t key,
                            lock_status if_false)
{
    char k[24];
    const char *vals[1] = { k };
    PGresult *r;
    lock_status out;

    snprintf(k, sizeof k, "%" PRId64, key);
    if ((r = run(pg, wait_ms, sql, 1, vals)) == NULL)
        return LOCK_ERR;
    out = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "t") == 0 ? LOCK_OK : if_false;
    PQclear(r);
    return out;
}

lock_status pg_lock_advisory_try(PGconn *pg, int wait_ms, int64_t key)
{
    return advisory(pg, wait_ms, pg_lock_sql_advisory_try, key, LOCK_BUSY);
}

lock_status pg_lock_advisory_release(PGconn *pg, int wait_ms, int64_t key)
{
    return advisory(pg, wait_ms, pg_lock_sql_advisory_unlock, key, LOCK_NOT_OWNER);
}
