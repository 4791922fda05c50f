#!/usr/bin/env bash
# loadtest/ab_sale.sh [BASE_URL] -- a sale to REQUESTS distinct buyers with ab.
#
# Creates a voucher with STOCK units, then
#   ab -l -r -n REQUESTS -c CONCURRENCY -m POST BASE_URL/voucher/ID/seckill
# ab sends the very same request every time, so the target must run with
# DEMO_RANDOM_USER=1: a request without X-User-Id buys as a new random user.
# -l: success and sold-out bodies differ in length; without it ab counts every
# answer whose length differs from the first one as "failed".
# -m POST without -p sends a POST with no body, which is what the API wants.
#
# Environment: REQUESTS (5000), CONCURRENCY (200), STOCK (1000), VOUCHER_ID,
# ADMIN_TOKEN, PG_DSN, NGINX_ACCESS_LOG, LOADTEST_OUT, EXPECT_INSTANCES (see
# loadtest/lib.sh). Prints a table; exit 1 if an invariant is violated.
set -euo pipefail
LT_NAME=ab_sale  # used by lib.sh
# shellcheck disable=SC2034
# shellcheck source=loadtest/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

REQUESTS=${REQUESTS:-5000}
CONCURRENCY=${CONCURRENCY:-200}
STOCK=${STOCK:-1000}

lt_setup "$@"
lt_require ab
lt_require_demo_mode
voucher=$(lt_voucher "$STOCK" "ab sale")
lt_begin "$voucher" ab-sale
url="$BASE_URL/voucher/$voucher/seckill"
lt_log "ab -l -r -n $REQUESTS -c $CONCURRENCY -m POST $url"
rc=0
timeout 600 ab -l -r -s 30 -n "$REQUESTS" -c "$CONCURRENCY" -m POST "$url" \
    >"$LT_RUN_DIR/ab.txt" 2>&1 || rc=$?
if ((rc != 0)); then
    tail -n 20 "$LT_RUN_DIR/ab.txt" >&2
    lt_die "ab failed (exit $rc)"
fi
lt_report "ab sale" "$REQUESTS buyers (random users), $CONCURRENCY concurrent, stock $STOCK" \
    ab "$LT_RUN_DIR/ab.txt" "$voucher" "$LT_RUN_DIR"
