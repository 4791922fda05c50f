/* broadcast: the reset notice subscriber. */
#include "broadcast.h"
#include "bgthread.h"
#include "conn.h"
#include "log.h"
#include "script.h"
#include "voucher_cache.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <string.h>

static bgthread subscriber = BGTHREAD_INIT;

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
                log_info("broadcast: voucher %s was reset: dropping cached voucher state",
                         r->element[2]->str);
                voucher_cache_invalidate_all();
            }
            freeReplyObject(r);
            r = NULL;
        }
    }
    if (c != NULL)
        redisFree(c);
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

int broadcast_voucher_reset(redisContext *c, int64_t voucher_id)
{
    redisReply *r;
    int ok;

    voucher_cache_invalidate_all();              /* this instance at once */
    r = script_demoted(c, redisCommand(c, "PUBLISH %s %" PRId64, BROADCAST_RESET_CHANNEL, voucher_id));
    ok = r != NULL && r->type == REDIS_REPLY_INTEGER;
    freeReplyObject(r);
    return ok ? 0 : -1;
}
