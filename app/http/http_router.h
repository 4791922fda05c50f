/* http_router: the route table and its matching, by path then method.
 * http_route_find is free of libmicrohttpd's state (and so fuzzable); the
 * table in force is set once by http_start, before any request, and only
 * read after, by any thread. */
#ifndef SECKILL_HTTP_ROUTER_H
#define SECKILL_HTTP_ROUTER_H

#include <stddef.h>

#include "http_request.h"

/* A handler answers with one of the http_send_* calls and returns what it
 * returned, or hands the request off and returns HTTP_HANDED_OFF. 'arg' is
 * the path segment matched by '*' in the route (may be empty). */
typedef http_outcome (*http_handler)(http_req *r, const char *arg, size_t arg_len);

/* 'fast' (may be NULL) runs on the event thread and must not block: it
 * answers, parks the request (http_park), or returns HTTP_PASS to pass it
 * to 'fn' on a worker (what it stored in the request, such as user_id, is
 * kept). 'fn' NULL: 'fast' always answers. */
typedef struct http_route {
    const char *method;       /* "GET", "POST"; GET routes also answer HEAD */
    const char *pattern;      /* "/voucher/ * /seckill" without spaces: '*' is one segment */
    http_handler fn;
    http_handler fast;
} http_route;

/* Returns the index of the route of 'routes' that matches 'path' and
 * 'method' (with its '*' segment in arg), or HTTP_ROUTE_NONE when no
 * pattern matches the path, or HTTP_ROUTE_METHOD - i when route i's path
 * matches but no route takes the method; then 'allow' lists the methods
 * that would ("GET, HEAD, POST"). */
#define HTTP_ROUTE_NONE (-1)
#define HTTP_ROUTE_METHOD (-2)
int http_route_find(const http_route *routes, size_t n, const char *method, const char *path,
                    const char **arg, size_t *arg_len, char *allow, size_t allow_len);

/* The metrics label of route 'i' ("/voucher/{id}/seckill"), or NULL when
 * there is no such route. Static, set by http_router_set. */
const char *http_route_label(int i);

/*---- the HTTP layer's own ----*/

/* Puts 'routes' in force (borrowed for as long as requests come) and
 * makes their labels. Before any request. */
void http_router_set(const http_route *routes, size_t n);

/* http_route_find on the table in force. */
int http_router_match(const char *method, const char *path, const char **arg, size_t *arg_len,
                      char *allow, size_t allow_len);

/* Route 'i' of the table in force (an index http_router_match returned). */
const http_route *http_router_route(int i);

#endif
