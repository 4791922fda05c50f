/* stats: per-instance counters and their cluster-wide view. */
#include "stats.h"
#include "config.h"
#include "conn.h"
#include "lock.h"
#include "log.h"
#include "util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const int tracked_status[] = { 200, 201, 400, 401, 403, 404, 405, 409, 413, 500, 502,
                                      503, 504 };
#define NSTATUS (sizeof tracked_status / sizeof tracked_status[0])

/* The counters are the process's only mutable shared state besides config. */
static _Atomic uint64_t by_status[NSTATUS + 1];   /* last slot: any other status */
static _Atomic uint64_t by_error[API_ERR_COUNT];
static _Atomic uint64_t total;
static _Atomic uint64_t events[STATS_EVENT_COUNT];
static _Atomic uint64_t batches, batch_buyers, batch_largest;
static int64_t started_at;

void stats_record(int status, api_err err)
{
    size_t i = 0;

    while (i < NSTATUS && tracked_status[i] != status)
        i++;
    atomic_fetch_add_explicit(&by_status[i], 1, memory_order_relaxed);
    if (err != API_OK && (unsigned)err < API_ERR_COUNT)
        atomic_fetch_add_explicit(&by_error[err], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&total, 1, memory_order_relaxed);
}

void stats_note(enum stats_event ev)
{
    if ((unsigned)ev < STATS_EVENT_COUNT)
        atomic_fetch_add_explicit(&events[ev], 1, memory_order_relaxed);
}

uint64_t stats_event_count(enum stats_event e)
{
    return (unsigned)e < STATS_EVENT_COUNT ? atomic_load_explicit(&events[e], memory_order_relaxed)
                                           : 0;
}

static double ev(enum stats_event e)
{
    return (double)atomic_load_explicit(&events[e], memory_order_relaxed);
}

static cJSON *requests_json(void)
{
    cJSON *req = cJSON_CreateObject(), *st = cJSON_CreateObject(), *er = cJSON_CreateObject();
    char key[16];

    cJSON_AddNumberToObject(req, "total", (double)atomic_load(&total));
    for (size_t i = 0; i <= NSTATUS; i++) {
        uint64_t n = atomic_load(&by_status[i]);
        if (n == 0)
            continue;
        if (i < NSTATUS)
            snprintf(key, sizeof key, "%d", tracked_status[i]);
        else
            snprintf(key, sizeof key, "other");
        cJSON_AddNumberToObject(st, key, (double)n);
    }
    for (int e = 1; e < API_ERR_COUNT; e++) {
        uint64_t n = atomic_load(&by_error[e]);
        if (n != 0)
            cJSON_AddNumberToObject(er, api_err_code((api_err)e), (double)n);
    }
    cJSON_AddItemToObject(req, "byStatus", st);
    cJSON_AddItemToObject(req, "byError", er);
    return req;
}

static cJSON *lock_json(void)
{
    lock_counters lc;
    cJSON *o = cJSON_CreateObject();

    lock_counters_get(&lc);
    /* Whatever strategy is in force, one set of figures. */
    cJSON_AddNumberToObject(o, "acquired", (double)lc.acquired + ev(STATS_DEMO_LOCK_ACQUIRED));
    cJSON_AddNumberToObject(o, "contended",
                            (double)lc.contended + ev(STATS_DEMO_LOCK_CONTENDED));
    cJSON_AddNumberToObject(o, "released", (double)lc.released + ev(STATS_DEMO_LOCK_RELEASED));
    cJSON_AddNumberToObject(o, "notOwnerReleases",
                            (double)lc.not_owner + ev(STATS_DEMO_LOCK_NOT_OWNER));
    cJSON_AddNumberToObject(o, "staleTokenRejections", ev(STATS_STALE_TOKEN));
    /* Waiting (lock_try_lock with a budget): how often, and how fast a
     * release message turned into a grant. */
    cJSON_AddNumberToObject(o, "waits", (double)lc.waits);
    cJSON_AddNumberToObject(o, "waitAcquired", (double)lc.wait_acquired);
    cJSON_AddNumberToObject(o, "waitTimeouts", (double)lc.wait_timeouts);
    cJSON_AddNumberToObject(o, "wakeups", (double)lc.wakeups);
    cJSON_AddNumberToObject(o, "wakeupMeanMs",
                            lc.wake_samples ? (double)lc.wake_us_sum / lc.wake_samples / 1000.0
                                            : 0.0);
    cJSON_AddNumberToObject(o, "wakeupMaxMs", (double)lc.wake_us_max / 1000.0);
    cJSON_AddNumberToObject(o, "renewals", (double)lc.renewals);
    cJSON_AddNumberToObject(o, "errors", (double)lc.errors);
    return o;
}

void stats_note_batch(int buyers)
{
    uint64_t n = (uint64_t)buyers, seen = atomic_load_explicit(&batch_largest, memory_order_relaxed);

    atomic_fetch_add_explicit(&batches, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&batch_buyers, n, memory_order_relaxed);
    while (n > seen && !atomic_compare_exchange_weak_explicit(&batch_largest, &seen, n,
                                                              memory_order_relaxed,
                                                              memory_order_relaxed))
        ;
}

void stats_batch_counts(uint64_t *b, uint64_t *buyers, uint64_t *largest)
{
    *b = atomic_load_explicit(&batches, memory_order_relaxed);
    *buyers = atomic_load_explicit(&batch_buyers, memory_order_relaxed);
    *largest = atomic_load_explicit(&batch_largest, memory_order_relaxed);
}

void stats_self_json(cJSON *obj)
{
    cJSON *b = cJSON_CreateObject();
    uint64_t n, buyers, largest;

    cJSON_AddItemToObject(obj, "requests", requests_json());
    cJSON_AddItemToObject(obj, "lock", lock_json());
    stats_batch_counts(&n, &buyers, &largest);
    cJSON_AddNumberToObject(b, "batches", (double)n);
    cJSON_AddNumberToObject(b, "buyers", (double)buyers);
    cJSON_AddNumberToObject(b, "largest", (double)largest);
    cJSON_AddItemToObject(obj, "batch", b);
}

static cJSON *instance_json(void)
{
    cJSON *o = cJSON_CreateObject();
    char ts[32];

    util_format_iso8601(started_at, ts, sizeof ts);
    cJSON_AddStringToObject(o, "instance", g_cfg.instance_id);
    cJSON_AddStringToObject(o, "uuid", g_cfg.instance_uuid);
    cJSON_AddNumberToObject(o, "port", g_cfg.port);
    cJSON_AddStringToObject(o, "startedAt", ts);
    stats_self_json(o);
    return o;
}

/* Adds every number of 'src' into 'dst', recursively, creating as needed. */
static void sum_into(cJSON *dst, const cJSON *src)
{
    const cJSON *it;

    cJSON_ArrayForEach(it, src) {
        cJSON *d = cJSON_GetObjectItemCaseSensitive(dst, it->string);
        if (cJSON_IsNumber(it)) {
            if (d == NULL)
                cJSON_AddNumberToObject(dst, it->string, it->valuedouble);
            else if (cJSON_IsNumber(d))
                cJSON_SetNumberValue(d, d->valuedouble + it->valuedouble);
        } else if (cJSON_IsObject(it)) {
            if (d == NULL)
                d = cJSON_AddObjectToObject(dst, it->string);
            if (cJSON_IsObject(d))
                sum_into(d, it);
        }
    }
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int stats_cluster_json(redisContext *c, cJSON *instances, cJSON *cluster)
{
    redisReply *ids = NULL, *vals = NULL;
    const char **argv = NULL;
    size_t *lens = NULL;
    char **keys = NULL;
    cJSON *self = instance_json();
    int rc = -1;

    cJSON_AddItemToArray(instances, self);
    sum_into(cluster, self);
    cJSON_AddBoolToObject(self, "self", 1);

    ids = redisCommand(c, "ZRANGEBYSCORE %s %lld +inf", STATS_INSTANCES_KEY,
                       (long long)(now_ms() - STATS_LIVE_MS));
    if (ids == NULL || ids->type != REDIS_REPLY_ARRAY)
        goto cleanup;
    if (ids->elements == 0) {
        rc = 0;
        goto cleanup;
    }
    argv = xcalloc(ids->elements + 1, sizeof *argv);
    lens = xcalloc(ids->elements + 1, sizeof *lens);
    keys = xcalloc(ids->elements, sizeof *keys);
    argv[0] = "MGET";
    lens[0] = 4;
    for (size_t i = 0; i < ids->elements; i++) {
        const redisReply *e = ids->element[i];
        if (e->type != REDIS_REPLY_STRING)
            goto cleanup;
        keys[i] = xmalloc(sizeof STATS_INSTANCE_PREFIX + e->len);
        memcpy(keys[i], STATS_INSTANCE_PREFIX, sizeof STATS_INSTANCE_PREFIX - 1);
        memcpy(keys[i] + sizeof STATS_INSTANCE_PREFIX - 1, e->str, e->len + 1);
        argv[i + 1] = keys[i];
        lens[i + 1] = strlen(keys[i]);
    }
    vals = redisCommandArgv(c, (int)ids->elements + 1, argv, lens);
    if (vals == NULL || vals->type != REDIS_REPLY_ARRAY || vals->elements != ids->elements)
        goto cleanup;
    for (size_t i = 0; i < vals->elements; i++) {
        const redisReply *v = vals->element[i];
        if (v->type != REDIS_REPLY_STRING || strcmp(ids->element[i]->str, g_cfg.instance_id) == 0)
            continue;                          /* expired meanwhile, or ourselves */
        cJSON *o = cJSON_ParseWithLength(v->str, v->len);
        if (o == NULL)
            continue;
        cJSON_AddItemToArray(instances, o);
        sum_into(cluster, o);
    }
    rc = 0;
cleanup:
    if (rc != 0 && ids != NULL && ids->type == REDIS_REPLY_ERROR)
        log_warn("stats: %s", ids->str);
    if (keys != NULL)
        for (size_t i = 0; i < ids->elements; i++)
            free(keys[i]);
    free(keys);
    free(argv);
    free(lens);
    freeReplyObject(ids);
    freeReplyObject(vals);
    /* Sums of instance metadata, means and maxima mean nothing: counters only. */
    cJSON_DeleteItemFromObjectCaseSensitive(cluster, "port");
    cJSON *lock = cJSON_GetObjectItemCaseSensitive(cluster, "lock");
    cJSON_DeleteItemFromObjectCaseSensitive(lock, "wakeupMeanMs");
    cJSON_DeleteItemFromObjectCaseSensitive(lock, "wakeupMaxMs");
    return rc;
}

/* ---- publisher thread ---- */

static pthread_t pub_thread;
static pthread_mutex_t pub_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pub_cv = PTHREAD_COND_INITIALIZER;
static int pub_stop, pub_running;

static void publish_once(redisContext **cp)
{
    char err[256], key[sizeof STATS_INSTANCE_PREFIX + 64];
    cJSON *self;
    char *text;
    redisReply *r;

    if (*cp == NULL && (*cp = conn_redis_open(err, sizeof err)) == NULL)
        return;                                /* Redis down: try again next tick */
    self = instance_json();
    text = cJSON_PrintUnformatted(self);
    cJSON_Delete(self);
    if (text == NULL)
        return;
    snprintf(key, sizeof key, "%s%s", STATS_INSTANCE_PREFIX, g_cfg.instance_id);
    redisAppendCommand(*cp, "SET %s %s PX %d", key, text, STATS_LIVE_MS);
    redisAppendCommand(*cp, "ZADD %s %lld %s", STATS_INSTANCES_KEY, (long long)now_ms(),
                       g_cfg.instance_id);
    redisAppendCommand(*cp, "ZREMRANGEBYSCORE %s -inf %lld", STATS_INSTANCES_KEY,
                       (long long)(now_ms() - 10 * STATS_LIVE_MS));
    free(text);
    for (int i = 0; i < 3; i++) {
        if (redisGetReply(*cp, (void **)&r) != REDIS_OK || r == NULL) {
            redisFree(*cp);
            *cp = NULL;
            return;
        }
        freeReplyObject(r);
    }
}

static void *publisher_main(void *arg)
{
    redisContext *c = NULL;
    struct timespec deadline;

    (void)arg;
    pthread_mutex_lock(&pub_mu);
    while (!pub_stop) {
        pthread_mutex_unlock(&pub_mu);
        publish_once(&c);
        pthread_mutex_lock(&pub_mu);
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_sec += 1;
        while (!pub_stop && pthread_cond_timedwait(&pub_cv, &pub_mu, &deadline) == 0)
            ;
    }
    pthread_mutex_unlock(&pub_mu);
    if (c != NULL) {                           /* leave the cluster view at once */
        redisReply *r = redisCommand(c, "ZREM %s %s", STATS_INSTANCES_KEY, g_cfg.instance_id);
        freeReplyObject(r);
        r = redisCommand(c, "DEL %s%s", STATS_INSTANCE_PREFIX, g_cfg.instance_id);
        freeReplyObject(r);
        redisFree(c);
    }
    return NULL;
}

int stats_publisher_start(void)
{
    started_at = util_now_s();
    pub_stop = 0;
    if (pthread_create(&pub_thread, NULL, publisher_main, NULL) != 0)
        return -1;
    pub_running = 1;
    return 0;
}

void stats_publisher_stop(void)
{
    if (!pub_running)
        return;
    pthread_mutex_lock(&pub_mu);
    pub_stop = 1;
    pthread_cond_signal(&pub_cv);
    pthread_mutex_unlock(&pub_mu);
    pthread_join(pub_thread, NULL);
    pub_running = 0;
}
