/* metrics: the Prometheus exposition of GET /metrics. Request counts by
 * route, status and error code; a latency histogram per route; Redis and
 * Postgres call counts, errors and latency; plus the lock and stats figures.
 * Counters are process-wide atomics: recording never blocks a worker. */
#ifndef SECKILL_METRICS_H
#define SECKILL_METRICS_H

#include <stdint.h>
#include <stdio.h>
#include <cJSON.h>

#include "api.h"

#define METRICS_MAX_ROUTES 16
#define METRICS_NO_ROUTE (-1)

/* Route labels ("/voucher/{id}/seckill"), indexed like the route table.
 * Borrowed for the process's lifetime. Call once before serving. */
void metrics_set_routes(const char *const *labels, int n);

/* One answered request: 'route' is an index into the labels or
 * METRICS_NO_ROUTE (404 before any route matched). */
void metrics_request(int route, int status, api_err err, int64_t latency_us);

enum metrics_backend { METRICS_REDIS, METRICS_PG, METRICS_BACKEND_COUNT };

/* One call to a backing service and whether it answered (a server-side
 * error reply still counts as answered; a dead connection does not). */
void metrics_backend(enum metrics_backend b, int64_t latency_us, int ok);

/* Writes the whole exposition to 'f'. 'vouchers' is store_stats's array
 * (may be NULL when Postgres is down: the gauges are left out);
 * 'in_progress' and 'queued' are http_load's. */
void metrics_write(FILE *f, const cJSON *vouchers, int in_progress, int queued);

/* Escapes a label value (backslash, double quote, newline) into 'buf'. */
void metrics_escape(const char *in, char *buf, size_t n);

#endif
