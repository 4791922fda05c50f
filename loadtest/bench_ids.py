#!/usr/bin/env python3
"""loadtest/bench_ids.py -- five ways to make order ids, side by side (make bench-ids).

Starts a private stack (scripts/stack.sh: Postgres, Redis, one instance,
nginx; RUN_DIR build/bench-ids-run, free ports), runs loadtest/bench_ids.c
(build/tests/bench_ids) against its Redis and Postgres, and stops it. The
program measures, for the service's Redis id, snowflake, UUID v4 and v7, a
Postgres sequence without and with CACHE, and segment allocation: ids per
second from BENCH_IDS_THREADS (8) threads for BENCH_IDS_SECONDS (3) s, size,
duplicates, ordering per thread and across threads, what a restart does and
what a clock step back does. Output: the program's table, and
build/bench-ids/bench-ids.json and .txt.
"""

import os
import subprocess
import sys

sys.dont_write_bytecode = True          # no __pycache__ in loadtest/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kit  # noqa: E402

BIN = os.path.join(kit.BUILD, "tests", "bench_ids")
OUT = os.path.join(kit.BUILD, "bench-ids")


def main():
    if not os.access(BIN, os.X_OK):
        print(f"bench-ids: {BIN} is missing", file=sys.stderr)
        return 2
    os.makedirs(OUT, exist_ok=True)
    stack = kit.Stack(os.path.join(kit.BUILD, "bench-ids-run"), scrub=("REDIS_URL", "PG_DSN"))
    rc = 1
    try:
        stack.run("stop")
        stack.command("start", 180, INSTANCES=1, NGINX_PORT="auto", APP_PORT_BASE="auto",
                      PG_PORT="auto", REDIS_PORT="auto", LOG_LEVEL="warn")
        env = dict(os.environ, REDIS_URL=stack.info["REDIS_URL"], PG_DSN=stack.info["PG_DSN"])
        args = [BIN, "--threads", os.environ.get("BENCH_IDS_THREADS", "8"),
                "--seconds", os.environ.get("BENCH_IDS_SECONDS", "3"),
                "--json", os.path.join(OUT, "bench-ids.json")]
        p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
        sys.stdout.write(p.stdout)
        sys.stderr.write(p.stderr)
        with open(os.path.join(OUT, "bench-ids.txt"), "w", encoding="utf-8") as f:
            f.write(p.stdout)
        rc = p.returncode
        print(f"data {os.path.join(OUT, 'bench-ids.json')}")
    except (kit.KitError, subprocess.SubprocessError) as e:
        print(f"bench-ids: error: {e}", file=sys.stderr)
    finally:
        stack.run("stop")
    return rc


if __name__ == "__main__":
    sys.exit(main())
