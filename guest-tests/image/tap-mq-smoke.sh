#!/bin/bash
# Multiqueue check of the guest image without the vhost-user backend: QEMU's own multiqueue
# tap backend inside a private network namespace (created and deleted here; the host's
# network is not touched). Needs root and /dev/net/tun.
#
# usage: guest-tests/image/tap-mq-smoke.sh KERNEL INITRD [options]
#   --queues N      queue pairs (default 4; vectors=2N+2)
#   --flows N       (default 16)
#   --duration S    guest workload duration (default 12)
#   --pattern P     (default none: worker w pinned to CPU w)
#   --smp SPEC      (default 4,sockets=2,cores=2)
#   --append ARGS   extra kernel command line
#   --out DIR       serial log and JSON (default: a new dir under /tmp)
#
# Checks: every flow answered; the guest uses N RX queues, each with its own
# virtioK-input.Q IRQ; rx_packets_per_queue covers the client's replies; every flow's
# SO_INCOMING_NAPI_ID is one of rx_napi_ids. Note: tun picks the RX queue from the queue
# the guest last transmitted the flow on, so with pattern none flow i lands on the queue
# whose IRQ CPU is worker (i % workers)'s CPU.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

[ $# -ge 2 ] || { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
KERNEL=$1 INITRD=$2; shift 2
QUEUES=4 FLOWS=16 DURATION=12 PATTERN=none SMP=4,sockets=2,cores=2 EXTRA_APPEND="" OUTDIR=""
while [ $# -gt 0 ]; do
    case "$1" in
        --queues) QUEUES=$2; shift 2 ;;
        --flows) FLOWS=$2; shift 2 ;;
        --duration) DURATION=$2; shift 2 ;;
        --pattern) PATTERN=$2; shift 2 ;;
        --smp) SMP=$2; shift 2 ;;
        --append) EXTRA_APPEND=$2; shift 2 ;;
        --out) OUTDIR=$2; shift 2 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "tap-mq-smoke: needs root (network namespace + tap)" >&2; exit 2; }
OUTDIR=${OUTDIR:-$(mktemp -d /tmp/arfsnic-tapmq.XXXXXX)}
mkdir -p "$OUTDIR"
LOG=$OUTDIR/serial.log
NS=arfsnic-tapmq-$$
ip netns add "$NS"
QPID=""
cleanup() { [ -z "$QPID" ] || kill "$QPID" 2>/dev/null || true; ip netns del "$NS" 2>/dev/null || true; }
trap cleanup EXIT
ip netns exec "$NS" ip link set lo up

APPEND="console=ttyS0 quiet panic=-1 arfs.ip=10.0.3.2/24 arfs.peer=10.0.3.1 arfs.flows=$FLOWS"
APPEND+=" arfs.base_port=5000 arfs.peer_base_port=6000 arfs.pattern=$PATTERN arfs.duration=$DURATION arfs.wait_link=30"
[ -z "$EXTRA_APPEND" ] || APPEND+=" $EXTRA_APPEND"
: > "$LOG"
T0=$(date +%s.%N)
ip netns exec "$NS" qemu-system-x86_64 -nodefaults -nographic -no-reboot -accel tcg \
    -machine q35,memory-backend=mem -m 1G -object memory-backend-memfd,id=mem,size=1G,share=on \
    -smp "$SMP" -serial stdio -kernel "$KERNEL" -initrd "$INITRD" -append "$APPEND" \
    -netdev "tap,id=n0,ifname=tap0,script=no,downscript=no,queues=$QUEUES,vhost=off" \
    -device "virtio-net-pci,netdev=n0,mq=on,vectors=$((2 * QUEUES + 2))" </dev/null >"$LOG" 2>&1 &
QPID=$!
for ((i = 0; i < 100; i++)); do ip netns exec "$NS" ip link show tap0 >/dev/null 2>&1 && break; sleep 0.1; done
ip netns exec "$NS" ip addr add 10.0.3.1/24 dev tap0
ip netns exec "$NS" ip link set tap0 up
for ((i = 0; i < 1200; i++)); do
    grep -q 'arfs-echo: ready' "$LOG" && break
    grep -q 'ARFSNIC-GUEST-ERROR' "$LOG" && break
    kill -0 $QPID 2>/dev/null || break
    sleep 0.1
done
if ! grep -q 'arfs-echo: ready' "$LOG"; then
    echo "[tapmq] FAIL: guest did not get to 'arfs-echo: ready'" >&2; tail -n 40 "$LOG" >&2; exit 1
fi
CLIENT_SECS=$(awk -v d="$DURATION" 'BEGIN { print (d > 4 ? d - 3 : 1) }')
ip netns exec "$NS" python3 "$HERE/udp-echo-client.py" --host 10.0.3.2 --remote-base 5000 --local-base 6000 \
    --flows "$FLOWS" --seconds "$CLIENT_SECS" --window 2 > "$OUTDIR/client.json" || true
for ((i = 0; i < 600; i++)); do kill -0 $QPID 2>/dev/null || break; sleep 0.1; done
if kill -0 $QPID 2>/dev/null; then
    echo "[tapmq] FAIL: QEMU did not exit within 60 s after the client finished" >&2; tail -n 40 "$LOG" >&2; exit 1
fi
wait $QPID || true
QPID=""
T1=$(date +%s.%N)
sed -n '/^ARFSNIC-GUEST-JSON-BEGIN/,/^ARFSNIC-GUEST-JSON-END/p' "$LOG" | tr -d '\r' | sed '1d;$d' > "$OUTDIR/guest.json"
python3 - "$OUTDIR" "$QUEUES" "$FLOWS" "$T0" "$T1" <<'PY'
import json, sys
out, nq, flows, t0, t1 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
ok = True
def check(cond, msg):
    global ok
    print(("[tapmq] ok   " if cond else "[tapmq] FAIL ") + msg)
    ok &= bool(cond)
log = open(out + "/serial.log", errors="replace").read()
check("ARFSNIC-GUEST-ERROR" not in log, "no ARFSNIC-GUEST-ERROR")
c = json.load(open(out + "/client.json"))
g = json.load(open(out + "/guest.json"))
w = g["workload"]
check(c["flows_with_replies"] == flows, "all %d flows answered (%d replies, %.0f/s)" % (flows, c["replies"], c["replies_per_s"]))
check(g["rx_queues"] == nq, "guest uses %d RX queues" % g["rx_queues"])
inq = g["irqs_input"]
check(len(inq) >= nq and len({q["irq"] for q in inq}) == len(inq),
      "per-queue input IRQs %s" % [(q["name"], q["irq"], q["delta"], q["effective_affinity_list"]) for q in inq])
rxq = g["rx_packets_per_queue"] or []
check(len(rxq) == nq and sum(rxq) >= c["replies"], "rx_packets_per_queue %s (%s)" % (rxq, g["rx_packets_per_queue_source"]))
napi = g["rx_napi_ids"] or []
fq = {f["flow"]: napi.index(f["last_napi_id"]) for f in w["flows"] if f["last_napi_id"] in napi}
check(len(fq) == flows, "every flow's NAPI id maps to an RX queue (%s): flow->queue %s" % (g["rx_napi_ids_source"], fq))
print("[tapmq] kernel %s, QEMU start->exit %.1f s" % (g["kernel"], t1 - t0))
sys.exit(0 if ok else 1)
PY
