#!/bin/bash
# Soak on one backend (issue 16, items 1 and 4): one `arfsnic serve --tap` process serves,
# with UDP traffic from a network namespace in every cycle,
#   kill     N x: QEMU boots the guest (arfs_virtio loaded, RFS on), traffic, kill -9 mid-traffic
#   reboot   N x: the guest reboots itself after its workload (module unloaded, loaded again
#                 on the next boot), same QEMU and vhost-user connection
#   channels N x: `ethtool -L combined` 1 <-> max in the guest while traffic runs
#   midmsg   N x: a frontend that dies in the middle of a vhost-user message, and a QEMU
#                 killed during its start-up; then a full boot must still work
#   spoof    1 x: forged control completions/events (also VLAN/QinQ-tagged) sent from the
#                 host side of the tap while the guest steers; the device drops and counts
#                 every one, the guest's engine state and rule table stay as they were
# After each cycle: the next driver instance starts on a fresh device (device_resets up,
# no rules, RSS as the profile's), and serve's VmRSS, open fds and threads are sampled.
# Checked at the end: fds and threads constant from cycle 2 of each kind on, VmRSS grows
# less than 5 MB from the first cycle-2 sample to the end, serve never exited.
#
# usage (root): guest-tests/soak.sh [--cycles N] [--out DIR] [--kernel debian-6.12|debian-6.1]
#               [--phases kill,reboot,channels,midmsg,spoof]
# Default N = 20 (the CI test runs --cycles 5). Writes OUT/cycles.csv and OUT/summary.json.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)

CYCLES=20 OUTDIR="" KERNEL_NAME=debian-6.12 PHASES=kill,reboot,channels,midmsg,spoof FLOWS=8
while [ $# -gt 0 ]; do
    case "$1" in
        --cycles) CYCLES=$2; shift 2 ;;
        --out) OUTDIR=$2; shift 2 ;;
        --kernel) KERNEL_NAME=$2; shift 2 ;;
        --phases) PHASES=$2; shift 2 ;;
        -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "soak.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
case "$CYCLES" in ''|*[!0-9]*|0) echo "soak.sh: --cycles must be a positive integer" >&2; exit 2 ;; esac

E2E_TAG=soak
# shellcheck source=guest-tests/e2e/lib.sh
. "$HERE/e2e/lib.sh"
e2e_env "$KERNEL_NAME"
[ -n "$KDIR" ] && [ -d "$KDIR" ] || fail "no kernel headers for $KREL (KDIR in .cache/kernels.env): run guest-tests/provision.sh"

OUTDIR=${OUTDIR:-$REPO/.cache/soak}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
rm -f "$OUTDIR"/*.log "$OUTDIR"/*.stderr "$OUTDIR"/*.json "$OUTDIR"/cycles.csv "$OUTDIR"/vhost.sock
e2e_traps
T_START=$(date +%s)

# ---- guest image: the module built against the kernel's headers, loaded at boot
say "building arfs_virtio against $KDIR"
make -C "$REPO/guest-tests/module" KDIR="$KDIR" >"$OUTDIR/module-build.log" 2>&1 \
    || { tail -n 20 "$OUTDIR/module-build.log" >&2; fail "building guest-tests/module failed"; }
INITRD=$OUTDIR/initramfs.cpio.gz
bash "$REPO/guest-tests/image/build-initramfs.sh" "$KREL" "$INITRD" --module "$REPO/guest-tests/module/arfs_virtio.ko" \
    >"$OUTDIR/initramfs.log" 2>&1 || { tail -n 20 "$OUTDIR/initramfs.log" >&2; fail "build-initramfs.sh failed"; }

STATS=$OUTDIR/stats.json
serve_start "$OUTDIR" 2 --stats "$STATS"
DBG=/sys/kernel/debug/arfs_virtio
BASE="console=ttyS0 quiet panic=-1 arfs.ip=10.98.0.2/24 arfs.peer=10.98.0.1 arfs.flows=$FLOWS"
BASE+=" arfs.base_port=7000 arfs.peer_base_port=9000 arfs.wait_link=30 arfs.pattern=hop-within-llc"
BASE+=" arfs.period_ms=200 arfs.modarg=arfs_virtio.irqs=@INPUT_IRQS@ arfs.modarg=arfs_virtio.ifname=@IFNAME@"
BASE+=" arfs.dump=$DBG/stats"

# st FIELD[.FIELD...]: a value from serve's --stats file (JSON for lists/objects).
st() {
    python3 - "$STATS" "$1" <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."):
    v = v[k]
print(json.dumps(v) if isinstance(v, (list, dict, bool)) else v)
PY
}
# wait_st EXPR SECONDS: until the Python expression over `s` (the stats) holds.
wait_st() {
    local i
    for ((i = 0; i < $2 * 10; i++)); do
        python3 -c "import json,sys; s=json.load(open('$STATS')); sys.exit(0 if ($1) else 1)" 2>/dev/null && return 0
        sleep 0.1
    done
    cat "$STATS" >&2
    fail "serve's stats never satisfied: $1"
}
client() { # SECONDS OUT.json
    ip netns exec "$NS" python3 "$REPO/guest-tests/image/udp-echo-client.py" --host 10.98.0.2 \
        --remote-base 7000 --local-base 9000 --flows "$FLOWS" --seconds "$1" --window 2 >"$2" || true
}
# client_ok OUT.json: every flow got replies.
client_ok() {
    python3 - "$1" "$FLOWS" <<'PY' || fail "client $1: not every flow got replies"
import json, sys
c = json.load(open(sys.argv[1]))
sys.exit(0 if c["flows_with_replies"] == int(sys.argv[2]) and c["bad"] == 0 else 1)
PY
}
echo "kind,cycle,vm_rss_kb,fds,threads,device_resets,adds,connections,replies" >"$OUTDIR/cycles.csv"
sample() { # KIND CYCLE REPLIES
    kill -0 "$SERVE_PID" 2>/dev/null || { tail -n 20 "$OUTDIR/serve.log" >&2; fail "arfsnic serve died"; }
    local rss fds thr
    rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$SERVE_PID/status")
    fds=$(ls "/proc/$SERVE_PID/fd" | wc -l)
    thr=$(awk '/^Threads:/ { print $2 }' "/proc/$SERVE_PID/status")
    echo "$1,$2,$rss,$fds,$thr,$(st device_resets),$(st filter.adds),$(st connections),$3" >>"$OUTDIR/cycles.csv"
    say "$1 $2/$CYCLES: VmRSS $rss kB, $fds fds, $thr threads, $(st device_resets) device resets"
}
replies() { python3 -c "import json; print(json.load(open('$1'))['replies'])"; }
# fresh_device RESETS_BEFORE: the driver instance that just reported ready got a fresh
# device (a reset since RESETS_BEFORE, no rules before any traffic, RSS as configured).
fresh_device() {
    wait_st "s['device_resets'] > $1 and s['link_up'] and s['filter']['rules_now'] == 0 and s['rss_default']" 10
}
guest_json() { # LOG N: the N-th JSON block of the console log
    awk -v n="$2" '/^ARFSNIC-GUEST-JSON-BEGIN/ { k++; on = (k == n); next } /^ARFSNIC-GUEST-JSON-END/ { on = 0 } on' "$1" | tr -d '\r'
}
has_phase() { case ",$PHASES," in *",$1,"*) return 0 ;; esac; return 1; }
# boot LOG ARGS: QEMU (no reboot) with the base command line plus ARGS, up to the
# workload's `ready`, on a freshly reset device. Sets LOG.
boot() {
    local r0
    r0=$(st device_resets)
    LOG=$1
    qemu_start 2 2 "$INITRD" "$BASE $2" "$LOG" -no-reboot
    wait_console "$LOG" 'arfs-echo: ready' 1 240
    fresh_device "$r0"
}
# qemu_gone: stop QEMU and wait until serve saw the link go down.
qemu_gone() {
    stop_pid "$QEMU_PID"
    QEMU_PID=""
    wait_st "not s['link_up']" 10
}

# ---- kill: QEMU killed with SIGKILL in the middle of traffic
if has_phase kill; then
    for ((c = 1; c <= CYCLES; c++)); do
        boot "$OUTDIR/kill-$c.log" "arfs.duration=600"
        client 3 "$OUTDIR/kill-$c.client.json"
        client_ok "$OUTDIR/kill-$c.client.json"
        wait_st "s['filter']['adds'] > 0" 10
        ( client 3 "$OUTDIR/kill-$c.client2.json" ) &
        CPID=$!
        sleep 1
        kill -9 "$QEMU_PID"
        wait "$QEMU_PID" 2>/dev/null || true
        QEMU_PID=""
        wait "$CPID" || true
        wait_st "not s['link_up']" 10
        sample kill "$c" "$(replies "$OUTDIR/kill-$c.client.json")"
    done
fi

# ---- reboot: the guest unloads the module and reboots; QEMU and its connection stay
if has_phase reboot; then
    LOG=$OUTDIR/reboot.log
    r0=$(st device_resets)
    qemu_start 2 2 "$INITRD" "$BASE arfs.duration=6 arfs.rmmod_end=1 arfs.end=reboot" "$LOG"
    for ((c = 1; c <= CYCLES; c++)); do
        wait_console "$LOG" 'arfs-echo: ready' "$c" 240
        fresh_device "$r0"
        r0=$(st device_resets)
        client 3 "$OUTDIR/reboot-$c.client.json"
        client_ok "$OUTDIR/reboot-$c.client.json"
        wait_st "s['filter']['adds'] > 0" 10
        wait_console "$LOG" 'done, rebooting' "$c" 60
        guest_json "$LOG" "$c" >"$OUTDIR/reboot-$c.guest.json"
        python3 - "$OUTDIR/reboot-$c.guest.json" <<'PY' || fail "reboot $c: the module did not unload cleanly"
import json, sys
g = json.load(open(sys.argv[1]))
sys.exit(0 if any(r.startswith("arfs_virtio ok") for r in g.get("rmmod", [])) else 1)
PY
        sample reboot "$c" "$(replies "$OUTDIR/reboot-$c.client.json")"
    done
    qemu_gone
fi

# ---- channels: ethtool -L combined 1 <-> 2 every 2 s under traffic
if has_phase channels; then
    # ethtool -L itself takes a while under TCG: 3 s per change leaves room.
    boot "$OUTDIR/channels.log" "arfs.duration=$((3 * CYCLES + 10)) arfs.channels_cycle=2"
    ( client $((3 * CYCLES + 6)) "$OUTDIR/channels.client.json" ) &
    CPID=$!
    for ((c = 1; c <= CYCLES; c++)); do
        wait_console "$LOG" "(change $c)" 1 30
        grep -q "channels change $c to" "$LOG" && fail "the guest's ethtool -L failed (change $c)"
        if [ $((c % 2)) = 1 ]; then want="[True, False]"; else want="[True, True]"; fi
        wait_st "s['enabled_pairs'] == $want and s['rss_default']" 5
        sample channels "$c" 0
    done
    wait "$CPID" || true
    client_ok "$OUTDIR/channels.client.json"
    # No flow starves: a filter naming a disabled queue falls back to RSS.
    python3 - "$OUTDIR/channels.client.json" <<'PY' || fail "a flow starved while channels changed"
import json, sys
per = json.load(open(sys.argv[1]))["replies_per_flow"]
mean = sum(per) / len(per)
print(f"[soak] channels: replies per flow {per}")
sys.exit(0 if min(per) >= 0.25 * mean else 1)
PY
    wait_console "$LOG" 'ARFSNIC-GUEST-JSON-END' 1 120
    qemu_gone
fi

# ---- midmsg: frontends dying in the middle of a message; QEMU killed during start-up
if has_phase midmsg; then
    for ((c = 1; c <= CYCLES; c++)); do
        python3 - "$SOCK" "$c" <<'PY'
import socket, struct, sys
path, c = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(path)
hdr = lambda code, size: struct.pack("<III", code, 0x1, size)
cut = [
    hdr(1, 0)[:5],                                # a header cut short
    hdr(5, 40) + b"\0" * 7,                      # SET_MEM_TABLE promising 40 bytes, 7 sent
    hdr(1, 0) + hdr(9, 40) + b"\1" * 20,          # GET_FEATURES, then half a SET_VRING_ADDR
    hdr(0x7fff, 0xffffffff),                      # unknown request with an absurd size
][c % 4]
s.sendall(cut)
s.close()
PY
        LOG=$OUTDIR/midmsg-$c.log
        qemu_start 2 2 "$INITRD" "$BASE arfs.duration=600" "$LOG" -no-reboot
        sleep "$(awk -v c="$c" 'BEGIN { printf "%.2f", 0.1 + 0.15 * (c % 8) }')"
        kill -9 "$QEMU_PID"
        wait "$QEMU_PID" 2>/dev/null || true
        QEMU_PID=""
        wait_st "not s['link_up']" 10
        sample midmsg "$c" 0
    done
    boot "$OUTDIR/midmsg-final.log" "arfs.duration=5"
    client 3 "$OUTDIR/midmsg-final.client.json"
    client_ok "$OUTDIR/midmsg-final.client.json"
    wait_console "$LOG" 'ARFSNIC-GUEST-JSON-END' 1 120
    qemu_gone
fi

# ---- spoof: forged device frames from the host side of the tap
if has_phase spoof; then
    LOG=$OUTDIR/spoof.log
    r0=$(st device_resets)
    qemu_start 2 2 "$INITRD" "$BASE,$DBG/rules arfs.duration=10" "$LOG" -no-reboot
    wait_console "$LOG" 'arfs-echo: ready' 1 240
    fresh_device "$r0"
    ( client 6 "$OUTDIR/spoof.client.json" ) &
    CPID=$!
    wait_st "s['filter']['rules_now'] > 0" 10
    SP0=$(st rx_spoofed_dropped)
    ip netns exec "$NS" python3 "$HERE/e2e/forge-control.py" --ifname "$TAP" --dst "$GUEST_MAC" \
        >"$OUTDIR/spoof.forged.json"
    SENT=$(python3 -c "import json; print(json.load(open('$OUTDIR/spoof.forged.json'))['sent'])")
    wait "$CPID" || true
    client_ok "$OUTDIR/spoof.client.json"
    wait_console "$LOG" 'ARFSNIC-GUEST-JSON-END' 1 120
    for ((i = 0; i < 300; i++)); do kill -0 "$QEMU_PID" 2>/dev/null || break; sleep 0.1; done
    QEMU_PID=""
    wait_st "not s['link_up']" 10
    guest_json "$LOG" 1 >"$OUTDIR/spoof.guest.json"
    cp "$STATS" "$OUTDIR/spoof.stats.json"
    python3 - "$OUTDIR" "$SP0" "$SENT" <<'PY' || fail "forged control frames reached the guest or were not all counted"
import json, re, sys
out, sp0, sent = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
st = json.load(open(out + "/spoof.stats.json"))
g = json.load(open(out + "/spoof.guest.json"))
text = g["files"].get("/sys/kernel/debug/arfs_virtio/stats") or ""
gs = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+): (-?\d+)$", text, re.M)}
rules = [l for l in (g["files"].get("/sys/kernel/debug/arfs_virtio/rules") or "").splitlines()[1:] if l.strip()]
installed = sum(1 for l in rules if " installed " in f" {l} ")
dropped = st["rx_spoofed_dropped"] - sp0
ok = True
def check(cond, msg):
    global ok
    print(("[soak] ok   " if cond else "[soak] FAIL ") + msg)
    ok &= bool(cond)
check(dropped == sent, f"device dropped {dropped} of {sent} forged frames as spoofed")
check(gs.get("engine_disabled") == 0, f"guest engine_disabled {gs.get('engine_disabled')} (forged ENGINE_STATE disabled=1 never arrived)")
check(gs.get("ev_table_flushed") == 0 and gs.get("ev_engine_state") == 0,
      f"guest saw no TABLE_FLUSHED/ENGINE_STATE events ({gs.get('ev_table_flushed')}, {gs.get('ev_engine_state')})")
check(gs.get("rx_events") == st["control_frames"]["events_sent"],
      f"guest events {gs.get('rx_events')} = events the device sent {st['control_frames']['events_sent']}")
check(gs.get("rx_drop_seq", 1) == 0 and gs.get("rx_drop_src_mac", 1) == 0,
      f"guest dropped no unmatched completions ({gs.get('rx_drop_seq')}) and no frames from a wrong source ({gs.get('rx_drop_src_mac')})")
eth = g.get("ethtool_s_after") or {}
check(eth.get("dev_rx_spoofed_dropped") == dropped,
      f"guest ethtool -S dev_rx_spoofed_dropped {eth.get('dev_rx_spoofed_dropped')} = {dropped} (the device's count, via DEV_STATS)")
check(installed == st["filter"]["rules_now"] and installed > 0,
      f"guest rule table: {installed} installed rules = {st['filter']['rules_now']} in the device's table")
json.dump({"forged_sent": sent, "dropped": dropped, "guest_rules_installed": installed,
           "device_rules": st["filter"]["rules_now"]}, open(out + "/spoof.result.json", "w"))
sys.exit(0 if ok else 1)
PY
fi

# ---- serve's resources over the cycles
T_END=$(date +%s)
python3 - "$OUTDIR" "$((T_END - T_START))" <<'PY' || fail "serve's resources grew over the cycles"
import csv, json, sys
out, wall = sys.argv[1], int(sys.argv[2])
rows = list(csv.DictReader(open(out + "/cycles.csv")))
ok = True
summary = {"wall_s": wall, "kinds": {}}
for kind in dict.fromkeys(r["kind"] for r in rows):
    rs = [r for r in rows if r["kind"] == kind]
    fds = [int(r["fds"]) for r in rs]
    thr = [int(r["threads"]) for r in rs]
    rss = [int(r["vm_rss_kb"]) for r in rs]
    summary["kinds"][kind] = {"cycles": len(rs), "fds": fds, "threads": thr, "vm_rss_kb": rss}
    after2 = slice(1, None) if len(rs) > 1 else slice(0, None)
    same = len(set(fds[after2])) == 1 and len(set(thr[after2])) == 1
    print(("[soak] ok   " if same else "[soak] FAIL ") + f"{kind}: fds {fds}, threads {thr} (constant from cycle 2)")
    ok &= same
allrss = [int(r["vm_rss_kb"]) for r in rows]
if not allrss:
    print("[soak] no cycles sampled (only the spoof phase ran)")
    json.dump(summary, open(out + "/summary.json", "w"), indent=1)
    sys.exit(0)
base = next((int(r["vm_rss_kb"]) for r in rows if r["cycle"] == "2"), allrss[0])
growth = allrss[-1] - base
summary["vm_rss_growth_kb"] = growth
print(("[soak] ok   " if growth < 5 * 1024 else "[soak] FAIL ") + f"VmRSS {base} kB at the first cycle 2 -> {allrss[-1]} kB at the end ({growth:+d} kB, limit 5 MB)")
ok &= growth < 5 * 1024
json.dump(summary, open(out + "/summary.json", "w"), indent=1)
sys.exit(0 if ok else 1)
PY
say "PASS ($CYCLES cycles of: $PHASES; $((T_END - T_START)) s; logs in $OUTDIR)"
