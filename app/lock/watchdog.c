/* watchdog: one renewal thread, one batched EVALSHA per 100 locks per tick
 * (Redisson >= 3.44's LockTask). */
#include "watchdog.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <hiredis/hiredis.h>

#include "bgthread.h"
#include "log.h"
#include "rcluster.h"
#include "script.h"
#include "util.h"

#define WD_BUCKETS 1024

typedef struct wd_entry {
    char *key;
    char *owner;
    struct wd_entry *next;   /* hash chain */
    long holds;              /* confirmed watchdog-mode holds */
    long inflight;           /* acquires sent whose reply is not in yet */
    uint64_t seq;            /* bumped by every wd_begin (see drop_if_stale) */
} wd_entry;

/* One lock of a tick's snapshot, copied so the table can change meanwhile. */
typedef struct wd_item {
    char *key;
    char *owner;
    uint64_t seq;
} wd_item;

/* Guarded by wd.mu. */
static struct {
    pthread_mutex_t mu;
    wd_entry *buckets[WD_BUCKETS];
    int count;
    uint64_t seq;
    int warned_not_running;
} wd = { .mu = PTHREAD_MUTEX_INITIALIZER };

/* The renewal thread; its starts are serialised by wd.mu. */
static bgthread renewal = BGTHREAD_INIT;

/* Set by wd_start before the renewal thread runs; read by every thread. */
static _Atomic long timeout_ms;
static wd_connect_fn connect_fn;   /* the renewal thread's only */
static wd_stale_fn stale_fn;       /* may be NULL */
static char *cluster_seeds;        /* Redis Cluster: the renewal thread routes by slot */
static int cluster_timeout_ms;

/* Statistics only: relaxed. */
static atomic_uint_fast64_t n_renewals;
static atomic_uint_fast64_t n_lost;
static atomic_uint_fast64_t n_errors;
static atomic_uint_fast64_t n_ticks;

long wd_timeout_ms(void)
{
    long ms = atomic_load_explicit(&timeout_ms, memory_order_relaxed);
    return ms > 0 ? ms : WD_DEFAULT_TIMEOUT_MS;
}

/*---- registry (wd.mu held) ----*/

static unsigned hash_pair(const char *key, const char *owner)
{
    uint32_t h = 2166136261u;                 /* FNV-1a over key NUL owner */
    for (const char *s = key; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    h *= 16777619u;
    for (const char *s = owner; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h % WD_BUCKETS;
}

static wd_entry **entry_slot(const char *key, const char *owner)
{
    wd_entry **pp = &wd.buckets[hash_pair(key, owner)];

    while (*pp != NULL && (strcmp((*pp)->key, key) != 0 || strcmp((*pp)->owner, owner) != 0))
        pp = &(*pp)->next;
    return pp;
}

static void entry_unlink(wd_entry **pp)
{
    wd_entry *e = *pp;

    *pp = e->next;
    wd.count--;
    free(e->key);
    free(e->owner);
    free(e);
}

/* Drops a pair that has neither holds nor acquires in flight. */
static void entry_settle(wd_entry **pp)
{
    if ((*pp)->holds <= 0 && (*pp)->inflight <= 0)
        entry_unlink(pp);
}

void wd_begin(const char *key, const char *owner)
{
    pthread_mutex_lock(&wd.mu);
    if (!bgthread_started(&renewal) && !wd.warned_not_running) {
        wd.warned_not_running = 1;
        log_warn("watchdog-mode lock %s taken but the renewal thread is not running "
                 "(lock_runtime_start): it expires after %ld ms", key, wd_timeout_ms());
    }
    wd_entry **pp = entry_slot(key, owner);
    if (*pp == NULL) {
        wd_entry *e = xcalloc(1, sizeof *e);
        e->key = xstrdup(key);
        e->owner = xstrdup(owner);
        *pp = e;
        wd.count++;
    }
    (*pp)->inflight++;
    (*pp)->seq = ++wd.seq;
    pthread_mutex_unlock(&wd.mu);
}

void wd_end(const char *key, const char *owner, int acquired)
{
    pthread_mutex_lock(&wd.mu);
    wd_entry **pp = entry_slot(key, owner);
    if (*pp != NULL) {
        (*pp)->inflight--;
        if (acquired)
            (*pp)->holds++;
        entry_settle(pp);
    }
    pthread_mutex_unlock(&wd.mu);
}

void wd_cancel(const char *key, const char *owner)
{
    pthread_mutex_lock(&wd.mu);
    wd_entry **pp = entry_slot(key, owner);
    if (*pp != NULL) {
        (*pp)->holds--;
        entry_settle(pp);
    }
    pthread_mutex_unlock(&wd.mu);
}

/* The renewal of 'it' found the owner field gone. The entry goes unless an
 * acquire started since the snapshot (a tick may run between wd_begin and
 * the acquire reaching Redis, and must not cancel the hold it creates). */
static void drop_if_stale(const wd_item *it)
{
    pthread_mutex_lock(&wd.mu);
    wd_entry **pp = entry_slot(it->key, it->owner);
    if (*pp != NULL && (*pp)->seq == it->seq && (*pp)->inflight == 0) {
        log_info("watchdog: %s is no longer held by %s; renewal stopped", it->key, it->owner);
        atomic_fetch_add_explicit(&n_lost, 1, memory_order_relaxed);
        entry_unlink(pp);
    }
    pthread_mutex_unlock(&wd.mu);
}

int wd_count(void)
{
    pthread_mutex_lock(&wd.mu);
    int n = wd.count;
    pthread_mutex_unlock(&wd.mu);
    return n;
}

/*---- the renewal thread ----*/

/* Copies every held lock. Caller frees with items_free. wd.mu held. */
static wd_item *snapshot(size_t *n)
{
    wd_item *items = xmalloc(sizeof *items * ((size_t)wd.count + 1));
    size_t k = 0;

    for (int b = 0; b < WD_BUCKETS; b++) {
        for (wd_entry *e = wd.buckets[b]; e != NULL; e = e->next) {
            if (e->holds <= 0)
                continue;                   /* first acquire still in flight */
            items[k].key = xstrdup(e->key);
            items[k].owner = xstrdup(e->owner);
            items[k].seq = e->seq;
            k++;
        }
    }
    *n = k;
    return items;
}

static void items_free(wd_item *items, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(items[i].key);
        free(items[i].owner);
    }
    free(items);
}

/* Handles a renewal's reply for items[0..n-1] (takes it; NULL: none came). */
static void renew_reply(redisReply *r, const wd_item *items, size_t n)
{
    int ok = 0;

    if (r == NULL)
        goto out;
    if (r->type == REDIS_REPLY_ERROR) {
        log_warn("watchdog: renewal failed: %s", r->str);
        goto out;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements != n) {
        log_warn("watchdog: unexpected renewal reply (type %d)", r->type);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const redisReply *e = r->element[i];
        if (e->type == REDIS_REPLY_INTEGER && e->integer == 1)
            atomic_fetch_add_explicit(&n_renewals, 1, memory_order_relaxed);
        else if (e->type == REDIS_REPLY_INTEGER && e->integer == 0)
            drop_if_stale(&items[i]);
    }
    ok = 1;
out:
    if (!ok)
        atomic_fetch_add_explicit(&n_errors, 1, memory_order_relaxed);
    freeReplyObject(r);
}

/* The script's arguments for items[0..n-1] into argv (2n + 1 of them). */
static void renew_args(const wd_item *items, size_t n, char *lease, size_t leaselen,
                       const char **argv)
{
    snprintf(lease, leaselen, "%ld", wd_timeout_ms());
    for (size_t i = 0; i < n; i++) {
        argv[i] = items[i].key;
        argv[n + 1 + i] = items[i].owner;
    }
    argv[n] = lease;
}

/* Renews items[0..n-1] (n <= WD_BATCH) with one EVALSHA. The script only
 * PEXPIREs to a fixed value, so one retry on a fresh connection is safe. */
static void renew_batch(redisContext **cp, const wd_item *items, size_t n)
{
    const char *argv[2 * WD_BATCH + 1];
    char lease[24];
    redisReply *r = NULL;
    char err[256];

    renew_args(items, n, lease, sizeof lease, argv);
    if (*cp != NULL && stale_fn != NULL && stale_fn(*cp)) {
        log_info("watchdog: the connection's Redis is no longer the master; reconnecting");
        redisFree(*cp);
        *cp = NULL;
    }
    for (int attempt = 0; attempt < 2 && r == NULL; attempt++) {
        if (*cp == NULL) {
            *cp = connect_fn(err, sizeof err);
            if (*cp == NULL) {
                log_warn("watchdog: redis unavailable: %s", err);
                break;
            }
        }
        r = script_run(*cp, SCRIPT_LOCK_RENEW, (int)n, (int)(2 * n + 1), argv, NULL);
        if (r == NULL) {
            log_warn("watchdog: renewal failed: %s", (*cp)->errstr);
            redisFree(*cp);
            *cp = NULL;
        }
    }
    renew_reply(r, items, n);
}

/* Redis Cluster: items[0..n-1] (n <= WD_BATCH) share hash slot 'slot'; one
 * EVALSHA on its master, sent again once after a lost connection (the map
 * read again) or where a redirection points. */
static void renew_slot(rcluster *rc, int slot, const wd_item *items, size_t n)
{
    const char *argv[2 * WD_BATCH + 1];
    char lease[24];
    redisReply *r = NULL;
    redisContext *c;
    rcluster_redirect rd;

    renew_args(items, n, lease, sizeof lease, argv);
    c = rcluster_slot_context(rc, slot);
    for (int attempt = 0; attempt < 2 && c != NULL; attempt++) {
        r = script_run(c, SCRIPT_LOCK_RENEW, (int)n, (int)(2 * n + 1), argv, NULL);
        if (r == NULL) {
            log_warn("watchdog: renewal failed: %s", c->errstr);
            rcluster_reset(rc);
            c = rcluster_slot_context(rc, slot);
        } else if (rcluster_redirect_parse(r, &rd) != RCLUSTER_NONE && attempt == 0) {
            freeReplyObject(r);
            r = NULL;
            c = rcluster_redirected(rc, &rd, c);
        } else {
            break;
        }
    }
    if (c == NULL && r == NULL)
        log_warn("watchdog: redis cluster: %s", rc->errstr);
    renew_reply(r, items, n);
}

static int by_slot(const void *a, const void *b)
{
    const wd_item *x = a, *y = b;
    int sx = rcluster_keyslot(x->key, strlen(x->key)), sy = rcluster_keyslot(y->key, strlen(y->key));

    return (sx > sy) - (sx < sy);
}

/* Redis Cluster: a script's keys must share a slot, so the batches are the
 * runs of one slot (a lock's companion keys share its slot; two users'
 * locks seldom do). */
static void renew_cluster(rcluster *rc, wd_item *items, size_t n)
{
    size_t i = 0;

    qsort(items, n, sizeof *items, by_slot);
    while (i < n) {
        int slot = rcluster_keyslot(items[i].key, strlen(items[i].key));
        size_t m = 1;
        while (i + m < n && m < WD_BATCH &&
               rcluster_keyslot(items[i + m].key, strlen(items[i + m].key)) == slot)
            m++;
        renew_slot(rc, slot, items + i, m);
        i += m;
    }
}

static void tick(redisContext **cp, rcluster *rc)
{
    size_t n = 0;
    wd_item *items;

    pthread_mutex_lock(&wd.mu);
    items = wd.count > 0 ? snapshot(&n) : NULL;
    pthread_mutex_unlock(&wd.mu);
    if (items == NULL)
        return;                             /* nothing held: no round trip */
    if (rc != NULL)
        renew_cluster(rc, items, n);
    else
        for (size_t off = 0; off < n; off += WD_BATCH)
            renew_batch(cp, items + off, n - off < WD_BATCH ? n - off : WD_BATCH);
    items_free(items, n);
    if (n > 0)
        atomic_fetch_add_explicit(&n_ticks, 1, memory_order_relaxed);
}

static void renewal_main(bgthread *self, void *arg)
{
    redisContext *c = NULL;
    rcluster *rc = NULL;
    int64_t period_us = wd_timeout_ms() * 1000LL / 3;
    int64_t next = util_mono_us() + period_us;

    (void)arg;
    if (cluster_seeds != NULL) {
        rcluster_opts o = { .timeout_ms = cluster_timeout_ms, .retry_ms = cluster_timeout_ms,
                            .on_connect = script_cache_on_connect };
        char err[256];
        if ((rc = rcluster_new(cluster_seeds, &o, err, sizeof err)) == NULL)
            log_error("watchdog: redis cluster: %s: no lease renewed", err);
    }
    while (!bgthread_stopping(self)) {
        int64_t now = util_mono_us();
        if (now < next) {
            bgthread_sleep(self, (long)((next - now + 999) / 1000));
            continue;                       /* re-check stopping and the time */
        }
        if (cluster_seeds == NULL || rc != NULL)
            tick(&c, rc);
        /* Keep the schedule; after a stall, start again from now. */
        next += period_us;
        if (next <= util_mono_us())
            next = util_mono_us() + period_us;
    }
    if (c != NULL)
        redisFree(c);
    rcluster_free(rc);
}

int wd_start(long timeout, wd_connect_fn connect, wd_stale_fn stale, const char *cluster,
             int cluster_timeout)
{
    int rc = -1;

    pthread_mutex_lock(&wd.mu);
    if (bgthread_started(&renewal)) {
        rc = 0;
        goto out;
    }
    if (connect == NULL) {
        log_error("watchdog: no connect function");
        goto out;
    }
    atomic_store_explicit(&timeout_ms, timeout, memory_order_relaxed);
    connect_fn = connect;
    stale_fn = stale;
    free(cluster_seeds);
    cluster_seeds = cluster != NULL && cluster[0] != '\0' ? xstrdup(cluster) : NULL;
    cluster_timeout_ms = cluster_timeout > 0 ? cluster_timeout : 1000;
    if (bgthread_start(&renewal, "sk-watchdog", renewal_main, NULL, NULL) != 0) {
        log_error("watchdog: cannot start the renewal thread");
        goto out;
    }
    rc = 0;
out:
    pthread_mutex_unlock(&wd.mu);
    return rc;
}

void wd_stop(void)
{
    if (!bgthread_started(&renewal))
        return;
    bgthread_stop(&renewal);

    pthread_mutex_lock(&wd.mu);
    for (int b = 0; b < WD_BUCKETS; b++)
        while (wd.buckets[b] != NULL)
            entry_unlink(&wd.buckets[b]);
    pthread_mutex_unlock(&wd.mu);
}

void wd_counters_get(wd_counters *out)
{
    out->renewals = atomic_load_explicit(&n_renewals, memory_order_relaxed);
    out->lost = atomic_load_explicit(&n_lost, memory_order_relaxed);
    out->errors = atomic_load_explicit(&n_errors, memory_order_relaxed);
    out->ticks = atomic_load_explicit(&n_ticks, memory_order_relaxed);
}
