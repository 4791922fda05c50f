"""The ladder's steps: each step's strategies, knobs, load and expected
outcome (STEPS), the lock backends of the lock-service steps
(LOCK_BACKENDS), and the settings the ladder owns."""

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


def storm_steps():
    """The single-user storm on each lock backend of another service."""
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
    return out


def crash_steps():
    """Per backend: the holder killed while it holds the user's lock."""
    out = []
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
    return out


def outage_steps():
    """Per backend: its service stopped mid-sale."""
    out = []
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
    return out


def node_steps():
    """What the independent nodes do when one of them fails (load "nodes")."""
    # the holder keeps the lock 4 s between its "has this user an order?" and
    # its insert (DEMO_DELAY_MS; the nodes' signals take about 2 s), within
    # a 6 s lease, so two holders' transactions overlap
    nodes_env = {"LOCK_LEASE_MS": 6000, "DEMO_DELAY_MS": 4000}
    return [
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


def lock_steps(first):
    """The lock-service steps, numbered from 'first'."""
    out = storm_steps() + crash_steps() + outage_steps() + node_steps()
    for i, st in enumerate(out):
        st["num"] = first + i
    return out


STEPS += lock_steps(len(STEPS) + 1)
