# mk/ladder.mk: the demo ladder (loadtest/ladder/). Included by the Makefile.
#
#   make ladder                          packages, build, then every step of the
#                                        ladder on a stack of its own (.run/ladder,
#                                        free ports), stopped at the end
#   make ladder LADDER_ARGS=--quick      half the buyers in the stock steps (CI)
#   make ladder LADDER_ARGS="--runs 10"  ten times over, then how often each step
#                                        showed its expected outcome
#   make ladder LADDER_ARGS=--keep-stack leave the stack up (default strategies)
#
# Exit status 1 when a step does not show its expected outcome. Output in
# $(BUILD)/ladder/: ladder.txt (table), ladder.md (report), ladder.png (chart),
# ladder.json, steps/ (raw load output, access-log slice, /stats per step).
# A whole ladder (no LADDER_ARGS) that shows every expected outcome also copies
# the chart to docs/img/ladder.png, the image docs/strategies.md shows.

##@ Demo ladder

LADDER_ARGS ?=
# What the ladder runs: the server, and step 16's slow disk for Redis (an
# LD_PRELOAD library the ladder finds beside SECKILL_BIN).
LADDER_BINS := $(BUILD)/seckill $(BUILD)/slow_fsync.so

.PHONY: ladder

# The packages first, then the files (a make of its own: nothing compiles
# before the packages are there, with make -j too).
ladder: ## every strategy of the demo ladder on a stack of its own: table, report, chart (~5 min)
	@$(MAKE) --no-print-directory deps
	@$(MAKE) --no-print-directory $(LADDER_BINS)
	@SECKILL_BIN=$(abspath $(BUILD))/seckill python3 loadtest/ladder --out $(BUILD)/ladder $(LADDER_ARGS)
	@if [ -z "$(strip $(LADDER_ARGS))" ] && [ -f $(BUILD)/ladder/ladder.png ]; then \
	    mkdir -p docs/img && cp $(BUILD)/ladder/ladder.png docs/img/ladder.png && \
	    echo "chart: docs/img/ladder.png"; fi
