/* config_parse: the settings' text (defaults, environment, flags) -> struct config. */
#include "config_parse.h"
#include "log.h"
#include "redis_url.h"
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A row whose field cannot hold its type would write past it: refused
 * before anything is parsed. */
static int row_fits(const config_setting *o)
{
    switch (o->type) {
    case CONFIG_INT:
    case CONFIG_BOOL:
    case CONFIG_LEVEL:
        return o->size == sizeof(int);
    case CONFIG_ENUM:
        return o->size == sizeof(int) && o->choices != NULL && o->choices->n > 0;
    case CONFIG_LONG:
    case CONFIG_LEASE:
        return o->size == sizeof(long);
    case CONFIG_STR:
        return o->size > 0;
    }
    return 0;
}

/* An integer of the whole text, or -1 (nothing stored). */
static int parse_long(const char *val, long *out)
{
    char *end;

    errno = 0;
    *out = strtol(val, &end, 10);
    return val[0] == '\0' || *end != '\0' || errno != 0 ? -1 : 0;
}

/* 'val' into o's field of 'c'. 'origin' names where it came from (the
 * variable or the flag) in the refusal. 0, or -1 after logging. */
static int set_value(config *c, const config_setting *o, const char *val, const char *origin)
{
    char *field = (char *)c + o->offset;
    long v;

    switch (o->type) {
    case CONFIG_STR:
        if (strlen(val) >= o->size) {
            log_error("%s is too long (at most %zu bytes)", origin, o->size - 1);
            return -1;
        }
        memcpy(field, val, strlen(val) + 1);
        return 0;
    case CONFIG_INT:
    case CONFIG_LONG:
    case CONFIG_BOOL:
        if (parse_long(val, &v) != 0 || v < o->min || v > o->max) {
            log_error("invalid %s='%s': expected an integer in %ld..%ld", origin, val, o->min,
                      o->max);
            return -1;
        }
        if (o->type == CONFIG_LONG)
            *(long *)(void *)field = v;
        else
            *(int *)(void *)field = (int)v;
        return 0;
    case CONFIG_LEASE:
        if (parse_long(val, &v) != 0 || (v != -1 && (v < o->min || v > o->max))) {
            log_error("invalid %s='%s': expected a lease in ms (%ld..%ld) or -1 for watchdog "
                      "mode", origin, val, o->min, o->max);
            return -1;
        }
        *(long *)(void *)field = v;
        return 0;
    case CONFIG_LEVEL: {
        enum log_level lvl;
        if (log_parse_level(val, &lvl) != 0) {
            log_error("invalid %s='%s': expected error, warn, info or debug", origin, val);
            return -1;
        }
        *(int *)(void *)field = (int)lvl;
        return 0;
    }
    case CONFIG_ENUM: {
        char names[256];
        util_sbuf sb = util_sbuf_init(names, sizeof names);
        for (size_t i = 0; i < o->choices->n; i++) {
            if (strcmp(val, o->choices->names[i]) == 0) {
                *(int *)(void *)field = (int)i;
                return 0;
            }
            util_sbuf_str(&sb, " ");
            util_sbuf_str(&sb, o->choices->names[i]);
        }
        log_error("invalid %s='%s': expected one of%s", origin, val, names);
        return -1;
    }
    }
    return -1;
}

static void usage(const config_setting *rows, size_t n)
{
    printf("usage: seckill [--flag=value ...]\n\n"
           "Flash-sale service. Every setting is an environment variable; the flag\n"
           "beside it overrides it.\n\n");
    for (size_t i = 0; i < n; i++) {
        const config_setting *o = &rows[i];
        printf("  %-24s --%-24s %s", o->env, o->flag, o->help);
        if (o->def[0] != '\0')
            printf(" [%s]", o->def);
        putchar('\n');
    }
    printf("\n  --help                    this text\n"
           "  --version                 version, and the versions of the libraries\n");
}

/* The row of flag 'name' (its first 'len' bytes), or NULL. */
static const config_setting *row_of_flag(const config_setting *rows, size_t n, const char *name,
                                         size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(rows[i].flag) == len && strncmp(rows[i].flag, name, len) == 0)
            return &rows[i];
    return NULL;
}

int config_parse_args(config *c, const config_setting *rows, size_t n, int argc, char **argv)
{
    for (size_t i = 0; i < n; i++) {
        const char *env = getenv(rows[i].env);
        if (!row_fits(&rows[i])) {
            log_error("setting %s: its field does not hold its type", rows[i].env);
            return -1;
        }
        if (set_value(c, &rows[i], rows[i].def, rows[i].env) != 0)
            return -1;
        if (env != NULL && set_value(c, &rows[i], env, rows[i].env) != 0)
            return -1;
    }
    for (int a = 1; a < argc; a++) {
        const char *arg = argv[a], *name, *eq, *val;
        const config_setting *o;
        char origin[64];

        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            usage(rows, n);
            return 1;
        }
        if (strncmp(arg, "--", 2) != 0) {
            log_error("unexpected argument '%s' (see --help)", arg);
            return -1;
        }
        name = arg + 2;
        eq = strchr(name, '=');
        o = row_of_flag(rows, n, name, eq != NULL ? (size_t)(eq - name) : strlen(name));
        if (o == NULL) {
            log_error("unknown option '%s' (see --help)", arg);
            return -1;
        }
        val = eq != NULL ? eq + 1 : NULL;
        if (val == NULL) {
            if (a + 1 >= argc) {
                log_error("option --%s needs a value", o->flag);
                return -1;
            }
            val = argv[++a];
        }
        snprintf(origin, sizeof origin, "--%s", o->flag);
        if (set_value(c, o, val, origin) != 0)
            return -1;
    }
    return 0;
}

const char *config_parse_choice(const config_choices *ch, int v)
{
    return v >= 0 && (size_t)v < ch->n ? ch->names[v] : "unknown";
}

/* A host name or IPv4 address: letters, digits, '-', '.', '_'. */
static int host_ok(const char *h, size_t n)
{
    if (n == 0 || n >= sizeof ((sentinel_addr *)0)->host)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = h[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '.' || c == '_'))
            return 0;
    }
    return 1;
}

int config_parse_sentinels(const char *s, sentinel_addr *out, int max)
{
    util_list it;
    const char *p;
    size_t len;
    int n = 0;

    util_list_init(&it, s);
    while (util_list_next(&it, &p, &len)) {
        const char *colon = memchr(p, ':', len);
        char port_s[8];
        char *stop;
        long port;

        if (n == max || colon == NULL || !host_ok(p, (size_t)(colon - p)))
            return -1;
        size_t plen = len - (size_t)(colon + 1 - p);
        if (plen == 0 || plen >= sizeof port_s)
            return -1;
        memcpy(port_s, colon + 1, plen);
        port_s[plen] = '\0';
        errno = 0;
        port = strtol(port_s, &stop, 10);
        if (*stop != '\0' || errno != 0 || port < 1 || port > 65535 || port_s[0] == '+' ||
            port_s[0] == '-' || port_s[0] == ' ')
            return -1;
        memcpy(out[n].host, p, (size_t)(colon - p));
        out[n].host[colon - p] = '\0';
        out[n].port = (int)port;
        n++;
    }
    return n;
}

int config_parse_endpoints(config *c)
{
    /* A cluster's nodes come from REDIS_CLUSTER_NODES: an empty REDIS_URL
     * says there is no other Redis (config_check refuses another one). */
    if (c->cluster_nodes_text[0] != '\0' && c->redis_url_text[0] == '\0')
        snprintf(c->redis_url_text, sizeof c->redis_url_text, "%s", CONFIG_REDIS_URL_DEFAULT);
    if (redis_url_parse(c->redis_url_text, &c->redis) != 0) {
        log_error("invalid REDIS_URL '%s': expected redis://[[user]:password@]host[:port][/db]",
                  c->redis_url_text);
        return -1;
    }
    c->n_sentinels = 0;
    if (c->sentinels_text[0] != '\0') {
        c->n_sentinels = config_parse_sentinels(c->sentinels_text, c->sentinels,
                                                CONFIG_MAX_SENTINELS);
        if (c->n_sentinels < 0) {
            log_error("invalid REDIS_SENTINELS '%s': expected host:port[,host:port...] "
                      "(at most %d)", c->sentinels_text, CONFIG_MAX_SENTINELS);
            return -1;
        }
    }
    if (c->cluster_nodes_text[0] != '\0') {
        sentinel_addr seeds[CONFIG_MAX_SENTINELS];
        if (config_parse_sentinels(c->cluster_nodes_text, seeds, CONFIG_MAX_SENTINELS) < 0) {
            log_error("invalid REDIS_CLUSTER_NODES '%s': expected host:port[,host:port...] "
                      "(at most %d)", c->cluster_nodes_text, CONFIG_MAX_SENTINELS);
            return -1;
        }
    }
    return 0;
}
