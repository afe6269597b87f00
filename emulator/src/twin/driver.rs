//! The aRFS driver, shaped as mlx5's `en_arfs.c` and our guest module
//! (guest-tests/module/arfs_rules.c) are: a rule per 5-tuple, `arfs_lock` around the
//! rule table, `ndo_rx_flow_steer` answering *same* / *update* / *new*, one work per rule
//! on an ordered workqueue that sends ADD or MOD to the device, and an expiry scan (at
//! most `expire_quota` rules) after every rule work and every `expire_interval_ms`.
//!
//! With `driver = "ice"` in the twin profile it is shaped as ice's `ice_arfs.c` instead:
//! every `ndo_rx_flow_steer` takes the lock and only records or re-targets its entry, and
//! the service task — scheduled by such a steer unless already scheduled, and every
//! second — programs every recorded entry and deletes every expired one in one pass
//! (no quota), then clears its scheduled bit.
//!
//! Time is explicit: `arfs_lock` is a resource with a hold time per critical section
//! (`TwinProfile`), so contention comes from overlapping holds, not from host threads.

use std::collections::{BTreeMap, VecDeque};

/// Which driver's aRFS bookkeeping the twin runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DriverStyle {
    /// mlx5's `en_arfs.c` and our module: a work per rule, expiry after each work.
    #[default]
    Mlx5,
    /// ice's `ice_arfs.c`: entries recorded under the lock, programmed and expired by the
    /// service task in batches.
    Ice,
}

/// The CPU cost of the driver's critical sections and its workqueue: `configs/twin/*.toml`
/// (docs/model.md says where the values come from). Every field is required but
/// `driver` (mlx5 when absent).
#[derive(Clone, Copy, Debug, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct TwinProfile {
    /// `arfs_lock` held by one `ndo_rx_flow_steer` that takes the locked path.
    pub steer_hold_ns: u64,
    /// `arfs_lock` held by each of a rule work's two critical sections.
    pub work_hold_ns: u64,
    /// Expiry scan: per rule looked at, under the lock.
    pub scan_ns_per_rule: u64,
    /// From `queue_work()` to the worker running it when the workqueue is idle.
    pub wq_delay_ns: u64,
    /// Guest → device → guest transport of one command, on top of the device's latency.
    pub transport_ns: u64,
    /// Module parameters (`expire_quota`, `expire_interval_ms`).
    pub expire_quota: u32,
    pub expire_interval_ms: u32,
    #[serde(default)]
    pub driver: DriverStyle,
}

impl Default for TwinProfile {
    /// configs/twin/native.toml's values (tests; the CLI loads the files).
    fn default() -> Self {
        TwinProfile {
            steer_hold_ns: 1_500,
            work_hold_ns: 1_000,
            scan_ns_per_rule: 50,
            wq_delay_ns: 20_000,
            transport_ns: 30_000,
            expire_quota: 60,
            expire_interval_ms: 1000,
            driver: DriverStyle::Mlx5,
        }
    }
}

impl TwinProfile {
    /// Values the twin cannot run with, as (field, why).
    pub fn validate(&self) -> Result<(), (String, String)> {
        let bound = |f: &str, v: u64, max: u64| {
            (v <= max).then_some(()).ok_or_else(|| (f.to_string(), format!("{v} is above {max}")))
        };
        bound("steer_hold_ns", self.steer_hold_ns, 1_000_000_000)?;
        bound("work_hold_ns", self.work_hold_ns, 1_000_000_000)?;
        bound("scan_ns_per_rule", self.scan_ns_per_rule, 1_000_000)?;
        bound("wq_delay_ns", self.wq_delay_ns, 10_000_000_000)?;
        bound("transport_ns", self.transport_ns, 10_000_000_000)?;
        if self.expire_quota == 0 {
            return Err(("expire_quota".into(), "must be at least 1 (the module's default is 60)".into()));
        }
        if self.expire_interval_ms == 0 {
            return Err(("expire_interval_ms".into(), "must be at least 1 (the module's default is 1000)".into()));
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hw {
    None,
    Installed,
}

#[derive(Clone, Debug)]
pub struct Rule {
    pub flow: u32,
    pub rxq: u16,
    pub flow_id: u32,
    pub filter_id: u16,
    pub hw: Hw,
    /// The rule's work is queued or running (`work_busy()`); `pending` alone is
    /// `work_pending()`.
    pub busy: bool,
    pub pending: bool,
}

/// What the ordered workqueue runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    Rule(u16),
    Expire,
    /// ice's service task.
    Sync,
}

/// The driver's counters (names as the module's STATS).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriverCounters {
    pub steer_calls: u64,
    pub steer_same: u64,
    pub steer_update: u64,
    pub steer_new: u64,
    /// Refused with EPERM: the device reported its engine disabled.
    pub steer_eperm: u64,
    pub adds_ok: u64,
    pub mods_ok: u64,
    pub dels_ok: u64,
    pub add_errors: u64,
    pub mod_errors: u64,
    pub del_errors: u64,
    pub lock_acquired: u64,
    pub lock_contended: u64,
    pub lock_wait_ns: u64,
    pub lock_wait_ns_max: u64,
    pub rules_peak: u64,
    pub expire_scans: u64,
    pub expire_scanned: u64,
    pub work_runs: u64,
    pub work_delay_ns: u64,
}

pub struct Driver {
    pub profile: TwinProfile,
    /// Rules by filter id, and the id of each flow's rule.
    /// Rules by filter id (in id order: the expiry scan's order).
    pub rules: BTreeMap<u16, Rule>,
    /// Per flow index, the id of its rule (`NO_RULE`: none).
    by_flow: Vec<u16>,
    last_filter_id: u32,
    lock_free_at: u64,
    pub wq: VecDeque<(Work, u64)>,
    /// When the first rule work was queued: the origin of a VM run's `work_delays` bins
    /// (the module's `first_queued_ns`, set by the first steer that queues a work; an
    /// expiry work before it does not count).
    pub first_rule_queued_ns: Option<u64>,
    pub ctr: DriverCounters,
    /// The device's last ENGINE_STATE event said disabled.
    pub engine_disabled: bool,
    /// ice: the service task is scheduled or running (`ICE_SERVICE_SCHED`).
    pub sync_scheduled: bool,
}

/// `RPS_NO_FILTER`: filter ids wrap below it.
const NO_FILTER: u32 = 0xffff;
/// `by_flow`: a flow without a rule.
const NO_RULE: u16 = u16::MAX;

impl Driver {
    pub fn new(profile: TwinProfile) -> Driver {
        Driver {
            profile,
            rules: BTreeMap::new(),
            by_flow: Vec::new(),
            last_filter_id: 0,
            lock_free_at: 0,
            wq: VecDeque::new(),
            first_rule_queued_ns: None,
            ctr: DriverCounters::default(),
            engine_disabled: false,
            sync_scheduled: false,
        }
    }

    /// Take `arfs_lock` at `t` for `hold` ns: when it is free (the spin is counted as
    /// contention and wait, as `arfs_lock_bh()` counts it). Returns when it is released.
    pub fn lock(&mut self, t: u64, hold: u64) -> u64 {
        self.ctr.lock_acquired += 1;
        let start = if t < self.lock_free_at {
            let wait = self.lock_free_at - t;
            self.ctr.lock_contended += 1;
            self.ctr.lock_wait_ns += wait;
            self.ctr.lock_wait_ns_max = self.ctr.lock_wait_ns_max.max(wait);
            self.lock_free_at
        } else {
            t
        };
        self.lock_free_at = start + hold;
        self.lock_free_at
    }

    /// `ndo_rx_flow_steer` for `flow` to `rxq`, slot `flow_id`, at `t`: the filter id.
    pub fn steer(&mut self, t: u64, flow: u32, rxq: u16, flow_id: u32) -> i32 {
        if self.profile.driver == DriverStyle::Ice {
            return self.steer_ice(t, flow, rxq, flow_id);
        }
        self.ctr.steer_calls += 1;
        // The lockless same check (not while the engine is disabled), then the locked path.
        if self.engine_disabled {
            self.lock(t, self.profile.steer_hold_ns);
            self.ctr.steer_eperm += 1;
            return -libc::EPERM;
        }
        if let Some(id) = self.rule_of(flow).filter(|r| r.rxq == rxq || r.busy).map(|r| r.filter_id) {
            self.ctr.steer_same += 1;
            return i32::from(id);
        }
        self.lock(t, self.profile.steer_hold_ns);
        let id = match self.rule_of(flow).map(|r| r.filter_id) {
            Some(id) => {
                let r = self.rules.get_mut(&id).expect("by_flow names a live rule");
                r.rxq = rxq;
                self.ctr.steer_update += 1;
                id
            }
            None => match self.new_rule(flow, rxq, flow_id) {
                Some(id) => id,
                None => return -libc::ENOSPC,
            },
        };
        let r = self.rules.get_mut(&id).expect("rule just found or made");
        if !r.busy {
            r.busy = true;
            r.pending = true;
            self.wq.push_back((Work::Rule(id), t));
            self.first_rule_queued_ns.get_or_insert(t);
        }
        i32::from(id)
    }

    /// A rule for `flow` under the next filter id (`None`: that id is still live).
    fn new_rule(&mut self, flow: u32, rxq: u16, flow_id: u32) -> Option<u16> {
        let id = (self.last_filter_id % NO_FILTER) as u16;
        self.last_filter_id = self.last_filter_id.wrapping_add(1);
        if self.rules.contains_key(&id) {
            // 65535 rules live: the module's id hash would hold two; never at the scales
            // of the scenarios, refused instead of aliasing.
            return None;
        }
        let rule = Rule { flow, rxq, flow_id, filter_id: id, hw: Hw::None, busy: false, pending: false };
        self.rules.insert(id, rule);
        let f = flow as usize;
        if f >= self.by_flow.len() {
            self.by_flow.resize(f + 1, NO_RULE);
        }
        self.by_flow[f] = id;
        self.ctr.steer_new += 1;
        self.ctr.rules_peak = self.ctr.rules_peak.max(self.rules.len() as u64);
        Some(id)
    }

    /// ice's `ice_rx_flow_steer()`: under the lock, the flow's entry keeps its queue (or
    /// still waits for the service task: `pending`, ICE_ARFS_INACTIVE) and its id is the
    /// answer; or it is re-targeted, or made, and waits for the service task, which this
    /// schedules unless it already is.
    fn steer_ice(&mut self, t: u64, flow: u32, rxq: u16, flow_id: u32) -> i32 {
        self.ctr.steer_calls += 1;
        self.lock(t, self.profile.steer_hold_ns);
        if self.engine_disabled {
            self.ctr.steer_eperm += 1;
            return -libc::EPERM;
        }
        let id = match self.rule_of(flow).map(|r| (r.filter_id, r.rxq == rxq || r.pending)) {
            Some((id, true)) => {
                self.ctr.steer_same += 1;
                return i32::from(id);
            }
            Some((id, false)) => {
                let r = self.rules.get_mut(&id).expect("by_flow names a live rule");
                (r.rxq, r.pending) = (rxq, true);
                self.ctr.steer_update += 1;
                id
            }
            None => match self.new_rule(flow, rxq, flow_id) {
                Some(id) => {
                    self.rules.get_mut(&id).expect("just made").pending = true;
                    id
                }
                None => return -libc::ENOSPC,
            },
        };
        self.schedule_sync(t);
        i32::from(id)
    }

    /// `ice_service_task_schedule()`: queue the service task unless it is scheduled or
    /// running.
    pub fn schedule_sync(&mut self, t: u64) {
        if !self.sync_scheduled {
            self.sync_scheduled = true;
            self.wq.push_back((Work::Sync, t));
        }
    }

    /// ice's `ice_sync_arfs_fltrs()` under the lock: every waiting entry to be programmed
    /// (ADD, or MOD when it has a device filter), every programmed entry `may_expire`
    /// lets go unlinked (no quota). Returns (to program, gone, lock released at).
    pub fn sync(&mut self, t: u64, mut may_expire: impl FnMut(&Rule) -> bool) -> (Vec<u16>, Vec<Rule>, u64) {
        self.ctr.expire_scans += 1;
        let (mut program, mut gone_ids) = (Vec::new(), Vec::new());
        for (id, r) in self.rules.iter_mut() {
            if r.pending {
                r.pending = false;
                program.push(*id);
            } else if may_expire(r) {
                gone_ids.push(*id);
            }
        }
        let scanned = self.rules.len() as u64;
        let (gone, done) = self.unlink_scanned(t, gone_ids, scanned);
        (program, gone, done)
    }

    /// The expiry scan: the rules `may_expire` lets go (at most `expire_quota`), unlinked;
    /// returns them with the time the lock was released.
    pub fn expire(&mut self, t: u64, mut may_expire: impl FnMut(&Rule) -> bool) -> (Vec<Rule>, u64) {
        self.ctr.expire_scans += 1;
        let quota = self.profile.expire_quota as usize;
        let mut gone_ids = Vec::new();
        let mut scanned = 0u64;
        for (id, r) in &self.rules {
            if gone_ids.len() >= quota {
                break;
            }
            scanned += 1;
            if !r.pending && may_expire(r) {
                gone_ids.push(*id);
            }
        }
        self.unlink_scanned(t, gone_ids, scanned)
    }

    /// Unlink the rules a scan of `scanned` rules let go, holding the lock for the scan;
    /// returns them with the time the lock was released.
    fn unlink_scanned(&mut self, t: u64, gone_ids: Vec<u16>, scanned: u64) -> (Vec<Rule>, u64) {
        let mut gone = Vec::with_capacity(gone_ids.len());
        for id in gone_ids {
            let r = self.rules.remove(&id).expect("listed");
            self.by_flow[r.flow as usize] = NO_RULE;
            gone.push(r);
        }
        self.ctr.expire_scanned += scanned;
        let done = self.lock(t, self.profile.work_hold_ns + scanned * self.profile.scan_ns_per_rule);
        (gone, done)
    }

    /// The rule of `flow`, if it has one.
    pub fn rule_of(&self, flow: u32) -> Option<&Rule> {
        match self.by_flow.get(flow as usize) {
            Some(&id) if id != NO_RULE => self.rules.get(&id),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steer_answers_new_then_same_then_update_once_the_work_ran() {
        let mut d = Driver::new(TwinProfile::default());
        let id = d.steer(0, 7, 2, 99);
        assert_eq!((d.ctr.steer_new, d.wq.len()), (1, 1));
        // The work is queued: a steer elsewhere is answered "same".
        assert_eq!(d.steer(10, 7, 3, 99), id);
        assert_eq!(d.ctr.steer_same, 1);
        let r = d.rules.get_mut(&(id as u16)).unwrap();
        (r.busy, r.pending) = (false, false);
        assert_eq!(d.steer(20, 7, 3, 99), id);
        assert_eq!((d.ctr.steer_update, d.wq.len()), (1, 2));
    }

    #[test]
    fn ice_records_under_the_lock_and_its_service_task_programs_and_expires_in_one_pass() {
        let mut d = Driver::new(TwinProfile { driver: DriverStyle::Ice, ..TwinProfile::default() });
        let a = d.steer(0, 1, 2, 10);
        let b = d.steer(5, 2, 3, 11);
        // One service task for both, every call under the lock.
        assert_eq!((d.wq.len(), d.ctr.lock_acquired, d.ctr.steer_new), (1, 2, 2));
        // Waiting for the service task: the same id, whatever the queue.
        assert_eq!(d.steer(6, 1, 0, 10), a);
        assert_eq!(d.ctr.steer_same, 1);
        let (program, gone, _) = d.sync(100, |_| true);
        assert_eq!((program.len(), gone.len()), (2, 0), "programmed, not yet expirable");
        d.sync_scheduled = false;
        for id in program {
            d.rules.get_mut(&id).unwrap().hw = Hw::Installed;
        }
        // Programmed: a move re-targets the entry and schedules the task again.
        assert_eq!(d.steer(200, 1, 0, 10), a);
        assert_eq!((d.ctr.steer_update, d.wq.len()), (1, 2));
        let (program, gone, _) = d.sync(300, |r| r.filter_id == b as u16);
        assert_eq!(program, vec![a as u16]);
        assert_eq!(gone.iter().map(|r| i32::from(r.filter_id)).collect::<Vec<_>>(), vec![b]);
        assert!(d.rule_of(2).is_none());
    }

    #[test]
    fn overlapping_holds_count_contention_and_wait() {
        let mut d = Driver::new(TwinProfile::default());
        assert_eq!(d.lock(0, 100), 100);
        assert_eq!(d.lock(40, 100), 200);
        assert_eq!((d.ctr.lock_contended, d.ctr.lock_wait_ns), (1, 60));
        d.lock(500, 10);
        assert_eq!(d.ctr.lock_contended, 1);
    }

    #[test]
    fn expiry_takes_at_most_the_quota_and_never_a_pending_rule() {
        let mut d = Driver::new(TwinProfile { expire_quota: 2, ..TwinProfile::default() });
        for f in 0..5 {
            d.steer(0, f, 1, f);
        }
        for r in d.rules.values_mut().filter(|r| r.flow != 0) {
            (r.busy, r.pending) = (false, false);
        }
        let (gone, _) = d.expire(0, |_| true);
        assert_eq!(gone.len(), 2);
        assert!(gone.iter().all(|r| r.flow != 0));
        assert_eq!(d.rules.len(), 3);
    }
}
