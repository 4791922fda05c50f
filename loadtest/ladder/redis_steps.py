"""The redis-first steps (16, 17): Redis's persistence switched, Redis on a
slow disk, a burst of buyers, Redis killed and started again from its AOF,
the stream drained, and which acknowledged orders are rows."""

import os
import signal
import threading
import time

import kit

from .stack import LadderError, log


def buy_all(base_url, path, users, concurrency, statuses=None):
    """Each of users buys once through base_url, concurrency at a time:
    (acknowledged order ids, per-request ms, transport errors); statuses,
    when given, counts the answers by status."""
    acked, times, errors, lock = [], [], [0], threading.Lock()
    users = iter(users)

    def worker():
        while True:
            with lock:
                u = next(users, None)
            if u is None:
                return
            t0 = time.monotonic()
            try:
                r = kit.call(base_url, "POST", path, headers={"X-User-Id": str(u)}, timeout=15)
            except kit.KitError:
                with lock:
                    errors[0] += 1
                continue
            with lock:
                times.append((time.monotonic() - t0) * 1000.0)
                if statuses is not None:
                    statuses[r.status] = statuses.get(r.status, 0) + 1
                if r.status == 200:
                    acked.append(int(r.body["orderId"]))

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return acked, times, errors[0]


class RedisSteps:
    """The redis-first steps (a mixin of Ladder)."""

    def redis_persistence(self, aof):
        """The stack's Redis: AOF with appendfsync aof, or ("no") none."""
        kit.set_aof(self.stack.redis_cli, None if aof == "no" else aof, timeout=30)

    def redis_pid_port(self):
        pid = self.stack.pid("redis")
        return pid, int(self.stack.info["REDIS_URL"].rsplit(":", 1)[1].split("/")[0])

    def redis_start(self, aof, port, slow_fsync_ms=0):
        """A new Redis on the stack's port and directory, from its AOF (or,
        aof "no", empty). slow_fsync_ms: every fsync of it that much slower
        (build/slow_fsync.so)."""
        persist = ["--appendonly", "no"] if aof == "no" else ["--appendonly", "yes",
                                                              "--appendfsync", aof]
        env = None
        if slow_fsync_ms:
            lib = os.path.join(os.path.dirname(os.environ.get(
                "SECKILL_BIN", os.path.join(kit.ROOT, "build", "seckill"))), "slow_fsync.so")
            if not os.path.exists(lib):
                raise LadderError(f"{lib} is missing: make ladder builds it (loadtest/slow_fsync.c)")
            env = {**os.environ, "LD_PRELOAD": lib, "SLOW_FSYNC_MS": str(slow_fsync_ms)}
        p = kit.start_redis_server(port, os.path.join(self.stack.run_dir, "redis"), *persist, env=env)
        # stack.sh's pid file, so that 'stack.sh stop' stops the new one.
        with open(self.stack.pidfile("redis"), "w") as f:
            f.write(f"{p.pid}\nredis-server 127.0.0.1:{port}*\n")
        kit.wait_for(lambda: self.stack.redis_cli("PING", timeout=30) == "PONG", 20,
                     "Redis to come back", poll=0.1, errors=(kit.KitError,))

    def redis_wait_gone(self, pid):
        if not kit.wait_gone(pid, 10):
            raise LadderError(f"Redis pid {pid} did not exit")

    def redis_crash(self, aof):
        """SIGKILL of the stack's Redis, then a new one on the same port and
        directory: from its AOF, or (no AOF) empty."""
        pid, port = self.redis_pid_port()
        os.kill(pid, signal.SIGKILL)
        self.redis_wait_gone(pid)
        self.redis_start(aof, port)

    def redis_fsync_under_way(self):
        """Returns once Redis's background fsync runs (a write starts one when
        the last began a second ago or more): from then on, for up to two
        seconds, Redis holds back the AOF writes of everything it answers."""
        self.stack.redis_cli("SET", "ladder:fsync", str(time.time()), timeout=30)
        kit.wait_for(lambda: "aof_pending_bio_fsync:1" in self.stack.redis_cli("INFO", "persistence", timeout=30),
                     5, "Redis to start a background fsync", poll=0.02)

    def redis_slow_disk(self, aof, slow_fsync_ms):
        """The stack's Redis shut down cleanly (its AOF complete) and started
        again from it, now with every fsync slow_fsync_ms slower."""
        pid, port = self.redis_pid_port()
        try:
            self.stack.redis_cli("SHUTDOWN", timeout=30)
        except kit.KitError:
            pass                        # the connection closes as it exits
        self.redis_wait_gone(pid)
        self.redis_start(aof, port, slow_fsync_ms)

    def burst_then_kill(self, step, step_dir):
        """A burst of buyers (their order ids kept), Redis killed right after
        it while the consumers are behind (off: CONSUMERS=0), Redis back, the
        consumers on, the drain; then which acknowledged orders are rows."""
        load = step["load"]
        users = range(self.user_base + 500_000, self.user_base + 500_000 + load["requests"])
        if step.get("slow_fsync_ms"):
            self.redis_fsync_under_way()
        t0 = time.monotonic()
        acked, times, errors = buy_all(self.base_url, f"/voucher/{self.voucher}/seckill", users,
                                       load["concurrency"])
        seconds = time.monotonic() - t0
        self.redis_crash(step["redis_aof"])
        self.stack.configure(step["instances"], {**self.step_env(step), "CONSUMERS": 1})
        kit.drain_stream(self.stack.redis_cli, 60, poll=0.1)
        self.crash_facts = self.lost_orders(acked, step_dir)
        return load["requests"], seconds, errors, times

    def lost_orders(self, acked, step_dir):
        """Which acknowledged orders are not rows (listed in lost.txt), and
        whether Redis and Postgres agree now."""
        rows = {int(r[0]) for r in kit.psql(self.dsn, "SELECT id FROM tb_voucher_order "
                                                      f"WHERE voucher_id = {int(self.voucher)}")}
        lost = [i for i in acked if i not in rows]
        with open(os.path.join(step_dir, "lost.txt"), "w") as f:
            f.write("".join(f"{i}\n" for i in lost))
        st = kit.call(self.base_url, "GET", "/stats", timeout=30).body
        mine = [v for v in st.get("vouchers", []) if v.get("voucherId") == self.voucher]
        log(f"crash: {len(acked)} acknowledged, {len(lost)} of them not in Postgres after the drain"
            f" (ids in {os.path.join(step_dir, 'lost.txt')})")
        return {"acked": len(acked), "lost": len(lost),
                "reconciled": bool(mine and mine[0].get("redis", {}).get("agree"))
                              and bool(st.get("redisFirst", {}).get("reconciled"))}
