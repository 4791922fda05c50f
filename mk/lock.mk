# mk/lock.mk: the lock benchmarks.
#
#   make bench-lock        every lock backend (Redis, MultiLock over 3 and RedLock
#                          over 5 independent Redis nodes, ZooKeeper, the Postgres
#                          lock table, Postgres advisory locks) measured the same way
#                          in one run, next to each service's own ceiling
#                          (redis-benchmark, ZooKeeper create/delete with the C
#                          client, pgbench with the lock statements):
#                          loadtest/bench_locks.py + tests/bench_locks.c on a
#                          private stack (build/bench-lock-run). Table, JSON and
#                          chart in $(BUILD)/bench-lock/; the chart is copied to
#                          docs/img/locks.png. BENCH_LOCK_THREADS, _SECONDS,
#                          _HANDOFFS, _LEASE_MS, _BACKENDS: see the script.
#   make bench-lock-redis  the Redis lock alone (tests/bench_lock.c) against a
#                          throwaway or given Redis (REDIS_URL=redis://…):
#                          pairs, hand-off, redis-benchmark; $(BUILD)/bench-lock-redis.json
#   BENCH_LOCK_ARGS="--threads 8 --seconds 5 --handoffs 500 --requests 200000"

##@ Lock benchmarks

BENCH_LOCK_ARGS ?=

.PHONY: bench-lock bench-lock-redis

bench-lock: all $(BUILD)/tests/bench_locks ## every lock backend and its service's ceiling, one run: table and chart (~3 min)
	@BUILD=$(abspath $(BUILD)) SECKILL_BIN=$(abspath $(BUILD))/seckill python3 loadtest/bench_locks.py

bench-lock-redis: $(BUILD)/tests/bench_lock ## the Redis lock alone (tests/bench_lock.c) against a throwaway or given Redis
	LUA_DIR=$(CURDIR)/lua $(BUILD)/tests/bench_lock --json $(BUILD)/bench-lock-redis.json $(BENCH_LOCK_ARGS)

-include $(BUILD)/tests/bench_lock.d $(BUILD)/tests/bench_locks.d
