#!/usr/bin/env python3
"""Event threads and workers (app/http.c).

libmicrohttpd's event threads (IO_THREADS) answer what memory can tell - bad
input, a voucher the cache knows is sold out, /health - and hand everything
that needs Redis or Postgres to the workers (THREADS), keeping the connection
suspended meanwhile. These tests hold the only worker busy (DEMO_DELAY_MS
sleeps inside the order's transaction) and check what is and is not answered
meanwhile, and that a shutdown answers every queued request and exits cleanly.
"""

import os
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
    r = srv.post("/admin/vouchers", AUTH, ss.voucher_body("workers", stock))
    if r.status != 201:
        fail(f"create voucher -> {r.status} {r.body!r}")
    return r.body["voucherId"]


def orders_of(vid):
    return int(psql_value(f"SELECT count(*) FROM tb_voucher_order WHERE voucher_id = {vid}"))


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
def event_threads_refuse_from_memory_while_every_worker_is_busy():
    """THREADS=1: while the worker sleeps inside a buyer's transaction, a
    voucher known to be sold out, a bad user id and /health are answered at
    once by the event threads; a second buyer waits for the worker."""
    srv = ss.Server("workers-busy", {"ADMIN_TOKEN": TOKEN, "THREADS": 1, "IO_THREADS": 1,
                                     "DEMO_DELAY_MS": DELAY_MS})
    try:
        gone = create_voucher(srv, 1)
        if srv.seckill(gone, 1).status != 200:
            fail("the only item of the first voucher was not sold")
        r = srv.seckill(gone, 2)                 # the worker reads stock 0: cached
        if (r.status, r.body.get("error")) != (409, "sold_out"):
            fail(f"second buyer of a sold-out voucher: {r.status} {r.body}")
        vid = create_voucher(srv, 10)
        first, second = [], []
        t1 = in_background(lambda: srv.seckill(vid, 10), first)
        time.sleep(0.2)                          # the worker is now in the transaction
        t2 = in_background(lambda: srv.seckill(vid, 11), second)
        time.sleep(0.1)
        r, took = timed(lambda: srv.seckill(gone, 3))
        if (r.status, r.body.get("error")) != (409, "sold_out") or took > 0.5:
            fail(f"sold out, from memory, while the worker is busy: {r.status} {r.body} "
                 f"after {took:.2f}s (want 409 sold_out at once)")
        r, took = timed(lambda: srv.request("POST", f"/voucher/{vid}/seckill",
                                            {"X-User-Id": "abc"}))
        if (r.status, r.body.get("error")) != (400, "invalid_user_id") or took > 0.5:
            fail(f"bad user id while the worker is busy: {r.status} {r.body} after {took:.2f}s")
        r, took = timed(lambda: srv.get("/health"))
        if r.status != 200 or took > 0.5:
            fail(f"/health while the worker is busy: {r.status} after {took:.2f}s")
        if first or second:
            fail(f"a buyer was answered before the worker could have finished: {first} {second}")
        t1.join(15)
        t2.join(15)
        (r1, d1), (r2, d2) = first[0], second[0]
        if r1.status != 200 or r2.status != 200:
            fail(f"the two buyers: {r1.status} {r1.body} / {r2.status} {r2.body}")
        # The second waited for the first's transaction, then ran its own.
        if d2 < 1.5 * DELAY_MS / 1000:
            fail(f"the second buyer took {d2:.2f}s: it did not queue for the only worker")
        if orders_of(vid) != 2:
            fail(f"orders in Postgres: {orders_of(vid)}, want 2")
    finally:
        srv.stop_ok(15)


@test
def sigterm_answers_every_queued_request_and_exits_cleanly():
    """THREADS=1 and six buyers queued behind a slow transaction, then
    SIGTERM: the buyers that get a worker within the 5 s grace are sold to,
    the rest get 503 at once, each one gets an answer, the process exits 0,
    and Postgres holds exactly the orders answered 200."""
    srv = ss.Server("workers-stop", {"ADMIN_TOKEN": TOKEN, "THREADS": 1,
                                     "DEMO_DELAY_MS": 1500})
    answers, threads = [], []
    try:
        vid = create_voucher(srv, 10)
        for uid in range(20, 26):
            threads.append(in_background(lambda uid=uid: srv.seckill(vid, uid), answers))
            time.sleep(0.05)
        time.sleep(0.3)
        rc, took = srv.stop(15)
        for t in threads:
            t.join(5)
        if rc != 0:
            fail(f"exit status {rc} after SIGTERM with requests queued:\n{srv.log_tail()}")
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
        if orders_of(vid) != sold:
            fail(f"Postgres holds {orders_of(vid)} orders, {sold} buyers were answered 200")
        if took > 10:
            fail(f"the shutdown took {took:.1f}s")
    finally:
        srv.stop(15)


if __name__ == "__main__":
    ss.main()
