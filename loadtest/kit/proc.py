"""Processes: run() a command, free_ports() and wait_port(), a process's
state from /proc (proc_status(), pid_alive(), wait_gone()), stop_pid() and
stop_children(), wait_for() a condition, with_settings() (an environment),
write_atomic() (a file)."""

import os
import signal
import socket
import subprocess
import time

from .base import KitError


def run(cmd, timeout, env=None, input=None, check=True, cwd=None):
    """Runs cmd (a list) with text output captured. KitError when it is not
    found, outlives timeout seconds, or (check) exits non-zero: the message
    carries the last lines of its output."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                           input=input, cwd=cwd)
    except subprocess.TimeoutExpired:
        raise KitError(f"{cmd[0]} did not finish within {timeout}s: {' '.join(cmd)}") from None
    except FileNotFoundError:
        raise KitError(f"{cmd[0]} not found (run 'make deps')") from None
    if check and p.returncode != 0:
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-15:])
        raise KitError(f"{' '.join(cmd[:3])} ... exited {p.returncode}:\n{tail}")
    return p


def free_ports(n=1):
    """n distinct loopback ports that were free a moment ago (all held open
    together while the kernel picks them, so none repeats)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_for(cond, timeout, what, poll=0.05, errors=()):
    """Calls cond() every poll seconds until it returns a true value, and
    returns that value; KitError naming what once timeout seconds have
    passed. An exception of a type in errors counts as "not yet"."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            v = cond()
            if v:
                return v
        except errors:
            pass
        if time.monotonic() >= deadline:
            raise KitError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(poll)


def wait_port(port, timeout=5.0):
    """True once something accepts connections on 127.0.0.1:port, False
    after timeout seconds."""
    def accepts():
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    try:
        return wait_for(accepts, timeout, f"port {port}", errors=(OSError,))
    except KitError:
        return False


def proc_status(pid):
    """From /proc/PID/status: State (its letter), and VmRSS, VmHWM (KiB),
    Threads and the voluntary and nonvoluntary context switches as numbers;
    None when there is no such process. PID may be "<pid>/task/<tid>": one
    thread's."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k == "State":
                    out[k] = v.split()[0]
                elif k in ("VmRSS", "VmHWM", "Threads", "voluntary_ctxt_switches",
                           "nonvoluntary_ctxt_switches"):
                    out[k] = int(v.split()[0])
    except OSError:
        return None
    return out


def pid_alive(pid):
    """True while pid runs; a zombie (exited, not reaped yet) counts as gone."""
    st = proc_status(pid)
    return st is not None and st.get("State") not in ("Z", "X")


def wait_gone(pid, timeout=10.0):
    """Waits up to timeout seconds for pid to end; True once it has."""
    try:
        return wait_for(lambda: not pid_alive(pid), timeout, f"pid {pid} to end", poll=0.02)
    except KitError:
        return False


def write_atomic(path, text):
    """Writes text to path through a temporary file and a rename: a reader
    sees the old file or the whole new one."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def with_settings(env, settings):
    """A copy of env with settings: each value as a string, None removes it."""
    env = dict(env)
    for k, v in settings.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


def cmdline(pid):
    """The command line of pid, its arguments joined by spaces; None when gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return None


def proc_tree(pid):
    """pid and every process under it (its children, theirs, ...), parents
    first; [] when pid is gone."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        try:
            kids = []
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    kids += [int(c) for c in f.read().split()]
        except OSError:
            continue
        out.append(p)
        todo += kids
    return out


def signal_all(pids, sig):
    """Sends sig to each of pids; one that is gone already is passed over."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def stop_pid(pid, sig=signal.SIGTERM, timeout=10.0, cmdline_has=None):
    """Sends sig to pid (gone already is fine) and waits up to timeout seconds
    for it to end: True once it has, False if it still runs. With
    cmdline_has, only a process whose command line holds that text (a pid
    may have been reused): None, and no signal, for another one."""
    if cmdline_has is not None:
        cmd = cmdline(pid)
        if cmd is None:
            return True
        if cmdline_has not in cmd:
            return None
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return True
    return wait_gone(pid, timeout)


def stop_children(procs):
    """SIGTERM to each of our child processes (Popen), then each reaped;
    one still running after 10 s is killed."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
