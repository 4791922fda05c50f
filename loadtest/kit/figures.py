"""Figures: percentile() (nearest rank), median_of() and spread_of() a list
of records, fmt_count(), fmt_ms(), table(); timelines of latency and answers
per second (from nginx's access log or a client's own samples)."""

import math
import statistics
from collections import namedtuple
from datetime import datetime

from .nginx import access_log


def percentile(values, q):
    """The q-th percentile (0 <= q <= 100) of values by the nearest-rank
    method: the smallest value with at least q % of all values at or below
    it, i.e. the ceil(q/100 * n)-th smallest (the smallest for q = 0). Always
    one of the values, never interpolated; None for no values."""
    if not values:
        return None
    v = sorted(values)
    k = max(0, min(len(v) - 1, math.ceil(q * len(v) / 100) - 1))
    return v[k]


def dig(d, path):
    """d[path[0]][path[1]]...; None where a step is missing or not a dict."""
    for p in path:
        d = d.get(p) if isinstance(d, dict) else None
    return d


def values_at(records, path):
    """The values at path (dig()) of each record that has one."""
    return [x for x in (dig(r, path) for r in records) if x is not None]


def median_of(records, path):
    """The median of values_at(records, path); None when there is none."""
    v = values_at(records, path)
    return statistics.median(v) if v else None


def spread_of(records, path):
    """[min, max] of values_at(records, path); None when there is none."""
    v = values_at(records, path)
    return [min(v), max(v)] if v else None


def fmt_count(v):
    """A count or rate, whole, with thousands separators; "-" for None."""
    if v is None:
        return "-"
    return f"{int(round(v)):,}"


def fmt_ms(v):
    """Milliseconds: whole from 10 up, one decimal below; "-" for None."""
    if v is None:
        return "-"
    return f"{v:.0f}" if abs(v) >= 10 else f"{v:.1f}"


Col = namedtuple("Col", "title align width gap fit", defaults=("l", 0, 2, True))
Col.__doc__ = """A column of table(): title; align "l" or "r"; width: at least
this many characters; gap: spaces before it (not before the first); fit: the
column is as wide as its widest cell (False: each cell is padded to width on
its own and a longer one pushes the rest of its line right, as a format spec
does)."""


def table(cols, rows, header=True):
    """Lines of text: the titles (unless header is False), then one line per
    row. A row is a list of cells (str() of each), or a str printed as it is
    (a note between the rows). Trailing blanks are cut."""
    cells = [[str(c) for c in r] for r in rows if not isinstance(r, str)]
    widths = []
    for i, c in enumerate(cols):
        w = c.width
        if c.fit:
            w = max([w, len(c.title) if header else 0] + [len(r[i]) for r in cells if i < len(r)])
        widths.append(w)

    def line(vals):
        out = []
        for i, (c, v) in enumerate(zip(cols, vals)):
            s = str(v)
            out.append((" " * c.gap if i else "")
                       + (s.rjust(widths[i]) if c.align == "r" else s.ljust(widths[i])))
        return "".join(out).rstrip()
    out = [line([c.title for c in cols])] if header else []
    for r in rows:
        out.append(r if isinstance(r, str) else line(r))
    return "\n".join(out)


# ---------------------------------------------------------------- timelines

def _timeline(per, first, last, when):
    """The timeline's points from buckets {i: {"lat": [ms], "statuses": {}}}:
    when(i) gives a point's "second" (and "epoch")."""
    out = []
    for i in range(first, last + 1):
        b = per.get(i, {"lat": [], "statuses": {}})
        lat = b["lat"]
        out.append({**when(i), "requests": sum(b["statuses"].values()), "statuses": b["statuses"],
                    "p50": percentile(lat, 50), "p90": percentile(lat, 90),
                    "p99": percentile(lat, 99), "max": max(lat) if lat else None})
    return out


def _add(per, key, status, ms):
    b = per.setdefault(key, {"lat": [], "statuses": {}})
    b["statuses"][status] = b["statuses"].get(status, 0) + 1
    if ms is not None:
        b["lat"].append(ms)


def timeline_from_entries(entries):
    """Per second of the run (nginx's $time_iso8601, when each answer was
    sent): answers by status and latency percentiles ($request_time, ms)."""
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
    return timeline_from_entries(access_log(path, offset, uri)[1])


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
