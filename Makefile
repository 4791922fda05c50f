# seckill: flash-sale service in C11 (libmicrohttpd, hiredis, libpq, cJSON).
#
# `make help` lists every target with one line each: the '## ' comment beside
# each target below (and in mk/*.mk) is that line, so the list cannot drift
# (tests/test_workflow.py checks that every target is listed).
#
#   V=1             show the full compiler command lines
#   TESTS="a b"     make test / make check / make asan / make tsan: only the test
#                   programs whose name contains a or b (tests/run.sh's filter)

PKGS      := libmicrohttpd hiredis libpq libcjson
CC        ?= cc
OPT       ?= -O2 -g
WARN      := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
             -Wpointer-arith -Wformat=2 -Wno-missing-field-initializers
CFLAGS    += -std=c11 -D_GNU_SOURCE $(OPT) $(WARN) -pthread -MMD -MP \
             $(shell pkg-config --cflags $(PKGS) 2>/dev/null) $(EXTRA_CFLAGS)
# The ZooKeeper C client ships no pkg-config file: named here, checked by pkg-check.
LDLIBS    += $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lzookeeper_mt -pthread -lm
LDFLAGS   += $(EXTRA_LDFLAGS)

BUILD     ?= build
# Parallel compiles for the builds that make test, asan, tsan and fuzz run.
JOBS      ?= $(shell nproc 2>/dev/null || echo 1)
V         ?= 0
Q         := $(if $(filter 1,$(V)),,@)
TESTS     ?=
# app/ holds main.c and one folder per layer band (app/LAYERS); every folder
# is on the include path, so a module includes another by its name alone.
APP_SRCS  := $(wildcard app/*.c app/*/*.c)
APP_DIRS  := $(sort $(patsubst %/,%,$(dir $(wildcard app/*/*.h))))
APP_INC   := -Iapp $(addprefix -I,$(APP_DIRS))
APP_OBJS  := $(APP_SRCS:app/%.c=$(BUILD)/app/%.o)
LIB_OBJS  := $(filter-out $(BUILD)/app/main.o,$(APP_OBJS))
TEST_SRCS := $(wildcard tests/test_*.c) $(wildcard tests/unit_*.c)
TEST_BINS := $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%)

# The version --version prints: the VERSION file, and the commit when built
# from a git checkout (git describe). Written into a generated header that
# changes only when the text does, so a new commit rebuilds one object.
VERSION_TEXT := $(strip $(shell cat VERSION 2>/dev/null || echo 0.0.0))
GIT_DESCRIBE := $(strip $(shell git describe --always --dirty --abbrev=12 2>/dev/null))
SECKILL_VERSION := $(VERSION_TEXT)$(if $(GIT_DESCRIBE), (git $(GIT_DESCRIBE)))

# Everything the build, the tests and the tools need on Debian 12: the
# libraries, the servers the tests start (Postgres, Redis, nginx), the load
# tools, the browser test's Chromium and Node.js, docker-compose (validates
# the compose file), clang with its runtime libraries (make fuzz: libFuzzer
# lives in libclang-rt-14-dev), GCC's ThreadSanitizer runtime (make tsan),
# nginx's Lua module (the sold-out edge, nginx/nginx.conf.tmpl) and ZooKeeper
# (SECKILL_LOCK=zk: the C client; the server, with Java, for the tests) and
# gcovr (make coverage's report).
DEB_PKGS  := build-essential pkg-config libmicrohttpd-dev libhiredis-dev libpq-dev libcjson-dev \
             postgresql redis-server nginx libnginx-mod-http-lua apache2-utils wrk python3 curl \
             procps docker-compose \
             chromium nodejs gnuplot-nox clang libclang-rt-14-dev libtsan2 \
             libzookeeper-mt-dev zookeeperd gcovr \
             postgresql-15-auto-failover pg-auto-failover-cli

# The Debian package that ships each pkg-config name (for pkg-check's message).
PKG_DEBS  := libmicrohttpd=libmicrohttpd-dev hiredis=libhiredis-dev libpq=libpq-dev \
             libcjson=libcjson-dev

# Installed only when no command of their name is found: npm (Debian's
# conflicts with the Node.js builds that bring their own; mk/dashboard.mk).
DEB_CMD_PKGS := npm

# Prints the packages of DEB_PKGS that are not installed (one dpkg-query
# call), then those of DEB_CMD_PKGS whose command is missing.
DEPS_MISSING = { dpkg-query -W -f='$${Package} $${db:Status-Abbrev}\n' $(DEB_PKGS) 2>/dev/null | \
               awk '$$2 == "ii" { ok[$$1] = 1 } END { n = split("$(DEB_PKGS)", p, " "); \
                    for (i = 1; i <= n; i++) if (!(p[i] in ok)) printf "%s ", p[i] }'; \
               for c in $(DEB_CMD_PKGS); do command -v $$c >/dev/null 2>&1 || printf '%s ' $$c; done; }

.PHONY: all help test check tests-bin asan tsan tsan-concurrency coverage coverage-report deps deps-check \
        pkg-check clean

##@ Build and test

all: $(BUILD)/seckill ## build build/seckill (the default target)

help: ## this list: every target, one line each
	@awk 'BEGIN { FS = ":.*## " } \
	    /^##@ / { printf "\n%s\n", substr($$0, 5); next } \
	    /^[a-zA-Z0-9][a-zA-Z0-9_.-]*:.*## / { printf "  %-20s %s\n", $$1, $$2 }' \
	    Makefile $(sort $(wildcard mk/*.mk))
	@printf '\nVariables: BUILD=dir (default build), V=1 (compiler lines), TESTS="a b" (test filter)\n'

$(BUILD)/seckill: $(APP_OBJS)
	@echo "  LD    $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/app/%.o: app/%.c | pkg-check
	@mkdir -p $(dir $@)
	@echo "  CC    $<"
	$(Q)$(CC) $(CFLAGS) $(APP_INC) -I$(BUILD)/gen -c -o $@ $<

# version.c includes the generated header: the first build must make it first.
$(BUILD)/app/core/version.o: $(BUILD)/gen/seckill_version.h

$(BUILD)/gen/seckill_version.h: FORCE
	@mkdir -p $(dir $@)
	@printf '#define SECKILL_VERSION "%s"\n' '$(subst ','\'',$(SECKILL_VERSION))' >$@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv -f $@.tmp $@; fi

# Always out of date (not .PHONY: a phony prerequisite would relink each time).
FORCE:

$(BUILD)/tests/%: tests/%.c $(LIB_OBJS) | pkg-check
	@mkdir -p $(dir $@)
	@echo "  CC    $<"
	$(Q)$(CC) $(CFLAGS) $(APP_INC) -Itests $(LDFLAGS) -o $@ $< $(LIB_OBJS) $(LDLIBS)

# The C load tools that link the server's objects (loadtest/bench_*.c: make
# bench-ids, bench-lock, bench-lock-redis), built beside the test programs.
$(BUILD)/tests/bench_%: loadtest/bench_%.c $(LIB_OBJS) | pkg-check
	@mkdir -p $(dir $@)
	@echo "  CC    $<"
	$(Q)$(CC) $(CFLAGS) $(APP_INC) -Itests $(LDFLAGS) -o $@ $< $(LIB_OBJS) $(LDLIBS)

# make bench's stand-in for an instance (loadtest/upstream200.c)
$(BUILD)/upstream200: loadtest/upstream200.c | pkg-check
	@mkdir -p $(dir $@)
	@echo "  CC    $<"
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< -pthread

# the ladder's slow disk for Redis (loadtest/slow_fsync.c, an LD_PRELOAD library)
$(BUILD)/slow_fsync.so: loadtest/slow_fsync.c | pkg-check
	@mkdir -p $(dir $@)
	@echo "  CC    $<"
	$(Q)$(CC) $(CFLAGS) -fPIC -shared $(LDFLAGS) -o $@ $< -ldl

tests-bin: $(BUILD)/seckill $(TEST_BINS) $(BUILD)/upstream200 $(BUILD)/slow_fsync.so ## build the server and every C test program

test: deps-check ## every test against a throwaway Postgres and Redis (~14 min; installs what is missing first)
	@$(MAKE) --no-print-directory -j$(JOBS) tests-bin
	BUILD=$(BUILD) tests/run.sh $(TESTS)

# The fast tier: no Postgres, no nginx, no load. A throwaway redis-server
# (started in a few milliseconds) serves the C tests of the lock and the
# order ids, test_zk_lock starts a ZooKeeper of its own (about a second) and
# test_multi_lock five redis-servers; the unit tests need nothing. About 55 s on
# 2 cores with the binaries built, 23 s of it test_watchdog's lease timing,
# 10 s test_zk_lock's session timeouts and 10 s test_multi_lock's leases; the unit
# tests take under a second.
# (mk/*.mk may add prerequisites: 'check: something'.)
check: deps-check ## fast tier, about 55 s: C unit tests (tests/unit_*.c) and the C tests (Redis, ZooKeeper)
	@$(MAKE) --no-print-directory $(BUILD)/seckill $(TEST_BINS)
	BUILD=$(BUILD) tests/run.sh --check $(TESTS)

asan: ## every test with ASan + UBSan (+ LSan) builds in build/asan
	SECKILL_SANITIZER=asan $(MAKE) BUILD=build/asan OPT="-O1 -g -fno-omit-frame-pointer" \
	    EXTRA_CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined" \
	    EXTRA_LDFLAGS="-fsanitize=address,undefined" test

# ThreadSanitizer (GCC's, libtsan2): a TSan server and TSan test binaries. A
# data race makes the process exit non-zero, which fails its test.
tsan: ## every test with ThreadSanitizer builds in build/tsan (TESTS="...": a subset)
	SECKILL_SANITIZER=tsan $(MAKE) BUILD=build/tsan OPT="-O1 -g" EXTRA_CFLAGS="-fsanitize=thread" \
	    EXTRA_LDFLAGS="-fsanitize=thread" test

# The programs that exercise the threads: the lock's C tests (lock, lock wait,
# watchdog, order ids, MultiLock's storm, the ZooKeeper lock with its client's
# threads), the server's worker pool and strategies, Redis-first's admissions in
# lots, and the server following a Redis failover (the Sentinel follower thread).
# Left out: test_locks.py, which the name test_lock matches (the lock backends'
# storms through the server: 72 s under TSan), and the strategies' sale one buyer
# at a time (46 s with no two buyers at once).
TSAN_CONCURRENCY_TESTS := test_lock test_watchdog test_order_id test_multi_lock test_zk_lock test_workers test_strategies test_sentinel test_redisfirst.py
TSAN_CONCURRENCY_SKIP  := test_locks.py
# Left out under TSan: the one-at-a-time sweep, and the early-lock-release
# tests, which check what Postgres commits while its flush is held (no
# thread of ours meets another there that the other tests do not cover).
TSAN_CONCURRENCY_EXCEPT := one_at_a_time early_lock_release early_release

tsan-concurrency: ## ThreadSanitizer on the concurrency tests only (what CI runs)
	@TEST_SKIP="$(TSAN_CONCURRENCY_SKIP)" TEST_EXCEPT="$(TSAN_CONCURRENCY_EXCEPT)" \
	    $(MAKE) --no-print-directory tsan TESTS="$(TSAN_CONCURRENCY_TESTS)"

# Line and branch coverage of app/: gcov builds (--coverage -O0) of the server
# and the tests in build/coverage, the whole suite (TESTS="...": a subset), then
# gcovr over app/ alone. The counts of the servers the tests start are written
# when they exit: on SIGTERM main returns and they are kept; an instance a fault
# test kills with SIGKILL leaves none. Processes that exit at once merge their
# counts into the same .gcda files under a lock. The counts of an earlier run
# are removed first. The report: a table (scripts/coverage-table.py) and
# build/coverage/html/index.html (a page per file, its lines marked).
COV_BUILD := build/coverage

coverage: ## every test with gcov builds in build/coverage, then app/'s line and branch coverage: table and HTML
	@find $(COV_BUILD) -name '*.gcda' -delete 2>/dev/null; \
	rc=0; $(MAKE) --no-print-directory BUILD=$(COV_BUILD) OPT="-O0 -g" EXTRA_CFLAGS="--coverage" \
	    EXTRA_LDFLAGS="--coverage" test || rc=$$?; \
	$(MAKE) --no-print-directory coverage-report || rc=$$?; \
	exit $$rc

coverage-report: ## app/'s coverage from the counts in build/coverage (gcovr): table and build/coverage/html/index.html
	@command -v gcovr >/dev/null 2>&1 || { echo "gcovr not found: make deps (or apt-get install gcovr)" >&2; exit 2; }
	@ls $(COV_BUILD)/app/*/*.gcda >/dev/null 2>&1 || { echo "no counts in $(COV_BUILD)/app: make coverage" >&2; exit 2; }
	@rm -rf $(COV_BUILD)/html && mkdir -p $(COV_BUILD)/html
	@gcovr --root . --filter 'app/' -j $(JOBS) --json $(COV_BUILD)/coverage.json \
	    --json-summary $(COV_BUILD)/coverage-summary.json \
	    --html-details $(COV_BUILD)/html/index.html --html-title "seckill: app/ coverage" \
	    $(COV_BUILD)
	@scripts/coverage-table.py $(COV_BUILD)/coverage-summary.json
	@echo "HTML: $(COV_BUILD)/html/index.html"

##@ Packages

# One line per step (scripts/deps.sh); apt-get's output goes to $(BUILD)/deps.log.
deps: ## install the Debian packages this project needs (apt-get, as root; one line per step, apt's output in build/deps.log)
	@scripts/deps.sh --log $(BUILD)/deps.log $$($(DEPS_MISSING))

# make test and make check run this first: on a machine that lacks packages
# it runs make deps (as root), or says what to run. SKIP_DEPS_CHECK=1 skips
# it (a machine that is not Debian, with the tools installed otherwise).
deps-check: ## install what is missing (make deps) when run as root, else say what to run
	@if [ "$(SKIP_DEPS_CHECK)" = 1 ]; then exit 0; fi; \
	if ! command -v dpkg-query >/dev/null 2>&1; then \
	    echo "deps-check: no dpkg-query (not Debian): not checking packages; see DEB_PKGS in the Makefile" >&2; \
	    exit 0; fi; \
	missing=$$($(DEPS_MISSING)); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then \
	    echo "deps-check: missing: $$missing: running make deps"; \
	    $(MAKE) --no-print-directory deps; \
	else \
	    echo "deps-check: missing Debian packages: $$missing" >&2; \
	    echo "run: sudo make deps   (or: sudo apt-get install $$missing)" >&2; \
	    exit 2; \
	fi

# Every compile rule runs this first (order-only): a missing library stops
# the build with its name and the command that installs it, instead of a
# compiler error about a header.
pkg-check: ## check the build's libraries with pkg-config (every compile runs it first)
	@missing=""; debs=""; \
	if ! command -v $(firstword $(CC)) >/dev/null 2>&1; then missing="$$missing C compiler ($(CC))"; debs="$$debs build-essential"; fi; \
	if ! command -v pkg-config >/dev/null 2>&1; then \
	    missing="$$missing pkg-config"; debs="$$debs pkg-config $(foreach m,$(PKG_DEBS),$(word 2,$(subst =, ,$(m))))"; \
	else \
	    for p in $(PKGS); do \
	        pkg-config --exists $$p 2>/dev/null && continue; \
	        d=$$p; for m in $(PKG_DEBS); do [ "$${m%%=*}" = "$$p" ] && d=$${m#*=}; done; \
	        missing="$$missing $$p ($$d)"; debs="$$debs $$d"; \
	    done; \
	fi; \
	if ! printf '#include <zookeeper/zookeeper.h>\n' | $(CC) -E -x c - >/dev/null 2>&1; then \
	    missing="$$missing zookeeper_mt (libzookeeper-mt-dev)"; debs="$$debs libzookeeper-mt-dev"; fi; \
	if [ -n "$$missing" ]; then \
	    echo "seckill: cannot build: missing:$$missing" >&2; \
	    echo "run \`make deps\` (as root; it installs every package the project needs)," >&2; \
	    echo "or install only these: apt-get install$$debs" >&2; \
	    exit 2; \
	fi

clean: ## remove build/ (every build, test binary and report)
	rm -rf build

-include $(APP_OBJS:.o=.d) $(TEST_BINS:=.d)

# Targets of the local stack, load tests and benchmarks live beside this file.
-include mk/*.mk
