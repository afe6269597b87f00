//! The guest's ethtool ntuple rules (`ethtool -N … flow-type tcp4 … action Q`): masked
//! matches on the 5-tuple, kept by location and checked in location order (lowest
//! first) **before** the aRFS filters, as mlx5 puts its ethtool steering tables in front
//! of the aRFS tables. They count against the same capacity as the aRFS filters of their
//! flow type (`FilterTable`); the table itself lives there.

use crate::wire::rule::{RuleAction, RuleSpec};
use crate::wire::FlowKey;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// One installed user rule with its hit counter.
#[derive(Debug)]
pub struct UserRule {
    pub spec: RuleSpec,
    hits: AtomicU64,
}

fn masked_eq(a: &[u8; 16], b: &[u8; 16], m: &[u8; 16]) -> bool {
    a.iter().zip(b).zip(m).all(|((x, y), m)| x & m == y & m)
}

impl UserRule {
    pub fn new(spec: RuleSpec) -> UserRule {
        UserRule { spec, hits: AtomicU64::new(0) }
    }

    /// Whether a packet of flow `key` matches (its type, then every masked field).
    #[inline]
    pub fn matches(&self, key: &FlowKey) -> bool {
        let s = &self.spec;
        s.version == key.version
            && s.proto == key.proto
            && key.sport & s.sport_mask == s.sport & s.sport_mask
            && key.dport & s.dport_mask == s.dport & s.dport_mask
            && masked_eq(&key.src, &s.src, &s.src_mask)
            && masked_eq(&key.dst, &s.dst, &s.dst_mask)
    }

    pub(crate) fn hit(&self) {
        self.hits.fetch_add(1, Relaxed);
    }

    pub fn snapshot(&self) -> UserRuleSnapshot {
        UserRuleSnapshot { rule: self.spec.to_string(), hits: self.hits.load(Relaxed) }
    }
}

/// A user rule as the report shows it: ethtool's words and the packets it took.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UserRuleSnapshot {
    pub rule: String,
    pub hits: u64,
}

/// What a user rule does with a packet, in the filter table's terms.
pub fn action(spec: &RuleSpec) -> super::filter::Action {
    match spec.action {
        RuleAction::Queue(q) => super::filter::Action::Queue(q),
        RuleAction::Drop => super::filter::Action::Drop,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{IpVersion, L4Proto};

    #[test]
    fn partial_fields_match_what_they_name() {
        let key = FlowKey::v4(L4Proto::Tcp, [10, 99, 0, 3], 40000, [10, 99, 0, 2], 5201);
        let any = RuleSpec::any(0, IpVersion::V4, L4Proto::Tcp, 1);
        assert!(UserRule::new(any).matches(&key));
        assert!(!UserRule::new(RuleSpec { proto: L4Proto::Udp, ..any }).matches(&key));
        assert!(!UserRule::new(RuleSpec { version: IpVersion::V6, ..any }).matches(&key));
        let mut src = any;
        src.src[..4].copy_from_slice(&[10, 99, 0, 3]);
        src.src_mask[..4].copy_from_slice(&[255; 4]);
        assert!(UserRule::new(src).matches(&key));
        src.src[3] = 4;
        assert!(!UserRule::new(src).matches(&key));
        src.src_mask[3] = 0xfc; // 10.99.0.4/30 holds .3? no: /30 of .4 is .4-.7
        assert!(!UserRule::new(src).matches(&key));
        src.src_mask[3] = 0xf8; // /29: .0-.7
        assert!(UserRule::new(src).matches(&key));
        let dport = RuleSpec { dport: 5201, dport_mask: 0xffff, ..any };
        assert!(UserRule::new(dport).matches(&key));
        assert!(!UserRule::new(RuleSpec { dport: 5202, ..dport }).matches(&key));
        let sport = RuleSpec { sport: 40000, sport_mask: 0xffff, ..any };
        assert!(UserRule::new(sport).matches(&key));
        assert!(!UserRule::new(RuleSpec { sport: 40001, ..sport }).matches(&key));
        let mut dst = any;
        dst.dst[..4].copy_from_slice(&[10, 99, 0, 2]);
        dst.dst_mask[..4].copy_from_slice(&[255; 4]);
        assert!(UserRule::new(dst).matches(&key));
    }
}
