#!/usr/bin/env bash
# The Debian guest: a Debian 13 (trixie) root filesystem made with mmdebstrap from the
# mirror the host already uses (trixie + trixie-backports, through the private apt state
# of guest-tests/kernel/debian-apt.sh), as a raw ext4 disk image in .cache/images/.
#
#   guest-tests/image/build-debian.sh [KREL]
#
# KREL: the stock kernel whose headers and modules go into the image (default: the one
# guest-tests/kernel/debian-kernel.sh 7.3 picks), so the guest module builds in the guest
# against /lib/modules/KREL/build and bcc finds its headers there. Self-built kernels boot
# the same image (bcc then reads their in-kernel headers, CONFIG_IKHEADERS).
#
# Prints IMAGE=, KREL=, PACKAGES=, ENV= on stdout; progress lines on stderr. Cached under
# a key of everything that goes in (this script, the package list, KREL): rebuilt only
# when one of them changes. Built in a temporary directory and renamed at the end. Needs
# root (mmdebstrap into a directory).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${ARFSNIC_CACHE:-$REPO/.cache}
APT="$REPO/guest-tests/kernel/debian-apt.sh"

die() { echo "build-debian.sh: error: $*" >&2; exit 1; }
log() { echo "build-debian.sh: $*" >&2; }

KREL=${1:-}
if [ -z "$KREL" ]; then
    KREL=$(bash "$REPO/guest-tests/kernel/debian-kernel.sh" 7.3 | sed -n 's/^KREL=//p') ||
        die "guest-tests/kernel/debian-kernel.sh 7.3 failed (see above)"
fi
case "$KREL" in *+deb13-amd64) ;; *) die "KREL '$KREL' is not a trixie kernel release like 7.3.4+deb13-amd64" ;; esac

# What the guest runs: the issue's tool set, ping (the selftests use it), plus the kbuild
# toolchain for the module.
PACKAGES=(
    python3 python3-yaml iproute2 ethtool socat iperf3 sockperf bpfcc-tools bpftrace
    kmod procps busybox util-linux xz-utils iputils-ping
    make gcc libc6-dev "linux-headers-$KREL" "linux-modules-$KREL"
)
KEY=$( { sed -n '1,$p' "${BASH_SOURCE[0]}"; printf '%s\n' "${PACKAGES[@]}" "$KREL"; } |
       sha256sum | cut -c1-16)
DIR="$CACHE/images"
IMG="$DIR/debian-trixie-$KEY.img"
ENVF="$DIR/debian-trixie-$KEY.env"

print_result() {
    echo "IMAGE=$IMG"
    echo "KREL=$KREL"
    echo "PACKAGES=${PACKAGES[*]}"
    echo "ENV=$ENVF"
}
if [ -f "$ENVF" ] && [ -f "$IMG" ]; then
    log "cached: $IMG"
    print_result
    exit 0
fi
[ "$(id -u)" = 0 ] || die "building the Debian image needs root once (sudo $0 $KREL)"
command -v mkfs.ext4 >/dev/null || die "mkfs.ext4 not found (apt-get install e2fsprogs)"

mkdir -p "$DIR"
exec 9>"$DIR/debian-trixie-$KEY.lock"
flock 9
if [ -f "$ENVF" ] && [ -f "$IMG" ]; then print_result; exit 0; fi
if ! command -v mmdebstrap >/dev/null; then
    log "installing mmdebstrap (apt)"
    apt-get -q -o DPkg::Lock::Timeout=900 install -y --no-install-recommends mmdebstrap >&2 ||
        die "apt-get install mmdebstrap failed"
fi

bash "$APT" update >&2 || die "cannot read the trixie package lists (see above)"
MIRROR=$(sed -n 's/^URIs: *//p' "$CACHE/apt-trixie/trixie.sources" | head -n1)
[ -n "$MIRROR" ] || die "no mirror in $CACHE/apt-trixie/trixie.sources"
for p in "${PACKAGES[@]}"; do
    [ -n "$(bash "$APT" version "$p" 2>/dev/null)" ] ||
        die "package $p is not in trixie or trixie-backports (is $KREL still published?)"
done

T0=$(date +%s)
TMP="$DIR/.debian-trixie-$KEY.tmp"
rm -rf "$TMP"
mkdir -p "$TMP"
trap 'rm -rf "$TMP"; [ -z "${TICK:-}" ] || kill "$TICK" 2>/dev/null || true' EXIT
trap 'exit 130' INT TERM

# A progress line every 10 s while mmdebstrap works (it has no progress output of its own
# when quiet): elapsed time and how many packages are unpacked so far.
( while sleep 10; do
      n=$(ls "$TMP/root/var/lib/dpkg/info/"*.list 2>/dev/null | wc -l)
      log "progress: $(( $(date +%s) - T0 )) s, $n packages unpacked"
  done ) &
TICK=$!

log "mmdebstrap: trixie + ${#PACKAGES[@]} packages and their dependencies (a few minutes; log: $TMP/mmdebstrap.log)"
mmdebstrap --variant=apt --include="$(IFS=,; echo "${PACKAGES[*]}")" \
    --customize-hook='chroot "$1" sh -c "echo arfsnic-debian > /etc/hostname; : > /etc/machine-id"' \
    --customize-hook='chroot "$1" sh -c "rm -rf /var/cache/apt/archives/*.deb /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/*"' \
    trixie "$TMP/root" "deb $MIRROR trixie main" "deb $MIRROR trixie-backports main" \
    > "$TMP/mmdebstrap.log" 2>&1 || { tail -n 20 "$TMP/mmdebstrap.log" >&2; die "mmdebstrap failed"; }
kill "$TICK" 2>/dev/null || true
TICK=""
[ -d "$TMP/root/usr/src/linux-headers-$KREL" ] || die "the image has no /usr/src/linux-headers-$KREL"
[ -x "$TMP/root/usr/sbin/funccount-bpfcc" ] || die "the image has no funccount-bpfcc (bpfcc-tools)"
[ -x "$TMP/root/usr/bin/busybox" ] || die "the image has no busybox"
# The module sources and the guest tools are not baked in: each run brings its own.
mkdir -p "$TMP/root/arfsnic"
T1=$(date +%s)

# ext4 image: the tree's size plus a quarter and 256 MiB of room (the guest mounts it
# read-only and writes only to tmpfs, so free space is only for the fs itself).
used_kib=$(du -sk "$TMP/root" | cut -f1)
size_mib=$(( used_kib * 5 / 4 / 1024 + 256 ))
log "ext4 image: $((used_kib / 1024)) MiB of files into $size_mib MiB"
mkfs.ext4 -q -L arfsnic-debian -d "$TMP/root" "$TMP/image.img" "${size_mib}M" >&2 ||
    die "mkfs.ext4 -d failed (e2fsprogs >= 1.43 needed)"
T2=$(date +%s)
cat > "$TMP/image.env" <<EOF
# written by guest-tests/image/build-debian.sh
IMAGE=$IMG
KREL=$KREL
PACKAGES="${PACKAGES[*]}"
FILES_MIB=$((used_kib / 1024))
IMAGE_MIB=$size_mib
SECONDS_MMDEBSTRAP=$((T1 - T0))
SECONDS_MKFS=$((T2 - T1))
EOF
mv "$TMP/image.img" "$IMG"
mv "$TMP/image.env" "$ENVF"
log "ready in $((T2 - T0)) s (mmdebstrap $((T1 - T0)) s, mkfs $((T2 - T1)) s): $IMG"
print_result
