"""Helpers for the black-box tests of the seckill server (Python 3 stdlib only).

What the tools share (the stack, psql, redis-cli, the HTTP client, /proc,
waiting for a condition) is the kit's (loadtest/kit/); this module adds what
only the tests need, and turns kit's errors into test failures:

- Server: starts build/seckill on a free loopback port with env overrides,
  waits for GET /health, stops it with SIGTERM and checks it exits 0.
- request() / Client / Response: kit's HTTP client (port or base URL, JSON,
  timeouts); body is parsed JSON when the answer is JSON, raw text otherwise.
- raw_request(): sends arbitrary bytes on a socket, for malformed requests.
- voucher_body() / new_voucher(): a voucher on sale now.
- psql() / psql_value() / redis(): queries with the psql and redis-cli clients;
  backend_pids(): the Postgres backends of an instance.
- wait_for(): until a condition holds, a test failure after a timeout.
- RedisServer: a dedicated redis-server (for outage tests), optionally a replica.
- RedisHA: a master, replicas and three Sentinels (redis-server --sentinel) of
  the test's own, on free ports: sentinels_env() for a Server, master_port(),
  wait_master() after a failover, pause()/resume() of a node.
- register_pid() / unregister_pid(): tell tests/run.sh about a process to kill
  if the test dies; pid_alive(), stop_pid().
- local_stack() / run_stack() / stack_run_env() / stack_pids() /
  stack_env_file(): the local stack (kit.Stack) in a RUN_DIR of the test's
  own, on free ports, with this build's binary and Lua scripts.
- start_nginx(): nginx/gen-conf.sh's configuration, nginx started on it.
- test / main: a minimal test runner printing "ok - name" / "FAIL - name: why"
  and "N passed, M failed".

Environment (set by tests/run.sh): SECKILL_BIN, PG_DSN, REDIS_URL, LUA_DIR,
TEST_TMP. TEST_ONLY=substring runs only the matching test functions;
TEST_EXCEPT="a b" leaves out those whose name contains a or b.
"""

import atexit
import http.client
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "loadtest"))
import kit  # noqa: E402
from kit import Client, Response, pid_alive, request, voucher_body  # noqa: E402,F401
SECKILL_BIN = os.environ.get("SECKILL_BIN", os.path.join(ROOT, "build", "seckill"))
PG_DSN = os.environ.get("PG_DSN", "")
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
LUA_DIR = os.environ.get("LUA_DIR", os.path.join(ROOT, "lua"))
TEST_TMP = os.environ.get("TEST_TMP") or os.path.join(ROOT, "build", "test-tmp")
PIDS_DIR = os.path.join(TEST_TMP, "pids")

HTTP_TIMEOUT = 15.0       # seconds, every HTTP call
START_TIMEOUT = 10.0      # seconds until /health answers
STOP_TIMEOUT = 5.0        # seconds until the process exits after SIGTERM

os.makedirs(PIDS_DIR, exist_ok=True)


def fail(msg):
    raise AssertionError(msg)


def free_port():
    return kit.free_ports(1)[0]


def dead_port():
    """A loopback port with nothing listening (as far as we can tell)."""
    port = free_port()
    with socket.socket() as s:
        s.settimeout(1)
        if s.connect_ex(("127.0.0.1", port)) == 0:
            fail(f"port {port} unexpectedly answers")
    return port


def tail(path, lines=40):
    try:
        with open(path, "rb") as f:
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join("    | " + l for l in data.splitlines()[-lines:])


# ---------------------------------------------------------------- processes

_children = []            # Popen objects to kill at exit
_children_lock = threading.Lock()


def start_time(pid):
    """The start time of process pid (field 22 of /proc/pid/stat, in clock
    ticks since boot): with the pid, it names one process, since a pid is
    reused once its process is gone. None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()[19]


def register_pid(pid):
    """Lets tests/run.sh kill process pid if this test dies: a file named
    pid in PIDS_DIR holding its start time, so that a process that took the
    pid over after it ended is never killed."""
    t = start_time(pid)
    if t is None:
        return
    try:
        with open(os.path.join(PIDS_DIR, str(pid)), "w") as f:
            f.write(t + "\n")
    except OSError:
        pass


def unregister_pid(pid):
    try:
        os.unlink(os.path.join(PIDS_DIR, str(pid)))
    except OSError:
        pass


stop_pid = kit.stop_pid


def _track(proc):
    with _children_lock:
        _children.append(proc)
    register_pid(proc.pid)


def _untrack(proc):
    with _children_lock:
        if proc in _children:
            _children.remove(proc)
    unregister_pid(proc.pid)


def _kill_children():
    with _children_lock:
        procs = list(_children)
    for p in procs:
        if p.poll() is None:
            p.kill()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        _untrack(p)


atexit.register(_kill_children)


def _on_sigterm(signum, frame):
    # Turn SIGTERM (from timeout(1) or run.sh) into a normal exit so atexit runs.
    raise SystemExit(128 + signum)


signal.signal(signal.SIGTERM, _on_sigterm)


class Server:
    """One seckill instance on 127.0.0.1:<free port>.

    env: overrides on top of the inherited environment; a value of None
    removes the variable (e.g. ADMIN_TOKEN=None for a server without admin).
    """

    def __init__(self, name, env=None, start=True):
        self.name = name
        self.port = None
        self.proc = None
        self.log_path = None
        self.env_overrides = dict(env or {})
        self.returncode = None
        if start:
            self.start()

    def build_env(self):
        env = dict(os.environ)
        env.update({
            "BIND": "127.0.0.1",
            "INSTANCE_ID": self.name,
            "LUA_DIR": LUA_DIR,
            "PG_DSN": PG_DSN,
            "REDIS_URL": REDIS_URL,
            "LOG_LEVEL": "info",
        })
        # Every other setting at its default unless the test overrides it.
        for k in ("ADMIN_TOKEN", "DEMO_RANDOM_USER", "SECKILL_LOCK", "SECKILL_STOCK",
                  "THREADS", "IO_THREADS", "MAX_CONNECTIONS", "CONN_TIMEOUT_S", "MAX_BODY",
                  "LOCK_LEASE_MS", "REDIS_TIMEOUT_MS", "PG_CONNECT_TIMEOUT_S",
                  "PG_STATEMENT_TIMEOUT_MS", "ID_PREFIX", "RETRY_AFTER_S",
                  "DEMO_DELAY_MS", "DEMO_PAUSE_MS", "WATCHDOG_TIMEOUT_MS",
                  "REQUEST_DEADLINE_MS", "TEST_CLOCK_STEP_MS", "SHUTDOWN_DRAIN_MS",
                  "LOCK_TOKEN_TTL_MS", "FENCE_HORIZON_MS", "REDIS_ORDER_DURABILITY",
                  "REDIS_ORDER_WAIT_REPLICAS", "REDIS_ORDER_WAIT_MS", "CONSUMERS",
                  "CONSUMER_BATCH_MAX", "CONSUMER_CLAIM_IDLE_MS", "CONSUMER_LINGER_MS",
                  "CONSUMER_REMOVE_IDLE_MS", "DEAD_LETTERS_MAX", "CONSUMER_RETRY_MAX_MS",
                  "STREAM_BACKLOG_MAX"):
            env.pop(k, None)
        return kit.with_settings(env, self.env_overrides)

    def start(self, timeout=START_TIMEOUT):
        if not os.access(SECKILL_BIN, os.X_OK):
            fail(f"server binary {SECKILL_BIN} is missing")
        last_error = None
        for _attempt in range(3):       # a free port can be taken meanwhile
            self.port = free_port()
            env = self.build_env()
            env["PORT"] = str(self.port)
            self.log_path = os.path.join(TEST_TMP, f"server-{self.name}-{self.port}.log")
            log = open(self.log_path, "ab")
            try:
                self.proc = subprocess.Popen([SECKILL_BIN], env=env, stdin=subprocess.DEVNULL,
                                             stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
            finally:
                log.close()
            _track(self.proc)
            try:
                self.wait_healthy(timeout)
                return self
            except AssertionError as e:
                last_error = e
                if self.proc.poll() is None:       # alive but not answering: no retry
                    self.kill()
                    raise
                _untrack(self.proc)
        raise last_error

    def wait_healthy(self, timeout=START_TIMEOUT):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                fail(f"server {self.name} exited with {self.proc.returncode} during start;"
                     f" log {self.log_path}:\n{tail(self.log_path)}")
            try:
                r = request(self.port, "GET", "/health", timeout=1)
                if r.status == 200:
                    return
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.05)
        fail(f"server {self.name} did not answer GET /health within {timeout}s;"
             f" log {self.log_path}:\n{tail(self.log_path)}")

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout=STOP_TIMEOUT):
        """SIGTERM, wait; returns (exit code, seconds taken). Kills on timeout."""
        if self.proc is None:
            return self.returncode, 0.0
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            fail(f"server {self.name} did not exit within {timeout}s of SIGTERM;"
                 f" log {self.log_path}:\n{tail(self.log_path)}")
        took = time.monotonic() - t0
        self.returncode = self.proc.returncode
        _untrack(self.proc)
        self.proc = None
        return self.returncode, took

    def stop_ok(self, timeout=STOP_TIMEOUT):
        """Stops and asserts a clean exit (status 0) within 'timeout'."""
        rc, _ = self.stop(timeout)
        if rc != 0:
            fail(f"server {self.name} exited with {rc} after SIGTERM;"
                 f" log {self.log_path}:\n{tail(self.log_path)}")

    def kill(self):
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=5)
            self.returncode = self.proc.returncode
            _untrack(self.proc)
            self.proc = None

    def log_tail(self, lines=40):
        return tail(self.log_path, lines)

    # convenience
    def request(self, method, path, headers=None, body=None, timeout=HTTP_TIMEOUT):
        return request(self.port, method, path, headers, body, timeout)

    def get(self, path, headers=None, timeout=HTTP_TIMEOUT):
        return self.request("GET", path, headers, None, timeout)

    def post(self, path, headers=None, body=None, timeout=HTTP_TIMEOUT):
        return self.request("POST", path, headers, body, timeout)

    def seckill(self, voucher_id, user_id, timeout=HTTP_TIMEOUT):
        return request(self.port, "POST", f"/voucher/{voucher_id}/seckill",
                       {"X-User-Id": str(user_id)}, None, timeout)


class RedisServer:
    """A dedicated redis-server on a given or free port: no persistence, or
    the redis-server options in 'args' (e.g. ["--appendonly", "yes"]), which
    override the defaults; replica_of: the port of its master. start() again
    after kill() restarts it on the same port and directory (its AOF, if
    any)."""

    def __init__(self, port=None, replica_of=None, args=()):
        self.port = port or free_port()
        self.replica_of = replica_of
        self.args = list(args)
        self.proc = None
        self.dir = os.path.join(TEST_TMP, f"redis-{self.port}")
        os.makedirs(self.dir, exist_ok=True)
        self.log_path = os.path.join(self.dir, "redis.log")

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}/0"

    def cli(self, *args, timeout=5):
        return redis(list(args), url=self.url, timeout=timeout)

    def start(self, timeout=10):
        extra = ["--replicaof", "127.0.0.1", str(self.replica_of)] if self.replica_of else []
        self.proc = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--dir", self.dir,
             "--logfile", self.log_path] + extra + self.args,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _track(self.proc)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                fail(f"redis-server on {self.port} exited:\n{tail(self.log_path)}")
            try:
                if redis(["PING"], url=self.url, timeout=2) == "PONG":
                    return self
            except AssertionError:
                pass
            time.sleep(0.05)
        fail(f"redis-server on {self.port} not ready within {timeout}s")

    def kill(self):
        if self.proc is not None:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGCONT)     # a paused one dies too
                self.proc.kill()
                self.proc.wait(timeout=5)
            _untrack(self.proc)
            self.proc = None


class SentinelServer:
    """redis-server --sentinel on a free port, watching master 'name' at
    master_port with quorum 2; its config file (which Sentinel rewrites) is
    its own, in TEST_TMP."""

    def __init__(self, name, master_port, down_after_ms=2000, failover_timeout_ms=3000):
        self.port = free_port()
        self.dir = os.path.join(TEST_TMP, f"sentinel-{self.port}")
        os.makedirs(self.dir, exist_ok=True)
        self.log_path = os.path.join(self.dir, "sentinel.log")
        self.conf = os.path.join(self.dir, "sentinel.conf")
        with open(self.conf, "w") as f:
            f.write(f"port {self.port}\nbind 127.0.0.1\ndaemonize no\ndir {self.dir}\n"
                    f"logfile {self.log_path}\n"
                    f"sentinel monitor {name} 127.0.0.1 {master_port} 2\n"
                    f"sentinel down-after-milliseconds {name} {down_after_ms}\n"
                    f"sentinel failover-timeout {name} {failover_timeout_ms}\n"
                    f"sentinel parallel-syncs {name} 1\n")
        self.proc = None

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def cli(self, *args, timeout=5):
        return redis(list(args), url=self.url, timeout=timeout)

    def start(self, timeout=10):
        self.proc = subprocess.Popen(["redis-server", self.conf, "--sentinel"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        _track(self.proc)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                fail(f"sentinel on {self.port} exited:\n{tail(self.log_path)}")
            try:
                if self.cli("PING", timeout=2) == "PONG":
                    return self
            except AssertionError:
                pass
            time.sleep(0.05)
        fail(f"sentinel on {self.port} not ready within {timeout}s")

    def kill(self):
        if self.proc is not None:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGCONT)
                self.proc.kill()
                self.proc.wait(timeout=5)
            _untrack(self.proc)
            self.proc = None


class RedisHA:
    """A master, 'replicas' replicas and three Sentinels (quorum 2) of the
    test's own. nodes[0] is the first master."""

    def __init__(self, name="seckill", replicas=2, down_after_ms=2000, failover_timeout_ms=3000):
        self.name = name
        self.down_after_ms = down_after_ms
        master = RedisServer().start()
        self.nodes = [master] + [RedisServer(replica_of=master.port).start()
                                 for _ in range(replicas)]
        self.wait(lambda: all(self.role(n)[:1] == ["slave"] and self.link_up(n)
                              for n in self.nodes[1:]), 15, "replicas in sync")
        self.sentinels = [SentinelServer(name, master.port, down_after_ms,
                                         failover_timeout_ms).start() for _ in range(3)]
        # A failover needs every Sentinel to know the replicas and the others.
        self.wait(self.complete, 20, "Sentinels to see every node")

    @staticmethod
    def wait(cond, timeout, what):
        wait_for(cond, timeout, what, errors=(AssertionError,))

    def complete(self):
        want = len(self.nodes) - 1
        for s in self.sentinels:
            info = s.cli("SENTINEL", "master", self.name).splitlines()
            d = dict(zip(info[0::2], info[1::2]))
            if d.get("num-slaves") != str(want) or d.get("num-other-sentinels") != "2":
                return False
        return True

    @property
    def sentinels_text(self):
        return ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)

    def sentinels_env(self):
        """The environment of a Server that finds the master through these Sentinels."""
        return {"REDIS_SENTINELS": self.sentinels_text, "REDIS_MASTER_NAME": self.name,
                "REDIS_URL": self.nodes[0].url}

    @staticmethod
    def role(node, timeout=2):
        return node.cli("ROLE", timeout=timeout).split()

    @staticmethod
    def link_up(node):
        return "master_link_status:up" in node.cli("INFO", "replication")

    def master_port(self):
        """The master's port as the Sentinels name it."""
        out = self.sentinels[0].cli("SENTINEL", "get-master-addr-by-name", self.name).split()
        return int(out[1])

    def node(self, port):
        return next(n for n in self.nodes if n.port == port)

    def wait_master(self, not_port, timeout=30):
        """Waits until every Sentinel names a master other than not_port and
        that server says it is the master; returns its port."""
        out = {}

        def moved():
            ports = set()
            for s in self.sentinels:
                a = s.cli("SENTINEL", "get-master-addr-by-name", self.name).split()
                ports.add(int(a[1]))
            if len(ports) != 1 or not_port in ports:
                return False
            p = ports.pop()
            out["port"] = p
            return self.role(self.node(p))[:1] == ["master"]

        self.wait(moved, timeout, f"a failover away from {not_port}")
        return out["port"]

    def pause(self, node):
        os.kill(node.proc.pid, signal.SIGSTOP)

    def resume(self, node):
        os.kill(node.proc.pid, signal.SIGCONT)

    def stop(self):
        for s in self.sentinels:
            s.kill()
        for n in self.nodes:
            n.kill()


# ---------------------------------------------------------------- the local stack

STACK_SCRUB = kit.STACK_SCRUB
stack_pids = kit.stack_pids
stack_env_file = kit.read_stack_env


def stack_settings(env):
    """This build's binary and Lua scripts, STACK_TIMEOUT 30, then env."""
    return {"SECKILL_BIN": SECKILL_BIN, "LUA_DIR": LUA_DIR, "STACK_TIMEOUT": 30, **env}


def local_stack(run_dir, scrub=(), **env):
    """A kit.Stack in run_dir for a test (the caller's settings scrubbed:
    kit.STACK_SCRUB and scrub; stack_settings(env))."""
    return kit.Stack(run_dir, stack_settings(env), scrub)


def stack_run_env(scrub=(), **env):
    """The environment for scripts/stack.sh or a script that runs it (a
    load test, the ladder): kit.stack_env() with stack_settings(env)."""
    return kit.stack_env(stack_settings(env), scrub)


def run_stack(cmd, run_dir, timeout=90, scrub=(), **env):
    """scripts/stack.sh cmd in run_dir (local_stack()); returns the
    CompletedProcess (text stdout and stderr), whatever its exit status."""
    return local_stack(run_dir, scrub, **env).run(cmd, timeout)


def register_stack_pids(run_dir):
    """register_pid() for each of the stack's processes; returns stack_pids()."""
    pids = stack_pids(run_dir)
    for pid in pids.values():
        register_pid(pid)
    return pids


# ---------------------------------------------------------------- nginx

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
GEN_CONF = kit.GEN_CONF


def start_nginx(prefix, upstreams, extra_args=()):
    """nginx/gen-conf.sh's configuration in a fresh directory prefix, listening
    on a free loopback port in front of upstreams ("host:port"), then nginx
    started on it as a daemon and registered with tests/run.sh.
    Returns (port, pid)."""
    shutil.rmtree(prefix, ignore_errors=True)
    port = free_port()
    try:
        pid = kit.start_nginx(prefix, port, upstreams, gen_args=extra_args)
    except kit.KitError as e:
        fail(f"nginx did not start: {e}\n{tail(os.path.join(prefix, 'error.log'))}")
    register_pid(pid)               # run.sh kills it if we die
    return port, pid


# ---------------------------------------------------------------- HTTP

# For tests that send or parse requests themselves.
_encode_body = kit.encode_body
_make_response = kit.make_response


def new_voucher(srv, token, stock, title="test voucher", ahead=3600):
    """Creates a voucher on sale now through the admin API of srv (a Server,
    a port or a base URL); its id."""
    r = request(getattr(srv, "port", srv), "POST", "/admin/vouchers",
                {"Authorization": f"Bearer {token}"}, voucher_body(title, stock, ahead))
    if r.status != 201:
        fail(f"create voucher -> {r.status} {r.body!r}")
    return r.body["voucherId"]


def raw_request(port, data, timeout=5.0):
    """Sends raw bytes and reads the answer (until Content-Length is satisfied
    or the server closes). Sending and reading are interleaved, so an answer
    the server gives before reading everything (e.g. 413) is still seen.
    Returns a Response, or None if the server closed without answering."""
    if isinstance(data, str):
        data = data.encode()
    buf = b""
    deadline = time.monotonic() + timeout
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.setblocking(False)
        sent = 0
        while time.monotonic() < deadline:
            want_write = sent < len(data)
            r, w, _ = select.select([s], [s] if want_write else [], [],
                                    max(0.0, deadline - time.monotonic()))
            if r:
                try:
                    chunk = s.recv(65536)
                except (BlockingIOError, InterruptedError):
                    chunk = None
                except OSError:          # reset: the server closed on unread data
                    break
                if chunk == b"":
                    break
                if chunk:
                    buf += chunk
                    parsed = _parse_raw(buf)
                    if parsed is not None and parsed[3]:
                        break
            if w:
                try:
                    sent += s.send(data[sent:sent + 65536])
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:          # the server stopped reading: keep reading
                    sent = len(data)
            if not r and not w:
                break                    # timed out
    if not buf:
        return None
    parsed = _parse_raw(buf)
    if parsed is None:
        fail(f"unparsable answer: {buf[:200]!r}")
    status, items, body, _complete = parsed
    return kit.make_response(status, items, body)


def _parse_raw(buf):
    """(status, header items, body, complete) or None if the head is incomplete."""
    head, sep, rest = buf.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise AssertionError(f"bad status line {lines[0]!r}")
    status = int(parts[1])
    items = []
    for l in lines[1:]:
        k, _, v = l.partition(":")
        items.append((k.strip(), v.strip()))
    clen = None
    for k, v in items:
        if k.lower() == "content-length":
            clen = int(v)
    if clen is not None:
        return status, items, rest[:clen], len(rest) >= clen
    return status, items, rest, False


def run_concurrently(port_for_worker, jobs_per_worker, fn, workers, start_barrier=True,
                     timeout=120):
    """Runs 'workers' threads, each with its own keep-alive Client on
    port_for_worker(i); all connect first, wait at a barrier, then worker i
    calls fn(client, job) for each job in jobs_per_worker[i].
    Returns a list of (job, Response or exception)."""
    results = []
    res_lock = threading.Lock()
    barrier = threading.Barrier(workers) if start_barrier else None
    errors = []

    def worker(i):
        client = Client(port_for_worker(i))
        try:
            try:
                client.connect()
            except Exception as e:          # still reach the barrier
                with res_lock:
                    errors.append(e)
            if barrier is not None:
                try:
                    barrier.wait(timeout=30)
                except threading.BrokenBarrierError:
                    pass
            for job in jobs_per_worker[i]:
                try:
                    r = fn(client, job)
                except Exception as e:
                    r = e
                with res_lock:
                    results.append((job, r))
        finally:
            client.close()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.1, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        fail(f"concurrent requests did not finish within {timeout}s")
    return results


# ---------------------------------------------------------------- psql / redis

def psql(sql, dsn=None, timeout=30):
    """Runs SQL (kit.psql: on stdin, each statement its own transaction);
    returns rows as lists of strings."""
    try:
        return kit.psql(dsn or PG_DSN, sql, timeout)
    except kit.KitError as e:
        fail(f"{e} (for {sql!r})")


def backend_pids(app):
    """The client backends of Postgres serving instance 'app' (its
    application_name)."""
    return [int(r[0]) for r in psql(
        f"SELECT pid FROM pg_stat_activity WHERE application_name = '{app}' "
        "AND backend_type = 'client backend'")]


def psql_value(sql, dsn=None):
    try:
        return kit.psql_value(dsn or PG_DSN, sql, 30)
    except kit.KitError as e:
        fail(str(e))


def redis(args, url=None, timeout=10):
    """Runs one redis-cli command (kit.redis_cli) against url (default
    REDIS_URL); returns its raw output, stripped."""
    try:
        return kit.redis_cli(url or REDIS_URL, *args, timeout=timeout)
    except kit.KitError as e:
        fail(str(e))


def wait_for(cond, timeout, what, poll=0.05, errors=()):
    """kit.wait_for() for the tests: cond()'s first true value; a test
    failure after timeout seconds. An exception of a type in errors counts
    as "not yet"."""
    try:
        return kit.wait_for(cond, timeout, what, poll, errors)
    except kit.KitError as e:
        fail(str(e))


# ---------------------------------------------------------------- runner

_tests = []


def test(fn):
    """Decorator: registers a test function (run in definition order)."""
    _tests.append(fn)
    return fn


def main(teardown=None):
    only = os.environ.get("TEST_ONLY", "")
    if len(sys.argv) > 1:
        only = sys.argv[1]
    left_out = os.environ.get("TEST_EXCEPT", "").split()
    passed = failed = 0
    try:
        for fn in _tests:
            name = fn.__name__
            if (only and only not in name) or any(w in name for w in left_out):
                continue
            t0 = time.monotonic()
            try:
                fn()
            except AssertionError as e:
                failed += 1
                print(f"FAIL - {name}: {e}", flush=True)
                continue
            except Exception as e:
                failed += 1
                tb = traceback.format_exc().rstrip().replace("\n", "\n    ")
                print(f"FAIL - {name}: {type(e).__name__}: {e}\n    {tb}", flush=True)
                continue
            passed += 1
            print(f"ok - {name} ({time.monotonic() - t0:.1f}s)", flush=True)
        if only and passed + failed == 0:
            failed += 1
            print(f"FAIL - no test name contains {only!r}", flush=True)
        if teardown is not None:
            try:
                teardown()
            except Exception as e:
                failed += 1
                print(f"FAIL - teardown: {type(e).__name__}: {e}", flush=True)
    finally:
        _kill_children()
    print(f"{passed} passed, {failed} failed", flush=True)
    sys.exit(1 if failed else 0)
