#!/usr/bin/env python3
"""SECKILL_STOCK=redis: a 200 is an order, and the order lands in Postgres,
whatever an operator or Postgres does meanwhile.

  refusals for now   Postgres read-only for a while, a table lock held past
                     the statement timeout, every client session terminated
                     every 0.4 s, a fast shutdown and restart: the consumers
                     keep the orders pending and try again; nothing is
                     dead-lettered, every 200 is a row once drained
  resets             a reset never falls inside a consumer's batch: the sale
                     (tb_voucher.sale_gen) is read under the voucher row's
                     lock, which the reset takes first; resets every second
                     during a sale on two instances end with Postgres and
                     Redis in agreement
  watch              every admitting instance checks Redis's durability and
                     the backlog, whether or not it consumes; a Redis that
                     refuses CONFIG; the backlog bound; the oldest unsettled
                     order's age
  404                an unknown voucher is 404 on the Redis-first path too
  Sentinel           the consumer follows a failover to the new master
"""

import os
import random
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seckill_server as ss  # noqa: E402
from seckill_server import fail, psql, psql_value, test  # noqa: E402
from redisfirst_kit import (AUTH, TOKEN, buy_all, counter, drain, durable_redis,  # noqa: E402
                            rcli, reconcile, server, stats, stop_all)


def users(n):
    """n user ids of this run's own (tests share one Postgres)."""
    base = random.randrange(10**12, 9 * 10**12)
    return list(range(base, base + n))


def dead_letters(rs):
    return int(rcli(rs, "XLEN", "seckill:orders:dead"))


def wait_for(cond, timeout, what):
    return ss.wait_for(cond, timeout, what, 0.1)


def admin_psql(sql, timeout=30):
    """psql whose session is never read-only (to undo a read-only default)."""
    p = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", ss.PG_DSN, "-c", sql],
                       capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, PGOPTIONS="-c default_transaction_read_only=off"))
    if p.returncode != 0:
        fail(f"psql {sql!r}: {p.stderr.strip()}")


class Session:
    """A psql session held open, fed statements one at a time (to hold a
    lock while the test does other things)."""

    def __init__(self):
        self.p = subprocess.Popen(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", ss.PG_DSN],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        ss.register_pid(self.p.pid)

    def send(self, sql):
        self.p.stdin.write(sql + "\n")
        self.p.stdin.flush()

    def close(self):
        try:
            self.p.stdin.close()
            self.p.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.p.kill()
        ss.unregister_pid(self.p.pid)


def waiting_on_locks():
    """Client sessions of the test database waiting for a lock."""
    return int(psql_value("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                          " AND wait_event_type = 'Lock'"))


def no_dead_letters(rs, what):
    n = dead_letters(rs)
    if n:
        out = rcli(rs, "XRANGE", "seckill:orders:dead", "-", "+", "COUNT", 3)
        fail(f"{what}: {n} acknowledged orders dead-lettered: {out}")


# ---------------------------------------------------------------- refusals for now

@test
def a_read_only_postgres_keeps_orders_pending_until_it_is_writable():
    rs = durable_redis()
    a = server("rl-readonly", rs)
    try:
        vid = ss.new_voucher(a, TOKEN, 50)
        first, _ = buy_all([a], vid, users(5), workers=2)
        drain(a)
        admin_psql("ALTER SYSTEM SET default_transaction_read_only = on")
        admin_psql("SELECT pg_reload_conf()")
        try:
            # A backend idle in its read of the next message reloads its
            # settings only after that message has begun its transaction:
            # the consumer's first batch may still be written. A first
            # buyer takes that batch (landed or refused, either is fine).
            primer, _ = buy_all([a], vid, users(1), workers=1)
            wait_for(lambda: stats(a)["redisFirst"]["backlog"] == 0 or
                     counter(a, "seckill_stream_retries_total") >= 1, 15, "the first batch")
            # Buyers are admitted meanwhile: Redis decides, Postgres waits.
            during, answers = buy_all([a], vid, users(10), workers=2)
            during.update(primer)
            if len(during) != 11:
                fail(f"admission stopped while Postgres was read-only: {answers}")
            wait_for(lambda: counter(a, "seckill_stream_retries_total") >= 2, 15,
                     "the consumer retrying the refused batch")
            st = stats(a)
            rf = st["redisFirst"]
            if rf["backlog"] < 10 or rf["oldestUnsettledMs"] <= 0:
                fail(f"/stats during the refusal: {rf}")
            # /ready shows what the watch read last (once a second).
            r = wait_for(lambda: (lambda r: r if r.status != 200 or r.body.get("backlog", 0) >= 10
                                  else None)(a.get("/ready")), 5, "/ready's backlog")
            if r.status != 200:
                fail(f"/ready while orders queue: {r.status} {r.body}")
            ages = [float(x.split()[-1]) for x in a.get("/metrics").body.splitlines()
                    if x.startswith("seckill_stream_oldest_unsettled_seconds ")]
            if not ages or ages[0] <= 0:
                fail(f"/metrics's oldest unsettled age: {ages}")
            no_dead_letters(rs, "read-only Postgres")
        finally:
            admin_psql("ALTER SYSTEM RESET default_transaction_read_only")
            admin_psql("SELECT pg_reload_conf()")
        first.update(during)
        st, n = reconcile(a, rs, vid, first, 50)
        no_dead_letters(rs, "after the refusal")
        print(f"    {len(during)} orders admitted while read-only, {n} rows after; "
              f"{st['consumer']['retries']} retries", flush=True)
    finally:
        stop_all(a, rs)


@test
def a_table_lock_held_past_the_statement_timeout_loses_no_order():
    # What a plain CREATE INDEX takes: SHARE on the order table, here for
    # 6 s against a 1 s statement timeout.
    rs = durable_redis()
    a = server("rl-lock", rs, PG_STATEMENT_TIMEOUT_MS=1000)
    s = Session()
    try:
        vid = ss.new_voucher(a, TOKEN, 20)
        # The consumer's session is open and its statements prepared before
        # the lock: its batch meets the lock, not its connection.
        acked, _ = buy_all([a], vid, users(1), workers=1)
        drain(a)
        s.send("BEGIN; LOCK TABLE tb_voucher_order IN SHARE MODE;")
        wait_for(lambda: psql_value("SELECT count(*) FROM pg_locks WHERE mode = 'ShareLock' AND "
                                    "relation = 'tb_voucher_order'::regclass") == "1", 10,
                 "the SHARE lock")
        t0 = time.monotonic()
        during, answers = buy_all([a], vid, users(3), workers=3)
        if len(during) != 3:
            fail(f"admission while the table is locked: {answers}")
        acked.update(during)
        wait_for(lambda: counter(a, "seckill_stream_retries_total") >= 2, 20,
                 "the consumer's batch timing out and being tried again")
        time.sleep(max(0.0, 6 - (time.monotonic() - t0)))
        no_dead_letters(rs, "a lock held past the statement timeout")
        s.send("COMMIT;")
        reconcile(a, rs, vid, acked, 20)
        no_dead_letters(rs, "after the lock")
    finally:
        s.close()
        stop_all(a, rs)


@test
def every_200_lands_while_postgres_sessions_are_terminated_every_0_4_s():
    rs = durable_redis()
    a = server("rl-term-a", rs, CONSUMER_LINGER_MS=0, CONSUMER_BATCH_MAX=20)
    b = server("rl-term-b", rs, CONSUMER_LINGER_MS=0, CONSUMER_BATCH_MAX=20)
    stop = threading.Event()
    killed = [0]

    def terminator():
        while not stop.is_set():
            try:
                n = psql_value("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                               " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                               " AND backend_type = 'client backend'")
                killed[0] += int(n)
            except SystemExit:
                pass                              # its own session may be cut: next round
            stop.wait(0.4)

    t = threading.Thread(target=terminator, daemon=True)
    try:
        vid = ss.new_voucher(a, TOKEN, 100000)
        t.start()
        acked, answers = {}, []
        # Buyers in waves for 8 s (about 20 terminations): the consumers
        # are in a batch most of the time, so many terminations cut one.
        t_end = time.monotonic() + 8
        while time.monotonic() < t_end:
            got, ans = buy_all([a, b], vid, users(100), workers=8)
            acked.update(got)
            answers += ans
        stop.set()
        t.join(10)
        if len(acked) < 500:
            fail(f"only {len(acked)} admitted: {answers[:5]}")
        st, n = reconcile(a, rs, vid, acked, 100000, timeout=60)
        no_dead_letters(rs, "sessions terminated")
        retries = st["consumer"]["retries"] + stats(b)["consumer"]["retries"]
        print(f"    {len(acked)} acknowledged, {n} rows; {killed[0]} sessions terminated, "
              f"{retries} batches tried again", flush=True)
    finally:
        stop.set()
        stop_all(a, b, rs)


def pg_ctl(*args):
    """pg_ctl of the run's Postgres, as its owner (the test run's)."""
    data = psql_value("SHOW data_directory")
    bins = sorted(d for d in os.listdir("/usr/lib/postgresql") if d.isdigit())
    exe = os.environ.get("PG_BIN") or f"/usr/lib/postgresql/{bins[-1]}/bin"
    cmd = [os.path.join(exe, "pg_ctl"), "-D", data] + list(args)
    if os.geteuid() == 0:
        cmd = ["runuser", "-u", "postgres", "--"] + cmd
    return data, cmd


@test
def every_200_lands_through_a_fast_postgres_restart():
    rs = durable_redis()
    a = server("rl-restart", rs)
    data, stop_cmd = pg_ctl("stop", "-m", "fast", "-w", "-t", "30")
    # The log it had (tests/run.sh's, beside the data directory): other
    # tests read it after this one.
    _, start_cmd = pg_ctl("start", "-w", "-t", "30", "-l",
                          os.path.join(os.path.dirname(data), "postgres.log"))
    restarted = False
    try:
        vid = ss.new_voucher(a, TOKEN, 400)
        acked, _ = buy_all([a], vid, users(100), workers=8)
        subprocess.run(stop_cmd, check=True, capture_output=True, timeout=60)
        try:
            more, answers = buy_all([a], vid, users(100), workers=8)
            if len(more) != 100:
                fail(f"admission while Postgres is down: {answers[:5]}")
            acked.update(more)
            time.sleep(1)
            no_dead_letters(rs, "Postgres stopped")
        finally:
            subprocess.run(start_cmd, check=True, capture_output=True, timeout=60)
            restarted = True
        more, _ = buy_all([a], vid, users(50), workers=8)
        acked.update(more)
        st, n = reconcile(a, rs, vid, acked, 400, timeout=60)
        no_dead_letters(rs, "after the restart")
        print(f"    {len(acked)} acknowledged around a fast shutdown, {n} rows", flush=True)
    finally:
        if not restarted:
            subprocess.run(start_cmd, capture_output=True, timeout=60)
        stop_all(a, rs)


# ---------------------------------------------------------------- resets

@test
def a_reset_never_falls_inside_a_consumers_batch():
    # The voucher row held by another session: the consumer's batch of the
    # first sale waits for it, and a reset queues behind the batch. Whichever
    # gets the row first, the reset's DELETE must see what the batch wrote
    # (it reads after taking the row), or the batch's orders must be dropped
    # as the old sale's: Postgres and Redis agree once drained.
    rs = durable_redis()
    front = server("rl-reset-front", rs, CONSUMERS=0, PG_STATEMENT_TIMEOUT_MS=10000)
    b = None
    s = Session()
    try:
        vid = ss.new_voucher(front, TOKEN, 10)
        buyers = users(3)
        old, _ = buy_all([front], vid, buyers, workers=3)
        if len(old) != 3:
            fail(f"{len(old)} acknowledged in the first sale")
        s.send(f"BEGIN; SELECT 1 FROM tb_voucher WHERE voucher_id = {vid} FOR UPDATE;")
        wait_for(lambda: psql_value("SELECT count(*) FROM pg_stat_activity WHERE state = "
                                    "'idle in transaction' AND datname = current_database()")
                 != "0", 10, "the session holding the voucher row")
        b = server("rl-reset-back", rs, PG_STATEMENT_TIMEOUT_MS=10000)
        wait_for(lambda: waiting_on_locks() >= 1, 15, "the consumer's batch waiting for the row")
        reset = {}
        t = threading.Thread(target=lambda: reset.update(
            r=front.post(f"/admin/vouchers/{vid}/reset", AUTH, {"stock": 10}, timeout=30)),
            daemon=True)
        t.start()
        wait_for(lambda: waiting_on_locks() >= 2, 15, "the reset waiting behind the batch")
        s.send("COMMIT;")
        t.join(30)
        r = reset.get("r")
        if r is None or r.status != 200:
            fail(f"reset -> {r and r.status} {r and r.body}")
        # The same users buy again in the new sale, and two more.
        new, answers = buy_all([front], vid, buyers[:2] + users(2), workers=2)
        if len(new) != 4:
            fail(f"the new sale: {answers}")
        st, n = reconcile(b, rs, vid, new, 10)
        if n != 4:
            fail(f"{n} rows after the reset, 4 expected (the old sale's must be gone)")
        no_dead_letters(rs, "a reset behind a batch")
    finally:
        s.close()
        stop_all(front, b, rs)


@test
def resets_every_second_during_a_sale_end_in_agreement():
    rs = durable_redis()
    a = server("rl-resets-a", rs, THREADS=6, CONSUMER_LINGER_MS=0)
    b = server("rl-resets-b", rs, THREADS=6, CONSUMER_LINGER_MS=0)
    try:
        # Stock enough for the whole sale: the consumers are in a batch when
        # most resets come.
        vid = ss.new_voucher(a, TOKEN, 100000)
        for rnd in range(2):
            stop = threading.Event()
            final, lock = {}, threading.Lock()
            last_reset = [time.monotonic()]

            def crowd(srv):
                while not stop.is_set():
                    sent = time.monotonic()
                    u = random.randrange(10**12, 9 * 10**12)
                    r = srv.seckill(vid, u, timeout=15)
                    if r.status == 200:
                        with lock:
                            if sent > last_reset[0]:
                                final[u] = int(r.body["orderId"])
                    elif r.status not in (409, 503):
                        fail(f"{srv.name}: {r.status} {r.raw!r}")

            threads = [threading.Thread(target=crowd, args=(s_,), daemon=True)
                       for s_ in (a, b) for _ in range(4)]
            for t in threads:
                t.start()
            resets = 0
            t_end = time.monotonic() + 5
            while time.monotonic() < t_end:
                time.sleep(1)
                r = (a if resets % 2 else b).post(f"/admin/vouchers/{vid}/reset", AUTH,
                                                  {"stock": 100000})
                if r.status != 200:
                    fail(f"reset -> {r.status} {r.body}")
                with lock:
                    last_reset[0] = time.monotonic()
                    final.clear()
                resets += 1
            time.sleep(1)
            stop.set()
            for t in threads:
                t.join(30)
            st, n = reconcile(a, rs, vid, final, 100000, timeout=60)
            no_dead_letters(rs, "resets during a sale")
            print(f"    round {rnd + 1}: {resets} resets, {len(final)} orders of the final sale "
                  f"acknowledged, {n} rows; {st['consumer']['stale']} stale entries dropped here",
                  flush=True)
    finally:
        stop_all(a, b, rs)


def sale_in_redis(rs, vid):
    g = rcli(rs, "HGET", f"seckill:v:{{{vid}}}", "gen")
    return int(g) if g else None


@test
def a_reset_that_did_not_reach_redis_is_caught_up_by_the_consumer():
    # A reset that committed in Postgres but could not load Redis (Redis
    # unreachable just then) leaves Redis admitting in the old sale: its
    # orders come back as stale. The consumer then drops Redis's copy, and
    # the next buyer rebuilds it from Postgres; without that, every later
    # 200 would be dropped until someone reset the voucher again.
    rs = durable_redis()
    a = server("rl-retire", rs)
    try:
        vid = ss.new_voucher(a, TOKEN, 50)
        buy_all([a], vid, users(3), workers=1)
        drain(a)
        old = sale_in_redis(rs, vid)
        psql(f"BEGIN; SELECT 1 FROM tb_voucher WHERE voucher_id = {vid} FOR UPDATE; "
             f"UPDATE tb_voucher SET stock = 50, initial_stock = 50, sale_gen = sale_gen + 1 "
             f"WHERE voucher_id = {vid}; DELETE FROM tb_voucher_order WHERE voucher_id = {vid}; "
             f"COMMIT;")
        # Admitted in the old sale: dropped as stale; Redis's copy goes.
        buy_all([a], vid, users(2), workers=1)
        wait_for(lambda: sale_in_redis(rs, vid) != old, 15,
                 "Redis's copy of the old sale dropped by the consumer")
        acked, answers = buy_all([a], vid, users(5), workers=2)
        if len(acked) != 5:
            fail(f"after the catch-up: {answers}")
        if sale_in_redis(rs, vid) != old + 1:
            fail(f"Redis holds sale {sale_in_redis(rs, vid)}, Postgres {old + 1}")
        reconcile(a, rs, vid, acked, 50)
    finally:
        stop_all(a, rs)


@test
def a_replayed_dead_letter_counts_again_in_a_rebuilt_voucher():
    # A dead letter's unit and buyer go back on sale when Redis rebuilds the
    # voucher (a rebuild counts only unsettled entries): its replay must
    # take them again, or Redis sells that unit twice and the buyer may buy
    # again.
    rs = durable_redis()
    front = server("rl-replay-front", rs, CONSUMERS=0)
    a = None
    try:
        vid = ss.new_voucher(front, TOKEN, 2)
        first, answers = buy_all([front], vid, users(1), workers=1)
        if len(first) != 1:
            fail(f"the first buyer: {answers}")
        psql(f"UPDATE tb_voucher SET stock = 0 WHERE voucher_id = {vid}")
        a = server("rl-replay", rs)
        # 30 s: each try may meet PG_STATEMENT_TIMEOUT_MS (500 ms) on a busy
        # machine, and is then tried again after a pause of up to 1 s.
        wait_for(lambda: dead_letters(rs) == 1, 30, "the order dead-lettered")
        psql(f"UPDATE tb_voucher SET stock = 2 WHERE voucher_id = {vid}")
        rcli(rs, "DEL", f"seckill:v:{{{vid}}}", f"seckill:v:{{{vid}}}:buyers")
        second, answers = buy_all([a], vid, users(1), workers=1)
        if len(second) != 1:
            fail(f"after the rebuild: {answers}")
        r = a.post("/admin/dead-letters/replay", AUTH, {})
        if r.status != 200 or r.body.get("replayed") != 1:
            fail(f"replay: {r.status} {r.body}")
        u = next(iter(first))
        again = a.seckill(vid, u)
        if again.status != 409:
            fail(f"the replayed buyer bought again: {again.status} {again.raw!r}")
        first.update(second)
        reconcile(a, rs, vid, first, 2)
    finally:
        stop_all(front, a, rs)


# ---------------------------------------------------------------- watch

@test
def an_instance_without_a_consumer_checks_durability_too():
    rs = durable_redis()
    front = server("rl-durable-front", rs, CONSUMERS=0)
    back = server("rl-durable-back", rs)
    try:
        vid = ss.new_voucher(front, TOKEN, 100)
        u = users(10)
        if front.seckill(vid, u[0]).status != 200:
            fail("a sale before the change")
        rcli(rs, "CONFIG", "SET", "appendfsync", "no")
        for srv in (front, back):
            wait_for(lambda: srv.seckill(vid, u[1] if srv is front else u[2]).status == 503, 10,
                     f"{srv.name} refusing orders once Redis stopped fsyncing")
            rf = stats(srv)["redisFirst"]
            if rf["durable"] or srv.get("/ready").status != 503:
                fail(f"{srv.name} still says durable: {rf}")
        rcli(rs, "CONFIG", "SET", "appendfsync", "always")
        wait_for(lambda: front.seckill(vid, u[3]).status == 200, 10,
                 "the instance without a consumer admitting again")
    finally:
        stop_all(front, back, rs)


def start_refused(rs, **env):
    """Runs an instance against rs that must exit by itself at start:
    (exit code, output)."""
    srv = ss.Server("refused", {"ADMIN_TOKEN": TOKEN, "SECKILL_STOCK": "redis",
                                "REDIS_URL": rs.url, **env}, start=False)
    e = srv.build_env()
    e["PORT"] = str(ss.free_port())
    try:
        p = subprocess.run([ss.SECKILL_BIN], env=e, capture_output=True, text=True, timeout=20,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        fail("the instance did not stop at start")
    return p.returncode, p.stdout + p.stderr


@test
def a_redis_that_refuses_config_is_not_taken_as_durable():
    # A managed Redis renames CONFIG away: appendfsync cannot be read, so
    # "aof" refuses orders; "wait" (a replica acknowledges each order)
    # needs no CONFIG.
    no_config = ["--appendonly", "yes", "--appendfsync", "always", "--rename-command", "CONFIG", ""]
    rs = durable_redis(no_config)
    replica = ss.RedisServer(args=["--replicaof", "127.0.0.1", str(rs.port)]).start()
    later = ss.RedisServer(args=no_config)       # started after the instance
    a = w = None
    try:
        # At start: refused, saying why and what to use instead.
        code, out = start_refused(rs, CONSUMERS=0)
        if code != 2 or "CONFIG" not in out or "REDIS_ORDER_DURABILITY=wait" not in out:
            fail(f"aof without CONFIG at start: exit {code}: {out[-400:]}")
        # Running: an instance whose Redis came up only after it started.
        a = server("rl-noconfig", later, CONSUMERS=0)
        later.start()
        vid = ss.new_voucher(a, TOKEN, 10)
        wait_for(lambda: "CONFIG" in stats(a)["redisFirst"]["durabilityCheck"], 10,
                 "/stats saying CONFIG is refused")
        r = a.seckill(vid, users(1)[0])
        if r.status != 503 or a.get("/ready").status != 503:
            fail(f"aof without CONFIG, running: {r.status} {r.raw!r}")
        if "CONFIG" not in a.log_tail(50):
            fail("the log does not say why orders are refused")
        w = server("rl-noconfig-wait", rs, REDIS_ORDER_DURABILITY="wait",
                   REDIS_ORDER_WAIT_REPLICAS=1, REDIS_ORDER_WAIT_MS=2000, REDIS_TIMEOUT_MS=4000)
        vid = ss.new_voucher(w, TOKEN, 10)
        wait_for(lambda: "master_link_status:up" in replica.cli("INFO", "replication"),
                 10, "the replica's link")
        r = w.seckill(vid, users(1)[0])
        if r.status != 200:
            fail(f"wait without CONFIG: {r.status} {r.raw!r}")
    finally:
        stop_all(a, w, replica, later, rs)


@test
def past_the_backlog_bound_admission_stops_until_the_consumers_catch_up():
    rs = durable_redis()
    front = server("rl-bound", rs, CONSUMERS=0, STREAM_BACKLOG_MAX=5)
    back = None
    try:
        vid = ss.new_voucher(front, TOKEN, 100)
        acked, _ = buy_all([front], vid, users(6), workers=1)
        if len(acked) != 6:
            fail(f"{len(acked)} of 6 admitted under the bound")
        wait_for(lambda: front.get("/ready").status == 503, 10, "/ready past the bound")
        r = front.seckill(vid, users(1)[0])
        if r.status != 503:
            fail(f"past the bound: {r.status} {r.raw!r}")
        if not stats(front)["redisFirst"]["overBacklogMax"]:
            fail("/stats does not show the bound passed")
        back = server("rl-bound-back", rs)
        drain(back)
        wait_for(lambda: front.get("/ready").status == 200, 10, "/ready once drained")
        more, _ = buy_all([front], vid, users(2), workers=1)
        if len(more) != 2:
            fail("admission did not resume")
        acked.update(more)
        reconcile(back, rs, vid, acked, 100)
    finally:
        stop_all(front, back, rs)


# ---------------------------------------------------------------- 404

@test
def an_unknown_voucher_is_404_on_the_redis_first_path():
    rs = durable_redis()
    alone = server("rl-404-alone", rs, REDIS_ADMIT_PIPELINES=0)
    lots = server("rl-404-lots", rs)
    try:
        missing = int(psql_value("SELECT COALESCE(max(voucher_id), 0) + 1000000 FROM tb_voucher"))
        for srv in (alone, lots):
            got = []
            for u in users(3):
                r = srv.seckill(missing, u)
                got.append((r.status, r.body.get("error") if isinstance(r.body, dict) else None,
                            r.headers.get("retry-after")))
            if any(g[:2] != (404, "voucher_not_found") or g[2] is not None for g in got):
                fail(f"{srv.name}: {got}")
        # Concurrent buyers of it share a lot: each is told 404.
        answers = buy_all([lots], missing, users(20), workers=10)[1]
        if any(a != (404, "voucher_not_found") for a in answers):
            fail(f"in lots: {answers}")
    finally:
        stop_all(alone, lots, rs)


# ---------------------------------------------------------------- Sentinel

@test
def the_consumer_follows_a_sentinel_failover():
    # A graceful failover leaves the old master running as a replica: a
    # consumer still connected there reads nothing new and persists
    # nothing; it must reconnect to the new master as the other threads do.
    ha = ss.RedisHA("seckill-rl")
    a = None
    try:
        a = ss.Server("rl-sentinel", {"ADMIN_TOKEN": TOKEN, "SECKILL_STOCK": "redis",
                                      "LOG_LEVEL": "info", "REDIS_ORDER_DURABILITY": "wait",
                                      "REDIS_ORDER_WAIT_REPLICAS": 1, "REDIS_ORDER_WAIT_MS": 2000,
                                      "REDIS_TIMEOUT_MS": 4000,
                                      **ha.sentinels_env()})
        vid = ss.new_voucher(a, TOKEN, 100)
        acked, _ = buy_all([a], vid, users(5), workers=2)
        drain(a)
        old = ha.master_port()
        ha.sentinels[0].cli("SENTINEL", "FAILOVER", ha.name)
        new = ha.wait_master(old)
        t0 = time.monotonic()
        more = {}
        while len(more) < 5 and time.monotonic() - t0 < 20:
            got, _ = buy_all([a], vid, users(5 - len(more)), workers=2)
            more.update(got)
            time.sleep(0.2)
        if len(more) < 5:
            fail("no sale on the new master")
        acked.update(more)
        # An order whose WAIT failed during the switch was answered 503 and
        # stands: it lands too. Every 200 must.
        deadline = time.monotonic() + 20
        while not set(acked.values()) <= {int(r[0]) for r in psql(
                f"SELECT id FROM tb_voucher_order WHERE voucher_id = {vid}")}:
            if time.monotonic() > deadline:
                node = ha.node(new)
                fail(f"the orders admitted on the new master (127.0.0.1:{new}) did not land in 20 s:"
                     f" {node.cli('XINFO', 'GROUPS', 'seckill:orders')!r}; "
                     f"{node.cli('XINFO', 'CONSUMERS', 'seckill:orders', 'seckill')!r}\n"
                     f"{a.log_tail(15)}")
            time.sleep(0.2)
        print(f"    {len(more)} orders admitted after the failover landed "
              f"{time.monotonic() - t0:.1f} s after it", flush=True)
    finally:
        if a is not None:
            a.stop_ok()
        ha.stop()


if __name__ == "__main__":
    ss.main()
