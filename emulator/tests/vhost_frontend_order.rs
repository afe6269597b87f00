//! Regression test for the vhost-user backend: a scripted frontend speaking raw vhost-user
//! messages over a UnixStream drives the backend in QEMU's exact message order (QEMU 7.2 and
//! 10.0, `queues=N`), with guest memory in a memfd shared through SET_MEM_TABLE and real split
//! virtqueues laid out in it.
//!
//! QEMU's order: GET_FEATURES, GET/SET_PROTOCOL_FEATURES, GET_QUEUE_NUM, SET_OWNER,
//! SET_VRING_CALL/ERR per vring, SET_VRING_ENABLE (pair 0 -> 1, pairs >= 1 -> 0) BEFORE any
//! SET_FEATURES, then at DRIVER_OK: SET_FEATURES once per pair, SET_MEM_TABLE (need_reply),
//! per vring NUM/BASE/ADDR/KICK/CALL, SET_VRING_ENABLE on all vrings; at shutdown
//! GET_VRING_BASE per vring.
//!
//! Without the early-enable workaround the backend drops the connection at the first
//! SET_VRING_ENABLE and every later step fails; without the GET_QUEUE_NUM fix the queue count
//! check fails.
//!
//! The frontend and the driver side of the rings live in `arfsnic::vhost::testing` (shared
//! with `benches/loopback.rs`); the message order and the assertions are this test's.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arfsnic::vhost::testing::req::{GET_FEATURES, SET_VRING_ENABLE};
use arfsnic::vhost::testing::{vring_state, DrvRing, Frontend, GuestMem, Vrings};
use arfsnic::vhost::{features, Backend, DeviceHooks, RxError, RxPort, ServeConfig};
use vm_memory::{Bytes, GuestAddress};

const MEM_SIZE: u64 = 4 << 20;
const QSIZE: u16 = 16;
const HDR: usize = 12;

// ---------------------------------------------------------------------------------------------
// Hooks recording everything.

#[derive(Default)]
struct Rec {
    tx: Mutex<Vec<(u16, Vec<u8>)>>,
    qstate: Mutex<Vec<(u16, bool)>>,
    link: Mutex<Vec<bool>>,
    /// Take TX bursts without running them (hooks that ignore the guest's frames).
    skip_bursts: AtomicBool,
}

impl DeviceHooks for Rec {
    fn on_tx(&self, pair: u16, frame: &[u8]) {
        self.tx.lock().unwrap().push((pair, frame.to_vec()));
    }
    fn on_tx_burst(&self, pair: u16, burst: &mut arfsnic::device::Burst<'_>) {
        if !self.skip_bursts.load(Ordering::Relaxed) {
            burst(&mut |frame| self.on_tx(pair, frame));
        }
    }
    fn on_queue_state(&self, pair: u16, enabled: bool) {
        self.qstate.lock().unwrap().push((pair, enabled));
    }
    fn on_link(&self, up: bool) {
        self.link.lock().unwrap().push(up);
    }
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(5), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

// ---------------------------------------------------------------------------------------------
// The scripted frontend and driver come from `arfsnic::vhost::testing` (shared with the
// loopback benchmark); these wrappers fix this test's memory size and queue size.

fn new_guest() -> GuestMem {
    GuestMem::new(MEM_SIZE).unwrap()
}

fn connect(path: &Path) -> Frontend {
    Frontend::connect(path, Duration::from_secs(5)).unwrap()
}

/// QEMU's start-up sequence for `pairs` queue pairs (see `Frontend::qemu_startup`). Panics
/// with the backend's failure (dropped connection, NACK, wrong GET_QUEUE_NUM).
fn qemu_startup(fe: &mut Frontend, g: &GuestMem, pairs: u16, first: bool) -> Vrings {
    let v = fe.qemu_startup(g, pairs, QSIZE, first).unwrap();
    // This test addresses buffers from BUF_BASE up: the rings must stay below.
    assert!(DrvRing::layout_end(v.rings.len(), QSIZE) <= BUF_BASE);
    v
}

fn qemu_shutdown(fe: &Frontend, pairs: u16) -> Vec<u32> {
    fe.qemu_shutdown(pairs).unwrap()
}

struct Setup {
    rec: Arc<Rec>,
    backend: Arc<Backend>,
    rx: RxPort,
    stop: Arc<AtomicBool>,
    server: Option<std::thread::JoinHandle<()>>,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Setup {
    fn new(pairs: u16, threads: Option<usize>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vhost.sock");
        let rec = Arc::new(Rec::default());
        let mut cfg = ServeConfig::new(&path, pairs);
        cfg.threads = threads;
        let backend = Arc::new(Backend::new(cfg, rec.clone()).unwrap());
        let rx = backend.rx_port();
        let stop = Arc::new(AtomicBool::new(false));
        let (b, s) = (backend.clone(), stop.clone());
        let server = std::thread::spawn(move || b.serve(&s).unwrap());
        Setup { rec, backend, rx, stop, server: Some(server), path, _dir: dir }
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.server.take() {
            let _ = h.join();
        }
    }
}

fn frame(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed)).collect()
}

const BUF_BASE: u64 = 0x10_0000;

/// The full scenario for `pairs` queue pairs on one connection.
fn run_scenario(s: &Setup, pairs: u16, round: u64) {
    let mut fe = connect(&s.path);
    exercise(s, &mut fe, pairs, round, true);
}

/// Startup, TX/RX checks on every pair, `ethtool -L`, shutdown.
fn exercise(s: &Setup, fe: &mut Frontend, pairs: u16, round: u64, first: bool) {
    let g = new_guest();
    let c0 = s.backend.counters();
    let mut v = qemu_startup(fe, &g, pairs, first);

    wait_for("link up", || s.rx.link_up());
    assert_eq!(s.rx.enabled_pairs(), vec![true; usize::from(pairs)]);
    assert_eq!(s.rx.pairs(), pairs);

    // ---- TX: a frame chained over two descriptors on every pair, and one via an indirect
    // table on the last pair.
    for p in 0..pairs {
        let t = 2 * usize::from(p) + 1;
        let f = frame(60 + usize::from(p), p as u8 + round as u8);
        let a = BUF_BASE + 0x1_0000 * u64::from(p);
        g.mem().write_slice(&[0u8; HDR], GuestAddress(a)).unwrap();
        g.mem().write_slice(&f[..20], GuestAddress(a + HDR as u64)).unwrap();
        g.mem().write_slice(&f[20..], GuestAddress(a + 0x800)).unwrap();
        let calls_before = v.calls[t].read().unwrap_or(0);
        let _ = calls_before;
        v.rings[t].add_chain(&g, &[(a, (HDR + 20) as u32, false), (a + 0x800, (f.len() - 20) as u32, false)]);
        v.kicks[t].write(1).unwrap();
        wait_for("tx frame", || s.rec.tx.lock().unwrap().iter().any(|(pp, b)| *pp == p && *b == f));
        wait_for("tx used", || v.rings[t].used_idx(&g) == 1);
        assert_eq!(v.rings[t].pop_used(&g).map(|e| e.0), Some(0));
        wait_for("tx interrupt", || v.calls[t].read().is_ok());
    }
    {
        let p = pairs - 1;
        let t = 2 * usize::from(p) + 1;
        let f = frame(1500, 99);
        let a = BUF_BASE + 0x8_0000;
        let table = BUF_BASE + 0x9_0000;
        g.mem().write_slice(&[0u8; HDR], GuestAddress(a)).unwrap();
        g.mem().write_slice(&f, GuestAddress(a + 0x100)).unwrap();
        v.rings[t].add_indirect(&g, table, &[(a, HDR as u32), (a + 0x100, 1000), (a + 0x100 + 1000, 500)]);
        v.kicks[t].write(1).unwrap();
        wait_for("indirect tx frame", || s.rec.tx.lock().unwrap().iter().any(|(pp, b)| *pp == p && *b == f));
    }
    // Every TX frame reached on_tx with the right pair (and nothing else did).
    let ntx = s.rec.tx.lock().unwrap().len();
    assert_eq!(ntx, usize::from(pairs) + 1);

    // ---- RX on every pair.
    for p in 0..pairs {
        let r = 2 * usize::from(p);
        // No buffers yet.
        assert_eq!(s.rx.deliver(p, &frame(100, 1)), Err(RxError::NoBuffers));
        // Five 256-byte buffers.
        let base = BUF_BASE + 0x20_0000 + 0x1_0000 * u64::from(p);
        for k in 0..5u64 {
            v.rings[r].add_chain(&g, &[(base + 0x400 * k, 256, true)]);
        }
        // A small frame: one buffer, num_buffers = 1, header zero otherwise.
        let f1 = frame(100, 3 + p as u8);
        s.rx.deliver(p, &f1).unwrap();
        let (id, len) = v.rings[r].pop_used(&g).expect("used element for small frame");
        assert_eq!((id, len), (0, (HDR + 100) as u32));
        let mut got = vec![0u8; HDR + 100];
        g.mem().read_slice(&mut got, GuestAddress(base)).unwrap();
        assert_eq!(&got[..10], &[0u8; 10], "virtio_net_hdr fields");
        assert_eq!(u16::from_le_bytes([got[10], got[11]]), 1, "num_buffers");
        assert_eq!(&got[HDR..], &f1[..]);
        wait_for("rx interrupt", || v.calls[r].read().is_ok());

        // A frame larger than one buffer spans three (MRG_RXBUF): 12 + 600 = 256 + 256 + 100.
        let f2 = frame(600, 5 + p as u8);
        s.rx.deliver(p, &f2).unwrap();
        assert_eq!(v.rings[r].used_idx(&g), 4, "three used elements published together");
        let e: Vec<(u32, u32)> = (0..3).map(|_| v.rings[r].pop_used(&g).unwrap()).collect();
        assert_eq!(e, vec![(1, 256), (2, 256), (3, 100)]);
        let mut got = Vec::new();
        for (k, &(id, len)) in e.iter().enumerate() {
            let mut b = vec![0u8; len as usize];
            g.mem().read_slice(&mut b, GuestAddress(base + 0x400 * u64::from(id))).unwrap();
            if k == 0 {
                assert_eq!(u16::from_le_bytes([b[10], b[11]]), 3, "num_buffers of spanning frame");
                b.drain(..HDR);
            }
            got.extend_from_slice(&b);
        }
        assert_eq!(got, f2);

        // Only one 256-byte buffer left: a 600-byte frame does not fit -> NoBuffers, nothing
        // consumed; the small one still fits afterwards.
        assert_eq!(s.rx.deliver(p, &f2), Err(RxError::NoBuffers));
        assert_eq!(v.rings[r].used_idx(&g), 4);
        s.rx.deliver(p, &f1).unwrap();
        assert_eq!(v.rings[r].used_idx(&g), 5);
        assert_eq!(s.rx.deliver(p, &f1), Err(RxError::NoBuffers));
    }
    // RX went only to the vrings of the pair it was delivered to (checked above per pair: each
    // RX ring has exactly 5 used elements), TX rings untouched by RX.
    for p in 0..pairs {
        assert_eq!(v.rings[2 * usize::from(p)].used_idx(&g), 5);
    }
    let c = s.backend.counters();
    for (p, (pc, pc0)) in c.pairs.iter().zip(&c0.pairs).enumerate() {
        assert_eq!(pc.rx_frames - pc0.rx_frames, 3, "pair {p}");
        assert_eq!(pc.rx_no_buffers - pc0.rx_no_buffers, 3, "pair {p}");
        assert_eq!(pc.desc_errors, pc0.desc_errors, "pair {p}");
    }
    assert!(c.early_enables >= u64::from(2 * pairs), "early enables applied");

    // ---- ethtool -L: disable the last pair.
    let last = pairs - 1;
    for i in [2 * u32::from(last), 2 * u32::from(last) + 1] {
        fe.send(SET_VRING_ENABLE, 0, &vring_state(i, 0), &[]).unwrap();
    }
    assert_eq!(fe.get_u64(GET_FEATURES).unwrap(), features::OFFERED);
    assert_eq!(s.rx.deliver(last, &frame(64, 0)), Err(RxError::QueueDisabled));
    assert!(s.rec.qstate.lock().unwrap().contains(&(last, false)));

    // ---- shutdown: GET_VRING_BASE per vring returns the consumed avail index.
    let bases = qemu_shutdown(fe, pairs);
    for p in 0..usize::from(pairs) {
        assert_eq!(bases[2 * p], 5, "rx base pair {p}");
        let tx = if p + 1 == usize::from(pairs) { 2 } else { 1 };
        assert_eq!(bases[2 * p + 1], tx, "tx base pair {p}");
    }
    wait_for("link down", || !s.rx.link_up());
    assert_eq!(s.rx.deliver(0, &frame(64, 0)), Err(RxError::NotReady));
    drop(v);
}

#[test]
fn tx_chains_are_freed_when_the_hooks_skip_the_burst() {
    // The TX chains are taken inside the burst the hooks are handed: hooks that never run
    // it must not leave them in the ring (the worker would spin on them).
    let s = Setup::new(1, None);
    s.rec.skip_bursts.store(true, Ordering::Relaxed);
    let mut fe = connect(&s.path);
    let g = new_guest();
    let mut v = qemu_startup(&mut fe, &g, 1, true);
    wait_for("link up", || s.rx.link_up());
    for k in 0..3u64 {
        let a = BUF_BASE + 0x1000 * k;
        g.mem().write_slice(&[0u8; HDR + 60], GuestAddress(a)).unwrap();
        v.rings[1].add_chain(&g, &[(a, (HDR + 60) as u32, false)]);
    }
    v.kicks[1].write(1).unwrap();
    wait_for("tx used", || v.rings[1].used_idx(&g) == 3);
    assert!(s.rec.tx.lock().unwrap().is_empty());
    assert_eq!(s.backend.counters().pairs[0].tx_frames, 3);
}

#[test]
fn guest_reboot_on_same_connection() {
    let s = Setup::new(2, None);
    let mut fe = connect(&s.path);
    exercise(&s, &mut fe, 2, 0, true);
    s.rec.tx.lock().unwrap().clear();
    // Device reset + new driver: early enables again (now after an earlier SET_FEATURES),
    // fresh rings in fresh memory, base 0.
    exercise(&s, &mut fe, 2, 1, false);
    assert_eq!(s.backend.counters().connections, 1);
    assert_eq!(*s.rec.link.lock().unwrap(), vec![true, false, true, false]);
}

/// deliver() from several threads at once, to the same and different pairs, while the driver
/// refills RX buffers without ever kicking: every frame is either delivered intact or refused
/// with NoBuffers, and the used rings stay consistent.
#[test]
fn concurrent_delivery_without_rx_kicks() {
    let s = Setup::new(2, None);
    let g = new_guest();
    let mut fe = connect(&s.path);
    let mut v = qemu_startup(&mut fe, &g, 2, true);
    wait_for("link up", || s.rx.link_up());
    const PER_THREAD: usize = 2000;
    let senders: Vec<_> = (0..4u16)
        .map(|t| {
            let rx = s.rx.clone();
            std::thread::spawn(move || {
                let mut ok = 0u64;
                let mut nobuf = 0u64;
                for i in 0..PER_THREAD {
                    let mut f = frame(64 + (i % 200), t as u8);
                    f[0] = t as u8;
                    f[1..9].copy_from_slice(&(i as u64).to_le_bytes());
                    match rx.deliver(t % 2, &f) {
                        Ok(()) => ok += 1,
                        Err(RxError::NoBuffers) => {
                            nobuf += 1;
                            std::thread::sleep(Duration::from_micros(50));
                        }
                        Err(e) => panic!("unexpected {e:?}"),
                    }
                    if i % 64 == 0 {
                        std::thread::yield_now();
                    }
                }
                (ok, nobuf)
            })
        })
        .collect();
    // The driver: keep up to 8 buffers of 2 KiB posted on each RX ring, reap used ones,
    // check headers and payload, never kick.
    let mut seen = 0u64;
    let mut posted = [0u16; 2];
    let mut free: Vec<Vec<u16>> = vec![(0..QSIZE).collect(), (0..QSIZE).collect()];
    let deadline = Instant::now() + Duration::from_secs(20);
    let buf_addr = |p: usize, d: u16| BUF_BASE + 0x10_0000 * p as u64 + 0x800 * u64::from(d);
    loop {
        for p in 0..2usize {
            let r = 2 * p;
            while let Some((id, len)) = v.rings[r].pop_used(&g) {
                let mut b = vec![0u8; len as usize];
                g.mem().read_slice(&mut b, GuestAddress(buf_addr(p, id as u16))).unwrap();
                assert_eq!(u16::from_le_bytes([b[10], b[11]]), 1, "num_buffers");
                let t = b[HDR];
                assert_eq!(u16::from(t) % 2, p as u16, "frame on the wrong pair");
                let i = u64::from_le_bytes(b[HDR + 1..HDR + 9].try_into().unwrap()) as usize;
                let mut want = frame(64 + (i % 200), t);
                want[0] = t;
                want[1..9].copy_from_slice(&(i as u64).to_le_bytes());
                assert_eq!(&b[HDR..], &want[..], "payload");
                free[p].push(id as u16);
                posted[p] -= 1;
                seen += 1;
            }
            while posted[p] < 8 {
                let d = free[p].pop().unwrap();
                // Direct descriptor d (ring descriptor index == buffer index).
                v.rings[r].write_desc(&g, v.rings[r].desc, d, (buf_addr(p, d), 2048, 2, 0));
                v.rings[r].publish(&g, d);
                posted[p] += 1;
            }
        }
        if senders.iter().all(|h| h.is_finished()) {
            // Final reap happens in the next iteration; stop when nothing is outstanding.
            let outstanding = (0..2).any(|p| v.rings[2 * p].used_idx(&g) != v.rings[2 * p].last_used);
            if !outstanding {
                break;
            }
        }
        assert!(Instant::now() < deadline, "driver loop timed out");
    }
    let (ok, nobuf) = senders.into_iter().map(|h| h.join().unwrap()).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    assert_eq!(ok + nobuf, 4 * PER_THREAD as u64);
    assert_eq!(ok, seen, "every accepted frame reached the driver");
    assert!(ok > 0);
    let c = s.backend.counters();
    let delivered: u64 = c.pairs.iter().map(|p| p.rx_frames).sum();
    let dropped: u64 = c.pairs.iter().map(|p| p.rx_no_buffers).sum();
    assert_eq!((delivered, dropped), (ok, nobuf));
    eprintln!("concurrent delivery: {ok} delivered, {nobuf} refused with NoBuffers");
    drop(fe);
}

#[test]
fn qemu_order_two_pairs() {
    let s = Setup::new(2, None);
    run_scenario(&s, 2, 0);
    let links = s.rec.link.lock().unwrap().clone();
    assert_eq!(links, vec![true, false]);
    // Pair 0 was enabled by the early SET_VRING_ENABLE (before SET_FEATURES).
    assert_eq!(s.rec.qstate.lock().unwrap()[0], (0, true));
}

#[test]
fn qemu_order_three_pairs_two_threads() {
    let s = Setup::new(3, Some(2));
    run_scenario(&s, 3, 0);
}

#[test]
fn two_frontends_back_to_back() {
    let s = Setup::new(3, None);
    run_scenario(&s, 3, 0);
    s.rec.tx.lock().unwrap().clear();
    // A second QEMU connects to the same socket after the first one went away.
    run_scenario(&s, 3, 1);
    assert_eq!(s.backend.counters().connections, 2);
    assert_eq!(*s.rec.link.lock().unwrap(), vec![true, false, true, false]);
}

#[test]
fn hostile_descriptors_are_counted_not_fatal() {
    let s = Setup::new(2, None);
    let g = new_guest();
    let mut fe = connect(&s.path);
    let mut v = qemu_startup(&mut fe, &g, 2, true);
    wait_for("link up", || s.rx.link_up());
    let t = 1usize;
    // 1. Address outside guest memory.
    v.rings[t].add_chain(&g, &[(MEM_SIZE + 0x1000, 100, false)]);
    // 2. A descriptor loop: 2 -> 3 -> 2 ...
    let head = v.rings[t].next_desc;
    v.rings[t].write_desc(&g, v.rings[t].desc, head, (BUF_BASE, 64, 1, head + 1));
    v.rings[t].write_desc(&g, v.rings[t].desc, head + 1, (BUF_BASE, 64, 1, head));
    v.rings[t].next_desc += 2;
    v.rings[t].publish(&g, head);
    // 3. Oversized frame: 65550 + 12 + 1 bytes.
    v.rings[t].add_chain(&g, &[(BUF_BASE, 65_563, false)]);
    // 4. Length that overflows the address space.
    v.rings[t].add_chain(&g, &[(u64::MAX - 10, 100, false)]);
    // 5. next index out of range.
    let h = v.rings[t].next_desc;
    v.rings[t].write_desc(&g, v.rings[t].desc, h, (BUF_BASE, 64, 1, 999));
    v.rings[t].next_desc += 1;
    v.rings[t].publish(&g, h);
    // 6. A good frame after all that.
    let f = frame(80, 42);
    let a = BUF_BASE + 0x4_0000;
    g.mem().write_slice(&[0u8; HDR], GuestAddress(a)).unwrap();
    g.mem().write_slice(&f, GuestAddress(a + HDR as u64)).unwrap();
    v.rings[t].add_chain(&g, &[(a, (HDR + 80) as u32, false)]);
    v.kicks[t].write(1).unwrap();
    wait_for("good frame after bad ones", || s.rec.tx.lock().unwrap().iter().any(|(p, b)| *p == 0 && *b == f));
    wait_for("all chains used", || v.rings[t].used_idx(&g) == 6);
    let c = s.backend.counters().pairs[0];
    assert_eq!(c.tx_frames, 1);
    assert_eq!(c.tx_errors, 1, "oversized");
    assert_eq!(c.desc_errors, 4, "bad address, loop, overflow, bad next");

    // RX: a read-only chain in the RX ring, then a frame larger than MAX_FRAME.
    let r = 0usize;
    v.rings[r].add_chain(&g, &[(BUF_BASE, 256, false)]);
    assert!(matches!(s.rx.deliver(0, &frame(64, 0)), Err(RxError::Memory(_))));
    assert_eq!(v.rings[r].used_idx(&g), 1, "malformed RX chain returned with len 0");
    assert_eq!(v.rings[r].pop_used(&g), Some((u32::from(v.rings[r].next_desc - 1), 0)));
    assert_eq!(s.rx.deliver(0, &vec![0u8; 65_551]), Err(RxError::TooLarge));
    // A broken avail index (more than queue size ahead) on pair 1's RX ring.
    g.mem().write_obj(0x4000u16.to_le(), GuestAddress(v.rings[2].avail + 2)).unwrap();
    assert!(matches!(s.rx.deliver(1, &frame(64, 0)), Err(RxError::Memory(_))));
    // Pair 0 still works.
    v.rings[r].add_chain(&g, &[(BUF_BASE + 0x1000, 2048, true)]);
    s.rx.deliver(0, &frame(64, 0)).unwrap();
    // And the connection is still alive.
    assert_eq!(fe.get_u64(GET_FEATURES).unwrap(), features::OFFERED);
    assert!(s.rx.link_up());
}

/// Random garbage in descriptor tables, avail rings and indices (with addresses sometimes
/// inside guest memory, sometimes not) while TX is kicked and RX delivered: only counted
/// errors, no panic, and the same backend (worker threads included) serves the next frontend.
#[test]
fn random_rings_never_panic() {
    let s = Setup::new(2, None);
    {
        let g = new_guest();
        let mut fe = connect(&s.path);
        let v = qemu_startup(&mut fe, &g, 2, true);
        wait_for("link up", || s.rx.link_up());
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..400 {
            for r in &v.rings {
                for i in 0..QSIZE {
                    let sel = rnd();
                    let addr = match sel % 4 {
                        0 => rnd(),
                        1 => rnd() % MEM_SIZE,
                        2 => MEM_SIZE - (rnd() % 64),
                        _ => BUF_BASE + (rnd() % 0x1000),
                    };
                    let len = match (sel >> 8) % 4 {
                        0 => rnd() as u32,
                        1 => (rnd() % 70_000) as u32,
                        2 => 16 * (rnd() % 8) as u32,
                        _ => (rnd() % 2048) as u32,
                    };
                    let flags = (rnd() % 8) as u16;
                    let next = (rnd() % 24) as u16;
                    r.write_desc(&g, r.desc, i, (addr, len, flags, next));
                    let head = (rnd() % 20) as u16;
                    g.mem().write_obj(head, GuestAddress(r.avail + 4 + 2 * u64::from(i))).unwrap();
                }
                let idx = (rnd() % 40) as u16;
                g.mem().write_obj(idx, GuestAddress(r.avail + 2)).unwrap();
                g.mem().write_obj((rnd() % 40) as u16, GuestAddress(r.avail + 4 + 2 * u64::from(QSIZE))).unwrap();
            }
            for p in 0..2u16 {
                let _ = s.rx.deliver(p, &frame((rnd() % 3000) as usize, 1));
                v.kicks[2 * usize::from(p) + 1].write(1).unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(300));
        let c = s.backend.counters();
        let errs: u64 = c.pairs.iter().map(|p| p.desc_errors + p.tx_errors).sum();
        assert!(errs > 0, "garbage must be counted");
        // The connection survived the garbage.
        assert_eq!(fe.get_u64(GET_FEATURES).unwrap(), features::OFFERED);
    }
    // The frontend is gone: wait until the backend has reset (no ring of the garbage
    // connection is processed any more), then serve a well-behaved one.
    wait_for("reset after disconnect", || !s.rx.link_up());
    s.rec.tx.lock().unwrap().clear();
    run_scenario(&s, 2, 7);
}

#[test]
fn batch_delivery_publishes_once_and_refuses_what_does_not_fit() {
    use arfsnic::vhost::GuestRx;
    let s = Setup::new(1, None);
    let g = new_guest();
    let mut fe = connect(&s.path);
    let mut v = qemu_startup(&mut fe, &g, 1, true);
    wait_for("link up", || s.rx.link_up());
    // The device never needs RX kicks and says so: EVENT_IDX is negotiated here, so
    // avail_event sits one behind the next avail entry.
    assert!(s.backend.counters().link_up);
    let mut ev = [0u8; 2];
    g.read(&mut ev, v.rings[0].used + 4 + 8 * u64::from(QSIZE));
    assert_eq!(u16::from_le_bytes(ev), 0xffff, "avail_event of the RX ring");

    let buf = |d: u16| BUF_BASE + 0x800 * u64::from(d);
    for d in 0..5 {
        v.rings[0].post_rx(&g, d, buf(d), 2048);
    }
    v.rings[0].arm_interrupt(&g);
    let frames: Vec<Vec<u8>> = (0..8).map(|i| frame(100 + i, i as u8)).collect();
    let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    let mut out = vec![Ok(()); 8];
    let before = s.backend.counters().pairs[0];
    s.rx.deliver_batch(0, &refs, &[], &mut out);
    assert!(out[..5].iter().all(|o| o.is_ok()), "{out:?}");
    assert!(out[5..].iter().all(|o| *o == Err(RxError::NoBuffers)), "{out:?}");
    assert_eq!(v.rings[0].used_idx(&g), 5, "the five frames, published together");
    for i in 0..5u16 {
        let (id, len) = v.rings[0].pop_used(&g).unwrap();
        assert_eq!((id, len as usize), (u32::from(i), HDR + frames[usize::from(i)].len()));
        let mut b = vec![0u8; len as usize];
        g.read(&mut b, buf(i));
        assert_eq!(&b[HDR..], &frames[usize::from(i)][..]);
    }
    let after = s.backend.counters().pairs[0];
    assert_eq!(after.rx_frames - before.rx_frames, 5);
    assert_eq!(after.rx_no_buffers - before.rx_no_buffers, 3);
    assert_eq!(after.interrupts - before.interrupts, 1, "one interrupt for the batch");

    // Mergeable buffers: a frame over three 256-byte buffers between two small frames. The
    // avail entries read for the first frame carry the second; the third finds none left.
    for d in 5..9 {
        v.rings[0].post_rx(&g, d, buf(d), 256);
    }
    let (small, big) = (frame(60, 9), frame(600, 10));
    let mut out = vec![Ok(()); 3];
    s.rx.deliver_batch(0, &[&small[..], &big[..], &small[..]], &[], &mut out);
    assert_eq!(out, vec![Ok(()), Ok(()), Err(RxError::NoBuffers)]);
    assert_eq!(v.rings[0].used_idx(&g), 9, "one used element for the small frame, three for the big one");
    let used: Vec<(u32, u32)> = (0..4).map(|_| v.rings[0].pop_used(&g).unwrap()).collect();
    assert_eq!(used, vec![(5, (HDR + 60) as u32), (6, 256), (7, 256), (8, (HDR + 600 - 512) as u32)]);
    let mut hdr = [0u8; HDR];
    g.read(&mut hdr, buf(6));
    assert_eq!(u16::from_le_bytes([hdr[10], hdr[11]]), 3, "num_buffers of the big frame");
    drop(fe);
}

/// The device finds every frame's buffers first and writes the batch afterwards. Frames in
/// buffers of 100 small segments, the header split over the first three, land byte for
/// byte, also when the batch's segments outgrow what the device keeps (it writes what it
/// has and goes on).
#[test]
fn batch_writes_frames_split_over_many_segments() {
    use arfsnic::vhost::GuestRx;
    let s = Setup::new(1, None);
    let g = new_guest();
    let mut fe = connect(&s.path);
    let mut v = qemu_startup(&mut fe, &g, 1, true);
    wait_for("link up", || s.rx.link_up());
    // Segment k of frame i at seg(i, k): 5 and 4 bytes, then 98 of 11 (1087 bytes).
    let seg = |i: u64, k: u64| BUF_BASE + 0x1000 * i + 0x20 * k;
    let lens: Vec<u32> = [5, 4].into_iter().chain(std::iter::repeat_n(11, 98)).collect();
    for i in 0..4u64 {
        let segs: Vec<(u64, u32)> = lens.iter().enumerate().map(|(k, &l)| (seg(i, k as u64), l)).collect();
        v.rings[0].add_indirect_dir(&g, BUF_BASE + 0x10_0000 + 0x1000 * i, &segs, true);
    }
    let frames: Vec<Vec<u8>> = (0..4).map(|i| frame(1000 + i, 40 + i as u8)).collect();
    let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    let mut out = vec![Ok(()); 4];
    s.rx.deliver_batch(0, &refs, &[], &mut out);
    assert!(out.iter().all(|o| o.is_ok()), "{out:?}");
    assert_eq!(v.rings[0].used_idx(&g), 4);
    for (i, f) in frames.iter().enumerate() {
        let (_, len) = v.rings[0].pop_used(&g).unwrap();
        assert_eq!(len as usize, HDR + f.len(), "frame {i}");
        let mut got = Vec::new();
        for (k, &l) in lens.iter().enumerate() {
            let mut b = vec![0u8; l as usize];
            g.read(&mut b, seg(i as u64, k as u64));
            got.extend_from_slice(&b);
        }
        assert_eq!(u16::from_le_bytes([got[10], got[11]]), 1, "num_buffers of frame {i}");
        assert_eq!(&got[..10], &[0u8; 10], "header of frame {i}");
        assert_eq!(&got[HDR..HDR + f.len()], &f[..], "frame {i}");
        assert!(got[HDR + f.len()..].iter().all(|&b| b == 0), "nothing written past frame {i}");
    }
    assert_eq!(s.backend.counters().pairs[0].desc_errors, 0);
    drop(fe);
}

/// With HASH_REPORT acked (QEMU's `hash=on`) the header is `virtio_net_hdr_v1_hash`, 20
/// bytes both ways: RX frames carry the NIC's hash and its kind, TX frames are read after
/// 20 bytes. Without it (every other test here) the header stays 12 bytes and the hash is
/// dropped.
#[test]
fn hash_report_puts_the_hash_into_a_20_byte_header_both_ways() {
    use arfsnic::model::rss::HashKind;
    use arfsnic::vhost::GuestRx;
    const HDR_HASH: usize = 20;
    let s = Setup::new(1, None);
    let g = new_guest();
    let mut fe = connect(&s.path);
    fe.acked = features::OFFERED;
    assert_ne!(fe.acked & features::HASH_REPORT, 0, "the backend offers HASH_REPORT");
    let mut v = qemu_startup(&mut fe, &g, 1, true);
    wait_for("link up", || s.rx.link_up());

    let buf = |d: u16| BUF_BASE + 0x800 * u64::from(d);
    for d in 0..3 {
        v.rings[0].post_rx(&g, d, buf(d), 2048);
    }
    let frames: Vec<Vec<u8>> = (0..3).map(|i| frame(80 + i, i as u8)).collect();
    let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    let hashes = [Some((0xdead_beef, HashKind::Tcpv4)), None, Some((7, HashKind::Udpv6))];
    let mut out = vec![Ok(()); 3];
    s.rx.deliver_batch(0, &refs, &hashes, &mut out);
    assert!(out.iter().all(|o| o.is_ok()), "{out:?}");
    for (i, want) in [(0xdead_beefu32, 2u16), (0, 0), (7, 6)].into_iter().enumerate() {
        let (id, len) = v.rings[0].pop_used(&g).unwrap();
        assert_eq!((id, len as usize), (i as u32, HDR_HASH + frames[i].len()));
        let mut b = vec![0u8; len as usize];
        g.read(&mut b, buf(i as u16));
        assert_eq!(u16::from_le_bytes([b[10], b[11]]), 1, "num_buffers");
        let value = u32::from_le_bytes(b[12..16].try_into().unwrap());
        let report = u16::from_le_bytes([b[16], b[17]]);
        assert_eq!((value, report), want, "hash_value, hash_report of frame {i}");
        assert_eq!(&b[HDR_HASH..], &frames[i][..]);
    }

    // TX: the frame starts after the 20-byte header.
    let f = frame(64, 42);
    let a = BUF_BASE + 0x4_0000;
    g.mem().write_slice(&[0u8; HDR_HASH], GuestAddress(a)).unwrap();
    g.mem().write_slice(&f, GuestAddress(a + HDR_HASH as u64)).unwrap();
    v.rings[1].add_chain(&g, &[(a, (HDR_HASH + f.len()) as u32, false)]);
    v.kicks[1].write(1).unwrap();
    wait_for("tx frame", || s.rec.tx.lock().unwrap().iter().any(|(p, b)| *p == 0 && *b == f));
    drop(fe);
}
