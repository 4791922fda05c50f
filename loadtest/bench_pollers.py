#!/usr/bin/env python3
"""make bench-pollers: buyers' latency with and without clients polling /stats.

  python3 loadtest/bench_pollers.py
  SECKILL_BIN=/path/to/another/seckill python3 loadtest/bench_pollers.py

Starts make bench's private stack (durable Postgres, Redis, 2 instances,
nginx; BENCH_RUN_DIR, default build/bench-pollers-run), then runs rounds of
two paced sales through nginx, interleaved (A B A B ...): the buyers alone,
and the same buyers while POLLERS clients poll GET /stats through nginx in a
loop, as fast as they are answered (wrk, one connection each, no pause).
Each sale is wrk with loadtest/wrk_sale.lua: a new user per request, each
connection pausing PACE_MS between requests, on a fresh voucher whose stock
does not run out; the invariants are checked in Postgres after each.

Printed per arm, medians over the rounds: the buyers' p50 and p99 and
orders/s; the pollers' answers/s; the passes over the order table Postgres
counted meanwhile (pg_stat_user_tables: sequential plus index scans of
tb_voucher_order, the buyers' own duplicate checks included). Written to
POLLERS_JSON.

Environment (all optional):
  POLLERS          polling clients (default 20)
  POLL_ROUNDS      rounds (default 3)
  POLL_SECONDS     length of each sale (default 8)
  POLL_BUYERS      wrk connections of the buyers (default 16)
  PACE_MS          pause of each buyer connection between requests (default 10)
  POLLERS_JSON     results file (default <repo>/build/bench-pollers.json)
  BENCH_RUN_DIR    the stack's run directory (default <repo>/build/bench-pollers-run)
  SECKILL_BIN      server binary (default build/seckill)
An invariant violation makes it exit 1.
"""

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench  # noqa: E402
import kit  # noqa: E402


def wrk_get(url, conns, seconds):
    """wrk GET url on conns connections (one thread) for seconds, started in
    the background; returns the Popen (stdout is wrk's report)."""
    cmd = ["wrk", "-t1", "-c", str(conns), "-d", f"{seconds}s", "--timeout", "10s", "--latency", url]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wrk_report(text):
    """Requests/sec and the non-2xx count from wrk's report."""
    rps = re.search(r"Requests/sec:\s+([\d.]+)", text)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    return {"rps": float(rps.group(1)) if rps else None,
            "non2xx": int(non2xx.group(1)) if non2xx else 0,
            "socketErrors": sum(int(x) for x in errors.groups()) if errors else 0}


class PollBench(bench.Bench):
    def __init__(self):
        super().__init__()
        self.pollers = bench.env_int("POLLERS", 20)
        self.rounds_n = bench.env_int("POLL_ROUNDS", 3)
        self.sale_s = bench.env_int("POLL_SECONDS", 8)
        self.buyers = bench.env_int("POLL_BUYERS", 16)
        self.pace = bench.env_int("PACE_MS", 10)
        self.out = os.environ.get("POLLERS_JSON") or os.path.join(bench.ROOT, "build",
                                                                   "bench-pollers.json")
        self.arms = {"buyers alone": [], f"buyers + {self.pollers} pollers": []}

    def order_scans(self):
        # Postgres publishes a backend's counts within a second of its going
        # idle: wait until two readings agree.
        last = None
        for _ in range(20):
            n = int(self.psql("SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM "
                              "pg_stat_user_tables WHERE relname = 'tb_voucher_order'")[0][0])
            if n == last:
                return n
            last = n
            time.sleep(0.6)
        return last

    def one(self, arm, pollers):
        v = self.stack.create_voucher(10_000_000, f"bench-pollers: {arm}")
        self.quiesce()
        scans0 = self.order_scans()
        poll = None
        if pollers:
            poll = wrk_get(f"{self.stack.base_url}/stats", pollers, self.sale_s + 2)
            time.sleep(1)
        off = self.log_offset()
        w = self.wrk(f"{self.stack.base_url}/voucher/{v}/seckill", self.buyers, self.sale_s,
                     ids=True, delay_ms=self.pace)
        polled = None
        if poll is not None:
            polled = wrk_report(poll.communicate(timeout=self.sale_s + 60)[0])
        scans = self.order_scans() - scans0
        n, span = self.order_span(v)
        unknown = self.unknown(w, self.logged(off, v), self.buyers)
        self.check(f"{arm}", v, ids=w["idsFile"], ok=w["statuses"].get("200", 0), unknown=unknown)
        r = {"voucherId": v, "orders": n, "ordersPerSec": round((n - 1) / span, 1) if span else 0,
             "p50Ms": w["p50Ms"], "p99Ms": w["p99Ms"], "maxMs": w["maxMs"],
             "statuses": w["statuses"], "orderTableScans": scans,
             "pollers": polled}
        bench.log(f"{arm}: p50 {w['p50Ms']} ms, p99 {w['p99Ms']} ms, {r['ordersPerSec']} orders/s, "
                  f"{scans} order-table scans" +
                  (f"; pollers {polled['rps']} answers/s, {polled['non2xx']} non-2xx" if polled else ""))
        return r

    def body(self):
        os.makedirs(self.run_dir, exist_ok=True)
        self.tmp = tempfile.mkdtemp(prefix="bench-pollers.", dir=self.run_dir)
        self.stack.start(fresh=True)
        for i in range(1, self.rounds_n + 1):
            for arm, pollers in zip(self.arms, (0, self.pollers)):
                bench.log(f"round {i}: {arm}")
                self.arms[arm].append(self.one(arm, pollers))


def med(runs, key, sub=None):
    vals = [(r[key] or {}).get(sub) if sub else r[key] for r in runs]
    vals = [v for v in vals if v is not None]
    return round(statistics.median(vals), 2) if vals else None


def main():
    if len(sys.argv) > 1:
        print(__doc__)
        return 0 if sys.argv[1] in ("-h", "--help") else 2
    os.environ.setdefault("BENCH_RUN_DIR", os.path.join(bench.ROOT, "build", "bench-pollers-run"))
    b = PollBench()
    err = b.guarded(b.body)
    rows, summary = [], {}
    for arm, runs in b.arms.items():
        if not runs:
            continue
        s = {"p50Ms": med(runs, "p50Ms"), "p99Ms": med(runs, "p99Ms"),
             "ordersPerSec": med(runs, "ordersPerSec"), "orderTableScans": med(runs, "orderTableScans"),
             "pollerAnswersPerSec": med(runs, "pollers", "rps")}
        summary[arm] = s
        rows.append([arm, s["p50Ms"], s["p99Ms"], s["ordersPerSec"], s["orderTableScans"],
                     s["pollerAnswersPerSec"] if s["pollerAnswersPerSec"] is not None else "-"])
    if rows:
        print(f"\nbuyers: {b.buyers} wrk connections, {b.pace} ms apart, {b.sale_s} s sales through "
              f"nginx; {b.rounds_n} rounds, medians; binary {b.bin}")
        cols = [kit.Col("")] + [kit.Col(t, "r") for t in ("p50 ms", "p99 ms", "orders/s",
                                                           "order-table scans", "poller answers/s")]
        print(kit.table(cols, rows))
        a, c = (summary.get(k, {}).get("p99Ms") for k in b.arms)
        if a and c:
            print(f"p99 with pollers / without: {c / a:.2f}")
    with open(b.out, "w") as f:
        json.dump({"binary": b.bin, "pollers": b.pollers, "buyers": b.buyers, "paceMs": b.pace,
                   "seconds": b.sale_s, "rounds": b.arms, "summary": summary, "error": err,
                   "violations": b.violations}, f, indent=1)
    print(f"written {b.out}")
    if b.violations:
        return 1
    return 2 if err else 0


if __name__ == "__main__":
    sys.exit(main())
