//! The built-in link partner: the default traffic source. It sits on the other end of the
//! emulated wire, answers ARP (and IPv6 neighbour solicitations), learns the guest's MAC and
//! runs a UDP request/response load over N flows against the guest's echo server.
//!
//! # Wire contract with the guest workload
//! Flow `i` (0-based) is the UDP 5-tuple `partner_ip:(partner_base_port+i) ->
//! guest_ip:(guest_base_port+i)`. A request's UDP payload is `payload` bytes in the layout
//! of [`crate::wire::echo`]: magic, flow index, sequence number, zero, padding.
//!
//! The guest echoes the payload back on the reversed 5-tuple with bytes 12..16 set to the CPU
//! that served it (u32, big endian). Anything else arriving on a flow's ports is counted in
//! `bad_responses`; a well-formed response whose request is no longer outstanding (timed out,
//! pushed out of the in-flight table, or a duplicate) in `late_responses`.
//!
//! # Threads and bounds
//! One sender thread per run. It ARPs for the guest every 200 ms until it knows the guest's
//! MAC (learnt from the guest's ARP traffic or from any IPv4 frame sourced from the guest IP),
//! then paces requests to `rate_pps` round-robin over the flows. In closed-loop mode a flow
//! never has more than `window` requests outstanding. Every flow has a bounded in-flight table
//! (`window` entries in closed loop, `max_in_flight_per_flow` in open loop): when it is full
//! the oldest entry is dropped, and entries older than `loss_timeout_ms` are dropped by a
//! sweep; both count as lost. Responses are handled on the caller's thread of
//! [`GuestPeer::from_guest`] (the vhost worker), which never allocates per frame except the
//! rare ARP/ND reply.

use crate::traffic::{Delivery, GuestPeer, ToGuest};
pub use crate::wire::echo::{echo_response, request_ids, MAGIC, MAX_PAYLOAD, MIN_PAYLOAD};
use crate::wire::echo::{Header, HEADER_LEN};
pub use crate::wire::ethernet::MacAddr;
use arc_swap::ArcSwap;
use etherparse::{
    icmpv6::NeighborAdvertisementHeader, ArpHardwareId, ArpOperation, ArpPacket, EtherType, Icmpv6Type, LinkSlice,
    NetSlice, PacketBuilder, SlicedPacket, TransportSlice,
};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

/// CPU numbers in responses at or above this are treated as malformed (bounds `cpu_counts`).
pub const MAX_CPUS: u32 = 4096;
/// Queue numbers at or above this are not histogrammed (bounds `queue_counts`).
pub const MAX_QUEUES: u16 = 1024;
/// Interval of ARP requests while the guest MAC is unknown.
pub const ARP_RETRY: Duration = Duration::from_millis(200);
/// Largest number of requests the pacer sends back to back.
const BURST: u64 = 32;
const SWEEP_EVERY: Duration = Duration::from_millis(10);

/// Open loop: requests leave at `rate_pps` whatever the guest answers. Closed loop: at most
/// `window` outstanding requests per flow (and at most `rate_pps` if it is non-zero).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LoopMode {
    Open,
    #[default]
    Closed,
}

/// Link partner configuration (filled by the runner from a scenario).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PartnerConfig {
    pub partner_mac: MacAddr,
    pub partner_ipv4: Ipv4Addr,
    /// When set, neighbour solicitations for it are answered.
    pub partner_ipv6: Option<Ipv6Addr>,
    pub guest_ipv4: Ipv4Addr,
    /// Known guest MAC (skips learning); normally learnt.
    pub guest_mac: Option<MacAddr>,
    /// Number of flows (distinct 5-tuples).
    pub flows: u32,
    /// Flow i is guest UDP port `guest_base_port + i`.
    pub guest_base_port: u16,
    /// Flow i is partner UDP port `partner_base_port + i`.
    pub partner_base_port: u16,
    /// Total offered requests/s over all flows; 0 = as fast as the window allows (closed loop only).
    pub rate_pps: u64,
    /// UDP payload bytes per request (16..=1472).
    pub payload: usize,
    pub mode: LoopMode,
    /// Closed loop: outstanding requests per flow.
    pub window: u32,
    /// Seconds of sending, counted from the first request; 0 = until `stop()`.
    pub duration_s: f64,
    /// A request unanswered for this long is dropped from the in-flight table (lost).
    pub loss_timeout_ms: u64,
    /// `stop()` waits this long at most for the last responses.
    pub drain_ms: u64,
    /// Open loop: in-flight table size per flow.
    pub max_in_flight_per_flow: u32,
}

impl Default for PartnerConfig {
    fn default() -> Self {
        PartnerConfig {
            partner_mac: MacAddr([0x02, 0xa5, 0xf1, 0x00, 0x00, 0x01]),
            partner_ipv4: Ipv4Addr::new(10, 99, 0, 1),
            partner_ipv6: None,
            guest_ipv4: Ipv4Addr::new(10, 99, 0, 2),
            guest_mac: None,
            flows: 64,
            guest_base_port: 5000,
            partner_base_port: 6000,
            rate_pps: 0,
            payload: 64,
            mode: LoopMode::Closed,
            window: 1,
            duration_s: 0.0,
            loss_timeout_ms: 1000,
            drain_ms: 1000,
            max_in_flight_per_flow: 1024,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartnerError {
    #[error("invalid link partner config: {0}")]
    Config(String),
    #[error("link partner is already running")]
    Running,
    #[error("cannot start the sender thread: {0}")]
    Spawn(String),
}

impl PartnerConfig {
    pub fn validate(&self) -> Result<(), PartnerError> {
        let bad = |m: String| Err(PartnerError::Config(m));
        if self.flows == 0 {
            return bad("flows must be >= 1".into());
        }
        if u32::from(self.guest_base_port) + self.flows > 65536 {
            return bad(format!("guest_base_port {} + flows {} exceeds port 65535", self.guest_base_port, self.flows));
        }
        if u32::from(self.partner_base_port) + self.flows > 65536 {
            return bad(format!(
                "partner_base_port {} + flows {} exceeds port 65535",
                self.partner_base_port, self.flows
            ));
        }
        if !(MIN_PAYLOAD..=MAX_PAYLOAD).contains(&self.payload) {
            return bad(format!("payload must be {MIN_PAYLOAD}..={MAX_PAYLOAD} bytes, got {}", self.payload));
        }
        if !self.partner_mac.is_unicast() {
            return bad(format!("partner_mac {} must be a unicast address", self.partner_mac));
        }
        if let Some(m) = self.guest_mac {
            if !m.is_unicast() {
                return bad(format!("guest_mac {m} must be a unicast address"));
            }
        }
        if self.partner_ipv4 == self.guest_ipv4 {
            return bad("partner_ipv4 and guest_ipv4 must differ".into());
        }
        match self.mode {
            LoopMode::Closed if self.window == 0 => return bad("closed loop needs window >= 1".into()),
            LoopMode::Open if self.rate_pps == 0 => {
                return bad(
                    "open loop needs rate_pps > 0 (0 means \"as fast as the window allows\", closed loop only)".into()
                )
            }
            LoopMode::Open if self.max_in_flight_per_flow == 0 => {
                return bad("max_in_flight_per_flow must be >= 1".into())
            }
            _ => {}
        }
        if !self.duration_s.is_finite() || self.duration_s < 0.0 {
            return bad(format!("duration_s must be a finite number >= 0, got {}", self.duration_s));
        }
        if self.loss_timeout_ms == 0 {
            return bad("loss_timeout_ms must be >= 1".into());
        }
        Ok(())
    }

    fn in_flight_cap(&self) -> usize {
        match self.mode {
            LoopMode::Closed => self.window as usize,
            LoopMode::Open => self.max_in_flight_per_flow as usize,
        }
    }
}

/// Per-flow record of a run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowRecord {
    pub flow: u32,
    pub guest_port: u16,
    pub partner_port: u16,
    pub requests: u64,
    pub responses: u64,
    /// Requests the NIC did not put into the guest (drop filter, no RX buffers, link down).
    pub not_delivered: u64,
    /// Requests per RX queue the NIC chose (index = queue).
    pub queue_counts: Vec<u64>,
    pub last_queue: Option<u16>,
    /// Requests steered by a filter (rest: RSS).
    pub via_filter: u64,
    pub last_filter: Option<u32>,
    /// How long, in ms up to the end of sending (or to now while running), the flow's
    /// delivered requests have all gone through RSS, none through a filter; `None` when its
    /// last delivered request hit a filter or none was delivered. Tells a flow that lost
    /// its filter a moment ago (a re-steer on the way) from one left without any.
    pub via_rss_only_ms: Option<u64>,
    /// Guest CPU that served the last response.
    pub last_cpu: Option<u32>,
    /// Responses per guest CPU (index = CPU).
    pub cpu_counts: Vec<u64>,
}

/// Link partner statistics (serializable; the runner copies them into the JSON report).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkStats {
    pub flows: u32,
    pub requests: u64,
    pub responses: u64,
    /// After `stop()`: requests - responses. While running: requests dropped from the
    /// in-flight table so far (timeout or overflow).
    pub lost: u64,
    /// Requests still waiting for a response (0 after `stop()`).
    pub in_flight: u64,
    pub rtt_us_p50: f64,
    pub rtt_us_p99: f64,
    pub rtt_us_max: f64,
    pub rtt_us_mean: f64,
    /// Seconds from the first request to the end of sending (or now).
    pub duration_s: f64,
    pub requests_per_s: f64,
    pub responses_per_s: f64,
    pub not_delivered: u64,
    pub per_flow: Vec<FlowRecord>,
    pub arp_requests_answered: u64,
    pub arp_requests_sent: u64,
    pub nd_solicitations_answered: u64,
    pub guest_mac: Option<MacAddr>,
    /// Frames on a flow's ports that are not a valid response to that flow.
    pub bad_responses: u64,
    /// Valid responses whose request was no longer outstanding.
    pub late_responses: u64,
    /// ICMP port-unreachable messages from the guest (requests that found no socket,
    /// typically sent before the guest workload was listening).
    pub port_unreachable: u64,
    /// Frames from the guest that are neither ARP/ND nor flow traffic.
    pub other_frames: u64,
    pub running: bool,
}

#[derive(Default)]
struct FlowState {
    next_seq: u32,
    /// (seq, send time), oldest first.
    inflight: VecDeque<(u32, Instant)>,
    rec: FlowRecord,
    /// First delivery of the current unbroken series through RSS (no filter hit).
    via_rss_since: Option<Instant>,
}

/// State of one run (start..stop); replaced by the next `start()`.
struct Run {
    cfg: PartnerConfig,
    flows: Vec<Mutex<FlowState>>,
    rtt: Mutex<Histogram<u64>>,
    stop: AtomicBool,
    sending: AtomicBool,
    finished: AtomicBool,
    stopped: AtomicBool,
    first_send: Mutex<Option<Instant>>,
    end_send: Mutex<Option<Instant>>,
    sender: Mutex<Option<Thread>>,
    dropped: AtomicU64,
    port_unreachable: AtomicU64,
    bad: AtomicU64,
    late: AtomicU64,
}

impl Run {
    fn new(cfg: PartnerConfig) -> Self {
        let flows = (0..cfg.flows)
            .map(|i| {
                Mutex::new(FlowState {
                    rec: FlowRecord {
                        flow: i,
                        guest_port: cfg.guest_base_port.wrapping_add(i as u16),
                        partner_port: cfg.partner_base_port.wrapping_add(i as u16),
                        ..Default::default()
                    },
                    inflight: VecDeque::with_capacity(cfg.in_flight_cap().min(64)),
                    next_seq: 0,
                    via_rss_since: None,
                })
            })
            .collect();
        // 1 µs .. 60 s, 3 significant digits.
        let rtt = Histogram::new_with_bounds(1, 60_000_000, 3).expect("static histogram bounds are valid");
        Run {
            cfg,
            flows,
            rtt: Mutex::new(rtt),
            stop: AtomicBool::new(false),
            sending: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            first_send: Mutex::new(None),
            end_send: Mutex::new(None),
            sender: Mutex::new(None),
            dropped: AtomicU64::new(0),
            port_unreachable: AtomicU64::new(0),
            bad: AtomicU64::new(0),
            late: AtomicU64::new(0),
        }
    }

    fn flow(&self, i: usize) -> Option<MutexGuard<'_, FlowState>> {
        self.flows.get(i).map(lock)
    }

    /// Drop in-flight entries older than the loss timeout.
    fn sweep(&self, now: Instant) {
        let timeout = Duration::from_millis(self.cfg.loss_timeout_ms);
        for f in &self.flows {
            let mut f = lock(f);
            while let Some(&(_, t)) = f.inflight.front() {
                if now.saturating_duration_since(t) < timeout {
                    break;
                }
                f.inflight.pop_front();
                self.dropped.fetch_add(1, Relaxed);
            }
        }
    }

    fn in_flight(&self) -> u64 {
        self.flows.iter().map(|f| lock(f).inflight.len() as u64).sum()
    }

    fn wake_sender(&self) {
        if let Some(t) = lock(&self.sender).as_ref() {
            t.unpark();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Inner {
    to_guest: Arc<dyn ToGuest>,
    run: ArcSwap<Run>,
    /// 0 = unknown, else the MAC in the low 48 bits | 1 << 63.
    guest_mac: AtomicU64,
    arp_answered: AtomicU64,
    arp_sent: AtomicU64,
    nd_answered: AtomicU64,
    other: AtomicU64,
}

const MAC_KNOWN: u64 = 1 << 63;

impl Inner {
    fn guest_mac(&self) -> Option<MacAddr> {
        let v = self.guest_mac.load(Relaxed);
        (v & MAC_KNOWN != 0).then(|| MacAddr::from_u64(v & !MAC_KNOWN))
    }

    fn learn(&self, mac: MacAddr) {
        if mac.is_unicast() {
            let v = mac.to_u64() | MAC_KNOWN;
            if self.guest_mac.swap(v, Relaxed) != v {
                log::debug!("link partner: guest MAC is {mac}");
                self.run.load().wake_sender();
            }
        }
    }

    fn send_arp_request(&self, cfg: &PartnerConfig) {
        let arp = ArpPacket::new(
            ArpHardwareId::ETHERNET,
            EtherType::IPV4,
            ArpOperation::REQUEST,
            &cfg.partner_mac.0,
            &cfg.partner_ipv4.octets(),
            &[0; 6],
            &cfg.guest_ipv4.octets(),
        );
        let Ok(arp) = arp else { return };
        let mut buf = Vec::with_capacity(42);
        if PacketBuilder::ethernet2(cfg.partner_mac.0, MacAddr::BROADCAST.0).arp(arp).write(&mut buf).is_ok() {
            self.arp_sent.fetch_add(1, Relaxed);
            let _ = self.to_guest.to_guest(&buf);
        }
    }

    fn handle_arp(&self, cfg: &PartnerConfig, a: &etherparse::ArpPacketSlice<'_>) {
        if a.hw_addr_type() != ArpHardwareId::ETHERNET
            || a.proto_addr_type() != EtherType::IPV4
            || a.hw_addr_size() != 6
            || a.proto_addr_size() != 4
        {
            self.other.fetch_add(1, Relaxed);
            return;
        }
        let (Ok(smac), Ok(sip), Ok(tip)) = (
            <[u8; 6]>::try_from(a.sender_hw_addr()),
            <[u8; 4]>::try_from(a.sender_protocol_addr()),
            <[u8; 4]>::try_from(a.target_protocol_addr()),
        ) else {
            self.other.fetch_add(1, Relaxed);
            return;
        };
        if Ipv4Addr::from(sip) == cfg.guest_ipv4 {
            self.learn(MacAddr(smac));
        }
        if a.operation() == ArpOperation::REQUEST && Ipv4Addr::from(tip) == cfg.partner_ipv4 {
            let smac = MacAddr(smac);
            if !smac.is_unicast() {
                return;
            }
            let Ok(reply) = ArpPacket::new(
                ArpHardwareId::ETHERNET,
                EtherType::IPV4,
                ArpOperation::REPLY,
                &cfg.partner_mac.0,
                &cfg.partner_ipv4.octets(),
                &smac.0,
                &sip,
            ) else {
                return;
            };
            let mut buf = Vec::with_capacity(42);
            if PacketBuilder::ethernet2(cfg.partner_mac.0, smac.0).arp(reply).write(&mut buf).is_ok() {
                self.arp_answered.fetch_add(1, Relaxed);
                let _ = self.to_guest.to_guest(&buf);
            }
        }
    }

    /// Neighbour solicitation for our IPv6 address -> solicited neighbour advertisement.
    fn handle_ns(&self, cfg: &PartnerConfig, eth_src: [u8; 6], src: Ipv6Addr, body: &[u8]) {
        let Some(ours) = cfg.partner_ipv6 else {
            self.other.fetch_add(1, Relaxed);
            return;
        };
        let Some(target) = body.get(..16).and_then(|t| <[u8; 16]>::try_from(t).ok()) else {
            self.other.fetch_add(1, Relaxed);
            return;
        };
        if Ipv6Addr::from(target) != ours {
            return;
        }
        // Source link-layer address option (type 1), else the Ethernet source.
        let mut opts = body.get(16..).unwrap_or(&[]);
        let mut dst_mac = eth_src;
        while opts.len() >= 8 {
            let len = usize::from(opts[1]) * 8;
            if len == 0 || len > opts.len() {
                break;
            }
            if opts[0] == 1 && len >= 8 {
                dst_mac.copy_from_slice(&opts[2..8]);
            }
            opts = &opts[len..];
        }
        let unspecified = src.is_unspecified();
        // DAD probe (source ::): answer to all-nodes, not solicited (RFC 4861 7.2.4).
        let (dst_ip, dst_mac) = if unspecified {
            (Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1), [0x33, 0x33, 0, 0, 0, 1])
        } else {
            (src, dst_mac)
        };
        if !unspecified && !MacAddr(dst_mac).is_unicast() {
            return;
        }
        let mut body = [0u8; 24];
        body[..16].copy_from_slice(&ours.octets());
        body[16] = 2; // target link-layer address
        body[17] = 1;
        body[18..24].copy_from_slice(&cfg.partner_mac.0);
        let na = Icmpv6Type::NeighborAdvertisement(NeighborAdvertisementHeader {
            router: false,
            solicited: !unspecified,
            r#override: true,
        });
        let mut buf = Vec::with_capacity(86);
        if PacketBuilder::ethernet2(cfg.partner_mac.0, dst_mac)
            .ipv6(ours.octets(), dst_ip.octets(), 255)
            .icmpv6(na)
            .write(&mut buf, &body)
            .is_ok()
        {
            self.nd_answered.fetch_add(1, Relaxed);
            let _ = self.to_guest.to_guest(&buf);
        }
    }

    fn handle_udp(&self, run: &Run, sport: u16, dport: u16, payload: &[u8], now: Instant) {
        let cfg = &run.cfg;
        let i = u32::from(sport.wrapping_sub(cfg.guest_base_port));
        if sport < cfg.guest_base_port || i >= cfg.flows {
            self.other.fetch_add(1, Relaxed);
            return;
        }
        if dport != cfg.partner_base_port.wrapping_add(i as u16) {
            run.bad.fetch_add(1, Relaxed);
            return;
        }
        let Ok(Header { flow, seq, cpu }) = Header::parse(payload) else {
            run.bad.fetch_add(1, Relaxed);
            return;
        };
        if flow != i || cpu >= MAX_CPUS {
            run.bad.fetch_add(1, Relaxed);
            return;
        }
        let Some(mut f) = run.flow(i as usize) else {
            return;
        };
        let Some(pos) = f.inflight.iter().position(|&(s, _)| s == seq) else {
            drop(f);
            run.late.fetch_add(1, Relaxed);
            return;
        };
        let full_before = f.inflight.len() >= cfg.in_flight_cap();
        let (_, sent) = f.inflight.remove(pos).unwrap_or((seq, now));
        f.rec.responses += 1;
        f.rec.last_cpu = Some(cpu);
        let c = cpu as usize;
        if f.rec.cpu_counts.len() <= c {
            f.rec.cpu_counts.resize(c + 1, 0);
        }
        f.rec.cpu_counts[c] += 1;
        drop(f);
        let us = now.saturating_duration_since(sent).as_micros().max(1);
        lock(&run.rtt).saturating_record(u64::try_from(us).unwrap_or(u64::MAX));
        if full_before && cfg.mode == LoopMode::Closed {
            run.wake_sender();
        }
    }

    fn send_request(&self, run: &Run, i: usize, dst: MacAddr, frame: &mut Vec<u8>, payload: &mut [u8]) {
        let cfg = &run.cfg;
        let cap = cfg.in_flight_cap();
        // One clock read per request: its send time, and when it started an RSS series.
        let now = Instant::now();
        let seq = {
            let Some(mut f) = run.flow(i) else { return };
            let seq = f.next_seq;
            f.next_seq = seq.wrapping_add(1);
            while f.inflight.len() >= cap {
                f.inflight.pop_front();
                run.dropped.fetch_add(1, Relaxed);
            }
            f.inflight.push_back((seq, now));
            f.rec.requests += 1;
            seq
        };
        Header::request(i as u32, seq).emit(payload);
        frame.clear();
        let built = PacketBuilder::ethernet2(cfg.partner_mac.0, dst.0)
            .ipv4(cfg.partner_ipv4.octets(), cfg.guest_ipv4.octets(), 64)
            .udp(cfg.partner_base_port.wrapping_add(i as u16), cfg.guest_base_port.wrapping_add(i as u16))
            .write(frame, payload);
        let d = if built.is_ok() {
            self.to_guest.to_guest(frame)
        } else {
            Delivery { queue: None, delivered: false, filter: None }
        };
        if let Some(mut f) = run.flow(i) {
            record_delivery(&mut f, d, now);
        }
    }
}

/// Per-flow record of where requests landed. Only frames that reached an RX ring count
/// for the queue histogram, the last queue and the filter fields: a frame the device
/// could not deliver (no buffers, drop filter) landed nowhere.
fn record_delivery(f: &mut FlowState, d: Delivery, now: Instant) {
    let rec = &mut f.rec;
    if !d.delivered {
        rec.not_delivered += 1;
        return;
    }
    if let Some(q) = d.queue {
        rec.last_queue = Some(q);
        if q < MAX_QUEUES {
            let q = usize::from(q);
            if rec.queue_counts.len() <= q {
                rec.queue_counts.resize(q + 1, 0);
            }
            rec.queue_counts[q] += 1;
        }
    }
    if let Some(id) = d.filter {
        rec.via_filter += 1;
        rec.last_filter = Some(id);
        f.via_rss_since = None;
    } else if f.via_rss_since.is_none() {
        f.via_rss_since = Some(now);
    }
}

/// The flow's record with `via_rss_only_ms` measured up to `end`.
fn flow_record(f: &FlowState, end: Instant) -> FlowRecord {
    let mut rec = f.rec.clone();
    rec.via_rss_only_ms =
        f.via_rss_since.map(|t| u64::try_from(end.saturating_duration_since(t).as_millis()).unwrap_or(u64::MAX));
    rec
}

fn sender_loop(inner: &Inner, run: &Run) {
    let cfg = &run.cfg;
    let nflows = run.flows.len();
    let cap = cfg.in_flight_cap();
    let mut frame = Vec::with_capacity(64 + cfg.payload);
    // The header is written per request; the padding stays.
    let mut payload = vec![0u8; cfg.payload];
    for (k, b) in payload.iter_mut().enumerate().skip(HEADER_LEN) {
        *b = k as u8;
    }
    let duration = (cfg.duration_s > 0.0).then(|| Duration::from_secs_f64(cfg.duration_s));
    let mut next_arp = Instant::now();
    let mut next_sweep = Instant::now() + SWEEP_EVERY;
    let mut cursor = 0usize;
    // Pacing: `sent` requests since `base`; due = elapsed * rate.
    let mut base: Option<Instant> = None;
    let mut sent: u64 = 0;
    // Open loop catches up to 50 ms of lag (the offered rate holds over short stalls);
    // closed loop only a burst (a full window is not a reason to flood later).
    let max_lag = match cfg.mode {
        LoopMode::Open => (cfg.rate_pps / 20).max(BURST),
        LoopMode::Closed => BURST,
    };
    while !run.stop.load(SeqCst) {
        let now = Instant::now();
        if now >= next_sweep {
            run.sweep(now);
            next_sweep = now + SWEEP_EVERY;
        }
        let first = *lock(&run.first_send);
        if let (Some(f), Some(d)) = (first, duration) {
            if now.saturating_duration_since(f) >= d {
                break;
            }
        }
        let Some(dst) = inner.guest_mac() else {
            if now >= next_arp {
                inner.send_arp_request(cfg);
                next_arp = now + ARP_RETRY;
            }
            std::thread::park_timeout(next_arp.saturating_duration_since(now).min(SWEEP_EVERY));
            continue;
        };
        if first.is_none() {
            *lock(&run.first_send) = Some(now);
            run.sending.store(true, SeqCst);
        }
        let start = *base.get_or_insert(now);
        let budget = if cfg.rate_pps > 0 {
            let elapsed = now.saturating_duration_since(start).as_nanos();
            let due = u64::try_from(elapsed * u128::from(cfg.rate_pps) / 1_000_000_000).unwrap_or(u64::MAX);
            if due.saturating_sub(sent) > max_lag {
                // Far behind (window-limited or descheduled): do not catch up with a flood.
                sent = due - max_lag;
            }
            due.saturating_sub(sent).min(BURST)
        } else {
            BURST
        };
        if budget == 0 {
            // Sleep until the next request is due (at most one sweep period).
            let next_ns = (u128::from(sent) + 1) * 1_000_000_000 / u128::from(cfg.rate_pps.max(1));
            let wait = Duration::from_nanos(u64::try_from(next_ns).unwrap_or(u64::MAX))
                .saturating_sub(now.saturating_duration_since(start));
            if wait > Duration::from_micros(50) {
                std::thread::park_timeout(wait.min(SWEEP_EVERY));
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        let mut n = 0u64;
        'send: while n < budget {
            // Next flow (round robin) with room in its window.
            let mut tries = 0;
            let i = loop {
                if tries == nflows {
                    break 'send;
                }
                let i = cursor;
                cursor = (cursor + 1) % nflows;
                tries += 1;
                if cfg.mode == LoopMode::Open {
                    break i;
                }
                if run.flow(i).is_some_and(|f| f.inflight.len() < cap) {
                    break i;
                }
            };
            inner.send_request(run, i, dst, &mut frame, &mut payload);
            n += 1;
            if run.stop.load(Relaxed) {
                break;
            }
        }
        sent += n;
        if n == 0 {
            // Every window is full: wait for a response (it unparks us) or the next sweep.
            std::thread::park_timeout(Duration::from_millis(1));
        }
    }
    *lock(&run.end_send) = Some(Instant::now());
    run.sending.store(false, SeqCst);
    run.finished.store(true, SeqCst);
}

/// The built-in link partner. Attach it to the NIC as its [`GuestPeer`]; it sends through the
/// [`ToGuest`] given to [`LinkPartner::new`].
pub struct LinkPartner {
    inner: Arc<Inner>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl LinkPartner {
    pub fn new(cfg: PartnerConfig, to_guest: Arc<dyn ToGuest>) -> Result<Arc<Self>, PartnerError> {
        cfg.validate()?;
        let mac = cfg.guest_mac.map(|m| m.to_u64() | MAC_KNOWN).unwrap_or(0);
        let run = Run::new(cfg);
        run.stopped.store(true, SeqCst);
        Ok(Arc::new(LinkPartner {
            inner: Arc::new(Inner {
                to_guest,
                run: ArcSwap::from_pointee(run),
                guest_mac: AtomicU64::new(mac),
                arp_answered: AtomicU64::new(0),
                arp_sent: AtomicU64::new(0),
                nd_answered: AtomicU64::new(0),
                other: AtomicU64::new(0),
            }),
            thread: Mutex::new(None),
        }))
    }

    /// The configuration of the current (or last) run.
    pub fn config(&self) -> PartnerConfig {
        self.inner.run.load().cfg.clone()
    }

    /// Replace the configuration for the next `start()` (only while stopped). Counters of
    /// the last run are discarded.
    pub fn reconfigure(&self, cfg: PartnerConfig) -> Result<(), PartnerError> {
        cfg.validate()?;
        let t = lock(&self.thread);
        if t.is_some() {
            return Err(PartnerError::Running);
        }
        if let Some(m) = cfg.guest_mac {
            self.inner.learn(m);
        }
        let run = Run::new(cfg);
        run.stopped.store(true, SeqCst);
        self.inner.run.store(Arc::new(run));
        Ok(())
    }

    /// Start a run: fresh counters, a new sender thread. ARP/ND answering works regardless.
    pub fn start(&self) -> Result<(), PartnerError> {
        let mut t = lock(&self.thread);
        if t.is_some() {
            return Err(PartnerError::Running);
        }
        let run = Arc::new(Run::new(self.inner.run.load().cfg.clone()));
        self.inner.run.store(run.clone());
        let inner = self.inner.clone();
        let r = run.clone();
        let h = std::thread::Builder::new()
            .name("link-partner".into())
            .spawn(move || sender_loop(&inner, &r))
            .map_err(|e| PartnerError::Spawn(e.to_string()))?;
        *lock(&run.sender) = Some(h.thread().clone());
        *t = Some(h);
        Ok(())
    }

    /// Whether the sender has sent its first request (the guest MAC is known).
    pub fn sending(&self) -> bool {
        self.inner.run.load().sending.load(SeqCst)
    }

    /// Whether the configured duration is over (the sender has ended by itself).
    pub fn finished(&self) -> bool {
        self.inner.run.load().finished.load(SeqCst)
    }

    /// Stop sending, wait up to `drain_ms` for the outstanding responses, then count what is
    /// still outstanding as lost (`lost = requests - responses`). Returns the final stats.
    pub fn stop(&self) -> LinkStats {
        let run = self.inner.run.load_full();
        run.stop.store(true, SeqCst);
        run.wake_sender();
        if let Some(h) = lock(&self.thread).take() {
            let _ = h.join();
        }
        if !run.stopped.load(SeqCst) {
            let deadline = Instant::now() + Duration::from_millis(run.cfg.drain_ms);
            // Requests older than the loss timeout are given up during the drain too.
            while Instant::now() < deadline && run.in_flight() > 0 {
                std::thread::sleep(Duration::from_millis(2));
                run.sweep(Instant::now());
            }
            for f in &run.flows {
                lock(f).inflight.clear();
            }
            run.stopped.store(true, SeqCst);
        }
        self.stats()
    }

    pub fn guest_mac(&self) -> Option<MacAddr> {
        self.inner.guest_mac()
    }

    /// Snapshot of the current (or last) run.
    pub fn stats(&self) -> LinkStats {
        let run = self.inner.run.load_full();
        let stopped = run.stopped.load(SeqCst);
        let end = lock(&run.end_send).unwrap_or_else(Instant::now);
        let per_flow: Vec<FlowRecord> = run.flows.iter().map(|f| flow_record(&lock(f), end)).collect();
        let in_flight = if stopped { 0 } else { run.in_flight() };
        let requests: u64 = per_flow.iter().map(|f| f.requests).sum();
        let responses: u64 = per_flow.iter().map(|f| f.responses).sum();
        let not_delivered = per_flow.iter().map(|f| f.not_delivered).sum();
        let lost = if stopped { requests.saturating_sub(responses) } else { run.dropped.load(Relaxed) };
        let (p50, p99, max, mean) = {
            let h = lock(&run.rtt);
            if h.is_empty() {
                (0.0, 0.0, 0.0, 0.0)
            } else {
                (h.value_at_quantile(0.5) as f64, h.value_at_quantile(0.99) as f64, h.max() as f64, h.mean())
            }
        };
        let first = *lock(&run.first_send);
        let duration_s = first.map(|f| end.saturating_duration_since(f).as_secs_f64()).unwrap_or(0.0);
        let per_s = |n: u64| {
            if duration_s > 0.0 {
                n as f64 / duration_s
            } else {
                0.0
            }
        };
        LinkStats {
            flows: run.cfg.flows,
            requests,
            responses,
            lost,
            in_flight,
            rtt_us_p50: p50,
            rtt_us_p99: p99,
            rtt_us_max: max,
            rtt_us_mean: mean,
            duration_s,
            requests_per_s: per_s(requests),
            responses_per_s: per_s(responses),
            not_delivered,
            per_flow,
            arp_requests_answered: self.inner.arp_answered.load(Relaxed),
            arp_requests_sent: self.inner.arp_sent.load(Relaxed),
            nd_solicitations_answered: self.inner.nd_answered.load(Relaxed),
            guest_mac: self.inner.guest_mac(),
            bad_responses: run.bad.load(Relaxed),
            late_responses: run.late.load(Relaxed),
            port_unreachable: run.port_unreachable.load(Relaxed),
            other_frames: self.inner.other.load(Relaxed),
            running: !stopped,
        }
    }
}

impl Drop for LinkPartner {
    fn drop(&mut self) {
        let run = self.inner.run.load_full();
        run.stop.store(true, SeqCst);
        run.wake_sender();
        if let Some(h) = lock(&self.thread).take() {
            let _ = h.join();
        }
    }
}

impl GuestPeer for LinkPartner {
    fn from_guest(&self, _pair: u16, frame: &[u8]) {
        let now = Instant::now();
        let inner = &*self.inner;
        let run = inner.run.load();
        let cfg = &run.cfg;
        let Ok(p) = SlicedPacket::from_ethernet(frame) else {
            inner.other.fetch_add(1, Relaxed);
            return;
        };
        let Some(LinkSlice::Ethernet2(eth)) = &p.link else {
            inner.other.fetch_add(1, Relaxed);
            return;
        };
        let eth_src = eth.source();
        if !p.link_exts.is_empty() {
            inner.other.fetch_add(1, Relaxed);
            return;
        }
        match (&p.net, &p.transport) {
            (Some(NetSlice::Arp(a)), _) => inner.handle_arp(cfg, a),
            (Some(NetSlice::Ipv4(ip)), t) => {
                let h = ip.header();
                if Ipv4Addr::from(h.source()) == cfg.guest_ipv4 {
                    inner.learn(MacAddr(eth_src));
                }
                match t {
                    Some(TransportSlice::Udp(u))
                        if Ipv4Addr::from(h.destination()) == cfg.partner_ipv4 && !ip.payload().fragmented =>
                    {
                        inner.handle_udp(&run, u.source_port(), u.destination_port(), u.payload(), now)
                    }
                    // Port unreachable: a request reached the guest before (or after) its
                    // echo server had the flow's socket.
                    Some(TransportSlice::Icmpv4(i)) if i.type_u8() == 3 && i.code_u8() == 3 => {
                        run.port_unreachable.fetch_add(1, Relaxed);
                    }
                    _ => {
                        inner.other.fetch_add(1, Relaxed);
                    }
                }
            }
            (Some(NetSlice::Ipv6(ip)), Some(TransportSlice::Icmpv6(icmp)))
                if icmp.icmp_type() == Icmpv6Type::NeighborSolicitation && ip.header().hop_limit() == 255 =>
            {
                inner.handle_ns(cfg, eth_src, ip.header().source_addr(), icmp.payload())
            }
            _ => {
                inner.other.fetch_add(1, Relaxed);
            }
        }
    }

    fn link(&self, up: bool) {
        if !up {
            // A new guest (or a reset one) may come back with another MAC: learn it again,
            // unless it was configured.
            let configured = self.inner.run.load().cfg.guest_mac;
            let v = configured.map(|m| m.to_u64() | MAC_KNOWN).unwrap_or(0);
            self.inner.guest_mac.store(v, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn via_rss_only_counts_from_the_first_rss_delivery_after_a_filter_hit() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let rss = Delivery { queue: Some(1), delivered: true, filter: None };
        let hit = Delivery { queue: Some(2), delivered: true, filter: Some(7) };
        let lost = Delivery { queue: None, delivered: false, filter: None };
        let mut f = FlowState::default();
        assert_eq!(flow_record(&f, at(50)).via_rss_only_ms, None, "nothing delivered yet");
        record_delivery(&mut f, lost, at(100));
        assert_eq!(flow_record(&f, at(150)).via_rss_only_ms, None, "an undelivered request landed nowhere");
        record_delivery(&mut f, rss, at(200));
        record_delivery(&mut f, rss, at(300));
        assert_eq!(flow_record(&f, at(1200)).via_rss_only_ms, Some(1000), "from the first RSS delivery");
        record_delivery(&mut f, hit, at(1300));
        assert_eq!(flow_record(&f, at(5000)).via_rss_only_ms, None, "a filter hit ends the series");
        record_delivery(&mut f, lost, at(1400));
        record_delivery(&mut f, rss, at(1500));
        record_delivery(&mut f, rss, at(1600));
        let r = flow_record(&f, at(1750));
        assert_eq!(r.via_rss_only_ms, Some(250));
        assert_eq!((r.via_filter, r.last_filter, r.not_delivered), (1, Some(7), 2));
        assert_eq!(r.queue_counts, vec![0, 4, 1]);
        assert_eq!(flow_record(&f, at(1000)).via_rss_only_ms, Some(0), "an end before the series is 0, not a panic");
    }

    #[test]
    fn config_defaults_and_validation() {
        let c = PartnerConfig::default();
        c.validate().unwrap();
        let c2: PartnerConfig = serde_json::from_str(r#"{"flows": 8, "mode": "open", "rate_pps": 1000}"#).unwrap();
        assert_eq!(c2.flows, 8);
        assert_eq!(c2.mode, LoopMode::Open);
        assert_eq!(c2.partner_mac, c.partner_mac);
        c2.validate().unwrap();
        let bad = [
            PartnerConfig { flows: 0, ..c.clone() },
            PartnerConfig { payload: 15, ..c.clone() },
            PartnerConfig { payload: 1473, ..c.clone() },
            PartnerConfig { guest_base_port: 65500, flows: 64, ..c.clone() },
            PartnerConfig { window: 0, ..c.clone() },
            PartnerConfig { mode: LoopMode::Open, rate_pps: 0, ..c.clone() },
            PartnerConfig { duration_s: f64::NAN, ..c.clone() },
        ];
        for b in bad {
            assert!(b.validate().is_err(), "{b:?}");
        }
        let j = serde_json::to_string(&c).unwrap();
        assert!(j.contains("\"02:a5:f1:00:00:01\""), "{j}");
        assert!(j.contains("\"10.99.0.1\""), "{j}");
    }
}
