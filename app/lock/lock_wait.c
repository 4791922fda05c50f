/* lock_wait: one subscriber thread per process, reference-counted channels,
 * one banked wake-up per waiter (Redisson's PublishSubscribe + LockPubSub). */
#include "lock_wait.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <hiredis/hiredis.h>

#include "bgthread.h"
#include "log.h"
#include "util.h"

#define LW_BUCKETS        256
#define LW_PING_MS        5000    /* idle this long: PING; no answer this long: reconnect */
#define LW_STALE_CHECK_MS 1000    /* how often lw.stale is asked about an idle connection */
#define LW_BACKOFF_MIN_MS 50
#define LW_BACKOFF_MAX_MS 2000
#define LW_UNLOCK_MESSAGE "0"     /* Redisson's LockPubSub.UNLOCK_MESSAGE: wake one */

/* Where the server stands for a channel. Every transition away from OFF or
 * ON is driven by a confirmation read on the subscriber connection, so at
 * most one SUBSCRIBE or UNSUBSCRIBE per channel is ever in flight. */
enum ch_state { CH_OFF, CH_SUBSCRIBING, CH_ON, CH_UNSUBSCRIBING };

typedef struct channel {
    char *name;
    struct channel *next;           /* hash chain */
    lock_wait_waiter *head, *tail;   /* waiters, oldest first */
    int refs;                       /* waiters registered */
    enum ch_state state;
    uint64_t epoch;                 /* +1 on every confirmed SUBSCRIBE */
} channel;

struct lock_wait_waiter {
    channel *ch;
    lock_wait_waiter *prev, *next;
    pthread_cond_t cond;            /* with lw.mu; monotonic clock */
    int permit;                     /* a banked wake-up (0 or 1) */
    int64_t msg_us;                 /* when the banked message arrived */
    uint64_t epoch;                 /* channel epoch this waiter has seen */
};

/* Everything below is guarded by lw.mu, except the subscriber's own
 * redisContext, which lives on its thread's stack. */
static struct {
    pthread_mutex_t mu;
    channel *buckets[LW_BUCKETS];
    int nchannels;
    int enabled;      /* lock_wait_start ran, lock_wait_stop not yet: joins may start the thread */
    int down;         /* connection known broken: joins do not wait for it */
    int efd;          /* eventfd: wakes the subscriber's poll */
    lock_wait_connect_fn connect;
    lock_wait_stale_fn stale;       /* may be NULL */
} lw = { .mu = PTHREAD_MUTEX_INITIALIZER, .efd = -1 };

/* The subscriber thread: started under lw.mu (by the first join), stopped
 * without it (lock_wait_stop: its wake takes lw.mu). bgthread_started() is
 * "started and not yet joined". */
static bgthread subscriber = BGTHREAD_INIT;

/* Statistics only: relaxed. */
static atomic_uint_fast64_t n_messages;
static atomic_uint_fast64_t n_wakeups;
static atomic_uint_fast64_t n_reconnects;

/*---- channel table (lw.mu held) ----*/

static unsigned hash_name(const char *s)
{
    uint32_t h = 2166136261u;                 /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h % LW_BUCKETS;
}

static channel *channel_find(const char *name)
{
    for (channel *ch = lw.buckets[hash_name(name)]; ch != NULL; ch = ch->next)
        if (strcmp(ch->name, name) == 0)
            return ch;
    return NULL;
}

static channel *channel_get(const char *name)
{
    channel *ch = channel_find(name);
    unsigned b;

    if (ch != NULL)
        return ch;
    b = hash_name(name);
    ch = xcalloc(1, sizeof *ch);
    ch->name = xstrdup(name);
    ch->state = CH_OFF;
    ch->next = lw.buckets[b];
    lw.buckets[b] = ch;
    lw.nchannels++;
    return ch;
}

static void channel_free(channel *ch)
{
    channel **pp = &lw.buckets[hash_name(ch->name)];

    while (*pp != ch)
        pp = &(*pp)->next;
    *pp = ch->next;
    lw.nchannels--;
    free(ch->name);
    free(ch);
}

static void signal_all(channel *ch)
{
    for (lock_wait_waiter *w = ch->head; w != NULL; w = w->next)
        pthread_cond_signal(&w->cond);
}

/* Banks one wake-up in the oldest waiter that has none (Redisson releases
 * one semaphore permit per unlock message). */
static void wake_one(channel *ch, const lock_wait_waiter *except, int64_t msg_us)
{
    for (lock_wait_waiter *w = ch->head; w != NULL; w = w->next) {
        if (w == except || w->permit)
            continue;
        w->permit = 1;
        w->msg_us = msg_us;
        pthread_cond_signal(&w->cond);
        atomic_fetch_add_explicit(&n_wakeups, 1, memory_order_relaxed);
        return;
    }
}

static void wake_all(channel *ch, int64_t msg_us)
{
    for (lock_wait_waiter *w = ch->head; w != NULL; w = w->next) {
        if (!w->permit)
            atomic_fetch_add_explicit(&n_wakeups, 1, memory_order_relaxed);
        w->permit = 1;
        w->msg_us = msg_us;
        pthread_cond_signal(&w->cond);
    }
}

/* Asks the subscriber thread to look at the table again. */
static void kick(void)
{
    uint64_t one = 1;

    if (lw.efd >= 0 && write(lw.efd, &one, sizeof one) < 0 && errno != EAGAIN)
        log_warn("lock_wait: eventfd write: %s", strerror(errno));
}

/* The connection is gone (broken, or the thread stopped): the server
 * forgot our subscriptions. Waiters blocked in lock_wait_join stop waiting
 * for a confirmation that will not come. */
static void forget_server_state(void)
{
    for (int b = 0; b < LW_BUCKETS; b++) {
        channel *ch = lw.buckets[b];
        while (ch != NULL) {
            channel *next = ch->next;
            ch->state = CH_OFF;
            if (ch->refs == 0)
                channel_free(ch);
            else
                signal_all(ch);
            ch = next;
        }
    }
}

/*---- the subscriber thread ----*/

/* Sends SUBSCRIBE for channels that gained a waiter and UNSUBSCRIBE for
 * those that lost the last one; frees channels nobody needs. lw.mu held.
 * Returns 0, or -1 if the context failed. */
static int reconcile(redisContext *c)
{
    for (int b = 0; b < LW_BUCKETS; b++) {
        channel *ch = lw.buckets[b];
        while (ch != NULL) {
            channel *next = ch->next;
            if (ch->refs > 0 && ch->state == CH_OFF) {
                if (redisAppendCommand(c, "SUBSCRIBE %s", ch->name) != REDIS_OK)
                    return -1;
                ch->state = CH_SUBSCRIBING;
            } else if (ch->refs == 0 && ch->state == CH_ON) {
                if (redisAppendCommand(c, "UNSUBSCRIBE %s", ch->name) != REDIS_OK)
                    return -1;
                ch->state = CH_UNSUBSCRIBING;
            } else if (ch->refs == 0 && ch->state == CH_OFF) {
                channel_free(ch);
            }
            ch = next;
        }
    }
    return 0;
}

static int flush(redisContext *c)
{
    int done = 0;

    while (!done)
        if (redisBufferWrite(c, &done) != REDIS_OK)
            return -1;
    return 0;
}

static int str_is(const redisReply *r, const char *s)
{
    return r->type == REDIS_REPLY_STRING && strcmp(r->str, s) == 0;
}

/* Applies one reply read on the subscriber connection. Returns 0, or -1 when
 * the reply makes no sense here (the connection is then re-opened). */
static int on_reply(const redisReply *r, int64_t now_us)
{
    const redisReply *kind, *name;
    channel *ch;
    int rc = 0;

    if (r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0)
        return 0;                           /* PING outside subscribed mode */
    if (r->type == REDIS_REPLY_ERROR) {
        log_warn("lock_wait: redis: %s", r->str);
        return -1;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 2)
        return -1;
    kind = r->element[0];
    if (str_is(kind, "pong"))
        return 0;                           /* PING in subscribed mode */
    name = r->element[1];
    if (r->elements != 3 || name->type != REDIS_REPLY_STRING)
        return -1;

    pthread_mutex_lock(&lw.mu);
    ch = channel_find(name->str);
    if (str_is(kind, "message")) {
        if (ch != NULL && r->element[2]->type == REDIS_REPLY_STRING) {
            atomic_fetch_add_explicit(&n_messages, 1, memory_order_relaxed);
            if (strcmp(r->element[2]->str, LW_UNLOCK_MESSAGE) == 0)
                wake_one(ch, NULL, now_us);
            else
                wake_all(ch, now_us);      /* e.g. Redisson's read-unlock "1" */
        }
    } else if (str_is(kind, "subscribe")) {
        if (ch == NULL || ch->state != CH_SUBSCRIBING) {
            rc = -1;
        } else {
            /* Waiters in lock_wait_join see CH_ON; those already waiting
             * see a new epoch and retry: messages may have been lost
             * while the channel was down. */
            ch->state = CH_ON;
            ch->epoch++;
            signal_all(ch);
        }
    } else if (str_is(kind, "unsubscribe")) {
        if (ch == NULL || ch->state != CH_UNSUBSCRIBING)
            rc = -1;
        else
            ch->state = CH_OFF;             /* reconcile frees or re-subscribes it */
    } else {
        rc = -1;
    }
    pthread_mutex_unlock(&lw.mu);
    if (rc != 0)
        log_warn("lock_wait: unexpected %s reply for %s",
                 kind->type == REDIS_REPLY_STRING ? kind->str : "?", name->str);
    return rc;
}

/* Reads what arrived and applies every complete reply. 0, or -1 if broken. */
static int read_replies(redisContext *c)
{
    void *reply = NULL;
    int64_t now_us = util_mono_us();

    if (redisBufferRead(c) != REDIS_OK)
        return -1;
    for (;;) {
        if (redisGetReplyFromReader(c, &reply) != REDIS_OK)
            return -1;
        if (reply == NULL)
            return 0;
        int rc = on_reply(reply, now_us);
        freeReplyObject(reply);
        if (rc != 0)
            return -1;
    }
}

/* Sleeps 'ms' unless lock_wait_stop wakes us first. */
static void backoff_sleep(long ms)
{
    struct pollfd p = { .fd = lw.efd, .events = POLLIN };
    uint64_t v;

    if (poll(&p, 1, (int)ms) > 0 && read(lw.efd, &v, sizeof v) < 0 && errno != EAGAIN)
        log_warn("lock_wait: eventfd read: %s", strerror(errno));
}

/* Opens the connection, with back-off between failures. NULL when stopping. */
static redisContext *connect_loop(int *ever_connected)
{
    long backoff = LW_BACKOFF_MIN_MS;
    int warned = 0;
    char err[256];

    while (!bgthread_stopping(&subscriber)) {
        redisContext *c = lw.connect(err, sizeof err);
        if (c != NULL) {
            if (*ever_connected) {
                atomic_fetch_add_explicit(&n_reconnects, 1, memory_order_relaxed);
                log_info("lock_wait: subscriber connection re-opened");
            }
            *ever_connected = 1;
            pthread_mutex_lock(&lw.mu);
            lw.down = 0;
            pthread_mutex_unlock(&lw.mu);
            return c;
        }
        if (!warned)
            log_warn("lock_wait: subscriber cannot connect: %s (waiters fall back to "
                     "TTL-bounded waits; retrying)", err);
        warned = 1;
        pthread_mutex_lock(&lw.mu);
        lw.down = 1;
        forget_server_state();
        pthread_mutex_unlock(&lw.mu);
        backoff_sleep(backoff);
        backoff = backoff * 2 > LW_BACKOFF_MAX_MS ? LW_BACKOFF_MAX_MS : backoff * 2;
    }
    return NULL;
}

/* A silent peer (host gone, no RST) is found by PING: sent after
 * LW_PING_MS without input, and the connection given up when nothing comes
 * back within as long again. Sets '*timeout_ms' for the next poll. */
static int liveness(redisContext *c, int64_t last_rx_us, int64_t *ping_sent_us,
                    long *timeout_ms)
{
    int64_t now = util_mono_us(), since;

    if (*ping_sent_us != 0 && now - *ping_sent_us >= LW_PING_MS * 1000LL) {
        log_warn("lock_wait: no answer to PING in %d ms", LW_PING_MS);
        return -1;
    }
    if (*ping_sent_us == 0 && now - last_rx_us >= LW_PING_MS * 1000LL) {
        if (redisAppendCommand(c, "PING") != REDIS_OK)
            return -1;
        *ping_sent_us = now;
    }
    since = *ping_sent_us != 0 ? *ping_sent_us : last_rx_us;
    *timeout_ms = LW_PING_MS - (long)((now - since) / 1000);
    if (*timeout_ms < 1)
        *timeout_ms = 1;
    return 0;
}

static void subscriber_main(bgthread *self, void *arg)
{
    redisContext *c = NULL;
    int ever_connected = 0;
    int64_t last_rx_us = 0, ping_sent_us = 0;

    (void)arg;
    for (;;) {
        if (c == NULL) {
            c = connect_loop(&ever_connected);
            if (c == NULL)
                break;
            last_rx_us = util_mono_us();
            ping_sent_us = 0;
        }

        pthread_mutex_lock(&lw.mu);
        int stop = bgthread_stopping(self);
        int rc = stop ? 0 : reconcile(c);
        pthread_mutex_unlock(&lw.mu);
        if (stop)
            break;

        long timeout_ms = 0;
        if (rc == 0 && lw.stale != NULL && lw.stale(c)) {
            log_info("lock_wait: the subscriber's Redis is no longer the master; reconnecting");
            rc = -1;
        }
        if (rc == 0)
            rc = liveness(c, last_rx_us, &ping_sent_us, &timeout_ms);
        if (lw.stale != NULL && timeout_ms > LW_STALE_CHECK_MS)
            timeout_ms = LW_STALE_CHECK_MS;
        if (rc == 0 && flush(c) != 0)
            rc = -1;
        if (rc == 0) {
            struct pollfd p[2] = { { .fd = lw.efd, .events = POLLIN },
                                   { .fd = c->fd, .events = POLLIN } };
            int n = poll(p, 2, (int)timeout_ms);
            if (n < 0 && errno != EINTR) {
                log_warn("lock_wait: poll: %s", strerror(errno));
                rc = -1;
            }
            if (n > 0 && (p[0].revents & POLLIN)) {
                uint64_t v;
                if (read(lw.efd, &v, sizeof v) < 0 && errno != EAGAIN)
                    log_warn("lock_wait: eventfd read: %s", strerror(errno));
            }
            if (n > 0 && p[1].revents != 0) {
                rc = read_replies(c);
                last_rx_us = util_mono_us();
                ping_sent_us = 0;
            }
        }
        if (rc != 0) {
            log_warn("lock_wait: subscriber connection lost: %s",
                     c->err ? c->errstr : "protocol error");
            pthread_mutex_lock(&lw.mu);
            lw.down = 1;
            forget_server_state();
            pthread_mutex_unlock(&lw.mu);
            redisFree(c);
            c = NULL;
        }
    }
    if (c != NULL)
        redisFree(c);
}

/* bgthread_stop's wake: the subscriber blocks in poll() on lw.efd. */
static void subscriber_wake(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&lw.mu);
    kick();
    pthread_mutex_unlock(&lw.mu);
}

/*---- API ----*/

/* Starts the subscriber thread. lw.mu held. Returns 0, or -1 (logged). */
static int thread_start(void)
{
    lw.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (lw.efd < 0) {
        log_error("lock_wait: eventfd: %s", strerror(errno));
        return -1;
    }
    lw.down = 0;
    if (bgthread_start(&subscriber, "sk-lock_wait", subscriber_main, NULL, subscriber_wake) != 0) {
        log_error("lock_wait: cannot start the subscriber thread");
        close(lw.efd);
        lw.efd = -1;
        return -1;
    }
    return 0;
}

int lock_wait_start(lock_wait_connect_fn connect, lock_wait_stale_fn stale)
{
    int rc = -1;

    pthread_mutex_lock(&lw.mu);
    if (connect == NULL) {
        log_error("lock_wait: no connect function");
        goto out;
    }
    if (!bgthread_started(&subscriber)) {
        lw.connect = connect;
        lw.stale = stale;
    }
    lw.enabled = 1;
    rc = 0;
out:
    pthread_mutex_unlock(&lw.mu);
    return rc;
}

int lock_wait_running(void)
{
    return bgthread_started(&subscriber);
}

void lock_wait_stop(void)
{
    pthread_mutex_lock(&lw.mu);
    lw.enabled = 0;                          /* no join starts the thread again */
    pthread_mutex_unlock(&lw.mu);
    if (!bgthread_started(&subscriber))
        return;
    bgthread_stop(&subscriber);              /* subscriber_wake kicks its poll */

    pthread_mutex_lock(&lw.mu);
    if (lw.efd >= 0)
        close(lw.efd);
    lw.efd = -1;
    lw.down = 1;
    forget_server_state();
    pthread_mutex_unlock(&lw.mu);
}

lock_wait_waiter *lock_wait_join(const char *name, long timeout_ms, int *confirmed)
{
    lock_wait_waiter *w = xcalloc(1, sizeof *w);
    struct timespec deadline;
    channel *ch;

    /* Monotonic: a wall-clock step must not stretch or cut a wait. */
    if (util_cond_init_monotonic(&w->cond) != 0)
        abort();
    util_deadline(CLOCK_MONOTONIC, timeout_ms > 0 ? (int64_t)timeout_ms * 1000 : 0, &deadline);

    pthread_mutex_lock(&lw.mu);
    /* The first waiter of the process starts the subscriber: a process
     * that never waits never opens its connection. */
    if (lw.enabled && !bgthread_started(&subscriber) && thread_start() != 0)
        lw.enabled = 0;                     /* logged; waits fall back to TTLs */
    ch = channel_get(name);
    w->ch = ch;
    w->prev = ch->tail;
    if (ch->tail != NULL)
        ch->tail->next = w;
    else
        ch->head = w;
    ch->tail = w;
    ch->refs++;
    if (ch->state == CH_OFF || ch->state == CH_UNSUBSCRIBING)
        kick();
    while (ch->state != CH_ON && bgthread_state_get(&subscriber) == BGTHREAD_RUNNING && !lw.down)
        if (pthread_cond_timedwait(&w->cond, &lw.mu, &deadline) == ETIMEDOUT)
            break;
    *confirmed = ch->state == CH_ON;
    w->epoch = ch->epoch;
    pthread_mutex_unlock(&lw.mu);
    return w;
}

int lock_wait_wait(lock_wait_waiter *w, long timeout_ms, int64_t *msg_us)
{
    struct timespec deadline;
    int woken = 0, timed_out = 0;
    int64_t at = 0;

    util_deadline(CLOCK_MONOTONIC, timeout_ms > 0 ? (int64_t)timeout_ms * 1000 : 0, &deadline);
    pthread_mutex_lock(&lw.mu);
    for (;;) {
        if (w->permit) {
            w->permit = 0;
            at = w->msg_us;
            woken = 1;
            break;
        }
        if (w->epoch != w->ch->epoch) {
            w->epoch = w->ch->epoch;        /* re-subscribed: retry once */
            woken = 1;
            break;
        }
        if (timed_out)
            break;
        if (pthread_cond_timedwait(&w->cond, &lw.mu, &deadline) == ETIMEDOUT)
            timed_out = 1;                  /* one more look, then give up */
    }
    pthread_mutex_unlock(&lw.mu);
    if (msg_us != NULL)
        *msg_us = at;
    return woken;
}

void lock_wait_leave(lock_wait_waiter *w, int pass_on)
{
    channel *ch;

    if (w == NULL)
        return;
    pthread_mutex_lock(&lw.mu);
    ch = w->ch;
    if (w->permit || pass_on)
        wake_one(ch, w, w->permit ? w->msg_us : util_mono_us());
    if (w->prev != NULL)
        w->prev->next = w->next;
    else
        ch->head = w->next;
    if (w->next != NULL)
        w->next->prev = w->prev;
    else
        ch->tail = w->prev;
    ch->refs--;
    if (ch->refs == 0) {
        if (!bgthread_started(&subscriber) || ch->state == CH_OFF)
            channel_free(ch);               /* nothing on the server to undo */
        else
            kick();                         /* the subscriber unsubscribes it */
    }
    pthread_mutex_unlock(&lw.mu);
    pthread_cond_destroy(&w->cond);
    free(w);
}

int lock_wait_channel_count(void)
{
    pthread_mutex_lock(&lw.mu);
    int n = lw.nchannels;
    pthread_mutex_unlock(&lw.mu);
    return n;
}

void lock_wait_counters_get(lock_wait_counters *out)
{
    out->messages = atomic_load_explicit(&n_messages, memory_order_relaxed);
    out->wakeups = atomic_load_explicit(&n_wakeups, memory_order_relaxed);
    out->reconnects = atomic_load_explicit(&n_reconnects, memory_order_relaxed);
}
