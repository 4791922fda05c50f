"""make bench's stack (kit.Stack): 2 instances, a durable Postgres; the
instances' memory."""

import kit

from .settings import BenchError, log


class Stack(kit.Stack):
    """make bench's stack: 2 instances at LOG_LEVEL=warn, a durable Postgres
    with room for pgbench's clients, a new user per request."""

    def __init__(self, run_dir, bin_path, threads, max_conn):
        super().__init__(run_dir, {
            "INSTANCES": 2, "PG_DURABLE": 1, "LOG_LEVEL": "warn", "PG_MAX_CONNECTIONS": max_conn,
            "DEMO_RANDOM_USER": 0, "SECKILL_STOCK": "optimistic", "SECKILL_BIN": bin_path,
            "THREADS": threads or None}, log=log)

    def app_pids(self):
        """The pids of instances 1 and 2."""
        return [self.pid(f"app-{i}") for i in (1, 2)]

    def rss(self):
        """Per instance: its pid, VmRSS and VmHWM (KiB), threads; BenchError
        when one is gone."""
        out = []
        for i, pid in enumerate(self.app_pids(), 1):
            st = kit.proc_status(pid) if pid else None
            if st is None:
                raise BenchError(f"instance seckill-{i} (pid {pid}) is gone: it crashed or was killed"
                                 f" (see {self.run_dir}/logs/app-{i}.log)")
            out.append({"instance": f"seckill-{i}", "pid": pid, "rssKb": st.get("VmRSS"),
                        "hwmKb": st.get("VmHWM"), "threads": st.get("Threads")})
        return out
