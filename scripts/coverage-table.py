#!/usr/bin/env python3
"""scripts/coverage-table.py SUMMARY.json -- make coverage's table.

Reads gcovr's --json-summary and prints one row per file (name order) with
its lines covered / total and branches covered / total, each with its
percentage, then the totals. Python 3 standard library only.
"""

import json
import sys


def pct(covered, total):
    return "-" if total == 0 else f"{100.0 * covered / total:.1f}"


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: scripts/coverage-table.py build/coverage/coverage-summary.json")
    with open(sys.argv[1]) as f:
        summary = json.load(f)
    rows = sorted(summary["files"], key=lambda r: r["filename"])
    width = max([len(r["filename"]) for r in rows] + [5])
    head = f"{'file':<{width}}  {'lines':>11}  {'line %':>6}  {'branches':>11}  {'branch %':>8}"
    print(head)
    print("-" * len(head))

    def row(name, r):
        print(f"{name:<{width}}  {r['line_covered']:>5}/{r['line_total']:<5}  "
              f"{pct(r['line_covered'], r['line_total']):>6}  "
              f"{r['branch_covered']:>5}/{r['branch_total']:<5}  "
              f"{pct(r['branch_covered'], r['branch_total']):>8}")

    for r in rows:
        row(r["filename"], r)
    print("-" * len(head))
    row("TOTAL", summary)


if __name__ == "__main__":
    main()
