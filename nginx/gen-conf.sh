#!/usr/bin/env bash
# nginx/gen-conf.sh -- writes an nginx configuration for N seckill instances
# from nginx/nginx.conf.tmpl.
#
#   nginx/gen-conf.sh --prefix DIR --listen 127.0.0.1:8080 \
#       --upstream 127.0.0.1:8081 --upstream 127.0.0.1:8082 [-o FILE]
#   nginx/gen-conf.sh --docker [-o nginx/docker.conf]
#
# --prefix DIR    local mode: pid, logs and temp files all under DIR
#                 (DIR/nginx.pid, DIR/error.log, DIR/access.log, DIR/temp/)
# --docker        the compose file's configuration: listens on 8080 in the
#                 container, upstream app:8080 (the compose service: every
#                 replica's address, as Docker's DNS answers when nginx starts
#                 or reloads; change with --upstream), logs to stdout/stderr,
#                 temp files under /tmp
# --listen A      listen address (default 127.0.0.1:8080; 8080 with --docker)
# --upstream H:P  an instance (repeatable; at least one)
# --max-body S    client_max_body_size (default 64k, the instances' MAX_BODY)
# --connect-timeout T, --send-timeout T, --read-timeout T
#                 proxy timeouts (defaults 2s, 10s, 10s)
# --retry-after N Retry-After of nginx's 502/503/504 answers (default 1)
# --allow LIST    the client addresses (IPv4/IPv6, CIDR allowed, space
#                 separated; 'all' for everyone) that may reach /admin,
#                 /metrics and /stats; others get 403 with a JSON error body.
#                 Default: $NGINX_ALLOW, else loopback ("127.0.0.0/8 ::1");
#                 with --docker also the private ranges, since Docker's proxy
#                 brings the host's requests from the network's gateway
#                 ("127.0.0.0/8 ::1 10.0.0.0/8 172.16.0.0/12 192.168.0.0/16")
# --dashboard DIR the dashboard page served at /dashboard/. Local mode: the
#                 files of DIR (default: the repository's dashboard/) are
#                 copied to PREFIX/dashboard, so that nginx's workers (nobody,
#                 when started as root) can read them wherever the repository
#                 lives; restart the stack (or run this again) to serve edits.
#                 --docker: the directory inside the container (default
#                 /usr/share/nginx/dashboard, mounted by docker-compose.yml)
# --edge on|off   the sold-out edge: nginx answers a voucher known to be sold
#                 out by itself (nginx.conf.tmpl, "The sold-out edge"; needs
#                 Debian's libnginx-mod-http-lua). Default: $NGINX_EDGE, else on
# --modules-dir D where the nginx modules are (default /usr/lib/nginx/modules,
#                 Debian's, also in the compose file's nginx image)
# -o FILE         write there (atomically) instead of stdout
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TEMPLATE="$HERE/nginx.conf.tmpl"
DASHBOARD_SRC_DEFAULT="$(dirname "$HERE")/dashboard"
DASHBOARD_DOCKER_DEFAULT=/usr/share/nginx/dashboard

die() { printf 'gen-conf.sh: %s\n' "$*" >&2; exit 2; }

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
    exit "${1:-0}"
}

# Escapes a replacement string for sed's s|...|...|.
sed_escape() { printf '%s' "$1" | sed -e 's/[\\|&]/\\&/g'; }

# Copies the dashboard's files from SRC into DEST (replacing an older copy),
# readable by everyone. A missing default source only warns: the page is then
# a 404, everything else works.
copy_dashboard() {
    local src=$1 dest=$2 explicit=$3
    if [[ ! -f "$src/index.html" ]]; then
        [[ -z "$explicit" ]] || die "--dashboard $src has no index.html"
        printf 'gen-conf.sh: warning: no dashboard in %s: /dashboard/ will answer 404\n' "$src" >&2
        rm -rf "$dest"
        mkdir -p "$dest"
        return 0
    fi
    rm -rf "$dest.tmp.$$"
    cp -R "$src" "$dest.tmp.$$"
    chmod -R a+rX "$dest.tmp.$$"
    rm -rf "$dest"
    mv "$dest.tmp.$$" "$dest"
}

main() {
    local prefix="" docker=0 listen="" max_body=64k out=""
    local connect_timeout=2s send_timeout=10s read_timeout=10s retry_after=1
    local dashboard="" dashboard_dir allow=${NGINX_ALLOW:-}
    local edge=${NGINX_EDGE:-on} modules_dir=/usr/lib/nginx/modules
    local -a upstreams=()

    while (($#)); do
        case "$1" in
            --prefix) prefix=${2:?}; shift 2 ;;
            --docker) docker=1; shift ;;
            --listen) listen=${2:?}; shift 2 ;;
            --upstream) upstreams+=("${2:?}"); shift 2 ;;
            --max-body) max_body=${2:?}; shift 2 ;;
            --connect-timeout) connect_timeout=${2:?}; shift 2 ;;
            --send-timeout) send_timeout=${2:?}; shift 2 ;;
            --read-timeout) read_timeout=${2:?}; shift 2 ;;
            --retry-after) retry_after=${2:?}; shift 2 ;;
            --dashboard) dashboard=${2:?}; shift 2 ;;
            --allow) allow=${2:?}; shift 2 ;;
            --edge) edge=${2:?}; shift 2 ;;
            --modules-dir) modules_dir=${2:?}; shift 2 ;;
            -o) out=${2:?}; shift 2 ;;
            -h | --help) usage 0 ;;
            *) die "unknown argument '$1' (see --help)" ;;
        esac
    done

    local pid_file error_log access_log temp_dir
    if ((docker)); then
        [[ -z "$prefix" ]] || die "--docker and --prefix exclude each other"
        listen=${listen:-8080}
        ((${#upstreams[@]})) || upstreams=(app:8080)
        allow=${allow:-127.0.0.0/8 ::1 10.0.0.0/8 172.16.0.0/12 192.168.0.0/16}
        pid_file=/tmp/nginx.pid
        error_log=stderr
        access_log=/dev/stdout
        temp_dir=/tmp
        dashboard_dir=${dashboard:-$DASHBOARD_DOCKER_DEFAULT}
        [[ "$dashboard_dir" == /* ]] || die "--dashboard with --docker is a directory in the container (absolute)"
    else
        [[ -n "$prefix" ]] || die "--prefix DIR (or --docker) is required"
        [[ "$prefix" == /* ]] || prefix="$PWD/$prefix"
        listen=${listen:-127.0.0.1:8080}
        allow=${allow:-127.0.0.0/8 ::1}
        pid_file="$prefix/nginx.pid"
        error_log="$prefix/error.log"
        access_log="$prefix/access.log"
        temp_dir="$prefix/temp"
        mkdir -p "$temp_dir"      # nginx creates the leaf directories only
        dashboard_dir="$prefix/dashboard"
        copy_dashboard "${dashboard:-$DASHBOARD_SRC_DEFAULT}" "$dashboard_dir" "${dashboard:+explicit}"
    fi
    ((${#upstreams[@]})) || die "at least one --upstream HOST:PORT is required"
    # The edge's blocks sit between '#>edge' and '#<edge' lines: kept (the
    # marker lines dropped) or dropped whole.
    local edge_sed
    case "$edge" in
        on)
            edge_sed='/^#[<>]edge$/d'
            [[ "$modules_dir" == /* ]] || die "--modules-dir must be absolute"
            if ((!docker)) && [[ ! -f "$modules_dir/ngx_http_lua_module.so" ]]; then
                die "the sold-out edge needs $modules_dir/ngx_http_lua_module.so (make deps installs libnginx-mod-http-lua), or --edge off"
            fi
            ;;
        off) edge_sed='/^#>edge$/,/^#<edge$/d' ;;
        *) die "--edge is on or off (got '$edge')" ;;
    esac
    [[ -f "$TEMPLATE" ]] || die "template $TEMPLATE is missing"

    local servers="" u
    for u in "${upstreams[@]}"; do
        [[ "$u" =~ ^[A-Za-z0-9._-]+:[0-9]+$ ]] || die "bad --upstream '$u' (HOST:PORT)"
        servers+="        server $u max_fails=2 fail_timeout=3s;"$'\n'
    done
    servers=${servers%$'\n'}

    # The geo block's entries: "ADDRESS 1;" for each allowed address.
    local allow_entries="" a
    for a in $allow; do
        if [[ "$a" == all ]]; then
            allow_entries+="        0.0.0.0/0 1;"$'\n'"        ::/0 1;"$'\n'
            continue
        fi
        [[ "$a" =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}(/[0-9]{1,2})?$ || "$a" =~ ^[0-9A-Fa-f:]*:[0-9A-Fa-f:.]*(/[0-9]{1,3})?$ ]] ||
            die "bad --allow entry '$a' (an IPv4 or IPv6 address or CIDR, or 'all')"
        allow_entries+="        $a 1;"$'\n'
    done
    [[ -n "$allow_entries" ]] || die "--allow needs at least one address (loopback: 127.0.0.0/8)"
    allow_entries=${allow_entries%$'\n'}

    local text
    text="# Generated by nginx/gen-conf.sh from nginx/nginx.conf.tmpl: edit those, not this."$'\n'
    text+=$(sed \
        -e "s|@@PID_FILE@@|$(sed_escape "$pid_file")|g" \
        -e "s|@@ERROR_LOG@@|$(sed_escape "$error_log")|g" \
        -e "s|@@ACCESS_LOG@@|$(sed_escape "$access_log")|g" \
        -e "s|@@TEMP_DIR@@|$(sed_escape "$temp_dir")|g" \
        -e "s|@@LISTEN@@|$(sed_escape "$listen")|g" \
        -e "s|@@MAX_BODY@@|$(sed_escape "$max_body")|g" \
        -e "s|@@CONNECT_TIMEOUT@@|$(sed_escape "$connect_timeout")|g" \
        -e "s|@@SEND_TIMEOUT@@|$(sed_escape "$send_timeout")|g" \
        -e "s|@@READ_TIMEOUT@@|$(sed_escape "$read_timeout")|g" \
        -e "s|@@RETRY_AFTER@@|$(sed_escape "$retry_after")|g" \
        -e "s|@@DASHBOARD_DIR@@|$(sed_escape "${dashboard_dir%/}")|g" \
        -e "s|@@MODULES_DIR@@|$(sed_escape "${modules_dir%/}")|g" \
        -e "$edge_sed" \
        "$TEMPLATE")
    # The server lines span several lines: replaced outside sed.
    text=${text//@@UPSTREAM_SERVERS@@/$servers}
    text=${text//@@ALLOW_ENTRIES@@/$allow_entries}
    if grep -q '@@[A-Z_]*@@' <<<"$text"; then
        die "unfilled placeholder(s): $(grep -o '@@[A-Z_]*@@' <<<"$text" | sort -u | tr '\n' ' ')"
    fi

    if [[ -n "$out" ]]; then
        printf '%s\n' "$text" >"$out.tmp.$$"
        mv -f "$out.tmp.$$" "$out"
    else
        printf '%s\n' "$text"
    fi
}

main "$@"
