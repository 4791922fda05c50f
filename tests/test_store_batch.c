/* test_store_batch: a group commit's cost does not grow with the orders
 * sold before it, against the test Postgres (PG_DSN; the test makes a
 * database of its own from SQL_DIR/schema.sql and drops it). Needs
 * Postgres: not in make check.
 *
 * A prepared statement switches to a generic plan after five runs when it
 * costs no more than the custom ones, and keeps it until the tables are
 * analyzed again. Costed while the tables were small and the voucher's
 * orders unknown (and unnest() of a parameter guessed at 100 rows), the
 * generic plan of a batch read the fence table whole and the voucher's
 * orders whole into hash tables: every batch read every order sold before
 * it. The test seeds small tables (other vouchers' orders), analyzes them,
 * runs batches on one session with its generic plan, grows both tables by
 * GROWTH rows from another session (autovacuum off, so no analyze replans
 * in between), runs BATCHES more batches and counts, in
 * pg_stat_user_tables, the rows the two tables gave to scans meanwhile: a
 * few per buyer with index probes, GROWTH per batch with hash tables.
 * Counters, not a clock: no timing. */
#include "t.h"
#include "store_batch.h"
#include "store_prepare.h"

#include <libpq-fe.h>
#include <unistd.h>

#define BUYERS 6
#define WARMUP 10          /* batches before the growth: past the five custom plans */
#define BATCHES 20
#define GROWTH 20000

static char dbname[64];

/* PG_DSN's session, on database DB instead when DB is given (the first
 * "dbname" is PG_DSN expanded, the second overrides its database). */
static PGconn *connect_to(const char *db)
{
    const char *dsn = getenv("PG_DSN");
    const char *keys[] = { "dbname", "dbname", NULL };
    const char *vals[] = { dsn != NULL ? dsn : "", db, NULL };
    PGconn *pg = db == NULL ? PQconnectdb(vals[0]) : PQconnectdbParams(keys, vals, 1);

    if (PQstatus(pg) != CONNECTION_OK) {
        fprintf(stderr, "PG_DSN: %s", PQerrorMessage(pg));
        exit(2);
    }
    return pg;
}

static int run(PGconn *pg, const char *sql)
{
    PGresult *res = PQexec(pg, sql);
    ExecStatusType st = PQresultStatus(res);
    int ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;

    if (!ok)
        printf("# %.60s: %s", sql, PQerrorMessage(pg));
    PQclear(res);
    return ok;
}

static int64_t value(PGconn *pg, const char *sql)
{
    PGresult *res = PQexec(pg, sql);
    int64_t v = -1;

    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
        v = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
    else
        printf("# %.60s: %s", sql, PQerrorMessage(pg));
    PQclear(res);
    return v;
}

/* A database of our own with the schema, small tables, analyzed. */
static int make_db(void)
{
    PGconn *admin = connect_to(NULL);
    char sql[128], path[512], *schema = NULL;
    const char *dir = getenv("SQL_DIR");
    FILE *f = NULL;
    long len;
    int ok = 0;
    PGconn *pg = NULL;

    snprintf(dbname, sizeof dbname, "seckill_batch_%d", (int)getpid());
    snprintf(sql, sizeof sql, "CREATE DATABASE %s", dbname);
    if (!run(admin, sql))
        goto out;
    snprintf(path, sizeof path, "%s/schema.sql", dir != NULL ? dir : "sql");
    f = fopen(path, "rb");
    if (f == NULL || fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 ||
        fseek(f, 0, SEEK_SET) != 0) {
        printf("# cannot read %s\n", path);
        goto out;
    }
    schema = calloc(1, (size_t)len + 1);
    if (schema == NULL || fread(schema, 1, (size_t)len, f) != (size_t)len)
        goto out;
    pg = connect_to(dbname);
    ok = run(pg, schema) &&
         run(pg, "INSERT INTO tb_voucher (title, stock, initial_stock, begin_time, end_time)"
                 " SELECT 'batch', 1000000, 1000000, now() - interval '1 hour',"
                 "        now() + interval '1 hour' FROM generate_series(1, 9)") &&
         run(pg, "INSERT INTO tb_voucher_order (id, user_id, voucher_id)"
                 " SELECT 5000000 + g, 5000000 + g, 2 + g % 8 FROM generate_series(1, 2000) g") &&
         run(pg, "INSERT INTO tb_lock_fence SELECT 'lock:seed:' || g, g"
                 "  FROM generate_series(1, 2000) g") &&
         run(pg, "ALTER TABLE tb_voucher_order SET (autovacuum_enabled = off)") &&
         run(pg, "ALTER TABLE tb_lock_fence SET (autovacuum_enabled = off)") &&
         run(pg, "ANALYZE");
out:
    if (pg != NULL)
        PQfinish(pg);
    if (f != NULL)
        fclose(f);
    free(schema);
    PQfinish(admin);
    return ok;
}

static void drop_db(void)
{
    PGconn *admin = connect_to(NULL);
    char sql[128];

    snprintf(sql, sizeof sql, "DROP DATABASE IF EXISTS %s WITH (FORCE)", dbname);
    run(admin, sql);
    PQfinish(admin);
}

/* Batch I of BUYERS new buyers of voucher 1, each with a fence key:
 * the group commit (stock strategy batched). */
static int sale_batch(PGconn *pg, int i)
{
    store_order o[BUYERS];
    store_status results[BUYERS];
    char keys[BUYERS][48];

    for (int k = 0; k < BUYERS; k++) {
        int64_t u = 1000000 + (int64_t)i * BUYERS + k;
        snprintf(keys[k], sizeof keys[k], "lock:order:%lld:1", (long long)u);
        o[k] = (store_order){ .order_id = u, .voucher_id = 1, .user_id = u,
                              .fence_key = keys[k], .fence_token = 7 };
    }
    if (store_order_batch(pg, o, BUYERS, results) != STORE_OK)
        return 0;
    for (int k = 0; k < BUYERS; k++)
        if (results[k] != STORE_OK)
            return 0;
    return 1;
}

/* Batch I of BUYERS orders of voucher 1 admitted in Redis: the stream
 * consumer's persist (stock strategy redis). */
static int stream_batch(PGconn *pg, int i)
{
    store_order o[BUYERS];
    int64_t inserted = 0, sale;

    for (int k = 0; k < BUYERS; k++) {
        int64_t u = 1000000 + (int64_t)i * BUYERS + k;
        o[k] = (store_order){ .order_id = u, .voucher_id = 1, .user_id = u };
    }
    return store_orders_persist(pg, 1, 1, o, BUYERS, &inserted, &sale) == STORE_OK && inserted == BUYERS;
}

/* Rows the two tables gave to scans so far (sequential and through an
 * index), and the orders inserted, as the statistics say. */
static const char *const SCANNED =
    "SELECT sum(coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0))::bigint"
    "  FROM pg_stat_user_tables WHERE relname IN ('tb_voucher_order', 'tb_lock_fence')";
static const char *const INSERTED =
    "SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'tb_voucher_order'";

/* 'warmup' batches of 'one', GROWTH rows added to each table, BATCHES
 * more, on a session set up as the service sets up its own (store_prepare):
 * the rows the tables gave to scans during those, or -1. */
static int64_t rows_read_after_growth(int (*one)(PGconn *, int), int warmup)
{
    PGconn *pg = NULL, *other = NULL;
    int64_t before, want, read = -1;
    char sql[256];

    if (!T_ASSERT(make_db()))
        goto out;
    pg = connect_to(dbname);
    other = connect_to(dbname);
    if (!T_ASSERT(store_prepare(pg) == 0))
        goto out;
    for (int i = 0; i < warmup; i++)
        if (!T_ASSERT(one(pg, i)))
            goto out;
    snprintf(sql, sizeof sql,
             "INSERT INTO tb_voucher_order (id, user_id, voucher_id)"
             " SELECT g, g, 1 FROM generate_series(1, %d) g", GROWTH);
    if (!T_ASSERT(run(other, sql)))
        goto out;
    snprintf(sql, sizeof sql,
             "INSERT INTO tb_lock_fence SELECT 'lock:other:' || g, g FROM generate_series(1, %d) g",
             GROWTH);
    if (!T_ASSERT(run(other, sql)) || !T_ASSERT(run(other, "SET stats_fetch_consistency = none")))
        goto out;
    want = value(other, INSERTED);
    before = value(other, SCANNED);
    for (int i = warmup; i < warmup + BATCHES; i++)
        if (!T_ASSERT(one(pg, i)))
            goto out;
    /* A session's counters reach the shared statistics when it is idle
     * (at most once a second): wait until they show its inserts. */
    T_ASSERT(run(pg, "SELECT pg_stat_force_next_flush()"));
    want += (int64_t)BATCHES * BUYERS;
    for (int tries = 0; tries < 100 && value(other, INSERTED) < want; tries++)
        usleep(50 * 1000);
    if (T_EQ_I64(value(other, INSERTED) >= want, 1))
        read = value(other, SCANNED) - before;
    printf("# %d batches of %d after %d rows in each table: %lld rows read\n", BATCHES,
           BUYERS, GROWTH, (long long)read);
out:
    if (pg != NULL)
        PQfinish(pg);
    if (other != NULL)
        PQfinish(other);
    drop_db();
    return read;
}

/* Index probes: a few rows per buyer (about 6). Hash tables or scans:
 * GROWTH or more per batch. Less than one read of one table in all. */
static void test_a_group_commit_reads_its_buyers_not_the_orders_sold_before(void)
{
    int64_t read = rows_read_after_growth(sale_batch, WARMUP);

    T_ASSERT(read >= 0 && read < GROWTH);
}

static void test_a_stream_batch_reads_its_orders_not_the_orders_persisted_before(void)
{
    int64_t read = rows_read_after_growth(stream_batch, WARMUP);

    T_ASSERT(read >= 0 && read < GROWTH);
}

/* Postgres plans the first five runs of a prepared statement for their
 * parameters (custom plans) and later ones too when the generic plan costs
 * more than their average. For a voucher whose orders were all written
 * since the last ANALYZE such a plan read the buyer's duplicate check
 * through idx_voucher_order_voucher, every order of the voucher per buyer
 * (app/data/store.c, store_session_setup). The service's sessions keep the generic
 * plan from the first run on. */
static void test_a_session_runs_the_batch_statements_on_their_generic_plans(void)
{
    PGconn *pg = NULL;
    PGresult *res = NULL;

    if (!T_ASSERT(make_db()))
        goto out;
    pg = connect_to(dbname);
    if (!T_ASSERT(store_prepare(pg) == 0))
        goto out;
    for (int i = 0; i < WARMUP; i++)
        if (!T_ASSERT(sale_batch(pg, i)))
            goto out;
    res = PQexec(pg, "SELECT name, generic_plans, custom_plans FROM pg_prepared_statements"
                     " WHERE name IN ('fence_batch', 'order_batch') ORDER BY name");
    if (!T_ASSERT(PQresultStatus(res) == PGRES_TUPLES_OK) || !T_EQ_I64(PQntuples(res), 2))
        goto out;
    for (int r = 0; r < 2; r++) {
        printf("# %s: %s generic, %s custom\n", PQgetvalue(res, r, 0), PQgetvalue(res, r, 1),
               PQgetvalue(res, r, 2));
        T_EQ_I64(strtoll(PQgetvalue(res, r, 1), NULL, 10), WARMUP);
        T_EQ_I64(strtoll(PQgetvalue(res, r, 2), NULL, 10), 0);
    }
out:
    PQclear(res);
    if (pg != NULL)
        PQfinish(pg);
    drop_db();
}

int main(void)
{
    T_RUN(test_a_group_commit_reads_its_buyers_not_the_orders_sold_before);
    T_RUN(test_a_stream_batch_reads_its_orders_not_the_orders_persisted_before);
    T_RUN(test_a_session_runs_the_batch_statements_on_their_generic_plans);
    return t_done();
}
