//! Packet generator on the wire side (`arfsnic serve --pktgen BYTES`): the backend as a
//! throughput source and sink for a polling frontend, so its datapath can be measured side by
//! side with DPDK's vhost PMD on the same frontend (DPDK's virtio_user PMD in testpmd,
//! `guest-tests/perf/vs-dpdk.sh`, docs/performance.md).
//!
//! * **Towards the guest** (the frontend's RX): one generator thread per worker thread offers
//!   UDP/IPv4 frames of exactly `frame_len` bytes from [`FLOWS`] flows (distinct source
//!   address and port) through [`ToGuest::to_guest`] as fast as the RX rings take them, with
//!   everything a wire frame gets: parse, ntuple filter lookup, Toeplitz RSS, the virtio-net
//!   header and copy into the RX vring, used-ring publication, the interrupt decision,
//!   counters. Every [`STEER_EVERY`]th flow has an ntuple filter to the queue after its RSS
//!   queue (with one queue: to queue 0, so the lookup still hits), installed whenever the
//!   link comes up (a device reset empties the table). Thread `t` owns the flows whose queue
//!   is `t` modulo the number of threads, so no two generators share a vring. A frame the
//!   ring has no buffer for is dropped and counted, as DPDK's `txonly` does.
//! * **From the guest** (the frontend's TX): each frame is parsed and classified by the same
//!   model ([`crate::model::nic::Nic::classify_frame`]: filter lookup + RSS), counted, and
//!   dropped.

use crate::device::EmulatedNic;
use crate::model::filter::Action;
use crate::traffic::{Burst, Delivery, GuestPeer, ToGuest};
use crate::wire::{FlowKey, L4Proto};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Flows the generator cycles through.
pub const FLOWS: usize = 1024;
/// Every this many flows one gets an ntuple filter (a quarter).
pub const STEER_EVERY: usize = 4;
/// Smallest frame: Ethernet + IPv4 + UDP headers and a few bytes, as the wire's minimum (60 B
/// without FCS).
pub const MIN_FRAME: usize = 60;
/// Largest frame: a 9000-byte jumbo IP packet plus Ethernet and one VLAN tag.
pub const MAX_FRAME: usize = 9018;
/// Frames per `to_guest_batch` call (DPDK testpmd's default burst).
pub const BURST: usize = 32;
/// Filter ids the generator uses start here (the guest's control plane is not in use).
const FILTER_ID_BASE: u32 = 0x7000_0000;

#[derive(Debug, thiserror::Error)]
pub enum PktgenError {
    #[error("frame size must be {MIN_FRAME}..={MAX_FRAME} bytes, got {0}")]
    FrameLen(usize),
    #[error("generator threads must be >= 1")]
    Threads,
    #[error("starting a generator thread: {0}")]
    Spawn(std::io::Error),
}

/// Counters, summed over the threads (snapshot).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PktgenCounters {
    /// Frames offered to the NIC.
    pub offered: u64,
    /// Of those, written into an RX ring.
    pub delivered: u64,
    /// Not delivered: no RX buffer (or queue not ready).
    pub dropped: u64,
    /// Frames from the guest parsed and classified.
    pub tx_classified: u64,
    /// Of those, matched an ntuple filter.
    pub tx_steered: u64,
    /// Frames from the guest the parser refused.
    pub tx_unparsed: u64,
    /// Times the filters were installed (once per link up).
    pub filter_installs: u64,
}

/// Counters of one generator thread or one TX pair, on a cache line of their own. Each has a
/// single writer (its thread, or the worker holding that pair's TX vring), so updates are
/// plain load + store.
#[derive(Default)]
#[repr(align(64))]
struct Slot {
    a: AtomicU64,
    b: AtomicU64,
    c: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Relaxed).wrapping_add(n), Relaxed);
}

pub struct Pktgen {
    emu: Arc<EmulatedNic>,
    frame_len: usize,
    threads: usize,
    link: AtomicBool,
    /// Set by `link(true)` once the filters are in: generators run while it is set.
    armed: AtomicBool,
    stop: AtomicBool,
    gen: Vec<Slot>,
    tx: Vec<Slot>,
    installs: AtomicU64,
    handles: Mutex<Vec<JoinHandle<()>>>,
}

/// The 4-tuple of flow `i`.
fn flow_tuple(i: usize) -> ([u8; 4], u16, [u8; 4], u16) {
    ([10, 98, (i >> 8) as u8, (i & 0xff) as u8], 10000 + i as u16, [10, 98, 0, 2], 7000 + (i % 64) as u16)
}

/// A UDP/IPv4 Ethernet frame of exactly `len` bytes (`MIN_FRAME..=MAX_FRAME`) for flow `i`.
pub fn frame(i: usize, len: usize) -> Vec<u8> {
    let (s, sp, d, dp) = flow_tuple(i);
    let mut v = Vec::with_capacity(len);
    let payload = vec![0xa5u8; len.saturating_sub(42)];
    // Writing into a Vec cannot fail; an empty frame would be refused by the NIC and counted.
    let _ = etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [0x52, 0x54, 0, 0x12, 0x34, 0x56])
        .ipv4(s, d, 64)
        .udp(sp, dp)
        .write(&mut v, &payload);
    v
}

impl Pktgen {
    /// A generator for `emu` with `threads` generator threads (normally one per backend
    /// worker). Nothing runs until [`Pktgen::start`].
    pub fn new(emu: Arc<EmulatedNic>, frame_len: usize, threads: usize) -> Result<Arc<Self>, PktgenError> {
        if !(MIN_FRAME..=MAX_FRAME).contains(&frame_len) {
            return Err(PktgenError::FrameLen(frame_len));
        }
        if threads == 0 {
            return Err(PktgenError::Threads);
        }
        let pairs = usize::from(emu.nic.num_queues());
        Ok(Arc::new(Pktgen {
            emu,
            frame_len,
            threads,
            link: AtomicBool::new(false),
            armed: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            gen: (0..threads).map(|_| Slot::default()).collect(),
            tx: (0..pairs.max(1)).map(|_| Slot::default()).collect(),
            installs: AtomicU64::new(0),
            handles: Mutex::new(Vec::new()),
        }))
    }

    /// Starts the generator threads (they idle while the link is down).
    pub fn start(self: &Arc<Self>) -> Result<(), PktgenError> {
        let mut h = crate::sync::lock(&self.handles);
        for t in 0..self.threads {
            let me = self.clone();
            h.push(
                std::thread::Builder::new()
                    .name(format!("pktgen-{t}"))
                    .spawn(move || me.generate(t))
                    .map_err(PktgenError::Spawn)?,
            );
        }
        Ok(())
    }

    /// Stops and joins the generator threads.
    pub fn stop(&self) {
        self.stop.store(true, Release);
        for h in crate::sync::lock(&self.handles).drain(..) {
            let _ = h.join();
        }
    }

    pub fn counters(&self) -> PktgenCounters {
        let sum = |v: &[Slot], f: fn(&Slot) -> &AtomicU64| v.iter().map(|s| f(s).load(Relaxed)).sum::<u64>();
        let offered = sum(&self.gen, |s| &s.a);
        let delivered = sum(&self.gen, |s| &s.b);
        PktgenCounters {
            offered,
            delivered,
            dropped: offered.saturating_sub(delivered),
            tx_classified: sum(&self.tx, |s| &s.a),
            tx_steered: sum(&self.tx, |s| &s.b),
            tx_unparsed: sum(&self.tx, |s| &s.c),
            filter_installs: self.installs.load(Relaxed),
        }
    }

    /// Every `STEER_EVERY`th flow: a filter to the queue after its RSS queue.
    fn install_filters(&self) {
        let nic = &self.emu.nic;
        let pairs = nic.num_queues().max(1);
        let now = self.emu.clock.now_ns();
        for i in (0..FLOWS).step_by(STEER_EVERY) {
            let (s, sp, d, dp) = flow_tuple(i);
            let Ok((_, dec)) = nic.classify_frame(&frame(i, MIN_FRAME), now) else { continue };
            let q = (dec.rss.queue + 1) % pairs;
            let key = FlowKey::v4(L4Proto::Udp, s, sp, d, dp);
            if let Err(e) = nic.table().insert(FILTER_ID_BASE + i as u32, key, Action::Queue(q), now) {
                log::warn!("pktgen: filter for flow {i}: {e}");
            }
        }
        self.installs.fetch_add(1, Relaxed);
    }

    /// Generator thread `t`: the frames of the flows whose queue belongs to it, offered in a
    /// loop while the link is up.
    fn generate(&self, t: usize) {
        let slot = &self.gen[t];
        let mut mine: Vec<Vec<u8>> = Vec::new();
        let mut installs_seen = u64::MAX;
        while !self.stop.load(Acquire) {
            if !self.armed.load(Acquire) {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            // The queues depend on the RSS configuration and the filters of this link-up.
            let installs = self.installs.load(Relaxed);
            if installs != installs_seen {
                installs_seen = installs;
                let now = self.emu.clock.now_ns();
                mine = (0..FLOWS)
                    .map(|i| frame(i, self.frame_len))
                    .filter(|f| {
                        let q = self.emu.nic.classify_frame(f, now).ok().and_then(|(_, d)| d.queue).unwrap_or(0);
                        usize::from(q) % self.threads == t
                    })
                    .collect();
                if mine.is_empty() {
                    log::info!("pktgen-{t}: no flow maps to this thread's queues; idle");
                }
            }
            if mine.is_empty() {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            let refs: Vec<&[u8]> = mine.iter().map(Vec::as_slice).collect();
            let mut out = [Delivery { queue: None, delivered: false, filter: None }; BURST];
            let mut delivered = 0u64;
            for chunk in refs.chunks(BURST) {
                self.emu.to_guest_batch(chunk, &mut out);
                delivered += out[..chunk.len()].iter().filter(|d| d.delivered).count() as u64;
            }
            bump(&slot.a, mine.len() as u64);
            bump(&slot.b, delivered);
            if delivered == 0 {
                // Ring full (the frontend is not polling): let it run.
                std::thread::yield_now();
            }
        }
    }
}
impl GuestPeer for Pktgen {
    fn from_guest(&self, pair: u16, frame: &[u8]) {
        self.from_guest_burst(pair, &mut |sink| sink(frame));
    }

    /// One classifier and one clock read per TX burst, as the RX side per generated burst;
    /// the pair's counters updated once.
    fn from_guest_burst(&self, pair: u16, burst: &mut Burst<'_>) {
        let c = self.emu.nic.classifier();
        let now = self.emu.clock.now_ns();
        let (mut classified, mut steered, mut unparsed) = (0u64, 0u64, 0u64);
        burst(&mut |frame| match c.decide_frame(frame, now) {
            Ok(d) => {
                classified += 1;
                steered += u64::from(d.filter.is_some());
            }
            Err(_) => unparsed += 1,
        });
        let Some(s) = self.tx.get(usize::from(pair)) else { return };
        bump(&s.a, classified);
        bump(&s.b, steered);
        bump(&s.c, unparsed);
    }

    fn link(&self, up: bool) {
        let was = self.link.swap(up, Relaxed);
        if up && !was {
            self.install_filters();
            self.armed.store(true, Release);
        } else if !up {
            self.armed.store(false, Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::clock::Clock;
    use crate::device::{GuestRx, RxError};
    use crate::model::nic::Nic;
    use crate::model::profile::Profile;
    use std::path::Path;

    /// A guest with room for `cap` frames per queue, counting what it got.
    struct Sink {
        got: Vec<AtomicU64>,
        cap: u64,
    }
    impl GuestRx for Sink {
        fn deliver(&self, pair: u16, frame: &[u8]) -> Result<(), RxError> {
            assert!(frame.len() >= MIN_FRAME);
            let g = self.got.get(usize::from(pair)).ok_or(RxError::NoSuchQueue)?;
            if g.load(Relaxed) >= self.cap {
                return Err(RxError::NoBuffers);
            }
            g.fetch_add(1, Relaxed);
            Ok(())
        }
        fn enabled_pairs(&self) -> Vec<bool> {
            vec![true; self.got.len()]
        }
    }

    fn emu(queues: u16) -> Arc<EmulatedNic> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let profile = Profile::load(&root.join("configs/mlx5-cx6.toml")).unwrap();
        EmulatedNic::new(Arc::new(Nic::new(&profile, queues).unwrap()), Clock::new())
    }

    #[test]
    fn frames_have_the_requested_size_and_parse() {
        for len in [MIN_FRAME, 64, 1514, 1518, MAX_FRAME] {
            let f = frame(77, len);
            assert_eq!(f.len(), len);
            let p = crate::wire::parse::parse_frame(&f).unwrap();
            assert!(p.flow_key().is_some(), "{len}");
        }
        assert!(matches!(Pktgen::new(emu(1), 59, 1), Err(PktgenError::FrameLen(59))));
        assert!(matches!(Pktgen::new(emu(1), MAX_FRAME + 1, 1), Err(PktgenError::FrameLen(_))));
        assert!(matches!(Pktgen::new(emu(1), 64, 0), Err(PktgenError::Threads)));
    }

    #[test]
    fn generates_over_all_queues_steers_a_quarter_and_counts_drops() {
        let e = emu(4);
        let sink = Arc::new(Sink { got: (0..4).map(|_| AtomicU64::new(0)).collect(), cap: 20_000 });
        e.attach_rx(sink.clone());
        let g = Pktgen::new(e.clone(), 64, 2).unwrap();
        e.set_peer(Some(g.clone()));
        g.start().unwrap();
        // Nothing before link up.
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(g.counters().offered, 0);
        g.link(true);
        let t = std::time::Instant::now();
        let full = |c: PktgenCounters| c.delivered == 4 * 20_000 && c.dropped > 0;
        while !full(g.counters()) && t.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(10));
        }
        g.stop();
        e.set_peer(None);
        let c = g.counters();
        assert_eq!(c.delivered, 4 * 20_000, "{c:?}");
        assert!(c.dropped > 0, "{c:?}");
        assert_eq!(c.filter_installs, 1);
        assert_eq!(e.nic.table().len(), FLOWS / STEER_EVERY);
        for q in &sink.got {
            assert_eq!(q.load(Relaxed), 20_000);
        }
        // A quarter of the flows steered: the NIC's counters say so.
        let snap = e.nic.snapshot();
        let rx: u64 = snap.queues.iter().map(|q| q.rx_packets).sum();
        assert_eq!(rx, c.delivered);
    }

    #[test]
    fn classifies_and_drops_what_the_guest_sends() {
        let e = emu(2);
        let g = Pktgen::new(e.clone(), 64, 1).unwrap();
        g.link(true);
        for i in 0..FLOWS {
            g.from_guest(0, &frame(i, 128));
        }
        g.from_guest(1, &[0u8; 5]);
        g.from_guest(9, &frame(0, 64)); // no such pair: ignored
        let c = g.counters();
        assert_eq!((c.tx_classified, c.tx_steered, c.tx_unparsed), (FLOWS as u64, (FLOWS / STEER_EVERY) as u64, 1));
    }
}
