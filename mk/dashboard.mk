# The live dashboard (dashboard/) and its browser test. Included by the Makefile.
#
#   make dashboard       copy dashboard/ into the running local stack's nginx
#                        (RUN_DIR/nginx/dashboard: edits show without a restart)
#                        and print its address
#   make test-dashboard  tests/test_dashboard.py alone: the local stack, a sale,
#                        headless Chromium; screenshot in $(BUILD)/dashboard/
#   make dashboard-npm   npm ci of the browser test's driver (tests/dashboard/;
#                        the test runs it itself when node_modules is missing)
#
# 'make deps' installs Debian's chromium and nodejs (DEB_PKGS); npm comes with
# the machine's Node.js, and on a Debian without it from Debian's npm package
# (DEB_CMD_PKGS: installed only when no npm is found, it conflicts with other
# Node.js builds).

##@ Dashboard

DASHBOARD_RUN_DIR ?= $(or $(RUN_DIR),.run)

.PHONY: dashboard test-dashboard dashboard-npm

dashboard: ## copy dashboard/ into the running local stack's nginx and print its address
	@test -f $(DASHBOARD_RUN_DIR)/stack.env || { echo "no stack runs in $(DASHBOARD_RUN_DIR): make stack"; exit 1; }
	@mkdir -p $(DASHBOARD_RUN_DIR)/nginx/dashboard
	@cp -R dashboard/. $(DASHBOARD_RUN_DIR)/nginx/dashboard/
	@chmod -R a+rX $(DASHBOARD_RUN_DIR)/nginx/dashboard
	@. $(DASHBOARD_RUN_DIR)/stack.env && echo "dashboard: $$BASE_URL/dashboard/"

test-dashboard: tests-bin ## the dashboard's browser test alone (local stack, a sale, headless Chromium)
	BUILD=$(BUILD) tests/run.sh test_dashboard

dashboard-npm: ## npm ci of the browser test's driver (tests/dashboard/)
	npm ci --prefix tests/dashboard --no-audit --no-fund --loglevel=error
