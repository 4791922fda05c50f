/* conn: the per-thread connection set. Each worker thread owns one Redis
 * context and one Postgres connection, created on first use and re-opened
 * after a failure; nothing here is shared between threads, so no locks. */
#ifndef SECKILL_CONN_H
#define SECKILL_CONN_H

#include <stdint.h>
#include <hiredis/hiredis.h>
#include <libpq-fe.h>

#include "rcluster.h"

typedef struct conn_set {
    redisContext *redis;   /* NULL until connected, or after conn_redis_broken; with a
                            * cluster, the last one handed out, owned by 'cluster' */
    rcluster *cluster;     /* REDIS_CLUSTER_NODES: this thread's routing; else NULL */
    uint64_t redis_gen;    /* sentinel_generation() when 'redis' was opened */
    PGconn *pg;            /* NULL until connected, or after conn_pg_broken */
    int64_t pg_checked_us; /* util_mono_us() of pg's last set-up or recheck */
    PGconn *pg_aside;      /* conn_pg_aside's session; NULL until first used */
    int64_t pg_aside_checked_us;
    uint64_t thread_id;    /* process-unique, never reused (lock owner id) */
    char owner[128];       /* "<instance uuid>:<thread_id>", the lock hash field */
} conn_set;

/* A new Postgres session's set-up (preparing the statements the caller
 * will run): 0, or -1 to refuse the session. */
typedef int (*conn_pg_init_fn)(PGconn *pg);

/* Installs the set-up every Postgres session gets before its first use
 * (conn_pg, conn_pg_open). Call once, before any thread connects. */
void conn_set_pg_init(conn_pg_init_fn fn);

/* Installs a check that conn_pg runs on a session it hands out when the
 * last one (or the set-up) is 'every_ms' old: -1 closes the session and
 * conn_pg opens a new one. For what can change under a live session (the
 * primary losing its synchronous standby). Call once, before any thread
 * connects. */
void conn_set_pg_recheck(conn_pg_init_fn fn, int every_ms);

/* For a session kept outside conn_pg (conn_pg_open's): runs the check when
 * '*checked_us' (util_mono_us(), set by the caller at open) is a period
 * old, and stamps it. 0: keep the session; -1: it failed, close it. */
int conn_pg_recheck(PGconn *pg, int64_t *checked_us);

/* This thread's set, created on first call; freed when the thread exits
 * (or by conn_close_thread). Never NULL. */
conn_set *conn_get(void);

/* A connected Redis context, or NULL when Redis is unreachable (the reason
 * is logged). Connects with the configured connect and command timeouts,
 * authenticates and selects the database. Borrowed: do not free.
 * With Sentinel (REDIS_SENTINELS) it connects to the master the Sentinels
 * name, checks with ROLE that it is the master, and re-opens a context
 * whose master has been replaced since (a failover) before handing it out.
 * After a timeout on any worker, every worker gets NULL at once for a short
 * while (a circuit breaker): a crowd fails fast instead of queueing behind
 * one timeout per thread. */
redisContext *conn_redis(conn_set *cs);

/* 1 when Redis is a Redis Cluster (REDIS_CLUSTER_NODES). Every context
 * handed out is then a connection to one master: conn_redis's serves the
 * slot of the service's own keys (CONN_HOME_TAG: the instance registry,
 * the reset acknowledgements); conn_redis_key's the slot of a given key. */
int conn_redis_cluster(void);

/* With a cluster: a routing handle of its own over REDIS_CLUSTER_NODES,
 * as the workers' (the scripts cached on each new node), for a thread
 * outside the worker pool; the caller frees it (rcluster_free). NULL with
 * the reason in 'err' (or without a cluster). */
rcluster *conn_cluster_open(char *err, size_t errlen);

/* The hash tag of the service's own keys: with a cluster they share a
 * slot, whose master conn_redis and conn_redis_open connect to. */
#define CONN_HOME_TAG "{seckill}"

/* The connection for commands on 'key': with a cluster, to the master of
 * its slot (its hash tag's), as the map last read says (read first when
 * stale); else cs->redis as it is, unless it is unset or its master was
 * replaced (then conn_redis's: the socket probe is once per request, in
 * conn_redis). cs->redis is set to it. Borrowed; NULL when unreachable
 * (logged). */
redisContext *conn_redis_key(conn_set *cs, const char *key);

/* With a cluster, after a reply on cs->redis named a redirection: the
 * connection to send the command to again (MOVED: the slot's new master,
 * remembered; ASK: the target, ASKING sent), cs->redis set to it. NULL:
 * nothing to send again at once (TRYAGAIN, CLUSTERDOWN, an unreachable
 * node, or no cluster); the map is read again at the next use. */
redisContext *conn_redis_redirected(conn_set *cs, const rcluster_redirect *rd);

/* The connection to send a command on 'key' again after its 'tries'-th
 * send was answered with the redirection 'rd': conn_redis_redirected's,
 * or, when there is nothing to send again at once, after a pause of 10,
 * 20, 40 ... ms the connection routed anew for 'key' (conn_redis_key).
 * Borrowed; NULL when unreachable. */
redisContext *conn_redis_resend(conn_set *cs, const rcluster_redirect *rd, const char *key,
                               int tries);

/* Redirections followed since start (conn_redis_redirected), by kind:
 * for /stats and the tests of a migration or a failover. */
typedef struct conn_cluster_counters {
    uint64_t moved, ask, retry;   /* retry: TRYAGAIN and CLUSTERDOWN */
} conn_cluster_counters;

void conn_cluster_counters_get(conn_cluster_counters *out);

/* Call after a NULL reply or any context error: the context is freed and
 * the next conn_redis opens a new one (a timed-out reply may still arrive
 * on the old socket, so it must never be reused). With Sentinel, the
 * Sentinels are asked again where the master is. */
void conn_redis_broken(conn_set *cs);

/* A connected Postgres session, set up by the conn_set_pg_init hook, or NULL when
 * Postgres is unreachable. Borrowed: do not free. */
PGconn *conn_pg(conn_set *cs);

/* A second session of this thread, as conn_pg's, for a short statement
 * while the first may be busy (a batch leader's pipeline): PG_HA's
 * confirmation of commits. Set up as conn_pg's, but not checked again
 * while open (conn_set_pg_recheck): a commit made is confirmed or not by
 * the standbys' positions, whatever the primary's state now. Borrowed;
 * NULL when Postgres is unreachable. */
PGconn *conn_pg_aside(conn_set *cs);

/* Call when a PG call failed at the connection level: the connection is
 * closed and re-opened (and re-prepared) by the next conn_pg. */
void conn_pg_broken(conn_set *cs);

/* Opens a standalone Redis context with the configured timeouts, for threads
 * outside the worker pool (stats publisher, tests). Caller frees with
 * redisFree. NULL on failure, with the reason in 'err'. With Sentinel: to
 * the master, as conn_redis; a refusal or a replica at the address makes
 * the Sentinels be asked again. */
redisContext *conn_redis_open(char *err, size_t errlen);

/* 0 when a standalone context should be re-opened: with Sentinel, it leads
 * to a server that is no longer the master (a failover happened); always 1
 * without Sentinel. For threads that keep a context open (subscribers,
 * publisher, lease renewal). */
int conn_redis_current(const redisContext *c);

/* The master in use: "host:port" (Sentinel's answer, or REDIS_URL's);
 * with a cluster, "cluster " and the seeds. */
void conn_redis_master(char *buf, size_t n);

/* Opens a standalone Postgres connection (set up as above). Caller frees
 * with PQfinish. NULL on failure, with the reason in 'err'. */
PGconn *conn_pg_open(char *err, size_t errlen);

/* A fresh owner id "<instance uuid>:<n>", n from the same never-reused
 * counter as the threads': for a request whose lock stays held after its
 * worker has moved on to other requests (batched), so that the worker's next
 * request of the same user cannot take it again as its reentrant holder. */
void conn_fresh_owner(char *buf, size_t n);

/* Gives the calling worker a new owner id (cs->owner, cs->thread_id), from
 * the same counter: after a lock reply of this owner was lost (an acquire
 * that may have been granted, a release that may not have happened), so
 * that its next request of the same user cannot re-enter, and extend, a
 * hold that nobody will release. */
void conn_renew_owner(conn_set *cs);

/* Closes and frees the calling thread's set now (idempotent). */
void conn_close_thread(void);

#endif
