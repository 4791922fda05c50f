"""Redis through its client: redis_cli() (the one wrapper of redis-cli: a
port on 127.0.0.1 or a redis:// URL), redis_role(), redis_info_count();
start_redis_server() and wait_replica(); set_aof() (AOF on with an
appendfsync, or off); the Redis-first orders stream: stream_unsettled() and
drain_stream()."""

import os
import re
import subprocess
import time

from .base import KitError
from .proc import run, wait_for


def _target(where):
    """redis-cli's arguments for where: a redis:// URL, else a port on 127.0.0.1."""
    if isinstance(where, str) and "://" in where:
        return ["-u", where]
    return ["-h", "127.0.0.1", "-p", str(where)]


def redis_cli(where, *args, timeout=5):
    """redis-cli --raw args... against where (a port on 127.0.0.1, or a
    redis:// URL); its output, stripped. KitError when it fails, cannot
    connect or outlives timeout seconds."""
    target = _target(where)
    args = [str(a) for a in args]
    p = run(["redis-cli", *target, "--raw", *args], timeout, check=False)
    out = p.stdout.strip()
    if p.returncode != 0 or "Could not connect" in p.stderr + out:
        raise KitError(f"redis-cli {' '.join(target[1:] if target[0] == '-u' else target[2:])} "
                       f"{' '.join(args)}: {(p.stderr or out).strip()}")
    return out


def redis_role(port):
    """"master", "slave", or None when the Redis on port does not answer."""
    try:
        return redis_cli(port, "ROLE", timeout=2).split()[0]
    except (KitError, IndexError):
        return None


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


def start_redis_server(port, directory, *args, env=None):
    """redis-server on 127.0.0.1:port in a session of its own, its files and
    redis.log in directory, no snapshots, with args (e.g. "--appendonly",
    "no", "--replicaof", ...). Returns the Popen (the caller reaps it)."""
    return subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "", *args,
         "--daemonize", "no", "--dir", directory, "--logfile", os.path.join(directory, "redis.log"),
         "--protected-mode", "yes"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, env=env)


def wait_replica(port, timeout=30.0, proc=None):
    """Waits until the Redis on port is a replica whose link to its master is
    up; KitError after timeout seconds, or at once when proc (its Popen) has
    exited."""
    def synced():
        if proc is not None and proc.poll() is not None:
            raise KitError(f"the Redis on port {port} exited (exit {proc.returncode})")
        try:
            return "master_link_status:up" in redis_cli(port, "INFO", "replication", timeout=2)
        except KitError:
            return False
    wait_for(synced, timeout, f"the Redis on port {port} to be a replica in sync", poll=0.1)


def set_aof(cli, appendfsync, timeout=60):
    """The Redis behind cli (cli(*args): redis-cli's output) with appendonly
    yes and that appendfsync (always, everysec), once it has written its AOF;
    appendfsync None: without AOF again."""
    if appendfsync is None:
        cli("CONFIG", "SET", "appendonly", "no")
        return

    def written():
        info = cli("INFO", "persistence")
        return "aof_enabled:1" in info and "aof_rewrite_in_progress:0" in info
    cli("CONFIG", "SET", "appendfsync", appendfsync)
    cli("CONFIG", "SET", "appendonly", "yes")
    wait_for(written, timeout, "Redis to switch its AOF on", poll=0.1)


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


def drain_stream(cli, timeout, poll=0.05):
    """Seconds until the orders stream has nothing unsettled
    (stream_unsettled()); KitError after timeout seconds."""
    t0 = time.monotonic()
    left = [None]

    def drained():
        backlog, pending = stream_unsettled(cli)
        left[0] = backlog
        return backlog == 0 and pending == 0
    try:
        wait_for(drained, timeout, "the stream to drain", poll)
    except KitError:
        raise KitError(f"the stream did not drain within {timeout}s ({left[0]} left)") from None
    return time.monotonic() - t0
