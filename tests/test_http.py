#!/usr/bin/env python3
"""Black-box HTTP tests of the seckill server against its API contract (README.md).

Needs the environment of tests/run.sh (a throwaway Postgres and Redis, PG_DSN,
REDIS_URL, SECKILL_BIN, TEST_TMP). Run one test: TEST_ONLY=name tests/run.sh http
"""

import calendar
import itertools
import os
import re
import socket
import sys
import threading
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seckill_server as ss  # noqa: E402
from seckill_server import fail, psql, psql_value, redis, test  # noqa: E402

TOKEN = "test-admin-token-1234"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
EPOCH = 1640995200
INT64_MAX = 9223372036854775807
NOW = lambda: int(time.time())  # noqa: E731

# ---------------------------------------------------------------- fixtures

_servers = {}


def shared_server(name):
    """A long-lived instance (admin enabled), started on first use. If it
    died since, the calling test fails with its log; the next call restarts it."""
    srv = _servers.get(name)
    if srv is not None and not srv.alive():
        del _servers[name]
        rc = srv.proc.returncode if srv.proc is not None else srv.returncode
        fail(f"server {name} died (exit status {rc}); log {srv.log_path}:\n{srv.log_tail()}")
    if srv is None:
        srv = _servers[name] = ss.Server(name, {"ADMIN_TOKEN": TOKEN})
    return srv


def server_a():
    """The main instance."""
    return shared_server("http-a")


def server_b():
    """A second instance on the same Postgres and Redis."""
    return shared_server("http-b")


def teardown():
    for key in list(_servers):
        srv = _servers.pop(key)
        if srv.alive():
            srv.stop_ok()


_user_ids = itertools.count(1_000_000 + (os.getpid() % 1000) * 100_000)
_user_lock = threading.Lock()


def new_users(n):
    with _user_lock:
        return [next(_user_ids) for _ in range(n)]


def iso(ts):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def parse_iso(s):
    m = re.fullmatch(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.\d+)?(Z|[+-]\d\d:?\d\d)?", s)
    if not m:
        fail(f"not an ISO-8601 date-time: {s!r}")
    y, mo, d, h, mi, sec = (int(x) for x in m.groups()[:6])
    ts = calendar.timegm((y, mo, d, h, mi, sec, 0, 0, 0))
    zone = m.group(7)
    if zone and zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        zz = zone[1:].replace(":", "")
        ts -= sign * (int(zz[:2]) * 3600 + int(zz[2:]) * 60)
    return ts


def create_voucher(srv, stock, begin=None, end=None, title="test voucher"):
    now = NOW()
    body = {"title": title, "stock": stock,
            "beginTime": iso(now - 3600 if begin is None else begin),
            "endTime": iso(now + 3600 if end is None else end)}
    r = srv.post("/admin/vouchers", AUTH, body)
    if r.status != 201 or not isinstance(r.body, dict) or "voucherId" not in r.body:
        fail(f"POST /admin/vouchers {body} -> {r.status} {r.body!r}")
    vid = r.body["voucherId"]
    if not isinstance(vid, int) or isinstance(vid, bool) or vid < 1:
        fail(f"voucherId is not a positive JSON number: {r.body!r}")
    return vid


def err_code(r):
    return r.body.get("error") if isinstance(r.body, dict) else None


def outcome(r):
    """'200', '409 sold_out', ... or the exception's name."""
    if isinstance(r, Exception):
        return f"exception {type(r).__name__}: {r}"
    code = err_code(r)
    return f"{r.status} {code}" if code and r.status != 200 else str(r.status)


def expect(r, status, code=None, what=""):
    if r.status != status or (code is not None and err_code(r) != code):
        want = f"{status} {code}" if code else str(status)
        fail(f"{what}: expected {want}, got {r.status} {r.body!r}")


def expect_error(r, status, code, what="", extra_fields=False):
    """The status and code, JSON content type and exactly {error, message}
    (extra_fields: at least those two)."""
    expect(r, status, code, what)
    ctype = r.headers.get("content-type", "")
    if not ctype.startswith("application/json"):
        fail(f"{what}: Content-Type {ctype!r} on error {status} {code}")
    if not isinstance(r.body, dict) or not {"error", "message"} <= set(r.body) or \
            (not extra_fields and set(r.body) != {"error", "message"}):
        fail(f"{what}: error body must be exactly {{error, message}}, got {r.body!r}")
    if not isinstance(r.body["message"], str) or not r.body["message"]:
        fail(f"{what}: empty or non-string message in {r.body!r}")


def sale(ports, vid, users, connections):
    """All users buy voucher vid over 'connections' concurrent keep-alive
    connections (connection i talks to ports[i % len(ports)]).
    Returns {user: Response or exception}."""
    jobs = [users[i::connections] for i in range(connections)]
    results = ss.run_concurrently(lambda i: ports[i % len(ports)], jobs,
                                  lambda c, u: c.seckill(vid, u), connections)
    return dict(results)


def stats_of(srv, vid):
    r = srv.get("/stats")
    expect(r, 200, what="GET /stats")
    for v in r.body.get("vouchers", []):
        if int(v.get("voucherId", -1)) == vid:
            return v
    fail(f"voucher {vid} missing in /stats vouchers")


def db_orders(vid):
    """{order id: user id} of voucher vid, from Postgres."""
    rows = psql(f"SELECT id, user_id FROM tb_voucher_order WHERE voucher_id = {vid}")
    return {int(i): int(u) for i, u in rows}


def db_stock(vid):
    return int(psql_value(f"SELECT stock FROM tb_voucher WHERE voucher_id = {vid}"))


def check_sale(vid, results, stock, label):
    """Exactly 'stock' winners, every loser 409 sold_out, and consistent state."""
    counts = Counter(outcome(r) for r in results.values())
    if counts.get("200", 0) != stock or counts.get("409 sold_out", 0) != len(results) - stock:
        fail(f"{label}: expected {stock} x 200 and {len(results) - stock} x 409 sold_out,"
             f" got {dict(counts)}")
    winners = {}
    for user, r in results.items():
        if r.status == 200:
            oid = r.body.get("orderId")
            if not isinstance(oid, str) or not re.fullmatch(r"[1-9][0-9]*", oid):
                fail(f"{label}: orderId is not a decimal string: {r.body!r}")
            winners[int(oid)] = user
    if len(winners) != stock:
        fail(f"{label}: {stock} orders but only {len(winners)} distinct orderIds")
    orders = db_orders(vid)
    if orders != winners:
        missing = set(winners) - set(orders)
        extra = set(orders) - set(winners)
        fail(f"{label}: tb_voucher_order differs from the 200 answers:"
             f" {len(missing)} answered ids not in the table, {len(extra)} rows never answered,"
             f" or user mismatch")
    dup = psql_value(f"SELECT count(*) FROM (SELECT user_id FROM tb_voucher_order"
                     f" WHERE voucher_id = {vid} GROUP BY user_id HAVING count(*) > 1) d")
    if int(dup) != 0:
        fail(f"{label}: {dup} users with more than one order in Postgres")
    if db_stock(vid) != 0:
        fail(f"{label}: stock in Postgres is {db_stock(vid)}, expected 0")
    return winners


def check_stats_clean(srv, vid, stock, orders, label):
    st = stats_of(srv, vid)
    want = {"initialStock": stock, "stock": stock - orders, "orders": orders,
            "oversold": 0, "duplicateUsers": 0, "stockDrift": 0}
    got = {k: st.get(k) for k in want}
    if got != want:
        fail(f"{label}: /stats for voucher {vid}: expected {want}, got {got}")


# ---------------------------------------------------------------- the sale

@test
def sale_100_stock_500_users_100_connections():
    a = server_a()
    vid = create_voucher(a, 100)
    users = new_users(500)
    results = sale([a.port], vid, users, 100)
    check_sale(vid, results, 100, "one instance")
    check_stats_clean(a, vid, 100, 100, "one instance")


@test
def sale_over_two_instances():
    a, b = server_a(), server_b()
    vid = create_voucher(a, 100)
    users = new_users(600)
    results = sale([a.port, b.port], vid, users, 120)
    check_sale(vid, results, 100, "two instances")
    check_stats_clean(a, vid, 100, 100, "two instances (stats of A)")
    check_stats_clean(b, vid, 100, 100, "two instances (stats of B)")


def one_user_many_requests(ports, n):
    a = server_a()
    vid = create_voucher(a, 10)
    user = new_users(1)[0]
    jobs = [[user] for _ in range(n)]
    results = ss.run_concurrently(lambda i: ports[i % len(ports)], jobs,
                                  lambda c, u: c.seckill(vid, u), n)
    counts = Counter(outcome(r) for _, r in results)
    if counts != Counter({"200": 1, "409 already_ordered": n - 1}):
        fail(f"{n} concurrent requests of one user: expected 1 x 200 and {n - 1} x"
             f" 409 already_ordered, got {dict(counts)}")
    orders = db_orders(vid)
    if list(orders.values()) != [user]:
        fail(f"expected exactly one order of user {user}, Postgres has {orders}")
    if db_stock(vid) != 9:
        fail(f"stock should be 9, Postgres says {db_stock(vid)}")
    check_stats_clean(a, vid, 10, 1, "one user")


@test
def one_user_200_concurrent_requests():
    one_user_many_requests([server_a().port], 200)


@test
def one_user_200_concurrent_requests_two_instances():
    one_user_many_requests([server_a().port, server_b().port], 200)


# ---------------------------------------------------------------- order ids

@test
def order_id_layout():
    a = server_a()
    vid = create_voucher(a, 5)
    ids = []
    t0 = NOW()
    for user in new_users(3):
        r = a.seckill(vid, user)
        expect(r, 200, what="seckill")
        ids.append(int(r.body["orderId"]))
    t1 = NOW()
    for oid in ids:
        if not 0 < oid < 2 ** 63:
            fail(f"order id {oid} is not a positive int64")
        secs, count = oid >> 32, oid & 0xFFFFFFFF
        if not (t0 - EPOCH - 2 <= secs <= t1 - EPOCH + 2):
            fail(f"order id {oid}: timestamp part {secs} is not now - 2022-01-01"
                 f" ({t0 - EPOCH}..{t1 - EPOCH})")
        if count < 1:
            fail(f"order id {oid}: counter part is {count}")
        key = time.strftime("icr:order:%Y:%m:%d", time.gmtime(EPOCH + secs))
        value = redis(["GET", key])
        if not value.isdigit():
            fail(f"Redis key {key} missing or not a number: {value!r}")
        if int(value) < count:
            fail(f"Redis {key} = {value} but an id with count {count} was handed out")
    if len(set(ids)) != len(ids):
        fail(f"duplicate order ids {ids}")
    if sorted(ids) != ids:
        fail(f"ids handed out one after another are not increasing: {ids}")


@test
def an_exhausted_day_counter_answers_503_never_a_wrapped_id():
    """The order id's counter is the day's (32 bits): once it is used up a
    buyer gets 503, never an id whose count wrapped; nothing is written and
    the buyer's lock is released. A server of its own, with an ID_PREFIX of
    its own, so that no other test's counter is touched."""
    a = server_a()
    vid = create_voucher(a, 5)
    prefix = f"exhausted{os.getpid()}"
    # today's key, and the next day's should the test run across midnight (UTC)
    keys = sorted({time.strftime(f"icr:{prefix}:%Y:%m:%d", time.gmtime(time.time() + d))
                   for d in (0, 600)})
    srv = ss.Server("http-ids-exhausted", {"ADMIN_TOKEN": TOKEN, "ID_PREFIX": prefix})
    try:
        for k in keys:
            redis(["SET", k, str(2 ** 32 - 1)])
        user = new_users(1)[0]
        r = srv.seckill(vid, user)
        expect_error(r, 503, "unavailable", "seckill with the day's id counter used up")
        if "order ids unavailable" not in r.body.get("message", ""):
            fail(f"503 without the reason: {r.body!r}")
        if db_orders(vid) or db_stock(vid) != 5:
            fail(f"an order was written: {db_orders(vid)}, stock {db_stock(vid)}")
        if redis(["EXISTS", f"lock:order:{user}"]) != "0":
            fail(f"lock:order:{user} is still held after the 503")
    finally:
        srv.stop_ok()
        redis(["DEL", *keys])


@test
def success_body_shape():
    a = server_a()
    vid = create_voucher(a, 3)
    user = new_users(1)[0]
    r = a.seckill(vid, user)
    expect(r, 200, what="seckill")
    if not r.headers.get("content-type", "").startswith("application/json"):
        fail(f"Content-Type {r.headers.get('content-type')!r}")
    body = r.body
    if not isinstance(body, dict) or set(body) != {"orderId", "voucherId", "userId"}:
        fail(f"body must be exactly {{orderId, voucherId, userId}}: {r.raw!r}")
    if not isinstance(body["orderId"], str) or not re.fullmatch(r"[1-9][0-9]*", body["orderId"]):
        fail(f"orderId must be a decimal string: {r.raw!r}")
    for k, want in (("voucherId", vid), ("userId", user)):
        if type(body[k]) is not int or body[k] != want:
            fail(f"{k} must be the JSON number {want}: {r.raw!r}")
    # the largest user id is valid and round-trips
    r = a.seckill(vid, INT64_MAX)
    expect(r, 200, what=f"seckill with X-User-Id {INT64_MAX}")
    if r.body.get("userId") != INT64_MAX or f'"userId":{INT64_MAX}' not in r.raw.decode().replace(" ", ""):
        fail(f"userId {INT64_MAX} did not round-trip: {r.raw!r}")
    uid = psql_value(f"SELECT user_id FROM tb_voucher_order WHERE id = {int(r.body['orderId'])}")
    if int(uid) != INT64_MAX:
        fail(f"Postgres has user_id {uid} for the order of user {INT64_MAX}")


# ---------------------------------------------------------------- voucher states

@test
def voucher_not_started_ended_sold_out_unknown():
    a = server_a()
    now = NOW()
    cases = [
        ("not started", create_voucher(a, 5, begin=now + 3600, end=now + 7200), "not_started"),
        ("ended", create_voucher(a, 5, begin=now - 7200, end=now - 3600), "ended"),
    ]
    for label, vid, code in cases:
        user = new_users(1)[0]
        expect_error(a.seckill(vid, user), 409, code, label)
        if db_orders(vid) or db_stock(vid) != 5:
            fail(f"{label}: an order was written or stock changed")
    vid = create_voucher(a, 1)
    u1, u2 = new_users(2)
    expect(a.seckill(vid, u1), 200, what="last item")
    expect_error(a.seckill(vid, u2), 409, "sold_out", "after the last item")
    expect_error(a.seckill(vid, u1), 409, None, "winner again after sold out")
    expect_error(a.seckill(987654321987, u2), 404, "voucher_not_found", "unknown voucher")
    expect_error(a.seckill(INT64_MAX, u2), 404, "voucher_not_found",
                 f"voucher {INT64_MAX} (valid id, unknown)")


@test
def get_voucher_fields():
    a = server_a()
    now = NOW()
    begin, end = now - 600, now + 86400
    vid = create_voucher(a, 7, begin=begin, end=end, title="Gift card 50% off")
    r = a.get(f"/voucher/{vid}")
    expect(r, 200, what=f"GET /voucher/{vid}")
    v = r.body
    for k in ("voucherId", "title", "stock", "initialStock", "beginTime", "endTime"):
        if k not in v:
            fail(f"GET /voucher/{vid}: field {k} missing in {v!r}")
    if (v["voucherId"], v["title"], v["stock"], v["initialStock"]) != (vid, "Gift card 50% off", 7, 7):
        fail(f"GET /voucher/{vid}: wrong values {v!r}")
    if (parse_iso(v["beginTime"]), parse_iso(v["endTime"])) != (begin, end):
        fail(f"GET /voucher/{vid}: times {v['beginTime']}, {v['endTime']} are not"
             f" {iso(begin)}, {iso(end)}")
    expect(a.seckill(vid, new_users(1)[0]), 200, what="seckill")
    r = a.get(f"/voucher/{vid}")
    if r.body.get("stock") != 6 or r.body.get("initialStock") != 7:
        fail(f"after one order GET /voucher/{vid} shows {r.body!r}, expected stock 6 of 7")
    expect_error(a.get("/voucher/987654321987"), 404, "voucher_not_found", "GET unknown voucher")


# ---------------------------------------------------------------- id validation

# Path forms are sent percent-encoded where they contain a space.
BAD_IDS = [
    ("0", "0"), ("-1", "-1"), ("+1", "+1"), (" 1", "%201"), ("1 ", "1%20"),
    ("1a", "1a"), ("abc", "abc"), ("2^63", "9223372036854775808"),
    ("20 digits", "99999999999999999999"), ("1.0", "1.0"), ("0x10", "0x10"),
    ("empty", ""),
]

# Header forms. Leading/trailing blanks are not included: HTTP strips them
# from field values (RFC 9110 5.5), so " 1" *is* "1" in a header.
BAD_USER_IDS = [
    ("0", "0"), ("-1", "-1"), ("+1", "+1"), ("1 2", "1 2"), ("1a", "1a"), ("abc", "abc"),
    ("2^63", "9223372036854775808"), ("20 digits", "99999999999999999999"),
    ("1.0", "1.0"), ("0x10", "0x10"), ("empty", ""), ("missing", None),
]


@test
def invalid_voucher_id_in_seckill_path():
    a = server_a()
    user = new_users(1)[0]
    bad = []
    for label, form in BAD_IDS:
        r = a.request("POST", f"/voucher/{form}/seckill", {"X-User-Id": str(user)})
        if r.status != 400 or err_code(r) != "invalid_voucher_id":
            bad.append(f"{label!r} -> {r.status} {r.body!r}")
        else:
            expect_error(r, 400, "invalid_voucher_id", label)
    if bad:
        fail("POST /voucher/{id}/seckill, expected 400 invalid_voucher_id: " + "; ".join(bad))


@test
def invalid_voucher_id_in_get_voucher_path():
    a = server_a()
    bad = []
    for label, form in BAD_IDS:
        if form == "":
            continue            # GET /voucher/ is another route
        r = a.get(f"/voucher/{form}")
        if r.status != 400 or err_code(r) != "invalid_voucher_id":
            bad.append(f"{label!r} -> {r.status} {r.body!r}")
    if bad:
        fail("GET /voucher/{id}, expected 400 invalid_voucher_id: " + "; ".join(bad))


@test
def invalid_user_id_header():
    a = server_a()
    vid = create_voucher(a, 5)
    bad = []
    for label, form in BAD_USER_IDS:
        headers = {} if form is None else {"X-User-Id": form}
        r = a.request("POST", f"/voucher/{vid}/seckill", headers)
        if r.status != 400 or err_code(r) != "invalid_user_id":
            bad.append(f"{label!r} -> {r.status} {r.body!r}")
        else:
            expect_error(r, 400, "invalid_user_id", label)
    if bad:
        fail("X-User-Id, expected 400 invalid_user_id: " + "; ".join(bad))
    if db_orders(vid):
        fail("an invalid user id produced an order")


@test
def user_id_header_name_case_and_whitespace():
    """Header names are case-insensitive and optional whitespace around a
    field value is not part of it (RFC 9110 5.1, 5.5): all of these are
    valid user ids."""
    a = server_a()
    vid = create_voucher(a, 10)
    u = new_users(4)
    forms = [("lower-case name", f"x-user-id: {u[0]}"), ("leading space", f"X-User-Id:   {u[1]}"),
             ("trailing space", f"X-User-Id: {u[2]}  "), ("trailing tab", f"X-User-Id: {u[3]}\t")]
    bad = []
    for (label, line), user in zip(forms, u):
        r = ss.raw_request(a.port, f"POST /voucher/{vid}/seckill HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                   f"{line}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        if r is None or r.status != 200 or r.body.get("userId") != user:
            bad.append(f"{label} ({line!r}) -> {r.status if r else 'no answer'}"
                       f" {r.body if r else ''!r}")
    if bad:
        fail("valid X-User-Id refused: " + "; ".join(bad))


# ---------------------------------------------------------------- errors, routes

@test
def error_shape_routes_and_methods():
    a = server_a()
    vid = create_voucher(a, 5)
    cases = [
        ("GET", "/nope", 404, "not_found", None),
        ("GET", f"/voucher/{vid}/seckill/extra", 404, "not_found", None),
        ("POST", "/admin/nope", 404, "not_found", None),
        ("GET", f"/voucher/{vid}/seckill", 405, "method_not_allowed", "POST"),
        ("PUT", f"/voucher/{vid}/seckill", 405, "method_not_allowed", "POST"),
        ("DELETE", "/stats", 405, "method_not_allowed", "GET"),
        ("POST", "/health", 405, "method_not_allowed", "GET"),
        ("DELETE", f"/voucher/{vid}", 405, "method_not_allowed", "GET"),
    ]
    for method, path, status, code, allow in cases:
        r = a.request(method, path, {"X-User-Id": "1"})
        what = f"{method} {path}"
        expect_error(r, status, code, what)
        if allow is not None:
            methods = [m.strip() for m in r.headers.get("allow", "").split(",")]
            if allow not in methods:
                fail(f"{what}: Allow header {r.headers.get('allow')!r} lacks {allow}")


@test
def body_too_large():
    a = server_a()
    vid = create_voucher(a, 5)
    user = new_users(1)[0]
    body = b"x" * (2 * 1024 * 1024)
    for path, extra in ((f"/voucher/{vid}/seckill", f"X-User-Id: {user}\r\n"),
                        ("/admin/vouchers", f"Authorization: Bearer {TOKEN}\r\n"
                                            "Content-Type: application/json\r\n")):
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        r = ss.raw_request(a.port, head + body, timeout=10)
        if r is None:
            fail(f"POST {path} with a 2 MiB body: connection closed without an answer")
        expect_error(r, 413, "body_too_large", f"POST {path} with a 2 MiB body")
    if db_orders(vid):
        fail("an oversized request produced an order")


@test
def health_ready_metrics():
    a = server_a()
    expect(a.get("/health"), 200, what="GET /health")
    expect(a.get("/ready"), 200, what="GET /ready (Postgres and Redis up)")
    r = a.get("/metrics")
    expect(r, 200, what="GET /metrics")
    ctype = r.headers.get("content-type", "")
    if not ctype.startswith("text/plain"):
        fail(f"/metrics Content-Type {ctype!r}, expected text/plain (Prometheus)")
    text = r.body if isinstance(r.body, str) else r.raw.decode()
    counters = re.findall(r"^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) counter$", text, re.M)
    if not counters:
        fail(f"/metrics has no '# TYPE <name> counter' line:\n{text[:500]}")
    samples = [n for n in counters
               if re.search(rf"^{re.escape(n)}(\{{.*\}})? [0-9.eE+-]+$", text, re.M)]
    if not samples:
        fail(f"/metrics declares counters {counters[:5]} but has no sample of them")
    for line in text.splitlines():
        if line and not line.startswith("#") and \
                not re.fullmatch(r'[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\])*",?)*\})? \S+( \d+)?', line):
            fail(f"/metrics line is not Prometheus text format: {line!r}")


# ---------------------------------------------------------------- admin API

@test
def admin_disabled_without_token():
    srv = ss.Server("http-noadmin", {"ADMIN_TOKEN": None})
    try:
        now = NOW()
        body = {"title": "x", "stock": 1, "beginTime": iso(now), "endTime": iso(now + 60)}
        for headers in ({}, AUTH, {"Authorization": "Bearer "}):
            expect_error(srv.post("/admin/vouchers", headers, body), 403, "admin_disabled",
                         f"create with {headers}")
            # The token is checked before anything else, the path's id too.
            for vid in ("1", "abc", "0"):
                expect_error(srv.post(f"/admin/vouchers/{vid}/reset", headers, {"stock": 1}), 403,
                             "admin_disabled", f"reset of {vid!r} with {headers}")
    finally:
        srv.stop_ok()


@test
def admin_unauthorized():
    a = server_a()
    now = NOW()
    body = {"title": "x", "stock": 1, "beginTime": iso(now), "endTime": iso(now + 60)}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                    {"Authorization": TOKEN}, {"Authorization": f"Bearer {TOKEN}x"},
                    {"Authorization": f"Bearer {TOKEN[:-1]}"}, {"Authorization": "Bearer"}):
        expect_error(a.post("/admin/vouchers", headers, body), 401, "unauthorized",
                     f"create with {headers}")
        for vid in ("1", "abc", "-1"):
            expect_error(a.post(f"/admin/vouchers/{vid}/reset", headers, {"stock": 1}), 401,
                         "unauthorized", f"reset of {vid!r} with {headers}")
    r = a.post("/admin/vouchers", {"Authorization": "Bearer wrong"}, body)
    if not r.headers.get("www-authenticate", "").startswith("Bearer"):
        fail(f"401 without WWW-Authenticate: Bearer: {r.headers}")
    # the scheme's name is case-insensitive (RFC 9110, 11.1)
    for scheme in ("bearer", "BEARER"):
        expect(a.post("/admin/vouchers", {"Authorization": f"{scheme} {TOKEN}"}, body), 201,
               what=f"create with scheme {scheme!r}")


@test
def admin_invalid_json_and_fields():
    a = server_a()
    now = NOW()
    good = {"title": "t", "stock": 10, "beginTime": iso(now), "endTime": iso(now + 60)}
    for raw in ("{", "not json", "", '{"title": "t",}', "{'title': 't'}", "{\x00}",
                '{"title": "t"} trailing'):
        expect_error(a.post("/admin/vouchers", dict(AUTH, **{"Content-Type": "application/json"}), raw),
                     400, "invalid_json", f"body {raw!r}")

    def without(k):
        return {x: y for x, y in good.items() if x != k}

    bad = [
        ("missing title", without("title")),
        ("title not a string", dict(good, title=5)),
        ("missing stock", without("stock")),
        ("negative stock", dict(good, stock=-1)),
        ("stock as string", dict(good, stock="10")),
        ("fractional stock", dict(good, stock=1.5)),
        ("stock null", dict(good, stock=None)),
        ("missing beginTime", without("beginTime")),
        ("beginTime not a date", dict(good, beginTime="yesterday")),
        ("beginTime a number", dict(good, beginTime=now)),
        ("missing endTime", without("endTime")),
        ("endTime not a date", dict(good, endTime="2024-13-45T99:00:00Z")),
        ("endTime before beginTime", dict(good, endTime=iso(now - 60))),
    ]
    before = int(psql_value("SELECT count(*) FROM tb_voucher"))
    problems = []
    for label, body in bad:
        r = a.post("/admin/vouchers", AUTH, body)
        if r.status != 400 or err_code(r) != "invalid_field":
            problems.append(f"{label} -> {r.status} {r.body!r}")
        else:
            expect_error(r, 400, "invalid_field", label)
    if problems:
        fail("POST /admin/vouchers, expected 400 invalid_field: " + "; ".join(problems))
    # valid JSON that is not an object: the contract does not say which 400 code
    for body in ([good], "42", '"text"', "null"):
        r = a.post("/admin/vouchers", AUTH, body)
        if r.status != 400 or err_code(r) not in ("invalid_field", "invalid_json"):
            fail(f"POST /admin/vouchers with body {body!r}: expected 400 invalid_field or"
                 f" invalid_json, got {r.status} {r.body!r}")
    after = int(psql_value("SELECT count(*) FROM tb_voucher"))
    if after != before:
        fail(f"rejected bodies created {after - before} vouchers")
    # the good body works, and a stock of 0 is valid (not negative)
    vid = create_voucher(a, 0)
    expect_error(a.seckill(vid, new_users(1)[0]), 409, "sold_out", "voucher created with stock 0")


@test
def admin_stock_is_stored_exactly_or_refused():
    """A stock that is a valid int64 but not exact in a double (2^53 + 1)
    must be stored as sent or refused with 400 invalid_field, never rounded."""
    a = server_a()
    now = NOW()
    big = 2 ** 53 + 1
    raw = (f'{{"title":"big","stock":{big},"beginTime":"{iso(now)}",'
           f'"endTime":"{iso(now + 60)}"}}')
    r = a.post("/admin/vouchers", dict(AUTH, **{"Content-Type": "application/json"}), raw)
    if r.status == 400 and err_code(r) == "invalid_field":
        return
    expect(r, 201, what=f"create with stock {big}")
    vid = r.body["voucherId"]
    stored = db_stock(vid)
    if stored != big:
        fail(f"stock {big} was answered 201 but stored as {stored}")


@test
def admin_stock_is_shown_exactly_or_refused():
    """Every stock the admin API accepts comes back exactly in GET
    /voucher/{id} and /stats (cJSON prints numbers with 15 significant
    digits: 2^53 - 1 came back as 9.00719925474099e+15); a larger one is
    refused with 400 invalid_field."""
    a = server_a()
    now = NOW()
    for stock in (999_999_999_999_999, 10 ** 15, 2 ** 53 - 1):
        raw = (f'{{"title":"big","stock":{stock},"beginTime":"{iso(now)}",'
               f'"endTime":"{iso(now + 60)}"}}')
        r = a.post("/admin/vouchers", dict(AUTH, **{"Content-Type": "application/json"}), raw)
        if r.status == 400 and err_code(r) == "invalid_field":
            if stock < 10 ** 15:
                fail(f"stock {stock} refused")
            continue
        expect(r, 201, what=f"create with stock {stock}")
        vid = r.body["voucherId"]
        v = a.get(f"/voucher/{vid}").body
        for field in ("stock", "initialStock"):
            if type(v.get(field)) is not int or v[field] != stock:
                fail(f"GET /voucher/{vid}: {field} {v.get(field)!r}, created with {stock}")
        mine = [x for x in a.get("/stats").body["vouchers"] if int(x["voucherId"]) == vid]
        if not mine or type(mine[0]["stock"]) is not int or mine[0]["stock"] != stock:
            fail(f"/stats: {mine[:1]}, created with {stock}")


@test
def admin_created_voucher_is_usable():
    a, b = server_a(), server_b()
    vid = create_voucher(a, 2, title="usable")
    expect(b.get(f"/voucher/{vid}"), 200, what="GET on the other instance")
    u1, u2, u3 = new_users(3)
    expect(a.seckill(vid, u1), 200, what="first buyer")
    expect(b.seckill(vid, u2), 200, what="second buyer on the other instance")
    expect_error(a.seckill(vid, u3), 409, "sold_out", "third buyer")
    if sorted(db_orders(vid).values()) != sorted([u1, u2]):
        fail(f"orders in Postgres: {db_orders(vid)}")


@test
def admin_reset_for_a_second_sale():
    a, b = server_a(), server_b()
    vid = create_voucher(a, 20)
    first = new_users(60)
    winners = check_sale(vid, sale([a.port, b.port], vid, first, 60), 20, "first sale")
    # both instances have seen the voucher sold out (any fast-path flags set)
    expect_error(a.seckill(vid, new_users(1)[0]), 409, "sold_out", "A after the first sale")
    expect_error(b.seckill(vid, new_users(1)[0]), 409, "sold_out", "B after the first sale")
    r = a.post(f"/admin/vouchers/{vid}/reset", AUTH, {"stock": 30})
    if r.status not in (200, 204):
        fail(f"reset -> {r.status} {r.body!r}")
    if db_orders(vid):
        fail(f"reset left {len(db_orders(vid))} orders in Postgres")
    for srv in (a, b):
        r = srv.get(f"/voucher/{vid}")
        if r.status != 200 or (r.body.get("stock"), r.body.get("initialStock")) != (30, 30):
            fail(f"after reset GET /voucher/{vid} on {srv.name}: {r.status} {r.body!r}")
    check_stats_clean(a, vid, 30, 0, "after reset")
    # second sale: the first sale's winners may buy again, through both instances
    second = sorted(winners.values()) + new_users(70)
    check_sale(vid, sale([b.port, a.port], vid, second, 90), 30, "second sale")
    check_stats_clean(b, vid, 30, 30, "after the second sale")


@test
def admin_reset_errors():
    a = server_a()
    vid = create_voucher(a, 3)
    expect_error(a.post("/admin/vouchers/987654321987/reset", AUTH, {"stock": 5}), 404,
                 "voucher_not_found", "reset of an unknown voucher")
    expect_error(a.post("/admin/vouchers/abc/reset", AUTH, {"stock": 5}), 400,
                 "invalid_voucher_id", "reset /admin/vouchers/abc")
    expect_error(a.post(f"/admin/vouchers/{vid}/reset", AUTH, {"stock": -1}), 400,
                 "invalid_field", "reset to a negative stock")
    expect_error(a.post(f"/admin/vouchers/{vid}/reset", AUTH, {}), 400,
                 "invalid_field", "reset without stock")
    expect_error(a.post(f"/admin/vouchers/{vid}/reset", AUTH, "{"), 400,
                 "invalid_json", "reset with a broken body")
    if db_stock(vid) != 3:
        fail(f"failed resets changed the stock to {db_stock(vid)}")


# ---------------------------------------------------------------- /stats

def instance_entry(stats, name):
    for inst in stats.get("instances", []):
        if isinstance(inst, dict) and inst.get("instance") == name:
            return inst
    return None


def counter(node, *path):
    """node[path0][path1]...; a missing counter is 0 (the server omits zeros)."""
    for k in path:
        if not isinstance(node, dict):
            fail(f"/stats: {k!r} is not under an object")
        node = node.get(k, 0)
    if type(node) is not int:
        fail(f"/stats: {'.'.join(path)} = {node!r} is not a JSON integer")
    return node


@test
def stats_shape_and_counters():
    """Voucher figures, this instance's outcome counters (requests.byStatus /
    requests.byError), every live instance (instances[], cluster) and lock
    figures (lock.acquired, lock.contended, lock.notOwnerReleases)."""
    a, b = server_a(), server_b()
    vid = create_voucher(a, 2)
    s = a.get("/stats")
    expect(s, 200, what="GET /stats")
    s = s.body
    if not isinstance(s, dict) or s.get("instance") != a.name or not isinstance(s.get("vouchers"), list):
        fail(f"/stats shape is not {{instance: {a.name!r}, vouchers: [...]}}: {str(s)[:300]}")
    entry = stats_of(a, vid)
    want = {"voucherId": vid, "initialStock": 2, "stock": 2, "orders": 0, "oversold": 0,
            "duplicateUsers": 0, "stockDrift": 0}
    got = {k: entry.get(k) for k in want}
    if got != want or any(type(v) is not int for v in got.values()):
        fail(f"/stats voucher entry: expected JSON integers {want}, got {entry!r}")
    # wait until A's view of B (published to Redis about once a second) is
    # current: B's error and 409 counters as A shows them equal B's own
    b_self = b.get("/stats").body

    def b_current(view):
        return view is not None and all(
            counter(view, "requests", *p) == counter(b_self, "requests", *p)
            for p in (("byError", "sold_out"), ("byStatus", "409")))

    deadline = time.monotonic() + 5
    while not b_current(instance_entry(s, b.name)) and time.monotonic() < deadline:
        time.sleep(0.3)
        s = a.get("/stats").body
    b_before = instance_entry(s, b.name)
    if b_before is not None and not b_current(b_before):
        fail(f"A's view of {b.name} did not catch up with B's own counters within 5 s")
    if b_before is None or instance_entry(s, a.name) is None:
        fail(f"/stats of A does not list both live instances: {[i.get('instance') for i in s.get('instances', [])]}")
    a_before = s
    # known traffic: on A 2 orders and 3 x 409 sold_out, on B 1 x 409 sold_out
    users = new_users(6)
    for u in users[:2]:
        expect(a.seckill(vid, u), 200, what="buy")
    for u in users[2:5]:
        expect(a.seckill(vid, u), 409, "sold_out", "sold out on A")
    expect(b.seckill(vid, users[5]), 409, "sold_out", "sold out on B")
    deadline = time.monotonic() + 5
    while True:
        s = a.get("/stats").body
        b_after = instance_entry(s, b.name)
        moved = b_after is not None and \
            counter(b_after, "requests", "byError", "sold_out") > counter(b_before, "requests", "byError", "sold_out")
        if moved or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    checks = [
        ("A requests.byError.sold_out", ("requests", "byError", "sold_out"), a_before, s, 3),
        ("A requests.byStatus.409", ("requests", "byStatus", "409"), a_before, s, 3),
        ("B requests.byError.sold_out (as seen by A)", ("requests", "byError", "sold_out"),
         b_before, b_after or {}, 1),
        ("B requests.byStatus.409 (as seen by A)", ("requests", "byStatus", "409"),
         b_before, b_after or {}, 1),
    ]
    for label, path, before, after, n in checks:
        d = counter(after, *path) - counter(before, *path)
        if d != n:
            fail(f"/stats {label} grew by {d}, expected {n}")
    d200 = counter(s, "requests", "byStatus", "200") - counter(a_before, "requests", "byStatus", "200")
    if d200 < 2:
        fail(f"/stats A requests.byStatus.200 grew by {d200}, expected at least the 2 orders")
    if counter(s, "cluster", "instances") < 2:
        fail(f"/stats cluster.instances = {s['cluster'].get('instances')}, expected >= 2")
    for k in ("byError", "byStatus"):
        for code, n in s["requests"][k].items():
            if counter(s, "cluster", "requests", k, code) < n:
                fail(f"/stats cluster.requests.{k}.{code} is below this instance's {n}")
    for fig in ("acquired", "contended", "notOwnerReleases", "renewals"):
        counter(s, "lock", fig)
    if counter(s, "lock", "acquired") - counter(a_before, "lock", "acquired") < 2:
        fail("/stats lock.acquired did not grow by the 2 orders")


@test
def per_user_lock_layout_and_contention():
    """A Redisson-style hash held by another owner at lock:order:{user}
    refuses the order (409 already_ordered, lock.contended + 1) and is left
    untouched; once it is gone the order passes and no lock stays behind."""
    a = server_a()
    vid = create_voucher(a, 3)
    user = new_users(1)[0]
    key = f"lock:order:{user}"
    redis(["HSET", key, "00000000-0000-4000-8000-000000000000:1", "1"])
    redis(["PEXPIRE", key, "30000"])
    before = a.get("/stats").body
    expect_error(a.seckill(vid, user), 409, "already_ordered", "user lock held by another owner")
    after = a.get("/stats").body
    if counter(after, "lock", "contended") - counter(before, "lock", "contended") != 1:
        fail("lock.contended did not grow by 1")
    if redis(["HGET", key, "00000000-0000-4000-8000-000000000000:1"]) != "1":
        fail("the foreign lock was changed")
    if db_orders(vid):
        fail("an order was written while another owner held the lock")
    redis(["DEL", key])
    expect(a.seckill(vid, user), 200, what="after the foreign lock is gone")
    if redis(["EXISTS", key]) != "0":
        fail(f"{key} still exists after the order: {redis(['HGETALL', key])!r}")


# ---------------------------------------------------------------- outages

@test
def redis_unreachable_gives_503():
    a = server_a()
    vid = create_voucher(a, 5)
    srv = ss.Server("http-noredis", {"REDIS_URL": f"redis://127.0.0.1:{ss.dead_port()}/0",
                                     "ADMIN_TOKEN": TOKEN})
    try:
        user = new_users(1)[0]
        t0 = time.monotonic()
        r = srv.seckill(vid, user)
        took = time.monotonic() - t0
        expect_error(r, 503, "unavailable", "seckill with Redis down")
        if not re.fullmatch(r"\d+", r.headers.get("retry-after", "")):
            fail(f"503 without a valid Retry-After header: {r.headers}")
        if took > 5:
            fail(f"the 503 took {took:.1f}s")
        expect_error(srv.get("/ready"), 503, "unavailable", "GET /ready with Redis down",
                     extra_fields=True)
        expect(srv.get("/health"), 200, what="GET /health with Redis down")
        if db_orders(vid) or db_stock(vid) != 5:
            fail(f"Redis down, yet Postgres changed: orders {db_orders(vid)}, stock {db_stock(vid)}")
        # The admin API's Postgres part works without Redis: a reset is done
        # (200; the other instances are not told, their cached entries
        # expire). The dead-letter replay is all Redis: 503.
        r = srv.post(f"/admin/vouchers/{vid}/reset", AUTH, {"stock": 4})
        expect(r, 200, what="reset with Redis down")
        if r.body.get("stock") != 4 or db_stock(vid) != 4:
            fail(f"reset with Redis down: {r.body!r}, stock in Postgres {db_stock(vid)}")
        expect_error(srv.post("/admin/dead-letters/replay", AUTH), 503, "unavailable",
                     "dead-letter replay with Redis down")
        if not srv.alive():
            fail("server died")
    finally:
        srv.stop_ok()


@test
def postgres_unreachable_gives_503():
    a = server_a()
    vid = create_voucher(a, 5)
    dsn = f"host=127.0.0.1 port={ss.dead_port()} dbname=seckill user=postgres connect_timeout=2"
    srv = ss.Server("http-nopg", {"PG_DSN": dsn, "ADMIN_TOKEN": TOKEN})
    try:
        user = new_users(1)[0]
        for what, r in (("seckill", srv.seckill(vid, user)),
                        ("GET /voucher of a never seen id", srv.get("/voucher/987654321988")),
                        ("GET /ready", srv.get("/ready"))):
            expect_error(r, 503, "unavailable", f"{what} with Postgres down",
                         extra_fields=what == "GET /ready")
            if not re.fullmatch(r"\d+", r.headers.get("retry-after", "")):
                fail(f"{what}: 503 without a valid Retry-After header: {r.headers}")
        expect(srv.get("/health"), 200, what="GET /health with Postgres down")
        if redis(["EXISTS", f"lock:order:{user}"]) != "0":
            fail(f"lock:order:{user} is still held after the 503")
        if not srv.alive():
            fail("server died")
    finally:
        srv.stop_ok()


@test
def redis_restart_mid_life():
    a = server_a()
    vid = create_voucher(a, 20)
    rs = ss.RedisServer().start()
    threads = 2
    srv = ss.Server("http-redis-restart", {"REDIS_URL": rs.url, "THREADS": threads})
    try:
        u = new_users(40)
        expect(srv.seckill(vid, u[0]), 200, what="order before the outage")
        t_first = time.monotonic()
        rs.kill()
        t0 = time.monotonic()
        r = srv.seckill(vid, u[1])
        took = time.monotonic() - t0
        expect_error(r, 503, "unavailable", "seckill right after Redis died")
        if "retry-after" not in r.headers:
            fail("503 without Retry-After")
        if took > 3:
            fail(f"503 took {took:.1f}s (> 3 s)")
        expect(srv.get("/health"), 200, what="/health while Redis is down")
        # a fresh Redis has no id counter: let the second change, or ids repeat
        time.sleep(max(0.0, 1.2 - (time.monotonic() - t_first)))
        rs.start()
        oks, failures, i = 0, [], 2
        deadline = time.monotonic() + 10
        while oks < 10 and time.monotonic() < deadline and i < len(u):
            r = srv.seckill(vid, u[i])
            i += 1
            if r.status == 200:
                oks += 1
            elif oks:
                fail(f"after recovering, a request failed again: {r.status} {r.body!r}")
            else:
                failures.append(f"{r.status} {err_code(r)}")
        if oks < 10:
            fail(f"no recovery after Redis came back: {oks} successes, failures {failures}")
        if len(failures) > threads:
            fail(f"{len(failures)} failures after Redis came back (more than one per worker"
                 f" thread): {failures}")
        orders = db_orders(vid)
        stock = db_stock(vid)
        if len(orders) != 20 - stock or len(orders) != 1 + oks:
            fail(f"partial orders: {len(orders)} rows, stock {stock} of 20, {1 + oks} answered 200")
        if u[1] in orders.values():
            fail("the user answered 503 has an order")
    finally:
        srv.stop_ok()
        rs.kill()


@test
def postgres_sessions_killed_mid_life():
    """Postgres drops the server's sessions (restart, failover): at most one
    503 per worker thread, then orders pass again, with nothing half-done."""
    a = server_a()
    vid = create_voucher(a, 30)
    threads = 2
    srv = ss.Server("http-pgkill", {"THREADS": threads})
    try:
        u = new_users(30)
        for user in u[:4]:          # open the sessions of both workers
            expect(srv.seckill(vid, user), 200, what="order before the sessions die")
        killed = psql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                      " WHERE application_name = 'http-pgkill'")
        if not killed:
            fail("found no Postgres session with application_name = 'http-pgkill'")
        oks, failures = 0, []
        for user in u[4:20]:
            r = srv.seckill(vid, user)
            if r.status == 200:
                oks += 1
            elif oks:
                fail(f"after recovering, a request failed again: {r.status} {r.body!r}")
            else:
                expect_error(r, 503, "unavailable", "right after the sessions died")
                failures.append(user)
        if len(failures) > threads:
            fail(f"{len(failures)} failures after the sessions died (more than one per worker)")
        orders = db_orders(vid)
        if len(orders) != 30 - db_stock(vid) or len(orders) != 4 + oks:
            fail(f"partial orders: {len(orders)} rows, stock {db_stock(vid)} of 30,"
                 f" {4 + oks} answered 200")
        if set(failures) & set(orders.values()):
            fail("a user answered 503 has an order")
        for user in failures:
            if redis(["EXISTS", f"lock:order:{user}"]) != "0":
                fail(f"lock:order:{user} still held after its 503")
    finally:
        srv.stop_ok()


# ---------------------------------------------------------------- demo mode, shutdown

@test
def demo_random_user_mode():
    a = server_a()
    vid = create_voucher(a, 5)
    srv = ss.Server("http-demo", {"DEMO_RANDOM_USER": 1})
    try:
        got = Counter()
        users = set()
        for _ in range(8):
            r = srv.post(f"/voucher/{vid}/seckill")
            got[outcome(r)] += 1
            if r.status == 200:
                users.add(r.body["userId"])
        if got != Counter({"200": 5, "409 sold_out": 3}) or len(users) != 5:
            fail(f"DEMO_RANDOM_USER=1 without X-User-Id: {dict(got)}, users {users}")
    finally:
        srv.stop_ok()


@test
def sigterm_exits_cleanly_with_open_connections():
    """Connections its clients keep open (idle, or a request half sent) hold
    the drain for SHUTDOWN_DRAIN_MS at most (tests/test_drain.py)."""
    srv = ss.Server("http-sigterm", {"SHUTDOWN_DRAIN_MS": 1000})
    expect(srv.get("/health"), 200, what="/health")
    idle = ss.Client(srv.port)
    expect(idle.request("GET", "/health"), 200, what="keep-alive /health")
    half = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
    half.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")       # an unfinished request
    try:
        rc, took = srv.stop(timeout=5)
        if rc != 0:
            fail(f"exit status {rc} after SIGTERM; log:\n{srv.log_tail()}")
        if took > 3:
            fail(f"took {took:.1f}s to exit (SHUTDOWN_DRAIN_MS 1 s)")
    finally:
        idle.close()
        half.close()


if __name__ == "__main__":
    ss.main(teardown)
