#!/usr/bin/env python3
"""What one answer of the sold-out edge costs nginx, in instructions.

  python3 loadtest/edge_answer.py        (make bench-edge runs it last)

nginx from nginx/nginx.conf.tmpl (--edge on) in front of a stand-in
instance that answers every purchase as an instance answers a sold-out
voucher (409 sold_out, Content-Type application/json, Cache-Control
no-store, X-Instance-Id, X-Edge-Sold-Out: 1000), so that nginx keeps the
answer and gives it itself; and nginx alone on its own configuration
(kit.bare_conf, make bench's yardstick) answering 'return 200'. Each runs
as one process (worker_processes 1, master_process off) under valgrind's
callgrind; EDGE_ANSWER_REQUESTS POSTs from ab -k -c 8 after 200 more as a
warm-up; nginx's instructions per request printed (user space: the
kernel's share, the sockets, is the same for both). The kept answer lives
1 s, so a request a second goes to the stand-in and keeps it again: part
of the count, as in a real crowd.

With EDGE_ANSWER_BASE=<git revision>, that revision's template too: a change
to the edge counted against the one before it.

Environment: EDGE_ANSWER_REQUESTS (3000), EDGE_ANSWER_BASE, EDGE_ANSWER_RUN_DIR
(<repo>/build/edge-answer-run). Needs valgrind and ab. Python 3 standard
library only.
"""

import http.server
import os
import shutil
import subprocess
import sys
import threading

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import kit  # noqa: E402
from bench import env_int  # noqa: E402

BODY = b'{"error":"sold_out","message":"sold out"}'


def log(msg):
    print(f"edge-answer: {msg}", file=sys.stderr, flush=True)


def stand_in():
    """An HTTP/1.1 server on a free port that answers every POST as an
    instance answers a sold-out voucher. Returns (server, "host:port")."""
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(409)
            for k, v in (("Content-Type", "application/json"), ("Cache-Control", "no-store"),
                         ("X-Instance-Id", "stand-in"), ("X-Edge-Sold-Out", "1000"),
                         ("Content-Length", str(len(BODY)))):
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(BODY)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"127.0.0.1:{server.server_address[1]}"


def base_gen_conf(rev, run_dir):
    """That revision's nginx/gen-conf.sh (its nginx/ and dashboard/ unpacked
    under run_dir)."""
    tree = os.path.join(run_dir, "base")
    os.makedirs(tree)
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "nginx", "dashboard"],
                             capture_output=True, timeout=60)
    if archive.returncode != 0:
        raise kit.KitError(f"git archive {rev}: {archive.stderr.decode().strip()}")
    if subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, timeout=60).returncode != 0:
        raise kit.KitError(f"could not unpack {rev}'s nginx/")
    return os.path.join(tree, "nginx", "gen-conf.sh")


def count(prefix, requests, status, write_conf):
    """write_conf(prefix, port) writes prefix/nginx.conf; its instructions
    per request under callgrind."""
    port = kit.free_ports(1)[0]
    write_conf(prefix, port)
    return kit.callgrind_instructions(prefix, port, requests, status=status)


def main():
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if not (shutil.which("valgrind") and shutil.which("ab")):
        log("needs valgrind and ab (make deps installs them)")
        return 2
    requests = env_int("EDGE_ANSWER_REQUESTS", 3000)
    run_dir = os.environ.get("EDGE_ANSWER_RUN_DIR") or os.path.join(ROOT, "build", "edge-answer-run")
    base = os.environ.get("EDGE_ANSWER_BASE", "")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    server, addr = stand_in()
    counted = {}
    try:
        def template(gen_conf):
            def write(prefix, port):
                kit.write_conf(prefix, port, [addr], gen_args=("--edge", "on"), gen_conf=gen_conf)
            return write

        def bare(prefix, port):
            os.makedirs(prefix, exist_ok=True)
            with open(os.path.join(prefix, "nginx.conf"), "w") as f:
                f.write(kit.bare_conf(prefix, port))

        cases = [("edge", 409, template(kit.GEN_CONF))]
        if base:
            cases.append((f"edge at {base}", 409, template(base_gen_conf(base, run_dir))))
        cases.append(("bare", 200, bare))
        for i, (name, status, write) in enumerate(cases):
            counted[name] = count(os.path.join(run_dir, f"nginx-{i}"), requests, status, write)
            log(f"{name}: {counted[name]:,.0f} instructions per request")
    except kit.KitError as e:
        log(f"error: {e}")
        return 2
    finally:
        server.shutdown()
        server.server_close()
    print(f"\n== nginx's instructions per answer (callgrind, one process, ab -k -c 8, {requests} requests)")
    for name, n in counted.items():
        print(f"  {name:24} {n:10,.0f}   {n / counted['bare']:.2f} x bare")
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
