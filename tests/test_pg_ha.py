#!/usr/bin/env python3
"""Postgres under pg_auto_failover (PG_HA=1): a monitor and three data nodes
with one synchronous standby; the instances follow the primary, and an order
is answered 200 only once a standby has it.

The stack (scripts/stack.sh, PG_HA=1, 2 instances, nginx) runs in
$TEST_TMP/pg-ha-stack on free ports, with the failover timeouts of a test.

  the formation            a monitor and three data nodes on 127.0.0.1 only;
                           PG_DSN lists every node, target_session_attrs=
                           read-write; number_sync_standbys 1
  no standby, no 200       the standbys and the monitor frozen: a buyer's
                           commit waits for a standby, so the buyer gets 503
                           within the round-trip bound, never 200; after the
                           thaw the same buyer holds at most one order
  a cancelled wait         the commit waiting for its standby is cancelled
                           (pg_cancel_backend): Postgres reports success with
                           a WARNING; the buyer gets 503, not 200 (one-statement
                           order, batch); Redis-first: the stream entry stays
                           unsettled, its retry waits for the standby too
  synchronous_commit       ALTER ROLE ... SET synchronous_commit = local: a new
                           session takes no order and /ready says why;
                           ALTER SYSTEM ... local under running instances: the
                           sessions in use, checked again once a second, take
                           none either, and the consumers land none, until on
  pg_read_all_stats        a role without it cannot read the standbys' flush
                           positions: it takes no order and /ready names the
                           grant; granted, it sells
  primary SIGKILLed        pg_autoctl and every postgres process of the primary,
                           mid-sale through nginx, for optimistic, batched and
                           Redis-first: no acknowledged order missing on the new
                           primary, no oversell, no user twice; kill -> first
                           200 printed
  primary SIGSTOPped       a frozen server: no buyer waits past the service's
                           bound (a cut round trip, then one connect through the
                           DSN's hosts); sales resume on the promoted standby
  pg_autoctl killed alone  its postgres runs on and the monitor still reaches
                           it: no failover, sales go on, each commit confirmed
  no standby follows       both standbys killed while the monitor is frozen (a
                           primary replaced behind its back looks the same):
                           503s within the bound, never 200; sales resume once
                           they are back; nothing acknowledged is lost

Prints "N passed, M failed". Python 3 standard library only.
"""

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seckill_server as ss  # noqa: E402
from seckill_server import fail, test  # noqa: E402

sys.path.insert(0, os.path.join(ss.ROOT, "loadtest"))
import kit  # noqa: E402
import load_kit  # noqa: E402
from load_kit import Load, outcome, tally  # noqa: E402

RUN_DIR = os.path.join(ss.TEST_TMP, "pg-ha-stack")
STATEMENT_TIMEOUT_MS = 2000       # the instances' PG_STATEMENT_TIMEOUT_MS here
ROUND_TRIP_MS = STATEMENT_TIMEOUT_MS + 1000   # store_round_trip_ms()
CONNECT_TIMEOUT_S = 1             # PG_CONNECT_TIMEOUT_S
FAILOVER_BOUND_S = 60.0           # kill -> first 200 (about 10 s on an idle machine)
RUN_AFTER_S = 4.0                 # load after the first 200 that follows a fault
FIG = {}
_SCRUB = ("LOCK_LEASE_MS", "DEMO_PAUSE_MS", "DEMO_DELAY_MS", "PG_STATEMENT_TIMEOUT_MS",
          "PG_CONNECT_TIMEOUT_S", "SECKILL_STOCK", "RUN_DIR", "PG_HA")
_state = {}


class Stack(kit.Stack):
    def __init__(self):
        super().__init__(RUN_DIR, ss.stack_settings(
            {"INSTANCES": 2, "DEMO_RANDOM_USER": 0, "THREADS": 4, "LOG_LEVEL": "info",
             "PG_HA": 1, "REDIS_APPENDFSYNC": "always",
             "PG_STATEMENT_TIMEOUT_MS": STATEMENT_TIMEOUT_MS,
             "PG_CONNECT_TIMEOUT_S": CONNECT_TIMEOUT_S}), _SCRUB)
        self.strategy = "optimistic"

    def mon(self, sql):
        p = subprocess.run(["psql", "-X", "-q", "-At", "-h", "127.0.0.1", "-p",
                            self.info["PG_MONITOR_PORT"], "-U", "postgres", "-d",
                            "pg_auto_failover", "-c", sql],
                           capture_output=True, text=True, timeout=10)
        if p.returncode != 0:
            fail(f"monitor: {sql}: {p.stderr.strip()}")
        return p.stdout.strip()

    def node_sql(self, n, sql):
        port = self.info["PG_NODE_PORTS"].split()[n - 1]
        return ss.psql_value(sql, dsn=f"host=127.0.0.1 port={port} user=postgres dbname=seckill")

    def states(self):
        """{node number: (reported, goal)}."""
        out = {}
        for line in self.mon("SELECT nodename, reportedstate, goalstate FROM pgautofailover.node"
                             " ORDER BY nodeid").splitlines():
            name, rep, goal = line.split("|")
            out[int(name[len("node"):])] = (rep, goal)
        return out

    def primary(self):
        """The node the monitor has settled as primary, or None."""
        for n, (rep, goal) in self.states().items():
            if rep == goal and rep in ("primary", "wait_primary"):
                return n
        return None

    def wait_primary_other_than(self, old, timeout=FAILOVER_BOUND_S):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            n = self.primary()
            if n is not None and n != old:
                return n
            time.sleep(0.2)
        fail(f"no node but {old} became primary within {timeout} s: {self.states()}")

    def wait_settled(self, timeout=120):
        """One primary and two secondaries, as the monitor assigned them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.states()
            got = sorted(rep for rep, goal in s.values() if rep == goal)
            if got == ["primary", "secondary", "secondary"]:
                return s
            time.sleep(0.5)
        fail(f"the formation did not settle within {timeout} s: {self.states()}")

    def node_tree(self, n):
        """pg_autoctl of node n and every process under it."""
        return kit.proc_tree(self.pid(f"pg-node-{n}"))

    def postmaster(self, n):
        path = os.path.join(self.info["PG_HA_DIR"], f"node{n}", "postmaster.pid")
        with open(path) as f:
            return int(f.readline())

    def use(self, strategy):
        """The instances restarted with SECKILL_STOCK=strategy (when not already)."""
        if self.strategy != strategy:
            try:
                self.restart_instances({"SECKILL_STOCK": strategy})
            except kit.KitError as e:
                fail(str(e))
            self.strategy = strategy

    def new_voucher(self, stock=1_000_000):
        try:
            return self.create_voucher(stock, "pg-ha")
        except kit.KitError as e:
            fail(f"create voucher: {e}")

    def buy(self, port, v, user, timeout=30):
        t0 = time.monotonic()
        r = ss.request(port, "POST", f"/voucher/{v}/seckill", {"X-User-Id": str(user)},
                       timeout=timeout)
        return r, time.monotonic() - t0


def the_stack():
    if "stack" not in _state:
        _state["stack"] = load_kit.start_stack(Stack(), " (PG_HA=1)", 240)
    st = _state["stack"]
    st.wait_settled()
    return st


def user_base():
    return 8_000_000_000_000 + (os.getpid() % 10000) * 100_000 + int(time.time() * 10) % 10000 * 10


def orders_of(st, v, user):
    return int(ss.psql_value(f"SELECT count(*) FROM tb_voucher_order WHERE voucher_id = {v}"
                             f" AND user_id = {user}", dsn=st.dsn))


signal_all = kit.signal_all


class Frozen:
    """The monitor and both standbys SIGSTOPped (every process of each), so
    that nothing reconfigures the primary while its commits wait."""

    def __init__(self, st):
        p = st.primary()
        self.pids = kit.proc_tree(st.pid("pg-monitor"))
        for n in (1, 2, 3):
            if n != p:
                self.pids += st.node_tree(n)

    def __enter__(self):
        signal_all(self.pids, signal.SIGSTOP)
        return self

    def __exit__(self, *exc):
        signal_all(self.pids, signal.SIGCONT)


# ---------------------------------------------------------------- the formation

@test
def pg_ha_stack_runs_a_monitor_and_three_nodes_with_a_synchronous_standby():
    st = the_stack()
    dsn = st.info["PG_DSN"]
    ports = st.info["PG_NODE_PORTS"].split()
    if len(ports) != 3 or not all(f"127.0.0.1:{p}" in dsn for p in ports):
        fail(f"PG_DSN {dsn} does not list the three data nodes {ports}")
    if "target_session_attrs=read-write" not in dsn:
        fail(f"PG_DSN {dsn} lacks target_session_attrs=read-write")
    n = st.mon("SELECT number_sync_standbys FROM pgautofailover.formation"
               " WHERE formationid = 'default'")
    if n != "1":
        fail(f"number_sync_standbys = {n}, want 1")
    p = st.primary()
    names = st.node_sql(p, "SHOW synchronous_standby_names")
    if not names.startswith("ANY 1 ("):
        fail(f"the primary's synchronous_standby_names is {names!r}")
    for port in [st.info["PG_MONITOR_PORT"]] + ports:
        out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True,
                             text=True).stdout.split()
        if not out or any(a.endswith(f":{port}") and not a.startswith("127.0.0.1:")
                          for a in out):
            fail(f"port {port} listens beyond 127.0.0.1: {out}")
    r = ss.request(st.nginx_port, "GET", "/ready", timeout=5)
    if r.status != 200:
        fail(f"/ready -> {r.status} {r.body}")


# ---------------------------------------------------------------- acknowledged = on a standby

@test
def no_standby_no_200_the_buyer_gets_503_within_the_round_trip_bound():
    st = the_stack()
    st.use("optimistic")
    v = st.new_voucher()
    port = st.app_ports[0]
    user = user_base()
    with Frozen(st):
        r, took = st.buy(port, v, user)
    if r.status == 200:
        fail(f"200 while no standby could confirm the commit: {r.body}")
    if r.status != 503:
        fail(f"no standby: {r.status} {r.body}, want 503")
    if took > ROUND_TRIP_MS / 1000 + 2:
        fail(f"the buyer waited {took:.1f} s (bound {ROUND_TRIP_MS} ms)")
    st.wait_settled()
    r2, _ = st.buy(port, v, user)
    if r2.status not in (200, 409):
        fail(f"after the thaw: {r2.status} {r2.body}")
    if orders_of(st, v, user) != 1:
        fail(f"user {user} has {orders_of(st, v, user)} orders, want 1")
    print(f"    frozen standbys: 503 after {took:.2f} s; after the thaw: {r2.status}", flush=True)


@test
def a_cancelled_synchronous_wait_is_503_not_200():
    """For the one-statement order and for a batch (its leader's pipelined
    statement): a commit whose wait for its standby is cancelled is 503."""
    for k, strategy in enumerate(("optimistic", "batched")):
        cancelled_wait_case(strategy, user_base() + 1 + 20 * k)


def cancel_sync_waits(st, p, until):
    """pg_cancel_backend of node p's backends waiting for their standby
    (wait_event SyncRep), until one was or 'until' (monotonic) passed."""
    cancelled = "0"
    while time.monotonic() < until and cancelled == "0":
        cancelled = st.node_sql(p, "SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity"
                                   " WHERE wait_event = 'SyncRep'")
        time.sleep(0.05)
    return cancelled != "0"


def cancelled_wait_case(strategy, user):
    st = the_stack()
    st.use(strategy)
    v = st.new_voucher()
    port = st.app_ports[0]
    p = st.primary()
    answer = {}
    log = os.path.join(RUN_DIR, "logs", "app-1.log")
    log_at = os.path.getsize(log)

    def buy():
        answer["r"], answer["took"] = st.buy(port, v, user)

    with Frozen(st):
        t = threading.Thread(target=buy, daemon=True)
        t.start()
        cancelled = cancel_sync_waits(st, p, time.monotonic() + ROUND_TRIP_MS / 1000)
        t.join(30)
    if not cancelled:
        fail(f"{strategy}: no backend was seen waiting for its standby (wait_event SyncRep)")
    r = answer.get("r")
    if r is None or r.status != 503:
        fail(f"{strategy}: a commit whose synchronous wait was cancelled -> "
             f"{r.status if r else None} {r.body if r else ''}, want 503")
    st.wait_settled()
    # It did commit on the primary: the buyer's retry meets it.
    r2, _ = st.buy(port, v, user)
    if r2.status != 409 or orders_of(st, v, user) != 1:
        fail(f"{strategy}: retry after the cancelled wait: {r2.status} {r2.body}, "
             f"{orders_of(st, v, user)} orders (want 409 and 1)")
    with open(log) as f:
        f.seek(log_at)
        if "may not be on a standby" not in f.read():
            fail(f"{strategy}: the instance did not log the warning it acted on")
    print(f"    {strategy}: cancelled wait -> 503; retry -> 409", flush=True)


@test
def a_cancelled_synchronous_wait_leaves_the_redis_first_entry_pending():
    """Redis-first: the consumer's commit waits for the standby and that
    wait is cancelled. The buyer had its 200 from Redis; the stream entry
    stays unsettled (the consumer acknowledges an entry only after a
    commit a standby confirmed) until the standbys are back, then lands
    once."""
    st = the_stack()
    st.use("redis")
    v = st.new_voucher(1000)
    port = st.app_ports[0]
    user = user_base() + 60
    p = st.primary()
    # Either instance's consumers may read the entry: both logs.
    logs = [os.path.join(RUN_DIR, "logs", f"app-{i}.log") for i in (1, 2)]
    log_at = [os.path.getsize(f) for f in logs]
    with Frozen(st):
        r, _ = st.buy(port, v, user)
        if r.status != 200:
            fail(f"Redis-first admission with the standbys frozen: {r.status} {r.body}")
        if not cancel_sync_waits(st, p, time.monotonic() + 20):
            fail("no consumer commit was seen waiting for its standby (wait_event SyncRep)")
        deadline = time.monotonic() + 20
        while True:
            if any("may not be on a standby" in tail_of(f, at) for f, at in zip(logs, log_at)):
                break
            if time.monotonic() > deadline:
                fail("the consumer did not log the warning of its cancelled wait")
            time.sleep(0.1)
        # Acknowledged right after that commit, the entry would be settled
        # by now; it is kept until a commit is confirmed.
        time.sleep(1.0)
        backlog = backlog_of(st)
        if backlog < 1:
            fail(f"the stream entry was settled after a cancelled synchronous wait "
                 f"(backlog {backlog})")
        # Its retry finds the rows there and writes nothing new, yet its
        # commit (the voucher row's lock) waits for the standby as well:
        # acknowledging the entry then confirms the earlier commit.
        wait(lambda: st.node_sql(p, "SELECT count(*) FROM pg_stat_activity"
                                    " WHERE wait_event = 'SyncRep'") != "0",
             20, "the consumer's retry waiting for the standby")
    st.wait_settled()
    wait(lambda: backlog_of(st, strict=False) == 0, 60, "the stream drained after the thaw")
    if orders_of(st, v, user) != 1:
        fail(f"user {user} has {orders_of(st, v, user)} orders after the drain, want 1")
    print(f"    redis-first: cancelled wait -> entry kept ({backlog} unsettled), lands after the thaw",
          flush=True)


def tail_of(path, at):
    """What file 'path' holds past offset 'at'."""
    with open(path) as f:
        f.seek(at)
        return f.read()


def backlog_of(st, strict=True):
    """Unsettled Redis-first orders, as the first instance's /stats has them;
    None (unless strict) while /stats answers 503 (its Postgres session is
    refused, as every session is while commits do not wait)."""
    r = ss.request(st.app_ports[0], "GET", "/stats", timeout=10)
    if r.status == 503 and not strict:
        return None
    if r.status != 200:
        fail(f"/stats -> {r.status} {r.body}")
    return r.body["redisFirst"]["backlog"]


def wait(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            fail(f"timed out after {timeout} s: {what}")
        time.sleep(0.2)


@test
def a_session_below_synchronous_commit_on_takes_no_order_and_ready_says_why():
    st = the_stack()
    st.use("optimistic")
    try:
        ss.psql("ALTER ROLE postgres SET synchronous_commit = local", dsn=st.dsn)
        try:
            st.command("restart-instances", 120, STACK_TIMEOUT=5)
            fail("the instances became ready with synchronous_commit = local")
        except kit.KitError:
            pass
        r = ss.request(st.app_ports[0], "GET", "/ready", timeout=5)
        msg = r.body.get("message", "") if isinstance(r.body, dict) else ""
        if r.status != 503 or "synchronous_commit is 'local'" not in msg:
            fail(f"/ready -> {r.status} {r.body}")
        v_buy = ss.request(st.app_ports[0], "POST", "/voucher/1/seckill",
                           {"X-User-Id": str(user_base() + 2)}, timeout=10)
        if v_buy.status != 503:
            fail(f"an order with synchronous_commit = local -> {v_buy.status} {v_buy.body}")
    finally:
        ss.psql("ALTER ROLE postgres RESET synchronous_commit", dsn=st.dsn)
    try:
        st.restart_instances({}, timeout=120)
    except kit.KitError as e:
        fail(str(e))



@test
def a_role_without_pg_read_all_stats_takes_no_order_and_ready_says_why():
    """Commits are confirmed by reading the standbys' flush positions in
    pg_stat_replication, which a role without pg_read_all_stats sees as
    NULL: such a session is refused (/ready names the grant, orders 503),
    and once the role is granted it, the instance sells."""
    st = the_stack()
    role = "seckill_nostats"
    ss.psql(f"DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN; "
            f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}; "
            f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}", dsn=st.dsn)
    if "postgres@" not in st.dsn:
        fail(f"PG_DSN {st.dsn} names no user to replace")
    srv = ss.Server("pgha-nostats", {"PG_DSN": st.dsn.replace("postgres@", f"{role}@", 1),
                                     "PG_HA": 1, "ADMIN_TOKEN": None})
    try:
        v = st.new_voucher()
        r = srv.get("/ready")
        msg = r.body.get("message", "") if isinstance(r.body, dict) else ""
        if r.status != 503 or "pg_read_all_stats" not in msg:
            fail(f"/ready of a role without pg_read_all_stats -> {r.status} {r.body}")
        r = srv.seckill(v, user_base() + 7)
        if r.status != 503:
            fail(f"an order of a role without pg_read_all_stats -> {r.status} {r.body}")
        ss.psql(f"GRANT pg_read_all_stats TO {role}", dsn=st.dsn)
        ss.wait_for(lambda: srv.get("/ready").status == 200, 30, "ready once granted")
        r = srv.seckill(v, user_base() + 8)
        if r.status != 200:
            fail(f"an order once granted -> {r.status} {r.body}")
    finally:
        srv.stop_ok()
        ss.psql(f"DROP OWNED BY {role}; DROP ROLE IF EXISTS {role}", dsn=st.dsn)


def primary_sql(st, sql):
    p = st.primary()
    port = st.info["PG_NODE_PORTS"].split()[p - 1]
    ss.psql(sql, dsn=f"host=127.0.0.1 port={port} user=postgres dbname=seckill")


RECHECK_S = 1.0                 # sessions in use are checked again once a second


@test
def a_session_in_use_stops_taking_orders_once_its_commits_no_longer_wait():
    """synchronous_commit turned to local on the primary (ALTER SYSTEM and a
    reload) under sessions that passed their check when they opened: they
    are checked again once a second, and once checked none takes an order,
    with no restart; sales resume once it is back to on."""
    st = the_stack()
    st.use("optimistic")
    v = st.new_voucher()
    base = user_base() + 100
    warm = [ss.request(st.nginx_port, "POST", f"/voucher/{v}/seckill",
                       {"X-User-Id": str(base + i)}, timeout=10).status for i in range(8)]
    if warm != [200] * 8:
        fail(f"before the change: {warm}")
    primary_sql(st, "ALTER SYSTEM SET synchronous_commit = local")
    primary_sql(st, "SELECT pg_reload_conf()")
    n = 8
    try:
        first_503 = None
        deadline = time.monotonic() + 15
        while first_503 is None and time.monotonic() < deadline:
            r = ss.request(st.nginx_port, "POST", f"/voucher/{v}/seckill",
                           {"X-User-Id": str(base + n)}, timeout=10)
            n += 1
            if r.status == 503:
                first_503 = time.monotonic()
            elif r.status != 200:
                fail(f"a buyer after the change: {r.status} {r.body}")
        if first_503 is None:
            fail("sessions took orders for 15 s after synchronous_commit became local")
        # Every session's last check is now older than the period: each
        # is checked at its next use.
        time.sleep(RECHECK_S + 0.2)
        after = []
        for _ in range(12):
            r = ss.request(st.nginx_port, "POST", f"/voucher/{v}/seckill",
                           {"X-User-Id": str(base + n)}, timeout=10)
            n += 1
            after.append(r.status)
        if after != [503] * 12:
            fail(f"answers once every session was due for its check: {after}")
        for port in st.app_ports:
            r = ss.request(port, "GET", "/ready", timeout=5)
            msg = r.body.get("message", "") if isinstance(r.body, dict) else ""
            if r.status != 503 or "synchronous_commit is 'local'" not in msg:
                fail(f"/ready of port {port} -> {r.status} {r.body}")
    finally:
        primary_sql(st, "ALTER SYSTEM RESET synchronous_commit")
        primary_sql(st, "SELECT pg_reload_conf()")
    wait(lambda: ss.request(st.nginx_port, "POST", f"/voucher/{v}/seckill",
                            {"X-User-Id": str(base + 999)}, timeout=10).status == 200,
         30, "a sale once synchronous_commit is on again")
    print(f"    synchronous_commit local in use: first 503 after {n - 8 - 12} buyer(s); "
          f"then 12 x 503", flush=True)


@test
def the_redis_first_consumer_lands_nothing_while_commits_do_not_wait():
    """The same change under the Redis-first consumers: buyers are still
    admitted (200 from Redis), and the consumers, their sessions checked
    again, land none of those orders until synchronous_commit is on again;
    then every one lands once."""
    st = the_stack()
    st.use("redis")
    v = st.new_voucher(1000)
    base = user_base() + 300
    for i in range(4):
        ss.request(st.nginx_port, "POST", f"/voucher/{v}/seckill",
                   {"X-User-Id": str(base + i)}, timeout=10)
    wait(lambda: backlog_of(st) == 0, 30, "the first orders landed")
    retries = lambda: sum(metric(port, "seckill_stream_retries_total")  # noqa: E731
                          for port in st.app_ports)
    primary_sql(st, "ALTER SYSTEM SET synchronous_commit = local")
    primary_sql(st, "SELECT pg_reload_conf()")
    users = [base + 10 + i for i in range(6)]
    try:
        time.sleep(RECHECK_S + 0.2)
        r0 = retries()
        got = [ss.request(st.nginx_port, "POST", f"/voucher/{v}/seckill",
                          {"X-User-Id": str(u)}, timeout=10).status for u in users]
        if got != [200] * len(users):
            fail(f"Redis-first admission while the consumers cannot land: {got}")
        wait(lambda: retries() >= r0 + 2, 30, "the consumers refusing to land (stream retries)")
        landed = [u for u in users if orders_of(st, v, u)]
        if landed:
            fail(f"orders landed while synchronous_commit was local: users {landed}")
    finally:
        primary_sql(st, "ALTER SYSTEM RESET synchronous_commit")
        primary_sql(st, "SELECT pg_reload_conf()")
    wait(lambda: backlog_of(st, strict=False) == 0, 60,
         "the stream drained once synchronous_commit is on")
    counts = [orders_of(st, v, u) for u in users]
    if counts != [1] * len(users):
        fail(f"orders per user after the drain: {counts}")
    print(f"    redis-first: {len(users)} admitted, none landed while local, all once after",
          flush=True)


def metric(port, name):
    r = ss.request(port, "GET", "/metrics", timeout=10)
    for line in r.body.splitlines() if isinstance(r.body, str) else []:
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    fail(f"{name} not in /metrics of port {port}")



def commit_waits(st, n):
    """Does a commit on node n wait for a standby now (kit.commit_waits)?"""
    port = st.info["PG_NODE_PORTS"].split()[n - 1]
    return kit.commit_waits(f"host=127.0.0.1 port={port} user=postgres dbname=seckill")


class Unapplied:
    """The primary's standby list set, and not in force: emptied, then set
    again while its checkpointer is stopped (only the checkpointer makes
    backends wait for a standby). SHOW and pg_stat_replication name the
    standbys; a commit returns without any. Every pg_autoctl and the monitor
    are frozen meanwhile (they would set the list themselves), and, once it
    is in place, both standbys' walreceivers."""

    def __init__(self, st):
        self.st = st
        self.p = st.primary()
        self.frozen = kit.proc_tree(st.pid("pg-monitor"))
        for n in (1, 2, 3):
            self.frozen += [x for x in st.node_tree(n)
                            if (kit.cmdline(x) or "").startswith("pg_autoctl")]
        self.receivers = []
        self.ckpt = None

    def sql(self, q):
        port = self.st.info["PG_NODE_PORTS"].split()[self.p - 1]
        kit.psql(f"host=127.0.0.1 port={port} user=postgres dbname=seckill", q)

    def receivers_stopped(self, stop):
        signal_all(self.receivers, signal.SIGSTOP if stop else signal.SIGCONT)

    def __enter__(self):
        st, p = self.st, self.p
        self.names = st.node_sql(p, "SHOW synchronous_standby_names")
        self.receivers = [int(st.node_sql(n, "SELECT pid FROM pg_stat_wal_receiver"))
                          for n in (1, 2, 3) if n != p]
        self.ckpt = int(st.node_sql(p, "SELECT pid FROM pg_stat_activity"
                                       " WHERE backend_type = 'checkpointer'"))
        signal_all(self.frozen, signal.SIGSTOP)
        self.sql("ALTER SYSTEM SET synchronous_standby_names = ''")
        self.sql("SELECT pg_reload_conf()")
        # Applied once a commit with the walreceivers stopped returns.
        deadline = time.monotonic() + 20
        while True:
            self.receivers_stopped(True)
            waited = commit_waits(st, p)
            self.receivers_stopped(False)
            if not waited:
                break
            if time.monotonic() > deadline:
                fail("an empty standby list was not applied within 20 s")
        os.kill(self.ckpt, signal.SIGSTOP)
        self.sql(f"ALTER SYSTEM SET synchronous_standby_names = '{self.names}'")
        self.sql("SELECT pg_reload_conf()")
        wait(lambda: st.node_sql(p, "SHOW synchronous_standby_names") == self.names, 10,
             "the standby list back in the settings")
        self.receivers_stopped(True)
        if commit_waits(st, p):
            fail("with the checkpointer stopped, a commit still waited for a standby: "
                 "the hazard this test needs is not there")
        return self

    def __exit__(self, *exc):
        self.receivers_stopped(False)
        if self.ckpt is not None:
            try:
                os.kill(self.ckpt, signal.SIGCONT)
            except ProcessLookupError:
                pass
        signal_all(self.frozen, signal.SIGCONT)


@test
def a_commit_postgres_returns_without_a_standby_is_503_not_200():
    """Postgres returns commits without a standby while the standby list is
    in its settings but not yet applied (Unapplied); every check of the
    session passes then. Each commit is confirmed against a synchronous
    standby's reported flush position before its 200: the buyer gets 503
    (one-statement order, batch), the Redis-first entry stays unsettled;
    once the standbys are back the order is there once."""
    st = the_stack()
    for k, strategy in enumerate(("optimistic", "batched", "redis")):
        st.use(strategy)
        v = st.new_voucher(1000)
        user = user_base() + 500 + k
        port = st.app_ports[0]
        with Unapplied(st):
            wait(lambda: ss.request(port, "GET", "/ready", timeout=5).status == 200, 15,
                 f"{strategy}: /ready once the standby list is back in the settings")
            # Either instance's consumers may read the entry.
            retries = lambda: sum(metric(q, "seckill_stream_retries_total")  # noqa: E731
                                  for q in st.app_ports)
            r0 = retries() if strategy == "redis" else 0
            r, took = st.buy(port, v, user)
            if strategy == "redis":
                if r.status != 200:
                    fail(f"redis: admission {r.status} {r.body}")
                wait(lambda: retries() >= r0 + 1, 20,
                     "redis: the consumer keeping the unconfirmed batch pending")
                if backlog_of(st) < 1:
                    fail("redis: the entry was settled though no standby has its commit")
            elif r.status != 503:
                fail(f"{strategy}: a commit no standby has -> {r.status} {r.body}, want 503")
        st.wait_settled()
        if strategy == "redis":
            wait(lambda: backlog_of(st, strict=False) == 0, 60, "redis: the stream drained")
        else:
            r2, _ = st.buy(port, v, user)
            if r2.status not in (200, 409):
                fail(f"{strategy}: the retry -> {r2.status} {r2.body}")
        if orders_of(st, v, user) != 1:
            fail(f"{strategy}: user {user} has {orders_of(st, v, user)} orders, want 1")
        print(f"    {strategy}: commit without a standby -> "
              f"{'entry kept' if strategy == 'redis' else f'503 after {took:.1f} s'}", flush=True)


# ---------------------------------------------------------------- failover under load

def waited_past_bound(r):
    """Did request r wait for a standby until a bound gave up on it (the
    commit's confirmation, PG_STATEMENT_TIMEOUT_MS, or the round trip's)?
    Its commit may exist: an answer of unknown outcome."""
    return (r.t1 - r.t0) * 1000 >= STATEMENT_TIMEOUT_MS - 100


def failover_figures(st, v, recs, t_begin, t_fault, t_promoted, label):
    after = [r for r in recs if r.t0 >= t_fault]
    first_ok = min((r.t1 for r in after if r.status == 200), default=None)
    switch = [r for r in after if first_ok is None or r.t0 < first_ok]
    lat = [(r.t1 - r.t0) * 1000 for r in switch]
    figs = {"faultToFirst200S": round(first_ok - t_fault, 2) if first_ok else None,
            "duringSwitch": tally(switch), "switchMaxLatencyMs": round(max(lat), 1) if lat else 0}
    if first_ok is None:
        fail(f"{label}: no sale after the fault: {figs}")
    wrong = Counter(outcome(r) for r in switch
                    if not (r.status == 200 or (r.status == 503 and r.code == "unavailable")))
    if wrong:
        fail(f"{label}: answers during the switch other than 200 and 503 unavailable: "
             f"{dict(wrong)}")
    # A 503 may be a commit that a standby has (the order exists, and the
    # buyer's retry would meet it): the requests in flight at the fault, and
    # those that waited for a standby past the bound (a cut round trip, or a
    # confirmation that no standby gave within the statement timeout).
    unknown = sum(1 for r in recs if r.status == 503 and (
        (r.t0 < t_fault and r.t1 >= t_begin) or waited_past_bound(r)))
    figs.update(load_kit.check_invariants(st, v, recs, f"pg-ha-{label}", unknown_extra=unknown))
    figs["promotedAfterS"] = round(t_promoted - t_fault, 2)
    FIG[label] = figs
    print(f"    {label}: kill -> first 200 after {figs['faultToFirst200S']} s; "
          f"{figs['answers200']} answered 200, {figs['orders']} orders, "
          f"during the switch {figs['duringSwitch']}", flush=True)
    return figs


def sale_through_a_fault(st, strategy, label, fault, heal, heal_first=False):
    """A sale through nginx; fault(primary) mid-sale; heal(old primary) once
    the sale is over (heal_first: as soon as another node is primary, for a
    fault that stops sales until it is healed). Its figures and answers."""
    st.use(strategy)
    v = st.new_voucher()
    workers = [("nginx", st.nginx_port)] * 8
    load = Load(v, workers, user_base=user_base() + 1000).start()
    healed = False
    time.sleep(2.0)
    old = st.primary()
    t_begin = time.monotonic()
    try:
        fault(old)
        t_fault = time.monotonic()
        new = st.wait_primary_other_than(old)
        t_promoted = time.monotonic()
        if heal_first:
            heal(old)
            healed = True
        # sell on until RUN_AFTER_S past the first 200 after the fault
        deadline = time.monotonic() + FAILOVER_BOUND_S
        while time.monotonic() < deadline:
            if any(r.status == 200 and r.t0 >= t_fault for r in list(load.records)):
                break
            time.sleep(0.2)
        time.sleep(RUN_AFTER_S)
    finally:
        recs = load.stop()
        if not healed:
            heal(old)
    if strategy == "redis":
        # Admitted orders land through the consumers: all of them, once
        # Postgres takes orders again.
        try:
            figs_drain = round(kit.drain_stream(st.redis_cli, 120), 2)
        except kit.KitError as e:
            fail(f"{label}: the admitted orders did not land: {e}")
    figs = failover_figures(st, v, recs, t_begin, t_fault, t_promoted, label)
    if strategy == "redis":
        figs["drainedAfterSaleS"] = figs_drain
    figs["newPrimary"] = new
    st.wait_settled()
    return figs, recs


def kill_node(st, n):
    pids = st.node_tree(n)
    signal_all(pids, signal.SIGSTOP)      # nothing restarts what the next kill misses
    signal_all(pids, signal.SIGKILL)


def restart_node(st, n):
    try:
        st.service("start", f"pg-node-{n}")
    except kit.KitError as e:
        fail(str(e))


def primary_killed(strategy):
    st = the_stack()
    _figs, recs = sale_through_a_fault(st, strategy, f"kill-{strategy}",
                                       lambda n: kill_node(st, n), lambda n: restart_node(st, n))
    within_bound(recs, f"kill-{strategy}")


@test
def primary_sigkilled_mid_sale_optimistic_loses_no_acknowledged_order():
    primary_killed("optimistic")


@test
def primary_sigkilled_mid_sale_batched_loses_no_acknowledged_order():
    primary_killed("batched")


@test
def primary_sigkilled_mid_sale_redis_first_loses_no_acknowledged_order():
    primary_killed("redis")


@test
def primary_sigstopped_no_buyer_waits_past_the_bound():
    st = the_stack()
    frozen = {}

    def freeze(n):
        frozen["pids"] = st.node_tree(n)
        signal_all(frozen["pids"], signal.SIGSTOP)

    def thaw(n):
        signal_all(frozen["pids"], signal.SIGCONT)

    figs, recs = sale_through_a_fault(st, "optimistic", "sigstop-optimistic", freeze, thaw)
    within_bound(recs, "sigstop")


def within_bound(recs, label):
    """No answer later than the service's bound for one request: a round trip
    cut at ROUND_TRIP_MS, then one connect through the DSN's three hosts, each
    given libpq's connect_timeout (at least 2 s: libpq raises lower values)."""
    bound = ROUND_TRIP_MS + 3 * max(2, CONNECT_TIMEOUT_S) * 1000 + 1000
    lat = [(r.t1 - r.t0) * 1000 for r in recs if r.status is not None]
    FIG.setdefault(label, {})["maxLatencyMs"] = round(max(lat), 1) if lat else 0
    slow = [x for x in lat if x > bound]
    if slow:
        fail(f"{label}: {len(slow)} buyers waited past {bound} ms, the longest {max(slow):.0f} ms")


@test
def pg_autoctl_killed_alone_the_primary_serves_on():
    """Every pg_autoctl process of the primary killed, its postgres left
    running: the monitor's health checks still reach that postgres, so it
    fails nothing over, and the standbys keep following it: sales go on,
    each commit confirmed by a standby."""
    st = the_stack()
    st.use("optimistic")
    v = st.new_voucher()
    load = Load(v, [("nginx", st.nginx_port)] * 8, user_base=user_base() + 5000).start()
    time.sleep(2.0)
    n = st.primary()
    try:
        autoctl = [p for p in st.node_tree(n) if (kit.cmdline(p) or "").startswith("pg_autoctl")]
        signal_all(autoctl, signal.SIGSTOP)
        signal_all(autoctl, signal.SIGKILL)
        t_kill = time.monotonic()
        time.sleep(8.0)
    finally:
        recs = load.stop()
        restart_node(st, n)
    after = [r for r in recs if r.t0 >= t_kill]
    if st.primary() != n:
        fail(f"node {n} is no longer primary: {st.states()}")
    if not after or any(r.status != 200 for r in after):
        fail(f"answers after pg_autoctl was killed: {tally(after)}")
    load_kit.check_invariants(st, v, recs, "pg-ha-autoctl-kill")


@test
def a_primary_that_no_standby_follows_takes_no_order():
    """Both standbys SIGKILLed while the monitor is frozen (so that nothing
    turns the primary asynchronous): the primary runs on, writable, and no
    standby streams from it, as a primary that was replaced behind its back
    would. Its commits would wait for ever: waits are cut at the round-trip
    bound and its sessions are refused (no synchronous standby streams from
    it), so buyers get 503 and never 200. Once the monitor and the standbys
    are back, sales resume; nothing acknowledged is lost."""
    st = the_stack()
    st.use("optimistic")
    v = st.new_voucher()
    load = Load(v, [("nginx", st.nginx_port)] * 8, user_base=user_base() + 7000).start()
    time.sleep(2.0)
    p = st.primary()
    standbys = [n for n in (1, 2, 3) if n != p]
    monitor = kit.proc_tree(st.pid("pg-monitor"))
    try:
        signal_all(monitor, signal.SIGSTOP)
        for n in standbys:
            kill_node(st, n)
        t_kill = time.monotonic()
        time.sleep(6.0)
        t_heal = time.monotonic()
        signal_all(monitor, signal.SIGCONT)
        for n in standbys:
            restart_node(st, n)
        st.wait_settled()
        # Sales resume (a standby streaming again confirms commits): the
        # first 200 after the settle, waited for.
        t_settled = time.monotonic()
        deadline = t_settled + 30
        while time.monotonic() < deadline:
            with load.lock:
                if any(r.status == 200 and r.t0 >= t_settled for r in load.records):
                    break
            time.sleep(0.2)
        time.sleep(0.5)
    finally:
        signal_all(monitor, signal.SIGCONT)
        recs = load.stop()
    alone = [r for r in recs if t_kill + 0.5 <= r.t0 and r.t1 <= t_heal]
    if not alone:
        fail("no answer started and ended while no standby followed the primary: "
             "requests were held instead of refused")
    if any(r.status == 200 for r in alone):
        fail(f"answers while no standby followed the primary: {tally(alone)}")
    wrong = Counter(outcome(r) for r in alone if not (r.status == 503 and r.code == "unavailable"))
    if wrong:
        fail(f"answers other than 503 unavailable while no standby followed: {dict(wrong)}")
    # Refused at once (after at most one recheck period), not held for the
    # round-trip bound on a commit that no standby will confirm.
    slow = kit.percentile([(r.t1 - r.t0) * 1000 for r in alone], 50)
    if slow >= 1000:
        fail(f"while no standby followed, the median answer took {slow:.0f} ms: the primary's "
             f"sessions were not refused")
    tail = [r for r in recs if r.t0 >= t_settled]
    if not any(r.status == 200 for r in tail):
        fail(f"no sale within 30 s of the standbys back: {tally(tail)}")
    unknown = sum(1 for r in recs if r.status == 503 and waited_past_bound(r))
    figs = load_kit.check_invariants(st, v, recs, "pg-ha-no-standby", unknown_extra=unknown)
    within_bound(recs, "no-standby")
    FIG["no-standby"].update(figs, alone=tally(alone))
    print(f"    no standby following: {tally(alone)}", flush=True)


def teardown():
    st = _state.get("stack")
    if st is not None or os.path.isdir(os.path.join(RUN_DIR, "pids")):
        p = (st or Stack()).run("stop", 180)
        if p.returncode != 0:
            print(p.stderr)
    if FIG:
        print("\nfigures:")
        for name, figs in FIG.items():
            print(f"  {name}: {figs}")


if __name__ == "__main__":
    ss.main(teardown)
