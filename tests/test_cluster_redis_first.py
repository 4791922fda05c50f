#!/usr/bin/env python3
"""Redis-first admission (SECKILL_STOCK=redis) on a Redis Cluster
(REDIS_CLUSTER_NODES): a real 3-master, 3-replica cluster
(scripts/redis-cluster.sh, every node appendonly yes, appendfsync always)
under $TEST_TMP, server instances routing each voucher's keys to its slot's
master.

On a cluster each voucher V keeps its state in its own slot, the hash tag
{V}: the hash seckill:v:{V}, the buyers seckill:v:{V}:buyers, the landed
counter seckill:v:{V}:landed, its orders stream seckill:v:{V}:orders (group
"seckill") and its dead letters seckill:v:{V}:orders:dead; admission is one
script on that one master. Order ids come from the day's counter
icr:order:<yyyy>:<MM>:<dd> (a slot of its own), one INCRBY before admission.

- start: SECKILL_STOCK=redis with REDIS_CLUSTER_NODES starts (/health,
  /ready), sells, and the voucher's keys and stream live on its slot's
  master, while a voucher that never sold gets no stream from the
  consumers' sweep; REDIS_ORDER_DURABILITY=aof (the default) against masters without
  AOF, or with any one master on appendfsync everysec, is refused at start
  (exit 2, saying appendfsync always: every master is checked); running,
  one master put on everysec makes every buyer 503 (and /ready) until it
  is back; REDIS_ORDER_DURABILITY=none starts there and sells;
- six vouchers whose slots cover the three masters, two instances (a
  consumer each), every user trying every voucher twice, once through each
  instance, at once: once drained (/stats redisFirst backlog 0 and
  reconciled on both), each voucher sold exactly its stock, every 200 is the
  order row it named, no user twice, no id twice; on each voucher's master:
  stock 0, the buyers the Postgres buyers, landed = stock, its stream
  settled, no dead letter;
- REDIS_ORDER_DURABILITY=wait waits for the replica of the voucher's own
  master: that replica paused, a buyer of a voucher there gets 503 while a
  buyer of a voucher on another master gets 200; once the replica is back,
  a new buyer of the first voucher gets 200; drained, every 200 is a row;
- kill -9 of the master serving a hot voucher's slot mid-sale
  (REDIS_ORDER_DURABILITY=wait, two instances): 503s while the slot has no
  master and while the promoted replica has no replica of its own (no 200
  in between: WAIT follows the slot to its new master), 200s again once the
  killed node is back as its replica (the times printed); drained, no
  acknowledged order lost, no user twice, no id twice, no oversell, and
  every acknowledged buyer in the promoted master's buyers set;
- a hot voucher's slot migrated to another master mid-sale (SETSLOT
  IMPORTING/MIGRATING, MIGRATE of its keys, SETSLOT NODE; the target's
  script cache empty, as a newly added master's): answers 200, 409 or 503
  only, the 503s under a fifth of the migration's answers, sales go on
  after it, every key of the slot on the new master; drained, every
  invariant, reconciled on both instances, no dead letter;
- poison orders of two vouchers on two masters (Postgres has no stock left
  for them) go to each voucher's own dead letters on its own master,
  counted by /stats and the metric; once fixed, POST
  /admin/dead-letters/replay puts them back, its answer summed over the
  vouchers (max counted across them, an old-format letter unreplayable),
  and they land as acknowledged.

Prints "N passed, M failed". Python 3 standard library only.
"""

import http.client
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_kit  # noqa: E402
import load_kit  # noqa: E402
import seckill_server as ss  # noqa: E402
from seckill_server import fail, test  # noqa: E402
import kit  # noqa: E402  (loadtest/, on the path through seckill_server)

TOKEN = "t0k3n-cluster-rf"
C = cluster_kit.Cluster("test_cluster_redis_first", REDIS_CLUSTER_APPENDFSYNC="always")
NODES = cluster_kit.NODES
FAILOVER_TIMEOUT = 60      # seconds: node timeout 3 s, then the election; a busy machine
DRAIN_TIMEOUT = 60         # seconds for the consumers to settle every admitted order
STARTED = []               # servers of the tests, stopped at teardown if still running


# ---------------------------------------------------------------- the cluster

ctl, port_of, masters, replica_of = C.ctl, C.port_of, C.masters, C.replica_of
slot_of, slot_map, master_of_slot, master_of_key = (C.slot_of, C.slot_map, C.master_of_slot,
                                                    C.master_of_key)
cli, node_id, id_key, key_slot = (cluster_kit.cli, cluster_kit.node_id, cluster_kit.id_key,
                                  cluster_kit.key_slot)
migrate_slot_begin = cluster_kit.migrate_slot_begin
migrate_keys, migrate_slot_end = cluster_kit.migrate_keys, cluster_kit.migrate_slot_end


def nodes_line():
    """REDIS_CLUSTER_NODES of the cluster (AOF, appendfsync always on every
    node), started at the first call. The day's id counter starts far from
    1, as redisfirst_kit.durable_redis does: ids are (second << 32) | count,
    and the run's Redis servers share one Postgres."""
    if not C.started():
        C.nodes_line()
        for t in (time.time(), time.time() + 3600):
            cli(port_of(1), "-c", "SET", id_key(t), random.randrange(10**6, 3 * 10**9), "NX")
    return C.nodes_line()


def vkey(vid, suffix=""):
    """Voucher vid's Redis key: "seckill:v:{vid}" + suffix."""
    return f"seckill:v:{{{vid}}}{suffix}"


def voucher_home(vid, ranges=None):
    """(node number, port) of the master serving voucher vid's slot."""
    return master_of_key(vkey(vid), ranges)


def info_fields(port, section):
    out = {}
    for line in cli(port, "INFO", section).splitlines():
        k, sep, v = line.partition(":")
        if sep:
            out[k.strip()] = v.strip()
    return out


def stream_groups(port, stream):
    """Names of the consumer groups of 'stream' on the node on port."""
    lines = cli(port, "XINFO", "GROUPS", stream).split("\n")
    return [v for k, v in zip(lines[0::2], lines[1::2]) if k == "name"]


def xlen(port, key):
    out = cli(port, "XLEN", key)
    if not out.isdigit():
        fail(f"XLEN {key} on {port}: {out!r}")
    return int(out)


# ---------------------------------------------------------------- the service

def env_of(**extra):
    e = {"ADMIN_TOKEN": TOKEN, "THREADS": 4, "REDIS_URL": None,
         "REDIS_CLUSTER_NODES": nodes_line(), "LOG_LEVEL": "info",
         "SECKILL_STOCK": "redis", "CONSUMER_CLAIM_IDLE_MS": 2000,
         "PG_STATEMENT_TIMEOUT_MS": 500}
    e.update(extra)
    return e


def server(name, **extra):
    """A Redis-first instance on the cluster (started; stopped by the test,
    or at teardown)."""
    s = ss.Server(name, env_of(**extra), start=False)
    STARTED.append(s)
    return s.start()


def stop_all(*servers):
    """Each instance stopped, and it must exit cleanly; all are stopped
    before the first unclean one is reported."""
    bad = []
    for s in servers:
        try:
            s.stop_ok()
        except AssertionError as e:
            bad.append(str(e))
    if bad:
        fail("; ".join(bad))


def voucher(srv, stock):
    return ss.new_voucher(srv, TOKEN, stock, "cluster-rf")


def user_base():
    return 8_100_000_000_000 + (os.getpid() % 10000) * 1_000_000 + int(time.time()) % 1000 * 1000


def redis_first(srv):
    """/stats redisFirst of srv, or None while it cannot say."""
    try:
        r = srv.get("/stats")
    except (OSError, http.client.HTTPException):
        return None
    if r.status != 200 or not isinstance(r.body, dict):
        return None
    return r.body.get("redisFirst")


def wait_drained(servers, timeout=DRAIN_TIMEOUT, reconciled=True):
    """Waits until every instance's /stats says redisFirst backlog 0 (and
    reconciled, unless told not to); the seconds it took."""
    t0 = time.monotonic()
    last = {}
    while True:
        done = True
        for s in servers:
            rf = redis_first(s)
            last[s.name] = rf
            if not rf or rf.get("backlog") != 0 or (reconciled and rf.get("reconciled") is not True):
                done = False
        if done:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            fail(f"not drained{' and reconciled' if reconciled else ''} after {timeout}s: "
                 f"{last}")
        time.sleep(0.2)


def pg_orders(vid):
    """{order id: user id} of voucher vid in Postgres; fails on a user twice."""
    rows = ss.psql(f"SELECT id, user_id FROM tb_voucher_order WHERE voucher_id = {vid}")
    users = [int(r[1]) for r in rows]
    if len(users) != len(set(users)):
        fail(f"voucher {vid}: a user has two orders in Postgres")
    return {int(r[0]): int(r[1]) for r in rows}


def check_landed(vid, acked, initial):
    """Drained: every acknowledged order (user -> id) is the row it named,
    no user twice, no oversell, Postgres stock = initial - orders. The rows."""
    rows = pg_orders(vid)
    missing = [(u, oid) for u, oid in acked.items() if rows.get(oid) != u]
    if missing:
        fail(f"voucher {vid}: {len(missing)} acknowledged orders are not in Postgres as "
             f"answered: {missing[:5]}")
    if len(rows) > initial:
        fail(f"voucher {vid}: oversold, {len(rows)} orders of {initial}")
    stock = int(ss.psql_value(f"SELECT stock FROM tb_voucher WHERE voucher_id = {vid}"))
    if initial - stock != len(rows):
        fail(f"voucher {vid}: Postgres stock {stock} with {len(rows)} orders of {initial}")
    return rows


def check_buyers_on(port, vid, recs, where):
    """Every buyer answered 200 in recs is in voucher vid's buyers set on
    the master on port: none could buy again."""
    members = set(cli(port, "SMEMBERS", vkey(vid, ":buyers"), timeout=30).split())
    lost = [r.user for r in recs if r.status == 200 and str(r.user) not in members]
    if lost:
        fail(f"{len(lost)} acknowledged buyers missing from {where}'s buyers set, "
             f"e.g. {lost[:3]}")


def teardown():
    for s in STARTED:
        if s.alive():
            s.stop()
    if C.started():
        ctl("stop")


# ---------------------------------------------------------------- tests

def aof_refused(name, what):
    """An instance with REDIS_ORDER_DURABILITY=aof (the default) against a
    cluster some master of which would lose acknowledged orders: refused at
    start, as on one Redis (exit 2, saying appendfsync always), whichever
    master it is (the check at start asks every master)."""
    s = ss.Server(name, env_of(CONSUMERS=0), start=False)
    STARTED.append(s)
    try:
        s.start(timeout=10)
    except AssertionError as e:
        if "exited with 2" not in str(e) or "appendfsync always" not in str(e):
            fail(f"{what}: refused for another reason: {e}")
        return
    s.stop_ok()
    fail(f"{what}: the instance started (REDIS_ORDER_DURABILITY=aof)")


def set_masters(ports, *args):
    for p in ports:
        out = cli(p, "CONFIG", "SET", *args)
        if out != "OK":
            fail(f"CONFIG SET {args} on {p}: {out}")


def restore_aof(ports):
    """appendonly yes, appendfsync always again on these masters, the AOF
    rewritten (CONFIG SET appendonly yes starts a rewrite)."""
    set_masters(ports, "appendonly", "yes")
    set_masters(ports, "appendfsync", "always")

    def done():
        for p in ports:
            i = info_fields(p, "persistence")
            if i.get("aof_enabled") != "1" or i.get("aof_rewrite_in_progress") != "0" or \
                    i.get("aof_rewrite_scheduled") != "0":
                return False
        return True
    ss.wait_for(done, 30, "the masters' AOF on again", poll=0.1)


@test
def start_accepts_redis_first_on_a_cluster():
    a = server("cluster-rf-start")
    b = None
    ms = masters()
    try:
        ss.wait_for(lambda: a.get("/ready").status == 200, 10, "/ready 200")
        st = a.get("/stats").body
        rf = st.get("redisFirst") or {}
        if st.get("redis", {}).get("mode") != "cluster" or rf.get("durable") is not True:
            fail(f"/stats redis {st.get('redis')}, redisFirst {rf}")
        quiet = voucher(a, 5)               # never sold: no stream made for it
        vid = voucher(a, 5)
        node, port = voucher_home(vid)
        user = user_base() + 8000
        r = a.seckill(vid, user)
        if r.status != 200:
            fail(f"a buyer on a cluster: {r.status} {r.body}")
        oid = int(r.body["orderId"])
        # The voucher's keys and stream on its own master (no -c: a key
        # elsewhere would be answered MOVED).
        if cli(port, "HGET", vkey(vid), "stock") != "4" or \
                cli(port, "SISMEMBER", vkey(vid, ":buyers"), user) != "1":
            fail(f"voucher {vid} on node {node}: stock {cli(port, 'HGET', vkey(vid), 'stock')!r}, "
                 f"buyer {cli(port, 'SISMEMBER', vkey(vid, ':buyers'), user)!r}")
        ss.wait_for(lambda: cli(port, "GET", vkey(vid, ":landed")) == "1", 20,
                    f"{vkey(vid, ':landed')} = 1 on node {node}")
        if "seckill" not in stream_groups(port, vkey(vid, ":orders")):
            fail(f"{vkey(vid, ':orders')} on node {node}: groups "
                 f"{cli(port, 'XINFO', 'GROUPS', vkey(vid, ':orders'))!r}")
        # The consumer's sweep reached the later voucher's stream, so it
        # passed the quiet one's too (in id order), and made nothing there.
        qnode, qport = voucher_home(quiet)
        if cli(qport, "EXISTS", vkey(quiet, ":orders")) != "0":
            fail(f"{vkey(quiet, ':orders')} exists on node {qnode}: a voucher that never sold "
                 "got a stream")
        if pg_orders(vid) != {oid: user}:
            fail(f"Postgres: {pg_orders(vid)}, expected order {oid} of user {user}")
        # A voucher on each master, for the buyers below.
        ranges = slot_map()
        on = {node: vid}
        for _ in range(60):
            if len(on) == len(ms):
                break
            v = voucher(a, 5)
            on.setdefault(voucher_home(v, ranges)[0], v)
        if sorted(on) != sorted(ms):
            fail(f"vouchers on the masters {sorted(on)}, masters {sorted(ms)}")
        wait_drained([a])
        a.stop_ok()

        # aof against masters that would lose acknowledged orders.
        try:
            set_masters(ms.values(), "appendonly", "no")
            aof_refused("cluster-rf-noaof", "masters without AOF")
            # Asked for no durability, it starts and sells.
            b = server("cluster-rf-none", REDIS_ORDER_DURABILITY="none")
            r = b.seckill(vid, user + 1)
            if r.status != 200:
                fail(f"REDIS_ORDER_DURABILITY=none, no AOF: {r.status} {r.body}")
            wait_drained([b])
            b.stop_ok()
            restore_aof(ms.values())
            # Every master must: any one on appendfsync everysec refuses the
            # start, and once running, every buyer until it is back.
            for n in sorted(on):
                set_masters([port_of(n)], "appendfsync", "everysec")
                aof_refused(f"cluster-rf-everysec-{n}", f"node {n} on appendfsync everysec")
                set_masters([port_of(n)], "appendfsync", "always")
            b = server("cluster-rf-watch")
            far = max(on)                       # a master with a voucher of its own
            others = [v for n, v in on.items() if n != far]
            set_masters([port_of(far)], "appendfsync", "everysec")
            ss.wait_for(lambda: (redis_first(b) or {}).get("durable") is False, 10,
                        f"the watch to notice node {far} on everysec")
            r = b.seckill(others[0], user + 2)
            if r.status != 503 or b.get("/ready").status != 503:
                fail(f"node {far} on everysec: a buyer of voucher {others[0]} on another master "
                     f"got {r.status} {r.body}, /ready {b.get('/ready').status}; expected 503")
            set_masters([port_of(far)], "appendfsync", "always")
            ss.wait_for(lambda: b.seckill(others[0], user + 3).status == 200, 10,
                        f"a buyer once node {far} is on always again", poll=0.2)
            wait_drained([b])
            b.stop_ok()
            print("    aof: refused at start with no AOF, and with each master on everysec in "
                  "turn; a running instance answers 503 while one master is on everysec",
                  flush=True)
        finally:
            restore_aof(ms.values())
    finally:
        stop_all(*(s for s in (a, b) if s is not None))


@test
def six_redis_first_vouchers_across_three_masters_keep_every_invariant():
    a = server("cluster-rf-a", CONSUMERS=1)
    b = server("cluster-rf-b", CONSUMERS=1)
    try:
        stock, users = 20, 40
        ranges = slot_map()
        homes, per_master = {}, {}
        for _ in range(60):                 # two vouchers per master
            vid = voucher(a, stock)
            node = voucher_home(vid, ranges)[0]
            if per_master.get(node, 0) < 2:
                per_master[node] = per_master.get(node, 0) + 1
                homes[vid] = node
            if len(homes) == 6:
                break
        if len(homes) != 6 or len(set(homes.values())) != 3:
            fail(f"vouchers over the masters: {per_master}")
        for vid in homes:
            if slot_of(vkey(vid)) != key_slot(vkey(vid)):
                fail(f"CLUSTER KEYSLOT {vkey(vid)} = {slot_of(vkey(vid))}, "
                     f"computed {key_slot(vkey(vid))}")
        vids = sorted(homes)
        print(f"    vouchers (id: node) {homes}", flush=True)
        base = user_base()
        # Every user tries every voucher twice: once through each instance.
        jobs = [(v, base + u, s) for s in (a, b) for v in vids for u in range(users)]
        random.Random(vids[0]).shuffle(jobs)
        workers = 12
        ports = [a.port if i < workers // 2 else b.port for i in range(workers)]
        per, sent = [[] for _ in range(workers)], [0, 0]
        for j in jobs:                      # half the workers on each instance
            h = 0 if j[2] is a else 1
            per[h * (workers // 2) + sent[h] % (workers // 2)].append(j)
            sent[h] += 1
        res = ss.run_concurrently(lambda i: ports[i], per,
                                  lambda c, j: c.request("POST", f"/voucher/{j[0]}/seckill",
                                                         {"X-User-Id": str(j[1])}),
                                  workers, timeout=120)
        if len(res) != len(jobs):
            fail(f"{len(res)} answers for {len(jobs)} requests")
        answers, acked = {}, {v: {} for v in vids}
        for (v, u, s), r in res:
            if isinstance(r, Exception):
                fail(f"voucher {v} user {u} via {s.name}: {r!r}")
            code = r.body.get("error") if isinstance(r.body, dict) else None
            key = f"{r.status} {code}" if code else str(r.status)
            answers[key] = answers.get(key, 0) + 1
            if r.status == 200:
                if u in acked[v]:
                    fail(f"voucher {v}: user {u} answered 200 twice")
                acked[v][u] = int(r.body["orderId"])
            elif r.status != 409:
                fail(f"voucher {v} user {u} via {s.name}: {r.status} {r.body}")
        print(f"    answers {answers}", flush=True)
        sold = {v: len(acked[v]) for v in vids}
        if any(n != stock for n in sold.values()):
            fail(f"200s per voucher {sold}, expected {stock} each")
        ids = [oid for v in vids for oid in acked[v].values()]
        if len(set(ids)) != len(ids):
            fail(f"{len(ids) - len(set(ids))} order ids answered twice")
        took = wait_drained([a, b])
        print(f"    drained and reconciled {took:.1f} s after the crowd", flush=True)
        # Postgres: exactly the acknowledged orders.
        for v in vids:
            rows = check_landed(v, acked[v], stock)
            if rows != {oid: u for u, oid in acked[v].items()}:
                fail(f"voucher {v}: Postgres has {len(rows)} orders, not exactly the "
                     f"{len(acked[v])} acknowledged")
        vl = ",".join(map(str, vids))
        n, distinct = ss.psql(f"SELECT count(*), count(DISTINCT id) FROM tb_voucher_order "
                              f"WHERE voucher_id IN ({vl})")[0]
        if int(n) != 6 * stock or int(distinct) != int(n):
            fail(f"Postgres: {n} orders, {distinct} distinct ids, expected {6 * stock}")
        if ss.psql_value(f"SELECT sum(stock) FROM tb_voucher WHERE voucher_id IN ({vl})") != "0":
            fail("Postgres stock left while users were turned away")
        # Redis, on each voucher's own master.
        for v in vids:
            node, port = voucher_home(v)
            got = {
                "stock": cli(port, "HGET", vkey(v), "stock"),
                "buyers": cli(port, "SCARD", vkey(v, ":buyers")),
                "landed": cli(port, "GET", vkey(v, ":landed")),
            }
            if got != {"stock": "0", "buyers": str(stock), "landed": str(stock)}:
                fail(f"voucher {v} on node {node}: {got}, expected stock 0, {stock} buyers, "
                     f"{stock} landed")
            members = {int(x) for x in cli(port, "SMEMBERS", vkey(v, ":buyers")).split()}
            if members != set(acked[v]):
                fail(f"voucher {v} on node {node}: the buyers set is not the acknowledged buyers")
            if "seckill" not in stream_groups(port, vkey(v, ":orders")):
                fail(f"{vkey(v, ':orders')} on node {node} has no group seckill")
            left = kit.stream_unsettled(lambda *x, p=port: cli(p, *x), vkey(v, ":orders"))
            if left != (0, 0):
                fail(f"{vkey(v, ':orders')} on node {node}: (unsettled, pending) {left}")
            if xlen(port, vkey(v, ":orders:dead")) != 0:
                fail(f"{vkey(v, ':orders:dead')} on node {node} holds dead letters")
    finally:
        stop_all(a, b)


@test
def wait_durability_waits_for_the_replica_of_the_vouchers_own_master():
    srv = server("cluster-rf-wait", REDIS_ORDER_DURABILITY="wait", REDIS_ORDER_WAIT_REPLICAS=1,
                 REDIS_ORDER_WAIT_MS=1000, REDIS_TIMEOUT_MS=3000)
    try:
        ranges = slot_map()
        counter = master_of_key(id_key(), ranges)[0]
        home = master_of_key("{seckill}", ranges)[0]
        # A on a master that is neither the id counter's nor the service's
        # own keys' (conn_redis's), B on another: a WAIT sent to either of
        # those, or to every master, is caught.
        a_vid = b_vid = None
        for _ in range(60):
            vid = voucher(srv, 10)
            node = voucher_home(vid, ranges)[0]
            if a_vid is None:
                if node not in (counter, home):
                    a_vid, a_node = vid, node
            elif node != a_node:
                b_vid, b_node = vid, node
                break
        if b_vid is None:
            fail("no voucher on a master other than the id counter's and the home slot's, "
                 "and another on a second master")
        a_port = port_of(a_node)
        replica = replica_of(a_port)
        base = user_base() + 5000
        stuck, free, acked = base, base + 1, {a_vid: {}, b_vid: {}}
        ctl("pause", replica)
        try:
            t0 = time.monotonic()
            r = srv.seckill(a_vid, stuck)
            took = time.monotonic() - t0
            if r.status != 503:
                fail(f"the replica (node {replica}) of voucher {a_vid}'s master (node {a_node}) "
                     f"paused: {r.status} {r.body}, expected 503")
            r = srv.seckill(b_vid, free)
            if r.status != 200:
                fail(f"voucher {b_vid} on node {b_node} (its replica up): {r.status} {r.body}")
            acked[b_vid][free] = int(r.body["orderId"])
        finally:
            ctl("resume", replica)
        print(f"    node {a_node}'s replica paused: voucher {a_vid}'s buyer 503 after {took:.1f} s, "
              f"voucher {b_vid}'s (node {b_node}) 200", flush=True)
        nxt = [base + 2]

        def bought():
            u = nxt[0]
            nxt[0] += 1
            r = srv.seckill(a_vid, u)
            if r.status == 200:
                acked[a_vid][u] = int(r.body["orderId"])
            return r.status == 200
        ss.wait_for(bought, 15, f"a buyer of voucher {a_vid} once node {replica} is back",
                    poll=0.2)
        # The first buyer's order may stand (admitted, then not acknowledged):
        # a retry is then a duplicate, else it buys.
        r = srv.seckill(a_vid, stuck)
        if r.status == 200:
            acked[a_vid][stuck] = int(r.body["orderId"])
        elif r.status != 409 or r.body.get("error") != "already_ordered":
            fail(f"the first buyer again, the replica back: {r.status} {r.body}")
        wait_drained([srv])
        for v in (a_vid, b_vid):
            check_landed(v, acked[v], 10)
    finally:
        srv.stop_ok()


class Store:
    """What load_kit.check_invariants needs of a stack."""
    dsn = ss.PG_DSN


@test
def kill_of_a_vouchers_master_mid_sale_loses_no_acknowledged_order():
    env = dict(REDIS_ORDER_DURABILITY="wait", REDIS_ORDER_WAIT_REPLICAS=1,
               REDIS_ORDER_WAIT_MS=1000, REDIS_TIMEOUT_MS=3000)
    a = server("cluster-rf-kill-a", **env)
    b = server("cluster-rf-kill-b", **env)
    victim = None
    restarted = False
    try:
        ranges = slot_map()
        counter = master_of_key(id_key(), ranges)[0]
        vid = None
        for _ in range(30):                 # a voucher whose master is not the counter's
            v = voucher(a, 100000)
            if voucher_home(v, ranges)[0] != counter:
                vid = v
                break
        if vid is None:
            fail("no voucher on a master other than the id counter's")
        victim, vport = voucher_home(vid, ranges)
        slot = key_slot(vkey(vid))
        load = load_kit.Load(vid, [("a", a.port), ("b", b.port)] * 2, rate=40).start()
        try:
            time.sleep(1.5)
            t_kill, t_promoted = C.kill_until_promoted(victim, slot, FAILOVER_TIMEOUT)
            new_master = int(ctl("master-of", slot))
            # The promoted master has no replica until the killed node is
            # back: every admission there must be refused (WAIT 1 fails).
            time.sleep(2.5)
            t_restart = time.monotonic()
            ctl("start-node", victim)
            restarted = True
            ss.register_pid(int(ctl("pid", victim)))

            def replica_again():
                i = info_fields(vport, "replication")
                return i.get("role") == "slave" and i.get("master_link_status") == "up"
            ss.wait_for(replica_again, 30, f"node {victim} back as a replica", poll=0.1)
            t_back = time.monotonic()
            ss.wait_for(lambda: any(r.status == 200 and r.t0 > t_back for r in list(load.records)),
                        20, "a sale once the promoted master has a replica")
            time.sleep(1.0)
        finally:
            recs = load.stop()
        before = [r for r in recs if r.t0 < t_kill]
        first = min(r.t1 for r in recs if r.status == 200 and r.t0 > t_kill)
        print(f"    node {victim} killed: node {new_master} promoted after "
              f"{t_promoted - t_kill:.1f} s, node {victim} back as its replica after "
              f"{t_back - t_kill:.1f} s, first 200 after {first - t_kill:.1f} s; "
              f"{load_kit.tally(recs)}", flush=True)
        wrong = [r for r in recs if r.status not in (200, 503)]
        if wrong:
            fail(f"answers other than 200 and 503: {wrong[:3]}")
        if not any(r.status == 200 for r in before):
            fail(f"no sale before the kill: {load_kit.tally(before)}")
        # No 200 while the slot had no master, nor while its new master had
        # no replica to acknowledge an order.
        early = [r for r in recs if r.status == 200 and r.t0 > t_kill and r.t1 < t_restart]
        if early:
            fail(f"{len(early)} x 200 between the kill and the killed node's return, e.g. "
                 f"{early[0]}")
        if not any(r.status == 503 and r.t0 > t_promoted and r.t1 < t_restart for r in recs):
            fail("no buyer met the promoted master before its replica returned")
        took = wait_drained([a, b], reconciled=False)
        rfs = {s.name: redis_first(s) for s in (a, b)}
        print(f"    drained {took:.1f} s after the load; reconciled "
              f"{ {n: (rf or {}).get('reconciled') for n, rf in rfs.items()} }, dead letters "
              f"{ {n: (rf or {}).get('deadLetters') for n, rf in rfs.items()} }", flush=True)
        # 503s are outcomes the buyer cannot know: each may or may not be an order.
        n503 = sum(1 for r in recs if r.status == 503)
        load_kit.check_invariants(Store, vid, recs, "cluster-rf-kill", unknown_extra=n503)
        # Every acknowledged buyer is known to the promoted master: none
        # could buy again.
        check_buyers_on(master_of_slot(slot)[1], vid, recs, "the promoted master")
    finally:
        try:
            if victim is not None and not restarted:
                ctl("start-node", victim)
                ss.register_pid(int(ctl("pid", victim)))
        finally:
            stop_all(a, b)


# ---------------------------------------------------------------- a slot migrated

def redirects(srv):
    """/stats redis.redirects of srv: {moved, ask, retry} followed."""
    return (srv.get("/stats").body.get("redis") or {}).get("redirects") or {}


@test
def a_redis_first_vouchers_slot_migrated_mid_sale_loses_nothing():
    """One hot voucher, buyers at a steady pace through two instances; its
    slot (that of seckill:v:{V}: the hash, the buyers, the landed counter,
    the orders stream and its group) moved to another master as redis-cli
    --cluster reshard does, a second between the steps: SETSLOT IMPORTING
    and MIGRATING, MIGRATE of every key, SETSLOT NODE on every master. The
    target starts with an empty script cache, as a master added to the
    cluster for the reshard would. Every answer is 200, 409 or 503 (the
    script answered ASK, then TRYAGAIN or a redirection past the bound of
    sends), the 503s under a fifth of the requests of the migration (its
    keys move in one MIGRATE: a buyer can always be admitted on one side
    or the other), sales go on after it, the keys are all on the new
    master, and once drained every invariant holds, reconciled on both
    instances, no dead letter."""
    a = server("cluster-rf-move-a", CONSUMERS=1)
    b = server("cluster-rf-move-b", CONSUMERS=1)
    try:
        ms = masters()
        vid = voucher(a, 100000)
        slot = key_slot(vkey(vid))
        if slot_of(vkey(vid)) != slot:
            fail(f"CLUSTER KEYSLOT {vkey(vid)} = {slot_of(vkey(vid))}, computed {slot}")
        src_i, src = voucher_home(vid)
        dst_i, dst = next((i, p) for i, p in sorted(ms.items()) if i != src_i)
        others = [p for i, p in ms.items() if i not in (src_i, dst_i)]
        if cli(dst, "SCRIPT", "FLUSH") != "OK":
            fail(f"SCRIPT FLUSH on node {dst_i}")
        r0 = [redirects(s) for s in (a, b)]
        load = load_kit.Load(vid, [("a", a.port), ("b", b.port)] * 2, rate=40).start()
        try:
            time.sleep(1.5)
            # The slot's keys, every one the sale made, before the move.
            before = set(cli(src, "CLUSTER", "GETKEYSINSLOT", slot, 100).split())
            t_begin = time.monotonic()
            migrate_slot_begin(slot, src, dst)
            time.sleep(1.0)
            t_keys = time.monotonic()
            moved_keys = migrate_keys(slot, src, dst)
            t_keys_done = time.monotonic()
            time.sleep(1.0)
            migrate_slot_end(slot, src, dst, others)
            t_done = time.monotonic()
            # Sales after the move: a few seconds to show, then more.
            deadline = t_done + 10
            while time.monotonic() < deadline and not any(
                    r.status == 200 and r.t0 > t_done for r in list(load.records)):
                time.sleep(0.1)
            time.sleep(1.5)
        finally:
            recs = load.stop()
        r1 = [redirects(s) for s in (a, b)]
        rfs = {s.name: redis_first(s) for s in (a, b)}
        red = {k: sum(x.get(k, 0) - y.get(k, 0) for x, y in zip(r1, r0))
               for k in ("moved", "ask", "retry")}
        during = [r for r in recs if r.t1 > t_begin and r.t0 < t_done]
        after = [r for r in recs if r.t0 >= t_done]
        n503 = sum(1 for r in recs if r.status == 503)
        d503 = sum(1 for r in during if r.status == 503)
        print(f"    slot {slot} node {src_i} -> node {dst_i}: keys {sorted(moved_keys)} moved "
              f"{t_keys - t_begin:.1f} s after MIGRATING (MIGRATE {t_keys_done - t_keys:.2f} s), "
              f"SETSLOT NODE {t_done - t_begin:.1f} s after", flush=True)
        figures = (f"answers {load_kit.tally(recs)}; during the migration "
                   f"{load_kit.tally(during)}; after it {load_kit.tally(after)}; redirections "
                   f"followed {red}")
        print(f"    {figures}", flush=True)
        wrong = [r for r in recs if r.status not in (200, 409, 503) or
                 (r.status == 409 and r.code not in ("already_ordered", "sold_out"))]
        if wrong:
            fail(f"{len(wrong)} answers other than 200, 409 and 503: {wrong[:3]}")
        want = {vkey(vid), vkey(vid, ":buyers"), vkey(vid, ":orders")}
        if not want <= before:
            fail(f"slot {slot} on node {src_i} held {sorted(before)}, expected at least "
                 f"{sorted(want)}")
        if set(moved_keys) != before or len(moved_keys) != len(set(moved_keys)):
            fail(f"MIGRATE moved {sorted(moved_keys)}, the slot held {sorted(before)}")
        if not any(r.status == 200 and r.t1 < t_begin for r in recs):
            fail(f"no sale before the migration: {figures}")
        early = [r for r in recs if r.status == 503 and r.t1 < t_begin]
        if early:
            fail(f"{len(early)} x 503 before the migration began, e.g. {early[0]}")
        if red["ask"] < 1 or red["moved"] < 1:
            fail(f"redirections followed {red}: the buyers did not meet the migration "
                 f"(ASK and MOVED expected)")
        if not any(r.status == 200 and r.t0 > t_done for r in recs):
            fail(f"no sale after the slot moved: {figures}; /stats redisFirst {rfs}")
        if not during or d503 * 5 >= len(during):
            fail(f"{d503} of the {len(during)} answers during the migration were 503 (under a "
                 f"fifth expected); {figures}; /stats redisFirst {rfs}")
        if n503 * 10 > len(recs):
            fail(f"{n503} of {len(recs)} answers were 503: {figures}")
        # The voucher's keys all on the new master, none left on the old.
        if master_of_slot(slot)[1] != dst:
            fail(f"slot {slot} is served by node {master_of_slot(slot)[0]}, not node {dst_i}")
        left = cli(src, "CLUSTER", "COUNTKEYSINSLOT", slot)
        if left != "0":
            fail(f"node {src_i} still holds {left} keys of slot {slot}")
        on_dst = set(cli(dst, "CLUSTER", "GETKEYSINSLOT", slot, 100).split())
        if not before <= on_dst:
            fail(f"slot {slot} on node {dst_i}: {sorted(on_dst)}, missing "
                 f"{sorted(before - on_dst)}")
        if "seckill" not in stream_groups(dst, vkey(vid, ":orders")):
            fail(f"{vkey(vid, ':orders')} on node {dst_i} has no group seckill")
        took = wait_drained([a, b])
        rfs = {s.name: redis_first(s) for s in (a, b)}
        print(f"    drained and reconciled {took:.1f} s after the load; dead letters "
              f"{ {n: (rf or {}).get('deadLetters') for n, rf in rfs.items()} }", flush=True)
        for n, rf in rfs.items():
            if (rf or {}).get("deadLetters") != 0:
                fail(f"{n}: /stats redisFirst {rf}: dead letters")
        if xlen(dst, vkey(vid, ":orders:dead")) != 0:
            fail(f"{vkey(vid, ':orders:dead')} on node {dst_i} holds dead letters")
        left = kit.stream_unsettled(lambda *x: cli(dst, *x), vkey(vid, ":orders"))
        if left != (0, 0):
            fail(f"{vkey(vid, ':orders')} on node {dst_i}: (unsettled, pending) {left}")
        # A 503 is an outcome the buyer cannot know: the script may have run.
        res = load_kit.check_invariants(Store, vid, recs, "cluster-rf-move", unknown_extra=n503)
        # Redis agrees with Postgres, on the new master.
        orders = res["orders"]
        got = {"stock": cli(dst, "HGET", vkey(vid), "stock"),
               "buyers": cli(dst, "SCARD", vkey(vid, ":buyers")),
               "landed": cli(dst, "GET", vkey(vid, ":landed"))}
        if got != {"stock": str(100000 - orders), "buyers": str(orders), "landed": str(orders)}:
            fail(f"voucher {vid} on node {dst_i}: {got}, Postgres has {orders} orders")
        check_buyers_on(dst, vid, recs, "the new master")
    finally:
        stop_all(a, b)


# ---------------------------------------------------------------- dead letters

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def dead_letters(port, key):
    """The dead letters of stream 'key' on the node on port, oldest first:
    [{field: value}]."""
    out = cli(port, "EVAL", "local r = {} for _, e in ipairs(redis.call('xrange', KEYS[1], '-', "
              "'+')) do r[#r + 1] = table.concat(e[2], '\\t') end return r", 1, key)
    if out.startswith(("MOVED", "ASK", "ERR")):
        fail(f"the dead letters of {key} on {port}: {out}")
    letters = []
    for line in out.splitlines():
        f = line.split("\t")
        letters.append(dict(zip(f[0::2], f[1::2])))
    return letters


def entries_added(port, stream):
    """XINFO STREAM's entries-added of 'stream' on the node on port."""
    info = cli(port, "XINFO", "STREAM", stream).splitlines()
    if "entries-added" not in info:
        fail(f"XINFO STREAM {stream} on {port}: {info[:4]}")
    return int(info[info.index("entries-added") + 1])


def metric(srv, name):
    """The value of an unlabelled counter in srv's /metrics."""
    r = srv.get("/metrics")
    for line in r.body.splitlines() if isinstance(r.body, str) else []:
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    fail(f"{name} not in /metrics of {srv.name}")


@test
def a_poison_order_on_a_cluster_goes_to_its_vouchers_dead_letters_and_replays():
    """Two vouchers on two masters, their orders admitted with no consumer
    running while Postgres has no stock left for them (changed by hand):
    the consumer moves each order to its own voucher's dead letters,
    seckill:v:{V}:orders:dead on that voucher's master (the other master
    answers MOVED for it), each carrying the order whole; /stats
    redisFirst counts them all (deadLetters, not reconciled) and so does
    the metric. A replay before the fix is refused without the token or
    with max 0; once Postgres has its stock back, POST
    /admin/dead-letters/replay puts them back, each in its own voucher's
    stream, the answer summed over the vouchers ({replayed, left,
    unreplayable}, max counted across them, a letter without the id's
    parts left as unreplayable), each once; they land in Postgres as
    acknowledged, and once the unreplayable letter is gone both
    instances say reconciled."""
    front = server("cluster-rf-dead-front", CONSUMERS=0)
    c = None
    try:
        ranges = slot_map()
        homes = {}
        for _ in range(60):                 # two vouchers on two masters
            vid = voucher(front, 5)
            node = voucher_home(vid, ranges)[0]
            if not homes or node not in homes.values():
                homes[vid] = node
            if len(homes) == 2:
                break
        if len(homes) != 2:
            fail(f"no two vouchers on two masters: {homes}")
        va, vb = sorted(homes)              # the replay walks the vouchers by id
        pa, pb = port_of(homes[va]), port_of(homes[vb])
        base = user_base() + 60000
        acked = {va: {}, vb: {}}
        for v, users in ((va, range(base + 1, base + 4)), (vb, range(base + 11, base + 13))):
            for u in users:
                r = front.seckill(v, u)
                if r.status != 200:
                    fail(f"voucher {v} user {u}: {r.status} {r.body}")
                acked[v][u] = int(r.body["orderId"])
        print(f"    vouchers (id: node) {homes}; orders {[len(acked[v]) for v in (va, vb)]}",
              flush=True)
        ss.psql(f"UPDATE tb_voucher SET stock = 0 WHERE voucher_id IN ({va}, {vb})")
        c = server("cluster-rf-dead", CONSUMERS=1)
        dead = {va: (pa, vkey(va, ":orders:dead")), vb: (pb, vkey(vb, ":orders:dead"))}
        ss.wait_for(lambda: all(xlen(p, k) == len(acked[v]) for v, (p, k) in dead.items()), 20,
                    "each voucher's orders in its own dead letters", poll=0.1)
        for v, (p, k) in dead.items():
            letters = dead_letters(p, k)
            got = {int(d["u"]): int(d["o"]) for d in letters}
            ids = {int(d["u"]): (int(d["t"]) << 32) | int(d["c"]) for d in letters}
            if got != acked[v] or ids != acked[v] or {d["v"] for d in letters} != {str(v)} or \
                    {d["reason"] for d in letters} != {"no stock left in Postgres"}:
                fail(f"voucher {v}'s dead letters on {p}: {letters}; orders {acked[v]}")
        # Each voucher's letters on its own master only.
        for v, w in ((va, pb), (vb, pa)):
            out = cli(w, "XLEN", dead[v][1])
            if not out.startswith("MOVED"):
                fail(f"XLEN {dead[v][1]} on the other voucher's master ({w}): {out!r}, "
                     f"expected MOVED")
        wait_drained([front, c], reconciled=False)
        for s in (front, c):
            rf = redis_first(s) or {}
            if rf.get("deadLetters") != 5 or rf.get("reconciled") is not False:
                fail(f"{s.name}: /stats redisFirst {rf}, expected 5 dead letters, "
                     f"not reconciled")
        if metric(c, "seckill_stream_dead_letters_total") != 5:
            fail(f"seckill_stream_dead_letters_total "
                 f"{metric(c, 'seckill_stream_dead_letters_total')}, expected 5")
        # A dead letter of the older format (no t and c): not replayable.
        cli(pb, "XADD", dead[vb][1], "*", "entry", "1-1", "v", vb, "u", 1, "o", 4294967297,
            "g", 1, "reason", "no such voucher", "consumer", "old")
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = front.post("/admin/dead-letters/replay", headers)
            if r.status != 401 or r.body.get("error") != "unauthorized":
                fail(f"replay without the token: {r.status} {r.body!r}")
        r = front.post("/admin/dead-letters/replay", AUTH, {"max": 0})
        if r.status != 400 or r.body.get("error") != "invalid_field":
            fail(f"max 0: {r.status} {r.body!r}")
        if (xlen(pa, dead[va][1]), xlen(pb, dead[vb][1])) != (3, 3):
            fail("a refused replay moved dead letters")
        ss.psql(f"UPDATE tb_voucher SET stock = 5 WHERE voucher_id IN ({va}, {vb})")  # the fix
        streams = {va: (pa, vkey(va, ":orders")), vb: (pb, vkey(vb, ":orders"))}
        added0 = {v: entries_added(p, k) for v, (p, k) in streams.items()}
        answers = []
        for body in ({"max": 4}, None, None):
            r = front.post("/admin/dead-letters/replay", AUTH, body)
            if r.status != 200:
                fail(f"replay {body}: {r.status} {r.body!r}")
            answers.append(r.body)
        added = {v: entries_added(p, k) - added0[v] for v, (p, k) in streams.items()}
        print(f"    replays (max 4, then all, then again): {answers}; entries queued per "
              f"voucher {added}", flush=True)
        # max 4: voucher A's 3 and one of B's; then B's other one, its old
        # letter passed over; then nothing left to replay.
        if answers != [{"replayed": 4, "left": 2, "unreplayable": 0},
                       {"replayed": 1, "left": 1, "unreplayable": 1},
                       {"replayed": 0, "left": 1, "unreplayable": 1}]:
            fail(f"replay answers {answers}")
        if added != {va: 3, vb: 2}:
            fail(f"entries queued per voucher by the replays {added}, expected "
                 f"{ {va: 3, vb: 2} }")
        if xlen(pa, dead[va][1]) != 0 or \
                [d.get("consumer") for d in dead_letters(pb, dead[vb][1])] != ["old"]:
            fail(f"dead letters left: {dead_letters(pa, dead[va][1])} on {pa}, "
                 f"{dead_letters(pb, dead[vb][1])} on {pb}; expected only the old one of "
                 f"voucher {vb}")
        # Landed: the rows, then /stats (a snapshot up to STATS_INTERVAL_MS
        # old) with the one old letter left.
        t0 = time.monotonic()
        ss.wait_for(lambda: all(len(pg_orders(v)) == len(acked[v]) for v in (va, vb)), 20,
                    "the replayed orders in Postgres", poll=0.1)
        took = time.monotonic() - t0
        ss.wait_for(lambda: all((redis_first(s) or {}).get("deadLetters") == 1
                                for s in (front, c)), 10,
                    "/stats redisFirst deadLetters 1 on both instances", poll=0.2)
        wait_drained([front, c], reconciled=False)
        for v in (va, vb):
            rows = check_landed(v, acked[v], 5)
            if rows != {oid: u for u, oid in acked[v].items()}:
                fail(f"voucher {v}: Postgres has {rows}, not exactly the acknowledged "
                     f"{acked[v]}")
        for s in (front, c):
            rf = redis_first(s) or {}
            if rf.get("reconciled") is not False:
                fail(f"{s.name}: /stats redisFirst {rf}: reconciled with a dead letter left")
        if cli(pb, "DEL", dead[vb][1]) != "1":
            fail(f"DEL {dead[vb][1]} on {pb}")
        wait_drained([front, c])
        for v, p in ((va, pa), (vb, pb)):
            n = len(acked[v])
            got = {"stock": cli(p, "HGET", vkey(v), "stock"),
                   "buyers": cli(p, "SCARD", vkey(v, ":buyers")),
                   "landed": cli(p, "GET", vkey(v, ":landed"))}
            if got != {"stock": str(5 - n), "buyers": str(n), "landed": str(n)}:
                fail(f"voucher {v} on {p}: {got}, expected stock {5 - n}, {n} buyers, "
                     f"{n} landed")
            left = kit.stream_unsettled(lambda *x, p=p, v=v: cli(p, *x), vkey(v, ":orders"))
            if left != (0, 0):
                fail(f"{vkey(v, ':orders')} on {p}: (unsettled, pending) {left}")
        print(f"    replayed orders landed {took:.1f} s after the replay; reconciled on both "
              f"once the old letter was gone", flush=True)
    finally:
        stop_all(*(s for s in (front, c) if s is not None))


if __name__ == "__main__":
    ss.main(teardown)
