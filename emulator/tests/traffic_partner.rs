//! The built-in link partner against a fake guest: a `ToGuest` that plays the guest's echo
//! server (swaps addresses and ports, writes a CPU number) on its own thread, picks an RX
//! queue and filter per flow, and can drop requests. No QEMU involved.

use arfsnic::traffic::partner::{echo_response, request_ids, LinkPartner, LinkStats, LoopMode, MacAddr, PartnerConfig};
use arfsnic::traffic::{Delivery, GuestPeer, ToGuest};
use crossbeam_channel::{unbounded, Receiver, Sender};
use etherparse::{NetSlice, SlicedPacket, TransportSlice};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const GUEST_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
const PARTNER_MAC: [u8; 6] = [0x02, 0xa5, 0xf1, 0x00, 0x00, 0x01];
const QUEUES: u32 = 4;

/// Which queue / filter / CPU the fake guest uses for a flow.
fn queue_of(flow: u32) -> u16 {
    (flow % QUEUES) as u16
}
fn filter_of(flow: u32) -> Option<u32> {
    flow.is_multiple_of(2).then_some(1000 + flow)
}
fn cpu_of(flow: u32) -> u32 {
    flow % 3
}

#[derive(Default)]
struct FlowView {
    /// Requests per queue as returned in `Delivery`.
    queue_counts: Vec<u64>,
    via_filter: u64,
    outstanding: u32,
    max_outstanding: u32,
    dropped: u64,
}

struct FakeGuest {
    partner: OnceLock<Weak<LinkPartner>>,
    /// Drop (never answer) requests whose seq satisfies this.
    drop_seq: Box<dyn Fn(u32) -> bool + Send + Sync>,
    /// Answer at all?
    respond: bool,
    /// Answer ARP requests for the guest IP.
    answer_arp: bool,
    flows: Mutex<HashMap<u32, FlowView>>,
    /// Non-request frames (ARP, ND), in order.
    others: Mutex<Vec<Vec<u8>>>,
    tx: Sender<(u32, u16, Vec<u8>)>,
    requests: AtomicU64,
}

impl FakeGuest {
    fn new(respond: bool, drop_seq: impl Fn(u32) -> bool + Send + Sync + 'static) -> (Arc<Self>, JoinHandle<()>) {
        Self::build(respond, false, drop_seq)
    }

    /// A guest that answers every request and (if `answer_arp`) the partner's ARP.
    fn arping(answer_arp: bool) -> (Arc<Self>, JoinHandle<()>) {
        Self::build(true, answer_arp, |_| false)
    }

    fn build(
        respond: bool,
        answer_arp: bool,
        drop_seq: impl Fn(u32) -> bool + Send + Sync + 'static,
    ) -> (Arc<Self>, JoinHandle<()>) {
        let (tx, rx) = unbounded();
        let g = Arc::new(FakeGuest {
            partner: OnceLock::new(),
            drop_seq: Box::new(drop_seq),
            respond,
            answer_arp,
            flows: Mutex::new(HashMap::new()),
            others: Mutex::new(Vec::new()),
            tx,
            requests: AtomicU64::new(0),
        });
        let h = responder(g.clone(), rx);
        (g, h)
    }

    fn partner(&self) -> Option<Arc<LinkPartner>> {
        self.partner.get().and_then(Weak::upgrade)
    }
}

/// The guest's echo server: answers on its own thread, like a real guest would.
fn responder(g: Arc<FakeGuest>, rx: Receiver<(u32, u16, Vec<u8>)>) -> JoinHandle<()> {
    let weak = Arc::downgrade(&g);
    drop(g);
    std::thread::spawn(move || {
        while let Ok((flow, q, resp)) = rx.recv() {
            let Some(g) = weak.upgrade() else { return };
            if let Some(v) = g.flows.lock().unwrap().get_mut(&flow) {
                v.outstanding -= 1;
            }
            if let Some(p) = g.partner() {
                p.from_guest(q, &resp);
            }
        }
    })
}

impl ToGuest for FakeGuest {
    fn to_guest(&self, frame: &[u8]) -> Delivery {
        let Some((flow, seq)) = request_ids(frame) else {
            self.others.lock().unwrap().push(frame.to_vec());
            if self.answer_arp && frame.len() >= 42 && frame[12..14] == [0x08, 0x06] && frame[21] == 1 {
                // Reply as the guest would: guest MAC/IP to the asker.
                let mut r = Vec::new();
                r.extend_from_slice(&frame[6..12]);
                r.extend_from_slice(&GUEST_MAC);
                r.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 2]);
                r.extend_from_slice(&GUEST_MAC);
                r.extend_from_slice(&frame[38..42]);
                r.extend_from_slice(&frame[22..32]);
                if let Some(p) = self.partner() {
                    p.from_guest(0, &r);
                }
            }
            return Delivery { queue: Some(0), delivered: true, filter: None };
        };
        self.requests.fetch_add(1, SeqCst);
        let q = queue_of(flow);
        let filter = filter_of(flow);
        let drop_it = (self.drop_seq)(seq);
        {
            let mut flows = self.flows.lock().unwrap();
            let v = flows.entry(flow).or_default();
            let qi = usize::from(q);
            if v.queue_counts.len() <= qi {
                v.queue_counts.resize(qi + 1, 0);
            }
            v.queue_counts[qi] += 1;
            if filter.is_some() {
                v.via_filter += 1;
            }
            if drop_it || !self.respond {
                v.dropped += 1;
            } else {
                v.outstanding += 1;
                v.max_outstanding = v.max_outstanding.max(v.outstanding);
            }
        }
        if !drop_it && self.respond {
            let resp = echo_response(frame, cpu_of(flow)).expect("partner request must be echoable");
            let _ = self.tx.send((flow, q, resp));
        }
        Delivery { queue: Some(q), delivered: true, filter }
    }
}

fn cfg(flows: u32) -> PartnerConfig {
    PartnerConfig {
        flows,
        guest_mac: Some(MacAddr(GUEST_MAC)),
        payload: 64,
        drain_ms: 2000,
        ..PartnerConfig::default()
    }
}

fn run_for(p: &LinkPartner, d: Duration) -> LinkStats {
    p.start().unwrap();
    let deadline = Instant::now() + d + Duration::from_secs(10);
    if p.config().duration_s > 0.0 {
        while !p.finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(p.finished(), "sender did not end after duration_s");
    } else {
        std::thread::sleep(d);
    }
    p.stop()
}

fn wire(g: &Arc<FakeGuest>, c: PartnerConfig) -> Arc<LinkPartner> {
    let p = LinkPartner::new(c, g.clone()).unwrap();
    g.partner.set(Arc::downgrade(&p)).ok().unwrap();
    p
}

#[test]
fn closed_loop_every_request_answered_and_recorded() {
    let (g, _h) = FakeGuest::new(true, |_| false);
    let c = PartnerConfig { window: 4, duration_s: 0.6, mode: LoopMode::Closed, rate_pps: 0, ..cfg(16) };
    let p = wire(&g, c);
    let s = run_for(&p, Duration::from_millis(600));
    eprintln!(
        "closed loop: {} requests, {} responses, p50 {} us p99 {} us, {:.0} req/s",
        s.requests, s.responses, s.rtt_us_p50, s.rtt_us_p99, s.requests_per_s
    );
    assert!(s.requests >= 100, "{s:?}");
    assert_eq!(s.requests, g.requests.load(SeqCst));
    assert_eq!(s.responses, s.requests);
    assert_eq!(s.lost, 0);
    assert_eq!(s.in_flight, 0);
    assert_eq!(s.bad_responses, 0);
    assert_eq!(s.late_responses, 0);
    assert!(s.rtt_us_p50 >= 1.0 && s.rtt_us_p99 >= s.rtt_us_p50 && s.rtt_us_max >= s.rtt_us_p99);
    assert!(s.duration_s >= 0.55 && s.duration_s < 5.0, "{}", s.duration_s);
    assert_eq!(s.per_flow.len(), 16);
    let views = g.flows.lock().unwrap();
    let mut window_reached = false;
    for f in &s.per_flow {
        let v = &views[&f.flow];
        assert_eq!(f.guest_port, 5000 + f.flow as u16);
        assert_eq!(f.partner_port, 6000 + f.flow as u16);
        assert!(f.requests > 0, "flow {} starved", f.flow);
        assert_eq!(f.responses, f.requests);
        assert_eq!(f.queue_counts, v.queue_counts, "flow {}", f.flow);
        assert_eq!(f.last_queue, Some(queue_of(f.flow)));
        assert_eq!(f.via_filter, v.via_filter);
        assert_eq!(f.last_filter, filter_of(f.flow));
        // Flows the fake NIC never filters went through RSS from their first request to the
        // end of sending; filtered flows end on a filter hit.
        match (filter_of(f.flow), f.via_rss_only_ms) {
            (Some(_), None) => {}
            (None, Some(ms)) => {
                assert!(ms as f64 <= s.duration_s * 1000.0, "flow {}: {ms} ms > {} s", f.flow, s.duration_s)
            }
            other => panic!("flow {}: filter and RSS series disagree: {other:?}", f.flow),
        }
        assert_eq!(f.last_cpu, Some(cpu_of(f.flow)));
        let c = cpu_of(f.flow) as usize;
        assert_eq!(f.cpu_counts.len(), c + 1);
        assert_eq!(f.cpu_counts[c], f.responses);
        assert!(v.max_outstanding <= 4, "flow {} had {} outstanding > window 4", f.flow, v.max_outstanding);
        window_reached |= v.max_outstanding == 4;
    }
    assert!(window_reached, "no flow ever used its whole window");
    // Requests were spread round robin.
    let (mn, mx) = s.per_flow.iter().fold((u64::MAX, 0), |(a, b), f| (a.min(f.requests), b.max(f.requests)));
    assert!(mx - mn <= mx / 2 + 8, "uneven flows: min {mn} max {mx}");
    let j = serde_json::to_value(&s).unwrap();
    for k in ["flows", "requests", "responses", "lost", "rtt_us_p50", "rtt_us_p99", "rtt_us_max", "per_flow"] {
        assert!(j.get(k).is_some(), "stats JSON lacks {k}");
    }
    assert_eq!(j["guest_mac"], "52:54:00:12:34:56");
    assert!(j["per_flow"][0].get("queue_counts").is_some());
}

#[test]
fn window_one_means_strict_ping_pong() {
    let (g, _h) = FakeGuest::new(true, |_| false);
    let c = PartnerConfig { window: 1, duration_s: 0.3, ..cfg(3) };
    let p = wire(&g, c);
    let s = run_for(&p, Duration::from_millis(300));
    assert!(s.requests > 10);
    assert_eq!(s.responses, s.requests);
    for v in g.flows.lock().unwrap().values() {
        assert_eq!(v.max_outstanding, 1);
    }
}

#[test]
fn open_loop_is_paced_and_drops_are_lost() {
    // Guest drops every seq divisible by 5.
    let (g, _h) = FakeGuest::new(true, |seq: u32| seq.is_multiple_of(5));
    let c = PartnerConfig { mode: LoopMode::Open, rate_pps: 2000, duration_s: 1.0, loss_timeout_ms: 500, ..cfg(4) };
    let p = wire(&g, c);
    let s = run_for(&p, Duration::from_secs(1));
    let dropped: u64 = g.flows.lock().unwrap().values().map(|v| v.dropped).sum();
    eprintln!(
        "open loop: {} requests in {:.3} s, {} lost, {} dropped by guest",
        s.requests, s.duration_s, s.lost, dropped
    );
    // The pacer never sends more than the offered rate allows (a slow, shared machine
    // may send fewer; that is timing, not correctness).
    assert!(s.requests > 0 && s.requests <= 2300, "2000 pps for 1 s sent {}", s.requests);
    assert!(dropped > 0);
    assert_eq!(s.lost, dropped + s.late_responses);
    assert_eq!(s.lost, s.requests - s.responses);
    // Each flow got a quarter.
    for f in &s.per_flow {
        assert!(f.requests * 4 >= s.requests - 4, "{} of {}", f.requests, s.requests);
    }
}

#[test]
fn set_rate_changes_the_pace_mid_run() {
    let (g, _h) = FakeGuest::new(true, |_| false);
    let c = PartnerConfig { mode: LoopMode::Open, rate_pps: 4000, duration_s: 0.0, ..cfg(8) };
    let p = wire(&g, c);
    assert!(p.set_rate(0).is_err(), "an open loop needs a rate");
    p.start().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let first = p.stats().requests;
    p.set_rate(400).unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    let second = p.stats().requests - first;
    let s = p.stop();
    eprintln!("set_rate: {first} requests in 0.5 s at 4000/s, then {second} in 1 s at 400/s");
    // Upper bounds only (a loaded machine may send fewer): after the change at most
    // 400/s plus one burst of catch-up, far below the 4000/s the run started with.
    assert!(first > 0 && first <= 2300, "{first}");
    assert!(second > 0 && second <= 400 + 100, "400/s for 1 s sent {second}");
    assert_eq!(p.config().rate_pps, 4000, "the configuration keeps the starting rate");
    assert_eq!(s.lost, 0);
}

#[test]
fn closed_loop_recovers_from_drops_after_timeout() {
    // Window 1: a dropped request blocks its flow until the loss timeout frees the slot.
    let (g, _h) = FakeGuest::new(true, |seq| seq % 50 == 7);
    let c = PartnerConfig { window: 1, duration_s: 1.0, loss_timeout_ms: 300, ..cfg(4) };
    let p = wire(&g, c);
    let s = run_for(&p, Duration::from_secs(1));
    let dropped: u64 = g.flows.lock().unwrap().values().map(|v| v.dropped).sum();
    assert!(dropped >= 4, "{s:?}");
    // A response slower than the timeout would be lost too (and counted late).
    assert_eq!(s.lost, dropped + s.late_responses);
    assert_eq!(s.requests - s.responses, s.lost);
    // Every flow went on after its first drop (seq 7).
    for f in &s.per_flow {
        assert!(f.requests > 8, "flow {} stuck after a drop: {f:?}", f.flow);
    }
}

#[test]
fn in_flight_table_is_bounded_when_guest_is_silent() {
    let (g, _h) = FakeGuest::new(false, |_| false);
    let c = PartnerConfig {
        mode: LoopMode::Open,
        rate_pps: 20000,
        max_in_flight_per_flow: 8,
        loss_timeout_ms: 60_000,
        drain_ms: 50,
        ..cfg(2)
    };
    let p = wire(&g, c);
    p.start().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let mid = p.stats();
    assert!(mid.running);
    assert!(mid.requests > 100, "{}", mid.requests);
    assert!(mid.in_flight <= 16, "in-flight table grew to {}", mid.in_flight);
    assert!(mid.lost >= mid.requests - 16 - 64, "overflowed entries must count as lost: {mid:?}");
    let s = p.stop();
    assert!(!s.running);
    assert_eq!(s.responses, 0);
    assert_eq!(s.lost, s.requests);
    assert_eq!(s.in_flight, 0);
}

/// Hand-built reference frames (not etherparse) so the partner's bytes are checked independently.
fn arp_frame(dst: [u8; 6], src: [u8; 6], op: u8, sha: [u8; 6], spa: [u8; 4], tha: [u8; 6], tpa: [u8; 4]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&[0x08, 0x06, 0x00, 0x01, 0x08, 0x00, 6, 4, 0, op]);
    f.extend_from_slice(&sha);
    f.extend_from_slice(&spa);
    f.extend_from_slice(&tha);
    f.extend_from_slice(&tpa);
    f
}

#[test]
fn arp_request_gets_exact_reply_and_teaches_guest_mac() {
    let (g, _h) = FakeGuest::new(true, |_| false);
    let p = wire(&g, PartnerConfig { guest_mac: None, ..cfg(1) });
    assert_eq!(p.guest_mac(), None);
    let req = arp_frame([0xff; 6], GUEST_MAC, 1, GUEST_MAC, [10, 99, 0, 2], [0; 6], [10, 99, 0, 1]);
    p.from_guest(0, &req);
    let expect = arp_frame(GUEST_MAC, PARTNER_MAC, 2, PARTNER_MAC, [10, 99, 0, 1], GUEST_MAC, [10, 99, 0, 2]);
    assert_eq!(g.others.lock().unwrap().as_slice(), &[expect]);
    assert_eq!(p.guest_mac(), Some(MacAddr(GUEST_MAC)));
    assert_eq!(p.stats().arp_requests_answered, 1);

    // A request for another IP is not answered; a truncated one neither (and nothing panics).
    p.from_guest(0, &arp_frame([0xff; 6], GUEST_MAC, 1, GUEST_MAC, [10, 99, 0, 2], [0; 6], [10, 99, 0, 9]));
    p.from_guest(0, &req[..30]);
    assert_eq!(g.others.lock().unwrap().len(), 1);
    assert_eq!(p.stats().arp_requests_answered, 1);
}

#[test]
fn partner_arps_until_guest_answers_then_sends() {
    let (g, _h) = FakeGuest::arping(false);
    let p = wire(&g, PartnerConfig { guest_mac: None, window: 1, ..cfg(2) });
    p.start().unwrap();
    std::thread::sleep(Duration::from_millis(700));
    assert!(!p.sending());
    let arps = g.others.lock().unwrap().clone();
    // t = 0, 200, 400, 600 ms.
    assert!((3..=5).contains(&arps.len()), "{} ARP requests in 700 ms", arps.len());
    let expect = arp_frame([0xff; 6], PARTNER_MAC, 1, PARTNER_MAC, [10, 99, 0, 1], [0; 6], [10, 99, 0, 2]);
    for a in &arps {
        assert_eq!(a, &expect);
    }
    assert_eq!(g.requests.load(SeqCst), 0);
    // The guest answers the ARP request: the partner learns its MAC and starts.
    let reply = arp_frame(PARTNER_MAC, GUEST_MAC, 2, GUEST_MAC, [10, 99, 0, 2], PARTNER_MAC, [10, 99, 0, 1]);
    p.from_guest(0, &reply);
    let t = Instant::now();
    while g.requests.load(SeqCst) < 20 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let s = p.stop();
    assert!(s.requests >= 20);
    assert_eq!(s.responses, s.requests);
    assert_eq!(s.guest_mac, Some(MacAddr(GUEST_MAC)));
    let all_arps = g.others.lock().unwrap().iter().filter(|a| **a == expect).count();
    assert_eq!(s.arp_requests_sent as usize, all_arps);
}

#[test]
fn guest_that_answers_arp_is_found() {
    let (g, _h) = FakeGuest::arping(true);
    let p = wire(&g, PartnerConfig { guest_mac: None, duration_s: 0.2, ..cfg(2) });
    let s = run_for(&p, Duration::from_millis(200));
    assert!(s.requests > 0);
    assert_eq!(s.responses, s.requests);
    assert_eq!(s.arp_requests_sent, 1);
}

fn ones_complement_ok(pseudo_and_body: &[u8]) -> bool {
    let mut s: u32 = 0;
    for c in pseudo_and_body.chunks(2) {
        s += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s == 0xffff
}

#[test]
fn ipv6_neighbour_solicitation_is_answered() {
    let (g, _h) = FakeGuest::new(true, |_| false);
    let ours: std::net::Ipv6Addr = "fd00:99::1".parse().unwrap();
    let guest6: std::net::Ipv6Addr = "fd00:99::2".parse().unwrap();
    let p = wire(&g, PartnerConfig { partner_ipv6: Some(ours), ..cfg(1) });
    // NS from the guest for our address, with a source link-layer address option.
    let mut body = Vec::new();
    body.extend_from_slice(&ours.octets());
    body.extend_from_slice(&[1, 1]);
    body.extend_from_slice(&GUEST_MAC);
    let mut ns = Vec::new();
    etherparse::PacketBuilder::ethernet2(GUEST_MAC, [0x33, 0x33, 0xff, 0, 0, 1])
        .ipv6(guest6.octets(), [0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0, 0, 1], 255)
        .icmpv6(etherparse::Icmpv6Type::NeighborSolicitation)
        .write(&mut ns, &body)
        .unwrap();
    p.from_guest(0, &ns);
    let others = g.others.lock().unwrap().clone();
    assert_eq!(others.len(), 1, "no neighbour advertisement sent");
    let na = &others[0];
    assert_eq!(&na[0..6], &GUEST_MAC);
    assert_eq!(&na[6..12], &PARTNER_MAC);
    assert_eq!(&na[12..14], &[0x86, 0xdd]);
    let ip = &na[14..54];
    assert_eq!(ip[6], 58);
    assert_eq!(ip[7], 255);
    assert_eq!(&ip[8..24], &ours.octets());
    assert_eq!(&ip[24..40], &guest6.octets());
    let icmp = &na[54..];
    assert_eq!(icmp.len(), 32);
    assert_eq!(icmp[0], 136);
    assert_eq!(icmp[4], 0x60, "flags must be Solicited|Override");
    assert_eq!(&icmp[8..24], &ours.octets());
    assert_eq!(&icmp[24..26], &[2, 1]);
    assert_eq!(&icmp[26..32], &PARTNER_MAC);
    // ICMPv6 checksum over the pseudo header.
    let mut ph = Vec::new();
    ph.extend_from_slice(&ip[8..40]);
    ph.extend_from_slice(&(icmp.len() as u32).to_be_bytes());
    ph.extend_from_slice(&[0, 0, 0, 58]);
    ph.extend_from_slice(icmp);
    assert!(ones_complement_ok(&ph), "bad ICMPv6 checksum");
    assert_eq!(p.stats().nd_solicitations_answered, 1);
    // A solicitation for somebody else is ignored.
    let mut other = ns.clone();
    other[14 + 40 + 8 + 15] ^= 1;
    p.from_guest(0, &other);
    assert_eq!(g.others.lock().unwrap().len(), 1);
}

#[test]
fn hostile_frames_never_panic_and_bad_responses_are_counted() {
    let (g, _h) = FakeGuest::new(false, |_| false);
    let p = wire(&g, PartnerConfig { window: 4, ..cfg(4) });
    p.start().unwrap();
    let t = Instant::now();
    while g.requests.load(SeqCst) < 16 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(2));
    }
    // A real request to mutate.
    let mut req = Vec::new();
    etherparse::PacketBuilder::ethernet2(PARTNER_MAC, GUEST_MAC)
        .ipv4([10, 99, 0, 1], [10, 99, 0, 2], 64)
        .udp(6001, 5001)
        .write(&mut req, &{
            let mut pl = vec![0u8; 64];
            pl[..4].copy_from_slice(b"ARFS");
            pl[4..8].copy_from_slice(&1u32.to_be_bytes());
            pl
        })
        .unwrap();
    let good = echo_response(&req, 1).unwrap();
    let base_bad = p.stats().bad_responses;
    // Wrong magic, wrong flow index, CPU out of range, too short: 4 bad responses.
    let mut wrong_magic = good.clone();
    wrong_magic[42] = b'X';
    let mut wrong_flow = good.clone();
    wrong_flow[42 + 7] = 3;
    let mut wrong_cpu = good.clone();
    wrong_cpu[42 + 12] = 0xff;
    let mut short = Vec::new();
    etherparse::PacketBuilder::ethernet2(GUEST_MAC, PARTNER_MAC)
        .ipv4([10, 99, 0, 2], [10, 99, 0, 1], 64)
        .udp(5001, 6001)
        .write(&mut short, b"ARFS\0\0\0\x01")
        .unwrap();
    for f in [&wrong_magic, &wrong_flow, &wrong_cpu, &short] {
        p.from_guest(0, f);
    }
    assert_eq!(p.stats().bad_responses - base_bad, 4);
    // Truncations and byte flips of good frames, random garbage: no panic.
    let mut x: u64 = 0x9e3779b97f4a7c15;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for len in 0..good.len() {
        p.from_guest(0, &good[..len]);
    }
    for _ in 0..20000 {
        let mut f = good.clone();
        for _ in 0..(rnd() % 4 + 1) {
            let i = (rnd() as usize) % f.len();
            f[i] = rnd() as u8;
        }
        p.from_guest((rnd() % 8) as u16, &f);
        let n = (rnd() % 200) as usize;
        let garbage: Vec<u8> = (0..n).map(|_| rnd() as u8).collect();
        p.from_guest(0, &garbage);
    }
    let s = p.stop();
    // cpu_counts and queue_counts stay bounded whatever the guest wrote.
    for f in &s.per_flow {
        assert!(f.cpu_counts.len() <= 4096);
        assert!(f.queue_counts.len() <= QUEUES as usize);
    }
}

#[test]
fn restart_gives_fresh_counters_and_reconfigure_applies() {
    let (g, _h) = FakeGuest::new(true, |_| false);
    let p = wire(&g, PartnerConfig { duration_s: 0.1, ..cfg(2) });
    let a = run_for(&p, Duration::from_millis(100));
    assert!(a.requests > 0);
    assert!(p.start().is_ok());
    assert!(p.start().is_err(), "second start while running must fail");
    let b = p.stop();
    assert!(b.requests < a.requests * 10 + 1000);
    p.reconfigure(PartnerConfig { duration_s: 0.1, ..cfg(5) }).unwrap();
    let c = run_for(&p, Duration::from_millis(100));
    assert_eq!(c.per_flow.len(), 5);
    assert_eq!(c.responses, c.requests);
    assert!(PartnerConfig { payload: 8, ..cfg(1) }.validate().is_err());
}

#[test]
fn link_down_forgets_learnt_mac() {
    let (g, _h) = FakeGuest::new(true, |_| false);
    let p = wire(&g, PartnerConfig { guest_mac: None, ..cfg(1) });
    p.from_guest(0, &arp_frame([0xff; 6], GUEST_MAC, 1, GUEST_MAC, [10, 99, 0, 2], [0; 6], [10, 99, 0, 1]));
    assert!(p.guest_mac().is_some());
    p.link(false);
    assert_eq!(p.guest_mac(), None);
    // Any IPv4 frame from the guest IP teaches it again.
    let mut f = Vec::new();
    etherparse::PacketBuilder::ethernet2(GUEST_MAC, PARTNER_MAC)
        .ipv4([10, 99, 0, 2], [10, 99, 0, 1], 64)
        .udp(5, 6)
        .write(&mut f, b"x")
        .unwrap();
    p.from_guest(0, &f);
    assert_eq!(p.guest_mac(), Some(MacAddr(GUEST_MAC)));
    // Check the frame really is what the partner sees as IPv4/UDP.
    let s = SlicedPacket::from_ethernet(&f).unwrap();
    assert!(matches!(s.net, Some(NetSlice::Ipv4(_))));
    assert!(matches!(s.transport, Some(TransportSlice::Udp(_))));
}

#[test]
fn port_unreachable_from_guest_is_counted() {
    let (g, _h) = FakeGuest::new(true, |_| false);
    let p = wire(&g, cfg(1));
    let mut f = Vec::new();
    // ICMP type 3 code 3 quoting a request's IPv4+UDP header.
    let quoted = [0u8; 28];
    etherparse::PacketBuilder::ethernet2(GUEST_MAC, PARTNER_MAC)
        .ipv4([10, 99, 0, 2], [10, 99, 0, 1], 64)
        .icmpv4(etherparse::Icmpv4Type::DestinationUnreachable(etherparse::icmpv4::DestUnreachableHeader::Port))
        .write(&mut f, &quoted)
        .unwrap();
    p.from_guest(0, &f);
    let s = p.stats();
    assert_eq!(s.port_unreachable, 1);
    assert_eq!(s.other_frames, 0);
}
