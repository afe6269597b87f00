//! The NIC as the datapath sees it: classification (filter match → its queue or drop;
//! otherwise RSS) and per-queue counters. Lookups are lock-free on the RSS side (the
//! configuration is swapped atomically) and shard-locked on the filter side.

use super::filter::{Action, FilterTable, Reader};
use super::profile::{DisabledQueue, Profile};
use super::rss::{Rss, RssDecision, RssError};
use crate::wire::parse::flow_key_fast;
use crate::wire::{parse_frame, FlowKey, PacketInfo, ParseError};
use arc_swap::ArcSwap;
use crossbeam_utils::CachePadded;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Per-RX-queue counters; relaxed atomics, one cache line per queue.
#[derive(Default, Debug)]
pub struct QueueCounters {
    pub rx_packets: AtomicU64,
    pub rx_bytes: AtomicU64,
    pub rss_delivered: AtomicU64,
    /// Packets steered by an aRFS filter or a user ntuple rule.
    pub filter_delivered: AtomicU64,
    /// Frames of the control protocol (completions, events) delivered.
    pub control_delivered: AtomicU64,
    /// The queue had no free buffers.
    pub dropped_no_buffer: AtomicU64,
    /// A filter with a drop action matched (counted on the queue RSS would have used).
    pub dropped_by_filter: AtomicU64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct QueueSnapshot {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub rss_delivered: u64,
    pub filter_delivered: u64,
    pub control_delivered: u64,
    pub dropped_no_buffer: u64,
    pub dropped_by_filter: u64,
}

impl QueueCounters {
    pub fn snapshot(&self) -> QueueSnapshot {
        QueueSnapshot {
            rx_packets: self.rx_packets.load(Relaxed),
            rx_bytes: self.rx_bytes.load(Relaxed),
            rss_delivered: self.rss_delivered.load(Relaxed),
            filter_delivered: self.filter_delivered.load(Relaxed),
            control_delivered: self.control_delivered.load(Relaxed),
            dropped_no_buffer: self.dropped_no_buffer.load(Relaxed),
            dropped_by_filter: self.dropped_by_filter.load(Relaxed),
        }
    }
}

/// Where one packet goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Destination RX queue; `None` when a drop filter matched.
    pub queue: Option<u16>,
    pub rss: RssDecision,
    /// Id of the matching aRFS filter.
    pub filter: Option<u32>,
    /// Location of the matching ethtool ntuple rule (checked before the filters).
    pub rule: Option<u32>,
}

/// Device-wide classification counters.
#[derive(Default, Debug)]
struct NicCounters {
    malformed: AtomicU64,
    unhashed: AtomicU64,
    filter_bad_queue: AtomicU64,
    filter_queue_disabled: AtomicU64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NicSnapshot {
    pub queues: Vec<QueueSnapshot>,
    pub malformed: u64,
    pub unhashed: u64,
    /// Filters whose queue does not exist: such packets fall back to RSS.
    pub filter_bad_queue: u64,
    /// Packets of filters whose queue the guest disabled (`ethtool -L` to fewer
    /// channels): lost there, or steered by RSS, as the profile's
    /// `filter.disabled_queue` says.
    pub filter_queue_disabled: u64,
}

pub struct Nic {
    rss: ArcSwap<Rss>,
    /// The RSS configuration the NIC was built with (what a reset returns to).
    rss_default: Arc<Rss>,
    /// The guest set an indirection table other than the default spread (`ethtool -X
    /// weight|equal`): queue count changes keep it, as the kernel keeps a driver from
    /// re-spreading a table the user configured (IFF_RXFH_CONFIGURED).
    rss_user: std::sync::atomic::AtomicBool,
    table: Arc<FilterTable>,
    queues: Box<[CachePadded<QueueCounters>]>,
    /// Per queue: enabled by the guest (all until it says otherwise).
    enabled: Box<[std::sync::atomic::AtomicBool]>,
    disabled_queue: DisabledQueue,
    counters: NicCounters,
    /// Additional RSS contexts by ID (1 ≤ ID < `max_contexts`): key and table of their
    /// own (`ethtool -X … context N`), hash fields of the default context.
    /// Read by the data path (rules with `context N`); changed under `contexts_write`.
    contexts: ArcSwap<std::collections::BTreeMap<u32, Arc<Rss>>>,
    contexts_write: std::sync::Mutex<()>,
    max_contexts: u32,
}

/// Why an RSS context request is refused: the errno a driver returns, and the report's
/// `bad_by_kind` name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextError {
    pub errno: i32,
    pub kind: &'static str,
}

const fn ctx_err(errno: i32, kind: &'static str) -> ContextError {
    ContextError { errno, kind }
}

impl Nic {
    pub fn new(profile: &Profile, queues: u16) -> Result<Nic, RssError> {
        let rss = profile.build_rss(queues)?;
        let table = Arc::new(FilterTable::new(profile.filter.layout, profile.filter.capacity));
        Ok(Nic {
            disabled_queue: profile.filter.disabled_queue,
            max_contexts: profile.rss.max_contexts,
            ..Self::with_parts(rss, table)
        })
    }

    pub fn with_parts(rss: Rss, table: Arc<FilterTable>) -> Nic {
        let queues: Box<[CachePadded<QueueCounters>]> =
            (0..rss.queues()).map(|_| CachePadded::new(QueueCounters::default())).collect();
        let rss = Arc::new(rss);
        let enabled = (0..queues.len()).map(|_| std::sync::atomic::AtomicBool::new(true)).collect();
        Nic {
            rss: ArcSwap::new(rss.clone()),
            rss_default: rss,
            rss_user: std::sync::atomic::AtomicBool::new(false),
            table,
            queues,
            enabled,
            disabled_queue: DisabledQueue::default(),
            counters: NicCounters::default(),
            contexts: Default::default(),
            contexts_write: Default::default(),
            max_contexts: 0,
        }
    }

    pub fn table(&self) -> &Arc<FilterTable> {
        &self.table
    }

    pub fn rss(&self) -> Arc<Rss> {
        self.rss.load_full()
    }

    pub fn num_queues(&self) -> u16 {
        self.queues.len() as u16
    }

    /// Replace the RSS configuration (e.g. after the guest enabled fewer queues).
    pub fn set_rss(&self, rss: Rss) {
        self.rss.store(Arc::new(rss));
    }

    /// Back to the RSS configuration the NIC was built with (key, hash fields, table),
    /// spread over the `enabled` queues: a device reset.
    pub fn reset_rss(&self, enabled: &[bool]) {
        let mut rss = (*self.rss_default).clone();
        rss.spread_over(enabled);
        self.rss_user.store(false, Relaxed);
        self.set_rss(rss);
        let _w = self.contexts_write();
        self.contexts.store(Default::default());
    }

    fn contexts_write(&self) -> std::sync::MutexGuard<'_, ()> {
        // Nothing to repair after a panic elsewhere: every change is one store.
        self.contexts_write.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The exclusive upper bound of RSS context IDs (0: no additional contexts).
    pub fn max_contexts(&self) -> u32 {
        self.max_contexts
    }

    /// Create RSS context `id` or change it (CTX_SET, `ethtool -X … context new|N`). A
    /// new context starts from the profile's key and the table spread over the enabled
    /// queues; `key` and `indir` (`None` keeps) replace them under the rules of
    /// [`Rss::reconfigured`]. All or nothing.
    pub fn set_context(&self, id: u32, key: Option<&[u8]>, indir: Option<&[u16]>) -> Result<(), ContextError> {
        if self.max_contexts == 0 {
            return Err(ctx_err(libc::EOPNOTSUPP, "ctx_unsupported"));
        }
        if id == 0 {
            return Err(ctx_err(libc::EINVAL, "ctx_bad_id"));
        }
        if id >= self.max_contexts {
            // As a NIC whose firmware has no table left.
            return Err(ctx_err(libc::ENOSPC, "ctx_no_space"));
        }
        let _w = self.contexts_write();
        let mut ctxs = (**self.contexts.load()).clone();
        let base = match ctxs.get(&id) {
            Some(c) => (**c).clone(),
            None => {
                let enabled: Vec<bool> = self.enabled.iter().map(|e| e.load(Relaxed)).collect();
                let mut c = self.rss_default.with_fields_of(&self.rss.load());
                c.spread_over(&enabled);
                c
            }
        };
        let next = base.reconfigured(key, indir).map_err(|e| match e {
            RssError::KeyLength(_) | RssError::KeyLengthMismatch { .. } => ctx_err(libc::EINVAL, "rss_bad_key_len"),
            RssError::IndirSize(_) | RssError::IndirSizeMismatch { .. } => ctx_err(libc::EINVAL, "rss_bad_indir_size"),
            RssError::IndirQueue { .. } | RssError::NoQueues => ctx_err(libc::EINVAL, "rss_bad_queue"),
            RssError::HashFields(_) => ctx_err(libc::EINVAL, "hash_bad_fields"),
        })?;
        ctxs.insert(id, Arc::new(next));
        self.contexts.store(Arc::new(ctxs));
        Ok(())
    }

    /// Remove RSS context `id` (CTX_DEL).
    pub fn delete_context(&self, id: u32) -> Result<(), ContextError> {
        if self.max_contexts == 0 {
            return Err(ctx_err(libc::EOPNOTSUPP, "ctx_unsupported"));
        }
        let _w = self.contexts_write();
        let mut ctxs = (**self.contexts.load()).clone();
        if !ctxs.contains_key(&id) {
            return Err(ctx_err(libc::ENOENT, "ctx_unknown"));
        }
        // As the ethtool core refuses to delete a context a rule uses.
        if u16::try_from(id).is_ok_and(|c| self.table.uses_context(c)) {
            return Err(ctx_err(libc::EBUSY, "ctx_busy"));
        }
        ctxs.remove(&id);
        self.contexts.store(Arc::new(ctxs));
        Ok(())
    }

    /// Whether RSS context `id` exists (0, the default context, always does).
    pub fn has_context(&self, id: u32) -> bool {
        id == 0 || self.contexts.load().contains_key(&id)
    }

    /// The additional RSS contexts, by ID.
    pub fn contexts(&self) -> Vec<(u32, Rss)> {
        self.contexts.load().iter().map(|(id, c)| (*id, (**c).clone())).collect()
    }

    /// Install the RSS configuration the guest asked for (RSS_SET: `ethtool -X`). A table
    /// other than the default spread over the enabled queues is the user's and survives
    /// queue count changes; `ethtool -X default` (the spread) makes it the NIC's again.
    pub fn configure_rss(&self, rss: Rss) {
        let enabled: Vec<bool> = self.enabled.iter().map(|e| e.load(Relaxed)).collect();
        let mut spread = rss.clone();
        spread.spread_over(&enabled);
        self.rss_user.store(spread.indirection() != rss.indirection(), Relaxed);
        // The contexts hash on the default context's fields (HASH_SET changes them all).
        if rss.hash_fields() != self.rss.load().hash_fields() {
            let _w = self.contexts_write();
            let ctxs = self.contexts.load().iter().map(|(id, c)| (*id, Arc::new(c.with_fields_of(&rss)))).collect();
            self.contexts.store(Arc::new(ctxs));
        }
        self.set_rss(rss);
    }

    /// Whether RSS is the configuration the NIC was built with, up to the queues the
    /// guest enabled.
    pub fn rss_is_default(&self, enabled: &[bool]) -> bool {
        let mut rss = (*self.rss_default).clone();
        rss.spread_over(enabled);
        *self.rss.load_full() == rss
    }

    /// Spread RSS over the enabled queues only (unless the guest configured its own table)
    /// and note which queues filters may still
    /// use (`filter.disabled_queue`). With no queue enabled (the link is down) both stay
    /// as they were.
    pub fn set_enabled_queues(&self, enabled: &[bool]) {
        if enabled.iter().any(|&e| e) {
            for (q, flag) in self.enabled.iter().enumerate() {
                flag.store(enabled.get(q).copied().unwrap_or(false), Relaxed);
            }
        }
        if self.rss_user.load(Relaxed) {
            return;
        }
        let mut rss = (*self.rss.load_full()).clone();
        rss.spread_over(enabled);
        self.set_rss(rss);
    }

    /// Classify a parsed packet (see [`Classifier::classify`]).
    #[inline]
    pub fn classify(&self, info: &PacketInfo, len: usize, now_ns: u64) -> Decision {
        self.classifier().classify(info, len, now_ns)
    }

    /// Parse and classify a frame.
    pub fn classify_frame(&self, frame: &[u8], now_ns: u64) -> Result<(PacketInfo, Decision), ParseError> {
        self.classifier().classify_frame(frame, now_ns)
    }

    /// The NIC's classification with the RSS configuration of now, for a burst of frames:
    /// one load of the configuration and one filter-table guard ([`FilterTable::reader`])
    /// instead of one per frame. An RSS change made meanwhile applies from the next burst
    /// on, as a NIC applies a new table between packets; filter changes apply at once.
    #[inline]
    pub fn classifier(&self) -> Classifier<'_> {
        Classifier { nic: self, rss: self.rss.load(), table: self.table.reader() }
    }

    /// Count the outcome of a decision: `delivered` false means the queue had no
    /// buffer.
    #[inline]
    pub fn record(&self, d: &Decision, bytes: usize, delivered: bool) {
        let Some(q) = d.queue else {
            if let Some(c) = self.queues.get(usize::from(d.rss.queue)) {
                c.dropped_by_filter.fetch_add(1, Relaxed);
            }
            return;
        };
        let Some(c) = self.queues.get(usize::from(q)) else { return };
        if !delivered {
            c.dropped_no_buffer.fetch_add(1, Relaxed);
            return;
        }
        c.rx_packets.fetch_add(1, Relaxed);
        c.rx_bytes.fetch_add(bytes as u64, Relaxed);
        if d.filter.is_some() || d.rule.is_some() {
            c.filter_delivered.fetch_add(1, Relaxed);
        } else {
            c.rss_delivered.fetch_add(1, Relaxed);
        }
    }

    /// [`Nic::record`] for `frames` frames of `bytes` bytes in all delivered to queue `q`, of
    /// which `via_filter` were steered by a filter or rule: one update per counter.
    #[inline]
    pub fn record_delivered(&self, q: u16, frames: u64, bytes: u64, via_filter: u64) {
        let Some(c) = self.queues.get(usize::from(q)) else { return };
        if frames == 0 {
            return;
        }
        c.rx_packets.fetch_add(frames, Relaxed);
        c.rx_bytes.fetch_add(bytes, Relaxed);
        if via_filter > 0 {
            c.filter_delivered.fetch_add(via_filter, Relaxed);
        }
        if frames > via_filter {
            c.rss_delivered.fetch_add(frames - via_filter, Relaxed);
        }
    }

    /// Count a control frame put on (or dropped from) queue `q`.
    pub fn record_control(&self, q: u16, bytes: usize, delivered: bool) {
        let Some(c) = self.queues.get(usize::from(q)) else { return };
        if delivered {
            c.rx_packets.fetch_add(1, Relaxed);
            c.rx_bytes.fetch_add(bytes as u64, Relaxed);
            c.control_delivered.fetch_add(1, Relaxed);
        } else {
            c.dropped_no_buffer.fetch_add(1, Relaxed);
        }
    }

    pub fn snapshot(&self) -> NicSnapshot {
        NicSnapshot {
            queues: self.queues.iter().map(|q| q.snapshot()).collect(),
            malformed: self.counters.malformed.load(Relaxed),
            unhashed: self.counters.unhashed.load(Relaxed),
            filter_bad_queue: self.counters.filter_bad_queue.load(Relaxed),
            filter_queue_disabled: self.counters.filter_queue_disabled.load(Relaxed),
        }
    }
}

/// [`Nic::classifier`]: classifies frames against one RSS configuration.
pub struct Classifier<'a> {
    nic: &'a Nic,
    rss: arc_swap::Guard<Arc<Rss>>,
    table: Reader<'a>,
}

impl Classifier<'_> {
    /// Classify a parsed packet of `len` bytes at `now_ns`: the user's ntuple rules
    /// first, then the aRFS filters, RSS otherwise. Counts the rule or filter hit;
    /// delivery is counted by [`Nic::record`].
    #[inline]
    pub fn classify(&self, info: &PacketInfo, len: usize, now_ns: u64) -> Decision {
        let nic = self.nic;
        let rss = self.rss.decide(info);
        if info.malformed {
            nic.counters.malformed.fetch_add(1, Relaxed);
        }
        if rss.hash.is_none() {
            nic.counters.unhashed.fetch_add(1, Relaxed);
        }
        let plain = Decision { queue: Some(rss.queue), rss, filter: None, rule: None };
        let Some(key) = info.flow_key() else { return plain };
        let Some((loc, action, ctx)) = nic.table.has_user_rules().then(|| nic.table.lookup_user_rule(&key)).flatten()
        else {
            return self.filter(&key, plain, len, now_ns);
        };
        let action = match (ctx, action) {
            // The context's table picks the queue; the rule's queue is an offset.
            (Some(c), Action::Queue(off)) => {
                let base = match c {
                    0 => Some(rss.queue),
                    c => nic.contexts.load().get(&u32::from(c)).map(|t| t.decide(info).queue),
                };
                match base.and_then(|q| q.checked_add(off)) {
                    Some(q) => Action::Queue(q),
                    // The context went away under the rule: RSS decides.
                    None => return plain,
                }
            }
            _ => action,
        };
        self.apply(Decision { rule: Some(loc), ..plain }, action, plain)
    }

    /// The aRFS filter for `key`, if any, over RSS's `plain` decision.
    #[inline]
    fn filter(&self, key: &FlowKey, plain: Decision, len: usize, now_ns: u64) -> Decision {
        match self.table.lookup(key, len as u64, now_ns) {
            Some((id, action)) => self.apply(Decision { filter: Some(id), ..plain }, action, plain),
            None => plain,
        }
    }

    /// Where a rule's or filter's `action` sends the packet (`hit` records which one
    /// matched): its queue when enabled, RSS's `plain` decision or a drop otherwise.
    #[inline]
    fn apply(&self, hit: Decision, action: Action, plain: Decision) -> Decision {
        let nic = self.nic;
        match action {
            Action::Queue(q) if nic.enabled.get(usize::from(q)).is_some_and(|e| e.load(Relaxed)) => {
                Decision { queue: Some(q), ..hit }
            }
            Action::Queue(q) if usize::from(q) < nic.queues.len() => {
                nic.counters.filter_queue_disabled.fetch_add(1, Relaxed);
                match nic.disabled_queue {
                    DisabledQueue::Drop => Decision { queue: Some(q), ..hit },
                    DisabledQueue::Rss => plain,
                }
            }
            Action::Queue(_) => {
                nic.counters.filter_bad_queue.fetch_add(1, Relaxed);
                plain
            }
            Action::Drop => Decision { queue: None, ..hit },
        }
    }

    /// Parse and classify a frame.
    pub fn classify_frame(&self, frame: &[u8], now_ns: u64) -> Result<(PacketInfo, Decision), ParseError> {
        let info = parse_frame(frame)?;
        Ok((info, self.classify(&info, frame.len(), now_ns)))
    }

    /// The decision for a TCP/UDP packet of `len` bytes with flow `key`, as
    /// [`Classifier::decide_frame`] takes it for such a frame: the aRFS filters over RSS
    /// on the key's hash. `None` when ethtool rules are installed or RSS cannot hash the
    /// key; the caller then needs a frame. The model-mode twin drives the device with keys.
    #[inline]
    pub fn decide_key(&self, key: &FlowKey, len: usize, now_ns: u64) -> Option<Decision> {
        if self.nic.table.has_user_rules() {
            return None;
        }
        let rss = self.rss.decide_key(key)?;
        let plain = Decision { queue: Some(rss.queue), rss, filter: None, rule: None };
        Some(self.filter(key, plain, len, now_ns))
    }

    /// [`Classifier::classify_frame`]'s decision alone, the datapath's call. The common
    /// frame — TCP/UDP on the parser's fast path, no ethtool rule installed, hashed on
    /// the 4-tuple — goes from its flow key straight to the RSS hash and the filter
    /// table, without a [`PacketInfo`]; every other frame takes `classify_frame`.
    /// Same decision and same counters either way (`tests/classify_props.rs`).
    #[inline]
    pub fn decide_frame(&self, frame: &[u8], now_ns: u64) -> Result<Decision, ParseError> {
        if !self.nic.table.has_user_rules() {
            if let Some(key) = flow_key_fast(frame) {
                if let Some(rss) = self.rss.decide_key(&key) {
                    let plain = Decision { queue: Some(rss.queue), rss, filter: None, rule: None };
                    return Ok(self.filter(&key, plain, frame.len(), now_ns));
                }
            }
        }
        self.classify_frame(frame, now_ns).map(|(_, d)| d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::L4Proto;
    use etherparse::PacketBuilder;

    fn frame(sport: u16) -> Vec<u8> {
        let mut v = Vec::new();
        PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4([66, 9, 149, 187], [161, 142, 100, 80], 64)
            .tcp(sport, 1766, 1, 100)
            .write(&mut v, b"payload")
            .unwrap();
        v
    }

    fn nic() -> Nic {
        let p = Profile::parse("name = \"t\"\n[filter]\nlayout = \"per-type\"\ncapacity = 16\n").unwrap();
        Nic::new(&p, 4).unwrap()
    }

    #[test]
    fn rss_when_no_filter_then_filter_wins() {
        let n = nic();
        let f = frame(2794);
        let (info, d) = n.classify_frame(&f, 0).unwrap();
        assert_eq!(d.rss.hash.map(|h| h.0), Some(0x51ccc178));
        assert_eq!(d.queue, Some((0x78 % 4) as u16));
        assert_eq!(d.filter, None);
        n.record(&d, f.len(), true);

        n.table().insert(42, info.flow_key().unwrap(), Action::Queue(3), 0).unwrap();
        let (_, d2) = n.classify_frame(&f, 1).unwrap();
        assert_eq!((d2.queue, d2.filter), (Some(3), Some(42)));
        n.record(&d2, f.len(), true);
        n.record(&d2, f.len(), false);
        let s = n.snapshot();
        assert_eq!(s.queues[0].rss_delivered, 1);
        assert_eq!(s.queues[3].filter_delivered, 1);
        assert_eq!(s.queues[3].dropped_no_buffer, 1);
        assert_eq!(s.queues.iter().map(|q| q.rx_packets).sum::<u64>(), 2);
        assert_eq!(n.table().get(42).unwrap().hits, 1);
    }

    #[test]
    fn a_classifier_keeps_its_rss_configuration_for_its_burst() {
        let n = nic();
        let f = frame(2794);
        let before = n.classifier();
        let q0 = before.classify_frame(&f, 0).unwrap().1.queue.unwrap();
        // Every indirection entry to another queue: the next classifier sees it.
        let other = (q0 + 1) % n.num_queues();
        let len = n.rss().indirection().len();
        n.set_rss(n.rss().reconfigured(None, Some(&vec![other; len])).unwrap());
        assert_eq!(before.classify_frame(&f, 0).unwrap().1.queue, Some(q0), "the burst's configuration");
        assert_eq!(n.classifier().classify_frame(&f, 0).unwrap().1.queue, Some(other));
        assert_eq!(n.classify_frame(&f, 0).unwrap().1.queue, Some(other));
    }

    #[test]
    fn drop_filter_and_bad_queue() {
        let n = nic();
        let k = crate::wire::FlowKey::v4(L4Proto::Tcp, [66, 9, 149, 187], 1, [161, 142, 100, 80], 1766);
        n.table().insert(1, k, Action::Drop, 0).unwrap();
        let (_, d) = n.classify_frame(&frame(1), 0).unwrap();
        assert_eq!((d.queue, d.filter), (None, Some(1)));
        n.record(&d, 60, true);
        assert_eq!(n.snapshot().queues[usize::from(d.rss.queue)].dropped_by_filter, 1);

        let k2 = crate::wire::FlowKey::v4(L4Proto::Tcp, [66, 9, 149, 187], 2, [161, 142, 100, 80], 1766);
        n.table().insert(2, k2, Action::Queue(9), 0).unwrap();
        let (_, d) = n.classify_frame(&frame(2), 0).unwrap();
        assert_eq!((d.queue, d.filter), (Some(d.rss.queue), None));
        assert_eq!(n.snapshot().filter_bad_queue, 1);
    }

    #[test]
    fn a_filter_to_a_disabled_queue_is_lost_or_falls_back_to_rss() {
        let mut p = Profile::parse("name = \"t\"\n[filter]\nlayout = \"shared\"\ncapacity = 64\n").unwrap();
        let n = Nic::new(&p, 4).unwrap();
        let k = crate::wire::FlowKey::v4(L4Proto::Tcp, [66, 9, 149, 187], 3, [161, 142, 100, 80], 1766);
        n.table().insert(7, k, Action::Queue(3), 0).unwrap();
        n.set_enabled_queues(&[true, true, false, false]);
        let (_, d) = n.classify_frame(&frame(3), 0).unwrap();
        assert_eq!((d.queue, d.filter), (Some(3), Some(7)), "default: like mlx5's drop RQ, delivery fails");
        assert_eq!(n.snapshot().filter_queue_disabled, 1);
        p.filter.disabled_queue = DisabledQueue::Rss;
        let n = Nic::new(&p, 4).unwrap();
        let k = crate::wire::FlowKey::v4(L4Proto::Tcp, [66, 9, 149, 187], 3, [161, 142, 100, 80], 1766);
        n.table().insert(7, k, Action::Queue(3), 0).unwrap();
        n.set_enabled_queues(&[true, true, false, false]);
        let (_, d) = n.classify_frame(&frame(3), 0).unwrap();
        assert_eq!((d.queue, d.filter), (Some(d.rss.queue), None));
        assert!(d.rss.queue < 2, "RSS over the enabled queues");
        assert_eq!(n.snapshot().filter_queue_disabled, 1);
        n.set_enabled_queues(&[false; 4]); // link down: nothing changes
        assert_eq!(n.classify_frame(&frame(3), 0).unwrap().1.filter, None);
        n.set_enabled_queues(&[true; 4]);
        let (_, d) = n.classify_frame(&frame(3), 0).unwrap();
        assert_eq!((d.queue, d.filter), (Some(3), Some(7)));
    }

    #[test]
    fn enabled_queues_restrict_rss() {
        let n = nic();
        n.set_enabled_queues(&[true, true, false, false]);
        for sport in 0..200 {
            let (_, d) = n.classify_frame(&frame(sport), 0).unwrap();
            assert!(d.queue.unwrap() < 2);
        }
    }

    #[test]
    fn a_user_table_survives_queue_count_changes_and_default_gives_it_back() {
        // rss_ctx.py test_rss_resize: -L combined 2, -X weight 1 7, -L combined 4.
        let n = nic();
        n.set_enabled_queues(&[true, true, false, false]);
        let size = n.rss().indirection().len();
        let weighted: Vec<u16> = (0..size).map(|i| u16::from(i % 8 != 0)).collect();
        n.configure_rss(n.rss().reconfigured(None, Some(&weighted)).unwrap());
        n.set_enabled_queues(&[true; 4]);
        assert_eq!(n.rss().indirection(), &weighted[..], "the user's table was re-spread");
        // `-X default`: the spread over the enabled queues; from then on it follows them.
        let mut spread = (*n.rss()).clone();
        spread.spread_over(&[true; 4]);
        n.configure_rss(spread);
        n.set_enabled_queues(&[true, true, false, false]);
        assert!(n.rss().indirection().iter().all(|&q| q < 2));
        // A device reset forgets the user's table.
        n.configure_rss(n.rss().reconfigured(None, Some(&weighted)).unwrap());
        n.reset_rss(&[true; 4]);
        n.set_enabled_queues(&[true, false, false, false]);
        assert!(n.rss().indirection().iter().all(|&q| q == 0));
    }

    #[test]
    fn a_user_rule_wins_over_the_arfs_filter_and_rss() {
        use crate::wire::rule::{RuleAction, RuleSpec};
        use crate::wire::IpVersion;
        let n = nic();
        let f = frame(2794);
        let (info, _) = n.classify_frame(&f, 0).unwrap();
        n.table().insert(7, info.flow_key().unwrap(), Action::Queue(1), 0).unwrap();
        let mut r = RuleSpec::any(0, IpVersion::V4, L4Proto::Tcp, 2);
        r.sport = 2794;
        r.sport_mask = 0xffff;
        n.table().set_user_rule(r).unwrap();
        let d = n.classify(&info, f.len(), 0);
        assert_eq!((d.queue, d.filter, d.rule), (Some(2), None, Some(0)));
        n.record(&d, f.len(), true);
        assert_eq!(n.snapshot().queues[2].filter_delivered, 1);
        // Another source port: the filter's flow is not this one, RSS decides.
        let (info2, d2) = n.classify_frame(&frame(2795), 0).unwrap();
        assert_eq!((d2.queue, d2.filter, d2.rule), (Some(d2.rss.queue), None, None), "{info2:?}");
        n.table().set_user_rule(RuleSpec { action: RuleAction::Drop, ..r }).unwrap();
        assert_eq!(n.classify(&info, f.len(), 0).queue, None);
        n.table().delete_user_rule(0).unwrap();
        let d = n.classify(&info, f.len(), 0);
        assert_eq!((d.queue, d.filter, d.rule), (Some(1), Some(7), None));
    }

    #[test]
    fn a_rule_with_a_context_takes_the_contexts_queue_plus_its_offset() {
        use crate::wire::rule::RuleSpec;
        use crate::wire::IpVersion;
        let p =
            Profile::parse("name = \"ctx\"\n[rss]\nmax_contexts = 4\n[filter]\nlayout = \"shared\"\ncapacity = 64\n")
                .unwrap();
        let n = Nic::new(&p, 4).unwrap();
        let f = frame(2794);
        let (info, plain) = n.classify_frame(&f, 0).unwrap();
        // Context 1 sends everything to queue 2; a rule for the flow uses it with offset 1.
        n.set_context(1, None, Some(&[2; 128])).unwrap();
        let mut r = RuleSpec::any(0, IpVersion::V4, L4Proto::Tcp, 1);
        r.context = Some(1);
        r.sport = 2794;
        r.sport_mask = 0xffff;
        n.table().set_user_rule(r).unwrap();
        let d = n.classify(&info, f.len(), 0);
        assert_eq!((d.queue, d.rule), (Some(3), Some(0)));
        // Context 0 is the default RSS: its queue plus the offset.
        n.table()
            .set_user_rule(RuleSpec { context: Some(0), action: crate::wire::rule::RuleAction::Queue(0), ..r })
            .unwrap();
        assert_eq!(n.classify(&info, f.len(), 0).queue, Some(plain.rss.queue));
        n.table().set_user_rule(r).unwrap();
        // A context a rule uses cannot go (EBUSY), another can.
        assert_eq!(n.delete_context(1).unwrap_err().errno, libc::EBUSY);
        n.table().delete_user_rule(0).unwrap();
        n.delete_context(1).unwrap();
        assert!(!n.has_context(1) && n.has_context(0));
        assert_eq!(n.classify(&info, f.len(), 0).queue, Some(plain.rss.queue));
        // An offset past the last queue: counted, RSS decides.
        n.set_context(1, None, Some(&[3; 128])).unwrap();
        n.table().set_user_rule(RuleSpec { action: crate::wire::rule::RuleAction::Queue(2), ..r }).unwrap();
        assert_eq!(n.classify(&info, f.len(), 0).queue, Some(plain.rss.queue));
        // New hash fields on the default context apply to the contexts as well.
        let fields = n.rss().hash_fields();
        let ip_only = fields.with_sets([0x30; 6]);
        n.configure_rss(n.rss().with_hash_fields(ip_only).unwrap());
        assert_eq!(n.contexts()[0].1.hash_fields(), ip_only);
        // A device reset removes the contexts.
        n.reset_rss(&[true; 4]);
        assert!(n.contexts().is_empty());
    }
}
