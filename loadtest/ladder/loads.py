"""The ladder's loads: the sale to distinct buyers (ab), the single-user
storm (keep-alive connections of its own) and the buyers through a lock
service's outage."""

import http.client
import math
import os
import subprocess
import threading
import time
import urllib.parse

import kit

from .stack import LadderError

# How long an outage step's buyers wait for the first 200 after the service
# is started again before the step reports that sales never resumed.
OUTAGE_BACK_WAIT_S = 60.0


def write_tsv(path, head, rows, line):
    """A tab-separated file: head lines, then line(row) for each row."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(h + "\n" for h in head))
        for row in rows:
            f.write(line(row) + "\n")


def run_threads(target, n, timeout, what):
    """n daemon threads running target(); LadderError when one is still
    running after timeout seconds."""
    t0 = time.monotonic()
    threads = [threading.Thread(target=target, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(1.0, t0 + timeout - time.monotonic()))
    if any(t.is_alive() for t in threads):
        raise LadderError(f"{what} did not finish within {timeout:.0f} s")


def storm_sender(base, path, user, load, barrier, t0, lines, lock):
    """One storm connection: open, wait for the others, then the user's
    request again GAP seconds after each answer until SECONDS have passed."""
    client = kit.Client(base, timeout=60)
    try:
        client.connect()
    except OSError:
        pass
    try:
        barrier.wait(timeout=30)
    except threading.BrokenBarrierError:
        pass
    deadline = t0 + load["seconds"]
    while True:
        t = time.monotonic()
        try:
            status = client.request("POST", path, {"X-User-Id": str(user)}).status
        except (OSError, http.client.HTTPException):
            status = 0              # the client reconnects for the next one
        with lock:
            lines.append((t - t0, status, (time.monotonic() - t) * 1000.0))
        if time.monotonic() + load["gap"] >= deadline:
            break
        time.sleep(load["gap"])
    client.close()


def outage_figures(lines, marks):
    """The figures of an outage from its answers [(start, status, ms, error)]
    and the moments the service was stopping, stopped and started."""
    return {
        "stoppedAtS": round(marks["stopped"], 3), "startedAtS": round(marks["started"], 3),
        "unavailable": sum(1 for x in lines if x[1] == 503 and x[3] == "unavailable"),
        "maxMs": max((x[2] for x in lines), default=0.0),
        "okAfter": sum(1 for x in lines if x[1] == 200 and x[0] > marks["started"]),
        # under way while the service was being stopped: a commit whose
        # answer the stop cut off is one of these
        "inFlight503": sum(1 for x in lines if x[1] == 503 and x[0] < marks["stopped"]
                           and x[0] + x[2] / 1000 > marks["stopping"]),
        "backAfterS": min((round(x[0] + x[2] / 1000 - marks["started"], 3) for x in lines
                           if x[1] == 200 and x[0] > marks["started"]), default=None),
        "okDuring": sum(1 for x in lines if x[1] == 200
                        and marks["stopped"] < x[0] and x[0] + x[2] / 1000 < marks["started"]),
    }


class Loads:
    """The loads (a mixin of Ladder)."""

    def drive(self, step, step_dir, user):
        """Runs the step's load; returns (requests, seconds, transport errors, times)."""
        load = step["load"]
        url = f"{self.base_url}/voucher/{self.voucher}/seckill"
        if load["kind"] == "sale":
            return self.sale(load, url, step_dir)
        if load["kind"] == "redis-crash":
            return self.burst_then_kill(step, step_dir)
        if load["kind"] == "pg-failover":
            return self.pg_burst_then_kill(step, step_dir)
        if load["kind"] == "cluster-failover":
            return self.cluster_burst_then_kill(step, step_dir)
        if load["kind"] == "outage":
            return self.outage(step, load, url, step_dir)
        return self.storm(load, url, user, step_dir)

    def sale(self, load, url, step_dir):
        """ab, one request per buyer (the instances run with DEMO_RANDOM_USER=1)."""
        n = load["requests"] if not self.args.quick else load["requests"] // 2
        t0 = time.monotonic()
        p = self.run_ab("ab", n, load["concurrency"], url, step_dir)
        try:
            rc = p.wait(timeout=300)
        except subprocess.TimeoutExpired:
            p.kill()
            raise LadderError("ab did not finish within 300 s")
        seconds = time.monotonic() - t0
        with open(os.path.join(step_dir, "ab.txt"), errors="replace") as f:
            text = f.read()
        if rc != 0:
            raise LadderError(f"ab failed (exit {rc}):\n{text[-1500:]}")
        m = kit.parse_ab(text)           # with -l, "failed" are transport failures only
        return m["requests"], seconds, m["failed"], kit.ab_times(os.path.join(step_dir, "ab.tsv"))

    def run_ab(self, name, n, c, url, step_dir):
        """ab started on url (n requests, c at once), its report in NAME.txt
        and its per-request times in NAME.tsv; the Popen."""
        args = ["ab", "-l", "-r", "-s", "30", "-n", str(n), "-c", str(c),
                "-g", os.path.join(step_dir, f"{name}.tsv"), "-m", "POST", url]
        out = open(os.path.join(step_dir, f"{name}.txt"), "w")
        try:
            return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        finally:
            out.close()

    def storm(self, load, url, user, step_dir):
        """One user hammers the button: CONNECTIONS keep-alive connections
        through nginx open, wait until all are open, send at once, then each
        sends again GAP seconds after every answer, for SECONDS. Not ab: ab
        sends its first request alone and the others only once that one is
        answered, so a slow first order would never meet a second request."""
        u = urllib.parse.urlsplit(url)
        lines, lock, failures = [], threading.Lock(), []
        barrier = threading.Barrier(load["connections"])
        t0 = time.monotonic()

        def worker():
            try:
                storm_sender(f"{u.scheme}://{u.netloc}", u.path, user, load, barrier, t0, lines, lock)
            except Exception as e:          # noqa: BLE001 -- reported below
                failures.append(f"{type(e).__name__}: {e}")

        run_threads(worker, load["connections"], 300, "the storm")
        if failures:
            raise LadderError(f"a storm thread failed: {failures[0]}")
        seconds = time.monotonic() - t0
        lines.sort()
        write_tsv(os.path.join(step_dir, "storm.tsv"), ["start_s\tstatus\tms"], lines,
                  lambda x: f"{x[0]:.3f}\t{x[1]}\t{x[2]:.1f}")
        errors = sum(1 for x in lines if x[1] == 0)
        return len(lines), seconds, errors, [x[2] for x in lines]

    def outage(self, step, load, url, step_dir):
        """Distinct buyers (DEMO_RANDOM_USER: no X-User-Id) on CONNECTIONS
        keep-alive connections for SECONDS at least, and until the step's
        service, stopped at STOP_AT and started again at START_AT, is back
        (service_outage says how long that is). Every answer's start, status
        and time go to outage.tsv; the figures of the outage to self.extra."""
        u = urllib.parse.urlsplit(url)
        lines, lock = [], threading.Lock()
        t0 = time.monotonic()
        # Set once the service is back (service_outage): the buyers must be
        # buying when it comes back, however long its stop and start take.
        deadline = [math.inf]

        def buyer():
            client = kit.Client(f"{u.scheme}://{u.netloc}", timeout=30)
            while time.monotonic() < deadline[0]:
                t = time.monotonic()
                try:
                    rsp = client.request("POST", u.path, {})
                    status = rsp.status
                    code = rsp.body.get("error", "") if isinstance(rsp.body, dict) else ""
                except (OSError, http.client.HTTPException):
                    status, code = 0, "transport"
                with lock:
                    lines.append((t - t0, status, (time.monotonic() - t) * 1000.0, code))
                time.sleep(0.01)
            client.close()

        threads = [threading.Thread(target=buyer, daemon=True) for _ in range(load["connections"])]
        for t in threads:
            t.start()
        def back_since(started):
            with lock:
                return any(x[1] == 200 and x[0] > started for x in lines)

        try:
            marks = self.service_outage(step, load, t0, deadline, back_since)
        finally:
            if deadline[0] == math.inf:          # the outage failed: stop the buyers
                deadline[0] = time.monotonic()
            for t in threads:
                t.join(timeout=max(1.0, deadline[0] + 60 - time.monotonic()))
        if any(t.is_alive() for t in threads):
            raise LadderError("the outage's buyers did not finish within 60 s of its end")
        seconds = time.monotonic() - t0
        lines.sort()
        write_tsv(os.path.join(step_dir, "outage.tsv"),
                  [f"# stopped at {marks['stopped']:.3f} s, started at {marks['started']:.3f} s",
                   "start_s\tstatus\tms\terror"], lines,
                  lambda x: f"{x[0]:.3f}\t{x[1]}\t{x[2]:.1f}\t{x[3]}")
        self.extra = {"outage": outage_figures(lines, marks)}
        errors = sum(1 for x in lines if x[1] == 0)
        return len(lines), seconds, errors, [x[2] for x in lines]

    def service_outage(self, step, load, t0, deadline, back_since):
        """The step's service stopped at STOP_AT and started at START_AT
        (seconds after t0); the buyers go on until the first 200 after the
        start (back_since(started): an event, however long the service and
        the instances take to come back on a loaded machine, up to
        OUTAGE_BACK_WAIT_S), then AFTER_S more. Returns the moments
        (stopping, stopped, started)."""
        marks = {}
        time.sleep(max(0.0, t0 + load["stop_at"] - time.monotonic()))
        marks["stopping"] = time.monotonic() - t0
        self.service("stop", step["service"])
        marks["stopped"] = time.monotonic() - t0
        time.sleep(max(0.0, t0 + load["start_at"] - time.monotonic()))
        self.service("start", step["service"])
        marks["started"] = time.monotonic() - t0
        wait_until = time.monotonic() + OUTAGE_BACK_WAIT_S
        while time.monotonic() < wait_until and not back_since(marks["started"]):
            time.sleep(0.1)
        deadline[0] = max(t0 + load["seconds"], time.monotonic() + load["after_s"])
        return marks
