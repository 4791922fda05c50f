#!/usr/bin/env python3
"""The lock backends of other services: zk (ZooKeeper), pg-table and
pg-advisory (Postgres), multilock and redlock (independent Redis masters),
each in the real sale, against a real ZooKeeper (one started for this
program by scripts/zk.sh), the test Postgres, and three and five
redis-server processes (scripts/redis-nodes.sh).

For each backend, through nginx across two instances: one user x 200
concurrent requests give exactly one order (without the unique constraint,
with the race window widened: only the lock can stop the duplicates; the
same load with no lock is the control that shows the test can fail), and
500 distinct users against stock 100 give exactly 100 orders. Then what is
particular to each: a holder stalled past its lease (pg-table) or its
session (zk: the whole process stopped) has its write refused by the fence;
an advisory lock goes with its holder's database session, and the order
of a dropped session never commits; ZK_HOSTS that is missing, malformed or
unreachable stops the server at start with a clear message, and so does a
LOCK_REDIS_NODES that is missing, malformed, unreachable, names a node twice
or has fewer than three nodes for redlock, and so does multilock or redlock
with the watchdog (LOCK_LEASE_MS=-1) or LOCK_SYNC_REPLICAS. LOCK_PG_SWEEP_MS
deletes expired pg-table rows on a timer. With one node of three killed,
multilock sells to no one (503) and redlock sells as before.
"""

import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seckill_server as ss  # noqa: E402
from seckill_server import fail, psql, psql_value, test  # noqa: E402

TOKEN = "locks-token"
UNIQUE = "uq_voucher_order_user_voucher"
ZK_SCRIPT = os.path.join(ss.ROOT, "scripts", "zk.sh")
ZK_DIR = os.path.join(ss.TEST_TMP, f"zk-test_locks-{os.getpid()}")
BACKENDS = ("zk", "pg-table", "pg-advisory", "multilock", "redlock")
ZK = {}
NODES_SCRIPT = os.path.join(ss.ROOT, "scripts", "redis-nodes.sh")
NODE_COUNT = {"multilock": 3, "redlock": 5}
NODES = {}


def nodes_dir(lock):
    return os.path.join(ss.TEST_TMP, f"nodes-{lock}-{os.getpid()}")


def redis_nodes(lock):
    """LOCK_REDIS_NODES of this backend's nodes (3 for multilock, 5 for
    redlock), started at the first call."""
    if lock not in NODES:
        p = subprocess.run([NODES_SCRIPT, "start", nodes_dir(lock), str(NODE_COUNT[lock])],
                           capture_output=True, text=True, timeout=60)
        line = [x for x in p.stdout.splitlines() if x.startswith("LOCK_REDIS_NODES=")]
        if p.returncode != 0 or not line:
            fail(f"scripts/redis-nodes.sh start: {p.stderr.strip()}")
        NODES[lock] = line[0].split("=", 1)[1]
        for i in range(1, NODE_COUNT[lock] + 1):
            ss.register_pid(int(nodes_cmd(lock, "pid", i)))
    return NODES[lock]


def nodes_cmd(lock, what, i):
    p = subprocess.run([NODES_SCRIPT, what, nodes_dir(lock), str(i)], capture_output=True,
                       text=True, timeout=60)
    if p.returncode != 0:
        fail(f"scripts/redis-nodes.sh {what} {i}: {p.stderr.strip()}")
    return p.stdout.strip()


def teardown():
    zk_stop()
    for lock in NODES:
        subprocess.run([NODES_SCRIPT, "stop", nodes_dir(lock)], capture_output=True, timeout=60)


def zk_hosts():
    if "hosts" not in ZK:
        p = subprocess.run([ZK_SCRIPT, "start", ZK_DIR], capture_output=True, text=True,
                           timeout=60)
        line = [x for x in p.stdout.splitlines() if x.startswith("ZK_HOSTS=")]
        if p.returncode != 0 or not line:
            fail(f"scripts/zk.sh start: {p.stderr.strip()}")
        ZK["hosts"] = line[0].split("=", 1)[1]
        pid = open(os.path.join(ZK_DIR, "zk.pid")).read().strip()
        ss.register_pid(int(pid))
    return ZK["hosts"]


def zk_stop():
    if "hosts" in ZK:
        subprocess.run([ZK_SCRIPT, "stop", ZK_DIR], capture_output=True, timeout=30)


def env_of(lock, **extra):
    env = {"ADMIN_TOKEN": TOKEN, "SECKILL_LOCK": lock, "LOG_LEVEL": "warn"}
    if lock == "zk":
        env.update({"ZK_HOSTS": zk_hosts(), "ZK_SESSION_TIMEOUT_MS": 2000})
    if lock in NODE_COUNT:
        env["LOCK_REDIS_NODES"] = redis_nodes(lock)
    env.update(extra)
    return env


class Pair:
    """Two instances with one lock backend, nginx in front."""

    def __init__(self, lock, **extra):
        self.servers = [ss.Server(f"locks-{lock}-{i}", env_of(lock, **extra)) for i in (1, 2)]
        self.prefix = os.path.join(ss.TEST_TMP, f"nginx-locks-{lock}")
        self.port, self.nginx_pid = ss.start_nginx(
            self.prefix, [f"127.0.0.1:{s.port}" for s in self.servers])

    def close(self):
        ss.stop_pid(self.nginx_pid, signal.SIGQUIT)
        ss.unregister_pid(self.nginx_pid)
        for s in self.servers:
            s.stop_ok()


class without_unique:
    def __enter__(self):
        psql(f"ALTER TABLE tb_voucher_order DROP CONSTRAINT IF EXISTS {UNIQUE}")

    def __exit__(self, *exc):
        psql("DELETE FROM tb_voucher_order o USING tb_voucher_order p "
             "WHERE o.user_id = p.user_id AND o.voucher_id = p.voucher_id AND o.id > p.id")
        psql(f"ALTER TABLE tb_voucher_order ADD CONSTRAINT {UNIQUE} UNIQUE (user_id, voucher_id)")


def db_state(vid):
    orders = int(psql_value(f"SELECT count(*) FROM tb_voucher_order WHERE voucher_id = {vid}"))
    stock = int(psql_value(f"SELECT stock FROM tb_voucher WHERE voucher_id = {vid}"))
    dups = int(psql_value(
        "SELECT count(*) FROM (SELECT user_id FROM tb_voucher_order "
        f"WHERE voucher_id = {vid} GROUP BY user_id HAVING count(*) > 1) d"))
    return orders, stock, dups


def crowd(port, vid, users, workers):
    jobs = [users[i::workers] for i in range(workers)]
    res = ss.run_concurrently(lambda i: port, jobs, lambda c, uid: c.seckill(vid, uid), workers)
    statuses = {}
    for _uid, r in res:
        key = r.status if not isinstance(r, Exception) else type(r).__name__
        statuses[key] = statuses.get(key, 0) + 1
    return statuses


def new_user():
    return 7_000_000_000 + int(time.time() * 1000) % 1_000_000_000


def safety_env(lock):
    """The storm and the crowd check safety (one order per user, the stock
    sold exactly): every attempt must reach a verdict. With several Redis
    nodes, a node that answers later than LOCK_REDIS_NODE_TIMEOUT_MS (50 ms
    by default) fails the attempt with a 503, which a loaded 2-core machine
    meets; 500 ms (a twentieth of the default lease) keeps a slow answer an
    answer. What a dead node costs is one_node_down's test."""
    return {"LOCK_REDIS_NODE_TIMEOUT_MS": 500} if lock in NODE_COUNT else {}


def one_user_storm(lock):
    """One user x 200 concurrent requests through nginx, two instances, no
    unique constraint, 300 ms between the duplicate check and the insert.
    Returns (statuses, orders, duplicate users, 200s per instance)."""
    pair = Pair(lock, DEMO_DELAY_MS=300, **safety_env(lock))
    try:
        vid = ss.new_voucher(pair.port, TOKEN, 100, f"storm {lock}")
        user = new_user()
        with without_unique():
            statuses = crowd(pair.port, vid, [user] * 200, 200)
            orders, _stock, dups = db_state(vid)
        served = [int(s.get("/stats").body.get("requests", {}).get("total", 0))
                  for s in pair.servers]
        return statuses, orders, dups, served
    finally:
        pair.close()


def check_storm(lock):
    statuses, orders, dups, served = one_user_storm(lock)
    if orders != 1 or dups != 0 or statuses.get(200) != 1 or statuses.get(409) != 199:
        fail(f"{lock}: one user x 200: {statuses}, {orders} orders in Postgres")
    if min(served) < 50:
        fail(f"{lock}: nginx did not spread the requests over both instances: {served}")


def check_crowd(lock):
    pair = Pair(lock, **safety_env(lock))
    try:
        vid = ss.new_voucher(pair.port, TOKEN, 100, f"crowd {lock}")
        base = new_user()
        statuses = crowd(pair.port, vid, [base + i for i in range(500)], 50)
        orders, stock, dups = db_state(vid)
        if (orders, stock, dups) != (100, 0, 0) or statuses.get(200) != 100 \
                or statuses.get(409) != 400:
            fail(f"{lock}: 500 users, stock 100: {statuses}; orders {orders}, stock {stock}, "
                 f"duplicate users {dups}")
    finally:
        pair.close()


@test
def no_lock_lets_one_user_buy_twice():
    """The control: the storm below, with no lock, does sell twice."""
    statuses, orders, dups, _ = one_user_storm("none")
    if dups < 1 or orders < 2:
        fail(f"no lock: {statuses}, {orders} orders: the storm does not race")


@test
def zk_one_order_per_user():
    check_storm("zk")


@test
def zk_sells_exactly_the_stock():
    check_crowd("zk")


@test
def pg_table_one_order_per_user():
    check_storm("pg-table")


@test
def pg_table_sells_exactly_the_stock():
    check_crowd("pg-table")


@test
def pg_advisory_one_order_per_user():
    check_storm("pg-advisory")


@test
def pg_advisory_sells_exactly_the_stock():
    check_crowd("pg-advisory")


@test
def multilock_one_order_per_user():
    check_storm("multilock")


@test
def multilock_sells_exactly_the_stock():
    check_crowd("multilock")


@test
def redlock_one_order_per_user():
    check_storm("redlock")


@test
def redlock_sells_exactly_the_stock():
    check_crowd("redlock")


@test
def one_node_down_stops_multilock_not_redlock():
    """One of three nodes killed: MultiLock needs every node, so no buyer
    gets the lock (503, no order: availability lost, safety kept); RedLock
    over the same three nodes (two are a majority) sells. The node back:
    MultiLock sells again."""
    nodes = redis_nodes("multilock")
    ml = ss.Server("locks-ml-down", env_of("multilock"))
    rl = ss.Server("locks-rl-down", env_of("redlock", LOCK_REDIS_NODES=nodes))
    try:
        vid = ss.new_voucher(ml.port, TOKEN, 100, "one node down")
        base = new_user()
        nodes_cmd("multilock", "kill", 3)
        try:
            r = [ml.seckill(vid, base + i) for i in range(10)]
            bad = [(x.status, x.body) for x in r
                   if x.status != 503 or "redis nodes" not in str(x.body)]
            if bad or db_state(vid)[0] != 0:
                fail(f"multilock with a node down: {bad[:3]}, orders {db_state(vid)[0]}")
            r = [rl.seckill(vid, base + 100 + i) for i in range(10)]
            if [x.status for x in r] != [200] * 10 or db_state(vid)[0] != 10:
                fail(f"redlock with a node down: {[x.status for x in r]}, "
                     f"orders {db_state(vid)[0]}")
        finally:
            nodes_cmd("multilock", "start-node", 3)
            ss.register_pid(int(nodes_cmd("multilock", "pid", 3)))
        time.sleep(0.4)                              # the node's retry delay
        r = [ml.seckill(vid, base + 200 + i) for i in range(5)]
        if [x.status for x in r] != [200] * 5:
            fail(f"multilock after the node came back: {[(x.status, x.body) for x in r]}")
    finally:
        ml.stop_ok()
        rl.stop_ok()


@test
def stopping_the_nodes_returns_once_they_have_exited():
    """redis-nodes.sh stop waits for each node to exit, not for init to reap
    it: the nodes' parent is init, which here reaps up to two seconds late,
    and a wait that counted a zombie as running took about that long per
    node (five nodes: about 10 s, longer than the ladder's outage)."""
    d = os.path.join(ss.TEST_TMP, f"nodes-stop-{os.getpid()}")
    p = subprocess.run([NODES_SCRIPT, "start", d, "5"], capture_output=True, text=True,
                       timeout=60)
    if p.returncode != 0:
        fail(f"scripts/redis-nodes.sh start: {p.stderr.strip()}")
    pids = []
    for i in range(1, 6):
        q = subprocess.run([NODES_SCRIPT, "pid", d, str(i)], capture_output=True, text=True,
                           timeout=10)
        pids.append(int(q.stdout))
        ss.register_pid(pids[-1])
    t0 = time.monotonic()
    p = subprocess.run([NODES_SCRIPT, "stop", d], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    if p.returncode != 0:
        fail(f"scripts/redis-nodes.sh stop: {p.stderr.strip()}")
    running = [pid for pid in pids if ss.pid_alive(pid)]
    if running:
        fail(f"nodes still running after stop: {running}")
    if took > 3.0:
        fail(f"stopping 5 nodes took {took:.1f} s (> 3 s)")
    print(f"# 5 nodes stopped in {took:.2f} s")


def stale_token_rejections(srv):
    return int(srv.get("/stats").body.get("lock", {}).get("staleTokenRejections", 0))


def stale_holder_fenced(a, vid, ra, rb):
    """B, the later holder, bought (200); A, the stale one, was refused at the
    fence (409, counted once on A); one order."""
    if rb.status != 200 or ra is None or ra.status != 409:
        fail(f"B {rb.status} {rb.body}, A {ra and ra.status} {ra and ra.body}")
    if stale_token_rejections(a) != 1:
        fail(f"A's stale write not counted: {a.get('/stats').body.get('lock')}")
    if db_state(vid)[0] != 1:
        fail(f"orders: {db_state(vid)}")


@test
def pg_table_holder_past_its_lease_is_fenced():
    """A holds the row, stalls 2.5 s (lease 1 s); B takes the expired row,
    orders with a higher token; A's write is refused (stale token)."""
    a = ss.Server("locks-pgt-a", env_of("pg-table", LOCK_LEASE_MS=1000, DEMO_PAUSE_MS=2500))
    b = ss.Server("locks-pgt-b", env_of("pg-table", LOCK_LEASE_MS=1000))
    try:
        vid = ss.new_voucher(b, TOKEN, 10, "pg-table fence")
        user = new_user()
        out = {}
        t = ss.threading.Thread(target=lambda: out.setdefault("a", a.seckill(vid, user)))
        t.start()
        time.sleep(0.5)
        rb = b.seckill(vid, user)
        if rb.status != 409:
            fail(f"B while A holds: {rb.status} {rb.body}")
        time.sleep(1.0)                               # A's lease has ended
        rb = b.seckill(vid, user)
        t.join(10)
        stale_holder_fenced(a, vid, out.get("a"), rb)
    finally:
        a.stop_ok()
        b.stop_ok()


@test
def pg_table_sweeper_deletes_expired_rows_and_keeps_held_ones():
    """LOCK_PG_SWEEP_MS: the instance deletes the lock rows whose lease has
    ended on a timer, with no acquire of their key; a row within its lease
    stays. The sweeper stops with the instance (exit 0)."""
    tag = f"t:sweep:{os.getpid()}"
    psql("INSERT INTO tb_lock (lock_key, owner, holds, token, expires_at) VALUES "
         f"('{tag}:expired', 'gone', 1, nextval('tb_lock_token_seq'), "
         "clock_timestamp() - interval '1 second'), "
         f"('{tag}:held', 'live', 1, nextval('tb_lock_token_seq'), "
         "clock_timestamp() + interval '1 hour')")

    def rows():
        return psql_value(f"SELECT string_agg(owner, ',' ORDER BY owner) FROM tb_lock "
                          f"WHERE lock_key LIKE '{tag}:%'")

    srv = ss.Server("locks-pgt-sweep", env_of("pg-table", LOCK_PG_SWEEP_MS=200))
    try:
        deadline = time.monotonic() + 10
        while rows() != "live":
            if time.monotonic() > deadline:
                fail(f"lock rows left after 10 s of 200 ms sweeps: {rows()!r}, want 'live'")
            time.sleep(0.1)
    finally:
        srv.stop_ok()
        psql(f"DELETE FROM tb_lock WHERE lock_key LIKE '{tag}:%'")


@test
def zk_holder_whose_session_expired_is_fenced():
    """A takes the node and stalls (DEMO_PAUSE_MS); the whole process is
    stopped (SIGSTOP, like a long GC pause) past its session timeout, so
    ZooKeeper deletes its node; B takes the lock and orders (a higher czxid);
    A resumes and its write is refused at the fence."""
    a = ss.Server("locks-zk-a", env_of("zk", ZK_SESSION_TIMEOUT_MS=1000, DEMO_PAUSE_MS=1500))
    b = ss.Server("locks-zk-b", env_of("zk", ZK_SESSION_TIMEOUT_MS=1000))
    try:
        vid = ss.new_voucher(b, TOKEN, 10, "zk fence")
        user = new_user()
        out = {}
        t = ss.threading.Thread(target=lambda: out.setdefault("a", a.seckill(vid, user)))
        t.start()
        time.sleep(0.4)
        os.kill(a.proc.pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 8
            rb = b.seckill(vid, user)
            while rb.status == 409 and time.monotonic() < deadline:
                time.sleep(0.2)
                rb = b.seckill(vid, user)
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        t.join(15)
        stale_holder_fenced(a, vid, out.get("a"), rb)
    finally:
        a.stop_ok()
        b.stop_ok()


@test
def pg_advisory_lock_goes_with_its_session():
    """A holds the advisory lock and stalls; its database session is
    terminated: the lock is free at once (B orders), and A's order, on the
    dropped session, never commits (503)."""
    a = ss.Server("locks-adv-a", env_of("pg-advisory", DEMO_PAUSE_MS=2000))
    b = ss.Server("locks-adv-b", env_of("pg-advisory"))
    try:
        vid = ss.new_voucher(b, TOKEN, 10, "advisory session")
        user = new_user()
        out = {}
        t = ss.threading.Thread(target=lambda: out.setdefault("a", a.seckill(vid, user)))
        t.start()
        time.sleep(0.5)
        if b.seckill(vid, user).status != 409:
            fail("B got the lock while A held it")
        killed = psql_value(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory' "
            f"AND classid = {user >> 32} AND objid = {user & 0xffffffff} AND granted")
        if killed != "1":
            fail(f"A's session holding the lock: {killed} found")
        # pg_terminate_backend only signals the backend: the lock goes when
        # it has exited, which a loaded machine may take a moment to do.
        held = "1"
        for _ in range(100):
            held = psql_value(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                f"AND classid = {user >> 32} AND objid = {user & 0xffffffff} AND granted")
            if held == "0":
                break
            time.sleep(0.05)
        if held != "0":
            fail("A's advisory lock outlived its terminated session by 5 s")
        rb = b.seckill(vid, user)
        t.join(10)
        ra = out.get("a")
        if rb.status != 200 or ra is None or ra.status != 503:
            fail(f"B {rb.status} {rb.body}, A {ra and ra.status} {ra and ra.body}")
        if db_state(vid)[0] != 1:
            fail(f"orders: {db_state(vid)}")
    finally:
        a.stop_ok()
        b.stop_ok()


def start_fails(env, want):
    srv = ss.Server("locks-bad", env, start=False)
    e = srv.build_env()
    e["PORT"] = str(ss.free_port())
    t0 = time.monotonic()
    p = subprocess.run([ss.SECKILL_BIN], env=e, capture_output=True, text=True, timeout=30)
    took = time.monotonic() - t0
    if p.returncode == 0 or want not in p.stderr:
        fail(f"{env}: exit {p.returncode}, stderr {p.stderr[-500:]!r}")
    return took


@test
def bad_zk_hosts_stop_the_server_at_start():
    start_fails({"SECKILL_LOCK": "zk"}, "SECKILL_LOCK=zk needs ZK_HOSTS")
    start_fails({"SECKILL_LOCK": "zk", "ZK_HOSTS": "127.0.0.1"}, "invalid ZK_HOSTS '127.0.0.1'")
    took = start_fails({"SECKILL_LOCK": "zk", "ZK_HOSTS": f"127.0.0.1:{ss.dead_port()}",
                        "ZK_SESSION_TIMEOUT_MS": 1500},
                       "answered within 1500 ms")
    if took > 8:
        fail(f"an unreachable ZK_HOSTS took {took:.1f} s to stop the server")


@test
def bad_lock_redis_nodes_stop_the_server_at_start():
    good = redis_nodes("redlock").split(",")
    for lock in ("multilock", "redlock"):
        start_fails({"SECKILL_LOCK": lock}, f"SECKILL_LOCK={lock} needs LOCK_REDIS_NODES")
        start_fails({"SECKILL_LOCK": lock, "LOCK_REDIS_NODES": "redis://127.0.0.1:1:2"},
                    "invalid LOCK_REDIS_NODES entry 'redis://127.0.0.1:1:2'")
        start_fails({"SECKILL_LOCK": lock, "LOCK_REDIS_NODES": ",".join(good[:3]) + ","},
                    "trailing comma")
        start_fails({"SECKILL_LOCK": lock, "LOCK_REDIS_NODES": ",".join(good[:3] + good[:1])},
                    "is listed twice")
        # the same server under another name, or another db of it: one failure domain
        alias = good[0].replace("127.0.0.1", "localhost")
        start_fails({"SECKILL_LOCK": lock, "LOCK_REDIS_NODES": ",".join(good[:3] + [alias])},
                    "is listed twice")
        start_fails({"SECKILL_LOCK": lock, "LOCK_REDIS_NODES": ",".join(good[:3] + [good[0] + "/1"])},
                    "is listed twice")
        dead = ",".join(good[:2] + [f"redis://127.0.0.1:{ss.dead_port()}"])
        took = start_fails({"SECKILL_LOCK": lock, "LOCK_REDIS_NODES": dead}, "node 3 (127.0.0.1:")
        if took > 5:
            fail(f"{lock}: an unreachable node took {took:.1f} s to stop the server")
        start_fails({"SECKILL_LOCK": lock, "LOCK_REDIS_NODES": ",".join(good[:3]),
                     "LOCK_LEASE_MS": 400}, "at most a tenth of LOCK_LEASE_MS")
        # no watchdog renews a hold on several masters; WAIT counts replicas, which they lack
        start_fails({"SECKILL_LOCK": lock, "LOCK_REDIS_NODES": ",".join(good[:3]),
                     "LOCK_LEASE_MS": -1}, f"SECKILL_LOCK={lock} needs a fixed lease")
        start_fails({"SECKILL_LOCK": lock, "LOCK_REDIS_NODES": ",".join(good[:3]),
                     "LOCK_SYNC_REPLICAS": 1, "LOCK_SYNC_TIMEOUT_MS": 100},
                    "LOCK_SYNC_REPLICAS is for the single lock's replicas")
    start_fails({"SECKILL_LOCK": "redlock", "LOCK_REDIS_NODES": ",".join(good[:2])},
                "needs at least 3 nodes in LOCK_REDIS_NODES (got 2)")


if __name__ == "__main__":
    ss.main(teardown=teardown)
