"""The local stack: Stack runs scripts/stack.sh in a RUN_DIR of its own
(start, stop, restart-instances with other settings, rolling-restart, a
service stopped and started, its env file, PIDs; with REDIS_HA=1 the
Sentinels' master, a failover awaited, a node restarted as a replica);
stack_env() is the environment it runs in."""

import os
import re
import subprocess
import time

from .base import HTTP_TIMEOUT, ROOT, KitError
from .http import call, voucher_body
from .proc import wait_for, with_settings, write_atomic
from .redis import redis_cli, redis_role, start_redis_server, wait_replica

STACK_SH = os.path.join(ROOT, "scripts", "stack.sh")

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


def _replica_blocks(lines):
    """SENTINEL replicas' flat name/value lines as one dict per replica."""
    blocks, cur = [], {}
    for k, v in zip(lines[0::2], lines[1::2]):
        if k == "name" and cur:
            blocks.append(cur)
            cur = {}
        cur[k] = v
    if cur:
        blocks.append(cur)
    return blocks


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

    def run(self, cmd, timeout=120, args=(), **settings):
        """scripts/stack.sh cmd args...; the CompletedProcess, whatever its
        exit status."""
        try:
            return subprocess.run([STACK_SH, cmd, *args], capture_output=True, text=True,
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

    def service(self, what, name, timeout=90):
        """scripts/stack.sh service-stop|service-start NAME (what: stop or
        start): one service of the running stack, on the same port."""
        p = self.run(f"service-{what}", timeout, args=(name,))
        if p.returncode != 0:
            raise KitError(f"stack.sh service-{what} {name}: {p.stderr.strip()[-800:]}")

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

    def redis_cli(self, *args, timeout=60):
        """redis_cli() against the stack's Redis (REDIS_URL)."""
        return redis_cli(self.info["REDIS_URL"], *args, timeout=timeout)

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

        def moved():
            ports = set(self.sentinel_masters())
            if len(ports) == 1 and None not in ports and old_port not in ports:
                port = ports.pop()
                return port if redis_role(port) == "master" else None
            return None
        port = wait_for(moved, timeout, f"a failover away from port {old_port}")
        return time.monotonic() - t0, port

    def wait_replica(self, port, timeout=30.0):
        """Waits until the Redis on port is a replica whose link to its master is up."""
        wait_replica(port, timeout)

    def _sentinel_sees(self, sentinel, port):
        """Does the Sentinel on port sentinel list the Redis on port as a
        replica in good standing?"""
        lines = redis_cli(sentinel, "SENTINEL", "replicas", self.info["REDIS_MASTER_NAME"],
                          timeout=2).splitlines()
        return any(b.get("port") == str(port) and b.get("flags") == "slave" and
                   b.get("master-link-status") == "ok" for b in _replica_blocks(lines))

    def wait_sentinels_see(self, port, timeout=30.0):
        """Waits until every Sentinel lists the Redis on port as a replica in
        good standing (flags "slave" only, its link to the master ok), so that
        a failover may promote it."""
        wait_for(lambda: all(self._sentinel_sees(sp, port) for sp in self.sentinel_ports),
                 timeout, f"the Sentinels to see the Redis on port {port} as a healthy replica",
                 poll=0.2, errors=(KitError,))

    def restart_redis_node(self, n, master_port, timeout=30.0):
        """Starts node n (redis-n, stopped or killed) again as scripts/stack.sh
        does, as a replica of master_port, points its pid file at it and
        waits until it is in sync. Returns the Popen (the caller reaps it)."""
        port = self.redis_ports[n - 1]
        p = start_redis_server(port, os.path.join(self.run_dir, f"redis-{n}"), "--appendonly", "no",
                               "--replicaof", "127.0.0.1", str(master_port))
        self.set_pid(f"redis-{n}", p.pid)
        self.wait_replica(port, timeout)
        return p
