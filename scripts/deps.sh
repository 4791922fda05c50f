#!/usr/bin/env bash
# scripts/deps.sh [--log FILE] [PACKAGE ...] -- install Debian packages with
# apt-get (make deps: the Makefile passes the ones that are missing).
#
# One line per step on stdout; apt-get's own output goes to the log (FILE,
# default build/deps.log), begun anew by each run that installs:
#
#   deps: apt-get update ... ok
#   deps: installing 23 packages ... ok (log: build/deps.log)
#
# No PACKAGE: one line, nothing to install, no log. A step that fails prints
# FAILED with apt-get's exit status, then the log's last 30 lines and its
# path, and the script exits with that status. Run as root; as another user
# it names the packages and the command to run, and exits 2. Under sudo the
# log (and a build directory it makes) belongs to the user who ran sudo.
set -uo pipefail

LOG=build/deps.log
if [[ "${1:-}" == --log ]]; then
    LOG=${2:?--log needs a file}
    shift 2
fi
PKGS=("$@")

if ((${#PKGS[@]} == 0)); then
    echo "deps: every Debian package is installed, nothing to install"
    exit 0
fi
if [[ "$(id -u)" != 0 ]]; then
    echo "deps: ${#PKGS[@]} Debian package(s) missing: ${PKGS[*]}" >&2
    echo "deps: run as root: sudo make deps   (or: sudo apt-get install ${PKGS[*]})" >&2
    exit 2
fi

dir=$(dirname "$LOG")
new_dir=0
[[ -d "$dir" ]] || new_dir=1
mkdir -p "$dir" || exit 2
{
    printf '# make deps, %s: %s\n' "$(date -u '+%Y-%m-%dT%H:%M:%SZ')" "${PKGS[*]}"
} >"$LOG" || exit 2
if [[ -n "${SUDO_UID:-}" ]]; then
    ((new_dir)) && chown "$SUDO_UID:${SUDO_GID:-$SUDO_UID}" "$dir"
    chown "$SUDO_UID:${SUDO_GID:-$SUDO_UID}" "$LOG"
fi

# step TITLE COMMAND...: "deps: TITLE ... ok", the command's output in the
# log; on failure the log's tail, and exit.
step() {
    local title=$1 rc
    shift
    printf 'deps: %s ... ' "$title"
    printf '\n$ %s\n' "$*" >>"$LOG"
    "$@" </dev/null >>"$LOG" 2>&1
    rc=$?
    if ((rc == 0)); then
        return 0
    fi
    echo "FAILED (exit $rc)"
    echo "deps: the last 30 lines of apt-get's output:"
    tail -n 30 "$LOG" | sed 's/^/    /'
    echo "deps: apt-get's whole output: $LOG"
    exit "$rc"
}

export DEBIAN_FRONTEND=noninteractive
# Wait for another apt or dpkg (unattended upgrades at boot) rather than fail.
APT=(apt-get -o DPkg::Lock::Timeout=300 -o Dpkg::Use-Pty=0)

step "apt-get update" "${APT[@]}" update
echo ok
if ((${#PKGS[@]} <= 3)); then
    what="${PKGS[*]}"
else
    what="${#PKGS[@]} packages"
fi
step "installing $what" "${APT[@]}" install -y "${PKGS[@]}"
echo "ok (log: $LOG)"
