"""The lock-service failures: a holder killed while it holds the user's lock
(the crash steps), and the independent Redis nodes' failures (RedLock with a
node restarted empty or late, MultiLock with a node down)."""

import json
import os
import signal
import threading
import time

import check_invariants
import kit

from .loads import write_tsv
from .record import count_statuses, outcome, strategies, sum_lock
from .stack import LadderError


def write_probes(path, head, lines):
    """The probes [(seconds, status, ms)] as a tab-separated file."""
    write_tsv(path, [head], lines, lambda x: f"{x[0]:.3f}\t{x[1]}\t{x[2]:.1f}")


def write_stats(step_dir, stats):
    with open(os.path.join(step_dir, "stats.json"), "w", encoding="utf-8") as f:
        json.dump(stats, f, indent=1)


class Faults:
    """The crash and node steps (a mixin of Ladder)."""

    def probe(self, url, user, lines, t0):
        """One purchase of user on url; appended to lines as (seconds after
        t0 (t0 None: -0.0, before the moment counted from), status (0: no
        answer), ms). Its status."""
        t = time.monotonic()
        st = kit.status_of(url, "POST", f"/voucher/{self.voucher}/seckill", {"X-User-Id": str(user)})
        lines.append((-0.0 if t0 is None else t - t0, st, (time.monotonic() - t) * 1000.0))
        return st

    def crash(self, step, step_dir, user):
        """Instance 1 takes the user's lock and stalls (DEMO_PAUSE_MS); it is
        killed with SIGKILL while it holds it. Instance 2 asks for the same
        user every 25 ms: 409 while the lock is held; the request that takes
        it stalls too, then answers 200. Returns the step's figures."""
        urls = self.stack.instance_urls
        first, lines = {}, []
        th = threading.Thread(target=lambda: first.update(r=self.holder_answer(urls[0], user)),
                              daemon=True)
        th.start()
        time.sleep(0.5)
        probe = self.probe(urls[1], user, lines, None)
        pid = self.stack.pid("app-1")
        if pid is None:
            raise LadderError("no pid of instance 1")
        os.kill(pid, signal.SIGKILL)
        free_after, winner = self.until_free(urls[1], user, lines)
        th.join(5)
        write_probes(os.path.join(step_dir, "crash.tsv"), "since_kill_s\tstatus\tms", lines)
        stats = kit.call(urls[1], "GET", "/stats", want=200).body
        write_stats(step_dir, [stats])
        statuses = count_statuses(lines)
        ok = statuses.get("200", 0)
        r = outcome(check_invariants.voucher_facts(self.dsn, self.voucher),
                    self.distinct_buyers(self.voucher), statuses, len(lines), [x[2] for x in lines],
                    stats.get("lock", {}), seconds=(lines[-1][0] if lines else 0.0),
                    okByInstance={"seckill-2": ok}, requestsByInstance={"seckill-2": len(lines)},
                    strategiesSeen=strategies([stats]))
        r["crash"] = {"heldBeforeKill": probe == 409, "freeAfterS": free_after, "winner": winner,
                      "holderAnswer": first.get("r")}
        r["measured"] = "never free" if free_after is None else f"free after {free_after:.2f} s"
        return r

    def holder_answer(self, url, user):
        """The killed holder's request: its status, or the error's name."""
        try:
            return kit.request(url, "POST", f"/voucher/{self.voucher}/seckill",
                               {"X-User-Id": str(user)}, None, 30).status
        except Exception as e:          # noqa: BLE001 -- the answer is the error
            return type(e).__name__

    def until_free(self, url, user, lines):
        """Asks for user on url every 25 ms, for 20 s at most, until the
        answer is not 409: (seconds after now, that answer), or (None, None)."""
        t_kill = time.monotonic()
        while time.monotonic() < t_kill + 20:
            st = self.probe(url, user, lines, t_kill)
            if st != 409:
                return lines[-1][0], st
            time.sleep(0.025)
        return None, None

    def node_failure(self, step, step_dir, user):
        """The RedLock and MultiLock failures, with signals to the nodes
        (A..E = nodes 1..5). restart/delayed: instance 1 asks for the user's
        lock while D and E are paused (it gets A, B, C) and holds it 4 s inside
        its transaction (DEMO_DELAY_MS); meanwhile D and E resume, C is killed and started
        empty at once (restart) or only after the lease (delayed), A and B are
        paused, and instance 2 asks for the same user. down: node 3 of
        multilock's three killed, distinct buyers through nginx, then the node
        back. Returns the step's figures."""
        scen = step["load"]["scenario"]
        lines = []
        t0 = time.monotonic()
        if scen == "down":
            lines, extra = self.node_down(user, t0)
        else:
            extra = self.two_holders(step, scen, user, lines, t0)
        time.sleep(0.3)
        write_probes(os.path.join(step_dir, "nodes.tsv"), "start_s\tstatus\tms", sorted(lines))
        facts = check_invariants.voucher_facts(self.dsn, self.voucher)
        stats = self.instance_stats()
        write_stats(step_dir, stats)
        statuses = count_statuses(lines)
        r = outcome(facts, self.distinct_buyers(self.voucher), statuses, len(lines),
                    [x[2] for x in lines], sum_lock(stats), seconds=round(time.monotonic() - t0, 2),
                    renewals=0, strategiesSeen=strategies(stats))
        r["nodes"] = extra
        if scen != "down":
            r["measured"] = (f"instance 1 {extra['firstAnswer']}, instance 2 "
                             f"{extra['secondAnswer']}: {facts['orders']} order(s) of the user")
        else:
            r["measured"] = (f"{statuses.get('503', 0)} x 503 of {len(lines)}, "
                             f"{extra['ordersWhileDown']} orders while down, "
                             f"{extra['afterOk']} of 3 sold with the node back")
        return r

    def node_down(self, user, t0):
        """MultiLock's node 3 killed: 40 distinct buyers through nginx, then
        the node back and 3 more. (the 40 probes, the figures)."""
        lines = []
        self.nodes("kill", 3)
        try:
            for i in range(40):
                self.probe(self.base_url, user * 100 + i, lines, t0)
            down_orders = check_invariants.voucher_facts(self.dsn, self.voucher)["orders"]
        finally:
            self.nodes("start-node", 3)
        time.sleep(0.4)                     # the instances retry a failed node after 250 ms
        after = [self.probe(self.base_url, user * 100 + 50 + i, lines, t0) for i in range(3)]
        return lines[:40], {"afterOk": after.count(200), "ordersWhileDown": down_orders}

    def two_holders(self, step, scen, user, lines, t0):
        """RedLock: instance 1 granted by A, B, C; C killed (and started empty
        at once: restart), A and B paused while instance 2 asks. The
        answers of both."""
        urls, first = self.stack.instance_urls, {}
        self.nodes("pause", 4)
        self.nodes("pause", 5)
        th = threading.Thread(target=lambda: first.update(r=self.probe(urls[0], user, lines, t0)),
                              daemon=True)
        th.start()
        time.sleep(0.4)                     # granted by A, B, C; D and E past the deadline
        self.nodes("resume", 4)
        self.nodes("resume", 5)
        self.nodes("kill", 3)
        if scen == "restart":
            self.nodes("start-node", 3)
        self.nodes("pause", 1)
        self.nodes("pause", 2)
        time.sleep(0.3)
        try:
            second = self.probe(urls[1], user, lines, t0)
        finally:
            self.nodes("resume", 1)
            self.nodes("resume", 2)
        th.join(30)
        if scen == "delayed":
            # C rejoins after the longest lease (and its drift) since the kill
            lease = step["env"]["LOCK_LEASE_MS"]
            time.sleep(max(0.0, (lease + lease / 100 + 2) / 1000 - (time.monotonic() - t0)))
            self.nodes("start-node", 3)
        return {"firstAnswer": first.get("r"), "secondAnswer": second}
