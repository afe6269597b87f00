//! CTX_SET / CTX_DEL (protocol version 4, RSS contexts): the header's values, the
//! encoder's layout and frames built purely from the header's offsets. A module of
//! `tests/proto_header.rs`.

use super::{body_len, request_header, Built, Proto, Region, GUEST};
use arfsnic::wire::control::{self as wire, encode_request, op, Request, RssSet};

pub(super) fn rust_values() -> Vec<(&'static str, &'static str, u64)> {
    vec![
        ("ARFS_OP_CTX_SET", "op::CTX_SET", u64::from(op::CTX_SET)),
        ("ARFS_OP_CTX_DEL", "op::CTX_DEL", u64::from(op::CTX_DEL)),
        ("ARFS_CTX_SET_HDR_LEN", "CTX_SET_HDR_LEN", wire::CTX_SET_HDR_LEN as u64),
    ]
}

fn set() -> RssSet {
    RssSet { hfunc: 1, key: (0x40..0x68).collect(), indir: vec![3, 2, 1, 0] }
}

pub(super) fn check_ctx_layout(p: &Proto) {
    let what = "CTX_SET request";
    let s = set();
    let f = encode_request(GUEST, 21, &Request::CtxSet { context: 0x0102_0304, set: s.clone() });
    let r = Region::body(p, what, &f);
    r.uint("ARFS_CTX_OFF_ID", 4, 0x0102_0304);
    let head = p.off("ARFS_CTX_SET_HDR_LEN");
    assert_eq!(p.off("ARFS_CTX_OFF_ID") + 4, head, "{what}: the ID is the whole head");
    // An RSS_SET body follows the head.
    let rss = r.at(head);
    rss.uint("ARFS_RSS_SET_OFF_HFUNC", 1, u64::from(s.hfunc));
    rss.uint("ARFS_RSS_SET_OFF_KEY_LEN", 2, s.key.len() as u64);
    rss.uint("ARFS_RSS_SET_OFF_INDIR_SIZE", 2, s.indir.len() as u64);
    rss.bytes("ARFS_RSS_SET_OFF_KEY", &s.key);
    let want = head + p.off("ARFS_RSS_SET_HDR_LEN") + s.key.len() + 2 * s.indir.len();
    body_len(&request_header(&f), what, want, "ARFS_CTX_SET_HDR_LEN + an RSS_SET body");

    let what = "CTX_DEL request";
    let f = encode_request(GUEST, 22, &Request::CtxDel { context: 0x0a0b_0c0d });
    Region::body(p, what, &f).uint("ARFS_CTX_OFF_ID", 4, 0x0a0b_0c0d);
    body_len(&request_header(&f), what, p.off("ARFS_CTX_DEL_BODY_LEN"), "ARFS_CTX_DEL_BODY_LEN");
}

pub(super) fn check_built_ctx(p: &Proto) {
    let s = set();
    let head = p.off("ARFS_CTX_SET_HDR_LEN");
    let rss = p.off("ARFS_RSS_SET_HDR_LEN");
    let mut b = Built::new(p, "ARFS_OP_CTX_SET", 0x3132_3334, 0, 0, head + rss + s.key.len() + 2 * s.indir.len());
    b.body("ARFS_CTX_OFF_ID", 4, 7);
    let at = super::ETH_HDR + p.off("ARFS_HDR_LEN") + head;
    b.put(at, "ARFS_RSS_SET_OFF_HFUNC", 1, u64::from(s.hfunc));
    b.put(at, "ARFS_RSS_SET_OFF_KEY_LEN", 2, s.key.len() as u64);
    b.put(at, "ARFS_RSS_SET_OFF_INDIR_SIZE", 2, s.indir.len() as u64);
    for (i, k) in s.key.iter().enumerate() {
        b.put(at + i, "ARFS_RSS_SET_OFF_KEY", 1, u64::from(*k));
    }
    for (i, q) in s.indir.iter().enumerate() {
        b.put(at + s.key.len() + 2 * i, "ARFS_RSS_SET_OFF_KEY", 2, u64::from(*q));
    }
    b.decodes_to(Request::CtxSet { context: 7, set: s });

    let mut b = Built::new(p, "ARFS_OP_CTX_DEL", 0x4142_4344, 0, 0, p.off("ARFS_CTX_DEL_BODY_LEN"));
    b.body("ARFS_CTX_OFF_ID", 4, 9);
    b.decodes_to(Request::CtxDel { context: 9 });
}
