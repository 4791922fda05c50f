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
(a shared-dictionary lookup), which sends the request to @seckill_edge_fill
and its header and body filters unless an answer of the last 0.1 s marked
the voucher open; the answers are 200s, so nothing is kept.
Prints, per setting, the medians of the rounds: req/s and nginx's CPU
milliseconds per request (its master and workers, from /proc), and the
difference: the edge's cost per sale request.

With EDGE_SALE_BASE=<git revision>, a third nginx, "base", runs that
revision's nginx/ (its template and gen-conf.sh, edge on) in the same
rounds: a change to the template measured against the one before it.

Then, since nginx's CPU per request moves by a fifth or more between runs
on a shared VM, the same request is counted in instructions, which do not
move: each setting's nginx again as one process (worker_processes 1,
master_process off) under valgrind's callgrind, EDGE_CALLGRIND_REQUESTS
requests from ab -k -c 8 (one user id; counted from after 200 more as a
warm-up), nginx's instructions per request printed. The count moves by
well under 1 % between runs: the requests that go through the edge's
filters depend on how many arrive before each answer that marks the
voucher open. EDGE_CALLGRIND=0 skips
it; without valgrind or ab it is skipped with a note.

A run during which programs outside this measurement (or the hypervisor)
took more than EDGE_NOISE_PCT of the machine is left out.

Environment: EDGE_ROUNDS (5), EDGE_SECONDS (4), EDGE_CONNECTIONS (64),
EDGE_NOISE_PCT (5), EDGE_SALE_BASE, EDGE_CALLGRIND (1), EDGE_CALLGRIND_REQUESTS
(5000), EDGE_RUN_DIR (<repo>/build/edge-sale-run),
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
from bench import env_int  # noqa: E402
from kit import CpuMeter  # noqa: E402


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
    base = os.environ.get("EDGE_SALE_BASE", "")
    settings = ("on", "off", "base") if base else ("on", "off")
    results = {edge: [] for edge in settings}
    counted = {}
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
        gen_conf = kit.GEN_CONF
        if base:
            # That revision's nginx/ and the dashboard/ its gen-conf.sh copies.
            tree = os.path.join(run_dir, "base")
            os.makedirs(tree)
            try:
                archive = subprocess.run(["git", "-C", ROOT, "archive", base, "nginx", "dashboard"],
                                         capture_output=True, timeout=60)
                if archive.returncode != 0:
                    raise kit.KitError(f"git archive {base}: {archive.stderr.decode().strip()}")
                if subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout,
                                  timeout=60).returncode != 0:
                    raise kit.KitError(f"could not unpack {base}'s nginx/")
            except (OSError, subprocess.TimeoutExpired) as e:
                raise kit.KitError(f"{base}'s nginx/: {e}") from None
            gen_conf = os.path.join(tree, "nginx", "gen-conf.sh")
        for edge, port in zip(settings, kit.free_ports(len(settings))):
            pid = kit.start_nginx(os.path.join(run_dir, f"nginx-{edge}"), port,
                                  [f"127.0.0.1:{p}" for p in up_ports],
                                  gen_args=("--edge", "on" if edge == "base" else edge),
                                  gen_conf=gen_conf if edge == "base" else kit.GEN_CONF)
            nginx[edge] = (port, pid)
        for i in range(1, rounds + 1):
            for edge in settings:
                port, pid = nginx[edge]
                url = f"http://127.0.0.1:{port}/voucher/7/seckill"
                user += 10_000_000_000
                kit.run_wrk(url, conns, 1, tmp, user, ids=False)
                # The upstreams are measured too: 'other' is then the
                # programs outside this measurement.
                meter = CpuMeter({"nginx": [pid], "upstream": [u.pid for u in ups]})
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
        if env_int("EDGE_CALLGRIND", 1) and not (shutil.which("valgrind") and shutil.which("ab")):
            log("no valgrind or no ab: instructions per request not counted")
        elif env_int("EDGE_CALLGRIND", 1):
            requests = env_int("EDGE_CALLGRIND_REQUESTS", 5000)
            for edge in settings:
                port, pid = nginx.pop(edge)
                if not kit.stop_pid(pid, signal.SIGQUIT, 10):
                    raise kit.KitError(f"nginx {pid} (edge {edge}) did not stop: its port is "
                                       "needed for the count")
                counted[edge] = kit.callgrind_instructions(os.path.join(run_dir, f"nginx-{edge}"), port,
                                                           requests)
                log(f"edge {edge}: {counted[edge]:,.0f} instructions per request (callgrind, "
                    f"{requests} requests)")
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
        ins = f"   {counted[edge]:,.0f} instructions/request" if edge in counted else ""
        print(f"  edge {edge:4}  {rps:8.0f} req/s   nginx {ms:.4f} ms/request   ({good}/{total} runs)"
              f"{ins}")
    print(f"  the edge's Lua: {med['on'][1] - med['off'][1]:+.4f} ms of nginx's CPU per sale request, "
          f"{med['on'][0] / med['off'][0]:.2f} of the req/s")
    if counted:
        print(f"  the edge's Lua: {counted['on'] - counted['off']:+,.0f} instructions per sale request")
    if base:
        print(f"  against {base}: {med['on'][1] - med['base'][1]:+.4f} ms of nginx's CPU per sale "
              f"request, {med['on'][0] / med['base'][0]:.2f} of its req/s")
        if counted:
            print(f"  against {base}: {counted['on'] - counted['base']:+,.0f} instructions per sale "
                  f"request ({counted['on'] / counted['base']:.2f} of its count)")
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
