//! Receive-side scaling: Toeplitz hash, virtio-net hash types and the indirection table.
//!
//! The hash is table driven: for every input byte position `i` and byte value `b` the
//! XOR of the 32-bit key windows selected by the set bits of `b` is precomputed, so a
//! hash is one table lookup and XOR per input byte (12 for TCPv4, 36 for TCPv6).

use crate::wire::{FlowKey, Ip, IpVersion, L4Proto, PacketInfo};
use std::fmt;

/// Longest hash input: IPv6 source + destination + two ports.
pub const MAX_INPUT: usize = 36;
/// A key must cover the longest input plus one 32-bit window.
pub const MIN_KEY_LEN: usize = MAX_INPUT + 4;
/// Linux's default `netdev_rss_key` length and virtio-net's maximum are both 40 bytes;
/// longer keys are accepted (the extra bytes are unused by a 36-byte input).
pub const MAX_KEY_LEN: usize = 255;

/// The Microsoft verification key, the default of every profile.
pub const MICROSOFT_KEY: [u8; 40] = [
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0, 0xd0, 0xca, 0x2b,
    0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac,
    0x01, 0xfa,
];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RssError {
    #[error("RSS key is {0} bytes; it needs at least {MIN_KEY_LEN} and at most {MAX_KEY_LEN}")]
    KeyLength(usize),
    #[error("indirection table size {0} is not a power of two between 1 and 65536")]
    IndirSize(usize),
    #[error("indirection table entry {slot} points at queue {queue}, but the device has {queues} queues")]
    IndirQueue { slot: usize, queue: u16, queues: u16 },
    #[error("the device needs at least one queue")]
    NoQueues,
    /// A new key must have the length of the current one (as a NIC's fixed key size).
    #[error("RSS key of {got} bytes; the device's key is {want} bytes")]
    KeyLengthMismatch { got: usize, want: usize },
    /// A new table must have the size of the current one.
    #[error("indirection table of {got} entries; the device's has {want}")]
    IndirSizeMismatch { got: usize, want: usize },
    /// Hash fields the device cannot use (HASH_SET, `ethtool -N … rx-flow-hash`).
    #[error("hash fields: {0}")]
    HashFields(&'static str),
}

/// Table-driven Toeplitz hash for a fixed key.
#[derive(Clone)]
pub struct Toeplitz {
    key: Vec<u8>,
    table: Box<[[u32; 256]; MAX_INPUT]>,
}

impl fmt::Debug for Toeplitz {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Toeplitz(key={})", hex::encode(&self.key))
    }
}

impl Toeplitz {
    pub fn new(key: &[u8]) -> Result<Self, RssError> {
        if !(MIN_KEY_LEN..=MAX_KEY_LEN).contains(&key.len()) {
            return Err(RssError::KeyLength(key.len()));
        }
        // 32-bit window of the key starting at bit `bit` (big-endian bit order).
        let window = |bit: usize| -> u32 {
            let byte = bit / 8;
            let mut w: u64 = 0;
            for i in 0..5 {
                w = (w << 8) | u64::from(*key.get(byte + i).unwrap_or(&0));
            }
            (w >> (8 - bit % 8)) as u32
        };
        let mut table = Box::new([[0u32; 256]; MAX_INPUT]);
        for (pos, row) in table.iter_mut().enumerate() {
            let bits: [u32; 8] = std::array::from_fn(|j| window(pos * 8 + j));
            for (b, slot) in row.iter_mut().enumerate() {
                let mut h = 0;
                for (j, w) in bits.iter().enumerate() {
                    if b & (0x80 >> j) != 0 {
                        h ^= w;
                    }
                }
                *slot = h;
            }
        }
        Ok(Toeplitz { key: key.to_vec(), table })
    }

    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// Hash of `input` (at most [`MAX_INPUT`] bytes; longer input is truncated).
    #[inline]
    pub fn hash(&self, input: &[u8]) -> u32 {
        let mut h = 0;
        for (row, &b) in self.table.iter().zip(input) {
            h ^= row[usize::from(b)];
        }
        h
    }

    /// Hash of a fixed-size input (at most [`MAX_INPUT`] bytes are used): the loop is
    /// unrolled for the 12-byte (IPv4 4-tuple) and 36-byte (IPv6 4-tuple) inputs.
    #[inline]
    pub fn hash_array<const N: usize>(&self, input: &[u8; N]) -> u32 {
        let mut h = 0;
        for (row, &b) in self.table.iter().zip(input) {
            h ^= row[usize::from(b)];
        }
        h
    }

    /// Bit-serial reference implementation (the textbook definition); used by tests
    /// to cross-check the table.
    pub fn hash_reference(key: &[u8], input: &[u8]) -> u32 {
        let mut result = 0u32;
        let mut k = u32::from_be_bytes([key[0], key[1], key[2], key[3]]);
        let mut next = 32;
        for &byte in input {
            for bit in 0..8 {
                if byte & (0x80 >> bit) != 0 {
                    result ^= k;
                }
                let nb = key.get(next / 8).map_or(0, |kb| (kb >> (7 - next % 8)) & 1);
                k = (k << 1) | u32::from(nb);
                next += 1;
            }
        }
        result
    }
}

/// virtio-net `hash_types` bits (VIRTIO_NET_RSS_HASH_TYPE_*).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct HashTypes(pub u32);

impl HashTypes {
    pub const IPV4: u32 = 1 << 0;
    pub const TCPV4: u32 = 1 << 1;
    pub const UDPV4: u32 = 1 << 2;
    pub const IPV6: u32 = 1 << 3;
    pub const TCPV6: u32 = 1 << 4;
    pub const UDPV6: u32 = 1 << 5;
    pub const ALL: HashTypes = HashTypes(0x3f);
    pub const NAMES: [(&'static str, u32); 6] = [
        ("ipv4", Self::IPV4),
        ("tcpv4", Self::TCPV4),
        ("udpv4", Self::UDPV4),
        ("ipv6", Self::IPV6),
        ("tcpv6", Self::TCPV6),
        ("udpv6", Self::UDPV6),
    ];

    pub fn has(self, bit: u32) -> bool {
        self.0 & bit != 0
    }

    pub fn from_name(name: &str) -> Option<u32> {
        Self::NAMES.iter().find(|(n, _)| *n == name).map(|(_, b)| *b)
    }
}

/// Which hash type was applied (the virtio-net hash report value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashKind {
    Ipv4,
    Tcpv4,
    Udpv4,
    Ipv6,
    Tcpv6,
    Udpv6,
}

impl HashKind {
    pub fn name(self) -> &'static str {
        match self {
            HashKind::Ipv4 => "ipv4",
            HashKind::Tcpv4 => "tcpv4",
            HashKind::Udpv4 => "udpv4",
            HashKind::Ipv6 => "ipv6",
            HashKind::Tcpv6 => "tcpv6",
            HashKind::Udpv6 => "udpv6",
        }
    }

    /// The `hash_report` value of a virtio-net header (VIRTIO_NET_HASH_REPORT_*).
    pub fn virtio_report(self) -> u16 {
        match self {
            HashKind::Ipv4 => 1,
            HashKind::Tcpv4 => 2,
            HashKind::Udpv4 => 3,
            HashKind::Ipv6 => 4,
            HashKind::Tcpv6 => 5,
            HashKind::Udpv6 => 6,
        }
    }
}

/// Which header fields feed the hash per flow type (ethtool's `rx-flow-hash`, as its
/// `RXH_*` bits: [`HashFields::IP_SRC`] …), and whether source and destination are XORed
/// before hashing (`sym-xor`: both directions of a flow hash alike). `ip4`/`ip6` are
/// the IP packets that are not TCP or UDP (and fragments).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct HashFields {
    pub tcp4: u32,
    pub udp4: u32,
    pub ip4: u32,
    pub tcp6: u32,
    pub udp6: u32,
    pub ip6: u32,
    pub sym_xor: bool,
}

impl HashFields {
    pub const IP_SRC: u32 = 0x10;
    pub const IP_DST: u32 = 0x20;
    /// The source port.
    pub const L4_B_0_1: u32 = 0x40;
    /// The destination port.
    pub const L4_B_2_3: u32 = 0x80;
    const IP: u32 = Self::IP_SRC | Self::IP_DST;
    const L4: u32 = Self::IP | Self::L4_B_0_1 | Self::L4_B_2_3;

    /// The fields virtio-net's `hash_types` mean: the 4-tuple where a flow type's L4 bit
    /// is set, else the 2-tuple where its IP bit is, else none.
    pub fn from_types(t: HashTypes) -> HashFields {
        let pick = |l4: u32, ip: u32| {
            if t.has(l4) {
                Self::L4
            } else if t.has(ip) {
                Self::IP
            } else {
                0
            }
        };
        let ip = |bit: u32| if t.has(bit) { Self::IP } else { 0 };
        HashFields {
            tcp4: pick(HashTypes::TCPV4, HashTypes::IPV4),
            udp4: pick(HashTypes::UDPV4, HashTypes::IPV4),
            ip4: ip(HashTypes::IPV4),
            tcp6: pick(HashTypes::TCPV6, HashTypes::IPV6),
            udp6: pick(HashTypes::UDPV6, HashTypes::IPV6),
            ip6: ip(HashTypes::IPV6),
            sym_xor: false,
        }
    }

    /// The field sets in wire order (tcp4, udp4, ip4, tcp6, udp6, ip6).
    pub fn sets(&self) -> [u32; 6] {
        [self.tcp4, self.udp4, self.ip4, self.tcp6, self.udp6, self.ip6]
    }

    pub fn with_sets(self, f: [u32; 6]) -> HashFields {
        HashFields { tcp4: f[0], udp4: f[1], ip4: f[2], tcp6: f[3], udp6: f[4], ip6: f[5], ..self }
    }

    /// What the device can hash on: addresses and ports for TCP and UDP, addresses for the
    /// other IP packets; with `sym_xor`, both or neither of each pair (the kernel's own
    /// rule for symmetric hashing).
    pub fn check(&self) -> Result<(), RssError> {
        let s = self.sets();
        if s.iter().enumerate().any(|(i, &f)| f & !(if i % 3 == 2 { Self::IP } else { Self::L4 }) != 0) {
            return Err(RssError::HashFields("a field the device cannot hash on (ip4/ip6 take addresses only)"));
        }
        let pair = |f: u32, a: u32, b: u32| (f & a == 0) == (f & b == 0);
        if self.sym_xor
            && !s.iter().all(|&f| pair(f, Self::IP_SRC, Self::IP_DST) && pair(f, Self::L4_B_0_1, Self::L4_B_2_3))
        {
            return Err(RssError::HashFields("sym-xor needs source and destination of each field pair"));
        }
        Ok(())
    }
}

/// The hash input chosen for a packet under `types` (virtio-net's meaning, see
/// [`HashFields::from_types`]): none when the packet's flow type hashes on nothing (it
/// goes to the unclassified queue, 0, as in virtio-net).
pub fn hash_input(info: &PacketInfo, types: HashTypes, buf: &mut [u8; MAX_INPUT]) -> Option<(HashKind, usize)> {
    hash_input_fields(info, &HashFields::from_types(types), buf)
}

/// The hash input of a packet under `fields`: source address, destination address,
/// source port, destination port, each where its field is selected, in that order;
/// with `sym_xor` a selected pair is fed as `src ^ dst` twice.
#[inline]
pub fn hash_input_fields(
    info: &PacketInfo,
    fields: &HashFields,
    buf: &mut [u8; MAX_INPUT],
) -> Option<(HashKind, usize)> {
    let ip = info.ip?;
    let l4 = info.l4;
    let mut a = [0u8; 16];
    let mut b = [0u8; 16];
    let (alen, set, ip_kind, l4_kind) = match ip {
        Ip::V4 { src, dst } => {
            a[..4].copy_from_slice(&src);
            b[..4].copy_from_slice(&dst);
            match l4.map(|p| p.proto) {
                Some(L4Proto::Tcp) => (4, fields.tcp4, HashKind::Ipv4, HashKind::Tcpv4),
                Some(L4Proto::Udp) => (4, fields.udp4, HashKind::Ipv4, HashKind::Udpv4),
                None => (4, fields.ip4, HashKind::Ipv4, HashKind::Ipv4),
            }
        }
        Ip::V6 { src, dst } => {
            a = src;
            b = dst;
            match l4.map(|p| p.proto) {
                Some(L4Proto::Tcp) => (16, fields.tcp6, HashKind::Ipv6, HashKind::Tcpv6),
                Some(L4Proto::Udp) => (16, fields.udp6, HashKind::Ipv6, HashKind::Udpv6),
                None => (16, fields.ip6, HashKind::Ipv6, HashKind::Ipv6),
            }
        }
    };
    if set == 0 {
        return None;
    }
    let xor = fields.sym_xor;
    let mut n = 0;
    let mut put = |bytes: &[u8]| {
        buf[n..n + bytes.len()].copy_from_slice(bytes);
        n += bytes.len();
    };
    let (sa, da) = (set & HashFields::IP_SRC != 0, set & HashFields::IP_DST != 0);
    let mut x = [0u8; 16];
    if xor && sa && da {
        for (o, (p, q)) in x.iter_mut().zip(a.iter().zip(&b)) {
            *o = p ^ q;
        }
    }
    if sa {
        put(if xor && da { &x[..alen] } else { &a[..alen] });
    }
    if da {
        put(if xor && sa { &x[..alen] } else { &b[..alen] });
    }
    let mut kind = ip_kind;
    if let Some(p) = l4 {
        let (sp, dp) = (set & HashFields::L4_B_0_1 != 0, set & HashFields::L4_B_2_3 != 0);
        let both = xor && sp && dp;
        if sp {
            put(&(if both { p.sport ^ p.dport } else { p.sport }).to_be_bytes());
        }
        if dp {
            put(&(if both { p.sport ^ p.dport } else { p.dport }).to_be_bytes());
        }
        if sp || dp {
            kind = l4_kind;
        }
    }
    Some((kind, n))
}

/// The RSS result for one packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RssDecision {
    pub hash: Option<(u32, HashKind)>,
    /// Indirection slot used (None when the packet was not hashed).
    pub slot: Option<usize>,
    pub queue: u16,
}

/// An RSS configuration: key, hash types, indirection table.
#[derive(Clone, Debug)]
pub struct Rss {
    toeplitz: Toeplitz,
    types: HashTypes,
    /// What `types` means, or what the guest set since (HASH_SET).
    fields: HashFields,
    indir: Vec<u16>,
    queues: u16,
}

/// Equal when they hash and spread alike: key, hash types, indirection table, queues
/// (the Toeplitz lookup tables follow from the key).
impl PartialEq for Rss {
    fn eq(&self, o: &Self) -> bool {
        self.toeplitz.key == o.toeplitz.key
            && self.fields == o.fields
            && self.indir == o.indir
            && self.queues == o.queues
    }
}

impl Rss {
    /// `indir_size` entries spread round-robin over all `queues`
    /// (Linux's `ethtool_rxfh_indir_default`).
    pub fn new(key: &[u8], types: HashTypes, indir_size: usize, queues: u16) -> Result<Self, RssError> {
        if !indir_size.is_power_of_two() || indir_size > 65536 {
            return Err(RssError::IndirSize(indir_size));
        }
        if queues == 0 {
            return Err(RssError::NoQueues);
        }
        let toeplitz = Toeplitz::new(key)?;
        let indir = (0..indir_size).map(|i| (i % usize::from(queues)) as u16).collect();
        Ok(Rss { toeplitz, types, fields: HashFields::from_types(types), indir, queues })
    }

    /// Replace the indirection table (entries must name existing queues).
    pub fn set_indirection(&mut self, indir: Vec<u16>) -> Result<(), RssError> {
        if !indir.len().is_power_of_two() || indir.len() > 65536 {
            return Err(RssError::IndirSize(indir.len()));
        }
        if let Some((slot, &queue)) = indir.iter().enumerate().find(|(_, &q)| q >= self.queues) {
            return Err(RssError::IndirQueue { slot, queue, queues: self.queues });
        }
        self.indir = indir;
        Ok(())
    }

    /// Spread the table over the enabled queues only (what a device does when the
    /// driver enables fewer queue pairs, e.g. `ethtool -L`). With none enabled (device
    /// reset, driver gone) the table is left as it was: nothing is delivered then anyway,
    /// and reports can still ask where a flow went.
    pub fn spread_over(&mut self, enabled: &[bool]) {
        let on: Vec<u16> =
            (0..self.queues).filter(|&q| enabled.get(usize::from(q)).copied().unwrap_or(false)).collect();
        if on.is_empty() {
            return;
        }
        let n = self.indir.len();
        self.indir = (0..n).map(|i| on[i % on.len()]).collect();
    }

    pub fn queues(&self) -> u16 {
        self.queues
    }

    /// This configuration with a new key and/or indirection table (`None` keeps it), as
    /// `ethtool -X` changes it: the key keeps its length, the table its size, and every
    /// entry must name an existing queue. All or nothing: on error `self` is unchanged
    /// and nothing new is returned.
    pub fn reconfigured(&self, key: Option<&[u8]>, indir: Option<&[u16]>) -> Result<Rss, RssError> {
        if let Some(k) = key {
            if k.len() != self.toeplitz.key.len() {
                return Err(RssError::KeyLengthMismatch { got: k.len(), want: self.toeplitz.key.len() });
            }
        }
        if let Some(t) = indir {
            if t.len() != self.indir.len() {
                return Err(RssError::IndirSizeMismatch { got: t.len(), want: self.indir.len() });
            }
            if let Some((slot, &queue)) = t.iter().enumerate().find(|(_, &q)| q >= self.queues) {
                return Err(RssError::IndirQueue { slot, queue, queues: self.queues });
            }
        }
        let mut next = self.clone();
        if let Some(k) = key {
            next.toeplitz = Toeplitz::new(k)?;
        }
        if let Some(t) = indir {
            next.indir = t.to_vec();
        }
        Ok(next)
    }

    pub fn indirection(&self) -> &[u16] {
        &self.indir
    }

    pub fn hash_types(&self) -> HashTypes {
        self.types
    }

    /// The hash fields per flow type and the input transformation.
    pub fn hash_fields(&self) -> HashFields {
        self.fields
    }

    /// This configuration hashing on `fields` (checked by [`HashFields::check`]).
    pub fn with_hash_fields(&self, fields: HashFields) -> Result<Rss, RssError> {
        fields.check()?;
        Ok(Rss { fields, ..self.clone() })
    }

    /// This configuration hashing on the fields of `other` (an RSS context follows the
    /// default context's hash fields).
    pub fn with_fields_of(&self, other: &Rss) -> Rss {
        Rss { types: other.types, fields: other.fields, ..self.clone() }
    }

    pub fn toeplitz(&self) -> &Toeplitz {
        &self.toeplitz
    }

    #[inline]
    pub fn decide(&self, info: &PacketInfo) -> RssDecision {
        let hash = match self.hash_4tuple(info) {
            Some(h) => Some(h),
            None => self.hash_generic(info),
        };
        match hash {
            Some((h, kind)) => {
                let slot = (h as usize) & (self.indir.len() - 1);
                RssDecision { hash: Some((h, kind)), slot: Some(slot), queue: self.indir[slot] }
            }
            None => RssDecision { hash: None, slot: None, queue: 0 },
        }
    }

    /// [`Rss::decide`] for a TCP/UDP packet given by its flow key, when its flow type
    /// hashes on the whole 4-tuple without `sym-xor` (every profile's default): the same
    /// decision without a [`PacketInfo`]. `None` otherwise (use `decide`).
    #[inline]
    pub fn decide_key(&self, key: &FlowKey) -> Option<RssDecision> {
        let (h, kind) = self.hash_key(key)?;
        let slot = (h as usize) & (self.indir.len() - 1);
        Some(RssDecision { hash: Some((h, kind)), slot: Some(slot), queue: self.indir[slot] })
    }

    /// The common case without the general input builder: a TCP/UDP packet whose flow
    /// type hashes on the whole 4-tuple, without `sym-xor` (the default of every
    /// profile). `None` when that is not the case ([`Rss::hash_generic`] decides).
    #[inline]
    fn hash_4tuple(&self, info: &PacketInfo) -> Option<(u32, HashKind)> {
        self.hash_key(&info.flow_key()?)
    }

    #[inline]
    fn hash_key(&self, key: &FlowKey) -> Option<(u32, HashKind)> {
        if self.fields.sym_xor {
            return None;
        }
        let (sp, dp) = (key.sport.to_be_bytes(), key.dport.to_be_bytes());
        let (set, kind) = match (key.version, key.proto) {
            (IpVersion::V4, L4Proto::Tcp) => (self.fields.tcp4, HashKind::Tcpv4),
            (IpVersion::V4, L4Proto::Udp) => (self.fields.udp4, HashKind::Udpv4),
            (IpVersion::V6, L4Proto::Tcp) => (self.fields.tcp6, HashKind::Tcpv6),
            (IpVersion::V6, L4Proto::Udp) => (self.fields.udp6, HashKind::Udpv6),
        };
        if set != HashFields::L4 {
            return None;
        }
        match key.version {
            IpVersion::V4 => {
                let mut b = [0u8; 12];
                b[..4].copy_from_slice(&key.src[..4]);
                b[4..8].copy_from_slice(&key.dst[..4]);
                b[8..10].copy_from_slice(&sp);
                b[10..].copy_from_slice(&dp);
                Some((self.toeplitz.hash_array(&b), kind))
            }
            IpVersion::V6 => {
                let mut b = [0u8; 36];
                b[..16].copy_from_slice(&key.src);
                b[16..32].copy_from_slice(&key.dst);
                b[32..34].copy_from_slice(&sp);
                b[34..].copy_from_slice(&dp);
                Some((self.toeplitz.hash_array(&b), kind))
            }
        }
    }

    /// Any hash fields: the input [`hash_input_fields`] builds.
    fn hash_generic(&self, info: &PacketInfo) -> Option<(u32, HashKind)> {
        let mut buf = [0u8; MAX_INPUT];
        let (kind, len) = hash_input_fields(info, &self.fields, &mut buf)?;
        Some((self.toeplitz.hash(&buf[..len]), kind))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{FlowKey, L4Ports};
    use std::net::IpAddr;

    fn info(flow: &str, l4: bool) -> PacketInfo {
        let k: FlowKey = flow.parse().unwrap();
        let ip = match (k.src_addr(), k.dst_addr()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => Ip::V4 { src: s.octets(), dst: d.octets() },
            (IpAddr::V6(s), IpAddr::V6(d)) => Ip::V6 { src: s.octets(), dst: d.octets() },
            _ => unreachable!(),
        };
        PacketInfo {
            dst_mac: [0; 6],
            src_mac: [0; 6],
            ethertype: 0,
            vlan: None,
            ip: Some(ip),
            l4: l4.then_some(L4Ports { proto: k.proto, sport: k.sport, dport: k.dport }),
            fragment: false,
            malformed: false,
        }
    }

    /// Microsoft "Verifying the RSS Hash Calculation": (source, destination, IP-only
    /// hash, TCP hash). Source comes first in the hash input.
    const MS_VECTORS: [(&str, &str, u32, u32); 8] = [
        ("66.9.149.187:2794", "161.142.100.80:1766", 0x323e8fc2, 0x51ccc178),
        ("199.92.111.2:14230", "65.69.140.83:4739", 0xd718262a, 0xc626b0ea),
        ("24.19.198.95:12898", "12.22.207.184:38024", 0xd2d0a5de, 0x5c2b394a),
        ("38.27.205.30:48228", "209.142.163.6:2217", 0x82989176, 0xafc7327f),
        ("153.39.163.191:44251", "202.188.127.2:1303", 0x5d1809c5, 0x10e828a2),
        ("[3ffe:2501:200:1fff::7]:2794", "[3ffe:2501:200:3::1]:1766", 0x2cc18cd5, 0x40207d3d),
        ("[3ffe:501:8::260:97ff:fe40:efab]:14230", "[ff02::1]:4739", 0x0f0c461c, 0xdde51bbf),
        ("[3ffe:1900:4545:3:200:f8ff:fe21:67cf]:44251", "[fe80::200:f8ff:fe21:67cf]:38024", 0x4b61e985, 0x02d1feef),
    ];

    #[test]
    fn microsoft_verification_vectors() {
        let rss = Rss::new(&MICROSOFT_KEY, HashTypes::ALL, 128, 4).unwrap();
        for (src, dst, ip_only, tcp) in MS_VECTORS {
            let flow = format!("tcp {src} {dst}");
            let d = rss.decide(&info(&flow, true));
            assert_eq!(d.hash.map(|h| h.0), Some(tcp), "TCP hash of {flow}");
            let d = rss.decide(&info(&flow, false));
            assert_eq!(d.hash.map(|h| h.0), Some(ip_only), "IP hash of {flow}");
        }
    }

    #[test]
    fn table_matches_bit_serial_reference() {
        let key: Vec<u8> = (0..52u8).map(|i| i.wrapping_mul(37).wrapping_add(11)).collect();
        let t = Toeplitz::new(&key).unwrap();
        let input: Vec<u8> = (0..36u8).map(|i| i.wrapping_mul(91)).collect();
        for len in [0, 1, 8, 12, 32, 36] {
            assert_eq!(t.hash(&input[..len]), Toeplitz::hash_reference(&key, &input[..len]), "len {len}");
        }
    }

    #[test]
    fn hash_types_select_tuple() {
        let flow = "udp 66.9.149.187:2794 161.142.100.80:1766";
        let all = Rss::new(&MICROSOFT_KEY, HashTypes::ALL, 128, 4).unwrap();
        assert_eq!(all.decide(&info(flow, true)).hash.unwrap().1, HashKind::Udpv4);
        // UDPv4 off: falls back to the 2-tuple.
        let no_udp = Rss::new(&MICROSOFT_KEY, HashTypes(HashTypes::ALL.0 & !HashTypes::UDPV4), 128, 4).unwrap();
        assert_eq!(no_udp.decide(&info(flow, true)).hash, Some((0x323e8fc2, HashKind::Ipv4)));
        // Nothing for IPv4: unclassified queue 0, no slot.
        let v6_only = Rss::new(&MICROSOFT_KEY, HashTypes(HashTypes::IPV6 | HashTypes::TCPV6), 128, 4).unwrap();
        assert_eq!(v6_only.decide(&info(flow, true)), RssDecision { hash: None, slot: None, queue: 0 });
    }

    #[test]
    fn indirection_maps_slot_to_queue() {
        let rss = Rss::new(&MICROSOFT_KEY, HashTypes::ALL, 128, 3).unwrap();
        let d = rss.decide(&info("tcp 66.9.149.187:2794 161.142.100.80:1766", true));
        assert_eq!(d.slot, Some(0x51ccc178 & 127));
        assert_eq!(d.queue, (0x78 % 3) as u16);
    }

    #[test]
    fn spread_over_enabled_queues_only() {
        let mut rss = Rss::new(&MICROSOFT_KEY, HashTypes::ALL, 16, 4).unwrap();
        rss.spread_over(&[true, false, true, false]);
        assert!(rss.indirection().iter().all(|&q| q == 0 || q == 2));
        assert_eq!(rss.indirection().iter().filter(|&&q| q == 2).count(), 8);
        let before = rss.indirection().to_vec();
        rss.spread_over(&[false; 4]);
        assert_eq!(rss.indirection(), &before[..], "a reset keeps the last table");
    }

    #[test]
    fn reconfigured_changes_classification_or_nothing() {
        let rss = Rss::new(&MICROSOFT_KEY, HashTypes::ALL, 8, 4).unwrap();
        let flows: Vec<PacketInfo> =
            (0..64u16).map(|p| info(&format!("udp 10.0.0.2:{} 10.0.0.15:7000", 40000 + p), true)).collect();
        assert!(flows.iter().any(|f| rss.decide(f).queue != 0));
        // `ethtool -X equal 1`: every hashed packet on queue 0.
        let one = rss.reconfigured(None, Some(&[0; 8])).unwrap();
        assert!(flows.iter().all(|f| one.decide(f).queue == 0));
        assert_eq!(one.toeplitz().key(), &MICROSOFT_KEY[..]);
        // A new key changes the hash (and only the key).
        let key: Vec<u8> = (0..40u8).collect();
        let k = rss.reconfigured(Some(&key), None).unwrap();
        assert_eq!((k.toeplitz().key(), k.indirection()), (&key[..], rss.indirection()));
        let f = &flows[0];
        assert_ne!(k.decide(f).hash, rss.decide(f).hash);
        assert_eq!(
            k.decide(f).hash.unwrap().0,
            Toeplitz::hash_reference(&key, &[10, 0, 0, 2, 10, 0, 0, 15, 0x9c, 0x40, 0x1b, 0x58])
        );
        // Bad input: nothing changes.
        assert_eq!(
            rss.reconfigured(Some(&[0; 39]), None).unwrap_err(),
            RssError::KeyLengthMismatch { got: 39, want: 40 }
        );
        assert_eq!(
            rss.reconfigured(Some(&[0; 52]), None).unwrap_err(),
            RssError::KeyLengthMismatch { got: 52, want: 40 }
        );
        assert_eq!(
            rss.reconfigured(None, Some(&[0; 16])).unwrap_err(),
            RssError::IndirSizeMismatch { got: 16, want: 8 }
        );
        assert_eq!(
            rss.reconfigured(Some(&key), Some(&[0, 1, 2, 3, 4, 0, 0, 0])).unwrap_err(),
            RssError::IndirQueue { slot: 4, queue: 4, queues: 4 }
        );
    }

    #[test]
    fn rejects_bad_config() {
        assert_eq!(Rss::new(&[0; 39], HashTypes::ALL, 128, 4).unwrap_err(), RssError::KeyLength(39));
        assert_eq!(Rss::new(&MICROSOFT_KEY, HashTypes::ALL, 100, 4).unwrap_err(), RssError::IndirSize(100));
        let mut r = Rss::new(&MICROSOFT_KEY, HashTypes::ALL, 4, 2).unwrap();
        assert_eq!(
            r.set_indirection(vec![0, 1, 2, 0]).unwrap_err(),
            RssError::IndirQueue { slot: 2, queue: 2, queues: 2 }
        );
    }

    #[test]
    fn four_tuple_shortcut_matches_the_general_input() {
        let rss = Rss::new(&MICROSOFT_KEY, HashTypes::ALL, 128, 4).unwrap();
        let flows = [
            "tcp 66.9.149.187:2794 161.142.100.80:1766",
            "udp 10.0.0.2:40000 10.0.0.15:7000",
            "tcp [3ffe:2501:200:1fff::7]:2794 [3ffe:2501:200:3::1]:1766",
            "udp [3ffe:501:8::260:97ff:fe40:efab]:14230 [ff02::1]:4739",
        ];
        // Every field set of every flow type, with and without sym-xor where allowed.
        for bits in 0..16u32 {
            let set = bits << 4;
            for sym_xor in [false, true] {
                let f = HashFields { tcp4: set, udp4: set, tcp6: set, udp6: set, sym_xor, ..rss.hash_fields() };
                let Ok(r) = rss.with_hash_fields(f) else { continue };
                for flow in flows {
                    for l4 in [true, false] {
                        let i = info(flow, l4);
                        let d = r.decide(&i);
                        assert_eq!(d.hash, r.hash_generic(&i), "{flow} l4={l4} fields={set:#x} sym_xor={sym_xor}");
                        if let Some(h) = r.hash_4tuple(&i) {
                            assert_eq!((set, sym_xor, l4), (HashFields::L4, false, true));
                            assert_eq!(Some(h), r.hash_generic(&i));
                        }
                    }
                }
            }
        }
        let input: Vec<u8> = (0..36u8).map(|i| i.wrapping_mul(91)).collect();
        let a: [u8; 36] = input[..].try_into().unwrap();
        assert_eq!(rss.toeplitz().hash_array(&a), rss.toeplitz().hash(&input));
    }

    #[test]
    fn hash_fields_pick_the_input_and_sym_xor_is_symmetric() {
        let rss = Rss::new(&MICROSOFT_KEY, HashTypes::ALL, 128, 4).unwrap();
        assert_eq!(rss.hash_fields().tcp4, 0xf0);
        assert_eq!(rss.hash_fields().ip6, 0x30);
        let fwd = info("tcp 66.9.149.187:2794 161.142.100.80:1766", true);
        let back = info("tcp 161.142.100.80:1766 66.9.149.187:2794", true);
        // tcp4 on the source address alone: the hash of those 4 bytes.
        let src_only = rss.with_hash_fields(HashFields { tcp4: HashFields::IP_SRC, ..rss.hash_fields() }).unwrap();
        let d = src_only.decide(&fwd);
        assert_eq!(d.hash, Some((rss.toeplitz().hash(&[66, 9, 149, 187]), HashKind::Ipv4)));
        // sdfn without sym-xor differs by direction, with it agrees.
        assert_ne!(rss.decide(&fwd).hash, rss.decide(&back).hash);
        let sym = rss.with_hash_fields(HashFields { sym_xor: true, ..rss.hash_fields() }).unwrap();
        assert_eq!(sym.decide(&fwd).hash, sym.decide(&back).hash);
        assert_eq!(sym.decide(&fwd).hash.map(|h| h.1), Some(HashKind::Tcpv4));
        // What the device refuses.
        let f = rss.hash_fields();
        assert!(rss.with_hash_fields(HashFields { ip4: 0xf0, ..f }).is_err(), "ports for ip4");
        assert!(rss.with_hash_fields(HashFields { udp6: 0x01, ..f }).is_err(), "an unknown bit");
        assert!(rss.with_hash_fields(HashFields { tcp4: 0x10, sym_xor: true, ..f }).is_err(), "sym-xor on src only");
        assert!(rss.with_hash_fields(HashFields { tcp4: 0x70, sym_xor: true, ..f }).is_err(), "one port");
        // Nothing selected: not hashed, queue 0.
        let none = rss.with_hash_fields(HashFields { tcp4: 0, ..f }).unwrap();
        assert_eq!((none.decide(&fwd).hash, none.decide(&fwd).queue), (None, 0));
    }
}
