#!/bin/bash
# Boot a guest kernel with the arfsnic initramfs on QEMU user networking (no vhost-user
# backend needed), drive arfs-echo from the host with udp-echo-client.py through hostfwd,
# and check: replies carry a CPU number, the ARFSNIC-GUEST-JSON block arrives, QEMU exits
# by itself.
#
# usage: guest-tests/image/usernet-smoke.sh KERNEL INITRD [options]
#   --flows N          (default 4)
#   --duration S       guest workload duration (default 8)
#   --pattern P        none|scheduler|hop-within-llc|hop-across-llc (default hop-across-llc)
#   --smp SPEC         (default 4,sockets=2,cores=2)
#   --accel A          (default tcg)
#   --cpu MODEL        QEMU -cpu (default: QEMU's default model)
#   --host-base H      host UDP port of flow 0 (default 41000; flow i uses H+i and H+1000+i)
#   --out DIR          where serial log and JSON go (default: a new dir under /tmp)
#   --append ARGS      extra kernel command line (e.g. "arfs.sysctl=net.core.busy_read=50")
#   --window N         requests in flight per flow (default 4)
#
# User networking has a single queue pair whatever mq=on says; this checks the guest image,
# not the NIC model.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

[ $# -ge 2 ] || { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
KERNEL=$1 INITRD=$2; shift 2
FLOWS=4 DURATION=8 PATTERN=hop-across-llc SMP=4,sockets=2,cores=2 ACCEL=tcg HB=41000 OUTDIR="" EXTRA_APPEND="" WINDOW=4 CPU=""
while [ $# -gt 0 ]; do
    case "$1" in
        --flows) FLOWS=$2; shift 2 ;;
        --duration) DURATION=$2; shift 2 ;;
        --pattern) PATTERN=$2; shift 2 ;;
        --smp) SMP=$2; shift 2 ;;
        --accel) ACCEL=$2; shift 2 ;;
        --cpu) CPU=$2; shift 2 ;;
        --host-base) HB=$2; shift 2 ;;
        --out) OUTDIR=$2; shift 2 ;;
        --append) EXTRA_APPEND=$2; shift 2 ;;
        --window) WINDOW=$2; shift 2 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
OUTDIR=${OUTDIR:-$(mktemp -d /tmp/arfsnic-usernet.XXXXXX)}
mkdir -p "$OUTDIR"
LOG=$OUTDIR/serial.log
GUEST_BASE=5000
CLIENT_BASE=$((HB + 1000))

FWD=""
for ((i = 0; i < FLOWS; i++)); do
    FWD+=",hostfwd=udp:127.0.0.1:$((HB + i))-:$((GUEST_BASE + i))"
done

# slirp shows host packets to the guest as coming from 10.0.2.2:<host source port>, so the
# guest's connected sockets point at 10.0.2.2:CLIENT_BASE+i.
APPEND="console=ttyS0 panic=-1 quiet arfs.ip=10.0.2.15/24 arfs.peer=10.0.2.2 arfs.flows=$FLOWS"
APPEND+=" arfs.base_port=$GUEST_BASE arfs.peer_base_port=$CLIENT_BASE arfs.pattern=$PATTERN"
APPEND+=" arfs.period_ms=100 arfs.duration=$DURATION arfs.rps_sock_flow_entries=32768 arfs.rps_flow_cnt=4096"
[ -z "$EXTRA_APPEND" ] || APPEND+=" $EXTRA_APPEND"

QEMU=(qemu-system-x86_64 -nodefaults -nographic -no-reboot -accel "$ACCEL"
      -machine q35,memory-backend=mem -m 1G
      -object memory-backend-memfd,id=mem,size=1G,share=on
      -smp "$SMP" -serial stdio
      -kernel "$KERNEL" -initrd "$INITRD" -append "$APPEND"
      -netdev "user,id=n0$FWD" -device virtio-net-pci,netdev=n0,mq=on,vectors=10)
[ -z "$CPU" ] || QEMU+=(-cpu "$CPU")

echo "[smoke] ${QEMU[*]}" >&2
: > "$LOG"
T0=$(date +%s.%N)
"${QEMU[@]}" </dev/null >"$LOG" 2>&1 &
QPID=$!
trap 'kill $QPID 2>/dev/null || true' EXIT

# wait until the echo server is up
for ((i = 0; i < 1200; i++)); do
    grep -q 'arfs-echo: ready' "$LOG" && break
    grep -q 'ARFSNIC-GUEST-ERROR' "$LOG" && break
    kill -0 $QPID 2>/dev/null || break
    sleep 0.1
done
T_READY=$(date +%s.%N)
if ! grep -q 'arfs-echo: ready' "$LOG"; then
    echo "[smoke] FAIL: guest did not get to 'arfs-echo: ready'" >&2; tail -n 40 "$LOG" >&2; exit 1
fi
CLIENT_SECS=$(awk -v d="$DURATION" 'BEGIN { print (d > 3 ? d - 2 : 1) }')
CLIENT_RC=0
python3 "$HERE/udp-echo-client.py" --host 127.0.0.1 --remote-base "$HB" --local-base "$CLIENT_BASE" \
    --flows "$FLOWS" --seconds "$CLIENT_SECS" --window "$WINDOW" --junk > "$OUTDIR/client.json" || CLIENT_RC=$?

# QEMU must exit by itself (guest powers off)
for ((i = 0; i < 600; i++)); do kill -0 $QPID 2>/dev/null || break; sleep 0.1; done
if kill -0 $QPID 2>/dev/null; then
    echo "[smoke] FAIL: QEMU did not exit within 60 s after the client finished" >&2; tail -n 40 "$LOG" >&2; exit 1
fi
wait $QPID || true
trap - EXIT
T1=$(date +%s.%N)
sed -n '/^ARFSNIC-GUEST-JSON-BEGIN/,/^ARFSNIC-GUEST-JSON-END/p' "$LOG" | tr -d '\r' | sed '1d;$d' > "$OUTDIR/guest.json"
python3 - "$OUTDIR" "$T0" "$T_READY" "$T1" "$CLIENT_RC" "$FLOWS" <<'PY'
import json, sys
out, t0, tr, t1, crc, flows = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
log = open(out + "/serial.log", errors="replace").read()
ok = True
def check(cond, msg):
    global ok
    print(("[smoke] ok   " if cond else "[smoke] FAIL ") + msg)
    ok &= bool(cond)
check("ARFSNIC-GUEST-ERROR" not in log, "no ARFSNIC-GUEST-ERROR")
c = json.load(open(out + "/client.json"))
g = json.load(open(out + "/guest.json"))
w = g["workload"]
check(crc == 0 and c["replies"] > 0, "client got %d replies (%.0f/s), bad=%d" % (c["replies"], c["replies_per_s"], c["bad"]))
check(c["flows_with_replies"] == flows, "all %d flows answered" % flows)
check(all(0 <= int(k) < g["ncpus"] for k in c["replies_per_cpu"]), "reply CPUs %s are guest CPUs" % c["replies_per_cpu"])
check(w["replies"] >= c["replies"], "guest replies %d >= client replies %d" % (w["replies"], c["replies"]))
check(w["bad_requests"] == 2, "guest counted the 2 junk requests (bad_requests=%d)" % w["bad_requests"])
check(len(g["irqs_input"]) >= 1 and sum(q["delta"] for q in g["irqs_input"]) > 0,
      "input IRQ deltas %s" % [(q["name"], q["delta"], q["effective_affinity_list"]) for q in g["irqs_input"]])
rxq = g.get("rx_packets_per_queue")
check(rxq is not None and sum(rxq) >= c["replies"], "guest rx_packets_per_queue %s (source %s)" % (rxq, g.get("rx_packets_per_queue_source")))
napi = g.get("rx_napi_ids") or []
check(all(f["last_napi_id"] in napi for f in w["flows"] if f["samples"]),
      "flows' SO_INCOMING_NAPI_ID %s are RX queue NAPI ids %s (%s)" % (
          sorted({f["last_napi_id"] for f in w["flows"]}), napi, g.get("rx_napi_ids_source")))
print("[smoke] kernel %s, llc_groups %s, migrations %s" % (g["kernel"], w["llc_groups"], [x["migrations"] for x in w["workers"]]))
print("[smoke] boot->echo ready %.1f s, boot->QEMU exit %.1f s" % (tr - t0, t1 - t0))
sys.exit(0 if ok else 1)
PY
