//! Reports: the human-readable table printed after a run (the JSON is the record).

use crate::control::RuleView;
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
    pub stuck_without_filter: bool,
}

fn first_cpu(list: &str) -> Option<u32> {
    list.split([',', '-']).next()?.trim().parse().ok()
}

/// Per-flow view and the stuck-flow verdict. A flow is *stuck without filter* when it
/// was answered during the run, no filter for it is live in the device at the end, and
/// the CPU serving it is in another LLC than the IRQ CPU of the queue its packets hit.
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
            let tuple = format!("udp {}:{} {}:{}", crate::runner::PARTNER_IP, f.partner_port, crate::runner::GUEST_IP, f.guest_port);
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
                stuck_without_filter: f.responses > 0 && rule.is_none() && same_llc == Some(false),
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
        "run", "requests", "replies", "lost", "rtt p50us", "rtt p99us", "Steer-C/s", "adds", "filt.deliv", "misdeliv", "stuck"
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
