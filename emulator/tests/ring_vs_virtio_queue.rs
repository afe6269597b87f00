//! Our split ring (`vhost::ring`) against rust-vmm's `virtio_queue::Queue`, which is fuzzed
//! upstream: on the same well-formed rings both must see the same chains (heads, segments,
//! direct and indirect), write the same used ring, and take the same EVENT_IDX interrupt
//! decisions. The datapath keeps its own ring for speed and for the MRG_RXBUF single
//! publication (docs/architecture.md, "Rings"); this keeps it honest against the reference.

use std::num::Wrapping;

use arfsnic::vhost::ring::{RingAddrs, Seg, SplitRing};
use arfsnic::vhost::testing::{DrvRing, GuestMem};
use proptest::prelude::*;
use virtio_queue::QueueT;

#[path = "common/virtio_queue.rs"]
mod virtio_queue_on;
use virtio_queue_on::queue_on;

const QSIZE: u16 = 64;
const MEM: u64 = 4 << 20;
const BUF_BASE: u64 = 0x10_0000;
const TABLES: u64 = 0x8_0000;

/// One chain as the driver builds it: segment lengths, direction, indirect or not.
#[derive(Clone, Debug)]
struct ChainSpec {
    lens: Vec<u32>,
    writable: bool,
    indirect: bool,
}

fn chain_spec() -> impl Strategy<Value = ChainSpec> {
    (prop::collection::vec(1u32..=4096, 1..=4), any::<bool>(), any::<bool>()).prop_map(|(lens, writable, indirect)| {
        // The harness's indirect tables hold driver-readable segments only.
        ChainSpec { lens, writable: writable && !indirect, indirect }
    })
}

/// Builds `chains` on ring `r` (0: ours, 1: virtio-queue's); both rings get the same
/// descriptors pointing at the same buffers. Returns the segments each chain should yield.
fn build(g: &GuestMem, d: &mut DrvRing, r: u64, chains: &[ChainSpec]) -> Vec<Vec<Seg>> {
    let mut next_buf = BUF_BASE;
    let mut want = Vec::new();
    for (c, spec) in chains.iter().enumerate() {
        let segs: Vec<(u64, u32)> = spec
            .lens
            .iter()
            .map(|&l| {
                let a = next_buf;
                next_buf += u64::from(l);
                (a, l)
            })
            .collect();
        if spec.indirect {
            let table = TABLES + (r * 64 + c as u64) * 16 * 8;
            d.add_indirect(g, table, &segs);
        } else {
            let with_dir: Vec<(u64, u32, bool)> = segs.iter().map(|&(a, l)| (a, l, spec.writable)).collect();
            d.add_chain(g, &with_dir);
        }
        want.push(segs.iter().map(|&(addr, len)| Seg { addr, len }).collect());
    }
    want
}

fn descriptors_needed(chains: &[ChainSpec]) -> usize {
    chains.iter().map(|c| if c.indirect { 1 } else { c.lens.len() }).sum()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn chains_used_ring_and_interrupt_decisions_agree(
        chains in prop::collection::vec(chain_spec(), 1..=16),
        // Near the used index (0 at start, at most 16 after), where the decision turns,
        // including just below 0; sometimes anywhere.
        used_event in prop_oneof![3 => (-3i32..=20).prop_map(|e| e as u16), 1 => any::<u16>()],
        used_lens in prop::collection::vec(0u32..=8192, 16),
        event_idx in any::<bool>(),
        split_at in 0usize..=16,
    ) {
        prop_assume!(descriptors_needed(&chains) <= usize::from(QSIZE));
        let g = GuestMem::new(MEM).unwrap();
        let mem = g.mem();
        let mut drv = [DrvRing::for_vring(0, QSIZE), DrvRing::for_vring(1, QSIZE)];
        let want = build(&g, &mut drv[0], 0, &chains);
        prop_assert_eq!(&build(&g, &mut drv[1], 1, &chains), &want);
        for d in &drv {
            g.write(&used_event.to_le_bytes(), d.avail + 4 + 2 * u64::from(QSIZE));
        }
        let addrs = RingAddrs { size: QSIZE, desc: drv[0].desc, avail: drv[0].avail, used: drv[0].used };
        prop_assert!(addrs.validate(mem));
        let mut ours = SplitRing::start(mem, addrs, 0, event_idx).unwrap();
        let mut vq = queue_on(&drv[1], event_idx);
        prop_assert!(vq.is_valid(mem));
        prop_assert_eq!(usize::from(ours.pending(mem).unwrap()), chains.len());

        // The chains, in order: same head, same segments, same direction.
        let mut heads = Vec::new();
        for (k, spec) in chains.iter().enumerate() {
            let head = ours.head(mem, k as u16).unwrap();
            let mut segs = Vec::new();
            let total = ours.walk(mem, head, spec.writable, &mut segs).unwrap();
            prop_assert_eq!(&segs, &want[k]);
            prop_assert_eq!(total, want[k].iter().map(|s| u64::from(s.len)).sum::<u64>());
            // The wrong direction is refused, never read as the other.
            prop_assert!(ours.walk(mem, head, !spec.writable, &mut Vec::new()).is_err());

            let chain = vq.pop_descriptor_chain(mem).expect("virtio-queue sees the chain");
            prop_assert_eq!(chain.head_index(), head);
            let descs: Vec<_> = chain.collect();
            prop_assert!(descs.iter().all(|d| d.is_write_only() == spec.writable));
            let vsegs: Vec<Seg> = descs.iter().map(|d| Seg { addr: d.addr().0, len: d.len() }).collect();
            prop_assert_eq!(&vsegs, &want[k]);
            heads.push(head);
        }
        prop_assert!(vq.pop_descriptor_chain(mem).is_none());
        ours.consume(chains.len() as u16);

        // Used elements in two publications (ours: push + one store; virtio-queue: a store
        // per element): the same used ring and the same interrupt decisions.
        let elems: Vec<(u16, u32)> = heads.iter().zip(&used_lens).map(|(&h, &l)| (h, l)).collect();
        let cut = split_at.min(elems.len());
        for part in [&elems[..cut], &elems[cut..]] {
            let old = ours.next_used;
            ours.publish_used(mem, part).unwrap();
            let ours_irq = ours.next_used != old && ours.needs_notification(mem, old);
            for &(h, l) in part {
                vq.add_used(mem, h, l).unwrap();
            }
            let vq_irq = !part.is_empty() && vq.needs_notification(mem).unwrap();
            prop_assert_eq!(ours_irq, vq_irq, "used_event {} after {} elements (event_idx {})", used_event, part.len(), event_idx);
        }
        prop_assert_eq!(ours.next_used, Wrapping(vq.next_used()));
        let used_bytes = |d: &DrvRing| {
            let mut b = vec![0u8; 4 + 8 * usize::from(QSIZE)];
            g.read(&mut b, d.used);
            b
        };
        prop_assert_eq!(used_bytes(&drv[0]), used_bytes(&drv[1]));
    }
}
