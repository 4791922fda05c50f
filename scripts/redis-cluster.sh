#!/usr/bin/env bash
# scripts/redis-cluster.sh -- a throwaway Redis Cluster on 127.0.0.1 (redis-server
# 7.0, cluster-enabled): 3 masters and 3 replicas by default, for the tests.
# Everything lives under DIR: node-I/ per node (I = 1..N) with its redis.conf,
# nodes.conf, pid file, log, port (and bus-port: the cluster bus is given a
# free port of its own, not PORT+10000, which may be past 65535).
#
#   start DIR       start the nodes on free ports, redis-cli --cluster create
#                   them (nodes 1..MASTERS become the masters), wait until
#                   every node says cluster_state:ok with all 16384 slots,
#                   every replica's link to its master is up and every
#                   node's CLUSTER SLOTS lists the replicas, print
#                   REDIS_CLUSTER_NODES=127.0.0.1:P1,127.0.0.1:P2,...
#                   (nothing else on stdout; redis-cli's output is in
#                   DIR/create.log). A start that fails leaves nothing
#                   running; start on a running whole cluster prints its line.
#   nodes DIR       print REDIS_CLUSTER_NODES of DIR's cluster
#   stop DIR [I]    stop every node (or node I): SIGTERM, SIGKILL after 5 s
#   kill DIR I      SIGKILL node I (a crash: no persistence unless AOF is on)
#   start-node DIR I  start node I again on its port with its redis.conf and
#                   nodes.conf (it rejoins: a master failed over while it was
#                   down comes back as a replica), its data only what its AOF
#                   holds (none without AOF), wait until it answers PING
#   pause DIR I | resume DIR I   SIGSTOP / SIGCONT node I
#   pid DIR I       print node I's PID (exit 1 when it is not running)
#   port DIR I      print node I's port
#   role DIR I      print node I's role: master or slave
#   master-of DIR SLOT  print the number I of the node that is master of hash
#                   slot SLOT now (CLUSTER SLOTS, asked of a live node)
#
# Environment: REDIS_CLUSTER_MASTERS (default 3, at least 3),
# REDIS_CLUSTER_REPLICAS (replicas per master, default 1),
# REDIS_CLUSTER_NODE_TIMEOUT_MS (cluster-node-timeout, default 3000),
# REDIS_CLUSTER_APPENDFSYNC (empty: no AOF; always|everysec|no: appendonly yes
# with that appendfsync), REDIS_CLUSTER_TIMEOUT (seconds to wait for the
# cluster or a node, default 30).
set -euo pipefail

cmd=${1:-}
dir=${2:-}
[[ -n "$cmd" && -n "$dir" ]] || {
    echo "usage: $0 start DIR | nodes DIR | stop DIR [I] | kill|start-node|pause|resume|pid|port|role DIR I | master-of DIR SLOT" >&2
    exit 2
}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
MASTERS=${REDIS_CLUSTER_MASTERS:-3}
REPLICAS=${REDIS_CLUSTER_REPLICAS:-1}
NODE_TIMEOUT=${REDIS_CLUSTER_NODE_TIMEOUT_MS:-3000}
APPENDFSYNC=${REDIS_CLUSTER_APPENDFSYNC:-}
TIMEOUT=${REDIS_CLUSTER_TIMEOUT:-30}
CLI_TIMEOUT=5     # seconds for one redis-cli call (a paused node never answers)

die() { echo "redis-cluster.sh: error: $*" >&2; exit 1; }

[[ "$TIMEOUT" =~ ^[0-9]+$ && "$TIMEOUT" -ge 1 ]] || die "REDIS_CLUSTER_TIMEOUT must be a number of seconds"

# The stack's shell functions: pid_alive (true while a PID runs; a zombie,
# which the daemonized nodes' parent init may reap late or never, has
# ended) and free_ports.
# shellcheck source=scripts/lib/stack-fns.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/stack-fns.sh"

# Microseconds now (bash 5's EPOCHREALTIME, no fork).
now_us() { local t=${EPOCHREALTIME/[.,]/}; echo "$t"; }

# Waits up to $1 seconds until none of PIDs $2... runs; 0 when none does.
wait_gone() {
    local end=$(($(now_us) + $1 * 1000000)) pid left
    shift
    while :; do
        left=0
        for pid in "$@"; do pid_alive "$pid" && left=1; done
        ((left)) || return 0
        (($(now_us) < end)) || return 1
        sleep 0.05
    done
}

# True when PID $1 is stopped (SIGSTOP: it cannot answer).
stopped() { grep -q '^State:[[:space:]]*T' "/proc/$1/status" 2>/dev/null; }

# redis-cli against node port $1, bounded in time.
cli() {
    local port=$1
    shift
    timeout "$CLI_TIMEOUT" redis-cli -h 127.0.0.1 -p "$port" "$@" </dev/null 2>/dev/null
}

port_of() { cat "$dir/node-$1/port"; }

# PID of node $1 when it runs (the PID file's process is a redis-server on its port).
live_pid() {
    local nd="$dir/node-$1" pid port
    [[ -f "$nd/redis.pid" && -f "$nd/port" ]] || return 1
    pid=$(cat "$nd/redis.pid" 2>/dev/null || true)
    port=$(cat "$nd/port")
    [[ "$pid" =~ ^[0-9]+$ ]] && pid_alive "$pid" || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "redis-server.*:$port" || return 1
    echo "$pid"
}

nodes_of() { find "$dir" -maxdepth 1 -name 'node-*' -printf '%f\n' | sed 's/node-//' | sort -n; }

need_i() { [[ "${1:-}" =~ ^[0-9]+$ && -f "$dir/node-$1/port" ]] || die "no node '${1:-}' under $dir"; }

# node $1's redis.conf on port $2, cluster bus port $3.
write_conf() {
    local nd="$dir/node-$1" aof
    aof="appendonly no"
    [[ -z "$APPENDFSYNC" ]] || aof=$'appendonly yes\nappendfsync '"$APPENDFSYNC"
    cat >"$nd/redis.conf" <<CONF
port $2
bind 127.0.0.1
protected-mode yes
cluster-enabled yes
cluster-config-file nodes.conf
cluster-node-timeout $NODE_TIMEOUT
cluster-port $3
dir "$nd"
pidfile "$nd/redis.pid"
logfile "$nd/redis.log"
daemonize yes
save ""
$aof
CONF
}

start_node() {
    local i=$1 nd="$dir/node-$1" port deadline grace
    [[ -f "$nd/redis.conf" ]] || die "node $i has no redis.conf (start DIR first)"
    port=$(port_of "$i")
    if live_pid "$i" >/dev/null; then return 0; fi
    # no persistence but the AOF's: a replica's last full sync (dump.rdb) is
    # not loaded back, so a node restarted without AOF comes back empty
    rm -f "$nd/redis.pid" "$nd/dump.rdb"
    # daemonize yes: the parent returns once the daemon is forked
    timeout "$TIMEOUT" redis-server "$nd/redis.conf" </dev/null >>"$nd/start.log" 2>&1 ||
        { tail -n 20 "$nd/redis.log" >&2 2>/dev/null || true
          die "node $i did not start (log: $nd/redis.log)"; }
    deadline=$((SECONDS + TIMEOUT))
    grace=$((SECONDS + 3))
    while ((SECONDS < deadline)); do
        if live_pid "$i" >/dev/null; then
            [[ "$(cli "$port" ping)" == PONG ]] && return 0
        elif ((SECONDS >= grace)) && [[ -f "$nd/redis.pid" ]]; then
            break    # its pid file names no live node: it exited
        fi
        sleep 0.05
    done
    tail -n 20 "$nd/redis.log" >&2 2>/dev/null || true
    die "node $i did not answer on 127.0.0.1:$port within ${TIMEOUT}s (log: $nd/redis.log)"
}

# SIGTERM nodes $@ (together), SIGKILL those still running after 5 s; each
# stopped node's pid file is removed.
stop_nodes() {
    local i pid
    local -A pids=()
    for i in "$@"; do
        if pid=$(live_pid "$i"); then
            pids[$i]=$pid
            kill -CONT "$pid" 2>/dev/null || true
            kill -TERM "$pid" 2>/dev/null || true
        else
            rm -f "$dir/node-$i/redis.pid"
        fi
    done
    ((${#pids[@]} == 0)) || wait_gone 5 "${pids[@]}" || true
    for i in "${!pids[@]}"; do
        if pid_alive "${pids[$i]}"; then
            kill -KILL "${pids[$i]}" 2>/dev/null || true
            wait_gone 5 "${pids[$i]}" || echo "redis-cluster.sh: node $i (pid ${pids[$i]}) outlived SIGKILL" >&2
        fi
        rm -f "$dir/node-$i/redis.pid"
    done
}

print_nodes() {
    local out="" i
    for i in $(nodes_of); do
        [[ -f "$dir/node-$i/port" ]] || continue
        out+="${out:+,}127.0.0.1:$(port_of "$i")"
    done
    [[ -n "$out" ]] || die "no cluster under $dir"
    echo "REDIS_CLUSTER_NODES=$out"
}

stop_all() {
    local all
    mapfile -t all < <(nodes_of)
    ((${#all[@]} == 0)) || stop_nodes "${all[@]}"
}

# 0 when every node says cluster_state:ok with 16384 slots ok, there are
# MASTERS masters and MASTERS*REPLICAS replicas, each replica's link is up,
# and every node's CLUSTER SLOTS names MASTERS ranges that cover the 16384
# slots, each with REPLICAS replicas. (A replica is left out of CLUSTER SLOTS
# while its replication offset is 0 as the cluster knows it: until its
# master's first replication PING, up to repl-ping-replica-period, 10 s, after
# the sync, and the gossip that follows.)
cluster_ready() {
    local i port info masters=0 slaves=0 slots=""
    for i in $(nodes_of); do
        port=$(port_of "$i")
        info=$(cli "$port" cluster info) || return 1
        grep -q '^cluster_state:ok' <<<"$info" || return 1
        grep -q '^cluster_slots_ok:16384' <<<"$info" || return 1
        info=$(cli "$port" info replication) || return 1
        if grep -q '^role:master' <<<"$info"; then
            masters=$((masters + 1))
        elif grep -q '^role:slave' <<<"$info"; then
            grep -q '^master_link_status:up' <<<"$info" || return 1
            slaves=$((slaves + 1))
        else
            return 1
        fi
    done
    ((masters == MASTERS && slaves == MASTERS * REPLICAS)) || return 1
    for i in $(nodes_of); do
        info=$(cli "$(port_of "$i")" -2 --json cluster slots) || return 1
        slots+="$(tr -d '\n' <<<"$info")"$'\n'
    done
    python3 -c '
import json, sys
masters, replicas = int(sys.argv[1]), int(sys.argv[2])
for line in filter(None, sys.stdin.read().splitlines()):
    ranges = json.loads(line)
    covered = sum(int(r[1]) - int(r[0]) + 1 for r in ranges)
    if len({r[2][2] for r in ranges}) != masters or covered != 16384 or \
            any(len(r) - 3 != replicas for r in ranges):
        sys.exit(1)' "$MASTERS" "$REPLICAS" <<<"$slots" 2>/dev/null
}

start_cluster() {
    local n i live=0 addrs=() ports=() deadline
    [[ "$MASTERS" =~ ^[0-9]+$ && "$MASTERS" -ge 3 ]] || die "REDIS_CLUSTER_MASTERS must be 3 or more"
    [[ "$REPLICAS" =~ ^[0-9]+$ ]] || die "REDIS_CLUSTER_REPLICAS must be a count"
    [[ "$NODE_TIMEOUT" =~ ^[0-9]+$ && "$NODE_TIMEOUT" -ge 1 ]] ||
        die "REDIS_CLUSTER_NODE_TIMEOUT_MS must be a number of ms"
    [[ "$APPENDFSYNC" =~ ^(|always|everysec|no)$ ]] ||
        die "REDIS_CLUSTER_APPENDFSYNC must be empty, always, everysec or no (not '$APPENDFSYNC')"
    command -v redis-server >/dev/null || die "redis-server not found"
    command -v redis-cli >/dev/null || die "redis-cli not found"
    n=$((MASTERS * (1 + REPLICAS)))
    for i in $(nodes_of); do live_pid "$i" >/dev/null && live=$((live + 1)); done
    if ((live > 0)); then
        # started before: the same cluster again when it is whole and ready
        if ((live != n)) || [[ "$(nodes_of | wc -l)" -ne "$n" ]] || ! cluster_ready; then
            die "$dir holds a cluster that is running but not whole or not ready: stop it first"
        fi
        print_nodes
        return 0
    fi
    # a new cluster: nothing of an old one (nodes.conf above all) is kept.
    # A start that fails, is interrupted, or cannot print its line (its
    # reader gone) leaves no node running.
    trap 'rc=$?; ((rc == 0)) || stop_all' EXIT
    trap 'exit 129' HUP
    trap 'exit 130' INT
    trap 'exit 141' PIPE
    trap 'exit 143' TERM
    for i in $(nodes_of); do rm -rf "${dir:?}/node-$i"; done
    rm -f "$dir/create.log"
    mapfile -t ports < <(free_ports $((2 * n)))
    for ((i = 1; i <= n; i++)); do
        mkdir -p "$dir/node-$i"
        echo "${ports[$((i - 1))]}" >"$dir/node-$i/port"
        echo "${ports[$((n + i - 1))]}" >"$dir/node-$i/bus-port"
        write_conf "$i" "${ports[$((i - 1))]}" "${ports[$((n + i - 1))]}"
        start_node "$i"
        addrs+=("127.0.0.1:${ports[$((i - 1))]}")
    done
    # redis-cli makes the first MASTERS nodes masters (all on one host); it
    # waits (1 s a round) until every node agrees on the configuration
    if ! timeout "$TIMEOUT" redis-cli --cluster create "${addrs[@]}" \
        --cluster-replicas "$REPLICAS" --cluster-yes </dev/null >"$dir/create.log" 2>&1; then
        tail -n 20 "$dir/create.log" >&2
        die "redis-cli --cluster create failed or took over ${TIMEOUT}s (log: $dir/create.log)"
    fi
    deadline=$((SECONDS + TIMEOUT))
    until cluster_ready; do
        ((SECONDS < deadline)) || {
            for i in $(nodes_of); do
                echo "node $i: $(cli "$(port_of "$i")" cluster info |
                    grep -E '^cluster_(state|slots_ok)' | tr -d '\r' | tr '\n' ' ')" >&2
            done
            die "the cluster under $dir was not ready within ${TIMEOUT}s"
        }
        sleep 0.1
    done
    print_nodes
    trap - EXIT HUP INT PIPE TERM
}

role_of() {
    local port r
    port=$(port_of "$1")
    r=$(cli "$port" role | head -n 1) || true
    case "$r" in
        master | slave) echo "$r" ;;
        *) die "node $1 (127.0.0.1:$port) did not answer ROLE" ;;
    esac
}

# The node number whose port is the master of slot $1 in CLUSTER SLOTS, asked
# of the first live node that answers (a paused one is skipped).
master_of() {
    local slot=$1 i j pid port json mport
    [[ "$slot" =~ ^[0-9]+$ && "$slot" -le 16383 ]] || die "master-of DIR SLOT: SLOT must be 0..16383"
    for i in $(nodes_of); do
        pid=$(live_pid "$i") || continue
        stopped "$pid" && continue
        port=$(port_of "$i")
        json=$(cli "$port" -2 --json cluster slots) || continue
        mport=$(python3 -c '
import json, sys
slot = int(sys.argv[1])
for r in json.loads(sys.stdin.read()):
    if int(r[0]) <= slot <= int(r[1]):
        print(int(r[2][1]))
        break' "$slot" <<<"$json" 2>/dev/null) || continue
        [[ -n "$mport" ]] || continue
        for j in $(nodes_of); do
            [[ "$(port_of "$j")" == "$mport" ]] && { echo "$j"; return 0; }
        done
        die "slot $slot's master 127.0.0.1:$mport is not a node under $dir"
    done
    die "no live node under $dir names a master of slot $slot"
}

case "$cmd" in
    start) start_cluster ;;
    nodes) print_nodes ;;
    stop)
        if [[ -n "${3:-}" ]]; then need_i "$3"; stop_nodes "$3"; else stop_all; fi
        ;;
    kill)
        need_i "${3:-}"
        if pid=$(live_pid "$3"); then
            kill -KILL "$pid"
            wait_gone "$TIMEOUT" "$pid" || die "node $3 (pid $pid) outlived SIGKILL"
        fi
        rm -f "$dir/node-$3/redis.pid"
        ;;
    start-node) need_i "${3:-}"; start_node "$3" ;;
    pause) need_i "${3:-}"; pid=$(live_pid "$3") || die "node $3 is not running"; kill -STOP "$pid" ;;
    resume) need_i "${3:-}"; pid=$(live_pid "$3") || die "node $3 is not running"; kill -CONT "$pid" ;;
    pid) need_i "${3:-}"; live_pid "$3" ;;
    port) need_i "${3:-}"; port_of "$3" ;;
    role) need_i "${3:-}"; role_of "$3" ;;
    master-of) master_of "${3:-}" ;;
    *) die "unknown command '$cmd'" ;;
esac
