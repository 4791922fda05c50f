#!/usr/bin/env python3
"""The Makefile's workflow, observed from outside:

- 'make help' lists every target of the Makefile and mk/*.mk, one line each
  with a description (the '## ' comments beside the targets): a target added
  without one fails here;
- a build without the libraries stops before compiling, naming what is
  missing and 'make deps' (pkg-config's search path emptied, or one .pc file
  hidden);
- 'make test' and 'make check' run deps-check first; deps-check is quick when
  everything is installed, runs 'make deps' as root when something is
  missing, and says what to run otherwise (apt-get, dpkg-query and id are
  stand-ins on PATH: nothing is installed);
- the programs 'make tsan-concurrency' names exist, and CI runs it;
- a script a recipe runs by its path is executable;
- every 'make <target>' README.md or a docs/ page tells a reader to run
  builds, from an empty BUILD, every build artefact its commands and their
  scripts use (its dry run, make -n: see documented_targets_build_what_they_use).
Prints "N passed, M failed". Python 3 standard library only.
"""

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seckill_server as ss  # noqa: E402
from seckill_server import fail, test  # noqa: E402

ROOT = ss.ROOT
MK_FILES = ["Makefile"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "mk", "*.mk")))
# Helpers of the Makefile itself, not meant to be run.
INTERNAL = {"FORCE"}


def make(*args, env=None, timeout=120):
    e = dict(os.environ)
    # The caller's make flags (from a 'make test' above us) must not leak in.
    for k in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "TESTS", "BUILD", "SKIP_DEPS_CHECK"):
        e.pop(k, None)
    e.update(env or {})
    return subprocess.run(["make", "--no-print-directory", *args], cwd=ROOT, env=e,
                          capture_output=True, text=True, timeout=timeout)


_cache = {}


def database():
    """make's database (make -pRrq): {target: prerequisites text}, and the
    .PHONY list."""
    if "db" not in _cache:
        p = make("-pRrq", ":")
        rules = {}
        for line in p.stdout.splitlines():
            m = re.match(r"^([A-Za-z0-9_.%/$()-][^:=#\t]*?):(?!=)\s*(.*)$", line)
            if m and not line.startswith(("#", "\t")):
                for t in m.group(1).split():
                    rules.setdefault(t, []).append(m.group(2))
        phony = set()
        for deps in rules.get(".PHONY", []):
            phony |= set(deps.split())
        _cache["db"] = (rules, phony)
    return _cache["db"]


def help_entries():
    if "help" not in _cache:
        p = make("help")
        if p.returncode != 0:
            fail(f"make help: exit {p.returncode}: {p.stderr}")
        entries = {}
        for line in p.stdout.splitlines():
            m = re.match(r"^  (\S+)\s+(.*)$", line)
            if m:
                if m.group(1) in entries:
                    fail(f"make help lists {m.group(1)} twice")
                entries[m.group(1)] = m.group(2).strip()
        _cache["help"] = (entries, p.stdout)
    return _cache["help"]


def literal_rules():
    """Targets written literally at the start of a rule line in the Makefile
    and mk/*.mk (not variables, patterns or files)."""
    out = set()
    for f in MK_FILES:
        for line in open(os.path.join(ROOT, f)):
            m = re.match(r"^([a-zA-Z][a-zA-Z0-9_.-]*(?:\s+[a-zA-Z][a-zA-Z0-9_.-]*)*)\s*:(?![=:])", line)
            if m:
                out |= set(m.group(1).split())
    return out - {".PHONY"}


@test
def help_lists_every_target_with_a_description():
    entries, text = help_entries()
    rules, phony = database()
    if len(phony) < 20:
        fail(f"make's database shows only {len(phony)} phony targets: {sorted(phony)}")
    missing = sorted(phony - set(entries) - INTERNAL)
    if missing:
        fail(f"targets missing from 'make help' (add a '## description' beside them): {missing}")
    not_phony = sorted(literal_rules() - phony - INTERNAL)
    if not_phony:
        fail(f"targets not declared .PHONY (and so perhaps not in help): {not_phony}")
    unknown = sorted(set(entries) - set(rules))
    if unknown:
        fail(f"'make help' lists names that are no targets: {unknown}")
    short = sorted(t for t, d in entries.items() if len(d) < 10)
    if short:
        fail(f"targets without a real description in 'make help': {short}")
    for t in ("all", "test", "check", "deps", "demo", "help", "tsan", "asan", "fuzz"):
        if t not in entries:
            fail(f"'make help' lacks {t}:\n{text}")


@test
def every_mutation_still_applies():
    """make mutate is not in CI (too long): this keeps tests/mutations.txt in
    step with the code, each search text found exactly once in its file."""
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "mutate.py"), "--check"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        fail(f"scripts/mutate.py --check: exit {p.returncode}: {(p.stdout + p.stderr)[-600:]}")


@test
def help_states_the_fast_tiers_time():
    entries, _ = help_entries()
    if not re.search(r"\b\d+ s\b", entries.get("check", "")):
        fail(f"'make help' should state how long make check takes: {entries.get('check')!r}")
    if "deps" not in entries.get("test", "") and "install" not in entries.get("test", ""):
        fail(f"'make help' should say that make test installs what is missing: {entries.get('test')!r}")


@test
def test_and_check_run_deps_check_first():
    rules, _ = database()
    for t in ("test", "check"):
        deps = " ".join(rules.get(t, [])).split()
        if not deps or deps[0] != "deps-check":
            fail(f"{t}'s first prerequisite should be deps-check: {deps}")


@test
def recipes_run_only_scripts_that_can_run():
    """A script a recipe runs by its path (not through python3 or bash) must
    be executable, or the target fails with "Permission denied"."""
    direct = re.compile(r"(?<![\w./-])((?:loadtest|scripts|tests|\.ci)/[\w./-]+\.(?:py|sh))")
    bad = []
    for mk in MK_FILES:
        with open(os.path.join(ROOT, mk)) as f:
            for no, line in enumerate(f, 1):
                if not line.startswith("\t"):
                    continue
                for m in direct.finditer(line):
                    before = line[:m.start()].rstrip().split()
                    if before and before[-1].lstrip("@-") in ("python3", "bash", "sh"):
                        continue
                    path = os.path.join(ROOT, m.group(1))
                    if not os.access(path, os.X_OK):
                        bad.append(f"{mk}:{no}: {m.group(1)}")
    if bad:
        fail("recipes run scripts that are not executable: " + ", ".join(bad))


def deb_pkgs():
    mk = open(os.path.join(ROOT, "Makefile")).read()
    m = re.search(r"^DEB_PKGS\s*:=\s*((?:.*\\\n)*.*)", mk, re.M)
    return m.group(1).replace("\\\n", " ").split() if m else []


@test
def deps_include_the_fuzz_and_tsan_toolchains():
    pkgs = deb_pkgs()
    for p in ("clang", "libclang-rt-14-dev", "libtsan2", "build-essential", "pkg-config",
              "libmicrohttpd-dev", "libhiredis-dev", "libpq-dev", "libcjson-dev",
              "redis-server", "postgresql", "nginx", "docker-compose"):
        if p not in pkgs:
            fail(f"DEB_PKGS lacks {p}: {pkgs}")
    fuzz = open(os.path.join(ROOT, "mk", "fuzz.mk")).read()
    if "CC=clang" not in fuzz or "-fsanitize=fuzzer" not in fuzz:
        fail("mk/fuzz.mk no longer builds with clang's libFuzzer: check DEB_PKGS")


def fake_bin(d, name, script):
    path = os.path.join(d, name)
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + script)
    os.chmod(path, 0o755)


@test
def deps_check_is_quick_and_silent_when_everything_is_installed():
    # CI runs 'make deps' first; a developer's machine has the packages.
    p = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${db:Status-Abbrev}\\n", *deb_pkgs()],
                       capture_output=True, text=True)
    have = {l.split()[0] for l in p.stdout.splitlines() if l.split()[1:2] == ["ii"]}
    if set(deb_pkgs()) - have:
        fail(f"this machine lacks {sorted(set(deb_pkgs()) - have)}: run 'make deps' first")
    t0 = time.monotonic()
    p = make("deps-check")
    took = time.monotonic() - t0
    if p.returncode != 0 or p.stdout.strip() or p.stderr.strip():
        fail(f"make deps-check with everything installed: exit {p.returncode},"
             f" out {p.stdout!r}, err {p.stderr!r}")
    if took > 3:
        fail(f"make deps-check took {took:.1f} s with everything installed")
    print(f"    make deps-check: {took * 1000:.0f} ms", flush=True)


@test
def deps_check_runs_make_deps_as_root_and_says_what_to_run_otherwise():
    with tempfile.TemporaryDirectory(dir=ss.TEST_TMP) as d:
        log = os.path.join(d, "apt.log")
        fake_bin(d, "apt-get", f'echo "apt-get $*" >>{log}\n')
        pkgs = "procps seckill-no-such-package"
        env = {"PATH": d + ":" + os.environ["PATH"]}
        build = f"BUILD={d}/build"
        # As root (id -u prints 0): make deps installs exactly what is missing.
        fake_bin(d, "id", 'if [ "$1" = -u ]; then echo 0; else exec /usr/bin/id "$@"; fi\n')
        p = make("deps-check", f"DEB_PKGS={pkgs}", build, env=env)
        calls = open(log).read() if os.path.exists(log) else ""
        if p.returncode != 0 or "install" not in calls:
            fail(f"as root, deps-check should run make deps: exit {p.returncode}, apt-get calls"
                 f" {calls!r}, out {p.stdout!r} err {p.stderr!r}")
        install = [l for l in calls.splitlines() if " install " in l][0].split()
        if "seckill-no-such-package" not in install or "procps" in install:
            fail(f"make deps should install the missing package only: {install}")
        # Not root: nothing installed, the exact command printed, exit 2.
        os.unlink(log)
        fake_bin(d, "id", 'if [ "$1" = -u ]; then echo 1000; else exec /usr/bin/id "$@"; fi\n')
        p = make("deps-check", f"DEB_PKGS={pkgs}", build, env=env)
        if p.returncode == 0 or os.path.exists(log):
            fail(f"not root: deps-check must fail without installing: exit {p.returncode}")
        if "sudo make deps" not in p.stderr or "seckill-no-such-package" not in p.stderr:
            fail(f"not root: deps-check should say what to run: {p.stderr!r}")
        # SKIP_DEPS_CHECK=1: not checked at all.
        p = make("deps-check", f"DEB_PKGS={pkgs}", "SKIP_DEPS_CHECK=1", build, env=env)
        if p.returncode != 0:
            fail(f"SKIP_DEPS_CHECK=1 should skip the check: {p.stderr!r}")


@test
def make_deps_prints_one_line_per_step_and_logs_apt():
    """make deps (make demo's and CI's first step) prints one line per step;
    apt-get's output goes to BUILD/deps.log, whose last 30 lines it prints
    when a step fails. apt-get and id are stand-ins: nothing is installed."""
    with tempfile.TemporaryDirectory(dir=ss.TEST_TMP) as d:
        calls = os.path.join(d, "apt.calls")
        deps_log = os.path.join(d, "build", "deps.log")
        fake_bin(d, "apt-get", f'echo "$*" >>{calls}\n'
                               'for i in $(seq 1 600); do echo "apt-get says $i"; done\n'
                               'case "$*" in *" install "*) [ -z "$APT_FAIL" ] || '
                               '{ echo "E: Unable to locate package seckill-no-such-package"; exit 100; };; esac\n')
        fake_bin(d, "id", 'if [ "$1" = -u ]; then echo 0; else exec /usr/bin/id "$@"; fi\n')
        env = {"PATH": d + ":" + os.environ["PATH"]}
        args = [f"BUILD={d}/build", "DEB_CMD_PKGS=sh seckill-no-such-command"]

        # Everything there: one line, no apt-get.
        p = make("deps", f"BUILD={d}/build", "DEB_PKGS=procps", "DEB_CMD_PKGS=sh", env=env)
        if p.returncode != 0 or p.stderr or not re.fullmatch(r"deps: [^\n]*nothing to install\n", p.stdout) \
                or os.path.exists(calls):
            fail(f"make deps with everything installed: exit {p.returncode}, out {p.stdout!r},"
                 f" err {p.stderr!r}, apt-get called: {os.path.exists(calls)}")

        # Two missing (a package, a command): update, install, one line each.
        p = make("deps", "DEB_PKGS=procps seckill-no-such-package", *args, env=env)
        want = ["deps: apt-get update ... ok",
                f"deps: installing seckill-no-such-package seckill-no-such-command ... ok (log: {deps_log})"]
        if p.returncode != 0 or p.stdout.splitlines() != want or p.stderr:
            fail(f"make deps: exit {p.returncode}, out {p.stdout!r} (want {want}), err {p.stderr!r}")
        installs = [c.split() for c in open(calls).read().splitlines() if " install " in f" {c} "]
        if len(installs) != 1 or installs[0][-2:] != ["seckill-no-such-package", "seckill-no-such-command"]:
            fail(f"make deps should install the two missing packages at once: {installs}")
        log = open(deps_log).read()
        if log.count("apt-get says") != 1200:
            fail(f"{deps_log} should hold apt-get's output of both steps: {log[:300]!r}")

        # Many missing: counted, not listed.
        many = " ".join(f"seckill-no-such-{i}" for i in range(23))
        p = make("deps", f"DEB_PKGS={many}", f"BUILD={d}/build", "DEB_CMD_PKGS=sh", env=env)
        if p.returncode != 0 or p.stdout.splitlines()[1:] != [
                f"deps: installing 23 packages ... ok (log: {deps_log})"]:
            fail(f"make deps of 23 packages: exit {p.returncode}, out {p.stdout!r}")

        # A failed step: FAILED, the log's last 30 lines and its path, apt-get's exit status.
        p = make("deps", "DEB_PKGS=procps seckill-no-such-package", *args, env={**env, "APT_FAIL": "1"})
        out = p.stdout.splitlines()
        if p.returncode == 0 or "FAILED (exit 100)" not in p.stdout or not out[0].endswith("... ok"):
            fail(f"make deps with apt-get failing: exit {p.returncode}, out {p.stdout[:500]!r}")
        quoted = [l for l in out if l.startswith("    ")]
        if len(quoted) != 30 or "Unable to locate package" not in quoted[-1] \
                or "apt-get says 572" not in quoted[0] or deps_log not in out[-1]:
            fail(f"make deps with apt-get failing should quote the log's last 30 lines and name it: {out}")

        # Not root: apt-get is not run; the message says what to run.
        os.unlink(calls)
        fake_bin(d, "id", 'if [ "$1" = -u ]; then echo 1000; else exec /usr/bin/id "$@"; fi\n')
        p = make("deps", "DEB_PKGS=procps seckill-no-such-package", *args, env=env)
        if p.returncode == 0 or os.path.exists(calls) or "sudo make deps" not in p.stderr:
            fail(f"make deps not as root: exit {p.returncode}, err {p.stderr!r}")
    print(f"    make deps: {' / '.join(want)}", flush=True)


def build_without(hidden, tmp):
    """make in a fresh BUILD dir with pkg-config seeing every .pc file except
    those named in 'hidden' (all when None)."""
    pcdir = os.path.join(tmp, "pkgconfig")
    os.makedirs(pcdir)
    if hidden is not None:
        path = subprocess.run(["pkg-config", "--variable", "pc_path", "pkg-config"],
                              capture_output=True, text=True).stdout.strip()
        for d in path.split(":"):
            for pc in glob.glob(os.path.join(d, "*.pc")):
                name = os.path.basename(pc)
                if name[:-3] not in hidden and not os.path.exists(os.path.join(pcdir, name)):
                    os.symlink(pc, os.path.join(pcdir, name))
    build = os.path.join(tmp, "build")
    p = make(f"BUILD={build}", "all", env={"PKG_CONFIG_LIBDIR": pcdir, "PKG_CONFIG_PATH": ""})
    objs = glob.glob(os.path.join(build, "app", "**", "*.o"), recursive=True)
    return p, objs


@test
def build_without_libraries_says_make_deps():
    with tempfile.TemporaryDirectory(dir=ss.TEST_TMP) as d:
        p, objs = build_without(None, d)
        if p.returncode == 0:
            fail("make succeeded with no library visible to pkg-config")
        for want in ("missing:", "libmicrohttpd (libmicrohttpd-dev)", "hiredis (libhiredis-dev)",
                     "libpq (libpq-dev)", "libcjson (libcjson-dev)", "make deps"):
            if want not in p.stderr:
                fail(f"the message lacks {want!r}: {p.stderr!r}")
        if "error:" in p.stderr or "fatal" in p.stderr or objs:
            fail(f"the compiler ran: objects {objs}, stderr {p.stderr!r}")


@test
def build_names_the_one_missing_library():
    with tempfile.TemporaryDirectory(dir=ss.TEST_TMP) as d:
        p, objs = build_without({"hiredis"}, d)
        if p.returncode == 0:
            fail("make succeeded without hiredis.pc")
        if "hiredis (libhiredis-dev)" not in p.stderr or "make deps" not in p.stderr:
            fail(f"the message should name hiredis and make deps: {p.stderr!r}")
        if "libmicrohttpd" in p.stderr.split("missing:")[-1].split("\n")[0]:
            fail(f"libmicrohttpd is there and must not be named: {p.stderr!r}")
        if objs:
            fail(f"objects were compiled: {objs}")


@test
def tsan_concurrency_tests_exist_and_ci_runs_them():
    mk = open(os.path.join(ROOT, "Makefile")).read()
    m = re.search(r"^TSAN_CONCURRENCY_TESTS\s*:=\s*(.*)$", mk, re.M)
    if not m:
        fail("Makefile lacks TSAN_CONCURRENCY_TESTS")
    programs = [os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "tests", "test_*"))]
    for word in m.group(1).split():
        if not any(word in p for p in programs):
            fail(f"TSAN_CONCURRENCY_TESTS names {word}, which matches no test program")
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    if not re.search(r"^\s*make tsan-concurrency\b", ci, re.M):
        fail(".ci/run does not run make tsan-concurrency")


@test
def run_sh_check_tier_takes_several_filters():
    build = os.path.dirname(os.path.abspath(ss.SECKILL_BIN))
    want = ["unit_exposition", "unit_route"]
    for w in want:
        if not os.access(os.path.join(build, "tests", w), os.X_OK):
            fail(f"{build}/tests/{w} is missing (make tests-bin)")
    env = {k: v for k, v in os.environ.items() if k not in ("TEST_SKIP",)}
    env["BUILD"] = build
    p = subprocess.run([os.path.join(ROOT, "tests", "run.sh"), "--check", *want], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=120)
    summary = p.stdout.split("=== summary")[-1]
    ran = re.findall(r"^(\S+)\s+\d+ passed", summary, re.M)
    if p.returncode != 0 or ran != want:
        fail(f"run.sh --check {' '.join(want)}: exit {p.returncode}, ran {ran}: {p.stderr[-500:]}")
    if "Postgres" in p.stderr:
        fail(f"the check tier started Postgres: {p.stderr[-500:]}")



# ------------------------------------------------ what the documented targets build
#
# Every 'make <target>' that README.md or a docs/ page tells a reader to run
# must build the files its recipe and its scripts use, on a fresh clone. The
# method: 'make -n -B BUILD=<empty dir> <target>' (a dry run: nothing runs but
# the sub-makes, which print too; -B: every rule as on a fresh clone, also in
# the fixed build directories of asan, tsan and fuzz). What the dry run builds
# is every '-o FILE' it prints. What the target uses: the build artefacts (the
# files the Makefile's rules under BUILD make: the server, the C test programs,
# upstream200, slow_fsync.so) named in its commands, and those the scripts its
# commands run (and the modules of a package they run) refer to ("build/x",
# os.path.join(..., "build", "x"), a quoted
# "x", SECKILL_BIN for the server). A script finds them in the BUILD its
# command line passes (BUILD=, or the directory of an artefact it names, such
# as SECKILL_BIN=...), else in build/, its default. tests/run.sh is read for
# what it runs: the server (not with --check), the C programs whose names
# match its filters, and the Python tests, scanned in turn.

DOC_FILES = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
# Script commands that touch no build artefact of BUILD: stopping and listing
# the stack, and the mutation runner (it builds a copy of the tree per run).
NO_ARTEFACTS = {("scripts/stack.sh", "stop"), ("scripts/stack.sh", "status"),
                ("scripts/mutate.py", "--scratch")}
SCRIPT_RE = re.compile(r"(?<![\w./-])((?:loadtest|scripts|tests|nginx|\.ci)/[\w.-]+\.(?:py|sh))(?![\w.-])")
# A tool that is a package run by its directory (python3 loadtest/bench): its modules are read.
PACKAGE_RE = re.compile(r"(?<![\w./-])(loadtest/[\w-]+)(?![\w./-])")


def documented_targets():
    """{target: the first file that tells a reader to run 'make target'}."""
    entries, _ = help_entries()
    found = {"all": "README.md"}
    word = re.compile(r"\bmake((?:\s+[A-Z][A-Z0-9_]*=(?:'[^']*'|\"[^\"]*\"|\S+))*)\s+([a-z][a-z0-9_.-]*)")
    for doc in DOC_FILES:
        for m in word.finditer(open(os.path.join(ROOT, doc)).read()):
            if m.group(2) in entries:
                found.setdefault(m.group(2), doc)
    return found


def build_artefacts(build):
    """The files the Makefile's rules make under build, relative to it."""
    p = make("-pRrq", f"BUILD={build}", ":")
    out = set()
    for line in p.stdout.splitlines():
        m = re.match(r"^(\S+):(?![=:])", line)
        if m and m.group(1).startswith(build + "/"):
            rel = m.group(1)[len(build) + 1:]
            if not rel.startswith(("app/", "gen/")) and not rel.endswith((".o", ".d", ".h")) and "%" not in rel:
                out.add(rel)
    if f"{build}/tests/%" in p.stdout:
        out |= {"tests/" + os.path.basename(c)[:-2] for c in glob.glob(os.path.join(ROOT, "tests", "*.c"))}
    if f"{build}/tests/bench_%" in p.stdout:
        out |= {"tests/" + os.path.basename(c)[:-2]
                for c in glob.glob(os.path.join(ROOT, "loadtest", "bench_*.c"))}
    return out


def refers_to(text, rel):
    """Does a script's text refer to the build artefact rel?"""
    parts = r"\W{1,8}".join(re.escape(x) for x in rel.split("/"))
    if re.search(r"(?:build|BUILD)\W{1,8}" + parts + r"(?!\w|\.\w)", text):
        return True
    if rel == "seckill":
        return "SECKILL_BIN" in text
    return re.search(r"[\"']" + re.escape(os.path.basename(rel)) + r"[\"']", text) is not None


def run_sh_programs(args):
    """(needs the server, C programs, Python tests) that tests/run.sh runs
    with these arguments."""
    check = "--check" in args
    filters = [a for a in args if not a.startswith("-")]
    sel = (lambda name: not filters or any(f in name for f in filters))
    pg_only = re.search(r'^PG_C_TESTS="([^"]*)"', open(os.path.join(ROOT, "tests", "run.sh")).read(), re.M)
    pg_only = set(pg_only.group(1).split()) if pg_only else set()
    c = [os.path.basename(p)[:-2] for p in glob.glob(os.path.join(ROOT, "tests", "*.c"))]
    c = sorted(n for n in c if n.startswith(("test_", "unit_")) and sel(n) and not (check and n in pg_only))
    py = [] if check else sorted(p for p in glob.glob(os.path.join(ROOT, "tests", "test_*.py"))
                                 if sel(os.path.basename(p)))
    return not check, c, py


def command_uses(cmd, artefacts, fallback):
    """[(build artefact's absolute path, who uses it)] of one command of a
    dry run."""
    uses = []
    cmd = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", cmd)     # ${VAR:-default}: the default
    assigned = dict(re.findall(r"\b([A-Z][A-Z0-9_]*)=([^\s;'\"]+)", cmd))
    tokens = [t.strip("'\"") for t in re.split(r"[\s=;]+", cmd)]
    named = [t for t in tokens if any(t.endswith("/" + r) for r in artefacts)]
    for i, t in enumerate(tokens):
        if t in named and not (i and tokens[i - 1] == "-o"):
            uses.append((os.path.abspath(os.path.join(ROOT, t)), "the command"))
    # Where the scripts of this command look for the build.
    if "BUILD" in assigned:
        build = os.path.abspath(os.path.join(ROOT, assigned["BUILD"]))
    elif named:
        rel = next(r for r in artefacts if named[0].endswith("/" + r))
        build = os.path.abspath(os.path.join(ROOT, named[0][:-len(rel) - 1]))
    else:
        build = fallback
    for m in SCRIPT_RE.finditer(cmd):
        script = m.group(1)
        args = re.split(r"[;&|)]", cmd[m.end():], 1)[0].split()
        if (script, args[0] if args else "") in NO_ARTEFACTS or not os.path.isfile(os.path.join(ROOT, script)):
            continue
        if script == "tests/run.sh":
            server, c, py = run_sh_programs(args)
            if server:
                uses.append((os.path.join(build, "seckill"), script))
            uses += [(os.path.join(build, "tests", n), f"{script} (its {n})") for n in c]
            texts = [(f"{script} ({os.path.relpath(p, ROOT)})", open(p).read()) for p in py]
        else:
            texts = [(script, open(os.path.join(ROOT, script)).read())]
        for who, text in texts:
            uses += [(os.path.join(build, r), who) for r in sorted(artefacts) if refers_to(text, r)]
    for m in PACKAGE_RE.finditer(cmd):
        pkg = m.group(1)
        if os.path.isfile(os.path.join(ROOT, pkg, "__main__.py")):
            text = "".join(open(f).read() for f in sorted(glob.glob(os.path.join(ROOT, pkg, "*.py"))))
            uses += [(os.path.join(build, r), pkg) for r in sorted(artefacts) if refers_to(text, r)]
    return uses


def missing_prerequisites(target, build, artefacts):
    """[(path, who uses it)] that 'make target' uses and does not build, as
    its dry run from an empty BUILD shows."""
    p = make("-n", "-B", f"BUILD={build}", "SKIP_DEPS_CHECK=1", target)
    if p.returncode != 0:
        fail(f"make -n {target}: exit {p.returncode}: {p.stderr[-800:]}")
    commands = [c for c in p.stdout.replace("\\\n", " ").splitlines() if c.strip()]
    produced = {os.path.abspath(os.path.join(ROOT, f)) for c in commands for f in re.findall(r"\s-o\s+(\S+)", c)}
    missing = []
    for c in commands:
        for path, who in command_uses(c, artefacts, os.path.join(ROOT, "build")):
            if path not in produced and (path, who) not in missing:
                missing.append((path, who))
    return missing


@test
def documented_targets_build_what_they_use():
    targets = documented_targets()
    for t in ("all", "demo", "ladder", "bench", "test", "check", "faults", "stack"):
        if t not in targets:
            fail(f"README.md and docs/ no longer tell a reader to run make {t}? found {sorted(targets)}")
    bad = []
    with tempfile.TemporaryDirectory(dir=ss.TEST_TMP) as d:
        build = os.path.join(d, "build")
        artefacts = build_artefacts(build)
        if not {"seckill", "upstream200", "slow_fsync.so", "tests/unit_util"} <= artefacts:
            fail(f"the build artefacts found in make's database are incomplete: {sorted(artefacts)}")
        for t, doc in sorted(targets.items()):
            for path, who in missing_prerequisites(t, build, artefacts):
                bad.append(f"make {t} ({doc}): {who} uses {os.path.relpath(path, d) if path.startswith(d) else path},"
                           f" which make -n {t} does not build")
    print(f"    {len(targets)} targets: {' '.join(sorted(targets))}", flush=True)
    if bad:
        fail("targets that do not build what they use:\n  " + "\n  ".join(bad))


if __name__ == "__main__":
    if shutil.which("make") is None:
        print("make not found\n0 passed, 1 failed")
        sys.exit(1)
    ss.main()
