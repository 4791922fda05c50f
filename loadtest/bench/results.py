"""make bench's results file (BENCH_JSON) and its history."""

import json
import os
import shutil
import time
from datetime import datetime, timezone

import kit

from .settings import BATCH_TARGETS, REFERENCE, TARGETS


class Results:
    """The results file (a mixin of Bench)."""

    def write_json(self, status, error=None, history=True):
        """BENCH_JSON: the run's settings, machine, rounds, results and
        verdicts; also kept in bench-history/ beside it (history)."""
        doc = {
            "when": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": "make bench",
            "status": status,
            "error": error,
            "durationSeconds": round(time.monotonic() - self.t_start, 1),
            "settings": self.settings_doc(),
            "reference": REFERENCE,
            "targetsWanted": TARGETS,
            "batchTargetsWanted": {str(c): t for c, t in BATCH_TARGETS.items()},
            "machine": self.res.get("machine"),
            "figures": self.res.get("figures"),
            "ranges": self.res.get("ranges"),
            "ratios": self.res.get("ratios"),
            "rssMb": self.res.get("rssMb"),
            "targets": self.res.get("targets"),
            "invariants": {"ok": not self.violations, "runs": self.invariant_runs},
            "rounds": self.rounds,
            "long": self.longs[0] if len(self.longs) == 1 else self.longs or None,
        }
        d = os.path.dirname(os.path.abspath(self.json_path))
        os.makedirs(d, exist_ok=True)
        kit.write_atomic(self.json_path, json.dumps(doc, indent=1) + "\n")
        if history and self.rounds:
            # Every run is also kept: python3 loadtest/bench --median <them> gives medians.
            hist = os.path.join(d, "bench-history")
            os.makedirs(hist, exist_ok=True)
            shutil.copyfile(self.json_path, os.path.join(
                hist, "bench-" + doc["when"].replace(":", "").replace("-", "") + ".json"))

    def settings_doc(self):
        """The JSON's "settings": what this run measured with."""
        return {
            "seconds": self.seconds, "warmupSeconds": self.warmup, "rounds": self.repeat,
            "instances": 2, "saleConnections": self.sale_conns, "batchConnections": self.batch_conns,
            "lowConnections": self.low_conns,
            "threads": self.threads or "server default", "batchThreads": self.batch_threads,
            "long": self.long and "long" not in self.skip, "longSeconds": self.long_seconds,
            "longConnections": self.long_conns, "pgbenchClients": self.pg_clients,
            "pgMaxConnections": self.max_conn, "skip": sorted(self.skip),
            "logLevel": "warn", "pgDurable": True,
        }
