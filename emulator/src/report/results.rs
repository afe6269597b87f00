//! Results: the seed-style steer-rate table (plus CSV and an SVG bar chart) built from
//! one or more scenario reports (the JSON that `arfsnic run` writes).
//!
//! Each run of a report becomes one [`Row`]: the guest's aRFS steering rates
//! (`ndo_rx_flow_steer` calls/s and the adds/mods/dels they caused), lock contention,
//! RTT, guest CPU and stuck flows, tagged with the value of
//! `net.core.arfs_llc_affinity` the run used. What a run does not have (no guest module:
//! no steering rates) is `None`, shown as `-`.

use super::schema::{Report, RunReport};
use anyhow::Context;
use serde::Serialize;
use serde_json::json;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// The sysctl the compared runs differ in.
pub const SYSCTL: &str = "net.core.arfs_llc_affinity";

/// One run of one scenario.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    pub scenario: String,
    /// The run's label (`runs[].label`).
    pub label: String,
    /// `sysctls["net.core.arfs_llc_affinity"]` of the run, or `-`.
    pub sysctl: String,
    /// `ndo_rx_flow_steer` calls per second (guest, traffic window).
    pub steer_c_per_s: Option<f64>,
    pub add_per_s: Option<f64>,
    pub mod_per_s: Option<f64>,
    pub del_per_s: Option<f64>,
    /// Sum of the guest's add errors (all error codes).
    pub add_errors: Option<u64>,
    pub lock_contended_pct: Option<f64>,
    /// Microseconds spent waiting for the filter lock per second.
    pub lock_wait_us_per_s: Option<f64>,
    pub rtt_p50_us: Option<f64>,
    pub rtt_p99_us: Option<f64>,
    /// Busy share of all guest CPUs over the run (from /proc/stat).
    pub guest_cpu_pct: Option<f64>,
    pub stuck_flows: Option<u64>,
    /// `steer_same` calls (the rule already pointed at the requested queue) as a share of
    /// all steer calls; Steer-C/s counts them, as funccount would.
    pub steer_same_pct: Option<f64>,
    /// RPS IPIs the guest received per second of the workload (docs/measuring.md,
    /// "Trade-off columns").
    pub rps_ipi_per_s: Option<f64>,
    /// Requests handed to another CPU's backlog (softirq CPU != IRQ CPU of their queue), %.
    pub remote_pct: Option<f64>,
    /// Requests whose queue's IRQ CPU is in another LLC than the serving CPU, %.
    pub cross_llc_pct: Option<f64>,
    /// The run's health verdict (`ok`, `degraded`, `invalid`), `-` for reports without one.
    pub health: String,
}

/// The files [`write_outputs`] wrote.
#[derive(Clone, Debug)]
pub struct Outputs {
    pub json: PathBuf,
    pub csv: PathBuf,
    pub svg: PathBuf,
}

fn row_of(scenario: &str, r: &RunReport) -> Row {
    let g = r.driver();
    Row {
        scenario: scenario.to_string(),
        label: r.label.clone(),
        sysctl: r.sysctls.get(SYSCTL).map(|s| s.trim()).filter(|s| !s.is_empty()).unwrap_or("-").to_string(),
        steer_c_per_s: g.and_then(|g| g.steer_calls_per_s),
        add_per_s: g.and_then(|g| g.adds_per_s),
        mod_per_s: g.and_then(|g| g.mods_per_s),
        del_per_s: g.and_then(|g| g.dels_per_s),
        add_errors: g.map(|g| g.add_errors.values().sum()),
        lock_contended_pct: g.map(|g| g.lock_contended_pct_window.unwrap_or(g.lock_contended_pct)),
        lock_wait_us_per_s: g.and_then(|g| g.lock_wait_us_per_s),
        rtt_p50_us: Some(r.link.rtt_us_p50),
        rtt_p99_us: Some(r.link.rtt_us_p99),
        guest_cpu_pct: r.guest_cpu_pct,
        stuck_flows: r.flows_stuck_without_filter,
        steer_same_pct: r.health.as_ref().and_then(|h| h.steer_same_pct),
        rps_ipi_per_s: r.rps_ipi_per_s,
        remote_pct: r.remote_pct,
        cross_llc_pct: r.cross_llc_pct,
        health: r.health.as_ref().map_or("-", |h| h.verdict.as_str()).to_string(),
    }
}

/// One row per run of a scenario report.
pub fn rows(report: &Report) -> Vec<Row> {
    report.runs.iter().map(|r| row_of(&report.scenario, r)).collect()
}

fn opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.decimals$}"))
}

fn opt_u(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |x| x.to_string())
}

/// Scenarios in order of first appearance, each with its rows.
pub(crate) fn by_scenario(rows: &[Row]) -> Vec<(&str, Vec<&Row>)> {
    let mut groups: Vec<(&str, Vec<&Row>)> = Vec::new();
    for r in rows {
        match groups.iter_mut().find(|(s, _)| *s == r.scenario) {
            Some((_, g)) => g.push(r),
            None => groups.push((&r.scenario, vec![r])),
        }
    }
    groups
}

/// Steer-C/s of a scenario's runs at one sysctl value that are not `invalid`, sorted,
/// and how many invalid runs were left out.
fn valid_steer(rows: &[&Row], sysctl: &str) -> (Vec<f64>, usize) {
    let at: Vec<&&Row> = rows.iter().filter(|r| r.sysctl == sysctl).collect();
    let mut v: Vec<f64> = at.iter().filter(|r| r.health != "invalid").filter_map(|r| r.steer_c_per_s).collect();
    v.sort_by(f64::total_cmp);
    (v, at.iter().filter(|r| r.health == "invalid").count())
}

fn median(v: &[f64]) -> Option<f64> {
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[n / 2]),
        n => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// The line under a scenario that has runs with the sysctl at 0 and at 1 (`None` when
/// it has not). Several runs with the same value give their median and spread; `invalid`
/// runs are left out (and said so).
pub(crate) fn ratio_line(scenario: &str, rows: &[&Row]) -> Option<String> {
    let has = |v: &str| rows.iter().any(|r| r.sysctl == v);
    if !has("0") || !has("1") {
        return None;
    }
    let ((v0, bad0), (v1, bad1)) = (valid_steer(rows, "0"), valid_steer(rows, "1"));
    let spread = |v: &[f64]| match v {
        [lo, .., hi] => format!(" [{lo:.1}-{hi:.1}, n={}]", v.len()),
        _ => String::new(),
    };
    let left_out = match bad0 + bad1 {
        0 => String::new(),
        n => format!("; {n} invalid run(s) left out"),
    };
    Some(match (median(&v0), median(&v1)) {
        (Some(s0), Some(s1)) if s0 > 0.0 => {
            let pct = 100.0 * s1 / s0;
            let pct = if pct > 0.0 && pct < 0.1 { format!("{pct:.2}") } else { format!("{pct:.1}") };
            let what = if v0.len() > 1 || v1.len() > 1 { "median " } else { "" };
            format!(
                "{scenario}: Steer-C/s at sysctl=1 is {pct}% of sysctl=0 ({what}{s1:.1}{} vs {s0:.1}{} calls/s{left_out})",
                spread(&v1),
                spread(&v0)
            )
        }
        (Some(s0), Some(s1)) => {
            format!("{scenario}: Steer-C/s at sysctl=1 vs sysctl=0: n/a ({s1:.1} vs {s0:.1} calls/s{left_out})")
        }
        _ if bad0 + bad1 > 0 => {
            format!("{scenario}: Steer-C/s at sysctl=1 vs sysctl=0: no result (no valid run on one side{left_out})")
        }
        _ => format!("{scenario}: Steer-C/s at sysctl=1 vs sysctl=0: n/a (rate missing)"),
    })
}

pub(crate) const HEADER: [&str; 18] = [
    "scenario",
    "sysctl",
    "Steer-C/s",
    "Add/s",
    "Mod/s",
    "Del/s",
    "add err",
    "lock cont %",
    "lock wait us/s",
    "RTT p50 us",
    "RTT p99 us",
    "guest CPU %",
    "stuck",
    "same %",
    "RPS IPI/s",
    "remote %",
    "cross-LLC %",
    "health",
];

/// A row's cells; an invalid run keeps its scenario, sysctl and verdict but shows no
/// numbers (they measured the host, not the kernel: docs/measuring.md, "Run health").
pub(crate) fn cells(r: &Row) -> Vec<String> {
    if r.health == "invalid" {
        let mut c = vec![r.scenario.clone(), r.sysctl.clone()];
        c.resize(HEADER.len() - 1, "-".to_string());
        c.push(r.health.clone());
        return c;
    }
    vec![
        r.scenario.clone(),
        r.sysctl.clone(),
        opt(r.steer_c_per_s, 1),
        opt(r.add_per_s, 1),
        opt(r.mod_per_s, 1),
        opt(r.del_per_s, 1),
        opt_u(r.add_errors),
        opt(r.lock_contended_pct, 2),
        opt(r.lock_wait_us_per_s, 1),
        opt(r.rtt_p50_us, 0),
        opt(r.rtt_p99_us, 0),
        opt(r.guest_cpu_pct, 1),
        opt_u(r.stuck_flows),
        opt(r.steer_same_pct, 1),
        opt(r.rps_ipi_per_s, 1),
        opt(r.remote_pct, 1),
        opt(r.cross_llc_pct, 1),
        r.health.clone(),
    ]
}

/// The aligned steer-rate table, rows grouped by scenario, with the sysctl=1/sysctl=0
/// Steer-C/s ratio under each scenario that has both.
pub fn table(rows: &[Row]) -> String {
    let groups = by_scenario(rows);
    let body: Vec<Vec<Vec<String>>> = groups.iter().map(|(_, g)| g.iter().map(|r| cells(r)).collect()).collect();
    let mut width: Vec<usize> = HEADER.iter().map(|h| h.chars().count()).collect();
    for line in body.iter().flatten() {
        for (w, c) in width.iter_mut().zip(line) {
            *w = (*w).max(c.chars().count());
        }
    }
    let fmt_line = |cols: &[String]| -> String {
        let mut s = String::new();
        for (i, (c, w)) in cols.iter().zip(&width).enumerate() {
            if i > 0 {
                s.push_str("  ");
            }
            // Text columns left-aligned, numbers right-aligned.
            if i < 2 {
                let _ = write!(s, "{c:<w$}");
            } else {
                let _ = write!(s, "{c:>w$}");
            }
        }
        s.trim_end().to_string()
    };
    let mut out = String::new();
    let header: Vec<String> = HEADER.iter().map(|h| h.to_string()).collect();
    let header = fmt_line(&header);
    let _ = writeln!(out, "{header}");
    let _ = writeln!(out, "{}", "-".repeat(header.chars().count()));
    for ((scenario, g), lines) in groups.iter().zip(&body) {
        for l in lines {
            let _ = writeln!(out, "{}", fmt_line(l));
        }
        if let Some(ratio) = ratio_line(scenario, g) {
            let _ = writeln!(out, "  {ratio}");
        }
    }
    out
}

/// The table as GitHub markdown (for README and docs/results.md, regenerated from result
/// files by `arfsnic results --markdown`): the same columns and numbers as [`table`],
/// with each scenario's ratio line below the table.
pub fn markdown(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "| {} |", HEADER.join(" | "));
    let _ = writeln!(
        out,
        "|{}",
        HEADER.iter().enumerate().map(|(i, _)| if i < 2 { "---|" } else { "---:|" }).collect::<String>()
    );
    let groups = by_scenario(rows);
    for (_, g) in &groups {
        for r in g {
            let _ = writeln!(out, "| {} |", cells(r).join(" | "));
        }
    }
    let ratios: Vec<String> = groups.iter().filter_map(|(s, g)| ratio_line(s, g)).collect();
    if !ratios.is_empty() {
        out.push('\n');
        for l in ratios {
            let _ = writeln!(out, "- {l}");
        }
    }
    out
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) || s.starts_with(' ') || s.ends_with(' ') {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The rows as CSV: a header line, then one line per row; plain numbers, empty where
/// a value is missing.
pub fn csv(rows: &[Row]) -> String {
    let f = |v: Option<f64>| v.map(|x| x.to_string()).unwrap_or_default();
    let u = |v: Option<u64>| v.map(|x| x.to_string()).unwrap_or_default();
    let mut out = String::from(
        "scenario,label,sysctl,steer_c_per_s,add_per_s,mod_per_s,del_per_s,add_errors,lock_contended_pct,\
         lock_wait_us_per_s,rtt_p50_us,rtt_p99_us,guest_cpu_pct,stuck_flows,steer_same_pct,health,\
         rps_ipi_per_s,remote_pct,cross_llc_pct\n",
    );
    for r in rows {
        let fields = [
            csv_field(&r.scenario),
            csv_field(&r.label),
            csv_field(&r.sysctl),
            f(r.steer_c_per_s),
            f(r.add_per_s),
            f(r.mod_per_s),
            f(r.del_per_s),
            u(r.add_errors),
            f(r.lock_contended_pct),
            f(r.lock_wait_us_per_s),
            f(r.rtt_p50_us),
            f(r.rtt_p99_us),
            f(r.guest_cpu_pct),
            u(r.stuck_flows),
            f(r.steer_same_pct),
            csv_field(&r.health),
            f(r.rps_ipi_per_s),
            f(r.remote_pct),
            f(r.cross_llc_pct),
        ];
        out.push_str(&fields.join(","));
        out.push('\n');
    }
    out
}

/// Width of one scenario's group on the chart's x axis.
/// Writes `results.json` (`{rows, reports}`), `results.csv` and `steer-rate.svg` into
/// `dir` (created if needed).
pub fn write_outputs(dir: &Path, reports: &[Report]) -> anyhow::Result<Outputs> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let all: Vec<Row> = reports.iter().flat_map(rows).collect();
    let out = Outputs { json: dir.join("results.json"), csv: dir.join("results.csv"), svg: dir.join("steer-rate.svg") };
    let doc = json!({ "rows": all, "reports": reports });
    let write = |p: &Path, data: &[u8]| std::fs::write(p, data).with_context(|| format!("writing {}", p.display()));
    write(&out.json, &serde_json::to_vec_pretty(&doc)?)?;
    write(&out.csv, csv(&all).as_bytes())?;
    let title = format!("aRFS steering rate by {SYSCTL}");
    write(&out.svg, super::chart::svg_chart(&all, &title)?.as_bytes())?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::chart::svg_chart;
    use super::*;
    use crate::report::schema::{DriverReport, GuestReport};
    use crate::traffic::partner::LinkStats;
    use serde_json::Value;

    #[allow(clippy::too_many_arguments)]
    fn run(label: &str, sysctl: &str, steer: f64, adds: f64, mods: f64, dels: f64, p50: f64, p99: f64) -> RunReport {
        RunReport {
            label: label.into(),
            sysctls: [(SYSCTL, sysctl), ("net.core.rps_sock_flow_entries", "32768")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            link: LinkStats { rtt_us_p50: p50, rtt_us_p99: p99, ..Default::default() },
            guest: GuestReport {
                module: true,
                driver: Some(DriverReport {
                    steer_calls_per_s: Some(steer),
                    adds_per_s: Some(adds),
                    mods_per_s: Some(mods),
                    dels_per_s: Some(dels),
                    rates_window_s: Some(10.0),
                    add_errors: [("ENOSPC".to_string(), 2), ("EBUSY".to_string(), 1)].into_iter().collect(),
                    lock_contended_pct: 3.5,
                    lock_wait_us_per_s: Some(200_000.0),
                    ..Default::default()
                }),
                ..Default::default()
            },
            guest_cpu_pct: Some(60.0),
            flows_stuck_without_filter: Some(0),
            filter_table: None,
            rps_ipi_per_s: Some(525.6),
            remote_pct: Some(32.3),
            cross_llc_pct: Some(64.8),
            ..Default::default()
        }
    }

    fn report(scenario: &str, runs: Vec<RunReport>) -> Report {
        Report {
            schema_version: crate::report::SCHEMA_VERSION,
            scenario: scenario.into(),
            runs,
            complete: true,
            ..Default::default()
        }
    }

    /// Two scenarios, runs with the sysctl at 0 and 1. The llc-across runs have the
    /// window's contention; llc-within's use the whole run's.
    fn reports() -> Vec<Report> {
        let mut across0 = run("sysctl=0", "0", 700.0, 4.0, 620.0, 0.0, 500.0, 80000.0);
        let mut across1 = run("sysctl=1", "1", 630.0, 5.0, 600.0, 0.1, 320.0, 190000.0);
        for (r, cpu) in [(&mut across0, 41.5), (&mut across1, 38.25)] {
            let d = r.guest.driver.as_mut().unwrap();
            d.lock_contended_pct_window = Some(2.25);
            d.lock_wait_us_per_s = Some(1234.5);
            r.guest_cpu_pct = Some(cpu);
        }
        across1.flows_stuck_without_filter = Some(3);
        vec![
            report(
                "llc-within",
                vec![
                    run("sysctl=0", "0", 800.0, 5.0, 626.4, 0.1, 485.0, 73215.0),
                    run("sysctl=1", "1", 4.0, 4.5, 0.0, 0.0, 312.0, 6787.0),
                ],
            ),
            report("llc-across", vec![across0, across1]),
        ]
    }

    /// Runs without what the table shows: no guest module, no rates, no sysctl.
    fn sparse() -> Vec<Report> {
        let mut no_rates = run("no-rates", "1", 0.0, 0.0, 0.0, 0.0, 1.0, 2.0);
        let d = no_rates.guest.driver.as_mut().unwrap();
        (d.steer_calls_per_s, d.adds_per_s, d.mods_per_s, d.dels_per_s, d.lock_wait_us_per_s) =
            (None, None, None, None, None);
        no_rates.guest_cpu_pct = None;
        let mut no_module = RunReport { label: "empty".into(), ..Default::default() };
        no_module.sysctls.insert(SYSCTL.into(), " ".into());
        vec![report("broken, \"quoted\"", vec![no_module, no_rates])]
    }

    fn all_rows(reports: &[Report]) -> Vec<Row> {
        reports.iter().flat_map(rows).collect()
    }

    #[test]
    fn rows_take_fields() {
        let rs = all_rows(&reports());
        assert_eq!(rs.len(), 4);
        let w0 = &rs[0];
        assert_eq!((w0.scenario.as_str(), w0.label.as_str(), w0.sysctl.as_str()), ("llc-within", "sysctl=0", "0"));
        assert_eq!(w0.steer_c_per_s, Some(800.0));
        assert_eq!(w0.add_per_s, Some(5.0));
        assert_eq!(w0.mod_per_s, Some(626.4));
        assert_eq!(w0.del_per_s, Some(0.1));
        assert_eq!(w0.add_errors, Some(3));
        // No window figure: the whole run's.
        assert_eq!(w0.lock_contended_pct, Some(3.5));
        assert_eq!(w0.lock_wait_us_per_s, Some(200_000.0));
        assert_eq!(w0.rtt_p50_us, Some(485.0));
        assert_eq!(w0.rtt_p99_us, Some(73215.0));
        assert_eq!(w0.guest_cpu_pct, Some(60.0));
        assert_eq!(w0.stuck_flows, Some(0));
        assert_eq!((w0.rps_ipi_per_s, w0.remote_pct, w0.cross_llc_pct), (Some(525.6), Some(32.3), Some(64.8)));
        assert_eq!(rs[1].sysctl, "1");
        assert_eq!(rs[1].steer_c_per_s, Some(4.0));

        let a1 = &rs[3];
        assert_eq!((a1.scenario.as_str(), a1.sysctl.as_str()), ("llc-across", "1"));
        assert_eq!(a1.lock_contended_pct, Some(2.25));
        assert_eq!(a1.lock_wait_us_per_s, Some(1234.5));
        assert_eq!(a1.guest_cpu_pct, Some(38.25));
        assert_eq!(a1.stuck_flows, Some(3));
    }

    #[test]
    fn table_has_header_rows_and_ratio() {
        let t = table(&all_rows(&reports()));
        let lines: Vec<&str> = t.lines().collect();
        for h in HEADER {
            assert!(lines[0].contains(h), "header lacks {h}: {}", lines[0]);
        }
        assert!(lines[0].starts_with("scenario"));
        assert!(t.contains("llc-within: Steer-C/s at sysctl=1 is 0.5% of sysctl=0 (4.0 vs 800.0 calls/s)"), "{t}");
        assert!(t.contains("llc-across: Steer-C/s at sysctl=1 is 90.0% of sysctl=0 (630.0 vs 700.0 calls/s)"), "{t}");
        // Ratio lines sit under their scenario's rows.
        let pos = |s: &str| lines.iter().position(|l| l.contains(s)).unwrap();
        assert!(pos("llc-within: Steer") > pos("626.4"));
        assert!(pos("llc-within: Steer") < pos("llc-across  "));
        assert!(t.contains("200000.0") && t.contains("1234.5") && t.contains("73215"));
        // Columns line up: every data row is as long as the header (trailing numbers).
        let data: Vec<&&str> = lines.iter().filter(|l| l.starts_with("llc-")).collect();
        assert_eq!(data.len(), 4);
        for l in data {
            assert_eq!(l.len(), lines[0].len(), "{l}");
        }
    }

    #[test]
    fn invalid_runs_are_flagged_and_left_out_of_the_median() {
        use crate::report::schema::{Health, Verdict};
        let mut r = reports().remove(0);
        let (w0, w1) = (r.runs[0].clone(), r.runs[1].clone());
        let mut bad = w0.clone();
        bad.guest.driver.as_mut().unwrap().steer_calls_per_s = Some(5000.0);
        bad.health = Some(Health { verdict: Verdict::Invalid, ..Default::default() });
        let mut w0b = w0.clone();
        w0b.guest.driver.as_mut().unwrap().steer_calls_per_s = Some(600.0);
        let mut w0c = w0.clone();
        w0c.guest.driver.as_mut().unwrap().steer_calls_per_s = Some(700.0);
        r.runs = vec![w0, bad, w0b, w0c, w1];
        let t = table(&rows(&r));
        // The invalid row is shown with its flag but without its numbers; the ratio is
        // the median of the valid runs.
        assert!(t.lines().any(|l| l.starts_with("llc-within") && l.ends_with("invalid")), "{t}");
        assert!(!t.contains("5000.0"), "{t}");
        assert!(
            t.contains(
                "is 0.6% of sysctl=0 (median 4.0 vs 700.0 [600.0-800.0, n=3] calls/s; 1 invalid run(s) left out)"
            ),
            "{t}"
        );
        // No valid run on one side: no result at all.
        r.runs.retain(|x| x.sysctls[SYSCTL] == "1" || x.health.is_some());
        let t = table(&rows(&r));
        assert!(t.contains("llc-within: Steer-C/s at sysctl=1 vs sysctl=0: no result"), "{t}");
    }

    #[test]
    fn no_ratio_without_pair() {
        let mut r = reports().remove(0);
        r.runs.pop();
        let t = table(&rows(&r));
        assert!(!t.contains("Steer-C/s at sysctl=1"), "{t}");
        let mut z = reports().remove(0);
        z.runs[0].guest.driver.as_mut().unwrap().steer_calls_per_s = Some(0.0);
        assert!(table(&rows(&z)).contains("llc-within: Steer-C/s at sysctl=1 vs sysctl=0: n/a"));
    }

    #[test]
    fn csv_lines_and_numbers() {
        let c = csv(&all_rows(&reports()));
        let lines: Vec<&str> = c.lines().collect();
        assert_eq!(lines.len(), 5);
        assert!(lines[0].starts_with("scenario,label,sysctl,steer_c_per_s,"));
        assert_eq!(lines[0].split(',').count(), 19);
        assert_eq!(lines[1], "llc-within,sysctl=0,0,800,5,626.4,0.1,3,3.5,200000,485,73215,60,0,,-,525.6,32.3,64.8");
        assert_eq!(lines[4], "llc-across,sysctl=1,1,630,5,600,0.1,3,2.25,1234.5,320,190000,38.25,3,,-,525.6,32.3,64.8");
    }

    #[test]
    fn svg_has_bars_labels_and_legend() {
        let svg = svg_chart(&all_rows(&reports()), "steer <rate> & more").unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
        assert!(svg.trim_end().ends_with("</svg>"));
        for s in
            ["llc-within", "llc-across", "arfs_llc_affinity=0", "arfs_llc_affinity=1", "steer &lt;rate&gt; &amp; more"]
        {
            assert!(svg.contains(s), "svg lacks {s}");
        }
        // Value labels on the bars.
        let texts: Vec<&str> = svg
            .split("<text")
            .skip(1)
            .filter_map(|t| t.split('>').nth(1))
            .map(|t| t.trim_end_matches("</text").trim())
            .collect();
        for v in ["800", "4.0", "700", "630"] {
            assert!(texts.contains(&v), "svg lacks label {v}: {texts:?}");
        }
        // Both bar colours are used.
        assert!(svg.contains("#D6604D") || svg.to_lowercase().contains("#d6604d"));
        assert!(svg.contains("#4393C3") || svg.to_lowercase().contains("#4393c3"));
        // Balanced tags, roughly: every <text opens and closes.
        assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
    }

    #[test]
    fn markdown_has_the_table_columns_and_ratios() {
        let m = markdown(&all_rows(&reports()));
        let lines: Vec<&str> = m.lines().collect();
        assert_eq!(lines[0], format!("| {} |", HEADER.join(" | ")));
        assert!(lines[1].starts_with("|---|---|---:|"));
        assert_eq!(lines.iter().filter(|l| l.starts_with("| llc-")).count(), 4);
        assert!(
            m.contains(
                "| llc-within | 0 | 800.0 | 5.0 | 626.4 | 0.1 | 3 | 3.50 | 200000.0 | 485 | 73215 | 60.0 | 0 | - | 525.6 | 32.3 | 64.8 | - |"
            ),
            "{m}"
        );
        assert!(m.contains("- llc-across: Steer-C/s at sysctl=1 is 90.0% of sysctl=0 (630.0 vs 700.0 calls/s)"), "{m}");
    }

    #[test]
    fn missing_values_are_dashes() {
        let rs = all_rows(&sparse());
        assert_eq!(rs.len(), 2);
        assert_eq!(rs[0].scenario, "broken, \"quoted\"");
        assert_eq!((rs[0].label.as_str(), rs[0].sysctl.as_str()), ("empty", "-"));
        assert_eq!(rs[1].sysctl, "1");
        for r in &rs {
            assert_eq!(r.steer_c_per_s, None);
            assert_eq!(r.add_per_s, None);
            assert_eq!(r.lock_wait_us_per_s, None);
            assert_eq!(r.guest_cpu_pct, None);
        }
        assert_eq!((rs[0].add_errors, rs[0].stuck_flows, rs[0].lock_contended_pct), (None, None, None));
        let t = table(&rs);
        let row = t.lines().find(|l| l.starts_with("broken")).unwrap_or_else(|| panic!("{t}"));
        assert_eq!(row.split_whitespace().filter(|c| *c == "-").count(), 15, "{row}");
        assert!(!t.contains("Steer-C/s at sysctl=1"));
        let c = csv(&rs);
        assert_eq!(c.lines().nth(1).unwrap(), "\"broken, \"\"quoted\"\"\",empty,-,,,,,,,,0,0,,,,-,,,");
        let svg = svg_chart(&rs, "t").unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("arfs_llc_affinity unset"));
        assert!(svg_chart(&[], "empty").unwrap().starts_with("<svg"));
        assert!(table(&[]).starts_with("scenario"));
    }

    #[test]
    fn write_outputs_writes_three_files() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("out/nested");
        let mut rs = reports();
        rs.extend(sparse());
        let o = write_outputs(&sub, &rs).unwrap();
        let doc: Value = serde_json::from_slice(&std::fs::read(&o.json).unwrap()).unwrap();
        assert_eq!(doc["rows"].as_array().unwrap().len(), 6);
        assert_eq!(doc["reports"].as_array().unwrap().len(), rs.len());
        assert_eq!(doc["rows"][0]["steer_c_per_s"], json!(800.0));
        assert_eq!(doc["rows"][4]["steer_c_per_s"], Value::Null);
        assert_eq!(std::fs::read_to_string(&o.csv).unwrap().lines().count(), 7);
        assert!(std::fs::read_to_string(&o.svg).unwrap().starts_with("<svg"));
    }
}
