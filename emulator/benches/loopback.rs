//! In-process loopback benchmark of the RX datapath: no QEMU, no guest kernel.
//!
//! `arfsnic::vhost::testing` plays QEMU (vhost-user messages in QEMU's order, guest memory in a
//! memfd shared through SET_MEM_TABLE) and the guest driver (4 RX split rings of 256 entries,
//! one 2 KiB buffer per descriptor, all posted). The device side is the real thing: a
//! `Backend` serving the socket, an `EmulatedNic` with a `Nic` built from
//! `configs/mlx5-cx6.toml` with 4 queues, 1/4 of the flows steered by ntuple filters.
//!
//! One iteration = a batch of 256 UDP frames from 1024 flows through `EmulatedNic::to_guest`
//! (parse, filter lookup, Toeplitz RSS, virtio-net header + copy into the RX vring, used-ring
//! publication, counters), then the driver recycles every used buffer back to the avail ring
//! and re-arms the used-event index (one interrupt per queue and batch, as NAPI does).
//! Everything runs on the calling thread, so elements/s is packets/s per core.
//!
//! Variants, each for 64 B and 1514 B frames (Ethernet, no FCS):
//! * `datapath`: the above, in bursts of 32 through `EmulatedNic::to_guest_batch` (one
//!   clock read per burst; per queue one ring lock, one `used.idx` publication and one
//!   interrupt decision);
//! * `datapath_1by1`: the same through `EmulatedNic::to_guest`, one frame at a time;
//! * `deliver_only`: `RxPort::deliver` to a precomputed queue (ring logic + copy, no classify);
//! * `classify_only`: `Classifier::decide_frame` per frame; one clock read, one RSS
//!   configuration load and filter-table guard and one counter update per queue per burst
//!   (`Nic::record_delivered`), as `to_guest_batch` (no ring, no copy);
//! * `classify_1by1`: `Classifier::decide_frame` with a clock read, a classifier and
//!   `Nic::record` per frame,
//!   as `to_guest`;
//! * `memcpy_vm_memory`: baseline, the 12-byte header + frame written with vm-memory's
//!   `write_slice` (the primitive the backend uses) into the same guest buffers, no ring;
//! * `memcpy_raw`: baseline, the same with `ptr::copy_nonoverlapping` into the mapping.
//!
//! After criterion, an interleaved summary (rounds alternate the variants so they see the
//! same machine noise; median of the rounds) prints Mpps and ratios to the baselines, then
//! multiqueue scaling: `datapath` on 1 and 2 threads (`LOOPBACK_THREADS=1,2,4`), thread t
//! owning the queues q with q % threads == t and recycling its own rings.
//! Numbers: docs/performance.md ("Loopback datapath").

use std::hint::black_box;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arfsnic::device::clock::Clock;
use arfsnic::device::EmulatedNic;
use arfsnic::model::filter::Action;
use arfsnic::model::nic::Nic;
use arfsnic::model::profile::Profile;
use arfsnic::traffic::{Delivery, ToGuest};
use arfsnic::vhost::testing::{DrvRing, Frontend, GuestMem, Vrings, NET_HDR_LEN};
use arfsnic::vhost::{Backend, RxPort, ServeConfig};
use arfsnic::wire::{FlowKey, L4Proto};
use criterion::{Criterion, Throughput};
use etherparse::PacketBuilder;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

const PAIRS: u16 = 4;
const QSIZE: u16 = 256;
const BUF_LEN: u32 = 2048;
const BUF_BASE: u64 = 0x10_0000;
const MEM_SIZE: u64 = 8 << 20;
/// Frames per iteration; equal to the ring size, so no queue can run out of buffers.
const BATCH: usize = 256;
/// Frames per `to_guest_batch` call (DPDK testpmd's default burst, as `serve --pktgen`).
const BURST: usize = 32;
const NO_DELIVERY: Delivery = Delivery { queue: None, delivered: false, filter: None };
const FLOWS: usize = 1024;

fn buf_addr(q: usize, id: u16) -> u64 {
    BUF_BASE + (q as u64 * u64::from(QSIZE) + u64::from(id)) * u64::from(BUF_LEN)
}

fn flow_tuple(i: usize) -> ([u8; 4], u16, [u8; 4], u16) {
    ([10, 98, (i >> 8) as u8, (i & 0xff) as u8], (10000 + i) as u16, [10, 98, 0, 2], 7000 + (i % 64) as u16)
}

/// A UDP/IPv4 Ethernet frame of exactly `len` bytes for flow `i`.
fn frame(i: usize, len: usize) -> Vec<u8> {
    let (s, sp, d, dp) = flow_tuple(i);
    let mut v = Vec::with_capacity(len);
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [0x52, 0x54, 0, 0x12, 0x34, 0x56])
        .ipv4(s, d, 64)
        .udp(sp, dp)
        .write(&mut v, &vec![0xa5u8; len - 42])
        .expect("frame");
    assert_eq!(v.len(), len);
    v
}

struct Rig {
    emu: Arc<EmulatedNic>,
    rx: RxPort,
    g: GuestMem,
    v: Vrings,
    fe: Frontend,
    backend: Arc<Backend>,
    stop: Arc<AtomicBool>,
    server: Option<std::thread::JoinHandle<()>>,
    /// memcpy baselines: next buffer per queue, host address of every buffer.
    slot: [u16; PAIRS as usize],
    host: Vec<*mut u8>,
    _dir: tempfile::TempDir,
}

/// The frames of one size and, per frame, the queue the model gives it.
struct Frames {
    len: usize,
    frames: Vec<Vec<u8>>,
    queues: Vec<u16>,
}

impl Rig {
    fn new() -> Rig {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let profile = Profile::load(&root.join("configs/mlx5-cx6.toml")).expect("profile");
        let nic = Arc::new(Nic::new(&profile, PAIRS).expect("nic"));
        let emu = EmulatedNic::new(nic, Clock::new());
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("loopback.sock");
        let backend = Arc::new(Backend::new(ServeConfig::new(&sock, PAIRS), emu.clone()).expect("backend"));
        emu.attach_rx(Arc::new(backend.rx_port()));
        let rx = backend.rx_port();
        let stop = Arc::new(AtomicBool::new(false));
        let (b, s) = (backend.clone(), stop.clone());
        let server = std::thread::spawn(move || b.serve(&s).expect("serve"));

        let g = GuestMem::new(MEM_SIZE).expect("guest memory");
        assert!(buf_addr(usize::from(PAIRS), 0) <= MEM_SIZE);
        let mut fe = Frontend::connect(&sock, Duration::from_secs(5)).expect("connect");
        let mut v = fe.qemu_startup(&g, PAIRS, QSIZE, true).expect("startup");
        let t = Instant::now();
        while !rx.link_up() {
            assert!(t.elapsed() < Duration::from_secs(5), "link did not come up");
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut host = Vec::new();
        for q in 0..usize::from(PAIRS) {
            let r = &mut v.rings[2 * q];
            for id in 0..QSIZE {
                r.post_rx(&g, id, buf_addr(q, id), BUF_LEN);
                let a = GuestAddress(buf_addr(q, id));
                // Whole buffer inside the (single) region: the raw baseline may copy into it.
                g.mem().get_slice(a, BUF_LEN as usize).expect("buffer in guest memory");
                host.push(g.mem().get_host_address(a).expect("host address"));
            }
            r.arm_interrupt(&g);
        }
        // A quarter of the flows get an ntuple filter to the queue after their RSS queue.
        let now = emu.clock.now_ns();
        for i in (0..FLOWS).step_by(4) {
            let f = frame(i, 64);
            let (_, d) = emu.nic.classify_frame(&f, now).expect("classify");
            let (s, sp, dd, dp) = flow_tuple(i);
            let key = FlowKey::v4(L4Proto::Udp, s, sp, dd, dp);
            let q = (d.rss.queue + 1) % PAIRS;
            emu.nic.table().insert(i as u32, key, Action::Queue(q), now).expect("filter insert");
            let (_, d2) = emu.nic.classify_frame(&f, now).expect("classify");
            assert_eq!((d2.queue, d2.filter), (Some(q), Some(i as u32)), "filter for flow {i}");
        }
        let mut rig =
            Rig { emu, rx, g, v, fe, backend, stop, server: Some(server), slot: [0; PAIRS as usize], host, _dir: dir };
        rig.check_one();
        rig
    }

    fn frames(&self, len: usize) -> Frames {
        let now = self.emu.clock.now_ns();
        let frames: Vec<Vec<u8>> = (0..FLOWS).map(|i| frame(i, len)).collect();
        let queues = frames
            .iter()
            .map(|f| {
                let (_, d) = self.emu.nic.classify_frame(f, now).expect("classify");
                d.queue.expect("queue")
            })
            .collect();
        Frames { len, frames, queues }
    }

    /// One frame through the datapath, read back from guest memory and given back.
    fn check_one(&mut self) {
        let f = frame(5, 100);
        let d = self.emu.to_guest(&f);
        assert!(d.delivered, "{d:?}");
        let q = usize::from(d.queue.expect("queue"));
        let ring = &mut self.v.rings[2 * q];
        let (id, len) = ring.pop_used(&self.g).expect("used element");
        assert_eq!(len as usize, NET_HDR_LEN + f.len());
        let mut got = vec![0u8; len as usize];
        self.g.read(&mut got, buf_addr(q, id as u16));
        assert_eq!(&got[..10], &[0u8; 10], "virtio_net_hdr");
        assert_eq!(u16::from_le_bytes([got[10], got[11]]), 1, "num_buffers");
        assert_eq!(&got[NET_HDR_LEN..], &f[..]);
        ring.put_avail(&self.g, id as u16);
        ring.flush_avail(&self.g);
        ring.arm_interrupt(&self.g);
    }

    /// The driver: every used RX buffer back to avail, interrupts re-armed.
    fn recycle(&mut self) {
        for q in 0..usize::from(PAIRS) {
            let r = &mut self.v.rings[2 * q];
            r.recycle_used(&self.g);
            r.arm_interrupt(&self.g);
        }
    }

    /// Full datapath: `EmulatedNic::to_guest_batch` in bursts of `BURST`, then recycle.
    fn datapath(&mut self, fr: &Frames, start: usize) -> usize {
        let mut ok = 0;
        let mut out = [NO_DELIVERY; BURST];
        for b in (0..BATCH).step_by(BURST) {
            let burst: [&[u8]; BURST] = std::array::from_fn(|k| fr.frames[(start + b + k) % FLOWS].as_slice());
            self.emu.to_guest_batch(&burst, &mut out);
            ok += out.iter().filter(|d| d.delivered).count();
        }
        self.recycle();
        ok
    }

    /// The same one frame at a time (`EmulatedNic::to_guest`): a lock, a publication and an
    /// interrupt decision per frame.
    fn datapath_1by1(&mut self, fr: &Frames, start: usize) -> usize {
        let mut ok = 0;
        for k in 0..BATCH {
            ok += usize::from(self.emu.to_guest(&fr.frames[(start + k) % FLOWS]).delivered);
        }
        self.recycle();
        ok
    }

    /// Ring logic + copy only: `RxPort::deliver` to the precomputed queue, then recycle.
    fn deliver_only(&mut self, fr: &Frames, start: usize) -> usize {
        let mut ok = 0;
        for k in 0..BATCH {
            let i = (start + k) % FLOWS;
            ok += usize::from(self.rx.deliver(fr.queues[i], &fr.frames[i]).is_ok());
        }
        self.recycle();
        ok
    }

    /// Parse + filter lookup + RSS + counters only, as `to_guest_batch` does them: one clock
    /// read and one RSS configuration load (`Nic::classifier`) per burst, each queue's
    /// counters updated once per burst.
    fn classify_only(&mut self, fr: &Frames, start: usize) -> usize {
        let nic = &self.emu.nic;
        let mut ok = 0;
        for b in (0..BATCH).step_by(BURST) {
            let now = self.emu.clock.now_ns();
            let c = nic.classifier();
            // Per queue: frames, bytes, via a filter.
            let mut per_q = [(0u64, 0u64, 0u64); PAIRS as usize];
            for k in b..b + BURST {
                let f = &fr.frames[(start + k) % FLOWS];
                let Ok(d) = c.decide_frame(f, now) else { continue };
                let Some(c) = black_box(d).queue.and_then(|q| per_q.get_mut(usize::from(q))) else { continue };
                *c = (c.0 + 1, c.1 + f.len() as u64, c.2 + u64::from(d.filter.is_some() || d.rule.is_some()));
                ok += 1;
            }
            for (q, &(n, bytes, via)) in per_q.iter().enumerate() {
                nic.record_delivered(q as u16, n, bytes, via);
            }
        }
        ok
    }

    /// The same a frame at a time, as `to_guest` does: a clock read and the counters per frame.
    fn classify_1by1(&mut self, fr: &Frames, start: usize) -> usize {
        let nic = &self.emu.nic;
        let mut ok = 0;
        for k in 0..BATCH {
            let f = &fr.frames[(start + k) % FLOWS];
            if let Ok(d) = nic.classifier().decide_frame(f, self.emu.clock.now_ns()) {
                nic.record(&d, f.len(), true);
                ok += usize::from(black_box(d).queue.is_some());
            }
        }
        ok
    }

    fn next_buf(&mut self, q: u16) -> (u64, usize) {
        let q = usize::from(q);
        let id = self.slot[q];
        self.slot[q] = (id + 1) % QSIZE;
        (buf_addr(q, id), q * usize::from(QSIZE) + usize::from(id))
    }

    /// Baseline: header + frame into the buffer the datapath would use, with vm-memory.
    fn memcpy_vm_memory(&mut self, fr: &Frames, start: usize) -> usize {
        let mut hdr = [0u8; NET_HDR_LEN];
        hdr[10] = 1;
        let mut ok = 0;
        for k in 0..BATCH {
            let i = (start + k) % FLOWS;
            let (a, _) = self.next_buf(fr.queues[i]);
            let m = self.g.mem();
            let r = m
                .write_slice(&hdr, GuestAddress(a))
                .and_then(|()| m.write_slice(&fr.frames[i], GuestAddress(a + NET_HDR_LEN as u64)));
            ok += usize::from(r.is_ok());
        }
        ok
    }

    /// Baseline: the same copies with `ptr::copy_nonoverlapping` into the mapping.
    fn memcpy_raw(&mut self, fr: &Frames, start: usize) -> usize {
        let mut hdr = [0u8; NET_HDR_LEN];
        hdr[10] = 1;
        for k in 0..BATCH {
            let i = (start + k) % FLOWS;
            let (_, b) = self.next_buf(fr.queues[i]);
            let f = &fr.frames[i];
            assert!(NET_HDR_LEN + f.len() <= BUF_LEN as usize);
            let dst = self.host[b];
            // SAFETY: `dst` is the host address of a BUF_LEN-byte buffer checked to lie inside
            // the guest memory mapping (Rig::new), which lives as long as `self.g`; we write
            // at most BUF_LEN bytes (asserted above). Nothing else touches these buffers while
            // the baseline runs (no ring activity), and the sources are ordinary heap memory
            // that cannot overlap the mapping.
            unsafe {
                std::ptr::copy_nonoverlapping(hdr.as_ptr(), dst, NET_HDR_LEN);
                std::ptr::copy_nonoverlapping(f.as_ptr(), dst.add(NET_HDR_LEN), f.len());
            }
        }
        black_box(self.host[0]);
        BATCH
    }
}

/// Multiqueue scaling: `threads` threads, thread t owning the queues q with q % threads == t,
/// each offering the frames RSS and the filters give its queues in bursts through
/// `to_guest_batch` and recycling its own RX rings (as a driver with one NAPI context per
/// queue would). Returns frames/s over all threads, in Mpps.
fn scaling(rig: &mut Rig, fr: &Frames, threads: usize, dur: Duration) -> f64 {
    let (emu, g) = (&rig.emu, &rig.g);
    let mut owned: Vec<Vec<&mut DrvRing>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, r) in rig.v.rings.iter_mut().enumerate().filter(|(i, _)| i % 2 == 0) {
        owned[(i / 2) % threads].push(r);
    }
    let mine: Vec<Vec<&[u8]>> = (0..threads)
        .map(|t| {
            fr.frames
                .iter()
                .zip(&fr.queues)
                .filter(|(_, q)| usize::from(**q) % threads == t)
                .map(|(f, _)| f.as_slice())
                .collect()
        })
        .collect();
    std::thread::scope(|sc| {
        let hs: Vec<_> = owned
            .into_iter()
            .zip(&mine)
            .map(|(mut rings, frames)| {
                sc.spawn(move || {
                    let t0 = Instant::now();
                    let (mut n, mut pos) = (0usize, 0usize);
                    let mut out = [NO_DELIVERY; BURST];
                    while t0.elapsed() < dur {
                        // At most BATCH frames per queue between two recycles: never runs dry.
                        for _ in 0..BATCH / BURST {
                            let burst: [&[u8]; BURST] = std::array::from_fn(|k| frames[(pos + k) % frames.len()]);
                            pos = (pos + BURST) % frames.len();
                            emu.to_guest_batch(&burst, &mut out);
                            n += out.iter().filter(|d| d.delivered).count();
                        }
                        for r in rings.iter_mut() {
                            r.recycle_used(g);
                            r.arm_interrupt(g);
                        }
                    }
                    n as f64 / t0.elapsed().as_secs_f64() / 1e6
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("scaling thread")).sum()
    })
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = self.fe.qemu_shutdown(PAIRS);
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.server.take() {
            let _ = h.join();
        }
    }
}

type Variant = fn(&mut Rig, &Frames, usize) -> usize;

const VARIANTS: [(&str, Variant); 7] = [
    ("datapath", Rig::datapath),
    ("datapath_1by1", Rig::datapath_1by1),
    ("deliver_only", Rig::deliver_only),
    ("classify_only", Rig::classify_only),
    ("classify_1by1", Rig::classify_1by1),
    ("memcpy_vm_memory", Rig::memcpy_vm_memory),
    ("memcpy_raw", Rig::memcpy_raw),
];

fn run_criterion(rig: &mut Rig, sets: &[Frames]) {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20)
        .configure_from_args();
    for fr in sets {
        let mut g = c.benchmark_group(format!("loopback_{}B", fr.len));
        g.throughput(Throughput::Elements(BATCH as u64));
        for (name, f) in VARIANTS {
            let mut start = 0usize;
            g.bench_function(name, |b| {
                b.iter(|| {
                    start = (start + BATCH) % FLOWS;
                    let n = f(rig, fr, start);
                    assert_eq!(n, BATCH, "{name}: every frame must be delivered");
                })
            });
        }
        g.finish();
    }
    c.final_summary();
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Rounds alternate the variants (each ~150 ms) so all see the same noise; medians in Mpps.
fn interleaved_summary(rig: &mut Rig, sets: &[Frames], rounds: usize) {
    println!("\nloopback summary ({rounds} interleaved rounds of ~150 ms per variant, median; one thread = one core)");
    for fr in sets {
        let mut mpps: Vec<Vec<f64>> = vec![Vec::new(); VARIANTS.len()];
        let mut start = 0usize;
        for _ in 0..rounds {
            for (k, (name, f)) in VARIANTS.iter().enumerate() {
                let t = Instant::now();
                let mut n = 0usize;
                while t.elapsed() < Duration::from_millis(150) {
                    start = (start + BATCH) % FLOWS;
                    let got = f(rig, fr, start);
                    assert_eq!(got, BATCH, "{name}: every frame must be delivered");
                    n += got;
                }
                mpps[k].push(n as f64 / t.elapsed().as_secs_f64() / 1e6);
            }
        }
        let med: Vec<f64> = mpps.iter_mut().map(|v| median(v)).collect();
        let (vm, raw) = (med[5], med[6]);
        println!("  {} B frames:", fr.len);
        for (k, (name, _)) in VARIANTS.iter().enumerate() {
            println!(
                "    {name:<17} {:>7.2} Mpps  {:>6.1} ns/frame  {:>5.2}x memcpy_vm_memory  {:>5.2}x memcpy_raw",
                med[k],
                1e3 / med[k],
                med[k] / vm,
                med[k] / raw
            );
        }
    }
    let threads: Vec<usize> = std::env::var("LOOPBACK_THREADS")
        .ok()
        .map(|s| s.split(',').filter_map(|t| t.trim().parse().ok()).filter(|&t| t >= 1).collect())
        .unwrap_or_else(|| vec![1, 2]);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("  multiqueue scaling ({rounds} interleaved rounds of 300 ms, median; {PAIRS} queues, {cores} cores):");
    for fr in sets {
        let mut mpps: Vec<Vec<f64>> = vec![Vec::new(); threads.len()];
        for _ in 0..rounds {
            for (k, &t) in threads.iter().enumerate() {
                mpps[k].push(scaling(rig, fr, t, Duration::from_millis(300)));
            }
        }
        let med: Vec<f64> = mpps.iter_mut().map(|v| median(v)).collect();
        for (k, &t) in threads.iter().enumerate() {
            println!("    {} B, {t} thread(s): {:>7.2} Mpps  {:>5.2}x one thread", fr.len, med[k], med[k] / med[0]);
        }
    }
    let n = rig.emu.nic.snapshot();
    let c = rig.backend.counters();
    println!(
        "  per-queue rx: {:?}; filter-steered: {}; dropped (no buffer): {}; interrupts: {:?}",
        n.queues.iter().map(|q| q.rx_packets).collect::<Vec<_>>(),
        n.queues.iter().map(|q| q.filter_delivered).sum::<u64>(),
        n.queues.iter().map(|q| q.dropped_no_buffer).sum::<u64>(),
        c.pairs.iter().map(|p| p.interrupts).collect::<Vec<_>>()
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--test" || a == "--list");
    let mut rig = Rig::new();
    let sets = [rig.frames(64), rig.frames(1514)];
    run_criterion(&mut rig, &sets);
    // LOOPBACK_ROUNDS=0: criterion only (e.g. under a profiler with a benchmark filter).
    if !quick {
        let rounds = std::env::var("LOOPBACK_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(9);
        if rounds > 0 {
            interleaved_summary(&mut rig, &sets, rounds);
        }
    }
    let n = rig.emu.nic.snapshot();
    assert_eq!(n.queues.iter().map(|q| q.dropped_no_buffer).sum::<u64>(), 0, "the harness never lets a queue run dry");
    if !quick {
        assert!(n.queues.iter().map(|q| q.filter_delivered).sum::<u64>() > 0);
        assert!(n.queues.iter().all(|q| q.rss_delivered > 0));
    }
}
