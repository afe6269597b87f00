//! Tap mode for real (needs root / CAP_NET_ADMIN and iproute2): create a multiqueue tap,
//! move it into a network namespace this test creates, and check both directions with a
//! fake `ToGuest`:
//! * a UDP datagram sent from a socket inside the namespace reaches `to_guest` (vnet header
//!   stripped, a plain Ethernet frame);
//! * a frame given to `from_guest` (on either queue pair) comes out in the namespace and a
//!   UDP socket bound there receives it.
//!
//! That test is `#[ignore]`d: a plain `cargo test` lists it as ignored. As root,
//! `cargo test --test traffic_tap -- --ignored` runs it; run that way without root it fails.

mod common;

use arfsnic::traffic::tap::{TapError, TapPeer};
use arfsnic::traffic::{Delivery, GuestPeer, ToGuest};
use common::{ip, is_root};
use crossbeam_channel::{unbounded, Receiver, Sender};
use etherparse::{NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
use std::fs::File;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::{Duration, Instant};

const NS_IP: [u8; 4] = [10, 231, 77, 1];
const GUEST_IP: [u8; 4] = [10, 231, 77, 2];
const GUEST_MAC: [u8; 6] = [0x02, 0x00, 0x0a, 0xe7, 0x4d, 0x02];

struct FakeNic {
    tx: Sender<Vec<u8>>,
}

impl ToGuest for FakeNic {
    fn to_guest(&self, frame: &[u8]) -> Delivery {
        let _ = self.tx.send(frame.to_vec());
        Delivery { queue: Some(0), delivered: true, filter: None }
    }
}

/// Deletes the namespace (and with it anything left inside) when the test ends, pass or fail.
struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// Create UDP sockets inside namespace `ns` (a thread enters it; sockets keep their
/// namespace after the thread is gone).
fn sockets_in_ns(ns: &str, binds: Vec<SocketAddrV4>) -> Vec<UdpSocket> {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let f = File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
        // SAFETY: setns() on a valid namespace fd we own; it only changes this (short-lived)
        // thread's network namespace.
        let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
        binds
            .into_iter()
            .map(|a| UdpSocket::bind(a).unwrap_or_else(|e| panic!("bind {a} in namespace: {e}")))
            .collect::<Vec<_>>()
    })
    .join()
    .expect("namespace thread")
}

fn wait_udp(rx: &Receiver<Vec<u8>>, dport: u16, timeout: Duration) -> Option<Vec<u8>> {
    let deadline = Instant::now() + timeout;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let Ok(f) = rx.recv_timeout(left) else { break };
        let ours = matches!(
            SlicedPacket::from_ethernet(&f).map(|p| p.transport),
            Ok(Some(TransportSlice::Udp(u))) if u.destination_port() == dport
        );
        if ours {
            return Some(f);
        }
        // IPv6 router solicitations, MLD reports, ...: not ours.
    }
    None
}

#[test]
#[ignore = "needs root (creates a tap device); guest-tests/run-tests.sh runs it as root"]
fn tap_in_namespace_both_directions() {
    assert!(
        is_root(),
        "tap_in_namespace_both_directions needs root (CAP_NET_ADMIN for /dev/net/tun, ip netns): \
         run `cargo test --test traffic_tap -- --ignored` as root"
    );
    let id = std::process::id();
    let tap_name = format!("arfst{}", id % 100_000);
    let ns_name = format!("arfsnic-tap-{id}");
    let queues = 2;

    let tap = match TapPeer::open(&tap_name, queues) {
        Ok(t) => t,
        Err(e @ TapError::Open(_)) => panic!("{e}"),
        Err(e) => panic!("{e}"),
    };
    assert_eq!(tap.queues(), queues);
    // IFF_VNET_HDR | IFF_MULTI_QUEUE tap with 2 queues exists on the host now.
    let flags = std::fs::read_to_string(format!("/sys/class/net/{tap_name}/tun_flags")).unwrap();
    let flags = u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16).unwrap();
    assert_eq!(flags & 0x5102, 0x5102, "tun_flags {flags:#x} lacks TAP|NO_PI|VNET_HDR|MULTI_QUEUE");

    let (tx, rx) = unbounded();
    tap.start(std::sync::Arc::new(FakeNic { tx })).unwrap();

    ip(&["netns", "add", &ns_name]);
    let _ns = Netns(ns_name.clone());
    ip(&["link", "set", &tap_name, "netns", &ns_name]);
    let nsx = |args: &[&str]| {
        let mut a = vec!["netns", "exec", &ns_name, "ip"];
        a.extend_from_slice(args);
        ip(&a);
    };
    nsx(&["link", "set", "lo", "up"]);
    nsx(&["addr", "add", "10.231.77.1/24", "dev", &tap_name]);
    nsx(&["link", "set", &tap_name, "up"]);
    nsx(&["neigh", "replace", "10.231.77.2", "lladdr", "02:00:0a:e7:4d:02", "dev", &tap_name, "nud", "permanent"]);

    let socks = sockets_in_ns(
        &ns_name,
        vec![SocketAddrV4::new(Ipv4Addr::from(NS_IP), 7001), SocketAddrV4::new(Ipv4Addr::from(NS_IP), 7002)],
    );
    let (s1, s2) = (&socks[0], &socks[1]);

    // Namespace -> guest.
    s1.send_to(b"hello-from-namespace", SocketAddrV4::new(Ipv4Addr::from(GUEST_IP), 9001)).unwrap();
    let f =
        wait_udp(&rx, 9001, Duration::from_secs(5)).expect("UDP datagram from the namespace never reached to_guest");
    let p = SlicedPacket::from_ethernet(&f).unwrap();
    let Some(NetSlice::Ipv4(ip4)) = &p.net else { panic!("not IPv4: {f:02x?}") };
    assert_eq!(ip4.header().source(), NS_IP);
    assert_eq!(ip4.header().destination(), GUEST_IP);
    let Some(TransportSlice::Udp(u)) = &p.transport else { unreachable!() };
    assert_eq!(u.source_port(), 7001);
    assert_eq!(u.payload(), b"hello-from-namespace");
    assert_eq!(&f[0..6], &GUEST_MAC, "frame must start at the Ethernet header (vnet header stripped)");
    let tap_mac: [u8; 6] = f[6..12].try_into().unwrap();

    // Guest -> namespace, once per queue pair (pair 3 maps to tap queue 1).
    for (pair, sock, port) in [(0u16, s1, 7001u16), (3, s2, 7002)] {
        let msg = format!("hello-from-guest-pair-{pair}");
        let mut frame = Vec::new();
        PacketBuilder::ethernet2(GUEST_MAC, tap_mac)
            .ipv4(GUEST_IP, NS_IP, 64)
            .udp(9001, port)
            .write(&mut frame, msg.as_bytes())
            .unwrap();
        tap.from_guest(pair, &frame);
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 256];
        let (n, from) = sock.recv_from(&mut buf).expect("frame from from_guest never arrived in the namespace");
        assert_eq!(&buf[..n], msg.as_bytes());
        assert_eq!(from, std::net::SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(GUEST_IP), 9001)));
    }

    // Hostile input on the guest side never panics and is counted.
    tap.from_guest(1, &[]);
    tap.from_guest(1, &vec![0u8; 70000]);

    let st = tap.stats();
    eprintln!("tap stats: {st:?}");
    assert_eq!(st.from_guest_frames, 2);
    assert_eq!(st.write_errors, 2);
    assert!(st.to_guest_frames >= 1);
    assert_eq!(st.gso_dropped, 0);
    assert_eq!(st.per_queue_reads.len(), 2);

    // Readers stop promptly.
    let t = Instant::now();
    tap.stop();
    assert!(t.elapsed() < Duration::from_secs(2));
    drop(socks);
    drop(tap);
}

#[test]
fn tap_open_rejects_bad_arguments() {
    assert!(matches!(TapPeer::open("", 1), Err(TapError::Name(_))));
    assert!(matches!(TapPeer::open("way-too-long-name0", 1), Err(TapError::Name(_))));
    assert!(matches!(TapPeer::open("arfsx", 0), Err(TapError::Queues(0))));
    assert!(matches!(TapPeer::open("arfsx", 257), Err(TapError::Queues(257))));
}
