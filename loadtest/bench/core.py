"""The state of one make bench run and what every measurement uses: the
settings, user blocks, wrk, the invariants' check, the CPU meter, the
machine's description, the run guarded against signals and cleaned up."""

import os
import platform
import re
import shutil
import signal
import subprocess
import time

import check_invariants
import kit

from .settings import ROOT, Interrupted, env_int, env_list, log, redis_threads
from .stack import Stack


def version(cmd, pat=None):
    """The first line of cmd's output, or pat's group 1 in it; None when
    cmd cannot run."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        t = (p.stdout + p.stderr).strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    if pat:
        m = re.search(pat, t)
        return m.group(1) if m else t.splitlines()[0] if t else None
    return t.splitlines()[0] if t else None


def proc_field(path, prefix):
    """The text after the first colon of path's first line starting with prefix."""
    with open(path) as f:
        for line in f:
            if line.startswith(prefix):
                return line.split(":", 1)[1].strip()
    return None


def busy_pct(seconds=1.0):
    """The machine's busy share (%) over the next seconds."""
    c0 = kit.machine_cpu()
    time.sleep(seconds)
    c1 = kit.machine_cpu()
    b0, t0 = c0[0] + c0[1], c0[3]
    b1, t1 = c1[0] + c1[1], c1[3]
    return round(100.0 * (b1 - b0) / (t1 - t0), 1) if t1 > t0 else None


PG_SETTINGS = ["fsync", "synchronous_commit", "full_page_writes", "wal_sync_method",
               "max_connections", "shared_buffers"]


class Core:
    """A make bench run's state; the measurements are the mixins of Bench
    (bench/__init__.py)."""

    def __init__(self):
        """The settings (BENCH_* in the environment) and the run's state."""
        self.t_start = time.monotonic()
        self.run_dir = os.environ.get("BENCH_RUN_DIR") or os.path.join(ROOT, "build", "bench-run")
        self.json_path = os.environ.get("BENCH_JSON") or os.path.join(ROOT, "build", "bench.json")
        self.seconds = env_int("BENCH_SECONDS", 6)
        # How often a sale looks at what its idle CPU waits on (0: never).
        self.idle_ms = env_int("BENCH_IDLE_MS", 50)
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

    def next_user_base(self):
        """The first user id of the next load: each gets a block of its own."""
        self.user_block += 1
        return 1_000_000_000_000 + self.user_block * 10_000_000_000

    def psql(self, sql):
        """kit.psql() on the stack's database."""
        return kit.psql(self.stack.dsn, sql, timeout=120)

    def quiesce(self):
        """Before each measured run: no dead row versions, a fresh checkpoint.
        tb_voucher_order too: the seckill-transaction ceiling deletes the orders
        it made, and their dead index entries would cost the next sale's
        unique-index checks (the first round's sale paid twice the Postgres
        CPU per order of the later rounds)."""
        self.psql("VACUUM tb_voucher; VACUUM tb_voucher_order; CHECKPOINT;")

    def buy(self, voucher, user):
        """One purchase through nginx; its status."""
        return kit.call(self.stack.base_url, "POST", f"/voucher/{voucher}/seckill",
                        headers={"X-User-Id": str(user)}, timeout=10).status

    def wrk(self, url, conns, seconds, ids=False, timeout_s="10s", delay_ms=0):
        """kit.run_wrk() with a new block of users; its figures as the JSON
        keeps them."""
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
        m0 = kit.machine_cpu()
        p = self.wrk(url, 64, self.seconds, delay_ms=delay_ms or self.pace_ms)
        p["stealPct"] = kit.steal_pct(m0, kit.machine_cpu())
        return p, {k: p[k] for k in ("rps", "p50Ms", "p90Ms", "p99Ms", "maxMs", "stealPct", "tool")}

    def check(self, what, voucher, ids=None, ok=None, unknown=0, expect=None):
        """loadtest/check_invariants.py on voucher after the run what: recorded,
        and a violation logged; True when they hold."""
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
        """A kit.CpuMeter of the stack's components (and of the ceiling's
        nginx, stand-ins and replica while they run)."""
        groups = {"seckill": self.stack.app_pids(), "nginx": [self.stack.pid("nginx")],
                  "postgres": [self.stack.pid("postgres")],
                  "redis": [self.stack.pid("redis")] + ([self.replica.pid] if self.replica else [])}
        if self.ceiling_nginx_pid:
            groups["ceilingNginx"] = [self.ceiling_nginx_pid]
        if self.stand_ins:
            groups["standIn"] = [p.pid for p in self.stand_ins]
        return kit.CpuMeter(groups)

    def sale_wrk(self, url, conns, seconds):
        """self.wrk() of a sale (ids kept) with a kit.IdleSampler of the stack
        (Postgres's waits, Redis's main thread, the instances' workers)
        around it, stopped whatever wrk does: (wrk's result, the sampler's
        shares, None with BENCH_IDLE_MS=0)."""
        idle = None
        if self.idle_ms > 0:
            idle = kit.IdleSampler(self.stack.dsn, redis_pid=self.stack.pid("redis"),
                                   interval=self.idle_ms / 1000.0,
                                   seckill_pids=self.stack.app_pids()).start()
        try:
            w = self.wrk(url, conns, seconds, ids=True)
        finally:
            shares = idle.stop() if idle else None
        return w, shares

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
        """Stops what the run started (the stack unless BENCH_KEEP=1), by PID."""
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

    def machine(self):
        """The machine, the tools' versions and Postgres's settings (the JSON's
        "machine")."""
        mem = proc_field("/proc/meminfo", "MemTotal:")
        mem = int(mem.split()[0]) if mem else None
        return {
            "nproc": os.cpu_count(), "memTotalMb": round(mem / 1024) if mem else None,
            "cpu": proc_field("/proc/cpuinfo", "model name"), "kernel": platform.release(),
            "os": version(["sh", "-c", ". /etc/os-release; echo $PRETTY_NAME"]),
            "busyPctBefore": busy_pct(), "loadavgBefore": os.getloadavg(),
            "versions": self.versions(),
            "postgres": dict(zip(PG_SETTINGS, self.psql(
                "SELECT " + ", ".join(f"current_setting('{k}')" for k in PG_SETTINGS) + ";")[0])),
        }

    def versions(self):
        """The versions of Postgres, the tools and this checkout (git describe)."""
        return {
            "postgres": version(["psql", "-X", "-A", "-t", "-d", self.stack.dsn, "-c", "SHOW server_version"]),
            "pgbench": version(["pgbench", "--version"], r"(\d+\.\d+)"),
            "redis": version(["redis-server", "--version"], r"v=(\S+)"),
            "nginx": version([shutil.which("nginx") or "/usr/sbin/nginx", "-v"], r"nginx/(\S+)"),
            "wrk": version(["wrk", "-v"], r"wrk (\S+)"),
            "ab": version(["ab", "-V"], r"Version (\S+)"),
            "seckill": version(["git", "-C", ROOT, "describe", "--always", "--dirty"]),
        }
