//! The trade-off columns of a run, from the guest's JSON block: RPS IPIs per second
//! (`/proc/net/softnet_stat`), and from the echo server's per-request delivery triples the
//! share of requests handed to another CPU's backlog and the share whose RX queue's IRQ
//! CPU sits in another LLC than the serving CPU (docs/measuring.md, "Trade-off columns").
//!
//! The guest's JSON is hostile input: sizes are bounded, malformed entries skipped.

use super::flows::{irq_cpu_per_queue, llc_groups};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};

/// `/proc/net/softnet_stat` column of `received_rps` (0-based; 6.1, 6.12 and 7.x print it
/// 10th, `net/core/net-procfs.c` `softnet_seq_show()`): RPS IPIs this CPU received.
const SOFTNET_RECEIVED_RPS: usize = 9;
/// Column of the CPU id the line belongs to (offline CPUs have no line).
const SOFTNET_CPU: usize = 12;
/// Rows (CPUs) of a softnet snapshot looked at.
const MAX_CPUS: usize = 4096;
/// Delivery entries looked at (the echo server prints at most 2048).
const MAX_DELIVERIES: usize = 65536;

/// `received_rps` per CPU of one softnet snapshot, keyed by the line's CPU id (its
/// position when the line has no CPU column). Malformed lines and values that are not
/// 32-bit counters are skipped.
fn received_rps(snapshot: &Value) -> BTreeMap<u64, u32> {
    let mut per_cpu = BTreeMap::new();
    for (i, row) in snapshot.as_array().into_iter().flatten().take(MAX_CPUS).enumerate() {
        let Some(row) = row.as_array() else { continue };
        let Some(v) = row.get(SOFTNET_RECEIVED_RPS).and_then(Value::as_u64).and_then(|v| u32::try_from(v).ok()) else {
            continue;
        };
        let cpu = row.get(SOFTNET_CPU).and_then(Value::as_u64).unwrap_or(i as u64);
        per_cpu.entry(cpu).or_insert(v);
    }
    per_cpu
}

/// RPS IPIs received by all guest CPUs between the two softnet snapshots: per CPU present
/// in both, the difference of the 32-bit counter (modulo 2^32). `None` when no CPU is in
/// both.
pub fn received_rps_delta(before: &Value, after: &Value) -> Option<u64> {
    let (b, a) = (received_rps(before), received_rps(after));
    let mut sum = 0u64;
    let mut paired = false;
    for (cpu, v1) in &a {
        if let Some(v0) = b.get(cpu) {
            sum += u64::from(v1.wrapping_sub(*v0));
            paired = true;
        }
    }
    paired.then_some(sum)
}

/// RPS IPIs per second: [`received_rps_delta`] of the guest's `softnet_stat_before` /
/// `softnet_stat_after` over the echo server's run time (`workload.elapsed_s`, the guest's
/// monotonic clock). The snapshots bracket the workload, which brackets the traffic; the
/// window between them is not timed and is longer by the server's start, its exit and
/// init's pause after it (about 0.3 s) plus `expire_after_load_s` when set.
pub fn rps_ipi_per_s(guest: &Value) -> Option<f64> {
    let ipis = received_rps_delta(&guest["softnet_stat_before"], &guest["softnet_stat_after"])?;
    let window_s = guest["workload"]["elapsed_s"].as_f64().filter(|s| s.is_finite() && *s > 0.0)?;
    Some(ipis as f64 / window_s)
}

/// What the echo server's delivery triples add up to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Deliveries {
    /// Requests with a known RX queue IRQ CPU, incoming CPU and app CPU.
    pub counted: u64,
    /// Of those, processed in softirq on another CPU than their queue's IRQ CPU.
    pub remote: u64,
    /// Of `counted`, processed in softirq on another CPU than the app CPU (RFS misses).
    pub app_miss: u64,
    /// Of `counted`, those whose IRQ CPU and app CPU both have an LLC group.
    pub llc_known: u64,
    /// Of `llc_known`, those whose queue's IRQ CPU is in another LLC than the app CPU.
    pub cross_llc: u64,
    /// Requests the guest counted that are in none of the above: NAPI id not an RX
    /// queue's, unknown IRQ CPU, or a failed `getsockopt`/`sched_getcpu()`.
    pub unmapped: u64,
}

impl Deliveries {
    /// `remote` over `counted` (%).
    pub fn remote_pct(&self) -> Option<f64> {
        (self.counted > 0).then(|| 100.0 * self.remote as f64 / self.counted as f64)
    }

    /// `app_miss` over `counted` (%).
    pub fn rfs_miss_pct(&self) -> Option<f64> {
        (self.counted > 0).then(|| 100.0 * self.app_miss as f64 / self.counted as f64)
    }

    /// `cross_llc` over `llc_known` (%).
    pub fn cross_llc_pct(&self) -> Option<f64> {
        (self.llc_known > 0).then(|| 100.0 * self.cross_llc as f64 / self.llc_known as f64)
    }
}

/// Adds up the workload's `deliveries` (`[napi_id, incoming_cpu, app_cpu, count]` per
/// distinct triple): NAPI id → RX queue by the guest's `rx_napi_ids`, → the queue's IRQ
/// CPU (effective affinity), LLC groups from the workload's `llc_groups`. `None` when the
/// workload printed no `deliveries` (an older image).
pub fn deliveries(guest: &Value) -> Option<Deliveries> {
    let list = guest["workload"]["deliveries"].as_array()?;
    let mut queue_of: HashMap<u64, usize> = HashMap::new();
    for (q, id) in guest["rx_napi_ids"].as_array().into_iter().flatten().take(MAX_CPUS).enumerate() {
        if let Some(id) = id.as_u64().filter(|&id| id != 0) {
            queue_of.entry(id).or_insert(q);
        }
    }
    let irq_cpu = irq_cpu_per_queue(guest);
    let llc = llc_groups(guest);
    let cpu = |v: &Value| v.as_u64().and_then(|c| u32::try_from(c).ok());
    let mut d = Deliveries::default();
    for e in list.iter().take(MAX_DELIVERIES) {
        let Some([id, incoming, app, count]) = e.as_array().map(Vec::as_slice) else { continue };
        let Some(count) = count.as_u64() else { continue };
        let queue = id.as_u64().and_then(|id| queue_of.get(&id).copied());
        let irq = queue.and_then(|q| irq_cpu.get(q).copied().flatten());
        let (Some(irq), Some(incoming), Some(app)) = (irq, cpu(incoming), cpu(app)) else {
            d.unmapped = d.unmapped.saturating_add(count);
            continue;
        };
        d.counted = d.counted.saturating_add(count);
        if incoming != irq {
            d.remote = d.remote.saturating_add(count);
        }
        if incoming != app {
            d.app_miss = d.app_miss.saturating_add(count);
        }
        if let (Some(gi), Some(ga)) = (llc.get(&irq), llc.get(&app)) {
            d.llc_known = d.llc_known.saturating_add(count);
            if gi != ga {
                d.cross_llc = d.cross_llc.saturating_add(count);
            }
        }
    }
    Some(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A 6.12 softnet line (15 columns): processed, dropped, squeeze, 6 zeros,
    /// received_rps, flow_limit, backlog, cpu id, input_qlen, process_qlen.
    fn line(cpu: u64, rps: u64) -> Value {
        json!([100, 0, 0, 0, 0, 0, 0, 0, 0, rps, 0, 0, cpu, 0, 0])
    }

    #[test]
    fn rps_ipis_sum_the_per_cpu_deltas_over_the_workload() {
        let g = json!({
            "softnet_stat_before": [line(0, 10), line(1, 20), line(2, 0), line(3, 5)],
            "softnet_stat_after": [line(0, 110), line(1, 20), line(2, 300), line(3, 105)],
            "workload": { "elapsed_s": 10.0 },
        });
        assert_eq!(received_rps_delta(&g["softnet_stat_before"], &g["softnet_stat_after"]), Some(500));
        assert_eq!(rps_ipi_per_s(&g), Some(50.0));
    }

    #[test]
    fn rps_ipis_pair_cpus_by_id_wrap_at_32_bits_and_skip_malformed_lines() {
        // CPU 1 went offline: its line is missing after, CPU 2's line moved up.
        let before = json!([line(0, 1), line(1, 7), line(2, u64::from(u32::MAX) - 1)]);
        let after = json!([line(0, 3), line(2, 2), "junk", [1, 2], line(5, 9)]);
        assert_eq!(received_rps_delta(&before, &after), Some(2 + 4));
        // 6.1 lines have 13 columns, older ones no CPU id: the position stands in.
        let old = |rps: u64| json!([1, 0, 0, 0, 0, 0, 0, 0, 0, rps, 0]);
        assert_eq!(received_rps_delta(&json!([old(1), old(2)]), &json!([old(4), old(2)])), Some(3));
        // Not a 32-bit counter: the line is skipped; nothing paired: None.
        assert_eq!(received_rps_delta(&json!([line(0, 1 << 40)]), &json!([line(0, 5)])), None);
        assert_eq!(received_rps_delta(&json!(null), &json!({})), None);
        let no_window = json!({ "softnet_stat_before": [line(0, 1)], "softnet_stat_after": [line(0, 2)],
                                 "workload": { "elapsed_s": 0.0 } });
        assert_eq!(rps_ipi_per_s(&no_window), None);
    }

    /// 4 CPUs in two LLCs {0,1} {2,3}; queue q's NAPI id is 8193 + q, its IRQ on CPU q.
    fn guest(deliveries: Value) -> Value {
        let irqs: Vec<Value> = (0..4).map(|c| json!({ "effective_affinity_list": c.to_string() })).collect();
        json!({
            "rx_napi_ids": [8193, 8194, 8195, 8196],
            "irqs_input": irqs,
            "workload": { "llc_groups": [[0, 1], [2, 3]], "deliveries": deliveries },
        })
    }

    #[test]
    fn remote_and_cross_llc_shares_from_the_triples() {
        let g = guest(json!([
            [8193, 0, 0, 50], // queue 0, softirq on its IRQ CPU, served there
            [8193, 1, 1, 20], // queue 0, handed to CPU 1 (same LLC)
            [8195, 0, 0, 20], // queue 2 (IRQ CPU 2), handed to CPU 0: remote, cross-LLC
            [8196, 3, 1, 10], // queue 3, not handed over, served in the other LLC: an RFS miss
        ]));
        let d = deliveries(&g).unwrap();
        assert_eq!(
            d,
            Deliveries { counted: 100, remote: 40, app_miss: 10, llc_known: 100, cross_llc: 30, unmapped: 0 }
        );
        assert_eq!((d.remote_pct(), d.cross_llc_pct(), d.rfs_miss_pct()), (Some(40.0), Some(30.0), Some(10.0)));
    }

    #[test]
    fn unmappable_and_malformed_triples_are_left_out() {
        let g = guest(json!([
            [8193, 1, 1, 10],
            [0, 1, 1, 5],     // no NAPI id
            [9999, 1, 1, 5],  // not an RX queue's NAPI
            [8194, -1, 1, 5], // SO_INCOMING_CPU failed
            [8194, 1, -1, 5], // sched_getcpu() failed
            [8194, 1, 7, 4],  // app CPU in no LLC group: counted, LLC unknown
            [8194, 1, 1],     // malformed
            "junk",
            [8194, 1, 1, -3],       // malformed count
            [8194, 1, 1, u64::MAX], // saturates instead of overflowing
        ]));
        let d = deliveries(&g).unwrap();
        assert_eq!(d.unmapped, 20);
        assert_eq!(d.counted, u64::MAX);
        assert_eq!(d.remote, 10); // queue 0's IRQ is on CPU 0
        assert_eq!(d.llc_known, u64::MAX);
        assert_eq!(d.cross_llc, 0);
        // no IRQ CPU for the queue
        let mut g = guest(json!([[8193, 1, 1, 10]]));
        g["irqs_input"][0]["effective_affinity_list"] = json!("");
        let d = deliveries(&g).unwrap();
        assert_eq!((d.counted, d.unmapped, d.remote_pct(), d.cross_llc_pct()), (0, 10, None, None));
        // an image without the field
        assert_eq!(deliveries(&json!({ "workload": {} })), None);
    }
}
