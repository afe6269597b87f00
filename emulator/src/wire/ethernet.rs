//! Ethernet: MAC addresses and the EtherType behind at most one VLAN tag. The one place
//! that peels 802.1Q / 802.1ad tags for the crate's hand-read paths (control frames,
//! dispatch of TX frames); full frame parsing is `parse.rs` on etherparse.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Ethernet header without VLAN tag.
pub const ETH_HLEN: usize = 14;
/// 802.1Q customer tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;
/// 802.1ad service tag.
pub const ETHERTYPE_QINQ: u16 = 0x88a8;

/// An Ethernet MAC address; text form `02:a5:f1:00:00:01`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);

    /// A unicast, non-zero address (what may be learnt from a frame).
    pub fn is_unicast(&self) -> bool {
        self.0[0] & 1 == 0 && self.0 != [0; 6]
    }

    pub fn to_u64(self) -> u64 {
        let mut b = [0u8; 8];
        b[2..].copy_from_slice(&self.0);
        u64::from_be_bytes(b)
    }

    pub fn from_u64(v: u64) -> Self {
        let b = v.to_be_bytes();
        let mut m = [0u8; 6];
        m.copy_from_slice(&b[2..]);
        MacAddr(m)
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4], m[5])
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for MacAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut m = [0u8; 6];
        let mut parts = s.split([':', '-']);
        for b in &mut m {
            let p =
                parts.next().ok_or_else(|| format!("bad MAC {s:?}: expected six hex bytes like 02:a5:f1:00:00:01"))?;
            if p.is_empty() || p.len() > 2 {
                return Err(format!("bad MAC {s:?}: expected six hex bytes like 02:a5:f1:00:00:01"));
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| format!("bad MAC {s:?}: {p:?} is not a hex byte"))?;
        }
        if parts.next().is_some() {
            return Err(format!("bad MAC {s:?}: more than six bytes"));
        }
        Ok(MacAddr(m))
    }
}

/// Serialized as its text form.
impl Serialize for MacAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The EtherType of `frame` and the offset of its payload, behind at most one 802.1Q or
/// 802.1ad tag. `None` when the frame is too short for what its header announces.
pub fn ethertype(frame: &[u8]) -> Option<(u16, usize)> {
    let be16 = |at: usize| Some(u16::from_be_bytes([*frame.get(at)?, *frame.get(at + 1)?]));
    let et = be16(12)?;
    if et == ETHERTYPE_VLAN || et == ETHERTYPE_QINQ {
        return Some((be16(16)?, ETH_HLEN + 4));
    }
    Some((et, ETH_HLEN))
}

/// The EtherType under every 802.1Q / 802.1ad tag of `frame` (a tag stack of any depth,
/// bounded by the frame's length). `None` when the frame ends inside its tags.
pub fn innermost_ethertype(frame: &[u8]) -> Option<u16> {
    let mut at = 12;
    loop {
        let et = u16::from_be_bytes([*frame.get(at)?, *frame.get(at + 1)?]);
        if et != ETHERTYPE_VLAN && et != ETHERTYPE_QINQ {
            return Some(et);
        }
        at += 4;
    }
}

/// The source MAC of `frame` (`None` when shorter than 12 bytes).
pub fn source_mac(frame: &[u8]) -> Option<MacAddr> {
    let mut m = [0u8; 6];
    m.copy_from_slice(frame.get(6..12)?);
    Some(MacAddr(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tag_of_a_stack_is_peeled() {
        let mut f = vec![0u8; 12];
        for _ in 0..5 {
            f.extend_from_slice(&ETHERTYPE_QINQ.to_be_bytes());
            f.extend_from_slice(&[0, 1]);
            f.extend_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
            f.extend_from_slice(&[0, 2]);
        }
        f.extend_from_slice(&0x88b5u16.to_be_bytes());
        assert_eq!(innermost_ethertype(&f), Some(0x88b5));
        assert_eq!(innermost_ethertype(&f[..f.len() - 1]), None);
        assert_eq!(innermost_ethertype(&[0u8; 13]), None);
        assert_eq!(source_mac(&f), Some(MacAddr([0; 6])));
        assert_eq!(source_mac(&f[..11]), None);
    }

    #[test]
    fn mac_text_round_trip() {
        let m: MacAddr = "02:a5:f1:00:00:01".parse().unwrap();
        assert_eq!(m.0, [2, 0xa5, 0xf1, 0, 0, 1]);
        assert_eq!(m.to_string(), "02:a5:f1:00:00:01");
        assert!("02:a5:f1:00:00".parse::<MacAddr>().is_err());
        assert!("02:a5:f1:00:00:01:02".parse::<MacAddr>().is_err());
        assert!("zz:a5:f1:00:00:01".parse::<MacAddr>().is_err());
        assert_eq!(MacAddr::from_u64(m.to_u64()), m);
    }

    #[test]
    fn mac_serializes_as_text() {
        let m = MacAddr([2, 0xa5, 0xf1, 0, 0, 1]);
        assert_eq!(serde_json::to_string(&m).unwrap(), "\"02:a5:f1:00:00:01\"");
        assert_eq!(serde_json::from_str::<MacAddr>("\"02:a5:f1:00:00:01\"").unwrap(), m);
        assert!(serde_json::from_str::<MacAddr>("\"02:a5:f1\"").is_err());
    }

    #[test]
    fn one_vlan_tag_is_peeled() {
        let mut f = vec![0u8; 20];
        f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
        assert_eq!(ethertype(&f), Some((0x88b5, 14)));
        f[12..14].copy_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
        f[16..18].copy_from_slice(&0x0800u16.to_be_bytes());
        assert_eq!(ethertype(&f), Some((0x0800, 18)));
        assert_eq!(ethertype(&f[..17]), None);
        assert_eq!(ethertype(&f[..13]), None);
    }
}
