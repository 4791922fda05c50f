# The local stack (throwaway Postgres + Redis, N instances, nginx) and the load
# tests. Included by the Makefile. Everything runs on 127.0.0.1, under RUN_DIR.
#
#   make demo        packages, build, stack, the three load runs and their tables;
#                    leaves the stack running (make stop), or STOP=1 make demo
#   make stack       build and start the stack (INSTANCES=4 make stack: four instances)
#   make stop        stop exactly what the stack started, by PID
#   make status      what runs
#   make replay-dead dead letters back in the orders stream (POST /admin/dead-letters/replay)
#   make loadtest    the three load runs against BASE_URL (default: the local stack)
#   make nginx-docker-conf   regenerate nginx/docker.conf from the template
#                    (NGINX_ALLOW="...": the addresses served /admin, /metrics, /stats)

##@ Local stack and demo

# ab sends identical requests: the stack's instances run in demo random-user
# mode (DEMO_RANDOM_USER=0 make stack: without it).
DEMO_RANDOM_USER ?= 1
STACK_SH        := DEMO_RANDOM_USER=$(DEMO_RANDOM_USER) scripts/stack.sh
# The stack starts this build's server (BUILD=dir: that one), unless SECKILL_BIN names another.
STACK_BIN       := SECKILL_BIN=$${SECKILL_BIN:-$(abspath $(BUILD))/seckill}

.PHONY: demo stack stop status replay-dead loadtest nginx-docker-conf

demo: ## packages, build, the local stack, three load runs and their tables (~90 s); STOP=1: stop after
	@$(MAKE) --no-print-directory deps
	@$(MAKE) --no-print-directory all
	@$(STACK_BIN) $(STACK_SH) start
	@rc=0; loadtest/demo.sh || rc=$$?; \
	if [ "$(STOP)" = 1 ]; then $(STACK_SH) stop; \
	else printf '\nThe stack is still running (%s). Stop it with: make stop\n' \
	    "$$(. $${RUN_DIR:-.run}/stack.env && echo "$$BASE_URL, $$INSTANCES instances")"; fi; \
	exit $$rc

stack: all ## build and start the local stack (Postgres, Redis, INSTANCES=2 instances, nginx) under .run
	@$(STACK_BIN) $(STACK_SH) start

stop: ## stop exactly what the local stack started, by PID
	@$(STACK_SH) stop

status: ## what the local stack runs
	@$(STACK_SH) status

replay-dead: ## SECKILL_STOCK=redis: put the local stack's dead letters back in the orders stream (MAX=N: at most N)
	@f=$${RUN_DIR:-.run}/stack.env; \
	test -f "$$f" || { echo "no stack runs in $${RUN_DIR:-.run}: make stack"; exit 1; }; \
	. "$$f" && { curl -sS --fail-with-body -X POST "$$BASE_URL/admin/dead-letters/replay" \
	    -H "Authorization: Bearer $$ADMIN_TOKEN" $(if $(MAX),-d '{"max":$(MAX)}'); rc=$$?; echo; exit $$rc; }

loadtest: ## the three load runs against BASE_URL (default: the local stack)
	@loadtest/demo.sh $(BASE_URL)

nginx-docker-conf: ## regenerate nginx/docker.conf from the template (NGINX_ALLOW=...)
	nginx/gen-conf.sh --docker $(if $(NGINX_ALLOW),--allow "$(NGINX_ALLOW)") -o nginx/docker.conf
