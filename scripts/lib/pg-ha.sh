# shellcheck shell=bash
# PG_HA=1: Postgres under pg_auto_failover (https://pg-auto-failover.readthedocs.io):
# one monitor and three data nodes, each a `pg_autoctl run` process (which
# starts and watches its own postgres) under RUN_DIR/pg-ha, on loopback.
# With three data nodes the formation keeps number_sync_standbys = 1
# (synchronous_standby_names = 'ANY 1 (...)'): a commit returns only once
# one standby has flushed it, and one standby may be down without the
# primary going asynchronous (with two, a primary whose standby is down
# goes wait_primary and commits alone).
#
# Sourced by scripts/stack.sh after stack-fns.sh; uses its log, die,
# write_pidfile, live_pid, pid_alive, stop_pid, wait_for, tail_log.

PGHA_NODES=3

# Failover timeouts, set for a test; pg_auto_failover's defaults beside them
# (docs: "Configuring pg_auto_failover", the monitor's pgautofailover.* GUCs
# and the node's [timeout] section). With the defaults a killed primary is
# replaced in about 50 s; with these, in about 10 s on loopback.
PGHA_MONITOR_SETTINGS=(
    "pgautofailover.health_check_period=1000"          # default 5000 ms
    "pgautofailover.health_check_timeout=1000"         # default 5000 ms
    "pgautofailover.health_check_max_retries=1"        # default 2
    "pgautofailover.health_check_retry_delay=500"      # default 2000 ms
    "pgautofailover.node_considered_unhealthy_timeout=3000"  # default 20000 ms
    "pgautofailover.primary_demote_timeout=5000"       # default 30000 ms
    "pgautofailover.startup_grace_period=3000"         # default 10000 ms
)
PGHA_NETWORK_PARTITION_TIMEOUT_S=5   # a node's timeout.network_partition_timeout, default 20 s

# pg_autoctl keeps its configuration and state under XDG directories: ours
# live in the stack's directory, so that two stacks never share them.
pgha_env() {
    local d=$1
    printf '%s\n' "XDG_CONFIG_HOME=$d/xdg/config" "XDG_DATA_HOME=$d/xdg/data" \
        "XDG_RUNTIME_DIR=$d/xdg/run" "PG_CONFIG=$(find_pg_bin)/pg_config" "LC_ALL=C.UTF-8"
}

# pgha_ctl DIR ARGS...: pg_autoctl ARGS as the postgres user when root.
pgha_ctl() {
    local d=$1 env; shift
    mapfile -t env < <(pgha_env "$d")
    as_pg env "${env[@]}" pg_autoctl "$@"
}

# pgha_psql PORT DB SQL: one statement as the superuser on loopback.
pgha_psql() {
    psql -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$1" -U postgres -d "$2" -c "$3"
}

# pgha_run DIR NAME PGDATA: starts `pg_autoctl run` for PGDATA in a session
# of its own, as postgres (setpriv execs, so $! is pg_autoctl itself), and
# writes pid file NAME.
pgha_run() {
    local d=$1 name=$2 pgdata=$3 env pid
    mapfile -t env < <(pgha_env "$d")
    local -a cmd=(env "${env[@]}" pg_autoctl run --pgdata "$pgdata")
    [[ $(id -u) -ne 0 ]] || cmd=(setpriv --reuid=postgres --regid=postgres --init-groups "${cmd[@]}")
    setsid "${cmd[@]}" </dev/null >>"$d/$name.log" 2>&1 &
    pid=$!
    write_pidfile "$name" "$pid" "pg_autoctl run --pgdata $pgdata*"
    PGHA_STARTED_PID=$pid
}

# The data nodes' states as the monitor reports them: "primary secondary secondary".
pgha_states() {
    pgha_psql "$1" pg_auto_failover \
        "SELECT string_agg(reportedstate::text, ' ' ORDER BY reportedstate::text)
           FROM pgautofailover.node WHERE reportedstate = goalstate"
}

pgha_formation_ready() {
    [[ "$(pgha_states "$1" 2>/dev/null)" == "primary secondary secondary" ]]
}

# pgha_start MONITOR_PORT NODE_PORT...: the monitor, then each data node
# (the first becomes the primary, the others are cloned from it), then waits
# until one primary and two secondaries are settled. Sets PGHA_URI.
pgha_start() {
    local mport=$1 d="$RUN_DIR/pg-ha" bin muri i port s
    shift
    command -v pg_autoctl >/dev/null 2>&1 ||
        die "PG_HA=1 needs pg_autoctl (Debian: postgresql-15-auto-failover, pg-auto-failover-cli; run 'make deps')"
    bin=$(find_pg_bin)
    rm -rf "$d"
    mkdir -p "$d/xdg/run"
    chmod 700 "$d/xdg/run"
    if [[ $(id -u) -eq 0 ]]; then
        chown -R postgres: "$d"
        runuser -u postgres -- test -x "$d" ||
            die "the postgres user cannot reach $d (a parent directory is not searchable): set RUN_DIR elsewhere, e.g. RUN_DIR=/tmp/seckill-run"
    fi
    pgha_ctl "$d" create monitor --pgdata "$d/monitor" --pgport "$mport" --hostname 127.0.0.1 \
        --auth trust --no-ssl --pgctl "$bin/pg_ctl" >"$d/monitor-create.log" 2>&1 || {
        tail_log "$d/monitor-create.log"; die "pg_autoctl create monitor failed"; }
    pgha_ctl "$d" config set --pgdata "$d/monitor" postgresql.listen_addresses 127.0.0.1 >/dev/null
    pgha_run "$d" pg-monitor "$d/monitor"
    wait_for "pg_auto_failover monitor" "$PGHA_STARTED_PID" \
        pgha_psql "$mport" pg_auto_failover "SELECT 1" || {
        tail_log "$d/pg-monitor.log"; die "the pg_auto_failover monitor is not ready on 127.0.0.1:$mport"; }
    for s in "${PGHA_MONITOR_SETTINGS[@]}"; do
        pgha_psql "$mport" pg_auto_failover "ALTER SYSTEM SET ${s%%=*} = '${s#*=}'" >/dev/null
    done
    pgha_psql "$mport" pg_auto_failover "SELECT pg_reload_conf()" >/dev/null
    log "pg_auto_failover monitor pid $PGHA_STARTED_PID on 127.0.0.1:$mport"
    muri=$(pgha_ctl "$d" show uri --pgdata "$d/monitor" --formation monitor)
    i=0
    for port in "$@"; do
        i=$((i + 1))
        if ! pgha_ctl "$d" create postgres --pgdata "$d/node$i" --pgport "$port" --listen 127.0.0.1 \
            --hostname 127.0.0.1 --pghost 127.0.0.1 --auth trust --no-ssl --pgctl "$bin/pg_ctl" \
            --monitor "$muri" --name "node$i" --dbname "$DB_NAME" --username postgres \
            >"$d/node$i-create.log" 2>&1; then
            tail_log "$d/node$i-create.log"; die "pg_autoctl create postgres (node $i) failed"
        fi
        pgha_ctl "$d" config set --pgdata "$d/node$i" timeout.network_partition_timeout \
            "$PGHA_NETWORK_PARTITION_TIMEOUT_S" >/dev/null
        pgha_run "$d" "pg-node-$i" "$d/node$i"
        # The next node is cloned from the primary: wait until this one is
        # settled (a primary first, then each secondary).
        wait_for "pg_auto_failover node $i" "$PGHA_STARTED_PID" pgha_node_settled "$mport" "node$i" || {
            tail_log "$d/pg-node-$i.log"; die "pg_auto_failover node $i did not settle on 127.0.0.1:$port"; }
        log "pg_auto_failover node $i pid $PGHA_STARTED_PID on 127.0.0.1:$port"
    done
    pgha_ctl "$d" set formation number-sync-standbys 1 --pgdata "$d/monitor" >/dev/null 2>&1 || true
    wait_for "pg_auto_failover formation" "" pgha_formation_ready "$mport" || {
        pgha_ctl "$d" show state --pgdata "$d/monitor" >&2 || true
        die "pg_auto_failover did not settle on one primary and two secondaries"; }
    # The client URI (pg_autoctl show uri), with the user: every data node,
    # target_session_attrs=read-write.
    PGHA_URI=$(pgha_ctl "$d" show uri --pgdata "$d/monitor" --formation default)
    PGHA_URI=${PGHA_URI/postgres:\/\//postgres:\/\/postgres@}
    [[ "$PGHA_URI" == *target_session_attrs=read-write* ]] ||
        die "pg_autoctl show uri gave no read-write URI: $PGHA_URI"
}

pgha_node_settled() {
    local state
    state=$(pgha_psql "$1" pg_auto_failover \
        "SELECT reportedstate FROM pgautofailover.node WHERE nodename = '$2' AND reportedstate = goalstate")
    [[ "$state" == primary || "$state" == secondary || "$state" == single ]]
}

# The postmaster of a data directory ('' when none runs).
pgha_postmaster() {
    local pid
    [[ -f "$1/postmaster.pid" ]] || return 0
    pid=$(head -n 1 "$1/postmaster.pid")
    [[ "$pid" =~ ^[0-9]+$ ]] && pid_alive "$pid" && [[ "$(cmdline_of "$pid")" == *postgres* ]] &&
        printf '%s\n' "$pid"
    return 0
}

# pgha_stop NAME PID PGDATA: pg_autoctl stops its postgres on SIGINT (fast
# shutdown); a postgres left behind (its pg_autoctl was killed) is stopped too.
pgha_stop() {
    local name=$1 pid=$2 pgdata=$3 pm
    if [[ -n "$pid" ]]; then
        kill -CONT "$pid" 2>/dev/null || true
        stop_pid "$name" "$pid" INT 30
    fi
    pm=$(pgha_postmaster "$pgdata")
    if [[ -n "$pm" ]]; then
        kill -CONT "$pm" 2>/dev/null || true
        stop_pid "$name's postgres" "$pm" INT 30
    fi
}
