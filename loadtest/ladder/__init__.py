"""loadtest/ladder -- the demo ladder: the classic walk from a broken
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
  pg steps     pg-async and pg-sync (a stack with PG_HA=1, pg_auto_failover:
               a monitor, three data nodes): both standbys' walreceivers frozen
               (with their pg_autoctl and the monitor), 100 buyers (30 in
               pg-sync; 10 concurrent) through nginx, the primary's process
               tree SIGKILLed, a standby promoted; the 200s compared with its
               tb_voucher_order. synchronous_commit = local: every 200 missing
               there; on (the default): 503 while no standby confirms, nothing
               missing. The killed node is started again as a standby
  cluster      last, cluster-none, cluster-aof and cluster-wait (a stack with
  steps        REDIS_CLUSTER=1: 3 masters, 3 replicas, every node appendfsync
               always; SECKILL_STOCK=redis, the consumers off): the replica
               of the voucher's master cut off (SIGSTOP, CLIENT KILL TYPE
               replica), 200 buyers (20 concurrent), the master SIGKILLed,
               the replica promoted, the killed node started again, the
               consumers on, every stream drained; the 200s compared with
               tb_voucher_order. none and aof (the AOF is on the killed
               node, and a failover skips it): every 200 lost; wait (WAIT 1
               on the voucher's master): 503 to all, nothing lost

It runs a stack of its own (scripts/stack.sh, RUN_DIR default .run/ladder, free
ports), without the unique constraint uq_voucher_order_user_voucher (it would
hide the locks' failures), and restores the constraint at the end (duplicate
rows deleted first). The stack is stopped at the end unless --keep-stack: then
it stays up with the safe default strategies.

Outputs (OUT, default build/ladder): ladder.txt (the terminal table),
ladder.md (Markdown report), ladder.png (gnuplot chart: oversold, duplicate
orders and success rate per step), ladder.html (per step: its invariants and
its latency percentiles over time, the kit's inline SVG charts: the storms
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

  python3 loadtest/ladder [--quick] [--runs N] [--steps 1,2,8] [--no-batched]
                          [--no-lock-services] [--no-failover]
                          [--keep-stack] [--run-dir DIR] [--out DIR]

--quick: 500 buyers instead of 1000 in the stock steps and the failover steps'
sales (CI); every assertion stays. --no-failover: without steps 12-15, the
Postgres failover steps and the Redis Cluster steps. --runs N: the whole ladder N times on the same stack, then how often
each step's expected outcome reproduced. Python 3 standard library only; needs
ab, psql, curl (stack.sh) and, for the chart, gnuplot.

The package's modules: steps (STEPS, LOCK_BACKENDS), checks (each step's
expected outcome), stack, run (Ladder: one step after another), loads (sale,
storm, outage), faults (a killed holder, the nodes' failures), failover (the
lost lock), redis_steps (Redis killed, a slow disk), pg_steps (the Postgres
primary killed), cluster_steps (a Redis Cluster master killed), record (a step's
figures), report (table, Markdown, HTML, chart), cli.
"""
