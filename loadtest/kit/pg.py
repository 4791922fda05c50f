"""psql() and psql_value(): SQL on stdin to the psql client, rows of strings,
a timeout."""

import subprocess

from .base import KitError


def psql(dsn, sql, timeout=60):
    """Runs SQL (on stdin, so it may be long and hold several statements, each
    its own transaction; the first error stops it) against dsn; returns the
    rows of every result as lists of strings. KitError when psql fails."""
    cmd = ["psql", "-X", "-q", "-A", "-t", "-F", "\t", "-v", "ON_ERROR_STOP=1",
           "-d", dsn, "-f", "-"]
    try:
        p = subprocess.run(cmd, input=sql, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise KitError("psql not found (apt-get install postgresql-client)") from None
    except subprocess.TimeoutExpired:
        raise KitError(f"psql did not answer within {timeout}s") from None
    if p.returncode != 0:
        raise KitError(f"psql failed: {p.stderr.strip()}")
    return [line.split("\t") for line in p.stdout.splitlines() if line != ""]


def psql_value(dsn, sql, timeout=60):
    """The one value sql returns (a string); KitError unless exactly one."""
    rows = psql(dsn, sql, timeout)
    if len(rows) != 1 or len(rows[0]) != 1:
        raise KitError(f"expected one value from {sql!r}, got {rows!r}")
    return rows[0][0]


def commit_waits(dsn, timeout=1.5):
    """Does a commit on dsn's server wait for a synchronous standby now? A
    probe transaction (a transactional logical message, no table touched)
    in a psql of its own: still waiting after 'timeout' s, it does. The
    probe is then cancelled (its commit stays local; nobody was told of
    it). For checks where the standbys are stopped on purpose."""
    p = subprocess.Popen(["psql", "-X", "-q", "-d", dsn, "-c",
                          "SELECT pg_logical_emit_message(true, 'kit.probe', '')"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        p.wait(timeout)
        return False
    except subprocess.TimeoutExpired:
        psql(dsn, "SELECT pg_cancel_backend(pid) FROM pg_stat_activity "
                  "WHERE query LIKE '%kit.probe%' AND pid <> pg_backend_pid()")
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        return True
