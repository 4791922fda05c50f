"""Where a run's idle share goes: IdleSampler looks, whenever a CPU is free,
at what the work in flight is waiting for then.

The sampler's thread runs under SCHED_IDLE (sched(7)): the kernel gives it a
CPU only when nothing else wants that CPU, so each time it runs is an instant
when a CPU may be free (it checks: no thread but itself runnable on it,
busy_cpus()). Sampling on a timer instead misses the idle instants: a
2-CPU machine 97 % busy under a 64-connection sale had 5 to 15 threads
runnable in most samples. At each such
instant it charges the free CPUs to the first of these causes that holds:

  walFlush     a Postgres process waits on the WAL's write or flush
               (pg_stat_activity: IO WALSync, WALWrite, WALInitSync,
               LWLock WALWrite: a commit waits for its flush or for the
               one another process is doing)
  syncRep      a Postgres commit waits for a standby (IPC SyncRep)
  redisFsync   Redis's main thread is in uninterruptible sleep (state D:
               the fsync of appendfsync always, or a write the disk holds)
  diskOther    another thread waits on the disk (procs_blocked > 0)
  batchWindow  an instance's worker waits out a group commit's gathering
               window (a thread named sk-worker in a futex wait with a
               timeout: /proc/<pid>/task/<tid>/syscall; the batch leader's
               pthread_cond_timedwait, BATCH_WINDOW_US, is the only timed
               wait of the workers)
  rowLock      a Postgres transaction holds the voucher row while it waits
               for its client (idle in transaction) or another waits for
               it (Lock tuple, transactionid)
  roundTrips   none of these: every request in flight is between processes
               (the load tool, nginx, the instances, Redis, Postgres all
               waiting on each other's answers; the instances' own pauses,
               a group commit's window, are here too)

stop() splits the run's idle share (/proc/stat, as kit.CpuMeter counts it)
in the proportions of the causes. Each look costs a few milliseconds of
CPU (every thread's /proc stat; at a free CPU a pg_stat_activity query on a
psql of its own), mostly taken from time no one else wanted; looks are at
least 'interval' apart."""

import os
import subprocess
import threading

from .cpu import idle_pct, machine_cpu

CAUSES = ("walFlush", "syncRep", "redisFsync", "diskOther", "batchWindow", "rowLock", "roundTrips")
SYS_FUTEX = 202         # x86-64; elsewhere no thread is seen in the window
WAL_WAITS = {("IO", "WALSync"), ("IO", "WALWrite"), ("IO", "WALInitSync"), ("LWLock", "WALWrite")}
ROW_WAITS = {("Lock", "tuple"), ("Lock", "transactionid")}
PG_QUERY = ("SELECT coalesce(state, ''), coalesce(wait_event_type, ''), coalesce(wait_event, ''), count(*)"
            " FROM pg_stat_activity WHERE pid <> pg_backend_pid() GROUP BY 1, 2, 3;\n\\echo __end__\n")


def machine_blocked():
    """Threads blocked on I/O now (/proc/stat procs_blocked)."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("procs_blocked "):
                return int(line.split()[1])
    return 0


def busy_cpus(me):
    """The CPUs that have a runnable thread now (state R: running or queued
    there), the thread me left out: every thread's /proc stat, its state
    and its field 39, the CPU it is on. procs_running alone cannot tell:
    it sums the CPUs' queues, and one CPU often has three runnable threads
    while the other has none."""
    cpus = set()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            tids = os.listdir(f"/proc/{d}/task")
        except OSError:
            continue
        for t in tids:
            if t == me:
                continue
            try:
                with open(f"/proc/{d}/task/{t}/stat", "rb") as f:
                    st = f.read()
            except OSError:
                continue
            rest = st[st.rindex(b")") + 2:].split(b" ")
            if rest[0] == b"R":
                cpus.add(int(rest[36]))
    return cpus


def thread_state(pid, tid):
    """The one-letter state of a thread (R, S, D, ...), or None when gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    return s[s.rindex(")") + 2]


def in_timed_futex(pid, tid):
    """Is the thread blocked in a futex wait with a timeout (its syscall
    file: the number, then the arguments; the fourth is the timeout)?"""
    try:
        with open(f"/proc/{pid}/task/{tid}/syscall") as f:
            v = f.read().split()
    except OSError:
        return False
    return len(v) > 4 and v[0] == str(SYS_FUTEX) and int(v[4], 16) != 0


def gathering(pids):
    """Does a worker thread (sk-worker) of one of pids wait out a window?"""
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    if f.read().strip() != "sk-worker":
                        continue
            except OSError:
                continue
            if in_timed_futex(pid, tid):
                return True
    return False


def classify(free, pg_rows, redis_state, blocked, window=False):
    """The cause (CAUSES) a free CPU of one sample is charged to; pg_rows:
    (state, wait_event_type, wait_event, count) of pg_stat_activity."""
    if free <= 0:
        return None
    waits = {(t, e) for _, t, e, _ in pg_rows}
    if waits & WAL_WAITS:
        return "walFlush"
    if ("IPC", "SyncRep") in waits:
        return "syncRep"
    if redis_state == "D":
        return "redisFsync"
    if blocked > 0:
        return "diskOther"
    if window:
        return "batchWindow"
    if waits & ROW_WAITS or any(s == "idle in transaction" for s, _, _, _ in pg_rows):
        return "rowLock"
    return "roundTrips"


class IdleSampler:
    """Looks at most every interval seconds between start() and stop() (a
    thread of its own, under SCHED_IDLE); stop() returns the shares. dsn: Postgres (None: no
    pg_stat_activity); redis_pid: the Redis whose main thread is watched;
    seckill_pids: the instances whose workers may wait out a window."""

    def __init__(self, dsn, redis_pid=None, interval=0.02, ncpu=None, seckill_pids=()):
        self.dsn, self.redis_pid, self.interval = dsn, redis_pid, interval
        self.seckill_pids = list(seckill_pids)
        self.ncpu = ncpu or os.cpu_count()
        self.free = {c: 0 for c in CAUSES}
        self.samples = 0
        self.busy = 0
        self.pg = None
        self.error = None
        self._stop = threading.Event()
        self._thread = None

    def _pg_rows(self):
        if self.pg is None:
            return []
        self.pg.stdin.write(PG_QUERY)
        self.pg.stdin.flush()
        rows = []
        while True:
            line = self.pg.stdout.readline()
            if not line:
                raise OSError("psql ended")
            line = line.rstrip("\n")
            if line == "__end__":
                return rows
            if line:
                s, t, e, n = line.split("\t")
                rows.append((s, t, e, int(n)))

    def sample(self):
        """One look; the cause charged, or None when no CPU was free."""
        free = self.ncpu - len(busy_cpus(str(threading.get_native_id())))
        if free <= 0:
            self.busy += 1
            return None
        blocked = machine_blocked()
        rows = self._pg_rows()
        redis_state = thread_state(self.redis_pid, self.redis_pid) if self.redis_pid else None
        cause = classify(free, rows, redis_state, blocked, gathering(self.seckill_pids))
        self.samples += 1
        if cause:
            self.free[cause] += free
        return cause

    def _loop(self):
        try:
            # This thread only (0: the caller); without it (not Linux) the
            # looks are on the timer, and free CPUs are undercounted.
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except (AttributeError, OSError) as e:
            self.error = f"SCHED_IDLE: {e}"
        try:
            while not self._stop.wait(self.interval):
                self.sample()
        except (OSError, ValueError) as e:
            self.error = str(e)

    def start(self):
        if self.dsn:
            self.pg = subprocess.Popen(["psql", "-X", "-q", "-A", "-t", "-F", "\t", "-d", self.dsn],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self.m0 = machine_cpu()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def stop(self):
        """{"samples" (looks at a free CPU), "busyLooks" (looks that found
        none), "idlePct" (the machine's, /proc/stat), "byCause": {cause: %
        of the machine}, "error"}."""
        m1 = machine_cpu()
        self._stop.set()
        if self._thread:
            self._thread.join(10)
        if self.pg:
            try:
                self.pg.stdin.close()
                self.pg.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                self.pg.kill()
                self.pg.wait()
        idle = idle_pct(self.m0, m1) or 0.0
        charged = sum(self.free.values())
        by = {c: round(idle * v / charged, 1) for c, v in self.free.items()} if charged else {}
        out = {"samples": self.samples, "busyLooks": self.busy, "intervalMs": round(1000 * self.interval),
               "idlePct": idle, "byCause": by}
        if self.error:
            out["error"] = self.error
        return out


def dominant(by_cause):
    """The cause with the largest share, or None."""
    if not by_cause or max(by_cause.values()) <= 0:
        return None
    return max(by_cause, key=by_cause.get)


# Each cause in words.
LABEL = {"walFlush": "the WAL's flush", "syncRep": "a standby's acknowledgement",
         "redisFsync": "Redis's fsync", "diskOther": "other disk work",
         "batchWindow": "a group commit's gathering window",
         "rowLock": "the voucher row held by a transaction", "roundTrips": "round trips between processes"}

# What would turn each cause's idle share into orders, in a sentence.
REMEDY = {
    "walFlush": "more orders per WAL flush (group commit: SECKILL_STOCK=batched, larger batches) or a disk that flushes faster",
    "syncRep": "a standby that acknowledges sooner (closer, a faster disk), or more commits per round trip to it",
    "redisFsync": "more admissions per fsync (larger lots: more connections or REDIS_ADMIT_PIPELINES), or WAIT for a replica instead of the disk",
    "diskOther": "less other disk work during the sale (a checkpoint, the journal, the AOF's blocks)",
    "batchWindow": "a shorter gathering window (BATCH_WINDOW_US) or more buyers in flight to fill each batch sooner",
    "rowLock": "buyers queued on the voucher row behind a transaction that waits for its client: fewer round trips inside it, or more buyers per transaction (group commit)",
    "roundTrips": "more requests in flight (connections) or fewer hops per request; the CPU, not a wait, bounds the rest",
}

