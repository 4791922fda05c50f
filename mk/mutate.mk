# mk/mutate.mk: mutation checks (scripts/mutate.py). Each mutation in
# tests/mutations.txt breaks one promise of the code on purpose; the run
# applies it to a copy of the work tree (build/mutate/<name>), builds the
# copy and runs only the tests named for it, which must fail. Not part of
# make test or CI: it rebuilds and reruns tests once per mutation.
#
#   make mutate                          every mutation (about 20 minutes on 2 cores)
#   make mutate MUTATIONS=id-shift,cas-compare   only these
#   make mutate MUTATE_ARGS=--baseline   first the named tests on the unmutated copy
#   make mutate MUTATE_ARGS=--list       the mutations and their tests, nothing run
#
# Exit status 1 when a mutation survives (all its tests pass) or does not
# build. The table goes to $(BUILD)/mutate/results.txt too.

##@ Mutation checks

MUTATIONS   ?=
MUTATE_ARGS ?=

.PHONY: mutate

mutate: ## break the code on purpose (tests/mutations.txt), check that its tests fail (~20 min; MUTATIONS=a,b: some)
	@MUTATIONS="$(MUTATIONS)" python3 scripts/mutate.py --scratch $(abspath $(BUILD))/mutate $(MUTATE_ARGS)
