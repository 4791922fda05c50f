/* lock: Redisson-compatible reentrant lock (RLock layout, RFencedLock token). */
#include "lock.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lock_wait.h"
#include "log.h"
#include "script.h"
#include "util.h"
#include "watchdog.h"

#define LOCK_TOKEN_PREFIX   "redisson_lock_token"
#define LOCK_CHANNEL_PREFIX "redisson_lock__channel"
#define LOCK_LATCH_PREFIX   "redisson_unlock_latch"
#define LOCK_UNLOCK_MESSAGE "0"   /* LockPubSub.UNLOCK_MESSAGE */
#define LOCK_LATCH_MIN_MS   5000L /* a retried release finds its first result this long */

/* Relaxed: these are statistics, nothing is ordered by them. */
static atomic_uint_fast64_t n_acquired;
static atomic_uint_fast64_t n_contended;
static atomic_uint_fast64_t n_released;
static atomic_uint_fast64_t n_not_owner;
static atomic_uint_fast64_t n_errors;
static atomic_uint_fast64_t n_waits;
static atomic_uint_fast64_t n_wait_acquired;
static atomic_uint_fast64_t n_wait_timeouts;
static atomic_uint_fast64_t n_wait_us_sum;
static atomic_uint_fast64_t n_wait_us_max;
static atomic_uint_fast64_t n_wake_samples;
static atomic_uint_fast64_t n_wake_us_sum;
static atomic_uint_fast64_t n_wake_us_max;
static atomic_uint_fast64_t n_unsynced;
static atomic_uint_fast64_t n_sync_waits;

/* The redirection a cluster node answered this thread's last call with
 * (lock_last_redirect). */
static _Thread_local rcluster_redirect last_redirect;
static _Thread_local int has_redirect;

/* LOCK_MOVED when error reply 'r' is a cluster redirection (kept for
 * lock_last_redirect), else LOCK_ERR. */
static lock_status error_status(const redisReply *r)
{
    rcluster_redirect rd;

    if (rcluster_redirect_parse(r, &rd) == RCLUSTER_NONE)
        return LOCK_ERR;
    last_redirect = rd;
    has_redirect = 1;
    return LOCK_MOVED;
}

int lock_last_redirect(rcluster_redirect *out)
{
    int had = has_redirect;

    if (had)
        *out = last_redirect;
    has_redirect = 0;
    return had;
}

/* Replica acknowledgement of grants (lock_sync_set). */
static _Atomic int sync_replicas;
static _Atomic int sync_timeout_ms;

static _Atomic(lock_hook_fn) test_hook;

/* The caller's Redis command timeout (lock_runtime_start): bounds acquire
 * deadlines and how long a release's result stays readable. 0: unknown. */
static _Atomic int command_timeout_ms;

/* How long a token counter outlives the clock passing its last token (ms);
 * 0: forever (lock_set_token_ttl). */
static _Atomic long token_ttl_ms;

static void count(atomic_uint_fast64_t *c)
{
    atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
}

/* Adds one duration sample to a sum and a running maximum. */
static void sample(atomic_uint_fast64_t *sum, atomic_uint_fast64_t *max, int64_t us)
{
    uint_fast64_t v = us > 0 ? (uint_fast64_t)us : 0;
    uint_fast64_t cur = atomic_load_explicit(max, memory_order_relaxed);

    atomic_fetch_add_explicit(sum, v, memory_order_relaxed);
    while (v > cur && !atomic_compare_exchange_weak_explicit(max, &cur, v, memory_order_relaxed,
                                                              memory_order_relaxed)) {
    }
}

static void run_hook(enum lock_hook_point at, const char *key)
{
    lock_hook_fn fn = atomic_load_explicit(&test_hook, memory_order_acquire);

    if (fn != NULL)
        fn(at, key);
}

void lock_set_test_hook(lock_hook_fn fn)
{
    atomic_store_explicit(&test_hook, fn, memory_order_release);
}

int lock_runtime_start(const lock_options *o)
{
    if (o == NULL || o->connect == NULL) {
        log_error("lock_runtime_start: no connect function");
        return -1;
    }
    atomic_store(&command_timeout_ms, o->command_timeout_ms > 0 ? o->command_timeout_ms : 0);
    lock_sync_set(o->sync_replicas, o->sync_timeout_ms);
    lock_set_token_ttl(o->token_ttl_ms);
    script_set_observer(o->observe);
    if (lock_wait_start(o->connect, o->stale) != 0)
        return -1;
    if (wd_start(o->watchdog_timeout_ms, o->connect, o->stale, o->cluster_nodes,
                 o->command_timeout_ms) != 0) {
        lock_wait_stop();
        return -1;
    }
    return 0;
}

void lock_sync_set(int replicas, int timeout_ms)
{
    atomic_store(&sync_replicas, replicas > 0 ? replicas : 0);
    atomic_store(&sync_timeout_ms, timeout_ms > 0 ? timeout_ms : 0);
}

void lock_set_token_ttl(long ms)
{
    atomic_store(&token_ttl_ms, ms > 0 ? ms : 0);
}

void lock_runtime_stop(void)
{
    wd_stop();
    lock_wait_stop();
}

/* Redisson's prefixName(): "prefix:{key}", but "prefix:key" when the key
 * already has a '{', so the key's own hash tag keeps every companion key in
 * the lock's cluster slot. Returns the length it needs (like snprintf). */
static int companion_name(const char *prefix, const char *key, char *buf, size_t n)
{
    if (strchr(key, '{') != NULL)
        return snprintf(buf, n, "%s:%s", prefix, key);
    return snprintf(buf, n, "%s:{%s}", prefix, key);
}

/* Same, in a fresh buffer (caller frees). */
static char *companion_dup(const char *prefix, const char *key)
{
    int need = companion_name(prefix, key, NULL, 0);
    char *s = xmalloc((size_t)(need < 0 ? 0 : need) + 1);
    companion_name(prefix, key, s, (size_t)need + 1);
    return s;
}

void lock_channel_name(const char *key, char *buf, size_t n)
{
    companion_name(LOCK_CHANNEL_PREFIX, key, buf, n);
}

/* Rejects calls that would corrupt the lock (PEXPIRE <= 0 deletes the key;
 * an empty owner would be shared by everyone). */
static int lock_args_ok(const char *fn, const char *key, const char *owner, long lease_ms)
{
    if (key == NULL || key[0] == '\0' || owner == NULL || owner[0] == '\0' ||
        (lease_ms <= 0 && lease_ms != LOCK_WATCHDOG)) {
        log_error("%s: bad arguments (key=%s owner=%s lease=%ld)", fn,
                  key ? key : "(null)", owner ? owner : "(null)", lease_ms);
        return 0;
    }
    return 1;
}

#define DEADLINE_SLACK_MS 100

lock_status lock_acquire_send(redisContext *c, lock_acquire_op *op, const char *key,
                              const char *owner, long lease_ms)
{
    return lock_acquire_send_within(c, op, key, owner, lease_ms,
                                    atomic_load_explicit(&command_timeout_ms,
                                                         memory_order_relaxed));
}

lock_status lock_acquire_send_within(redisContext *c, lock_acquire_op *op, const char *key,
                                     const char *owner, long lease_ms, int timeout_ms)
{
    memset(op, 0, sizeof *op);
    if (!lock_args_ok("lock_try_acquire", key, owner, lease_ms))
        return LOCK_ERR;
    op->key = key;
    op->owner = owner;
    op->lease_ms = lease_ms;
    op->token_key = companion_dup(LOCK_TOKEN_PREFIX, key);
    /* Registered before the acquire is sent, so that no renewal can ever
     * be scheduled after this hold's release (redisson#7272). */
    op->watchdog = lease_ms == LOCK_WATCHDOG;
    if (op->watchdog) {
        lease_ms = wd_timeout_ms();
        wd_begin(key, owner);
    }
    snprintf(op->lease, sizeof op->lease, "%ld", lease_ms);
    op->argv[0] = key;
    op->argv[1] = op->token_key;
    op->argv[2] = op->lease;
    op->argv[3] = owner;
    op->argv[4] = "0";                       /* no deadline */
    op->argv[5] = op->token_ttl;
    op->argc = 6;
    snprintf(op->token_ttl, sizeof op->token_ttl, "%ld",
             atomic_load_explicit(&token_ttl_ms, memory_order_relaxed));
    /* The deadline makes a late execution (Redis stalled past our command
     * timeout, we answered 503 and moved on) refuse instead of granting a
     * hold nobody will release. A little slack absorbs clock differences. */
    if (timeout_ms > 0) {
        snprintf(op->deadline, sizeof op->deadline, "%lld",
                 (long long)(util_wall_ms() + timeout_ms + DEADLINE_SLACK_MS));
        op->argv[4] = op->deadline;
    }
    op->t0 = util_mono_us();
    if (script_append(c, SCRIPT_LOCK_ACQUIRE, 2, op->argc, op->argv, NULL) != 0) {
        log_warn("lock acquire %s: cannot format the command", key);
        return LOCK_ERR;
    }
    op->sent = 1;
    return LOCK_OK;
}

/* Is 'r' the acquire script's "your deadline has passed" answer? Then
 * Redis's clock runs ahead of ours (we got the reply in time). */
static int acquire_clock_ahead(const redisReply *r)
{
    return r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
           r->element[0]->type == REDIS_REPLY_INTEGER && r->element[0]->integer == -2;
}

static redisReply *acquire_without_deadline(redisContext *c, lock_acquire_op *op,
                                            redisReply *r)
{
    log_warn("lock acquire %s: Redis's clock is ahead of ours by more than %d ms; "
             "acquiring without a deadline", op->key,
             atomic_load_explicit(&command_timeout_ms, memory_order_relaxed) + DEADLINE_SLACK_MS);
    freeReplyObject(r);
    op->argv[4] = "0";
    return script_run(c, SCRIPT_LOCK_ACQUIRE, 2, op->argc, op->argv, NULL);
}

/* Reads WAIT's reply: how many replicas acknowledged, or -1 (no reply:
 * c->err is set; or an error reply, logged). */
static long long wait_reply(redisContext *c)
{
    void *reply = NULL;
    redisReply *r;
    long long acks = -1;

    if (redisGetReply(c, &reply) != REDIS_OK) {
        freeReplyObject(reply);
        return -1;
    }
    r = reply;
    if (r != NULL && r->type == REDIS_REPLY_INTEGER)
        acks = r->integer;
    else
        log_warn("lock: WAIT: %s", r != NULL && r->type == REDIS_REPLY_ERROR ? r->str
                                                                             : "unexpected reply");
    freeReplyObject(r);
    return acks;
}

/* WAIT in a round trip of its own. */
static long long wait_now(redisContext *c)
{
    int64_t t0 = util_mono_us();
    long long acks = -1;

    atomic_fetch_add_explicit(&n_sync_waits, 1, memory_order_relaxed);
    if (redisAppendCommand(c, "WAIT %d %d", atomic_load(&sync_replicas),
                           atomic_load(&sync_timeout_ms)) == REDIS_OK)
        acks = wait_reply(c);
    script_observe(util_mono_us() - t0, c->err == 0);
    return acks;
}

void lock_sync_send(redisContext *c, lock_acquire_op *ops, size_t n)
{
    int want = atomic_load(&sync_replicas);
    size_t last = n;

    for (size_t i = 0; i < n; i++)
        if (ops[i].sent)
            last = i;
    if (want <= 0 || last == n)
        return;
    /* One WAIT counts the acknowledgements of every write before it on
     * this connection: the whole batch. If it cannot be appended, recv
     * sends one of its own. */
    if (redisAppendCommand(c, "WAIT %d %d", want, atomic_load(&sync_timeout_ms)) != REDIS_OK)
        return;
    atomic_fetch_add_explicit(&n_sync_waits, 1, memory_order_relaxed);
    ops[last].wait_follows = 1;
}

/* A grant the replicas did not acknowledge is taken back: the release
 * script as its holder (one hold less: a reentrant grant leaves the
 * earlier holds). Renewal is not touched: wd_end undoes the registration.
 * LOCK_UNSYNCED once undone; LOCK_ERR when the undo failed (c->err set
 * when the connection did: the grant may stand until its lease ends). */
static lock_status undo_grant(redisContext *c, lock_acquire_op *op, long long acks)
{
    lock_release_req rq;

    atomic_fetch_add_explicit(&n_unsynced, 1, memory_order_relaxed);
    if (c->err) {
        log_warn("lock acquire %s: no replica acknowledgement (%s): the grant may stand until "
                 "its lease ends", op->key, c->errstr);
        return LOCK_ERR;
    }
    log_warn("lock acquire %s: %lld of %d replicas acknowledged the grant within %d ms: "
             "undoing it", op->key, acks < 0 ? 0 : acks, atomic_load(&sync_replicas),
             atomic_load(&sync_timeout_ms));
    lock_release_req_init(&rq);
    rq.renewal_cancelled = 1;
    if (lock_release_ex(c, op->key, op->owner, op->lease_ms, &rq, NULL) == LOCK_ERR)
        return LOCK_ERR;
    return LOCK_UNSYNCED;
}

/* Reads the attempt's outcome from its reply 'r' (taken; NULL: none came)
 * and releases the op. 'acks': replicas that acknowledged the writes up
 * to this attempt (a WAIT read already), or -1: not asked yet. */
static lock_status acquire_finish(redisContext *c, lock_acquire_op *op, redisReply *r,
                                  lock_grant *g, long long acks)
{
    lock_status st = LOCK_ERR;
    long long first, second;
    int want = atomic_load(&sync_replicas);

    if (!op->sent)
        goto out;
    script_observe(util_mono_us() - op->t0, r != NULL);
    if (r == NULL) {
        log_warn("lock acquire %s: redis: %s", op->key, c->errstr);
        goto out;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        st = error_status(r);
        if (st == LOCK_MOVED) {
            op->redirect = last_redirect;
            log_debug("lock acquire %s: %s", op->key, r->str);
        } else {
            log_warn("lock acquire %s: %s", op->key, r->str);
        }
        goto out;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_INTEGER ||
        r->element[1]->type != REDIS_REPLY_INTEGER) {
        log_warn("lock acquire %s: unexpected reply type %d", op->key, r->type);
        goto out;
    }

    /* {-1, token} or {pttl, -1}: a PTTL of -1 (no expiry) is told apart by
     * the token slot, which is >= 1 on every grant. */
    first = r->element[0]->integer;
    second = r->element[1]->integer;
    if (first == -1 && second >= 1) {
        if (g != NULL) {
            g->token = second;
            g->ttl_ms = -1;
        }
        st = LOCK_OK;
    } else if (second == -1) {
        if (g != NULL) {
            g->token = -1;
            g->ttl_ms = first;
        }
        st = LOCK_BUSY;
    } else {
        log_warn("lock acquire %s: unexpected reply {%lld, %lld}", op->key, first, second);
    }
    /* A grant counts once enough replicas have it. */
    if (st == LOCK_OK && want > 0) {
        if (acks < 0 && c->err == 0)
            acks = wait_now(c);
        if (acks < want)
            st = undo_grant(c, op, acks);
    }

out:
    /* No reply may hide a grant: it is not renewed and expires by itself. */
    if (op->watchdog)
        wd_end(op->key, op->owner, st == LOCK_OK);
    if (st == LOCK_OK)
        count(&n_acquired);
    else if (st == LOCK_BUSY)
        count(&n_contended);
    else if (st == LOCK_ERR)
        count(&n_errors);
    freeReplyObject(r);
    free(op->token_key);
    op->token_key = NULL;
    op->watchdog = 0;
    op->sent = 0;
    op->wait_follows = 0;
    return st;
}

lock_status lock_acquire_recv(redisContext *c, lock_acquire_op *op, lock_grant *g)
{
    redisReply *r = NULL;
    long long acks = -1;

    if (op->sent) {
        /* With a WAIT behind it, a NOSCRIPT answer is re-sent only after
         * the WAIT's reply is read. */
        r = script_recv(c, SCRIPT_LOCK_ACQUIRE, 2, op->argc, op->argv, NULL, !op->wait_follows);
        if (op->wait_follows) {
            acks = c->err ? -1 : wait_reply(c);
            if (script_is_noscript(r) && c->err == 0) {
                freeReplyObject(r);
                r = script_run(c, SCRIPT_LOCK_ACQUIRE, 2, op->argc, op->argv, NULL);
                acks = -1;                  /* that WAIT came before this grant */
            }
        }
        if (acquire_clock_ahead(r)) {
            r = acquire_without_deadline(c, op, r);
            acks = -1;
        }
    }
    return acquire_finish(c, op, r, g, acks);
}

void lock_acquire_recv_many(redisContext *c, lock_acquire_op *ops, size_t n, lock_grant *g,
                            lock_status *st)
{
    redisReply **reply = xcalloc(n ? n : 1, sizeof *reply);
    unsigned char *redo = xcalloc(n ? n : 1, 1);
    long long acks = -1;
    int redone = 0;
    size_t i;

    for (i = 0; i < n; i++) {
        if (!ops[i].sent)
            continue;
        reply[i] = script_recv(c, SCRIPT_LOCK_ACQUIRE, 2, ops[i].argc, ops[i].argv, NULL, 0);
        /* Neither may be re-sent while later replies are pending. */
        redo[i] = script_is_noscript(reply[i]) || acquire_clock_ahead(reply[i]);
        if (ops[i].wait_follows)
            acks = c->err ? -1 : wait_reply(c);
    }
    for (i = 0; i < n; i++) {
        if (!redo[i])
            continue;
        if (acquire_clock_ahead(reply[i])) {
            reply[i] = acquire_without_deadline(c, &ops[i], reply[i]);
        } else {
            freeReplyObject(reply[i]);        /* NOSCRIPT: it did not run */
            reply[i] = script_run(c, SCRIPT_LOCK_ACQUIRE, 2, ops[i].argc, ops[i].argv, NULL);
        }
        redone = 1;
    }
    /* One WAIT for the batch: the pipelined one, unless a grant came after it. */
    if (atomic_load(&sync_replicas) > 0 && c->err == 0 && (acks < 0 || redone))
        acks = wait_now(c);
    for (i = 0; i < n; i++)
        st[i] = acquire_finish(c, &ops[i], reply[i], &g[i], acks);
    free(redo);
    free(reply);
}

lock_status lock_try_acquire(redisContext *c, const char *key, const char *owner,
                             long lease_ms, lock_grant *g)
{
    lock_acquire_op op;

    /* A send that fails still goes through recv: it counts the error and
     * undoes the watchdog registration. */
    lock_acquire_send(c, &op, key, owner, lease_ms);
    lock_sync_send(c, &op, 1);
    return lock_acquire_recv(c, &op, g);
}

/* Microseconds left until 'deadline_us', in whole ms rounded up. */
static long ms_left(int64_t deadline_us)
{
    int64_t left = deadline_us - util_mono_us();
    return left <= 0 ? 0 : (long)((left + 999) / 1000);
}

lock_status lock_try_lock(redisContext *c, const char *key, const char *owner,
                          long wait_ms, long lease_ms, lock_grant *g)
{
    lock_status st;
    lock_grant mine = {-1, -1};
    lock_wait_waiter *w = NULL;
    char *channel = NULL;
    int64_t start_us = util_mono_us(), woke_at = 0;
    int confirmed, woken = 0;

    st = lock_try_acquire(c, key, owner, lease_ms, &mine);
    if (st != LOCK_BUSY || wait_ms <= 0)
        goto out;
    count(&n_waits);

    /* Subscribe, then retry: a release published between the refused
     * attempt and the subscription would otherwise go unheard. */
    run_hook(LOCK_HOOK_BEFORE_SUBSCRIBE, key);
    channel = companion_dup(LOCK_CHANNEL_PREFIX, key);
    w = lock_wait_join(channel, ms_left(start_us + (int64_t)wait_ms * 1000), &confirmed);
    if (!confirmed)
        log_debug("lock %s: not subscribed yet; waiting on the holder's TTL", key);
    for (;;) {
        st = lock_try_acquire(c, key, owner, lease_ms, &mine);
        if (st != LOCK_BUSY)
            break;
        long left = ms_left(start_us + (int64_t)wait_ms * 1000);
        if (left == 0)
            break;
        /* The holder's TTL bounds the wait: if the release message is lost,
         * the lease running out frees the lock anyway. TTL -1 (no expiry):
         * only a message or the budget ends the wait. */
        long t = mine.ttl_ms >= 0 && mine.ttl_ms < left ? mine.ttl_ms : left;
        run_hook(LOCK_HOOK_BEFORE_WAIT, key);
        woken = lock_wait_wait(w, t > 0 ? t : 1, &woke_at);
    }

out:
    if (w != NULL) {
        /* A wake-up used on an attempt that failed outright is handed on. */
        lock_wait_leave(w, (st == LOCK_ERR || st == LOCK_UNSYNCED) && woken);
        if (st == LOCK_OK) {
            int64_t now = util_mono_us();
            count(&n_wait_acquired);
            sample(&n_wait_us_sum, &n_wait_us_max, now - start_us);
            if (woken && woke_at != 0) {
                count(&n_wake_samples);
                sample(&n_wake_us_sum, &n_wake_us_max, now - woke_at);
            }
        } else if (st == LOCK_BUSY) {
            count(&n_wait_timeouts);
        }
    }
    free(channel);
    if (g != NULL)
        *g = mine;
    return st;
}

void lock_release_req_init(lock_release_req *rq)
{
    util_uuid4(rq->id);
    rq->renewal_cancelled = 0;
}

/* Redisson's getUnlockLatchName: prefixName(latch prefix, key) + ":" + id.
 * Caller frees. */
static char *latch_dup(const char *key, const char *id)
{
    char *base = companion_dup(LOCK_LATCH_PREFIX, key);
    size_t n = strlen(base) + 1 + strlen(id) + 1;
    char *s = xmalloc(n);

    snprintf(s, n, "%s:%s", base, id);
    free(base);
    return s;
}

/* How long a release's result stays readable for a retry of its request:
 * a retry comes after one command timeout and a reconnect. */
static long latch_ms(void)
{
    long ms = 5L * atomic_load_explicit(&command_timeout_ms, memory_order_relaxed);
    return ms > LOCK_LATCH_MIN_MS ? ms : LOCK_LATCH_MIN_MS;
}

/* One release's arguments, in the order lock_release.lua wants them. */
typedef struct release_call {
    char *channel, *latch;
    char lease[24], latch_px[24];
    const char *argv[7];
    int noscript;
} release_call;

static int release_prepare(release_call *rc, const char *key, const char *owner,
                           long lease_ms, lock_release_req *rq)
{
    memset(rc, 0, sizeof *rc);
    if (!lock_args_ok("lock_release", key, owner, lease_ms) || rq == NULL || rq->id[0] == '\0') {
        if (rq == NULL || rq->id[0] == '\0')
            log_error("lock_release_ex %s: no request id", key ? key : "(null)");
        return -1;
    }
    /* Renewal stops before the release is sent, once per request: a late
     * tick finds the field gone and re-arms nothing. */
    if (lease_ms == LOCK_WATCHDOG) {
        if (!rq->renewal_cancelled)
            wd_cancel(key, owner);
        rq->renewal_cancelled = 1;
        lease_ms = wd_timeout_ms();
    }
    rc->channel = companion_dup(LOCK_CHANNEL_PREFIX, key);
    rc->latch = latch_dup(key, rq->id);
    snprintf(rc->lease, sizeof rc->lease, "%ld", lease_ms);
    snprintf(rc->latch_px, sizeof rc->latch_px, "%ld", latch_ms());
    rc->argv[0] = key;
    rc->argv[1] = rc->channel;
    rc->argv[2] = rc->latch;
    rc->argv[3] = LOCK_UNLOCK_MESSAGE;
    rc->argv[4] = rc->lease;
    rc->argv[5] = owner;
    rc->argv[6] = rc->latch_px;
    return 0;
}

/* Reads a release's reply (NULL: the connection failed) and frees it. */
static lock_status release_parse(redisContext *c, const char *key, const char *owner,
                                 redisReply *r, long *remaining)
{
    lock_status st = LOCK_ERR;

    if (r == NULL) {
        log_warn("lock release %s: redis: %s", key, c->errstr);
    } else if (r->type == REDIS_REPLY_ERROR) {
        st = error_status(r);
        if (st == LOCK_MOVED)
            log_debug("lock release %s: %s", key, r->str);
        else
            log_warn("lock release %s: %s", key, r->str);
    } else if (r->type == REDIS_REPLY_NIL) {
        /* Never held, or the lease ran out first: another owner may hold
         * it now, and the script left it alone. */
        log_debug("lock release %s: not held by %s", key, owner);
        st = LOCK_NOT_OWNER;
    } else if (r->type != REDIS_REPLY_INTEGER || r->integer < 0) {
        log_warn("lock release %s: unexpected reply type %d", key, r->type);
    } else {
        if (remaining != NULL)
            *remaining = (long)r->integer;
        st = LOCK_OK;
    }
    freeReplyObject(r);
    return st;
}

static void release_done(release_call *rc, lock_status st)
{
    if (st == LOCK_OK)
        count(&n_released);
    else if (st == LOCK_NOT_OWNER)
        count(&n_not_owner);
    else
        count(&n_errors);
    free(rc->channel);
    free(rc->latch);
}

lock_status lock_release_ex(redisContext *c, const char *key, const char *owner,
                            long lease_ms, lock_release_req *rq, long *remaining)
{
    release_call rc;
    lock_status st = LOCK_ERR;

    if (release_prepare(&rc, key, owner, lease_ms, rq) == 0)
        st = release_parse(c, key, owner,
                           script_run(c, SCRIPT_LOCK_RELEASE, 3, 7, rc.argv, NULL), remaining);
    release_done(&rc, st);
    return st;
}

void lock_release_many(redisContext *c, lock_release_item *items, size_t n)
{
    release_call *rc = xmalloc(sizeof *rc * (n ? n : 1));
    int64_t t0 = util_mono_us();
    size_t i;

    for (i = 0; i < n; i++) {
        lock_release_item *it = &items[i];
        it->st = LOCK_ERR;
        if (release_prepare(&rc[i], it->key, it->owner, it->lease_ms, it->rq) != 0 ||
            script_append(c, SCRIPT_LOCK_RELEASE, 3, 7, rc[i].argv, NULL) != 0)
            rc[i].argv[0] = NULL;            /* nothing sent: no reply to read */
    }
    for (i = 0; i < n; i++) {
        redisReply *r;
        if (rc[i].argv[0] == NULL)
            continue;
        r = script_recv(c, SCRIPT_LOCK_RELEASE, 3, 7, rc[i].argv, NULL, 0);
        if (script_is_noscript(r)) {
            /* Not run: re-sent one by one below, once every reply is in. */
            freeReplyObject(r);
            rc[i].noscript = 1;
            continue;
        }
        items[i].st = release_parse(c, items[i].key, items[i].owner, r, NULL);
    }
    script_observe(util_mono_us() - t0, c->err == 0);
    for (i = 0; i < n; i++) {
        if (rc[i].noscript)
            items[i].st = release_parse(c, items[i].key, items[i].owner,
                                        script_run(c, SCRIPT_LOCK_RELEASE, 3, 7, rc[i].argv, NULL),
                                        NULL);
        release_done(&rc[i], items[i].st);
    }
    free(rc);
}

lock_status lock_release(redisContext *c, const char *key, const char *owner,
                         long lease_ms, long *remaining)
{
    lock_release_req rq;

    lock_release_req_init(&rq);
    return lock_release_ex(c, key, owner, lease_ms, &rq, remaining);
}

void lock_counters_get(lock_counters *out)
{
    out->acquired = atomic_load_explicit(&n_acquired, memory_order_relaxed);
    out->contended = atomic_load_explicit(&n_contended, memory_order_relaxed);
    out->released = atomic_load_explicit(&n_released, memory_order_relaxed);
    out->not_owner = atomic_load_explicit(&n_not_owner, memory_order_relaxed);
    out->errors = atomic_load_explicit(&n_errors, memory_order_relaxed);
    out->waits = atomic_load_explicit(&n_waits, memory_order_relaxed);
    out->wait_acquired = atomic_load_explicit(&n_wait_acquired, memory_order_relaxed);
    out->wait_timeouts = atomic_load_explicit(&n_wait_timeouts, memory_order_relaxed);
    out->wait_us_sum = atomic_load_explicit(&n_wait_us_sum, memory_order_relaxed);
    out->wait_us_max = atomic_load_explicit(&n_wait_us_max, memory_order_relaxed);
    out->wake_samples = atomic_load_explicit(&n_wake_samples, memory_order_relaxed);
    out->wake_us_sum = atomic_load_explicit(&n_wake_us_sum, memory_order_relaxed);
    out->wake_us_max = atomic_load_explicit(&n_wake_us_max, memory_order_relaxed);
    out->unsynced = atomic_load_explicit(&n_unsynced, memory_order_relaxed);
    out->sync_waits = atomic_load_explicit(&n_sync_waits, memory_order_relaxed);

    lock_wait_counters lw;
    wd_counters wd;
    lock_wait_counters_get(&lw);
    wd_counters_get(&wd);
    out->wakeups = lw.wakeups;
    out->subscriber_reconnects = lw.reconnects;
    out->renewals = wd.renewals;
    out->renew_lost = wd.lost;
    out->renew_errors = wd.errors;
}
