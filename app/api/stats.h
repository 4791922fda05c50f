/* stats: GET /stats and GET /metrics, answered from one snapshot shared by
 * every caller. What is costly to read - the per-voucher figures, one pass
 * over the order table in Postgres, and the other instances' counters in
 * Redis - is read by one thread of its own, at most once per
 * STATS_INTERVAL_MS and only while someone asks; this instance's counters
 * are read from memory for each answer. Neither route ever takes a worker
 * thread from the buyers: a request that the snapshot answers is answered on
 * its event thread, any other is parked until the next refresh.
 *
 * The snapshot answers a request when it was taken less than
 * STATS_INTERVAL_MS ago and after this instance's last write (stats_touch):
 * a client sees its own order or voucher at once, another instance's within
 * the interval. So twenty clients polling in a loop cost one aggregate a
 * second, and while buyers write, each poller gets about one answer a
 * second. */
#ifndef SECKILL_STATS_H
#define SECKILL_STATS_H

#include "http.h"

enum stats_view { STATS_JSON, STATS_METRICS };

/* Starts the refresh thread (bgthread.h). 0, or -1 (logged here: a start
 * function logs its own failure). */
int stats_start(void);

/* Stops it and answers every request still parked (from the last snapshot,
 * or 503): call after http_drain and before http_stop. Idempotent. */
void stats_stop(void);

/* Marks a write that /stats shows (an order answered, a voucher created or
 * reset). Before the answer that reports it. */
void stats_touch(void);

/* A fast handler's body for GET /stats or GET /metrics: answers 'r' now, or
 * parks it for the refresh thread. Returns what the handler returns. */
http_outcome stats_serve(http_req *r, enum stats_view view);

#endif
