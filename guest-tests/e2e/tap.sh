#!/bin/bash
# End-to-end test of tap mode (issue 3, item 8d): UDP from a network namespace reaches the
# guest's echo server through the emulated NIC and comes back.
#
#   namespace arfsnic-tapNN: TAP 10.98.0.1/24, python3 client (udp-echo-client.py)
#        |  tap (multiqueue, vnet header), moved into the namespace
#   arfsnic serve --tap TAP --queues 2 --connections 1   (NIC model: filters/RSS -> RX queue)
#        |  vhost-user socket
#   QEMU 10 (TCG, memfd share=on, vhost-user netdev queues=2, vectors=6) -- Debian 6.12 guest,
#   initramfs from guest-tests/image/build-initramfs.sh, arfs-echo on 10.98.0.2:7000+i
#
# usage (root): guest-tests/e2e/tap.sh [--flows N] [--duration S] [--smp N] [--out DIR]
#                                      [--kernel debian-6.12|debian-6.1]
# env: ARFSNIC (default target/release/arfsnic; built with cargo if missing),
#      QEMU (default: QEMU from .cache/kernels.env, written by guest-tests/provision.sh)
#
# Flow i: 10.98.0.1:9000+i -> 10.98.0.2:7000+i; requests are "ARFS", flow u32 BE, seq u32 BE,
# 4 zero bytes; arfs-echo answers on the same connected socket with the serving CPU in
# bytes 12..16. Exit 0 only if every flow got replies, no reply was malformed, every reply
# names a guest CPU, the guest saw at least as many packets as the client got replies, and
# backend and QEMU ended cleanly. The namespace and every process started here are removed on
# every exit path.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

FLOWS=4 DURATION=8 SMP=2 OUTDIR="" KERNEL_NAME=debian-6.12
while [ $# -gt 0 ]; do
    case "$1" in
        --flows) FLOWS=$2; shift 2 ;;
        --duration) DURATION=$2; shift 2 ;;
        --smp) SMP=$2; shift 2 ;;
        --out) OUTDIR=$2; shift 2 ;;
        --kernel) KERNEL_NAME=$2; shift 2 ;;
        -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "tap.sh: unknown option $1" >&2; exit 2 ;;
    esac
done

E2E_TAG=e2e-tap
# shellcheck source=guest-tests/e2e/lib.sh
. "$HERE/lib.sh"
e2e_env "$KERNEL_NAME"

OUTDIR=${OUTDIR:-$REPO/.cache/e2e/tap}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
rm -f "$OUTDIR"/{serial.log,serial.log.stderr,serve.log,client.json,guest.json,vhost.sock}
e2e_traps

# 1. The guest image (existing script: busybox, arfs-echo, virtio modules, init).
INITRD=$OUTDIR/initramfs.cpio.gz
say "building the initramfs for $KREL"
bash "$REPO/guest-tests/image/build-initramfs.sh" "$KREL" "$INITRD" >"$OUTDIR/initramfs.log" 2>&1 \
    || { tail -n 20 "$OUTDIR/initramfs.log" >&2; fail "build-initramfs.sh failed"; }

# 2. Namespace and backend.
serve_start "$OUTDIR" 2 --connections 1

# 3. QEMU.
APPEND="console=ttyS0 quiet panic=-1 arfs.ip=10.98.0.2/24 arfs.peer=10.98.0.1 arfs.flows=$FLOWS"
APPEND+=" arfs.base_port=7000 arfs.peer_base_port=9000 arfs.duration=$DURATION arfs.wait_link=30"
LOG=$OUTDIR/serial.log
T0=$(date +%s.%N)
qemu_start 2 "$SMP" "$INITRD" "$APPEND" "$LOG" -no-reboot
say "QEMU (pid $QEMU_PID) booting $KREL, serial log $LOG"

# 4. Wait for the echo server (TCG boot: seconds to a minute on a busy machine).
wait_console "$LOG" 'arfs-echo: ready' 1 180
grep -q 'falling back on userspace virtio' "$LOG.stderr" \
    && fail "QEMU fell back to userspace virtio: the backend never sees traffic"
T_READY=$(date +%s.%N)

# 5. The client, from inside the namespace, while the workload runs.
CLIENT_SECS=$(awk -v d="$DURATION" 'BEGIN { print (d > 4 ? d - 3 : 1) }')
say "guest ready after $(awk -v a="$T0" -v b="$T_READY" 'BEGIN { printf "%.1f", b - a }') s; client: $FLOWS flows for $CLIENT_SECS s"
CLIENT_RC=0
ip netns exec "$NS" python3 "$REPO/guest-tests/image/udp-echo-client.py" --host 10.98.0.2 \
    --remote-base 7000 --local-base 9000 --flows "$FLOWS" --seconds "$CLIENT_SECS" --window 2 \
    >"$OUTDIR/client.json" || CLIENT_RC=$?

# 6. The guest powers off after its workload; the backend exits after its one connection.
wait_end 90
T1=$(date +%s.%N)

guest_json "$LOG" "$OUTDIR/guest.json"

# 7. Checks and what was measured.
python3 - "$OUTDIR" "$FLOWS" "$CLIENT_RC" "$QEMU_RC" "$SERVE_RC" "$T0" "$T_READY" "$T1" <<'PY'
import json, re, sys
out, flows = sys.argv[1], int(sys.argv[2])
client_rc, qemu_rc, serve_rc = (int(x) for x in sys.argv[3:6])
t0, tready, t1 = (float(x) for x in sys.argv[6:9])
ok = True
def check(cond, msg):
    global ok
    print(("[e2e-tap] ok   " if cond else "[e2e-tap] FAIL ") + msg)
    ok &= bool(cond)
log = open(out + "/serial.log", errors="replace").read()
check("ARFSNIC-GUEST-ERROR" not in log, "no ARFSNIC-GUEST-ERROR on the guest console")
try:
    c = json.load(open(out + "/client.json"))
except Exception as e:
    c = None
    check(False, "client output: %s" % e)
try:
    g = json.load(open(out + "/guest.json"))
except Exception as e:
    g = None
    check(False, "guest JSON block: %s" % e)
if c:
    check(client_rc == 0, "client exit status %d" % client_rc)
    check(c["flows_with_replies"] == flows,
          "every flow got replies: %d/%d flows, %d requests, %d replies, %.1f replies/s"
          % (c["flows_with_replies"], flows, c["sent"], c["replies"], c["replies_per_s"]))
    check(c["bad"] == 0, "no malformed replies (%d)" % c["bad"])
    ncpus = g["ncpus"] if g else 0
    cpus = {int(k): v for k, v in c["replies_per_cpu"].items()}
    check(bool(cpus) and all(0 <= k < ncpus for k in cpus),
          "replies carry guest CPU numbers (guest has %d CPUs): replies per CPU %s" % (ncpus, cpus))
if g:
    w = g["workload"]
    rxq = g.get("rx_packets_per_queue") or []
    check(g["rx_queues"] == 2, "guest uses %d RX queues (2 expected)" % g["rx_queues"])
    if c:
        check(sum(rxq) >= c["replies"], "guest RX packets per queue %s (%s) cover the %d replies"
              % (rxq, g.get("rx_packets_per_queue_source"), c["replies"]))
    print("[e2e-tap] guest: kernel %s, %d CPUs; input IRQ deltas %s; echo requests served %s"
          % (g["kernel"], g["ncpus"],
             [(q["name"], q["delta"]) for q in g["irqs_input"]],
             w.get("requests", w.get("total_requests", "?"))))
check(qemu_rc == 0, "QEMU exit status %d" % qemu_rc)
check(serve_rc == 0, "arfsnic serve exit status %d" % serve_rc)
serve = open(out + "/serve.log", errors="replace").read()
m = re.findall(r"frontend \d+ disconnected: tx (\[[^\]]*\]) rx (\[[^\]]*\])", serve)
check(bool(m), "backend per-queue counters: %s" % (("tx %s rx %s" % m[-1]) if m else "missing in serve.log"))
if m:
    rx = json.loads(m[-1][1])
    check(sum(rx) > 0, "the NIC model delivered %d frames from the tap to the guest" % sum(rx))
print("[e2e-tap] QEMU start -> echo ready %.1f s, start -> exit %.1f s" % (tready - t0, t1 - t0))
sys.exit(0 if ok else 1)
PY
say "PASS (logs in $OUTDIR)"
