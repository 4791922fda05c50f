#!/usr/bin/env python3
"""The local stack and the load tests, end to end, as CI runs them.

scripts/stack.sh starts its own Postgres, Redis, two instances and nginx in
RUN_DIR=$TEST_TMP/stack on free ports; then a few thousand requests go
through nginx with ab and wrk (loadtest/*.sh), and loadtest/check_invariants.py
verifies in Postgres: no oversell, no user with two orders, no stock drift,
every order id a client saw exists. Both instances must have served. Then the
launcher's promises: start twice, a crash, stale pid files, a port in use,
nginx's JSON errors (413; 502 with every instance down), and stop stopping
every process by PID. Prints "N passed, M failed".
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seckill_server as ss  # noqa: E402
from seckill_server import fail, test  # noqa: E402

ROOT = ss.ROOT
LOADTEST = os.path.join(ROOT, "loadtest")
RUN_DIR = os.path.join(ss.TEST_TMP, "stack")
COMPONENTS = ("nginx", "app-1", "app-2", "redis", "postgres")

# Settings of the caller's environment that must not leak into the stack
# (besides ss.STACK_SCRUB), and this stack's settings.
_SCRUB = ("REQUESTS", "CONCURRENCY", "STOCK", "DURATION")
_SETTINGS = {"INSTANCES": 2, "DEMO_RANDOM_USER": 1, "THREADS": 4, "LOG_LEVEL": "warn"}


def stack_env(**extra):
    return ss.stack_run_env(_SCRUB, RUN_DIR=RUN_DIR, **{**_SETTINGS, **extra})


def stack(cmd, run_dir=RUN_DIR, timeout=90, **extra):
    return ss.run_stack(cmd, run_dir, timeout, _SCRUB, **{**_SETTINGS, **extra})


def pids(run_dir=RUN_DIR):
    """{component: pid} from the pid files."""
    return ss.stack_pids(run_dir)


def unregister_pids(pid_list):
    for pid in pid_list:
        ss.unregister_pid(pid)


def env_file():
    return ss.stack_env_file(RUN_DIR)


def base_port():
    return int(env_file()["NGINX_PORT"])


def loadtest(script, timeout=120, **extra):
    env = stack_env(LOADTEST_OUT=os.path.join(RUN_DIR, "loadtest"), EXPECT_INSTANCES=2, **extra)
    # The target, its token, DSN and access log come from RUN_DIR/stack.env.
    p = subprocess.run([os.path.join(LOADTEST, script)], capture_output=True, text=True,
                       timeout=timeout, env=env, cwd=ROOT)
    return p


def run_result(script, **extra):
    path = os.path.join(ss.TEST_TMP, f"result-{script}-{time.monotonic_ns()}.json")
    p = loadtest(script, LOADTEST_RESULT=path, **extra)
    sys.stdout.write(p.stdout)
    if p.returncode != 0:
        fail(f"{script} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    with open(path) as f:
        return json.load(f)


def check(*args):
    env = dict(os.environ, PG_DSN=env_file()["PG_DSN"])
    return subprocess.run([sys.executable, os.path.join(LOADTEST, "check_invariants.py"), *args],
                          capture_output=True, text=True, timeout=60, env=env)


def new_voucher(stock):
    return int(ss.new_voucher(base_port(), env_file()["ADMIN_TOKEN"], stock, "t"))


def both_instances(res):
    served = [n for _name, n in res["instances"] if n > 0]
    if len(served) < 2:
        fail(f"both instances must serve requests: {res['instances']}")


# ---------------------------------------------------------------- tests

@test
def start_brings_up_everything_on_loopback():
    t0 = time.monotonic()
    p = stack("start")
    ss.register_stack_pids(RUN_DIR)   # run.sh kills them if this test dies
    if p.returncode != 0:
        fail(f"stack.sh start exited {p.returncode}:\n{p.stderr}")
    took = time.monotonic() - t0
    env = env_file()
    for k in ("BASE_URL", "PG_DSN", "REDIS_URL", "ADMIN_TOKEN", "NGINX_PORT", "INSTANCE_PORTS",
              "NGINX_ACCESS_LOG"):
        if not env.get(k):
            fail(f"env file lacks {k}: {env}")
    got = pids()
    if sorted(got) != sorted(COMPONENTS):
        fail(f"pid files {sorted(got)}, want {sorted(COMPONENTS)}")
    for name, pid in got.items():
        if not ss.pid_alive(pid):
            fail(f"{name} pid {pid} is not running")
    r = ss.request(base_port(), "GET", "/health")
    if r.status != 200:
        fail(f"GET /health through nginx: {r.status}")
    for port in env["INSTANCE_PORTS"].split():
        if ss.request(int(port), "GET", "/ready").status != 200:
            fail(f"instance on {port} not ready")
    # Everything listens on 127.0.0.1 only.
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True).stdout
    mine = set(got.values())
    for line in out.splitlines():
        m = re.search(r"pid=(\d+)", line)
        if not m:
            continue
        pid = int(m.group(1))
        owner = pid
        try:
            ppid = int(open(f"/proc/{pid}/stat").read().split(") ")[1].split()[1])
        except (OSError, IndexError, ValueError):
            ppid = 0
        if owner in mine or ppid in mine:
            local = line.split()[3]
            if not local.startswith("127.0.0.1:"):
                fail(f"a stack process listens beyond loopback: {line}")
    print(f"    started in {took:.1f}s", flush=True)


@test
def start_twice_reuses_the_running_stack():
    before = pids()
    p = stack("start")
    if p.returncode != 0 or "already running" not in p.stderr:
        fail(f"second start: exit {p.returncode}, stderr:\n{p.stderr}")
    if pids() != before:
        fail(f"second start changed the processes: {before} -> {pids()}")
    p = stack("status")
    if p.returncode != 0 or "running" not in p.stdout:
        fail(f"status: exit {p.returncode}:\n{p.stdout}{p.stderr}")


@test
def ab_sale_through_nginx_keeps_every_invariant():
    res = run_result("ab_sale.sh", REQUESTS=2000, CONCURRENCY=50, STOCK=300)
    st = res["statuses"]
    if st.get("200") != 300 or st.get("409") != 1700 or res["requests"] != 2000:
        fail(f"want 300 x 200 and 1700 x 409 of 2000: {st}, requests {res['requests']}")
    v = res["voucher"]
    if (v["orders"], v["stock"], v["oversold"], v["duplicateUsers"], v["stockDrift"]) != (300, 0, 0, 0, 0):
        fail(f"voucher after the sale: {v}")
    both_instances(res)
    p = check("--voucher", str(res["voucherId"]), "--ok-responses", "300")
    if p.returncode != 0:
        fail(f"check_invariants: {p.stdout}{p.stderr}")


@test
def wrk_sale_every_order_id_seen_exists():
    res = run_result("wrk_sale.sh", DURATION="3s", CONCURRENCY=40, WRK_THREADS=2, STOCK=800)
    v = res["voucher"]
    if v["orders"] != 800 or v["stock"] != 0:
        fail(f"the sale did not sell out in 3 s: {v}")
    if v.get("idsSeen", 0) < 1 or v.get("idsMissing") != 0:
        fail(f"order ids seen by wrk: {v}")
    if res["statuses"].get("200") != 800:
        fail(f"200 answers {res['statuses']}")
    both_instances(res)
    ids = os.path.join(RUN_DIR, "loadtest", f"wrk-sale-v{res['voucherId']}", "order-ids.txt")
    with open(ids) as f:
        n = sum(1 for line in f if line.strip())
    if n != v["idsSeen"] or n < 700:
        fail(f"{ids}: {n} ids (report: {v.get('idsSeen')})")
    p = check("--voucher", str(res["voucherId"]), "--ids", ids)
    if p.returncode != 0:
        fail(f"check_invariants --ids: {p.stdout}{p.stderr}")


@test
def ab_storm_of_one_user_makes_one_order():
    res = run_result("ab_storm.sh", REQUESTS=500, CONCURRENCY=50, STOCK=100)
    st = res["statuses"]
    if st.get("200") != 1 or st.get("409") != 499:
        fail(f"want one 200 and 499 x 409: {st}")
    v = res["voucher"]
    if v["orders"] != 1 or v["stock"] != 99:
        fail(f"voucher after the storm: {v}")
    both_instances(res)
    p = check("--voucher", str(res["voucherId"]), "--expect-orders", "1")
    if p.returncode != 0:
        fail(f"check_invariants: {p.stdout}{p.stderr}")


@test
def checker_reports_each_violation():
    dsn = env_file()["PG_DSN"]
    v = new_voucher(3)
    good = check("--voucher", str(v))
    if good.returncode != 0:
        fail(f"a fresh voucher should pass: {good.stdout}")
    # Oversell, a user with two orders and stock drift, written behind the
    # service's back (the unique key is dropped for it, then restored).
    ss.psql(f"""
        ALTER TABLE tb_voucher_order DROP CONSTRAINT uq_voucher_order_user_voucher;
        INSERT INTO tb_voucher_order (id, user_id, voucher_id)
             VALUES (9000000000000000001, 1, {v}), (9000000000000000002, 1, {v}),
                    (9000000000000000003, 2, {v}), (9000000000000000004, 3, {v});
        UPDATE tb_voucher SET stock = 1 WHERE voucher_id = {v};
    """, dsn=dsn)
    try:
        ids = os.path.join(ss.TEST_TMP, "ids-check.txt")
        with open(ids, "w") as f:
            f.write("9000000000000000001\n1234\n")
        p = check("--voucher", str(v), "--ids", ids, "--expect-orders", "4")
        out = p.stdout
        if p.returncode != 1:
            fail(f"exit {p.returncode}, want 1:\n{out}{p.stderr}")
        for needle in ("FAIL voucher %d: orders <= initial stock (4 <= 3): OVERSOLD by 1" % v,
                       "FAIL voucher %d: no user with two orders (1 users" % v,
                       "FAIL voucher %d: stock drift" % v,
                       "FAIL voucher %d: every order id seen with a 200 is in tb_voucher_order" % v):
            if needle not in out:
                fail(f"missing {needle!r} in:\n{out}")
        if "ok   voucher %d: exactly 4 order(s)" % v not in out:
            fail(f"--expect-orders 4 should hold:\n{out}")
        p = check("--voucher", "999999999")
        if p.returncode != 2 or "does not exist" not in p.stderr:
            fail(f"unknown voucher: exit {p.returncode} {p.stderr}")
    finally:
        ss.psql(f"""
            DELETE FROM tb_voucher_order WHERE voucher_id = {v};
            ALTER TABLE tb_voucher_order
                ADD CONSTRAINT uq_voucher_order_user_voucher UNIQUE (user_id, voucher_id);
        """, dsn=dsn)


@test
def nginx_413_and_request_id():
    port = base_port()
    r = ss.request(port, "POST", "/admin/vouchers", {"Content-Type": "application/json"},
                   b"{" + b" " * (70 * 1024) + b"}")
    if r.status != 413 or r.body != {"error": "body_too_large", "message": r.body.get("message")} \
            or "application/json" not in r.headers.get("content-type", ""):
        fail(f"413 from nginx: {r.status} {r.headers} {r.raw[:200]!r}")
    r = ss.request(port, "GET", "/health", {"X-Request-Id": "ci-42"})
    if r.headers.get("x-request-id") != "ci-42":
        fail(f"X-Request-Id not echoed: {r.headers}")


@test
def stale_pid_file_of_another_program_is_not_trusted():
    other = os.path.join(ss.TEST_TMP, "stack-stale")
    os.makedirs(os.path.join(other, "pids"), exist_ok=True)
    sleeper = subprocess.Popen(["sleep", "60"])
    ss._track(sleeper)
    try:
        with open(os.path.join(other, "pids", "app-1.pid"), "w") as f:
            f.write(f"{sleeper.pid}\n{ss.SECKILL_BIN} --port=1 --instance-id=seckill-1*\n")
        p = stack("status", run_dir=other)
        if p.returncode != 3 or "STALE" not in p.stdout:
            fail(f"status with a reused pid: exit {p.returncode}:\n{p.stdout}")
        p = stack("stop", run_dir=other)
        if p.returncode != 0:
            fail(f"stop: {p.stderr}")
        if sleeper.poll() is not None:
            fail("stop killed a process that merely reused a pid from a pid file")
        if os.path.exists(os.path.join(other, "pids", "app-1.pid")):
            fail("stale pid file not removed")
    finally:
        sleeper.kill()
        sleeper.wait()
        ss._untrack(sleeper)


@test
def port_in_use_is_a_clear_error_and_starts_nothing():
    other = os.path.join(ss.TEST_TMP, "stack-busy")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        p = stack("start", run_dir=other, NGINX_PORT=port)
    if p.returncode == 0:
        stack("stop", run_dir=other)
        fail("start succeeded although NGINX_PORT was in use")
    if f"port {port}" not in p.stderr or "in use" not in p.stderr or "NGINX_PORT" not in p.stderr:
        fail(f"unclear message:\n{p.stderr}")
    if pids(other):
        fail(f"processes were started: {pids(other)}")


@test
def crashed_instance_restart():
    before = pids()
    os.kill(before["app-1"], signal.SIGKILL)
    deadline = time.monotonic() + 5
    while ss.pid_alive(before["app-1"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    p = stack("status")
    if p.returncode != 1 or "STALE" not in p.stdout:
        fail(f"status after a crash: exit {p.returncode}:\n{p.stdout}")
    p = stack("start")
    ss.register_stack_pids(RUN_DIR)
    if p.returncode != 0 or "restarting" not in p.stderr:
        fail(f"start after a crash: exit {p.returncode}:\n{p.stderr}")
    after = pids()
    for name in COMPONENTS:
        if not ss.pid_alive(after.get(name, 0)):
            fail(f"{name} not running after the restart")
    for name, pid in before.items():
        if name != "app-1" and ss.pid_alive(pid):
            fail(f"the old {name} (pid {pid}) is still running after the restart")
    unregister_pids(before.values())
    if ss.request(base_port(), "GET", "/health").status != 200:
        fail("nginx does not answer after the restart")


@test
def all_instances_down_gives_502_json_then_stop_stops_everything():
    port = base_port()
    before = pids()
    for name in ("app-1", "app-2"):
        os.kill(before[name], signal.SIGTERM)
    deadline = time.monotonic() + 10
    while any(ss.pid_alive(before[n]) for n in ("app-1", "app-2")) and time.monotonic() < deadline:
        time.sleep(0.05)
    r = ss.request(port, "POST", "/voucher/1/seckill", {"X-User-Id": "5"})
    if r.status != 502 or not isinstance(r.body, dict) or r.body.get("error") != "unavailable" \
            or not r.headers.get("retry-after"):
        fail(f"with every instance down: {r.status} {r.headers} {r.raw!r}")
    p = stack("stop")
    if p.returncode != 0:
        fail(f"stop: exit {p.returncode}: {p.stderr}")
    alive = [f"{n}({pid})" for n, pid in before.items() if ss.pid_alive(pid)]
    if alive:
        fail(f"still running after stop: {alive}")
    if pids():
        fail(f"pid files left: {pids()}")
    if os.path.exists(os.path.join(RUN_DIR, "stack.env")):
        fail("env file left after stop")
    with socket.socket() as s:
        s.settimeout(1)
        if s.connect_ex(("127.0.0.1", port)) == 0:
            fail(f"nginx port {port} still answers")
    unregister_pids(before.values())
    p = stack("status")
    if p.returncode != 3:
        fail(f"status after stop: exit {p.returncode}: {p.stdout}")


@test
def a_new_start_begins_with_an_empty_redis_as_with_an_empty_postgres():
    """A start makes a new database; Redis must start as empty, or a stack
    with AOF on (REDIS_APPENDFSYNC) would load the last run's keys: its
    Redis-first stream entries, for vouchers the new database does not
    have (they never drain), its vouchers' stock and buyers."""
    run_dir = os.path.join(ss.TEST_TMP, f"stack-fresh-redis-{os.getpid()}")
    extra = {"REDIS_APPENDFSYNC": "always", "NGINX_PORT": "auto", "APP_PORT_BASE": "auto"}
    started = []
    try:
        for round_ in (1, 2):
            p = stack("start", run_dir, 120, **extra)
            if p.returncode != 0:
                fail(f"start {round_}: exit {p.returncode}: {p.stderr[-600:]}")
            started += list(pids(run_dir).values())
            for pid in pids(run_dir).values():
                ss.register_pid(pid)
            url = ss.stack_env_file(run_dir)["REDIS_URL"]
            if round_ == 1:
                ss.redis(["SET", "left:by:the:last:run", "1"], url=url)
                ss.redis(["XADD", "seckill:orders", "*", "v", "1"], url=url)
            else:
                left = (ss.redis(["EXISTS", "left:by:the:last:run"], url=url),
                        ss.redis(["XLEN", "seckill:orders"], url=url))
                if left != ("0", "0"):
                    fail(f"the new start's Redis holds the last run's keys: {left}")
            p = stack("stop", run_dir)
            if p.returncode != 0:
                fail(f"stop {round_}: exit {p.returncode}: {p.stderr[-600:]}")
    finally:
        stack("stop", run_dir)
        unregister_pids(started)


def teardown():
    if pids():
        p = stack("stop")
        if p.returncode != 0:
            print(p.stderr)


if __name__ == "__main__":
    ss.main(teardown)
