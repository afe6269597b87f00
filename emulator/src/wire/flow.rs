//! The exact-match flow key of the ntuple table and its text form
//! (`tcp 66.9.149.187:2794 161.142.100.80:1766`, IPv6 in brackets).

use std::fmt;
use std::hash::{Hash, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

/// Layer-4 protocols the filter table and the RSS 4-tuple hashes know.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum L4Proto {
    Tcp,
    Udp,
}

impl L4Proto {
    /// IANA protocol number.
    pub fn number(self) -> u8 {
        match self {
            L4Proto::Tcp => 6,
            L4Proto::Udp => 17,
        }
    }

    pub fn from_number(n: u8) -> Option<Self> {
        match n {
            6 => Some(L4Proto::Tcp),
            17 => Some(L4Proto::Udp),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpVersion {
    V4,
    V6,
}

/// (IP version, L4 protocol, src IP, dst IP, src port, dst port). IPv4 addresses use
/// the first four bytes of the 16-byte arrays; the rest is zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FlowKey {
    pub version: IpVersion,
    pub proto: L4Proto,
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub sport: u16,
    pub dport: u16,
}

/// Three hasher writes per key (the filter table hashes one key per received frame);
/// the derived impl makes eight, with array length prefixes. Every field is written, so
/// equal keys hash equally.
impl Hash for FlowKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write_u128(u128::from_ne_bytes(self.src));
        h.write_u128(u128::from_ne_bytes(self.dst));
        let (v, p) = (self.version as u64, self.proto as u64);
        h.write_u64(u64::from(self.sport) | u64::from(self.dport) << 16 | v << 32 | p << 40);
    }
}

impl FlowKey {
    #[inline]
    pub fn v4(proto: L4Proto, src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> Self {
        // The 16-byte arrays are made whole in a register (the address in the first four
        // bytes in memory order, zeros after), not by a 4-byte store into a zeroed array:
        // the key's hash reads them back 16 bytes at a time right away, and a wide load
        // over a narrower pending store stalls the pipeline (the classify path, once a
        // frame).
        let widen = |a: [u8; 4]| (u128::from(u32::from_le_bytes(a))).to_le_bytes();
        FlowKey { version: IpVersion::V4, proto, src: widen(src), dst: widen(dst), sport, dport }
    }

    pub fn v6(proto: L4Proto, src: [u8; 16], sport: u16, dst: [u8; 16], dport: u16) -> Self {
        FlowKey { version: IpVersion::V6, proto, src, dst, sport, dport }
    }

    pub fn from_sockets(proto: L4Proto, src: SocketAddr, dst: SocketAddr) -> Result<Self, FlowSpecError> {
        match (src.ip(), dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => Ok(Self::v4(proto, s.octets(), src.port(), d.octets(), dst.port())),
            (IpAddr::V6(s), IpAddr::V6(d)) => Ok(Self::v6(proto, s.octets(), src.port(), d.octets(), dst.port())),
            _ => Err(FlowSpecError::MixedFamilies),
        }
    }

    pub fn src_addr(&self) -> IpAddr {
        addr(self.version, &self.src)
    }

    pub fn dst_addr(&self) -> IpAddr {
        addr(self.version, &self.dst)
    }

    /// The same flow seen from the other end.
    pub fn reversed(&self) -> Self {
        FlowKey { src: self.dst, dst: self.src, sport: self.dport, dport: self.sport, ..*self }
    }
}

fn addr(v: IpVersion, b: &[u8; 16]) -> IpAddr {
    match v {
        IpVersion::V4 => IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3])),
        IpVersion::V6 => IpAddr::V6(Ipv6Addr::from(*b)),
    }
}

impl fmt::Display for FlowKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = match self.proto {
            L4Proto::Tcp => "tcp",
            L4Proto::Udp => "udp",
        };
        let s = SocketAddr::new(self.src_addr(), self.sport);
        let d = SocketAddr::new(self.dst_addr(), self.dport);
        write!(f, "{p} {s} {d}")
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FlowSpecError {
    #[error("expected \"PROTO SRC:PORT DST:PORT\" (PROTO tcp or udp, IPv6 as [addr]:port), got {0:?}")]
    Shape(String),
    #[error("unknown protocol {0:?}: expected tcp or udp")]
    Proto(String),
    #[error("bad address {0:?}: expected IPv4 a.b.c.d:port or IPv6 [addr]:port")]
    Addr(String),
    #[error("source and destination must both be IPv4 or both IPv6")]
    MixedFamilies,
}

impl FromStr for FlowKey {
    type Err = FlowSpecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = s.split_whitespace().collect();
        if parts.len() != 3 {
            return Err(FlowSpecError::Shape(s.to_string()));
        }
        let proto = match parts[0].to_ascii_lowercase().as_str() {
            "tcp" => L4Proto::Tcp,
            "udp" => L4Proto::Udp,
            other => return Err(FlowSpecError::Proto(other.to_string())),
        };
        let src: SocketAddr = parts[1].parse().map_err(|_| FlowSpecError::Addr(parts[1].to_string()))?;
        let dst: SocketAddr = parts[2].parse().map_err(|_| FlowSpecError::Addr(parts[2].to_string()))?;
        FlowKey::from_sockets(proto, src, dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_v4_and_v6() {
        let k: FlowKey = "tcp 66.9.149.187:2794 161.142.100.80:1766".parse().unwrap();
        assert_eq!(k.version, IpVersion::V4);
        assert_eq!(k.sport, 2794);
        assert_eq!(&k.dst[..4], &[161, 142, 100, 80]);
        assert_eq!(k.to_string(), "tcp 66.9.149.187:2794 161.142.100.80:1766");
        let k6: FlowKey = "udp [3ffe:2501:200:3::1]:2794 [3ffe:2501:200:1fff::7]:1766".parse().unwrap();
        assert_eq!(k6.version, IpVersion::V6);
        assert_eq!(k6.proto, L4Proto::Udp);
        assert_eq!(k6.to_string(), "udp [3ffe:2501:200:3::1]:2794 [3ffe:2501:200:1fff::7]:1766");
    }

    #[test]
    fn rejects_bad_specs_precisely() {
        assert!(matches!("sctp 1.1.1.1:1 2.2.2.2:2".parse::<FlowKey>(), Err(FlowSpecError::Proto(_))));
        assert!(matches!("tcp 1.1.1.1 2.2.2.2:2".parse::<FlowKey>(), Err(FlowSpecError::Addr(_))));
        assert!(matches!("tcp 1.1.1.1:1".parse::<FlowKey>(), Err(FlowSpecError::Shape(_))));
        assert_eq!("tcp 1.1.1.1:1 [::1]:2".parse::<FlowKey>(), Err(FlowSpecError::MixedFamilies));
    }
}
