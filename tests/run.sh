#!/usr/bin/env bash
# tests/run.sh [--check] [FILTER ...] -- the test run against a throwaway Postgres and Redis.
#
# Starts Postgres (loopback TCP, trust auth, database "seckill" with
# sql/schema.sql loaded) and Redis (no persistence) on free ports in a temp
# directory, exports their addresses, then runs every $BUILD/tests/unit_* and
# $BUILD/tests/test_* binary and every tests/test_*.py whose name contains one
# of the FILTERs (all when none is given).
#
# --check: the fast tier (make check): the C programs only, with Redis and no
# Postgres (the unit tests need neither; the C tests need Redis alone, and
# test_zk_lock a ZooKeeper it starts itself; test_pg_lock and test_store_batch, which
# need Postgres, are left out).
# Each program prints "N passed, M failed"; the totals are printed last as
# "N passed, M failed" and the exit status is non-zero if anything failed.
#
# Environment read:
#   BUILD         build directory (default: build)
#   KEEP_TMP=1    keep the temp directory (logs, data) after the run
#   TEST_TIMEOUT  seconds one test program may run (default: 900)
#   TEST_SKIP     space-separated names: programs whose name contains one are skipped
#   PG_BIN        Postgres server binaries (default: newest /usr/lib/postgresql/*/bin)
# Environment exported to the tests:
#   PG_DSN REDIS_URL PG_PORT REDIS_PORT LUA_DIR SQL_DIR SECKILL_BIN TEST_TMP
#
# Test helpers may register extra processes to be killed at the end by writing
# their PID as a file name into $TEST_TMP/pids/ (see tests/seckill_server.py).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
# The stack's functions (scripts/stack.sh's too): Postgres and Redis started,
# processes stopped by PID, free ports. Here the services stay in this
# script's session; 30 s for each to be ready; 30 lines of a failing log.
# shellcheck source=scripts/lib/stack-fns.sh
. "$ROOT/scripts/lib/stack-fns.sh"
SPAWN_SESSION=0
STACK_TIMEOUT=${STACK_TIMEOUT:-30}
TAIL_LINES=30
BUILD=${BUILD:-build}
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
CHECK=0
if [[ "${1:-}" == --check ]]; then
    CHECK=1
    shift
fi
FILTERS=("$@")
TEST_TIMEOUT=${TEST_TIMEOUT:-900}
# C test programs that need Postgres (left out by --check).
PG_C_TESTS="test_pg_lock test_store_batch"

TMP=""
PG_PID=""
REDIS_PID=""
PGDATA=""
TEST_PID=""
TAIL_PID=""

log() { printf 'run.sh: %s\n' "$*" >&2; }

# Does NAME contain one of FILTERS (or are there none)?
selected() {
    local word
    ((${#FILTERS[@]})) || return 0
    for word in "${FILTERS[@]}"; do
        [[ "$1" == *"$word"* ]] && return 0
    done
    return 1
}

# TEST_SKIP="a b": leave out the programs whose name contains a or b.
skipped() {
    local word
    for word in ${TEST_SKIP:-}; do
        if [[ "$1" == *"$word"* ]]; then
            log "skipping $1 (TEST_SKIP)"
            return 0
        fi
    done
    return 1
}
die() { log "error: $*"; exit 2; }

# The start time of PID (field 22 of /proc/PID/stat, after the command name,
# which may hold spaces); empty when it is gone.
pid_start_time() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
    stat=${stat##*) }
    awk '{print $20}' <<<"$stat"
}

# Stops the processes registered in DIR (a file per pid, holding its start
# time): only the process registered, since its pid may belong to another one
# by now (another run's, on a busy machine).
stop_registered() {
    local f
    [[ -n "$1" && -d "$1" ]] || return 0
    for f in "$1"/*; do
        [[ -e "$f" ]] || continue
        [[ "$(pid_start_time "$(basename "$f")")" == "$(cat "$f")" ]] || continue
        stop_pid "a test's process" "$(basename "$f")" TERM 5
    done
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    set +e
    stop_pid test "$TEST_PID" TERM 10
    stop_pid tail "$TAIL_PID" TERM 2
    [[ -n "$TMP" ]] && stop_registered "$TMP/pids"
    stop_pid Redis "$REDIS_PID" TERM 10
    # SIGINT is Postgres' "fast" shutdown: roll back open sessions and exit.
    # A test may have restarted it (pg_ctl): its postmaster.pid names the
    # postmaster running now.
    if [[ -n "$PGDATA" && -f "$PGDATA/postmaster.pid" ]]; then
        PG_PID=$(head -n 1 "$PGDATA/postmaster.pid")
    fi
    stop_pid Postgres "$PG_PID" INT 20
    if [[ -n "$TMP" && -d "$TMP" ]]; then
        if [[ "${KEEP_TMP:-0}" == 1 ]]; then
            log "kept $TMP"
        else
            rm -rf "$TMP"
        fi
    fi
    exit "$rc"
}

start_postgres() {
    local port=$1
    PGDATA="$TMP/pg/data"
    pg_start "$TMP/pg" "$port" "tests/run.sh" <<EOF
max_connections = 200
shared_buffers = 64MB
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
    PG_PID=$PG_STARTED_PID
    pg_wait_ready "$TMP/pg" "$port" "$PG_PID"
    log "Postgres $(basename "$(dirname "$(find_pg_bin)")") pid $PG_PID on 127.0.0.1:$port"
}

load_schema() {
    local port=$1
    pg_create_db "$port" seckill
    load_sql "host=127.0.0.1 port=$port dbname=seckill user=postgres" "$TMP/schema.log" \
        "${SCHEMA_FILES[@]}"
}

start_redis() {
    local port=$1
    redis_spawn "$TMP/redis" "$port" --appendonly no --pidfile "$TMP/redis/redis.pid"
    REDIS_PID=$REDIS_STARTED_PID
    redis_wait_ready "$TMP/redis" "$port" "$REDIS_PID"
    log "Redis pid $REDIS_PID on 127.0.0.1:$port"
}

# Runs one test program; adds its counts to PASSED and FAILED.
run_one() {
    local name=$1; shift
    local out="$TMP/logs/$name.log" rc line p f ds started=${EPOCHREALTIME/[.,]/}
    printf '\n=== %s\n' "$name"
    # In the background, so that a signal to this script runs its trap at once
    # (bash defers traps while a foreground command runs); tail shows the output.
    : >"$out"
    timeout --foreground --kill-after=10 "$TEST_TIMEOUT" "$@" >"$out" 2>&1 </dev/null &
    TEST_PID=$!
    tail -s 0.2 -n +1 -f --pid="$TEST_PID" "$out" &
    TAIL_PID=$!
    rc=0
    wait "$TEST_PID" || rc=$?
    wait "$TAIL_PID" || true
    TEST_PID=""
    TAIL_PID=""
    line=$(grep -Eo '[0-9]+ passed, [0-9]+ failed' "$out" | tail -n 1 || true)
    if [[ -n "$line" ]]; then
        p=${line%% passed*}
        f=${line##*, }
        f=${f%% failed*}
    else
        p=0
        f=0
    fi
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
        log "$name: timed out after ${TEST_TIMEOUT}s"
        f=$((f + 1))
    elif [[ -z "$line" ]]; then
        log "$name: exit status $rc and no 'N passed, M failed' line: counted as 1 failed"
        f=$((f + 1))
    elif [[ $rc -ne 0 && $f -eq 0 ]]; then
        log "$name: exit status $rc although it reported no failure: counted as 1 failed"
        f=1
    fi
    PASSED=$((PASSED + p))
    FAILED=$((FAILED + f))
    # Each program's wall time: what CI's 30 minutes are spent on.
    ds=$(((${EPOCHREALTIME/[.,]/} - started) / 100000))
    SUMMARY+=("$(printf '%-28s %s passed, %s failed (exit %s) %4d.%d s' "$name" "$p" "$f" "$rc" \
        $((ds / 10)) $((ds % 10)))")
}

main() {
    command -v redis-server >/dev/null || die "redis-server not found (run 'make deps', or apt-get install redis-server)"
    if ((!CHECK)); then
        command -v psql >/dev/null || die "psql not found (run 'make deps', or apt-get install postgresql)"
        [[ -x "$BUILD/seckill" ]] || die "$BUILD/seckill is missing: run 'make' (or 'make test')"
    fi

    TMP=$(mktemp -d "${TMPDIR:-/tmp}/seckill-test.XXXXXX")
    chmod 755 "$TMP"   # the postgres user must reach $TMP/pg
    mkdir -p "$TMP/logs" "$TMP/pids"
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM

    local ports pg_port redis_port
    ports=$(free_ports 2)
    pg_port=$(sed -n 1p <<<"$ports")
    redis_port=$(sed -n 2p <<<"$ports")

    if ((!CHECK)); then
        start_postgres "$pg_port"
        load_schema "$pg_port"
        export PG_PORT=$pg_port
        export PG_DSN="host=127.0.0.1 port=$pg_port dbname=seckill user=postgres"
    fi
    start_redis "$redis_port"

    export REDIS_PORT=$redis_port
    export REDIS_URL="redis://127.0.0.1:$redis_port/0"
    export LUA_DIR="$ROOT/lua"
    export SQL_DIR="$ROOT/sql"
    export SECKILL_BIN="$BUILD/seckill"
    export TEST_TMP=$TMP
    export PYTHONDONTWRITEBYTECODE=1

    PASSED=0
    FAILED=0
    SUMMARY=()
    local t name ran=0
    # The unit tests first: they fail fastest. The programs of today's
    # sources only: a binary left in $BUILD by a test since renamed or
    # removed is not run.
    local src
    for src in "$ROOT"/tests/unit_*.c "$ROOT"/tests/test_*.c; do
        name=$(basename "$src" .c)
        t="$BUILD/tests/$name"
        selected "$name" || continue
        skipped "$name" && continue
        [[ -f "$t" && -x "$t" ]] || { echo "run.sh: $t is not built (make tests-bin)" >&2; exit 2; }
        # the C tests that need Postgres are not in the fast tier
        if ((CHECK)) && [[ " $PG_C_TESTS " == *" $name "* ]]; then continue; fi
        run_one "$name" "$t"
        ran=$((ran + 1))
    done
    for t in "$ROOT"/tests/test_*.py; do
        ((!CHECK)) || break
        [[ -f "$t" ]] || continue
        name=$(basename "$t")
        selected "$name" || continue
        skipped "$name" && continue
        run_one "$name" python3 -u "$t"
        ran=$((ran + 1))
    done
    if ((ran == 0)); then
        log "no test matches '${FILTERS[*]}'"
        FAILED=$((FAILED + 1))
    fi

    printf '\n=== summary\n'
    local s
    for s in "${SUMMARY[@]+"${SUMMARY[@]}"}"; do
        printf '%s\n' "$s"
    done
    [[ "${KEEP_TMP:-0}" == 1 ]] && log "logs in $TMP/logs, server logs in $TMP"
    printf '%d passed, %d failed\n' "$PASSED" "$FAILED"
    ((FAILED == 0))
}

# Sourced (tests/test_kit.py tries stop_registered), it defines only.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    main "$@"
fi
