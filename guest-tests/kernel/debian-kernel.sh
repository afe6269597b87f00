#!/usr/bin/env bash
# A stock Debian kernel newer than bookworm's, as a Debian 13 user runs it: the newest
# linux-image-<SERIES>.*+deb13-amd64 of trixie / trixie-backports (default SERIES 7.3),
# unpacked into the cache, plus a trixie chroot (mmdebstrap) holding its linux-headers
# package, in which guest modules are built the way a Debian user builds them (kbuild of
# the headers package, trixie's gcc-14; bookworm can't run trixie's kbuild tools).
#
#   guest-tests/kernel/debian-kernel.sh [SERIES]
#
# Prints KERNEL=, MODDIR=, KDIR= (inside the chroot), CHROOT=, KREL=, ENV= on stdout;
# progress on stderr. Cached in .cache/debian-kernels/<release>/ (built in a temporary
# directory and renamed at the end, so an interrupted run leaves nothing half made).
# Needs root for the chroot (mmdebstrap is installed when missing).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${ARFSNIC_CACHE:-$REPO/.cache}
SERIES=${1:-7.3}
# Bump when the layout of a cache entry changes.
RECIPE=2

die() { echo "debian-kernel.sh: error: $*" >&2; exit 1; }
log() { echo "debian-kernel.sh: $*" >&2; }

case "$SERIES" in
    [0-9]*.[0-9]*) ;;
    *) die "series '$SERIES' is not a kernel series like 7.3" ;;
esac
re_series=${SERIES//./\\.}
PKG=$(bash "$HERE/debian-apt.sh" newest "linux-image-${re_series}\.[0-9]+\+deb13-amd64") ||
    die "cannot read the trixie package lists (see above)"
[ -n "$PKG" ] || die "no stock linux-image-$SERIES.*+deb13-amd64 in Debian trixie or trixie-backports"
KREL=${PKG#linux-image-}
VER=$(bash "$HERE/debian-apt.sh" version "$PKG")
DIR="$CACHE/debian-kernels/$KREL"
ENVF="$DIR/kernel.env"

print_result() {
    # shellcheck disable=SC1090
    . "$ENVF"
    echo "KERNEL=$KERNEL"
    echo "MODDIR=$MODDIR"
    echo "KDIR=$KDIR"
    echo "CHROOT=$CHROOT"
    echo "KREL=$KREL"
    echo "ENV=$ENVF"
}

if [ -f "$ENVF" ] && grep -qx "RECIPE=$RECIPE" "$ENVF"; then
    log "cached: $DIR"
    print_result
    exit 0
fi
[ "$(id -u)" = 0 ] || die "the trixie chroot for $KREL needs root once (sudo $0 $SERIES)"

mkdir -p "$CACHE/debian-kernels"
exec 9>"$CACHE/debian-kernels/$KREL.lock"
flock 9
if [ -f "$ENVF" ] && grep -qx "RECIPE=$RECIPE" "$ENVF"; then
    print_result
    exit 0
fi

if ! command -v mmdebstrap >/dev/null; then
    log "installing mmdebstrap (apt)"
    apt-get -q -o DPkg::Lock::Timeout=900 install -y --no-install-recommends mmdebstrap >&2 ||
        die "apt-get install mmdebstrap failed"
fi

T0=$(date +%s)
TMP="$CACHE/debian-kernels/.$KREL.tmp"
rm -rf "$TMP"
mkdir -p "$TMP/debs" "$TMP/root"
trap 'rm -rf "$TMP"' EXIT
trap 'exit 130' INT TERM

log "$PKG $VER: downloading the image and its modules"
debs=$(bash "$HERE/debian-apt.sh" download "$CACHE/debs" "linux-binary-$KREL" "linux-modules-$KREL") ||
    die "downloading $PKG failed (see above)"
for d in $debs; do dpkg-deb -x "$d" "$TMP/root" || die "cannot unpack $d"; done
# 7.x packages put the image next to the modules (usr/lib/modules/<rel>/vmlinuz); older
# ones in boot/vmlinuz-<rel>.
VMLINUZ=""
for v in "$TMP/root/usr/lib/modules/$KREL/vmlinuz" "$TMP/root/boot/vmlinuz-$KREL"; do
    [ -f "$v" ] && VMLINUZ=$v && break
done
[ -n "$VMLINUZ" ] || die "linux-binary-$KREL holds neither usr/lib/modules/$KREL/vmlinuz nor boot/vmlinuz-$KREL"
MODSRC=""
for m in "$TMP/root/usr/lib/modules/$KREL" "$TMP/root/lib/modules/$KREL"; do
    [ -d "$m/kernel" ] && MODSRC=$m && break
done
[ -n "$MODSRC" ] || die "linux-modules-$KREL holds no lib/modules/$KREL/kernel"

# The chroot: trixie + trixie-backports from the mirror the host uses, with the headers
# package (it pulls gcc-14, make and linux-kbuild through its dependencies).
MIRROR=$(sed -n 's/^URIs: *//p' "$CACHE/apt-trixie/trixie.sources" | head -n1)
[ -n "$MIRROR" ] || die "no mirror in $CACHE/apt-trixie/trixie.sources"
log "mmdebstrap: trixie chroot with linux-headers-$KREL (a few minutes; log: $TMP/mmdebstrap.log)"
mmdebstrap --quiet --variant=apt --include="linux-headers-$KREL,make,libc6-dev,binutils,kmod" \
    trixie "$TMP/chroot" "deb $MIRROR trixie main" "deb $MIRROR trixie-backports main" \
    > "$TMP/mmdebstrap.log" 2>&1 || { tail -n 20 "$TMP/mmdebstrap.log" >&2; die "mmdebstrap failed"; }
[ -d "$TMP/chroot/usr/src/linux-headers-$KREL" ] || die "the chroot has no /usr/src/linux-headers-$KREL"

mv "$TMP/chroot" "$TMP/final-chroot"
mkdir -p "$TMP/final/lib/modules"
mv "$TMP/final-chroot" "$TMP/final/chroot"
mv "$VMLINUZ" "$TMP/final/vmlinuz-$KREL"
mv "$MODSRC" "$TMP/final/lib/modules/$KREL"

T1=$(date +%s)
cat > "$TMP/final/kernel.env" <<EOF
# written by guest-tests/kernel/debian-kernel.sh
RECIPE=$RECIPE
KERNEL=$DIR/vmlinuz-$KREL
MODDIR=$DIR/lib/modules/$KREL
KDIR=/usr/src/linux-headers-$KREL
CHROOT=$DIR/chroot
KREL=$KREL
PACKAGE="$PKG $VER"
SECONDS_TO_MAKE=$((T1 - T0))
EOF
rm -rf "$DIR"
mv "$TMP/final" "$DIR"
log "$PKG $VER ready in $((T1 - T0)) s: $DIR"
print_result
