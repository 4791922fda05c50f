"""What tests/test_redisfirst.py and tests/test_redisfirst_faults.py share:
a Redis of the test's own with AOF, instances with SECKILL_STOCK=redis, a
crowd of buyers, the drain of the stream and the reconciliation of Redis
and Postgres."""

import os
import random
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seckill_server as ss  # noqa: E402
import kit  # noqa: E402  (loadtest/, on the path through seckill_server)
from seckill_server import fail, psql, psql_value  # noqa: E402

TOKEN = "redisfirst-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DURABLE = ["--appendonly", "yes", "--appendfsync", "always"]


def durable_redis(args=DURABLE):
    """A Redis of the test's own. Its order id counter starts far from 1:
    ids are (second << 32) | count, and the tests' Redis servers share one
    Postgres, where two counters of the same second would collide."""
    rs = ss.RedisServer(args=args).start()
    for day in (time.gmtime(), time.gmtime(time.time() + 3600)):
        rcli(rs, "SET", time.strftime("icr:order:%Y:%m:%d", day),
             random.randrange(10**6, 3 * 10**9))
    return rs


def server(name, rs, **env):
    return ss.Server(name, {"ADMIN_TOKEN": TOKEN, "SECKILL_STOCK": "redis",
                            "REDIS_URL": rs.url, "LOG_LEVEL": "warn",
                            "CONSUMER_CLAIM_IDLE_MS": 2000, "PG_STATEMENT_TIMEOUT_MS": 500,
                            **env})


def stop_all(*procs):
    """The end of a test: each instance stopped (it must exit cleanly), each
    Redis killed; None skipped."""
    for p in procs:
        if isinstance(p, ss.Server):
            p.stop_ok()
        elif p is not None:
            p.kill()


def rcli(rs, *args):
    return ss.redis([str(a) for a in args], url=rs.url)


def unsettled(rs):
    """Orders in the stream not yet acknowledged by the consumers (kit's
    stream_unsettled; the stream keeps settled ones until it is trimmed)."""
    return kit.stream_unsettled(lambda *a: rcli(rs, *a))[0]


def stats(srv):
    r = srv.get("/stats")
    if r.status != 200:
        fail(f"/stats -> {r.status} {r.body!r}")
    return r.body


def voucher_stats(st, vid):
    for v in st["vouchers"]:
        if v["voucherId"] == vid:
            return v
    fail(f"voucher {vid} not in /stats")


def wait_backlog(srv, backlog, pending, timeout=10.0):
    """Waits until /stats shows the stream's backlog (unsettled orders) and
    pending entries as given; the stats."""
    deadline = time.monotonic() + timeout
    while True:
        st = stats(srv)
        rf = st["redisFirst"]
        if (rf["backlog"], rf["pending"]) == (backlog, pending):
            return st
        if time.monotonic() > deadline:
            fail(f"/stats after {timeout}s: {rf}, backlog {backlog} and pending {pending} expected")
        time.sleep(0.1)


def drain(srv, timeout=30.0):
    """Waits until the stream has nothing unsettled; the stats."""
    return wait_backlog(srv, 0, 0, timeout)


def buy_all(servers, vid, users, workers=16):
    """Each user buys once through each server, concurrently. Returns
    (acked {user: order id}, answers [(status, code)])."""
    jobs = [[] for _ in range(workers)]
    n = 0
    for u in users:
        for s in servers:
            jobs[n % workers].append((s, u))
            n += 1

    def one(client, job):
        s, u = job
        return ss.request(s.port, "POST", f"/voucher/{vid}/seckill", {"X-User-Id": str(u)},
                          None, 15)

    res = ss.run_concurrently(lambda i: servers[i % len(servers)].port, jobs, one, workers)
    acked, answers = {}, []
    for (s, u), r in res:
        if isinstance(r, Exception):
            answers.append(("exc", repr(r)))
            continue
        code = r.body.get("error") if isinstance(r.body, dict) else None
        answers.append((r.status, code))
        if r.status == 200:
            if u in acked:
                fail(f"user {u} was answered 200 twice")
            acked[u] = int(r.body["orderId"])
    return acked, answers


def reconcile(srv, rs, vid, acked, initial, timeout=30.0):
    """The drained sale: both sides agree, every acknowledged order is a row."""
    st = drain(srv, timeout)
    v = voucher_stats(st, vid)
    rows = psql(f"SELECT id, user_id FROM tb_voucher_order WHERE voucher_id = {vid}")
    ids = {int(r[0]) for r in rows}
    users = [int(r[1]) for r in rows]
    missing = [oid for oid in acked.values() if oid not in ids]
    if missing:
        fail(f"{len(missing)} acknowledged orders are not in Postgres: {missing[:5]}")
    if len(users) != len(set(users)):
        fail("a user has two orders")
    if len(rows) > initial:
        fail(f"oversold: {len(rows)} orders of {initial}")
    pg_stock = int(psql_value(f"SELECT stock FROM tb_voucher WHERE voucher_id = {vid}"))
    if initial - pg_stock != len(rows):
        fail(f"Postgres: stock {pg_stock}, {len(rows)} orders of {initial}")
    r_stock = int(rcli(rs, "HGET", f"seckill:v:{{{vid}}}", "stock"))
    r_buyers = {int(x) for x in rcli(rs, "SMEMBERS", f"seckill:v:{{{vid}}}:buyers").split()}
    if r_stock != pg_stock or r_buyers != set(users):
        fail(f"Redis stock {r_stock} / {len(r_buyers)} buyers vs Postgres {pg_stock} / "
             f"{len(users)}")
    # /stats is a snapshot of at most STATS_INTERVAL_MS: the rows the
    # consumers wrote show in the next one.
    deadline = time.monotonic() + 10
    while not v.get("redis", {}).get("agree") or v["orders"] != len(rows):
        if time.monotonic() > deadline:
            fail(f"/stats does not see the agreement: {v}")
        time.sleep(0.2)
        st = stats(srv)
        v = voucher_stats(st, vid)
    return st, len(rows)


def counter(srv, name):
    r = srv.get("/metrics")
    for line in r.body.splitlines() if isinstance(r.body, str) else []:
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    fail(f"{name} not in /metrics")



def postgres_pids():
    """The postmaster and its children (the run's Postgres). The postmaster
    is read from its data directory's postmaster.pid, not found as the
    parent of the backend that answered: that backend exits with its
    session, and may be gone before its /proc entry is read."""
    with open(os.path.join(psql_value("SHOW data_directory"), "postmaster.pid")) as f:
        postmaster = int(f.readline())
    pids = [postmaster]
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == postmaster:
                        pids.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return pids


def stop_postgres_for(seconds, then=None, pids=None):
    """SIGSTOP of the whole Postgres (or of the processes 'pids') for
    'seconds' (then() runs meanwhile), SIGCONT whatever happens. A process
    that exited since it was listed (the backend that answered
    postgres_pids' own query does) is skipped; the stops are inside the try
    so that none outlives a failure."""
    pids = postgres_pids() if pids is None else pids
    try:
        for p in pids:
            try:
                os.kill(p, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        t0 = time.monotonic()
        if then is not None:
            then()
        left = seconds - (time.monotonic() - t0)
        if left > 0:
            time.sleep(left)
    finally:
        for p in pids:
            try:
                os.kill(p, signal.SIGCONT)
            except ProcessLookupError:
                pass
