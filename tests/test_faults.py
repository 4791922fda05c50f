#!/usr/bin/env python3
"""Fault injection under load, through nginx, and resource limits.

The local stack (scripts/stack.sh: throwaway Postgres and Redis, 2 instances,
nginx) runs in $TEST_TMP/faults-stack on free ports. In each scenario a load
of distinct buyers runs through nginx (and, where it matters, straight to each
instance) while something breaks; loadtest/check_invariants.py ends every
scenario (no oversell, no user with two orders, no stock drift, every order id
a client saw with 200 exists, orders = 200s give or take the answers of
unknown outcome).

  kill -9 of one instance    clients of the dead one see errors, the other sells
  Redis frozen (SIGSTOP)     503 within the Redis timeout; recovery by itself
  Redis stopped, restarted   503 at once; recovery; its data (locks, counters) is gone
  Postgres stopped, started  503 at once; recovery by itself
  batched: kill -9, then     every order id answered 200 is in the database after
  Postgres crashed           the recovery (the answer waits for the flush)
  lock holder SIGSTOPped     past its lease: a second instance sells to the same
                             user; the first one's write is refused (fencing),
                             one order, counted in /stats
  Redis master SIGKILLed     (a second stack, REDIS_HA=1: a master, two replicas,
                             three Sentinels) mid-sale through nginx: Sentinel
                             promotes a replica, the instances follow it by
                             themselves; 503 meanwhile, each within the Redis
                             timeout; kill -> first 200 printed; invariants hold
  Redis master SIGSTOPped    past Sentinel's down-after, then SIGCONT: a replica
                             is promoted, the old master comes back as a
                             replica, and none of our clients writes to it
  resources                  1,000 slow clients (nginx, and an instance itself),
                             MAX_CONNECTIONS / CONN_TIMEOUT_S with small values,
                             RSS of the instances over a sale

Knobs (environment): FAULTS_SALE_S (RSS sale, default 12; make faults: 60),
FAULTS_OUTAGE_S (default 3), FAULTS_RATE (requests/s per load worker, default
25), FAULTS_FIGURES (write the figures there as JSON). The figures are printed
at the end. Prints "N passed, M failed". Python 3 standard library only.
"""

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter, namedtuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seckill_server as ss  # noqa: E402
from seckill_server import fail, test  # noqa: E402

sys.path.insert(0, os.path.join(ss.ROOT, "loadtest"))
import kit  # noqa: E402
import load_kit  # noqa: E402
import slowloris  # noqa: E402

ROOT = ss.ROOT
RUN_DIR = os.path.join(ss.TEST_TMP, "faults-stack")
SALE_S = float(os.environ.get("FAULTS_SALE_S", "12"))
OUTAGE_S = float(os.environ.get("FAULTS_OUTAGE_S", "3"))
RATE = float(os.environ.get("FAULTS_RATE", "25"))
REDIS_TIMEOUT_MS = 1000          # the instances' default
LOCK_LEASE_MS = 10000            # the instances' default
STOCK = 1_000_000                # never sells out: every answer is about the fault
FIG = {}                         # figures for the report

# Settings of the caller's environment that must not reach the stack (besides
# ss.STACK_SCRUB).
_SCRUB = ("LOCK_LEASE_MS", "DEMO_PAUSE_MS", "DEMO_DELAY_MS", "REDIS_TIMEOUT_MS",
          "MAX_CONNECTIONS", "CONN_TIMEOUT_S", "MAX_BODY", "RUN_DIR")


# ---------------------------------------------------------------- the stack

class Stack(kit.Stack):
    """The local stack (kit.Stack, 2 instances) and what these tests do to it."""

    def __init__(self):
        super().__init__(RUN_DIR, ss.stack_settings({"INSTANCES": 2, "DEMO_RANDOM_USER": 0,
                                                     "THREADS": 4, "LOG_LEVEL": "warn"}), _SCRUB)
        self.spawned = []          # Popen of processes this test restarted
        self.images = {}           # how the launcher started each instance

    @property
    def nginx(self):
        return self.nginx_port

    @property
    def redis_port(self):
        return int(self.info["REDIS_PORT"])

    def set_pid(self, name, pid):
        super().set_pid(name, pid)
        ss.register_pid(pid)

    def new_voucher(self, stock=STOCK):
        try:
            return self.create_voucher(stock, "faults")
        except kit.KitError as e:
            fail(f"create voucher: {e}")

    def redis(self, *args, timeout=5):
        return ss.redis(list(args), url=self.info["REDIS_URL"], timeout=timeout)

    def wait_ready(self, port, timeout=20):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if ss.request(port, "GET", "/ready", timeout=2).status == 200:
                    return time.monotonic()
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.05)
        fail(f"instance on port {port} not ready within {timeout}s")

    def stats(self, port):
        r = ss.request(port, "GET", "/stats", timeout=10)
        if r.status != 200:
            fail(f"GET /stats on {port}: {r.status}")
        return r.body


def wait_gone(pid, timeout=10):
    if not kit.wait_gone(pid, timeout):
        fail(f"pid {pid} still alive after {timeout}s")


def rss_kib(pid):
    st = kit.proc_status(pid)
    if st is None:
        fail(f"pid {pid} is gone")
    return st["VmRSS"]


ProcImage = namedtuple("ProcImage", "argv env cwd")


def snapshot(pid):
    """What it takes to start the same process again."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = [a.decode() for a in f.read().split(b"\0") if a]
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(kv.decode("utf-8", "replace").split("=", 1)
                   for kv in f.read().split(b"\0") if b"=" in kv)
    return ProcImage(argv, env, os.readlink(f"/proc/{pid}/cwd"))


_state = {}


def the_stack():
    if "stack" not in _state:
        st = load_kit.start_stack(Stack(), "")
        st.images = {f"app-{i + 1}": snapshot(st.pid(f"app-{i + 1}")) for i in range(2)}
        _state["stack"] = st
    return _state["stack"]


def respawn_instance(st, name, **overrides):
    """Starts instance 'name' again as the launcher did (same argv,
    environment, directory), with environment overrides; waits until ready."""
    img = st.images[name]
    env = kit.with_settings(img.env, overrides)
    log = open(os.path.join(RUN_DIR, "logs", f"{name}.log"), "ab")
    p = subprocess.Popen(img.argv, env=env, cwd=img.cwd, stdin=subprocess.DEVNULL, stdout=log,
                         stderr=log, start_new_session=True)
    log.close()
    st.spawned.append(p)
    st.set_pid(name, p.pid)
    port = int(env["PORT"])
    st.wait_ready(port)
    return p


def stop_instance(st, name, sig=signal.SIGTERM):
    pid = st.pid(name)
    os.kill(pid, sig)
    wait_gone(pid)
    for p in st.spawned:
        p.poll()                  # reap the ones this test started


# ---------------------------------------------------------------- the load

Load, Rec = load_kit.Load, load_kit.Rec
outcome, unknown_outcome, tally, pct = (load_kit.outcome, load_kit.unknown_outcome,
                                        load_kit.tally, load_kit.pct)
check_invariants, verify = load_kit.check_invariants, load_kit.verify


def lock_keys(st):
    """{key: pttl ms} of every per-user order lock in Redis."""
    keys = [k for k in st.redis("--scan", "--pattern", "lock:order:*").splitlines() if k]
    out = {}
    for k in keys:
        try:
            out[k] = int(st.redis("PTTL", k))
        except (AssertionError, ValueError):
            pass
    return out


def check_lock_leases(st, label, lease_ms=LOCK_LEASE_MS):
    """No lock without an expiry, none with more than a lease to live."""
    keys = lock_keys(st)
    bad = {k: t for k, t in keys.items() if t == -1 or t > lease_ms}
    if bad:
        fail(f"{label}: locks without expiry or past the lease ({lease_ms} ms): {bad}")
    live = {k: t for k, t in keys.items() if t > 0}
    return {"lockKeys": len(live), "lockMaxPttlMs": max(live.values()) if live else 0}


def timeline(recs, t_fault, t_heal):
    """Outage and recovery figures: answers to requests sent during the
    outage, and when the service was whole again."""
    during = [r for r in recs if t_fault + 0.05 <= r.t0 < t_heal]
    after = [r for r in recs if r.t0 >= t_heal]
    bad_after = [r for r in after if r.status != 200]
    first_ok = min((r.t1 for r in after if r.status == 200), default=None)
    last_bad = max((r.t1 for r in bad_after), default=t_heal)
    lat503 = [(r.t1 - r.t0) * 1000 for r in during if r.status == 503]
    return {
        "during": tally(during),
        "after": tally(after),
        "outage503": len(lat503),
        "outage503p50ms": round(pct(lat503, 50), 1),
        "outage503p99ms": round(pct(lat503, 99), 1),
        "outage503maxms": round(max(lat503), 1) if lat503 else 0,
        "outageMaxLatencyMs": round(max(((r.t1 - r.t0) * 1000 for r in during), default=0), 1),
        "firstOkAfterHealS": round(first_ok - t_heal, 2) if first_ok else None,
        "recoveredAfterS": round(max(0.0, last_bad - t_heal), 2),
    }


def show(name, figs):
    FIG[name] = figs
    print(f"    {name}: {json.dumps(figs, sort_keys=True)}", flush=True)


def nginx_workers(st, n=8):
    return [("nginx", st.nginx)] * n


# ---------------------------------------------------------------- scenarios

@test
def stack_starts():
    st = the_stack()
    for port in st.app_ports:
        st.wait_ready(port)
    if ss.request(st.nginx, "GET", "/health").status != 200:
        fail("nginx does not answer /health")


@test
def kill9_one_of_two_instances_mid_sale():
    st = the_stack()
    try:
        killed_instance(st)
    finally:                      # instance 1 comes back as the launcher started it
        if not ss.pid_alive(st.pid("app-1")):
            t0 = time.monotonic()
            respawn_instance(st, "app-1")
            FIG.setdefault("kill9", {})["restartReadyS"] = round(time.monotonic() - t0, 2)


def killed_instance(st):
    v = st.new_voucher()
    a1, a2 = st.app_ports
    targets = nginx_workers(st, 8) + [("app-1", a1)] * 2 + [("app-2", a2)] * 2
    load = Load(v, targets).start()
    time.sleep(2.0)
    victim = st.pid("app-1")
    t_kill = time.monotonic()
    try:
        os.kill(victim, signal.SIGKILL)
        time.sleep(OUTAGE_S + 1.0)
    finally:
        recs = load.stop()
    wait_gone(victim)

    after = [r for r in recs if r.t0 >= t_kill + 0.05]
    direct1 = [r for r in after if r.via == "app-1"]
    direct2 = [r for r in after if r.via == "app-2"]
    via_nginx = [r for r in after if r.via == "nginx"]
    # nginx: a request that was at the dead instance gets 502; later ones go
    # to the survivor (a connect error is retried, a sent POST never).
    late = [r for r in via_nginx if r.t0 >= t_kill + 1.0]
    inflight = [r for r in recs if r.t0 < t_kill < r.t1 and r.via != "app-2"]
    figs = {"afterKill": tally(after), "throughNginxAfterKill": tally(via_nginx),
            "inFlightAtKill": tally(inflight), "direct1AfterKill": tally(direct1),
            "direct2AfterKill": tally(direct2)}
    figs.update(check_invariants(st, v, recs, "kill9"))
    figs.update(check_lock_leases(st, "kill9"))
    show("kill9", figs)
    if not direct1 or any(r.status is not None for r in direct1):
        fail(f"direct clients of the killed instance: {tally(direct1)}")
    if not direct2 or any(r.status != 200 for r in direct2):
        fail(f"direct clients of the surviving instance must keep buying: {tally(direct2)}")
    if not late or any(r.status != 200 for r in late):
        fail(f"through nginx, 1 s after the kill: {tally(late)}")
    if any(r.instance == "seckill-1" for r in late):
        fail("an answer from the killed instance after its death")


def redis_outage(kind):
    """kind 'freeze': SIGSTOP/SIGCONT of redis-server; 'restart': it is
    killed (its data is lost: no persistence) and a new one starts on the
    same port. Checks what holds for both; returns the figures and records
    for the checks of one kind only."""
    st = the_stack()
    v = st.new_voucher()
    load = Load(v, nginx_workers(st, 16), rate=RATE / 2).start()
    time.sleep(2.0)
    pid = st.pid("redis")
    t_fault = time.monotonic()
    if kind == "freeze":
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(OUTAGE_S)
        finally:
            t_heal = time.monotonic()
            os.kill(pid, signal.SIGCONT)
    else:
        os.kill(pid, signal.SIGKILL)
        wait_gone(pid)
        time.sleep(OUTAGE_S)
        t_heal = time.monotonic()
    if kind == "restart":         # as scripts/stack.sh starts it
        p = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(st.redis_port), "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--dir", os.path.join(RUN_DIR, "redis"),
             "--logfile", os.path.join(RUN_DIR, "redis", "redis.log"), "--protected-mode", "yes"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        st.spawned.append(p)
        st.set_pid("redis", p.pid)
    time.sleep(6.0)
    recs = load.stop()

    figs = timeline(recs, t_fault, t_heal)
    figs["outageS"] = round(t_heal - t_fault, 2)
    started = [r for r in recs if t_fault + 0.05 <= r.t0 < t_heal]
    during = [r for r in started if r.t1 < t_heal]
    # Users who got 503 retry once the service is back (1 s after the run):
    # nothing of theirs may stand in their way.
    retry_users = [r.user for r in during if r.status == 503][:200]
    retried = Counter()
    retry_ids = []
    for u in retry_users:
        r = ss.request(st.nginx, "POST", f"/voucher/{v}/seckill", {"X-User-Id": str(u)})
        retried[f"{r.status} {r.body.get('error', '') if isinstance(r.body, dict) else ''}".strip()] += 1
        if r.status == 200:
            retry_ids.append(r.body["orderId"])
    figs["retryOf503Buyers"] = dict(retried)
    figs.update(check_invariants(st, v, recs, f"redis-{kind}", retry_ids))
    figs.update(check_lock_leases(st, f"redis-{kind}"))
    show(f"redis_{kind}", figs)
    wrong = Counter(outcome(r) for r in during if not (r.status == 503 and r.code == "unavailable"))
    if not during or wrong:
        fail(f"answered during the Redis outage, want only 503 unavailable: {tally(during)}")
    if any(r.retry_after is None for r in during):
        fail("a 503 without Retry-After")
    if figs["recoveredAfterS"] > 5.0:
        fail(f"not recovered within 5 s of Redis coming back: {figs}")
    tail = [r for r in recs if r.t0 >= recs[-1].t0 - 2.0]
    if any(r.status != 200 for r in tail):
        fail(f"the last 2 s of the run are not all 200: {tally(tail)}")
    return figs, started, retried


def outage_latency_bounded(started, t_label):
    """Every request sent while Redis hangs is answered within the Redis
    timeout plus a second (the SPEC: no hang longer than the configured
    timeouts), whatever the crowd."""
    bound = REDIS_TIMEOUT_MS + 1000
    lat = sorted((r.t1 - r.t0) * 1000 for r in started)
    slow = [x for x in lat if x > bound]
    if slow:
        fail(f"{len(slow)} of {len(lat)} requests sent during the {t_label} took longer than"
             f" REDIS_TIMEOUT_MS + 1 s = {bound} ms (max {lat[-1]:.0f} ms; p50 {pct(lat, 50):.0f} ms):"
             f" requests queue behind the worker threads that each wait out the timeout")


def no_orphan_lock_in_the_way(retried):
    bad = {k: n for k, n in retried.items() if k != "200"}
    if bad:
        fail(f"{sum(bad.values())} of {sum(retried.values())} buyers who got 503 during the outage"
             f" could not buy right after it: {bad}. The lock request timed out in the server"
             f" but was executed by Redis when it resumed: the lock is held by a request that"
             f" already answered, until its lease ({LOCK_LEASE_MS} ms) ends")


@test
def redis_frozen_mid_sale():
    figs, started, retried = redis_outage("freeze")
    _state["freeze"] = (started, retried)


@test
def redis_frozen_every_answer_within_the_timeout():
    if "freeze" not in _state:
        fail("redis_frozen_mid_sale did not run")
    outage_latency_bounded(_state["freeze"][0], "Redis freeze")


@test
def redis_frozen_503_buyers_can_buy_right_after():
    if "freeze" not in _state:
        fail("redis_frozen_mid_sale did not run")
    no_orphan_lock_in_the_way(_state["freeze"][1])


@test
def redis_stopped_and_restarted_mid_sale():
    st = the_stack()
    # A buyer with history: after Redis lost its data (token counters too),
    # he must still be able to buy something else.
    v_before = st.new_voucher(10)
    user = 4_200_000_000_000 + os.getpid()
    for want in (200, 409):
        r = ss.request(st.nginx, "POST", f"/voucher/{v_before}/seckill", {"X-User-Id": str(user)})
        if r.status != want:
            fail(f"setup: buyer {user} got {r.status} {r.raw!r}, want {want}")
    figs, started, retried = redis_outage("restart")
    outage_latency_bounded(started, "Redis restart")
    no_orphan_lock_in_the_way(retried)
    v_after = st.new_voucher(10)
    r = ss.request(st.nginx, "POST", f"/voucher/{v_after}/seckill", {"X-User-Id": str(user)})
    if r.status != 200:
        fail(f"after the Redis restart, buyer {user} (who bought before it) cannot buy a new"
             f" voucher: {r.status} {r.raw!r}")


@test
def postgres_stopped_and_started_mid_sale():
    st = the_stack()
    v = st.new_voucher()
    load = Load(v, nginx_workers(st, 8)).start()
    time.sleep(2.0)
    data = os.path.join(RUN_DIR, "pg", "data")
    bin_dir = os.path.dirname(snapshot(st.pid("postgres")).argv[0])
    as_pg = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
    t_fault = time.monotonic()
    p = subprocess.run(as_pg + [os.path.join(bin_dir, "pg_ctl"), "-D", data, "-m", "fast", "-w",
                                "-t", "30", "stop"], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        load.stop()
        fail(f"pg_ctl stop: {p.stdout}{p.stderr}")
    t_down = time.monotonic()
    time.sleep(OUTAGE_S)
    t_heal = time.monotonic()
    p = subprocess.run(["setsid", "-w"] + as_pg + [
        os.path.join(bin_dir, "pg_ctl"), "-D", data, "-l", os.path.join(RUN_DIR, "pg", "postgres.log"),
        "-w", "-t", "30", "start"], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        load.stop()
        fail(f"pg_ctl start: {p.stdout}{p.stderr}")
    t_up = time.monotonic()
    with open(os.path.join(data, "postmaster.pid")) as f:
        st.set_pid("postgres", int(f.readline()))
    time.sleep(6.0)
    recs = load.stop()

    figs = timeline(recs, t_fault, t_up)
    figs["pgStopTookS"] = round(t_down - t_fault, 2)
    figs["pgStartTookS"] = round(t_up - t_heal, 2)
    down = [r for r in recs if t_down <= r.t0 and r.t1 < t_heal]
    wrong = Counter(outcome(r) for r in down if not (r.status == 503 and r.code == "unavailable"))
    if not down or wrong:
        fail(f"answered while Postgres was down, want only 503 unavailable: {tally(down)}")
    if any(r.retry_after is None for r in down):
        fail("a 503 without Retry-After")
    bound = 2000 + 1000     # PG_CONNECT_TIMEOUT_S + 1 s
    lat = [(r.t1 - r.t0) * 1000 for r in down]
    figs["downMaxLatencyMs"] = round(max(lat), 1)
    if max(lat) > bound:
        fail(f"a request hung {max(lat):.0f} ms while Postgres was down (bound {bound} ms)")
    if figs["recoveredAfterS"] > 5.0:
        fail(f"not recovered within 5 s of Postgres coming back: {figs}")
    tail = [r for r in recs if r.t0 >= recs[-1].t0 - 2.0]
    if any(r.status != 200 for r in tail):
        fail(f"the last 2 s of the run are not all 200: {tally(tail)}")
    # A request in flight while Postgres stopped may have committed and lost
    # its answer with the connection (the fast shutdown ends a backend after
    # its commit, before the result is sent; or between an early-released
    # order's commit and its wait for the flush): its 503 is of unknown
    # outcome, and the buyer's retry would meet the order.
    cut = sum(1 for r in recs if r.status == 503 and r.t0 < t_down and r.t1 >= t_fault)
    figs.update(check_invariants(st, v, recs, "postgres", unknown_extra=cut))
    figs.update(check_lock_leases(st, "postgres"))
    show("postgres_restart", figs)


def pg_ctl(st, *args):
    """pg_ctl on the stack's Postgres, as its owner ('start' last for a
    start: the new postmaster's pid is recorded)."""
    if "pg_bin" not in _state:                 # read while it runs
        _state["pg_bin"] = os.path.dirname(snapshot(st.pid("postgres")).argv[0])
    data = os.path.join(RUN_DIR, "pg", "data")
    as_pg = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
    cmd = as_pg + [os.path.join(_state["pg_bin"], "pg_ctl"), "-D", data, "-w", "-t", "30"]
    start = args[-1] == "start"
    if start:
        cmd = ["setsid", "-w"] + cmd + ["-l", os.path.join(RUN_DIR, "pg", "postgres.log")]
    p = subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        fail(f"pg_ctl {' '.join(args)}: {p.stdout}{p.stderr}")
    if start:
        with open(os.path.join(data, "postmaster.pid")) as f:
            st.set_pid("postgres", int(f.readline()))


@test
def batched_sale_loses_no_acknowledged_order_to_crashes():
    """SECKILL_STOCK=batched, where a batch's buyers are answered only after
    its transaction committed, and the commit returns after its WAL flush:
    an instance killed (-9) mid-sale, then Postgres crashed (immediate stop:
    the WAL it had not written yet is gone) and started again. The stack's Postgres runs
    without fsync, so synchronous_commit is turned on for the scenario: a
    flush then writes the WAL to the kernel, which outlives a crash of
    Postgres. Every order id answered with 200 must be in the database
    after the recovery, and the invariants hold."""
    st = the_stack()
    a1, a2 = st.app_ports
    pg_ctl(st, "status")                       # finds pg_ctl while Postgres runs
    ss.psql("ALTER SYSTEM SET synchronous_commit = on", dsn=st.dsn)
    ss.psql("SELECT pg_reload_conf()", dsn=st.dsn)
    try:
        for name in ("app-1", "app-2"):
            stop_instance(st, name)
            respawn_instance(st, name, SECKILL_STOCK="batched")
        v = st.new_voucher()
        load = Load(v, nginx_workers(st, 8) + [("app-1", a1)] * 2 + [("app-2", a2)] * 2).start()
        time.sleep(2.0)
        victim = st.pid("app-1")
        t_kill = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        time.sleep(1.5)
        t_crash = time.monotonic()
        pg_ctl(st, "-m", "immediate", "stop")
        time.sleep(1.0)
        pg_ctl(st, "start")
        t_up = time.monotonic()
        time.sleep(4.0)
        recs = load.stop()
        wait_gone(victim)
        figs = {"beforeKill": tally([r for r in recs if r.t1 < t_kill]),
                "beforeCrash": tally([r for r in recs if t_kill < r.t0 and r.t1 < t_crash]),
                "afterRestart": tally([r for r in recs if r.t0 >= t_up + 1.0])}
        # A batch whose COMMIT Postgres had flushed when the immediate stop
        # ended its backend, before the result was sent, stands after the
        # recovery: its buyers' 503s are of unknown outcome (a retry meets
        # the order), like the cut commits of postgres_stopped_and_started.
        cut = sum(1 for r in recs if r.status == 503 and r.t0 < t_crash and r.t1 >= t_crash)
        figs.update(check_invariants(st, v, recs, "batched-crash", unknown_extra=cut))
        figs["cutAtCrash503"] = cut
        show("batched_crash", figs)
        if not any(r.status == 200 for r in recs if t_kill < r.t0 and r.t1 < t_crash):
            fail(f"no sale between the kill and the crash: {figs}")
        if not any(r.status == 200 for r in recs if r.t0 >= t_up + 1.0):
            fail(f"no sale after Postgres came back: {figs}")
    finally:
        ss.psql("ALTER SYSTEM RESET synchronous_commit", dsn=st.dsn)
        ss.psql("SELECT pg_reload_conf()", dsn=st.dsn)
        for name in ("app-1", "app-2"):        # back as the launcher started them
            if ss.pid_alive(st.pid(name)):
                stop_instance(st, name)
            respawn_instance(st, name)


@test
def lock_holder_paused_past_its_lease():
    """Instance 1 runs with a 1.5 s lease and pauses 400 ms after taking a
    lock (DEMO_PAUSE_MS). While it holds user X's lock it is SIGSTOPped until
    the lease is gone; instance 2 then sells to X; SIGCONT: instance 1's write
    carries a stale fencing token and is refused. One order; counted."""
    st = the_stack()
    lease_ms, pause_ms = 1500, 400
    stop_instance(st, "app-1")
    respawn_instance(st, "app-1", LOCK_LEASE_MS=lease_ms, DEMO_PAUSE_MS=pause_ms)
    try:
        paused_holder(st, lease_ms)
    finally:                      # instance 1 as the launcher started it
        stop_instance(st, "app-1")
        respawn_instance(st, "app-1")


def paused_holder(st, lease_ms):
    a1, a2 = st.app_ports
    before = st.stats(a1)["lock"].get("staleTokenRejections", 0)
    v = st.new_voucher()
    load = Load(v, nginx_workers(st, 4), rate=10).start()
    user = 4_300_000_000_000 + os.getpid()
    key = f"lock:order:{user}"
    first = {}

    def buy_on_1():
        try:
            first["r"] = ss.request(a1, "POST", f"/voucher/{v}/seckill", {"X-User-Id": str(user)},
                                    timeout=30)
        except Exception as e:   # noqa: BLE001 - reported below
            first["r"] = e

    pid = st.pid("app-1")
    t = threading.Thread(target=buy_on_1, daemon=True)
    stopped = False
    try:
        t.start()
        deadline = time.monotonic() + 5
        while st.redis("EXISTS", key) != "1":
            if time.monotonic() > deadline:
                fail(f"instance 1 never held {key}")
            time.sleep(0.01)
        os.kill(pid, signal.SIGSTOP)
        stopped = True
        t_stop = time.monotonic()
        while st.redis("EXISTS", key) == "1":
            if time.monotonic() - t_stop > lease_ms / 1000 + 3:
                fail(f"{key} outlived its lease while its holder was stopped")
            time.sleep(0.02)
        expired_after = time.monotonic() - t_stop
        second = ss.request(a2, "POST", f"/voucher/{v}/seckill", {"X-User-Id": str(user)})
        os.kill(pid, signal.SIGCONT)
        stopped = False
        t.join(30)
    finally:
        if stopped:
            os.kill(pid, signal.SIGCONT)
        recs = load.stop()
    r1 = first.get("r")
    if second.status != 200:
        fail(f"instance 2, lock expired: {second.status} {second.raw!r}")
    if not isinstance(r1, ss.Response) or r1.status != 409 or \
            r1.body.get("error") != "already_ordered":
        fail(f"instance 1 after SIGCONT: want 409 already_ordered (stale token), got {r1!r}")
    rows = ss.psql(f"SELECT id FROM tb_voucher_order WHERE voucher_id = {v} AND user_id = {user}",
                   dsn=st.dsn)
    if [r[0] for r in rows] != [second.body["orderId"]]:
        fail(f"orders of user {user}: {rows}, want exactly instance 2's {second.body['orderId']}")
    time.sleep(1.2)              # counters reach /stats within a second
    after = st.stats(a1)["lock"].get("staleTokenRejections", 0)
    if after - before < 1:
        fail(f"lock.staleTokenRejections on instance 1: {before} -> {after}")
    figs = {"leaseMs": lease_ms, "lockGoneAfterStopS": round(expired_after, 2),
            "firstAnswer": f"{r1.status} {r1.body.get('error')}: {r1.body.get('message')}",
            "secondAnswer": second.status, "staleTokenRejections": after - before,
            "loadDuring": tally(recs)}
    figs.update(check_invariants(st, v, recs, "sigstop", [second.body["orderId"]]))
    show("sigstop_lock_holder", figs)


# ---------------------------------------------------------------- Redis failover

HA_RUN_DIR = os.path.join(ss.TEST_TMP, "faults-ha-stack")
FAILOVER_RUN_S = 8.0            # load after the master is killed
FAILOVER_BOUND_S = 15.0         # kill -> first 200 must be within this


class HAStack(Stack):
    """The same stack with Redis under Sentinel (REDIS_HA=1); kit.Stack's
    failover helpers, their errors as test failures."""

    def __init__(self):
        kit.Stack.__init__(self, HA_RUN_DIR, ss.stack_settings(
            {"INSTANCES": 2, "DEMO_RANDOM_USER": 0, "THREADS": 4, "LOG_LEVEL": "warn",
             "REDIS_HA": 1}), _SCRUB)
        self.spawned = []
        self.images = {}

    def cli(self, port, *args, timeout=5):
        try:
            return kit.redis_cli(port, *args, timeout=timeout)
        except kit.KitError as e:
            fail(str(e))

    def master(self):
        try:
            return self.redis_master()
        except kit.KitError as e:
            fail(str(e))

    def wait_new_master(self, old_port, timeout=30):
        try:
            return self.wait_failover(old_port, timeout)
        except kit.KitError as e:
            fail(str(e))

    def wait_replica(self, port, timeout=30):
        try:
            return kit.Stack.wait_replica(self, port, timeout)
        except kit.KitError as e:
            fail(str(e))

    def restart_node(self, n, master_port):
        try:
            self.spawned.append(self.restart_redis_node(n, master_port))
        except kit.KitError as e:
            fail(str(e))


def the_ha_stack():
    if "ha" not in _state:
        _state["ha"] = load_kit.start_stack(HAStack(), " (REDIS_HA=1)", 180)
    return _state["ha"]


def evalsha_calls(st, port):
    return kit.redis_info_count(port, "commandstats", "cmdstat_evalsha:", "calls")


def readonly_errors(st, port):
    return kit.redis_info_count(port, "errorstats", "errorstat_READONLY:", "count")


def failover_checks(st, v, recs, t_fault, label, new_port):
    """What holds for both failovers: answers during the switch, recovery,
    invariants, every instance on the new master. The figures."""
    after = [r for r in recs if r.t0 >= t_fault]
    first_ok = min((r.t1 for r in after if r.status == 200), default=None)
    switch = [r for r in after if first_ok is None or r.t0 < first_ok]
    wrong = Counter(outcome(r) for r in switch
                    if not (r.status == 200 or (r.status == 503 and r.code == "unavailable")))
    lat = [(r.t1 - r.t0) * 1000 for r in switch]
    figs = {"faultToFirst200S": round(first_ok - t_fault, 2) if first_ok else None,
            "duringSwitch": tally(switch),
            "switchMaxLatencyMs": round(max(lat), 1) if lat else 0,
            "after": tally([r for r in after if first_ok is not None and r.t0 >= first_ok])}
    if first_ok is None or first_ok - t_fault > FAILOVER_BOUND_S:
        fail(f"{label}: no sale within {FAILOVER_BOUND_S} s of the fault: {figs}")
    if wrong:
        fail(f"{label}: answers during the switch other than 200 and 503 unavailable: {dict(wrong)}")
    if any(r.status == 503 and r.retry_after is None for r in switch):
        fail(f"{label}: a 503 without Retry-After")
    bound = REDIS_TIMEOUT_MS + 1000
    if lat and max(lat) > bound:
        fail(f"{label}: a request took {max(lat):.0f} ms during the switch (bound {bound} ms)")
    odd = [r for r in after if first_ok is not None and r.t0 >= first_ok and r.status != 200]
    for r in odd[:10]:
        print(f"    after recovery: user {r.user} via {r.instance}: {outcome(r)}: {r.message} "
              f"(+{r.t0 - t_fault:.2f} s)", flush=True)
    tail = [r for r in recs if r.t0 >= recs[-1].t0 - 2.0]
    if any(r.status != 200 for r in tail):
        fail(f"{label}: the last 2 s of the run are not all 200: {tally(tail)}")
    figs.update(check_invariants(st, v, recs, label))
    seen = []
    for port in st.app_ports:
        red = st.stats(port).get("redis") or {}
        if red.get("master") != f"127.0.0.1:{new_port}" or red.get("failovers", 0) < 1:
            fail(f"{label}: instance {port} /stats redis: {red}, want master 127.0.0.1:{new_port}")
        seen.append(red["failovers"])
    figs["instanceFailoversSoFar"] = seen     # more than one per fault: Sentinel failed over twice
    return figs


@test
def redis_master_sigkilled_mid_sale_sentinel_promotes_a_replica():
    st = the_ha_stack()
    v = st.new_voucher()
    load = Load(v, nginx_workers(st, 8)).start()
    time.sleep(2.0)
    n, old = st.master()
    pid = st.pid(f"redis-{n}")
    t_kill = time.monotonic()
    try:
        os.kill(pid, signal.SIGKILL)
        wait_gone(pid)
        promoted_s, new = st.wait_new_master(old)
        time.sleep(max(0.0, t_kill + FAILOVER_RUN_S - time.monotonic()))
    finally:
        recs = load.stop()
    figs = failover_checks(st, v, recs, t_kill, "failover-kill", new)
    figs["sentinelPromotedAfterS"] = round(promoted_s, 2)
    # The killed master comes back as a replica of the new one.
    st.restart_node(n, new)
    show("redis_failover_sigkill", figs)
    print(f"    SIGKILL of the Redis master -> first 200 after {figs['faultToFirst200S']} s "
          f"(Sentinel named the new master after {figs['sentinelPromotedAfterS']} s)", flush=True)


@test
def redis_master_sigstopped_comes_back_as_a_replica_nobody_writes_to():
    st = the_ha_stack()
    v = st.new_voucher()
    load = Load(v, nginx_workers(st, 8)).start()
    time.sleep(2.0)
    n, old = st.master()
    pid = st.pid(f"redis-{n}")
    readonly_before = readonly_errors(st, old)
    t_stop = time.monotonic()
    stopped = True
    try:
        os.kill(pid, signal.SIGSTOP)
        promoted_s, new = st.wait_new_master(old)
        time.sleep(0.5)
        os.kill(pid, signal.SIGCONT)
        stopped = False
        t_cont = time.monotonic()
        st.wait_replica(old)
        demoted_s = time.monotonic() - t_cont
        # Commands sent before the failover and queued while it was stopped
        # ran when it resumed: what ran from then on must be replication only.
        time.sleep(1.0)
        evalsha_replica = evalsha_calls(st, old)
        readonly_replica = readonly_errors(st, old)
        time.sleep(3.0)
        evalsha_end = evalsha_calls(st, old)
        readonly_end = readonly_errors(st, old)
        # Every kind: the workers' and threads' connections, the reset
        # subscriber's (pub/sub) too.
        ours = [l for l in st.cli(old, "CLIENT", "LIST").splitlines() if "name=seckill:" in l]
    finally:
        if stopped:
            os.kill(pid, signal.SIGCONT)
        recs = load.stop()
    figs = failover_checks(st, v, recs, t_stop, "failover-stop", new)
    figs.update({"sentinelPromotedAfterS": round(promoted_s, 2),
                 "oldMasterReplicaAfterContS": round(demoted_s, 2),
                 "readonlyRepliesOnOldMaster": readonly_end - readonly_before})
    show("redis_failover_sigstop", figs)
    if evalsha_end != evalsha_replica or readonly_end != readonly_replica:
        fail(f"scripts ran on the old master after it became a replica: EVALSHA "
             f"{evalsha_replica} -> {evalsha_end}, READONLY answers {readonly_replica} -> {readonly_end}")
    if ours:
        fail(f"connections of the instances on the old master (now a replica): {ours}")
    print(f"    SIGSTOP of the Redis master -> first 200 after {figs['faultToFirst200S']} s; "
          f"back as a replica {figs['oldMasterReplicaAfterContS']} s after SIGCONT", flush=True)


# ---------------------------------------------------------------- resources

def latency_kept(res, what):
    """The normal requests are served about as fast with the slow clients
    open as without. The median is compared (a burst of the machine's other
    work moves a p99 of 600 requests, not their median), with a few ms of
    slack for a 2-core machine's scheduling; the p99 only against a collapse
    (a server that serves the slow clients first answers in seconds)."""
    b50 = max(res["unloaded1"]["p50"], res["unloaded2"]["p50"])
    b99 = max(res["unloaded1"]["p99"], res["unloaded2"]["p99"])
    l50, l99 = res["loaded"]["p50"], res["loaded"]["p99"]
    if l50 > 2 * b50 + 5:
        fail(f"p50 with {what} {l50:.2f} ms > 2 x unloaded {b50:.2f} ms + 5 ms")
    if l99 > 4 * b99 + 100:
        fail(f"p99 with {what} {l99:.2f} ms > 4 x unloaded {b99:.2f} ms + 100 ms")


@test
def slowloris_1000_through_nginx():
    st = the_stack()
    v = st.new_voucher()
    res = slowloris.run("127.0.0.1", st.nginx, 1000, "trickle", 3.0, "POST",
                        f"/voucher/{v}/seckill", 600, 4, user_base=5_000_000_000_000 + os.getpid() * 10000,
                        log=lambda m: print("    " + m, flush=True))
    base = max(res["unloaded1"]["p99"], res["unloaded2"]["p99"])
    figs = {"unloadedP99ms": round(base, 2), "loadedP99ms": round(res["loaded"]["p99"], 2),
            "unloadedP50ms": round(res["unloaded1"]["p50"], 2),
            "loadedP50ms": round(res["loaded"]["p50"], 2),
            "slowOpened": res["slowOpened"], "slowStillOpen": res["slowStillOpen"],
            "failures": len(res["failures"])}
    show("slowloris_nginx", figs)
    if res["slowOpened"] < 1000:
        fail(f"only {res['slowOpened']} of 1000 slow connections opened")
    if res["failures"]:
        fail(f"{len(res['failures'])} normal requests failed: {res['failures'][:5]}")
    latency_kept(res, "1000 slow clients")


@test
def slowloris_1000_idle_against_an_instance():
    """The instance itself (MAX_CONNECTIONS 1024 by default) keeps serving
    with 1,000 idle connections open on it."""
    srv = ss.Server("faults-idle", {"ADMIN_TOKEN": "t0k3n-faults", "THREADS": 4})
    try:
        r = srv.post("/admin/vouchers", {"Authorization": "Bearer t0k3n-faults"},
                     {"title": "idle", "stock": STOCK, "beginTime": "2020-01-01T00:00:00Z",
                      "endTime": "2099-01-01T00:00:00Z"})
        v = r.body["voucherId"]
        res = slowloris.run("127.0.0.1", srv.port, 1000, "idle", 3.0, "POST",
                            f"/voucher/{v}/seckill", 600, 4,
                            user_base=5_100_000_000_000 + os.getpid() * 10000,
                            log=lambda m: print("    " + m, flush=True))
        base = max(res["unloaded1"]["p99"], res["unloaded2"]["p99"])
        show("slowloris_instance", {"unloadedP99ms": round(base, 2),
                                    "loadedP99ms": round(res["loaded"]["p99"], 2),
                                    "slowOpened": res["slowOpened"],
                                    "failures": len(res["failures"])})
        if res["slowOpened"] < 1000 or res["failures"]:
            fail(f"opened {res['slowOpened']}, failures {res['failures'][:5]}")
        latency_kept(res, "1000 idle clients")
    finally:
        srv.stop_ok()


def open_partial(port, n):
    socks, refused = [], 0
    for _ in range(n):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        except OSError:
            refused += 1
    return socks, refused


def closed_by_server(s, wait):
    s.settimeout(wait)
    try:
        return s.recv(4096) == b""
    except socket.timeout:
        return False
    except OSError:
        return True


def try_health(port):
    try:
        r = ss.request(port, "GET", "/health", timeout=3)
        return str(r.status)
    except (OSError, http.client.HTTPException) as e:
        return type(e).__name__


@test
def connection_limit_and_idle_timeout_small_values():
    """MAX_CONNECTIONS=32, CONN_TIMEOUT_S=2: 32 stalled requests fill the
    instance; a 33rd connection is not served while they hold the slots (it
    waits in the listen backlog); the stalled ones are closed within the
    timeout and the instance serves again, the waiting one included."""
    limit, timeout_s = 32, 2
    srv = ss.Server("faults-limits", {"MAX_CONNECTIONS": limit, "CONN_TIMEOUT_S": timeout_s,
                                      "THREADS": 2})
    try:
        t_open = time.monotonic()
        socks, refused = open_partial(srv.port, limit)
        time.sleep(0.2)
        waiting = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        waiting.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        waiting.settimeout(0.5)
        try:
            early = waiting.recv(4096)
        except socket.timeout:
            early = None
        closed_at = []
        for s in socks:
            if closed_by_server(s, max(0.1, t_open + timeout_s + 3 - time.monotonic())):
                closed_at.append(time.monotonic() - t_open)
            s.close()
        waiting.settimeout(5)
        try:
            late = waiting.recv(4096)
        except OSError as e:
            late = repr(e).encode()
        waited = time.monotonic() - t_open
        waiting.close()
        again = try_health(srv.port)
        figs = {"maxConnections": limit, "connTimeoutS": timeout_s, "opened": len(socks),
                "refused": refused, "servedWhileFull": early is not None,
                "stalledClosedByServer": len(closed_at),
                "stalledClosedAfterS": round(max(closed_at), 2) if closed_at else None,
                "waitingServedAfterS": round(waited, 2),
                "waitingAnswer": late[:15].decode("latin-1"), "afterwards": again}
        show("limits_idle", figs)
        if early is not None:
            fail(f"a connection beyond MAX_CONNECTIONS={limit} was served at once: {early[:60]!r}")
        if len(closed_at) != len(socks) or max(closed_at) > timeout_s + 1.5:
            fail(f"stalled connections not closed within CONN_TIMEOUT_S={timeout_s} + 1.5 s: {figs}")
        if not late.startswith(b"HTTP/1.1 200") or again != "200" or not srv.alive():
            fail(f"not serving after the stalled connections were closed: {figs}")
    finally:
        srv.stop_ok()


@test
def trickling_connections_against_small_limits():
    """32 connections that send one header line every second (below
    CONN_TIMEOUT_S=2) keep their slots: documented, this is what nginx in front
    is for (client_header_timeout cuts a whole header at 10 s). When they stop,
    the instance recovers within the timeout."""
    limit, timeout_s = 32, 2
    srv = ss.Server("faults-trickle", {"MAX_CONNECTIONS": limit, "CONN_TIMEOUT_S": timeout_s,
                                       "THREADS": 2})
    try:
        slow = slowloris.SlowClients("127.0.0.1", srv.port, limit, "trickle", 1.0).open()
        time.sleep(timeout_s * 2 + 1)
        still = slow.poll_closed()
        during = try_health(srv.port)
        slow._stop.set()                        # stop trickling, keep them open
        time.sleep(timeout_s + 2)
        left = slow.poll_closed()
        slow.close()
        time.sleep(0.2)
        after = try_health(srv.port)
        figs = {"trickling": limit, "stillOpenAfter2xTimeout": still, "requestDuring": during,
                "openAfterTricklingStopped": left, "afterwards": after}
        show("limits_trickle", figs)
        if left:
            fail(f"{left} connections stayed open after they stopped sending: {figs}")
        if after != "200" or not srv.alive():
            fail(f"the instance did not recover: {figs}")
    finally:
        srv.stop_ok()


WRK_CONNECTIONS = 32


def wrk_sale(st, v, seconds, out_dir):
    """wrk with loadtest/wrk_sale.lua (distinct users, order ids captured)
    through nginx: kit.run_wrk's figures."""
    os.makedirs(out_dir, exist_ok=True)
    try:
        return kit.run_wrk(f"http://127.0.0.1:{st.nginx}/voucher/{v}/seckill", WRK_CONNECTIONS,
                           seconds, out_dir, 6_000_000_000_000 + (os.getpid() % 1000) * 10 ** 9,
                           threads=2, latency=False)
    except kit.KitError as e:
        fail(f"wrk failed: {e}")


@test
def memory_bounded_over_a_sale():
    """RSS of both instances sampled every second of a sale through nginx
    (wrk, distinct buyers, FAULTS_SALE_S seconds): after the first quarter
    it may settle, not climb."""
    st = the_stack()
    v = st.new_voucher(10 ** 9)
    pids = {n: st.pid(n) for n in ("app-1", "app-2")}
    before = {n: rss_kib(p) for n, p in pids.items()}
    samples = {n: [] for n in pids}
    done = threading.Event()

    def sampler():
        while not done.wait(1.0):
            for n, p in pids.items():
                samples[n].append(rss_kib(p))

    t = threading.Thread(target=sampler, daemon=True)
    t.start()
    try:
        w = wrk_sale(st, v, SALE_S, os.path.join(ss.TEST_TMP, "faults-rss"))
    finally:
        done.set()
        t.join(5)
    time.sleep(1.0)
    after = {n: rss_kib(p) for n, p in pids.items()}
    statuses = w["statuses"]
    errors = w["socketErrors"]
    figs = {"saleS": SALE_S, "requests": w["requests"],
            "reqPerS": round(w["requests"] / SALE_S), "statuses": statuses,
            "wrkErrors": {**errors, "status": w["nonHttpErrors"]}, "p99ms": round(w["p99Ms"], 1)}
    problems = []
    for n in pids:
        s = samples[n] or [after[n]]
        q = max(1, len(s) // 4)
        warm = s[q - 1]
        figs[n] = {"rssBeforeKiB": before[n], f"rssAt{q}sKiB": warm, "rssMaxKiB": max(s),
                   "rssAfterKiB": after[n]}
        if after[n] > warm * 1.25 + 8 * 1024:
            problems.append(f"{n}: RSS {warm} KiB at {q} s -> {after[n]} KiB at the end")
    ok = int(statuses.get("200", 0))
    # wrk stops at -d without reading the answers in flight (one per
    # connection): those buyers may have bought.
    unknown = sum(n for k, n in statuses.items() if k in ("502", "504")) + \
        errors["timeout"] + errors["read"] + errors["write"] + WRK_CONNECTIONS
    show("memory", figs)
    verify("", st, v, w["idsFile"], ok, unknown)
    if set(statuses) != {"200"}:
        fail(f"answers other than 200 during the sale: {statuses}")
    # A sanitizer build keeps freed memory in quarantine (ASan) or shadow
    # state: its RSS says nothing about ours. The bound is checked on the
    # plain build (make test); a leak shows up as LeakSanitizer's exit code.
    if problems and os.environ.get("SECKILL_SANITIZER"):
        print(f"    RSS bound not checked under {os.environ['SECKILL_SANITIZER']}: "
              + "; ".join(problems), flush=True)
    elif problems:
        fail("RSS grows over the sale: " + "; ".join(problems))


@test
def no_lock_outlives_its_lease():
    """The last word: after every scenario and a lease of quiet, no per-user
    lock is left in Redis."""
    st = the_stack()
    deadline = time.monotonic() + LOCK_LEASE_MS / 1000 + 2
    keys = lock_keys(st)
    while keys and time.monotonic() < deadline:
        time.sleep(0.5)
        keys = lock_keys(st)
    show("locks_at_the_end", {"lockKeys": len(keys)})
    if keys:
        fail(f"locks still held a lease after the load stopped: {dict(list(keys.items())[:5])}")


def teardown():
    ha = _state.get("ha")
    if ha is not None or os.path.isdir(os.path.join(HA_RUN_DIR, "pids")):
        p = (ha or HAStack()).run("stop")
        if p.returncode != 0:
            print(p.stderr)
        for proc in (ha.spawned if ha else []):
            proc.wait(timeout=10)
    st = _state.get("stack")
    p = (st or Stack()).run("stop")
    if p.returncode != 0:
        print(p.stderr)
    if st is not None:
        for proc in st.spawned:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
    path = os.environ.get("FAULTS_FIGURES") or os.path.join(ss.TEST_TMP, "faults-figures.json")
    with open(path, "w") as f:
        json.dump(FIG, f, indent=1, sort_keys=True)
    print(f"\nfigures (also in {path}):")
    for name, figs in FIG.items():
        print(f"  {name}: {json.dumps(figs, sort_keys=True)}")


if __name__ == "__main__":
    ss.main(teardown)
