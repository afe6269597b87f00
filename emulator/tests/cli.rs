//! The `arfsnic` binary: classify, profile check, help.

use std::path::PathBuf;
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn arfsnic(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_arfsnic")).args(args).current_dir(root()).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn classify_prints_hash_slot_queue() {
    let o = arfsnic(&[
        "classify",
        "--profile",
        "configs/mlx5-cx6.toml",
        "--flow",
        "tcp 66.9.149.187:2794 161.142.100.80:1766",
    ]);
    assert!(o.status.success(), "{o:?}");
    // 0x51ccc178 & 127 = 120; default table spreads 128 slots over 4 queues: 120 % 4 = 0.
    assert_eq!(stdout(&o).lines().next(), Some("hash=0x51ccc178 slot=120 queue=0"));

    let o = arfsnic(&[
        "classify",
        "--profile",
        "configs/mlx5-cx6.toml",
        "--queues",
        "3",
        "--indir-size",
        "64",
        "--flow",
        "udp [3ffe:2501:200:1fff::7]:2794 [3ffe:2501:200:3::1]:1766",
    ]);
    // UDPv6 hash equals the TCPv6 vector (same 4-tuple): 0x40207d3d & 63 = 61, 61 % 3 = 1.
    assert_eq!(stdout(&o).lines().next(), Some("hash=0x40207d3d slot=61 queue=1"));
}

#[test]
fn classify_key_override_and_json() {
    let key = "6d5a56da255b0ec24167253d43a38fb0d0ca2bcbae7b30b477cb2da38030f20c6a42b73bbeac01fa";
    let o = arfsnic(&[
        "classify",
        "--profile",
        "configs/e810.toml",
        "--key",
        key,
        "--json",
        "--flow",
        "tcp 199.92.111.2:14230 65.69.140.83:4739",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["hash"], "0xc626b0ea");
    assert_eq!(v["slot"], 0xc626b0eau32 & 127);
    let o =
        arfsnic(&["classify", "--profile", "configs/e810.toml", "--key", "00ff", "--flow", "tcp 1.1.1.1:1 2.2.2.2:2"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--key"), "{o:?}");
}

#[test]
fn classify_with_rules_shows_filter() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.toml");
    std::fs::write(
        &rules,
        "[[rule]]\nid = 77\nflow = \"tcp 66.9.149.187:2794 161.142.100.80:1766\"\nqueue = 3\n\
         [[rule]]\nid = 78\nflow = \"udp 66.9.149.187:2794 161.142.100.80:1766\"\ndrop = true\n",
    )
    .unwrap();
    let r = rules.to_str().unwrap();
    let o = arfsnic(&[
        "classify",
        "--profile",
        "configs/mlx5-cx6.toml",
        "--rules",
        r,
        "--flow",
        "tcp 66.9.149.187:2794 161.142.100.80:1766",
    ]);
    assert_eq!(stdout(&o).lines().next(), Some("hash=0x51ccc178 slot=120 queue=3 filter=77"));
    let o = arfsnic(&[
        "classify",
        "--profile",
        "configs/mlx5-cx6.toml",
        "--rules",
        r,
        "--flow",
        "udp 66.9.149.187:2794 161.142.100.80:1766",
    ]);
    assert_eq!(stdout(&o).lines().next(), Some("hash=0x51ccc178 slot=120 queue=drop filter=78"));
    let o = arfsnic(&[
        "classify",
        "--profile",
        "configs/mlx5-cx6.toml",
        "--rules",
        r,
        "--flow",
        "tcp 66.9.149.187:2795 161.142.100.80:1766",
    ]);
    assert!(!stdout(&o).contains("filter="));

    std::fs::write(&rules, "[[rule]]\nid = 1\nflow = \"tcp 1.1.1.1:1 2.2.2.2:2\"\nqueue = 9\n").unwrap();
    let o =
        arfsnic(&["classify", "--profile", "configs/mlx5-cx6.toml", "--rules", r, "--flow", "tcp 1.1.1.1:1 2.2.2.2:2"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("rule[0].queue"), "{o:?}");
}

#[test]
fn every_shipped_profile_checks() {
    for p in ["mlx5-cx6", "e810", "sfc-ef10", "bnxt", "ideal"] {
        let o = arfsnic(&["profile", "check", &format!("configs/{p}.toml")]);
        assert!(o.status.success(), "{p}: {o:?}");
        assert!(stdout(&o).contains(&format!("profile \"{p}\"")));
    }
}

#[test]
fn broken_profile_names_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("broken.toml");
    let base = std::fs::read_to_string(root().join("configs/mlx5-cx6.toml")).unwrap();
    std::fs::write(&f, base.replace("slots = 4", "slots = \"four\"")).unwrap();
    let o = arfsnic(&["profile", "check", f.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("broken.toml") && err.contains("engine.slots"), "{err}");
    std::fs::write(&f, base.replace("capacity = 4096", "capacity = 4096\nlayuot = \"x\"")).unwrap();
    let err = String::from_utf8_lossy(&arfsnic(&["profile", "check", f.to_str().unwrap()]).stderr).into_owned();
    assert!(err.contains("filter.layuot"), "{err}");
}

#[test]
fn help_for_every_command() {
    for args in [
        &["--help"][..],
        &["classify", "--help"],
        &["profile", "--help"],
        &["profile", "check", "--help"],
        &["run", "--help"],
        &["serve", "--help"],
    ] {
        let o = arfsnic(args);
        assert!(o.status.success() && stdout(&o).contains("Usage"), "{args:?}");
    }
}

#[test]
fn broken_scenario_names_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("bad-scenario.toml");
    let base = std::fs::read_to_string(root().join("configs/scenarios/smoke.toml")).unwrap();
    for (from, to, field) in [
        ("cores = 2", "cores = 3", "vm.vcpus"),
        ("pattern = \"none\"", "pattern = \"hop-everywhere\"", "guest.pattern"),
        ("flows = 64", "flowz = 64", "traffic.flowz"),
        ("queues = 4", "queues = 0", "nic.queues"),
    ] {
        std::fs::write(&f, base.replace(from, to)).unwrap();
        let o = arfsnic(&["run", "--quiet", "--scenario", f.to_str().unwrap()]);
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("bad-scenario.toml") && err.contains(field), "{to}: {err}");
    }
}

/// Issue 13's bad inputs: an unknown kernel name, a table size that is not a power of
/// two, a run label that would name a log file elsewhere, an unknown base or sysctl
/// sweep: each a one-line error naming the field and what to write instead.
#[test]
fn bad_kernel_names_and_table_sizes_name_the_field_and_the_choices() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("bad-scenario.toml");
    let base = std::fs::read_to_string(root().join("configs/scenarios/rps-flow-cnt-sweep.toml")).unwrap();
    for (from, to, want) in [
        (
            "kernel = \"debian-6.12\"\nprofile",
            "kernel = \"debian-6.18\"\nprofile",
            "`kernel`: \"debian-6.18\" is not a kernel name; valid: patched-7.3, vanilla-7.3, patched-6.12",
        ),
        (
            "rps_flow_cnt = 1024",
            "rps_flow_cnt = 1000",
            "`runs[2].rps_flow_cnt`: 1000 is not a power of two up to 16777216 (the kernel would use 1024); write 1024",
        ),
        (
            "rps_sock_flow_entries = 32768",
            "rps_sock_flow_entries = 30000",
            "`guest.rps_sock_flow_entries`: 30000 is not a power of two",
        ),
        (
            "kernel = \"debian-7.3\"\nrps_flow_cnt = 4096",
            "kernel = \"patched-7.4\"\nrps_flow_cnt = 4096",
            "`runs[5].kernel`: \"patched-7.4\" is not a kernel name",
        ),
        ("label = \"old-256\"", "label = \"old/256\"", "`runs[0].label`: must be a non-empty word without '/'"),
    ] {
        assert!(base.contains(from), "{from}");
        std::fs::write(&f, base.replacen(from, to, 1)).unwrap();
        let o = arfsnic(&["run", "--quiet", "--scenario", f.to_str().unwrap()]);
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("bad-scenario.toml") && err.contains(want), "{to}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
    let o = arfsnic(&["run", "--quiet", "--scenario", "configs/scenarios/steer.toml", "--kernel", "linux-9.9"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("kernel \"linux-9.9\": no such kernel name or file; valid: patched-7.3"),
        "{err}"
    );
    let o = arfsnic(&["demo", "--patch", "x.patch", "--base", "7.4"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("7.4") && err.contains("7.3") && err.contains("6.12"), "{err}");
    let o = arfsnic(&["demo", "--sysctl", "net.core.arfs_llc_affinity"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("expected KEY=V0,V1"), "{err}");
}

#[test]
fn bad_guest_and_funccount_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("bad-guest.toml");
    let base = std::fs::read_to_string(root().join("configs/scenarios/steer.toml")).unwrap();
    let debian = "accel = \"auto\"\nguest = \"debian\"";
    // (replacements, the error's text)
    for (edits, want) in [
        (
            vec![("accel = \"auto\"", "accel = \"auto\"\nguest = \"ubuntu\"")],
            "`vm.guest`: \"ubuntu\" is not initramfs or debian",
        ),
        (
            vec![("module = true", "module = true\nfunccount = \"arfs_rx_flow_steer\"")],
            "`guest.funccount`: needs vm.guest = \"debian\"",
        ),
        (
            vec![("accel = \"auto\"", debian), ("module = true", "module = true\nfunccount = \"a;b\"")],
            "is not a kernel function name",
        ),
        (vec![("accel = \"auto\"", "accel = \"auto\"\nremote = true")], "`vm.remote`: needs vm.guest = \"debian\""),
    ] {
        let text = edits.iter().fold(base.clone(), |t, (from, to)| t.replacen(from, to, 1));
        std::fs::write(&f, text).unwrap();
        let o = arfsnic(&["run", "--quiet", "--scenario", f.to_str().unwrap()]);
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("bad-guest.toml") && err.contains(want), "{edits:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
    let o =
        arfsnic(&["run", "--quiet", "--scenario", "configs/scenarios/steer.toml", "--funccount", "arfs_rx_flow_steer"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("guest.funccount") && err.contains("debian"), "{err}");
}

#[test]
fn report_email_prints_the_committed_demo_in_80_columns() {
    let f = "docs/results/demo-7.3-debian/llc-within.json";
    let o = arfsnic(&["report", "--email", f]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.starts_with("arfsnic ") && out.contains("kernel patched-7.3"), "{out}");
    assert!(out.contains("\nsysctl=0     |") && out.contains("\nsysctl=1     |"), "{out}");
    assert!(out.lines().all(|l| l.len() <= 80 && l.is_ascii()), "{out}");
    let o = arfsnic(&["report", "--email", "--markdown", f]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("cannot be used with"));
}

#[test]
fn doctor_names_what_to_install_on_both_families() {
    // With no PATH the host tools are missing whatever this machine has.
    let o = Command::new(env!("CARGO_BIN_EXE_arfsnic"))
        .arg("doctor")
        .env("PATH", "/nonexistent")
        .current_dir(root())
        .output()
        .unwrap();
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("FAIL busybox") && out.contains("apt install busybox-static"), "{out}");
    let tools = out.lines().skip_while(|l| !l.starts_with("FAIL tools")).take(3).collect::<Vec<_>>().join("\n");
    assert!(tools.contains("missing: cpio (the initramfs)"), "{out}");
    assert!(tools.contains("Debian/Ubuntu: apt install cpio xz-utils build-essential"), "{out}");
    assert!(tools.contains("Fedora: dnf install cpio xz make gcc"), "{out}");
    for name in ["qemu", "kvm", "memfd", "sockets", "kernels", "disk"] {
        assert!(out.lines().any(|l| l.get(5..).is_some_and(|r| r.starts_with(name))), "no {name} line: {out}");
    }
    assert!(String::from_utf8_lossy(&o.stderr).contains("check(s) failed"));
}

/// The kernel's KTAP parser (`tools/testing/kunit/kunit.py parse`) from a built tree:
/// `$ARFSNIC_KDIR`, else the first tree under .cache/kernels.
fn kunit_py() -> Option<std::path::PathBuf> {
    let rel = "tools/testing/kunit/kunit.py";
    if let Some(k) = std::env::var_os("ARFSNIC_KDIR") {
        return Some(std::path::PathBuf::from(k).join(rel)).filter(|p| p.is_file());
    }
    let mut trees: Vec<_> = std::fs::read_dir(root().join(".cache/kernels"))
        .ok()?
        .flatten()
        .flat_map(|e| std::fs::read_dir(e.path()).into_iter().flatten().flatten())
        .map(|e| e.path().join(rel))
        .filter(|p| p.is_file())
        .collect();
    trees.sort();
    trees.into_iter().next()
}

#[test]
fn compare_writes_ktap_and_junit_that_parsers_read() {
    let dir = tempfile::tempdir().unwrap();
    let base = "docs/results/demo-7.3-debian/llc-within.json";
    // The report under test: the same runs with sysctl=1 steering again (a regression).
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(root().join(base)).unwrap()).unwrap();
    v["runs"][1]["guest"]["steer_calls_per_s"] = serde_json::json!(320.0);
    let cur = dir.path().join("cur.json");
    std::fs::write(&cur, v.to_string()).unwrap();
    let (k, j) = (dir.path().join("r.ktap"), dir.path().join("r.xml"));
    let o = arfsnic(&[
        "compare",
        "--baseline",
        base,
        "--report",
        cur.to_str().unwrap(),
        "--ktap",
        k.to_str().unwrap(),
        "--junit",
        j.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stderr));
    let ktap = std::fs::read_to_string(&k).unwrap();
    assert!(ktap.starts_with("KTAP version 1\n1..30\n"), "{ktap}");
    assert!(ktap.contains("not ok 17 llc-within.sysctl=1.guest.steer_calls_per_s"), "{ktap}");
    assert!(ktap.contains("# run sysctl=1: guest.steer_calls_per_s 0 -> 320"), "{ktap}");
    assert_eq!(ktap.matches("\nnot ok ").count(), 1, "{ktap}");
    let xml = std::fs::read_to_string(&j).unwrap();
    assert!(xml.contains("tests=\"30\" failures=\"1\" errors=\"0\" skipped=\"0\""), "{xml}");
    assert!(xml.contains("<testcase classname=\"llc-within.sysctl=1\" name=\"guest.steer_calls_per_s\">"));
    // Real parsers: Python's XML, and the kernel's own KTAP parser when a tree is built.
    let py = Command::new("python3")
        .args(["-c", "import sys, xml.etree.ElementTree as E; s = E.parse(sys.argv[1]).getroot()[0]; print(s.get('tests'), s.get('failures'), len(s))"])
        .arg(&j)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&py.stdout).trim(), "30 1 30", "{}", String::from_utf8_lossy(&py.stderr));
    match kunit_py() {
        None => println!("SKIPPED: kunit.py parse (no built kernel tree under .cache/kernels; set ARFSNIC_KDIR)"),
        Some(kunit) => {
            let p = Command::new("python3").arg(&kunit).arg("parse").arg(&k).output().unwrap();
            let out = String::from_utf8_lossy(&p.stdout);
            println!("{}", out.lines().last().unwrap_or_default());
            assert!(out.contains("Ran 30 tests: passed: 29, failed: 1"), "{out}");
            assert!(out.contains("[FAILED] llc-within.sysctl=1.guest.steer_calls_per_s"), "{out}");
        }
    }
}

/// GET http://ADDR/metrics.
fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    write!(c, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut r = String::new();
    c.read_to_string(&mut r).unwrap();
    r
}

#[test]
fn serve_metrics_are_scraped_in_prometheus_text() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_arfsnic"))
        .args(["serve", "--profile", "configs/mlx5-cx6.toml", "--queues", "4", "--metrics", "127.0.0.1:0", "--socket"])
        .arg(&sock)
        .current_dir(root())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| l.split("metrics on http://").nth(1).map(|a| a.trim_end_matches("/metrics").to_string()))
        .expect("serve printed no metrics address");
    let r = scrape(&addr);
    // SIGINT stops serve as Ctrl-C does.
    let _ = Command::new("kill").args(["-INT", &child.id().to_string()]).status();
    let _ = child.wait();
    assert!(r.contains("200 OK") && r.contains("openmetrics-text"), "{r}");
    for q in 0..4 {
        assert!(r.contains(&format!("arfsnic_rx_packets_total{{queue=\"{q}\"}} 0")), "{r}");
    }
    assert!(r.contains("arfsnic_filter_rules 0") && r.trim_end().ends_with("# EOF"), "{r}");
}
