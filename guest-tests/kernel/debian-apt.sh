#!/usr/bin/env bash
# Fetch packages from Debian 13 (trixie) and trixie-backports on a Debian 12 host without
# touching the host's apt configuration: a private apt state (sources, lists, cache) under
# .cache/apt-trixie/, pointing at the Debian mirror the machine already uses.
#
#   guest-tests/kernel/debian-apt.sh update
#   guest-tests/kernel/debian-apt.sh download DIR PKG...   # .debs into DIR, prints their paths
#   guest-tests/kernel/debian-apt.sh newest ERE            # newest package name matching ^ERE$
#   guest-tests/kernel/debian-apt.sh version PKG           # candidate version of PKG
#
# The mirror and its keyring come from the first configured source that carries a Debian
# 'bookworm' suite (deb822 or one-line), as guest-tests/provision.sh does; the official
# mirror only when none is configured. `update` runs at most once an hour unless
# DEBIAN_APT_FORCE=1.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
STATE=${ARFSNIC_CACHE:-$REPO/.cache}/apt-trixie

die() { echo "debian-apt.sh: error: $*" >&2; exit 1; }
log() { echo "debian-apt.sh: $*" >&2; }

command -v apt-get >/dev/null || die "apt-get not found: this script needs a Debian host"

mirror_and_key() {
    local f m="" k=""
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        read -r m k < <(awk '
            BEGIN{RS=""; FS="\n"}
            { u=""; k=""; ok=0
              for(i=1;i<=NF;i++){
                if($i ~ /^URIs:/){sub(/^URIs:[ \t]*/,"",$i); split($i,a,/[ \t]+/); u=a[1]}
                if($i ~ /^Suites:/){n=split($i,b,/[ \t]+/); for(j=2;j<=n;j++) if(b[j]=="bookworm") ok=1}
                if($i ~ /^Signed-By:/){sub(/^Signed-By:[ \t]*/,"",$i); k=$i}
              }
              if(ok && u!=""){print u, k; exit} }' "$f") || true
        [ -n "$m" ] && { echo "$m $k"; return; }
    done
    m=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
        sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\{0,1\}\([^[:space:]]\+\)[[:space:]]\+bookworm[[:space:]].*/\2/p' | head -n1)
    [ -n "$m" ] && { echo "$m"; return; }
    echo "http://deb.debian.org/debian"
}

APT_OPTS=()
setup() {
    mkdir -p "$STATE/lists/partial" "$STATE/cache/archives/partial"
    local mk mirror key
    mk=$(mirror_and_key)
    mirror=${mk%% *}
    key=""
    [ "$mk" != "$mirror" ] && key=${mk#* }
    [ -z "$key" ] && [ -f /usr/share/keyrings/debian-archive-keyring.gpg ] &&
        key=/usr/share/keyrings/debian-archive-keyring.gpg
    {
        echo "Types: deb"
        echo "URIs: $mirror"
        echo "Suites: trixie trixie-backports"
        echo "Components: main"
        [ -n "$key" ] && echo "Signed-By: $key"
    } > "$STATE/trixie.sources.new"
    if ! cmp -s "$STATE/trixie.sources.new" "$STATE/trixie.sources" 2>/dev/null; then
        mv "$STATE/trixie.sources.new" "$STATE/trixie.sources"
        rm -f "$STATE/updated"
    else
        rm -f "$STATE/trixie.sources.new"
    fi
    mkdir -p "$STATE/sources.d"
    cp "$STATE/trixie.sources" "$STATE/sources.d/trixie.sources"
    : > "$STATE/none.list"
    APT_OPTS=(-o "Dir::Etc::sourcelist=$STATE/none.list" -o "Dir::Etc::sourceparts=$STATE/sources.d"
              -o "Dir::State::lists=$STATE/lists" -o "Dir::Cache=$STATE/cache"
              -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache="
              -o "APT::Architecture=amd64" -o "APT::Architectures::=amd64"
              -o "Debug::NoLocking=1" -o "Acquire::Retries=3")
}

update() {
    setup
    if [ "${DEBIAN_APT_FORCE:-0}" != 1 ] && [ -f "$STATE/updated" ] &&
        [ -n "$(find "$STATE/updated" -mmin -60 2>/dev/null)" ]; then
        return 0
    fi
    log "apt-get update (trixie, trixie-backports; private state in $STATE)"
    apt-get -q "${APT_OPTS[@]}" update >"$STATE/update.log" 2>&1 ||
        { tail -n 5 "$STATE/update.log" >&2; die "apt-get update for trixie failed: no Debian registry reachable? (log: $STATE/update.log)"; }
    touch "$STATE/updated"
}

cmd=${1:-}
[ -n "$cmd" ] || { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
shift
case "$cmd" in
    update) DEBIAN_APT_FORCE=${DEBIAN_APT_FORCE:-1} update ;;
    download)
        [ $# -ge 2 ] || die "usage: download DIR PKG..."
        dir=$1; shift
        update
        mkdir -p "$dir"
        dir=$(cd "$dir" && pwd)
        for p in "$@"; do
            v=$(apt-cache "${APT_OPTS[@]}" policy "$p" 2>/dev/null | awk '/Candidate:/ {print $2}')
            [ -n "$v" ] && [ "$v" != "(none)" ] || die "package $p is not in trixie or trixie-backports"
            # apt-get download names the file NAME_VERSION_ARCH.deb with ':' as %3a.
            have=$(find "$dir" -maxdepth 1 -name "${p}_${v//:/%3a}_*.deb" | head -n1)
            if [ -z "$have" ]; then
                log "downloading $p $v"
                (cd "$dir" && apt-get -q "${APT_OPTS[@]}" download "$p=$v" >&2) ||
                    die "downloading $p $v failed"
                have=$(find "$dir" -maxdepth 1 -name "${p}_${v//:/%3a}_*.deb" | head -n1)
            fi
            [ -n "$have" ] || die "apt-get download $p left no .deb in $dir"
            echo "$have"
        done ;;
    newest)
        [ $# -eq 1 ] || die "usage: newest ERE"
        update
        apt-cache "${APT_OPTS[@]}" search --names-only "^$1\$" 2>/dev/null | awk '{print $1}' |
            grep -E "^$1\$" | sort -V | tail -n1 ;;
    version)
        [ $# -eq 1 ] || die "usage: version PKG"
        update
        apt-cache "${APT_OPTS[@]}" policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}' ;;
    *) die "unknown command: $cmd (update, download, newest, version)" ;;
esac
