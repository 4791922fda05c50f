#!/usr/bin/env bash
# scripts/zk.sh start DIR [PORT] | stop DIR | restart DIR | pid DIR -- a throwaway
# standalone ZooKeeper (Debian's zookeeper package: its jar and Java) on
# 127.0.0.1, everything under DIR (data, log, zoo.cfg, pid file).
#
#   start    start it on PORT (default: a free port; restart reuses DIR's port
#            and data, so sessions and nodes survive a restart within the
#            session timeout), wait until it serves, print ZK_HOSTS=127.0.0.1:PORT
#   stop     stop it (SIGTERM, then SIGKILL after 10 s), by the PID in DIR/zk.pid
#   restart  stop, then start on the same port with the same data
#   pid      print its PID (exit 1 when it is not running)
#
# Environment: ZK_TICK_MS (default 250: sessions of 500 ms .. 60 s are
# allowed), ZK_HEAP (default 128m), ZK_TIMEOUT (seconds to wait, default 30),
# ZK_CLASSPATH (default the Debian package's: /etc/zookeeper/conf and
# /usr/share/java/zookeeper.jar).
set -euo pipefail

cmd=${1:-}
dir=${2:-}
[[ -n "$cmd" && -n "$dir" ]] || { echo "usage: $0 start|stop|restart|pid DIR [PORT]" >&2; exit 2; }
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
TICK=${ZK_TICK_MS:-250}
HEAP=${ZK_HEAP:-128m}
TIMEOUT=${ZK_TIMEOUT:-30}
CP=${ZK_CLASSPATH:-/etc/zookeeper/conf:/usr/share/java/zookeeper.jar}

die() { echo "zk.sh: error: $*" >&2; exit 1; }

live_pid() {
    local pid
    [[ -f "$dir/zk.pid" ]] || return 1
    pid=$(cat "$dir/zk.pid")
    [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "ZooKeeperServerMain $dir/zoo.cfg" || return 1
    echo "$pid"
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# A ZooKeeper answers "ruok"-free: a session handshake is the probe (the
# four-letter words are off by default). 0 when a session opens.
serves() {
    python3 - "$1" <<'PY'
import socket, struct, sys
try:
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), 0.5)
    s.settimeout(1.0)
    # ConnectRequest: protocolVersion, lastZxidSeen, timeOut, sessionId, passwd
    body = struct.pack(">iqiqi16s", 0, 0, 2000, 0, 16, b"\0" * 16) + b"\0"
    s.sendall(struct.pack(">i", len(body)) + body)
    head = s.recv(4)
    ok = len(head) == 4 and struct.unpack(">i", head)[0] > 0
    s.close()
    sys.exit(0 if ok else 1)
except OSError:
    sys.exit(1)
PY
}

start() {
    local port=${1:-} pid i
    if pid=$(live_pid); then
        port=$(sed -n 's/^clientPort=//p' "$dir/zoo.cfg")
        echo "ZK_HOSTS=127.0.0.1:$port"
        return 0
    fi
    command -v java >/dev/null 2>&1 || die "java not found (apt-get install zookeeperd)"
    [[ -f /usr/share/java/zookeeper.jar || -n "${ZK_CLASSPATH:-}" ]] ||
        die "/usr/share/java/zookeeper.jar not found (apt-get install zookeeperd)"
    if [[ -z "$port" && -f "$dir/zoo.cfg" ]]; then port=$(sed -n 's/^clientPort=//p' "$dir/zoo.cfg"); fi
    [[ -n "$port" ]] || port=$(free_port)
    mkdir -p "$dir/data"
    cat >"$dir/zoo.cfg" <<CFG
tickTime=$TICK
dataDir=$dir/data
clientPort=$port
clientPortAddress=127.0.0.1
admin.enableServer=false
minSessionTimeout=$((TICK * 2))
maxSessionTimeout=60000
CFG
    (
        cd "$dir"
        exec setsid java -Xmx"$HEAP" -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
            -Dzookeeper.log.dir="$dir" -cp "$CP" \
            org.apache.zookeeper.server.ZooKeeperServerMain "$dir/zoo.cfg" \
            </dev/null >>"$dir/zk.log" 2>&1
    ) &
    pid=$!
    echo "$pid" >"$dir/zk.pid"
    for ((i = 0; i < TIMEOUT * 10; i++)); do
        serves "$port" && { echo "ZK_HOSTS=127.0.0.1:$port"; return 0; }
        kill -0 "$pid" 2>/dev/null || { tail -n 20 "$dir/zk.log" >&2; die "ZooKeeper exited during start"; }
        sleep 0.1
    done
    tail -n 20 "$dir/zk.log" >&2
    die "ZooKeeper did not serve on 127.0.0.1:$port within ${TIMEOUT}s"
}

stop() {
    local pid i
    pid=$(live_pid) || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        kill -0 "$pid" 2>/dev/null || { rm -f "$dir/zk.pid"; return 0; }
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$dir/zk.pid"
}

case "$cmd" in
    start) start "${3:-}" ;;
    stop) stop ;;
    restart) stop; start ;;
    pid) live_pid ;;
    *) die "unknown command '$cmd'" ;;
esac
