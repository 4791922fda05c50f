#!/usr/bin/env python3
"""GET /stats (and /metrics) polled hard: cheap for the instance and its
buyers, and still right.

- 20 clients polling /stats in a loop for 3 s cost Postgres at most one pass
  over the order table per STATS_INTERVAL_MS (counted by Postgres itself in
  pg_stat_user_tables), and get their answers;
- /stats never waits for a worker thread: with THREADS=1 and the only worker
  held by a buyer paused in the sale (DEMO_PAUSE_MS), /stats and /metrics
  still answer at once;
- an instance's /stats shows its own orders and vouchers as soon as they are
  answered (read-your-writes), the invariants computed from the order table
  (orders, oversold, duplicateUsers, stockDrift);
- with Postgres unreachable, /stats answers 503 and /metrics answers without
  the voucher series, as before.
Prints "N passed, M failed".
"""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seckill_server as ss  # noqa: E402
from seckill_server import fail, test  # noqa: E402

TOKEN = "stats-token"
POLLERS = 20


def order_table_scans():
    """Sequential and index scans of tb_voucher_order so far, as Postgres
    counts them once every backend has reported (each does within a second
    of going idle)."""
    last = None
    for _ in range(40):
        row = ss.psql("SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM "
                      "pg_stat_user_tables WHERE relname = 'tb_voucher_order'")
        n = int(row[0][0])
        if n == last:
            return n
        last = n
        time.sleep(0.6)
    fail("pg_stat_user_tables did not settle")


def poll(port, path, seconds, n=POLLERS):
    """n threads, each on a keep-alive connection, GET path in a loop for
    seconds. Returns (answers by status, bodies that were not JSON objects)."""
    counts, bad, lock = {}, [], threading.Lock()
    stop = time.monotonic() + seconds

    def run():
        c = ss.Client(port, timeout=10)
        try:
            while time.monotonic() < stop:
                r = c.request("GET", path)
                with lock:
                    counts[r.status] = counts.get(r.status, 0) + 1
                    if path == "/stats" and not isinstance(r.body, dict):
                        bad.append(r.raw[:100])
        finally:
            c.close()

    threads = [threading.Thread(target=run, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 30)
    return counts, bad


@test
def twenty_pollers_cost_one_aggregate_per_interval():
    srv = ss.Server("pollers", {"ADMIN_TOKEN": TOKEN, "THREADS": 2})
    try:
        vid = ss.new_voucher(srv, TOKEN, 100)
        for u in range(3):
            if srv.seckill(vid, 6100 + u).status != 200:
                fail("a buy before polling")
        before = order_table_scans()
        seconds = 3.0
        counts, bad = poll(srv.port, "/stats", seconds)
        after = order_table_scans()
        scans = after - before
        answered = sum(counts.values())
        print(f"    {POLLERS} pollers, {seconds:.0f} s: {answered} answers {counts}, "
              f"{scans} scans of tb_voucher_order")
        if set(counts) != {200} or bad or answered < POLLERS:
            fail(f"pollers got {counts}, {len(bad)} non-JSON bodies")
        # One refresh per second (STATS_INTERVAL_MS), plus one at each edge.
        if scans > seconds + 2:
            fail(f"{scans} passes over the order table for {answered} answers in {seconds} s: "
                 "want at most one per second")
    finally:
        srv.stop_ok()


@test
def stats_and_metrics_never_wait_for_a_worker():
    srv = ss.Server("noworker", {"ADMIN_TOKEN": TOKEN, "THREADS": 1, "DEMO_PAUSE_MS": 3000})
    try:
        vid = ss.new_voucher(srv, TOKEN, 5)
        srv.get("/stats")
        done = {}

        def buy():
            done["r"] = srv.seckill(vid, 6201)
        t = threading.Thread(target=buy, daemon=True)
        t.start()
        # The only worker is paused in the sale once it holds the buyer's lock.
        deadline = time.monotonic() + 10
        while ss.redis(["EXISTS", "lock:order:6201"]).strip() != "1":
            if time.monotonic() > deadline:
                fail("the buyer's lock was not taken within 10 s")
            time.sleep(0.01)
        for path in ("/stats", "/metrics"):
            t0 = time.monotonic()
            r = srv.get(path, timeout=10)
            took = time.monotonic() - t0
            if r.status != 200:
                fail(f"GET {path} with the only worker busy: {r.status} after {took:.2f} s")
            if "r" in done:
                fail(f"GET {path} with the only worker busy: answered after {took:.2f} s, after "
                     "the paused buyer (3 s): it waited for the worker")
        t.join(10)
        if done.get("r") is None or done["r"].status != 200:
            fail(f"the paused buyer: {done.get('r')}")
    finally:
        srv.stop_ok()


def voucher_entry(srv, vid):
    r = srv.get("/stats")
    if r.status != 200:
        fail(f"GET /stats: {r.status} {r.raw[:200]!r}")
    for v in r.body.get("vouchers", []):
        if v.get("voucherId") == vid:
            return v
    return None


@test
def stats_shows_this_instances_writes_at_once():
    srv = ss.Server("ryw", {"ADMIN_TOKEN": TOKEN})
    try:
        srv.get("/stats")                           # a snapshot taken before the writes
        vid = ss.new_voucher(srv, TOKEN, 3)
        v = voucher_entry(srv, vid)
        if v is None or (v["stock"], v["orders"]) != (3, 0):
            fail(f"a new voucher in /stats right after its creation: {v}")
        for u in (6301, 6302):
            if srv.seckill(vid, u).status != 200:
                fail("buy")
            v = voucher_entry(srv, vid)
            if v["orders"] != u - 6300 or v["stock"] != 3 - (u - 6300):
                fail(f"/stats right after order {u - 6300}: {v}")
        # Invariants are computed from the order table: rows written behind
        # the service's back show as an oversell and a stock drift.
        ss.psql(f"INSERT INTO tb_voucher_order (id, user_id, voucher_id) VALUES "
                f"({9_000_000_000 + vid}, 6398, {vid}), ({9_100_000_000 + vid}, 6399, {vid})")
        deadline = time.monotonic() + 5
        while True:
            v = voucher_entry(srv, vid)
            if v["orders"] == 4 or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        got = {k: v[k] for k in ("orders", "oversold", "duplicateUsers", "stockDrift")}
        if got != {"orders": 4, "oversold": 1, "duplicateUsers": 0, "stockDrift": -2}:
            fail(f"/stats within the interval of rows written directly: {got}")
    finally:
        ss.psql(f"DELETE FROM tb_voucher_order WHERE id IN ({9_000_000_000 + vid}, "
                f"{9_100_000_000 + vid})")
        srv.stop_ok()


@test
def postgres_unreachable_stats_503_metrics_without_vouchers():
    srv = ss.Server("nopg", {"PG_DSN": f"host=127.0.0.1 port={ss.dead_port()} dbname=x "
                                       "user=x connect_timeout=1"})
    try:
        r = srv.get("/stats")
        if r.status != 503 or not isinstance(r.body, dict) or r.body.get("error") != "unavailable":
            fail(f"/stats without Postgres: {r.status} {r.raw[:200]!r}")
        r = srv.get("/metrics")
        text = r.raw.decode()
        if r.status != 200 or "seckill_http_requests_total" not in text or \
                "seckill_voucher_stock{" in text:
            fail(f"/metrics without Postgres: {r.status}, {len(text)} bytes")
        if srv.get("/health").status != 200:
            fail("/health")
    finally:
        srv.stop_ok()


if __name__ == "__main__":
    ss.main()
