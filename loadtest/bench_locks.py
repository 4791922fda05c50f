#!/usr/bin/env python3
"""loadtest/bench_locks.py -- every lock backend measured the same way, next
to each service's own ceiling, in one run (make bench-lock).

Starts a private stack (scripts/stack.sh: Postgres, Redis, ZooKeeper, one
instance, nginx; RUN_DIR build/bench-lock-run, free ports), then for each
backend runs loadtest/bench_locks.c (build/tests/bench_locks): uncontended
acquire+release pairs per second from THREADS threads, the contended
hand-off p50/p99 between two threads, and the time until another process
gets the lock after its holder was killed (SIGKILL) or exited without
unlocking, with the same lease / session timeout for every backend. Then
each service's own ceiling, in the same run:

  redis        redis-benchmark: EVALSHA of lua/lock_acquire.lua, calls/s
               (a pair is two script calls: the ceiling in pairs is half)
  zk           ZooKeeper create+delete of an ephemeral node with the C
               client, pairs/s (a lock pair is create, list, delete)
  pg-table     pgbench running the lock table's acquire and release
  pg-advisory  statements (app/lock/pg_lock.c) as a custom script: pairs/s
  multilock    redis-benchmark of one of their nodes, as for redis (three nodes
  redlock      for multilock, five for redlock: redis-server processes of their
               own, scripts/redis-nodes.sh; each node runs every attempt)

Prints a table, writes build/bench-lock/bench-lock.json, a gnuplot chart
build/bench-lock/locks.png, copied to docs/img/locks.png when every backend
was measured. Knobs (environment): BENCH_LOCK_THREADS (8),
BENCH_LOCK_SECONDS (5), BENCH_LOCK_HANDOFFS (300), BENCH_LOCK_LEASE_MS
(3000), BENCH_LOCK_BACKENDS ("redis multilock redlock zk pg-table pg-advisory"),
BENCH_LOCK_OUT (build/bench-lock), BENCH_LOCK_DOCS=0 (no copy to docs/),
BENCH_LOCK_PG_DURABLE (1: Postgres fsyncs its commits, as ZooKeeper syncs its log
before answering; 0: the stack's throwaway settings, no chart copied).
Standard library only; needs redis-benchmark, pgbench, gnuplot (chart).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time

sys.dont_write_bytecode = True          # no __pycache__ in loadtest/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kit  # noqa: E402

ROOT = kit.ROOT
BIN = os.path.join(kit.BUILD, "tests", "bench_locks")
THREADS = int(os.environ.get("BENCH_LOCK_THREADS", "8"))
SECONDS = float(os.environ.get("BENCH_LOCK_SECONDS", "5"))
HANDOFFS = int(os.environ.get("BENCH_LOCK_HANDOFFS", "300"))
LEASE_MS = int(os.environ.get("BENCH_LOCK_LEASE_MS", "3000"))
BACKENDS = os.environ.get("BENCH_LOCK_BACKENDS",
                          "redis multilock redlock zk pg-table pg-advisory").split()
# Postgres with fsync and synchronous commit on (the stack's PG_DURABLE=1), as ZooKeeper
# syncs its log before it answers a write; 0: the stack's throwaway settings.
PG_DURABLE = os.environ.get("BENCH_LOCK_PG_DURABLE", "1")
OUT = os.path.abspath(os.environ.get("BENCH_LOCK_OUT", os.path.join(kit.BUILD, "bench-lock")))
RUN_DIR = os.path.join(kit.BUILD, "bench-lock-run")
NODES_DIR = os.path.join(kit.BUILD, "bench-lock-nodes")
NODES_SH = os.path.join(ROOT, "scripts", "redis-nodes.sh")
NODE_COUNT = {"multilock": 3, "redlock": 5}
# What each backend is, for the table: its service and what frees a dead holder's lock.
ABOUT = {
    "redis": ("Redis", "lease"),
    "multilock": ("3 Redis (all)", "lease"),
    "redlock": ("5 Redis (majority)", "lease"),
    "zk": ("ZooKeeper", "session timeout"),
    "pg-table": ("Postgres", "row's expiry"),
    "pg-advisory": ("Postgres", "session end"),
}


def log(msg):
    print(f"bench-lock: {msg}", file=sys.stderr, flush=True)


def run_json(args, env, timeout):
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)
    if p.returncode != 0:
        raise kit.KitError(f"{' '.join(args)}: exit {p.returncode}: {p.stderr.strip()[-800:]}")
    return json.loads(p.stdout)


def redis_ceiling(port):
    """redis-benchmark EVALSHA acquire calls/s, -c THREADS, one key."""
    port = str(port)
    with open(os.path.join(ROOT, "lua", "lock_acquire.lua")) as f:
        src = f.read()
    sha = kit.redis_cli(port, "SCRIPT", "LOAD", src, timeout=10)
    n = max(50000, int(SECONDS * 20000))
    p = subprocess.run(["redis-benchmark", "-p", port, "-c", str(THREADS), "-n", str(n), "-q",
                        "EVALSHA", sha, "2", "bench:rb", "redisson_lock_token:{bench:rb}",
                        "30000", "rb-owner:1"], capture_output=True, text=True, timeout=300)
    m = re.findall(r":\s*([\d.]+) requests per second", p.stdout.replace("\r", "\n"))
    try:
        kit.redis_cli(port, "DEL", "bench:rb", "redisson_lock_token:{bench:rb}", timeout=10)
    except kit.KitError:
        pass                    # a key left behind costs the next run nothing
    if not m:
        raise kit.KitError(f"redis-benchmark: {p.stdout[-300:]} {p.stderr[-300:]}")
    calls = float(m[-1])
    return {"tool": f"redis-benchmark -c {THREADS} -n {n} EVALSHA lock_acquire.lua",
            "opsPerS": calls, "pairsPerS": calls / 2}


def pgbench_ceiling(info, backend, scripts):
    p = subprocess.run(["pgbench", "-n", "-M", "prepared", "-c", str(THREADS), "-j", "2",
                        "-T", str(int(SECONDS)), "-f", os.path.join(scripts, f"{backend}.sql"),
                        info["PG_DSN"]],
                       capture_output=True, text=True, timeout=SECONDS + 120)
    m = re.search(r"tps = ([\d.]+) \(without initial connection time\)", p.stdout)
    if p.returncode != 0 or not m:
        raise kit.KitError(f"pgbench: {p.stdout[-300:]} {p.stderr[-500:]}")
    tps = float(m.group(1))
    return {"tool": f"pgbench -M prepared -c {THREADS} -T {int(SECONDS)} -f {backend}.sql "
                    "(acquire; release)",
            "opsPerS": 2 * tps, "pairsPerS": tps}


def zk_ceiling(env):
    j = run_json([BIN, "--zk-ceiling", "--threads", str(THREADS), "--seconds", str(SECONDS)],
                 env, SECONDS + 60)
    pairs = j["zkCreateDeletePerS"]
    return {"tool": f"C client, {THREADS} threads, one session: create + delete",
            "opsPerS": 2 * pairs, "pairsPerS": pairs}


COLS = [kit.Col(t, a) for t, a in (
    ("backend", "l"), ("service", "l"), ("pairs/s", "r"), ("ceiling pairs/s", "r"),
    ("of ceiling", "r"), ("hand-off p50 ms", "r"), ("p99 ms", "r"), ("free after kill s", "r"),
    ("after clean exit s", "r"), ("a dead holder's lock goes at", "l"))]


def rows_of(results):
    rows = []
    for r in results:
        c = r.get("ceiling", {}).get("pairsPerS")
        rows.append([r["backend"], ABOUT[r["backend"]][0], f"{r['pairsPerS']:.0f}",
                     f"{c:.0f}" if c else "-",
                     f"{100 * r['pairsPerS'] / c:.0f}%" if c else "-",
                     f"{r['handoffP50Ms']:.2f}", f"{r['handoffP99Ms']:.2f}",
                     f"{r['freeAfterKillMs'] / 1000:.2f}", f"{r['freeAfterExitMs'] / 1000:.2f}",
                     ABOUT[r["backend"]][1]])
    return rows


def write_chart(results, meta):
    dat = os.path.join(OUT, "locks.dat")
    with open(dat, "w", encoding="utf-8") as f:
        f.write("# i backend pairs ceiling p50 p99 kill_s exit_s\n")
        for i, r in enumerate(results):
            f.write(f"{i} \"{r['backend']}\" {r['pairsPerS']:.1f} "
                    f"{r.get('ceiling', {}).get('pairsPerS', 0):.1f} {r['handoffP50Ms']:.3f} "
                    f"{r['handoffP99Ms']:.3f} {r['freeAfterKillMs'] / 1000:.3f} "
                    f"{r['freeAfterExitMs'] / 1000:.3f}\n")
    png = os.path.join(OUT, "locks.png")
    n = len(results)
    script = os.path.join(OUT, "locks.gp")
    with open(script, "w", encoding="utf-8") as f:
        f.write("# gnuplot script of loadtest/bench_locks.py\n" + kit.bar_chart_head(png, 1100, 1000, n)
                + f"""set offsets 0, 0, graph 0.15, 0
set key top right
set multiplot layout 3,1 title "lock backends, one run ({meta['threads']} threads, lease / session {meta['leaseMs']} ms, Postgres {'durable' if meta['pgDurable'] else 'fsync off'}, {meta['cpus']} CPUs)"
set title "uncontended acquire+release pairs per second: the lock, and its service's own ceiling"
set boxwidth 0.35
set yrange [0:*]
plot '{dat}' using ($1-0.18):3:xtic(2) with boxes lc rgb "#1f77b4" title "lock", \\
     '' using ($1-0.18):3:(sprintf("%.0f", $3)) with labels offset 0,0.7 notitle, \\
     '' using ($1+0.18):4 with boxes lc rgb "#aec7e8" title "service ceiling", \\
     '' using ($1+0.18):4:(sprintf("%.0f", $4)) with labels offset 0,0.7 notitle
set title "contended hand-off between two threads, ms (release sent -> the waiter holds it)"
plot '{dat}' using ($1-0.18):5:xtic(2) with boxes lc rgb "#2ca02c" title "p50", \\
     '' using ($1-0.18):5:(sprintf("%.2f", $5)) with labels offset 0,0.7 notitle, \\
     '' using ($1+0.18):6 with boxes lc rgb "#98df8a" title "p99", \\
     '' using ($1+0.18):6:(sprintf("%.2f", $6)) with labels offset 0,0.7 notitle
set title "seconds until another process gets the lock after its holder died"
plot '{dat}' using ($1-0.18):7:xtic(2) with boxes lc rgb "#d62728" title "killed (SIGKILL)", \\
     '' using ($1-0.18):7:(sprintf("%.2f", $7)) with labels offset 0,0.7 notitle, \\
     '' using ($1+0.18):8 with boxes lc rgb "#ff9896" title "clean exit, no unlock", \\
     '' using ($1+0.18):8:(sprintf("%.2f", $8)) with labels offset 0,0.7 notitle
unset multiplot
""")
    return kit.gnuplot(script, png, log)


def main():
    if not os.access(BIN, os.X_OK):
        print(f"bench-lock: {BIN} is missing: make {os.path.relpath(BIN, ROOT)}", file=sys.stderr)
        return 2
    for tool in ("redis-benchmark", "redis-cli", "pgbench"):
        if shutil.which(tool) is None:
            print(f"bench-lock: '{tool}' not found (make deps)", file=sys.stderr)
            return 2
    os.makedirs(OUT, exist_ok=True)
    stack = kit.Stack(RUN_DIR, log=None, scrub=("SECKILL_LOCK", "ZK_HOSTS", "REDIS_URL", "PG_DSN"))
    settings = {"INSTANCES": 1, "NGINX_PORT": "auto", "APP_PORT_BASE": "auto", "PG_PORT": "auto",
                "REDIS_PORT": "auto", "LOCK_SERVICES": "zk", "LOG_LEVEL": "warn",
                "PG_DURABLE": PG_DURABLE}
    rc = 0
    t0 = time.monotonic()
    try:
        log(f"starting the services in {RUN_DIR}")
        stack.run("stop")
        stack.command("start", 180, **settings)
        info = stack.info
        env = dict(os.environ, REDIS_URL=info["REDIS_URL"], PG_DSN=info["PG_DSN"],
                   ZK_HOSTS=info["ZK_HOSTS"], LUA_DIR=os.path.join(ROOT, "lua"), LOG_LEVEL="error")
        if any(b in NODE_COUNT for b in BACKENDS):
            subprocess.run([NODES_SH, "stop", NODES_DIR], capture_output=True, timeout=60)
            p = subprocess.run([NODES_SH, "start", NODES_DIR, "5"], capture_output=True,
                               text=True, timeout=60)
            if p.returncode != 0:
                raise kit.KitError(f"redis-nodes.sh start: {p.stderr.strip()}")
            node_urls = p.stdout.strip().split("=", 1)[1].split(",")
        scripts = os.path.join(OUT, "pgbench")
        os.makedirs(scripts, exist_ok=True)
        subprocess.run([BIN, "--pgbench-scripts", scripts], check=True, timeout=30)
        results = []
        for b in BACKENDS:
            log(f"{b}: pairs ({THREADS} threads, {SECONDS:g} s), {HANDOFFS} hand-offs, "
                f"release after kill and exit (lease {LEASE_MS} ms)")
            benv = env if b not in NODE_COUNT else \
                dict(env, LOCK_REDIS_NODES=",".join(node_urls[:NODE_COUNT[b]]))
            r = run_json([BIN, "--backend", b, "--threads", str(THREADS), "--seconds", str(SECONDS),
                          "--handoffs", str(HANDOFFS), "--lease-ms", str(LEASE_MS)],
                         benv, SECONDS + 300)
            log(f"{b}: ceiling")
            if b == "redis":
                r["ceiling"] = redis_ceiling(info["REDIS_PORT"])
            elif b in NODE_COUNT:
                r["ceiling"] = redis_ceiling(node_urls[0].rsplit(":", 1)[1])
                r["ceiling"]["tool"] += " (one node)"
            elif b == "zk":
                r["ceiling"] = zk_ceiling(env)
            else:
                r["ceiling"] = pgbench_ceiling(info, b, scripts)
            results.append(r)
        meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "cpus": os.cpu_count(), "threads": THREADS, "seconds": SECONDS,
                "handoffs": HANDOFFS, "leaseMs": LEASE_MS, "pgDurable": PG_DURABLE == "1",
                "took": round(time.monotonic() - t0, 1)}
        table = kit.table(COLS, rows_of(results))
        print(f"\nlock backends ({meta['date']}, {meta['cpus']} CPUs, {THREADS} threads, "
              f"{SECONDS:g} s per rate, {HANDOFFS} hand-offs, lease/session {LEASE_MS} ms, "
              f"Postgres {'durable' if meta['pgDurable'] else 'fsync off'})")
        print(table)
        for r in results:
            print(f"  {r['backend']:<12} ceiling: {r['ceiling']['tool']}: "
                  f"{r['ceiling']['opsPerS']:.0f} ops/s")
        with open(os.path.join(OUT, "bench-lock.json"), "w", encoding="utf-8") as f:
            json.dump({"meta": meta, "backends": results}, f, indent=1)
        with open(os.path.join(OUT, "bench-lock.txt"), "w", encoding="utf-8") as f:
            f.write(table + "\n")
        png = write_chart(results, meta)
        if png and set(BACKENDS) == set(ABOUT) and PG_DURABLE == "1" and \
                os.environ.get("BENCH_LOCK_DOCS", "1") != "0":
            shutil.copy(png, os.path.join(ROOT, "docs", "img", "locks.png"))
            print("chart: docs/img/locks.png")
        print(f"data {os.path.join(OUT, 'bench-lock.json')}" + (f", chart {png}" if png else ""))
    except (kit.KitError, subprocess.SubprocessError, ValueError, KeyError) as e:
        print(f"bench-lock: error: {e}", file=sys.stderr)
        rc = 1
    finally:
        stack.run("stop")
        if os.path.isdir(NODES_DIR):
            subprocess.run([NODES_SH, "stop", NODES_DIR], capture_output=True, timeout=60)
    return rc


if __name__ == "__main__":
    sys.exit(main())
