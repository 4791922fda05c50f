#!/usr/bin/env python3
"""GET /metrics in the Prometheus text format, read by a strict parser that
also holds it to Prometheus's naming conventions
(prometheus.io/docs/practices/naming, /instrumentation): no "instance" label
(the scrape adds it), no free-text label, "_total" exactly on counters, no
"_sum" outside a histogram, a bounded set of labels and of voucher series,
seckill_build_info, the standard process metrics, and histogram buckets that
reach the configured timeouts. Then the logs: the JSON access log that lets
one order be followed by its request id, and lines that stay whole (and JSON)
whatever the length of a path or a header."""

import json
import math
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seckill_server as ss  # noqa: E402
from seckill_server import fail, psql_value, test  # noqa: E402

TOKEN = "metrics-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"\s*(,|\Z)')
SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^\n]*\})?\s+(\S+)(\s+-?\d+)?\Z")


def parse_labels(text):
    labels, pos = {}, 0
    body = text[1:-1]
    while pos < len(body):
        m = LABEL.match(body, pos)
        if not m:
            fail(f"bad label syntax at {body[pos:]!r}")
        if m.group(1) in labels:
            fail(f"label {m.group(1)} repeated in {text}")
        labels[m.group(1)] = m.group(2)
        pos = m.end()
    return labels


def parse(text):
    """Text format 0.0.4, strictly: HELP and TYPE once per family, before its
    samples; samples of a family together; valid names, labels and values."""
    if not text.endswith("\n"):
        fail("exposition does not end with a newline")
    families, samples, current = {}, [], None
    for line in text.split("\n")[:-1]:
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            parts = line.split(" ", 3)
            if len(parts) < 4 or not NAME.match(parts[2]):
                fail(f"bad comment line {line!r}")
            fam = families.setdefault(parts[2], {"samples": 0})
            key = parts[1].lower()
            if key in fam:
                fail(f"{parts[1]} repeated for {parts[2]}")
            if fam["samples"]:
                fail(f"{parts[1]} of {parts[2]} after its samples")
            if key == "type" and parts[3] not in ("counter", "gauge", "histogram", "summary",
                                                   "untyped"):
                fail(f"bad type {parts[3]!r}")
            fam[key] = parts[3]
            current = parts[2]
            continue
        if line.startswith("#") or line == "":
            fail(f"unexpected line {line!r}")
        m = SAMPLE.match(line)
        if not m:
            fail(f"bad sample line {line!r}")
        name, labels, value = m.group(1), parse_labels(m.group(2) or "{}"), m.group(3)
        base = re.sub(r"_(bucket|sum|count)\Z", "", name)
        fam_name = name if name in families else base
        if fam_name not in families or fam_name != current:
            fail(f"sample {name} outside its family block (current {current})")
        fam = families[fam_name]
        if "type" not in fam or "help" not in fam:
            fail(f"{fam_name} has samples before HELP/TYPE")
        try:
            v = float(value)
        except ValueError:
            fail(f"bad value {value!r} in {line!r}")
        if fam["type"] == "counter" and (v < 0 or math.isnan(v)):
            fail(f"negative counter {line!r}")
        fam["samples"] += 1
        samples.append((name, labels, v))
    for name, fam in families.items():
        if fam["type"] == "histogram":
            check_histograms(name, [s for s in samples if s[0].startswith(name + "_")])
    return families, samples


def check_histograms(name, samples):
    series = {}
    for sname, labels, v in samples:
        key = tuple(sorted((k, x) for k, x in labels.items() if k != "le"))
        series.setdefault(key, {"buckets": [], "count": None, "sum": None})
        if sname.endswith("_bucket"):
            le = labels.get("le")
            if le is None:
                fail(f"{name} bucket without le")
            series[key]["buckets"].append((math.inf if le == "+Inf" else float(le), v))
        elif sname.endswith("_count"):
            series[key]["count"] = v
        elif sname.endswith("_sum"):
            series[key]["sum"] = v
    for key, s in series.items():
        b = s["buckets"]
        if not b or b[-1][0] != math.inf:
            fail(f"{name}{dict(key)}: no +Inf bucket")
        if [x[0] for x in b] != sorted(x[0] for x in b):
            fail(f"{name}{dict(key)}: le not increasing")
        if any(b[i][1] > b[i + 1][1] for i in range(len(b) - 1)):
            fail(f"{name}{dict(key)}: buckets not cumulative")
        if s["count"] != b[-1][1] or s["sum"] is None or s["sum"] < 0:
            fail(f"{name}{dict(key)}: _count {s['count']} != +Inf bucket {b[-1][1]} or no _sum")


# Label names a series may carry: each has a small, known set of values.
# A new label is a new dimension of every scrape: add it here knowingly.
ALLOWED_LABELS = {"route", "status", "code", "backend", "voucher", "invariant", "le",
                  "version", "revision", "instance_id", "lock_strategy", "stock_strategy",
                  # seckill_redis_master: the master's host:port (one series at a
                  # time, a new one after a failover) and whether Sentinel named it
                  "address", "sentinel"}
# Labels a target must not set itself: Prometheus attaches "instance" and
# "job" at the scrape (and renames a clash to exported_instance).
TARGET_LABELS = {"instance", "job", "exported_instance", "exported_job"}
MAX_VOUCHER_SERIES = 50


def check_conventions(families, samples):
    """Prometheus's naming conventions, for every family and sample."""
    for name, fam in families.items():
        if not re.fullmatch(r"(seckill|process)_[a-z0-9_]+", name):
            fail(f"family {name}: want snake_case with the seckill_ or process_ prefix")
        counter = fam["type"] == "counter"
        if counter != name.endswith("_total"):
            fail(f"family {name} of type {fam['type']}: '_total' is for counters, and every "
                 "counter ends with it")
        if fam["type"] in ("counter", "gauge") and re.search(r"_(sum|count|bucket)\Z", name):
            fail(f"{fam['type']} {name}: _sum, _count and _bucket belong to histograms")
    vouchers = set()
    for name, labels, _ in samples:
        bad = set(labels) & TARGET_LABELS
        if bad:
            fail(f"{name} sets {bad}: the scrape adds instance and job")
        extra = set(labels) - ALLOWED_LABELS
        if extra:
            fail(f"{name} has label(s) {extra} outside the known set {sorted(ALLOWED_LABELS)}")
        if "voucher" in labels:
            vouchers.add(labels["voucher"])
    if len(vouchers) > MAX_VOUCHER_SERIES:
        fail(f"series for {len(vouchers)} vouchers: want at most {MAX_VOUCHER_SERIES}")


def value(samples, name, **labels):
    total = 0.0
    for n, l, v in samples:
        if n == name and all(l.get(k) == x for k, x in labels.items()):
            total += v
    return total


def scrape(srv):
    r = srv.get("/metrics")
    if r.status != 200 or not r.headers.get("content-type", "").startswith("text/plain"):
        fail(f"/metrics -> {r.status} {r.headers.get('content-type')}")
    families, samples = parse(r.raw.decode())
    check_conventions(families, samples)
    return families, samples


@test
def metrics_parse_strictly_and_move_with_requests():
    srv = ss.Server("metrics", {"ADMIN_TOKEN": TOKEN})
    try:
        r = srv.post("/admin/vouchers", AUTH, ss.voucher_body('quote " and \\ backslash', 1))
        vid = r.body["voucherId"]
        fams, before = scrape(srv)
        for fam in ("seckill_http_requests_total", "seckill_http_request_duration_seconds",
                    "seckill_backend_call_duration_seconds", "seckill_backend_errors_total",
                    "seckill_lock_acquired_total", "seckill_voucher_stock",
                    "seckill_voucher_oversold", "seckill_stale_token_rejections_total",
                    "seckill_http_in_progress", "seckill_http_queued", "seckill_batches_total",
                    "seckill_batch_buyers_total"):
            if fam not in fams:
                fail(f"family {fam} missing")
        route = "/voucher/{id}/seckill"
        srv.seckill(vid, 501)                       # 200
        srv.seckill(vid, 502)                       # sold_out
        srv.get("/no/such/route")                   # 404, no route
        time.sleep(1.1)                             # the voucher gauges are cached 1 s
        _, after = scrape(srv)

        def delta(name, **labels):
            return value(after, name, **labels) - value(before, name, **labels)

        checks = {
            "200 on the seckill route": delta("seckill_http_requests_total", route=route,
                                              status="200"),
            "sold_out on the seckill route": delta("seckill_http_requests_total", route=route,
                                                   status="409", code="sold_out"),
            "404 without a route": delta("seckill_http_requests_total", route="unmatched",
                                         status="404", code="not_found"),
            "seckill latency observations": delta("seckill_http_request_duration_seconds_count",
                                                  route=route),
        }
        # The second buyer reaches the lock when the cached voucher still shows
        # the stock the first one bought (it does, unless its 1 s ran out and a
        # worker read stock 0): 2 grants, or 1.
        grants = delta("seckill_lock_acquired_total")
        if grants not in (1, 2):
            fail(f"lock grants moved by {grants}")
        want = {"200 on the seckill route": 1, "sold_out on the seckill route": 1,
                "404 without a route": 1, "seckill latency observations": 2}
        if checks != want:
            fail(f"counter deltas {checks}, expected {want}")
        if delta("seckill_backend_call_duration_seconds_count", backend="postgres") < 1 or \
                delta("seckill_backend_call_duration_seconds_count", backend="redis") < 3:
            fail("backend call counts did not move (one order = Postgres + Redis calls)")
        # Scraping is a request in progress itself; nothing else is.
        if value(after, "seckill_http_in_progress") != 1 or value(after, "seckill_http_queued") != 0:
            fail(f"in progress {value(after, 'seckill_http_in_progress')}, queued "
                 f"{value(after, 'seckill_http_queued')}: want 1 and 0 while only /metrics runs")
        gauges = {n: v for n, l, v in after if l.get("voucher") == str(vid)}
        if gauges.get("seckill_voucher_stock") != 0 or gauges.get("seckill_voucher_orders") != 1 \
                or gauges.get("seckill_voucher_oversold") != 0:
            fail(f"voucher gauges {gauges}")
    finally:
        srv.stop_ok()


def help_defaults():
    """{setting: default} from the binary's --help ("  NAME  --flag  text [default]")."""
    out = subprocess.run([ss.SECKILL_BIN, "--help"], capture_output=True, text=True).stdout
    return dict(re.findall(r"^  ([A-Z][A-Z0-9_]+) .*\[([^\]]*)\]$", out, re.M))


def seconds_of(name, value):
    v = float(value)
    return v / 1000 if name.endswith("_MS") else v


@test
def metrics_build_info_process_metrics_and_buckets_that_reach_the_timeouts():
    """seckill_build_info{version} and seckill_instance_info; process metrics
    as Prometheus's client libraries name them; every histogram has a bound at
    each configured timeout (the request deadline too, when there is one) and
    reaches 10 s, nginx's read timeout."""
    timeouts = {"REDIS_TIMEOUT_MS": "1500", "PG_STATEMENT_TIMEOUT_MS": "7000",
                "PG_CONNECT_TIMEOUT_S": "3"}
    deadlines = {k: v for k, v in help_defaults().items() if "DEADLINE" in k and v}
    t_spawn = time.time()
    srv = ss.Server("buildinfo", timeouts)
    try:
        fams, samples = scrape(srv)
    finally:
        srv.stop_ok()
    version = open(os.path.join(ss.ROOT, "VERSION")).read().strip()
    info = [(l, v) for n, l, v in samples if n == "seckill_build_info"]
    if fams.get("seckill_build_info", {}).get("type") != "gauge" or len(info) != 1 or \
            info[0][1] != 1 or info[0][0].get("version") != version or \
            not re.fullmatch(r"([0-9a-f]{7,}(-dirty)?)?", info[0][0].get("revision", "-")):
        fail(f"seckill_build_info: {info}, want one gauge of 1 with version={version!r} and "
             "the commit as revision")
    inst = [(l, v) for n, l, v in samples if n == "seckill_instance_info"]
    if len(inst) != 1 or inst[0][0].get("instance_id") != "buildinfo" or inst[0][1] != 1:
        fail(f"seckill_instance_info: {inst}")
    want = {"process_resident_memory_bytes": "gauge", "process_virtual_memory_bytes": "gauge",
            "process_cpu_seconds_total": "counter", "process_open_fds": "gauge",
            "process_max_fds": "gauge", "process_start_time_seconds": "gauge"}
    got = {n: fams.get(n, {}).get("type") for n in want}
    if got != want:
        fail(f"process metrics: {got}, want {want}")
    pv = {n: value(samples, n) for n in want}
    if not (1e6 < pv["process_resident_memory_bytes"] <= pv["process_virtual_memory_bytes"]
            and 0 < pv["process_cpu_seconds_total"] < 60
            and 5 <= pv["process_open_fds"] <= pv["process_max_fds"]
            and abs(pv["process_start_time_seconds"] - t_spawn) < 10):
        fail(f"process metric values {pv} (spawned at {t_spawn:.0f})")
    need = {seconds_of(k, v) for k, v in {**timeouts, **deadlines}.items()}
    hist = [n for n, f in fams.items() if f["type"] == "histogram"]
    if not hist:
        fail("no histogram")
    for name in hist:
        bounds = {float(l["le"]) for n, l, _ in samples
                  if n == name + "_bucket" and l["le"] != "+Inf"}
        missing = sorted(x for x in need if not any(abs(b - x) < 1e-9 for b in bounds))
        if missing or max(bounds) < 10:
            fail(f"{name}: bounds {sorted(bounds)} miss the timeouts {missing} (s) or stop "
                 "below 10 s")


@test
def voucher_series_are_bounded_to_recent_vouchers():
    """At most MAX_VOUCHER_SERIES vouchers have series, the newest first; a
    voucher that ended long ago has none. seckill_vouchers counts them all,
    seckill_vouchers_violating the broken ones among all of them."""
    srv = ss.Server("bounded", {"ADMIN_TOKEN": TOKEN})
    try:
        ids = [ss.new_voucher(srv, TOKEN, 1, f"bounded {i}") for i in range(MAX_VOUCHER_SERIES + 10)]
        now = int(time.time())
        old = {"title": "long over", "stock": 1,
               "beginTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 3 * 86400)),
               "endTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 2 * 86400))}
        r = srv.post("/admin/vouchers", AUTH, old)
        if r.status != 201:
            fail(f"create an ended voucher: {r.status} {r.body}")
        ended = r.body["voucherId"]
        fams, samples = scrape(srv)
    finally:
        srv.stop_ok()
    shown = {int(l["voucher"]) for n, l, _ in samples if n == "seckill_voucher_stock"}
    if ended in shown:
        fail(f"voucher {ended}, ended two days ago, still has series")
    if ids[-1] not in shown or len(shown) != MAX_VOUCHER_SERIES:
        fail(f"{len(shown)} vouchers shown (want {MAX_VOUCHER_SERIES}, the newest "
             f"{ids[-1]} among them): {sorted(shown)[-5:]}")
    if value(samples, "seckill_vouchers") < len(ids) + 1:
        fail(f"seckill_vouchers = {value(samples, 'seckill_vouchers')}, want >= {len(ids) + 1}")
    kinds = {l.get("invariant") for n, l, _ in samples if n == "seckill_vouchers_violating"}
    if kinds != {"oversold", "duplicate_users", "stock_drift"}:
        fail(f"seckill_vouchers_violating by invariant: {kinds}")


@test
def json_logs_follow_one_order_by_request_id():
    srv = ss.Server("jsonlog", {"ADMIN_TOKEN": TOKEN, "LOG_FORMAT": "json"})
    try:
        r = srv.post("/admin/vouchers", AUTH, ss.voucher_body("log", 3))
        vid = r.body["voucherId"]
        r = srv.post(f"/voucher/{vid}/seckill", {"X-User-Id": "8801", "X-Request-Id": "trace-42"})
        if r.status != 200 or r.headers.get("x-request-id") != "trace-42":
            fail(f"seckill -> {r.status}, X-Request-Id back {r.headers.get('x-request-id')!r}")
        order_id = r.body["orderId"]
        r2 = srv.get("/health")
        made_up = r2.headers.get("x-request-id", "")
        if not made_up:
            fail("no X-Request-Id made for a request without one")
    finally:
        srv.stop_ok()
    lines = [ln for ln in open(srv.log_path, encoding="utf-8") if ln.strip()]
    records = []
    for ln in lines:
        try:
            records.append(json.loads(ln))
        except ValueError:
            fail(f"log line is not JSON: {ln!r}")
    access = [x for x in records if x.get("msg") == "access" and x.get("requestId") == "trace-42"]
    if len(access) != 1:
        fail(f"expected one access line for trace-42, got {access}")
    a = access[0]
    if (a.get("status"), a.get("orderId"), a.get("userId"), a.get("voucherId")) != \
            (200, order_id, 8801, vid):
        fail(f"access line {a}")
    if psql_value(f"SELECT count(*) FROM tb_voucher_order WHERE id = {order_id}") != "1":
        fail("the order of the access line is not in the database")
    if not any(x.get("requestId") == made_up for x in records):
        fail("the made-up request id is not in the log")


LONG_PATH_BYTES = 3000


def long_requests(srv):
    """Requests whose path or header values are far longer than a log line:
    a 3,000-byte path of quotes, backslashes and two-byte UTF-8 characters
    (raw bytes, so any cut could fall inside one), and 3,000-byte X-Request-Id,
    X-User-Id and User-Agent values. Returns the request id sent with the
    long path, to find its access line."""
    rid = "long-path-1"
    path = ('/"\\' + "é" * LONG_PATH_BYTES)[:LONG_PATH_BYTES]
    raw = (f"GET {path} HTTP/1.1\r\nHost: x\r\nX-Request-Id: {rid}\r\n"
           f"Connection: close\r\n\r\n").encode("utf-8")
    r = ss.raw_request(srv.port, raw)
    if r is None or r.status != 404:
        fail(f"long path: {r and r.status}")
    r = srv.get("/" + "a" * LONG_PATH_BYTES, {"X-Request-Id": "r" * LONG_PATH_BYTES,
                                             "User-Agent": "u\"\\" * 1000})
    if r.status != 404:
        fail(f"long path with long headers: {r.status}")
    r = srv.post("/voucher/1/seckill", {"X-User-Id": "9" * LONG_PATH_BYTES,
                                        "X-Request-Id": "long-user-1"})
    if r.status != 400:
        fail(f"3,000-digit X-User-Id: {r.status}")
    return rid


def log_lines(srv):
    with open(srv.log_path, "rb") as f:
        data = f.read()
    if not data.endswith(b"\n"):
        fail("the log does not end with a newline")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        fail(f"the log is not UTF-8: {e}")
    return text.split("\n")[:-1]


@test
def json_log_lines_stay_json_with_long_paths_and_headers():
    """LOG_FORMAT=json: every line is one JSON object, however long the path
    or the header values; a long field is cut (and says so), not the line."""
    srv = ss.Server("longjson", {"LOG_FORMAT": "json"})
    try:
        rid = long_requests(srv)
    finally:
        srv.stop_ok()
    records = []
    for ln in log_lines(srv):
        try:
            records.append(json.loads(ln))
        except ValueError:
            fail(f"log line of {len(ln)} characters is not JSON: {ln[:120]!r}...{ln[-60:]!r}")
    by_rid = {x.get("requestId"): x for x in records if x.get("msg") == "access"}
    a = by_rid.get(rid)
    if a is None:
        fail(f"no access line for {rid}")
    p = a.get("path", "")
    if a.get("status") != 404 or not p.startswith('/"\\éé') or len(p.encode()) >= LONG_PATH_BYTES \
            or not p.endswith("…"):
        fail(f"access line of the long path: status {a.get('status')}, path of "
             f"{len(p.encode())} bytes {p[:12]!r}...{p[-12:]!r} (want it cut, marked with …)")
    u = by_rid.get("long-user-1")
    if u is None or u.get("status") != 400 or u.get("error") != "invalid_user_id":
        fail(f"access line of the long X-User-Id: {u}")
    made_up = [x for x in records if x.get("msg") == "access" and x.get("status") == 404
               and x.get("path", "").startswith("/aaa")]
    if len(made_up) != 1 or not made_up[0].get("requestId", "").startswith("longjson-"):
        fail(f"the 3,000-byte X-Request-Id was not replaced by a made-up one: {made_up}")


@test
def text_log_lines_keep_every_field_with_long_paths_and_headers():
    """LOG_FORMAT=text: the long path is cut, and the fields after it (status,
    latency, instance, request id) are still on its line."""
    srv = ss.Server("longtext", {"LOG_FORMAT": "text"})
    try:
        rid = long_requests(srv)
    finally:
        srv.stop_ok()
    lines = log_lines(srv)
    stamp = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (error|warn |info |debug) ")
    for ln in lines:
        if not stamp.match(ln):
            fail(f"log line without its timestamp and level: {ln[:120]!r}")
    access = [ln for ln in lines if f" rid={rid}" in ln]
    if len(access) != 1:
        fail(f"want one access line ending in rid={rid}, got {len(access)}")
    m = re.search(r' access GET (/\S*) 404 [\d.]+ms longtext rid=' + re.escape(rid) +
                  r' not_found\Z',
                  access[0])
    if not m or not m.group(1).endswith("…") or len(m.group(1).encode()) >= LONG_PATH_BYTES:
        fail(f"access line of the long path: {access[0][:80]!r}...{access[0][-80:]!r}")
    if not any(" 400 " in ln and "invalid_user_id" in ln and "rid=long-user-1" in ln
               for ln in lines):
        fail("no whole access line for the 3,000-digit X-User-Id")


if __name__ == "__main__":
    ss.main()
