"""What make bench reads after a load: the orders in Postgres, nginx's access
log (statuses, the sold-out edge's answers, requests in flight), the
instances' own counters (/stats, /metrics)."""

import os
import time

import kit


class Observe:
    """The readings (a mixin of Bench)."""

    def order_span(self, voucher):
        """(orders of voucher, seconds from the first to the last) in Postgres."""
        rows = self.psql(f"""SELECT count(*), coalesce(extract(epoch FROM max(create_time) - min(create_time)), 0)
                               FROM tb_voucher_order WHERE voucher_id = {int(voucher)};""")
        n, span = int(rows[0][0]), float(rows[0][1])
        return n, span

    def instances_sold_out(self):
        """The instances' own count of sold_out answers (GET /stats on each,
        directly: not through nginx)."""
        n = 0
        for url in self.stack.instance_urls:
            r = kit.call(url, "GET", "/stats", timeout=10)
            n += int(((r.body or {}).get("requests") or {}).get("byError", {}).get("sold_out", 0))
        return n

    def edge_answered(self):
        """The answers nginx's sold-out edge has given so far (GET
        /stats/edge: counted, not logged). Its workers add theirs to the
        count every 0.2 s: read 0.3 s after the last request."""
        return kit.edge_answered(self.stack.base_url)

    def edge_hits(self, offset, voucher, edge0):
        """Requests for voucher after offset that nginx's sold-out edge
        answered (its count since edge0, edge_answered() then), and all of
        them (those plus the access log's lines: the edge's answers are not
        logged)."""
        if offset is None:
            return None, None
        self.settle()
        hits = self.edge_answered() - edge0
        _, entries = kit.access_log(self.stack.info["NGINX_ACCESS_LOG"], offset,
                                    f"/voucher/{voucher}/seckill")
        return hits, hits + len(entries)

    def log_offset(self):
        """The size of nginx's access log now (None when unreadable)."""
        try:
            return os.path.getsize(self.stack.info["NGINX_ACCESS_LOG"])
        except (OSError, KeyError):
            return None

    def settle(self):
        """After a load: until nginx's access log stops growing (the requests
        still in flight when the tool stopped end, as 499 or late answers;
        nginx writes its buffered lines at least once a second)."""
        last, stable, t0 = self.log_offset(), 0, time.monotonic()
        while stable < 15 and time.monotonic() - t0 < 8:
            time.sleep(0.1)
            cur = self.log_offset()
            stable = stable + 1 if cur == last else 0
            last = cur

    def logged(self, offset, voucher, edge0=None):
        """Statuses nginx logged for POST /voucher/V/seckill after offset,
        with the sold-out edge's answers since edge0 (edge_answered() then)
        as 409s: nginx counts them instead of logging them."""
        out = {}
        if offset is None:
            return None
        self.settle()
        if edge0 is not None:
            n = self.edge_answered() - edge0
            if n > 0:
                out["409"] = n
        for e in kit.access_log(self.stack.info["NGINX_ACCESS_LOG"], offset,
                                f"/voucher/{voucher}/seckill")[1]:
            if e.method == "POST":
                out[e.status] = out.get(e.status, 0) + 1
        return out

    def unknown(self, w, logged, conns):
        """Requests whose outcome the client never learnt: answers other than
        200/409, and the requests in flight when wrk stopped (nginx logs them
        499, or answered after wrk stopped reading). Each may have bought."""
        other = sum(v for k, v in w["statuses"].items() if k not in ("200", "409"))
        errors = w["socketErrors"]["read"] + w["socketErrors"]["timeout"]
        if logged is None:
            return other + errors + conns
        return other + errors + max(0, sum(logged.values()) - sum(w["statuses"].values()))

    def batch_counts(self):
        """(group commits, buyers in them) the instances settled so far, from
        their /metrics. Its counters come from a snapshot at most
        STATS_INTERVAL_MS (1 s) old: read a second after the last activity."""
        time.sleep(1.1)
        n = [0, 0]
        for url in self.stack.instance_urls:
            for line in str(kit.call(url, "GET", "/metrics", want=200, timeout=10).body).splitlines():
                k, _, v = line.partition(" ")
                if k in ("seckill_batches_total", "seckill_batch_buyers_total"):
                    n[k == "seckill_batch_buyers_total"] += int(float(v))
        return n
