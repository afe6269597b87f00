# Shared by the tap-mode end-to-end scripts (tap.sh, ../soak.sh): the guest kernel from
# provision.sh's .cache/kernels.env, a network namespace holding the tap of an
# `arfsnic serve --tap`, QEMU started on its socket, waiting on the serial console, and
# cleanup on every exit path. Source it after setting REPO and E2E_TAG (the log prefix).
# shellcheck shell=bash

say() { printf '[%s] %s\n' "$E2E_TAG" "$*"; }
fail() { printf '[%s] FAIL: %s\n' "$E2E_TAG" "$*" >&2; exit 1; }

# e2e_env KERNEL_NAME: root, tun, python3, QEMU >= 10 and the kernel; sets QEMU KERNEL KREL
# KDIR and ARFSNIC (built if missing).
e2e_env() {
    [ "$(id -u)" = 0 ] || fail "needs root (network namespace, tap device)"
    [ -c /dev/net/tun ] || fail "/dev/net/tun missing (modprobe tun)"
    command -v python3 >/dev/null || fail "python3 missing (apt-get install python3)"
    local envf=$REPO/.cache/kernels.env
    [ -f "$envf" ] || fail "$envf missing: run guest-tests/provision.sh first"
    # shellcheck disable=SC1090
    . "$envf"
    case "$1" in
        debian-6.12) KERNEL=$KERNEL_6_12 KREL=$KREL_6_12 KDIR=${KDIR_6_12:-} ;;
        debian-6.1) KERNEL=$KERNEL_6_1 KREL=$KREL_6_1 KDIR=${KDIR_6_1:-} ;;
        *) fail "--kernel must be debian-6.12 or debian-6.1, not '$1'" ;;
    esac
    QEMU=${QEMU_BIN:-$QEMU}
    [ -x "$QEMU" ] || fail "QEMU $QEMU not found: run guest-tests/provision.sh"
    [ -f "$KERNEL" ] || fail "kernel $KERNEL not found: run guest-tests/provision.sh"
    require_qemu10 "$QEMU"
    require_arfsnic
}

# require_qemu10 QEMU: vhost-user-net with MSI-X under TCG needs QEMU 10 (7.2 segfaults).
require_qemu10() {
    local major
    major=$("$1" --version | sed -n 's/.*version \([0-9]*\)\..*/\1/p' | head -n1)
    [ "${major:-0}" -ge 10 ] || fail "$1 is QEMU ${major:-?}; vhost-user + MSI-X under TCG needs QEMU >= 10 (bookworm-backports; set QEMU= or run guest-tests/provision.sh)"
}

# require_arfsnic: sets ARFSNIC (default target/release/arfsnic), built if missing.
require_arfsnic() {
    ARFSNIC=${ARFSNIC:-$REPO/target/release/arfsnic}
    if [ ! -x "$ARFSNIC" ]; then
        say "building $ARFSNIC (cargo build --release)"
        (cd "$REPO" && cargo build --release --bin arfsnic) || fail "cargo build --release failed"
    fi
}

SERVE_PID="" QEMU_PID="" NS_MADE=0 NS="" TAP="" SOCK=""

# Stop a process: TERM, up to 5 s, then KILL.
stop_pid() {
    [ -n "$1" ] && kill -0 "$1" 2>/dev/null || return 0
    kill "$1" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$1" 2>/dev/null || true
}

e2e_cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_pid "$QEMU_PID"
    stop_pid "$SERVE_PID"
    [ "$NS_MADE" = 0 ] || ip netns del "$NS" 2>/dev/null || true
    [ -z "$SOCK" ] || rm -f "$SOCK"
    exit "$rc"
}

e2e_traps() {
    trap e2e_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

# serve_start OUTDIR QUEUES [serve args...]: a free namespace/tap pair, `arfsnic serve --tap`
# with its socket in OUTDIR, the tap moved into the namespace as 10.98.0.1/24.
# Sets NS TAP SOCK SERVE_PID.
serve_start() {
    local outdir=$1 queues=$2
    shift 2
    local c k
    for ((k = 0; k < 100; k++)); do
        c=$(printf '%02d' $(( ($$ + k) % 100 )))
        if ! ip netns list | grep -qw "arfsnic-tap$c" && ! ip link show "arfstap$c" >/dev/null 2>&1; then
            NS=arfsnic-tap$c TAP=arfstap$c
            break
        fi
    done
    [ -n "$NS" ] || fail "no free arfsnic-tapNN namespace name"
    SOCK=$outdir/vhost.sock
    ip netns add "$NS"
    NS_MADE=1
    ip netns exec "$NS" ip link set lo up
    say "namespace $NS, tap $TAP, backend $ARFSNIC"
    RUST_LOG=${RUST_LOG:-info} "$ARFSNIC" serve --socket "$SOCK" --profile "$REPO/configs/mlx5-cx6.toml" \
        --queues "$queues" --tap "$TAP" "$@" >"$outdir/serve.log" 2>&1 &
    SERVE_PID=$!
    # The backend opens the tap once per queue (TUNSETIFF by name): move it only after all
    # queues are attached, or a later TUNSETIFF would create a second tap of that name here.
    local i
    for ((i = 0; i < 100; i++)); do
        [ -S "$SOCK" ] && [ "$(tap_queues)" -ge "$queues" ] && break
        kill -0 "$SERVE_PID" 2>/dev/null || { cat "$outdir/serve.log" >&2; fail "arfsnic serve exited early"; }
        sleep 0.1
    done
    [ -S "$SOCK" ] || { cat "$outdir/serve.log" >&2; fail "no vhost-user socket after 10 s"; }
    [ "$(tap_queues)" -ge "$queues" ] || { cat "$outdir/serve.log" >&2; fail "tap $TAP not created with $queues queues"; }
    sleep 0.2
    ip link set "$TAP" netns "$NS" || fail "cannot move $TAP into $NS"
    ip netns exec "$NS" ip addr add 10.98.0.1/24 dev "$TAP"
    ip netns exec "$NS" ip link set "$TAP" up
}

tap_queues() { ls -d /sys/class/net/"$TAP"/queues/rx-* 2>/dev/null | wc -l; }

GUEST_MAC=52:54:00:12:34:56

# qemu_start QUEUES SMP INITRD APPEND LOG [qemu args...]: QEMU 10 on $SOCK, as
# emulator/src/runner/qemu.rs builds its command line, with single-threaded TCG (what
# `vm.tcg_threads = "auto"` picks on a 2-core host: with multi-threaded TCG and a busy host
# a guest sometimes hangs in early boot with "rcu_preempt kthread timer wakeup didn't
# happen" on an idle vCPU, seen once in 14 soak boots). Sets QEMU_PID.
qemu_start() {
    local queues=$1 smp=$2 initrd=$3 append=$4 log=$5
    shift 5
    : >"$log"
    "$QEMU" -nodefaults -nographic -accel tcg,thread=single -machine q35,memory-backend=mem -cpu max \
        -smp "$smp" -m 512M -object memory-backend-memfd,id=mem,size=512M,share=on \
        -chardev "socket,id=c0,path=$SOCK" -netdev "vhost-user,id=n0,chardev=c0,queues=$queues" \
        -device "virtio-net-pci,netdev=n0,mq=on,hash=on,vectors=$((2 * queues + 2)),mac=$GUEST_MAC" \
        -kernel "$KERNEL" -initrd "$initrd" -append "$append" -serial stdio "$@" \
        </dev/null >"$log" 2>"$log.stderr" &
    QEMU_PID=$!
}

# wait_console LOG PATTERN COUNT SECONDS: until PATTERN occurs COUNT times in LOG; fails on
# ARFSNIC-GUEST-ERROR, on QEMU's exit and on the timeout (with the log's tail).
wait_console() {
    local log=$1 pat=$2 count=$3 secs=$4 i
    for ((i = 0; i < secs * 10; i++)); do
        [ "$(grep -c -- "$pat" "$log" 2>/dev/null)" -ge "$count" ] && return 0
        if grep -q 'ARFSNIC-GUEST-ERROR' "$log"; then break; fi
        kill -0 "$QEMU_PID" 2>/dev/null || break
        sleep 0.1
    done
    tail -n 30 "$log" >&2
    tail -n 10 "$log.stderr" >&2 2>/dev/null || true
    fail "'$pat' did not appear $count time(s) within ${secs}s in $log"
}

# wait_end SECS: the guest powers off after its workload (QEMU gone within SECS, else the
# console's tail and a failure), then `serve --connections 1` exits after that connection.
# Sets QEMU_RC and SERVE_RC, clears QEMU_PID and SERVE_PID.
wait_end() {
    local secs=$1 i
    for ((i = 0; i < secs * 10; i++)); do kill -0 "$QEMU_PID" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$QEMU_PID" 2>/dev/null && { tail -n 40 "$LOG" >&2; fail "QEMU still running $secs s after the clients finished"; }
    QEMU_RC=0
    wait "$QEMU_PID" || QEMU_RC=$?
    QEMU_PID=""
    for ((i = 0; i < 100; i++)); do kill -0 "$SERVE_PID" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$SERVE_PID" 2>/dev/null && fail "arfsnic serve did not exit after the QEMU connection ended (--connections 1)"
    SERVE_RC=0
    wait "$SERVE_PID" || SERVE_RC=$?
    SERVE_PID=""
}

# guest_json LOG OUT: the guest's JSON block from its serial log.
guest_json() {
    sed -n '/^ARFSNIC-GUEST-JSON-BEGIN/,/^ARFSNIC-GUEST-JSON-END/p' "$1" | tr -d '\r' | sed '1d;$d' >"$2"
}
