/* stats: the snapshot behind GET /stats and GET /metrics, its refresh
 * thread, and the requests waiting for it. */
#include "stats.h"
#include "stock.h"
#include "bgthread.h"
#include "config.h"
#include "conn.h"
#include "exposition.h"
#include "log.h"
#include "peers.h"
#include "store_voucher.h"
#include "util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* What one refresh read. Never changed once published; shared by
 * reference, freed by whoever drops the last one. */
typedef struct snapshot {
    _Atomic int refs;
    uint64_t gen;             /* the write generation read before reading */
    int64_t taken_us;         /* monotonic: when the refresh began */
    int pg_ok, redis_ok;
    cJSON *vouchers;          /* store_stats's array; NULL when Postgres failed */
    char *vouchers_text;      /* the same, printed, for /stats */
    char *others_text;        /* the other instances' entries, printed, comma-joined */
    char *redis_first_text;   /* the stock strategy's own figures (redis), printed; or NULL */
    cJSON *others_sum;        /* their counters summed */
    int others;
} snapshot;

/* A request parked until a snapshot that answers it. */
typedef struct waiter {
    http_req *r;
    enum stats_view view;
    uint64_t gen;             /* the write generation when it came */
    struct waiter *next;
} waiter;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;        /* on CLOCK_MONOTONIC: a wall-clock step moves no wait */
    snapshot *cur;
    waiter *head, *tail;
    int64_t last_us;          /* when the last refresh began */
} st = { .mu = PTHREAD_MUTEX_INITIALIZER };

/* The refresh thread. It waits on st.cv (for a request, or the interval),
 * so its stop is told there too (refresher_wake). */
static bgthread refresher = BGTHREAD_INIT;

/* Bumped by every write /stats shows (stats_touch). */
static _Atomic uint64_t write_gen;

void stats_touch(void)
{
    atomic_fetch_add_explicit(&write_gen, 1, memory_order_release);
}

static snapshot *snap_ref(snapshot *s)
{
    if (s != NULL)
        atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
    return s;
}

static void snap_unref(snapshot *s)
{
    if (s == NULL || atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1)
        return;
    cJSON_Delete(s->vouchers);
    cJSON_Delete(s->others_sum);
    free(s->vouchers_text);
    free(s->others_text);
    free(s->redis_first_text);
    free(s);
}

/* Does 's' answer a request that came at 'now_us' with write generation
 * 'gen'? (Under st.mu.) */
static int answers(const snapshot *s, uint64_t gen, int64_t now_us)
{
    return s != NULL && s->gen == gen &&
           now_us - s->taken_us < (int64_t)g_cfg.stats_interval_ms * 1000;
}

/*---- the answers ----*/

/* The body of GET /stats: identity, the vouchers and the other instances
 * from 's', this instance's counters from memory. NULL when 's' lacks
 * Postgres or Redis ('why' says which). */
static char *stats_body(const snapshot *s, const char **why)
{
    cJSON *o, *self, *cluster;
    char *self_text, *list, *text;
    size_t n;

    if (s == NULL || !s->pg_ok || !s->redis_ok) {
        *why = s != NULL && s->pg_ok ? "redis unavailable, retry later"
                                     : "database unavailable, retry later";
        return NULL;
    }
    o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "instance", g_cfg.instance_id);
    cJSON_AddStringToObject(o, "uuid", g_cfg.instance_uuid);
    cJSON_AddStringToObject(o, "lockStrategy", config_lock_name(g_cfg.lock_strategy));
    cJSON_AddStringToObject(o, "stockStrategy", config_stock_name(g_cfg.stock_strategy));
    cJSON_AddBoolToObject(o, "unsafe", config_unsafe());
    if (config_unsafe())
        cJSON_AddStringToObject(o, "warning", "UNSAFE demo strategy in force: this instance can "
                                              "oversell or sell twice to one user");
    cJSON_AddRawToObject(o, "vouchers", s->vouchers_text);
    if (s->redis_first_text != NULL)
        cJSON_AddRawToObject(o, "redisFirst", s->redis_first_text);
    exposition_counters_json(o);

    self = peers_self_json();
    cluster = s->others_sum != NULL ? cJSON_Duplicate(s->others_sum, 1) : cJSON_CreateObject();
    peers_sum(cluster, self);
    peers_cluster_tidy(cluster);
    cJSON_AddNumberToObject(cluster, "instances", 1 + s->others);
    cJSON_AddBoolToObject(self, "self", 1);
    self_text = cJSON_PrintUnformatted(self);
    cJSON_Delete(self);
    n = strlen(self_text) + strlen(s->others_text) + 4;
    list = xmalloc(n);
    snprintf(list, n, "[%s%s%s]", self_text, s->others_text[0] ? "," : "", s->others_text);
    cJSON_AddRawToObject(o, "instances", list);
    cJSON_AddItemToObject(o, "cluster", cluster);
    free(self_text);
    free(list);
    text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

/* Answers 'r' from 's' (NULL: none yet). */
static void answer(http_req *r, enum stats_view view, const snapshot *s)
{
    const char *why = NULL;
    char *text;
    size_t len = 0;
    FILE *f;

    if (view == STATS_JSON) {
        if ((text = stats_body(s, &why)) == NULL) {
            http_send_error(r, API_UNAVAILABLE, why);
            return;
        }
        http_send_text(r, 200, "application/json", text, strlen(text));
        return;
    }
    text = NULL;
    if ((f = open_memstream(&text, &len)) == NULL) {
        http_send_error(r, API_UNAVAILABLE, "out of memory");
        return;
    }
    exposition_metrics(f, s != NULL && s->pg_ok ? s->vouchers : NULL);
    fclose(f);
    http_send_text(r, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
}

http_outcome stats_serve(http_req *r, enum stats_view view)
{
    uint64_t gen = atomic_load_explicit(&write_gen, memory_order_acquire);
    snapshot *s;
    waiter *w;

    pthread_mutex_lock(&st.mu);
    if (bgthread_state_get(&refresher) == BGTHREAD_RUNNING &&
        !answers(st.cur, gen, util_mono_us()) && http_park(r) == 0) {
        w = xcalloc(1, sizeof *w);
        w->r = r;
        w->view = view;
        w->gen = gen;
        if (st.tail != NULL)
            st.tail->next = w;
        else
            st.head = w;
        st.tail = w;
        pthread_cond_signal(&st.cv);
        pthread_mutex_unlock(&st.mu);
        return HTTP_HANDED_OFF;
    }
    /* Answered by the snapshot; or no refresh will come (stopping, or the
     * workers are gone): the last one answers. */
    s = snap_ref(st.cur);
    pthread_mutex_unlock(&st.mu);
    answer(r, view, s);
    snap_unref(s);
    return HTTP_ANSWERED;
}

/*---- the refresh ----*/

static snapshot *refresh(uint64_t gen, int64_t t0)
{
    conn_set *cs = conn_get();
    snapshot *s = xcalloc(1, sizeof *s);
    PGconn *pg = conn_pg(cs);
    redisContext *c;
    cJSON *others, *o;
    size_t cap = 1, used = 0;

    atomic_init(&s->refs, 1);
    s->gen = gen;
    s->taken_us = t0;
    s->vouchers = cJSON_CreateArray();
    if (pg != NULL && store_stats(pg, s->vouchers) == STORE_OK) {
        /* The stock strategy's side of each voucher (redis): in the same
         * snapshot, read after Postgres, so that a drained sale reads as
         * agreeing. */
        if (stock_keeps_vouchers()) {
            cJSON *holder = cJSON_CreateObject();
            if (stock_stats(cs, holder, s->vouchers) == 0)
                s->redis_first_text =
                    cJSON_PrintUnformatted(cJSON_GetObjectItem(holder, "redisFirst"));
            cJSON_Delete(holder);
        }
        s->vouchers_text = cJSON_PrintUnformatted(s->vouchers);
    }
    c = conn_redis(cs);
    if (s->vouchers_text != NULL) {
        s->pg_ok = 1;
    } else {
        cJSON_Delete(s->vouchers);
        s->vouchers = NULL;
    }
    others = cJSON_CreateArray();
    if (c != NULL && peers_others_json(c, others) == 0) {
        s->redis_ok = 1;
        s->others_sum = cJSON_CreateObject();
        s->others_text = xcalloc(1, cap);
        cJSON_ArrayForEach(o, others) {
            char *t = cJSON_PrintUnformatted(o);
            size_t n = t != NULL ? strlen(t) : 0;
            if (t == NULL)
                continue;
            if (used + n + 2 > cap) {
                cap = 2 * (used + n + 2);
                s->others_text = xrealloc(s->others_text, cap);
            }
            used += (size_t)snprintf(s->others_text + used, cap - used, "%s%s",
                                     used ? "," : "", t);
            free(t);
            peers_sum(s->others_sum, o);
            s->others++;
        }
    } else if (c != NULL && (c->err || conn_redis_cluster())) {
        /* A cluster node's error reply may be a redirection (the registry's
         * slot has moved): the map is read again at the next refresh. */
        conn_redis_broken(cs);
    }
    cJSON_Delete(others);
    return s;
}

/* The waiters the snapshot of generation 'gen' answers, in their order;
 * the rest stay. (Under st.mu.) */
static waiter *take_answered(uint64_t gen)
{
    waiter *out = NULL, **out_tail = &out, **p = &st.head;

    st.tail = NULL;
    while (*p != NULL) {
        waiter *w = *p;
        if (w->gen <= gen) {
            *p = w->next;
            w->next = NULL;
            *out_tail = w;
            out_tail = &w->next;
        } else {
            st.tail = w;
            p = &w->next;
        }
    }
    return out;
}

static void answer_all(waiter *w, const snapshot *s)
{
    while (w != NULL) {
        waiter *next = w->next;
        answer(w->r, w->view, s);
        free(w);
        w = next;
    }
}

static void stats_main(bgthread *self, void *arg)
{
    snapshot *s, *old;
    waiter *ready;
    struct timespec at;
    int64_t next, t0;
    uint64_t gen;

    (void)arg;
    pthread_mutex_lock(&st.mu);
    for (;;) {
        while (!bgthread_stopping(self) && st.head == NULL)
            pthread_cond_wait(&st.cv, &st.mu);
        /* At most one refresh per interval, whoever asks. */
        next = st.last_us + (int64_t)g_cfg.stats_interval_ms * 1000;
        while (!bgthread_stopping(self) && util_mono_us() < next) {
            at.tv_sec = (time_t)(next / 1000000);
            at.tv_nsec = (long)(next % 1000000) * 1000;
            pthread_cond_timedwait(&st.cv, &st.mu, &at);
        }
        if (bgthread_stopping(self))
            break;
        gen = atomic_load_explicit(&write_gen, memory_order_acquire);
        t0 = util_mono_us();
        st.last_us = t0;
        pthread_mutex_unlock(&st.mu);

        s = refresh(gen, t0);

        pthread_mutex_lock(&st.mu);
        old = st.cur;
        st.cur = s;
        ready = take_answered(gen);
        pthread_mutex_unlock(&st.mu);
        snap_unref(old);
        answer_all(ready, s);
        pthread_mutex_lock(&st.mu);
    }
    pthread_mutex_unlock(&st.mu);
    conn_close_thread();
}

/* bgthread_stop's wake: under st.mu, so that the thread, which looks at
 * bgthread_stopping under st.mu before it waits, cannot miss it. */
static void refresher_wake(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&st.mu);
    pthread_cond_signal(&st.cv);
    pthread_mutex_unlock(&st.mu);
}

int stats_start(void)
{
    if (util_cond_init_monotonic(&st.cv) != 0) {
        log_error("cannot start the stats thread: no condition variable");
        return -1;
    }
    st.last_us = util_mono_us() - (int64_t)g_cfg.stats_interval_ms * 1000;
    if (bgthread_start_logged(&refresher, "sk-stats", stats_main, NULL, refresher_wake,
                              "stats") != 0) {
        pthread_cond_destroy(&st.cv);
        return -1;
    }
    return 0;
}

void stats_stop(void)
{
    waiter *left;
    snapshot *s;

    if (!bgthread_started(&refresher))
        return;
    bgthread_stop(&refresher);

    pthread_mutex_lock(&st.mu);
    left = st.head;
    st.head = st.tail = NULL;
    s = st.cur;
    st.cur = NULL;
    pthread_mutex_unlock(&st.mu);
    answer_all(left, s);
    snap_unref(s);
    pthread_cond_destroy(&st.cv);
}
