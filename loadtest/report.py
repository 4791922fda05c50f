#!/usr/bin/env python3
"""Turns one load-test run into a short table and checks its invariants.

Used by loadtest/ab_sale.sh, wrk_sale.sh and ab_storm.sh (see them for the
arguments); also 'report.py summary RESULT.json ...' prints one row per run,
'curl .../stats | report.py cluster' the counters of every instance, and
'report.py html -o FILE RESULT.json ...' writes an HTML report (inline SVG
charts, no external resources): latency percentiles and answers per second
over each run, from the nginx access log, beside the summary and invariants.

Sources, best first:
  status counts  the nginx access log (when local) with the sold-out edge's
                 answers, which nginx counts instead of logging (GET
                 /stats/edge, after minus before), wrk's Lua counters, or
                 ab's 2xx count and the cluster counters of /stats (after minus
                 before) for the other statuses
  instances      the nginx access log ($upstream_addr; the edge's answers:
                 nginx-edge), or /stats per instance
  latency        ab's or wrk's own percentiles
  orders, stock  Postgres via loadtest/check_invariants.py (with PG_DSN), or /stats
Exit status: 0 all invariants hold, 1 a violation, 2 an error.
Python 3 standard library only.
"""

import argparse
import json
import os
import sys
import time

sys.dont_write_bytecode = True          # no __pycache__ in loadtest/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_invariants  # noqa: E402
import kit  # noqa: E402
from kit import esc, timeline_from_entries  # noqa: E402


# ---------------------------------------------------------------- inputs

def tool_figures(tool, text, wrk_summary=None):
    """requests, seconds, rps, p50Ms, p99Ms, errors (transport failures) and,
    for wrk, statuses and order ids: kit's parse of ab's report or of wrk's."""
    if tool == "ab":
        m = kit.parse_ab(text)
        m["errors"] = m["failed"]           # with -l only transport failures fail
        return m
    return kit.parse_wrk(wrk_summary, text)


def count_access(entries):
    """({status: n}, {upstream: n}) of access-log entries (kit.access_log)."""
    statuses, upstreams = {}, {}
    for e in entries:
        statuses[e.status] = statuses.get(e.status, 0) + 1
        upstreams[e.upstream] = upstreams.get(e.upstream, 0) + 1
    return statuses, upstreams


def edge_total(edge):
    """The answers of nginx's sold-out edge in a GET /stats/edge body (0
    for none)."""
    return int(((edge or {}).get("requests") or {}).get("total") or 0)


def answered_by(upstreams, stats):
    """[(who, requests)] from count_access's {upstream: n}: each instance
    named with /stats (port -> instance id) as "name (address)", its address
    when /stats does not know it, and the answers nginx gave itself (no
    upstream) as kit.NGINX_EDGE, last."""
    port_name = {}
    for name, inst in stats_instances(stats).items():
        if inst.get("port"):
            port_name[str(inst["port"])] = name
    out, edge = [], 0
    for addr, n in sorted(upstreams.items()):
        if kit.answered_by(addr) == kit.NGINX_EDGE:
            edge += n
            continue
        name = port_name.get(addr.rsplit(":", 1)[-1], "")
        out.append((f"{name} ({addr})" if name else addr, n))
    return out + ([(kit.NGINX_EDGE, edge)] if edge else [])


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


def redis_first_drain(url, voucher, timeout=60.0):
    """(drained, agree): polls /stats of the service behind 'url' until the
    orders stream is empty and nothing is pending, then reads the voucher's
    reconciliation."""
    base = url.split("/voucher/")[0]
    deadline = time.monotonic() + timeout
    while True:
        try:
            st = kit.call(base, "GET", "/stats", timeout=10).body
        except kit.KitError:
            st = {}
        rf = (st or {}).get("redisFirst") or {}
        if rf.get("backlog") == 0 and rf.get("pending") == 0:
            v = voucher_from_stats(st, voucher) or {}
            if (v.get("redis") or {}).get("agree") and rf.get("deadLetters") == 0:
                return True, True
        if time.monotonic() > deadline:
            return rf.get("backlog") == 0 and rf.get("pending") == 0, False
        time.sleep(0.2)


def voucher_from_stats(stats, voucher):
    for v in (stats or {}).get("vouchers", []) or []:
        if str(v.get("voucherId")) == str(voucher):
            return v
    return None


# ---------------------------------------------------------------- output

fmt_ms = kit.fmt_ms


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


SUMMARY_COLS = [kit.Col(t, a, w) for t, w, a in (
    ("scenario", 10, "l"), ("requests", 8, "r"), ("req/s", 7, "r"), ("p50ms", 6, "r"),
    ("p99ms", 6, "r"), ("200", 6, "r"), ("409", 6, "r"), ("other", 5, "r"),
    ("orders", 6, "r"), ("orders/s", 8, "r"), ("stock", 6, "r"), ("oversold", 8, "r"),
    ("dupUsers", 8, "r"), ("drift", 5, "r"), ("check", 5, "l"), ("per instance", 0, "l"))]


def summary_table(results):
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
    return kit.table(SUMMARY_COLS, rows)


# ---------------------------------------------------------------- main

def cmd_run(a):
    with open(a.tool_output, encoding="utf-8", errors="replace") as f:
        text = f.read()
    m = tool_figures(a.tool, text, a.wrk_summary)
    before, after = load_json(a.stats_before), load_json(a.stats_after)
    uri = f"/voucher/{a.voucher}/seckill"

    statuses, upstreams, status_source, timeline = {}, {}, "", []
    if a.access_log and os.path.exists(a.access_log):
        entries = kit.access_log(a.access_log, a.log_offset, uri)[1]
        statuses, upstreams = count_access(entries)
        # The sold-out edge's answers (409 sold_out, no upstream) are counted
        # by nginx, not logged.
        edge = edge_total(load_json(a.edge_after)) - edge_total(load_json(a.edge_before))
        if edge > 0:
            statuses["409"] = statuses.get("409", 0) + edge
            upstreams["-"] = upstreams.get("-", 0) + edge
        status_source = "nginx access log" + (" and /stats/edge" if edge > 0 else "")
        timeline = timeline_from_entries(entries)
    if not statuses and a.tool == "wrk" and m.get("statuses"):
        statuses, status_source = m["statuses"], "wrk Lua counters"
    by_status, by_error = cluster_deltas(before, after)
    if not statuses:
        # /stats counts every request, our own GET /stats and POST /admin too:
        # the 2xx come from ab itself, the error statuses from /stats.
        statuses = {k: v for k, v in by_status.items() if not k.startswith("2")}
        statuses["200"] = max(0, m["requests"] - m.get("non2xx", 0) - m.get("failed", 0))
        status_source = "200s from ab, others from /stats cluster counters"

    if upstreams:
        inst = answered_by(upstreams, after)
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
    # Redis-first (SECKILL_STOCK=redis): the orders reach Postgres after
    # their 200s, so the checks wait for the stream to drain, and Redis and
    # Postgres must then agree (the reconciliation in /stats).
    rf_checks = []
    if isinstance(after, dict) and "redisFirst" in after:
        drained, agree = redis_first_drain(a.url, a.voucher)
        rf_checks.append((drained, "the orders stream drained into Postgres"
                                   + ("" if drained else " (not within 60 s)")))
        rf_checks.append((agree, "Redis and Postgres agree (stock, buyers; no dead letters)"))
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
        except kit.KitError as e:
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
    checks += rf_checks
    if a.tool == "wrk" and m.get("okWithoutOrderId"):
        checks.append((False, f"{m['okWithoutOrderId']} answers with 200 carried no orderId"))
    served = [x for x, n in inst if n > 0 and x != kit.NGINX_EDGE]
    if a.expect_both_instances and len(served) < a.expect_both_instances:
        checks.append((False, f"fewer than {a.expect_both_instances} instances served requests: {inst}"))

    span = facts.get("orderSpanSeconds")
    orders = facts.get("orders")
    res = {
        "scenario": a.scenario, "what": a.what, "url": a.url, "voucherId": a.voucher,
        "requests": m["requests"], "seconds": m["seconds"], "rps": m["rps"],
        "p50": m["p50Ms"], "p99": m["p99Ms"], "errors": m["errors"],
        "statuses": statuses, "statusSource": status_source, "errorCodes": by_error,
        "instances": inst, "instanceSource": instance_source,
        "voucher": facts, "invariantSource": inv_source,
        "ordersPerSecond": (orders / span) if (orders and span and span > 0 and orders > 1) else None,
        "checks": checks, "ok": all(ok for ok, _m in checks),
        "timeline": timeline,
    }
    print_block(res)
    if a.json_out:
        with open(a.json_out, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1)
    return 0 if res["ok"] else 1


def load_results(paths):
    """The results of report.py runs (--json-out files); None (said on
    stderr) when one is missing or empty."""
    results = []
    for p in paths:
        r = load_json(p)
        if r is None:
            print(f"report: no result in {p}", file=sys.stderr)
            return None
        results.append(r)
    return results


def cmd_summary(paths):
    results = load_results(paths)
    if results is None:
        return 2
    print(summary_table(results))
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


# ---------------------------------------------------------------- HTML report

def html_report(results, out_path, title="seckill load test"):
    """The HTML report of some runs (kit.html_page): the summary and the
    invariants, then each run's timeline."""
    import datetime
    all_ok = all(r["ok"] for r in results)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    target = esc(results[0]['url'].split('/voucher/')[0]) if results else ''
    meta = f"{esc(when)} · {len(results)} run(s) · target {target}"
    body = (html_summary(results) + [x for r in results for x in html_run(r)])
    kit.write_html(out_path, title, all_ok,
                   "every invariant holds" if all_ok else "INVARIANT VIOLATED", meta, body)


def html_summary(results):
    """The summary card: the terminal table, then each run's invariants."""
    h = ["<div class=card><h2>Summary</h2><div class=muted>The terminal table: client-side latency (ab/wrk), "
         "answers from nginx's access log, invariants read in Postgres after each run.</div>",
         f"<pre>{esc(summary_table(results))}\n</pre>"]
    cols = ["orders", "stock", "initialStock", "oversold", "duplicateUsers", "stockDrift"]
    heads = ["orders", "stock", "initial stock", "oversold", "duplicate users", "stock drift"]
    h.append("<table><tr><th>run</th><th>voucher</th>" + "".join(f"<th>{c}</th>" for c in heads) +
             "<th>200s</th><th>check</th></tr>")
    for r in results:
        v = r.get("voucher") or {}
        cells = []
        for c in cols:
            val = v.get(c, "?")
            cls = ""
            if c in ("oversold", "duplicateUsers", "stockDrift"):
                cls = "ok" if val == 0 else "bad"
            cells.append(f"<td class='{cls}'>{esc(val)}</td>")
        h.append(f"<tr><td>{esc(r['scenario'])}</td><td>{esc(r['voucherId'])}</td>{''.join(cells)}"
                 f"<td>{esc(r['statuses'].get('200', 0))}</td>"
                 f"<td class='{'ok' if r['ok'] else 'bad'}'>{'OK' if r['ok'] else 'FAIL'}</td></tr>")
    h.append("</table></div>")
    return h


def html_run(r):
    """One run's card: its figures, failed checks and timeline."""
    tl = r.get("timeline") or []
    h = [f"<div class=card><h2>{esc(r['scenario'])} {kit.verdict(r['ok'], 'OK' if r['ok'] else 'VIOLATED')}"
         f"</h2><div class=muted>{esc(r['what'])} · "
         f"{r['requests']} requests in {r['seconds']:.2f} s = {r['rps']:.0f} req/s · client p50 "
         f"{fmt_ms(r['p50'])} ms, p99 {fmt_ms(r['p99'])} ms · voucher {esc(r['voucherId'])}</div>"]
    fails = [m for ok, m in r.get("checks", []) if not ok]
    if fails:
        h.append("<ul class=fails>" + "".join(f"<li>{esc(m)}</li>" for m in fails) + "</ul>")
    if tl:
        h.extend(kit.timeline_html(tl))
    else:
        h.append("<p class=muted>No per-second figures: the nginx access log was not readable "
                 "(NGINX_ACCESS_LOG), so only the totals above are known.</p>")
    h.append("</div>")
    return h


def cmd_html(argv):
    ap = argparse.ArgumentParser(prog="report.py html", description="Write the HTML report of some runs.")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--title", default="seckill load test")
    ap.add_argument("results", nargs="+")
    a = ap.parse_args(argv)
    results = load_results(a.results)
    if results is None:
        return 2
    html_report(results, a.out, a.title)
    return 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "summary":
        return cmd_summary(argv[1:])
    if argv and argv[0] == "html":
        return cmd_html(argv[1:])
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
    ap.add_argument("--edge-before")
    ap.add_argument("--edge-after")
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
    except (OSError, ValueError, KeyError, kit.KitError) as e:
        print(f"report: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
