#!/usr/bin/env bash
# A virtme-ng-bootable copy of a patched kernel tree from guest-tests/kernel/build.sh:
# the tree is copied, guest-tests/e2e/vng.config (9p root, virtio-serial, overlayfs)
# merged into its .config and rebuilt incrementally (148 objects, 76 s on 2 cores). Cached
# by the build.sh key and the fragment's content; a second call returns at once.
#
#   guest-tests/e2e/vng-kernel.sh [build.sh args, e.g. --base 7.3 | --patch FILE ...]
#
# Prints KERNEL=<bzImage> and KDIR=<tree> for guest-tests/e2e/vng.sh. Output under
# .cache/vng-kernels/ (OUT=DIR to change it). Your own tree needs no copy: merge
# guest-tests/e2e/vng.config into its .config (or use `vng --kconfig` and add
# guest-tests/kernel/config.fragment's RPS/RFS_ACCEL/PCI_MSI lines) and build it.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
FRAG=$HERE/vng.config
OUT=${OUT:-$REPO/.cache/vng-kernels}
JOBS=$(nproc 2>/dev/null || echo 2)

die() { echo "vng-kernel.sh: error: $*" >&2; exit 1; }
log() { echo "vng-kernel.sh: $*" >&2; }

[ -f "$FRAG" ] || die "config fragment missing: $FRAG"
command -v sha256sum >/dev/null || die "sha256sum missing (apt-get install coreutils)"

SRC_ENV=$(bash "$REPO/guest-tests/kernel/build.sh" "$@") || die "guest-tests/kernel/build.sh $* failed"
SRC_KDIR=$(printf '%s\n' "$SRC_ENV" | sed -n 's/^KDIR=//p' | tail -n1)
SRC_KEY=$(printf '%s\n' "$SRC_ENV" | sed -n 's/^KEY=//p' | tail -n1)
[ -d "$SRC_KDIR" ] && [ -n "$SRC_KEY" ] || die "build.sh printed no KDIR/KEY"
KEY=$SRC_KEY-$(sha256sum "$FRAG" | cut -c1-12)
DIR=$OUT/$KEY
TREE=$DIR/$(basename "$SRC_KDIR")

print_result() {
    echo "KERNEL=$DIR/bzImage"
    echo "KDIR=$TREE"
}
if [ -f "$DIR/done" ] && [ -f "$DIR/bzImage" ]; then
    log "cached: $DIR"
    print_result
    exit 0
fi

mkdir -p "$OUT"
exec 9>"$OUT/$KEY.lock"
flock -n 9 || { log "another build of $KEY is running; waiting for it"; flock 9; }
if [ -f "$DIR/done" ] && [ -f "$DIR/bzImage" ]; then
    print_result
    exit 0
fi
rm -rf "$DIR"
cleanup() {
    local rc=$?
    [ "$rc" = 0 ] || [ -f "$DIR/done" ] || rm -rf "$DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
T0=$(date +%s)
mkdir -p "$DIR"
log "copying $SRC_KDIR ($(du -sh "$SRC_KDIR" | cut -f1))"
cp -a "$SRC_KDIR" "$TREE"
cd "$TREE"
LOG=$DIR/build.log
scripts/kconfig/merge_config.sh -m .config "$FRAG" >"$LOG" 2>&1 || { tail -n 20 "$LOG" >&2; die "merge_config.sh failed"; }
make olddefconfig >>"$LOG" 2>&1 || { tail -n 20 "$LOG" >&2; die "make olddefconfig failed"; }
bad=0
while IFS= read -r line; do
    case "$line" in CONFIG_*=*) ;; *) continue ;; esac
    grep -qxF "$line" .config || { echo "vng-kernel.sh: config: want $line, got: $(grep -E "^(# )?${line%%=*}[= ]" .config || echo absent)" >&2; bad=1; }
done <"$FRAG"
[ "$bad" = 0 ] || die "symbols of $FRAG missing from the final .config (see above)"
log "building bzImage + modules_prepare incrementally with $JOBS jobs (log: $LOG)"
make -j"$JOBS" bzImage modules modules_prepare >>"$LOG" 2>&1 || { tail -n 30 "$LOG" >&2; die "kernel build failed"; }
cp arch/x86/boot/bzImage "$DIR/bzImage"
echo "built in $(($(date +%s) - T0)) s from $SRC_KDIR" >"$DIR/done"
log "built in $(($(date +%s) - T0)) s"
print_result
