/* conn: per-thread Redis and Postgres connections. */
#include "conn.h"
#include "config.h"
#include "log.h"
#include "script.h"
#include "sentinel.h"
#include "util.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <sys/socket.h>

static _Atomic uint64_t next_thread_id = 1;
/* The Redis circuit breaker: shared by the workers on purpose, so that one
 * worker's timeout spares the others theirs. Monotonic microseconds. */
static _Atomic int64_t redis_open_until_us;
static pthread_key_t set_key;
static pthread_once_t set_key_once = PTHREAD_ONCE_INIT;
static _Thread_local conn_set *tls_set;
/* Set once at start, before any connection is opened; read-only after. */
static conn_pg_init_fn pg_init;
static conn_pg_init_fn pg_recheck;
static int64_t pg_recheck_us;

void conn_set_pg_init(conn_pg_init_fn fn)
{
    pg_init = fn;
}

void conn_set_pg_recheck(conn_pg_init_fn fn, int every_ms)
{
    pg_recheck = fn;
    pg_recheck_us = (int64_t)every_ms * 1000;
}

int conn_pg_recheck(PGconn *pg, int64_t *checked_us)
{
    int64_t now;

    if (pg_recheck == NULL)          /* PG_HA off: nothing to check, no clock read */
        return 0;
    now = util_mono_us();
    if (now - *checked_us < pg_recheck_us)
        return 0;
    *checked_us = now;
    return pg_recheck(pg) == 0 ? 0 : -1;
}

static void set_free(void *p)
{
    conn_set *cs = p;

    if (cs == NULL)
        return;
    if (cs->cluster != NULL)
        rcluster_free(cs->cluster);         /* cs->redis is one of its connections */
    else if (cs->redis != NULL)
        redisFree(cs->redis);
    if (cs->pg != NULL)
        PQfinish(cs->pg);
    if (cs->pg_aside != NULL)
        PQfinish(cs->pg_aside);
    free(cs);
}

static void make_key(void)
{
    /* The destructor closes a worker's connections when MHD joins it. */
    if (pthread_key_create(&set_key, set_free) != 0)
        abort();
}

void conn_renew_owner(conn_set *cs)
{
    /* A counter, not pthread_self(): ids are never reused within the process,
     * so a new thread can never look like the reentrant owner of a stale lock. */
    cs->thread_id = atomic_fetch_add(&next_thread_id, 1);
    snprintf(cs->owner, sizeof cs->owner, "%s:%" PRIu64, g_cfg.instance_uuid, cs->thread_id);
}

conn_set *conn_get(void)
{
    conn_set *cs = tls_set;

    if (cs != NULL)
        return cs;
    pthread_once(&set_key_once, make_key);
    cs = xcalloc(1, sizeof *cs);
    conn_renew_owner(cs);
    if (pthread_setspecific(set_key, cs) != 0)
        abort();
    tls_set = cs;
    return cs;
}

void conn_fresh_owner(char *buf, size_t n)
{
    snprintf(buf, n, "%s:%" PRIu64, g_cfg.instance_uuid, atomic_fetch_add(&next_thread_id, 1));
}

void conn_close_thread(void)
{
    conn_set *cs = tls_set;

    if (cs == NULL)
        return;
    pthread_setspecific(set_key, NULL);
    tls_set = NULL;
    set_free(cs);
}

/* An idle connection should have nothing to read. EOF, an error, or bytes
 * nobody asked for (Postgres's "terminating connection" notice, a reply that
 * arrived after a timeout) mean the peer restarted or the stream is out of
 * step: reconnect before sending, instead of failing the request. */
static int socket_stale(int fd)
{
    char b;
    ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);

    if (n < 0)
        return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
    return 1;
}

/* The next pipelined reply of the set-up; 0 unless it is an error (then
 * 'err' says which: the command refused, or the connection failed). */
static int next_ok(redisContext *c, char *err, size_t errlen, const char *what)
{
    void *reply = NULL;
    redisReply *r;
    int ok;

    if (redisGetReply(c, &reply) != REDIS_OK) {
        freeReplyObject(reply);
        reply = NULL;
    }
    r = reply;
    ok = r != NULL && r->type != REDIS_REPLY_ERROR;
    if (r != NULL && !ok)
        snprintf(err, errlen, "%s: %s", what, r->str);
    else if (r == NULL)
        snprintf(err, errlen, "set-up: %s", c->errstr);
    freeReplyObject(r);
    return ok;
}

/* ROLE's reply: 0 when its first element is "master". */
static int next_is_master(redisContext *c, const char *host, int port, char *err, size_t errlen)
{
    void *reply = NULL;
    redisReply *r;
    int rc = -1;

    if (redisGetReply(c, &reply) != REDIS_OK) {
        freeReplyObject(reply);
        reply = NULL;
    }
    r = reply;
    if (r == NULL) {
        snprintf(err, errlen, "set-up: %s", c->errstr);
    } else if (r->type == REDIS_REPLY_ERROR) {
        snprintf(err, errlen, "ROLE: %s", r->str);
    } else if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
               r->element[0]->type != REDIS_REPLY_STRING) {
        snprintf(err, errlen, "ROLE: unexpected reply type %d", r->type);
    } else if (strcmp(r->element[0]->str, "master") != 0) {
        snprintf(err, errlen, "%s:%d is a %s, not the master (a failover in progress?)", host,
                 port, r->element[0]->str);
    } else {
        rc = 0;
    }
    freeReplyObject(r);
    return rc;
}

/* Opens a context to the master; '*gen' gets the Sentinel generation of
 * the address used (0 without Sentinel). Its set-up is one round trip:
 * AUTH and SELECT as REDIS_URL says, a name that tells operators whose
 * connection it is (CLIENT LIST), and with Sentinel ROLE, since Sentinel
 * may still name a master that a failover has just demoted, or one that
 * came back as a replica: never write to a replica. */
static redisContext *open_master(char *err, size_t errlen, uint64_t *gen)
{
    const redis_url *u = &g_cfg.redis;
    struct timeval tv = { g_cfg.redis_timeout_ms / 1000, (g_cfg.redis_timeout_ms % 1000) * 1000 };
    char host[256];
    int port = u->port, ok, rc = -1;
    redisContext *c;

    *gen = 0;
    if (sentinel_enabled()) {
        *gen = sentinel_master(host, sizeof host, &port);
        if (*gen == 0) {
            snprintf(err, errlen, "no master known for '%s'", g_cfg.master_name);
            return NULL;
        }
    } else {
        snprintf(host, sizeof host, "%s", u->host);
    }
    c = redisConnectWithTimeout(host, port, tv);
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (c->err) {
        snprintf(err, errlen, "connect %s:%d: %s", host, port, c->errstr);
        goto out;
    }
    if (redisSetTimeout(c, tv) != REDIS_OK || redisEnableKeepAlive(c) != REDIS_OK) {
        snprintf(err, errlen, "socket options: %s", c->errstr);
        goto out;
    }
    ok = REDIS_OK;
    if (u->password[0] != '\0')
        ok = u->username[0] != '\0' ? redisAppendCommand(c, "AUTH %s %s", u->username, u->password)
                                    : redisAppendCommand(c, "AUTH %s", u->password);
    if (ok == REDIS_OK && u->db != 0)
        ok = redisAppendCommand(c, "SELECT %d", u->db);
    if (ok == REDIS_OK)
        ok = redisAppendCommand(c, "CLIENT SETNAME seckill:%s", g_cfg.instance_id);
    if (ok == REDIS_OK && sentinel_enabled())
        ok = redisAppendCommand(c, "ROLE");
    if (ok != REDIS_OK) {
        snprintf(err, errlen, "set-up: cannot format the commands");
        goto out;
    }
    ok = (u->password[0] == '\0' || next_ok(c, err, errlen, "AUTH")) &&
         (u->db == 0 || next_ok(c, err, errlen, "SELECT")) &&
         /* A name is a courtesy: an ACL user may lack CLIENT, which is no reason to fail. */
         (next_ok(c, err, errlen, "CLIENT SETNAME") || c->err == 0) &&
         (!sentinel_enabled() || next_is_master(c, host, port, err, errlen) == 0);
    if (!ok)
        goto out;
    rc = 0;
out:
    if (rc != 0) {
        sentinel_suspect(host, port);
        redisFree(c);
        c = NULL;
    }
    return c;
}

int conn_redis_cluster(void)
{
    return g_cfg.cluster_nodes_text[0] != '\0';
}

/* A routing handle over REDIS_CLUSTER_NODES; NULL with the reason in 'err'. */
static rcluster *cluster_new(char *err, size_t errlen)
{
    rcluster_opts o = { .timeout_ms = g_cfg.redis_timeout_ms, .retry_ms = g_cfg.redis_timeout_ms,
                        .on_connect = script_cache_on_connect };

    return rcluster_new(g_cfg.cluster_nodes_text, &o, err, errlen);
}

rcluster *conn_cluster_open(char *err, size_t errlen)
{
    if (!conn_redis_cluster()) {
        snprintf(err, errlen, "no Redis Cluster (REDIS_CLUSTER_NODES is empty)");
        return NULL;
    }
    return cluster_new(err, errlen);
}

static int home_slot(void)
{
    return rcluster_keyslot(CONN_HOME_TAG, strlen(CONN_HOME_TAG));
}

/* The standalone connection with a cluster: to the master of the home slot. */
static redisContext *cluster_open(char *err, size_t errlen)
{
    rcluster *rc = cluster_new(err, errlen);
    redisContext *c;

    if (rc == NULL)
        return NULL;
    if ((c = rcluster_slot_take(rc, home_slot())) == NULL)
        snprintf(err, errlen, "%s", rc->errstr);
    rcluster_free(rc);
    return c;
}

redisContext *conn_redis_open(char *err, size_t errlen)
{
    uint64_t gen;

    if (conn_redis_cluster())
        return cluster_open(err, errlen);
    return open_master(err, errlen, &gen);
}

int conn_redis_current(const redisContext *c)
{
    char host[256];
    int port;

    /* A cluster: a connection whose node lost its slots answers MOVED or
     * fails, and its owner opens another. */
    if (!sentinel_enabled())
        return 1;
    if (c == NULL || c->connection_type != REDIS_CONN_TCP || c->tcp.host == NULL)
        return 0;
    sentinel_master(host, sizeof host, &port);
    return port == c->tcp.port && strcmp(host, c->tcp.host) == 0;
}

void conn_redis_master(char *buf, size_t n)
{
    char host[256];
    int port;

    if (conn_redis_cluster())
        snprintf(buf, n, "cluster %s", g_cfg.cluster_nodes_text);
    else if (sentinel_enabled() && sentinel_master(host, sizeof host, &port) != 0)
        snprintf(buf, n, "%s:%d", host, port);
    else if (sentinel_enabled())
        snprintf(buf, n, "%s", "");
    else
        snprintf(buf, n, "%s:%d", g_cfg.redis.host, g_cfg.redis.port);
}

static int is_timeout(const char *err)
{
    return strstr(err, "temporarily unavailable") != NULL || strstr(err, "timed out") != NULL;
}

static void trip_breaker(const char *why)
{
    int64_t ms = g_cfg.redis_timeout_ms / 2;

    if (ms < 100)
        ms = 100;
    if (ms > 1000)
        ms = 1000;
    atomic_store(&redis_open_until_us, util_mono_us() + ms * 1000);
    log_warn("redis timed out (%s): failing fast for %lld ms", why, (long long)ms);
}

/* With a cluster: the connection to the master of 'slot'. */
static redisContext *cluster_slot(conn_set *cs, int slot)
{
    char err[256];
    redisContext *c;

    if (cs->cluster == NULL && (cs->cluster = cluster_new(err, sizeof err)) == NULL) {
        log_error("REDIS_CLUSTER_NODES: %s", err);
        return cs->redis = NULL;
    }
    c = rcluster_slot_context(cs->cluster, slot);
    if (c != NULL && socket_stale(c->fd)) {
        log_info("redis connection closed by a cluster node; reconnecting");
        rcluster_reset(cs->cluster);
        c = rcluster_slot_context(cs->cluster, slot);
    }
    if (c == NULL) {
        if (is_timeout(cs->cluster->errstr))
            trip_breaker(cs->cluster->errstr);
        else
            log_warn("redis cluster: %s", cs->cluster->errstr);
    }
    return cs->redis = c;
}

redisContext *conn_redis_key(conn_set *cs, const char *key)
{
    /* The request checked the connection on its way in (conn_redis): no
     * second probe of the socket per command; a master replaced since is
     * still noticed. A connection that broke meanwhile fails its command. */
    if (!conn_redis_cluster())
        return cs->redis != NULL && (!sentinel_enabled() || cs->redis_gen == sentinel_generation()) &&
                       util_mono_us() >= atomic_load(&redis_open_until_us)
                   ? cs->redis
                   : conn_redis(cs);
    if (util_mono_us() < atomic_load(&redis_open_until_us))
        return NULL;
    return cluster_slot(cs, rcluster_keyslot(key, strlen(key)));
}

/* Statistics: relaxed. */
static atomic_uint_fast64_t n_moved, n_ask, n_retry;

void conn_cluster_counters_get(conn_cluster_counters *out)
{
    out->moved = atomic_load_explicit(&n_moved, memory_order_relaxed);
    out->ask = atomic_load_explicit(&n_ask, memory_order_relaxed);
    out->retry = atomic_load_explicit(&n_retry, memory_order_relaxed);
}

redisContext *conn_redis_redirected(conn_set *cs, const rcluster_redirect *rd)
{
    redisContext *c;

    if (cs->cluster == NULL)
        return NULL;
    atomic_fetch_add_explicit(rd->kind == RCLUSTER_MOVED ? &n_moved
                              : rd->kind == RCLUSTER_ASK ? &n_ask : &n_retry,
                              1, memory_order_relaxed);
    if ((c = rcluster_redirected(cs->cluster, rd, cs->redis)) == NULL)
        log_info("redis cluster: %s", cs->cluster->errstr);
    return cs->redis = c;
}

redisContext *conn_redis_resend(conn_set *cs, const rcluster_redirect *rd, const char *key,
                               int tries)
{
    redisContext *c = conn_redis_redirected(cs, rd);

    if (c != NULL)
        return c;
    util_sleep_ms(10 << (tries - 1));
    return conn_redis_key(cs, key);
}

redisContext *conn_redis(conn_set *cs)
{
    char err[256];

    if (util_mono_us() < atomic_load(&redis_open_until_us))
        return NULL;
    if (conn_redis_cluster())
        return cluster_slot(cs, home_slot());
    if (cs->redis != NULL) {
        if (sentinel_enabled() && cs->redis_gen != sentinel_generation()) {
            log_info("redis master changed; reconnecting");
        } else if (!socket_stale(cs->redis->fd)) {
            return cs->redis;
        } else {
            log_info("redis connection closed by the server; reconnecting");
            sentinel_suspect(cs->redis->tcp.host, cs->redis->tcp.port);
        }
        redisFree(cs->redis);
        cs->redis = NULL;
    }
    cs->redis = open_master(err, sizeof err, &cs->redis_gen);
    if (cs->redis == NULL) {
        if (is_timeout(err))
            trip_breaker(err);
        else
            log_warn("redis unavailable: %s", err);
    }
    return cs->redis;
}

void conn_redis_broken(conn_set *cs)
{
    if (cs->redis != NULL && cs->redis->err == REDIS_ERR_IO && is_timeout(cs->redis->errstr))
        trip_breaker(cs->redis->errstr);
    if (cs->redis != NULL) {
        log_warn("redis connection dropped: %s", cs->redis->err ? cs->redis->errstr : "reply error");
        sentinel_suspect(cs->redis->tcp.host, cs->redis->tcp.port);
        if (cs->cluster != NULL)
            rcluster_reset(cs->cluster);    /* and the map read again: a failover? */
        else
            redisFree(cs->redis);
        cs->redis = NULL;
    }
}

PGconn *conn_pg_open(char *err, size_t errlen)
{
    char timeout[16], options[64], user_timeout[16];
    /* Our defaults first: later keywords win, so PG_DSN can override them.
     * A peer that vanished (host down, network cut) is noticed by TCP
     * itself: keepalives on an idle or waiting connection (5 s, then 3
     * probes 2 s apart), tcp_user_timeout for data sent and never
     * acknowledged, as long as one round trip may last (store.c bounds
     * every wait for an answer the same way, which also covers a server
     * that stopped answering while its kernel still acknowledges). The
     * connect itself is bounded by connect_timeout. */
    const char *keys[] = { "connect_timeout", "application_name", "options", "keepalives",
                           "keepalives_idle", "keepalives_interval", "keepalives_count",
                           "tcp_user_timeout", "dbname", NULL };
    const char *vals[] = { timeout, g_cfg.instance_id, options, "1", "5", "2", "3", user_timeout,
                           g_cfg.pg_dsn[0] ? g_cfg.pg_dsn : NULL, NULL };
    PGconn *pg;
    int rc = -1;

    snprintf(timeout, sizeof timeout, "%d", g_cfg.pg_connect_timeout_s);
    snprintf(user_timeout, sizeof user_timeout, "%d", g_cfg.pg_statement_timeout_ms + 1000);
    snprintf(options, sizeof options, "-c statement_timeout=%d", g_cfg.pg_statement_timeout_ms);
    pg = PQconnectdbParams(keys, vals, 1);
    if (pg == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (PQstatus(pg) != CONNECTION_OK) {
        snprintf(err, errlen, "%s", PQerrorMessage(pg));
        goto out;
    }
    if (pg_init != NULL && pg_init(pg) != 0) {
        snprintf(err, errlen, "session set-up refused: %s",
                 PQerrorMessage(pg)[0] ? PQerrorMessage(pg) : "see the error above");
        goto out;
    }
    rc = 0;
out:
    if (rc != 0) {
        /* libpq messages end with a newline; logs want one line. */
        for (char *p = err; *p; p++)
            if (*p == '\n')
                *p = ' ';
        PQfinish(pg);
        pg = NULL;
    }
    return pg;
}

/* The session in '*slot', re-opened when it is gone or (with 'recheck')
 * failed its periodic check. */
static PGconn *session(PGconn **slot, int64_t *checked_us, int recheck)
{
    char err[512];

    if (*slot != NULL) {
        /* A session left inside a transaction (it should never be) is not reused. */
        if (PQstatus(*slot) == CONNECTION_OK && PQtransactionStatus(*slot) == PQTRANS_IDLE &&
            !socket_stale(PQsocket(*slot))) {
            if (!recheck || conn_pg_recheck(*slot, checked_us) == 0)
                return *slot;
            log_info("postgres session failed its check; reconnecting");
        } else {
            log_info("postgres connection lost; reconnecting");
        }
        PQfinish(*slot);
        *slot = NULL;
    }
    *slot = conn_pg_open(err, sizeof err);
    *checked_us = util_mono_us();
    if (*slot == NULL)
        log_warn("postgres unavailable: %s", err);
    return *slot;
}

PGconn *conn_pg(conn_set *cs)
{
    return session(&cs->pg, &cs->pg_checked_us, 1);
}

PGconn *conn_pg_aside(conn_set *cs)
{
    /* No periodic check: it confirms commits already made, and a check
     * failing then (the standbys just lost) would turn an order a standby
     * may already have into a quick 503 that looks refused. */
    return session(&cs->pg_aside, &cs->pg_aside_checked_us, 0);
}

void conn_pg_broken(conn_set *cs)
{
    if (cs->pg != NULL) {
        PQfinish(cs->pg);
        cs->pg = NULL;
    }
}
