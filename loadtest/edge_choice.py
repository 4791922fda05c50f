#!/usr/bin/env python3
"""make bench-edge: the ways Debian's nginx can answer a sold-out crowd by
itself, measured in one run with the same wrk settings.

  python3 loadtest/edge_choice.py        (make bench-edge; under the heavy lock)

One nginx from nginx/nginx.conf.tmpl (nginx/gen-conf.sh) with more server
blocks added, all on 127.0.0.1, wrk -t2 -c64 with loadtest/wrk_sale.lua (a
POST with a new X-User-Id each) on each in turn, round after round:

  bare         'return 200' with the body of a sold-out answer: nginx alone
  lua          the template's own sold-out edge (Lua, lua_shared_dict) in
               front of a stand-in instance that answers 409 sold_out with
               X-Edge-Sold-Out: 1000, as the instances do: nginx answers from
               its dictionary, and asks the stand-in again once a second
  proxy_cache  proxy_cache micro-caching keyed on the voucher, POST cached
               (proxy_cache_methods), the stand-in's answer kept for its
               X-Accel-Expires: 1, every other header ignored for caching
  proxy_cache+ the same with open_file_cache (the cached file kept open)
  proxy_cache+count  and its answers counted as the Lua edge counts its own
               (a log_by_lua handler: the cheapest way to count them; stock
               nginx has no per-status counter)
  njs          a js_content handler that answers the same 409 (njs 0.7.9,
               Debian's libnginx-mod-http-js, has no shared dictionary:
               js_shared_dict_zone came with njs 0.8.0, so it cannot know which
               voucher is sold out; this is only the cost of its answer).
               Measured when the module is installed, else left out
  proxied      no edge: every request to the stand-in (the hop)

Each round runs bare between every two variants; a variant's ratio is its
req/s over the mean of the bare runs just before and after it. Prints req/s,
p50 and p99 per variant (medians of the rounds) and the median of its
ratios; writes EDGE_JSON.

A run during which programs outside this measurement (or the hypervisor:
steal) took more than EDGE_NOISE_PCT of the machine is disturbed: it is kept
in EDGE_JSON but no ratio is made of it (the table says how many were).

Environment: EDGE_ROUNDS (8), EDGE_SECONDS (3), EDGE_CONNECTIONS (64),
EDGE_NOISE_PCT (5),
EDGE_JSON (<repo>/build/edge-choice.json), EDGE_RUN_DIR
(<repo>/build/edge-choice-run). Python 3 standard library only.
"""

import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import kit  # noqa: E402
from kit import Col, CpuMeter, fmt_count  # noqa: E402

MODULES = "/usr/lib/nginx/modules"
BODY = '{"error":"sold_out","message":"sold out"}'
VARIANTS = ("bare", "lua", "proxy_cache", "proxy_cache+", "proxy_cache+count", "njs", "proxied")


def env_int(name, default):
    v = os.environ.get(name, "")
    return int(v) if v.isdigit() else default


def log(msg):
    print(f"edge-choice: {msg}", file=sys.stderr, flush=True)


def servers(ports, standin, njs_file):
    """The server blocks added to the template's http block."""
    p = ports
    out = f"""
    # The stand-in instance: the sold-out answer, marked for the Lua edge
    # (X-Edge-Sold-Out) and for proxy_cache (X-Accel-Expires).
    server {{
        listen 127.0.0.1:{standin} backlog=4096;
        access_log off;
        keepalive_requests 100000;
        location / {{
            default_type application/json;
            add_header Cache-Control "no-store" always;
            add_header X-Instance-Id stand-in always;
            add_header X-Edge-Sold-Out 1000 always;
            add_header X-Accel-Expires 1 always;
            return 409 '{BODY}';
        }}
    }}
    server {{
        listen 127.0.0.1:{p['bare']} backlog=4096;
        location / {{
            default_type application/json;
            add_header X-Request-Id $seckill_request_id always;
            return 200 '{BODY}';
        }}
    }}
    proxy_cache_path {{tmp}}/cache levels= keys_zone=edge_choice:1m max_size=16m inactive=10s
                     use_temp_path=off;
"""
    ofc = "open_file_cache max=64;\n        open_file_cache_valid 1s;"
    count = """log_by_lua_block {
                if ngx.var.upstream_cache_status == "HIT" then
                    local w = seckill_edge_worker
                    w.answered = w.answered + 1
                end
            }"""
    for name, extra, log_phase in (("proxy_cache", "", ""), ("proxy_cache+", ofc, ""),
                                   ("proxy_cache+count", ofc, count)):
        out += f"""    server {{
        listen 127.0.0.1:{p[name]} backlog=4096;
        {extra}
        location / {{
            proxy_pass http://seckill;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache edge_choice;
            proxy_cache_methods POST;
            proxy_cache_key $seckill_edge_key;
            proxy_cache_bypass $seckill_edge_skip;
            proxy_no_cache $seckill_edge_skip;
            proxy_ignore_headers Cache-Control Expires Set-Cookie Vary;
            proxy_hide_header X-Request-Id;
            proxy_hide_header X-Edge-Sold-Out;
            add_header X-Request-Id $seckill_request_id always;
            {log_phase}
        }}
    }}
"""
    out += """    map $seckill_edge_key $seckill_edge_skip {
        default 0;
        ""      1;
    }
"""
    out += f"""    server {{
        listen 127.0.0.1:{p['proxied']} backlog=4096;
        location / {{
            proxy_pass http://seckill;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_hide_header X-Request-Id;
            proxy_hide_header X-Edge-Sold-Out;
            add_header X-Request-Id $seckill_request_id always;
        }}
    }}
"""
    if njs_file:
        out += f"""    js_import edge_choice from {njs_file};
    server {{
        listen 127.0.0.1:{p['njs']} backlog=4096;
        location / {{
            add_header X-Request-Id $seckill_request_id always;
            js_content edge_choice.soldOut;
        }}
    }}
"""
    return out


class Choice:
    def __init__(self):
        self.rounds = env_int("EDGE_ROUNDS", 8)
        self.seconds = env_int("EDGE_SECONDS", 3)
        self.noise_pct = env_int("EDGE_NOISE_PCT", 5)
        self.conns = env_int("EDGE_CONNECTIONS", 64)
        self.json_path = os.environ.get("EDGE_JSON") or os.path.join(ROOT, "build", "edge-choice.json")
        self.dir = os.environ.get("EDGE_RUN_DIR") or os.path.join(ROOT, "build", "edge-choice-run")
        self.pid = None
        self.results = {v: [] for v in VARIANTS}
        self.user = 1_000_000_000_000

    def start(self):
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.tmp = tempfile.mkdtemp(prefix="wrk.", dir=self.dir)
        njs = os.path.exists(os.path.join(MODULES, "ngx_http_js_module.so"))
        front, standin, *rest = kit.free_ports(2 + len(VARIANTS) - 1)
        ports = dict(zip([v for v in VARIANTS if v != "lua"], rest))
        ports["lua"] = front
        self.ports = ports if njs else {k: v for k, v in ports.items() if k != "njs"}
        njs_file = None
        if njs:
            njs_file = os.path.join(self.dir, "edge_choice.js")
            with open(njs_file, "w") as f:
                f.write("function soldOut(r) {\n"
                        "    r.headersOut['Content-Type'] = 'application/json';\n"
                        "    r.headersOut['Cache-Control'] = 'no-store';\n"
                        "    r.headersOut['X-Instance-Id'] = 'stand-in';\n"
                        f"    r.return(409, '{BODY}');\n"
                        "}\n"
                        "export default { soldOut };\n")
        conf = os.path.join(self.dir, "nginx.conf")
        kit.run([kit.GEN_CONF, "--prefix", self.dir, "--listen", f"127.0.0.1:{front}",
                 "--upstream", f"127.0.0.1:{standin}", "--edge", "on", "-o", conf], 30,
                env=kit.with_settings(os.environ, {"NGINX_ALLOW": None, "NGINX_EDGE": None}))
        with open(conf) as f:
            text = f.read().rstrip()
        if njs:
            text = re.sub(r"^(load_module \S+ngx_http_lua_module\.so;)$",
                          rf"\1\nload_module {MODULES}/ngx_http_js_module.so;", text, count=1, flags=re.M)
        extra = servers(ports, standin, njs_file).replace("{tmp}", self.dir)
        text = text[:-1] + extra + "}\n"
        with open(conf, "w") as f:
            f.write(text)
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        err = os.path.join(self.dir, "error.log")
        kit.run([nginx, "-t", "-q", "-p", self.dir, "-c", conf, "-e", err], 30)
        kit.run([nginx, "-p", self.dir, "-c", conf, "-e", err, "-g", "daemon on;"], 30)
        deadline = time.monotonic() + 5
        while self.pid is None:
            try:
                with open(os.path.join(self.dir, "nginx.pid")) as f:
                    self.pid = int(f.read().strip())
            except (OSError, ValueError):
                if time.monotonic() > deadline:
                    raise kit.KitError("nginx wrote no pid file") from None
                time.sleep(0.05)
        if not njs:
            log(f"no {MODULES}/ngx_http_js_module.so (libnginx-mod-http-js): njs left out")

    def stop(self):
        if self.pid:
            kit.stop_nginx(self.pid, self.dir)
            self.pid = None

    def check_answers(self):
        """Each variant answers what it should before it is measured."""
        for name, port in self.ports.items():
            for _ in range(2):          # the first may fill the edge
                r = kit.request(port, "POST", "/voucher/7/seckill", {"X-User-Id": "42"})
            want = 200 if name == "bare" else 409
            if r.status != want or BODY not in r.raw.decode():
                raise kit.KitError(f"{name}: {r.status} {r.raw[:200]!r}")

    def wrk(self, port, seconds):
        self.user += 10_000_000_000
        return kit.run_wrk(f"http://127.0.0.1:{port}/voucher/7/seckill", self.conns, seconds,
                           self.tmp, self.user, ids=False)

    def measure(self):
        """Each round: bare, a variant, bare, the next, ..., bare (the
        variants' order turned by one each round), so that each variant is
        compared with the bare runs just before and after it: a machine
        whose speed drifts (other programs, the hypervisor) moves both."""
        self.start()
        self.check_answers()
        others = [v for v in self.ports if v != "bare"]
        for i in range(1, self.rounds + 1):
            order = others[(i - 1) % len(others):] + others[:(i - 1) % len(others)]
            prev = self.run_one(i, "bare")
            for name in order:
                w = self.run_one(i, name)
                nxt = self.run_one(i, "bare")
                if not (prev["disturbed"] or w["disturbed"] or nxt["disturbed"]):
                    w["vsBare"] = w["rps"] / ((prev["rps"] + nxt["rps"]) / 2)
                prev = nxt

    def run_one(self, i, name):
        port = self.ports[name]
        self.wrk(port, 1)
        meter = CpuMeter({"nginx": [self.pid]})
        meter.start()
        w = self.wrk(port, self.seconds)
        cpu = meter.stop()
        r = {k: w[k] for k in ("rps", "p50Ms", "p99Ms", "statuses")}
        # Others' share of the machine (2 CPUs: 100 % is both).
        wall = cpu["wallSeconds"] * (os.cpu_count() or 1)
        r["othersPct"] = round(100.0 * (max(0.0, cpu["other"]) + cpu["steal"]) / wall, 1) if wall else None
        r["disturbed"] = r["othersPct"] is None or r["othersPct"] > self.noise_pct
        self.results[name].append(r)
        log(f"round {i}: {name}: {w['rps']:.0f} req/s, p50 {w['p50Ms']:.3f} ms, p99 {w['p99Ms']:.3f} ms"
            f"{'; DISTURBED' if r['disturbed'] else ''} (others {r['othersPct']} %)")
        return r

    def report(self):
        cols = [Col("variant (wrk -t2 -c%d, %d s, %d rounds)" % (self.conns, self.seconds, self.rounds), "l", 40),
                Col("req/s", "r", 9, 1), Col("p50 ms", "r", 7, 1), Col("p99 ms", "r", 7, 1),
                Col("÷ bare", "r", 7, 1), Col("runs", "r", 5, 1),
                Col("ratios (÷ the bare runs before and after)", "l", 0, 2)]
        rows, summary = [], {}
        for name in self.ports:
            rs = [r for r in self.results[name] if not r["disturbed"]]
            if not rs:
                rows.append([name, "", "", "", "", f"0/{len(self.results[name])}", "every run disturbed"])
                continue
            ratios = [] if name == "bare" else [r["vsBare"] for r in rs if r.get("vsBare")]
            summary[name] = {"rps": statistics.median(r["rps"] for r in rs),
                             "p50Ms": statistics.median(r["p50Ms"] for r in rs),
                             "p99Ms": statistics.median(r["p99Ms"] for r in rs),
                             "vsBare": 1.0 if name == "bare" else statistics.median(ratios) if ratios else None,
                             "ratios": [round(x, 3) for x in ratios],
                             "runs": len(rs), "disturbed": len(self.results[name]) - len(rs)}
            s = summary[name]
            rows.append([name, fmt_count(s["rps"]), f"{s['p50Ms']:.2f}", f"{s['p99Ms']:.2f}",
                         f"{s['vsBare']:.2f}" if s["vsBare"] else "", f"{len(rs)}/{len(self.results[name])}",
                         " ".join(f"{x:.2f}" for x in sorted(ratios))])
        print("\n".join(["", "== make bench-edge: answering a sold-out crowd in nginx", "",
                         kit.table(cols, rows),
                         f"  (runs: undisturbed / all; disturbed: others and steal above {self.noise_pct} %"
                         " of the machine; medians of the undisturbed runs)", ""]), flush=True)
        doc = {"when": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
               "command": "make bench-edge", "connections": self.conns, "seconds": self.seconds,
               "rounds": self.rounds, "summary": summary, "results": self.results}
        os.makedirs(os.path.dirname(os.path.abspath(self.json_path)), exist_ok=True)
        kit.write_atomic(self.json_path, json.dumps(doc, indent=1) + "\n")


def main():
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    c = Choice()

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)
    try:
        c.measure()
    except (kit.KitError, KeyboardInterrupt) as e:
        log(f"error: {e}")
        return 2
    finally:
        c.stop()
    c.report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
