"""A throwaway Redis Cluster for a test file (scripts/redis-cluster.sh under
$TEST_TMP, 3 masters and 3 replicas on free loopback ports, every node
registered with run.sh by PID) and what the cluster tests ask of it: the
nodes' ports and roles, key slots, the slot map, the master of a slot, a
slot migrated by hand. Python 3 standard library only.

    C = cluster_kit.Cluster("test_x", REDIS_CLUSTER_APPENDFSYNC="always")
    C.nodes_line()            # started at the first call: REDIS_CLUSTER_NODES
    C.master_of_key("k")      # (node number, port)
"""

import binascii
import os
import subprocess
import time

import seckill_server as ss
from seckill_server import fail

SCRIPT = os.path.join(ss.ROOT, "scripts", "redis-cluster.sh")
NODES = 6
# The caller's settings that would change the cluster's shape or timing.
SCRUB = ("REDIS_CLUSTER_MASTERS", "REDIS_CLUSTER_REPLICAS", "REDIS_CLUSTER_NODE_TIMEOUT_MS",
         "REDIS_CLUSTER_APPENDFSYNC")


def cli(port, *args, timeout=10):
    """redis-cli (no -c unless asked) against 127.0.0.1:port: its output
    (raw: stdout is not a terminal), stripped."""
    try:
        p = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), *map(str, args)],
                           capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        fail(f"redis-cli -p {port} {args} outlived {timeout}s")
    return (p.stdout + p.stderr).strip()


def node_id(port):
    return cli(port, "CLUSTER", "MYID")


def id_key(t=None):
    """The day's order id counter (ID_PREFIX "order") of Unix time t (now)."""
    return "icr:order:" + time.strftime("%Y:%m:%d", time.gmtime(t))


def key_slot(key):
    """The key's hash slot computed here: CRC16 (XMODEM) of its hash tag
    (the first {...} with something inside) or of the whole key, mod 16384."""
    s = key.find("{")
    if s >= 0:
        e = key.find("}", s + 1)
        if e > s + 1:
            key = key[s + 1:e]
    return binascii.crc_hqx(key.encode(), 0) % 16384


class Cluster:
    """One test file's cluster, under $TEST_TMP/cluster-NAME-PID; env: the
    settings of scripts/redis-cluster.sh (REDIS_CLUSTER_APPENDFSYNC, ...)."""

    def __init__(self, name, **env):
        self.dir = os.path.join(ss.TEST_TMP, f"cluster-{name}-{os.getpid()}")
        self.env = {k: v for k, v in os.environ.items() if k not in SCRUB}
        self.env.update({"REDIS_CLUSTER_TIMEOUT": "120"}, **env)
        self.line = None
        self.ports = {}

    def ctl(self, what, *args, timeout=300):
        """scripts/redis-cluster.sh what DIR args...: its stdout, stripped."""
        try:
            p = subprocess.run([SCRIPT, what, self.dir, *map(str, args)], capture_output=True,
                               text=True, timeout=timeout, env=self.env,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            fail(f"redis-cluster.sh {what} {args} outlived {timeout}s")
        if p.returncode != 0:
            fail(f"redis-cluster.sh {what} {args}: exit {p.returncode}: {p.stderr.strip()}")
        return p.stdout.strip()

    def nodes_line(self):
        """REDIS_CLUSTER_NODES of the cluster, started at the first call."""
        if self.line is None:
            t0 = time.monotonic()
            line = self.ctl("start").splitlines()[-1]
            print(f"# cluster started in {time.monotonic() - t0:.1f} s", flush=True)
            for i in range(1, NODES + 1):
                ss.register_pid(int(self.ctl("pid", i)))
            self.line = line.split("=", 1)[1]
        return self.line

    def started(self):
        return self.line is not None

    def port_of(self, i):
        if i not in self.ports:
            self.ports[i] = int(self.ctl("port", i))   # a node keeps its port across restarts
        return self.ports[i]

    def node_of_port(self, port):
        return next(i for i in range(1, NODES + 1) if self.port_of(i) == port)

    def masters(self):
        """{node number: port} of the masters now."""
        self.nodes_line()
        return {i: self.port_of(i) for i in range(1, NODES + 1) if self.ctl("role", i) == "master"}

    def kill_until_promoted(self, victim, slot, timeout):
        """kill -9 of node victim, then waits until another node is master of
        slot: (the kill's monotonic time, the promotion's)."""
        self.ctl("kill", victim)            # returns once the node is gone
        t_kill = time.monotonic()
        ss.wait_for(lambda: int(self.ctl("master-of", slot)) != victim, timeout,
                    "the replica promoted")
        return t_kill, time.monotonic()

    def replica_of(self, port):
        """Node number of the first replica of the master on 'port'."""
        for line in cli(port, "INFO", "replication").splitlines():
            if line.startswith("slave0:"):
                return self.node_of_port(int(line.split("port=")[1].split(",")[0]))
        fail(f"the master on {port} has no replica")

    def slot_of(self, key):
        """CLUSTER KEYSLOT, asked of the first live node."""
        for i in range(1, NODES + 1):
            out = cli(self.port_of(i), "CLUSTER", "KEYSLOT", key)
            if out.isdigit():
                return int(out)
        fail(f"no node answers CLUSTER KEYSLOT {key}")

    def slot_map(self):
        """[(first, last, master port)] as CLUSTER NODES of the first live
        node says now."""
        for i in range(1, NODES + 1):
            out = cli(self.port_of(i), "CLUSTER", "NODES")
            ranges = []
            for line in out.splitlines():
                f = line.split()
                if len(f) < 8 or "master" not in f[2].split(",") or "fail" in f[2]:
                    continue
                port = int(f[1].split("@")[0].rsplit(":", 1)[1])
                for r in f[8:]:
                    if not r.startswith("["):
                        lo, _, hi = r.partition("-")
                        ranges.append((int(lo), int(hi or lo), port))
            if ranges:
                return ranges
        fail("no node answers CLUSTER NODES")

    def master_of_slot(self, slot, ranges=None):
        """(node number, port) of the master that serves the slot now (or in
        'ranges', a slot_map() read before)."""
        port = next((p for lo, hi, p in (ranges or self.slot_map()) if lo <= slot <= hi), None)
        if port is None:
            fail(f"no master serves slot {slot}")
        return self.node_of_port(port), port

    def master_of_key(self, key, ranges=None):
        """(node number, port) of the master that serves key's slot: asked of
        the cluster (CLUSTER KEYSLOT) when no 'ranges' are given, else
        computed here."""
        slot = self.slot_of(key) if ranges is None else key_slot(key)
        return self.master_of_slot(slot, ranges)


# A slot moved by hand, as redis-cli --cluster reshard moves it
# (https://redis.io/docs/reference/cluster-spec/#live-reconfiguration).

def migrate_slot_begin(slot, src, dst):
    """CLUSTER SETSLOT IMPORTING on master port dst, then MIGRATING on src."""
    for port, args in ((dst, ("IMPORTING", node_id(src))), (src, ("MIGRATING", node_id(dst)))):
        out = cli(port, "CLUSTER", "SETSLOT", slot, *args)
        if out != "OK":
            fail(f"SETSLOT {slot} {args} on {port}: {out}")


def migrate_keys(slot, src, dst):
    """MIGRATE every key of the slot still on the source; the keys moved."""
    moved = []
    while True:
        keys = cli(src, "CLUSTER", "GETKEYSINSLOT", slot, 100).split()
        if not keys:
            return moved
        out = cli(src, "MIGRATE", "127.0.0.1", dst, "", 0, 5000, "KEYS", *keys, timeout=30)
        if out not in ("OK", "NOKEY"):
            fail(f"MIGRATE {keys}: {out}")
        moved += keys


def migrate_slot_end(slot, src, dst, others):
    """The keys still on the source moved, then the slot given to dst on
    every master (dst, src and the ports in others)."""
    did = node_id(dst)
    migrate_keys(slot, src, dst)
    for port in (dst, src, *others):
        out = cli(port, "CLUSTER", "SETSLOT", slot, "NODE", did)
        if out != "OK":
            fail(f"SETSLOT {slot} NODE on {port}: {out}")
