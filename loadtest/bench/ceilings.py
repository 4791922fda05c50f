"""make bench's ceilings on the stack's own Postgres, Redis and nginx:
pgbench (one row, the seckill transaction), redis-benchmark (EVALSHA of the
lock script), wrk through an nginx from the template to a stand-in upstream,
and nginx answering by itself."""

import csv
import re
import os
import shutil
import subprocess

import kit

from .settings import HALF, PACED_SHARE, ROOT, BenchError, log


def stand_in_conf(up):
    """The server block added to the ceiling nginx: the stand-in upstream on
    port up."""
    return f"""
    # make bench: the stand-in for the instances, answers 200 at once.
    server {{
        listen 127.0.0.1:{up} backlog=4096;
        access_log off;
        keepalive_requests 100000;
        location / {{
            default_type application/json;
            return 200 '{{"error":"sold_out","message":"voucher is sold out"}}\\n';
        }}
    }}
"""


def only_200(r, who):
    """BenchError unless every answer of the wrk run r was a 200."""
    bad = sum(v for k, v in r["statuses"].items() if k != "200")
    if bad:
        raise BenchError(f"{who} answered {bad} requests with another status than 200: {r['statuses']}")


class Ceilings:
    """The ceilings (a mixin of Bench)."""

    def warm_then_measure(self, url):
        """wrk on url, 64 connections: BENCH_WARMUP seconds, then BENCH_SECONDS
        with the CPU meter; the second run's figures and CPU."""
        self.wrk(url, 64, self.warmup)
        meter = self.cpu_meter()
        meter.start()
        r = self.wrk(url, 64, self.seconds)
        r["cpu"] = meter.stop()
        return r

    def pgbench(self, script, seconds, defines):
        path = os.path.join(self.tmp, "pgbench.sql")
        with open(path, "w") as f:
            f.write(script)
        v = self.stack.info
        cmd = ["pgbench", "-n", "-c", str(self.pg_clients), "-j", "2", "-T", str(seconds),
               "-M", "prepared", "-h", "127.0.0.1", "-p", v["PG_PORT"], "-U", "postgres"]
        for k, val in defines.items():
            cmd += ["-D", f"{k}={val}"]
        cmd += ["-f", path, "seckill"]
        p = kit.run(cmd, seconds + 60)
        out = p.stdout + p.stderr
        m = re.search(r"^tps = ([\d.]+)", out, re.M)
        lat = re.search(r"^latency average = ([\d.]+) ms", out, re.M)
        n = re.search(r"^number of transactions actually processed: (\d+)", out, re.M)
        failed = re.search(r"^number of failed transactions: (\d+)", out, re.M)
        if not m:
            raise BenchError(f"pgbench printed no tps:\n{out[-800:]}")
        if failed and int(failed.group(1)) > 0:
            raise BenchError(f"pgbench: {failed.group(1)} transactions failed:\n{out[-800:]}")
        return {"tps": round(float(m.group(1)), 1),
                "latencyAvgMs": float(lat.group(1)) if lat else None,
                "transactions": int(n.group(1)) if n else None,
                "tool": " ".join(cmd[:13]) + " -f <script> seckill"}

    def bench_voucher_sql(self, title):
        rows = self.psql(f"""INSERT INTO tb_voucher (title, stock, initial_stock, begin_time, end_time)
            VALUES ('{title}', 1000000000000, 1000000000000, now() - interval '1 minute',
                    now() + interval '1 day') RETURNING voucher_id;""")
        return int(rows[0][0])

    def ceiling_pg_one_row(self):
        script = ("-- one-row autocommit decrement (the service's UPDATE, nothing else)\n"
                  "UPDATE tb_voucher SET stock = stock - 1 WHERE voucher_id = :v AND stock > 0;\n")
        v = self.bench_voucher_sql("bench: pgbench one-row")
        try:
            self.quiesce()
            self.pgbench(script, self.warmup, {"v": v})
            self.quiesce()
            meter = self.cpu_meter()
            meter.start()
            r = self.pgbench(script, self.seconds, {"v": v})
            r["cpu"] = meter.stop()
        finally:
            self.psql(f"DELETE FROM tb_voucher WHERE voucher_id = {v};")
        r["script"] = script.splitlines()[1]
        r["clients"] = self.pg_clients
        log(f"pgbench one-row: {r['tps']:.0f} tps")
        return r

    def ceiling_pg_txn(self):
        script = (
            "-- the seckill transaction, a new user and order id per transaction\n"
            "\\set n :n + 1\n"
            "\\set u :base + :client_id * 100000000 + :n\n"
            "BEGIN;\n"
            "SELECT 1 FROM tb_voucher_order WHERE user_id = :u AND voucher_id = :v;\n"
            "UPDATE tb_voucher SET stock = stock - 1 WHERE voucher_id = :v AND stock > 0;\n"
            "INSERT INTO tb_voucher_order (id, user_id, voucher_id) VALUES (:u, :u, :v);\n"
            "COMMIT;\n")
        v = self.bench_voucher_sql("bench: pgbench seckill transaction")
        base = 8_000_000_000_000_000_000
        try:
            self.quiesce()
            self.pgbench(script, self.warmup, {"v": v, "n": 0, "base": base})
            self.quiesce()
            meter = self.cpu_meter()
            meter.start()
            r = self.pgbench(script, self.seconds, {"v": v, "n": 0, "base": base + 10_000_000_000})
            r["cpu"] = meter.stop()
        finally:
            self.psql(f"DELETE FROM tb_voucher_order WHERE voucher_id = {v};"
                      f" DELETE FROM tb_voucher WHERE voucher_id = {v};")
            self.psql("VACUUM ANALYZE tb_voucher; VACUUM ANALYZE tb_voucher_order;")
        r["script"] = "BEGIN; SELECT (duplicate check); UPDATE ... stock > 0; INSERT order; COMMIT"
        r["clients"] = self.pg_clients
        log(f"pgbench seckill transaction: {r['tps']:.0f} tps")
        return r

    def redis_bench(self, sha, port, n):
        cmd = ["redis-benchmark", "-h", "127.0.0.1", "-p", port, "--dbnum", "9", "-c", "50",
               "-n", str(n), "-r", "100000000", "--csv", "EVALSHA", sha, "2",
               "lock:bench:__rand_int__", "redisson_lock_token:{lock:bench:__rand_int__}",
               "30000", "bench-owner:1"]
        p = kit.run(cmd, 120)
        row = None
        for line in p.stdout.splitlines():
            if line.startswith('"EVALSHA'):
                row = next(csv.reader([line]))
        if not row:
            raise BenchError(f"redis-benchmark printed no EVALSHA line:\n{p.stdout[-500:]}{p.stderr[-500:]}")
        return {"opsPerSec": float(row[1]), "p50Ms": float(row[4]), "p99Ms": float(row[6]),
                "requests": n, "tool": " ".join(cmd[:12]) + " EVALSHA <sha> 2 lock:bench:__rand_int__"
                " redisson_lock_token:{lock:bench:__rand_int__} 30000 bench-owner:1"}

    def ceiling_redis(self):
        port = self.stack.info["REDIS_PORT"]
        with open(os.path.join(ROOT, "lua", "lock_acquire.lua")) as f:
            body = f.read()
        sha = kit.redis_cli(port, "SCRIPT", "LOAD", body, timeout=10)
        try:
            # A short run to size the measured one: about BENCH_SECONDS long.
            probe = self.redis_bench(sha, port, 20000)
            n = int(min(max(probe["opsPerSec"] * self.seconds, 50000), 2000000))
            meter = self.cpu_meter()
            meter.start()
            r = self.redis_bench(sha, port, n)
            r["cpu"] = meter.stop()
        finally:
            try:
                kit.redis_cli(f"redis://127.0.0.1:{port}/9", "FLUSHDB", timeout=60)
            except kit.KitError as e:
                log(f"FLUSHDB of database 9 (redis-benchmark's keys): {e}")
        r["clients"] = 50
        r["script"] = "lua/lock_acquire.lua (KEYS: lock key, redisson_lock_token:{key}; ARGV: lease ms, owner)"
        log(f"redis-benchmark EVALSHA lock_acquire: {r['opsPerSec']:.0f} ops/s")
        return r

    def start_stand_ins(self):
        """Two build/upstream200 processes (IO_THREADS threads each, as an
        instance has): separate upstreams that do no work."""
        binary = os.environ.get("BENCH_UPSTREAM200") or os.path.join(ROOT, "build", "upstream200")
        if not os.access(binary, os.X_OK):
            raise BenchError(f"{binary} is missing (make bench builds it: make build/upstream200)")
        threads = os.environ.get("IO_THREADS") or "2"
        ports = kit.free_ports(2)
        for port in ports:
            with open(os.path.join(self.ceiling_dir, f"upstream200-{port}.log"), "w") as err:
                self.stand_ins.append(subprocess.Popen([binary, str(port), threads],
                                                       stdin=subprocess.DEVNULL, stderr=err))
        for port in ports:
            if not kit.wait_port(port, 5):
                raise BenchError(f"upstream200 on port {port} did not start")
        return ports

    def start_ceiling_nginx(self, separate=False):
        """nginx from nginx/nginx.conf.tmpl in front of a stand-in upstream:
        a server block in the same nginx, or (separate) two upstream200
        processes. Returns the port wrk talks to."""
        d = self.ceiling_dir
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        front, up = kit.free_ports(2)
        ups = self.start_stand_ins() if separate else [up]
        stand_in = "" if separate else stand_in_conf(up)
        self.ceiling_nginx_pid = kit.start_nginx(d, front, [f"127.0.0.1:{u}" for u in ups], stand_in)
        return front

    def stop_ceiling_nginx(self):
        """Stops the ceiling's nginx and stand-ins, if they run."""
        kit.stop_children(self.stand_ins)
        self.stand_ins = []
        pid = self.ceiling_nginx_pid
        if not pid:
            return
        self.ceiling_nginx_pid = None
        if kit.stop_nginx(pid, self.ceiling_dir) is None:
            log(f"pid {pid} is no longer the ceiling nginx: left alone")

    def ceiling_nginx(self, separate=False):
        """wrk through the ceiling nginx to its stand-in upstream (separate:
        two upstream200 processes), saturated, then paced."""
        try:
            port = self.start_ceiling_nginx(separate)
            url = f"http://127.0.0.1:{port}/voucher/1/seckill"
            r = self.warm_then_measure(url)
            # The same connections paced to a quarter of that rate: latency
            # without a saturated queue (the sold-out path is read the same
            # way, at the same pace).
            if not separate:
                self.pace_ms = max(1, round(64 * 1000.0 / (PACED_SHARE * r["rps"]))) if r["rps"] else 20
            _, r["paced"] = self.paced(url)
        finally:
            self.stop_ceiling_nginx()
        only_200(r, "the ceiling nginx")
        r["connections"] = 64
        if separate:
            r["upstream"] = ("two build/upstream200 processes (loadtest/upstream200.c, IO_THREADS threads each),"
                             " upstream keepalive as nginx/nginx.conf.tmpl")
            log(f"wrk nginx -> 2 upstream200 processes: {r['rps']:.0f} req/s")
        else:
            r["upstream"] = "a second server block in the same nginx (return 200), upstream keepalive as nginx/nginx.conf.tmpl"
            log(f"wrk nginx -> keep-alive upstream: {r['rps']:.0f} req/s")
        return r

    def half_pace(self, rps, conns=64):
        """wrk's mean wait between answer and request on each of conns
        connections that offers about HALF of rps."""
        return max(1, round(conns * 1000.0 / (HALF * rps))) if rps else 20

    def ceiling_bare(self):
        """nginx alone (kit.bare_conf: its own configuration, nothing of the
        template, no access log, the template's worker count): 'return 200'
        to the crowd the sold-out run sends (a new X-User-Id per request),
        saturated, then paced to half that rate."""
        d = os.path.join(self.ceiling_dir, "bare")
        shutil.rmtree(d, ignore_errors=True)
        port = kit.free_ports(1)[0]
        pid = self.ceiling_nginx_pid = kit.start_bare_nginx(d, port)    # CPU as the ceiling nginx's
        try:
            url = f"http://127.0.0.1:{port}/voucher/1/seckill"
            r = self.warm_then_measure(url)
            r["pacedHalfDelayMs"] = self.half_pace(r["rps"])
            _, r["pacedHalf"] = self.paced(url, r["pacedHalfDelayMs"])
        finally:
            self.ceiling_nginx_pid = None
            if kit.stop_nginx(pid, d) is None:
                log(f"pid {pid} is no longer the bare nginx: left alone")
        only_200(r, "the bare nginx")
        r["connections"] = 64
        r["server"] = ("nginx alone on its own configuration (loadtest/kit/nginx.py bare_conf): worker_processes"
                       " auto, access_log off, keepalive_requests 1000000, return 200")
        log(f"wrk nginx bare return 200: {r['rps']:.0f} req/s, p99 {r['p99Ms']} ms; paced"
            f" ({r['pacedHalfDelayMs']} ms) {r['pacedHalf']['rps']:.0f} req/s, p99 {r['pacedHalf']['p99Ms']} ms")
        return r
