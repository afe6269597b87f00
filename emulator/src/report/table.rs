//! The summary printed after `arfsnic run`: one line per run with traffic, RTT, where
//! packets went and steering when the guest module ran (the JSON is the record).

use super::schema::Report;
use std::fmt::Write;

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |x| x.to_string())
}

fn f1(v: f64) -> String {
    format!("{v:.1}")
}

/// One line per run: traffic, RTT, where packets went, steering when the guest module ran.
pub fn summary_table(report: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "scenario {} on {} ({}, {} queues, {} vCPUs: {})",
        report.scenario, report.kernel, report.accel, report.queues, report.vcpus, report.topology,
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
    for r in &report.runs {
        let (l, d) = (&r.link, &r.device);
        let q: Vec<String> = d.rx_packets_per_queue.iter().map(u64::to_string).collect();
        let _ = writeln!(
            s,
            "{:<14} {:>8} {:>8} {:>6} {:>9} {:>9} {:>10} {:>10} {:>10} {:>8} {:>7}  {}",
            r.label,
            l.requests,
            l.responses,
            l.lost,
            f1(l.rtt_us_p50),
            f1(l.rtt_us_p99),
            opt(r.driver().and_then(|g| g.steer_calls_per_s).map(f1)),
            d.filter.summary.adds,
            d.filter_delivered,
            d.flows_misdelivered,
            opt(r.flows_stuck_without_filter),
            q.join(" "),
        );
    }
    s
}
