#!/usr/bin/env bash
# scripts/layers.sh [-t LAYERS] [OBJECT...] -- fails when a module calls up a
# layer or the modules call each other in a cycle.
#
# The OBJECTs (default build/app/*.o and build/app/*/*.o) are one per
# module (<folder>/<module>.o: the folder is the part of the path after the
# last "/app/", "." for a module at the top of app/). LAYERS (default
# app/LAYERS) has one line per band or part of a band: its layer, its folder
# under app/, its modules ("layer folder module...", '#' comments). A
# module's calls are read from its object with nm: every undefined symbol
# that another object defines is a call (or a data read) of that module.
# Allowed: calls into the module's own layer or lower ones; refused: a call
# into a higher layer, a module without a layer, a layer given to a module
# that has no object, a module outside its band's folder, a folder given two
# layers or a layer two folders, and any cycle (which, calls going only down
# or sideways, can only be within a layer). Prints every offence with the
# symbol that makes it, and exits 1; exits 0 with a one-line summary when
# there is none, 2 on bad usage.
set -euo pipefail

die() { printf 'layers: %s\n' "$*" >&2; exit 2; }

table=app/LAYERS
if [[ "${1:-}" == -t ]]; then
    [[ $# -ge 2 ]] || die "usage: scripts/layers.sh [-t LAYERS] [OBJECT...]"
    table=$2
    shift 2
fi
if (($# == 0)); then
    shopt -s nullglob
    set -- build/app/*.o build/app/*/*.o
    shopt -u nullglob
fi
[[ -f "$table" ]] || die "no layer table $table"
command -v nm >/dev/null || die "nm not found (binutils)"

syms=$(mktemp)
trap 'rm -f "$syms"' EXIT
for o in "$@"; do
    [[ -f "$o" ]] || die "no object $o (build first: make)"
    m=$(basename "$o" .o)
    rel=${o##*/app/}
    [[ "$rel" == "$o" ]] && die "object $o is not under an app/ folder"
    dir=$(dirname "$rel")
    # POSIX format: "name type [value size]"; -g: external symbols only.
    nm -P -g "$o" | awk -v m="$m" '{ print "S", m, $1, $2 }' >>"$syms"
    echo "O $m $dir" >>"$syms"
done

awk -v table="$table" '
function fail(msg) { print "layers: " msg > "/dev/stderr"; bad = 1 }

# Depth-first search from "m" over the calls within a layer (a call up is
# refused on its own; calls down cannot close a cycle without one). On a
# call back into the current path, reports the cycle, each call with the
# symbol that makes it.
function visit(m,    i, to, k, first, text) {
    state[m] = 1
    stack[++depth] = m
    for (i = 1; i <= nout[m]; i++) {
        to = out[m, i]
        if (layer[to] != layer[m])
            continue
        if (state[to] == 1) {
            for (first = depth; stack[first] != to; first--)
                ;
            text = ""
            for (k = first; k <= depth; k++)
                text = text sprintf("\n    %s calls %s (%s)", stack[k],
                                    k < depth ? stack[k + 1] : to,
                                    via[stack[k], k < depth ? stack[k + 1] : to])
            fail("a cycle within layer " layer[m] ":" text)
        } else if (state[to] == 0) {
            visit(to)
        }
    }
    depth--
    state[m] = 2
}

BEGIN {
    while ((getline line < table) > 0) {
        sub(/#.*/, "", line)
        n = split(line, f, " ")
        if (n == 0)
            continue
        if (n < 3 || f[1] !~ /^[0-9]+$/) {
            fail(table ": bad line (want: layer folder module...): " line)
            continue
        }
        l = f[1] + 0
        if ((f[2] in folderlayer) && folderlayer[f[2]] != l)
            fail(table ": folder " f[2] " is given layers " folderlayer[f[2]] " and " l)
        if ((l in layerfolder) && layerfolder[l] != f[2])
            fail(table ": layer " l " is given folders " layerfolder[l] " and " f[2])
        folderlayer[f[2]] = l
        layerfolder[l] = f[2]
        for (i = 3; i <= n; i++) {
            if (f[i] in layer)
                fail(table ": " f[i] " is listed twice")
            layer[f[i]] = l
            home[f[i]] = f[2]
        }
    }
    close(table)
}

$1 == "O" { obj[$2] = 1; dir[$2] = $3; next }
$1 == "S" && $4 == "U" { und[$2, $3] = 1; nund[$2]++; undsym[$2, nund[$2]] = $3; next }
$1 == "S" && $4 ~ /^[TDBRCGSVWi]$/ { if (!($3 in def)) def[$3] = $2; next }

END {
    for (m in obj) {
        if (!(m in layer))
            fail("app/" (dir[m] == "." ? "" : dir[m] "/") m ".c has no layer in " table \
                 " (add it to the line of its band)")
        else if (dir[m] != home[m])
            fail("app/" (dir[m] == "." ? "" : dir[m] "/") m ".c is outside its band: " table \
                 " puts " m " (layer " layer[m] ") in app/" (home[m] == "." ? "" : home[m] "/"))
    }
    for (m in layer)
        if (!(m in obj))
            fail(table " lists " m ", but there is no " m ".o: remove it from its line, or build")
    calls = 0
    for (m in obj) {
        for (i = 1; i <= nund[m]; i++) {
            s = undsym[m, i]
            if (!(s in def) || def[s] == m)
                continue
            to = def[s]
            if (!((m, to) in via)) {
                via[m, to] = s
                out[m, ++nout[m]] = to
                calls++
            }
            if ((m in layer) && (to in layer) && layer[to] > layer[m])
                fail(sprintf("%s (layer %d) calls up: %s is in %s (layer %d)",
                             m, layer[m], s, to, layer[to]))
        }
    }
    for (m in obj)
        if ((m in layer) && state[m] == 0)
            visit(m)
    if (bad)
        exit 1
    n = 0
    for (m in obj) {
        n++
        dirs[dir[m]] = 1
    }
    nd = 0
    for (d in dirs)
        nd++
    printf "layers: %d modules in %d folders, %d module-to-module dependencies, none up a layer, no cycle, each in its band\x27s folder\n", n, nd, calls
}
' "$syms"
