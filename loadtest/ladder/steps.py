"""The ladder's steps: each step's strategies, knobs, load and expected
outcome (STEPS), the lock backends of the lock-service steps
(LOCK_BACKENDS), and the settings the ladder owns."""

UNIQUE = "uq_voucher_order_user_voucher"

# Instance settings the ladder sets itself for every step: never inherited.
STEP_VARS = ("SECKILL_LOCK", "SECKILL_STOCK", "DEMO_DELAY_MS", "DEMO_PAUSE_MS",
             "LOCK_LEASE_MS", "WATCHDOG_TIMEOUT_MS", "DEMO_RANDOM_USER", "INSTANCES",
             "LOG_LEVEL", "FENCING", "LOCK_SYNC_REPLICAS", "LOCK_SYNC_TIMEOUT_MS", "REDIS_HA",
             "INSTANCE_ENV_1", "INSTANCE_ENV_2", "REDIS_ORDER_DURABILITY", "CONSUMERS",
             "ZK_SESSION_TIMEOUT_MS", "LOCK_PG_SWEEP_MS", "LOCK_REDIS_NODES", "PG_HA",
             "PG_STATEMENT_TIMEOUT_MS", "REDIS_CLUSTER", "REDIS_ORDER_WAIT_REPLICAS",
             "REDIS_ORDER_WAIT_MS")
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


def stock_step(num, key, title, stock, expect, story, **more):
    """A stock strategy under the sale: two instances, the reentrant lock."""
    return dict(num=num, key=key, title=title, lock="reentrant", stock=stock, instances=2,
                env=STOCK_ENV, load=SALE, expect=expect, story=story, **more)


def storm_step(num, key, title, lock, expect, story, instances=2, env=LOCK_ENV):
    """A user lock under the single user's storm, the stock optimistic."""
    return dict(num=num, key=key, title=title, lock=lock, stock="optimistic",
                instances=instances, env=env, load=STORM, expect=expect, story=story)


def failover_step(num, key, title, env, replicas, expect, story):
    """The reentrant lock through a Redis failover (load FAILOVER); replicas
    "paused": the grant reaches none of them before the master dies, or
    "running"."""
    return dict(num=num, key=key, title=title, lock="reentrant", stock="optimistic",
                instances=2, env=env, load=FAILOVER, failover=True, replicas=replicas,
                expect=expect, story=story)


STEPS = [
    stock_step(1, "naive", "naive stock", "naive", expect="oversells, loses updates",
               story="read stock, check in C, write back read-1"),
    stock_step(2, "cas", "compare-and-swap", "cas", expect="no oversell, sells < optimistic",
               story="UPDATE ... WHERE stock = <value read>"),
    stock_step(3, "optimistic", "stock > 0", "optimistic", expect="sells exactly the stock",
               story="UPDATE ... SET stock = stock - 1 WHERE stock > 0"),
    stock_step(4, "pessimistic", "FOR UPDATE", "pessimistic", expect="sells exactly the stock",
               story="SELECT ... FOR UPDATE, then write"),
    storm_step(5, "none", "no lock", "none", expect="duplicates",
               story="check 'has this user an order?' then insert, unlocked"),
    storm_step(6, "local-1", "local mutex", "local", instances=1, expect="exactly 1 order",
               story="a per-user mutex inside the process"),
    storm_step(7, "local-2", "local mutex", "local", expect="duplicates (1 per instance)",
               story="the same mutex, nginx round-robins the user over two processes"),
    storm_step(8, "setnx", "SETNX, lease < hold", "setnx",
               env={"DEMO_DELAY_MS": 2000, "LOCK_LEASE_MS": 1000},
               expect="deletes other's lock, duplicates",
               story="SET NX EX 1, DEL without owner check; the transaction takes 2 s"),
    storm_step(9, "owner", "owner + Lua release", "owner",
               env={"DEMO_PAUSE_MS": 1100, "DEMO_DELAY_MS": 0, "LOCK_LEASE_MS": 1000},
               expect="release refused, 1 order",
               story="SET NX PX 1000 with an owner id, compare-and-delete in Lua; "
                     "the holder stalls 1.1 s after taking the lock, then orders"),
    storm_step(10, "reentrant", "reentrant + watchdog", "reentrant",
               env={"DEMO_DELAY_MS": 2000, "LOCK_LEASE_MS": -1, "WATCHDOG_TIMEOUT_MS": 1000},
               expect="1 order, lease renewed",
               story="Redisson-style hash lock, 1 s lease renewed by the watchdog; "
                     "the transaction takes 2 s"),
    stock_step(11, "batched", "batched (group commit)", "batched", optional=True,
               expect="sells exactly the stock", story="one statement settles a batch of buyers"),
    failover_step(12, "lost-nofence", "failover, no fence", env={"FENCING": 0}, replicas="paused",
                  expect="lock lost: duplicate order",
                  story="the master dies before the grant reaches a replica; FENCING=0 (unsafe "
                        "demo setting): Postgres does not check the token, both holders write"),
    failover_step(13, "lost-fence", "failover + fencing", env={}, replicas="paused",
                  expect="stale write refused, 1 order",
                  story="the same, with the default fence: the stale holder's token is older "
                        "than the second holder's, and Postgres refuses its write"),
    failover_step(14, "lost-wait-paused", "failover + WAIT 1, replicas paused", env=SYNC_ENV,
                  replicas="paused", expect="no ack: 503, grant undone, 1 order",
                  story="LOCK_SYNC_REPLICAS=1: WAIT after the grant; with the replicas paused "
                        "no replica acknowledges it within 300 ms, the grant is undone and A "
                        "gets 503"),
    failover_step(15, "lost-wait", "failover + WAIT 1", env=SYNC_ENV, replicas="running",
                  expect="lock kept: 2nd refused, 1 order",
                  story="LOCK_SYNC_REPLICAS=1 with the replicas running: the grant reached a "
                        "replica before A went on, the promoted replica has the lock, B is "
                        "refused"),
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


def backend_step(b, kind, title, **fields):
    """A step of lock backend b: its key and title, the stock optimistic,
    two instances, b's service (the nodes' only in the full ladder)."""
    return dict(key=f"{kind}-{b['lock']}", title=f"{b['lock']}: {title}", lock=b["lock"],
                stock="optimistic", instances=2, service=b["service"],
                full_only=b["service"] == "nodes", **fields)


def storm_steps():
    """The single-user storm on each lock backend of another service."""
    return [backend_step(b, "storm", "one user",
                         env=dict(LOCK_ENV, **{k: v for k, v in b["env"].items()
                                               if k == "LOCK_REDIS_NODES"}),
                         load=STORM, expect="exactly 1 order",
                         story=f"the single-user storm with SECKILL_LOCK={b['lock']}")
            for b in LOCK_BACKENDS if b["storm"]]


def crash_steps():
    """Per backend: the holder killed while it holds the user's lock."""
    return [backend_step(b, "crash", "holder killed", backend=b,
                         env=dict(b["env"], DEMO_PAUSE_MS=CRASH_PAUSE_MS),
                         load={"kind": "crash", "stock": 100},
                         expect=f"free in {b['free_s'][0]:g}-{b['free_s'][1]:g} s, 1 order",
                         story=f"instance 1 takes the user's lock and is killed (SIGKILL) while "
                               f"it holds it; instance 2 asks every 25 ms: the lock is free "
                               f"when the {b['frees']}")
            for b in LOCK_BACKENDS]


def outage_steps():
    """Per backend: its service stopped mid-sale."""
    return [backend_step(b, "outage", f"{b['service']} down", backend=b, env=dict(b["env"]),
                         load=OUTAGE, expect="503 while down, no hang, no wrong order",
                         story=f"distinct buyers for {OUTAGE['seconds']:g} s (and "
                               f"{OUTAGE['after_s']:g} s at least once it is back); "
                               f"{b['service']} stopped at {OUTAGE['stop_at']:g} s, started at "
                               f"{OUTAGE['start_at']:g} s")
            for b in LOCK_BACKENDS]


def node_step(key, lock, title, scenario, env, expect, story):
    """A step of the locks over independent nodes: one node fails (load
    "nodes", its scenario)."""
    return dict(key=key, title=f"{lock}: {title}", lock=lock, stock="optimistic", instances=2,
                service="nodes", env=env,
                load={"kind": "nodes", "scenario": scenario, "stock": 100},
                expect=expect, story=story)


def node_steps():
    """What the independent nodes do when one of them fails."""
    # the holder keeps the lock 4 s between its "has this user an order?" and
    # its insert (DEMO_DELAY_MS; the nodes' signals take about 2 s), within
    # a 6 s lease, so two holders' transactions overlap
    redlock_env = {"LOCK_LEASE_MS": 6000, "DEMO_DELAY_MS": 4000, "LOCK_REDIS_NODES": "@nodes5"}
    return [
        node_step("redlock-restart", "redlock", "node restarts empty", "restart", dict(redlock_env),
                  expect="two holders, 2 orders (no fence)",
                  story="instance 1 holds nodes A, B, C (D, E paused); C is killed and started "
                        "again at once without persistence; A, B paused: instance 2 takes C, D, "
                        "E while instance 1 still holds its lease"),
        node_step("redlock-delayed", "redlock", "delayed restart", "delayed", dict(redlock_env),
                  expect="one holder, 1 order",
                  story="the same, but C rejoins only after the longest lease: instance 2 "
                        "reaches D and E only, no majority (503)"),
        node_step("multilock-node-down", "multilock", "a node down", "down",
                  {"LOCK_REDIS_NODES": "@nodes3"}, expect="no one buys (503), no oversell",
                  story="one of the three nodes killed; 40 distinct buyers through nginx"),
    ]


def lock_steps(first):
    """The lock-service steps, numbered from 'first'."""
    out = storm_steps() + crash_steps() + outage_steps() + node_steps()
    for i, st in enumerate(out):
        st["num"] = first + i
    return out


STEPS += lock_steps(len(STEPS) + 1)


# The Postgres failover steps (a stack with PG_HA=1: pg_auto_failover, a
# monitor and three data nodes, number_sync_standbys 1). The walreceiver of
# both standbys is frozen (SIGSTOP), and the monitor with them, so no standby
# flushes the burst's WAL (pg-async: the primary's walsenders are ended too,
# so none receives it); the primary is then SIGKILLed (its whole process
# tree), the rest resumed and a standby promoted. What the burst's 200s promised and the
# new primary has: synchronous_commit = local acknowledges a commit once the
# primary alone has flushed it, on waits for a standby's flush as well
# (https://www.postgresql.org/docs/current/warm-standby.html#SYNCHRONOUS-REPLICATION).
PG_BURST = {"kind": "pg-failover", "requests": 100, "concurrency": 10, "stock": 1000}
# pg-sync: each buyer's session is cut after its wait and its backend stays
# waiting for the standby (a client gone is not noticed there): fewer
# buyers, so that the primary keeps connections for the check after it.
PG_BURST_SYNC = dict(PG_BURST, requests=30)
PG_SYNC_TIMEOUT_MS = 1000    # a commit waiting for its standby is cancelled: 503


def pg_step(key, title, commit, cut, env, expect, story, load=PG_BURST):
    """A Postgres failover step: the burst with the standbys' walreceivers
    frozen, the primary killed; commit: the role's synchronous_commit; cut:
    the primary's walsenders ended as well."""
    return dict(key=key, title=title, lock="reentrant", stock="optimistic", instances=2,
                env=dict(env, PG_HA=1), synchronous_commit=commit, cut_walsenders=cut,
                load=load, pg_failover=True, expect=expect, story=story)


def pg_steps(first):
    """The Postgres failover steps, numbered from 'first'."""
    out = [
        pg_step("pg-async", "PG failover, async standby", "local", True,
                {"INSTANCE_ENV_1": "PG_HA=0", "INSTANCE_ENV_2": "PG_HA=0"},
                expect="acked orders lost",
                story="ALTER ROLE ... SET synchronous_commit = local (instances with PG_HA=0, "
                      "which accept it): 100 buyers (10 concurrent) answered 200 once the "
                      "primary alone has the commit; the standbys' walreceivers frozen, the "
                      "primary SIGKILLed, a standby promoted without the burst"),
        # The walsenders may stay: a commit waits for a standby's flush, which
        # a frozen walreceiver never reports.
        pg_step("pg-sync", "PG failover, sync standby", "on", False,
                {"PG_STATEMENT_TIMEOUT_MS": PG_SYNC_TIMEOUT_MS},
                expect="no 200 while frozen, none lost",
                story="the same with synchronous_commit = on (PG_HA=1 instances): each commit "
                      "waits for a standby that receives nothing, or, where Postgres has not "
                      "applied the standby list yet, returns and is not confirmed by any "
                      "standby's flush position; after PG_STATEMENT_TIMEOUT_MS="
                      f"{PG_SYNC_TIMEOUT_MS} (+1 s for a cut round trip) the buyer gets 503; "
                      "nothing acknowledged, nothing lost", load=PG_BURST_SYNC),
    ]
    for i, st in enumerate(out):
        st["num"] = first + i
    return out


STEPS += pg_steps(len(STEPS) + 1)


# The Redis-first steps on a Redis Cluster (a stack with REDIS_CLUSTER=1: 3
# masters, 3 replicas, every node appendfsync always). The replica of the
# voucher's master is cut off (SIGSTOP, and the master's link to it ended),
# a burst of buyers is admitted with the consumers off, the master is
# SIGKILLed, the replica resumed and promoted: it never had the burst. An
# AOF on the killed master does not help: the promoted replica is the
# slot's copy now, and the killed node comes back as its replica, its data
# replaced by the new master's.
CLUSTER_BURST = {"kind": "cluster-failover", "requests": 200, "concurrency": 20, "stock": 1000}
CLUSTER_ENV = {"REDIS_CLUSTER": 1, "CONSUMERS": 0}


def cluster_step(key, title, env, expect, story):
    return dict(key=key, title=title, lock="reentrant", stock="redis", instances=2,
                env=dict(CLUSTER_ENV, **env), load=CLUSTER_BURST, cluster_failover=True,
                expect=expect, story=story)


def cluster_steps(first):
    """The Redis Cluster steps, numbered from 'first'."""
    out = [
        cluster_step("cluster-none", "redis-first on a cluster, no wait",
                     {"REDIS_ORDER_DURABILITY": "none"}, expect="acked orders lost",
                     story="REDIS_ORDER_DURABILITY=none: 200 as soon as the voucher's master "
                           "ran the script; its replica cut off, the master SIGKILLed, the "
                           "replica promoted without the burst"),
        cluster_step("cluster-aof", "redis-first on a cluster, AOF always", {},
                     expect="acked orders lost: a failover skips the AOF",
                     story="REDIS_ORDER_DURABILITY=aof (every node appendfsync always): each "
                           "200 is on the master's disk, but the slot fails over to the "
                           "replica, which never had the burst; the killed node returns as its "
                           "replica and takes the new master's data"),
        cluster_step("cluster-wait", "redis-first on a cluster, WAIT 1",
                     {"REDIS_ORDER_DURABILITY": "wait", "REDIS_ORDER_WAIT_REPLICAS": 1,
                      "REDIS_ORDER_WAIT_MS": 300},
                     expect="no 200 while cut off, none lost",
                     story="REDIS_ORDER_DURABILITY=wait: WAIT 1 on the voucher's own master "
                           "after each lot; its replica cut off, no replica acknowledges within "
                           "300 ms, every buyer gets 503, nothing acknowledged is lost"),
    ]
    for i, st in enumerate(out):
        st["num"] = first + i
    return out


STEPS += cluster_steps(len(STEPS) + 1)
