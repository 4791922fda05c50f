"""The Redis-first steps on a Redis Cluster (a stack with REDIS_CLUSTER=1:
3 masters, 3 replicas, every node appendfsync always): the replica of the
voucher's master cut off, a burst of buyers with the consumers off, the
master SIGKILLed, its replica promoted without the burst; the consumers on,
the drain; then which acknowledged orders are rows."""

import json
import os
import time

import kit

from .redis_steps import buy_all
from .stack import LadderError, log

SCRIPT = os.path.join(kit.ROOT, "scripts", "redis-cluster.sh")
PROMOTE_TIMEOUT_S = 60            # the failure detection (cluster-node-timeout), the election
DRAIN_TIMEOUT_S = 60


class ClusterSteps:
    """The Redis Cluster steps (a mixin of Ladder)."""

    def cluster(self, cmd, *args, timeout=120):
        """scripts/redis-cluster.sh CMD on the stack's cluster; its output."""
        return kit.run([SCRIPT, cmd, self.stack.info["REDIS_CLUSTER_DIR"], *map(str, args)],
                       timeout).stdout.strip()

    def cluster_cli(self, node, *args):
        port = self.cluster("port", node)
        return kit.run(["redis-cli", "-h", "127.0.0.1", "-p", port, *map(str, args)], 30).stdout

    def cluster_replication(self, node):
        """Node's INFO replication, as a dict."""
        return dict(line.strip().split(":", 1) for line in
                    self.cluster_cli(node, "INFO", "replication").splitlines() if ":" in line)

    def cluster_replica_of(self, master):
        """The node that replicates node 'master', once its link is up (a
        replica that never synced since it started is too old to be
        promoted: cluster-replica-validity-factor)."""
        port = self.cluster("port", master)

        def replica():
            for n in range(1, 7):
                info = self.cluster_replication(n)
                if info.get("role") == "slave" and info.get("master_port") == port \
                        and info.get("master_link_status") == "up":
                    return n
            return None
        try:
            return kit.wait_for(replica, 60, f"a replica of cluster node {master} in sync",
                                poll=0.2, errors=(kit.KitError,))
        except kit.KitError as e:
            raise LadderError(str(e)) from None

    def cluster_drained(self):
        """True once every instance's /stats says Redis-first has nothing
        unsettled (each voucher's own stream, on its master)."""
        for url in self.stack.info["INSTANCE_URLS"].split():
            rf = kit.call(url, "GET", "/stats", want=200, timeout=30).body.get("redisFirst") or {}
            if rf.get("backlog") != 0 or rf.get("pending") != 0:
                return False
        return True

    def cluster_burst_then_kill(self, step, step_dir):
        """The burst with the voucher's master cut off from its replica
        (SIGSTOP, and the master's link to it ended: a stopped replica's
        kernel would still buffer what the master sends and apply it on
        SIGCONT), the master SIGKILLed, the replica resumed and promoted,
        the killed node started again (a replica now), the consumers on."""
        load = step["load"]
        users = range(self.user_base + 900_000, self.user_base + 900_000 + load["requests"])
        key = f"seckill:v:{{{int(self.voucher)}}}"
        slot = int(self.cluster_cli(1, "CLUSTER", "KEYSLOT", key).strip())
        master = int(self.cluster("master-of", slot))
        replica = self.cluster_replica_of(master)
        statuses = {}
        self.cluster("pause", replica)
        try:
            self.cluster_cli(master, "CLIENT", "KILL", "TYPE", "replica")
            t0 = time.monotonic()
            acked, times, errors = buy_all(self.base_url, f"/voucher/{self.voucher}/seckill",
                                           users, load["concurrency"], statuses)
            seconds = time.monotonic() - t0
            self.cluster("kill", master)
            t_kill = time.monotonic()
        finally:
            self.cluster("resume", replica)
        kit.wait_for(lambda: int(self.cluster("master-of", slot)) != master, PROMOTE_TIMEOUT_S,
                     f"the replica of cluster node {master} promoted", poll=0.2,
                     errors=(kit.KitError, ValueError))
        promoted_s = time.monotonic() - t_kill
        new = int(self.cluster("master-of", slot))
        self.cluster("start-node", master)      # back as the new master's replica
        self.cluster_replica_of(new)
        self.stack.configure(step["instances"], {**self.step_env(step), "CONSUMERS": 1})
        kit.wait_for(self.cluster_drained, DRAIN_TIMEOUT_S, "the voucher's stream to drain",
                     poll=0.2, errors=(kit.KitError,))
        self.crash_facts = self.lost_orders(acked, step_dir)
        log(f"cluster failover: {len(acked)} x 200, {statuses.get(503, 0)} x 503; node {master} "
            f"killed, node {new} promoted {promoted_s:.1f} s later; "
            f"{self.crash_facts['lost']} acknowledged order(s) lost")
        self.extra = {"clusterFailover": {
            "acked": len(acked), "unavailable": statuses.get(503, 0),
            "clientStatuses": {str(k): v for k, v in sorted(statuses.items())},
            "lost": self.crash_facts["lost"], "slot": slot, "killedNode": master,
            "replica": replica, "promotedNode": new, "killToPromotedS": round(promoted_s, 2)},
            "measured": f"{len(acked)} x 200, {statuses.get(503, 0)} x 503, "
                        f"{self.crash_facts['lost']} acked lost; promoted {promoted_s:.1f} s "
                        "after the kill"}
        with open(os.path.join(step_dir, "cluster.json"), "w") as f:
            json.dump(self.extra["clusterFailover"], f, indent=1)
        return load["requests"], seconds, errors, times
