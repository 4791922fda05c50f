"""Charts and pages: gnuplot() and bar_chart_head() for the PNG charts of
the benchmarks; the HTML reports' one writer: html_page() (a whole page with
a verdict), verdict(), svg_chart() (inline SVG, no external resources) and
timeline_html() (a timeline's charts and table)."""

import math
import os
import shutil
import subprocess

from .figures import fmt_ms
from .proc import write_atomic


def bar_chart_head(png, width, height, bars):
    """The opening lines of a gnuplot script that draws 'bars' bars (at x =
    0 .. bars-1) into 'png': the charts of make bench and make bench-lock."""
    return (f"""set terminal pngcairo size {width},{height} font "DejaVu Sans,10"
set output '{png}'
set style fill solid 0.85 border -1
set grid ytics
set xrange [-0.6:{bars - 0.4}]
""")


def gnuplot(script, png, log):
    """Runs gnuplot on the file 'script', which draws 'png'. Returns png, or
    None when gnuplot is missing or failed (said through log)."""
    gp = shutil.which("gnuplot")
    if gp is None:
        log("gnuplot not found (apt-get install gnuplot-nox): no chart")
        return None
    p = subprocess.run([gp, script], capture_output=True, text=True, timeout=60)
    if p.returncode != 0 or not os.path.exists(png):
        log(f"gnuplot failed: {p.stderr.strip()}")
        return None
    return png


# ---------------------------------------------------------------- HTML

def esc(v):
    """v as HTML text."""
    return (str(v).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def nice_step(span, ticks=4):
    """A round step (1, 2 or 5 times a power of ten) that cuts span into
    about ticks parts."""
    if span <= 0:
        return 1
    raw = span / ticks
    p = 10 ** math.floor(math.log10(raw))
    f = raw / p
    return (1 if f <= 1 else 2 if f <= 2 else 5 if f <= 5 else 10) * p


class _Frame:
    """An SVG chart's geometry: the plot area inside the padding, n slots
    along x, values 0..ymax along y."""
    pad_l, pad_r, pad_t, pad_b = 52, 12, 30, 40

    def __init__(self, width, height, n, ymax):
        self.width, self.height, self.n, self.ymax = width, height, n, ymax
        self.pw = width - self.pad_l - self.pad_r
        self.ph = height - self.pad_t - self.pad_b

    def y(self, v):
        return self.pad_t + self.ph - (v / self.ymax) * self.ph

    def x(self, i, offset=0.5):
        return self.pad_l + (i + offset) * self.pw / self.n


def svg_chart(title, xs, series, kind="line", unit="", width=560, height=230,
              xlabel="second of the run"):
    """A small SVG chart: series = [(name, color, [value or None per x])];
    kind 'line' draws lines, 'bars' stacks the series as bars per x."""
    if kind == "bars":
        top = max([sum((s[2][i] or 0) for s in series) for i in range(len(xs))] or [0])
    else:
        top = max([v for s in series for v in s[2] if v is not None] or [0])
    step = nice_step(top or 1)
    f = _Frame(width, height, max(1, len(xs)), step * max(1, -(-top // step)) if top else step * 4)
    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
           f'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{esc(title)}">',
           f'<text x="{f.pad_l}" y="16" class="t">{esc(title)}</text>']
    out += _svg_axes(f, step, unit, xs)
    out += _svg_bars(f, xs, series) if kind == "bars" else _svg_lines(f, series)
    out += _svg_legend(f, series)
    out.append(f'<text x="{f.pad_l + f.pw / 2:.0f}" y="{height - 1}" class="xl">{esc(xlabel)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _svg_axes(f, step, unit, xs):
    """The grid lines with their values, the unit, the x labels."""
    out = []
    v = 0
    while v <= f.ymax + 1e-9:
        yy = f.y(v)
        out.append(f'<line x1="{f.pad_l}" x2="{f.width - f.pad_r}" y1="{yy:.1f}" y2="{yy:.1f}" class="{"axis" if v == 0 else "grid"}"/>')
        label = f"{v:g}"
        out.append(f'<text x="{f.pad_l - 6}" y="{yy + 4:.1f}" class="yl">{label}</text>')
        v += step
    mid = f.pad_t + f.ph / 2
    out.append(f'<text x="12" y="{mid:.0f}" class="yl" transform="rotate(-90 12 {mid:.0f})" text-anchor="middle">{esc(unit)}</text>')
    xstep = max(1, int(round(nice_step(f.n, max(2, f.pw // 60)))))
    for i, xv in enumerate(xs):
        if i % xstep == 0:
            out.append(f'<text x="{f.x(i):.1f}" y="{f.height - 22}" class="xl">{xv}</text>')
    return out


def _svg_bars(f, xs, series):
    """The series stacked as bars, one stack per x."""
    out = []
    bw = max(1.0, f.pw / f.n * 0.8)
    for i in range(len(xs)):
        base = 0
        xx = f.x(i, 0.1)
        for name, color, vals in series:
            val = vals[i] or 0
            if val <= 0:
                continue
            out.append(f'<rect x="{xx:.1f}" y="{f.y(base + val):.1f}" width="{bw:.1f}" '
                       f'height="{f.y(base) - f.y(base + val):.1f}" fill="{color}"><title>{xs[i]}s {name}: {val}</title></rect>')
            base += val
    return out


def _svg_lines(f, series):
    """Each series as lines (broken where a value is None), with points
    where they are few."""
    out = []
    for name, color, vals in series:
        pts, seg = [], []
        for i, val in enumerate(vals):
            if val is None:
                if seg:
                    pts.append(seg)
                seg = []
                continue
            seg.append(f"{f.x(i):.1f},{f.y(val):.1f}")
        if seg:
            pts.append(seg)
        for sg in pts:
            if len(sg) > 1:
                out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" '
                           f'stroke-linejoin="round" points="{" ".join(sg)}"/>')
            if len(sg) == 1 or f.n <= 40:
                for pt in sg:
                    cx, cy = pt.split(",")
                    out.append(f'<circle cx="{cx}" cy="{cy}" r="3" fill="{color}"/>')
    return out


def _svg_legend(f, series):
    """The series' names and colors, right-aligned at the top."""
    out = []
    lx = f.width - f.pad_r
    for name, color, _vals in reversed(series):
        lx -= 24 + 7 * len(name)
        out.append(f'<rect x="{lx}" y="7" width="10" height="10" rx="2" fill="{color}"/>'
                   f'<text x="{lx + 14}" y="16" class="lg">{esc(name)}</text>')
    return out


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


def verdict(ok, text):
    """A green (ok) or red badge with text (HTML)."""
    return f"<span class=\"verdict {'ok' if ok else 'bad'}\">{text}</span>"


def html_page(title, ok, verdict_text, meta, body):
    """A whole page: the title with a verdict badge, meta (HTML) on the line
    below it, then the fragments of body (HTML) in <main>, one a line."""
    h = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{esc(title)}</title>",
         f"<style>{HTML_STYLE}</style></head><body>",
         f"<header><h1>{esc(title)} {verdict(ok, verdict_text)}</h1>",
         f"<p>{meta}</p></header><main>"]
    return "\n".join(h + list(body) + ["</main></body></html>"]) + "\n"


def write_html(path, title, ok, verdict_text, meta, body):
    """html_page() written to path (write_atomic)."""
    write_atomic(path, html_page(title, ok, verdict_text, meta, body))
