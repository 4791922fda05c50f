#!/usr/bin/env python3
"""The layer check (scripts/layers.sh, app/LAYERS) passes on the service's
objects and fails on what it is there to refuse: each case copies the
objects to a temporary directory, plants one offence by compiling a module
again with one more function, and expects exit 1 and a message naming the
offending call. Prints "N passed, M failed"."""

import glob
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seckill_server as ss  # noqa: E402
from seckill_server import fail, test  # noqa: E402

ROOT = ss.ROOT
SCRIPT = os.path.join(ROOT, "scripts", "layers.sh")
TABLE = os.path.join(ROOT, "app", "LAYERS")
BUILD = os.path.dirname(os.path.abspath(ss.SECKILL_BIN))
# app/<folder>/<module>.c (main.c at the top): "folder/module", or "module"
MODULES = sorted(os.path.relpath(p, os.path.join(ROOT, "app"))[:-2]
                 for p in glob.glob(os.path.join(ROOT, "app", "*.c")) +
                 glob.glob(os.path.join(ROOT, "app", "*", "*.c")))
HOME = {os.path.basename(m): m for m in MODULES}


def objects(directory, moved=None):
    """The objects under directory/app/ (moved: module -> another folder)."""
    moved = moved or {}
    out = []
    for m in MODULES:
        name = os.path.basename(m)
        rel = os.path.join(moved[name], name) if name in moved else m
        out.append(os.path.join(directory, "app", rel + ".o"))
    return out


def check(objs, table=TABLE):
    return subprocess.run([SCRIPT, "-t", table] + objs, capture_output=True, text=True,
                          timeout=60)


def cflags():
    pc = subprocess.run(["pkg-config", "--cflags", "libmicrohttpd", "hiredis", "libpq",
                         "libcjson"], capture_output=True, text=True, check=True)
    dirs = sorted({os.path.dirname(m) for m in MODULES if os.path.dirname(m)})
    return ["-std=c11", "-D_GNU_SOURCE"] + ["-I" + os.path.join(ROOT, "app", d) for d in dirs] + \
        pc.stdout.split()


class Copy:
    """The service's objects in a temporary directory, to plant offences in."""

    def __enter__(self):
        self.dir = tempfile.mkdtemp(prefix="layers-", dir=ss.TEST_TMP)
        for src, dst in zip(objects(BUILD), objects(self.dir)):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy(src, dst)
        return self

    def __exit__(self, *exc):
        shutil.rmtree(self.dir, ignore_errors=True)

    def plant(self, module, code):
        """Compiles app/<folder>/<module>.c again with 'code' appended, over its object."""
        with open(os.path.join(ROOT, "app", HOME[module] + ".c")) as f:
            src = f.read() + "\n" + code + "\n"
        out = os.path.join(self.dir, "app", HOME[module] + ".o")
        subprocess.run(["cc"] + cflags() + ["-c", "-x", "c", "-o", out, "-"], input=src,
                       text=True, check=True, capture_output=True)

    def add(self, module, code):
        """A new module, not in the table, at the top of app/."""
        out = os.path.join(self.dir, "app", module + ".o")
        subprocess.run(["cc", "-c", "-x", "c", "-o", out, "-"], input=code, text=True,
                       check=True, capture_output=True)
        return out


def expect_refused(p, *needles):
    if p.returncode != 1:
        fail(f"exit {p.returncode}, expected 1; stdout {p.stdout!r} stderr {p.stderr!r}")
    for n in needles:
        if n not in p.stderr:
            fail(f"{n!r} not in the message: {p.stderr!r}")


@test
def the_service_passes():
    p = check(objects(BUILD))
    if p.returncode != 0:
        fail(f"exit {p.returncode}: {p.stderr}")
    if f"{len(MODULES)} modules" not in p.stdout or "none up a layer, no cycle" not in p.stdout:
        fail(f"unexpected summary {p.stdout!r}")


@test
def a_call_up_a_layer_is_refused():
    with Copy() as c:
        c.plant("log", "void order_submit(void);\n"
                       "void log_planted(void);\n"
                       "void log_planted(void) { order_submit(); }")
        expect_refused(check(objects(c.dir)),
                       "log (layer 0) calls up: order_submit is in order (layer 5)")


@test
def the_lock_library_cannot_reach_into_the_service():
    """The library is given its connections and settings: a call into conn,
    or a read of the service's configuration, is a call up."""
    with Copy() as c:
        c.plant("lock_wait", "void *conn_redis_open(char *err, unsigned long n);\n"
                            "void *lock_wait_planted(void);\n"
                            "void *lock_wait_planted(void) { return conn_redis_open(0, 0); }")
        c.plant("watchdog", "extern char g_cfg[];\n"
                            "char watchdog_planted(void);\n"
                            "char watchdog_planted(void) { return g_cfg[0]; }")
        expect_refused(check(objects(c.dir)),
                       "lock_wait (layer 1) calls up: conn_redis_open is in conn (layer 3)",
                       "watchdog (layer 1) calls up: g_cfg is in config (layer 2)")


@test
def a_cycle_within_a_layer_is_refused():
    with Copy() as c:
        c.plant("lock_wait", "int lock_runtime_start(const void *o);\n"
                            "int lock_wait_planted(void);\n"
                            "int lock_wait_planted(void) { return lock_runtime_start(0); }")
        expect_refused(check(objects(c.dir)), "a cycle within layer 1",
                       "lock calls lock_wait (", "lock_wait calls lock (lock_runtime_start)")


@test
def a_module_without_a_layer_is_refused():
    with Copy() as c:
        extra = c.add("newmod", "int newmod_f(void);\nint newmod_f(void) { return 0; }")
        expect_refused(check(objects(c.dir) + [extra]), "app/newmod.c has no layer")


@test
def a_layer_for_a_missing_module_is_refused():
    with Copy() as c:
        table = os.path.join(c.dir, "LAYERS")
        with open(TABLE) as f, open(table, "w") as t:
            t.write(f.read() + "3 data gone\n")
        expect_refused(check(objects(c.dir), table), "lists gone, but there is no gone.o")


@test
def a_module_outside_its_bands_folder_is_refused():
    """The tree draws the layers: lock_wait's object under data/ (layer 3)
    while the table puts it in lock/ (layer 1) is refused, though no call
    changes."""
    with Copy() as c:
        src = os.path.join(c.dir, "app", HOME["lock_wait"] + ".o")
        os.makedirs(os.path.join(c.dir, "app", "data"), exist_ok=True)
        shutil.move(src, os.path.join(c.dir, "app", "data", "lock_wait.o"))
        expect_refused(check(objects(c.dir, {"lock_wait": "data"})),
                       "app/data/lock_wait.c is outside its band",
                       "puts lock_wait (layer 1) in app/lock/")


@test
def a_layer_in_two_folders_is_refused():
    """One folder per band: data's line moved to layer 2 gives layer 2 two
    folders (core and data)."""
    with Copy() as c:
        table = os.path.join(c.dir, "LAYERS")
        with open(TABLE) as f, open(table, "w") as t:
            t.write(f.read().replace("\n3        data      ", "\n2        data      ", 1))
        expect_refused(check(objects(c.dir), table), "layer 2 is given folders core and data")


if __name__ == "__main__":
    ss.main()
