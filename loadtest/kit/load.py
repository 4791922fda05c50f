"""The load tools: parse_ab() and ab_times() (ab -g), parse_wrk() and
run_wrk() (wrk with loadtest/wrk_sale.lua)."""

import json
import os
import re

from .base import LOADTEST, KitError
from .proc import run

WRK_LUA = os.path.join(LOADTEST, "wrk_sale.lua")


def parse_ab(text):
    """The figures of ab's report: requests, failed (with -l: transport
    failures only), non2xx, seconds, rps, p50Ms and p99Ms (ab's own
    percentiles, whole ms; None when it printed none)."""
    def num(pattern, cast=float, default=None):
        m = re.search(pattern, text, re.M)
        return cast(m.group(1)) if m else default
    return {
        "requests": num(r"^Complete requests:\s+(\d+)", int, 0),
        "failed": num(r"^Failed requests:\s+(\d+)", int, 0),
        "non2xx": num(r"^Non-2xx responses:\s+(\d+)", int, 0),
        "seconds": num(r"^Time taken for tests:\s+([\d.]+)", float, 0.0),
        "rps": num(r"^Requests per second:\s+([\d.]+)", float, 0.0),
        "p50Ms": num(r"^\s+50%\s+(\d+)"),
        "p99Ms": num(r"^\s+99%\s+(\d+)"),
    }


def ab_times(path):
    """Per-request total times (ms) from an ab -g file (its fifth column)."""
    out = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            next(f, None)                       # header
            for line in f:
                cols = line.rstrip("\n").split("\t")
                if len(cols) >= 5:
                    try:
                        out.append(float(cols[4]))
                    except ValueError:
                        pass
    except OSError:
        pass
    return out


def parse_wrk(summary, stdout=None):
    """The figures of a wrk run with loadtest/wrk_sale.lua, from its summary
    (WRK_SUMMARY: the dict, or the file's path): requests, seconds, rps,
    p50Ms/p90Ms/p99Ms/maxMs (wrk's own percentiles), statuses {"200": n},
    socketErrors {connect, read, write, timeout}, errors (their sum),
    nonHttpErrors, orderIds, okWithoutOrderId. rps is wrk's "Requests/sec"
    when its stdout is given, else requests / seconds."""
    if isinstance(summary, str):
        with open(summary, encoding="utf-8") as f:
            summary = json.load(f)
    secs = summary["durationUs"] / 1e6 if summary.get("durationUs") else 0.0
    e = summary.get("errors", {})
    lat = summary.get("latencyUs", {})
    requests = summary.get("requests", 0)
    m = re.search(r"^Requests/sec:\s+([\d.]+)", stdout or "", re.M)
    sock = {k: int(e.get(k, 0)) for k in ("connect", "read", "write", "timeout")}
    r = {"requests": requests, "seconds": secs,
         "rps": float(m.group(1)) if m else (requests / secs if secs else 0.0),
         "statuses": {str(k): int(v) for k, v in summary.get("statuses", {}).items()},
         "socketErrors": sock, "errors": sum(sock.values()),
         "nonHttpErrors": int(e.get("status", 0)),
         "orderIds": summary.get("orderIds"), "okWithoutOrderId": summary.get("okWithoutOrderId", 0)}
    for k in ("p50", "p90", "p99", "max"):
        r[k + "Ms"] = lat[k] / 1000.0 if k in lat else None
    return r


def run_wrk(url, connections, seconds, out_dir, user_base, threads=2, timeout="10s",
            latency=True, ids=True, delay_ms=0, vouchers=()):
    """wrk with loadtest/wrk_sale.lua (a new X-User-Id from user_base on per
    request; the order ids of the 200s written to out_dir/wrk-ids.txt when
    ids) against url for seconds; with vouchers, each request buys one of
    them in turn (url's path unused). Returns parse_wrk()'s figures plus "cmd"
    (the command line) and "idsFile". KitError when wrk fails."""
    summary = os.path.join(out_dir, "wrk-summary.json")
    ids_file = os.path.join(out_dir, "wrk-ids.txt")
    for f in (summary, ids_file):
        if os.path.exists(f):
            os.unlink(f)
    env = dict(os.environ, WRK_USER_BASE=str(user_base), WRK_SUMMARY=summary,
               WRK_IDS_FILE=ids_file if ids else "", WRK_DELAY_MS=str(delay_ms) if delay_ms else "",
               WRK_VOUCHERS=",".join(str(v) for v in vouchers))
    cmd = ["wrk", "-t", str(min(threads, connections)), "-c", str(connections),
           "-d", f"{int(seconds)}s", "--timeout", timeout]
    if latency:
        cmd.append("--latency")
    cmd += ["-s", WRK_LUA, url]
    p = run(cmd, seconds + 60, env=env)
    if not os.path.exists(summary):
        raise KitError(f"wrk wrote no summary:\n{p.stdout[-500:]}{p.stderr[-500:]}")
    r = parse_wrk(summary)
    r["cmd"] = cmd
    r["idsFile"] = ids_file if ids else None
    return r
