#!/usr/bin/env python3
"""The Postgres locks (SECKILL_LOCK=pg-table and pg-advisory) when the
database stops answering: the instance's Postgres backends are stopped
(SIGSTOP: their kernel still acknowledges, so neither keepalives nor
statement_timeout end a wait) for 12 s. The lock's statement is bounded
like every other round trip (PG_STATEMENT_TIMEOUT_MS + 1 s): the buyer gets
503 and GET /ready, queued behind it on the one worker, answers, both well
before the backends resume.
"""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seckill_server as ss  # noqa: E402
from redisfirst_kit import stop_postgres_for  # noqa: E402
from seckill_server import fail, test  # noqa: E402

TOKEN = "pgl-faults-token"
STOP_S = 12.0         # the backends resume after this
BOUND_S = 6.0         # answers must come before this (the bound is 0.5 s + 1 s)


def timed(box, key, fn):
    """Runs fn in a thread; box[key] = (its answer or exception, seconds)."""
    t0 = time.monotonic()

    def run():
        try:
            r = fn()
            out = (r.status, r.body.get("error") if isinstance(r.body, dict) else r.body)
        except Exception as e:          # noqa: BLE001 - reported by the caller
            out = (type(e).__name__, str(e))
        box[key] = (out, time.monotonic() - t0)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def stopped_backends_case(lock, uid):
    name = f"pgl-faults-{lock}"
    srv = ss.Server(name, {"ADMIN_TOKEN": TOKEN, "SECKILL_LOCK": lock, "THREADS": 1,
                           "PG_STATEMENT_TIMEOUT_MS": 500, "LOG_LEVEL": "warn"})
    box, threads = {}, []

    def ask():
        threads.append(timed(box, "buy", lambda: srv.seckill(vid, uid + 1, timeout=30)))
        time.sleep(0.3)                 # the buy holds the one worker first
        threads.append(timed(box, "ready", lambda: srv.get("/ready", timeout=30)))

    try:
        vid = ss.new_voucher(srv, TOKEN, 10, f"{lock} stopped")
        r = srv.seckill(vid, uid)
        if r.status != 200:
            fail(f"{lock}: the first sale -> {r.status} {r.body!r}")
        pids = ss.backend_pids(name)
        if not pids:
            fail(f"{lock}: no Postgres backend of {name}")
        stop_postgres_for(STOP_S, then=ask, pids=pids)
        for t in threads:
            t.join(30)
    finally:
        srv.stop_ok()
    buy, ready = box.get("buy"), box.get("ready")
    print(f"  {lock}: backends stopped {STOP_S:.0f}s: buy {said(buy)}, /ready {said(ready)}",
          flush=True)
    if buy is None or buy[0] != (503, "unavailable") or buy[1] > BOUND_S:
        fail(f"{lock}: a buy with the backends stopped for {STOP_S:.0f}s: {said(buy)} "
             f"(want 503 unavailable within {BOUND_S:.0f}s)")
    if ready is None or ready[0][0] not in (200, 503) or ready[1] > BOUND_S:
        fail(f"{lock}: /ready with the backends stopped for {STOP_S:.0f}s: {said(ready)} "
             f"(want an answer within {BOUND_S:.0f}s)")


def said(answer):
    return "no answer" if answer is None else f"{answer[0]} after {answer[1]:.1f}s"


@test
def pg_table_lock_answers_within_the_bound_with_postgres_stopped():
    stopped_backends_case("pg-table", 8_700_000)


@test
def pg_advisory_lock_answers_within_the_bound_with_postgres_stopped():
    stopped_backends_case("pg-advisory", 8_700_100)


if __name__ == "__main__":
    ss.main()
