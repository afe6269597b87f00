//! Reports: the human-readable table printed after a run (the JSON is the record).

use crate::device::snapshot::RuleView;
use crate::traffic::partner::LinkStats;
use serde::Serialize;
use serde_json::Value;
use std::fmt::Write;

/// One flow at the end of a run, as device and guest saw it (docs/measuring.md).
#[derive(Clone, Debug, Serialize)]
pub struct FlowView {
    pub flow: u32,
    /// `udp PARTNER:PORT GUEST:PORT`, the packets the guest receives.
    pub tuple: String,
    pub responses: u64,
    /// RX queue of the flow's last packet (device side).
    pub queue: Option<u16>,
    /// A filter exists for the flow in the device table at the end of the run.
    pub filter: Option<u32>,
    pub filter_queue: Option<u16>,
    /// Seconds from the start of the traffic until the filter was installed (negative:
    /// before the traffic started).
    pub filter_since_s: Option<f64>,
    /// Guest CPU that served the flow's last request (from the echo replies).
    pub app_cpu: Option<u32>,
    /// The CPU the IRQ of `queue` is delivered to (guest's effective affinity).
    pub irq_cpu: Option<u32>,
    /// app_cpu and irq_cpu share a last-level cache (guest's LLC groups).
    pub same_llc: Option<bool>,
    /// How long before the end of sending the flow's requests had all gone through RSS
    /// (no filter hit), in ms; `None` when its last request hit a filter.
    pub via_rss_only_ms: Option<u64>,
    pub stuck_without_filter: bool,
}

/// A flow without a filter counts as stuck only after its requests have gone through RSS
/// for this long. A flow whose filter the driver just expired is re-steered at its next
/// move, after the driver's queued commands (up to 1.24 s measured on a loaded 2-core
/// host); one the driver believes steered stays without a filter for the rest of the
/// run (docs/measuring.md).
pub const STUCK_AFTER_MS: u64 = 2000;

fn first_cpu(list: &str) -> Option<u32> {
    list.split([',', '-']).next()?.trim().parse().ok()
}

/// Per-flow view and the stuck-flow verdict. A flow is *stuck without filter* when it
/// was answered during the run, no filter for it is live in the device at the end, its
/// requests have gone through RSS for at least [`STUCK_AFTER_MS`], and the CPU serving
/// it is in another LLC than the IRQ CPU of the queue its packets hit.
pub fn flow_view(link: &LinkStats, guest: &Value, rules: &[RuleView], traffic_start_ns: u64) -> Vec<FlowView> {
    let llc: Vec<Vec<u64>> = guest["workload"]["llc_groups"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|g| g.as_array().into_iter().flatten().filter_map(Value::as_u64).collect())
        .collect();
    let group_of = |cpu: u32| llc.iter().position(|g| g.contains(&u64::from(cpu)));
    let irq_cpu: Vec<Option<u32>> = guest["irqs_input"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|q| q["effective_affinity_list"].as_str().and_then(first_cpu))
        .collect();
    let by_tuple: std::collections::HashMap<&str, &RuleView> = rules.iter().map(|r| (r.flow.as_str(), r)).collect();
    link.per_flow
        .iter()
        .map(|f| {
            let tuple = format!(
                "udp {}:{} {}:{}",
                crate::runner::PARTNER_IP,
                f.partner_port,
                crate::runner::GUEST_IP,
                f.guest_port
            );
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
                stuck_without_filter: f.responses > 0
                    && rule.is_none()
                    && f.via_rss_only_ms.is_some_and(|ms| ms >= STUCK_AFTER_MS)
                    && same_llc == Some(false),
                tuple,
            }
        })
        .collect()
}

fn num(v: &Value) -> String {
    match v {
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|_| !n.is_u64() && !n.is_i64()) {
                format!("{f:.1}")
            } else {
                n.to_string()
            }
        }
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// One line per run: traffic, RTT, where packets went, steering when the guest module ran.
pub fn summary_table(report: &Value) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "scenario {} on {} ({}, {} queues, {} vCPUs: {})",
        report["scenario"].as_str().unwrap_or("?"),
        report["kernel"].as_str().unwrap_or("?"),
        report["accel"].as_str().unwrap_or("?"),
        num(&report["queues"]),
        num(&report["vcpus"]),
        report["topology"].as_str().unwrap_or("?"),
    );
    let _ = writeln!(
        s,
        "{:<14} {:>8} {:>8} {:>6} {:>9} {:>9} {:>10} {:>10} {:>10} {:>8} {:>7}  rx per queue",
        "run",
        "requests",
        "replies",
        "lost",
        "rtt p50us",
        "rtt p99us",
        "Steer-C/s",
        "adds",
        "filt.deliv",
        "misdeliv",
        "stuck"
    );
    for r in report["runs"].as_array().into_iter().flatten() {
        let l = &r["link"];
        let d = &r["device"];
        let q: Vec<String> = d["rx_packets_per_queue"].as_array().into_iter().flatten().map(num).collect();
        let _ = writeln!(
            s,
            "{:<14} {:>8} {:>8} {:>6} {:>9} {:>9} {:>10} {:>10} {:>10} {:>8} {:>7}  {}",
            r["label"].as_str().unwrap_or("?"),
            num(&l["requests"]),
            num(&l["responses"]),
            num(&l["lost"]),
            num(&l["rtt_us_p50"]),
            num(&l["rtt_us_p99"]),
            num(&r["guest"]["steer_calls_per_s"]),
            num(&d["filter"]["adds"]),
            num(&d["filter_delivered"]),
            num(&d["flows_misdelivered"]),
            num(&r["flows_stuck_without_filter"]),
            q.join(" "),
        );
    }
    s
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
}
