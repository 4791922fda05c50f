"""The toolkit of the Python tools: the benchmark (bench.py, bench_ab.py), the
ladder (ladder.py), the load-test reports (report.py, check_invariants.py) and
the tests (tests/seckill_server.py and the programs that import it).

One module, in sections, each the only copy of what it does:

  processes    run() a command (KitError on failure), free_ports(),
               proc_status() / pid_alive() / wait_gone() from /proc, stop_pid(),
               with_settings() (an environment), write_atomic() (a file)
  the stack    Stack: scripts/stack.sh in a RUN_DIR of its own (start, stop,
               restart-instances with other settings, rolling-restart, its env
               file, PIDs; with REDIS_HA=1 the Sentinels' master, a failover
               awaited, a node restarted as a replica); redis_cli(),
               redis_role(), redis_info_count(); start_nginx():
               nginx/gen-conf.sh's configuration, nginx on it
  psql         psql() and psql_value(): SQL on stdin, rows of strings, a timeout
  HTTP         request() and Client: JSON requests with timeouts; call(): the
               same for tools, any failure a KitError; voucher_body()
  load tools   parse_ab(), ab_times() (ab -g), parse_wrk() and run_wrk()
               (wrk with loadtest/wrk_sale.lua), access_log() (nginx's log),
               answered_by() (who answered a logged request: an instance's
               name, or NGINX_EDGE)
  figures      percentile() (nearest rank), fmt_count(), fmt_ms(), table()

Importable from anywhere: loadtest/ on sys.path (the tests insert it). Python 3
standard library only.
"""

import http.client
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
from collections import namedtuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
STACK_SH = os.path.join(ROOT, "scripts", "stack.sh")
GEN_CONF = os.path.join(ROOT, "nginx", "gen-conf.sh")
WRK_LUA = os.path.join(HERE, "wrk_sale.lua")

HTTP_TIMEOUT = 15.0         # seconds, every HTTP call unless told otherwise


class KitError(Exception):
    """A command, psql, the stack or an HTTP call failed; the message says how."""


# ------------------------------------------------------------------ processes

def run(cmd, timeout, env=None, input=None, check=True, cwd=None):
    """Runs cmd (a list) with text output captured. KitError when it is not
    found, outlives timeout seconds, or (check) exits non-zero: the message
    carries the last lines of its output."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                           input=input, cwd=cwd)
    except subprocess.TimeoutExpired:
        raise KitError(f"{cmd[0]} did not finish within {timeout}s: {' '.join(cmd)}") from None
    except FileNotFoundError:
        raise KitError(f"{cmd[0]} not found (run 'make deps')") from None
    if check and p.returncode != 0:
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-15:])
        raise KitError(f"{' '.join(cmd[:3])} ... exited {p.returncode}:\n{tail}")
    return p


def bar_chart_head(png, width, height, bars):
    """The opening lines of a gnuplot script that draws 'bars' bars (at x =
    0 .. bars-1) into 'png': the charts of make bench and make bench-lock."""
    return (f"""set terminal pngcairo size {width},{height} font "DejaVu Sans,10"
set output '{png}'
set style fill solid 0.85 border -1
set grid ytics
set xrange [-0.6:{bars - 0.4}]
""")


def gnuplot(script, png, log):
    """Runs gnuplot on the file 'script', which draws 'png'. Returns png, or
    None when gnuplot is missing or failed (said through log)."""
    gp = shutil.which("gnuplot")
    if gp is None:
        log("gnuplot not found: no chart")
        return None
    p = subprocess.run([gp, script], capture_output=True, text=True, timeout=60)
    if p.returncode != 0 or not os.path.exists(png):
        log(f"gnuplot failed: {p.stderr.strip()}")
        return None
    return png


def free_ports(n=1):
    """n distinct loopback ports that were free a moment ago (all held open
    together while the kernel picks them, so none repeats)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_port(port, timeout=5.0):
    """True once something accepts connections on 127.0.0.1:port, False
    after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)


def proc_status(pid):
    """From /proc/PID/status: State (its letter), and VmRSS, VmHWM (KiB),
    Threads and the voluntary and nonvoluntary context switches as numbers;
    None when there is no such process. PID may be "<pid>/task/<tid>": one
    thread's."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k == "State":
                    out[k] = v.split()[0]
                elif k in ("VmRSS", "VmHWM", "Threads", "voluntary_ctxt_switches",
                           "nonvoluntary_ctxt_switches"):
                    out[k] = int(v.split()[0])
    except OSError:
        return None
    return out


def pid_alive(pid):
    """True while pid runs; a zombie (exited, not reaped yet) counts as gone."""
    st = proc_status(pid)
    return st is not None and st.get("State") not in ("Z", "X")


def wait_gone(pid, timeout=10.0):
    """Waits up to timeout seconds for pid to end; True once it has."""
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def write_atomic(path, text):
    """Writes text to path through a temporary file and a rename: a reader
    sees the old file or the whole new one."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def with_settings(env, settings):
    """A copy of env with settings: each value as a string, None removes it."""
    env = dict(env)
    for k, v in settings.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


def stop_pid(pid, sig=signal.SIGTERM, timeout=10.0, cmdline_has=None):
    """Sends sig to pid (gone already is fine) and waits up to timeout seconds
    for it to end: True once it has, False if it still runs. With
    cmdline_has, only a process whose command line holds that text (a pid
    may have been reused): None, and no signal, for another one."""
    if cmdline_has is not None:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            return True
        if cmdline_has not in cmd:
            return None
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return True
    return wait_gone(pid, timeout)


# ------------------------------------------------------------------ the stack

# The caller's settings that never reach a stack a tool starts: where another
# stack is, and what every tool sets itself.
STACK_SCRUB = ("BASE_URL", "ADMIN_TOKEN", "PG_DSN", "REDIS_URL", "NGINX_ACCESS_LOG",
               "VOUCHER_ID", "INSTANCES", "NGINX_PORT", "APP_PORT_BASE", "PG_PORT",
               "REDIS_PORT", "EXTERNAL_PG_DSN", "EXTERNAL_REDIS_URL", "THREADS", "LOG_LEVEL",
               "DEMO_RANDOM_USER", "LOADTEST_OUT", "SECKILL_LOCK", "SECKILL_STOCK", "NGINX_ALLOW",
               "NGINX_EDGE", "RUN_DIR", "REDIS_APPENDFSYNC")


def stack_env(settings=None, scrub=()):
    """The environment for scripts/stack.sh (or a program that runs it): the
    caller's without STACK_SCRUB and scrub, every port "auto", then settings
    (as strings; a value of None removes the variable)."""
    env = {k: v for k, v in os.environ.items() if k not in STACK_SCRUB and k not in scrub}
    env.update({"NGINX_PORT": "auto", "APP_PORT_BASE": "auto", "PG_PORT": "auto",
                "REDIS_PORT": "auto"})
    return with_settings(env, settings or {})


def read_stack_env(run_dir):
    """{NAME: value} of run_dir/stack.env (lines "export NAME='value'")."""
    env = {}
    with open(os.path.join(run_dir, "stack.env")) as f:
        for line in f:
            m = re.match(r"^export (\w+)='(.*)'$", line.strip())
            if m:
                env[m.group(1)] = m.group(2)
    return env


def stack_pids(run_dir):
    """{component: pid} of run_dir/pids/*.pid (the first line is the pid)."""
    out = {}
    d = os.path.join(run_dir, "pids")
    if os.path.isdir(d):
        for f in sorted(os.listdir(d)):
            if f.endswith(".pid"):
                try:
                    with open(os.path.join(d, f)) as fh:
                        out[f[:-4]] = int(fh.readline().strip())
                except (OSError, ValueError):
                    pass
    return out


class Stack:
    """The local stack (scripts/stack.sh: Postgres, Redis, the instances,
    nginx) in a run directory of its own, on free ports.

    Its environment: stack_env(settings, scrub) and RUN_DIR. set() changes
    it for the commands that follow (restart_instances() takes settings too);
    run() and command() take one-off settings as keywords. log, when given,
    receives each line stack.sh writes to stderr."""

    def __init__(self, run_dir, settings=None, scrub=(), log=None):
        self.run_dir = os.path.abspath(run_dir)
        self.env = stack_env(settings, scrub)
        self.env["RUN_DIR"] = self.run_dir
        self.log = log
        self.info = {}          # stack.env after the last start
        self.started = False

    def set(self, settings):
        self.env = with_settings(self.env, settings)

    def run_env(self, **settings):
        """The environment of a command with one-off settings."""
        return with_settings(self.env, settings)

    def run(self, cmd, timeout=120, **settings):
        """scripts/stack.sh cmd; the CompletedProcess, whatever its exit status."""
        try:
            return subprocess.run([STACK_SH, cmd], capture_output=True, text=True,
                                  timeout=timeout, env=self.run_env(**settings), cwd=ROOT)
        except subprocess.TimeoutExpired:
            raise KitError(f"scripts/stack.sh {cmd} did not finish within {timeout}s") from None

    def command(self, cmd, timeout=120, **settings):
        """run(), then KitError unless it exits 0; after a start the env file
        is read (info)."""
        p = self.run(cmd, timeout, **settings)
        if self.log:
            for line in p.stderr.strip().splitlines():
                self.log(line)
        if p.returncode != 0:
            tail = "" if self.log else ":\n" + p.stderr.strip()[-3000:]
            raise KitError(f"scripts/stack.sh {cmd} failed (exit {p.returncode}){tail}")
        if cmd in ("start", "restart", "restart-instances", "rolling-restart"):
            self.started = True
            self.read_env()
        elif cmd == "stop":
            self.started = False
        return p

    def start(self, fresh=False, timeout=180):
        """Starts the stack; fresh: stops one left running in run_dir first
        (a new database)."""
        if fresh:
            self.run("stop")
        self.started = True         # a failed start may leave something to stop
        return self.command("start", timeout)

    def restart_instances(self, settings=None, timeout=180):
        """The instances only, again, with settings applied; Postgres, Redis,
        nginx and the ports stay."""
        self.set(settings or {})
        return self.command("restart-instances", timeout)

    def rolling_restart(self, timeout=180):
        """The instances one at a time (scripts/stack.sh rolling-restart):
        each drains, starts again and is ready before the next one stops."""
        return self.command("rolling-restart", timeout)

    def stop(self, timeout=120):
        return self.command("stop", timeout)

    def read_env(self):
        self.info = read_stack_env(self.run_dir)
        return self.info

    # The running stack's facts, from its env file.
    @property
    def base_url(self):
        return self.info["BASE_URL"]

    @property
    def dsn(self):
        return self.info["PG_DSN"]

    @property
    def token(self):
        return self.info["ADMIN_TOKEN"]

    @property
    def nginx_port(self):
        return int(self.info["NGINX_PORT"])

    @property
    def app_ports(self):
        return [int(p) for p in self.info.get("INSTANCE_PORTS", "").split()]

    @property
    def instance_urls(self):
        return self.info.get("INSTANCE_URLS", "").split()

    def pidfile(self, name):
        return os.path.join(self.run_dir, "pids", f"{name}.pid")

    def pid(self, name):
        """The pid of component name (postgres, redis, nginx, app-N), or None."""
        try:
            with open(self.pidfile(name)) as f:
                return int(f.readline())
        except (OSError, ValueError):
            return None

    def pids(self):
        return stack_pids(self.run_dir)

    def set_pid(self, name, pid):
        """Points the launcher's pid file at a process started again by hand
        (the second line, the command-line pattern stack.sh checks, stays)."""
        path = self.pidfile(name)
        with open(path) as f:
            lines = f.read().splitlines()
        lines[0] = str(pid)
        write_atomic(path, "\n".join(lines) + "\n")

    def admin(self, method, path, body=None, want=None, timeout=HTTP_TIMEOUT):
        """An admin API call through nginx with the stack's token (call())."""
        return call(self.base_url, method, path, body, token=self.token, want=want,
                    timeout=timeout)

    def create_voucher(self, stock, title, ahead=86400):
        """A voucher on sale from a minute ago to ahead seconds from now; its id."""
        r = self.admin("POST", "/admin/vouchers", voucher_body(title, stock, ahead), want=201)
        return int(r.body["voucherId"])

    # Redis under Sentinel (REDIS_HA=1): nodes redis-1..3, Sentinels sentinel-1..3.

    @property
    def redis_ports(self):
        """The ports of redis-1, redis-2, redis-3 (REDIS_HA=1)."""
        return [int(p) for p in self.info.get("REDIS_PORTS", "").split()]

    @property
    def sentinel_ports(self):
        return [int(p) for p in self.info.get("SENTINEL_PORTS", "").split()]

    def sentinel_masters(self):
        """The master's port as each Sentinel names it (None: no answer)."""
        out = []
        for port in self.sentinel_ports:
            try:
                a = redis_cli(port, "SENTINEL", "get-master-addr-by-name",
                              self.info["REDIS_MASTER_NAME"], timeout=2).split()
                out.append(int(a[1]))
            except (KitError, IndexError, ValueError):
                out.append(None)
        return out

    def redis_master(self):
        """(node number 1..3, port) of the master every Sentinel names."""
        ports = set(self.sentinel_masters())
        if len(ports) != 1 or None in ports:
            raise KitError(f"the Sentinels do not agree on the master: {sorted(map(str, ports))}")
        port = ports.pop()
        return self.redis_ports.index(port) + 1, port

    def wait_failover(self, old_port, timeout=30.0):
        """Waits until every Sentinel names a master other than old_port and
        that server says it is one; returns (seconds waited, its port)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            ports = set(self.sentinel_masters())
            if len(ports) == 1 and None not in ports and old_port not in ports:
                port = ports.pop()
                if redis_role(port) == "master":
                    return time.monotonic() - t0, port
            time.sleep(0.05)
        raise KitError(f"no failover away from port {old_port} within {timeout}s")

    def wait_replica(self, port, timeout=30.0):
        """Waits until the Redis on port is a replica whose link to its master is up."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if "master_link_status:up" in redis_cli(port, "INFO", "replication", timeout=2):
                    return
            except KitError:
                pass
            time.sleep(0.1)
        raise KitError(f"Redis on port {port} is not a replica in sync within {timeout}s")

    def wait_sentinels_see(self, port, timeout=30.0):
        """Waits until every Sentinel lists the Redis on port as a replica in
        good standing (flags "slave" only, its link to the master ok), so that
        a failover may promote it."""
        deadline = time.monotonic() + timeout
        name = self.info["REDIS_MASTER_NAME"]
        while time.monotonic() < deadline:
            ok = 0
            for sp in self.sentinel_ports:
                try:
                    lines = redis_cli(sp, "SENTINEL", "replicas", name, timeout=2).splitlines()
                except KitError:
                    break
                # Flat name/value lines, one block per replica.
                blocks, cur = [], {}
                for k, v in zip(lines[0::2], lines[1::2]):
                    if k == "name" and cur:
                        blocks.append(cur)
                        cur = {}
                    cur[k] = v
                if cur:
                    blocks.append(cur)
                if any(b.get("port") == str(port) and b.get("flags") == "slave" and
                       b.get("master-link-status") == "ok" for b in blocks):
                    ok += 1
            if ok == len(self.sentinel_ports):
                return
            time.sleep(0.2)
        raise KitError(f"the Sentinels do not see the Redis on port {port} as a healthy "
                       f"replica within {timeout}s")

    def restart_redis_node(self, n, master_port, timeout=30.0):
        """Starts node n (redis-n, stopped or killed) again as scripts/stack.sh
        does, as a replica of master_port, points its pid file at it and
        waits until it is in sync. Returns the Popen (the caller reaps it)."""
        port = self.redis_ports[n - 1]
        d = os.path.join(self.run_dir, f"redis-{n}")
        p = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--dir", d, "--logfile",
             os.path.join(d, "redis.log"), "--protected-mode", "yes", "--replicaof",
             "127.0.0.1", str(master_port)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        self.set_pid(f"redis-{n}", p.pid)
        self.wait_replica(port, timeout)
        return p


def redis_cli(port, *args, timeout=5):
    """redis-cli -p port args... on 127.0.0.1 (raw output, stripped); KitError
    when it fails or cannot connect."""
    p = run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), "--raw"] + [str(a) for a in args],
            timeout, check=False)
    out = p.stdout.strip()
    if p.returncode != 0 or "Could not connect" in p.stderr + out:
        raise KitError(f"redis-cli -p {port} {' '.join(map(str, args))}: "
                       f"{(p.stderr or out).strip()}")
    return out


def redis_role(port):
    """"master", "slave", or None when the Redis on port does not answer."""
    try:
        return redis_cli(port, "ROLE", timeout=2).split()[0]
    except (KitError, IndexError):
        return None


def stream_unsettled(cli, stream="seckill:orders", group="seckill"):
    """(unsettled, pending) of the Redis-first orders stream: the entries the
    consumers' group has not acknowledged yet (delivered and pending, or not
    delivered), and the pending ones alone. The consumers leave settled
    entries in the stream until lua/stream_trim.lua removes them, so XLEN is
    not this. cli(*args) runs redis-cli --raw and returns its output."""
    out = cli("XINFO", "GROUPS", stream)
    if "no such key" in out:
        return 0, 0
    groups, g = [], None
    lines = out.split("\n")
    for k, v in zip(lines[0::2], lines[1::2] + [""]):
        if k == "name":
            g = {}
            groups.append(g)
        if g is not None:
            g[k] = v
    mine = [x for x in groups if x.get("name") == group]
    if not mine:                      # no consumer yet: nothing delivered
        return int(cli("XLEN", stream) or 0), 0
    g = mine[0]
    pending = int(g.get("pending") or 0)
    if (g.get("lag") or "").isdigit():
        return pending + int(g["lag"]), pending
    # Redis cannot tell the lag (XDEL'd entries past the group's position).
    later = cli("XRANGE", stream, "(" + g["last-delivered-id"], "+", "COUNT", "1000000000")
    return pending + sum(1 for line in later.split("\n") if re.match(r"^\d+-\d+$", line)), pending


def redis_info_count(port, section, prefix, field):
    """A count from INFO section: field=N of the line starting with prefix
    (e.g. "commandstats", "cmdstat_evalsha:", "calls"); 0 when absent."""
    for line in redis_cli(port, "INFO", section).splitlines():
        if line.startswith(prefix):
            for kv in line.split(":", 1)[1].split(","):
                k, _, v = kv.partition("=")
                if k == field:
                    return int(v)
    return 0


def start_nginx(prefix, port, upstreams, extra_conf="", gen_args=(), timeout=30, gen_conf=GEN_CONF):
    """gen_conf's configuration (nginx/gen-conf.sh, with gen_args) in directory prefix
    (made if need be), listening on 127.0.0.1:port in front of upstreams
    ("host:port"), with extra_conf (e.g. another server block) added at the
    end of its http block; nginx started on it as a daemon. Returns its
    master's pid. KitError on any failure."""
    os.makedirs(prefix, exist_ok=True)
    conf = os.path.join(prefix, "nginx.conf")
    gen = [gen_conf, "--prefix", prefix, "--listen", f"127.0.0.1:{port}", "-o", conf]
    for u in upstreams:
        gen += ["--upstream", u]
    # The caller's NGINX_ALLOW and NGINX_EDGE would change gen-conf.sh's
    # defaults (the allow-list, the sold-out edge): gen_args say so instead.
    run(gen + list(gen_args), timeout,
        env=with_settings(os.environ, {"NGINX_ALLOW": None, "NGINX_EDGE": None}))
    if extra_conf:
        with open(conf) as f:
            text = f.read().rstrip()
        if not text.endswith("}"):
            raise KitError(f"{conf} does not end with the http block's '}}'")
        with open(conf, "w") as f:
            f.write(text[:-1] + extra_conf + "}\n")
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    errlog = os.path.join(prefix, "error.log")
    run([nginx, "-t", "-q", "-p", prefix, "-c", conf, "-e", errlog], timeout)
    run([nginx, "-p", prefix, "-c", conf, "-e", errlog, "-g", "daemon on;"], timeout)
    deadline = time.monotonic() + 5
    while True:
        try:
            with open(os.path.join(prefix, "nginx.pid")) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                raise KitError(f"nginx in {prefix} wrote no pid file") from None
            time.sleep(0.05)


# ------------------------------------------------------------------ psql

def psql(dsn, sql, timeout=60):
    """Runs SQL (on stdin, so it may be long and hold several statements, each
    its own transaction; the first error stops it) against dsn; returns the
    rows of every result as lists of strings. KitError when psql fails."""
    cmd = ["psql", "-X", "-q", "-A", "-t", "-F", "\t", "-v", "ON_ERROR_STOP=1",
           "-d", dsn, "-f", "-"]
    try:
        p = subprocess.run(cmd, input=sql, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise KitError("psql not found (apt-get install postgresql-client)") from None
    except subprocess.TimeoutExpired:
        raise KitError(f"psql did not answer within {timeout}s") from None
    if p.returncode != 0:
        raise KitError(f"psql failed: {p.stderr.strip()}")
    return [line.split("\t") for line in p.stdout.splitlines() if line != ""]


def psql_value(dsn, sql, timeout=60):
    """The one value sql returns (a string); KitError unless exactly one."""
    rows = psql(dsn, sql, timeout)
    if len(rows) != 1 or len(rows[0]) != 1:
        raise KitError(f"expected one value from {sql!r}, got {rows!r}")
    return rows[0][0]


# ------------------------------------------------------------------ HTTP

Response = namedtuple("Response", "status headers body raw")
Response.__doc__ = """status; headers (names in lower case); body: the parsed JSON
when the answer is JSON, else its text; raw: the bytes."""


def _address(where):
    """(host, port, path prefix) of a port on 127.0.0.1 or a base URL."""
    if isinstance(where, int):
        return "127.0.0.1", where, ""
    u = urllib.parse.urlsplit(where)
    return u.hostname, u.port or 80, u.path.rstrip("/")


def encode_body(body, headers):
    """The bytes of a request body: a dict or list as JSON (and its
    Content-Type in headers), a str as UTF-8, bytes as they are."""
    if body is None:
        return None
    if isinstance(body, (dict, list)):
        headers.setdefault("Content-Type", "application/json")
        return json.dumps(body).encode()
    if isinstance(body, str):
        return body.encode()
    return body


def make_response(status, header_items, raw):
    """A Response from a status, (name, value) header pairs and the body's bytes."""
    headers = {k.lower(): v for k, v in header_items}
    text = raw.decode("utf-8", "replace")
    body = text
    if "json" in headers.get("content-type", "") or text[:1] in ("{", "["):
        try:
            body = json.loads(text)
        except ValueError:
            pass
    return Response(status, headers, body, raw)


def request(where, method, path="", headers=None, body=None, timeout=HTTP_TIMEOUT):
    """One request on a fresh connection to where: a port on 127.0.0.1 or a
    base URL ("http://host:port"); body: a dict or list (sent as JSON), str
    or bytes. Returns a Response. Transport errors (refused, timeout, reset)
    raise OSError or http.client.HTTPException."""
    host, port, prefix = _address(where)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        headers = dict(headers or {})
        data = encode_body(body, headers)
        conn.request(method, prefix + path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        return make_response(resp.status, resp.getheaders(), raw)
    finally:
        conn.close()


def call(where, method, path="", body=None, token=None, want=None, timeout=HTTP_TIMEOUT,
         headers=None):
    """request() for the tools: with token, "Authorization: Bearer token";
    a transport error, or a status other than want (when given), is a KitError."""
    headers = dict(headers or {})
    if token:
        headers["Authorization"] = f"Bearer {token}"
    url = (f"http://127.0.0.1:{where}" if isinstance(where, int) else where) + path
    try:
        r = request(where, method, path, headers, body, timeout)
    except (OSError, http.client.HTTPException) as e:
        raise KitError(f"{method} {url}: {type(e).__name__}: {e}") from None
    if want is not None and r.status != want:
        raise KitError(f"{method} {url}: HTTP {r.status} {r.body!r} (want {want})")
    return r


class Client:
    """A keep-alive connection (one per thread). A transport error closes it
    and is raised; the next request connects again."""

    def __init__(self, where, timeout=HTTP_TIMEOUT):
        self.host, self.port, self.prefix = _address(where)
        self.timeout = timeout
        self.conn = None

    def connect(self):
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            self.conn.connect()
        return self

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def request(self, method, path, headers=None, body=None):
        headers = dict(headers or {})
        data = encode_body(body, headers)
        try:
            self.connect()
            self.conn.request(method, self.prefix + path, body=data, headers=headers)
            resp = self.conn.getresponse()
            raw = resp.read()
        except Exception:
            self.close()
            raise
        if resp.will_close:
            self.close()
        return make_response(resp.status, resp.getheaders(), raw)

    def seckill(self, voucher_id, user_id):
        return self.request("POST", f"/voucher/{voucher_id}/seckill", {"X-User-Id": str(user_id)})


def voucher_body(title, stock, ahead=3600):
    """The body of POST /admin/vouchers for a sale that began a minute ago and
    ends ahead seconds from now."""
    now = int(time.time())

    def iso(t):
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
    return {"title": title, "stock": stock, "beginTime": iso(now - 60), "endTime": iso(now + ahead)}


# ------------------------------------------------------------------ load tools

def parse_ab(text):
    """The figures of ab's report: requests, failed (with -l: transport
    failures only), non2xx, seconds, rps, p50Ms and p99Ms (ab's own
    percentiles, whole ms; None when it printed none)."""
    def num(pattern, cast=float, default=None):
        m = re.search(pattern, text, re.M)
        return cast(m.group(1)) if m else default
    return {
        "requests": num(r"^Complete requests:\s+(\d+)", int, 0),
        "failed": num(r"^Failed requests:\s+(\d+)", int, 0),
        "non2xx": num(r"^Non-2xx responses:\s+(\d+)", int, 0),
        "seconds": num(r"^Time taken for tests:\s+([\d.]+)", float, 0.0),
        "rps": num(r"^Requests per second:\s+([\d.]+)", float, 0.0),
        "p50Ms": num(r"^\s+50%\s+(\d+)"),
        "p99Ms": num(r"^\s+99%\s+(\d+)"),
    }


def ab_times(path):
    """Per-request total times (ms) from an ab -g file (its fifth column)."""
    out = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            next(f, None)                       # header
            for line in f:
                cols = line.rstrip("\n").split("\t")
                if len(cols) >= 5:
                    try:
                        out.append(float(cols[4]))
                    except ValueError:
                        pass
    except OSError:
        pass
    return out


def parse_wrk(summary, stdout=None):
    """The figures of a wrk run with loadtest/wrk_sale.lua, from its summary
    (WRK_SUMMARY: the dict, or the file's path): requests, seconds, rps,
    p50Ms/p90Ms/p99Ms/maxMs (wrk's own percentiles), statuses {"200": n},
    socketErrors {connect, read, write, timeout}, errors (their sum),
    nonHttpErrors, orderIds, okWithoutOrderId. rps is wrk's "Requests/sec"
    when its stdout is given, else requests / seconds."""
    if isinstance(summary, str):
        with open(summary, encoding="utf-8") as f:
            summary = json.load(f)
    secs = summary["durationUs"] / 1e6 if summary.get("durationUs") else 0.0
    e = summary.get("errors", {})
    lat = summary.get("latencyUs", {})
    requests = summary.get("requests", 0)
    m = re.search(r"^Requests/sec:\s+([\d.]+)", stdout or "", re.M)
    sock = {k: int(e.get(k, 0)) for k in ("connect", "read", "write", "timeout")}
    r = {"requests": requests, "seconds": secs,
         "rps": float(m.group(1)) if m else (requests / secs if secs else 0.0),
         "statuses": {str(k): int(v) for k, v in summary.get("statuses", {}).items()},
         "socketErrors": sock, "errors": sum(sock.values()),
         "nonHttpErrors": int(e.get("status", 0)),
         "orderIds": summary.get("orderIds"), "okWithoutOrderId": summary.get("okWithoutOrderId", 0)}
    for k in ("p50", "p90", "p99", "max"):
        r[k + "Ms"] = lat[k] / 1000.0 if k in lat else None
    return r


def run_wrk(url, connections, seconds, out_dir, user_base, threads=2, timeout="10s",
            latency=True, ids=True, delay_ms=0):
    """wrk with loadtest/wrk_sale.lua (a new X-User-Id from user_base on per
    request; the order ids of the 200s written to out_dir/wrk-ids.txt when
    ids) against url for seconds. Returns parse_wrk()'s figures plus "cmd"
    (the command line) and "idsFile". KitError when wrk fails."""
    summary = os.path.join(out_dir, "wrk-summary.json")
    ids_file = os.path.join(out_dir, "wrk-ids.txt")
    for f in (summary, ids_file):
        if os.path.exists(f):
            os.unlink(f)
    env = dict(os.environ, WRK_USER_BASE=str(user_base), WRK_SUMMARY=summary,
               WRK_IDS_FILE=ids_file if ids else "", WRK_DELAY_MS=str(delay_ms) if delay_ms else "")
    cmd = ["wrk", "-t", str(min(threads, connections)), "-c", str(connections),
           "-d", f"{int(seconds)}s", "--timeout", timeout]
    if latency:
        cmd.append("--latency")
    cmd += ["-s", WRK_LUA, url]
    p = run(cmd, seconds + 60, env=env)
    if not os.path.exists(summary):
        raise KitError(f"wrk wrote no summary:\n{p.stdout[-500:]}{p.stderr[-500:]}")
    r = parse_wrk(summary)
    r["cmd"] = cmd
    r["idsFile"] = ids_file if ids else None
    return r


# nginx's "seckill" log_format (nginx/nginx.conf.tmpl): [time] "request"
# status bytes rid=... up=upstream(s) us=... rt=request_time ...
ACCESS_RE = re.compile(r'\[([^\]]+)\] "(\S+) (\S+)[^"]*" (\d{3}) \d+ .*? up=(.*?) us=.*? rt=([\d.]+)')
AccessEntry = namedtuple("AccessEntry", "time method uri status upstream seconds")


def access_log(path, offset=0, uri=None):
    """(the text of nginx's access log from byte offset on, its entries for
    uri (all when None): AccessEntry(time (ISO 8601), method, uri, status,
    upstream (the last one tried), seconds ($request_time)))."""
    with open(path, "rb") as f:
        f.seek(offset)
        text = f.read().decode("utf-8", "replace")
    entries = []
    for line in text.splitlines():
        m = ACCESS_RE.search(line)
        if m and (uri is None or m.group(3) == uri):
            entries.append(AccessEntry(m.group(1), m.group(2), m.group(3), m.group(4),
                                       m.group(5).split(",")[-1].strip(), float(m.group(6))))
    return text, entries


# The name the tables give the answers nginx sent itself, without an instance:
# $upstream_addr is "-" (the sold-out edge's 409s, nginx's own 413, 404, 405)
# or the upstream group's name (a 502 when no instance was left to try), not
# an address.
NGINX_EDGE = "nginx-edge"


def answered_by(upstream, names=None):
    """Who answered an access-log entry whose upstream (AccessEntry.upstream)
    is this: NGINX_EDGE when nginx answered itself (no "host:port" or
    "unix:path"), else the instance's name from names ({"host:port": name}),
    else the address."""
    if ":" not in upstream:
        return NGINX_EDGE
    return (names or {}).get(upstream, upstream)


# ------------------------------------------------------------------ figures

def percentile(values, q):
    """The q-th percentile (0 <= q <= 100) of values by the nearest-rank
    method: the smallest value with at least q % of all values at or below
    it, i.e. the ceil(q/100 * n)-th smallest (the smallest for q = 0). Always
    one of the values, never interpolated; None for no values."""
    if not values:
        return None
    v = sorted(values)
    k = max(0, min(len(v) - 1, math.ceil(q * len(v) / 100) - 1))
    return v[k]


def fmt_count(v):
    """A count or rate, whole, with thousands separators; "-" for None."""
    if v is None:
        return "-"
    return f"{int(round(v)):,}"


def fmt_ms(v):
    """Milliseconds: whole from 10 up, one decimal below; "-" for None."""
    if v is None:
        return "-"
    return f"{v:.0f}" if abs(v) >= 10 else f"{v:.1f}"


Col = namedtuple("Col", "title align width gap fit", defaults=("l", 0, 2, True))
Col.__doc__ = """A column of table(): title; align "l" or "r"; width: at least
this many characters; gap: spaces before it (not before the first); fit: the
column is as wide as its widest cell (False: each cell is padded to width on
its own and a longer one pushes the rest of its line right, as a format spec
does)."""


def table(cols, rows, header=True):
    """Lines of text: the titles (unless header is False), then one line per
    row. A row is a list of cells (str() of each), or a str printed as it is
    (a note between the rows). Trailing blanks are cut."""
    cells = [[str(c) for c in r] for r in rows if not isinstance(r, str)]
    widths = []
    for i, c in enumerate(cols):
        w = c.width
        if c.fit:
            w = max([w, len(c.title) if header else 0] + [len(r[i]) for r in cells if i < len(r)])
        widths.append(w)

    def line(vals):
        out = []
        for i, (c, v) in enumerate(zip(cols, vals)):
            s = str(v)
            out.append((" " * c.gap if i else "")
                       + (s.rjust(widths[i]) if c.align == "r" else s.ljust(widths[i])))
        return "".join(out).rstrip()
    out = [line([c.title for c in cols])] if header else []
    for r in rows:
        out.append(r if isinstance(r, str) else line(r))
    return "\n".join(out)
