#!/usr/bin/env python3
"""Turns one load-test run into a short table and checks its invariants.

Used by loadtest/ab_sale.sh, wrk_sale.sh and ab_storm.sh (see them for the
arguments); also 'report.py summary RESULT.json ...' prints one row per run,
'curl .../stats | report.py cluster' the counters of every instance, and
'report.py html -o FILE RESULT.json ...' writes an HTML report (inline SVG
charts, no external resources): latency percentiles and answers per second
over each run, from the nginx access log, beside the summary and invariants.

Sources, best first:
  status counts  the nginx access log (when local), wrk's Lua counters, or
                 ab's 2xx count and the cluster counters of /stats (after minus
                 before) for the other statuses
  instances      the nginx access log ($upstream_addr; nginx's own answers,
                 without one: nginx-edge), or /stats per instance
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


def _timeline(per, first, last, when):
    """The timeline's points from buckets {i: {"lat": [ms], "statuses": {}}}:
    when(i) gives a point's "second" (and "epoch")."""
    out = []
    for i in range(first, last + 1):
        b = per.get(i, {"lat": [], "statuses": {}})
        lat = b["lat"]
        out.append({**when(i), "requests": sum(b["statuses"].values()), "statuses": b["statuses"],
                    "p50": kit.percentile(lat, 50), "p90": kit.percentile(lat, 90),
                    "p99": kit.percentile(lat, 99), "max": max(lat) if lat else None})
    return out


def _add(per, key, status, ms):
    b = per.setdefault(key, {"lat": [], "statuses": {}})
    b["statuses"][status] = b["statuses"].get(status, 0) + 1
    if ms is not None:
        b["lat"].append(ms)


def timeline_from_entries(entries):
    """Per second of the run (nginx's $time_iso8601, when each answer was
    sent): answers by status and latency percentiles ($request_time, ms)."""
    from datetime import datetime
    per = {}
    for e in entries:
        try:
            t = int(datetime.fromisoformat(e.time).timestamp())
        except ValueError:
            continue
        _add(per, t, e.status, e.seconds * 1000.0)
    if not per:
        return []
    t0 = min(per)
    return _timeline(per, t0, max(per), lambda t: {"second": t - t0, "epoch": t})


def parse_timeline(path, offset, uri):
    """timeline_from_entries() of uri's requests in an access log after offset."""
    return timeline_from_entries(kit.access_log(path, offset, uri)[1])


def timeline_from_samples(samples, bucket=1.0):
    """The same figures as parse_timeline, from a client's own per-request
    samples [(start seconds from the run's start, status, ms)], in buckets of
    `bucket` seconds (by request start); status 0 (no answer) counts as "error"."""
    per = {}
    for start, status, ms in samples:
        _add(per, int(start // bucket), str(status) if status else "error",
             float(ms) if status else None)
    if not per:
        return []
    return _timeline(per, min(per), max(per), lambda i: {"second": round(i * bucket, 3)})


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
        status_source = "nginx access log"
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

def _esc(v):
    return (str(v).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def _nice_step(span, ticks=4):
    import math
    if span <= 0:
        return 1
    raw = span / ticks
    p = 10 ** math.floor(math.log10(raw))
    f = raw / p
    return (1 if f <= 1 else 2 if f <= 2 else 5 if f <= 5 else 10) * p


def svg_chart(title, xs, series, kind="line", unit="", width=560, height=230,
              xlabel="second of the run"):
    """A small SVG chart: series = [(name, color, [value or None per x])];
    kind 'line' draws lines, 'bars' stacks the series as bars per x."""
    pad_l, pad_r, pad_t, pad_b = 52, 12, 30, 40
    pw, ph = width - pad_l - pad_r, height - pad_t - pad_b
    n = max(1, len(xs))
    if kind == "bars":
        top = max([sum((s[2][i] or 0) for s in series) for i in range(len(xs))] or [0])
    else:
        top = max([v for s in series for v in s[2] if v is not None] or [0])
    step = _nice_step(top or 1)
    ymax = step * max(1, -(-top // step)) if top else step * 4
    y = lambda v: pad_t + ph - (v / ymax) * ph  # noqa: E731
    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
           f'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{_esc(title)}">',
           f'<text x="{pad_l}" y="16" class="t">{_esc(title)}</text>']
    v = 0
    while v <= ymax + 1e-9:
        yy = y(v)
        out.append(f'<line x1="{pad_l}" x2="{width - pad_r}" y1="{yy:.1f}" y2="{yy:.1f}" class="{"axis" if v == 0 else "grid"}"/>')
        label = f"{v:g}"
        out.append(f'<text x="{pad_l - 6}" y="{yy + 4:.1f}" class="yl">{label}</text>')
        v += step
    out.append(f'<text x="12" y="{pad_t + ph / 2:.0f}" class="yl" transform="rotate(-90 12 {pad_t + ph / 2:.0f})" text-anchor="middle">{_esc(unit)}</text>')
    xstep = max(1, int(round(_nice_step(n, max(2, pw // 60)))))
    for i, xv in enumerate(xs):
        if i % xstep == 0:
            xx = pad_l + (i + 0.5) * pw / n
            out.append(f'<text x="{xx:.1f}" y="{height - 22}" class="xl">{xv}</text>')
    if kind == "bars":
        bw = max(1.0, pw / n * 0.8)
        for i in range(len(xs)):
            base = 0
            xx = pad_l + (i + 0.1) * pw / n
            for name, color, vals in series:
                val = vals[i] or 0
                if val <= 0:
                    continue
                out.append(f'<rect x="{xx:.1f}" y="{y(base + val):.1f}" width="{bw:.1f}" '
                           f'height="{y(base) - y(base + val):.1f}" fill="{color}"><title>{xs[i]}s {name}: {val}</title></rect>')
                base += val
    else:
        for name, color, vals in series:
            pts, seg = [], []
            for i, val in enumerate(vals):
                if val is None:
                    if seg:
                        pts.append(seg)
                    seg = []
                    continue
                seg.append(f"{pad_l + (i + 0.5) * pw / n:.1f},{y(val):.1f}")
            if seg:
                pts.append(seg)
            for sg in pts:
                if len(sg) > 1:
                    out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" '
                               f'stroke-linejoin="round" points="{" ".join(sg)}"/>')
                if len(sg) == 1 or n <= 40:
                    for pt in sg:
                        cx, cy = pt.split(",")
                        out.append(f'<circle cx="{cx}" cy="{cy}" r="3" fill="{color}"/>')
    lx = width - pad_r
    for name, color, _vals in reversed(series):
        w = 24 + 7 * len(name)
        lx -= w
        out.append(f'<rect x="{lx}" y="7" width="10" height="10" rx="2" fill="{color}"/>'
                   f'<text x="{lx + 14}" y="16" class="lg">{_esc(name)}</text>')
    out.append(f'<text x="{pad_l + pw / 2:.0f}" y="{height - 1}" class="xl">{_esc(xlabel)}</text>')
    out.append("</svg>")
    return "\n".join(out)


HTML_STYLE = """
body{font-family:system-ui,-apple-system,'Segoe UI','DejaVu Sans',sans-serif;margin:0;background:#f1f5f9;color:#0f172a;font-size:14px}
header{background:#0f172a;color:#e2e8f0;padding:16px 28px}header h1{margin:0;font-size:20px;color:#fff}
header p{margin:4px 0 0;color:#94a3b8;font-size:13px}main{max-width:1240px;margin:0 auto;padding:20px 28px}
.card{background:#fff;border:1px solid #e2e8f0;border-radius:12px;padding:16px 18px;margin-bottom:18px;box-shadow:0 1px 2px rgba(15,23,42,.06)}
h2{font-size:16px;margin:0 0 4px}.muted{color:#64748b;font-size:12.5px}
table{border-collapse:collapse;width:100%;margin-top:8px}th,td{padding:5px 8px;border-bottom:1px solid #e2e8f0;text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
th{font-size:11px;text-transform:uppercase;letter-spacing:.05em;color:#64748b}th:first-child,td:first-child{text-align:left}
td.ok{color:#166534;background:#dcfce7;font-weight:700}td.bad{color:#fff;background:#dc2626;font-weight:700}
.verdict{display:inline-block;padding:3px 12px;border-radius:999px;font-weight:700;margin-left:8px;font-size:13px}
.verdict.ok{background:#dcfce7;color:#166534}.verdict.bad{background:#dc2626;color:#fff}
.charts{display:flex;flex-wrap:wrap;gap:12px;margin-top:10px}
svg.chart{background:#fff;max-width:100%;height:auto}svg .t{font-size:13px;font-weight:600;fill:#0f172a}
svg .grid{stroke:#e2e8f0}svg .axis{stroke:#94a3b8}svg .yl{font-size:11px;fill:#64748b;text-anchor:end}
svg .xl{font-size:11px;fill:#64748b;text-anchor:middle}svg .lg{font-size:11px;fill:#334155}
ul.fails{color:#991b1b;font-weight:600}pre{background:#f8fafc;border:1px solid #e2e8f0;border-radius:8px;padding:10px;overflow:auto;font-size:12.5px}
"""


def timeline_html(tl, lat_title="latency per second (nginx $request_time)",
                  bars_title="answers per second by status", bars_unit="answers/s",
                  xlabel="second of the run"):
    """HTML fragments of a timeline (parse_timeline, timeline_from_samples):
    the latency-percentile chart, the answers-by-status chart and the table."""
    h = []
    xs = [p["second"] for p in tl]
    lat = [("p50", "#16a34a", [p["p50"] for p in tl]), ("p90", "#f59e0b", [p["p90"] for p in tl]),
           ("p99", "#dc2626", [p["p99"] for p in tl]), ("max", "#94a3b8", [p["max"] for p in tl])]
    codes = sorted({k for p in tl for k in p["statuses"]})
    colors = {"200": "#16a34a", "409": "#f59e0b"}
    bars = [(c, colors.get(c, "#dc2626" if c.startswith("5") or c == "error" else "#8b5cf6"),
             [p["statuses"].get(c, 0) for p in tl]) for c in codes]
    h.append("<div class=charts>")
    h.append(svg_chart(lat_title, xs, lat, "line", "ms", xlabel=xlabel))
    h.append(svg_chart(bars_title, xs, bars, "bars", bars_unit, xlabel=xlabel))
    h.append("</div>")
    h.append("<table><tr><th>second</th><th>answers</th><th>200</th><th>409</th><th>other</th>"
             "<th>p50 ms</th><th>p90 ms</th><th>p99 ms</th><th>max ms</th></tr>")
    for p in tl:
        st = p["statuses"]
        other = sum(n for k, n in st.items() if k not in ("200", "409"))
        h.append(f"<tr><td>{p['second']}</td><td>{p['requests']}</td><td>{st.get('200', 0)}</td>"
                 f"<td>{st.get('409', 0)}</td><td>{other}</td><td>{fmt_ms(p['p50'])}</td>"
                 f"<td>{fmt_ms(p['p90'])}</td><td>{fmt_ms(p['p99'])}</td><td>{fmt_ms(p['max'])}</td></tr>")
    h.append("</table>")
    return h


def html_report(results, out_path, title="seckill load test"):
    import datetime
    all_ok = all(r["ok"] for r in results)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    h = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{_esc(title)}</title>",
         f"<style>{HTML_STYLE}</style></head><body>",
         f"<header><h1>{_esc(title)} <span class=\"verdict {'ok' if all_ok else 'bad'}\">"
         f"{'every invariant holds' if all_ok else 'INVARIANT VIOLATED'}</span></h1>",
         f"<p>{_esc(when)} · {len(results)} run(s) · target {_esc(results[0]['url'].split('/voucher/')[0]) if results else ''}</p></header><main>",
         "<div class=card><h2>Summary</h2><div class=muted>The terminal table: client-side latency (ab/wrk), "
         "answers from nginx's access log, invariants read in Postgres after each run.</div>",
         f"<pre>{_esc(summary_table(results))}\n</pre>"]
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
            cells.append(f"<td class='{cls}'>{_esc(val)}</td>")
        h.append(f"<tr><td>{_esc(r['scenario'])}</td><td>{_esc(r['voucherId'])}</td>{''.join(cells)}"
                 f"<td>{_esc(r['statuses'].get('200', 0))}</td>"
                 f"<td class='{'ok' if r['ok'] else 'bad'}'>{'OK' if r['ok'] else 'FAIL'}</td></tr>")
    h.append("</table></div>")
    for r in results:
        tl = r.get("timeline") or []
        h.append(f"<div class=card><h2>{_esc(r['scenario'])} <span class=\"verdict {'ok' if r['ok'] else 'bad'}\">"
                 f"{'OK' if r['ok'] else 'VIOLATED'}</span></h2><div class=muted>{_esc(r['what'])} · "
                 f"{r['requests']} requests in {r['seconds']:.2f} s = {r['rps']:.0f} req/s · client p50 "
                 f"{fmt_ms(r['p50'])} ms, p99 {fmt_ms(r['p99'])} ms · voucher {_esc(r['voucherId'])}</div>")
        fails = [m for ok, m in r.get("checks", []) if not ok]
        if fails:
            h.append("<ul class=fails>" + "".join(f"<li>{_esc(m)}</li>" for m in fails) + "</ul>")
        if tl:
            h.extend(timeline_html(tl))
        else:
            h.append("<p class=muted>No per-second figures: the nginx access log was not readable "
                     "(NGINX_ACCESS_LOG), so only the totals above are known.</p>")
        h.append("</div>")
    h.append("</main></body></html>")
    kit.write_atomic(out_path, "\n".join(h) + "\n")


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
