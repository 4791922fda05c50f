"""The load of the fault tests (test_faults.py, test_pg_ha.py): workers
buying as distinct users through one port each, every answer recorded, and
the verdict of loadtest/check_invariants.py over them. Python 3 standard
library only."""

import http.client
import os
import sys
import threading
import time
from collections import Counter, namedtuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seckill_server as ss  # noqa: E402
from seckill_server import fail  # noqa: E402

sys.path.insert(0, os.path.join(ss.ROOT, "loadtest"))
import check_invariants as checker  # noqa: E402
import kit  # noqa: E402

RATE = float(os.environ.get("FAULTS_RATE", "25"))


Rec = namedtuple("Rec", "via user t0 t1 status code instance order_id retry_after error message")


class Load:
    """Workers, each on its own keep-alive connection to one port, buying as
    distinct users at 'rate' requests/s each, recording every answer."""

    def __init__(self, voucher, targets, rate=RATE, timeout=20.0, user_base=None):
        self.voucher = voucher
        self.targets = targets            # [(label, port)], one worker each
        self.rate = rate
        self.timeout = timeout
        self.records = []
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.threads = []
        base = user_base or (int(time.time() * 1000) % 10 ** 9) * 1000
        self.user_bases = [base * 10 + i * 10 ** 6 for i in range(len(targets))]

    def start(self):
        for i, (label, port) in enumerate(self.targets):
            t = threading.Thread(target=self._worker, args=(i, label, port), daemon=True)
            t.start()
            self.threads.append(t)
        return self

    def _worker(self, i, label, port):
        client = kit.Client(port, timeout=self.timeout)
        user = self.user_bases[i]
        next_at = time.monotonic()
        while not self.stop_event.is_set():
            user += 1
            t0 = time.monotonic()
            status = code = inst = oid = ra = err = msg = None
            try:
                r = client.request("POST", f"/voucher/{self.voucher}/seckill",
                                   {"X-User-Id": str(user)})
                status, body = r.status, r.body if isinstance(r.body, dict) else {}
                inst = r.headers.get("x-instance-id")
                ra = r.headers.get("retry-after")
                if status == 200:
                    oid = body.get("orderId")
                else:
                    code = body.get("error")
                    msg = body.get("message")
            except ConnectionRefusedError:
                err = "refused"
            except (OSError, http.client.HTTPException) as e:
                err = type(e).__name__
            with self.lock:
                self.records.append(Rec(label, user, t0, time.monotonic(), status, code, inst,
                                        oid, ra, err, msg))
            next_at = max(next_at + 1.0 / self.rate, time.monotonic() - 1.0 / self.rate)
            self.stop_event.wait(max(0.0, next_at - time.monotonic()))
        client.close()

    def stop(self):
        self.stop_event.set()
        for t in self.threads:
            t.join(self.timeout + 5)
        return sorted(self.records, key=lambda r: r.t0)


def outcome(r):
    if r.error:
        return f"error {r.error}"
    return f"{r.status} {r.code}" if r.code else str(r.status)


def unknown_outcome(r):
    """An answer after which the client cannot know whether it bought:
    nginx's 502/504 (the request may have reached the instance), a transport
    error after sending. A refused connection sent nothing."""
    return r.status in (502, 504) or (r.error is not None and r.error != "refused")


def tally(recs):
    return dict(Counter(outcome(r) for r in recs).most_common())


def pct(values, p):
    return kit.percentile(values, p) if values else 0.0


def start_stack(st, what, timeout=120):
    """scripts/stack.sh start for the fault tests' stack st (what names it in
    the failure): stopped again and a test failure when it does not start;
    its env file read and its processes registered with tests/run.sh."""
    p = st.run("start", timeout)
    if p.returncode != 0:
        st.run("stop")
        fail(f"stack.sh start{what}: exit {p.returncode}\n{p.stderr}")
    st.read_env()
    ss.register_stack_pids(st.run_dir)
    return st


def check_invariants(st, voucher, recs, label, extra_ids=(), unknown_extra=0):
    """loadtest/check_invariants.py over the load's answers (and the order
    ids of 200s the test got outside the load)."""
    ids = [r.order_id for r in recs if r.status == 200] + list(extra_ids)
    unknown = sum(1 for r in recs if unknown_outcome(r)) + unknown_extra
    path = os.path.join(ss.TEST_TMP, f"faults-{label}-ids.txt")
    with open(path, "w") as f:
        f.write("".join(i + "\n" for i in ids))
    verify(f"{label}: ", st, voucher, path, len(ids), unknown)
    orders = int(ss.psql_value(f"SELECT count(*) FROM tb_voucher_order WHERE voucher_id = {voucher}",
                               dsn=st.dsn))
    return {"answers200": len(ids), "unknownOutcome": unknown, "orders": orders}


def verify(what, st, voucher, ids_path, ok, unknown):
    """loadtest/check_invariants.py's verdict, printed; fails unless they hold."""
    rc, lines, error = checker.verify(st.dsn, [voucher], ids_path, None, ok, unknown)
    print("    " + "\n    ".join(lines + ([error] if error else [])), flush=True)
    if rc != 0:
        fail(f"{what}check_invariants exit {rc}:\n" + "\n".join(lines) + (error or ""))
