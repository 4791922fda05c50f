#!/usr/bin/env python3
"""scripts/mutate.py: break the code on purpose, one mutation at a time, and
check that the tests named for each mutation fail (make mutate).

Reads tests/mutations.txt (its header describes the format). For each
mutation:

  1. copies the work tree (the files git tracks plus the untracked ones it
     does not ignore, so uncommitted edits count; no build/, .run/, .git) to
     a scratch directory, together with a build made once from the same
     tree (mtimes kept, so only what the mutation touches is rebuilt);
  2. applies the change: the search text must occur exactly once in the
     file, else the run stops before anything else is done;
  3. builds there (make -j2 all tests-bin, its own build/);
  4. runs only the mutation's tests with that copy's tests/run.sh, one
     program at a time (a Python program with TEST_ONLY=<function>; a C
     program whole), until one fails: the mutation is caught. None failing:
     it survived.

Prints a table (mutation, result, the test that caught it and its first
failure line, time) and exits 1 when a mutation survived or did not build.

Usage:
  scripts/mutate.py [NAME ...]        all mutations, or only these
  MUTATIONS=a,b scripts/mutate.py     the same subset through the environment
  options:
    --list            print the mutations and their tests, run nothing
    --check           only check that every search text applies (no build)
    --all-tests       run every named test, not only until the first catch
    --baseline        first run every named test on the unmutated copy: a
                      test that fails there proves nothing about a mutation
    --keep            keep each mutant's copy (build/mutate/<name>)
    --scratch DIR     scratch directory (default: build/mutate)
    --timeout S       seconds one test program may run (default 600)

Python 3 standard library only. Logs: <scratch>/logs/<mutation>.<test>.log;
the table also goes to <scratch>/results.txt.
"""

import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MUTATIONS_FILE = os.path.join(ROOT, "tests", "mutations.txt")
# C test programs that need Postgres: the others run in run.sh's fast tier
# (--check: Redis only), which saves starting a Postgres per run.
PG_C_TESTS = {"test_pg_lock", "test_store_batch"}


class Mutation:
    def __init__(self, name, lineno):
        self.name = name
        self.lineno = lineno
        self.file = None
        self.breaks = None
        self.tests = []
        self.search = None
        self.replace = None


def die(msg):
    print(f"mutate: {msg}", file=sys.stderr)
    sys.exit(2)


def parse(path):
    """The mutations of 'path', in file order."""
    muts, cur, block = [], None, None
    with open(path) as f:
        lines = f.read().split("\n")
    for no, line in enumerate(lines, 1):
        if block is not None and (line.startswith("| ") or line == "|"):
            block.append(line[2:])
            continue
        block = None
        if not line.strip() or line.startswith("#"):
            continue
        m = re.match(r"^\[([a-z0-9][a-z0-9-]*)\]$", line)
        if m:
            cur = Mutation(m.group(1), no)
            muts.append(cur)
            continue
        if cur is None:
            die(f"{path}:{no}: text before the first [name]")
        m = re.match(r"^(file|breaks|tests|search|replace):\s*(.*)$", line)
        if not m:
            die(f"{path}:{no}: cannot read {line!r}")
        key, val = m.group(1), m.group(2).strip()
        if key == "file":
            cur.file = val
        elif key == "breaks":
            cur.breaks = val
        elif key == "tests":
            cur.tests += val.split()
        else:
            if val:
                die(f"{path}:{no}: the {key} text goes on the lines below, each after '| '")
            block = []
            setattr(cur, key, block)
    seen = set()
    for mu in muts:
        where = f"{path}:{mu.lineno} [{mu.name}]"
        if mu.name in seen:
            die(f"{where}: the name is used twice")
        seen.add(mu.name)
        for k in ("file", "breaks", "search", "replace"):
            if getattr(mu, k) is None:
                die(f"{where}: no {k}")
        if not mu.tests:
            die(f"{where}: no tests")
        mu.search = "\n".join(mu.search)
        mu.replace = "\n".join(mu.replace)
        if not mu.search or mu.search == mu.replace:
            die(f"{where}: the search text is empty or the same as its replacement")
    return muts


def test_functions(pyfile):
    """The test functions of a Python test program: those under a decorator
    whose name says test (@test, @nginx_test)."""
    text = open(pyfile).read()
    return re.findall(r"^@\w*test\w*\s*\ndef\s+(\w+)\s*\(", text, re.M)


def check_tests(mu, root):
    """Each test spec names a program that exists and, for a Python program,
    exactly one of its test functions."""
    for spec in mu.tests:
        prog, _, fn = spec.partition(":")
        if prog.endswith(".py"):
            path = os.path.join(root, "tests", prog)
            if not os.path.isfile(path):
                die(f"[{mu.name}]: no test program tests/{prog}")
            if not fn:
                die(f"[{mu.name}]: {prog}: name one test function (program.py:function)")
            hits = [f for f in test_functions(path) if fn in f]
            if hits != [fn]:
                die(f"[{mu.name}]: TEST_ONLY={fn} selects {hits or 'nothing'} in {prog}, "
                    "not exactly that function")
        else:
            if fn:
                die(f"[{mu.name}]: {spec}: a C program runs whole (no :function)")
            if not os.path.isfile(os.path.join(root, "tests", prog + ".c")):
                die(f"[{mu.name}]: no test program tests/{prog}.c")


def apply(mu, root):
    """Applies the mutation to the tree at 'root'; dies unless the search text
    occurs exactly once."""
    path = os.path.join(root, mu.file)
    if not os.path.isfile(path):
        die(f"[{mu.name}]: no file {mu.file}")
    with open(path) as f:
        text = f.read()
    n = text.count(mu.search)
    if n != 1:
        die(f"[{mu.name}]: the search text occurs {n} times in {mu.file}, not once:\n"
            + "\n".join("    | " + s for s in mu.search.split("\n")))
    st = os.stat(path)
    with open(path, "w") as f:
        f.write(text.replace(mu.search, mu.replace))
    os.chmod(path, st.st_mode)


def tree_files():
    """What the copy holds: git's tracked files that exist and the untracked
    ones it does not ignore."""
    p = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "-co", "--exclude-standard"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        die(f"git ls-files failed: {p.stderr.strip()}")
    return sorted({f for f in p.stdout.split("\0") if f and os.path.lexists(os.path.join(ROOT, f))})


def copy_tree(files, dest):
    for rel in files:
        src, dst = os.path.join(ROOT, rel), os.path.join(dest, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(src, dst, follow_symlinks=False)


def build(root, log):
    """make -j2 all tests-bin in 'root' (its own build/). True when it built.
    GIT_DESCRIBE given: the copy is no checkout, and its version text must
    not follow the enclosing repository's state."""
    with open(log, "a") as out:
        out.write(f"\n==== make -j2 all tests-bin in {root}\n")
        out.flush()
        p = subprocess.run(["make", "--no-print-directory", "-j2", "BUILD=build",
                            "GIT_DESCRIBE=mutate", "all", "tests-bin"],
                           cwd=root, stdout=out, stderr=subprocess.STDOUT)
    return p.returncode == 0


def programs(root):
    """Every test program run.sh could select in the copy at 'root'."""
    names = [n for n in os.listdir(os.path.join(root, "build", "tests"))
             if re.match(r"^(unit|test)_\w+$", n)]
    names += [n for n in os.listdir(os.path.join(root, "tests"))
              if re.match(r"^test_\w+\.py$", n)]
    return names


def run_test(spec, root, log, timeout):
    """Runs one test spec with the copy's tests/run.sh. (failed, first
    failure line, seconds)."""
    prog, _, fn = spec.partition(":")
    env = dict(os.environ, BUILD="build", TEST_TIMEOUT=str(timeout))
    env.pop("TEST_EXCEPT", None)
    env.pop("KEEP_TMP", None)
    if fn:
        env["TEST_ONLY"] = fn
    else:
        env.pop("TEST_ONLY", None)
    # run.sh selects by substring: leave out the other programs whose name
    # contains this one's (test_lock: test_lock_wait, test_locks.py).
    env["TEST_SKIP"] = " ".join(n for n in programs(root) if prog in n and n != prog)
    cmd = [os.path.join(root, "tests", "run.sh")]
    if not prog.endswith(".py") and prog not in PG_C_TESTS:
        cmd.append("--check")
    cmd.append(prog)
    t0 = time.monotonic()
    with open(log, "w") as out:
        out.write(f"==== {' '.join(cmd)}  TEST_ONLY={fn or '-'}  TEST_SKIP={env['TEST_SKIP']}\n")
        out.flush()
        try:
            p = subprocess.run(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                               timeout=timeout + 120)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            rc = 124
    secs = time.monotonic() - t0
    first = ""
    with open(log, errors="replace") as f:
        text = f.read()
    m = re.search(r"^FAIL - .*$", text, re.M) or \
        re.search(r"^run\.sh: .*(?:timed out|counted as 1 failed|error:).*$", text, re.M)
    if m:
        first = m.group(0)
    elif rc == 124:
        first = "timed out"
    ran = re.search(r"^\d+ passed, \d+ failed$", text, re.M)
    if rc == 0 and not ran:
        rc, first = 1, "no 'N passed, M failed' line"
    return rc != 0, first, secs


def fmt_time(s):
    return f"{int(s) // 60}:{int(s) % 60:02d}"


def table(rows):
    """rows: (name, result, caught by, detail, seconds)."""
    head = ("mutation", "result", "caught by", "time")
    w0 = max([len(head[0])] + [len(r[0]) for r in rows])
    w1 = max([len(head[1])] + [len(r[1]) for r in rows])
    w2 = max([len(head[2])] + [len(r[2]) for r in rows])
    out = [f"{head[0]:<{w0}}  {head[1]:<{w1}}  {head[2]:<{w2}}  {head[3]:>5}"]
    for name, result, by, _detail, secs in rows:
        out.append(f"{name:<{w0}}  {result:<{w1}}  {by:<{w2}}  {fmt_time(secs):>5}")
    return "\n".join(out)


def main(argv):
    opts = {"list": False, "check": False, "all-tests": False, "baseline": False, "keep": False}
    scratch = os.path.join(ROOT, "build", "mutate")
    timeout = 600
    names = []
    args = list(argv)
    while args:
        a = args.pop(0)
        if a in ("-h", "--help"):
            print(__doc__.strip())
            return 0
        if a.startswith("--") and a[2:] in opts:
            opts[a[2:]] = True
        elif a == "--scratch" and args:
            scratch = os.path.abspath(args.pop(0))
        elif a == "--timeout" and args:
            timeout = int(args.pop(0))
        elif a.startswith("-"):
            die(f"unknown option {a} (--help)")
        else:
            names.append(a)
    names += [n for n in os.environ.get("MUTATIONS", "").replace(",", " ").split() if n]

    muts = parse(MUTATIONS_FILE)
    if names:
        known = {m.name for m in muts}
        unknown = [n for n in names if n not in known]
        if unknown:
            die(f"no such mutation: {', '.join(unknown)} (--list)")
        muts = [m for m in muts if m.name in names]
    for mu in muts:
        check_tests(mu, ROOT)
    if opts["list"]:
        for mu in muts:
            print(f"{mu.name}: {mu.file}\n    breaks: {mu.breaks}\n    tests: {' '.join(mu.tests)}")
        print(f"{len(muts)} mutations")
        return 0

    # Every mutation must apply before anything is built: on a copy of the
    # file's text, exactly as it will be applied to the scratch tree.
    files = tree_files()
    probe = os.path.join(scratch, "probe")
    shutil.rmtree(probe, ignore_errors=True)
    for mu in muts:
        os.makedirs(os.path.dirname(os.path.join(probe, mu.file)), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, mu.file), os.path.join(probe, mu.file))
        apply(mu, probe)
        shutil.rmtree(probe)
    if opts["check"]:
        print(f"{len(muts)} mutations apply")
        return 0

    logs = os.path.join(scratch, "logs")
    base = os.path.join(scratch, "base")
    os.makedirs(logs, exist_ok=True)
    print(f"mutate: {len(muts)} mutations; copy of {len(files)} files, building it in {base}",
          flush=True)
    t0 = time.monotonic()
    shutil.rmtree(base, ignore_errors=True)
    copy_tree(files, base)
    if not build(base, os.path.join(logs, "base.build.log")):
        die(f"the unmutated copy does not build: {os.path.join(logs, 'base.build.log')}")
    print(f"mutate: base built in {fmt_time(time.monotonic() - t0)}", flush=True)

    if opts["baseline"]:
        specs = []
        for mu in muts:
            specs += [s for s in mu.tests if s not in specs]
        bad = []
        for spec in specs:
            failed, first, secs = run_test(spec, base,
                                           os.path.join(logs, "baseline." + spec.replace(":", ".") + ".log"),
                                           timeout)
            print(f"baseline {spec}: {'FAILED ' + first if failed else 'passed'} ({fmt_time(secs)})",
                  flush=True)
            if failed:
                bad.append(spec)
        if bad:
            die(f"these tests fail without any mutation: {' '.join(bad)}")

    rows = []
    for k, mu in enumerate(muts, 1):
        print(f"\n== [{k}/{len(muts)}] {mu.name}: {mu.file} -- {mu.breaks}", flush=True)
        t1 = time.monotonic()
        tree = os.path.join(scratch, mu.name)
        shutil.rmtree(tree, ignore_errors=True)
        shutil.copytree(base, tree, symlinks=True)
        apply(mu, tree)
        blog = os.path.join(logs, f"{mu.name}.build.log")
        if os.path.exists(blog):
            os.remove(blog)
        if not build(tree, blog):
            rows.append((mu.name, "NO BUILD", "-", f"see {blog}", time.monotonic() - t1))
            print(f"   does not build: {blog}", flush=True)
            if not opts["keep"]:
                shutil.rmtree(tree, ignore_errors=True)
            continue
        caught = []
        for spec in mu.tests:
            log = os.path.join(logs, f"{mu.name}.{spec.replace(':', '.')}.log")
            failed, first, secs = run_test(spec, tree, log, timeout)
            print(f"   {spec}: {'FAILED (caught): ' + first if failed else 'passed'} "
                  f"({fmt_time(secs)})", flush=True)
            if failed:
                caught.append((spec, first))
                if not opts["all-tests"]:
                    break
        secs = time.monotonic() - t1
        if caught:
            rows.append((mu.name, "caught", " ".join(s for s, _ in caught),
                         caught[0][1], secs))
        else:
            rows.append((mu.name, "SURVIVED", "-", "passed: " + " ".join(mu.tests), secs))
        if not opts["keep"]:
            shutil.rmtree(tree, ignore_errors=True)

    text = table(rows)
    survived = [r[0] for r in rows if r[1] != "caught"]
    summary = (f"{len(rows)} mutations: {len(rows) - len(survived)} caught, "
               f"{len(survived)} not ({' '.join(survived) or 'none'}); "
               f"{fmt_time(time.monotonic() - t0)} in all")
    details = "\n".join(f"{r[0]}: {r[3]}" for r in rows)
    with open(os.path.join(scratch, "results.txt"), "w") as f:
        f.write(text + "\n\n" + summary + "\n\nfirst failure line of each:\n" + details + "\n")
    print("\n" + text + "\n\n" + summary)
    print(f"first failure lines: {os.path.join(scratch, 'results.txt')}")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
