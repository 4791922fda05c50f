/* stock_redis_durability: the durability check of Redis-first admission
 * (stock_redis_durability.h). */
#include "stock_redis_durability.h"
#include "config.h"
#include "conn.h"
#include "log.h"
#include "rcluster.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

/* The durability verdict, shared by the workers and written by whoever
 * checked last (the watch, every second). DUR_UNCHECKED: Redis refuses
 * CONFIG (a managed Redis that renamed or disabled it), so appendfsync
 * cannot be read: not durable for "aof". */
enum durability { DUR_UNKNOWN, DUR_OK, DUR_NOT, DUR_UNCHECKED };
static atomic_int durability = DUR_UNKNOWN;

static int mode_is(int m)
{
    return g_cfg.redis_order_durability == m;
}

/* CONFIG GET 'name' on 'c': its value copied to 'out'. 0; 1 when Redis
 * refused the command (an error reply, e.g. CONFIG renamed away); -1 when
 * Redis failed. */
static int config_get(redisContext *c, const char *name, char *out, size_t n)
{
    redisReply *r = redisCommand(c, "CONFIG GET %s", name);
    int rc = -1;

    if (r == NULL)
        return -1;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[1]->type == REDIS_REPLY_STRING) {
        snprintf(out, n, "%s", r->element[1]->str);
        rc = 0;
    } else if (r->type == REDIS_REPLY_ERROR) {
        snprintf(out, n, "%s", r->str);
        rc = 1;
    } else {
        /* A Redis that hides the setting (an empty array): not checkable. */
        snprintf(out, n, "CONFIG GET %s answered no value", name);
        rc = 1;
    }
    freeReplyObject(r);
    return rc;
}

/* What one Redis says: its verdict (DUR_OK, DUR_NOT, DUR_UNCHECKED) with
 * its settings in 'aof' and 'fsync' (the refusal in 'aof' when
 * unchecked), or -1 when Redis failed. For "aof" only. */
static int probe(redisContext *c, char *aof, char *fsync, size_t n)
{
    int rc;

    if ((rc = config_get(c, "appendonly", aof, n)) == 0)
        rc = config_get(c, "appendfsync", fsync, n);
    if (rc < 0)
        return -1;
    if (rc == 1)
        return DUR_UNCHECKED;
    return strcmp(aof, "yes") == 0 && strcmp(fsync, "always") == 0 ? DUR_OK : DUR_NOT;
}

/* Remembers 'verdict' (logged when it changes); 0 when durable, else 1. */
static int record(int verdict, const char *aof, const char *fsync)
{
    int was = atomic_exchange(&durability, verdict);

    if (was != verdict && verdict == DUR_NOT)
        log_error("stock_redis: Redis runs appendonly %s, appendfsync %s: an order it "
                  "acknowledges may be lost in a crash, so orders are refused (503) until it "
                  "runs appendonly yes, appendfsync always (or set REDIS_ORDER_DURABILITY)",
                  aof, fsync);
    else if (was != verdict && verdict == DUR_UNCHECKED)
        log_error("stock_redis: Redis refuses CONFIG GET (%s), so its appendfsync cannot be "
                  "checked: orders are refused (503). On a Redis without CONFIG (a managed "
                  "one) use REDIS_ORDER_DURABILITY=wait: a replica acknowledges every order",
                  aof);
    else if (was != verdict && verdict == DUR_OK && was != DUR_UNKNOWN)
        log_warn("stock_redis: Redis runs appendonly yes, appendfsync always again: orders "
                 "are admitted");
    return verdict == DUR_OK ? 0 : 1;
}

int stock_redis_durability_check(redisContext *c)
{
    return stock_redis_durability_check_all(&c, 1);
}

int stock_redis_durability_check_all(redisContext *const *c, int n)
{
    char aof[128] = "", fsync[128] = "", one_aof[128], one_fsync[128];
    int verdict = DUR_OK;

    if (!mode_is(DURABILITY_AOF)) {
        atomic_store(&durability, DUR_OK);
        return 0;
    }
    /* The worst of them: unchecked, then not durable, then durable. */
    for (int i = 0; i < n; i++) {
        int v = probe(c[i], one_aof, one_fsync, sizeof one_aof);
        if (v < 0)
            return -1;
        if (v != DUR_OK && (verdict == DUR_OK || v == DUR_UNCHECKED)) {
            verdict = v;
            snprintf(aof, sizeof aof, "%s", one_aof);
            snprintf(fsync, sizeof fsync, "%s", one_fsync);
        }
    }
    return record(verdict, aof, fsync);
}

/* Most masters checked at start. */
#define START_MASTERS_MAX 64

/* The check at start on a Redis Cluster: every master, each on its own
 * connection of a routing handle opened for it. 0 durable (or none asked),
 * 1 not, -1 when the cluster did not answer whole (checked later by the
 * watch). */
static int check_cluster_masters(void)
{
    redisContext *masters[START_MASTERS_MAX];
    int slots[START_MASTERS_MAX], n, rc = -1;
    char why[256];
    rcluster *rc_ = conn_cluster_open(why, sizeof why);

    if (rc_ == NULL)
        return -1;
    if ((n = rcluster_master_slots(rc_, slots, START_MASTERS_MAX)) <= 0)
        goto out;
    for (int i = 0; i < n; i++)
        if ((masters[i] = rcluster_slot_context(rc_, slots[i])) == NULL)
            goto out;
    rc = stock_redis_durability_check_all(masters, n);
out:
    rcluster_free(rc_);
    return rc;
}

int stock_redis_durability_start(char *err, size_t errlen)
{
    char why[256];
    redisContext *c;
    int rc;

    if (mode_is(DURABILITY_NONE))
        log_warn("REDIS_ORDER_DURABILITY=none: an order is answered 200 before Redis made it "
                 "durable; a Redis crash loses the orders of its last fsync interval");
    /* Refuse to start against a Redis that would lose acknowledged orders
     * (on a cluster, against any master that would); one that is not up
     * yet is checked when it is. */
    if (conn_redis_cluster()) {
        rc = check_cluster_masters();
    } else {
        if ((c = conn_redis_open(why, sizeof why)) == NULL)
            return 0;
        rc = stock_redis_durability_check(c);
        redisFree(c);
    }
    if (rc == 1) {
        snprintf(err, errlen, "%s", atomic_load(&durability) == DUR_UNCHECKED
                 ? "REDIS_ORDER_DURABILITY=aof cannot be checked on a Redis that refuses CONFIG: "
                   "use REDIS_ORDER_DURABILITY=wait there"
                 : "REDIS_ORDER_DURABILITY=aof needs Redis with appendonly yes and "
                   "appendfsync always");
        return -1;
    }
    return 0;
}

int stock_redis_durability_holds(redisContext *c)
{
    int d = atomic_load(&durability);
    char aof[128], fsync[128];

    if (d != DUR_UNKNOWN)
        return d == DUR_OK;
    /* On a cluster one master says nothing of the others: its answer
     * admits this call, and the verdict waits for the watch's. */
    if (conn_redis_cluster())
        return !mode_is(DURABILITY_AOF) || probe(c, aof, fsync, sizeof aof) == DUR_OK;
    return stock_redis_durability_check(c) == 0;
}

/* WAIT for the replicas: 0 when enough acknowledged, 1 when too few, -1
 * when Redis failed. */
static int wait_replicas(redisContext *c)
{
    redisReply *r = redisCommand(c, "WAIT %d %d", g_cfg.redis_order_wait_replicas,
                                 g_cfg.redis_order_wait_ms);
    int rc = -1;

    if (r == NULL)
        return -1;
    if (r->type == REDIS_REPLY_INTEGER)
        rc = r->integer >= g_cfg.redis_order_wait_replicas ? 0 : 1;
    else
        log_warn("stock_redis: WAIT: %s", r->type == REDIS_REPLY_ERROR ? r->str : "bad reply");
    freeReplyObject(r);
    return rc;
}

int stock_redis_durability_wait(redisContext *c)
{
    if (!mode_is(DURABILITY_WAIT))
        return 0;
    return c->err ? -1 : wait_replicas(c);
}

int stock_redis_durability_ok(void)
{
    return atomic_load(&durability) == DUR_OK;
}

const char *stock_redis_durability_text(void)
{
    switch (atomic_load(&durability)) {
    case DUR_OK:
        return "durable";
    case DUR_NOT:
        return "not durable";
    case DUR_UNCHECKED:
        return "unchecked: CONFIG refused";
    default:
        return "unknown";
    }
}
