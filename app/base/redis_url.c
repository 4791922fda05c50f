/* redis_url: a Redis endpoint from its URL, and the URL with the password masked. */
#include "redis_url.h"
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int hex_digit(char c)
{
    return c >= '0' && c <= '9' ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* s[0..len) into 'out' (size n), %XX decoded (a '%' not followed by two hex
 * digits stays as it is). -1 when it does not fit or decodes to a NUL. */
static int url_unescape(const char *s, size_t len, char *out, size_t n)
{
    size_t o = 0;

    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (c == '%' && i + 2 < len && hex_digit(s[i + 1]) >= 0 && hex_digit(s[i + 2]) >= 0) {
            c = (char)(hex_digit(s[i + 1]) * 16 + hex_digit(s[i + 2]));
            if (c == '\0')
                return -1;
            i += 2;
        }
        if (o + 1 >= n)
            return -1;
        out[o++] = c;
    }
    out[o] = '\0';
    return 0;
}

int redis_url_parse(const char *s, redis_url *out)
{
    const char *p, *at, *host, *slash;
    char *end;

    memset(out, 0, sizeof *out);
    out->port = 6379;
    if (strncmp(s, "redis://", 8) != 0)
        return -1;
    p = s + 8;
    /* The user information ends at the last '@': a password may hold '@',
     * '/' or ':' as they are (host, port and db hold none of them), or
     * percent-encoded. The user name ends at its first ':'. */
    at = strrchr(p, '@');
    if (at != NULL) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        const char *user_end = colon ? colon : at;
        if (url_unescape(p, (size_t)(user_end - p), out->username, sizeof out->username) != 0)
            return -1;
        if (colon != NULL) {
            if (url_unescape(colon + 1, (size_t)(at - colon - 1), out->password,
                             sizeof out->password) != 0)
                return -1;
        } else {                       /* "redis://secret@host": the secret is a password */
            snprintf(out->password, sizeof out->password, "%s", out->username);
            out->username[0] = '\0';
        }
        p = at + 1;
    }
    slash = strchr(p, '/');
    host = p;
    const char *host_end = slash ? slash : p + strlen(p);
    const char *colon = memchr(host, ':', (size_t)(host_end - host));
    const char *name_end = colon ? colon : host_end;
    if (name_end == host || (size_t)(name_end - host) >= sizeof out->host)
        return -1;
    memcpy(out->host, host, (size_t)(name_end - host));
    if (colon != NULL) {
        errno = 0;
        long port = strtol(colon + 1, &end, 10);
        if (end != host_end || colon + 1 == host_end || errno || port < 1 || port > 65535)
            return -1;
        out->port = (int)port;
    }
    if (slash != NULL && slash[1] != '\0') {
        errno = 0;
        long db = strtol(slash + 1, &end, 10);
        if (*end != '\0' || errno || db < 0 || db > 1000000)
            return -1;
        out->db = (int)db;
    }
    return 0;
}

void redis_url_mask(const char *url, char *out, size_t n)
{
    util_sbuf sb = util_sbuf_init(out, n);
    const char *p = strstr(url, "://");
    const char *at = strrchr(url, '@');    /* the last '@': a password may hold one */

    if (p == NULL || at == NULL || at < p) {
        util_sbuf_str(&sb, url);
        return;
    }
    p += 3;
    const char *colon = memchr(p, ':', (size_t)(at - p));
    /* "redis://user:pw@h": the user stays; "redis://pw@h": all of it is the password. */
    util_sbuf_mem(&sb, url, (size_t)((colon ? colon + 1 : p) - url));
    util_sbuf_str(&sb, "***");
    util_sbuf_str(&sb, at);
}
