# scripts/pg-lib.sh: finding and running the Postgres server binaries, for
# scripts/stack.sh and tests/run.sh (sourced; the caller defines die).

# The directory of initdb/pg_ctl/postgres: $PG_BIN, else Debian's 15, else
# the newest under /usr/lib/postgresql.
find_pg_bin() {
    if [[ -n "${PG_BIN:-}" ]]; then
        echo "$PG_BIN"
        return
    fi
    if [[ -x /usr/lib/postgresql/15/bin/initdb ]]; then
        echo /usr/lib/postgresql/15/bin
        return
    fi
    local d
    d=$(printf '%s\n' /usr/lib/postgresql/*/bin | grep -v '\*' | sort -V | tail -n 1 || true)
    [[ -n "$d" ]] || die "no Postgres server binaries in /usr/lib/postgresql (run 'make deps')"
    echo "$d"
}

# Runs a Postgres server binary as the 'postgres' user when we are root
# (initdb and postgres refuse to run as root), directly otherwise.
as_pg() {
    if [[ $(id -u) -eq 0 ]]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}
