#!/usr/bin/env python3
"""The sale on a Redis Cluster (REDIS_CLUSTER_NODES): a real 3-master,
3-replica cluster (scripts/redis-cluster.sh) under $TEST_TMP, two server
instances routing each key to its slot's master.

- make stack REDIS_CLUSTER=1 (scripts/stack.sh): six nodes under RUN_DIR,
  the env file exporting REDIS_CLUSTER_NODES (REDIS_URL empty), instances
  that sell through nginx, say /stats redis.mode "cluster" and list each
  other in /stats instances (the registry's one slot); stop ends
  every node by its PID;
- start: REDIS_CLUSTER_NODES with REDIS_SENTINELS, with a REDIS_URL of its
  own, with a lock strategy that keeps keys of many slots in one script
  (multilock), or malformed:
  the server exits at once (2) with a message naming the setting;
- six vouchers on sale at once, every user trying every voucher twice on
  both instances: each voucher sells exactly its stock, no user twice, every
  200 is an order with a unique id, no lock key is left on any master, and
  every master ran lock scripts (the users' locks spread over the three);
- the batched strategy on a cluster: a batch's locks are taken and
  released one master at a time (one pipeline and one WAIT each), its ids
  in one pipeline on the counter's master: a crowd of users, each trying
  twice at once, buys exactly the stock, no one twice, every 200 an order,
  with LOCK_SYNC_REPLICAS=1 on;
- a Redisson-layout lock (hash at lock:order:<user>, field <uuid>:<n>)
  written on its slot's master refuses the service's buyer (409) and is
  left alone; the service's own hold, seen on that master, has the same
  layout and refuses Redisson's acquire script from outside;
- watchdog leases (LOCK_LEASE_MS=-1) on a cluster: six buyers whose locks
  live on the three masters stall past the lease; each lock is still there
  after three leases (renewed on its own master, one script per slot), each
  order passes, no lock is left;
- LOCK_SYNC_REPLICAS=1 waits per shard: with the replica of one master
  paused, a user whose lock lives on that master gets 503 (the grant
  undone, no order), a user whose lock lives on another master buys; once
  the replica is back, the first user buys too;
- a lock whose slot is migrating: ASK, then TRYAGAIN from the target (the
  script's keys are not all there), sent again a few times within a bound,
  then a fast 503; once the slot has moved the same buyer buys there;
- the slot of the order-id counter migrated to another master mid-sale
  (CLUSTER SETSLOT IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE): the
  buyers' INCRs follow ASK and then MOVED (/stats counts both), answers are
  200, 409 or a bounded number of 503s, sales go on after the move, and
  every invariant holds;
- kill -9 of the master that owns the id counter's slot mid-sale: 503s
  until its replica is promoted, then 200s again (the time printed); no
  acknowledged order lost, no oversell, and no order id handed out twice
  (none refused by the primary key as already taken).

Prints "N passed, M failed". Python 3 standard library only.
"""

import os
import re
import tempfile
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_kit  # noqa: E402
import load_kit  # noqa: E402
import seckill_server as ss  # noqa: E402
from seckill_server import fail, test  # noqa: E402

TOKEN = "t0k3n-cluster"
C = cluster_kit.Cluster("test_cluster_sale")
NODES = cluster_kit.NODES
FAILOVER_TIMEOUT = 60      # seconds: node timeout 3 s, then the election; a busy machine
SERVERS = {}


# ---------------------------------------------------------------- the cluster

ctl, nodes_line, port_of, masters = C.ctl, C.nodes_line, C.port_of, C.masters
replica_of = C.replica_of
slot_of, slot_map, master_of_key = C.slot_of, C.slot_map, C.master_of_key
cli, node_id, id_key = cluster_kit.cli, cluster_kit.node_id, cluster_kit.id_key
migrate_slot_begin = cluster_kit.migrate_slot_begin
migrate_keys, migrate_slot_end = cluster_kit.migrate_keys, cluster_kit.migrate_slot_end


def evals(port):
    """EVAL + EVALSHA calls the node has run (INFO commandstats)."""
    n = 0
    for line in cli(port, "INFO", "commandstats").splitlines():
        if line.startswith(("cmdstat_eval:", "cmdstat_evalsha:")):
            n += int(line.split("calls=")[1].split(",")[0])
    return n


def lock_keys(port):
    return [k for k in cli(port, "--scan", "--pattern", "lock:order:*").splitlines() if k]


# ---------------------------------------------------------------- the service

def env_of(**extra):
    e = {"ADMIN_TOKEN": TOKEN, "THREADS": 4, "REDIS_URL": None,
         "REDIS_CLUSTER_NODES": nodes_line(), "LOG_LEVEL": "info"}
    e.update(extra)
    return e


def servers():
    """Two instances on the cluster, started at the first call."""
    if not SERVERS:
        SERVERS["a"] = ss.Server("cluster-a", env_of())
        SERVERS["b"] = ss.Server("cluster-b", env_of())
    for s in SERVERS.values():
        if not s.alive():
            fail(f"{s.name} died: {ss.tail(s.log_path)}")
    return SERVERS["a"], SERVERS["b"]


def voucher(srv, stock):
    return ss.new_voucher(srv, TOKEN, stock, "cluster")


def db(sql):
    return ss.psql_value(sql)


def user_base():
    return 8_000_000_000_000 + (os.getpid() % 10000) * 1_000_000 + int(time.time()) % 1000 * 1000


def redirects(srv):
    return srv.get("/stats").body.get("redis", {}).get("redirects", {})


def teardown():
    for s in SERVERS.values():
        s.stop_ok()
    if C.started():
        ctl("stop")


# ---------------------------------------------------------------- tests

@test
def stack_redis_cluster_1_sells_on_six_nodes_and_stops_them():
    run_dir = tempfile.mkdtemp(prefix="stack-cluster-", dir=ss.TEST_TMP)
    st = ss.local_stack(run_dir, NGINX_PORT="auto", APP_PORT_BASE="auto", INSTANCES=2,
                        ADMIN_TOKEN=TOKEN, REDIS_CLUSTER=1)
    nodes_dir = os.path.join(run_dir, "redis-cluster")
    pids = []
    try:
        load_kit.start_stack(st, " REDIS_CLUSTER=1", timeout=240)
        for i in range(1, NODES + 1):
            with open(os.path.join(nodes_dir, f"node-{i}", "redis.pid")) as f:
                pids.append(int(f.readline()))
        for pid in pids:
            ss.register_pid(pid)
        seeds = st.info.get("REDIS_CLUSTER_NODES", "").split(",")
        if len(seeds) != NODES or any(not x.startswith("127.0.0.1:") for x in seeds) or \
                st.info.get("REDIS_URL") or st.info.get("REDIS_CLUSTER") != "1":
            fail(f"env file: REDIS_CLUSTER_NODES {st.info.get('REDIS_CLUSTER_NODES')!r}, "
                 f"REDIS_URL {st.info.get('REDIS_URL')!r}")
        roles = sorted(cli(int(x.rsplit(":", 1)[1]), "ROLE").splitlines()[0] for x in seeds)
        if roles != ["master"] * 3 + ["slave"] * 3:
            fail(f"roles of the nodes: {roles}")
        vid = ss.new_voucher(st.nginx_port, TOKEN, 2, "stack-cluster")
        got = [ss.request(st.nginx_port, "POST", f"/voucher/{vid}/seckill",
                          {"X-User-Id": str(user_base() + k)}).status for k in range(3)]
        if got != [200, 200, 409]:
            fail(f"three buyers of a stock of 2 through nginx: {got}")
        stats = ss.request(st.nginx_port, "GET", "/stats").body
        if stats.get("redis", {}).get("mode") != "cluster":
            fail(f"/stats redis: {stats.get('redis')}")
        # The instance registry (one slot, one MGET): each instance sees both.
        ss.wait_for(lambda: all(len(ss.request(p, "GET", "/stats").body.get("instances", [])) == 2
                                for p in st.app_ports), 10, "both instances in /stats instances")
    finally:
        p = st.run("stop", 120)
    if p.returncode != 0:
        fail(f"stack.sh stop: exit {p.returncode}: {p.stderr[-600:]}")
    alive = [pid for pid in pids if os.path.exists(f"/proc/{pid}") and
             open(f"/proc/{pid}/stat").read().split()[2] != "Z"]
    if alive:
        fail(f"cluster nodes still running after stop: {alive}")


@test
def start_refuses_what_a_cluster_cannot_mix():
    nodes = nodes_line()
    cases = [
        ({"REDIS_SENTINELS": "127.0.0.1:26379"}, "REDIS_SENTINELS"),
        ({"REDIS_URL": "redis://127.0.0.1:6379/0"}, "REDIS_URL"),
        ({"SECKILL_LOCK": "multilock", "LOCK_REDIS_NODES": "redis://127.0.0.1:1"}, "SECKILL_LOCK"),
        ({"REDIS_CLUSTER_NODES": "127.0.0.1"}, "REDIS_CLUSTER_NODES"),
    ]
    for extra, name in cases:
        srv = ss.Server("cluster-refused", env_of(**extra), start=False)
        e = srv.build_env()
        e["PORT"] = str(ss.free_port())
        try:
            p = subprocess.run([ss.SECKILL_BIN], env=e, capture_output=True, text=True,
                               timeout=15, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            fail(f"{extra}: the server did not stop at start")
        out = p.stdout + p.stderr
        if p.returncode != 2 or name not in out:
            fail(f"{extra} with REDIS_CLUSTER_NODES={nodes}: exit {p.returncode}, expected 2 "
                 f"and a message naming {name}:\n{out[-600:]}")


@test
def six_vouchers_across_three_masters_keep_every_invariant():
    a, b = servers()
    stock, users = 40, 60
    vids = [voucher(a, stock) for _ in range(6)]
    ms = masters()
    before = {i: evals(p) for i, p in ms.items()}
    base = user_base()
    # Every user tries every voucher twice, once through each instance.
    jobs = [(v, base + u) for v in vids for u in range(users)] * 2
    workers = 12
    per = [jobs[i::workers] for i in range(workers)]
    ports = [a.port if i % 2 == 0 else b.port for i in range(workers)]
    res = ss.run_concurrently(lambda i: ports[i], per,
                              lambda c, j: c.request("POST", f"/voucher/{j[0]}/seckill",
                                                     {"X-User-Id": str(j[1])}),
                              workers, timeout=300)
    answers, ids = {}, []
    for (v, u), r in res:
        if isinstance(r, Exception):
            fail(f"voucher {v} user {u}: {r!r}")
        answers.setdefault(r.status, 0)
        answers[r.status] += 1
        if r.status == 200:
            ids.append(int(r.body["orderId"]))
        elif r.status not in (409,):
            fail(f"voucher {v} user {u}: {r.status} {r.body}")
    print(f"    answers {answers}", flush=True)
    if len(ids) != 6 * stock or len(set(ids)) != len(ids):
        fail(f"{len(ids)} orders acknowledged ({len(set(ids))} distinct ids), expected {6 * stock}")
    vl = ",".join(map(str, vids))
    rows = ss.psql(f"SELECT count(*), count(DISTINCT (voucher_id, user_id)), count(DISTINCT id) "
                   f"FROM tb_voucher_order WHERE voucher_id IN ({vl})")
    if rows != [[str(6 * stock)] * 3]:
        fail(f"Postgres: orders, distinct (voucher, user), distinct ids = {rows}")
    got = set(int(r[0]) for r in ss.psql(f"SELECT id FROM tb_voucher_order "
                                         f"WHERE voucher_id IN ({vl})"))
    if got != set(ids):
        fail(f"the acknowledged ids and Postgres's differ: {len(set(ids) - got)} acknowledged "
             f"not in Postgres, {len(got - set(ids))} in Postgres not acknowledged")
    if db(f"SELECT sum(stock) FROM tb_voucher WHERE voucher_id IN ({vl})") != "0":
        fail("stock left while users were turned away")
    left = {i: lock_keys(p) for i, p in ms.items()}
    if any(left.values()):
        fail(f"lock keys left behind: {left}")
    ran = {i: evals(p) - before[i] for i, p in ms.items()}
    print(f"    lock scripts per master {ran}", flush=True)
    if len(ran) != 3 or min(ran.values()) < 20:
        fail(f"the users' locks did not spread over three masters: {ran}")


@test
def batched_takes_a_batchs_locks_one_master_at_a_time():
    srv = ss.Server("cluster-batched", env_of(SECKILL_STOCK="batched", LOCK_SYNC_REPLICAS=1,
                                              LOCK_SYNC_TIMEOUT_MS=1000, REDIS_TIMEOUT_MS=3000,
                                              BATCH_WINDOW_US=5000, THREADS=8))
    try:
        stock, users = 50, 80
        vid = voucher(srv, stock)
        base = user_base() + 300
        jobs = [base + u for u in range(users)] * 2
        workers = 16
        res = ss.run_concurrently(lambda i: srv.port, [jobs[i::workers] for i in range(workers)],
                                  lambda c, u: c.request("POST", f"/voucher/{vid}/seckill",
                                                         {"X-User-Id": str(u)}),
                                  workers, timeout=300)
        ids, answers = [], {}
        for u, r in res:
            if isinstance(r, Exception):
                fail(f"user {u}: {r!r}")
            answers[r.status] = answers.get(r.status, 0) + 1
            if r.status == 200:
                ids.append(int(r.body["orderId"]))
            elif r.status != 409:
                fail(f"user {u}: {r.status} {r.body}")
        stats = srv.get("/stats").body
        batches, moved = stats.get("batch", {}), stats["redis"]["redirects"]
        print(f"    answers {answers}; batch {batches}; redirections {moved}", flush=True)
        if batches.get("largest", 0) < 2:
            fail(f"no batch of two or more buyers: {batches}")
        # The map is stable: every attempt went to its own master at once.
        if moved.get("moved") or moved.get("ask"):
            fail(f"attempts sent to the wrong master: {moved}")
        rows = ss.psql(f"SELECT count(*), count(DISTINCT user_id), count(DISTINCT id) "
                       f"FROM tb_voucher_order WHERE voucher_id = {vid}")
        if len(ids) != stock or len(set(ids)) != stock or rows != [[str(stock)] * 3]:
            fail(f"{len(ids)} x 200 ({len(set(ids))} ids), Postgres {rows}: expected {stock}")
        got = set(int(r[0]) for r in ss.psql(f"SELECT id FROM tb_voucher_order "
                                             f"WHERE voucher_id = {vid}"))
        if got != set(ids):
            fail("the acknowledged ids and Postgres's differ")
        left = {i: lock_keys(p) for i, p in masters().items()}
        if any(left.values()):
            fail(f"lock keys left behind: {left}")
    finally:
        srv.stop_ok()


@test
def a_redisson_layout_lock_on_its_masters_slot_is_respected_and_the_other_way():
    a, _ = servers()
    vid = voucher(a, 3)
    user = user_base() + 900
    key = f"lock:order:{user}"
    field = "00000000-0000-4000-8000-000000000000:1"
    _, port = master_of_key(key)
    cli(port, "HSET", key, field, "1")
    cli(port, "PEXPIRE", key, "30000")
    r = a.seckill(vid, user)
    if r.status != 409 or r.body.get("error") != "already_ordered":
        fail(f"a Redisson hold on {key}: {r.status} {r.body}, expected 409 already_ordered")
    if cli(port, "HGET", key, field) != "1":
        fail("the foreign lock was changed")
    cli(port, "DEL", key)
    # The other way: the service's hold, as a Redisson client sees it.
    slow = ss.Server("cluster-slow", env_of(DEMO_PAUSE_MS=2000, LOCK_LEASE_MS=10000))
    try:
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("r", slow.seckill(vid, user)))
        t.start()
        ss.wait_for(lambda: cli(port, "EXISTS", key) == "1", 10, f"{key} held by the service")
        hold = cli(port, "HGETALL", key).splitlines()
        pttl = int(cli(port, "PTTL", key))
        if len(hold) != 2 or not hold[0].count(":") or hold[1] != "1" or not 0 < pttl <= 10000:
            fail(f"the service's hold on {key}: {hold}, PTTL {pttl}")
        redisson_acquire = ("if (redis.call('exists', KEYS[1]) == 0) or "
                            "(redis.call('hexists', KEYS[1], ARGV[2]) == 1) then "
                            "redis.call('hincrby', KEYS[1], ARGV[2], 1); "
                            "redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; "
                            "return redis.call('pttl', KEYS[1]);")
        busy = cli(port, "EVAL", redisson_acquire, "1", key, "30000", field)
        if not busy.lstrip("-").isdigit() or int(busy) <= 0:
            fail(f"Redisson's acquire while the service holds {key}: {busy!r}, expected its PTTL")
        t.join(30)
        if out.get("r") is None or out["r"].status != 200:
            fail(f"the slow buyer: {out.get('r')}")
        if cli(port, "EXISTS", key) != "0":
            fail(f"{key} left after the order")
    finally:
        slow.stop_ok()


@test
def watchdog_leases_are_renewed_on_each_locks_own_master():
    a, _ = servers()
    vid = voucher(a, 10)
    lease_ms = 600
    ranges = slot_map()
    base = user_base() + 700
    users, seen = [], {}
    for u in range(base, base + 200):          # two users per master
        home = master_of_key(f"lock:order:{u}", ranges)[0]
        if seen.get(home, 0) < 2:
            seen[home] = seen.get(home, 0) + 1
            users.append((u, home))
    if len(users) != 6:
        fail(f"users over the masters: {seen}")
    slow = ss.Server("cluster-watchdog", env_of(LOCK_LEASE_MS=-1, WATCHDOG_TIMEOUT_MS=lease_ms,
                                                DEMO_PAUSE_MS=4 * lease_ms, THREADS=8))
    try:
        out = {}
        threads = [threading.Thread(target=lambda u=u: out.setdefault(u, slow.seckill(vid, u)))
                   for u, _ in users]
        for t in threads:
            t.start()
        keys = {u: (f"lock:order:{u}", port_of(h)) for u, h in users}
        ss.wait_for(lambda: all(cli(p, "EXISTS", k) == "1" for k, p in keys.values()), 10,
                    "the six locks held")
        time.sleep(3 * lease_ms / 1000)      # three leases: held only if renewed
        gone = [k for k, p in keys.values() if cli(p, "EXISTS", k) != "1"]
        for t in threads:
            t.join(30)
        if gone:
            fail(f"watchdog locks expired while held: {gone}")
        bad = {u: (r.status if r else None) for u, r in out.items() if r is None or r.status != 200}
        if bad or len(out) != 6:
            fail(f"the slow buyers: {bad or out}")
        left = [k for k, p in keys.values() if cli(p, "EXISTS", k) != "0"]
        if left:
            fail(f"locks left after the orders: {left}")
        lock = slow.get("/stats").body["lock"]
        if lock.get("renewals", 0) < 12:
            fail(f"/stats lock: renewals {lock.get('renewals')} for six locks over three leases")
    finally:
        slow.stop_ok()


@test
def lock_sync_replicas_waits_for_the_replica_of_the_locks_own_master():
    a, _ = servers()
    vid = voucher(a, 10)
    base = user_base() + 500
    users = [base + k for k in range(40)]
    ranges = slot_map()            # keys without a hash tag: CRC16 of the whole key
    homes = {u: master_of_key(f"lock:order:{u}", ranges)[0] for u in users}
    stuck = users[0]
    free = next(u for u in users if homes[u] != homes[stuck])
    replica = replica_of(port_of(homes[stuck]))
    srv = ss.Server("cluster-sync", env_of(LOCK_SYNC_REPLICAS=1, LOCK_SYNC_TIMEOUT_MS=1000,
                                           REDIS_TIMEOUT_MS=3000))
    try:
        ctl("pause", replica)
        try:
            r = srv.seckill(vid, stuck)
            if r.status != 503:
                fail(f"replica of node {homes[stuck]} paused: {r.status} {r.body}, expected 503")
            if cli(port_of(homes[stuck]), "EXISTS", f"lock:order:{stuck}") != "0":
                fail("the unacknowledged grant was not undone")
            r = srv.seckill(vid, free)
            if r.status != 200:
                fail(f"a lock on node {homes[free]} (its replica up): {r.status} {r.body}")
        finally:
            ctl("resume", replica)
        ss.wait_for(lambda: srv.seckill(vid, stuck).status == 200, 10,
                    "the first user's order once the replica is back")
        n = db(f"SELECT count(*) FROM tb_voucher_order WHERE voucher_id = {vid}")
        if n != "2":
            fail(f"{n} orders, expected 2")
    finally:
        srv.stop_ok()


def migrate_slot(slot, src, dst, others, pause):
    """Moves hash slot 'slot' from master port src to master port dst as
    redis-cli --cluster reshard does, with 'pause' seconds between the
    steps so that buyers meet ASK (key moved, slot still the source's) and
    then MOVED."""
    migrate_slot_begin(slot, src, dst)
    time.sleep(pause)
    migrate_keys(slot, src, dst)
    time.sleep(pause)
    migrate_slot_end(slot, src, dst, others)


@test
def a_lock_of_a_migrating_slot_is_tried_again_within_a_bound_then_taken_on_its_new_master():
    """Mid-migration, the lock's keys absent: the source answers ASK, and
    the target answers TRYAGAIN to a script whose keys it does not all have
    (the lock, its token counter and its channel name): the attempt is
    sent again after short pauses, a few times, then the buyer gets 503,
    fast. Once the slot has moved, the same buyer buys on the new master
    (MOVED followed)."""
    ms = masters()
    ranges = slot_map()
    user = user_base() + 1500
    key = f"lock:order:{user}"
    src_i, src = master_of_key(key, ranges)
    dst = next(p for i, p in ms.items() if i != src_i)
    slot = slot_of(key)
    srv = ss.Server("cluster-migrating-lock", env_of(THREADS=1))
    try:
        vid = voucher(srv, 5)
        r0 = redirects(srv)
        migrate_slot_begin(slot, src, dst)
        try:
            t0 = time.monotonic()
            r = srv.seckill(vid, user)
            took = time.monotonic() - t0
            mid = redirects(srv)
        finally:
            migrate_slot_end(slot, src, dst, [p for p in ms.values() if p not in (src, dst)])
        if r.status != 503 or took > 2.0:
            fail(f"mid-migration: {r.status} {r.body} after {took:.2f} s, expected a fast 503")
        if mid.get("ask", 0) - r0.get("ask", 0) < 1 or mid.get("retry", 0) - r0.get("retry", 0) < 1:
            fail(f"mid-migration: redirections {r0} -> {mid}, expected ASK then TRYAGAIN")
        r = srv.seckill(vid, user)
        if r.status != 200:
            fail(f"the slot moved: {r.status} {r.body}")
        if cli(dst, "EXISTS", f"redisson_lock_token:{{{key}}}") != "1":
            fail("the lock was not taken on the slot's new master")
    finally:
        srv.stop_ok()


class Store:
    """What load_kit.check_invariants needs of a stack."""
    dsn = ss.PG_DSN


@test
def the_id_counters_slot_migrated_mid_sale_is_followed():
    a, b = servers()
    vid = voucher(a, 100000)
    key = id_key()
    cli(port_of(1), "-c", "INCR", key)           # the counter exists: MIGRATE moves it
    slot = slot_of(key)
    src_i, src = master_of_key(key)
    ms = masters()
    dst_i, dst = next((i, p) for i, p in ms.items() if i != src_i)
    others = [p for i, p in ms.items() if i not in (src_i, dst_i)]
    r0 = [redirects(s) for s in (a, b)]
    load = load_kit.Load(vid, [("a", a.port), ("b", b.port)] * 2, rate=40).start()
    time.sleep(1.5)
    t_move = time.monotonic()
    migrate_slot(slot, src, dst, others, pause=1.0)
    t_done = time.monotonic()
    time.sleep(1.5)
    recs = load.stop()
    r1 = [redirects(s) for s in (a, b)]
    tally = load_kit.tally(recs)
    print(f"    slot {slot} node {src_i} -> {dst_i}: {tally}", flush=True)
    moved = sum(x.get("moved", 0) - y.get("moved", 0) for x, y in zip(r1, r0))
    ask = sum(x.get("ask", 0) - y.get("ask", 0) for x, y in zip(r1, r0))
    print(f"    redirections followed: MOVED {moved}, ASK {ask}", flush=True)
    if moved < 1 or ask < 1:
        fail(f"MOVED {moved}, ASK {ask}: the migration was not met (both expected)")
    if not any(re.search(r'^seckill_redis_cluster_redirects_total\{kind="ask"\} [1-9]',
                         s.get("/metrics").body, re.M) for s in (a, b)):
        fail("/metrics does not count the ASK redirections followed")
    wrong = [r for r in recs if r.status not in (200, 503)]
    if wrong:
        fail(f"answers other than 200 and 503: {wrong[:3]}")
    n503 = sum(1 for r in recs if r.status == 503)
    if n503 > max(5, len(recs) // 50):
        fail(f"{n503} of {len(recs)} answers were 503 during the migration")
    if not any(r.status == 200 and r.t0 > t_done for r in recs):
        fail("no sale after the slot moved")
    if not any(r.status == 200 and t_move < r.t0 < t_done for r in recs):
        fail("no sale while the slot was moving")
    load_kit.check_invariants(Store, vid, recs, "cluster-migration")


@test
def kill_9_of_the_id_counters_master_mid_sale_loses_nothing():
    a, b = servers()
    vid = voucher(a, 100000)
    key = id_key()
    victim, _ = master_of_key(key)
    slot = slot_of(key)
    load = load_kit.Load(vid, [("a", a.port), ("b", b.port)] * 2, rate=40).start()
    time.sleep(1.5)
    t_kill, t_promoted = C.kill_until_promoted(victim, slot, FAILOVER_TIMEOUT)
    ss.wait_for(lambda: any(r.status == 200 and r.t0 > t_promoted for r in list(load.records)),
                20, "a sale after the promotion")
    time.sleep(1.0)
    recs = load.stop()
    first = min(r.t1 for r in recs if r.status == 200 and r.t0 > t_kill)
    print(f"    node {victim} killed: promoted after {t_promoted - t_kill:.1f} s, first 200 "
          f"after {first - t_kill:.1f} s; {load_kit.tally(recs)}", flush=True)
    wrong = [r for r in recs if r.status not in (200, 503)]
    if wrong:
        fail(f"answers other than 200 and 503: {wrong[:3]}")
    load_kit.check_invariants(Store, vid, recs, "cluster-kill")
    # Unique, not merely refused: a repeated id would be refused by the
    # primary key (a 503, logged), so no instance may have met one.
    for s in (a, b):
        with open(s.log_path, errors="replace") as f:
            if "order id already taken" in f.read():
                fail(f"{s.name}: an order id was handed out twice across the failover")
    ctl("start-node", victim)
    ss.register_pid(int(ctl("pid", victim)))


if __name__ == "__main__":
    ss.main(teardown)
