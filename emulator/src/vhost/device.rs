//! Device state shared by the vhost-user request handler, the worker threads and `RxPort`:
//! guest memory, per-vring state (one mutex per vring), counters, link/queue state.

use crate::sync::lock;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::ring::{Direct, Regions, RingAccess, RingAddrs, RingError, RingView, Seg, SplitRing};
use super::{features, DeviceHooks, PairCounters, RxError, RxHash, MAX_FRAME, MAX_HDR_LEN};

/// Most RX buffers (descriptor chains) one MRG_RXBUF frame may span.
const MAX_RX_BUFFERS: u16 = 1024;
/// TX chains handled per lock hold / used-ring publication.
pub(crate) const TX_BATCH: u16 = 64;

#[derive(Default)]
pub(crate) struct VringState {
    pub addrs: RingAddrs,
    pub addrs_set: bool,
    pub base: u16,
    pub ring: Option<SplitRing>,
    pub kick: Option<File>,
    pub call: Option<File>,
    pub err: Option<File>,
    pub enabled: bool,
    // Scratch space, reused: `segs` bounded by RX_FLUSH_SEGS + one frame's buffers
    // (MAX_RX_BUFFERS chains of MAX_CHAIN_SEGMENTS), `used` by the ring size, `copies` by
    // `segs`, `placed` by the longest batch a caller passed.
    segs: Vec<Seg>,
    chains: Vec<(u16, usize, u64)>,
    used: Vec<(u16, u32)>,
    copies: Vec<RxCopy>,
    placed: Vec<Placed>,
}

pub(crate) struct Vring {
    pub st: Mutex<VringState>,
    /// Mirrors of `st.enabled` / `st.ring.is_some()` for lock-free reads.
    pub enabled: AtomicBool,
    pub started: AtomicBool,
}

#[derive(Default)]
struct PairCountersAtomic {
    tx_frames: AtomicU64,
    tx_bytes: AtomicU64,
    tx_errors: AtomicU64,
    rx_frames: AtomicU64,
    rx_bytes: AtomicU64,
    rx_no_buffers: AtomicU64,
    rx_dropped: AtomicU64,
    desc_errors: AtomicU64,
    interrupts: AtomicU64,
}

impl PairCountersAtomic {
    fn snapshot(&self) -> PairCounters {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PairCounters {
            tx_frames: g(&self.tx_frames),
            tx_bytes: g(&self.tx_bytes),
            tx_errors: g(&self.tx_errors),
            rx_frames: g(&self.rx_frames),
            rx_bytes: g(&self.rx_bytes),
            rx_no_buffers: g(&self.rx_no_buffers),
            rx_dropped: g(&self.rx_dropped),
            desc_errors: g(&self.desc_errors),
            interrupts: g(&self.interrupts),
        }
    }
}

struct LinkState {
    up: bool,
    pair_on: Vec<bool>,
}

/// Epoll set of one worker thread (kick fds of the vrings it owns + an exit event).
pub(crate) struct WorkerCtl {
    pub epoll: Epoll,
    pub exit: EventFd,
}

pub(crate) struct Device {
    pub pairs: u16,
    pub hooks: Arc<dyn DeviceHooks>,
    pub vrings: Box<[Vring]>,
    pub workers: Vec<WorkerCtl>,
    pub stop: AtomicBool,
    mem: RwLock<Option<Arc<GuestMemoryMmap>>>,
    acked: AtomicU64,
    counters: Box<[PairCountersAtomic]>,
    link: Mutex<LinkState>,
    pub connections: AtomicU64,
    pub protocol_errors: AtomicU64,
    pub early_enables: AtomicU64,
}

fn signal(call: &Option<File>) -> bool {
    if let Some(f) = call {
        let mut f: &File = f;
        let _ = f.write(&1u64.to_ne_bytes());
        true
    } else {
        false
    }
}

/// The vring's reusable buffers, borrowed apart from the ring itself.
struct Scratch<'a> {
    /// Segments of the batch's RX buffers not written yet (TX: of the chain being read).
    segs: &'a mut Vec<Seg>,
    /// Chains of the frame being placed: head, end of its segments in `segs`, capacity.
    chains: &'a mut Vec<(u16, usize, u64)>,
    /// Used elements of the batch, in ring order.
    used: &'a mut Vec<(u16, u32)>,
    /// Writes of the batch not done yet, one per segment.
    copies: &'a mut Vec<RxCopy>,
    /// Per frame of the batch: its virtio-net header and used elements.
    placed: &'a mut Vec<Placed>,
    /// Avail entries known to be there and not consumed yet in this batch (`None`: not read
    /// yet). `avail.idx` is the line the driver writes on every refill: it is read again only
    /// when the entries known do not hold the next frame.
    avail: Option<u16>,
}

/// One RX buffer segment's share of a frame's header + data, written after the batch's
/// buffers are all found (as DPDK's vhost does): the copies then run back to back, and the
/// guest-memory lines they miss on are fetched together instead of one frame at a time.
#[derive(Clone, Copy)]
pub(crate) struct RxCopy {
    /// Index into `Scratch::segs`; the write starts at the segment's start.
    seg: u32,
    /// Index of the frame in the batch.
    frame: u32,
    /// Offset in the frame's header-then-data bytes.
    off: u32,
    len: u32,
}

#[derive(Clone, Copy, Default)]
pub(crate) struct Placed {
    hdr: [u8; MAX_HDR_LEN],
    /// The frame's used elements: `Scratch::used[used.0..used.1]`.
    used: (u32, u32),
    /// A write into one of its buffers failed.
    failed: bool,
}

/// Segments kept for deferred writes before a batch writes what it has (bounds `segs` for
/// batches of large MRG_RXBUF frames in many small buffers).
const RX_FLUSH_SEGS: usize = 256;
/// Header + frame bytes up to which a segment holding the whole header is written with one
/// copy from a stack buffer instead of two (docs/performance.md, a3d261f).
const SMALL: usize = 128;

/// Why a frame was not placed: refused (the ring is fine), or the ring is malformed.
enum Place {
    Rx(RxError),
    Ring(RingError),
}

/// Finds the buffers for frame `i` of a batch in the next available chains of an RX ring,
/// records its used elements and its writes (done later by [`write_copies`]). A malformed
/// chain is handed back with length 0 together with the chains looked at before it (the
/// driver frees such buffers), and the frame is dropped.
#[allow(clippy::too_many_arguments)]
fn place_frame(
    ring: &mut SplitRing,
    a: &impl RingAccess,
    sc: &mut Scratch<'_>,
    mem: &Regions<'_>,
    i: usize,
    (frame, hash): (&[u8], RxHash),
    hdr_len: usize,
    mrg: bool,
) -> Result<(), Place> {
    if frame.len() > MAX_FRAME {
        return Err(Place::Rx(RxError::TooLarge));
    }
    let need = (hdr_len + frame.len()) as u64;
    let (mut pending, mut fresh) = match sc.avail {
        Some(n) if n > 0 => (n, false),
        _ => (ring.pending_in(a).map_err(Place::Ring)?, true),
    };
    let seg_base = sc.segs.len();
    sc.chains.clear();
    let mut cap = 0u64;
    let mut k = 0u16;
    loop {
        let max_bufs = if mrg { pending.min(MAX_RX_BUFFERS) } else { pending.min(1) };
        while cap < need && k < max_bufs {
            let head = ring.head_in(a, k).map_err(Place::Ring)?;
            let chain_cap = match ring.walk_in(a, mem, head, true, sc.segs) {
                Ok(0) => Err(RingError::WrongDirection),
                other => other,
            };
            match chain_cap {
                Ok(n) => {
                    sc.chains.push((head, sc.segs.len(), n));
                    cap += n;
                    k += 1;
                }
                Err(e) => {
                    sc.segs.truncate(seg_base);
                    sc.used.extend(sc.chains.iter().map(|&(h, _, _)| (h, 0)));
                    sc.used.push((head, 0));
                    ring.consume(k + 1);
                    sc.avail = None;
                    return Err(Place::Ring(e));
                }
            }
        }
        if cap >= need || fresh {
            break;
        }
        // The entries known ran out: the driver may have posted more since.
        pending = ring.pending_in(a).map_err(Place::Ring)?;
        fresh = true;
    }
    if cap < need {
        sc.avail = Some(pending);
        sc.segs.truncate(seg_base);
        return Err(Place::Rx(if !mrg && pending > 0 { RxError::TooLarge } else { RxError::NoBuffers }));
    }

    // virtio_net_hdr_mrg_rxbuf: flags 0, gso NONE, no checksum offload; num_buffers = k;
    // with HASH_REPORT (20 bytes, virtio_net_hdr_v1_hash) then hash_value, hash_report.
    let p = &mut sc.placed[i];
    p.hdr = [0u8; MAX_HDR_LEN];
    p.hdr[10..12].copy_from_slice(&k.to_le_bytes());
    if let Some((value, kind)) = hash {
        p.hdr[12..16].copy_from_slice(&value.to_le_bytes());
        p.hdr[16..18].copy_from_slice(&kind.virtio_report().to_le_bytes());
    }
    let used_start = sc.used.len() as u32;
    // `need` and every offset below fit in u32 (need <= MAX_HDR_LEN + MAX_FRAME).
    let mut off = 0u64;
    let mut seg_start = seg_base;
    for &(head, seg_end, _) in sc.chains.iter() {
        let mut written = 0u32;
        for (j, s) in sc.segs[seg_start..seg_end].iter().enumerate() {
            let n = u64::from(s.len).min(need - off);
            if n > 0 {
                sc.copies.push(RxCopy { seg: (seg_start + j) as u32, frame: i as u32, off: off as u32, len: n as u32 });
            }
            off += n;
            written += n as u32;
        }
        seg_start = seg_end;
        sc.used.push((head, written));
    }
    p.used = (used_start, sc.used.len() as u32);
    ring.consume(k);
    sc.avail = Some(pending - k);
    Ok(())
}

/// Does the batch's recorded writes, marks frames whose write failed, and forgets the
/// segments.
fn write_copies(sc: &mut Scratch<'_>, mem: &Regions<'_>, frames: &[&[u8]], hdr_len: usize) {
    for c in sc.copies.iter() {
        let (Some(s), Some(frame), Some(p)) =
            (sc.segs.get(c.seg as usize), frames.get(c.frame as usize), sc.placed.get_mut(c.frame as usize))
        else {
            continue;
        };
        let (off, end) = (c.off as usize, (c.off + c.len) as usize);
        // The header's part of [off, end), then the frame's.
        let hdr = (off < hdr_len).then(|| &p.hdr[off..end.min(hdr_len)]);
        let data = (end > hdr_len).then(|| frame.get(off.max(hdr_len) - hdr_len..end - hdr_len));
        // One slice per segment, mostly without a region lookup (`walk` checked it lies in
        // guest memory); a segment that crosses regions is written through guest memory.
        let slice = mem.slice(s.addr, s.len as usize);
        // A small frame with its whole header in this segment: one write from a staging copy.
        if let (Some(vs), Some(h), Some(Some(d))) = (&slice, hdr, data) {
            if h.len() == hdr_len && h.len() + d.len() <= SMALL {
                let mut buf = [0u8; SMALL];
                buf[..hdr_len].copy_from_slice(h);
                buf[hdr_len..hdr_len + d.len()].copy_from_slice(d);
                p.failed |= vs.write_slice(&buf[..hdr_len + d.len()], 0).is_err();
                continue;
            }
        }
        let mut at = 0usize;
        for piece in [hdr.map(Some), data].into_iter().flatten() {
            let ok = piece.is_some_and(|src| match &slice {
                Some(vs) => vs.write_slice(src, at).is_ok(),
                None => mem.mem.write_slice(src, GuestAddress(s.addr + at as u64)).is_ok(),
            });
            p.failed |= !ok;
            at += piece.map_or(0, <[u8]>::len);
        }
    }
    sc.copies.clear();
    sc.segs.clear();
}

impl Device {
    pub fn new(pairs: u16, threads: usize, hooks: Arc<dyn DeviceHooks>) -> std::io::Result<Self> {
        let vrings = (0..2 * usize::from(pairs))
            .map(|_| Vring {
                st: Mutex::new(VringState::default()),
                enabled: AtomicBool::new(false),
                started: AtomicBool::new(false),
            })
            .collect();
        let mut workers = Vec::with_capacity(threads);
        for _ in 0..threads {
            let epoll = Epoll::new()?;
            let exit = EventFd::new(libc::EFD_NONBLOCK)?;
            epoll.ctl(ControlOperation::Add, exit.as_raw_fd(), EpollEvent::new(EventSet::IN, 0))?;
            workers.push(WorkerCtl { epoll, exit });
        }
        Ok(Device {
            pairs,
            hooks,
            vrings,
            workers,
            stop: AtomicBool::new(false),
            mem: RwLock::new(None),
            acked: AtomicU64::new(0),
            counters: (0..pairs).map(|_| PairCountersAtomic::default()).collect(),
            link: Mutex::new(LinkState { up: false, pair_on: vec![false; usize::from(pairs)] }),
            connections: AtomicU64::new(0),
            protocol_errors: AtomicU64::new(0),
            early_enables: AtomicU64::new(0),
        })
    }

    pub fn worker_of(&self, vring: usize) -> usize {
        (vring / 2) % self.workers.len()
    }

    pub fn mem(&self) -> Option<Arc<GuestMemoryMmap>> {
        crate::sync::read(&self.mem).clone()
    }

    pub fn set_mem(&self, mem: Option<GuestMemoryMmap>) {
        *crate::sync::write(&self.mem) = mem.map(Arc::new);
    }

    pub fn acked_features(&self) -> u64 {
        self.acked.load(Ordering::Acquire)
    }

    pub fn set_acked_features(&self, f: u64) {
        self.acked.store(f, Ordering::Release);
    }

    fn hdr_len(&self) -> usize {
        let f = self.acked_features();
        if f & features::HASH_REPORT != 0 {
            MAX_HDR_LEN
        } else if f & (features::VERSION_1 | features::MRG_RXBUF) != 0 {
            12
        } else {
            10
        }
    }

    pub fn counters(&self) -> Vec<PairCounters> {
        self.counters.iter().map(|c| c.snapshot()).collect()
    }

    pub fn link_up(&self) -> bool {
        lock(&self.link).up
    }

    pub fn pair_enabled(&self, pair: u16) -> bool {
        let p = usize::from(pair);
        p < usize::from(self.pairs)
            && self.vrings[2 * p].enabled.load(Ordering::Acquire)
            && self.vrings[2 * p + 1].enabled.load(Ordering::Acquire)
    }

    pub fn lock_vring(&self, idx: usize) -> MutexGuard<'_, VringState> {
        lock(&self.vrings[idx].st)
    }

    /// Re-evaluates per-pair enable state and link state, calling the hooks on changes.
    pub fn update_state(&self) {
        let mut ls = lock(&self.link);
        let mem_ok = self.mem().is_some();
        let mut any_on = false;
        let mut all_started = true;
        for p in 0..self.pairs {
            let on = self.pair_enabled(p);
            if on != ls.pair_on[usize::from(p)] {
                ls.pair_on[usize::from(p)] = on;
                self.hooks.on_queue_state(p, on);
            }
            if on {
                any_on = true;
                let i = 2 * usize::from(p);
                all_started &= self.vrings[i].started.load(Ordering::Acquire)
                    && self.vrings[i + 1].started.load(Ordering::Acquire);
            }
        }
        let up = mem_ok && any_on && all_started;
        if up != ls.up {
            ls.up = up;
            log::info!("vhost: link {}", if up { "up" } else { "down" });
            self.hooks.on_link(up);
        }
    }

    pub fn set_enabled(&self, idx: usize, st: &mut VringState, on: bool) {
        st.enabled = on;
        self.vrings[idx].enabled.store(on, Ordering::Release);
    }

    /// Replaces the kick fd of vring `idx` (and its registration in the owning worker's epoll).
    pub fn replace_kick(&self, idx: usize, st: &mut VringState, kick: Option<File>) {
        let ep = &self.workers[self.worker_of(idx)].epoll;
        if let Some(old) = st.kick.take() {
            let _ = ep.ctl(ControlOperation::Delete, old.as_raw_fd(), EpollEvent::default());
        }
        if let Some(f) = kick {
            set_nonblocking(&f);
            if let Err(e) = ep.ctl(ControlOperation::Add, f.as_raw_fd(), EpollEvent::new(EventSet::IN, idx as u64 + 1))
            {
                log::warn!("vhost: vring {idx}: cannot poll kick fd: {e}");
            }
            st.kick = Some(f);
        }
    }

    /// Starts vring `idx` (ring addresses must be set and valid in the current memory).
    pub fn start_ring(&self, idx: usize, st: &mut VringState) -> Result<(), RingError> {
        let mem = self.mem().ok_or(RingError::Memory)?;
        if !st.addrs_set || !st.addrs.validate(&mem) {
            return Err(RingError::BadAddress);
        }
        let event_idx = self.acked_features() & features::EVENT_IDX != 0;
        let ring = SplitRing::start(&mem, st.addrs, st.base, event_idx)?;
        if idx.is_multiple_of(2) {
            // RX: frames are delivered whenever they come, reading the avail ring then;
            // a kick would only wake a worker (and take this vring's lock) for nothing.
            ring.suppress_kicks(&mem);
        }
        st.ring = Some(ring);
        self.vrings[idx].started.store(true, Ordering::Release);
        if self.acked_features() & features::PROTOCOL_FEATURES == 0 {
            // Without PROTOCOL_FEATURES a started ring is enabled (vhost-user spec).
            self.set_enabled(idx, st, true);
        }
        Ok(())
    }

    /// Stops vring `idx`; returns the avail index to hand back in GET_VRING_BASE.
    pub fn stop_ring(&self, idx: usize, st: &mut VringState) -> u16 {
        if let Some(r) = st.ring.take() {
            st.base = r.next_avail.0;
        }
        self.vrings[idx].started.store(false, Ordering::Release);
        self.replace_kick(idx, st, None);
        st.base
    }

    /// Drops all per-connection state (frontend gone, or RESET_OWNER).
    pub fn reset(&self, drop_mem: bool) {
        for idx in 0..self.vrings.len() {
            let mut st = self.lock_vring(idx);
            self.stop_ring(idx, &mut st);
            self.set_enabled(idx, &mut st, false);
            st.call = None;
            st.err = None;
            st.addrs = RingAddrs::default();
            st.addrs_set = false;
            st.base = 0;
        }
        if drop_mem {
            self.set_mem(None);
        }
        self.set_acked_features(0);
        self.update_state();
    }

    fn count(&self, pair: u16) -> &PairCountersAtomic {
        &self.counters[usize::from(pair)]
    }

    /// Puts one frame into the RX vring of `pair` (see `RxPort::deliver`).
    pub fn deliver(&self, pair: u16, frame: &[u8]) -> Result<(), RxError> {
        let mut out = [Ok(())];
        self.deliver_batch(pair, &[frame], &[], &mut out);
        let [r] = out;
        r
    }

    /// Puts `frames` into the RX vring of `pair` in order, `out[i]` saying what became of
    /// `frames[i]` (`out` at least as long as `frames`). One memory-table read, one lock of
    /// the vring, one `used.idx` publication, one interrupt decision and one counter update
    /// per call. Once the ring runs out of buffers the rest of the batch is refused with
    /// `NoBuffers` without looking at the ring again. `hashes[i]` (missing: none) goes into
    /// `frames[i]`'s header when the guest negotiated `HASH_REPORT`.
    pub fn deliver_batch(&self, pair: u16, frames: &[&[u8]], hashes: &[RxHash], out: &mut [Result<(), RxError>]) {
        let out = &mut out[..frames.len()];
        if pair >= self.pairs {
            out.iter_mut().for_each(|o| *o = Err(RxError::NoSuchQueue));
            return;
        }
        let c = self.count(pair);
        self.deliver_locked(pair, frames, hashes, out);
        let (mut frames_ok, mut bytes, mut no_buf, mut dropped) = (0u64, 0u64, 0u64, 0u64);
        for (f, o) in frames.iter().zip(out.iter()) {
            match o {
                Ok(()) => {
                    frames_ok += 1;
                    bytes += f.len() as u64;
                }
                Err(RxError::NoBuffers) => no_buf += 1,
                Err(_) => dropped += 1,
            }
        }
        for (ctr, n) in
            [(&c.rx_frames, frames_ok), (&c.rx_bytes, bytes), (&c.rx_no_buffers, no_buf), (&c.rx_dropped, dropped)]
        {
            if n > 0 {
                ctr.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    fn deliver_locked(&self, pair: u16, frames: &[&[u8]], hashes: &[RxHash], out: &mut [Result<(), RxError>]) {
        let fail = |out: &mut [Result<(), RxError>], e: RxError| out.iter_mut().for_each(|o| *o = Err(e.clone()));
        let Some(mem) = self.mem() else {
            return fail(out, RxError::NotReady);
        };
        let idx = 2 * usize::from(pair);
        let mut guard = self.lock_vring(idx);
        let VringState { ring, enabled, segs, chains, used, copies, placed, call, .. } = &mut *guard;
        let Some(ring) = ring.as_mut() else {
            return fail(out, RxError::NotReady);
        };
        if !*enabled {
            return fail(out, RxError::QueueDisabled);
        }
        let mrg = self.acked_features() & features::MRG_RXBUF != 0;
        let hdr_len = self.hdr_len();
        let mut scratch = Scratch { segs, chains, used, copies, placed, avail: None };
        // The ring's areas as slices taken once for the batch; through guest memory (a
        // region lookup per access) when an area crosses a region boundary.
        match RingView::new(&mem, &ring.addrs) {
            Some(v) => self.fill(pair, ring, &v, &mem, &mut scratch, (frames, hashes), out, (hdr_len, mrg), call),
            None => {
                let d = Direct::new(&mem, ring.addrs);
                self.fill(pair, ring, &d, &mem, &mut scratch, (frames, hashes), out, (hdr_len, mrg), call)
            }
        }
    }

    /// Finds the buffers of `frames` one after the other, then writes them all, publishes
    /// their used elements in one run and decides on one interrupt.
    #[allow(clippy::too_many_arguments)]
    fn fill(
        &self,
        pair: u16,
        ring: &mut SplitRing,
        a: &impl RingAccess,
        mem: &GuestMemoryMmap,
        sc: &mut Scratch<'_>,
        (frames, hashes): (&[&[u8]], &[RxHash]),
        out: &mut [Result<(), RxError>],
        (hdr_len, mrg): (usize, bool),
        call: &Option<File>,
    ) {
        let old = ring.next_used;
        let mut out_of_buffers = false;
        let regions = Regions::new(mem);
        sc.segs.clear();
        sc.copies.clear();
        sc.used.clear();
        sc.placed.clear();
        sc.placed.resize(frames.len(), Placed::default());
        for (i, (f, o)) in frames.iter().zip(out.iter_mut()).enumerate() {
            if out_of_buffers {
                *o = Err(RxError::NoBuffers);
                continue;
            }
            *o = match place_frame(ring, a, sc, &regions, i, (f, hashes.get(i).copied().flatten()), hdr_len, mrg) {
                Ok(()) => Ok(()),
                Err(Place::Rx(e)) => {
                    out_of_buffers = e == RxError::NoBuffers;
                    Err(e)
                }
                Err(Place::Ring(e)) => Err(self.desc_error(pair, e)),
            };
            if sc.segs.len() >= RX_FLUSH_SEGS {
                write_copies(sc, &regions, frames, hdr_len);
            }
        }
        write_copies(sc, &regions, frames, hdr_len);
        // A frame whose write failed hands its buffers back empty and is dropped.
        for (i, p) in sc.placed.iter().enumerate().filter(|(_, p)| p.failed) {
            let (start, end) = (p.used.0 as usize, p.used.1 as usize);
            sc.used.get_mut(start..end).into_iter().flatten().for_each(|u| u.1 = 0);
            if let Some(o) = out.get_mut(i) {
                *o = Err(self.desc_error(pair, RingError::Memory));
            }
        }
        if let Err(e) = ring.push_used_in(a, sc.used).and_then(|()| ring.publish_in(a)) {
            let e = self.desc_error(pair, e);
            out.iter_mut().filter(|o| o.is_ok()).for_each(|o| *o = Err(e.clone()));
        }
        if ring.next_used != old && ring.needs_notification_in(a, old) && signal(call) {
            self.count(pair).interrupts.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn desc_error(&self, pair: u16, e: RingError) -> RxError {
        self.count(pair).desc_errors.fetch_add(1, Ordering::Relaxed);
        crate::warn_ratelimited!("vhost: pair {pair}: RX ring error (counted in desc_errors): {e}");
        RxError::Memory(e.to_string())
    }

    /// Drains the kick eventfd of vring `idx` (called by its worker).
    pub fn drain_kick(&self, idx: usize) {
        let st = self.lock_vring(idx);
        if let Some(f) = &st.kick {
            let mut f: &File = f;
            let mut b = [0u8; 8];
            let _ = f.read(&mut b);
        }
    }

    /// Processes TX vring `idx`: every chain becomes one `on_tx` call (header stripped).
    pub fn process_tx(&self, idx: usize, buf: &mut [u8]) {
        let pair = (idx / 2) as u16;
        let Some(mem) = self.mem() else {
            return;
        };
        let hdr_len = self.hdr_len();
        let c = self.count(pair);
        let mut guard = self.lock_vring(idx);
        let VringState { ring, enabled, segs, used, call, .. } = &mut *guard;
        loop {
            let Some(ring) = ring.as_mut() else {
                return;
            };
            if !*enabled {
                return;
            }
            let n = match ring.pending(&mem) {
                Ok(n) => n,
                Err(e) => {
                    c.desc_errors.fetch_add(1, Ordering::Relaxed);
                    crate::warn_ratelimited!("vhost: pair {pair}: TX ring error (counted in desc_errors): {e}");
                    return;
                }
            };
            if n == 0 {
                match ring.enable_notification(&mem) {
                    Ok(true) => continue,
                    _ => return,
                }
            }
            ring.disable_notification(&mem);
            let mut tx = TxBatch { segs, used, buf, hdr_len, call };
            // As on RX: the ring's areas as slices for the batch when each lies in one region.
            let broken = match RingView::new(&mem, &ring.addrs) {
                Some(v) => self.take_tx(pair, ring, &v, &mem, &mut tx, n.min(TX_BATCH)),
                None => {
                    let d = Direct::new(&mem, ring.addrs);
                    self.take_tx(pair, ring, &d, &mem, &mut tx, n.min(TX_BATCH))
                }
            };
            if broken {
                return;
            }
        }
    }

    /// Takes `n` chains from a TX ring, hands the frames to `on_tx_burst`, publishes them all
    /// and decides on one interrupt. Returns true if the ring is broken (stop for now).
    fn take_tx(
        &self,
        pair: u16,
        ring: &mut SplitRing,
        a: &impl RingAccess,
        mem: &GuestMemoryMmap,
        tx: &mut TxBatch<'_>,
        n: u16,
    ) -> bool {
        let c = self.count(pair);
        let hdr_len = tx.hdr_len;
        // Longest chain taken: header + MAX_FRAME, and never more than the worker's buffer.
        let max_total = (MAX_FRAME + hdr_len).min(tx.buf.len());
        tx.used.clear();
        let mut broken = false;
        let (mut frames, mut bytes) = (0u64, 0u64);
        let mut ran = false;
        let regions = Regions::new(mem);
        // The chains of the batch, each frame handed to `sink` (the hooks' per-frame call
        // inside their per-burst state).
        let mut take = |sink: &mut dyn FnMut(&[u8])| {
            if ran {
                return;
            }
            ran = true;
            for k in 0..n {
                let head = match ring.head_in(a, k) {
                    Ok(h) => h,
                    Err(_) => {
                        c.desc_errors.fetch_add(1, Ordering::Relaxed);
                        broken = true;
                        break;
                    }
                };
                tx.segs.clear();
                match ring.walk_in(a, &regions, head, false, tx.segs) {
                    Ok(total) if total as usize > max_total || (total as usize) < hdr_len => {
                        c.tx_errors.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(total) => {
                        let total = total as usize;
                        let mut pos = 0usize;
                        let mut ok = true;
                        for s in tx.segs.iter() {
                            let l = s.len as usize;
                            // `walk` checked the segment is in guest memory and `total` fits `buf`.
                            let dst = &mut tx.buf[pos..pos + l];
                            let read = match regions.slice(s.addr, l) {
                                Some(vs) => vs.read_slice(dst, 0).is_ok(),
                                None => mem.read_slice(dst, GuestAddress(s.addr)).is_ok(),
                            };
                            if !read {
                                ok = false;
                                break;
                            }
                            pos += l;
                        }
                        if ok {
                            let frame = &tx.buf[hdr_len..total];
                            frames += 1;
                            bytes += frame.len() as u64;
                            sink(frame);
                        } else {
                            c.desc_errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(e) => {
                        crate::warn_ratelimited!("vhost: pair {pair}: bad TX chain (counted in desc_errors): {e}");
                        c.desc_errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                tx.used.push((head, 0));
            }
        };
        self.hooks.on_tx_burst(pair, &mut take);
        // Hooks that did not run the burst still consume it (the ring must move on).
        take(&mut |_| {});
        if frames > 0 {
            c.tx_frames.fetch_add(frames, Ordering::Relaxed);
            c.tx_bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        let old = ring.next_used;
        ring.consume(tx.used.len() as u16);
        if ring.push_used_in(a, tx.used).and_then(|()| ring.publish_in(a)).is_err() {
            c.desc_errors.fetch_add(1, Ordering::Relaxed);
            broken = true;
        }
        if ring.needs_notification_in(a, old) && signal(tx.call) {
            c.interrupts.fetch_add(1, Ordering::Relaxed);
        }
        broken
    }
}

/// What one TX batch works with, borrowed from the vring's state.
struct TxBatch<'a> {
    segs: &'a mut Vec<Seg>,
    used: &'a mut Vec<(u16, u32)>,
    buf: &'a mut [u8],
    hdr_len: usize,
    call: &'a Option<File>,
}

fn set_nonblocking(f: &File) {
    let fd = f.as_raw_fd();
    // SAFETY: fcntl(F_GETFL/F_SETFL) on a file descriptor we own (kept alive by `f`); no
    // memory is passed to the kernel. std offers no way to set O_NONBLOCK on a plain `File`.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
    }
}
