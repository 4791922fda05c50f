#!/usr/bin/env python3
"""A sale on one Redis and on a Redis Cluster, side by side.

  python3 loadtest/cluster_cost.py       (make bench-cluster; make bench runs it last)

Stacks of scripts/stack.sh, one after the other, each on free ports in a
run directory of its own (two instances behind nginx, THREADS=8), for each
stock strategy of CLUSTER_COST_STOCKS (default "optimistic,redis": the
default sale, the reentrant lock and the optimistic statement; and
Redis-first admission, REDIS_ORDER_DURABILITY=aof, every node on
appendfsync always):

  one       one Redis
  cluster   REDIS_CLUSTER=1: 3 masters, 3 replicas

On each, wrk -t2 -c64 for CLUSTER_COST_SECONDS with loadtest/wrk_sale.lua (a
new X-User-Id on every request):

  six       six vouchers on sale at once, each request buying one of them in
            turn (WRK_VOUCHERS)
  hot       one voucher

orders/s (the 200s per second), wrk's p50 and p99, then (Redis-first: once
every instance's /stats says nothing is left unsettled in Redis)
loadtest/check_invariants.py over the ids (no 200 whose order is missing, no
oversell, no user twice). For each Redis master: its share of the commands
(INFO commandstats, calls during the run) and its CPU seconds (INFO cpu,
used_cpu_user + used_cpu_sys) per 1,000 orders.

Prints a table; writes the figures as JSON to CLUSTER_COST_JSON (default
build/cluster-cost.json; {stock: {sale: {setup: figures}}}). Environment:
CLUSTER_COST_SECONDS (10), CLUSTER_COST_STOCKS, CLUSTER_COST_RUN_DIR
(default build/cluster-cost-run), SECKILL_BIN.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_invariants as checker  # noqa: E402
import kit  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECONDS = int(os.environ.get("CLUSTER_COST_SECONDS", "10"))
RUN_DIR = os.environ.get("CLUSTER_COST_RUN_DIR", os.path.join(ROOT, "build", "cluster-cost-run"))
OUT = os.environ.get("CLUSTER_COST_JSON", os.path.join(ROOT, "build", "cluster-cost.json"))
BASE = {"INSTANCES": 2, "THREADS": 8, "DEMO_RANDOM_USER": 0, "LOG_LEVEL": "warn",
        "NGINX_PORT": "auto", "APP_PORT_BASE": "auto"}
SETUPS = (("one", {}), ("cluster", {"REDIS_CLUSTER": 1}))
STOCKS = [x for x in os.environ.get("CLUSTER_COST_STOCKS", "optimistic,redis").split(",") if x]
CONNECTIONS = 64
DRAIN_TIMEOUT = 300


def log(msg):
    print(f"cluster-cost: {msg}", flush=True)


def cli(port, *args):
    return kit.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), *map(str, args)], 30).stdout


def masters(st):
    """The ports of the Redis masters of the stack."""
    if st.info.get("REDIS_CLUSTER") == "1":
        ports = [int(x.rsplit(":", 1)[1]) for x in st.info["REDIS_CLUSTER_NODES"].split(",")]
        return [p for p in ports if cli(p, "ROLE").splitlines()[:1] == ["master"]]
    return [int(st.info["REDIS_PORT"])]


def node_figures(port):
    """(commands run, CPU seconds) of a Redis server so far."""
    calls = sum(int(line.split("calls=")[1].split(",")[0])
                for line in cli(port, "INFO", "commandstats").splitlines()
                if line.startswith("cmdstat_"))
    cpu = dict(line.split(":", 1) for line in cli(port, "INFO", "cpu").replace("\r", "").splitlines()
               if ":" in line)
    return calls, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def check(st, what, vouchers, w, ok):
    """check_invariants per voucher (no oversell, no user twice, the stock
    accounted for), then the 200s over all the vouchers: every acknowledged
    id an order of one of them, as many orders as 200s (plus up to one
    request per connection in flight when wrk stopped: ordered, never
    answered)."""
    if len(vouchers) == 1:
        rc, lines, err = checker.verify(st.dsn, vouchers, w["idsFile"], None, ok,
                                        w["errors"] + CONNECTIONS, quiet=True)
    else:
        rc, lines, err = checker.verify(st.dsn, vouchers, quiet=True)
        vl = ",".join(map(str, vouchers))
        orders = int(kit.psql_value(st.dsn, f"SELECT count(*) FROM tb_voucher_order "
                                            f"WHERE voucher_id IN ({vl})", 60))
        got = {r[0] for r in kit.psql(st.dsn, f"SELECT id FROM tb_voucher_order "
                                              f"WHERE voucher_id IN ({vl})", 60)}
        with open(w["idsFile"]) as f:
            ids = [x.strip() for x in f if x.strip()]
        if not ok <= orders <= ok + w["errors"] + CONNECTIONS or len(set(ids)) != len(ids) or \
                set(ids) - got:
            rc = 1
            lines.append(f"FAIL {ok} x 200, {orders} orders, {len(ids) - len(set(ids))} ids "
                         f"twice, {len(set(ids) - got)} acknowledged ids not orders")
    if rc != 0:
        raise kit.KitError(f"{what}: invariants:\n" + "\n".join(lines) + (err or ""))


def drain(st):
    """Seconds until every instance's /stats says Redis-first has nothing
    unsettled (each voucher's stream on a cluster, the one stream else)."""
    t0 = time.monotonic()

    def drained():
        for url in st.info["INSTANCE_URLS"].split():
            rf = kit.call(url, "GET", "/stats", want=200).body.get("redisFirst") or {}
            if rf.get("backlog") != 0 or rf.get("pending") != 0:
                return False
        return True
    kit.wait_for(drained, DRAIN_TIMEOUT, "the Redis-first streams to drain", 0.2)
    return round(time.monotonic() - t0, 1)


def sale(st, what, vouchers, user_base, tmp, stock):
    ports = masters(st)
    before = {p: node_figures(p) for p in ports}
    w = kit.run_wrk(f"{st.base_url}/voucher/{vouchers[0]}/seckill", CONNECTIONS, SECONDS, tmp,
                    user_base, vouchers=vouchers if len(vouchers) > 1 else ())
    after = {p: node_figures(p) for p in ports}
    ok = w["statuses"].get("200", 0)
    drained_s = drain(st) if stock == "redis" else None
    check(st, what, vouchers, w, ok)
    calls = {p: after[p][0] - before[p][0] for p in ports}
    total = sum(calls.values()) or 1
    return {"ordersPerS": round(ok / w["seconds"], 1) if w["seconds"] else 0.0,
            "p50Ms": w["p50Ms"], "p99Ms": w["p99Ms"], "answers200": ok, "drainS": drained_s,
            "other": {k: n for k, n in w["statuses"].items() if k != "200"},
            "masters": [{"port": p, "commandShare": round(calls[p] / total, 3),
                         "cpuSPer1000Orders": round((after[p][1] - before[p][1]) * 1000 / ok, 3)
                         if ok else None} for p in ports]}


def run_stock(stock, figs, tmp, user_base):
    """Both setups for one stock strategy; the next user_base."""
    for name, settings in SETUPS:
        st = kit.Stack(os.path.join(RUN_DIR, f"{stock}-{name}"),
                       dict(BASE, SECKILL_STOCK=stock, **settings),
                       scrub=("REDIS_CLUSTER", "RUN_DIR", "REDIS_APPENDFSYNC"))
        try:
            log(f"{stock} {name}: starting the stack")
            st.start(fresh=True, timeout=300)
            six = [st.create_voucher(100_000_000, f"cluster-cost {name} {i}") for i in range(6)]
            hot = [st.create_voucher(100_000_000, f"cluster-cost {name} hot")]
            for what, vs in (("six", six), ("hot", hot)):
                user_base += 10_000_000
                f = sale(st, f"{stock} {name} {what}", vs, user_base, tmp, stock)
                figs.setdefault(stock, {}).setdefault(what, {})[name] = f
                log(f"{stock} {name} {what}: {f['ordersPerS']} orders/s, p99 {f['p99Ms']} ms"
                    + (f", drained {f['drainS']} s after the load" if f["drainS"] is not None
                       else "") + ", masters "
                    + ", ".join(f"{m['commandShare']:.0%} of commands, {m['cpuSPer1000Orders']} "
                                f"CPU s per 1000 orders" for m in f["masters"]))
        finally:
            st.run("stop", 180)
    return user_base


def main():
    figs = {"seconds": SECONDS, "connections": CONNECTIONS, "machine": os.cpu_count()}
    tmp = os.path.join(RUN_DIR, "wrk")
    os.makedirs(tmp, exist_ok=True)
    user_base = int(time.time()) * 1000
    for stock in STOCKS:
        user_base = run_stock(stock, figs, tmp, user_base)
    print("\n| stock | sale | one Redis: orders/s | p99 | Redis Cluster (3 masters): orders/s | "
          "p99 | ratio | the masters' shares of commands | Redis CPU s per 1,000 orders: one / "
          "the cluster's masters together |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for stock in STOCKS:
        for what in ("six", "hot"):
            a, b = figs[stock][what]["one"], figs[stock][what]["cluster"]
            ratio = b["ordersPerS"] / a["ordersPerS"] if a["ordersPerS"] else 0.0
            shares = " / ".join(f"{m['commandShare']:.0%}" for m in b["masters"])
            cpu_a = sum(m["cpuSPer1000Orders"] or 0 for m in a["masters"])
            cpu_b = sum(m["cpuSPer1000Orders"] or 0 for m in b["masters"])
            print(f"| {stock} | {what} | {a['ordersPerS']:,.0f} | {a['p99Ms']} ms | "
                  f"{b['ordersPerS']:,.0f} | {b['p99Ms']} ms | {ratio:.2f} | {shares} | "
                  f"{cpu_a:.3f} / {cpu_b:.3f} |")
    kit.write_atomic(OUT, json.dumps(figs, indent=1, sort_keys=True))
    log(f"figures in {OUT}")


if __name__ == "__main__":
    try:
        main()
    except kit.KitError as e:
        print(f"cluster-cost: error: {e}", file=sys.stderr)
        sys.exit(1)
