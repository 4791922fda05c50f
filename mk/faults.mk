# mk/faults.mk: fault injection under load and resource limits
# (tests/test_faults.py against the local stack, see docs/failures.md).
#
#   make faults                    kill -9 of an instance, Redis frozen and
#                                  restarted, Postgres restarted, a lock holder
#                                  paused past its lease, the Redis master behind
#                                  Sentinel killed and frozen (a second stack,
#                                  REDIS_HA=1), 1,000 slow clients, connection
#                                  limits, RSS over a 60 s sale; every program
#                                  whose name has "faults", and Redis-first
#                                  under Postgres refusals (test_redisfirst_lands),
#                                  Postgres under pg_auto_failover: the primary
#                                  killed and frozen mid-sale (test_pg_ha), and a
#                                  Redis Cluster's masters killed and slots migrated
#                                  mid-sale, for the default sale and Redis-first
#                                  (test_cluster_sale, test_cluster_redis_first)
#   FAULTS_SALE_S=60 FAULTS_OUTAGE_S=5 FAULTS_RATE=25   the knobs (make test: 12 s, 3 s)
#
# The figures are printed at the end and written to $(BUILD)/faults-figures.json.
#
#   make growth                    what a sale to distinct buyers leaves in Redis and
#                                  tb_lock_fence, right after and once the lifetimes
#                                  passed (loadtest/growth.py)
#   GROWTH_SALE_S=60 GROWTH_TOKEN_TTL_MS=5000 GROWTH_HORIZON_MS=5000   its knobs

##@ Fault injection

FAULTS_SALE_S   ?= 60
FAULTS_OUTAGE_S ?= 5
FAULTS_RATE     ?= 25

GROWTH_SALE_S       ?= 60
GROWTH_TOKEN_TTL_MS ?= 5000
GROWTH_HORIZON_MS   ?= 5000

.PHONY: faults growth

faults: $(BUILD)/seckill ## kill -9, Redis and Postgres outages, Redis failover (Sentinel, Cluster), Postgres failover (pg_auto_failover), paused lock holders, slow clients under load (~13 min)
	FAULTS_SALE_S=$(FAULTS_SALE_S) FAULTS_OUTAGE_S=$(FAULTS_OUTAGE_S) FAULTS_RATE=$(FAULTS_RATE) \
	FAULTS_FIGURES=$(abspath $(BUILD))/faults-figures.json BUILD=$(BUILD) \
	tests/run.sh faults redisfirst_lands test_pg_ha test_cluster_sale test_cluster_redis_first

growth: $(BUILD)/seckill ## fencing state (token counters, latches, tb_lock_fence) over a 60 s sale and after its lifetimes (~2 min)
	GROWTH_SALE_S=$(GROWTH_SALE_S) GROWTH_TOKEN_TTL_MS=$(GROWTH_TOKEN_TTL_MS) \
	GROWTH_HORIZON_MS=$(GROWTH_HORIZON_MS) SECKILL_BIN=$(abspath $(BUILD))/seckill \
	GROWTH_RUN_DIR=$(abspath $(BUILD))/growth-run GROWTH_JSON=$(abspath $(BUILD))/growth.json \
	python3 loadtest/growth.py
