/* broadcast: the reset notice subscriber. */
#include "broadcast.h"
#include "bgthread.h"
#include "config.h"
#include "conn.h"
#include "log.h"
#include "util.h"
#include "script.h"
#include "voucher_cache.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static bgthread subscriber = BGTHREAD_INIT;

/* A reset notice is "<voucher id> <nonce>"; each subscriber, once it has
 * dropped its cache, counts itself in BROADCAST_ACK_PREFIX<nonce>, and the
 * instance that announced the reset waits until every receiver PUBLISH
 * counted has done so: its 200 then means no instance answers from what
 * it knew before the reset. */
#define BROADCAST_ACK_PREFIX "{seckill}:voucher-reset-ack:"
#define BROADCAST_ACK_TTL_MS 60000
#define BROADCAST_ACK_POLL_US 2000

/* The subscriber's second connection, for its acknowledgements (a
 * subscribed connection takes no other command). Subscriber thread only. */
static redisContext *ack_conn;

static void acknowledge(const char *nonce)
{
    char err[256];
    redisReply *r;

    if (ack_conn != NULL && !conn_redis_current(ack_conn)) {
        redisFree(ack_conn);
        ack_conn = NULL;
    }
    if (ack_conn == NULL && (ack_conn = conn_redis_open(err, sizeof err)) == NULL) {
        log_warn("broadcast: cannot acknowledge reset %s: %s", nonce, err);
        return;
    }
    redisAppendCommand(ack_conn, "INCR %s%s", BROADCAST_ACK_PREFIX, nonce);
    redisAppendCommand(ack_conn, "PEXPIRE %s%s %d", BROADCAST_ACK_PREFIX, nonce,
                       BROADCAST_ACK_TTL_MS);
    for (int i = 0; i < 2; i++) {
        r = NULL;
        if (redisGetReply(ack_conn, (void **)&r) != REDIS_OK || r == NULL ||
            r->type == REDIS_REPLY_ERROR) {
            log_warn("broadcast: acknowledging reset %s failed: %s", nonce,
                     r != NULL ? r->str : ack_conn->errstr);
            freeReplyObject(r);
            redisFree(ack_conn);
            ack_conn = NULL;
            return;
        }
        freeReplyObject(r);
    }
}

/* Subscribes on a fresh connection. NULL when Redis is down. */
static redisContext *subscribe(void)
{
    char err[256];
    redisContext *c = conn_redis_open(err, sizeof err);
    redisReply *r;

    if (c == NULL)
        return NULL;
    r = redisCommand(c, "SUBSCRIBE %s", BROADCAST_RESET_CHANNEL);
    if (r == NULL || r->type != REDIS_REPLY_ARRAY) {
        freeReplyObject(r);
        redisFree(c);
        return NULL;
    }
    freeReplyObject(r);
    /* Whatever happened while we were not listening is unknown: start clean. */
    voucher_cache_invalidate_all();
    return c;
}

static void broadcast_main(bgthread *self, void *arg)
{
    redisContext *c = NULL;

    (void)arg;
    while (!bgthread_stopping(self)) {
        redisReply *r = NULL;

        if (c != NULL && !conn_redis_current(c)) {
            log_info("broadcast: the master moved; re-subscribing there");
            redisFree(c);
            c = NULL;
        }
        if (c == NULL && (c = subscribe()) == NULL) {
            bgthread_sleep(self, 200);
            continue;
        }
        /* poll, not a socket timeout: a timed-out hiredis read poisons the
         * context, and waking every 200 ms is how the loop sees a stop. */
        struct pollfd p = { .fd = c->fd, .events = POLLIN };
        int n = poll(&p, 1, 200);
        if (n == 0 || (n < 0 && errno == EINTR))
            continue;
        if (n < 0 || redisBufferRead(c) != REDIS_OK) {
            log_warn("broadcast: subscriber connection lost (%s); re-subscribing",
                     c->err ? c->errstr : "poll failed");
            redisFree(c);
            c = NULL;
            continue;
        }
        while (redisGetReplyFromReader(c, (void **)&r) == REDIS_OK && r != NULL) {
            if (r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
                r->element[2]->type == REDIS_REPLY_STRING) {
                const char *nonce = strchr(r->element[2]->str, ' ');
                log_info("broadcast: voucher %s was reset: dropping cached voucher state",
                         r->element[2]->str);
                voucher_cache_invalidate_all();
                if (nonce != NULL)
                    acknowledge(nonce + 1);
            }
            freeReplyObject(r);
            r = NULL;
        }
    }
    if (c != NULL)
        redisFree(c);
    if (ack_conn != NULL)
        redisFree(ack_conn);
    ack_conn = NULL;
}

int broadcast_start(void)
{
    return bgthread_start_logged(&subscriber, "sk-broadcast", broadcast_main, NULL, NULL,
                                 "broadcast subscriber");
}

void broadcast_stop(void)
{
    bgthread_stop(&subscriber);
}

/* A nonce no other announcement shares: this instance's id, a counter. */
static void make_nonce(char *buf, size_t n)
{
    static atomic_uint_fast64_t seq;

    snprintf(buf, n, "%s:%ld:%" PRIuFAST64, g_cfg.instance_id, (long)time(NULL),
             atomic_fetch_add(&seq, 1) + 1);
}

int broadcast_voucher_reset(redisContext *c, int64_t voucher_id, int wait_ms,
                            long long *receivers, long long *acked)
{
    char nonce[128], msg[160];
    redisReply *r;
    int64_t until;
    int rc = -1;

    *receivers = *acked = 0;
    voucher_cache_invalidate_all();              /* this instance at once */
    make_nonce(nonce, sizeof nonce);
    snprintf(msg, sizeof msg, "%" PRId64 " %s", voucher_id, nonce);   /* one argument */
    r = script_demoted(c, redisCommand(c, "PUBLISH %s %s", BROADCAST_RESET_CHANNEL, msg));
    if (r == NULL || r->type != REDIS_REPLY_INTEGER)
        goto out;
    *receivers = r->integer;
    freeReplyObject(r);
    r = NULL;
    until = util_mono_us() + (int64_t)wait_ms * 1000;
    for (;;) {
        r = script_demoted(c, redisCommand(c, "GET %s%s", BROADCAST_ACK_PREFIX, nonce));
        if (r == NULL || r->type == REDIS_REPLY_ERROR)
            goto out;
        *acked = r->type == REDIS_REPLY_STRING ? strtoll(r->str, NULL, 10) : 0;
        freeReplyObject(r);
        r = NULL;
        if (*acked >= *receivers || util_mono_us() >= until)
            break;
        nanosleep(&(struct timespec){ 0, BROADCAST_ACK_POLL_US * 1000L }, NULL);
    }
    rc = 0;
out:
    freeReplyObject(r);
    return rc;
}
