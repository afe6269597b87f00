//! The device side of the in-band control protocol (docs/control-protocol.md): control
//! frames from any TX queue are decoded on the calling (vhost worker) thread and enter
//! the command engine with a wall-clock timestamp; one timer thread sleeps until the
//! engine's next deadline, advances it, and sends completions and events back as frames.
//!
//! Where frames go:
//! - the completion of a request goes to the RX queue of the queue pair whose TX queue
//!   carried the request (the engine tag encodes pair and seq): under XPS the completion
//!   interrupt then lands near the CPU that sent the request, and no single queue carries
//!   all control traffic;
//! - events (rule aged, table flushed, engine state) go to RX queue 0;
//! - `EmulatedNic::send_control` falls back to the lowest enabled queue when that queue is
//!   disabled, and a queue without RX buffers drops the frame (counted).
//!
//! Locking: the engine and all protocol state sit behind one mutex; frames are encoded
//! under it and sent after it is released, so no vring lock is ever taken while holding
//! it (the vhost worker calls in with its TX vring locked).
//!
//! Hostile input: every frame is decoded without panicking; allocation is bounded by the
//! frame (STATS) or by fixed caps (time series, one entry per u16 counter id).

use crate::clock::Clock;
use crate::device::{ControlPlane, EmulatedNic};
use crate::model::engine::{Completion, Engine, EngineStats, Event, Fault, Op, Output};
use crate::model::filter::{Action, FilterTable, Layout, PartitionStats, RuleSnapshot};
use crate::model::profile::Profile;
use crate::vhost::RxError;
use crate::wire::control::{
    self as wire, counter, Caps, CompletionBody, CompletionMsg, CounterId, DecodeError, EventMsg, Header, Request,
    LAT_HIST_BUCKETS,
};
use crate::wire::FlowKey;
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// Where the runtime puts device frames: the emulated NIC's RX queues, or a capture in
/// tests.
pub trait ControlSink: Send + Sync + 'static {
    /// Put `frame` on the RX queue of `pair`; returns the queue actually used.
    fn send(&self, pair: u16, frame: &[u8]) -> Result<u16, RxError>;
}

impl ControlSink for Weak<EmulatedNic> {
    fn send(&self, pair: u16, frame: &[u8]) -> Result<u16, RxError> {
        self.upgrade().ok_or(RxError::NotReady)?.send_control(pair, frame)
    }
}

/// Samples of the guest's cumulative counters kept for rate computations (at the
/// driver's 100 ms period: about 1.8 hours). The oldest are dropped beyond this.
pub const MAX_SERIES: usize = 1 << 16;

/// Queue pair whose RX queue carries events.
pub const EVENT_PAIR: u16 = 0;

/// Engine tag of a request: bit 48 no-reply, bits 32..48 the queue pair, 0..32 the seq.
fn tag(pair: u16, seq: u32, no_reply: bool) -> u64 {
    (u64::from(no_reply) << 48) | (u64::from(pair) << 32) | u64::from(seq)
}

fn untag(tag: u64) -> (u16, u32, bool) {
    ((tag >> 32) as u16, tag as u32, tag >> 48 & 1 == 1)
}

/// Whether a request (well-formed or not) must stay unanswered: STATS never gets an
/// answer, and neither does anything with the NO_REPLY flag.
fn no_reply(h: &Header) -> bool {
    h.op == wire::op::STATS || h.flags & wire::FLAG_NO_REPLY != 0
}

fn wire_op(op: Op) -> u8 {
    match op {
        Op::Add => wire::op::ADD,
        Op::Mod => wire::op::MOD,
        Op::Del => wire::op::DEL,
        Op::Flush => wire::op::FLUSH,
        Op::Query => wire::op::QUERY,
    }
}

fn status16(errno: i32) -> u16 {
    u16::try_from(errno).unwrap_or(libc::EIO as u16)
}

/// One sample of the guest's cumulative counters, taken when a STATS frame arrived.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StatsSample {
    /// Device clock (ns) at arrival.
    pub t_ns: u64,
    pub steer_calls: u64,
    pub adds_ok: u64,
    pub mods_ok: u64,
    pub dels_ok: u64,
    pub lock_acquired: u64,
    pub lock_contended: u64,
    pub lock_wait_ns: u64,
}

/// Rates between two STATS samples.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct GuestRates {
    pub from_ns: u64,
    pub to_ns: u64,
    pub window_s: f64,
    pub steer_calls_per_s: f64,
    pub adds_per_s: f64,
    pub mods_per_s: f64,
    pub dels_per_s: f64,
    /// Contended `arfs_lock` acquisitions in the window, % of all acquisitions.
    pub lock_contended_pct: f64,
    /// Time spent waiting for `arfs_lock` in the window, µs per second of wall time.
    pub lock_wait_us_per_s: f64,
}

/// A latency percentile from the guest's log2 histogram: the bucket it falls in,
/// `[lo_us, hi_us)` (`hi_us` is `None` for the last, open bucket).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct BucketPercentile {
    pub lo_us: f64,
    pub hi_us: Option<f64>,
}

/// Percentile `q` (0..=1) of a log2 µs histogram (`buckets[i]` counts [2^i, 2^(i+1)) µs,
/// bucket 0 also < 1 µs). `None` when it is empty.
pub fn hist_percentile(buckets: &[u64], q: f64) -> Option<BucketPercentile> {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
    let mut seen = 0u64;
    for (i, &n) in buckets.iter().enumerate() {
        seen += n;
        if seen >= rank {
            let lo = if i == 0 { 0.0 } else { (1u64 << i.min(63)) as f64 };
            let hi = (i + 1 < buckets.len()).then(|| (1u64 << (i + 1).min(63)) as f64);
            return Some(BucketPercentile { lo_us: lo, hi_us: hi });
        }
    }
    None
}

/// The guest driver's counters from its latest STATS frame.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GuestStats {
    /// Device clock (ns) when the latest STATS frame arrived.
    pub received_ns: u64,
    /// STATS frames received.
    pub reports: u64,
    /// Latest value of every counter except the latency buckets, by protocol name
    /// (`steer_calls`, …, `add_err_ENOSPC`, `unknown_0x0815`).
    pub counters: BTreeMap<String, u64>,
    /// Command round trips as seen by the driver: bucket i = [2^i, 2^(i+1)) µs.
    pub lat_hist_us: Vec<u64>,
    pub lat_us_p50: Option<BucketPercentile>,
    pub lat_us_p90: Option<BucketPercentile>,
    pub lat_us_p99: Option<BucketPercentile>,
    /// ADD/MOD/DEL failures by errno name (from ids 0x200/0x300/0x400 + errno).
    pub add_errors: BTreeMap<String, u64>,
    pub mod_errors: BTreeMap<String, u64>,
    pub del_errors: BTreeMap<String, u64>,
    /// Rates over the whole time series (first to last sample).
    pub rates: Option<GuestRates>,
}

/// The device's filter counters, in the shape of the report's `device.filter` object.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct FilterSummary {
    /// Commands that completed successfully.
    pub adds: u64,
    pub mods: u64,
    pub dels: u64,
    pub flushes: u64,
    pub queries: u64,
    /// Failed commands of every op by errno name (engine rejections, injected faults,
    /// table errors); malformed frames are counted in `frames` instead.
    pub rejects: BTreeMap<String, u64>,
    pub add_rejects: BTreeMap<String, u64>,
    pub mod_rejects: BTreeMap<String, u64>,
    pub del_rejects: BTreeMap<String, u64>,
    pub rules_now: usize,
    /// Highest rule count seen after any engine step (all partitions together).
    pub rules_peak: usize,
    /// ADD latency in the device (enqueue to finish, executed commands).
    pub cmd_latency_us_p50: f64,
    pub cmd_latency_us_p99: f64,
}

/// Control frame counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FrameCounters {
    /// Control frames handed to the runtime.
    pub received: u64,
    /// Well-formed requests by op name (hello, add, mod, del, flush, stats, query).
    pub requests: BTreeMap<&'static str, u64>,
    /// Malformed, unknown or otherwise refused frames.
    pub bad: u64,
    /// By kind: too_short, truncated_header, bad_version, unknown_op, bad_length,
    /// bad_body, bad_ip_version, bad_l4_proto, bad_address, bad_queue, not_control.
    pub bad_by_kind: BTreeMap<&'static str, u64>,
    /// Error completions sent for bad frames (a part of `completions_sent`).
    pub error_completions: u64,
    /// Answers not sent because the request was STATS or had NO_REPLY set.
    pub completions_suppressed: u64,
    pub completions_sent: u64,
    /// Completions that could not be delivered (no RX buffer, queue not ready).
    pub completions_dropped: u64,
    pub completions_dropped_no_buffer: u64,
    pub events_sent: u64,
    pub events_dropped: u64,
}

/// Everything the report needs from the control plane.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ControlSnapshot {
    /// Device clock (ns) of the snapshot.
    pub at_ns: u64,
    pub filter: FilterSummary,
    pub engine: EngineStats,
    pub partitions: Vec<PartitionStats>,
    pub frames: FrameCounters,
    /// `None` until the first STATS frame.
    pub guest: Option<GuestStats>,
    pub series: Vec<StatsSample>,
}

/// A live rule, for the per-flow view of the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RuleView {
    pub id: u32,
    /// `udp 10.0.0.1:9000 10.0.0.2:7000` (as the guest sees it: the packets it receives).
    pub flow: String,
    #[serde(skip)]
    pub key: FlowKey,
    /// `None` for a drop rule.
    pub queue: Option<u16>,
    pub installed_ns: u64,
    pub hits: u64,
    pub bytes: u64,
    pub last_active_ns: u64,
}

impl From<RuleSnapshot> for RuleView {
    fn from(r: RuleSnapshot) -> Self {
        RuleView {
            id: r.id,
            flow: r.key.to_string(),
            key: r.key,
            queue: match r.action {
                Action::Queue(q) => Some(q),
                Action::Drop => None,
            },
            installed_ns: r.installed_ns,
            hits: r.hits,
            bytes: r.bytes,
            last_active_ns: r.last_active_ns,
        }
    }
}

#[derive(Default)]
struct Guest {
    /// Counter id → (latest value, device time it arrived).
    latest: BTreeMap<u16, (u64, u64)>,
    received_ns: u64,
    reports: u64,
    series: VecDeque<StatsSample>,
}

impl Guest {
    fn value(&self, id: u16) -> u64 {
        self.latest.get(&id).map_or(0, |v| v.0)
    }

    fn store(&mut self, entries: &[(u16, u64)], now: u64) {
        for &(id, v) in entries {
            self.latest.insert(id, (v, now));
        }
        self.received_ns = now;
        self.reports += 1;
        if self.series.len() >= MAX_SERIES {
            self.series.pop_front();
        }
        self.series.push_back(StatsSample {
            t_ns: now,
            steer_calls: self.value(counter::STEER_CALLS),
            adds_ok: self.value(counter::ADDS_OK),
            mods_ok: self.value(counter::MODS_OK),
            dels_ok: self.value(counter::DELS_OK),
            lock_acquired: self.value(counter::LOCK_ACQUIRED),
            lock_contended: self.value(counter::LOCK_CONTENDED),
            lock_wait_ns: self.value(counter::LOCK_WAIT_NS_TOTAL),
        });
    }

    fn rates(&self, from_ns: u64, to_ns: u64) -> Option<GuestRates> {
        let a = self.series.iter().find(|s| s.t_ns >= from_ns)?;
        let b = self.series.iter().rev().find(|s| s.t_ns <= to_ns)?;
        if b.t_ns <= a.t_ns {
            return None;
        }
        let dt = (b.t_ns - a.t_ns) as f64 / 1e9;
        let r = |x: u64, y: u64| y.saturating_sub(x) as f64 / dt;
        let acquired = b.lock_acquired.saturating_sub(a.lock_acquired);
        let contended = b.lock_contended.saturating_sub(a.lock_contended);
        Some(GuestRates {
            from_ns: a.t_ns,
            to_ns: b.t_ns,
            window_s: dt,
            steer_calls_per_s: r(a.steer_calls, b.steer_calls),
            adds_per_s: r(a.adds_ok, b.adds_ok),
            mods_per_s: r(a.mods_ok, b.mods_ok),
            dels_per_s: r(a.dels_ok, b.dels_ok),
            lock_contended_pct: if acquired > 0 { 100.0 * contended as f64 / acquired as f64 } else { 0.0 },
            lock_wait_us_per_s: r(a.lock_wait_ns, b.lock_wait_ns) / 1000.0,
        })
    }

    fn stats(&self) -> Option<GuestStats> {
        if self.reports == 0 {
            return None;
        }
        let mut g = GuestStats {
            received_ns: self.received_ns,
            reports: self.reports,
            lat_hist_us: vec![0; LAT_HIST_BUCKETS],
            ..Default::default()
        };
        for (&id, &(v, _)) in &self.latest {
            let c = CounterId::classify(id);
            match c {
                CounterId::LatBucket(i) => g.lat_hist_us[i] = v,
                _ => {
                    g.counters.insert(c.name(), v);
                }
            }
            match c {
                CounterId::AddErr(e) => {
                    g.add_errors.insert(wire::errno_name(e).into_owned(), v);
                }
                CounterId::ModErr(e) => {
                    g.mod_errors.insert(wire::errno_name(e).into_owned(), v);
                }
                CounterId::DelErr(e) => {
                    g.del_errors.insert(wire::errno_name(e).into_owned(), v);
                }
                _ => {}
            }
        }
        g.lat_us_p50 = hist_percentile(&g.lat_hist_us, 0.5);
        g.lat_us_p90 = hist_percentile(&g.lat_hist_us, 0.9);
        g.lat_us_p99 = hist_percentile(&g.lat_hist_us, 0.99);
        g.rates = self.rates(0, u64::MAX);
        Some(g)
    }
}

struct Inner {
    engine: Engine,
    /// Learned from the source MAC of the latest well-formed request.
    guest_mac: Option<[u8; 6]>,
    event_seq: u32,
    rules_peak: usize,
    frames: FrameCounters,
    guest: Guest,
    shutdown: bool,
}

/// A frame to send once the lock is released.
struct Outgoing {
    pair: u16,
    frame: Vec<u8>,
    event: bool,
}

struct Shared {
    inner: Mutex<Inner>,
    wake: Condvar,
    clock: Clock,
    sink: Arc<dyn ControlSink>,
    caps: Caps,
    queue_pairs: u16,
    sent: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Inner {
    fn note_rules(&mut self) {
        self.rules_peak = self.rules_peak.max(self.engine.table().len());
    }

    fn dst(&self) -> [u8; 6] {
        self.guest_mac.unwrap_or(wire::BROADCAST_MAC)
    }

    /// Turn engine outputs into frames.
    fn encode_outputs(&mut self, outs: Vec<Output>, to: &mut Vec<Outgoing>) {
        for o in outs {
            match o {
                Output::Completion(c) => {
                    if untag(c.tag).2 {
                        self.frames.completions_suppressed += 1;
                    } else {
                        to.push(self.completion_frame(&c));
                    }
                }
                Output::Event(e) => {
                    let msg = match e {
                        Event::RuleAged { id, .. } => EventMsg::RuleAged { filter_id: id },
                        Event::TableFlushed { .. } => EventMsg::TableFlushed,
                        Event::EngineState { disabled, .. } => EventMsg::EngineState { disabled },
                    };
                    // Events are numbered 1, 2, 3, … from device start.
                    self.event_seq = self.event_seq.wrapping_add(1);
                    let seq = self.event_seq;
                    to.push(Outgoing {
                        pair: EVENT_PAIR,
                        frame: wire::encode_event(self.dst(), seq, &msg),
                        event: true,
                    });
                }
            }
        }
    }

    fn completion_frame(&self, c: &Completion) -> Outgoing {
        let (pair, seq, _) = untag(c.tag);
        let body = match (&c.rule, c.status) {
            (Some(r), 0) => CompletionBody::Query {
                rxq: match r.action {
                    Action::Queue(q) => q,
                    Action::Drop => u16::MAX,
                },
                hits: r.hits,
            },
            _ => CompletionBody::None,
        };
        let msg = CompletionMsg {
            req_op: wire_op(c.op),
            seq,
            status: status16(c.status),
            enqueue_ns: c.enqueue_ns,
            start_ns: c.start_ns,
            finish_ns: c.finish_ns,
            body,
        };
        Outgoing { pair, frame: wire::encode_completion(self.dst(), &msg), event: false }
    }
}

/// The control-plane runtime: owns the command engine and its timer thread.
pub struct ControlRuntime {
    shared: Arc<Shared>,
    timer: Mutex<Option<JoinHandle<()>>>,
}

/// When the profile's `[[faults.schedule]]` starts counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// At the runtime's creation (`arfsnic serve`).
    FromStart,
    /// At [`ControlRuntime::arm_schedule`] (`arfsnic run`: the start of the traffic).
    Held,
}

impl ControlRuntime {
    /// A runtime for `profile` driving `table` (the NIC's filter table), answering with
    /// `queue_pairs` in CAPS, stamping with `clock`, sending through `sink`.
    pub fn new(
        profile: &Profile,
        table: Arc<FilterTable>,
        queue_pairs: u16,
        clock: Clock,
        sink: Arc<dyn ControlSink>,
    ) -> std::io::Result<Arc<Self>> {
        Self::with_schedule(profile, table, queue_pairs, clock, sink, Schedule::FromStart)
    }

    /// As [`ControlRuntime::new`], choosing when the fault schedule starts. A held
    /// schedule is held before the timer thread exists, so nothing of it can fire early.
    pub fn with_schedule(
        profile: &Profile,
        table: Arc<FilterTable>,
        queue_pairs: u16,
        clock: Clock,
        sink: Arc<dyn ControlSink>,
        schedule: Schedule,
    ) -> std::io::Result<Arc<Self>> {
        let layout = table.layout();
        let cap = u32::try_from(profile.filter.capacity).unwrap_or(u32::MAX);
        let caps = Caps {
            queue_pairs,
            layout: match layout {
                Layout::PerType => wire::LAYOUT_PER_TYPE,
                Layout::Shared => wire::LAYOUT_SHARED,
            },
            capacity: [cap; 4],
            profile: profile.name.clone(),
        };
        let mut engine = Engine::new(profile, table, clock.now_ns());
        if schedule == Schedule::Held {
            engine.hold_schedule();
        }
        let inner = Inner {
            engine,
            guest_mac: None,
            event_seq: 0,
            rules_peak: 0,
            frames: FrameCounters::default(),
            guest: Guest::default(),
            shutdown: false,
        };
        let shared = Arc::new(Shared {
            inner: Mutex::new(inner),
            wake: Condvar::new(),
            clock,
            sink,
            caps,
            queue_pairs,
            sent: AtomicU64::new(0),
        });
        let s = shared.clone();
        let timer = std::thread::Builder::new().name("arfsnic-ctl".into()).spawn(move || timer_loop(&s))?;
        Ok(Arc::new(ControlRuntime { shared, timer: Mutex::new(Some(timer)) }))
    }

    /// Build a runtime for `nic` (its filter table, clock and RX queues) and attach it as
    /// the NIC's control plane.
    pub fn attach(
        profile: &Profile,
        nic: &Arc<EmulatedNic>,
        queue_pairs: u16,
        schedule: Schedule,
    ) -> std::io::Result<Arc<Self>> {
        let sink: Arc<dyn ControlSink> = Arc::new(Arc::downgrade(nic));
        let rt = Self::with_schedule(profile, nic.nic.table().clone(), queue_pairs, nic.clock, sink, schedule)?;
        nic.set_control(Some(rt.clone()));
        Ok(rt)
    }

    /// Address events to `mac` before the first request arrives (afterwards the source
    /// MAC of the latest well-formed request is used; until then events are broadcast).
    pub fn set_guest_mac(&self, mac: [u8; 6]) {
        self.shared.lock().guest_mac = Some(mac);
    }

    pub fn clock(&self) -> Clock {
        self.shared.clock
    }

    pub fn caps(&self) -> &Caps {
        &self.shared.caps
    }

    /// Handle one control frame from the TX queue of `pair`.
    pub fn handle_frame(&self, pair: u16, frame: &[u8]) {
        let sh = &*self.shared;
        let now = sh.clock.now_ns();
        let mut out = Vec::new();
        {
            let mut g = sh.lock();
            g.frames.received += 1;
            match wire::decode_request_eth(frame) {
                Ok((eth, header, req)) => self.on_request(&mut g, pair, eth.src, header, req, now, &mut out),
                Err(e) => {
                    let src = wire::eth_info(frame).map(|e| e.src).unwrap_or(wire::BROADCAST_MAC);
                    Self::on_bad(&mut g, pair, src, &e, &mut out);
                }
            }
        }
        self.send_all(out);
    }

    #[allow(clippy::too_many_arguments)]
    fn on_request(
        &self,
        g: &mut Inner,
        pair: u16,
        src: [u8; 6],
        header: Header,
        req: Request,
        now: u64,
        out: &mut Vec<Outgoing>,
    ) {
        let sh = &*self.shared;
        // Queue numbers beyond the device are refused here, like a NIC rejecting a rule
        // for a queue it does not have.
        if let Request::Add(wire::AddRequest { rxq, .. }) | Request::Mod { rxq, .. } = &req {
            if *rxq >= sh.queue_pairs {
                let e = DecodeError::BadBody { header, got: 0, expected: "rxq < queue pairs" };
                return Self::reply_bad(g, pair, src, &e, "bad_queue", out);
            }
        }
        g.guest_mac = Some(src);
        *g.frames.requests.entry(op_name(header.op)).or_default() += 1;
        let quiet = no_reply(&header);
        match req {
            Request::Hello if quiet => g.frames.completions_suppressed += 1,
            Request::Hello => {
                let msg = CompletionMsg {
                    req_op: wire::op::HELLO,
                    seq: header.seq,
                    status: 0,
                    enqueue_ns: now,
                    start_ns: now,
                    finish_ns: now,
                    body: CompletionBody::Caps(sh.caps.clone()),
                };
                out.push(Outgoing { pair, frame: wire::encode_completion(src, &msg), event: false });
            }
            Request::Stats(entries) => g.guest.store(&entries, now),
            other => {
                let Some(cmd) = other.to_command() else { return };
                let mut outs = Vec::new();
                g.engine.submit(tag(pair, header.seq, quiet), cmd, now, &mut outs);
                g.note_rules();
                g.encode_outputs(outs, out);
                // The deadline may have moved earlier.
                sh.wake.notify_one();
            }
        }
    }

    fn on_bad(g: &mut Inner, pair: u16, src: [u8; 6], e: &DecodeError, out: &mut Vec<Outgoing>) {
        Self::reply_bad(g, pair, src, e, e.kind(), out)
    }

    fn reply_bad(g: &mut Inner, pair: u16, src: [u8; 6], e: &DecodeError, kind: &'static str, out: &mut Vec<Outgoing>) {
        g.frames.bad += 1;
        *g.frames.bad_by_kind.entry(kind).or_default() += 1;
        log::debug!("control: pair {pair}: {kind}: {e}");
        let (Some(h), Some(status)) = (e.header(), e.errno()) else { return };
        if no_reply(h) {
            g.frames.completions_suppressed += 1;
            return;
        }
        g.frames.error_completions += 1;
        // Rejected before reaching the engine: the timestamps are zero.
        let msg = CompletionMsg {
            req_op: h.op,
            seq: h.seq,
            status: status16(status),
            enqueue_ns: 0,
            start_ns: 0,
            finish_ns: 0,
            body: CompletionBody::None,
        };
        out.push(Outgoing { pair, frame: wire::encode_completion(src, &msg), event: false });
    }

    fn send_all(&self, out: Vec<Outgoing>) {
        send_all(&self.shared, out);
    }

    /// Apply a fault now (disable/enable, stall, flush, error rates, lost completions).
    /// Start the profile's fault schedule now (offsets count from this call); for a
    /// runtime attached with [`Schedule::Held`].
    pub fn arm_schedule(&self) {
        self.engine_op(|e, now, outs| e.arm_schedule(now, outs));
    }

    pub fn inject(&self, fault: Fault) {
        self.engine_op(|e, now, outs| e.inject(fault, now, outs));
    }

    /// Run `op` on the engine at the current time and send what it produced.
    fn engine_op(&self, op: impl FnOnce(&mut Engine, u64, &mut Vec<Output>)) {
        let sh = &*self.shared;
        let mut out = Vec::new();
        {
            let mut g = sh.lock();
            let mut outs = Vec::new();
            op(&mut g.engine, sh.clock.now_ns(), &mut outs);
            g.note_rules();
            g.encode_outputs(outs, &mut out);
            sh.wake.notify_one();
        }
        self.send_all(out);
    }

    /// Frames handed to the sink successfully (completions and events).
    pub fn frames_sent(&self) -> u64 {
        self.shared.sent.load(Relaxed)
    }

    /// The latest value of a guest counter and the device time it arrived.
    pub fn guest_counter(&self, id: u16) -> Option<(u64, u64)> {
        self.shared.lock().guest.latest.get(&id).copied()
    }

    /// Guest rates between the first sample at or after `from_ns` and the last one at or
    /// before `to_ns` (device clock).
    pub fn guest_rates(&self, from_ns: u64, to_ns: u64) -> Option<GuestRates> {
        self.shared.lock().guest.rates(from_ns, to_ns)
    }

    pub fn engine_stats(&self) -> EngineStats {
        self.shared.lock().engine.stats()
    }

    pub fn table(&self) -> Arc<FilterTable> {
        self.shared.lock().engine.table().clone()
    }

    /// Live rules, ordered by id.
    pub fn rules(&self) -> Vec<RuleView> {
        self.table().rules().into_iter().map(RuleView::from).collect()
    }

    pub fn snapshot(&self) -> ControlSnapshot {
        let sh = &*self.shared;
        let g = sh.lock();
        let engine = g.engine.stats();
        let table = g.engine.table();
        let partitions = table.stats();
        let ok = |op: &str| engine.ops.get(op).map_or(0, |o| o.completed_ok);
        let errs = |op: &str| engine.ops.get(op).map(|o| o.errors.clone()).unwrap_or_default();
        let mut rejects = BTreeMap::<String, u64>::new();
        for o in engine.ops.values() {
            for (k, v) in &o.errors {
                *rejects.entry(k.clone()).or_default() += v;
            }
        }
        let add_lat = engine.ops.get("add").map(|o| o.latency.clone()).unwrap_or_default();
        let filter = FilterSummary {
            adds: ok("add"),
            mods: ok("mod"),
            dels: ok("del"),
            flushes: ok("flush"),
            queries: ok("query"),
            rejects,
            add_rejects: errs("add"),
            mod_rejects: errs("mod"),
            del_rejects: errs("del"),
            rules_now: table.len(),
            rules_peak: g.rules_peak.max(table.len()),
            cmd_latency_us_p50: add_lat.p50_us,
            cmd_latency_us_p99: add_lat.p99_us,
        };
        ControlSnapshot {
            at_ns: sh.clock.now_ns(),
            filter,
            engine,
            partitions,
            frames: g.frames.clone(),
            guest: g.guest.stats(),
            series: g.guest.series.iter().copied().collect(),
        }
    }

    /// Stop the timer thread (also done on drop). Frames arriving later are still
    /// decoded and answered at once, but nothing completes after this.
    pub fn shutdown(&self) {
        self.shared.lock().shutdown = true;
        self.shared.wake.notify_all();
        let h = self.timer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = h {
            // The last reference may be dropped on the timer thread itself (through the
            // NIC it sends to); it then ends on its own.
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

fn op_name(op: u8) -> &'static str {
    match op {
        wire::op::HELLO => "hello",
        wire::op::ADD => "add",
        wire::op::MOD => "mod",
        wire::op::DEL => "del",
        wire::op::FLUSH => "flush",
        wire::op::STATS => "stats",
        wire::op::QUERY => "query",
        _ => "other",
    }
}

fn send_all(sh: &Shared, out: Vec<Outgoing>) {
    if out.is_empty() {
        return;
    }
    let mut results = Vec::with_capacity(out.len());
    for o in &out {
        results.push(sh.sink.send(o.pair, &o.frame));
    }
    let mut g = sh.lock();
    for (o, r) in out.iter().zip(results) {
        match (o.event, r) {
            (false, Ok(_)) => g.frames.completions_sent += 1,
            (true, Ok(_)) => g.frames.events_sent += 1,
            (false, Err(e)) => {
                g.frames.completions_dropped += 1;
                if e == RxError::NoBuffers {
                    g.frames.completions_dropped_no_buffer += 1;
                }
            }
            (true, Err(_)) => g.frames.events_dropped += 1,
        }
    }
    let ok = g.frames.completions_sent + g.frames.events_sent;
    sh.sent.store(ok, Relaxed);
}

fn set_timer_slack_ns(ns: u64) {
    // SAFETY: PR_SET_TIMERSLACK takes an unsigned long by value and touches no memory.
    unsafe {
        libc::prctl(
            libc::PR_SET_TIMERSLACK,
            ns as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        );
    }
}

/// Sleeps until the engine's next deadline (or a wakeup), advances it to the wall clock
/// and sends what came out.
fn timer_loop(sh: &Shared) {
    // The default 50 µs timer slack would be added to every sleep.
    set_timer_slack_ns(1_000);
    let mut g = sh.lock();
    loop {
        if g.shutdown {
            return;
        }
        let now = sh.clock.now_ns();
        let mut outs = Vec::new();
        g.engine.advance(now, &mut outs);
        if !outs.is_empty() {
            g.note_rules();
            let mut out = Vec::new();
            g.encode_outputs(outs, &mut out);
            drop(g);
            send_all(sh, out);
            g = sh.lock();
            continue;
        }
        g = match g.engine.next_deadline() {
            None => sh.wake.wait(g).unwrap_or_else(|e| e.into_inner()),
            Some(d) if d <= now => continue,
            Some(d) => sh.wake.wait_timeout(g, Duration::from_nanos(d - now)).unwrap_or_else(|e| e.into_inner()).0,
        };
    }
}

impl ControlPlane for ControlRuntime {
    fn on_control_frame(&self, pair: u16, frame: &[u8]) {
        self.handle_frame(pair, frame);
    }
}

impl Drop for ControlRuntime {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip() {
        assert_eq!(untag(tag(3, 0xffff_fffe, false)), (3, 0xffff_fffe, false));
        assert_eq!(untag(tag(u16::MAX, 0, true)), (u16::MAX, 0, true));
    }

    #[test]
    fn percentiles_of_log2_buckets() {
        let mut b = vec![0u64; LAT_HIST_BUCKETS];
        assert_eq!(hist_percentile(&b, 0.5), None);
        b[0] = 1;
        b[6] = 8; // [64, 128) µs
        b[23] = 1;
        assert_eq!(hist_percentile(&b, 0.5), Some(BucketPercentile { lo_us: 64.0, hi_us: Some(128.0) }));
        assert_eq!(hist_percentile(&b, 0.0), Some(BucketPercentile { lo_us: 0.0, hi_us: Some(2.0) }));
        assert_eq!(hist_percentile(&b, 1.0), Some(BucketPercentile { lo_us: (1u64 << 23) as f64, hi_us: None }));
    }

    #[test]
    fn guest_rates_over_samples() {
        let mut g = Guest::default();
        g.store(&[(counter::STEER_CALLS, 100), (counter::ADDS_OK, 10)], 1_000_000_000);
        g.store(&[(counter::STEER_CALLS, 1100)], 2_000_000_000);
        g.store(&[(counter::STEER_CALLS, 3100), (counter::ADDS_OK, 50)], 3_000_000_000);
        let r = g.rates(0, u64::MAX).unwrap();
        assert_eq!((r.window_s, r.steer_calls_per_s, r.adds_per_s), (2.0, 1500.0, 20.0));
        let r = g.rates(1_500_000_000, 2_500_000_000);
        assert_eq!(r, None, "one sample in the window");
        let s = g.stats().unwrap();
        assert_eq!(s.counters["steer_calls"], 3100);
        assert_eq!(s.reports, 3);
    }
}
