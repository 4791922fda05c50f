"""A step's figures as the ladder's JSON, table and reports keep them."""

import kit


def count_statuses(lines):
    """{status: answers} of [(start, status, ms)] (status 0: no answer)."""
    out = {}
    for _a, b, _c in lines:
        out[str(b)] = out.get(str(b), 0) + 1
    return out


def sum_lock(stats):
    """The instances' /stats lock counters, summed."""
    lock = {}
    for s in stats:
        for k, v in (s.get("lock") or {}).items():
            if isinstance(v, (int, float)):
                lock[k] = lock.get(k, 0) + v
    return lock


def strategies(stats):
    """lock/stock strategy of each instance, from its /stats."""
    return [f"{s.get('lockStrategy')}/{s.get('stockStrategy')}" for s in stats]


def outcome(facts, distinct, statuses, requests, times, lock, **load):
    """The step's figures: Postgres's facts of the voucher (distinct: its
    distinct buyers), the answers, the clients' times, the lock counters
    (lock), then load's: rps, seconds, transportErrors, okByInstance,
    requestsByInstance, renewals, strategiesSeen, timeline, timelineSource."""
    ok = statuses.get("200", 0)
    return {
        "initialStock": facts["initialStock"], "stockLeft": facts["stock"],
        "orders": facts["orders"], "oversold": facts["oversold"],
        "duplicateUsers": facts["duplicateUsers"],
        "duplicateOrders": facts["orders"] - distinct,
        "stockDrift": facts["stockDrift"],
        "requests": requests, "ok": ok, "statuses": statuses,
        "successRate": 100.0 * ok / requests if requests else 0.0,
        "rps": load.get("rps", 0.0), "seconds": load["seconds"],
        "p50ms": kit.percentile(times, 50), "p99ms": kit.percentile(times, 99),
        "transportErrors": load.get("transportErrors", statuses.get("0", 0)),
        "status5xx": sum(v for k, v in statuses.items() if k.startswith("5")),
        "okByInstance": load.get("okByInstance", {}),
        "requestsByInstance": load.get("requestsByInstance", {}),
        "notOwnerReleases": int(lock.get("notOwnerReleases", 0)),
        "renewals": load.get("renewals", int(lock.get("renewals", 0))),
        "lockAcquired": int(lock.get("acquired", 0)),
        "staleTokenRejections": int(lock.get("staleTokenRejections", 0)),
        "strategiesSeen": load["strategiesSeen"],
        "timeline": load.get("timeline", []), "timelineSource": load.get("timelineSource", ""),
    }
