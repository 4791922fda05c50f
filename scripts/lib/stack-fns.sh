# scripts/lib/stack-fns.sh: starting and stopping the throwaway services, for
# scripts/stack.sh and tests/run.sh (sourced). The caller defines log and die
# (die exits), ROOT (the repository) and STACK_TIMEOUT (seconds to wait for
# a service to be ready); SPAWN_SESSION=0 leaves the services in the caller's
# session (default 1: a session of their own, which a Ctrl-C in the
# caller's terminal does not reach). TAIL_LINES: lines tail_log prints (20).
# shellcheck shell=bash

# The schema files loaded into the database, in this order (docker-compose.yml's
# schema service loads the same files on every start).
# shellcheck disable=SC2034  # used by the scripts that source this file
SCHEMA_FILES=(sql/schema.sql)

# ------------------------------------------------------------------ Postgres

# The directory of initdb/pg_ctl/postgres: $PG_BIN, else Debian's 15, else
# the newest under /usr/lib/postgresql.
find_pg_bin() {
    if [[ -n "${PG_BIN:-}" ]]; then
        echo "$PG_BIN"
        return
    fi
    if [[ -x /usr/lib/postgresql/15/bin/initdb ]]; then
        echo /usr/lib/postgresql/15/bin
        return
    fi
    local d
    d=$(printf '%s\n' /usr/lib/postgresql/*/bin | grep -v '\*' | sort -V | tail -n 1 || true)
    [[ -n "$d" ]] || die "no Postgres server binaries in /usr/lib/postgresql (run 'make deps')"
    echo "$d"
}

# Runs a Postgres server binary as the 'postgres' user when we are root
# (initdb and postgres refuse to run as root), directly otherwise.
as_pg() {
    if [[ $(id -u) -eq 0 ]]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

# pg_start DIR PORT NOTE: a new cluster in DIR/data (socket in DIR/sock,
# initdb.log, pg_ctl.log and postgres.log in DIR) started on 127.0.0.1:PORT
# with pg_ctl, trust authentication on loopback. postgresql.conf gets
# "# NOTE", the address, and the settings read on stdin. Sets PG_STARTED_PID
# (the postmaster); dies on failure.
pg_start() {
    local dir=$1 port=$2 note=$3 bin
    local data="$dir/data" sock="$dir/sock"
    bin=$(find_pg_bin)
    mkdir -p "$data" "$sock"
    chmod 700 "$data"
    if [[ $(id -u) -eq 0 ]]; then
        id postgres >/dev/null 2>&1 || die "running as root but there is no 'postgres' user"
        chown -R postgres: "$dir"
        runuser -u postgres -- test -x "$dir" ||
            die "the postgres user cannot reach $dir (a parent directory is not searchable): set RUN_DIR elsewhere, e.g. RUN_DIR=/tmp/seckill-run"
    fi
    if ! as_pg "$bin/initdb" -D "$data" -U postgres -A trust -E UTF8 --locale=C --no-sync \
        >"$dir/initdb.log" 2>&1; then
        tail_log "$dir/initdb.log"
        die "initdb failed"
    fi
    {
        printf '\n# %s\n' "$note"
        printf "listen_addresses = '127.0.0.1'\nport = %s\nunix_socket_directories = '%s'\n" "$port" "$sock"
        cat
        printf "log_min_messages = warning\nlog_line_prefix = '%%m [%%p] '\n"
    } >>"$data/postgresql.conf"
    cat >"$data/pg_hba.conf" <<EOT
local all all               trust
host  all all 127.0.0.1/32  trust
EOT
    local -a pg_ctl=("$bin/pg_ctl" -D "$data" -l "$dir/postgres.log" -w -t "$STACK_TIMEOUT" start)
    [[ $(id -u) -ne 0 ]] || pg_ctl=(runuser -u postgres -- "${pg_ctl[@]}")
    [[ "${SPAWN_SESSION:-1}" != 1 ]] || pg_ctl=(setsid -w "${pg_ctl[@]}")
    if ! "${pg_ctl[@]}" >"$dir/pg_ctl.log" 2>&1; then
        tail_log "$dir/pg_ctl.log"
        tail_log "$dir/postgres.log"
        die "Postgres did not start on 127.0.0.1:$port"
    fi
    PG_STARTED_PID=$(head -n 1 "$data/postmaster.pid")
}

# pg_wait_ready DIR PORT PID: until Postgres (postmaster PID, logs in DIR)
# accepts connections on PORT; dies when it does not within STACK_TIMEOUT.
pg_wait_ready() {
    local dir=$1 port=$2 pid=$3
    wait_for "Postgres" "$pid" pg_isready -q -h 127.0.0.1 -p "$port" -t 1 || {
        tail_log "$dir/postgres.log"; die "Postgres is not ready on 127.0.0.1:$port"; }
}

# pg_create_db PORT NAME: CREATE DATABASE NAME.
pg_create_db() {
    psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$1" -U postgres -d postgres \
        -c "CREATE DATABASE $2" >/dev/null || die "CREATE DATABASE $2 failed"
}

# load_sql DSN LOG FILE...: each FILE (relative to ROOT) into DSN, psql's
# output in LOG; dies on the first that fails.
load_sql() {
    local dsn=$1 out=$2 f
    shift 2
    for f in "$@"; do
        [[ -f "$ROOT/$f" ]] || die "$f is missing"
        if ! psql -X -q -v ON_ERROR_STOP=1 -d "$dsn" -f "$ROOT/$f" >"$out" 2>&1; then
            tail_log "$out"
            die "loading $f failed"
        fi
    done
}

# ------------------------------------------------------------------ Redis

redis_ping() { [[ "$(redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null)" == PONG ]]; }

# redis_spawn DIR PORT [ARG...]: redis-server on 127.0.0.1:PORT in the
# background, its files and redis.log in DIR, no snapshots, with ARGs (e.g.
# the AOF's). Sets REDIS_STARTED_PID.
redis_spawn() {
    local dir=$1 port=$2
    shift 2
    local -a pre=()
    [[ "${SPAWN_SESSION:-1}" != 1 ]] || pre=(setsid)
    mkdir -p "$dir"
    "${pre[@]}" redis-server --bind 127.0.0.1 --port "$port" --save '' "$@" \
        --daemonize no --dir "$dir" --logfile "$dir/redis.log" \
        --protected-mode yes </dev/null >/dev/null 2>&1 &
    REDIS_STARTED_PID=$!
}

# redis_wait_ready DIR PORT PID: until the Redis (PID, files in DIR) answers
# PING on PORT; dies when it does not within STACK_TIMEOUT.
redis_wait_ready() {
    local dir=$1 port=$2 pid=$3
    wait_for "Redis" "$pid" redis_ping "$port" || {
        tail_log "$dir/redis.log"; die "Redis did not start on 127.0.0.1:$port"; }
}

# ------------------------------------------------------------------ processes

# Prints the last TAIL_LINES lines of a log file, indented, to stderr.
tail_log() {
    local file=$1
    [[ -f "$file" ]] || return 0
    log "last lines of $file:"
    tail -n "${TAIL_LINES:-20}" "$file" | sed 's/^/    | /' >&2
}

# The command line of PID with NULs turned into spaces ('' when gone).
cmdline_of() {
    local pid=$1
    [[ -r "/proc/$pid/cmdline" ]] || return 0
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | sed 's/ $//' || true
}

# True while PID runs. A zombie (exited, not yet reaped: the daemons' parent
# is init, which may reap late) counts as gone.
pid_alive() {
    local state
    state=$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$1/status" 2>/dev/null || true)
    [[ -n "$state" && "$state" != Z && "$state" != X ]]
}

# stop_pid NAME PID SIG SECONDS: sends SIG to PID (none, or gone: nothing to
# do), waits up to SECONDS for it to exit; SIGKILL after that.
stop_pid() {
    local name=$1 pid=$2 sig=$3 seconds=$4 i
    [[ -n "$pid" ]] || return 0
    kill "-$sig" "$pid" 2>/dev/null || return 0
    for ((i = 0; i < seconds * 10; i++)); do
        pid_alive "$pid" || return 0
        sleep 0.1
    done
    log "$name (pid $pid) did not stop on SIG$sig within ${seconds}s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        pid_alive "$pid" || return 0
        sleep 0.1
    done
    log "warning: $name (pid $pid) is still alive after SIGKILL"
}

# Prints N distinct free loopback TCP ports, one a line (all held open
# together while the kernel picks them; without python3, probed from a
# random start).
free_ports() {
    local n=$1
    if command -v python3 >/dev/null 2>&1; then
        python3 - "$n" <<'EOT'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
for s in socks:
    print(s.getsockname()[1])
EOT
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

# wait_for WHAT PID COMMAND...: waits up to STACK_TIMEOUT seconds for the
# command to succeed; PID (optional) must stay alive meanwhile.
wait_for() {
    local what=$1 pid=$2 i; shift 2
    for ((i = 0; i < STACK_TIMEOUT * 10; i++)); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        if [[ -n "$pid" ]] && ! pid_alive "$pid"; then
            log "$what exited during start"
            return 1
        fi
        sleep 0.1
    done
    log "$what not ready within ${STACK_TIMEOUT}s"
    return 1
}
