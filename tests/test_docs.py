#!/usr/bin/env python3
"""The documentation: README.md and docs/*.md.

- README.md has at most 200 lines and names the test command `make test`,
  which .ci/run runs;
- every relative link (and image) in README.md and docs/*.md points to a file
  that exists, and a link to a heading of a Markdown page finds that heading;
- every page of docs/ is linked from the README's docs index and starts with a
  title and a one-line summary;
- no page refers to documents outside the repository or to work sessions;
- every environment variable the server reads (app/core/config.c's option table
  and any getenv() in app/) appears in docs/configuration.md.
Needs no service. Prints "N passed, M failed". Python 3 standard library only.
"""

import glob
import os
import re
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")
README_MAX_LINES = 200

# Phrases that point outside the repository or at how it was made.
FORBIDDEN = re.compile(
    r"\b(this|next|last|previous|sixth|fifth|first) session\b|seed notes|\bthe seeds?\b"
    r"|SPEC\.md|\.\./shared|/work/shared|\bissue \d+|\bthe issue\b",
    re.IGNORECASE)
# SPEC is only a reference in capitals; "spec" in lower case is an ordinary word.
FORBIDDEN_CASE = re.compile(r"\bSPEC\b")

_tests = []


def test(fn):
    _tests.append(fn)
    return fn


def fail(msg):
    raise AssertionError(msg)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def pages():
    """README.md and docs/*.md, as absolute paths."""
    return [README] + sorted(glob.glob(os.path.join(DOCS, "*.md")))


def rel(path):
    return os.path.relpath(path, ROOT)


def strip_code(text):
    """The text without fenced code blocks and inline code spans (links in them
    are examples, not links)."""
    text = re.sub(r"^```.*?^```[ \t]*$", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def links(text):
    return LINK.findall(strip_code(text))


def slug(heading):
    """GitHub's anchor of a heading: lower case, code marks and punctuation
    dropped, spaces to hyphens."""
    h = heading.strip().lower().replace("`", "")
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors(path):
    text = re.sub(r"^```.*?^```[ \t]*$", "", read(path), flags=re.S | re.M)
    return {slug(m) for m in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.M)}


def broken_links(path, text):
    """[(target, why)] for every relative link of TEXT (the page PATH) that
    does not resolve."""
    bad = []
    base = os.path.dirname(path)
    for target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):     # http:, https:, mailto:
            continue
        file_part, _, frag = target.partition("#")
        dest = path if file_part == "" else os.path.normpath(os.path.join(base, file_part))
        if not os.path.exists(dest):
            bad.append((target, "no such file"))
            continue
        if frag and dest.endswith(".md") and frag not in anchors(dest):
            bad.append((target, f"no heading #{frag} in {rel(dest)}"))
    return bad


# ---------------------------------------------------------------- tests

@test
def readme_is_at_most_200_lines():
    n = len(read(README).splitlines())
    if n > README_MAX_LINES:
        fail(f"README.md has {n} lines, at most {README_MAX_LINES}")


@test
def readme_names_the_test_command_that_ci_runs():
    text = read(README)
    if not re.search(r"^make test\b", text, re.M):
        fail("README.md has no line starting with 'make test'")
    ci = read(os.path.join(ROOT, ".ci", "run"))
    if not re.search(r"^make test\s*$", ci, re.M):
        fail(".ci/run does not run 'make test'")


@test
def link_checker_sees_a_broken_link():
    # The checker itself: a missing file, a missing heading and a good link.
    text = ("[a](no-such-file.md) `[b](in-code.md)` [c](README.md) "
            "[d](README.md#no-such-heading) ![e](docs/img/ladder.png) [f](https://x.example/y)\n"
            "```\n[g](in-a-block.md)\n```\n")
    got = broken_links(README, text)
    want = [("no-such-file.md", "no such file"),
            ("README.md#no-such-heading", "no heading #no-such-heading in README.md")]
    if got != want:
        fail(f"broken_links found {got}, expected {want}")
    if slug("`batched`: group commit") != "batched-group-commit":
        fail(f"slug: {slug('`batched`: group commit')!r}")


@test
def relative_links_resolve():
    bad = []
    for path in pages():
        for target, why in broken_links(path, read(path)):
            bad.append(f"{rel(path)}: {target} ({why})")
    if bad:
        fail("broken links:\n    " + "\n    ".join(bad))


@test
def every_docs_page_is_in_the_readme_index():
    targets = {os.path.normpath(t.partition("#")[0]) for t in links(read(README))}
    missing = [rel(p) for p in glob.glob(os.path.join(DOCS, "*.md")) if rel(p) not in targets]
    if missing:
        fail(f"not linked from README.md: {missing}")
    if len(glob.glob(os.path.join(DOCS, "*.md"))) < 8:
        fail("docs/ has fewer than 8 pages")


@test
def every_docs_page_starts_with_a_title_and_a_summary():
    bad = []
    for path in sorted(glob.glob(os.path.join(DOCS, "*.md"))):
        lines = [ln for ln in read(path).splitlines()]
        if not lines or not lines[0].startswith("# "):
            bad.append(f"{rel(path)}: first line is not a '# ' title")
            continue
        rest = [ln for ln in lines[1:] if ln.strip()]
        if not rest or rest[0].startswith(("#", "|", "```", "-", "!")):
            bad.append(f"{rel(path)}: no summary sentence after the title")
    if bad:
        fail("; ".join(bad))


@test
def no_references_outside_the_repository():
    hits = []
    for path in pages():
        for no, line in enumerate(read(path).splitlines(), 1):
            m = FORBIDDEN.search(line) or FORBIDDEN_CASE.search(line)
            if m:
                hits.append(f"{rel(path)}:{no}: {m.group(0)!r}")
    if hits:
        fail("forbidden phrases:\n    " + "\n    ".join(hits))
    if not FORBIDDEN.search("as the seed notes say") or not FORBIDDEN.search("the sixth session"):
        fail("the forbidden-phrase pattern misses a known phrase")


def server_env_vars():
    names = set()
    for path in glob.glob(os.path.join(ROOT, "app", "**", "*.c"), recursive=True):
        text = read(path)
        names.update(re.findall(r'\b(?:INT|LONG|LEASE|BOOL|LEVEL|ENUM|STR|SECRET)\(\s*'
                                r'"([A-Z][A-Z0-9_]*)",\s*"[a-z0-9-]+",', text))
        names.update(re.findall(r'getenv\(\s*"([A-Z][A-Z0-9_]*)"\s*\)', text))
    return names


@test
def every_server_setting_is_documented():
    names = server_env_vars()
    if len(names) < 20 or "PG_DSN" not in names or "SECKILL_STOCK" not in names:
        fail(f"read only {sorted(names)} from app/: the option table's format changed?")
    conf = read(os.path.join(DOCS, "configuration.md"))
    missing = sorted(n for n in names if f"`{n}`" not in conf)
    if missing:
        fail(f"not in docs/configuration.md: {missing}")


@test
def every_module_has_its_row_in_the_architecture_page():
    """docs/architecture.md's module table names every module of app/LAYERS
    with its layer: a module added, moved or renamed without its row fails."""
    want = {}
    with open(os.path.join(ROOT, "app", "LAYERS"), encoding="utf-8") as f:
        for line in f:
            fields = line.split("#")[0].split()
            for m in fields[2:]:
                want[m] = fields[0]
    if len(want) < 40:
        fail(f"read only {len(want)} modules from app/LAYERS: its format changed?")
    page = read(os.path.join(DOCS, "architecture.md"))
    rows = dict((m, l) for l, m in re.findall(r"^\| (\d) \| `([a-z_]+)` \|", page, re.M))
    wrong = sorted(f"{m} (layer {l}, row says {rows.get(m)})" for m, l in want.items()
                   if rows.get(m) != l)
    if wrong:
        fail(f"docs/architecture.md's module table: {wrong}")


@test
def ladder_chart_is_a_png():
    path = os.path.join(DOCS, "img", "ladder.png")
    with open(path, "rb") as f:
        if f.read(8) != b"\x89PNG\r\n\x1a\n":
            fail(f"{rel(path)} is not a PNG")


def main():
    only = os.environ.get("TEST_ONLY", "")
    passed = failed = 0
    for fn in _tests:
        if only and only not in fn.__name__:
            continue
        try:
            fn()
        except AssertionError as e:
            failed += 1
            print(f"FAIL - {fn.__name__}: {e}", flush=True)
            continue
        except Exception as e:  # a crash of the checker is a failure too
            failed += 1
            tb = traceback.format_exc().rstrip().replace("\n", "\n    ")
            print(f"FAIL - {fn.__name__}: {type(e).__name__}: {e}\n    {tb}", flush=True)
            continue
        passed += 1
        print(f"ok - {fn.__name__}", flush=True)
    print(f"{passed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
