# seckill: flash-sale service in C11 (libmicrohttpd, hiredis, libpq, cJSON).
#
#   make            build build/seckill
#   make test       every test against a throwaway Postgres and Redis
#   make asan       the same tests with ASan + UBSan (+ LSan) builds
#   make deps       install the Debian packages this project needs
#   V=1             show the full compiler command lines

PKGS      := libmicrohttpd hiredis libpq libcjson
CC        ?= cc
OPT       ?= -O2 -g
WARN      := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
             -Wpointer-arith -Wformat=2 -Wno-missing-field-initializers
CFLAGS    += -std=c11 -D_GNU_SOURCE $(OPT) $(WARN) -pthread -MMD -MP \
             $(shell pkg-config --cflags $(PKGS) 2>/dev/null) $(EXTRA_CFLAGS)
LDLIBS    += $(shell pkg-config --libs $(PKGS) 2>/dev/null) -pthread -lm
LDFLAGS   += $(EXTRA_LDFLAGS)

BUILD     ?= build
V         ?= 0
Q         := $(if $(filter 1,$(V)),,@)
APP_SRCS  := $(wildcard app/*.c)
APP_OBJS  := $(APP_SRCS:app/%.c=$(BUILD)/app/%.o)
LIB_OBJS  := $(filter-out $(BUILD)/app/main.o,$(APP_OBJS))
TEST_SRCS := $(wildcard tests/test_*.c)
TEST_BINS := $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%)

DEB_PKGS  := build-essential pkg-config libmicrohttpd-dev libhiredis-dev libpq-dev libcjson-dev \
             postgresql redis-server nginx apache2-utils wrk python3 curl procps docker-compose \
             chromium nodejs gnuplot-nox

.PHONY: all test asan deps clean tests-bin

all: $(BUILD)/seckill

$(BUILD)/seckill: $(APP_OBJS)
	@echo "  LD    $@"
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/app/%.o: app/%.c
	@mkdir -p $(dir $@)
	@echo "  CC    $<"
	$(Q)$(CC) $(CFLAGS) -Iapp -c -o $@ $<

$(BUILD)/tests/%: tests/%.c $(LIB_OBJS)
	@mkdir -p $(dir $@)
	@echo "  CC    $<"
	$(Q)$(CC) $(CFLAGS) -Iapp -Itests $(LDFLAGS) -o $@ $< $(LIB_OBJS) $(LDLIBS)

# make bench's stand-in for an instance (loadtest/upstream200.c)
$(BUILD)/upstream200: loadtest/upstream200.c
	@mkdir -p $(dir $@)
	@echo "  CC    $<"
	$(Q)$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< -pthread

tests-bin: $(BUILD)/seckill $(TEST_BINS) $(BUILD)/upstream200

test: tests-bin
	BUILD=$(BUILD) tests/run.sh

asan:
	SECKILL_SANITIZER=asan $(MAKE) BUILD=build/asan OPT="-O1 -g -fno-omit-frame-pointer" \
	    EXTRA_CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined" \
	    EXTRA_LDFLAGS="-fsanitize=address,undefined" test

deps:
	@missing=$$(for p in $(DEB_PKGS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	    echo "installing:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	else echo "all Debian packages present"; fi

clean:
	rm -rf build

-include $(APP_OBJS:.o=.d) $(TEST_BINS:=.d)

# Targets of the local stack, load tests and benchmarks live beside this file.
-include mk/*.mk
