"""The Postgres failover steps (pg-async, pg-sync): on a stack with PG_HA=1
(pg_auto_failover: a monitor, three data nodes), a burst of buyers while no
standby receives the primary's WAL, the primary killed, a standby promoted,
then which acknowledged orders the new primary lacks."""

import json
import os
import signal
import time

import kit

from .redis_steps import buy_all
from .stack import LadderError, log

NODES = 3                    # data nodes of scripts/lib/pg-ha.sh
PROMOTE_TIMEOUT_S = 90       # kill -> a standby promoted (about 10 s on an idle machine)
SETTLE_TIMEOUT_S = 240       # a killed node back as a standby (pg_rewind or a new clone)


class PgSteps:
    """The Postgres failover steps (a mixin of Ladder)."""

    def pg_monitor(self, sql):
        """Rows of sql on the pg_auto_failover monitor."""
        return kit.psql(f"host=127.0.0.1 port={self.stack.info['PG_MONITOR_PORT']} "
                        "user=postgres dbname=pg_auto_failover", sql, timeout=15)

    def pg_node_dsn(self, n):
        port = self.stack.info["PG_NODE_PORTS"].split()[n - 1]
        return f"host=127.0.0.1 port={port} user=postgres dbname=seckill"

    def pg_states(self):
        """{node number: (reported state, goal state)} as the monitor has them."""
        out = {}
        for name, rep, goal in self.pg_monitor("SELECT nodename, reportedstate, goalstate "
                                               "FROM pgautofailover.node ORDER BY nodeid"):
            out[int(name[len("node"):])] = (rep, goal)
        return out

    def pg_primary(self, other_than=None):
        """The node the monitor has settled as primary (not other_than), or None."""
        for n, (rep, goal) in self.pg_states().items():
            if rep == goal and rep in ("primary", "wait_primary") and n != other_than:
                return n
        return None

    def pg_settled(self):
        s = self.pg_states()
        return sorted(r for r, g in s.values() if r == g) == ["primary", "secondary", "secondary"]

    def pg_wait(self, cond, timeout, what):
        try:
            return kit.wait_for(cond, timeout, what, poll=0.2, errors=(kit.KitError, ValueError))
        except kit.KitError:
            raise LadderError(f"timed out after {timeout} s waiting for {what}: "
                              f"{self.pg_states()}") from None

    def pg_role(self, commit):
        """The role's synchronous_commit: "on" is the server's default (RESET)."""
        kit.psql(self.dsn, "ALTER ROLE postgres RESET synchronous_commit" if commit == "on" else
                 f"ALTER ROLE postgres SET synchronous_commit = {commit}")

    def walreceiver(self, n):
        """The walreceiver process of data node n, as the node itself names
        it (pg_stat_wal_receiver); None while it has none streaming."""
        v = kit.psql_value(self.pg_node_dsn(n), "SELECT pid FROM pg_stat_wal_receiver"
                                                " WHERE status = 'streaming'")
        return int(v) if v else None

    def replication(self, primary):
        """The primary's view of its standbys: (application_name, pid, state,
        sync_state, flush_lsn, reply_time) each, and its current WAL position."""
        dsn = self.pg_node_dsn(primary)
        rows = kit.psql(dsn, "SELECT application_name, pid, state, sync_state, flush_lsn, "
                             "reply_time FROM pg_stat_replication ORDER BY 1")
        return {"standbys": rows, "walLsn": kit.psql_value(dsn, "SELECT pg_current_wal_lsn()"),
                "names": kit.psql_value(dsn, "SHOW synchronous_standby_names")}

    def pg_both_stream(self, primary):
        """Does the primary list a synchronous standby and have both standbys
        streaming as candidates for it?"""
        dsn = self.pg_node_dsn(primary)
        names = kit.psql_value(dsn, "SHOW synchronous_standby_names")
        rows = kit.psql(dsn, "SELECT state, sync_state FROM pg_stat_replication")
        return names.startswith("ANY 1 (") and len(rows) == NODES - 1 and \
            all(r == ["streaming", "quorum"] for r in rows)

    def walreceivers(self, nodes):
        """The walreceivers of nodes, or None while one has none."""
        pids = [self.walreceiver(n) for n in nodes]
        return pids if all(pids) else None

    def pg_burst_then_kill(self, step, step_dir):
        """The step's burst with both standbys receiving nothing, the
        primary's process tree SIGKILLed, a standby promoted; the killed node
        back as a standby. Sets crash_facts and extra."""
        load = step["load"]
        try:
            self.pg_role(step["synchronous_commit"])
            # New sessions take the role's setting: the instances again.
            self.stack.configure(step["instances"], self.step_env(step))
            self.pg_wait(self.pg_settled, SETTLE_TIMEOUT_S, "one primary and two secondaries")
            primary = self.pg_primary()
            standbys = [n for n in range(1, NODES + 1) if n != primary]
            # Settled is not enough: a node that has just rejoined may not
            # stream yet, or the primary not list it yet.
            self.pg_wait(lambda: self.pg_both_stream(primary), 60,
                         "both standbys streaming, the primary's synchronous_standby_names set")
            receivers = self.pg_wait(lambda: self.walreceivers(standbys), 30,
                                     "both standbys' walreceivers")
            users = range(self.user_base + 700_000, self.user_base + 700_000 + load["requests"])
            statuses = {}
            # The standbys' pg_autoctl processes and the monitor frozen too,
            # until the kill, so that nothing restarts or reconfigures a
            # standby meanwhile. Their postmasters run on.
            frozen = receivers + kit.proc_tree(self.stack.pid("pg-monitor"))
            for n in standbys:
                frozen += [p for p in kit.proc_tree(self.stack.pid(f"pg-node-{n}"))
                           if (kit.cmdline(p) or "").startswith("pg_autoctl")]
            kit.signal_all(frozen, signal.SIGSTOP)
            try:
                self.pg_wait(lambda: all((kit.proc_status(p) or {}).get("State") == "T"
                                         for p in receivers), 10, "the walreceivers stopped")
                if step["cut_walsenders"]:
                    # A frozen walreceiver's kernel would still buffer what
                    # the walsender sends and hand it over on SIGCONT: the
                    # primary's walsenders end too (a frozen receiver cannot
                    # reconnect).
                    kit.psql(self.pg_node_dsn(primary), "SELECT pg_terminate_backend(pid) "
                                                        "FROM pg_stat_replication")
                before = self.replication(primary)
                probe = kit.commit_waits(self.pg_node_dsn(primary)) if not step["cut_walsenders"] else None
                log(f"pg failover: before the burst, a probe commit {'waited' if probe else 'did not wait' if probe is False else 'was not tried'}; "
                    f"standbys {before['standbys']}, names {before['names']!r}")
                t0 = time.monotonic()
                acked, times, errors = buy_all(self.base_url, f"/voucher/{self.voucher}/seckill",
                                               users, load["concurrency"], statuses)
                seconds = time.monotonic() - t0
                after = self.replication(primary)
                with open(os.path.join(step_dir, "replication.json"), "w") as f:
                    json.dump({"primary": primary, "walreceivers": dict(zip(standbys, receivers)),
                               "frozen": {p: kit.cmdline(p) for p in frozen},
                               "before": before, "after": after, "probeWaited": probe},
                              f, indent=1, default=str)
                tree = kit.proc_tree(self.stack.pid(f"pg-node-{primary}"))
                kit.signal_all(tree, signal.SIGSTOP)     # nothing restarts what is killed next
                kit.signal_all(tree, signal.SIGKILL)
                t_kill = time.monotonic()
            finally:
                kit.signal_all(frozen, signal.SIGCONT)
            new = self.pg_wait(lambda: self.pg_primary(other_than=primary), PROMOTE_TIMEOUT_S,
                               f"a standby promoted in place of node {primary}")
            promoted_s = time.monotonic() - t_kill
            rows = {int(r[0]) for r in kit.psql(self.pg_node_dsn(new), "SELECT id FROM "
                                                f"tb_voucher_order WHERE voucher_id = {int(self.voucher)}")}
            missing = [i for i in acked if i not in rows]
            with open(os.path.join(step_dir, "lost.txt"), "w") as f:
                f.write("".join(f"{i}\n" for i in missing))
            log(f"pg failover: {len(acked)} x 200, {statuses.get(503, 0)} x 503; node {primary} "
                f"killed, node {new} promoted {promoted_s:.1f} s later; {len(missing)} acknowledged "
                f"order(s) missing there")
            # The stack as it was: the killed node back (a standby), the role's default.
            self.stack.service("start", f"pg-node-{primary}", timeout=SETTLE_TIMEOUT_S)
            self.pg_wait(self.pg_settled, SETTLE_TIMEOUT_S, f"node {primary} back as a standby")
        finally:
            self.pg_role("on")
        self.crash_facts = {"lost": len(missing)}
        self.extra = {"pgFailover": {
            "acked": len(acked), "unavailable": statuses.get(503, 0),
            "clientStatuses": {str(k): v for k, v in sorted(statuses.items())},
            "missing": len(missing), "missingIds": missing[:10], "ordersOnNewPrimary": len(rows), "killedNode": primary,
            "promotedNode": new, "killToPromotedS": round(promoted_s, 2),
            "synchronousCommit": step["synchronous_commit"]},
            "measured": f"{len(acked)} x 200, {statuses.get(503, 0)} x 503, {len(missing)} acked "
                        f"missing; promoted {promoted_s:.1f} s after the kill"}
        return load["requests"], seconds, errors, times
