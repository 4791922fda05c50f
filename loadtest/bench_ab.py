#!/usr/bin/env python3
"""make bench-ab: two or more instance settings compared on one stack.

  python3 loadtest/bench_ab.py 'EARLY_LOCK_RELEASE=0' 'EARLY_LOCK_RELEASE=1'
  AB_STOCK=batched python3 loadtest/bench_ab.py 'THREADS=16' 'THREADS=48'

Each argument is one setting: space-separated VAR=value pairs for the two
instances (any server variable, or SECKILL_BIN=<another build>). On this
machine one run of a setting moves by up to half with the neighbours' load,
so settings are never compared across runs: the tool starts one private
stack (make bench's: durable Postgres, Redis, 2 instances, nginx, in
build/bench-ab-run), then runs the settings in turn, round after round
(A B A B A B), each time restarting the instances with that setting and
running make bench's sale (a fresh voucher, warm-up, VACUUM + CHECKPOINT, a
wrk sale to distinct users, the invariants checked). It prints, per setting,
the median orders/s and the median CPU milliseconds per order of every
process of the stack (and, for a sale, the share of the machine left idle),
and writes them to AB_JSON.

Environment (all optional):
  AB_ROUNDS        rounds (default 3)
  AB_SECONDS       length of each sale (default 6)
  AB_CONNECTIONS   wrk connections (default 64)
  AB_STOCK         the stock strategy of every setting unless it names its own
                   (default optimistic). redis: make bench's redis-first sale (Redis
                   with appendfsync always, THREADS=BENCH_REDIS_THREADS unless the
                   setting names its own, the stream drained and reconciled after
                   each sale)
  AB_MODE          sale (default), or soldout: make bench's sold-out run instead
                   of a sale (req/s, CPU ms per request, p99, and the p99 and steal
                   of its run paced to half its rate), with the stack's nginx
                   started without the sold-out edge (NGINX_EDGE=off) so that the
                   requests reach the instances whose settings are compared
  AB_NGINX_EDGE    off: the stack's nginx without the sold-out edge in every mode
                   (a setting cannot change it: nginx is the stack's, not the
                   instances'); compare with a second run that leaves it on
  AB_JSON          results file (default <repo>/build/bench-ab.json)
  BENCH_RUN_DIR    the stack's run directory (default <repo>/build/bench-ab-run)
An invariant violation makes it exit 1.
"""

import json
import os
import statistics
import sys
import tempfile

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench  # noqa: E402
import kit  # noqa: E402
from kit import Col  # noqa: E402


def parse_setting(text):
    env = {}
    for item in text.split():
        key, sep, value = item.partition("=")
        if not sep or not key.replace("_", "").isalnum() or not key[0].isalpha():
            raise bench.BenchError(f"setting {text!r}: {item!r} is not VAR=value")
        env[key] = value
    return env


def main():
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    rounds = bench.env_int("AB_ROUNDS", 3)
    seconds = bench.env_int("AB_SECONDS", 6)
    conns = bench.env_int("AB_CONNECTIONS", 64)
    stock = os.environ.get("AB_STOCK", "optimistic")
    mode = os.environ.get("AB_MODE", "sale")
    if mode not in ("sale", "soldout"):
        bench.log(f"error: AB_MODE={mode!r}: sale or soldout")
        return 2
    out = os.environ.get("AB_JSON") or os.path.join(bench.ROOT, "build", "bench-ab.json")
    os.environ.setdefault("BENCH_RUN_DIR", os.path.join(bench.ROOT, "build", "bench-ab-run"))
    os.environ["BENCH_SECONDS"] = str(seconds)
    try:
        settings = [parse_setting(a) for a in args]
    except bench.BenchError as e:
        bench.log(f"error: {e}")
        return 2
    for s in settings:
        s.setdefault("SECKILL_STOCK", stock)
        if s["SECKILL_STOCK"] == "redis":
            s.setdefault("THREADS", str(bench.redis_threads()))
        if "SECKILL_BIN" in s:
            s["SECKILL_BIN"] = os.path.abspath(s["SECKILL_BIN"])
    keys = set().union(*settings)
    # Postgres's max_connections is sized from the most threads any setting asks.
    threads = [int(s["THREADS"]) for s in settings if s.get("THREADS", "").isdigit()]
    if threads:
        os.environ["BENCH_BATCH_THREADS"] = str(max(threads + [16]))

    b = bench.Bench()
    runs = {a: [] for a in args}

    def rounds_of_settings():
        os.makedirs(b.run_dir, exist_ok=True)
        b.tmp = tempfile.mkdtemp(prefix="bench-ab.", dir=b.run_dir)
        if mode == "soldout" or os.environ.get("AB_NGINX_EDGE") == "off":
            b.stack.set({"NGINX_EDGE": "off"})     # the instances answer, not nginx
        b.stack.start(fresh=True)
        if any(s["SECKILL_STOCK"] == "redis" for s in settings):
            b.redis_aof(True)              # what a 200 of the redis strategy needs
        for r in range(1, rounds + 1):
            for text, s in zip(args, settings):
                # What another setting set and this one does not name goes back
                # to the stack's default.
                b.stack.restart_instances({**s, **{k: None for k in keys - set(s)}})
                if mode == "soldout":
                    w = b.sold_out()
                    n = max(1, w["requests"])
                    cpu = {k: v * 1000.0 / n for k, v in w["cpu"].items()
                           if isinstance(v, (int, float)) and k not in ("busyPct", "wallSeconds",
                                                                         "machineBusy", "stealPct")}
                    runs[text].append({"ordersPerSec": w["rps"], "cpuMsPerOrder": cpu,
                                       "p99Ms": w["p99Ms"], "pacedP99Ms": w["pacedHalf"]["p99Ms"],
                                       "pacedStealPct": w["pacedHalf"]["stealPct"]})
                    continue
                if s["SECKILL_STOCK"] == "redis":
                    res = b.redis_sale(f"round {r}, {text}", conns, seconds)
                else:
                    res = b.sale(f"round {r}, {text}", conns, seconds)
                cpu = res["cpuMsPerOrder"] or {}
                runs[text].append({"ordersPerSec": res["ordersPerSec"], "cpuMsPerOrder": cpu,
                                   "p99Ms": res["wrk"]["p99Ms"],
                                   "idlePct": (res.get("cpu") or {}).get("idlePct")})
    rc = 2 if b.guarded(rounds_of_settings) else 0
    if b.violations:
        rc = 1
    summary = []
    cols = ("seckill", "nginx", "postgres", "redis", "loadTool", "interrupts")
    unit = "req/s" if mode == "soldout" else "orders/s"
    per = "request" if mode == "soldout" else "order"
    what = "sold-out runs at 64" if mode == "soldout" else f"sales at {conns}"
    print(f"\n== make bench-ab: {rounds} round(s), {seconds} s {what} connections, medians\n")
    table_cols = ([Col("setting", "l", 48, fit=False), Col(unit, "r", 9, 1, False),
                   Col(f"CPU ms per {per}:", "l", 22, 2, False)]
                  + [Col(c[:8], "r", 8, 1, False) for c in cols]
                  + [Col("total", "r", 7, 1, False), Col("p99 ms", "r", 7, 1, False)]
                  + ([Col("paced p99", "r", 9, 1, False), Col("its steal", "r", 9, 1, False)]
                     if mode == "soldout" else [Col("idle %", "r", 7, 1, False)]))
    rows = []
    for text in args:
        rs = runs[text]
        if not rs:
            continue
        med = {"ordersPerSec": statistics.median(x["ordersPerSec"] for x in rs),
               "p99Ms": statistics.median(x["p99Ms"] for x in rs),
               "cpuMsPerOrder": {c: statistics.median(x["cpuMsPerOrder"].get(c, 0) for x in rs)
                                 for c in cols}}
        med["cpuMsPerOrder"]["total"] = round(sum(med["cpuMsPerOrder"].values()), 3)
        row = ([text[:48], f"{med['ordersPerSec']:,.0f}", ""]
               + [f"{med['cpuMsPerOrder'][c]:.3f}" for c in cols]
               + [f"{med['cpuMsPerOrder']['total']:.3f}", f"{med['p99Ms']:.1f}"])
        if mode == "soldout":
            med["pacedP99Ms"] = statistics.median(x["pacedP99Ms"] for x in rs)
            med["pacedStealPct"] = statistics.median(x["pacedStealPct"] or 0 for x in rs)
            row += [f"{med['pacedP99Ms']:.2f}", f"{med['pacedStealPct']:.1f}%"]
        else:
            idle = [x["idlePct"] for x in rs if x.get("idlePct") is not None]
            med["idlePct"] = statistics.median(idle) if idle else None
            row.append(f"{med['idlePct']:.0f}" if idle else "-")
        summary.append({"setting": text, "runs": rs, "median": med})
        rows.append(row)
    print(kit.table(table_cols, rows))
    print(f"\ninvariants: {'VIOLATED' if b.violations else 'hold after every sale'}")
    with open(out, "w") as f:
        json.dump({"mode": mode, "rounds": rounds, "seconds": seconds, "connections": conns,
                   "settings": summary, "violations": b.violations}, f, indent=2)
    print(f"results: {out}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
