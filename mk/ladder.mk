# mk/ladder.mk: the demo ladder (loadtest/ladder.py). Included by the Makefile.
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

.PHONY: ladder

ladder: ## every strategy of the demo ladder on a stack of its own: table, report, chart (~5 min)
	@$(MAKE) --no-print-directory deps
	@$(MAKE) --no-print-directory all
	@SECKILL_BIN=$(abspath $(BUILD))/seckill loadtest/ladder.py --out $(BUILD)/ladder $(LADDER_ARGS)
	@if [ -z "$(strip $(LADDER_ARGS))" ] && [ -f $(BUILD)/ladder/ladder.png ]; then \
	    mkdir -p docs/img && cp $(BUILD)/ladder/ladder.png docs/img/ladder.png && \
	    echo "chart: docs/img/ladder.png"; fi
