/* exposition: the exposition. Reads every counter of the process - recorded
 * ones (counters.h), the lock library's (lock_counters_get) and the HTTP load
 * (http_load) - and writes them out twice: as GET /metrics (the Prometheus
 * text format 0.0.4) and as the counters of GET /stats (JSON). The lock
 * figures, whatever strategy took the locks, are combined in one place
 * for both. */
#ifndef SECKILL_EXPOSITION_H
#define SECKILL_EXPOSITION_H

#include <stddef.h>
#include <stdio.h>
#include <cJSON.h>

/* Writes the whole exposition to 'f'. 'vouchers' is store_stats's array
 * (may be NULL when Postgres is down: the voucher gauges are left out);
 * series for at most 50 of them, the newest of those on sale, coming or
 * ended within the hour, plus counts over all of them. */
void exposition_metrics(FILE *f, const cJSON *vouchers);

/* Adds this instance's "requests", "lock" and "batch" objects to 'obj'. */
void exposition_counters_json(cJSON *obj);

/* Escapes a label value (backslash, double quote, newline) into 'buf'. */
void exposition_escape(const char *in, char *buf, size_t n);

#endif
