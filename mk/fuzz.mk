# libFuzzer targets (clang + libclang-rt-14-dev): the router and validators,
# and the admin API's JSON bodies. Each runs FUZZ_SECONDS with ASan + UBSan;
# new inputs go to build/fuzz/corpus-*, seeds stay in tests/fuzz/corpus/*.
#
#   make fuzz                   both targets side by side (a core each), 60 s
#   make fuzz FUZZ_SECONDS=600  longer

##@ Fuzzing

FUZZ_SECONDS ?= 60
FUZZ_BUILD   := build/fuzz
FUZZ_TARGETS := route admin
FUZZ_SAN     := -fsanitize=address,undefined -fno-sanitize-recover=undefined

.PHONY: fuzz fuzz-build

fuzz-build: ## build the libFuzzer targets (clang, ASan + UBSan) in build/fuzz
	$(MAKE) -j$(JOBS) BUILD=$(FUZZ_BUILD) CC=clang OPT="-O1 -g" \
	    EXTRA_CFLAGS="-fsanitize=fuzzer-no-link $(FUZZ_SAN)" EXTRA_LDFLAGS="$(FUZZ_SAN)" \
	    $(FUZZ_BUILD)/seckill
	@for t in $(FUZZ_TARGETS); do \
	    echo "  FUZZ  tests/fuzz/fuzz_$$t.c"; \
	    clang -std=c11 -D_GNU_SOURCE -O1 -g -Wall -Wextra -Werror $(APP_INC) \
	        $$(pkg-config --cflags $(PKGS)) -fsanitize=fuzzer $(FUZZ_SAN) \
	        -o $(FUZZ_BUILD)/fuzz_$$t tests/fuzz/fuzz_$$t.c \
	        $(filter-out $(FUZZ_BUILD)/app/main.o,$(APP_SRCS:app/%.c=$(FUZZ_BUILD)/app/%.o)) \
	        $$(pkg-config --libs $(PKGS)) -lzookeeper_mt -pthread -lm || exit 1; \
	done

fuzz: fuzz-build ## run the libFuzzer targets side by side, FUZZ_SECONDS each (default 60 s)
	@pids=""; for t in $(FUZZ_TARGETS); do \
	    mkdir -p $(FUZZ_BUILD)/corpus-$$t; \
	    echo "== fuzz_$$t for $(FUZZ_SECONDS) s"; \
	    $(FUZZ_BUILD)/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	        -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
	        $(FUZZ_BUILD)/corpus-$$t tests/fuzz/corpus/$$t 2>$(FUZZ_BUILD)/fuzz_$$t.log & \
	    pids="$$pids $$!"; \
	done; \
	rc=0; set -- $$pids; \
	for t in $(FUZZ_TARGETS); do \
	    if wait $$1; then \
	        grep -E "^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)|^#[0-9]+ +DONE" \
	            $(FUZZ_BUILD)/fuzz_$$t.log; \
	        echo "fuzz_$$t: no crash"; \
	    else \
	        tail -40 $(FUZZ_BUILD)/fuzz_$$t.log; echo "fuzz_$$t: FAILED"; rc=1; \
	    fi; \
	    shift; \
	done; \
	exit $$rc
