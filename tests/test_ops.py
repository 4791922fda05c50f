#!/usr/bin/env python3
"""Operators' conventions of the server binary, observed from outside:

- --version prints the name, the version (the VERSION file, and the commit
  when built from git) and the versions of libmicrohttpd, hiredis, libpq and
  cJSON, even when the environment holds invalid settings;
- the effective configuration is logged once at start, in text and in JSON
  logs, with ADMIN_TOKEN, the Redis password and the Postgres password
  masked, while the server really uses them (a Redis with requirepass
  answers, the admin API takes the token);
- ADMIN_TOKEN_FILE supplies the token (trailing newline stripped); set
  together with ADMIN_TOKEN, or unreadable, it stops the start with a clear
  message and exit status 2;
- without INSTANCE_ID the instance is "<hostname>-<port>";
- the db of REDIS_URL is selected on every connection (one Redis lacks:
  not ready, the reason logged);
- a LUA_DIR without the scripts, or with an empty one, stops the start
  with exit status 2 and the file's name; a BIND that is not an IPv4
  address stops it with status 1.
Prints "N passed, M failed". Python 3 standard library only.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seckill_server as ss  # noqa: E402
from seckill_server import fail, test  # noqa: E402

ROOT = ss.ROOT
SECRETS = ("tok-SECRET-1", "redis-SECRET-2", "pg-SECRET-3", "node-SECRET-4", "node-SECRET-5")


def modversion(pkg):
    p = subprocess.run(["pkg-config", "--modversion", pkg], capture_output=True, text=True)
    return p.stdout.strip()


def run_bin(args, env_over=None, timeout=10):
    env = {k: v for k, v in os.environ.items()
           if k not in ("ADMIN_TOKEN", "ADMIN_TOKEN_FILE", "INSTANCE_ID")}
    env.update(env_over or {})
    return subprocess.run([ss.SECKILL_BIN, *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


@test
def version_names_the_build_and_the_libraries():
    p = run_bin(["--version"], {"PORT": "not-a-port", "LOG_FORMAT": "xml"})
    if p.returncode != 0:
        fail(f"--version: exit {p.returncode}: {p.stderr}")
    lines = p.stdout.splitlines()
    version = open(os.path.join(ROOT, "VERSION")).read().strip()
    if not re.fullmatch(rf"seckill {re.escape(version)}( \(git [0-9a-f]{{7,}}(-dirty)?\))?", lines[0]):
        fail(f"first line {lines[0]!r}: want 'seckill {version}' (and the commit when built from git)")
    libs = dict(l.split(" ", 1) for l in lines[1:])
    want = {"libmicrohttpd": modversion("libmicrohttpd"), "hiredis": modversion("hiredis"),
            "cJSON": modversion("libcjson")}
    for name, v in want.items():
        if libs.get(name) != v:
            fail(f"{name}: --version says {libs.get(name)!r}, pkg-config {v!r}")
    # libpq reports major.minor (15.14); pkg-config may say the same.
    pq = modversion("libpq")
    if not libs.get("libpq") or not pq.startswith(libs["libpq"].split(".")[0] + "."):
        fail(f"libpq: --version says {libs.get('libpq')!r}, pkg-config {pq!r}")
    h = run_bin(["--help"])
    if "--version" not in h.stdout:
        fail("--help does not mention --version")


def config_lines(log_text, json_format):
    out = []
    for line in log_text.splitlines():
        if json_format:
            try:
                msg = json.loads(line).get("msg", "")
            except ValueError:
                fail(f"a log line is not JSON: {line!r}")
        else:
            msg = line
        if re.search(r"seckill \S.*: config PORT=", msg):
            out.append(msg)
    return out


def secret_redis():
    """A redis-server that requires a password."""
    r = ss.RedisServer()
    r.proc = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(r.port), "--save", "",
         "--appendonly", "no", "--dir", r.dir, "--logfile", r.log_path,
         "--requirepass", "redis-SECRET-2"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ss.register_pid(r.proc.pid)
    deadline = time.monotonic() + 10
    url = f"redis://:redis-SECRET-2@127.0.0.1:{r.port}/0"
    while time.monotonic() < deadline:
        # redis-cli 7.0 takes "redis://:pw@" as an empty user name: -a instead.
        p = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(r.port), "--no-auth-warning",
                            "-a", "redis-SECRET-2", "PING"], capture_output=True, text=True, timeout=5)
        if p.stdout.strip() == "PONG":
            return r, url
        time.sleep(0.05)
    r.kill()
    fail("redis-server with requirepass did not start")


def check_start_log(json_format):
    r, url = secret_redis()
    try:
        srv = ss.Server(f"ops-{'json' if json_format else 'text'}", {
            "ADMIN_TOKEN": "tok-SECRET-1", "REDIS_URL": url,
            "PG_DSN": ss.PG_DSN + " password=pg-SECRET-3", "THREADS": "3",
            # listed, not used by the default lock: shown masked all the same
            "LOCK_REDIS_NODES": "redis://:node-SECRET-4@127.0.0.1:1,redis://127.0.0.1:2/1,"
                                "redis://u:node-SECRET-5@127.0.0.1:3",
            "LOG_FORMAT": "json" if json_format else "text"})
        try:
            # The secrets are in force: Redis and Postgres answer, the token works.
            deadline = time.monotonic() + 10
            while srv.get("/ready").status != 200:
                if time.monotonic() > deadline:
                    fail(f"not ready with the password-protected Redis:\n{srv.log_tail()}")
                time.sleep(0.1)
            vid = ss.new_voucher(srv, "tok-SECRET-1", 1, "ops log test")
            if not vid:
                fail("no voucher id")
        finally:
            srv.stop_ok()
        text = open(srv.log_path).read()
    finally:
        r.kill()
    for s in SECRETS:
        if s in text:
            fail(f"the log shows the secret {s!r}:\n{ss.tail(srv.log_path)}")
    lines = config_lines(text, json_format)
    if len(lines) != 1:
        fail(f"want one configuration line at start, got {len(lines)}:\n{ss.tail(srv.log_path)}")
    line = lines[0]
    port = re.search(r"PORT=(\d+)", line).group(1)
    for want in (f"PORT={port}", "BIND=127.0.0.1", f"INSTANCE_ID={srv.name}", "THREADS=3",
                 "ADMIN_TOKEN=***", f"REDIS_URL=redis://:***@127.0.0.1:{r.port}/0",
                 "password=***", "SECKILL_LOCK=reentrant", "SECKILL_STOCK=optimistic",
                 "LOG_LEVEL=info", f"LOG_FORMAT={'json' if json_format else 'text'}",
                 "LOCK_LEASE_MS=10000",
                 "LOCK_REDIS_NODES=redis://:***@127.0.0.1:1,redis://127.0.0.1:2/1,"
                 "redis://u:***@127.0.0.1:3"):
        if want not in line:
            fail(f"the configuration line lacks {want!r}: {line}")
    dsn = re.search(r'PG_DSN="([^"]*)"', line)
    if not dsn or dsn.group(1) != ss.PG_DSN + " password=***":
        fail(f"PG_DSN in the log: {dsn.group(1) if dsn else None!r}")


@test
def start_log_shows_the_configuration_with_secrets_masked():
    check_start_log(json_format=False)


@test
def start_log_in_json_shows_the_configuration_with_secrets_masked():
    check_start_log(json_format=True)


@test
def admin_token_file_supplies_the_token():
    with tempfile.TemporaryDirectory(dir=ss.TEST_TMP) as d:
        path = os.path.join(d, "admin_token")
        with open(path, "w") as f:
            f.write("file-token-SECRET\n")
        srv = ss.Server("ops-token-file", {"ADMIN_TOKEN": None, "ADMIN_TOKEN_FILE": path})
        try:
            body = ss.voucher_body("token file", 1)
            r = srv.post("/admin/vouchers", {"Authorization": "Bearer file-token-SECRET"}, body)
            if r.status != 201:
                fail(f"the file's token (newline stripped) was refused: {r.status} {r.body}")
            r = srv.post("/admin/vouchers", {"Authorization": "Bearer file-token-SECRE"}, body)
            if r.status != 401:
                fail(f"another token should be refused: {r.status} {r.body}")
        finally:
            srv.stop_ok()
        text = open(srv.log_path).read()
        if "file-token-SECRET" in text:
            fail("the log shows the token read from the file")
        line = config_lines(text, False)[0]
        if "ADMIN_TOKEN=***" not in line or f"ADMIN_TOKEN_FILE={path}" not in line:
            fail(f"the configuration line should show the file and a masked token: {line}")


@test
def admin_token_file_errors_stop_the_start_with_status_2():
    with tempfile.TemporaryDirectory(dir=ss.TEST_TMP) as d:
        path = os.path.join(d, "admin_token")
        with open(path, "w") as f:
            f.write("file-token\n")
        cases = [
            ({"ADMIN_TOKEN": "env-token", "ADMIN_TOKEN_FILE": path},
             "ADMIN_TOKEN and ADMIN_TOKEN_FILE are both set"),
            ({"ADMIN_TOKEN_FILE": os.path.join(d, "missing")},
             f"cannot read ADMIN_TOKEN_FILE '{os.path.join(d, 'missing')}': No such file"),
            ({"ADMIN_TOKEN_FILE": d}, f"cannot read ADMIN_TOKEN_FILE '{d}'"),
        ]
        empty = os.path.join(d, "empty")
        open(empty, "w").close()
        cases.append(({"ADMIN_TOKEN_FILE": empty}, "is empty"))
        for env, want in cases:
            env = dict(env, PORT=str(ss.free_port()))
            t0 = time.monotonic()
            p = run_bin([], env)
            if p.returncode != 2 or want not in p.stderr:
                fail(f"{env}: exit {p.returncode} (want 2), stderr {p.stderr!r} (want {want!r})")
            if time.monotonic() - t0 > 5:
                fail(f"{env}: took {time.monotonic() - t0:.1f} s to refuse")


@test
def instance_id_defaults_to_hostname_and_port():
    srv = ss.Server("unused", {"INSTANCE_ID": None})
    try:
        r = srv.get("/health")
        host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:56]
        want = f"{host}-{srv.port}"
        if r.headers.get("x-instance-id") != want:
            fail(f"X-Instance-Id {r.headers.get('x-instance-id')!r}, want {want!r}")
    finally:
        srv.stop_ok()



@test
def a_bad_lua_dir_or_bind_address_stops_the_start():
    with tempfile.TemporaryDirectory(dir=ss.TEST_TMP) as d:
        p = run_bin([], {"LUA_DIR": d, "PORT": str(ss.free_port())})
        want = f"lua scripts: cannot read {d}/lock_acquire.lua"
        if p.returncode != 2 or want not in p.stderr or "(set LUA_DIR)" not in p.stderr:
            fail(f"LUA_DIR without scripts: exit {p.returncode} (want 2), stderr {p.stderr[-400:]!r}")
        for name in os.listdir(os.path.join(ROOT, "lua")):
            shutil.copy(os.path.join(ROOT, "lua", name), d)
        open(os.path.join(d, "lock_release.lua"), "w").close()
        p = run_bin([], {"LUA_DIR": d, "PORT": str(ss.free_port())})
        if p.returncode != 2 or f"{d}/lock_release.lua is empty" not in p.stderr:
            fail(f"an empty script: exit {p.returncode} (want 2), stderr {p.stderr[-400:]!r}")
    p = run_bin([], {"BIND": "localhost", "PORT": str(ss.free_port())})
    if p.returncode != 1 or "invalid BIND address 'localhost' (IPv4 expected)" not in p.stderr:
        fail(f"BIND=localhost: exit {p.returncode} (want 1), stderr {p.stderr[-400:]!r}")


@test
def the_db_of_redis_url_is_the_one_used():
    """REDIS_URL's /db is selected on every connection: a sale's keys are in
    that database, none in db 0. A db the Redis does not have leaves the
    instance unready (503) with Redis's reason in the log."""
    rs = ss.RedisServer().start()
    try:
        srv = ss.Server("ops-db5", {"ADMIN_TOKEN": "db-token",
                                    "REDIS_URL": f"redis://127.0.0.1:{rs.port}/5"})
        try:
            vid = ss.new_voucher(srv, "db-token", 5, "ops db test")
            r = srv.seckill(vid, 8800001)
            if r.status != 200:
                fail(f"buy with REDIS_URL .../5: {r.status} {r.body!r}")
        finally:
            srv.stop_ok()
        in5 = ss.redis(["--scan", "--pattern", "icr:*"], url=f"{rs.url.rsplit('/', 1)[0]}/5")
        in0 = ss.redis(["--scan", "--pattern", "*"], url=f"{rs.url.rsplit('/', 1)[0]}/0")
        if not in5.strip() or in0.strip():
            fail(f"keys in db 5: {in5!r}; in db 0: {in0!r}")
        srv = ss.Server("ops-db99", {"REDIS_URL": f"redis://127.0.0.1:{rs.port}/99"})
        try:
            r = srv.get("/ready")
            if r.status != 503:
                fail(f"GET /ready with db 99 of 16: {r.status} {r.body!r}")
            with open(srv.log_path, errors="replace") as f:
                if "SELECT: ERR DB index is out of range" not in f.read():
                    fail(f"the log does not say why:\n{srv.log_tail()}")
        finally:
            srv.stop_ok()
    finally:
        rs.kill()


@test
def a_second_instance_on_a_port_in_use_does_not_start():
    """Two instances given one PORT: the second stops at start with the
    reason, instead of sharing the port (SO_REUSEPORT) and letting the
    kernel split the connections between them."""
    first = ss.Server("port-first", {})
    try:
        second = ss.Server("port-second", {}, start=False)
        e = second.build_env()
        e["PORT"] = str(first.port)
        try:
            p = subprocess.run([ss.SECKILL_BIN], env=e, capture_output=True, text=True, timeout=20)
        except subprocess.TimeoutExpired:
            fail(f"a second instance on port {first.port} kept running")
        if p.returncode == 0 or "cannot listen" not in p.stderr:
            fail(f"second instance on port {first.port}: exit {p.returncode}, stderr {p.stderr[-400:]!r}")
        if first.get("/health").status != 200:
            fail("the first instance stopped answering")
    finally:
        first.stop_ok()

if __name__ == "__main__":
    ss.main()
