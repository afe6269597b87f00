//! RULE_SET / RULE_DEL (protocol version 3, `wire::rule`): the header's values, the
//! encoder's layout and frames built purely from the header's offsets. A module of
//! `tests/proto_header.rs`, whose `every_header_constant_is_checked` counts these too.

use super::{body_len, request_header, tiles, Built, Proto, Region, GUEST};
use arfsnic::wire::control::{encode_request, op, Request};
use arfsnic::wire::rule::{self, RuleAction, RuleSpec};
use arfsnic::wire::{IpVersion, L4Proto};

/// `(header name, Rust name, Rust value)`, as `rust_values()`.
pub(super) fn rust_values() -> Vec<(&'static str, &'static str, u64)> {
    vec![
        ("ARFS_OP_RULE_SET", "op::RULE_SET", u64::from(op::RULE_SET)),
        ("ARFS_OP_RULE_DEL", "op::RULE_DEL", u64::from(op::RULE_DEL)),
        ("ARFS_RULE_SET_BODY_LEN", "rule::RULE_SET_BODY_LEN", rule::RULE_SET_BODY_LEN as u64),
        ("ARFS_RULE_DEL_BODY_LEN", "rule::RULE_DEL_BODY_LEN", rule::RULE_DEL_BODY_LEN as u64),
        ("ARFS_RULE_LOC_MAX", "rule::RULE_LOC_MAX", u64::from(rule::RULE_LOC_MAX)),
        ("ARFS_RULE_LOC_ALL", "rule::RULE_LOC_ALL", u64::from(rule::RULE_LOC_ALL)),
        ("ARFS_RULE_ACTION_QUEUE", "rule::RULE_ACTION_QUEUE", u64::from(rule::RULE_ACTION_QUEUE)),
        ("ARFS_RULE_ACTION_DROP", "rule::RULE_ACTION_DROP", u64::from(rule::RULE_ACTION_DROP)),
        ("ARFS_RULE_FLAG_RSS", "rule::RULE_FLAG_RSS", u64::from(rule::RULE_FLAG_RSS)),
    ]
}

/// A v6 rule whose every field has distinct bytes, so a misplaced offset shows.
fn v6_rule() -> RuleSpec {
    RuleSpec {
        location: 0x0000_03a5,
        action: RuleAction::Queue(0x0b0c),
        context: None,
        version: IpVersion::V6,
        proto: L4Proto::Udp,
        src: std::array::from_fn(|i| 0x10 + i as u8),
        src_mask: std::array::from_fn(|i| 0x30 + i as u8),
        dst: std::array::from_fn(|i| 0x50 + i as u8),
        dst_mask: std::array::from_fn(|i| 0x70 + i as u8),
        sport: 0x9192,
        sport_mask: 0x9394,
        dport: 0x9596,
        dport_mask: 0x9798,
    }
}

const FIELDS: [(&str, usize); 15] = [
    ("ARFS_RULE_OFF_LOCATION", 4),
    ("ARFS_RULE_OFF_RXQ", 2),
    ("ARFS_RULE_OFF_ACTION", 1),
    ("ARFS_RULE_OFF_FLAGS", 1),
    ("ARFS_RULE_OFF_IP_VERSION", 1),
    ("ARFS_RULE_OFF_L4_PROTO", 1),
    ("ARFS_RULE_OFF_CONTEXT", 2),
    ("ARFS_RULE_OFF_SRC_ADDR", 16),
    ("ARFS_RULE_OFF_SRC_MASK", 16),
    ("ARFS_RULE_OFF_DST_ADDR", 16),
    ("ARFS_RULE_OFF_DST_MASK", 16),
    ("ARFS_RULE_OFF_SRC_PORT", 2),
    ("ARFS_RULE_OFF_SRC_PORT_MASK", 2),
    ("ARFS_RULE_OFF_DST_PORT", 2),
    ("ARFS_RULE_OFF_DST_PORT_MASK", 2),
];

pub(super) fn check_rule_layout(p: &Proto) {
    let what = "RULE_SET request";
    let r = v6_rule();
    let f = encode_request(GUEST, 9, &Request::RuleSet(r));
    let b = Region::body(p, what, &f);
    b.uint("ARFS_RULE_OFF_LOCATION", 4, u64::from(r.location));
    b.uint("ARFS_RULE_OFF_RXQ", 2, 0x0b0c);
    b.uint("ARFS_RULE_OFF_ACTION", 1, p.get("ARFS_RULE_ACTION_QUEUE"));
    b.zero("ARFS_RULE_OFF_FLAGS", 1);
    b.uint("ARFS_RULE_OFF_IP_VERSION", 1, 6);
    b.uint("ARFS_RULE_OFF_L4_PROTO", 1, 17);
    b.zero("ARFS_RULE_OFF_CONTEXT", 2);
    b.bytes("ARFS_RULE_OFF_SRC_ADDR", &r.src);
    b.bytes("ARFS_RULE_OFF_SRC_MASK", &r.src_mask);
    b.bytes("ARFS_RULE_OFF_DST_ADDR", &r.dst);
    b.bytes("ARFS_RULE_OFF_DST_MASK", &r.dst_mask);
    b.uint("ARFS_RULE_OFF_SRC_PORT", 2, u64::from(r.sport));
    b.uint("ARFS_RULE_OFF_SRC_PORT_MASK", 2, u64::from(r.sport_mask));
    b.uint("ARFS_RULE_OFF_DST_PORT", 2, u64::from(r.dport));
    b.uint("ARFS_RULE_OFF_DST_PORT_MASK", 2, u64::from(r.dport_mask));
    let len = p.off("ARFS_RULE_SET_BODY_LEN");
    tiles(p, what, 0, &FIELDS, len, "ARFS_RULE_SET_BODY_LEN");
    body_len(&request_header(&f), what, len, "ARFS_RULE_SET_BODY_LEN");

    // Version 4: an RSS context picks the queue, the rule's queue is an offset.
    let ctx = RuleSpec { context: Some(0x0d0e), ..r };
    let f = encode_request(GUEST, 12, &Request::RuleSet(ctx));
    let c = Region::body(p, "RULE_SET request (context)", &f);
    c.uint("ARFS_RULE_OFF_FLAGS", 1, p.get("ARFS_RULE_FLAG_RSS"));
    c.uint("ARFS_RULE_OFF_CONTEXT", 2, 0x0d0e);

    let drop = RuleSpec { action: RuleAction::Drop, ..r };
    let f = encode_request(GUEST, 10, &Request::RuleSet(drop));
    Region::body(p, "RULE_SET request (drop)", &f).uint("ARFS_RULE_OFF_ACTION", 1, p.get("ARFS_RULE_ACTION_DROP"));

    let what = "RULE_DEL request";
    for loc in [0x0000_0123, p.val::<u32>("ARFS_RULE_LOC_ALL")] {
        let f = encode_request(GUEST, 11, &Request::RuleDel { location: loc });
        Region::body(p, what, &f).uint("ARFS_RULE_DEL_OFF_LOCATION", 4, u64::from(loc));
        let len = p.off("ARFS_RULE_DEL_BODY_LEN");
        tiles(p, what, 0, &[("ARFS_RULE_DEL_OFF_LOCATION", 4)], len, "ARFS_RULE_DEL_BODY_LEN");
        body_len(&request_header(&f), what, len, "ARFS_RULE_DEL_BODY_LEN");
    }
}

pub(super) fn check_built_rules(p: &Proto) {
    let r = v6_rule();
    let mut b = Built::new(p, "ARFS_OP_RULE_SET", 0x1a1b_1c1d, 0, 0, p.off("ARFS_RULE_SET_BODY_LEN"));
    b.body("ARFS_RULE_OFF_LOCATION", 4, u64::from(r.location))
        .body("ARFS_RULE_OFF_RXQ", 2, 0x0b0c)
        .body("ARFS_RULE_OFF_ACTION", 1, p.get("ARFS_RULE_ACTION_QUEUE"))
        .body("ARFS_RULE_OFF_IP_VERSION", 1, 6)
        .body("ARFS_RULE_OFF_L4_PROTO", 1, 17)
        .body_bytes("ARFS_RULE_OFF_SRC_ADDR", &r.src)
        .body_bytes("ARFS_RULE_OFF_SRC_MASK", &r.src_mask)
        .body_bytes("ARFS_RULE_OFF_DST_ADDR", &r.dst)
        .body_bytes("ARFS_RULE_OFF_DST_MASK", &r.dst_mask)
        .body("ARFS_RULE_OFF_SRC_PORT", 2, u64::from(r.sport))
        .body("ARFS_RULE_OFF_SRC_PORT_MASK", 2, u64::from(r.sport_mask))
        .body("ARFS_RULE_OFF_DST_PORT", 2, u64::from(r.dport))
        .body("ARFS_RULE_OFF_DST_PORT_MASK", 2, u64::from(r.dport_mask));
    b.decodes_to(Request::RuleSet(r));

    // The largest location is one below ARFS_RULE_LOC_MAX.
    let max = p.val::<u32>("ARFS_RULE_LOC_MAX") - 1;
    let mut b = Built::new(p, "ARFS_OP_RULE_SET", 2, 0, 0, p.off("ARFS_RULE_SET_BODY_LEN"));
    b.body("ARFS_RULE_OFF_LOCATION", 4, u64::from(max))
        .body("ARFS_RULE_OFF_ACTION", 1, p.get("ARFS_RULE_ACTION_DROP"))
        .body("ARFS_RULE_OFF_IP_VERSION", 1, 4)
        .body("ARFS_RULE_OFF_L4_PROTO", 1, 6);
    let want = RuleSpec { action: RuleAction::Drop, ..RuleSpec::any(max, IpVersion::V4, L4Proto::Tcp, 0) };
    b.decodes_to(Request::RuleSet(want));

    let mut b = Built::new(p, "ARFS_OP_RULE_SET", 4, 0, 0, p.off("ARFS_RULE_SET_BODY_LEN"));
    b.body("ARFS_RULE_OFF_LOCATION", 4, 5)
        .body("ARFS_RULE_OFF_RXQ", 2, 1)
        .body("ARFS_RULE_OFF_FLAGS", 1, p.get("ARFS_RULE_FLAG_RSS"))
        .body("ARFS_RULE_OFF_CONTEXT", 2, 3)
        .body("ARFS_RULE_OFF_IP_VERSION", 1, 6)
        .body("ARFS_RULE_OFF_L4_PROTO", 1, 6);
    let want = RuleSpec { context: Some(3), ..RuleSpec::any(5, IpVersion::V6, L4Proto::Tcp, 1) };
    b.decodes_to(Request::RuleSet(want));

    let mut b = Built::new(p, "ARFS_OP_RULE_DEL", 3, 0, 0, p.off("ARFS_RULE_DEL_BODY_LEN"));
    b.body("ARFS_RULE_DEL_OFF_LOCATION", 4, 0x0000_0042);
    b.decodes_to(Request::RuleDel { location: 0x42 });
}
