//! The device side of the in-band control protocol (docs/control-protocol.md): control
//! frames from any TX queue are decoded on the calling (vhost worker) thread and enter
//! the command engine with a wall-clock timestamp; one timer thread sleeps until the
//! engine's next deadline, advances it, and sends completions and events back as frames.
//!
//! Where frames go:
//! - the completion of a filter command (ADD, MOD, DEL) goes to the RX queue of the queue
//!   pair whose TX queue carried it (the engine tag encodes pair and seq): under XPS the
//!   completion interrupt then lands near the CPU that sent the request, and no single
//!   queue carries all aRFS traffic;
//! - the completions of every other request (configuration: HELLO, DEV_STATS, FLUSH,
//!   QUERY, RSS, rules) and events (rule aged, table flushed, engine state) go to RX
//!   queue 0 ([`reply_pair`]);
//! - `EmulatedNic::send_control` falls back to the lowest enabled queue when that queue is
//!   disabled, and a queue without RX buffers drops the frame (counted).
//!
//! Locking: the engine and all protocol state sit behind one mutex; frames are encoded
//! under it and sent after it is released, so no vring lock is ever taken while holding
//! it (the vhost worker calls in with its TX vring locked).
//!
//! Hostile input: every frame is decoded without panicking; allocation is bounded by the
//! frame (STATS) or by fixed caps (time series, one entry per u16 counter id).

use super::backlog::{self, Backlog, Outgoing};
use super::clock::Clock;
use super::guest::{Guest, GuestRates};
use super::nic::EmulatedNic;
use super::ports::{ControlPlane, RxError};
use super::snapshot::{ControlSnapshot, FilterSummary, FrameCounters, RuleView};
use crate::model::engine::{Command, Completion, Engine, Event, Fault, Op, Output};
use crate::model::filter::{Action, FilterTable, Layout};
use crate::model::nic::ContextError;
use crate::model::profile::Profile;
use crate::model::rss::HashFields;
use crate::model::rss::{Rss, RssError};
use crate::wire::control::{self as wire, Caps, CompletionBody, CompletionMsg, DecodeError, EventMsg, Header, Request};
use crate::wire::hash::{HashMsg, HASH_KEEP, HASH_XFRM_KEEP, HASH_XFRM_NONE, HASH_XFRM_SYM_XOR};
use crate::wire::rule::{RuleAction, RULE_LOC_ALL};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// Where the runtime puts device frames: the emulated NIC's RX queues, or a capture in
/// tests.
pub trait ControlSink: Send + Sync + 'static {
    /// Put `frame` on the RX queue of `pair`; returns the queue actually used.
    fn send(&self, pair: u16, frame: &[u8]) -> Result<u16, RxError>;
    /// The data path's counters since the last device reset, for DEV_STATS.
    fn data_counters(&self) -> DataCounters {
        DataCounters::default()
    }
    /// The device's RSS configuration, for RSS_GET (`None`: the device has none to
    /// show, RSS_GET and RSS_SET answer EOPNOTSUPP).
    fn rss(&self) -> Option<Arc<Rss>> {
        None
    }
    /// Install a new RSS configuration (RSS_SET, already checked); packets from now on
    /// are classified with it.
    fn set_rss(&self, _rss: Rss) {}
    /// Create or change an additional RSS context (CTX_SET).
    fn set_context(&self, _id: u32, _key: Option<&[u8]>, _indir: Option<&[u16]>) -> Result<(), ContextError> {
        Err(ContextError { errno: libc::EOPNOTSUPP, kind: "ctx_unsupported" })
    }
    /// Remove an RSS context (CTX_DEL).
    fn delete_context(&self, _id: u32) -> Result<(), ContextError> {
        Err(ContextError { errno: libc::EOPNOTSUPP, kind: "ctx_unsupported" })
    }
    /// Whether RSS context `id` exists (0: the default context).
    fn has_context(&self, id: u32) -> bool {
        id == 0
    }
}

/// Data-path counters a DEV_STATS completion carries besides the control plane's own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataCounters {
    pub rx_spoofed_dropped: u64,
    pub rx_packets: u64,
    pub rx_not_ready: u64,
}

impl ControlSink for Weak<EmulatedNic> {
    fn send(&self, pair: u16, frame: &[u8]) -> Result<u16, RxError> {
        self.upgrade().ok_or(RxError::NotReady)?.send_control(pair, frame)
    }
    fn data_counters(&self) -> DataCounters {
        self.upgrade().map(|n| n.data_counters_since_reset()).unwrap_or_default()
    }
    fn rss(&self) -> Option<Arc<Rss>> {
        self.upgrade().map(|n| n.nic.rss())
    }
    fn set_rss(&self, rss: Rss) {
        if let Some(n) = self.upgrade() {
            n.nic.configure_rss(rss);
        }
    }
    fn set_context(&self, id: u32, key: Option<&[u8]>, indir: Option<&[u16]>) -> Result<(), ContextError> {
        self.upgrade()
            .ok_or(ContextError { errno: libc::ENODEV, kind: "ctx_unsupported" })?
            .nic
            .set_context(id, key, indir)
    }
    fn delete_context(&self, id: u32) -> Result<(), ContextError> {
        self.upgrade().ok_or(ContextError { errno: libc::ENODEV, kind: "ctx_unsupported" })?.nic.delete_context(id)
    }
    fn has_context(&self, id: u32) -> bool {
        self.upgrade().is_some_and(|n| n.nic.has_context(id))
    }
}

/// Queue pair whose RX queue carries events and the completions of configuration
/// requests.
pub const EVENT_PAIR: u16 = 0;

/// The queue pair whose RX queue gets the completion of a request that came on `pair`'s
/// TX queue: the aRFS filter commands (ADD, MOD, DEL) keep the requester's pair, so the
/// completion interrupt lands near the CPU whose work item waits for it; everything else
/// (HELLO, DEV_STATS, FLUSH, QUERY, the RSS and rule configuration of ethtool) goes to
/// queue 0, the queue every RSS table keeps, like a NIC's asynchronous event queue. The
/// kernel's selftests count packets per RX queue and require idle queues to stay at 0
/// (ntuple.py, rss_ctx.py): an `ethtool` call must not put a packet on them.
fn reply_pair(op: u8, pair: u16) -> u16 {
    match op {
        wire::op::ADD | wire::op::MOD | wire::op::DEL => pair,
        _ => EVENT_PAIR,
    }
}

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

/// The engine command a decoded request maps to (HELLO and STATS have none).
fn command_of(req: &Request) -> Option<Command> {
    Some(match req {
        Request::Add(a) => Command::Add { id: a.filter_id, key: a.key, action: Action::Queue(a.rxq) },
        Request::Mod { filter_id, rxq } => Command::Mod { id: *filter_id, action: Action::Queue(*rxq) },
        Request::Del { filter_id } => Command::Del { id: *filter_id },
        Request::Flush => Command::Flush,
        Request::Query { filter_id } => Command::Query { id: *filter_id },
        Request::Hello
        | Request::Stats(_)
        | Request::DevStats
        | Request::RssGet
        | Request::RssSet(_)
        | Request::RuleSet(_)
        | Request::RuleDel { .. }
        | Request::HashGet
        | Request::HashSet(_)
        | Request::CtxSet { .. }
        | Request::CtxDel { .. } => return None,
    })
}

fn status16(errno: i32) -> u16 {
    u16::try_from(errno).unwrap_or(libc::EIO as u16)
}

struct Inner {
    engine: Engine,
    /// Learned from the source MAC of the latest well-formed request.
    guest_mac: Option<[u8; 6]>,
    /// Protocol version of the latest well-formed request: completions of engine
    /// commands and events are sent in it (a version 1 driver gets version 1 frames).
    peer_version: u8,
    event_seq: u32,
    rules_peak: usize,
    frames: FrameCounters,
    guest: Guest,
    shutdown: bool,
    /// The fault schedule waits for [`ControlRuntime::arm_schedule`] (a reset keeps it so).
    schedule_held: bool,
}

struct Shared {
    inner: Mutex<Inner>,
    /// Completions and events the guest had no RX buffer for; the timer thread retries
    /// them while they wait. Its lock is taken before `inner`, never the other way.
    backlog: Backlog,
    wake: Condvar,
    clock: Clock,
    sink: Arc<dyn ControlSink>,
    caps: Caps,
    queue_pairs: u16,
    sent: AtomicU64,
    /// What a device reset rebuilds the engine from.
    profile: Profile,
    /// Device resets (a new driver instance started) since the runtime was created.
    resets: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        crate::sync::lock(&self.inner)
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
                        frame: wire::encode_event_version(self.dst(), self.peer_version, seq, &msg),
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
        Outgoing { pair, frame: wire::encode_completion_version(self.dst(), self.peer_version, &msg), event: false }
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
            peer_version: wire::VERSION,
            event_seq: 0,
            rules_peak: 0,
            frames: FrameCounters::default(),
            guest: Guest::default(),
            shutdown: false,
            schedule_held: schedule == Schedule::Held,
        };
        let shared = Arc::new(Shared {
            inner: Mutex::new(inner),
            backlog: Backlog::default(),
            wake: Condvar::new(),
            clock,
            sink,
            caps,
            queue_pairs,
            sent: AtomicU64::new(0),
            profile: profile.clone(),
            resets: AtomicU64::new(0),
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
        let pair = reply_pair(header.op, pair);
        // Queue numbers beyond the device are refused here, like a NIC rejecting a rule
        // for a queue it does not have.
        if let Request::Add(wire::AddRequest { rxq, .. }) | Request::Mod { rxq, .. } = &req {
            if *rxq >= sh.queue_pairs {
                let e = DecodeError::BadBody { header, got: 0, expected: "rxq < queue pairs" };
                return Self::reply_bad(g, pair, src, &e, "bad_queue", out);
            }
        }
        g.guest_mac = Some(src);
        g.peer_version = header.version;
        *g.frames.requests.entry(Cow::Borrowed(op_name(header.op))).or_default() += 1;
        let quiet = no_reply(&header);
        match req {
            Request::Hello if quiet => g.frames.completions_suppressed += 1,
            Request::Hello => {
                let body = CompletionBody::Caps(sh.caps.clone());
                out.push(answered_at_once(pair, src, &header, body, now));
            }
            Request::Stats(entries) => g.guest.store(&entries, now),
            Request::DevStats if quiet => g.frames.completions_suppressed += 1,
            Request::DevStats => {
                let body = CompletionBody::DevStats(dev_stats(g, sh.sink.data_counters()));
                out.push(answered_at_once(pair, src, &header, body, now));
            }
            Request::RssGet if quiet => g.frames.completions_suppressed += 1,
            Request::RssGet => match sh.sink.rss() {
                Some(rss)
                    if rss.toeplitz().key().len() <= wire::RSS_KEY_MAX
                        && rss.indirection().len() <= wire::RSS_INDIR_MAX =>
                {
                    let body = CompletionBody::Rss(wire::RssConfig {
                        hfunc: wire::RSS_HFUNC_TOEPLITZ,
                        queues: rss.queues(),
                        key: rss.toeplitz().key().to_vec(),
                        indir: rss.indirection().to_vec(),
                    });
                    out.push(answered_at_once(pair, src, &header, body, now));
                }
                // No RSS to show, or more than a frame carries.
                _ => Self::refuse(g, pair, src, &header, libc::EOPNOTSUPP, "rss_unsupported", out),
            },
            Request::RssSet(set) => match rss_set(sh.sink.as_ref(), &set) {
                Ok(()) if quiet => g.frames.completions_suppressed += 1,
                Ok(()) => out.push(answered_at_once(pair, src, &header, CompletionBody::None, now)),
                Err((errno, kind)) => Self::refuse(g, pair, src, &header, errno, kind, out),
            },
            Request::HashGet if quiet => g.frames.completions_suppressed += 1,
            Request::HashGet => match sh.sink.rss() {
                Some(rss) => {
                    let f = rss.hash_fields();
                    let xfrm = if f.sym_xor { HASH_XFRM_SYM_XOR } else { HASH_XFRM_NONE };
                    let body = CompletionBody::Hash(HashMsg { fields: f.sets(), xfrm });
                    out.push(answered_at_once(pair, src, &header, body, now));
                }
                None => Self::refuse(g, pair, src, &header, libc::EOPNOTSUPP, "rss_unsupported", out),
            },
            Request::HashSet(m) => match hash_set(sh.sink.as_ref(), &m) {
                Ok(()) if quiet => g.frames.completions_suppressed += 1,
                Ok(()) => out.push(answered_at_once(pair, src, &header, CompletionBody::None, now)),
                Err((errno, kind)) => Self::refuse(g, pair, src, &header, errno, kind, out),
            },
            Request::CtxSet { context, set } => match ctx_set(sh.sink.as_ref(), context, &set) {
                Ok(()) if quiet => g.frames.completions_suppressed += 1,
                Ok(()) => out.push(answered_at_once(pair, src, &header, CompletionBody::None, now)),
                Err((errno, kind)) => Self::refuse(g, pair, src, &header, errno, kind, out),
            },
            Request::CtxDel { context } => match sh.sink.delete_context(context) {
                Ok(()) if quiet => g.frames.completions_suppressed += 1,
                Ok(()) => out.push(answered_at_once(pair, src, &header, CompletionBody::None, now)),
                Err(e) => Self::refuse(g, pair, src, &header, e.errno, e.kind, out),
            },
            Request::RuleSet(spec) if spec.context.is_some_and(|c| !sh.sink.has_context(u32::from(c))) => {
                Self::refuse(g, pair, src, &header, libc::EINVAL, "rule_bad_context", out)
            }
            Request::RuleSet(_) | Request::RuleDel { .. } => match user_rule(g.engine.table(), sh.queue_pairs, &req) {
                Ok(()) if quiet => g.frames.completions_suppressed += 1,
                Ok(()) => out.push(answered_at_once(pair, src, &header, CompletionBody::None, now)),
                Err((errno, kind)) => Self::refuse(g, pair, src, &header, errno, kind, out),
            },
            other => {
                let Some(cmd) = command_of(&other) else { return };
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
        *g.frames.bad_by_kind.entry(Cow::Borrowed(kind)).or_default() += 1;
        crate::warn_ratelimited!(
            "control: pair {pair}: malformed request dropped ({kind}, counted in bad_by_kind): {e}"
        );
        let (Some(h), Some(status)) = (e.header(), e.errno()) else { return };
        // An unsupported version (or one in a truncated header, never checked) is
        // answered in the newest one, so the peer learns what the device speaks; anything
        // else in the request's own.
        let version = if (wire::MIN_VERSION..=wire::VERSION).contains(&h.version) { h.version } else { wire::VERSION };
        Self::error_completion(g, pair, src, h, version, status, out);
    }

    /// A well-formed request the device refuses (RSS_GET / RSS_SET): counted as bad
    /// under `kind`, answered with `errno` in the request's version.
    #[allow(clippy::too_many_arguments)]
    fn refuse(
        g: &mut Inner,
        pair: u16,
        src: [u8; 6],
        h: &Header,
        errno: i32,
        kind: &'static str,
        out: &mut Vec<Outgoing>,
    ) {
        g.frames.bad += 1;
        *g.frames.bad_by_kind.entry(Cow::Borrowed(kind)).or_default() += 1;
        Self::error_completion(g, pair, src, h, h.version, errno, out);
    }

    fn error_completion(
        g: &mut Inner,
        pair: u16,
        src: [u8; 6],
        h: &Header,
        version: u8,
        status: i32,
        out: &mut Vec<Outgoing>,
    ) {
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
        out.push(Outgoing { pair, frame: wire::encode_completion_version(src, version, &msg), event: false });
    }

    fn send_all(&self, out: Vec<Outgoing>) {
        send_all(&self.shared, out);
    }

    /// Apply a fault now (disable/enable, stall, flush, error rates, lost completions).
    /// Start the profile's fault schedule now (offsets count from this call); for a
    /// runtime attached with [`Schedule::Held`].
    pub fn arm_schedule(&self) {
        self.shared.lock().schedule_held = false;
        self.engine_op(|e, now, outs| e.arm_schedule(now, outs));
    }

    /// The device was reset (a new driver instance started, as after a guest reboot or a
    /// new frontend): what the guest sees starts over as on a fresh device. The filter
    /// table is emptied without AGED/FLUSHED events (nobody is left to receive them),
    /// the engine starts anew (pending commands dropped, its counters and fault schedule
    /// restarted; a held schedule stays held), events are numbered from 1 again and the
    /// guest's reported counters are forgotten.
    pub fn reset(&self) {
        let sh = &*self.shared;
        // what waited for the old driver's RX buffers is not for the new one
        sh.backlog.clear();
        let mut g = sh.lock();
        let table = g.engine.table().clone();
        table.flush();
        table.flush_user_rules();
        g.engine = Engine::new(&sh.profile, table, sh.clock.now_ns());
        if g.schedule_held {
            g.engine.hold_schedule();
        }
        g.event_seq = 0;
        g.rules_peak = 0;
        g.frames = FrameCounters::default();
        g.guest = Guest::default();
        sh.resets.fetch_add(1, Relaxed);
        sh.wake.notify_one();
    }

    /// Device resets since the runtime was created.
    pub fn resets(&self) -> u64 {
        self.shared.resets.load(Relaxed)
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
        let h = crate::sync::lock(&self.timer).take();
        if let Some(h) = h {
            // The last reference may be dropped on the timer thread itself (through the
            // NIC it sends to); it then ends on its own.
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

/// The request's name in `frames.requests`: the engine op's own name (`Op::name`), plus
/// the two requests the engine never sees.
/// A successful completion of a request the device answers without its command engine
/// (HELLO, DEV_STATS): the three timestamps are `now`.
fn answered_at_once(pair: u16, src: [u8; 6], h: &Header, body: CompletionBody, now: u64) -> Outgoing {
    let msg =
        CompletionMsg { req_op: h.op, seq: h.seq, status: 0, enqueue_ns: now, start_ns: now, finish_ns: now, body };
    Outgoing { pair, frame: wire::encode_completion_version(src, h.version, &msg), event: false }
}

/// Check and apply an RSS_SET (docs/control-protocol.md §2.9), all or nothing. Errors:
/// the errno and the `bad_by_kind` name.
fn rss_set(sink: &dyn ControlSink, set: &wire::RssSet) -> Result<(), (i32, &'static str)> {
    let Some(rss) = sink.rss() else { return Err((libc::EOPNOTSUPP, "rss_unsupported")) };
    if !matches!(set.hfunc, wire::RSS_HFUNC_NO_CHANGE | wire::RSS_HFUNC_TOEPLITZ) {
        return Err((libc::EOPNOTSUPP, "rss_bad_hfunc"));
    }
    let key = (!set.key.is_empty()).then_some(&set.key[..]);
    let indir = (!set.indir.is_empty()).then_some(&set.indir[..]);
    if key.is_none() && indir.is_none() {
        return Ok(());
    }
    let next = rss.reconfigured(key, indir).map_err(|e| {
        let kind = match e {
            RssError::KeyLength(_) | RssError::KeyLengthMismatch { .. } => "rss_bad_key_len",
            RssError::IndirSize(_) | RssError::IndirSizeMismatch { .. } => "rss_bad_indir_size",
            RssError::IndirQueue { .. } | RssError::NoQueues => "rss_bad_queue",
            RssError::HashFields(_) => "hash_bad_fields",
        };
        (libc::EINVAL, kind)
    })?;
    sink.set_rss(next);
    Ok(())
}

/// Check and apply a CTX_SET (docs/control-protocol.md §2.13), all or nothing: RSS_SET's
/// body for context `id`.
fn ctx_set(sink: &dyn ControlSink, id: u32, set: &wire::RssSet) -> Result<(), (i32, &'static str)> {
    if !matches!(set.hfunc, wire::RSS_HFUNC_NO_CHANGE | wire::RSS_HFUNC_TOEPLITZ) {
        return Err((libc::EOPNOTSUPP, "rss_bad_hfunc"));
    }
    let key = (!set.key.is_empty()).then_some(&set.key[..]);
    let indir = (!set.indir.is_empty()).then_some(&set.indir[..]);
    sink.set_context(id, key, indir).map_err(|e| (e.errno, e.kind))
}

/// Check and apply a HASH_SET (docs/control-protocol.md §2.12), all or nothing: the
/// fields and the transformation it keeps are the device's current ones.
fn hash_set(sink: &dyn ControlSink, m: &HashMsg) -> Result<(), (i32, &'static str)> {
    let Some(rss) = sink.rss() else { return Err((libc::EOPNOTSUPP, "rss_unsupported")) };
    let cur = rss.hash_fields();
    let sym_xor = match m.xfrm {
        HASH_XFRM_KEEP => cur.sym_xor,
        HASH_XFRM_NONE => false,
        HASH_XFRM_SYM_XOR => true,
        _ => return Err((libc::EOPNOTSUPP, "hash_bad_xfrm")),
    };
    let mut sets = cur.sets();
    for (s, &new) in sets.iter_mut().zip(&m.fields) {
        if new != HASH_KEEP {
            *s = new;
        }
    }
    let next = rss
        .with_hash_fields(HashFields { sym_xor, ..cur.with_sets(sets) })
        .map_err(|_| (libc::EINVAL, "hash_bad_fields"))?;
    sink.set_rss(next);
    Ok(())
}

/// The DEV_STATS entries: the control plane's counters since the last reset and the
/// data path's.
fn dev_stats(g: &Inner, d: DataCounters) -> Vec<(u16, u64)> {
    use wire::dev_counter as c;
    let e = g.engine.stats();
    let ok = |op: &str| e.ops.get(op).map_or(0, |o| o.completed_ok);
    let rejects: u64 = e.ops.values().flat_map(|o| o.errors.values()).sum();
    let (user, user_hits) = g.engine.table().user_rules();
    vec![
        (c::RX_SPOOFED_DROPPED, d.rx_spoofed_dropped),
        (c::CTRL_REQUESTS, g.frames.received),
        (c::CTRL_BAD, g.frames.bad),
        (c::FILTER_ADDS, ok("add")),
        (c::FILTER_MODS, ok("mod")),
        (c::FILTER_DELS, ok("del")),
        (c::FILTER_REJECTS, rejects),
        (c::FILTER_RULES, g.engine.table().len() as u64),
        (c::EVENTS_SENT, g.frames.events_sent),
        (c::RX_PACKETS, d.rx_packets),
        (c::RX_NOT_READY, d.rx_not_ready),
        (c::USER_RULES, user.len() as u64),
        (c::USER_RULE_HITS, user_hits),
    ]
}

/// Apply a RULE_SET or RULE_DEL (docs/control-protocol.md §2.10–2.11) to the table the
/// aRFS filters share. Errors: the errno and the `bad_by_kind` name.
fn user_rule(table: &FilterTable, queue_pairs: u16, req: &Request) -> Result<(), (i32, &'static str)> {
    match *req {
        Request::RuleSet(spec) => {
            if matches!(spec.action, RuleAction::Queue(q) if q >= queue_pairs) {
                return Err((libc::EINVAL, "rule_bad_queue"));
            }
            table.set_user_rule(spec).map_err(|e| (e.errno(), "rule_table_full"))
        }
        Request::RuleDel { location: RULE_LOC_ALL } => {
            table.flush_user_rules();
            Ok(())
        }
        Request::RuleDel { location } => table.delete_user_rule(location).map_err(|e| (e.errno(), "rule_unknown")),
        _ => Ok(()),
    }
}

fn op_name(op: u8) -> &'static str {
    match op {
        wire::op::HELLO => "hello",
        wire::op::STATS => "stats",
        wire::op::DEV_STATS => "dev_stats",
        wire::op::RSS_GET => "rss_get",
        wire::op::RSS_SET => "rss_set",
        wire::op::RULE_SET => "rule_set",
        wire::op::RULE_DEL => "rule_del",
        wire::op::HASH_GET => "hash_get",
        wire::op::HASH_SET => "hash_set",
        wire::op::CTX_SET => "ctx_set",
        wire::op::CTX_DEL => "ctx_del",
        _ => Op::ALL.into_iter().find(|&o| wire_op(o) == op).map_or("other", Op::name),
    }
}

/// Sends what the backlog holds, then `out`, in order, and counts the frames.
fn send_all(sh: &Shared, out: Vec<Outgoing>) {
    if out.is_empty() && !sh.backlog.waiting() {
        return;
    }
    let c = sh.backlog.send(&*sh.sink, sh.clock.now_ns(), out);
    let mut g = sh.lock();
    let f = &mut g.frames;
    f.completions_sent += c.completions_sent;
    f.events_sent += c.events_sent;
    f.completions_dropped += c.completions_dropped;
    f.completions_dropped_no_buffer += c.completions_dropped_no_buffer;
    f.events_dropped += c.events_dropped;
    f.frames_deferred += c.frames_deferred;
    sh.sent.store(f.completions_sent + f.events_sent, Relaxed);
    if sh.backlog.waiting() {
        // the timer thread retries while frames wait
        sh.wake.notify_one();
    }
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
        if sh.backlog.waiting() {
            drop(g);
            send_all(sh, Vec::new());
            g = sh.lock();
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
        let retry = sh.backlog.waiting().then_some(backlog::RETRY);
        let wait = match g.engine.next_deadline() {
            None => retry,
            Some(d) if d <= now => continue,
            Some(d) => Some(retry.map_or(Duration::from_nanos(d - now), |r| r.min(Duration::from_nanos(d - now)))),
        };
        g = match wait {
            None => sh.wake.wait(g).unwrap_or_else(|e| e.into_inner()),
            Some(t) => sh.wake.wait_timeout(g, t).unwrap_or_else(|e| e.into_inner()).0,
        };
    }
}

impl ControlPlane for ControlRuntime {
    fn on_control_frame(&self, pair: u16, frame: &[u8]) {
        self.handle_frame(pair, frame);
    }
    fn on_device_reset(&self) {
        self.reset();
    }
}

impl Drop for ControlRuntime {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
#[path = "control_tests.rs"]
mod tests;
