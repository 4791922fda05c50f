"""The failover steps (12-15): the lock a Redis failover loses, with and
without fencing and WAIT (see the package's doc)."""

import http.client
import json
import os
import signal
import threading
import time

import kit

from .stack import LadderError, log
from .steps import FAILOVER

# What a wait may meet while Redis, Sentinel or an instance is in transition.
TRANSIENT = (kit.KitError, KeyError, TypeError, ValueError)


class Failover:
    """The lost-lock scenario (a mixin of Ladder)."""

    def sale_size(self):
        n = FAILOVER["requests"]
        return n // 2 if self.args.quick else n

    def wait_for(self, cond, timeout, what):
        try:
            kit.wait_for(cond, timeout, what, poll=0.02, errors=TRANSIENT)
        except kit.KitError:
            raise LadderError(f"timed out waiting for {what}") from None

    def lost_lock(self, step, env, user, step_dir):
        """The lost-lock scenario (the package's doc). Returns what happened;
        the instances' /stats under "stats"."""
        load, key = step["load"], f"lock:order:{user}"
        replicas, master, n = self.prepare_lost_lock(step, env, user)
        before = self.instance_stats()
        answers = {}
        ta = threading.Thread(target=self.buy_as, args=(answers, "a", self.stack.app_ports[0], user),
                              daemon=True)
        t_a, t_lock = self.grant_then_kill(step, ta, replicas, master, n, key)
        promoted_s, new = self.stack.wait_failover(master)
        t_b, lock_on_new = self.second_holder(answers, ta, new, key, user)
        # The killed master comes back as a replica of the new one.
        self.spawned.append(self.stack.restart_redis_node(n, new))
        self.stack.wait_sentinels_see(self.stack.redis_ports[n - 1])
        after = self.instance_stats()

        def delta(field):
            return int(after[0]["lock"].get(field, 0) - before[0]["lock"].get(field, 0))

        out = {"a": answers["a"][0], "aMessage": answers["a"][1],
               "b": answers["b"][0], "bMessage": answers["b"][1],
               "aAnsweredAfterS": round(answers["a"][2] - t_a, 2),
               "bAnsweredAfterS": round(answers["b"][2] - t_b, 2),
               "killToPromotedS": round(promoted_s, 2),
               "bSentAfterLockS": round(t_b - t_lock, 2),
               "bSentBeforeAResumed": step["key"] == "lost-wait-paused" or
               t_b - t_lock < load["pause_ms"] / 1000 - 0.5,
               "lockOnNewMaster": lock_on_new, "killedNode": n,
               "staleTokenRejections": delta("staleTokenRejections"),
               "unsynced": delta("unsynced"), "stats": after}
        log(f"lost lock: A {out['a']} ({out['aMessage'] or '-'}), B {out['b']} "
            f"({out['bMessage'] or '-'}); Sentinel promoted a replica {promoted_s:.2f} s after "
            f"the kill; lock on the new master: {lock_on_new}")
        with open(os.path.join(step_dir, "lost-lock.json"), "w", encoding="utf-8") as f:
            json.dump({k: v for k, v in out.items() if k != "stats"}, f, indent=1)
        return out

    def prepare_lost_lock(self, step, env, user):
        """A buyer with history (before the demo knobs slow the instances:
        his token counter is on every node), the instances with A's stall and
        B's delay, the scenario's voucher reset. (the replicas [(node,
        port)], the master's port, its node number)."""
        st, load = self.stack, step["load"]
        token_key = f"redisson_lock_token:{{lock:order:{user}}}"
        kit.call(self.base_url, "POST", f"/voucher/{self.voucher}/seckill",
                 headers={"X-User-Id": str(user)}, want=200)
        # No request deadline on instance 1: A's stall stands for a pause that
        # comes after the last deadline check (a GC pause between the check
        # and the write), which a deadline cannot catch.
        demo = dict(env, INSTANCE_ENV_1=f"DEMO_PAUSE_MS={load['pause_ms']} REQUEST_DEADLINE_MS=0",
                    INSTANCE_ENV_2=f"DEMO_DELAY_MS={load['delay_ms']}")
        st.configure(step["instances"], demo)
        st.admin("POST", f"/admin/vouchers/{self.lost_voucher}/reset", {"stock": load["stock"]},
                 want=200)
        n, master = st.redis_master()
        replicas = [(i + 1, p) for i, p in enumerate(st.redis_ports) if p != master]
        self.wait_for(lambda: all(kit.redis_cli(p, "EXISTS", token_key) == "1"
                                  for _, p in replicas), 10, "the token counter on the replicas")
        return replicas, master, n

    def buy_as(self, answers, label, port, user):
        """The user's purchase on an instance: answers[label] = (status,
        message, when answered)."""
        try:
            r = kit.request(port, "POST", f"/voucher/{self.lost_voucher}/seckill",
                            {"X-User-Id": str(user)}, timeout=60)
            answers[label] = (str(r.status), r.body.get("message", "")
                              if isinstance(r.body, dict) else "", time.monotonic())
        except (OSError, http.client.HTTPException) as e:
            answers[label] = ("error", f"{type(e).__name__}: {e}", time.monotonic())

    def grant_then_kill(self, step, ta, replicas, master, n, key):
        """A's request (thread ta) takes the lock on the master, which is then
        SIGKILLed; with the replicas paused meanwhile (and their links cut).
        (when A was sent, when its lock was seen)."""
        st = self.stack
        paused = step["replicas"] == "paused"
        rep_pids = [st.pid(f"redis-{i}") for i, _ in replicas]
        try:
            if paused:
                # Paused replicas would still receive the grant (the kernel
                # buffers it) and apply it on SIGCONT, before any promotion:
                # their links are cut too, and they cannot reconnect while
                # paused. The grant stays in the master's backlog only.
                for pid in rep_pids:
                    os.kill(pid, signal.SIGSTOP)
                kit.redis_cli(master, "CLIENT", "KILL", "TYPE", "replica")
            t_a = time.monotonic()
            ta.start()
            if step["key"] == "lost-wait-paused":
                ta.join(10)                      # the grant waits for WAIT, then is undone
            else:
                self.wait_for(lambda: kit.redis_cli(master, "EXISTS", key) == "1", 5,
                              "A's lock on the master")
            t_lock = time.monotonic()
            os.kill(st.pid(f"redis-{n}"), signal.SIGKILL)
        finally:
            if paused:
                for pid in rep_pids:
                    os.kill(pid, signal.SIGCONT)
        return t_a, t_lock

    def second_holder(self, answers, ta, new, key, user):
        """Once both instances use the new master: B's request on instance 2,
        then both answers. (when B was sent, the lock on the new master: 0 or 1)."""
        a1, a2 = self.stack.app_ports
        self.wait_for(lambda: all(kit.call(p, "GET", "/stats", want=200).body["redis"]["master"]
                                  == f"127.0.0.1:{new}" for p in (a1, a2)), 15,
                      "the instances on the new master")
        lock_on_new = int(kit.redis_cli(new, "EXISTS", key))
        t_b = time.monotonic()
        tb = threading.Thread(target=self.buy_as, args=(answers, "b", a2, user), daemon=True)
        tb.start()
        for t in (ta, tb):
            t.join(60)
        if ta.is_alive() or tb.is_alive():
            raise LadderError("A or B not answered within 60 s")
        return t_b, lock_on_new
