/* script: the Redis Lua scripts, read from lua/<name>.lua at start and run
 * with EVALSHA, falling back to EVAL when the server answers NOSCRIPT
 * (restart, failover, SCRIPT FLUSH). */
#ifndef SECKILL_SCRIPT_H
#define SECKILL_SCRIPT_H

#include <stddef.h>
#include <hiredis/hiredis.h>

enum script_id {
    SCRIPT_LOCK_ACQUIRE,   /* lua/lock_acquire.lua */
    SCRIPT_LOCK_RELEASE,   /* lua/lock_release.lua */
    SCRIPT_OWNER_RELEASE,  /* lua/owner_release.lua (demo "owner" lock) */
    SCRIPT_LOCK_RENEW,     /* lua/lock_renew.lua (watchdog batch) */
    SCRIPT_COUNT
};

/* Reads every script from 'dir' and computes its SHA1. Call once before
 * threads start. Returns 0, or -1 with the reason in 'err'. */
int script_load_all(const char *dir, char *err, size_t errlen);

/* Name and SHA1 (40 hex chars) of a loaded script, for logs and tests. */
const char *script_name(enum script_id id);
const char *script_sha(enum script_id id);

/* Runs script 'id' with 'nkeys' keys followed by the other arguments:
 * argv[0..nkeys-1] are KEYS, the rest ARGV; argvlen may be NULL for
 * NUL-terminated strings. Returns the reply (caller frees it with
 * freeReplyObject; it may be REDIS_REPLY_ERROR), or NULL when the connection
 * failed (c->err set: the context must be discarded). */
redisReply *script_run(redisContext *c, enum script_id id, int nkeys,
                       int argc, const char **argv, const size_t *argvlen);

/* Pipelining: script_append adds the EVALSHA to c's output buffer (no I/O;
 * 0, or -1 when hiredis cannot format it); script_recv sends what is
 * buffered and reads the next reply, which must be this call's (same
 * arguments). With 'fallback' a NOSCRIPT answer is re-sent as EVAL and
 * waited for, which is only right when no later reply is pending; without
 * it the NOSCRIPT error is returned (script_is_noscript). NULL: connection
 * failed, as for script_run. Latency metrics are the caller's. */
int script_append(redisContext *c, enum script_id id, int nkeys,
                  int argc, const char **argv, const size_t *argvlen);
redisReply *script_recv(redisContext *c, enum script_id id, int nkeys,
                        int argc, const char **argv, const size_t *argvlen, int fallback);
int script_is_noscript(const redisReply *r);

/* SHA1 of 'len' bytes as 40 lowercase hex digits + NUL. */
void script_sha1_hex(const void *data, size_t len, char out[41]);

#endif
