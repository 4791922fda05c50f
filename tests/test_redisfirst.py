#!/usr/bin/env python3
"""SECKILL_STOCK=redis: Redis-first admission, orders persisted by the
stream consumers. Against a Redis of the test's own (AOF, appendfsync
always, so that a 200 survives a Redis crash) and the run's Postgres.

Every test ends with the reconciliation: after the stream drained, Postgres
and Redis agree (orders = initial - stock on both sides, the same buyers),
every acknowledged order id is a row, no user has two orders, nothing is
oversold.

  refusal         an instance refuses to start against a Redis that would
                  lose acknowledged orders (no AOF, or appendfsync everysec)
  sale            concurrent buyers through two instances, each user twice
  claim           an instance killed while holding delivered entries: another
                  claims them (XAUTOCLAIM) and they land
  poison          unreadable entries and entries Postgres refuses go to the
                  dead-letter stream with a metric; the others land
  postgres stop   Postgres stopped mid-sale (SIGSTOP, 3 s here; 10 s in
                  make faults): the sale goes on, the orders land after
  redis crash     Redis killed (SIGKILL) mid-sale and restarted from its AOF:
                  no acknowledged order is lost
  rebuild         a voucher's Redis state lost while orders are still in the
                  stream is rebuilt from Postgres plus the stream
  reset           a reset drops the old sale's undrained orders
"""

import os
import random
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seckill_server as ss  # noqa: E402
from seckill_server import fail, psql, psql_value, test  # noqa: E402

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


def rcli(rs, *args):
    return ss.redis([str(a) for a in args], url=rs.url)


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


def drain(srv, timeout=30.0):
    """Waits until the stream is empty and nothing is pending; the stats."""
    deadline = time.monotonic() + timeout
    while True:
        st = stats(srv)
        rf = st["redisFirst"]
        if rf["backlog"] == 0 and rf["pending"] == 0:
            return st
        if time.monotonic() > deadline:
            fail(f"stream not drained within {timeout}s: {rf}")
        time.sleep(0.1)


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


def reconcile(srv, rs, vid, acked, initial):
    """The drained sale: both sides agree, every acknowledged order is a row."""
    st = drain(srv)
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
    if not v["redis"]["agree"] or v["orders"] != len(rows):
        fail(f"/stats does not see the agreement: {v}")
    return st, len(rows)


def counter(srv, name):
    r = srv.get("/metrics")
    for line in r.body.splitlines() if isinstance(r.body, str) else []:
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    fail(f"{name} not in /metrics")


# ---------------------------------------------------------------- tests

@test
def an_instance_refuses_a_redis_that_would_lose_acknowledged_orders():
    for args in (["--appendonly", "no"], ["--appendonly", "yes", "--appendfsync", "everysec"]):
        rs = durable_redis(args)
        try:
            s = ss.Server("rf-refuse", {"SECKILL_STOCK": "redis", "REDIS_URL": rs.url},
                          start=False)
            try:
                s.start(timeout=5)
            except AssertionError as e:
                if "appendfsync always" not in str(e):
                    fail(f"refused for another reason: {e}")
            else:
                s.stop()
                fail(f"started against a Redis run with {args}")
            # Asked for no durability, it starts (the ladder's unsafe step).
            s = ss.Server("rf-none", {"SECKILL_STOCK": "redis", "REDIS_URL": rs.url,
                                      "REDIS_ORDER_DURABILITY": "none"})
            s.stop_ok()
        finally:
            rs.kill()


@test
def a_sale_through_two_instances_sells_once_per_user_and_every_order_lands():
    rs = durable_redis()
    a = server("rf-a", rs)
    b = server("rf-b", rs)
    try:
        vid = ss.new_voucher(a, TOKEN, 60)
        users = range(7000001, 7000201)
        acked, answers = buy_all([a, b], vid, users)
        if len(acked) != 60:
            fail(f"{len(acked)} orders acknowledged for a stock of 60: "
                 f"{sorted(set(answers), key=str)}")
        bad = [x for x in answers if x[0] not in (200, 409)]
        if bad:
            fail(f"unexpected answers: {bad[:5]}")
        st, n = reconcile(a, rs, vid, acked, 60)
        if n != 60 or not st["redisFirst"]["reconciled"]:
            fail(f"{n} rows; redisFirst {st['redisFirst']}")
        landed = stats(a)["consumer"]["landed"] + stats(b)["consumer"]["landed"]
        if landed != 60:
            fail(f"the consumers report {landed} orders landed")
    finally:
        a.stop_ok()
        b.stop_ok()
        rs.kill()


@test
def orders_held_by_a_killed_instance_are_claimed_and_land():
    rs = durable_redis()
    # The orders are admitted by an instance without a consumer; then 'a'
    # takes them all in one read and cannot persist them (its Postgres is
    # unreachable). Killed, it leaves them pending to itself.
    front = server("rf-front", rs, CONSUMERS=0)
    a = b = None
    try:
        vid = ss.new_voucher(front, TOKEN, 20)
        acked, _ = buy_all([front], vid, range(7100001, 7100021), workers=4)
        if len(acked) != 20:
            fail(f"{len(acked)} acknowledged")
        a = server("rf-dead", rs, PG_DSN=f"host=127.0.0.1 port={ss.dead_port()} dbname=x")
        deadline = time.monotonic() + 5
        while int(rcli(rs, "XPENDING", "seckill:orders", "seckill").split()[0]) < 20:
            if time.monotonic() > deadline:
                fail("the instance's consumer did not take the entries")
            time.sleep(0.05)
        a.kill()
        b = server("rf-claimer", rs)
        t0 = time.monotonic()
        reconcile(b, rs, vid, acked, 20)
        took = time.monotonic() - t0
        claimed = stats(b)["consumer"]["claimed"]
        if claimed < 20:
            fail(f"claimed {claimed} entries")
        print(f"# 20 orders of a killed consumer claimed and landed {took:.1f}s after the "
              "claimer started (claim idle 2 s)", flush=True)
    finally:
        front.stop_ok()
        if a is not None:
            a.kill()
        if b is not None:
            b.stop_ok()
        rs.kill()


@test
def a_poison_entry_goes_to_the_dead_letter_stream_and_the_rest_lands():
    rs = durable_redis()
    a = server("rf-poison", rs)
    try:
        vid = ss.new_voucher(a, TOKEN, 10)
        acked, _ = buy_all([a], vid, range(7200001, 7200006), workers=2)
        rcli(rs, "XADD", "seckill:orders", "*", "v", "not-a-number")
        # A well-formed order of a voucher Postgres does not have.
        rcli(rs, "XADD", "seckill:orders", "*", "v", 999999999, "u", 1, "t", 100, "c", 1, "g", 0)
        more, _ = buy_all([a], vid, range(7200006, 7200011), workers=2)
        acked.update(more)
        st, n = reconcile(a, rs, vid, acked, 10)
        dead = rcli(rs, "XRANGE", "seckill:orders:dead", "-", "+")
        if int(rcli(rs, "XLEN", "seckill:orders:dead")) != 2 or "no such voucher" not in dead:
            fail(f"dead letters: {dead!r}")
        if counter(a, "seckill_stream_dead_letters_total") != 2:
            fail("the dead-letter metric does not count 2")
        if st["redisFirst"]["deadLetters"] != 2 or st["redisFirst"]["reconciled"]:
            fail(f"/stats: {st['redisFirst']}")
        if n != 10:
            fail(f"{n} rows")
    finally:
        a.stop_ok()
        rs.kill()


def postgres_pids():
    """The postmaster and its children (the run's Postgres)."""
    backend = int(psql_value("SELECT pg_backend_pid()"))
    with open(f"/proc/{backend}/stat") as f:
        postmaster = int(f.read().rsplit(")", 1)[1].split()[1])
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


def stop_postgres_for(seconds, then=None):
    pids = postgres_pids()
    for p in pids:
        os.kill(p, signal.SIGSTOP)
    try:
        time.sleep(seconds)
        if then is not None:
            then()
    finally:
        for p in pids:
            try:
                os.kill(p, signal.SIGCONT)
            except ProcessLookupError:
                pass


@test
def orders_admitted_while_postgres_is_stopped_land_after_it_returns():
    rs = durable_redis()
    a = server("rf-pgstop", rs)
    try:
        vid = ss.new_voucher(a, TOKEN, 40)
        acked, _ = buy_all([a], vid, range(7300001, 7300011), workers=4)
        seen = {}

        def during():
            got, _ = buy_all([a], vid, range(7300011, 7300041), workers=4)
            seen.update(got)
            seen["backlog"] = stats_redis_backlog(rs)

        stop_postgres_for(3, during)
        if len([k for k in seen if k != "backlog"]) != 30:
            fail(f"{len(seen) - 1} orders acknowledged while Postgres was stopped")
        if seen["backlog"] == 0:
            fail("nothing waited in the stream while Postgres was stopped")
        del seen["backlog"]
        acked.update(seen)
        reconcile(a, rs, vid, acked, 40)
    finally:
        a.stop_ok()
        rs.kill()


def stats_redis_backlog(rs):
    return int(rcli(rs, "XLEN", "seckill:orders"))


@test
def a_redis_crash_with_aof_always_loses_no_acknowledged_order():
    rs = durable_redis()
    a = server("rf-crash", rs, REDIS_TIMEOUT_MS=300)
    try:
        vid = ss.new_voucher(a, TOKEN, 1000)
        acked = {}
        done = threading.Event()

        def crowd():
            got, _ = buy_all([a], vid, range(7400001, 7401201), workers=8)
            acked.update(got)
            done.set()

        t = threading.Thread(target=crowd, daemon=True)
        t.start()
        time.sleep(0.3)
        rs.kill()                          # SIGKILL mid-sale
        time.sleep(0.5)
        rs.start()
        t.join(120)
        if not done.is_set():
            fail("the crowd did not finish")
        if not acked:
            fail("nothing acknowledged")
        # The buyers refused during the outage buy again once Redis is back.
        more, _ = buy_all([a], vid, range(7401201, 7401251), workers=4)
        acked.update(more)
        st, n = reconcile(a, rs, vid, acked, 1000)
        print(f"# Redis killed mid-sale and restarted from its AOF: {len(acked)} acknowledged, "
              f"{n} rows, 0 lost", flush=True)
    finally:
        a.stop_ok()
        rs.kill()


@test
def a_voucher_lost_in_redis_is_rebuilt_from_postgres_and_the_stream():
    rs = durable_redis()
    # Orders admitted with no consumer running wait in the stream while
    # the voucher's Redis state is lost.
    front = server("rf-rebuild-front", rs, CONSUMERS=0)
    b = None
    try:
        vid = ss.new_voucher(front, TOKEN, 30)
        acked, _ = buy_all([front], vid, range(7500001, 7500011), workers=2)
        rcli(rs, "DEL", f"seckill:v:{{{vid}}}", f"seckill:v:{{{vid}}}:buyers")
        # The next buyer rebuilds it: 30 - 10 in the stream - 1.
        more, _ = buy_all([front], vid, list(range(7500001, 7500006)) + [7500100], workers=2)
        if list(more) != [7500100]:
            fail(f"after the rebuild: {more} acknowledged (earlier buyers must be refused)")
        if rcli(rs, "HGET", f"seckill:v:{{{vid}}}", "stock") != "19":
            fail("the rebuilt stock does not count the orders still in the stream")
        acked.update(more)
        b = server("rf-rebuild-back", rs)
        reconcile(b, rs, vid, acked, 30)
    finally:
        front.stop_ok()
        if b is not None:
            b.stop_ok()
        rs.kill()


@test
def a_reset_drops_the_old_sales_undrained_orders():
    rs = durable_redis()
    front = server("rf-reset-front", rs, CONSUMERS=0)
    b = None
    try:
        vid = ss.new_voucher(front, TOKEN, 10)
        old, _ = buy_all([front], vid, range(7600001, 7600006), workers=2)
        if len(old) != 5:
            fail(f"{len(old)} acknowledged")
        r = front.post(f"/admin/vouchers/{vid}/reset", AUTH, {"stock": 10})
        if r.status != 200:
            fail(f"reset -> {r.status} {r.body}")
        new, _ = buy_all([front], vid, range(7600001, 7600004), workers=2)
        if len(new) != 3:
            fail(f"the old sale's buyers were refused after the reset: {new}")
        b = server("rf-reset-back", rs)
        st, n = reconcile(b, rs, vid, new, 10)
        if n != 3 or st["consumer"]["stale"] != 5:
            fail(f"{n} rows, {st['consumer']['stale']} stale entries dropped")
    finally:
        front.stop_ok()
        if b is not None:
            b.stop_ok()
        rs.kill()


if __name__ == "__main__":
    ss.main()
