"""make bench's results from its rounds: the figures (medians of the
rounds), their ranges, the ratios (each pair measured in the same round),
RSS per instance, the speed targets; the CPU and thread switches per order or
request."""

import statistics

import kit
from kit import dig, median_of, spread_of

from .settings import BATCH_TARGETS, HALF, TARGETS

# A load's figures: name suffix, and where in the load's record. RATE: a
# rate of requests and its latencies; SALE: a sale's orders and wrk's.
RATE = [("Rps", "rps"), ("P50Ms", "p50Ms"), ("P99Ms", "p99Ms")]
SALE = [("OrdersPerSec", "ordersPerSec"), ("P50Ms", "wrk p50Ms"), ("P99Ms", "wrk p99Ms")]


def load_figures(name, where, kinds):
    """(name + suffix, where + path) of each of kinds: a load's figures."""
    return [(name + suffix, f"{where} {p}") for suffix, p in kinds]


# The figures: name, and where a round keeps it.
FIGURES = [
    ("pgOneRowTps", "pgOneRow tps"), ("pgTxnTps", "pgTxn tps"),
    ("redisEvalshaOps", "redisEvalsha opsPerSec"),
    *load_figures("nginx", "nginx", RATE),
    *load_figures("sale", "sale", SALE),
    *load_figures("soldOut", "soldOut", RATE),
    *load_figures("nginxPaced", "nginx paced", RATE),
    *load_figures("soldOutPaced", "soldOut pacedHalf", RATE),
    ("soldOutSeckillCpuPct", "soldOut seckillCpuPct"),
    ("soldOutInstanceRequests", "soldOut instanceSoldOut"),
    ("soldOutEdgeHits", "soldOut edgeHits"), ("soldOutLogged", "soldOut logged"),
    *load_figures("soldOutNoEdge", "soldOutNoEdge", RATE),
    ("soldOutNoEdgeSeckillCpuPct", "soldOutNoEdge seckillCpuPct"),
    ("soldOutNoEdgeCpuUsPerAnswer", "soldOutNoEdge seckillCpuUsPerAnswer"),
    *load_figures("nginxBare", "nginxBare", RATE),
    *load_figures("nginxBarePaced", "nginxBare pacedHalf", RATE),
    *load_figures("nginxProc", "nginxProc", RATE),
    *load_figures("nginxProcPaced", "nginxProc paced", RATE[1:]),      # latencies only
    ("nginxPacedStealPct", "nginx paced stealPct"), ("nginxProcPacedStealPct", "nginxProc paced stealPct"),
    ("soldOutPacedStealPct", "soldOut pacedHalf stealPct"),
    ("nginxBarePacedStealPct", "nginxBare pacedHalf stealPct"),
    ("stormRps", "storm rps"),
    *load_figures("saleLow", "saleLow", SALE),
    ("saleLowIdlePct", "saleLow cpu idlePct"), ("saleIdlePct", "sale cpu idlePct"),
    *load_figures("redis", "redisSale", SALE),
    ("redisDrainSeconds", "redisSale drainSeconds"), ("redisLandedPerSec", "redisSale landedPerSec"),
    *load_figures("redisWait", "redisWaitSale", SALE),
    ("redisWaitDrainSeconds", "redisWaitSale drainSeconds"),
]
# Each batched sale's figures: name after "batched<c>", and where in its record.
BATCHED_FIGURES = SALE + [("IdlePct", "cpu idlePct"), ("BuyersPerBatch", "buyersPerBatch")]
# The figures whose range over the rounds is kept too.
RANGES = [("pgOneRowTps", "pgOneRow tps"), ("pgTxnTps", "pgTxn tps"),
          ("redisEvalshaOps", "redisEvalsha opsPerSec"), ("nginxRps", "nginx rps"),
          ("nginxProcRps", "nginxProc rps"), ("nginxBareRps", "nginxBare rps"),
          ("soldOutNoEdgeRps", "soldOutNoEdge rps"),
          ("saleOrdersPerSec", "sale ordersPerSec"), ("soldOutRps", "soldOut rps"),
          ("soldOutP99Ms", "soldOut p99Ms"), ("stormRps", "storm rps"),
          ("redisOrdersPerSec", "redisSale ordersPerSec"),
          ("redisWaitOrdersPerSec", "redisWaitSale ordersPerSec")]
# The ratios: name, numerator, denominator (paths in a round).
RATIOS = [
    ("optimisticVsOneRow", "sale ordersPerSec", "pgOneRow tps"),
    ("optimisticVsTxn", "sale ordersPerSec", "pgTxn tps"),
    ("soldOutVsNginx", "soldOut rps", "nginx rps"),
    ("soldOutVsBare", "soldOut rps", "nginxBare rps"),
    ("soldOutNoEdgeVsBare", "soldOutNoEdge rps", "nginxBare rps"),
    ("soldOutVsNoEdge", "soldOut rps", "soldOutNoEdge rps"),
    ("soldOutVsNginxProc", "soldOut rps", "nginxProc rps"),
    ("nginxProcVsNginx", "nginxProc rps", "nginx rps"),
    ("stormVsRedis", "storm rps", "redisEvalsha opsPerSec"),
    ("redisVsOneRow", "redisSale ordersPerSec", "pgOneRow tps"),
    # The sold-out crowd through the same instances (nginx's edge off):
    # what the HTTP path alone costs per request.
    ("redisVsSoldOut", "redisSale ordersPerSec", "soldOutNoEdge rps"),
    # The batched sale at the redis-first sale's concurrency, where one ran
    # ("{sale}": BENCH_SALE_CONNECTIONS).
    ("redisVsBatched", "redisSale ordersPerSec", "batchedSale{sale} ordersPerSec"),
    # Acknowledged by a replica's WAIT against by the master's fsync.
    ("redisWaitVsOneRow", "redisWaitSale ordersPerSec", "pgOneRow tps"),
    ("redisWaitVsAof", "redisWaitSale ordersPerSec", "redisSale ordersPerSec"),
]
RSS_KEYS = ("rssBefore", "rssAfter", "batchedRssBefore", "batchedRssAfter")
# The targets on figures and ratios other than the batched sales': name,
# where its value is ("f": figures, "r": ratios) and under which name, the
# comparison, the target (TARGETS' name) and the label.
TARGET_ROWS = [
    ("soldOutVsNginx", "r", "soldOutVsNginx", ">=", "soldOutVsNginx",
     "sold-out req/s / nginx-to-upstream req/s"),
    ("soldOutP99Ms", "f", "soldOutP99Ms", "<", "soldOutP99Ms",
     "sold-out p99 (ms), at the saturated rate"),
    ("soldOutPacedP99Ms", "f", "soldOutPacedP99Ms", "<", "soldOutP99Ms",
     f"sold-out p99 (ms), paced to {HALF:.0%} of its saturated rate"),
    ("soldOutVsBare", "r", "soldOutVsBare", ">=", "soldOutVsBare",
     "sold-out req/s (nginx's sold-out edge) / nginx bare return 200 req/s"),
    ("soldOutSeckillCpuPct", "f", "soldOutSeckillCpuPct", "<=", "soldOutSeckillCpuPct",
     "the instances' CPU during the sold-out crowd (% of one CPU)"),
    ("soldOutNoEdgeCpuUsPerAnswer", "f", "soldOutNoEdgeCpuUsPerAnswer", "<=", "soldOutNoEdgeCpuUsPerAnswer",
     "the instances' CPU per sold-out answer (us), without the edge"),
    ("redisVsOneRow", "r", "redisVsOneRow", ">=", "redisVsOneRow",
     "sale orders/s acknowledged (redis-first) / pgbench one-row tps"),
    ("redisVsSoldOut", "r", "redisVsSoldOut", ">=", "redisVsSoldOut",
     "sale orders/s (redis-first) / sold-out req/s through the instances"),
]
# The batched sales' targets: BATCH_TARGETS' name, where the value is (its
# name after "batched<c>"), the comparison, the label ({c}: the connections).
BATCH_TARGET_ROWS = [
    ("vsOneRow", "r", "VsOneRow", ">=", "sale orders/s (batched, {c} c) / pgbench one-row tps"),
    ("vsOptimistic", "r", "VsOptimistic", ">=",
     "sale orders/s (batched, {c} c) / sale orders/s (optimistic, {c} c)"),
    ("idlePct", "f", "IdlePct", "<", "idle share of the machine (%) during the batched sale at {c} c"),
    ("p99Ms", "f", "P99Ms", "<=", "p99 (ms) of the batched sale at {c} c"),
]


def path(text):
    return text.split()


def ratio_median(rounds, a, b):
    """The median over the rounds of a / b (paths in a round), each pair
    measured minutes apart at most; None when no round has both."""
    v = []
    for r in rounds:
        x, y = dig(r, path(a)), dig(r, path(b))
        if x is not None and y:
            v.append(x / y)
    return statistics.median(v) if v else None


def rss_median(sets):
    """RSS (MB) per instance: the median over the rounds (or runs)."""
    sets = [x for x in sets if x]
    if not sets:
        return None
    return [statistics.median(x[i]["rssKb"] for x in sets if len(x) > i) / 1024.0
            for i in range(max(len(x) for x in sets))]


def target(name, value, op, limit, label):
    """A target's record, or None without a value."""
    if value is None:
        return None
    ok = value >= limit if op == ">=" else value < limit if op == "<" else value <= limit
    return {"name": name, "label": label, "value": round(value, 3), "op": op,
            "target": limit, "pass": ok}


class Summary:
    """The results (a mixin of Bench)."""

    def summarize(self):
        """(figures, ranges, ratios, RSS, targets) of the rounds."""
        f = self.figures()
        ratios = self.ratios()
        rss = self.rss_sets(f)
        return f, self.ranges(), ratios, rss, self.targets(f, ratios, rss)

    def figures(self):
        """The medians of the rounds (the long sale's are added by rss_sets)."""
        f = {name: median_of(self.rounds, path(p)) for name, p in FIGURES}
        for c in self.batch_conns:
            for name, p in BATCHED_FIGURES:
                f[f"batched{c}{name}"] = median_of(self.rounds, [f"batchedSale{c}"] + path(p))
        return f

    def ranges(self):
        """[min, max] over the rounds of the main figures."""
        out = {name: spread_of(self.rounds, path(p)) for name, p in RANGES}
        for c in self.batch_conns:
            out[f"batched{c}OrdersPerSec"] = spread_of(self.rounds, [f"batchedSale{c}", "ordersPerSec"])
        return out

    def ratios(self):
        """The ratios' medians over the rounds."""
        out = {name: ratio_median(self.rounds, a, b.replace("{sale}", str(self.sale_conns)))
               for name, a, b in RATIOS}
        for c in self.batch_conns:
            out[f"batched{c}VsOneRow"] = ratio_median(self.rounds, f"batchedSale{c} ordersPerSec",
                                                      "pgOneRow tps")
            # Against the optimistic sale at the same concurrency, where one ran.
            same = "sale" if c == self.sale_conns else "saleLow" if c == self.low_conns else None
            out[f"batched{c}VsOptimistic"] = ratio_median(
                self.rounds, f"batchedSale{c} ordersPerSec", f"{same} ordersPerSec") if same else None
        return out

    def rss_sets(self, f):
        """RSS per instance (MB) at each moment measured; the long sale's
        figures go into f."""
        out = {}
        for key in RSS_KEYS:
            v = rss_median([r.get(key) for r in self.rounds])
            if v:
                out[key] = v
        longs = [x for x in self.longs if x]
        if longs:
            out["longBefore"] = rss_median([x.get("rssBefore") for x in longs])
            out["longAfter"] = rss_median([x.get("rssAfter") for x in longs])
            f["longOrdersPerSec"] = statistics.median(x["ordersPerSec"] for x in longs)
            f["longP50Ms"] = statistics.median(x["wrk"]["p50Ms"] for x in longs)
            f["longP99Ms"] = statistics.median(x["wrk"]["p99Ms"] for x in longs)
        return out

    def targets(self, f, ratios, rss):
        """The speed targets' records, in the table's order."""
        out = [target("optimisticVsOneRow", ratios["optimisticVsOneRow"], ">=",
                      TARGETS["optimisticVsOneRow"], "sale orders/s (optimistic) / pgbench one-row tps")]
        for c in self.batch_conns:
            t = BATCH_TARGETS.get(c, {})
            for key, where, name, op, label in BATCH_TARGET_ROWS:
                if key in t:
                    value = (ratios if where == "r" else f)[f"batched{c}{name}"]
                    out.append(target(f"batched{c}{name}", value, op, t[key], label.format(c=c)))
        for name, where, key, op, limit, label in TARGET_ROWS:
            out.append(target(name, (ratios if where == "r" else f)[key], op, TARGETS[limit], label))
        out.append(target("redisP99Ms", f["redisP99Ms"], "<", TARGETS["redisP99Ms"],
                          f"redis-first buyer p99 (ms) at {self.sale_conns} connections"))
        key = "longAfter" if "longAfter" in rss else "rssAfter" if "rssAfter" in rss else None
        if key:
            out.append(target("rssMb", max(rss[key]), "<=", TARGETS["rssMb"],
                              "RSS per instance (MB), largest, after the " +
                              (f"{self.long_seconds} s sale" if key == "longAfter" else "short runs")))
        return [t for t in out if t is not None]

    def cpu_units(self):
        """(key in a round, label with its concurrency, the unit counted)."""
        pg = self.pg_clients
        return ([("pgOneRow", f"pgbench one-row, {pg} c (per txn)", "transactions"),
                 ("pgTxn", f"pgbench seckill txn, {pg} c (per txn)", "transactions"),
                 ("nginx", "nginx ceiling, 64 c (per request)", "requests"),
                 ("nginxProc", "nginx to 2 upstream200, 64 c (per request)", "requests"),
                 ("nginxBare", "nginx bare return 200, 64 c (per request)", "requests"),
                 ("sale", f"sale, optimistic, {self.sale_conns} c (per order)", "orders"),
                 ("saleLow", f"sale, optimistic, {self.low_conns} c (per order)", "orders")]
                + [(f"batchedSale{c}", f"sale, batched, {c} c (per order)", "orders") for c in self.batch_conns]
                + [("redisSale", f"sale, redis-first, {self.sale_conns} c, to the drain (per order)", "orders"),
                   ("redisWaitSale", f"sale, redis-first, WAIT, {self.sale_conns} c, to the drain (per order)",
                    "orders"),
                   ("soldOut", "sold-out, the edge, 64 c (per request)", "requests"),
                   ("soldOutNoEdge", "sold-out, --edge off, 64 c (per request)", "requests"),
                   ("storm", "storm, 64 c (per request)", "requests")])

    def cpu_per_unit(self):
        """[(label, {component: median ms of CPU per order or request})]: where the CPU went."""
        out = []
        for key, label, per in self.cpu_units():
            vals = []
            for r in self.rounds:
                x = r.get(key)
                if not x or not x.get("cpu") or not x.get(per):
                    continue
                vals.append({k: 1000.0 * v / x[per] for k, v in x["cpu"].items()
                             if k not in ("wallSeconds", "busyPct", "stealPct", "idlePct", "switches")}
                            | {"busyPct": x["cpu"].get("busyPct") or 0, "stealPct": x["cpu"].get("stealPct") or 0}
                            | ({"idlePct": x["cpu"]["idlePct"]} if x["cpu"].get("idlePct") is not None else {}))
            if vals:
                out.append((label, {k: statistics.median(v[k] for v in vals if k in v) for k in vals[0]}))
        return out

    def idle_per_sale(self):
        """[(label, {"idlePct", "looks", "byCause"})]: the medians of the
        rounds, for the sales whose idle share was sampled."""
        out = []
        for key, label, per in self.cpu_units():
            got = [r[key] for r in self.rounds
                   if r.get(key) and (r[key].get("idle") or {}).get("samples")]
            if not got:
                continue
            idle = [x["cpu"]["idlePct"] for x in got if x.get("cpu", {}).get("idlePct") is not None]
            out.append((label.replace(" (per order)", ""), {
                "idlePct": statistics.median(idle) if idle else None,
                "looks": statistics.median(x["idle"]["samples"] for x in got),
                "byCause": {c: statistics.median(x["idle"]["byCause"].get(c, 0) for x in got)
                            for c in kit.IDLE_CAUSES}}))
        return out

    def switches_per_unit(self):
        """[(label, {component: (sleeps, preemptions) per order or request})]:
        medians of the rounds, for the runs whose processes were measured."""
        out = []
        for key, label, per in self.cpu_units():
            vals = []
            for r in self.rounds:
                x = r.get(key) or {}
                sw = (x.get("cpu") or {}).get("switches")
                if sw and x.get(per):
                    vals.append({k: (v["sleeps"] / x[per], v["preempted"] / x[per]) for k, v in sw.items()})
            if vals:
                out.append((label, {k: tuple(statistics.median(v[k][i] for v in vals if k in v) for i in (0, 1))
                                    for k in vals[0]}))
        return out
