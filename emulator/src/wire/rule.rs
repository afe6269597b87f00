//! RULE_SET / RULE_DEL bodies (control protocol version 3, `flags` and `context` in
//! version 4; docs/control-protocol.md §2.10–2.11): the guest's `ethtool -N flow-type tcp4|udp4|tcp6|udp6 … action Q [loc L]`
//! rules, masked matches on the 5-tuple that the device checks before its aRFS filters.
//!
//! This file holds the body layout and its codec; the header and the op dispatch are in
//! [`super::control`], the match and the table in `model::ntuple`.

use super::flow::{IpVersion, L4Proto};
use std::fmt;

/// RULE_SET body: location u32, rxq u16, action u8, flags u8, ip_version u8, l4_proto u8,
/// context u16, src/src_mask/dst/dst_mask 16 bytes each, then src port, its mask, dst port,
/// its mask (u16 each).
pub const RULE_SET_BODY_LEN: usize = 84;
/// RULE_DEL body: the location u32, or [`RULE_LOC_ALL`].
pub const RULE_DEL_BODY_LEN: usize = 4;
/// Locations are `0 .. RULE_LOC_MAX`.
pub const RULE_LOC_MAX: u32 = 1024;
/// RULE_DEL of every rule (`ethtool -K ntuple-filters off`, module unload).
pub const RULE_LOC_ALL: u32 = u32::MAX;
/// `action` values.
pub const RULE_ACTION_QUEUE: u8 = 0;
pub const RULE_ACTION_DROP: u8 = 1;
/// `flags` (version 4): the queue is the RSS context's choice plus `rxq`.
pub const RULE_FLAG_RSS: u8 = 0x01;

/// Body offsets (from the start of the body).
pub mod off {
    pub const LOCATION: usize = 0;
    pub const RXQ: usize = 4;
    pub const ACTION: usize = 6;
    pub const FLAGS: usize = 7;
    pub const IP_VERSION: usize = 8;
    pub const L4_PROTO: usize = 9;
    pub const CONTEXT: usize = 10;
    pub const SRC_ADDR: usize = 12;
    pub const SRC_MASK: usize = 28;
    pub const DST_ADDR: usize = 44;
    pub const DST_MASK: usize = 60;
    pub const SRC_PORT: usize = 76;
    pub const SRC_PORT_MASK: usize = 78;
    pub const DST_PORT: usize = 80;
    pub const DST_PORT_MASK: usize = 82;
}

/// What a matching packet gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleAction {
    Queue(u16),
    Drop,
}

/// One user rule as the guest sent it: a field takes part in the match where its mask
/// has bits set. IPv4 addresses (and their masks) use the first four bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuleSpec {
    pub location: u32,
    /// With `context`, `Queue(q)` is an offset added to the queue the context picks.
    pub action: RuleAction,
    /// `Some(c)`: RSS context `c` (0: the default one) picks the queue (`ethtool -N …
    /// context c`, FLOW_RSS).
    pub context: Option<u16>,
    pub version: IpVersion,
    pub proto: L4Proto,
    pub src: [u8; 16],
    pub src_mask: [u8; 16],
    pub dst: [u8; 16],
    pub dst_mask: [u8; 16],
    pub sport: u16,
    pub sport_mask: u16,
    pub dport: u16,
    pub dport_mask: u16,
}

/// Why a RULE_SET body is refused (the device answers EINVAL, or EPROTONOSUPPORT for a
/// protocol it has no table for).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RuleBodyError {
    #[error("ip_version {0} is not 4 or 6")]
    IpVersion(u8),
    #[error("l4_proto {0} is not 6 (TCP) or 17 (UDP)")]
    L4Proto(u8),
    #[error("action {0} is not 0 (queue) or 1 (drop)")]
    Action(u8),
    #[error("location {0} is not below {RULE_LOC_MAX}")]
    Location(u32),
    #[error("IPv4 rule with non-zero address or mask bytes 4..16")]
    Address,
    #[error("padding is not zero")]
    Padding,
    #[error("flags {0:#04x}: only 0x01 (RSS context) is defined")]
    Flags(u8),
    #[error("a rule with an RSS context must steer (action 0), not drop")]
    ContextDrop,
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn addr(b: &[u8], at: usize) -> [u8; 16] {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[at..at + 16]);
    a
}

impl RuleSpec {
    /// Decode a body of at least [`RULE_SET_BODY_LEN`] bytes (the caller checks the
    /// length; anything after the fixed part is ignored, as for the other ops).
    pub fn decode(b: &[u8]) -> Result<RuleSpec, RuleBodyError> {
        let b = &b[..RULE_SET_BODY_LEN];
        let location = be32(b, off::LOCATION);
        if location >= RULE_LOC_MAX {
            return Err(RuleBodyError::Location(location));
        }
        let action = match b[off::ACTION] {
            RULE_ACTION_QUEUE => RuleAction::Queue(be16(b, off::RXQ)),
            RULE_ACTION_DROP => RuleAction::Drop,
            v => return Err(RuleBodyError::Action(v)),
        };
        let context = match b[off::FLAGS] {
            0 if be16(b, off::CONTEXT) == 0 => None,
            0 => return Err(RuleBodyError::Padding),
            RULE_FLAG_RSS if action == RuleAction::Drop => return Err(RuleBodyError::ContextDrop),
            RULE_FLAG_RSS => Some(be16(b, off::CONTEXT)),
            f => return Err(RuleBodyError::Flags(f)),
        };
        let version = match b[off::IP_VERSION] {
            4 => IpVersion::V4,
            6 => IpVersion::V6,
            v => return Err(RuleBodyError::IpVersion(v)),
        };
        let proto = L4Proto::from_number(b[off::L4_PROTO]).ok_or(RuleBodyError::L4Proto(b[off::L4_PROTO]))?;
        let r = RuleSpec {
            location,
            action,
            context,
            version,
            proto,
            src: addr(b, off::SRC_ADDR),
            src_mask: addr(b, off::SRC_MASK),
            dst: addr(b, off::DST_ADDR),
            dst_mask: addr(b, off::DST_MASK),
            sport: be16(b, off::SRC_PORT),
            sport_mask: be16(b, off::SRC_PORT_MASK),
            dport: be16(b, off::DST_PORT),
            dport_mask: be16(b, off::DST_PORT_MASK),
        };
        if version == IpVersion::V4 && [r.src, r.src_mask, r.dst, r.dst_mask].iter().any(|a| a[4..] != [0; 12]) {
            return Err(RuleBodyError::Address);
        }
        Ok(r)
    }

    /// The body bytes.
    pub fn encode(&self, b: &mut Vec<u8>) {
        let (rxq, action) = match self.action {
            RuleAction::Queue(q) => (q, RULE_ACTION_QUEUE),
            RuleAction::Drop => (0, RULE_ACTION_DROP),
        };
        b.extend_from_slice(&self.location.to_be_bytes());
        b.extend_from_slice(&rxq.to_be_bytes());
        b.extend_from_slice(&[action, if self.context.is_some() { RULE_FLAG_RSS } else { 0 }]);
        b.push(match self.version {
            IpVersion::V4 => 4,
            IpVersion::V6 => 6,
        });
        b.push(self.proto.number());
        b.extend_from_slice(&self.context.unwrap_or(0).to_be_bytes());
        for a in [&self.src, &self.src_mask, &self.dst, &self.dst_mask] {
            b.extend_from_slice(a);
        }
        for v in [self.sport, self.sport_mask, self.dport, self.dport_mask] {
            b.extend_from_slice(&v.to_be_bytes());
        }
    }

    /// A rule on `version`/`proto` at `location` that matches every packet of that type
    /// and steers it to `rxq` (tests narrow it with the fields).
    pub fn any(location: u32, version: IpVersion, proto: L4Proto, rxq: u16) -> RuleSpec {
        RuleSpec {
            location,
            action: RuleAction::Queue(rxq),
            context: None,
            version,
            proto,
            src: [0; 16],
            src_mask: [0; 16],
            dst: [0; 16],
            dst_mask: [0; 16],
            sport: 0,
            sport_mask: 0,
            dport: 0,
            dport_mask: 0,
        }
    }
}

impl fmt::Display for RuleSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ty = match (self.version, self.proto) {
            (IpVersion::V4, L4Proto::Tcp) => "tcp4",
            (IpVersion::V4, L4Proto::Udp) => "udp4",
            (IpVersion::V6, L4Proto::Tcp) => "tcp6",
            (IpVersion::V6, L4Proto::Udp) => "udp6",
        };
        write!(f, "loc {} flow-type {ty}", self.location)?;
        let ip = |a: &[u8; 16]| -> String {
            match self.version {
                IpVersion::V4 => std::net::Ipv4Addr::new(a[0], a[1], a[2], a[3]).to_string(),
                IpVersion::V6 => std::net::Ipv6Addr::from(*a).to_string(),
            }
        };
        if self.src_mask != [0; 16] {
            write!(f, " src-ip {} m {}", ip(&self.src), ip(&self.src_mask))?;
        }
        if self.dst_mask != [0; 16] {
            write!(f, " dst-ip {} m {}", ip(&self.dst), ip(&self.dst_mask))?;
        }
        if self.sport_mask != 0 {
            write!(f, " src-port {} m {:#x}", self.sport, self.sport_mask)?;
        }
        if self.dport_mask != 0 {
            write!(f, " dst-port {} m {:#x}", self.dport, self.dport_mask)?;
        }
        match self.action {
            RuleAction::Queue(q) => write!(f, " action {q}")?,
            RuleAction::Drop => write!(f, " action -1")?,
        }
        match self.context {
            Some(c) => write!(f, " context {c}"),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule() -> RuleSpec {
        let mut r = RuleSpec::any(7, IpVersion::V4, L4Proto::Udp, 3);
        r.src[..4].copy_from_slice(&[10, 99, 0, 3]);
        r.src_mask[..4].copy_from_slice(&[255; 4]);
        r.dport = 5201;
        r.dport_mask = 0xffff;
        r
    }

    #[test]
    fn round_trip_and_text() {
        let r = rule();
        let mut b = Vec::new();
        r.encode(&mut b);
        assert_eq!(b.len(), RULE_SET_BODY_LEN);
        assert_eq!(RuleSpec::decode(&b), Ok(r));
        assert_eq!(
            r.to_string(),
            "loc 7 flow-type udp4 src-ip 10.99.0.3 m 255.255.255.255 dst-port 5201 m 0xffff action 3"
        );
        let d = RuleSpec { action: RuleAction::Drop, ..r };
        let mut b = Vec::new();
        d.encode(&mut b);
        assert_eq!(RuleSpec::decode(&b), Ok(d));
    }

    #[test]
    fn bad_bodies() {
        let mut good = Vec::new();
        rule().encode(&mut good);
        let cases: [(usize, u8, RuleBodyError); 6] = [
            (off::LOCATION + 2, 0x04, RuleBodyError::Location(0x0407)),
            (off::ACTION, 2, RuleBodyError::Action(2)),
            (off::FLAGS, 2, RuleBodyError::Flags(2)),
            (off::IP_VERSION, 5, RuleBodyError::IpVersion(5)),
            (off::L4_PROTO, 1, RuleBodyError::L4Proto(1)),
            (off::DST_MASK + 9, 1, RuleBodyError::Address),
        ];
        for (at, v, want) in cases {
            let mut b = good.clone();
            b[at] = v;
            assert_eq!(RuleSpec::decode(&b), Err(want), "byte {at} = {v}");
        }
    }
}
