#!/usr/bin/env python3
"""The dashboard (dashboard/), seen in a real browser during a real sale.

Starts the local stack (scripts/stack.sh: Postgres, Redis, two instances,
nginx; RUN_DIR=$TEST_TMP/dashboard-stack, free ports), opens /dashboard/
through nginx in headless Chromium (Debian's /usr/bin/chromium driven by
playwright-core from npm: tests/dashboard/run.mjs; 'npm ci' runs here when
tests/dashboard/node_modules is missing), creates a voucher, sells its 50
units to 300 buyers on 30 connections, and reads the page's DOM: the stock
reaches 0, orders equal the stock, oversold / duplicate users / drift show 0
in green, the rejections show sold_out (those nginx gave by itself, the
sold-out edge's, included: GET /stats/edge), both instances served. Then it uses the
page's buy form and checks the answer it shows, saves a screenshot
($BUILD/dashboard/dashboard.png; the failing page as dashboard-failed.png),
and checks that the page made no request beyond the stack (no CDN: the
browser blocks and reports anything else) and logged no error.
Prints "N passed, M failed".

Environment: CHROMIUM (default /usr/bin/chromium), SECKILL_BIN, LUA_DIR,
TEST_TMP (set by tests/run.sh).
"""

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seckill_server as ss  # noqa: E402
from seckill_server import fail, test  # noqa: E402

ROOT = ss.ROOT
DASHBOARD = os.path.join(ROOT, "dashboard")
DRIVER_DIR = os.path.join(ROOT, "tests", "dashboard")
RUN_DIR = os.path.join(ss.TEST_TMP, "dashboard-stack")
PROFILE = os.path.join(ss.TEST_TMP, "dashboard-chromium-profile")
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
SHOT_DIR = os.path.join(os.path.dirname(os.path.abspath(ss.SECKILL_BIN)), "dashboard")
SHOT = os.path.join(SHOT_DIR, "dashboard.png")
SHOT_FAILED = os.path.join(SHOT_DIR, "dashboard-failed.png")

STOCK = 50
BUYERS = 300
CONNECTIONS = 30
PAGE_WAIT = 15.0          # seconds the page may take to show a state

S = {}                    # state shared by the tests, in order


# ---------------------------------------------------------------- the stack

def stack(cmd, timeout=90):
    return ss.run_stack(cmd, RUN_DIR, timeout, INSTANCES=2, THREADS=4, LOG_LEVEL="warn")


def new_voucher(title, stock):
    return str(ss.new_voucher(S["port"], S["token"], stock, title))


# ---------------------------------------------------------------- the browser

class Browser:
    """tests/dashboard/run.mjs: one JSON command a line in, one answer a line out."""

    def __init__(self, base):
        shutil.rmtree(PROFILE, ignore_errors=True)
        self.log_path = os.path.join(ss.TEST_TMP, "dashboard-driver.log")
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            ["node", os.path.join(DRIVER_DIR, "run.mjs"), "--base", base, "--profile", PROFILE,
             "--max-seconds", "150"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, cwd=DRIVER_DIR,
            env=dict(os.environ, CHROMIUM=CHROMIUM), start_new_session=True)
        ss._track(self.proc)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.last = None
        hello = self._next(40, "start Chromium")
        if not hello.get("ready"):
            fail(f"the browser driver did not start: {hello}\n{ss.tail(self.log_path)}")

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _next(self, timeout, what):
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            fail(f"the browser driver gave no answer to {what} within {timeout}s;"
                 f" log {self.log_path}:\n{ss.tail(self.log_path)}")
        if line is None:
            fail(f"the browser driver exited ({self.proc.poll()}) during {what};"
                 f" log {self.log_path}:\n{ss.tail(self.log_path)}")
        try:
            out = json.loads(line)
        except ValueError:
            fail(f"the browser driver wrote {line[:300]!r}")
        self.last = out
        return out

    def cmd(self, timeout=30, **msg):
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()
        out = self._next(timeout, msg.get("cmd"))
        if not out.get("ok"):
            fail(f"browser {msg.get('cmd')}: {out.get('error')}{page_problems(out)}")
        return out

    def snapshot(self):
        return self.cmd(cmd="snapshot")["snapshot"]

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b'{"cmd":"close"}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=15)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)       # node and the Chromium it started
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        ss._untrack(self.proc)
        self.log.close()
        kill_leftover_chromium()


def kill_leftover_chromium():
    """Chromium processes of our own profile directory still alive: killed by PID."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if f"--user-data-dir={PROFILE}" in cmd:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass


def page_problems(out):
    probs = (out or {}).get("problems") or []
    return ("\n  page problems:\n    " + "\n    ".join(probs)) if probs else ""


def page_text(snap, limit=2500):
    t = (snap or {}).get("text") or ""
    t = re.sub(r"\n\s*\n+", "\n", t)
    return "\n  page text:\n    " + (t[:limit] + (" …" if len(t) > limit else "")).replace("\n", "\n    ")


def wait_page(what, pred, timeout=PAGE_WAIT):
    """Polls the page until pred(snapshot) holds; fails with what the page shows."""
    deadline = time.monotonic() + timeout
    snap = None
    while True:
        snap = S["browser"].snapshot()
        try:
            if pred(snap):
                return snap
        except (KeyError, TypeError, ValueError):
            pass
        if time.monotonic() > deadline:
            try:
                S["browser"].cmd(cmd="screenshot", path=SHOT_FAILED)
                where = f"\n  screenshot: {SHOT_FAILED}"
            except AssertionError:
                where = ""
            fail(f"the page did not show {what} within {timeout:.0f}s"
                 f"\n  voucher rows: {json.dumps(snap.get('vouchers'))}"
                 f"\n  tiles: {json.dumps(snap.get('tiles'))}"
                 f"\n  outcomes: {json.dumps(snap.get('outcomes'))}"
                 f"\n  instances: {json.dumps(snap.get('instances'))}"
                 f"\n  connection: {json.dumps(snap.get('conn'))}{where}"
                 f"{page_problems(S['browser'].last)}{page_text(snap)}")
        time.sleep(0.25)


# ---------------------------------------------------------------- tests

@test
def node_chromium_and_playwright_core_are_there():
    missing = [c for c in ("node", "npm") if shutil.which(c) is None]
    if missing:
        fail(f"{' and '.join(missing)} not found: run 'make deps'")
    if not os.access(CHROMIUM, os.X_OK):
        fail(f"{CHROMIUM} not found: run 'make deps' (Debian package chromium)")
    mod = os.path.join(DRIVER_DIR, "node_modules", "playwright-core", "package.json")
    lock = os.path.join(DRIVER_DIR, "package-lock.json")
    stamp = os.path.join(DRIVER_DIR, "node_modules", ".package-lock.json")
    if not os.path.exists(mod) or not os.path.exists(stamp) or os.path.getmtime(stamp) < os.path.getmtime(lock):
        t0 = time.monotonic()
        p = subprocess.run(["npm", "ci", "--prefix", DRIVER_DIR, "--no-audit", "--no-fund",
                            "--loglevel=error"], capture_output=True, text=True, timeout=300)
        if p.returncode != 0 or not os.path.exists(mod):
            fail(f"npm ci --prefix tests/dashboard failed ({p.returncode}):\n{p.stdout}{p.stderr}")
        print(f"    npm ci in {time.monotonic() - t0:.1f}s", flush=True)
    version = json.load(open(mod))["version"]
    p = subprocess.run([CHROMIUM, "--version"], capture_output=True, text=True, timeout=30)
    print(f"    playwright-core {version}, {p.stdout.strip() or p.stderr.strip()}", flush=True)


@test
def dashboard_files_name_no_other_host():
    """No CDN, no font service, no analytics: nothing but relative URLs."""
    names = sorted(os.listdir(DASHBOARD))
    if "index.html" not in names:
        fail(f"dashboard/index.html is missing: {names}")
    for name in names:
        text = open(os.path.join(DASHBOARD, name), encoding="utf-8").read()
        text = text.replace('xmlns="http://www.w3.org/2000/svg"', "")
        for m in re.finditer(r"""(?:https?:|wss?:)?//[A-Za-z0-9.-]+\.[A-Za-z]{2,}|@import\s+url""", text):
            line = text.count("\n", 0, m.start()) + 1
            fail(f"dashboard/{name}:{line} refers to another host: {m.group(0)!r}")


@test
def stack_serves_the_dashboard_through_nginx():
    p = stack("start")
    if p.returncode != 0:
        # A failed start stops what it started; one more try before failing
        # (this test is about the page, not the launcher: tests/test_stack.py).
        print(f"    stack.sh start exited {p.returncode}, trying once more:\n"
              + "\n".join("      | " + l for l in p.stderr.splitlines()[-8:]), flush=True)
        p = stack("start")
    ss.register_stack_pids(RUN_DIR)
    if p.returncode != 0:
        fail(f"scripts/stack.sh start exited {p.returncode}:\n{p.stderr}")
    env = ss.stack_env_file(RUN_DIR)
    S["port"] = int(env["NGINX_PORT"])
    S["base"] = env["BASE_URL"]
    S["token"] = env["ADMIN_TOKEN"]
    r = ss.request(S["port"], "GET", "/dashboard/")
    if r.status != 200 or "text/html" not in r.headers.get("content-type", "") \
            or "<canvas" not in r.body:
        fail(f"GET /dashboard/: {r.status} {r.headers} {r.raw[:200]!r}")
    if "default-src 'self'" not in r.headers.get("content-security-policy", ""):
        fail(f"GET /dashboard/ without a same-origin Content-Security-Policy: {r.headers}")
    for path, status, location in (("/dashboard", 301, "/dashboard/"), ("/", 302, "/dashboard/")):
        r = ss.request(S["port"], "GET", path)
        if r.status != status or r.headers.get("location") != location:
            fail(f"GET {path}: {r.status} Location {r.headers.get('location')!r}, want {status} {location}")
    for name, ctype in (("dashboard.js", "application/javascript"), ("charts.js", "application/javascript"),
                        ("dashboard.css", "text/css"), ("favicon.svg", "image/svg+xml")):
        r = ss.request(S["port"], "GET", f"/dashboard/{name}")
        if r.status != 200 or ctype not in r.headers.get("content-type", ""):
            fail(f"GET /dashboard/{name}: {r.status} {r.headers.get('content-type')}")
    r = ss.request(S["port"], "GET", "/dashboard/missing.js")
    if r.status != 404 or not isinstance(r.body, dict) or r.body.get("error") != "not_found":
        fail(f"a missing file: {r.status} {r.raw[:200]!r}")
    # The service behind it is untouched.
    r = ss.request(S["port"], "GET", "/stats")
    if r.status != 200 or "vouchers" not in r.body:
        fail(f"GET /stats through nginx: {r.status} {r.raw[:200]!r}")


@test
def page_shows_the_sale_live_and_the_invariants_green():
    if "port" not in S:
        fail("no stack (see the test before)")
    vid = new_voucher("Dashboard test: 50 coffees", STOCK)
    S["voucher"] = vid
    S["browser"] = Browser(S["base"])
    out = S["browser"].cmd(cmd="open", path="/dashboard/")
    if out.get("status") != 200:
        fail(f"open /dashboard/: {out}")
    wait_page(f"voucher {vid} on sale with stock {STOCK}",
              lambda s: s["vouchers"][vid]["stock"] == str(STOCK) and s["vouchers"][vid]["orders"] == "0"
              and s["conn"]["state"] == "ok" and s["polls"] >= 2)

    # The sale: BUYERS distinct users, CONNECTIONS keep-alive connections through nginx,
    # in two waves. An instance's 200 marks the voucher open at nginx for 0.1 s, during
    # which its requests skip the sold-out edge; the second wave comes after that, so
    # that the edge answers some rejections however fast the first wave sold out.
    users = list(range(7_000_001, 7_000_001 + BUYERS))
    t0 = time.monotonic()
    res = []
    for wave in (users[:BUYERS // 2], users[BUYERS // 2:]):
        jobs = [wave[i::CONNECTIONS] for i in range(CONNECTIONS)]
        res += ss.run_concurrently(lambda i: S["port"], jobs, lambda c, u: c.seckill(vid, u),
                                   CONNECTIONS, timeout=60)
        time.sleep(0.3)
    took = time.monotonic() - t0
    codes = {}
    for _u, r in res:
        key = getattr(r, "status", type(r).__name__)
        if key == 409:
            key = f"409 {r.body.get('error') if isinstance(r.body, dict) else '?'}"
        codes[key] = codes.get(key, 0) + 1
    if codes != {200: STOCK, "409 sold_out": BUYERS - STOCK}:
        fail(f"the sale's answers: {codes}, want {STOCK} x 200 and {BUYERS - STOCK} x 409 sold_out")
    print(f"    sale: {BUYERS} buyers in {took:.2f}s: {codes}", flush=True)

    def sold_out_shown(s):
        row, card = s["vouchers"][vid], s["cards"][vid]
        return (row["stock"] == "0" and row["orders"] == str(STOCK) and row["initialStock"] == str(STOCK)
                and row["oversold"] == "0" and row["duplicateUsers"] == "0" and row["stockDrift"] == "0"
                and row["state"] == "sold out"
                and card["stock"] == "0" and card["orders"] == str(STOCK) and card["state"] == "ok"
                and all(s["tiles"][t]["state"] == "ok" for t in ("inv-all", "inv-oversold", "inv-duplicates", "inv-drift"))
                and s["tiles"]["inv-oversold"]["value"] == "0")
    snap = wait_page(f"voucher {vid} sold out: stock 0, {STOCK} orders, oversold 0 (all green)", sold_out_shown)
    S["snap_sold"] = snap

    # The rates: every order and every sold_out counted once since the page loaded.
    snap = wait_page(f"{STOCK} orders and {BUYERS - STOCK} sold_out rejections in the outcomes",
                     lambda s: s["outcomes"]["orders"]["total"] == str(STOCK)
                     and s["outcomes"]["sold_out"]["total"] == str(BUYERS - STOCK))
    # Both instances served, and are shown live; the rejections nginx gave by
    # itself (the sold-out edge) are among those counted above, and shown as
    # a row of their own.
    insts = dict(snap["instances"])
    edge = insts.pop("nginx-edge", None)
    if len(insts) != 2 or any(i["state"] != "live" for i in insts.values()):
        fail(f"instances shown: {insts}{page_text(snap)}")
    if any(int(i["total"]) < 10 for i in insts.values()):
        fail(f"each instance should show its share of {BUYERS} requests: {insts}")
    r = ss.request(S["port"], "GET", "/stats/edge")
    answered = r.body["requests"]["total"] if r.status == 200 else None
    if not answered:
        fail(f"nginx answered none of the {BUYERS - STOCK} rejections by itself: {r.status} {r.raw[:200]!r}")
    if edge is None or edge["state"] != "live" or edge["total"] != str(answered):
        fail(f"the edge's row: {edge}, nginx says it answered {answered}")
    blank = [c for c in snap["canvases"] if c["inked"] == 0]
    if blank or not snap["canvases"]:
        fail(f"charts left blank: {snap['canvases']}")
    if "lock reentrant" not in (snap["strategies"] or ""):
        fail(f"strategies shown: {snap['strategies']!r}")


@test
def buy_form_shows_the_answer():
    if "browser" not in S:
        fail("no page (see the test before)")
    b = S["browser"]
    vid = new_voucher("Dashboard test: buy form", 3)
    wait_page(f"voucher {vid} in the table", lambda s: s["vouchers"][vid]["stock"] == "3")
    user = str(8_000_000 + os.getpid() % 100000)
    a = b.cmd(cmd="buy", user=user, voucher=vid)["answer"]
    body = json.loads(a["body"]) if a["body"].startswith("{") else {}
    if a["status"] != 200 or a["state"] != "ok" or not re.fullmatch(r"\d{10,19}", str(body.get("orderId", ""))) \
            or body.get("voucherId") != int(vid) or body.get("userId") != int(user) \
            or body["orderId"] not in a["badge"] or "seckill-" not in a["meta"]:
        fail(f"the buy form's answer: {a}{page_problems(b.last)}")
    S["order"] = body["orderId"]
    # The order is real: the page's table follows.
    wait_page(f"voucher {vid} with 1 order after the buy form",
              lambda s: s["vouchers"][vid]["orders"] == "1" and s["vouchers"][vid]["stock"] == "2")
    # The same user again: the shown answer is the rejection.
    a = b.cmd(cmd="buy", user=user, voucher=vid)["answer"]
    if a["status"] != 409 or a["state"] != "rejected" or "already_ordered" not in a["badge"]:
        fail(f"the second buy of user {user}: {a}")
    if len(a["history"]) != 2 or "already_ordered" not in a["history"][0] or "order" not in a["history"][1]:
        fail(f"the page's buy history: {a['history']}")
    # The sold-out voucher of the sale.
    a = b.cmd(cmd="buy", user=user, voucher=S["voucher"])["answer"]
    if a["status"] != 409 or "sold_out" not in a["badge"]:
        fail(f"buying the sold-out voucher: {a}")


@test
def screenshot_and_no_page_problems():
    if "browser" not in S:
        fail("no page (see the tests before)")
    b = S["browser"]
    os.makedirs(SHOT_DIR, exist_ok=True)
    # Let a second of polls draw the latest state, then take the picture.
    time.sleep(1.2)
    out = b.cmd(cmd="screenshot", path=SHOT)
    with open(SHOT, "rb") as f:
        head = f.read(8)
    if head != b"\x89PNG\r\n\x1a\n" or os.path.getsize(SHOT) < 20000:
        fail(f"{SHOT}: not a plausible PNG ({os.path.getsize(SHOT)} bytes)")
    print(f"    screenshot {SHOT}", flush=True)
    probs = out.get("problems") or []
    if probs:
        fail("the page had problems:\n    " + "\n    ".join(probs))


def teardown():
    if "browser" in S:
        S["browser"].close()
    before = ss.stack_pids(RUN_DIR)
    if before:
        p = stack("stop")
        if p.returncode != 0:
            print(p.stderr)
        for pid in before.values():
            ss.unregister_pid(pid)


if __name__ == "__main__":
    ss.main(teardown)
