#!/usr/bin/env python3
"""docker-compose.yml, Dockerfile and nginx/docker.conf: valid and consistent
with the local stack (scripts/stack.sh), without a Docker engine.

- 'docker-compose config -q' accepts the file (Debian package docker-compose),
  written in the current syntax (no top-level 'version:');
- the normalized configuration ('docker-compose config') names the services,
  the environment of the instances, ports, health checks and the schema files
  the local stack uses ('scripts/stack.sh describe' and 'instance-env');
- it scales: one 'app' service with no fixed name, host port or INSTANCE_ID
  (the hostname makes the id), nginx's upstream is the service name, health
  checks probe /ready, logs are JSON;
- Postgres keeps its data in a named volume and the schema is loaded on every
  start by a one-shot service; loading sql/schema.sql twice works;
- nginx/docker.conf is what nginx/gen-conf.sh --docker makes of the template,
  and nginx accepts it (nginx -t, upstream host names mapped to 127.0.0.1);
  the compose file's nginx is Debian's, built from the Dockerfile's stage
  'nginx' with the Lua module docker.conf loads (the sold-out edge, whose
  behaviour tests/test_edge.py checks on docker.conf itself).
- the Dockerfile's build stage installs the -dev package, and its runtime
  stage the package, of every shared library build/seckill links;
- docker-compose.ha.yml on top of it (Redis with Sentinel): valid; a master,
  two replicas of it and three Sentinels watching it (quorum 2) with a config
  file of their own; the instances wait for the Sentinels and name them in
  REDIS_SENTINELS, the master's name as the Sentinels know it;
- docker-compose.cluster.yml on top of it (Redis Cluster): valid; six
  cluster-enabled nodes announcing their service names, a one-shot service
  that joins them with redis-cli --cluster create (a replica each), and
  instances that wait for it and name nodes in REDIS_CLUSTER_NODES, with
  REDIS_URL empty.
Prints "N passed, M failed". Python 3 standard library only.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seckill_server as ss  # noqa: E402
from seckill_server import fail, test  # noqa: E402

ROOT = ss.ROOT
COMPOSE = os.path.join(ROOT, "docker-compose.yml")
COMPOSE_HA = os.path.join(ROOT, "docker-compose.ha.yml")
COMPOSE_CLUSTER = os.path.join(ROOT, "docker-compose.cluster.yml")
STACK = os.path.join(ROOT, "scripts", "stack.sh")

# Variables that change what 'docker-compose config' and the launcher print.
_SCRUB = ("ADMIN_TOKEN", "DEMO_RANDOM_USER", "LOG_LEVEL", "THREADS", "IO_THREADS", "POSTGRES_PASSWORD",
          "PG_HOST_PORT", "NGINX_PORT", "APP_PORT_BASE", "INSTANCES", "EXTERNAL_PG_DSN",
          "EXTERNAL_REDIS_URL", "LUA_DIR", "SECKILL_BIN", "COMPOSE_FILE", "COMPOSE_PROJECT_NAME")


def clean_env():
    env = dict(os.environ)
    for k in _SCRUB:
        env.pop(k, None)
    return env


def run(cmd, timeout=60, env=None):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                           env=env or clean_env())
    except FileNotFoundError:
        fail(f"{cmd[0]} not found (run 'make deps')")
    return p


# ---------------------------------------------------------------- a small YAML reader
# Enough for the block style 'docker-compose config' prints: mappings, lists
# (indented or not), plain and quoted scalars.

def _scalar(text):
    t = text.strip()
    if t in ("", "~", "null"):
        return None if t != "" else ""
    if t[0] == "'" and t[-1] == "'":
        return t[1:-1].replace("''", "'")
    if t[0] == '"' and t[-1] == '"':
        return bytes(t[1:-1], "utf-8").decode("unicode_escape")
    if t == "{}":
        return {}
    if t == "[]":
        return []
    return t


def _split_key(text):
    """'key: value' -> (key, value or None); key may be quoted."""
    m = re.match(r"""^('(?:[^']|'')*'|"[^"]*"|[^:'"][^:]*?):(?:\s+(.*))?$""", text)
    if not m:
        return None
    return _scalar(m.group(1)), m.group(2)


def _open_quote(t):
    """True when the line's value is a quoted scalar that goes on in the next
    line (long scalars are folded over several lines)."""
    body = t[2:] if t.startswith("- ") else t
    kv = _split_key(body) if not body.startswith(("'", '"')) else None
    val = (kv[1] or "") if kv else body
    val = val.strip()
    if not val or val[0] not in "'\"":
        return False
    q, i = val[0], 1
    while i < len(val):
        c = val[i]
        if q == "'" and c == "'":
            if i + 1 < len(val) and val[i + 1] == "'":
                i += 2
                continue
            return False
        if q == '"' and c == "\\":
            i += 2
            continue
        if q == '"' and c == '"':
            return False
        i += 1
    return True


def parse_yaml(text):
    lines = []
    for raw in text.splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        if lines and _open_quote(lines[-1][1]):
            # A folded line break inside a quoted scalar reads as one space.
            lines[-1] = (lines[-1][0], lines[-1][1] + " " + raw.strip())
            continue
        lines.append((len(raw) - len(raw.lstrip(" ")), raw.strip()))
    pos = [0]

    def block(indent):
        if pos[0] >= len(lines):
            return None
        ind, t = lines[pos[0]]
        if t.startswith("- ") or t == "-":
            return seq(ind)
        return mapping(ind)

    def seq(indent):
        out = []
        while pos[0] < len(lines):
            ind, t = lines[pos[0]]
            if ind != indent or not (t.startswith("- ") or t == "-"):
                break
            item = t[2:] if t.startswith("- ") else ""
            if item and _split_key(item) and not item.startswith(("'", '"')):
                # "- key: value" starts a mapping two columns in.
                lines[pos[0]] = (indent + 2, item)
                out.append(mapping(indent + 2))
            elif item == "":
                pos[0] += 1
                out.append(block(indent + 1))
            else:
                pos[0] += 1
                out.append(_scalar(item))
        return out

    def mapping(indent):
        out = {}
        while pos[0] < len(lines):
            ind, t = lines[pos[0]]
            if ind != indent or t.startswith("- "):
                break
            kv = _split_key(t)
            if kv is None:
                raise ValueError(f"cannot parse line {t!r}")
            key, val = kv
            pos[0] += 1
            if val is None or val == "":
                if pos[0] < len(lines):
                    nind, nt = lines[pos[0]]
                    if nind > indent or (nind == indent and nt.startswith("- ")):
                        out[key] = block(nind)
                        continue
                out[key] = None
            else:
                out[key] = _scalar(val)
        return out

    return block(0)


# ---------------------------------------------------------------- fixtures

_cache = {}


def compose():
    if "compose" not in _cache:
        p = run(["docker-compose", "-f", COMPOSE, "config"])
        if p.returncode != 0:
            fail(f"docker-compose config failed ({p.returncode}): {p.stderr.strip()}")
        _cache["compose"] = parse_yaml(p.stdout)
    return _cache["compose"]


def describe():
    if "describe" not in _cache:
        p = run([STACK, "describe"])
        if p.returncode != 0:
            fail(f"stack.sh describe failed: {p.stderr.strip()}")
        d = {}
        for line in p.stdout.splitlines():
            k, _, v = line.partition("=")
            d[k] = v
        _cache["describe"] = d
    return _cache["describe"]


def services():
    return compose().get("services") or {}


def app_service():
    """The one service built from the repository's server image (the
    instances: --scale); nginx is built from the Dockerfile's stage 'nginx'."""
    apps = {n: sv for n, sv in services().items()
            if sv.get("build") and (sv.get("build") or {}).get("target") != "nginx"}
    if list(apps) != ["app"]:
        fail(f"expected exactly one built service named 'app' (scaled with --scale), got {sorted(apps)}")
    return apps["app"]


def health_test(svc):
    hc = svc.get("healthcheck") or {}
    t = hc.get("test")
    if isinstance(t, list):
        return " ".join(str(x) for x in t)
    return str(t or "")


def dsn_fields(dsn):
    return dict(kv.split("=", 1) for kv in dsn.split() if "=" in kv)


def server_env_names():
    """Environment names the server knows, from 'seckill --help'."""
    if not os.access(ss.SECKILL_BIN, os.X_OK):
        return None
    p = run([ss.SECKILL_BIN, "--help"], timeout=10)
    return set(re.findall(r"^\s{2}([A-Z][A-Z0-9_]+)\s", p.stdout + p.stderr, re.M))


# ---------------------------------------------------------------- tests

@test
def compose_config_is_valid():
    p = run(["docker-compose", "-f", COMPOSE, "config", "-q"])
    if p.returncode != 0:
        fail(f"docker-compose config -q: exit {p.returncode}: {p.stderr.strip()}")
    # Also with every variable set, as a user would.
    env = clean_env()
    env.update(ADMIN_TOKEN="secret", DEMO_RANDOM_USER="1", THREADS="4", LOG_LEVEL="info")
    p = run(["docker-compose", "-f", COMPOSE, "config", "-q"], env=env)
    if p.returncode != 0:
        fail(f"docker-compose config -q with variables set: {p.stderr.strip()}")
    # The current Compose specification: no top-level version.
    raw = parse_yaml(open(COMPOSE).read())
    if "version" in raw or "services" not in raw:
        fail(f"docker-compose.yml should start at services: (no 'version:'), has {sorted(raw)}")


@test
def compose_has_postgres_redis_schema_app_and_nginx():
    svcs = services()
    for name, image in (("postgres", "postgres:15"), ("redis", "redis:7"), ("nginx", "seckill-nginx"),
                        ("schema", "postgres:15")):
        if name not in svcs:
            fail(f"service {name} missing: {sorted(svcs)}")
        if not str(svcs[name].get("image", "")).startswith(image):
            fail(f"service {name}: image {svcs[name].get('image')!r}, want {image}*")
    app = app_service()
    ctx = (app.get("build") or {}).get("context")
    if os.path.realpath(str(ctx)) != os.path.realpath(ROOT):
        fail(f"app: build context {ctx!r} is not the repository")
    if (app.get("build") or {}).get("target"):
        fail("app: builds the Dockerfile's last stage (the runtime), no target")
    build = svcs["nginx"].get("build") or {}
    if os.path.realpath(str(build.get("context"))) != os.path.realpath(ROOT) or build.get("target") != "nginx":
        fail(f"nginx: built from the repository's Dockerfile, target 'nginx': {build}")

    def cond(svc, dep):
        return ((svcs[svc].get("depends_on") or {}).get(dep) or {}).get("condition")

    for svc, dep, want in (("nginx", "app", "service_healthy"),
                           ("app", "redis", "service_healthy"),
                           ("app", "schema", "service_completed_successfully"),
                           ("schema", "postgres", "service_healthy")):
        if cond(svc, dep) != want:
            fail(f"{svc} must wait for {dep} ({want}): {svcs[svc].get('depends_on')}")


@test
def app_scales_with_the_service_name():
    app = app_service()
    for key in ("container_name", "hostname", "ports"):
        if app.get(key):
            fail(f"app sets {key} ({app[key]!r}): two replicas would clash")
    if "INSTANCE_ID" in (app.get("environment") or {}):
        fail("app sets INSTANCE_ID: every replica would share it (the hostname makes it)")
    replicas = str((app.get("deploy") or {}).get("replicas", "1"))
    if not replicas.isdigit() or int(replicas) < 2:
        fail(f"app should default to two or more replicas: deploy.replicas {replicas!r}")
    conf = open(os.path.join(ROOT, "nginx", "docker.conf")).read()
    upstreams = re.findall(r"^\s*server\s+([\w.-]+:\d+)", conf, re.M)
    want = [f"app:{app['environment']['PORT']}"]
    if upstreams != want:
        fail(f"docker.conf upstreams {upstreams}: want the service name only, {want}")


@test
def instances_have_the_local_stacks_environment_names():
    want = describe()["INSTANCE_ENV_NAMES"].split()
    if not {"PORT", "BIND", "INSTANCE_ID", "PG_DSN", "REDIS_URL", "ADMIN_TOKEN"} <= set(want):
        fail(f"stack.sh instance env lacks the spec's names: {want}")
    known = server_env_names()
    env = app_service().get("environment") or {}
    # The local stack's names, but INSTANCE_ID (from the hostname here);
    # more only when the server knows them (LOG_FORMAT).
    missing = set(want) - {"INSTANCE_ID"} - set(env)
    if missing:
        fail(f"app: environment lacks the local stack's {sorted(missing)}")
    extra = set(env) - set(want)
    if known is not None and not extra <= known:
        fail(f"app: names unknown to seckill --help: {sorted(extra - known)}")
    if env.get("BIND") != "0.0.0.0":
        fail(f"app: BIND must be 0.0.0.0 inside a container, got {env.get('BIND')!r}")
    if env.get("LOG_FORMAT") != "json":
        fail(f"app: LOG_FORMAT should be json (one JSON object a line): {env.get('LOG_FORMAT')!r}")
    if env.get("DEMO_RANDOM_USER") not in ("0", None, ""):
        fail(f"app: DEMO_RANDOM_USER must default to off, got {env.get('DEMO_RANDOM_USER')!r}")
    if env.get("ADMIN_TOKEN") not in ("", None):
        fail("app: ADMIN_TOKEN must default to empty (admin disabled)")


@test
def instances_reach_postgres_and_redis_services():
    svcs = services()
    db = describe()["DB_NAME"]
    pg_env = svcs["postgres"].get("environment") or {}
    if pg_env.get("POSTGRES_DB") != db:
        fail(f"POSTGRES_DB {pg_env.get('POSTGRES_DB')!r} differs from the local stack's database {db!r}")
    env = app_service()["environment"]
    f = dsn_fields(env["PG_DSN"])
    if f.get("host") != "postgres" or f.get("port") != "5432" or f.get("dbname") != db:
        fail(f"app: PG_DSN {env['PG_DSN']!r} should name host=postgres port=5432 dbname={db}")
    if f.get("password") != pg_env.get("POSTGRES_PASSWORD"):
        fail("app: PG_DSN password differs from POSTGRES_PASSWORD")
    if not re.fullmatch(r"redis://redis:6379(/\d+)?", env["REDIS_URL"]):
        fail(f"app: REDIS_URL {env['REDIS_URL']!r} should be redis://redis:6379/0")


def mounts(svc):
    """[(source relative to the repository or volume name, target)]."""
    out = []
    for v in svc.get("volumes") or []:
        if isinstance(v, str):
            parts = v.split(":")
            src, dst = parts[0], parts[1]
        else:
            src, dst = v.get("source"), v.get("target")
        if src.startswith("/"):
            src = os.path.relpath(os.path.realpath(src), os.path.realpath(ROOT))
        out.append((src, dst))
    return out


@test
def postgres_keeps_its_data_in_a_named_volume():
    data = [src for src, dst in mounts(services()["postgres"]) if dst == "/var/lib/postgresql/data"]
    if len(data) != 1 or "/" in data[0]:
        fail(f"postgres should mount a named volume at /var/lib/postgresql/data: {data}")
    if data[0] not in (compose().get("volumes") or {}):
        fail(f"volume {data[0]} is not declared under the top-level volumes:")


@test
def schema_is_loaded_on_every_start_with_the_local_stacks_files():
    want = describe()["SCHEMA_FILES"].split()
    sch = services()["schema"]
    mounted = dict(mounts(sch))            # source -> target
    cmd = sch.get("command") or []
    if not isinstance(cmd, list) or cmd[:1] != ["psql"] or "ON_ERROR_STOP=1" not in cmd:
        fail(f"schema should run psql with ON_ERROR_STOP=1: {cmd}")
    files = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-f"]
    if [f for f in files] != [mounted.get(w) for w in want]:
        fail(f"schema runs {files}; the local stack loads {want}, mounted as {mounted}")
    if str(sch.get("restart", "no")) != "no":
        fail(f"schema is a one-shot job: restart {sch.get('restart')!r}")
    env = sch.get("environment") or {}
    if env.get("PGPASSWORD") != (services()["postgres"].get("environment") or {}).get("POSTGRES_PASSWORD"):
        fail("schema's PGPASSWORD differs from POSTGRES_PASSWORD")
    for f in want:
        if not os.path.isfile(os.path.join(ROOT, f)):
            fail(f"{f} does not exist")


@test
def schema_files_load_twice():
    # What the schema service does on every start, against the tests' Postgres.
    if not ss.PG_DSN:
        fail("PG_DSN is not set (run through tests/run.sh)")
    db = f"seckill_schema_twice_{os.getpid()}"
    ss.psql(f"CREATE DATABASE {db}")
    try:
        dsn = re.sub(r"dbname=\S+", f"dbname={db}", ss.PG_DSN)
        for attempt in (1, 2):
            for f in describe()["SCHEMA_FILES"].split():
                p = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f",
                                    os.path.join(ROOT, f)], capture_output=True, text=True, timeout=60)
                if p.returncode != 0:
                    fail(f"loading {f} a {'second' if attempt == 2 else 'first'} time: {p.stderr.strip()}")
    finally:
        ss.psql(f"DROP DATABASE IF EXISTS {db}")


@test
def ports_match_the_local_stack_and_nginx_conf():
    d = describe()
    svcs = services()
    ports = svcs["nginx"].get("ports") or []
    pubs = []
    for p in ports:
        if isinstance(p, dict):
            pubs.append((p.get("host_ip"), str(p.get("published")), str(p.get("target"))))
        else:
            parts = str(p).split("/")[0].split(":")
            if len(parts) == 3:
                pubs.append((parts[0], parts[1], parts[2]))
            else:
                fail(f"nginx port {p!r}: publish on 127.0.0.1 only (HOST_IP:PORT:PORT)")
    if len(pubs) != 1 or pubs[0][0] != "127.0.0.1" or pubs[0][1] != d["NGINX_PORT"]:
        fail(f"nginx must publish 127.0.0.1:{d['NGINX_PORT']} (the local stack's NGINX_PORT): {pubs}")
    conf = open(os.path.join(ROOT, "nginx", "docker.conf")).read()
    listen = re.findall(r"^\s*listen\s+(\S+)", conf, re.M)
    if [x.split(":")[-1] for x in listen] != [pubs[0][2]]:
        fail(f"docker.conf listens on {listen}, nginx publishes container port {pubs[0][2]}")
    for name in ("postgres", "redis"):
        for p in svcs[name].get("ports") or []:
            if not str(p).startswith("127.0.0.1:"):
                fail(f"{name} publishes {p!r} beyond loopback")


@test
def health_check_commands_parse():
    # The nginx check is a long shell line that 'docker-compose config' folds.
    t = (services()["nginx"].get("healthcheck") or {}).get("test")
    if not isinstance(t, list) or t[:3] != ["CMD", "bash", "-c"]:
        fail(f"nginx health check: {t!r}")
    p = subprocess.run(["bash", "-n", "-c", t[3]], capture_output=True, text=True, timeout=10)
    if p.returncode != 0 or "GET /health HTTP/1.0\\r\\n" not in t[3]:
        fail(f"nginx health check is not valid bash: {t[3]!r}: {p.stderr}")


@test
def health_checks_probe_readiness_where_it_is_meant():
    svcs = services()
    port = app_service()["environment"]["PORT"]
    # app: healthy = ready (nginx waits on it); nginx: it answers and passes
    # requests on (liveness through it); the servers: their own probes.
    checks = {"postgres": "pg_isready", "redis": "redis-cli ping", "nginx": "/health",
              "app": f"127.0.0.1:{port}/ready"}
    for name, s in svcs.items():
        if name == "schema":
            if s.get("healthcheck"):
                fail("schema is a one-shot job: no health check")
            continue
        t = health_test(s)
        want = checks.get(name)
        if want is None or want not in t:
            fail(f"{name}: health check {t!r} should use {want}")
    df = open(os.path.join(ROOT, "Dockerfile")).read()
    hc = re.search(r"^HEALTHCHECK .*\n(?:.*\n)*?.*CMD (.*)$", df, re.M)
    if not hc or "/ready" not in hc.group(1):
        fail(f"Dockerfile HEALTHCHECK should probe /ready: {hc.group(1) if hc else None!r}")


@test
def docker_conf_is_generated_from_the_template():
    port = app_service()["environment"]["PORT"]
    for args in ([], ["--upstream", f"app:{port}"]):
        p = run([os.path.join(ROOT, "nginx", "gen-conf.sh"), "--docker", *args])
        if p.returncode != 0:
            fail(f"gen-conf.sh --docker failed: {p.stderr.strip()}")
        have = open(os.path.join(ROOT, "nginx", "docker.conf")).read()
        if p.stdout != have:
            fail("nginx/docker.conf is not what nginx/gen-conf.sh --docker makes of the template:"
                 " run 'make nginx-docker-conf'")
    vols = services()["nginx"].get("volumes") or []
    if not any(str(v).endswith("nginx/docker.conf:/etc/nginx/nginx.conf:ro") for v in vols):
        fail(f"nginx must mount nginx/docker.conf at /etc/nginx/nginx.conf: {vols}")
    geo = re.search(r"geo \$seckill_ops_client \{(.*?)\}", have, re.S)
    if not geo or "127.0.0.0/8 1;" not in geo.group(1) or "default 0;" not in geo.group(1):
        fail("docker.conf must serve /admin, /metrics and /stats to an allow-list only")


@test
def docker_conf_passes_nginx_t():
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if nginx is None:
        fail("nginx not found (run 'make deps')")
    conf = open(os.path.join(ROOT, "nginx", "docker.conf")).read()
    with tempfile.TemporaryDirectory(dir=ss.TEST_TMP) as d:
        # Names that only resolve inside compose's network, and container paths.
        conf = re.sub(r"\bserver\s+app:", "server 127.0.0.1:", conf)
        conf = conf.replace("pid /tmp/nginx.pid;", f"pid {d}/nginx.pid;")
        conf = re.sub(r"(_temp_path\s+)/tmp/", rf"\g<1>{d}/", conf)
        path = os.path.join(d, "nginx.conf")
        with open(path, "w") as f:
            f.write(conf)
        p = run([nginx, "-t", "-q", "-p", d, "-c", path, "-e", os.path.join(d, "error.log")])
        if p.returncode != 0:
            fail(f"nginx -t rejects docker.conf: {p.stderr.strip()}")


@test
def dockerfile_builds_like_the_makefile():
    df = open(os.path.join(ROOT, "Dockerfile")).read()
    mk = open(os.path.join(ROOT, "Makefile")).read()
    if not re.search(r"^FROM debian:bookworm\b", df, re.M):
        fail("Dockerfile must build FROM debian:bookworm")
    deb = re.search(r"^DEB_PKGS\s*:=\s*((?:.*\\\n)*.*)", mk, re.M)
    deb_pkgs = set(deb.group(1).replace("\\\n", " ").split()) if deb else set()
    for pkg in ("libmicrohttpd-dev", "libhiredis-dev", "libpq-dev", "libcjson-dev", "build-essential"):
        if pkg not in df:
            fail(f"Dockerfile does not install {pkg}")
        if pkg not in deb_pkgs:
            fail(f"Makefile DEB_PKGS lacks {pkg}")
    if not re.search(r"^\s*(ENV\s+)?LUA_DIR=/app/lua\b", df, re.M) or "COPY lua/ /app/lua/" not in df:
        fail("Dockerfile must copy lua/ to /app/lua and set LUA_DIR=/app/lua")
    if "make" not in df or "build/seckill" not in df:
        fail("Dockerfile must build build/seckill with make")
    if not re.search(r"^COPY .*\bVERSION\b", df, re.M):
        fail("Dockerfile must copy VERSION (no .git in the build context: --version reads it)")
    if app_service()["environment"].get("LUA_DIR") != "/app/lua":
        fail(f"app sets LUA_DIR {app_service()['environment'].get('LUA_DIR')!r}, the image has /app/lua")


def stage_packages(df, name):
    """The packages that a Dockerfile stage's apt-get install names: the
    stage 'AS name', or the last stage when name is None."""
    stages = re.split(r"^(?=FROM )", df, flags=re.M)[1:]
    stage = stages[-1] if name is None else next(
        (s for s in stages if re.match(rf"FROM \S+ AS {name}\n", s)), "")
    pkgs = set()
    for m in re.finditer(r"apt-get install((?:[^&\\]|\\\n)*)", stage):
        pkgs |= {w for w in m.group(1).replace("\\\n", " ").split() if not w.startswith("-")}
    return pkgs


def package_of(path):
    """The Debian package that ships path itself (dpkg -S; its directory
    resolved, as /lib is /usr/lib here), or None."""
    p = run(["dpkg", "-S", os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))])
    return p.stdout.split(":")[0] if p.returncode == 0 else None


@test
def docker_stages_install_the_libraries_the_binary_links():
    """Every shared library build/seckill needs (its ELF NEEDED entries, as
    the linker resolved them here): the runtime stage installs the package
    that ships it, the build stage the package that ships its link-time .so
    (the -dev package). The C library and the compilers' runtimes come with
    the base image and build-essential."""
    df = open(os.path.join(ROOT, "Dockerfile")).read()
    build, runtime = stage_packages(df, "build"), stage_packages(df, None)
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(\S+)\]",
                        run(["readelf", "-d", ss.SECKILL_BIN]).stdout)
    resolved = dict(re.findall(r"^\s*(\S+) => (/\S+)", run(["ldd", ss.SECKILL_BIN]).stdout, re.M))
    if not needed or not resolved:
        fail(f"cannot read the libraries of {ss.SECKILL_BIN}")
    base = re.compile(r"^(libc6|libgcc-s1|libstdc\+\+6|lib[a-z]*san\d*)(:\S+)?$")
    checked = 0
    for lib in needed:
        pkg = package_of(resolved.get(lib, lib))
        if pkg is None or base.match(pkg):
            continue
        checked += 1
        if pkg.split(":")[0] not in runtime:
            fail(f"{lib} ({pkg}): the Dockerfile's runtime stage does not install it")
        stem = re.sub(r"\.so\..*", ".so", resolved[lib])
        dev = package_of(stem) if os.path.exists(stem) else None
        if dev is None or dev.split(":")[0] not in build:
            fail(f"{lib}: the Dockerfile's build stage does not install {dev or 'its -dev package'}")
    if checked < 5:
        fail(f"only {checked} of the binary's libraries checked: {needed}")


@test
def compose_nginx_has_the_edges_lua_module():
    """docker.conf loads Debian's Lua module (the sold-out edge) from where
    Debian's package puts it; the Dockerfile's nginx stage and make deps
    install that package."""
    df = open(os.path.join(ROOT, "Dockerfile")).read()
    stage = re.search(r"^FROM debian:bookworm\S* AS nginx\n(.*?)(?=^FROM |\Z)", df, re.M | re.S)
    if not stage:
        fail("Dockerfile has no stage 'nginx' FROM debian:bookworm")
    for pkg in ("nginx", "libnginx-mod-http-lua"):
        if not re.search(rf"\s{re.escape(pkg)}(\s|$)", stage.group(1)):
            fail(f"the Dockerfile's nginx stage does not install {pkg}")
    if not re.search(r"^CMD .*nginx.*daemon off", stage.group(1), re.M):
        fail("the Dockerfile's nginx stage must run nginx in the foreground")
    if not re.search(r"^FROM .*\n(?:.*\n)*?.*\bseckill\b", df[stage.end():], re.M):
        fail("the server's runtime must stay the Dockerfile's last stage")
    mk = open(os.path.join(ROOT, "Makefile")).read()
    deb = re.search(r"^DEB_PKGS\s*:=\s*((?:.*\\\n)*.*)", mk, re.M)
    if "libnginx-mod-http-lua" not in (deb.group(1).split() if deb else []):
        fail("Makefile DEB_PKGS lacks libnginx-mod-http-lua")
    conf = open(os.path.join(ROOT, "nginx", "docker.conf")).read()
    mods = re.findall(r"^load_module\s+(\S+);", conf, re.M)
    if [os.path.basename(m) for m in mods] != ["ndk_http_module.so", "ngx_http_lua_module.so"]:
        fail(f"docker.conf loads {mods}")
    if "lua_shared_dict seckill_edge" not in conf or "access_by_lua_block" not in conf:
        fail("docker.conf lacks the sold-out edge")
    p = run(["dpkg", "-L", "libnginx-mod-http-lua", "libnginx-mod-http-ndk"])
    if p.returncode != 0:
        fail(f"dpkg -L: {p.stderr.strip()} (run 'make deps')")
    for m in mods:
        if m not in p.stdout.split():
            fail(f"docker.conf loads {m}, which Debian's packages do not install")


@test
def yaml_reader_self_check():
    doc = parse_yaml("a:\n  b: '1'\n  c:\n  - x\n  - 'y z'\n  d:\n    - k: v\n      m: n\ne: \"no\"\n"
                     "f:\n- 'it''s long\n  and folded'\n- g\nh: 'x: y'\n")
    want = {"a": {"b": "1", "c": ["x", "y z"], "d": [{"k": "v", "m": "n"}]}, "e": "no",
            "f": ["it's long and folded", "g"], "h": "x: y"}
    if doc != want:
        fail(f"parse_yaml: {doc!r} != {want!r}")


# ---------------------------------------------------------------- Redis with Sentinel

def compose_ha():
    if "ha" not in _cache:
        p = run(["docker-compose", "-f", COMPOSE, "-f", COMPOSE_HA, "config"])
        if p.returncode != 0:
            fail(f"docker-compose -f docker-compose.yml -f docker-compose.ha.yml config: "
                 f"{p.stderr.strip()}")
        _cache["ha"] = parse_yaml(p.stdout)
    return _cache["ha"]


@test
def ha_override_is_valid_and_complete():
    svcs = compose_ha().get("services") or {}
    want = {"redis", "redis-replica-1", "redis-replica-2", "sentinel-1", "sentinel-2",
            "sentinel-3", "app", "nginx", "postgres", "schema",
            "pg-monitor", "postgres-2", "postgres-3"}
    if set(svcs) != want:
        fail(f"services with the HA override: {sorted(svcs)}, want {sorted(want)}")
    for r in ("redis-replica-1", "redis-replica-2"):
        cmd = " ".join(str(x) for x in svcs[r].get("command") or [])
        if "--replicaof redis 6379" not in cmd or "redis-server" not in cmd:
            fail(f"{r} is not a replica of redis: {cmd}")
        if not str(svcs[r].get("image", "")).startswith("redis:7"):
            fail(f"{r}: image {svcs[r].get('image')}")
    script = open(os.path.join(ROOT, "scripts", "compose-sentinel.sh")).read()
    # Sentinel rewrites its config file: one of its own, written at start.
    if not re.search(r'cat >"\$conf"', script) or \
            'exec redis-server "$conf" --sentinel' not in script or \
            "sentinel monitor $1 $2 $3 $4" not in script or "port ${SENTINEL_PORT:-26379}" not in script:
        fail("scripts/compose-sentinel.sh does not write a config file of its own and run Sentinel on it")
    monitor = None
    for n in ("sentinel-1", "sentinel-2", "sentinel-3"):
        cmd = [str(x) for x in svcs[n].get("command") or []]
        if cmd[:2] != ["sh", "/seckill/compose-sentinel.sh"] or len(cmd) != 8 or \
                cmd[3:6] != ["redis", "6379", "2"]:
            fail(f"{n} does not watch redis:6379 with quorum 2: {cmd}")
        vols = " ".join(str(v) for v in svcs[n].get("volumes") or [])
        if "compose-sentinel.sh" not in vols:
            fail(f"{n} does not mount scripts/compose-sentinel.sh: {vols}")
        if "26379" not in health_test(svcs[n]):
            fail(f"{n}: health check {health_test(svcs[n])!r}")
        monitor = cmd[2]
    app = svcs["app"]
    env = app.get("environment") or {}
    sentinels = sorted(x.strip() for x in str(env.get("REDIS_SENTINELS", "")).split(","))
    if sentinels != ["sentinel-1:26379", "sentinel-2:26379", "sentinel-3:26379"]:
        fail(f"app: REDIS_SENTINELS {env.get('REDIS_SENTINELS')!r}")
    if env.get("REDIS_MASTER_NAME") != monitor:
        fail(f"app: REDIS_MASTER_NAME {env.get('REDIS_MASTER_NAME')!r}, the Sentinels watch {monitor!r}")
    deps = app.get("depends_on") or {}
    for n in ("sentinel-1", "sentinel-2", "sentinel-3", "schema"):
        if n not in deps:
            fail(f"app does not wait for {n}: {sorted(deps)}")
    known = server_env_names()
    if known is not None and not set(env) <= known:
        fail(f"app: names unknown to seckill --help: {sorted(set(env) - known)}")
    # Postgres under pg_auto_failover: a monitor, three data nodes of the
    # Dockerfile's 'pgaf' stage, each registered with the monitor, and the
    # instances and the schema on a read-write multi-host URI.
    mcmd = " ".join(str(x) for x in svcs["pg-monitor"].get("command") or [])
    if not mcmd.startswith("pg_autoctl create monitor") or "--run" not in mcmd:
        fail(f"pg-monitor: {mcmd}")
    for n in ("postgres", "postgres-2", "postgres-3"):
        build = svcs[n].get("build") or {}
        if not isinstance(build, dict) or build.get("target") != "pgaf":
            fail(f"{n}: not built from the Dockerfile's pgaf stage: {build}")
        cmd = " ".join(str(x) for x in svcs[n].get("command") or [])
        if not cmd.startswith("pg_autoctl create postgres") or f"--hostname {n}" not in cmd or \
                "--monitor postgres://autoctl_node@pg-monitor:5432/pg_auto_failover" not in cmd or \
                "--dbname seckill" not in cmd or "--run" not in cmd:
            fail(f"{n} is not a pg_auto_failover data node of pg-monitor: {cmd}")
    uri = "postgres:5432,postgres-2:5432,postgres-3:5432/seckill?target_session_attrs=read-write"
    if uri not in str(env.get("PG_DSN", "")) or str(env.get("PG_HA")) != "1":
        fail(f"app: PG_DSN {env.get('PG_DSN')!r}, PG_HA {env.get('PG_HA')!r}")
    if uri not in " ".join(str(x) for x in svcs["schema"].get("command") or []):
        fail(f"schema does not load through the multi-host URI: {svcs['schema'].get('command')}")
    if "pgaf" not in stage_names(open(os.path.join(ROOT, "Dockerfile")).read()) or \
            "postgresql-15-auto-failover" not in stage_packages(
                open(os.path.join(ROOT, "Dockerfile")).read(), "pgaf"):
        fail("the Dockerfile has no stage 'pgaf' installing postgresql-15-auto-failover")


@test
def cluster_override_is_valid_and_complete():
    p = run(["docker-compose", "-f", COMPOSE, "-f", COMPOSE_CLUSTER, "config"])
    if p.returncode != 0:
        fail(f"docker-compose -f docker-compose.yml -f docker-compose.cluster.yml config: "
             f"{p.stderr.strip()}")
    svcs = parse_yaml(p.stdout).get("services") or {}
    nodes = ["redis"] + [f"redis-{i}" for i in range(2, 7)]
    want = set(nodes) | {"redis-cluster", "app", "nginx", "postgres", "schema"}
    if set(svcs) != want:
        fail(f"services with the cluster override: {sorted(svcs)}, want {sorted(want)}")
    for n in nodes:
        cmd = " ".join(str(x) for x in svcs[n].get("command") or [])
        if "--cluster-enabled yes" not in cmd or f"--cluster-announce-hostname {n}" not in cmd or \
                "--cluster-preferred-endpoint-type hostname" not in cmd:
            fail(f"{n} is not a cluster node announcing its name: {cmd}")
        if not str(svcs[n].get("image", "")).startswith("redis:7"):
            fail(f"{n}: image {svcs[n].get('image')}")
    create = " ".join(str(x) for x in svcs["redis-cluster"].get("command") or [])
    if "redis-cli --cluster create" not in create or "--cluster-replicas 1" not in create or \
            any(f"{n}:6379" not in create for n in nodes):
        fail(f"redis-cluster does not join the six nodes with a replica each: {create}")
    deps = svcs["redis-cluster"].get("depends_on") or {}
    if set(deps) != set(nodes):
        fail(f"redis-cluster waits for {sorted(deps)}, not the six nodes")
    app = svcs["app"]
    env = app.get("environment") or {}
    seeds = [x.strip() for x in str(env.get("REDIS_CLUSTER_NODES", "")).split(",") if x.strip()]
    if not seeds or any(x.split(":")[0] not in nodes or x.split(":")[-1] != "6379" for x in seeds):
        fail(f"app: REDIS_CLUSTER_NODES {env.get('REDIS_CLUSTER_NODES')!r}")
    if env.get("REDIS_URL") not in ("", None) or "REDIS_SENTINELS" in env:
        fail(f"app: REDIS_URL {env.get('REDIS_URL')!r} and REDIS_SENTINELS "
             f"{env.get('REDIS_SENTINELS')!r} must be empty with a cluster")
    if "redis-cluster" not in (app.get("depends_on") or {}):
        fail(f"app does not wait for redis-cluster: {sorted(app.get('depends_on') or {})}")
    known = server_env_names()
    if known is not None and not set(env) <= known:
        fail(f"app: names unknown to seckill --help: {sorted(set(env) - known)}")


def stage_names(df):
    return re.findall(r"^FROM \S+ AS (\S+)", df, flags=re.M)


@test
def compose_sentinel_script_runs_a_sentinel():
    """scripts/compose-sentinel.sh for real (its port and file moved to free
    ones): it watches a throwaway master and names it."""
    if shutil.which("redis-server") is None:
        fail("redis-server not found (make deps)")
    master = ss.RedisServer().start()
    port = ss.free_port()
    conf = os.path.join(ss.TEST_TMP, f"compose-sentinel-{port}.conf")
    env = clean_env()
    env.update(SENTINEL_PORT=str(port), SENTINEL_CONF=conf)
    p = subprocess.Popen(["sh", os.path.join(ROOT, "scripts", "compose-sentinel.sh"), "seckill",
                          "127.0.0.1", str(master.port), "1", "5000", "10000"], env=env,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    ss.register_pid(p.pid)
    try:
        deadline = time.monotonic() + 10
        got = ""
        while time.monotonic() < deadline:
            try:
                got = ss.redis(["SENTINEL", "get-master-addr-by-name", "seckill"],
                               url=f"redis://127.0.0.1:{port}", timeout=2)
                if got.split() == ["127.0.0.1", str(master.port)]:
                    break
            except AssertionError:
                pass
            time.sleep(0.1)
        else:
            fail(f"the Sentinel does not name the master: {got!r}")
        text = open(conf).read()
        if "sentinel monitor seckill 127.0.0.1" not in text or f"port {port}" not in text:
            fail(f"its config file: {text[:300]!r}")
    finally:
        p.kill()
        p.wait(timeout=5)
        ss.unregister_pid(p.pid)
        master.kill()


if __name__ == "__main__":
    ss.main()
