#!/usr/bin/env bash
# scripts/stack.sh start|stop|restart|rolling-restart|status|env|instance-env -- the local stack.
#
# A throwaway Postgres and Redis, N seckill instances and nginx in front, all on
# 127.0.0.1, everything (data, logs, PID files, nginx config) inside RUN_DIR.
# Used by 'make demo', 'make stack', 'make stop' and tests/test_stack.py.
#
#   start         start the stack (already running and healthy: says so, exit 0;
#                 partly running or another INSTANCES count: restarts it)
#   stop          stop exactly what 'start' started, by PID
#   restart       stop, then start
#   restart-instances  stop the seckill instances only and start them again with
#                 the current environment (THREADS, SECKILL_*, ...) on the same
#                 ports, Postgres, Redis and nginx (make bench: another strategy)
#   rolling-restart    the same, one instance at a time: each drains (SIGTERM),
#                 starts again and is ready before the next one stops, so that
#                 nginx always has an instance to send buyers to (INSTANCES >= 2)
#   status        what runs (exit 0: all of it, 1: part of it, 3: nothing)
#   env           print the env file (BASE_URL, PG_DSN, REDIS_URL, ADMIN_TOKEN, ...)
#   instance-env  print the environment an instance gets (NAME=value, instance 1)
#   describe      print the default ports, schema files and instance env names
#   service-stop NAME | service-start NAME
#                 stop or start again one service of a running stack, on the
#                 same port: postgres (fast shutdown; same data), redis (empty
#                 again: it keeps no data), zk (same data: sessions survive a
#                 restart shorter than their timeout); with PG_HA=1,
#                 pg-node-N and pg-monitor (pg_autoctl and its postgres; a
#                 restarted node rejoins). For outage tests.
#
# Environment:
#   RUN_DIR            run directory (default: <repo>/.run)
#   INSTANCES          number of seckill instances (default 2)
#   NGINX_PORT         nginx port (default 8080; 'auto': a free port)
#   APP_PORT_BASE      instance i listens on APP_PORT_BASE+i-1 (default 8081; 'auto')
#   PG_PORT, REDIS_PORT  ports of the throwaway Postgres and Redis (default 'auto')
#   EXTERNAL_PG_DSN    use this Postgres instead of starting one (schema is loaded)
#   EXTERNAL_REDIS_URL use this Redis instead of starting one
#   REDIS_APPENDFSYNC  the throwaway Redis's AOF: always, everysec or no (appendonly
#                      yes, with that appendfsync); empty: no persistence, except
#                      with SECKILL_STOCK=redis, where it defaults to always
#   REDIS_CLUSTER=1    a Redis Cluster instead of one Redis: 3 masters and 3
#                      replicas (scripts/redis-cluster.sh, under
#                      RUN_DIR/redis-cluster, on free loopback ports); the
#                      instances get REDIS_CLUSTER_NODES, and so does the env
#                      file (REDIS_URL is empty there); REDIS_APPENDFSYNC
#                      applies to every node
#   REDIS_HA=1         Redis with Sentinel instead of one Redis: a master (redis-1),
#                      two replicas (redis-2, redis-3) and three Sentinels
#                      (sentinel-1..3, quorum 2), each under RUN_DIR with a
#                      config file it may rewrite, all on free loopback ports
#                      (REDIS_PORT is not used); the instances find the master
#                      through the Sentinels (REDIS_SENTINELS, REDIS_MASTER_NAME)
#   REDIS_MASTER_NAME  the master's name in the Sentinels (default seckill)
#   SENTINEL_DOWN_AFTER_MS      a silent master is down after this long (default 2000)
#   SENTINEL_FAILOVER_TIMEOUT_MS  Sentinel's failover-timeout (default 3000)
#   INSTANCE_ENV_<i>   extra settings of instance i only, "NAME=value NAME=value"
#                      (e.g. INSTANCE_ENV_1="DEMO_PAUSE_MS=8000")
#   ADMIN_TOKEN        admin token (default: RUN_DIR/admin_token, random on first use)
#   LOG_LEVEL          instances' log level (default warn: nginx logs every request)
#   NGINX_ALLOW        client addresses nginx serves /admin, /metrics and /stats to
#                      (space separated, CIDR allowed; default loopback:
#                      "127.0.0.0/8 ::1"); others get 403 (nginx/gen-conf.sh --allow)
#   NGINX_EDGE         on (default) or off: nginx answers a voucher known to be sold
#                      out by itself (nginx/gen-conf.sh --edge)
#   THREADS, IO_THREADS, DEMO_RANDOM_USER, SECKILL_*, MAX_BODY, ... passed to the instances as set
#   SECKILL_BIN        server binary (default <repo>/build/seckill)
#   PG_BIN             Postgres server binaries (default newest /usr/lib/postgresql/*/bin)
#   PG_HA=1            Postgres under pg_auto_failover instead of one server:
#                      a monitor and three data nodes (number_sync_standbys
#                      1), each on a free loopback port under RUN_DIR/pg-ha;
#                      PG_DSN lists every data node with
#                      target_session_attrs=read-write (docs/failover.md)
#   PG_DURABLE=1       keep fsync on (default off: a throwaway database)
#   PG_MAX_CONNECTIONS Postgres max_connections (default INSTANCES*(THREADS+4)+40,
#                      at least 100; raise it when instances will restart with
#                      more THREADS or other clients such as pgbench connect)
#   STACK_TIMEOUT      seconds to wait for each component to be ready (default 30)
#   LOCK_SERVICES      the lock services to run beside Redis and Postgres, space
#                      separated (default: what SECKILL_LOCK needs): zk, a
#                      standalone ZooKeeper (scripts/zk.sh; the instances get
#                      ZK_HOSTS). ZK_PORT: its port (default 'auto').
#   ROLLING_PAUSE_S    rolling-restart: seconds between an instance being ready
#                      and the next one stopping, and after the last one
#                      (default 4: nginx keeps an instance that refused
#                      connections out for fail_timeout, 3 s, and must take the
#                      restarted one back first)
#
# Source RUN_DIR/stack.env to get BASE_URL, PG_DSN, REDIS_URL, ADMIN_TOKEN, ...
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib/stack-fns.sh
. "$ROOT/scripts/lib/stack-fns.sh"
# shellcheck source=scripts/lib/pg-ha.sh
. "$ROOT/scripts/lib/pg-ha.sh"
RUN_DIR=${RUN_DIR:-$ROOT/.run}
case "$RUN_DIR" in /*) ;; *) RUN_DIR="$PWD/$RUN_DIR" ;; esac
RUN_DIR=${RUN_DIR%/}
INSTANCES=${INSTANCES:-2}
NGINX_PORT=${NGINX_PORT:-8080}
APP_PORT_BASE=${APP_PORT_BASE:-8081}
PG_PORT=${PG_PORT:-auto}
REDIS_PORT=${REDIS_PORT:-auto}
REDIS_HA=${REDIS_HA:-0}
REDIS_CLUSTER=${REDIS_CLUSTER:-0}
CLUSTER_NODES=6   # REDIS_CLUSTER=1: 3 masters, a replica each
PG_HA=${PG_HA:-0}
REDIS_MASTER_NAME=${REDIS_MASTER_NAME:-seckill}
SENTINEL_DOWN_AFTER_MS=${SENTINEL_DOWN_AFTER_MS:-2000}
SENTINEL_FAILOVER_TIMEOUT_MS=${SENTINEL_FAILOVER_TIMEOUT_MS:-3000}
HA_NODES=3        # Redis servers (a master, two replicas) and Sentinels of REDIS_HA=1
EXTERNAL_PG_DSN=${EXTERNAL_PG_DSN:-}
EXTERNAL_REDIS_URL=${EXTERNAL_REDIS_URL:-}
REDIS_APPENDFSYNC=${REDIS_APPENDFSYNC:-}
if [[ -z "$REDIS_APPENDFSYNC" && "${SECKILL_STOCK:-}" == redis ]]; then
    REDIS_APPENDFSYNC=always
fi
ZK_PORT=${ZK_PORT:-auto}
# The lock services a lock strategy needs besides Redis and Postgres.
if [[ -z "${LOCK_SERVICES+x}" ]]; then
    case "${SECKILL_LOCK:-}" in
        zk) LOCK_SERVICES=zk ;;
        *) LOCK_SERVICES="" ;;
    esac
fi
SECKILL_BIN=${SECKILL_BIN:-$ROOT/build/seckill}
case "$SECKILL_BIN" in /*) ;; *) SECKILL_BIN="$PWD/$SECKILL_BIN" ;; esac
STACK_TIMEOUT=${STACK_TIMEOUT:-30}
ROLLING_PAUSE_S=${ROLLING_PAUSE_S:-4}
# An instance stopping drains first: it serves the connections it has until
# their clients close them (SHUTDOWN_DRAIN_MS, 6 s by default) and lets the
# requests in flight finish (5 s at most). SIGKILL only past this.
APP_STOP_S=20
LUA_DIR_STACK=${LUA_DIR:-$ROOT/lua}
case "$LUA_DIR_STACK" in /*) ;; *) LUA_DIR_STACK="$PWD/$LUA_DIR_STACK" ;; esac
DB_NAME=seckill       # its schema: SCHEMA_FILES (scripts/lib/stack-fns.sh)

PIDS="$RUN_DIR/pids"
STATE_FILE="$RUN_DIR/stack.state"
ENV_FILE="$RUN_DIR/stack.env"

log() { printf 'stack: %s\n' "$*" >&2; }
die() { printf 'stack: error: %s\n' "$*" >&2; exit 1; }

# ------------------------------------------------------------------ helpers

# pid file format: line 1 the PID, line 2 a glob its /proc/PID/cmdline must match.
write_pidfile() {
    local name=$1 pid=$2 pattern=$3
    printf '%s\n%s\n' "$pid" "$pattern" >"$PIDS/$name.pid"
}

# Prints the PID of a pid file if that process lives and is the expected
# program; returns 1 otherwise (no file, dead, or a reused PID).
live_pid() {
    local file="$PIDS/$1.pid" pid pattern cmd
    [[ -f "$file" ]] || return 1
    pid=$(sed -n 1p "$file")
    pattern=$(sed -n 2p "$file")
    [[ "$pid" =~ ^[0-9]+$ && -n "$pattern" ]] || return 1
    pid_alive "$pid" || return 1
    cmd=$(cmdline_of "$pid")
    # shellcheck disable=SC2053  # the pattern is a glob on purpose
    [[ -n "$cmd" && "$cmd" == $pattern ]] || return 1
    printf '%s\n' "$pid"
}

# Names of all pid files present (without .pid), nginx first, postgres last:
# the order to stop in.
pid_names() {
    local f n
    [[ -d "$PIDS" ]] || return 0
    [[ -f "$PIDS/nginx.pid" ]] && echo nginx
    for f in "$PIDS"/app-*.pid; do
        [[ -e "$f" ]] || continue
        n=$(basename "$f" .pid)
        echo "$n"
    done | sort -t- -k2 -n
    [[ -f "$PIDS/zk.pid" ]] && echo zk
    for f in "$PIDS"/sentinel-*.pid "$PIDS"/redis-*.pid; do
        [[ -e "$f" ]] && basename "$f" .pid
    done
    [[ -f "$PIDS/redis.pid" ]] && echo redis
    [[ -f "$PIDS/postgres.pid" ]] && echo postgres
    for f in "$PIDS"/pg-node-*.pid; do
        [[ -e "$f" ]] && basename "$f" .pid
    done
    [[ -f "$PIDS/pg-monitor.pid" ]] && echo pg-monitor
    return 0
}

# True when something listens on 127.0.0.1:PORT or the port cannot be bound.
# SO_REUSEADDR, like the servers: connections in TIME_WAIT do not count.
port_busy() {
    python3 - "$1" <<'EOF'
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(0)
sys.exit(1)
EOF
}

# Dies with a clear message when PORT (of WHAT, set by VAR) is taken.
require_free_port() {
    local port=$1 what=$2 var=$3 owner=""
    port_busy "$port" || return 0
    if command -v ss >/dev/null 2>&1; then
        owner=$(ss -Hltnp "sport = :$port" 2>/dev/null | grep -o 'users:(([^)]*))' | head -n 1 || true)
    fi
    die "port $port ($what) is already in use on 127.0.0.1${owner:+ by $owner}; stop that program or set $var to another port (or $var=auto)"
}

is_port() { [[ "$1" =~ ^[0-9]+$ ]] && (($1 > 0 && $1 < 65536)); }

find_nginx() {
    local n
    n=$(command -v nginx 2>/dev/null || true)
    [[ -n "$n" ]] || { [[ -x /usr/sbin/nginx ]] && n=/usr/sbin/nginx; }
    [[ -n "$n" ]] || die "nginx not found (run 'make deps')"
    echo "$n"
}

http_ok() { curl -fsS --max-time 2 -o /dev/null "$1"; }

# ------------------------------------------------------------------ state

# What runs now according to the pid files: sets LIVE (names) and DEAD (names).
scan() {
    LIVE=()
    DEAD=()
    local n
    while read -r n; do
        [[ -n "$n" ]] || continue
        if live_pid "$n" >/dev/null; then LIVE+=("$n"); else DEAD+=("$n"); fi
    done < <(pid_names)
}

# Values recorded by the last start (empty when none).
state_get() {
    local key=$1
    [[ -f "$STATE_FILE" ]] || return 0
    sed -n "s/^$key=//p" "$STATE_FILE" | tail -n 1
}

# ------------------------------------------------------------------ start

check_prereqs() {
    local c
    for c in python3 curl psql pg_isready redis-cli; do
        command -v "$c" >/dev/null 2>&1 || die "'$c' not found (run 'make deps')"
    done
    [[ -x "$SECKILL_BIN" ]] || die "$SECKILL_BIN is missing: run 'make'"
    [[ -d "$LUA_DIR_STACK" ]] || die "LUA_DIR $LUA_DIR_STACK is missing"
    if ! [[ "$INSTANCES" =~ ^[0-9]+$ ]] || ((INSTANCES < 1 || INSTANCES > 64)); then
        die "INSTANCES must be 1..64 (got '$INSTANCES')"
    fi
    [[ "$STACK_TIMEOUT" =~ ^[0-9]+$ ]] || die "STACK_TIMEOUT must be a number of seconds"
    local v kv
    for v in $(compgen -v INSTANCE_ENV_); do
        [[ "$v" =~ ^INSTANCE_ENV_[0-9]+$ ]] || die "$v: expected INSTANCE_ENV_<instance number>"
        for kv in ${!v}; do
            [[ "$kv" =~ ^[A-Z][A-Z0-9_]*=[^\'\"]*$ ]] || die "$v: '$kv' is not NAME=value"
        done
    done
    if [[ -z "$EXTERNAL_PG_DSN" ]]; then
        command -v redis-server >/dev/null 2>&1 || [[ -n "$EXTERNAL_REDIS_URL" ]] ||
            die "redis-server not found (run 'make deps')"
        find_pg_bin >/dev/null
    fi
    find_nginx >/dev/null
}

# Chooses every port (fixed ones are checked, 'auto' ones picked) into
# P_NGINX, P_PG, P_REDIS and P_APP (array).
choose_ports() {
    local -a want=() names=() vars=()
    local nfree=0 i p
    [[ "$NGINX_PORT" == auto ]] || is_port "$NGINX_PORT" || die "NGINX_PORT must be a port or 'auto'"
    [[ "$APP_PORT_BASE" == auto ]] || is_port "$APP_PORT_BASE" || die "APP_PORT_BASE must be a port or 'auto'"
    [[ "$PG_PORT" == auto ]] || is_port "$PG_PORT" || die "PG_PORT must be a port or 'auto'"
    [[ "$REDIS_PORT" == auto ]] || is_port "$REDIS_PORT" || die "REDIS_PORT must be a port or 'auto'"
    [[ "$REDIS_HA" == 0 || "$REDIS_HA" == 1 ]] || die "REDIS_HA must be 0 or 1"
    [[ "$PG_HA" == 0 || "$PG_HA" == 1 ]] || die "PG_HA must be 0 or 1"
    [[ "$REDIS_CLUSTER" == 0 || "$REDIS_CLUSTER" == 1 ]] || die "REDIS_CLUSTER must be 0 or 1"
    if [[ "$REDIS_CLUSTER" == 1 ]]; then
        [[ "$REDIS_HA" == 0 ]] || die "REDIS_CLUSTER=1 and REDIS_HA=1: a cluster fails over by itself; choose one"
        [[ -z "$EXTERNAL_REDIS_URL" ]] || die "REDIS_CLUSTER=1 starts its own Redis servers: unset EXTERNAL_REDIS_URL"
        [[ "$REDIS_PORT" == auto ]] || die "REDIS_CLUSTER=1 picks free ports for its nodes: unset REDIS_PORT"
    fi
    if [[ "$PG_HA" == 1 ]]; then
        [[ -z "$EXTERNAL_PG_DSN" ]] || die "PG_HA=1 starts its own Postgres servers: unset EXTERNAL_PG_DSN"
        [[ "$PG_PORT" == auto ]] || die "PG_HA=1 picks free ports for its servers: unset PG_PORT"
    fi
    if [[ "$REDIS_HA" == 1 ]]; then
        [[ -z "$EXTERNAL_REDIS_URL" ]] || die "REDIS_HA=1 starts its own Redis servers: unset EXTERNAL_REDIS_URL"
        [[ "$REDIS_MASTER_NAME" =~ ^[A-Za-z0-9._-]+$ ]] || die "REDIS_MASTER_NAME: letters, digits, '.', '_', '-'"
        [[ "$SENTINEL_DOWN_AFTER_MS" =~ ^[0-9]+$ && "$SENTINEL_FAILOVER_TIMEOUT_MS" =~ ^[0-9]+$ ]] ||
            die "SENTINEL_DOWN_AFTER_MS and SENTINEL_FAILOVER_TIMEOUT_MS must be numbers of ms"
    fi

    [[ "$NGINX_PORT" == auto ]] && nfree=$((nfree + 1))
    [[ "$APP_PORT_BASE" == auto ]] && nfree=$((nfree + INSTANCES))
    [[ -z "$EXTERNAL_PG_DSN" && "$PG_PORT" == auto && "$PG_HA" == 0 ]] && nfree=$((nfree + 1))
    [[ "$PG_HA" == 1 ]] && nfree=$((nfree + 1 + PGHA_NODES))
    [[ -z "$EXTERNAL_REDIS_URL" && "$REDIS_PORT" == auto && "$REDIS_HA" == 0 && "$REDIS_CLUSTER" == 0 ]] && nfree=$((nfree + 1))
    [[ "$REDIS_HA" == 1 ]] && nfree=$((nfree + 2 * HA_NODES))
    [[ "$ZK_PORT" == auto ]] || is_port "$ZK_PORT" || die "ZK_PORT must be a port or 'auto'"
    lock_service zk && [[ "$ZK_PORT" == auto ]] && nfree=$((nfree + 1))
    local -a free=()
    if ((nfree > 0)); then mapfile -t free < <(free_ports "$nfree"); fi
    local k=0
    next_free() { FREE_PORT=${free[$k]}; k=$((k + 1)); }

    if [[ "$NGINX_PORT" == auto ]]; then next_free; P_NGINX=$FREE_PORT; else P_NGINX=$NGINX_PORT; want+=("$P_NGINX"); names+=(nginx); vars+=(NGINX_PORT); fi
    P_APP=()
    for ((i = 1; i <= INSTANCES; i++)); do
        if [[ "$APP_PORT_BASE" == auto ]]; then
            next_free; P_APP+=("$FREE_PORT")
        else
            p=$((APP_PORT_BASE + i - 1))
            is_port "$p" || die "APP_PORT_BASE+$((i - 1)) = $p is not a port"
            P_APP+=("$p"); want+=("$p"); names+=("instance $i"); vars+=(APP_PORT_BASE)
        fi
    done
    P_PG="" P_REDIS=""
    P_HA_REDIS=() P_HA_SENTINEL=()
    P_PG_MONITOR="" P_PG_NODES=()
    if [[ "$PG_HA" == 1 ]]; then
        next_free; P_PG_MONITOR=$FREE_PORT
        for ((i = 0; i < PGHA_NODES; i++)); do next_free; P_PG_NODES+=("$FREE_PORT"); done
    elif [[ -z "$EXTERNAL_PG_DSN" ]]; then
        if [[ "$PG_PORT" == auto ]]; then next_free; P_PG=$FREE_PORT; else P_PG=$PG_PORT; want+=("$P_PG"); names+=(postgres); vars+=(PG_PORT); fi
    fi
    if [[ "$REDIS_HA" == 1 ]]; then
        for ((i = 0; i < HA_NODES; i++)); do next_free; P_HA_REDIS+=("$FREE_PORT"); done
        for ((i = 0; i < HA_NODES; i++)); do next_free; P_HA_SENTINEL+=("$FREE_PORT"); done
    elif [[ -z "$EXTERNAL_REDIS_URL" && "$REDIS_CLUSTER" == 0 ]]; then
        if [[ "$REDIS_PORT" == auto ]]; then next_free; P_REDIS=$FREE_PORT; else P_REDIS=$REDIS_PORT; want+=("$P_REDIS"); names+=(redis); vars+=(REDIS_PORT); fi
    fi
    P_ZK=""
    if lock_service zk; then
        if [[ "$ZK_PORT" == auto ]]; then next_free; P_ZK=$FREE_PORT; else P_ZK=$ZK_PORT; want+=("$P_ZK"); names+=(zookeeper); vars+=(ZK_PORT); fi
    fi
    # Distinct, and free.
    local all="$P_NGINX ${P_APP[*]} $P_PG $P_PG_MONITOR ${P_PG_NODES[*]} $P_REDIS ${P_HA_REDIS[*]} ${P_HA_SENTINEL[*]} $P_ZK"
    local dup
    dup=$(tr ' ' '\n' <<<"$all" | sed '/^$/d' | sort | uniq -d | head -n 1)
    [[ -z "$dup" ]] || die "port $dup is configured twice (NGINX_PORT, APP_PORT_BASE, PG_PORT, REDIS_PORT)"
    for ((i = 0; i < ${#want[@]}; i++)); do
        require_free_port "${want[$i]}" "${names[$i]}" "${vars[$i]}"
    done
}

admin_token() {
    if [[ -n "${ADMIN_TOKEN:-}" ]]; then
        printf '%s' "$ADMIN_TOKEN" >"$RUN_DIR/admin_token"
    elif [[ ! -s "$RUN_DIR/admin_token" ]]; then
        od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$RUN_DIR/admin_token"
    fi
    chmod 600 "$RUN_DIR/admin_token"
    ADMIN_TOKEN=$(cat "$RUN_DIR/admin_token")
}

start_postgres() {
    local port=$1 data="$RUN_DIR/pg/data" old
    # A postmaster from an earlier run that lost its pid file must not have its
    # data directory removed under it.
    if [[ -f "$data/postmaster.pid" ]]; then
        old=$(head -n 1 "$data/postmaster.pid")
        if [[ "$old" =~ ^[0-9]+$ ]] && pid_alive "$old" &&
            [[ "$(cmdline_of "$old")" == *postgres* ]]; then
            die "a Postgres from an earlier run still runs on $data (pid $old): stop it (kill -INT $old) and retry"
        fi
    fi
    rm -rf "$RUN_DIR/pg"
    local threads=${THREADS:-8} maxconn
    [[ "$threads" =~ ^[0-9]+$ ]] || threads=8
    maxconn=$((INSTANCES * (threads + 4) + 40))
    ((maxconn >= 100)) || maxconn=100
    if [[ -n "${PG_MAX_CONNECTIONS:-}" ]]; then
        [[ "$PG_MAX_CONNECTIONS" =~ ^[0-9]+$ ]] && ((PG_MAX_CONNECTIONS >= 10)) ||
            die "PG_MAX_CONNECTIONS must be a number >= 10"
        maxconn=$PG_MAX_CONNECTIONS
    fi
    local durable=off
    [[ "${PG_DURABLE:-0}" == 1 ]] && durable=on
    # In a session of its own (setsid), like every process of the stack: a
    # Ctrl-C in the terminal that started it does not reach it.
    pg_start "$RUN_DIR/pg" "$port" "scripts/stack.sh: a throwaway database on loopback." <<EOF
max_connections = $maxconn
shared_buffers = 128MB
fsync = $durable
synchronous_commit = $durable
full_page_writes = $durable
EOF
    local pid=$PG_STARTED_PID bin
    bin=$(find_pg_bin)
    write_pidfile postgres "$pid" "*/postgres -D $data*"
    live_pid postgres >/dev/null || die "Postgres pid $pid does not look like $bin/postgres -D $data: $(cmdline_of "$pid")"
    pg_wait_ready "$RUN_DIR/pg" "$port" "$pid"
    pg_create_db "$port" "$DB_NAME"
    log "Postgres pid $pid on 127.0.0.1:$port (data $data)"
}

load_schema() {
    load_sql "$1" "$RUN_DIR/logs/schema.log" "${SCHEMA_FILES[@]}"
}

start_redis() {
    local port=$1 pid aof=(--appendonly no)
    case "$REDIS_APPENDFSYNC" in
        '') ;;
        always | everysec | no) aof=(--appendonly yes --appendfsync "$REDIS_APPENDFSYNC") ;;
        *) die "REDIS_APPENDFSYNC must be always, everysec or no (got '$REDIS_APPENDFSYNC')" ;;
    esac
    # In a session of its own (setsid), as Postgres.
    redis_spawn "$RUN_DIR/redis" "$port" "${aof[@]}"
    pid=$REDIS_STARTED_PID
    write_pidfile redis "$pid" "redis-server 127.0.0.1:$port*"
    redis_wait_ready "$RUN_DIR/redis" "$port" "$pid"
    live_pid redis >/dev/null || die "Redis pid $pid does not look like redis-server 127.0.0.1:$port: $(cmdline_of "$pid")"
    log "Redis pid $pid on 127.0.0.1:$port"
}

# Is NAME one of LOCK_SERVICES?
lock_service() { [[ " $LOCK_SERVICES " == *" $1 "* ]]; }

# ZooKeeper for SECKILL_LOCK=zk: scripts/zk.sh under RUN_DIR/zk.
start_zk() {
    local port=$1 out pid
    out=$(ZK_TIMEOUT=$STACK_TIMEOUT "$ROOT/scripts/zk.sh" start "$RUN_DIR/zk" "$port") ||
        die "ZooKeeper did not start on 127.0.0.1:$port (log: $RUN_DIR/zk/zk.log)"
    pid=$("$ROOT/scripts/zk.sh" pid "$RUN_DIR/zk") || die "ZooKeeper is not running after start"
    write_pidfile zk "$pid" "*ZooKeeperServerMain $RUN_DIR/zk/zoo.cfg*"
    STACK_ZK_HOSTS=${out#ZK_HOSTS=}
    log "ZooKeeper pid $pid on $STACK_ZK_HOSTS"
}

# ---- REDIS_HA=1: a master, two replicas, three Sentinels

# True when the Redis on PORT is a replica whose link to its master is up.
replica_synced() { redis-cli -h 127.0.0.1 -p "$1" info replication 2>/dev/null | grep -q '^master_link_status:up'; }

# Starts Redis server I (redis-I) on PORT; a replica of MASTER_PORT when given.
start_ha_redis() {
    local i=$1 port=$2 master=${3:-} pid dir="$RUN_DIR/redis-$1"
    local -a args=(--bind 127.0.0.1 --port "$port" --save '' --appendonly no --daemonize no
        --dir "$dir" --logfile "$dir/redis.log" --protected-mode yes)
    [[ -z "$master" ]] || args+=(--replicaof 127.0.0.1 "$master")
    rm -rf "$dir"
    mkdir -p "$dir"
    setsid redis-server "${args[@]}" </dev/null >/dev/null 2>&1 &
    pid=$!
    write_pidfile "redis-$i" "$pid" "redis-server 127.0.0.1:$port*"
    wait_for "Redis $i" "$pid" redis_ping "$port" || {
        tail_log "$dir/redis.log"; die "Redis $i did not start on 127.0.0.1:$port"; }
    live_pid "redis-$i" >/dev/null || die "Redis $i pid $pid does not look like redis-server 127.0.0.1:$port"
    log "Redis $i pid $pid on 127.0.0.1:$port${master:+ (replica of 127.0.0.1:$master)}"
}

# True when the Sentinel on PORT sees the master, both replicas and the other Sentinels.
sentinel_complete() {
    local out
    out=$(redis-cli -h 127.0.0.1 -p "$1" sentinel master "$REDIS_MASTER_NAME" 2>/dev/null) || return 1
    [[ "$(awk '/^num-slaves$/{getline; print}' <<<"$out")" == $((HA_NODES - 1)) &&
        "$(awk '/^num-other-sentinels$/{getline; print}' <<<"$out")" == $((HA_NODES - 1)) ]]
}

# Sentinel I on PORT, watching the master on MASTER_PORT. Its config file is
# its own, under RUN_DIR: Sentinel rewrites it with what it learns.
start_sentinel() {
    local i=$1 port=$2 master=$3 pid dir="$RUN_DIR/sentinel-$1"
    rm -rf "$dir"
    mkdir -p "$dir"
    cat >"$dir/sentinel.conf" <<EOF
# scripts/stack.sh (REDIS_HA=1): Sentinel $i. Rewritten by Sentinel itself.
port $port
bind 127.0.0.1
daemonize no
dir $dir
logfile $dir/sentinel.log
sentinel monitor $REDIS_MASTER_NAME 127.0.0.1 $master 2
sentinel down-after-milliseconds $REDIS_MASTER_NAME $SENTINEL_DOWN_AFTER_MS
sentinel failover-timeout $REDIS_MASTER_NAME $SENTINEL_FAILOVER_TIMEOUT_MS
sentinel parallel-syncs $REDIS_MASTER_NAME 1
EOF
    setsid redis-server "$dir/sentinel.conf" --sentinel </dev/null >/dev/null 2>&1 &
    pid=$!
    write_pidfile "sentinel-$i" "$pid" "redis-server 127.0.0.1:$port*"
    wait_for "Sentinel $i" "$pid" redis_ping "$port" || {
        tail_log "$dir/sentinel.log"; die "Sentinel $i did not start on 127.0.0.1:$port"; }
    live_pid "sentinel-$i" >/dev/null || die "Sentinel $i pid $pid does not look like redis-server 127.0.0.1:$port"
    log "Sentinel $i pid $pid on 127.0.0.1:$port"
}

start_redis_ha() {
    local i
    start_ha_redis 1 "${P_HA_REDIS[0]}"
    for ((i = 1; i < HA_NODES; i++)); do start_ha_redis $((i + 1)) "${P_HA_REDIS[$i]}" "${P_HA_REDIS[0]}"; done
    for ((i = 1; i < HA_NODES; i++)); do
        wait_for "replica $((i + 1)) in sync" "" replica_synced "${P_HA_REDIS[$i]}" ||
            die "Redis $((i + 1)) did not sync with the master"
    done
    for ((i = 0; i < HA_NODES; i++)); do start_sentinel $((i + 1)) "${P_HA_SENTINEL[$i]}" "${P_HA_REDIS[0]}"; done
    # A failover needs the Sentinels to know each other and the replicas
    # (they meet through hello messages every 2 s).
    for ((i = 0; i < HA_NODES; i++)); do
        wait_for "Sentinel $((i + 1)) to see every node" "" sentinel_complete "${P_HA_SENTINEL[$i]}" || {
            tail_log "$RUN_DIR/sentinel-$((i + 1))/sentinel.log"; die "Sentinel $((i + 1)) does not see the replicas and the other Sentinels"; }
    done
}

# REDIS_CLUSTER=1: 3 masters and 3 replicas under RUN_DIR/redis-cluster.
start_redis_cluster() {
    local dir="$RUN_DIR/redis-cluster" line
    [[ ! -d "$dir" ]] || "$ROOT/scripts/redis-cluster.sh" stop "$dir" || true
    rm -rf "$dir"
    line=$(REDIS_CLUSTER_APPENDFSYNC=$REDIS_APPENDFSYNC REDIS_CLUSTER_TIMEOUT=$STACK_TIMEOUT \
        "$ROOT/scripts/redis-cluster.sh" start "$dir") || die "the Redis Cluster did not start (see $dir)"
    STACK_CLUSTER_NODES=${line#REDIS_CLUSTER_NODES=}
    [[ "$line" == REDIS_CLUSTER_NODES=* && -n "$STACK_CLUSTER_NODES" ]] ||
        die "scripts/redis-cluster.sh start printed '$line'"
    STACK_REDIS_URL=""
    log "Redis Cluster: $STACK_CLUSTER_NODES"
}

# The environment of instance I (NAME=value lines) -- on top of the launcher's
# own environment, which passes THREADS, DEMO_RANDOM_USER, SECKILL_*, ... through.
instance_env() {
    local i=$1 port=$2
    printf 'PORT=%s\n' "$port"
    printf 'BIND=%s\n' 127.0.0.1
    printf 'INSTANCE_ID=%s\n' "seckill-$i"
    printf 'PG_DSN=%s\n' "$STACK_PG_DSN"
    if [[ "$PG_HA" == 1 ]]; then printf 'PG_HA=1\n'; fi
    if [[ -n "${STACK_CLUSTER_NODES:-}" ]]; then
        printf 'REDIS_CLUSTER_NODES=%s\n' "$STACK_CLUSTER_NODES"
    else
        printf 'REDIS_URL=%s\n' "$STACK_REDIS_URL"
    fi
    printf 'ADMIN_TOKEN=%s\n' "$ADMIN_TOKEN"
    printf 'LUA_DIR=%s\n' "$LUA_DIR_STACK"
    printf 'LOG_LEVEL=%s\n' "${LOG_LEVEL:-warn}"
    printf 'THREADS=%s\n' "${THREADS:-8}"
    printf 'IO_THREADS=%s\n' "${IO_THREADS:-2}"
    printf 'DEMO_RANDOM_USER=%s\n' "${DEMO_RANDOM_USER:-0}"
    if [[ -n "${STACK_ZK_HOSTS:-}" ]]; then printf 'ZK_HOSTS=%s\n' "$STACK_ZK_HOSTS"; fi
    if [[ -n "${STACK_SENTINELS:-}" ]]; then
        printf 'REDIS_SENTINELS=%s\n' "$STACK_SENTINELS"
        printf 'REDIS_MASTER_NAME=%s\n' "$REDIS_MASTER_NAME"
    fi
    # INSTANCE_ENV_<i>: this instance's own extra settings.
    local extra="INSTANCE_ENV_$i" kv
    for kv in ${!extra:-}; do
        [[ "$kv" =~ ^[A-Z][A-Z0-9_]*= ]] || die "$extra: '$kv' is not NAME=value"
        printf '%s\n' "$kv"
    done
}

start_instance() {
    local i=$1 port=$2 pid
    local logf="$RUN_DIR/logs/app-$i.log"
    local -a envs=()
    mapfile -t envs < <(instance_env "$i" "$port")
    : >"$logf"
    (
        cd "$RUN_DIR"
        # The stack's Redis, not one the caller's environment names.
        [[ -n "${STACK_SENTINELS:-}" ]] || unset REDIS_SENTINELS
        [[ -n "${STACK_CLUSTER_NODES:-}" ]] || unset REDIS_CLUSTER_NODES
        [[ -z "${STACK_CLUSTER_NODES:-}" ]] || unset REDIS_URL
        exec setsid env "${envs[@]}" "$SECKILL_BIN" "--port=$port" "--instance-id=seckill-$i" \
            </dev/null >>"$logf" 2>&1
    ) &
    pid=$!
    write_pidfile "app-$i" "$pid" "$SECKILL_BIN --port=$port --instance-id=seckill-$i*"
}

wait_instance() {
    local i=$1 port=$2 pid
    pid=$(sed -n 1p "$PIDS/app-$i.pid")
    if ! wait_for "instance seckill-$i" "$pid" http_ok "http://127.0.0.1:$port/health"; then
        tail_log "$RUN_DIR/logs/app-$i.log"
        die "instance seckill-$i did not answer GET /health on 127.0.0.1:$port"
    fi
    live_pid "app-$i" >/dev/null || die "instance $i pid $pid is not $SECKILL_BIN: $(cmdline_of "$pid")"
    if ! wait_for "instance seckill-$i (ready)" "$pid" http_ok "http://127.0.0.1:$port/ready"; then
        tail_log "$RUN_DIR/logs/app-$i.log"
        die "instance seckill-$i answers /health but not /ready (Postgres or Redis unreachable)"
    fi
    log "instance seckill-$i pid $pid on 127.0.0.1:$port"
}

start_nginx() {
    local port=$1 bin dir="$RUN_DIR/nginx" pid i
    local -a ups=()
    bin=$(find_nginx)
    for ((i = 0; i < ${#P_APP[@]}; i++)); do ups+=(--upstream "127.0.0.1:${P_APP[$i]}"); done
    rm -rf "$dir"
    mkdir -p "$dir"
    "$ROOT/nginx/gen-conf.sh" --prefix "$dir" --listen "127.0.0.1:$port" "${ups[@]}" -o "$dir/nginx.conf"
    if ! "$bin" -t -q -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" >"$dir/test.log" 2>&1; then
        tail_log "$dir/test.log"
        die "nginx rejected $dir/nginx.conf"
    fi
    if ! "$bin" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" -g 'daemon on;' >"$dir/start.log" 2>&1; then
        tail_log "$dir/start.log"
        tail_log "$dir/error.log"
        die "nginx did not start on 127.0.0.1:$port"
    fi
    for ((i = 0; i < 50; i++)); do
        [[ -s "$dir/nginx.pid" ]] && break
        sleep 0.1
    done
    pid=$(cat "$dir/nginx.pid" 2>/dev/null || true)
    [[ -n "$pid" ]] || die "nginx wrote no pid file ($dir/nginx.pid)"
    write_pidfile nginx "$pid" "nginx: master process * -c $dir/nginx.conf*"
    # The master renames itself ("nginx: master process ...") a moment after
    # writing its pid file: give it that moment on a busy machine.
    for ((i = 0; i < 50; i++)); do
        live_pid nginx >/dev/null && break
        sleep 0.1
    done
    live_pid nginx >/dev/null || die "nginx pid $pid does not look like nginx: $(cmdline_of "$pid")"
    wait_for "nginx" "$pid" http_ok "http://127.0.0.1:$port/health" || {
        tail_log "$dir/error.log"; die "nginx does not pass GET /health to the instances"; }
    log "nginx pid $pid on 127.0.0.1:$port -> ${P_APP[*]}"
}

# Values in the env file are single-quoted: none of them may hold a quote.
write_env_file() {
    [[ "$STACK_PG_DSN$STACK_REDIS_URL$ADMIN_TOKEN$RUN_DIR" != *"'"* ]] ||
        die "RUN_DIR, PG_DSN, REDIS_URL and ADMIN_TOKEN must not contain a single quote"
    local urls="" i
    for ((i = 0; i < ${#P_APP[@]}; i++)); do urls+="http://127.0.0.1:${P_APP[$i]} "; done
    local ids=""
    for ((i = 1; i <= INSTANCES; i++)); do ids+="seckill-$i "; done
    {
        printf '# Written by scripts/stack.sh start on %s. Source it: . %s\n' "$(date -u +%FT%TZ)" "$ENV_FILE"
        printf "export %s='%s'\n" \
            RUN_DIR "$RUN_DIR" \
            BASE_URL "http://127.0.0.1:$P_NGINX" \
            NGINX_PORT "$P_NGINX" \
            NGINX_ACCESS_LOG "$RUN_DIR/nginx/access.log" \
            INSTANCES "$INSTANCES" \
            INSTANCE_IDS "${ids% }" \
            INSTANCE_PORTS "${P_APP[*]}" \
            INSTANCE_URLS "${urls% }" \
            PG_DSN "$STACK_PG_DSN" \
            PG_PORT "$P_PG" \
            REDIS_URL "$STACK_REDIS_URL" \
            REDIS_PORT "$P_REDIS" \
            ZK_HOSTS "${STACK_ZK_HOSTS:-}" \
            ADMIN_TOKEN "$ADMIN_TOKEN"
        if [[ "$PG_HA" == 1 ]]; then
            printf "export %s='%s'\n" \
                PG_HA 1 \
                PG_HA_DIR "$RUN_DIR/pg-ha" \
                PG_MONITOR_PORT "$P_PG_MONITOR" \
                PG_NODE_PORTS "${P_PG_NODES[*]}"
        fi
        if [[ "$REDIS_CLUSTER" == 1 ]]; then
            printf "export %s='%s'\n" \
                REDIS_CLUSTER 1 \
                REDIS_CLUSTER_NODES "$STACK_CLUSTER_NODES" \
                REDIS_CLUSTER_DIR "$RUN_DIR/redis-cluster"
        fi
        if [[ "$REDIS_HA" == 1 ]]; then
            printf "export %s='%s'\n" \
                REDIS_HA 1 \
                REDIS_SENTINELS "$STACK_SENTINELS" \
                REDIS_MASTER_NAME "$REDIS_MASTER_NAME" \
                REDIS_PORTS "${P_HA_REDIS[*]}" \
                SENTINEL_PORTS "${P_HA_SENTINEL[*]}" \
                SENTINEL_DOWN_AFTER_MS "$SENTINEL_DOWN_AFTER_MS" \
                SENTINEL_FAILOVER_TIMEOUT_MS "$SENTINEL_FAILOVER_TIMEOUT_MS"
        fi
    } >"$ENV_FILE.tmp"
    chmod 600 "$ENV_FILE.tmp"
    mv -f "$ENV_FILE.tmp" "$ENV_FILE"
}

# The settings a running stack must share with this start to be reused as it
# is: the launcher's own, every server setting the binary knows (its --help)
# and SECKILL_*, and the binary itself (rebuilt: restart).
CONFIG_VARS=(INSTANCES NGINX_PORT APP_PORT_BASE PG_PORT REDIS_PORT EXTERNAL_PG_DSN EXTERNAL_REDIS_URL
    SECKILL_BIN LUA_DIR_STACK PG_DURABLE PG_MAX_CONNECTIONS NGINX_ALLOW NGINX_EDGE REDIS_HA PG_HA REDIS_CLUSTER
    SENTINEL_DOWN_AFTER_MS SENTINEL_FAILOVER_TIMEOUT_MS LOCK_SERVICES ZK_PORT)
config_signature() {
    local v
    {
        for v in "${CONFIG_VARS[@]}"; do printf '%s=%s\n' "$v" "${!v:-}"; done
        for v in $("$SECKILL_BIN" --help 2>&1 | awk '/^  [A-Z][A-Z0-9_]+ /{print $1}'); do
            case "$v" in PORT | BIND | INSTANCE_ID | PG_DSN | REDIS_URL | ADMIN_TOKEN | LUA_DIR | REDIS_SENTINELS | REDIS_CLUSTER_NODES | ZK_HOSTS) continue ;; esac
            printf '%s=%s\n' "$v" "${!v:-}"
        done
        env | grep -E '^(SECKILL_[A-Z_]*|INSTANCE_ENV_[0-9]+)=' | grep -v '^SECKILL_BIN=' | sort || true
        stat -c '%Y %s' "$SECKILL_BIN"
    } | cksum | cut -d' ' -f1
}

# Is the running stack complete and healthy, started with the same settings?
healthy() {
    local n i port base
    WHY=""
    [[ -f "$ENV_FILE" ]] || { WHY="it never became ready (no env file)"; return 1; }
    n=$(state_get INSTANCES)
    [[ "$(state_get CONFIG)" == "$(config_signature)" ]] ||
        { WHY="it was started with other settings or another build"; return 1; }
    if [[ -n "${ADMIN_TOKEN:-}" && "$ADMIN_TOKEN" != "$(cat "$RUN_DIR/admin_token" 2>/dev/null)" ]]; then
        WHY="it has another ADMIN_TOKEN"
        return 1
    fi
    ((${#DEAD[@]} == 0)) || { WHY="these are gone: ${DEAD[*]}"; return 1; }
    live_pid nginx >/dev/null || { WHY="nginx is not running"; return 1; }
    for ((i = 1; i <= n; i++)); do
        live_pid "app-$i" >/dev/null || { WHY="instance $i is not running"; return 1; }
    done
    if [[ "$(state_get PG_HA)" == 1 ]]; then
        live_pid pg-monitor >/dev/null || { WHY="the pg_auto_failover monitor is not running"; return 1; }
        for ((i = 1; i <= PGHA_NODES; i++)); do
            live_pid "pg-node-$i" >/dev/null || { WHY="Postgres data node $i is not running"; return 1; }
        done
    else
        [[ -n "$(state_get EXTERNAL_PG_DSN)" ]] || live_pid postgres >/dev/null || { WHY="Postgres is not running"; return 1; }
    fi
    if [[ "$(state_get REDIS_CLUSTER)" == 1 ]]; then
        for ((i = 1; i <= CLUSTER_NODES; i++)); do
            "$ROOT/scripts/redis-cluster.sh" pid "$RUN_DIR/redis-cluster" "$i" >/dev/null 2>&1 ||
                { WHY="Redis Cluster node $i is not running"; return 1; }
        done
    elif [[ "$(state_get REDIS_HA)" == 1 ]]; then
        for ((i = 1; i <= HA_NODES; i++)); do
            live_pid "redis-$i" >/dev/null || { WHY="Redis $i is not running"; return 1; }
            live_pid "sentinel-$i" >/dev/null || { WHY="Sentinel $i is not running"; return 1; }
        done
    else
        [[ -n "$(state_get EXTERNAL_REDIS_URL)" ]] || live_pid redis >/dev/null || { WHY="Redis is not running"; return 1; }
    fi
    ! lock_service zk || live_pid zk >/dev/null || { WHY="ZooKeeper is not running"; return 1; }
    base=$(state_get BASE_URL)
    http_ok "$base/health" || { WHY="$base/health does not answer"; return 1; }
    for port in $(state_get INSTANCE_PORTS); do
        http_ok "http://127.0.0.1:$port/ready" || { WHY="the instance on port $port is not ready"; return 1; }
    done
}

STARTED_OK=0
on_start_exit() {
    local rc=$?
    if ((STARTED_OK == 0)); then
        log "start failed: stopping what was started"
        stop_all || true
    fi
    exit "$rc"
}

cmd_start() {
    local i
    check_prereqs
    mkdir -p "$RUN_DIR"
    scan
    if ((${#LIVE[@]} > 0)); then
        if healthy; then
            log "already running in $RUN_DIR with these settings ($INSTANCES instances, $(state_get BASE_URL)); 'make stop' (or $0 stop) stops it"
            return 0
        fi
        log "a stack runs in $RUN_DIR but $WHY: restarting it"
        stop_all
    elif ((${#DEAD[@]} > 0)); then
        log "removing stale pid files of a stack that is gone: ${DEAD[*]}"
        stop_all
    fi
    choose_ports

    rm -rf "$PIDS" "$RUN_DIR/logs"
    rm -f "$ENV_FILE"
    mkdir -p "$PIDS" "$RUN_DIR/logs"
    chmod 755 "$RUN_DIR"
    admin_token

    if [[ -n "$EXTERNAL_PG_DSN" ]]; then
        STACK_PG_DSN=$EXTERNAL_PG_DSN
    elif [[ "$PG_HA" == 1 ]]; then
        STACK_PG_DSN=""    # pg_autoctl show uri, once the formation runs
    else
        STACK_PG_DSN="host=127.0.0.1 port=$P_PG dbname=$DB_NAME user=postgres"
    fi
    STACK_SENTINELS=""
    if [[ "$REDIS_HA" == 1 ]]; then
        # The first master; the instances follow it through the Sentinels.
        P_REDIS=${P_HA_REDIS[0]}
        for ((i = 0; i < HA_NODES; i++)); do STACK_SENTINELS+="${STACK_SENTINELS:+,}127.0.0.1:${P_HA_SENTINEL[$i]}"; done
    fi
    if [[ -n "$EXTERNAL_REDIS_URL" ]]; then
        STACK_REDIS_URL=$EXTERNAL_REDIS_URL
    else
        STACK_REDIS_URL="redis://127.0.0.1:$P_REDIS/0"
    fi
    {
        echo "CONFIG=$(config_signature)"
        echo "INSTANCES=$INSTANCES"
        echo "BASE_URL=http://127.0.0.1:$P_NGINX"
        echo "INSTANCE_PORTS=${P_APP[*]}"
        echo "EXTERNAL_PG_DSN=$EXTERNAL_PG_DSN"
        echo "EXTERNAL_REDIS_URL=$EXTERNAL_REDIS_URL"
        echo "REDIS_HA=$REDIS_HA"
        echo "REDIS_CLUSTER=$REDIS_CLUSTER"
        echo "PG_HA=$PG_HA"
    } >"$STATE_FILE"

    STARTED_OK=0
    trap on_start_exit EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM

    if [[ "$PG_HA" == 1 ]]; then
        pgha_start "$P_PG_MONITOR" "${P_PG_NODES[@]}"
        STACK_PG_DSN=$PGHA_URI
    elif [[ -z "$EXTERNAL_PG_DSN" ]]; then
        start_postgres "$P_PG"
    fi
    load_schema "$STACK_PG_DSN"
    STACK_CLUSTER_NODES=""
    if [[ "$REDIS_CLUSTER" == 1 ]]; then
        start_redis_cluster
    elif [[ "$REDIS_HA" == 1 ]]; then
        start_redis_ha
    elif [[ -z "$EXTERNAL_REDIS_URL" ]]; then
        # A new start is a new database: an empty Redis too (service-start
        # keeps its files: a restart). With AOF on, the last run's files
        # would bring back its keys: stream entries for vouchers the new
        # database does not have, stock, buyers, counters.
        rm -rf "$RUN_DIR/redis"
        start_redis "$P_REDIS"
    else
        redis_url_ping "$STACK_REDIS_URL" ||
            die "EXTERNAL_REDIS_URL $(mask_redis_url "$STACK_REDIS_URL") does not answer PING"
    fi
    STACK_ZK_HOSTS=""
    if lock_service zk; then start_zk "$P_ZK"; fi
    local i
    for ((i = 1; i <= INSTANCES; i++)); do start_instance "$i" "${P_APP[$((i - 1))]}"; done
    for ((i = 1; i <= INSTANCES; i++)); do wait_instance "$i" "${P_APP[$((i - 1))]}"; done
    start_nginx "$P_NGINX"
    write_env_file
    STARTED_OK=1
    trap - EXIT INT TERM
    log "ready: BASE_URL=http://127.0.0.1:$P_NGINX ($INSTANCES instances); env file $ENV_FILE"
}

# The preamble of restart-instances and rolling-restart: a stack runs here
# with INSTANCES instances; sets P_APP, STACK_PG_DSN, STACK_REDIS_URL and
# ADMIN_TOKEN as its start did.
load_running_instances() {
    [[ -x "$SECKILL_BIN" ]] || die "$SECKILL_BIN is missing: run 'make'"
    [[ -f "$ENV_FILE" ]] || die "no stack runs in $RUN_DIR (no env file): start it first"
    live_pid nginx >/dev/null || die "nginx of the stack in $RUN_DIR is not running: start the stack first"
    local n
    n=$(state_get INSTANCES)
    [[ "$n" == "$INSTANCES" ]] ||
        die "the stack runs $n instances, INSTANCES is $INSTANCES: use restart for another count"
    read -r -a P_APP <<<"$(state_get INSTANCE_PORTS)"
    ((${#P_APP[@]} == n)) || die "$STATE_FILE lists ${#P_APP[@]} instance ports for $n instances"
    STACK_PG_DSN=$(. "$ENV_FILE" && printf '%s' "$PG_DSN")
    STACK_REDIS_URL=$(. "$ENV_FILE" && printf '%s' "$REDIS_URL")
    STACK_ZK_HOSTS=$(. "$ENV_FILE" && printf '%s' "${ZK_HOSTS:-}")
    STACK_SENTINELS=$(. "$ENV_FILE" && printf '%s' "${REDIS_SENTINELS:-}")
    STACK_CLUSTER_NODES=$(. "$ENV_FILE" && printf '%s' "${REDIS_CLUSTER_NODES:-}")
    [[ -z "$STACK_SENTINELS" ]] || REDIS_MASTER_NAME=$(. "$ENV_FILE" && printf '%s' "$REDIS_MASTER_NAME")
    ADMIN_TOKEN=$(cat "$RUN_DIR/admin_token")
    PG_HA=$(state_get PG_HA)
    PG_HA=${PG_HA:-0}
}

# Stops the instances of a running stack and starts them again with this
# environment; Postgres, Redis and nginx keep running (nginx reconnects).
cmd_restart_instances() {
    local i pid n
    load_running_instances
    n=${#P_APP[@]}
    # SIGINT: the instances drain without waiting for nginx to close its idle
    # connections (about 5 s each): every instance stops, so there is no
    # traffic to protect (rolling-restart is for that).
    for ((i = 1; i <= n; i++)); do
        if pid=$(live_pid "app-$i"); then stop_pid "app-$i" "$pid" INT "$APP_STOP_S"; fi
        rm -f "$PIDS/app-$i.pid"
    done
    for ((i = 1; i <= n; i++)); do require_free_port "${P_APP[$((i - 1))]}" "instance $i" APP_PORT_BASE; done
    for ((i = 1; i <= n; i++)); do start_instance "$i" "${P_APP[$((i - 1))]}"; done
    for ((i = 1; i <= n; i++)); do wait_instance "$i" "${P_APP[$((i - 1))]}"; done
    # The settings changed: a later 'start' with other ones restarts it all.
    sed -i "s/^CONFIG=.*/CONFIG=$(config_signature)/" "$STATE_FILE"
    log "instances restarted (${P_APP[*]})"
}

# The same, one instance at a time, with SIGTERM. A stopping instance drains: /ready turns
# 503, it stops accepting (nginx's connects are refused, and nginx sends
# those requests to another instance: nothing was sent yet), answers what
# comes on its open connections with "Connection: close" and exits once they
# are closed and its requests in flight are done.
cmd_rolling_restart() {
    local i pid n
    [[ "$ROLLING_PAUSE_S" =~ ^[0-9]+$ ]] || die "ROLLING_PAUSE_S must be a number of seconds"
    load_running_instances
    n=${#P_APP[@]}
    ((n >= 2)) || log "warning: one instance: nginx has nothing to send buyers to while it restarts"
    for ((i = 1; i <= n; i++)); do
        if pid=$(live_pid "app-$i"); then
            log "instance seckill-$i (pid $pid): draining"
            stop_pid "app-$i" "$pid" TERM "$APP_STOP_S"
        fi
        rm -f "$PIDS/app-$i.pid"
        require_free_port "${P_APP[$((i - 1))]}" "instance $i" APP_PORT_BASE
        start_instance "$i" "${P_APP[$((i - 1))]}"
        wait_instance "$i" "${P_APP[$((i - 1))]}"
        sleep "$ROLLING_PAUSE_S"
    done
    sed -i "s/^CONFIG=.*/CONFIG=$(config_signature)/" "$STATE_FILE"
    log "rolling restart done (${P_APP[*]})"
}

# ------------------------------------------------------------------ stop

stop_all() {
    local n pid pattern stopped=()
    for n in $(pid_names); do
        if pid=$(live_pid "$n"); then
            case "$n" in
                nginx) stop_pid nginx "$pid" QUIT 10 ;;
                app-*) stop_pid "$n" "$pid" TERM "$APP_STOP_S" ;;
                redis | redis-* | sentinel-*)
                    kill -CONT "$pid" 2>/dev/null || true   # a test may have paused it
                    stop_pid "$n" "$pid" TERM 10 ;;
                zk) stop_pid zk "$pid" TERM 10 ;;
                postgres) stop_pid postgres "$pid" INT 30 ;;   # fast shutdown
                pg-node-*) pgha_stop "$n" "$pid" "$RUN_DIR/pg-ha/node${n#pg-node-}" ;;
                pg-monitor) pgha_stop "$n" "$pid" "$RUN_DIR/pg-ha/monitor" ;;
            esac
            stopped+=("$n($pid)")
        else
            pid=$(sed -n 1p "$PIDS/$n.pid" 2>/dev/null || true)
            pattern=$(sed -n 2p "$PIDS/$n.pid" 2>/dev/null || true)
            if [[ "$pid" =~ ^[0-9]+$ ]] && pid_alive "$pid"; then
                log "stale pid file $n.pid: pid $pid now runs '$(cmdline_of "$pid")', not '$pattern': left alone"
            fi
            # A data node whose pg_autoctl was killed may have left its postgres running.
            case "$n" in
                pg-node-*) pgha_stop "$n" "" "$RUN_DIR/pg-ha/node${n#pg-node-}" ;;
                pg-monitor) pgha_stop "$n" "" "$RUN_DIR/pg-ha/monitor" ;;
            esac
        fi
        rm -f "$PIDS/$n.pid"
    done
    # REDIS_CLUSTER=1: its nodes, by the PIDs in their own directories.
    if [[ -d "$RUN_DIR/redis-cluster" ]] && compgen -G "$RUN_DIR/redis-cluster/node-*/redis.pid" >/dev/null; then
        "$ROOT/scripts/redis-cluster.sh" stop "$RUN_DIR/redis-cluster" && stopped+=("redis-cluster")
        rm -f "$RUN_DIR"/redis-cluster/node-*/redis.pid
    fi
    rm -f "$ENV_FILE" "$RUN_DIR/nginx/nginx.pid"
    if ((${#stopped[@]})); then
        log "stopped ${stopped[*]}"
    else
        log "nothing was running in $RUN_DIR"
    fi
}

cmd_stop() {
    [[ -d "$RUN_DIR" ]] || { log "nothing was running ($RUN_DIR does not exist)"; return 0; }
    stop_all
}

# ------------------------------------------------------------------ status

cmd_status() {
    scan
    if ((${#LIVE[@]} == 0 && ${#DEAD[@]} == 0)); then
        echo "stopped (no pid files in $PIDS)"
        return 3
    fi
    local n pid
    for n in $(pid_names); do
        if pid=$(live_pid "$n"); then
            printf '  %-10s running  pid %s\n' "$n" "$pid"
        else
            pid=$(sed -n 1p "$PIDS/$n.pid" 2>/dev/null || true)
            printf '  %-10s STALE    pid %s is gone or is another program\n' "$n" "$pid"
        fi
    done
    [[ -n "$(state_get EXTERNAL_PG_DSN)" ]] && printf '  %-10s external %s\n' postgres "$(state_get EXTERNAL_PG_DSN)"
    [[ -n "$(state_get EXTERNAL_REDIS_URL)" ]] && printf '  %-10s external %s\n' redis "$(state_get EXTERNAL_REDIS_URL)"
    if ((${#LIVE[@]} == 0)); then
        echo "stopped (stale pid files: $0 stop removes them)"
        return 3
    fi
    if ((${#DEAD[@]} > 0)); then
        echo "partly running: $0 restart (or make stop; make stack)"
        return 1
    fi
    if http_ok "$(state_get BASE_URL)/health"; then
        echo "running: BASE_URL=$(state_get BASE_URL); env file $ENV_FILE"
    else
        echo "running, but $(state_get BASE_URL)/health does not answer"
        return 1
    fi
}

# PING through a redis:// URL read as the instances read it (app/base/redis_url.c):
# the password ends at the last '@' and %XX is decoded; redis-cli -u ends
# it at the first '@' and decodes nothing.
url_unescape() {
    python3 -c 'import sys, urllib.parse; sys.stdout.write(urllib.parse.unquote(sys.argv[1]))' "$1"
}

redis_url_ping() {
    local rest=${1#redis://} user="" pw="" hostport db=0 host port=6379
    if [[ "$rest" == *@* ]]; then
        local info=${rest%@*}
        rest=${rest##*@}
        if [[ "$info" == *:* ]]; then user=${info%%:*}; pw=${info#*:}; else pw=$info; fi
        user=$(url_unescape "$user")
        pw=$(url_unescape "$pw")
    fi
    hostport=${rest%%/*}
    [[ "$rest" == */* && -n "${rest#*/}" ]] && db=${rest#*/}
    host=${hostport%%:*}
    [[ "$hostport" == *:* ]] && port=${hostport##*:}
    local args=(-h "$host" -p "$port" -n "$db")
    [[ -n "$user" ]] && args+=(--user "$user")
    REDISCLI_AUTH="$pw" redis-cli "${args[@]}" ping 2>/dev/null | grep -q PONG
}

mask_redis_url() {
    if [[ "$1" == *@* ]]; then printf 'redis://***@%s' "${1##*@}"; else printf '%s' "$1"; fi
}

# Stops or starts one service of a running stack on the same port.
cmd_service() {
    local what=$1 name=$2 pid port bin data
    [[ -f "$ENV_FILE" ]] || die "no stack runs in $RUN_DIR (no env file)"
    case "$name" in
        postgres)
            [[ -z "$(state_get EXTERNAL_PG_DSN)" ]] || die "Postgres is external: not ours to stop"
            bin=$(find_pg_bin)
            data="$RUN_DIR/pg/data"
            local -a ctl=("$bin/pg_ctl" -D "$data" -w -t "$STACK_TIMEOUT")
            [[ $(id -u) -ne 0 ]] || ctl=(runuser -u postgres -- "${ctl[@]}")
            if [[ "$what" == stop ]]; then
                "${ctl[@]}" -m fast stop >/dev/null || die "pg_ctl stop failed"
                rm -f "$PIDS/postgres.pid"
            else
                live_pid postgres >/dev/null && return 0
                setsid -w "${ctl[@]}" -l "$RUN_DIR/pg/postgres.log" start >/dev/null ||
                    die "pg_ctl start failed"
                pid=$(head -n 1 "$data/postmaster.pid")
                write_pidfile postgres "$pid" "*/postgres -D $data*"
            fi ;;
        redis)
            [[ -z "$(state_get EXTERNAL_REDIS_URL)" ]] || die "Redis is external: not ours to stop"
            port=$(. "$ENV_FILE" && printf '%s' "$REDIS_PORT")
            if [[ "$what" == stop ]]; then
                if pid=$(live_pid redis); then stop_pid redis "$pid" TERM 10; fi
                rm -f "$PIDS/redis.pid"
            else
                live_pid redis >/dev/null || start_redis "$port"
            fi ;;
        zk)
            [[ -d "$RUN_DIR/zk" ]] || die "this stack runs no ZooKeeper (LOCK_SERVICES=zk)"
            if [[ "$what" == stop ]]; then
                if pid=$(live_pid zk); then stop_pid zk "$pid" TERM 10; fi
                rm -f "$PIDS/zk.pid"
            else
                live_pid zk >/dev/null || start_zk ""
            fi ;;
        pg-node-[0-9] | pg-monitor)
            [[ "$(state_get PG_HA)" == 1 ]] || die "this stack runs no pg_auto_failover (PG_HA=1)"
            data="$RUN_DIR/pg-ha/monitor"
            [[ "$name" == pg-monitor ]] || data="$RUN_DIR/pg-ha/node${name#pg-node-}"
            [[ -d "$data" ]] || die "no such node: $name"
            if [[ "$what" == stop ]]; then
                pgha_stop "$name" "$(live_pid "$name" || true)" "$data"
                rm -f "$PIDS/$name.pid"
            elif ! live_pid "$name" >/dev/null; then
                # Its postgres may outlive a killed pg_autoctl: pg_autoctl
                # takes a running one over.
                pgha_run "$RUN_DIR/pg-ha" "$name" "$data"
            fi ;;
        *) die "service-$what: unknown service '$name' (postgres, redis, zk, pg-node-N, pg-monitor)" ;;
    esac
    if [[ "$what" == stop ]]; then log "$name stopped"; else log "$name started"; fi
}

cmd_env() {
    [[ -f "$ENV_FILE" ]] || { log "no env file: the stack is not running in $RUN_DIR"; return 1; }
    cat "$ENV_FILE"
}

cmd_instance_env() {
    ADMIN_TOKEN=${ADMIN_TOKEN:-<generated>}
    STACK_PG_DSN=${EXTERNAL_PG_DSN:-host=127.0.0.1 port=<PG_PORT> dbname=$DB_NAME user=postgres}
    STACK_REDIS_URL=${EXTERNAL_REDIS_URL:-redis://127.0.0.1:<REDIS_PORT>/0}
    instance_env 1 "<port>"
}

# The launcher's fixed facts, for tests/test_compose.py: default ports, the
# schema files, the database name, the environment names of an instance.
cmd_describe() {
    printf 'NGINX_PORT=%s\n' "$NGINX_PORT"
    printf 'APP_PORT_BASE=%s\n' "$APP_PORT_BASE"
    printf 'DB_NAME=%s\n' "$DB_NAME"
    printf 'SCHEMA_FILES=%s\n' "${SCHEMA_FILES[*]}"
    printf 'INSTANCE_ENV_NAMES=%s\n' "$(cmd_instance_env | cut -d= -f1 | tr '\n' ' ' | sed 's/ $//')"
    printf 'INSTANCE_ID_PATTERN=%s\n' 'seckill-<i>'
}

main() {
    local cmd=${1:-}
    case "$cmd" in
        start) cmd_start ;;
        stop) cmd_stop ;;
        restart) cmd_stop; cmd_start ;;
        restart-instances) cmd_restart_instances ;;
        rolling-restart) cmd_rolling_restart ;;
        status) cmd_status ;;
        env) cmd_env ;;
        instance-env) cmd_instance_env ;;
        describe) cmd_describe ;;
        service-stop | service-start) [[ -n "${2:-}" ]] || die "usage: $0 $cmd NAME"; cmd_service "${cmd#service-}" "$2" ;;
        -h | --help | help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' ;;
        *) die "usage: $0 start|stop|restart|restart-instances|rolling-restart|status|env|instance-env|describe (see --help)" ;;
    esac
}

main "$@"
