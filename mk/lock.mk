# mk/lock.mk: the lock benchmark (tests/bench_lock.c).
#
#   make bench-lock                      throwaway redis-server on a free port
#   make bench-lock REDIS_URL=redis://…  an existing Redis instead
#   BENCH_LOCK_ARGS="--threads 8 --seconds 5 --handoffs 500 --requests 200000"
#
# Prints a table and writes $(BUILD)/bench-lock.json.

##@ Lock benchmark

BENCH_LOCK_ARGS ?=

.PHONY: bench-lock

bench-lock: $(BUILD)/tests/bench_lock ## the lock benchmark (tests/bench_lock.c) against a throwaway or given Redis
	LUA_DIR=$(CURDIR)/lua $(BUILD)/tests/bench_lock --json $(BUILD)/bench-lock.json $(BENCH_LOCK_ARGS)

-include $(BUILD)/tests/bench_lock.d
