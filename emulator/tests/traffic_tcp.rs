//! The link partner's TCP (smoltcp) against a real Linux TCP stack, no VM: a tap device in
//! a network namespace this test creates plays the guest's side of the wire, and the real
//! guest workload, `arfs-echo --proto tcp` (built from guest-tests/workload), serves in
//! that namespace. The partner's frames go into the namespace through the tap; what the
//! namespace's kernel sends comes back to the partner. Checked per pattern (docs/scenarios.md,
//! "TCP"): pooled request/response, connect-request-response-close, bulk stream, a server
//! that is not there, and garbage on the wire.
//!
//! Needs root (tap, `ip netns`), iproute2 and gcc with glibc's static libraries; the tests
//! are `#[ignore]`d and guest-tests/run-tests.sh runs them as root.

mod common;

use arfsnic::traffic::partner::{LinkPartner, LinkStats, LoopMode, PartnerConfig, Proto, TcpClose, TcpPattern};
use arfsnic::traffic::tap::TapPeer;
use arfsnic::traffic::{Delivery, GuestPeer, ToGuest};
use common::{ip, is_root};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

const PARTNER_IP: Ipv4Addr = Ipv4Addr::new(10, 231, 78, 1);
const GUEST_IP: Ipv4Addr = Ipv4Addr::new(10, 231, 78, 2);
const SERVER_PORT: u16 = 5600;

/// `arfs-echo`, built once per test process from guest-tests/workload.
fn arfs_echo() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("workload");
        let st = Command::new("make")
            .arg("-s")
            .arg("-C")
            .arg(root.join("guest-tests/workload"))
            .arg(format!("O={}", out.display()))
            .status()
            .expect("running make (build-essential must be installed)");
        assert!(st.success(), "building guest-tests/workload failed (needs gcc and glibc's static libraries)");
        out.join("arfs-echo")
    })
    .clone()
}

/// Frames from the partner go into the namespace through the tap.
struct IntoNamespace(Arc<TapPeer>);
impl ToGuest for IntoNamespace {
    fn to_guest(&self, frame: &[u8]) -> Delivery {
        self.0.from_guest(0, frame);
        Delivery { queue: Some(0), delivered: true, filter: None }
    }
}

/// Frames the namespace's kernel sends go to the partner.
struct ToPartner(OnceLock<Arc<LinkPartner>>);
impl ToGuest for ToPartner {
    fn to_guest(&self, frame: &[u8]) -> Delivery {
        if let Some(p) = self.0.get() {
            p.from_guest(0, frame);
        }
        Delivery { queue: Some(0), delivered: true, filter: None }
    }
}

/// The namespace with the tap in it, the partner on the tap, and the server if started.
struct Bench {
    ns: String,
    tap: Arc<TapPeer>,
    partner: Arc<LinkPartner>,
    server: Option<Child>,
}

impl Drop for Bench {
    fn drop(&mut self) {
        if let Some(c) = self.server.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.tap.stop();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}

fn bench(tag: &str, cfg: PartnerConfig) -> Bench {
    assert!(
        is_root(),
        "traffic_tcp needs root (a tap device, ip netns): run `cargo test --test traffic_tcp -- --ignored` as root"
    );
    let id = std::process::id() % 10_000;
    let tap_name = format!("arfsc{tag}{id}");
    let ns = format!("arfsnic-tcp-{tag}-{id}");
    let tap = TapPeer::open(&tap_name, 1).unwrap_or_else(|e| panic!("{e}"));
    let back = Arc::new(ToPartner(OnceLock::new()));
    let partner = LinkPartner::new(cfg, Arc::new(IntoNamespace(tap.clone()))).unwrap();
    let _ = back.0.set(partner.clone());
    tap.start(back).unwrap();
    ip(&["netns", "add", &ns]);
    let b = Bench { ns: ns.clone(), tap, partner, server: None };
    ip(&["link", "set", &tap_name, "netns", &ns]);
    let nsx = |args: &[&str]| {
        let mut a = vec!["netns", "exec", &ns, "ip"];
        a.extend_from_slice(args);
        ip(&a);
    };
    nsx(&["link", "set", "lo", "up"]);
    nsx(&["addr", "add", &format!("{GUEST_IP}/24"), "dev", &tap_name]);
    nsx(&["link", "set", &tap_name, "up"]);
    b
}

/// Start `arfs-echo --proto tcp` in the namespace and wait for "ready".
fn serve(b: &mut Bench, args: &[&str]) {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &b.ns]).arg(arfs_echo());
    cmd.args(["--proto", "tcp", "--base-port", &SERVER_PORT.to_string(), "--quiet"]);
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start arfs-echo");
    let err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            eprintln!("[arfs-echo] {line}");
            if line.contains("arfs-echo: ready") {
                let _ = tx.send(());
            }
        }
    });
    b.server = Some(child);
    rx.recv_timeout(Duration::from_secs(10)).expect("arfs-echo did not get ready");
}

/// Wait for the server to end and return its JSON.
fn server_json(b: &mut Bench) -> serde_json::Value {
    let child = b.server.take().expect("server running");
    let out = child.wait_with_output().expect("arfs-echo exit");
    assert!(out.status.success(), "arfs-echo failed: {:?}", out.status);
    let s = String::from_utf8_lossy(&out.stdout);
    let json = s
        .split("ARFS-ECHO-JSON-BEGIN")
        .nth(1)
        .and_then(|r| r.split("ARFS-ECHO-JSON-END").next())
        .unwrap_or_else(|| panic!("no JSON in arfs-echo's output: {s}"));
    serde_json::from_str(json.trim()).expect("arfs-echo JSON")
}

fn cfg(pattern: TcpPattern, flows: u32, rate: u64, duration_s: f64) -> PartnerConfig {
    PartnerConfig {
        partner_ipv4: PARTNER_IP,
        guest_ipv4: GUEST_IP,
        proto: Proto::Tcp,
        tcp_pattern: pattern,
        flows,
        guest_base_port: SERVER_PORT,
        partner_base_port: 20000,
        rate_pps: rate,
        mode: if rate > 0 && pattern == TcpPattern::Rr { LoopMode::Open } else { LoopMode::Closed },
        payload: 64,
        duration_s,
        ..Default::default()
    }
}

/// Run the partner for its duration and stop it.
fn run(b: &Bench) -> LinkStats {
    b.partner.start().unwrap();
    let t = Instant::now();
    while !b.partner.finished() && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let st = b.partner.stop();
    eprintln!("{}", serde_json::to_string(&st.tcp).unwrap());
    eprintln!(
        "requests {} responses {} lost {} rtt p50 {} p99 {} us, {:.0}/s",
        st.requests, st.responses, st.lost, st.rtt_us_p50, st.rtt_us_p99, st.responses_per_s
    );
    st
}

#[test]
#[ignore = "needs root (tap device, network namespace); guest-tests/run-tests.sh runs it as root"]
fn tcp_rr_pooled_connections_against_arfs_echo() {
    let mut b = bench("rr", cfg(TcpPattern::Rr, 16, 0, 3.0));
    serve(&mut b, &["--flows", "16", "--workers", "2", "--pattern", "work-stealing", "--duration-s", "6"]);
    let st = run(&b);
    let tcp = st.tcp.clone().expect("tcp stats");
    assert_eq!((tcp.connects, tcp.established, tcp.connect_errors, tcp.resets), (16, 16, 0, 0), "{tcp:?}");
    assert!(st.responses >= 100, "closed loop over 16 connections for 3 s: {st:?}");
    assert_eq!(st.bad_responses + st.late_responses, 0);
    assert_eq!(st.requests, st.responses + st.lost);
    assert_eq!(tcp.closes, 16, "every pooled connection closed with a FIN handshake: {tcp:?}");
    assert_eq!(tcp.open, 0);
    // Every connection carried requests, each in its own slot, and the RTTs are real.
    assert!(st.per_flow.iter().all(|f| f.responses > 0 && f.cpu_counts.iter().sum::<u64>() == f.responses));
    assert!(st.rtt_us_p50 > 0.0 && st.rtt_us_p99 >= st.rtt_us_p50);
    assert_eq!(st.rtt_hist_log2_us.iter().sum::<u64>(), st.responses, "one RTT per response in the histogram");
    let g = server_json(&mut b);
    assert_eq!(g["tcp"]["accepted"], 16, "{g}");
    assert_eq!(g["requests"].as_u64(), Some(st.responses + st.lost), "guest served every request we sent: {g}");
    assert_eq!(g["tcp"]["conn_errors"], 0);
}

#[test]
#[ignore = "needs root (tap device, network namespace); guest-tests/run-tests.sh runs it as root"]
fn tcp_crr_connections_come_and_go() {
    let mut b = bench("crr", cfg(TcpPattern::Crr, 2048, 150, 3.0));
    serve(&mut b, &["--flows", "2048", "--workers", "2", "--duration-s", "6"]);
    let st = run(&b);
    let tcp = st.tcp.clone().expect("tcp stats");
    assert!(tcp.connects >= 300, "150 connections/s for 3 s: {tcp:?}");
    assert_eq!((tcp.connect_errors, tcp.resets, tcp.no_free_socket), (0, 0, 0), "{tcp:?}");
    assert_eq!(tcp.crr_completed, tcp.connects, "every connection did its request and closed: {tcp:?}");
    assert_eq!(st.responses, tcp.connects);
    assert!(tcp.crr_us_p50 > 0.0 && tcp.connect_us_p50 > 0.0);
    // The partner closes first: its sockets wait in TIME-WAIT (a simultaneous close may skip it).
    assert!(tcp.time_wait * 10 >= tcp.connects * 9, "{tcp:?}");
    let g = server_json(&mut b);
    assert_eq!(g["tcp"]["accepted"].as_u64(), Some(tcp.connects), "{g}");
    assert_eq!(g["tcp"]["closed"].as_u64(), Some(tcp.connects), "{g}");
    assert_eq!(g["tcp"]["open_at_end"], 0);
}

#[test]
#[ignore = "needs root (tap device, network namespace); guest-tests/run-tests.sh runs it as root"]
fn tcp_crr_with_resets_recycles_a_few_ports() {
    // 8 sockets over 16 ports, reset after the response: at 200/s each 4-tuple comes back
    // about 12 times a second, and Linux takes every new SYN on it (no TIME-WAIT anywhere).
    let c = PartnerConfig { tcp_ports: 16, tcp_close: TcpClose::Rst, ..cfg(TcpPattern::Crr, 8, 200, 3.0) };
    let mut b = bench("rst", c);
    serve(&mut b, &["--flows", "8", "--workers", "2", "--duration-s", "6"]);
    let st = run(&b);
    let tcp = st.tcp.clone().expect("tcp stats");
    assert!(tcp.connects >= 400, "200 connections/s for 3 s over 8 sockets: {tcp:?}");
    assert_eq!((tcp.connect_errors, tcp.close_timeouts), (0, 0), "{tcp:?}");
    assert_eq!(tcp.crr_completed, tcp.connects, "every connection did its request and was reset: {tcp:?}");
    assert_eq!(st.responses, tcp.connects);
    assert_eq!(tcp.time_wait, 0, "a reset leaves no TIME-WAIT: {tcp:?}");
    // Only the 16 ports were used, each many times.
    let ports: std::collections::BTreeSet<u16> = st.per_flow.iter().map(|f| f.partner_port).collect();
    assert!(ports.iter().all(|p| (20000..20016).contains(p)), "ports outside the range: {ports:?}");
    let g = server_json(&mut b);
    assert_eq!(
        g["tcp"]["accepted"].as_u64(),
        Some(tcp.connects),
        "the guest accepted every SYN on a reused 4-tuple: {g}"
    );
    assert_eq!(g["tcp"]["open_at_end"], 0);
}

#[test]
#[ignore = "needs root (tap device, network namespace); guest-tests/run-tests.sh runs it as root"]
fn tcp_partner_survives_a_guest_that_stalls_then_goes_silent() {
    // 64 KiB messages, closed loop: when the server stops reading, its receive windows
    // close (zero window); when its link goes down, nothing answers at all.
    let c = PartnerConfig { payload: 65536, window: 2, ..cfg(TcpPattern::Rr, 8, 0, 5.0) };
    let mut b = bench("stall", c);
    serve(&mut b, &["--flows", "8", "--workers", "2", "--msg-size", "65536", "--duration-s", "30"]);
    let pid = b.server.as_ref().unwrap().id().to_string();
    let t = Instant::now();
    b.partner.start().unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let signal = |sig: &str| assert!(Command::new("kill").args([sig, &pid]).status().unwrap().success());
    signal("-STOP");
    std::thread::sleep(Duration::from_millis(1500));
    let tap = format!("arfscstall{}", std::process::id() % 10_000);
    ip(&["-n", &b.ns, "link", "set", &tap, "down"]);
    while !b.partner.finished() && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let st = b.partner.stop();
    let took = t.elapsed();
    signal("-CONT");
    let tcp = st.tcp.clone().expect("tcp stats");
    eprintln!("{} after {took:?}", serde_json::to_string(&tcp).unwrap());
    // 5 s of sending, then the drain and the close timeout: bounded, whatever the guest does.
    assert!(took < Duration::from_secs(15), "the run ended {took:?} after its start");
    assert!(st.responses > 0, "the first second was answered: {st:?}");
    assert!(tcp.retransmits > 0, "segments to a silent guest are retransmitted: {tcp:?}");
    assert!(tcp.resets + tcp.close_timeouts > 0, "dead connections are counted: {tcp:?}");
    assert_eq!(st.requests, st.responses + st.lost, "every request is answered or counted lost");
    assert_eq!(tcp.open, 0, "no connection is left open at the end: {tcp:?}");
}

#[test]
#[ignore = "needs root (tap device, network namespace); guest-tests/run-tests.sh runs it as root"]
fn tcp_stream_into_a_sink() {
    let mut c = cfg(TcpPattern::Stream, 2, 0, 2.0);
    c.payload = 1400;
    let mut b = bench("st", c);
    serve(&mut b, &["--flows", "2", "--tcp-mode", "sink", "--msg-size", "1400", "--duration-s", "5"]);
    let st = run(&b);
    let tcp = st.tcp.clone().expect("tcp stats");
    assert!(tcp.bytes_acked > 1 << 20, "at least a MiB acknowledged in 2 s: {tcp:?}");
    assert!(tcp.throughput_mbps > 4.0, "{tcp:?}");
    assert_eq!((tcp.established, tcp.resets), (2, 0));
    assert_eq!((st.requests, st.lost), (0, 0), "stream messages are not requests");
    let g = server_json(&mut b);
    assert!(g["tcp"]["bytes_in"].as_u64().unwrap() >= tcp.bytes_acked, "the sink read what was acknowledged: {g}");
}

#[test]
#[ignore = "needs root (tap device, network namespace); guest-tests/run-tests.sh runs it as root"]
fn tcp_without_a_server_and_with_garbage_keeps_going() {
    let b = bench("no", cfg(TcpPattern::Rr, 4, 0, 1.0));
    // Garbage first: truncated and corrupt TCP from the guest's address, never a panic.
    let mut frame = vec![0u8; 14 + 20 + 20];
    frame[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    frame[14] = 0x45;
    frame[16..18].copy_from_slice(&40u16.to_be_bytes());
    frame[23] = 6;
    frame[26..30].copy_from_slice(&GUEST_IP.octets());
    frame[30..34].copy_from_slice(&PARTNER_IP.octets());
    for cut in [14, 20, 34, 40, frame.len()] {
        b.partner.from_guest(0, &frame[..cut]);
    }
    let mut big = frame.clone();
    big[16..18].copy_from_slice(&60000u16.to_be_bytes());
    b.partner.from_guest(0, &big);
    let st = run(&b);
    let tcp = st.tcp.expect("tcp stats");
    // Nobody listens: Linux answers every SYN with a reset, the partner retries.
    assert!(tcp.connects >= 4 && tcp.established == 0 && tcp.connect_errors >= 4, "{tcp:?}");
    assert_eq!(st.responses, 0);
}

/// Hostile clients inside the namespace (python3 on the loopback): a reset after 5 bytes,
/// a message with a wrong magic, half a message then close, 200 connections opened and
/// closed at once. The server keeps serving: the partner's pooled run afterwards is answered.
const HOSTILE: &str = r#"
import socket, struct, sys
port = int(sys.argv[1])
def conn():
    return socket.create_connection(("127.0.0.1", port), timeout=5)
s = conn(); s.send(b"ARFS\x00"); s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)); s.close()
s = conn(); s.send(b"XXXX" + bytes(60)); assert s.recv(64) == b"", "a wrong magic closes the connection"; s.close()
s = conn(); s.send(b"ARFS" + bytes(20)); s.close()
socks = [conn() for _ in range(200)]
for s in socks: s.close()
s = conn(); s.send(b"ARFS" + struct.pack(">II", 3, 7) + bytes(4) + bytes(48)); r = s.recv(64)
assert len(r) == 64 and r[:12] == b"ARFS" + struct.pack(">II", 3, 7), r
s.close()
print("hostile clients done")
"#;

#[test]
#[ignore = "needs root (tap device, network namespace) and python3; guest-tests/run-tests.sh runs it as root"]
fn tcp_server_survives_hostile_clients() {
    let mut b = bench("ho", cfg(TcpPattern::Rr, 4, 0, 1.0));
    serve(&mut b, &["--flows", "4", "--workers", "2", "--pattern", "work-stealing", "--duration-s", "5"]);
    let out = Command::new("ip")
        .args(["netns", "exec", &b.ns, "python3", "-c", HOSTILE, &SERVER_PORT.to_string()])
        .output()
        .expect("python3 (needed by this test)");
    assert!(
        out.status.success(),
        "hostile client script: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let st = run(&b);
    assert!(st.responses > 0, "the partner is served after the hostile clients: {st:?}");
    let g = server_json(&mut b);
    let t = &g["tcp"];
    eprintln!("{t}");
    assert!(g["bad_magic"].as_u64() >= Some(1), "{g}");
    assert!(t["accepted"].as_u64() >= Some(204 + 4), "{t}");
    assert!(t["conn_errors"].as_u64() >= Some(2), "the reset and the wrong magic: {t}");
    assert_eq!(t["open_at_end"], 0, "{t}");
}
