#!/usr/bin/env python3
"""make bench: the machine's ceilings and the service, measured in one run.

  python3 loadtest/bench.py            (make bench builds first, then runs this)

Starts its own local stack (scripts/stack.sh in BENCH_RUN_DIR: a durable
Postgres -- fsync, synchronous_commit and full_page_writes on, the defaults --,
Redis, 2 instances at LOG_LEVEL=warn, nginx; every port picked free on
127.0.0.1), then measures:

  ceilings on that same Postgres, Redis and nginx
    pg-one-row   pgbench: UPDATE tb_voucher SET stock = stock - 1
                 WHERE voucher_id = :v AND stock > 0, autocommit, 16 clients
    pg-txn       pgbench: BEGIN; duplicate check SELECT; that UPDATE; INSERT
                 the order; COMMIT (distinct users and order ids), 16 clients
    redis        redis-benchmark: EVALSHA of lua/lock_acquire.lua on distinct
                 keys (-r), 50 clients
    nginx        wrk through an nginx made from nginx/nginx.conf.tmpl (the
                 same proxy settings) to a keep-alive upstream that answers
                 200 at once, 64 connections; then the same nginx in front of
                 two build/upstream200 processes (loadtest/upstream200.c), a
                 separate upstream that does no work: not a target, a
                 yardstick for how much of the chain's cost is the upstream's
    nginx bare   wrk on a server block of that nginx that answers 'return 200'
                 itself (the same http settings and access log): what nginx
                 alone answers, saturated and paced to half that rate
  the service through nginx (2 instances)
    sale         wrk, a new user per request, a stock that does not run out:
                 orders/s from the first to the last order in Postgres
    sold-out     wrk on a sold-out voucher, answered by nginx's sold-out edge:
                 req/s, p50/p99 saturated and paced to half that rate, the
                 instances' CPU and the requests that reached them meanwhile
                 (their own sold_out counters); then the same through a
                 second nginx from the template with --edge off (every
                 request to an instance: the hop the edge saves)
    storm        ab -k, one user: req/s (exactly one order)
    long         a 60 s sale at 256 connections: RSS per instance after it
    low          the optimistic sale at 16 connections (the batched one's
                 yardstick at that concurrency)
    batched      the instances restarted with SECKILL_STOCK=batched: the sale
                 again at 16, 64 and 256 connections, each with its CPU by
                 component, the machine's idle share and the buyers per group
                 commit (the instances' seckill_batch_buyers_total /
                 seckill_batches_total, from /metrics)
    redis        the instances restarted with SECKILL_STOCK=redis, Redis switched
                 to appendonly yes, appendfsync always (CONFIG SET; back to no
                 AOF after): the sale again, orders/s as acknowledged (200s per
                 second of load), the time until the last order landed in
                 Postgres, and the reconciliation of Redis and Postgres
    rediswait    the same sale acknowledged by WAIT for one replica instead
                 (REDIS_ORDER_DURABILITY=wait, REDIS_ORDER_WAIT_REPLICAS=1): a
                 redis-server replicating the stack's Redis is started for it
                 and stopped after; the master runs without AOF meanwhile
  RSS per instance (VmRSS) before and after; CPU seconds per component
  (seckill, nginx, postgres, redis, the load tool, everything else) per run.

After every service run loadtest/check_invariants.py checks the voucher in
Postgres; any violation makes the run exit 1 (speed targets never do: they
are printed PASS or MISS). Prints the table, writes BENCH_JSON, and stops
everything it started, by PID. With gnuplot, also a chart next to
BENCH_JSON (bench.png): each sale's orders/s against the one-row ceiling,
and its CPU per order by process.

  loadtest/bench.py --median [--json OUT] FILE...   medians of several runs
  loadtest/bench.py --chart FILE PNG                the chart of a saved run
                                                    (docs/img/bench.png)

Environment (all optional):
  BENCH_RUN_DIR        the stack's run directory (default <repo>/build/bench-run)
  BENCH_JSON           results file (default <repo>/build/bench.json)
  BENCH_SECONDS        length of each measured run (default 6)
  BENCH_WARMUP         warm-up seconds before each (default 2)
  BENCH_REPEAT         rounds of the short runs; the table shows medians (default 1)
  BENCH_LONG           1: the 60 s / 256-connection sale (default 1; 0 skips it)
  BENCH_LONG_SECONDS, BENCH_LONG_CONNECTIONS   (60, 256)
  BENCH_SALE_CONNECTIONS      wrk connections of the sales (64)
  BENCH_LOW_CONNECTIONS       wrk connections of the low optimistic sale (16; 0: none)
  BENCH_BATCH_CONNECTIONS     wrk connections of the batched sales, a comma list
                              (16,64,256)
  BENCH_THREADS        THREADS of the optimistic instances (default: the server's)
  BENCH_BATCH_THREADS  THREADS of the batched instances (default 8, the server's:
                       a queued buyer holds no worker, and 4, 8 and 16 measured alike)
  BENCH_REDIS_THREADS  THREADS of the redis-first instances (default 32: a worker
                       waits for Redis's fsync, and more of them share one)
  BENCH_SKIP           comma list of ceilings,optimistic,low,storm,soldout,noedge,long,batched,redis,
                       rediswait
  BENCH_KEEP=1         leave the stack running at the end (make stop-bench stops it)
  SECKILL_BIN          server binary (default build/seckill)
  BENCH_UPSTREAM200    the ceiling's stand-in upstream (default build/upstream200)
Python 3 standard library only.
"""

import gzip
import json
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import check_invariants  # noqa: E402
import kit  # noqa: E402
from kit import Col, fmt_count  # noqa: E402

# Reference figures measured once on a 2-core VM with durable Postgres, printed
# beside this run's ceilings to show how far the machine is from that one.
REFERENCE = {"pgOneRow": 3600, "pgTxn": 2100, "redisEvalsha": 80000, "nginx": 42000}
STEAL_WARN_PCT = 5     # a run with more steal than this is flagged in the table
PACED_SHARE = 0.25   # paced latency runs offer this share of the nginx ceiling's rate
TARGETS = {"optimisticVsOneRow": 0.9, "soldOutVsNginx": 0.9,
           "soldOutP99Ms": 2.0, "rssMb": 20.0, "soldOutVsBare": 0.8, "soldOutSeckillCpuPct": 5.0,
           "redisVsOneRow": 3.0, "redisVsSoldOut": 0.4, "redisP99Ms": 10.0}
HALF = 0.5           # the sold-out crowd and the bare ceiling are also paced to half their rate
# The batched sale's targets by concurrency: orders/s against the one-row
# ceiling, the machine's idle share during the sale (%), p99 (ms), and
# orders/s against the optimistic sale at the same concurrency.
BATCH_TARGETS = {16: {"vsOptimistic": 1.0}, 64: {"vsOneRow": 3.0, "idlePct": 15.0, "p99Ms": 30.0},
                 256: {"vsOneRow": 3.0}}


def env_list(name, default):
    """A comma list of whole numbers from the environment."""
    v = os.environ.get(name, "")
    if v.strip() == "":
        return default
    try:
        return [int(x) for x in v.split(",") if x.strip()]
    except ValueError:
        sys.exit(f"bench: {name} must be a comma list of whole numbers (got {v!r})")


def env_int(name, default):
    v = os.environ.get(name, "")
    if v == "":
        return default
    try:
        return int(v)
    except ValueError:
        sys.exit(f"bench: {name} must be a whole number (got {v!r})")


class BenchError(kit.KitError):
    pass


class Interrupted(Exception):
    pass


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


run = kit.run


# ------------------------------------------------------------------ /proc

CLK = os.sysconf("SC_CLK_TCK")


def proc_stat(pid):
    """(ppid, utime+stime, cutime+cstime) in seconds, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    rest = s[s.rindex(")") + 2:].split()
    # rest[0] is field 3 (state): ppid field 4, utime 14, stime 15, cutime 16, cstime 17.
    return int(rest[1]), (int(rest[11]) + int(rest[12])) / CLK, (int(rest[13]) + int(rest[14])) / CLK


def all_pids():
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def kernel_config():
    """The running kernel's build options that are set ({name: value}), from
    /proc/config.gz or /boot/config-<release>; None when neither is there."""
    for path, opener in (("/proc/config.gz", gzip.open), (f"/boot/config-{os.uname().release}", open)):
        try:
            with opener(path, "rt") as f:
                return dict(line.split("=", 1) for line in f.read().splitlines()
                            if line.startswith("CONFIG_") and "=" in line)
        except OSError:
            continue
    return None


# Whether the kernel counts interrupt work done inside a process in that
# process's time as well as in the machine's softirq time: tick-based
# accounting without CONFIG_IRQ_TIME_ACCOUNTING does (account_system_index_time()
# in kernel/sched/cputime.c). Unknown: assumed, since the estimate is bounded
# by the machine's interrupt time either way.
_CONFIG = kernel_config()
IRQ_IN_PROCESS_TIME = _CONFIG is None or not (
    {"CONFIG_IRQ_TIME_ACCOUNTING", "CONFIG_VIRT_CPU_ACCOUNTING_GEN"} & set(_CONFIG))


def thread_switches(pid):
    """{tid: (sleeps, preemptions)} of the process's live threads: the
    kernel's voluntary and involuntary context switches of each
    (kit.proc_status); {} when it is gone."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        st = kit.proc_status(f"{pid}/task/{tid}")      # None: it ended meanwhile
        if st and "voluntary_ctxt_switches" in st and "nonvoluntary_ctxt_switches" in st:
            out[int(tid)] = (st["voluntary_ctxt_switches"], st["nonvoluntary_ctxt_switches"])
    return out


def machine_cpu():
    """CPU seconds of the whole machine since boot: (process time (user, nice,
    system), interrupts (irq, softirq: loopback TCP is processed there), steal,
    total)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]] + [0] * 8
    proc = v[0] + v[1] + v[2]
    return proc / CLK, (v[5] + v[6]) / CLK, v[7] / CLK, sum(v[:8]) / CLK


# ------------------------------------------------------------------ the stack

class Stack(kit.Stack):
    """make bench's stack: 2 instances at LOG_LEVEL=warn, a durable Postgres
    with room for pgbench's clients, a new user per request."""

    def __init__(self, run_dir, bin_path, threads, max_conn):
        super().__init__(run_dir, {
            "INSTANCES": 2, "PG_DURABLE": 1, "LOG_LEVEL": "warn", "PG_MAX_CONNECTIONS": max_conn,
            "DEMO_RANDOM_USER": 0, "SECKILL_STOCK": "optimistic", "SECKILL_BIN": bin_path,
            "THREADS": threads or None}, log=log)

    def app_pids(self):
        return [self.pid(f"app-{i}") for i in (1, 2)]

    def rss(self):
        out = []
        for i, pid in enumerate(self.app_pids(), 1):
            st = kit.proc_status(pid) if pid else None
            if st is None:
                raise BenchError(f"instance seckill-{i} (pid {pid}) is gone: it crashed or was killed"
                                 f" (see {self.run_dir}/logs/app-{i}.log)")
            out.append({"instance": f"seckill-{i}", "pid": pid, "rssKb": st.get("VmRSS"),
                        "hwmKb": st.get("VmHWM"), "threads": st.get("Threads")})
        return out


class CpuMeter:
    """CPU seconds per component between start() and stop()."""

    def __init__(self, groups):
        self.groups = groups        # {name: [root pids]} (children are included)

    def _sample(self):
        stats = {}
        for pid in all_pids():
            s = proc_stat(pid)
            if s:
                stats[pid] = s
        children = {}
        for pid, (ppid, _, _) in stats.items():
            children.setdefault(ppid, []).append(pid)
        out, switches = {}, {}
        for name, roots in self.groups.items():
            total = 0.0
            seen = set()
            todo = [p for p in roots if p]
            for r in list(todo):
                if r in stats:
                    total += stats[r][2]          # reaped children (e.g. pgbench backends)
            while todo:
                p = todo.pop()
                if p in seen or p not in stats:
                    continue
                seen.add(p)
                total += stats[p][1]
                todo.extend(children.get(p, []))
            out[name] = total
            switches[name] = {}
            for p in seen:
                switches[name].update(thread_switches(p))
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        out["loadTool"] = ru.ru_utime + ru.ru_stime
        # Every process's time, its reaped children's included: a process
        # that ends between two samples moves its time to its parent's
        # children's time, so the sum keeps it.
        everyone = sum(own + reaped for _, own, reaped in stats.values())
        return out, machine_cpu(), everyone, switches

    def start(self):
        self.t0 = time.monotonic()
        self.s0 = self._sample()

    def stop(self):
        s1 = self._sample()
        wall = time.monotonic() - self.t0
        (a, m0, e0, w0), (c, m1, e1, w1) = self.s0, s1
        out = {k: round(c[k] - a.get(k, 0.0), 2) for k in c}
        # Thread switches of each measured group's threads that lived
        # through the run (one that ended took its count with it).
        out["switches"] = {}
        for k, now in w1.items():
            both = [(now[t], w0[k][t]) for t in now if t in w0.get(k, {})]
            out["switches"][k] = {"sleeps": sum(after[0] - before[0] for after, before in both),
                                  "preempted": sum(after[1] - before[1] for after, before in both)}
        procs = m1[0] - m0[0]
        irq = m1[1] - m0[1]
        # Where the kernel counts interrupt work (loopback TCP's softirq)
        # done while a process runs twice, in that process's time and in the
        # machine's softirq time (IRQ_IN_PROCESS_TIME), 'interrupts' keeps
        # only the rest, so that the columns add up to the machine's busy
        # time; 'interruptsAll' is the machine's own figure. The estimate is
        # every process's time less the machine's process time: a process
        # that is reaped while /proc is read, or that this process cannot
        # see (another PID namespace), moves it, hence the bounds.
        out["interruptsInProcesses"] = round((e1 - e0) - procs, 2)   # the raw estimate
        in_procs = min(irq, max(0.0, (e1 - e0) - procs)) if IRQ_IN_PROCESS_TIME else 0.0
        out["interrupts"] = round(irq - in_procs, 2)
        out["interruptsAll"] = round(irq, 2)
        out["steal"] = round(m1[2] - m0[2], 2)
        # Process time of everything not measured here: other programs on the
        # machine (noise), kernel threads.
        out["other"] = round((e1 - e0) - sum(c[k] - a.get(k, 0.0) for k in c), 2)
        busy = procs + irq
        out["machineBusy"] = round(busy, 2)
        out["wallSeconds"] = round(wall, 2)
        out["busyPct"] = round(100.0 * busy / (wall * os.cpu_count()), 1) if wall > 0 else None
        out["stealPct"] = round(100.0 * (m1[2] - m0[2]) / (m1[3] - m0[3]), 1) if m1[3] > m0[3] else None
        # What no one used: idle and I/O wait.
        idle = (m1[3] - m0[3]) - busy - (m1[2] - m0[2])
        out["idlePct"] = round(max(0.0, 100.0 * idle / (m1[3] - m0[3])), 1) if m1[3] > m0[3] else None
        return out


# ------------------------------------------------------------------ bench

def stop_children(procs):
    """SIGTERM to each of our child processes (Popen), then each reaped;
    one still running after 10 s is killed."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class Bench:
    def __init__(self):
        self.t_start = time.monotonic()
        self.run_dir = os.environ.get("BENCH_RUN_DIR") or os.path.join(ROOT, "build", "bench-run")
        self.json_path = os.environ.get("BENCH_JSON") or os.path.join(ROOT, "build", "bench.json")
        self.seconds = env_int("BENCH_SECONDS", 6)
        self.warmup = env_int("BENCH_WARMUP", 2)
        self.repeat = max(1, env_int("BENCH_REPEAT", 1))
        self.long = env_int("BENCH_LONG", 1) == 1
        self.long_seconds = env_int("BENCH_LONG_SECONDS", 60)
        self.long_conns = env_int("BENCH_LONG_CONNECTIONS", 256)
        self.sale_conns = env_int("BENCH_SALE_CONNECTIONS", 64)
        self.low_conns = env_int("BENCH_LOW_CONNECTIONS", 16)
        self.batch_conns = env_list("BENCH_BATCH_CONNECTIONS", [16, 64, 256])
        self.threads = env_int("BENCH_THREADS", 0)
        self.batch_threads = env_int("BENCH_BATCH_THREADS", 8)
        self.redis_threads = redis_threads()
        self.skip = {s.strip() for s in os.environ.get("BENCH_SKIP", "").split(",") if s.strip()}
        self.keep = os.environ.get("BENCH_KEEP") == "1"
        self.bin = os.environ.get("SECKILL_BIN") or os.path.join(ROOT, "build", "seckill")
        self.bin = os.path.abspath(self.bin)
        self.pg_clients = 16
        threads_max = max(self.threads or 8, self.batch_threads, self.redis_threads)
        self.max_conn = max(100, 2 * (threads_max + 4) + self.pg_clients + 40)
        self.stack = Stack(self.run_dir, self.bin, self.threads, self.max_conn)
        self.ceiling_nginx_pid = None
        self.stand_ins = []         # build/upstream200 processes behind the second ceiling nginx
        self.replica = None         # the Redis replica of the WAIT sale (a Popen)
        self.pace_ms = 20           # set from the nginx ceiling when it is measured
        self.ceiling_dir = os.path.join(self.run_dir, "ceiling-nginx")
        self.tmp = None
        self.user_block = 0
        self.violations = []
        self.invariant_runs = []
        self.rounds = []               # one dict of figures per round
        self.longs = []                # the long sale (one per run; several with --median)
        self.runs = 1                  # runs summarized (--median: the files)
        self.res = {}

    # -------------------------------------------------------------- helpers

    def next_user_base(self):
        self.user_block += 1
        return 1_000_000_000_000 + self.user_block * 10_000_000_000

    def psql(self, sql):
        return kit.psql(self.stack.dsn, sql, timeout=120)

    def quiesce(self):
        """Before each measured run: no dead row versions, a fresh checkpoint.
        tb_voucher_order too: the seckill-transaction ceiling deletes the orders
        it made, and their dead index entries would cost the next sale's
        unique-index checks (the first round's sale paid twice the Postgres
        CPU per order of the later rounds)."""
        self.psql("VACUUM tb_voucher; VACUUM tb_voucher_order; CHECKPOINT;")

    def buy(self, voucher, user):
        return kit.call(self.stack.base_url, "POST", f"/voucher/{voucher}/seckill",
                        headers={"X-User-Id": str(user)}, timeout=10).status

    def wrk(self, url, conns, seconds, ids=False, timeout_s="10s", delay_ms=0):
        w = kit.run_wrk(url, conns, seconds, self.tmp, self.next_user_base(), timeout=timeout_s,
                        ids=ids, delay_ms=delay_ms)
        ms = {f"{k}Ms": round(w[f"{k}Ms"], 3) for k in ("p50", "p90", "p99", "max")}
        r = {"tool": (f"WRK_DELAY_MS={delay_ms} " if delay_ms else "")
                     + " ".join(w["cmd"][:-3] + ["loadtest/wrk_sale.lua", url]),
             "requests": w["requests"], "seconds": round(w["seconds"], 3), "rps": round(w["rps"], 1),
             **ms, "statuses": w["statuses"], "socketErrors": w["socketErrors"],
             "nonHttpErrors": w["nonHttpErrors"]}
        if ids:
            r["idsFile"] = w["idsFile"]
        return r

    def paced(self, url, delay_ms=None):
        """wrk at delay_ms (default self.pace_ms), and the share of the
        machine the hypervisor took meanwhile (steal): on a shared VM a p99
        of a few ms is mostly that. Returns (wrk's result, the summary kept
        in the JSON)."""
        m0 = machine_cpu()
        p = self.wrk(url, 64, self.seconds, delay_ms=delay_ms or self.pace_ms)
        m1 = machine_cpu()
        total = m1[3] - m0[3]
        p["stealPct"] = round(100.0 * (m1[2] - m0[2]) / total, 1) if total > 0 else None
        return p, {k: p[k] for k in ("rps", "p50Ms", "p90Ms", "p99Ms", "maxMs", "stealPct", "tool")}

    def check(self, what, voucher, ids=None, ok=None, unknown=0, expect=None):
        rc, lines, error = check_invariants.verify(self.stack.dsn, [voucher], ids, expect, ok, unknown)
        out = "\n".join(lines + [error] if error else lines)
        passed = rc == 0
        self.invariant_runs.append({"run": what, "voucherId": voucher, "ok": passed,
                                    "output": out.splitlines()[-12:]})
        if not passed:
            self.violations.append(f"{what} (voucher {voucher}):\n{out}")
            log(f"INVARIANT VIOLATION in {what} (voucher {voucher}):")
            for line in out.splitlines():
                log("    " + line)
        else:
            log(f"{what}: invariants hold (voucher {voucher})")
        return passed

    def cpu_meter(self):
        groups = {"seckill": self.stack.app_pids(), "nginx": [self.stack.pid("nginx")],
                  "postgres": [self.stack.pid("postgres")],
                  "redis": [self.stack.pid("redis")] + ([self.replica.pid] if self.replica else [])}
        if self.ceiling_nginx_pid:
            groups["ceilingNginx"] = [self.ceiling_nginx_pid]
        if self.stand_ins:
            groups["standIn"] = [p.pid for p in self.stand_ins]
        return CpuMeter(groups)

    def order_span(self, voucher):
        rows = self.psql(f"""SELECT count(*), coalesce(extract(epoch FROM max(create_time) - min(create_time)), 0)
                               FROM tb_voucher_order WHERE voucher_id = {int(voucher)};""")
        n, span = int(rows[0][0]), float(rows[0][1])
        return n, span

    # -------------------------------------------------------------- ceilings

    def pgbench(self, script, seconds, defines):
        path = os.path.join(self.tmp, "pgbench.sql")
        with open(path, "w") as f:
            f.write(script)
        v = self.stack.info
        cmd = ["pgbench", "-n", "-c", str(self.pg_clients), "-j", "2", "-T", str(seconds),
               "-M", "prepared", "-h", "127.0.0.1", "-p", v["PG_PORT"], "-U", "postgres"]
        for k, val in defines.items():
            cmd += ["-D", f"{k}={val}"]
        cmd += ["-f", path, "seckill"]
        p = run(cmd, seconds + 60)
        out = p.stdout + p.stderr
        m = re.search(r"^tps = ([\d.]+)", out, re.M)
        lat = re.search(r"^latency average = ([\d.]+) ms", out, re.M)
        n = re.search(r"^number of transactions actually processed: (\d+)", out, re.M)
        failed = re.search(r"^number of failed transactions: (\d+)", out, re.M)
        if not m:
            raise BenchError(f"pgbench printed no tps:\n{out[-800:]}")
        if failed and int(failed.group(1)) > 0:
            raise BenchError(f"pgbench: {failed.group(1)} transactions failed:\n{out[-800:]}")
        return {"tps": round(float(m.group(1)), 1),
                "latencyAvgMs": float(lat.group(1)) if lat else None,
                "transactions": int(n.group(1)) if n else None,
                "tool": " ".join(cmd[:13]) + " -f <script> seckill"}

    def bench_voucher_sql(self, title):
        rows = self.psql(f"""INSERT INTO tb_voucher (title, stock, initial_stock, begin_time, end_time)
            VALUES ('{title}', 1000000000000, 1000000000000, now() - interval '1 minute',
                    now() + interval '1 day') RETURNING voucher_id;""")
        return int(rows[0][0])

    def ceiling_pg_one_row(self):
        script = ("-- one-row autocommit decrement (the service's UPDATE, nothing else)\n"
                  "UPDATE tb_voucher SET stock = stock - 1 WHERE voucher_id = :v AND stock > 0;\n")
        v = self.bench_voucher_sql("bench: pgbench one-row")
        try:
            self.quiesce()
            self.pgbench(script, self.warmup, {"v": v})
            self.quiesce()
            meter = self.cpu_meter()
            meter.start()
            r = self.pgbench(script, self.seconds, {"v": v})
            r["cpu"] = meter.stop()
        finally:
            self.psql(f"DELETE FROM tb_voucher WHERE voucher_id = {v};")
        r["script"] = script.splitlines()[1]
        r["clients"] = self.pg_clients
        log(f"pgbench one-row: {r['tps']:.0f} tps")
        return r

    def ceiling_pg_txn(self):
        script = (
            "-- the seckill transaction, a new user and order id per transaction\n"
            "\\set n :n + 1\n"
            "\\set u :base + :client_id * 100000000 + :n\n"
            "BEGIN;\n"
            "SELECT 1 FROM tb_voucher_order WHERE user_id = :u AND voucher_id = :v;\n"
            "UPDATE tb_voucher SET stock = stock - 1 WHERE voucher_id = :v AND stock > 0;\n"
            "INSERT INTO tb_voucher_order (id, user_id, voucher_id) VALUES (:u, :u, :v);\n"
            "COMMIT;\n")
        v = self.bench_voucher_sql("bench: pgbench seckill transaction")
        base = 8_000_000_000_000_000_000
        try:
            self.quiesce()
            self.pgbench(script, self.warmup, {"v": v, "n": 0, "base": base})
            self.quiesce()
            meter = self.cpu_meter()
            meter.start()
            r = self.pgbench(script, self.seconds, {"v": v, "n": 0, "base": base + 10_000_000_000})
            r["cpu"] = meter.stop()
        finally:
            self.psql(f"DELETE FROM tb_voucher_order WHERE voucher_id = {v};"
                      f" DELETE FROM tb_voucher WHERE voucher_id = {v};")
            self.psql("VACUUM ANALYZE tb_voucher; VACUUM ANALYZE tb_voucher_order;")
        r["script"] = "BEGIN; SELECT (duplicate check); UPDATE ... stock > 0; INSERT order; COMMIT"
        r["clients"] = self.pg_clients
        log(f"pgbench seckill transaction: {r['tps']:.0f} tps")
        return r

    def redis_bench(self, sha, port, n):
        cmd = ["redis-benchmark", "-h", "127.0.0.1", "-p", port, "--dbnum", "9", "-c", "50",
               "-n", str(n), "-r", "100000000", "--csv", "EVALSHA", sha, "2",
               "lock:bench:__rand_int__", "redisson_lock_token:{lock:bench:__rand_int__}",
               "30000", "bench-owner:1"]
        p = run(cmd, 120)
        row = None
        for line in p.stdout.splitlines():
            if line.startswith('"EVALSHA'):
                row = next(__import__("csv").reader([line]))
        if not row:
            raise BenchError(f"redis-benchmark printed no EVALSHA line:\n{p.stdout[-500:]}{p.stderr[-500:]}")
        return {"opsPerSec": float(row[1]), "p50Ms": float(row[4]), "p99Ms": float(row[6]),
                "requests": n, "tool": " ".join(cmd[:12]) + " EVALSHA <sha> 2 lock:bench:__rand_int__"
                " redisson_lock_token:{lock:bench:__rand_int__} 30000 bench-owner:1"}

    def ceiling_redis(self):
        port = self.stack.info["REDIS_PORT"]
        with open(os.path.join(ROOT, "lua", "lock_acquire.lua")) as f:
            body = f.read()
        sha = run(["redis-cli", "-h", "127.0.0.1", "-p", port, "SCRIPT", "LOAD", body], 10).stdout.strip()
        try:
            # A short run to size the measured one: about BENCH_SECONDS long.
            probe = self.redis_bench(sha, port, 20000)
            n = int(min(max(probe["opsPerSec"] * self.seconds, 50000), 2000000))
            meter = self.cpu_meter()
            meter.start()
            r = self.redis_bench(sha, port, n)
            r["cpu"] = meter.stop()
        finally:
            run(["redis-cli", "-h", "127.0.0.1", "-p", port, "-n", "9", "FLUSHDB"], 60, check=False)
        r["clients"] = 50
        r["script"] = "lua/lock_acquire.lua (KEYS: lock key, redisson_lock_token:{key}; ARGV: lease ms, owner)"
        log(f"redis-benchmark EVALSHA lock_acquire: {r['opsPerSec']:.0f} ops/s")
        return r

    def start_stand_ins(self):
        """Two build/upstream200 processes (IO_THREADS threads each, as an
        instance has): separate upstreams that do no work."""
        binary = os.environ.get("BENCH_UPSTREAM200") or os.path.join(ROOT, "build", "upstream200")
        if not os.access(binary, os.X_OK):
            raise BenchError(f"{binary} is missing (make bench builds it: make build/upstream200)")
        threads = os.environ.get("IO_THREADS") or "2"
        ports = kit.free_ports(2)
        for port in ports:
            with open(os.path.join(self.ceiling_dir, f"upstream200-{port}.log"), "w") as err:
                self.stand_ins.append(subprocess.Popen([binary, str(port), threads],
                                                       stdin=subprocess.DEVNULL, stderr=err))
        for port in ports:
            if not kit.wait_port(port, 5):
                raise BenchError(f"upstream200 on port {port} did not start")
        return ports

    def start_ceiling_nginx(self, separate=False):
        """nginx from nginx/nginx.conf.tmpl in front of a stand-in upstream:
        a server block in the same nginx, or (separate) two upstream200
        processes. Returns the port wrk talks to."""
        d = self.ceiling_dir
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        front, up, bare = kit.free_ports(3)
        self.bare_port = bare
        ups = self.start_stand_ins() if separate else [up]
        # The stand-in upstream: a second server in the same nginx, answering
        # at once with a body the size of the service's sold-out answer.
        stand_in = "" if separate else f"""
    # make bench: the stand-in for the instances, answers 200 at once.
    server {{
        listen 127.0.0.1:{up} backlog=4096;
        access_log off;
        keepalive_requests 100000;
        location / {{
            default_type application/json;
            return 200 '{{"error":"sold_out","message":"voucher is sold out"}}\\n';
        }}
    }}
    # make bench: nginx alone, 'return 200' with the front's http settings
    # (its access log included) and its X-Request-Id.
    server {{
        listen 127.0.0.1:{bare} backlog=4096;
        location / {{
            default_type application/json;
            add_header X-Request-Id $seckill_request_id always;
            return 200 '{{"error":"sold_out","message":"sold out"}}';
        }}
    }}
"""
        self.ceiling_nginx_pid = kit.start_nginx(d, front, [f"127.0.0.1:{u}" for u in ups], stand_in)
        return front

    def stop_ceiling_nginx(self):
        stop_children(self.stand_ins)
        self.stand_ins = []
        pid = self.ceiling_nginx_pid
        if not pid:
            return
        self.ceiling_nginx_pid = None
        gone = kit.stop_pid(pid, signal.SIGQUIT, 10, cmdline_has=self.ceiling_dir)
        if gone is None:
            log(f"pid {pid} is no longer the ceiling nginx: left alone")
        elif not gone:
            os.kill(pid, signal.SIGKILL)

    def ceiling_nginx(self, separate=False):
        try:
            port = self.start_ceiling_nginx(separate)
            url = f"http://127.0.0.1:{port}/voucher/1/seckill"
            self.wrk(url, 64, self.warmup)
            meter = self.cpu_meter()
            meter.start()
            r = self.wrk(url, 64, self.seconds)
            r["cpu"] = meter.stop()
            # The same connections paced to a quarter of that rate: latency
            # without a saturated queue (the sold-out path is read the same
            # way, at the same pace).
            if not separate:
                self.pace_ms = max(1, round(64 * 1000.0 / (PACED_SHARE * r["rps"]))) if r["rps"] else 20
            _, r["paced"] = self.paced(url)
        finally:
            self.stop_ceiling_nginx()
        bad = sum(v for k, v in r["statuses"].items() if k != "200")
        if bad:
            raise BenchError(f"the ceiling nginx answered {bad} requests with another status than 200: {r['statuses']}")
        r["connections"] = 64
        if separate:
            r["upstream"] = ("two build/upstream200 processes (loadtest/upstream200.c, IO_THREADS threads each),"
                             " upstream keepalive as nginx/nginx.conf.tmpl")
            log(f"wrk nginx -> 2 upstream200 processes: {r['rps']:.0f} req/s")
        else:
            r["upstream"] = "a second server block in the same nginx (return 200), upstream keepalive as nginx/nginx.conf.tmpl"
            log(f"wrk nginx -> keep-alive upstream: {r['rps']:.0f} req/s")
        return r

    def half_pace(self, rps, conns=64):
        """wrk's mean wait between answer and request on each of conns
        connections that offers about HALF of rps."""
        return max(1, round(conns * 1000.0 / (HALF * rps))) if rps else 20

    def ceiling_bare(self):
        """nginx alone: 'return 200' from a server block of the ceiling
        nginx, saturated, then paced to half that rate."""
        try:
            self.start_ceiling_nginx()
            url = f"http://127.0.0.1:{self.bare_port}/voucher/1/seckill"
            self.wrk(url, 64, self.warmup)
            meter = self.cpu_meter()
            meter.start()
            r = self.wrk(url, 64, self.seconds)
            r["cpu"] = meter.stop()
            r["pacedHalfDelayMs"] = self.half_pace(r["rps"])
            _, r["pacedHalf"] = self.paced(url, r["pacedHalfDelayMs"])
        finally:
            self.stop_ceiling_nginx()
        bad = sum(v for k, v in r["statuses"].items() if k != "200")
        if bad:
            raise BenchError(f"the bare nginx answered {bad} requests with another status than 200: {r['statuses']}")
        r["connections"] = 64
        r["server"] = "a server block of the ceiling nginx: return 200 (access log and X-Request-Id as the front's)"
        log(f"wrk nginx bare return 200: {r['rps']:.0f} req/s, p99 {r['p99Ms']} ms; paced"
            f" ({r['pacedHalfDelayMs']} ms) {r['pacedHalf']['rps']:.0f} req/s, p99 {r['pacedHalf']['p99Ms']} ms")
        return r

    # -------------------------------------------------------------- service

    def instances_sold_out(self):
        """The instances' own count of sold_out answers (GET /stats on each,
        directly: not through nginx)."""
        n = 0
        for url in self.stack.instance_urls:
            r = kit.call(url, "GET", "/stats", timeout=10)
            n += int(((r.body or {}).get("requests") or {}).get("byError", {}).get("sold_out", 0))
        return n

    def edge_hits(self, offset, voucher):
        """Requests for voucher after offset that nginx's sold-out edge
        answered (edge=hit in the access log), and all of them."""
        if offset is None:
            return None, None
        self.settle()
        text, entries = kit.access_log(self.stack.info["NGINX_ACCESS_LOG"], offset,
                                       f"/voucher/{voucher}/seckill")
        hits = sum(1 for line in text.splitlines()
                   if f" /voucher/{voucher}/seckill " in line and " edge=hit" in line)
        return hits, len(entries)

    def log_offset(self):
        try:
            return os.path.getsize(self.stack.info["NGINX_ACCESS_LOG"])
        except (OSError, KeyError):
            return None

    def settle(self):
        """After a load: until nginx's access log stops growing (the requests
        still in flight when the tool stopped end, as 499 or late answers;
        nginx writes its buffered lines at least once a second)."""
        last, stable, t0 = self.log_offset(), 0, time.monotonic()
        while stable < 15 and time.monotonic() - t0 < 8:
            time.sleep(0.1)
            cur = self.log_offset()
            stable = stable + 1 if cur == last else 0
            last = cur

    def logged(self, offset, voucher):
        """Statuses nginx logged for POST /voucher/V/seckill after offset."""
        out = {}
        if offset is None:
            return None
        self.settle()
        for e in kit.access_log(self.stack.info["NGINX_ACCESS_LOG"], offset,
                                f"/voucher/{voucher}/seckill")[1]:
            if e.method == "POST":
                out[e.status] = out.get(e.status, 0) + 1
        return out

    def unknown(self, w, logged, conns):
        """Requests whose outcome the client never learnt: answers other than
        200/409, and the requests in flight when wrk stopped (nginx logs them
        499, or answered after wrk stopped reading). Each may have bought."""
        other = sum(v for k, v in w["statuses"].items() if k not in ("200", "409"))
        errors = w["socketErrors"]["read"] + w["socketErrors"]["timeout"]
        if logged is None:
            return other + errors + conns
        return other + errors + max(0, sum(logged.values()) - sum(w["statuses"].values()))

    def batch_counts(self):
        """(group commits, buyers in them) the instances settled so far, from
        their /metrics. Its counters come from a snapshot at most
        STATS_INTERVAL_MS (1 s) old: read a second after the last activity."""
        time.sleep(1.1)
        n = [0, 0]
        for url in self.stack.instance_urls:
            for line in str(kit.call(url, "GET", "/metrics", want=200, timeout=10).body).splitlines():
                k, _, v = line.partition(" ")
                if k in ("seckill_batches_total", "seckill_batch_buyers_total"):
                    n[k == "seckill_batch_buyers_total"] += int(float(v))
        return n

    def sale(self, what, conns, seconds, stock=10_000_000, warm=True, batches=False):
        """A sale to distinct users on a stock that does not run out; batches:
        also the buyers per group commit during it (SECKILL_STOCK=batched)."""
        if warm and self.warmup > 0:
            wv = self.stack.create_voucher(20000, f"bench: {what} warm-up")
            off = self.log_offset()
            w = self.wrk(f"{self.stack.base_url}/voucher/{wv}/seckill", conns, self.warmup, ids=True)
            self.check(f"{what} warm-up", wv, ids=w["idsFile"], ok=w["statuses"].get("200", 0),
                       unknown=self.unknown(w, self.logged(off, wv), conns))
        v = self.stack.create_voucher(stock, f"bench: {what}")
        self.quiesce()
        b0 = self.batch_counts() if batches else None
        off = self.log_offset()
        meter = self.cpu_meter()
        meter.start()
        w = self.wrk(f"{self.stack.base_url}/voucher/{v}/seckill", conns, seconds, ids=True)
        cpu = meter.stop()
        w["nginxLogged"] = self.logged(off, v)
        b1 = self.batch_counts() if batches else None
        n, span = self.order_span(v)
        unknown = self.unknown(w, w["nginxLogged"], conns)
        w["unknownOutcome"] = unknown
        self.check(what, v, ids=w["idsFile"], ok=w["statuses"].get("200", 0), unknown=unknown)
        w.pop("idsFile", None)
        rate = (n - 1) / span if n > 1 and span > 0 else 0.0
        r = {"voucherId": v, "stock": stock, "connections": conns, "orders": n,
             "orderSpanSeconds": round(span, 3), "ordersPerSec": round(rate, 1),
             "soldOut": n >= stock, "wrk": w, "cpu": cpu,
             "buyersPerBatch": round((b1[1] - b0[1]) / (b1[0] - b0[0]), 1) if b1 and b1[0] > b0[0] else None,
             "cpuMsPerOrder": {k: round(1000.0 * cpu[k] / n, 3) for k in
                               ("seckill", "nginx", "postgres", "redis", "loadTool", "interrupts", "other")} if n else None}
        if n >= stock or span < 5:
            log(f"warning: {what}: the stock lasted {span:.1f}s (< 5 s or sold out): raise the stock or BENCH_SECONDS")
        log(f"{what}: {n} orders in {span:.2f}s = {rate:.0f} orders/s (wrk {w['rps']:.0f} req/s,"
            f" p50 {w['p50Ms']} ms, p99 {w['p99Ms']} ms)")
        return r

    def sold_out(self):
        v = self.stack.create_voucher(1, "bench: sold out")
        off = self.log_offset()
        st = self.buy(v, 42)
        if st != 200:
            raise BenchError(f"buying the only unit of voucher {v} answered {st}")
        url = f"{self.stack.base_url}/voucher/{v}/seckill"
        w0 = self.wrk(url, 64, max(1, self.warmup))
        inst0, off_run = self.instances_sold_out(), self.log_offset()
        meter = self.cpu_meter()
        meter.start()
        w = self.wrk(url, 64, self.seconds)
        w["cpu"] = meter.stop()
        # What reached the instances meanwhile, and what nginx answered itself.
        w["instanceSoldOut"] = self.instances_sold_out() - inst0
        w["edgeHits"], w["logged"] = self.edge_hits(off_run, v)
        wall = w["cpu"]["wallSeconds"]
        w["seckillCpuPct"] = round(100.0 * w["cpu"]["seckill"] / wall, 2) if wall else None
        w["pacedHalfDelayMs"] = self.half_pace(w["rps"])
        p, w["pacedHalf"] = self.paced(url, w["pacedHalfDelayMs"])
        logged = self.logged(off, v)
        both = {"statuses": {k: w0["statuses"].get(k, 0) + w["statuses"].get(k, 0) + p["statuses"].get(k, 0)
                             for k in set(w0["statuses"]) | set(w["statuses"]) | set(p["statuses"])},
                "socketErrors": {k: w0["socketErrors"][k] + w["socketErrors"][k] + p["socketErrors"][k]
                                 for k in w["socketErrors"]}}
        if logged is not None:
            logged["200"] = logged.get("200", 0) - 1       # the one bought before
            logged = {k: c for k, c in logged.items() if c > 0}
        self.check("sold-out", v, ok=1 + both["statuses"].get("200", 0),
                   unknown=self.unknown(both, logged, 64), expect=1)
        w["voucherId"] = v
        w["connections"] = 64
        w["non409"] = sum(c for k, c in w["statuses"].items() if k != "409")
        log(f"sold-out: {w['rps']:.0f} req/s, p50 {w['p50Ms']} ms, p99 {w['p99Ms']} ms; nginx answered"
            f" {w['edgeHits']} of {w['logged']}, the instances {w['instanceSoldOut']} (their CPU"
            f" {w['seckillCpuPct']} % of one); paced ({w['pacedHalfDelayMs']} ms between requests)"
            f" {p['rps']:.0f} req/s, p50 {p['p50Ms']} ms, p99 {p['p99Ms']} ms")
        return w

    def sold_out_no_edge(self, v):
        """The same sold-out voucher through a second nginx from the template
        with --edge off, in front of the same instances: every request makes
        the hop to an instance (what the edge saves)."""
        d = os.path.join(self.run_dir, "noedge-nginx")
        shutil.rmtree(d, ignore_errors=True)
        port = kit.free_ports(1)[0]
        ups = [u.split("//", 1)[-1] for u in self.stack.instance_urls]
        pid = kit.start_nginx(d, port, ups, gen_args=["--edge", "off"])
        try:
            url = f"http://127.0.0.1:{port}/voucher/{v}/seckill"
            self.wrk(url, 64, max(1, self.warmup))
            inst0 = self.instances_sold_out()
            meter = self.cpu_meter()
            meter.groups["ceilingNginx"] = [pid]
            meter.start()
            r = self.wrk(url, 64, self.seconds)
            cpu = meter.stop()
            r["instanceSoldOut"] = self.instances_sold_out() - inst0
        finally:
            gone = kit.stop_pid(pid, signal.SIGQUIT, 10, cmdline_has=d)
            if gone is False:
                os.kill(pid, signal.SIGKILL)
        r["cpu"] = cpu
        wall = cpu["wallSeconds"]
        r["seckillCpuPct"] = round(100.0 * cpu["seckill"] / wall, 2) if wall else None
        r["connections"] = 64
        bad = sum(c for k, c in r["statuses"].items() if k != "409")
        if bad:
            raise BenchError(f"sold-out without the edge: {bad} answers other than 409: {r['statuses']}")
        log(f"sold-out without the edge: {r['rps']:.0f} req/s, p50 {r['p50Ms']} ms, p99 {r['p99Ms']} ms;"
            f" the instances answered {r['instanceSoldOut']} (their CPU {r['seckillCpuPct']} % of one)")
        return r

    def ab(self, url, n, conns, user):
        cmd = ["ab", "-k", "-l", "-r", "-s", "30", "-n", str(n), "-c", str(conns), "-m", "POST",
               "-H", f"X-User-Id: {user}", url]
        r = {"tool": " ".join(cmd), **kit.parse_ab(run(cmd, 300).stdout)}
        r["ok200"] = r["requests"] - r["non2xx"] - r["failed"]
        return r

    def storm(self):
        v = self.stack.create_voucher(100, "bench: single-user storm")
        url = f"{self.stack.base_url}/voucher/{v}/seckill"
        user = 7_000_000_000 + self.user_block
        probe = self.ab(url, 2000, 64, user)
        n = int(min(max((probe["rps"] or 1000) * self.seconds, 5000), 200000))
        meter = self.cpu_meter()
        meter.start()
        r = self.ab(url, n, 64, user)
        r["cpu"] = meter.stop()
        ok = probe["ok200"] + r["ok200"]
        self.check("storm", v, ok=ok, unknown=probe["failed"] + r["failed"], expect=1)
        r["voucherId"] = v
        r["user"] = user
        r["connections"] = 64
        log(f"storm: {r['rps']:.0f} req/s, {ok} order(s)")
        return r

    # -------------------------------------------------------------- the run

    def machine(self):
        def ver(cmd, pat=None):
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
                t = (p.stdout + p.stderr).strip()
            except (OSError, subprocess.TimeoutExpired):
                return None
            if pat:
                m = re.search(pat, t)
                return m.group(1) if m else t.splitlines()[0] if t else None
            return t.splitlines()[0] if t else None
        mem = None
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem = int(line.split()[1])
        cpu = None
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        git = ver(["git", "-C", ROOT, "describe", "--always", "--dirty"])
        c0 = machine_cpu()
        time.sleep(1.0)
        c1 = machine_cpu()
        b0, t0 = c0[0] + c0[1], c0[3]
        b1, t1 = c1[0] + c1[1], c1[3]
        return {
            "nproc": os.cpu_count(), "memTotalMb": round(mem / 1024) if mem else None,
            "cpu": cpu, "kernel": platform.release(), "os": ver(["sh", "-c", ". /etc/os-release; echo $PRETTY_NAME"]),
            "busyPctBefore": round(100.0 * (b1 - b0) / (t1 - t0), 1) if t1 > t0 else None,
            "loadavgBefore": os.getloadavg(),
            "versions": {
                "postgres": ver(["psql", "-X", "-A", "-t", "-d", self.stack.dsn, "-c", "SHOW server_version"]),
                "pgbench": ver(["pgbench", "--version"], r"(\d+\.\d+)"),
                "redis": ver(["redis-server", "--version"], r"v=(\S+)"),
                "nginx": ver([shutil.which("nginx") or "/usr/sbin/nginx", "-v"], r"nginx/(\S+)"),
                "wrk": ver(["wrk", "-v"], r"wrk (\S+)"),
                "ab": ver(["ab", "-V"], r"Version (\S+)"),
                "seckill": git,
            },
            "postgres": dict(zip(
                ["fsync", "synchronous_commit", "full_page_writes", "wal_sync_method", "max_connections",
                 "shared_buffers"],
                self.psql("SELECT current_setting('fsync'), current_setting('synchronous_commit'),"
                          " current_setting('full_page_writes'), current_setting('wal_sync_method'),"
                          " current_setting('max_connections'), current_setting('shared_buffers');")[0])),
        }

    def one_round(self, i):
        fig = {}
        if "ceilings" not in self.skip:
            log(f"round {i}: ceilings")
            fig["pgOneRow"] = self.ceiling_pg_one_row()
            fig["pgTxn"] = self.ceiling_pg_txn()
            fig["redisEvalsha"] = self.ceiling_redis()
            fig["nginx"] = self.ceiling_nginx()
            fig["nginxProc"] = self.ceiling_nginx(separate=True)
            fig["nginxBare"] = self.ceiling_bare()
        if "optimistic" not in self.skip:
            if self.strategy != "optimistic":
                self.switch("optimistic")
            log(f"round {i}: the service, SECKILL_STOCK=optimistic")
            fig["rssBefore"] = self.stack.rss()
            fig["sale"] = self.sale("sale (optimistic)", self.sale_conns, self.seconds)
            if "soldout" not in self.skip:
                fig["soldOut"] = self.sold_out()
                if "noedge" not in self.skip:
                    fig["soldOutNoEdge"] = self.sold_out_no_edge(fig["soldOut"]["voucherId"])
            if "storm" not in self.skip:
                fig["storm"] = self.storm()
            if "low" not in self.skip and self.low_conns > 0:
                fig["saleLow"] = self.sale(f"sale (optimistic, {self.low_conns} c)", self.low_conns,
                                           self.seconds)
            fig["rssAfter"] = self.stack.rss()
        if "batched" not in self.skip:
            self.switch("batched")
            log(f"round {i}: the service, SECKILL_STOCK=batched THREADS={self.batch_threads}")
            fig["batchedRssBefore"] = self.stack.rss()
            for c in self.batch_conns:
                fig[f"batchedSale{c}"] = self.sale(f"sale (batched, {c} c)", c, self.seconds, batches=True)
            fig["batchedRssAfter"] = self.stack.rss()
        if "redis" not in self.skip:
            self.switch("redis")
            log(f"round {i}: the service, SECKILL_STOCK=redis THREADS={self.redis_threads}"
                " (Redis appendfsync always)")
            fig["redisSale"] = self.redis_sale("sale (redis-first)", self.sale_conns, self.seconds)
            if "rediswait" not in self.skip:
                fig["redisWaitSale"] = self.redis_wait_sale()
        return fig

    def start_replica(self):
        """A redis-server replicating the stack's Redis (no AOF, no
        snapshots), on a free port under the run directory; returns once
        its link to the master is up."""
        port = kit.free_ports(1)[0]
        d = os.path.join(self.run_dir, "redis-replica")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "redis.log"), "w") as err:
            self.replica = subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", d,
                 "--save", "", "--appendonly", "no",
                 "--replicaof", "127.0.0.1", self.stack.info["REDIS_PORT"]],
                stdin=subprocess.DEVNULL, stdout=err, stderr=err)
        deadline = time.monotonic() + 60
        while True:
            p = subprocess.run(["redis-cli", "-p", str(port), "INFO", "replication"],
                               capture_output=True, text=True, timeout=10)
            if "master_link_status:up" in p.stdout:
                return port
            if self.replica.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"the Redis replica on port {port} did not sync (see {d}/redis.log)")
            time.sleep(0.1)

    def stop_replica(self):
        stop_children([self.replica] if self.replica else [])
        self.replica = None

    def redis_wait_sale(self):
        """The redis-first sale acknowledged by WAIT for one replica
        (REDIS_ORDER_DURABILITY=wait) instead of the AOF: the master runs
        without AOF, so a 200 means the order is in two processes' memory."""
        what = "sale (redis-first, WAIT 1 replica)"
        wait = {"REDIS_ORDER_DURABILITY": "wait", "REDIS_ORDER_WAIT_REPLICAS": 1}
        try:
            self.redis_aof(False)
            port = self.start_replica()
            log(f"Redis replica pid {self.replica.pid} on 127.0.0.1:{port}; restarting the instances"
                " with REDIS_ORDER_DURABILITY=wait REDIS_ORDER_WAIT_REPLICAS=1")
            self.stack.restart_instances({**wait, "SECKILL_STOCK": "redis",
                                          "THREADS": self.redis_threads or None})
            return self.redis_sale(what, self.sale_conns, self.seconds)
        finally:
            self.stop_replica()
            self.stack.set({k: None for k in wait})

    def redis_cli(self, *args):
        p = run(["redis-cli", "-u", self.stack.info["REDIS_URL"], "--raw"] + [str(a) for a in args], 60)
        return p.stdout.strip()

    def redis_aof(self, on):
        """The stack's Redis with appendonly yes, appendfsync always (a 200 of
        the redis strategy survives a Redis crash), or without AOF again."""
        if not on:
            self.redis_cli("CONFIG", "SET", "appendonly", "no")
            return
        self.redis_cli("CONFIG", "SET", "appendfsync", "always")
        self.redis_cli("CONFIG", "SET", "appendonly", "yes")
        deadline = time.monotonic() + 60
        while "aof_rewrite_in_progress:0" not in self.redis_cli("INFO", "persistence") \
                or "aof_enabled:1" not in self.redis_cli("INFO", "persistence"):
            if time.monotonic() > deadline:
                raise BenchError("Redis did not finish switching AOF on")
            time.sleep(0.1)

    def drain(self, timeout=300):
        """Seconds until the orders stream has nothing unsettled."""
        t0 = time.monotonic()
        while True:
            backlog, pending = kit.stream_unsettled(self.redis_cli)
            if backlog == 0 and pending == 0:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                raise BenchError(f"the stream did not drain within {timeout}s ({backlog} left)")
            time.sleep(0.05)

    def reconcile_redis(self, what, voucher):
        """Redis and Postgres after the drain: the same stock, the same buyers,
        no dead letters, and /stats says so. Violations are recorded."""
        problems = []
        r_stock = int(self.redis_cli("HGET", f"seckill:v:{{{voucher}}}", "stock"))
        r_buyers = set(self.redis_cli("SMEMBERS", f"seckill:v:{{{voucher}}}:buyers").split())
        rows = self.psql(f"SELECT stock FROM tb_voucher WHERE voucher_id = {int(voucher)}")
        pg_stock = int(rows[0][0])
        pg_buyers = {r[0] for r in self.psql(
            f"SELECT user_id FROM tb_voucher_order WHERE voucher_id = {int(voucher)}")}
        dead = int(self.redis_cli("XLEN", "seckill:orders:dead") or 0)
        if r_stock != pg_stock:
            problems.append(f"stock: Redis {r_stock}, Postgres {pg_stock}")
        if r_buyers != pg_buyers:
            problems.append(f"buyers: {len(r_buyers - pg_buyers)} only in Redis, "
                            f"{len(pg_buyers - r_buyers)} only in Postgres")
        if dead:
            problems.append(f"{dead} dead letters")
        st = kit.call(self.stack.base_url, "GET", "/stats", timeout=30).body
        mine = [v for v in st.get("vouchers", []) if v.get("voucherId") == int(voucher)]
        if not mine or not mine[0].get("redis", {}).get("agree"):
            problems.append(f"/stats does not see the agreement: {mine[0].get('redis') if mine else None}")
        out = "; ".join(problems) if problems else "Redis and Postgres agree"
        self.invariant_runs.append({"run": f"{what}: reconciliation", "voucherId": voucher,
                                    "ok": not problems, "output": [out]})
        if problems:
            self.violations.append(f"{what} (voucher {voucher}): reconciliation: {out}")
            log(f"RECONCILIATION FAILED in {what} (voucher {voucher}): {out}")
        else:
            log(f"{what}: reconciled: stock {r_stock} and {len(r_buyers)} buyers on both sides")
        return not problems

    def redis_sale(self, what, conns, seconds, stock=10_000_000):
        """The sale with SECKILL_STOCK=redis: orders/s as acknowledged, then
        the drain of the stream into Postgres, the invariants (every
        acknowledged order id a row) and the reconciliation."""
        if self.warmup > 0:
            wv = self.stack.create_voucher(20000, f"bench: {what} warm-up")
            off = self.log_offset()
            w = self.wrk(f"{self.stack.base_url}/voucher/{wv}/seckill", conns, self.warmup, ids=True)
            self.drain()
            self.check(f"{what} warm-up", wv, ids=w["idsFile"], ok=w["statuses"].get("200", 0),
                       unknown=self.unknown(w, self.logged(off, wv), conns))
        v = self.stack.create_voucher(stock, f"bench: {what}")
        self.quiesce()
        off = self.log_offset()
        meter = self.cpu_meter()
        meter.start()
        w = self.wrk(f"{self.stack.base_url}/voucher/{v}/seckill", conns, seconds, ids=True)
        drain_s = self.drain()
        cpu = meter.stop()
        w["nginxLogged"] = self.logged(off, v)
        n, span = self.order_span(v)
        acked = w["statuses"].get("200", 0)
        unknown = self.unknown(w, w["nginxLogged"], conns)
        w["unknownOutcome"] = unknown
        self.check(what, v, ids=w["idsFile"], ok=acked, unknown=unknown)
        reconciled = self.reconcile_redis(what, v)
        w.pop("idsFile", None)
        rate = acked / w["seconds"] if w["seconds"] else 0.0
        r = {"voucherId": v, "stock": stock, "connections": conns, "orders": n, "acknowledged": acked,
             "ordersPerSec": round(rate, 1), "landedSpanSeconds": round(span, 3),
             "landedPerSec": round((n - 1) / span, 1) if n > 1 and span > 0 else 0.0,
             "drainSeconds": round(drain_s, 3), "reconciled": reconciled, "wrk": w, "cpu": cpu,
             "cpuMsPerOrder": {k: round(1000.0 * cpu[k] / n, 3) for k in
                               ("seckill", "nginx", "postgres", "redis", "loadTool", "interrupts", "other")} if n else None}
        log(f"{what}: {acked} orders acknowledged in {w['seconds']:.2f}s = {rate:.0f} orders/s"
            f" (p50 {w['p50Ms']} ms, p99 {w['p99Ms']} ms); the last landed in Postgres"
            f" {drain_s:.2f}s after the load ended")
        return r

    def switch(self, strategy):
        if strategy == "redis":
            self.redis_aof(True)
        elif self.strategy == "redis":
            self.redis_aof(False)
        threads = (self.batch_threads if strategy == "batched" else
                   self.redis_threads if strategy == "redis" else self.threads)
        extra = {"SECKILL_STOCK": strategy}
        if threads:
            extra["THREADS"] = threads
        log(f"restarting the instances with {' '.join(f'{k}={v}' for k, v in extra.items())}")
        self.stack.restart_instances({**extra, "THREADS": threads or None})
        self.strategy = strategy

    def long_run(self):
        if self.strategy != "optimistic":
            self.switch("optimistic")
        log(f"long sale: {self.long_seconds}s at {self.long_conns} connections (SECKILL_STOCK=optimistic)")
        before = self.stack.rss()
        r = self.sale(f"long sale {self.long_seconds}s", self.long_conns, self.long_seconds,
                      stock=100_000_000, warm=False)
        r["rssBefore"] = before
        r["rssAfter"] = self.stack.rss()
        return r

    def execute(self):
        if not os.path.exists(self.bin):
            raise BenchError(f"{self.bin} is missing: run 'make'")
        for tool in ("pgbench", "redis-benchmark", "redis-cli", "wrk", "ab", "psql", "curl"):
            if not shutil.which(tool):
                raise BenchError(f"'{tool}' not found (run 'make deps')")
        os.makedirs(self.run_dir, exist_ok=True)
        self.tmp = tempfile.mkdtemp(prefix="bench.", dir=self.run_dir)
        log(f"starting the stack in {self.run_dir} (2 instances, durable Postgres, LOG_LEVEL=warn)")
        self.stack.start(fresh=True)
        self.strategy = "optimistic"
        self.res["machine"] = self.machine()
        m = self.res["machine"]
        log(f"machine: {m['nproc']} CPUs, {m['memTotalMb']} MB, kernel {m['kernel']};"
            f" busy {m['busyPctBefore']}% before the run, load {m['loadavgBefore'][0]:.2f}")
        if m["busyPctBefore"] and m["busyPctBefore"] > 20:
            log("warning: the machine is busy with other work: the figures will be low and noisy")
        for i in range(1, self.repeat + 1):
            self.rounds.append(self.one_round(i))
        if self.long and "long" not in self.skip:
            self.longs.append(self.long_run())

    def guarded(self, body):
        """body() with SIGTERM and SIGINT raising Interrupted, then cleanup()
        whatever happens; the error that stopped it (logged), or None."""
        def on_signal(signum, _frame):
            raise Interrupted(f"signal {signum}")
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        try:
            body()
            return None
        except (kit.KitError, Interrupted) as e:
            log(f"error: {e}")
            return str(e)
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            self.cleanup()

    def cleanup(self):
        errors = []
        for stop in (self.stop_ceiling_nginx, self.stop_replica):
            try:
                stop()
            except Exception as e:          # noqa: BLE001 -- cleanup goes on
                errors.append(str(e))
        if self.keep and self.stack.started:
            log(f"BENCH_KEEP=1: the stack keeps running in {self.run_dir}"
                f" (RUN_DIR={self.run_dir} scripts/stack.sh stop)")
        else:
            try:
                if self.stack.started:
                    self.stack.stop()
            except Exception as e:      # noqa: BLE001
                errors.append(str(e))
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
        for e in errors:
            log(f"cleanup: {e}")

    # -------------------------------------------------------------- results

    def summarize(self):
        rounds = self.rounds

        def vals(path):
            return [x for x in (_dig(r, path) for r in rounds) if x is not None]

        def med(path):
            v = vals(path)
            return statistics.median(v) if v else None

        def spread(path):
            v = vals(path)
            return [min(v), max(v)] if v else None

        f = {
            "pgOneRowTps": med(["pgOneRow", "tps"]),
            "pgTxnTps": med(["pgTxn", "tps"]),
            "redisEvalshaOps": med(["redisEvalsha", "opsPerSec"]),
            "nginxRps": med(["nginx", "rps"]),
            "nginxP50Ms": med(["nginx", "p50Ms"]),
            "nginxP99Ms": med(["nginx", "p99Ms"]),
            "saleOrdersPerSec": med(["sale", "ordersPerSec"]),
            "saleP50Ms": med(["sale", "wrk", "p50Ms"]),
            "saleP99Ms": med(["sale", "wrk", "p99Ms"]),
            "soldOutRps": med(["soldOut", "rps"]),
            "soldOutP50Ms": med(["soldOut", "p50Ms"]),
            "soldOutP99Ms": med(["soldOut", "p99Ms"]),
            "nginxPacedRps": med(["nginx", "paced", "rps"]),
            "nginxPacedP50Ms": med(["nginx", "paced", "p50Ms"]),
            "nginxPacedP99Ms": med(["nginx", "paced", "p99Ms"]),
            "soldOutPacedRps": med(["soldOut", "pacedHalf", "rps"]),
            "soldOutPacedP50Ms": med(["soldOut", "pacedHalf", "p50Ms"]),
            "soldOutPacedP99Ms": med(["soldOut", "pacedHalf", "p99Ms"]),
            "soldOutSeckillCpuPct": med(["soldOut", "seckillCpuPct"]),
            "soldOutInstanceRequests": med(["soldOut", "instanceSoldOut"]),
            "soldOutEdgeHits": med(["soldOut", "edgeHits"]),
            "soldOutLogged": med(["soldOut", "logged"]),
            "soldOutNoEdgeRps": med(["soldOutNoEdge", "rps"]),
            "soldOutNoEdgeP50Ms": med(["soldOutNoEdge", "p50Ms"]),
            "soldOutNoEdgeP99Ms": med(["soldOutNoEdge", "p99Ms"]),
            "soldOutNoEdgeSeckillCpuPct": med(["soldOutNoEdge", "seckillCpuPct"]),
            "nginxBareRps": med(["nginxBare", "rps"]),
            "nginxBareP50Ms": med(["nginxBare", "p50Ms"]),
            "nginxBareP99Ms": med(["nginxBare", "p99Ms"]),
            "nginxBarePacedRps": med(["nginxBare", "pacedHalf", "rps"]),
            "nginxBarePacedP50Ms": med(["nginxBare", "pacedHalf", "p50Ms"]),
            "nginxBarePacedP99Ms": med(["nginxBare", "pacedHalf", "p99Ms"]),
            "nginxProcRps": med(["nginxProc", "rps"]),
            "nginxProcP50Ms": med(["nginxProc", "p50Ms"]),
            "nginxProcP99Ms": med(["nginxProc", "p99Ms"]),
            "nginxProcPacedP50Ms": med(["nginxProc", "paced", "p50Ms"]),
            "nginxProcPacedP99Ms": med(["nginxProc", "paced", "p99Ms"]),
            "nginxPacedStealPct": med(["nginx", "paced", "stealPct"]),
            "nginxProcPacedStealPct": med(["nginxProc", "paced", "stealPct"]),
            "soldOutPacedStealPct": med(["soldOut", "pacedHalf", "stealPct"]),
            "nginxBarePacedStealPct": med(["nginxBare", "pacedHalf", "stealPct"]),
            "stormRps": med(["storm", "rps"]),
            "saleLowOrdersPerSec": med(["saleLow", "ordersPerSec"]),
            "saleLowP50Ms": med(["saleLow", "wrk", "p50Ms"]),
            "saleLowP99Ms": med(["saleLow", "wrk", "p99Ms"]),
            "saleLowIdlePct": med(["saleLow", "cpu", "idlePct"]),
            "saleIdlePct": med(["sale", "cpu", "idlePct"]),
            "redisOrdersPerSec": med(["redisSale", "ordersPerSec"]),
            "redisP50Ms": med(["redisSale", "wrk", "p50Ms"]),
            "redisP99Ms": med(["redisSale", "wrk", "p99Ms"]),
            "redisDrainSeconds": med(["redisSale", "drainSeconds"]),
            "redisLandedPerSec": med(["redisSale", "landedPerSec"]),
            "redisWaitOrdersPerSec": med(["redisWaitSale", "ordersPerSec"]),
            "redisWaitP50Ms": med(["redisWaitSale", "wrk", "p50Ms"]),
            "redisWaitP99Ms": med(["redisWaitSale", "wrk", "p99Ms"]),
            "redisWaitDrainSeconds": med(["redisWaitSale", "drainSeconds"]),
        }
        for c in self.batch_conns:
            k = f"batchedSale{c}"
            f[f"batched{c}OrdersPerSec"] = med([k, "ordersPerSec"])
            f[f"batched{c}P50Ms"] = med([k, "wrk", "p50Ms"])
            f[f"batched{c}P99Ms"] = med([k, "wrk", "p99Ms"])
            f[f"batched{c}IdlePct"] = med([k, "cpu", "idlePct"])
            f[f"batched{c}BuyersPerBatch"] = med([k, "buyersPerBatch"])
        ranges = {k: spread(p) for k, p in {
            "pgOneRowTps": ["pgOneRow", "tps"], "pgTxnTps": ["pgTxn", "tps"],
            "redisEvalshaOps": ["redisEvalsha", "opsPerSec"], "nginxRps": ["nginx", "rps"],
            "nginxProcRps": ["nginxProc", "rps"], "nginxBareRps": ["nginxBare", "rps"],
            "soldOutNoEdgeRps": ["soldOutNoEdge", "rps"],
            "saleOrdersPerSec": ["sale", "ordersPerSec"], "soldOutRps": ["soldOut", "rps"],
            "soldOutP99Ms": ["soldOut", "p99Ms"], "stormRps": ["storm", "rps"],
            "redisOrdersPerSec": ["redisSale", "ordersPerSec"],
            "redisWaitOrdersPerSec": ["redisWaitSale", "ordersPerSec"]}.items()}
        for c in self.batch_conns:
            ranges[f"batched{c}OrdersPerSec"] = spread([f"batchedSale{c}", "ordersPerSec"])
        # Ratios per round, then their median (each pair measured minutes apart at most).
        def ratio_med(a, b):
            v = []
            for r in rounds:
                x, y = a(r), b(r)
                if x is not None and y:
                    v.append(x / y)
            return statistics.median(v) if v else None
        g = lambda *p: (lambda r: _dig(r, p))
        ratios = {
            "optimisticVsOneRow": ratio_med(g("sale", "ordersPerSec"), g("pgOneRow", "tps")),
            "optimisticVsTxn": ratio_med(g("sale", "ordersPerSec"), g("pgTxn", "tps")),
            "soldOutVsNginx": ratio_med(g("soldOut", "rps"), g("nginx", "rps")),
            "soldOutVsBare": ratio_med(g("soldOut", "rps"), g("nginxBare", "rps")),
            "soldOutNoEdgeVsBare": ratio_med(g("soldOutNoEdge", "rps"), g("nginxBare", "rps")),
            "soldOutVsNoEdge": ratio_med(g("soldOut", "rps"), g("soldOutNoEdge", "rps")),
            "soldOutVsNginxProc": ratio_med(g("soldOut", "rps"), g("nginxProc", "rps")),
            "nginxProcVsNginx": ratio_med(g("nginxProc", "rps"), g("nginx", "rps")),
            "stormVsRedis": ratio_med(g("storm", "rps"), g("redisEvalsha", "opsPerSec")),
            "redisVsOneRow": ratio_med(g("redisSale", "ordersPerSec"), g("pgOneRow", "tps")),
            # The sold-out crowd through the same instances (nginx's edge off):
            # what the HTTP path alone costs per request.
            "redisVsSoldOut": ratio_med(g("redisSale", "ordersPerSec"), g("soldOutNoEdge", "rps")),
            # The batched sale at the redis-first sale's concurrency, where one ran.
            "redisVsBatched": ratio_med(g("redisSale", "ordersPerSec"),
                                        g(f"batchedSale{self.sale_conns}", "ordersPerSec")),
            # Acknowledged by a replica's WAIT against by the master's fsync.
            "redisWaitVsOneRow": ratio_med(g("redisWaitSale", "ordersPerSec"), g("pgOneRow", "tps")),
            "redisWaitVsAof": ratio_med(g("redisWaitSale", "ordersPerSec"), g("redisSale", "ordersPerSec")),
        }
        for c in self.batch_conns:
            ratios[f"batched{c}VsOneRow"] = ratio_med(g(f"batchedSale{c}", "ordersPerSec"),
                                                     g("pgOneRow", "tps"))
            # Against the optimistic sale at the same concurrency, where one ran.
            same = "sale" if c == self.sale_conns else "saleLow" if c == self.low_conns else None
            ratios[f"batched{c}VsOptimistic"] = ratio_med(g(f"batchedSale{c}", "ordersPerSec"),
                                                         g(same, "ordersPerSec")) if same else None
        # RSS: per instance, the median over the rounds (or runs).
        def rss_med(sets):
            sets = [x for x in sets if x]
            if not sets:
                return None
            return [statistics.median(x[i]["rssKb"] for x in sets if len(x) > i) / 1024.0
                    for i in range(max(len(x) for x in sets))]
        rss_sets = {}
        for key in ("rssBefore", "rssAfter", "batchedRssBefore", "batchedRssAfter"):
            v = rss_med([r.get(key) for r in rounds])
            if v:
                rss_sets[key] = v
        longs = [x for x in self.longs if x]
        if longs:
            rss_sets["longBefore"] = rss_med([x.get("rssBefore") for x in longs])
            rss_sets["longAfter"] = rss_med([x.get("rssAfter") for x in longs])
            f["longOrdersPerSec"] = statistics.median(x["ordersPerSec"] for x in longs)
            f["longP50Ms"] = statistics.median(x["wrk"]["p50Ms"] for x in longs)
            f["longP99Ms"] = statistics.median(x["wrk"]["p99Ms"] for x in longs)
        targets = []

        def target(name, value, op, limit, label):
            if value is None:
                return
            ok = value >= limit if op == ">=" else value < limit if op == "<" else value <= limit
            targets.append({"name": name, "label": label, "value": round(value, 3), "op": op,
                            "target": limit, "pass": ok})
        target("optimisticVsOneRow", ratios["optimisticVsOneRow"], ">=", TARGETS["optimisticVsOneRow"],
               "sale orders/s (optimistic) / pgbench one-row tps")
        for c in self.batch_conns:
            t = BATCH_TARGETS.get(c, {})
            if "vsOneRow" in t:
                target(f"batched{c}VsOneRow", ratios[f"batched{c}VsOneRow"], ">=", t["vsOneRow"],
                       f"sale orders/s (batched, {c} c) / pgbench one-row tps")
            if "vsOptimistic" in t:
                target(f"batched{c}VsOptimistic", ratios[f"batched{c}VsOptimistic"], ">=", t["vsOptimistic"],
                       f"sale orders/s (batched, {c} c) / sale orders/s (optimistic, {c} c)")
            if "idlePct" in t:
                target(f"batched{c}IdlePct", f[f"batched{c}IdlePct"], "<", t["idlePct"],
                       f"idle share of the machine (%) during the batched sale at {c} c")
            if "p99Ms" in t:
                target(f"batched{c}P99Ms", f[f"batched{c}P99Ms"], "<=", t["p99Ms"],
                       f"p99 (ms) of the batched sale at {c} c")
        target("soldOutVsNginx", ratios["soldOutVsNginx"], ">=", TARGETS["soldOutVsNginx"],
               "sold-out req/s / nginx-to-upstream req/s")
        target("soldOutP99Ms", f["soldOutP99Ms"], "<", TARGETS["soldOutP99Ms"],
               "sold-out p99 (ms), at the saturated rate")
        target("soldOutPacedP99Ms", f["soldOutPacedP99Ms"], "<", TARGETS["soldOutP99Ms"],
               f"sold-out p99 (ms), paced to {HALF:.0%} of its saturated rate")
        target("soldOutVsBare", ratios["soldOutVsBare"], ">=", TARGETS["soldOutVsBare"],
               "sold-out req/s (nginx's sold-out edge) / nginx bare return 200 req/s")
        target("soldOutSeckillCpuPct", f["soldOutSeckillCpuPct"], "<=", TARGETS["soldOutSeckillCpuPct"],
               "the instances' CPU during the sold-out crowd (% of one CPU)")
        target("redisVsOneRow", ratios["redisVsOneRow"], ">=", TARGETS["redisVsOneRow"],
               "sale orders/s acknowledged (redis-first) / pgbench one-row tps")
        target("redisVsSoldOut", ratios["redisVsSoldOut"], ">=", TARGETS["redisVsSoldOut"],
               "sale orders/s (redis-first) / sold-out req/s through the instances")
        target("redisP99Ms", f["redisP99Ms"], "<", TARGETS["redisP99Ms"],
               f"redis-first buyer p99 (ms) at {self.sale_conns} connections")
        rss_key = "longAfter" if "longAfter" in rss_sets else "rssAfter" if "rssAfter" in rss_sets else None
        if rss_key:
            target("rssMb", max(rss_sets[rss_key]), "<=", TARGETS["rssMb"],
                   "RSS per instance (MB), largest, after the " +
                   (f"{self.long_seconds} s sale" if rss_key == "longAfter" else "short runs"))
        return f, ranges, ratios, rss_sets, targets

    # The table's columns: label, measured (ceilings: unit, reference figure;
    # service: compared with, its figure, ratio, target, result). Fixed widths,
    # a longer cell pushing the rest of its line, as format specs do.
    CEIL_COLS = [Col("ceilings, on the same Postgres, Redis and nginx", "l", 54, fit=False),
                 Col("measured", "r", 11, 1, False), Col("", "l", 6, 2, False),
                 Col("reference, 2-core VM", "r", 21, 1, False)]
    SERVICE_COLS = [Col("the service through nginx, 2 instances", "l", 54, fit=False),
                    Col("measured", "r", 11, 1, False), Col("compared with", "l", 20, 2, False),
                    Col("", "r", 7, 1, False), Col("ratio", "r", 5, 1, False),
                    Col("target", "l", 8, 2, False), Col("result", "l", 0, 1)]
    CPU_COLS = [Col("CPU ms per unit, by process (2 CPUs in all)", "l", 52, fit=False)] + [
        Col(t, "r", w, 1, False) for t, w in (("seckill", 7), ("nginx", 6), ("postgres", 8), ("redis", 6),
                                              ("client", 6), ("softirq", 7), ("others", 6), ("busy", 5),
                                              ("steal", 5), ("idle", 5))]
    SWITCH_COLS = [Col("thread switches per unit: sleeps / preemptions", "l", 52, fit=False)] + [
        Col(t, "r", 11, 1, False) for t in ("seckill", "nginx", "postgres", "redis")]

    def cpu_units(self):
        """(key in a round, label with its concurrency, the unit counted)."""
        pg = self.pg_clients
        return ([("pgOneRow", f"pgbench one-row, {pg} c (per txn)", "transactions"),
                 ("pgTxn", f"pgbench seckill txn, {pg} c (per txn)", "transactions"),
                 ("nginx", "nginx ceiling, 64 c (per request)", "requests"),
                 ("nginxProc", "nginx to 2 upstream200, 64 c (per request)", "requests"),
                 ("nginxBare", "nginx bare return 200, 64 c (per request)", "requests"),
                 ("sale", f"sale, optimistic, {self.sale_conns} c (per order)", "orders"),
                 ("saleLow", f"sale, optimistic, {self.low_conns} c (per order)", "orders")]
                + [(f"batchedSale{c}", f"sale, batched, {c} c (per order)", "orders") for c in self.batch_conns]
                + [("redisSale", f"sale, redis-first, {self.sale_conns} c, to the drain (per order)", "orders"),
                   ("redisWaitSale", f"sale, redis-first, WAIT, {self.sale_conns} c, to the drain (per order)",
                    "orders"),
                   ("soldOut", "sold-out, the edge, 64 c (per request)", "requests"),
                   ("soldOutNoEdge", "sold-out, --edge off, 64 c (per request)", "requests"),
                   ("storm", "storm, 64 c (per request)", "requests")])

    def cpu_per_unit(self):
        """[(label, {component: median ms of CPU per order or request})]: where the CPU went."""
        out = []
        for key, label, per in self.cpu_units():
            vals = []
            for r in self.rounds:
                x = r.get(key)
                if not x or not x.get("cpu") or not x.get(per):
                    continue
                vals.append({k: 1000.0 * v / x[per] for k, v in x["cpu"].items()
                             if k not in ("wallSeconds", "busyPct", "stealPct", "idlePct", "switches")}
                            | {"busyPct": x["cpu"].get("busyPct") or 0, "stealPct": x["cpu"].get("stealPct") or 0}
                            | ({"idlePct": x["cpu"]["idlePct"]} if x["cpu"].get("idlePct") is not None else {}))
            if vals:
                out.append((label, {k: statistics.median(v[k] for v in vals if k in v) for k in vals[0]}))
        return out

    def switches_per_unit(self):
        """[(label, {component: (sleeps, preemptions) per order or request})]:
        medians of the rounds, for the runs whose processes were measured."""
        out = []
        for key, label, per in self.cpu_units():
            vals = []
            for r in self.rounds:
                x = r.get(key) or {}
                sw = (x.get("cpu") or {}).get("switches")
                if sw and x.get(per):
                    vals.append({k: (v["sleeps"] / x[per], v["preempted"] / x[per]) for k, v in sw.items()})
            if vals:
                out.append((label, {k: tuple(statistics.median(v[k][i] for v in vals if k in v) for i in (0, 1))
                                    for k in vals[0]}))
        return out

    # The chart's sales: (figure key, CPU key in a round, bar label).
    def chart_sales(self):
        low = [("saleLowOrdersPerSec", "saleLow", f"optimistic\\n{self.low_conns} c")] \
            if self.low_conns else []
        return (low + [("saleOrdersPerSec", "sale", f"optimistic\\n{self.sale_conns} c")]
                + [(f"batched{c}OrdersPerSec", f"batchedSale{c}", f"batched\\n{c} c")
                   for c in self.batch_conns]
                + [("redisOrdersPerSec", "redisSale", f"redis-first\\nAOF, {self.sale_conns} c"),
                   ("redisWaitOrdersPerSec", "redisWaitSale",
                    f"redis-first\\nWAIT, {self.sale_conns} c")])

    def chart(self, png, title):
        """A gnuplot chart of the sales: orders/s against the one-row ceiling
        (and three times it), and the CPU per order by process. Returns the
        path, or None (no gnuplot, or nothing to draw)."""
        f = self.summarize()[0]
        cpu = dict(self.cpu_per_unit())
        labels = {key: label for key, label, _ in self.cpu_units()}
        rows = [(name, f.get(fig), cpu.get(labels.get(key), {}))
                for fig, key, name in self.chart_sales() if f.get(fig)]
        if not rows or not f.get("pgOneRowTps"):
            return None
        tmp = tempfile.mkdtemp(prefix="bench-chart-")     # the data and script, not beside the PNG
        try:
            return self._plot(tmp, png, title, rows, f["pgOneRowTps"])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @staticmethod
    def _plot(tmp, png, title, rows, one):
        """chart()'s gnuplot run in the directory 'tmp'."""
        dat, script = os.path.join(tmp, "bench.dat"), os.path.join(tmp, "bench.gp")
        parts = ("seckill", "nginx", "postgres", "redis", "loadTool", "interrupts")
        with open(dat, "w", encoding="utf-8") as fh:
            for i, (name, rate, c) in enumerate(rows):
                fh.write(f'{i} "{name}" {rate:.1f} ' + " ".join(f"{c.get(k, 0):.4f}" for k in parts) + "\n")
        n = len(rows)
        with open(script, "w", encoding="utf-8") as fh:
            fh.write("# gnuplot script of loadtest/bench.py\n" + kit.bar_chart_head(png, 1100, 960, n)
                     + f"""set boxwidth 0.6
set key top left opaque
set bmargin 4
set multiplot layout 2,1 title "{title}"
set title "orders per second (medians of the rounds)"
set yrange [0:{max(3.2 * one, 1.15 * max(r[1] for r in rows)):.0f}]
plot '{dat}' using 1:3:xtic(2) with boxes lc rgb "#1f77b4" title "sale", \\
     '' using 1:3:(sprintf("%.0f", $3)) with labels offset 0,0.7 notitle, \\
     {one:.1f} with lines dt 2 lw 2 lc rgb "#d62728" title "pgbench one-row UPDATE ceiling ({one:,.0f} tps)", \\
     {3 * one:.1f} with lines dt 3 lw 2 lc rgb "#ff7f0e" title "3 x the one-row ceiling"
set title "CPU ms per order, by process (both CPUs shared by everything)"
set key top right opaque
set yrange [0:*]
set style data histograms
set style histogram rowstacked
set boxwidth 0.6 relative
set xrange [-0.6:{n - 0.4}]
plot '{dat}' using 4:xtic(2) title "seckill", '' using 5 title "nginx", \\
     '' using 6 title "postgres", '' using 7 title "redis", '' using 8 title "wrk", \\
     '' using 9 title "softirq"
unset multiplot
""")
        return kit.gnuplot(script, png, log)

    def chart_title(self):
        m = self.res.get("machine") or {}
        ver = (m.get("versions") or {}).get("seckill", "")
        n = len(self.rounds)
        return (f"make bench{f', {n} rounds' if n > 1 else ''}: seckill {ver}, "
                f"{m.get('nproc', '?')} CPUs ({m.get('cpu', '?')}), {self.res.get('when', '')}").strip()

    def report(self):
        f, ranges, ratios, rss, targets = self.summarize()
        m = self.res.get("machine", {})
        ver = m.get("versions", {})
        n = len(self.rounds)
        med = (f", medians of {self.runs} runs ({n} rounds)" if self.runs > 1
               else f", medians of {n} rounds" if n > 1 else "")
        verdict = {t["name"]: "PASS" if t["pass"] else "MISS" for t in targets}
        rows = []

        def row(label, v, vs_label="", vs=None, ratio=None, tgt="", res=""):
            rows.append([label, v if isinstance(v, str) else fmt_count(v), vs_label,
                         fmt_count(vs) if vs_label and vs is not None else "",
                         f"{ratio:.2f}" if ratio is not None else "", tgt, verdict.get(res, "")])

        ceilings = [["pgbench one-row UPDATE ... stock > 0, autocommit, 16 c", f["pgOneRowTps"], "tps", REFERENCE["pgOneRow"]],
                    ["pgbench BEGIN; SELECT; UPDATE; INSERT; COMMIT, 16 c", f["pgTxnTps"], "tps", REFERENCE["pgTxn"]],
                    ["redis-benchmark EVALSHA lock_acquire.lua, 50 c", f["redisEvalshaOps"], "ops/s", REFERENCE["redisEvalsha"]],
                    ["wrk > nginx > keep-alive upstream return 200, 64 c", f["nginxRps"], "req/s", REFERENCE["nginx"]]]
        if f["nginxProcRps"] is not None:
            ceilings.append(["  the same to 2 upstream200 processes (no work)", f["nginxProcRps"], "req/s", None])
        if f["nginxBareRps"] is not None:
            ceilings.append(["wrk > nginx return 200 (bare), 64 c", f["nginxBareRps"], "req/s", None])
        if f["saleOrdersPerSec"] is not None:
            row(f"sale orders/s, optimistic, {self.sale_conns} c", f["saleOrdersPerSec"], "pgbench one-row",
                f["pgOneRowTps"], ratios["optimisticVsOneRow"], ">= 0.9", "optimisticVsOneRow")
            row("", "", "pgbench seckill txn", f["pgTxnTps"], ratios["optimisticVsTxn"])
            row("  buyer latency p50 / p99 ms", f"{f['saleP50Ms']:.1f} / {f['saleP99Ms']:.0f}")
            if f["saleIdlePct"] is not None:
                row("  idle share of the machine %", f"{f['saleIdlePct']:.0f}")
        if f["saleLowOrdersPerSec"] is not None:
            row(f"sale orders/s, optimistic, {self.low_conns} c", f["saleLowOrdersPerSec"], "pgbench one-row",
                f["pgOneRowTps"], f["saleLowOrdersPerSec"] / f["pgOneRowTps"] if f["pgOneRowTps"] else None)
            row("  buyer latency p50 / p99 ms", f"{f['saleLowP50Ms']:.1f} / {f['saleLowP99Ms']:.0f}")
            if f["saleLowIdlePct"] is not None:
                row("  idle share of the machine %", f"{f['saleLowIdlePct']:.0f}")
        for c in self.batch_conns:
            if f[f"batched{c}OrdersPerSec"] is None:
                continue
            t = BATCH_TARGETS.get(c, {})
            row(f"sale orders/s, batched, {c} c, THREADS={self.batch_threads}",
                f[f"batched{c}OrdersPerSec"], "pgbench one-row", f["pgOneRowTps"],
                ratios[f"batched{c}VsOneRow"], f">= {t['vsOneRow']:g}" if "vsOneRow" in t else "",
                f"batched{c}VsOneRow")
            opt = f["saleOrdersPerSec"] if c == self.sale_conns else \
                f["saleLowOrdersPerSec"] if c == self.low_conns else None
            if opt is not None:
                row("", "", f"optimistic, {c} c", opt, ratios[f"batched{c}VsOptimistic"],
                    f">= {t['vsOptimistic']:g}" if "vsOptimistic" in t else "", f"batched{c}VsOptimistic")
            row("  buyer latency p50 / p99 ms", f"{f[f'batched{c}P50Ms']:.1f} / {f[f'batched{c}P99Ms']:.0f}",
                "", None, None, f"p99 <= {t['p99Ms']:g}" if "p99Ms" in t else "", f"batched{c}P99Ms")
            if f[f"batched{c}IdlePct"] is not None:
                row("  idle share of the machine %", f"{f[f'batched{c}IdlePct']:.0f}", "", None, None,
                    f"< {t['idlePct']:g}" if "idlePct" in t else "", f"batched{c}IdlePct")
            if f[f"batched{c}BuyersPerBatch"] is not None:
                row("  buyers per group commit", f"{f[f'batched{c}BuyersPerBatch']:.1f}")
        if f["redisOrdersPerSec"] is not None:
            row(f"sale orders/s, redis-first, {self.sale_conns} c, THREADS={self.redis_threads}", f["redisOrdersPerSec"],
                "pgbench one-row", f["pgOneRowTps"], ratios["redisVsOneRow"], ">= 3", "redisVsOneRow")
            if f["soldOutNoEdgeRps"] is not None:
                row("", "", "sold-out, edge off", f["soldOutNoEdgeRps"], ratios["redisVsSoldOut"],
                    ">= 0.4", "redisVsSoldOut")
            if f.get(f"batched{self.sale_conns}OrdersPerSec") is not None:
                row("", "", f"batched, {self.sale_conns} c", f[f"batched{self.sale_conns}OrdersPerSec"],
                    ratios["redisVsBatched"])
            row("  buyer latency p50 / p99 ms", f"{f['redisP50Ms']:.1f} / {f['redisP99Ms']:.1f}",
                "", None, None, "p99 < 10", "redisP99Ms")
            row("  last order in Postgres, s after the load", f"{f['redisDrainSeconds']:.2f}")
            row("  rows landed per second (consumers)", f["redisLandedPerSec"])
        if f["redisWaitOrdersPerSec"] is not None:
            row(f"sale orders/s, redis-first, WAIT 1 replica (no AOF), {self.sale_conns} c",
                f["redisWaitOrdersPerSec"], "pgbench one-row", f["pgOneRowTps"], ratios["redisWaitVsOneRow"])
            if f["redisOrdersPerSec"] is not None:
                row("", "", "redis-first, AOF always", f["redisOrdersPerSec"], ratios["redisWaitVsAof"])
            row("  buyer latency p50 / p99 ms", f"{f['redisWaitP50Ms']:.1f} / {f['redisWaitP99Ms']:.1f}")
            row("  last order in Postgres, s after the load", f"{f['redisWaitDrainSeconds']:.2f}")
        if f.get("longOrdersPerSec") is not None:
            row(f"sale orders/s, optimistic, {self.long_seconds} s at {self.long_conns} c", f["longOrdersPerSec"],
                "pgbench one-row", f["pgOneRowTps"],
                f["longOrdersPerSec"] / f["pgOneRowTps"] if f["pgOneRowTps"] else None)
            row("  buyer latency p50 / p99 ms", f"{f['longP50Ms']:.1f} / {f['longP99Ms']:.0f}")
        if f["soldOutRps"] is not None:
            bare = f["nginxBareRps"] is not None
            if bare:
                row("sold-out req/s, 64 c (nginx's sold-out edge)", f["soldOutRps"], "nginx bare", f["nginxBareRps"],
                    ratios["soldOutVsBare"], ">= 0.8", "soldOutVsBare")
                row("", "", "nginx ceiling", f["nginxRps"], ratios["soldOutVsNginx"])
            else:
                row("sold-out req/s, 64 c (nginx's sold-out edge)", f["soldOutRps"], "nginx ceiling", f["nginxRps"],
                    ratios["soldOutVsNginx"])
            if f["nginxProcRps"] is not None:
                row("", "", "2 upstream200 procs", f["nginxProcRps"], ratios["soldOutVsNginxProc"])
            row("  sold-out p50 / p99 ms", f"{f['soldOutP50Ms']:.2f} / {f['soldOutP99Ms']:.2f}",
                f"bare {f['nginxBareP50Ms']:.2f} / {f['nginxBareP99Ms']:.2f}" if bare else "", None, None,
                "p99 < 2", "soldOutP99Ms")
            if f["soldOutPacedP99Ms"] is not None:
                row(f"  paced to half, {f['soldOutPacedRps']:,.0f} req/s: p50 / p99 ms",
                    f"{f['soldOutPacedP50Ms']:.2f} / {f['soldOutPacedP99Ms']:.2f}",
                    f"bare {f['nginxBarePacedP50Ms']:.2f} / {f['nginxBarePacedP99Ms']:.2f}"
                    if f["nginxBarePacedP99Ms"] is not None else "", None, None, "p99 < 2",
                    "soldOutPacedP99Ms")
                steal = [(n, f[k]) for n, k in (("sold-out", "soldOutPacedStealPct"),
                                                ("bare", "nginxBarePacedStealPct")) if f[k] is not None]
                if steal:
                    rows.append("  steal while paced: " + ", ".join(f"{n} {x:.1f} %" for n, x in steal)
                                + " (the hypervisor's share; the paced p99s rise with it)")
            if f["soldOutSeckillCpuPct"] is not None:
                row("  the instances' CPU meanwhile, % of one CPU", f"{f['soldOutSeckillCpuPct']:.2f}",
                    "", None, None, "<= 5", "soldOutSeckillCpuPct")
                if f["soldOutEdgeHits"] is not None:
                    rows.append(f"  nginx answered {f['soldOutEdgeHits']:,.0f} of {f['soldOutLogged']:,.0f} requests"
                                f" itself; the instances answered {f['soldOutInstanceRequests']:,.0f}"
                                " (their own sold_out counters)")
            if f["soldOutNoEdgeRps"] is not None:
                row("  without the edge (nginx --edge off), 64 c", f["soldOutNoEdgeRps"], "nginx bare" if bare else "",
                    f["nginxBareRps"], ratios["soldOutNoEdgeVsBare"])
                row("    p50 / p99 ms; the instances' CPU, % of one",
                    f"{f['soldOutNoEdgeP50Ms']:.2f} / {f['soldOutNoEdgeP99Ms']:.2f}; "
                    f"{f['soldOutNoEdgeSeckillCpuPct']:.0f}")
        if f["stormRps"] is not None:
            row("single-user storm req/s, ab -k, 64 c", f["stormRps"], "redis EVALSHA", f["redisEvalshaOps"],
                ratios["stormVsRedis"])
        labels = {"rssBefore": "RSS MB per instance: at start",
                  "rssAfter": "  after the short runs",
                  "longBefore": f"  before the {self.long_seconds} s sale",
                  "longAfter": f"  after the {self.long_seconds} s sale at {self.long_conns} c",
                  "batchedRssBefore": "  batched: at start",
                  "batchedRssAfter": "  batched: after its sale"}
        judged = "longAfter" if "longAfter" in rss else "rssAfter"
        for k, label in labels.items():
            if rss.get(k):
                vals = " / ".join(f"{x:.1f}" for x in rss[k])
                if k == judged:
                    row(label, vals, "", None, None, "<= 20", "rssMb")
                else:
                    row(label, vals)
        out = ["", f"== make bench{med}",
               f"   {m.get('nproc')} CPUs ({m.get('cpu')}), {m.get('memTotalMb')} MB, kernel {m.get('kernel')};"
               f" Postgres {(ver.get('postgres') or '?').split()[0]} (fsync {m.get('postgres', {}).get('fsync')},"
               f" synchronous_commit {m.get('postgres', {}).get('synchronous_commit')}),"
               f" Redis {ver.get('redis')}, nginx {ver.get('nginx')}, seckill {ver.get('seckill')}",
               "", kit.table(self.CEIL_COLS, [[r[0], fmt_count(r[1]), r[2], fmt_count(r[3])] for r in ceilings]),
               "", kit.table(self.SERVICE_COLS, rows)]
        cpu = self.cpu_per_unit()
        if cpu:
            out += ["", kit.table(self.CPU_COLS, [
                ["  " + label, f"{v.get('seckill', 0) + v.get('standIn', 0):.3f}",
                 f"{v.get('nginx', 0) + v.get('ceilingNginx', 0):.3f}"]
                + [f"{v.get(k, 0):.3f}" for k in ("postgres", "redis", "loadTool", "interrupts", "other")]
                + [f"{v.get('busyPct', 0):.0f}%", f"{v.get('stealPct', 0):.1f}%", f"{v['idlePct']:.0f}%" if "idlePct" in v else "-"]
                for label, v in cpu])]
            out.append("  (a process's column includes the interrupt work (loopback TCP) done while it ran; softirq:"
                       " the rest, done on an idle CPU; others: programs outside this benchmark, i.e. noise;"
                       " busy: share of both CPUs in use; steal: share the hypervisor took; idle: share no one"
                       " used; seckill: upstream200 in its row)")
            stolen = [f"{label.split(' (')[0]} {v['stealPct']:.1f} %" for label, v in cpu
                      if v.get("stealPct", 0) > STEAL_WARN_PCT]
            if stolen:
                out.append(f"  disturbed: the hypervisor took more than {STEAL_WARN_PCT} % of the machine during "
                           + ", ".join(stolen) + ": those figures read low; a ratio to a disturbed ceiling reads high")
        sw = self.switches_per_unit()
        if sw:
            def pair(v, *keys):
                got = [v[k] for k in keys if k in v]
                if not got:
                    return "-"
                return f"{sum(g[0] for g in got):.2f} / {sum(g[1] for g in got):.2f}"
            out += ["", kit.table(self.SWITCH_COLS, [
                ["  " + label, pair(v, "seckill", "standIn"), pair(v, "nginx", "ceilingNginx"),
                 pair(v, "postgres"), pair(v, "redis")] for label, v in sw])]
            out.append("  (from /proc/<pid>/task/*/status of the threads that lived through the run: a sleep is a"
                       " thread that blocked and was woken, a preemption one the scheduler switched out; each"
                       " costs the kernel a switch, and on a VM often an interrupt between the CPUs)")
        out.append("")
        if self.violations:
            out.append(f"INVARIANTS: VIOLATED in {len(self.violations)} run(s) (see the FAIL lines above)")
        else:
            out.append(f"invariants: hold after all {len(self.invariant_runs)} service runs (loadtest/check_invariants.py)")
        misses = [t["name"] for t in targets if not t["pass"]]
        out.append(f"speed targets: {len(targets) - len(misses)} PASS, {len(misses)} MISS"
                   + (f" ({', '.join(misses)})" if misses else ""))
        out.append(f"results: {os.path.relpath(self.json_path, ROOT) if self.json_path.startswith(ROOT) else self.json_path}")
        print("\n".join(out), flush=True)
        self.res.update({
            "figures": f, "ranges": ranges if n > 1 else None, "ratios": ratios,
            "rssMb": rss, "targets": targets,
        })

    def write_json(self, status, error=None, history=True):
        doc = {
            "when": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": "make bench",
            "status": status,
            "error": error,
            "durationSeconds": round(time.monotonic() - self.t_start, 1),
            "settings": {
                "seconds": self.seconds, "warmupSeconds": self.warmup, "rounds": self.repeat,
                "instances": 2, "saleConnections": self.sale_conns, "batchConnections": self.batch_conns,
                "lowConnections": self.low_conns,
                "threads": self.threads or "server default", "batchThreads": self.batch_threads,
                "long": self.long and "long" not in self.skip, "longSeconds": self.long_seconds,
                "longConnections": self.long_conns, "pgbenchClients": self.pg_clients,
                "pgMaxConnections": self.max_conn, "skip": sorted(self.skip),
                "logLevel": "warn", "pgDurable": True,
            },
            "reference": REFERENCE,
            "targetsWanted": TARGETS,
            "batchTargetsWanted": {str(c): t for c, t in BATCH_TARGETS.items()},
            "machine": self.res.get("machine"),
            "figures": self.res.get("figures"),
            "ranges": self.res.get("ranges"),
            "ratios": self.res.get("ratios"),
            "rssMb": self.res.get("rssMb"),
            "targets": self.res.get("targets"),
            "invariants": {"ok": not self.violations, "runs": self.invariant_runs},
            "rounds": self.rounds,
            "long": self.longs[0] if len(self.longs) == 1 else self.longs or None,
        }
        d = os.path.dirname(os.path.abspath(self.json_path))
        os.makedirs(d, exist_ok=True)
        kit.write_atomic(self.json_path, json.dumps(doc, indent=1) + "\n")
        if history and self.rounds:
            # Every run is also kept: loadtest/bench.py --median <them> gives medians.
            hist = os.path.join(d, "bench-history")
            os.makedirs(hist, exist_ok=True)
            shutil.copyfile(self.json_path, os.path.join(
                hist, "bench-" + doc["when"].replace(":", "").replace("-", "") + ".json"))


def _dig(d, path):
    for p in path:
        d = d.get(p) if isinstance(d, dict) else None
    return d


def redis_threads():
    """THREADS of the redis-first instances (BENCH_REDIS_THREADS)."""
    return env_int("BENCH_REDIS_THREADS", 32)


def load_runs(paths):
    """A Bench holding the rounds of the saved runs 'paths' (their JSON
    files), with the first run's settings and machine: for --median and
    --chart."""
    b = Bench()
    docs = []
    for path in paths:
        with open(path) as fh:
            docs.append(json.load(fh))
    st = docs[0].get("settings", {})
    b.sale_conns = st.get("saleConnections", b.sale_conns)
    bc = st.get("batchConnections", b.batch_conns)
    b.batch_conns = bc if isinstance(bc, list) else [bc]
    b.low_conns = st.get("lowConnections", 0)
    b.batch_threads = st.get("batchThreads", b.batch_threads)
    b.long_seconds = st.get("longSeconds", b.long_seconds)
    b.long_conns = st.get("longConnections", b.long_conns)
    b.res["machine"] = docs[0].get("machine") or {}
    b.res["when"] = docs[0].get("when", "")
    b.runs = len(docs)
    for d in docs:
        c = (d.get("settings") or {}).get("batchConnections")
        for r in d.get("rounds") or []:
            if isinstance(c, int) and "batchedSale" in r:     # a file from when one concurrency ran
                r[f"batchedSale{c}"] = r.pop("batchedSale")
        b.rounds.extend(d.get("rounds") or [])
        lg = d.get("long")
        b.longs.extend(lg if isinstance(lg, list) else [lg] if lg else [])
        inv = (d.get("invariants") or {}).get("runs") or []
        b.invariant_runs.extend(inv)
        b.violations.extend(r["run"] for r in inv if not r.get("ok"))
    return b


def median_of_files(argv):
    """--median [--json OUT] FILE...: the table of several runs' medians."""
    out = None
    if argv[:1] == ["--json"]:
        if len(argv) < 2:
            sys.exit("bench: --json needs a file")
        out, argv = argv[1], argv[2:]
    if not argv:
        sys.exit("usage: loadtest/bench.py --median [--json OUT] build/bench-history/*.json")
    b = load_runs(argv)
    b.json_path = out or "(not written: --json OUT)"
    b.report()
    if out:
        b.repeat = len(b.rounds)
        b.write_json("median", None, history=False)
        with open(out) as fh:
            doc = json.load(fh)
        doc["command"] = "loadtest/bench.py --median " + " ".join(argv)
        doc["files"] = argv
        with open(out, "w") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")
    return 1 if b.violations else 0


def chart_of_file(argv):
    """--chart FILE PNG: the chart of a saved run."""
    if len(argv) != 2:
        sys.exit("usage: loadtest/bench.py --chart build/bench.json docs/img/bench.png")
    b = load_runs(argv[:1])
    if b.chart(os.path.abspath(argv[1]), b.chart_title()) is None:
        sys.exit("bench: no chart (gnuplot missing, or no sale in the file)")
    print(f"chart: {argv[1]}")
    return 0


def main():
    if sys.argv[1:2] == ["--median"]:
        return median_of_files(sys.argv[2:])
    if sys.argv[1:2] == ["--chart"]:
        return chart_of_file(sys.argv[2:])
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    b = Bench()
    error = b.guarded(b.execute)
    status, rc = ("error", 2) if error else ("ok", 0)
    if b.rounds:
        b.report()
    if b.violations:
        status, rc = "invariant-violation", 1
    b.write_json(status, error)
    if b.rounds:
        png = b.chart(os.path.join(os.path.dirname(os.path.abspath(b.json_path)), "bench.png"),
                      b.chart_title())
        log(f"chart: {png}" if png else "no chart (gnuplot missing, or no sale ran)")
    log(f"done in {time.monotonic() - b.t_start:.0f}s")
    if rc == 1:
        log("FAILED: an invariant was violated (see above)")
    return rc


if __name__ == "__main__":
    sys.exit(main())
