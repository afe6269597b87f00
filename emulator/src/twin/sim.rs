//! The discrete-event loop: packets of the scenario's flows, the workers' hops, the
//! driver's ordered workqueue and the device's command engine, in one timeline of
//! nanoseconds. One call of [`simulate`] is one run of a scenario.

use super::driver::{Driver, DriverStyle, Hw, Work};
use super::rfs::{KernelRfs, Rfs};
use super::topo::Topology;
use super::TwinError;
use crate::model::engine::{Command, Engine, Output};
use crate::model::filter::Action;
use crate::model::nic::Nic;
use crate::model::profile::Profile;
use crate::wire::{FlowKey, L4Proto};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// How the application threads move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// Pinned, never moving.
    None,
    /// Every `period`, to the next CPU of the starting CPU's LLC (round robin).
    HopWithinLlc,
    /// Every `period`, to a CPU of the next LLC group, rotating inside it.
    HopAcrossLlc,
    /// Pinned workers sharing one epoll set of one-shot flow sockets (brpc-like): each
    /// request is read by one of the workers. Which one is the guest's scheduling:
    /// `ep_poll()` queues a waiter at the head of the wait queue, so the latest to wait
    /// is woken first, and a worker still running takes a ready socket before a woken
    /// one does. The twin draws the reader uniformly, or, given a VM run's share of
    /// reads on the flow's previous CPU ([`RunSpec::reread`]), keeps the previous reader
    /// with that share and draws among the others otherwise.
    WorkStealing,
}

/// The protocol of the flows (the device hashes their 4-tuples).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// A connected UDP socket per flow, partner port `base + i` to guest port `base + i`.
    Udp,
    /// Pooled TCP connections to one listening port, partner port `base + i`.
    Tcp,
}

/// One run's setting, taken from a scenario and its run.
#[derive(Clone, Debug)]
pub struct RunSpec {
    pub proto: Proto,
    pub kernel: KernelRfs,
    pub llc_skip: bool,
    pub arfs: bool,
    pub flows: u32,
    pub rate_pps: f64,
    pub payload: usize,
    pub workers: u32,
    /// Work stealing: the workers split into this many pods, flow i read in pod i mod pods.
    pub pods: u32,
    pub pattern: Pattern,
    pub period_ns: u64,
    pub sock_entries: u32,
    pub flow_cnt: u32,
    pub duration_ns: u64,
    pub warmup_ns: u64,
    pub seed: u64,
    /// Per flow, the `rps_dev_flow` slot its hash fell in during a VM boot (the driver's
    /// `flow_id`), to replay that boot's slot sharing; `None` or missing: a random hash.
    pub slots: Vec<Option<u32>>,
    /// Work stealing: the share of a flow's reads done on the CPU of its previous read,
    /// as a VM run measured it (arfs-echo's per-flow `cpu_changes`); the other reads go
    /// to the pod's other workers uniformly. `None`: every read drawn uniformly.
    pub reread: Option<f64>,
    /// How late a VM run's rule works ran (the module's debugfs `work_delays`): per
    /// [`WORK_DELAY_BIN_NS`] since the first rule work was queued, the mean delay (ms) of
    /// that bin's works (older reports: the longest). A work that wakes the idle
    /// workqueue in a bin starts that late (or after the profile's delay if longer);
    /// works queued behind it follow as the worker gets to them, not before their own
    /// bin's delay. Empty: every wake-up after the profile's delay.
    pub work_delays: Vec<u16>,
    /// Per worker, the time between its hops in a VM run (arfs-echo's run time over its
    /// `hops` + 1: a loaded guest hops late); missing: `period_ns`.
    pub hop_periods_ns: Vec<u64>,
    /// When the requests start, after the workers' common start (the hops' epoch): a VM
    /// run's partner starts on arfs-echo's `ready`, and a loaded guest reads the first
    /// request that much later (its `first_request_s`). The flows' first rules are then
    /// still being installed when the first workers hop. 0: together. The traffic then
    /// runs for `duration_ns`; the profile's fault schedule and the per-second samples
    /// start with it, as the runner arms and samples them.
    pub traffic_start_ns: u64,
    /// Per worker, when a VM run's worker hopped, after the hops' epoch (arfs-echo's
    /// `hop_us`): a loaded guest hops late and unevenly, more so in some seconds than
    /// others, which a mean period spreads out. A worker with times hops at them (and
    /// by its period after a full log of [`HOP_LOG`]); without: [`Self::hop_periods_ns`].
    pub hop_times_ns: Vec<Vec<u64>>,
}

impl RunSpec {
    /// Worker `w`'s time between hops.
    fn period_of(&self, w: u32) -> u64 {
        self.hop_periods_ns.get(w as usize).copied().filter(|&p| p > 0).unwrap_or(self.period_ns)
    }

    /// When worker `w` hops for the `n`th time (from 0), given its previous hop at
    /// `prev`: at a VM run's time, else a period after; `None`: a VM run's worker that
    /// hopped no more.
    fn hop_at(&self, w: u32, n: u64, prev: u64) -> Option<u64> {
        let p = self.period_of(w);
        match self.hop_times_ns.get(w as usize).filter(|t| !t.is_empty()) {
            Some(t) => match t.get(n as usize) {
                Some(&at) => Some(at.max(prev)),
                None if t.len() >= HOP_LOG => Some(prev + p),
                None => None,
            },
            // arfs-echo: worker i first hops (1 + i / W) periods after the start.
            None if n == 0 => Some(p + p * u64::from(w) / u64::from(self.workers.max(1))),
            None => Some(prev + p),
        }
    }
}

/// The hop times arfs-echo keeps per worker (its `HOP_LOG`).
pub const HOP_LOG: usize = 4096;

/// The width of a bin of [`RunSpec::work_delays`] (the module's `ARFS_DELAY_BIN_MS`).
pub const WORK_DELAY_BIN_NS: u64 = 10_000_000;
/// The bins the module keeps (`ARFS_DELAY_BINS`).
pub const WORK_DELAY_BINS: usize = 4096;

/// One second of the driver's counters, cumulative at the second's end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    pub steer_calls: u64,
    pub steer_same: u64,
    pub adds: u64,
    pub mods: u64,
    pub dels: u64,
    pub lock_acquired: u64,
    pub lock_contended: u64,
    pub lock_wait_ns: u64,
}

/// What a run left behind.
pub struct Outcome {
    pub driver: Driver,
    pub rfs: super::rfs::RfsStats,
    pub engine: crate::model::engine::EngineStats,
    pub partitions: Vec<crate::model::filter::PartitionStats>,
    pub rules_at_end: usize,
    /// Cumulative at every whole second, index 0 = t 0.
    pub samples: Vec<Sample>,
    pub rx_per_queue: Vec<u64>,
    pub filter_per_queue: Vec<u64>,
    pub packets: u64,
    pub stuck: u64,
    pub events: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// The link partner's pure ACK of an answer (TCP).
    Ack(u32),
    Hop(u32),
    WqRun,
    ExpireTimer,
    CmdDone {
        status: i32,
    },
    Sample,
    /// The traffic starts: the profile's fault schedule is armed and the per-second
    /// samples begin, as the runner does when it starts the link partner.
    TrafficStart,
}

struct FlowState {
    key: FlowKey,
    hash: u32,
    packets: u64,
    last_queue: u16,
    /// The CPU of the thread that read its last request.
    app_cpu: u16,
    /// Work stealing: the worker that read its last request (`u32::MAX`: none yet).
    reader: u32,
    /// When the flow's packets last went through a filter (None: never).
    last_via_filter_ns: Option<u64>,
}

struct Worker {
    cpu: u16,
    start_cpu: u16,
    hops: u64,
    id: u32,
}

/// What the workqueue's worker is in the middle of.
enum Exec {
    Idle,
    /// A WqRun event is scheduled.
    Starting,
    RuleCmd {
        id: u16,
        add: bool,
    },
    Dels {
        left: Vec<(u16, Hw)>,
    },
    /// ice's service task: the deletes, then the entries to program, one command at a
    /// time.
    Sync {
        dels: Vec<(u16, Hw)>,
        program: Vec<u16>,
        /// The command in flight: (rule id, add).
        current: Option<(u16, bool)>,
    },
}

struct Sim<'a> {
    spec: &'a RunSpec,
    topo: &'a Topology,
    now: u64,
    seq: u64,
    heap: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    /// The requests: every flow sends one per interval at its own phase, so the arrivals
    /// repeat the flows' phase order each interval; a cursor walks them instead of a heap
    /// entry per flow.
    arrivals: Arrivals,
    nic: &'a Nic,
    /// The device's classifier (RSS snapshot, filter table reader), renewed every
    /// simulated second so the table's retired entries are reclaimed.
    cls: crate::model::nic::Classifier<'a>,
    engine: Engine,
    out: Vec<Output>,
    rfs: Rfs,
    driver: Driver,
    /// In arrival order: flow f is `flows[pos[f]]`.
    flows: Vec<FlowState>,
    pos: Vec<u32>,
    workers: Vec<Worker>,
    /// Work stealing: who reads the next request.
    rng: ChaCha8Rng,
    exec: Exec,
    samples: Vec<Sample>,
    rx_per_queue: Vec<u64>,
    filter_per_queue: Vec<u64>,
    packets: u64,
    events: u64,
}

/// Every flow's requests: flow f at `phase_f + k * interval` for k = 0, 1, …
struct Arrivals {
    /// (phase, flow), in time order.
    phases: Vec<(u64, u32)>,
    interval: u64,
    /// The next arrival: `phases[next]` in the interval starting at `base`.
    next: usize,
    base: u64,
}

impl Arrivals {
    fn peek(&self) -> Option<(u64, u32)> {
        let &(phase, f) = self.phases.get(self.next)?;
        Some((self.base.saturating_add(phase), f))
    }

    fn advance(&mut self) {
        self.next += 1;
        if self.next == self.phases.len() {
            self.next = 0;
            self.base = self.base.saturating_add(self.interval);
        }
    }
}

/// The link partner's delayed ACK (smoltcp's default): a pooled connection's answer is
/// acknowledged by a pure ACK this long after it, as no request follows sooner.
pub const TCP_ACK_DELAY_NS: u64 = 10_000_000;

/// The flow key of flow `i` as a VM run's link partner sends it: partner
/// `PARTNER_IP:PARTNER_BASE_PORT + i` to guest `GUEST_IP:GUEST_BASE_PORT + i` (UDP) or to
/// the one listening port `GUEST_IP:GUEST_BASE_PORT` (TCP), so the device's RSS puts each
/// flow on the queue it gets in the VM.
pub fn flow_key(proto: Proto, i: u32) -> FlowKey {
    use crate::runner::{GUEST_BASE_PORT, GUEST_IP, PARTNER_BASE_PORT, PARTNER_IP};
    let (l4, dport) = match proto {
        Proto::Udp => (L4Proto::Udp, GUEST_BASE_PORT.wrapping_add(i as u16)),
        Proto::Tcp => (L4Proto::Tcp, GUEST_BASE_PORT),
    };
    FlowKey::v4(l4, PARTNER_IP.octets(), PARTNER_BASE_PORT.wrapping_add(i as u16), GUEST_IP.octets(), dport)
}

/// Run one scenario run to its end.
pub fn simulate(
    spec: &RunSpec,
    topo: &Topology,
    profile: &Profile,
    queues: u16,
    driver: Driver,
) -> Result<Outcome, TwinError> {
    if driver.profile.driver == DriverStyle::Ice && spec.proto == Proto::Udp && spec.arfs {
        return Err(TwinError::field(
            "guest.proto",
            "udp under an ice twin profile: ice's 5 s expiry of UDP filters is not modelled (use tcp)",
        ));
    }
    let nic = Nic::new(profile, queues).map_err(|e| TwinError::field("nic.queues", e.to_string()))?;
    let nic = &nic;
    let engine = Engine::new(profile, nic.table().clone(), 0);
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
    let per_flow = spec.rate_pps / f64::from(spec.flows.max(1));
    let interval_ns = if per_flow > 0.0 { (1e9 / per_flow).max(1.0) as u64 } else { u64::MAX };
    let log = (spec.flow_cnt > 0).then(|| spec.flow_cnt.trailing_zeros() as u8);
    let mut flows: Vec<FlowState> = (0..spec.flows)
        .map(|i| FlowState {
            key: flow_key(spec.proto, i),
            // The guest's skb hash is the kernel's software flow hash, keyed per boot:
            // random per run here (0 means "no hash" to RFS), or in the slot a VM boot put
            // the flow in.
            hash: match (spec.slots.get(i as usize).copied().flatten(), log) {
                (Some(slot), Some(log)) => super::rfs::hash_in_slot(spec.kernel, slot, log, rng.random()),
                _ => rng.random_range(1..=u32::MAX),
            },
            packets: 0,
            reader: u32::MAX,
            last_queue: 0,
            app_cpu: 0,
            last_via_filter_ns: None,
        })
        .collect();
    let cpus = topo.cpus() as u32;
    let workers = (0..spec.workers)
        .map(|w| {
            let c = (w % cpus) as u16;
            Worker { cpu: c, start_cpu: c, hops: 0, id: w }
        })
        .collect();
    // The requests' phases; the flows' states are kept in arrival order, so the packet
    // path walks them in memory order.
    let mut phases: Vec<(u64, u32)> = Vec::new();
    let mut pos: Vec<u32> = (0..spec.flows).collect();
    if interval_ns != u64::MAX {
        phases = (0..spec.flows).map(|f| (rng.random_range(0..interval_ns), f)).collect();
        phases.sort_unstable();
        let mut by_arrival = Vec::with_capacity(flows.len());
        let mut taken: Vec<Option<FlowState>> = flows.into_iter().map(Some).collect();
        for (i, &(_, f)) in phases.iter().enumerate() {
            pos[f as usize] = i as u32;
            by_arrival.push(taken[f as usize].take().expect("each flow once"));
        }
        flows = by_arrival;
    }
    let rfs = Rfs::new(spec.kernel, topo.cpus(), queues, spec.sock_entries, spec.flow_cnt, spec.llc_skip, spec.arfs);
    let mut sim = Sim {
        spec,
        topo,
        now: 0,
        seq: 0,
        heap: BinaryHeap::new(),
        arrivals: Arrivals { phases, interval: interval_ns, next: 0, base: spec.traffic_start_ns },
        nic,
        cls: nic.classifier(),
        engine,
        out: Vec::new(),
        rfs,
        driver,
        flows,
        pos,
        workers,
        rng: ChaCha8Rng::seed_from_u64(spec.seed ^ 0x5eed_57ea),
        exec: Exec::Idle,
        samples: vec![Sample::default()],
        rx_per_queue: vec![0; usize::from(queues)],
        filter_per_queue: vec![0; usize::from(queues)],
        packets: 0,
        events: 0,
    };
    if matches!(spec.pattern, Pattern::HopWithinLlc | Pattern::HopAcrossLlc) && spec.workers > 0 {
        for w in 0..spec.workers {
            if let Some(t) = spec.hop_at(w, 0, 0) {
                sim.push(t, Ev::Hop(w));
            }
        }
    }
    if spec.arfs {
        sim.push(u64::from(sim.driver.profile.expire_interval_ms) * 1_000_000, Ev::ExpireTimer);
    }
    // The profile's fault schedule (an EPERM window, say) and the samples start with the
    // traffic, as the runner arms and samples them; the traffic runs for `duration_ns`.
    if spec.traffic_start_ns == 0 {
        sim.traffic_start();
    } else {
        sim.push(spec.traffic_start_ns, Ev::TrafficStart);
    }
    sim.run();
    let stuck = sim.stuck();
    Ok(Outcome {
        rfs: sim.rfs.stats,
        engine: sim.engine.stats(),
        partitions: sim.nic.table().stats(),
        rules_at_end: sim.nic.table().len(),
        samples: sim.samples,
        rx_per_queue: sim.rx_per_queue,
        filter_per_queue: sim.filter_per_queue,
        packets: sim.packets,
        stuck,
        events: sim.events,
        driver: sim.driver,
    })
}

impl Sim<'_> {
    fn push(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((t, self.seq, ev)));
    }

    /// The end of the traffic, after the hops' epoch.
    fn end_ns(&self) -> u64 {
        self.spec.traffic_start_ns.saturating_add(self.spec.duration_ns)
    }

    fn traffic_start(&mut self) {
        self.samples = vec![self.sample()];
        self.engine.arm_schedule(self.now, &mut self.out);
        self.take_outputs();
        self.push(self.now + 1_000_000_000, Ev::Sample);
    }

    fn sample(&self) -> Sample {
        let c = &self.driver.ctr;
        Sample {
            steer_calls: c.steer_calls,
            steer_same: c.steer_same,
            adds: c.adds_ok,
            mods: c.mods_ok,
            dels: c.dels_ok,
            lock_acquired: c.lock_acquired,
            lock_contended: c.lock_contended,
            lock_wait_ns: c.lock_wait_ns,
        }
    }

    fn run(&mut self) {
        let end = self.end_ns();
        loop {
            let heap_next = self.heap.peek().map(|Reverse((t, _, _))| *t);
            let packet_next = self.arrivals.peek();
            let next = match (heap_next, packet_next) {
                (Some(h), Some((p, _))) => Some(h.min(p)),
                (h, p) => h.or(p.map(|(t, _)| t)),
            };
            // The device's own deadlines (command completions) come first when earlier.
            if let Some(d) = self.engine.next_deadline() {
                if next.is_none_or(|t| d <= t) && d <= end {
                    self.now = self.now.max(d);
                    self.engine.advance(d, &mut self.out);
                    self.take_outputs();
                    continue;
                }
            }
            // A request, unless an event is due first (or at the same time).
            if let Some((t, f)) = packet_next.filter(|&(p, _)| heap_next.is_none_or(|h| p < h)) {
                if t > end {
                    break;
                }
                self.arrivals.advance();
                self.now = t;
                self.events += 1;
                self.packet(f);
                continue;
            }
            let Some(Reverse((t, _, ev))) = self.heap.pop() else { break };
            if t > end {
                break;
            }
            self.now = t;
            self.events += 1;
            match ev {
                Ev::Ack(f) => {
                    self.rx(f, 54);
                    self.kick_wq();
                }
                Ev::Hop(w) => self.hop(w),
                Ev::WqRun => self.wq_run(),
                Ev::ExpireTimer => {
                    match self.driver.profile.driver {
                        DriverStyle::Mlx5 => self.driver.wq.push_back((Work::Expire, t)),
                        // ice's service timer.
                        DriverStyle::Ice => {
                            self.driver.schedule_sync(t);
                            let next = t + u64::from(self.driver.profile.expire_interval_ms.max(1)) * 1_000_000;
                            self.push(next, Ev::ExpireTimer);
                        }
                    }
                    self.kick_wq();
                }
                Ev::CmdDone { status } => self.cmd_done(status),
                Ev::Sample => {
                    let s = self.sample();
                    self.samples.push(s);
                    self.cls = self.nic.classifier();
                    self.push(t + 1_000_000_000, Ev::Sample);
                }
                Ev::TrafficStart => self.traffic_start(),
            }
        }
    }

    /// A request of flow `f`: received, read by a worker, answered; over TCP the partner's
    /// ACK of the answer follows `TCP_ACK_DELAY_NS` later (the next request is due one
    /// interval later, [`Arrivals`]).
    fn packet(&mut self, f: u32) {
        let t = self.now;
        let hash = self.rx(f, 42 + self.spec.payload);
        // A worker reads it on the CPU it runs on (recvmsg records the flow): the flow's
        // own worker, or under work stealing one of the idle ones.
        let w = match self.spec.pattern {
            Pattern::WorkStealing => {
                let per_pod = self.spec.workers / self.spec.pods.max(1);
                let pod = f % self.spec.pods.max(1);
                let prev = self.flows[self.pos[f as usize] as usize].reader;
                match self.spec.reread {
                    // The previous reader again with the measured share, else one of the
                    // pod's other workers.
                    Some(q) if per_pod > 1 && prev != u32::MAX => Some(if self.rng.random_bool(q.clamp(0.0, 1.0)) {
                        prev
                    } else {
                        let k = self.rng.random_range(0..per_pod - 1);
                        let k = if pod * per_pod + k >= prev { k + 1 } else { k };
                        pod * per_pod + k
                    }),
                    _ => (per_pod > 0).then(|| pod * per_pod + self.rng.random_range(0..per_pod)),
                }
            }
            _ => (!self.workers.is_empty()).then(|| f % self.spec.workers),
        };
        let fl = &mut self.flows[self.pos[f as usize] as usize];
        if let Some(w) = w {
            let cpu = self.workers[w as usize].cpu;
            self.rfs.record_sock_flow(hash, cpu);
            fl.app_cpu = cpu;
            fl.reader = w;
        }
        if self.spec.proto == Proto::Tcp {
            self.push(t + TCP_ACK_DELAY_NS, Ev::Ack(f));
        }
        self.kick_wq();
    }

    /// One packet of flow `f` through the device and `get_rps_cpu()`; returns its hash.
    fn rx(&mut self, f: u32, len: usize) -> u32 {
        let t = self.now;
        let fl = &self.flows[self.pos[f as usize] as usize];
        let (key, hash) = (fl.key, fl.hash);
        let d = self.cls.decide_key(&key, len, t);
        let q = d.and_then(|d| d.queue).unwrap_or(0);
        let via_filter = d.is_some_and(|d| d.filter.is_some());
        self.packets += 1;
        self.rx_per_queue[usize::from(q)] += 1;
        if via_filter {
            self.filter_per_queue[usize::from(q)] += 1;
        }
        let driver = &mut self.driver;
        self.rfs.receive(self.topo, q, hash, |rxq, flow_id| driver.steer(t, f, rxq, flow_id));
        let fl = &mut self.flows[self.pos[f as usize] as usize];
        fl.packets += 1;
        fl.last_queue = q;
        if via_filter {
            fl.last_via_filter_ns = Some(t);
        }
        hash
    }

    fn hop(&mut self, w: u32) {
        let topo = self.topo;
        let wk = &mut self.workers[w as usize];
        let cur = wk.cpu;
        let g = topo.llc[usize::from(cur)] as usize;
        let next = match self.spec.pattern {
            Pattern::HopAcrossLlc if topo.groups.len() > 1 => {
                let ng = &topo.groups[(g + 1) % topo.groups.len()];
                ng[((wk.hops + u64::from(wk.id)) % ng.len() as u64) as usize]
            }
            Pattern::HopWithinLlc | Pattern::HopAcrossLlc => {
                let sg = &topo.groups[topo.llc[usize::from(wk.start_cpu)] as usize];
                let pos = sg.iter().position(|&c| c == cur).unwrap_or(0);
                sg[(pos + 1) % sg.len()]
            }
            Pattern::None | Pattern::WorkStealing => cur,
        };
        wk.hops += 1;
        wk.cpu = next;
        if let Some(t) = self.spec.hop_at(w, wk.hops, self.now) {
            self.push(t, Ev::Hop(w));
        }
    }

    /// Wake the workqueue's worker when it sleeps and work is queued.
    fn kick_wq(&mut self) {
        if matches!(self.exec, Exec::Idle) && !self.driver.wq.is_empty() {
            self.exec = Exec::Starting;
            let t = self.now + self.driver.profile.wq_delay_ns.max(self.vm_work_delay_ns(self.now));
            self.push(t, Ev::WqRun);
        }
    }

    fn wq_run(&mut self) {
        let t = self.now;
        let Some((work, queued)) = self.driver.wq.pop_front() else {
            self.exec = Exec::Idle;
            return;
        };
        match work {
            Work::Rule(id) => {
                let Some(r) = self.driver.rules.get_mut(&id) else { return self.next_work(t) };
                r.pending = false;
                let Some((cmd, add)) = self.rule_command(id) else { return self.next_work(t) };
                let hold = self.driver.profile.work_hold_ns;
                let t1 = self.driver.lock(t, hold);
                self.driver.ctr.work_runs += 1;
                self.driver.ctr.work_delay_ns += t.saturating_sub(queued);
                self.exec = Exec::RuleCmd { id, add };
                self.submit(t1, cmd);
            }
            Work::Expire => {
                self.expire_then_delete(t);
                let next = t + u64::from(self.driver.profile.expire_interval_ms.max(1)) * 1_000_000;
                self.push(next, Ev::ExpireTimer);
            }
            Work::Sync => {
                let rfs = &self.rfs;
                let (mut program, gone, t1) = self.driver.sync(t, |r| rfs.may_expire(r.rxq, r.flow_id, r.filter_id));
                let mut dels: Vec<(u16, Hw)> = gone.into_iter().map(|r| (r.filter_id, r.hw)).collect();
                // Sent in list order, as the task walks its lists.
                dels.reverse();
                program.reverse();
                self.sync_next(t1, dels, program);
            }
        }
    }

    /// The command that puts rule `id` on the device: ADD without a device filter (true),
    /// else MOD; `None` when the rule is gone.
    fn rule_command(&self, id: u16) -> Option<(Command, bool)> {
        let r = self.driver.rules.get(&id)?;
        let action = Action::Queue(r.rxq);
        Some(match r.hw {
            Hw::None => {
                let key = self.flows[self.pos[r.flow as usize] as usize].key;
                (Command::Add { id: u32::from(id), key, action }, true)
            }
            Hw::Installed => (Command::Mod { id: u32::from(id), action }, false),
        })
    }

    /// A rule's ADD (`add`) or MOD completed with `status`: the counters and the rule's
    /// device state (a MOD the device no longer knows leaves it without a filter).
    fn rule_command_done(&mut self, id: u16, add: bool, status: i32) {
        let c = &mut self.driver.ctr;
        match (status, add) {
            (0, true) => c.adds_ok += 1,
            (0, false) => c.mods_ok += 1,
            (_, true) => c.add_errors += 1,
            (_, false) => c.mod_errors += 1,
        }
        if let Some(r) = self.driver.rules.get_mut(&id) {
            if status == 0 {
                r.hw = Hw::Installed;
            } else if !add && status == libc::ENOENT {
                r.hw = Hw::None;
            }
        }
    }

    fn delete_done(&mut self, status: i32) {
        if status == 0 {
            self.driver.ctr.dels_ok += 1;
        } else {
            self.driver.ctr.del_errors += 1;
        }
    }

    /// The service task's next command, or its end (the scheduled bit clears).
    fn sync_next(&mut self, t: u64, mut dels: Vec<(u16, Hw)>, mut program: Vec<u16>) {
        while let Some((id, hw)) = dels.pop() {
            if hw != Hw::None {
                self.exec = Exec::Sync { dels, program, current: None };
                self.submit(t, Command::Del { id: u32::from(id) });
                return;
            }
        }
        while let Some(id) = program.pop() {
            let Some((cmd, add)) = self.rule_command(id) else { continue };
            self.exec = Exec::Sync { dels, program, current: Some((id, add)) };
            self.submit(t, cmd);
            return;
        }
        self.driver.sync_scheduled = false;
        self.next_work(t);
    }

    /// Send a command at `t` (plus half the transport): its completion comes back as a
    /// CmdDone event.
    fn submit(&mut self, t: u64, cmd: Command) {
        let at = t + self.driver.profile.transport_ns / 2;
        // The engine's clock must not run backwards: it was advanced to deadlines only.
        let at = at.max(self.engine.now());
        self.engine.submit(0, cmd, at, &mut self.out);
        self.take_outputs();
    }

    fn take_outputs(&mut self) {
        let back = self.driver.profile.transport_ns / 2;
        for o in std::mem::take(&mut self.out) {
            match o {
                Output::Completion(c) => self.push(c.finish_ns + back, Ev::CmdDone { status: c.status }),
                Output::Event(crate::model::engine::Event::RuleAged { id, .. }) => {
                    if let Some(r) = u16::try_from(id).ok().and_then(|id| self.driver.rules.get_mut(&id)) {
                        r.hw = Hw::None;
                    }
                }
                // ENGINE_STATE: the module refuses steers while the engine is disabled.
                Output::Event(crate::model::engine::Event::EngineState { disabled, .. }) => {
                    self.driver.engine_disabled = disabled;
                }
                Output::Event(_) => {}
            }
        }
    }

    fn cmd_done(&mut self, status: i32) {
        let t = self.now;
        match std::mem::replace(&mut self.exec, Exec::Idle) {
            Exec::RuleCmd { id, add } => {
                let hold = self.driver.profile.work_hold_ns;
                let t1 = self.driver.lock(t, hold);
                self.rule_command_done(id, add, status);
                if let Some(r) = self.driver.rules.get_mut(&id) {
                    r.busy = r.pending;
                }
                self.expire_then_delete(t1);
            }
            Exec::Dels { left, .. } => {
                self.delete_done(status);
                self.delete_next(t, left);
            }
            Exec::Sync { dels, program, current } => {
                match current {
                    Some((id, add)) => self.rule_command_done(id, add, status),
                    None => self.delete_done(status),
                }
                self.sync_next(t, dels, program);
            }
            Exec::Idle | Exec::Starting => {}
        }
    }

    /// `arfs_may_expire_flow()`: scan, then delete the device filters of the rules that
    /// went, one command at a time.
    fn expire_then_delete(&mut self, t: u64) {
        let rfs = &self.rfs;
        let (gone, t1) = self.driver.expire(t, |r| rfs.may_expire(r.rxq, r.flow_id, r.filter_id));
        let left = gone.into_iter().map(|r| (r.filter_id, r.hw)).collect();
        self.delete_next(t1, left);
    }

    fn delete_next(&mut self, t: u64, mut left: Vec<(u16, Hw)>) {
        while let Some((id, hw)) = left.pop() {
            if hw != Hw::None {
                self.exec = Exec::Dels { left };
                self.submit(t, Command::Del { id: u32::from(id) });
                return;
            }
        }
        self.next_work(t);
    }

    /// The worker goes on with the next item at `t` without sleeping, or sleeps.
    fn next_work(&mut self, t: u64) {
        self.exec = Exec::Idle;
        if let Some(&(_, queued)) = self.driver.wq.front() {
            self.exec = Exec::Starting;
            // Not before the VM run's delay for works queued when this one was: a loaded
            // guest's worker gets through a backlog slower than the device answers.
            let t = t.max(queued.saturating_add(self.vm_work_delay_ns(queued)));
            self.push(t.max(self.now), Ev::WqRun);
        }
    }

    /// The delay the VM run measured for works queued at `t` (its bin of
    /// [`RunSpec::work_delays`]); 0 without them.
    fn vm_work_delay_ns(&self, t: u64) -> u64 {
        let Some(first) = self.driver.first_rule_queued_ns else { return 0 };
        let bin = usize::try_from(t.saturating_sub(first) / WORK_DELAY_BIN_NS).unwrap_or(usize::MAX);
        self.spec.work_delays.get(bin).map_or(0, |&ms| u64::from(ms) * 1_000_000)
    }

    /// `flows_stuck_without_filter` as docs/measuring.md defines it.
    fn stuck(&self) -> u64 {
        if !self.spec.arfs {
            return 0;
        }
        let end = self.end_ns();
        let table = self.nic.table();
        self.flows
            .iter()
            .enumerate()
            .filter(|(_, f)| {
                let app_cpu = f.app_cpu;
                let irq = self.topo.irq_cpu[usize::from(f.last_queue)];
                f.packets > 0
                    && table.peek(&f.key).is_none()
                    && f.last_via_filter_ns.is_none_or(|t| end.saturating_sub(t) >= 2_000_000_000)
                    && !self.topo.share_cache(app_cpu, irq)
            })
            .count() as u64
    }
}
