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
# test_zkl a ZooKeeper it starts itself; test_pgl and test_store_batch, which
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
# shellcheck source=scripts/pg-lib.sh
. "$ROOT/scripts/pg-lib.sh"
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
PG_C_TESTS="test_pgl test_store_batch"

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

# Prints the last lines of a log file, indented, to stderr.
tail_log() {
    local file=$1
    if [[ -f "$file" ]]; then
        log "last lines of $file:"
        tail -n 30 "$file" | sed 's/^/    | /' >&2
    fi
}

# Sends SIGNAL to PID, then waits up to SECONDS for it to vanish; SIGKILL after.
stop_pid() {
    local pid=$1 sig=$2 seconds=$3 i
    [[ -n "$pid" ]] || return 0
    kill -0 "$pid" 2>/dev/null || return 0
    kill "-$sig" "$pid" 2>/dev/null || true
    for ((i = 0; i < seconds * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    log "pid $pid did not stop on SIG$sig within ${seconds}s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
}

cleanup() {
    local rc=$? f
    trap - EXIT INT TERM
    set +e
    stop_pid "$TEST_PID" TERM 10
    stop_pid "$TAIL_PID" TERM 2
    if [[ -n "$TMP" && -d "$TMP/pids" ]]; then
        for f in "$TMP"/pids/*; do
            [[ -e "$f" ]] || continue
            stop_pid "$(basename "$f")" TERM 5
        done
    fi
    stop_pid "$REDIS_PID" TERM 10
    # SIGINT is Postgres' "fast" shutdown: roll back open sessions and exit.
    # A test may have restarted it (pg_ctl): its postmaster.pid names the
    # postmaster running now.
    if [[ -n "$PGDATA" && -f "$PGDATA/postmaster.pid" ]]; then
        PG_PID=$(head -n 1 "$PGDATA/postmaster.pid")
    fi
    stop_pid "$PG_PID" INT 20
    if [[ -n "$TMP" && -d "$TMP" ]]; then
        if [[ "${KEEP_TMP:-0}" == 1 ]]; then
            log "kept $TMP"
        else
            rm -rf "$TMP"
        fi
    fi
    exit "$rc"
}

# Prints N free loopback TCP ports, one a line (all distinct).
free_ports() {
    local n=$1
    if command -v python3 >/dev/null 2>&1; then
        python3 - "$n" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
for s in socks:
    print(s.getsockname()[1])
EOF
    else
        local port found=0
        for ((port = 20000 + RANDOM % 20000; found < n && port < 65000; port++)); do
            if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
                echo "$port"
                found=$((found + 1))
            fi
        done
        ((found == n)) || die "no free ports"
    fi
}

start_postgres() {
    local port=$1 bin i
    bin=$(find_pg_bin)
    PGDATA="$TMP/pg/data"
    local sockdir="$TMP/pg/sock" pglog="$TMP/pg/postgres.log"
    mkdir -p "$PGDATA" "$sockdir"
    chmod 700 "$PGDATA"
    if [[ $(id -u) -eq 0 ]]; then
        id postgres >/dev/null 2>&1 || die "running as root but there is no 'postgres' user"
        chown -R postgres: "$TMP/pg"
    fi
    if ! as_pg "$bin/initdb" -D "$PGDATA" -U postgres -A trust -E UTF8 --locale=C --no-sync \
            >"$TMP/pg/initdb.log" 2>&1; then
        tail_log "$TMP/pg/initdb.log"
        die "initdb failed"
    fi
    cat >>"$PGDATA/postgresql.conf" <<EOF

# tests/run.sh
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$sockdir'
max_connections = 200
shared_buffers = 64MB
fsync = off
synchronous_commit = off
full_page_writes = off
log_min_messages = warning
log_line_prefix = '%m [%p] '
EOF
    cat >"$PGDATA/pg_hba.conf" <<EOF
local all all               trust
host  all all 127.0.0.1/32  trust
EOF
    if ! as_pg "$bin/pg_ctl" -D "$PGDATA" -l "$pglog" -w -t 30 start >"$TMP/pg/pg_ctl.log" 2>&1; then
        tail_log "$TMP/pg/pg_ctl.log"
        tail_log "$pglog"
        die "Postgres did not start on port $port"
    fi
    PG_PID=$(head -n 1 "$PGDATA/postmaster.pid")
    for ((i = 0; i < 100; i++)); do
        pg_isready -q -h 127.0.0.1 -p "$port" -t 1 && break
        kill -0 "$PG_PID" 2>/dev/null || break
        sleep 0.1
    done
    if ! pg_isready -q -h 127.0.0.1 -p "$port" -t 1; then
        tail_log "$pglog"
        die "Postgres is not ready on port $port"
    fi
    log "Postgres $(basename "$(dirname "$bin")") pid $PG_PID on 127.0.0.1:$port"
}

load_schema() {
    local port=$1
    [[ -f "$ROOT/sql/schema.sql" ]] || die "sql/schema.sql is missing"
    psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d postgres \
        -c 'CREATE DATABASE seckill' >/dev/null || die "CREATE DATABASE seckill failed"
    if ! psql -X -q -v ON_ERROR_STOP=1 -d "host=127.0.0.1 port=$port dbname=seckill user=postgres" \
            -f "$ROOT/sql/schema.sql" >"$TMP/schema.log" 2>&1; then
        tail_log "$TMP/schema.log"
        die "loading sql/schema.sql failed"
    fi
}

start_redis() {
    local port=$1 i
    local rlog="$TMP/redis/redis.log"
    mkdir -p "$TMP/redis"
    redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
        --daemonize no --dir "$TMP/redis" --logfile "$rlog" \
        --pidfile "$TMP/redis/redis.pid" --protected-mode yes </dev/null >/dev/null 2>&1 &
    REDIS_PID=$!
    for ((i = 0; i < 100; i++)); do
        [[ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" == PONG ]] && break
        kill -0 "$REDIS_PID" 2>/dev/null || break
        sleep 0.1
    done
    if [[ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" != PONG ]]; then
        tail_log "$rlog"
        die "Redis did not start on port $port"
    fi
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
    # The unit tests first: they fail fastest.
    for t in "$BUILD"/tests/unit_* "$BUILD"/tests/test_*; do
        [[ -f "$t" && -x "$t" ]] || continue
        case "$t" in *.d | *.o) continue ;; esac
        name=$(basename "$t")
        selected "$name" || continue
        skipped "$name" && continue
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

main "$@"
