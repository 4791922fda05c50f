# mk/layers.mk: the layer check (scripts/layers.sh reads app/LAYERS and the
# objects' symbols with nm). It fails on a call that goes up a layer, on a
# cycle between modules, and on a module without a layer.
#
#   make layers      the check alone (builds the objects first)
#   make check       includes it
#   make test        runs it before the tests

##@ Layers

.PHONY: layers check test

layers: $(APP_OBJS) ## check that app/ modules only call down a layer, with no cycle (app/LAYERS)
	@scripts/layers.sh -t app/LAYERS $(APP_OBJS)

check: layers
test: layers
