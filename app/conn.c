/* conn: per-thread Redis and Postgres connections. */
#include "conn.h"
#include "config.h"
#include "log.h"
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

void conn_set_pg_init(conn_pg_init_fn fn)
{
    pg_init = fn;
}

static void set_free(void *p)
{
    conn_set *cs = p;

    if (cs == NULL)
        return;
    if (cs->redis != NULL)
        redisFree(cs->redis);
    if (cs->pg != NULL)
        PQfinish(cs->pg);
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

static int redis_ok(redisContext *c, redisReply *r, char *err, size_t errlen, const char *what)
{
    int ok = r != NULL && r->type != REDIS_REPLY_ERROR;

    if (!ok)
        snprintf(err, errlen, "%s: %s", what, r ? r->str : c->errstr);
    freeReplyObject(r);
    return ok;
}

redisContext *conn_redis_open(char *err, size_t errlen)
{
    const redis_url *u = &g_cfg.redis;
    struct timeval tv = { g_cfg.redis_timeout_ms / 1000, (g_cfg.redis_timeout_ms % 1000) * 1000 };
    redisContext *c = redisConnectWithTimeout(u->host, u->port, tv);

    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (c->err) {
        snprintf(err, errlen, "connect %s:%d: %s", u->host, u->port, c->errstr);
        goto fail;
    }
    if (redisSetTimeout(c, tv) != REDIS_OK || redisEnableKeepAlive(c) != REDIS_OK) {
        snprintf(err, errlen, "socket options: %s", c->errstr);
        goto fail;
    }
    if (u->password[0] != '\0') {
        redisReply *r = u->username[0] != '\0'
                            ? redisCommand(c, "AUTH %s %s", u->username, u->password)
                            : redisCommand(c, "AUTH %s", u->password);
        if (!redis_ok(c, r, err, errlen, "AUTH"))
            goto fail;
    }
    if (u->db != 0 && !redis_ok(c, redisCommand(c, "SELECT %d", u->db), err, errlen, "SELECT"))
        goto fail;
    return c;
fail:
    redisFree(c);
    return NULL;
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

redisContext *conn_redis(conn_set *cs)
{
    char err[256];

    if (util_mono_us() < atomic_load(&redis_open_until_us))
        return NULL;
    if (cs->redis != NULL) {
        if (!socket_stale(cs->redis->fd))
            return cs->redis;
        log_info("redis connection closed by the server; reconnecting");
        redisFree(cs->redis);
        cs->redis = NULL;
    }
    cs->redis = conn_redis_open(err, sizeof err);
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
        goto fail;
    }
    if (pg_init != NULL && pg_init(pg) != 0) {
        snprintf(err, errlen, "prepare: %s", PQerrorMessage(pg));
        goto fail;
    }
    return pg;
fail:
    /* libpq messages end with a newline; logs want one line. */
    for (char *p = err; *p; p++)
        if (*p == '\n')
            *p = ' ';
    PQfinish(pg);
    return NULL;
}

PGconn *conn_pg(conn_set *cs)
{
    char err[512];

    if (cs->pg != NULL) {
        /* A session left inside a transaction (it should never be) is not reused. */
        if (PQstatus(cs->pg) == CONNECTION_OK && PQtransactionStatus(cs->pg) == PQTRANS_IDLE &&
            !socket_stale(PQsocket(cs->pg)))
            return cs->pg;
        log_info("postgres connection lost; reconnecting");
        conn_pg_broken(cs);
    }
    cs->pg = conn_pg_open(err, sizeof err);
    if (cs->pg == NULL)
        log_warn("postgres unavailable: %s", err);
    return cs->pg;
}

void conn_pg_broken(conn_set *cs)
{
    if (cs->pg != NULL) {
        PQfinish(cs->pg);
        cs->pg = NULL;
    }
}
