#!/usr/bin/env python3
"""nginx/ in front of fake upstreams: the configuration's promises, observed.

Each test generates a configuration with nginx/gen-conf.sh into its own
directory under TEST_TMP, starts nginx there (never the system's), and puts
small Python HTTP servers behind it that answer, hang up, or hang:
  - a POST that reached an instance is never sent to another one, even when
    the first one fails (no 'non_idempotent'); a GET is retried;
  - nginx's own errors (400, 413, 414, 502, 504) carry the JSON error body, with
    Retry-After on 502/504; the instances' own error answers pass untouched;
  - X-Request-Id is passed (made up when absent), keep-alive to the upstreams,
    the access log names the upstream, nothing is written outside the prefix;
  - make bench's stand-in upstream (loadtest/upstream200.c) frames requests as
    nginx expects and keeps its connections;
  - /admin, /metrics and /stats (nginx's own /stats/edge too) answer only the allow-list (--allow; loopback
    by default): a client on 127.0.0.2 with an allow-list of 127.0.0.1 gets
    403 with the JSON error body, whatever the spelling of the path or its
    headers, and reaches every other path.
Prints "N passed, M failed". Python 3 standard library only.
"""

import http.client
import json
import os
import re
import select
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seckill_server as ss  # noqa: E402
from seckill_server import fail, test  # noqa: E402

ROOT = ss.ROOT


# ---------------------------------------------------------------- fake upstreams

class Upstream:
    """A tiny HTTP/1.1 server with keep-alive. mode: 'ok' (200 JSON), 'close'
    (reads the request, closes without answering), 'hang' (reads, never
    answers), or 'status:NNN' (answers NNN with an app-style error body)."""

    def __init__(self, mode="ok"):
        self.mode = mode
        self.requests = []          # (method, path, headers dict lower-case, conn id)
        self.connections = 0
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        up = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                with up.lock:
                    up.connections += 1
                    conn_id = up.connections
                sock = self.request
                sock.settimeout(10)
                buf = b""
                while not up.stop_event.is_set():
                    while b"\r\n\r\n" not in buf:
                        try:
                            chunk = sock.recv(65536)
                        except OSError:
                            return
                        if not chunk:
                            return
                        buf += chunk
                    head, _, buf = buf.partition(b"\r\n\r\n")
                    lines = head.decode("latin-1").split("\r\n")
                    method, path = lines[0].split(" ")[:2]
                    headers = {}
                    for l in lines[1:]:
                        k, _, v = l.partition(":")
                        headers[k.strip().lower()] = v.strip()
                    n = int(headers.get("content-length", "0") or 0)
                    while len(buf) < n:
                        chunk = sock.recv(65536)
                        if not chunk:
                            return
                        buf += chunk
                    buf = buf[n:]
                    with up.lock:
                        up.requests.append((method, path, headers, conn_id))
                    if up.mode == "close":
                        return
                    if up.mode == "hang":
                        up.stop_event.wait(30)
                        return
                    if up.mode.startswith("status:"):
                        status = int(up.mode.split(":")[1])
                        body = b'{"error":"unavailable","message":"from the instance"}'
                        extra = "Retry-After: 7\r\n"
                    else:
                        status = 200
                        body = json.dumps({"ok": True, "rid": headers.get("x-request-id")}).encode()
                        extra = ""
                    resp = (f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body
                    try:
                        sock.sendall(resp)
                    except OSError:
                        return

        class Server(socketserver.ThreadingTCPServer):
            allow_reuse_address = True
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.addr = f"127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def rids(self):
        with self.lock:
            return [h.get("x-request-id") for _m, _p, h, _c in self.requests]

    def close(self):
        self.stop_event.set()
        self.server.shutdown()
        self.server.server_close()


class Nginx:
    """nginx from nginx/gen-conf.sh, in a directory of its own."""

    count = 0

    def __init__(self, upstreams, extra_args=()):
        Nginx.count += 1
        self.dir = os.path.join(ss.TEST_TMP, f"nginx-{os.getpid()}-{Nginx.count}")
        self.port, self.pid = ss.start_nginx(self.dir, upstreams, extra_args)
        _nginxes.append(self)

    def request(self, method, path, headers=None, body=None, timeout=15):
        return ss.request(self.port, method, path, headers, body, timeout)

    def access_log(self, want=None, timeout=3):
        """The access log; with want (a regex), waits until it matches: nginx
        writes the line after it has sent the answer."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                text = open(os.path.join(self.dir, "access.log")).read()
            except OSError:
                text = ""
            if want is None or re.search(want, text) or time.monotonic() > deadline:
                return text
            time.sleep(0.05)

    def stop(self):
        if self.pid:
            if not ss.stop_pid(self.pid, signal.SIGTERM):
                os.kill(self.pid, signal.SIGKILL)
            ss.unregister_pid(self.pid)
            self.pid = None


_nginxes = []
_upstreams = []


def upstream(mode="ok"):
    u = Upstream(mode)
    _upstreams.append(u)
    return u


def teardown():
    """Stops everything, then raises the first complaint an upstream made."""
    first = None
    while _nginxes:
        _nginxes.pop().stop()
    while _upstreams:
        try:
            _upstreams.pop().close()
        except AssertionError as e:
            first = first or e
    if first:
        raise first


def nginx_test(fn):
    """A test whose nginx and fake upstreams are stopped when it ends."""
    def run():
        try:
            fn()
        finally:
            teardown()
    run.__name__ = fn.__name__
    return test(run)


def expect_json_error(r, status, code, retry_after=False):
    if r.status != status:
        fail(f"want {status}, got {r.status}: {r.raw[:200]!r}")
    if "application/json" not in r.headers.get("content-type", ""):
        fail(f"{status}: content-type {r.headers.get('content-type')!r}, want application/json")
    if not isinstance(r.body, dict) or r.body.get("error") != code or not r.body.get("message"):
        fail(f"{status}: body {r.raw[:200]!r}, want {{\"error\":\"{code}\",\"message\":...}}")
    if set(r.body) != {"error", "message"}:
        fail(f"{status}: extra fields in {r.body}")
    if retry_after and not r.headers.get("retry-after", "").isdigit():
        fail(f"{status}: no Retry-After header: {r.headers}")


# ---------------------------------------------------------------- tests

@test
def generated_config_has_the_required_directives():
    d = os.path.join(ss.TEST_TMP, "nginx-conf-check")
    p = subprocess.run([ss.GEN_CONF, "--prefix", d, "--listen", "127.0.0.1:18080", "--upstream",
                        "127.0.0.1:1", "--upstream", "127.0.0.1:2"],
                       capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        fail(p.stderr)
    conf = re.sub(r"#.*", "", p.stdout)
    for needle in ("proxy_http_version 1.1;", 'proxy_set_header Connection "";', "keepalive 512;",
                   "proxy_next_upstream error timeout;", "client_max_body_size",
                   "client_header_timeout", "client_body_timeout", "proxy_connect_timeout",
                   "proxy_read_timeout", "proxy_send_timeout", "$upstream_addr",
                   "$upstream_status", "$request_time", "$upstream_response_time",
                   "proxy_set_header X-Request-Id", "server 127.0.0.1:1 ", "server 127.0.0.1:2 "):
        if needle not in conf:
            fail(f"generated configuration lacks {needle!r}")
    if "non_idempotent" in conf:
        fail("proxy_next_upstream must not include non_idempotent")
    if "proxy_intercept_errors on" in conf:
        fail("proxy_intercept_errors must stay off: the instances' errors pass through")
    listens = re.findall(r"^\s*listen\s+(\S+)", conf, re.M)
    if listens != ["127.0.0.1:18080"]:
        fail(f"listen {listens}: want 127.0.0.1 only")
    for directive in ("pid", "error_log", "access_log", "client_body_temp_path", "proxy_temp_path",
                      "fastcgi_temp_path", "uwsgi_temp_path", "scgi_temp_path"):
        for m in re.findall(rf"^\s*{directive}\s+(\S+)", conf, re.M):
            if not m.rstrip(";").startswith(d + "/"):
                fail(f"{directive} {m} is outside the prefix {d}")
    with open(os.path.join(d, "nginx.conf"), "w") as f:
        f.write(p.stdout)
    p = subprocess.run([ss.NGINX, "-t", "-q", "-p", d, "-c", os.path.join(d, "nginx.conf"),
                        "-e", d + "/error.log"], capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        fail(f"nginx -t: {p.stderr}")


@nginx_test
def post_is_never_sent_to_a_second_instance():
    bad, good = upstream("close"), upstream("ok")
    n = Nginx([bad.addr, good.addr])
    statuses = []
    for i in range(8):
        rid = f"post-{i}-{time.monotonic_ns()}"
        r = n.request("POST", "/voucher/1/seckill", {"X-User-Id": "7", "X-Request-Id": rid})
        statuses.append(r.status)
        seen = bad.rids().count(rid) + good.rids().count(rid)
        if seen != 1:
            fail(f"POST {rid} reached the instances {seen} times (answer {r.status})")
        if r.status == 502:
            expect_json_error(r, 502, "unavailable", retry_after=True)
        elif r.status != 200:
            fail(f"unexpected {r.status}: {r.raw!r}")
    if 502 not in statuses or not bad.requests:
        fail(f"the failing instance got no POST: statuses {statuses}")
    if "up=" + bad.addr not in n.access_log(re.escape("up=" + bad.addr)):
        fail("access log does not name the failing upstream")


@nginx_test
def get_is_retried_on_the_other_instance():
    bad, good = upstream("close"), upstream("ok")
    n = Nginx([bad.addr, good.addr])
    for i in range(4):
        rid = f"get-{i}-{time.monotonic_ns()}"
        r = n.request("GET", "/voucher/1", {"X-Request-Id": rid})
        if r.status != 200:
            fail(f"GET {rid}: {r.status} {r.raw!r}")
        if rid in bad.rids() and rid not in good.rids():
            fail(f"GET {rid} failed on one instance and was not retried")
    if not bad.requests:
        fail("no GET reached the failing instance")
    want = rf"up={re.escape(bad.addr)}, {re.escape(good.addr)} us=502, 200"
    log = n.access_log(want)
    if not re.search(want, log):
        fail(f"access log does not show the retry:\n{log}")


@nginx_test
def slow_instance_gives_504_json_and_no_retry():
    slow, good = upstream("hang"), upstream("ok")
    n = Nginx([slow.addr, good.addr], ["--read-timeout", "1s"])
    got504 = False
    for i in range(4):
        rid = f"slow-{i}-{time.monotonic_ns()}"
        r = n.request("POST", "/voucher/1/seckill", {"X-User-Id": "7", "X-Request-Id": rid})
        if r.status == 504:
            expect_json_error(r, 504, "unavailable", retry_after=True)
            got504 = True
            if rid in good.rids():
                fail("a POST that timed out was sent to the other instance")
            break
    if not got504:
        fail("no request reached the hanging instance")


@nginx_test
def all_instances_down_gives_502_json():
    n = Nginx([f"127.0.0.1:{ss.dead_port()}", f"127.0.0.1:{ss.dead_port()}"])
    for method in ("POST", "GET"):
        r = n.request(method, "/voucher/1/seckill", {"X-User-Id": "1"})
        expect_json_error(r, 502, "unavailable", retry_after=True)
        if not r.headers.get("x-request-id"):
            fail("502 without X-Request-Id")


@nginx_test
def nginx_own_client_errors_are_json():
    good = upstream("ok")
    n = Nginx([good.addr])
    big = b"x" * (64 * 1024 + 1)
    r = n.request("POST", "/admin/vouchers", {"Content-Type": "application/json"}, big)
    expect_json_error(r, 413, "body_too_large")
    r = ss.raw_request(n.port, b"GET / HTTP/1.1\r\nHost: x\r\nBroken header line\r\n\r\n")
    expect_json_error(r, 400, "bad_request")
    r = ss.raw_request(n.port, b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    if r.status not in (400, 414):
        fail(f"long URI: {r.status}")
    expect_json_error(r, r.status, "bad_request")
    r = n.request("GET", "/.nginx-error/502")
    expect_json_error(r, 404, "not_found")
    if good.requests:
        fail(f"requests nginx refused reached the instance: {good.requests}")


@nginx_test
def nginx_own_405_names_the_routes_methods():
    """nginx answers TRACE (and CONNECT) itself with 405: with the Allow
    header of the route, as an instance's 405 has, or 404 not_found where
    no route is (an instance looks for the route first)."""
    good = upstream("ok")
    n = Nginx([good.addr])
    for path, allow in (("/health", "GET, HEAD"), ("/stats?x=1", "GET, HEAD"),
                        ("/voucher/7", "GET, HEAD"), ("/voucher/", "GET, HEAD"),
                        ("/voucher/7/seckill", "POST"),
                        ("/admin/vouchers", "POST"), ("/admin/vouchers/7/reset", "POST")):
        r = n.request("TRACE", path)
        expect_json_error(r, 405, "method_not_allowed")
        if r.headers.get("allow") != allow:
            fail(f"TRACE {path}: Allow {r.headers.get('allow')!r}, want {allow!r}")
    for path in ("/nope", "/voucher/7/seckill/more"):
        expect_json_error(n.request("TRACE", path), 404, "not_found")
    if good.requests:
        fail(f"requests nginx refused reached the instance: {good.requests}")


def request_from(source, port, method, path, headers=None, body=None, timeout=15):
    """One request from the loopback address 'source' (Linux routes all of
    127.0.0.0/8 to lo, so 127.0.0.2 reaches a server on 127.0.0.1)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout,
                                      source_address=(source, 0))
    try:
        headers = dict(headers or {})
        data = ss._encode_body(body, headers)
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return ss._make_response(resp.status, resp.getheaders(), resp.read())
    finally:
        conn.close()


OPS_PATHS = [("GET", "/stats"), ("GET", "/metrics"), ("POST", "/admin/vouchers"),
             ("POST", "/admin/vouchers/1/reset"), ("GET", "/stats?voucher=1"),
             ("GET", "/%61dmin/vouchers"), ("GET", "//stats"), ("GET", "/metrics/"),
             ("GET", "/./admin/vouchers"), ("DELETE", "/admin/vouchers/1"), ("GET", "/stats/edge")]
PUBLIC_PATHS = [("GET", "/health"), ("GET", "/ready"), ("GET", "/voucher/1"),
                ("POST", "/voucher/1/seckill")]


@nginx_test
def ops_paths_answer_the_allow_list_only():
    app = upstream("ok")
    n = Nginx([app.addr], ["--allow", "127.0.0.1"])
    for method, path in OPS_PATHS:
        before = len(app.requests)
        r = request_from("127.0.0.2", n.port, method, path,
                         {"X-Forwarded-For": "127.0.0.1", "X-Real-IP": "127.0.0.1",
                          "Authorization": "Bearer x"}, b"{}" if method == "POST" else None)
        try:
            expect_json_error(r, 403, "forbidden")
        except AssertionError as e:
            fail(f"{method} {path} from 127.0.0.2: {e}")
        if not r.headers.get("x-request-id"):
            fail(f"{method} {path}: 403 without X-Request-Id")
        if len(app.requests) != before:
            fail(f"{method} {path} from 127.0.0.2 reached the instance: {app.requests[before:]}")
    for method, path in PUBLIC_PATHS:
        r = request_from("127.0.0.2", n.port, method, path, {"X-User-Id": "1"})
        if r.status != 200 or r.body.get("ok") is not True:
            fail(f"{method} {path} from 127.0.0.2: {r.status} {r.raw[:200]!r}")
    r = request_from("127.0.0.2", n.port, "GET", "/dashboard/")
    if r.status != 200 or "<html" not in str(r.body).lower():
        fail(f"the dashboard page from 127.0.0.2: {r.status} {r.raw[:200]!r}")
    # From the allowed address everything goes through, the dashboard's
    # /stats polling included.
    for method, path in OPS_PATHS[:5] + PUBLIC_PATHS:
        r = request_from("127.0.0.1", n.port, method, path, {"X-User-Id": "1"},
                         b"{}" if method == "POST" else None)
        if r.status != 200 or r.body.get("ok") is not True:
            fail(f"{method} {path} from 127.0.0.1: {r.status} {r.raw[:200]!r}")
    r = request_from("127.0.0.1", n.port, "GET", "/dashboard/")
    if r.status != 200:
        fail(f"the dashboard page from 127.0.0.1: {r.status}")


@nginx_test
def allow_list_defaults_to_loopback_and_takes_cidrs():
    app = upstream("ok")
    # Default: all of 127.0.0.0/8 and ::1.
    n = Nginx([app.addr])
    geo = re.search(r"geo \$seckill_ops_client \{(.*?)\}", open(os.path.join(n.dir, "nginx.conf")).read(),
                    re.S).group(1)
    entries = [l.strip() for l in geo.strip().splitlines()]
    if entries != ["default 0;", "127.0.0.0/8 1;", "::1 1;"]:
        fail(f"default allow-list: {entries}")
    r = request_from("127.0.0.2", n.port, "GET", "/stats")
    if r.status != 200:
        fail(f"127.0.0.2 is loopback and allowed by default: {r.status} {r.raw[:200]!r}")
    n.stop()
    # A CIDR that leaves 127.0.0.2 out; NGINX_ALLOW is the default of --allow.
    env = dict(os.environ, NGINX_ALLOW="127.0.0.0/31 10.0.0.0/8")
    d = os.path.join(ss.TEST_TMP, f"nginx-allow-env-{os.getpid()}")
    p = subprocess.run([ss.GEN_CONF, "--prefix", d, "--upstream", app.addr], env=env,
                       capture_output=True, text=True, timeout=30)
    if p.returncode != 0 or "127.0.0.0/31 1;" not in p.stdout or "10.0.0.0/8 1;" not in p.stdout:
        fail(f"NGINX_ALLOW was not used: {p.stderr}")
    n = Nginx([app.addr], ["--allow", "127.0.0.0/31"])
    if request_from("127.0.0.1", n.port, "GET", "/metrics").status != 200:
        fail("127.0.0.1 is in 127.0.0.0/31")
    expect_json_error(request_from("127.0.0.2", n.port, "GET", "/metrics"), 403, "forbidden")
    for bad in ("", "localhost", "10.0.0.0/8 300.1", "1.2.3.4; deny", "1.2.3.4/8;"):
        p = subprocess.run([ss.GEN_CONF, "--prefix", d, "--upstream", app.addr, "--allow", bad],
                           capture_output=True, text=True, timeout=30)
        if p.returncode == 0:
            fail(f"gen-conf.sh accepted --allow {bad!r}")


@nginx_test
def instance_error_answers_pass_through():
    app = upstream("status:503")
    n = Nginx([app.addr])
    r = n.request("POST", "/voucher/1/seckill", {"X-User-Id": "1"})
    if r.status != 503 or r.body != {"error": "unavailable", "message": "from the instance"}:
        fail(f"the instance's 503 was altered: {r.status} {r.raw!r}")
    if r.headers.get("retry-after") != "7":
        fail(f"the instance's Retry-After was altered: {r.headers}")
    if len(app.requests) != 1:
        fail(f"a POST answered 503 was sent {len(app.requests)} times")


@nginx_test
def request_id_passed_or_made_up():
    app = upstream("ok")
    n = Nginx([app.addr])
    r = n.request("GET", "/x", {"X-Request-Id": "abc-123"})
    if r.body.get("rid") != "abc-123" or r.headers.get("x-request-id") != "abc-123":
        fail(f"client's X-Request-Id not passed: {r.body} {r.headers}")
    r = n.request("GET", "/x")
    rid = r.headers.get("x-request-id", "")
    if not re.fullmatch(r"[0-9a-f]{32}", rid) or r.body.get("rid") != rid:
        fail(f"made-up X-Request-Id: header {rid!r}, upstream saw {r.body.get('rid')!r}")
    if f"rid={rid}" not in n.access_log(f"rid={rid}"):
        fail("access log lacks the request id")


@nginx_test
def keepalive_to_upstream():
    app = upstream("ok")
    n = Nginx([app.addr])
    c = ss.Client(n.port)
    try:
        for _ in range(20):
            r = c.request("POST", "/voucher/1/seckill", {"X-User-Id": "1"})
            if r.status != 200:
                fail(f"{r.status}")
    finally:
        c.close()
    if app.connections > 2:
        fail(f"20 requests on one client connection used {app.connections} upstream connections")
    for _m, _p, h, _c in app.requests:
        if h.get("connection", "").lower() == "close":
            fail("nginx asked the upstream to close the connection")
    log = n.access_log(r"(POST /voucher/1/seckill.*\n){20}")
    line = [l for l in log.splitlines() if "POST /voucher/1/seckill" in l][-1]
    if not re.search(rf"up={re.escape(app.addr)} us=200 rt=[\d.]+ urt=[\d.]+", line):
        fail(f"access log line lacks upstream address/status/times: {line}")


# ---------------------------------------------------------------- upstream200
# make bench's yardstick (loadtest/upstream200.c): a separate upstream that
# does no work. Its figure is only worth something if it frames HTTP the way
# nginx expects and keeps its connections.

UPSTREAM200 = os.path.join(os.path.dirname(ss.SECKILL_BIN), "upstream200")


class Upstream200:
    def __init__(self, threads=2):
        self.port = ss.free_port()
        self.proc = subprocess.Popen([UPSTREAM200, str(self.port), str(threads)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        ss.register_pid(self.proc.pid)
        self.addr = f"127.0.0.1:{self.port}"
        _upstreams.append(self)
        deadline = time.monotonic() + 5
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                # stderr is read only once it has exited (teardown stops it
                # otherwise): a read of a live process's pipe would hang.
                if self.proc.poll() is not None:
                    fail(f"upstream200 exited: {self.proc.stderr.read()!r}")
                if time.monotonic() > deadline:
                    fail(f"upstream200 did not listen on {self.port} within 5 s")
                time.sleep(0.05)

    def accepted(self, timeout=10):
        """The connections it has accepted so far: its own count (SIGUSR1
        makes it write "accepted N")."""
        self.proc.send_signal(signal.SIGUSR1)
        fd, line = self.proc.stdout.fileno(), b""
        deadline = time.monotonic() + timeout
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                fail(f"upstream200 did not report its count within {timeout} s: {line!r}")
            chunk = os.read(fd, 64)
            if not chunk:
                fail(f"upstream200 closed its stdout: {line!r}")
            line += chunk
        m = re.fullmatch(rb"accepted (\d+)\n", line)
        if not m:
            fail(f"upstream200's count: {line!r}")
        return int(m.group(1))

    def close(self):
        """Stops it; fails if it wrote anything (a sanitizer's report)."""
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(10)
        self.proc.stdout.close()
        err = self.proc.stderr.read()
        self.proc.stderr.close()
        ss.unregister_pid(self.proc.pid)
        if err:
            fail(f"upstream200 wrote: {err[-600:]!r}")


def read_answers(sock, n, timeout=5):
    """n whole answers from sock, each checked: 200 and a Content-Length that
    is the body's length exactly (what nginx needs to keep the connection)."""
    buf, answers = b"", []
    sock.settimeout(timeout)
    while len(answers) < n:
        parsed = ss._parse_raw(buf)
        if parsed and parsed[3]:
            status, items, body, _ = parsed
            head_len = buf.index(b"\r\n\r\n") + 4
            buf = buf[head_len + len(body):]
            answers.append((status, dict((k.lower(), v) for k, v in items), body))
            continue
        chunk = sock.recv(65536)
        if not chunk:
            fail(f"closed after {len(answers)} of {n} answers; unread {buf[:120]!r}")
        buf += chunk
    if buf:
        fail(f"more bytes than {n} answers: {buf[:120]!r}")
    for status, headers, body in answers:
        if status != 200 or int(headers["content-length"]) != len(body):
            fail(f"answer {status} {headers} {body!r}")
    return answers


@nginx_test
def upstream200_answers_pipelined_requests_and_keeps_the_connection():
    u = Upstream200()
    with socket.create_connection(("127.0.0.1", u.port), timeout=5) as s:
        # A body holding a blank line must be skipped, not taken for a request.
        s.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"
                  b"POST /x HTTP/1.1\r\nContent-Length: 11\r\n\r\nab\r\n\r\nGET /"
                  b"POST /y HTTP/1.1\r\ncontent-length:0\r\n\r\n")
        read_answers(s, 3)
        # The same connection, a request split across two writes.
        s.sendall(b"POST /z HTTP/1.1\r\nContent-Le")
        time.sleep(0.05)
        s.sendall(b"ngth: 3\r\n\r\nxyz")
        read_answers(s, 1)


@nginx_test
def upstream200_closes_what_it_cannot_frame():
    u = Upstream200()
    for what, data in (("chunked", b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n"),
                       ("9 KiB of headers", b"GET / HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n"),
                       ("a bad Content-Length", b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n")):
        if ss.raw_request(u.port, data) is not None:
            fail(f"{what}: answered instead of closing")
    # and it still serves
    with socket.create_connection(("127.0.0.1", u.port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.1\r\n\r\n")
        read_answers(s, 1)


@nginx_test
def upstream200_behind_nginx_keeps_its_upstream_connections():
    """50 requests in turn on one client connection: one nginx worker serves
    them all and takes its keep-alive connection to upstream200 from its
    cache for each. Counted where they arrive: upstream200's own count of
    the connections it accepted (not the machine's sockets toward its port,
    which other programs' connections can share). One when nginx keeps the
    connection; 50 when either side closes it after each answer."""
    u = Upstream200(threads=1)
    n = Nginx([u.addr])
    before = u.accepted()               # the readiness probe's connection
    c = ss.Client(n.port)
    try:
        for _ in range(50):
            r = c.request("POST", "/voucher/1/seckill", {"X-User-Id": "1"})
            if r.status != 200 or r.body.get("error") != "sold_out":
                fail(f"{r.status} {r.raw[:200]!r}")
    finally:
        c.close()
    err = open(os.path.join(n.dir, "error.log")).read()
    if "upstream" in err:
        fail(f"nginx complained about upstream200: {err[-400:]}")
    used = u.accepted() - before
    print(f"  50 requests on one client connection: {used} connection(s) to upstream200",
          flush=True)
    # 1 expected; a few more allowed (an idle connection nginx closed after
    # its keepalive_timeout on a stalled machine), far fewer than 50.
    if not 1 <= used <= 5:
        fail(f"50 requests used {used} connections to upstream200 (want 1, at most 5)")

if __name__ == "__main__":
    ss.main(teardown)
