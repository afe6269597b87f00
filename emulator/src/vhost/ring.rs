//! Split virtqueue access in guest memory, written for a hostile driver.
//!
//! The backend reads the avail ring and the descriptor tables itself instead of going through
//! `virtio_queue::Queue`, for three reasons (the third measured by `benches/rings.rs`,
//! docs/performance.md "Ring engines"; `tests/ring_vs_virtio_queue.rs` checks that both see
//! the same chains and write the same used ring):
//! * RX must be able to look at the buffers the guest made available *without consuming them*
//!   (a frame that does not fit is refused with `NoBuffers` and the buffers stay available), and
//!   must publish all used elements of one MRG_RXBUF frame with a single `used.idx` store: Linux
//!   `receive_mergeable()` drops the packet ("rx error: N buffers out of M missing") if it sees
//!   the first element before the others.
//! * every guest-controlled value (avail index, head index, descriptor address/length/next,
//!   indirect tables) is checked here, with hard bounds on chain length, so a malformed ring is
//!   a counted error and never a panic, an endless loop or an unbounded allocation.
//! * speed: with the ring areas taken as slices once per burst ([`RingView`]) this reader
//!   moves frames at more than twice `Queue`'s rate, which goes through the guest memory's
//!   region lookup for every avail entry, descriptor and used element.
//!
//! Layout (virtio 1.x, split ring): descriptor = {addr: le64, len: le32, flags: le16, next: le16};
//! avail = {flags: le16, idx: le16, ring[size]: le16, used_event: le16};
//! used = {flags: le16, idx: le16, ring[size]: {id: le32, len: le32}, avail_event: le16}.

use std::cell::Cell;
use std::num::Wrapping;
use std::sync::atomic::{fence, Ordering};

use vm_memory::{
    Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap, MemoryRegionAddress,
    VolatileSlice,
};

const DESC_F_NEXT: u16 = 1;
const DESC_F_WRITE: u16 = 2;
const DESC_F_INDIRECT: u16 = 4;
const AVAIL_F_NO_INTERRUPT: u16 = 1;
const USED_F_NO_NOTIFY: u16 = 1;

/// Largest queue size virtio allows for split rings.
pub const MAX_QUEUE_SIZE: u16 = 32768;
/// Hard cap on the number of data descriptors one chain may have (Linux uses at most
/// MAX_SKB_FRAGS + 2 on TX and 1 per mergeable RX buffer).
pub const MAX_CHAIN_SEGMENTS: usize = 1024;

/// One guest buffer segment of a descriptor chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seg {
    pub addr: u64,
    pub len: u32,
}

/// Why a ring or chain could not be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    #[error("avail index {avail} is more than queue size ahead of {next}")]
    BadAvailIdx { avail: u16, next: u16 },
    #[error("head index {0} out of range")]
    BadHead(u16),
    #[error("descriptor index {0} out of range")]
    BadNext(u16),
    #[error("descriptor chain longer than allowed")]
    ChainTooLong,
    #[error("nested or malformed indirect descriptor table")]
    BadIndirect,
    #[error("descriptor points outside guest memory")]
    BadAddress,
    #[error("descriptor with the wrong direction (read-only vs write-only)")]
    WrongDirection,
    #[error("guest memory access failed")]
    Memory,
}

/// Guest physical addresses and size of one split ring.
#[derive(Clone, Copy, Debug, Default)]
pub struct RingAddrs {
    pub size: u16,
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
}

impl RingAddrs {
    /// Checks alignment and that all three areas lie in guest memory.
    pub fn validate(&self, mem: &GuestMemoryMmap) -> bool {
        let size = u64::from(self.size);
        if self.size == 0 || !self.size.is_power_of_two() || self.size > MAX_QUEUE_SIZE {
            return false;
        }
        if !self.desc.is_multiple_of(16) || !self.avail.is_multiple_of(2) || !self.used.is_multiple_of(4) {
            return false;
        }
        let areas = [(self.desc, 16 * size), (self.avail, 6 + 2 * size), (self.used, 6 + 8 * size)];
        areas.iter().all(|&(a, l)| range_ok(mem, a, l))
    }
}

/// True if [addr, addr+len) is backed by guest memory (possibly over several regions).
pub fn range_ok(mem: &GuestMemoryMmap, addr: u64, len: u64) -> bool {
    if len == 0 {
        return true;
    }
    match (addr.checked_add(len), usize::try_from(len)) {
        (Some(_), Ok(l)) => GuestMemoryBackend::check_range(mem, GuestAddress(addr), l),
        _ => false,
    }
}

/// Guest memory for one batch, with the region of the last lookup kept: a buffer segment in
/// that region costs a bounds check instead of a region search (a guest's RX and TX buffers
/// mostly come from one region). Ranges that cross regions take the general path.
pub struct Regions<'a> {
    pub mem: &'a GuestMemoryMmap,
    last: Cell<Option<&'a GuestRegionMmap>>,
}

impl<'a> Regions<'a> {
    pub fn new(mem: &'a GuestMemoryMmap) -> Self {
        Regions { mem, last: Cell::new(None) }
    }

    /// `[addr, addr + len)` as one slice, `None` if it is not inside one region.
    pub fn slice(&self, addr: u64, len: usize) -> Option<VolatileSlice<'a, ()>> {
        let within = |r: &'a GuestRegionMmap| {
            let off = addr.checked_sub(r.start_addr().0)?;
            r.get_slice(MemoryRegionAddress(off), len).ok()
        };
        if let Some(s) = self.last.get().and_then(within) {
            return Some(s);
        }
        let r = self.mem.find_region(GuestAddress(addr))?;
        self.last.set(Some(r));
        within(r)
    }

    /// [`range_ok`], answered from the kept region when the range lies in it.
    pub fn range_ok(&self, addr: u64, len: u64) -> bool {
        let in_one = usize::try_from(len).ok().is_some_and(|l| l > 0 && self.slice(addr, l).is_some());
        in_one || range_ok(self.mem, addr, len)
    }
}

/// One of a ring's three areas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Area {
    Desc,
    Avail,
    Used,
}

/// Reads and writes inside a ring's own areas (offsets from the area's start). Two ways:
/// [`Direct`] goes through guest memory with a region lookup per access; [`RingView`] holds
/// a slice of each area, taken once (per batch), and only checks offsets.
pub trait RingAccess {
    fn load16(&self, area: Area, off: u64, ord: Ordering) -> Result<u16, RingError>;
    fn store16(&self, area: Area, off: u64, v: u16, ord: Ordering) -> Result<(), RingError>;
    fn read(&self, area: Area, off: u64, buf: &mut [u8]) -> Result<(), RingError>;
    fn write(&self, area: Area, off: u64, buf: &[u8]) -> Result<(), RingError>;
}

/// Ring access through guest memory, one region lookup per access (works when an area
/// spans regions).
pub struct Direct<'a> {
    mem: &'a GuestMemoryMmap,
    addrs: RingAddrs,
}

impl<'a> Direct<'a> {
    pub fn new(mem: &'a GuestMemoryMmap, addrs: RingAddrs) -> Self {
        Direct { mem, addrs }
    }
    fn at(&self, area: Area, off: u64) -> Result<GuestAddress, RingError> {
        let base = match area {
            Area::Desc => self.addrs.desc,
            Area::Avail => self.addrs.avail,
            Area::Used => self.addrs.used,
        };
        add(base, off)
    }
}

impl RingAccess for Direct<'_> {
    fn load16(&self, area: Area, off: u64, ord: Ordering) -> Result<u16, RingError> {
        self.mem.load(self.at(area, off)?, ord).map_err(|_| RingError::Memory)
    }
    fn store16(&self, area: Area, off: u64, v: u16, ord: Ordering) -> Result<(), RingError> {
        self.mem.store(v, self.at(area, off)?, ord).map_err(|_| RingError::Memory)
    }
    fn read(&self, area: Area, off: u64, buf: &mut [u8]) -> Result<(), RingError> {
        self.mem.read_slice(buf, self.at(area, off)?).map_err(|_| RingError::Memory)
    }
    fn write(&self, area: Area, off: u64, buf: &[u8]) -> Result<(), RingError> {
        self.mem.write_slice(buf, self.at(area, off)?).map_err(|_| RingError::Memory)
    }
}

/// Slices of a ring's three areas, each inside one memory region, taken once and used for
/// many accesses (a batch of frames): no region lookup per access, offsets still checked.
pub struct RingView<'a> {
    desc: VolatileSlice<'a, ()>,
    avail: VolatileSlice<'a, ()>,
    used: VolatileSlice<'a, ()>,
}

impl<'a> RingView<'a> {
    /// `None` when an area crosses a region boundary (use [`Direct`] then) or is not in
    /// guest memory.
    pub fn new(mem: &'a GuestMemoryMmap, addrs: &RingAddrs) -> Option<Self> {
        let size = usize::from(addrs.size);
        let slice = |a: u64, l: usize| mem.get_slice(GuestAddress(a), l).ok();
        Some(RingView {
            desc: slice(addrs.desc, 16 * size)?,
            avail: slice(addrs.avail, 6 + 2 * size)?,
            used: slice(addrs.used, 6 + 8 * size)?,
        })
    }
    fn area(&self, area: Area) -> &VolatileSlice<'a, ()> {
        match area {
            Area::Desc => &self.desc,
            Area::Avail => &self.avail,
            Area::Used => &self.used,
        }
    }
}

impl RingAccess for RingView<'_> {
    fn load16(&self, area: Area, off: u64, ord: Ordering) -> Result<u16, RingError> {
        let off = usize::try_from(off).map_err(|_| RingError::BadAddress)?;
        self.area(area).load(off, ord).map_err(|_| RingError::Memory)
    }
    fn store16(&self, area: Area, off: u64, v: u16, ord: Ordering) -> Result<(), RingError> {
        let off = usize::try_from(off).map_err(|_| RingError::BadAddress)?;
        self.area(area).store(v, off, ord).map_err(|_| RingError::Memory)
    }
    fn read(&self, area: Area, off: u64, buf: &mut [u8]) -> Result<(), RingError> {
        let off = usize::try_from(off).map_err(|_| RingError::BadAddress)?;
        self.area(area).read_slice(buf, off).map_err(|_| RingError::Memory)
    }
    fn write(&self, area: Area, off: u64, buf: &[u8]) -> Result<(), RingError> {
        let off = usize::try_from(off).map_err(|_| RingError::BadAddress)?;
        self.area(area).write_slice(buf, off).map_err(|_| RingError::Memory)
    }
}

/// Device-side state of one started split ring.
#[derive(Debug)]
pub struct SplitRing {
    pub addrs: RingAddrs,
    pub next_avail: Wrapping<u16>,
    pub next_used: Wrapping<u16>,
    pub event_idx: bool,
    /// Used elements written after `next_used` but not yet published (`push_used`).
    unpublished: u16,
}

fn add(a: u64, b: u64) -> Result<GuestAddress, RingError> {
    a.checked_add(b).map(GuestAddress).ok_or(RingError::BadAddress)
}

impl SplitRing {
    /// Starts a ring at `next_avail = base`; `next_used` is taken from the used ring in memory
    /// (after a stop/start without a device reset the driver's view of `used.idx` is the truth).
    pub fn start(mem: &GuestMemoryMmap, addrs: RingAddrs, base: u16, event_idx: bool) -> Result<Self, RingError> {
        let used_idx: u16 = mem.load(add(addrs.used, 2)?, Ordering::Acquire).map_err(|_| RingError::Memory)?;
        Ok(SplitRing {
            addrs,
            next_avail: Wrapping(base),
            next_used: Wrapping(u16::from_le(used_idx)),
            event_idx,
            unpublished: 0,
        })
    }

    /// Ring access through guest memory ([`Direct`]).
    pub fn direct<'a>(&self, mem: &'a GuestMemoryMmap) -> Direct<'a> {
        Direct::new(mem, self.addrs)
    }

    /// Number of chains the driver made available and we have not consumed yet.
    pub fn pending(&self, mem: &GuestMemoryMmap) -> Result<u16, RingError> {
        self.pending_in(&self.direct(mem))
    }

    /// [`SplitRing::pending`] through `a`.
    pub fn pending_in(&self, a: &impl RingAccess) -> Result<u16, RingError> {
        let idx = u16::from_le(a.load16(Area::Avail, 2, Ordering::Acquire)?);
        let n = (Wrapping(idx) - self.next_avail).0;
        if n > self.addrs.size {
            return Err(RingError::BadAvailIdx { avail: idx, next: self.next_avail.0 });
        }
        Ok(n)
    }

    /// Head descriptor index of the `k`-th unconsumed avail entry (`k < pending`).
    pub fn head(&self, mem: &GuestMemoryMmap, k: u16) -> Result<u16, RingError> {
        self.head_in(&self.direct(mem), k)
    }

    /// [`SplitRing::head`] through `a`.
    pub fn head_in(&self, a: &impl RingAccess, k: u16) -> Result<u16, RingError> {
        let slot = u64::from((self.next_avail + Wrapping(k)).0 % self.addrs.size);
        let head = u16::from_le(a.load16(Area::Avail, 4 + 2 * slot, Ordering::Relaxed)?);
        if head >= self.addrs.size {
            return Err(RingError::BadHead(head));
        }
        Ok(head)
    }

    /// Walks the chain starting at `head`, appending its data segments to `out`. All segments
    /// must have the direction `writable`; their ranges are checked against guest memory.
    /// Returns the total byte length (bounded by `MAX_CHAIN_SEGMENTS * u32::MAX`).
    pub fn walk(&self, mem: &GuestMemoryMmap, head: u16, writable: bool, out: &mut Vec<Seg>) -> Result<u64, RingError> {
        self.walk_in(&self.direct(mem), &Regions::new(mem), head, writable, out)
    }

    /// [`SplitRing::walk`] reading the ring's descriptor table through `a` (indirect tables
    /// and the segments' ranges through `mem`).
    pub fn walk_in(
        &self,
        a: &impl RingAccess,
        mem: &Regions<'_>,
        head: u16,
        writable: bool,
        out: &mut Vec<Seg>,
    ) -> Result<u64, RingError> {
        let mut indirect_table: Option<u64> = None;
        let mut table_len = u32::from(self.addrs.size);
        let mut idx = u32::from(head);
        let mut hops = 0usize;
        let mut total = 0u64;
        let start = out.len();
        loop {
            hops += 1;
            if hops > MAX_CHAIN_SEGMENTS + 1 || out.len() - start >= MAX_CHAIN_SEGMENTS {
                return Err(RingError::ChainTooLong);
            }
            if idx >= table_len {
                return Err(RingError::BadNext(idx as u16));
            }
            let mut raw = [0u8; 16];
            match indirect_table {
                None => a.read(Area::Desc, 16 * u64::from(idx), &mut raw)?,
                Some(t) => mem.mem.read_slice(&mut raw, add(t, 16 * u64::from(idx))?).map_err(|_| RingError::Memory)?,
            }
            let addr = u64::from_le_bytes(raw[0..8].try_into().unwrap_or_default());
            let len = u32::from_le_bytes(raw[8..12].try_into().unwrap_or_default());
            let flags = u16::from_le_bytes([raw[12], raw[13]]);
            let next = u16::from_le_bytes([raw[14], raw[15]]);
            if flags & DESC_F_INDIRECT != 0 {
                // Only one level, only as the sole/last element of the main chain.
                if indirect_table.is_some() || !len.is_multiple_of(16) || len == 0 {
                    return Err(RingError::BadIndirect);
                }
                let n = len / 16;
                if n as usize > MAX_CHAIN_SEGMENTS || !mem.range_ok(addr, u64::from(len)) {
                    return Err(RingError::BadIndirect);
                }
                indirect_table = Some(addr);
                table_len = n;
                idx = 0;
                continue;
            }
            if (flags & DESC_F_WRITE != 0) != writable {
                return Err(RingError::WrongDirection);
            }
            if len > 0 {
                if !mem.range_ok(addr, u64::from(len)) {
                    return Err(RingError::BadAddress);
                }
                out.push(Seg { addr, len });
                total += u64::from(len);
            }
            if flags & DESC_F_NEXT == 0 {
                return Ok(total);
            }
            idx = u32::from(next);
        }
    }

    /// Marks `n` avail entries consumed.
    pub fn consume(&mut self, n: u16) {
        self.next_avail += Wrapping(n);
    }

    /// Writes the used elements and then publishes them (and any pushed before) with one
    /// release store of `used.idx`.
    pub fn publish_used(&mut self, mem: &GuestMemoryMmap, elems: &[(u16, u32)]) -> Result<(), RingError> {
        let a = self.direct(mem);
        self.push_used_in(&a, elems)?;
        self.publish_in(&a)
    }

    /// Writes used elements after the ones already pushed, without publishing them: the
    /// driver sees none of them until [`SplitRing::publish`]. Every element stands for an
    /// avail entry consumed, so at most `size` are ever outstanding.
    pub fn push_used(&mut self, mem: &GuestMemoryMmap, elems: &[(u16, u32)]) -> Result<(), RingError> {
        let a = self.direct(mem);
        self.push_used_in(&a, elems)
    }

    /// [`SplitRing::push_used`] through `a`.
    pub fn push_used_in(&mut self, a: &impl RingAccess, elems: &[(u16, u32)]) -> Result<(), RingError> {
        let size = self.addrs.size;
        let mut pos = self.next_used + Wrapping(self.unpublished);
        for &(id, len) in elems {
            let slot = u64::from(pos.0 % size);
            let mut raw = [0u8; 8];
            raw[..4].copy_from_slice(&u32::from(id).to_le_bytes());
            raw[4..].copy_from_slice(&len.to_le_bytes());
            a.write(Area::Used, 4 + 8 * slot, &raw)?;
            pos += Wrapping(1);
            self.unpublished = self.unpublished.wrapping_add(1);
        }
        Ok(())
    }

    /// Publishes every pushed element with one release store of `used.idx`.
    pub fn publish(&mut self, mem: &GuestMemoryMmap) -> Result<(), RingError> {
        let a = self.direct(mem);
        self.publish_in(&a)
    }

    /// [`SplitRing::publish`] through `a`.
    pub fn publish_in(&mut self, a: &impl RingAccess) -> Result<(), RingError> {
        if self.unpublished == 0 {
            return Ok(());
        }
        let pos = self.next_used + Wrapping(self.unpublished);
        self.unpublished = 0;
        self.next_used = pos;
        a.store16(Area::Used, 2, u16::to_le(pos.0), Ordering::Release)
    }

    /// Asks the driver not to kick this ring at all (RX: the device reads the avail ring
    /// whenever it has a frame, so kicks are never needed). Without EVENT_IDX: NO_NOTIFY in
    /// `used.flags`. With EVENT_IDX: `avail_event` one behind the next avail entry, so the
    /// driver's `vring_need_event` stays false until the index wraps (one kick per 65536).
    pub fn suppress_kicks(&self, mem: &GuestMemoryMmap) {
        let a = self.direct(mem);
        let size = u64::from(self.addrs.size);
        let _ = if self.event_idx {
            a.store16(Area::Used, 4 + 8 * size, u16::to_le((self.next_avail - Wrapping(1)).0), Ordering::Relaxed)
        } else {
            a.store16(Area::Used, 0, u16::to_le(USED_F_NO_NOTIFY), Ordering::Relaxed)
        };
    }

    /// Whether the driver wants an interrupt after `used.idx` moved from `old` to `next_used`.
    pub fn needs_notification(&self, mem: &GuestMemoryMmap, old: Wrapping<u16>) -> bool {
        self.needs_notification_in(&self.direct(mem), old)
    }

    /// [`SplitRing::needs_notification`] through `a`.
    pub fn needs_notification_in(&self, a: &impl RingAccess, old: Wrapping<u16>) -> bool {
        fence(Ordering::SeqCst);
        let size = u64::from(self.addrs.size);
        if self.event_idx {
            let Ok(ev) = a.load16(Area::Avail, 4 + 2 * size, Ordering::Relaxed) else {
                return true;
            };
            let event = Wrapping(u16::from_le(ev));
            let new = self.next_used;
            // vring_need_event(event, new, old)
            (new - event - Wrapping(1)) < (new - old)
        } else {
            match a.load16(Area::Avail, 0, Ordering::Relaxed) {
                Ok(f) => u16::from_le(f) & AVAIL_F_NO_INTERRUPT == 0,
                Err(_) => true,
            }
        }
    }

    /// Asks the driver to kick when it adds chains after the ones we consumed (EVENT_IDX:
    /// `avail_event = next_avail`; else clear NO_NOTIFY). Returns true if new chains arrived
    /// meanwhile (the caller must process them, no kick will come for them).
    pub fn enable_notification(&self, mem: &GuestMemoryMmap) -> Result<bool, RingError> {
        let a = self.direct(mem);
        let size = u64::from(self.addrs.size);
        if self.event_idx {
            a.store16(Area::Used, 4 + 8 * size, u16::to_le(self.next_avail.0), Ordering::Relaxed)?;
        } else {
            a.store16(Area::Used, 0, 0, Ordering::Relaxed)?;
        }
        fence(Ordering::SeqCst);
        Ok(self.pending_in(&a)? != 0)
    }

    /// Asks the driver not to kick (only meaningful without EVENT_IDX).
    pub fn disable_notification(&self, mem: &GuestMemoryMmap) {
        if !self.event_idx {
            let _ = self.direct(mem).store16(Area::Used, 0, u16::to_le(USED_F_NO_NOTIFY), Ordering::Relaxed);
        }
    }
}
