//! The split-virtqueue parser (`vhost::ring`) on guest memory the fuzzer writes: descriptor
//! tables with loops, out-of-range, overlapping and cross-region addresses, zero and huge
//! lengths, indirect tables (nested, huge, misaligned), avail/used indices beyond the ring
//! size, rings placed over each other or over the hole in guest memory.
//!
//! Guest memory (in process, `GuestMemoryMmap`, zeroed before every input): regions
//! [0, 0x4000) and [0x4000, 0x5000) (adjacent), a hole, then [0x6000, 0x7000); ring
//! addresses reach up to 0x8000, so rings and chains also land in the hole and beyond.
//!
//! Input (little-endian, missing bytes read as 0):
//! ```text
//! u8  log2 of the queue size (mod 16)
//! u8  flags: 1 EVENT_IDX, 2 device-writable chains (RX), 4 raw (unscaled) ring addresses
//! u16 desc, u16 avail, u16 used    ring addresses (scaled by 16/2/4 unless raw)
//! u16 base (next_avail at start), u16 avail.idx, u16 used.idx, u16 avail.flags, u16 used_event
//! u8  n, then n descriptors of 16 bytes written to desc[0..n]
//! u8  m, then m u16 heads written to the avail ring from slot `base`
//! then patches until the end: u32 address, u8 length, bytes
//! ```
//! The target then does what the backend's TX worker and RX delivery do: up to four rounds
//! of pending / head / walk (RX: chains appended to one segment list, as for a mergeable
//! buffer), consume, publish_used or push_used + publish (RX batches) with suppress_kicks,
//! needs_notification, enable/disable_notification. Even rounds also go through a
//! `RingView` (the batch path's slices of the ring areas) and must agree with the
//! region-by-region reads.
//!
//! Property: no panic, bounded work, and every segment `walk` returns is inside guest
//! memory, non-empty and adds up to the returned length, at most MAX_CHAIN_SEGMENTS per chain.

#![no_main]

use std::num::Wrapping;
use std::sync::LazyLock;

use arfsnic::vhost::ring::{range_ok, Regions, RingAccess, RingAddrs, RingView, Seg, SplitRing, MAX_CHAIN_SEGMENTS};
use libfuzzer_sys::fuzz_target;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

const REGIONS: [(u64, usize); 3] = [(0, 0x4000), (0x4000, 0x1000), (0x6000, 0x1000)];
/// Scaled ring addresses wrap here (past the last region).
const ADDR_SPACE: u64 = 0x8000;

static MEM: LazyLock<GuestMemoryMmap> = LazyLock::new(|| {
    let ranges: Vec<(GuestAddress, usize)> = REGIONS.iter().map(|&(a, l)| (GuestAddress(a), l)).collect();
    GuestMemoryMmap::from_ranges(&ranges).expect("guest memory")
});

/// Zeroes every region through its host mapping (a plain memset; much cheaper than
/// going through the volatile accessors for every byte).
fn zero(mem: &GuestMemoryMmap) {
    for &(a, l) in &REGIONS {
        let host = mem.get_host_address(GuestAddress(a)).expect("region start is mapped");
        // SAFETY: the region [a, a + l) is one mapping of `l` bytes owned by `mem`, and
        // nothing else accesses it while this input runs.
        unsafe { std::ptr::write_bytes(host, 0, l) };
    }
}

struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
    fn u8(&mut self) -> u8 {
        self.bytes(1).first().copied().unwrap_or(0)
    }
    fn u16(&mut self) -> u16 {
        let mut b = [0u8; 2];
        let s = self.bytes(2);
        b[..s.len()].copy_from_slice(s);
        u16::from_le_bytes(b)
    }
    fn u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        let s = self.bytes(4);
        b[..s.len()].copy_from_slice(s);
        u32::from_le_bytes(b)
    }
}

/// Guest writes of the input; outside guest memory they are simply lost (as the fuzzer's
/// addresses often are).
fn poke(mem: &GuestMemoryMmap, addr: u64, data: &[u8]) {
    let _ = mem.write_slice(data, GuestAddress(addr));
}

fn check_segments(mem: &GuestMemoryMmap, segs: &[Seg], total: u64) {
    let mut sum = 0u64;
    for s in segs {
        assert!(s.len > 0, "empty segment returned");
        assert!(range_ok(mem, s.addr, u64::from(s.len)), "segment {s:?} outside guest memory");
        // The backend reads/writes every byte; touching both ends is enough to prove it can.
        let last = s.addr + u64::from(s.len) - 1;
        let _: u8 = mem.read_obj(GuestAddress(s.addr)).expect("first byte of a segment");
        let _: u8 = mem.read_obj(GuestAddress(last)).expect("last byte of a segment");
        sum += u64::from(s.len);
    }
    assert_eq!(sum, total, "walk's length is not the sum of its segments");
}

fuzz_target!(|data: &[u8]| {
    let mem = &*MEM;
    zero(mem);
    let mut c = Cursor(data);
    let size = 1u16 << (c.u8() % 16);
    let flags = c.u8();
    let event_idx = flags & 1 != 0;
    let writable = flags & 2 != 0;
    let raw = flags & 4 != 0;
    let (d, a, u) = (u64::from(c.u16()), u64::from(c.u16()), u64::from(c.u16()));
    let addrs = if raw {
        RingAddrs { size, desc: d, avail: a, used: u }
    } else {
        RingAddrs { size, desc: (d * 16) % ADDR_SPACE, avail: (a * 2) % ADDR_SPACE, used: (u * 4) % ADDR_SPACE }
    };
    let base = c.u16();
    let (avail_idx, used_idx, avail_flags, used_event) = (c.u16(), c.u16(), c.u16(), c.u16());

    let n = c.u8();
    for i in 0..u64::from(n) {
        let desc = c.bytes(16).to_vec();
        poke(mem, addrs.desc + 16 * i, &desc);
    }
    let m = c.u8();
    for i in 0..m {
        let head = c.u16();
        let slot = u64::from(base.wrapping_add(u16::from(i)) % size);
        poke(mem, addrs.avail + 4 + 2 * slot, &head.to_le_bytes());
    }
    poke(mem, addrs.avail, &avail_flags.to_le_bytes());
    poke(mem, addrs.avail + 2, &avail_idx.to_le_bytes());
    poke(mem, addrs.avail + 4 + 2 * u64::from(size), &used_event.to_le_bytes());
    poke(mem, addrs.used + 2, &used_idx.to_le_bytes());
    while !c.0.is_empty() {
        let at = u64::from(c.u32());
        let len = usize::from(c.u8());
        let bytes = c.bytes(len).to_vec();
        poke(mem, at, &bytes);
    }

    // What the backend does before starting a ring.
    if !addrs.validate(mem) {
        return;
    }
    let Ok(mut ring) = SplitRing::start(mem, addrs, base, event_idx) else {
        return;
    };
    let mut segs = Vec::new();
    let mut used = Vec::new();
    for round in 0..4 {
        // Even rounds also read the ring through slices of its areas (the RX batch path)
        // and must see exactly what the region-by-region path sees.
        let view = if round % 2 == 0 { RingView::new(mem, &ring.addrs) } else { None };
        // One region cache for the round, as the datapath keeps one per batch.
        let regions = Regions::new(mem);
        let Ok(pending) = ring.pending(mem) else {
            break;
        };
        assert!(pending <= size);
        if let Some(v) = &view {
            assert_eq!(ring.pending_in(v).ok(), Some(pending));
        }
        if pending == 0 {
            match ring.enable_notification(mem) {
                Ok(true) => continue,
                _ => break,
            }
        }
        ring.disable_notification(mem);
        used.clear();
        segs.clear();
        let mut broken = false;
        for k in 0..pending.min(64) {
            let Ok(head) = ring.head(mem, k) else {
                broken = true;
                break;
            };
            assert!(head < size);
            if let Some(v) = &view {
                assert_eq!(ring.head_in(v, k).ok(), Some(head));
            }
            if !writable {
                segs.clear();
            }
            let from = segs.len();
            let walked = ring.walk(mem, head, writable, &mut segs);
            if let Some(v) = &view {
                let mut again = Vec::new();
                let w = ring.walk_in(v, &regions, head, writable, &mut again);
                assert_eq!(w, walked);
                if walked.is_ok() {
                    assert_eq!(&again[..], &segs[from..]);
                }
            }
            match walked {
                Ok(total) => {
                    assert!(segs.len() - from <= MAX_CHAIN_SEGMENTS);
                    check_segments(mem, &segs[from..], total);
                    used.push((head, u32::try_from(total).unwrap_or(u32::MAX)));
                }
                Err(_) => {
                    segs.truncate(from);
                    used.push((head, 0));
                }
            }
        }
        let old: Wrapping<u16> = ring.next_used;
        ring.consume(used.len() as u16);
        // RX batches push the used elements of several frames and publish them once; TX
        // publishes per batch: alternate the two.
        let batch = match (&view, round % 2) {
            (Some(v), _) => Some(rx_batch(&mut ring, v, mem, &used, old)),
            (None, 0) => {
                let d = ring.direct(mem);
                Some(rx_batch(&mut ring, &d, mem, &used, old))
            }
            _ => None,
        };
        match batch {
            Some(ok) => broken |= !ok,
            None => {
                broken |= ring.publish_used(mem, &used).is_err();
                let _ = ring.needs_notification(mem, old);
            }
        }
        if broken {
            break;
        }
    }
});

/// RX batches push the used elements of several frames and publish them once (TX publishes
/// per batch: the odd rounds). False when the ring refused.
fn rx_batch(
    ring: &mut SplitRing,
    a: &impl RingAccess,
    mem: &GuestMemoryMmap,
    used: &[(u16, u32)],
    old: Wrapping<u16>,
) -> bool {
    let (first, rest) = used.split_at(used.len() / 2);
    let ok =
        ring.push_used_in(a, first).and_then(|_| ring.push_used_in(a, rest)).and_then(|_| ring.publish_in(a)).is_ok();
    ring.suppress_kicks(mem);
    let _ = ring.needs_notification_in(a, old);
    ok
}
