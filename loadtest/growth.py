#!/usr/bin/env python3
"""What a sale to distinct buyers leaves behind in Redis and Postgres, and what
is still there once the fencing state's lifetimes have passed.

Starts a private local stack (scripts/stack.sh: Postgres, Redis, 2 instances,
nginx) in GROWTH_RUN_DIR with short lifetimes (LOCK_TOKEN_TTL_MS and
FENCE_HORIZON_MS, 5 s each by default, so that the end is seen within the
run), sells a voucher that never sells out to a new buyer per request (wrk with
loadtest/wrk_sale.lua through nginx) for GROWTH_SALE_S seconds, and reads the
same figures three times: before the sale, right after it, and once every
lifetime has passed (the token counters' TTL, two fence horizons plus a
sweep period, the release latches' 5 s):

  Redis      INFO memory used_memory, DBSIZE, and the keys by kind: fencing-
             token counters (redisson_lock_token:*), release latches
             (redisson_unlock_latch:*), locks (lock:order:*), the rest
  Postgres   tb_lock_fence rows, its size on disk (pg_total_relation_size) and
             its dead rows (pg_stat_user_tables.n_dead_tup): deleted rows are
             dead until autovacuum makes their space reusable, and the file
             does not shrink; tb_voucher_order rows

Prints a table, writes the figures as JSON to GROWTH_JSON (default
build/growth.json) and exits 1 when token counters, latches or fence rows of
the sale are left at the end, or a buyer was refused as stale
(GROWTH_EXPECT_BOUNDED=0: only report, for a build without the bound).

Knobs (environment): GROWTH_SALE_S (60), GROWTH_CONNECTIONS (32),
GROWTH_TOKEN_TTL_MS (5000), GROWTH_HORIZON_MS (5000), GROWTH_RUN_DIR
(build/growth-run), GROWTH_KEEP=1 (leave the stack running), SECKILL_BIN,
LUA_DIR. Python 3 standard library; needs wrk.
"""

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kit  # noqa: E402

ROOT = kit.ROOT
SALE_S = float(os.environ.get("GROWTH_SALE_S", "60"))
CONNECTIONS = int(os.environ.get("GROWTH_CONNECTIONS", "32"))
TOKEN_TTL_MS = int(os.environ.get("GROWTH_TOKEN_TTL_MS", "5000"))
HORIZON_MS = int(os.environ.get("GROWTH_HORIZON_MS", "5000"))
RUN_DIR = os.environ.get("GROWTH_RUN_DIR") or os.path.join(ROOT, "build", "growth-run")
JSON_OUT = os.environ.get("GROWTH_JSON") or os.path.join(ROOT, "build", "growth.json")
KEEP = os.environ.get("GROWTH_KEEP") == "1"
EXPECT_BOUNDED = os.environ.get("GROWTH_EXPECT_BOUNDED", "1") != "0"
LATCH_MS = 5000                 # lock.c: a release latch lives 5 x REDIS_TIMEOUT_MS, >= 5 s
SWEEP_PERIOD_MS = max(HORIZON_MS, 100)    # fence.c: one pass per horizon
KINDS = (("tokens", "redisson_lock_token:"), ("latches", "redisson_unlock_latch:"),
         ("locks", "lock:order:"))


def log(msg):
    print(f"growth: {msg}", file=sys.stderr, flush=True)


def measure(stack):
    """The figures of one reading."""
    mem = {}
    for line in stack.redis_cli("INFO", "memory", timeout=120).splitlines():
        k, _, v = line.strip().partition(":")
        mem[k] = v
    f = {"usedMemory": int(mem["used_memory"]),
         "dbsize": int(stack.redis_cli("DBSIZE", timeout=120).strip())}
    # One SCAN, classified here: keys that expire meanwhile are counted
    # once or not at all, never told apart from DBSIZE's count.
    keys = stack.redis_cli("--scan", timeout=120).split()
    for name, prefix in KINDS:
        f[name] = sum(1 for k in keys if k.startswith(prefix))
    f["otherKeys"] = len(keys) - sum(f[name] for name, _ in KINDS)
    rows, size, dead = kit.psql(
        stack.dsn, "SELECT count(*), pg_total_relation_size('tb_lock_fence'), "
                   "(SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'tb_lock_fence') "
                   "FROM tb_lock_fence")[0]
    f["fenceRows"], f["fenceBytes"], f["fenceDead"] = int(rows), int(size), int(dead or 0)
    f["orders"] = int(kit.psql_value(stack.dsn, "SELECT count(*) FROM tb_voucher_order"))
    return f


def stale_rejections(stack):
    total = 0
    for url in stack.instance_urls:
        total += kit.call(url, "GET", "/stats", want=200).body["lock"].get("staleTokenRejections", 0)
    return total


def report(readings, sale):
    rows = []
    for label, key, fmt in (("Redis used_memory", "usedMemory", lambda v: f"{v / 1048576:.1f} MiB"),
                            ("Redis DBSIZE", "dbsize", kit.fmt_count),
                            ("  token counters", "tokens", kit.fmt_count),
                            ("  release latches", "latches", kit.fmt_count),
                            ("  locks", "locks", kit.fmt_count),
                            ("  other keys", "otherKeys", kit.fmt_count),
                            ("tb_lock_fence rows", "fenceRows", kit.fmt_count),
                            ("tb_lock_fence on disk", "fenceBytes", lambda v: f"{v / 1024:.0f} KiB"),
                            ("  dead rows (to vacuum)", "fenceDead", kit.fmt_count),
                            ("tb_voucher_order rows", "orders", kit.fmt_count)):
        rows.append([label] + [fmt(r[key]) for _, r in readings])
    print(f"\nFencing state over a {SALE_S:.0f} s sale to distinct buyers ({sale['ok']} orders, "
          f"{sale['reqPerSec']:.0f} req/s, {CONNECTIONS} connections through nginx); "
          f"LOCK_TOKEN_TTL_MS={TOKEN_TTL_MS}, FENCE_HORIZON_MS={HORIZON_MS}\n")
    cols = [kit.Col("")] + [kit.Col(label, "r") for label, _ in readings]
    print(kit.table(cols, rows))


def main():
    settings = {"LOCK_TOKEN_TTL_MS": TOKEN_TTL_MS, "FENCE_HORIZON_MS": HORIZON_MS,
                "INSTANCES": 2, "LOG_LEVEL": "warn", "DEMO_RANDOM_USER": 0}
    for k in ("SECKILL_BIN", "LUA_DIR"):
        if os.environ.get(k):
            settings[k] = os.environ[k]
    stack = kit.Stack(RUN_DIR, settings, log=log)
    bounded = True
    try:
        log(f"starting the stack in {RUN_DIR}")
        stack.start(fresh=True)
        vid = stack.create_voucher(100_000_000, "growth")
        readings = [("before", measure(stack))]
        log(f"wrk: {CONNECTIONS} connections, {SALE_S:.0f} s, a new buyer per request")
        out = os.path.join(RUN_DIR, "wrk")
        os.makedirs(out, exist_ok=True)
        w = kit.run_wrk(f"{stack.base_url}/voucher/{vid}/seckill", CONNECTIONS, SALE_S, out,
                        user_base=3_000_000_000, ids=False, latency=False)
        statuses = w.get("statuses", {})
        sale = {"ok": int(statuses.get("200", 0)), "statuses": statuses, "reqPerSec": w["rps"],
                "socketErrors": w["errors"], "cmd": " ".join(w["cmd"])}
        readings.append(("right after", measure(stack)))
        wait_s = (max(TOKEN_TTL_MS, 2 * HORIZON_MS + SWEEP_PERIOD_MS, LATCH_MS) + 2000) / 1000
        log(f"waiting {wait_s:.1f} s: token TTL, two horizons and a sweep, the latches' lifetime")
        time.sleep(wait_s)
        readings.append((f"{wait_s:.0f} s later", measure(stack)))
        sale["staleRejections"] = stale_rejections(stack)
    finally:
        if not KEEP and stack.started:
            stack.stop()
    report(readings, sale)
    end = readings[-1][1]
    left = {k: end[k] for k in ("tokens", "latches", "fenceRows")}
    print(f"\nleft at the end: {left}; stale-token rejections during the sale: "
          f"{sale['staleRejections']}; wrk: {sale['statuses']}")
    os.makedirs(os.path.dirname(JSON_OUT), exist_ok=True)
    kit.write_atomic(JSON_OUT, json.dumps({
        "saleSeconds": SALE_S, "connections": CONNECTIONS, "tokenTtlMs": TOKEN_TTL_MS,
        "fenceHorizonMs": HORIZON_MS, "sale": sale,
        "readings": [{"label": label, **r} for label, r in readings]}, indent=1) + "\n")
    if any(left.values()) or sale["staleRejections"]:
        bounded = False
    if EXPECT_BOUNDED and not bounded:
        print("growth: FAIL: fencing state left after its lifetimes, or buyers refused as stale",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except kit.KitError as e:
        log(f"error: {e}")
        sys.exit(2)
