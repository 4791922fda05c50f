# The seckill server. Build and run with docker-compose.yml (docker compose up --build).
#
# Stage 1 builds build/seckill with the Makefile, as on a Debian 12 machine;
# the last stage is the runtime: the binary, the Lua scripts (LUA_DIR) and the
# shared libraries only. Configuration by environment, as everywhere:
# PORT, BIND, INSTANCE_ID, PG_DSN, REDIS_URL, ADMIN_TOKEN, ... (seckill --help).
# The version (seckill --version) comes from the VERSION file: the build
# context has no .git.
FROM debian:bookworm AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        build-essential make pkg-config \
        libmicrohttpd-dev libhiredis-dev libpq-dev libcjson-dev libzookeeper-mt-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Makefile VERSION ./
COPY mk/ mk/
COPY app/ app/
RUN make -j"$(nproc)" build/seckill

# nginx for docker-compose.yml (target 'nginx'): Debian's, with its Lua
# module for the sold-out edge (nginx/nginx.conf.tmpl), as 'make deps'
# installs it on a machine. Its configuration, nginx/docker.conf, is mounted.
FROM debian:bookworm-slim AS nginx
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        nginx libnginx-mod-http-lua \
 && rm -rf /var/lib/apt/lists/*
EXPOSE 8080
STOPSIGNAL SIGQUIT
CMD ["nginx", "-c", "/etc/nginx/nginx.conf", "-g", "daemon off;"]

# pg_auto_failover for docker-compose.ha.yml (target 'pgaf'): Debian's
# packages, as 'make deps' installs them; pg_autoctl runs as postgres.
FROM debian:bookworm-slim AS pgaf
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        postgresql-15-auto-failover pg-auto-failover-cli \
 && rm -rf /var/lib/apt/lists/*
ENV PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config PGDATA=/var/lib/postgresql/data/pgaf
USER postgres
WORKDIR /var/lib/postgresql

# The server's runtime: the last stage, what 'docker build .' makes.
FROM debian:bookworm-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libmicrohttpd12 libhiredis0.14 libpq5 libcjson1 libzookeeper-mt2 curl ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --no-create-home --shell /usr/sbin/nologin seckill
COPY --from=build /src/build/seckill /usr/local/bin/seckill
COPY lua/ /app/lua/
COPY sql/ /app/sql/
WORKDIR /app
ENV LUA_DIR=/app/lua \
    BIND=0.0.0.0 \
    PORT=8080
USER seckill
EXPOSE 8080
STOPSIGNAL SIGTERM
# Healthy = ready to serve: Postgres and Redis answer (GET /health is liveness).
HEALTHCHECK --interval=5s --timeout=2s --start-period=5s --retries=5 \
    CMD curl -fsS "http://127.0.0.1:${PORT}/ready" || exit 1
ENTRYPOINT ["/usr/local/bin/seckill"]
