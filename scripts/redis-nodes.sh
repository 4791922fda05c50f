#!/usr/bin/env bash
# scripts/redis-nodes.sh -- N independent redis-server processes on 127.0.0.1
# (no replication between them, no persistence): the nodes of SECKILL_LOCK=
# multilock and redlock. Everything lives under DIR (node-I/ per node: its
# pid file, log and port).
#
#   start DIR N     start nodes 1..N on free ports, wait until each answers
#                   PING, print LOCK_REDIS_NODES=redis://127.0.0.1:P1,...
#   nodes DIR       print LOCK_REDIS_NODES of DIR's nodes
#   stop DIR [I]    stop every node (or node I): SIGTERM, SIGKILL after 5 s
#   kill DIR I      SIGKILL node I (a crash: no persistence, its keys are gone)
#   start-node DIR I  start node I again on its port, empty
#   pause DIR I | resume DIR I   SIGSTOP / SIGCONT node I (it stops answering;
#                   the kernel still accepts connections)
#   pid DIR I       print node I's PID (exit 1 when it is not running)
#
# Environment: REDIS_NODES_TIMEOUT (seconds to wait for a node, default 10).
set -euo pipefail

cmd=${1:-}
dir=${2:-}
[[ -n "$cmd" && -n "$dir" ]] || {
    echo "usage: $0 start DIR N | nodes DIR | stop DIR [I] | kill|start-node|pause|resume|pid DIR I" >&2
    exit 2
}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
TIMEOUT=${REDIS_NODES_TIMEOUT:-10}

die() { echo "redis-nodes.sh: error: $*" >&2; exit 1; }

# True while PID $1 runs. A zombie (exited, not reaped yet: the nodes' parent
# is init, which may reap seconds later) has ended.
running() {
    local state
    state=$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$1/status" 2>/dev/null || true)
    [[ -n "$state" && "$state" != Z && "$state" != X ]]
}

free_ports() {
    python3 -c '
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print("\n".join(str(s.getsockname()[1]) for s in socks))' "$1"
}

# PID of node $1 when it runs (the PID file's process is a redis-server on its port).
live_pid() {
    local nd="$dir/node-$1" pid port
    [[ -f "$nd/redis.pid" && -f "$nd/port" ]] || return 1
    pid=$(cat "$nd/redis.pid")
    port=$(cat "$nd/port")
    [[ "$pid" =~ ^[0-9]+$ ]] && running "$pid" || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "redis-server.*:$port" || return 1
    echo "$pid"
}

start_node() {
    local i=$1 nd="$dir/node-$1" port pid t
    [[ -f "$nd/port" ]] || die "node $i has no port (start DIR N first)"
    port=$(cat "$nd/port")
    if live_pid "$i" >/dev/null; then return 0; fi
    rm -f "$nd/dump.rdb"
    redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
        --daemonize no --dir "$nd" --logfile "$nd/redis.log" --protected-mode yes \
        </dev/null >/dev/null 2>&1 &
    pid=$!
    echo "$pid" >"$nd/redis.pid"
    for ((t = 0; t < TIMEOUT * 20; t++)); do
        [[ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" == PONG ]] && return 0
        running "$pid" || break
        sleep 0.05
    done
    die "node $i did not answer on 127.0.0.1:$port (log: $nd/redis.log)"
}

stop_node() {
    local pid t
    pid=$(live_pid "$1") || { rm -f "$dir/node-$1/redis.pid"; return 0; }
    kill -CONT "$pid" 2>/dev/null || true
    kill -TERM "$pid" 2>/dev/null || true
    for ((t = 0; t < 100; t++)); do
        running "$pid" || break
        sleep 0.05
    done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$dir/node-$1/redis.pid"
}

print_nodes() {
    local out="" nd
    for nd in "$dir"/node-*; do
        [[ -f "$nd/port" ]] || continue
        out+="${out:+,}redis://127.0.0.1:$(cat "$nd/port")"
    done
    [[ -n "$out" ]] || die "no nodes under $dir"
    echo "LOCK_REDIS_NODES=$out"
}

nodes_of() { find "$dir" -maxdepth 1 -name 'node-*' -printf '%f\n' | sed 's/node-//' | sort -n; }

need_i() { [[ "${1:-}" =~ ^[0-9]+$ && -d "$dir/node-$1" ]] || die "no node '${1:-}' under $dir"; }

case "$cmd" in
    start)
        n=${3:-}
        [[ "$n" =~ ^[0-9]+$ && "$n" -ge 1 ]] || die "start DIR N: N must be a count"
        command -v redis-server >/dev/null || die "redis-server not found"
        mapfile -t ports < <(free_ports "$n")
        for ((i = 1; i <= n; i++)); do
            mkdir -p "$dir/node-$i"
            if ! live_pid "$i" >/dev/null; then echo "${ports[$((i - 1))]}" >"$dir/node-$i/port"; fi
            start_node "$i"
        done
        print_nodes
        ;;
    nodes) print_nodes ;;
    stop)
        if [[ -n "${3:-}" ]]; then need_i "$3"; stop_node "$3"; else
            for i in $(nodes_of); do stop_node "$i"; done
        fi
        ;;
    kill)
        need_i "${3:-}"
        if pid=$(live_pid "$3"); then kill -KILL "$pid"; while running "$pid"; do sleep 0.02; done; fi
        rm -f "$dir/node-$3/redis.pid"
        ;;
    start-node) need_i "${3:-}"; start_node "$3" ;;
    pause) need_i "${3:-}"; pid=$(live_pid "$3") || die "node $3 is not running"; kill -STOP "$pid" ;;
    resume) need_i "${3:-}"; pid=$(live_pid "$3") || die "node $3 is not running"; kill -CONT "$pid" ;;
    pid) need_i "${3:-}"; live_pid "$3" ;;
    *) die "unknown command '$cmd'" ;;
esac
