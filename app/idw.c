/* idw: order ids from the clock and a per-day Redis counter. */
#include "idw.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "rec.h"
#include "script.h"
#include "util.h"

#define IDW_SECONDS_MAX 0x7fffffffLL   /* 31 bits */
#define IDW_COUNT_MAX   0xffffffffLL   /* 32 bits */

int64_t idw_compose(int64_t seconds, int64_t count)
{
    if (seconds < 0 || seconds > IDW_SECONDS_MAX || count < 0 || count > IDW_COUNT_MAX)
        return -1;
    /* seconds < 2^31, so the shift never reaches the sign bit */
    return (int64_t)(((uint64_t)seconds << 32) | (uint64_t)count);
}

void idw_key(const char *prefix, int64_t now, char *buf, size_t n)
{
    struct tm tm;
    time_t t = (time_t)now;

    if (n == 0)
        return;
    /* UTC, whatever TZ says: every instance must agree on the day. */
    if ((int64_t)t != now || gmtime_r(&t, &tm) == NULL) {
        buf[0] = '\0';
        return;
    }
    snprintf(buf, n, "icr:%s:%04d:%02d:%02d", prefix, tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday);
}

idw_status idw_next(redisContext *c, const char *prefix, int64_t *id)
{
    /* One reading feeds both the id's seconds and the counter's date. */
    return idw_next_at(c, prefix, (int64_t)time(NULL), id);
}

idw_status idw_next_at(redisContext *c, const char *prefix, int64_t now, int64_t *id)
{
    idw_op op;

    idw_send(c, prefix, now, &op);
    return idw_recv(c, &op, id);
}

idw_status idw_send(redisContext *c, const char *prefix, int64_t now, idw_op *op)
{
    /* "icr:" + prefix + ":yyyy:MM:dd"; room for a year past 9999 too. */
    size_t keylen = strlen(prefix) + 32;

    memset(op, 0, sizeof *op);
    op->now = now;
    op->st = IDW_REDIS;
    if (now < IDW_EPOCH || now - IDW_EPOCH > IDW_SECONDS_MAX) {
        log_error("idw: clock %lld outside the id range", (long long)now);
        op->st = IDW_CLOCK;
        return op->st;
    }
    op->key = xmalloc(keylen);
    idw_key(prefix, now, op->key, keylen);
    op->t0 = util_mono_us();
    if (redisAppendCommand(c, "INCR %s", op->key) != REDIS_OK) {
        log_warn("idw: INCR %s: cannot format the command", op->key);
        return op->st;
    }
    op->sent = 1;
    return IDW_OK;
}

idw_status idw_recv(redisContext *c, idw_op *op, int64_t *id)
{
    idw_status st = op->st;
    void *reply = NULL;
    redisReply *r = NULL;

    if (!op->sent)
        goto cleanup;
    st = IDW_REDIS;
    if (redisGetReply(c, &reply) != REDIS_OK) {
        freeReplyObject(reply);
        reply = NULL;
    }
    r = script_demoted(c, reply);
    rec_backend(REC_REDIS, util_mono_us() - op->t0, r != NULL);
    if (r == NULL) {
        log_warn("idw: INCR %s: %s", op->key, c->errstr);
        goto cleanup;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        log_warn("idw: INCR %s: %s", op->key, r->str);
        goto cleanup;
    }
    if (r->type != REDIS_REPLY_INTEGER) {
        log_warn("idw: INCR %s: unexpected reply type %d", op->key, r->type);
        goto cleanup;
    }
    /* Never wrap: a reused low count would collide with an earlier id. */
    if (r->integer < 1 || r->integer > IDW_COUNT_MAX) {
        log_error("idw: %s count %lld does not fit in 32 bits", op->key, r->integer);
        st = IDW_EXHAUSTED;
        goto cleanup;
    }
    *id = idw_compose(op->now - IDW_EPOCH, r->integer);
    st = IDW_OK;

cleanup:
    freeReplyObject(r);
    free(op->key);
    op->key = NULL;
    op->sent = 0;
    return st;
}
