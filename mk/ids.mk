# mk/ids.mk: the order id schemes side by side (loadtest/bench_ids.py runs
# loadtest/bench_ids.c on a private stack, build/bench-ids-run).
#
#   make bench-ids                        the service's Redis id, snowflake, UUID
#                                         v4 and v7, a Postgres sequence with and
#                                         without CACHE, segment allocation: ids/s
#                                         from 8 threads, size, order, restart,
#                                         clock step back; $(BUILD)/bench-ids/
#   BENCH_IDS_THREADS=8 BENCH_IDS_SECONDS=3   the knobs

##@ Id benchmark

.PHONY: bench-ids

bench-ids: all $(BUILD)/tests/bench_ids ## five id schemes: ids/s from 8 threads, size, order, restart, clock step back (~1 min)
	@BUILD=$(abspath $(BUILD)) SECKILL_BIN=$(abspath $(BUILD))/seckill python3 loadtest/bench_ids.py

-include $(BUILD)/tests/bench_ids.d
