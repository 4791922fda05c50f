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
- a script a recipe runs by its path is executable.
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
    deps = " ".join(rules.get("deps", [])).split()
    if "deps-npm" not in deps:
        fail(f"make deps should include deps-npm: {deps}")


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
        # As root (id -u prints 0): make deps installs exactly what is missing.
        fake_bin(d, "id", 'if [ "$1" = -u ]; then echo 0; else exec /usr/bin/id "$@"; fi\n')
        p = make("deps-check", f"DEB_PKGS={pkgs}", env=env)
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
        p = make("deps-check", f"DEB_PKGS={pkgs}", env=env)
        if p.returncode == 0 or os.path.exists(log):
            fail(f"not root: deps-check must fail without installing: exit {p.returncode}")
        if "sudo make deps" not in p.stderr or "seckill-no-such-package" not in p.stderr:
            fail(f"not root: deps-check should say what to run: {p.stderr!r}")
        # SKIP_DEPS_CHECK=1: not checked at all.
        p = make("deps-check", f"DEB_PKGS={pkgs}", "SKIP_DEPS_CHECK=1", env=env)
        if p.returncode != 0:
            fail(f"SKIP_DEPS_CHECK=1 should skip the check: {p.stderr!r}")


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
    objs = glob.glob(os.path.join(build, "app", "*.o"))
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
    want = ["unit_expo", "unit_route"]
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


if __name__ == "__main__":
    if shutil.which("make") is None:
        print("make not found\n0 passed, 1 failed")
        sys.exit(1)
    ss.main()
