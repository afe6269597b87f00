//! The Debian guest (`vm.guest = "debian"`: the trixie image of
//! guest-tests/image/build-debian.sh mounted as the root after the initramfs loaded the
//! drivers): the guest module built inside it from source against its installed headers,
//! and bcc's `funccount` counting the same `ndo_rx_flow_steer` calls the module reports —
//! on the stock Debian 7.3 kernel and, through `arfsnic demo --guest debian`, on the
//! patched 7.3 kernel in the llc-within / llc-across pair; and the remote NIC
//! (`vm.remote`) that the kernel's selftests use as their remote end. Ignored by a plain
//! `cargo test`; `guest-tests/run-tests.sh` runs them with `--ignored`.

mod common;

use arfsnic::report::schema::{FuncCount, RunReport};
use arfsnic::report::Report;
use common::{root, run_scenario};
use std::process::Command;

/// Builds arfs_virtio in the guest with kbuild against /lib/modules/$(uname -r)/build (the
/// image's linux-headers package), then loads it as the runner would.
const BUILD_HOOK: &str = r#"#!/bin/sh
# tests/e2e_debian.rs: build the guest module in the Debian guest and load it
IF=$1
cp -r /run/arfsnic/src/arfs_virtio /tmp/arfs_virtio || exit 1
KB=/lib/modules/$(uname -r)/build
echo "kbuild: $(readlink -f "$KB")"
t0=$(cut -d' ' -f1 /proc/uptime)
if ! make -C "$KB" M=/tmp/arfs_virtio modules > /tmp/arfs_virtio/build.log 2>&1; then
    tail -n 30 /tmp/arfs_virtio/build.log
    exit 2
fi
t1=$(cut -d' ' -f1 /proc/uptime)
echo "built: $(modinfo -F vermagic /tmp/arfs_virtio/arfs_virtio.ko)"
awk -v a="$t0" -v b="$t1" 'BEGIN { printf "build seconds: %.1f\n", b - a }'
insmod /tmp/arfs_virtio/arfs_virtio.ko irqs="$ARFS_INPUT_IRQS" ifname="$IF" || exit 3
grep '^arfs_virtio ' /proc/modules
"#;

/// The funccount block of a run, printed, with the agreement asserted: the exact
/// funccount total equals the module's steer_calls over the same interval within 1 %, and
/// `-i 1`'s per-second sum never exceeds it (it can only lose calls).
fn check_funccount(label: &str, run: &RunReport, need_calls: bool) -> FuncCount {
    let f =
        run.guest.system.funccount.clone().unwrap_or_else(|| panic!("{label}: no funccount block in the guest report"));
    println!(
        "{label}: funccount exact {:?}, -i 1 sum {} over {} intervals, module {:?}, attach {:?} s, \
         difference {:?} %, -i 1 loss {:?} %",
        f.total_exact,
        f.total,
        f.per_interval.len(),
        f.module_calls(),
        f.attach_s,
        f.disagreement_pct(),
        f.interval_loss_pct()
    );
    let module = f.module_calls().unwrap_or_else(|| panic!("{label}: no module steer_calls around funccount: {f:?}"));
    let exact = f.total_exact.unwrap_or_else(|| panic!("{label}: the exact funccount printed no total: {f:?}"));
    if need_calls {
        assert!(exact > 0, "{label}: funccount saw no call of {}: {f:?}", f.function);
    }
    let off = exact.abs_diff(module);
    assert!(
        off * 100 <= module.max(1),
        "{label}: funccount {exact} vs module {module}: differ by {off} (> 1 %): {f:?}"
    );
    assert!(f.total <= module + module / 100 + 1, "{label}: -i 1 counted more than the module: {f:?}");
    // The trade-off column's source: softnet_stat's received_rps against funccount of the
    // handler that increments it.
    let ipis = f.rps_trigger_softirq_exact.unwrap_or_else(|| panic!("{label}: no rps_trigger_softirq count: {f:?}"));
    let rps = f.softnet_rps().unwrap_or_else(|| panic!("{label}: no softnet_stat received_rps: {f:?}"));
    println!("{label}: RPS IPIs: funccount {ipis}, softnet_stat received_rps {rps}");
    let off = ipis.abs_diff(rps);
    assert!(off * 100 <= rps.max(1), "{label}: rps_trigger_softirq {ipis} vs received_rps {rps} (> 1 %): {f:?}");
    f
}

#[test]
#[ignore = "needs QEMU 10, the Debian image and the stock 7.3 kernel: run through guest-tests/run-tests.sh"]
fn debian_guest_builds_the_module_and_funccount_agrees() {
    let toml = std::fs::read_to_string(root().join("configs/scenarios/steer.toml"))
        .unwrap()
        .replace("name = \"steer\"", "name = \"debian-guest\"")
        .replace("kernel = \"debian-6.12\"", "kernel = \"debian-7.3\"")
        .replace("accel = \"auto\"", "accel = \"auto\"\nguest = \"debian\"")
        // The hook builds and loads the module; the runner loads none.
        .replace(
            "module = true",
            "module = false\nhook = \"build-hook.sh\"\nfunccount = \"arfs_rx_flow_steer\"\n\n[timeouts]\nboot_s = 900",
        );
    let r = run_scenario("debian-guest", &toml, &[("build-hook.sh", BUILD_HOOK.to_string())]);
    let run = &r.runs[0];
    let hook = &run.guest.system.other["hook"];
    let out = hook["output"].as_str().unwrap_or_default();
    println!("--- hook output\n{out}");
    assert_eq!(hook["rc"], 0, "building or loading the module in the guest failed: {out}");
    assert!(out.contains("built: 7.3.4+deb13-amd64 "), "vermagic of the guest-built module: {out}");
    assert!(out.contains("arfs_virtio "), "the guest-built module is not loaded: {out}");
    // The guest-built module steered: its STATS frames reached the device.
    let d = run.driver().expect("no driver counters: the guest-built module sent no STATS frames");
    assert!(d.steer_calls > 0 && d.adds_ok > 0, "{d:?}");
    assert_eq!(run.link.lost, 0, "{:?}", run.link);
    check_funccount("debian-7.3", run, true);
}

#[test]
#[ignore = "needs QEMU 10, the Debian image and the patched 7.3 kernel: run through guest-tests/run-tests.sh"]
fn demo_on_the_debian_guest_with_funccount() {
    let out = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_arfsnic"))
        .args(["demo", "--quiet", "--no-provision", "--guest", "debian", "--out"])
        .arg(out.path())
        .current_dir(root())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    println!("{stdout}");
    assert!(
        o.status.success(),
        "arfsnic demo --guest debian failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains("funccount arfs_rx_flow_steer"), "the demo prints no funccount lines:\n{stdout}");
    for name in ["llc-within", "llc-across"] {
        let r = Report::load(&out.path().join(format!("{name}.json")), name).unwrap();
        assert_eq!(r.kernel, "patched-7.3");
        for run in &r.runs {
            let label = format!("{name} {}", run.label);
            assert_eq!(run.health.as_ref().map(|h| h.verdict.as_str()), Some("ok"), "{label}: {:?}", run.health);
            // Every run steers except llc-within with the sysctl on (the patch's point).
            let steers = !(name == "llc-within" && run.label == "sysctl=1");
            check_funccount(&label, run, steers);
        }
    }
}

/// What the selftests' NetDrvEpEnv does with its remote end, by hand: ping both ways over
/// v4 and v6, then TCP from the `remote` namespace into the NIC under test, while the
/// link partner's workload runs on the same wire.
const REMOTE_HOOK: &str = r#"#!/bin/sh
# tests/e2e_debian.rs: the remote NIC in netns remote, reached over the emulated wire
IF=$1
echo "env: NETIF=$NETIF LOCAL_V4=$LOCAL_V4 REMOTE_V4=$REMOTE_V4 LOCAL_V6=$LOCAL_V6 REMOTE_V6=$REMOTE_V6 REMOTE_TYPE=$REMOTE_TYPE REMOTE_ARGS=$REMOTE_ARGS"
ip -n "$REMOTE_ARGS" -br addr
ping -c 3 -W 5 "$REMOTE_V4" > /tmp/p4 2>&1 && echo "ping4 ok" || { cat /tmp/p4; exit 1; }
ping -6 -c 3 -W 5 "$REMOTE_V6" > /tmp/p6 2>&1 && echo "ping6 ok" || { cat /tmp/p6; exit 2; }
ip netns exec "$REMOTE_ARGS" ping -c 3 -W 5 "$LOCAL_V4" > /tmp/r4 2>&1 && echo "remote ping4 ok" || { cat /tmp/r4; exit 3; }
head -c 1000000 /dev/urandom > /tmp/tx
timeout 120 socat -u TCP6-LISTEN:5555,reuseaddr OPEN:/tmp/rx,creat,trunc &
sleep 1
timeout 120 ip netns exec "$REMOTE_ARGS" socat -u OPEN:/tmp/tx TCP6:["$LOCAL_V6"]:5555 || exit 4
wait
cmp /tmp/tx /tmp/rx && echo "tcp6 bytes: $(wc -c < /tmp/rx)" || exit 5
"#;

#[test]
#[ignore = "needs QEMU 10, the Debian image and the stock 7.3 kernel: run through guest-tests/run-tests.sh"]
fn the_remote_nic_shares_the_wire_with_the_partner() {
    let toml = std::fs::read_to_string(root().join("configs/scenarios/steer.toml"))
        .unwrap()
        .replace("name = \"steer\"", "name = \"debian-remote\"")
        .replace("kernel = \"debian-6.12\"", "kernel = \"debian-7.3\"")
        .replace("accel = \"auto\"", "accel = \"auto\"\nguest = \"debian\"\nremote = true")
        .replace("module = true", "module = true\nhook = \"remote-hook.sh\"\n\n[timeouts]\nboot_s = 900");
    let r = run_scenario("debian-remote", &toml, &[("remote-hook.sh", REMOTE_HOOK.to_string())]);
    let run = &r.runs[0];
    let hook = &run.guest.system.other["hook"];
    let out = hook["output"].as_str().unwrap_or_default();
    println!("--- hook output\n{out}");
    assert_eq!(hook["rc"], 0, "the remote NIC is not reachable over the wire: {out}");
    assert!(out.contains("REMOTE_TYPE=netns REMOTE_ARGS=remote"), "{out}");
    assert!(out.contains("tcp6 bytes: 1000000"), "{out}");
    let p = run.remote_port.as_ref().expect("no remote_port block in the report");
    println!("remote port: {p:?}");
    // 1 MB of TCP is about 700 segments into the NIC under test.
    assert!(p.from_remote_delivered >= 700 && p.to_remote_frames > 0, "{p:?}");
    assert_eq!((p.from_remote_malformed, p.from_remote_to_partner), (0, 0), "{p:?}");
    // The partner's workload on the same wire is unharmed.
    assert!(run.link.responses > 0 && run.link.lost == 0, "{:?}", run.link);
}
