//! Minimal link partner on top of the vhost-user backend, for checking the backend against a
//! real QEMU + guest by hand.
//!
//! Serves the socket (one QEMU after another), logs every TX frame, queue enable/disable and
//! link change, answers ARP requests for the peer IP and ICMP echo requests to the peer IP (so
//! `arping`/`ping` from the guest resolve and get answers), and prints per-pair counters every
//! few seconds and when a frontend goes away.
//!
//! ```text
//! cargo run --release --example vhost_reflect -- --socket vr.sock --queues 4 \
//!     [--peer-ip 10.0.2.2] [--peer-mac 02:00:00:00:00:02] [--threads N] [--quiet]
//!     [--flood-pps N --flood-secs S]
//! ```
//! With `--flood-pps`, once the guest has ARPed for the peer (which tells us its MAC and IP),
//! the example sends UDP frames (64 bytes, peer:1024+k -> guest:9, 64 source ports) spread over
//! the enabled pairs at N frames/s for S seconds and prints delivered / NoBuffers per second:
//! a check that RX refill works without guest kicks.
//! Then start QEMU with `-chardev socket,id=c0,path=vr.sock
//! -netdev vhost-user,id=n0,chardev=c0,queues=4 -device virtio-net-pci,netdev=n0,mq=on,vectors=10`
//! and a shared memfd memory backend (see the `qemu/` recipes).

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use arfsnic::vhost::{Backend, DeviceHooks, RxPort, ServeConfig};

struct Reflector {
    rx: OnceLock<RxPort>,
    peer_ip: [u8; 4],
    peer_mac: [u8; 6],
    quiet: bool,
    start: Instant,
    /// Guest MAC and IPv4 address, learned from its ARP requests.
    guest: Mutex<Option<([u8; 6], [u8; 4])>>,
}

fn mac_str(m: &[u8]) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

fn csum(data: &[u8]) -> u16 {
    let mut s = 0u32;
    for c in data.chunks(2) {
        let w = if c.len() == 2 { u16::from_be_bytes([c[0], c[1]]) } else { u16::from_be_bytes([c[0], 0]) };
        s += u32::from(w);
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

impl Reflector {
    fn t(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn describe(f: &[u8]) -> String {
        if f.len() < 14 {
            return format!("runt {} bytes", f.len());
        }
        let et = u16::from_be_bytes([f[12], f[13]]);
        let base = format!("{} -> {} type {et:#06x} len {}", mac_str(&f[6..12]), mac_str(&f[0..6]), f.len());
        match et {
            0x0806 if f.len() >= 42 => {
                let op = u16::from_be_bytes([f[20], f[21]]);
                format!(
                    "{base} ARP {} who-has {} tell {}",
                    if op == 1 { "request" } else { "reply" },
                    Ipv4Addr::from([f[38], f[39], f[40], f[41]]),
                    Ipv4Addr::from([f[28], f[29], f[30], f[31]])
                )
            }
            0x0800 if f.len() >= 34 => format!(
                "{base} IPv4 {} -> {} proto {}",
                Ipv4Addr::from([f[26], f[27], f[28], f[29]]),
                Ipv4Addr::from([f[30], f[31], f[32], f[33]]),
                f[23]
            ),
            _ => base,
        }
    }

    fn reply(&self, pair: u16, frame: &[u8]) {
        let Some(rx) = self.rx.get() else { return };
        let enabled = rx.enabled_pairs();
        let q = if enabled.get(usize::from(pair)).copied().unwrap_or(false) {
            pair
        } else {
            enabled.iter().position(|&e| e).unwrap_or(0) as u16
        };
        match rx.deliver(q, frame) {
            Ok(()) => {
                if !self.quiet {
                    println!("[{:8.3}] RX  pair {q}: {}", self.t(), Self::describe(frame));
                }
            }
            Err(e) => println!("[{:8.3}] RX  pair {q}: dropped: {e}", self.t()),
        }
    }

    /// ARP request for peer_ip -> ARP reply (built by hand).
    fn arp(&self, pair: u16, f: &[u8]) -> bool {
        if f.len() < 42 || f[12..14] != [0x08, 0x06] || f[14..22] != [0, 1, 8, 0, 6, 4, 0, 1] {
            return false;
        }
        if f[38..42] != self.peer_ip {
            return false;
        }
        let (mut mac, mut ip) = ([0u8; 6], [0u8; 4]);
        mac.copy_from_slice(&f[22..28]);
        ip.copy_from_slice(&f[28..32]);
        *self.guest.lock().unwrap_or_else(|e| e.into_inner()) = Some((mac, ip));
        let mut r = Vec::with_capacity(60);
        r.extend_from_slice(&f[6..12]); // dst = requester
        r.extend_from_slice(&self.peer_mac);
        r.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 2]);
        r.extend_from_slice(&self.peer_mac); // sender hw
        r.extend_from_slice(&self.peer_ip); // sender ip
        r.extend_from_slice(&f[22..28]); // target hw = requester hw
        r.extend_from_slice(&f[28..32]); // target ip = requester ip
        r.resize(60, 0);
        self.reply(pair, &r);
        true
    }

    /// ICMP echo request to peer_ip -> echo reply.
    fn icmp(&self, pair: u16, f: &[u8]) -> bool {
        if f.len() < 42 || f[12..14] != [0x08, 0x00] || f[23] != 1 || f[30..34] != self.peer_ip {
            return false;
        }
        let ihl = usize::from(f[14] & 0x0f) * 4;
        let tot = usize::from(u16::from_be_bytes([f[16], f[17]]));
        if ihl < 20 || tot < ihl + 8 || 14 + tot > f.len() || f[14 + ihl] != 8 {
            return false;
        }
        let mut r = f[..14 + tot].to_vec();
        r[0..6].copy_from_slice(&f[6..12]);
        r[6..12].copy_from_slice(&self.peer_mac);
        // swap IPs, fresh TTL and header checksum
        r[26..30].copy_from_slice(&f[30..34]);
        r[30..34].copy_from_slice(&f[26..30]);
        r[22] = 64;
        r[24] = 0;
        r[25] = 0;
        let c = csum(&r[14..14 + ihl]);
        r[24..26].copy_from_slice(&c.to_be_bytes());
        // ICMP type 0, checksum
        let icmp = 14 + ihl;
        r[icmp] = 0;
        r[icmp + 2] = 0;
        r[icmp + 3] = 0;
        let c = csum(&r[icmp..14 + tot]);
        r[icmp + 2..icmp + 4].copy_from_slice(&c.to_be_bytes());
        self.reply(pair, &r);
        true
    }
}

impl DeviceHooks for Reflector {
    fn on_tx(&self, pair: u16, frame: &[u8]) {
        if !self.quiet {
            println!("[{:8.3}] TX  pair {pair}: {}", self.t(), Self::describe(frame));
        }
        let _ = self.arp(pair, frame) || self.icmp(pair, frame);
    }
    fn on_queue_state(&self, pair: u16, enabled: bool) {
        println!("[{:8.3}] QUEUE pair {pair} {}", self.t(), if enabled { "enabled" } else { "disabled" });
    }
    fn on_link(&self, up: bool) {
        println!("[{:8.3}] LINK {}", self.t(), if up { "up" } else { "down" });
    }
}

/// A 64-byte UDP/IPv4 frame peer:sport -> guest:9.
fn udp_frame(dst_mac: [u8; 6], src_mac: [u8; 6], src: [u8; 4], dst: [u8; 4], sport: u16) -> Vec<u8> {
    let payload = 18usize;
    let mut f = Vec::with_capacity(64);
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&[0x08, 0x00]);
    let tot = (20 + 8 + payload) as u16;
    f.extend_from_slice(&[0x45, 0]);
    f.extend_from_slice(&tot.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
    f.extend_from_slice(&src);
    f.extend_from_slice(&dst);
    let c = csum(&f[14..34]);
    f[24..26].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&9u16.to_be_bytes());
    f.extend_from_slice(&((8 + payload) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.resize(14 + usize::from(tot), 0x5a);
    f
}

fn flood(h: &Reflector, pps: u64, secs: u64) {
    let Some(rx) = h.rx.get() else { return };
    let (gmac, gip) = loop {
        if let Some(g) = *h.guest.lock().unwrap_or_else(|e| e.into_inner()) {
            break g;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    println!("[{:8.3}] FLOOD start: {pps} pps for {secs} s to {}", h.t(), Ipv4Addr::from(gip));
    let frames: Vec<Vec<u8>> = (0..64u16).map(|k| udp_frame(gmac, h.peer_mac, h.peer_ip, gip, 1024 + k)).collect();
    let t0 = Instant::now();
    let mut sent = 0u64;
    let (mut ok, mut nobuf, mut other) = (0u64, 0u64, 0u64);
    let mut last_report = 0u64;
    while t0.elapsed() < Duration::from_secs(secs) {
        let due = (t0.elapsed().as_secs_f64() * pps as f64) as u64;
        if sent >= due {
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        let enabled = rx.enabled_pairs();
        let on: Vec<u16> = (0..rx.pairs()).filter(|&p| enabled[usize::from(p)]).collect();
        while sent < due {
            let k = (sent % 64) as usize;
            let q = if on.is_empty() { 0 } else { on[k % on.len()] };
            match rx.deliver(q, &frames[k]) {
                Ok(()) => ok += 1,
                Err(arfsnic::vhost::RxError::NoBuffers) => nobuf += 1,
                Err(_) => other += 1,
            }
            sent += 1;
        }
        let s = t0.elapsed().as_secs();
        if s > last_report {
            last_report = s;
            println!("[{:8.3}] FLOOD {s:3} s: sent {sent} delivered {ok} no-buffers {nobuf} other {other}", h.t());
        }
    }
    println!(
        "[{:8.3}] FLOOD done: sent {sent} delivered {ok} ({:.0}/s) no-buffers {nobuf} other {other}",
        h.t(),
        ok as f64 / t0.elapsed().as_secs_f64()
    );
}

fn main() -> anyhow::Result<()> {
    let mut socket = None;
    let mut queues = 1u16;
    let mut threads = None;
    let mut peer_ip = Ipv4Addr::new(10, 0, 2, 2);
    let mut peer_mac = [0x02, 0, 0, 0, 0, 0x02];
    let mut quiet = false;
    let mut flood_pps = 0u64;
    let mut flood_secs = 10u64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or_else(|| anyhow::anyhow!("{a} needs a value"));
        match a.as_str() {
            "--socket" => socket = Some(val()?),
            "--queues" => queues = val()?.parse()?,
            "--threads" => threads = Some(val()?.parse()?),
            "--peer-ip" => peer_ip = val()?.parse()?,
            "--peer-mac" => {
                let v = val()?;
                let b: Vec<u8> = v.split(':').map(|x| u8::from_str_radix(x, 16)).collect::<Result<_, _>>()?;
                peer_mac = b.try_into().map_err(|_| anyhow::anyhow!("bad MAC {v}"))?;
            }
            "--quiet" => quiet = true,
            "--flood-pps" => flood_pps = val()?.parse()?,
            "--flood-secs" => flood_secs = val()?.parse()?,
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    let socket = socket.ok_or_else(|| anyhow::anyhow!("--socket PATH is required"))?;
    let hooks = Arc::new(Reflector {
        rx: OnceLock::new(),
        peer_ip: peer_ip.octets(),
        peer_mac,
        quiet,
        start: Instant::now(),
        guest: Mutex::new(None),
    });
    let mut cfg = ServeConfig::new(&socket, queues);
    cfg.threads = threads;
    let backend = Arc::new(Backend::new(cfg, hooks.clone())?);
    let _ = hooks.rx.set(backend.rx_port());
    println!("vhost_reflect: serving {socket} with {queues} queue pairs; peer {peer_ip} at {}", mac_str(&peer_mac));
    let stop = Arc::new(AtomicBool::new(false));
    if flood_pps > 0 {
        let h = hooks.clone();
        std::thread::spawn(move || flood(&h, flood_pps, flood_secs));
    }
    {
        let b = backend.clone();
        let s = stop.clone();
        std::thread::spawn(move || {
            let mut last = Vec::new();
            while !s.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_secs(5));
                let c = b.counters();
                if c.pairs != last {
                    for (p, pc) in c.pairs.iter().enumerate() {
                        println!("  counters pair {p}: {pc:?}");
                    }
                    last = c.pairs;
                }
            }
        });
    }
    loop {
        if !backend.serve_one(&stop)? {
            break;
        }
        let c = backend.counters();
        println!(
            "vhost_reflect: frontend gone (connections {}, early enables {}, protocol errors {})",
            c.connections, c.early_enables, c.protocol_errors
        );
        for (p, pc) in c.pairs.iter().enumerate() {
            println!("  counters pair {p}: {pc:?}");
        }
    }
    Ok(())
}
