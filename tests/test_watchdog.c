/* test_watchdog: watchdog-mode leases against a real Redis (REDIS_URL),
 * with the watchdog timeout shortened to 1500 ms: renewal keeps a lock,
 * stops at the final release and when the owner field is gone, dies with
 * the process; fixed leases are never renewed; LOCK_LEASE_MS validation. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "t.h"
#include "t_lock.h"
#include "lock.h"
#include "watchdog.h"

#define WD_MS 1500L           /* WATCHDOG_TIMEOUT_MS for this run */
#define WD_MS_TEXT "1500"

static redisContext *rc;
static int next_owner = 1;

static void key_for(const char *suffix, char *buf, size_t n)
{
    snprintf(buf, n, "t:wd:%ld:%s", (long)getpid(), suffix);
}

static void del_lock(const char *key)
{
    redisReply *r = redisCommand(rc, "DEL %s redisson_lock_token:{%s}", key, key);
    freeReplyObject(r);
}

static long long pttl(const char *key)
{
    return tl_int(rc, "PTTL %s", key);
}

/* Smallest and largest PTTL seen while sampling for 'ms' (a missing key
 * shows as -2). The last sample is taken after the 'ms', however late the
 * loop ran. */
static void sample_pttl(const char *key, long ms, long long *lo, long long *hi)
{
    double end = t_now_ms() + (double)ms;
    int last = 0;

    *lo = 1LL << 60;
    *hi = -3;
    do {
        last = t_now_ms() >= end;
        long long t = pttl(key);
        if (t < *lo)
            *lo = t;
        if (t > *hi)
            *hi = t;
        if (!last)
            t_sleep_ms(20);
    } while (!last);
}

/* EVALSHA calls the server has run so far (INFO commandstats), -1 if unknown. */
static long long evalsha_calls(void)
{
    long long n = -1;
    const char *field = "cmdstat_evalsha:calls=";
    redisReply *r = T_CMD(rc, "INFO commandstats");
    const char *p = r != NULL && r->type == REDIS_REPLY_STRING ? strstr(r->str, field) : NULL;

    if (p != NULL)
        n = strtoll(p + strlen(field), NULL, 10);
    freeReplyObject(r);
    return n;
}

/* Generous deadline for an event that takes one tick (WD_MS / 3) when
 * the machine is idle. */
#define WD_EVENT_MS (10 * WD_MS)

/* Waits until a renewal tick has finished: its renewal counter moved. With
 * one lock held (one EVALSHA a tick) that is the tick's last step. 0, or -1
 * when no tick renewed anything within WD_EVENT_MS. */
static int after_tick(void)
{
    lock_counters a, b;
    double end = t_now_ms() + WD_EVENT_MS;

    lock_counters_get(&a);
    do {
        t_sleep_ms(5);
        lock_counters_get(&b);
        if (b.renewals != a.renewals)
            return 0;
    } while (t_now_ms() < end);
    return -1;
}

/* Waits until wd_count() is 'n'. 0, or -1 after WD_EVENT_MS. */
static int wait_wd_count(int n)
{
    double end = t_now_ms() + WD_EVENT_MS;

    while (wd_count() != n) {
        if (t_now_ms() > end)
            return -1;
        t_sleep_ms(5);
    }
    return 0;
}

/*---- cases ----*/

static void test_lease_validation(void)
{
    char *args[] = { "test_watchdog", NULL };

    /* 0 and negatives other than -1 are refused, -1 is watchdog mode */
    setenv("LOCK_LEASE_MS", "0", 1);
    T_EQ_I64(config_load(1, args), -1);
    setenv("LOCK_LEASE_MS", "-5", 1);
    T_EQ_I64(config_load(1, args), -1);
    setenv("LOCK_LEASE_MS", "-1", 1);
    if (T_EQ_I64(config_load(1, args), 0))
        T_EQ_I64(g_cfg.lock_lease_ms, LOCK_WATCHDOG);
    setenv("LOCK_LEASE_MS", "2500", 1);
    if (T_EQ_I64(config_load(1, args), 0))
        T_EQ_I64(g_cfg.lock_lease_ms, 2500);
    unsetenv("LOCK_LEASE_MS");
    setenv("WATCHDOG_TIMEOUT_MS", "10", 1);
    T_EQ_I64(config_load(1, args), -1);
    setenv("WATCHDOG_TIMEOUT_MS", WD_MS_TEXT, 1);
    if (T_EQ_I64(config_load(1, args), 0))
        T_EQ_I64(g_cfg.watchdog_timeout_ms, WD_MS);
}

/* Held for 3x the timeout: the lease never falls far, since every third
 * of it the renewal puts it back to the full timeout. */
static void test_watchdog_keeps_lock(void)
{
    char key[128], owner[96];
    lock_counters a, b;
    long long lo, hi;
    long left = -1;

    key_for("keeps", key, sizeof key);
    tl_owner(owner, sizeof owner, next_owner++);
    lock_counters_get(&a);
    double t0 = t_now_ms();
    if (!T_EQ_I64(lock_try_acquire(rc, key, owner, LOCK_WATCHDOG, NULL), LOCK_OK))
        return;
    long long t = pttl(key);
    double took = t_now_ms() - t0;
    /* The lease is the watchdog timeout: PTTL has lost at most the time
     * from the grant to the PTTL call (both inside 'took'), 1 ms rounding. */
    T_ASSERT(t <= WD_MS && (double)t >= (double)WD_MS - took - 2);
    sample_pttl(key, 3 * WD_MS, &lo, &hi);
    lock_counters_get(&b);
    printf("# held %ld ms in watchdog mode (timeout %ld ms): PTTL stayed in %lld..%lld ms, "
           "%llu renewals\n", 3 * WD_MS, WD_MS, lo, hi,
           (unsigned long long)(b.renewals - a.renewals));
    T_ASSERT(lo >= WD_MS / 3);
    T_ASSERT(b.renewals - a.renewals >= 7);
    T_EQ_I64(lock_release(rc, key, owner, LOCK_WATCHDOG, &left), LOCK_OK);
    T_EQ_I64(left, 0);
    T_EQ_I64(tl_int(rc, "EXISTS %s", key), 0);
    T_EQ_I64(wd_count(), 0);
    del_lock(key);
}

/* Reentered twice: the inner release keeps renewal, the final one stops it
 * before the release is sent. A copy of our hold planted afterwards (what
 * a late renewal could re-arm, redisson#7272) must expire untouched. */
static void test_final_release_stops_renewal(void)
{
    char key[128], owner[96];
    long long lo, hi;
    long left = -1;

    key_for("final", key, sizeof key);
    tl_owner(owner, sizeof owner, next_owner++);
    if (!T_EQ_I64(lock_try_acquire(rc, key, owner, LOCK_WATCHDOG, NULL), LOCK_OK))
        return;
    T_EQ_I64(lock_try_acquire(rc, key, owner, LOCK_WATCHDOG, NULL), LOCK_OK);
    T_EQ_I64(lock_release(rc, key, owner, LOCK_WATCHDOG, &left), LOCK_OK);
    T_EQ_I64(left, 1);
    T_EQ_I64(wd_count(), 1);
    sample_pttl(key, WD_MS + WD_MS / 3, &lo, &hi);
    T_ASSERT(lo > 0);                 /* held past a whole lease: still renewed at depth 1 */
    T_EQ_I64(lock_release(rc, key, owner, LOCK_WATCHDOG, &left), LOCK_OK);
    T_EQ_I64(left, 0);
    T_EQ_I64(wd_count(), 0);
    T_EQ_I64(tl_int(rc, "EXISTS %s", key), 0);

    redisReply *r = T_CMD(rc, "HSET %s %s 1", key, owner);
    freeReplyObject(r);
    r = T_CMD(rc, "PEXPIRE %s 1000", key);
    freeReplyObject(r);
    sample_pttl(key, 2 * WD_MS, &lo, &hi);
    printf("# after the final release a planted copy of the hold had PTTL <= %lld ms "
           "and expired\n", hi);
    T_ASSERT(hi <= 1000);
    T_EQ_I64(lo, -2);
    T_EQ_I64(tl_int(rc, "EXISTS %s", key), 0);
    del_lock(key);
}

/* The owner field vanished (expired, deleted, taken over): the renewal
 * reports 0 and drops the lock; the late release is "not owner". */
static void test_field_gone_stops_renewal(void)
{
    char key[128], owner[96];
    lock_counters a, b;

    key_for("gone", key, sizeof key);
    tl_owner(owner, sizeof owner, next_owner++);
    lock_counters_get(&a);
    if (!T_EQ_I64(lock_try_acquire(rc, key, owner, LOCK_WATCHDOG, NULL), LOCK_OK))
        return;
    T_EQ_I64(wd_count(), 1);
    del_lock(key);
    T_EQ_I64(wait_wd_count(0), 0);
    lock_counters_get(&b);
    T_EQ_I64(b.renew_lost - a.renew_lost, 1);
    T_EQ_I64(lock_release(rc, key, owner, LOCK_WATCHDOG, NULL), LOCK_NOT_OWNER);
    T_EQ_I64(tl_int(rc, "EXISTS %s", key), 0);
}

/* One lock key overwritten with a string (WRONGTYPE for HEXISTS) is
 * dropped without failing the batch its neighbour shares. In the same
 * transaction as the overwrite, the neighbour's PTTL is set far above the
 * watchdog timeout: back at or under WD_MS, it was renewed after the
 * overwrite (by the tick that dropped the bad key or a later one; a
 * failed batch would have counted an error and dropped nothing). */
static void test_overwritten_key_spares_the_batch(void)
{
    char bad[128], good[128], owner[96];
    lock_counters a, b;
    redisReply *r;

    key_for("overwritten", bad, sizeof bad);
    key_for("neighbour", good, sizeof good);
    tl_owner(owner, sizeof owner, next_owner++);
    T_EQ_I64(lock_try_acquire(rc, bad, owner, LOCK_WATCHDOG, NULL), LOCK_OK);
    T_EQ_I64(lock_try_acquire(rc, good, owner, LOCK_WATCHDOG, NULL), LOCK_OK);
    lock_counters_get(&a);
    r = T_CMD(rc, "MULTI");
    freeReplyObject(r);
    r = T_CMD(rc, "SET %s not-a-lock", bad);
    freeReplyObject(r);
    r = T_CMD(rc, "PEXPIRE %s 600000", good);
    freeReplyObject(r);
    r = T_CMD(rc, "EXEC");
    T_ASSERT(r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
             r->element[1]->type == REDIS_REPLY_INTEGER && r->element[1]->integer == 1);
    freeReplyObject(r);
    T_EQ_I64(wait_wd_count(1), 0);
    T_EQ_I64(after_tick(), 0);
    lock_counters_get(&b);
    T_EQ_I64(b.renew_errors - a.renew_errors, 0);
    T_EQ_I64(b.renew_lost - a.renew_lost, 1);  /* the bad key, not its neighbour */
    long long t = pttl(good);
    T_ASSERT(t > 0 && t <= WD_MS);
    T_EQ_I64(lock_release(rc, good, owner, LOCK_WATCHDOG, NULL), LOCK_OK);
    del_lock(bad);
    del_lock(good);
}

/* A tick that lands between wd_begin and the acquire reaching Redis sees
 * no field, and must not cancel the hold the acquire then creates. */
static void test_tick_during_acquire_keeps_hold(void)
{
    char key[128], owner[96];
    long long lo, hi;

    key_for("inflight", key, sizeof key);
    tl_owner(owner, sizeof owner, next_owner++);
    if (!T_EQ_I64(lock_try_acquire(rc, key, owner, LOCK_WATCHDOG, NULL), LOCK_OK))
        return;
    del_lock(key);                             /* the hold is lost ... */
    wd_begin(key, owner);                      /* ... a re-acquire is in flight */
    /* A tick finds no field: two ticks over (the first may have taken its
     * snapshot before wd_begin), their answers handled; the next is a
     * period away. */
    wd_counters w0, w1;
    long long e0 = evalsha_calls();
    double end = t_now_ms() + WD_EVENT_MS;
    wd_counters_get(&w0);
    do {
        t_sleep_ms(5);
        wd_counters_get(&w1);
    } while (w1.ticks < w0.ticks + 2 && wd_count() == 1 && t_now_ms() < end);
    T_ASSERT(w1.ticks >= w0.ticks + 2);
    long long e1 = evalsha_calls();
    if (!T_ASSERT(e1 >= e0 + 1))               /* they asked Redis: no field */
        printf("# EVALSHA calls %lld -> %lld, ticks %llu -> %llu\n", e0, e1,
               (unsigned long long)w0.ticks, (unsigned long long)w1.ticks);
    T_EQ_I64(wd_count(), 1);                   /* not cancelled */
    redisReply *r = T_CMD(rc, "HSET %s %s 1", key, owner);   /* it lands */
    freeReplyObject(r);
    r = T_CMD(rc, "PEXPIRE %s %ld", key, WD_MS);
    freeReplyObject(r);
    wd_end(key, owner, 1);
    T_EQ_I64(wd_count(), 1);
    sample_pttl(key, WD_MS + 500, &lo, &hi);
    T_ASSERT(lo > 0);                          /* held past a whole lease: renewed */
    wd_cancel(key, owner);
    wd_cancel(key, owner);
    T_EQ_I64(wd_count(), 0);
    del_lock(key);
}

/* A fixed lease in a process whose watchdog is busy renewing another lock
 * expires on time and its PTTL never goes up: gone no earlier than its
 * 500 ms after the grant was asked for, and before a watchdog lease
 * (WD_MS) could have run out. */
static void test_fixed_lease_not_renewed(void)
{
    char key[128], other[128], owner[96];
    long long prev = 1LL << 60;
    int rose = 0;

    key_for("fixed", key, sizeof key);
    key_for("fixed-neighbour", other, sizeof other);
    tl_owner(owner, sizeof owner, next_owner++);
    T_EQ_I64(lock_try_acquire(rc, other, owner, LOCK_WATCHDOG, NULL), LOCK_OK);
    double t0 = t_now_ms(), gone_at = -1;
    if (!T_EQ_I64(lock_try_acquire(rc, key, owner, 500, NULL), LOCK_OK))
        goto cleanup;
    while (t_now_ms() - t0 < 3 * WD_MS) {
        long long t = pttl(key);
        if (t == -2) {
            gone_at = t_now_ms() - t0;
            break;
        }
        if (t > prev)
            rose = 1;
        prev = t;
        t_sleep_ms(10);
    }
    printf("# fixed 500 ms lease beside a renewed watchdog lock: gone after %.0f ms\n", gone_at);
    T_EQ_I64(rose, 0);
    T_ASSERT(gone_at >= 495 && gone_at < WD_MS);
cleanup:
    T_EQ_I64(lock_release(rc, other, owner, LOCK_WATCHDOG, NULL), LOCK_OK);
    del_lock(key);
    del_lock(other);
}

/* With 'n' watchdog locks, WD_BATCH < n < 2 * WD_BATCH, all held: a tick
 * counts WD_BATCH renewals after its first EVALSHA, the n - WD_BATCH others
 * after its second. Waits until a tick has been counted whole: the counter
 * has moved since the call, by anything but WD_BATCH (mod n), which only
 * the first half of a tick leaves. (Called halfway through a tick, the
 * first move is the second half: the tick is over.) Wrong only if this
 * thread missed a whole period between two looks. 0, or -1 after
 * WD_EVENT_MS. */
static int after_whole_tick(long n)
{
    lock_counters a, b;
    double end = t_now_ms() + WD_EVENT_MS;

    lock_counters_get(&a);
    do {
        t_sleep_ms(2);
        lock_counters_get(&b);
        uint64_t d = b.renewals - a.renewals;
        if (d != 0 && d % (uint64_t)n != WD_BATCH % (uint64_t)n)
            return 0;
    } while (t_now_ms() < end);
    return -1;
}

/* 150 watchdog locks: each tick renews them all with two EVALSHA calls
 * (batches of 100 and 50), not one call per lock. */
static void test_renewal_is_batched(void)
{
    enum { NKEYS = 150 };
    char key[128], owner[96];
    lock_counters a, b;
    long long before, after;
    int held = 0;

    tl_owner(owner, sizeof owner, next_owner++);
    for (; held < NKEYS; held++) {
        char suffix[32];
        snprintf(suffix, sizeof suffix, "batch%d", held);
        key_for(suffix, key, sizeof key);
        if (!T_EQ_I64(lock_try_acquire(rc, key, owner, LOCK_WATCHDOG, NULL), LOCK_OK))
            break;
    }
    T_EQ_I64(wd_count(), NKEYS);
    T_EQ_I64(after_whole_tick(NKEYS), 0);
    lock_counters_get(&a);
    before = evalsha_calls();
    t_sleep_ms(2 * WD_MS);
    T_EQ_I64(after_whole_tick(NKEYS), 0);
    lock_counters_get(&b);
    after = evalsha_calls();
    uint64_t renewed = b.renewals - a.renewals;
    printf("# %d watchdog locks: %llu renewals with %lld EVALSHA calls\n", NKEYS,
           (unsigned long long)renewed, after - before);
    T_ASSERT(renewed >= 2 * NKEYS && renewed % NKEYS == 0);
    T_EQ_I64(after - before, 2 * (long long)(renewed / NKEYS));
    for (int i = 0; i < held; i++) {
        char suffix[32];
        snprintf(suffix, sizeof suffix, "batch%d", i);
        key_for(suffix, key, sizeof key);
        T_ASSERT(pttl(key) >= WD_MS / 3);
        T_EQ_I64(lock_release(rc, key, owner, LOCK_WATCHDOG, NULL), LOCK_OK);
        del_lock(key);
    }
    T_EQ_I64(wd_count(), 0);
}

/* A tick that fails (here: the server refuses EVALSHA to our user) is
 * logged and the schedule kept: the tick after the refusal ends renews,
 * well before a lease would end. While EVALSHA is refused the key's PTTL
 * is set far above the watchdog timeout, so that however long this thread
 * takes to lift the refusal the hold cannot expire meanwhile; back at or
 * under WD_MS, it was renewed after the failure. */
static void test_renewal_error_keeps_schedule(void)
{
    char key[128], owner[96];
    lock_counters a, b, c;
    redisReply *r;

    key_for("error", key, sizeof key);
    tl_owner(owner, sizeof owner, next_owner++);
    if (!T_EQ_I64(lock_try_acquire(rc, key, owner, LOCK_WATCHDOG, NULL), LOCK_OK))
        return;
    T_EQ_I64(after_tick(), 0);
    lock_counters_get(&a);
    r = T_CMD(rc, "ACL SETUSER default -evalsha");
    freeReplyObject(r);
    r = T_CMD(rc, "PEXPIRE %s 600000", key);
    freeReplyObject(r);
    double end = t_now_ms() + WD_EVENT_MS;
    do {
        t_sleep_ms(5);
        lock_counters_get(&b);
    } while (b.renew_errors == a.renew_errors && t_now_ms() < end);
    long long t_refused = pttl(key);
    r = T_CMD(rc, "ACL SETUSER default +evalsha");
    freeReplyObject(r);
    double t_lifted = t_now_ms();
    T_ASSERT(b.renew_errors - a.renew_errors >= 1);
    T_ASSERT(t_refused > WD_MS);               /* the failed tick renewed nothing */
    T_EQ_I64(wd_count(), 1);                   /* still registered */
    T_EQ_I64(after_tick(), 0);
    double gap = t_now_ms() - t_lifted;
    long long t = pttl(key);
    lock_counters_get(&c);
    printf("# a failed renewal tick (%llu refused): the next one renewed %.0f ms after the "
           "refusal was lifted, PTTL back to %lld ms\n",
           (unsigned long long)(c.renew_errors - a.renew_errors), gap, t);
    T_ASSERT(t > 0 && t <= WD_MS);
    T_EQ_I64(c.renew_lost - a.renew_lost, 0);
    /* On schedule, the next tick comes within a period (WD_MS / 3) of the
     * lift; one put off by a lease after the last refusal (a back-off)
     * would have let a real lease run out, and comes about WD_MS later. */
    T_ASSERT(gap < WD_MS * 2 / 3);
    T_EQ_I64(lock_release(rc, key, owner, LOCK_WATCHDOG, NULL), LOCK_OK);
    del_lock(key);
}

/* Child mode: take the lock in watchdog mode, say so, then wait to die. */
static int hold_child(const char *argv0, const char *key)
{
    char owner[96];
    redisContext *c;

    tl_setup(argv0);
    c = t_redis();
    tl_owner(owner, sizeof owner, 1);
    if (lock_try_acquire(c, key, owner, LOCK_WATCHDOG, NULL) != LOCK_OK)
        return 1;
    printf("held\n");
    fflush(stdout);
    for (;;)
        pause();
}

/* The holder process is SIGKILLed: nothing renews its lease any more, the
 * lock expires within the timeout, and a waiter then gets it. */
static void test_killed_holder_loses_lock(void)
{
    char key[128], owner[96], line[32];
    int fd = -1, status = 0;
    redisContext *c = t_redis();

    key_for("killed", key, sizeof key);
    tl_owner(owner, sizeof owner, next_owner++);
    char *args[] = { "test_watchdog", "--hold-child", key, NULL };
    pid_t pid = tl_spawn(args, &fd);
    if (!T_ASSERT(pid > 0))
        goto cleanup;
    if (!T_EQ_I64(tl_read_line(fd, line, sizeof line, 10000), 0) || !T_EQ_STR(line, "held")) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        goto cleanup;
    }
    t_sleep_ms(WD_MS + 500);                   /* past one timeout: the child renews */
    long long t = pttl(key);
    T_ASSERT(t > 0 && t <= WD_MS);             /* renewed, to the watchdog timeout */
    T_EQ_I64(lock_try_acquire(c, key, owner, 10000, NULL), LOCK_BUSY);

    kill(pid, SIGKILL);
    double t0 = t_now_ms();
    waitpid(pid, &status, 0);
    T_ASSERT(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    T_EQ_I64(lock_try_lock(c, key, owner, 3 * WD_MS, 10000, NULL), LOCK_OK);
    double dt = t_now_ms() - t0;
    printf("# holder SIGKILLed: a waiter got the lock %.0f ms later (timeout %ld ms)\n",
           dt, WD_MS);
    T_ASSERT(dt < 2 * WD_MS);                  /* its lease, not the waiter's budget */
    T_EQ_I64(lock_release(c, key, owner, 10000, NULL), LOCK_OK);
cleanup:
    if (fd >= 0)
        close(fd);
    redisFree(c);
    del_lock(key);
}

int main(int argc, char **argv)
{
    setenv("WATCHDOG_TIMEOUT_MS", WD_MS_TEXT, 1);
    if (argc == 3 && strcmp(argv[1], "--hold-child") == 0)
        return hold_child(argv[0], argv[2]);

    rc = t_redis();
    T_RUN(test_lease_validation);   /* before the threads: it rewrites g_cfg */
    tl_setup(argv[0]);
    if (!T_EQ_I64(wd_timeout_ms(), WD_MS))
        return t_done();
    T_RUN(test_watchdog_keeps_lock);
    T_RUN(test_final_release_stops_renewal);
    T_RUN(test_field_gone_stops_renewal);
    T_RUN(test_overwritten_key_spares_the_batch);
    T_RUN(test_tick_during_acquire_keeps_hold);
    T_RUN(test_fixed_lease_not_renewed);
    T_RUN(test_renewal_is_batched);
    T_RUN(test_renewal_error_keeps_schedule);
    T_RUN(test_killed_holder_loses_lock);
    lock_runtime_stop();
    redisFree(rc);
    return t_done();
}
