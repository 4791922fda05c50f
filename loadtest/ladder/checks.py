"""Each step's expected outcome as checks [(ok, text)] on its figures: the
broken steps must show their failure, the fixed ones none."""

from .steps import FAILOVER, STALE_MESSAGE


def one_order(r):
    return (r["orders"] == 1 and r["duplicateUsers"] == 0,
            f"orders {r['orders']} = 1, duplicate users {r['duplicateUsers']} = 0")


def duplicates(r):
    return (r["duplicateUsers"] >= 1,
            f"duplicate users {r['duplicateUsers']} >= 1 ({r['orders']} orders)")


def check_naive(step, r, results):
    return [(r["oversold"] > 0, f"oversold {r['oversold']} > 0")]


def check_stock(step, r, results):
    """cas, optimistic, pessimistic, batched: no oversell, no drift; the stock
    sold exactly (cas: fewer than optimistic)."""
    out = [(r["oversold"] == 0, f"oversold {r['oversold']} = 0"),
           (r["stockDrift"] == 0, f"stock drift {r['stockDrift']} = 0")]
    if step["key"] == "cas":
        opt = results.get("optimistic")
        if opt is not None:
            out.append((r["orders"] < opt["orders"],
                        f"cas sold {r['orders']} < optimistic {opt['orders']}"))
    else:
        stock = r["initialStock"]
        out.append((r["orders"] == stock, f"orders {r['orders']} = stock {stock}"))
    return out


def check_none(step, r, results):
    return [(r["duplicateUsers"] >= 1 and r["orders"] > 1,
             f"duplicate users {r['duplicateUsers']} >= 1 ({r['orders']} orders)")]


def check_local_2(step, r, results):
    ok_from = sorted(i for i, n in r["okByInstance"].items() if n > 0)
    return [duplicates(r),
            (len(ok_from) >= 2,
             f"200s came from {len(ok_from)} instances ({', '.join(ok_from) or '-'})")]


def check_setnx(step, r, results):
    return [(r["notOwnerReleases"] >= 1,
             f"deletes of a lock no longer ours {r['notOwnerReleases']} >= 1"), duplicates(r)]


def check_owner(step, r, results):
    return [(r["notOwnerReleases"] >= 1, f"releases refused {r['notOwnerReleases']} >= 1"),
            one_order(r)]


def check_redis_first(step, r, results):
    """redis-lost: acknowledged orders lost, each listed; redis-durable: none."""
    out = [(r["stockDrift"] == 0 and r["oversold"] == 0 and r["duplicateUsers"] == 0,
            f"Postgres: drift {r['stockDrift']}, oversold {r['oversold']}, "
            f"duplicate users {r['duplicateUsers']} = 0")]
    if step["key"] == "redis-lost":
        out.append((0 < r["ackedLost"] <= r["ok"],
                    f"acknowledged orders lost {r['ackedLost']} > 0 "
                    f"(of {r['ok']}), each listed in lost.txt"))
    else:
        out.append((r["ackedLost"] == 0, f"acknowledged orders lost {r['ackedLost']} = 0 "
                                    f"(of {r['ok']})"))
    # Lost or not, what Redis still has and Postgres agree once drained.
    out.append((r["reconciled"], "Redis and Postgres agree after the drain"))
    return out


def check_pg_failover(step, r, results):
    """pg-async: acknowledged orders missing on the promoted standby; pg-sync:
    no 200 while no standby received, nothing missing."""
    f = r["pgFailover"]
    ids = ", ".join(map(str, f["missingIds"])) or "-"
    if step["key"] == "pg-async":
        out = [(0 < f["missing"] <= f["acked"],
                f"acknowledged orders missing on the new primary {f['missing']} > 0 "
                f"(of {f['acked']} x 200; ids {ids})")]
    else:
        out = [(f["acked"] == 0 and f["unavailable"] >= 1,
                f"200s while no standby received: {f['acked']} = 0 "
                f"({f['unavailable']} x 503)"),
               (f["missing"] == 0, f"acknowledged orders missing on the new primary "
                                   f"{f['missing']} = 0")]
    return out + [strategies_seen(step, r)]


def check_cluster_failover(step, r, results):
    """cluster-none, cluster-aof: acknowledged orders lost with the killed
    master; cluster-wait: no 200 while its replica was cut off, none lost.
    Then, lost or not, Postgres's invariants and the drained Redis side."""
    f = r["clusterFailover"]
    out = [(r["stockDrift"] == 0 and r["oversold"] == 0 and r["duplicateUsers"] == 0,
            f"Postgres: drift {r['stockDrift']}, oversold {r['oversold']}, "
            f"duplicate users {r['duplicateUsers']} = 0")]
    if step["key"] == "cluster-wait":
        out += [(f["acked"] == 0 and f["unavailable"] >= 1,
                 f"200s while the replica was cut off: {f['acked']} = 0 "
                 f"({f['unavailable']} x 503)"),
                (f["lost"] == 0, f"acknowledged orders lost {f['lost']} = 0")]
    else:
        out.append((0 < f["lost"] <= f["acked"],
                    f"acknowledged orders lost {f['lost']} > 0 (of {f['acked']} x 200), each "
                    "listed in lost.txt"))
    out.append((r["reconciled"], "Redis and Postgres agree after the drain"))
    return out + [strategies_seen(step, r)]


def check_reentrant(step, r, results):
    return [one_order(r), (r["renewals"] >= 1, f"watchdog renewals {r['renewals']} >= 1")]


def check_one_order(step, r, results):
    return [one_order(r)]


def check_redlock_restart(step, r, results):
    n = r["nodes"]
    return [(n["firstAnswer"] == 200 and n["secondAnswer"] == 200,
             f"both instances answered 200 ({n['firstAnswer']}, {n['secondAnswer']})"),
            (r["orders"] == 2 and r["duplicateUsers"] == 1,
             f"orders {r['orders']} = 2 of one user (duplicate users {r['duplicateUsers']})")]


def check_redlock_delayed(step, r, results):
    n = r["nodes"]
    return [(n["firstAnswer"] == 200 and n["secondAnswer"] == 503,
             f"instance 1 answered {n['firstAnswer']} = 200, instance 2 "
             f"{n['secondAnswer']} = 503 (no majority)"), one_order(r)]


def check_multilock_down(step, r, results):
    n = r["nodes"]
    return [(r["statuses"] == {"503": r["requests"]},
             f"every answer 503 while a node is down: {r['statuses']}"),
            (n["ordersWhileDown"] == 0 and r["oversold"] == 0,
             f"orders while down {n['ordersWhileDown']} = 0, oversold {r['oversold']} = 0"),
            (n["afterOk"] >= 1, f"the node back: {n['afterOk']} x 200")]


def check_crash(step, r, results):
    """A killed holder: instance 2 refused while it held the lock, the lock
    free within the backend's window, one order."""
    lo, hi = step["backend"]["free_s"]
    c = r["crash"]
    free = c["freeAfterS"]
    return [(c["heldBeforeKill"], "instance 2 was refused (409) while instance 1 held it"),
            (free is not None and lo <= free <= hi,
             f"lock free {'never' if free is None else f'{free:.2f} s'} after the kill "
             f"(expected {lo:g}-{hi:g} s: {step['backend']['frees']})"),
            (r["orders"] == 1 and c["winner"] == 200,
             f"orders {r['orders']} = 1, instance 2's order answered {c['winner']}"),
            (r["strategiesSeen"] == [f"{step['lock']}/{step['stock']}"],
             f"instance 2 ran {', '.join(r['strategiesSeen']) or '?'}"),
            (r["status5xx"] == 0, f"5xx answers of instance 2: {r['status5xx']}")]


def check_outage(step, r, results):
    """A lock service down: 503 while down, no hang, no wrong order, sales
    resumed."""
    o = r["outage"]
    bad = {s: n for s, n in r["statuses"].items() if s not in ("200", "409", "503")}
    # An order is a 200, or a 503 whose request was under way while the
    # service was being stopped (its commit went through, the stop cut off
    # its answer: the buyer's retry gets 409 already_ordered). Never two
    # per user, never beyond the stock.
    lost = r["orders"] - r["ok"]
    return [(not bad and r["transportErrors"] == 0,
             f"answers only 200/409/503 (others {bad or 0}, transport errors "
             f"{r['transportErrors']})"),
            (o["unavailable"] >= 1, f"503 unavailable while down: {o['unavailable']} >= 1"),
            (o["maxMs"] < 5000, f"slowest answer {o['maxMs']:.0f} ms < 5000 (no hang)"),
            (0 <= lost <= o["inFlight503"] and r["duplicateUsers"] == 0 and r["oversold"] == 0,
             f"orders {r['orders']} = 200 answers {r['ok']} + {lost} whose answer the stop "
             f"cut off (at most the {o['inFlight503']} 503s under way while it stopped), duplicate "
             f"users {r['duplicateUsers']}, oversold {r['oversold']}"),
            (o["okAfter"] >= 1, f"sales resumed after the restart: {o['okAfter']} x 200"),
            strategies_seen(step, r)]


def strategies_seen(step, r):
    return (r["strategiesSeen"] == [f"{step['lock']}/{step['stock']}"] * step["instances"],
            f"instances ran {', '.join(r['strategiesSeen']) or '?'}")


def common_checks(step, r):
    """Every other step: the instances ran what the step says, and no answer
    was lost (the failover steps: in their sale)."""
    return [strategies_seen(step, r),
            (r["transportErrors"] == 0 and r["status5xx"] == 0,
             f"transport errors {r['transportErrors']}, 5xx answers {r['status5xx']}")]


# Each step's checks, by key; the steps after "common" get common_checks() too.
CHECKS = {"naive": check_naive, "cas": check_stock, "optimistic": check_stock,
          "pessimistic": check_stock, "batched": check_stock, "none": check_none,
          "local-1": check_one_order, "local-2": check_local_2, "setnx": check_setnx,
          "owner": check_owner, "redis-lost": check_redis_first, "redis-durable": check_redis_first,
          "reentrant": check_reentrant}
OWN_CHECKS = {"redlock-restart": check_redlock_restart, "redlock-delayed": check_redlock_delayed,
              "multilock-node-down": check_multilock_down, "pg-async": check_pg_failover,
              "pg-sync": check_pg_failover, "cluster-none": check_cluster_failover,
              "cluster-aof": check_cluster_failover, "cluster-wait": check_cluster_failover}
PREFIX_CHECKS = (("storm-", check_one_order, True), ("crash-", check_crash, False),
                 ("outage-", check_outage, False))


def checker(step):
    """(the step's checks, whether common_checks() follow)."""
    k = step["key"]
    if k in CHECKS:
        return CHECKS[k], True
    if k in OWN_CHECKS:
        return OWN_CHECKS[k], False
    for prefix, fn, common in PREFIX_CHECKS:
        if k.startswith(prefix):
            return fn, common
    if step.get("failover"):
        return (lambda s, r, _results: check_failover(s, r)), True
    return (lambda *_: []), True


def check_step(step, r, results):
    """[(ok, text)] for the step's expected outcome; r: the step's figures."""
    check, common = checker(step)
    out = check(step, r, results)
    return out + common_checks(step, r) if common else out


def check_failover(step, r):
    """The lost-lock steps' expectations; r["lost"] is the scenario's record."""
    k, f = step["key"], r["lost"]
    a, b = f["a"], f["b"]
    out = [(f["lockOnNewMaster"] == (1 if k == "lost-wait" else 0),
            f"the promoted replica {'has' if f['lockOnNewMaster'] else 'has no'} lock"),
           (f["bSentBeforeAResumed"],
            f"B sent {f['bSentAfterLockS']:.1f} s after A's grant, before A resumed "
            f"({FAILOVER['pause_ms'] / 1000:g} s)")]
    if k == "lost-nofence":
        out.append((a == "200" and b == "200", f"A {a}, B {b}: both wrote"))
        out.append((r["orders"] == 2 and r["duplicateUsers"] == 1,
                    f"orders {r['orders']} = 2 for one user (duplicate users {r['duplicateUsers']})"))
    elif k == "lost-fence":
        out.append((b == "200", f"B {b}"))
        out.append((a == "409" and STALE_MESSAGE in f["aMessage"],
                    f"A {a}: {f['aMessage'] or '-'} (want 409, {STALE_MESSAGE})"))
        out.append((f["staleTokenRejections"] >= 1,
                    f"stale-token rejections on instance 1: {f['staleTokenRejections']} >= 1"))
        out.append((r["orders"] == 1, f"orders {r['orders']} = 1"))
    elif k == "lost-wait-paused":
        out.append((a == "503", f"A {a}: {f['aMessage'] or '-'} (want 503: no replica acknowledged)"))
        out.append((f["unsynced"] >= 1, f"grants undone on instance 1: {f['unsynced']} >= 1"))
        out.append((b == "200", f"B {b}"))
        out.append((r["orders"] == 1, f"orders {r['orders']} = 1"))
    elif k == "lost-wait":
        out.append((b == "409", f"B {b} (want 409: the lock survived the failover)"))
        out.append((a == "200", f"A {a}"))
        out.append((r["orders"] == 1, f"orders {r['orders']} = 1"))
    return out
