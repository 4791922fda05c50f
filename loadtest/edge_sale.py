#!/usr/bin/env python3
"""What the sold-out edge costs nginx on a sale: nginx's CPU per request
for a voucher that is not sold out, with the edge on and off.

  python3 loadtest/edge_sale.py        (under the heavy lock)

Two build/upstream200 processes (loadtest/upstream200.c: separate upstreams
that answer 200 at once and do no work) behind two nginx from
nginx/nginx.conf.tmpl, one generated with --edge on, one with --edge off.
wrk -t2 -c64 with loadtest/wrk_sale.lua (a POST /voucher/7/seckill with a
new X-User-Id each) on each in turn, round after round (on, off, on, ...).
With the edge on, each such request runs the edge's Lua: the access check
(a shared-dictionary lookup that misses), the jump to @seckill_edge_fill
and its header and body filters; the answers are 200s, so nothing is kept.
Prints, per setting, the medians of the rounds: req/s and nginx's CPU
milliseconds per request (its master and workers, from /proc), and the
difference: the edge's cost per sale request.

A run during which programs outside this measurement (or the hypervisor)
took more than EDGE_NOISE_PCT of the machine is left out.

Environment: EDGE_ROUNDS (5), EDGE_SECONDS (4), EDGE_CONNECTIONS (64),
EDGE_NOISE_PCT (5), EDGE_RUN_DIR (<repo>/build/edge-sale-run),
BENCH_UPSTREAM200 (<repo>/build/upstream200; make build/upstream200).
Python 3 standard library only.
"""

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import kit  # noqa: E402
from bench import CpuMeter, env_int  # noqa: E402


def log(msg):
    print(f"edge-sale: {msg}", file=sys.stderr, flush=True)


def main():
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    rounds, seconds = env_int("EDGE_ROUNDS", 5), env_int("EDGE_SECONDS", 4)
    conns, noise = env_int("EDGE_CONNECTIONS", 64), env_int("EDGE_NOISE_PCT", 5)
    run_dir = os.environ.get("EDGE_RUN_DIR") or os.path.join(ROOT, "build", "edge-sale-run")
    binary = os.environ.get("BENCH_UPSTREAM200") or os.path.join(ROOT, "build", "upstream200")
    if not os.access(binary, os.X_OK):
        log(f"{binary} is missing (make build/upstream200)")
        return 2
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    tmp = tempfile.mkdtemp(prefix="wrk.", dir=run_dir)
    ups, nginx = [], {}
    results = {"on": [], "off": []}
    user = 1_000_000_000_000

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)
    try:
        up_ports = kit.free_ports(2)
        for p in up_ports:
            ups.append(subprocess.Popen([binary, str(p), "2"], stdin=subprocess.DEVNULL))
        for p in up_ports:
            if not kit.wait_port(p, 5):
                raise kit.KitError(f"upstream200 on port {p} did not start")
        for edge, port in zip(("on", "off"), kit.free_ports(2)):
            pid = kit.start_nginx(os.path.join(run_dir, f"nginx-{edge}"), port,
                                  [f"127.0.0.1:{p}" for p in up_ports], gen_args=("--edge", edge))
            nginx[edge] = (port, pid)
        for i in range(1, rounds + 1):
            for edge in ("on", "off"):
                port, pid = nginx[edge]
                url = f"http://127.0.0.1:{port}/voucher/7/seckill"
                user += 10_000_000_000
                kit.run_wrk(url, conns, 1, tmp, user, ids=False)
                meter = CpuMeter({"nginx": [pid]})
                meter.start()
                user += 10_000_000_000
                w = kit.run_wrk(url, conns, seconds, tmp, user, ids=False)
                cpu = meter.stop()
                n = w["rps"] * seconds
                wall = cpu["wallSeconds"] * (os.cpu_count() or 1)
                others = 100.0 * (max(0.0, cpu["other"]) + cpu["steal"]) / wall if wall else 100.0
                ok = set(w["statuses"]) == {"200"} if w.get("statuses") else True
                r = {"rps": w["rps"], "nginxMs": 1000.0 * cpu["nginx"] / n if n else None,
                     "othersPct": round(others, 1), "disturbed": others > noise or not ok}
                results[edge].append(r)
                log(f"round {i}: edge {edge}: {w['rps']:.0f} req/s, nginx {r['nginxMs']:.4f} ms/request"
                    f"{'; DISTURBED' if r['disturbed'] else ''} (others {r['othersPct']} %)")
    except (kit.KitError, KeyboardInterrupt) as e:
        log(f"error: {e}")
        return 2
    finally:
        for port, pid in nginx.values():
            kit.stop_pid(pid, signal.SIGQUIT, 10)
        for p in ups:
            p.terminate()
            p.wait(10)
    med = {}
    for edge, rs in results.items():
        good = [r for r in rs if not r["disturbed"]]
        if not good:
            log(f"edge {edge}: every run disturbed")
            return 1
        med[edge] = (statistics.median(r["rps"] for r in good),
                     statistics.median(r["nginxMs"] for r in good), len(good), len(rs))
    print(f"\n== the sold-out edge on a sale (wrk -t2 -c{conns}, {seconds} s, {rounds} rounds; "
          "nginx -> 2 upstream200)")
    for edge, (rps, ms, good, total) in med.items():
        print(f"  edge {edge:3}  {rps:8.0f} req/s   nginx {ms:.4f} ms/request   ({good}/{total} runs)")
    print(f"  the edge's Lua: {med['on'][1] - med['off'][1]:+.4f} ms of nginx's CPU per sale request, "
          f"{med['on'][0] / med['off'][0]:.2f} of the req/s\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
