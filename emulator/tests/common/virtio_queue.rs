//! virtio-queue's `Queue` on a ring laid out by `vhost::testing::DrvRing`: shared by
//! `tests/ring_vs_virtio_queue.rs` and `benches/rings.rs` (included with `#[path]`).

use arfsnic::vhost::testing::DrvRing;
use virtio_queue::{Queue, QueueT};

/// A ready `Queue` of the ring's size on the ring's three areas.
pub fn queue_on(d: &DrvRing, event_idx: bool) -> Queue {
    let mut q = Queue::new(d.size).expect("virtio-queue Queue");
    let split = |a: u64| (Some(a as u32), Some((a >> 32) as u32));
    let (l, h) = split(d.desc);
    q.set_desc_table_address(l, h);
    let (l, h) = split(d.avail);
    q.set_avail_ring_address(l, h);
    let (l, h) = split(d.used);
    q.set_used_ring_address(l, h);
    q.set_event_idx(event_idx);
    q.set_ready(true);
    q
}
