/* peers: publish this instance's counters, read every live instance's. */
#include "peers.h"
#include "rcluster.h"
#include "bgthread.h"
#include "config.h"
#include "conn.h"
#include "exposition.h"
#include "log.h"
#include "script.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int64_t started_at;

cJSON *peers_self_json(void)
{
    cJSON *o = cJSON_CreateObject();
    char ts[32];

    util_format_iso8601(started_at, ts, sizeof ts);
    cJSON_AddStringToObject(o, "instance", g_cfg.instance_id);
    cJSON_AddStringToObject(o, "uuid", g_cfg.instance_uuid);
    cJSON_AddNumberToObject(o, "port", g_cfg.port);
    cJSON_AddStringToObject(o, "startedAt", ts);
    exposition_counters_json(o);
    return o;
}

void peers_sum(cJSON *dst, const cJSON *src)
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
                peers_sum(d, it);
        }
    }
}

void peers_cluster_tidy(cJSON *cluster)
{
    static const char *const drop[][2] = {
        { "lock", "wakeupMeanMs" }, { "lock", "wakeupMaxMs" },
        { "batch", "largest" }, { "admission", "largest" },
        { "consumer", "lagMsLast" }, { "consumer", "lagMsMax" }, { "consumer", "lagMsMean" },
    };

    cJSON_DeleteItemFromObjectCaseSensitive(cluster, "port");
    for (size_t i = 0; i < sizeof drop / sizeof drop[0]; i++)
        cJSON_DeleteItemFromObjectCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(cluster, drop[i][0]), drop[i][1]);
    /* A setting, not a count: the same on every instance. */
    cJSON_DeleteItemFromObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(cluster, "redis"),
                                            "syncReplicas");
}

int peers_others_json(redisContext *c, cJSON *others)
{
    redisReply *ids = NULL, *vals = NULL;
    const char **argv = NULL;
    size_t *lens = NULL;
    char **keys = NULL;
    int rc = -1;

    ids = redisCommand(c, "ZRANGEBYSCORE %s %lld +inf", PEERS_INSTANCES_KEY,
                       (long long)(util_wall_ms() - PEERS_LIVE_MS));
    if (ids == NULL || ids->type != REDIS_REPLY_ARRAY)
        goto out;
    if (ids->elements == 0) {
        rc = 0;
        goto out;
    }
    argv = xcalloc(ids->elements + 1, sizeof *argv);
    lens = xcalloc(ids->elements + 1, sizeof *lens);
    keys = xcalloc(ids->elements, sizeof *keys);
    argv[0] = "MGET";
    lens[0] = 4;
    for (size_t i = 0; i < ids->elements; i++) {
        const redisReply *e = ids->element[i];
        if (e->type != REDIS_REPLY_STRING)
            goto out;
        keys[i] = xmalloc(sizeof PEERS_INSTANCE_PREFIX + e->len);
        memcpy(keys[i], PEERS_INSTANCE_PREFIX, sizeof PEERS_INSTANCE_PREFIX - 1);
        memcpy(keys[i] + sizeof PEERS_INSTANCE_PREFIX - 1, e->str, e->len + 1);
        argv[i + 1] = keys[i];
        lens[i + 1] = strlen(keys[i]);
    }
    vals = redisCommandArgv(c, (int)ids->elements + 1, argv, lens);
    if (vals == NULL || vals->type != REDIS_REPLY_ARRAY || vals->elements != ids->elements)
        goto out;
    for (size_t i = 0; i < vals->elements; i++) {
        const redisReply *v = vals->element[i];
        if (v->type != REDIS_REPLY_STRING || strcmp(ids->element[i]->str, g_cfg.instance_id) == 0)
            continue;                          /* expired meanwhile, or ourselves */
        cJSON *o = cJSON_ParseWithLength(v->str, v->len);
        if (o != NULL)
            cJSON_AddItemToArray(others, o);
    }
    rc = 0;
out:
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
    return rc;
}

/* ---- publisher thread ---- */

/* The tick is bgthread_sleep, on the monotonic clock: a step of the wall
 * clock must not stop the publishing, or the instance drops out of the
 * cluster view. */
static bgthread publisher = BGTHREAD_INIT;

static void publish_once(redisContext **cp)
{
    char err[256], key[sizeof PEERS_INSTANCE_PREFIX + 64];
    cJSON *self;
    char *text;
    redisReply *r;
    int moved = 0;

    if (*cp != NULL && !conn_redis_current(*cp)) {
        redisFree(*cp);                        /* the master moved (failover) */
        *cp = NULL;
    }
    if (*cp == NULL && (*cp = conn_redis_open(err, sizeof err)) == NULL)
        return;                                /* Redis down: try again next tick */
    self = peers_self_json();
    text = cJSON_PrintUnformatted(self);
    cJSON_Delete(self);
    if (text == NULL)
        return;
    snprintf(key, sizeof key, "%s%s", PEERS_INSTANCE_PREFIX, g_cfg.instance_id);
    redisAppendCommand(*cp, "SET %s %s PX %d", key, text, PEERS_LIVE_MS);
    redisAppendCommand(*cp, "ZADD %s %lld %s", PEERS_INSTANCES_KEY, (long long)util_wall_ms(),
                       g_cfg.instance_id);
    redisAppendCommand(*cp, "ZREMRANGEBYSCORE %s -inf %lld", PEERS_INSTANCES_KEY,
                       (long long)(util_wall_ms() - 10 * PEERS_LIVE_MS));
    free(text);
    for (int i = 0; i < 3; i++) {
        rcluster_redirect rd;
        if (redisGetReply(*cp, (void **)&r) != REDIS_OK || (r = script_demoted(*cp, r)) == NULL) {
            redisFree(*cp);
            *cp = NULL;
            return;
        }
        /* A cluster node that no longer serves the registry's slot (a
         * failover, a migration): the next tick opens a connection to the
         * one that does. The other replies are read first. */
        if (rcluster_redirect_parse(r, &rd) != RCLUSTER_NONE)
            moved = 1;
        freeReplyObject(r);
    }
    if (moved) {
        redisFree(*cp);
        *cp = NULL;
    }
}

static void publisher_main(bgthread *self, void *arg)
{
    redisContext *c = NULL;

    (void)arg;
    do
        publish_once(&c);
    while (!bgthread_sleep(self, 1000));
    if (c != NULL) {                           /* leave the cluster view at once */
        redisReply *r = redisCommand(c, "ZREM %s %s", PEERS_INSTANCES_KEY, g_cfg.instance_id);
        freeReplyObject(r);
        r = redisCommand(c, "DEL %s%s", PEERS_INSTANCE_PREFIX, g_cfg.instance_id);
        freeReplyObject(r);
        redisFree(c);
    }
}

int peers_start(void)
{
    started_at = util_now_s();
    return bgthread_start_logged(&publisher, "sk-peers", publisher_main, NULL, NULL,
                                 "stats publisher");
}

void peers_stop(void)
{
    bgthread_stop(&publisher);
}
