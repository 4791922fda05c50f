"""One run of the ladder: the stack configured for each step, the step's
load or fault, its figures read in Postgres, nginx's access log and the
instances' /stats, and its checks."""

import json
import os
import random
import shutil
import subprocess
import time

import check_invariants
import kit

from .checks import check_step
from .cluster_steps import ClusterSteps
from .failover import Failover
from .faults import Faults
from .loads import Loads
from .pg_steps import PgSteps
from .record import outcome, strategies, sum_lock
from .redis_steps import RedisSteps
from .stack import LadderError, Stack, log
from .steps import NODES, STORM_BUCKET, UNIQUE

ROOT = kit.ROOT


class Ladder(RedisSteps, ClusterSteps, PgSteps, Loads, Faults, Failover):
    """The ladder's state across its steps: the stack, the Redis nodes, the
    vouchers, the users."""

    def __init__(self, args):
        """args: parse_args()'s, with the steps selected (args.selected)."""
        self.args = args
        self.out = args.out
        services = sorted({s["service"] for s in args.selected if s.get("service") == "zk"})
        self.stack = Stack(args.run_dir, " ".join(services))
        self.nodes_dir = os.path.join(args.run_dir + "-nodes")
        self.node_urls = None
        self.extra = {}
        self.voucher = None
        self.lost_voucher = None     # the failover steps' scenario
        self.spawned = []            # Redis nodes the failover steps started again
        self.constraint_dropped = False
        self.user_base = 8_000_000_000 + random.randrange(1_000_000) * 1000

    def nodes(self, what, *args):
        """scripts/redis-nodes.sh WHAT <the ladder's nodes dir> ARGS; its stdout."""
        p = subprocess.run([os.path.join(ROOT, "scripts", "redis-nodes.sh"), what,
                            self.nodes_dir, *map(str, args)],
                           capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise LadderError(f"redis-nodes.sh {what} {args}: {p.stderr.strip()[-500:]}")
        return p.stdout.strip()

    def node_env(self, env):
        """The step's env with "@nodesN" replaced by the first N nodes' URLs
        (the nodes are started at the first step that needs them)."""
        v = env.get("LOCK_REDIS_NODES", "")
        if not v.startswith("@nodes"):
            return env
        if self.node_urls is None:
            out = self.nodes("start", NODES)
            self.node_urls = out.split("=", 1)[1].split(",")
        return dict(env, LOCK_REDIS_NODES=",".join(self.node_urls[:int(v[len("@nodes"):])]))

    def stop_nodes(self):
        """Stops the Redis nodes of the multilock and redlock steps."""
        if self.node_urls is not None:
            self.nodes("stop")
            self.node_urls = None

    def service(self, what, name):
        """Stops or starts a step's lock service: every node for "nodes"."""
        if name != "nodes":
            self.stack.service(what, name)
        elif what == "stop":
            self.nodes("stop")
        else:
            for i in range(1, NODES + 1):
                self.nodes("start-node", i)

    @property
    def dsn(self):
        return self.stack.dsn

    @property
    def base_url(self):
        return self.stack.base_url

    def setup_db(self):
        """A new database: no unique constraint, one voucher for the ladder."""
        kit.psql(self.dsn, f"ALTER TABLE tb_voucher_order DROP CONSTRAINT IF EXISTS {UNIQUE}")
        self.constraint_dropped = True
        self.voucher = self.stack.create_voucher(100, "demo ladder")
        self.lost_voucher = self.stack.create_voucher(100, "demo ladder: the lost lock")

    def restore_constraint(self):
        """The unique constraint back (duplicate rows deleted first)."""
        if not self.constraint_dropped or not self.stack.info:
            return
        kit.psql(self.dsn,
                 "DELETE FROM tb_voucher_order o USING tb_voucher_order p "
                 "WHERE o.user_id = p.user_id AND o.voucher_id = p.voucher_id AND o.id > p.id;\n"
                 f"ALTER TABLE tb_voucher_order ADD CONSTRAINT {UNIQUE} UNIQUE (user_id, voucher_id);")
        self.constraint_dropped = False
        log(f"unique constraint {UNIQUE} restored (duplicate orders deleted first)")

    def distinct_buyers(self, voucher):
        """The distinct buyers of voucher in Postgres."""
        return int(kit.psql_value(self.dsn, "SELECT count(DISTINCT user_id) FROM tb_voucher_order "
                                            f"WHERE voucher_id = {int(voucher)}"))

    def reset_voucher(self, stock):
        """The ladder's voucher with stock and no orders (the admin API)."""
        self.stack.admin("POST", f"/admin/vouchers/{self.voucher}/reset", {"stock": stock}, want=200)

    def instance_stats(self):
        """/stats of each instance, directly."""
        out = []
        for url in self.stack.instance_urls:
            s = kit.call(url, "GET", "/stats", want=200).body
            if not isinstance(s, dict):
                raise LadderError(f"GET {url}/stats: not a JSON object: {s!r}")
            out.append(s)
        return out

    def access_log_slice(self, offset, step_dir):
        """(statuses, {instance: 200s}, {instance: requests}) of the step's seckill requests."""
        path = self.stack.info.get("NGINX_ACCESS_LOG", "")
        uri = f"/voucher/{self.voucher}/seckill"
        statuses, ok_by, req_by = {}, {}, {}
        names = {}
        for name, url in zip(self.stack.info.get("INSTANCE_IDS", "").split(),
                             self.stack.info.get("INSTANCE_URLS", "").split()):
            names[url.replace("http://", "")] = name
        try:
            data, entries = kit.access_log(path, offset, uri)
        except OSError as e:
            raise LadderError(f"nginx access log {path}: {e}")
        with open(os.path.join(step_dir, "access.log"), "w", encoding="utf-8") as f:
            f.write(data)
        for e in entries:
            st = e.status
            inst = kit.answered_by(e.upstream, names)
            statuses[st] = statuses.get(st, 0) + 1
            req_by[inst] = req_by.get(inst, 0) + 1
            if st == "200":
                ok_by[inst] = ok_by.get(inst, 0) + 1
        return statuses, ok_by, req_by

    def step_timeline(self, step, step_dir):
        """(timeline, what it was measured with) of the step's requests: the
        storms from the ladder's own client (per-request start and time, in
        STORM_BUCKET s buckets), the sales (ab: no sub-second start times) from
        the step's slice of nginx's access log, per second."""
        if step["load"]["kind"] == "storm":
            samples = []
            with open(os.path.join(step_dir, "storm.tsv"), encoding="utf-8") as f:
                next(f, None)
                for line in f:
                    start, status, ms = line.split("\t")
                    samples.append((float(start), int(status), float(ms)))
            return (kit.timeline_from_samples(samples, STORM_BUCKET),
                    f"the ladder's client, by request start, {STORM_BUCKET:g} s buckets")
        try:
            tl = kit.parse_timeline(os.path.join(step_dir, "access.log"), 0,
                                       f"/voucher/{self.voucher}/seckill")
        except OSError:
            tl = []
        return tl, "nginx's access log ($request_time), by answer, per second"

    def step_env(self, step):
        """The instances' settings of a step."""
        env = {"SECKILL_LOCK": step["lock"], "SECKILL_STOCK": step["stock"]}
        env.update(self.node_env(step["env"]))
        if step.get("failover"):
            env["REDIS_HA"] = 1
        return env

    def load_text(self, step):
        """The step's load in a few words (the table's "load")."""
        load = step["load"]
        if load["kind"] == "sale":
            n = load["requests"] if not self.args.quick else load["requests"] // 2
            return f"sale {n}x{load['concurrency']}"
        if load["kind"] == "crash":
            return "holder killed"
        if load["kind"] == "nodes":
            return f"nodes: {load['scenario']}"
        if load["kind"] == "outage":
            return f"buyers {load['connections']}x{load['seconds']:g}s"
        if load["kind"] == "failover":
            return f"sale {self.sale_size()}x{load['concurrency']}, failover"
        if load["kind"] == "pg-failover":
            return f"burst {load['requests']}x{load['concurrency']}, PG primary killed"
        if load["kind"] == "redis-crash":
            return f"burst {load['requests']}x{load['concurrency']}, kill"
        if load["kind"] == "cluster-failover":
            return f"burst {load['requests']}x{load['concurrency']}, slot's master killed"
        return f"storm {load['connections']}x{load['seconds']:g}s"

    def safe_defaults(self):
        """Leaves the stack on the default (safe) strategies (--keep-stack)."""
        log("restarting the instances with the default strategies")
        if self.stack.configure(2, {}):
            pass    # a new database has its constraint

    def run_step(self, step, run_no, results):
        """One step: the stack as it says, its load or fault, its figures and
        checks."""
        step_dir, env, user = self.prepare_step(step, run_no)
        r = {"step": step["num"], "key": step["key"], "title": step["title"], "lock": step["lock"],
             "stock": step["stock"], "instances": step["instances"], "env": env,
             "load": self.load_text(step), "expect": step["expect"], "story": step["story"]}
        if step["load"]["kind"] in ("crash", "nodes"):
            r.update(self.crash(step, step_dir, user) if step["load"]["kind"] == "crash"
                     else self.node_failure(step, step_dir, user))
        else:
            r.update(self.loaded_step(step, step_dir, env, user))
        r["checks"] = [{"ok": c_ok, "text": c_text} for c_ok, c_text in check_step(step, r, results)]
        r["pass"] = all(c["ok"] for c in r["checks"])
        if step["load"]["kind"] in ("crash", "nodes"):
            return r
        if step.get("redis_aof"):
            self.redis_persistence("no")
        if "lost" not in r and "pgFailover" not in r and "clusterFailover" not in r \
                and r["ok"] != r["orders"]:
            log(f"note: step {step['num']}: {r['ok']} answers 200 but {r['orders']} orders in Postgres")
        return r

    def prepare_step(self, step, run_no):
        """The step's directory (made afresh), the stack with its settings,
        its voucher reset. (directory, the instances' settings, its user)."""
        num, key = step["num"], step["key"]
        step_dir = os.path.join(self.out, "steps" if self.args.runs == 1 else f"run-{run_no}",
                                f"{num:02d}-{key}")
        shutil.rmtree(step_dir, ignore_errors=True)
        os.makedirs(step_dir)
        env = self.step_env(step)
        self.crash_facts = {}
        log(f"step {num} ({step['title']}): {step['instances']} instance(s), "
            + " ".join(f"{k}={v}" for k, v in env.items()))
        # Redis's persistence first: an instance that must acknowledge
        # durably refuses to start against a Redis that is not. (A first
        # start gets stack.sh's default for SECKILL_STOCK=redis: always.)
        if step.get("redis_aof") and self.stack.started and not getattr(self.stack, "ha", False):
            self.redis_persistence(step["redis_aof"])
        if self.stack.configure(step["instances"], env):
            self.setup_db()
        if step.get("redis_aof"):
            self.redis_persistence(step["redis_aof"])
        stock = step["load"]["stock"]
        if step.get("failover"):
            stock = self.sale_size() + 10        # every buyer of the price sale buys
        self.reset_voucher(stock)
        if step.get("slow_fsync_ms"):
            # After the reset, so that the voucher's state is on disk and
            # only the burst's orders can be lost.
            self.redis_slow_disk(step["redis_aof"], step["slow_fsync_ms"])
            self.stack.configure(step["instances"], env)   # connected to the new Redis
        return step_dir, env, self.user_base + run_no * 100 + num

    def loaded_step(self, step, step_dir, env, user):
        """A step with a load: its figures (and, for a failover step, the
        lost lock's after the price sale)."""
        log_path = self.stack.info.get("NGINX_ACCESS_LOG", "")
        offset = os.path.getsize(log_path) if os.path.exists(log_path) else 0
        edge0 = kit.edge_answered(self.base_url)
        self.extra = {}
        if step.get("failover"):
            url = f"{self.base_url}/voucher/{self.voucher}/seckill"
            requests, seconds, errors, times = self.sale(
                {"requests": step["load"]["requests"], "concurrency": step["load"]["concurrency"]},
                url, step_dir)
        else:
            requests, seconds, errors, times = self.drive(step, step_dir, user)
        time.sleep(1.3)                          # nginx flushes its buffered log every second
        statuses, ok_by, req_by = self.access_log_slice(offset, step_dir)
        # nginx's sold-out edge counts its answers (all 409 sold_out) instead
        # of logging them.
        edge = kit.edge_answered(self.base_url) - edge0
        if edge > 0:
            statuses["409"] = statuses.get("409", 0) + edge
            req_by[kit.NGINX_EDGE] = req_by.get(kit.NGINX_EDGE, 0) + edge
        timeline, tl_source = self.step_timeline(step, step_dir)
        stats = self.instance_stats()
        sale_facts = check_invariants.voucher_facts(self.dsn, self.voucher)
        lost = None
        if step.get("failover"):
            lost = self.lost_lock(step, env, user, step_dir)
            stats = lost.pop("stats")
        facts_voucher = self.lost_voucher if lost is not None else self.voucher
        facts = check_invariants.voucher_facts(self.dsn, facts_voucher)
        distinct = self.distinct_buyers(facts_voucher)
        with open(os.path.join(step_dir, "stats.json"), "w", encoding="utf-8") as f:
            json.dump(stats, f, indent=1)
        r = outcome(facts, distinct, statuses, requests, times, sum_lock(stats),
                    rps=requests / seconds if seconds > 0 else 0.0, seconds=seconds,
                    transportErrors=errors, okByInstance=ok_by, requestsByInstance=req_by,
                    strategiesSeen=strategies(stats), timeline=timeline, timelineSource=tl_source)
        r["ackedLost"] = self.crash_facts.get("lost", 0)
        r["reconciled"] = self.crash_facts.get("reconciled", True)
        r.update(self.extra)
        if "outage" in r:
            r["measured"] = outage_text(r)
        if lost is not None:
            r["lost"] = lost
            r["sale"] = {"orders": sale_facts["orders"], "oversold": sale_facts["oversold"],
                         "duplicateUsers": sale_facts["duplicateUsers"],
                         "stockDrift": sale_facts["stockDrift"],
                         "ordersPerS": round(sale_facts["orders"] / seconds, 1) if seconds else 0}
        return r


def outage_text(r):
    """An outage step's "measured": the 503s, the slowest answer, when sales
    came back."""
    o = r["outage"]
    back = "never" if o["backAfterS"] is None else f"{o['backAfterS']:.2f} s"
    return (f"{o['unavailable']} x 503, max {o['maxMs'] / 1000:.2f} s, "
            f"200 again {back} after the restart"
            + (f", {r['orders'] - r['ok']} answer(s) cut off" if r["orders"] != r["ok"] else ""))
