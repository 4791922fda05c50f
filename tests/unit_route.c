/* unit_route: the router (http_route_find) on the service's own route table
 * and on a small table of its own: exact paths, the '*' segment, HEAD for
 * GET, 405's Allow list, what does not match. No daemon, no I/O. */
#include <string.h>

#include "handlers.h"
#include "http.h"
#include "t.h"

/* The index of the route of handlers_routes with this method and pattern. */
static int route_index(const char *method, const char *pattern)
{
    for (size_t i = 0; i < handlers_route_count; i++)
        if (strcmp(handlers_routes[i].method, method) == 0 &&
            strcmp(handlers_routes[i].pattern, pattern) == 0)
            return (int)i;
    return -100;
}

typedef struct found {
    int i;
    char arg[64];
    char allow[64];
} found;

static found find_in(const http_route *routes, size_t n, const char *method, const char *path)
{
    found f;
    const char *arg = NULL;
    size_t arg_len = 99;

    memset(&f, 0, sizeof f);
    f.i = http_route_find(routes, n, method, path, &arg, &arg_len, f.allow, sizeof f.allow);
    if (arg_len < sizeof f.arg && arg != NULL)
        memcpy(f.arg, arg, arg_len);
    return f;
}

static found find(const char *method, const char *path)
{
    return find_in(handlers_routes, handlers_route_count, method, path);
}

static void test_service_routes_match(void)
{
    T_EQ_I64(find("GET", "/health").i, route_index("GET", "/health"));
    T_EQ_I64(find("GET", "/ready").i, route_index("GET", "/ready"));
    T_EQ_I64(find("GET", "/stats").i, route_index("GET", "/stats"));
    T_EQ_I64(find("GET", "/metrics").i, route_index("GET", "/metrics"));
    T_EQ_I64(find("POST", "/admin/vouchers").i, route_index("POST", "/admin/vouchers"));

    found f = find("GET", "/voucher/123");
    T_EQ_I64(f.i, route_index("GET", "/voucher/*"));
    T_EQ_STR(f.arg, "123");

    f = find("POST", "/voucher/9007199254740993/seckill");
    T_EQ_I64(f.i, route_index("POST", "/voucher/*/seckill"));
    T_EQ_STR(f.arg, "9007199254740993");

    f = find("POST", "/admin/vouchers/7/reset");
    T_EQ_I64(f.i, route_index("POST", "/admin/vouchers/*/reset"));
    T_EQ_STR(f.arg, "7");
}

static void test_head_takes_get_routes(void)
{
    T_EQ_I64(find("HEAD", "/health").i, route_index("GET", "/health"));
    found f = find("HEAD", "/voucher/5");
    T_EQ_I64(f.i, route_index("GET", "/voucher/*"));
    T_EQ_STR(f.arg, "5");
}

static void test_wrong_method_lists_allow(void)
{
    found f = find("POST", "/health");
    T_EQ_I64(f.i, HTTP_ROUTE_METHOD - route_index("GET", "/health"));
    T_EQ_STR(f.allow, "GET, HEAD");

    f = find("GET", "/voucher/1/seckill");
    T_EQ_I64(f.i, HTTP_ROUTE_METHOD - route_index("POST", "/voucher/*/seckill"));
    T_EQ_STR(f.allow, "POST");

    f = find("DELETE", "/admin/vouchers");
    T_ASSERT(f.i <= HTTP_ROUTE_METHOD);
    T_EQ_STR(f.allow, "POST");
}

static void test_unknown_paths(void)
{
    static const char *const paths[] = { "/", "", "/healthz", "/health/", "/Health",
                                         "/voucher", "/voucher/1/2", "/voucher/1/seckill/",
                                         "/admin", "/admin/vouchers/1", "//health",
                                         "/stats?x=1" };
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        found f = find("GET", paths[i]);
        found g = find("POST", paths[i]);
        if (!T_EQ_I64(f.i, HTTP_ROUTE_NONE) || !T_EQ_I64(g.i, HTTP_ROUTE_NONE))
            printf("    path was \"%s\"\n", paths[i]);
        T_EQ_STR(f.allow, "");
    }
}

static void test_star_is_one_segment_possibly_empty(void)
{
    /* The router hands the segment over as it is; validating it is the
     * handler's job (util_parse_id), so an empty or odd segment matches. */
    found f = find("GET", "/voucher/");
    T_EQ_I64(f.i, route_index("GET", "/voucher/*"));
    T_EQ_STR(f.arg, "");
    f = find("GET", "/voucher/abc%2F");
    T_EQ_I64(f.i, route_index("GET", "/voucher/*"));
    T_EQ_STR(f.arg, "abc%2F");
    f = find("POST", "/voucher//seckill");
    T_EQ_I64(f.i, route_index("POST", "/voucher/*/seckill"));
    T_EQ_STR(f.arg, "");
}

static void test_first_matching_route_wins_and_allow_collects(void)
{
    static const http_route table[] = {
        { "GET", "/a/*", NULL, NULL },
        { "PUT", "/a/*", NULL, NULL },
        { "POST", "/a/x", NULL, NULL },
        { "POST", "/a/*", NULL, NULL },
    };
    found f = find_in(table, 4, "POST", "/a/x");
    T_EQ_I64(f.i, 2);
    f = find_in(table, 4, "POST", "/a/y");
    T_EQ_I64(f.i, 3);
    T_EQ_STR(f.arg, "y");
    f = find_in(table, 4, "DELETE", "/a/y");
    T_EQ_I64(f.i, HTTP_ROUTE_METHOD - 3);
    T_EQ_STR(f.allow, "GET, HEAD, PUT, POST");
    f = find_in(table, 0, "GET", "/a/y");
    T_EQ_I64(f.i, HTTP_ROUTE_NONE);
}

static void test_allow_is_truncated_not_overrun(void)
{
    static const http_route table[] = {
        { "GET", "/p", NULL, NULL },
        { "POST", "/p", NULL, NULL },
    };
    const char *arg;
    size_t arg_len;
    char allow[8];
    memset(allow, 'x', sizeof allow);
    int i = http_route_find(table, 2, "PUT", "/p", &arg, &arg_len, allow, sizeof allow);
    T_EQ_I64(i, HTTP_ROUTE_METHOD - 1);
    T_ASSERT(memchr(allow, '\0', sizeof allow) != NULL);
}

int main(void)
{
    T_RUN(test_service_routes_match);
    T_RUN(test_head_takes_get_routes);
    T_RUN(test_wrong_method_lists_allow);
    T_RUN(test_unknown_paths);
    T_RUN(test_star_is_one_segment_possibly_empty);
    T_RUN(test_first_matching_route_wins_and_allow_collects);
    T_RUN(test_allow_is_truncated_not_overrun);
    return t_done();
}
