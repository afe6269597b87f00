//! The kernel's RFS path, to be read next to `net/core/dev.c`: `rps_sock_flow_table`
//! (global), one `rps_dev_flow` table per RX queue, `get_rps_cpu()`, `set_rps_cpu()`,
//! `rps_may_expire_flow()` and `rps_flow_is_active()`, for the two kernel generations the
//! scenarios boot and with the v11 LLC skip (`net.core.arfs_llc_affinity`).
//!
//! Packets are processed the moment they are enqueued (no backlog queueing delay): a
//! CPU's `input_queue_head` counts the packets RFS handed to it, and the in-order check
//! of `get_rps_cpu()` (`head - last_qtail >= 0`) always holds. At the rates of the shipped
//! scenarios a backlog holds at most a few packets; docs/model.md says what this leaves
//! out.

use super::topo::{Topology, NO_CPU};

/// `RPS_NO_FILTER`.
pub const NO_FILTER: u16 = 0xffff;

/// Which `net/core/dev.c` the guest runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelRfs {
    /// 6.12: `flow_id = hash & mask`, no active-flow check in `set_rps_cpu()`, expiry
    /// after `10 * mask` packets of the flow's CPU.
    V6_12,
    /// 6.16–6.17: 7.3's `rfs_slot()` and `10 << log` (Eric Dumazet, May 2025) without the
    /// active-flow check — the "org code" of Krishna Kumar's table.
    V6_16,
    /// ≥ 6.18 (7.3 here): `rfs_slot()` = `hash_32(hash, log)`, `rps_flow_is_active()`
    /// guards a slot another live flow holds, expiry after `10 << log` packets.
    V7_3,
}

impl KernelRfs {
    /// The RFS code of a kernel named as in the scenarios (`patched-7.3`, `debian-6.12`, …).
    pub fn of_kernel(name: &str) -> Option<KernelRfs> {
        let v = name.rsplit('-').next()?;
        let mut it = v.split('.');
        let major: u32 = it.next()?.parse().ok()?;
        let minor: u32 = it.next()?.parse().ok()?;
        match (major, minor) {
            (6, 10..=15) => Some(KernelRfs::V6_12),
            (6, 16..=17) => Some(KernelRfs::V6_16),
            (6, 18..) | (7.., _) => Some(KernelRfs::V7_3),
            _ => None,
        }
    }
}

/// `GOLDEN_RATIO_32` of `hash_32()`, and its inverse modulo 2^32.
const GOLDEN_RATIO_32: u32 = 0x61C8_8647;
const GOLDEN_RATIO_32_INV: u32 = golden_inverse();

const fn golden_inverse() -> u32 {
    // Newton's iteration for the inverse of an odd number modulo 2^32.
    let mut x: u32 = GOLDEN_RATIO_32;
    let mut i = 0;
    while i < 5 {
        x = x.wrapping_mul(2u32.wrapping_sub(GOLDEN_RATIO_32.wrapping_mul(x)));
        i += 1;
    }
    x
}

/// The `rps_dev_flow` slot of `hash` in a table of `2^log` entries: 6.12's
/// `hash & mask`, 7.3's `rfs_slot()` (`hash_32(hash, log)`).
pub fn slot_of(kernel: KernelRfs, hash: u32, log: u8) -> u32 {
    match (kernel, log) {
        (_, 0) => 0,
        (KernelRfs::V6_12, _) => hash & ((1u32 << log) - 1),
        (KernelRfs::V6_16 | KernelRfs::V7_3, _) => hash.wrapping_mul(GOLDEN_RATIO_32) >> (32 - u32::from(log)),
    }
}

/// A non-zero hash whose slot in a table of `2^log` entries is `slot`, the other bits
/// taken from `random`: how the twin replays the slots a VM boot's hashes fell in.
pub fn hash_in_slot(kernel: KernelRfs, slot: u32, log: u8, random: u32) -> u32 {
    let h = match (kernel, log) {
        (_, 0) => random,
        (KernelRfs::V6_12, _) => (random & !((1u32 << log) - 1)) | (slot & ((1u32 << log) - 1)),
        (KernelRfs::V6_16 | KernelRfs::V7_3, _) => {
            let low = 32 - u32::from(log);
            // x = 0 would be the hash 0 ("no hash"): another low part, same slot.
            let x = (slot << low) | (random & ((1u32 << low) - 1));
            let x = if x == 0 { 1 } else { x };
            x.wrapping_mul(GOLDEN_RATIO_32_INV)
        }
    };
    if h == 0 {
        // 6.12, slot 0, `random`'s high bits all zero (or no table): a bit above the slot.
        1 << 31
    } else {
        h
    }
}

/// `struct rps_dev_flow`.
#[derive(Clone, Copy, Debug)]
pub struct DevFlow {
    pub cpu: u16,
    pub filter: u16,
    pub last_qtail: u32,
    /// 7.3 only (`rflow->hash`).
    pub hash: u32,
}

impl Default for DevFlow {
    fn default() -> Self {
        DevFlow { cpu: NO_CPU, filter: NO_FILTER, last_qtail: 0, hash: 0 }
    }
}

/// Where `get_rps_cpu()` left the packet's `rps_dev_flow` (its `*rflowp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowSlot {
    pub queue: u16,
    pub slot: u32,
}

/// Counters of the kernel side, per run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RfsStats {
    /// `set_rps_cpu()` calls (a flow's CPU changed in its slot).
    pub set_rps_cpu: u64,
    /// Steers the v11 LLC check skipped.
    pub llc_skipped: u64,
    /// Steers skipped because `rmap(next_cpu)` is the queue the packet came on.
    pub same_queue: u64,
    /// 7.3: steers skipped because the target slot holds another active flow.
    pub slot_busy: u64,
    /// Packets RFS handed to a CPU's backlog.
    pub backlog: u64,
}

pub struct Rfs {
    kernel: KernelRfs,
    llc_skip: bool,
    /// aRFS configured (`NETIF_F_NTUPLE`, an rmap, the driver's `ndo_rx_flow_steer`).
    arfs: bool,
    sock: Vec<u32>,
    sock_mask: u32,
    cpu_mask: u32,
    /// Per RX queue; `log == None`: `rps_flow_cnt` 0, no table.
    dev: Vec<(Option<u8>, Vec<DevFlow>)>,
    /// Per CPU `softnet_data.input_queue_head`.
    pub head: Vec<u32>,
    pub stats: RfsStats,
}

impl Rfs {
    /// `sock_entries` and `flow_cnt` are powers of two (0: no table), as the scenario checks.
    pub fn new(
        kernel: KernelRfs,
        cpus: usize,
        queues: u16,
        sock_entries: u32,
        flow_cnt: u32,
        llc_skip: bool,
        arfs: bool,
    ) -> Rfs {
        let log = (flow_cnt > 0).then(|| flow_cnt.trailing_zeros() as u8);
        Rfs {
            kernel,
            llc_skip,
            arfs,
            sock: vec![u32::MAX; sock_entries as usize],
            sock_mask: sock_entries.wrapping_sub(1),
            cpu_mask: (cpus as u32).next_power_of_two() - 1,
            dev: (0..queues).map(|_| (log, vec![DevFlow::default(); flow_cnt as usize])).collect(),
            head: vec![0; cpus],
            stats: RfsStats::default(),
        }
    }

    /// `rps_record_sock_flow()`: the application read the flow on `cpu`.
    pub fn record_sock_flow(&mut self, hash: u32, cpu: u16) {
        if self.sock.is_empty() || hash == 0 {
            return;
        }
        let val = (hash & !self.cpu_mask) | u32::from(cpu);
        self.sock[(hash & self.sock_mask) as usize] = val;
    }

    /// The slot of `hash` in a queue's table of `2^log` entries.
    fn slot(&self, hash: u32, log: u8) -> u32 {
        slot_of(self.kernel, hash, log)
    }

    fn flow(&mut self, at: FlowSlot) -> &mut DevFlow {
        &mut self.dev[usize::from(at.queue)].1[at.slot as usize]
    }

    /// 7.3's `rps_flow_is_active()`; 6.12's inline test in `rps_may_expire_flow()` (its
    /// window is `10 * mask`).
    fn is_active(&self, f: &DevFlow, log: u8) -> bool {
        if usize::from(f.cpu) >= self.head.len() {
            return false;
        }
        let window = match self.kernel {
            KernelRfs::V6_12 => 10i64 * ((1i64 << log) - 1),
            KernelRfs::V6_16 | KernelRfs::V7_3 => 10i64 << log,
        } as i32;
        (self.head[usize::from(f.cpu)].wrapping_sub(f.last_qtail) as i32) < window
    }

    /// `get_rps_cpu()` for a packet of `hash` that arrived on `rxq`, then its enqueue to
    /// the chosen CPU's backlog. `steer(rxq_index, flow_id)` is the driver's
    /// `ndo_rx_flow_steer`, returning a filter id or a negative errno. Returns the CPU
    /// RFS chose (`None`: the packet stays on the IRQ CPU; no RPS map is configured).
    pub fn receive(
        &mut self,
        topo: &Topology,
        rxq: u16,
        hash: u32,
        mut steer: impl FnMut(u16, u32) -> i32,
    ) -> Option<u16> {
        let (log, _) = self.dev.get(usize::from(rxq))?;
        let log = (*log)?;
        if hash == 0 || self.sock.is_empty() {
            return None;
        }
        let ident = self.sock[(hash & self.sock_mask) as usize];
        if (ident ^ hash) & !self.cpu_mask != 0 {
            return None; // try_rps, and no rps_map
        }
        let next_cpu = (ident & self.cpu_mask) as u16;
        let mut at = FlowSlot { queue: rxq, slot: self.slot(hash, log) };
        let rflow = *self.flow(at);
        let mut tcpu = rflow.cpu;
        let cpus = self.head.len();
        if tcpu != next_cpu
            && (usize::from(tcpu) >= cpus || (self.head[usize::from(tcpu)].wrapping_sub(rflow.last_qtail) as i32) >= 0)
        {
            at = self.set_rps_cpu(topo, at, rxq, tcpu, next_cpu, hash, &mut steer);
            tcpu = next_cpu;
        }
        if usize::from(tcpu) >= cpus {
            return None;
        }
        // enqueue_to_backlog(): the tail advances, the flow remembers it; processed at once.
        let h = &mut self.head[usize::from(tcpu)];
        *h = h.wrapping_add(1);
        let tail = *h;
        self.flow(at).last_qtail = tail;
        self.stats.backlog += 1;
        Some(tcpu)
    }

    #[allow(clippy::too_many_arguments)]
    fn set_rps_cpu(
        &mut self,
        topo: &Topology,
        mut at: FlowSlot,
        skb_rxq: u16,
        old_cpu: u16,
        next_cpu: u16,
        hash: u32,
        steer: &mut impl FnMut(u16, u32) -> i32,
    ) -> FlowSlot {
        self.stats.set_rps_cpu += 1;
        if usize::from(next_cpu) < self.head.len() {
            'out: {
                if !self.arfs {
                    break 'out;
                }
                if self.llc_skip && usize::from(old_cpu) < self.head.len() && topo.share_cache(old_cpu, next_cpu) {
                    self.stats.llc_skipped += 1;
                    break 'out;
                }
                let rxq_index = topo.rmap(next_cpu);
                if rxq_index == skb_rxq {
                    self.stats.same_queue += 1;
                    break 'out;
                }
                let Some(log) = self.dev[usize::from(rxq_index)].0 else { break 'out };
                let flow_id = self.slot(hash, log);
                let target = FlowSlot { queue: rxq_index, slot: flow_id };
                if self.kernel == KernelRfs::V7_3 {
                    let tmp = *self.flow(target);
                    if tmp.filter != NO_FILTER && self.is_active(&tmp, log) && (hash != tmp.hash || next_cpu == tmp.cpu)
                    {
                        self.stats.slot_busy += 1;
                        break 'out;
                    }
                }
                let rc = steer(rxq_index, flow_id);
                if rc < 0 {
                    break 'out;
                }
                let rc = rc as u16;
                let old = at;
                at = target;
                let t = self.flow(at);
                t.filter = rc;
                t.hash = hash;
                let o = self.flow(old);
                if o.filter == rc {
                    o.filter = NO_FILTER;
                }
            }
            let head = self.head[usize::from(next_cpu)];
            self.flow(at).last_qtail = head;
        }
        self.flow(at).cpu = next_cpu;
        at
    }

    /// `rps_may_expire_flow()`: whether the driver may remove filter `filter_id` it
    /// installed for `flow_id` on `rxq`.
    pub fn may_expire(&self, rxq: u16, flow_id: u32, filter_id: u16) -> bool {
        let Some((Some(log), flows)) = self.dev.get(usize::from(rxq)) else { return true };
        let Some(f) = flows.get(flow_id as usize) else { return true };
        !(f.filter == filter_id && self.is_active(f, *log))
    }
}

#[cfg(test)]
mod tests {
    use super::super::topo::L3Per;
    use super::*;

    fn topo() -> Topology {
        Topology::new(2, 1, 2, 1, L3Per::Die, 4, false).unwrap()
    }

    #[test]
    fn a_hash_made_for_a_slot_lands_in_it() {
        for k in [KernelRfs::V6_12, KernelRfs::V6_16, KernelRfs::V7_3] {
            for (slot, log, r) in [(0, 12, 0), (4095, 12, u32::MAX), (2718, 12, 0x1234_5678), (5, 3, 77), (0, 0, 9)] {
                let h = hash_in_slot(k, slot, log, r);
                assert_ne!(h, 0);
                assert_eq!(slot_of(k, h, log), slot, "{k:?} slot {slot} log {log}");
            }
        }
        assert_eq!(GOLDEN_RATIO_32.wrapping_mul(GOLDEN_RATIO_32_INV), 1);
    }

    #[test]
    fn kernel_names_map_to_their_rfs_code() {
        assert_eq!(KernelRfs::of_kernel("patched-7.3"), Some(KernelRfs::V7_3));
        assert_eq!(KernelRfs::of_kernel("debian-6.12"), Some(KernelRfs::V6_12));
        assert_eq!(KernelRfs::of_kernel("debian-6.1"), None);
        assert_eq!(KernelRfs::of_kernel("vanilla-6.17"), Some(KernelRfs::V6_16));
        assert_eq!(KernelRfs::of_kernel("debian-6.18"), Some(KernelRfs::V7_3));
    }

    #[test]
    fn a_flow_whose_reader_moves_is_steered_once_to_the_readers_queue() {
        for k in [KernelRfs::V6_12, KernelRfs::V6_16, KernelRfs::V7_3] {
            let t = topo();
            let mut r = Rfs::new(k, 4, 4, 32768, 4096, false, true);
            let hash = 0x1234_5678;
            let mut calls = Vec::new();
            // No reader yet: RFS does nothing.
            assert_eq!(
                r.receive(&t, 0, hash, |q, id| {
                    calls.push((q, id));
                    7
                }),
                None
            );
            r.record_sock_flow(hash, 2);
            assert_eq!(
                r.receive(&t, 0, hash, |q, id| {
                    calls.push((q, id));
                    7
                }),
                Some(2)
            );
            assert_eq!(calls.len(), 1, "{k:?}");
            assert_eq!(calls[0].0, 2);
            // The filter took effect: packets now arrive on queue 2, no more steers.
            assert_eq!(r.receive(&t, 2, hash, |_, _| panic!("steered again")), Some(2));
            assert!(!r.may_expire(2, calls[0].1, 7));
            assert!(r.may_expire(2, calls[0].1, 8), "another filter id");
        }
    }

    #[test]
    fn the_llc_skip_keeps_the_queue_within_an_llc_and_not_across() {
        let t = topo();
        let mut r = Rfs::new(KernelRfs::V7_3, 4, 4, 32768, 4096, true, true);
        let hash = 0x0bad_cafe;
        r.record_sock_flow(hash, 0);
        r.receive(&t, 0, hash, |_, _| panic!("queue 0 is CPU 0's"));
        r.record_sock_flow(hash, 1); // same LLC
        assert_eq!(r.receive(&t, 0, hash, |_, _| panic!("skipped within the LLC")), Some(1));
        assert_eq!(r.stats.llc_skipped, 1);
        r.record_sock_flow(hash, 3); // the other LLC
        let mut n = 0;
        r.receive(&t, 0, hash, |q, _| {
            assert_eq!(q, 3);
            n += 1;
            1
        });
        assert_eq!(n, 1);
    }

    #[test]
    fn two_live_flows_in_one_slot_fight_on_6_16_and_not_on_7_3() {
        for (k, fights) in [(KernelRfs::V6_16, true), (KernelRfs::V7_3, false)] {
            let t = topo();
            let mut r = Rfs::new(k, 4, 4, 32768, 256, false, true);
            let (a, b) = (hash_in_slot(k, 9, 8, 0x1111), hash_in_slot(k, 9, 8, 0x2222));
            assert_ne!(a, b);
            r.record_sock_flow(a, 2);
            r.record_sock_flow(b, 2);
            r.receive(&t, 0, a, |q, id| {
                assert_eq!((q, id), (2, 9));
                1
            });
            let mut steered = false;
            r.receive(&t, 1, b, |_, _| {
                steered = true;
                2
            });
            assert_eq!(steered, fights, "{k:?}");
            // Flow a's filter 1: evicted from the slot on 6.16, kept on 7.3.
            assert_eq!(r.may_expire(2, 9, 1), fights, "{k:?}");
        }
    }

    #[test]
    fn an_idle_flow_expires_after_its_cpus_window() {
        let t = topo();
        let mut r = Rfs::new(KernelRfs::V7_3, 4, 4, 32768, 16, false, true);
        let hash = 0x7777_0001;
        r.record_sock_flow(hash, 1);
        let mut id = 0;
        r.receive(&t, 0, hash, |_, f| {
            id = f;
            5
        });
        assert!(!r.may_expire(1, id, 5));
        // 10 << 4 packets of other flows on CPU 1.
        r.head[1] = r.head[1].wrapping_add(160);
        assert!(r.may_expire(1, id, 5));
    }
}
