"""Where the CPU went: machine_cpu() (the whole machine's seconds from
/proc/stat) and CpuMeter (CPU seconds per group of processes between start()
and stop(), their children included, with the interrupt work and the thread
switches). Used by make bench and the edge and poller benchmarks."""

import gzip
import os
import resource
import time

from .proc import proc_status

CLK = os.sysconf("SC_CLK_TCK")


def proc_stat(pid):
    """(ppid, utime+stime, cutime+cstime) in seconds, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    rest = s[s.rindex(")") + 2:].split()
    # rest[0] is field 3 (state): ppid field 4, utime 14, stime 15, cutime 16, cstime 17.
    return int(rest[1]), (int(rest[11]) + int(rest[12])) / CLK, (int(rest[13]) + int(rest[14])) / CLK


def all_pids():
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def kernel_config():
    """The running kernel's build options that are set ({name: value}), from
    /proc/config.gz or /boot/config-<release>; None when neither is there."""
    for path, opener in (("/proc/config.gz", gzip.open), (f"/boot/config-{os.uname().release}", open)):
        try:
            with opener(path, "rt") as f:
                return dict(line.split("=", 1) for line in f.read().splitlines()
                            if line.startswith("CONFIG_") and "=" in line)
        except OSError:
            continue
    return None


# Whether the kernel counts interrupt work done inside a process in that
# process's time as well as in the machine's softirq time: tick-based
# accounting without CONFIG_IRQ_TIME_ACCOUNTING does (account_system_index_time()
# in kernel/sched/cputime.c). Unknown: assumed, since the estimate is bounded
# by the machine's interrupt time either way.
_CONFIG = kernel_config()
IRQ_IN_PROCESS_TIME = _CONFIG is None or not (
    {"CONFIG_IRQ_TIME_ACCOUNTING", "CONFIG_VIRT_CPU_ACCOUNTING_GEN"} & set(_CONFIG))


def thread_switches(pid):
    """{tid: (sleeps, preemptions)} of the process's live threads: the
    kernel's voluntary and involuntary context switches of each
    (proc_status); {} when it is gone."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        st = proc_status(f"{pid}/task/{tid}")      # None: it ended meanwhile
        if st and "voluntary_ctxt_switches" in st and "nonvoluntary_ctxt_switches" in st:
            out[int(tid)] = (st["voluntary_ctxt_switches"], st["nonvoluntary_ctxt_switches"])
    return out


def machine_cpu():
    """CPU seconds of the whole machine since boot: (process time (user, nice,
    system), interrupts (irq, softirq: loopback TCP is processed there), steal,
    total)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]] + [0] * 8
    proc = v[0] + v[1] + v[2]
    return proc / CLK, (v[5] + v[6]) / CLK, v[7] / CLK, sum(v[:8]) / CLK


def idle_pct(m0, m1):
    """The share (%) of the machine no one used (idle and I/O wait) between
    two machine_cpu() readings; None when no time passed."""
    total = m1[3] - m0[3]
    if total <= 0:
        return None
    busy = (m1[0] - m0[0]) + (m1[1] - m0[1])
    return round(max(0.0, 100.0 * (total - busy - (m1[2] - m0[2])) / total), 1)


def steal_pct(m0, m1):
    """The hypervisor's share (%) of the machine between two machine_cpu()
    readings; None when no time passed."""
    total = m1[3] - m0[3]
    return round(100.0 * (m1[2] - m0[2]) / total, 1) if total > 0 else None


def _tree_time(roots, stats, children):
    """(CPU seconds of roots and their live descendants, and the reaped
    children of the roots; the pids seen)."""
    total = 0.0
    seen = set()
    todo = [p for p in roots if p]
    for r in list(todo):
        if r in stats:
            total += stats[r][2]          # reaped children (e.g. pgbench backends)
    while todo:
        p = todo.pop()
        if p in seen or p not in stats:
            continue
        seen.add(p)
        total += stats[p][1]
        todo.extend(children.get(p, []))
    return total, seen


def _switch_deltas(w0, w1):
    """Thread switches of each measured group's threads that lived through
    the run (one that ended took its count with it)."""
    out = {}
    for k, now in w1.items():
        both = [(now[t], w0[k][t]) for t in now if t in w0.get(k, {})]
        out[k] = {"sleeps": sum(after[0] - before[0] for after, before in both),
                  "preempted": sum(after[1] - before[1] for after, before in both)}
    return out


class CpuMeter:
    """CPU seconds per component between start() and stop()."""

    def __init__(self, groups):
        self.groups = groups        # {name: [root pids]} (children are included)

    def _sample(self):
        stats = {}
        for pid in all_pids():
            s = proc_stat(pid)
            if s:
                stats[pid] = s
        children = {}
        for pid, (ppid, _, _) in stats.items():
            children.setdefault(ppid, []).append(pid)
        out, switches = {}, {}
        for name, roots in self.groups.items():
            out[name], seen = _tree_time(roots, stats, children)
            switches[name] = {}
            for p in seen:
                switches[name].update(thread_switches(p))
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        out["loadTool"] = ru.ru_utime + ru.ru_stime
        # Every process's time, its reaped children's included: a process
        # that ends between two samples moves its time to its parent's
        # children's time, so the sum keeps it.
        everyone = sum(own + reaped for _, own, reaped in stats.values())
        return out, machine_cpu(), everyone, switches

    def start(self):
        self.t0 = time.monotonic()
        self.s0 = self._sample()

    def stop(self):
        s1 = self._sample()
        wall = time.monotonic() - self.t0
        (a, m0, e0, w0), (c, m1, e1, w1) = self.s0, s1
        out = {k: round(c[k] - a.get(k, 0.0), 2) for k in c}
        out["switches"] = _switch_deltas(w0, w1)
        out.update(self._machine_share(a, c, m0, m1, e1 - e0, wall))
        return out

    @staticmethod
    def _machine_share(a, c, m0, m1, everyone, wall):
        """The machine's columns of stop(): interrupts, steal, others, busy,
        idle."""
        out = {}
        procs = m1[0] - m0[0]
        irq = m1[1] - m0[1]
        # Where the kernel counts interrupt work (loopback TCP's softirq)
        # done while a process runs twice, in that process's time and in the
        # machine's softirq time (IRQ_IN_PROCESS_TIME), 'interrupts' keeps
        # only the rest, so that the columns add up to the machine's busy
        # time; 'interruptsAll' is the machine's own figure. The estimate is
        # every process's time less the machine's process time: a process
        # that is reaped while /proc is read, or that this process cannot
        # see (another PID namespace), moves it, hence the bounds.
        out["interruptsInProcesses"] = round(everyone - procs, 2)   # the raw estimate
        in_procs = min(irq, max(0.0, everyone - procs)) if IRQ_IN_PROCESS_TIME else 0.0
        out["interrupts"] = round(irq - in_procs, 2)
        out["interruptsAll"] = round(irq, 2)
        out["steal"] = round(m1[2] - m0[2], 2)
        # Process time of everything not measured here: other programs on the
        # machine (noise), kernel threads.
        out["other"] = round(everyone - sum(c[k] - a.get(k, 0.0) for k in c), 2)
        busy = procs + irq
        out["machineBusy"] = round(busy, 2)
        out["wallSeconds"] = round(wall, 2)
        out["busyPct"] = round(100.0 * busy / (wall * os.cpu_count()), 1) if wall > 0 else None
        out["stealPct"] = steal_pct(m0, m1)
        out["idlePct"] = idle_pct(m0, m1)
        return out
