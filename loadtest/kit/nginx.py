"""nginx: start_nginx() (nginx/gen-conf.sh's configuration, nginx on it),
start_bare_nginx() (nginx alone, the yardstick) and stop_nginx();
access_log() (its log), answered_by() (who answered a logged request: an
instance's name, or NGINX_EDGE) and edge_answered() (the sold-out edge's
answers, which are counted, not logged)."""

import os
import re
import shutil
import signal
import subprocess
import time
from collections import namedtuple

from .base import ROOT, KitError
from .http import call
from .proc import run, stop_pid, wait_port, with_settings

GEN_CONF = os.path.join(ROOT, "nginx", "gen-conf.sh")


def start_nginx(prefix, port, upstreams, extra_conf="", gen_args=(), timeout=30, gen_conf=GEN_CONF):
    """write_conf()'s configuration, nginx started on it as a daemon. Returns
    its master's pid. KitError on any failure."""
    conf = write_conf(prefix, port, upstreams, extra_conf, gen_args, timeout, gen_conf)
    return _start(prefix, conf, timeout)


def write_conf(prefix, port, upstreams, extra_conf="", gen_args=(), timeout=30, gen_conf=GEN_CONF):
    """gen_conf's configuration (nginx/gen-conf.sh, with gen_args) in directory prefix
    (made if need be), listening on 127.0.0.1:port in front of upstreams
    ("host:port"), with extra_conf (e.g. another server block) added at the
    end of its http block: prefix/nginx.conf, returned. KitError on any failure."""
    os.makedirs(prefix, exist_ok=True)
    conf = os.path.join(prefix, "nginx.conf")
    gen = [gen_conf, "--prefix", prefix, "--listen", f"127.0.0.1:{port}", "-o", conf]
    for u in upstreams:
        gen += ["--upstream", u]
    # The caller's NGINX_ALLOW and NGINX_EDGE would change gen-conf.sh's
    # defaults (the allow-list, the sold-out edge): gen_args say so instead.
    run(gen + list(gen_args), timeout,
        env=with_settings(os.environ, {"NGINX_ALLOW": None, "NGINX_EDGE": None}))
    if extra_conf:
        with open(conf) as f:
            text = f.read().rstrip()
        if not text.endswith("}"):
            raise KitError(f"{conf} does not end with the http block's '}}'")
        with open(conf, "w") as f:
            f.write(text[:-1] + extra_conf + "}\n")
    return conf


def _start(prefix, conf, timeout):
    """nginx -t, then nginx as a daemon on conf; its master's pid."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    errlog = os.path.join(prefix, "error.log")
    run([nginx, "-t", "-q", "-p", prefix, "-c", conf, "-e", errlog], timeout)
    run([nginx, "-p", prefix, "-c", conf, "-e", errlog, "-g", "daemon on;"], timeout)
    deadline = time.monotonic() + 5
    while True:
        try:
            with open(os.path.join(prefix, "nginx.pid")) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                raise KitError(f"nginx in {prefix} wrote no pid file") from None
            time.sleep(0.05)


BARE_BODY = '{"error":"sold_out","message":"sold out"}'


def bare_conf(prefix, port):
    """A configuration of nginx alone, nothing of nginx/nginx.conf.tmpl:
    the template's worker count (worker_processes auto) and connection
    limits, no access log, keep-alive without a request limit, and
    'return 200' with a body of a sold-out answer's size. The yardstick of
    what nginx answers by itself on this machine."""
    return f"""worker_processes auto;
worker_rlimit_nofile 16384;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{
    worker_connections 4096;
}}
http {{
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path       {prefix}/proxy;
    fastcgi_temp_path     {prefix}/fastcgi;
    uwsgi_temp_path       {prefix}/uwsgi;
    scgi_temp_path        {prefix}/scgi;
    access_log off;
    keepalive_requests 1000000;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            default_type application/json;
            return 200 '{BARE_BODY}';
        }}
    }}
}}
"""


def start_bare_nginx(prefix, port, timeout=30):
    """nginx on bare_conf() in directory prefix (made if need be), as a
    daemon. Returns its master's pid. KitError on any failure."""
    os.makedirs(prefix, exist_ok=True)
    conf = os.path.join(prefix, "nginx.conf")
    with open(conf, "w") as f:
        f.write(bare_conf(prefix, port))
    return _start(prefix, conf, timeout)


def stop_nginx(pid, prefix, timeout=10):
    """A graceful stop (SIGQUIT) of the nginx start_nginx() started in
    prefix, SIGKILL after timeout seconds; stop_pid()'s answer (None: pid
    is no longer that nginx, left alone)."""
    gone = stop_pid(pid, signal.SIGQUIT, timeout, cmdline_has=prefix)
    if gone is False:
        os.kill(pid, signal.SIGKILL)
    return gone


# nginx's "seckill" log_format (nginx/nginx.conf.tmpl): [time] "request"
# status bytes rid=... up=upstream(s) us=... rt=request_time ...
ACCESS_RE = re.compile(r'\[([^\]]+)\] "(\S+) (\S+)[^"]*" (\d{3}) \d+ .*? up=(.*?) us=.*? rt=([\d.]+)')
AccessEntry = namedtuple("AccessEntry", "time method uri status upstream seconds")


def access_log(path, offset=0, uri=None):
    """(the text of nginx's access log from byte offset on, its entries for
    uri (all when None): AccessEntry(time (ISO 8601), method, uri, status,
    upstream (the last one tried), seconds ($request_time)))."""
    with open(path, "rb") as f:
        f.seek(offset)
        text = f.read().decode("utf-8", "replace")
    entries = []
    for line in text.splitlines():
        m = ACCESS_RE.search(line)
        if m and (uri is None or m.group(3) == uri):
            entries.append(AccessEntry(m.group(1), m.group(2), m.group(3), m.group(4),
                                       m.group(5).split(",")[-1].strip(), float(m.group(6))))
    return text, entries


# The name the tables give the answers nginx sent itself, without an instance:
# $upstream_addr is "-" (the sold-out edge's 409s, nginx's own 413, 404, 405)
# or the upstream group's name (a 502 when no instance was left to try), not
# an address.
NGINX_EDGE = "nginx-edge"


def edge_answered(base_url, timeout=10):
    """The answers nginx's sold-out edge has given since it started (GET
    /stats/edge on base_url, nginx's): the access log leaves them out. 0
    when that nginx has no edge (or does not answer)."""
    try:
        r = call(base_url, "GET", "/stats/edge", timeout=timeout)
    except KitError:
        return 0
    body = r.body if r.status == 200 and isinstance(r.body, dict) else {}
    return int((body.get("requests") or {}).get("total") or 0)


def answered_by(upstream, names=None):
    """Who answered an access-log entry whose upstream (AccessEntry.upstream)
    is this: NGINX_EDGE when nginx answered itself (no "host:port" or
    "unix:path"), else the instance's name from names ({"host:port": name}),
    else the address."""
    if ":" not in upstream:
        return NGINX_EDGE
    return (names or {}).get(upstream, upstream)


def callgrind_instructions(prefix, port, requests, status=200, path="/voucher/7/seckill"):
    """nginx's instructions per request (callgrind) on the configuration in
    prefix (its nginx.conf, with 'worker_processes auto;'), run as one process
    on port: ab -k's POSTs to path (X-User-Id: 5) after a warm-up, each of
    which must answer status. The count moves by well under 1 % between
    runs, where the CPU time of one moves by a fifth on a shared VM."""
    conf = os.path.join(prefix, "nginx.conf")
    try:
        with open(conf) as f:
            text = f.read()
    except OSError as e:
        raise KitError(f"{conf}: {e}") from None
    if "worker_processes auto;" not in text:
        raise KitError(f"{conf}: no 'worker_processes auto;' to replace")
    one = os.path.join(prefix, "nginx-callgrind.conf")
    with open(one, "w") as f:
        f.write(text.replace("worker_processes auto;", "worker_processes 1;\nmaster_process off;"))
    out = os.path.join(prefix, "callgrind.out")
    empty = os.path.join(prefix, "empty-body")
    open(empty, "w").close()
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    vg = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", nginx,
                           "-p", prefix, "-c", one, "-e", os.path.join(prefix, "error.log"),
                           "-g", "daemon off;"],
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    try:
        if not wait_port(port, 60):
            raise KitError(f"nginx under callgrind in {prefix} did not listen")
        ab = ["ab", "-q", "-k", "-c", "8", "-p", empty, "-H", "X-User-Id: 5",
              f"http://127.0.0.1:{port}{path}"]
        # A dump holds what ran since the one before: the first ends the
        # start and the warm-up, the second holds the measured requests.
        run(ab[:2] + ["-n", "200"] + ab[2:], 300)
        run(["callgrind_control", "-d", str(vg.pid)], 60)
        p = run(ab[:2] + ["-n", str(requests)] + ab[2:], 600)
        done = re.search(r"Complete requests:\s+(\d+)", p.stdout)
        non2xx = re.search(r"Non-2xx responses:\s+(\d+)", p.stdout)
        want = 0 if 200 <= status < 300 else requests
        got = int(non2xx.group(1)) if non2xx else 0
        if not done or int(done.group(1)) != requests or got != want:
            raise KitError(f"ab under callgrind: {p.stdout[-400:]}")
        run(["callgrind_control", "-d", str(vg.pid)], 60)
        try:
            with open(out + ".2") as f:
                total = [int(line.split()[1]) for line in f if line.startswith("summary:")]
        except (OSError, ValueError, IndexError) as e:
            raise KitError(f"callgrind's second dump {out}.2: {e}") from None
        if len(total) != 1:
            raise KitError(f"callgrind's second dump {out}.2: no single summary line")
        return total[0] / requests
    finally:
        vg.send_signal(signal.SIGQUIT)
        try:
            vg.wait(60)
        except subprocess.TimeoutExpired:
            vg.kill()
            vg.wait()
