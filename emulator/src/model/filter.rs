//! The ntuple / aRFS filter table: exact-match rules on the flow 5-tuple (plus IP
//! version) carrying the driver's filter id, steering to an RX queue or dropping.
//!
//! Concurrency: the datapath looks rules up from every queue thread while the command
//! engine inserts and deletes. Rules live in a lock-free concurrent map (`papaya`): a
//! lookup is plain loads under an epoch guard, which the datapath takes once per burst
//! ([`FilterTable::reader`]), so it never waits for the control path and executes no
//! locked instruction for the table. Writers serialise on a control mutex that also owns
//! the id index and the per-partition accounting, so capacity checks are exact. Per-rule
//! hit counters are relaxed atomics. The choice is measured against `dashmap` (a shard
//! read lock per lookup, what this table used before) and a single `RwLock<HashMap>` in
//! `benches/model.rs` (see docs/performance.md).

use super::ntuple::{self, UserRule, UserRuleSnapshot};
use crate::wire::rule::RuleSpec;
use crate::wire::{FlowKey, IpVersion, L4Proto};
use arc_swap::ArcSwap;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// How the table's capacity is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layout {
    /// Four tables, IPv4/IPv6 × TCP/UDP, each of `capacity` rules (mlx5 aRFS).
    PerType,
    /// One table of `capacity` rules shared by all flow types (sfc, ice, bnxt).
    Shared,
}

/// What a matching rule does with a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Action {
    Queue(u16),
    Drop,
}

const ACTION_DROP: u32 = u32::MAX;

impl Action {
    fn encode(self) -> u32 {
        match self {
            Action::Queue(q) => u32::from(q),
            Action::Drop => ACTION_DROP,
        }
    }
    fn decode(v: u32) -> Self {
        if v == ACTION_DROP {
            Action::Drop
        } else {
            Action::Queue(v as u16)
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    #[error("filter id {0} already exists")]
    DuplicateId(u32),
    #[error("flow {key} already has filter id {existing}")]
    DuplicateFlow { key: FlowKey, existing: u32 },
    #[error("no filter with id {0}")]
    UnknownId(u32),
    #[error("table {partition} is full ({capacity} rules)")]
    TableFull { partition: std::borrow::Cow<'static, str>, capacity: usize },
}

impl FilterError {
    /// The Linux errno a driver would see.
    pub fn errno(&self) -> i32 {
        match self {
            FilterError::DuplicateId(_) | FilterError::DuplicateFlow { .. } => libc::EEXIST,
            FilterError::UnknownId(_) => libc::ENOENT,
            FilterError::TableFull { .. } => libc::ENOSPC,
        }
    }
}

/// One installed rule. Hit counters are updated by the datapath without locks.
#[derive(Debug)]
pub struct Rule {
    pub id: u32,
    pub key: FlowKey,
    pub installed_ns: u64,
    action: AtomicU32,
    hits: AtomicU64,
    bytes: AtomicU64,
    last_hit_ns: AtomicU64,
}

/// A copy of a rule's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RuleSnapshot {
    pub id: u32,
    #[serde(serialize_with = "ser_display")]
    pub key: FlowKey,
    pub action: Action,
    pub hits: u64,
    pub bytes: u64,
    pub installed_ns: u64,
    /// Last time a packet matched, or the install time when none did.
    pub last_active_ns: u64,
}

fn ser_display<S: serde::Serializer, T: std::fmt::Display>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

impl Rule {
    fn snapshot(&self) -> RuleSnapshot {
        RuleSnapshot {
            id: self.id,
            key: self.key,
            action: Action::decode(self.action.load(Ordering::Relaxed)),
            hits: self.hits.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            installed_ns: self.installed_ns,
            last_active_ns: self.last_hit_ns.load(Ordering::Relaxed).max(self.installed_ns),
        }
    }
}

/// [`FilterTable::reader`]: lookups under one epoch guard.
pub struct Reader<'a> {
    map: &'a papaya::HashMap<FlowKey, Rule, ahash::RandomState>,
    guard: papaya::LocalGuard<'a>,
}

impl Reader<'_> {
    /// The matching rule's id and action, counting the hit.
    #[inline]
    pub fn lookup(&self, key: &FlowKey, bytes: u64, now_ns: u64) -> Option<(u32, Action)> {
        let r = self.map.get(key, &self.guard)?;
        r.hits.fetch_add(1, Ordering::Relaxed);
        r.bytes.fetch_add(bytes, Ordering::Relaxed);
        r.last_hit_ns.store(now_ns, Ordering::Relaxed);
        Some((r.id, Action::decode(r.action.load(Ordering::Relaxed))))
    }
}

/// Counters of one partition (one of the four mlx5 tables, or the shared table).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct PartitionStats {
    pub name: std::borrow::Cow<'static, str>,
    pub capacity: usize,
    pub rules_now: usize,
    pub rules_peak: usize,
    pub inserts: u64,
    pub modifies: u64,
    pub deletes: u64,
    /// Rejected commands by errno name (table errors and injected faults).
    pub rejects: BTreeMap<String, u64>,
}

struct Ctrl {
    by_id: HashMap<u32, FlowKey, ahash::RandomState>,
    parts: Vec<PartitionStats>,
    /// User rules by location (the published list is `FilterTable::user`).
    user: BTreeMap<u32, Arc<UserRule>>,
    /// Per partition: how much of `rules_now` is user rules.
    user_per_part: Vec<usize>,
}

/// The filter table.
pub struct FilterTable {
    map: papaya::HashMap<FlowKey, Rule, ahash::RandomState>,
    /// The ethtool ntuple rules in location order (`model::ntuple`), checked before
    /// `map`; replaced as a whole under `ctrl` (they change at ethtool speed).
    user: ArcSwap<Vec<Arc<UserRule>>>,
    /// Whether `user` is non-empty: the datapath's check is a plain load, not an `ArcSwap`
    /// load (stored after `user`, under `ctrl`).
    user_any: AtomicBool,
    user_hits: AtomicU64,
    ctrl: Mutex<Ctrl>,
    layout: Layout,
}

/// Rules the map is sized for from the start, at most: the table's whole capacity up to
/// this. papaya grows a map only when an insert probes past its limit (at ~85 % load), and a
/// lookup that misses — the frames of flows without a rule, most of a wire's — probes until
/// it meets an empty slot: ~15 slots per miss with 256 rules in a map grown to fit them
/// (callgrind, docs/performance.md), one or two in a map sized for the capacity while
/// it holds few rules (full, it is at most ~75 % loaded).
const PRESIZE_MAX: usize = 1 << 16;

const PER_TYPE_NAMES: [&str; 4] = ["ipv4-tcp", "ipv4-udp", "ipv6-tcp", "ipv6-udp"];

impl FilterTable {
    pub fn new(layout: Layout, capacity: usize) -> Self {
        let names: &[&'static str] = match layout {
            Layout::PerType => &PER_TYPE_NAMES,
            Layout::Shared => &["shared"],
        };
        let parts: Vec<PartitionStats> =
            names.iter().map(|&name| PartitionStats { name: name.into(), capacity, ..Default::default() }).collect();
        let user_per_part = vec![0; parts.len()];
        FilterTable {
            map: papaya::HashMap::builder()
                .capacity(capacity.saturating_mul(names.len()).min(PRESIZE_MAX))
                .hasher(ahash::RandomState::new())
                .build(),
            user: ArcSwap::from_pointee(Vec::new()),
            user_any: AtomicBool::new(false),
            user_hits: AtomicU64::new(0),
            ctrl: Mutex::new(Ctrl {
                by_id: HashMap::with_hasher(ahash::RandomState::new()),
                parts,
                user: BTreeMap::new(),
                user_per_part,
            }),
            layout,
        }
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Index of the partition a flow's rule counts against.
    pub fn partition_of(&self, key: &FlowKey) -> usize {
        self.partition_of_type(key.version, key.proto)
    }

    fn partition_of_type(&self, version: IpVersion, proto: L4Proto) -> usize {
        match self.layout {
            Layout::Shared => 0,
            Layout::PerType => match (version, proto) {
                (IpVersion::V4, L4Proto::Tcp) => 0,
                (IpVersion::V4, L4Proto::Udp) => 1,
                (IpVersion::V6, L4Proto::Tcp) => 2,
                (IpVersion::V6, L4Proto::Udp) => 3,
            },
        }
    }

    fn ctrl(&self) -> MutexGuard<'_, Ctrl> {
        // A panic while holding the lock cannot leave the maps half-updated in a way
        // that matters more than stopping the device, so take the data either way.
        crate::sync::lock(&self.ctrl)
    }

    /// Install a rule. It is visible to `lookup` when this returns.
    pub fn insert(&self, id: u32, key: FlowKey, action: Action, now_ns: u64) -> Result<(), FilterError> {
        let mut c = self.ctrl();
        if c.by_id.contains_key(&id) {
            return Err(FilterError::DuplicateId(id));
        }
        // Writers hold `ctrl`: nothing can insert the key between this check and the insert.
        let map = self.map.pin();
        if let Some(o) = map.get(&key) {
            return Err(FilterError::DuplicateFlow { key, existing: o.id });
        }
        let p = self.partition_of(&key);
        let part = &mut c.parts[p];
        if part.rules_now >= part.capacity {
            return Err(FilterError::TableFull { partition: part.name.clone(), capacity: part.capacity });
        }
        part.rules_now += 1;
        part.rules_peak = part.rules_peak.max(part.rules_now);
        part.inserts += 1;
        c.by_id.insert(id, key);
        let rule = Rule {
            id,
            key,
            installed_ns: now_ns,
            action: AtomicU32::new(action.encode()),
            hits: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            last_hit_ns: AtomicU64::new(0),
        };
        map.insert(key, rule);
        Ok(())
    }

    /// Change a rule's action (the driver moving a flow to another queue).
    pub fn modify(&self, id: u32, action: Action) -> Result<(), FilterError> {
        let mut c = self.ctrl();
        let key = *c.by_id.get(&id).ok_or(FilterError::UnknownId(id))?;
        if let Some(r) = self.map.pin().get(&key) {
            r.action.store(action.encode(), Ordering::Relaxed);
        }
        let p = self.partition_of(&key);
        c.parts[p].modifies += 1;
        Ok(())
    }

    pub fn delete(&self, id: u32) -> Result<RuleSnapshot, FilterError> {
        let mut c = self.ctrl();
        let key = c.by_id.remove(&id).ok_or(FilterError::UnknownId(id))?;
        let p = self.partition_of(&key);
        c.parts[p].rules_now -= 1;
        c.parts[p].deletes += 1;
        let map = self.map.pin();
        let rule = map.remove(&key).ok_or(FilterError::UnknownId(id))?;
        Ok(rule.snapshot())
    }

    /// Remove every aRFS rule (the user rules stay); returns how many there were.
    pub fn flush(&self) -> usize {
        let mut c = self.ctrl();
        let n = c.by_id.len();
        c.by_id.clear();
        let Ctrl { parts, user_per_part, .. } = &mut *c;
        for (p, u) in parts.iter_mut().zip(user_per_part.iter()) {
            p.rules_now = *u;
        }
        self.map.pin().clear();
        n
    }

    /// Install or replace the user rule at `spec.location`. It shares its flow type's
    /// capacity with the aRFS rules: a new location on a full partition is refused.
    pub fn set_user_rule(&self, spec: RuleSpec) -> Result<(), FilterError> {
        let mut c = self.ctrl();
        let p = self.partition_of_type(spec.version, spec.proto);
        let old = c.user.get(&spec.location).map(|r| self.partition_of_type(r.spec.version, r.spec.proto));
        if old != Some(p) {
            let part = &c.parts[p];
            if part.rules_now >= part.capacity {
                return Err(FilterError::TableFull { partition: part.name.clone(), capacity: part.capacity });
            }
            if let Some(o) = old {
                c.parts[o].rules_now -= 1;
                c.user_per_part[o] -= 1;
            }
            let part = &mut c.parts[p];
            part.rules_now += 1;
            part.rules_peak = part.rules_peak.max(part.rules_now);
            c.user_per_part[p] += 1;
        }
        c.parts[p].inserts += 1;
        c.user.insert(spec.location, Arc::new(UserRule::new(spec)));
        self.publish_user(&c);
        Ok(())
    }

    /// Remove the user rule at `location`.
    pub fn delete_user_rule(&self, location: u32) -> Result<(), FilterError> {
        let mut c = self.ctrl();
        let r = c.user.remove(&location).ok_or(FilterError::UnknownId(location))?;
        let p = self.partition_of_type(r.spec.version, r.spec.proto);
        c.parts[p].rules_now -= 1;
        c.parts[p].deletes += 1;
        c.user_per_part[p] -= 1;
        self.publish_user(&c);
        Ok(())
    }

    /// Remove every user rule; returns how many there were.
    pub fn flush_user_rules(&self) -> usize {
        let mut c = self.ctrl();
        let n = c.user.len();
        c.user.clear();
        let Ctrl { parts, user_per_part, .. } = &mut *c;
        for (p, u) in parts.iter_mut().zip(user_per_part.iter_mut()) {
            p.rules_now -= *u;
            *u = 0;
        }
        self.publish_user(&c);
        n
    }

    fn publish_user(&self, c: &Ctrl) {
        self.user.store(Arc::new(c.user.values().cloned().collect()));
        self.user_any.store(!c.user.is_empty(), Ordering::Release);
    }

    /// Datapath: the first user rule (lowest location) matching `key`, counting the hit.
    #[inline]
    pub fn lookup_user(&self, key: &FlowKey) -> Option<(u32, Action)> {
        self.lookup_user_rule(key).map(|(loc, action, _)| (loc, action))
    }

    /// As [`FilterTable::lookup_user`], with the rule's RSS context: with `Some(c)`,
    /// a `Queue(q)` action is an offset to the queue context `c` picks.
    #[inline]
    pub fn lookup_user_rule(&self, key: &FlowKey) -> Option<(u32, Action, Option<u16>)> {
        let rules = self.user.load();
        let r = rules.iter().find(|r| r.matches(key))?;
        r.hit();
        self.user_hits.fetch_add(1, Ordering::Relaxed);
        Some((r.spec.location, ntuple::action(&r.spec), r.spec.context))
    }

    /// Whether a user rule steers through RSS context `context`.
    pub fn uses_context(&self, context: u16) -> bool {
        self.user.load().iter().any(|r| r.spec.context == Some(context))
    }

    /// Whether any user rule is installed (one plain atomic load: the datapath's fast path).
    #[inline]
    pub fn has_user_rules(&self) -> bool {
        self.user_any.load(Ordering::Acquire)
    }

    /// The user rules in location order, and the packets they took in all.
    pub fn user_rules(&self) -> (Vec<UserRuleSnapshot>, u64) {
        (self.user.load().iter().map(|r| r.snapshot()).collect(), self.user_hits.load(Ordering::Relaxed))
    }

    /// Datapath lookup: the matching rule's id and action, counting the hit.
    #[inline]
    pub fn lookup(&self, key: &FlowKey, bytes: u64, now_ns: u64) -> Option<(u32, Action)> {
        self.reader().lookup(key, bytes, now_ns)
    }

    /// The datapath's view for a burst of lookups: one epoch guard for all of them.
    /// Rules deleted meanwhile are freed after the reader is dropped; a rule inserted or
    /// deleted meanwhile is seen or not, as a lookup racing the command would.
    #[inline]
    pub fn reader(&self) -> Reader<'_> {
        Reader { map: &self.map, guard: self.map.guard() }
    }

    /// Look without counting.
    pub fn peek(&self, key: &FlowKey) -> Option<RuleSnapshot> {
        self.map.pin().get(key).map(|r| r.snapshot())
    }

    pub fn get(&self, id: u32) -> Option<RuleSnapshot> {
        let c = self.ctrl();
        let key = c.by_id.get(&id)?;
        self.map.pin().get(key).map(|r| r.snapshot())
    }

    pub fn contains_id(&self, id: u32) -> bool {
        self.ctrl().by_id.contains_key(&id)
    }

    /// Partition a known rule id counts against.
    pub fn partition_of_id(&self, id: u32) -> Option<usize> {
        let c = self.ctrl();
        c.by_id.get(&id).map(|k| self.partition_of(k))
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Ids of rules idle (no hit, counted from install) for at least `idle_ns` at `now_ns`.
    pub fn idle_rules(&self, now_ns: u64, idle_ns: u64) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .map
            .pin()
            .values()
            .filter(|r| {
                let last = r.last_hit_ns.load(Ordering::Relaxed).max(r.installed_ns);
                now_ns.saturating_sub(last) >= idle_ns
            })
            .map(|r| r.id)
            .collect();
        v.sort_unstable();
        v
    }

    pub fn rules(&self) -> Vec<RuleSnapshot> {
        let mut v: Vec<RuleSnapshot> = self.map.pin().values().map(|r| r.snapshot()).collect();
        v.sort_by_key(|r| r.id);
        v
    }

    /// Count a rejected command against a partition (by errno name).
    pub fn count_reject(&self, partition: usize, errno: i32) {
        let mut c = self.ctrl();
        if let Some(p) = c.parts.get_mut(partition) {
            *p.rejects.entry(crate::model::errno::name(errno).to_string()).or_default() += 1;
        }
    }

    pub fn stats(&self) -> Vec<PartitionStats> {
        self.ctrl().parts.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u16, proto: L4Proto) -> FlowKey {
        FlowKey::v4(proto, [10, 0, 0, 1], 1000 + i, [10, 0, 0, 2], 80)
    }

    #[test]
    fn insert_lookup_modify_delete() {
        let t = FilterTable::new(Layout::PerType, 4);
        t.insert(7, key(1, L4Proto::Tcp), Action::Queue(3), 100).unwrap();
        assert_eq!(t.lookup(&key(1, L4Proto::Tcp), 60, 200), Some((7, Action::Queue(3))));
        assert_eq!(t.lookup(&key(2, L4Proto::Tcp), 60, 200), None);
        t.modify(7, Action::Drop).unwrap();
        assert_eq!(t.lookup(&key(1, L4Proto::Tcp), 40, 300), Some((7, Action::Drop)));
        let snap = t.delete(7).unwrap();
        assert_eq!((snap.hits, snap.bytes, snap.last_active_ns), (2, 100, 300));
        assert_eq!(t.lookup(&key(1, L4Proto::Tcp), 1, 400), None);
        let s = &t.stats()[0];
        assert_eq!((s.inserts, s.modifies, s.deletes, s.rules_now, s.rules_peak), (1, 1, 1, 0, 1));
    }

    #[test]
    fn errors_map_to_errno() {
        let t = FilterTable::new(Layout::Shared, 2);
        t.insert(1, key(1, L4Proto::Tcp), Action::Queue(0), 0).unwrap();
        assert_eq!(t.insert(1, key(2, L4Proto::Tcp), Action::Queue(0), 0), Err(FilterError::DuplicateId(1)));
        assert_eq!(
            t.insert(2, key(1, L4Proto::Tcp), Action::Queue(0), 0),
            Err(FilterError::DuplicateFlow { key: key(1, L4Proto::Tcp), existing: 1 })
        );
        t.insert(2, key(2, L4Proto::Udp), Action::Queue(0), 0).unwrap();
        let full = t.insert(3, key(3, L4Proto::Tcp), Action::Queue(0), 0).unwrap_err();
        assert_eq!(full.errno(), libc::ENOSPC);
        assert_eq!(t.modify(9, Action::Drop).unwrap_err().errno(), libc::ENOENT);
        assert_eq!(t.delete(9).unwrap_err(), FilterError::UnknownId(9));
    }

    #[test]
    fn per_type_capacity_is_per_partition() {
        let t = FilterTable::new(Layout::PerType, 2);
        for i in 0..2 {
            t.insert(u32::from(i), key(i, L4Proto::Tcp), Action::Queue(0), 0).unwrap();
        }
        assert!(matches!(
            t.insert(10, key(5, L4Proto::Tcp), Action::Queue(0), 0),
            Err(FilterError::TableFull { ref partition, capacity: 2 }) if partition == "ipv4-tcp"
        ));
        // The UDP table still has room.
        t.insert(11, key(5, L4Proto::Udp), Action::Queue(0), 0).unwrap();
        let v6 = FlowKey::v6(L4Proto::Tcp, [1; 16], 1, [2; 16], 2);
        t.insert(12, v6, Action::Queue(1), 0).unwrap();
        assert_eq!(t.partition_of(&v6), 2);
        assert_eq!(t.len(), 4);
        assert_eq!(t.flush(), 4);
        assert!(t.is_empty());
        assert!(t.stats().iter().all(|p| p.rules_now == 0));
    }

    #[test]
    fn idle_rules_use_install_time_until_first_hit() {
        let t = FilterTable::new(Layout::Shared, 8);
        t.insert(1, key(1, L4Proto::Udp), Action::Queue(0), 1_000).unwrap();
        t.insert(2, key(2, L4Proto::Udp), Action::Queue(0), 1_000).unwrap();
        t.lookup(&key(2, L4Proto::Udp), 1, 5_000);
        assert_eq!(t.idle_rules(6_000, 4_000), vec![1]);
        assert_eq!(t.idle_rules(9_000, 4_000), vec![1, 2]);
    }

    #[test]
    fn user_rules_share_capacity_and_survive_an_arfs_flush() {
        use crate::wire::rule::RuleSpec;
        let t = FilterTable::new(Layout::PerType, 2);
        let rule = |loc| RuleSpec::any(loc, IpVersion::V4, L4Proto::Tcp, 1);
        t.set_user_rule(rule(5)).unwrap();
        t.insert(1, key(1, L4Proto::Tcp), Action::Queue(0), 0).unwrap();
        // The partition holds one user rule and one filter: full for both kinds.
        assert_eq!(t.insert(2, key(2, L4Proto::Tcp), Action::Queue(0), 0).unwrap_err().errno(), libc::ENOSPC);
        assert_eq!(t.set_user_rule(rule(6)).unwrap_err().errno(), libc::ENOSPC);
        // Replacing a location takes no new room; other flow types have their own.
        t.set_user_rule(RuleSpec { action: crate::wire::rule::RuleAction::Drop, ..rule(5) }).unwrap();
        t.set_user_rule(RuleSpec::any(6, IpVersion::V4, L4Proto::Udp, 1)).unwrap();
        // The lowest location wins, before any aRFS filter of the same flow.
        assert_eq!(t.lookup_user(&key(1, L4Proto::Tcp)), Some((5, Action::Drop)));
        assert_eq!(t.flush(), 1);
        assert_eq!(t.stats()[0].rules_now, 1, "the user rule still counts");
        t.insert(3, key(3, L4Proto::Tcp), Action::Queue(0), 0).unwrap();
        t.delete_user_rule(5).unwrap();
        assert_eq!(t.delete_user_rule(5).unwrap_err().errno(), libc::ENOENT);
        assert_eq!(t.flush_user_rules(), 1);
        assert_eq!(t.stats().iter().map(|p| p.rules_now).collect::<Vec<_>>(), [1, 0, 0, 0]);
        let (rules, hits) = t.user_rules();
        assert!(rules.is_empty());
        assert_eq!(hits, 1);
    }
}
