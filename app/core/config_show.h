/* config_show: the effective configuration as the start-up log prints it,
 * with every secret masked: ADMIN_TOKEN, the passwords of REDIS_URL and of
 * each LOCK_REDIS_NODES entry (redis_url_mask), and PG_DSN's. Reads g_cfg
 * once config_load has filled it; writes only the caller's buffer. */
#ifndef SECKILL_CONFIG_SHOW_H
#define SECKILL_CONFIG_SHOW_H

#include <stddef.h>

/* Every setting as NAME=value separated by spaces, values with spaces or
 * quotes in double quotes; ADMIN_TOKEN as *** when set, the passwords of
 * REDIS_URL, LOCK_REDIS_NODES and PG_DSN masked. Cut to fit 'n' (0: nothing
 * written). */
void config_show_describe(char *buf, size_t n);

/* A comma-separated list of redis:// URLs, each with its password masked
 * (an entry longer than any the parser takes: *** whole). */
void config_show_mask_redis_urls(const char *list, char *out, size_t n);

/* A libpq connection string, key=value or postgres[ql]:// URI, with every
 * password replaced by *** (password=... and the URI's user:password@);
 * what libpq would refuse is cut with "...", never echoed. */
void config_show_mask_dsn(const char *dsn, char *out, size_t n);

#endif
