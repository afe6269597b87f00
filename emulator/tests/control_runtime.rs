//! The control-plane runtime driven through real encoded request frames, with a sink that
//! captures the device's frames (queue pair, wall-clock arrival, bytes).

use arfsnic::device::clock::Clock;
use arfsnic::device::control::{ControlRuntime, ControlSink, Schedule};
use arfsnic::device::{ControlPlane, EmulatedNic};
use arfsnic::model::engine::Fault;
use arfsnic::model::filter::FilterTable;
use arfsnic::model::nic::Nic;
use arfsnic::model::profile::Profile;
use arfsnic::vhost::{DeviceHooks, RxError};
use arfsnic::wire::control::{
    self as wire, counter, op, AddRequest, CompletionBody, CompletionMsg, DeviceMsg, EventMsg, Header, Request,
};
use arfsnic::wire::{FlowKey, L4Proto};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const GUEST: [u8; 6] = [0x52, 0x54, 0x00, 0xab, 0xcd, 0xef];
const US: u64 = 1_000;

#[derive(Clone, Debug)]
struct Captured {
    pair: u16,
    at_ns: u64,
    frame: Vec<u8>,
}

struct Capture {
    clock: Clock,
    frames: Mutex<Vec<Captured>>,
    cv: Condvar,
    no_buffers: AtomicBool,
}

impl Capture {
    fn new(clock: Clock) -> Arc<Self> {
        Arc::new(Capture { clock, frames: Mutex::new(vec![]), cv: Condvar::new(), no_buffers: AtomicBool::new(false) })
    }

    /// Wait for the first captured frame at index >= `from` that `pred` accepts.
    fn wait<F: Fn(&Captured) -> bool>(&self, from: usize, pred: F) -> Captured {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut g = self.frames.lock().unwrap();
        loop {
            if let Some(c) = g.iter().skip(from).find(|c| pred(c)) {
                return c.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "timed out waiting for a device frame; have {} frames", g.len());
            g = self.cv.wait_timeout(g, left).unwrap().0;
        }
    }

    /// Wait for the completion of request `seq`.
    fn completion(&self, seq: u32) -> (Captured, CompletionMsg) {
        let c = self.wait(0, |c| matches!(decode(c), DeviceMsg::Completion(m) if m.seq == seq));
        let DeviceMsg::Completion(m) = decode(&c) else { unreachable!() };
        (c, m)
    }

    fn len(&self) -> usize {
        self.frames.lock().unwrap().len()
    }

    fn all(&self) -> Vec<Captured> {
        self.frames.lock().unwrap().clone()
    }
}

impl ControlSink for Capture {
    fn send(&self, pair: u16, frame: &[u8]) -> Result<u16, RxError> {
        if self.no_buffers.load(Ordering::Relaxed) {
            return Err(RxError::NoBuffers);
        }
        let at_ns = self.clock.now_ns();
        self.frames.lock().unwrap().push(Captured { pair, at_ns, frame: frame.to_vec() });
        self.cv.notify_all();
        Ok(pair)
    }
}

/// Completions go to the guest MAC; events go to it once it is known and are broadcast
/// before that (a scheduled fault at 0 ms can fire before the test sets the MAC).
fn decode(c: &Captured) -> DeviceMsg {
    let f = &c.frame;
    assert_eq!(&f[6..12], &wire::DEVICE_MAC);
    assert!(f.len() >= wire::MIN_FRAME_LEN);
    let msg = wire::decode_device_frame(f).expect("the device sends well-formed frames").1;
    match msg {
        DeviceMsg::Completion(_) => assert_eq!(&f[0..6], &GUEST, "completions go to the guest MAC"),
        DeviceMsg::Event { .. } => {
            assert!(f[0..6] == GUEST || f[0..6] == wire::BROADCAST_MAC, "event to {:02x?}", &f[0..6])
        }
    }
    msg
}

fn profile(extra: &str) -> Profile {
    Profile::parse(&format!("name = \"test-profile\"\n{extra}")).unwrap()
}

const SHARED_1K: &str = "[filter]\nlayout = \"shared\"\ncapacity = 100000\n";

struct Rig {
    rt: Arc<ControlRuntime>,
    cap: Arc<Capture>,
    clock: Clock,
}

fn rig(p: &Profile, pairs: u16) -> Rig {
    rig_with(p, pairs, Schedule::FromStart)
}

fn rig_with(p: &Profile, pairs: u16, schedule: Schedule) -> Rig {
    let clock = Clock::new();
    let cap = Capture::new(clock);
    let table = Arc::new(FilterTable::new(p.filter.layout, p.filter.capacity));
    let rt = ControlRuntime::with_schedule(p, table, pairs, clock, cap.clone(), schedule).unwrap();
    Rig { rt, cap, clock }
}

impl Rig {
    fn send(&self, pair: u16, seq: u32, req: &Request) {
        self.rt.on_control_frame(pair, &wire::encode_request(GUEST, seq, req));
    }

    /// Send and wait for the completion.
    fn call(&self, pair: u16, seq: u32, req: &Request) -> (Captured, CompletionMsg) {
        self.send(pair, seq, req);
        self.cap.completion(seq)
    }
}

fn key(i: u32) -> FlowKey {
    FlowKey::v4(L4Proto::Udp, [10, 0, (i >> 8) as u8, i as u8], 9000 + (i % 1000) as u16, [10, 0, 0, 2], 7000)
}

fn add(id: u32, rxq: u16, k: FlowKey) -> Request {
    Request::Add(AddRequest { filter_id: id, rxq, key: k })
}

#[test]
fn held_schedule_starts_when_armed() {
    // Disabled (EPERM) from 0 ms to 300 ms after the schedule starts.
    let sched =
        "[[faults.schedule]]\nat_ms = 0\naction = \"disable\"\n[[faults.schedule]]\nat_ms = 300\naction = \"enable\"\n";
    let p = profile(&format!("{SHARED_1K}{sched}"));
    let status = |r: &Rig, seq: u32| r.call(0, seq, &add(seq, 0, key(seq))).1.status;
    let from_start = rig(&p, 1);
    from_start.rt.set_guest_mac(GUEST);
    assert_eq!(status(&from_start, 1), libc::EPERM as u16, "FromStart: disabled at once");
    let held = rig_with(&p, 1, Schedule::Held);
    held.rt.set_guest_mac(GUEST);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(status(&held, 1), 0, "held: the disable at 0 ms has not fired");
    held.rt.arm_schedule();
    assert_eq!(status(&held, 2), libc::EPERM as u16, "armed: disabled from now");
    let t = Instant::now();
    let mut seq = 3;
    while status(&held, seq) != 0 {
        seq += 1;
        assert!(t.elapsed() < Duration::from_secs(5), "never enabled again");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(t.elapsed() >= Duration::from_millis(250), "enabled after {:?}", t.elapsed());
}

#[test]
fn hello_answers_caps_on_queue_0() {
    let p = profile("[filter]\nlayout = \"per-type\"\ncapacity = 1024\n");
    let r = rig(&p, 4);
    let (c, m) = r.call(2, 77, &Request::Hello);
    assert_eq!(c.pair, 0, "configuration completions go to queue 0 (docs/control-protocol.md §3.5)");
    assert_eq!(c.frame[15], op::COMPLETION | op::HELLO);
    assert_eq!((m.status, m.enqueue_ns, m.start_ns), (0, m.finish_ns, m.finish_ns));
    let CompletionBody::Caps(caps) = m.body else { panic!("HELLO completion without CAPS") };
    assert_eq!(caps.queue_pairs, 4);
    assert_eq!(caps.layout, wire::LAYOUT_PER_TYPE);
    assert_eq!(caps.capacity, [1024; 4]);
    assert_eq!(caps.profile, "test-profile");
    let shared = rig(&profile("[filter]\nlayout = \"shared\"\ncapacity = 7\n"), 1);
    let (_, m) = shared.call(0, 1, &Request::Hello);
    let CompletionBody::Caps(caps) = m.body else { panic!() };
    assert_eq!((caps.layout, caps.capacity), (wire::LAYOUT_SHARED, [7; 4]));
}

#[test]
fn add_waits_for_the_profile_latency_in_wall_clock_time() {
    let p = profile(&format!("{SHARED_1K}[engine.latency]\nadd = {{ dist = \"fixed\", us = 50 }}\n"));
    let r = rig(&p, 4);
    let mut late = Vec::new();
    for i in 0..200u32 {
        let t0 = r.clock.now_ns();
        let (c, m) = r.call((i % 4) as u16, i, &add(i, (i % 4) as u16, key(i)));
        assert_eq!((m.req_op, m.status), (op::ADD, 0));
        assert_eq!(c.pair, (i % 4) as u16, "completion on the requesting pair's RX queue");
        assert!(t0 <= m.enqueue_ns && m.enqueue_ns <= m.start_ns && m.start_ns <= m.finish_ns);
        assert_eq!(m.finish_ns - m.start_ns, 50 * US);
        assert!(c.at_ns >= t0 + 50 * US, "completion {} ns after the request", c.at_ns - t0);
        assert!(c.at_ns >= m.finish_ns);
        late.push(c.at_ns - m.finish_ns);
    }
    late.sort_unstable();
    let (p50, p90, max) = (late[100], late[180], late[199]);
    eprintln!("completion sent after finish_ns: p50 {} us, p90 {} us, max {} us", p50 / US, p90 / US, max / US);
    assert!(p50 < 1_000 * US, "the timer thread oversleeps: p50 {p50} ns");
    assert_eq!(r.rt.snapshot().filter.adds, 200);
}

#[test]
fn rule_is_visible_only_after_its_completion() {
    // 200 ms: long enough that a descheduled test thread on a loaded machine still checks
    // before the completion.
    let p = profile(&format!("{SHARED_1K}[engine.latency]\nadd = {{ dist = \"fixed\", us = 200000 }}\n"));
    let r = rig(&p, 2);
    let table = r.rt.table();
    let t0 = r.clock.now_ns();
    r.send(1, 5, &add(42, 1, key(1)));
    assert!(!table.contains_id(42));
    assert_eq!(table.lookup(&key(1), 64, r.clock.now_ns()), None);
    assert!(r.clock.now_ns() - t0 < 200_000 * US, "checked before the latency elapsed");
    let (c, m) = r.cap.completion(5);
    assert_eq!((m.status, c.pair), (0, 1));
    assert!(c.at_ns - t0 >= 200_000 * US);
    assert!(table.contains_id(42));
    assert_eq!(table.lookup(&key(1), 64, r.clock.now_ns()).map(|x| x.0), Some(42));
    let rules = r.rt.rules();
    assert_eq!(rules.len(), 1);
    assert_eq!((rules[0].id, rules[0].queue, rules[0].hits), (42, Some(1), 1));
    assert_eq!(rules[0].installed_ns, m.finish_ns);
    assert_eq!(rules[0].flow, "udp 10.0.0.1:9001 10.0.0.2:7000");
}

#[test]
fn mod_del_flush_query() {
    let p = profile(&format!("{SHARED_1K}[engine.latency]\nadd = {{ dist = \"fixed\", us = 10 }}\n"));
    let r = rig(&p, 4);
    let table = r.rt.table();
    assert_eq!(r.call(0, 1, &add(1, 0, key(1))).1.status, 0);
    let q = |seq| r.call(3, seq, &Request::Query { filter_id: 1 }).1;
    let m = q(2);
    assert_eq!((m.req_op, m.status, m.body.clone()), (op::QUERY, 0, CompletionBody::Query { rxq: 0, hits: 0 }));
    table.lookup(&key(1), 100, r.clock.now_ns());
    table.lookup(&key(1), 100, r.clock.now_ns());
    assert_eq!(q(3).body, CompletionBody::Query { rxq: 0, hits: 2 });
    let m = r.call(2, 4, &Request::Mod { filter_id: 1, rxq: 3 }).1;
    assert_eq!((m.req_op, m.status), (op::MOD, 0));
    assert_eq!(q(5).body, CompletionBody::Query { rxq: 3, hits: 2 });
    assert_eq!(table.lookup(&key(1), 1, 0).map(|x| x.1), Some(arfsnic::model::filter::Action::Queue(3)));
    assert_eq!(r.call(1, 6, &Request::Mod { filter_id: 99, rxq: 1 }).1.status, libc::ENOENT as u16);
    let m = r.call(1, 7, &Request::Del { filter_id: 1 }).1;
    assert_eq!((m.req_op, m.status), (op::DEL, 0));
    let m = q(8);
    assert_eq!((m.status, m.body), (libc::ENOENT as u16, CompletionBody::None));
    assert_eq!(r.call(1, 9, &Request::Del { filter_id: 1 }).1.status, libc::ENOENT as u16);
    assert_eq!(r.call(0, 10, &add(2, 1, key(2))).1.status, 0);
    assert_eq!(r.call(0, 11, &add(3, 1, key(3))).1.status, 0);
    assert_eq!(r.call(0, 12, &add(4, 1, key(3))).1.status, libc::EEXIST as u16, "same flow twice");
    assert_eq!(table.len(), 2);
    let m = r.call(2, 13, &Request::Flush).1;
    assert_eq!((m.req_op, m.status), (op::FLUSH, 0));
    assert!(table.is_empty());
    settle(&r.rt, 13);
    let s = r.rt.snapshot();
    assert_eq!((s.filter.adds, s.filter.mods, s.filter.dels, s.filter.flushes, s.filter.queries), (3, 1, 1, 1, 3));
    assert_eq!(s.engine.ops["query"].submitted, 4);
    assert_eq!(s.filter.rejects["ENOENT"], 3);
    assert_eq!(s.filter.add_rejects["EEXIST"], 1);
    assert_eq!((s.filter.rules_now, s.filter.rules_peak), (0, 2));
    assert_eq!(s.frames.requests["query"], 4);
    assert_eq!(s.frames.completions_sent, 13);
}

#[test]
fn enospc_completions_equal_engine_rejects() {
    let p = profile(&format!(
        "{SHARED_1K}[engine]\nslots = 4\n[engine.latency]\nadd = {{ dist = \"fixed\", us = 2 }}\n\
         [faults]\nadd = {{ rate = 0.3, errno = \"ENOSPC\" }}\n"
    ));
    let r = rig(&p, 4);
    let n = 2000u32;
    for i in 0..n {
        r.send((i % 4) as u16, i, &add(i, (i % 4) as u16, key(i)));
    }
    // Wait for every completion.
    let deadline = Instant::now() + Duration::from_secs(20);
    while r.cap.len() < n as usize {
        assert!(Instant::now() < deadline, "only {} of {n} completions", r.cap.len());
        std::thread::sleep(Duration::from_millis(5));
    }
    let frames = r.cap.all();
    let mut enospc = 0u64;
    let mut ok = 0u64;
    for c in &frames {
        let DeviceMsg::Completion(m) = decode(c) else { panic!("unexpected event") };
        assert_eq!(u32::from(c.pair), m.seq % 4, "completion on the requesting pair");
        match m.status {
            0 => ok += 1,
            s if s == libc::ENOSPC as u16 => enospc += 1,
            s => panic!("status {s}"),
        }
    }
    let s = r.rt.snapshot();
    eprintln!("{enospc} of {n} ADDs failed with ENOSPC");
    assert!((n as u64 * 25 / 100..n as u64 * 35 / 100).contains(&enospc));
    assert_eq!(s.engine.ops["add"].errors["ENOSPC"], enospc);
    assert_eq!(s.filter.add_rejects["ENOSPC"], enospc);
    assert_eq!(s.partitions[0].rejects["ENOSPC"], enospc);
    assert_eq!(s.filter.adds, ok);
    assert_eq!(s.filter.rules_now as u64, ok);
}

#[test]
fn events_go_to_queue_zero() {
    let p = profile(&format!("{SHARED_1K}[aging]\nidle_ms = 20\nscan_ms = 5\n"));
    let r = rig(&p, 4);
    let is_event = |c: &Captured| matches!(decode(c), DeviceMsg::Event { .. });
    // Before the guest MAC is known, events are broadcast.
    r.rt.inject(Fault::Flush);
    let c = r.cap.wait(0, is_event);
    assert_eq!(decode(&c), DeviceMsg::Event { seq: 1, event: EventMsg::TableFlushed });
    assert_eq!(&c.frame[0..6], &wire::BROADCAST_MAC);
    // Then they are addressed to the guest MAC (known from the configuration, or learned
    // from requests).
    r.rt.set_guest_mac(GUEST);
    let n = r.cap.len();
    assert_eq!(r.call(3, 2, &add(9, 3, key(9))).1.status, 0);
    let t_added = r.clock.now_ns();
    let c = r.cap.wait(n, is_event);
    assert_eq!(decode(&c), DeviceMsg::Event { seq: 2, event: EventMsg::RuleAged { filter_id: 9 } });
    assert_eq!((&c.frame[0..6], c.pair), (&GUEST[..], 0));
    assert!(c.at_ns - t_added >= 15_000 * US, "aged after {} us", (c.at_ns - t_added) / US);
    assert!(!r.rt.table().contains_id(9));
    assert_eq!(c.frame[15], op::EV_RULE_AGED);

    let n = r.cap.len();
    r.rt.inject(Fault::Flush);
    let c = r.cap.wait(n, is_event);
    assert_eq!((decode(&c), c.pair), (DeviceMsg::Event { seq: 3, event: EventMsg::TableFlushed }, 0));
    let n = r.cap.len();
    r.rt.inject(Fault::Disable(true));
    let c = r.cap.wait(n, is_event);
    assert_eq!(decode(&c), DeviceMsg::Event { seq: 4, event: EventMsg::EngineState { disabled: true } });
    // Disabled: ADD answers EPERM at once.
    let (c, m) = r.call(2, 3, &add(10, 0, key(10)));
    assert_eq!((m.status, c.pair), (libc::EPERM as u16, 2));
    r.rt.inject(Fault::Disable(false));
    assert_eq!(r.call(2, 4, &add(11, 0, key(11))).1.status, 0);
    // Five events and three completions; the aging event came from the timer thread.
    settle(&r.rt, 8);
    let s = r.rt.snapshot();
    assert_eq!(s.frames.events_sent, 5);
    assert_eq!(s.engine.aged_out, 1);
}

/// The sink sees a frame before the runtime counts it (the count is taken after the send
/// returns, possibly on the timer thread): wait until `n` frames are counted.
fn settle(rt: &ControlRuntime, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while rt.frames_sent() < n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn raw(header: Header, body: &[u8]) -> Vec<u8> {
    wire::encode_raw(wire::BROADCAST_MAC, GUEST, header, body)
}

#[test]
fn malformed_frames_get_error_completions_and_counters() {
    let p = profile(SHARED_1K);
    let r = rig(&p, 4);
    let h = |op: u8, seq: u32| Header { version: 1, op, seq, ..Default::default() };
    // Bad version: EPROTO, seq echoed, op 0x80|op.
    r.rt.on_control_frame(1, &raw(Header { version: wire::VERSION + 1, ..h(op::HELLO, 100) }, &[]));
    let (c, m) = r.cap.completion(100);
    assert_eq!((c.pair, m.req_op, m.status), (1, op::HELLO, libc::EPROTO as u16));
    assert_eq!(c.frame[15], 0x81);
    // Unknown op: EOPNOTSUPP, op echoed as 0x80|op.
    r.rt.on_control_frame(2, &raw(h(0x33, 101), &[]));
    let (c, m) = r.cap.completion(101);
    assert_eq!((c.pair, c.frame[15], m.status), (2, 0xb3, libc::EOPNOTSUPP as u16));
    // A guest sending an event op is unknown too.
    r.rt.on_control_frame(2, &raw(h(op::EV_RULE_AGED, 102), &[0; 4]));
    assert_eq!(r.cap.completion(102).1.status, libc::EOPNOTSUPP as u16);
    // Wrong body size for the op: EINVAL.
    r.rt.on_control_frame(3, &raw(h(op::DEL, 103), &[0; 3]));
    assert_eq!(r.cap.completion(103).1.status, libc::EINVAL as u16);
    // Length field beyond the frame: EINVAL.
    let mut f = wire::encode_request(GUEST, 104, &Request::Del { filter_id: 1 });
    f[16..18].copy_from_slice(&500u16.to_be_bytes());
    r.rt.on_control_frame(3, &f);
    assert_eq!(r.cap.completion(104).1.status, libc::EINVAL as u16);
    // Length field below the header size: EINVAL.
    f[16..18].copy_from_slice(&4u16.to_be_bytes());
    f[18..22].copy_from_slice(&105u32.to_be_bytes());
    r.rt.on_control_frame(3, &f);
    assert_eq!(r.cap.completion(105).1.status, libc::EINVAL as u16);
    // Bad ip_version / l4_proto in ADD: EINVAL.
    let mut a = wire::encode_request(GUEST, 106, &add(1, 0, key(1)));
    a[30 + 6] = 5;
    r.rt.on_control_frame(0, &a);
    assert_eq!(r.cap.completion(106).1.status, libc::EINVAL as u16);
    let mut a = wire::encode_request(GUEST, 107, &add(1, 0, key(1)));
    a[30 + 7] = 1; // ICMP
    r.rt.on_control_frame(0, &a);
    assert_eq!(r.cap.completion(107).1.status, libc::EINVAL as u16);
    // A queue the device does not have: EINVAL.
    r.send(0, 108, &add(1, 4, key(1)));
    assert_eq!(r.cap.completion(108).1.status, libc::EINVAL as u16);
    r.send(0, 109, &Request::Mod { filter_id: 1, rxq: 9 });
    assert_eq!(r.cap.completion(109).1.status, libc::EINVAL as u16);
    // Header cut after seq: EINVAL with seq echoed; cut inside seq: EINVAL with seq 0.
    let f = wire::encode_request(GUEST, 110, &Request::Hello);
    r.rt.on_control_frame(0, &f[..14 + 10]);
    let (_, m) = r.cap.completion(110);
    assert_eq!((m.status, m.enqueue_ns, m.start_ns, m.finish_ns), (libc::EINVAL as u16, 0, 0, 0));
    r.rt.on_control_frame(0, &f[..14 + 7]);
    let (_, m) = r.cap.completion(0);
    assert_eq!((m.status, m.req_op), (libc::EINVAL as u16, op::HELLO));
    // Non-zero reserved field: EINVAL.
    r.rt.on_control_frame(0, &raw(Header { reserved: 9, ..h(op::HELLO, 111) }, &[]));
    assert_eq!(r.cap.completion(111).1.status, libc::EINVAL as u16);
    // No answer: shorter than an Ethernet header, not a control frame, any STATS (also a
    // malformed one), anything with NO_REPLY (also a malformed one).
    let before = r.cap.len();
    r.rt.on_control_frame(0, &f[..5]);
    r.rt.on_control_frame(0, &[]);
    let mut other = f.clone();
    other[12..14].copy_from_slice(&[0x08, 0x00]);
    r.rt.on_control_frame(0, &other);
    r.send(0, 120, &Request::Stats(vec![(counter::STEER_CALLS, 1)]));
    r.rt.on_control_frame(0, &raw(h(op::STATS, 121), &[0, 5, 0, 0]));
    let quiet = |hd: Header| Header { flags: wire::FLAG_NO_REPLY, ..hd };
    r.rt.on_control_frame(0, &raw(quiet(h(op::DEL, 122)), &[0; 2]));
    r.rt.on_control_frame(0, &raw(quiet(h(op::HELLO, 123)), &[]));
    // A well-formed ADD with NO_REPLY executes without a completion.
    r.rt.on_control_frame(0, &raw(quiet(h(op::ADD, 124)), &wire::request_body(&add(50, 0, key(50)))));
    r.call(0, 125, &Request::Hello);
    assert_eq!(r.cap.len(), before + 1, "only the last HELLO was answered");
    assert!(r.rt.table().contains_id(50));
    let s = r.rt.snapshot();
    let k = &s.frames.bad_by_kind;
    assert_eq!(k["bad_version"], 1);
    assert_eq!(k["unknown_op"], 2);
    assert_eq!(k["bad_body"], 3);
    assert_eq!(k["bad_length"], 2);
    assert_eq!(k["bad_ip_version"], 1);
    assert_eq!(k["bad_l4_proto"], 1);
    assert_eq!(k["bad_queue"], 2);
    assert_eq!(k["truncated_header"], 2);
    assert_eq!(k["bad_reserved"], 1);
    assert_eq!(k["too_short"], 2);
    assert_eq!(k["not_control"], 1);
    assert_eq!(s.frames.bad, 18);
    assert_eq!(s.frames.error_completions, 13);
    assert_eq!(s.frames.completions_suppressed, 4, "bad STATS, bad DEL, HELLO, ADD");
    assert_eq!(s.frames.received, 22);
    assert_eq!(s.engine.ops["add"].submitted, 1, "nothing malformed reached the engine");
}

#[test]
fn random_frames_never_break_the_runtime() {
    use rand::{Rng, SeedableRng};
    let p = profile(SHARED_1K);
    let r = rig(&p, 4);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    for i in 0..20_000u32 {
        let len = rng.random_range(0..200usize);
        let mut f: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        // Mostly frames that get past the EtherType, many past the version and op.
        if len >= 16 && i % 8 != 0 {
            f[12..14].copy_from_slice(&[0x88, 0xb5]);
            f[14] = 1;
            if i % 2 == 0 {
                f[15] = rng.random_range(0..9);
            }
            if len >= 18 && i % 3 == 0 {
                f[16..18].copy_from_slice(&((len - 14) as u16).to_be_bytes());
            }
        }
        r.rt.on_control_frame(rng.random_range(0..4), &f);
    }
    // Random frames taught the device other guest MACs; answers go to the sender.
    let before = r.cap.len();
    r.send(0, 0xabcd, &Request::Hello);
    let c = r.cap.wait(before, |c| c.frame[0..6] == GUEST);
    let (h, _) = wire::decode_device_frame(&c.frame).unwrap();
    assert_eq!((h.seq, h.status, h.op), (0xabcd, 0, 0x81), "still answering");
    let s = r.rt.snapshot();
    assert_eq!(s.frames.received, 20_001);
    eprintln!("bad frames by kind: {:?}", s.frames.bad_by_kind);
    serde_json::to_string(&s).unwrap();
}

#[test]
fn stats_are_stored_with_names_histogram_and_series() {
    let p = profile(SHARED_1K);
    let r = rig(&p, 2);
    let mut entries = vec![
        (counter::STEER_CALLS, 1000),
        (counter::ADDS_OK, 10),
        (counter::LOCK_CONTENDED, 3),
        (counter::HOLD_NS, 500),
        (counter::ADD_ERR + libc::ENOSPC as u16, 4),
        (counter::DEL_ERR + libc::ENOENT as u16, 1),
        (0x0999, 5),
    ];
    for i in 0..24u16 {
        entries.push((
            counter::LAT_HIST + i,
            if i == 6 {
                90
            } else if i == 7 {
                10
            } else {
                0
            },
        ));
    }
    r.send(1, 1, &Request::Stats(entries));
    std::thread::sleep(Duration::from_millis(100));
    r.send(0, 2, &Request::Stats(vec![(counter::STEER_CALLS, 3000), (counter::ADDS_OK, 30), (counter::MODS_OK, 2)]));
    r.call(0, 3, &Request::Hello);
    assert_eq!(r.cap.len(), 1, "STATS is not answered");
    let s = r.rt.snapshot();
    let g = s.guest.as_ref().unwrap();
    assert_eq!(g.reports, 2);
    assert_eq!(g.counters["steer_calls"], 3000);
    assert_eq!(g.counters["adds_ok"], 30);
    assert_eq!(g.counters["lock_contended"], 3);
    assert_eq!(g.counters["hold_ns"], 500);
    assert_eq!(g.counters["add_err_ENOSPC"], 4);
    assert_eq!(g.counters["unknown_0x0999"], 5);
    assert_eq!(g.add_errors["ENOSPC"], 4);
    assert_eq!(g.del_errors["ENOENT"], 1);
    assert_eq!(g.lat_hist_us.len(), 24);
    assert_eq!((g.lat_hist_us[6], g.lat_hist_us[7]), (90, 10));
    let p50 = g.lat_us_p50.unwrap();
    assert_eq!((p50.lo_us, p50.hi_us), (64.0, Some(128.0)));
    assert_eq!(g.lat_us_p99.unwrap().lo_us, 128.0);
    assert_eq!(s.series.len(), 2);
    assert_eq!((s.series[0].steer_calls, s.series[1].steer_calls, s.series[1].mods_ok), (1000, 3000, 2));
    let rates = g.rates.unwrap();
    assert!(rates.window_s >= 0.1);
    let expect = 2000.0 / rates.window_s;
    assert!((rates.steer_calls_per_s - expect).abs() < 1e-6);
    let (v, t) = r.rt.guest_counter(counter::LOCK_CONTENDED).unwrap();
    assert_eq!(v, 3);
    assert_eq!(t, s.series[0].t_ns, "the time that value arrived");
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["guest"]["counters"]["steer_calls"], 3000);
    assert_eq!(json["filter"]["rules_now"], 0);
}

#[test]
fn completions_without_rx_buffers_wait_for_them() {
    // A full RX ring (the guest under load) must not lose a command's answer: the frames
    // wait in the backlog and go, in order, once the guest posts buffers again.
    let p = profile(SHARED_1K);
    let r = rig(&p, 2);
    r.cap.no_buffers.store(true, Ordering::Relaxed);
    r.send(0, 1, &Request::Hello);
    r.send(1, 2, &add(1, 1, key(1)));
    r.rt.inject(Fault::Flush);
    let s = r.rt.snapshot();
    assert_eq!((s.frames.frames_deferred, s.frames.completions_sent, s.frames.completions_dropped), (3, 0, 0));
    assert_eq!(r.cap.len(), 0);
    r.cap.no_buffers.store(false, Ordering::Relaxed);
    r.cap.wait(0, |c| matches!(decode(c), DeviceMsg::Event { .. }));
    let order: Vec<String> = r
        .cap
        .all()
        .iter()
        .map(|c| match decode(c) {
            DeviceMsg::Completion(m) => format!("completion {}", m.seq),
            DeviceMsg::Event { .. } => "event".into(),
        })
        .collect();
    assert_eq!(order, ["completion 1", "completion 2", "event"]);
    let s = r.rt.snapshot();
    assert_eq!((s.frames.completions_sent, s.frames.events_sent, s.frames.completions_dropped), (2, 1, 0));
    assert!(!r.rt.table().contains_id(1), "the ADD completed at once and the flush removed it");

    // A frame that finds no buffer for longer than the module waits (2 s) is dropped and
    // counted: the backlog does not grow without bound behind a guest that stopped.
    r.cap.no_buffers.store(true, Ordering::Relaxed);
    r.send(0, 3, &Request::Hello);
    std::thread::sleep(Duration::from_millis(2300));
    let s = r.rt.snapshot();
    assert_eq!((s.frames.completions_dropped, s.frames.completions_dropped_no_buffer), (1, 1));
    r.cap.no_buffers.store(false, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(r.cap.len(), 3, "the expired answer was not sent late");
}

#[test]
fn wired_into_the_emulated_nic() {
    // Through the glue: DeviceHooks::on_tx sees the EtherType and calls the runtime; the
    // runtime answers through EmulatedNic::send_control, which has no RX port here.
    let p = profile(SHARED_1K);
    let nic = EmulatedNic::new(Arc::new(Nic::new(&p, 2).unwrap()), Clock::new());
    let rt = ControlRuntime::attach(&p, &nic, 2, Schedule::FromStart).unwrap();
    nic.on_tx(1, &wire::encode_request(GUEST, 1, &Request::Hello));
    nic.on_tx(1, &wire::encode_request(GUEST, 2, &add(5, 1, key(5))));
    let s = rt.snapshot();
    assert_eq!(s.frames.received, 2);
    assert_eq!(s.frames.completions_dropped, 2, "no RX port attached: dropped, not blocked");
    assert!(nic.nic.table().contains_id(5), "the runtime drives the NIC's own table");
    nic.set_control(None);
    drop(rt);
}

#[test]
fn drop_stops_the_timer_thread() {
    let p = profile(&format!("{SHARED_1K}[engine.latency]\nadd = {{ dist = \"fixed\", us = 1000000 }}\n"));
    let r = rig(&p, 1);
    r.send(0, 1, &add(1, 0, key(1)));
    let t = Instant::now();
    drop(r.rt);
    assert!(t.elapsed() < Duration::from_millis(500), "drop waited for the pending command");
}

#[test]
fn completion_encoding_matches_the_documented_offsets() {
    let m = CompletionMsg {
        req_op: op::QUERY,
        seq: 0x0102_0304,
        status: 2,
        enqueue_ns: 1,
        start_ns: 2,
        finish_ns: 3,
        body: CompletionBody::Query { rxq: 5, hits: 6 },
    };
    let f = wire::encode_completion(GUEST, &m);
    assert_eq!(&f[12..14], &[0x88, 0xb5]);
    assert_eq!(&f[14..30], &[wire::VERSION, 0x87, 0, 52, 1, 2, 3, 4, 0, 2, 0, 0, 0, 0, 0, 0]);
    assert_eq!(&f[30..38], &1u64.to_be_bytes());
    assert_eq!(&f[54..66], &[0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 6]);
}

/// A receive side with every pair enabled that takes and forgets frames.
struct AllEnabled(u16);

impl arfsnic::device::GuestRx for AllEnabled {
    fn deliver(&self, _pair: u16, _frame: &[u8]) -> Result<(), RxError> {
        Ok(())
    }
    fn enabled_pairs(&self) -> Vec<bool> {
        vec![true; usize::from(self.0)]
    }
}

#[test]
fn a_new_driver_instance_gets_a_fresh_device() {
    // Rules, engine counters and RSS set up by one driver instance are gone when the link
    // comes up for the next one (guest reboot, new frontend); they stay readable while
    // the link is down (reports are taken after QEMU exits).
    let p = profile(SHARED_1K);
    let nic = EmulatedNic::new(Arc::new(Nic::new(&p, 2).unwrap()), Clock::new());
    nic.attach_rx(Arc::new(AllEnabled(2)));
    let rt = ControlRuntime::attach(&p, &nic, 2, Schedule::FromStart).unwrap();
    nic.on_link(true);
    for id in [5, 6] {
        nic.on_tx(1, &wire::encode_request(GUEST, id, &add(id, 1, key(id))));
    }
    settle(&rt, 2);
    assert_eq!(nic.nic.table().len(), 2);
    let other = arfsnic::model::rss::Rss::new(&[7u8; 40], Default::default(), 128, 2).unwrap();
    nic.nic.set_rss(other);
    assert!(!nic.nic.rss_is_default(&[true, true]));
    nic.on_link(false);
    assert_eq!(nic.nic.table().len(), 2, "kept while the link is down");
    assert_eq!(rt.snapshot().filter.adds, 2);
    nic.on_link(true);
    assert_eq!(nic.nic.table().len(), 0, "a fresh device has no rules");
    let s = rt.snapshot();
    assert_eq!((s.filter.adds, s.filter.rules_now, s.frames.received), (0, 0, 0));
    assert!(nic.nic.rss_is_default(&[true, true]), "RSS back to the profile's");
    assert_eq!(nic.counters.device_resets.load(Ordering::Relaxed), 2);
    assert_eq!(rt.resets(), 2);
    // The device works as before after the reset.
    nic.on_tx(0, &wire::encode_request(GUEST, 9, &add(9, 0, key(9))));
    settle(&rt, 3);
    assert!(nic.nic.table().contains_id(9));
    nic.set_control(None);
}

#[test]
fn a_command_in_flight_at_a_reset_never_lands() {
    let p = profile(&format!("{SHARED_1K}[engine.latency]\nadd = {{ dist = \"fixed\", us = 200000 }}\n"));
    let r = rig(&p, 2);
    r.send(1, 1, &add(1, 1, key(1)));
    r.rt.reset();
    std::thread::sleep(Duration::from_millis(400));
    assert!(!r.rt.table().contains_id(1), "the old driver's ADD completed on the fresh device");
    assert_eq!(r.rt.snapshot().filter.adds, 0);
}

#[test]
fn dev_stats_answers_at_once_with_the_counters_since_the_reset() {
    use arfsnic::wire::control::dev_counter as c;
    let p = profile(SHARED_1K);
    let r = rig(&p, 2);
    for id in [1, 2] {
        r.call(1, id, &add(id, 1, key(id)));
    }
    let dev_stats = |seq: u32| -> std::collections::BTreeMap<u16, u64> {
        let (_, m) = r.call(0, seq, &Request::DevStats);
        assert_eq!(m.status, 0);
        assert_eq!((m.enqueue_ns, m.start_ns), (m.finish_ns, m.finish_ns), "answered at once");
        let CompletionBody::DevStats(e) = m.body else { panic!("DEV_STATS body: {:?}", m.body) };
        e.into_iter().collect()
    };
    let s = dev_stats(10);
    assert_eq!(s.len(), wire::DEV_STATS_MAX_ENTRIES.min(13));
    assert_eq!((s[&c::FILTER_ADDS], s[&c::FILTER_RULES], s[&c::CTRL_REQUESTS]), (2, 2, 3));
    assert_eq!(s[&c::RX_SPOOFED_DROPPED], 0, "a sink without a data path reports zeros");
    assert_eq!(r.rt.snapshot().frames.requests.get("dev_stats"), Some(&1));
    r.rt.reset();
    let s = dev_stats(11);
    assert_eq!((s[&c::FILTER_ADDS], s[&c::FILTER_RULES], s[&c::CTRL_REQUESTS]), (0, 0, 1));
}
