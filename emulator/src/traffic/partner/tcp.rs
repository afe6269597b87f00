//! TCP traffic of the link partner, on smoltcp's TCP (no TCP of our own): the partner is
//! the client of the guest's `arfs-echo --proto tcp` server on `guest_base_port`.
//!
//! # Patterns (docs/scenarios.md, "TCP")
//! - `rr`: `flows` pooled connections, each a request/response loop of `payload`-byte
//!   messages: closed loop with `window` messages outstanding per connection, or open loop
//!   at `rate_pps` messages/s over all connections (rpc_press-like).
//! - `crr`: `flows` sockets; at `rate_pps` connections/s a free socket connects, sends one
//!   request, reads the response and closes (TCP_CRR-like). The partner closes first, so
//!   the socket spends smoltcp's TIME-WAIT (10 s) before it is free again: `flows` must be
//!   at least about `rate_pps` × 11 or connections are skipped (`no_free_socket`).
//!   With `tcp_close = Rst` the partner resets after the response instead: no TIME-WAIT on
//!   either side, the port is free at once, and a small `tcp_ports` range makes the same
//!   4-tuples come back within a fraction of a second (one listener port, a load tester's
//!   small 4-tuple space).
//! - `stream`: `flows` connections keep their send buffers full of messages; the guest
//!   (`--tcp-mode sink`) reads and discards. Throughput is acknowledged bytes over time.
//!
//! A message is the echo payload of [`crate::wire::echo`] (flow = connection slot, so the
//! guest's per-slot records line up with ours), `payload` bytes long on both sides.
//!
//! # Threads and bounds
//! One engine thread per run owns the smoltcp interface and sockets. Segments from the
//! guest come through a bounded channel (full: dropped and counted, TCP recovers); the
//! engine polls smoltcp, reads responses, paces new work and sleeps on the channel until
//! smoltcp's next timer or the next paced send. Socket buffers are allocated at the start
//! of the run and bounded by [`super::config`]'s checks.

use super::flows::{record_delivery, Run, MAX_CPUS};
use super::neighbor::ARP_RETRY;
use super::stats::TcpStats;
use super::tcp_wire::Wire;
use super::{lock, Inner, LoopMode, TcpClose, TcpPattern};
use crate::wire::echo::{Header, HEADER_LEN};
use hdrhistogram::Histogram;
use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::socket::tcp::{self, State};
use smoltcp::time::{Duration as SmolDuration, Instant as SmolInstant};
use smoltcp::wire::{HardwareAddress, IpAddress, IpCidr, IpEndpoint};
use std::collections::HashMap;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::time::{Duration, Instant};

/// Frames from the guest waiting for the engine.
pub(super) const INPUT_QUEUE: usize = 4096;
/// A connection attempt (or an established connection without progress) gives up after this.
const TCP_TIMEOUT: Duration = Duration::from_secs(3);
/// Our close waits this long for the FIN handshake, then aborts.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(3);
/// A pooled connection that failed is tried again after this.
const RECONNECT_AFTER: Duration = Duration::from_millis(100);
/// Longest sleep of the engine (stats are published at least this often).
const MAX_WAIT: Duration = Duration::from_millis(20);
/// Largest number of messages or connections started back to back.
const BURST: u64 = 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// No connection: free (CRR) or waiting to reconnect (pooled).
    Idle {
        retry_at: Instant,
    },
    Connecting {
        since: Instant,
    },
    Open,
    /// We closed; waiting for the FIN handshake.
    Closing {
        since: Instant,
    },
    /// TIME-WAIT: smoltcp frees the socket by itself.
    TimeWait,
}

struct Slot {
    handle: SocketHandle,
    phase: Phase,
    port: u16,
    /// The response being read.
    rx: Vec<u8>,
    fill: usize,
    /// SYN time of the current connection.
    started: Instant,
    /// Payload queued on the current connection, and the part of it acknowledged before.
    queued: u64,
    acked: u64,
}

/// Offered-rate pacing: `sent` items since `base`; what is due is elapsed × rate.
struct Pacer {
    base: Option<Instant>,
    sent: u64,
    rate: u64,
}

impl Pacer {
    /// How many items may go now (at most a burst; rate 0 = a burst every time).
    fn budget(&mut self, now: Instant) -> u64 {
        if self.rate == 0 {
            return BURST;
        }
        let start = *self.base.get_or_insert(now);
        let elapsed = now.saturating_duration_since(start).as_nanos();
        let due = u64::try_from(elapsed * u128::from(self.rate) / 1_000_000_000).unwrap_or(u64::MAX);
        // Catch up at most 50 ms of lag.
        let max_lag = (self.rate / 20).max(BURST);
        if due.saturating_sub(self.sent) > max_lag {
            self.sent = due - max_lag;
        }
        due.saturating_sub(self.sent).min(BURST)
    }

    /// Time until the next item is due.
    fn wait(&self, now: Instant) -> Duration {
        match (self.rate, self.base) {
            (0, _) | (_, None) => Duration::ZERO,
            (r, Some(b)) => {
                let next_ns = (u128::from(self.sent) + 1) * 1_000_000_000 / u128::from(r);
                Duration::from_nanos(u64::try_from(next_ns).unwrap_or(u64::MAX))
                    .saturating_sub(now.saturating_duration_since(b))
            }
        }
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("static histogram bounds are valid")
}

fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

fn quantile(h: &Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        h.value_at_quantile(q) as f64
    }
}

/// Per-socket buffer sizes (rx, tx) of a run; `config.rs` bounds their total.
pub(super) fn buffer_sizes(pattern: TcpPattern, msg: usize, outstanding: usize) -> (usize, usize) {
    let floor = msg.max(4096);
    match pattern {
        TcpPattern::Stream => (4096, (msg * 4).clamp(256 << 10, 1 << 20)),
        // One request per connection.
        TcpPattern::Crr => (floor, floor),
        TcpPattern::Rr => {
            let b = (msg * outstanding.max(1)).clamp(floor, 1 << 20);
            (b, b)
        }
    }
}

struct Engine<'r> {
    run: &'r Run,
    slots: Vec<Slot>,
    /// Partner port -> slot of the live connection using it.
    ports: HashMap<u16, usize>,
    next_port: u16,
    /// The request template: padding as for UDP, the header written per message.
    msg: Vec<u8>,
    stats: TcpStats,
    connect_h: Histogram<u64>,
    crr_h: Histogram<u64>,
    pacer: Pacer,
    cursor: usize,
    first_send: Option<Instant>,
    end_send: Option<Instant>,
}

fn now_smol(t0: Instant) -> SmolInstant {
    SmolInstant::from_micros(i64::try_from(t0.elapsed().as_micros()).unwrap_or(i64::MAX))
}

/// The engine thread of one TCP run: until `stop`, then a drain of the outstanding
/// responses (`drain_ms`) and a graceful close of every connection.
pub(super) fn tcp_loop(inner: &Inner, run: &Run) {
    let cfg = &run.cfg;
    let Some(input) = run.tcp_input.as_ref().map(|(_, r)| r.clone()) else {
        return;
    };
    let t0 = Instant::now();
    let mut wire = Wire::new(inner, cfg.partner_mac);
    let mut icfg = Config::new(HardwareAddress::Ip);
    icfg.random_seed = u64::from(t0.elapsed().subsec_nanos()) ^ std::process::id() as u64 ^ 0x9e37_79b9_7f4a_7c15;
    let mut iface = Interface::new(icfg, &mut wire, now_smol(t0));
    iface.update_ip_addrs(|a| {
        // Prefix 0: the guest is on the link whatever its address.
        let _ = a.push(IpCidr::new(IpAddress::Ipv4(cfg.partner_ipv4), 0));
    });
    let (rxb, txb) = buffer_sizes(cfg.tcp_pattern, cfg.payload, cfg.in_flight_cap());
    let mut sockets = SocketSet::new(Vec::new());
    let now = Instant::now();
    let slots = (0..cfg.flows as usize)
        .map(|_| {
            let mut s = tcp::Socket::new(tcp::SocketBuffer::new(vec![0; rxb]), tcp::SocketBuffer::new(vec![0; txb]));
            s.set_nagle_enabled(false);
            Slot {
                handle: sockets.add(s),
                phase: Phase::Idle { retry_at: now },
                port: 0,
                rx: vec![0; cfg.payload],
                fill: 0,
                started: now,
                queued: 0,
                acked: 0,
            }
        })
        .collect();
    let mut msg = vec![0u8; cfg.payload];
    for (k, b) in msg.iter_mut().enumerate().skip(HEADER_LEN) {
        *b = k as u8;
    }
    let pattern = match cfg.tcp_pattern {
        TcpPattern::Rr => "rr",
        TcpPattern::Crr => "crr",
        TcpPattern::Stream => "stream",
    };
    let rate = if cfg.tcp_pattern == TcpPattern::Stream { 0 } else { run.rate_pps.load(SeqCst) };
    let mut e = Engine {
        run,
        slots,
        ports: HashMap::new(),
        next_port: cfg.partner_base_port,
        msg,
        stats: TcpStats { pattern: pattern.into(), ..Default::default() },
        connect_h: histogram(),
        crr_h: histogram(),
        pacer: Pacer { base: None, sent: 0, rate },
        cursor: 0,
        first_send: None,
        end_send: None,
    };
    let duration = (cfg.duration_s > 0.0).then(|| Duration::from_secs_f64(cfg.duration_s));
    let mut next_arp = Instant::now();
    let mut next_publish = Instant::now();
    let mut drain_until: Option<Instant> = None;
    let mut close_until: Option<Instant> = None;
    loop {
        let now = Instant::now();
        while let Ok(f) = input.try_recv() {
            wire.rx.push_back(f);
        }
        wire.tx.guest_mac = inner.guest_mac();
        iface.poll(now_smol(t0), &mut wire, &mut sockets);
        e.service(&mut sockets, now);
        // Where the sending phase stands.
        let stopping = run.stop.load(SeqCst);
        if e.end_send.is_none() {
            let over = matches!((e.first_send, duration), (Some(f), Some(d)) if now.saturating_duration_since(f) >= d);
            if over || stopping {
                e.end_send = Some(now);
                *lock(&run.end_send) = Some(now);
                run.sending.store(false, SeqCst);
                run.finished.store(true, SeqCst);
            }
        }
        if e.end_send.is_none() {
            if wire.tx.guest_mac.is_none() {
                if now >= next_arp {
                    inner.send_arp_request(cfg);
                    next_arp = now + ARP_RETRY;
                }
            } else {
                if e.first_send.is_none() {
                    e.first_send = Some(now);
                    *lock(&run.first_send) = Some(now);
                    run.sending.store(true, SeqCst);
                }
                let r = run.rate_pps.load(Relaxed);
                if cfg.tcp_pattern != TcpPattern::Stream && r != e.pacer.rate {
                    e.pacer = Pacer { base: None, sent: 0, rate: r };
                }
                e.issue(&mut sockets, &mut iface, now);
            }
        }
        if stopping {
            let d = *drain_until.get_or_insert(now + Duration::from_millis(cfg.drain_ms));
            // A connection still in its handshake sends its request once established
            // (`service`), so the drain waits for it as for an outstanding response.
            if close_until.is_none() && (now >= d || (run.in_flight() == 0 && !e.any_connecting())) {
                e.close_all(&mut sockets);
                close_until = Some(now + CLOSE_TIMEOUT);
            }
            if let Some(c) = close_until {
                if now >= c || e.all_closed() {
                    iface.poll(now_smol(t0), &mut wire, &mut sockets);
                    e.service(&mut sockets, Instant::now());
                    e.account(&mut wire);
                    e.publish(&sockets, run);
                    break;
                }
            }
        }
        iface.poll(now_smol(t0), &mut wire, &mut sockets);
        e.account(&mut wire);
        if now >= next_publish {
            e.publish(&sockets, run);
            next_publish = now + Duration::from_millis(100);
        }
        // Sleep until a segment arrives, smoltcp's next timer or the next paced item.
        let mut wait =
            iface.poll_delay(now_smol(t0), &sockets).map_or(MAX_WAIT, |d| Duration::from_micros(d.total_micros()));
        wait = wait.min(MAX_WAIT);
        if e.end_send.is_none() && e.first_send.is_some() {
            wait = wait.min(e.pacer.wait(now));
        }
        if stopping {
            wait = wait.min(Duration::from_millis(2));
        }
        if !wait.is_zero() {
            if let Ok(f) = input.recv_timeout(wait) {
                wire.rx.push_back(f);
            }
        }
    }
    // Whatever is still outstanding is lost (`stats()` counts requests - responses).
    for f in &run.flows {
        lock(f).inflight.clear();
    }
    run.stopped.store(true, SeqCst);
}

impl Engine<'_> {
    /// A partner port for a new connection that no live connection uses.
    fn take_port(&mut self) -> Option<u16> {
        let base = self.run.cfg.partner_base_port;
        let span = match self.run.cfg.tcp_ports {
            0 => u32::from(u16::MAX - base) + 1,
            n => n.min(u32::from(u16::MAX - base) + 1),
        };
        let last = (u32::from(base) + span - 1) as u16;
        for _ in 0..span {
            let p = self.next_port;
            self.next_port = if p >= last { base } else { p + 1 };
            if !self.ports.contains_key(&p) {
                return Some(p);
            }
        }
        None
    }

    fn connect(&mut self, sockets: &mut SocketSet<'_>, iface: &mut Interface, i: usize, now: Instant) {
        let Some(port) = self.take_port() else {
            self.stats.no_free_socket += 1;
            return;
        };
        let cfg = &self.run.cfg;
        let s = sockets.get_mut::<tcp::Socket>(self.slots[i].handle);
        s.set_timeout(Some(SmolDuration::from_millis(TCP_TIMEOUT.as_millis() as u64)));
        let remote = IpEndpoint::new(IpAddress::Ipv4(cfg.guest_ipv4), cfg.guest_base_port);
        if s.connect(iface.context(), remote, port).is_err() {
            self.stats.connect_errors += 1;
            self.slots[i].phase = Phase::Idle { retry_at: now + RECONNECT_AFTER };
            return;
        }
        self.stats.connects += 1;
        self.ports.insert(port, i);
        let slot = &mut self.slots[i];
        slot.port = port;
        slot.phase = Phase::Connecting { since: now };
        slot.started = now;
        slot.fill = 0;
        slot.queued = 0;
        slot.acked = 0;
        if let Some(mut f) = self.run.flows.get(i).map(lock) {
            f.rec.partner_port = port;
        }
    }

    /// Queue one message on slot `i`'s connection if its send buffer has room; `track`: a
    /// request whose response is awaited.
    fn send_request(&mut self, s: &mut tcp::Socket<'_>, i: usize, now: Instant, track: bool) -> bool {
        if s.send_capacity() - s.send_queue() < self.msg.len() {
            return false;
        }
        let Some(mut f) = self.run.flows.get(i).map(lock) else { return false };
        let seq = f.next_seq;
        Header::request(i as u32, seq).emit(&mut self.msg);
        match s.send_slice(&self.msg) {
            Ok(n) if n == self.msg.len() => {}
            _ => return false,
        }
        f.next_seq = seq.wrapping_add(1);
        if track {
            // A request expects its response (stream messages do not: bytes count there).
            f.rec.requests += 1;
            if f.inflight.len() >= self.run.cfg.in_flight_cap() {
                f.inflight.pop_front();
                self.run.dropped.fetch_add(1, Relaxed);
            }
            f.inflight.push_back((seq, now));
        }
        drop(f);
        self.slots[i].queued += self.msg.len() as u64;
        self.stats.bytes_sent += self.msg.len() as u64;
        true
    }

    /// Start paced work: messages (rr), connections (crr), full send buffers (stream), and
    /// reconnect pooled connections that failed.
    fn issue(&mut self, sockets: &mut SocketSet<'_>, iface: &mut Interface, now: Instant) {
        let cfg = &self.run.cfg;
        let n = self.slots.len();
        if cfg.tcp_pattern != TcpPattern::Crr {
            for i in 0..n {
                if matches!(self.slots[i].phase, Phase::Idle { retry_at } if now >= retry_at) {
                    self.connect(sockets, iface, i, now);
                }
            }
        }
        match cfg.tcp_pattern {
            TcpPattern::Stream => {
                for i in 0..n {
                    if self.slots[i].phase == Phase::Open {
                        let s = sockets.get_mut::<tcp::Socket>(self.slots[i].handle);
                        let mut k = 0;
                        while k < 64 && self.send_request(s, i, now, false) {
                            k += 1;
                        }
                    }
                }
            }
            TcpPattern::Rr => {
                let budget = self.pacer.budget(now);
                let cap = cfg.in_flight_cap();
                let mut sent = 0;
                let mut tries = 0;
                while sent < budget && tries < n {
                    let i = self.cursor;
                    self.cursor = (self.cursor + 1) % n;
                    tries += 1;
                    if self.slots[i].phase != Phase::Open {
                        continue;
                    }
                    if cfg.mode == LoopMode::Closed && lock(&self.run.flows[i]).inflight.len() >= cap {
                        continue;
                    }
                    let s = sockets.get_mut::<tcp::Socket>(self.slots[i].handle);
                    if self.send_request(s, i, now, true) {
                        sent += 1;
                        tries = 0;
                    }
                }
                self.pacer.sent += sent;
            }
            TcpPattern::Crr => {
                let budget = self.pacer.budget(now);
                let mut started = 0;
                while started < budget {
                    let free = (0..n)
                        .map(|k| (self.cursor + k) % n)
                        .find(|&i| matches!(self.slots[i].phase, Phase::Idle { .. }));
                    let Some(i) = free else {
                        self.stats.no_free_socket += budget - started;
                        self.pacer.sent += budget - started;
                        return;
                    };
                    self.cursor = (i + 1) % n;
                    self.connect(sockets, iface, i, now);
                    started += 1;
                }
                self.pacer.sent += started;
            }
        }
    }

    /// Follow every connection's state; read responses.
    fn service(&mut self, sockets: &mut SocketSet<'_>, now: Instant) {
        let crr = self.run.cfg.tcp_pattern == TcpPattern::Crr;
        for i in 0..self.slots.len() {
            let handle = self.slots[i].handle;
            let state = sockets.get::<tcp::Socket>(handle).state();
            match self.slots[i].phase {
                Phase::Idle { .. } => {}
                Phase::Connecting { since } => match state {
                    State::Established => {
                        self.stats.established += 1;
                        self.connect_h.saturating_record(us(now.saturating_duration_since(since)));
                        self.slots[i].phase = Phase::Open;
                        if crr {
                            let s = sockets.get_mut::<tcp::Socket>(handle);
                            if !self.send_request(s, i, now, true) {
                                s.close();
                                self.slots[i].phase = Phase::Closing { since: now };
                            }
                        }
                    }
                    State::SynSent | State::SynReceived => {}
                    _ => {
                        self.stats.connect_errors += 1;
                        sockets.get_mut::<tcp::Socket>(handle).abort();
                        self.end_connection(i, now);
                    }
                },
                Phase::Open => {
                    self.read(sockets, i, now);
                    let s = sockets.get_mut::<tcp::Socket>(handle);
                    let st = s.state();
                    if st != State::Established && self.slots[i].phase == Phase::Open {
                        // Reset, timed out, or the guest closed first.
                        self.stats.resets += 1;
                        if st == State::CloseWait {
                            s.close();
                            self.slots[i].phase = Phase::Closing { since: now };
                        } else {
                            s.abort();
                            self.end_connection(i, now);
                        }
                    }
                }
                Phase::Closing { since } => {
                    self.read(sockets, i, now);
                    match state {
                        State::Closed => {
                            self.closed();
                            self.end_connection(i, now);
                        }
                        State::TimeWait => {
                            self.closed();
                            self.slots[i].phase = Phase::TimeWait;
                        }
                        _ if now.saturating_duration_since(since) >= CLOSE_TIMEOUT => {
                            self.stats.close_timeouts += 1;
                            sockets.get_mut::<tcp::Socket>(handle).abort();
                            self.end_connection(i, now);
                        }
                        _ => {}
                    }
                }
                Phase::TimeWait => {
                    if state == State::Closed {
                        self.end_connection(i, now);
                    }
                }
            }
            let slot = &mut self.slots[i];
            if matches!(slot.phase, Phase::Open | Phase::Closing { .. }) {
                let s = sockets.get::<tcp::Socket>(handle);
                let acked = slot.queued.saturating_sub(s.send_queue() as u64);
                self.stats.bytes_acked += acked.saturating_sub(slot.acked);
                slot.acked = acked;
            }
        }
    }

    /// Our close completed the FIN handshake.
    fn closed(&mut self) {
        self.stats.closes += 1;
        if self.run.cfg.tcp_pattern == TcpPattern::Crr {
            self.stats.crr_completed += 1;
        }
    }

    /// The slot's connection is gone: free its port, reconnect later (pooled) or now (CRR).
    fn end_connection(&mut self, i: usize, now: Instant) {
        let slot = &mut self.slots[i];
        self.ports.remove(&slot.port);
        let retry_at = if self.run.cfg.tcp_pattern == TcpPattern::Crr { now } else { now + RECONNECT_AFTER };
        slot.phase = Phase::Idle { retry_at };
        slot.fill = 0;
        // Requests of a dead connection will not be answered.
        if let Some(mut f) = self.run.flows.get(i).map(lock) {
            let n = f.inflight.len() as u64;
            f.inflight.clear();
            self.run.dropped.fetch_add(n, Relaxed);
        }
    }

    /// Read what the guest sent on slot `i`: whole responses are matched to requests.
    fn read(&mut self, sockets: &mut SocketSet<'_>, i: usize, now: Instant) {
        let handle = self.slots[i].handle;
        let msg = self.msg.len();
        loop {
            let s = sockets.get_mut::<tcp::Socket>(handle);
            if !s.can_recv() {
                return;
            }
            let slot = &mut self.slots[i];
            let Ok(n) = s.recv_slice(&mut slot.rx[slot.fill..msg]) else { return };
            if n == 0 {
                return;
            }
            self.stats.bytes_received += n as u64;
            slot.fill += n;
            if slot.fill < msg {
                continue;
            }
            slot.fill = 0;
            if self.run.cfg.tcp_pattern == TcpPattern::Stream {
                // The sink sends nothing; anything is unexpected.
                self.run.bad.fetch_add(1, Relaxed);
                continue;
            }
            self.response(i, now);
            if self.run.cfg.tcp_pattern == TcpPattern::Crr && self.slots[i].phase == Phase::Open {
                self.crr_h.saturating_record(us(now.saturating_duration_since(self.slots[i].started)));
                let s = sockets.get_mut::<tcp::Socket>(handle);
                if self.run.cfg.tcp_close == TcpClose::Rst {
                    // The RST leaves with the next poll; the slot waits in TimeWait (not
                    // Idle) until then, so no new connect() reuses the socket first.
                    s.abort();
                    self.closed();
                    self.slots[i].phase = Phase::TimeWait;
                } else {
                    s.close();
                    self.slots[i].phase = Phase::Closing { since: now };
                }
                return;
            }
        }
    }

    /// A whole response in slot `i`'s buffer.
    fn response(&mut self, i: usize, now: Instant) {
        let run = self.run;
        let Ok(Header { flow, seq, cpu }) = Header::parse(&self.slots[i].rx) else {
            run.bad.fetch_add(1, Relaxed);
            return;
        };
        if flow != i as u32 || cpu >= MAX_CPUS {
            run.bad.fetch_add(1, Relaxed);
            return;
        }
        run.complete(i, seq, cpu, now);
    }

    /// Where the NIC put each segment sent since the last call, and the wire counters.
    fn account(&mut self, wire: &mut Wire<'_>) {
        let now = Instant::now();
        for (port, d) in wire.tx.deliveries.drain(..) {
            if let Some(&i) = self.ports.get(&port) {
                if let Some(mut f) = self.run.flows.get(i).map(lock) {
                    record_delivery(&mut f, d, now);
                }
            }
        }
        self.stats.segments_sent = wire.tx.segments;
        self.stats.retransmits = wire.tx.retransmits;
    }

    fn any_connecting(&self) -> bool {
        self.slots.iter().any(|s| matches!(s.phase, Phase::Connecting { .. }))
    }

    fn close_all(&mut self, sockets: &mut SocketSet<'_>) {
        let now = Instant::now();
        let crr = self.run.cfg.tcp_pattern == TcpPattern::Crr;
        for i in 0..self.slots.len() {
            let s = sockets.get_mut::<tcp::Socket>(self.slots[i].handle);
            match self.slots[i].phase {
                Phase::Open if crr => {
                    // Its response did not come within the drain: not a completed CRR.
                    self.stats.cut_at_stop += 1;
                    s.abort();
                    self.end_connection(i, now);
                    self.slots[i].phase = Phase::Idle { retry_at: now + Duration::from_secs(3600) };
                }
                Phase::Open => {
                    s.close();
                    self.slots[i].phase = Phase::Closing { since: now };
                }
                Phase::Connecting { .. } => {
                    self.stats.cut_at_stop += 1;
                    s.abort();
                    self.slots[i].phase = Phase::Idle { retry_at: now + Duration::from_secs(3600) };
                }
                Phase::Idle { .. } => self.slots[i].phase = Phase::Idle { retry_at: now + Duration::from_secs(3600) },
                _ => {}
            }
        }
    }

    fn all_closed(&self) -> bool {
        self.slots.iter().all(|s| matches!(s.phase, Phase::Idle { .. } | Phase::TimeWait))
    }

    /// Copy the counters where `LinkPartner::stats()` reads them.
    fn publish(&mut self, sockets: &SocketSet<'_>, run: &Run) {
        let s = &mut self.stats;
        s.open = self.slots.iter().filter(|x| x.phase == Phase::Open).count() as u64;
        s.time_wait =
            self.slots.iter().filter(|x| sockets.get::<tcp::Socket>(x.handle).state() == State::TimeWait).count()
                as u64;
        s.rx_dropped = run.tcp_rx_dropped.load(Relaxed);
        s.connect_us_p50 = quantile(&self.connect_h, 0.5);
        s.connect_us_p99 = quantile(&self.connect_h, 0.99);
        s.crr_us_p50 = quantile(&self.crr_h, 0.5);
        s.crr_us_p99 = quantile(&self.crr_h, 0.99);
        let secs = match (self.first_send, self.end_send) {
            (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f64(),
            (Some(a), None) => a.elapsed().as_secs_f64(),
            _ => 0.0,
        };
        s.throughput_mbps = if secs > 0.0 { s.bytes_acked as f64 * 8.0 / secs / 1e6 } else { 0.0 };
        *lock(&run.tcp) = Some(s.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacer_paces_and_caps_the_catch_up() {
        let t0 = Instant::now();
        let mut p = Pacer { base: None, sent: 0, rate: 1000 };
        assert_eq!(p.budget(t0), 0, "nothing is due at the start");
        assert_eq!(p.budget(t0 + Duration::from_millis(10)), 10);
        p.sent += 10;
        assert!(p.wait(t0 + Duration::from_millis(10)) <= Duration::from_millis(1));
        // Far behind: at most 50 ms of lag is caught up, a burst at a time.
        assert_eq!(p.budget(t0 + Duration::from_secs(10)), BURST);
        assert_eq!(p.sent, 10_000 - 50);
        let mut unpaced = Pacer { base: None, sent: 0, rate: 0 };
        assert_eq!(unpaced.budget(t0), BURST);
    }

    #[test]
    fn buffers_hold_the_outstanding_messages_within_bounds() {
        assert_eq!(buffer_sizes(TcpPattern::Rr, 64, 1), (4096, 4096));
        assert_eq!(buffer_sizes(TcpPattern::Rr, 1000, 16), (16000, 16000));
        assert_eq!(buffer_sizes(TcpPattern::Rr, 65536, 1024), (1 << 20, 1 << 20));
        assert_eq!(buffer_sizes(TcpPattern::Stream, 64, 1).1, 256 << 10);
        assert_eq!(buffer_sizes(TcpPattern::Crr, 64, 1024), (4096, 4096), "a CRR socket holds one request");
    }
}
