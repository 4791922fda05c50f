#!/usr/bin/env python3
"""What a synchronous standby costs a sale, and how long a failover takes.

  python3 loadtest/pg_ha_cost.py        (make bench-pg-ha; make bench runs it last)

Two stacks of scripts/stack.sh, one after the other, each on free ports in
a run directory of its own (two instances behind nginx, THREADS=8):

  one      one Postgres with fsync and synchronous_commit on (PG_DURABLE=1)
  sync     pg_auto_failover (PG_HA=1): a monitor and three data nodes,
           each commit confirmed by one standby's flush

On each, for the optimistic, batched and Redis-first sales: wrk -t2 -c64 for
PG_HA_COST_SECONDS with loadtest/wrk_sale.lua (a new X-User-Id on every
request) on a voucher that does not sell out; orders/s (the 200s per second)
and wrk's p99, then loadtest/check_invariants.py over the ids (no 200 whose
order is missing, no oversell, no user twice). Then, on the sync stack, the
primary's pg_autoctl and every postgres process SIGKILLed while one buyer
a time buys through nginx: the seconds from the kill to the first 200
(the failover timeouts of scripts/lib/pg-ha.sh).

Prints a table; writes the figures as JSON to PG_HA_COST_JSON
(default build/pg-ha-cost.json). Environment: PG_HA_COST_SECONDS (10),
PG_HA_COST_RUN_DIR (default build/pg-ha-cost-run), SECKILL_BIN.
"""

import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_invariants as checker  # noqa: E402
import kit  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECONDS = int(os.environ.get("PG_HA_COST_SECONDS", "10"))
RUN_DIR = os.environ.get("PG_HA_COST_RUN_DIR", os.path.join(ROOT, "build", "pg-ha-cost-run"))
OUT = os.environ.get("PG_HA_COST_JSON", os.path.join(ROOT, "build", "pg-ha-cost.json"))
STRATEGIES = ("optimistic", "batched", "redis")
BASE = {"INSTANCES": 2, "THREADS": 8, "DEMO_RANDOM_USER": 0, "LOG_LEVEL": "warn",
        "REDIS_APPENDFSYNC": "always", "NGINX_PORT": "auto", "APP_PORT_BASE": "auto"}
SETUPS = (("one", {"PG_DURABLE": 1}), ("sync", {"PG_HA": 1}))


def log(msg):
    print(f"pg-ha-cost: {msg}", flush=True)


def sale(st, strategy, user_base, tmp):
    st.restart_instances({"SECKILL_STOCK": strategy}, timeout=240)
    v = st.create_voucher(100_000_000, f"pg-ha-cost {strategy}")
    w = kit.run_wrk(f"{st.base_url}/voucher/{v}/seckill", 64, SECONDS, tmp, user_base)
    ok = w["statuses"].get("200", 0)
    if strategy == "redis":
        kit.drain_stream(st.redis_cli, 300)     # the admitted orders, landed in Postgres
    # wrk stops with up to one request per connection in flight: ordered,
    # never answered.
    rc, lines, err = checker.verify(st.dsn, [v], w["idsFile"], None, ok, w["errors"] + 64)
    if rc != 0:
        raise kit.KitError(f"{strategy}: invariants:\n" + "\n".join(lines) + (err or ""))
    return {"ordersPerS": round(ok / w["seconds"], 1) if w["seconds"] else 0.0,
            "p99Ms": w["p99Ms"], "p50Ms": w["p50Ms"], "answers200": ok,
            "other": {k: n for k, n in w["statuses"].items() if k != "200"},
            "errors": w["errors"]}


def primary_tree(st):
    rows = kit.psql(f"host=127.0.0.1 port={st.info['PG_MONITOR_PORT']} user=postgres "
                    "dbname=pg_auto_failover",
                    "SELECT nodename FROM pgautofailover.node WHERE reportedstate = 'primary'"
                    " AND goalstate = 'primary'", 10)
    n = int(rows[0][0][len("node"):])
    return n, kit.proc_tree(st.pid(f"pg-node-{n}"))


def failover(st, user_base):
    """Seconds from SIGKILL of the primary's node to the first 200."""
    st.restart_instances({"SECKILL_STOCK": "optimistic"}, timeout=240)
    v = st.create_voucher(100_000_000, "pg-ha-cost failover")
    n, pids = primary_tree(st)
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
    t0 = time.monotonic()
    user = user_base
    while time.monotonic() - t0 < 180:
        user += 1
        try:
            r = kit.request(st.nginx_port, "POST", f"/voucher/{v}/seckill",
                            {"X-User-Id": str(user)}, timeout=15)
            if r.status == 200:
                took = time.monotonic() - t0
                st.service("start", f"pg-node-{n}")
                return round(took, 2)
        except OSError:
            pass
        time.sleep(0.05)
    raise kit.KitError("no 200 within 180 s of the primary's kill")


def main():
    figs = {"seconds": SECONDS, "connections": 64, "machine": os.cpu_count()}
    tmp = os.path.join(RUN_DIR, "wrk")
    os.makedirs(tmp, exist_ok=True)
    user_base = int(time.time()) * 1000
    for name, settings in SETUPS:
        st = kit.Stack(os.path.join(RUN_DIR, name), dict(BASE, **settings),
                       scrub=("PG_HA", "PG_DURABLE", "SECKILL_STOCK", "RUN_DIR"))
        try:
            log(f"{name}: starting the stack")
            st.start(fresh=True, timeout=300)
            for s in STRATEGIES:
                user_base += 10_000_000
                figs.setdefault(s, {})[name] = sale(st, s, user_base, tmp)
                log(f"{name} {s}: {figs[s][name]['ordersPerS']} orders/s, "
                    f"p99 {figs[s][name]['p99Ms']} ms")
            if name == "sync":
                figs["failoverToFirst200S"] = failover(st, user_base + 5_000_000)
                log(f"sync: primary SIGKILLed -> first 200 after {figs['failoverToFirst200S']} s")
        finally:
            st.run("stop", 180)
    print("\n| sale | one Postgres: orders/s | p99 | synchronous standby: orders/s | p99 | ratio |")
    print("| --- | --- | --- | --- | --- | --- |")
    for s in STRATEGIES:
        a, b = figs[s]["one"], figs[s]["sync"]
        ratio = b["ordersPerS"] / a["ordersPerS"] if a["ordersPerS"] else 0.0
        print(f"| {s} | {a['ordersPerS']:,.0f} | {a['p99Ms']} ms | {b['ordersPerS']:,.0f} | "
              f"{b['p99Ms']} ms | {ratio:.2f} |")
    print(f"\nfailover (primary SIGKILLed, test timeouts): first 200 after "
          f"{figs['failoverToFirst200S']} s")
    kit.write_atomic(OUT, json.dumps(figs, indent=1, sort_keys=True))
    log(f"figures in {OUT}")


if __name__ == "__main__":
    try:
        main()
    except kit.KitError as e:
        print(f"pg-ha-cost: error: {e}", file=sys.stderr)
        sys.exit(1)
