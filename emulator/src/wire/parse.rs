//! Frame parsing for classification. Frames are hostile input: every path returns a
//! value or an error, never panics, never allocates.
//!
//! Rules (what RSS and the ntuple table get):
//! - Ethernet II with at most one 802.1Q/802.1ad tag (a second tag is not looked into).
//! - IPv4 with options; a fragment with a non-zero offset has no L4 fields. A first
//!   fragment (offset 0, MF set) keeps its ports when they are inside the frame.
//! - IPv6 with the extension headers `etherparse` knows (hop-by-hop, routing, fragment,
//!   destination options, AH). An unknown extension header before L4 leaves only the
//!   2-tuple (addresses) for hashing.
//! - TCP and UDP ports; anything else is L3-only.
//!
//! Two paths give the same answer for every input. [`parse_frame_fast`] reads only the
//! bytes those rules need, in place, for the common case: Ethernet II, at most one
//! 802.1Q/802.1ad tag, non-IP payloads, IPv4 (options allowed) that is not a fragment
//! and carries no AH, IPv6 whose next header is not an extension header `etherparse`
//! knows (0, 43, 44, 51, 60), and TCP/UDP headers that validate. Everything else —
//! frames shorter than an Ethernet header, fragments, IPv6 extension headers, IPv4 AH,
//! any length or version that does not check out — is left to [`parse_frame_slow`]
//! (`etherparse`), which also decides what counts as malformed. `tests/parse_props.rs`
//! cross-checks the two on structured and random frames.

use super::flow::{FlowKey, IpVersion, L4Proto};
use etherparse::{
    EtherType, Ethernet2Slice, IpNumber, Ipv4Slice, Ipv6ExtensionSlice, Ipv6Slice, SingleVlanSlice, TcpSlice, UdpSlice,
};

/// EtherType of arfsnic's in-band control frames (IEEE 802 local experimental 1).
pub const CONTROL_ETHERTYPE: u16 = 0x88B5;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ip {
    V4 { src: [u8; 4], dst: [u8; 4] },
    V6 { src: [u8; 16], dst: [u8; 16] },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct L4Ports {
    pub proto: L4Proto,
    pub sport: u16,
    pub dport: u16,
}

/// What classification needs from one frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketInfo {
    pub dst_mac: [u8; 6],
    pub src_mac: [u8; 6],
    /// EtherType after the VLAN tag, if any.
    pub ethertype: u16,
    pub vlan: Option<u16>,
    pub ip: Option<Ip>,
    /// Present only when the ports may be used (not a later fragment, no unknown
    /// extension header in the way).
    pub l4: Option<L4Ports>,
    pub fragment: bool,
    /// The EtherType promised IP but the IP (or L4) header did not validate.
    pub malformed: bool,
}

impl PacketInfo {
    /// The exact-match key of the ntuple table, for TCP/UDP packets with ports.
    pub fn flow_key(&self) -> Option<FlowKey> {
        let l4 = self.l4?;
        Some(match self.ip? {
            Ip::V4 { src, dst } => FlowKey::v4(l4.proto, src, l4.sport, dst, l4.dport),
            Ip::V6 { src, dst } => FlowKey::v6(l4.proto, src, l4.sport, dst, l4.dport),
        })
    }

    pub fn ip_version(&self) -> Option<IpVersion> {
        match self.ip? {
            Ip::V4 { .. } => Some(IpVersion::V4),
            Ip::V6 { .. } => Some(IpVersion::V6),
        }
    }

    pub fn is_control(&self) -> bool {
        self.ethertype == CONTROL_ETHERTYPE
    }

    /// The packet a flow key describes (for asking the NIC where a flow goes).
    pub fn from_flow(key: &FlowKey) -> PacketInfo {
        let (ethertype, ip) = match key.version {
            IpVersion::V4 => {
                let (mut s, mut d) = ([0u8; 4], [0u8; 4]);
                s.copy_from_slice(&key.src[..4]);
                d.copy_from_slice(&key.dst[..4]);
                (0x0800, Ip::V4 { src: s, dst: d })
            }
            IpVersion::V6 => (0x86dd, Ip::V6 { src: key.src, dst: key.dst }),
        };
        PacketInfo {
            dst_mac: [0; 6],
            src_mac: [0; 6],
            ethertype,
            vlan: None,
            ip: Some(ip),
            l4: Some(L4Ports { proto: key.proto, sport: key.sport, dport: key.dport }),
            fragment: false,
            malformed: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("frame of {0} bytes is shorter than an Ethernet header")]
    TooShort(usize),
}

/// Parse one Ethernet frame (without FCS): the fast path when it applies, `etherparse`
/// otherwise.
#[inline]
pub fn parse_frame(frame: &[u8]) -> Result<PacketInfo, ParseError> {
    match parse_frame_fast(frame) {
        Some(info) => Ok(info),
        None => parse_frame_slow(frame),
    }
}

/// The flow key of a frame the fast path takes that carries TCP/UDP ports — what
/// `parse_frame(frame)?.flow_key()` gives — without handing a [`PacketInfo`] back;
/// `None` for every other frame (the caller parses it in full). The classifier's common
/// case: the key is all the filter table and the RSS 4-tuple hash need.
#[inline]
pub fn flow_key_fast(frame: &[u8]) -> Option<FlowKey> {
    parse_frame_fast(frame)?.flow_key()
}

/// EtherTypes and IP protocol numbers the fast path looks at.
const ET_IPV4: u16 = 0x0800;
const ET_IPV6: u16 = 0x86dd;
const ET_VLAN: u16 = 0x8100;
const ET_QINQ: u16 = 0x88a8;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
const PROTO_AH: u8 = 51;

/// The common-case parser: what [`parse_frame`] returns for `frame`, or `None` when the
/// frame is not on the fast path (see the module documentation) and `etherparse` must
/// decide. Never a different answer than [`parse_frame_slow`] where it answers.
#[doc(hidden)]
#[inline]
pub fn parse_frame_fast(frame: &[u8]) -> Option<PacketInfo> {
    let (eth, rest) = frame.split_first_chunk::<14>()?;
    let mut info = PacketInfo {
        dst_mac: [eth[0], eth[1], eth[2], eth[3], eth[4], eth[5]],
        src_mac: [eth[6], eth[7], eth[8], eth[9], eth[10], eth[11]],
        ethertype: u16::from_be_bytes([eth[12], eth[13]]),
        vlan: None,
        ip: None,
        l4: None,
        fragment: false,
        malformed: false,
    };
    let mut l3 = rest;
    if info.ethertype == ET_VLAN || info.ethertype == ET_QINQ {
        // A frame too short for the tag is malformed: etherparse says so.
        let (tag, after) = rest.split_first_chunk::<4>()?;
        info.vlan = Some(u16::from_be_bytes([tag[0] & 0x0f, tag[1]]));
        info.ethertype = u16::from_be_bytes([tag[2], tag[3]]);
        l3 = after;
    }
    match info.ethertype {
        ET_IPV4 => {
            let (ip, l4) = fast_v4(l3)?;
            info.ip = Some(ip);
            info.l4 = l4;
        }
        ET_IPV6 => {
            let (ip, l4) = fast_v6(l3)?;
            info.ip = Some(ip);
            info.l4 = l4;
        }
        _ => {}
    }
    Some(info)
}

/// An IPv4 packet that is complete (`total length` inside the slice, header inside the
/// total length), not a fragment and without AH: its addresses and ports.
#[inline]
fn fast_v4(d: &[u8]) -> Option<(Ip, Option<L4Ports>)> {
    let h = d.first_chunk::<20>()?;
    if h[0] >> 4 != 4 {
        return None;
    }
    let header_len = usize::from(h[0] & 0x0f) * 4;
    let total_len = usize::from(u16::from_be_bytes([h[2], h[3]]));
    if header_len < 20 || total_len < header_len {
        return None;
    }
    // More fragments or a fragment offset: a fragment.
    if u16::from_be_bytes([h[6], h[7]]) & 0x3fff != 0 || h[9] == PROTO_AH {
        return None;
    }
    let payload = d.get(header_len..total_len)?;
    let ip = Ip::V4 { src: [h[12], h[13], h[14], h[15]], dst: [h[16], h[17], h[18], h[19]] };
    Some((ip, fast_l4(h[9], payload)?))
}

/// An IPv6 packet whose payload is inside the slice and whose next header is not an
/// extension header: its addresses and ports.
#[inline]
fn fast_v6(d: &[u8]) -> Option<(Ip, Option<L4Ports>)> {
    let (h, rest) = d.split_first_chunk::<40>()?;
    if h[0] >> 4 != 6 {
        return None;
    }
    let next = h[6];
    // Hop-by-hop, routing, fragment, AH, destination options: etherparse walks them.
    if matches!(next, 0 | 43 | 44 | 51 | 60) {
        return None;
    }
    let payload_len = usize::from(u16::from_be_bytes([h[4], h[5]]));
    // Payload length 0 with bytes after the header: a jumbogram, the rest of the frame
    // (as etherparse reads it).
    let payload = if payload_len == 0 { rest } else { rest.get(..payload_len)? };
    let mut src = [0u8; 16];
    let mut dst = [0u8; 16];
    src.copy_from_slice(&h[8..24]);
    dst.copy_from_slice(&h[24..40]);
    Some((Ip::V6 { src, dst }, fast_l4(next, payload)?))
}

/// Ports of a complete (not fragmented) TCP/UDP datagram whose header validates; `None`
/// when it does not (etherparse decides, it is malformed), `Some(None)` for other
/// protocols.
#[inline]
fn fast_l4(proto: u8, payload: &[u8]) -> Option<Option<L4Ports>> {
    let proto = match proto {
        PROTO_TCP => {
            let t = payload.first_chunk::<20>()?;
            let header_len = usize::from(t[12] >> 4) * 4;
            if header_len < 20 || payload.len() < header_len {
                return None;
            }
            L4Proto::Tcp
        }
        // UDP is read laxly (the length field is not checked), as etherparse does here.
        PROTO_UDP if payload.len() >= 8 => L4Proto::Udp,
        PROTO_UDP => return None,
        _ => return Some(None),
    };
    let p = payload.first_chunk::<4>()?;
    Some(Some(L4Ports { proto, sport: u16::from_be_bytes([p[0], p[1]]), dport: u16::from_be_bytes([p[2], p[3]]) }))
}

/// The `etherparse` path of [`parse_frame`]: every frame the fast path leaves, and the
/// reference the property tests hold the fast path to.
#[doc(hidden)]
pub fn parse_frame_slow(frame: &[u8]) -> Result<PacketInfo, ParseError> {
    let eth = Ethernet2Slice::from_slice_without_fcs(frame).map_err(|_| ParseError::TooShort(frame.len()))?;
    let mut info = PacketInfo {
        dst_mac: eth.destination(),
        src_mac: eth.source(),
        ethertype: eth.ether_type().0,
        vlan: None,
        ip: None,
        l4: None,
        fragment: false,
        malformed: false,
    };
    let mut payload = eth.payload_slice();
    let et = eth.ether_type();
    if et == EtherType::VLAN_TAGGED_FRAME || et == EtherType::PROVIDER_BRIDGING {
        match SingleVlanSlice::from_slice(payload) {
            Ok(v) => {
                info.vlan = Some(v.vlan_identifier().value());
                info.ethertype = v.ether_type().0;
                payload = v.payload().payload;
            }
            Err(_) => {
                info.malformed = true;
                return Ok(info);
            }
        }
    }
    match EtherType(info.ethertype) {
        EtherType::IPV4 => parse_v4(payload, &mut info),
        EtherType::IPV6 => parse_v6(payload, &mut info),
        _ => {}
    }
    Ok(info)
}

fn parse_v4(data: &[u8], info: &mut PacketInfo) {
    let Ok(ip) = Ipv4Slice::from_slice(data) else {
        info.malformed = true;
        return;
    };
    let h = ip.header();
    info.ip = Some(Ip::V4 { src: h.source(), dst: h.destination() });
    let pl = ip.payload();
    if pl.fragmented {
        info.fragment = true;
        if h.fragments_offset().value() != 0 {
            return;
        }
    }
    info.l4 = ports(pl.ip_number, pl.payload, pl.fragmented, info);
}

fn parse_v6(data: &[u8], info: &mut PacketInfo) {
    let Ok(ip) = Ipv6Slice::from_slice(data) else {
        info.malformed = true;
        return;
    };
    let h = ip.header();
    info.ip = Some(Ip::V6 { src: h.source(), dst: h.destination() });
    let pl = ip.payload();
    if pl.fragmented {
        info.fragment = true;
        let later = ip.extensions().clone().into_iter().any(|e| match e {
            Ipv6ExtensionSlice::Fragment(f) => f.fragment_offset().value() != 0,
            _ => false,
        });
        if later {
            return;
        }
    }
    info.l4 = ports(pl.ip_number, pl.payload, pl.fragmented, info);
}

/// Ports of a TCP/UDP payload. A complete datagram must carry a valid header; a first
/// fragment only needs the four port bytes.
fn ports(num: IpNumber, payload: &[u8], first_fragment: bool, info: &mut PacketInfo) -> Option<L4Ports> {
    let proto = match num {
        IpNumber::TCP => L4Proto::Tcp,
        IpNumber::UDP => L4Proto::Udp,
        _ => return None,
    };
    if first_fragment {
        let p = payload.get(..4)?;
        return Some(L4Ports {
            proto,
            sport: u16::from_be_bytes([p[0], p[1]]),
            dport: u16::from_be_bytes([p[2], p[3]]),
        });
    }
    let (sport, dport) = match proto {
        L4Proto::Tcp => match TcpSlice::from_slice(payload) {
            Ok(t) => (t.source_port(), t.destination_port()),
            Err(_) => {
                info.malformed = true;
                return None;
            }
        },
        L4Proto::Udp => match UdpSlice::from_slice_lax(payload) {
            Ok(u) => (u.source_port(), u.destination_port()),
            Err(_) => {
                info.malformed = true;
                return None;
            }
        },
    };
    Some(L4Ports { proto, sport, dport })
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::PacketBuilder;

    const SMAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const DMAC: [u8; 6] = [2, 0, 0, 0, 0, 2];

    fn udp4(payload: &[u8]) -> Vec<u8> {
        let b = PacketBuilder::ethernet2(SMAC, DMAC).ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64).udp(1000, 2000);
        let mut v = Vec::new();
        b.write(&mut v, payload).unwrap();
        v
    }

    #[test]
    fn udp_v4_ports_and_macs() {
        let i = parse_frame(&udp4(b"hello")).unwrap();
        assert_eq!(i.src_mac, SMAC);
        assert_eq!(i.ip, Some(Ip::V4 { src: [10, 0, 0, 1], dst: [10, 0, 0, 2] }));
        assert_eq!(i.l4, Some(L4Ports { proto: L4Proto::Udp, sport: 1000, dport: 2000 }));
        assert!(!i.malformed && !i.fragment);
    }

    #[test]
    fn vlan_tag_is_skipped() {
        let b = PacketBuilder::ethernet2(SMAC, DMAC)
            .single_vlan(etherparse::VlanId::try_new(42).unwrap())
            .ipv4([1, 2, 3, 4], [5, 6, 7, 8], 64)
            .tcp(80, 443, 1, 1000);
        let mut v = Vec::new();
        b.write(&mut v, b"x").unwrap();
        let i = parse_frame(&v).unwrap();
        assert_eq!(i.vlan, Some(42));
        assert_eq!(i.ethertype, 0x0800);
        assert_eq!(i.l4, Some(L4Ports { proto: L4Proto::Tcp, sport: 80, dport: 443 }));
    }

    fn set_frag(v: &mut [u8], offset8: u16, mf: bool) {
        // IPv4 header starts at 14; flags+offset at bytes 6..8; recompute checksum.
        let fo = (offset8 & 0x1fff) | if mf { 0x2000 } else { 0 };
        v[14 + 6..14 + 8].copy_from_slice(&fo.to_be_bytes());
        v[14 + 10] = 0;
        v[14 + 11] = 0;
        let mut sum = 0u32;
        for c in v[14..34].chunks(2) {
            sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        v[14 + 10..14 + 12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    }

    #[test]
    fn later_fragments_have_no_ports_first_fragment_does() {
        let mut first = udp4(&[0u8; 64]);
        set_frag(&mut first, 0, true);
        let i = parse_frame(&first).unwrap();
        assert!(i.fragment);
        assert_eq!(i.l4.map(|l| l.sport), Some(1000));

        let mut later = udp4(&[0u8; 64]);
        set_frag(&mut later, 8, false);
        let i = parse_frame(&later).unwrap();
        assert!(i.fragment);
        assert!(i.ip.is_some());
        assert_eq!(i.l4, None);
    }

    #[test]
    fn ipv4_options_are_accepted() {
        // Build a TCP packet with a 4-byte IPv4 option (NOP NOP NOP EOL).
        let b = PacketBuilder::ethernet2(SMAC, DMAC)
            .ip(etherparse::IpHeaders::Ipv4(
                {
                    let mut h = etherparse::Ipv4Header::new(0, 64, IpNumber::TCP, [1, 1, 1, 1], [2, 2, 2, 2]).unwrap();
                    h.options = etherparse::Ipv4Options::try_from(&[1u8, 1, 1, 0][..]).unwrap();
                    h
                },
                Default::default(),
            ))
            .tcp(7, 9, 1, 100);
        let mut v = Vec::new();
        b.write(&mut v, b"").unwrap();
        let i = parse_frame(&v).unwrap();
        assert_eq!(i.l4.map(|l| (l.sport, l.dport)), Some((7, 9)));
    }

    #[test]
    fn ipv6_unknown_extension_leaves_two_tuple() {
        // IPv6 header with next header 253 (experimental), then 8 bytes, then UDP.
        let mut v = Vec::new();
        v.extend_from_slice(&DMAC);
        v.extend_from_slice(&SMAC);
        v.extend_from_slice(&0x86ddu16.to_be_bytes());
        let payload_len: u16 = 8 + 8;
        v.extend_from_slice(&[0x60, 0, 0, 0]);
        v.extend_from_slice(&payload_len.to_be_bytes());
        v.push(253);
        v.push(64);
        v.extend_from_slice(&[0x20; 16]);
        v.extend_from_slice(&[0x30; 16]);
        v.extend_from_slice(&[17, 0, 0, 0, 0, 0, 0, 0]);
        v.extend_from_slice(&[0, 1, 0, 2, 0, 8, 0, 0]);
        let i = parse_frame(&v).unwrap();
        assert_eq!(i.ip, Some(Ip::V6 { src: [0x20; 16], dst: [0x30; 16] }));
        assert_eq!(i.l4, None);
        assert!(!i.malformed);
    }

    #[test]
    fn ipv6_known_extension_keeps_ports() {
        let b = PacketBuilder::ethernet2(SMAC, DMAC).ipv6([1; 16], [2; 16], 64).udp(5, 6);
        let mut v = Vec::new();
        b.write(&mut v, b"abc").unwrap();
        let i = parse_frame(&v).unwrap();
        assert_eq!(i.l4, Some(L4Ports { proto: L4Proto::Udp, sport: 5, dport: 6 }));
    }

    #[test]
    fn garbage_never_panics() {
        assert!(parse_frame(&[0u8; 5]).is_err());
        let mut v = udp4(b"x");
        v.truncate(20);
        let i = parse_frame(&v).unwrap();
        assert!(i.malformed && i.ip.is_none());
        for len in 0..80 {
            let _ = parse_frame(&vec![0x45; len]);
        }
    }
}
