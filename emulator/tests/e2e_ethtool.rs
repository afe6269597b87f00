//! End-to-end test of `ethtool -x` / `ethtool -X` and `ethtool -n/-N rx-flow-hash` on the
//! guest's virtio_net interface with `arfs_virtio` loaded: the module forwards them
//! in-band (RSS_GET / RSS_SET / HASH_GET / HASH_SET, docs/control-protocol.md §2.8, §2.9,
//! §2.12) and the emulated device's RSS changes live. A
//! guest hook (`[guest] hook`, docs/scenarios.md) runs the ethtool commands before the
//! workload; the test reads their output from the guest JSON and checks the device's
//! per-queue counters of the traffic that followed. Ignored by a plain `cargo test`;
//! `guest-tests/run-tests.sh` runs it with `--ignored`.

mod common;

use common::{hook_steps as steps, root, run_scenario};

/// The device's default key: the Microsoft verification key of every shipped profile.
const DEFAULT_KEY: &str = "6d:5a:56:da:25:5b:0e:c2:41:67:25:3d:43:a3:8f:b0:d0:ca:2b:cb:ae:7b:30:b4:77:cb:2d:a3:80:30:f2:0c:6a:42:b7:3b:be:ac:01:fa";
/// The key the hook sets.
const NEW_KEY: &str = "01:02:03:04:05:06:07:08:09:0a:0b:0c:0d:0e:0f:10:11:12:13:14:15:16:17:18:19:1a:1b:1c:1d:1e:1f:20:21:22:23:24:25:26:27:28";

/// Each step prints `== <name>`, the command's output and `rc=<status>`. The table is
/// left at `equal 1` for the workload.
fn hook() -> String {
    format!(
        r#"#!/bin/sh
# tests/e2e_ethtool.rs: ethtool -x / -X against the emulated device's RSS
IF=$1
step() {{
    name=$1; shift
    echo "== $name"
    "$@" 2>&1
    echo "rc=$?"
}}
step x-before ethtool -x "$IF"
step X-equal-1 ethtool -X "$IF" equal 1
step x-equal-1 ethtool -x "$IF"
step X-bad-entry ethtool -X "$IF" weight 1 1 1 1 1 1 1 1
step X-bad-hfunc ethtool -X "$IF" hfunc xor
step x-after-bad ethtool -x "$IF"
step X-hkey ethtool -X "$IF" hkey {NEW_KEY}
step x-hkey ethtool -x "$IF"
step X-default ethtool -X "$IF" default hkey {DEFAULT_KEY}
step x-default ethtool -x "$IF"
step n-fh ethtool -n "$IF" rx-flow-hash tcp4
step N-fh-sd ethtool -N "$IF" rx-flow-hash tcp4 sd
step n-fh-sd ethtool -n "$IF" rx-flow-hash tcp4
step n-fh-udp6 ethtool -n "$IF" rx-flow-hash udp6
step N-fh-mac ethtool -N "$IF" rx-flow-hash tcp4 m
step N-fh-sctp ethtool -N "$IF" rx-flow-hash sctp4 sd
step N-fh-back ethtool -N "$IF" rx-flow-hash tcp4 sdfn
step n-fh-back ethtool -n "$IF" rx-flow-hash tcp4
step X-ctx-new ethtool -X "$IF" context new equal 2
step x-ctx ethtool -x "$IF" context 1
step X-ctx-equal-3 ethtool -X "$IF" context 1 equal 3
step x-ctx-equal-3 ethtool -x "$IF" context 1
step X-ctx-delete ethtool -X "$IF" context 1 delete
step x-ctx-deleted ethtool -x "$IF" context 1
step X-equal-1-again ethtool -X "$IF" equal 1
exit 0
"#
    )
}

/// 4 queues, 64 UDP flows, the module loaded; RFS steers some flows with filters, the
/// rest follow RSS.
fn scenario(kernel: &str) -> String {
    std::fs::read_to_string(root().join("configs/scenarios/steer.toml"))
        .unwrap()
        .replace("name = \"steer\"", "name = \"ethtool-rss\"")
        .replace("kernel = \"debian-6.12\"", &format!("kernel = \"{kernel}\""))
        .replace("duration_s = 10", "duration_s = 4")
        .replace("module = true", "module = true\nhook = \"ethtool-hook.sh\"")
}

/// The indirection table, key and hash function `ethtool -x` printed.
fn parse_x(text: &str) -> (Vec<u32>, String, bool) {
    let mut indir = Vec::new();
    let mut key = String::new();
    let mut in_key = false;
    for line in text.lines() {
        let t = line.trim();
        if in_key {
            key = t.to_string();
            in_key = false;
        } else if t == "RSS hash key:" {
            in_key = true;
        } else if let Some((slot, rest)) = t.split_once(':') {
            if slot.chars().all(|c| c.is_ascii_digit()) && !slot.is_empty() {
                indir.extend(rest.split_whitespace().map(|q| q.parse::<u32>().unwrap()));
            }
        }
    }
    let toeplitz = text.lines().any(|l| l.trim() == "toeplitz: on");
    (indir, key, toeplitz)
}

fn check_ethtool_rss(name: &str, kernel: &str) {
    let r = run_scenario(name, &scenario(kernel), &[("ethtool-hook.sh", hook())]);
    assert_eq!(r.kernel, kernel);
    let run = &r.runs[0];
    let g = &run.guest.system.other;
    let hook = &g["hook"];
    let output = hook["output"].as_str().unwrap_or_else(|| panic!("no hook output in the guest JSON: {hook}"));
    println!("--- hook output\n{output}");
    assert_eq!(hook["rc"], 0, "{hook}");
    let s = steps(output);
    let step = |name: &str| -> (&str, i32) {
        let (_, text, rc) = s.iter().find(|(n, _, _)| n == name).unwrap_or_else(|| panic!("no step {name}: {s:?}"));
        (text.as_str(), *rc)
    };

    // The device's own RSS: 128 entries round robin over the 4 queues, its default key.
    let (text, rc) = step("x-before");
    assert_eq!(rc, 0, "{text}");
    let (before, key, toeplitz) = parse_x(text);
    assert_eq!(before, (0..128).map(|i| i % 4).collect::<Vec<_>>(), "{text}");
    assert_eq!((key.as_str(), toeplitz), (DEFAULT_KEY, true), "{text}");

    let (text, rc) = step("X-equal-1");
    assert_eq!(rc, 0, "{text}");
    let (text, _) = step("x-equal-1");
    assert_eq!(parse_x(text).0, vec![0; 128], "read back after equal 1: {text}");

    // Bad input: the errno of a real driver, nothing changed.
    let (text, rc) = step("X-bad-entry");
    assert_ne!(rc, 0, "{text}");
    assert!(text.contains("Invalid argument"), "weight over 8 rings on a 4-ring device: {text}");
    let (text, rc) = step("X-bad-hfunc");
    assert_ne!(rc, 0, "{text}");
    assert!(text.contains("Operation not supported"), "hfunc xor: {text}");
    let (text, _) = step("x-after-bad");
    assert_eq!(parse_x(text).0, vec![0; 128], "the refused requests changed the table: {text}");
    assert_eq!(parse_x(text).1, DEFAULT_KEY, "{text}");

    let (text, rc) = step("X-hkey");
    assert_eq!(rc, 0, "{text}");
    let (text, _) = step("x-hkey");
    assert_eq!((parse_x(text).1.as_str(), parse_x(text).0), (NEW_KEY, vec![0; 128]), "{text}");

    let (text, rc) = step("X-default");
    assert_eq!(rc, 0, "{text}");
    let (text, _) = step("x-default");
    assert_eq!(parse_x(text), (before, DEFAULT_KEY.to_string(), true), "after default: {text}");

    // rx-flow-hash (HASH_GET / HASH_SET, §2.12): the device's default is every field
    // of tcp4; `sd` leaves the addresses, the other flow types keep theirs; a MAC field
    // or a flow type the device does not hash apart is refused by the driver.
    let all = ["IP SA", "IP DA", "L4 bytes 0 & 1 [TCP/UDP src port]", "L4 bytes 2 & 3 [TCP/UDP dst port]"];
    for (name, want) in [("n-fh", &all[..]), ("n-fh-sd", &all[..2]), ("n-fh-udp6", &all[..]), ("n-fh-back", &all[..])] {
        let (text, rc) = step(name);
        assert_eq!(rc, 0, "{name}: {text}");
        let got: Vec<&str> = text.lines().map(str::trim).filter(|l| all.contains(l)).collect();
        assert_eq!(got, want, "{name}: {text}");
    }
    for name in ["N-fh-sd", "N-fh-back"] {
        assert_eq!(step(name).1, 0, "{name}: {}", step(name).0);
    }
    // ethtool (6.14) prints the driver's error for `-N rx-flow-hash` but exits 0.
    for (name, err) in [("N-fh-mac", "Invalid argument"), ("N-fh-sctp", "Operation not supported")] {
        let (text, _) = step(name);
        assert!(text.contains("Cannot change RX network flow hashing options") && text.contains(err), "{name}: {text}");
    }
    // input-xfrm (sym-xor) is the kernel's rss_api.py test_rxfh_fields_set_xfrm, over
    // netlink (guest-tests/selftests/): ethtool 6.14 refuses `-X ... xfrm ...` here
    // with "bad command line argument(s)" before it reaches the driver.

    // RSS contexts (CTX_SET / CTX_DEL, §2.13): created with its own table, changed,
    // deleted; the default table stays `equal 1` meanwhile.
    let (text, rc) = step("X-ctx-new");
    assert!(rc == 0 && text.contains("New RSS context is 1"), "X-ctx-new: {text}");
    let (text, rc) = step("x-ctx");
    let (indir, _, _) = parse_x(text);
    assert!(rc == 0 && indir.len() == 128 && indir.iter().all(|&q| q < 2) && indir.contains(&1), "x-ctx: {text}");
    assert_eq!(step("X-ctx-equal-3").1, 0, "{}", step("X-ctx-equal-3").0);
    let (text, _) = step("x-ctx-equal-3");
    let (indir, _, _) = parse_x(text);
    assert!(indir.iter().all(|&q| q < 3) && indir.contains(&2), "x-ctx-equal-3: {text}");
    assert_eq!(step("X-ctx-delete").1, 0, "{}", step("X-ctx-delete").0);
    assert_ne!(step("x-ctx-deleted").1, 0, "context 1 still there: {}", step("x-ctx-deleted").0);

    assert_eq!(step("X-equal-1-again").1, 0);
    // The ethtool core refused the bad entry itself; the device refused the hash
    // function (its one refused request, in `ethtool -S` after the run).
    assert_eq!(g["ethtool_s_after"]["dev_ctrl_bad"], 1, "{}", g["ethtool_s_after"]);

    // The traffic after the hook: with `equal 1` every frame RSS delivered went to queue
    // 0; the filters RFS installed still steered flows to the other queues.
    let d = &run.device;
    println!("rss_delivered_per_queue {:?}", d.rss_delivered_per_queue);
    println!("filter_delivered_per_queue {:?}", d.filter_delivered_per_queue);
    assert!(d.rss_delivered_per_queue[0] > 0, "{:?}", d.rss_delivered_per_queue);
    assert!(
        d.rss_delivered_per_queue[1..].iter().all(|&n| n == 0),
        "RSS delivered to queues other than 0 after `ethtool -X equal 1`: {:?}",
        d.rss_delivered_per_queue
    );
    assert_eq!(run.link.lost, 0);
}

#[test]
#[ignore = "needs QEMU 10 and guest kernels: run through guest-tests/run-tests.sh"]
fn ethtool_rss_on_debian_6_12() {
    check_ethtool_rss("ethtool-rss-6.12", "debian-6.12");
}

/// The `ethtool_rxfh_param` ops (6.8+) and ethtool's netlink path on the newest kernel.
#[test]
#[ignore = "needs root, QEMU 10 and the trixie kernel: run through guest-tests/run-tests.sh"]
fn ethtool_rss_on_debian_7_3() {
    check_ethtool_rss("ethtool-rss-7.3", "debian-7.3");
}
