"""make bench's redis-first sales: Redis switched to AOF always, the sale
acknowledged by Redis, the drain of the orders stream into Postgres and the
reconciliation of the two; then the same acknowledged by WAIT for a replica."""

import os

import kit

from .sales import cpu_ms_per_order
from .settings import BenchError, log


class RedisSales:
    """The redis-first sales (a mixin of Bench)."""

    def start_replica(self):
        """A redis-server replicating the stack's Redis (no AOF, no
        snapshots), on a free port under the run directory; returns once
        its link to the master is up."""
        port = kit.free_ports(1)[0]
        d = os.path.join(self.run_dir, "redis-replica")
        os.makedirs(d, exist_ok=True)
        self.replica = kit.start_redis_server(port, d, "--appendonly", "no", "--replicaof",
                                              "127.0.0.1", self.stack.info["REDIS_PORT"])
        try:
            kit.wait_replica(port, 60, self.replica)
        except kit.KitError as e:
            raise BenchError(f"the Redis replica on port {port} did not sync (see {d}/redis.log): {e}")
        return port

    def stop_replica(self):
        """Stops the replica start_replica() started."""
        kit.stop_children([self.replica] if self.replica else [])
        self.replica = None

    def redis_wait_sale(self):
        """The redis-first sale acknowledged by WAIT for one replica
        (REDIS_ORDER_DURABILITY=wait) instead of the AOF: the master runs
        without AOF, so a 200 means the order is in two processes' memory."""
        what = "sale (redis-first, WAIT 1 replica)"
        wait = {"REDIS_ORDER_DURABILITY": "wait", "REDIS_ORDER_WAIT_REPLICAS": 1}
        try:
            self.redis_aof(False)
            port = self.start_replica()
            log(f"Redis replica pid {self.replica.pid} on 127.0.0.1:{port}; restarting the instances"
                " with REDIS_ORDER_DURABILITY=wait REDIS_ORDER_WAIT_REPLICAS=1")
            self.stack.restart_instances({**wait, "SECKILL_STOCK": "redis",
                                          "THREADS": self.redis_threads or None})
            return self.redis_sale(what, self.sale_conns, self.seconds)
        finally:
            self.stop_replica()
            self.stack.set({k: None for k in wait})

    def redis_aof(self, on):
        """The stack's Redis with appendonly yes, appendfsync always (a 200 of
        the redis strategy survives a Redis crash), or without AOF again."""
        kit.set_aof(self.stack.redis_cli, "always" if on else None)

    def drain(self, timeout=300):
        """Seconds until the orders stream has nothing unsettled."""
        return kit.drain_stream(self.stack.redis_cli, timeout)

    def reconcile_redis(self, what, voucher):
        """Redis and Postgres after the drain: the same stock, the same buyers,
        no dead letters, and /stats says so. Violations are recorded."""
        problems = []
        r_stock = int(self.stack.redis_cli("HGET", f"seckill:v:{{{voucher}}}", "stock"))
        r_buyers = set(self.stack.redis_cli("SMEMBERS", f"seckill:v:{{{voucher}}}:buyers").split())
        rows = self.psql(f"SELECT stock FROM tb_voucher WHERE voucher_id = {int(voucher)}")
        pg_stock = int(rows[0][0])
        pg_buyers = {r[0] for r in self.psql(
            f"SELECT user_id FROM tb_voucher_order WHERE voucher_id = {int(voucher)}")}
        dead = int(self.stack.redis_cli("XLEN", "seckill:orders:dead") or 0)
        if r_stock != pg_stock:
            problems.append(f"stock: Redis {r_stock}, Postgres {pg_stock}")
        if r_buyers != pg_buyers:
            problems.append(f"buyers: {len(r_buyers - pg_buyers)} only in Redis, "
                            f"{len(pg_buyers - r_buyers)} only in Postgres")
        if dead:
            problems.append(f"{dead} dead letters")
        st = kit.call(self.stack.base_url, "GET", "/stats", timeout=30).body
        mine = [v for v in st.get("vouchers", []) if v.get("voucherId") == int(voucher)]
        if not mine or not mine[0].get("redis", {}).get("agree"):
            problems.append(f"/stats does not see the agreement: {mine[0].get('redis') if mine else None}")
        out = "; ".join(problems) if problems else "Redis and Postgres agree"
        self.invariant_runs.append({"run": f"{what}: reconciliation", "voucherId": voucher,
                                    "ok": not problems, "output": [out]})
        if problems:
            self.violations.append(f"{what} (voucher {voucher}): reconciliation: {out}")
            log(f"RECONCILIATION FAILED in {what} (voucher {voucher}): {out}")
        else:
            log(f"{what}: reconciled: stock {r_stock} and {len(r_buyers)} buyers on both sides")
        return not problems

    def redis_sale(self, what, conns, seconds, stock=10_000_000):
        """The sale with SECKILL_STOCK=redis: orders/s as acknowledged, then
        the drain of the stream into Postgres, the invariants (every
        acknowledged order id a row) and the reconciliation."""
        if self.warmup > 0:
            self.warm_up(what, conns, drain=True)
        v = self.stack.create_voucher(stock, f"bench: {what}")
        self.quiesce()
        off = self.log_offset()
        meter = self.cpu_meter()
        meter.start()
        w, idle = self.sale_wrk(f"{self.stack.base_url}/voucher/{v}/seckill", conns, seconds)
        drain_s = self.drain()
        cpu = meter.stop()
        w["nginxLogged"] = self.logged(off, v)
        n, span = self.order_span(v)
        acked = w["statuses"].get("200", 0)
        unknown = self.unknown(w, w["nginxLogged"], conns)
        w["unknownOutcome"] = unknown
        self.check(what, v, ids=w["idsFile"], ok=acked, unknown=unknown)
        reconciled = self.reconcile_redis(what, v)
        w.pop("idsFile", None)
        rate = acked / w["seconds"] if w["seconds"] else 0.0
        r = {"voucherId": v, "stock": stock, "connections": conns, "orders": n, "acknowledged": acked,
             "ordersPerSec": round(rate, 1), "landedSpanSeconds": round(span, 3),
             "landedPerSec": round((n - 1) / span, 1) if n > 1 and span > 0 else 0.0,
             "drainSeconds": round(drain_s, 3), "reconciled": reconciled, "wrk": w, "cpu": cpu, "idle": idle,
             "cpuMsPerOrder": cpu_ms_per_order(cpu, n)}
        log(f"{what}: {acked} orders acknowledged in {w['seconds']:.2f}s = {rate:.0f} orders/s"
            f" (p50 {w['p50Ms']} ms, p99 {w['p99Ms']} ms); the last landed in Postgres"
            f" {drain_s:.2f}s after the load ended")
        return r
