//! Unit tests of `wire::control` (kept apart to keep the module readable).

use super::*;

const GUEST: [u8; 6] = [0x52, 0x54, 0, 0x12, 0x34, 0x56];

fn add() -> Request {
    Request::Add(AddRequest {
        filter_id: 0x01020304,
        rxq: 3,
        key: FlowKey::v4(L4Proto::Tcp, [10, 0, 0, 1], 1234, [10, 0, 0, 2], 80),
    })
}

#[test]
fn add_frame_layout_is_the_documented_one() {
    let f = encode_request(GUEST, 7, &add());
    assert_eq!(f.len(), ETH_HLEN + HDR_LEN + ADD_BODY_LEN);
    assert_eq!(&f[0..6], &BROADCAST_MAC);
    assert_eq!(&f[6..12], &GUEST);
    assert_eq!(&f[12..14], &[0x88, 0xb5]);
    assert_eq!(&f[14..30], &[VERSION, 2, 0, 60, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0]);
    let b = &f[30..];
    assert_eq!(&b[0..8], &[1, 2, 3, 4, 0, 3, 4, 6]);
    assert_eq!(&b[8..12], &[10, 0, 0, 1]);
    assert_eq!(&b[24..28], &[10, 0, 0, 2]);
    assert_eq!(&b[40..44], &[0x04, 0xd2, 0, 80]);
    assert_eq!(decode_request(&f).unwrap().1, add());
}

#[test]
fn short_requests_are_padded_and_still_decode() {
    for req in [Request::Hello, Request::Flush, Request::Del { filter_id: 9 }, Request::Query { filter_id: 1 }] {
        let f = encode_request(GUEST, 1, &req);
        assert_eq!(f.len(), MIN_FRAME_LEN);
        assert_eq!(decode_request(&f).unwrap().1, req);
    }
    let stats = Request::Stats(vec![(counter::STEER_CALLS, 5), (0x200 + 28, u64::MAX)]);
    let f = encode_request(GUEST, 2, &stats);
    let (h, r) = decode_request(&f).unwrap();
    assert_eq!((r, h.flags), (stats, FLAG_NO_REPLY));
}

#[test]
fn errors_carry_status_and_seq() {
    let mut f = encode_request(GUEST, 0xdead_beef, &Request::Hello);
    f[14] = VERSION + 1;
    let e = decode_request(&f).unwrap_err();
    assert_eq!((e.errno(), e.header().map(|h| h.seq)), (Some(libc::EPROTO), Some(0xdead_beef)));
    f[14] = 0;
    assert_eq!(decode_request(&f).unwrap_err().kind(), "bad_version");
    f[14] = 2;
    f[15] = 0x33;
    assert_eq!(decode_request(&f).unwrap_err().errno(), Some(libc::EOPNOTSUPP));
    f[15] = op::DEL; // DEL with an empty body
    assert!(matches!(decode_request(&f), Err(DecodeError::BadBody { .. })));
    f[16..18].copy_from_slice(&200u16.to_be_bytes());
    assert!(matches!(decode_request(&f), Err(DecodeError::BadLength { .. })));
    assert!(matches!(decode_request(&f[..13]), Err(DecodeError::TooShort { len: 13 })));
    let e = decode_request(&f[..20]).unwrap_err();
    assert!(matches!(e, DecodeError::TruncatedHeader { have: 6, .. }));
    assert_eq!((e.errno(), e.header().map(|h| h.seq)), (Some(libc::EINVAL), Some(0)), "partial seq not echoed");
    let e = decode_request(&f[..24]).unwrap_err();
    assert!(matches!(e, DecodeError::TruncatedHeader { have: 10, .. }));
    assert_eq!(e.header().map(|h| (h.seq, h.op)), Some((0xdead_beef, op::DEL)));
    let mut r = encode_request(GUEST, 1, &Request::Hello);
    r[29] = 1;
    assert_eq!(decode_request(&r).unwrap_err().kind(), "bad_reserved");
    // Longer bodies than the op needs are accepted, the extra bytes ignored.
    let mut d = encode_request(GUEST, 1, &Request::Del { filter_id: 3 });
    d[17] = 16 + 8;
    assert_eq!(decode_request(&d).unwrap().1, Request::Del { filter_id: 3 });
    let mut a = encode_request(GUEST, 3, &add());
    a[30 + 6] = 5;
    assert_eq!(decode_request(&a).unwrap_err().kind(), "bad_ip_version");
    a[30 + 6] = 4;
    a[30 + 7] = 1;
    assert_eq!(decode_request(&a).unwrap_err().kind(), "bad_l4_proto");
    a[30 + 7] = 17;
    a[30 + 8 + 5] = 1;
    assert_eq!(decode_request(&a).unwrap_err().kind(), "bad_address");
}

/// The example of docs/control-protocol.md §5, byte for byte.
#[test]
fn documented_example_frames() {
    let mac = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
    let req = Request::Add(AddRequest {
        filter_id: 7,
        rxq: 2,
        key: FlowKey::v4(L4Proto::Udp, [10, 0, 0, 2], 40000, [10, 0, 0, 15], 7000),
    });
    let want_req = "ffffffffffff525400123456 88b5 0402 003c 00000011 0000 0000 00000000 \
                    00000007 0002 04 11 0a000002000000000000000000000000 0a00000f000000000000000000000000 9c40 1b58";
    assert_eq!(hex::encode(encode_request(mac, 0x11, &req)), want_req.replace([' ', '\\', '\n'], ""));
    let c = CompletionMsg {
        req_op: op::ADD,
        seq: 0x11,
        status: 0,
        enqueue_ns: 1_000_000,
        start_ns: 1_000_500,
        finish_ns: 1_050_500,
        body: CompletionBody::None,
    };
    let want_c = "525400123456 02a5f1c00001 88b5 0482 0028 00000011 0000 0000 00000000 \
                  00000000000f4240 00000000000f4434 0000000000100784 000000000000";
    assert_eq!(hex::encode(encode_completion(mac, &c)), want_c.replace([' ', '\\', '\n'], ""));
}

#[test]
fn vlan_tagged_request_decodes() {
    let f = encode_request(GUEST, 5, &Request::Hello);
    let mut t = f[..12].to_vec();
    t.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
    t.extend_from_slice(&f[12..]);
    assert_eq!(decode_request(&t).unwrap().1, Request::Hello);
}

#[test]
fn completions_and_events_round_trip() {
    let caps = CompletionMsg {
        req_op: op::HELLO,
        seq: 1,
        status: 0,
        enqueue_ns: 1,
        start_ns: 2,
        finish_ns: 3,
        body: CompletionBody::Caps(Caps {
            queue_pairs: 4,
            layout: LAYOUT_PER_TYPE,
            capacity: [1024; 4],
            profile: "a-profile-name-longer-than-thirty-two-bytes".into(),
        }),
    };
    let f = encode_completion(GUEST, &caps);
    assert_eq!(&f[6..12], &DEVICE_MAC);
    assert_eq!(f[15], 0x81);
    let (_, m) = decode_device_frame(&f).unwrap();
    let DeviceMsg::Completion(c) = m else { panic!("not a completion") };
    let CompletionBody::Caps(got) = &c.body else { panic!("no caps") };
    assert_eq!(got.profile, "a-profile-name-longer-than-thir");
    let q = CompletionMsg {
        req_op: op::QUERY,
        seq: 9,
        status: 0,
        enqueue_ns: 10,
        start_ns: 20,
        finish_ns: 30,
        body: CompletionBody::Query { rxq: 2, hits: 77 },
    };
    assert_eq!(decode_device_frame(&encode_completion(GUEST, &q)).unwrap().1, DeviceMsg::Completion(q));
    for e in [EventMsg::RuleAged { filter_id: 3 }, EventMsg::TableFlushed, EventMsg::EngineState { disabled: true }] {
        let f = encode_event(GUEST, 42, &e);
        assert_eq!(decode_device_frame(&f).unwrap().1, DeviceMsg::Event { seq: 42, event: e });
    }
}

fn rss_set() -> Request {
    Request::RssSet(RssSet { hfunc: RSS_HFUNC_TOEPLITZ, key: (0..40).collect(), indir: vec![0, 1, 2, 3, 0, 1, 2, 3] })
}

#[test]
fn rss_set_layout_and_round_trip() {
    let f = encode_request(GUEST, 5, &rss_set());
    let b = &f[ETH_HLEN + HDR_LEN..];
    assert_eq!(&f[14..18], &[VERSION, op::RSS_SET, 0, (16 + 8 + 40 + 16) as u8]);
    assert_eq!(&b[..8], &[1, 0, 0, 40, 0, 8, 0, 0]);
    assert_eq!(&b[8..12], &[0, 1, 2, 3]);
    assert_eq!(&b[48..52], &[0, 0, 0, 1]);
    assert_eq!(decode_request(&f).unwrap().1, rss_set());
    // Nothing to change: keep everything.
    let keep = Request::RssSet(RssSet::default());
    assert_eq!(decode_request(&encode_request(GUEST, 6, &keep)).unwrap().1, keep);
    assert_eq!(decode_request(&encode_request(GUEST, 7, &Request::RssGet)).unwrap().1, Request::RssGet);
}

#[test]
fn rss_set_bad_bodies() {
    let f = encode_request(GUEST, 5, &rss_set());
    let body = f[ETH_HLEN + HDR_LEN..].to_vec();
    let raw = |body: &[u8]| {
        let h = Header { version: VERSION, op: op::RSS_SET, seq: 9, ..Default::default() };
        encode_raw(BROADCAST_MAC, GUEST, h, body)
    };
    // Shorter than the 8-byte head, or than the sizes it announces.
    for n in [0, 7, 8, 47, body.len() - 1] {
        let e = decode_request(&raw(&body[..n])).unwrap_err();
        assert!(n == 8 || matches!(e, DecodeError::BadBody { .. }), "{n}: {e:?}");
        assert_eq!(e.errno(), Some(libc::EINVAL), "{n}");
    }
    // Sizes beyond the protocol's limits, even in a frame long enough.
    let mut big = body.clone();
    big[2..4].copy_from_slice(&65u16.to_be_bytes());
    big.resize(8 + 65 + 16, 0);
    let e = decode_request(&raw(&big)).unwrap_err();
    assert_eq!((e.kind(), e.errno()), ("rss_too_large", Some(libc::EINVAL)));
    let mut big = body.clone();
    big[4..6].copy_from_slice(&129u16.to_be_bytes());
    big.resize(8 + 40 + 2 * 129, 0);
    assert_eq!(decode_request(&raw(&big)).unwrap_err().kind(), "rss_too_large");
    // A u16::MAX count in a short frame allocates nothing.
    let mut huge = body[..8].to_vec();
    huge[2..6].copy_from_slice(&[0xff; 4]);
    assert_eq!(decode_request(&raw(&huge)).unwrap_err().kind(), "rss_too_large");
}

#[test]
fn rss_ops_need_version_2() {
    for req in [Request::RssGet, rss_set()] {
        let mut f = encode_request(GUEST, 1, &req);
        f[14] = 1;
        let e = decode_request(&f).unwrap_err();
        assert_eq!((e.kind(), e.errno()), ("unknown_op", Some(libc::EOPNOTSUPP)));
    }
    // Every version 1 op still decodes in a version 1 frame.
    let mut f = encode_request(GUEST, 1, &add());
    f[14] = 1;
    assert_eq!(decode_request(&f).unwrap().1, add());
}

#[test]
fn rss_get_completion_round_trip_and_checks() {
    let c = CompletionMsg {
        req_op: op::RSS_GET,
        seq: 4,
        status: 0,
        enqueue_ns: 1,
        start_ns: 1,
        finish_ns: 1,
        body: CompletionBody::Rss(RssConfig {
            hfunc: RSS_HFUNC_TOEPLITZ,
            queues: 4,
            key: KEY_FOR_TEST.to_vec(),
            indir: (0..128).map(|i| i % 4).collect(),
        }),
    };
    let f = encode_completion(GUEST, &c);
    assert_eq!(f.len(), ETH_HLEN + HDR_LEN + TIMESTAMPS_LEN + RSS_REPLY_HDR_LEN + 40 + 256);
    assert_eq!(decode_device_frame(&f).unwrap().1, DeviceMsg::Completion(c.clone()));
    // A table size that disagrees with the length is refused.
    let mut bad = f.clone();
    bad[ETH_HLEN + HDR_LEN + TIMESTAMPS_LEN + 5] = 127;
    assert!(matches!(decode_device_frame(&bad), Err(DecodeError::BadBody { .. })));
    // A version 1 answer decodes too.
    let v1 = encode_completion_version(GUEST, 1, &c);
    assert_eq!(v1[14], 1);
    assert_eq!(decode_device_frame(&v1).unwrap().1, DeviceMsg::Completion(c));
}

/// Any 40-byte key (the wire layer does not know the model's default).
const KEY_FOR_TEST: [u8; 40] = [0x6d; 40];

#[test]
fn counter_ids() {
    assert_eq!(CounterId::classify(1), CounterId::Named("steer_calls"));
    assert_eq!(CounterId::classify(20), CounterId::Named("hold_ns"));
    assert_eq!(CounterId::classify(0x100 + 23), CounterId::LatBucket(23));
    assert_eq!(CounterId::classify(0x100 + 24), CounterId::Unknown(0x118));
    assert_eq!(CounterId::classify(0x200 + libc::ENOSPC as u16), CounterId::AddErr(libc::ENOSPC));
    assert_eq!(CounterId::classify(0x400 + 200), CounterId::DelErr(200));
    assert_eq!(CounterId::classify(0x200), CounterId::Unknown(0x200));
    assert_eq!(CounterId::classify(0), CounterId::Unknown(0));
}
