#!/usr/bin/env python3
"""Stopping an instance without dropping a request (SIGTERM drains):

- at SIGTERM /ready turns 503 at once, every answer carries
  "Connection: close", the listening socket closes (a new connection is
  refused, so nginx sends that request to another instance: nothing was
  sent), the requests in flight finish and are answered, and the process
  exits 0 once its clients have closed their connections;
- SIGINT does the same without waiting for idle connections;
- a second SIGTERM while the shutdown is stuck (a request held by
  DEMO_PAUSE_MS) ends the process at once;
- a rolling restart (scripts/stack.sh rolling-restart) of both instances
  behind nginx during a sale: no 5xx and no transport error at any client,
  and the orders in Postgres are exactly the 200 answers.
Prints "N passed, M failed".
"""

import http.client
import os
import signal
import socket
import sys
import threading
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seckill_server as ss  # noqa: E402
from seckill_server import fail, test  # noqa: E402

TOKEN = "drain-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
RUN_DIR = os.path.join(ss.TEST_TMP, "drain-stack")


def in_background(fn):
    """Runs fn() in a thread; returns a dict that gets "r" (its result) or
    "e" (its exception) and the thread."""
    out = {}

    def run():
        try:
            out["r"] = fn()
        except Exception as e:          # recorded for the test to judge
            out["e"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return out, t


def connect_refused(port):
    with socket.socket() as s:
        s.settimeout(2)
        try:
            s.connect(("127.0.0.1", port))
        except ConnectionRefusedError:
            return True
        except OSError as e:
            fail(f"a new connection during the drain: {e!r}, want it refused")
    return False


def wait_lock(uid, timeout=10):
    """Waits until user uid's order lock exists: its worker holds it (and,
    with DEMO_PAUSE_MS, sleeps holding it)."""
    deadline = time.monotonic() + timeout
    while ss.redis(["EXISTS", f"lock:order:{uid}"]).strip() != "1":
        if time.monotonic() > deadline:
            fail(f"user {uid}'s lock was not taken within {timeout} s")
        time.sleep(0.01)


def wait_exit(srv, timeout):
    try:
        return srv.proc.wait(timeout=timeout)
    except Exception:
        return None


@test
def sigterm_drains_ready_503_connection_close_listener_closed():
    srv = ss.Server("drain", {"ADMIN_TOKEN": TOKEN, "DEMO_PAUSE_MS": 1500})
    idle = ss.Client(srv.port)
    keep = ss.Client(srv.port)
    try:
        vid = ss.new_voucher(srv, TOKEN, 5)
        for c in (idle, keep):
            if c.request("GET", "/health").status != 200:
                fail("GET /health before the drain")
        buy, t = in_background(lambda: ss.request(srv.port, "POST", f"/voucher/{vid}/seckill",
                                                  {"X-User-Id": "4201"}))
        wait_lock(4201)                       # the buyer holds its lock, paused
        srv.proc.send_signal(signal.SIGTERM)
        # The drain has begun once the listener is closed (after the flag
        # that /ready reads is set).
        deadline = time.monotonic() + 10
        while not connect_refused(srv.port):
            if time.monotonic() > deadline:
                fail("the listener was still open 10 s after SIGTERM")
            time.sleep(0.02)
        if srv.proc.poll() is not None:
            fail(f"exited with {srv.proc.returncode} with a request in flight")
        r = keep.request("GET", "/ready")
        conn_hdr = r.headers.get("connection", "").lower()
        if r.status != 503 or r.body.get("error") != "unavailable" or conn_hdr != "close":
            fail(f"GET /ready on an open connection during the drain: {r.status} "
                 f"Connection: {conn_hdr!r} {r.raw!r}; want 503 unavailable, Connection: close")
        if keep.conn is not None:
            fail("the client kept the connection after Connection: close")
        if not connect_refused(srv.port):
            fail("a new connection was accepted during the drain: the listener is still open")
        t.join(10)
        b = buy.get("r")
        if not isinstance(b, ss.Response) or b.status != 200:
            fail(f"the request in flight at SIGTERM: {buy}, want 200")
        if b.headers.get("connection", "").lower() != "close":
            fail(f"its answer lacks Connection: close: {b.headers}")
        rows = ss.psql(f"SELECT id FROM tb_voucher_order WHERE voucher_id = {vid}")
        if rows != [[b.body["orderId"]]]:
            fail(f"orders {rows}, want the answered {b.body['orderId']}")
        # One idle keep-alive connection is still open: the instance waits for
        # its client to close it (nginx closes an idle upstream connection
        # after its keepalive_timeout) rather than cut it under a request.
        time.sleep(0.5)
        if srv.proc.poll() is not None:
            fail("exited while a client's keep-alive connection was still open")
        idle.close()
        rc = wait_exit(srv, 3)
        if rc != 0:
            fail(f"after the last connection closed: exit {rc}, want 0 within 3 s")
    finally:
        idle.close()
        keep.close()
        if srv.alive():
            srv.kill()
        else:
            srv.stop()


@test
def every_thread_but_main_blocks_the_stop_signals():
    """Only main (and, during a shutdown, its second-signal thread) may take
    SIGTERM, SIGINT and SIGHUP: a thread that leaves them open is handed one
    whenever main is not in sigwait (starting, or draining), and the process
    dies of it with no drain. SECKILL_LOCK=pg-table with its sweeper starts a
    thread while the lock strategy starts, early in the start-up; every
    thread's mask is read from /proc, then a SIGTERM must drain and exit 0."""
    srv = ss.Server("drain-pgtable", {"ADMIN_TOKEN": TOKEN, "SECKILL_LOCK": "pg-table",
                                      "LOCK_PG_SWEEP_MS": 60000})
    stop_signals = (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGINT - 1)) | \
        (1 << (signal.SIGHUP - 1))
    try:
        if ss.request(srv.port, "GET", "/health").status != 200:
            fail("GET /health before the signal")
        task = f"/proc/{srv.proc.pid}/task"
        names, open_to = [], []
        for t in os.listdir(task):
            if int(t) == srv.proc.pid:
                continue                      # main: it takes them with sigwait
            with open(f"{task}/{t}/comm") as f:
                comm = f.read().strip()
            with open(f"{task}/{t}/status") as f:
                blk = next(int(x.split()[1], 16) for x in f if x.startswith("SigBlk:"))
            names.append(comm)
            if blk & stop_signals != stop_signals:
                open_to.append(f"{comm} (SigBlk {blk:x})")
        if "sk-pglock-sweep" not in names:
            fail(f"no sweeper thread among {sorted(set(names))}: the test does not see it")
        if open_to:
            fail(f"threads that can be handed SIGTERM/SIGINT/SIGHUP: {open_to}")
        srv.proc.send_signal(signal.SIGTERM)
        rc = wait_exit(srv, 15)
        if rc != 0 or "stopped" not in srv.log_tail():
            fail(f"exit {rc} after SIGTERM (want 0 after a drain); log:\n{srv.log_tail()}")
    finally:
        srv.kill()


@test
def drain_ends_at_shutdown_drain_ms_with_an_idle_connection_left():
    srv = ss.Server("drain-cap", {"SHUTDOWN_DRAIN_MS": 800})
    idle = ss.Client(srv.port)
    try:
        idle.request("GET", "/health")
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        rc = wait_exit(srv, 5)
        took = time.monotonic() - t0
        if rc != 0 or not 0.6 < took < 3:
            fail(f"exit {rc} after {took:.2f} s with an idle connection open; want 0 after "
                 f"about SHUTDOWN_DRAIN_MS (0.8 s)")
    finally:
        idle.close()
        if srv.alive():
            srv.kill()
        else:
            srv.stop()


@test
def sigint_does_not_wait_for_idle_connections():
    """SIGINT (Ctrl-C, and the local stack's restart-instances, which stops
    every instance with no traffic to protect) drains like SIGTERM but does
    not wait for clients to close their idle connections."""
    srv = ss.Server("drain-int", {"ADMIN_TOKEN": TOKEN, "DEMO_PAUSE_MS": 1000})
    idle = ss.Client(srv.port)
    try:
        vid = ss.new_voucher(srv, TOKEN, 5)
        idle.request("GET", "/health")
        buy, t = in_background(lambda: ss.request(srv.port, "POST", f"/voucher/{vid}/seckill",
                                                  {"X-User-Id": "4401"}))
        wait_lock(4401)                       # in flight: holding its lock, paused 1 s
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGINT)
        rc = wait_exit(srv, 5)
        took = time.monotonic() - t0
        t.join(5)
        b = buy.get("r")
        if not isinstance(b, ss.Response) or b.status != 200:
            fail(f"the request in flight at SIGINT: {buy}, want 200")
        # Waiting for the idle connection would take the drain (6 s by default).
        if rc != 0 or took > 3:
            fail(f"exit {rc} {took:.2f} s after SIGINT with an idle connection open: want 0 "
                 "once the request in flight is answered (about 1 s), not after the 6 s drain")
    finally:
        idle.close()
        if srv.alive():
            srv.kill()
        else:
            srv.stop()


@test
def a_second_sigterm_ends_a_stuck_shutdown():
    srv = ss.Server("stuck", {"ADMIN_TOKEN": TOKEN, "DEMO_PAUSE_MS": 30000})
    try:
        vid = ss.new_voucher(srv, TOKEN, 5)
        in_background(lambda: ss.request(srv.port, "POST", f"/voucher/{vid}/seckill",
                                          {"X-User-Id": "4301"}, timeout=40))
        wait_lock(4301)
        srv.proc.send_signal(signal.SIGTERM)
        if wait_exit(srv, 1.5) is not None:
            fail(f"the first SIGTERM ended it at once (exit {srv.proc.returncode}) with a "
                 "request in flight")
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        rc = wait_exit(srv, 2)
        if rc is None:
            fail("still running 2 s after a second SIGTERM")
        if rc == 0:
            fail("exit 0 after a second SIGTERM cut a request short")
        log = open(srv.log_path, encoding="utf-8", errors="replace").read()
        if "second signal" not in log:
            fail(f"the log does not say why it stopped at once:\n{srv.log_tail(5)}")
        ss.unregister_pid(srv.proc.pid)
        print(f"    exit {rc} {time.monotonic() - t0:.2f} s after the second SIGTERM")
    finally:
        if srv.alive():
            srv.kill()
        srv.proc = None


# ---------------------------------------------------------------- rolling restart

class Buyers:
    """Threads, each on its own keep-alive connection to nginx, buying as new
    users one after another; every answer or transport error is recorded."""

    def __init__(self, port, voucher, n=8):
        self.port, self.voucher, self.n = port, voucher, n
        self.stop_event = threading.Event()
        self.records = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True)
                        for i in range(n)]

    def run(self, i):
        client = ss.Client(self.port, timeout=20)
        user = 5_000_000 + i * 1_000_000
        try:
            while not self.stop_event.is_set():
                user += 1
                t0 = time.monotonic()
                try:
                    r = client.seckill(self.voucher, user)
                    rec = (user, t0, r.status, r.body if r.status == 200 else r.raw[:200],
                           r.headers.get("x-instance-id"))
                except (OSError, http.client.HTTPException) as e:
                    rec = (user, t0, None, repr(e), None)
                with self.lock:
                    self.records.append(rec)
                time.sleep(0.005)
        finally:
            client.close()

    def start(self):
        for t in self.threads:
            t.start()

    def stop(self):
        self.stop_event.set()
        for t in self.threads:
            t.join(30)
        return self.records


@test
def rolling_restart_through_nginx_during_a_sale_has_no_5xx():
    st = ss.local_stack(RUN_DIR, INSTANCES=2, THREADS=4, LOG_LEVEL="warn", DEMO_RANDOM_USER=0)
    try:
        st.start(fresh=True)
        ss.register_stack_pids(RUN_DIR)
        vid = st.create_voucher(1_000_000, "rolling restart")
        before = {n: st.pid(n) for n in ("app-1", "app-2")}
        buyers = Buyers(st.nginx_port, vid)
        buyers.start()
        time.sleep(1.5)
        t0 = time.monotonic()
        st.rolling_restart()
        took = time.monotonic() - t0
        ss.register_stack_pids(RUN_DIR)
        time.sleep(1.5)
        recs = buyers.stop()
        after = {n: st.pid(n) for n in ("app-1", "app-2")}
        if any(before[n] == after[n] for n in before):
            fail(f"instances not restarted: pids {before} -> {after}")
        statuses = Counter(r[2] for r in recs)
        bad = [r for r in recs if r[2] != 200]
        during = sum(1 for r in recs if t0 <= r[1] <= t0 + took)
        print(f"    {len(recs)} requests ({during} during the {took:.1f} s restart): "
              f"{dict(statuses)}")
        if bad:
            fail(f"{len(bad)} answers other than 200 (5xx or transport errors): "
                 f"{[(r[2], r[3]) for r in bad[:5]]}")
        if during < 50:
            fail(f"only {during} requests during the restart: the load did not run")
        served = Counter(r[4] for r in recs if r[1] > t0 + took)
        if set(served) != {"seckill-1", "seckill-2"}:
            fail(f"after the restart, answers came from {dict(served)}: want both instances")
        answered = {int(r[3]["orderId"]): r[0] for r in recs}
        rows = ss.psql(f"SELECT id, user_id FROM tb_voucher_order WHERE voucher_id = {vid}",
                       dsn=st.dsn)
        orders = {int(i): int(u) for i, u in rows}
        if orders != answered:
            fail(f"{len(orders)} orders in Postgres, {len(answered)} answered 200: "
                 f"{len(set(orders) - set(answered))} never answered, "
                 f"{len(set(answered) - set(orders))} answered but missing")
        stock = ss.psql(f"SELECT initial_stock - stock FROM tb_voucher WHERE voucher_id = {vid}",
                        dsn=st.dsn)
        if int(stock[0][0]) != len(orders):
            fail(f"stock taken {stock[0][0]} != {len(orders)} orders")
    finally:
        try:
            st.stop()
        except Exception as e:       # reported, the test's own failure comes first
            print(f"    stack stop: {e}")


if __name__ == "__main__":
    ss.main()
