#!/usr/bin/env bash
# Build a patched guest kernel (bzImage + a prepared tree for out-of-tree modules) from
# Debian's linux-source-7.3 (trixie-backports) or linux-source-6.12 (bookworm), cached by
# the sha256 of its inputs.
#
#   guest-tests/kernel/build.sh [--base 7.3|6.12] [--out DIR] [--patch FILE|DIR ...]
#                               [--no-patch] [--jobs N]
#
# Default patch set: guest-tests/kernel/patches/<base>/*.patch (in name order). --patch
# replaces the default set (repeatable; a directory means its *.patch in name order);
# --no-patch builds the unpatched source. Output: DIR/<key>/{bzImage,linux-<version>/,
# kernel.env,build.log} (DIR defaults to .cache/kernels in the repo). A second call with
# the same inputs returns at once; a series that extends a cached one starts from a copy
# of its built tree. See guest-tests/kernel/README.md.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
FRAGMENT="$HERE/config.fragment"
BASE=7.3
BUILD_DEPS=(flex bison bc libelf-dev libssl-dev build-essential xz-utils patch)
# Bump when the way a cache entry is produced changes (part of the key).
RECIPE=1

OUT="$REPO/.cache/kernels"
JOBS=$(nproc 2>/dev/null || echo 2)
NO_PATCH=0
PATCHES=()
USER_PATCHES=0

die() { echo "build.sh: error: $*" >&2; exit 1; }
log() { echo "build.sh: $*" >&2; }
usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }
add_patch() { # FILE or DIR
    local f
    if [ -d "$1" ]; then
        shopt -s nullglob
        local fs=("$1"/*.patch)
        shopt -u nullglob
        [ ${#fs[@]} -gt 0 ] || die "--patch $1: the directory holds no *.patch files"
        for f in "${fs[@]}"; do PATCHES+=("$(cd "$(dirname "$f")" && pwd)/$(basename "$f")"); done
    elif [ -f "$1" ]; then
        PATCHES+=("$(cd "$(dirname "$1")" && pwd)/$(basename "$1")")
    else
        die "--patch $1: no such file or directory"
    fi
}

while [ $# -gt 0 ]; do
    case "$1" in
        --out) [ $# -ge 2 ] || die "--out needs a directory"; OUT=$2; shift 2 ;;
        --patch) [ $# -ge 2 ] || die "--patch needs a file or directory"
                 add_patch "$2"; USER_PATCHES=1; shift 2 ;;
        --base) [ $# -ge 2 ] || die "--base needs 7.3 or 6.12"; BASE=$2; shift 2 ;;
        --no-patch) NO_PATCH=1; shift ;;
        --jobs|-j) [ $# -ge 2 ] || die "--jobs needs a number"; JOBS=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done
case "$JOBS" in ''|*[!0-9]*) die "--jobs wants a positive number, got '$JOBS'" ;; esac
[ "$JOBS" -ge 1 ] || die "--jobs wants a positive number"
[ "$NO_PATCH" = 1 ] && [ "$USER_PATCHES" = 1 ] && die "--no-patch and --patch exclude each other"
case "$BASE" in
    7.3|6.12) SRC_PKG=linux-source-$BASE ;;
    *) die "--base $BASE: unknown base; valid: 7.3 (Debian linux-source-7.3, trixie-backports), 6.12 (Debian linux-source-6.12, bookworm)" ;;
esac
if [ "$NO_PATCH" = 1 ]; then
    PATCHES=()
elif [ "$USER_PATCHES" = 0 ]; then
    shopt -s nullglob
    PATCHES=("$HERE/patches/$BASE"/*.patch)
    shopt -u nullglob
    [ ${#PATCHES[@]} -gt 0 ] || die "no patches in $HERE/patches/$BASE (use --no-patch for a plain kernel)"
fi
[ -f "$FRAGMENT" ] || die "config fragment missing: $FRAGMENT"
# Per-base additions (optional): config-<base>.fragment, merged after config.fragment.
OVERLAY="$HERE/config-$BASE.fragment"
[ -f "$OVERLAY" ] || OVERLAY=""
DROPPED=" "
[ -n "$OVERLAY" ] && DROPPED=" $(sed -n 's/^# drop: *\(CONFIG_[A-Za-z0-9_]*\).*/\1/p' "$OVERLAY" | tr '\n' ' ')"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# ------------------------------------------------------------------ host packages
# linux-source-6.12 is a bookworm package (installed with apt); linux-source-7.3 comes
# from trixie-backports, fetched as a .deb with a private apt state (debian-apt.sh) and
# unpacked here, so the host's apt sources stay as they are.
HOST_PKGS=("${BUILD_DEPS[@]}")
[ "$BASE" = 6.12 ] && HOST_PKGS+=("$SRC_PKG")
missing=()
for p in "${HOST_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "missing packages: ${missing[*]} (run as root once, or: apt-get install ${missing[*]})"
    log "installing ${missing[*]} (apt)"
    apt-get -o DPkg::Lock::Timeout=900 install -y --no-install-recommends "${missing[@]}" >&2 \
        || die "apt-get install ${missing[*]} failed"
fi
if [ "$BASE" = 6.12 ]; then
    SRC_VERSION=$(dpkg-query -W -f='${Version}' "$SRC_PKG")
    TARBALL=$(dpkg-query -L "$SRC_PKG" | grep -E '/usr/src/linux-source-6\.12[^/]*\.tar\.(xz|bz2|gz)$' | head -n1 || true)
    [ -n "$TARBALL" ] && [ -f "$TARBALL" ] || die "$SRC_PKG $SRC_VERSION is installed but its source tarball is missing"
else
    DEBS="${ARFSNIC_CACHE:-$REPO/.cache}/debs"
    if ! DEB=$(bash "$HERE/debian-apt.sh" download "$DEBS" "$SRC_PKG"); then
        # No registry: a .deb fetched earlier (or put there by hand) will do.
        DEB=$(find "$DEBS" -maxdepth 1 -name "${SRC_PKG}_*_all.deb" 2>/dev/null | sort -V | tail -n1)
        [ -n "$DEB" ] || die "cannot fetch $SRC_PKG from Debian trixie-backports (see above) and $DEBS holds no ${SRC_PKG}_*_all.deb: reach a Debian mirror, or put the .deb there"
        log "no registry: using $(basename "$DEB") from $DEBS"
    fi
    SRC_VERSION=$(dpkg-deb -f "$DEB" Version) || die "$DEB is not a readable .deb"
    TARBALL="$DEBS/$SRC_PKG-$SRC_VERSION.tar.xz"
    if [ ! -f "$TARBALL" ]; then
        log "extracting the source tarball from $(basename "$DEB")"
        dpkg-deb --fsys-tarfile "$DEB" | tar -xO --wildcards "./usr/src/$SRC_PKG.tar.*" > "$TARBALL.tmp" ||
            { rm -f "$TARBALL.tmp"; die "$DEB holds no usr/src/$SRC_PKG.tar.*"; }
        mv "$TARBALL.tmp" "$TARBALL"
    fi
fi

# ------------------------------------------------------------------ cache key
manifest() { # [N]: the manifest of the first N patches (default: all of them)
    local n=${1:-${#PATCHES[@]}} i
    echo "recipe $RECIPE"
    echo "source $SRC_PKG $SRC_VERSION"
    for ((i = 0; i < n; i++)); do echo "patch $(sha256sum < "${PATCHES[$i]}" | cut -d' ' -f1)"; done
    echo "fragment $(sha256sum < "$FRAGMENT" | cut -d' ' -f1)"
    [ -z "$OVERLAY" ] || echo "fragment-$BASE $(sha256sum < "$OVERLAY" | cut -d' ' -f1)"
}
KEY=$(manifest | sha256sum | cut -c1-16)
DIR="$OUT/$KEY"

print_result() {
    # shellcheck disable=SC1091
    . "$DIR/kernel.env"
    echo "KERNEL=$KERNEL"
    echo "KDIR=$KDIR"
    echo "KEY=$KEY"
    echo "VERSION=$VERSION"
    echo "ENV=$DIR/kernel.env"
}

if [ -f "$DIR/kernel.env" ] && [ -f "$DIR/bzImage" ]; then
    log "cached: $DIR"
    print_result
    exit 0
fi

# One builder per key at a time (CI and a user may race).
exec 9>"$OUT/$KEY.lock"
if ! flock -n 9; then
    log "another build of $KEY is running; waiting for it"
    flock 9
fi
if [ -f "$DIR/kernel.env" ] && [ -f "$DIR/bzImage" ]; then
    log "cached: $DIR"
    print_result
    exit 0
fi

rm -rf "$DIR"
mkdir -p "$DIR"
manifest > "$DIR/inputs.txt"
LOG="$DIR/build.log"
: > "$LOG"
# A failed or interrupted build leaves no half tree behind (it is 1.5 GB): its log is kept
# as <key>.failed.log next to the cache entries.
cleanup() {
    local rc=$?
    if [ "$rc" != 0 ] && [ ! -f "$DIR/kernel.env" ]; then
        cp "$LOG" "$OUT/$KEY.failed.log" 2>/dev/null && echo "build.sh: log kept in $OUT/$KEY.failed.log" >&2
        rm -rf "$DIR"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
T0=$(date +%s)

log "key $KEY: $SRC_PKG $SRC_VERSION, ${#PATCHES[@]} patch(es), $(basename "$FRAGMENT")"
# A series that extends a cached one (same source, fragments and first patches) starts
# from a copy of that build: only the files its further patches touch are rebuilt, the
# way a developer adds a patch to a built tree. The longest cached prefix wins.
SEED=""
SEED_N=0
for ((n = ${#PATCHES[@]} - 1; n >= 0; n--)); do
    k=$(manifest "$n" | sha256sum | cut -c1-16)
    if [ -f "$OUT/$k/kernel.env" ] && [ -f "$OUT/$k/bzImage" ]; then
        SEED=$k SEED_N=$n
        break
    fi
done
# Sources this x86 build never compiles stay packed: other architectures, the GPU drivers
# and sound (about 0.8 GB of the 2.2 GB tree). Their Kconfig files and Makefiles are
# unpacked, since Kconfig reads every file it sources whatever the configuration.
SKIP_ARCHES="alpha arc arm arm64 csky hexagon loongarch m68k microblaze mips nios2 openrisc parisc powerpc riscv s390 sh sparc xtensa"
EXCLUDES=()
for a in $SKIP_ARCHES; do
    EXCLUDES+=(--exclude="$SRC_PKG/arch/$a/*.[chS]" --exclude="$SRC_PKG/arch/$a/*.dts*")
done
EXCLUDES+=(--exclude="$SRC_PKG/drivers/gpu/*.[ch]" --exclude="$SRC_PKG/sound/*.[ch]")
if [ -n "$SEED" ]; then
    VERSION=$(sed -n 's/^VERSION=//p' "$OUT/$SEED/kernel.env")
    [ -n "$VERSION" ] && [ -d "$OUT/$SEED/linux-$VERSION" ] || die "cache entry $OUT/$SEED has no tree (remove it)"
    log "starting from the cached build of the first $SEED_N patch(es) (key $SEED): copying its tree"
    # cp -a keeps the objects' times, so make rebuilds only what the further patches touch.
    cp -a --reflink=auto "$OUT/$SEED/linux-$VERSION" "$DIR/" || die "copying $OUT/$SEED/linux-$VERSION failed"
    TREE="$DIR/linux-$VERSION"
else
    log "unpacking $TARBALL (without other architectures' sources, drivers/gpu and sound)"
    tar -xf "$TARBALL" -C "$DIR" --wildcards "${EXCLUDES[@]}" || die "unpacking $TARBALL failed"
    [ -d "$DIR/$SRC_PKG" ] || die "unexpected tarball layout (no $SRC_PKG/)"
    VERSION=$(make -s -C "$DIR/$SRC_PKG" kernelversion 2>/dev/null) || die "cannot read the kernel version"
    TREE="$DIR/linux-$VERSION"
    mv "$DIR/$SRC_PKG" "$TREE"
fi
cd "$TREE"

for p in "${PATCHES[@]:$SEED_N}"; do
    log "applying $(basename "$p")"
    patch -p1 --forward --batch < "$p" >> "$LOG" 2>&1 \
        || { grep -E 'FAILED|malformed|can.t find file' "$LOG" | tail -n 10 >&2
             die "patch $(basename "$p") does not apply to $SRC_PKG $SRC_VERSION (rebase it, or try --base $([ "$BASE" = 7.3 ] && echo 6.12 || echo 7.3)); log: $OUT/$KEY.failed.log"; }
done

# ------------------------------------------------------------------ configuration
log "make tinyconfig + $(basename "$FRAGMENT")"
make tinyconfig >> "$LOG" 2>&1 || { tail -n 20 "$LOG" >&2; die "make tinyconfig failed"; }
cp "$FRAGMENT" "$DIR/config.fragment"
[ -z "$OVERLAY" ] || cp "$OVERLAY" "$DIR/"
scripts/kconfig/merge_config.sh -m .config "$FRAGMENT" ${OVERLAY:+"$OVERLAY"} >> "$LOG" 2>&1 \
    || { tail -n 20 "$LOG" >&2; die "merge_config.sh failed"; }
make olddefconfig >> "$LOG" 2>&1 || { tail -n 20 "$LOG" >&2; die "make olddefconfig failed"; }

# Every CONFIG_X=value line of the fragment must survive olddefconfig unchanged
# (an unmet dependency silently drops a symbol otherwise).
bad=0
while IFS= read -r line; do
    line=${line%%#*}
    line=$(echo "$line" | tr -d '[:space:]')
    case "$line" in CONFIG_*=*) ;; *) continue ;; esac
    case "$DROPPED" in *" ${line%%=*} "*) continue ;; esac
    if ! grep -qxF "$line" .config; then
        have=$(grep -E "^(# )?${line%%=*}[= ]" .config || echo "absent")
        echo "build.sh: config: want $line, final .config has: $have" >&2
        bad=1
    fi
done < <(cat "$FRAGMENT" ${OVERLAY:+"$OVERLAY"})
[ "$bad" = 0 ] || die "config fragment symbols missing from the final .config (see above)"
log "config: all $(cat "$FRAGMENT" ${OVERLAY:+"$OVERLAY"} | grep -c '^CONFIG_') fragment symbols set${OVERLAY:+ (with $(basename "$OVERLAY"))}"

# ------------------------------------------------------------------ build
# Progress: count the objects make reports ("  CC  foo.o", "  AS", "  LD", ...) against
# the count of the last successful build (1300-odd for this config). Without a terminal
# a line is printed every BUILD_PROGRESS_STEP percent (default 10; `arfsnic demo` sets 1
# and draws its own progress bar from these lines).
EST=$(cat "$OUT/.objects-$BASE" 2>/dev/null || cat "$OUT/.objects" 2>/dev/null || echo 1400)
case "$EST" in ''|*[!0-9]*) EST=1400 ;; esac
TTY=0; [ -t 2 ] && TTY=1
log "building bzImage + modules_prepare with $JOBS jobs ($([ -n "$SEED" ] && echo "what the further patches touch" || echo "about 7-8 min on 2 cores"); log: $LOG)"
set +e
make -j"$JOBS" bzImage modules modules_prepare 2>&1 | tee -a "$LOG" | awk -v est="$EST" -v tty="$TTY" -v step="${BUILD_PROGRESS_STEP:-10}" '
    /^  [A-Z][A-Z0-9_]* +[^ ]/ { n++
        pct = int(n * 100 / est); if (pct > 99) pct = 99
        if (tty) { if (pct != last || n % 25 == 0) printf "\rbuild.sh: building: %3d%% (%d objects)", pct, n > "/dev/stderr" }
        else if (shown == -1 || pct >= shown + step) { shown = pct; printf "build.sh: building: %3d%% (%d objects)\n", pct, n > "/dev/stderr"; fflush("/dev/stderr") }
        last = pct
    }
    BEGIN { last = -1; shown = -1 }
    END { if (tty) printf "\n" > "/dev/stderr"; print n > "/dev/stdout" }' > "$DIR/.objects"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" != 0 ]; then
    grep -E 'error|Error' "$LOG" | tail -n 20 >&2 || true
    tail -n 20 "$LOG" >&2
    die "kernel build failed (exit $rc)"
fi
[ -f arch/x86/boot/bzImage ] || die "build finished but arch/x86/boot/bzImage is missing"
# A build from a copied tree compiles a few objects: no estimate for the next full one.
if [ -z "$SEED" ]; then mv "$DIR/.objects" "$OUT/.objects-$BASE"; else rm -f "$DIR/.objects"; fi
cp arch/x86/boot/bzImage "$DIR/bzImage"
T1=$(date +%s)

cat > "$DIR/kernel.env.tmp" <<EOF
# written by guest-tests/kernel/build.sh
KERNEL=$DIR/bzImage
KDIR=$TREE
KEY=$KEY
VERSION=$VERSION
BASE=$BASE
SOURCE="$SRC_PKG $SRC_VERSION"
PATCHES="$(for p in "${PATCHES[@]}"; do printf '%s ' "$(basename "$p")"; done)"
BUILD_SECONDS=$((T1 - T0))
FROM_KEY=$SEED
EOF
mv "$DIR/kernel.env.tmp" "$DIR/kernel.env"
rm -f "$OUT/$KEY.failed.log"
log "built $VERSION in $((T1 - T0)) s"
print_result
