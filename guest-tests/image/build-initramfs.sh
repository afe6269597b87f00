#!/bin/bash
# Build the arfsnic guest initramfs.
#
# usage: guest-tests/image/build-initramfs.sh KERNEL_RELEASE|MODDIR|none OUT.cpio.gz
#                                             [--module path/to/extra.ko ...]
#                                             [--workload path/to/arfs-echo]
#                                             [--no-ethtool] [--hook FILE] [--disk-root]
#
#   KERNEL_RELEASE  e.g. 6.12.117+deb12-amd64: modules come from /lib/modules/<release>
#   MODDIR          a directory laid out like /lib/modules/<release> (installed or unpacked
#                   from a .deb); may lack modules.dep
#   none            self-built bzImage with virtio_pci/virtio_net built in: no modules
#
# Contents: busybox-static with applet symlinks, the static guest workload (arfs-echo,
# built from guest-tests/workload unless --workload is given), netdev-qstats (per-queue
# counters over netlink), init (guest-tests/image/init),
# the modules virtio_net needs in load order (.ko.xz/.ko.gz/.ko.zst decompressed: busybox
# insmod can't read them), extra modules (loaded by init after virtio_net), and ethtool with
# the shared libraries it needs (if ethtool is installed on this host; --no-ethtool drops it).
# --hook FILE: an executable shell script init runs once, with the interface name as its
# argument, after the modules are loaded and before the workload starts (its exit status
# and output go into the guest JSON as "hook").
# --disk-root: also the modules that mount an ext4 root on virtio-blk (virtio_blk, ext4),
# for the Debian guest (init switches to the disk root when the command line has
# arfs.root=; see README.md), and the guest module's sources (/usr/src/arfs_virtio; in
# the Debian guest at /run/arfsnic/src/arfs_virtio, to build against its headers).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

die() { printf 'build-initramfs: ERROR: %s\n' "$*" >&2; exit 1; }
log() { printf 'build-initramfs: %s\n' "$*" >&2; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | grep '^#' | sed 's/^# \{0,1\}//' >&2; exit 2; }

[ $# -ge 2 ] || usage
KSPEC=$1
OUTFILE=$2
shift 2
EXTRA=()
WORKLOAD=""
WITH_ETHTOOL=1
HOOK=""
DISK_ROOT=0
while [ $# -gt 0 ]; do
    case "$1" in
        --module) [ $# -ge 2 ] || usage; EXTRA+=("$2"); shift 2 ;;
        --workload) [ $# -ge 2 ] || usage; WORKLOAD=$2; shift 2 ;;
        --no-ethtool) WITH_ETHTOOL=0; shift ;;
        --hook) [ $# -ge 2 ] || usage; HOOK=$2; shift 2 ;;
        --disk-root) DISK_ROOT=1; shift ;;
        -h|--help) usage ;;
        *) die "unknown argument '$1'" ;;
    esac
done

# ---- modules: resolve the directory
MODDIR=""
case "$KSPEC" in
    none|builtin|--builtin) MODDIR="" ;;
    /*|./*|../*) MODDIR=$KSPEC ;;
    *) MODDIR=/lib/modules/$KSPEC ;;
esac
if [ -n "$MODDIR" ]; then
    [ -d "$MODDIR" ] || die "module directory $MODDIR does not exist"
    [ -d "$MODDIR/kernel" ] || die "$MODDIR has no kernel/ subdirectory"
fi
for m in "${EXTRA[@]}"; do [ -f "$m" ] || die "extra module $m not found"; done
[ -z "$HOOK" ] || [ -f "$HOOK" ] || die "hook script $HOOK not found"

BUSYBOX=$(command -v busybox || true)
[ -n "$BUSYBOX" ] || die "busybox not found (apt-get install busybox-static)"
is_static() { # FILE
    local out
    out=$(LC_ALL=C ldd "$1" 2>&1 || true)
    case "$out" in *"not a dynamic executable"*|*"statically linked"*) return 0 ;; esac
    return 1
}
is_static "$BUSYBOX" || die "$BUSYBOX is not statically linked (install busybox-static)"
command -v cpio >/dev/null || die "cpio not found"

STAGE=$(mktemp -d /tmp/arfsnic-initramfs.XXXXXX)
trap 'rm -rf "$STAGE"' EXIT
R=$STAGE/root
mkdir -p "$R"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,run,root,mnt,lib/modules/arfsnic/extra,etc/arfsnic}

# ---- busybox + applets
cp "$BUSYBOX" "$R/bin/busybox"
chmod 755 "$R/bin/busybox"
"$R/bin/busybox" --list-full | while read -r app; do
    [ -n "$app" ] || continue
    case "$app" in bin/busybox) continue ;; esac
    mkdir -p "$R/${app%/*}"
    [ -e "$R/$app" ] || ln -s /bin/busybox "$R/$app"
done
[ -e "$R/bin/sh" ] || die "busybox has no sh applet"

# ---- workload
make -s -C "$REPO/guest-tests/workload" O="$STAGE/workload" >&2
WORKLOAD=${WORKLOAD:-$STAGE/workload/arfs-echo}
[ -x "$WORKLOAD" ] || die "workload $WORKLOAD not executable"
cp "$WORKLOAD" "$R/bin/arfs-echo"
cp "$STAGE/workload/netdev-qstats" "$R/bin/netdev-qstats"

# ---- init
cp "$HERE/init" "$R/init"
chmod 755 "$R/init"

# ---- guest module sources (the Debian guest builds them against its own headers)
if [ "$DISK_ROOT" = 1 ]; then
    mkdir -p "$R/usr/src/arfs_virtio"
    for f in "$REPO"/guest-tests/module/{Kbuild,Makefile,*.c,*.h}; do
        [ -f "$f" ] && cp "$f" "$R/usr/src/arfs_virtio/"
    done
fi

# ---- hook
if [ -n "$HOOK" ]; then
    cp "$HOOK" "$R/etc/arfsnic/hook"
    chmod 755 "$R/etc/arfsnic/hook"
fi

# ---- device nodes (the kernel's built-in initramfs normally provides /dev/console too)
if [ "$(id -u)" = 0 ]; then
    mknod -m 600 "$R/dev/console" c 5 1
    mknod -m 666 "$R/dev/null" c 1 3
fi

# ---- ethtool and its shared libraries
if [ "$WITH_ETHTOOL" = 1 ] && command -v ethtool >/dev/null 2>&1; then
    ET=$(command -v ethtool)
    cp "$ET" "$R/usr/sbin/ethtool.bin"
    rm -f "$R/usr/sbin/ethtool" "$R/sbin/ethtool"
    ldd "$ET" | awk '/=>/ {print $3} /^[ \t]*\/.*ld-linux/ {print $1}' | while read -r lib; do
        [ -f "$lib" ] || continue
        mkdir -p "$R/$(dirname "$lib")"
        cp -L "$lib" "$R/$lib"
    done
    # Debian is merged-/usr: the interpreter path /lib64/ld-linux-x86-64.so.2 must exist
    for lib in /lib64/ld-linux-x86-64.so.2; do
        if [ ! -e "$R/$lib" ] && [ -e "$lib" ]; then mkdir -p "$R/$(dirname "$lib")"; cp -L "$lib" "$R/$lib"; fi
    done
    printf '#!/bin/sh\nexec /usr/sbin/ethtool.bin "$@"\n' > "$R/usr/sbin/ethtool"
    chmod 755 "$R/usr/sbin/ethtool"
fi

# ---- modules
# Copy one module into the image (decompressed), named <modname>.ko.
copy_module() { # SRC DSTDIR
    local src=$1 dstdir=$2 base
    base=$(basename "$src")
    base=${base%.xz}; base=${base%.gz}; base=${base%.zst}
    case "$src" in
        *.ko.xz)  xz -dc "$src" > "$dstdir/$base" ;;
        *.ko.gz)  gzip -dc "$src" > "$dstdir/$base" ;;
        *.ko.zst) command -v zstd >/dev/null || die "zstd needed for $src"; zstd -qdc "$src" > "$dstdir/$base" ;;
        *.ko)     cp "$src" "$dstdir/$base" ;;
        *) die "not a kernel module: $src" ;;
    esac
    echo "$base"
}

# modname (dashes and underscores are the same) -> path relative to MODDIR
declare -A MODPATH=()
declare -A DEPS=()
index_modules() {
    local p n
    while IFS= read -r p; do
        p=${p#"$MODDIR"/}
        n=$(basename "$p"); n=${n%%.ko*}; n=${n//-/_}
        MODPATH[$n]=$p
    done < <(find "$MODDIR/kernel" "$MODDIR/updates" "$MODDIR/extra" -name '*.ko*' 2>/dev/null)
}
is_builtin() { # modname
    [ -f "$MODDIR/modules.builtin" ] || return 1
    grep -Eq "/${1//_/[_-]}\.ko\$" "$MODDIR/modules.builtin"
}
deps_of() { # modname -> space-separated modnames
    local n=$1 p line
    p=${MODPATH[$n]:-}
    [ -n "$p" ] || return 0
    if [ -f "$MODDIR/modules.dep" ]; then
        line=$(awk -v k="$p:" '$1 == k {print; exit}' "$MODDIR/modules.dep")
        line=${line#*:}
        for d in $line; do d=$(basename "$d"); d=${d%%.ko*}; printf '%s ' "${d//-/_}"; done
    else
        # unpacked package without modules.dep: ask the module itself
        modinfo -F depends "$MODDIR/$p" 2>/dev/null | tr ',' ' '
    fi
}
ORDER=()
declare -A SEEN=()
visit() { # modname: depth-first, dependencies first
    local n=$1 d
    [ -z "${SEEN[$n]:-}" ] || return 0
    SEEN[$n]=1
    if [ -z "${MODPATH[$n]:-}" ]; then
        is_builtin "$n" && return 0
        # not a module and not listed as builtin: trust the kernel config was built in
        log "note: module $n not found in $MODDIR (assuming built in)"
        return 0
    fi
    for d in $(deps_of "$n"); do visit "$d"; done
    ORDER+=("$n")
}

if [ -n "$MODDIR" ]; then
    index_modules
    # virtio_pci: the PCI transport; virtio_net: the NIC. Anything built in is skipped.
    roots="virtio_pci virtio_net"
    # ext4 of kernels before 6.14 has a soft dependency on crc32c ("pre: crypto-crc32c",
    # which modules.dep leaves out; without it: "EXT4-fs (vda): Cannot load crc32c
    # driver" on Debian 6.12): the generic implementation goes in first where it is a module.
    crc=""
    [ -z "${MODPATH[crc32c_generic]:-}" ] || crc=crc32c_generic
    [ "$DISK_ROOT" = 0 ] || roots="$roots virtio_blk $crc ext4"
    for root in $roots; do visit "$root"; done
    : > "$R/lib/modules/arfsnic/order"
    for n in "${ORDER[@]}"; do
        f=$(copy_module "$MODDIR/${MODPATH[$n]}" "$R/lib/modules/arfsnic")
        echo "$f" >> "$R/lib/modules/arfsnic/order"
    done
    log "modules from $MODDIR (load order): ${ORDER[*]:-(none: all built in)}"
    basename "$MODDIR" > "$R/etc/arfsnic/modules-from"
else
    : > "$R/lib/modules/arfsnic/order"
    log "no modules (kernel with virtio_pci + virtio_net built in)"
fi
: > "$R/lib/modules/arfsnic/extra/order"
for m in "${EXTRA[@]}"; do
    f=$(copy_module "$m" "$R/lib/modules/arfsnic/extra")
    echo "$f" >> "$R/lib/modules/arfsnic/extra/order"
    log "extra module: $f"
done

# ---- archive
mkdir -p "$(dirname "$OUTFILE")"
tmpout=$(mktemp "$(dirname "$OUTFILE")/.initramfs.XXXXXX")
(cd "$R" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) | gzip -6 > "$tmpout"
chmod 644 "$tmpout"
mv -f "$tmpout" "$OUTFILE"
log "wrote $OUTFILE ($(du -h "$OUTFILE" | cut -f1))"
