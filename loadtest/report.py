#!/usr/bin/env python3
"""Turns one load-test run into a short table and checks its invariants.

Used by loadtest/ab_sale.sh, wrk_sale.sh and ab_storm.sh (see them for the
arguments); also 'report.py summary RESULT.json ...' prints one row per run,
and 'curl .../stats | report.py cluster' the counters of every instance.

Sources, best first:
  status counts  the nginx access log (when local), wrk's Lua counters, or
                 ab's 2xx count and the cluster counters of /stats (after minus
                 before) for the other statuses
  instances      the nginx access log ($upstream_addr), or /stats per instance
  latency        ab's or wrk's own percentiles
  orders, stock  Postgres via loadtest/check_invariants.py (with PG_DSN), or /stats
Exit status: 0 all invariants hold, 1 a violation, 2 an error.
Python 3 standard library only.
"""

import argparse
import json
import os
import re
import sys

sys.dont_write_bytecode = True          # no __pycache__ in loadtest/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_invariants  # noqa: E402


# ---------------------------------------------------------------- inputs

def parse_ab(text):
    def num(pattern, cast=float, default=None):
        m = re.search(pattern, text, re.M)
        return cast(m.group(1)) if m else default
    r = {
        "requests": num(r"^Complete requests:\s+(\d+)", int, 0),
        "failed": num(r"^Failed requests:\s+(\d+)", int, 0),
        "non2xx": num(r"^Non-2xx responses:\s+(\d+)", int, 0),
        "seconds": num(r"^Time taken for tests:\s+([\d.]+)", float, 0.0),
        "rps": num(r"^Requests per second:\s+([\d.]+)", float, 0.0),
        "p50": num(r"^\s+50%\s+(\d+)", float),
        "p99": num(r"^\s+99%\s+(\d+)", float),
    }
    # With -l, "Failed requests" are transport failures (connect, receive, exceptions).
    r["errors"] = r["failed"]
    return r


def parse_wrk(summary_path, text):
    with open(summary_path, encoding="utf-8") as f:
        s = json.load(f)
    secs = s["durationUs"] / 1e6 if s.get("durationUs") else 0.0
    e = s.get("errors", {})
    lat = s.get("latencyUs", {})
    m = re.search(r"^Requests/sec:\s+([\d.]+)", text or "", re.M)
    return {
        "requests": s.get("requests", 0),
        "seconds": secs,
        "rps": float(m.group(1)) if m else (s.get("requests", 0) / secs if secs else 0.0),
        "p50": lat.get("p50", 0) / 1000.0 if lat else None,
        "p99": lat.get("p99", 0) / 1000.0 if lat else None,
        "errors": e.get("connect", 0) + e.get("read", 0) + e.get("write", 0) + e.get("timeout", 0),
        "statuses": {str(k): int(v) for k, v in s.get("statuses", {}).items()},
        "orderIds": s.get("orderIds"),
        "okWithoutOrderId": s.get("okWithoutOrderId", 0),
    }


LOG_RE = re.compile(r'"(\S+) (\S+)[^"]*" (\d{3}) \d+ .*? up=(.*?) us=')


def parse_access_log(path, offset, uri):
    """Status and upstream counts of the requests for uri logged after offset."""
    statuses, upstreams = {}, {}
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read().decode("utf-8", "replace")
    for line in data.splitlines():
        m = LOG_RE.search(line)
        if not m or m.group(2) != uri:
            continue
        statuses[m.group(3)] = statuses.get(m.group(3), 0) + 1
        up = m.group(4).split(",")[-1].strip()     # retried: the last one answered
        upstreams[up] = upstreams.get(up, 0) + 1
    return statuses, upstreams


def load_json(path):
    if not path or not os.path.exists(path) or os.path.getsize(path) == 0:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except ValueError:
        return None


def stats_instances(stats):
    """{instance id: {"port":..., "requests": {...}}} from a /stats answer."""
    out = {}
    for inst in (stats or {}).get("instances", []) or []:
        if isinstance(inst, dict) and "instance" in inst:
            out[inst["instance"]] = inst
    return out


def delta(after, before, key):
    a = ((after or {}).get("requests") or {}).get(key) or {}
    b = ((before or {}).get("requests") or {}).get(key) or {}
    return {k: int(v) - int(b.get(k, 0)) for k, v in a.items() if int(v) - int(b.get(k, 0)) > 0}


def cluster_deltas(before, after):
    """Cluster-wide byStatus and byError deltas, summed over the instances."""
    ib, ia = stats_instances(before), stats_instances(after)
    by_status, by_error = {}, {}
    for name, inst in ia.items():
        for k, v in delta(inst, ib.get(name), "byStatus").items():
            by_status[k] = by_status.get(k, 0) + v
        for k, v in delta(inst, ib.get(name), "byError").items():
            by_error[k] = by_error.get(k, 0) + v
    return by_status, by_error


def per_instance_totals(before, after):
    ib, ia = stats_instances(before), stats_instances(after)
    out = {}
    for name, inst in ia.items():
        t = int((inst.get("requests") or {}).get("total", 0))
        t0 = int(((ib.get(name) or {}).get("requests") or {}).get("total", 0))
        out[name] = t - t0
    return out


def voucher_from_stats(stats, voucher):
    for v in (stats or {}).get("vouchers", []) or []:
        if str(v.get("voucherId")) == str(voucher):
            return v
    return None


# ---------------------------------------------------------------- output

def fmt_ms(v):
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 10 else f"{v:.1f}"


def print_block(res):
    w = sys.stdout.write
    st = res["statuses"]
    other = sum(v for k, v in st.items() if k not in ("200", "409"))
    w(f"\n== {res['scenario']}: {res['what']}\n")
    w(f"   target      {res['url']}\n")
    w(f"   requests    {res['requests']} in {res['seconds']:.2f} s = {res['rps']:.0f} req/s"
      f"   latency p50 {fmt_ms(res['p50'])} ms, p99 {fmt_ms(res['p99'])} ms"
      f"   transport errors {res['errors']}\n")
    errs = ", ".join(f"{k} {v}" for k, v in sorted(res["errorCodes"].items()))
    w(f"   answers     200: {st.get('200', 0)}   409: {st.get('409', 0)}   other: {other}"
      + (f"   ({errs})" if errs else "")
      + f"   [{res['statusSource']}]\n")
    v = res["voucher"]
    ops = f", {res['ordersPerSecond']:.0f} orders/s first to last" if res.get("ordersPerSecond") else ""
    w(f"   voucher {res['voucherId']:<4}orders {v.get('orders', '?')}{ops};"
      f" stock {v.get('stock', '?')} of {v.get('initialStock', '?')}\n")
    w(f"   invariants  oversold {v.get('oversold', '?')}   duplicate users"
      f" {v.get('duplicateUsers', '?')}   drift {v.get('stockDrift', '?')}"
      + (f"   order ids seen {v['idsSeen']}, missing in DB {v['idsMissing']}"
         if "idsSeen" in v else "")
      + f"   [{res['invariantSource']}]\n")
    inst = "   ".join(f"{name} {n}" for name, n in res["instances"])
    w(f"   instances   {inst or '-'}   [{res['instanceSource']}]\n")
    for ok, msg in res["checks"]:
        if not ok:
            w(f"   FAIL        {msg}\n")
    w(f"   verdict     {'OK: every invariant holds' if res['ok'] else 'VIOLATED'}\n")


def summary_table(results):
    cols = [("scenario", 10, "l"), ("requests", 8, "r"), ("req/s", 7, "r"), ("p50ms", 6, "r"),
            ("p99ms", 6, "r"), ("200", 6, "r"), ("409", 6, "r"), ("other", 5, "r"),
            ("orders", 6, "r"), ("orders/s", 8, "r"), ("stock", 6, "r"), ("oversold", 8, "r"),
            ("dupUsers", 8, "r"), ("drift", 5, "r"), ("check", 5, "l"), ("per instance", 0, "l")]
    rows = []
    for r in results:
        st = r["statuses"]
        v = r["voucher"]
        rows.append([
            r["scenario"], r["requests"], f"{r['rps']:.0f}", fmt_ms(r["p50"]), fmt_ms(r["p99"]),
            st.get("200", 0), st.get("409", 0),
            sum(n for k, n in st.items() if k not in ("200", "409")),
            v.get("orders", "?"),
            f"{r['ordersPerSecond']:.0f}" if r.get("ordersPerSecond") else "-",
            v.get("stock", "?"), v.get("oversold", "?"), v.get("duplicateUsers", "?"),
            v.get("stockDrift", "?"), "OK" if r["ok"] else "FAIL",
            " ".join(f"{name.split(' ')[0]}={n}" for name, n in r["instances"]) or "-",
        ])
    widths = [max(w, len(c), *(len(str(row[i])) for row in rows)) for i, (c, w, _a) in enumerate(cols)]

    def line(vals):
        out = []
        for i, val in enumerate(vals):
            s = str(val)
            out.append(s.ljust(widths[i]) if cols[i][2] == "l" else s.rjust(widths[i]))
        return "  ".join(out).rstrip()
    print(line([c for c, _w, _a in cols]))
    for row in rows:
        print(line(row))


# ---------------------------------------------------------------- main

def cmd_run(a):
    with open(a.tool_output, encoding="utf-8", errors="replace") as f:
        text = f.read()
    if a.tool == "ab":
        m = parse_ab(text)
    else:
        m = parse_wrk(a.wrk_summary, text)
    before, after = load_json(a.stats_before), load_json(a.stats_after)
    uri = f"/voucher/{a.voucher}/seckill"

    statuses, upstreams, status_source = {}, {}, ""
    if a.access_log and os.path.exists(a.access_log):
        statuses, upstreams = parse_access_log(a.access_log, a.log_offset, uri)
        status_source = "nginx access log"
    if not statuses and a.tool == "wrk" and m.get("statuses"):
        statuses, status_source = m["statuses"], "wrk Lua counters"
    by_status, by_error = cluster_deltas(before, after)
    if not statuses:
        # /stats counts every request, our own GET /stats and POST /admin too:
        # the 2xx come from ab itself, the error statuses from /stats.
        statuses = {k: v for k, v in by_status.items() if not k.startswith("2")}
        statuses["200"] = max(0, m["requests"] - m.get("non2xx", 0) - m.get("failed", 0))
        status_source = "200s from ab, others from /stats cluster counters"

    # Instances: name them with /stats (port -> instance id).
    port_name = {}
    for name, inst in stats_instances(after).items():
        if inst.get("port"):
            port_name[str(inst["port"])] = name
    if upstreams:
        inst = []
        for addr, n in sorted(upstreams.items()):
            name = port_name.get(addr.rsplit(":", 1)[-1], "")
            inst.append((f"{name} ({addr})" if name else addr, n))
        instance_source = "nginx $upstream_addr"
    else:
        inst = sorted(per_instance_totals(before, after).items())
        instance_source = "/stats per-instance counters"

    checks, facts, inv_source = [], None, ""
    # Every 200 is an order and every order got its 200 -- except answers whose
    # outcome nobody learnt: 499 (the client left), 502/504 (the instance may
    # have committed before it failed or was too slow).
    ok_responses = unknown = None
    if status_source == "nginx access log":
        ok_responses = statuses.get("200", 0)
        unknown = sum(statuses.get(k, 0) for k in ("499", "502", "504"))
    ids = None
    if a.ids and os.path.exists(a.ids):
        ids = check_invariants.read_ids(a.ids)
    if a.dsn:
        try:
            facts_list, checks = check_invariants.check(
                a.dsn, [a.voucher], ids=ids, expect_orders=a.expect_orders,
                ok_responses=ok_responses, unknown_responses=unknown)
            facts = facts_list[0]
            inv_source = "Postgres"
        except check_invariants.CheckError as e:
            print(f"report: checking in Postgres failed: {e}", file=sys.stderr)
            checks = [(False, f"could not check in Postgres: {e}")]
    if facts is None:
        v = voucher_from_stats(after, a.voucher) or {}
        facts = dict(v)
        inv_source = inv_source or "/stats (no PG_DSN: not checked in Postgres)"
        if v:
            checks += [(v.get("oversold", 1) == 0, f"oversold {v.get('oversold')} (from /stats)"),
                       (v.get("duplicateUsers", 1) == 0,
                        f"duplicate users {v.get('duplicateUsers')} (from /stats)"),
                       (v.get("stockDrift", 1) == 0, f"stock drift {v.get('stockDrift')} (from /stats)")]
            if a.expect_orders is not None:
                checks.append((v.get("orders") == a.expect_orders,
                               f"exactly {a.expect_orders} order(s) (found {v.get('orders')}, /stats)"))
        else:
            checks.append((False, f"voucher {a.voucher} is missing from /stats"))
    if a.tool == "wrk" and m.get("okWithoutOrderId"):
        checks.append((False, f"{m['okWithoutOrderId']} answers with 200 carried no orderId"))
    if a.expect_both_instances and len([n for _x, n in inst if n > 0]) < a.expect_both_instances:
        checks.append((False, f"fewer than {a.expect_both_instances} instances served requests: {inst}"))

    span = facts.get("orderSpanSeconds")
    orders = facts.get("orders")
    res = {
        "scenario": a.scenario, "what": a.what, "url": a.url, "voucherId": a.voucher,
        "requests": m["requests"], "seconds": m["seconds"], "rps": m["rps"],
        "p50": m["p50"], "p99": m["p99"], "errors": m["errors"],
        "statuses": statuses, "statusSource": status_source, "errorCodes": by_error,
        "instances": inst, "instanceSource": instance_source,
        "voucher": facts, "invariantSource": inv_source,
        "ordersPerSecond": (orders / span) if (orders and span and span > 0 and orders > 1) else None,
        "checks": checks, "ok": all(ok for ok, _m in checks),
    }
    print_block(res)
    if a.json_out:
        with open(a.json_out, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1)
    return 0 if res["ok"] else 1


def cmd_summary(paths):
    results = []
    for p in paths:
        r = load_json(p)
        if r is None:
            print(f"report: no result in {p}", file=sys.stderr)
            return 2
        results.append(r)
    summary_table(results)
    return 0 if all(r["ok"] for r in results) else 1


def cmd_cluster():
    """Prints the strategies and every instance's counters of a /stats answer (stdin)."""
    try:
        s = json.load(sys.stdin)
    except ValueError:
        print("   (no /stats answer)")
        return 2
    print(f"   strategies  lock {s.get('lockStrategy', '?')}, stock {s.get('stockStrategy', '?')}")
    for i in sorted(s.get("instances", []) or [], key=lambda i: i.get("instance", "")):
        r, lk = i.get("requests", {}) or {}, i.get("lock", {}) or {}
        by = ", ".join(f"{k}: {v}" for k, v in sorted((r.get("byStatus") or {}).items()))
        print(f"   {i.get('instance', '?'):<12} requests {r.get('total', 0)} ({by})")
        print(f"   {'':<12} lock acquired {lk.get('acquired', 0)}, contended {lk.get('contended', 0)},"
              f" released {lk.get('released', 0)}, released by a non-owner"
              f" {lk.get('notOwnerReleases', 0)}, errors {lk.get('errors', 0)}")
    return 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "summary":
        return cmd_summary(argv[1:])
    if argv and argv[0] == "cluster":
        return cmd_cluster()
    ap = argparse.ArgumentParser(description="Report one load-test run (see the module doc).")
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--what", default="")
    ap.add_argument("--url", required=True)
    ap.add_argument("--tool", choices=("ab", "wrk"), required=True)
    ap.add_argument("--tool-output", required=True)
    ap.add_argument("--wrk-summary")
    ap.add_argument("--voucher", type=int, required=True)
    ap.add_argument("--stats-before")
    ap.add_argument("--stats-after")
    ap.add_argument("--access-log")
    ap.add_argument("--log-offset", type=int, default=0)
    ap.add_argument("--ids")
    ap.add_argument("--expect-orders", type=int)
    ap.add_argument("--expect-both-instances", type=int, default=0,
                    help="fail unless at least this many instances served requests")
    ap.add_argument("--dsn", default=os.environ.get("PG_DSN", ""))
    ap.add_argument("--json-out")
    a = ap.parse_args(argv)
    try:
        return cmd_run(a)
    except (OSError, ValueError, KeyError, check_invariants.CheckError) as e:
        print(f"report: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
