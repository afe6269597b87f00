//! Unit tests of `device::control` (kept apart to keep the module readable).

use super::*;

use crate::model::rss::{HashTypes, MICROSOFT_KEY};
use crate::wire::control::{DeviceMsg, RssConfig, RssSet};

const GUEST: [u8; 6] = [0x52, 0x54, 0, 1, 2, 3];

/// A sink holding the device's RSS and capturing what the device sends.
struct RssSink {
    rss: Mutex<Option<Arc<Rss>>>,
    /// RSS contexts: a NIC model of 4 queues with contexts 1-3.
    nic: crate::model::nic::Nic,
    frames: Mutex<Vec<Vec<u8>>>,
    pairs: Mutex<Vec<u16>>,
}

impl ControlSink for RssSink {
    fn send(&self, pair: u16, frame: &[u8]) -> Result<u16, RxError> {
        self.frames.lock().unwrap().push(frame.to_vec());
        self.pairs.lock().unwrap().push(pair);
        Ok(pair)
    }
    fn rss(&self) -> Option<Arc<Rss>> {
        self.rss.lock().unwrap().clone()
    }
    fn set_rss(&self, rss: Rss) {
        *self.rss.lock().unwrap() = Some(Arc::new(rss));
    }
    fn set_context(&self, id: u32, key: Option<&[u8]>, indir: Option<&[u16]>) -> Result<(), ContextError> {
        self.nic.set_context(id, key, indir)
    }
    fn delete_context(&self, id: u32) -> Result<(), ContextError> {
        self.nic.delete_context(id)
    }
    fn has_context(&self, id: u32) -> bool {
        self.nic.has_context(id)
    }
}

fn runtime(with_rss: bool) -> (Arc<ControlRuntime>, Arc<RssSink>) {
    let rss = with_rss.then(|| Arc::new(Rss::new(&MICROSOFT_KEY, HashTypes::ALL, 128, 4).unwrap()));
    let nic_profile =
        Profile::parse("name = \"ctx-test\"\n[rss]\nmax_contexts = 4\n[filter]\nlayout = \"shared\"\ncapacity = 64\n")
            .unwrap();
    let nic = crate::model::nic::Nic::new(&nic_profile, 4).unwrap();
    let sink = Arc::new(RssSink { rss: Mutex::new(rss), nic, frames: Mutex::new(vec![]), pairs: Mutex::new(vec![]) });
    let p = Profile::parse("name = \"rss-test\"\n[filter]\nlayout = \"shared\"\ncapacity = 1024\n").unwrap();
    let table = Arc::new(FilterTable::new(p.filter.layout, p.filter.capacity));
    let rt = ControlRuntime::new(&p, table, 4, Clock::new(), sink.clone()).unwrap();
    (rt, sink)
}

/// Send `req` (in protocol `version`) and return the header and completion of the
/// answer (RSS requests are answered at once, on the calling thread).
fn ask(rt: &ControlRuntime, sink: &RssSink, version: u8, req: &Request) -> (Header, CompletionMsg) {
    let mut f = wire::encode_request(GUEST, 77, req);
    f[wire::ETH_HLEN] = version;
    let before = sink.frames.lock().unwrap().len();
    rt.handle_frame(2, &f);
    let frames = sink.frames.lock().unwrap();
    assert_eq!(frames.len(), before + 1, "one answer to {req}");
    let (h, m) = wire::decode_device_frame(&frames[before]).unwrap();
    let DeviceMsg::Completion(c) = m else { panic!("not a completion: {m:?}") };
    assert_eq!((c.seq, c.req_op), (77, req.op()));
    (h, c)
}

fn get(rt: &ControlRuntime, sink: &RssSink) -> RssConfig {
    let (_, c) = ask(rt, sink, wire::VERSION, &Request::RssGet);
    assert_eq!(c.status, 0);
    let CompletionBody::Rss(r) = c.body else { panic!("no RSS body: {c:?}") };
    r
}

fn set(hfunc: u8, key: Vec<u8>, indir: Vec<u16>) -> Request {
    Request::RssSet(RssSet { hfunc, key, indir })
}

#[test]
fn rss_get_shows_the_device_configuration() {
    let (rt, sink) = runtime(true);
    let r = get(&rt, &sink);
    assert_eq!((r.hfunc, r.queues, &r.key[..]), (wire::RSS_HFUNC_TOEPLITZ, 4, &MICROSOFT_KEY[..]));
    assert_eq!(r.indir, (0..128).map(|i| i % 4).collect::<Vec<u16>>());
}

#[test]
fn rss_set_changes_the_device_live_and_reads_back() {
    let (rt, sink) = runtime(true);
    let (_, c) = ask(&rt, &sink, wire::VERSION, &set(wire::RSS_HFUNC_TOEPLITZ, vec![], vec![0; 128]));
    assert_eq!((c.status, c.body), (0, CompletionBody::None));
    assert_eq!(get(&rt, &sink).indir, vec![0; 128]);
    assert_eq!(sink.rss().unwrap().indirection(), &[0; 128][..], "the device's own RSS changed");
    let key: Vec<u8> = (100..140).collect();
    assert_eq!(ask(&rt, &sink, wire::VERSION, &set(0, key.clone(), vec![])).1.status, 0);
    let r = get(&rt, &sink);
    assert_eq!((r.key, r.indir), (key, vec![0; 128]), "the table stays when only the key changes");
    // Nothing to change is fine too.
    assert_eq!(ask(&rt, &sink, wire::VERSION, &set(0, vec![], vec![])).1.status, 0);
    assert_eq!(rt.snapshot().frames.requests["rss_set"], 3);
}

#[test]
fn rss_set_bad_input_gets_the_errno_and_changes_nothing() {
    let (rt, sink) = runtime(true);
    let before = get(&rt, &sink);
    let einval = libc::EINVAL as u16;
    let mut bad_queue = vec![0u16; 128];
    bad_queue[100] = 4;
    let cases: [(Request, u16, &str); 6] = [
        (set(1, vec![7; 39], vec![]), einval, "rss_bad_key_len"),
        (set(1, vec![7; 41], vec![]), einval, "rss_bad_key_len"),
        (set(1, vec![], vec![0; 64]), einval, "rss_bad_indir_size"),
        (set(1, vec![7; 40], bad_queue), einval, "rss_bad_queue"),
        (set(2, vec![], vec![0; 128]), libc::EOPNOTSUPP as u16, "rss_bad_hfunc"),
        (set(4, vec![7; 40], vec![]), libc::EOPNOTSUPP as u16, "rss_bad_hfunc"),
    ];
    for (req, errno, kind) in cases {
        let (h, c) = ask(&rt, &sink, wire::VERSION, &req);
        assert_eq!((c.status, h.version, c.body), (errno, wire::VERSION, CompletionBody::None), "{req}");
        assert_eq!(get(&rt, &sink), before, "{req} changed the device");
        assert!(rt.snapshot().frames.bad_by_kind[kind] > 0, "{kind}");
    }
    // Oversized in the frame itself: the codec refuses it (EINVAL) before the device.
    let mut f = wire::encode_request(GUEST, 78, &set(1, vec![], vec![]));
    f[wire::ETH_HLEN + wire::HDR_LEN + 2..][..2].copy_from_slice(&65u16.to_be_bytes());
    rt.handle_frame(0, &f);
    let (_, m) = wire::decode_device_frame(sink.frames.lock().unwrap().last().unwrap()).unwrap();
    let DeviceMsg::Completion(c) = m else { panic!() };
    assert_eq!((c.seq, c.status), (78, einval));
    assert_eq!(get(&rt, &sink), before);
}

#[test]
fn rss_ops_without_rss_or_in_version_1() {
    let (rt, sink) = runtime(false);
    let e = libc::EOPNOTSUPP as u16;
    assert_eq!(ask(&rt, &sink, wire::VERSION, &Request::RssGet).1.status, e);
    assert_eq!(ask(&rt, &sink, wire::VERSION, &set(1, vec![], vec![0; 128])).1.status, e);
    // A version 1 peer: the RSS ops do not exist, other ops are answered in version 1.
    let (rt, sink) = runtime(true);
    let (h, c) = ask(&rt, &sink, 1, &Request::RssGet);
    assert_eq!((h.version, c.status), (1, e));
    let (h, c) = ask(&rt, &sink, 1, &Request::Hello);
    assert_eq!((h.version, c.status), (1, 0));
    let (h, c) = ask(&rt, &sink, wire::VERSION, &Request::Hello);
    assert_eq!((h.version, c.status), (wire::VERSION, 0));
    // An unknown version is answered with EPROTO in the newest version.
    let (h, c) = ask(&rt, &sink, wire::VERSION + 1, &Request::Hello);
    assert_eq!((h.version, c.status), (wire::VERSION, libc::EPROTO as u16));
    // So is a truncated header, whose version was never checked (found by the fuzzer).
    let mut f = wire::encode_request(GUEST, 1, &Request::Hello);
    f[wire::ETH_HLEN] = 0x7a;
    rt.handle_frame(0, &f[..wire::ETH_HLEN + 10]);
    let last = sink.frames.lock().unwrap().last().unwrap().clone();
    let (h, m) = wire::decode_device_frame(&last).unwrap();
    let DeviceMsg::Completion(c) = m else { panic!("{m:?}") };
    assert_eq!((h.version, c.status), (wire::VERSION, libc::EINVAL as u16));
}

#[test]
fn configuration_completions_go_to_queue_0_filter_commands_stay_near_the_requester() {
    let (rt, sink) = runtime(true);
    // `ask` sends from pair 2.
    ask(&rt, &sink, wire::VERSION, &Request::RssGet);
    ask(&rt, &sink, wire::VERSION, &Request::Hello);
    ask(&rt, &sink, wire::VERSION, &Request::DevStats);
    assert_eq!(*sink.pairs.lock().unwrap(), [0, 0, 0]);
    for op in [wire::op::ADD, wire::op::MOD, wire::op::DEL] {
        assert_eq!(reply_pair(op, 3), 3);
    }
    for op in [wire::op::HELLO, wire::op::FLUSH, wire::op::QUERY, wire::op::RSS_SET, 0x0b, 0xff] {
        assert_eq!(reply_pair(op, 3), EVENT_PAIR);
    }
}

#[test]
fn user_rules_are_set_deleted_flushed_and_counted() {
    use crate::wire::rule::{RuleSpec, RULE_LOC_ALL};
    use crate::wire::{FlowKey, IpVersion, L4Proto};
    let (rt, sink) = runtime(true);
    let table = rt.table();
    let mut r = RuleSpec::any(3, IpVersion::V4, L4Proto::Udp, 2);
    r.dport = 5201;
    r.dport_mask = 0xffff;
    let status = |v: u8, req: &Request| ask(&rt, &sink, v, req).1.status;
    assert_eq!(status(wire::VERSION, &Request::RuleSet(r)), 0);
    let flow = FlowKey::v4(L4Proto::Udp, [10, 99, 0, 3], 4000, [10, 99, 0, 2], 5201);
    assert_eq!(table.lookup_user(&flow), Some((3, Action::Queue(2))));
    assert_eq!(table.lookup_user(&FlowKey { dport: 5202, ..flow }), None);
    // Queue beyond the device, unknown location, a version 2 peer.
    let einval = libc::EINVAL as u16;
    let bad = RuleSpec { action: crate::wire::rule::RuleAction::Queue(4), ..r };
    assert_eq!(status(wire::VERSION, &Request::RuleSet(bad)), einval);
    assert_eq!(status(wire::VERSION, &Request::RuleDel { location: 9 }), libc::ENOENT as u16);
    let (_, c) = ask(&rt, &sink, wire::VERSION, &Request::DevStats);
    let CompletionBody::DevStats(e) = c.body else { panic!("{c:?}") };
    assert!(e.contains(&(wire::dev_counter::USER_RULES, 1)), "{e:?}");
    assert!(e.contains(&(wire::dev_counter::USER_RULE_HITS, 1)), "{e:?}");
    // All configuration completions went to queue 0.
    assert!(sink.pairs.lock().unwrap().iter().all(|&p| p == 0));
    assert_eq!(status(2, &Request::RuleSet(r)), libc::EOPNOTSUPP as u16);
    assert_eq!(status(wire::VERSION, &Request::RuleDel { location: 3 }), 0);
    assert_eq!(table.lookup_user(&flow), None);
    for loc in [1, 2] {
        assert_eq!(status(wire::VERSION, &Request::RuleSet(RuleSpec { location: loc, ..r })), 0);
    }
    assert_eq!(status(wire::VERSION, &Request::RuleDel { location: RULE_LOC_ALL }), 0);
    assert!(table.user_rules().0.is_empty());
    // A device reset forgets them too.
    assert_eq!(status(wire::VERSION, &Request::RuleSet(r)), 0);
    rt.reset();
    assert!(table.user_rules().0.is_empty());
}

#[test]
fn hash_fields_read_change_keep_and_refuse() {
    use crate::wire::hash::{HashMsg, HASH_KEEP};
    let (rt, sink) = runtime(true);
    let hash = |rt: &ControlRuntime| {
        let (_, c) = ask(rt, &sink, wire::VERSION, &Request::HashGet);
        let CompletionBody::Hash(m) = c.body else { panic!("{c:?}") };
        m
    };
    assert_eq!(hash(&rt), HashMsg { fields: [0xf0, 0xf0, 0x30, 0xf0, 0xf0, 0x30], xfrm: 0 });
    let status = |req: HashMsg| ask(&rt, &sink, wire::VERSION, &Request::HashSet(req)).1.status;
    // tcp4 to sd, the rest kept; then sym-xor alone.
    assert_eq!(
        status(HashMsg { fields: [0x30, HASH_KEEP, HASH_KEEP, HASH_KEEP, HASH_KEEP, HASH_KEEP], xfrm: 0xff }),
        0
    );
    assert_eq!(status(HashMsg { xfrm: 1, ..HashMsg::KEEP }), 0);
    assert_eq!(hash(&rt), HashMsg { fields: [0x30, 0xf0, 0x30, 0xf0, 0xf0, 0x30], xfrm: 1 });
    assert_eq!(sink.rss().unwrap().hash_fields().tcp4, 0x30, "the device hashes with it");
    // Refused, nothing changed: src only under sym-xor, ports for ip4, xfrm 2.
    let einval = libc::EINVAL as u16;
    assert_eq!(
        status(HashMsg { fields: [0x10, HASH_KEEP, HASH_KEEP, HASH_KEEP, HASH_KEEP, HASH_KEEP], xfrm: 0xff }),
        einval
    );
    assert_eq!(
        status(HashMsg { fields: [HASH_KEEP, HASH_KEEP, 0xf0, HASH_KEEP, HASH_KEEP, HASH_KEEP], xfrm: 0 }),
        einval
    );
    assert_eq!(status(HashMsg { xfrm: 2, ..HashMsg::KEEP }), libc::EOPNOTSUPP as u16);
    assert_eq!(hash(&rt).fields[0], 0x30);
    assert!(sink.pairs.lock().unwrap().iter().all(|&p| p == 0));
    assert_eq!(ask(&rt, &sink, 2, &Request::HashGet).1.status, libc::EOPNOTSUPP as u16);
    let (rt, sink) = runtime(false);
    assert_eq!(ask(&rt, &sink, wire::VERSION, &Request::HashGet).1.status, libc::EOPNOTSUPP as u16);
}

#[test]
fn tags_round_trip() {
    assert_eq!(untag(tag(3, 0xffff_fffe, false)), (3, 0xffff_fffe, false));
    assert_eq!(untag(tag(u16::MAX, 0, true)), (u16::MAX, 0, true));
}

fn ctx_set(context: u32, key: Vec<u8>, indir: Vec<u16>) -> Request {
    Request::CtxSet { context, set: RssSet { hfunc: 0, key, indir } }
}

#[test]
fn rss_contexts_are_created_changed_and_removed_with_the_errnos_of_a_driver() {
    let (rt, sink) = runtime(true);
    let ok = |req: &Request| ask(&rt, &sink, wire::VERSION, req).1.status;
    // A new context without key or table: the profile's key, the spread table.
    assert_eq!(ok(&ctx_set(2, vec![], vec![])), 0);
    let c = sink.nic.contexts();
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].0, c[0].1.toeplitz().key()), (2, &MICROSOFT_KEY[..]));
    assert_eq!(c[0].1.indirection(), (0..128).map(|i| i % 4).collect::<Vec<u16>>());
    // Its own key and table; the default context is untouched.
    let key: Vec<u8> = (1..41).collect();
    assert_eq!(ok(&ctx_set(2, key.clone(), vec![3; 128])), 0);
    assert_eq!(ok(&ctx_set(2, vec![], vec![1; 128])), 0);
    let c = sink.nic.contexts();
    assert_eq!((c[0].1.toeplitz().key(), c[0].1.indirection()), (&key[..], &[1u16; 128][..]));
    assert_eq!(get(&rt, &sink).indir, (0..128).map(|i| i % 4).collect::<Vec<u16>>());
    // Refusals change nothing.
    let einval = libc::EINVAL as u16;
    let mut bad_queue = vec![0u16; 128];
    bad_queue[7] = 4;
    for (req, errno) in [
        (ctx_set(0, vec![], vec![]), einval),
        (ctx_set(4, vec![], vec![]), libc::ENOSPC as u16),
        (ctx_set(2, vec![9; 39], vec![]), einval),
        (ctx_set(2, vec![], vec![0; 64]), einval),
        (ctx_set(2, vec![], bad_queue), einval),
        (Request::CtxSet { context: 2, set: RssSet { hfunc: 2, key: vec![], indir: vec![] } }, libc::EOPNOTSUPP as u16),
        (Request::CtxDel { context: 3 }, libc::ENOENT as u16),
    ] {
        assert_eq!(ok(&req), errno, "{req}");
    }
    assert_eq!(sink.nic.contexts()[0].1.indirection(), &[1u16; 128][..]);
    // A version 3 peer has no contexts.
    assert_eq!(ask(&rt, &sink, 3, &ctx_set(1, vec![], vec![])).1.status, libc::EOPNOTSUPP as u16);
    assert_eq!(ok(&Request::CtxDel { context: 2 }), 0);
    assert!(sink.nic.contexts().is_empty());
    let s = rt.snapshot().frames;
    // 3 accepted, 6 refused; the version 3 one is an unknown op.
    assert_eq!((s.requests["ctx_set"], s.requests["ctx_del"]), (9, 2));
    assert_eq!((s.bad_by_kind["ctx_bad_id"], s.bad_by_kind["ctx_no_space"], s.bad_by_kind["ctx_unknown"]), (1, 1, 1));
}

#[test]
fn a_device_without_contexts_refuses_them() {
    let p = Profile::parse("name = \"no-ctx\"\n[filter]\nlayout = \"shared\"\ncapacity = 64\n").unwrap();
    let nic = crate::model::nic::Nic::new(&p, 4).unwrap();
    assert_eq!(nic.set_context(1, None, None).unwrap_err().errno, libc::EOPNOTSUPP);
    assert_eq!(nic.delete_context(1).unwrap_err().errno, libc::EOPNOTSUPP);
}
