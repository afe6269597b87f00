//! HASH_GET / HASH_SET (control protocol version 3, docs/control-protocol.md §2.12): which
//! header fields feed the device's RSS hash per flow type (the guest's `ethtool -N …
//! rx-flow-hash`, netlink `flow-hash`) and the input transformation (`sym-xor`). The body
//! (HASH_SET) and the reply (HASH_GET, after the timestamps) share one layout.
//!
//! The field sets are ethtool's `RXH_*` bits, so the module passes them through; the
//! device's meaning of them is in `model::rss::HashFields`.

/// Six u32 field sets, u8 xfrm, three pad bytes.
pub const HASH_BODY_LEN: usize = 28;
/// `RXH_IP_SRC`, `RXH_IP_DST`, `RXH_L4_B_0_1` (the source port), `RXH_L4_B_2_3`.
pub const HASH_IP_SRC: u32 = 0x10;
pub const HASH_IP_DST: u32 = 0x20;
pub const HASH_L4_B_0_1: u32 = 0x40;
pub const HASH_L4_B_2_3: u32 = 0x80;
/// In HASH_SET: keep this field set.
pub const HASH_KEEP: u32 = u32::MAX;
/// `xfrm` values: none, `RXH_XFRM_SYM_XOR`, and keep (`RXH_XFRM_NO_CHANGE`).
pub const HASH_XFRM_NONE: u8 = 0;
pub const HASH_XFRM_SYM_XOR: u8 = 1;
pub const HASH_XFRM_KEEP: u8 = 0xff;

/// Body offsets.
pub mod off {
    pub const TCP4: usize = 0;
    pub const UDP4: usize = 4;
    pub const IP4: usize = 8;
    pub const TCP6: usize = 12;
    pub const UDP6: usize = 16;
    pub const IP6: usize = 20;
    pub const XFRM: usize = 24;
}

/// The flow types, in body order.
pub const FLOW_TYPES: [&str; 6] = ["tcp4", "udp4", "ip4", "tcp6", "udp6", "ip6"];

/// A HASH_SET body or HASH_GET reply: `fields` in [`FLOW_TYPES`] order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HashMsg {
    pub fields: [u32; 6],
    pub xfrm: u8,
}

/// Non-zero padding (the device answers EINVAL).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("HASH body padding is not zero")]
pub struct HashPadding;

impl HashMsg {
    /// A HASH_SET that changes nothing.
    pub const KEEP: HashMsg = HashMsg { fields: [HASH_KEEP; 6], xfrm: HASH_XFRM_KEEP };

    /// Decode at least [`HASH_BODY_LEN`] bytes (the caller checks the length).
    pub fn decode(b: &[u8]) -> Result<HashMsg, HashPadding> {
        let b = &b[..HASH_BODY_LEN];
        if b[off::XFRM + 1..] != [0, 0, 0] {
            return Err(HashPadding);
        }
        let fields = std::array::from_fn(|i| u32::from_be_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]));
        Ok(HashMsg { fields, xfrm: b[off::XFRM] })
    }

    pub fn encode(&self, b: &mut Vec<u8>) {
        for f in self.fields {
            b.extend_from_slice(&f.to_be_bytes());
        }
        b.extend_from_slice(&[self.xfrm, 0, 0, 0]);
    }
}

/// ethtool's letters for a field set (`sdfn`, `sd`, …), as `ethtool -n … rx-flow-hash`
/// abbreviates them.
pub fn letters(f: u32) -> String {
    [(HASH_IP_SRC, 's'), (HASH_IP_DST, 'd'), (HASH_L4_B_0_1, 'f'), (HASH_L4_B_2_3, 'n')]
        .iter()
        .filter(|(bit, _)| f & bit != 0)
        .map(|(_, c)| *c)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_padding_and_letters() {
        let m = HashMsg { fields: [0xf0, 0x30, 0x30, HASH_KEEP, 0x10, 0], xfrm: HASH_XFRM_SYM_XOR };
        let mut b = Vec::new();
        m.encode(&mut b);
        assert_eq!(b.len(), HASH_BODY_LEN);
        assert_eq!(&b[..4], &[0, 0, 0, 0xf0]);
        assert_eq!(HashMsg::decode(&b), Ok(m));
        b[27] = 1;
        assert_eq!(HashMsg::decode(&b), Err(HashPadding));
        assert_eq!(
            (letters(0xf0), letters(0x30), letters(0x10), letters(0)),
            ("sdfn".into(), "sd".into(), "s".into(), String::new())
        );
    }
}
