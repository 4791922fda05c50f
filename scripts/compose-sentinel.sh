#!/bin/sh
# scripts/compose-sentinel.sh NAME HOST PORT QUORUM DOWN_AFTER_MS FAILOVER_TIMEOUT_MS
#
# One Sentinel of docker-compose.ha.yml (mounted into a redis:7 container):
# writes the Sentinel's config file, which is its own and which Sentinel
# rewrites as it learns the replicas, the other Sentinels and failovers, then
# runs Sentinel on port 26379 watching master NAME at HOST:PORT. Host names are
# resolved and announced as names, so the instances reach a master through
# Docker's DNS. SENTINEL_PORT and SENTINEL_CONF (tests) change its port
# (26379) and file (/tmp/sentinel.conf).
set -eu
[ "$#" -eq 6 ] || { echo "usage: $0 NAME HOST PORT QUORUM DOWN_AFTER_MS FAILOVER_TIMEOUT_MS" >&2; exit 2; }
conf=${SENTINEL_CONF:-/tmp/sentinel.conf}
cat >"$conf" <<CONF
port ${SENTINEL_PORT:-26379}
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
sentinel monitor $1 $2 $3 $4
sentinel down-after-milliseconds $1 $5
sentinel failover-timeout $1 $6
sentinel parallel-syncs $1 1
CONF
exec redis-server "$conf" --sentinel
