//! HASH_GET / HASH_SET (protocol version 3, `wire::hash`): the header's values, the
//! encoder's layout of the request body and the reply, and frames built purely from the
//! header's offsets. A module of `tests/proto_header.rs`.

use super::{body_len, device_header, request_header, tiles, Built, Proto, Region, GUEST, TS};
use arfsnic::wire::control::{
    encode_completion, encode_request, op, CompletionBody, CompletionMsg, DeviceMsg, Request, TIMESTAMPS_LEN,
};
use arfsnic::wire::hash::{self, HashMsg};

pub(super) fn rust_values() -> Vec<(&'static str, &'static str, u64)> {
    vec![
        ("ARFS_OP_HASH_GET", "op::HASH_GET", u64::from(op::HASH_GET)),
        ("ARFS_OP_HASH_SET", "op::HASH_SET", u64::from(op::HASH_SET)),
        ("ARFS_HASH_BODY_LEN", "hash::HASH_BODY_LEN", hash::HASH_BODY_LEN as u64),
        ("ARFS_HASH_IP_SRC", "hash::HASH_IP_SRC", u64::from(hash::HASH_IP_SRC)),
        ("ARFS_HASH_IP_DST", "hash::HASH_IP_DST", u64::from(hash::HASH_IP_DST)),
        ("ARFS_HASH_L4_B_0_1", "hash::HASH_L4_B_0_1", u64::from(hash::HASH_L4_B_0_1)),
        ("ARFS_HASH_L4_B_2_3", "hash::HASH_L4_B_2_3", u64::from(hash::HASH_L4_B_2_3)),
        ("ARFS_HASH_KEEP", "hash::HASH_KEEP", u64::from(hash::HASH_KEEP)),
        ("ARFS_HASH_XFRM_NONE", "hash::HASH_XFRM_NONE", u64::from(hash::HASH_XFRM_NONE)),
        ("ARFS_HASH_XFRM_SYM_XOR", "hash::HASH_XFRM_SYM_XOR", u64::from(hash::HASH_XFRM_SYM_XOR)),
        ("ARFS_HASH_XFRM_KEEP", "hash::HASH_XFRM_KEEP", u64::from(hash::HASH_XFRM_KEEP)),
    ]
}

const FIELDS: [(&str, usize); 8] = [
    ("ARFS_HASH_OFF_TCP4", 4),
    ("ARFS_HASH_OFF_UDP4", 4),
    ("ARFS_HASH_OFF_IP4", 4),
    ("ARFS_HASH_OFF_TCP6", 4),
    ("ARFS_HASH_OFF_UDP6", 4),
    ("ARFS_HASH_OFF_IP6", 4),
    ("ARFS_HASH_OFF_XFRM", 1),
    ("ARFS_HASH_OFF_PAD", 3),
];

/// Distinct values per field, so a misplaced offset shows.
fn msg() -> HashMsg {
    HashMsg { fields: [0x0a0b_0c0d, 0x1a1b_1c1d, 0x2a2b_2c2d, 0x3a3b_3c3d, 0x4a4b_4c4d, 0x5a5b_5c5d], xfrm: 0x6e }
}

fn check_fields(r: &Region<'_>, m: &HashMsg) {
    for ((name, _), v) in FIELDS.iter().zip(m.fields) {
        r.uint(name, 4, u64::from(v));
    }
    r.uint("ARFS_HASH_OFF_XFRM", 1, u64::from(m.xfrm));
    r.zero("ARFS_HASH_OFF_PAD", 3);
}

pub(super) fn check_hash_layout(p: &Proto) {
    let m = msg();
    let len = p.off("ARFS_HASH_BODY_LEN");
    tiles(p, "HASH body", 0, &FIELDS, len, "ARFS_HASH_BODY_LEN");

    let what = "HASH_SET request";
    let f = encode_request(GUEST, 12, &Request::HashSet(m));
    check_fields(&Region::body(p, what, &f), &m);
    body_len(&request_header(&f), what, len, "ARFS_HASH_BODY_LEN");
    let f = encode_request(GUEST, 13, &Request::HashGet);
    body_len(&request_header(&f), "HASH_GET request", 0, "no body");

    let what = "HASH_GET completion";
    let c = CompletionMsg {
        req_op: op::HASH_GET,
        seq: 14,
        status: 0,
        enqueue_ns: TS[0].1,
        start_ns: TS[1].1,
        finish_ns: TS[2].1,
        body: CompletionBody::Hash(m),
    };
    let f = encode_completion(GUEST, &c);
    let ts = p.off("ARFS_TS_LEN");
    check_fields(&Region::body(p, what, &f).at(ts), &m);
    body_len(&device_header(&f), what, ts + len, "ARFS_TS_LEN + ARFS_HASH_BODY_LEN");
    assert_eq!(ts, TIMESTAMPS_LEN);
}

pub(super) fn check_built_hash(p: &Proto) {
    let m = msg();
    let len = p.off("ARFS_HASH_BODY_LEN");
    let mut b = Built::new(p, "ARFS_OP_HASH_SET", 0x2a2b_2c2d, 0, 0, len);
    for ((name, _), v) in FIELDS.iter().zip(m.fields) {
        b.body(name, 4, u64::from(v));
    }
    b.body("ARFS_HASH_OFF_XFRM", 1, u64::from(m.xfrm));
    b.decodes_to(Request::HashSet(m));
    // Keep everything: the header's KEEP values are the codec's.
    let mut b = Built::new(p, "ARFS_OP_HASH_SET", 3, 0, 0, len);
    for (name, _) in &FIELDS[..6] {
        b.body(name, 4, p.get("ARFS_HASH_KEEP"));
    }
    b.body("ARFS_HASH_OFF_XFRM", 1, p.get("ARFS_HASH_XFRM_KEEP"));
    b.decodes_to(Request::HashSet(HashMsg::KEEP));
    let b = Built::new(p, "ARFS_OP_HASH_GET", 4, 0, 0, 0);
    b.decodes_to(Request::HashGet);

    // The reply: all of ethtool's fields on tcp4, addresses on ip4, sym-xor.
    let ts = p.off("ARFS_TS_LEN");
    let mut b = Built::new(p, "ARFS_OP_COMPLETION | ARFS_OP_HASH_GET", 5, 0, 0, ts + len);
    let all = ["ARFS_HASH_IP_SRC", "ARFS_HASH_IP_DST", "ARFS_HASH_L4_B_0_1", "ARFS_HASH_L4_B_2_3"]
        .iter()
        .fold(0, |a, n| a | p.get(n));
    let ip = p.get("ARFS_HASH_IP_SRC") | p.get("ARFS_HASH_IP_DST");
    let body = |b: &mut Built, name: &str, v: u64| {
        let at = super::ETH_HDR + p.off("ARFS_HDR_LEN") + ts;
        b.put(at, name, if name == "ARFS_HASH_OFF_XFRM" { 1 } else { 4 }, v);
    };
    body(&mut b, "ARFS_HASH_OFF_TCP4", all);
    body(&mut b, "ARFS_HASH_OFF_IP4", ip);
    body(&mut b, "ARFS_HASH_OFF_XFRM", p.get("ARFS_HASH_XFRM_SYM_XOR"));
    let want = HashMsg { fields: [all as u32, 0, ip as u32, 0, 0, 0], xfrm: hash::HASH_XFRM_SYM_XOR };
    let msg = CompletionMsg {
        req_op: op::HASH_GET,
        seq: 5,
        status: 0,
        enqueue_ns: 0,
        start_ns: 0,
        finish_ns: 0,
        body: CompletionBody::Hash(want),
    };
    b.decodes_to_device(DeviceMsg::Completion(msg));
    let _ = p.get("ARFS_HASH_XFRM_NONE");
}
