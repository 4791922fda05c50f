/* config_show: the effective configuration for the start-up log, secrets masked. */
#include "config_show.h"
#include "config.h"
#include "config_parse.h"
#include "log.h"
#include "redis_url.h"
#include "util.h"

#include <stdio.h>
#include <string.h>

#define MASK "***"

void config_show_mask_redis_urls(const char *list, char *out, size_t n)
{
    util_sbuf sb = util_sbuf_init(out, n);
    util_list it;
    const char *p;
    size_t len;

    util_list_init(&it, list);
    while (util_list_next(&it, &p, &len)) {
        char one[1200], masked[1200];

        if (len >= sizeof one) {       /* longer than any entry the parser takes */
            util_sbuf_str(&sb, MASK);
        } else {
            memcpy(one, p, len);
            one[len] = '\0';
            redis_url_mask(one, masked, sizeof masked);
            util_sbuf_str(&sb, masked);
        }
        if (!it.last)
            util_sbuf_str(&sb, ",");
    }
}

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* A postgres[ql]:// URI (libpq's "connection URI"): user:password@ and any
 * password=... parameter. */
static void mask_dsn_uri(const char *dsn, const char *rest, util_sbuf *sb)
{
    const char *p = rest, *q;

    /* As libpq: a '@' before any '/' closes the user part. */
    while (*p != '\0' && *p != '@' && *p != '/')
        p++;
    if (*p == '@') {
        const char *colon = memchr(rest, ':', (size_t)(p - rest));
        util_sbuf_mem(sb, dsn, (size_t)((colon ? colon + 1 : p) - dsn));
        if (colon != NULL)
            util_sbuf_str(sb, MASK);
        rest = p;
    } else {
        util_sbuf_mem(sb, dsn, (size_t)(rest - dsn));
    }
    q = strchr(rest, '?');
    if (q == NULL) {
        util_sbuf_str(sb, rest);
        return;
    }
    util_sbuf_mem(sb, rest, (size_t)(q + 1 - rest));
    for (p = q + 1; *p != '\0';) {
        const char *end = strchr(p, '&');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len >= 9 && strncmp(p, "password=", 9) == 0) {
            util_sbuf_str(sb, "password=" MASK);
        } else {
            util_sbuf_mem(sb, p, len);
        }
        p += len;
        if (*p == '&')
            util_sbuf_mem(sb, p++, 1);
    }
}

void config_show_mask_dsn(const char *dsn, char *out, size_t n)
{
    util_sbuf sb = util_sbuf_init(out, n);
    const char *p = dsn;

    if (strncmp(dsn, "postgresql://", 13) == 0) {
        mask_dsn_uri(dsn, dsn + 13, &sb);
        return;
    }
    if (strncmp(dsn, "postgres://", 11) == 0) {
        mask_dsn_uri(dsn, dsn + 11, &sb);
        return;
    }
    /* keyword = value pairs; a value is 'quoted' (backslash escapes) or runs
     * to the next space. Anything libpq would refuse ends the copy with
     * "...", so a mangled password is never shown either. */
    while (*p != '\0') {
        const char *start = p, *key, *val;
        size_t klen;

        while (is_space(*p))
            p++;
        if (*p == '\0') {
            util_sbuf_mem(&sb, start, (size_t)(p - start));
            break;
        }
        key = p;
        while (*p != '\0' && *p != '=' && !is_space(*p))
            p++;
        klen = (size_t)(p - key);
        while (is_space(*p))
            p++;
        if (*p != '=' || klen == 0) {
            util_sbuf_str(&sb, "...");
            return;
        }
        p++;
        while (is_space(*p))
            p++;
        val = p;
        if (*p == '\'') {
            for (p++; *p != '\0' && *p != '\''; p++)
                if (*p == '\\' && p[1] != '\0')
                    p++;
            if (*p != '\'') {
                util_sbuf_str(&sb, "...");
                return;
            }
            p++;
        } else {
            for (; *p != '\0' && !is_space(*p); p++)
                if (*p == '\\' && p[1] != '\0')
                    p++;
        }
        util_sbuf_mem(&sb, start, (size_t)(val - start));
        if (klen == 8 && strncmp(key, "password", 8) == 0)
            util_sbuf_str(&sb, MASK);
        else
            util_sbuf_mem(&sb, val, (size_t)(p - val));
    }
}

/* NAME=value, the value in double quotes when it is empty or holds a space,
 * a quote or a backslash. */
static void describe_pair(util_sbuf *sb, const char *name, const char *val)
{
    int quote = val[0] == '\0' || strpbrk(val, " \t\"\\") != NULL;

    if (sb->len > 0)
        util_sbuf_str(sb, " ");
    util_sbuf_str(sb, name);
    util_sbuf_str(sb, quote ? "=\"" : "=");
    for (const char *c = val; *c != '\0'; c++) {
        if (quote && (*c == '"' || *c == '\\'))
            util_sbuf_str(sb, "\\");
        util_sbuf_mem(sb, c, 1);
    }
    if (quote)
        util_sbuf_str(sb, "\"");
}

/* A text setting's value as the log shows it. */
static void show_text(const config_setting *o, const char *text, char *val, size_t n)
{
    switch (o->show) {
    case CONFIG_SHOW_SECRET:
        snprintf(val, n, "%s", text[0] != '\0' ? MASK : "");
        return;
    case CONFIG_SHOW_REDIS_URL:
        redis_url_mask(text, val, n);
        return;
    case CONFIG_SHOW_REDIS_URLS:
        config_show_mask_redis_urls(text, val, n);
        return;
    case CONFIG_SHOW_DSN:
        config_show_mask_dsn(text, val, n);
        return;
    case CONFIG_SHOW_PLAIN:
        break;
    }
    snprintf(val, n, "%s", text);
}

void config_show_describe(char *buf, size_t n)
{
    static const char *const level_names[] = { "error", "warn", "info", "debug" };
    util_sbuf sb = util_sbuf_init(buf, n);
    const char *base = (const char *)&g_cfg;
    size_t nrows;
    const config_setting *rows = config_settings(&nrows);

    for (size_t i = 0; i < nrows; i++) {
        const config_setting *o = &rows[i];
        const void *field = base + o->offset;
        char val[1200] = "";

        switch (o->type) {
        case CONFIG_STR:
            show_text(o, field, val, sizeof val);
            break;
        case CONFIG_INT:
        case CONFIG_BOOL:
            snprintf(val, sizeof val, "%d", *(const int *)field);
            break;
        case CONFIG_LONG:
        case CONFIG_LEASE:
            snprintf(val, sizeof val, "%ld", *(const long *)field);
            break;
        case CONFIG_LEVEL: {
            int l = *(const int *)field;
            snprintf(val, sizeof val, "%s", l >= 0 && l <= LOG_DEBUG ? level_names[l] : "?");
            break;
        }
        case CONFIG_ENUM:
            snprintf(val, sizeof val, "%s", config_parse_choice(o->choices, *(const int *)field));
            break;
        }
        describe_pair(&sb, o->env, val);
    }
}
