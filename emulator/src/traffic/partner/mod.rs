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
//!
//! # Files
//! `config.rs` (what a run is asked to do), `neighbor.rs` (ARP and IPv6 ND, the guest's
//! MAC), `flows.rs` (per-flow state, the UDP sender loop, response matching), `tcp.rs`
//! (TCP connections on smoltcp: pooled request/response, connect-request-response-close,
//! bulk stream) with `tcp_wire.rs` (smoltcp's device on the emulated wire), `stats.rs`
//! (records and the RTT histogram); this file joins them into [`LinkPartner`].

mod config;
mod flows;
mod neighbor;
mod stats;
mod tcp;
mod tcp_wire;

pub use self::config::{LoopMode, PartnerConfig, PartnerError, Proto, TcpClose, TcpPattern, MAX_TCP_MSG};
pub use self::stats::{FlowRecord, LinkStats, TcpStats};
pub use crate::wire::echo::{echo_response, request_ids};
pub use crate::wire::ethernet::MacAddr;

use self::flows::{flow_record, sender_loop, Run};
use self::neighbor::GuestMac;
use crate::sync::lock;
use crate::traffic::{GuestPeer, ToGuest};
use arc_swap::ArcSwap;
use etherparse::{Icmpv6Type, LinkSlice, NetSlice, SlicedPacket, TransportSlice};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What outlives a run: the way to the guest, the current run, the guest's MAC and the
/// neighbour counters.
struct Inner {
    to_guest: Arc<dyn ToGuest>,
    run: ArcSwap<Run>,
    guest_mac: GuestMac,
    arp_answered: AtomicU64,
    arp_sent: AtomicU64,
    nd_answered: AtomicU64,
    other: AtomicU64,
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
        let guest_mac = GuestMac::new(cfg.guest_mac);
        let run = Run::new(cfg);
        run.stopped.store(true, SeqCst);
        Ok(Arc::new(LinkPartner {
            inner: Arc::new(Inner {
                to_guest,
                run: ArcSwap::from_pointee(run),
                guest_mac,
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
        let tcp = run.cfg.proto == Proto::Tcp;
        let h = std::thread::Builder::new()
            .name(if tcp { "link-partner-tcp" } else { "link-partner" }.into())
            .spawn(move || if tcp { tcp::tcp_loop(&inner, &r) } else { sender_loop(&inner, &r) })
            .map_err(|e| PartnerError::Spawn(e.to_string()))?;
        *lock(&run.sender) = Some(h.thread().clone());
        *t = Some(h);
        Ok(())
    }

    /// Change the pacing rate of the running (or next) run from now on; the configuration
    /// keeps the rate the run started with. An open loop needs a rate above 0.
    pub fn set_rate(&self, rate_pps: u64) -> Result<(), PartnerError> {
        let run = self.inner.run.load_full();
        if run.cfg.mode == LoopMode::Open && rate_pps == 0 {
            return Err(PartnerError::Config("open loop needs rate_pps > 0".into()));
        }
        run.rate_pps.store(rate_pps, SeqCst);
        run.wake_sender();
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
        let rtt = run.rtt.summary();
        let tcp = lock(&run.tcp).clone();
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
            rtt_us_p50: rtt.p50,
            rtt_us_p99: rtt.p99,
            rtt_us_max: rtt.max,
            rtt_us_mean: rtt.mean,
            rtt_hist_log2_us: rtt.log2_us,
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
            tcp,
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
                        if cfg.proto == Proto::Udp
                            && Ipv4Addr::from(h.destination()) == cfg.partner_ipv4
                            && !ip.payload().fragmented =>
                    {
                        inner.handle_udp(&run, u.source_port(), u.destination_port(), u.payload(), now)
                    }
                    // A segment for the TCP engine: the IPv4 packet, as long as its header says.
                    Some(TransportSlice::Tcp(_))
                        if Ipv4Addr::from(h.destination()) == cfg.partner_ipv4 && !ip.payload().fragmented =>
                    {
                        let len = usize::from(h.total_len());
                        match (&run.tcp_input, frame.get(14..14 + len)) {
                            (Some((tx, _)), Some(pkt)) => {
                                if tx.try_send(pkt.to_vec()).is_err() {
                                    run.tcp_rx_dropped.fetch_add(1, Relaxed);
                                }
                            }
                            _ => {
                                inner.other.fetch_add(1, Relaxed);
                            }
                        }
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
            self.inner.guest_mac.reset(configured);
        }
    }
}
