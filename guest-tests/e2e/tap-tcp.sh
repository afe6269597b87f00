#!/bin/bash
# End-to-end test of tap mode with real TCP clients (issue 15, point 6): sockperf and iperf3
# on the host side drive real servers in the Debian guest through the emulated NIC, and the
# steer rate comes from the guest module and the device as in a run with the built-in partner.
#
#   namespace arfsnic-tapNN: TAP 10.98.0.1/24; sockperf ping-pong / under-load --tcp,
#        |  iperf3 -c 10.98.0.2 -P 64
#        |  tap (multiqueue, vnet header), moved into the namespace
#   arfsnic serve --tap TAP --queues 4 --connections 1 --stats serve-stats.json --metrics
#        |  vhost-user socket
#   QEMU 10 (TCG, 4 vCPUs, vhost-user netdev queues=4) -- stock Debian 6.12 kernel, the
#   Debian guest image (guest-tests/image/build-debian.sh) read-only on virtio-blk as root,
#   arfs_virtio (built here against the kernel's headers), RFS on, ntuple on;
#   init's arfs.servers=sockperf,iperf3: `sockperf server --tcp` on 10.98.0.2:11111 and
#   `iperf3 -s` on 10.98.0.2:5201 (arfs-echo listens idle on TCP 7000 meanwhile)
#
# usage (root): guest-tests/e2e/tap-tcp.sh [--pp-seconds S] [--ul-seconds S]
#                   [--iperf-seconds S] [--streams N] [--smp N] [--queues N] [--out DIR]
#                   [--kernel debian-6.12|debian-6.1]
# env: ARFSNIC (default target/release/arfsnic), QEMU (default: from .cache/kernels.env)
#
# Prints and writes OUTDIR/summary.json (default OUTDIR .cache/e2e/tap-tcp): sockperf
# ping-pong round trips and RTT p50/p99, under-load figures, iperf3 Gbit/s and streams,
# Steer-C/s of the module over the client window (its counters as the device last got
# them, read from serve's --metrics at the window's start and end), the device's filter
# adds/dels/errors. Exit 0 only if every client exited 0 and measured something, all
# iperf3 streams moved bytes, the module steered (> 0 calls) and the device added filters
# with no errors, the guest printed no ARFSNIC-GUEST-ERROR, and QEMU and serve ended
# cleanly. The namespace and every process started here are removed on every exit path.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

PP_S=4 UL_S=4 IPERF_S=8 STREAMS=64 SMP=4 QUEUES=4 OUTDIR="" KERNEL_NAME=debian-6.12
while [ $# -gt 0 ]; do
    case "$1" in
        --pp-seconds) PP_S=$2; shift 2 ;;
        --ul-seconds) UL_S=$2; shift 2 ;;
        --iperf-seconds) IPERF_S=$2; shift 2 ;;
        --streams) STREAMS=$2; shift 2 ;;
        --smp) SMP=$2; shift 2 ;;
        --queues) QUEUES=$2; shift 2 ;;
        --out) OUTDIR=$2; shift 2 ;;
        --kernel) KERNEL_NAME=$2; shift 2 ;;
        -h|--help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "tap-tcp.sh: unknown option $1" >&2; exit 2 ;;
    esac
done

E2E_TAG=e2e-tap-tcp
# shellcheck source=guest-tests/e2e/lib.sh
. "$HERE/lib.sh"
for t in sockperf iperf3; do
    command -v "$t" >/dev/null || fail "$t missing on the host (package $t): run guest-tests/provision.sh"
done
e2e_env "$KERNEL_NAME"
[ -f "${KDIR:-/nonexistent}/Makefile" ] || fail "no kernel headers for $KREL (KDIR '$KDIR'): run guest-tests/provision.sh"

OUTDIR=${OUTDIR:-$REPO/.cache/e2e/tap-tcp}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
rm -f "$OUTDIR"/{serial.log,serial.log.stderr,serve.log,serve-stats.json,guest.json,summary.json,vhost.sock} \
    "$OUTDIR"/{sockperf-pp,sockperf-ul}.txt "$OUTDIR"/iperf3.json "$OUTDIR"/metrics-[0-3].txt "$OUTDIR"/times.txt
e2e_traps
T0=$(date +%s.%N)

# 1. The Debian image (built once by build-debian.sh, cached; its IMAGE= line names it).
IMAGE=$(bash "$REPO/guest-tests/image/build-debian.sh" 2>"$OUTDIR/build-debian.log" | sed -n 's/^IMAGE=//p')
[ -f "${IMAGE:-/nonexistent}" ] || { tail -n 20 "$OUTDIR/build-debian.log" >&2; fail "guest-tests/image/build-debian.sh gave no image"; }

# 2. The module, against the stock kernel's headers (a copy of the sources: the checkout's
#    guest-tests/module may hold a build for another kernel), and the initramfs.
rm -rf "$OUTDIR/module"
mkdir -p "$OUTDIR/module"
cp "$REPO"/guest-tests/module/{Kbuild,Makefile,*.c,*.h} "$OUTDIR/module/"
say "building arfs_virtio.ko against $KDIR"
make -C "$OUTDIR/module" KDIR="$KDIR" >"$OUTDIR/module.log" 2>&1 \
    || { tail -n 20 "$OUTDIR/module.log" >&2; fail "module build failed"; }
# The hook: ntuple on (the module offers it; aRFS steers only with it), shown in the JSON.
# shellcheck disable=SC2016 # $1 is the hook's argument
printf '#!/bin/sh\nethtool -K "$1" ntuple on && ethtool -k "$1" | grep ntuple\n' >"$OUTDIR/hook.sh"
INITRD=$OUTDIR/initramfs.cpio.gz
say "building the initramfs for $KREL (disk root)"
bash "$REPO/guest-tests/image/build-initramfs.sh" "$KREL" "$INITRD" --disk-root \
    --module "$OUTDIR/module/arfs_virtio.ko" --hook "$OUTDIR/hook.sh" >"$OUTDIR/initramfs.log" 2>&1 \
    || { tail -n 20 "$OUTDIR/initramfs.log" >&2; fail "build-initramfs.sh failed"; }

# 3. Namespace and backend (its metrics on a free loopback port, named in serve.log).
serve_start "$OUTDIR" "$QUEUES" --connections 1 --stats "$OUTDIR/serve-stats.json" --metrics 127.0.0.1:0
METRICS=""
for ((i = 0; i < 50; i++)); do
    METRICS=$(sed -n 's|.*metrics on \(http://[^ ]*/metrics\).*|\1|p' "$OUTDIR/serve.log" | head -n1)
    [ -n "$METRICS" ] && break
    sleep 0.1
done
[ -n "$METRICS" ] || fail "serve printed no metrics address (serve.log)"
scrape() { python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$METRICS" >"$1"; }

# 4. QEMU. The guest's workload lasts as long as the three clients plus a margin for the
#    TCG guest's connection setup; the servers run through it.
DURATION=$((PP_S + UL_S + IPERF_S + 40))
APPEND="console=ttyS0 quiet panic=-1 arfs.root=/dev/vda arfs.ip=10.98.0.2/24 arfs.peer=10.98.0.1"
APPEND+=" arfs.proto=tcp arfs.flows=1 arfs.base_port=7000 arfs.duration=$DURATION arfs.wait_link=30"
APPEND+=" arfs.servers=sockperf,iperf3 arfs.modarg=arfs_virtio.irqs=@INPUT_IRQS@ arfs.modarg=arfs_virtio.ifname=@IFNAME@"
LOG=$OUTDIR/serial.log
T_QEMU=$(date +%s.%N)
qemu_start "$QUEUES" "$SMP" "$INITRD" "$APPEND" "$LOG" -no-reboot \
    -drive "file=$IMAGE,if=virtio,format=raw,readonly=on"
say "QEMU (pid $QEMU_PID) booting $KREL on $(basename "$IMAGE"), $SMP vCPUs, $QUEUES queue pairs; serial log $LOG"

# 5. Wait for the servers and the (idle) echo server.
wait_console "$LOG" 'arfs-echo: ready' 1 240
grep -q 'falling back on userspace virtio' "$LOG.stderr" \
    && fail "QEMU fell back to userspace virtio: the backend never sees traffic"
T_READY=$(date +%s.%N)
say "guest ready after $(awk -v a="$T_QEMU" -v b="$T_READY" 'BEGIN { printf "%.1f", b - a }') s"

# 6. The clients, from the namespace, one after another. serve's metrics are read before
#    the first and after each (metrics-N.txt, with the time in times.txt): the steer calls
#    and filter commands per client. The module pushes its counters to the device every
#    100 ms, so each read waits 0.5 s for the last push of the client before it.
NSX=(ip netns exec "$NS")
: >"$OUTDIR/times.txt"
mark() { # N: metrics-N.txt and the time
    sleep 0.5
    echo "$1 $(date +%s.%N)" >>"$OUTDIR/times.txt"
    scrape "$OUTDIR/metrics-$1.txt" || fail "reading $METRICS failed"
}
mark 0
T_C0=$(date +%s.%N)
PP_RC=0 UL_RC=0 IP_RC=0
say "sockperf ping-pong --tcp, $PP_S s"
timeout $((PP_S + 30)) "${NSX[@]}" sockperf ping-pong --tcp -i 10.98.0.2 -p 11111 -t "$PP_S" --full-rtt \
    >"$OUTDIR/sockperf-pp.txt" 2>&1 || PP_RC=$?
mark 1
say "sockperf under-load --tcp, $UL_S s"
timeout $((UL_S + 30)) "${NSX[@]}" sockperf under-load --tcp -i 10.98.0.2 -p 11111 -t "$UL_S" --full-rtt \
    >"$OUTDIR/sockperf-ul.txt" 2>&1 || UL_RC=$?
mark 2
say "iperf3 -c 10.98.0.2 -P $STREAMS -t $IPERF_S"
timeout $((IPERF_S + 60)) "${NSX[@]}" iperf3 -c 10.98.0.2 -p 5201 -P "$STREAMS" -t "$IPERF_S" -J \
    >"$OUTDIR/iperf3.json" 2>"$OUTDIR/iperf3.stderr" || IP_RC=$?
T_C1=$(date +%s.%N)
mark 3
T_C1S=$(date +%s.%N)
say "clients done in $(awk -v a="$T_C0" -v b="$T_C1" 'BEGIN { printf "%.1f", b - a }') s (exit status: ping-pong $PP_RC, under-load $UL_RC, iperf3 $IP_RC)"

# 7. The guest powers off after its workload; serve exits after its one connection.
wait_end $((DURATION + 90))
T1=$(date +%s.%N)

guest_json "$LOG" "$OUTDIR/guest.json"

# 8. Checks and the summary.
python3 - "$OUTDIR" "$STREAMS" "$PP_RC" "$UL_RC" "$IP_RC" "$QEMU_RC" "$SERVE_RC" \
    "$T0" "$T_QEMU" "$T_READY" "$T_C0" "$T_C1" "$T_C1S" "$T1" "$SMP" "$QUEUES" <<'PY'
import json, re, sys
out, streams = sys.argv[1], int(sys.argv[2])
pp_rc, ul_rc, ip_rc, qemu_rc, serve_rc = (int(x) for x in sys.argv[3:8])
t0, tqemu, tready, tc0, tc1, tc1s, t1 = (float(x) for x in sys.argv[8:15])
smp, queues = int(sys.argv[15]), int(sys.argv[16])
ok = True
def check(cond, msg):
    global ok
    print(("[e2e-tap-tcp] ok   " if cond else "[e2e-tap-tcp] FAIL ") + msg)
    ok &= bool(cond)
def load(name):
    try:
        return json.load(open(out + "/" + name))
    except Exception as e:
        check(False, "%s: %s" % (name, e))
        return None

def sockperf(name):
    """The figures of a sockperf client's output (sockperf 3.x, --full-rtt: usec)."""
    txt = open(out + "/" + name, errors="replace").read()
    r = {}
    m = re.search(r"\[Valid Duration\] RunTime=([\d.]+) sec; SentMessages=(\d+); ReceivedMessages=(\d+)", txt)
    if m:
        r["run_s"], r["sent"], r["received"] = float(m.group(1)), int(m.group(2)), int(m.group(3))
    m = re.search(r"avg-rtt=([\d.]+) \(std-dev=([\d.]+)", txt)
    if m:
        r["rtt_avg_us"], r["rtt_stddev_us"] = float(m.group(1)), float(m.group(2))
    for p, k in (("50.000", "rtt_p50_us"), ("99.000", "rtt_p99_us"), ("99.900", "rtt_p99_9_us")):
        m = re.search(r"percentile " + re.escape(p) + r" =\s+([\d.]+)", txt)
        if m:
            r[k] = float(m.group(1))
    m = re.search(r"<MAX> observation =\s+([\d.]+)", txt)
    if m:
        r["rtt_max_us"] = float(m.group(1))
    m = re.search(r"Total (\d+) observations", txt)
    if m:
        r["observations"] = int(m.group(1))
    m = re.search(r"# dropped messages = (\d+)", txt)
    if m:
        r["dropped"] = int(m.group(1))
    if r.get("run_s"):
        r["per_s"] = r.get("received", 0) / r["run_s"]
    return r

def metrics(name):
    d = {}
    for line in open(out + "/" + name, errors="replace"):
        if line.startswith("#") or not line.strip():
            continue
        k, _, v = line.rpartition(" ")
        try:
            d[k] = float(v)
        except ValueError:
            pass
    return d

summary = {"setup": {"vcpus": smp, "queue_pairs": queues}}
log = open(out + "/serial.log", errors="replace").read()
check("ARFSNIC-GUEST-ERROR" not in log, "no ARFSNIC-GUEST-ERROR on the guest console")

# sockperf
pp, ul = sockperf("sockperf-pp.txt"), sockperf("sockperf-ul.txt")
summary["sockperf_ping_pong"] = dict(pp, rc=pp_rc)
summary["sockperf_under_load"] = dict(ul, rc=ul_rc)
check(pp_rc == 0 and pp.get("received", 0) > 0 and pp.get("rtt_p50_us", 0) > 0,
      "sockperf ping-pong --tcp: exit %d, %s round trips in %s s (%.0f/s), RTT p50 %s us, p99 %s us"
      % (pp_rc, pp.get("received"), pp.get("run_s"), pp.get("per_s", 0), pp.get("rtt_p50_us"), pp.get("rtt_p99_us")))
check(ul_rc == 0 and ul.get("received", 0) > 0 and ul.get("rtt_p50_us", 0) > 0,
      "sockperf under-load --tcp: exit %d, %s sent, %s replies in %s s, RTT p50 %s us, p99 %s us"
      % (ul_rc, ul.get("sent"), ul.get("received"), ul.get("run_s"), ul.get("rtt_p50_us"), ul.get("rtt_p99_us")))

# iperf3
ip = load("iperf3.json")
if ip is not None:
    end = ip.get("end", {})
    st = end.get("streams", [])
    sent = end.get("sum_sent", {})
    recv = end.get("sum_received", {})
    moved = [s.get("sender", {}).get("bytes", 0) for s in st]
    summary["iperf3"] = {
        "rc": ip_rc, "streams": len(st), "streams_with_bytes": sum(1 for b in moved if b > 0),
        "seconds": sent.get("seconds"), "sent_bytes": sent.get("bytes"), "received_bytes": recv.get("bytes"),
        "sent_gbit_s": (sent.get("bits_per_second") or 0) / 1e9,
        "received_gbit_s": (recv.get("bits_per_second") or 0) / 1e9,
        "retransmits": sent.get("retransmits"),
        "per_stream_bytes_min": min(moved) if moved else None, "per_stream_bytes_max": max(moved) if moved else None,
        "error": ip.get("error"),
    }
    s = summary["iperf3"]
    check(ip_rc == 0 and not ip.get("error") and s["received_gbit_s"] > 0,
          "iperf3 -P %d: exit %d, %.3f Gbit/s received (%.3f sent) over %s s, %s retransmits%s"
          % (streams, ip_rc, s["received_gbit_s"], s["sent_gbit_s"], s["seconds"], s["retransmits"],
             ", error: %s" % ip.get("error") if ip.get("error") else ""))
    check(len(st) == streams and s["streams_with_bytes"] == streams,
          "iperf3 streams: %d of %d, %d moved bytes (per stream %s..%s bytes)"
          % (len(st), streams, s["streams_with_bytes"], s["per_stream_bytes_min"], s["per_stream_bytes_max"]))

# the module's steer calls and the device's filter commands over the client window and per
# client, as the device got them (serve --metrics before the first client and after each)
ms = [metrics("metrics-%d.txt" % i) for i in range(4)]
tm = {int(l.split()[0]): float(l.split()[1]) for l in open(out + "/times.txt")}
STEER = "arfsnic_guest_steer_calls_total"
def cmds(m, op):
    return m.get('arfsnic_filter_commands_total{op="%s"}' % op, 0)
def span(i, j, secs):
    a, b = ms[i], ms[j]
    d = b.get(STEER, 0) - a.get(STEER, 0)
    return {"seconds": secs, "steer_calls": d, "steer_calls_per_s": d / secs if secs > 0 else None,
            "filter_adds": cmds(b, "add") - cmds(a, "add"), "filter_mods": cmds(b, "mod") - cmds(a, "mod"),
            "filter_dels": cmds(b, "del") - cmds(a, "del")}
# a client's seconds: from the read before it to the read after it, less the 0.5 s wait
win = tc1 - tc0
cw = span(0, 3, win)
cw["metrics_delta"] = {k: ms[3][k] - ms[0].get(k, 0) for k in sorted(ms[3])
                       if k.startswith("arfsnic_") and ms[3][k] != ms[0].get(k, 0)}
summary["client_window"] = cw
summary["per_client"] = {name: span(i, i + 1, tm[i + 1] - tm[i] - 0.5)
                         for i, name in enumerate(("sockperf_ping_pong", "sockperf_under_load", "iperf3"))}
steer = cw["steer_calls"]
print("[e2e-tap-tcp] client window %.1f s: Steer-C %d, Steer-C/s %.1f, filter adds %d, mods %d, dels %d "
      "(module and device counters, serve --metrics)"
      % (win, steer, cw["steer_calls_per_s"] or 0, cw["filter_adds"], cw["filter_mods"], cw["filter_dels"]))
for name, p in summary["per_client"].items():
    print("[e2e-tap-tcp]   %-20s %5.1f s: Steer-C %6d, Steer-C/s %7.1f, filter adds %d, mods %d, dels %d"
          % (name, p["seconds"], p["steer_calls"], p["steer_calls_per_s"] or 0, p["filter_adds"], p["filter_mods"], p["filter_dels"]))
check(steer > 0, "the module's ndo_rx_flow_steer ran during the clients (%d calls)" % steer)

# the guest: module counters (ethtool -S before/after the workload), servers
g = load("guest.json")
if g is not None:
    b, a = g.get("ethtool_s_before") or {}, g.get("ethtool_s_after") or {}
    keys = ["arfs_steer_calls", "arfs_steer_new", "arfs_steer_update", "arfs_steer_same", "arfs_adds_ok",
            "arfs_mods_ok", "arfs_dels_ok", "arfs_rules_now", "arfs_rules_peak", "arfs_cmd_timeouts"]
    mod = {k: {"before": b.get(k), "after": a.get(k)} for k in keys}
    errs = {k: a[k] - b.get(k, 0) for k in a if ("err" in k or "eperm" in k or "enomem" in k) and k.startswith("arfs_") and a[k] != b.get(k, 0)}
    w = g.get("workload") or {}
    summary["guest"] = {"kernel": g.get("kernel"), "ncpus": g.get("ncpus"), "rx_queues": g.get("rx_queues"),
                        "rx_packets_per_queue": g.get("rx_packets_per_queue"), "module": mod, "module_errors": errs,
                        "servers": g.get("servers"), "hook": g.get("hook"), "dmesg_warnings": g.get("dmesg_warnings")}
    gsteer = (a.get("arfs_steer_calls") or 0) - (b.get("arfs_steer_calls") or 0)
    print("[e2e-tap-tcp] guest: kernel %s, %d CPUs, %d RX queues, RX packets per queue %s; module over the workload: "
          "steer calls %d (new %s, update %s, same %s), rules now %s, peak %s"
          % (g["kernel"], g["ncpus"], g["rx_queues"], g.get("rx_packets_per_queue"), gsteer,
             a.get("arfs_steer_new"), a.get("arfs_steer_update"), a.get("arfs_steer_same"),
             a.get("arfs_rules_now"), a.get("arfs_rules_peak")))
    check(g["rx_queues"] == queues, "guest uses %d RX queues (%d expected)" % (g["rx_queues"], queues))
    check(gsteer >= steer > 0, "guest's own count (ethtool -S, %d over the workload) covers the window's %d" % (gsteer, steer))
    check(not errs, "no module errors %s" % (errs or ""))
    check("ntuple-filters: on" in (g.get("hook") or {}).get("output", ""), "ntuple on in the guest (hook: %s)"
          % (g.get("hook") or {}).get("output", "").strip())
    sv = g.get("servers") or {}
    check(set(sv) == {"sockperf", "iperf3"} and all(v.get("running_at_end") for v in sv.values()),
          "guest servers ran to the end: %s" % {k: (v.get("rc"), (v.get("last_lines") or [""])[-1:]) for k, v in sv.items()})
    check(g.get("dmesg_warnings", 0) == 0, "no kernel warnings in the guest (%s)" % g.get("dmesg_warnings"))

# the device: filter commands (serve --stats: final, since the last device reset)
st = load("serve-stats.json")
if st is not None:
    f = st.get("filter", {})
    rej = sum(f.get("rejects", {}).values())
    summary["device"] = {"filter_adds": f.get("adds"), "filter_mods": f.get("mods"), "filter_dels": f.get("dels"),
                         "filter_errors": rej, "rejects": f.get("rejects"), "rules_now": f.get("rules_now"),
                         "rules_peak": f.get("rules_peak"), "cmd_latency_us_p50": f.get("cmd_latency_us_p50"),
                         "cmd_latency_us_p99": f.get("cmd_latency_us_p99"), "rx_packets": st.get("rx_packets"),
                         "tx_frames": st.get("tx_frames"), "device_resets": st.get("device_resets"),
                         "complete": st.get("complete")}
    check((f.get("adds") or 0) > 0 and rej == 0,
          "device filters: %s adds, %s mods, %s dels, %d errors %s, %s live at the end (peak %s)"
          % (f.get("adds"), f.get("mods"), f.get("dels"), rej, f.get("rejects") or "", f.get("rules_now"), f.get("rules_peak")))
    check(sum(st.get("rx_packets") or [0]) > 0, "the NIC model delivered frames from the tap: per RX queue %s" % st.get("rx_packets"))
    check(st.get("complete") is True, "serve --stats complete (serve ended on its own)")
check(qemu_rc == 0, "QEMU exit status %d" % qemu_rc)
check(serve_rc == 0, "arfsnic serve exit status %d" % serve_rc)
summary["times_s"] = {"build": tqemu - t0, "boot_to_ready": tready - tqemu, "clients": tc1 - tc0, "total": t1 - t0}
summary["ok"] = ok
print("[e2e-tap-tcp] times: builds %.1f s, QEMU start -> servers ready %.1f s, clients %.1f s, total %.1f s"
      % (tqemu - t0, tready - tqemu, tc1 - tc0, t1 - t0))
json.dump(summary, open(out + "/summary.json", "w"), indent=1)
print(json.dumps({k: summary.get(k) for k in ("sockperf_ping_pong", "sockperf_under_load", "iperf3", "per_client", "device")}, indent=1))
sys.exit(0 if ok else 1)
PY
say "PASS (summary $OUTDIR/summary.json)"
