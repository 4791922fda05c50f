# mk/lock.mk: the lock benchmark (tests/bench_lock.c).
#
#   make bench-lock                      throwaway redis-server on a free port
#   make bench-lock REDIS_URL=redis://…  an existing Redis instead
#   BENCH_LOCK_ARGS="--threads 8 --seconds 5 --handoffs 500 --requests 200000"
#   make bench-lock-ha                   the same three ways, each on throwaway
#                                        servers: one Redis; a master with two
#                                        replicas (a Sentinel setup: every write
#                                        also goes to them); and the same with
#                                        WAIT 1 after each grant (LOCK_SYNC_REPLICAS=1)
#
# Prints a table and writes $(BUILD)/bench-lock.json (bench-lock-ha:
# $(BUILD)/bench-lock-{single,replicas,wait1}.json and a table of the three).

##@ Lock benchmark

BENCH_LOCK_ARGS ?=

.PHONY: bench-lock bench-lock-ha

bench-lock: $(BUILD)/tests/bench_lock ## the lock benchmark (tests/bench_lock.c) against a throwaway or given Redis
	LUA_DIR=$(CURDIR)/lua $(BUILD)/tests/bench_lock --json $(BUILD)/bench-lock.json $(BENCH_LOCK_ARGS)

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

-include $(BUILD)/tests/bench_lock.d
