/* test_rcluster: the Redis Cluster routing (app/base/rcluster.c) against a
 * real cluster of 3 masters and 3 replicas (scripts/redis-cluster.sh, or
 * REDIS_CLUSTER_NODES):
 *
 *   routing      every key goes to its slot's master, from one seed, with
 *                one read of the slot map and no redirection
 *   MOVED        a slot moved behind the client's back: followed, the map
 *                corrected, the next call goes straight there
 *   ASK          a slot being migrated: a key already on the target is
 *                asked there (ASKING), the map left as it is
 *   TRYAGAIN     a multi-key command split by a migration: retried until
 *                the migration ends, or its error returned once the call's
 *                budget is spent
 *   failover     the master of a slot SIGKILLed: calls within the budget
 *                succeed once its replica is promoted, and a script the
 *                old master had loaded is run on the new one (NOSCRIPT:
 *                Redis does not copy SCRIPT LOAD to replicas; the script
 *                module's EVAL fallback, as the sender)
 *   set-up       a new connection to a node runs the handle's on_connect
 *                first (the lock library's scripts cached there: SCRIPT
 *                EXISTS on a node whose cache was flushed), once per node
 *   redirected   a caller's own command (a library's script) meeting MOVED
 *                or ASK: rcluster_redirected hands the connection to send
 *                it again to (ASKING sent for ASK), MOVED remembered
 *   CLUSTERDOWN  a master and its replica both SIGKILLed: the slot is
 *                served by nobody; the call ends with the budget, with
 *                CLUSTERDOWN (or no reply), never hangs */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rcluster.h"
#include "script.h"
#include "util.h"
#include "t.h"
#include "t_cluster.h"

static const char *nodes;          /* REDIS_CLUSTER_NODES */

static rcluster *client(int retry_ms)
{
    rcluster_opts o = { .timeout_ms = 1000, .retry_ms = retry_ms };
    char err[256], first[64];
    rcluster *rc;

    /* One seed: the rest is learnt from the map. */
    snprintf(first, sizeof first, "%.*s", (int)strcspn(nodes, ","), nodes);
    rc = rcluster_new(first, &o, err, sizeof err);
    if (rc == NULL)
        printf("rcluster_new(%s): %s\n", first, err);
    return rc;
}

static redisReply *cmd(rcluster *rc, const char *a0, const char *key, const char *a2)
{
    const char *argv[3] = { a0, key, a2 };
    return rcluster_command_argv(rc, 1, a2 != NULL ? 3 : 2, argv, NULL);
}

static int reply_is(redisReply *r, int type, const char *str)
{
    int ok = r != NULL && r->type == type && (str == NULL || strcmp(r->str, str) == 0);
    if (!ok)
        printf("  reply: %s\n", r == NULL ? "(none)" : r->str ? r->str : "(not a string)");
    if (r != NULL)
        freeReplyObject(r);
    return ok;
}

/* A direct connection to node host:port (no routing). */
static redisContext *direct(const char *host, int port)
{
    redisContext *c = redisConnect(host, port);
    if (c == NULL || c->err) {
        printf("  cannot connect to %s:%d\n", host, port);
        if (c != NULL)
            redisFree(c);
        return NULL;
    }
    return c;
}

static redisContext *master_of(rcluster *rc, int slot)
{
    int i = rc->slot[slot] - 1;
    return i < 0 ? NULL : direct(rc->nodes[i].host, rc->nodes[i].port);
}

static int node_id(redisContext *c, char *out, size_t n)
{
    redisReply *r = redisCommand(c, "CLUSTER MYID");
    int ok = r != NULL && r->type == REDIS_REPLY_STRING;
    if (ok)
        snprintf(out, n, "%s", r->str);
    if (r != NULL)
        freeReplyObject(r);
    return ok ? 0 : -1;
}

static int ok_status(redisReply *r)
{
    return reply_is(r, REDIS_REPLY_STATUS, "OK");
}

static void test_each_key_goes_to_its_master(void)
{
    rcluster *rc = client(2000);
    char key[32], val[32];
    int masters[RCLUSTER_MAX_NODES] = { 0 }, nmasters = 0;

    if (!T_ASSERT(rc != NULL))
        return;
    for (int i = 0; i < 60; i++) {
        snprintf(key, sizeof key, "rt:%d", i);
        snprintf(val, sizeof val, "v%d", i);
        T_ASSERT(ok_status(cmd(rc, "SET", key, val)));
    }
    T_EQ_I64(rc->refreshes, 1);
    T_EQ_I64(rc->redirects, 0);
    /* Each key is on the master the map names, as that master says. */
    for (int i = 0; i < 60; i++) {
        int slot, m;
        redisContext *c;
        redisReply *r;

        snprintf(key, sizeof key, "rt:%d", i);
        slot = rcluster_keyslot(key, strlen(key));
        m = rc->slot[slot] - 1;
        if (!T_ASSERT(m >= 0) || (c = master_of(rc, slot)) == NULL)
            continue;
        if (!masters[m]++)
            nmasters++;
        r = redisCommand(c, "GET %s", key);
        snprintf(val, sizeof val, "v%d", i);
        T_ASSERT(reply_is(r, REDIS_REPLY_STRING, val));
        redisFree(c);
    }
    T_EQ_I64(nmasters, 3);
    /* One slot per master, each master once, in slot order. */
    {
        int slots[8], seen[RCLUSTER_MAX_NODES] = { 0 };
        int n = rcluster_master_slots(rc, slots, 8);
        T_EQ_I64(n, 3);
        for (int i = 0; i < n; i++) {
            int m = rcluster_slot_node(rc, slots[i]);
            T_ASSERT(m >= 0 && masters[m] > 0 && seen[m]++ == 0);
            T_ASSERT(i == 0 || slots[i] > slots[i - 1]);
        }
        T_EQ_I64(slots[0], 0);
        T_EQ_I64(rcluster_master_slots(rc, slots, 2), 2);
    }
    rcluster_free(rc);
}

/* Moves 'slot' from its master to another master by hand: IMPORTING on
 * the target, MIGRATING on the source, then (when 'finish') MIGRATE of its
 * keys and SETSLOT NODE on both. The source and target are returned. */
typedef struct migration {
    redisContext *src, *dst;
    char src_id[64], dst_id[64];
    char dst_host[64];
    int dst_port;
    int slot;
} migration;

static int migration_begin(rcluster *rc, int slot, migration *m)
{
    int from = rc->slot[slot] - 1, to = -1;
    redisReply *r;

    memset(m, 0, sizeof *m);
    m->slot = slot;
    for (int s = 0; s < RCLUSTER_SLOTS && to < 0; s++)
        if (rc->slot[s] != 0 && rc->slot[s] - 1 != from)
            to = rc->slot[s] - 1;
    if (from < 0 || to < 0)
        return -1;
    m->src = direct(rc->nodes[from].host, rc->nodes[from].port);
    m->dst = direct(rc->nodes[to].host, rc->nodes[to].port);
    snprintf(m->dst_host, sizeof m->dst_host, "%s", rc->nodes[to].host);
    m->dst_port = rc->nodes[to].port;
    if (m->src == NULL || m->dst == NULL || node_id(m->src, m->src_id, sizeof m->src_id) != 0 ||
        node_id(m->dst, m->dst_id, sizeof m->dst_id) != 0)
        return -1;
    r = redisCommand(m->dst, "CLUSTER SETSLOT %d IMPORTING %s", slot, m->src_id);
    if (!ok_status(r))
        return -1;
    r = redisCommand(m->src, "CLUSTER SETSLOT %d MIGRATING %s", slot, m->dst_id);
    return ok_status(r) ? 0 : -1;
}

static int migrate_key(migration *m, const char *key)
{
    redisReply *r = redisCommand(m->src, "MIGRATE %s %d %s 0 5000", m->dst_host, m->dst_port,
                                 key);
    int ok = r != NULL && r->type == REDIS_REPLY_STATUS;
    if (r != NULL)
        freeReplyObject(r);
    return ok ? 0 : -1;
}

/* Closes the migration's two connections (idempotent). */
static void migration_close(migration *m)
{
    if (m->src != NULL)
        redisFree(m->src);
    if (m->dst != NULL)
        redisFree(m->dst);
    m->src = m->dst = NULL;
}

/* Every key left of the slot migrated, then the slot given to the target
 * (the target first, as redis-cli --cluster does). */
static int migration_end(migration *m)
{
    redisReply *r;
    int rc = -1;

    for (;;) {
        r = redisCommand(m->src, "CLUSTER GETKEYSINSLOT %d 100", m->slot);
        if (r == NULL || r->type != REDIS_REPLY_ARRAY)
            goto out;
        if (r->elements == 0)
            break;
        for (size_t i = 0; i < r->elements; i++)
            if (migrate_key(m, r->element[i]->str) != 0)
                goto out;
        freeReplyObject(r);
    }
    freeReplyObject(r);
    r = NULL;
    if (!ok_status(redisCommand(m->dst, "CLUSTER SETSLOT %d NODE %s", m->slot, m->dst_id)) ||
        !ok_status(redisCommand(m->src, "CLUSTER SETSLOT %d NODE %s", m->slot, m->dst_id)))
        goto out;
    rc = 0;
out:
    if (r != NULL)
        freeReplyObject(r);
    migration_close(m);
    return rc;
}

static void test_a_moved_slot_is_followed_and_remembered(void)
{
    rcluster *rc = client(2000);
    const char *key = "{moved}:k";
    int slot = rcluster_keyslot(key, strlen(key)), before;
    migration m = { 0 };
    uint64_t redirects;

    if (!T_ASSERT(rc != NULL))
        return;
    T_ASSERT(ok_status(cmd(rc, "SET", key, "here")));
    before = rc->slot[slot];
    if (!T_ASSERT(migration_begin(rc, slot, &m) == 0) || !T_ASSERT(migration_end(&m) == 0))
        goto out;
    /* The client's map still names the old master: it answers MOVED. */
    T_EQ_I64(rc->slot[slot], before);
    redirects = rc->redirects;
    T_ASSERT(reply_is(cmd(rc, "GET", key, NULL), REDIS_REPLY_STRING, "here"));
    T_EQ_I64(rc->redirects, redirects + 1);
    T_ASSERT(rc->slot[slot] != before);
    /* Remembered: the next call goes straight to the new master. */
    T_ASSERT(reply_is(cmd(rc, "GET", key, NULL), REDIS_REPLY_STRING, "here"));
    T_EQ_I64(rc->redirects, redirects + 1);
out:
    migration_close(&m);
    rcluster_free(rc);
}

static void test_a_migrating_slot_is_asked_not_remapped(void)
{
    rcluster *rc = client(2000);
    const char *moved = "{ask}:moved", *stays = "{ask}:stays", *fresh = "{ask}:fresh";
    int slot = rcluster_keyslot(moved, strlen(moved)), before;
    migration m = { 0 };
    uint64_t redirects;

    if (!T_ASSERT(rc != NULL))
        return;
    T_ASSERT(ok_status(cmd(rc, "SET", moved, "on-target")));
    T_ASSERT(ok_status(cmd(rc, "SET", stays, "on-source")));
    before = rc->slot[slot];
    if (!T_ASSERT(migration_begin(rc, slot, &m) == 0) || !T_ASSERT(migrate_key(&m, moved) == 0))
        goto out;
    redirects = rc->redirects;
    /* Already migrated: the source answers ASK; asked on the target. */
    T_ASSERT(reply_is(cmd(rc, "GET", moved, NULL), REDIS_REPLY_STRING, "on-target"));
    T_EQ_I64(rc->redirects, redirects + 1);
    /* Still on the source: answered there. */
    T_ASSERT(reply_is(cmd(rc, "GET", stays, NULL), REDIS_REPLY_STRING, "on-source"));
    T_EQ_I64(rc->redirects, redirects + 1);
    /* A new key of a migrating slot is written on the target. */
    T_ASSERT(ok_status(cmd(rc, "SET", fresh, "new")));
    T_EQ_I64(rc->redirects, redirects + 2);
    /* ASK is for one command: the map still names the source. */
    T_EQ_I64(rc->slot[slot], before);
    T_ASSERT(migration_end(&m) == 0);
    T_ASSERT(reply_is(cmd(rc, "GET", fresh, NULL), REDIS_REPLY_STRING, "new"));
    T_ASSERT(reply_is(cmd(rc, "GET", stays, NULL), REDIS_REPLY_STRING, "on-source"));
out:
    migration_close(&m);
    rcluster_free(rc);
}

/* What a caller that sends its own commands does with a redirection in a
 * reply: rcluster_redirected, then the command again on what it returns. */
static redisReply *own_get(rcluster *rc, const char *key, int *hops)
{
    int slot = rcluster_keyslot(key, strlen(key));
    redisContext *c = rcluster_slot_context(rc, slot);
    redisReply *r = NULL;
    rcluster_redirect rd;

    *hops = 0;
    while (c != NULL) {
        r = redisCommand(c, "GET %s", key);
        if (rcluster_redirect_parse(r, &rd) == RCLUSTER_NONE || ++*hops > 3)
            break;
        freeReplyObject(r);
        r = NULL;
        c = rcluster_redirected(rc, &rd, c);
    }
    return r;
}

static void test_a_callers_own_command_follows_moved_and_ask(void)
{
    rcluster *rc = client(2000);
    const char *moved = "{own}:moved", *stays = "{own}:stays";
    int slot = rcluster_keyslot(moved, strlen(moved)), before, hops;
    migration m = { 0 };
    rcluster_redirect none = { .kind = RCLUSTER_TRYAGAIN, .slot = -1 };

    if (!T_ASSERT(rc != NULL))
        return;
    T_ASSERT(ok_status(cmd(rc, "SET", moved, "on-target")));
    T_ASSERT(ok_status(cmd(rc, "SET", stays, "on-source")));
    before = rc->slot[slot];
    if (!T_ASSERT(migration_begin(rc, slot, &m) == 0) || !T_ASSERT(migrate_key(&m, moved) == 0))
        goto out;
    /* ASK: sent again on the target after ASKING; the map unchanged. */
    T_ASSERT(reply_is(own_get(rc, moved, &hops), REDIS_REPLY_STRING, "on-target"));
    T_EQ_I64(hops, 1);
    T_EQ_I64(rc->slot[slot], before);
    /* ASKING is for one command: the next one goes to the source again. */
    T_ASSERT(reply_is(own_get(rc, stays, &hops), REDIS_REPLY_STRING, "on-source"));
    T_EQ_I64(hops, 0);
    if (!T_ASSERT(migration_end(&m) == 0))
        goto out;
    /* MOVED: sent again on the new master, which the map now names. */
    T_ASSERT(reply_is(own_get(rc, moved, &hops), REDIS_REPLY_STRING, "on-target"));
    T_EQ_I64(hops, 1);
    T_ASSERT(rc->slot[slot] != before);
    T_ASSERT(reply_is(own_get(rc, moved, &hops), REDIS_REPLY_STRING, "on-target"));
    T_EQ_I64(hops, 0);
    /* TRYAGAIN and CLUSTERDOWN: nothing to send to at once, the map stale. */
    T_ASSERT(rcluster_redirected(rc, &none, NULL) == NULL);
    T_ASSERT(rc->stale);
out:
    migration_close(&m);
    rcluster_free(rc);
}

static int setups;

static int count_and_cache(redisContext *c, void *arg)
{
    (void)arg;
    setups++;
    return script_cache(c);
}

static void test_a_new_connection_is_set_up_first(void)
{
    rcluster_opts o = { .timeout_ms = 1000, .retry_ms = 2000, .on_connect = count_and_cache };
    const char *lua = getenv("LUA_DIR");
    char err[256], key[32];
    int masters = 0, seen[RCLUSTER_MAX_NODES] = { 0 };
    rcluster *rc;

    if (!T_ASSERT(lua != NULL && script_load_all(lua, err, sizeof err) == 0))
        return;
    if (!T_ASSERT((rc = rcluster_new(nodes, &o, err, sizeof err)) != NULL))
        return;
    setups = 0;
    /* Keys on every master: one set-up per master, none per command. */
    for (int k = 0; k < 64; k++) {
        int slot, node;
        snprintf(key, sizeof key, "setup:%d", k);
        slot = rcluster_keyslot(key, strlen(key));
        if (!T_ASSERT(rcluster_slot_context(rc, slot) != NULL))
            break;
        node = rcluster_slot_node(rc, slot);
        if (node >= 0 && !seen[node]++)
            masters++;
    }
    T_EQ_I64(setups, masters);
    T_EQ_I64(masters, 3);
    /* A master whose cache is flushed: a new connection caches them again. */
    {
        int slot = rcluster_keyslot("setup:0", 7);
        redisContext *c = master_of(rc, slot);
        redisReply *r;
        if (T_ASSERT(c != NULL)) {
            T_ASSERT(ok_status(redisCommand(c, "SCRIPT FLUSH")));
            rcluster_reset(rc);
            T_ASSERT(rcluster_slot_context(rc, slot) != NULL);
            r = redisCommand(c, "SCRIPT EXISTS %s", script_sha(SCRIPT_LOCK_ACQUIRE));
            T_ASSERT(r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 1 &&
                     r->element[0]->integer == 1);
            if (r != NULL)
                freeReplyObject(r);
            redisFree(c);
        }
    }
    rcluster_free(rc);
}

static void *end_later(void *arg)
{
    usleep(300 * 1000);
    migration_end(arg);
    return NULL;
}

static redisReply *mget2(rcluster *rc, const char *a, const char *b)
{
    const char *argv[3] = { "MGET", a, b };
    return rcluster_command_argv(rc, 1, 3, argv, NULL);
}

static void test_a_split_multi_key_command_is_tried_again(void)
{
    rcluster *rc = client(300);
    const char *a = "{try}:a", *b = "{try}:b";
    int slot = rcluster_keyslot(a, strlen(a));
    redisReply *r;
    migration m = { 0 };
    pthread_t th;
    int64_t t0;

    if (!T_ASSERT(rc != NULL))
        return;
    T_ASSERT(ok_status(cmd(rc, "SET", a, "1")));
    T_ASSERT(ok_status(cmd(rc, "SET", b, "2")));
    if (!T_ASSERT(migration_begin(rc, slot, &m) == 0) || !T_ASSERT(migrate_key(&m, a) == 0))
        goto out;
    /* One key on each side: TRYAGAIN, until the budget (300 ms) is spent. */
    t0 = util_mono_us();
    r = mget2(rc, a, b);
    T_ASSERT(r != NULL && r->type == REDIS_REPLY_ERROR && strncmp(r->str, "TRYAGAIN", 8) == 0);
    T_EQ_I64(rc->err, RCLUSTER_ERR_BUDGET);
    T_ASSERT(util_mono_us() - t0 >= 200 * 1000);
    if (r != NULL)
        freeReplyObject(r);
    /* The migration ends meanwhile: the same call, with a budget that
     * outlasts it, gets both values. */
    rc->opts.retry_ms = 10000;
    if (!T_ASSERT(pthread_create(&th, NULL, end_later, &m) == 0))
        goto out;
    r = mget2(rc, a, b);
    pthread_join(th, NULL);
    T_ASSERT(r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
             r->element[0]->str != NULL && strcmp(r->element[0]->str, "1") == 0 &&
             r->element[1]->str != NULL && strcmp(r->element[1]->str, "2") == 0);
    T_EQ_I64(rc->err, RCLUSTER_OK);
    if (r != NULL)
        freeReplyObject(r);
out:
    migration_close(&m);
    rcluster_free(rc);
}

/* rcluster_call's sender: a script (script_file_run: EVALSHA, then EVAL
 * on NOSCRIPT) with one key. */
struct script_call {
    const script_file *s;
    const char *key;
};

static redisReply *send_script(redisContext *c, void *arg)
{
    struct script_call *a = arg;
    const char *argv[1] = { a->key };
    return script_file_run(c, a->s, 1, 1, argv, NULL);
}

static script_file get_script;

/* A script file of its own under TEST_TMP: GET of its key. */
static int load_get_script(void)
{
    const char *tmp = getenv("TEST_TMP");
    char dir[512], path[600], err[256];
    FILE *f;

    snprintf(dir, sizeof dir, "%s", tmp != NULL && tmp[0] ? tmp : "/tmp");
    snprintf(path, sizeof path, "%s/rcluster_get.lua", dir);
    if ((f = fopen(path, "w")) == NULL)
        return -1;
    fputs("return redis.call('GET', KEYS[1])\n", f);
    fclose(f);
    get_script.name = "rcluster_get";
    if (script_file_load(&get_script, dir, "rcluster_get", err, sizeof err) != 0) {
        printf("  %s\n", err);
        return -1;
    }
    return 0;
}

static void test_a_killed_master_is_replaced_within_the_budget(void)
{
    rcluster *rc = client(30000);
    const char *key = "{failover}:k";
    int slot = rcluster_keyslot(key, strlen(key));
    struct script_call sc = { &get_script, key };
    char what[1100], out[1024];
    int64_t t0;

    if (!T_ASSERT(rc != NULL))
        return;
    T_ASSERT(ok_status(cmd(rc, "SET", key, "before")));
    if (!T_ASSERT(load_get_script() == 0))
        goto out;
    T_ASSERT(reply_is(rcluster_call(rc, slot, send_script, &sc), REDIS_REPLY_STRING, "before"));
    /* WAIT: the replica has it before its master dies. */
    {
        const char *argv[3] = { "WAIT", "1", "2000" };
        redisContext *c = rcluster_slot_context(rc, slot);
        redisReply *r = c != NULL ? redisCommandArgv(c, 3, argv, NULL) : NULL;
        T_ASSERT(r != NULL && r->type == REDIS_REPLY_INTEGER && r->integer == 1);
        if (r != NULL)
            freeReplyObject(r);
    }
    snprintf(what, sizeof what, "master-of %d", slot);
    if (!T_ASSERT(t_cluster_out(what, out, sizeof out) == 0))
        goto out;
    snprintf(what, sizeof what, "kill %s", out);
    if (!T_ASSERT(t_cluster_ctl(what) == 0))
        goto out;
    t0 = util_mono_us();
    T_ASSERT(reply_is(cmd(rc, "GET", key, NULL), REDIS_REPLY_STRING, "before"));
    T_ASSERT(ok_status(cmd(rc, "SET", key, "after")));
    /* The script was loaded on the old master only (EVALSHA above): the
     * new one answers NOSCRIPT, and the sender's EVAL runs it. */
    {
        redisContext *c = rcluster_slot_context(rc, slot);
        redisReply *r = c != NULL ? redisCommand(c, "SCRIPT EXISTS %s", get_script.sha) : NULL;
        T_ASSERT(r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 1 &&
                 r->element[0]->integer == 0);
        if (r != NULL)
            freeReplyObject(r);
    }
    T_ASSERT(reply_is(rcluster_call(rc, slot, send_script, &sc), REDIS_REPLY_STRING, "after"));
    printf("  master of slot %d killed: served again after %.1f s, %llu map reads\n", slot,
           (double)(util_mono_us() - t0) / 1e6, (unsigned long long)rc->refreshes);
    snprintf(what, sizeof what, "start-node %s", out);
    T_ASSERT(t_cluster_ctl(what) == 0);
out:
    rcluster_free(rc);
}

/* The node numbers (of scripts/redis-cluster.sh) of the master of 'slot'
 * and of its replica. 0 or -1. */
static int shard_nodes(int slot, int *master, int *replica)
{
    char what[64], out[1024];

    snprintf(what, sizeof what, "master-of %d", slot);
    if (t_cluster_out(what, out, sizeof out) != 0)
        return -1;
    *master = atoi(out);
    *replica = 0;
    for (int i = 1; i <= 6; i++) {
        char port[1024], info[64];
        redisContext *c;
        redisReply *r;

        snprintf(what, sizeof what, "port %d", i);
        if (i == *master || t_cluster_out(what, port, sizeof port) != 0 ||
            (c = direct("127.0.0.1", atoi(port))) == NULL)
            continue;
        r = redisCommand(c, "INFO replication");
        snprintf(what, sizeof what, "port %d", *master);
        if (r != NULL && r->type == REDIS_REPLY_STRING && t_cluster_out(what, out, sizeof out) == 0) {
            snprintf(info, sizeof info, "master_port:%d\r", atoi(out));
            if (strstr(r->str, info) != NULL)
                *replica = i;
        }
        if (r != NULL)
            freeReplyObject(r);
        redisFree(c);
    }
    return *master > 0 && *replica > 0 ? 0 : -1;
}

static void test_a_slot_nobody_serves_ends_with_the_budget(void)
{
    rcluster *rc = client(1500);
    const char *key = "{down}:k";
    int slot = rcluster_keyslot(key, strlen(key)), master, replica;
    char what[64];
    redisReply *r;
    int64_t t0;

    if (!T_ASSERT(rc != NULL))
        return;
    T_ASSERT(ok_status(cmd(rc, "SET", key, "x")));
    if (!T_ASSERT(shard_nodes(slot, &master, &replica) == 0))
        goto out;
    snprintf(what, sizeof what, "kill %d", replica);
    T_ASSERT(t_cluster_ctl(what) == 0);
    snprintf(what, sizeof what, "kill %d", master);
    T_ASSERT(t_cluster_ctl(what) == 0);
    t0 = util_mono_us();
    r = cmd(rc, "GET", key, NULL);
    /* No reply (the master's connection refused) or CLUSTERDOWN (another
     * node asked), once the budget is spent. */
    T_ASSERT(r == NULL || (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "CLUSTERDOWN", 11) == 0));
    T_ASSERT(rc->err != RCLUSTER_OK);
    T_ASSERT(util_mono_us() - t0 >= 1000 * 1000);
    printf("  slot %d with no node: %s after %.1f s (%s)\n", slot,
           r == NULL ? "no reply" : r->str, (double)(util_mono_us() - t0) / 1e6, rc->errstr);
    if (r != NULL)
        freeReplyObject(r);
out:
    rcluster_free(rc);
}

int main(void)
{
    nodes = t_cluster_start("test_rcluster");
    T_RUN(test_each_key_goes_to_its_master);
    T_RUN(test_a_new_connection_is_set_up_first);
    T_RUN(test_a_moved_slot_is_followed_and_remembered);
    T_RUN(test_a_migrating_slot_is_asked_not_remapped);
    T_RUN(test_a_callers_own_command_follows_moved_and_ask);
    T_RUN(test_a_split_multi_key_command_is_tried_again);
    T_RUN(test_a_killed_master_is_replaced_within_the_budget);
    /* Last: it leaves a shard without a node. */
    T_RUN(test_a_slot_nobody_serves_ends_with_the_budget);
    t_cluster_stop();
    return t_done();
}
