//! What the control runtime reports: plain counter structs, serialised as they are into
//! the run report (`device.filter`, `device.control`, the per-flow view's rules).

use super::guest::GuestStats;
use super::guest::StatsSample;
use crate::model::engine::EngineStats;
use crate::model::filter::{Action, PartitionStats, RuleSnapshot};
use crate::wire::FlowKey;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::BTreeMap;

/// The device's filter counters, in the shape of the report's `device.filter` object.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
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
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameCounters {
    /// Control frames handed to the runtime.
    pub received: u64,
    /// Well-formed requests by op name (hello, add, mod, del, flush, stats, query).
    pub requests: BTreeMap<Cow<'static, str>, u64>,
    /// Malformed, unknown or otherwise refused frames.
    pub bad: u64,
    /// By kind: too_short, truncated_header, bad_version, unknown_op, bad_length,
    /// bad_body, bad_ip_version, bad_l4_proto, bad_address, bad_queue, not_control.
    pub bad_by_kind: BTreeMap<Cow<'static, str>, u64>,
    /// Error completions sent for bad frames (a part of `completions_sent`).
    pub error_completions: u64,
    /// Answers not sent because the request was STATS or had NO_REPLY set.
    pub completions_suppressed: u64,
    pub completions_sent: u64,
    /// Completions that could not be delivered (queue not ready, or no RX buffer for
    /// longer than the backlog keeps a frame).
    pub completions_dropped: u64,
    pub completions_dropped_no_buffer: u64,
    pub events_sent: u64,
    pub events_dropped: u64,
    /// Completions and events that found no RX buffer at first and waited in the backlog
    /// (sent later, in order, or counted as dropped). Reports written before it: 0.
    #[serde(default)]
    pub frames_deferred: u64,
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
