#!/usr/bin/env bash
# loadtest/ab_sale.sh [BASE_URL] -- a sale to REQUESTS distinct buyers with ab.
#
# Creates a voucher with STOCK units, then
#   ab -l -r -n REQUESTS -c CONCURRENCY -m POST BASE_URL/voucher/ID/seckill
# ab sends the very same request every time, so the target must run with
# DEMO_RANDOM_USER=1: a request without X-User-Id buys as a new random user.
# (-l and -m POST: see lt_ab in loadtest/lib.sh.)
#
# Environment: REQUESTS (5000), CONCURRENCY (200), STOCK (1000), VOUCHER_ID,
# ADMIN_TOKEN, PG_DSN, NGINX_ACCESS_LOG, LOADTEST_OUT, EXPECT_INSTANCES (see
# loadtest/lib.sh). Prints a table; exit 1 if an invariant is violated.
set -euo pipefail
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
lt_ab "$BASE_URL/voucher/$voucher/seckill"
lt_report "ab sale" "$REQUESTS buyers (random users), $CONCURRENCY concurrent, stock $STOCK" \
    ab "$LT_RUN_DIR/ab.txt" "$voucher" "$LT_RUN_DIR"
