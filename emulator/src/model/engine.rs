//! The command engine: the emulated NIC firmware that executes filter commands.
//!
//! A discrete-event model driven by explicit timestamps. Commands arrive with a
//! timestamp, wait in a bounded FIFO queue for one of `slots` execution slots, take a
//! service time drawn from the profile's distribution (seeded RNG), and complete. A
//! command's effect on the filter table happens at its completion time, not before.
//! The caller moves time forward with [`Engine::advance`] and sleeps until
//! [`Engine::next_deadline`]; with wall-clock timestamps the driver really waits.
//!
//! Determinism: for the same profile, seed and sequence of (time, call) the outputs are
//! identical. RNG draws happen when a command starts, in start order: the service time,
//! then (only when configured) the error draw, then the lost-completion draw.
//!
//! Faults: error rate per operation with an errno; `disabled` (every ADD answers EPERM
//! at once, like mlx5 with its aRFS state cleared); stall (no command starts and the
//! executing ones are frozen for the duration); flush of the whole table (firmware
//! reset, emits an event); lost completions (the command takes effect, no completion is
//! emitted). Optional idle aging removes rules without hits for `idle_ms` and emits an
//! event per rule.

use super::errno;
use super::filter::{Action, FilterTable, RuleSnapshot};
use super::latency::Sampler;
use super::profile::{Overflow, Profile, ScheduledAction};
use crate::wire::FlowKey;
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Add,
    Mod,
    Del,
    Flush,
    Query,
}

impl Op {
    pub const ALL: [Op; 5] = [Op::Add, Op::Mod, Op::Del, Op::Flush, Op::Query];

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            Op::Add => "add",
            Op::Mod => "mod",
            Op::Del => "del",
            Op::Flush => "flush",
            Op::Query => "query",
        }
    }

    pub fn from_name(s: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|o| o.name() == s)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Add { id: u32, key: FlowKey, action: Action },
    Mod { id: u32, action: Action },
    Del { id: u32 },
    Flush,
    Query { id: u32 },
}

impl Command {
    pub fn op(&self) -> Op {
        match self {
            Command::Add { .. } => Op::Add,
            Command::Mod { .. } => Op::Mod,
            Command::Del { .. } => Op::Del,
            Command::Flush => Op::Flush,
            Command::Query { .. } => Op::Query,
        }
    }

    pub fn id(&self) -> Option<u32> {
        match self {
            Command::Add { id, .. } | Command::Mod { id, .. } | Command::Del { id } | Command::Query { id } => {
                Some(*id)
            }
            Command::Flush => None,
        }
    }
}

/// The answer to one command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The caller's token (e.g. queue pair and sequence number of the request).
    pub tag: u64,
    pub op: Op,
    pub id: Option<u32>,
    /// 0 or a positive Linux errno.
    pub status: i32,
    pub enqueue_ns: u64,
    pub start_ns: u64,
    pub finish_ns: u64,
    /// QUERY: the rule.
    pub rule: Option<RuleSnapshot>,
}

/// Device-initiated notifications.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    RuleAged { id: u32, key: FlowKey, at_ns: u64 },
    TableFlushed { rules: usize, at_ns: u64 },
    EngineState { disabled: bool, at_ns: u64 },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    Completion(Completion),
    Event(Event),
}

/// Faults injected at run time (or from the profile's schedule).
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    Disable(bool),
    Stall {
        ns: u64,
    },
    Flush,
    /// Error rate for ADD, MOD or DEL (rate 0 turns it off).
    Errors {
        op: Op,
        rate: f64,
        errno: i32,
    },
    LostCompletions {
        rate: f64,
    },
}

/// Latency percentiles of one operation, microseconds (enqueue to finish).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub count: u64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OpStats {
    pub submitted: u64,
    pub completed_ok: u64,
    /// Failed completions by errno name (including immediate rejections).
    pub errors: BTreeMap<String, u64>,
    pub latency: LatencySummary,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineStats {
    pub queue_depth_now: usize,
    pub queue_depth_max: usize,
    pub executing_now: usize,
    pub overflow_dropped: u64,
    pub lost_completions: u64,
    pub aged_out: u64,
    pub fault_flushes: u64,
    pub stalls: u64,
    pub disabled: bool,
    pub ops: BTreeMap<Cow<'static, str>, OpStats>,
}

struct Pending {
    tag: u64,
    cmd: Command,
    enq: u64,
}

struct Running {
    tag: u64,
    cmd: Command,
    enq: u64,
    start: u64,
    finish: u64,
    fail: Option<i32>,
    lost: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Next {
    // Order matters for ties: completions free slots, faults apply before starts.
    Finish,
    Schedule,
    Start,
    Scan,
}

pub struct Engine {
    table: Arc<FilterTable>,
    slots: usize,
    depth: usize,
    overflow: Overflow,
    max_inflight_adds: usize,
    samplers: [Sampler; 5],
    min_service: [u64; 5],
    errors: [Option<(f64, i32)>; 3],
    lost_rate: f64,
    disabled: bool,
    rng: ChaCha8Rng,
    pending: VecDeque<Pending>,
    running: Vec<Running>,
    now: u64,
    stall_until: u64,
    schedule: VecDeque<(u64, Fault)>,
    /// The profile's schedule, offsets (ns) from the moment it is armed.
    schedule_spec: Vec<(u64, Fault)>,
    aging: Option<(u64, u64)>,
    next_scan: u64,
    inflight_adds: usize,
    hist: [Histogram<u64>; 5],
    ops: [OpStats; 5],
    stats: EngineStats,
}

fn injectable(name: &str) -> i32 {
    errno::from_name(name).unwrap_or(libc::EIO)
}

impl Engine {
    /// An engine for `profile` over `table`, with its clock starting at `start_ns`.
    pub fn new(profile: &Profile, table: Arc<FilterTable>, start_ns: u64) -> Self {
        let e = &profile.engine;
        let l = &e.latency;
        let samplers = [l.add.sampler(), l.modify.sampler(), l.del.sampler(), l.flush.sampler(), l.query.sampler()];
        let min_service = std::array::from_fn(|i| samplers[i].min_ns());
        let f = &profile.faults;
        let ef = |x: &Option<super::profile::ErrorFault>| x.as_ref().map(|x| (x.rate, injectable(&x.errno)));
        let mut schedule_spec: Vec<(u64, Fault)> = f
            .schedule
            .iter()
            .map(|s| {
                let at = s.at_ms * 1_000_000;
                let fault = match s.action {
                    ScheduledAction::Disable => Fault::Disable(true),
                    ScheduledAction::Enable => Fault::Disable(false),
                    ScheduledAction::Stall => Fault::Stall { ns: s.ms.unwrap_or(0) * 1_000_000 },
                    ScheduledAction::Flush => Fault::Flush,
                    ScheduledAction::Errors => Fault::Errors {
                        op: s.op.as_deref().and_then(Op::from_name).unwrap_or(Op::Add),
                        rate: s.rate.unwrap_or(0.0),
                        errno: injectable(s.errno.as_deref().unwrap_or("ENOSPC")),
                    },
                };
                (at, fault)
            })
            .collect();
        schedule_spec.sort_by_key(|s| s.0);
        let schedule = schedule_spec.iter().map(|(at, f)| (start_ns + at, f.clone())).collect();
        let aging = (profile.aging.idle_ms > 0)
            .then(|| (profile.aging.idle_ms * 1_000_000, profile.aging.scan_ms.max(1) * 1_000_000));
        let hist = std::array::from_fn(|_| Histogram::new(3).expect("3 significant digits is a valid histogram"));
        Engine {
            table,
            slots: e.slots.max(1),
            depth: e.queue_depth,
            overflow: e.overflow,
            max_inflight_adds: e.max_inflight_adds,
            samplers,
            min_service,
            errors: [ef(&f.add), ef(&f.modify), ef(&f.del)],
            lost_rate: f.lost_completion_rate,
            disabled: f.disabled,
            rng: ChaCha8Rng::seed_from_u64(e.seed),
            pending: VecDeque::new(),
            running: Vec::new(),
            now: start_ns,
            stall_until: start_ns,
            schedule,
            schedule_spec,
            aging,
            next_scan: aging.map_or(u64::MAX, |(_, scan)| start_ns + scan),
            inflight_adds: 0,
            hist,
            ops: Default::default(),
            stats: EngineStats { disabled: f.disabled, ..Default::default() },
        }
    }

    pub fn table(&self) -> &Arc<FilterTable> {
        &self.table
    }

    /// Lower bound of the service time of `op` (0 for unbounded distributions).
    pub fn min_service_ns(&self, op: Op) -> u64 {
        self.min_service[op.index()]
    }

    /// The engine's clock: the last time it was advanced to.
    pub fn now(&self) -> u64 {
        self.now
    }

    fn reject(&mut self, tag: u64, cmd: &Command, status: i32, now: u64, out: &mut Vec<Output>) {
        self.count_error(cmd, status);
        out.push(Output::Completion(Completion {
            tag,
            op: cmd.op(),
            id: cmd.id(),
            status,
            enqueue_ns: now,
            start_ns: now,
            finish_ns: now,
            rule: None,
        }));
    }

    fn count_error(&mut self, cmd: &Command, status: i32) {
        let name = errno::name(status).into_owned();
        *self.ops[cmd.op().index()].errors.entry(name).or_default() += 1;
        let part = match cmd {
            Command::Add { key, .. } => Some(self.table.partition_of(key)),
            Command::Mod { id, .. } | Command::Del { id } | Command::Query { id } => self.table.partition_of_id(*id),
            Command::Flush => None,
        };
        if let Some(p) = part {
            self.table.count_reject(p, status);
        }
    }

    /// Submit a command arriving at `now` (first advancing to `now`). Immediate
    /// answers (EPERM while disabled, EBUSY for the in-flight cap or a full queue) are
    /// pushed to `out` at once; everything else completes later.
    pub fn submit(&mut self, tag: u64, cmd: Command, now: u64, out: &mut Vec<Output>) {
        self.advance(now, out);
        let now = self.now;
        self.ops[cmd.op().index()].submitted += 1;
        let is_add = matches!(cmd, Command::Add { .. });
        if is_add && self.disabled {
            return self.reject(tag, &cmd, libc::EPERM, now, out);
        }
        if is_add && self.max_inflight_adds > 0 && self.inflight_adds >= self.max_inflight_adds {
            return self.reject(tag, &cmd, libc::EBUSY, now, out);
        }
        let can_start_now = self.running.len() < self.slots && self.stall_until <= now && self.pending.is_empty();
        if !can_start_now && self.pending.len() >= self.depth {
            match self.overflow {
                Overflow::Reject => return self.reject(tag, &cmd, libc::EBUSY, now, out),
                Overflow::Drop => {
                    self.stats.overflow_dropped += 1;
                    return;
                }
            }
        }
        if is_add {
            self.inflight_adds += 1;
        }
        self.pending.push_back(Pending { tag, cmd, enq: now });
        self.stats.queue_depth_max = self.stats.queue_depth_max.max(self.pending.len());
        self.advance(now, out);
    }

    /// Apply a fault at `now` (first advancing to `now`).
    /// Drop the scheduled faults that have not fired yet; `arm_schedule` starts the
    /// profile's schedule again.
    pub fn hold_schedule(&mut self) {
        self.schedule.clear();
    }

    /// (Re)start the profile's whole fault schedule with its offsets counted from `now`
    /// (the engine starts with it armed at its start time). Used to time faults from
    /// the start of the traffic rather than from the guest's boot.
    pub fn arm_schedule(&mut self, now: u64, out: &mut Vec<Output>) {
        self.advance(now, out);
        self.schedule = self.schedule_spec.iter().map(|(at, f)| (now + at, f.clone())).collect();
    }

    pub fn inject(&mut self, fault: Fault, now: u64, out: &mut Vec<Output>) {
        self.advance(now, out);
        self.apply_fault(fault, out);
    }

    fn apply_fault(&mut self, fault: Fault, out: &mut Vec<Output>) {
        let now = self.now;
        match fault {
            Fault::Disable(d) => {
                self.disabled = d;
                self.stats.disabled = d;
                out.push(Output::Event(Event::EngineState { disabled: d, at_ns: now }));
            }
            Fault::Stall { ns } => {
                self.stats.stalls += 1;
                // Executing commands freeze for the part of the stall that is new.
                let new_end = now.saturating_add(ns);
                let extra = new_end.saturating_sub(self.stall_until.max(now));
                for r in &mut self.running {
                    r.finish = r.finish.saturating_add(extra);
                }
                self.stall_until = self.stall_until.max(new_end);
            }
            Fault::Flush => {
                self.stats.fault_flushes += 1;
                let rules = self.table.flush();
                out.push(Output::Event(Event::TableFlushed { rules, at_ns: now }));
            }
            Fault::Errors { op, rate, errno } => {
                if op.index() < 3 {
                    self.errors[op.index()] = (rate > 0.0).then_some((rate, errno));
                }
            }
            Fault::LostCompletions { rate } => self.lost_rate = rate,
        }
    }

    fn next_event(&self) -> Option<(u64, Next)> {
        let mut best: Option<(u64, Next)> = None;
        let mut consider = |t: u64, k: Next| {
            if best.is_none_or(|b| (t, k) < b) {
                best = Some((t, k));
            }
        };
        if let Some(t) = self.running.iter().map(|r| r.finish).min() {
            consider(t, Next::Finish);
        }
        if let Some((t, _)) = self.schedule.front() {
            consider(*t, Next::Schedule);
        }
        if self.running.len() < self.slots && !self.pending.is_empty() {
            consider(self.now.max(self.stall_until), Next::Start);
        }
        if self.aging.is_some() {
            consider(self.next_scan, Next::Scan);
        }
        best
    }

    /// When the engine next has something to do (a completion, a start after a stall,
    /// a scheduled fault or an aging scan), if anything.
    pub fn next_deadline(&self) -> Option<u64> {
        self.next_event().map(|(t, _)| t)
    }

    /// Process everything that happens up to and including `now`.
    pub fn advance(&mut self, now: u64, out: &mut Vec<Output>) {
        while let Some((t, kind)) = self.next_event() {
            if t > now {
                break;
            }
            self.now = self.now.max(t);
            match kind {
                Next::Finish => self.finish_one(out),
                Next::Schedule => {
                    if let Some((_, f)) = self.schedule.pop_front() {
                        self.apply_fault(f, out);
                    }
                }
                Next::Start => self.start_one(),
                Next::Scan => self.scan(out),
            }
        }
        self.now = self.now.max(now);
        self.stats.queue_depth_now = self.pending.len();
        self.stats.executing_now = self.running.len();
    }

    fn start_one(&mut self) {
        let Some(p) = self.pending.pop_front() else { return };
        let op = p.cmd.op();
        let service = self.samplers[op.index()].sample_ns(&mut self.rng);
        let fail = match self.errors.get(op.index()).copied().flatten() {
            Some((rate, errno)) if rate > 0.0 => (self.rng.random::<f64>() < rate).then_some(errno),
            _ => None,
        };
        let lost = self.lost_rate > 0.0 && self.rng.random::<f64>() < self.lost_rate;
        let start = self.now;
        self.running.push(Running {
            tag: p.tag,
            cmd: p.cmd,
            enq: p.enq,
            start,
            finish: start.saturating_add(service),
            fail,
            lost,
        });
    }

    fn finish_one(&mut self, out: &mut Vec<Output>) {
        let Some(i) = self.running.iter().enumerate().min_by_key(|(_, r)| (r.finish, r.start)).map(|(i, _)| i) else {
            return;
        };
        let r = self.running.remove(i);
        let at = r.finish;
        let op = r.cmd.op();
        if op == Op::Add {
            self.inflight_adds = self.inflight_adds.saturating_sub(1);
        }
        let mut rule = None;
        let status = match (r.fail, &r.cmd) {
            (Some(e), _) => e,
            (None, Command::Add { id, key, action }) => {
                self.table.insert(*id, *key, *action, at).err().map_or(0, |e| e.errno())
            }
            (None, Command::Mod { id, action }) => self.table.modify(*id, *action).err().map_or(0, |e| e.errno()),
            (None, Command::Del { id }) => self.table.delete(*id).err().map_or(0, |e| e.errno()),
            (None, Command::Flush) => {
                self.table.flush();
                0
            }
            (None, Command::Query { id }) => match self.table.get(*id) {
                Some(s) => {
                    rule = Some(s);
                    0
                }
                None => libc::ENOENT,
            },
        };
        if status == 0 {
            self.ops[op.index()].completed_ok += 1;
        } else {
            self.count_error(&r.cmd, status);
        }
        let _ = self.hist[op.index()].record(at - r.enq);
        if r.lost {
            self.stats.lost_completions += 1;
            return;
        }
        out.push(Output::Completion(Completion {
            tag: r.tag,
            op,
            id: r.cmd.id(),
            status,
            enqueue_ns: r.enq,
            start_ns: r.start,
            finish_ns: at,
            rule,
        }));
    }

    fn scan(&mut self, out: &mut Vec<Output>) {
        let Some((idle, scan)) = self.aging else { return };
        let now = self.now;
        for id in self.table.idle_rules(now, idle) {
            if let Ok(rule) = self.table.delete(id) {
                self.stats.aged_out += 1;
                out.push(Output::Event(Event::RuleAged { id, key: rule.key, at_ns: now }));
            }
        }
        self.next_scan = now.saturating_add(scan);
    }

    pub fn stats(&self) -> EngineStats {
        let mut s = self.stats.clone();
        for op in Op::ALL {
            let h = &self.hist[op.index()];
            let q = |x: f64| h.value_at_quantile(x) as f64 / 1000.0;
            let mut o = self.ops[op.index()].clone();
            o.latency = LatencySummary {
                count: h.len(),
                p50_us: q(0.5),
                p90_us: q(0.9),
                p99_us: q(0.99),
                max_us: h.max() as f64 / 1000.0,
            };
            s.ops.insert(Cow::Borrowed(op.name()), o);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::filter::Layout;
    use crate::wire::L4Proto;

    const MS: u64 = 1_000_000;
    const US: u64 = 1_000;

    fn profile(extra: &str) -> Profile {
        Profile::parse(&format!("name = \"t\"\n[filter]\nlayout = \"shared\"\ncapacity = 4\n{extra}")).unwrap()
    }

    fn key(i: u16) -> FlowKey {
        FlowKey::v4(L4Proto::Udp, [10, 0, 0, 1], 9000 + i, [10, 0, 0, 2], 7000 + i)
    }

    fn engine(extra: &str) -> Engine {
        let p = profile(extra);
        Engine::new(&p, Arc::new(FilterTable::new(p.filter.layout, p.filter.capacity)), 0)
    }

    fn completions(out: &[Output]) -> Vec<&Completion> {
        out.iter()
            .filter_map(|o| match o {
                Output::Completion(c) => Some(c),
                _ => None,
            })
            .collect()
    }

    const FIXED_50: &str =
        "[engine.latency]\nadd = { dist = \"fixed\", us = 50 }\ndel = { dist = \"fixed\", us = 20 }\n";

    #[test]
    fn rule_takes_effect_at_completion() {
        let mut e = engine(FIXED_50);
        let mut out = vec![];
        e.submit(1, Command::Add { id: 5, key: key(1), action: Action::Queue(2) }, 1000, &mut out);
        assert!(out.is_empty());
        assert_eq!(e.next_deadline(), Some(1000 + 50 * US));
        e.advance(1000 + 50 * US - 1, &mut out);
        assert!(out.is_empty());
        assert_eq!(e.table().lookup(&key(1), 1, 0), None);
        e.advance(1000 + 50 * US, &mut out);
        let c = completions(&out);
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].tag, c[0].status, c[0].enqueue_ns, c[0].start_ns, c[0].finish_ns), (1, 0, 1000, 1000, 51_000));
        assert_eq!(e.table().lookup(&key(1), 1, 0), Some((5, Action::Queue(2))));
    }

    #[test]
    fn one_slot_serialises_and_queue_overflow_rejects() {
        let mut e = engine(&format!("[engine]\nslots = 1\nqueue_depth = 2\n{FIXED_50}"));
        let mut out = vec![];
        for i in 0..4u16 {
            e.submit(
                u64::from(i),
                Command::Add { id: u32::from(i), key: key(i), action: Action::Queue(0) },
                0,
                &mut out,
            );
        }
        // 1 executing + 2 queued; the fourth is rejected at once with EBUSY.
        let c = completions(&out);
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].tag, c[0].status), (3, libc::EBUSY));
        assert_eq!(e.stats().queue_depth_max, 2);
        out.clear();
        e.advance(MS, &mut out);
        let finishes: Vec<u64> = completions(&out).iter().map(|c| c.finish_ns).collect();
        assert_eq!(finishes, vec![50 * US, 100 * US, 150 * US]);
    }

    #[test]
    fn parallel_slots_overlap() {
        let mut e = engine(&format!("[engine]\nslots = 2\n{FIXED_50}"));
        let mut out = vec![];
        for i in 0..3u16 {
            e.submit(0, Command::Add { id: u32::from(i), key: key(i), action: Action::Queue(0) }, 0, &mut out);
        }
        e.advance(MS, &mut out);
        let finishes: Vec<u64> = completions(&out).iter().map(|c| c.finish_ns).collect();
        assert_eq!(finishes, vec![50 * US, 50 * US, 100 * US]);
    }

    #[test]
    fn inflight_cap_answers_ebusy() {
        let mut e = engine(&format!("[engine]\nslots = 4\nmax_inflight_adds = 2\n{FIXED_50}"));
        let mut out = vec![];
        for i in 0..3u16 {
            e.submit(
                u64::from(i),
                Command::Add { id: u32::from(i), key: key(i), action: Action::Queue(0) },
                0,
                &mut out,
            );
        }
        assert_eq!(completions(&out).iter().map(|c| (c.tag, c.status)).collect::<Vec<_>>(), vec![(2, libc::EBUSY)]);
        e.advance(50 * US, &mut out);
        out.clear();
        e.submit(9, Command::Add { id: 9, key: key(9), action: Action::Queue(0) }, 50 * US, &mut out);
        assert!(out.is_empty(), "room again after completions");
    }

    #[test]
    fn disabled_answers_eperm_and_errors_are_counted() {
        let mut e = engine("[faults]\ndisabled = true\n");
        let mut out = vec![];
        e.submit(1, Command::Add { id: 1, key: key(1), action: Action::Queue(0) }, 0, &mut out);
        assert_eq!(completions(&out)[0].status, libc::EPERM);
        e.inject(Fault::Disable(false), 10, &mut out);
        assert!(matches!(out.last(), Some(Output::Event(Event::EngineState { disabled: false, .. }))));
        out.clear();
        e.submit(2, Command::Add { id: 1, key: key(1), action: Action::Queue(0) }, 20, &mut out);
        assert_eq!(completions(&out)[0].status, 0);
        let s = e.stats();
        assert_eq!(s.ops["add"].errors["EPERM"], 1);
        assert_eq!(s.ops["add"].completed_ok, 1);
        assert_eq!(e.table().stats()[0].rejects["EPERM"], 1);
    }

    #[test]
    fn stall_delays_starts_and_freezes_running() {
        let mut e = engine(FIXED_50);
        let mut out = vec![];
        e.submit(1, Command::Add { id: 1, key: key(1), action: Action::Queue(0) }, 0, &mut out);
        e.inject(Fault::Stall { ns: MS }, 10 * US, &mut out);
        e.submit(2, Command::Del { id: 1 }, 20 * US, &mut out);
        e.advance(10 * MS, &mut out);
        let c = completions(&out);
        assert_eq!(c[0].finish_ns, 50 * US + MS);
        assert_eq!(c[1].start_ns, 50 * US + MS);
        assert_eq!(c[1].finish_ns, 70 * US + MS);
    }

    #[test]
    fn flush_fault_and_lost_completions() {
        let mut e = engine("[faults]\nlost_completion_rate = 1.0\n");
        let mut out = vec![];
        e.submit(1, Command::Add { id: 1, key: key(1), action: Action::Queue(0) }, 0, &mut out);
        e.advance(1, &mut out);
        assert!(out.is_empty(), "completion lost");
        assert!(e.table().contains_id(1), "but the rule was installed");
        e.inject(Fault::Flush, 2, &mut out);
        assert_eq!(out, vec![Output::Event(Event::TableFlushed { rules: 1, at_ns: 2 })]);
        assert!(e.table().is_empty());
        assert_eq!(e.stats().lost_completions, 1);
    }

    #[test]
    fn error_rate_fails_that_share() {
        let mut e = engine("[faults]\nadd = { rate = 0.3, errno = \"ENOSPC\" }\n");
        e.table = Arc::new(FilterTable::new(Layout::Shared, 100_000));
        let mut out = vec![];
        for i in 0..10_000u32 {
            e.submit(0, Command::Add { id: i, key: key(i as u16), action: Action::Queue(0) }, u64::from(i), &mut out);
            if i % 1000 == 999 {
                // keep distinct keys: delete them again
                for j in i - 999..=i {
                    e.submit(0, Command::Del { id: j }, u64::from(i), &mut out);
                }
            }
        }
        e.advance(u64::MAX / 2, &mut out);
        let failed = completions(&out).iter().filter(|c| c.op == Op::Add && c.status == libc::ENOSPC).count();
        assert!((2700..3300).contains(&failed), "{failed} of 10000 ADDs failed");
        assert_eq!(e.stats().ops["add"].errors["ENOSPC"], failed as u64);
    }

    #[test]
    fn aging_removes_idle_rules_with_events() {
        let mut e = engine("[aging]\nidle_ms = 10\nscan_ms = 1\n");
        let mut out = vec![];
        e.submit(1, Command::Add { id: 1, key: key(1), action: Action::Queue(0) }, 0, &mut out);
        e.submit(2, Command::Add { id: 2, key: key(2), action: Action::Queue(0) }, 0, &mut out);
        // Rule 2 keeps getting hits.
        for t in 1..30 {
            e.advance(t * MS, &mut out);
            e.table().lookup(&key(2), 1, t * MS);
        }
        let aged: Vec<u32> = out
            .iter()
            .filter_map(|o| match o {
                Output::Event(Event::RuleAged { id, .. }) => Some(*id),
                _ => None,
            })
            .collect();
        assert_eq!(aged, vec![1]);
        assert!(e.table().contains_id(2));
        assert_eq!(e.stats().aged_out, 1);
    }

    #[test]
    fn scheduled_window_of_eperm() {
        let extra = "[[faults.schedule]]\nat_ms = 5\naction = \"disable\"\n[[faults.schedule]]\nat_ms = 8\naction = \"enable\"\n";
        let mut e = engine(extra);
        let mut out = vec![];
        let statuses: Vec<i32> = [1u64, 6, 9]
            .iter()
            .enumerate()
            .map(|(i, &ms)| {
                out.clear();
                e.submit(
                    0,
                    Command::Add { id: i as u32, key: key(i as u16), action: Action::Queue(0) },
                    ms * MS,
                    &mut out,
                );
                e.advance(ms * MS, &mut out);
                completions(&out).last().map_or(-1, |c| c.status)
            })
            .collect();
        assert_eq!(statuses, vec![0, libc::EPERM, 0]);
    }

    #[test]
    fn held_schedule_counts_from_arming() {
        // ENOSPC on every ADD from 5 ms to 8 ms after arming; held until 100 ms.
        let extra =
            "[[faults.schedule]]\nat_ms = 5\naction = \"errors\"\nop = \"add\"\nrate = 1.0\nerrno = \"ENOSPC\"\n\
                     [[faults.schedule]]\nat_ms = 8\naction = \"errors\"\nop = \"add\"\nrate = 0.0\n";
        let mut e = engine(extra);
        e.hold_schedule();
        let mut out = vec![];
        let mut add_at = |e: &mut Engine, id: u32, ms: u64| {
            out.clear();
            e.submit(
                u64::from(id),
                Command::Add { id, key: key(id as u16), action: Action::Queue(0) },
                ms * MS,
                &mut out,
            );
            e.advance(ms * MS, &mut out);
            completions(&out).last().map_or(-1, |c| c.status)
        };
        assert_eq!(add_at(&mut e, 1, 6), 0, "held: nothing fires at 5 ms");
        let mut arm_out = vec![];
        e.arm_schedule(100 * MS, &mut arm_out);
        let statuses: Vec<i32> =
            [(2, 104), (3, 106), (4, 107), (5, 109)].iter().map(|&(id, ms)| add_at(&mut e, id, ms)).collect();
        assert_eq!(statuses, vec![0, libc::ENOSPC, libc::ENOSPC, 0]);
    }

    #[test]
    fn query_and_unknown_ids() {
        let mut e = engine("");
        let mut out = vec![];
        e.submit(1, Command::Add { id: 1, key: key(1), action: Action::Queue(3) }, 0, &mut out);
        e.submit(2, Command::Query { id: 1 }, 0, &mut out);
        e.submit(3, Command::Mod { id: 77, action: Action::Queue(1) }, 0, &mut out);
        e.submit(4, Command::Del { id: 77 }, 0, &mut out);
        let c = completions(&out);
        assert_eq!(c[1].rule.as_ref().map(|r| r.action), Some(Action::Queue(3)));
        assert_eq!((c[2].status, c[3].status), (libc::ENOENT, libc::ENOENT));
    }
}
