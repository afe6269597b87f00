#!/usr/bin/env bash
# The kernel's own NIC selftests (tools/testing/selftests/drivers/net/hw/) on the emulated
# NIC: taken from the source tree the guest kernel was built from, run in the Debian guest
# (vm.guest = "debian") on its eth0 with arfs_virtio loaded, before the scenario's
# workload, through a self-extracting guest hook. The remote end of NetDrvEpEnv tests
# (ntuple.py, ...) is the guest's second NIC on the same emulated wire, in the network
# namespace `remote` (vm.remote: REMOTE_TYPE=netns, LOCAL_V4/V6, REMOTE_V4/V6).
#
#   guest-tests/selftests/run.sh [--kernel NAME] [--out DIR] [--check] [TEST.py ...]
#
# NAME: patched-7.3 (default) or vanilla-7.3: the trees guest-tests/kernel/build.sh makes
# (cached). TESTs default to rss_api.py.
# Writes DIR/<test>.ktap (KTAP as the test printed it), DIR/summary.txt (one line per
# case: ok / not ok / skip; a test that stopped before its first case: one `error` line)
# and DIR/report.json (the run, with the hook's output); prints the summary. --check
# compares the summary with guest-tests/selftests/expected-<NAME>.txt (the known state;
# the reason for every case that does not pass is in docs/selftests.md) and fails on any
# difference, in either direction; a case recorded as `ok|not ok` (a wall-clock bound in
# the test) matches either. When the only differences are cases recorded `ok` that failed
# because the test library's 20 s wait for its iperf3 client to exit ran out, the tests
# run once more (said on stderr) and that run is checked.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ARGS=("$@")
REPO=$(cd "$HERE/../.." && pwd)
KERNEL=patched-7.3
OUT=""
CHECK=0
TESTS=()
die() { echo "selftests/run.sh: error: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
    case "$1" in
        --kernel) [ $# -ge 2 ] || die "--kernel needs a name"; KERNEL=$2; shift 2 ;;
        --out) [ $# -ge 2 ] || die "--out needs a directory"; OUT=$2; shift 2 ;;
        --check) CHECK=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) die "unknown option $1" ;;
        *) TESTS+=("$1"); shift ;;
    esac
done
[ ${#TESTS[@]} -gt 0 ] || TESTS=(rss_api.py)
case "$KERNEL" in
    patched-7.3) BARGS=(--base 7.3) ;;
    vanilla-7.3) BARGS=(--base 7.3 --no-patch) ;;
    *) die "--kernel $KERNEL: the selftests come from a tree build.sh makes: patched-7.3 or vanilla-7.3" ;;
esac
OUT=${OUT:-$REPO/.cache/selftests/$KERNEL}
mkdir -p "$OUT"
ARFSNIC=${ARFSNIC:-$REPO/target/release/arfsnic}
[ -x "$ARFSNIC" ] || (cd "$REPO" && cargo build --release --bin arfsnic) || die "cargo build failed"

KDIR=$(bash "$REPO/guest-tests/kernel/build.sh" "${BARGS[@]}" | sed -n 's/^KDIR=//p' | tail -n1)
[ -d "$KDIR/tools/testing/selftests/drivers/net/hw" ] || die "no tools/testing/selftests/drivers/net/hw in $KDIR"
for t in "${TESTS[@]}"; do
    case "$t" in */*|'') die "test '$t': a file name in drivers/net/hw/" ;; esac
    [ -f "$KDIR/tools/testing/selftests/drivers/net/hw/$t" ] || die "no drivers/net/hw/$t in $KDIR"
done

# Test programs the Python tests run, built on this host from the same tree (they link
# the tree's ynl library and need its uapi headers; needs gcc, make, python3-yaml).
HELPERS=()
for t in "${TESTS[@]}"; do
    case "$t" in toeplitz.py) HELPERS+=(toeplitz) ;; esac
done
for h in "${HELPERS[@]}"; do
    hw="$KDIR/tools/testing/selftests/drivers/net/hw"
    [ -x "$hw/$h" ] && continue
    { make -s -C "$KDIR" headers && make -s -C "$hw" "$hw/$h"; } >&2 ||
        die "building $h from $hw failed (needs gcc, make, python3-yaml)"
done

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# What the Python tests import: their libraries, ynl and its specs (the paths they
# compute from the tree's layout).
(cd "$KDIR" && tar -cf - \
    tools/testing/selftests/drivers/net/lib tools/testing/selftests/drivers/net/hw/lib \
    "${TESTS[@]/#/tools/testing/selftests/drivers/net/hw/}" \
    ${HELPERS[@]+"${HELPERS[@]/#/tools/testing/selftests/drivers/net/hw/}"} \
    tools/testing/selftests/net/lib tools/net/ynl/pyynl Documentation/netlink/specs) |
    xz -6 > "$WORK/payload.tar.xz" || die "packing the selftests of $KDIR failed"

{
    cat <<EOF
#!/bin/sh
# written by guest-tests/selftests/run.sh: unpack the kernel's selftests, run them on \$1
IF=\$1
mkdir -p /tmp/st && sed '1,/^__PAYLOAD__\$/d' "\$0" | base64 -d | xz -dc | tar -x -C /tmp/st || exit 90
cd /tmp/st/tools/testing/selftests/drivers/net/hw || exit 91
# The tests expect a NIC as it comes up: ntuple filters (so aRFS) off, RPS and RFS not
# configured (toeplitz.py skips otherwise; rss_input_xfrm.py reads the CPU a packet was
# processed on, which RPS would choose). The run's init set them up for its workload;
# they are put back after the tests. rxhash on (toeplitz.py compares the hash the NIC
# reported with its own; the device reports it with virtio-net's HASH_REPORT).
ntuple=\$(ethtool -k "\$IF" | sed -n 's/^ntuple-filters: \\([a-z]*\\).*/\\1/p')
rxhash=\$(ethtool -k "\$IF" | sed -n 's/^receive-hashing: \\([a-z]*\\).*/\\1/p')
sfe=\$(cat /proc/sys/net/core/rps_sock_flow_entries)
fcnt=\$(cat /sys/class/net/"\$IF"/queues/rx-0/rps_flow_cnt)
rps=\$(cat /sys/class/net/"\$IF"/queues/rx-0/rps_cpus)
ethtool -K "\$IF" ntuple-filters off
echo 0 > /proc/sys/net/core/rps_sock_flow_entries
for q in /sys/class/net/"\$IF"/queues/rx-*; do echo 0 > "\$q/rps_flow_cnt"; echo 0 > "\$q/rps_cpus"; done
ethtool -K "\$IF" rxhash on || echo "selftests hook: rxhash cannot be turned on"
# rss_ctx.py's persist tests take the link down and up and then ping the remote end over
# IPv6 (NetDrvEpEnv's default): without this the kernel flushes the static IPv6 address at
# link down, and nothing here adds it again (a network manager would).
kad=\$(cat /proc/sys/net/ipv6/conf/"\$IF"/keep_addr_on_down)
echo 1 > /proc/sys/net/ipv6/conf/"\$IF"/keep_addr_on_down
# An IRQ's affinity set while it is idle takes effect at its next interrupt, which is still
# handled on the old CPU (x86 MSI without interrupt remapping): rss_input_xfrm.py and
# toeplitz.py read the CPU a packet was processed on. Traffic from the remote end to many
# ports interrupts every RX queue once first.
ip netns exec remote python3 -c '
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for p in range(512):
    s.sendto(b"warm-up", (sys.argv[1], 20000 + p))
' "\$LOCAL_V4" || echo "selftests hook: queue warm-up failed"
sleep 1
for i in \$(sed -n 's/^ *\\([0-9]*\\):.*-input\\..*/\\1/p' /proc/interrupts); do
    a=\$(cat /proc/irq/\$i/smp_affinity_list) e=\$(cat /proc/irq/\$i/effective_affinity_list)
    [ "\$a" = "\$e" ] || echo "selftests hook: IRQ \$i affinity \$a, effective \$e"
done
for t in ${TESTS[*]}; do
    echo "=== \$t"
    NETIF=\$IF timeout 900 python3 "\$t" 2>&1
    echo "=== rc=\$?"
done
for q in /sys/class/net/"\$IF"/queues/rx-*; do echo "\$fcnt" > "\$q/rps_flow_cnt"; echo "\$rps" > "\$q/rps_cpus"; done
echo "\$sfe" > /proc/sys/net/core/rps_sock_flow_entries
ethtool -K "\$IF" ntuple-filters "\${ntuple:-on}" rxhash "\${rxhash:-off}"
echo "\$kad" > /proc/sys/net/ipv6/conf/"\$IF"/keep_addr_on_down
exit 0
__PAYLOAD__
EOF
    base64 "$WORK/payload.tar.xz"
} > "$WORK/selftests-hook.sh"
chmod +x "$WORK/selftests-hook.sh"

# A short run of the steer scenario's shape: the tests run before its workload. 16 queue
# pairs on 4 vCPUs: virtio_net starts with 4 combined channels and rss_ctx.py can raise
# them (it needs a spare one; its context4 tests need 10).
sed -e 's/^name = .*/name = "selftests"/' -e "s/^kernel = .*/kernel = \"$KERNEL\"/" \
    -e 's/^duration_s = .*/duration_s = 2/' -e 's/^queues = .*/queues = 16/' \
    -e 's/^accel = .*/&\nguest = "debian"\nremote = true/' -e 's/^module = true/&\nhook = "selftests-hook.sh"/' \
    "$REPO/configs/scenarios/steer.toml" > "$WORK/selftests.toml"
printf '\n[timeouts]\nboot_s = 1800\n' >> "$WORK/selftests.toml"
echo "selftests/run.sh: ${TESTS[*]} from $KDIR on $KERNEL (Debian guest)" >&2
"$ARFSNIC" run --quiet --scenario "$WORK/selftests.toml" --json "$OUT/report.json" --logdir "$OUT/logs" >&2 ||
    [ -f "$OUT/report.json" ] || die "arfsnic run failed (logs in $OUT/logs)"

python3 - "$OUT" <<'EOF'
import json, re, sys
out = sys.argv[1]
r = json.load(open(f"{out}/report.json"))
hook = r["runs"][0]["guest"]["system"].get("hook") or {}
text = hook.get("output") or ""
summary, cur, buf = [], None, []
for line in text.splitlines() + ["=== end"]:
    m = re.match(r"^=== (\S+\.py)$", line)
    if m or line == "=== end":
        if cur:
            open(f"{out}/{cur[:-3]}.ktap", "w").write("\n".join(buf) + "\n")
            # A test that stopped before its first case (e.g. NetDrvEpEnv without a
            # remote end) counts as one error.
            if not any(re.match(r"^(ok|not ok) \d+ ", l) for l in buf):
                summary.append(f"{cur[:-3]} error")
        cur, buf = (m.group(1) if m else None), []
        continue
    if cur is None or line.startswith("=== rc="):
        continue
    buf.append(line)
    m = re.match(r"^(ok|not ok) \d+ (\S+)(.*)$", line)
    if m:
        state = "skip" if "# SKIP" in m.group(3) else m.group(1)
        summary.append(f"{m.group(2)} {state}")
open(f"{out}/summary.txt", "w").write("".join(s + "\n" for s in summary))
if not summary:
    sys.exit(f"no KTAP results in the hook's output (rc {hook.get('rc')}): see {out}/logs")
EOF
cat "$OUT/summary.txt"
awk -v out="$OUT" '$NF == "skip" { s++ } $NF == "error" { e++ }
    $NF == "ok" && $(NF-1) == "not" { f++ } $NF == "ok" && $(NF-1) != "not" { p++ }
    END { printf "selftests: %d ok, %d not ok, %d skip, %d error (KTAP in %s)\n", p, f, s, e, out }' "$OUT/summary.txt"
if [ "$CHECK" = 1 ]; then
    EXP="$HERE/expected-$KERNEL.txt"
    [ -f "$EXP" ] || die "--check: $EXP missing"
    # A case recorded as `ok|not ok` asserts a wall-clock bound (docs/selftests.md says
    # which and why): either result matches it.
    if ! DIFF=$(diff -u <(grep -v '^#' "$EXP" | sed '/^$/d' | sort) \
        <(awk 'NR == FNR { if ($2 == "ok|not") either[$1] = 1; next }
               $1 in either { print $1 " ok|not ok"; next } { print }' \
            "$EXP" "$OUT/summary.txt" | sort)); then
        echo "$DIFF"
        # what the tests said where they failed (the whole KTAP is in $OUT)
        grep -h -E '^# Check failed|^# Exception\| [A-Za-z.]*(Error|Exception|Ex):|^not ok' "$OUT"/*.ktap || true
        # One rerun when every difference is a case recorded `ok` that failed only because
        # the test library gave up waiting for its iperf3 client or one-off server to exit (a
        # 20 s wall-clock bound that a TCG guest under iperf3 -P 16 does not always meet:
        # docs/selftests.md); a second failure of any kind fails. The differing cases are
        # the diff's own -/+ lines.
        if [ -z "${ARFSNIC_SELFTESTS_RERUN:-}" ] && python3 - "$OUT" "$DIFF" <<'PYEOF'
import glob, re, sys
out, diff = sys.argv[1], sys.argv[2].splitlines()
side = lambda c: {l[1:].split(" ", 1)[0]: l[1:].split(" ", 1)[1] for l in diff
                  if l[:1] == c and l[:3] != c * 3 and " " in l}
want, got = side("-"), side("+")
timed_out = set()
for path in glob.glob(f"{out}/*.ktap"):
    block = []
    for line in open(path):
        m = re.match(r"^(ok|not ok) \d+ (\S+)", line)
        if m:
            text = "".join(block)
            if m.group(1) == "not ok" and re.search(r"TimeoutExpired: Command .*iperf3.* timed out after 20 seconds", text):
                timed_out.add(m.group(2))
            block = []
        else:
            block.append(line)
names = set(want) | set(got)
ok = bool(names) and all(want.get(n) == "ok" and got.get(n) == "not ok" and n in timed_out for n in names)
print("selftests: " + ", ".join(sorted(names)) + (": only the iperf3 stop timeout, running the tests once more" if ok else ""), file=sys.stderr)
sys.exit(0 if ok else 1)
PYEOF
        then
            rm -rf "$WORK"
            ARFSNIC_SELFTESTS_RERUN=1 exec bash "${BASH_SOURCE[0]}" "${ARGS[@]}"
        fi
        die "the selftests' results differ from $EXP (update it and docs/selftests.md when a case changes)"
    fi
    echo "selftests: as expected ($EXP)"
fi
