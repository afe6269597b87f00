//! What a run computes at its end from the link partner's records, the guest's JSON
//! block and the device's live rules: the per-flow view with the stuck-flow verdict,
//! misdelivered flows and the guest's CPU share (docs/measuring.md defines each).

use crate::device::snapshot::RuleView;
use crate::report::schema::FlowView;
use crate::traffic::partner::LinkStats;
use serde_json::Value;
use std::collections::HashMap;

/// A flow without a filter counts as stuck only after its requests have gone through RSS
/// for this long. A flow whose filter the driver just expired is re-steered at its next
/// move, after the driver's queued commands (up to 1.24 s measured on a loaded 2-core
/// host); one the driver believes steered stays without a filter for the rest of the
/// run (docs/measuring.md).
pub const STUCK_AFTER_MS: u64 = 2000;

fn first_cpu(list: &str) -> Option<u32> {
    list.split([',', '-']).next()?.trim().parse().ok()
}

/// The LLC group index of each guest CPU, from the workload's `llc_groups` (lists of CPU
/// ids, read from `/sys/devices/system/cpu/cpu*/cache/index3`); a CPU listed in two
/// groups belongs to the first.
pub(super) fn llc_groups(guest: &Value) -> HashMap<u32, usize> {
    let mut of = HashMap::new();
    for (g, cpus) in guest["workload"]["llc_groups"].as_array().into_iter().flatten().enumerate() {
        for cpu in cpus.as_array().into_iter().flatten().filter_map(Value::as_u64) {
            if let Ok(cpu) = u32::try_from(cpu) {
                of.entry(cpu).or_insert(g);
            }
        }
    }
    of
}

/// The IRQ CPU of each RX queue, by queue index: the first CPU of the queue's input IRQ
/// `effective_affinity_list`.
pub(super) fn irq_cpu_per_queue(guest: &Value) -> Vec<Option<u32>> {
    guest["irqs_input"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|q| q["effective_affinity_list"].as_str().and_then(first_cpu))
        .collect()
}

/// Per-flow view and the stuck-flow verdict. A flow is *stuck without filter* when it
/// was answered during the run, no filter for it is live in the device at the end, its
/// requests have gone through RSS for at least [`STUCK_AFTER_MS`], and the CPU serving
/// it is in another LLC than the IRQ CPU of the queue its packets hit.
pub fn flow_view(link: &LinkStats, guest: &Value, rules: &[RuleView], traffic_start_ns: u64) -> Vec<FlowView> {
    let llc = llc_groups(guest);
    let group_of = |cpu: u32| llc.get(&cpu).copied();
    let irq_cpu = irq_cpu_per_queue(guest);
    let by_tuple: HashMap<&str, &RuleView> = rules.iter().map(|r| (r.flow.as_str(), r)).collect();
    // A TCP flow is a connection slot: its last connection's 4-tuple. A CRR slot's last
    // connection is closed at the end, so none of them can be stuck.
    let proto = if link.tcp.is_some() { "tcp" } else { "udp" };
    let crr = link.tcp.as_ref().is_some_and(|t| t.pattern == "crr");
    link.per_flow
        .iter()
        .map(|f| {
            let tuple =
                format!("{proto} {}:{} {}:{}", super::PARTNER_IP, f.partner_port, super::GUEST_IP, f.guest_port);
            let rule = by_tuple.get(tuple.as_str()).copied();
            let app_cpu = f.last_cpu;
            let irq = f.last_queue.and_then(|q| irq_cpu.get(usize::from(q)).copied().flatten());
            let same_llc = match (app_cpu, irq) {
                (Some(a), Some(i)) => match (group_of(a), group_of(i)) {
                    (Some(x), Some(y)) => Some(x == y),
                    _ => None,
                },
                _ => None,
            };
            FlowView {
                flow: f.flow,
                responses: f.responses,
                queue: f.last_queue,
                filter: rule.map(|r| r.id),
                filter_queue: rule.and_then(|r| r.queue),
                filter_since_s: rule.map(|r| (r.installed_ns as f64 - traffic_start_ns as f64) / 1e9),
                app_cpu,
                irq_cpu: irq,
                same_llc,
                via_rss_only_ms: f.via_rss_only_ms,
                stuck_without_filter: !crr
                    && f.responses > 0
                    && rule.is_none()
                    && f.via_rss_only_ms.is_some_and(|ms| ms >= STUCK_AFTER_MS)
                    && same_llc == Some(false),
                tuple,
            }
        })
        .collect()
}

/// Flows whose packets reached a queue other than the one the device chose for them.
/// The guest reports, per flow, the NAPI id of the last packet its socket received
/// (SO_INCOMING_NAPI_ID) and the NAPI id of each RX queue; the link partner records the
/// queue the device put the flow's last packet on. Only flows whose every delivered
/// packet reached the guest's socket are compared (after a loss inside the guest the
/// device's last packet is not the socket's last one). Returns (misdelivered, compared).
pub fn flows_misdelivered(link: &LinkStats, guest: &Value) -> (u64, u64) {
    let napi: Vec<u64> = guest["rx_napi_ids"].as_array().into_iter().flatten().filter_map(Value::as_u64).collect();
    let mut compared = 0;
    let mut bad = 0;
    for gf in guest["workload"]["flows"].as_array().into_iter().flatten() {
        let (Some(i), Some(id), Some(received)) =
            (gf["flow"].as_u64(), gf["last_napi_id"].as_u64(), gf["requests"].as_u64())
        else {
            continue;
        };
        let Some(guest_q) = napi.iter().position(|&n| n == id) else { continue };
        let Some(f) = link.per_flow.get(i as usize) else { continue };
        let Some(dev_q) = f.last_queue else { continue };
        if f.queue_counts.iter().sum::<u64>() != received {
            continue;
        }
        compared += 1;
        if guest_q != usize::from(dev_q) {
            bad += 1;
        }
    }
    (bad, compared)
}

/// Guest CPU busy share (%) over the workload, from the guest's `/proc/stat` `cpu` line
/// before and after it; `None` when either snapshot is missing.
pub fn guest_cpu_pct(guest: &Value) -> Option<f64> {
    cpu_busy_pct(&guest["proc_stat_before"]["cpu"], &guest["proc_stat_after"]["cpu"])
}
/// Busy percentage of the guest's CPUs between two `/proc/stat` `cpu` lines (jiffies:
/// user nice system idle iowait irq softirq steal guest guest_nice). guest and
/// guest_nice are already counted in user and nice, so only the first eight count.
pub fn cpu_busy_pct(before: &Value, after: &Value) -> Option<f64> {
    let parse = |v: &Value| -> Option<Vec<u64>> { v.as_array()?.iter().map(Value::as_u64).collect() };
    let (b, a) = (parse(before)?, parse(after)?);
    let n = b.len().min(a.len()).min(8);
    if n < 4 {
        return None;
    }
    let total = |x: &[u64]| x[..n].iter().map(|&v| v as f64).sum::<f64>();
    let idle = |x: &[u64]| x[3] as f64 + if n > 4 { x[4] as f64 } else { 0.0 };
    let d_total = total(&a) - total(&b);
    let d_idle = idle(&a) - idle(&b);
    if d_total <= 0.0 || d_idle < 0.0 || d_idle > d_total {
        return None;
    }
    Some(100.0 * (d_total - d_idle) / d_total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::traffic::partner::FlowRecord;
    use crate::wire::flow::{FlowKey, L4Proto};
    use serde_json::json;

    fn flow(i: u32, queue: u16, cpu: u32, via_rss_only_ms: Option<u64>) -> FlowRecord {
        FlowRecord {
            flow: i,
            guest_port: 7000 + i as u16,
            partner_port: 9000 + i as u16,
            requests: 10,
            responses: 10,
            last_queue: Some(queue),
            last_cpu: Some(cpu),
            via_rss_only_ms,
            ..Default::default()
        }
    }

    /// Each condition of the stuck verdict (docs/measuring.md) on its own.
    #[test]
    fn stuck_needs_no_filter_a_long_rss_series_and_another_llc() {
        // CPUs 0-1 and 2-3 share an LLC; queue q's IRQ is on CPU q.
        let irqs: Vec<Value> = (0..4).map(|c| json!({ "effective_affinity_list": c.to_string() })).collect();
        let guest = json!({ "workload": { "llc_groups": [[0, 1], [2, 3]] }, "irqs_input": irqs });
        let long = Some(STUCK_AFTER_MS);
        let mut f = vec![
            flow(0, 0, 2, long),                     // stuck
            flow(1, 0, 2, long),                     // has a filter
            flow(2, 0, 2, Some(STUCK_AFTER_MS - 1)), // re-steer on the way
            flow(3, 0, 2, None),                     // its last request hit a filter
            flow(4, 0, 1, long),                     // same LLC as its queue's IRQ
            flow(5, 0, 3, long),                     // never answered
        ];
        f[5].responses = 0;
        let link = LinkStats { per_flow: f, ..Default::default() };
        let key = FlowKey::v4(L4Proto::Udp, [10, 99, 0, 1], 9001, [10, 99, 0, 2], 7001);
        let rules = [RuleView {
            id: 42,
            flow: "udp 10.99.0.1:9001 10.99.0.2:7001".into(),
            key,
            queue: Some(2),
            installed_ns: 3_500_000_000,
            hits: 1,
            bytes: 64,
            last_active_ns: 0,
        }];
        let v = flow_view(&link, &guest, &rules, 1_000_000_000);
        let stuck: Vec<u32> = v.iter().filter(|f| f.stuck_without_filter).map(|f| f.flow).collect();
        assert_eq!(stuck, vec![0]);
        assert_eq!((v[1].filter, v[1].filter_queue, v[1].filter_since_s), (Some(42), Some(2), Some(2.5)));
        assert_eq!((v[0].irq_cpu, v[0].same_llc), (Some(0), Some(false)));
        assert_eq!(v[4].same_llc, Some(true));
        assert_eq!(v[2].via_rss_only_ms, Some(STUCK_AFTER_MS - 1));
    }

    #[test]
    fn cpu_pct_edge_cases() {
        assert_eq!(cpu_busy_pct(&json!([1, 2, 3, 4]), &json!([1, 2, 3, 4])), None);
        assert_eq!(cpu_busy_pct(&json!([0, 0, 0, 0]), &json!([50, 0, 0, 50])), Some(50.0));
        assert_eq!(cpu_busy_pct(&json!([5, 0, 0, 0]), &json!([0, 0, 0, 0])), None);
        assert_eq!(cpu_busy_pct(&json!([0, 0, 0]), &json!([1, 1, 1])), None);
    }

    #[test]
    fn guest_cpu_from_proc_stat() {
        let g = json!({ "proc_stat_before": { "cpu": [10, 0, 10, 80, 0] }, "proc_stat_after": { "cpu": [30, 0, 30, 140, 0] } });
        assert_eq!(guest_cpu_pct(&g), Some(40.0));
        assert_eq!(guest_cpu_pct(&json!({})), None);
    }
}
