"""make bench: the machine's ceilings and the service, measured in one run.

  python3 loadtest/bench               (make bench builds first, then runs this)

Starts its own local stack (scripts/stack.sh in BENCH_RUN_DIR: a durable
Postgres -- fsync, synchronous_commit and full_page_writes on, the defaults --,
Redis, 2 instances at LOG_LEVEL=warn, nginx; every port picked free on
127.0.0.1), then measures:

  ceilings on that same Postgres, Redis and nginx
    pg-one-row   pgbench: UPDATE tb_voucher SET stock = stock - 1
                 WHERE voucher_id = :v AND stock > 0, autocommit, 16 clients
    pg-txn       pgbench: BEGIN; duplicate check SELECT; that UPDATE; INSERT
                 the order; COMMIT (distinct users and order ids), 16 clients
    redis        redis-benchmark: EVALSHA of lua/lock_acquire.lua on distinct
                 keys (-r), 50 clients
    nginx        wrk through an nginx made from nginx/nginx.conf.tmpl (the
                 same proxy settings) to a keep-alive upstream that answers
                 200 at once, 64 connections; then the same nginx in front of
                 two build/upstream200 processes (loadtest/upstream200.c), a
                 separate upstream that does no work: not a target, a
                 yardstick for how much of the chain's cost is the upstream's
    nginx bare   wrk on a server block of that nginx that answers 'return 200'
                 itself (the same http settings and access log): what nginx
                 alone answers, saturated and paced to half that rate
  the service through nginx (2 instances)
    sale         wrk, a new user per request, a stock that does not run out:
                 orders/s from the first to the last order in Postgres
    sold-out     wrk on a sold-out voucher, answered by nginx's sold-out edge:
                 req/s, p50/p99 saturated and paced to half that rate, the
                 instances' CPU and the requests that reached them meanwhile
                 (their own sold_out counters); then the same through a
                 second nginx from the template with --edge off (every
                 request to an instance: the hop the edge saves)
    storm        ab -k, one user: req/s (exactly one order)
    long         a 60 s sale at 256 connections: RSS per instance after it
    low          the optimistic sale at 16 connections (the batched one's
                 yardstick at that concurrency)
    batched      the instances restarted with SECKILL_STOCK=batched: the sale
                 again at 16, 64 and 256 connections, each with its CPU by
                 component, the machine's idle share and the buyers per group
                 commit (the instances' seckill_batch_buyers_total /
                 seckill_batches_total, from /metrics)
    redis        the instances restarted with SECKILL_STOCK=redis, Redis switched
                 to appendonly yes, appendfsync always (CONFIG SET; back to no
                 AOF after): the sale again, orders/s as acknowledged (200s per
                 second of load), the time until the last order landed in
                 Postgres, and the reconciliation of Redis and Postgres
    rediswait    the same sale acknowledged by WAIT for one replica instead
                 (REDIS_ORDER_DURABILITY=wait, REDIS_ORDER_WAIT_REPLICAS=1): a
                 redis-server replicating the stack's Redis is started for it
                 and stopped after; the master runs without AOF meanwhile
  RSS per instance (VmRSS) before and after; CPU seconds per component
  (seckill, nginx, postgres, redis, the load tool, everything else) per run;
  for each sale, where its idle share goes (kit.IdleSampler: at instants
  when a CPU is free, whether a Postgres process waits on the WAL's flush,
  a commit on a standby, Redis's main thread on its fsync, another thread
  on the disk, a transaction holding the voucher row, or none of these:
  round trips between processes) and what would turn it into orders.

After every service run loadtest/check_invariants.py checks the voucher in
Postgres; any violation makes the run exit 1 (speed targets never do: they
are printed PASS or MISS). Prints the table, writes BENCH_JSON, and stops
everything it started, by PID. With gnuplot, also a chart next to
BENCH_JSON (bench.png): each sale's orders/s against the one-row ceiling,
and its CPU per order by process.

  python3 loadtest/bench --median [--json OUT] FILE...   medians of several runs
  python3 loadtest/bench --chart FILE PNG                the chart of a saved run
                                                         (docs/img/bench.png)

Environment (all optional):
  BENCH_RUN_DIR        the stack's run directory (default <repo>/build/bench-run)
  BENCH_JSON           results file (default <repo>/build/bench.json)
  BENCH_SECONDS        length of each measured run (default 6)
  BENCH_WARMUP         warm-up seconds before each (default 2)
  BENCH_REPEAT         rounds of the short runs; the table shows medians (default 1)
  BENCH_LONG           1: the 60 s / 256-connection sale (default 1; 0 skips it)
  BENCH_LONG_SECONDS, BENCH_LONG_CONNECTIONS   (60, 256)
  BENCH_SALE_CONNECTIONS      wrk connections of the sales (64)
  BENCH_LOW_CONNECTIONS       wrk connections of the low optimistic sale (16; 0: none)
  BENCH_BATCH_CONNECTIONS     wrk connections of the batched sales, a comma list
                              (16,64,256)
  BENCH_THREADS        THREADS of the optimistic instances (default: the server's)
  BENCH_BATCH_THREADS  THREADS of the batched instances (default 8, the server's:
                       a queued buyer holds no worker, and 4, 8 and 16 measured alike)
  BENCH_REDIS_THREADS  THREADS of the redis-first instances (default 32: a worker
                       waits for Redis's fsync, and more of them share one)
  BENCH_SKIP           comma list of ceilings,optimistic,low,storm,soldout,noedge,long,batched,redis,
                       rediswait
  BENCH_IDLE_MS        at least this long between two looks at a free CPU
                       during a sale (default 50: each look reads every thread's /proc stat,
                       about 3 ms of CPU; 0: no look, no idle table)
  BENCH_KEEP=1         leave the stack running at the end (make stop-bench stops it)
  SECKILL_BIN          server binary (default build/seckill)
  BENCH_UPSTREAM200    the ceiling's stand-in upstream (default build/upstream200)
The package's modules: settings (the targets, BENCH_* knobs), stack, core
(the run's state, wrk, the invariants' check, the CPU meter, the machine),
observe (what a load left in Postgres, nginx's log and the instances'
counters), ceilings, sales, redis_sales, rounds, summary (medians, ratios,
targets), report (the table), chart, results (BENCH_JSON), cli. Bench is
made of their mixins. Python 3 standard library only.
"""

from .ceilings import Ceilings
from .chart import Chart
from .core import Core
from .observe import Observe
from .redis_sales import RedisSales
from .report import Report
from .results import Results
from .rounds import Rounds
from .sales import Sales
from .settings import ROOT, BenchError, env_int, env_list, log, redis_threads  # noqa: F401
from .summary import Summary


class Bench(Core, Observe, Ceilings, Sales, RedisSales, Rounds, Summary, Report, Chart, Results):
    """One make bench run, or saved runs read back (cli.load_runs)."""
