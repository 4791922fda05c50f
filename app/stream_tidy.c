/* stream_tidy: consumer names of the orders stream's group (stream_tidy.h). */
#include "stream_tidy.h"
#include "config.h"
#include "log.h"
#include "script.h"
#include "stock_redis.h"

#include <stdio.h>
#include <string.h>

#define TIDY_EVERY_MS 10000

static script_file tidy_script = { .name = "group_tidy" };

int stream_tidy_load(const char *dir, char *err, size_t errlen)
{
    return script_file_load(&tidy_script, dir, tidy_script.name, err, errlen);
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
        goto cleanup;
    }
    if (r->type != REDIS_REPLY_ARRAY) {
        log_warn("stream_tidy: group_tidy: unexpected reply type %d", r->type);
        goto cleanup;
    }
    for (size_t i = 0; i < r->elements; i++)
        if (r->element[i]->type == REDIS_REPLY_STRING)
            log_info("stream_tidy: consumer %s removed from group %s of %s: idle over %d ms "
                     "with nothing pending", r->element[i]->str, STOCK_REDIS_GROUP,
                     STOCK_REDIS_STREAM, g_cfg.consumer_remove_idle_ms);
    rc = (int)r->elements;
cleanup:
    freeReplyObject(r);
    return rc;
}
