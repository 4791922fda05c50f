#!/usr/bin/env bash
# loadtest/wrk_sale.sh [BASE_URL] -- a sale to distinct buyers with wrk.
#
# Creates a voucher with STOCK units, then for DURATION
#   wrk -t WRK_THREADS -c CONCURRENCY -d DURATION --latency -s loadtest/wrk_sale.lua URL
# The Lua script gives every request its own X-User-Id (unique across wrk
# threads and connections) and records the orderId of every 200; the checker
# then verifies that each of them exists in Postgres.
#
# Environment: DURATION (5s), CONCURRENCY (100), WRK_THREADS (2), STOCK (2000),
# VOUCHER_ID, ADMIN_TOKEN, PG_DSN, NGINX_ACCESS_LOG, LOADTEST_OUT,
# EXPECT_INSTANCES (see loadtest/lib.sh). Prints a table; exit 1 if an
# invariant is violated.
set -euo pipefail
# shellcheck source=loadtest/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DURATION=${DURATION:-5s}
CONCURRENCY=${CONCURRENCY:-100}
WRK_THREADS=${WRK_THREADS:-2}
STOCK=${STOCK:-2000}

lt_setup "$@"
lt_require wrk
voucher=$(lt_voucher "$STOCK" "wrk sale")
lt_begin "$voucher" wrk-sale
url="$BASE_URL/voucher/$voucher/seckill"
lt_log "wrk -t$WRK_THREADS -c$CONCURRENCY -d$DURATION --latency -s loadtest/wrk_sale.lua $url"
rc=0
WRK_IDS_FILE="$LT_RUN_DIR/order-ids.txt" WRK_SUMMARY="$LT_RUN_DIR/wrk-summary.json" \
    WRK_USER_BASE=${WRK_USER_BASE:-$((1000000000 + (RANDOM % 1000) * 1000000000))} \
    timeout 600 wrk -t "$WRK_THREADS" -c "$CONCURRENCY" -d "$DURATION" --timeout 10s --latency \
    -s "$LT_DIR/wrk_sale.lua" "$url" >"$LT_RUN_DIR/wrk.txt" 2>&1 || rc=$?
if ((rc != 0)) || [[ ! -s "$LT_RUN_DIR/wrk-summary.json" ]]; then
    tail -n 20 "$LT_RUN_DIR/wrk.txt" >&2
    lt_die "wrk failed (exit $rc)"
fi
lt_report "wrk sale" "$DURATION at $CONCURRENCY connections ($WRK_THREADS threads), distinct users, stock $STOCK" \
    wrk "$LT_RUN_DIR/wrk.txt" "$voucher" "$LT_RUN_DIR" \
    --wrk-summary "$LT_RUN_DIR/wrk-summary.json" --ids "$LT_RUN_DIR/order-ids.txt"
