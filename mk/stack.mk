# The local stack (throwaway Postgres + Redis, N instances, nginx) and the load
# tests. Included by the Makefile. Everything runs on 127.0.0.1, under RUN_DIR.
#
#   make demo        packages, build, stack, the three load runs and their tables;
#                    leaves the stack running (make stop), or STOP=1 make demo
#   make stack       build and start the stack (INSTANCES=4 make stack: four instances)
#   make stop        stop exactly what the stack started, by PID
#   make status      what runs
#   make loadtest    the three load runs against BASE_URL (default: the local stack)
#   make nginx-docker-conf   regenerate nginx/docker.conf from the template

# ab sends identical requests: the stack's instances run in demo random-user
# mode (DEMO_RANDOM_USER=0 make stack: without it).
DEMO_RANDOM_USER ?= 1
STACK_SH        := DEMO_RANDOM_USER=$(DEMO_RANDOM_USER) scripts/stack.sh

.PHONY: demo stack stop status loadtest nginx-docker-conf

demo:
	@$(MAKE) --no-print-directory deps
	@$(MAKE) --no-print-directory all
	@$(STACK_SH) start
	@rc=0; loadtest/demo.sh || rc=$$?; \
	if [ "$(STOP)" = 1 ]; then $(STACK_SH) stop; \
	else printf '\nThe stack is still running (%s). Stop it with: make stop\n' \
	    "$$(. $${RUN_DIR:-.run}/stack.env && echo "$$BASE_URL, $$INSTANCES instances")"; fi; \
	exit $$rc

stack: all
	@$(STACK_SH) start

stop:
	@$(STACK_SH) stop

status:
	@$(STACK_SH) status

loadtest:
	@loadtest/demo.sh $(BASE_URL)

nginx-docker-conf:
	nginx/gen-conf.sh --docker -o nginx/docker.conf
