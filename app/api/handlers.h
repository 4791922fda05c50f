/* handlers: one function per route of the API (sale, stats, admin) and
 * the route table that binds them. */
#ifndef SECKILL_HANDLERS_H
#define SECKILL_HANDLERS_H

#include <stddef.h>

#include "http.h"

extern const http_route handlers_routes[];
extern const size_t handlers_route_count;

#endif
