#!/usr/bin/env bash
# loadtest/ab_storm.sh [BASE_URL] -- one user, REQUESTS concurrent attempts.
#
# Creates a voucher with STOCK units, then
#   ab -l -r -n REQUESTS -c CONCURRENCY -m POST -H 'X-User-Id: U' URL
# Exactly one order must exist afterwards: the per-user lock turns concurrent
# attempts away (409 already_ordered), the order check and the unique key the
# later ones.
#
# Environment: REQUESTS (2000), CONCURRENCY (100), STOCK (100), STORM_USER
# (a random id), VOUCHER_ID, ADMIN_TOKEN, PG_DSN, NGINX_ACCESS_LOG,
# LOADTEST_OUT, EXPECT_INSTANCES (see loadtest/lib.sh). Prints a table; exit 1
# if an invariant is violated.
set -euo pipefail
# shellcheck source=loadtest/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

REQUESTS=${REQUESTS:-2000}
CONCURRENCY=${CONCURRENCY:-100}
STOCK=${STOCK:-100}
STORM_USER=${STORM_USER:-$((7000000000 + RANDOM * 32768 + RANDOM))}

lt_setup "$@"
lt_require ab
voucher=$(lt_voucher "$STOCK" "ab storm")
lt_begin "$voucher" ab-storm
lt_ab "$BASE_URL/voucher/$voucher/seckill" "$STORM_USER"
lt_report "ab storm" "user $STORM_USER x $REQUESTS, $CONCURRENCY concurrent, stock $STOCK: expect exactly 1 order" \
    ab "$LT_RUN_DIR/ab.txt" "$voucher" "$LT_RUN_DIR" --expect-orders 1
