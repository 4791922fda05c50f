/* test_pg_lock: the Postgres locks (app/lock/pg_lock.c) against the test Postgres
 * (PG_DSN, sql/schema.sql loaded): the lock table's exclusion, reentry,
 * release by a non-owner, lease expiry (taken over by the next acquire,
 * and the late release refused), the sweeper's statement, tokens that
 * only grow; advisory locks per session, reentrant, not released by
 * another session, freed when their session ends -- also when the
 * holding process is killed; a stopped backend (SIGSTOP) given up after
 * the call's bound. Needs Postgres: not in make check. */
#include "t.h"
#include "pg_lock.h"

#include <signal.h>
#include <unistd.h>

#define WAIT_MS 5000            /* each statement's bound */

static PGconn *db(void)
{
    const char *dsn = getenv("PG_DSN");
    PGconn *pg = PQconnectdb(dsn != NULL ? dsn : "");
    if (PQstatus(pg) != CONNECTION_OK) {
        fprintf(stderr, "PG_DSN: %s", PQerrorMessage(pg));
        exit(2);
    }
    return pg;
}

static const char *fresh_key(char *buf, size_t n)
{
    static int k;
    snprintf(buf, n, "lock:test:%d:%d", (int)getpid(), ++k);
    return buf;
}

static void test_table_exclusion_reentry_not_owner(void)
{
    PGconn *pg = db();
    char key[64];
    int64_t t1 = 0, t2 = 0, t3 = 0;
    int holds = 0, left = -1;

    fresh_key(key, sizeof key);
    T_EQ_I64(pg_lock_table_acquire(pg, WAIT_MS, key, "A", 10000, &t1, &holds), LOCK_OK);
    T_EQ_I64(holds, 1);
    T_EQ_I64(pg_lock_table_acquire(pg, WAIT_MS, key, "B", 10000, NULL, NULL), LOCK_BUSY);
    T_EQ_I64(pg_lock_table_acquire(pg, WAIT_MS, key, "A", 10000, &t2, &holds), LOCK_OK);  /* reentry */
    T_EQ_I64(holds, 2);
    T_ASSERT(t2 > t1);
    T_EQ_I64(pg_lock_table_release(pg, WAIT_MS, key, "B", 10000, NULL), LOCK_NOT_OWNER); /* refused */
    /* still A's */
    T_EQ_I64(pg_lock_table_acquire(pg, WAIT_MS, key, "B", 10000, NULL, NULL), LOCK_BUSY);
    T_EQ_I64(pg_lock_table_release(pg, WAIT_MS, key, "A", 10000, &left), LOCK_OK);
    T_EQ_I64(left, 1);
    T_EQ_I64(pg_lock_table_acquire(pg, WAIT_MS, key, "B", 10000, NULL, NULL), LOCK_BUSY);
    T_EQ_I64(pg_lock_table_release(pg, WAIT_MS, key, "A", 10000, &left), LOCK_OK);
    T_EQ_I64(left, 0);
    /* released once too often */
    T_EQ_I64(pg_lock_table_release(pg, WAIT_MS, key, "A", 10000, NULL), LOCK_NOT_OWNER);
    T_EQ_I64(pg_lock_table_acquire(pg, WAIT_MS, key, "B", 10000, &t3, NULL), LOCK_OK);
    T_ASSERT(t3 > t2);
    T_EQ_I64(pg_lock_table_release(pg, WAIT_MS, key, "B", 10000, NULL), LOCK_OK);
    PQfinish(pg);
}

static void test_table_lease_expiry(void)
{
    PGconn *pg = db();
    char key[64], sql[256];
    int64_t ta = 0, tb = 0;
    int holds = 0;

    fresh_key(key, sizeof key);
    T_EQ_I64(pg_lock_table_acquire(pg, WAIT_MS, key, "A", 200, &ta, NULL), LOCK_OK);
    T_EQ_I64(pg_lock_table_acquire(pg, WAIT_MS, key, "B", 200, NULL, NULL), LOCK_BUSY);
    t_sleep_ms(300);
    /* expired: the next acquire takes the row over (no sweeper needed) */
    T_EQ_I64(pg_lock_table_acquire(pg, WAIT_MS, key, "B", 10000, &tb, &holds), LOCK_OK);
    T_EQ_I64(holds, 1);
    T_ASSERT(tb > ta);
    /* A's late release */
    T_EQ_I64(pg_lock_table_release(pg, WAIT_MS, key, "A", 200, NULL), LOCK_NOT_OWNER);
    T_EQ_I64(pg_lock_table_acquire(pg, WAIT_MS, key, "A", 200, NULL, NULL), LOCK_BUSY);
    T_EQ_I64(pg_lock_table_release(pg, WAIT_MS, key, "B", 10000, NULL), LOCK_OK);
    /* an expired reentrant hold starts over at 1, and its release says it expired */
    T_EQ_I64(pg_lock_table_acquire(pg, WAIT_MS, key, "A", 100, NULL, NULL), LOCK_OK);
    t_sleep_ms(200);
    T_EQ_I64(pg_lock_table_release(pg, WAIT_MS, key, "A", 100, NULL), LOCK_NOT_OWNER);
    /* the sweeper's statement deletes expired rows only */
    T_EQ_I64(pg_lock_table_acquire(pg, WAIT_MS, key, "A", 100, NULL, NULL), LOCK_OK);
    t_sleep_ms(200);
    T_ASSERT(pg_lock_table_sweep(pg, WAIT_MS) >= 1);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM tb_lock WHERE lock_key = '%s'", key);
    PGresult *r = PQexec(pg, sql);
    T_ASSERT(PQresultStatus(r) == PGRES_TUPLES_OK && strcmp(PQgetvalue(r, 0, 0), "0") == 0);
    PQclear(r);
    PQfinish(pg);
}

static void quiet(void *arg, const char *msg)
{
    (void)arg;
    (void)msg;                      /* pg_advisory_unlock's WARNING for a lock not held */
}

static void test_advisory_per_session(void)
{
    PGconn *a = db(), *b = db();
    int64_t key = 900000000000LL + getpid();

    PQsetNoticeProcessor(a, quiet, NULL);
    PQsetNoticeProcessor(b, quiet, NULL);
    T_EQ_I64(pg_lock_advisory_try(a, WAIT_MS, key), LOCK_OK);
    T_EQ_I64(pg_lock_advisory_try(b, WAIT_MS, key), LOCK_BUSY);
    /* reentrant in its session */
    T_EQ_I64(pg_lock_advisory_try(a, WAIT_MS, key), LOCK_OK);
    T_EQ_I64(pg_lock_advisory_release(b, WAIT_MS, key), LOCK_NOT_OWNER);     /* another session */
    T_EQ_I64(pg_lock_advisory_release(a, WAIT_MS, key), LOCK_OK);
    T_EQ_I64(pg_lock_advisory_try(b, WAIT_MS, key), LOCK_BUSY);              /* held once more */
    T_EQ_I64(pg_lock_advisory_release(a, WAIT_MS, key), LOCK_OK);
    T_EQ_I64(pg_lock_advisory_try(b, WAIT_MS, key), LOCK_OK);
    /* the session ends: its locks go */
    PQfinish(b);
    b = db();
    T_EQ_I64(pg_lock_advisory_try(a, WAIT_MS, key), LOCK_OK);
    T_EQ_I64(pg_lock_advisory_release(a, WAIT_MS, key), LOCK_OK);
    PQfinish(a);
    PQfinish(b);
}

/* The holding process killed: the server sees its socket close and ends
 * the session, which frees the lock, within milliseconds. */
static void test_advisory_holder_killed(void)
{
    PGconn *b = db();
    int64_t key = 910000000000LL + getpid();
    int fds[2];
    char c = 0;
    pid_t pid;
    double killed, took = -1;

    if (!T_ASSERT(pipe(fds) == 0))
        return;
    pid = fork();
    if (pid == 0) {
        PGconn *a = db();
        if (pg_lock_advisory_try(a, WAIT_MS, key) == LOCK_OK)
            (void)!write(fds[1], "h", 1);
        for (;;)
            pause();
    }
    T_ASSERT(read(fds[0], &c, 1) == 1 && c == 'h');
    T_EQ_I64(pg_lock_advisory_try(b, WAIT_MS, key), LOCK_BUSY);
    kill(pid, SIGKILL);
    killed = t_now_ms();
    while (t_now_ms() - killed < 10000) {
        if (pg_lock_advisory_try(b, WAIT_MS, key) == LOCK_OK) {
            took = t_now_ms() - killed;
            break;
        }
        t_sleep_ms(5);
    }
    printf("# advisory holder killed: lock free after %.0f ms\n", took);
    /* at once, with the holder's socket (a session left to notice it some
     * other way would hold the lock past this loop's 10 s); generous for a
     * busy machine */
    T_ASSERT(took >= 0 && took < 2500);
    close(fds[0]);
    close(fds[1]);
    PQfinish(b);
}

/* A backend that stops answering (SIGSTOP: its kernel still acknowledges,
 * so neither statement_timeout nor TCP ends the wait): each call gives up
 * after its bound, with the connection shut down. */
static void test_stopped_backend_bounded(void)
{
    for (int i = 0; i < 2; i++) {
        PGconn *pg = db();
        int pid = PQbackendPID(pg);
        char key[64];
        lock_status st;
        double t0, took;

        fresh_key(key, sizeof key);
        if (!T_ASSERT(kill(pid, SIGSTOP) == 0)) {
            PQfinish(pg);
            return;
        }
        t0 = t_now_ms();
        st = i == 0 ? pg_lock_table_acquire(pg, 300, key, "A", 10000, NULL, NULL)
                    : pg_lock_advisory_try(pg, 300, 920000000000LL + getpid());
        took = t_now_ms() - t0;
        kill(pid, SIGCONT);
        printf("# %s on a stopped backend: %s after %.0f ms (bound 300 ms)\n",
               i == 0 ? "table acquire" : "advisory try", st == LOCK_ERR ? "error" : "answer",
               took);
        T_EQ_I64(st, LOCK_ERR);
        T_ASSERT(took >= 250 && took < 2000);
        T_ASSERT(PQstatus(pg) == CONNECTION_BAD);
        PQfinish(pg);
    }
}

int main(void)
{
    T_RUN(test_table_exclusion_reentry_not_owner);
    T_RUN(test_table_lease_expiry);
    T_RUN(test_advisory_per_session);
    T_RUN(test_advisory_holder_killed);
    T_RUN(test_stopped_backend_bounded);
    return t_done();
}
