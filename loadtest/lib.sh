# loadtest/lib.sh -- sourced by the load-test scripts; not run on its own.
# shellcheck shell=bash disable=SC2034
#
# Target resolution (lt_setup): BASE_URL is the first argument, else $BASE_URL,
# else the local stack's env file (${RUN_DIR:-<repo>/.run}/stack.env). The
# local stack's ADMIN_TOKEN, PG_DSN and nginx access log are taken from that
# file only when the target is the local stack; for another deployment set
# ADMIN_TOKEN (or VOUCHER_ID of a fresh voucher), PG_DSN (for the Postgres
# checks) and NGINX_ACCESS_LOG (a readable copy of nginx's log, optional).

LT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LT_ROOT="$(dirname "$LT_DIR")"
# The messages' prefix: the script's name (ab_sale for loadtest/ab_sale.sh).
LT_NAME=$(basename "$0" .sh)

lt_log() { printf '%s: %s\n' "${LT_NAME:-loadtest}" "$*" >&2; }
lt_die() { printf '%s: error: %s\n' "${LT_NAME:-loadtest}" "$*" >&2; exit 2; }

lt_require() {
    local c
    for c in "$@"; do
        command -v "$c" >/dev/null 2>&1 || lt_die "'$c' not found (run 'make deps')"
    done
}

# Fills BASE_URL, ADMIN_TOKEN, PG_DSN, NGINX_ACCESS_LOG and LT_OUT.
lt_setup() {
    lt_require curl python3
    local env_file="${RUN_DIR:-$LT_ROOT/.run}/stack.env" arg=${1:-}
    local f_base="" f_token="" f_dsn="" f_log="" f_run=""
    if [[ -f "$env_file" ]]; then
        eval "$(
            # shellcheck disable=SC1090
            . "$env_file"
            printf 'f_base=%q f_token=%q f_dsn=%q f_log=%q f_run=%q\n' \
                "${BASE_URL:-}" "${ADMIN_TOKEN:-}" "${PG_DSN:-}" "${NGINX_ACCESS_LOG:-}" "${RUN_DIR:-}"
        )"
    fi
    BASE_URL=${arg:-${BASE_URL:-$f_base}}
    BASE_URL=${BASE_URL%/}
    [[ -n "$BASE_URL" ]] ||
        lt_die "no target: pass BASE_URL (e.g. $0 http://127.0.0.1:8080) or start the local stack (make stack)"
    LT_LOCAL=0
    if [[ -n "$f_base" && "$BASE_URL" == "${f_base%/}" ]]; then
        LT_LOCAL=1
        ADMIN_TOKEN=${ADMIN_TOKEN:-$f_token}
        PG_DSN=${PG_DSN:-$f_dsn}
        NGINX_ACCESS_LOG=${NGINX_ACCESS_LOG:-$f_log}
    fi
    ADMIN_TOKEN=${ADMIN_TOKEN:-}
    PG_DSN=${PG_DSN:-}
    NGINX_ACCESS_LOG=${NGINX_ACCESS_LOG:-}
    if [[ -n "$NGINX_ACCESS_LOG" && ! -r "$NGINX_ACCESS_LOG" ]]; then
        lt_log "NGINX_ACCESS_LOG $NGINX_ACCESS_LOG is not readable: counting with /stats instead"
        NGINX_ACCESS_LOG=""
    fi
    curl -fsS --max-time 5 -o /dev/null "$BASE_URL/health" ||
        lt_die "$BASE_URL/health does not answer: is the service running? (make stack)"
    if [[ -n "${LOADTEST_OUT:-}" ]]; then
        LT_OUT=$LOADTEST_OUT
    elif ((LT_LOCAL)) && [[ -n "$f_run" ]]; then
        LT_OUT="$f_run/loadtest"
    else
        LT_OUT="${TMPDIR:-/tmp}/seckill-loadtest"
    fi
    mkdir -p "$LT_OUT"
    [[ -n "$PG_DSN" ]] || lt_log "no PG_DSN: invariants are read from /stats, not checked in Postgres"
}

# Prints a JSON field of stdin (python: no jq needed).
lt_json_field() {
    python3 -c 'import json,sys
try:
    v = json.load(sys.stdin).get(sys.argv[1], "")
except ValueError:
    v = ""
print(v)' "$1"
}

# Prints the id of a fresh voucher with STOCK units on sale now (TITLE).
# VOUCHER_ID set: that voucher, reset to STOCK when ADMIN_TOKEN is known.
lt_voucher() {
    local stock=$1 title=$2 begin end body code out
    begin=$(date -u -d '-1 minute' +%FT%TZ)
    end=$(date -u -d '+1 day' +%FT%TZ)
    out=$(mktemp)
    if [[ -n "${VOUCHER_ID:-}" ]]; then
        if [[ -n "$ADMIN_TOKEN" ]]; then
            body=$(printf '{"stock":%d,"beginTime":"%s","endTime":"%s"}' "$stock" "$begin" "$end")
            code=$(curl -sS --max-time 10 -o "$out" -w '%{http_code}' -X POST \
                -H "Authorization: Bearer $ADMIN_TOKEN" -H 'Content-Type: application/json' \
                --data "$body" "$BASE_URL/admin/vouchers/$VOUCHER_ID/reset") || code=000
            [[ "$code" == 200 ]] || { lt_log "$(cat "$out")"; rm -f "$out"; lt_die "reset of voucher $VOUCHER_ID failed (HTTP $code)"; }
        else
            lt_log "VOUCHER_ID=$VOUCHER_ID without ADMIN_TOKEN: used as it is (it should be fresh)"
        fi
        rm -f "$out"
        echo "$VOUCHER_ID"
        return
    fi
    [[ -n "$ADMIN_TOKEN" ]] || lt_die "creating a voucher needs ADMIN_TOKEN (or give VOUCHER_ID of a fresh one)"
    body=$(printf '{"title":"%s","stock":%d,"beginTime":"%s","endTime":"%s"}' "$title" "$stock" "$begin" "$end")
    code=$(curl -sS --max-time 10 -o "$out" -w '%{http_code}' -X POST \
        -H "Authorization: Bearer $ADMIN_TOKEN" -H 'Content-Type: application/json' \
        --data "$body" "$BASE_URL/admin/vouchers") || code=000
    if [[ "$code" != 201 ]]; then
        lt_log "answer: $(cat "$out")"
        rm -f "$out"
        lt_die "POST $BASE_URL/admin/vouchers failed (HTTP $code): wrong ADMIN_TOKEN?"
    fi
    lt_json_field voucherId <"$out"
    rm -f "$out"
}

# Fails unless the target runs with DEMO_RANDOM_USER=1 (ab sends no X-User-Id).
# Probes a voucher id that does not exist, so nothing is bought: demo mode
# answers 404 voucher_not_found, normal mode 400 invalid_user_id.
lt_require_demo_mode() {
    local body
    body=$(curl -sS --max-time 10 -X POST "$BASE_URL/voucher/9223372036854775807/seckill" || true)
    if [[ "$body" == *invalid_user_id* ]]; then
        lt_die "$BASE_URL does not run with DEMO_RANDOM_USER=1, which ab needs (it cannot vary X-User-Id); restart it with DEMO_RANDOM_USER=1 (make stack does)"
    fi
}

lt_stats() { curl -fsS --max-time 10 "$BASE_URL/stats" >"$1" 2>/dev/null || : >"$1"; }

# nginx's sold-out edge counts its answers (GET /stats/edge) instead of
# logging them; empty without the edge.
lt_edge() { curl -fsS --max-time 10 "$BASE_URL/stats/edge" >"$1" 2>/dev/null || : >"$1"; }

lt_log_offset() {
    if [[ -n "$NGINX_ACCESS_LOG" ]]; then stat -c %s "$NGINX_ACCESS_LOG"; else echo 0; fi
}

# lt_report SCENARIO WHAT TOOL TOOL_OUTPUT VOUCHER DIR [extra report.py args...]
lt_report() {
    local scenario=$1 what=$2 tool=$3 output=$4 voucher=$5 dir=$6
    shift 6
    # /stats: each instance publishes its counters once a second.
    sleep 1.2
    lt_stats "$dir/stats-after.json"
    lt_edge "$dir/edge-after.json"
    local -a args=(--scenario "$scenario" --what "$what" --url "$BASE_URL/voucher/$voucher/seckill"
        --tool "$tool" --tool-output "$output" --voucher "$voucher"
        --stats-before "$dir/stats-before.json" --stats-after "$dir/stats-after.json"
        --edge-before "$dir/edge-before.json" --edge-after "$dir/edge-after.json"
        --json-out "${LOADTEST_RESULT:-$dir/result.json}"
        --expect-both-instances "${EXPECT_INSTANCES:-0}")
    [[ -z "$NGINX_ACCESS_LOG" ]] || args+=(--access-log "$NGINX_ACCESS_LOG" --log-offset "$LT_LOG_OFFSET")
    [[ -z "$PG_DSN" ]] || args+=(--dsn "$PG_DSN")
    python3 "$LT_DIR/report.py" "${args[@]}" "$@"
}

# lt_ab URL [USER]: ab's POSTs to URL (REQUESTS, CONCURRENCY; every one as
# USER, X-User-Id, when given) into $LT_RUN_DIR/ab.txt; exits when ab fails.
# -l: success and sold-out bodies differ in length; without it ab counts every
# answer whose length differs from the first one as "failed". -m POST without
# -p sends a POST with no body, which is what the API wants.
lt_ab() {
    local url=$1 user=${2:-} shown="" rc=0
    local -a as_user=()
    if [[ -n "$user" ]]; then
        as_user=(-H "X-User-Id: $user")
        shown="-H 'X-User-Id: $user' "
    fi
    lt_log "ab -l -r -n $REQUESTS -c $CONCURRENCY -m POST $shown$url"
    timeout 600 ab -l -r -s 30 -n "$REQUESTS" -c "$CONCURRENCY" -m POST "${as_user[@]}" "$url" \
        >"$LT_RUN_DIR/ab.txt" 2>&1 || rc=$?
    if ((rc != 0)); then
        tail -n 20 "$LT_RUN_DIR/ab.txt" >&2
        lt_die "ab failed (exit $rc)"
    fi
}

# lt_begin VOUCHER SCENARIO: the run's directory (printed), stats and log offset.
lt_begin() {
    local dir="$LT_OUT/$2-v$1"
    rm -rf "$dir"
    mkdir -p "$dir"
    lt_stats "$dir/stats-before.json"
    lt_edge "$dir/edge-before.json"
    LT_LOG_OFFSET=$(lt_log_offset)
    LT_RUN_DIR=$dir
}
