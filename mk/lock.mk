# mk/lock.mk: the lock benchmarks.
#
#   make bench-lock        every lock backend (Redis, MultiLock over 3 and RedLock
#                          over 5 independent Redis nodes, ZooKeeper, the Postgres
#                          lock table, Postgres advisory locks) measured the same way
#                          in one run, next to each service's own ceiling
#                          (redis-benchmark, ZooKeeper create/delete with the C
#                          client, pgbench with the lock statements):
#                          loadtest/bench_locks.py + loadtest/bench_locks.c on a
#                          private stack (build/bench-lock-run). Table, JSON and
#                          chart in $(BUILD)/bench-lock/; the chart is copied to
#                          docs/img/locks.png. BENCH_LOCK_THREADS, _SECONDS,
#                          _HANDOFFS, _LEASE_MS, _BACKENDS: see the script.
#   make bench-lock-redis  the Redis lock alone (loadtest/bench_lock.c) against a
#                          throwaway or given Redis (REDIS_URL=redis://…):
#                          pairs, hand-off, redis-benchmark; $(BUILD)/bench-lock-redis.json
#   BENCH_LOCK_ARGS="--threads 8 --seconds 5 --handoffs 500 --requests 200000"
#   make bench-lock-ha     the Redis lock alone (as bench-lock-redis) on throwaway
#                                        servers: one Redis; a master with two
#                                        replicas (a Sentinel setup: every write
#                                        also goes to them); and the same with
#                                        WAIT 1 after each grant (LOCK_SYNC_REPLICAS=1)
#
# Prints a table and writes $(BUILD)/bench-lock.json (bench-lock-ha:
# $(BUILD)/bench-lock-{single,replicas,wait1}.json and a table of the three).

##@ Lock benchmarks

BENCH_LOCK_ARGS ?=

.PHONY: bench-lock bench-lock-redis bench-lock-ha

bench-lock: all $(BUILD)/tests/bench_locks ## every lock backend and its service's ceiling, one run: table and chart (~3 min)
	@BUILD=$(abspath $(BUILD)) SECKILL_BIN=$(abspath $(BUILD))/seckill python3 loadtest/bench_locks.py

bench-lock-redis: $(BUILD)/tests/bench_lock ## the Redis lock alone (loadtest/bench_lock.c) against a throwaway or given Redis
	LUA_DIR=$(CURDIR)/lua $(BUILD)/tests/bench_lock --json $(BUILD)/bench-lock-redis.json $(BENCH_LOCK_ARGS)

bench-lock-ha: $(BUILD)/tests/bench_lock ## the lock benchmark on one Redis, on a master with 2 replicas, and with WAIT 1 after each grant
	@set -e; for m in "single:" "replicas:--replicas 2" "wait1:--replicas 2 --sync 1"; do \
	    name=$${m%%:*}; echo "== $$name: $${m#*:}"; \
	    env -u REDIS_URL LUA_DIR=$(CURDIR)/lua $(BUILD)/tests/bench_lock $${m#*:} \
	        --json $(BUILD)/bench-lock-$$name.json $(BENCH_LOCK_ARGS) | grep -v '^$$'; done
	@python3 -c 'import json,sys; \
	rows=[(n, json.load(open("$(BUILD)/bench-lock-%s.json" % k))) for n, k in \
	      (("one Redis", "single"), ("master + 2 replicas", "replicas"), \
	       ("master + 2 replicas, WAIT 1", "wait1"))]; \
	base=rows[0][1]["pairsPerSecond"]; \
	print("\n%-30s %12s %8s %12s %12s" % ("setup", "pairs/s", "ratio", "handoff p50", "handoff p99")); \
	[print("%-30s %12.0f %8.2f %9.3f ms %9.3f ms" % (n, j["pairsPerSecond"], j["pairsPerSecond"] / base, \
	       j["handoffP50Ms"], j["handoffP99Ms"])) for n, j in rows]'

-include $(BUILD)/tests/bench_lock.d $(BUILD)/tests/bench_locks.d
