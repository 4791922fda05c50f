#!/usr/bin/env python3
"""Fencing tokens that never go backwards, and fencing state that does not grow.

A token counter that Redis brings back lower than tokens Postgres already
accepted (a SET by hand, a restart from an older RDB snapshot, a replica that
lagged and was promoted) must not make a legitimate buyer look stale; a holder
that stalled past its lease must still be refused, also when the counter was
rolled back between its grant and the next holder's. The token counters in
Redis and the rows of tb_lock_fence must go away once they are no longer
needed (LOCK_TOKEN_TTL_MS, FENCE_HORIZON_MS), and a write whose token is
older than the horizon is refused, since its fence row may have been swept.
"""

import json
import os
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seckill_server as ss  # noqa: E402
from seckill_server import fail, psql, psql_value, test  # noqa: E402

TOKEN = "fencing-token"
UNIQUE = "uq_voucher_order_user_voucher"


def lock_key(user):
    return f"lock:order:{user}"


def token_key(user):
    return f"redisson_lock_token:{{{lock_key(user)}}}"


def fenced(user):
    """The highest token tb_lock_fence accepted for the user's lock (None: no row)."""
    rows = psql(f"SELECT token FROM tb_lock_fence WHERE lock_key = '{lock_key(user)}'")
    return int(rows[0][0]) if rows else None


def counter(user, url=None):
    v = ss.redis(["GET", token_key(user)], url=url)
    return int(v) if v else None


def voucher(srv, stock=5):
    return ss.new_voucher(srv, TOKEN, stock, "fencing")


def orders_of(vid, user=None):
    where = f"voucher_id = {vid}" + (f" AND user_id = {user}" if user is not None else "")
    return int(psql_value(f"SELECT count(*) FROM tb_voucher_order WHERE {where}"))


def buy(srv, vid, user, want=200, patience=10.0):
    """A purchase that must end with 'want'; 503s (Redis just came back)
    are retried for up to 'patience' seconds."""
    deadline = time.monotonic() + patience
    while True:
        r = srv.seckill(vid, user)
        if r.status != 503 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if r.status != want:
        fail(f"user {user}, voucher {vid}: {r.status} {r.body!r}, want {want} "
             f"(fence {fenced(user)}, counter {counter(user, srv.redis_url)})")
    return r


def wait_for(what, cond, timeout):
    ss.wait_for(cond, timeout, what, 0.02)


class without_unique:
    """Drops the unique constraint for the block, so that only the fence and
    the duplicate check stand between a stale holder and a second order."""

    def __enter__(self):
        psql(f"ALTER TABLE tb_voucher_order DROP CONSTRAINT IF EXISTS {UNIQUE}")

    def __exit__(self, *exc):
        psql("DELETE FROM tb_voucher_order o USING tb_voucher_order p "
             "WHERE o.user_id = p.user_id AND o.voucher_id = p.voucher_id AND o.id > p.id")
        psql(f"ALTER TABLE tb_voucher_order ADD CONSTRAINT {UNIQUE} UNIQUE (user_id, voucher_id)")


def server(name, env=None, redis_url=None):
    env = dict(env or {})
    if redis_url:
        env["REDIS_URL"] = redis_url
    srv = ss.Server(name, {"ADMIN_TOKEN": TOKEN, **env})
    srv.redis_url = redis_url or ss.REDIS_URL
    return srv


@test
def buyer_of_another_voucher_buys_after_the_counter_is_set_back():
    """A user bought voucher A; the counter then falls behind the fence (set
    to 1, set just below the accepted token, deleted). Buying voucher B must
    succeed, and the fence moves on."""
    srv = server("fence-setback")
    try:
        for n, how in enumerate(("set 1", "set below", "del")):
            user = 6_100_000 + n
            a, b = voucher(srv), voucher(srv)
            buy(srv, a, user)
            accepted = fenced(user)
            if accepted is None:
                fail(f"{how}: no fence row after the first purchase")
            if how == "set 1":
                ss.redis(["SET", token_key(user), "1"])
            elif how == "set below":
                ss.redis(["SET", token_key(user), str(accepted - 1000)])
            else:
                ss.redis(["DEL", token_key(user)])
            now = counter(user)
            if now is not None and now >= accepted:
                fail(f"{how}: the counter was not set back ({now} >= {accepted})")
            buy(srv, b, user)
            if not fenced(user) > accepted:
                fail(f"{how}: fence {fenced(user)} did not move past {accepted}")
            if (orders_of(a, user), orders_of(b, user)) != (1, 1):
                fail(f"{how}: orders {orders_of(a, user)}, {orders_of(b, user)}")
    finally:
        srv.stop_ok()


@test
def buyer_buys_after_redis_restarts_from_an_older_snapshot():
    """RDB snapshot after voucher 1; vouchers 2 and 3 move the counter on;
    Redis restarts from the snapshot (its counter is now below the fence);
    voucher 4 must still sell to the same user."""
    rs = ss.RedisServer().start()
    srv = None
    try:
        srv = server("fence-rdb", redis_url=rs.url)
        user = 6_200_000
        vids = [voucher(srv) for _ in range(4)]
        buy(srv, vids[0], user)
        ss.redis(["SAVE"], url=rs.url)
        old = os.path.join(rs.dir, "old.rdb")
        shutil.copyfile(os.path.join(rs.dir, "dump.rdb"), old)
        buy(srv, vids[1], user)
        buy(srv, vids[2], user)
        accepted = fenced(user)
        rs.kill()
        shutil.copyfile(old, os.path.join(rs.dir, "dump.rdb"))
        rs.start()
        restored = counter(user, rs.url)
        if restored is None or restored >= accepted:
            fail(f"the snapshot did not bring the counter back: {restored} vs fence {accepted}")
        # The order-id counter went back too: ids stay unique once the
        # second has changed (they carry it).
        time.sleep(1.1)
        buy(srv, vids[3], user)
        if not fenced(user) > accepted:
            fail(f"fence {fenced(user)} did not move past {accepted}")
        if [orders_of(v, user) for v in vids] != [1, 1, 1, 1]:
            fail(f"orders per voucher: {[orders_of(v, user) for v in vids]}")
    finally:
        if srv is not None:
            srv.stop_ok()
        rs.kill()


@test
def stalled_holder_refused_when_the_counter_rolls_back_between_the_grants():
    """A takes the lock (300 ms lease) and stalls 1.5 s; while it stalls the
    counter is set back to 1; the lease runs out; B (another instance) takes
    the lock and buys. A's write must be refused by the fence (its token is
    below B's), with and without the unique constraint; the fence keeps B's
    token."""
    for constraint in (True, False):
        user = 6_300_000 + (0 if constraint else 1)
        stalled = server("fence-rb-stalled", {"LOCK_LEASE_MS": 300, "DEMO_PAUSE_MS": 1500})
        fresh = server("fence-rb-fresh", {"LOCK_LEASE_MS": 300})
        try:
            ctx = without_unique() if not constraint else None
            if ctx:
                ctx.__enter__()
            try:
                vid = voucher(stalled)
                first = {}
                t = threading.Thread(target=lambda: first.update(r=stalled.seckill(vid, user)))
                t.start()
                wait_for("A's grant", lambda: ss.redis(["EXISTS", lock_key(user)]) == "1", 5)
                ss.redis(["SET", token_key(user), "1"])
                wait_for("A's lease to run out", lambda: ss.redis(["EXISTS", lock_key(user)]) == "0", 5)
                second = fresh.seckill(vid, user)
                b_token = counter(user)
                t.join(10)
                a = first.get("r")
                n = orders_of(vid)
            finally:
                if ctx:
                    ctx.__exit__(None, None, None)
            where = "with" if constraint else "without"
            if second.status != 200:
                fail(f"{where} the constraint: B was refused: {second.status} {second.body!r}")
            if a is None or a.status != 409 or "fencing" not in a.body.get("message", ""):
                fail(f"{where} the constraint: A's write was not refused by the fence: "
                     f"{a and a.status} {a and a.body!r}")
            if fenced(user) != b_token:
                fail(f"{where} the constraint: fence {fenced(user)}, B's token {b_token}")
            if n != 1:
                fail(f"{where} the constraint: {n} orders")
            if stalled.get("/stats").body["lock"].get("staleTokenRejections") != 1:
                fail(f"{where} the constraint: stale-token rejection not counted")
        finally:
            stalled.stop_ok()
            fresh.stop_ok()


@test
def write_later_than_the_horizon_after_its_grant_is_refused():
    """FENCE_HORIZON_MS=1000: a holder that writes 1.6 s after its grant
    (its lease of 10 s still running, no fence row for the user yet) is
    refused, since a row that would have refused it may have been swept.
    The same user then buys at once."""
    slow = server("fence-horizon-slow", {"FENCE_HORIZON_MS": 1000, "DEMO_PAUSE_MS": 1600})
    quick = server("fence-horizon-quick", {"FENCE_HORIZON_MS": 1000})
    try:
        user = 6_400_000
        vid = voucher(slow)
        r = slow.seckill(vid, user)
        if r.status != 409 or "fencing" not in r.body.get("message", ""):
            fail(f"a write 1.6 s after its grant with a 1 s horizon: {r.status} {r.body!r}")
        if orders_of(vid, user) != 0 or fenced(user) is not None:
            fail(f"the refused write left orders {orders_of(vid, user)}, fence {fenced(user)}")
        buy(quick, vid, user)
    finally:
        slow.stop_ok()
        quick.stop_ok()


@test
def sweep_forgets_fence_rows_older_than_twice_the_horizon():
    """FENCE_HORIZON_MS=1000: each instance deletes, once per horizon,
    the rows whose token is more than two horizons old by Postgres's clock;
    younger rows stay, and so do the rows of the other lock services
    (zk:, pg:), whose tokens are counters, not clock readings: the sweep of
    a Redis-locked instance sharing the database must not open their fence
    to a stale holder."""
    now_us = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
    keys = {"old": "lock:order:sweep-old", "new": "lock:order:sweep-new",
            "zk": "zk:lock:order:sweep-zk", "pg": "pg:lock:order:sweep-pg"}
    gone = "DELETE FROM tb_lock_fence WHERE lock_key LIKE '%lock:order:sweep-%'"
    psql(gone)
    psql("INSERT INTO tb_lock_fence (lock_key, token) VALUES "
         f"('{keys['old']}', {now_us} - 60000000), ('{keys['new']}', {now_us} + 60000000),"
         f"('{keys['zk']}', 4294967301), ('{keys['pg']}', 7)")
    srv = server("fence-sweep", {"FENCE_HORIZON_MS": 1000})
    try:
        def present():
            rows = psql("SELECT lock_key FROM tb_lock_fence WHERE lock_key LIKE '%lock:order:sweep-%'")
            return {r[0] for r in rows}
        wait_for("the old row to be swept", lambda: keys["old"] not in present(), 5)
        time.sleep(1.0)                 # a sweep or two more
        if keys["new"] not in present():
            fail(f"a row younger than the horizon was swept: {present()}")
        for other in ("zk", "pg"):
            if keys[other] not in present():
                fail(f"the sweep deleted another lock service's fence row {keys[other]}: {present()}")
        swept = srv.get("/stats").body["lock"].get("fenceRowsSwept")
        if not swept or swept < 1:
            fail(f"/stats lock.fenceRowsSwept: {swept}")
        metrics = srv.get("/metrics").body
        if "seckill_fence_rows_swept_total" not in metrics:
            fail("seckill_fence_rows_swept_total missing from /metrics")
    finally:
        srv.stop_ok()
        psql(gone)


@test
def sweep_pages_through_a_table_larger_than_one_statement_reads():
    """The sweep reads the fence table 5,000 keys at a time (FENCE_PAGE):
    12,000 rows past two horizons are all deleted within a pass or two, and
    /stats counts each."""
    now_us = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
    gone = "DELETE FROM tb_lock_fence WHERE lock_key LIKE 'lock:order:sweep-big-%'"
    psql(gone)
    psql("INSERT INTO tb_lock_fence (lock_key, token) SELECT 'lock:order:sweep-big-' || i, "
         f"{now_us} - 60000000 FROM generate_series(1, 12000) AS i")
    srv = server("fence-sweep-big", {"FENCE_HORIZON_MS": 1000})
    try:
        left = lambda: int(psql_value(  # noqa: E731
            "SELECT count(*) FROM tb_lock_fence WHERE lock_key LIKE 'lock:order:sweep-big-%'"))
        wait_for("12,000 old rows to be swept", lambda: left() == 0, 10)
        swept = lambda: srv.get("/stats").body["lock"].get("fenceRowsSwept") or 0  # noqa: E731
        wait_for("/stats lock.fenceRowsSwept to count 12,000", lambda: swept() >= 12000, 5)
    finally:
        srv.stop_ok()
        psql(gone)


def scan_count(pattern):
    return len(ss.redis(["--scan", "--pattern", pattern]).split())


@test
def token_counters_and_fence_rows_go_away_after_a_sale():
    """300 distinct buyers with LOCK_TOKEN_TTL_MS=2000 and FENCE_HORIZON_MS=2000:
    right after the sale their token counters, release latches and fence rows
    exist; within 10 s none is left (the latches live 5 s, the rows two
    horizons and a sweep period)."""
    srv = server("fence-growth", {"LOCK_TOKEN_TTL_MS": 2000, "FENCE_HORIZON_MS": 2000,
                                  "THREADS": 8, "LOG_LEVEL": "warn"})
    base = 6_500_000
    users = list(range(base, base + 300))
    tokens = "redisson_lock_token:{lock:order:65?????}"
    latches = "redisson_unlock_latch:{lock:order:65?????}:*"
    fence_rows = ("SELECT count(*) FROM tb_lock_fence WHERE lock_key LIKE 'lock:order:65_____'")

    def state():
        return scan_count(tokens), scan_count(latches), int(psql_value(fence_rows))
    try:
        vid = voucher(srv, len(users))
        jobs = [users[i::20] for i in range(20)]
        t0 = time.monotonic()
        res = ss.run_concurrently(lambda i: srv.port, jobs, lambda c, uid: c.seckill(vid, uid), 20)
        ok = sum(1 for _u, r in res if not isinstance(r, Exception) and r.status == 200)
        if ok != len(users):
            fail(f"{ok} of {len(users)} buyers got 200")
        during = state()
        if min(during) == 0:
            fail(f"right after the sale: tokens, latches, fence rows = {during}")
        deadline = time.monotonic() + 10
        after = state()
        while after != (0, 0, 0) and time.monotonic() < deadline:
            time.sleep(0.25)
            after = state()
        print(f"# token counters, release latches, fence rows: right after {during}, "
              f"{time.monotonic() - t0:.1f} s after the sale began {after}", flush=True)
        if after != (0, 0, 0):
            fail(f"10 s after the sale: tokens, latches, fence rows = {after} (right after: {during})")
    finally:
        srv.stop_ok()


@test
def growth_script_reports_the_state_going_away():
    """loadtest/growth.py (make growth), short: a 3 s sale through nginx on a
    stack of its own with 1 s lifetimes. Its JSON shows token counters and
    fence rows right after the sale and none at the end; it exits 0."""
    run_dir = os.path.join(ss.TEST_TMP, "growth-run")
    out = os.path.join(ss.TEST_TMP, "growth.json")
    env = ss.stack_run_env(("GROWTH_KEEP", "GROWTH_EXPECT_BOUNDED"), GROWTH_SALE_S=3,
                           GROWTH_CONNECTIONS=8, GROWTH_TOKEN_TTL_MS=1000,
                           GROWTH_HORIZON_MS=1000, GROWTH_RUN_DIR=run_dir, GROWTH_JSON=out)
    p = subprocess.run([sys.executable, os.path.join(ss.ROOT, "loadtest", "growth.py")],
                       env=env, capture_output=True, text=True, timeout=240)
    if p.returncode != 0:
        fail(f"growth.py exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    with open(out) as f:
        fig = json.load(f)
    after, end = fig["readings"][1], fig["readings"][-1]
    if not (after["tokens"] > 0 and after["fenceRows"] > 0 and fig["sale"]["ok"] > 0):
        fail(f"right after the sale: {after}, sale {fig['sale']}")
    if (end["tokens"], end["latches"], end["fenceRows"]) != (0, 0, 0):
        fail(f"at the end: {end}")
    if "tb_lock_fence rows" not in p.stdout:
        fail(f"no table printed:\n{p.stdout}")


if __name__ == "__main__":
    ss.main()
