"""make bench's sales through nginx: the sale to distinct buyers, the
sold-out crowd (nginx's edge, then without it), the single-user storm, the
long sale."""

import os
import shutil
import time

import kit

from .settings import BenchError, log

CPU_PARTS = ("seckill", "nginx", "postgres", "redis", "loadTool", "interrupts", "other")


def cpu_ms_per_order(cpu, n):
    """CPU ms per order of each component (CPU_PARTS); None without orders."""
    return {k: round(1000.0 * cpu[k] / n, 3) for k in CPU_PARTS} if n else None


def seckill_cpu_pct(cpu):
    """The instances' CPU during a run, % of one CPU."""
    wall = cpu["wallSeconds"]
    return round(100.0 * cpu["seckill"] / wall, 2) if wall else None


class Sales:
    """The sales (a mixin of Bench)."""

    def sale(self, what, conns, seconds, stock=10_000_000, warm=True, batches=False):
        """A sale to distinct users on a stock that does not run out; batches:
        also the buyers per group commit during it (SECKILL_STOCK=batched)."""
        if warm and self.warmup > 0:
            self.warm_up(what, conns)
        v = self.stack.create_voucher(stock, f"bench: {what}")
        self.quiesce()
        b0 = self.batch_counts() if batches else None
        off = self.log_offset()
        meter = self.cpu_meter()
        meter.start()
        w, idle = self.sale_wrk(f"{self.stack.base_url}/voucher/{v}/seckill", conns, seconds)
        cpu = meter.stop()
        w["nginxLogged"] = self.logged(off, v)
        b1 = self.batch_counts() if batches else None
        n, span = self.order_span(v)
        unknown = self.unknown(w, w["nginxLogged"], conns)
        w["unknownOutcome"] = unknown
        self.check(what, v, ids=w["idsFile"], ok=w["statuses"].get("200", 0), unknown=unknown)
        w.pop("idsFile", None)
        rate = (n - 1) / span if n > 1 and span > 0 else 0.0
        r = {"voucherId": v, "stock": stock, "connections": conns, "orders": n,
             "orderSpanSeconds": round(span, 3), "ordersPerSec": round(rate, 1),
             "soldOut": n >= stock, "wrk": w, "cpu": cpu, "idle": idle,
             "buyersPerBatch": round((b1[1] - b0[1]) / (b1[0] - b0[0]), 1) if b1 and b1[0] > b0[0] else None,
             "cpuMsPerOrder": cpu_ms_per_order(cpu, n)}
        if n >= stock or span < 5:
            log(f"warning: {what}: the stock lasted {span:.1f}s (< 5 s or sold out): raise the stock or BENCH_SECONDS")
        log(f"{what}: {n} orders in {span:.2f}s = {rate:.0f} orders/s (wrk {w['rps']:.0f} req/s,"
            f" p50 {w['p50Ms']} ms, p99 {w['p99Ms']} ms)")
        return r

    def sold_out(self):
        v = self.stack.create_voucher(1, "bench: sold out")
        off, edge_start = self.log_offset(), self.edge_answered()
        st = self.buy(v, 42)
        if st != 200:
            raise BenchError(f"buying the only unit of voucher {v} answered {st}")
        url = f"{self.stack.base_url}/voucher/{v}/seckill"
        w0 = self.wrk(url, 64, max(1, self.warmup))
        time.sleep(0.3)                 # the warm-up's edge answers counted
        inst0, off_run, edge0 = self.instances_sold_out(), self.log_offset(), self.edge_answered()
        meter = self.cpu_meter()
        meter.start()
        w = self.wrk(url, 64, self.seconds)
        w["cpu"] = meter.stop()
        # What reached the instances meanwhile, and what nginx answered itself.
        w["instanceSoldOut"] = self.instances_sold_out() - inst0
        w["edgeHits"], w["logged"] = self.edge_hits(off_run, v, edge0)
        w["seckillCpuPct"] = seckill_cpu_pct(w["cpu"])
        w["pacedHalfDelayMs"] = self.half_pace(w["rps"])
        p, w["pacedHalf"] = self.paced(url, w["pacedHalfDelayMs"])
        self.check_sold_out(v, off, edge_start, (w0, w, p))
        w["voucherId"] = v
        w["connections"] = 64
        w["non409"] = sum(c for k, c in w["statuses"].items() if k != "409")
        log(f"sold-out: {w['rps']:.0f} req/s, p50 {w['p50Ms']} ms, p99 {w['p99Ms']} ms; nginx answered"
            f" {w['edgeHits']} of {w['logged']}, the instances {w['instanceSoldOut']} (their CPU"
            f" {w['seckillCpuPct']} % of one); paced ({w['pacedHalfDelayMs']} ms between requests)"
            f" {p['rps']:.0f} req/s, p50 {p['p50Ms']} ms, p99 {p['p99Ms']} ms")
        return w

    def sold_out_no_edge(self, v):
        """The same sold-out voucher through a second nginx from the template
        with --edge off, in front of the same instances: every request makes
        the hop to an instance (what the edge saves)."""
        d = os.path.join(self.run_dir, "noedge-nginx")
        shutil.rmtree(d, ignore_errors=True)
        port = kit.free_ports(1)[0]
        ups = [u.split("//", 1)[-1] for u in self.stack.instance_urls]
        pid = kit.start_nginx(d, port, ups, gen_args=["--edge", "off"])
        try:
            url = f"http://127.0.0.1:{port}/voucher/{v}/seckill"
            self.wrk(url, 64, max(1, self.warmup))
            inst0 = self.instances_sold_out()
            meter = self.cpu_meter()
            meter.groups["ceilingNginx"] = [pid]
            meter.start()
            r = self.wrk(url, 64, self.seconds)
            cpu = meter.stop()
            r["instanceSoldOut"] = self.instances_sold_out() - inst0
        finally:
            kit.stop_nginx(pid, d)
        r["cpu"] = cpu
        r["seckillCpuPct"] = seckill_cpu_pct(cpu)
        # Every request of the run reached an instance: its CPU per answer.
        r["seckillCpuUsPerAnswer"] = (round(1e6 * cpu["seckill"] / r["instanceSoldOut"], 1)
                                      if r["instanceSoldOut"] else None)
        r["connections"] = 64
        bad = sum(c for k, c in r["statuses"].items() if k != "409")
        if bad:
            raise BenchError(f"sold-out without the edge: {bad} answers other than 409: {r['statuses']}")
        log(f"sold-out without the edge: {r['rps']:.0f} req/s, p50 {r['p50Ms']} ms, p99 {r['p99Ms']} ms;"
            f" the instances answered {r['instanceSoldOut']} (their CPU {r['seckillCpuPct']} % of one,"
            f" {r['seckillCpuUsPerAnswer']} us per answer)")
        return r

    def ab(self, url, n, conns, user):
        cmd = ["ab", "-k", "-l", "-r", "-s", "30", "-n", str(n), "-c", str(conns), "-m", "POST",
               "-H", f"X-User-Id: {user}", url]
        r = {"tool": " ".join(cmd), **kit.parse_ab(kit.run(cmd, 300).stdout)}
        r["ok200"] = r["requests"] - r["non2xx"] - r["failed"]
        return r

    def storm(self):
        v = self.stack.create_voucher(100, "bench: single-user storm")
        url = f"{self.stack.base_url}/voucher/{v}/seckill"
        user = 7_000_000_000 + self.user_block
        probe = self.ab(url, 2000, 64, user)
        n = int(min(max((probe["rps"] or 1000) * self.seconds, 5000), 200000))
        meter = self.cpu_meter()
        meter.start()
        r = self.ab(url, n, 64, user)
        r["cpu"] = meter.stop()
        ok = probe["ok200"] + r["ok200"]
        self.check("storm", v, ok=ok, unknown=probe["failed"] + r["failed"], expect=1)
        r["voucherId"] = v
        r["user"] = user
        r["connections"] = 64
        log(f"storm: {r['rps']:.0f} req/s, {ok} order(s)")
        return r

    def long_run(self):
        if self.strategy != "optimistic":
            self.switch("optimistic")
        log(f"long sale: {self.long_seconds}s at {self.long_conns} connections (SECKILL_STOCK=optimistic)")
        before = self.stack.rss()
        r = self.sale(f"long sale {self.long_seconds}s", self.long_conns, self.long_seconds,
                      stock=100_000_000, warm=False)
        r["rssBefore"] = before
        r["rssAfter"] = self.stack.rss()
        return r

    def warm_up(self, what, conns, drain=False):
        """The warm-up of sale what: a voucher of its own, wrk for BENCH_WARMUP
        seconds, the invariants (drain: the orders stream drained first)."""
        wv = self.stack.create_voucher(20000, f"bench: {what} warm-up")
        off = self.log_offset()
        w = self.wrk(f"{self.stack.base_url}/voucher/{wv}/seckill", conns, self.warmup, ids=True)
        if drain:
            self.drain()
        self.check(f"{what} warm-up", wv, ids=w["idsFile"], ok=w["statuses"].get("200", 0),
                   unknown=self.unknown(w, self.logged(off, wv), conns))

    def check_sold_out(self, v, off, edge0, runs):
        """The invariants of the sold-out voucher v after the wrk runs 'runs':
        the unit bought before, and not one more."""
        logged = self.logged(off, v, edge0)
        both = {"statuses": {k: sum(w["statuses"].get(k, 0) for w in runs)
                             for k in set().union(*(w["statuses"] for w in runs))},
                "socketErrors": {k: sum(w["socketErrors"][k] for w in runs)
                                 for k in runs[1]["socketErrors"]}}
        if logged is not None:
            logged["200"] = logged.get("200", 0) - 1       # the one bought before
            logged = {k: c for k, c in logged.items() if c > 0}
        self.check("sold-out", v, ok=1 + both["statuses"].get("200", 0),
                   unknown=self.unknown(both, logged, 64), expect=1)
