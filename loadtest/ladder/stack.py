"""The ladder's stack (kit.Stack): every step sets the instances'
strategies and knobs afresh; LadderError and the ladder's log."""

import sys

import kit

from .steps import SCRUB, STEP_VARS


class LadderError(Exception):
    """Something other than an expectation failed (exit status 2)."""


def log(msg):
    print(f"ladder: {msg}", file=sys.stderr, flush=True)


class Stack(kit.Stack):
    """The ladder's stack: every step sets the instances' strategies and knobs
    afresh (STEP_VARS not named by a step are unset)."""

    def __init__(self, run_dir, services=""):
        super().__init__(run_dir, scrub=SCRUB)
        self.instances = None
        self.services = services             # LOCK_SERVICES: the steps' lock services
        self.ha = None
        self.pg_ha = None
        self.cluster = None

    def configure(self, instances, step_env):
        """The instances run with step_env. True when the database is new
        (a full start), so the caller sets it up again."""
        settings = {k: None for k in STEP_VARS}
        settings.update({"INSTANCES": instances, "DEMO_RANDOM_USER": 1, "LOG_LEVEL": "warn",
                         "LOCK_SERVICES": self.services})
        settings.update(step_env)
        ha = str(step_env.get("REDIS_HA", 0)) == "1"
        pg_ha = str(step_env.get("PG_HA", 0)) == "1"
        cluster = str(step_env.get("REDIS_CLUSTER", 0)) == "1"
        fresh = not (self.started and self.instances == instances and self.ha == ha
                     and self.pg_ha == pg_ha and self.cluster == cluster)
        # First start, another instance count, Redis with(out) Sentinel or
        # as a cluster, or Postgres with(out) pg_auto_failover: the whole
        # stack (a new database: the caller drops the constraint and makes
        # the voucher).
        self.command("start" if fresh else "restart-instances", 300 if pg_ha else 180, **settings)
        self.instances = instances
        self.ha = ha
        self.pg_ha = pg_ha
        self.cluster = cluster
        return fresh

    def stop(self):
        """scripts/stack.sh stop; a failure is logged (the ladder is ending)."""
        p = self.run("stop")
        if p.returncode != 0:
            log(f"stack.sh stop: {p.stderr.strip()}")
        self.started = False
