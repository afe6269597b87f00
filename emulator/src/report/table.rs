//! The summary printed after `arfsnic run`: one line per run with traffic, RTT, where
//! packets went and steering when the guest module ran (the JSON is the record).

use super::schema::{Report, RunReport};
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
        "{:<14} {:>8} {:>8} {:>6} {:>9} {:>9} {:>10} {:>10} {:>10} {:>8} {:>7} {:>9} {:>8} {:>11} {:>9}  rx per queue",
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
        "stuck",
        "RPS IPI/s",
        "remote %",
        "cross-LLC %",
        "health"
    );
    for r in &report.runs {
        let (l, d) = (&r.link, &r.device);
        let q: Vec<String> = d.rx_packets_per_queue.iter().map(u64::to_string).collect();
        let _ = writeln!(
            s,
            "{:<14} {:>8} {:>8} {:>6} {:>9} {:>9} {:>10} {:>10} {:>10} {:>8} {:>7} {:>9} {:>8} {:>11} {:>9}  {}",
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
            opt(r.rps_ipi_per_s.map(f1)),
            opt(r.remote_pct.map(f1)),
            opt(r.cross_llc_pct.map(f1)),
            r.health.as_ref().map_or("-", |h| h.verdict.as_str()),
            q.join(" "),
        );
    }
    for r in &report.runs {
        for d in &r.discarded {
            let (label, verdict, reasons) = (&r.label, d.verdict.as_str(), d.reasons.join("; "));
            let _ = writeln!(s, "  {label}: an earlier attempt was {verdict} and ran again: {reasons}");
        }
        if let Some(l) = r.offered_load.as_ref().filter(|l| l.chosen_pps != l.requested_pps) {
            let _ = writeln!(s, "  {}: offered load: {}", r.label, l.reason);
        }
        if let Some(h) = r.health.as_ref().filter(|h| !h.reasons.is_empty()) {
            let _ = writeln!(s, "  {}: {}: {}", r.label, h.verdict.as_str(), h.reasons.join("; "));
        }
        for line in backend_cost_lines(r) {
            let _ = writeln!(s, "  {}: {line}", r.label);
        }
    }
    s.push_str(&funccount_lines(report));
    s
}

/// What the backend cost the host over the run's measured window against what the guest's
/// vCPUs did (docs/measuring.md, "E2E cost per packet"): its CPU as a share of one core, per
/// frame moved, and by thread. Nothing for reports made before these were recorded.
pub fn backend_cost_lines(r: &RunReport) -> Vec<String> {
    let Some(h) = r.host.as_ref() else { return Vec::new() };
    let Some(pct) = h.backend_cpu_pct else { return Vec::new() };
    let per_frame = h.backend_ns_per_frame.map_or("-".to_string(), |n| format!("{n:.0}"));
    let frames = h.backend_frames.unwrap_or(0);
    let vcpus = h.vcpu_cpu_pct.map_or("-".to_string(), |v| format!("{v:.1}"));
    let mut lines = vec![format!(
        "backend: {pct:.1} % of a core, {per_frame} ns/frame ({frames} frames in {:.1} s; guest vCPUs {vcpus} % of a core)",
        h.window_s
    )];
    if !h.backend_threads.is_empty() {
        let t: Vec<String> = h
            .backend_threads
            .iter()
            .map(|g| {
                let n = if g.threads > 1 { format!(" x{}", g.threads) } else { String::new() };
                format!("{}{n} {}", g.name, g.cpu_pct.map_or("-".to_string(), |p| format!("{p:.1} %")))
            })
            .collect();
        lines.push(format!("backend threads: {}", t.join(", ")));
    }
    lines
}

/// One line per run that ran bcc's funccount beside it (`guest.funccount`): its exact
/// total against the module's steer_calls, and what `-i 1` counted.
pub fn funccount_lines(report: &Report) -> String {
    let mut s = String::new();
    for r in &report.runs {
        if let Some(f) = r.guest.system.funccount.as_ref() {
            let module = f.module_calls().map_or("-".to_string(), |m| m.to_string());
            let exact = f.total_exact.map_or("-".to_string(), |m| m.to_string());
            let diff = f.disagreement_pct().map_or("-".to_string(), |d| format!("{d:.2} %"));
            let loss = f.interval_loss_pct().map_or("-".to_string(), |d| format!("{d:.2} %"));
            let peak = f.per_interval.iter().max().copied().unwrap_or(0);
            let _ = writeln!(
                s,
                "  {}: funccount {}: {exact} calls, module steer_calls {module} (difference {diff}); \
                 -i 1: {} in {} intervals, peak {peak}/s (lost between read and clear: {loss})",
                r.label,
                f.function,
                f.total,
                f.per_interval.len(),
            );
            if let (Some(fc), Some(sn)) = (f.rps_trigger_softirq_exact, f.softnet_rps()) {
                let diff = f.rps_disagreement_pct().map_or("-".to_string(), |d| format!("{d:.2} %"));
                let _ = writeln!(
                    s,
                    "  {}: funccount rps_trigger_softirq: {fc} RPS IPIs, softnet_stat received_rps {sn} (difference {diff})",
                    r.label
                );
            }
        }
    }
    s
}

/// [`funccount_lines`] with the scenario's name in front of each, for tables that hold
/// several scenarios (`demo`, `results`).
pub fn scenario_funccount_lines(report: &Report) -> Vec<String> {
    funccount_lines(report).lines().map(|l| format!("{} {}", report.scenario, l.trim_start())).collect()
}

/// The runs whose verdict is not `ok`, one line each with the reasons (`None` when all
/// are ok or the report has no verdicts).
pub fn unhealthy(report: &Report) -> Option<String> {
    let lines: Vec<String> = report
        .runs
        .iter()
        .filter_map(|r| {
            let h = r.health.as_ref().filter(|h| h.verdict != super::schema::Verdict::Ok)?;
            Some(format!(
                "scenario {}, run {}: {} ({})",
                report.scenario,
                r.label,
                h.verdict.as_str(),
                h.reasons.join("; ")
            ))
        })
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::schema::{Discarded, Health, OfferedLoad, RunReport, Verdict};

    fn run(label: &str, verdict: Option<Verdict>, reasons: &[&str]) -> RunReport {
        RunReport {
            label: label.into(),
            health: verdict.map(|v| Health {
                verdict: v,
                reasons: reasons.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_summary_flags_unhealthy_runs_with_their_reasons() {
        let mut bad = run("sysctl=0", Some(Verdict::Invalid), &["replies lost 99.4% > 5%"]);
        bad.discarded = vec![Discarded {
            verdict: Verdict::Invalid,
            reasons: vec!["arfs_lock wait 5843 ms/s > 250 ms/s".into()],
            ..Default::default()
        }];
        bad.offered_load = Some(OfferedLoad {
            requested_pps: 2000,
            chosen_pps: 600,
            reason: "probed: answered only 1200".into(),
            ..Default::default()
        });
        let r = Report {
            scenario: "six".into(),
            runs: vec![bad, run("sysctl=1", Some(Verdict::Ok), &[]), run("old", None, &[])],
            ..Default::default()
        };
        let t = summary_table(&r);
        let row = |l: &str| t.lines().find(|x| x.starts_with(l)).unwrap_or_else(|| panic!("{t}")).to_string();
        assert!(row("sysctl=0 ").contains(" invalid "), "{t}");
        assert!(row("sysctl=1 ").contains(" ok "), "{t}");
        assert!(t.contains("  sysctl=0: invalid: replies lost 99.4% > 5%"), "{t}");
        assert!(t.contains("  sysctl=0: an earlier attempt was invalid and ran again: arfs_lock wait"), "{t}");
        assert!(t.contains("  sysctl=0: offered load: probed: answered only 1200"), "{t}");
        assert_eq!(unhealthy(&r).unwrap(), "scenario six, run sysctl=0: invalid (replies lost 99.4% > 5%)");
        let fine = Report { runs: vec![run("a", Some(Verdict::Ok), &[]), run("b", None, &[])], ..Default::default() };
        assert_eq!(unhealthy(&fine), None);
        let degraded = Report { runs: vec![run("a", Some(Verdict::Degraded), &["guest CPU 95% busy > 90%"])], ..fine };
        assert!(unhealthy(&degraded).unwrap().contains("run a: degraded (guest CPU 95% busy > 90%)"));
    }

    #[test]
    fn the_trade_off_columns_show_their_values_or_a_dash() {
        let mut with = run("sysctl=1", Some(Verdict::Ok), &[]);
        (with.rps_ipi_per_s, with.remote_pct, with.cross_llc_pct) = (Some(823.14), Some(41.25), Some(0.0));
        let r = Report { runs: vec![with, run("old", None, &[])], ..Default::default() };
        let t = summary_table(&r);
        let cols = |l: &str| -> Vec<String> {
            let line = t.lines().find(|x| x.starts_with(l)).unwrap_or_else(|| panic!("{t}"));
            line.split_whitespace().map(str::to_string).collect()
        };
        let header = t.lines().nth(1).unwrap();
        assert!(header.contains(" stuck RPS IPI/s remote % cross-LLC %    health  rx per queue"), "{t}");
        // run requests replies lost p50 p99 steer adds filt misdeliv stuck | the three | health
        assert_eq!(cols("sysctl=1 ")[11..15], ["823.1", "41.2", "0.0", "ok"], "{t}");
        assert_eq!(cols("old ")[11..15], ["-", "-", "-", "-"], "{t}");
        // every line as wide as the header up to the queue list
        let at = header.find("  rx per queue").unwrap();
        assert!(t.lines().skip(2).take(2).all(|l| l.len() >= at && l[..at].ends_with(['k', '-'])), "{t}");
    }

    #[test]
    fn the_backend_cost_shows_under_its_run() {
        use crate::report::schema::{HostReport, ThreadGroup};
        let mut with = run("sysctl=1", Some(Verdict::Ok), &[]);
        with.host = Some(HostReport {
            window_s: 8.0,
            vcpu_cpu_pct: Some(181.04),
            backend_cpu_ms: Some(248.0),
            backend_cpu_pct: Some(3.1),
            backend_frames: Some(604_878),
            backend_ns_per_frame: Some(410.0),
            backend_threads: vec![
                ThreadGroup { name: "vhost-w".into(), threads: 4, cpu_ms: 160.0, cpu_pct: Some(2.0) },
                ThreadGroup { name: "link-partner".into(), threads: 1, cpu_ms: 88.0, cpu_pct: Some(1.1) },
            ],
            ..Default::default()
        });
        // a report made before the backend was sampled prints nothing
        let old = run("old", None, &[]);
        let mut older = run("older", None, &[]);
        older.host = Some(HostReport { vcpu_wait_pct: Some(3.0), ..Default::default() });
        let t = summary_table(&Report { runs: vec![with, old, older], ..Default::default() });
        assert!(
            t.contains(
                "  sysctl=1: backend: 3.1 % of a core, 410 ns/frame (604878 frames in 8.0 s; guest vCPUs 181.0 % of a core)\n\
                 \x20 sysctl=1: backend threads: vhost-w x4 2.0 %, link-partner 1.1 %\n"
            ),
            "{t}"
        );
        assert!(!t.contains("old: backend") && !t.contains("older: backend"), "{t}");
    }
}
