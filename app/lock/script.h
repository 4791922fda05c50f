/* script: Redis Lua scripts, read from <dir>/<name>.lua at start and run
 * with EVALSHA, falling back to EVAL when the server answers NOSCRIPT
 * (restart, failover, SCRIPT FLUSH). Part of the lock library: it knows
 * the library's own scripts by id, and runs any other script file its
 * caller loads (script_file). */
#ifndef SECKILL_SCRIPT_H
#define SECKILL_SCRIPT_H

#include <stddef.h>
#include <stdint.h>
#include <hiredis/hiredis.h>

/* The lock library's scripts. */
enum script_id {
    SCRIPT_LOCK_ACQUIRE,   /* lua/lock_acquire.lua */
    SCRIPT_LOCK_RELEASE,   /* lua/lock_release.lua */
    SCRIPT_LOCK_RENEW,     /* lua/lock_renew.lua (watchdog batch) */
    SCRIPT_COUNT
};

/* One loaded script. Zero-initialise, then script_file_load; read-only
 * (and shareable between threads) after. */
typedef struct script_file {
    const char *name;      /* base name, borrowed from the loader's caller */
    char *src;             /* NULL until loaded */
    size_t len;
    char sha[41];
} script_file;

/* Reads <dir>/<name>.lua into 's' and computes its SHA1. Call before
 * threads use 's'. Returns 0, or -1 with the reason in 'err'. */
int script_file_load(script_file *s, const char *dir, const char *name, char *err,
                     size_t errlen);

/* Reads every script of the lock library from 'dir'. Call once before
 * threads start. Returns 0, or -1 with the reason in 'err'. */
int script_load_all(const char *dir, char *err, size_t errlen);

/* SCRIPT LOAD of every library script on 'c', in one round trip: for a
 * connection to a node that may never have run them (a Redis Cluster node
 * reached through ASK, where a NOSCRIPT fallback would go out without the
 * ASKING it needs). Returns 0, or -1 when a load failed (c->err set when
 * the connection did). */
int script_cache(redisContext *c);

/* script_cache with the signature of rcluster_opts.on_connect ('arg'
 * unused): every new connection to a cluster node caches the scripts. */
int script_cache_on_connect(redisContext *c, void *arg);

/* Name and SHA1 (40 hex chars) of a library script, for logs and tests. */
const char *script_name(enum script_id id);
const char *script_sha(enum script_id id);

/* Runs a script with 'nkeys' keys followed by the other arguments:
 * argv[0..nkeys-1] are KEYS, the rest ARGV; argvlen may be NULL for
 * NUL-terminated strings. Returns the reply (caller frees it with
 * freeReplyObject; it may be REDIS_REPLY_ERROR), or NULL when the connection
 * failed (c->err set: the context must be discarded). Reports the round
 * trip to the observer. */
redisReply *script_run(redisContext *c, enum script_id id, int nkeys,
                       int argc, const char **argv, const size_t *argvlen);
redisReply *script_file_run(redisContext *c, const script_file *s, int nkeys, int argc,
                            const char **argv, const size_t *argvlen);

/* Pipelining: script_append adds the EVALSHA to c's output buffer (no I/O;
 * 0, or -1 when hiredis cannot format it); script_recv sends what is
 * buffered and reads the next reply, which must be this call's (same
 * arguments). With 'fallback' a NOSCRIPT answer is re-sent as EVAL and
 * waited for, which is only right when no later reply is pending; without
 * it the NOSCRIPT error is returned (script_is_noscript). NULL: connection
 * failed, as for script_run. Observing the round trip is the caller's. */
int script_append(redisContext *c, enum script_id id, int nkeys,
                  int argc, const char **argv, const size_t *argvlen);
redisReply *script_recv(redisContext *c, enum script_id id, int nkeys,
                        int argc, const char **argv, const size_t *argvlen, int fallback);
int script_file_append(redisContext *c, const script_file *s, int nkeys, int argc,
                       const char **argv, const size_t *argvlen);
redisReply *script_file_recv(redisContext *c, const script_file *s, int nkeys, int argc,
                             const char **argv, const size_t *argvlen, int fallback);
int script_is_noscript(const redisReply *r);

/* The script sent as EVAL with its source (cached by Redis as it runs),
 * not EVALSHA: one command, so that a cluster's ASKING before it covers
 * it (a NOSCRIPT answer would use up the ASKING, and the fallback EVAL
 * would go out without it). The reply, through script_demoted. */
redisReply *script_file_eval(redisContext *c, const script_file *s, int nkeys, int argc,
                             const char **argv, const size_t *argvlen);

/* "-READONLY ..." means the server is a replica now: a failover demoted it
 * while this connection stayed open, and no write will succeed on it
 * again. script_demoted turns such a reply into a failed connection: it
 * frees 'r', sets c->err (REDIS_ERR_OTHER, the server's message in
 * c->errstr) and returns NULL, so the caller discards the context as after
 * any connection failure and its next connection finds the master. Any
 * other reply (NULL included) is returned as it is. Every script call of
 * the library does it; other callers use it on their writes' replies. */
redisReply *script_demoted(redisContext *c, redisReply *r);

/* The library's one outward report: called after each of its Redis round
 * trips with the latency and whether a reply came (an error reply counts;
 * a dead connection does not). NULL (the default): nobody listens. Set it
 * before threads start. */
typedef void (*script_observe_fn)(int64_t latency_us, int ok);
void script_set_observer(script_observe_fn fn);
void script_observe(int64_t latency_us, int ok);

/* SHA1 of 'len' bytes as 40 lowercase hex digits + NUL. */
void script_sha1_hex(const void *data, size_t len, char out[41]);

#endif
