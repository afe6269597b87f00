//! Property tests of the frame parser's fast path (`wire::parse::parse_frame_fast`): on
//! every input it either declines (`None`, etherparse decides) or returns exactly what the
//! etherparse path (`parse_frame_slow`) returns, and `parse_frame` always equals the
//! etherparse path, and `flow_key_fast` gives the key of exactly those frames. Inputs: structured Ethernet/VLAN/IPv4/IPv6/TCP/UDP frames with their
//! fields corrupted at will (version, IHL, total length, payload length, fragment fields,
//! next header, extension headers, TCP data offset, UDP length), each truncated at every
//! length and with random bytes overwritten, and plain random bytes.

use arfsnic::wire::parse::{flow_key_fast, parse_frame, parse_frame_fast, parse_frame_slow};
use arfsnic::wire::{Ip, L4Ports, L4Proto};
use proptest::prelude::*;

/// Fast path and etherparse path agree on `frame`; returns whether the fast path answered.
fn agree(frame: &[u8]) -> Result<bool, TestCaseError> {
    let slow = parse_frame_slow(frame);
    let fast = parse_frame_fast(frame);
    if let Some(f) = fast {
        prop_assert_eq!(Ok(f), slow, "fast path differs from etherparse on {:02x?}", frame);
    }
    prop_assert_eq!(parse_frame(frame), slow, "parse_frame differs from etherparse on {:02x?}", frame);
    // The classifier's key-only fast path: the fast path's key, and etherparse's.
    let key = flow_key_fast(frame);
    prop_assert_eq!(key, fast.and_then(|f| f.flow_key()), "flow_key_fast on {:02x?}", frame);
    if key.is_some() {
        prop_assert_eq!(key, slow.ok().and_then(|i| i.flow_key()), "flow_key_fast vs etherparse on {:02x?}", frame);
    }
    Ok(fast.is_some())
}

#[derive(Clone, Debug)]
enum L4 {
    Tcp { sport: u16, dport: u16, options: Vec<u8>, data_offset: Option<u8> },
    Udp { sport: u16, dport: u16, length: Option<u16> },
    Raw { proto: u8 },
}

impl L4 {
    fn proto(&self) -> u8 {
        match self {
            L4::Tcp { .. } => 6,
            L4::Udp { .. } => 17,
            L4::Raw { proto } => *proto,
        }
    }

    fn write(&self, payload: &[u8], v: &mut Vec<u8>) {
        match self {
            L4::Tcp { sport, dport, options, data_offset } => {
                v.extend_from_slice(&sport.to_be_bytes());
                v.extend_from_slice(&dport.to_be_bytes());
                v.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0]);
                let doff = data_offset.unwrap_or(5 + (options.len() / 4) as u8);
                v.extend_from_slice(&[doff << 4, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
                v.extend_from_slice(options);
            }
            L4::Udp { sport, dport, length } => {
                v.extend_from_slice(&sport.to_be_bytes());
                v.extend_from_slice(&dport.to_be_bytes());
                v.extend_from_slice(&length.unwrap_or(8 + payload.len() as u16).to_be_bytes());
                v.extend_from_slice(&[0, 0]);
            }
            L4::Raw { .. } => {}
        }
        v.extend_from_slice(payload);
    }
}

#[derive(Clone, Debug)]
struct V4 {
    src: [u8; 4],
    dst: [u8; 4],
    options: Vec<u8>,
    version: Option<u8>,
    ihl: Option<u8>,
    total_len: Option<u16>,
    /// Flags + fragment offset field.
    frag: u16,
    /// AH between the header and L4.
    ah: Option<u8>,
}

/// One IPv6 extension header: (next-header value that announces it, its bytes after the
/// next-header byte are built by `write_ext`).
#[derive(Clone, Debug)]
enum Ext {
    /// Hop-by-hop (0), routing (43), destination options (60): 8 * (1 + units) bytes.
    Raw { kind: u8, units: u8 },
    /// Fragment (44): offset in 8-byte units and the M flag.
    Frag { offset: u16, more: bool },
    /// AH (51): (units + 2) * 4 bytes.
    Ah { units: u8 },
}

impl Ext {
    fn kind(&self) -> u8 {
        match self {
            Ext::Raw { kind, .. } => *kind,
            Ext::Frag { .. } => 44,
            Ext::Ah { .. } => 51,
        }
    }

    fn write(&self, next: u8, v: &mut Vec<u8>) {
        match self {
            Ext::Raw { units, .. } => {
                v.extend_from_slice(&[next, *units]);
                v.extend(std::iter::repeat_n(1u8, 6 + 8 * usize::from(*units)));
            }
            Ext::Frag { offset, more } => {
                let fo = (offset << 3) | u16::from(*more);
                v.extend_from_slice(&[next, 0]);
                v.extend_from_slice(&fo.to_be_bytes());
                v.extend_from_slice(&[0, 0, 0x12, 0x34]);
            }
            Ext::Ah { units } => write_ah(next, *units, v),
        }
    }
}

fn write_ah(next: u8, units: u8, v: &mut Vec<u8>) {
    v.extend_from_slice(&[next, units, 0, 0]);
    v.extend(std::iter::repeat_n(0xa5u8, (usize::from(units) + 2) * 4 - 4));
}

#[derive(Clone, Debug)]
struct V6 {
    src: [u8; 16],
    dst: [u8; 16],
    exts: Vec<Ext>,
    version: Option<u8>,
    payload_len: Option<u16>,
    /// Replace the first next header (IPv6 header's) with this value.
    next_header: Option<u8>,
}

#[derive(Clone, Debug)]
enum L3 {
    V4(V4, L4),
    V6(V6, L4),
    Other(u16),
}

#[derive(Clone, Debug)]
struct Frame {
    vlan: Option<(u16, u16)>,
    l3: L3,
    payload: Vec<u8>,
    /// Bytes after the IP packet (Ethernet padding).
    trailer: Vec<u8>,
}

impl Frame {
    fn bytes(&self) -> Vec<u8> {
        let mut v = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
        let et = match self.l3 {
            L3::V4(..) => 0x0800,
            L3::V6(..) => 0x86dd,
            L3::Other(et) => et,
        };
        if let Some((tpid, tci)) = self.vlan {
            v.extend_from_slice(&tpid.to_be_bytes());
            v.extend_from_slice(&tci.to_be_bytes());
        }
        v.extend_from_slice(&et.to_be_bytes());
        match &self.l3 {
            L3::V4(ip, l4) => {
                let mut body = Vec::new();
                if let Some(units) = ip.ah {
                    write_ah(l4.proto(), units, &mut body);
                }
                l4.write(&self.payload, &mut body);
                let ihl = ip.ihl.unwrap_or(5 + (ip.options.len() / 4) as u8);
                let total = ip.total_len.unwrap_or((20 + ip.options.len() + body.len()) as u16);
                let proto = if ip.ah.is_some() { 51 } else { l4.proto() };
                v.push((ip.version.unwrap_or(4) << 4) | (ihl & 0x0f));
                v.push(0);
                v.extend_from_slice(&total.to_be_bytes());
                v.extend_from_slice(&[0x12, 0x34]);
                v.extend_from_slice(&ip.frag.to_be_bytes());
                v.extend_from_slice(&[64, proto, 0, 0]);
                v.extend_from_slice(&ip.src);
                v.extend_from_slice(&ip.dst);
                v.extend_from_slice(&ip.options);
                v.extend_from_slice(&body);
            }
            L3::V6(ip, l4) => {
                let mut body = Vec::new();
                for (i, e) in ip.exts.iter().enumerate() {
                    let next = ip.exts.get(i + 1).map_or(l4.proto(), Ext::kind);
                    e.write(next, &mut body);
                }
                l4.write(&self.payload, &mut body);
                let first = ip.exts.first().map_or(l4.proto(), Ext::kind);
                v.extend_from_slice(&[ip.version.unwrap_or(6) << 4, 0, 0, 0]);
                v.extend_from_slice(&ip.payload_len.unwrap_or(body.len() as u16).to_be_bytes());
                v.extend_from_slice(&[ip.next_header.unwrap_or(first), 64]);
                v.extend_from_slice(&ip.src);
                v.extend_from_slice(&ip.dst);
                v.extend_from_slice(&body);
            }
            L3::Other(_) => v.extend_from_slice(&self.payload),
        }
        v.extend_from_slice(&self.trailer);
        v
    }

    /// A frame the fast path must take: nothing corrupted, no fragment, no extension.
    fn clean(&self) -> bool {
        let l4_ok = |l4: &L4| match l4 {
            L4::Tcp { data_offset, .. } => data_offset.is_none(),
            L4::Udp { length, .. } => length.is_none(),
            // Raw bytes under TCP's or UDP's number are a header only by chance (the
            // generator's Tcp/Udp cases build real ones): not a clean frame.
            L4::Raw { proto } => ![0, 6, 17, 43, 44, 51, 60].contains(proto),
        };
        match &self.l3 {
            L3::V4(ip, l4) => {
                ip.version.is_none()
                    && ip.ihl.is_none()
                    && ip.total_len.is_none()
                    && ip.frag & 0x3fff == 0
                    && ip.ah.is_none()
                    && l4_ok(l4)
            }
            L3::V6(ip, l4) => {
                ip.version.is_none()
                    && ip.exts.is_empty()
                    && ip.payload_len.is_none()
                    && ip.next_header.is_none()
                    && l4_ok(l4)
            }
            // A VLAN EtherType without our tag: what follows is read as one.
            L3::Other(et) => self.vlan.is_some() || !(*et == 0x8100 || *et == 0x88a8),
        }
    }
}

/// Mostly absent, sometimes any value: a field left correct or corrupted.
fn sometimes<T: std::fmt::Debug + Clone + 'static>(s: impl Strategy<Value = T> + 'static) -> BoxedStrategy<Option<T>> {
    prop_oneof![4 => Just(None), 1 => s.prop_map(Some)].boxed()
}

fn l4() -> impl Strategy<Value = L4> {
    prop_oneof![
        4 => (any::<u16>(), any::<u16>(), (0usize..=10).prop_map(|n| vec![1u8; n * 4]), sometimes(0u8..16))
            .prop_map(|(sport, dport, options, data_offset)| L4::Tcp { sport, dport, options, data_offset }),
        4 => (any::<u16>(), any::<u16>(), sometimes(any::<u16>()))
            .prop_map(|(sport, dport, length)| L4::Udp { sport, dport, length }),
        1 => prop_oneof![Just(1u8), Just(58), Just(59), Just(132), any::<u8>()].prop_map(|proto| L4::Raw { proto }),
    ]
}

fn frag() -> impl Strategy<Value = u16> {
    prop_oneof![
        6 => Just(0u16),
        2 => Just(0x4000u16),              // DF
        1 => Just(0x2000u16),              // MF, offset 0: first fragment
        1 => (1u16..0x2000).prop_map(|o| o | 0x2000),
        1 => 1u16..0x2000,                 // last fragment
        1 => any::<u16>(),
    ]
}

fn ext() -> impl Strategy<Value = Ext> {
    prop_oneof![
        (prop_oneof![Just(0u8), Just(43), Just(60)], 0u8..3).prop_map(|(kind, units)| Ext::Raw { kind, units }),
        (prop_oneof![Just(0u16), 1u16..0x2000], any::<bool>()).prop_map(|(offset, more)| Ext::Frag { offset, more }),
        (0u8..4).prop_map(|units| Ext::Ah { units }),
    ]
}

fn v4() -> impl Strategy<Value = V4> {
    (
        any::<[u8; 4]>(),
        any::<[u8; 4]>(),
        (0usize..=10).prop_map(|n| vec![1u8; n * 4]),
        sometimes(0u8..16),
        sometimes(0u8..16),
        sometimes(any::<u16>()),
        frag(),
        prop_oneof![6 => Just(None), 1 => (0u8..4).prop_map(Some)],
    )
        .prop_map(|(src, dst, options, version, ihl, total_len, frag, ah)| V4 {
            src,
            dst,
            options,
            version,
            ihl,
            total_len,
            frag,
            ah,
        })
}

fn v6() -> impl Strategy<Value = V6> {
    (
        any::<[u8; 16]>(),
        any::<[u8; 16]>(),
        prop_oneof![3 => Just(vec![]), 1 => prop::collection::vec(ext(), 1..4)],
        sometimes(0u8..16),
        prop_oneof![4 => Just(None), 1 => Just(Some(0u16)), 1 => any::<u16>().prop_map(Some)],
        sometimes(prop_oneof![Just(0u8), Just(43), Just(44), Just(51), Just(60), Just(253), any::<u8>()]),
    )
        .prop_map(|(src, dst, exts, version, payload_len, next_header)| V6 {
            src,
            dst,
            exts,
            version,
            payload_len,
            next_header,
        })
}

fn frame() -> impl Strategy<Value = Frame> {
    let vlan = prop_oneof![
        3 => Just(None),
        1 => (prop_oneof![Just(0x8100u16), Just(0x88a8)], any::<u16>()).prop_map(Some),
        1 => (prop_oneof![Just(0x9100u16), any::<u16>()], any::<u16>()).prop_map(Some),
    ];
    let l3 = prop_oneof![
        4 => (v4(), l4()).prop_map(|(ip, l4)| L3::V4(ip, l4)),
        4 => (v6(), l4()).prop_map(|(ip, l4)| L3::V6(ip, l4)),
        1 => prop_oneof![Just(0x0806u16), Just(0x88b5), Just(0x8100), Just(0x88a8), any::<u16>()].prop_map(L3::Other),
    ];
    (
        vlan,
        l3,
        prop::collection::vec(any::<u8>(), 0..24),
        prop_oneof![3 => Just(vec![]), 1 => prop::collection::vec(any::<u8>(), 1..12)],
    )
        .prop_map(|(vlan, l3, payload, trailer)| Frame { vlan, l3, payload, trailer })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// Structured frames, whole and cut at every length.
    #[test]
    fn fast_path_agrees_on_structured_frames_at_every_length(f in frame()) {
        let bytes = f.bytes();
        let took = agree(&bytes)?;
        let plain_vlan = f.vlan.is_none_or(|(tpid, _)| tpid == 0x8100 || tpid == 0x88a8);
        if f.clean() && plain_vlan {
            prop_assert!(took, "the fast path declined a clean frame {:?}: {:02x?}", f, bytes);
        }
        for n in 0..bytes.len() {
            agree(&bytes[..n])?;
        }
    }

    /// Structured frames with a few bytes overwritten anywhere.
    #[test]
    fn fast_path_agrees_on_corrupted_frames(
        f in frame(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..5),
    ) {
        let mut bytes = f.bytes();
        for (at, b) in edits {
            let i = at.index(bytes.len());
            bytes[i] = b;
        }
        agree(&bytes)?;
    }

    /// Random bytes, and random bytes behind an IPv4/IPv6/VLAN EtherType.
    #[test]
    fn fast_path_agrees_on_random_bytes(
        mut bytes in prop::collection::vec(any::<u8>(), 0..160),
        et in prop_oneof![Just(None), Just(Some(0x0800u16)), Just(Some(0x86dd)), Just(Some(0x8100))],
        version in prop_oneof![Just(None), Just(Some(0x45u8)), Just(Some(0x60))],
    ) {
        if let (Some(et), true) = (et, bytes.len() >= 15) {
            bytes[12..14].copy_from_slice(&et.to_be_bytes());
            if let Some(v) = version {
                bytes[14] = v;
            }
        }
        agree(&bytes)?;
    }
}

/// The clean common case gives the expected fields (not just agreement with etherparse).
#[test]
fn fast_path_reads_the_fields() {
    let f = Frame {
        vlan: Some((0x8100, 0x2007)),
        l3: L3::V4(
            V4 {
                src: [10, 0, 0, 1],
                dst: [10, 0, 0, 2],
                options: vec![1; 8],
                version: None,
                ihl: None,
                total_len: None,
                frag: 0x4000,
                ah: None,
            },
            L4::Tcp { sport: 40000, dport: 80, options: vec![1; 12], data_offset: None },
        ),
        payload: vec![9; 10],
        trailer: vec![0; 6],
    };
    let i = parse_frame_fast(&f.bytes()).expect("fast path");
    assert_eq!(i.vlan, Some(7));
    assert_eq!(i.ethertype, 0x0800);
    assert_eq!((i.dst_mac, i.src_mac), ([2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 1]));
    assert_eq!(i.ip, Some(Ip::V4 { src: [10, 0, 0, 1], dst: [10, 0, 0, 2] }));
    assert_eq!(i.l4, Some(L4Ports { proto: L4Proto::Tcp, sport: 40000, dport: 80 }));
    assert!(!i.fragment && !i.malformed);

    let f6 = Frame {
        vlan: None,
        l3: L3::V6(
            V6 { src: [0x20; 16], dst: [0x30; 16], exts: vec![], version: None, payload_len: None, next_header: None },
            L4::Udp { sport: 5, dport: 6, length: None },
        ),
        payload: vec![1, 2, 3],
        trailer: vec![],
    };
    let i = parse_frame_fast(&f6.bytes()).expect("fast path");
    assert_eq!(i.ip, Some(Ip::V6 { src: [0x20; 16], dst: [0x30; 16] }));
    assert_eq!(i.l4, Some(L4Ports { proto: L4Proto::Udp, sport: 5, dport: 6 }));
    // A fragment and an extension header are left to etherparse.
    let mut frag = f.clone();
    if let L3::V4(ip, _) = &mut frag.l3 {
        ip.frag = 0x2000;
    }
    assert_eq!(parse_frame_fast(&frag.bytes()), None);
    assert!(parse_frame(&frag.bytes()).unwrap().fragment);
    let mut ext = f6.clone();
    if let L3::V6(ip, _) = &mut ext.l3 {
        ip.exts = vec![Ext::Raw { kind: 60, units: 0 }];
    }
    assert_eq!(parse_frame_fast(&ext.bytes()), None);
    assert_eq!(parse_frame(&ext.bytes()).unwrap().l4.map(|l| l.dport), Some(6));
}

/// Every stored input of the `frame_classify` fuzz target (emulator/fuzz/corpus), whole
/// and cut at every length.
#[test]
fn fast_path_agrees_on_the_fuzz_corpus() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/frame_classify");
    let Ok(entries) = std::fs::read_dir(&dir) else { return };
    let mut n = 0;
    for e in entries {
        let bytes = std::fs::read(e.unwrap().path()).unwrap();
        for len in 0..=bytes.len() {
            agree(&bytes[..len]).unwrap();
        }
        n += 1;
    }
    assert!(n > 0, "no corpus in {}", dir.display());
}
