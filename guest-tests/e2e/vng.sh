#!/usr/bin/env bash
# The arfsnic NIC in a virtme-ng (vng) VM: your kernel tree, the host's root filesystem,
# the emulated NIC as an extra vhost-user netdev, the arfs_virtio module loaded, UDP flows
# from the host and the steer count read back.
#
#   guest-tests/e2e/vng.sh --kdir TREE [--kernel BZIMAGE] [options] [-- extra vng args]
#
#   --kdir TREE       a built kernel tree (the module is built against it); its .config
#                     needs RPS, RFS_ACCEL, PCI_MSI, VIRTIO_NET=y and what vng needs
#                     (guest-tests/e2e/vng.config: 9p root, VIRTIO_CONSOLE, OVERLAY_FS);
#                     guest-tests/e2e/vng-kernel.sh makes such a copy of
#                     the patched 7.3 tree
#   --kernel BZIMAGE  the kernel to boot (default TREE/arch/x86/boot/bzImage)
#   --cpus N          vCPUs (default 4; an even N is split into two sockets = two LLCs)
#   --queues N        queue pairs of the NIC (default 4)
#   --flows N         UDP flows (default 16)
#   --duration S      seconds the guest's echo server runs (default 15; the host sends
#                     for S-4 s of it)
#   --pattern P       arfs-echo's worker pattern (default hop-across-llc: workers hop
#                     CPUs every --period-ms, so RFS moves flows and the driver steers)
#   --period-ms M     (default 200)
#   --sysctl K=V,...  written in the guest before the run, e.g. net.core.arfs_llc_affinity=1
#   --kvm             use KVM (default: TCG, vng --disable-kvm)
#   --out DIR         logs and results (default .cache/e2e/vng)
#   --min-steer N     fail unless the driver made at least N steer calls (default 1)
#
# Environment: VNG (default: vng on PATH, else .cache/vng-venv/bin/vng), QEMU (default:
# QEMU of .cache/kernels.env, else qemu-system-x86_64 on PATH; must be 10.x or newer),
# ARFSNIC (default target/release/arfsnic, built if missing).
# Needs root (network namespace and tap). Prints "Steer-C: N calls" and exits 0 when N is
# at least --min-steer, 1 otherwise. Every process, the namespace and the socket started
# here are removed on every exit path.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
VNG_VERSION=1.42

KDIR="" KERNEL="" CPUS=4 QUEUES=4 FLOWS=16 DURATION=15 PATTERN=hop-across-llc PERIOD_MS=200
SYSCTLS="" KVM=0 OUTDIR="" MIN_STEER=1
VNG_EXTRA=()
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
need_val() { [ "$#" -ge 2 ] || { echo "vng.sh: $1 needs a value (see --help)" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
    case "$1" in
        --kdir) need_val "$@"; KDIR=$2; shift 2 ;;
        --kernel) need_val "$@"; KERNEL=$2; shift 2 ;;
        --cpus) need_val "$@"; CPUS=$2; shift 2 ;;
        --queues) need_val "$@"; QUEUES=$2; shift 2 ;;
        --flows) need_val "$@"; FLOWS=$2; shift 2 ;;
        --duration) need_val "$@"; DURATION=$2; shift 2 ;;
        --pattern) need_val "$@"; PATTERN=$2; shift 2 ;;
        --period-ms) need_val "$@"; PERIOD_MS=$2; shift 2 ;;
        --sysctl) need_val "$@"; SYSCTLS=$2; shift 2 ;;
        --kvm) KVM=1; shift ;;
        --out) need_val "$@"; OUTDIR=$2; shift 2 ;;
        --min-steer) need_val "$@"; MIN_STEER=$2; shift 2 ;;
        --) shift; VNG_EXTRA=("$@"); break ;;
        -h|--help) usage; exit 0 ;;
        *) echo "vng.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

E2E_TAG=vng
# shellcheck source=guest-tests/e2e/lib.sh
. "$HERE/lib.sh"

for v in CPUS QUEUES FLOWS DURATION PERIOD_MS MIN_STEER; do
    case "${!v}" in ''|*[!0-9]*) fail "--$(echo "$v" | tr 'A-Z_' 'a-z-') wants a whole number, got '${!v}'" ;; esac
done
[ "$DURATION" -ge 8 ] || fail "--duration must be at least 8 s (the host sends for duration-4 s)"
[ "$QUEUES" -ge 1 ] && [ "$CPUS" -ge 1 ] || fail "--queues and --cpus must be at least 1"

# ------------------------------------------------------------------ prerequisites
[ -n "$KDIR" ] || { usage >&2; fail "--kdir TREE is required (a built kernel tree; guest-tests/e2e/vng-kernel.sh makes one)"; }
[ -d "$KDIR" ] || fail "--kdir $KDIR: no such directory"
KDIR=$(cd "$KDIR" && pwd)
[ -f "$KDIR/.config" ] || fail "--kdir $KDIR has no .config: configure and build it first (vng --kconfig, or guest-tests/e2e/vng-kernel.sh)"
[ -f "$KDIR/Module.symvers" ] || fail "--kdir $KDIR is not built (no Module.symvers): run make bzImage modules there"
KERNEL=${KERNEL:-$KDIR/arch/x86/boot/bzImage}
[ -f "$KERNEL" ] || fail "kernel $KERNEL not found: build the tree (make bzImage) or pass --kernel"
KERNEL=$(cd "$(dirname "$KERNEL")" && pwd)/$(basename "$KERNEL")
missing=()
for sym in RPS RFS_ACCEL PCI_MSI VIRTIO_PCI VIRTIO_NET MODULES VIRTIO_CONSOLE OVERLAY_FS UNIX98_PTYS; do
    grep -qx "CONFIG_$sym=y" "$KDIR/.config" || missing+=("CONFIG_$sym=y")
done
if ! { grep -qx 'CONFIG_9P_FS=y' "$KDIR/.config" && grep -qx 'CONFIG_NET_9P_VIRTIO=y' "$KDIR/.config"; } &&
    ! grep -qx 'CONFIG_VIRTIO_FS=y' "$KDIR/.config"; then
    missing+=("CONFIG_9P_FS=y+CONFIG_NET_9P_VIRTIO=y or CONFIG_VIRTIO_FS=y")
fi
[ ${#missing[@]} = 0 ] || fail "$KDIR/.config lacks ${missing[*]}: merge guest-tests/e2e/vng.config and guest-tests/kernel/config.fragment (scripts/kconfig/merge_config.sh -m .config FILES; make olddefconfig) and rebuild"

[ "$(id -u)" = 0 ] || fail "needs root (network namespace and tap device for the host side)"
[ -c /dev/net/tun ] || fail "/dev/net/tun missing (modprobe tun)"
command -v python3 >/dev/null || fail "python3 missing (apt-get install python3)"
command -v ip >/dev/null || fail "ip missing (apt-get install iproute2)"
command -v ethtool >/dev/null || fail "ethtool missing (apt-get install ethtool): the guest runs the host's"
command -v gcc >/dev/null || fail "gcc missing (apt-get install build-essential): the workload is built here"
if [ -z "${VNG:-}" ]; then
    VNG=$(command -v vng || true)
    [ -n "$VNG" ] || VNG=$REPO/.cache/vng-venv/bin/vng
fi
[ -x "$VNG" ] || fail "vng not found: python3 -m venv .cache/vng-venv && .cache/vng-venv/bin/pip install virtme-ng==$VNG_VERSION (or set VNG=/path/to/vng)"
VNG_HAVE=$("$VNG" --version 2>/dev/null | awk '{print $NF}')
[ "$VNG_HAVE" = "$VNG_VERSION" ] || say "warning: vng $VNG_HAVE; this script was tested with virtme-ng $VNG_VERSION"
# vng runs virtme-run from its own directory
export PATH="$(dirname "$VNG"):$PATH"
if [ -z "${QEMU:-}" ]; then
    QEMU=$( { [ -f "$REPO/.cache/kernels.env" ] && sed -n 's/^QEMU=//p' "$REPO/.cache/kernels.env"; } || true)
    [ -n "$QEMU" ] || QEMU=$(command -v qemu-system-x86_64 || true)
fi
[ -n "$QEMU" ] && [ -x "$QEMU" ] || fail "qemu-system-x86_64 not found: apt-get install -t bookworm-backports qemu-system-x86 (or guest-tests/provision.sh)"
require_qemu10 "$QEMU"
require_arfsnic

OUTDIR=${OUTDIR:-$REPO/.cache/e2e/vng}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
[ ${#OUTDIR} -le 90 ] || fail "--out $OUTDIR is too long for a unix socket path (vhost.sock in it): pick a shorter --out"
case "$OUTDIR$KERNEL" in *[[:space:]]*) fail "paths with spaces are not supported (vng joins --qemu-opts with spaces)";; esac
rm -rf "$OUTDIR/module" "$OUTDIR/bin"
rm -rf "$OUTDIR/guest"
rm -f "$OUTDIR"/{vng.out,vng.err,serve.log,serve-stats.json,client.json,guest.sh,vhost.sock}
# The guest writes its log, arfs-echo's progress and the results here (vng --rwdir): its
# stdout reaches vng's only through vng's virtio-serial ports, which virtme-ng-init finds
# with udev (a kernel without INOTIFY_USER falls back to the serial console).
RW=$OUTDIR/guest
mkdir -p "$RW"

VNG_PID=""
vng_cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [ -n "$VNG_PID" ] && kill -0 "$VNG_PID" 2>/dev/null; then
        kill -TERM -- "-$VNG_PID" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do kill -0 "$VNG_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL -- "-$VNG_PID" 2>/dev/null || true
    fi
    stop_pid "$SERVE_PID"
    [ "$NS_MADE" = 0 ] || ip netns del "$NS" 2>/dev/null || true
    [ -z "$SOCK" ] || rm -f "$SOCK"
    exit "$rc"
}
trap vng_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
T0=$(date +%s.%N)

# ------------------------------------------------------------------ module and workload
say "building arfs_virtio.ko against $KDIR"
mkdir -p "$OUTDIR/module"
for f in "$REPO"/guest-tests/module/{Makefile,Kbuild,*.c,*.h}; do
    case "$f" in *.mod.c) continue ;; esac # kbuild's output of an in-place build
    cp "$f" "$OUTDIR/module/"
done
make -C "$OUTDIR/module" KDIR="$KDIR" >"$OUTDIR/module.log" 2>&1 \
    || { tail -n 20 "$OUTDIR/module.log" >&2; fail "the module does not build against $KDIR (log: $OUTDIR/module.log)"; }
KO=$OUTDIR/module/arfs_virtio.ko
[ -f "$KO" ] || fail "make produced no $KO"
make -C "$REPO/guest-tests/workload" O="$OUTDIR/bin" >"$OUTDIR/workload.log" 2>&1 \
    || { tail -n 20 "$OUTDIR/workload.log" >&2; fail "building arfs-echo failed (static glibc: apt-get install build-essential)"; }

# ------------------------------------------------------------------ backend and host side
serve_start "$OUTDIR" "$QUEUES" --mac "$GUEST_MAC" --connections 1 --stats "$OUTDIR/serve-stats.json"

# ------------------------------------------------------------------ the guest's script
cat >"$OUTDIR/guest.sh" <<EOF
#!/bin/sh
# run by vng --exec inside the guest (generated by guest-tests/e2e/vng.sh)
MAC=$GUEST_MAC KO=$KO ECHO=$OUTDIR/bin/arfs-echo SYSCTLS='$SYSCTLS' RW=$RW
FLOWS=$FLOWS DURATION=$DURATION PATTERN=$PATTERN PERIOD_MS=$PERIOD_MS
EOF
cat >>"$OUTDIR/guest.sh" <<'EOF'
LOG=$RW/guest.log
say() { echo "vng-guest: $*" | tee -a "$LOG"; }
die() { echo "VNG-GUEST-ERROR: $*" | tee -a "$LOG"; exit 1; }
IF=
for d in /sys/class/net/*; do
    [ "$(cat "$d/address" 2>/dev/null)" = "$MAC" ] && IF=${d##*/}
done
[ -n "$IF" ] || die "no interface with MAC $MAC (have: $(ls /sys/class/net | tr '\n' ' '))"
say "kernel $(uname -r), $(grep -c ^processor /proc/cpuinfo) CPUs, NIC $IF ($(basename "$(readlink "/sys/class/net/$IF/device")")), $(ls -d /sys/class/net/$IF/queues/rx-* | wc -l) RX queues"
ip link set lo up
ip addr add 10.98.0.2/24 dev "$IF" || die "ip addr add failed"
ip link set "$IF" up || die "ip link set $IF up failed"
i=0
while [ "$(cat /sys/class/net/$IF/carrier 2>/dev/null)" != 1 ]; do
    i=$((i + 1)); [ $i -le 300 ] || die "no carrier on $IF after 30 s"; sleep 0.1
done
echo 32768 > /proc/sys/net/core/rps_sock_flow_entries || die "writing rps_sock_flow_entries failed (CONFIG_RPS?)"
for q in /sys/class/net/$IF/queues/rx-*; do echo 4096 > "$q/rps_flow_cnt" || die "writing $q/rps_flow_cnt failed"; done
for kv in $(echo "$SYSCTLS" | tr , ' '); do
    p=/proc/sys/$(echo "${kv%%=*}" | tr . /)
    [ -e "$p" ] || die "sysctl ${kv%%=*} does not exist in this kernel"
    echo "${kv#*=}" > "$p" || die "writing sysctl $kv failed"
    say "sysctl $kv"
done
grep -E 'CPU0|virtio' /proc/interrupts | grep -E 'CPU0|input' | sed 's/^/vng-guest: /' | tee -a "$LOG"
insmod "$KO" ifname="$IF" || die "insmod $KO ifname=$IF failed (dmesg: $(dmesg | grep -i arfs | tail -n 3 | tr '\n' ' '))"
grep -q '^arfs_virtio ' /proc/modules || die "arfs_virtio is not in /proc/modules after insmod"
say "module loaded: $(grep '^arfs_virtio ' /proc/modules)"
steer() { ethtool -S "$IF" | awk '$1 == "arfs_steer_calls:" { print $2; f = 1 } END { if (!f) print "none" }'; }
S0=$(steer)
[ "$S0" != none ] || die "ethtool -S $IF has no arfs_steer_calls: the module did not attach"
ulimit -n $((FLOWS + 256)) 2>/dev/null
# stderr (the "ready" line the host waits for, progress) to the shared directory
"$ECHO" --flows "$FLOWS" --base-port 7000 --peer 10.98.0.1 --peer-base-port 9000 \
    --pattern "$PATTERN" --period-ms "$PERIOD_MS" --duration-s "$DURATION" >/tmp/echo.out 2>"$RW/echo.err" \
    || die "arfs-echo exited with status $?"
S1=$(steer)
ethtool -S "$IF" | grep -E '^ *(arfs|dev)_' | sed 's/^ */vng-guest: ethtool -S: /' | tee -a "$LOG"
{ sed -n '/^ARFS-ECHO-JSON-BEGIN$/,/^ARFS-ECHO-JSON-END$/p' /tmp/echo.out | sed '1d;$d' | tr -d '\n' | sed 's/^/VNG-ECHO-JSON: /'
  echo; } >> "$LOG"
echo "VNG-STEER-CALLS: $((S1 - S0)) $DURATION" | tee -a "$LOG"
say done
EOF

# ------------------------------------------------------------------ vng
QOPTS="-chardev socket,id=arfsc0,path=$SOCK"
QOPTS+=" -netdev vhost-user,id=arfsn0,chardev=arfsc0,queues=$QUEUES"
QOPTS+=" -device virtio-net-pci,netdev=arfsn0,mq=on,hash=on,vectors=$((2 * QUEUES + 2)),mac=$GUEST_MAC"
# QEMU opens vng's stdout and stderr by /proc/self/fd/N once per chardev (console, the
# command's stdout/stderr): on a regular file each open has its own offset and truncates,
# so the outputs overwrite each other. Pipes (through cat) keep them whole.
VNG_ARGS=(--run "$KERNEL" --disable-microvm --cpus "$CPUS" --memory 1G --numa 1G --qemu "$QEMU" --verbose)
# without virtio-fs in the kernel, 9p even where virtiofsd is installed
grep -qx 'CONFIG_VIRTIO_FS=y' "$KDIR/.config" || VNG_ARGS+=(--force-9p)
if [ "$KVM" = 1 ]; then
    [ -w /dev/kvm ] || fail "--kvm: /dev/kvm missing or not writable"
else
    # single-threaded TCG, as the runner picks on a 2-core host (guest-tests/e2e/lib.sh)
    VNG_ARGS+=(--disable-kvm)
    QOPTS+=" -accel tcg,thread=single"
fi
if [ "$CPUS" -ge 2 ] && [ $((CPUS % 2)) = 0 ]; then
    QOPTS+=" -smp $CPUS,sockets=2,cores=$((CPUS / 2)),threads=1"
fi
say "vng $VNG_HAVE: booting $KERNEL (${CPUS} vCPUs, $([ "$KVM" = 1 ] && echo KVM || echo TCG)), NIC with $QUEUES queue pairs on $SOCK"
(cd "$OUTDIR" && exec setsid "$VNG" "${VNG_ARGS[@]}" "--rwdir=$RW" "${VNG_EXTRA[@]}" --exec "sh $OUTDIR/guest.sh" \
    "--qemu-opts=$QOPTS" </dev/null > >(cat >"$OUTDIR/vng.out") 2> >(cat >"$OUTDIR/vng.err")) &
VNG_PID=$!
T_BOOT=$(date +%s.%N)

for ((i = 0; i < 6000; i++)); do
    grep -q 'arfs-echo: ready' "$RW/echo.err" 2>/dev/null && break
    if grep -q 'VNG-GUEST-ERROR' "$RW/guest.log" 2>/dev/null || ! kill -0 "$VNG_PID" 2>/dev/null; then
        tail -n 30 "$OUTDIR/vng.err" >&2; tail -n 20 "$OUTDIR/vng.out" >&2
        grep -h 'VNG-GUEST-ERROR' "$RW/guest.log" >&2 || true
        fail "the guest did not start arfs-echo (logs: $RW/guest.log, $OUTDIR/vng.err)"
    fi
    sleep 0.1
done
grep -q 'arfs-echo: ready' "$RW/echo.err" 2>/dev/null || { tail -n 30 "$OUTDIR/vng.err" >&2; fail "arfs-echo not ready 600 s after vng started"; }
grep -q 'falling back on userspace virtio' "$OUTDIR/vng.err" \
    && fail "QEMU fell back to userspace virtio (no shared guest memory): the backend never sees traffic"
T_READY=$(date +%s.%N)
grep '^vng-guest:' "$RW/guest.log" | sed 's/^/  /'

SECS=$((DURATION - 4))
say "guest ready $(awk -v a="$T_BOOT" -v b="$T_READY" 'BEGIN { printf "%.0f", b - a }') s after vng started; $FLOWS UDP flows from $NS for $SECS s"
CLIENT_RC=0
ip netns exec "$NS" python3 "$REPO/guest-tests/image/udp-echo-client.py" --host 10.98.0.2 \
    --remote-base 7000 --local-base 9000 --flows "$FLOWS" --seconds "$SECS" --window 2 \
    >"$OUTDIR/client.json" || CLIENT_RC=$?

for ((i = 0; i < 1200; i++)); do kill -0 "$VNG_PID" 2>/dev/null || break; sleep 0.1; done
kill -0 "$VNG_PID" 2>/dev/null && { tail -n 20 "$OUTDIR/vng.err" >&2; fail "vng still running 120 s after the traffic ended"; }
VNG_RC=0
wait "$VNG_PID" || VNG_RC=$?
VNG_PID=""
for ((i = 0; i < 100; i++)); do kill -0 "$SERVE_PID" 2>/dev/null || break; sleep 0.1; done
stop_pid "$SERVE_PID"
wait "$SERVE_PID" 2>/dev/null || true
SERVE_PID=""
T1=$(date +%s.%N)

# ------------------------------------------------------------------ verdict
python3 - "$OUTDIR" "$FLOWS" "$CLIENT_RC" "$VNG_RC" "$MIN_STEER" "$T0" "$T1" <<'PY'
import json, re, sys
out, flows, client_rc, vng_rc, min_steer = sys.argv[1], *map(int, sys.argv[2:6])
t0, t1 = float(sys.argv[6]), float(sys.argv[7])
ok = True
def check(cond, msg):
    global ok
    print(("[vng] ok   " if cond else "[vng] FAIL ") + msg)
    ok &= bool(cond)
try:
    text = open(out + "/guest/guest.log", errors="replace").read()
except OSError:
    text = ""
for l in text.splitlines():
    if l.startswith("vng-guest: ethtool -S: arfs_"):
        print("  " + l[len("vng-guest: "):])
err = re.findall(r"^VNG-GUEST-ERROR: .*$", text, re.M)
check(not err, "guest script: %s" % (err[0] if err else "no error"))
check("vng-guest: done" in text, "guest script ran to its end")
console = open(out + "/vng.err", errors="replace").read()
if vng_rc == 255 and "starting script (console fallback)" in console:
    # virtme-ng-init found no virtio-serial ports (udev needs INOTIFY_USER): the script ran
    # on the console and vng has no exit status to return; guest.log says how it ended
    print("[vng] note vng exit status 255: the kernel has no INOTIFY_USER, so virtme-ng-init"
          " ran the script on the console (no exit status through vng)")
else:
    check(vng_rc == 0, "vng exit status %d" % vng_rc)
check("vng-guest: module loaded" in text, "arfs_virtio loaded in the guest")
try:
    c = json.load(open(out + "/client.json"))
    check(client_rc == 0 and c["flows_with_replies"] == flows,
          "client: %d/%d flows got replies, %d requests, %d replies" % (c["flows_with_replies"], flows, c["sent"], c["replies"]))
except Exception as e:
    check(False, "client output: %s" % e)
m = re.search(r"^VNG-ECHO-JSON: (\{.*\})\s*$", text, re.M)
if m:
    w = json.loads(m.group(1))
    hops = sum(x.get("migrations", 0) for x in w.get("workers", []))
    print("[vng] arfs-echo: %d requests served, %d worker migrations, LLC groups %s"
          % (w["requests"], hops, w.get("llc_groups")))
try:
    s = json.load(open(out + "/serve-stats.json"))
    f = s["filter"]
    print("[vng] device (serve --stats): filter adds %d, mods %d, dels %d, rx packets per queue %s"
          % (f["adds"], f["mods"], f["dels"], s["rx_packets"]))
except Exception as e:
    print("[vng] serve --stats unreadable: %s" % e)
m = re.search(r"^VNG-STEER-CALLS: (-?\d+) (\d+)", text, re.M)
if m:
    n, d = int(m.group(1)), int(m.group(2))
    print("Steer-C: %d calls (%.1f/s over the %d s run)" % (n, n / d, d))
    check(n >= min_steer, "steering: %d ndo_rx_flow_steer calls (need >= %d)" % (n, min_steer))
else:
    check(False, "steering: the guest printed no steer count")
print("[vng] wall time %.0f s" % (t1 - t0))
sys.exit(0 if ok else 1)
PY
say "PASS (logs in $OUTDIR)"
