/* order_id: order ids from the clock and a per-day Redis counter. */
#include "order_id.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "counters.h"
#include "script.h"
#include "util.h"

#define ORDER_ID_SECONDS_MAX 0x7fffffffLL   /* 31 bits */
#define ORDER_ID_COUNT_MAX   0xffffffffLL   /* 32 bits */

int64_t order_id_compose(int64_t seconds, int64_t count)
{
    if (seconds < 0 || seconds > ORDER_ID_SECONDS_MAX || count < 0 || count > ORDER_ID_COUNT_MAX)
        return -1;
    /* seconds < 2^31, so the shift never reaches the sign bit */
    return (int64_t)(((uint64_t)seconds << 32) | (uint64_t)count);
}

void order_id_key(const char *prefix, int64_t now, char *buf, size_t n)
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

order_id_status order_id_next(redisContext *c, const char *prefix, int64_t *id)
{
    /* One reading feeds both the id's seconds and the counter's date. */
    return order_id_next_at(c, prefix, (int64_t)time(NULL), id);
}

order_id_status order_id_next_at(redisContext *c, const char *prefix, int64_t now, int64_t *id)
{
    order_id_op op;

    order_id_send(c, prefix, now, &op);
    return order_id_recv(c, &op, id);
}

order_id_status order_id_send(redisContext *c, const char *prefix, int64_t now, order_id_op *op)
{
    /* "icr:" + prefix + ":yyyy:MM:dd"; room for a year past 9999 too. */
    size_t keylen = strlen(prefix) + 32;

    memset(op, 0, sizeof *op);
    op->now = now;
    op->st = ORDER_ID_REDIS;
    if (now < ORDER_ID_EPOCH || now - ORDER_ID_EPOCH > ORDER_ID_SECONDS_MAX) {
        log_error("order_id: clock %lld outside the id range", (long long)now);
        op->st = ORDER_ID_CLOCK;
        return op->st;
    }
    op->key = xmalloc(keylen);
    order_id_key(prefix, now, op->key, keylen);
    op->t0 = util_mono_us();
    if (redisAppendCommand(c, "INCR %s", op->key) != REDIS_OK) {
        log_warn("order_id: INCR %s: cannot format the command", op->key);
        return op->st;
    }
    op->sent = 1;
    return ORDER_ID_OK;
}

order_id_status order_id_recv(redisContext *c, order_id_op *op, int64_t *id)
{
    order_id_status st = op->st;
    void *reply = NULL;
    redisReply *r = NULL;

    if (!op->sent)
        goto out;
    st = ORDER_ID_REDIS;
    if (redisGetReply(c, &reply) != REDIS_OK) {
        freeReplyObject(reply);
        reply = NULL;
    }
    r = script_demoted(c, reply);
    counters_backend(COUNTERS_REDIS, util_mono_us() - op->t0, r != NULL);
    if (r == NULL) {
        log_warn("order_id: INCR %s: %s", op->key, c->errstr);
        goto out;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        if (rcluster_redirect_parse(r, &op->redirect) != RCLUSTER_NONE) {
            log_debug("order_id: INCR %s: %s", op->key, r->str);
            st = ORDER_ID_MOVED;
        } else {
            log_warn("order_id: INCR %s: %s", op->key, r->str);
        }
        goto out;
    }
    if (r->type != REDIS_REPLY_INTEGER) {
        log_warn("order_id: INCR %s: unexpected reply type %d", op->key, r->type);
        goto out;
    }
    /* Never wrap: a reused low count would collide with an earlier id. */
    if (r->integer < 1 || r->integer > ORDER_ID_COUNT_MAX) {
        log_error("order_id: %s count %lld does not fit in 32 bits", op->key, r->integer);
        st = ORDER_ID_EXHAUSTED;
        goto out;
    }
    *id = order_id_compose(op->now - ORDER_ID_EPOCH, r->integer);
    st = ORDER_ID_OK;

out:
    freeReplyObject(r);
    free(op->key);
    op->key = NULL;
    op->sent = 0;
    return st;
}

/* One INCRBY on 'c'; the status, the new value in *last, and the node's
 * answer in 'rd' when it named a redirection (ORDER_ID_MOVED). */
static order_id_status incrby(redisContext *c, const char *key, int n, int64_t *last,
                              rcluster_redirect *rd)
{
    int64_t t0 = util_mono_us();
    redisReply *r = script_demoted(c, redisCommand(c, "INCRBY %s %d", key, n));
    order_id_status st = ORDER_ID_REDIS;

    counters_backend(COUNTERS_REDIS, util_mono_us() - t0, r != NULL);
    if (r == NULL) {
        log_warn("order_id: INCRBY %s: %s", key, c->errstr);
        return st;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        if (rcluster_redirect_parse(r, rd) != RCLUSTER_NONE)
            st = ORDER_ID_MOVED;
        else
            log_warn("order_id: INCRBY %s: %s", key, r->str);
    } else if (r->type != REDIS_REPLY_INTEGER) {
        log_warn("order_id: INCRBY %s: unexpected reply type %d", key, r->type);
    } else if (r->integer - n + 1 < 1 || r->integer > ORDER_ID_COUNT_MAX) {
        log_error("order_id: %s count %lld does not fit in 32 bits", key, r->integer);
        st = ORDER_ID_EXHAUSTED;
    } else {
        *last = r->integer;
        st = ORDER_ID_OK;
    }
    freeReplyObject(r);
    return st;
}

order_id_status order_id_take_counts(conn_set *cs, const char *prefix, int64_t now, int n,
                                     int64_t *first)
{
    size_t keylen = strlen(prefix) + 32;
    char *key;
    order_id_status st = ORDER_ID_REDIS;
    rcluster_redirect rd;
    redisContext *c;
    int64_t last = 0;

    if (now < ORDER_ID_EPOCH || now - ORDER_ID_EPOCH > ORDER_ID_SECONDS_MAX || n < 1) {
        log_error("order_id: clock %lld outside the id range", (long long)now);
        return ORDER_ID_CLOCK;
    }
    key = xmalloc(keylen);
    order_id_key(prefix, now, key, keylen);
    c = conn_redis_key(cs, key);
    for (int tries = 1; c != NULL; tries++) {
        st = incrby(c, key, n, &last, &rd);
        if (st != ORDER_ID_MOVED || tries == ORDER_ID_TRIES)
            break;
        c = conn_redis_resend(cs, &rd, key, tries);
    }
    if (st == ORDER_ID_OK)
        *first = last - n + 1;
    if (c != NULL && c->err)
        conn_redis_broken(cs);
    free(key);
    return st;
}

order_id_status order_id_take(conn_set *cs, const char *prefix, int64_t *id)
{
    int64_t now = (int64_t)time(NULL), count;
    order_id_status st = order_id_take_counts(cs, prefix, now, 1, &count);

    if (st == ORDER_ID_OK)
        *id = order_id_compose(now - ORDER_ID_EPOCH, count);
    return st;
}
