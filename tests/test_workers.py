#!/usr/bin/env python3
"""Event threads and workers (app/http/http.c), and batched buyers that hold none.

libmicrohttpd's event threads (IO_THREADS) answer what memory can tell - bad
input, a voucher the cache knows is sold out, /health - and hand everything
that needs Redis or Postgres to the workers (THREADS), keeping the connection
suspended meanwhile. These tests hold the only worker busy (DEMO_DELAY_MS
sleeps inside the order's transaction) and check what is and is not answered
meanwhile, and that a shutdown answers every queued request and exits cleanly;
and that each thread is named after its job.
"""

import os
import re
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seckill_server as ss  # noqa: E402
from seckill_server import fail, psql_value, test  # noqa: E402

TOKEN = "workers-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DELAY_MS = 2000      # one order holds the only worker this long


def create_voucher(srv, stock):
    return ss.new_voucher(srv, TOKEN, stock, "workers")


def orders_of(vid):
    return int(psql_value(f"SELECT count(*) FROM tb_voucher_order WHERE voucher_id = {vid}"))


def sigterm_with(srv, threads, what):
    """SIGTERM while 'threads' (buyers) wait; joins them, fails unless the
    server exits 0. Returns how long the shutdown took."""
    rc, took = srv.stop(15)
    for t in threads:
        t.join(5)
    if rc != 0:
        fail(f"exit status {rc} after SIGTERM with {what}:\n{srv.log_tail()}")
    return took


def one_slow_worker(name):
    """A server whose only worker sleeps DELAY_MS inside each order's
    transaction, with one event thread."""
    return ss.Server(name, {"ADMIN_TOKEN": TOKEN, "THREADS": 1, "IO_THREADS": 1,
                            "DEMO_DELAY_MS": DELAY_MS})


def at_once(fn, status, error, what, busy):
    """Fails unless fn() answers 'status' ('error', unless None) while the
    worker is still busy: busy() (the answers of the buyers the worker
    serves meanwhile) still empty once fn() has answered. An answer that
    needed the worker comes after theirs."""
    r, took = timed(fn)
    if r.status != status or (error is not None and r.body.get("error") != error):
        fail(f"{what}: {r.status} {r.body} after {took:.2f}s (want {status} {error or ''})")
    done = busy()
    if done:
        fail(f"{what}: answered after {took:.2f}s, after the busy worker's buyer(s), answered "
             f"{[getattr(r, 'status', r) for r, _ in done]}")


def load(srv):
    """(read and not yet answered, waiting for a worker) from srv's /metrics,
    the /metrics request itself left out (it is read, not queued)."""
    r = srv.get("/metrics")
    text = r.body if isinstance(r.body, str) else ""
    got = [re.search(rf"^{name} (\d+)$", text, re.M)
           for name in ("seckill_http_in_progress", "seckill_http_queued")]
    if r.status != 200 or not all(got):
        fail(f"/metrics: {r.status} {r.raw[:200]!r}")
    return int(got[0].group(1)) - 1, int(got[1].group(1))


def wait_load(srv, what, cond, timeout=10.0):
    """Waits until cond(unanswered, queued) holds for srv's /metrics."""
    deadline = time.monotonic() + timeout
    while True:
        now = load(srv)
        if cond(*now):
            return
        if time.monotonic() > deadline:
            fail(f"timed out after {timeout}s waiting for {what}: (unanswered, queued) = {now}")
        time.sleep(0.02)


def worker_busy(srv, n=1):
    """Waits until n requests are in, none waiting for a worker: the only
    worker has taken the first one (and is in its transaction, or gathers
    its batch); any others are parked in that batch."""
    wait_load(srv, f"{n} request(s) in, the worker busy", lambda u, q: u == n and q == 0)


def must_buy(srv, vid, uid, what):
    r = srv.seckill(vid, uid)
    if r.status != 200:
        fail(f"{what}: {r.status} {r.body}")


def want_orders(vid, n, why=""):
    """Fails unless Postgres holds exactly n orders of the voucher."""
    have = orders_of(vid)
    if have != n:
        fail(f"orders in Postgres: {have}, want {n}{why}")


def timed(fn):
    t0 = time.monotonic()
    r = fn()
    return r, time.monotonic() - t0


def in_background(fn, out):
    def run():
        t0 = time.monotonic()
        try:
            r = fn()
        except Exception as e:  # noqa: BLE001 - reported by the test
            r = e
        out.append((r, time.monotonic() - t0))
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@test
def workers_open_their_connections_before_the_first_request():
    """Each worker opens its Postgres session as it starts: the first burst
    of a sale does not open 2 x THREADS connections at once (on a busy
    machine some of those missed the connect timeout and answered 503)."""
    threads = 12
    srv = ss.Server("warm-workers", {"THREADS": threads})
    try:
        name = srv.name
        deadline = time.monotonic() + 10
        while True:
            n = int(ss.psql_value("SELECT count(*) FROM pg_stat_activity "
                                  f"WHERE application_name = '{name}'"))
            if n >= threads:
                break
            if time.monotonic() > deadline:
                fail(f"{n} Postgres sessions of {name} before any request, want at least {threads}")
            time.sleep(0.1)
    finally:
        srv.stop_ok()


@test
def every_thread_carries_the_name_of_its_job():
    """top -H and /proc/<pid>/task/*/comm tell the workers, the event threads
    and the background threads apart (a profile of a sale is read by them)."""
    srv = ss.Server("named-threads", {"THREADS": 3, "IO_THREADS": 2})
    try:
        deadline = time.monotonic() + 5
        while True:
            names = {}
            for tid in os.listdir(f"/proc/{srv.proc.pid}/task"):
                try:
                    with open(f"/proc/{srv.proc.pid}/task/{tid}/comm") as f:
                        n = f.read().strip()
                except FileNotFoundError:
                    continue
                names[n] = names.get(n, 0) + 1
            want = {"sk-worker": 3, "MHD-worker": 2, "sk-stats": 1, "sk-peers": 1}
            if all(names.get(k) == v for k, v in want.items()):
                break
            if time.monotonic() > deadline:
                fail(f"threads {names}, want among them {want}")
            time.sleep(0.1)
    finally:
        srv.stop_ok()


@test
def event_threads_refuse_from_memory_while_every_worker_is_busy():
    """THREADS=1: while the worker sleeps inside a buyer's transaction, a
    voucher known to be sold out, a bad user id and /health are answered at
    once by the event threads; a second buyer waits for the worker."""
    srv = one_slow_worker("workers-busy")
    try:
        gone = create_voucher(srv, 1)
        must_buy(srv, gone, 1, "the only item of the first voucher")
        r = srv.seckill(gone, 2)                 # the worker reads stock 0: cached
        if (r.status, r.body.get("error")) != (409, "sold_out"):
            fail(f"second buyer of a sold-out voucher: {r.status} {r.body}")
        vid = create_voucher(srv, 10)
        first, second = [], []
        t1 = in_background(lambda: srv.seckill(vid, 10), first)
        worker_busy(srv)                         # the worker has the first buyer
        t2 = in_background(lambda: srv.seckill(vid, 11), second)
        wait_load(srv, "the second buyer queued for the worker", lambda u, q: u == 2 and q == 1)
        at_once(lambda: srv.seckill(gone, 3), 409, "sold_out",
                "sold out, from memory, while the worker is busy", lambda: first + second)
        at_once(lambda: srv.request("POST", f"/voucher/{vid}/seckill", {"X-User-Id": "abc"}),
                400, "invalid_user_id", "bad user id while the worker is busy",
                lambda: first + second)
        at_once(lambda: srv.get("/health"), 200, None, "/health while the worker is busy",
                lambda: first + second)
        t1.join(15)
        t2.join(15)
        (r1, d1), (r2, d2) = first[0], second[0]
        if r1.status != 200 or r2.status != 200:
            fail(f"the two buyers: {r1.status} {r1.body} / {r2.status} {r2.body}")
        # The second waited for the first's transaction, then ran its own.
        if d2 < 1.5 * DELAY_MS / 1000:
            fail(f"the second buyer took {d2:.2f}s: it did not queue for the only worker")
        want_orders(vid, 2)
    finally:
        srv.stop_ok(15)


@test
def sigterm_answers_every_queued_request_and_exits_cleanly():
    """THREADS=1 and six buyers queued behind a slow transaction, then
    SIGTERM with no drain time (SHUTDOWN_DRAIN_MS=0, so that only the grace
    counts): the buyers that get a worker within the 5 s grace are sold to,
    the rest get 503 at once, each one gets an answer, the process exits 0,
    and Postgres holds exactly the orders answered 200."""
    srv = ss.Server("workers-stop", {"ADMIN_TOKEN": TOKEN, "THREADS": 1,
                                     "DEMO_DELAY_MS": 1500, "SHUTDOWN_DRAIN_MS": 0})
    answers, threads = [], []
    try:
        vid = create_voucher(srv, 10)
        for uid in range(20, 26):
            threads.append(in_background(lambda uid=uid: srv.seckill(vid, uid), answers))
        wait_load(srv, "six buyers in, five queued", lambda u, q: u == 6 and q == 5)
        took = sigterm_with(srv, threads, "requests queued")
        bad = [r for r, _ in answers if isinstance(r, Exception)]
        if len(answers) != 6 or bad:
            fail(f"{len(answers)} of 6 buyers answered, errors {bad}")
        sold = sum(1 for r, _ in answers if r.status == 200)
        refused = [r for r, _ in answers if r.status == 503]
        if sold + len(refused) != 6 or not refused or sold < 3:
            fail(f"answers {[(r.status, r.body) for r, _ in answers]}: want 200 for those "
                 f"served within the grace (at least 3) and 503 for the rest")
        if any(r.body.get("error") != "unavailable" for r in refused):
            fail(f"503 bodies: {[r.body for r in refused]}")
        want_orders(vid, sold, " (the buyers answered 200)")
        if took > 10:
            fail(f"the shutdown took {took:.1f}s")
    finally:
        srv.stop(15)


@test
def repeat_buyer_is_refused_from_memory_while_every_worker_is_busy():
    """THREADS=1: a user who just bought is refused (409 already_ordered) by
    the event thread while the only worker sleeps in another transaction."""
    srv = one_slow_worker("workers-repeat")
    try:
        vid = create_voucher(srv, 10)
        must_buy(srv, vid, 50, "the first order")
        other = []
        t = in_background(lambda: srv.seckill(vid, 51), other)
        worker_busy(srv)
        at_once(lambda: srv.seckill(vid, 50), 409, "already_ordered",
                "the repeat buyer while the worker is busy", lambda: other)
        t.join(15)
        want_orders(vid, 2)
    finally:
        srv.stop_ok(15)


@test
def a_reset_forgets_the_buyers_it_deleted():
    """A repeat attempt is refused from memory, without the lock (no grant
    counted); a reset deletes the voucher's orders and the memory with them:
    the same user buys again at once (well within the cache's 1 s)."""
    srv = ss.Server("workers-reset", {"ADMIN_TOKEN": TOKEN})
    try:
        vid = create_voucher(srv, 10)
        must_buy(srv, vid, 60, "the first order")
        lock0 = srv.get("/stats").body["lock"]
        r = srv.seckill(vid, 60)
        lock1 = srv.get("/stats").body["lock"]
        if (r.status, r.body.get("error")) != (409, "already_ordered"):
            fail(f"the repeat attempt: {r.status} {r.body}")
        if lock1["acquired"] != lock0["acquired"] or lock1["contended"] != lock0["contended"]:
            fail(f"the repeat attempt reached the lock: {lock0} -> {lock1}")
        r = srv.post(f"/admin/vouchers/{vid}/reset", AUTH, {"stock": 10})
        if r.status != 200:
            fail(f"reset -> {r.status} {r.body}")
        must_buy(srv, vid, 60, "buying again after the reset")
        want_orders(vid, 1)
    finally:
        srv.stop_ok(15)


def crowd_of(srv, vid, uids):
    """One thread and one connection per buyer, all started together."""
    answers, threads = [], []
    go = threading.Event()

    def buy(uid):
        go.wait(5)
        answers.append((uid, srv.seckill(vid, uid)))
    for uid in uids:
        t = threading.Thread(target=buy, args=(uid,), daemon=True)
        t.start()
        threads.append(t)
    go.set()
    for t in threads:
        t.join(20)
    return answers


@test
def batched_batch_holds_more_buyers_than_workers():
    """SECKILL_STOCK=batched with THREADS=2: a buyer waiting for its batch
    holds no worker (its connection stays suspended and the batch's leader
    answers it), so 30 buyers arriving together share a few commits, the
    largest batch far above 2; every one gets 200, Postgres has the 30
    orders and no lock key is left."""
    srv = ss.Server("workers-batch", {"ADMIN_TOKEN": TOKEN, "THREADS": 2,
                                      "SECKILL_STOCK": "batched", "BATCH_MAX": 64,
                                      "BATCH_WINDOW_US": 300000})
    try:
        vid = create_voucher(srv, 100)
        uids = list(range(40_000, 40_030))
        answers = crowd_of(srv, vid, uids)
        bad = [(u, r.status, r.body) for u, r in answers if r.status != 200]
        if len(answers) != 30 or bad:
            fail(f"{len(answers)} answers, not 200: {bad}")
        want_orders(vid, 30)
        b = srv.get("/stats").body["batch"]
        if b["buyers"] != 30 or b["largest"] <= 2 or b["batches"] > 15:
            fail(f"/stats batch {b}: want 30 buyers in batches larger than THREADS=2")
        left = ss.redis(["--scan", "--pattern", "lock:order:400*"]).strip()
        if left:
            fail(f"lock keys left after the batches: {left.split()}")
    finally:
        srv.stop_ok(15)


@test
def batched_buyers_join_the_batch_at_work_without_a_worker():
    """THREADS=1, batched, a 1 s window: the only worker leads the first
    buyer's batch; the nine buyers who arrive while it gathers are put in
    that batch by the event threads, without a worker's turn. One batch of
    ten, every buyer 200, in about one window. (Through the worker, each
    would wait for the leader to finish and then lead a batch of its own:
    ten batches, ten windows.)"""
    window = 1.0
    srv = ss.Server("workers-join", {"ADMIN_TOKEN": TOKEN, "THREADS": 1, "IO_THREADS": 1,
                                     "SECKILL_STOCK": "batched",
                                     "BATCH_WINDOW_US": int(window * 1e6)})
    try:
        vid = create_voucher(srv, 100)
        first = []
        t0 = in_background(lambda: srv.seckill(vid, 43_000), first)
        worker_busy(srv)                 # the worker now gathers the batch
        answers, took = timed(lambda: crowd_of(srv, vid, range(43_001, 43_010)))
        t0.join(10)
        statuses = sorted(r.status for _, r in answers) + [a[0].status for a in first]
        if statuses != [200] * 10:
            fail(f"answers: {statuses}")
        b = srv.get("/stats").body["batch"]
        if (b["batches"], b["buyers"], b["largest"]) != (1, 10, 10):
            fail(f"/stats batch {b}: want the ten buyers in one batch")
        if took > 3 * window:
            fail(f"the nine buyers took {took:.2f}s ({window:.0f} s window): they waited for "
                 "the worker")
        want_orders(vid, 10)
    finally:
        srv.stop_ok(15)


@test
def sigterm_answers_the_buyers_parked_in_a_batch():
    """Batched, THREADS=1, a 1 s window: the only worker leads a batch and
    five buyers join it from the event threads; SIGTERM meanwhile. The
    leader settles its batch within the grace and answers all six (200),
    the process exits 0, and Postgres holds the six orders."""
    srv = ss.Server("workers-stop-batch", {"ADMIN_TOKEN": TOKEN, "THREADS": 1,
                                           "SECKILL_STOCK": "batched",
                                           "BATCH_WINDOW_US": 1000000})
    answers, threads = [], []
    try:
        vid = create_voucher(srv, 10)
        threads.append(in_background(lambda: srv.seckill(vid, 44_000), answers))
        worker_busy(srv)                 # the worker now gathers the batch
        for uid in range(44_001, 44_006):
            threads.append(in_background(lambda uid=uid: srv.seckill(vid, uid), answers))
        worker_busy(srv, 6)              # the five parked in its batch, none queued
        took = sigterm_with(srv, threads, "buyers in a batch")
        got = sorted(r.status if not isinstance(r, Exception) else repr(r) for r, _ in answers)
        if got != [200] * 6:
            fail(f"answers {got}: want six 200s")
        want_orders(vid, 6)
        if took > 5:
            fail(f"the shutdown took {took:.1f}s")
    finally:
        srv.stop(15)


@test
def batched_lock_is_the_request_s_own_not_its_worker_s():
    """THREADS=2, batched: one worker leads a batch (it gathers for 1 s)
    while user X's request joins it, then X's second request. The leader
    takes the batch's locks in one round trip, each for its request's own
    owner id: Redisson's owner is instance:thread, and two requests queued
    by one thread (an event thread or a worker) must not both get the lock
    as one reentrant holder. One is refused at the lock (contended +1)."""
    srv = ss.Server("workers-owner", {"ADMIN_TOKEN": TOKEN, "THREADS": 2,
                                      "SECKILL_STOCK": "batched", "BATCH_WINDOW_US": 1000000})
    try:
        vid = create_voucher(srv, 10)
        lock0 = srv.get("/stats").body["lock"]
        leader, first = [], []
        t0 = in_background(lambda: srv.seckill(vid, 41_001), leader)
        worker_busy(srv)                 # one worker now gathers the batch
        t1 = in_background(lambda: srv.seckill(vid, 41_000), first)
        worker_busy(srv, 2)              # X parked in it; the other worker is free
        r, took = timed(lambda: srv.seckill(vid, 41_000))
        t0.join(10)
        t1.join(10)
        if (r.status, r.body.get("error")) != (409, "already_ordered"):
            fail(f"the same user's second request: {r.status} {r.body}")
        if [a[0].status for a in leader + first] != [200, 200]:
            fail(f"the first two requests: {leader} {first}")
        lock1 = srv.get("/stats").body["lock"]
        if lock1["contended"] - lock0["contended"] != 1 or \
                lock1["acquired"] - lock0["acquired"] != 2:
            fail(f"lock figures {lock0} -> {lock1}: want two grants and one contended attempt")
        if took > 5:                     # the window, not a lease (10 s)
            fail(f"the refusal took {took:.2f}s")
        want_orders(vid, 2)
    finally:
        srv.stop_ok(15)


@test
def batched_redis_down_is_the_leaders_503():
    """Batched with Redis unreachable: the worker hands the buyer to the
    batch without touching Redis; the leader cannot take the lock and
    answers 503 unavailable, with no order and the stock untouched."""
    srv = ss.Server("workers-batch-noredis", {
        "ADMIN_TOKEN": TOKEN, "SECKILL_STOCK": "batched",
        "REDIS_URL": f"redis://127.0.0.1:{ss.dead_port()}/0"})
    try:
        vid = create_voucher(srv, 5)
        r, took = timed(lambda: srv.seckill(vid, 42_000))
        if (r.status, r.body.get("error")) != (503, "unavailable") or "redis" not in \
                r.body.get("message", "") or took > 5:
            fail(f"batched buyer with Redis down: {r.status} {r.body} after {took:.2f}s")
        stock = int(psql_value(f"SELECT stock FROM tb_voucher WHERE voucher_id = {vid}"))
        if orders_of(vid) != 0 or stock != 5:
            fail(f"Redis down, yet Postgres changed: orders {orders_of(vid)}, stock {stock}")
    finally:
        srv.stop_ok(15)


if __name__ == "__main__":
    ss.main()
