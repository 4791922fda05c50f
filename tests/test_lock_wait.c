/* test_lock_wait: lock_try_lock's pub/sub waiting against a real Redis
 * (REDIS_URL), with real threads and processes: hand-off latency, the lost
 * wake-up window, the wait budget, shared subscriptions, a message that
 * wakes every waiter, a broken subscriber connection, a subscriber that
 * cannot connect, Redisson interop, and mutual exclusion across processes. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "t.h"
#include "t_lock.h"
#include "lock.h"
#include "lock_wait.h"

#define HOLD_LEASE   10000L   /* holders' lease: a missed wake-up would cost this */
#define HANDOFFS     100
#define RACE_ROUNDS  300
#define HOOK_ROUNDS  50
#define JAVA_OWNER   "48203354-bbba-4f31-89f7-e840f01a0d35:1"   /* a Redisson-style id */

static redisContext *rc;      /* main thread's connection */
static atomic_int refuse_connects;   /* the lock runtime's connect function fails */
static atomic_int connects_refused;

/* The lock runtime's connect function (the subscriber's): t_redis_open,
 * unless a case makes it refuse, as a Redis that turns connections away. */
static redisContext *flaky_connect(char *err, size_t errlen)
{
    if (atomic_load(&refuse_connects)) {
        atomic_fetch_add(&connects_refused, 1);
        snprintf(err, errlen, "connection refused by the test");
        return NULL;
    }
    return t_redis_open(err, errlen);
}
static int next_owner = 1;    /* owner ids of this process (main thread only) */

static void key_for(const char *suffix, int i, char *buf, size_t n)
{
    snprintf(buf, n, "t:wait:%ld:%s:%d", (long)getpid(), suffix, i);
}

static void del_lock(const char *key)
{
    redisReply *r = redisCommand(rc, "DEL %s redisson_lock_token:{%s}", key, key);
    freeReplyObject(r);
}

/* One waiting thread: lock_try_lock, note when it returned, release. */
typedef struct waiter {
    char key[128];
    char owner[96];
    long wait_ms;
    long lease_ms;
    long hold_ms;             /* sleep while holding */
    lock_status st;
    double t_start, t_done;   /* t_now_ms() */
    pthread_t thread;
} waiter;

static void *waiter_main(void *p)
{
    waiter *w = p;
    redisContext *c = t_redis();
    lock_grant g;

    w->t_start = t_now_ms();
    w->st = lock_try_lock(c, w->key, w->owner, w->wait_ms, w->lease_ms, &g);
    w->t_done = t_now_ms();
    if (w->st == LOCK_OK) {
        if (w->hold_ms > 0)
            t_sleep_ms(w->hold_ms);
        if (lock_release(c, w->key, w->owner, w->lease_ms, NULL) != LOCK_OK)
            w->st = LOCK_ERR;
    }
    redisFree(c);
    return NULL;
}

static int waiter_start(waiter *w, const char *key, long wait_ms)
{
    memset(w, 0, sizeof *w);
    snprintf(w->key, sizeof w->key, "%s", key);
    tl_owner(w->owner, sizeof w->owner, next_owner++);
    w->wait_ms = wait_ms;
    w->lease_ms = HOLD_LEASE;
    return pthread_create(&w->thread, NULL, waiter_main, w) == 0;
}

/* Waits until some subscriber listens on the lock's channel (our waiter
 * got past its subscription). 0, or -1 after 'ms'. */
static int wait_subscribed(const char *key, long ms)
{
    char ch[256];
    double end = t_now_ms() + (double)ms;

    lock_channel_name(key, ch, sizeof ch);
    while (tl_numsub(rc, ch) < 1) {
        if (t_now_ms() > end)
            return -1;
        t_sleep_ms(1);
    }
    return 0;
}

/* Waits until nobody listens on the lock's channel and this process knows
 * no channel any more. 0, or -1 after 'ms'. */
static int wait_unsubscribed(const char *key, long ms)
{
    char ch[256];
    double end = t_now_ms() + (double)ms;

    lock_channel_name(key, ch, sizeof ch);
    while (tl_numsub(rc, ch) != 0 || lock_wait_channel_count() != 0) {
        if (t_now_ms() > end)
            return -1;
        t_sleep_ms(5);
    }
    return 0;
}

/* Waits until 'n' more lock attempts than 'base' (a lock_counters
 * .contended value) were refused: a waiter refused twice, once before it
 * subscribed and once on its retry after, is past the retry, on its way
 * into (or in) its wait. 0, or -1 after 'ms'. */
static int wait_refused(uint64_t base, uint64_t n, long ms)
{
    lock_counters now;
    double end = t_now_ms() + (double)ms;

    for (;;) {
        lock_counters_get(&now);
        if (now.contended - base >= n)
            return 0;
        if (t_now_ms() > end)
            return -1;
        t_sleep_ms(1);
    }
}

/*---- cases ----*/

/* Runs first. The subscriber thread and its connection exist only once
 * something waits: taking and releasing locks starts nothing, the first
 * wait does. */
static void test_subscriber_starts_on_first_wait(void)
{
    char key[128], holder[96], waiter_id[96];

    key_for("lazy", 0, key, sizeof key);
    tl_owner(holder, sizeof holder, next_owner++);
    tl_owner(waiter_id, sizeof waiter_id, next_owner++);
    T_EQ_I64(lock_wait_running(), 0);
    if (!T_EQ_I64(lock_try_acquire(rc, key, holder, HOLD_LEASE, NULL), LOCK_OK))
        return;
    T_EQ_I64(lock_try_lock(rc, key, waiter_id, 0, HOLD_LEASE, NULL), LOCK_BUSY);
    T_EQ_I64(lock_release(rc, key, holder, HOLD_LEASE, NULL), LOCK_OK);
    T_EQ_I64(lock_wait_running(), 0);
    T_EQ_I64(lock_try_acquire(rc, key, holder, HOLD_LEASE, NULL), LOCK_OK);
    T_EQ_I64(lock_try_lock(rc, key, waiter_id, 50, HOLD_LEASE, NULL), LOCK_BUSY);
    T_EQ_I64(lock_wait_running(), 1);
    T_EQ_I64(lock_release(rc, key, holder, HOLD_LEASE, NULL), LOCK_OK);
    del_lock(key);
}

/* A waiter blocked on a 10 s lease gets the lock through the release
 * message: every hand-off is a grant right after a wake-up by a message
 * (the counters), and none costs the lease (a lost message would). The
 * latencies are printed, not asserted: on a busy machine they are the
 * scheduler's. */
static void test_handoff_latency(void)
{
    char key[128], holder[96];
    double lat[HANDOFFS];
    lock_counters a, b;
    size_t n = 0;

    tl_owner(holder, sizeof holder, next_owner++);
    lock_counters_get(&a);
    for (int i = 0; i < HANDOFFS; i++) {
        waiter w;
        lock_counters c0;
        key_for("handoff", i, key, sizeof key);
        if (!T_EQ_I64(lock_try_acquire(rc, key, holder, HOLD_LEASE, NULL), LOCK_OK))
            break;
        lock_counters_get(&c0);
        if (!T_ASSERT(waiter_start(&w, key, 20000)))
            break;
        T_EQ_I64(wait_subscribed(key, 10000), 0);
        T_EQ_I64(wait_refused(c0.contended, 2, 10000), 0);   /* past its retry */
        double t_rel = t_now_ms();
        T_EQ_I64(lock_release(rc, key, holder, HOLD_LEASE, NULL), LOCK_OK);
        pthread_join(w.thread, NULL);
        T_EQ_I64(w.st, LOCK_OK);
        lat[n++] = w.t_done - t_rel;
        del_lock(key);
    }
    lock_counters_get(&b);
    if (!T_EQ_I64(n, HANDOFFS))
        return;
    double max = tl_percentile(lat, n, 100), p99 = tl_percentile(lat, n, 99),
           p50 = tl_percentile(lat, n, 50);
    printf("# hand-off release -> waiter acquired over %zu: p50 %.2f ms, p99 %.2f ms, "
           "max %.2f ms (lease %ld ms)\n", n, p50, p99, max, HOLD_LEASE);
    T_ASSERT(max < HOLD_LEASE / 2);
    T_EQ_I64(b.waits - a.waits, HANDOFFS);
    T_EQ_I64(b.wait_acquired - a.wait_acquired, HANDOFFS);
    T_EQ_I64(b.wake_samples - a.wake_samples, HANDOFFS);
    if (b.wake_samples > a.wake_samples)
        printf("# wake-up latency (message -> granted): mean %.0f us, max %llu us\n",
               (double)(b.wake_us_sum - a.wake_us_sum) / (double)(b.wake_samples - a.wake_samples),
               (unsigned long long)b.wake_us_max);
}

/* The injected race: the hook releases the holder's lock at a fixed point
 * of the waiter's path, so the release message is published before the
 * waiter subscribed (or before it blocked). */
static redisContext *hook_ctx;
static char hook_key[128], hook_holder[96];
static enum lock_hook_point hook_at;
static int hook_armed;        /* written by main before the waiter starts */

static void release_hook(enum lock_hook_point at, const char *key)
{
    if (!hook_armed || at != hook_at || strcmp(key, hook_key) != 0)
        return;
    hook_armed = 0;
    if (lock_release(hook_ctx, hook_key, hook_holder, HOLD_LEASE, NULL) != LOCK_OK)
        fprintf(stderr, "hook: release failed\n");
}

static void race_rounds(enum lock_hook_point at, const char *name)
{
    char key[128];
    double worst = 0;

    hook_ctx = t_redis();
    tl_owner(hook_holder, sizeof hook_holder, next_owner++);
    lock_set_test_hook(release_hook);
    for (int i = 0; i < HOOK_ROUNDS; i++) {
        waiter w;
        key_for(name, i, key, sizeof key);
        if (!T_EQ_I64(lock_try_acquire(rc, key, hook_holder, HOLD_LEASE, NULL), LOCK_OK))
            break;
        snprintf(hook_key, sizeof hook_key, "%s", key);
        hook_at = at;
        hook_armed = 1;
        if (!T_ASSERT(waiter_start(&w, key, 20000)))
            break;
        pthread_join(w.thread, NULL);
        T_EQ_I64(hook_armed, 0);      /* the release happened in the window */
        T_EQ_I64(w.st, LOCK_OK);
        if (w.t_done - w.t_start > worst)
            worst = w.t_done - w.t_start;
        del_lock(key);
    }
    lock_set_test_hook(NULL);
    redisFree(hook_ctx);
    printf("# %s: %d rounds, slowest acquire %.2f ms (lease %ld ms)\n", name, HOOK_ROUNDS,
           worst, HOLD_LEASE);
    T_ASSERT(worst < HOLD_LEASE / 2);         /* a lost release costs the lease */
}

static void test_release_before_subscribe_is_not_lost(void)
{
    race_rounds(LOCK_HOOK_BEFORE_SUBSCRIBE, "before-subscribe");
}

static void test_release_before_wait_is_banked(void)
{
    race_rounds(LOCK_HOOK_BEFORE_WAIT, "before-wait");
}

/* The same window without a hook: releases at random moments around the
 * waiter's start. None may cost a lease. */
static void test_release_race_repeated(void)
{
    char key[128], holder[96];
    double worst = 0;

    tl_owner(holder, sizeof holder, next_owner++);
    srand((unsigned)getpid());
    for (int i = 0; i < RACE_ROUNDS; i++) {
        waiter w;
        key_for("race", i, key, sizeof key);
        if (!T_EQ_I64(lock_try_acquire(rc, key, holder, HOLD_LEASE, NULL), LOCK_OK))
            break;
        if (!T_ASSERT(waiter_start(&w, key, 20000)))
            break;
        struct timespec ts = {0, (long)(rand() % 1500) * 1000L};
        nanosleep(&ts, NULL);
        T_EQ_I64(lock_release(rc, key, holder, HOLD_LEASE, NULL), LOCK_OK);
        pthread_join(w.thread, NULL);
        T_EQ_I64(w.st, LOCK_OK);
        if (w.t_done - w.t_start > worst)
            worst = w.t_done - w.t_start;
        del_lock(key);
    }
    printf("# random release timing: %d rounds, slowest acquire %.2f ms\n", RACE_ROUNDS, worst);
    T_ASSERT(worst < HOLD_LEASE / 2);         /* a lost release costs the lease */
}

/* tryLock(200 ms) on a held lock (10 s lease): false once its 200 ms are
 * spent, long before the lease ends, and nothing left subscribed.
 * tryLock(0) does not wait at all (its wait, subscription first, is never
 * counted). */
static void test_wait_budget_and_no_leftover_subscription(void)
{
    char key[128], holder[96], owner[96];
    lock_counters a, b;
    redisContext *c = t_redis();

    key_for("budget", 0, key, sizeof key);
    tl_owner(holder, sizeof holder, next_owner++);
    tl_owner(owner, sizeof owner, next_owner++);
    if (!T_EQ_I64(lock_try_acquire(rc, key, holder, HOLD_LEASE, NULL), LOCK_OK))
        goto cleanup;

    lock_counters_get(&a);
    double t0 = t_now_ms();
    T_EQ_I64(lock_try_lock(c, key, owner, 0, HOLD_LEASE, NULL), LOCK_BUSY);
    double t1 = t_now_ms();
    lock_counters_get(&b);
    T_ASSERT(t1 - t0 < HOLD_LEASE / 2);
    T_EQ_I64(b.waits - a.waits, 0);

    lock_grant g = {0, 0};
    t0 = t_now_ms();
    T_EQ_I64(lock_try_lock(c, key, owner, 200, HOLD_LEASE, &g), LOCK_BUSY);
    t1 = t_now_ms();
    printf("# tryLock(200 ms) on a held lock returned after %.1f ms\n", t1 - t0);
    T_ASSERT(t1 - t0 >= 199 && t1 - t0 < HOLD_LEASE / 2);
    T_ASSERT(g.ttl_ms > 0 && g.ttl_ms <= HOLD_LEASE);
    T_EQ_I64(wait_unsubscribed(key, 1000), 0);
    lock_counters_get(&a);
    T_EQ_I64(a.wait_timeouts - b.wait_timeouts, 1);

    /* the lock is still the holder's */
    T_EQ_I64(lock_release(rc, key, holder, HOLD_LEASE, NULL), LOCK_OK);
cleanup:
    redisFree(c);
    del_lock(key);
}

/* With no release message at all, the wait ends when the holder's lease
 * (300 ms) does, not when the waiter's budget (20 s) does: the TTL bounds
 * every round. Measured from before the holder's grant, so that the lease
 * cannot have started earlier. */
static void test_wait_bounded_by_holder_ttl(void)
{
    char key[128], holder[96], owner[96];
    redisContext *c = t_redis();

    key_for("ttlbound", 0, key, sizeof key);
    tl_owner(holder, sizeof holder, next_owner++);
    tl_owner(owner, sizeof owner, next_owner++);
    double t0 = t_now_ms();
    if (!T_EQ_I64(lock_try_acquire(rc, key, holder, 300, NULL), LOCK_OK))
        goto cleanup;
    T_EQ_I64(lock_try_lock(c, key, owner, 20000, HOLD_LEASE, NULL), LOCK_OK);
    double dt = t_now_ms() - t0;
    printf("# holder's 300 ms lease ran out, unannounced: waiter got it %.1f ms after the "
           "grant was asked for\n", dt);
    T_ASSERT(dt >= 295 && dt < 20000 / 2);
    T_EQ_I64(lock_release(c, key, owner, HOLD_LEASE, NULL), LOCK_OK);
cleanup:
    redisFree(c);
    del_lock(key);
}

/* Several waiters of one process share one subscription; each release
 * wakes one of them, and the last one out unsubscribes. */
static void test_waiters_share_one_subscription(void)
{
    enum { NW = 6 };
    char key[128], holder[96], ch[256];
    waiter w[NW];
    long long most = 0;
    lock_counters c0;

    key_for("shared", 0, key, sizeof key);
    lock_channel_name(key, ch, sizeof ch);
    tl_owner(holder, sizeof holder, next_owner++);
    if (!T_EQ_I64(lock_try_acquire(rc, key, holder, HOLD_LEASE, NULL), LOCK_OK))
        return;
    lock_counters_get(&c0);
    for (int i = 0; i < NW; i++) {
        if (!T_ASSERT(waiter_start(&w[i], key, 20000)))
            return;
    }
    T_EQ_I64(wait_subscribed(key, 10000), 0);
    /* every waiter subscribed and refused on its retry: all six are in */
    T_EQ_I64(wait_refused(c0.contended, 2 * NW, 10000), 0);
    most = tl_numsub(rc, ch);
    T_EQ_I64(most, 1);
    T_EQ_I64(lock_wait_channel_count(), 1);
    double t0 = t_now_ms();
    T_EQ_I64(lock_release(rc, key, holder, HOLD_LEASE, NULL), LOCK_OK);
    for (int i = 0; i < NW; i++) {
        pthread_join(w[i].thread, NULL);
        T_EQ_I64(w[i].st, LOCK_OK);
    }
    double dt = t_now_ms() - t0;
    printf("# %d waiters of one process passed the lock on in %.1f ms\n", NW, dt);
    T_ASSERT(dt < HOLD_LEASE / 2);            /* a lost wake-up costs the lease */
    T_EQ_I64(wait_unsubscribed(key, 1000), 0);
    del_lock(key);
}

/* A release message other than "0" (Redisson's read-unlock publishes "1")
 * wakes every waiter of the channel in this process, not one: each tries
 * again, finds the lock still held, and waits on. */
static void test_other_message_wakes_every_waiter(void)
{
    enum { NW = 3 };
    char key[128], holder[96], ch[256];
    lock_wait_counters a, b;
    waiter w[NW];
    int started = 0;
    double t0;

    key_for("wakeall", 0, key, sizeof key);
    lock_channel_name(key, ch, sizeof ch);
    tl_owner(holder, sizeof holder, next_owner++);
    if (!T_EQ_I64(lock_try_acquire(rc, key, holder, HOLD_LEASE, NULL), LOCK_OK))
        return;
    for (; started < NW; started++)
        if (!T_ASSERT(waiter_start(&w[started], key, 20000)))
            break;
    T_EQ_I64(wait_subscribed(key, 2000), 0);
    t_sleep_ms(100);                           /* all three blocked in their wait */
    lock_wait_counters_get(&a);
    freeReplyObject(T_CMD(rc, "PUBLISH %s 1", ch));
    for (t0 = t_now_ms(); t_now_ms() - t0 < 2000; t_sleep_ms(5)) {
        lock_wait_counters_get(&b);
        if (b.wakeups - a.wakeups >= NW)
            break;
    }
    printf("# a \"1\" message woke %llu of %d waiters\n",
           (unsigned long long)(b.wakeups - a.wakeups), NW);
    T_EQ_I64(b.wakeups - a.wakeups, NW);
    T_EQ_I64(b.messages - a.messages, 1);
    T_EQ_I64(lock_release(rc, key, holder, HOLD_LEASE, NULL), LOCK_OK);
    for (int i = 0; i < started; i++) {
        pthread_join(w[i].thread, NULL);
        T_EQ_I64(w[i].st, LOCK_OK);
    }
    del_lock(key);
}

/* The subscriber connection is killed while a waiter waits, and the lock
 * is released before it is back: the message is lost, but the
 * re-subscription wakes the waiter long before the holder's lease ends. */
static void test_subscriber_connection_lost(void)
{
    char key[128], holder[96];
    lock_wait_counters a, b;
    waiter w;

    key_for("reconnect", 0, key, sizeof key);
    tl_owner(holder, sizeof holder, next_owner++);
    if (!T_EQ_I64(lock_try_acquire(rc, key, holder, HOLD_LEASE, NULL), LOCK_OK))
        return;
    if (!T_ASSERT(waiter_start(&w, key, 20000)))
        return;
    T_EQ_I64(wait_subscribed(key, 2000), 0);
    lock_wait_counters_get(&a);
    redisReply *r = T_CMD(rc, "CLIENT KILL TYPE pubsub");
    freeReplyObject(r);
    double t0 = t_now_ms();
    T_EQ_I64(lock_release(rc, key, holder, HOLD_LEASE, NULL), LOCK_OK);
    pthread_join(w.thread, NULL);
    double dt = w.t_done - t0;
    lock_wait_counters_get(&b);
    printf("# release during a subscriber outage: waiter got the lock after %.1f ms\n", dt);
    T_EQ_I64(w.st, LOCK_OK);
    T_ASSERT(dt < HOLD_LEASE / 2);            /* not the holder's lease */
    T_ASSERT(b.reconnects - a.reconnects >= 1);
    T_EQ_I64(wait_unsubscribed(key, 1000), 0);
    del_lock(key);
}

/* The subscriber loses its connection while a waiter waits, and cannot
 * open another: the waiter falls back to a wait bounded by the holder's
 * TTL, so the release is not seen but the lock is had when the lease ends.
 * Once the subscriber connects again (with back-off), a release wakes a
 * waiter at once again. */
static void test_subscriber_cannot_connect(void)
{
    char key[128], holder[96];
    lock_wait_counters a, b;
    waiter w;
    double t0, t1;

    key_for("down", 0, key, sizeof key);
    tl_owner(holder, sizeof holder, next_owner++);
    if (!T_EQ_I64(lock_try_acquire(rc, key, holder, 1000, NULL), LOCK_OK))
        goto out;
    t0 = t_now_ms();
    if (!T_ASSERT(waiter_start(&w, key, 5000)))
        goto out;
    T_EQ_I64(wait_subscribed(key, 2000), 0);
    lock_wait_counters_get(&a);
    atomic_store(&refuse_connects, 1);
    freeReplyObject(T_CMD(rc, "CLIENT KILL TYPE pubsub"));
    for (t1 = t_now_ms(); atomic_load(&connects_refused) == 0 && t_now_ms() - t1 < 2000;)
        t_sleep_ms(5);
    T_ASSERT(atomic_load(&connects_refused) > 0);
    t1 = t_now_ms();
    T_EQ_I64(lock_release(rc, key, holder, 1000, NULL), LOCK_OK);
    pthread_join(w.thread, NULL);
    printf("# subscriber down: released %.0f ms into a 1000 ms lease, the waiter got the "
           "lock %.0f ms in\n", t1 - t0, w.t_done - t0);
    T_EQ_I64(w.st, LOCK_OK);
    T_ASSERT(w.t_done - t0 >= 900 && w.t_done - t0 < 3000);
    del_lock(key);

    atomic_store(&refuse_connects, 0);
    for (t1 = t_now_ms(); t_now_ms() - t1 < 5000; t_sleep_ms(10)) {
        lock_wait_counters_get(&b);
        if (b.reconnects > a.reconnects)
            break;
    }
    T_ASSERT(b.reconnects > a.reconnects);
    if (!T_EQ_I64(lock_try_acquire(rc, key, holder, HOLD_LEASE, NULL), LOCK_OK))
        goto out;
    if (!T_ASSERT(waiter_start(&w, key, 20000)))
        goto out;
    T_EQ_I64(wait_subscribed(key, 2000), 0);
    t1 = t_now_ms();
    T_EQ_I64(lock_release(rc, key, holder, HOLD_LEASE, NULL), LOCK_OK);
    pthread_join(w.thread, NULL);
    printf("# subscriber back: waiter got the lock %.1f ms after the release\n", w.t_done - t1);
    T_EQ_I64(w.st, LOCK_OK);
    T_ASSERT(w.t_done - t1 < 1000);
out:
    atomic_store(&refuse_connects, 0);
    del_lock(key);
}

/* A client using Redisson's layout by hand: hash field "<uuid>:<thread>",
 * count, PEXPIRE; release = DEL + PUBLISH "0". Both directions. */
static void test_redisson_interop(void)
{
    char key[128], ch[256], owner[96], msg[16] = "";
    redisContext *java = t_redis(), *java_sub = t_redis(), *c = t_redis();
    redisReply *r;
    waiter w;
    lock_grant g = {0, 0};
    lock_counters c0;
    lock_wait_counters m0, m1;

    key_for("redisson", 0, key, sizeof key);
    /* The channel as Redisson names it (RedissonLock.getChannelName:
     * prefixName("redisson_lock__channel", name)), not as the library under
     * test does: the two must meet. */
    snprintf(ch, sizeof ch, "redisson_lock__channel:{%s}", key);
    tl_owner(owner, sizeof owner, next_owner++);

    /* 1. "Java" holds; our waiter wakes on its publish. */
    r = T_CMD(java, "HINCRBY %s %s 1", key, JAVA_OWNER);
    freeReplyObject(r);
    r = T_CMD(java, "PEXPIRE %s %ld", key, HOLD_LEASE);
    freeReplyObject(r);
    T_EQ_I64(lock_try_acquire(c, key, owner, HOLD_LEASE, &g), LOCK_BUSY);
    T_ASSERT(g.ttl_ms > 0 && g.ttl_ms <= HOLD_LEASE);
    lock_counters_get(&c0);
    if (!T_ASSERT(waiter_start(&w, key, 20000)))
        goto cleanup;
    T_EQ_I64(wait_subscribed(key, 10000), 0);
    T_EQ_I64(wait_refused(c0.contended, 2, 10000), 0);   /* past its retry */
    lock_wait_counters_get(&m0);
    double t0 = t_now_ms();
    r = T_CMD(java, "DEL %s", key);
    freeReplyObject(r);
    r = T_CMD(java, "PUBLISH %s 0", ch);
    freeReplyObject(r);
    pthread_join(w.thread, NULL);
    lock_wait_counters_get(&m1);
    T_EQ_I64(w.st, LOCK_OK);
    printf("# woken by a Redisson-style publish after %.2f ms\n", w.t_done - t0);
    /* Its "0" arrived and woke our waiter (the waiter's own release may
     * publish one more before the channel is unsubscribed: no one to wake). */
    T_ASSERT(m1.messages - m0.messages >= 1);
    T_EQ_I64(m1.wakeups - m0.wakeups, 1);
    T_ASSERT(w.t_done - t0 < HOLD_LEASE / 2); /* not the lease running out */

    /* 2. We hold; "Java"'s attempt sees our hold and waits for our "0". */
    r = T_CMD(java_sub, "SUBSCRIBE %s", ch);
    freeReplyObject(r);
    T_EQ_I64(lock_try_acquire(c, key, owner, HOLD_LEASE, NULL), LOCK_OK);
    T_EQ_I64(tl_int(java, "EXISTS %s", key), 1);
    r = T_CMD(java, "HEXISTS %s %s", key, JAVA_OWNER);
    T_ASSERT(r != NULL && r->type == REDIS_REPLY_INTEGER && r->integer == 0);
    freeReplyObject(r);
    long long ttl = tl_int(java, "PTTL %s", key);
    T_ASSERT(ttl > 0 && ttl <= HOLD_LEASE);
    r = T_CMD(java, "HGET %s %s", key, owner);
    T_ASSERT(r != NULL && r->type == REDIS_REPLY_STRING && strcmp(r->str, "1") == 0);
    freeReplyObject(r);
    T_EQ_I64(lock_release(c, key, owner, HOLD_LEASE, NULL), LOCK_OK);
    void *v = NULL;
    if (T_ASSERT(redisGetReply(java_sub, &v) == REDIS_OK && v != NULL)) {
        redisReply *m = v;
        if (T_ASSERT(m->type == REDIS_REPLY_ARRAY && m->elements == 3)) {
            T_EQ_STR(m->element[0]->str, "message");
            T_EQ_STR(m->element[1]->str, ch);
            snprintf(msg, sizeof msg, "%s", m->element[2]->str);
        }
    }
    freeReplyObject(v);
    T_EQ_STR(msg, "0");
    /* its retry now gets it, and ours is refused */
    T_EQ_I64(tl_int(java, "EXISTS %s", key), 0);
    r = T_CMD(java, "HINCRBY %s %s 1", key, JAVA_OWNER);
    freeReplyObject(r);
    r = T_CMD(java, "PEXPIRE %s %ld", key, HOLD_LEASE);
    freeReplyObject(r);
    T_EQ_I64(lock_try_acquire(c, key, owner, HOLD_LEASE, NULL), LOCK_BUSY);
    T_EQ_I64(lock_release(c, key, owner, HOLD_LEASE, NULL), LOCK_NOT_OWNER);
cleanup:
    redisFree(java);
    redisFree(java_sub);
    redisFree(c);
    del_lock(key);
}

/*---- mutual exclusion across processes ----*/

#define MX_PROCS   3
#define MX_THREADS 4
#define MX_ITERS   60

typedef struct mx_thread {
    const char *key;
    int id;
    int failures;
    pthread_t thread;
} mx_thread;

/* The critical section: a deliberately non-atomic GET + SET of a plain
 * counter, and a probe of how many holders are inside at once. */
static void *mx_main(void *p)
{
    mx_thread *t = p;
    redisContext *c = t_redis();
    char owner[96], counter[160], probe[160];
    /* half the threads in watchdog mode, half with a fixed lease */
    long lease = t->id % 2 ? LOCK_WATCHDOG : 5000;

    tl_owner(owner, sizeof owner, t->id);
    snprintf(counter, sizeof counter, "%s:counter", t->key);
    snprintf(probe, sizeof probe, "%s:inside", t->key);
    for (int i = 0; i < MX_ITERS; i++) {
        if (lock_try_lock(c, t->key, owner, 20000, lease, NULL) != LOCK_OK) {
            t->failures++;
            continue;
        }
        long long inside = tl_int(c, "INCR %s", probe);
        if (inside != 1) {
            redisReply *r = redisCommand(c, "INCR %s:violations", t->key);
            freeReplyObject(r);
        }
        redisReply *r = redisCommand(c, "GET %s", counter);
        long long v = r != NULL && r->type == REDIS_REPLY_STRING ? strtoll(r->str, NULL, 10) : 0;
        freeReplyObject(r);
        r = redisCommand(c, "SET %s %lld", counter, v + 1);
        freeReplyObject(r);
        r = redisCommand(c, "DECR %s", probe);
        freeReplyObject(r);
        if (lock_release(c, t->key, owner, lease, NULL) != LOCK_OK)
            t->failures++;
    }
    redisFree(c);
    return NULL;
}

/* Child mode: MX_THREADS threads of MX_ITERS sections; exit 0 if all ran. */
static int mx_child(const char *argv0, const char *key)
{
    mx_thread t[MX_THREADS];
    int failures = 0;

    tl_setup(argv0);
    printf("ready\n");
    fflush(stdout);
    for (int i = 0; i < MX_THREADS; i++) {
        t[i] = (mx_thread){ .key = key, .id = i + 1 };
        if (pthread_create(&t[i].thread, NULL, mx_main, &t[i]) != 0)
            return 1;
    }
    for (int i = 0; i < MX_THREADS; i++) {
        pthread_join(t[i].thread, NULL);
        failures += t[i].failures;
    }
    lock_runtime_stop();
    return failures == 0 ? 0 : 1;
}

static void test_mutual_exclusion_processes(void)
{
    char key[128], k[192], line[32];
    pid_t pid[MX_PROCS];
    int fd[MX_PROCS];
    int started = 0;

    key_for("mutex", 0, key, sizeof key);
    double t0 = t_now_ms();
    for (int i = 0; i < MX_PROCS; i++) {
        char *args[] = { "test_lock_wait", "--mutex-child", key, NULL };
        pid[i] = tl_spawn(args, &fd[i]);
        if (!T_ASSERT(pid[i] > 0))
            break;
        started++;
    }
    for (int i = 0; i < started; i++) {
        T_EQ_I64(tl_read_line(fd[i], line, sizeof line, 10000), 0);
        close(fd[i]);
    }
    for (int i = 0; i < started; i++) {
        int status = -1;
        waitpid(pid[i], &status, 0);
        T_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    double dt = t_now_ms() - t0;

    snprintf(k, sizeof k, "%s:counter", key);
    redisReply *r = T_CMD(rc, "GET %s", k);
    long long total = r != NULL && r->type == REDIS_REPLY_STRING ? strtoll(r->str, NULL, 10) : -1;
    freeReplyObject(r);
    snprintf(k, sizeof k, "%s:violations", key);
    long long violations = tl_int(rc, "EXISTS %s", k);
    printf("# %d processes x %d threads x %d sections: counter %lld in %.0f ms, "
           "overlaps %lld\n", MX_PROCS, MX_THREADS, MX_ITERS, total, dt, violations);
    T_EQ_I64(total, MX_PROCS * MX_THREADS * MX_ITERS);
    T_EQ_I64(violations, 0);
    T_EQ_I64(tl_int(rc, "EXISTS %s", key), 0);
    r = T_CMD(rc, "DEL %s:counter %s:inside", key, key);
    freeReplyObject(r);
    del_lock(key);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--mutex-child") == 0)
        return mx_child(argv[0], argv[2]);

    rc = t_redis();
    tl_setup(argv[0]);
    /* The lock runtime again, with a connect function a case can make fail
     * (nothing waited yet: the subscriber thread has not started). */
    lock_runtime_stop();
    lock_options o = {
        .connect = flaky_connect,
        .command_timeout_ms = g_cfg.redis_timeout_ms,
        .watchdog_timeout_ms = g_cfg.watchdog_timeout_ms,
    };
    if (lock_runtime_start(&o) != 0) {
        fprintf(stderr, "lock_runtime_start failed\n");
        return 2;
    }
    T_RUN(test_subscriber_starts_on_first_wait);
    T_RUN(test_handoff_latency);
    T_RUN(test_release_before_subscribe_is_not_lost);
    T_RUN(test_release_before_wait_is_banked);
    T_RUN(test_release_race_repeated);
    T_RUN(test_wait_budget_and_no_leftover_subscription);
    T_RUN(test_wait_bounded_by_holder_ttl);
    T_RUN(test_waiters_share_one_subscription);
    T_RUN(test_other_message_wakes_every_waiter);
    T_RUN(test_subscriber_connection_lost);
    T_RUN(test_subscriber_cannot_connect);
    T_RUN(test_redisson_interop);
    T_RUN(test_mutual_exclusion_processes);
    lock_runtime_stop();
    redisFree(rc);
    return t_done();
}
