#!/usr/bin/env bash
# loadtest/demo.sh [BASE_URL] -- the demo's three runs and their tables.
#
#   1. ab sale   AB_REQUESTS buyers (random users), AB_CONCURRENCY at a time,
#                stock AB_STOCK                     (5000, 200, 1000)
#   2. wrk sale  WRK_DURATION at WRK_CONNECTIONS connections, a new user per
#                request, stock WRK_STOCK           (6s, 100, 5000)
#   3. ab storm  one user, STORM_REQUESTS attempts, STORM_CONCURRENCY at a
#                time, stock 100: exactly one order (2000, 100)
# then one summary row per run and the cluster's lock counters from /stats,
# and an HTML report of the runs (LT_OUT/report.html: latency percentiles and
# answers per second from the nginx access log, the invariants).
# The target is the local stack by default (make stack); see loadtest/lib.sh.
# Exit status 1 if any invariant is violated.
set -euo pipefail
# shellcheck source=loadtest/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

lt_setup "$@"
export BASE_URL ADMIN_TOKEN PG_DSN NGINX_ACCESS_LOG
export LOADTEST_OUT=$LT_OUT
unset VOUCHER_ID

instances=$(curl -fsS --max-time 5 "$BASE_URL/stats" | python3 -c '
import json, sys
s = json.load(sys.stdin)
print(", ".join(sorted(i.get("instance", "?") for i in s.get("instances", []))))' 2>/dev/null || echo "?")
printf '\nseckill demo against %s (instances: %s)\n' "$BASE_URL" "$instances"
printf 'Every run: a fresh voucher, a load, then the invariants checked in Postgres.\n'
printf 'Watch it live: %s/dashboard/\n' "$BASE_URL"

results=()
failed=0
run() {
    local name=$1; shift
    local result="$LT_OUT/$name.result.json"
    rm -f "$result"
    if ! env LOADTEST_RESULT="$result" "$@"; then
        failed=1
    fi
    [[ -f "$result" ]] && results+=("$result")
    return 0
}

run ab-sale env REQUESTS="${AB_REQUESTS:-5000}" CONCURRENCY="${AB_CONCURRENCY:-200}" \
    STOCK="${AB_STOCK:-1000}" "$LT_DIR/ab_sale.sh"
run wrk-sale env DURATION="${WRK_DURATION:-6s}" CONCURRENCY="${WRK_CONNECTIONS:-100}" \
    STOCK="${WRK_STOCK:-5000}" "$LT_DIR/wrk_sale.sh"
run ab-storm env REQUESTS="${STORM_REQUESTS:-2000}" CONCURRENCY="${STORM_CONCURRENCY:-100}" \
    STOCK=100 "$LT_DIR/ab_storm.sh"

printf '\n== summary (latency in ms; orders/s from the first to the last order in Postgres; per instance: requests served)\n'
if ((${#results[@]})); then
    python3 "$LT_DIR/report.py" summary "${results[@]}" || failed=1
fi

report="$LT_OUT/report.html"
if ((${#results[@]})) && python3 "$LT_DIR/report.py" html -o "$report" --title "seckill demo" "${results[@]}"; then
    printf '\n== report: %s (latency percentiles per second, answers by status, invariants)\n' "$report"
fi

printf '\n== the cluster, from %s/stats\n' "$BASE_URL"
curl -fsS --max-time 5 "$BASE_URL/stats" | python3 "$LT_DIR/report.py" cluster || true

if ((failed)); then
    printf '\nRESULT: an invariant was VIOLATED (see FAIL lines above)\n'
    exit 1
fi
printf '\nRESULT: no oversell, no user with two orders, no stock drift, every order id seen is in Postgres.\n'
