//! End-to-end test of ethtool ntuple rules (`ethtool -N … flow-type … action Q [loc L]`,
//! `-n`, `delete`, `-K ntuple-filters off`) on the guest's virtio_net with `arfs_virtio`
//! loaded: the module keeps the rules and forwards them in-band (RULE_SET / RULE_DEL,
//! docs/control-protocol.md §2.10, §2.11), the device steers with them before its aRFS
//! filters. A guest hook runs the commands before the workload; the test reads their
//! output from the guest JSON and checks where the device delivered the traffic that
//! followed. Ignored by a plain `cargo test`; `guest-tests/run-tests.sh` runs it with
//! `--ignored`.

mod common;

use common::{hook_steps as steps, root, run_scenario};

/// Each step prints `== <name>`, the command's output and `rc=<status>`. It leaves two
/// rules for the workload: the partner's flow to guest port 7001 to queue 2 (loc 1),
/// everything else the partner sends to queue 3 (loc 10), over an RSS table of `equal 1`.
const HOOK: &str = r#"#!/bin/sh
# tests/e2e_ntuple.rs: ethtool ntuple rules against the emulated device
IF=$1
step() {
    name=$1; shift
    echo "== $name"
    "$@" 2>&1
    echo "rc=$?"
}
step n-empty ethtool -n "$IF"
step N-bad-queue ethtool -N "$IF" flow-type udp4 dst-port 7001 action 9
step N-loc1 ethtool -N "$IF" flow-type udp4 dst-port 7001 action 2 loc 1
step N-any ethtool -N "$IF" flow-type tcp6 src-ip fd00:99::1 src-port 5000 action 1
step n-list ethtool -n "$IF"
step n-rule1 ethtool -n "$IF" rule 1
step delete-0 ethtool -N "$IF" delete 0
step delete-0-again ethtool -N "$IF" delete 0
step K-off ethtool -K "$IF" ntuple-filters off
step n-after-off ethtool -n "$IF"
step N-while-off ethtool -N "$IF" flow-type udp4 dst-port 7001 action 2 loc 1
step K-on ethtool -K "$IF" ntuple-filters on
step X-equal-1 ethtool -X "$IF" equal 1
step N-loc1-again ethtool -N "$IF" flow-type udp4 dst-port 7001 action 2 loc 1
step N-loc10 ethtool -N "$IF" flow-type udp4 src-ip 10.99.0.1 action 3 loc 10
step n-final ethtool -n "$IF"
exit 0
"#;

/// The steer scenario (4 queues, 64 UDP flows, the module loaded) on `kernel`, RFS off.
fn scenario(kernel: &str) -> String {
    std::fs::read_to_string(root().join("configs/scenarios/steer.toml"))
        .unwrap()
        .replace("name = \"steer\"", "name = \"ethtool-ntuple\"")
        .replace("kernel = \"debian-6.12\"", &format!("kernel = \"{kernel}\""))
        .replace("duration_s = 10", "duration_s = 4")
        // RFS off: with every flow held on the rules' queues, RFS would keep asking to
        // steer flows whose filter exists (a degraded run, docs/measuring.md); the rules'
        // priority over aRFS filters is a unit test of the model.
        .replace("module = true", "module = true\nrps_sock_flow_entries = 0\nhook = \"ntuple-hook.sh\"")
}

fn check_ntuple(name: &str, kernel: &str) {
    let r = run_scenario(name, &scenario(kernel), &[("ntuple-hook.sh", HOOK.to_string())]);
    assert_eq!(r.kernel, kernel);
    let run = &r.runs[0];
    let g = &run.guest.system.other;
    let hook = &g["hook"];
    let output = hook["output"].as_str().unwrap_or_else(|| panic!("no hook output in the guest JSON: {hook}"));
    println!("--- hook output\n{output}");
    let s = steps(output);
    let step = |name: &str| -> (&str, i32) {
        let (_, text, rc) = s.iter().find(|(n, _, _)| n == name).unwrap_or_else(|| panic!("no step {name}: {s:?}"));
        (text.as_str(), *rc)
    };
    let ok = |name: &str| {
        let (text, rc) = step(name);
        assert_eq!(rc, 0, "{name}: {text}");
        text
    };
    let fails = |name: &str, why: &str| {
        let (text, rc) = step(name);
        assert_ne!(rc, 0, "{name} should fail: {text}");
        assert!(text.contains(why), "{name}: expected {why:?}: {text}");
    };

    assert!(ok("n-empty").contains("Total 0 rules"));
    // ethtool (6.1) prints the driver's EINVAL but exits 0 when it let the driver pick the
    // location: the message is what tells.
    let (text, _) = step("N-bad-queue");
    assert!(text.contains("Cannot insert RX class rule: Invalid argument"), "{text}");
    ok("N-loc1");
    // No location given: the driver picks the lowest free one.
    assert!(ok("N-any").contains("Added rule with ID 0"));
    let list = ok("n-list");
    assert!(list.contains("Total 2 rules"), "{list}");
    let rule1 = ok("n-rule1");
    // ethtool prints masks inverted: 0x0 is an exact match, 0xffff a field left out.
    for want in ["Filter: 1", "Rule Type: UDP over IPv4", "Dest port: 7001 mask: 0x0", "Src port: 0 mask: 0xffff"] {
        assert!(rule1.contains(want), "{want}: {rule1}");
    }
    assert!(rule1.contains("Action: Direct to queue 2"), "{rule1}");
    ok("delete-0");
    fails("delete-0-again", "No such file or directory");
    // ntuple-filters off takes every rule with it, and no new rule is accepted.
    ok("K-off");
    assert!(ok("n-after-off").contains("Total 0 rules"));
    let (text, _) = step("N-while-off");
    assert!(text.contains("Cannot insert RX class rule: Operation not supported"), "a rule while off: {text}");
    ok("K-on");
    ok("X-equal-1");
    ok("N-loc1-again");
    ok("N-loc10");
    assert!(ok("n-final").contains("Total 2 rules"));

    let after = &g["ethtool_s_after"];
    assert_eq!(after["dev_user_rules"], 2, "{after}");
    assert!(after["dev_user_rule_hits"].as_u64().unwrap_or(0) > 0, "{after}");

    // The workload's flows: every datagram from the partner matched a rule (loc 1 wins
    // for port 7001 over loc 10), none took RSS (which says queue 0 for all).
    let d = &run.device;
    println!("rss_delivered_per_queue {:?}", d.rss_delivered_per_queue);
    println!("filter_delivered_per_queue {:?}", d.filter_delivered_per_queue);
    let f = &d.filter_delivered_per_queue;
    assert_eq!((f[0], f[1]), (0, 0), "steered to queues no rule names: {f:?}");
    assert!(f[2] > 0 && f[3] > f[2], "port 7001 to queue 2, the other 63 flows to queue 3: {f:?}");
    assert!(d.rss_delivered_per_queue[1..].iter().all(|&n| n == 0), "{:?}", d.rss_delivered_per_queue);
    assert_eq!(run.link.lost, 0);
}

#[test]
#[ignore = "needs QEMU 10 and the stock 6.12 kernel: run through guest-tests/run-tests.sh"]
fn ethtool_ntuple_on_debian_6_12() {
    check_ntuple("ethtool-ntuple-6.12", "debian-6.12");
}

/// ethtool's netlink path and the 7.x ethtool core.
#[test]
#[ignore = "needs root, QEMU 10 and the trixie kernel: run through guest-tests/run-tests.sh"]
fn ethtool_ntuple_on_debian_7_3() {
    check_ntuple("ethtool-ntuple-7.3", "debian-7.3");
}
