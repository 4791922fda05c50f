#!/usr/bin/env python3
"""SECKILL_STOCK=redis: Redis-first admission, orders persisted by the
stream consumers. Against a Redis of the test's own (AOF, appendfsync
always, so that a 200 survives a Redis crash) and the run's Postgres.

The same faults under load: tests/test_redisfirst_faults.py (make faults).

Every test ends with the reconciliation: after the stream drained, Postgres
and Redis agree (orders = initial - stock on both sides, the same buyers),
every acknowledged order id is a row, no user has two orders, nothing is
oversold.

  script          the admission script alone: sold out, then the buyer, then
                  the deduction; a duplicate takes no unit; a lot of buyers in
                  one call is decided as its buyers one after another
  refusal         an instance refuses to start against a Redis that would
                  lose acknowledged orders (no AOF, or appendfsync everysec)
  sale            concurrent buyers through two instances, each user twice
  pipeline        concurrent admissions share round trips to Redis (one user
                  32 times at once: one order), none without pipelining or
                  with one worker; a script Redis forgot is sent again, not
                  refused
  stall           a voucher Redis lost, with the instance's Postgres silent,
                  costs one rebuild and holds up no other voucher's buyers
                  of the same round trip
  linger          the consumer gathers a trickle of orders into a few
                  transactions (CONSUMER_LINGER_MS) and reads again at once
                  after a full read; a SIGTERM does not wait the linger out
  claim           an instance killed while holding delivered entries: another
                  claims them (XAUTOCLAIM) and they land
  poison          unreadable entries and entries Postgres refuses go to the
                  dead-letter stream with a metric; the others land; an
                  order whose user has another in Postgres is set aside and
                  the rest of its batch lands
  rebuild         a voucher's Redis state lost while orders are still in the
                  stream is rebuilt from Postgres plus the stream; entries
                  already settled (persisted, dead-lettered) do not count
  trim            settled entries leave the stream whole nodes at a time,
                  never one pending to or not yet read by any group; /stats's backlog counts
                  the unsettled orders, not the stream's length; a rebuild
                  counts pending and undelivered orders, not settled ones, and
                  reads Postgres in one snapshot
  reset           a reset drops the old sale's undrained orders
  names           the consumer names restarts leave in the group go once idle
                  with nothing pending; a dead one holding orders stays until
                  they are claimed
  dead cap        the dead-letter stream keeps about DEAD_LETTERS_MAX entries,
                  the newest; a dead letter carries the order whole
  replay          POST /admin/dead-letters/replay puts dead letters whose cause
                  was fixed back in the stream, each once; they land
  group           the consumers' group destroyed under a running consumer is
                  made again; the orders land, none twice
  window          Redis's copy of the voucher and Redis's clock decide the
                  sale window; a malformed copy refuses its buyers only
"""

import datetime
import os
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seckill_server as ss  # noqa: E402
from seckill_server import fail, test  # noqa: E402

from redisfirst_kit import (AUTH, TOKEN, buy_all, counter, drain, durable_redis,  # noqa: E402
                            rcli, reconcile, server, stats, unsettled, wait_backlog)

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
def durability_wait_answers_200_only_once_a_replica_has_the_order():
    # Redis without AOF, as a Sentinel-run master may be; one replica.
    rs = durable_redis(["--appendonly", "no"])
    replica = ss.RedisServer(args=["--replicaof", "127.0.0.1", str(rs.port)]).start()
    a = None
    try:
        deadline = time.monotonic() + 10
        while "master_link_status:up" not in rcli(replica, "INFO", "replication"):
            if time.monotonic() > deadline:
                fail("the replica did not connect")
            time.sleep(0.05)
        # A generous wait: a replica's acknowledgement took more than 300 ms
        # while make bench loaded the machine (the 200 then was a 503). WAIT
        # must answer within the command timeout.
        a = server("rf-wait", rs, REDIS_ORDER_DURABILITY="wait", REDIS_ORDER_WAIT_MS=3000,
                   REDIS_TIMEOUT_MS=5000)
        vid = ss.new_voucher(a, TOKEN, 10)
        r = a.seckill(vid, 7700001)
        if r.status != 200:
            fail(f"with a replica: {r.status} {r.body}")
        oid = r.body["orderId"]
        if rcli(replica, "SISMEMBER", f"seckill:v:{{{vid}}}:buyers", 7700001) != "1":
            fail("answered 200 before the replica had the buyer")
        replica.kill()
        r = a.seckill(vid, 7700002)
        if r.status != 503:
            fail(f"without a replica: {r.status} {r.body} (want 503)")
        # The order stands (it is in the stream): the retry is a duplicate.
        r = a.seckill(vid, 7700002)
        if r.status != 409 or r.body["error"] != "already_ordered":
            fail(f"the retry: {r.status} {r.body}")
        reconcile(a, rs, vid, {7700001: int(oid)}, 10)
    finally:
        replica.kill()
        if a is not None:
            a.stop_ok()
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
def the_consumer_gathers_a_trickle_into_few_batches_and_reads_on_after_a_full_one():
    rs = durable_redis()
    a = None
    try:
        # A trickle: 30 orders, one every 20 ms. Read as they come, each is a
        # batch of its own; with a 300 ms linger they land in a few.
        a = server("rf-linger", rs, CONSUMER_LINGER_MS=300)
        vid = ss.new_voucher(a, TOKEN, 30)
        acked = {}
        t0 = time.monotonic()
        for u in range(7150001, 7150031):
            r = a.post(f"/voucher/{vid}/seckill", headers={"X-User-Id": str(u)})
            if r.status != 200:
                fail(f"user {u}: {r.status} {r.body!r}")
            acked[u] = int(r.body["orderId"])
            time.sleep(0.02)
        spread = time.monotonic() - t0       # 0.6 s and more on a loaded machine
        reconcile(a, rs, vid, acked, 30)
        batches = stats(a)["consumer"]["batches"]
        if batches > spread / 0.3 + 3:
            fail(f"30 orders over {spread:.1f} s landed in {batches} batches with a 300 ms "
                 "linger")
        a.stop_ok()
        a = None
        # A burst larger than a batch: after a full read the consumer reads
        # on at once. Waiting its 1 s linger after each of the 10 reads would
        # take 10 s.
        a = server("rf-linger-full", rs, CONSUMER_LINGER_MS=1000, CONSUMER_BATCH_MAX=10)
        vid = ss.new_voucher(a, TOKEN, 100)
        acked, _ = buy_all([a], vid, range(7150101, 7150201), workers=8)
        if len(acked) != 100:
            fail(f"{len(acked)} of 100 acknowledged")
        t0 = time.monotonic()
        reconcile(a, rs, vid, acked, 100)
        took = time.monotonic() - t0
        if took > 4:
            fail(f"100 orders in batches of 10 took {took:.1f}s to land with a 1 s linger")
        print(f"# a trickle of 30 orders: {batches} batches; 100 orders in batches of 10 "
              f"landed {took:.1f}s after the burst (linger 1 s)", flush=True)
    finally:
        if a is not None:
            a.stop_ok()
        rs.kill()


@test
def a_long_linger_does_not_hold_up_a_shutdown():
    """CONSUMER_LINGER_MS=1000: a SIGTERM while the consumer waits out its
    linger stops the instance at once, not after the rest of the second."""
    rs = durable_redis()
    a = server("rf-linger-stop", rs, CONSUMER_LINGER_MS=1000, LOG_LEVEL="info")
    try:
        vid = ss.new_voucher(a, TOKEN, 5)
        r = a.post(f"/voucher/{vid}/seckill", headers={"X-User-Id": "7150301"})
        if r.status != 200:
            fail(f"{r.status} {r.body!r}")
        # The row lands right after the consumer's read; from then on it
        # lingers for the rest of the second.
        deadline = time.monotonic() + 5
        while ss.psql_value(f"SELECT count(*) FROM tb_voucher_order WHERE voucher_id = {vid}") \
                != "1":
            if time.monotonic() > deadline:
                fail("the order did not land")
            time.sleep(0.01)
        rc, _ = a.stop(15)
        # From the instance's log: the signal, then "stopped" once every
        # thread is joined (process teardown, slow under TSan, left out).
        at = {}
        with open(a.log_path) as f:
            for line in f:
                for key, what in (("signal", " info  signal 15"), ("stopped", " info  stopped")):
                    if what in line:
                        at[key] = datetime.datetime.fromisoformat(line.split()[0][:-1])
        if rc != 0 or len(at) != 2:
            fail(f"stopped with {rc}; log lines found: {sorted(at)}")
        took = (at["stopped"] - at["signal"]).total_seconds()
        if took > 0.5:
            fail(f"stopped {took:.2f}s after SIGTERM while the consumer lingered")
        print(f"# stopped {took:.2f}s after SIGTERM during a 1 s linger", flush=True)
    finally:
        a.kill()
        rs.kill()


@test
def the_admission_script_checks_sold_out_then_the_buyer_then_deducts():
    # lua/order_admit.lua on its own: the service's order of checks, and a
    # duplicate takes no unit.
    rs = durable_redis()
    with open(os.path.join(ss.LUA_DIR, "order_admit.lua")) as f:
        script = f.read()
    h, buyers = "seckill:v:{424242}", "seckill:v:{424242}:buyers"
    now = int(time.time())

    def admit(user):
        out = admit_lot(rs, script, [(424242, user)])
        return out[0][0], int(rcli(rs, "HGET", h, "stock"))

    try:
        rcli(rs, "HSET", h, "stock", 2, "initial", 2, "begin", now - 60, "end", now + 60, "gen", 1)
        if admit(1)[0] != 0 or admit(2) != (0, 0):
            fail("two buyers of two units were not both admitted")
        rcli(rs, "HSET", h, "stock", 1)
        if admit(1) != (2, 1):
            fail("a buyer who ordered was not refused as a duplicate, or took a unit")
        rcli(rs, "HSET", h, "stock", 0)
        if admit(1)[0] != 1 or admit(3)[0] != 1:
            fail("with nothing left, the answer is not sold out for everyone")
        if rcli(rs, "SISMEMBER", buyers, 3) != "0" or int(rcli(rs, "XLEN", "seckill:orders")) != 2:
            fail("a refused buyer was recorded, or an order appended")
    finally:
        rs.kill()


def admit_lot(rs, script, buyers, seconds=1000, drawn=0):
    """One call of lua/order_admit.lua for 'buyers' [(voucher, user)]: each
    buyer's reply, (code,) or (0, count, stream id). 'drawn': the first of
    the counts drawn before the call (0: the script draws them)."""
    vouchers = list(dict.fromkeys(v for v, _ in buyers))
    keys = ["seckill:orders"]
    for v in vouchers:
        keys += [f"seckill:v:{{{v}}}", f"seckill:v:{{{v}}}:buyers"]
    if not drawn:
        keys.append("icr:order:test")
    args = [seconds, len(vouchers), drawn, *vouchers]
    for v, u in buyers:
        args += [vouchers.index(v) + 1, u]
    out = rcli(rs, "EVAL", script, len(keys), *keys, *args).split()
    replies = []
    while out:
        code = int(out.pop(0))
        replies.append((code, int(out.pop(0)), out.pop(0)) if code == 0 else (code,))
    if len(replies) != len(buyers):
        fail(f"{len(buyers)} buyers, {len(replies)} replies: {replies}")
    return replies


@test
def a_lot_is_decided_as_its_buyers_one_after_another():
    # One call for a lot of buyers of several vouchers gives each the
    # verdict it would get alone, in the lot's order: a duplicate of the
    # set or of the lot itself, sold out in the middle of the lot, a
    # voucher not loaded, not started, ended, malformed (its buyers alone
    # refused, nothing written for them); the counter, the stock, the
    # buyers and the stream move as many single calls would move them.
    rs = durable_redis()
    with open(os.path.join(ss.LUA_DIR, "order_admit.lua")) as f:
        script = f.read()
    now = int(time.time())
    lot = [(11, 1), (12, 1), (11, 9), (11, 1), (13, 5), (11, 2), (14, 4), (11, 3), (11, 9),
           (15, 7), (16, 6), (15, 7), (17, 6), (15, 8)]

    def load():
        rcli(rs, "FLUSHALL")
        rcli(rs, "HSET", "seckill:v:{11}", "stock", 2, "initial", 3, "begin", now - 60,
             "end", now + 60, "gen", 4)
        rcli(rs, "SADD", "seckill:v:{11}:buyers", 9)
        rcli(rs, "HSET", "seckill:v:{13}", "stock", 5, "initial", 5, "begin", now + 600,
             "end", now + 900, "gen", 1)
        rcli(rs, "HSET", "seckill:v:{14}", "stock", 5, "initial", 5, "begin", now - 900,
             "end", now - 600, "gen", 1)
        rcli(rs, "HSET", "seckill:v:{15}", "stock", 9, "initial", 9, "begin", now - 60,
             "end", now + 60, "gen", 2)
        # Malformed (by hand?): no begin; a stock that is not an integer.
        rcli(rs, "HSET", "seckill:v:{16}", "stock", 5, "initial", 5, "end", now + 60, "gen", 1)
        rcli(rs, "HSET", "seckill:v:{17}", "stock", "5.0", "initial", 5, "begin", now - 60,
             "end", now + 60, "gen", 1)
        rcli(rs, "SET", "icr:order:test", 40)

    def state():
        entries = rcli(rs, "XRANGE", "seckill:orders", "-", "+").split()
        return ([rcli(rs, "HGET", f"seckill:v:{{{v}}}", "stock") for v in (11, 13, 14, 15, 16, 17)],
                [sorted(rcli(rs, "SMEMBERS", f"seckill:v:{{{v}}}:buyers").split())
                 for v in (11, 13, 14, 15, 16, 17)],
                rcli(rs, "GET", "icr:order:test"), rcli(rs, "EXISTS", "seckill:v:{12}"),
                [e for e in entries if "-" not in e])
    try:
        load()
        together = admit_lot(rs, script, lot)
        after_lot = state()
        load()
        alone = [admit_lot(rs, script, [b])[0] for b in lot]
        after_alone = state()
        codes = [r[0] for r in together]
        if codes != [0, -1, 2, 2, 3, 0, 4, 1, 1, 0, -2, 2, -2, 0]:
            fail(f"verdicts {codes}")
        if [r[:2] for r in together] != [r[:2] for r in alone]:
            fail(f"one call: {together}; one call each: {alone}")
        if [r[1] for r in together if r[0] == 0] != [41, 42, 43, 44]:
            fail(f"the order counts are not drawn in the lot's order: {together}")
        if after_lot != after_alone:
            fail(f"one call left {after_lot}; one call each {after_alone}")
        stocks, buyers, counter_, exists, fields = after_lot
        if stocks != ["0", "5", "5", "7", "5", "5.0"] \
                or buyers != [["1", "2", "9"], [], [], ["7", "8"], [], []] \
                or counter_ != "44" or exists != "0":
            fail(f"after the lot: {after_lot}")
        if fields != ["v", "11", "u", "1", "t", "1000", "c", "41", "g", "4",
                      "v", "11", "u", "2", "t", "1000", "c", "42", "g", "4",
                      "v", "15", "u", "7", "t", "1000", "c", "43", "g", "2",
                      "v", "15", "u", "8", "t", "1000", "c", "44", "g", "2"]:
            fail(f"the stream: {fields}")
        # Counts drawn before the call (a Redis Cluster's counter lives in
        # a slot of its own): the admitted take them in the lot's order,
        # the refused leave theirs unused, and the counter is not touched.
        load()
        drawn = admit_lot(rs, script, lot, drawn=501)
        if [r[:1] for r in drawn] != [r[:1] for r in together] \
                or [r[1] for r in drawn if r[0] == 0] != [501, 502, 503, 504]:
            fail(f"with counts drawn before: {drawn}")
        if rcli(rs, "GET", "icr:order:test") != "40" or state()[:2] != after_lot[:2]:
            fail(f"with counts drawn before, the counter or the sale moved: {state()}")
    finally:
        rs.kill()


def admission(srv):
    """This instance's admission counters (round trips, admissions, largest)."""
    return stats(srv)["admission"]


@test
def concurrent_admissions_share_round_trips_to_redis():
    rs = durable_redis()
    piped = server("rf-piped", rs, REDIS_ADMIT_PIPELINES=1, THREADS=8, REDIS_TIMEOUT_MS=5000)
    alone = server("rf-alone", rs, REDIS_ADMIT_PIPELINES=0, THREADS=8)
    try:
        vid = ss.new_voucher(piped, TOKEN, 450)
        acked, answers = buy_all([piped], vid, range(7700001, 7700201), workers=32)
        p = admission(piped)
        if len(acked) != 200 or p["admissions"] != 200:
            fail(f"{len(acked)} acknowledged, {p} sent: {sorted(set(answers), key=str)}")
        if p["largest"] < 2 or p["roundTrips"] >= p["admissions"]:
            fail(f"pipelined, no round trip carried two admissions: {p}")
        more, _ = buy_all([alone], vid, range(7700201, 7700301), workers=32)
        a = admission(alone)
        if len(more) != 100 or a != {"roundTrips": 100, "admissions": 100, "largest": 1}:
            fail(f"not pipelined: {len(more)} acknowledged, {a} sent")
        # One worker: a sender keeps its worker while buyers come, so none
        # sends pipelined and the worker stays free for the rest.
        one = server("rf-one-worker", rs, THREADS=1)
        try:
            few, _ = buy_all([one], vid, range(7700601, 7700651), workers=32)
            o = admission(one)
        finally:
            one.stop_ok()
        if len(few) != 50 or o != {"roundTrips": 50, "admissions": 50, "largest": 1}:
            fail(f"THREADS=1: {len(few)} acknowledged, {o} sent")
        more.update(few)
        print(f"# 200 buyers, 32 at a time: {p['roundTrips']} round trips "
              f"({p['admissions'] / p['roundTrips']:.1f} admissions each, at most {p['largest']}); "
              f"alone: {a['roundTrips']} for {a['admissions']}", flush=True)
        # One user 32 times at once, while Redis is stopped for 0.5 s: the
        # requests queue behind the round trip that waits for it and go
        # out together, and the script, atomic, admits one of them.
        before = admission(piped)
        os.kill(rs.proc.pid, signal.SIGSTOP)
        threading.Timer(0.5, os.kill, (rs.proc.pid, signal.SIGCONT)).start()
        again, answers = buy_all([piped] * 32, vid, [7700401], workers=32)
        after = admission(piped)
        if len(again) != 1 or sorted(set(answers), key=str) != [(200, None), (409, "already_ordered")]:
            fail(f"one user 32 times at once: {answers}")
        if after["admissions"] - before["admissions"] < 16 or \
                after["roundTrips"] - before["roundTrips"] > 4:
            fail(f"the one user's requests did not go out together: {before} -> {after}")
        acked.update(more)
        acked.update(again)
        # Redis forgot the script (restart, SCRIPT FLUSH): a lot that met
        # NOSCRIPT is sent again as EVAL, not refused.
        rcli(rs, "SCRIPT", "FLUSH")
        last, answers = buy_all([piped], vid, range(7700501, 7700551), workers=32)
        if len(last) != 50:
            fail(f"after SCRIPT FLUSH: {len(last)} of 50 acknowledged: {sorted(set(answers), key=str)}")
        acked.update(last)
        _, n = reconcile(piped, rs, vid, acked, 450)
        if n != 401:
            fail(f"{n} rows")
    finally:
        piped.stop_ok()
        alone.stop_ok()
        rs.kill()


@test
def a_voucher_whose_rebuild_stalls_holds_up_no_one_else():
    """One round trip carries buyers of two vouchers; Redis has lost one of
    them and the instance's Postgres does not answer (a connect takes
    PG_CONNECT_TIMEOUT_S): the other voucher's buyers are answered first,
    and the lost voucher's cost one rebuild, not one each."""
    rs = durable_redis()
    hang = socket.socket()                 # accepts into the backlog, never answers
    hang.bind(("127.0.0.1", 0))
    hang.listen(64)
    good = server("rf-good", rs)
    stalled = server("rf-stalled-pg", rs, CONSUMERS=0, REDIS_ADMIT_PIPELINES=1,
                     REDIS_TIMEOUT_MS=5000, PG_CONNECT_TIMEOUT_S=2,
                     PG_DSN=f"host=127.0.0.1 port={hang.getsockname()[1]} dbname=x user=x")
    answers = {}
    try:
        lost = ss.new_voucher(good, TOKEN, 100)
        kept = ss.new_voucher(good, TOKEN, 100)
        for vid, user in ((lost, 7800001), (kept, 7800002)):   # both in its voucher cache
            if stalled.seckill(vid, user).status != 200:
                fail("the stalled instance does not sell while Redis has the vouchers")
        rcli(rs, "DEL", f"seckill:v:{{{lost}}}", f"seckill:v:{{{lost}}}:buyers")

        def buy(vid, user):
            t0 = time.monotonic()
            r = ss.request(stalled.port, "POST", f"/voucher/{vid}/seckill",
                           {"X-User-Id": str(user)}, None, 30)
            answers[user] = (vid, r.status, time.monotonic() - t0)

        # Redis stopped: a first buyer's round trip waits, so the next ones
        # queue behind it and go out in one lot when it resumes.
        os.kill(rs.proc.pid, signal.SIGSTOP)
        threads = [threading.Thread(target=buy, args=(kept, 7800100))]
        threads[0].start()
        time.sleep(0.2)
        for i in range(10):
            for vid, user in ((lost, 7800200 + i), (kept, 7800300 + i)):
                threads.append(threading.Thread(target=buy, args=(vid, user)))
                threads[-1].start()
        time.sleep(0.3)
        os.kill(rs.proc.pid, signal.SIGCONT)
        for t in threads:
            t.join(40)
        kept_answers = [a for a in answers.values() if a[0] == kept]
        lost_answers = [a for a in answers.values() if a[0] == lost]
        print(f"# kept voucher: {len(kept_answers)} answered, slowest "
              f"{max(a[2] for a in kept_answers):.2f}s; lost voucher: slowest "
              f"{max(a[2] for a in lost_answers):.2f}s", flush=True)
        if sorted({a[1] for a in kept_answers}) != [200] or len(kept_answers) != 11:
            fail(f"the kept voucher's buyers: {kept_answers}")
        if max(a[2] for a in kept_answers) > 1.5:
            fail(f"the kept voucher's buyers waited for the other's rebuild: {kept_answers}")
        if sorted({a[1] for a in lost_answers}) != [503] or len(lost_answers) != 10:
            fail(f"the lost voucher's buyers: {lost_answers}")
        if max(a[2] for a in lost_answers) > 4.5:
            fail(f"the lost voucher's buyers each waited for a rebuild: {lost_answers}")
    finally:
        os.kill(rs.proc.pid, signal.SIGCONT)
        stalled.stop_ok()
        good.stop_ok()
        hang.close()
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


@test
def an_order_whose_user_has_another_in_postgres_is_dead_lettered_and_its_batch_lands():
    """Four orders wait in the stream; meanwhile another order of one of
    their users for the voucher reached Postgres by another way (written by
    hand, with its unit). The batch is refused (the unique key on user and
    voucher), tried one by one: that user's order goes to the dead-letter
    stream with the reason, the three others land."""
    rs = durable_redis()
    front = server("rf-dupuser-front", rs, CONSUMERS=0)
    a = None
    try:
        vid = ss.new_voucher(front, TOKEN, 10)
        acked, _ = buy_all([front], vid, range(7996001, 7996005), workers=1)
        if len(acked) != 4:
            fail(f"{len(acked)} acknowledged of 4")
        other = 9_200_000_000 + vid
        ss.psql(f"INSERT INTO tb_voucher_order (id, user_id, voucher_id) "
                f"VALUES ({other}, 7996002, {vid}); "
                f"UPDATE tb_voucher SET stock = stock - 1 WHERE voucher_id = {vid}")
        a = server("rf-dupuser", rs, CONSUMER_LINGER_MS=200)
        drain(a)
        letters = dead_letters(rs)
        if [(int(d["u"]), int(d["o"]), d["reason"]) for d in letters] != \
                [(7996002, acked[7996002],
                  "the user already has another order of this voucher")]:
            fail(f"dead letters: {letters}")
        rows = {int(r[0]): int(r[1]) for r in ss.psql(
            f"SELECT user_id, id FROM tb_voucher_order WHERE voucher_id = {vid}")}
        want = {u: oid for u, oid in acked.items() if u != 7996002}
        want[7996002] = other
        if rows != want:
            fail(f"orders in Postgres {rows}, want {want}")
        stock = ss.psql_value(f"SELECT stock FROM tb_voucher WHERE voucher_id = {vid}")
        if stock != "6":
            fail(f"stock in Postgres {stock}, want 6 (10 - 3 landed - 1 by hand)")
    finally:
        front.stop_ok()
        if a is not None:
            a.stop_ok()
        rs.kill()


@test
def redis_copy_decides_the_window_and_a_malformed_one_refuses_only_its_buyers():
    """Admission reads the sale window from Redis's copy of the voucher, by
    Redis's clock (one clock for every instance): when that copy says the
    sale has ended, or not begun, the buyer hears so (409), whatever the
    instance read from Postgres. A voucher whose Redis hash is malformed (a
    field that is not an integer) refuses its buyers with 503 and records
    nothing for them; another voucher sells as before."""
    rs = durable_redis()
    a = server("rf-window", rs)
    try:
        vid, other = ss.new_voucher(a, TOKEN, 5), ss.new_voucher(a, TOKEN, 5)
        if a.seckill(vid, 7997001).status != 200:          # its Redis copy is loaded
            fail("the first buyer was not sold")
        key, now = f"seckill:v:{{{vid}}}", int(time.time())
        rcli(rs, "HSET", key, "end", now - 60)
        r = a.seckill(vid, 7997002)
        if r.status != 409 or r.body.get("error") != "ended":
            fail(f"Redis's copy says ended: {r.status} {r.body!r}")
        rcli(rs, "HSET", key, "begin", now + 600, "end", now + 3600)
        r = a.seckill(vid, 7997002)
        if r.status != 409 or r.body.get("error") != "not_started":
            fail(f"Redis's copy says not started: {r.status} {r.body!r}")
        rcli(rs, "HSET", key, "begin", now - 60, "stock", "x")
        length = rcli(rs, "XLEN", "seckill:orders")
        r = a.seckill(vid, 7997002)
        if r.status != 503 or r.body.get("error") != "unavailable":
            fail(f"a malformed Redis copy: {r.status} {r.body!r}")
        if rcli(rs, "SISMEMBER", f"{key}:buyers", 7997002) != "0" or \
                rcli(rs, "XLEN", "seckill:orders") != length:
            fail("a buyer of the malformed voucher was recorded")
        r = a.seckill(other, 7997002)
        if r.status != 200:
            fail(f"another voucher: {r.status} {r.body!r}")
    finally:
        a.stop_ok()
        rs.kill()


def consumers(rs):
    """The group's consumers: {name: {"pending": n, "idle": ms}} (XINFO
    CONSUMERS, whatever fields the Redis version adds)."""
    out = rcli(rs, "XINFO", "CONSUMERS", "seckill:orders", "seckill").splitlines()
    found, cur = {}, None
    for key, value in zip(out[0::2], out[1::2]):
        if key == "name":
            cur = found.setdefault(value, {})
        elif cur is not None and key in ("pending", "idle"):
            cur[key] = int(value)
    return found


def wait_consumers(rs, pred, what, timeout=10.0):
    """Waits until pred(consumers(rs)); the consumers."""
    deadline = time.monotonic() + timeout
    while not pred(c := consumers(rs)):
        if time.monotonic() > deadline:
            fail(f"after {timeout}s, {what}: the group has {c}")
        time.sleep(0.1)
    return c


@test
def consumer_names_of_gone_processes_leave_the_group_unless_they_hold_orders():
    """Each process reads under a name of its own; restarts must not pile
    names up in the group. A gone consumer with nothing pending is removed
    once idle CONSUMER_REMOVE_IDLE_MS; one that still holds orders stays
    (removing it would orphan them) until another claims them."""
    rs = durable_redis()
    front = server("rf-names-front", rs, CONSUMERS=0)
    live = []
    try:
        vid = ss.new_voucher(front, TOKEN, 10)
        acked, _ = buy_all([front], vid, range(7980001, 7980004), workers=2)
        # A consumer that read three orders and died: they are pending to it.
        rcli(rs, "XGROUP", "CREATE", "seckill:orders", "seckill", 0)
        rcli(rs, "XREADGROUP", "GROUP", "seckill", "ghost", "COUNT", 3, "STREAMS",
             "seckill:orders", ">")
        # No claim during the test: the ghost keeps its orders.
        tidy = {"CONSUMER_REMOVE_IDLE_MS": 1000, "CONSUMER_CLAIM_IDLE_MS": 600000}

        def start(name):
            before = set(consumers(rs))
            srv = server(name, rs, **tidy)
            c = wait_consumers(rs, lambda c: set(c) - before, f"no new consumer for {name}")
            return srv, (set(c) - before).pop()

        gone = []
        for i in range(4):                     # four restarts of one instance
            srv, name = start("rf-names")
            gone.append(name)
            if i % 2:
                srv.kill()
            else:
                srv.stop_ok()
        a, a_name = start("rf-names")
        live.append(a)
        b, b_name = start("rf-names-b")
        live.append(b)
        c = wait_consumers(rs, lambda c: set(c) == {a_name, b_name, "ghost"},
                           "only the live consumers and the ghost should be left")
        if c["ghost"]["pending"] != 3:
            fail(f"the ghost's orders: {c['ghost']}")
        # Well past the bound, the ghost is still there with its orders.
        time.sleep(2.5)
        c = consumers(rs)
        if c.get("ghost", {}).get("pending") != 3 or c["ghost"]["idle"] < 2000:
            fail(f"a consumer holding orders was removed: {c}")
        if unsettled(rs) != 3:
            fail(f"{unsettled(rs)} orders unsettled, the ghost's 3 expected")
        for srv in live:
            srv.stop_ok()
        live.clear()
        # Its orders claimed by another, the ghost goes too.
        claimer = server("rf-names-claimer", rs, CONSUMER_REMOVE_IDLE_MS=1000)
        live.append(claimer)
        wait_consumers(rs, lambda c: len(c) == 1 and "ghost" not in c
                       and all(x["pending"] == 0 for x in c.values()),
                       "the ghost should go once its orders are claimed")
        reconcile(claimer, rs, vid, acked, 10)
        print(f"# {len(gone)} restarts: their names left the group; the ghost stayed with "
              "its 3 orders until they were claimed", flush=True)
    finally:
        front.stop_ok()
        for srv in live:
            srv.stop_ok()
        rs.kill()


@test
def the_dead_letter_stream_keeps_about_dead_letters_max_entries():
    rs = durable_redis()
    # Whole stream nodes of 10 entries: XADD MAXLEN ~ trims to within 10.
    rcli(rs, "CONFIG", "SET", "stream-node-max-entries", 10)
    a = server("rf-dead-cap", rs, DEAD_LETTERS_MAX=20)
    try:
        rcli(rs, "EVAL", "for i = 1, 150 do redis.call('xadd', KEYS[1], '*', 'v', "
             "'not-a-number', 'i', i) end", 1, "seckill:orders")
        # Then a well-formed order of a voucher Postgres does not have.
        last = rcli(rs, "XADD", "seckill:orders", "*", "v", 999999999, "u", 5, "t", 100,
                    "c", 7, "g", 0)
        deadline = time.monotonic() + 30
        while counter(a, "seckill_stream_dead_letters_total") < 151:
            if time.monotonic() > deadline:
                fail("151 poison entries were not all dead-lettered")
            time.sleep(0.2)
        n = int(rcli(rs, "XLEN", "seckill:orders:dead"))
        if not 20 <= n <= 30:
            fail(f"{n} dead letters kept of 151, about 20 expected")
        # The newest is kept, with the order whole: its id's parts too.
        out = rcli(rs, "XREVRANGE", "seckill:orders:dead", "+", "-", "COUNT", 1).splitlines()
        f = dict(zip(out[1::2], out[2::2]))
        if f.get("entry") != last or (f.get("v"), f.get("u"), f.get("t"), f.get("c"),
                                      f.get("g"), f.get("o")) != \
                ("999999999", "5", "100", "7", "0", str((100 << 32) | 7)):
            fail(f"the newest dead letter: {out}")
    finally:
        a.stop_ok()
        rs.kill()


def dead_letters(rs):
    """The dead letters, oldest first: [{field: value}]."""
    out = rcli(rs, "EVAL", "local r = {} for _, e in ipairs(redis.call('xrange', KEYS[1], '-', "
               "'+')) do r[#r + 1] = table.concat(e[2], '\\t') end return r", 1,
               "seckill:orders:dead").splitlines()
    letters = []
    for line in out:
        f = line.split("\t")
        letters.append(dict(zip(f[0::2], f[1::2])))
    return letters


@test
def dead_letters_whose_cause_is_fixed_are_replayed_once_and_land():
    rs = durable_redis()
    # Three orders wait in the stream while Postgres has no stock left for
    # them (changed by hand): the consumer dead-letters them.
    front = server("rf-replay-front", rs, CONSUMERS=0)
    a = None
    try:
        vid = ss.new_voucher(front, TOKEN, 5)
        acked, _ = buy_all([front], vid, range(7990001, 7990004), workers=2)
        if len(acked) != 3:
            fail(f"{len(acked)} acknowledged")
        ss.psql(f"UPDATE tb_voucher SET stock = 0 WHERE voucher_id = {vid}")
        a = server("rf-replay", rs)
        deadline = time.monotonic() + 15
        while len(letters := dead_letters(rs)) < 3:
            if time.monotonic() > deadline:
                fail(f"the orders were not dead-lettered: {letters}")
            time.sleep(0.1)
        # Each dead letter carries the order whole: t and c make its id.
        got = {int(d["u"]): (int(d["t"]) << 32) | int(d["c"]) for d in letters}
        if got != acked or any(int(d["o"]) != acked[int(d["u"])] for d in letters) or \
                {d["reason"] for d in letters} != {"no stock left in Postgres"}:
            fail(f"dead letters {letters}, orders {acked}")
        # A dead letter of the older format (no t and c): not replayable.
        rcli(rs, "XADD", "seckill:orders:dead", "*", "entry", "1-1", "v", 999999999, "u", 1,
             "o", 4294967297, "g", 1, "reason", "no such voucher", "consumer", "old")
        drain(a)
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = a.post("/admin/dead-letters/replay", headers)
            if r.status != 401 or r.body.get("error") != "unauthorized":
                fail(f"replay without the token: {r.status} {r.body!r}")
        r = a.post("/admin/dead-letters/replay", AUTH, {"max": 0})
        if r.status != 400 or r.body.get("error") != "invalid_field":
            fail(f"max 0: {r.status} {r.body!r}")
        if int(rcli(rs, "XLEN", "seckill:orders:dead")) != 4:
            fail("a refused replay moved dead letters")
        ss.psql(f"UPDATE tb_voucher SET stock = 5 WHERE voucher_id = {vid}")   # the fix

        def added():
            info = rcli(rs, "XINFO", "STREAM", "seckill:orders").splitlines()
            return int(info[info.index("entries-added") + 1])

        before = added()
        answers = []
        for body in ({"max": 2}, None, None):
            r = a.post("/admin/dead-letters/replay", AUTH, body)
            if r.status != 200:
                fail(f"replay {body}: {r.status} {r.body!r}")
            answers.append(r.body)
        if answers != [{"replayed": 2, "left": 2, "unreplayable": 0},
                       {"replayed": 1, "left": 1, "unreplayable": 1},
                       {"replayed": 0, "left": 1, "unreplayable": 1}]:
            fail(f"replay answers {answers}")
        if added() - before != 3:
            fail(f"{added() - before} entries queued by three replays of 3 dead letters")
        st, n = reconcile(a, rs, vid, acked, 5)
        if n != 3 or st["redisFirst"]["deadLetters"] != 1:
            fail(f"{n} rows; redisFirst {st['redisFirst']}")
        if dead_letters(rs)[0].get("consumer") != "old":
            fail(f"the dead letter left is not the unreplayable one: {dead_letters(rs)}")
    finally:
        front.stop_ok()
        if a is not None:
            a.stop_ok()
        rs.kill()


@test
def a_consumer_group_destroyed_under_the_consumer_is_made_again_and_orders_land():
    """XGROUP DESTROY while an instance runs (a Redis restored without the
    group, an operator's slip): the consumer's next read finds no group,
    makes it again from the stream's start, and the later orders land; the
    orders it had persisted already are delivered again and not written
    twice, nor dead-lettered."""
    rs = durable_redis()
    a = server("rf-nogroup", rs)
    try:
        vid = ss.new_voucher(a, TOKEN, 10)
        acked, _ = buy_all([a], vid, range(7995001, 7995004), workers=2)
        drain(a)
        if rcli(rs, "XGROUP", "DESTROY", "seckill:orders", "seckill") != "1":
            fail("XGROUP DESTROY found no group")
        more, _ = buy_all([a], vid, range(7995004, 7995006), workers=2)
        acked.update(more)
        if len(acked) != 5:
            fail(f"{len(acked)} orders acknowledged of 5")
        st, n = reconcile(a, rs, vid, acked, 10)
        if n != 5 or st["redisFirst"]["deadLetters"] != 0:
            fail(f"{n} rows; redisFirst {st['redisFirst']}")
        if rcli(rs, "XINFO", "GROUPS", "seckill:orders").split("\n")[1] != "seckill":
            fail("the group was not made again")
    finally:
        a.stop_ok()
        rs.kill()


def rebuild_then_buy(front, rs, vid, earlier, user, stock):
    """Drops the voucher's Redis state; earlier buyers and a new one buy
    again (the first rebuilds it). Only the new one may be admitted, and
    Redis's stock must be 'stock' after. The new order {user: id}."""
    rcli(rs, "DEL", f"seckill:v:{{{vid}}}", f"seckill:v:{{{vid}}}:buyers")
    more, _ = buy_all([front], vid, list(earlier) + [user], workers=2)
    if list(more) != [user]:
        fail(f"after the rebuild: {more} acknowledged (earlier buyers must be refused)")
    got = rcli(rs, "HGET", f"seckill:v:{{{vid}}}", "stock")
    if got != str(stock):
        fail(f"rebuilt stock: {got} left after one more order, {stock} expected")
    return more


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
        # The next buyer rebuilds it: 30 - 10 in the stream - 1.
        acked.update(rebuild_then_buy(front, rs, vid, range(7500001, 7500006), 7500100, 19))
        b = server("rf-rebuild-back", rs)
        reconcile(b, rs, vid, acked, 30)
    finally:
        front.stop_ok()
        if b is not None:
            b.stop_ok()
        rs.kill()


def entry_ids(out):
    return [x for x in out.split() if x.count("-") == 1 and x.replace("-", "").isdigit()]


@test
def the_trim_removes_settled_entries_and_never_a_pending_or_undelivered_one():
    rs = durable_redis()
    with open(os.path.join(ss.LUA_DIR, "stream_trim.lua")) as f:
        script = f.read()
    s = "trimtest"

    def trim():
        return int(rcli(rs, "EVAL", script, 1, s))

    def add(n):
        rcli(rs, "EVAL", "for i = 1, tonumber(ARGV[1]) do redis.call('xadd', KEYS[1], '*', 'i', i) end",
             1, s, n)

    def read(consumer, n):
        return entry_ids(rcli(rs, "XREADGROUP", "GROUP", "g", consumer, "COUNT", n, "STREAMS", s, ">"))

    try:
        rcli(rs, "XGROUP", "CREATE", s, "g", 0, "MKSTREAM")
        add(300)
        held = read("a", 150)                  # a stalls with the older half
        rcli(rs, "XACK", s, "g", *read("b", 150))
        if trim() != 0 or int(rcli(rs, "XLEN", s)) != 300:
            fail("entries were trimmed below a pending one")
        rcli(rs, "XACK", s, "g", *held[:120])
        # Another group on the stream that read nothing yet holds it all.
        rcli(rs, "XGROUP", "CREATE", s, "late", 0)
        if trim() != 0:
            fail("entries were trimmed that another group has not read")
        rcli(rs, "XGROUP", "DESTROY", s, "late")
        removed = trim()
        left = set(entry_ids(rcli(rs, "XRANGE", s, "-", "+")))
        if removed == 0:
            fail("nothing trimmed after the oldest 120 were acknowledged")
        if removed > 120 or not set(held[120:]) <= left:
            fail(f"{removed} trimmed: a pending entry went with them")
        add(50)
        fresh = entry_ids(rcli(rs, "XRANGE", s, "-", "+"))[-50:]
        rcli(rs, "XACK", s, "g", *held[120:])  # none pending; 50 not delivered
        trim()
        left = set(entry_ids(rcli(rs, "XRANGE", s, "-", "+")))
        if not set(fresh) <= left:
            fail("an undelivered entry was trimmed")
        if len(left) >= 230:
            fail(f"{len(left)} entries left: the settled ones were not trimmed")
    finally:
        rs.kill()


@test
def the_consumers_trim_settled_entries_from_the_stream():
    rs = durable_redis()
    a = server("rf-trim", rs)
    try:
        vid = ss.new_voucher(a, TOKEN, 400)
        acked, _ = buy_all([a], vid, range(7650001, 7650301), workers=8)
        reconcile(a, rs, vid, acked, 400)
        # Every 200 ms, whole nodes (100 entries by default) below the last
        # delivered entry: at most the last node stays.
        deadline = time.monotonic() + 5
        while (n := int(rcli(rs, "XLEN", "seckill:orders"))) > 100:
            if time.monotonic() > deadline:
                fail(f"{n} of 300 settled entries still in the stream")
            time.sleep(0.1)
    finally:
        a.stop_ok()
        rs.kill()


@test
def a_rebuild_counts_pending_and_undelivered_orders():
    rs = durable_redis()
    front = server("rf-pending", rs, CONSUMERS=0)
    b = None
    try:
        vid = ss.new_voucher(front, TOKEN, 30)
        acked, _ = buy_all([front], vid, range(7960001, 7960011), workers=2)
        wait_backlog(front, 10, 0)            # no group yet: nothing delivered
        # A consumer that read four and died: pending; six not delivered.
        rcli(rs, "XGROUP", "CREATE", "seckill:orders", "seckill", 0)
        rcli(rs, "XREADGROUP", "GROUP", "seckill", "ghost", "COUNT", 4, "STREAMS",
             "seckill:orders", ">")
        wait_backlog(front, 10, 4)
        # 30 - 10 in the stream (4 of them pending) - 1.
        acked.update(rebuild_then_buy(front, rs, vid, range(7960001, 7960004), 7960100, 19))
        b = server("rf-pending-back", rs)      # claims the ghost's four
        reconcile(b, rs, vid, acked, 30)
    finally:
        front.stop_ok()
        if b is not None:
            b.stop_ok()
        rs.kill()


@test
def the_backlog_counts_unsettled_orders_not_the_streams_length():
    rs = durable_redis()
    a = server("rf-backlog", rs)
    front = None
    b = None
    try:
        vid = ss.new_voucher(a, TOKEN, 30)
        acked, _ = buy_all([a], vid, range(7700001, 7700011), workers=2)
        drain(a)
        # Ten settled entries, fewer than a stream node: still in the stream.
        xlen = int(rcli(rs, "XLEN", "seckill:orders"))
        if xlen != 10:
            fail(f"XLEN {xlen}: the 10 settled entries are expected in the stream until "
                 f"trimmed; XINFO STREAM: {rcli(rs, 'XINFO', 'STREAM', 'seckill:orders')!r}")
        a.stop_ok()
        front = server("rf-backlog-front", rs, CONSUMERS=0)
        more, _ = buy_all([front], vid, range(7700011, 7700016), workers=2)
        acked.update(more)
        # An XDEL'd entry past the group's position: Redis cannot tell the
        # lag any more, and the instance counts the rest itself.
        junk = rcli(rs, "XADD", "seckill:orders", "*", "junk", 1)
        rcli(rs, "XDEL", "seckill:orders", junk)
        wait_backlog(front, 5, 0)             # 5 orders not delivered yet
        if unsettled(rs) != 5:
            fail(f"the kit counts {unsettled(rs)} unsettled")
        b = server("rf-backlog-back", rs)
        reconcile(b, rs, vid, acked, 30)
    finally:
        for srv in (a, front, b):
            if srv is not None:
                srv.stop_ok()
        rs.kill()


@test
def a_rebuild_does_not_count_settled_entries_left_in_the_stream():
    rs = durable_redis()
    a = server("rf-settled", rs)
    try:
        vid = ss.new_voucher(a, TOKEN, 30)
        acked, _ = buy_all([a], vid, range(7800001, 7800011), workers=2)
        # An order Postgres refuses (its id is another order's): dead-lettered,
        # settled, its buyer in neither Postgres nor Redis.
        oid = next(iter(acked.values()))
        gen = rcli(rs, "HGET", f"seckill:v:{{{vid}}}", "gen")
        rcli(rs, "XADD", "seckill:orders", "*", "v", vid, "u", 7800999, "t", oid >> 32,
             "c", oid & 0xFFFFFFFF, "g", gen)
        deadline = time.monotonic() + 10
        while int(rcli(rs, "XLEN", "seckill:orders:dead")) != 1:
            if time.monotonic() > deadline:
                fail("the conflicting order was not dead-lettered")
            time.sleep(0.1)
        drain(a)
        rcli(rs, "DEL", f"seckill:v:{{{vid}}}", f"seckill:v:{{{vid}}}:buyers")
        # The rebuild: 30 - 10 in Postgres; the 11 settled entries in the
        # stream add nothing. Then one buyer more, and the refused one buys.
        more, _ = buy_all([a], vid, [7800100, 7800999], workers=1)
        if sorted(more) != [7800100, 7800999]:
            fail(f"after the rebuild: {sorted(more)} acknowledged")
        if rcli(rs, "HGET", f"seckill:v:{{{vid}}}", "stock") != "18":
            fail("the rebuilt stock counts settled entries: "
                 f"{rcli(rs, 'HGET', f'seckill:v:{{{vid}}}', 'stock')} left, 18 expected")
        acked.update(more)
        reconcile(a, rs, vid, acked, 30)
    finally:
        a.stop_ok()
        rs.kill()


@test
def a_rebuild_reads_postgres_in_one_snapshot():
    # A consumer that commits between the rebuild's read of the voucher and
    # its read of the buyers, and acknowledges after the script: the buyer
    # must count on one side only, or Redis holds a unit too many.
    rs = durable_redis()
    # One worker: its Postgres connection, opened for the voucher's creation,
    # is the rebuild's (a new one would wait for the lock to prepare).
    front = server("rf-snapshot", rs, CONSUMERS=0, PG_STATEMENT_TIMEOUT_MS=5000, THREADS=1)
    b = None
    session = None
    try:
        vid = ss.new_voucher(front, TOKEN, 30)
        acked, _ = buy_all([front], vid, range(7950001, 7950006), workers=2)
        rcli(rs, "DEL", f"seckill:v:{{{vid}}}", f"seckill:v:{{{vid}}}:buyers")
        # Holds the buyers' table: the rebuild reads the voucher, then waits.
        session = subprocess.Popen(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", ss.PG_DSN],
                                   stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True)
        session.stdin.write("BEGIN; LOCK TABLE tb_voucher_order IN ACCESS EXCLUSIVE MODE;\n"
                            "SELECT 1;\n")
        session.stdin.flush()
        time.sleep(0.5)
        got = {}
        buyer = threading.Thread(target=lambda: got.update(
            buy_all([front], vid, [7950100], workers=1)[0]))
        buyer.start()
        time.sleep(0.5)
        # The consumer's commit of 7950001's order, as it would make it.
        session.stdin.write(f"UPDATE tb_voucher SET stock = stock - 1 WHERE voucher_id = {vid};\n"
                            f"INSERT INTO tb_voucher_order (id, user_id, voucher_id) VALUES "
                            f"({acked[7950001]}, 7950001, {vid});\nCOMMIT;\n")
        session.stdin.close()
        session.wait(timeout=10)
        buyer.join(timeout=30)
        if list(got) != [7950100]:
            fail(f"the buyer after the rebuild: {got}")
        # 30 - 1 in Postgres - 4 still in the stream - 1 new.
        stock = rcli(rs, "HGET", f"seckill:v:{{{vid}}}", "stock")
        if stock != "24":
            fail(f"rebuilt stock {stock}, 24 expected: Postgres was read in two snapshots")
        acked.update(got)
        b = server("rf-snapshot-back", rs)
        reconcile(b, rs, vid, acked, 30)
    finally:
        if session is not None and session.poll() is None:
            session.kill()
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


if __name__ == "__main__":
    ss.main()
