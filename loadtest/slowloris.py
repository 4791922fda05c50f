#!/usr/bin/env python3
"""Slow clients against an HTTP server, and the latency of normal requests meanwhile.

  loadtest/slowloris.py [--host 127.0.0.1] --port PORT [--connections 1000]
      [--mode idle|trickle] [--interval 5] [--probe-path /health]
      [--probe-method GET] [--probe-requests 400] [--probe-clients 4]

1. Probes the server unloaded: --probe-requests requests over --probe-clients
   keep-alive connections; prints p50/p99/max latency.
2. Opens --connections slow connections. Each sends the start of a request
   ("POST /voucher/1/seckill HTTP/1.1", Host) and then, in 'trickle' mode, one
   more header line every --interval seconds; in 'idle' mode nothing more.
3. Probes again while they are open; then again after closing them.
4. Prints how many slow connections the server closed meanwhile, and exits 1
   when a probe request failed or the loaded p99 is above --max-ratio (default
   2) times the larger of the two unloaded p99s.

With --probe-method POST the probe buys (POST, X-User-Id: a new user each
time, --probe-path /voucher/ID/seckill). Python 3 standard library only; also
imported by tests/test_faults.py. Raise the open-file limit for many
connections (done here up to the hard limit).
"""

import argparse
import http.client
import os
import resource
import socket
import sys
import threading
import time

sys.dont_write_bytecode = True          # no __pycache__ in loadtest/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kit  # noqa: E402


def raise_nofile(want):
    """Raises the soft open-file limit towards 'want' (up to the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class SlowClients:
    """N connections that start a request and never finish it."""

    HEAD = b"POST /voucher/1/seckill HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: 1\r\n"

    def __init__(self, host, port, n, mode="trickle", interval=5.0):
        self.host, self.port, self.n, self.mode, self.interval = host, port, n, mode, interval
        self.socks = []
        self.refused = 0            # connections the server would not take
        self.closed_by_server = 0
        self.sent_lines = 0
        self._stop = threading.Event()
        self._thread = None

    def open(self, timeout=30):
        raise_nofile(self.n + 512)
        deadline = time.monotonic() + timeout
        for _ in range(self.n):
            if time.monotonic() > deadline:
                break
            try:
                s = socket.create_connection((self.host, self.port), timeout=5)
                s.sendall(self.HEAD)
                s.setblocking(False)
                self.socks.append(s)
            except OSError:
                self.refused += 1
        if self.mode == "trickle":
            self._thread = threading.Thread(target=self._trickle, daemon=True)
            self._thread.start()
        return self

    def _trickle(self):
        i = 0
        while not self._stop.wait(self.interval):
            i += 1
            line = b"X-Trickle-%d: %d\r\n" % (i, i)
            for s in list(self.socks):
                try:
                    s.send(line)
                    self.sent_lines += 1
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    self._drop(s)

    def _drop(self, s):
        try:
            self.socks.remove(s)
        except ValueError:
            return
        self.closed_by_server += 1
        s.close()

    def poll_closed(self):
        """Counts (and forgets) the connections the server has closed."""
        for s in list(self.socks):
            try:
                data = s.recv(4096)
                if data == b"":
                    self._drop(s)
                # an answer (408, 400 ...) is followed by a close: next poll
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self._drop(s)
        return len(self.socks)

    def close(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 5)
        for s in self.socks:
            s.close()
        self.socks = []


def probe(host, port, n, clients, method="GET", path="/health", user_base=None, timeout=10):
    """n requests over 'clients' keep-alive connections; returns
    (latencies in ms of the successful ones, failures as strings)."""
    lat, failures = [], []
    lock = threading.Lock()
    counter = iter(range(n))
    users = iter(range(user_base or 0, (user_base or 0) + n))

    def worker():
        conn = None
        while True:
            with lock:
                if next(counter, None) is None:
                    break
                user = next(users)
            headers = {}
            if method == "POST":
                headers["X-User-Id"] = str(user)
                headers["Content-Length"] = "0"
            t0 = time.perf_counter()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(host, port, timeout=timeout)
                conn.request(method, path, headers=headers)
                r = conn.getresponse()
                r.read()
                ms = (time.perf_counter() - t0) * 1000.0
                with lock:
                    if r.status in (200, 409):
                        lat.append(ms)
                    else:
                        failures.append(f"status {r.status}")
                if r.will_close:
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as e:
                with lock:
                    failures.append(f"{type(e).__name__}: {e}")
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + n)
    return lat, failures


def summary(lat):
    """n, p50, p99 (kit.percentile: nearest rank) and max of latencies; NaN
    for no latencies."""
    if not lat:
        return {"n": 0, "p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    return {"n": len(lat), "p50": kit.percentile(lat, 50), "p99": kit.percentile(lat, 99),
            "max": max(lat)}


def run(host, port, connections, mode, interval, method, path, n, clients, user_base=None,
        hold=2.0, log=print):
    """The whole experiment; returns a dict of figures."""
    ub = user_base if user_base is not None else int(time.time()) * 1000
    base1, f1 = probe(host, port, n, clients, method, path, ub)
    log(f"unloaded:   {fmt(summary(base1))}")
    slow = SlowClients(host, port, connections, mode, interval)
    t0 = time.monotonic()
    slow.open()
    opened = len(slow.socks)
    log(f"opened {opened} slow connections ({mode}) in {time.monotonic() - t0:.1f}s,"
        f" {slow.refused} refused")
    time.sleep(hold)
    loaded, f2 = probe(host, port, n, clients, method, path, ub + n)
    still_open = slow.poll_closed()
    log(f"loaded:     {fmt(summary(loaded))}; slow connections still open {still_open},"
        f" closed by the server {slow.closed_by_server}")
    slow.close()
    time.sleep(0.5)
    base2, f3 = probe(host, port, n, clients, method, path, ub + 2 * n)
    log(f"unloaded:   {fmt(summary(base2))}")
    return {"unloaded1": summary(base1), "loaded": summary(loaded), "unloaded2": summary(base2),
            "failures": f1 + f2 + f3, "loadedFailures": f2, "slowOpened": opened,
            "slowStillOpen": still_open,
            "slowClosedByServer": slow.closed_by_server, "slowRefused": slow.refused}


def fmt(s):
    return f"n={s['n']} p50={s['p50']:.2f}ms p99={s['p99']:.2f}ms max={s['max']:.2f}ms"


def main(argv=None):
    ap = argparse.ArgumentParser(description="Slow clients vs. normal request latency.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--mode", choices=("idle", "trickle"), default="trickle")
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between trickled lines")
    ap.add_argument("--probe-method", default="GET", choices=("GET", "POST"))
    ap.add_argument("--probe-path", default="/health")
    ap.add_argument("--probe-requests", type=int, default=400)
    ap.add_argument("--probe-clients", type=int, default=4)
    ap.add_argument("--hold", type=float, default=2.0, help="seconds between opening and probing")
    ap.add_argument("--max-ratio", type=float, default=2.0)
    a = ap.parse_args(argv)
    res = run(a.host, a.port, a.connections, a.mode, a.interval, a.probe_method, a.probe_path,
              a.probe_requests, a.probe_clients, hold=a.hold)
    base = max(res["unloaded1"]["p99"], res["unloaded2"]["p99"])
    ratio = res["loaded"]["p99"] / base if base > 0 else float("inf")
    print(f"p99 loaded / unloaded = {res['loaded']['p99']:.2f} / {base:.2f} ms = {ratio:.2f}"
          f" (limit {a.max_ratio})")
    if res["failures"]:
        print(f"{len(res['failures'])} probe requests failed, e.g. {res['failures'][:3]}")
    return 0 if not res["failures"] and ratio <= a.max_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
