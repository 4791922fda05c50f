#!/usr/bin/env python3
"""Checks a sale's invariants directly in Postgres (with psql), not via /stats.

  loadtest/check_invariants.py --voucher ID [--voucher ID ...] [--dsn DSN]
      [--ids FILE] [--expect-orders N] [--ok-responses N]

For every voucher:
  - orders <= initial stock                      (no oversell)
  - stock >= 0
  - no user has two orders for the voucher       (one order per user)
  - (initial stock - stock) - orders = 0         (no lost or phantom update)
  - with --expect-orders N: exactly N orders     (e.g. 1 for a single-user storm)
  - with --ok-responses N: exactly N orders, N being the 200s clients saw
    (every 200 is a real order, every order was answered with a 200); with
    --unknown-responses U (answers whose outcome is unknown: 499, 502, 504)
    N <= orders <= N + U
With --ids FILE (one order id a line, as clients saw them in 200 answers; the
first --voucher is the one they bought):
  - no order id was handed out twice
  - every one exists in tb_voucher_order, for that voucher

--dsn defaults to $PG_DSN (a libpq connection string or URI). Exit status:
0 all invariants hold, 1 a violation (each printed as FAIL with the numbers),
2 usage or connection error. Python 3 standard library only.
"""

import argparse
import os
import sys

sys.dont_write_bytecode = True          # no __pycache__ in loadtest/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kit  # noqa: E402


class CheckError(kit.KitError):
    """The voucher does not exist or an order id is malformed (psql failing
    raises kit.KitError, of which this is one: exit status 2)."""


def read_ids(path):
    ids = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            s = line.strip()
            if not s:
                continue
            if not s.isdigit() or len(s) > 19 or int(s) > 9223372036854775807:
                raise CheckError(f"{path}:{n}: not an order id: {s!r}")
            ids.append(s)
    return ids


def voucher_facts(dsn, voucher):
    rows = kit.psql(dsn, f"""
        SELECT v.initial_stock, v.stock,
               (SELECT count(*) FROM tb_voucher_order o WHERE o.voucher_id = v.voucher_id),
               (SELECT count(*) FROM (SELECT 1 FROM tb_voucher_order o
                                       WHERE o.voucher_id = v.voucher_id
                                       GROUP BY o.user_id HAVING count(*) > 1) d),
               (SELECT coalesce(max(c), 0) FROM (SELECT count(*) AS c FROM tb_voucher_order o
                                       WHERE o.voucher_id = v.voucher_id
                                       GROUP BY o.user_id) m),
               (SELECT coalesce(extract(epoch FROM max(create_time) - min(create_time)), 0)
                  FROM tb_voucher_order o WHERE o.voucher_id = v.voucher_id)
          FROM tb_voucher v WHERE v.voucher_id = {int(voucher)};
    """)
    if not rows:
        raise CheckError(f"voucher {voucher} does not exist in tb_voucher")
    r = rows[0]
    initial, stock, orders, dup_users, max_per_user = (int(x) for x in r[:5])
    return {
        "voucherId": int(voucher),
        "initialStock": initial,
        "stock": stock,
        "orders": orders,
        "oversold": max(0, orders - initial),
        "duplicateUsers": dup_users,
        "maxOrdersPerUser": max_per_user,
        "stockDrift": (initial - stock) - orders,
        "orderSpanSeconds": float(r[5]),
    }


def ids_facts(dsn, voucher, ids):
    """How many of the ids are missing in the DB or belong to another voucher."""
    facts = {"idsSeen": len(ids), "idsDistinct": len(set(ids)), "idsMissing": 0,
             "idsOtherVoucher": 0, "idsMissingExamples": []}
    if not ids:
        return facts
    # One statement on stdin: the array literal can be long.
    arr = "{" + ",".join(sorted(set(ids))) + "}"
    rows = kit.psql(dsn, f"""
        WITH seen(id) AS (SELECT unnest('{arr}'::bigint[]))
        SELECT (SELECT count(*) FROM seen s
                  WHERE NOT EXISTS (SELECT 1 FROM tb_voucher_order o WHERE o.id = s.id)),
               (SELECT count(*) FROM seen s JOIN tb_voucher_order o ON o.id = s.id
                  WHERE o.voucher_id <> {int(voucher)}),
               (SELECT coalesce(string_agg(id::text, ' '), '') FROM
                   (SELECT s.id FROM seen s
                     WHERE NOT EXISTS (SELECT 1 FROM tb_voucher_order o WHERE o.id = s.id)
                     ORDER BY s.id LIMIT 5) x);
    """)
    missing, other, examples = rows[0][0], rows[0][1], rows[0][2] if len(rows[0]) > 2 else ""
    facts["idsMissing"] = int(missing)
    facts["idsOtherVoucher"] = int(other)
    facts["idsMissingExamples"] = examples.split()
    return facts


def check(dsn, vouchers, ids=None, expect_orders=None, ok_responses=None,
          unknown_responses=None):
    """Returns (facts per voucher, [(ok, message)]). Raises kit.KitError.

    ok_responses: 200 answers sent; unknown_responses: answers whose outcome
    the client could not learn (nginx 499: client gone; 502/504 after the
    request reached an instance): each may or may not have bought."""
    results = []
    all_facts = []
    for i, v in enumerate(vouchers):
        f = voucher_facts(dsn, v)
        all_facts.append(f)
        tag = f"voucher {v}:"
        results.append((f["orders"] <= f["initialStock"],
                        f"{tag} orders <= initial stock ({f['orders']} <= {f['initialStock']})"
                        + ("" if f["orders"] <= f["initialStock"]
                           else f": OVERSOLD by {f['orders'] - f['initialStock']}")))
        results.append((f["stock"] >= 0, f"{tag} stock >= 0 (stock {f['stock']})"))
        results.append((f["duplicateUsers"] == 0,
                        f"{tag} no user with two orders ({f['duplicateUsers']} users with more"
                        f" than one; at most {f['maxOrdersPerUser']} per user)"))
        results.append((f["stockDrift"] == 0,
                        f"{tag} stock drift (initial - stock) - orders = 0"
                        f" (({f['initialStock']} - {f['stock']}) - {f['orders']}"
                        f" = {f['stockDrift']})"))
        if i == 0 and expect_orders is not None:
            results.append((f["orders"] == expect_orders,
                            f"{tag} exactly {expect_orders} order(s) (found {f['orders']})"))
        if i == 0 and ok_responses is not None:
            u = unknown_responses or 0
            if u:
                good = ok_responses <= f["orders"] <= ok_responses + u
                rel = (f"200 answers <= orders <= 200 answers + answers of unknown outcome"
                       f" ({ok_responses} <= {f['orders']} <= {ok_responses} + {u})")
            else:
                good = f["orders"] == ok_responses
                rel = (f"orders = 200 answers ({f['orders']} orders,"
                       f" {ok_responses} answers with 200)")
            results.append((good, f"{tag} {rel}"))
        if i == 0 and ids is not None:
            idf = ids_facts(dsn, v, ids)
            f.update(idf)
            results.append((idf["idsDistinct"] == idf["idsSeen"],
                            f"{tag} no order id handed out twice ({idf['idsSeen']} ids seen,"
                            f" {idf['idsDistinct']} distinct)"))
            ex = ", ".join(idf["idsMissingExamples"])
            results.append((idf["idsMissing"] == 0,
                            f"{tag} every order id seen with a 200 is in tb_voucher_order"
                            f" ({idf['idsDistinct']} ids, {idf['idsMissing']} missing"
                            + (f", e.g. {ex}" if ex else "") + ")"))
            results.append((idf["idsOtherVoucher"] == 0,
                            f"{tag} every order id seen belongs to this voucher"
                            f" ({idf['idsOtherVoucher']} belong to another)"))
    return all_facts, results


def verify(dsn, vouchers, ids_path=None, expect_orders=None, ok_responses=None,
           unknown_responses=0, quiet=False):
    """The command line's work for a caller in Python: (exit status, the
    lines it prints on stdout, the error it prints on stderr or None)."""
    try:
        ids = read_ids(ids_path) if ids_path else None
        _facts, results = check(dsn, vouchers, ids, expect_orders, ok_responses,
                                unknown_responses)
    except (kit.KitError, OSError) as e:
        return 2, [], f"check_invariants: error: {e}"
    lines = [f"FAIL {m}" if not ok else f"ok   {m}" for ok, m in results if not (ok and quiet)]
    bad = sum(1 for ok, _m in results if not ok)
    if bad:
        lines.append(f"check_invariants: {bad} invariant(s) violated")
        return 1, lines, None
    if not quiet:
        lines.append(f"check_invariants: all {len(results)} checks hold")
    return 0, lines, None


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Verify a sale's invariants in Postgres (exit 1 on any violation).")
    ap.add_argument("--dsn", default=os.environ.get("PG_DSN", ""),
                    help="libpq connection string or URI (default $PG_DSN)")
    ap.add_argument("--voucher", type=int, action="append", required=True,
                    help="voucher id (repeatable)")
    ap.add_argument("--ids", help="file of order ids seen with 200, one a line (first voucher)")
    ap.add_argument("--expect-orders", type=int, help="exactly this many orders (first voucher)")
    ap.add_argument("--ok-responses", type=int,
                    help="number of 200 answers clients saw: orders must equal it")
    ap.add_argument("--unknown-responses", type=int, default=0,
                    help="answers of unknown outcome (client gone, 502/504): orders may"
                         " exceed --ok-responses by at most this many")
    ap.add_argument("-q", "--quiet", action="store_true", help="print violations only")
    a = ap.parse_args(argv)
    if not a.dsn:
        print("check_invariants: no --dsn and no PG_DSN", file=sys.stderr)
        return 2
    rc, lines, error = verify(a.dsn, a.voucher, a.ids, a.expect_orders, a.ok_responses,
                              a.unknown_responses, a.quiet)
    for line in lines:
        print(line)
    if error:
        print(error, file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
