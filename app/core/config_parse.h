/* config_parse: settings from text. A table of rows, one per setting
 * (config.c's), says for each its environment variable and flag, its type
 * and bounds, its default and its field of struct config; the table is
 * read the same way for every setting, and each value is parsed once, as
 * it is given, into its field's type: numbers, booleans, and the names of
 * an enum setting into its enum. The endpoints (REDIS_URL, REDIS_SENTINELS)
 * are then taken apart. A refusal is logged (log_error) naming the setting
 * or flag. Runs once, before any thread starts. */
#ifndef SECKILL_CONFIG_PARSE_H
#define SECKILL_CONFIG_PARSE_H

#include "config.h"

#include <stddef.h>

enum config_type {
    CONFIG_INT,     /* int in min..max */
    CONFIG_LONG,    /* long in min..max */
    CONFIG_BOOL,    /* int, 0 or 1 */
    CONFIG_LEASE,   /* long in min..max, or -1 (watchdog mode) */
    CONFIG_LEVEL,   /* int: enum log_level, as log_parse_level reads it */
    CONFIG_ENUM,    /* int: the index of the value's name in 'choices' */
    CONFIG_STR      /* char[size], the text as given */
};

/* How the printed view (config_show) shows a text setting. */
enum config_show_as {
    CONFIG_SHOW_PLAIN,
    CONFIG_SHOW_SECRET,       /* *** when set */
    CONFIG_SHOW_REDIS_URL,    /* its password masked */
    CONFIG_SHOW_REDIS_URLS,   /* a list: each entry's password masked */
    CONFIG_SHOW_DSN           /* libpq's passwords masked */
};

/* The names of an enum setting's values, indexed by the enum. */
typedef struct config_choices {
    const char *const *names;
    size_t n;
} config_choices;

typedef struct config_setting {
    const char *env;
    const char *flag;               /* --flag=value or --flag value */
    enum config_type type;
    size_t offset, size;            /* its field in struct config */
    long min, max;                  /* the numeric types */
    const config_choices *choices;  /* CONFIG_ENUM */
    enum config_show_as show;       /* CONFIG_STR */
    const char *def;                /* parsed like any value */
    const char *help;
} config_setting;

/* Fills 'c' (zeroed by the caller) from each row's default, then the
 * environment, then the flags of argv: the last one given wins, and each is
 * refused on its own when it does not parse. Returns 0; 1 when --help was
 * asked (the usage printed on stdout); -1 after logging a refusal. */
int config_parse_args(config *c, const config_setting *rows, size_t n, int argc, char **argv);

/* REDIS_URL into c->redis, REDIS_SENTINELS (when set) into c->sentinels.
 * 0, or -1 after logging. */
int config_parse_endpoints(config *c);

/* Parses REDIS_SENTINELS, "host:port[,host:port...]" (at most 'max'; a
 * host is a name or an IPv4 address). Returns the count, or -1. */
int config_parse_sentinels(const char *s, sentinel_addr *out, int max);

/* The name of value 'v' of an enum setting, or "unknown". */
const char *config_parse_choice(const config_choices *ch, int v);

#endif
