"""make bench's run: the rounds (the ceilings, then the service with each
stock strategy), the switch between strategies, the long sale last."""

import os
import shutil
import tempfile

from .settings import BenchError, log


class Rounds:
    """The run (a mixin of Bench)."""

    def one_round(self, i):
        """The figures of round i (what BENCH_SKIP leaves)."""
        fig = {}
        if "ceilings" not in self.skip:
            log(f"round {i}: ceilings")
            self.ceilings_round(fig)
        if "optimistic" not in self.skip:
            self.optimistic_round(i, fig)
        if "batched" not in self.skip:
            self.batched_round(i, fig)
        if "redis" not in self.skip:
            self.switch("redis")
            log(f"round {i}: the service, SECKILL_STOCK=redis THREADS={self.redis_threads}"
                " (Redis appendfsync always)")
            fig["redisSale"] = self.redis_sale("sale (redis-first)", self.sale_conns, self.seconds)
            if "rediswait" not in self.skip:
                fig["redisWaitSale"] = self.redis_wait_sale()
        return fig

    def ceilings_round(self, fig):
        """Every ceiling, into fig."""
        fig["pgOneRow"] = self.ceiling_pg_one_row()
        fig["pgTxn"] = self.ceiling_pg_txn()
        fig["redisEvalsha"] = self.ceiling_redis()
        fig["nginx"] = self.ceiling_nginx()
        fig["nginxProc"] = self.ceiling_nginx(separate=True)
        fig["nginxBare"] = self.ceiling_bare()

    def optimistic_round(self, i, fig):
        """The sale, the sold-out crowd, the storm and the low sale with
        SECKILL_STOCK=optimistic; the instances' RSS before and after."""
        if self.strategy != "optimistic":
            self.switch("optimistic")
        log(f"round {i}: the service, SECKILL_STOCK=optimistic")
        fig["rssBefore"] = self.stack.rss()
        fig["sale"] = self.sale("sale (optimistic)", self.sale_conns, self.seconds)
        if "soldout" not in self.skip:
            fig["soldOut"] = self.sold_out()
            if "noedge" not in self.skip:
                fig["soldOutNoEdge"] = self.sold_out_no_edge(fig["soldOut"]["voucherId"])
        if "storm" not in self.skip:
            fig["storm"] = self.storm()
        if "low" not in self.skip and self.low_conns > 0:
            fig["saleLow"] = self.sale(f"sale (optimistic, {self.low_conns} c)", self.low_conns,
                                       self.seconds)
        fig["rssAfter"] = self.stack.rss()

    def batched_round(self, i, fig):
        """The sale at each BENCH_BATCH_CONNECTIONS with SECKILL_STOCK=batched."""
        self.switch("batched")
        log(f"round {i}: the service, SECKILL_STOCK=batched THREADS={self.batch_threads}")
        fig["batchedRssBefore"] = self.stack.rss()
        for c in self.batch_conns:
            fig[f"batchedSale{c}"] = self.sale(f"sale (batched, {c} c)", c, self.seconds, batches=True)
        fig["batchedRssAfter"] = self.stack.rss()

    def switch(self, strategy):
        """The instances restarted with SECKILL_STOCK=strategy and its THREADS;
        Redis's AOF on for redis, off again after it."""
        if strategy == "redis":
            self.redis_aof(True)
        elif self.strategy == "redis":
            self.redis_aof(False)
        threads = (self.batch_threads if strategy == "batched" else
                   self.redis_threads if strategy == "redis" else self.threads)
        extra = {"SECKILL_STOCK": strategy}
        if threads:
            extra["THREADS"] = threads
        log(f"restarting the instances with {' '.join(f'{k}={v}' for k, v in extra.items())}")
        self.stack.restart_instances({**extra, "THREADS": threads or None})
        self.strategy = strategy

    def execute(self):
        """The whole run: the stack, the machine, the rounds, the long sale."""
        if not os.path.exists(self.bin):
            raise BenchError(f"{self.bin} is missing: run 'make'")
        for tool in ("pgbench", "redis-benchmark", "redis-cli", "wrk", "ab", "psql", "curl"):
            if not shutil.which(tool):
                raise BenchError(f"'{tool}' not found (run 'make deps')")
        os.makedirs(self.run_dir, exist_ok=True)
        self.tmp = tempfile.mkdtemp(prefix="bench.", dir=self.run_dir)
        log(f"starting the stack in {self.run_dir} (2 instances, durable Postgres, LOG_LEVEL=warn)")
        self.stack.start(fresh=True)
        self.strategy = "optimistic"
        self.res["machine"] = self.machine()
        m = self.res["machine"]
        log(f"machine: {m['nproc']} CPUs, {m['memTotalMb']} MB, kernel {m['kernel']};"
            f" busy {m['busyPctBefore']}% before the run, load {m['loadavgBefore'][0]:.2f}")
        if m["busyPctBefore"] and m["busyPctBefore"] > 20:
            log("warning: the machine is busy with other work: the figures will be low and noisy")
        for i in range(1, self.repeat + 1):
            self.rounds.append(self.one_round(i))
        if self.long and "long" not in self.skip:
            self.longs.append(self.long_run())
