/* stream_tidy: consumer names and dead letters of the orders stream (stream_tidy.h). */
#include "stream_tidy.h"
#include "config.h"
#include "log.h"
#include "script.h"
#include "stock_redis.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define TIDY_EVERY_MS 10000

static script_file tidy_script = { .name = "group_tidy" };
static script_file replay_script = { .name = "dead_replay" };

int stream_tidy_load(const char *dir, char *err, size_t errlen)
{
    if (script_file_load(&tidy_script, dir, tidy_script.name, err, errlen) != 0 ||
        script_file_load(&replay_script, dir, replay_script.name, err, errlen) != 0)
        return -1;
    return 0;
}

int stream_tidy_every_ms(void)
{
    /* Each run refreshes the caller's own name: a third of the bound keeps
     * a live consumer's idle well below it. */
    int third = g_cfg.consumer_remove_idle_ms / 3;

    return third < TIDY_EVERY_MS ? third : TIDY_EVERY_MS;
}

int stream_tidy_consumers(redisContext *c, const char *own_name)
{
    char idle[24];
    const char *argv[4] = { STOCK_REDIS_STREAM, STOCK_REDIS_GROUP, idle, own_name };
    redisReply *r;
    int rc = -1;

    snprintf(idle, sizeof idle, "%d", g_cfg.consumer_remove_idle_ms);
    r = script_file_run(c, &tidy_script, 1, 4, argv, NULL);
    if (r == NULL)
        return -1;
    if (r->type == REDIS_REPLY_ERROR) {
        /* No stream or no group yet: the consumer creates them. */
        if (strncmp(r->str, "NOGROUP", 7) != 0 && strstr(r->str, "no such key") == NULL)
            log_warn("stream_tidy: group_tidy: %s", r->str);
        goto out;
    }
    if (r->type != REDIS_REPLY_ARRAY) {
        log_warn("stream_tidy: group_tidy: unexpected reply type %d", r->type);
        goto out;
    }
    for (size_t i = 0; i < r->elements; i++)
        if (r->element[i]->type == REDIS_REPLY_STRING)
            log_info("stream_tidy: consumer %s removed from group %s of %s: idle over %d ms "
                     "with nothing pending", r->element[i]->str, STOCK_REDIS_GROUP,
                     STOCK_REDIS_STREAM, g_cfg.consumer_remove_idle_ms);
    rc = (int)r->elements;
out:
    freeReplyObject(r);
    return rc;
}

int stream_tidy_dead_append(redisContext *c, const stream_tidy_dead *d)
{
    char cap[24], num[6][24];
    const char *argv[26];
    int argc = 0;

    snprintf(cap, sizeof cap, "%d", g_cfg.dead_letters_max);
    snprintf(num[0], sizeof num[0], "%" PRId64, d->voucher_id);
    snprintf(num[1], sizeof num[1], "%" PRId64, d->user_id);
    snprintf(num[2], sizeof num[2], "%" PRId64, d->order_id);
    snprintf(num[3], sizeof num[3], "%" PRId64, d->gen);
    /* The id's parts, as lua/order_admit.lua wrote them (order_id.h). */
    snprintf(num[4], sizeof num[4], "%" PRId64, d->order_id >> 32);
    snprintf(num[5], sizeof num[5], "%" PRId64, (int64_t)(d->order_id & 0xFFFFFFFF));
    argv[argc++] = "XADD";
    argv[argc++] = STOCK_REDIS_DEAD;
    /* "~": Redis removes whole stream nodes only, so the length stays
     * within a node (stream-node-max-entries) of the cap, at a fraction of
     * the cost of an exact trim (https://redis.io/docs/latest/commands/xadd/). */
    argv[argc++] = "MAXLEN";
    argv[argc++] = "~";
    argv[argc++] = cap;
    argv[argc++] = "*";
    argv[argc++] = "entry";
    argv[argc++] = d->entry;
    argv[argc++] = "v";
    argv[argc++] = num[0];
    argv[argc++] = "u";
    argv[argc++] = num[1];
    argv[argc++] = "o";
    argv[argc++] = num[2];
    if (d->with_id) {
        argv[argc++] = "t";
        argv[argc++] = num[4];
        argv[argc++] = "c";
        argv[argc++] = num[5];
    }
    argv[argc++] = "g";
    argv[argc++] = num[3];
    argv[argc++] = "reason";
    argv[argc++] = d->reason;
    argv[argc++] = "consumer";
    argv[argc++] = d->consumer;
    return redisAppendCommandArgv(c, argc, argv, NULL) == REDIS_OK ? 0 : -1;
}

int stream_tidy_replay(redisContext *c, int64_t max, stream_tidy_replayed *out)
{
    char n[24];
    const char *argv[3] = { STOCK_REDIS_DEAD, STOCK_REDIS_STREAM, n };
    redisReply *r;
    int rc = -1;

    memset(out, 0, sizeof *out);
    snprintf(n, sizeof n, "%" PRId64, max);
    r = script_file_run(c, &replay_script, 2, 3, argv, NULL);
    if (r == NULL)
        return -1;
    if (r->type == REDIS_REPLY_ERROR) {
        log_warn("stream_tidy: dead_replay: %s", r->str);
        goto out;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
        r->element[0]->type != REDIS_REPLY_INTEGER || r->element[1]->type != REDIS_REPLY_INTEGER ||
        r->element[2]->type != REDIS_REPLY_INTEGER) {
        log_warn("stream_tidy: dead_replay: unexpected reply");
        goto out;
    }
    out->replayed = r->element[0]->integer;
    out->left = r->element[1]->integer;
    out->unreplayable = r->element[2]->integer;
    rc = 0;
out:
    freeReplyObject(r);
    return rc;
}
