#!/bin/bash
# Provision a Debian 12 (bookworm) machine for arfsnic guest tests.
#
# Run as root. Idempotent: a second run only verifies and rewrites $OUT/kernels.env.
#
#   - enables bookworm-backports (if missing) and installs qemu-system-x86 10.x from it
#   - installs busybox-static, cpio, gzip, xz-utils, kmod, iproute2, ethtool, build tools,
#     and the host-side TCP clients of guest-tests/e2e/tap-tcp.sh (sockperf, iperf3)
#   - installs two stock Debian guest kernels + headers: newest 6.1.0-N-amd64 and
#     newest 6.12.X+deb12-amd64 (picked with apt-cache search; the newest 6.12 comes from
#     bookworm-security, older 6.12 builds are in bookworm main)
#   - writes $OUT/kernels.env (OUT defaults to .cache/ at the repo root, git-ignored)
#
# Environment:
#   OUT=DIR               where kernels.env goes (default: <repo>/.cache)
#   PROVISION_FORCE=1     always run apt-get update/install, even if everything is present
#   KERNEL_6_1=REL        pin a release, e.g. 6.1.0-37-amd64 (default: newest available)
#   KERNEL_6_12=REL       pin a release, e.g. 6.12.48+deb12-amd64 (default: newest available)
#
# The guest kernels are installed as ordinary packages; this machine is never rebooted into
# them. We only need /boot/vmlinuz-*, /lib/modules/* and /usr/src/linux-headers-*, so the
# script exports INITRD=No, which makes initramfs-tools' kernel hook skip building an initrd
# for them (a bootloader hook, if one is installed, still runs).
set -euo pipefail

T0=$(date +%s)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
OUT=${OUT:-$REPO/.cache}

log() { printf '[provision] %s\n' "$*" >&2; }
die() { printf '[provision] ERROR: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root"
[ -r /etc/os-release ] && . /etc/os-release
[ "${VERSION_CODENAME:-}" = bookworm ] || log "warning: expected Debian 12 (bookworm), found '${VERSION_CODENAME:-unknown}'"

export DEBIAN_FRONTEND=noninteractive
# Tell kernel hooks that honour it not to build an initrd (harmless where ignored).
export INITRD=No
APT_OPTS=(-y -q -o DPkg::Lock::Timeout=900 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)

BASE_PKGS=(busybox-static cpio gzip xz-utils kmod iproute2 ethtool build-essential flex bison bc
           libelf-dev libssl-dev python3 python3-yaml sockperf iperf3)

pkg_installed() { # pkg...
    local p
    for p in "$@"; do
        dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || return 1
    done
}

qemu_is_10() {
    command -v qemu-system-x86_64 >/dev/null 2>&1 &&
        qemu-system-x86_64 --version 2>/dev/null | head -n1 | grep -Eq 'version 1[0-9]\.'
}

# Newest installed / available kernel release (the part after linux-image-) matching an ERE.
newest_installed_release() { # ERE
    dpkg-query -W -f='${Package} ${Status}\n' 'linux-image-*' 2>/dev/null |
        awk '$2=="install" && $4=="installed" {print $1}' |
        sed -n 's/^linux-image-//p' | grep -E "^$1\$" | sort -V | tail -n1 || true
}
newest_available_release() { # ERE
    apt-cache search --names-only "^linux-image-$1\$" 2>/dev/null | awk '{print $1}' |
        sed -n 's/^linux-image-//p' | grep -E "^$1\$" | sort -V | tail -n1 || true
}

RE_6_1='6\.1\.0-[0-9]+-amd64'
RE_6_12='6\.12\.[0-9]+\+deb12-amd64'

have_backports() {
    grep -Rqs -E '^[^#]*bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null
}

# Enable bookworm-backports, in the same style (deb822 or one-line) and with the same
# Debian mirror as the existing sources.
enable_backports() {
    local mirror="" signed="" f line
    # 1. deb822 sources (Debian 12 cloud images: /etc/apt/sources.list.d/debian.sources)
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        # first stanza that carries the plain 'bookworm' suite
        read -r mirror signed < <(awk '
            BEGIN{RS=""; FS="\n"}
            {
              u=""; k=""; ok=0
              for(i=1;i<=NF;i++){
                if($i ~ /^URIs:/){sub(/^URIs:[ \t]*/,"",$i); split($i,a,/[ \t]+/); u=a[1]}
                if($i ~ /^Suites:/){n=split($i,b,/[ \t]+/); for(j=2;j<=n;j++) if(b[j]=="bookworm") ok=1}
                if($i ~ /^Signed-By:/){sub(/^Signed-By:[ \t]*/,"",$i); k=$i}
              }
              if(ok && u!=""){print u, k; exit}
            }' "$f") || true
        [ -n "$mirror" ] && break
    done
    if [ -n "$mirror" ]; then
        log "adding bookworm-backports (deb822) from $mirror"
        {
            echo "Types: deb"
            echo "URIs: $mirror"
            echo "Suites: bookworm-backports"
            echo "Components: main"
            [ -n "$signed" ] && echo "Signed-By: $signed"
        } > /etc/apt/sources.list.d/bookworm-backports.sources
        return 0
    fi
    # 2. one-line sources: 'deb [options] URI bookworm ...' -- keep options and mirror
    line=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
        sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\{0,1\}\([^[:space:]]\+\)[[:space:]]\+bookworm[[:space:]].*/\1\2/p' | head -n1)
    if [ -n "$line" ]; then
        log "adding bookworm-backports (one-line) from $line"
        echo "deb $line bookworm-backports main" > /etc/apt/sources.list.d/bookworm-backports.list
        return 0
    fi
    # 3. nothing to copy from: the official mirror
    log "adding bookworm-backports (deb822) from http://deb.debian.org/debian (no bookworm source found to copy)"
    {
        echo "Types: deb"
        echo "URIs: http://deb.debian.org/debian"
        echo "Suites: bookworm-backports"
        echo "Components: main"
        [ -f /usr/share/keyrings/debian-archive-keyring.gpg ] &&
            echo "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg"
    } > /etc/apt/sources.list.d/bookworm-backports.sources
}

all_done() {
    have_backports || return 1
    qemu_is_10 || return 1
    pkg_installed "${BASE_PKGS[@]}" || return 1
    local r1 r12
    r1=${KERNEL_6_1:-$(newest_installed_release "$RE_6_1")}
    r12=${KERNEL_6_12:-$(newest_installed_release "$RE_6_12")}
    [ -n "$r1" ] && [ -n "$r12" ] || return 1
    pkg_installed "linux-image-$r1" "linux-headers-$r1" "linux-image-$r12" "linux-headers-$r12" || return 1
}

if [ "${PROVISION_FORCE:-0}" != 1 ] && all_done; then
    log "everything already installed; skipping apt (PROVISION_FORCE=1 to redo)"
    REL_6_1=${KERNEL_6_1:-$(newest_installed_release "$RE_6_1")}
    REL_6_12=${KERNEL_6_12:-$(newest_installed_release "$RE_6_12")}
else
    have_backports || enable_backports
    log "apt-get update"
    apt-get -q -o DPkg::Lock::Timeout=900 update >&2

    log "installing base packages: ${BASE_PKGS[*]}"
    apt-get install "${APT_OPTS[@]}" --no-install-recommends "${BASE_PKGS[@]}" >&2

    log "installing qemu-system-x86 from bookworm-backports"
    apt-get install "${APT_OPTS[@]}" --no-install-recommends -t bookworm-backports qemu-system-x86 >&2
    qemu_is_10 || die "qemu-system-x86_64 is not 10.x after install: $(qemu-system-x86_64 --version 2>&1 | head -n1)"

    REL_6_1=${KERNEL_6_1:-$(newest_available_release "$RE_6_1")}
    REL_6_12=${KERNEL_6_12:-$(newest_available_release "$RE_6_12")}
    [ -n "$REL_6_1" ] || die "no linux-image-6.1.0-*-amd64 available (apt-cache search)"
    [ -n "$REL_6_12" ] || die "no linux-image-6.12.*+deb12-amd64 available; check 'apt-cache policy' and that bookworm-security/bookworm-updates are enabled"
    log "guest kernels: $REL_6_1 and $REL_6_12"
    apt-get install "${APT_OPTS[@]}" --no-install-recommends \
        "linux-image-$REL_6_1" "linux-headers-$REL_6_1" \
        "linux-image-$REL_6_12" "linux-headers-$REL_6_12" >&2
fi

check_kernel() { # REL
    [ -r "/boot/vmlinuz-$1" ] || die "missing /boot/vmlinuz-$1"
    [ -d "/lib/modules/$1/kernel" ] || die "missing /lib/modules/$1"
    [ -f "/usr/src/linux-headers-$1/Makefile" ] || die "missing /usr/src/linux-headers-$1"
}
check_kernel "$REL_6_1"
check_kernel "$REL_6_12"

mkdir -p "$OUT"
tmp=$(mktemp "$OUT/kernels.env.XXXXXX")
{
    echo "# written by guest-tests/provision.sh"
    echo "QEMU=$(command -v qemu-system-x86_64)"
    echo "QEMU_VERSION=$(qemu-system-x86_64 --version | head -n1 | sed -n 's/.*version \([0-9][0-9.]*\).*/\1/p')"
    echo "KREL_6_1=$REL_6_1"
    echo "KERNEL_6_1=/boot/vmlinuz-$REL_6_1"
    echo "MODDIR_6_1=/lib/modules/$REL_6_1"
    echo "KDIR_6_1=/usr/src/linux-headers-$REL_6_1"
    echo "KREL_6_12=$REL_6_12"
    echo "KERNEL_6_12=/boot/vmlinuz-$REL_6_12"
    echo "MODDIR_6_12=/lib/modules/$REL_6_12"
    echo "KDIR_6_12=/usr/src/linux-headers-$REL_6_12"
} > "$tmp"
chmod 644 "$tmp"
mv -f "$tmp" "$OUT/kernels.env"

log "QEMU: $(qemu-system-x86_64 --version | head -n1)"
log "6.1 : /boot/vmlinuz-$REL_6_1  /lib/modules/$REL_6_1  /usr/src/linux-headers-$REL_6_1"
log "6.12: /boot/vmlinuz-$REL_6_12  /lib/modules/$REL_6_12  /usr/src/linux-headers-$REL_6_12"
log "wrote $OUT/kernels.env (took $(( $(date +%s) - T0 )) s)"
cat "$OUT/kernels.env"
