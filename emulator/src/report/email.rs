//! A report to paste into a patch email (`arfsnic results --email`, also `arfsnic report
//! --email`): plain ASCII, at most 80 columns, in the shape kernel developers post their
//! numbers (the seeds' tables: one row per setting, Latency, CPU, Add, Del, Steer-C with
//! K/M units), under a header with the kernel, the topology, the profile, the arfsnic
//! version and the health verdicts. One block per report file.

use super::schema::{Report, RunReport, Verdict};
use std::fmt::Write as _;

/// Widest a row may be (the netdev list's line length).
pub const MAX_COLUMNS: usize = 80;
/// Widest setting label kept as is; longer ones are cut and listed in full below.
const LABEL_WIDTH: usize = 12;

/// `1234` → `1.2K`, `1234567` → `1.2M`, below 1000 as is (the seeds' units).
pub fn units(n: u64) -> String {
    match n {
        0..=999 => n.to_string(),
        1_000..=999_999 => format!("{:.1}K", n as f64 / 1e3),
        _ => format!("{:.1}M", n as f64 / 1e6),
    }
}

fn opt_f1(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.1}"))
}

fn verdict(r: &RunReport) -> &'static str {
    r.health.as_ref().map_or("-", |h| h.verdict.as_str())
}

fn ascii(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '?' }).collect()
}

/// `text` as lines of at most [`MAX_COLUMNS`], broken at spaces, continuation lines
/// indented by 4 (a word longer than a line stays whole).
fn wrapped(out: &mut String, text: &str) {
    let mut line = String::new();
    for w in text.split(' ') {
        if !line.trim().is_empty() && line.len() + 1 + w.len() > MAX_COLUMNS {
            let _ = writeln!(out, "{}", line.trim_end());
            line = "   ".into();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(w);
    }
    let _ = writeln!(out, "{}", line.trim_end());
}

/// The block for one report.
pub fn email(report: &Report, version: &str) -> String {
    let mut out = String::new();
    wrapped(
        &mut out,
        &format!("arfsnic {version}: scenario {}, kernel {}", ascii(&report.scenario), ascii(&report.kernel)),
    );
    wrapped(
        &mut out,
        &format!(
            "  {} vCPUs ({}), {} queues, accel {}",
            report.vcpus,
            ascii(&report.topology),
            report.queues,
            report.qemu_accel.as_deref().map_or_else(|| ascii(&report.accel), ascii)
        ),
    );
    let mut profiles: Vec<&str> = report.runs.iter().map(|r| r.profile.as_str()).collect();
    profiles.dedup();
    let first = report.runs.first();
    wrapped(
        &mut out,
        &format!(
            "  profile {}; {} flows, {} s per run",
            ascii(&profiles.join(", ")),
            first.map_or(0, |r| r.link.flows),
            first.and_then(|r| r.duration_s).map_or_else(|| "-".into(), |d| format!("{d:.0}"))
        ),
    );
    let bad: Vec<String> = report
        .runs
        .iter()
        .filter_map(|r| {
            let h = r.health.as_ref()?;
            (h.verdict != Verdict::Ok).then(|| format!("{} {}", ascii(&r.label), h.verdict.as_str()))
        })
        .collect();
    let health = match (bad.is_empty(), report.runs.iter().all(|r| r.health.is_some())) {
        (true, true) => "every run ok".to_string(),
        (true, false) => "not assessed".to_string(),
        (false, _) => bad.join(", "),
    };
    wrapped(&mut out, &format!("  health: {health}"));
    if !report.complete {
        let _ = writeln!(out, "  INCOMPLETE: stopped by {}", report.interrupted.as_deref().unwrap_or("a signal"));
    }
    out.push('\n');

    let row = |label: &str, cols: [&str; 7]| {
        let line = format!(
            "{label:<LABEL_WIDTH$} | {:>7} | {:>4} | {:>6} | {:>6} | {:>7} | {:>9} | {:<8}",
            cols[0], cols[1], cols[2], cols[3], cols[4], cols[5], cols[6]
        );
        format!("{}\n", line.trim_end())
    };
    let header = row("Setting", ["Latency", "CPU", "Add", "Del", "Steer-C", "Steer-C/s", "Health"]);
    let rule: String = header.trim_end().chars().map(|c| if c == '|' { '+' } else { '-' }).collect();
    out.push_str(&rule);
    out.push('\n');
    out.push_str(&header);
    out.push_str(&rule);
    out.push('\n');
    let mut cut = Vec::new();
    for r in &report.runs {
        let mut label = ascii(&r.label);
        if label.len() > LABEL_WIDTH {
            cut.push(format!("[{}] {label}", cut.len() + 1));
            label = format!("{}~{}", &label[..LABEL_WIDTH - 4], cut.len());
        }
        let d = r.driver();
        let cols = [
            format!("{:.1}", r.link.rtt_us_p50),
            // 4 columns: 100 % without the decimal.
            r.guest_cpu_pct
                .map_or_else(|| "-".into(), |c| if c < 99.95 { format!("{c:.1}") } else { format!("{c:.0}") }),
            d.map_or_else(|| "-".into(), |d| units(d.adds_ok)),
            d.map_or_else(|| "-".into(), |d| units(d.dels_ok)),
            d.map_or_else(|| "-".into(), |d| units(d.steer_calls)),
            opt_f1(d.and_then(|d| d.steer_calls_per_s)),
            verdict(r).to_string(),
        ];
        out.push_str(&row(&label, cols.each_ref().map(String::as_str)));
    }
    out.push_str(&rule);
    out.push('\n');
    for c in cut {
        let _ = writeln!(out, "{c}");
    }
    out.push_str(
        "Latency: request/response RTT p50, us (link partner). CPU: guest CPU busy %.\n\
         Add/Del: filters the driver installed/removed. Steer-C: ndo_rx_flow_steer\n\
         calls over the run; Steer-C/s over the traffic after the warm-up.\n\
         Units: K = 1,000, M = 1,000,000. Health: the run-validity verdict.\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::schema::{DriverReport, GuestReport, Health};

    fn run(label: &str, steer: u64, verdict: Verdict) -> RunReport {
        let mut r = RunReport { label: label.into(), profile: "mlx5-cx6".into(), ..Default::default() };
        r.link.rtt_us_p50 = 247.0;
        r.link.flows = 64;
        r.duration_s = Some(20.0);
        r.guest_cpu_pct = Some(1.4);
        r.guest = GuestReport {
            module: true,
            driver: Some(DriverReport {
                steer_calls: steer,
                steer_calls_per_s: Some(steer as f64 / 20.0),
                adds_ok: 2378,
                dels_ok: 2_061_000,
                ..Default::default()
            }),
            ..Default::default()
        };
        r.health = Some(Health { verdict, ..Default::default() });
        r
    }

    #[test]
    fn the_email_block_fits_80_columns_and_has_the_seed_columns() {
        let report = Report {
            scenario: "llc-within".into(),
            kernel: "patched-7.3".into(),
            accel: "tcg".into(),
            queues: 4,
            vcpus: 4,
            topology: "sockets=1 dies=1 cores=2 threads=2 cpu=Skylake-Server l3_per=core".into(),
            qemu_accel: Some("tcg,thread=single".into()),
            complete: true,
            runs: vec![
                run("sysctl=0", 6403, Verdict::Ok),
                run("a-label-far-longer-than-twelve", 12_345_678, Verdict::Invalid),
            ],
            ..Default::default()
        };
        let text = email(&report, "0.1.0");
        println!("{text}");
        for l in text.lines() {
            assert!(l.len() <= MAX_COLUMNS && l.is_ascii(), "{} columns: {l}", l.len());
        }
        assert!(text.contains("kernel patched-7.3"));
        assert!(text.contains("profile mlx5-cx6; 64 flows, 20 s per run"));
        assert!(text.contains("health: a-label-far-longer-than-twelve invalid"));
        assert!(text.contains("Setting      | Latency |  CPU |    Add |    Del | Steer-C | Steer-C/s | Health\n"));
        assert!(text.contains("sysctl=0     |   247.0 |  1.4 |   2.4K |   2.1M |    6.4K |     320.1 | ok\n"));
        assert!(text.contains("\na-label-~1   |") && text.contains("[1] a-label-far-longer-than-twelve"), "{text}");
        assert!(text.contains("12.3M"));
    }

    #[test]
    fn units_follow_the_seeds() {
        assert_eq!(
            (units(999), units(1000), units(1_649_999), units(121_700_000)),
            ("999".into(), "1.0K".into(), "1.6M".into(), "121.7M".into())
        );
    }
}
