//! End-to-end tests: real QEMU 10, real Debian guest kernels, the real backend.
//! They need root and what `guest-tests/provision.sh` installs, so they are ignored
//! by a plain `cargo test`; `guest-tests/run-tests.sh` runs them with `--ignored`.

mod common;

use common::{root, run_scenario};
use serde_json::Value;
use std::process::Command;

/// Run a test script of the repository with this build's `arfsnic`; it must succeed and
/// print `pass`.
fn run_script(script: &str, args: &[&str], pass: &str) {
    let o = Command::new("bash")
        .arg(root().join(script))
        .args(args)
        .env("ARFSNIC", env!("CARGO_BIN_EXE_arfsnic"))
        .current_dir(root())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    println!("{out}");
    assert!(o.status.success(), "{script} failed ({}):\n{out}\n{err}", o.status);
    assert!(out.contains(pass), "{out}");
}

fn smoke_toml() -> String {
    std::fs::read_to_string(root().join("configs/scenarios/smoke.toml")).unwrap()
}

/// Every response arrives; the guest's per-queue RX counts equal the device's; every
/// flow landed on the queue `arfsnic classify` gives for it.
#[test]
#[ignore = "needs QEMU 10 and guest kernels: run through guest-tests/run-tests.sh"]
fn smoke_rss_matches_classify_and_guest_counts() {
    let r = run_scenario("smoke", &smoke_toml(), &[]);
    let run = &r.runs[0];
    let link = &run.link;
    assert!(link.requests > 1000, "{link:?}");
    assert_eq!(link.lost, 0, "every response must arrive: {link:?}");
    assert_eq!(link.requests, link.responses);
    let dev = &run.device.rx_packets_per_queue;
    let guest = &run.guest_rx_packets_per_queue;
    assert_eq!(dev.len(), 4);
    assert_eq!(guest, dev, "guest and device per-queue RX counts");
    assert!(dev.iter().all(|&n| n > 0), "RSS spreads 64 flows over all 4 queues: {dev:?}");
    assert_eq!(run.device.flows_misdelivered, 0);
    assert_eq!(run.device.flows_compared_with_guest, 64, "every flow compared with the guest's view");
    // Each flow's queue is what `classify` says.
    for f in &run.link.per_flow {
        let flow = format!("udp 10.99.0.1:{} 10.99.0.2:{}", f.partner_port, f.guest_port);
        let o = Command::new(env!("CARGO_BIN_EXE_arfsnic"))
            .args(["classify", "--profile", "configs/mlx5-cx6.toml", "--queues", "4", "--json", "--flow", &flow])
            .current_dir(root())
            .output()
            .unwrap();
        let c: Value = serde_json::from_slice(&o.stdout).unwrap();
        let q = c["queue"].as_u64().unwrap() as usize;
        let counts = &f.queue_counts;
        assert_eq!(counts.iter().sum::<u64>(), counts[q], "flow {flow}: {counts:?}, classify says queue {q}");
    }
}

/// QEMU reads GET_QUEUE_NUM as queue pairs: an odd count must work end to end.
#[test]
#[ignore = "needs QEMU 10 and guest kernels: run through guest-tests/run-tests.sh"]
fn three_queues_boot_and_pass_traffic() {
    let t = smoke_toml().replace("queues = 4", "queues = 3").replace("duration_s = 10", "duration_s = 5");
    let r = run_scenario("queues3", &t, &[]);
    let run = &r.runs[0];
    assert_eq!(run.link.lost, 0);
    let dev = &run.device.rx_packets_per_queue;
    assert_eq!(dev.len(), 3);
    assert!(dev.iter().all(|&n| n > 0), "{dev:?}");
    assert_eq!(&run.guest_rx_packets_per_queue, dev);
}

/// One backend process serves two QEMU runs back to back.
#[test]
#[ignore = "needs QEMU 10 and guest kernels: run through guest-tests/run-tests.sh"]
fn one_backend_serves_two_qemu_runs() {
    let t = smoke_toml().replace("duration_s = 10", "duration_s = 4")
        + "\n[[runs]]\nlabel = \"first\"\n\n[[runs]]\nlabel = \"second\"\n";
    let r = run_scenario("two-runs", &t, &[]);
    assert_eq!(r.runs.len(), 2);
    // One vhost-user connection per QEMU: one per run, plus one per boot that failed
    // and was retried (boot_attempts).
    let boots: u64 = r.runs.iter().map(|run| u64::from(run.boot_attempts)).sum();
    assert!(boots >= 2);
    assert_eq!(r.backend.connections, boots);
    for run in &r.runs {
        assert!(run.link.responses > 0, "{}", run.label);
        assert_eq!(run.link.lost, 0, "{}", run.label);
    }
}

/// A guest that never reports `ready` is booted once more; when that boot fails too, the
/// run fails naming both, and the serial logs of both boots stay.
#[test]
#[ignore = "needs QEMU 10 and guest kernels: run through guest-tests/run-tests.sh"]
fn a_failed_boot_is_booted_once_more() {
    let logdir = root().join(".cache/e2e/boot-retry");
    let _ = std::fs::remove_dir_all(&logdir);
    std::fs::create_dir_all(&logdir).unwrap();
    let scen = logdir.join("scenario-boot-retry.toml");
    // No guest boots to `ready` in 1 s of TCG.
    std::fs::write(&scen, smoke_toml() + "\n[timeouts]\nboot_s = 1\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_arfsnic"))
        .args(["run", "--quiet", "--accel", "tcg", "--scenario"])
        .arg(&scen)
        .arg("--logdir")
        .arg(&logdir)
        .current_dir(root())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("boot 1 failed (the guest workload was not ready within 1 s"), "{err}");
    assert!(
        err.contains("run \"default\" (boot 2; boot 1: the guest workload was not ready within 1 s"),
        "the final error names both boots: {err}"
    );
    // Logs are numbered by attempt (boot failures and health re-runs alike).
    for log in ["00-default.serial.log", "00-default.try2.serial.log"] {
        assert!(logdir.join(log).is_file(), "{log} kept");
    }
}

/// Tap mode (item 8d): UDP from a network namespace reaches the guest echo server through
/// `arfsnic serve --tap` and back. The script creates and removes the namespace itself.
#[test]
#[ignore = "needs root, QEMU 10 and guest kernels: run through guest-tests/run-tests.sh"]
fn tap_mode_reaches_guest_echo_server() {
    run_script("guest-tests/e2e/tap.sh", &[], "[e2e-tap] PASS");
}

/// SIGTERM in the middle of a scenario's second run: the first run's numbers are kept in
/// a report marked incomplete, the QEMU of the second run is gone, the socket directory
/// removed, and the exit status is the shell's for SIGTERM.
#[test]
#[ignore = "needs QEMU 10 and guest kernels: run through guest-tests/run-tests.sh"]
fn sigterm_during_a_run_writes_a_partial_report() {
    let logdir = root().join(".cache/e2e/sigterm");
    let _ = std::fs::remove_dir_all(&logdir);
    std::fs::create_dir_all(&logdir).unwrap();
    let scen = logdir.join("scenario-sigterm.toml");
    let t = smoke_toml().replace("duration_s = 10", "duration_s = 3")
        + "\n[[runs]]\nlabel = \"first\"\n\n[[runs]]\nlabel = \"second\"\n";
    std::fs::write(&scen, t).unwrap();
    let out = logdir.join("report.json");
    let mut child = Command::new(env!("CARGO_BIN_EXE_arfsnic"))
        .args(["run", "--quiet", "--accel", "tcg", "--scenario"])
        .arg(&scen)
        .arg("--json")
        .arg(&out)
        .arg("--logdir")
        .arg(&logdir)
        .current_dir(root())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The second run's QEMU writes its command line before it starts; signal once its
    // console shows the guest booting.
    let serial = logdir.join("01-second.serial.log");
    let t0 = std::time::Instant::now();
    while std::fs::metadata(&serial).map_or(true, |m| m.len() < 200) {
        assert!(t0.elapsed().as_secs() < 300, "the second run never started booting");
        assert!(child.try_wait().unwrap().is_none(), "arfsnic run ended before the second run");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let cmdline = std::fs::read_to_string(logdir.join("01-second.qemu-cmdline")).unwrap();
    let sock = cmdline.split("path=").nth(1).and_then(|s| s.split([',', ' ', '\'']).next()).unwrap().to_string();
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let st = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(st.code(), Some(143), "exit status for SIGTERM: {err}");
    assert!(err.contains("interrupted by SIGTERM"), "{err}");
    let r = arfsnic::report::Report::load(&out, "report").unwrap();
    assert!(!r.complete);
    assert_eq!(r.interrupted.as_deref(), Some("SIGTERM"));
    assert_eq!(r.runs.len(), 1, "only the finished run");
    assert_eq!(r.runs[0].label, "first");
    let sockdir = std::path::Path::new(&sock).parent().unwrap().to_path_buf();
    assert!(!sockdir.exists(), "socket directory {} removed", sockdir.display());
    let qemu_left = Command::new("pgrep").args(["-f", &sock]).output().unwrap();
    assert!(qemu_left.stdout.is_empty(), "a QEMU on {sock} survived: {}", String::from_utf8_lossy(&qemu_left.stdout));
}

/// The soak at CI size (issue 16): one `arfsnic serve` through 5 cycles each of QEMU
/// kill -9, guest reboot with module reload, ethtool -L and frontends dying mid-message,
/// plus the forged-control-frame check; fds/threads flat, VmRSS growth < 5 MB.
#[test]
#[ignore = "needs root, QEMU 10 and guest kernels: run through guest-tests/run-tests.sh"]
fn soak_on_one_backend() {
    let out = root().join(".cache/e2e/soak");
    run_script("guest-tests/soak.sh", &["--cycles", "5", "--out", out.to_str().unwrap()], "[soak] PASS");
}

/// GET http://ADDR/metrics, or None while nothing answers.
fn scrape(addr: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).ok()?;
    write!(c, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut r = String::new();
    c.read_to_string(&mut r).ok()?;
    Some(r)
}

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// `run --metrics`: scraped while the steer scenario runs, the counters move and stay
/// within what the report says at the end.
#[test]
#[ignore = "needs QEMU 10 and guest kernels: run through guest-tests/run-tests.sh"]
fn run_metrics_are_scraped_live() {
    use std::io::BufRead;
    let dir = root().join(".cache/e2e/metrics");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let scen = dir.join("metrics.toml");
    let toml = std::fs::read_to_string(root().join("configs/scenarios/steer.toml")).unwrap();
    std::fs::write(&scen, toml.replace("name = \"steer\"", "name = \"metrics\"")).unwrap();
    let out = dir.join("report.json");
    let mut child = Command::new(env!("CARGO_BIN_EXE_arfsnic"))
        .args(["run", "--quiet", "--metrics", "127.0.0.1:0", "--scenario"])
        .arg(&scen)
        .arg("--json")
        .arg(&out)
        .current_dir(root())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| l.split("metrics on http://").nth(1).map(|a| a.trim_end_matches("/metrics").to_string()))
        .expect("run printed no metrics address");
    // Drain stderr so the child never blocks on it.
    std::thread::spawn(move || lines.for_each(drop));
    let (mut scrapes, mut steer, mut rx) = (0, 0.0f64, 0.0f64);
    while child.try_wait().unwrap().is_none() {
        if let Some(t) = scrape(&addr) {
            scrapes += 1;
            steer = steer.max(metric(&t, "arfsnic_guest_steer_calls_total").unwrap_or(0.0));
            rx = rx.max(metric(&t, "arfsnic_rx_packets_total{queue=\"0\"}").unwrap_or(0.0));
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    assert!(child.wait().unwrap().success());
    let r = arfsnic::report::Report::load(&out, "report").unwrap();
    let d = r.runs[0].driver().expect("the module steered");
    println!(
        "{scrapes} scrapes: steer calls up to {steer}, queue 0 rx up to {rx}; report: {} steer calls",
        d.steer_calls
    );
    assert!(scrapes >= 10 && steer > 0.0 && rx > 0.0, "{scrapes} scrapes, steer {steer}, rx {rx}");
    assert!(
        steer <= d.steer_calls as f64,
        "a scrape saw more steer calls ({steer}) than the report ({})",
        d.steer_calls
    );
}
