//! Property tests of the control-frame codec: decoders never panic on any input, and
//! every request / completion / event survives an encode-decode round trip.

use arfsnic::wire::control::{
    self as wire, AddRequest, Caps, CompletionBody, CompletionMsg, DecodeError, DeviceMsg, EventMsg, Request,
    RssConfig, RssSet,
};
use arfsnic::wire::hash::HashMsg;
use arfsnic::wire::rule::{self, RuleAction, RuleSpec};
use arfsnic::wire::{FlowKey, IpVersion, L4Proto};
use proptest::prelude::*;

const GUEST: [u8; 6] = [0x52, 0x54, 0, 1, 2, 3];

fn flow_key() -> impl Strategy<Value = FlowKey> {
    (any::<bool>(), any::<bool>(), any::<[u8; 16]>(), any::<[u8; 16]>(), any::<u16>(), any::<u16>()).prop_map(
        |(v6, tcp, s, d, sp, dp)| {
            let p = if tcp { L4Proto::Tcp } else { L4Proto::Udp };
            if v6 {
                FlowKey::v6(p, s, sp, d, dp)
            } else {
                FlowKey::v4(p, [s[0], s[1], s[2], s[3]], sp, [d[0], d[1], d[2], d[3]], dp)
            }
        },
    )
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        Just(Request::Hello),
        Just(Request::Flush),
        (any::<u32>(), any::<u16>(), flow_key()).prop_map(|(filter_id, rxq, key)| Request::Add(AddRequest {
            filter_id,
            rxq,
            key
        })),
        (any::<u32>(), any::<u16>()).prop_map(|(filter_id, rxq)| Request::Mod { filter_id, rxq }),
        any::<u32>().prop_map(|filter_id| Request::Del { filter_id }),
        any::<u32>().prop_map(|filter_id| Request::Query { filter_id }),
        prop::collection::vec((any::<u16>(), any::<u64>()), 0..90).prop_map(Request::Stats),
        Just(Request::DevStats),
        Just(Request::RssGet),
        (
            any::<u8>(),
            prop::collection::vec(any::<u8>(), 0..=wire::RSS_KEY_MAX),
            prop::collection::vec(any::<u16>(), 0..=wire::RSS_INDIR_MAX)
        )
            .prop_map(|(hfunc, key, indir)| Request::RssSet(RssSet { hfunc, key, indir })),
        rule_spec().prop_map(Request::RuleSet),
        any::<u32>().prop_map(|location| Request::RuleDel { location }),
        Just(Request::HashGet),
        (any::<[u32; 6]>(), any::<u8>()).prop_map(|(fields, xfrm)| Request::HashSet(HashMsg { fields, xfrm })),
    ]
}

/// Any rule the codec accepts: a location below the limit, IPv4 addresses and masks in
/// their first four bytes.
fn rule_spec() -> impl Strategy<Value = RuleSpec> {
    (
        (0..rule::RULE_LOC_MAX, prop::option::of(any::<u16>()), any::<bool>(), any::<bool>()),
        (any::<[u8; 16]>(), any::<[u8; 16]>(), any::<[u8; 16]>(), any::<[u8; 16]>()),
        any::<[u16; 4]>(),
        prop::option::of(any::<u16>()),
    )
        .prop_map(|((location, q, v6, tcp), (mut src, mut src_mask, mut dst, mut dst_mask), p, ctx)| {
            if !v6 {
                for a in [&mut src, &mut src_mask, &mut dst, &mut dst_mask] {
                    a[4..].fill(0);
                }
            }
            RuleSpec {
                location,
                action: q.map_or(RuleAction::Drop, RuleAction::Queue),
                // A context rule steers (a drop with a context is refused).
                context: q.and(ctx),
                version: if v6 { IpVersion::V6 } else { IpVersion::V4 },
                proto: if tcp { L4Proto::Tcp } else { L4Proto::Udp },
                src,
                src_mask,
                dst,
                dst_mask,
                sport: p[0],
                sport_mask: p[1],
                dport: p[2],
                dport_mask: p[3],
            }
        })
}

fn completion() -> impl Strategy<Value = CompletionMsg> {
    let body = prop_oneof![
        Just(CompletionBody::None),
        (any::<u16>(), any::<u16>(), any::<[u32; 4]>(), "[a-z0-9-]{0,31}").prop_map(|(q, l, c, n)| {
            CompletionBody::Caps(Caps { queue_pairs: q, layout: l, capacity: c, profile: n })
        }),
        (any::<u16>(), any::<u64>()).prop_map(|(rxq, hits)| CompletionBody::Query { rxq, hits }),
        prop::collection::vec((any::<u16>(), any::<u64>()), 0..=wire::DEV_STATS_MAX_ENTRIES)
            .prop_map(CompletionBody::DevStats),
        (
            any::<u8>(),
            any::<u16>(),
            prop::collection::vec(any::<u8>(), 0..=wire::RSS_KEY_MAX),
            prop::collection::vec(any::<u16>(), 0..=wire::RSS_INDIR_MAX)
        )
            .prop_map(|(hfunc, queues, key, indir)| CompletionBody::Rss(RssConfig {
                hfunc,
                queues,
                key,
                indir
            })),
        (any::<[u32; 6]>(), any::<u8>()).prop_map(|(fields, xfrm)| CompletionBody::Hash(HashMsg { fields, xfrm })),
    ];
    (1u8..15, any::<u32>(), any::<u16>(), any::<[u64; 3]>(), body).prop_map(|(op, seq, status, t, body)| {
        // The op-specific part belongs to its op.
        let op = match &body {
            CompletionBody::Caps(_) => wire::op::HELLO,
            CompletionBody::Query { .. } => wire::op::QUERY,
            CompletionBody::DevStats(_) => wire::op::DEV_STATS,
            CompletionBody::Rss(_) => wire::op::RSS_GET,
            CompletionBody::Hash(_) => wire::op::HASH_GET,
            CompletionBody::None => op,
        };
        CompletionMsg { req_op: op, seq, status, enqueue_ns: t[0], start_ns: t[1], finish_ns: t[2], body }
    })
}

fn event() -> impl Strategy<Value = EventMsg> {
    prop_oneof![
        any::<u32>().prop_map(|filter_id| EventMsg::RuleAged { filter_id }),
        Just(EventMsg::TableFlushed),
        any::<bool>().prop_map(|disabled| EventMsg::EngineState { disabled }),
    ]
}

/// Random bytes behind a control Ethernet header, often with version 1 or 2 and a known
/// op, sometimes with a consistent length field: reaches every decoder branch.
fn control_frame() -> impl Strategy<Value = Vec<u8>> {
    (prop::collection::vec(any::<u8>(), 0..400), 0u8..4, 0u8..12, any::<bool>(), any::<bool>()).prop_map(
        |(body, version, op, fix_len, vlan)| {
            let mut f = vec![0xff; 6];
            f.extend_from_slice(&GUEST);
            if vlan {
                f.extend_from_slice(&[0x81, 0x00, 0x00, 0x07]);
            }
            f.extend_from_slice(&[0x88, 0xb5]);
            let h = f.len();
            f.extend_from_slice(&body);
            if (1..=2).contains(&version) && f.len() > h + 1 {
                f[h] = version;
                f[h + 1] = op;
            }
            if fix_len && f.len() > h + 3 {
                let n = (f.len() - h) as u16;
                f[h + 2..h + 4].copy_from_slice(&n.to_be_bytes());
            }
            f
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    #[test]
    fn decoders_never_panic_on_random_bytes(f in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = wire::decode_request(&f);
        let _ = wire::decode_device_frame(&f);
    }

    #[test]
    fn decoders_never_panic_on_control_frames(f in control_frame()) {
        match wire::decode_request(&f) {
            Ok((h, req)) => {
                // Whatever decodes re-encodes to a frame that decodes the same.
                let again = wire::encode_request(GUEST, h.seq, &req);
                prop_assert_eq!(wire::decode_request(&again).unwrap().1, req);
            }
            Err(e) => {
                // Every answerable error has a status; the unanswerable ones have no header.
                prop_assert_eq!(e.header().is_some(), e.errno().is_some());
                if let DecodeError::BadVersion { .. } = e {
                    prop_assert_eq!(e.errno(), Some(libc::EPROTO));
                }
            }
        }
        let _ = wire::decode_device_frame(&f);
    }

    #[test]
    fn requests_round_trip(seq in any::<u32>(), req in request()) {
        let f = wire::encode_request(GUEST, seq, &req);
        prop_assert!(f.len() >= wire::MIN_FRAME_LEN);
        let (h, got) = wire::decode_request(&f).unwrap();
        prop_assert_eq!((h.version, h.op, h.seq, h.status), (wire::VERSION, req.op(), seq, 0));
        prop_assert_eq!(h.flags & wire::FLAG_NO_REPLY != 0, !req.expects_reply());
        prop_assert_eq!(usize::from(h.length), wire::HDR_LEN + wire::request_body(&req).len());
        prop_assert_eq!(got, req);
    }

    #[test]
    fn truncated_requests_are_refused_not_misread(seq in any::<u32>(), req in request(), cut in 1usize..64) {
        let f = wire::encode_request(GUEST, seq, &req);
        let real = wire::ETH_HLEN + wire::HDR_LEN + wire::request_body(&req).len();
        if cut <= real {
            let short = &f[..real - cut];
            prop_assert!(wire::decode_request(short).is_err());
        }
    }

    #[test]
    fn completions_round_trip(c in completion()) {
        let f = wire::encode_completion(GUEST, &c);
        let (h, m) = wire::decode_device_frame(&f).unwrap();
        prop_assert_eq!(h.op, wire::op::COMPLETION | c.req_op);
        prop_assert_eq!(m, DeviceMsg::Completion(c));
    }

    /// An RSS_SET whose announced sizes exceed the frame or the protocol limits is refused
    /// with EINVAL, whatever the sizes say (no allocation in proportion to them).
    #[test]
    fn rss_set_sizes_are_checked_before_use(key_len in any::<u16>(), n in any::<u16>(), extra in 0usize..600) {
        let mut body = vec![1, 0];
        body.extend_from_slice(&key_len.to_be_bytes());
        body.extend_from_slice(&n.to_be_bytes());
        body.extend_from_slice(&[0, 0]);
        body.resize(8 + extra, 0x11);
        let h = wire::Header { version: wire::VERSION, op: wire::op::RSS_SET, seq: 5, ..Default::default() };
        let f = wire::encode_raw(wire::BROADCAST_MAC, GUEST, h, &body);
        let fits = usize::from(key_len) <= wire::RSS_KEY_MAX
            && usize::from(n) <= wire::RSS_INDIR_MAX
            && 8 + usize::from(key_len) + 2 * usize::from(n) <= body.len();
        match wire::decode_request(&f) {
            Ok((_, Request::RssSet(s))) => {
                prop_assert!(fits);
                prop_assert_eq!((s.key.len(), s.indir.len()), (usize::from(key_len), usize::from(n)));
            }
            Ok((_, other)) => prop_assert!(false, "decoded as {}", other),
            Err(e) => {
                prop_assert!(!fits, "{e}");
                prop_assert_eq!(e.errno(), Some(libc::EINVAL));
            }
        }
    }

    #[test]
    fn events_round_trip(seq in any::<u32>(), e in event()) {
        let f = wire::encode_event(GUEST, seq, &e);
        prop_assert_eq!(wire::decode_device_frame(&f).unwrap().1, DeviceMsg::Event { seq, event: e });
    }
}
