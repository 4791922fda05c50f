/* http_router: the route table in force, path and method matching, the
 * routes' metrics labels (http_router.h). */
#include "http_router.h"
#include "counters.h"

#include <stdio.h>
#include <string.h>
#include <microhttpd.h>

static const http_route *route_table;
static size_t route_count;

/* Matches 'path' against 'pattern' segment by segment; '*' takes one segment
 * (possibly empty) and is returned through arg/arg_len. */
static int route_match(const char *pattern, const char *path, const char **arg, size_t *arg_len)
{
    const char *p = pattern, *s = path;

    while (*p != '\0') {
        if (*p == '*') {
            const char *end = strchr(s, '/');
            size_t n = end ? (size_t)(end - s) : strlen(s);
            *arg = s;
            *arg_len = n;
            s += n;
            p++;
            continue;
        }
        if (*p != *s)
            return 0;
        p++;
        s++;
    }
    return *s == '\0';
}

static int method_is(const char *have, const char *want)
{
    return strcmp(have, want) == 0 ||
           (strcmp(want, MHD_HTTP_METHOD_GET) == 0 && strcmp(have, MHD_HTTP_METHOD_HEAD) == 0);
}

int http_route_find(const http_route *routes, size_t n, const char *method, const char *path,
                    const char **arg, size_t *arg_len, char *allow, size_t allow_len)
{
    int found = HTTP_ROUTE_NONE;

    *arg = path;
    *arg_len = 0;
    if (allow_len > 0)
        allow[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        const char *a = path;
        size_t al = 0;
        if (!route_match(routes[i].pattern, path, &a, &al))
            continue;
        if (method_is(method, routes[i].method)) {
            *arg = a;
            *arg_len = al;
            return (int)i;
        }
        found = HTTP_ROUTE_METHOD - (int)i;
        size_t used = strnlen(allow, allow_len);
        if (used < allow_len)
            snprintf(allow + used, allow_len - used, "%s%s%s", used ? ", " : "", routes[i].method,
                     strcmp(routes[i].method, MHD_HTTP_METHOD_GET) == 0 ? ", HEAD" : "");
    }
    return found;
}

/* "/voucher/ * /seckill" (no spaces) -> "/voucher/{id}/seckill" for metrics labels. */
static char route_label_buf[COUNTERS_MAX_ROUTES][64];
static const char *route_labels[COUNTERS_MAX_ROUTES];

static void set_route_labels(void)
{
    size_t n = route_count < COUNTERS_MAX_ROUTES ? route_count : COUNTERS_MAX_ROUTES;

    for (size_t i = 0; i < n; i++) {
        char *o = route_label_buf[i];
        size_t used = 0;
        for (const char *p = route_table[i].pattern; *p && used + 5 < sizeof route_label_buf[i];
             p++) {
            if (*p == '*') {
                memcpy(o + used, "{id}", 4);
                used += 4;
            } else {
                o[used++] = *p;
            }
        }
        o[used] = '\0';
        route_labels[i] = o;
    }
}

const char *http_route_label(int i)
{
    return i >= 0 && i < COUNTERS_MAX_ROUTES ? route_labels[i] : NULL;
}

void http_router_set(const http_route *routes, size_t n)
{
    route_table = routes;
    route_count = n;
    set_route_labels();
}

int http_router_match(const char *method, const char *path, const char **arg, size_t *arg_len,
                      char *allow, size_t allow_len)
{
    return http_route_find(route_table, route_count, method, path, arg, arg_len, allow,
                           allow_len);
}

const http_route *http_router_route(int i)
{
    return &route_table[i];
}
