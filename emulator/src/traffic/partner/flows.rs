//! The flows of one run: per-flow in-flight tables and records, the paced sender loop,
//! response matching (RTT, CPU) and where the NIC put each request (queue, filter, and
//! how long a flow has gone through RSS only).

use super::neighbor::ARP_RETRY;
use super::stats::{FlowRecord, Rtt, TcpStats};
use super::tcp::INPUT_QUEUE;
use super::{lock, Inner, LoopMode, PartnerConfig, Proto};
use crate::traffic::Delivery;
use crate::wire::echo::{Header, HEADER_LEN};
use crate::wire::ethernet::MacAddr;
use crossbeam_channel::{Receiver, Sender};
use etherparse::PacketBuilder;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Mutex, MutexGuard};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// CPU numbers in responses at or above this are treated as malformed (bounds `cpu_counts`).
pub(super) const MAX_CPUS: u32 = 4096;
/// Queue numbers at or above this are not histogrammed (bounds `queue_counts`).
const MAX_QUEUES: u16 = 1024;
/// Largest number of requests the pacer sends back to back.
const BURST: u64 = 32;
const SWEEP_EVERY: Duration = Duration::from_millis(10);

#[derive(Default)]
pub(super) struct FlowState {
    pub(super) next_seq: u32,
    /// (seq, send time), oldest first.
    pub(super) inflight: VecDeque<(u32, Instant)>,
    pub(super) rec: FlowRecord,
    /// First delivery of the current unbroken series through RSS (no filter hit).
    via_rss_since: Option<Instant>,
}

/// The TCP engine's input: IPv4 packets from the guest (bounded, `tcp::INPUT_QUEUE`).
pub(super) type SegmentQueue = (Sender<Vec<u8>>, Receiver<Vec<u8>>);

/// State of one run (start..stop); replaced by the next `start()`.
pub(super) struct Run {
    pub(super) cfg: PartnerConfig,
    pub(super) flows: Vec<Mutex<FlowState>>,
    pub(super) rtt: Rtt,
    pub(super) stop: AtomicBool,
    pub(super) sending: AtomicBool,
    pub(super) finished: AtomicBool,
    pub(super) stopped: AtomicBool,
    pub(super) first_send: Mutex<Option<Instant>>,
    pub(super) end_send: Mutex<Option<Instant>>,
    pub(super) sender: Mutex<Option<Thread>>,
    pub(super) dropped: AtomicU64,
    pub(super) port_unreachable: AtomicU64,
    pub(super) bad: AtomicU64,
    pub(super) late: AtomicU64,
    /// The pacing rate now (open loop, or the closed loop's cap): `cfg.rate_pps` until
    /// [`super::LinkPartner::set_rate`] changes it mid-run.
    pub(super) rate_pps: AtomicU64,
    /// TCP runs: segments from the guest on their way to the engine (`tcp.rs`), the ones
    /// dropped because the queue was full, and the engine's last published counters.
    pub(super) tcp_input: Option<SegmentQueue>,
    pub(super) tcp_rx_dropped: AtomicU64,
    pub(super) tcp: Mutex<Option<TcpStats>>,
}

impl Run {
    pub(super) fn new(cfg: PartnerConfig) -> Self {
        let flows = (0..cfg.flows)
            .map(|i| {
                Mutex::new(FlowState {
                    rec: FlowRecord {
                        flow: i,
                        // TCP: every connection goes to the one server port.
                        guest_port: match cfg.proto {
                            Proto::Udp => cfg.guest_base_port.wrapping_add(i as u16),
                            Proto::Tcp => cfg.guest_base_port,
                        },
                        partner_port: cfg.partner_base_port.wrapping_add(i as u16),
                        ..Default::default()
                    },
                    inflight: VecDeque::with_capacity(cfg.in_flight_cap().min(64)),
                    next_seq: 0,
                    via_rss_since: None,
                })
            })
            .collect();
        let tcp_input = (cfg.proto == Proto::Tcp).then(|| crossbeam_channel::bounded(INPUT_QUEUE));
        Run {
            tcp_input,
            tcp_rx_dropped: AtomicU64::new(0),
            tcp: Mutex::new(None),
            rate_pps: AtomicU64::new(cfg.rate_pps),
            cfg,
            flows,
            rtt: Rtt::new(),
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
    pub(super) fn sweep(&self, now: Instant) {
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

    /// A valid response `seq` on flow `i` from guest CPU `cpu` (UDP and TCP): its request
    /// leaves the in-flight table, the flow's CPU histogram and the RTT record it. Returns
    /// whether the flow's table was full before (a closed loop's sender waits for room),
    /// or `None` when the request was not outstanding (counted late).
    pub(super) fn complete(&self, i: usize, seq: u32, cpu: u32, now: Instant) -> Option<bool> {
        let mut f = self.flow(i)?;
        let Some(pos) = f.inflight.iter().position(|&(s, _)| s == seq) else {
            drop(f);
            self.late.fetch_add(1, Relaxed);
            return None;
        };
        let full_before = f.inflight.len() >= self.cfg.in_flight_cap();
        let (_, sent) = f.inflight.remove(pos).unwrap_or((seq, now));
        f.rec.responses += 1;
        f.rec.last_cpu = Some(cpu);
        let c = cpu as usize;
        if f.rec.cpu_counts.len() <= c {
            f.rec.cpu_counts.resize(c + 1, 0);
        }
        f.rec.cpu_counts[c] += 1;
        drop(f);
        self.rtt.record(now.saturating_duration_since(sent));
        Some(full_before)
    }

    pub(super) fn in_flight(&self) -> u64 {
        self.flows.iter().map(|f| lock(f).inflight.len() as u64).sum()
    }

    pub(super) fn wake_sender(&self) {
        if let Some(t) = lock(&self.sender).as_ref() {
            t.unpark();
        }
    }
}

impl Inner {
    /// A UDP datagram from the guest to the partner's address, from `sport` to `dport`.
    pub(super) fn handle_udp(&self, run: &Run, sport: u16, dport: u16, payload: &[u8], now: Instant) {
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
        let full_before = run.complete(i as usize, seq, cpu, now);
        if full_before == Some(true) && cfg.mode == LoopMode::Closed {
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
pub(super) fn record_delivery(f: &mut FlowState, d: Delivery, now: Instant) {
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
pub(super) fn flow_record(f: &FlowState, end: Instant) -> FlowRecord {
    let mut rec = f.rec.clone();
    rec.via_rss_only_ms =
        f.via_rss_since.map(|t| u64::try_from(end.saturating_duration_since(t).as_millis()).unwrap_or(u64::MAX));
    rec
}

/// The sender thread of one run: ARP for the guest until its MAC is known, then paced
/// requests round robin over the flows until the duration is over or `stop` is set.
pub(super) fn sender_loop(inner: &Inner, run: &Run) {
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
    let lag_for = |rate: u64| match cfg.mode {
        LoopMode::Open => (rate / 20).max(BURST),
        LoopMode::Closed => BURST,
    };
    let mut rate = run.rate_pps.load(SeqCst);
    let mut max_lag = lag_for(rate);
    while !run.stop.load(SeqCst) {
        let now = Instant::now();
        let r = run.rate_pps.load(Relaxed);
        if r != rate {
            // A new rate counts from now.
            (rate, max_lag, sent) = (r, lag_for(r), 0);
            base = base.map(|_| now);
        }
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
        let budget = if rate > 0 {
            let elapsed = now.saturating_duration_since(start).as_nanos();
            let due = u64::try_from(elapsed * u128::from(rate) / 1_000_000_000).unwrap_or(u64::MAX);
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
            let next_ns = (u128::from(sent) + 1) * 1_000_000_000 / u128::from(rate.max(1));
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
}
