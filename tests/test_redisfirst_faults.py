#!/usr/bin/env python3
"""SECKILL_STOCK=redis under load, with one fault each (make faults runs
this file; make test too). Each ends, once the stream has drained, with
zero acknowledged orders lost, zero oversell, zero duplicates, and Redis and
Postgres agreeing (redisfirst_kit.reconcile).

  instance kill   an instance whose consumer holds delivered entries is
                  killed (SIGKILL) mid-sale; another claims them
  redis crash     Redis (AOF, appendfsync always) killed mid-sale and
                  restarted from its AOF
  postgres stop   Postgres stopped (SIGSTOP of every process) for
                  FAULT_PG_STOP_S seconds (10) mid-sale: the sale goes on,
                  the orders queue in the stream and land after it returns
"""

import os
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seckill_server as ss  # noqa: E402
from seckill_server import fail, test  # noqa: E402
import redisfirst_kit  # noqa: E402
from redisfirst_kit import (TOKEN, buy_all, durable_redis, rcli, reconcile,  # noqa: E402
                            server, stats, stop_postgres_for)

PG_STOP_S = float(os.environ.get("FAULT_PG_STOP_S", "10"))


def in_background(fn):
    out = {}

    def run():
        try:
            out["result"] = fn()
        except Exception as e:              # reported by join()
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()

    def join(timeout=180):
        t.join(timeout)
        if t.is_alive():
            fail("the crowd did not finish")
        if "error" in out:
            raise out["error"]
        return out["result"]
    return join


def consumer_pending(rs, name_prefix):
    """Entries pending to the consumers whose name starts with name_prefix."""
    out = rcli(rs, "XINFO", "CONSUMERS", "seckill:orders", "seckill").split("\n")
    n = 0
    for i, word in enumerate(out):
        if word == "name" and out[i + 1].startswith(name_prefix):
            j = out.index("pending", i)
            n += int(out[j + 1])
    return n


@test
def an_instance_killed_with_claimed_entries_under_load_loses_no_order():
    rs = durable_redis()
    # The crowd buys through 'front' (no consumer). After the first 600
    # orders 'a' starts, takes the orders waiting so far in one read, and
    # cannot persist them (its Postgres is unreachable); the rest of the
    # crowd buys meanwhile, and 'a' is killed once that part of the sale is
    # under way, holding what it read. Steps, not pauses: however fast the
    # machine, the kill comes while the sale goes on. 'b' starts then: it
    # persists the new orders and claims a's once they were idle
    # CONSUMER_CLAIM_IDLE_MS (2 s).
    front = server("rff-front", rs, CONSUMERS=0)
    a = b = None
    try:
        vid = ss.new_voucher(front, TOKEN, 1500)
        first, answers = buy_all([front], vid, range(8100001, 8100601), workers=8)
        if len(first) != 600:
            fail(f"the first 600 buyers: {len(first)} orders, {sorted(set(answers))[:5]}")
        a = server("rff-a", rs, PG_DSN=f"host=127.0.0.1 port={ss.dead_port()} dbname=x")
        deadline = time.monotonic() + 20
        while consumer_pending(rs, "rff-a:") == 0:
            if time.monotonic() > deadline:
                fail("the doomed instance's consumer never held an entry")
            time.sleep(0.02)
        crowd = in_background(lambda: buy_all([front], vid, range(8100601, 8102001), workers=8))
        while int(rcli(rs, "HGET", f"seckill:v:{{{vid}}}", "stock")) > 900 - 20:
            if time.monotonic() > deadline:
                fail("the rest of the sale did not start")
            time.sleep(0.005)
        held = consumer_pending(rs, "rff-a:")
        a.kill()
        killed_at = int(rcli(rs, "HGET", f"seckill:v:{{{vid}}}", "stock"))
        b = server("rff-b", rs)
        acked, answers = crowd()
        acked.update(first)
        bad = [x for x in answers if x[0] not in (200, 409)]
        if bad:
            fail(f"unexpected answers: {bad[:5]}")
        if len(acked) != 1500:
            fail(f"{len(acked)} orders acknowledged for a stock of 1500")
        if killed_at == 0:
            fail("the instance was killed after the sale, not during it")
        st, n = reconcile(b, rs, vid, acked, 1500, timeout=60)
        claimed = stats(b)["consumer"]["claimed"]
        if claimed < held:
            fail(f"{claimed} entries claimed of the {held} the killed instance held")
        print(f"# killed an instance holding {held} delivered entries mid-sale ({killed_at} units "
              f"left): {claimed} claimed by another, {len(acked)} acknowledged, {n} rows, 0 lost",
              flush=True)
    finally:
        if a is not None:
            a.kill()
        front.stop_ok()
        if b is not None:
            b.stop_ok()
        rs.kill()


@test
def a_redis_crash_with_aof_always_loses_no_acknowledged_order():
    rs = durable_redis()
    a = server("rff-crash", rs, REDIS_TIMEOUT_MS=300)
    b = server("rff-crash2", rs, REDIS_TIMEOUT_MS=300)
    try:
        vid = ss.new_voucher(a, TOKEN, 1500)
        crowd = in_background(lambda: buy_all([a, b], vid, range(8200001, 8201201), workers=8))
        # Mid-sale: once some orders were acknowledged and more are coming.
        deadline = time.monotonic() + 20
        while int(rcli(rs, "HGET", f"seckill:v:{{{vid}}}", "stock")) > 1300:
            if time.monotonic() > deadline:
                fail("the sale did not start")
            time.sleep(0.01)
        rs.kill()                          # SIGKILL
        time.sleep(0.5)
        rs.start()
        acked, answers = crowd()
        refused = sum(1 for x in answers if x[0] == 503)
        # The buyers refused during the outage buy again once Redis is back.
        more, _ = buy_all([a], vid, range(8201201, 8201251), workers=4)
        acked.update(more)
        st, n = reconcile(a, rs, vid, acked, 1500, timeout=60)
        print(f"# Redis SIGKILLed mid-sale and restarted from its AOF: {len(acked)} acknowledged "
              f"({refused} answered 503 during the outage), {n} rows, 0 lost", flush=True)
    finally:
        a.stop_ok()
        b.stop_ok()
        rs.kill()


@test
def orders_admitted_while_postgres_is_stopped_land_after_it_returns():
    rs = durable_redis()
    a = server("rff-pgstop", rs)
    b = server("rff-pgstop2", rs)
    try:
        vid = ss.new_voucher(a, TOKEN, 100000)
        acked, _ = buy_all([a, b], vid, range(8300001, 8300101), workers=4)
        during = {"acked": {}, "answers": []}

        def crowd():
            # Waves of buyers for the whole stop (less a second's margin).
            # Each buyer asks both instances: one 200, one already_ordered.
            first, t_end = 8300101, time.monotonic() + max(1.0, PG_STOP_S - 1.5)
            while True:
                got, answers = buy_all([a, b], vid, range(first, first + 500), workers=8)
                during["acked"].update(got)
                during["answers"] += answers
                during["buyers"] = during.get("buyers", 0) + 500
                first += 500
                if time.monotonic() > t_end:
                    break
            during["backlog"] = redisfirst_kit.unsettled(rs)

        t0 = time.monotonic()
        stop_postgres_for(PG_STOP_S, crowd)
        back = time.monotonic()
        got = during["acked"]
        if len(got) != during["buyers"]:
            bad = [x for x in during["answers"] if x[0] not in (200, 409)]
            fail(f"{len(got)} of {during['buyers']} orders acknowledged while Postgres was "
                 f"stopped: {bad[:5]}")
        if during["backlog"] == 0:
            fail("nothing waited in the stream while Postgres was stopped")
        acked.update(got)
        st, n = reconcile(a, rs, vid, acked, 100000, timeout=120)
        landed = time.monotonic() - back
        print(f"# Postgres stopped {PG_STOP_S:g} s mid-sale: {len(got)} orders acknowledged in the "
              f"first {back - t0:.1f} s ({during['backlog']} waiting in the stream), all {n} rows "
              f"there {landed:.1f} s after it returned ({during['backlog'] / landed:.0f} orders/s "
              f"while draining, /stats's poll included); lag max "
              f"{max(stats(a)['consumer']['lagMsMax'], stats(b)['consumer']['lagMsMax']):.0f} ms",
              flush=True)
    finally:
        a.stop_ok()
        b.stop_ok()
        rs.kill()


@test
def stopping_postgres_lets_it_go_when_one_of_its_processes_has_exited():
    """The list of Postgres's processes is read before they are stopped, and
    a backend may exit in between (the one that answered the query that found
    the postmaster always does). Such a process is skipped: Postgres is
    stopped and let go again, not left stopped for the tests after."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    found = redisfirst_kit.postgres_pids
    pids = found()
    redisfirst_kit.postgres_pids = lambda: pids[:1] + [gone.pid] + pids[1:]
    try:
        stop_postgres_for(0.2)
    except ProcessLookupError as e:
        fail(f"stopping Postgres failed on a process that had exited: {e}")
    finally:
        redisfirst_kit.postgres_pids = found
        stopped = [p for p in pids if proc_state(p) == "T"]
        for p in pids:                  # whatever happened, not left stopped
            try:
                os.kill(p, signal.SIGCONT)
            except ProcessLookupError:
                pass
    if stopped:
        fail(f"{len(stopped)} Postgres process(es) left stopped, the postmaster among them: "
             f"{pids[0] in stopped}")
    if ss.psql_value("SELECT 1") != "1":
        fail("Postgres does not answer after it was let go")


@test
def postgres_pids_does_not_need_the_backend_that_answered():
    """The backend that answers a query exits with its session, and may be
    gone before the kit looks at it: the kit must find Postgres's processes
    all the same (here every such backend is waited out first)."""
    real = redisfirst_kit.psql_value

    def answered_then_gone(sql):
        v = real(sql)
        if "pg_backend_pid" in sql:
            deadline = time.monotonic() + 5
            while os.path.exists(f"/proc/{int(v)}") and time.monotonic() < deadline:
                time.sleep(0.01)
        return v

    redisfirst_kit.psql_value = answered_then_gone
    try:
        pids = redisfirst_kit.postgres_pids()
    except OSError as e:
        fail(f"the kit looked for a backend that had exited: {e}")
    finally:
        redisfirst_kit.psql_value = real
    with open(f"/proc/{pids[0]}/cmdline", "rb") as f:
        if b"postgres" not in f.read():
            fail(f"{pids[0]} is not Postgres's postmaster")
    if len(pids) < 3:
        fail(f"only {len(pids)} Postgres processes found")


def proc_state(pid):
    """The state letter of /proc/<pid>/stat ('T': stopped), or '' if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


if __name__ == "__main__":
    ss.main()
