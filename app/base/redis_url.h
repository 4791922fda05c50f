/* redis_url: one Redis endpoint (host, port, ACL user, password, db) and
 * its URL form, redis://[[user]:password@]host[:port][/db]. Pure functions:
 * no I/O, safe from any thread. Used by the settings (REDIS_URL) and by the
 * lock library (the nodes of MultiLock and RedLock). */
#ifndef SECKILL_REDIS_URL_H
#define SECKILL_REDIS_URL_H

#include <stddef.h>

typedef struct redis_url {
    char host[256];
    int port;
    char username[128];   /* empty: no ACL user */
    char password[256];   /* empty: no AUTH */
    int db;
} redis_url;

/* Parses "redis://[[user]:password@]host[:port][/db]" (port 6379 and db 0
 * when left out; user and password %XX-decoded). A part longer than its
 * field is refused, not cut. Returns 0 or -1. */
int redis_url_parse(const char *s, redis_url *out);

/* 'url' with its password replaced by ***, cut to fit 'n' (at least 1). */
void redis_url_mask(const char *url, char *out, size_t n);

#endif
