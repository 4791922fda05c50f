"""The ladder's outputs: the terminal table (ladder.txt), ladder.md,
ladder.html (kit's page writer and inline SVG charts), ladder.png (gnuplot)
and the tally of several runs."""

import json
import os

import kit

from .stack import log
from .steps import STORM_BUCKET


COLS = [kit.Col(t, a) for t, a in (
    ("#", "r"), ("step", "l"), ("lock", "l"), ("stock", "l"), ("inst", "r"),
    ("load", "l"), ("req", "r"), ("req/s", "r"), ("p99ms", "r"), ("200", "r"),
    ("orders", "r"), ("oversold", "r"), ("dupUsers", "r"), ("drift", "r"),
    ("notOwner", "r"), ("measured", "l"), ("expected", "l"), ("result", "l"))]


def table_rows(results):
    rows = []
    for r in results:
        rows.append([r["step"], r["title"], r["lock"], r["stock"], r["instances"], r["load"],
                     r["requests"], kit.fmt_ms(r["rps"]), kit.fmt_ms(r["p99ms"]), r["ok"], r["orders"],
                     r["oversold"], r["duplicateUsers"], r["stockDrift"], r["notOwnerReleases"],
                     r.get("measured", ""), r["expect"], "ok" if r["pass"] else "MISS"])
    return rows


def text_table(results):
    return kit.table(COLS, table_rows(results)) + "\n"


def md_table(results):
    head = "| " + " | ".join(c.title for c in COLS) + " |\n"
    sep = "| " + " | ".join("---:" if c.align == "r" else "---" for c in COLS) + " |\n"
    body = ""
    for row in table_rows(results):
        body += "| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |\n"
    return head + sep + body


def settings_text(r):
    env = dict(r["env"])
    env.pop("SECKILL_LOCK", None)
    env.pop("SECKILL_STOCK", None)
    return " ".join(f"{k}={v}" for k, v in env.items())


def write_markdown(path, results, meta, chart):
    with open(path, "w", encoding="utf-8") as f:
        f.write("# The demo ladder\n\n")
        f.write(f"Run {meta['date']} on {meta['host']} ({meta['cpus']} CPUs), "
                f"{'quick mode, ' if meta['quick'] else ''}stack in `{meta['runDir']}`. "
                "Orders, oversold, duplicate users and drift are read in Postgres; `200` and the "
                "instances in nginx's access log; req/s and p99 (ms) from the clients' per-request "
                "times (ab in the sales, the ladder's own client in the storms); "
                "`notOwner` is the instances' `lock.notOwnerReleases` (setnx: deletes of a lock "
                "that was no longer ours; owner and reentrant: releases refused).\n\n")
        f.write(md_table(results))
        f.write("\n")
        if chart:
            f.write(f"![oversold, duplicate orders and success rate per step]({chart})\n\n")
        f.write("## Steps\n\n")
        for r in results:
            md_step(f, r)


def md_step(f, r):
    """A step's section of ladder.md."""
    f.write(f"### {r['step']}. {r['title']} — lock `{r['lock']}`, stock `{r['stock']}`, "
            f"{r['instances']} instance(s)\n\n")
    f.write(f"- what: {r['story']}\n")
    f.write(f"- settings: `{settings_text(r)}`; load: {r['load']}, "
            f"stock {r['initialStock']}\n")
    f.write(f"- answers: {json.dumps(r['statuses'], sort_keys=True)}; 200s per instance: "
            f"{json.dumps(r['okByInstance'], sort_keys=True)}; requests per instance: "
            f"{json.dumps(r['requestsByInstance'], sort_keys=True)}\n")
    f.write(f"- Postgres: {r['orders']} orders, stock left {r['stockLeft']}, oversold "
            f"{r['oversold']}, {r['duplicateUsers']} duplicate user(s) "
            f"({r['duplicateOrders']} extra orders), drift {r['stockDrift']}\n")
    f.write(f"- lock: {r['lockAcquired']} acquired, {r['notOwnerReleases']} releases by "
            f"a non-owner, {r['renewals']} watchdog renewals\n")
    if "lost" in r:
        lo = r["lost"]
        f.write(f"- the lost lock: A (instance 1) {lo['a']} {lo['aMessage'] or ''}; B "
                f"(instance 2) {lo['b']} {lo['bMessage'] or ''}; Sentinel promoted a "
                f"replica {lo['killToPromotedS']} s after the kill; lock on the promoted "
                f"replica: {'yes' if lo['lockOnNewMaster'] else 'no'}; B sent "
                f"{lo['bSentAfterLockS']} s after A's grant; stale-token rejections "
                f"{lo['staleTokenRejections']}, grants undone {lo['unsynced']}\n")
        f.write(f"- the price (the sale before): {r['sale']['orders']} orders, "
                f"{r['sale']['ordersPerS']} orders/s, p99 {kit.fmt_ms(r['p99ms'])} ms\n")
    f.write(f"- expected: {r['expect']} — **{'reproduced' if r['pass'] else 'MISSED'}**\n")
    for c in r["checks"]:
        f.write(f"  - {'ok' if c['ok'] else 'FAIL'}: {c['text']}\n")
    f.write("\n")


def write_html(path, results, meta, table, chart):
    """ladder.html: the terminal table, then per step its invariants and its
    latency percentiles over time (kit's inline SVG charts)."""
    E = kit.esc
    all_ok = all(r["pass"] for r in results)
    body = ["<div class=card><h2>Summary</h2><div class=muted>The terminal table. Orders, oversold, "
            "duplicate users and drift read in Postgres; 200s in nginx's access log; req/s and p99 "
            "from the clients' per-request times. Red cells are broken invariants: the broken steps "
            "are expected to show them.</div>",
            f"<pre>{E(table)}</pre>"]
    if chart:
        body.append(f'<img src="{E(chart)}" alt="oversold, duplicate orders and success rate per step" '
                    'style="max-width:100%">')
    body.append("</div>")
    for r in results:
        body += html_step(r)
    meta_line = (f"{E(meta['date'])} · {E(meta['host'])} ({meta['cpus']} CPUs)"
                 f"{' · quick' if meta['quick'] else ''} · {len(results)} step(s) in {meta['seconds']} s"
                 f" · stack in {E(meta['runDir'])}")
    kit.write_html(path, "seckill demo ladder", all_ok,
                   "every step showed what it should" if all_ok else "a step MISSED its expected outcome",
                   meta_line, body)


HTML_HEADS = [("orders", "orders"), ("initialStock", "initial stock"), ("stockLeft", "stock left"),
              ("oversold", "oversold"), ("duplicateUsers", "duplicate users"),
              ("duplicateOrders", "duplicate orders"), ("stockDrift", "stock drift"),
              ("ok", "200s"), ("notOwnerReleases", "not-owner releases"), ("renewals", "renewals")]
BROKEN_WHEN_NOT_0 = ("oversold", "duplicateUsers", "duplicateOrders", "stockDrift")


def html_step(r):
    """A step's section of ladder.html: what it ran, its invariants, its
    checks, its latency over time."""
    E = kit.esc
    verdict = "reproduced" if r["pass"] else "MISSED"
    h = [f"<section class=\"card step\" id=\"step-{r['step']}\">"
         f"<h2>{r['step']}. {E(r['title'])} — lock {E(r['lock'])}, stock {E(r['stock'])}, "
         f"{r['instances']} instance(s) {kit.verdict(r['pass'], verdict)}</h2>"
         f"<div class=muted>{E(r['story'])} · settings {E(settings_text(r))} · load {E(r['load'])}, "
         f"stock {r['initialStock']} · {r['requests']} requests in {r['seconds']:.2f} s = "
         f"{r['rps']:.0f} req/s · client p50 {kit.fmt_ms(r['p50ms'])} ms, "
         f"p99 {kit.fmt_ms(r['p99ms'])} ms</div>"]
    h.append("<div style=\"overflow-x:auto\"><table class=invariants><tr>"
             + "".join(f"<th>{E(t)}</th>" for _k, t in HTML_HEADS)
             + "<th>expected</th><th>result</th></tr><tr>")
    for k, _t in HTML_HEADS:
        cls = ("ok" if r[k] == 0 else "bad") if k in BROKEN_WHEN_NOT_0 else ""
        h.append(f"<td class='{cls}'>{E(r[k])}</td>")
    h.append(f"<td>{E(r['expect'])}</td><td class='{'ok' if r['pass'] else 'bad'}'>"
             f"{verdict}</td></tr></table></div>")
    h.append("<ul class=checks>" + "".join(
        f"<li>{'ok' if c['ok'] else '<b>FAIL</b>'}: {E(c['text'])}</li>" for c in r["checks"])
        + "</ul>")
    return h + html_timeline(r) + ["</section>"]


def html_timeline(r):
    """A step's latency over time (kit.timeline_html), or why there is none."""
    tl = r.get("timeline") or []
    if not tl:
        return ["<p class=muted>No per-request times for this step.</p>"]
    fine = len(tl) > 1 and tl[1]["second"] - tl[0]["second"] < 1
    unit = f"{STORM_BUCKET:g} s" if fine else "second"
    return ([f"<div class=muted>Latency over time: {kit.esc(r.get('timelineSource', ''))}.</div>"]
            + kit.timeline_html(tl, lat_title=f"latency per {unit} (p50/p90/p99/max)",
                                bars_title=f"answers per {unit} by status",
                                bars_unit=f"answers/{'bucket' if fine else 's'}",
                                xlabel="second of the step"))


def write_chart(out_dir, results):
    """ladder.png with gnuplot; returns its file name, or None without gnuplot."""
    dat = os.path.join(out_dir, "ladder.dat")
    with open(dat, "w", encoding="utf-8") as f:
        f.write("# step label oversold duplicate_orders success_rate_percent\n")
        for r in results:
            label = f"{r['step']} {r['key']}"
            f.write(f"{r['step']} \"{label}\" {r['oversold']} {r['duplicateOrders']} "
                    f"{r['successRate']:.2f}\n")
    png = os.path.join(out_dir, "ladder.png")
    script = os.path.join(out_dir, "ladder.gp")
    with open(script, "w", encoding="utf-8") as f:
        f.write(f"""# gnuplot script of loadtest/ladder
set terminal pngcairo size 1100,900 font "DejaVu Sans,10"
set output '{png}'
set datafile separator whitespace
set style fill solid 0.85 border -1
set boxwidth 0.6
set grid ytics
set xtics rotate by -25 nomirror
set xrange [{min(r['step'] for r in results) - 0.6}:{max(r['step'] for r in results) + 0.6}]
set offsets 0, 0, graph 0.15, 0
set yrange [0:*]
set multiplot layout 3,1 title "seckill demo ladder: what each step lets through"
set title "oversold (orders beyond the stock)"
{'set yrange [0:1]' if all(r['oversold'] == 0 for r in results) else 'set yrange [0:*]'}
plot '{dat}' using 1:3:xtic(2) with boxes lc rgb "#d62728" notitle, \\
     '' using 1:3:3 with labels offset 0,0.7 notitle
set title "duplicate orders (extra orders of users who bought more than once)"
{'set yrange [0:1]' if all(r['duplicateOrders'] == 0 for r in results) else 'set yrange [0:*]'}
plot '{dat}' using 1:4:xtic(2) with boxes lc rgb "#ff7f0e" notitle, \\
     '' using 1:4:4 with labels offset 0,0.7 notitle
set title "success rate (answers 200 / requests, %)"
set yrange [0:*]
plot '{dat}' using 1:5:xtic(2) with boxes lc rgb "#2ca02c" notitle, \\
     '' using 1:5:(sprintf("%.1f", $5)) with labels offset 0,0.7 notitle
unset multiplot
""")
    return "ladder.png" if kit.gnuplot(script, png, log) else None


TALLY_COLS = [kit.Col("#", "r", 2, fit=False), kit.Col("step", "l", 24, 1),
              kit.Col("inst", "r", 4, 1, fit=False), kit.Col("reproduced")]


def tally_text(all_runs, steps):
    rows = []
    for s in steps:
        got = [run[s["key"]]["pass"] for run in all_runs if s["key"] in run]
        rows.append([s["num"], s["title"], s["instances"], f"{sum(got)}/{len(got)}"])
    return kit.table(TALLY_COLS, rows) + "\n"
