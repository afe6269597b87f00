//! Split-ring engines side by side: the backend's own `vhost::ring` against rust-vmm's
//! `virtio_queue::Queue`, on the same guest memory, the same driver and the same frames.
//!
//! The question (docs/architecture.md, "Rings"): would the datapath lose speed on
//! virtio-queue? Both engines do the work the backend does per burst of 32 frames, with the
//! same copy primitive (a `VolatileSlice` per descriptor):
//! * RX: take the next avail chain, check it is device-writable and big enough, write the
//!   12-byte virtio-net header and the frame, add the used element; after the burst one
//!   interrupt decision (EVENT_IDX) and an eventfd write when it says so.
//!   `arfsnic`: `SplitRing` through a `RingView` (the calls `vhost/device.rs` makes: pending,
//!   head, walk, consume, push_used, one `used.idx` publication per burst).
//!   `virtio-queue`: `pop_descriptor_chain`, `DescriptorChain::writer`, `add_used` (which
//!   publishes `used.idx` per element), `needs_notification`.
//! * TX: take the next chain, check it is driver-readable, read header + frame into a
//!   buffer, add a used element of length 0; the same interrupt decision per burst.
//!   `virtio-queue`: `pop_descriptor_chain`, `DescriptorChain::reader`, `add_used`.
//!
//! The driver (`vhost::testing::DrvRing`) keeps 256 one-descriptor chains of 2 KiB posted
//! per ring and, after every 256 frames, hands each used buffer back to the avail ring and
//! re-arms `used_event` (as the loopback bench's driver does). One thread: elements/s is
//! frames/s per core. Rounds alternate the engines (~150 ms each) so they see the same
//! noise; the medians and the ratio virtio-queue / arfsnic are printed. Numbers:
//! docs/performance.md ("Ring engines: arfsnic vs virtio-queue").

use std::hint::black_box;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use arfsnic::vhost::ring::{Regions, RingAddrs, RingView, Seg, SplitRing};
use arfsnic::vhost::testing::{DrvRing, GuestMem, NET_HDR_LEN};
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

#[path = "../tests/common/virtio_queue.rs"]
mod virtio_queue_on;
use virtio_queue_on::queue_on;

const QSIZE: u16 = 256;
const BUF_LEN: u32 = 2048;
const BUF_BASE: u64 = 0x10_0000;
const MEM_SIZE: u64 = 8 << 20;
const BURST: usize = 32;
/// Frames per iteration: one ring's worth, so neither engine runs out of buffers.
const BATCH: usize = QSIZE as usize;
/// virtio_net_hdr_mrg_rxbuf with num_buffers = 1.
const HDR: [u8; NET_HDR_LEN] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0];

/// Rings of the rig: RX and TX for each engine.
const RINGS: usize = 4;
const RX_OURS: usize = 0;
const RX_VQ: usize = 1;
const TX_OURS: usize = 2;
const TX_VQ: usize = 3;

fn buf_addr(ring: usize, id: u16) -> u64 {
    BUF_BASE + (ring as u64 * u64::from(QSIZE) + u64::from(id)) * u64::from(BUF_LEN)
}

fn ring_addrs(d: &DrvRing) -> RingAddrs {
    RingAddrs { size: d.size, desc: d.desc, avail: d.avail, used: d.used }
}

/// A frame of `len` bytes whose bytes differ from frame to frame.
fn frame(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|k| (i * 31 + k) as u8).collect()
}

/// Device-side state of both engines.
struct Engines {
    ours_rx: SplitRing,
    ours_tx: SplitRing,
    vq_rx: Queue,
    vq_tx: Queue,
    call: EventFd,
    segs: Vec<Seg>,
    used: Vec<(u16, u32)>,
    buf: Vec<u8>,
}

struct Rig {
    g: GuestMem,
    drv: Vec<DrvRing>,
    e: Engines,
    /// RX input of the current size; the TX buffers hold header + the same frames.
    frames: Vec<Vec<u8>>,
}

impl Engines {
    fn signal(&self, needed: bool) {
        if needed {
            let _ = self.call.write(1);
        }
    }

    /// One RX frame on our ring, as `vhost/device.rs` places a one-buffer frame.
    fn ours_rx_frame(&mut self, v: &RingView<'_>, mem: &GuestMemoryMmap, f: &[u8]) -> bool {
        let need = (NET_HDR_LEN + f.len()) as u64;
        let ring = &mut self.ours_rx;
        if ring.pending_in(v).unwrap_or(0) == 0 {
            return false;
        }
        let Ok(head) = ring.head_in(v, 0) else { return false };
        self.segs.clear();
        match ring.walk_in(v, &Regions::new(mem), head, true, &mut self.segs) {
            Ok(cap) if cap >= need => {}
            _ => return false,
        }
        let pieces = [&HDR[..], f];
        let (mut piece, mut off) = (0usize, 0usize);
        for s in &self.segs {
            let Ok(vs) = mem.get_slice(GuestAddress(s.addr), s.len as usize) else { return false };
            let mut at = 0usize;
            while at < vs.len() && piece < pieces.len() {
                let p = pieces[piece];
                let n = (p.len() - off).min(vs.len() - at);
                if vs.write_slice(&p[off..off + n], at).is_err() {
                    return false;
                }
                at += n;
                off += n;
                if off == p.len() {
                    piece += 1;
                    off = 0;
                }
            }
        }
        ring.consume(1);
        ring.push_used_in(v, &[(head, need as u32)]).is_ok()
    }

    fn ours_rx(&mut self, mem: &GuestMemoryMmap, frames: &[Vec<u8>]) -> usize {
        let mut ok = 0;
        for burst in frames.chunks(BURST) {
            let addrs = self.ours_rx.addrs;
            let v = RingView::new(mem, &addrs).expect("ring view");
            let old = self.ours_rx.next_used;
            for f in burst {
                ok += usize::from(self.ours_rx_frame(&v, mem, f));
            }
            let _ = self.ours_rx.publish_in(&v);
            let n = self.ours_rx.next_used != old && self.ours_rx.needs_notification_in(&v, old);
            self.signal(n);
        }
        ok
    }

    fn vq_rx(&mut self, mem: &GuestMemoryMmap, frames: &[Vec<u8>]) -> usize {
        let mut ok = 0;
        for burst in frames.chunks(BURST) {
            for f in burst {
                let Some(chain) = self.vq_rx.pop_descriptor_chain(mem) else { break };
                let head = chain.head_index();
                let Ok(mut w) = chain.writer(mem) else { continue };
                if w.available_bytes() < NET_HDR_LEN + f.len() {
                    self.vq_rx.go_to_previous_position();
                    break;
                }
                if w.write_all(&HDR).and_then(|()| w.write_all(f)).is_ok()
                    && self.vq_rx.add_used(mem, head, (NET_HDR_LEN + f.len()) as u32).is_ok()
                {
                    ok += 1;
                }
            }
            let n = self.vq_rx.needs_notification(mem).unwrap_or(true);
            self.signal(n);
        }
        ok
    }

    fn ours_tx(&mut self, mem: &GuestMemoryMmap, frames: usize) -> usize {
        let mut ok = 0;
        for _ in (0..frames).step_by(BURST) {
            let addrs = self.ours_tx.addrs;
            let v = RingView::new(mem, &addrs).expect("ring view");
            let ring = &mut self.ours_tx;
            let old = ring.next_used;
            let n = ring.pending_in(&v).unwrap_or(0).min(BURST as u16);
            self.used.clear();
            for k in 0..n {
                let Ok(head) = ring.head_in(&v, k) else { break };
                self.segs.clear();
                if let Ok(total) = ring.walk_in(&v, &Regions::new(mem), head, false, &mut self.segs) {
                    let mut pos = 0usize;
                    for s in &self.segs {
                        let l = s.len as usize;
                        let Some(dst) = self.buf.get_mut(pos..pos + l) else { break };
                        match mem.get_slice(GuestAddress(s.addr), l) {
                            Ok(vs) if vs.read_slice(dst, 0).is_ok() => pos += l,
                            _ => break,
                        }
                    }
                    ok += usize::from(pos as u64 == total);
                    black_box(&self.buf[..pos]);
                }
                self.used.push((head, 0));
            }
            ring.consume(n);
            let _ = ring.push_used_in(&v, &self.used);
            let _ = ring.publish_in(&v);
            let needed = ring.next_used != old && ring.needs_notification_in(&v, old);
            self.signal(needed);
        }
        ok
    }

    fn vq_tx(&mut self, mem: &GuestMemoryMmap, frames: usize) -> usize {
        let mut ok = 0;
        for _ in (0..frames).step_by(BURST) {
            for _ in 0..BURST {
                let Some(chain) = self.vq_tx.pop_descriptor_chain(mem) else { break };
                let head = chain.head_index();
                if let Ok(mut r) = chain.reader(mem) {
                    let n = r.available_bytes();
                    if let Some(dst) = self.buf.get_mut(..n) {
                        if r.read_exact(dst).is_ok() {
                            black_box(&dst[..]);
                            ok += 1;
                        }
                    }
                }
                let _ = self.vq_tx.add_used(mem, head, 0);
            }
            let n = self.vq_tx.needs_notification(mem).unwrap_or(true);
            self.signal(n);
        }
        ok
    }
}

impl Rig {
    fn new() -> Rig {
        let g = GuestMem::new(MEM_SIZE).expect("guest memory");
        assert!(buf_addr(RINGS, 0) <= MEM_SIZE && DrvRing::layout_end(RINGS, QSIZE) <= BUF_BASE);
        let mut drv: Vec<DrvRing> = (0..RINGS).map(|v| DrvRing::for_vring(v, QSIZE)).collect();
        let mem = g.mem();
        for r in [RX_OURS, RX_VQ] {
            for id in 0..QSIZE {
                drv[r].post_rx(&g, id, buf_addr(r, id), BUF_LEN);
            }
            drv[r].arm_interrupt(&g);
        }
        // TX: one readable descriptor per buffer, all posted; `set_frames` fills them.
        for r in [TX_OURS, TX_VQ] {
            for id in 0..QSIZE {
                let d = &drv[r];
                d.write_desc(&g, d.desc, id, (buf_addr(r, id), BUF_LEN, 0, 0));
                drv[r].put_avail(&g, id);
            }
            drv[r].flush_avail(&g);
            drv[r].arm_interrupt(&g);
        }
        let e = Engines {
            ours_rx: SplitRing::start(mem, ring_addrs(&drv[RX_OURS]), 0, true).expect("ring"),
            ours_tx: SplitRing::start(mem, ring_addrs(&drv[TX_OURS]), 0, true).expect("ring"),
            vq_rx: queue_on(&drv[RX_VQ], true),
            vq_tx: queue_on(&drv[TX_VQ], true),
            call: EventFd::new(libc::EFD_NONBLOCK).expect("eventfd"),
            segs: Vec::with_capacity(64),
            used: Vec::with_capacity(BURST),
            buf: vec![0u8; BUF_LEN as usize],
        };
        assert!(e.vq_rx.is_valid(mem) && e.vq_tx.is_valid(mem), "virtio-queue rejects the ring layout");
        Rig { g, drv, e, frames: Vec::new() }
    }

    /// Frames of `len` bytes: RX input, and header + frame in every TX buffer, whose
    /// descriptor length becomes header + frame (they are posted; the device has consumed
    /// and the driver re-posted every one of them after each iteration).
    fn set_frames(&mut self, len: usize) {
        self.frames = (0..BATCH).map(|i| frame(i, len)).collect();
        for r in [TX_OURS, TX_VQ] {
            let d = &self.drv[r];
            for id in 0..QSIZE {
                let a = buf_addr(r, id);
                self.g.write(&[0u8; NET_HDR_LEN], a);
                self.g.write(&self.frames[usize::from(id)], a + NET_HDR_LEN as u64);
                d.write_desc(&self.g, d.desc, id, (a, (NET_HDR_LEN + len) as u32, 0, 0));
            }
        }
    }

    /// The driver: every used buffer back to the avail ring, `used_event` re-armed.
    fn recycle(&mut self, r: usize) {
        let d = &mut self.drv[r];
        d.recycle_used(&self.g);
        d.arm_interrupt(&self.g);
    }

    fn run(&mut self, which: usize) -> usize {
        let mem = self.g.mem();
        let n = match which {
            RX_OURS => self.e.ours_rx(mem, &self.frames),
            RX_VQ => self.e.vq_rx(mem, &self.frames),
            TX_OURS => self.e.ours_tx(mem, BATCH),
            _ => self.e.vq_tx(mem, BATCH),
        };
        self.recycle(which);
        n
    }

    /// Each engine once, read back: RX bytes in guest memory, TX used elements.
    fn check(&mut self) {
        for r in [RX_OURS, RX_VQ] {
            let d = &self.drv[r];
            let before = d.last_used;
            assert_eq!(self.run(r), BATCH, "ring {r}: every frame placed");
            let d = &self.drv[r];
            assert_eq!(d.last_used.wrapping_sub(before), QSIZE, "ring {r}: one used element per frame");
            // The driver re-posted buffer ids in used order; the last frame went to the buffer
            // whose id was used last, which is now the last avail entry.
            let slot = u64::from(d.avail_idx.wrapping_sub(1) % d.size);
            let mut id = [0u8; 2];
            self.g.read(&mut id, d.avail + 4 + 2 * slot);
            let f = &self.frames[BATCH - 1];
            let mut got = vec![0u8; NET_HDR_LEN + f.len()];
            self.g.read(&mut got, buf_addr(r, u16::from_le_bytes(id)));
            assert_eq!((&got[..NET_HDR_LEN], &got[NET_HDR_LEN..]), (&HDR[..], &f[..]), "ring {r}: frame bytes");
        }
        for r in [TX_OURS, TX_VQ] {
            assert_eq!(self.run(r), BATCH, "ring {r}: every chain read");
        }
    }
}

const ENGINES: [(&str, usize); 4] =
    [("RX arfsnic", RX_OURS), ("RX virtio-queue", RX_VQ), ("TX arfsnic", TX_OURS), ("TX virtio-queue", TX_VQ)];

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let quick = std::env::args().any(|a| a == "--test" || a == "--list");
    let rounds: usize = std::env::var("RINGS_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(9);
    let slice = Duration::from_millis(if quick { 5 } else { 150 });
    let rounds = if quick { 1 } else { rounds.max(1) };
    let mut rig = Rig::new();
    println!("ring engines ({rounds} interleaved rounds of {slice:?} per engine, median; bursts of {BURST}; one thread = one core)");
    for len in [64usize, 1518] {
        rig.set_frames(len);
        rig.check();
        let mut mpps: Vec<Vec<f64>> = vec![Vec::new(); ENGINES.len()];
        for _ in 0..rounds {
            for (k, &(name, which)) in ENGINES.iter().enumerate() {
                let t = Instant::now();
                let mut n = 0usize;
                while t.elapsed() < slice {
                    let got = rig.run(which);
                    assert_eq!(got, BATCH, "{name}: every frame must go through");
                    n += got;
                }
                mpps[k].push(n as f64 / t.elapsed().as_secs_f64() / 1e6);
            }
        }
        let med: Vec<f64> = mpps.iter_mut().map(|v| median(v)).collect();
        println!("  {len} B frames:");
        for (k, &(name, _)) in ENGINES.iter().enumerate() {
            let ours = med[k & !1];
            println!(
                "    {name:<16} {:>7.2} Mpps  {:>6.1} ns/frame  {:>5.2}x arfsnic",
                med[k],
                1e3 / med[k],
                med[k] / ours
            );
        }
    }
}
