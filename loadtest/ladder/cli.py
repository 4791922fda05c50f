"""python3 loadtest/ladder [--quick] [--runs N] [--steps 1,2,8] ...: the
command line of the demo ladder (see the package's doc)."""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import kit

from .checks import check_step
from .report import tally_text, text_table, write_chart, write_html, write_markdown
from .run import Ladder
from .stack import LadderError, log
from .steps import STEPS, UNIQUE

ROOT = kit.ROOT


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
                    help="without the failover steps (12-15, Postgres's: pg-async, pg-sync, and "
                         "the Redis Cluster's: cluster-none, cluster-aof, cluster-wait)")
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


def select_steps(a):
    """The steps the options leave."""
    steps = [s for s in STEPS if not (s.get("optional") and a.no_batched)
             and not (s.get("service") and a.no_lock_services)
             and not (s.get("full_only") and a.quick)
             and not ((s.get("failover") or s.get("pg_failover") or s.get("cluster_failover"))
                      and a.no_failover)]
    if a.steps:
        want = {int(x) for x in a.steps.split(",") if x.strip()}
        steps = [s for s in steps if s["num"] in want]
    return steps


def one_run(lad, steps, run_no):
    """Every step once: {key: its figures}, and the figures in step order."""
    results, ordered = {}, []
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
    return results, ordered


def write_outputs(a, steps, all_runs, last, meta):
    """ladder.txt, .png, .md, .html and .json; (the table, the chart's file
    name or None, the HTML's path)."""
    table = text_table(last)
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
    return table, chart, html


def print_summary(a, steps, all_runs, last, meta, outputs, rc):
    """The terminal's table, misses, tally, where the outputs are, the result."""
    table, chart, html = outputs
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


def run_ladder(a, lad, steps):
    """The ladder a.runs times, its outputs and summary; the exit status."""
    all_runs, rc, t_start = [], 0, time.monotonic()
    for run_no in range(1, a.runs + 1):
        if a.runs > 1:
            log(f"run {run_no} of {a.runs}")
        results, ordered = one_run(lad, steps, run_no)
        all_runs.append(results)
        if not all(r["pass"] for r in ordered):
            rc = 1
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "host": os.uname().nodename, "cpus": os.cpu_count(), "quick": a.quick,
            "runDir": a.run_dir, "seconds": round(time.monotonic() - t_start, 1),
            "runs": a.runs}
    outputs = write_outputs(a, steps, all_runs, ordered, meta)
    print_summary(a, steps, all_runs, ordered, meta, outputs, rc)
    return rc


def clean_up(a, lad, rc):
    """The constraint back, the stack stopped (or left on the safe defaults
    with --keep-stack), the Redis nodes stopped; the exit status."""
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


def main(argv=None):
    """The ladder; the exit status (0 every step as expected, 1 a miss, 2 an error)."""
    a = parse_args(sys.argv[1:] if argv is None else argv)
    for tool in ("ab", "psql", "curl"):
        if shutil.which(tool) is None:
            print(f"ladder: error: '{tool}' not found (make deps)", file=sys.stderr)
            return 2
    steps = select_steps(a)
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
    rc = 0
    try:
        rc = run_ladder(a, lad, steps)
    except (LadderError, kit.KitError) as e:
        print(f"ladder: error: {e}", file=sys.stderr)
        rc = 2
    except KeyboardInterrupt as e:
        print(f"ladder: interrupted ({e})", file=sys.stderr)
        rc = 130
    finally:
        rc = clean_up(a, lad, rc)
    return rc
