#!/usr/bin/env python3
"""loadtest/kit/, the toolkit of the tools and tests: its pure parts on
captured outputs (percentiles, ab and wrk parsing, nginx's access log, number
and table formatting), then its HTTP client against a server of its own, psql
against the run's Postgres, and the stack's environment (nothing started).
Prints "N passed, M failed".
"""

import http.server
import json
import os
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seckill_server as ss  # noqa: E402
from seckill_server import fail, test  # noqa: E402

sys.path.insert(0, os.path.join(ss.ROOT, "loadtest"))
import kit  # noqa: E402
import report  # noqa: E402
from kit import Col  # noqa: E402


def eq(got, want, what):
    if got != want:
        fail(f"{what}: got {got!r}, want {want!r}")


# ---------------------------------------------------------------- samples

# ab -l -r -s 30 -n 500 -c 50 -m POST <url>: the ladder's compare-and-swap step.
AB_OUT = """This is ApacheBench, Version 2.3 <$Revision$>
Copyright 1996 Adam Twiss, Zeus Technology Ltd, http://www.zeustech.net/
Licensed to The Apache Software Foundation, http://www.apache.org/

Benchmarking 127.0.0.1 (be patient)
Completed 100 requests
Finished 500 requests


Server Software:        nginx
Server Hostname:        127.0.0.1
Server Port:            33511

Document Path:          /voucher/1/seckill
Document Length:        Variable

Concurrency Level:      50
Time taken for tests:   0.744 seconds
Complete requests:      500
Failed requests:        0
Non-2xx responses:      467
Total transferred:      170042 bytes
HTML transferred:       46740 bytes
Requests per second:    672.16 [#/sec] (mean)
Time per request:       74.387 [ms] (mean)
Time per request:       1.488 [ms] (mean, across all concurrent requests)
Transfer rate:          223.23 [Kbytes/sec] received

Connection Times (ms)
              min  mean[+/-sd] median   max
Connect:        0    0   0.2      0       1
Processing:    29   68   8.7     66     105
Waiting:       27   68   8.7     66     105
Total:         29   68   8.7     67     105

Percentage of the requests served within a certain time (ms)
  50%     67
  66%     67
  75%     68
  80%     69
  90%     80
  95%     83
  98%     99
  99%    104
 100%    105 (longest request)
"""

# The same run's ab -g file (the first rows).
AB_TSV = """starttime\tseconds\tctime\tdtime\tttime\twait
Thu Nov 26 13:37:48 2026\t1795700268\t0\t29\t29\t27
Thu Nov 26 13:37:48 2026\t1795700268\t1\t30\t30\t30
Thu Nov 26 13:37:48 2026\t1795700268\t1\t31\t32\t31
"""

# wrk -t 1 -c 2 -d 1s --timeout 10s --latency -s loadtest/wrk_sale.lua against
# a server that answers POST with 501: stdout and WRK_SUMMARY.
WRK_OUT = """Running 1s test @ http://127.0.0.1:45645/voucher/1/seckill
  1 threads and 2 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   823.59us  252.54us   2.36ms   72.22%
    Req/Sec     2.26k    79.21     2.39k    54.55%
  Latency Distribution
     50%  792.00us
     75%    0.96ms
     90%    1.16ms
     99%    1.53ms
  2480 requests in 1.10s, 1.31MB read
  Non-2xx or 3xx responses: 2480
Requests/sec:   2254.92
Transfer/sec:      1.19MB
wrk-statuses: 501=2480
"""
WRK_SUMMARY = ('{"requests":2480,"durationUs":1099815,"bytes":1376598,"statuses":{"501":2480},'
               '"orderIds":0,"okWithoutOrderId":0,"errors":{"connect":0,"read":0,"write":0,'
               '"status":2480,"timeout":0},"latencyUs":{"p50":792,"p90":1156,"p99":1535,'
               '"max":2357,"mean":823.58504221954}}')

# nginx's access log (log_format seckill), three lines of a ladder step, one
# request retried on a second upstream, and a line of another format.
ACCESS_LOG = """127.0.0.1 [2026-11-26T13:37:48+00:00] "POST /admin/vouchers/1/reset HTTP/1.1" 200 136 rid=55e9d9468217d927329fe50816c6ba80 up=127.0.0.1:52883 us=200 rt=0.010 urt=0.009
127.0.0.1 [2026-11-26T13:37:48+00:00] "POST /voucher/1/seckill HTTP/1.0" 200 72 rid=a9f69fb42493d20fa0ec416f6764d5fb up=127.0.0.1:51393 us=200 rt=0.027 urt=0.028
127.0.0.1 [2026-11-26T13:37:48+00:00] "POST /voucher/1/seckill HTTP/1.0" 409 95 rid=42970272b90b416ca41c96e8d77c5141 up=127.0.0.1:51393 us=409 rt=0.032 urt=0.033
127.0.0.1 [2026-11-26T13:37:49+00:00] "GET /voucher/1 HTTP/1.1" 200 180 rid=5 up=127.0.0.1:51393, 127.0.0.1:52883 us=502, 200 rt=1.005 urt=1.000, 0.004
this line is not nginx's
"""


def tmp_file(name, text):
    path = os.path.join(ss.TEST_TMP, f"kit-{os.getpid()}-{name}")
    with open(path, "w") as f:
        f.write(text)
    return path


# ---------------------------------------------------------------- percentiles

@test
def percentile_is_nearest_rank():
    # The textbook example: 15 20 35 40 50.
    vals = [40, 15, 50, 35, 20]
    for q, want in ((0, 15), (5, 15), (30, 20), (40, 20), (50, 35), (100, 50)):
        eq(kit.percentile(vals, q), want, f"p{q} of {vals}")
    ten = list(range(1, 11))
    # ceil(q/100 * n)-th smallest: p50 of 1..10 is the 5th (not 6th, not 5.5).
    for q, want in ((50, 5), (90, 9), (91, 10), (99, 10), (10, 1), (11, 2)):
        eq(kit.percentile(ten, q), want, f"p{q} of 1..10")
    eq(kit.percentile([7.5], 99), 7.5, "one value")
    eq(kit.percentile([], 50), None, "no values")
    eq(kit.percentile(range(1000, 0, -1), 99), 990, "p99 of 1000 values given in reverse")
    if kit.percentile(ten, 50) not in ten:
        fail("a percentile must be one of the values")


# ---------------------------------------------------------------- ab, wrk, nginx

@test
def parse_ab_reads_abs_report():
    eq(kit.parse_ab(AB_OUT), {"requests": 500, "failed": 0, "non2xx": 467, "seconds": 0.744,
                              "rps": 672.16, "p50Ms": 67.0, "p99Ms": 104.0}, "ab figures")
    empty = kit.parse_ab("ab: invalid URL\n")
    eq((empty["requests"], empty["rps"], empty["p99Ms"]), (0, 0.0, None), "ab without a report")


@test
def ab_times_reads_the_total_column_of_ab_g():
    eq(kit.ab_times(tmp_file("ab.tsv", AB_TSV)), [29.0, 30.0, 32.0], "ab -g ttime")
    eq(kit.ab_times(os.path.join(ss.TEST_TMP, "no-such-file.tsv")), [], "missing file")


@test
def parse_wrk_reads_the_lua_summary():
    r = kit.parse_wrk(json.loads(WRK_SUMMARY))
    eq(r["requests"], 2480, "requests")
    eq(r["seconds"], 1.099815, "seconds")
    eq(r["rps"], 2480 / 1.099815, "rps: requests / seconds")
    eq((r["p50Ms"], r["p90Ms"], r["p99Ms"], r["maxMs"]), (0.792, 1.156, 1.535, 2.357), "latency ms")
    eq(r["statuses"], {"501": 2480}, "statuses")
    eq(r["socketErrors"], {"connect": 0, "read": 0, "write": 0, "timeout": 0}, "socket errors")
    eq((r["errors"], r["nonHttpErrors"], r["orderIds"], r["okWithoutOrderId"]), (0, 2480, 0, 0),
       "errors, non-2xx, ids")
    # With wrk's stdout, its own Requests/sec; from a file path the same figures.
    r2 = kit.parse_wrk(tmp_file("wrk.json", WRK_SUMMARY), WRK_OUT)
    eq(r2["rps"], 2254.92, "rps from wrk's stdout")
    eq({k: v for k, v in r2.items() if k != "rps"}, {k: v for k, v in r.items() if k != "rps"},
       "file and dict parse alike")


@test
def access_log_entries_for_one_uri_after_an_offset():
    path = tmp_file("access.log", ACCESS_LOG)
    text, entries = kit.access_log(path)
    eq(text, ACCESS_LOG, "the text")
    eq([(e.method, e.uri, e.status) for e in entries],
       [("POST", "/admin/vouchers/1/reset", "200"), ("POST", "/voucher/1/seckill", "200"),
        ("POST", "/voucher/1/seckill", "409"), ("GET", "/voucher/1", "200")], "every entry")
    retried = entries[3]
    eq((retried.upstream, retried.seconds, retried.time),
       ("127.0.0.1:52883", 1.005, "2026-11-26T13:37:49+00:00"), "a retried request: the last upstream")
    _t, sale = kit.access_log(path, 0, "/voucher/1/seckill")
    eq([e.status for e in sale], ["200", "409"], "one uri")
    offset = len("".join(ACCESS_LOG.splitlines(True)[:2]).encode())
    _t, later = kit.access_log(path, offset, "/voucher/1/seckill")
    eq([e.status for e in later], ["409"], "after an offset")


@test
def answers_nginx_gave_itself_are_named_nginx_edge():
    """$upstream_addr "-" (the sold-out edge, nginx's own 413) or the upstream
    group's name (502, no instance left to try) is nginx answering, not an
    instance: the demo's, bench's and ladder's tables say nginx-edge."""
    eq(kit.NGINX_EDGE, "nginx-edge", "the label")
    names = {"127.0.0.1:8081": "seckill-1"}
    eq([kit.answered_by(u, names) for u in ("127.0.0.1:8081", "127.0.0.1:8082", "-", "", "seckill",
                                              "unix:/run/s.sock")],
       ["seckill-1", "127.0.0.1:8082", "nginx-edge", "nginx-edge", "nginx-edge", "unix:/run/s.sock"],
       "answered_by")
    log = ACCESS_LOG + ('127.0.0.1 [2026-11-26T13:37:50+00:00] "POST /voucher/1/seckill HTTP/1.0" 409 95'
                        ' rid=e1 up=- us=- rt=0.000 urt=- edge=hit\n'
                        '127.0.0.1 [2026-11-26T13:37:50+00:00] "POST /voucher/1/seckill HTTP/1.0" 502 110'
                        ' rid=e2 up=seckill us=- rt=0.000 urt=- edge=-\n')
    _t, sale = kit.access_log(tmp_file("edge.log", log), 0, "/voucher/1/seckill")
    _s, upstreams = report.count_access(sale)
    stats = {"instances": [{"instance": "seckill-1", "port": 51393}]}
    eq(report.answered_by(upstreams, stats),
       [("seckill-1 (127.0.0.1:51393)", 2), ("nginx-edge", 2)], "report's instances")


# ---------------------------------------------------------------- formatting

@test
def number_formats():
    eq([kit.fmt_count(v) for v in (None, 0, 3846.4, 1234567, 58433.5)],
       ["-", "0", "3,846", "1,234,567", "58,434"], "fmt_count")
    eq([kit.fmt_ms(v) for v in (None, 0.27, 9.94, 10, 104.4, -12.5)],
       ["-", "0.3", "9.9", "10", "104", "-12"], "fmt_ms")


@test
def table_aligns_fits_and_keeps_notes():
    cols = [Col("#", "r"), Col("step"), Col("req/s", "r", width=6), Col("result")]
    rows = [[1, "naive stock", 651, "ok"], "  a note, printed as it is  ", [11, "batched", 4160, ""]]
    eq(kit.table(cols, rows).split("\n"),
       [" #  step          req/s  result",
        " 1  naive stock     651  ok",
        "  a note, printed as it is  ",
        "11  batched        4160"], "fitted columns (req/s: at least 6), gap 2, trailing blanks cut")
    eq(kit.table(cols, [[1, "x", 2, "y"]], header=False), "1  x       2  y", "no header: titles do not widen")


@test
def table_fixed_widths_behave_like_format_specs():
    cols = [Col("label", "l", 10, fit=False), Col("n", "r", 5, gap=1, fit=False),
            Col("vs", "l", 4, gap=2, fit=False), Col("end", gap=1)]
    rows = [["short", 12, "ab", "x"], ["a longer label", 3, "abcdef", "y"]]
    want = [f"{'label':<10} {'n':>5}  {'vs':<4} end",
            f"{'short':<10} {12:>5}  {'ab':<4} x",
            f"{'a longer label':<10} {3:>5}  {'abcdef':<4} y"]
    eq(kit.table(cols, rows).split("\n"), want, "each cell padded on its own")
    long_title = [Col("a title longer than 10", "l", 10, fit=False), Col("x", "r", 3, 1, False)]
    eq(kit.table(long_title, [["row", 1]]).split("\n"),
       [f"{'a title longer than 10':<10} {'x':>3}", f"{'row':<10} {1:>3}"], "a long title widens nothing")


# ---------------------------------------------------------------- processes

@test
def free_ports_distinct_processes_from_proc_and_stop_pid():
    ports = kit.free_ports(20)
    eq(len(set(ports)), 20, "20 distinct ports")
    st = kit.proc_status(os.getpid())
    if not st or st["VmRSS"] <= 0 or st["Threads"] < 1 or st["State"] not in ("R", "S"):
        fail(f"own /proc status: {st}")
    p = subprocess.Popen(["sleep", "30"])
    try:
        if not kit.pid_alive(p.pid):
            fail("a running child is not alive")
        p.terminate()
        p.wait(5)                   # reaped: gone
        if not kit.wait_gone(p.pid, 2):
            fail("a reaped child still counts as alive")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    eq(kit.proc_status(p.pid), None, "no such process")
    p = subprocess.Popen(["sleep", "31"], start_new_session=True)
    try:
        eq(kit.stop_pid(p.pid, cmdline_has="sleep 99"), None, "another command line: left alone")
        if p.poll() is not None:
            fail("stop_pid signalled a process whose command line did not match")
        threading.Thread(target=p.wait, daemon=True).start()      # reap it when it ends
        before = (kit.cmdline(p.pid), p.poll())
        got = kit.stop_pid(p.pid, cmdline_has="sleep 31", timeout=5)
        if got is not True:
            fail(f"stop_pid: {got}, want True; (command line, exit) before: {before!r}, "
                 f"after: {(kit.cmdline(p.pid), p.poll())!r}")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


@test
def run_sh_stops_a_registered_process_only_while_it_is_that_process():
    # tests/run.sh's stop_registered, sourced: one child registered with its
    # own start time (stopped), one whose file holds another start time, as
    # when its pid was taken over by another run's process (left alone).
    d = os.path.join(ss.TEST_TMP or "/tmp", f"pids-{os.getpid()}")
    os.makedirs(d, exist_ok=True)
    mine = subprocess.Popen(["sleep", "32"])
    other = subprocess.Popen(["sleep", "33"])
    try:
        with open(os.path.join(d, str(mine.pid)), "w") as f:
            f.write(ss.start_time(mine.pid) + "\n")
        with open(os.path.join(d, str(other.pid)), "w") as f:
            f.write(str(int(ss.start_time(other.pid)) - 1) + "\n")
        r = subprocess.run(["bash", "-c", 'source tests/run.sh && stop_registered "$1"', "-", d],
                           cwd=ss.ROOT, capture_output=True, text=True, timeout=30)
        eq(r.returncode, 0, f"stop_registered's exit status ({r.stderr.strip()})")
        try:
            mine.wait(10)
        except subprocess.TimeoutExpired:
            fail("the registered process still runs after stop_registered")
        if other.poll() is not None:
            fail(f"a process whose start time differs from the registered one was stopped "
                 f"(exit {other.returncode})")
    finally:
        for p in (mine, other):
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in os.listdir(d):
            os.unlink(os.path.join(d, f))
        os.rmdir(d)


# ---------------------------------------------------------------- HTTP

class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _answer(self, status, body, ctype="application/json"):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/text":
            self._answer(200, "plain words", "text/plain")
        else:
            self._answer(404, '{"error":"not_found"}')

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        got = json.loads(self.rfile.read(n) or b"null")
        self._answer(201, json.dumps({"path": self.path, "got": got,
                                      "auth": self.headers.get("Authorization"),
                                      "user": self.headers.get("X-User-Id")}))


@test
def http_client_json_timeouts_and_errors():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    port = srv.server_address[1]
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        r = kit.request(port, "POST", "/a", {"X-User-Id": "7"}, {"stock": 3})
        eq((r.status, r.body["path"], r.body["got"], r.body["user"]), (201, "/a", {"stock": 3}, "7"),
           "POST JSON to a port")
        eq(r.headers["content-type"], "application/json", "headers in lower case")
        r = kit.request(f"http://127.0.0.1:{port}/base", "GET", "/text")
        eq((r.status, r.body), (404, {"error": "not_found"}), "a base URL's path is a prefix")
        r = kit.request(f"http://127.0.0.1:{port}", "GET", "/text")
        eq((r.body, r.raw), ("plain words", b"plain words"), "text stays text")
        r = kit.call(port, "POST", "/v", {"a": 1}, token="t0k", want=201)
        eq(r.body["auth"], "Bearer t0k", "call() sends the token")
        try:
            kit.call(port, "GET", "/nothing", want=200)
            fail("a status other than want must raise")
        except kit.KitError as e:
            if "404" not in str(e):
                fail(f"the error names no status: {e}")
        c = kit.Client(port, timeout=5)
        for i in range(3):
            r = c.seckill(9, 100 + i)
            eq((r.status, r.body["path"], r.body["user"]), (201, "/voucher/9/seckill", str(100 + i)),
               "keep-alive seckill")
        c.close()
        body = kit.voucher_body("t", 5, ahead=120)
        eq(sorted(body), ["beginTime", "endTime", "stock", "title"], "voucher body fields")
    finally:
        srv.shutdown()
        srv.server_close()
    try:
        kit.call(ss.dead_port(), "GET", "/health", timeout=2)
        fail("a refused connection must raise KitError")
    except kit.KitError:
        pass


# ---------------------------------------------------------------- psql

@test
def psql_rows_values_and_errors():
    if not ss.PG_DSN:
        fail("no PG_DSN (run through tests/run.sh)")
    rows = kit.psql(ss.PG_DSN, "SELECT 1, 'a b';\nSELECT 2, 'c';")
    eq(rows, [["1", "a b"], ["2", "c"]], "rows of every statement, tab-separated")
    eq(kit.psql_value(ss.PG_DSN, "SELECT 40 + 2"), "42", "one value")
    for sql in ("SELECT 1, 2", "SELECT 1 UNION ALL SELECT 2", "SELECT no_such_column"):
        try:
            kit.psql_value(ss.PG_DSN, sql)
            fail(f"psql_value({sql!r}) must raise")
        except kit.KitError:
            pass
    try:
        kit.psql(ss.PG_DSN, "SELECT pg_sleep(5)", timeout=1)
        fail("a query past its timeout must raise")
    except kit.KitError as e:
        if "within 1s" not in str(e):
            fail(f"timeout error: {e}")


@test
def with_settings_and_write_atomic():
    env = {"A": "1", "B": "2"}
    eq(kit.with_settings(env, {"A": None, "C": 3}), {"B": "2", "C": "3"}, "set, unset")
    eq(env, {"A": "1", "B": "2"}, "the original stays")
    d = os.path.join(ss.TEST_TMP, f"kit-atomic-{os.getpid()}")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "f.json")
    for text in ("first\n", "second, longer\n"):
        kit.write_atomic(path, text)
        eq(open(path).read(), text, "read back")
    eq(os.listdir(d), ["f.json"], "no temporary file left")


# ---------------------------------------------------------------- the stack

@test
def stack_environment_is_scrubbed_and_on_free_ports():
    saved = dict(os.environ)
    try:
        os.environ.update({"PG_DSN": "host=elsewhere", "THREADS": "99", "NGINX_PORT": "80",
                           "KEEP_ME": "1", "DROP_ME": "1", "IO_THREADS": "3"})
        st = kit.Stack(os.path.join(ss.TEST_TMP, "kit-stack"), {"INSTANCES": 2, "LOG_LEVEL": None},
                       scrub=("DROP_ME",))
        e = st.env
        eq((e.get("PG_DSN"), e.get("THREADS"), e.get("DROP_ME")), (None, None, None), "scrubbed")
        eq((e["KEEP_ME"], e["IO_THREADS"], e["INSTANCES"]), ("1", "3", "2"), "kept and set")
        eq({e[k] for k in ("NGINX_PORT", "APP_PORT_BASE", "PG_PORT", "REDIS_PORT")}, {"auto"}, "ports")
        eq(e["RUN_DIR"], os.path.join(ss.TEST_TMP, "kit-stack"), "its own RUN_DIR")
        once = st.run_env(THREADS=8, INSTANCES=None)
        eq((once["THREADS"], "INSTANCES" in once, st.env["INSTANCES"]), ("8", False, "2"),
           "one-off settings leave the stack's alone")
        st.set({"SECKILL_STOCK": "batched"})
        eq(st.env["SECKILL_STOCK"], "batched", "set()")
        eq(st.pid("app-1"), None, "no pid file, no pid")
        eq(st.pids(), {}, "no pids")
    finally:
        os.environ.clear()
        os.environ.update(saved)


# ---------------------------------------------------------------- bench's CPU meter

# Two threads of one process send one byte back and forth over loopback TCP:
# the receiving side's softirq runs inside the sender's system call, so the
# kernel counts it in this process's time and in the machine's softirq time.
PING_PONG = r"""
import socket, sys, threading, time
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
def echo():
    c, _ = srv.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        b = c.recv(64)
        if not b:
            return
        c.sendall(b)
threading.Thread(target=echo, daemon=True).start()
s = socket.create_connection(srv.getsockname())
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
print("ready", flush=True)
sys.stdin.readline()
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    s.sendall(b"x")
    s.recv(64)
print("done", flush=True)
sys.stdin.readline()
"""


@test
def cpu_meter_counts_interrupt_work_once_and_thread_switches():
    p = subprocess.Popen([sys.executable, "-c", PING_PONG, "2"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        eq(p.stdout.readline().strip(), "ready", "the ping-pong's first line")
        meter = kit.CpuMeter({"load": [p.pid]})
        meter.start()
        p.stdin.write("go\n")
        p.stdin.flush()
        eq(p.stdout.readline().strip(), "done", "the ping-pong's second line")
        cpu = meter.stop()                     # before it ends: its time is still its own
    finally:
        p.kill()
        p.wait()
    if cpu["load"] < 0.5:
        fail(f"the ping-pong used {cpu['load']} s of CPU in 2 s: no load to measure")
    # Where the kernel counts the ping-pong's softirq in its own time too
    # (tick accounting without IRQ time accounting), most of it is found
    # there and left out of the softirq column, and 'other' (everyone not
    # measured) is not pulled below zero by it (it was, by -0.99 s in 2 s,
    # when the softirq column held all of the machine's); elsewhere nothing
    # is taken out.
    irq, outside = cpu["interruptsAll"], cpu["interrupts"]
    if not 0 <= outside <= irq:
        fail(f"interrupt time outside processes: {cpu}")
    if kit.IRQ_IN_PROCESS_TIME:
        if (irq >= 0.1 and irq - outside < 0.5 * irq) or cpu["other"] < -0.1:
            fail(f"the ping-pong's softirq, {irq} s, counted again outside it: {cpu}")
    elif outside != irq:
        fail(f"interrupt time taken out of softirq on a kernel that keeps it apart: {cpu}")
    # Each round trip blocks a thread in recv() until the other answers: a
    # sleep each, thousands in 2 s.
    sw = cpu["switches"]["load"]
    if sw["sleeps"] < 500 or sw["preempted"] < 0:
        fail(f"the ping-pong's thread switches: {sw}")


@test
def idle_sampler_charges_free_cpus_to_the_wait_that_holds():
    from kit import idle
    wal = [("active", "IO", "WALSync", 1)]
    lock = [("active", "Lock", "transactionid", 3)]
    held = [("idle in transaction", "Client", "ClientRead", 1)]
    for free, rows, redis, blocked, want, *window in (
            (0, wal, None, 0, None),                     # no CPU free: nothing charged
            (1, wal + lock, "D", 1, "walFlush"),         # the first cause that holds wins
            (1, [("active", "LWLock", "WALWrite", 2)], None, 0, "walFlush"),
            (2, [("active", "IPC", "SyncRep", 1)] + lock, None, 0, "syncRep"),
            (1, lock, "D", 1, "redisFsync"),
            (1, lock, "S", 1, "diskOther"),
            (1, lock, "S", 0, "rowLock"),
            (1, lock, "S", 0, "batchWindow", True),      # a window before a held row
            (1, held, None, 0, "rowLock"),
            (1, [("idle", "Client", "ClientRead", 9)], "S", 0, "roundTrips")):
        eq(idle.classify(free, rows, redis, blocked, bool(window)), want,
           f"classify({free}, {rows}, {redis}, {blocked}, {window})")
    if not ss.PG_DSN:
        fail("no PG_DSN (run through tests/run.sh)")
    kit.psql(ss.PG_DSN, "CREATE TABLE IF NOT EXISTS kit_idle_probe (id int PRIMARY KEY);"
                        " INSERT INTO kit_idle_probe VALUES (1) ON CONFLICT DO NOTHING")
    # A transaction that holds the row and waits for its client, and one
    # queued behind it: on this otherwise quiet machine every look at a
    # free CPU finds them.
    holder = subprocess.Popen(["psql", "-X", "-q", "-d", ss.PG_DSN], stdin=subprocess.PIPE,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    waiter = None
    try:
        holder.stdin.write("BEGIN; UPDATE kit_idle_probe SET id = 1 WHERE id = 1;\n")
        holder.stdin.flush()
        kit.wait_for(lambda: kit.psql(ss.PG_DSN, "SELECT 1 FROM pg_stat_activity"
                                                 " WHERE state = 'idle in transaction'"), 10, "the holder")
        waiter = subprocess.Popen(["psql", "-X", "-q", "-d", ss.PG_DSN, "-c",
                                   "UPDATE kit_idle_probe SET id = 1 WHERE id = 1"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        kit.wait_for(lambda: kit.psql(ss.PG_DSN, "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"),
                     10, "the waiter")
        s = kit.IdleSampler(ss.PG_DSN, interval=0.02).start()
        kit.wait_for(lambda: s.samples >= 10, 30, "10 looks at a free CPU")
        got = s.stop()
        by = got["byCause"]
        if got["samples"] < 10 or by.get("rowLock", 0) <= 0 or idle.dominant(by) != "rowLock":
            fail(f"a row held by a transaction waiting for its client: {got}")
    finally:
        holder.stdin.write("ROLLBACK;\n")
        holder.stdin.close()
        holder.wait(10)
        if waiter:
            waiter.wait(10)
    s = kit.IdleSampler(ss.PG_DSN, interval=0.02).start()
    kit.wait_for(lambda: s.samples >= 10, 30, "10 looks at a free CPU")
    got = s.stop()
    if got["byCause"].get("rowLock", 0) > 0 or got["idlePct"] < 10:
        fail(f"nothing held, a quiet machine: no row lock charged, most of it idle: {got}")


if __name__ == "__main__":
    ss.main()
