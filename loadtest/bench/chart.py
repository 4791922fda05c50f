"""make bench's chart (gnuplot): each sale's orders/s against the one-row
ceiling, and its CPU per order by process."""

import os
import shutil
import tempfile

import kit

from .settings import log


class Chart:
    """The chart (a mixin of Bench)."""

    def chart_sales(self):
        """The chart's sales: (figure key, CPU key in a round, bar label)."""
        low = [("saleLowOrdersPerSec", "saleLow", f"optimistic\\n{self.low_conns} c")] \
            if self.low_conns else []
        return (low + [("saleOrdersPerSec", "sale", f"optimistic\\n{self.sale_conns} c")]
                + [(f"batched{c}OrdersPerSec", f"batchedSale{c}", f"batched\\n{c} c")
                   for c in self.batch_conns]
                + [("redisOrdersPerSec", "redisSale", f"redis-first\\nAOF, {self.sale_conns} c"),
                   ("redisWaitOrdersPerSec", "redisWaitSale",
                    f"redis-first\\nWAIT, {self.sale_conns} c")])

    def chart(self, png, title):
        """A gnuplot chart of the sales: orders/s against the one-row ceiling
        (and three times it), and the CPU per order by process. Returns the
        path, or None (no gnuplot, or nothing to draw)."""
        f = self.summarize()[0]
        cpu = dict(self.cpu_per_unit())
        labels = {key: label for key, label, _ in self.cpu_units()}
        rows = [(name, f.get(fig), cpu.get(labels.get(key), {}))
                for fig, key, name in self.chart_sales() if f.get(fig)]
        if not rows or not f.get("pgOneRowTps"):
            return None
        tmp = tempfile.mkdtemp(prefix="bench-chart-")     # the data and script, not beside the PNG
        try:
            return self._plot(tmp, png, title, rows, f["pgOneRowTps"])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @staticmethod
    def _plot(tmp, png, title, rows, one):
        """chart()'s gnuplot run in the directory 'tmp'."""
        dat, script = os.path.join(tmp, "bench.dat"), os.path.join(tmp, "bench.gp")
        parts = ("seckill", "nginx", "postgres", "redis", "loadTool", "interrupts")
        with open(dat, "w", encoding="utf-8") as fh:
            for i, (name, rate, c) in enumerate(rows):
                fh.write(f'{i} "{name}" {rate:.1f} ' + " ".join(f"{c.get(k, 0):.4f}" for k in parts) + "\n")
        n = len(rows)
        with open(script, "w", encoding="utf-8") as fh:
            fh.write("# gnuplot script of loadtest/bench\n" + kit.bar_chart_head(png, 1100, 960, n)
                     + f"""set boxwidth 0.6
set key top left opaque
set bmargin 4
set multiplot layout 2,1 title "{title}"
set title "orders per second (medians of the rounds)"
set yrange [0:{max(3.2 * one, 1.15 * max(r[1] for r in rows)):.0f}]
plot '{dat}' using 1:3:xtic(2) with boxes lc rgb "#1f77b4" title "sale", \\
     '' using 1:3:(sprintf("%.0f", $3)) with labels offset 0,0.7 notitle, \\
     {one:.1f} with lines dt 2 lw 2 lc rgb "#d62728" title "pgbench one-row UPDATE ceiling ({one:,.0f} tps)", \\
     {3 * one:.1f} with lines dt 3 lw 2 lc rgb "#ff7f0e" title "3 x the one-row ceiling"
set title "CPU ms per order, by process (both CPUs shared by everything)"
set key top right opaque
set yrange [0:*]
set style data histograms
set style histogram rowstacked
set boxwidth 0.6 relative
set xrange [-0.6:{n - 0.4}]
plot '{dat}' using 4:xtic(2) title "seckill", '' using 5 title "nginx", \\
     '' using 6 title "postgres", '' using 7 title "redis", '' using 8 title "wrk", \\
     '' using 9 title "softirq"
unset multiplot
""")
        return kit.gnuplot(script, png, log)

    def chart_title(self):
        """The chart's title: the runs, the build, the machine."""
        m = self.res.get("machine") or {}
        ver = (m.get("versions") or {}).get("seckill", "")
        n = len(self.rounds)
        return (f"make bench{f', {n} rounds' if n > 1 else ''}: seckill {ver}, "
                f"{m.get('nproc', '?')} CPUs ({m.get('cpu', '?')}), {self.res.get('when', '')}").strip()
