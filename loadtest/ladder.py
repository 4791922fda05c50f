#!/usr/bin/env python3
"""loadtest/ladder.py -- the demo ladder: the classic walk from a broken
flash sale to a correct one, each step measured under real load (make ladder).

For every step the ladder restarts the seckill instances behind nginx with
that step's strategies (SECKILL_LOCK, SECKILL_STOCK) and race-widening knobs
(DEMO_DELAY_MS, DEMO_PAUSE_MS, LOCK_LEASE_MS), resets the voucher through the
admin API, drives it, then reads the outcome in Postgres (orders, oversold,
duplicate users, stock drift), in nginx's access log (answers per status and
per instance), in the clients' per-request times (req/s, p99) and in each
instance's /stats (lock releases by a non-owner, watchdog renewals). Each
step's expected outcome -- a failure for the broken steps, none for the fixed
ones -- is asserted: the exit status is 1 when one does not reproduce.

  stock steps  a sale to 1000 distinct buyers with ab (DEMO_RANDOM_USER=1), 50
               concurrent, stock 100, DEMO_DELAY_MS=20 between the reads and
               the writes of the transaction: the same load for every strategy
  lock steps   a single-user storm: 8 keep-alive connections through nginx send
               the same X-User-Id at once, then again 50 ms after each answer,
               for 3 s; stock 100. A holder keeps the user's lock 2 s
               (DEMO_DELAY_MS=2000; step 9: a 1.1 s stall, DEMO_PAUSE_MS)
  failover     the lock a Redis failover loses (steps 12-15, a stack with
  steps        REDIS_HA=1: a master, two replicas, three Sentinels). First the
               price: a sale of 1000 distinct buyers with ab (20 concurrent)
               with the step's settings. Then one user who bought before (his
               token counter is on every replica): the replicas are paused
               (SIGSTOP) and the master's links to them cut (CLIENT KILL TYPE
               replica: a paused replica's kernel would still buffer the grant
               and apply it on SIGCONT), his request A on instance 1 takes the
               lock on the master and stalls 8 s (DEMO_PAUSE_MS, instance 1
               only); the
               master is SIGKILLed and the replicas resumed, Sentinel promotes
               one that never saw the grant; his request B on instance 2 finds
               the lock free and stays 7 s in its transaction (DEMO_DELAY_MS,
               instance 2 only), so A writes while B's transaction is open.
               Without fencing both write (a duplicate); with fencing A's token
               is older than B's and Postgres refuses A; with
               LOCK_SYNC_REPLICAS=1 A gets 503 (no replica acknowledged the
               grant), and with the replicas running the promoted replica has
               the lock, so B is refused
  redis steps  SECKILL_STOCK=redis: 300 buyers (20 concurrent), their order
               ids kept, with the consumers off; Redis SIGKILLed right after
               and restarted from its AOF; the consumers on, the stream
               drained; then the acknowledged orders that are not rows. Step
               16 runs appendfsync everysec on a slow disk (every fsync 3 s
               longer: build/slow_fsync.so, LD_PRELOAD): Redis holds back its
               AOF writes while a background fsync runs and answers anyway, so
               orders are lost, each listed in steps/16-redis-lost/lost.txt;
               step 17 runs appendfsync always: none is lost

It runs a stack of its own (scripts/stack.sh, RUN_DIR default .run/ladder, free
ports), without the unique constraint uq_voucher_order_user_voucher (it would
hide the locks' failures), and restores the constraint at the end (duplicate
rows deleted first). The stack is stopped at the end unless --keep-stack: then
it stays up with the safe default strategies.

Outputs (OUT, default build/ladder): ladder.txt (the terminal table),
ladder.md (Markdown report), ladder.png (gnuplot chart: oversold, duplicate
orders and success rate per step), ladder.html (per step: its invariants and
its latency percentiles over time, report.py's inline SVG charts: the storms
from the ladder's client in 0.25 s buckets, the sales per second from nginx's
access log), ladder.json (every figure), steps/ (raw
load output, the access-log slice and /stats of every step; run-N/ with --runs).

  lock services  after those, per lock backend of another service (zk,
               pg-table, pg-advisory) the storm, then for every backend (Redis's
               too) a holder killed with SIGKILL while it holds a user's lock
               (time until the other instance gets it) and the lock's service
               stopped mid-sale (what buyers see): LOCK_BACKENDS below; the
               stack then runs a ZooKeeper too (LOCK_SERVICES=zk). multilock and
               redlock run on five redis-server processes of the ladder's own
               (scripts/redis-nodes.sh, RUN_DIR-nodes); their storm, crash and
               outage steps are left out with --quick. Last, the nodes' failures:
               RedLock with a node restarted empty (two holders), the same with
               a delayed restart (one holder), MultiLock with a node down (no sale)

  loadtest/ladder.py [--quick] [--runs N] [--steps 1,2,8] [--no-batched]
                     [--no-lock-services] [--no-failover]
                     [--keep-stack] [--run-dir DIR] [--out DIR]

--quick: 500 buyers instead of 1000 in the stock steps and the failover steps'
sales (CI); every assertion stays. --no-failover: without steps 12-15. --runs N: the whole ladder N times on the same stack, then how often
each step's expected outcome reproduced. Python 3 standard library only; needs
ab, psql, curl (stack.sh) and, for the chart, gnuplot.
"""

import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse

sys.dont_write_bytecode = True          # no __pycache__ in loadtest/
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import check_invariants  # noqa: E402
import kit  # noqa: E402
import report  # noqa: E402

UNIQUE = "uq_voucher_order_user_voucher"

# Instance settings the ladder sets itself for every step: never inherited.
STEP_VARS = ("SECKILL_LOCK", "SECKILL_STOCK", "DEMO_DELAY_MS", "DEMO_PAUSE_MS",
             "LOCK_LEASE_MS", "WATCHDOG_TIMEOUT_MS", "DEMO_RANDOM_USER", "INSTANCES",
             "LOG_LEVEL", "FENCING", "LOCK_SYNC_REPLICAS", "LOCK_SYNC_TIMEOUT_MS", "REDIS_HA",
             "INSTANCE_ENV_1", "INSTANCE_ENV_2", "REDIS_ORDER_DURABILITY", "CONSUMERS",
             "ZK_SESSION_TIMEOUT_MS", "LOCK_PG_SWEEP_MS", "LOCK_REDIS_NODES")
# The caller's variables that must not leak into the stack or the loads.
SCRUB = STEP_VARS + ("BASE_URL", "PG_DSN", "REDIS_URL", "NGINX_ACCESS_LOG", "VOUCHER_ID",
                     "LOADTEST_OUT", "ADMIN_TOKEN", "REDIS_SENTINELS", "REDIS_MASTER_NAME",
                     "ZK_HOSTS", "LOCK_SERVICES", "LOCK_REDIS_NODE_TIMEOUT_MS")

# ------------------------------------------------------------------ the steps

SALE = {"kind": "sale", "requests": 1000, "concurrency": 50, "stock": 100}
STORM = {"kind": "storm", "connections": 8, "seconds": 3.0, "gap": 0.05, "stock": 100}
STORM_BUCKET = 0.25                          # s: the storms' latency timeline
CRASH = {"kind": "redis-crash", "requests": 300, "concurrency": 20, "stock": 1000}
# Step 16's disk: each fsync of its Redis takes this long (build/slow_fsync.so).
SLOW_FSYNC_MS = 3000
STOCK_ENV = {"DEMO_DELAY_MS": 20}
LOCK_ENV = {"DEMO_DELAY_MS": 2000}           # the user's lock is held 2 s
# The failover steps: the price sale, then the lost lock (see the module doc).
# B's transaction (from the failover, about 3 s after A's grant, for delay_ms)
# must be open when A writes (pause_ms after its grant), and with fencing
# A's wait for the fence row B holds (until B commits) must stay below
# PG_STATEMENT_TIMEOUT_MS (5 s), or A gets 503 instead of its refusal.
FAILOVER = {"kind": "failover", "requests": 1000, "concurrency": 20, "stock": 100,
            "pause_ms": 8000, "delay_ms": 7000}
SYNC_ENV = {"LOCK_SYNC_REPLICAS": 1, "LOCK_SYNC_TIMEOUT_MS": 300}
STALE_MESSAGE = "stale fencing token"

STEPS = [
    # num, key, title, lock, stock, instances, extra env, load, expectation
    dict(num=1, key="naive", title="naive stock", lock="reentrant", stock="naive",
         instances=2, env=STOCK_ENV, load=SALE,
         expect="oversells, loses updates",
         story="read stock, check in C, write back read-1"),
    dict(num=2, key="cas", title="compare-and-swap", lock="reentrant", stock="cas",
         instances=2, env=STOCK_ENV, load=SALE,
         expect="no oversell, sells < optimistic",
         story="UPDATE ... WHERE stock = <value read>"),
    dict(num=3, key="optimistic", title="stock > 0", lock="reentrant", stock="optimistic",
         instances=2, env=STOCK_ENV, load=SALE,
         expect="sells exactly the stock",
         story="UPDATE ... SET stock = stock - 1 WHERE stock > 0"),
    dict(num=4, key="pessimistic", title="FOR UPDATE", lock="reentrant", stock="pessimistic",
         instances=2, env=STOCK_ENV, load=SALE,
         expect="sells exactly the stock",
         story="SELECT ... FOR UPDATE, then write"),
    dict(num=5, key="none", title="no lock", lock="none", stock="optimistic",
         instances=2, env=LOCK_ENV, load=STORM,
         expect="duplicates",
         story="check 'has this user an order?' then insert, unlocked"),
    dict(num=6, key="local-1", title="local mutex", lock="local",
         stock="optimistic", instances=1, env=LOCK_ENV, load=STORM,
         expect="exactly 1 order",
         story="a per-user mutex inside the process"),
    dict(num=7, key="local-2", title="local mutex", lock="local",
         stock="optimistic", instances=2, env=LOCK_ENV, load=STORM,
         expect="duplicates (1 per instance)",
         story="the same mutex, nginx round-robins the user over two processes"),
    dict(num=8, key="setnx", title="SETNX, lease < hold", lock="setnx", stock="optimistic",
         instances=2, env={"DEMO_DELAY_MS": 2000, "LOCK_LEASE_MS": 1000}, load=STORM,
         expect="deletes other's lock, duplicates",
         story="SET NX EX 1, DEL without owner check; the transaction takes 2 s"),
    dict(num=9, key="owner", title="owner + Lua release", lock="owner", stock="optimistic",
         instances=2, env={"DEMO_PAUSE_MS": 1100, "DEMO_DELAY_MS": 0, "LOCK_LEASE_MS": 1000},
         load=STORM,
         expect="release refused, 1 order",
         story="SET NX PX 1000 with an owner id, compare-and-delete in Lua; "
               "the holder stalls 1.1 s after taking the lock, then orders"),
    dict(num=10, key="reentrant", title="reentrant + watchdog", lock="reentrant",
         stock="optimistic", instances=2,
         env={"DEMO_DELAY_MS": 2000, "LOCK_LEASE_MS": -1, "WATCHDOG_TIMEOUT_MS": 1000},
         load=STORM,
         expect="1 order, lease renewed",
         story="Redisson-style hash lock, 1 s lease renewed by the watchdog; "
               "the transaction takes 2 s"),
    dict(num=11, key="batched", title="batched (group commit)", lock="reentrant",
         stock="batched", instances=2, env=STOCK_ENV, load=SALE, optional=True,
         expect="sells exactly the stock",
         story="one statement settles a batch of buyers"),
    dict(num=12, key="lost-nofence", title="failover, no fence", lock="reentrant",
         stock="optimistic", instances=2, env={"FENCING": 0}, load=FAILOVER, failover=True,
         replicas="paused", expect="lock lost: duplicate order",
         story="the master dies before the grant reaches a replica; FENCING=0 (unsafe demo "
               "setting): Postgres does not check the token, both holders write"),
    dict(num=13, key="lost-fence", title="failover + fencing", lock="reentrant",
         stock="optimistic", instances=2, env={}, load=FAILOVER, failover=True,
         replicas="paused", expect="stale write refused, 1 order",
         story="the same, with the default fence: the stale holder's token is older than "
               "the second holder's, and Postgres refuses its write"),
    dict(num=14, key="lost-wait-paused", title="failover + WAIT 1, replicas paused",
         lock="reentrant", stock="optimistic", instances=2, env=SYNC_ENV, load=FAILOVER,
         failover=True, replicas="paused", expect="no ack: 503, grant undone, 1 order",
         story="LOCK_SYNC_REPLICAS=1: WAIT after the grant; with the replicas paused no "
               "replica acknowledges it within 300 ms, the grant is undone and A gets 503"),
    dict(num=15, key="lost-wait", title="failover + WAIT 1", lock="reentrant",
         stock="optimistic", instances=2, env=SYNC_ENV, load=FAILOVER, failover=True,
         replicas="running", expect="lock kept: 2nd refused, 1 order",
         story="LOCK_SYNC_REPLICAS=1 with the replicas running: the grant reached a replica "
               "before A went on, the promoted replica has the lock, B is refused"),
    dict(num=16, key="redis-lost", title="redis-first, AOF everysec", lock="reentrant",
         stock="redis", instances=2, env={"REDIS_ORDER_DURABILITY": "none", "CONSUMERS": 0},
         redis_aof="everysec", slow_fsync_ms=SLOW_FSYNC_MS, load=CRASH, optional=True,
         expect="acked orders lost, each found",
         story="Lua admission answered at once; Redis on appendfsync everysec with a slow "
               "disk, killed right after a burst, before the consumers persisted it"),
    dict(num=17, key="redis-durable", title="redis-first, AOF always", lock="reentrant",
         stock="redis", instances=2, env={"CONSUMERS": 0}, redis_aof="always", load=CRASH,
         optional=True, expect="no acked order lost",
         story="the same with appendfsync always: the 200 comes after the fsync"),
]


# The lock backends of the lock-service steps: the single-user storm on each
# backend of another service, then, per backend, its holder killed and its
# service stopped mid-sale. A backend is one entry: its settings for these
# steps, the stack service it needs (scripts/stack.sh service-stop/-start),
# and when a killed holder's lock must be free again (seconds after the kill).
HOLD_S = 3                                   # leases and session timeouts of these steps
LOCK_BACKENDS = [
    dict(lock="reentrant", service="redis", storm=False,
         env={"LOCK_LEASE_MS": -1, "WATCHDOG_TIMEOUT_MS": HOLD_S * 1000},
         frees="watchdog lease ends", free_s=(HOLD_S * 2 / 3 - 0.4, HOLD_S + 0.6)),
    dict(lock="zk", service="zk", storm=True,
         env={"ZK_SESSION_TIMEOUT_MS": HOLD_S * 1000},
         frees="session timeout", free_s=(HOLD_S * 2 / 3 - 0.4, HOLD_S + 1.5)),
    dict(lock="pg-table", service="postgres", storm=True,
         env={"LOCK_LEASE_MS": HOLD_S * 1000},
         frees="row expires", free_s=(HOLD_S - 1.0, HOLD_S + 0.6)),
    dict(lock="pg-advisory", service="postgres", storm=True, env={},
         frees="session ends", free_s=(0.0, 1.0)),
    # independent Redis masters the ladder starts itself (scripts/redis-nodes.sh):
    # "@nodes3" / "@nodes5" stand for the first three / all five
    dict(lock="multilock", service="nodes", storm=True,
         env={"LOCK_LEASE_MS": HOLD_S * 1000, "LOCK_REDIS_NODES": "@nodes3"},
         frees="lease ends", free_s=(HOLD_S - 1.0, HOLD_S + 0.6)),
    dict(lock="redlock", service="nodes", storm=True,
         env={"LOCK_LEASE_MS": HOLD_S * 1000, "LOCK_REDIS_NODES": "@nodes5"},
         frees="lease ends", free_s=(HOLD_S - 1.0, HOLD_S + 0.6)),
]
NODES = 5                    # redis-server processes of the multilock and redlock steps
CRASH_PAUSE_MS = 5000        # the holder stalls this long after taking the lock: killed meanwhile
# The load runs SECONDS, and at least AFTER_S once the service is back: a
# service slow to start (ZooKeeper's JVM on a busy machine) would otherwise
# leave no time to see the sales resume. A ZooKeeper client that connected
# while the server was still starting waits out its connect timeout (2/3 of
# ZK_SESSION_TIMEOUT_MS) before it tries again.
OUTAGE = {"kind": "outage", "connections": 8, "seconds": 7.0, "stop_at": 2.0, "start_at": 4.5,
          "after_s": 3.0, "stock": 100000}


def lock_steps(first):
    """The lock-service steps, numbered from 'first'."""
    out = []
    for b in LOCK_BACKENDS:
        if b["storm"]:
            out.append(dict(key=f"storm-{b['lock']}", title=f"{b['lock']}: one user",
                            lock=b["lock"], stock="optimistic", instances=2,
                            env=dict(LOCK_ENV, **{k: v for k, v in b["env"].items()
                                                  if k == "LOCK_REDIS_NODES"}),
                            load=STORM, service=b["service"], expect="exactly 1 order",
                            story=f"the single-user storm with SECKILL_LOCK={b['lock']}",
                            full_only=b["service"] == "nodes"))
    for b in LOCK_BACKENDS:
        out.append(dict(key=f"crash-{b['lock']}", title=f"{b['lock']}: holder killed",
                        lock=b["lock"], stock="optimistic", instances=2, backend=b,
                        env=dict(b["env"], DEMO_PAUSE_MS=CRASH_PAUSE_MS),
                        load={"kind": "crash", "stock": 100}, service=b["service"],
                        full_only=b["service"] == "nodes",
                        expect=f"free in {b['free_s'][0]:g}-{b['free_s'][1]:g} s, 1 order",
                        story=f"instance 1 takes the user's lock and is killed (SIGKILL) while "
                              f"it holds it; instance 2 asks every 25 ms: the lock is free when "
                              f"the {b['frees']}"))
    for b in LOCK_BACKENDS:
        out.append(dict(key=f"outage-{b['lock']}", title=f"{b['lock']}: {b['service']} down",
                        lock=b["lock"], stock="optimistic", instances=2, backend=b,
                        env=dict(b["env"]), load=OUTAGE, service=b["service"],
                        full_only=b["service"] == "nodes",
                        expect="503 while down, no hang, no wrong order",
                        story=f"distinct buyers for {OUTAGE['seconds']:g} s (and {OUTAGE['after_s']:g} s "
                              f"at least once it is back); {b['service']} "
                              f"stopped at {OUTAGE['stop_at']:g} s, started at "
                              f"{OUTAGE['start_at']:g} s"))
    # What the independent nodes do when one of them fails (load "nodes").
    # the holder keeps the lock 4 s between its "has this user an order?" and
    # its insert (DEMO_DELAY_MS; the nodes' signals take about 2 s), within
    # a 6 s lease, so two holders' transactions overlap
    nodes_env = {"LOCK_LEASE_MS": 6000, "DEMO_DELAY_MS": 4000}
    out += [
        dict(key="redlock-restart", title="redlock: node restarts empty", lock="redlock",
             stock="optimistic", instances=2, service="nodes",
             env=dict(nodes_env, LOCK_REDIS_NODES="@nodes5"),
             load={"kind": "nodes", "scenario": "restart", "stock": 100},
             expect="two holders, 2 orders (no fence)",
             story="instance 1 holds nodes A, B, C (D, E paused); C is killed and started "
                   "again at once without persistence; A, B paused: instance 2 takes C, D, E "
                   "while instance 1 still holds its lease"),
        dict(key="redlock-delayed", title="redlock: delayed restart", lock="redlock",
             stock="optimistic", instances=2, service="nodes",
             env=dict(nodes_env, LOCK_REDIS_NODES="@nodes5"),
             load={"kind": "nodes", "scenario": "delayed", "stock": 100},
             expect="one holder, 1 order",
             story="the same, but C rejoins only after the longest lease: instance 2 reaches "
                   "D and E only, no majority (503)"),
        dict(key="multilock-node-down", title="multilock: a node down", lock="multilock",
             stock="optimistic", instances=2, service="nodes",
             env={"LOCK_REDIS_NODES": "@nodes3"},
             load={"kind": "nodes", "scenario": "down", "stock": 100},
             expect="no one buys (503), no oversell",
             story="one of the three nodes killed; 40 distinct buyers through nginx"),
    ]
    for i, st in enumerate(out):
        st["num"] = first + i
    return out


STEPS += lock_steps(len(STEPS) + 1)


def check_step(step, r, results):
    """[(ok, text)] for the step's expected outcome; r: the step's figures."""
    k = step["key"]
    out = []
    stock = r["initialStock"]
    if k == "naive":
        out.append((r["oversold"] > 0, f"oversold {r['oversold']} > 0"))
    elif k in ("cas", "optimistic", "pessimistic", "batched"):
        out.append((r["oversold"] == 0, f"oversold {r['oversold']} = 0"))
        out.append((r["stockDrift"] == 0, f"stock drift {r['stockDrift']} = 0"))
        if k == "cas":
            opt = results.get("optimistic")
            if opt is not None:
                out.append((r["orders"] < opt["orders"],
                            f"cas sold {r['orders']} < optimistic {opt['orders']}"))
        else:
            out.append((r["orders"] == stock, f"orders {r['orders']} = stock {stock}"))
    elif k == "none":
        out.append((r["duplicateUsers"] >= 1 and r["orders"] > 1,
                    f"duplicate users {r['duplicateUsers']} >= 1 ({r['orders']} orders)"))
    elif k == "local-1":
        out.append((r["orders"] == 1 and r["duplicateUsers"] == 0,
                    f"orders {r['orders']} = 1, duplicate users {r['duplicateUsers']} = 0"))
    elif k == "local-2":
        out.append((r["duplicateUsers"] >= 1,
                    f"duplicate users {r['duplicateUsers']} >= 1 ({r['orders']} orders)"))
        ok_from = sorted(i for i, n in r["okByInstance"].items() if n > 0)
        out.append((len(ok_from) >= 2,
                    f"200s came from {len(ok_from)} instances ({', '.join(ok_from) or '-'})"))
    elif k == "setnx":
        out.append((r["notOwnerReleases"] >= 1,
                    f"deletes of a lock no longer ours {r['notOwnerReleases']} >= 1"))
        out.append((r["duplicateUsers"] >= 1,
                    f"duplicate users {r['duplicateUsers']} >= 1 ({r['orders']} orders)"))
    elif k == "owner":
        out.append((r["notOwnerReleases"] >= 1,
                    f"releases refused {r['notOwnerReleases']} >= 1"))
        out.append((r["orders"] == 1 and r["duplicateUsers"] == 0,
                    f"orders {r['orders']} = 1, duplicate users {r['duplicateUsers']} = 0"))
    elif k in ("redis-lost", "redis-durable"):
        out.append((r["stockDrift"] == 0 and r["oversold"] == 0 and r["duplicateUsers"] == 0,
                    f"Postgres: drift {r['stockDrift']}, oversold {r['oversold']}, "
                    f"duplicate users {r['duplicateUsers']} = 0"))
        if k == "redis-lost":
            out.append((0 < r["ackedLost"] <= r["ok"],
                        f"acknowledged orders lost {r['ackedLost']} > 0 "
                        f"(of {r['ok']}), each listed in lost.txt"))
        else:
            out.append((r["ackedLost"] == 0, f"acknowledged orders lost {r['ackedLost']} = 0 "
                                        f"(of {r['ok']})"))
        # Lost or not, what Redis still has and Postgres agree once drained.
        out.append((r["reconciled"], "Redis and Postgres agree after the drain"))
    elif k == "reentrant":
        out.append((r["orders"] == 1 and r["duplicateUsers"] == 0,
                    f"orders {r['orders']} = 1, duplicate users {r['duplicateUsers']} = 0"))
        out.append((r["renewals"] >= 1, f"watchdog renewals {r['renewals']} >= 1"))
    elif k.startswith("storm-"):
        out.append((r["orders"] == 1 and r["duplicateUsers"] == 0,
                    f"orders {r['orders']} = 1, duplicate users {r['duplicateUsers']} = 0"))
    elif k == "redlock-restart":
        n = r["nodes"]
        out.append((n["firstAnswer"] == 200 and n["secondAnswer"] == 200,
                    f"both instances answered 200 ({n['firstAnswer']}, {n['secondAnswer']})"))
        out.append((r["orders"] == 2 and r["duplicateUsers"] == 1,
                    f"orders {r['orders']} = 2 of one user (duplicate users {r['duplicateUsers']})"))
        return out
    elif k == "redlock-delayed":
        n = r["nodes"]
        out.append((n["firstAnswer"] == 200 and n["secondAnswer"] == 503,
                    f"instance 1 answered {n['firstAnswer']} = 200, instance 2 "
                    f"{n['secondAnswer']} = 503 (no majority)"))
        out.append((r["orders"] == 1 and r["duplicateUsers"] == 0,
                    f"orders {r['orders']} = 1, duplicate users {r['duplicateUsers']} = 0"))
        return out
    elif k == "multilock-node-down":
        out.append((r["statuses"] == {"503": r["requests"]},
                    f"every answer 503 while a node is down: {r['statuses']}"))
        n = r["nodes"]
        out.append((n["ordersWhileDown"] == 0 and r["oversold"] == 0,
                    f"orders while down {n['ordersWhileDown']} = 0, oversold {r['oversold']} = 0"))
        out.append((r["nodes"]["afterOk"] >= 1,
                    f"the node back: {r['nodes']['afterOk']} x 200"))
        return out
    elif k.startswith("crash-"):
        lo, hi = step["backend"]["free_s"]
        c = r["crash"]
        out.append((c["heldBeforeKill"], "instance 2 was refused (409) while instance 1 held it"))
        free = c["freeAfterS"]
        out.append((free is not None and lo <= free <= hi,
                    f"lock free {'never' if free is None else f'{free:.2f} s'} after the kill "
                    f"(expected {lo:g}-{hi:g} s: {step['backend']['frees']})"))
        out.append((r["orders"] == 1 and c["winner"] == 200,
                    f"orders {r['orders']} = 1, instance 2's order answered {c['winner']}"))
        return out + [(r["strategiesSeen"] == [f"{step['lock']}/{step['stock']}"],
                       f"instance 2 ran {', '.join(r['strategiesSeen']) or '?'}"),
                      (r["status5xx"] == 0, f"5xx answers of instance 2: {r['status5xx']}")]
    elif k.startswith("outage-"):
        o = r["outage"]
        bad = {s: n for s, n in r["statuses"].items() if s not in ("200", "409", "503")}
        out.append((not bad and r["transportErrors"] == 0,
                    f"answers only 200/409/503 (others {bad or 0}, transport errors "
                    f"{r['transportErrors']})"))
        out.append((o["unavailable"] >= 1, f"503 unavailable while down: {o['unavailable']} >= 1"))
        out.append((o["maxMs"] < 5000, f"slowest answer {o['maxMs']:.0f} ms < 5000 (no hang)"))
        # An order is a 200, or a 503 whose request was under way while the
        # service was being stopped (its commit went through, the stop cut off
        # its answer: the buyer's retry gets 409 already_ordered). Never two
        # per user, never beyond the stock.
        lost = r["orders"] - r["ok"]
        out.append((0 <= lost <= o["inFlight503"] and r["duplicateUsers"] == 0
                    and r["oversold"] == 0,
                    f"orders {r['orders']} = 200 answers {r['ok']} + {lost} whose answer the stop "
                    f"cut off (at most the {o['inFlight503']} 503s under way while it stopped), duplicate "
                    f"users {r['duplicateUsers']}, oversold {r['oversold']}"))
        out.append((o["okAfter"] >= 1, f"sales resumed after the restart: {o['okAfter']} x 200"))
        return out + [(r["strategiesSeen"] == [f"{step['lock']}/{step['stock']}"] * step["instances"],
                       f"instances ran {', '.join(r['strategiesSeen']) or '?'}")]
    elif step.get("failover"):
        out.extend(check_failover(step, r))
    # Every step: the instances ran what the step says, and no answer was lost
    # (the failover steps: in their sale).
    out.append((r["strategiesSeen"] == [f"{step['lock']}/{step['stock']}"] * step["instances"],
                f"instances ran {', '.join(r['strategiesSeen']) or '?'}"))
    out.append((r["transportErrors"] == 0 and r["status5xx"] == 0,
                f"transport errors {r['transportErrors']}, 5xx answers {r['status5xx']}"))
    return out


def check_failover(step, r):
    """The lost-lock steps' expectations; r["lost"] is the scenario's record."""
    k, f = step["key"], r["lost"]
    a, b = f["a"], f["b"]
    out = [(f["lockOnNewMaster"] == (1 if k == "lost-wait" else 0),
            f"the promoted replica {'has' if f['lockOnNewMaster'] else 'has no'} lock"),
           (f["bSentBeforeAResumed"],
            f"B sent {f['bSentAfterLockS']:.1f} s after A's grant, before A resumed "
            f"({FAILOVER['pause_ms'] / 1000:g} s)")]
    if k == "lost-nofence":
        out.append((a == "200" and b == "200", f"A {a}, B {b}: both wrote"))
        out.append((r["orders"] == 2 and r["duplicateUsers"] == 1,
                    f"orders {r['orders']} = 2 for one user (duplicate users {r['duplicateUsers']})"))
    elif k == "lost-fence":
        out.append((b == "200", f"B {b}"))
        out.append((a == "409" and STALE_MESSAGE in f["aMessage"],
                    f"A {a}: {f['aMessage'] or '-'} (want 409, {STALE_MESSAGE})"))
        out.append((f["staleTokenRejections"] >= 1,
                    f"stale-token rejections on instance 1: {f['staleTokenRejections']} >= 1"))
        out.append((r["orders"] == 1, f"orders {r['orders']} = 1"))
    elif k == "lost-wait-paused":
        out.append((a == "503", f"A {a}: {f['aMessage'] or '-'} (want 503: no replica acknowledged)"))
        out.append((f["unsynced"] >= 1, f"grants undone on instance 1: {f['unsynced']} >= 1"))
        out.append((b == "200", f"B {b}"))
        out.append((r["orders"] == 1, f"orders {r['orders']} = 1"))
    elif k == "lost-wait":
        out.append((b == "409", f"B {b} (want 409: the lock survived the failover)"))
        out.append((a == "200", f"A {a}"))
        out.append((r["orders"] == 1, f"orders {r['orders']} = 1"))
    return out


# ------------------------------------------------------------------ helpers

class LadderError(Exception):
    """Something other than an expectation failed (exit status 2)."""


def log(msg):
    print(f"ladder: {msg}", file=sys.stderr, flush=True)


class Stack(kit.Stack):
    """The ladder's stack: every step sets the instances' strategies and knobs
    afresh (STEP_VARS not named by a step are unset)."""

    def __init__(self, run_dir, services=""):
        super().__init__(run_dir, scrub=SCRUB)
        self.instances = None
        self.services = services             # LOCK_SERVICES: the steps' lock services
        self.ha = None

    def configure(self, instances, step_env):
        """The instances run with step_env. True when the database is new
        (a full start), so the caller sets it up again."""
        settings = {k: None for k in STEP_VARS}
        settings.update({"INSTANCES": instances, "DEMO_RANDOM_USER": 1, "LOG_LEVEL": "warn",
                         "LOCK_SERVICES": self.services})
        settings.update(step_env)
        ha = str(step_env.get("REDIS_HA", 0)) == "1"
        fresh = not (self.started and self.instances == instances and self.ha == ha)
        # First start, another instance count, or Redis with(out) Sentinel:
        # the whole stack (a new database: the caller drops the constraint
        # and makes the voucher).
        self.command("start" if fresh else "restart-instances", 180, **settings)
        self.instances = instances
        self.ha = ha
        return fresh

    def service(self, what, name, timeout=90):
        """scripts/stack.sh service-stop|service-start NAME."""
        p = subprocess.run([kit.STACK_SH, f"service-{what}", name], capture_output=True, text=True,
                           timeout=timeout, env=self.run_env(), cwd=ROOT)
        if p.returncode != 0:
            raise LadderError(f"stack.sh service-{what} {name}: {p.stderr.strip()[-800:]}")

    def stop(self):
        p = self.run("stop")
        if p.returncode != 0:
            log(f"stack.sh stop: {p.stderr.strip()}")
        self.started = False


# ------------------------------------------------------------------ one step

class Ladder:
    def __init__(self, args):
        self.args = args
        self.out = args.out
        services = sorted({s["service"] for s in args.selected if s.get("service") == "zk"})
        self.stack = Stack(args.run_dir, " ".join(services))
        self.nodes_dir = os.path.join(args.run_dir + "-nodes")
        self.node_urls = None
        self.extra = {}
        self.voucher = None
        self.lost_voucher = None     # the failover steps' scenario
        self.spawned = []            # Redis nodes the failover steps started again
        self.constraint_dropped = False
        self.user_base = 8_000_000_000 + random.randrange(1_000_000) * 1000

    def nodes(self, what, *args):
        """scripts/redis-nodes.sh WHAT <the ladder's nodes dir> ARGS; its stdout."""
        p = subprocess.run([os.path.join(ROOT, "scripts", "redis-nodes.sh"), what,
                            self.nodes_dir, *map(str, args)],
                           capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise LadderError(f"redis-nodes.sh {what} {args}: {p.stderr.strip()[-500:]}")
        return p.stdout.strip()

    def node_env(self, env):
        """The step's env with "@nodesN" replaced by the first N nodes' URLs
        (the nodes are started at the first step that needs them)."""
        v = env.get("LOCK_REDIS_NODES", "")
        if not v.startswith("@nodes"):
            return env
        if self.node_urls is None:
            out = self.nodes("start", NODES)
            self.node_urls = out.split("=", 1)[1].split(",")
        return dict(env, LOCK_REDIS_NODES=",".join(self.node_urls[:int(v[len("@nodes"):])]))

    def stop_nodes(self):
        if self.node_urls is not None:
            self.nodes("stop")
            self.node_urls = None

    def service(self, what, name):
        """Stops or starts a step's lock service: every node for "nodes"."""
        if name != "nodes":
            self.stack.service(what, name)
        elif what == "stop":
            self.nodes("stop")
        else:
            for i in range(1, NODES + 1):
                self.nodes("start-node", i)

    @property
    def dsn(self):
        return self.stack.dsn

    @property
    def base_url(self):
        return self.stack.base_url

    def setup_db(self):
        """A new database: no unique constraint, one voucher for the ladder."""
        kit.psql(self.dsn, f"ALTER TABLE tb_voucher_order DROP CONSTRAINT IF EXISTS {UNIQUE}")
        self.constraint_dropped = True
        self.voucher = self.stack.create_voucher(100, "demo ladder")
        self.lost_voucher = self.stack.create_voucher(100, "demo ladder: the lost lock")

    def restore_constraint(self):
        if not self.constraint_dropped or not self.stack.info:
            return
        kit.psql(self.dsn,
                 "DELETE FROM tb_voucher_order o USING tb_voucher_order p "
                 "WHERE o.user_id = p.user_id AND o.voucher_id = p.voucher_id AND o.id > p.id;\n"
                 f"ALTER TABLE tb_voucher_order ADD CONSTRAINT {UNIQUE} UNIQUE (user_id, voucher_id);")
        self.constraint_dropped = False
        log(f"unique constraint {UNIQUE} restored (duplicate orders deleted first)")

    def distinct_buyers(self, voucher):
        return int(kit.psql_value(self.dsn, "SELECT count(DISTINCT user_id) FROM tb_voucher_order "
                                            f"WHERE voucher_id = {int(voucher)}"))

    def reset_voucher(self, stock):
        self.stack.admin("POST", f"/admin/vouchers/{self.voucher}/reset", {"stock": stock}, want=200)

    def instance_stats(self):
        out = []
        for url in self.stack.instance_urls:
            s = kit.call(url, "GET", "/stats", want=200).body
            if not isinstance(s, dict):
                raise LadderError(f"GET {url}/stats: not a JSON object: {s!r}")
            out.append(s)
        return out

    def run_ab(self, name, n, c, url, step_dir):
        args = ["ab", "-l", "-r", "-s", "30", "-n", str(n), "-c", str(c),
                "-g", os.path.join(step_dir, f"{name}.tsv"), "-m", "POST", url]
        out = open(os.path.join(step_dir, f"{name}.txt"), "w")
        try:
            return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        finally:
            out.close()

    def redis_cli(self, *args):
        return kit.run(["redis-cli", "-u", self.stack.info["REDIS_URL"], "--raw"]
                       + [str(a) for a in args], 30).stdout.strip()

    def redis_persistence(self, aof):
        """The stack's Redis: AOF with appendfsync always, or none."""
        if aof == "no":
            self.redis_cli("CONFIG", "SET", "appendonly", "no")
            return
        self.redis_cli("CONFIG", "SET", "appendfsync", aof)
        self.redis_cli("CONFIG", "SET", "appendonly", "yes")
        deadline = time.monotonic() + 30
        while True:
            info = self.redis_cli("INFO", "persistence")
            if "aof_enabled:1" in info and "aof_rewrite_in_progress:0" in info:
                return
            if time.monotonic() > deadline:
                raise LadderError("Redis did not switch its AOF on")
            time.sleep(0.1)

    def redis_pid_port(self):
        pid = self.stack.pid("redis")
        return pid, int(self.stack.info["REDIS_URL"].rsplit(":", 1)[1].split("/")[0])

    def redis_start(self, aof, port, slow_fsync_ms=0):
        """A new Redis on the stack's port and directory, from its AOF (or,
        aof "no", empty). slow_fsync_ms: every fsync of it that much slower
        (build/slow_fsync.so)."""
        rdir = os.path.join(self.stack.run_dir, "redis")
        persist = ["--appendonly", "no"] if aof == "no" else ["--appendonly", "yes",
                                                              "--appendfsync", aof]
        env = None
        if slow_fsync_ms:
            lib = os.path.join(os.path.dirname(os.environ.get(
                "SECKILL_BIN", os.path.join(ROOT, "build", "seckill"))), "slow_fsync.so")
            if not os.path.exists(lib):
                raise LadderError(f"{lib} is missing: make ladder builds it (loadtest/slow_fsync.c)")
            env = {**os.environ, "LD_PRELOAD": lib, "SLOW_FSYNC_MS": str(slow_fsync_ms)}
        p = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(port),
                              "--save", "", *persist, "--daemonize", "no", "--dir", rdir,
                              "--logfile", os.path.join(rdir, "redis.log"), "--protected-mode", "yes"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True, env=env)
        # stack.sh's pid file, so that 'stack.sh stop' stops the new one.
        with open(self.stack.pidfile("redis"), "w") as f:
            f.write(f"{p.pid}\nredis-server 127.0.0.1:{port}*\n")
        deadline = time.monotonic() + 20
        while True:
            try:
                if self.redis_cli("PING") == "PONG":
                    return
            except kit.KitError:
                pass
            if time.monotonic() > deadline:
                raise LadderError("Redis did not come back")
            time.sleep(0.1)

    def redis_wait_gone(self, pid):
        for _ in range(200):
            if not kit.pid_alive(pid):
                return
            time.sleep(0.05)
        raise LadderError(f"Redis pid {pid} did not exit")

    def redis_crash(self, aof):
        """SIGKILL of the stack's Redis, then a new one on the same port and
        directory: from its AOF, or (no AOF) empty."""
        pid, port = self.redis_pid_port()
        os.kill(pid, signal.SIGKILL)
        self.redis_wait_gone(pid)
        self.redis_start(aof, port)

    def redis_fsync_under_way(self):
        """Returns once Redis's background fsync runs (a write starts one when
        the last began a second ago or more): from then on, for up to two
        seconds, Redis holds back the AOF writes of everything it answers."""
        self.redis_cli("SET", "ladder:fsync", str(time.time()))
        deadline = time.monotonic() + 5
        while "aof_pending_bio_fsync:1" not in self.redis_cli("INFO", "persistence"):
            if time.monotonic() > deadline:
                raise LadderError("Redis started no background fsync within 5 s")
            time.sleep(0.02)

    def redis_slow_disk(self, aof, slow_fsync_ms):
        """The stack's Redis shut down cleanly (its AOF complete) and started
        again from it, now with every fsync slow_fsync_ms slower."""
        pid, port = self.redis_pid_port()
        try:
            self.redis_cli("SHUTDOWN")
        except kit.KitError:
            pass                        # the connection closes as it exits
        self.redis_wait_gone(pid)
        self.redis_start(aof, port, slow_fsync_ms)

    def drain(self, timeout=60):
        deadline = time.monotonic() + timeout
        while True:
            backlog, pending = kit.stream_unsettled(self.redis_cli)
            if backlog == 0 and pending == 0:
                return
            if time.monotonic() > deadline:
                raise LadderError(f"the stream did not drain ({backlog} left)")
            time.sleep(0.1)

    def burst_then_kill(self, step, step_dir):
        """A burst of buyers (their order ids kept), Redis killed right after
        it while the consumers are behind (off: CONSUMERS=0), Redis back, the
        consumers on, the drain; then which acknowledged orders are rows."""
        load = step["load"]
        url_path = f"/voucher/{self.voucher}/seckill"
        acked, times, errors, lock = [], [], [0], threading.Lock()
        users = iter(range(self.user_base + 500_000, self.user_base + 500_000 + load["requests"]))

        def worker():
            while True:
                with lock:
                    u = next(users, None)
                if u is None:
                    return
                t0 = time.monotonic()
                try:
                    r = kit.call(self.base_url, "POST", url_path, headers={"X-User-Id": str(u)},
                                 timeout=15)
                except kit.KitError:
                    with lock:
                        errors[0] += 1
                    continue
                with lock:
                    times.append((time.monotonic() - t0) * 1000.0)
                    if r.status == 200:
                        acked.append(int(r.body["orderId"]))

        if step.get("slow_fsync_ms"):
            self.redis_fsync_under_way()
        t0 = time.monotonic()
        threads = [threading.Thread(target=worker) for _ in range(load["concurrency"])]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        seconds = time.monotonic() - t0
        self.redis_crash(step["redis_aof"])
        self.stack.configure(step["instances"], {**self.step_env(step), "CONSUMERS": 1})
        self.drain()
        rows = {int(r[0]) for r in kit.psql(self.dsn, "SELECT id FROM tb_voucher_order "
                                                      f"WHERE voucher_id = {int(self.voucher)}")}
        lost = [i for i in acked if i not in rows]
        with open(os.path.join(step_dir, "lost.txt"), "w") as f:
            f.write("".join(f"{i}\n" for i in lost))
        st = kit.call(self.base_url, "GET", "/stats", timeout=30).body
        mine = [v for v in st.get("vouchers", []) if v.get("voucherId") == self.voucher]
        self.crash_facts = {"acked": len(acked), "lost": len(lost),
                            "reconciled": bool(mine and mine[0].get("redis", {}).get("agree"))
                                          and bool(st.get("redisFirst", {}).get("reconciled"))}
        log(f"crash: {len(acked)} acknowledged, {len(lost)} of them not in Postgres after the drain"
            f" (ids in {os.path.join(step_dir, 'lost.txt')})")
        return load["requests"], seconds, errors[0], times

    def step_env(self, step):
        env = {"SECKILL_LOCK": step["lock"], "SECKILL_STOCK": step["stock"]}
        env.update(self.node_env(step["env"]))
        if step.get("failover"):
            env["REDIS_HA"] = 1
        return env

    def drive(self, step, step_dir, user):
        """Runs the step's load; returns (requests, seconds, transport errors, times)."""
        load = step["load"]
        url = f"{self.base_url}/voucher/{self.voucher}/seckill"
        if load["kind"] == "sale":
            return self.sale(load, url, step_dir)
        if load["kind"] == "redis-crash":
            return self.burst_then_kill(step, step_dir)
        if load["kind"] == "outage":
            return self.outage(step, load, url, step_dir)
        return self.storm(load, url, user, step_dir)

    def sale(self, load, url, step_dir):
        """ab, one request per buyer (the instances run with DEMO_RANDOM_USER=1)."""
        n = load["requests"] if not self.args.quick else load["requests"] // 2
        t0 = time.monotonic()
        p = self.run_ab("ab", n, load["concurrency"], url, step_dir)
        try:
            rc = p.wait(timeout=300)
        except subprocess.TimeoutExpired:
            p.kill()
            raise LadderError("ab did not finish within 300 s")
        seconds = time.monotonic() - t0
        with open(os.path.join(step_dir, "ab.txt"), errors="replace") as f:
            text = f.read()
        if rc != 0:
            raise LadderError(f"ab failed (exit {rc}):\n{text[-1500:]}")
        m = kit.parse_ab(text)           # with -l, "failed" are transport failures only
        return m["requests"], seconds, m["failed"], kit.ab_times(os.path.join(step_dir, "ab.tsv"))

    def storm(self, load, url, user, step_dir):
        """One user hammers the button: CONNECTIONS keep-alive connections
        through nginx open, wait until all are open, send at once, then each
        sends again GAP seconds after every answer, for SECONDS. Not ab: ab
        sends its first request alone and the others only once that one is
        answered, so a slow first order would never meet a second request."""
        u = urllib.parse.urlsplit(url)
        lines = []
        lines_lock = threading.Lock()
        failures = []
        n_conn, gap = load["connections"], load["gap"]
        barrier = threading.Barrier(n_conn)
        t0 = [0.0]

        def send_all():
            client = kit.Client(f"{u.scheme}://{u.netloc}", timeout=60)
            try:
                client.connect()
            except OSError:
                pass
            try:
                barrier.wait(timeout=30)
            except threading.BrokenBarrierError:
                pass
            deadline = t0[0] + load["seconds"]
            while True:
                t = time.monotonic()
                try:
                    status = client.request("POST", u.path, {"X-User-Id": str(user)}).status
                except (OSError, http.client.HTTPException):
                    status = 0              # the client reconnects for the next one
                with lines_lock:
                    lines.append((t - t0[0], status, (time.monotonic() - t) * 1000.0))
                if time.monotonic() + gap >= deadline:
                    break
                time.sleep(gap)
            client.close()

        def worker():
            try:
                send_all()
            except Exception as e:          # noqa: BLE001 -- reported below
                failures.append(f"{type(e).__name__}: {e}")

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(n_conn)]
        t0[0] = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=max(1.0, t0[0] + 300 - time.monotonic()))
        if any(t.is_alive() for t in threads):
            raise LadderError("the storm did not finish within 300 s")
        if failures:
            raise LadderError(f"a storm thread failed: {failures[0]}")
        seconds = time.monotonic() - t0[0]
        lines.sort()
        with open(os.path.join(step_dir, "storm.tsv"), "w", encoding="utf-8") as f:
            f.write("start_s\tstatus\tms\n")
            for start, status, ms in lines:
                f.write(f"{start:.3f}\t{status}\t{ms:.1f}\n")
        errors = sum(1 for x in lines if x[1] == 0)
        return len(lines), seconds, errors, [x[2] for x in lines]

    def outage(self, step, load, url, step_dir):
        """Distinct buyers (DEMO_RANDOM_USER: no X-User-Id) on CONNECTIONS
        keep-alive connections for SECONDS; the step's service is stopped at
        STOP_AT and started again at START_AT. Every answer's start, status
        and time go to outage.tsv; the figures of the outage to self.extra."""
        u = urllib.parse.urlsplit(url)
        lines, lock = [], threading.Lock()
        t0 = time.monotonic()
        deadline = [t0 + load["seconds"]]     # moved on once the service is back

        def buyer():
            client = kit.Client(f"{u.scheme}://{u.netloc}", timeout=30)
            while time.monotonic() < deadline[0]:
                t = time.monotonic()
                try:
                    rsp = client.request("POST", u.path, {})
                    status = rsp.status
                    code = rsp.body.get("error", "") if isinstance(rsp.body, dict) else ""
                except (OSError, http.client.HTTPException):
                    status, code = 0, "transport"
                with lock:
                    lines.append((t - t0, status, (time.monotonic() - t) * 1000.0, code))
                time.sleep(0.01)
            client.close()

        threads = [threading.Thread(target=buyer, daemon=True) for _ in range(load["connections"])]
        for t in threads:
            t.start()
        marks = {}
        try:
            time.sleep(max(0.0, t0 + load["stop_at"] - time.monotonic()))
            marks["stopping"] = time.monotonic() - t0
            self.service("stop", step["service"])
            marks["stopped"] = time.monotonic() - t0
            time.sleep(max(0.0, t0 + load["start_at"] - time.monotonic()))
            self.service("start", step["service"])
            marks["started"] = time.monotonic() - t0
            deadline[0] = max(deadline[0], time.monotonic() + load["after_s"])
        finally:
            for t in threads:
                t.join(timeout=max(1.0, deadline[0] + 60 - time.monotonic()))
        if any(t.is_alive() for t in threads):
            raise LadderError("the outage's buyers did not finish within 60 s of its end")
        seconds = time.monotonic() - t0
        lines.sort()
        with open(os.path.join(step_dir, "outage.tsv"), "w", encoding="utf-8") as f:
            f.write(f"# stopped at {marks['stopped']:.3f} s, started at {marks['started']:.3f} s\n")
            f.write("start_s\tstatus\tms\terror\n")
            for start, status, ms, code in lines:
                f.write(f"{start:.3f}\t{status}\t{ms:.1f}\t{code}\n")
        self.extra = {"outage": {
            "stoppedAtS": round(marks["stopped"], 3), "startedAtS": round(marks["started"], 3),
            "unavailable": sum(1 for x in lines if x[1] == 503 and x[3] == "unavailable"),
            "maxMs": max((x[2] for x in lines), default=0.0),
            "okAfter": sum(1 for x in lines if x[1] == 200 and x[0] > marks["started"]),
            # under way while the service was being stopped: a commit whose
            # answer the stop cut off is one of these
            "inFlight503": sum(1 for x in lines if x[1] == 503 and x[0] < marks["stopped"]
                               and x[0] + x[2] / 1000 > marks["stopping"]),
            "backAfterS": min((round(x[0] + x[2] / 1000 - marks["started"], 3) for x in lines
                               if x[1] == 200 and x[0] > marks["started"]), default=None),
            "okDuring": sum(1 for x in lines if x[1] == 200
                            and marks["stopped"] < x[0] and x[0] + x[2] / 1000 < marks["started"]),
        }}
        errors = sum(1 for x in lines if x[1] == 0)
        return len(lines), seconds, errors, [x[2] for x in lines]

    def crash(self, step, step_dir, user):
        """Instance 1 takes the user's lock and stalls (DEMO_PAUSE_MS); it is
        killed with SIGKILL while it holds it. Instance 2 asks for the same
        user every 25 ms: 409 while the lock is held; the request that takes
        it stalls too, then answers 200. Returns the step's figures."""
        urls = self.stack.instance_urls
        path = f"/voucher/{self.voucher}/seckill"
        hdr = {"X-User-Id": str(user)}
        first = {}

        def holder():
            try:
                first["r"] = kit.request(urls[0], "POST", path, hdr, None, 30).status
            except (OSError, http.client.HTTPException) as e:
                first["r"] = type(e).__name__
        th = threading.Thread(target=holder, daemon=True)
        th.start()
        time.sleep(0.5)
        lines = []
        t = time.monotonic()
        probe = kit.request(urls[1], "POST", path, hdr, None, 30).status
        lines.append((-0.0, probe, (time.monotonic() - t) * 1000.0))
        pid = self.stack.pid("app-1")
        if pid is None:
            raise LadderError("no pid of instance 1")
        os.kill(pid, signal.SIGKILL)
        t_kill = time.monotonic()
        free_after, winner = None, None
        while time.monotonic() < t_kill + 20:
            t = time.monotonic()
            try:
                st = kit.request(urls[1], "POST", path, hdr, None, 30).status
            except (OSError, http.client.HTTPException):
                st = 0
            lines.append((t - t_kill, st, (time.monotonic() - t) * 1000.0))
            if st != 409:
                free_after, winner = t - t_kill, st
                break
            time.sleep(0.025)
        th.join(5)
        with open(os.path.join(step_dir, "crash.tsv"), "w", encoding="utf-8") as f:
            f.write("since_kill_s\tstatus\tms\n")
            for a, b, c in lines:
                f.write(f"{a:.3f}\t{b}\t{c:.1f}\n")
        facts = check_invariants.voucher_facts(self.dsn, self.voucher)
        stats = kit.call(urls[1], "GET", "/stats", want=200).body
        with open(os.path.join(step_dir, "stats.json"), "w", encoding="utf-8") as f:
            json.dump([stats], f, indent=1)
        statuses = {}
        for _a, b, _c in lines:
            statuses[str(b)] = statuses.get(str(b), 0) + 1
        ok = statuses.get("200", 0)
        return {
            "initialStock": facts["initialStock"], "stockLeft": facts["stock"],
            "orders": facts["orders"], "oversold": facts["oversold"],
            "duplicateUsers": facts["duplicateUsers"],
            "duplicateOrders": facts["orders"] - self.distinct_buyers(self.voucher),
            "stockDrift": facts["stockDrift"], "requests": len(lines), "ok": ok,
            "statuses": statuses, "successRate": 100.0 * ok / len(lines),
            "rps": 0.0, "seconds": (lines[-1][0] if lines else 0.0),
            "p50ms": kit.percentile([x[2] for x in lines], 50),
            "p99ms": kit.percentile([x[2] for x in lines], 99),
            "transportErrors": statuses.get("0", 0),
            "status5xx": sum(v for k2, v in statuses.items() if k2.startswith("5")),
            "okByInstance": {"seckill-2": ok}, "requestsByInstance": {"seckill-2": len(lines)},
            "notOwnerReleases": int(stats.get("lock", {}).get("notOwnerReleases", 0)),
            "renewals": int(stats.get("lock", {}).get("renewals", 0)),
            "lockAcquired": int(stats.get("lock", {}).get("acquired", 0)),
            "staleTokenRejections": int(stats.get("lock", {}).get("staleTokenRejections", 0)),
            "strategiesSeen": [f"{stats.get('lockStrategy')}/{stats.get('stockStrategy')}"],
            "timeline": [], "timelineSource": "",
            "crash": {"heldBeforeKill": probe == 409, "freeAfterS": free_after, "winner": winner,
                      "holderAnswer": first.get("r")},
            "measured": "never free" if free_after is None else f"free after {free_after:.2f} s",
        }

    def node_failure(self, step, step_dir, user):
        """The RedLock and MultiLock failures, with signals to the nodes
        (A..E = nodes 1..5). restart/delayed: instance 1 asks for the user's
        lock while D and E are paused (it gets A, B, C) and holds it 4 s inside
        its transaction (DEMO_DELAY_MS); meanwhile D and E resume, C is killed and started
        empty at once (restart) or only after the lease (delayed), A and B are
        paused, and instance 2 asks for the same user. down: node 3 of
        multilock's three killed, distinct buyers through nginx, then the node
        back. Returns the step's figures."""
        urls = self.stack.instance_urls
        path = f"/voucher/{self.voucher}/seckill"
        hdr = {"X-User-Id": str(user)}
        scen = step["load"]["scenario"]
        lines, first, facts_extra = [], {}, {}

        def ask(url, headers):
            t = time.monotonic()
            try:
                st = kit.request(url, "POST", path, headers, None, 30).status
            except (OSError, http.client.HTTPException):
                st = 0
            lines.append((t - t0, st, (time.monotonic() - t) * 1000.0))
            return st

        t0 = time.monotonic()
        if scen == "down":
            self.nodes("kill", 3)
            try:
                for i in range(40):
                    ask(self.base_url, {"X-User-Id": str(user * 100 + i)})
                down_orders = check_invariants.voucher_facts(self.dsn, self.voucher)["orders"]
            finally:
                self.nodes("start-node", 3)
            time.sleep(0.4)                     # the instances retry a failed node after 250 ms
            after = [ask(self.base_url, {"X-User-Id": str(user * 100 + 50 + i)}) for i in range(3)]
            facts_extra = {"afterOk": after.count(200), "ordersWhileDown": down_orders}
            lines = lines[:40]
        else:
            self.nodes("pause", 4)
            self.nodes("pause", 5)
            th = threading.Thread(target=lambda: first.update(r=ask(urls[0], hdr)), daemon=True)
            th.start()
            time.sleep(0.4)                     # granted by A, B, C; D and E past the deadline
            self.nodes("resume", 4)
            self.nodes("resume", 5)
            self.nodes("kill", 3)
            if scen == "restart":
                self.nodes("start-node", 3)
            self.nodes("pause", 1)
            self.nodes("pause", 2)
            time.sleep(0.3)
            try:
                second = ask(urls[1], hdr)
            finally:
                self.nodes("resume", 1)
                self.nodes("resume", 2)
            th.join(30)
            if scen == "delayed":
                # C rejoins after the longest lease (and its drift) since the kill
                lease = step["env"]["LOCK_LEASE_MS"]
                time.sleep(max(0.0, (lease + lease / 100 + 2) / 1000 - (time.monotonic() - t0)))
                self.nodes("start-node", 3)
            facts_extra = {"firstAnswer": first.get("r"), "secondAnswer": second}
        time.sleep(0.3)
        with open(os.path.join(step_dir, "nodes.tsv"), "w", encoding="utf-8") as f:
            f.write("start_s\tstatus\tms\n")
            for a, b, c in sorted(lines):
                f.write(f"{a:.3f}\t{b}\t{c:.1f}\n")
        facts = check_invariants.voucher_facts(self.dsn, self.voucher)
        stats = self.instance_stats()
        with open(os.path.join(step_dir, "stats.json"), "w", encoding="utf-8") as f:
            json.dump(stats, f, indent=1)
        statuses = {}
        for _a, b, _c in lines:
            statuses[str(b)] = statuses.get(str(b), 0) + 1
        ok = statuses.get("200", 0)
        lock = {}
        for s in stats:
            for k2, v in (s.get("lock") or {}).items():
                if isinstance(v, (int, float)):
                    lock[k2] = lock.get(k2, 0) + v
        measured = {"restart": "two holders", "delayed": "one holder"}.get(scen, "")
        if scen != "down":
            measured = (f"instance 1 {facts_extra['firstAnswer']}, instance 2 "
                        f"{facts_extra['secondAnswer']}: {facts['orders']} order(s) of the user")
        else:
            measured = (f"{statuses.get('503', 0)} x 503 of {len(lines)}, "
                        f"{facts_extra['ordersWhileDown']} orders while down, "
                        f"{facts_extra['afterOk']} of 3 sold with the node back")
        return {
            "initialStock": facts["initialStock"], "stockLeft": facts["stock"],
            "orders": facts["orders"], "oversold": facts["oversold"],
            "duplicateUsers": facts["duplicateUsers"],
            "duplicateOrders": facts["orders"] - self.distinct_buyers(self.voucher),
            "stockDrift": facts["stockDrift"], "requests": len(lines), "ok": ok,
            "statuses": statuses, "successRate": 100.0 * ok / len(lines) if lines else 0.0,
            "rps": 0.0, "seconds": round(time.monotonic() - t0, 2),
            "p50ms": kit.percentile([x[2] for x in lines], 50),
            "p99ms": kit.percentile([x[2] for x in lines], 99),
            "transportErrors": statuses.get("0", 0),
            "status5xx": sum(v for k2, v in statuses.items() if k2.startswith("5")),
            "okByInstance": {}, "requestsByInstance": {},
            "notOwnerReleases": int(lock.get("notOwnerReleases", 0)),
            "renewals": 0, "lockAcquired": int(lock.get("acquired", 0)),
            "staleTokenRejections": int(lock.get("staleTokenRejections", 0)),
            "strategiesSeen": [f"{s.get('lockStrategy')}/{s.get('stockStrategy')}" for s in stats],
            "timeline": [], "timelineSource": "", "nodes": facts_extra, "measured": measured,
        }

    def access_log_slice(self, offset, step_dir):
        """(statuses, {instance: 200s}, {instance: requests}) of the step's seckill requests."""
        path = self.stack.info.get("NGINX_ACCESS_LOG", "")
        uri = f"/voucher/{self.voucher}/seckill"
        statuses, ok_by, req_by = {}, {}, {}
        names = {}
        for name, url in zip(self.stack.info.get("INSTANCE_IDS", "").split(),
                             self.stack.info.get("INSTANCE_URLS", "").split()):
            names[url.replace("http://", "")] = name
        try:
            data, entries = kit.access_log(path, offset, uri)
        except OSError as e:
            raise LadderError(f"nginx access log {path}: {e}")
        with open(os.path.join(step_dir, "access.log"), "w", encoding="utf-8") as f:
            f.write(data)
        for e in entries:
            st = e.status
            inst = kit.answered_by(e.upstream, names)
            statuses[st] = statuses.get(st, 0) + 1
            req_by[inst] = req_by.get(inst, 0) + 1
            if st == "200":
                ok_by[inst] = ok_by.get(inst, 0) + 1
        return statuses, ok_by, req_by

    def step_timeline(self, step, step_dir):
        """(timeline, what it was measured with) of the step's requests: the
        storms from the ladder's own client (per-request start and time, in
        STORM_BUCKET s buckets), the sales (ab: no sub-second start times) from
        the step's slice of nginx's access log, per second."""
        if step["load"]["kind"] == "storm":
            samples = []
            with open(os.path.join(step_dir, "storm.tsv"), encoding="utf-8") as f:
                next(f, None)
                for line in f:
                    start, status, ms = line.split("\t")
                    samples.append((float(start), int(status), float(ms)))
            return (report.timeline_from_samples(samples, STORM_BUCKET),
                    f"the ladder's client, by request start, {STORM_BUCKET:g} s buckets")
        try:
            tl = report.parse_timeline(os.path.join(step_dir, "access.log"), 0,
                                       f"/voucher/{self.voucher}/seckill")
        except OSError:
            tl = []
        return tl, "nginx's access log ($request_time), by answer, per second"

    def run_step(self, step, run_no, results):
        num, key = step["num"], step["key"]
        step_dir = os.path.join(self.out, "steps" if self.args.runs == 1 else f"run-{run_no}",
                                f"{num:02d}-{key}")
        shutil.rmtree(step_dir, ignore_errors=True)
        os.makedirs(step_dir)
        env = self.step_env(step)
        self.crash_facts = {}
        log(f"step {num} ({step['title']}): {step['instances']} instance(s), "
            + " ".join(f"{k}={v}" for k, v in env.items()))
        # Redis's persistence first: an instance that must acknowledge
        # durably refuses to start against a Redis that is not. (A first
        # start gets stack.sh's default for SECKILL_STOCK=redis: always.)
        if step.get("redis_aof") and self.stack.started and not getattr(self.stack, "ha", False):
            self.redis_persistence(step["redis_aof"])
        if self.stack.configure(step["instances"], env):
            self.setup_db()
        if step.get("redis_aof"):
            self.redis_persistence(step["redis_aof"])
        stock = step["load"]["stock"]
        user = self.user_base + run_no * 100 + num
        lost = None
        if step.get("failover"):
            stock = self.sale_size() + 10        # every buyer of the price sale buys
        self.reset_voucher(stock)
        if step.get("slow_fsync_ms"):
            # After the reset, so that the voucher's state is on disk and
            # only the burst's orders can be lost.
            self.redis_slow_disk(step["redis_aof"], step["slow_fsync_ms"])
            self.stack.configure(step["instances"], env)   # connected to the new Redis
        log_path = self.stack.info.get("NGINX_ACCESS_LOG", "")
        offset = os.path.getsize(log_path) if os.path.exists(log_path) else 0

        if step["load"]["kind"] in ("crash", "nodes"):
            r = {"step": num, "key": key, "title": step["title"], "lock": step["lock"],
                 "stock": step["stock"], "instances": step["instances"], "env": env,
                 "load": self.load_text(step), "expect": step["expect"], "story": step["story"]}
            r.update(self.crash(step, step_dir, user) if step["load"]["kind"] == "crash"
                     else self.node_failure(step, step_dir, user))
            r["checks"] = [{"ok": c_ok, "text": c_text} for c_ok, c_text in check_step(step, r, results)]
            r["pass"] = all(c["ok"] for c in r["checks"])
            return r
        self.extra = {}
        if step.get("failover"):
            url = f"{self.base_url}/voucher/{self.voucher}/seckill"
            requests, seconds, errors, times = self.sale(
                {"requests": step["load"]["requests"], "concurrency": step["load"]["concurrency"]},
                url, step_dir)
        else:
            requests, seconds, errors, times = self.drive(step, step_dir, user)
        time.sleep(1.3)                          # nginx flushes its buffered log every second

        statuses, ok_by, req_by = self.access_log_slice(offset, step_dir)
        timeline, tl_source = self.step_timeline(step, step_dir)
        stats = self.instance_stats()
        sale_facts = check_invariants.voucher_facts(self.dsn, self.voucher)
        if step.get("failover"):
            lost = self.lost_lock(step, env, user, step_dir)
            stats = lost.pop("stats")
        facts_voucher = self.lost_voucher if lost is not None else self.voucher
        facts = check_invariants.voucher_facts(self.dsn, facts_voucher)
        distinct = self.distinct_buyers(facts_voucher)
        with open(os.path.join(step_dir, "stats.json"), "w", encoding="utf-8") as f:
            json.dump(stats, f, indent=1)
        lock = {}
        for s in stats:
            for k2, v in (s.get("lock") or {}).items():
                if isinstance(v, (int, float)):
                    lock[k2] = lock.get(k2, 0) + v
        ok = statuses.get("200", 0)
        r = {
            "step": num, "key": key, "title": step["title"], "lock": step["lock"],
            "stock": step["stock"], "instances": step["instances"], "env": env,
            "load": self.load_text(step), "expect": step["expect"], "story": step["story"],
            "initialStock": facts["initialStock"], "stockLeft": facts["stock"],
            "orders": facts["orders"], "oversold": facts["oversold"],
            "duplicateUsers": facts["duplicateUsers"],
            "duplicateOrders": facts["orders"] - distinct,
            "stockDrift": facts["stockDrift"],
            "requests": requests, "ok": ok, "statuses": statuses,
            "successRate": 100.0 * ok / requests if requests else 0.0,
            "rps": requests / seconds if seconds > 0 else 0.0, "seconds": seconds,
            "p50ms": kit.percentile(times, 50), "p99ms": kit.percentile(times, 99),
            "transportErrors": errors,
            "status5xx": sum(v for k2, v in statuses.items() if k2.startswith("5")),
            "okByInstance": ok_by, "requestsByInstance": req_by,
            "notOwnerReleases": int(lock.get("notOwnerReleases", 0)),
            "renewals": int(lock.get("renewals", 0)),
            "lockAcquired": int(lock.get("acquired", 0)),
            "staleTokenRejections": int(lock.get("staleTokenRejections", 0)),
            "strategiesSeen": [f"{s.get('lockStrategy')}/{s.get('stockStrategy')}" for s in stats],
            "timeline": timeline, "timelineSource": tl_source,
            "ackedLost": self.crash_facts.get("lost", 0),
            "reconciled": self.crash_facts.get("reconciled", True),
        }
        r.update(self.extra)
        if "outage" in r:
            o = r["outage"]
            back = "never" if o["backAfterS"] is None else f"{o['backAfterS']:.2f} s"
            r["measured"] = (f"{o['unavailable']} x 503, max {o['maxMs'] / 1000:.2f} s, "
                             f"200 again {back} after the restart"
                             + (f", {r['orders'] - r['ok']} answer(s) cut off"
                                if r["orders"] != r["ok"] else ""))
        if lost is not None:
            r["lost"] = lost
            r["sale"] = {"orders": sale_facts["orders"], "oversold": sale_facts["oversold"],
                         "duplicateUsers": sale_facts["duplicateUsers"],
                         "stockDrift": sale_facts["stockDrift"],
                         "ordersPerS": round(sale_facts["orders"] / seconds, 1) if seconds else 0}
        r["checks"] = [{"ok": c_ok, "text": c_text} for c_ok, c_text in check_step(step, r, results)]
        r["pass"] = all(c["ok"] for c in r["checks"])
        if step.get("redis_aof"):
            self.redis_persistence("no")
        if lost is None and ok != r["orders"]:
            log(f"note: step {num}: {ok} answers 200 but {r['orders']} orders in Postgres")
        return r

    # ---- the failover steps

    def sale_size(self):
        n = FAILOVER["requests"]
        return n // 2 if self.args.quick else n

    def lost_lock(self, step, env, user, step_dir):
        """The lost-lock scenario (module doc). Returns what happened; the
        instances' /stats under "stats"."""
        st, load = self.stack, step["load"]
        voucher = self.lost_voucher
        key = f"lock:order:{user}"
        token_key = f"redisson_lock_token:{{{key}}}"
        # A buyer with history (before the demo knobs slow the instances):
        # his token counter is on every node.
        kit.call(self.base_url, "POST", f"/voucher/{self.voucher}/seckill",
                 headers={"X-User-Id": str(user)}, want=200)
        # No request deadline on instance 1: A's stall stands for a pause that
        # comes after the last deadline check (a GC pause between the check
        # and the write), which a deadline cannot catch.
        demo = dict(env, INSTANCE_ENV_1=f"DEMO_PAUSE_MS={load['pause_ms']} REQUEST_DEADLINE_MS=0",
                    INSTANCE_ENV_2=f"DEMO_DELAY_MS={load['delay_ms']}")
        st.configure(step["instances"], demo)
        self.stack.admin("POST", f"/admin/vouchers/{voucher}/reset", {"stock": load["stock"]},
                         want=200)
        a1, a2 = st.app_ports
        n, master = st.redis_master()
        replicas = [(i + 1, p) for i, p in enumerate(st.redis_ports) if p != master]
        self.wait_for(lambda: all(kit.redis_cli(p, "EXISTS", token_key) == "1"
                                  for _, p in replicas), 10, "the token counter on the replicas")
        before = self.instance_stats()
        rep_pids = [st.pid(f"redis-{i}") for i, _ in replicas]
        answers = {}

        def buy(label, port):
            try:
                r = kit.request(port, "POST", f"/voucher/{voucher}/seckill",
                                {"X-User-Id": str(user)}, timeout=60)
                answers[label] = (str(r.status), r.body.get("message", "")
                                  if isinstance(r.body, dict) else "", time.monotonic())
            except (OSError, http.client.HTTPException) as e:
                answers[label] = ("error", f"{type(e).__name__}: {e}", time.monotonic())

        paused = step["replicas"] == "paused"
        ta = threading.Thread(target=buy, args=("a", a1), daemon=True)
        try:
            if paused:
                # Paused replicas would still receive the grant (the kernel
                # buffers it) and apply it on SIGCONT, before any promotion:
                # their links are cut too, and they cannot reconnect while
                # paused. The grant stays in the master's backlog only.
                for pid in rep_pids:
                    os.kill(pid, signal.SIGSTOP)
                kit.redis_cli(master, "CLIENT", "KILL", "TYPE", "replica")
            t_a = time.monotonic()
            ta.start()
            if step["key"] == "lost-wait-paused":
                ta.join(10)                      # the grant waits for WAIT, then is undone
            else:
                self.wait_for(lambda: kit.redis_cli(master, "EXISTS", key) == "1", 5,
                              "A's lock on the master")
            t_lock = time.monotonic()
            os.kill(st.pid(f"redis-{n}"), signal.SIGKILL)
        finally:
            if paused:
                for pid in rep_pids:
                    os.kill(pid, signal.SIGCONT)
        t_kill = time.monotonic()
        promoted_s, new = st.wait_failover(master)
        self.wait_for(lambda: all(kit.call(p, "GET", "/stats", want=200).body["redis"]["master"]
                                  == f"127.0.0.1:{new}" for p in (a1, a2)), 15,
                      "the instances on the new master")
        lock_on_new = int(kit.redis_cli(new, "EXISTS", key))
        t_b = time.monotonic()
        tb = threading.Thread(target=buy, args=("b", a2), daemon=True)
        tb.start()
        for t in (ta, tb):
            t.join(60)
        if ta.is_alive() or tb.is_alive():
            raise LadderError("A or B not answered within 60 s")
        # The killed master comes back as a replica of the new one.
        self.spawned.append(st.restart_redis_node(n, new))
        st.wait_sentinels_see(st.redis_ports[n - 1])
        after = self.instance_stats()

        def delta(field):
            return int(after[0]["lock"].get(field, 0) - before[0]["lock"].get(field, 0))

        out = {"a": answers["a"][0], "aMessage": answers["a"][1],
               "b": answers["b"][0], "bMessage": answers["b"][1],
               "aAnsweredAfterS": round(answers["a"][2] - t_a, 2),
               "bAnsweredAfterS": round(answers["b"][2] - t_b, 2),
               "killToPromotedS": round(promoted_s, 2),
               "bSentAfterLockS": round(t_b - t_lock, 2),
               "bSentBeforeAResumed": step["key"] == "lost-wait-paused" or
               t_b - t_lock < load["pause_ms"] / 1000 - 0.5,
               "lockOnNewMaster": lock_on_new, "killedNode": n,
               "staleTokenRejections": delta("staleTokenRejections"),
               "unsynced": delta("unsynced"), "stats": after}
        log(f"lost lock: A {out['a']} ({out['aMessage'] or '-'}), B {out['b']} "
            f"({out['bMessage'] or '-'}); Sentinel promoted a replica {promoted_s:.2f} s after "
            f"the kill; lock on the new master: {lock_on_new}")
        with open(os.path.join(step_dir, "lost-lock.json"), "w", encoding="utf-8") as f:
            json.dump({k: v for k, v in out.items() if k != "stats"}, f, indent=1)
        return out

    @staticmethod
    def wait_for(cond, timeout, what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if cond():
                    return
            except (kit.KitError, KeyError, TypeError, ValueError):
                pass
            time.sleep(0.02)
        raise LadderError(f"timed out waiting for {what}")

    def load_text(self, step):
        load = step["load"]
        if load["kind"] == "sale":
            n = load["requests"] if not self.args.quick else load["requests"] // 2
            return f"sale {n}x{load['concurrency']}"
        if load["kind"] == "crash":
            return "holder killed"
        if load["kind"] == "nodes":
            return f"nodes: {load['scenario']}"
        if load["kind"] == "outage":
            return f"buyers {load['connections']}x{load['seconds']:g}s"
        if load["kind"] == "failover":
            return f"sale {self.sale_size()}x{load['concurrency']}, failover"
        if load["kind"] == "redis-crash":
            return f"burst {load['requests']}x{load['concurrency']}, kill"
        return f"storm {load['connections']}x{load['seconds']:g}s"

    def safe_defaults(self):
        """Leaves the stack on the default (safe) strategies (--keep-stack)."""
        log("restarting the instances with the default strategies")
        if self.stack.configure(2, {}):
            pass    # a new database has its constraint


# ------------------------------------------------------------------ output

COLS = [kit.Col(t, a) for t, a in (
    ("#", "r"), ("step", "l"), ("lock", "l"), ("stock", "l"), ("inst", "r"),
    ("load", "l"), ("req", "r"), ("req/s", "r"), ("p99ms", "r"), ("200", "r"),
    ("orders", "r"), ("oversold", "r"), ("dupUsers", "r"), ("drift", "r"),
    ("notOwner", "r"), ("measured", "l"), ("expected", "l"), ("result", "l"))]


def table_rows(results):
    rows = []
    for r in results:
        rows.append([r["step"], r["title"], r["lock"], r["stock"], r["instances"], r["load"],
                     r["requests"], kit.fmt_ms(r["rps"]), kit.fmt_ms(r["p99ms"]), r["ok"], r["orders"],
                     r["oversold"], r["duplicateUsers"], r["stockDrift"], r["notOwnerReleases"],
                     r.get("measured", ""), r["expect"], "ok" if r["pass"] else "MISS"])
    return rows


def text_table(results):
    return kit.table(COLS, table_rows(results)) + "\n"


def md_table(results):
    head = "| " + " | ".join(c.title for c in COLS) + " |\n"
    sep = "| " + " | ".join("---:" if c.align == "r" else "---" for c in COLS) + " |\n"
    body = ""
    for row in table_rows(results):
        body += "| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |\n"
    return head + sep + body


def settings_text(r):
    env = dict(r["env"])
    env.pop("SECKILL_LOCK", None)
    env.pop("SECKILL_STOCK", None)
    return " ".join(f"{k}={v}" for k, v in env.items())


def write_markdown(path, results, meta, chart):
    with open(path, "w", encoding="utf-8") as f:
        f.write("# The demo ladder\n\n")
        f.write(f"Run {meta['date']} on {meta['host']} ({meta['cpus']} CPUs), "
                f"{'quick mode, ' if meta['quick'] else ''}stack in `{meta['runDir']}`. "
                "Orders, oversold, duplicate users and drift are read in Postgres; `200` and the "
                "instances in nginx's access log; req/s and p99 (ms) from the clients' per-request "
                "times (ab in the sales, the ladder's own client in the storms); "
                "`notOwner` is the instances' `lock.notOwnerReleases` (setnx: deletes of a lock "
                "that was no longer ours; owner and reentrant: releases refused).\n\n")
        f.write(md_table(results))
        f.write("\n")
        if chart:
            f.write(f"![oversold, duplicate orders and success rate per step]({chart})\n\n")
        f.write("## Steps\n\n")
        for r in results:
            f.write(f"### {r['step']}. {r['title']} — lock `{r['lock']}`, stock `{r['stock']}`, "
                    f"{r['instances']} instance(s)\n\n")
            f.write(f"- what: {r['story']}\n")
            f.write(f"- settings: `{settings_text(r)}`; load: {r['load']}, "
                    f"stock {r['initialStock']}\n")
            f.write(f"- answers: {json.dumps(r['statuses'], sort_keys=True)}; 200s per instance: "
                    f"{json.dumps(r['okByInstance'], sort_keys=True)}; requests per instance: "
                    f"{json.dumps(r['requestsByInstance'], sort_keys=True)}\n")
            f.write(f"- Postgres: {r['orders']} orders, stock left {r['stockLeft']}, oversold "
                    f"{r['oversold']}, {r['duplicateUsers']} duplicate user(s) "
                    f"({r['duplicateOrders']} extra orders), drift {r['stockDrift']}\n")
            f.write(f"- lock: {r['lockAcquired']} acquired, {r['notOwnerReleases']} releases by "
                    f"a non-owner, {r['renewals']} watchdog renewals\n")
            if "lost" in r:
                lo = r["lost"]
                f.write(f"- the lost lock: A (instance 1) {lo['a']} {lo['aMessage'] or ''}; B "
                        f"(instance 2) {lo['b']} {lo['bMessage'] or ''}; Sentinel promoted a "
                        f"replica {lo['killToPromotedS']} s after the kill; lock on the promoted "
                        f"replica: {'yes' if lo['lockOnNewMaster'] else 'no'}; B sent "
                        f"{lo['bSentAfterLockS']} s after A's grant; stale-token rejections "
                        f"{lo['staleTokenRejections']}, grants undone {lo['unsynced']}\n")
                f.write(f"- the price (the sale before): {r['sale']['orders']} orders, "
                        f"{r['sale']['ordersPerS']} orders/s, p99 {kit.fmt_ms(r['p99ms'])} ms\n")
            f.write(f"- expected: {r['expect']} — **{'reproduced' if r['pass'] else 'MISSED'}**\n")
            for c in r["checks"]:
                f.write(f"  - {'ok' if c['ok'] else 'FAIL'}: {c['text']}\n")
            f.write("\n")


def write_html(path, results, meta, table, chart):
    """ladder.html: the terminal table, then per step its invariants and its
    latency percentiles over time (report.py's inline SVG charts)."""
    E = report._esc
    all_ok = all(r["pass"] for r in results)
    h = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>seckill demo ladder</title>",
         f"<style>{report.HTML_STYLE}</style></head><body>",
         f"<header><h1>seckill demo ladder <span class=\"verdict {'ok' if all_ok else 'bad'}\">"
         f"{'every step showed what it should' if all_ok else 'a step MISSED its expected outcome'}"
         "</span></h1>",
         f"<p>{E(meta['date'])} · {E(meta['host'])} ({meta['cpus']} CPUs)"
         f"{' · quick' if meta['quick'] else ''} · {len(results)} step(s) in {meta['seconds']} s"
         f" · stack in {E(meta['runDir'])}</p></header><main>",
         "<div class=card><h2>Summary</h2><div class=muted>The terminal table. Orders, oversold, "
         "duplicate users and drift read in Postgres; 200s in nginx's access log; req/s and p99 "
         "from the clients' per-request times. Red cells are broken invariants: the broken steps "
         "are expected to show them.</div>",
         f"<pre>{E(table)}</pre>"]
    if chart:
        h.append(f'<img src="{E(chart)}" alt="oversold, duplicate orders and success rate per step" '
                 'style="max-width:100%">')
    h.append("</div>")
    heads = [("orders", "orders"), ("initialStock", "initial stock"), ("stockLeft", "stock left"),
             ("oversold", "oversold"), ("duplicateUsers", "duplicate users"),
             ("duplicateOrders", "duplicate orders"), ("stockDrift", "stock drift"),
             ("ok", "200s"), ("notOwnerReleases", "not-owner releases"), ("renewals", "renewals")]
    for r in results:
        h.append(f"<section class=\"card step\" id=\"step-{r['step']}\">"
                 f"<h2>{r['step']}. {E(r['title'])} — lock {E(r['lock'])}, stock {E(r['stock'])}, "
                 f"{r['instances']} instance(s) <span class=\"verdict {'ok' if r['pass'] else 'bad'}\">"
                 f"{'reproduced' if r['pass'] else 'MISSED'}</span></h2>"
                 f"<div class=muted>{E(r['story'])} · settings {E(settings_text(r))} · load {E(r['load'])}, "
                 f"stock {r['initialStock']} · {r['requests']} requests in {r['seconds']:.2f} s = "
                 f"{r['rps']:.0f} req/s · client p50 {report.fmt_ms(r['p50ms'])} ms, "
                 f"p99 {report.fmt_ms(r['p99ms'])} ms</div>")
        h.append("<div style=\"overflow-x:auto\"><table class=invariants><tr>" + "".join(f"<th>{E(t)}</th>" for _k, t in heads)
                 + "<th>expected</th><th>result</th></tr><tr>")
        for k, _t in heads:
            cls = ("ok" if r[k] == 0 else "bad") if k in ("oversold", "duplicateUsers",
                                                           "duplicateOrders", "stockDrift") else ""
            h.append(f"<td class='{cls}'>{E(r[k])}</td>")
        h.append(f"<td>{E(r['expect'])}</td><td class='{'ok' if r['pass'] else 'bad'}'>"
                 f"{'reproduced' if r['pass'] else 'MISSED'}</td></tr></table></div>")
        h.append("<ul class=checks>" + "".join(
            f"<li>{'ok' if c['ok'] else '<b>FAIL</b>'}: {E(c['text'])}</li>" for c in r["checks"])
            + "</ul>")
        tl = r.get("timeline") or []
        if tl:
            fine = len(tl) > 1 and tl[1]["second"] - tl[0]["second"] < 1
            unit = f"{STORM_BUCKET:g} s" if fine else "second"
            h.append(f"<div class=muted>Latency over time: {E(r.get('timelineSource', ''))}.</div>")
            h.extend(report.timeline_html(
                tl, lat_title=f"latency per {unit} (p50/p90/p99/max)",
                bars_title=f"answers per {unit} by status",
                bars_unit=f"answers/{'bucket' if fine else 's'}",
                xlabel="second of the step"))
        else:
            h.append("<p class=muted>No per-request times for this step.</p>")
        h.append("</section>")
    h.append("</main></body></html>")
    kit.write_atomic(path, "\n".join(h) + "\n")


def write_chart(out_dir, results):
    """ladder.png with gnuplot; returns its file name, or None without gnuplot."""
    gp = shutil.which("gnuplot")
    dat = os.path.join(out_dir, "ladder.dat")
    with open(dat, "w", encoding="utf-8") as f:
        f.write("# step label oversold duplicate_orders success_rate_percent\n")
        for r in results:
            label = f"{r['step']} {r['key']}"
            f.write(f"{r['step']} \"{label}\" {r['oversold']} {r['duplicateOrders']} "
                    f"{r['successRate']:.2f}\n")
    if gp is None:
        log("gnuplot not found (apt-get install gnuplot-nox): no chart")
        return None
    png = os.path.join(out_dir, "ladder.png")
    script = os.path.join(out_dir, "ladder.gp")
    with open(script, "w", encoding="utf-8") as f:
        f.write(f"""# gnuplot script of loadtest/ladder.py
set terminal pngcairo size 1100,900 font "DejaVu Sans,10"
set output '{png}'
set datafile separator whitespace
set style fill solid 0.85 border -1
set boxwidth 0.6
set grid ytics
set xtics rotate by -25 nomirror
set xrange [{min(r['step'] for r in results) - 0.6}:{max(r['step'] for r in results) + 0.6}]
set offsets 0, 0, graph 0.15, 0
set yrange [0:*]
set multiplot layout 3,1 title "seckill demo ladder: what each step lets through"
set title "oversold (orders beyond the stock)"
{'set yrange [0:1]' if all(r['oversold'] == 0 for r in results) else 'set yrange [0:*]'}
plot '{dat}' using 1:3:xtic(2) with boxes lc rgb "#d62728" notitle, \\
     '' using 1:3:3 with labels offset 0,0.7 notitle
set title "duplicate orders (extra orders of users who bought more than once)"
{'set yrange [0:1]' if all(r['duplicateOrders'] == 0 for r in results) else 'set yrange [0:*]'}
plot '{dat}' using 1:4:xtic(2) with boxes lc rgb "#ff7f0e" notitle, \\
     '' using 1:4:4 with labels offset 0,0.7 notitle
set title "success rate (answers 200 / requests, %)"
set yrange [0:*]
plot '{dat}' using 1:5:xtic(2) with boxes lc rgb "#2ca02c" notitle, \\
     '' using 1:5:(sprintf("%.1f", $5)) with labels offset 0,0.7 notitle
unset multiplot
""")
    p = subprocess.run([gp, script], capture_output=True, text=True, timeout=60)
    if p.returncode != 0 or not os.path.exists(png):
        log(f"gnuplot failed: {p.stderr.strip()}")
        return None
    return "ladder.png"


# ------------------------------------------------------------------ main

TALLY_COLS = [kit.Col("#", "r", 2, fit=False), kit.Col("step", "l", 24, 1),
              kit.Col("inst", "r", 4, 1, fit=False), kit.Col("reproduced")]


def tally_text(all_runs, steps):
    rows = []
    for s in steps:
        got = [run[s["key"]]["pass"] for run in all_runs if s["key"] in run]
        rows.append([s["num"], s["title"], s["instances"], f"{sum(got)}/{len(got)}"])
    return kit.table(TALLY_COLS, rows) + "\n"


def parse_args(argv):
    ap = argparse.ArgumentParser(description="The demo ladder (see the module doc).")
    ap.add_argument("--quick", action="store_true", help="half the buyers in the stock steps")
    ap.add_argument("--runs", type=int, default=1, help="run the ladder N times, then tally")
    ap.add_argument("--steps", default="", help="only these step numbers (e.g. 1,2,8)")
    ap.add_argument("--no-batched", action="store_true",
                    help="without the comparison rows (batched, redis-first)")
    ap.add_argument("--no-lock-services", action="store_true",
                    help="without the lock-service steps (storms, killed holders, outages)")
    ap.add_argument("--no-failover", action="store_true",
                    help="without the failover steps (12-15)")
    ap.add_argument("--keep-stack", action="store_true",
                    help="leave the stack running (default strategies) at the end")
    ap.add_argument("--run-dir", default=os.environ.get("LADDER_RUN_DIR",
                                                        os.path.join(ROOT, ".run", "ladder")))
    ap.add_argument("--out", default=os.environ.get("LADDER_OUT",
                                                    os.path.join(ROOT, "build", "ladder")))
    a = ap.parse_args(argv)
    a.run_dir = os.path.abspath(a.run_dir)
    a.out = os.path.abspath(a.out)
    if a.runs < 1:
        ap.error("--runs must be at least 1")
    return a


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    for tool in ("ab", "psql", "curl"):
        if shutil.which(tool) is None:
            print(f"ladder: error: '{tool}' not found (make deps)", file=sys.stderr)
            return 2
    steps = [s for s in STEPS if not (s.get("optional") and a.no_batched)
             and not (s.get("service") and a.no_lock_services)
             and not (s.get("full_only") and a.quick)
             and not (s.get("failover") and a.no_failover)]
    if a.steps:
        want = {int(x) for x in a.steps.split(",") if x.strip()}
        steps = [s for s in steps if s["num"] in want]
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(os.path.dirname(a.run_dir), exist_ok=True)
    for name in os.listdir(a.out):          # the raw data of an earlier run
        if name == "steps" or re.fullmatch(r"run-\d+", name):
            shutil.rmtree(os.path.join(a.out, name), ignore_errors=True)

    def on_term(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_term)

    a.selected = steps
    lad = Ladder(a)
    all_runs = []
    rc = 0
    t_start = time.monotonic()
    try:
        for run_no in range(1, a.runs + 1):
            results = {}
            ordered = []
            if a.runs > 1:
                log(f"run {run_no} of {a.runs}")
            for s in steps:
                r = lad.run_step(s, run_no, results)
                results[s["key"]] = r
                ordered.append(r)
                verdict = "reproduced" if r["pass"] else "MISSED"
                log(f"step {s['num']}: {verdict}: " + "; ".join(
                    ("" if c["ok"] else "FAIL ") + c["text"] for c in r["checks"]))
            # cas's comparison needs optimistic, which runs after it.
            if "cas" in results and "optimistic" in results:
                cas = results["cas"]
                s_cas = next(s for s in steps if s["key"] == "cas")
                cas["checks"] = [{"ok": ok, "text": t} for ok, t in check_step(s_cas, cas, results)]
                cas["pass"] = all(c["ok"] for c in cas["checks"])
            all_runs.append(results)
            if not all(r["pass"] for r in ordered):
                rc = 1
        last = ordered
        table = text_table(last)
        meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "host": os.uname().nodename, "cpus": os.cpu_count(), "quick": a.quick,
                "runDir": a.run_dir, "seconds": round(time.monotonic() - t_start, 1),
                "runs": a.runs}
        with open(os.path.join(a.out, "ladder.txt"), "w", encoding="utf-8") as f:
            f.write(table)
        chart = write_chart(a.out, last)
        write_markdown(os.path.join(a.out, "ladder.md"), last, meta, chart)
        html = os.path.join(a.out, "ladder.html")
        write_html(html, last, meta, table, chart)
        doc = {"meta": meta, "steps": last}
        if a.runs > 1:
            doc["runs"] = [list(run.values()) for run in all_runs]
            doc["tally"] = {s["key"]: sum(run[s["key"]]["pass"] for run in all_runs)
                            for s in steps}
        with open(os.path.join(a.out, "ladder.json"), "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
        print()
        print(f"seckill demo ladder ({meta['date']}, {meta['cpus']} CPUs"
              f"{', quick' if a.quick else ''}; {meta['seconds']} s)")
        print(table, end="")
        for r in last:
            for c in r["checks"]:
                if not c["ok"]:
                    print(f"MISS step {r['step']} ({r['title']}): {c['text']}")
        if a.runs > 1:
            print()
            print(f"expected outcome reproduced, per step, in {a.runs} runs:")
            print(tally_text(all_runs, steps), end="")
        print(f"\nreport {os.path.join(a.out, 'ladder.md')}"
              + (f", chart {os.path.join(a.out, chart)}" if chart else "")
              + f", data {os.path.join(a.out, 'ladder.json')}")
        print(f"HTML report (latency over time, invariants per step): {html}")
        print("RESULT: " + ("every step showed what it should" if rc == 0
                            else "a step did NOT show its expected outcome (MISS above)"))
    except (LadderError, kit.KitError) as e:
        print(f"ladder: error: {e}", file=sys.stderr)
        rc = 2
    except KeyboardInterrupt as e:
        print(f"ladder: interrupted ({e})", file=sys.stderr)
        rc = 130
    finally:
        try:
            lad.restore_constraint()
        except Exception as e:      # noqa: BLE001 -- report, keep cleaning up
            print(f"ladder: error: restoring {UNIQUE}: {e}", file=sys.stderr)
            rc = rc or 2
        try:
            if a.keep_stack and lad.stack.started and rc in (0, 1):
                lad.safe_defaults()
                log(f"the stack keeps running in {a.run_dir} "
                    f"(RUN_DIR={a.run_dir} scripts/stack.sh stop)")
            elif lad.stack.started or os.path.exists(os.path.join(a.run_dir, "pids")):
                lad.stack.stop()
            lad.stop_nodes()
            for p in lad.spawned:                # Redis nodes started again, stopped by PID
                try:
                    p.wait(timeout=0 if a.keep_stack else 15)
                except subprocess.TimeoutExpired:
                    pass
        except Exception as e:      # noqa: BLE001
            print(f"ladder: error: cleaning up the stack: {e}", file=sys.stderr)
            rc = rc or 2
    return rc


if __name__ == "__main__":
    sys.exit(main())
