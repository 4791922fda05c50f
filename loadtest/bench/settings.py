"""make bench's settings: the reference figures and the speed targets, the
BENCH_* knobs read from the environment, its errors and its log."""

import os
import sys

import kit

ROOT = kit.ROOT

# Reference figures measured once on a 2-core VM with durable Postgres, printed
# beside this run's ceilings to show how far the machine is from that one.
REFERENCE = {"pgOneRow": 3600, "pgTxn": 2100, "redisEvalsha": 80000, "nginx": 42000}
STEAL_WARN_PCT = 5     # a run with more steal than this is flagged in the table
PACED_SHARE = 0.25   # paced latency runs offer this share of the nginx ceiling's rate
TARGETS = {"optimisticVsOneRow": 0.9, "soldOutVsNginx": 0.9,
           "soldOutP99Ms": 2.0, "rssMb": 20.0, "soldOutVsBare": 0.8, "soldOutSeckillCpuPct": 5.0,
           "soldOutNoEdgeCpuUsPerAnswer": 20.0,
           "redisVsOneRow": 3.0, "redisVsSoldOut": 0.4, "redisP99Ms": 10.0}
HALF = 0.5           # the sold-out crowd and the bare ceiling are also paced to half their rate
# The batched sale's targets by concurrency: orders/s against the one-row
# ceiling, the machine's idle share during the sale (%), p99 (ms), and
# orders/s against the optimistic sale at the same concurrency.
BATCH_TARGETS = {16: {"vsOptimistic": 1.0}, 64: {"vsOneRow": 3.0, "idlePct": 15.0, "p99Ms": 30.0},
                 256: {"vsOneRow": 3.0}}


def env_list(name, default):
    """A comma list of whole numbers from the environment."""
    v = os.environ.get(name, "")
    if v.strip() == "":
        return default
    try:
        return [int(x) for x in v.split(",") if x.strip()]
    except ValueError:
        sys.exit(f"bench: {name} must be a comma list of whole numbers (got {v!r})")


def env_int(name, default):
    """A whole number from the environment."""
    v = os.environ.get(name, "")
    if v == "":
        return default
    try:
        return int(v)
    except ValueError:
        sys.exit(f"bench: {name} must be a whole number (got {v!r})")


class BenchError(kit.KitError):
    """A measurement could not be made (exit status 2)."""


class Interrupted(Exception):
    """SIGTERM or SIGINT during the run."""


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def redis_threads():
    """THREADS of the redis-first instances (BENCH_REDIS_THREADS)."""
    return env_int("BENCH_REDIS_THREADS", 32)
