# mk/bench.mk: the performance benchmark (loadtest/bench/).
#
#   make bench        build, start a private stack (build/bench-run: durable
#                     Postgres, Redis, 2 instances, nginx), measure the
#                     ceilings (pgbench, redis-benchmark, wrk -> nginx; and
#                     nginx -> build/upstream200 as a yardstick) and the
#                     service (sale, sold-out, storm, 60 s sale; batched at
#                     16, 64 and 256 connections; redis-first),
#                     print the table with ratios, write build/bench.json, stop
#                     everything. Exit 1 on an invariant violation only.
#   make bench-edge   the ways nginx can answer a sold-out crowd by itself
#                     (Lua's shared dictionary, proxy_cache, njs) against a bare
#                     'return 200', one nginx, same wrk settings
#                     (loadtest/edge_choice.py; ~6 min); then what the edge
#                     costs nginx on a sale, edge on against off
#                     (loadtest/edge_sale.py: CPU, then instructions under
#                     callgrind; ~3 min); last, nginx's instructions per
#                     answer of the edge against a bare nginx's
#                     (loadtest/edge_answer.py, EDGE_ANSWER_BASE=<rev>; ~1 min)
#   make stop-bench   stop a stack left running by BENCH_KEEP=1 make bench
#   make bench-ab AB="'EARLY_LOCK_RELEASE=0' 'EARLY_LOCK_RELEASE=1'"
#                     instance settings compared on one stack, interleaved
#                     round by round (loadtest/bench_ab.py: AB_ROUNDS,
#                     AB_SECONDS, AB_CONNECTIONS, AB_STOCK)
#
#   BENCH_LONG=0      skip the 60 s / 256-connection sale (about a minute less)
#   BENCH_REPEAT=3    three rounds of the short runs, medians in the table
#   (more knobs: python3 loadtest/bench --help)

##@ Benchmarks

BENCH_RUN_DIR ?= $(abspath $(BUILD))/bench-run

.PHONY: bench stop-bench bench-ab bench-edge bench-pg-ha bench-cluster

bench: all $(BUILD)/upstream200 ## the performance benchmark on a private stack: ceilings, sales, table, then bench-pg-ha and bench-cluster (BENCH_PG_HA=0, BENCH_CLUSTER=0: not) (~16 min)
	@BENCH_RUN_DIR=$(BENCH_RUN_DIR) BENCH_JSON=$${BENCH_JSON:-$(abspath $(BUILD))/bench.json} \
	    SECKILL_BIN=$${SECKILL_BIN:-$(abspath $(BUILD))/seckill} \
	    BENCH_UPSTREAM200=$${BENCH_UPSTREAM200:-$(abspath $(BUILD))/upstream200} python3 loadtest/bench
	@if [ "$${BENCH_PG_HA:-1}" = 1 ]; then \
	    SECKILL_BIN=$${SECKILL_BIN:-$(abspath $(BUILD))/seckill} python3 loadtest/pg_ha_cost.py; fi
	@if [ "$${BENCH_CLUSTER:-1}" = 1 ]; then \
	    SECKILL_BIN=$${SECKILL_BIN:-$(abspath $(BUILD))/seckill} python3 loadtest/cluster_cost.py; fi

bench-cluster: all ## the default sale on one Redis and on a Redis Cluster: six vouchers, one hot voucher, each master's share (~2 min)
	@SECKILL_BIN=$${SECKILL_BIN:-$(abspath $(BUILD))/seckill} python3 loadtest/cluster_cost.py

bench-edge: $(BUILD)/upstream200 ## nginx answering a sold-out crowd: Lua dict, proxy_cache, njs vs bare return 200; the edge's cost on a sale; an edge answer in instructions (~10 min)
	@python3 loadtest/edge_choice.py
	@BENCH_UPSTREAM200=$(abspath $(BUILD))/upstream200 python3 loadtest/edge_sale.py
	@python3 loadtest/edge_answer.py

stop-bench: ## stop a stack left running by BENCH_KEEP=1 make bench
	@RUN_DIR=$(BENCH_RUN_DIR) scripts/stack.sh stop

bench-ab: all ## compare instance settings on one stack, interleaved: make bench-ab AB="'X=a' 'X=b'"
	@test -n "$(AB)" || { echo "usage: make bench-ab AB=\"'VAR=a' 'VAR=b'\"" >&2; exit 2; }
	@BENCH_RUN_DIR=$${BENCH_RUN_DIR:-$(abspath $(BUILD))/bench-ab-run} \
	    SECKILL_BIN=$${SECKILL_BIN:-$(abspath $(BUILD))/seckill} python3 loadtest/bench_ab.py $(AB)

# Buyers' latency with and without clients polling /stats in a loop
# (loadtest/bench_pollers.py: POLLERS, POLL_ROUNDS, POLL_SECONDS, POLL_BUYERS,
# PACE_MS). SECKILL_BIN=<another build> measures that one.
.PHONY: bench-pollers
bench-pollers: all ## buyers' p50/p99 through nginx with and without 20 clients polling /stats
	@BENCH_RUN_DIR=$${BENCH_RUN_DIR:-$(abspath $(BUILD))/bench-pollers-run} \
	    SECKILL_BIN=$${SECKILL_BIN:-$(abspath $(BUILD))/seckill} python3 loadtest/bench_pollers.py

bench-pg-ha: all ## a synchronous standby's cost (one Postgres vs pg_auto_failover: orders/s, p99) and a failover's time (~4 min)
	@SECKILL_BIN=$${SECKILL_BIN:-$(abspath $(BUILD))/seckill} python3 loadtest/pg_ha_cost.py
