//! `arfsnic serve` as a process over many frontends: every new driver instance gets a
//! fresh device, frontends that die mid-message leave it serving, fds and threads stay
//! constant, and SIGTERM/SIGINT stop it cleanly (issue 16, items 4 and 6). The frontend is
//! the scripted one of `arfsnic::vhost::testing` replaying QEMU's message order; the guest
//! soak with real QEMU is guest-tests/soak.sh.

use arfsnic::vhost::testing::{Frontend, GuestMem};
use serde_json::Value;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const PAIRS: u16 = 2;
const QSIZE: u16 = 256;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

struct Serve {
    child: Child,
    sock: PathBuf,
    stats: PathBuf,
    _dir: tempfile::TempDir,
}

impl Serve {
    fn start() -> Serve {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("vhost.sock");
        let stats = dir.path().join("stats.json");
        let child = Command::new(env!("CARGO_BIN_EXE_arfsnic"))
            .args(["serve", "--profile", "configs/mlx5-cx6.toml", "--queues", "2", "--socket"])
            .arg(&sock)
            .arg("--stats")
            .arg(&stats)
            .current_dir(root())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Serve { child, sock, stats, _dir: dir }
    }

    fn stats(&self) -> Value {
        let text = std::fs::read_to_string(&self.stats).unwrap_or_default();
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    /// Wait (up to 5 s) until the stats file satisfies `pred`; returns it.
    fn wait_stats(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let t = Instant::now();
        loop {
            let s = self.stats();
            if pred(&s) {
                return s;
            }
            assert!(t.elapsed() < Duration::from_secs(5), "timed out waiting for {what}; stats: {s}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill").arg(format!("-{sig}")).arg(self.child.id().to_string()).status().unwrap();
        assert!(ok.success(), "kill -{sig}");
    }

    fn wait_exit(&mut self) -> ExitStatus {
        let t = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(t.elapsed() < Duration::from_secs(10), "serve did not exit within 10 s of the signal");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn n(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("stats field {k} missing: {v}"))
}

/// A frontend that sends `bytes` and disconnects: a QEMU dying in the middle of a message.
fn die_mid_message(sock: &Path, bytes: &[u8]) {
    let mut s = UnixStream::connect(sock).unwrap();
    s.write_all(bytes).unwrap();
}

#[test]
fn serve_survives_frontends_and_stops_cleanly_on_sigterm() {
    let mut s = Serve::start();
    let g = GuestMem::new(4 << 20).unwrap();
    let mut resources = Vec::new();
    for cycle in 1..=6u64 {
        let mut fe = Frontend::connect(&s.sock, Duration::from_secs(5)).unwrap();
        let v = fe.qemu_startup(&g, PAIRS, QSIZE, true).unwrap();
        // A guest reboot on the same connection: GET_VRING_BASE everywhere, then
        // DRIVER_OK again; a second device reset.
        fe.qemu_shutdown(PAIRS).unwrap();
        let _v2 = fe.qemu_startup(&g, PAIRS, QSIZE, false).unwrap();
        let st =
            s.wait_stats("link up after the reboot", |x| x["link_up"] == true && n(x, "device_resets") == 2 * cycle);
        assert_eq!(st["enabled_pairs"], serde_json::json!([true, true]));
        assert_eq!(st["rss_default"], true);
        assert_eq!(n(&st["filter"], "rules_now"), 0);
        drop((fe, v));
        // Header cut short; a header promising 40 bytes followed by 3.
        die_mid_message(&s.sock, &[1, 0, 0, 0, 1]);
        die_mid_message(&s.sock, &[5, 0, 0, 0, 1, 0, 0, 0, 40, 0, 0, 0, 1, 2, 3]);
        let st = s.wait_stats("three connections more", |x| n(x, "connections") == 3 * cycle && x["link_up"] == false);
        resources.push((n(&st, "fds"), n(&st, "threads"), n(&st, "vm_rss_kb")));
    }
    // Constant after the first cycles (the first may create lazily allocated state).
    let (fds, threads, _) = resources[1];
    for (i, r) in resources.iter().enumerate().skip(1) {
        assert_eq!((r.0, r.1), (fds, threads), "cycle {}: fds/threads changed: {resources:?}", i + 1);
    }
    let rss_growth = resources[5].2.saturating_sub(resources[1].2);
    assert!(rss_growth < 5 * 1024, "VmRSS grew {rss_growth} kB over cycles 2..6: {resources:?}");

    s.signal("TERM");
    let st = s.wait_exit();
    assert!(st.success(), "serve ends with status 0 on SIGTERM: {st}");
    assert!(!s.sock.exists(), "socket removed");
    let stats = s.stats();
    assert_eq!(stats["complete"], false);
    assert_eq!(stats["stopped_by"], "SIGTERM");
    assert_eq!(n(&stats, "connections"), 18);
}

#[test]
fn a_second_signal_exits_at_once() {
    let mut s = Serve::start();
    let g = GuestMem::new(4 << 20).unwrap();
    let mut fe = Frontend::connect(&s.sock, Duration::from_secs(5)).unwrap();
    let _v = fe.qemu_startup(&g, PAIRS, QSIZE, true).unwrap();
    // Both before serve's next look at the stop flag (every 200 ms while a frontend is
    // connected): the second one ends the process with the shell's status for SIGINT.
    let status =
        Command::new("sh").arg("-c").arg(format!("kill -TERM {0}; kill -INT {0}", s.child.id())).status().unwrap();
    assert!(status.success());
    let st = s.wait_exit();
    assert_eq!(st.code(), Some(130), "{st}");
}
