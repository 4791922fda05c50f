#!/usr/bin/env python3
"""scripts/redis-cluster.sh: a throwaway Redis Cluster (redis-server 7.0,
3 masters and 3 replicas on 127.0.0.1), started once for this program under
$TEST_TMP, its nodes registered with tests/run.sh.

- start: six nodes, every listening socket of theirs (client port and
  cluster bus) on 127.0.0.1 only (ss -Hltnp), 3 masters and 3 replicas
  (ROLE, and the script's role), every node cluster_state:ok with all 16384
  slots, three slot ranges that cover 0..16383, each with a replica; start
  prints the REDIS_CLUSTER_NODES line and nothing else, and nodes prints the
  same line;
- it is a cluster: two keys of different slots in one MSET get CROSSSLOT
  (the same keys under one hash tag do not); a plain redis-cli (no -c) asked
  for a key another master owns gets MOVED <slot> 127.0.0.1:<its owner's
  port>, and the owner answers;
- failover: kill of the master of a slot (a key in it acknowledged by its
  replica with WAIT): within 60 s master-of names the former replica, which
  has the key; start-node brings the killed node back, and role says slave,
  of the promoted node, its link up;
- stop: the six node processes, alive before, are all gone after, pid
  exits 1 for each, and their ports listen no more.

Prints "N passed, M failed". Python 3 standard library only.
"""

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seckill_server as ss  # noqa: E402
from seckill_server import fail, test  # noqa: E402

SCRIPT = os.path.join(ss.ROOT, "scripts", "redis-cluster.sh")
DIR = os.path.join(ss.TEST_TMP, f"cluster-test_cluster_script-{os.getpid()}")
# The machine may be busy (two cores, other test runs): generous bounds.
ENV = dict(os.environ, REDIS_CLUSTER_TIMEOUT="120")
for _k in ("REDIS_CLUSTER_MASTERS", "REDIS_CLUSTER_REPLICAS", "REDIS_CLUSTER_NODE_TIMEOUT_MS",
           "REDIS_CLUSTER_APPENDFSYNC"):
    ENV.pop(_k, None)
NODES = 6
FAILOVER_TIMEOUT = 60     # seconds: node timeout 3 s, then the election
CLUSTER = {}


def run(*args, timeout=300):
    """scripts/redis-cluster.sh args...; the CompletedProcess (text)."""
    try:
        return subprocess.run([SCRIPT, *[str(a) for a in args]], capture_output=True, text=True,
                              timeout=timeout, env=ENV, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        fail(f"redis-cluster.sh {' '.join(map(str, args))} outlived {timeout}s")


def ctl(what, *args, timeout=300):
    """redis-cluster.sh what DIR args...: its stdout (stripped); a failure
    when it exits non-zero."""
    p = run(what, DIR, *args, timeout=timeout)
    if p.returncode != 0:
        fail(f"redis-cluster.sh {what} {' '.join(map(str, args))}: exit {p.returncode}: "
             f"{p.stderr.strip()}")
    return p.stdout.strip()


def log_tail(i, lines=20):
    return ss.tail(os.path.join(DIR, f"node-{i}", "redis.log"), lines)


def register(i):
    pid = int(ctl("pid", i))
    ss.register_pid(pid)
    return pid


def cluster():
    """{"stdout": start's stdout, "line": the REDIS_CLUSTER_NODES line,
    "ports": [P1..P6]}, the cluster started at the first call."""
    if "ports" not in CLUSTER:
        t0 = time.monotonic()
        p = run("start", DIR)
        if p.returncode != 0:
            fail(f"redis-cluster.sh start: exit {p.returncode}: {p.stderr.strip()}")
        print(f"# cluster started in {time.monotonic() - t0:.1f} s", flush=True)
        CLUSTER["stdout"] = p.stdout
        lines = p.stdout.splitlines()
        CLUSTER["line"] = lines[-1] if lines else ""
        for i in range(1, NODES + 1):
            register(i)
        addrs = CLUSTER["line"].split("=", 1)[-1].split(",")
        CLUSTER["ports"] = [int(a.rsplit(":", 1)[-1]) for a in addrs if ":" in a]
    return CLUSTER


def cli(port, *args, timeout=10):
    """redis-cli (no -c, RESP2) against 127.0.0.1:port; (exit status,
    stdout + stderr stripped) whatever the reply."""
    try:
        p = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), *map(str, args)],
                           capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        fail(f"redis-cli -p {port} {' '.join(map(str, args))} outlived {timeout}s")
    return p.returncode, (p.stdout + p.stderr).strip()


def ok(port, *args, timeout=10):
    """A reply that is not an error (and redis-cli's exit 0)."""
    rc, out = cli(port, *args, timeout=timeout)
    if rc != 0 or out.startswith(("ERR", "MOVED", "ASK", "CROSSSLOT", "CLUSTERDOWN",
                                  "Could not connect")):
        fail(f"127.0.0.1:{port} {' '.join(map(str, args))}: exit {rc}: {out}")
    return out


def fields(text):
    """"key:value" lines (INFO, CLUSTER INFO) as a dict."""
    return dict(line.split(":", 1) for line in text.replace("\r", "").splitlines()
                if ":" in line and not line.startswith("#"))


def replication(port):
    return fields(ok(port, "INFO", "replication"))


def cluster_info(port):
    return fields(ok(port, "CLUSTER", "INFO"))


def replica_get(port, key, timeout=10):
    """GET key on a replica: READONLY first, on the same connection."""
    try:
        p = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port)],
                           input=f"READONLY\nGET {key}\n", capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        fail(f"redis-cli -p {port} READONLY, GET {key} outlived {timeout}s")
    return p.stdout.strip().splitlines()


def slots(port):
    """CLUSTER SLOTS as [(start, end, master port, [replica ports])]."""
    rc, out = cli(port, "-2", "--json", "CLUSTER", "SLOTS")
    if rc != 0:
        fail(f"CLUSTER SLOTS on {port}: {out}")
    return [(int(r[0]), int(r[1]), int(r[2][1]), [int(n[1]) for n in r[3:]])
            for r in json.loads(out)]


def keyslot(port, key):
    return int(ok(port, "CLUSTER", "KEYSLOT", key))


def node_of_port(port):
    return cluster()["ports"].index(port) + 1


def listening(ports):
    """The local addresses of the listening TCP sockets on ports (ss -Hltn)."""
    out = subprocess.run(["ss", "-Hltn"], capture_output=True, text=True, timeout=30).stdout
    found = []
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 4 and f[3].rsplit(":", 1)[-1].isdigit() and \
                int(f[3].rsplit(":", 1)[-1]) in ports:
            found.append(f[3])
    return found


def sockets_of(pid):
    """The local addresses that process pid listens on (ss -Hltnp)."""
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, timeout=30).stdout
    return [line.split()[3] for line in out.splitlines() if f"pid={pid}," in line]


# ---------------------------------------------------------------- tests

@test
def start_gives_three_masters_three_replicas_on_loopback():
    c = cluster()
    if c["stdout"].splitlines() != [c["line"]] or not c["line"].startswith("REDIS_CLUSTER_NODES="):
        fail(f"start printed {c['stdout']!r}, not one REDIS_CLUSTER_NODES= line")
    addrs = c["line"].split("=", 1)[1].split(",")
    if len(addrs) != NODES or len(set(addrs)) != NODES or \
            not all(a.startswith("127.0.0.1:") for a in addrs):
        fail(f"not {NODES} distinct 127.0.0.1 nodes: {c['line']}")
    if ctl("nodes") != c["line"]:
        fail(f"nodes printed {ctl('nodes')!r}, start {c['line']!r}")
    for i, port in enumerate(c["ports"], 1):
        if int(ctl("port", i)) != port:
            fail(f"port {i} says {ctl('port', i)}, the line {port}")
    # every socket the nodes listen on (client port and cluster bus) is 127.0.0.1's
    bus = []
    for i in range(1, NODES + 1):
        pid = int(ctl("pid", i))
        socks = sockets_of(pid)
        if not socks:
            fail(f"node {i} (pid {pid}) listens on nothing that ss -Hltnp shows")
        bad = [s for s in socks if not s.startswith("127.0.0.1:")]
        if bad:
            fail(f"node {i} listens beyond 127.0.0.1: {bad}")
        if f"127.0.0.1:{c['ports'][i - 1]}" not in socks:
            fail(f"node {i} does not listen on its port: {socks}")
        bus += [int(s.rsplit(":", 1)[1]) for s in socks if s != f"127.0.0.1:{c['ports'][i - 1]}"]
    if len(bus) != NODES:
        fail(f"not one cluster bus socket per node: {bus}")
    every = listening(set(c["ports"]) | set(bus))
    if len(every) != 2 * NODES or any(not a.startswith("127.0.0.1:") for a in every):
        fail(f"ss -Hltn on the nodes' ports: {every}")
    roles = []
    for i, port in enumerate(c["ports"], 1):
        role = ok(port, "ROLE").splitlines()[0]
        if ctl("role", i) != role:
            fail(f"role {i} says {ctl('role', i)}, ROLE {role}")
        roles.append(role)
        ci = cluster_info(port)
        want = {"cluster_state": "ok", "cluster_slots_assigned": "16384",
                "cluster_slots_ok": "16384", "cluster_known_nodes": str(NODES),
                "cluster_size": "3"}
        got = {k: ci.get(k) for k in want}
        if got != want:
            fail(f"node {i}: CLUSTER INFO {got}, not {want}")
        if role == "slave" and replication(port).get("master_link_status") != "up":
            fail(f"replica {i}'s link to its master is not up")
    if sorted(roles) != ["master"] * 3 + ["slave"] * 3:
        fail(f"roles {roles}, not 3 masters and 3 replicas")
    ranges = sorted(slots(c["ports"][0]))
    covered = [0] * 16384
    for start, end, master, replicas in ranges:
        if roles[node_of_port(master) - 1] != "master":
            fail(f"slots {start}-{end} served by {master}, not a master")
        if len(replicas) != 1 or roles[node_of_port(replicas[0]) - 1] != "slave":
            fail(f"slots {start}-{end}: replicas {replicas}, not one replica")
        for s in range(start, end + 1):
            covered[s] += 1
    if len(ranges) != 3 or covered != [1] * 16384:
        fail(f"CLUSTER SLOTS {ranges} does not cover 0..16383 once in 3 ranges")
    for start, end, master, _ in ranges:
        if int(ctl("master-of", start)) != node_of_port(master) or \
                int(ctl("master-of", end)) != node_of_port(master):
            fail(f"master-of {start}/{end} names {ctl('master-of', start)}/"
                 f"{ctl('master-of', end)}, not {node_of_port(master)}")


@test
def cross_slot_and_moved():
    c = cluster()
    port = c["ports"][0]
    a, b = "crossslot:a", "crossslot:b"
    if keyslot(port, a) == keyslot(port, b):
        fail(f"{a} and {b} share a slot: pick other keys")
    rc, out = cli(port, "MSET", a, "1", b, "2")
    if not out.startswith("CROSSSLOT"):
        fail(f"MSET of two slots: {out!r} (exit {rc}), not CROSSSLOT")
    # the control: one hash tag, one slot, asked of its owner: it succeeds
    ta, tb = "{crossslot}:a", "{crossslot}:b"
    owner = c["ports"][int(ctl("master-of", keyslot(port, ta))) - 1]
    if ok(owner, "MSET", ta, "1", tb, "2") != "OK":
        fail(f"MSET {ta} {tb} on its owner did not say OK")
    # MOVED from another master, with the slot and its owner's address
    key = "moved:key"
    slot = keyslot(port, key)
    owner_i = int(ctl("master-of", slot))
    owner = c["ports"][owner_i - 1]
    others = [p for i, p in enumerate(c["ports"], 1)
              if i != owner_i and ctl("role", i) == "master"]
    if len(others) != 2:
        fail(f"not two other masters than node {owner_i}: {others}")
    for other in others:
        rc, out = cli(other, "GET", key)
        if out != f"MOVED {slot} 127.0.0.1:{owner}":
            fail(f"GET {key} (slot {slot}) on 127.0.0.1:{other}: {out!r}, not "
                 f"MOVED {slot} 127.0.0.1:{owner}")
    ok(owner, "SET", key, "here")
    if ok(owner, "GET", key) != "here":
        fail(f"the owner 127.0.0.1:{owner} of slot {slot} did not keep {key}")


@test
def killed_master_fails_over_and_comes_back_as_replica():
    c = cluster()
    ports = c["ports"]
    key = "failover:key"
    slot = keyslot(ports[0], key)
    old = int(ctl("master-of", slot))
    old_port = ports[old - 1]
    if ctl("role", old) != "master":
        fail(f"master-of {slot} names node {old}, whose role is {ctl('role', old)}")
    repl = replication(old_port)
    if repl.get("connected_slaves") != "1":
        fail(f"node {old} has {repl.get('connected_slaves')} replicas, not 1")
    rport = int(dict(kv.split("=", 1) for kv in repl["slave0"].split(","))["port"])
    new = node_of_port(rport)
    ok(old_port, "SET", key, "kept")
    if ok(old_port, "WAIT", "1", "10000") != "1":
        fail(f"the replica (node {new}) did not acknowledge {key} within 10 s")
    pid = int(ctl("pid", old))
    ctl("kill", old)
    if ss.pid_alive(pid):
        fail(f"node {old} (pid {pid}) still runs after kill")
    ss.unregister_pid(pid)
    if run("pid", DIR, old).returncode != 1:
        fail(f"pid {old} does not exit 1 after kill")
    t0 = time.monotonic()
    seen = {}

    def promoted():
        p = run("master-of", DIR, slot, timeout=60)
        seen["last"] = p.stdout.strip() or p.stderr.strip()
        return p.returncode == 0 and p.stdout.strip() == str(new)

    try:
        ss.wait_for(promoted, FAILOVER_TIMEOUT, f"node {new} to be master of slot {slot}",
                    poll=0.2)
    except AssertionError:
        fail(f"master-of {slot} still says {seen.get('last')!r} {FAILOVER_TIMEOUT}s after "
             f"node {old} was killed:\n{log_tail(new)}")
    took = time.monotonic() - t0
    print(f"# node {old} killed: node {new} master of slot {slot} after {took:.1f} s", flush=True)
    if ctl("role", new) != "master":
        fail(f"node {new} named master of {slot} but its role is {ctl('role', new)}")
    if ok(rport, "GET", key) != "kept":
        fail(f"the promoted node {new} lost {key}")
    # the other nodes learn it too: a third one sends GET to the promoted node
    third = ports[[i for i in range(1, NODES + 1) if i not in (old, new)][0] - 1]
    moved = f"MOVED {slot} 127.0.0.1:{rport}"
    try:
        ss.wait_for(lambda: cli(third, "GET", key)[1] == moved, 15,
                    f"127.0.0.1:{third} to answer {moved}", poll=0.2)
    except AssertionError:
        fail(f"127.0.0.1:{third} answers GET {key} with {cli(third, 'GET', key)[1]!r}, "
             f"not {moved}")

    ctl("start-node", old)
    register(old)
    t1 = time.monotonic()

    def rejoined():
        if run("role", DIR, old, timeout=60).stdout.strip() != "slave":
            return False
        r = replication(old_port)
        return r.get("master_port") == str(rport) and r.get("master_link_status") == "up"

    try:
        ss.wait_for(rejoined, FAILOVER_TIMEOUT, f"node {old} to be a replica of node {new}",
                    poll=0.2, errors=(AssertionError,))
    except AssertionError:
        fail(f"node {old} restarted is not a replica of node {new} with its link up:\n"
             f"{ok(old_port, 'ROLE')}\n{log_tail(old)}")
    print(f"# node {old} back as a replica of node {new} after "
          f"{time.monotonic() - t1:.1f} s", flush=True)
    if int(ctl("master-of", slot)) != new:
        fail(f"node {old}'s return took slot {slot} back")
    got = replica_get(old_port, key)
    if got != ["OK", "kept"]:
        fail(f"node {old}, a replica again, answers READONLY, GET {key} with {got}")


@test
def stop_leaves_no_node_running():
    c = cluster()
    pids = {}
    for i in range(1, NODES + 1):
        pids[i] = int(ctl("pid", i))
        if not ss.pid_alive(pids[i]):
            fail(f"node {i}'s pid {pids[i]} is not running before stop")
        cmd = open(f"/proc/{pids[i]}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        if "redis-server" not in cmd or f":{c['ports'][i - 1]}" not in cmd:
            fail(f"node {i}'s pid {pids[i]} is {cmd!r}, not its redis-server")
    t0 = time.monotonic()
    ctl("stop")
    took = time.monotonic() - t0
    running = [pid for pid in pids.values() if ss.pid_alive(pid)]
    if running:
        fail(f"node processes still running after stop: {running}")
    for i, pid in pids.items():
        ss.unregister_pid(pid)
        p = run("pid", DIR, i)
        if p.returncode != 1 or p.stdout.strip():
            fail(f"pid {i} after stop: exit {p.returncode}, {p.stdout.strip()!r}")
    still = listening(set(c["ports"]))
    if still:
        fail(f"the nodes' ports still listen after stop: {still}")
    CLUSTER.clear()
    print(f"# 6 nodes stopped in {took:.2f} s", flush=True)


def teardown():
    if os.path.isdir(DIR):
        run("stop", DIR, timeout=60)


if __name__ == "__main__":
    ss.main(teardown=teardown)
