"""python3 loadtest/bench [--median [--json OUT] FILE... | --chart FILE PNG]:
the command line of make bench (see the package's doc)."""

import json
import os
import sys
import time

import bench
from bench import Bench
from bench.settings import log


def load_runs(paths):
    """A Bench holding the rounds of the saved runs 'paths' (their JSON
    files), with the first run's settings and machine: for --median and
    --chart."""
    b = Bench()
    docs = []
    for path in paths:
        with open(path) as fh:
            docs.append(json.load(fh))
    st = docs[0].get("settings", {})
    b.sale_conns = st.get("saleConnections", b.sale_conns)
    bc = st.get("batchConnections", b.batch_conns)
    b.batch_conns = bc if isinstance(bc, list) else [bc]
    b.low_conns = st.get("lowConnections", 0)
    b.batch_threads = st.get("batchThreads", b.batch_threads)
    b.long_seconds = st.get("longSeconds", b.long_seconds)
    b.long_conns = st.get("longConnections", b.long_conns)
    b.res["machine"] = docs[0].get("machine") or {}
    b.res["when"] = docs[0].get("when", "")
    b.runs = len(docs)
    for d in docs:
        add_run(b, d)
    return b


def add_run(b, d):
    """The rounds, long sale and invariants of the saved run d into b."""
    c = (d.get("settings") or {}).get("batchConnections")
    for r in d.get("rounds") or []:
        if isinstance(c, int) and "batchedSale" in r:     # a file from when one concurrency ran
            r[f"batchedSale{c}"] = r.pop("batchedSale")
    b.rounds.extend(d.get("rounds") or [])
    lg = d.get("long")
    b.longs.extend(lg if isinstance(lg, list) else [lg] if lg else [])
    inv = (d.get("invariants") or {}).get("runs") or []
    b.invariant_runs.extend(inv)
    b.violations.extend(r["run"] for r in inv if not r.get("ok"))


def median_of_files(argv):
    """--median [--json OUT] FILE...: the table of several runs' medians."""
    out = None
    if argv[:1] == ["--json"]:
        if len(argv) < 2:
            sys.exit("bench: --json needs a file")
        out, argv = argv[1], argv[2:]
    if not argv:
        sys.exit("usage: python3 loadtest/bench --median [--json OUT] build/bench-history/*.json")
    b = load_runs(argv)
    b.json_path = out or "(not written: --json OUT)"
    b.report()
    if out:
        b.repeat = len(b.rounds)
        b.write_json("median", None, history=False)
        with open(out) as fh:
            doc = json.load(fh)
        doc["command"] = "python3 loadtest/bench --median " + " ".join(argv)
        doc["files"] = argv
        with open(out, "w") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")
    return 1 if b.violations else 0


def chart_of_file(argv):
    """--chart FILE PNG: the chart of a saved run."""
    if len(argv) != 2:
        sys.exit("usage: python3 loadtest/bench --chart build/bench.json docs/img/bench.png")
    b = load_runs(argv[:1])
    if b.chart(os.path.abspath(argv[1]), b.chart_title()) is None:
        sys.exit("bench: no chart (gnuplot missing, or no sale in the file)")
    print(f"chart: {argv[1]}")
    return 0


def main():
    """make bench, or --median / --chart of saved runs; the exit status."""
    if sys.argv[1:2] == ["--median"]:
        return median_of_files(sys.argv[2:])
    if sys.argv[1:2] == ["--chart"]:
        return chart_of_file(sys.argv[2:])
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(bench.__doc__)
        return 0
    b = Bench()
    error = b.guarded(b.execute)
    status, rc = ("error", 2) if error else ("ok", 0)
    if b.rounds:
        b.report()
    if b.violations:
        status, rc = "invariant-violation", 1
    b.write_json(status, error)
    if b.rounds:
        png = b.chart(os.path.join(os.path.dirname(os.path.abspath(b.json_path)), "bench.png"),
                      b.chart_title())
        log(f"chart: {png}" if png else "no chart (gnuplot missing, or no sale ran)")
    log(f"done in {time.monotonic() - b.t_start:.0f}s")
    if rc == 1:
        log("FAILED: an invariant was violated (see above)")
    return rc
