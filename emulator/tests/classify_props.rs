//! Property test of the datapath's classify call, `Classifier::decide_frame`: its fast
//! path (flow key straight from the frame, RSS on the 4-tuple, the filter table; no
//! `PacketInfo`) must give the decision `Classifier::classify_frame` gives and count the
//! same — per-queue and device counters, per-rule hits and bytes, user-rule hits — on
//! every frame, whatever the filters, their actions, the enabled queues, the RSS hash
//! fields and the user rules.

use arfsnic::model::filter::Action;
use arfsnic::model::nic::Nic;
use arfsnic::model::profile::{DisabledQueue, Profile};
use arfsnic::model::rss::HashFields;
use arfsnic::wire::rule::{RuleAction, RuleSpec};
use arfsnic::wire::{FlowKey, IpVersion, L4Proto};
use etherparse::PacketBuilder;
use proptest::prelude::*;

const QUEUES: u16 = 4;
const FLOWS: u16 = 12;

fn key(flow: u16) -> FlowKey {
    // Four flow types, three flows each.
    let proto = if flow.is_multiple_of(2) { L4Proto::Tcp } else { L4Proto::Udp };
    let port = 1000 + flow;
    if flow % 4 < 2 {
        FlowKey::v4(proto, [10, 0, 0, flow as u8], port, [10, 0, 1, 2], 80)
    } else {
        FlowKey::v6(proto, [0x20; 16], port, [0x30; 16], 443)
    }
}

fn frame(k: &FlowKey, vlan: bool, payload: usize) -> Vec<u8> {
    let eth = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
    let ip = match (vlan, k.version) {
        (true, IpVersion::V4) => eth.single_vlan(7.try_into().unwrap()).ipv4(
            k.src[..4].try_into().unwrap(),
            k.dst[..4].try_into().unwrap(),
            64,
        ),
        (false, IpVersion::V4) => eth.ipv4(k.src[..4].try_into().unwrap(), k.dst[..4].try_into().unwrap(), 64),
        (true, IpVersion::V6) => eth.single_vlan(7.try_into().unwrap()).ipv6(k.src, k.dst, 64),
        (false, IpVersion::V6) => eth.ipv6(k.src, k.dst, 64),
    };
    let mut v = Vec::new();
    let body = vec![0u8; payload];
    match k.proto {
        L4Proto::Tcp => ip.tcp(k.sport, k.dport, 1, 1000).write(&mut v, &body).unwrap(),
        L4Proto::Udp => ip.udp(k.sport, k.dport).write(&mut v, &body).unwrap(),
    }
    v
}

#[derive(Clone, Debug)]
enum Fields {
    /// Every profile's default: the 4-tuple for TCP and UDP.
    Default,
    /// Addresses only for one flow type (the general hash-input builder).
    AddressesOnly(usize),
    /// Source and destination XORed first.
    SymXor,
}

#[derive(Clone, Debug)]
struct Setup {
    /// (flow, action: 0..QUEUES+2 a queue — the last two out of range — or drop).
    filters: Vec<(u16, u16)>,
    enabled: Vec<bool>,
    disabled_queue_rss: bool,
    fields: Fields,
    /// A user rule on the source port of one flow, to this queue.
    user_rule: Option<(u16, u16)>,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        prop::collection::vec((0..FLOWS, 0..QUEUES + 3), 0..10),
        prop::collection::vec(prop::bool::weighted(0.8), QUEUES as usize),
        any::<bool>(),
        prop_oneof![4 => Just(Fields::Default), 1 => (0usize..4).prop_map(Fields::AddressesOnly), 1 => Just(Fields::SymXor)],
        prop_oneof![3 => Just(None), 1 => (0..FLOWS, 0..QUEUES).prop_map(Some)],
    )
        .prop_map(|(filters, enabled, disabled_queue_rss, fields, user_rule)| Setup {
            filters,
            enabled,
            disabled_queue_rss,
            fields,
            user_rule,
        })
}

fn nic(s: &Setup) -> Nic {
    let mut p = Profile::ideal();
    p.filter.disabled_queue = if s.disabled_queue_rss { DisabledQueue::Rss } else { DisabledQueue::Drop };
    let nic = Nic::new(&p, QUEUES).unwrap();
    let rss = nic.rss();
    let mut f = rss.hash_fields();
    match s.fields {
        Fields::Default => {}
        Fields::AddressesOnly(i) => {
            let set = [&mut f.tcp4, &mut f.udp4, &mut f.tcp6, &mut f.udp6];
            *set.into_iter().nth(i).unwrap() = HashFields::IP_SRC | HashFields::IP_DST;
        }
        Fields::SymXor => f.sym_xor = true,
    }
    nic.set_rss(rss.with_hash_fields(f).unwrap());
    for (id, &(flow, a)) in s.filters.iter().enumerate() {
        let action = if a == QUEUES + 2 { Action::Drop } else { Action::Queue(a) };
        // A second filter on the same flow is refused, as the device refuses it.
        let _ = nic.table().insert(id as u32, key(flow), action, 0);
    }
    nic.set_enabled_queues(&s.enabled);
    if let Some((flow, q)) = s.user_rule {
        let k = key(flow);
        let spec = RuleSpec {
            location: 3,
            action: RuleAction::Queue(q),
            context: None,
            version: k.version,
            proto: k.proto,
            src: [0; 16],
            src_mask: [0; 16],
            dst: [0; 16],
            dst_mask: [0; 16],
            sport: k.sport,
            sport_mask: 0xffff,
            dport: 0,
            dport_mask: 0,
        };
        nic.table().set_user_rule(spec).unwrap();
    }
    nic
}

/// A frame of one of the flows, perhaps tagged, perhaps cut short or with a byte
/// overwritten (frames the fast path declines).
fn frames() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let one = (
        0..FLOWS,
        any::<bool>(),
        0usize..40,
        prop::option::weighted(0.2, (any::<prop::sample::Index>(), any::<u8>())),
        prop::option::weighted(0.1, any::<prop::sample::Index>()),
    )
        .prop_map(|(flow, vlan, payload, edit, cut)| {
            let mut f = frame(&key(flow), vlan, payload);
            if let Some((at, b)) = edit {
                let i = at.index(f.len());
                f[i] = b;
            }
            if let Some(at) = cut {
                f.truncate(at.index(f.len()));
            }
            f
        });
    prop::collection::vec(one, 1..64)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn decide_frame_decides_and_counts_as_classify_frame(s in setup(), frames in frames()) {
        let (fast, full) = (nic(&s), nic(&s));
        let (cf, cs) = (fast.classifier(), full.classifier());
        for (i, f) in frames.iter().enumerate() {
            let now = i as u64 * 1000;
            let a = cf.decide_frame(f, now);
            let b = cs.classify_frame(f, now).map(|(_, d)| d);
            prop_assert_eq!(a, b, "frame {} {:02x?}", i, f);
            if let Ok(d) = a {
                fast.record(&d, f.len(), true);
                full.record(&d, f.len(), true);
            }
        }
        drop((cf, cs));
        prop_assert_eq!(fast.snapshot(), full.snapshot());
        prop_assert_eq!(fast.table().rules(), full.table().rules());
        prop_assert_eq!(fast.table().user_rules(), full.table().user_rules());
    }
}

/// The fast path is taken where it should be: a clean TCP frame with the default fields
/// and no user rule hits its filter and counts it.
#[test]
fn a_clean_frame_hits_its_filter() {
    let s = Setup {
        filters: vec![(0, 2)],
        enabled: vec![true; 4],
        disabled_queue_rss: false,
        fields: Fields::Default,
        user_rule: None,
    };
    let n = nic(&s);
    let d = n.classifier().decide_frame(&frame(&key(0), false, 10), 5).unwrap();
    assert_eq!((d.queue, d.filter), (Some(2), Some(0)));
    let r = &n.table().rules()[0];
    assert_eq!((r.hits, r.last_active_ns), (1, 5));
}
