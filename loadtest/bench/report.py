"""make bench's table: the ceilings beside the reference machine's, the
service's figures with their ratios and targets, the CPU and the thread
switches per unit, the verdicts."""

import os

import kit
from kit import Col, fmt_count

from .settings import BATCH_TARGETS, REFERENCE, ROOT, STEAL_WARN_PCT


class Rows:
    """The service table's rows: row() a figure beside what it is compared
    with (its ratio, target and verdict), note() a line of its own."""

    def __init__(self, targets):
        self.verdict = {t["name"]: "PASS" if t["pass"] else "MISS" for t in targets}
        self.rows = []

    def row(self, label, v, vs_label="", vs=None, ratio=None, tgt="", res=""):
        self.rows.append([label, v if isinstance(v, str) else fmt_count(v), vs_label,
                          fmt_count(vs) if vs_label and vs is not None else "",
                          f"{ratio:.2f}" if ratio is not None else "", tgt, self.verdict.get(res, "")])

    def note(self, text):
        self.rows.append(text)


class Report:
    """The table (a mixin of Bench)."""

    # The table's columns: label, measured (ceilings: unit, reference figure;
    # service: compared with, its figure, ratio, target, result). Fixed widths,
    # a longer cell pushing the rest of its line, as format specs do.
    CEIL_COLS = [Col("ceilings, on the same Postgres, Redis and nginx", "l", 54, fit=False),
                 Col("measured", "r", 11, 1, False), Col("", "l", 6, 2, False),
                 Col("reference, 2-core VM", "r", 21, 1, False)]
    SERVICE_COLS = [Col("the service through nginx, 2 instances", "l", 54, fit=False),
                    Col("measured", "r", 11, 1, False), Col("compared with", "l", 20, 2, False),
                    Col("", "r", 7, 1, False), Col("ratio", "r", 5, 1, False),
                    Col("target", "l", 8, 2, False), Col("result", "l", 0, 1)]
    CPU_COLS = [Col("CPU ms per unit, by process (2 CPUs in all)", "l", 52, fit=False)] + [
        Col(t, "r", w, 1, False) for t, w in (("seckill", 7), ("nginx", 6), ("postgres", 8), ("redis", 6),
                                              ("client", 6), ("softirq", 7), ("others", 6), ("busy", 5),
                                              ("steal", 5), ("idle", 5))]
    IDLE_COLS = [Col("where a sale's idle share goes, % of the machine", "l", 52, fit=False),
                 Col("idle", "r", 5, 1, False), Col("looks", "r", 5, 1, False)] + [
        Col(t, "r", w, 1, False) for t, w in (("WAL flush", 9), ("sync rep", 8), ("Redis fsync", 11),
                                              ("disk", 5), ("window", 6), ("row lock", 8), ("round trips", 11))]
    SWITCH_COLS = [Col("thread switches per unit: sleeps / preemptions", "l", 52, fit=False)] + [
        Col(t, "r", 11, 1, False) for t in ("seckill", "nginx", "postgres", "redis")]

    def report(self):
        """Prints the table of the rounds; their results go into self.res."""
        f, ranges, ratios, rss, targets = self.summarize()
        t = Rows(targets)
        for section in (self.optimistic_rows, self.low_rows, self.batched_rows, self.redis_rows,
                        self.redis_wait_rows, self.long_rows, self.sold_out_rows, self.storm_rows):
            section(t, f, ratios)
        self.rss_rows(t, rss)
        out = self.table_head(f, t.rows) + self.cpu_lines() + self.idle_lines() + self.switch_lines() + self.verdict_lines(targets)
        print("\n".join(out), flush=True)
        self.res.update({
            "figures": f, "ranges": ranges if len(self.rounds) > 1 else None, "ratios": ratios,
            "rssMb": rss, "targets": targets,
        })

    def ceiling_rows(self, f):
        """The ceilings' table: [label, measured, unit, reference]."""
        ceilings = [["pgbench one-row UPDATE ... stock > 0, autocommit, 16 c", f["pgOneRowTps"], "tps", REFERENCE["pgOneRow"]],
                    ["pgbench BEGIN; SELECT; UPDATE; INSERT; COMMIT, 16 c", f["pgTxnTps"], "tps", REFERENCE["pgTxn"]],
                    ["redis-benchmark EVALSHA lock_acquire.lua, 50 c", f["redisEvalshaOps"], "ops/s", REFERENCE["redisEvalsha"]],
                    ["wrk > nginx > keep-alive upstream return 200, 64 c", f["nginxRps"], "req/s", REFERENCE["nginx"]]]
        if f["nginxProcRps"] is not None:
            ceilings.append(["  the same to 2 upstream200 processes (no work)", f["nginxProcRps"], "req/s", None])
        if f["nginxBareRps"] is not None:
            ceilings.append(["wrk > nginx return 200 (bare), 64 c", f["nginxBareRps"], "req/s", None])
        return ceilings

    def optimistic_rows(self, t, f, ratios):
        """The optimistic sale at BENCH_SALE_CONNECTIONS."""
        if f["saleOrdersPerSec"] is not None:
            t.row(f"sale orders/s, optimistic, {self.sale_conns} c", f["saleOrdersPerSec"], "pgbench one-row",
                  f["pgOneRowTps"], ratios["optimisticVsOneRow"], ">= 0.9", "optimisticVsOneRow")
            t.row("", "", "pgbench seckill txn", f["pgTxnTps"], ratios["optimisticVsTxn"])
            t.row("  buyer latency p50 / p99 ms", f"{f['saleP50Ms']:.1f} / {f['saleP99Ms']:.0f}")
            if f["saleIdlePct"] is not None:
                t.row("  idle share of the machine %", f"{f['saleIdlePct']:.0f}")

    def low_rows(self, t, f, ratios):
        """The optimistic sale at BENCH_LOW_CONNECTIONS."""
        if f["saleLowOrdersPerSec"] is not None:
            t.row(f"sale orders/s, optimistic, {self.low_conns} c", f["saleLowOrdersPerSec"], "pgbench one-row",
                  f["pgOneRowTps"], f["saleLowOrdersPerSec"] / f["pgOneRowTps"] if f["pgOneRowTps"] else None)
            t.row("  buyer latency p50 / p99 ms", f"{f['saleLowP50Ms']:.1f} / {f['saleLowP99Ms']:.0f}")
            if f["saleLowIdlePct"] is not None:
                t.row("  idle share of the machine %", f"{f['saleLowIdlePct']:.0f}")

    def batched_rows(self, t, f, ratios):
        """The batched sale at each concurrency, with its targets."""
        for c in self.batch_conns:
            if f[f"batched{c}OrdersPerSec"] is None:
                continue
            tg = BATCH_TARGETS.get(c, {})
            t.row(f"sale orders/s, batched, {c} c, THREADS={self.batch_threads}",
                  f[f"batched{c}OrdersPerSec"], "pgbench one-row", f["pgOneRowTps"],
                  ratios[f"batched{c}VsOneRow"], f">= {tg['vsOneRow']:g}" if "vsOneRow" in tg else "",
                  f"batched{c}VsOneRow")
            opt = f["saleOrdersPerSec"] if c == self.sale_conns else \
                f["saleLowOrdersPerSec"] if c == self.low_conns else None
            if opt is not None:
                t.row("", "", f"optimistic, {c} c", opt, ratios[f"batched{c}VsOptimistic"],
                      f">= {tg['vsOptimistic']:g}" if "vsOptimistic" in tg else "", f"batched{c}VsOptimistic")
            t.row("  buyer latency p50 / p99 ms", f"{f[f'batched{c}P50Ms']:.1f} / {f[f'batched{c}P99Ms']:.0f}",
                  "", None, None, f"p99 <= {tg['p99Ms']:g}" if "p99Ms" in tg else "", f"batched{c}P99Ms")
            if f[f"batched{c}IdlePct"] is not None:
                t.row("  idle share of the machine %", f"{f[f'batched{c}IdlePct']:.0f}", "", None, None,
                      f"< {tg['idlePct']:g}" if "idlePct" in tg else "", f"batched{c}IdlePct")
            if f[f"batched{c}BuyersPerBatch"] is not None:
                t.row("  buyers per group commit", f"{f[f'batched{c}BuyersPerBatch']:.1f}")

    def redis_rows(self, t, f, ratios):
        """The redis-first sale (AOF always)."""
        if f["redisOrdersPerSec"] is not None:
            t.row(f"sale orders/s, redis-first, {self.sale_conns} c, THREADS={self.redis_threads}", f["redisOrdersPerSec"],
                  "pgbench one-row", f["pgOneRowTps"], ratios["redisVsOneRow"], ">= 3", "redisVsOneRow")
            if f["soldOutNoEdgeRps"] is not None:
                t.row("", "", "sold-out, edge off", f["soldOutNoEdgeRps"], ratios["redisVsSoldOut"],
                      ">= 0.4", "redisVsSoldOut")
            if f.get(f"batched{self.sale_conns}OrdersPerSec") is not None:
                t.row("", "", f"batched, {self.sale_conns} c", f[f"batched{self.sale_conns}OrdersPerSec"],
                      ratios["redisVsBatched"])
            t.row("  buyer latency p50 / p99 ms", f"{f['redisP50Ms']:.1f} / {f['redisP99Ms']:.1f}",
                  "", None, None, "p99 < 10", "redisP99Ms")
            t.row("  last order in Postgres, s after the load", f"{f['redisDrainSeconds']:.2f}")
            t.row("  rows landed per second (consumers)", f["redisLandedPerSec"])

    def redis_wait_rows(self, t, f, ratios):
        """The redis-first sale acknowledged by WAIT."""
        if f["redisWaitOrdersPerSec"] is not None:
            t.row(f"sale orders/s, redis-first, WAIT 1 replica (no AOF), {self.sale_conns} c",
                  f["redisWaitOrdersPerSec"], "pgbench one-row", f["pgOneRowTps"], ratios["redisWaitVsOneRow"])
            if f["redisOrdersPerSec"] is not None:
                t.row("", "", "redis-first, AOF always", f["redisOrdersPerSec"], ratios["redisWaitVsAof"])
            t.row("  buyer latency p50 / p99 ms", f"{f['redisWaitP50Ms']:.1f} / {f['redisWaitP99Ms']:.1f}")
            t.row("  last order in Postgres, s after the load", f"{f['redisWaitDrainSeconds']:.2f}")

    def long_rows(self, t, f, ratios):
        """The long sale."""
        if f.get("longOrdersPerSec") is not None:
            t.row(f"sale orders/s, optimistic, {self.long_seconds} s at {self.long_conns} c", f["longOrdersPerSec"],
                  "pgbench one-row", f["pgOneRowTps"],
                  f["longOrdersPerSec"] / f["pgOneRowTps"] if f["pgOneRowTps"] else None)
            t.row("  buyer latency p50 / p99 ms", f"{f['longP50Ms']:.1f} / {f['longP99Ms']:.0f}")

    def sold_out_rows(self, t, f, ratios):
        """The sold-out crowd: nginx's edge against the ceilings, paced, the
        instances' share, then without the edge."""
        if f["soldOutRps"] is not None:
            bare = f["nginxBareRps"] is not None
            if bare:
                t.row("sold-out req/s, 64 c (nginx's sold-out edge)", f["soldOutRps"], "nginx bare", f["nginxBareRps"],
                      ratios["soldOutVsBare"], ">= 0.8", "soldOutVsBare")
                t.row("", "", "nginx ceiling", f["nginxRps"], ratios["soldOutVsNginx"])
            else:
                t.row("sold-out req/s, 64 c (nginx's sold-out edge)", f["soldOutRps"], "nginx ceiling", f["nginxRps"],
                      ratios["soldOutVsNginx"])
            if f["nginxProcRps"] is not None:
                t.row("", "", "2 upstream200 procs", f["nginxProcRps"], ratios["soldOutVsNginxProc"])
            t.row("  sold-out p50 / p99 ms", f"{f['soldOutP50Ms']:.2f} / {f['soldOutP99Ms']:.2f}",
                  f"bare {f['nginxBareP50Ms']:.2f} / {f['nginxBareP99Ms']:.2f}" if bare else "", None, None,
                  "p99 < 2", "soldOutP99Ms")
            self.sold_out_paced_rows(t, f)
            self.sold_out_cpu_rows(t, f)
            self.no_edge_rows(t, f, ratios, bare)

    def sold_out_paced_rows(self, t, f):
        """The sold-out crowd paced to half its rate, beside nginx bare's."""
        if f["soldOutPacedP99Ms"] is not None:
            t.row(f"  paced to half, {f['soldOutPacedRps']:,.0f} req/s: p50 / p99 ms",
                  f"{f['soldOutPacedP50Ms']:.2f} / {f['soldOutPacedP99Ms']:.2f}",
                  f"bare {f['nginxBarePacedP50Ms']:.2f} / {f['nginxBarePacedP99Ms']:.2f}"
                  if f["nginxBarePacedP99Ms"] is not None else "", None, None, "p99 < 2",
                  "soldOutPacedP99Ms")
            steal = [(n, f[k]) for n, k in (("sold-out", "soldOutPacedStealPct"),
                                            ("bare", "nginxBarePacedStealPct")) if f[k] is not None]
            if steal:
                t.note("  steal while paced: " + ", ".join(f"{n} {x:.1f} %" for n, x in steal)
                       + " (the hypervisor's share; the paced p99s rise with it)")

    def sold_out_cpu_rows(self, t, f):
        """The instances' CPU during the sold-out crowd, and who answered."""
        if f["soldOutSeckillCpuPct"] is not None:
            t.row("  the instances' CPU meanwhile, % of one CPU", f"{f['soldOutSeckillCpuPct']:.2f}",
                  "", None, None, "<= 5", "soldOutSeckillCpuPct")
            if f["soldOutEdgeHits"] is not None:
                t.note(f"  nginx answered {f['soldOutEdgeHits']:,.0f} of {f['soldOutLogged']:,.0f} requests"
                       f" itself; the instances answered {f['soldOutInstanceRequests']:,.0f}"
                       " (their own sold_out counters)")

    def no_edge_rows(self, t, f, ratios, bare):
        """The sold-out crowd through nginx with --edge off."""
        if f["soldOutNoEdgeRps"] is not None:
            t.row("  without the edge (nginx --edge off), 64 c", f["soldOutNoEdgeRps"], "nginx bare" if bare else "",
                  f["nginxBareRps"], ratios["soldOutNoEdgeVsBare"])
            t.row("    p50 / p99 ms; the instances' CPU, % of one",
                  f"{f['soldOutNoEdgeP50Ms']:.2f} / {f['soldOutNoEdgeP99Ms']:.2f}; "
                  f"{f['soldOutNoEdgeSeckillCpuPct']:.0f}")
            if f["soldOutNoEdgeCpuUsPerAnswer"] is not None:
                t.row("    the instances' CPU per sold-out answer, us", f"{f['soldOutNoEdgeCpuUsPerAnswer']:.1f}",
                      "", None, None, "<= 20", "soldOutNoEdgeCpuUsPerAnswer")

    def storm_rows(self, t, f, ratios):
        """The single-user storm."""
        if f["stormRps"] is not None:
            t.row("single-user storm req/s, ab -k, 64 c", f["stormRps"], "redis EVALSHA", f["redisEvalshaOps"],
                  ratios["stormVsRedis"])

    def rss_rows(self, t, rss):
        """RSS per instance at each moment measured; the target on the last."""
        labels = {"rssBefore": "RSS MB per instance: at start",
                  "rssAfter": "  after the short runs",
                  "longBefore": f"  before the {self.long_seconds} s sale",
                  "longAfter": f"  after the {self.long_seconds} s sale at {self.long_conns} c",
                  "batchedRssBefore": "  batched: at start",
                  "batchedRssAfter": "  batched: after its sale"}
        judged = "longAfter" if "longAfter" in rss else "rssAfter"
        for k, label in labels.items():
            if rss.get(k):
                vals = " / ".join(f"{x:.1f}" for x in rss[k])
                if k == judged:
                    t.row(label, vals, "", None, None, "<= 20", "rssMb")
                else:
                    t.row(label, vals)

    def table_head(self, f, rows):
        """The title, the machine, the ceilings' table and the service's."""
        m = self.res.get("machine", {})
        ver = m.get("versions", {})
        n = len(self.rounds)
        med = (f", medians of {self.runs} runs ({n} rounds)" if self.runs > 1
               else f", medians of {n} rounds" if n > 1 else "")
        ceilings = self.ceiling_rows(f)
        return ["", f"== make bench{med}",
               f"   {m.get('nproc')} CPUs ({m.get('cpu')}), {m.get('memTotalMb')} MB, kernel {m.get('kernel')};"
               f" Postgres {(ver.get('postgres') or '?').split()[0]} (fsync {m.get('postgres', {}).get('fsync')},"
               f" synchronous_commit {m.get('postgres', {}).get('synchronous_commit')}),"
               f" Redis {ver.get('redis')}, nginx {ver.get('nginx')}, seckill {ver.get('seckill')}",
               "", kit.table(self.CEIL_COLS, [[r[0], fmt_count(r[1]), r[2], fmt_count(r[3])] for r in ceilings]),
               "", kit.table(self.SERVICE_COLS, rows)]

    def cpu_lines(self):
        """The table of CPU per unit by process (and the runs the hypervisor
        disturbed)."""
        out = []
        cpu = self.cpu_per_unit()
        if cpu:
            out += ["", kit.table(self.CPU_COLS, [
                ["  " + label, f"{v.get('seckill', 0) + v.get('standIn', 0):.3f}",
                 f"{v.get('nginx', 0) + v.get('ceilingNginx', 0):.3f}"]
                + [f"{v.get(k, 0):.3f}" for k in ("postgres", "redis", "loadTool", "interrupts", "other")]
                + [f"{v.get('busyPct', 0):.0f}%", f"{v.get('stealPct', 0):.1f}%", f"{v['idlePct']:.0f}%" if "idlePct" in v else "-"]
                for label, v in cpu])]
            out.append("  (a process's column includes the interrupt work (loopback TCP) done while it ran; softirq:"
                       " the rest, done on an idle CPU; others: programs outside this benchmark, i.e. noise;"
                       " busy: share of both CPUs in use; steal: share the hypervisor took; idle: share no one"
                       " used; seckill: upstream200 in its row)")
            stolen = [f"{label.split(' (')[0]} {v['stealPct']:.1f} %" for label, v in cpu
                      if v.get("stealPct", 0) > STEAL_WARN_PCT]
            if stolen:
                out.append(f"  disturbed: the hypervisor took more than {STEAL_WARN_PCT} % of the machine during "
                           + ", ".join(stolen) + ": those figures read low; a ratio to a disturbed ceiling reads high")
        return out

    def idle_lines(self):
        """The table of each sale's idle share by what its free CPUs waited
        on (kit.IdleSampler; medians of the rounds), and what would turn
        the largest share into orders."""
        rows, advice = [], []
        for label, v in self.idle_per_sale():
            by = v["byCause"]
            rows.append(["  " + label, f"{v['idlePct']:.1f}" if v.get("idlePct") is not None else "-",
                         f"{v['looks']:.0f}"] + [f"{by.get(c, 0):.1f}" for c in kit.IDLE_CAUSES])
            top = kit.idle_dominant(by)
            if top:
                advice.append(f"  {label}: {by[top]:.1f} of its {v['idlePct'] or 0:.1f} % waits on"
                              f" {kit.IDLE_LABEL[top]}: {kit.IDLE_REMEDY[top]}")
        if not rows:
            return []
        return (["", kit.table(self.IDLE_COLS, rows),
                 "  (idle: /proc/stat's share no one used, split in the proportions of what held at"
                 f" the looks at a free CPU (looks: how many; at least {self.idle_ms} ms apart, the looking thread under"
                 " SCHED_IDLE), each free CPU charged to the first wait that held then, in the"
                 " columns' order: a Postgres process on the WAL's write or flush, a commit waiting for"
                 " a standby, Redis's main thread in its fsync (state D), any other thread on the disk,"
                 " an instance's batch leader in its gathering window,"
                 " a transaction holding the voucher row; round trips: none of these, every request"
                 " between processes (kit/idle.py))", "  what would turn it into orders:"] + advice)

    def switch_lines(self):
        """The table of thread switches per unit by process."""
        out = []
        sw = self.switches_per_unit()
        if sw:
            def pair(v, *keys):
                got = [v[k] for k in keys if k in v]
                if not got:
                    return "-"
                return f"{sum(g[0] for g in got):.2f} / {sum(g[1] for g in got):.2f}"
            out += ["", kit.table(self.SWITCH_COLS, [
                ["  " + label, pair(v, "seckill", "standIn"), pair(v, "nginx", "ceilingNginx"),
                 pair(v, "postgres"), pair(v, "redis")] for label, v in sw])]
            out.append("  (from /proc/<pid>/task/*/status of the threads that lived through the run: a sleep is a"
                       " thread that blocked and was woken, a preemption one the scheduler switched out; each"
                       " costs the kernel a switch, and on a VM often an interrupt between the CPUs)")
        return out

    def verdict_lines(self, targets):
        """The invariants' and the targets' verdicts, and where the results are."""
        out = []
        out.append("")
        if self.violations:
            out.append(f"INVARIANTS: VIOLATED in {len(self.violations)} run(s) (see the FAIL lines above)")
        else:
            out.append(f"invariants: hold after all {len(self.invariant_runs)} service runs (loadtest/check_invariants.py)")
        misses = [t["name"] for t in targets if not t["pass"]]
        out.append(f"speed targets: {len(targets) - len(misses)} PASS, {len(misses)} MISS"
                   + (f" ({', '.join(misses)})" if misses else ""))
        out.append(f"results: {os.path.relpath(self.json_path, ROOT) if self.json_path.startswith(ROOT) else self.json_path}")
        return out
