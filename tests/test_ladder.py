#!/usr/bin/env python3
"""The demo ladder end to end, as CI runs it: loadtest/ladder --quick
--no-failover (the failover steps 12-15 run in make ladder).

The ladder starts a stack of its own (scripts/stack.sh in $TEST_TMP/ladder, free
ports: Postgres, Redis, two instances, nginx), walks every step with real load
and asserts each step's expected outcome itself (exit 1 on a miss). Quick mode
only halves the buyers of the stock steps; every assertion stays. Here: the
ladder exits 0, its JSON shows each failure where the ladder expects one and none
where they do not, the table, report and chart are written, and afterwards the
unique constraint is back, the instances run the safe defaults, and stopping
the stack (by PID) leaves no process behind. Prints "N passed, M failed".
"""

import atexit
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seckill_server as ss  # noqa: E402
from seckill_server import fail, test  # noqa: E402

ROOT = ss.ROOT
LADDER = os.path.join(ROOT, "loadtest", "ladder")
RUN_DIR = os.path.join(ss.TEST_TMP, "ladder")
OUT = os.path.join(ss.TEST_TMP, "ladder-out")
UNIQUE = "uq_voucher_order_user_voucher"
LADDER_TIMEOUT = 600          # seconds; the quick ladder takes about three minutes
# The lock-service steps after the demo's: a storm per backend of another
# service, then per backend its holder killed and its service stopped.
LOCK_BACKENDS = ("reentrant", "zk", "pg-table", "pg-advisory")
# Then the independent Redis nodes' failures (quick mode: these three only; the
# storm, killed holder and outage of multilock and redlock run in the full ladder).
NODE_STEPS = ["redlock-restart", "redlock-delayed", "multilock-node-down"]
LOCK_STEPS = ([f"storm-{b}" for b in LOCK_BACKENDS[1:]] + [f"crash-{b}" for b in LOCK_BACKENDS]
              + [f"outage-{b}" for b in LOCK_BACKENDS] + NODE_STEPS)

# Settings of the caller's environment that must not reach the ladder's stack
# (besides ss.STACK_SCRUB).
_SCRUB = ("DEMO_DELAY_MS", "DEMO_PAUSE_MS", "LOCK_LEASE_MS", "WATCHDOG_TIMEOUT_MS",
          "LADDER_RUN_DIR", "LADDER_OUT")

state = {"proc": None, "rc": None, "doc": None, "output": ""}


def env():
    return ss.stack_run_env(_SCRUB, PYTHONDONTWRITEBYTECODE=1)


def stop_stack():
    """Stops whatever the ladder left in RUN_DIR, by PID (scripts/stack.sh stop)."""
    return ss.run_stack("stop", RUN_DIR, 120, _SCRUB, PYTHONDONTWRITEBYTECODE=1)


def cleanup():
    p = state["proc"]
    if p is not None and p.poll() is None:
        p.terminate()                   # the ladder restores the constraint and stops
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)
    if os.path.isdir(os.path.join(RUN_DIR, "pids")):
        stop_stack()


atexit.register(cleanup)


@test
def the_failover_steps_of_other_stacks_come_last_and_only_without_no_failover():
    # Their definitions only: each needs a stack of its own, PG_HA=1 or
    # REDIS_CLUSTER=1 (make ladder runs them): the Postgres steps, then the
    # Redis Cluster steps, last.
    sys.path.insert(0, os.path.join(ROOT, "loadtest"))
    from ladder.cli import parse_args, select_steps
    from ladder.steps import STEPS
    n = len(STEPS)
    pg, cl = STEPS[-5:-3], STEPS[-3:]
    got = [(s["key"], s["num"], s["env"].get("PG_HA"), s["synchronous_commit"]) for s in pg]
    want = [("pg-async", n - 4, 1, "local"), ("pg-sync", n - 3, 1, "on")]
    if got != want:
        fail(f"the Postgres failover steps are {got}, want {want}")
    if "PG_HA=0" not in pg[0]["env"].get("INSTANCE_ENV_1", "") or \
            "PG_STATEMENT_TIMEOUT_MS" not in pg[1]["env"]:
        fail(f"pg-async's instances must accept synchronous_commit = local (PG_HA=0), pg-sync's "
             f"answer a blocked commit within PG_STATEMENT_TIMEOUT_MS: {[s['env'] for s in pg]}")
    got = [(s["key"], s["num"], s["env"].get("REDIS_CLUSTER"), s["stock"],
            s["env"].get("REDIS_ORDER_DURABILITY", "aof"), s["env"].get("CONSUMERS"))
           for s in cl]
    want = [("cluster-none", n - 2, 1, "redis", "none", 0), ("cluster-aof", n - 1, 1, "redis", "aof", 0),
            ("cluster-wait", n, 1, "redis", "wait", 0)]
    if got != want:
        fail(f"the Redis Cluster steps are {got}, want {want}")
    others = {"pg-async", "pg-sync", "cluster-none", "cluster-aof", "cluster-wait"}
    keys = {s["key"] for s in select_steps(parse_args(["--quick", "--no-failover"]))}
    if keys & others:
        fail(f"--no-failover (this test's ladder) still selects {sorted(keys & others)}")
    nums = ",".join(str(s["num"]) for s in pg + cl)
    picked = select_steps(parse_args(["--steps", nums]))
    if [s["key"] for s in picked] != [s["key"] for s in pg + cl]:
        fail(f"--steps {nums} selects {[s['key'] for s in picked]}")


@test
def ladder_runs_and_every_step_shows_its_outcome():
    # The failover steps (12-15: a stack with Redis under Sentinel, two minutes
    # more) are left to make ladder; the failover itself is in CI through
    # test_faults.py and test_sentinel.py.
    args = [sys.executable, LADDER, "--quick", "--no-failover", "--keep-stack", "--run-dir",
            RUN_DIR, "--out", OUT]
    t0 = time.monotonic()
    log_path = os.path.join(ss.TEST_TMP, "ladder-output.txt")
    with open(log_path, "w") as log:
        state["proc"] = subprocess.Popen(args, env=env(), cwd=ROOT, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            state["rc"] = state["proc"].wait(timeout=LADDER_TIMEOUT)
        except subprocess.TimeoutExpired:
            cleanup()
            fail(f"the ladder did not finish within {LADDER_TIMEOUT}s:\n{ss.tail(log_path, 40)}")
    with open(log_path, encoding="utf-8", errors="replace") as f:
        state["output"] = f.read()
    print(state["output"], end="", flush=True)
    print(f"(ladder: exit {state['rc']} after {time.monotonic() - t0:.0f}s)", flush=True)
    if state["rc"] != 0:
        fail(f"loadtest/ladder --quick exited {state['rc']}")
    with open(os.path.join(OUT, "ladder.json"), encoding="utf-8") as f:
        state["doc"] = json.load(f)
    steps = {s["key"]: s for s in state["doc"]["steps"]}
    want = ["naive", "cas", "optimistic", "pessimistic", "none", "local-1", "local-2", "setnx",
            "owner", "reentrant", "batched", "redis-lost", "redis-durable"] + LOCK_STEPS
    if [s["key"] for s in state["doc"]["steps"]] != want:
        fail(f"steps {[s['key'] for s in state['doc']['steps']]}, want {want}")
    missed = [f"{s['step']} {s['key']}: {[c['text'] for c in s['checks'] if not c['ok']]}"
              for s in state["doc"]["steps"] if not s["pass"]]
    if missed:
        fail(f"steps missed their expected outcome: {missed}")
    # The figures themselves, independently of the ladder's own checks.
    s = steps
    facts = [
        (s["naive"]["oversold"] > 0 and s["naive"]["stockDrift"] != 0, "naive oversells, drifts"),
        (s["cas"]["oversold"] == 0 and s["cas"]["orders"] < s["optimistic"]["orders"],
         "cas: no oversell, fewer orders than optimistic"),
        (all(s[k]["orders"] == s[k]["initialStock"] and s[k]["oversold"] == 0
             and s[k]["stockDrift"] == 0 for k in ("optimistic", "pessimistic", "batched")),
         "optimistic, pessimistic, batched sell exactly the stock"),
        (s["none"]["duplicateUsers"] == 1 and s["none"]["orders"] > 1, "no lock: duplicates"),
        (s["local-1"]["orders"] == 1 and s["local-1"]["instances"] == 1, "local, 1 instance: 1"),
        (s["local-2"]["duplicateUsers"] == 1 and len(s["local-2"]["okByInstance"]) == 2,
         "local, 2 instances: an order on each instance"),
        (s["setnx"]["duplicateUsers"] == 1 and s["setnx"]["notOwnerReleases"] >= 1,
         "setnx: another holder's lock deleted, duplicates"),
        (s["owner"]["orders"] == 1 and s["owner"]["notOwnerReleases"] >= 1,
         "owner: release refused, 1 order"),
        (s["reentrant"]["orders"] == 1 and s["reentrant"]["renewals"] >= 1,
         "reentrant: 1 order, lease renewed"),
        (s["redis-lost"]["ackedLost"] > 0
         and s["redis-lost"]["ackedLost"] <= s["redis-lost"]["ok"],
         "redis-first with appendfsync everysec: acknowledged orders lost to the Redis kill"),
        (s["redis-durable"]["ok"] > 0 and s["redis-durable"]["ackedLost"] == 0
         and s["redis-durable"]["orders"] == s["redis-durable"]["ok"],
         "redis-first with appendfsync always: every acknowledged order a row"),
        (all(s[f"storm-{b}"]["orders"] == 1 for b in ("zk", "pg-table", "pg-advisory")),
         "zk, pg-table, pg-advisory: 1 order in the storm"),
        (all(s[f"crash-{b}"]["orders"] == 1 and s[f"crash-{b}"]["crash"]["heldBeforeKill"]
             for b in LOCK_BACKENDS), "a killed holder: 1 order"),
        (s["crash-pg-advisory"]["crash"]["freeAfterS"] < 1.0 and
         all(s[f"crash-{b}"]["crash"]["freeAfterS"] > 1.5 for b in ("reentrant", "zk", "pg-table")),
         "a killed holder's advisory lock goes at once, the others after their lease or session"),
        (all(0 <= s[f"outage-{b}"]["orders"] - s[f"outage-{b}"]["ok"]
             <= s[f"outage-{b}"]["outage"]["inFlight503"] and
             s[f"outage-{b}"]["statuses"].get("503", 0) > 0 for b in LOCK_BACKENDS),
         "a lock service down: 503s, orders = 200s (+ answers the stop cut off)"),
        (s["redlock-restart"]["orders"] == 2 and s["redlock-restart"]["duplicateUsers"] == 1
         and s["redlock-restart"]["duplicateOrders"] == 1,
         "redlock, a node restarted empty: two holders, two orders of one user (one extra, "
         "as the chart's duplicate orders show it)"),
        (s["redlock-delayed"]["orders"] == 1 and s["redlock-delayed"]["nodes"]["secondAnswer"] == 503,
         "redlock, delayed restart: one holder"),
        (s["multilock-node-down"]["nodes"]["ordersWhileDown"] == 0
         and s["multilock-node-down"]["statuses"].get("503", 0) == s["multilock-node-down"]["requests"],
         "multilock, a node down: no one buys"),
    ]
    bad = [what for ok, what in facts if not ok]
    if bad:
        fail(f"figures contradict the ladder's verdicts: {bad}")


@test
def ladder_writes_table_report_and_chart():
    if state["doc"] is None:
        fail("no ladder run to look at")
    with open(os.path.join(OUT, "ladder.txt"), encoding="utf-8") as f:
        table = f.read()
    nsteps = len(state["doc"]["steps"])
    if "oversold" not in table or len(table.strip().splitlines()) != nsteps + 1:
        fail(f"ladder.txt is not the {nsteps}-step table:\n{table}")
    if "oversold" not in state["output"] or "RESULT: every step" not in state["output"]:
        fail("the terminal output lacks the table or the result line")
    with open(os.path.join(OUT, "ladder.md"), encoding="utf-8") as f:
        md = f.read()
    if "| # | step |" not in md or "### 8. " not in md:
        fail("ladder.md lacks the table or the step sections")
    png = os.path.join(OUT, "ladder.png")
    if subprocess.run(["sh", "-c", "command -v gnuplot"], capture_output=True).returncode == 0:
        with open(png, "rb") as f:
            if f.read(8) != b"\x89PNG\r\n\x1a\n":
                fail("ladder.png is not a PNG")
        if "ladder.png" not in md:
            fail("ladder.md does not show the chart")
    else:
        print("note: no gnuplot here (make deps installs gnuplot-nox): chart not checked")
    html_path = os.path.join(OUT, "ladder.html")
    if not os.path.exists(html_path) or html_path not in state["output"]:
        fail("ladder.html not written, or its path not printed")
    with open(html_path, encoding="utf-8") as f:
        html = f.read()
    sections = html.split('<section class="card step"')[1:]
    if len(html) < 20000 or not html.rstrip().endswith("</html>") or len(sections) != nsteps:
        fail(f"ladder.html: {len(html)} chars, {len(sections)} step sections (want {nsteps})")
    for n, sec in enumerate(sections, 1):
        key = state["doc"]["steps"][n - 1]["key"]
        num = state["doc"]["steps"][n - 1]["step"]    # --quick and --no-failover leave gaps
        if key.startswith("crash-") or key in NODE_STEPS:
            continue                    # a killed holder's or a node's step has no load timeline
        missing = [w for w in (f'id="step-{num}"', "<svg", "latency per", "p99", "oversold",
                               "duplicate users", "stock drift", "expected", "reproduced")
                   if w not in sec]
        if missing or sec.count("<polyline") + sec.count("<circle") == 0:
            fail(f"ladder.html step {num} lacks {missing or 'latency points'}")


@test
def after_the_ladder_the_constraint_is_back_and_the_instances_are_safe():
    if state["rc"] != 0:
        fail("no successful ladder run")
    info = ss.stack_env_file(RUN_DIR)
    rows = ss.psql(f"SELECT count(*) FROM pg_constraint WHERE conname = '{UNIQUE}'",
                   dsn=info["PG_DSN"])
    if rows != [["1"]]:
        fail(f"{UNIQUE} is not back: {rows}")
    dups = ss.psql("SELECT count(*) FROM (SELECT 1 FROM tb_voucher_order "
                   "GROUP BY user_id, voucher_id HAVING count(*) > 1) d", dsn=info["PG_DSN"])
    if dups != [["0"]]:
        fail(f"duplicate orders left behind: {dups}")
    for url in info["INSTANCE_URLS"].split():
        port = int(url.rsplit(":", 1)[1])
        s = ss.request(port, "GET", "/stats").body
        if (s.get("lockStrategy"), s.get("stockStrategy"), s.get("unsafe")) != \
                ("reentrant", "optimistic", False):
            fail(f"{url} runs {s.get('lockStrategy')}/{s.get('stockStrategy')} "
                 f"unsafe={s.get('unsafe')} after the ladder")


@test
def stopping_the_stack_leaves_nothing_running():
    pids = ss.stack_pids(RUN_DIR)
    if state["rc"] is not None and not pids:
        fail("the ladder's stack was not running (--keep-stack)")
    p = stop_stack()
    if p.returncode != 0:
        fail(f"stack.sh stop failed: {p.stderr}")
    deadline = time.monotonic() + 10
    alive = {}
    while time.monotonic() < deadline:
        alive = {n: pid for n, pid in pids.items() if ss.pid_alive(pid)}
        if not alive:
            break
        time.sleep(0.2)
    if alive:
        fail(f"still running after stop: {alive}")


if __name__ == "__main__":
    ss.main()
