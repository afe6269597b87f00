//! Results: the seed-style steer-rate table (plus CSV and an SVG bar chart) built from
//! one or more scenario reports (the JSON that `arfsnic run` writes).
//!
//! Each run of a report becomes one [`Row`]: the guest's aRFS steering rates
//! (`ndo_rx_flow_steer` calls/s and the adds/mods/dels they caused), lock contention,
//! RTT, guest CPU and stuck flows, tagged with the value of
//! `net.core.arfs_llc_affinity` the run used. Missing or malformed fields become `None`
//! (shown as `-`); nothing here panics on a report's shape.

use anyhow::{anyhow, Context};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde::Serialize;
use serde_json::{json, Value};
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
}

/// The files [`write_outputs`] wrote.
#[derive(Clone, Debug)]
pub struct Outputs {
    pub json: PathBuf,
    pub csv: PathBuf,
    pub svg: PathBuf,
}

fn f64_of(v: &Value) -> Option<f64> {
    v.as_f64().filter(|x| x.is_finite())
}

fn text_of(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.trim().to_string()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(u8::from(*b).to_string()),
        _ => None,
    }
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

fn row_of(scenario: &str, r: &Value) -> Row {
    let g = &r["guest"];
    let lock_wait_us_per_s = f64_of(&g["lock_wait_us_per_s"]).or_else(|| {
        let ns = f64_of(&g["lock_wait_ns"])?;
        let window = f64_of(&g["rates_window_s"]).filter(|&w| w > 0.0)?;
        Some(ns / 1000.0 / window)
    });
    let sys = &g["system"];
    let guest_cpu_pct = f64_of(&r["guest_cpu_pct"])
        .or_else(|| cpu_busy_pct(&sys["proc_stat_before"]["cpu"], &sys["proc_stat_after"]["cpu"]));
    Row {
        scenario: scenario.to_string(),
        label: text_of(&r["label"]).unwrap_or_else(|| "-".into()),
        sysctl: text_of(&r["sysctls"][SYSCTL]).filter(|s| !s.is_empty()).unwrap_or_else(|| "-".into()),
        steer_c_per_s: f64_of(&g["steer_calls_per_s"]),
        add_per_s: f64_of(&g["adds_per_s"]),
        mod_per_s: f64_of(&g["mods_per_s"]),
        del_per_s: f64_of(&g["dels_per_s"]),
        add_errors: g["add_errors"].as_object().map(|m| m.values().filter_map(Value::as_u64).sum()),
        lock_contended_pct: f64_of(&g["lock_contended_pct_window"]).or_else(|| f64_of(&g["lock_contended_pct"])),
        lock_wait_us_per_s,
        rtt_p50_us: f64_of(&r["link"]["rtt_us_p50"]),
        rtt_p99_us: f64_of(&r["link"]["rtt_us_p99"]),
        guest_cpu_pct,
        stuck_flows: r["flows_stuck_without_filter"].as_u64(),
    }
}

/// One row per run of a scenario report (none when the report has no `runs` array).
pub fn rows(report: &Value) -> Vec<Row> {
    let scenario = text_of(&report["scenario"]).filter(|s| !s.is_empty()).unwrap_or_else(|| "-".into());
    report["runs"].as_array().into_iter().flatten().map(|r| row_of(&scenario, r)).collect()
}

fn opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.decimals$}"))
}

fn opt_u(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |x| x.to_string())
}

/// Scenarios in order of first appearance, each with its rows.
fn by_scenario(rows: &[Row]) -> Vec<(&str, Vec<&Row>)> {
    let mut groups: Vec<(&str, Vec<&Row>)> = Vec::new();
    for r in rows {
        match groups.iter_mut().find(|(s, _)| *s == r.scenario) {
            Some((_, g)) => g.push(r),
            None => groups.push((&r.scenario, vec![r])),
        }
    }
    groups
}

fn mean_steer(rows: &[&Row], sysctl: &str) -> Option<f64> {
    let v: Vec<f64> = rows.iter().filter(|r| r.sysctl == sysctl).filter_map(|r| r.steer_c_per_s).collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// The line under a scenario that has runs with the sysctl at 0 and at 1 (`None` when
/// it has not). Several runs with the same value are averaged.
fn ratio_line(scenario: &str, rows: &[&Row]) -> Option<String> {
    let has = |v: &str| rows.iter().any(|r| r.sysctl == v);
    if !has("0") || !has("1") {
        return None;
    }
    Some(match (mean_steer(rows, "0"), mean_steer(rows, "1")) {
        (Some(s0), Some(s1)) if s0 > 0.0 => {
            let pct = 100.0 * s1 / s0;
            let pct = if pct > 0.0 && pct < 0.1 { format!("{pct:.2}") } else { format!("{pct:.1}") };
            format!("{scenario}: Steer-C/s at sysctl=1 is {pct}% of sysctl=0 ({s1:.1} vs {s0:.1} calls/s)")
        }
        (Some(s0), Some(s1)) => {
            format!("{scenario}: Steer-C/s at sysctl=1 vs sysctl=0: n/a ({s1:.1} vs {s0:.1} calls/s)")
        }
        _ => format!("{scenario}: Steer-C/s at sysctl=1 vs sysctl=0: n/a (rate missing)"),
    })
}

const HEADER: [&str; 13] = [
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
];

/// The aligned steer-rate table, rows grouped by scenario, with the sysctl=1/sysctl=0
/// Steer-C/s ratio under each scenario that has both.
pub fn table(rows: &[Row]) -> String {
    let cells = |r: &Row| -> Vec<String> {
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
        ]
    };
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
         lock_wait_us_per_s,rtt_p50_us,rtt_p99_us,guest_cpu_pct,stuck_flows\n",
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
        ];
        out.push_str(&fields.join(","));
        out.push('\n');
    }
    out
}

/// Width of one scenario's group on the chart's x axis.
const X: i32 = 1000;

/// Colour of the n-th sysctl value (0: baseline, 1: LLC affinity on, then others).
const BAR_COLOURS: [RGBColor; 5] = [
    RGBColor(214, 96, 77),
    RGBColor(67, 147, 195),
    RGBColor(120, 120, 120),
    RGBColor(77, 172, 38),
    RGBColor(153, 112, 171),
];

/// Distinct sysctl values: numeric ones in numeric order, then the rest (`-`).
fn sysctl_values(rows: &[Row]) -> Vec<&str> {
    let mut v: Vec<&str> = Vec::new();
    for r in rows {
        if !v.contains(&r.sysctl.as_str()) {
            v.push(&r.sysctl);
        }
    }
    v.sort_by(|a, b| match (a.parse::<f64>(), b.parse::<f64>()) {
        (Ok(x), Ok(y)) => x.total_cmp(&y),
        (Ok(_), Err(_)) => std::cmp::Ordering::Less,
        (Err(_), Ok(_)) => std::cmp::Ordering::Greater,
        (Err(_), Err(_)) => a.cmp(b),
    });
    v
}

fn legend_label(sysctl: &str) -> String {
    if sysctl == "-" {
        "arfs_llc_affinity unset".into()
    } else {
        format!("arfs_llc_affinity={sysctl}")
    }
}

fn rate_label(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// Grouped bar chart of Steer-C/s: one group per scenario, one bar per run, coloured by
/// the run's `net.core.arfs_llc_affinity` (legend), the value written on each bar.
/// Runs without a steer rate get no bar.
pub fn svg_chart(rows: &[Row], title: &str) -> anyhow::Result<String> {
    let groups = by_scenario(rows);
    let sysctls = sysctl_values(rows);
    let colour = |s: &str| BAR_COLOURS[sysctls.iter().position(|v| *v == s).unwrap_or(0) % BAR_COLOURS.len()];
    // (sysctl, x0, x1, value) of each bar; group i spans [i*X, (i+1)*X] on the x axis
    // (integers: plotters has no default formatting for f64 axes with own key points).
    let mut bars: Vec<(&str, i32, i32, f64)> = Vec::new();
    for (i, (_, g)) in groups.iter().enumerate() {
        let mut runs: Vec<(&str, f64)> = g.iter().filter_map(|r| Some((r.sysctl.as_str(), r.steer_c_per_s?))).collect();
        runs.sort_by_key(|(s, _)| sysctls.iter().position(|v| v == s));
        let k_all = runs.len().max(1) as i32;
        let w = (X * 7 / 10) / k_all;
        let left = i as i32 * X + (X - w * k_all) / 2;
        for (k, (s, v)) in runs.into_iter().enumerate() {
            let x0 = left + k as i32 * w;
            bars.push((s, x0 + X / 100, x0 + w - X / 100, v.max(0.0)));
        }
    }
    let y_max = bars.iter().map(|b| b.3).fold(0.0, f64::max);
    // Head room for the value labels and the legend.
    let y_top = if y_max > 0.0 { y_max * 1.3 } else { 1.0 };
    let n = groups.len().max(1);
    let names: Vec<String> = groups.iter().map(|(s, _)| s.to_string()).collect();
    let width = (160 * n as u32 + 260).max(640);

    let mut svg = String::new();
    {
        let err = |e: &dyn std::fmt::Display| anyhow!("drawing the steer-rate chart: {e}");
        let root = SVGBackend::with_string(&mut svg, (width, 440)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let centres: Vec<i32> = (0..groups.len()).map(|i| i as i32 * X + X / 2).collect();
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 24))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d((0..n as i32 * X).with_key_points(centres), 0f64..y_top)
            .map_err(|e| err(&e))?;
        let x_fmt = |x: &i32| usize::try_from(x / X).ok().and_then(|i| names.get(i).cloned()).unwrap_or_default();
        let y_fmt = |y: &f64| if y_top < 10.0 { format!("{y:.1}") } else { format!("{y:.0}") };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .max_light_lines(1)
            .x_desc("scenario")
            .y_desc("Steer-C/s (ndo_rx_flow_steer calls/s)")
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&y_fmt)
            .label_style(("sans-serif", 15))
            .draw()
            .map_err(|e| err(&e))?;
        for s in &sysctls {
            let c = colour(s);
            let mine: Vec<_> = bars.iter().filter(|b| b.0 == *s).collect();
            chart
                .draw_series(mine.iter().map(|b| Rectangle::new([(b.1, 0.0), (b.2, b.3)], c.filled())))
                .map_err(|e| err(&e))?
                .label(legend_label(s))
                .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], c.filled()));
            let text = TextStyle::from(("sans-serif", 15).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom));
            chart
                .draw_series(mine.iter().map(|b| Text::new(rate_label(b.3), ((b.1 + b.2) / 2, b.3), text.clone())))
                .map_err(|e| err(&e))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 15))
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}

/// Writes `results.json` (`{rows, reports}`), `results.csv` and `steer-rate.svg` into
/// `dir` (created if needed).
pub fn write_outputs(dir: &Path, reports: &[Value]) -> anyhow::Result<Outputs> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let all: Vec<Row> = reports.iter().flat_map(rows).collect();
    let out = Outputs { json: dir.join("results.json"), csv: dir.join("results.csv"), svg: dir.join("steer-rate.svg") };
    let doc = json!({ "rows": all, "reports": reports });
    let write = |p: &Path, data: &[u8]| std::fs::write(p, data).with_context(|| format!("writing {}", p.display()));
    write(&out.json, &serde_json::to_vec_pretty(&doc)?)?;
    write(&out.csv, csv(&all).as_bytes())?;
    let title = format!("aRFS steering rate by {SYSCTL}");
    write(&out.svg, svg_chart(&all, &title)?.as_bytes())?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::too_many_arguments)]
    fn run(label: &str, sysctl: &str, steer: f64, adds: f64, mods: f64, dels: f64, p50: f64, p99: f64) -> Value {
        json!({
            "label": label,
            "sysctls": { SYSCTL: sysctl, "net.core.rps_sock_flow_entries": "32768" },
            "link": { "rtt_us_p50": p50, "rtt_us_p99": p99 },
            "guest": {
                "module": true,
                "steer_calls_per_s": steer,
                "adds_per_s": adds,
                "mods_per_s": mods,
                "dels_per_s": dels,
                "rates_window_s": 10.0,
                "add_errors": { "-28": 2, "-16": 1 },
                "lock_contended_pct": 3.5,
                "lock_wait_ns": 2_000_000_000u64,
                "system": {
                    "proc_stat_before": { "cpu": [10, 0, 20, 70, 0, 0, 0, 0, 0, 0] },
                    "proc_stat_after": { "cpu": [30, 0, 60, 100, 10, 0, 0, 0, 5, 0] },
                },
            },
            "flows_stuck_without_filter": 0,
        })
    }

    /// Two scenarios, runs with the sysctl at 0 and 1. The llc-across runs carry the
    /// newer fields (window contention, lock wait rate, guest CPU), llc-within's runs
    /// need the fallbacks.
    fn reports() -> Vec<Value> {
        let mut across0 = run("sysctl=0", "0", 700.0, 4.0, 620.0, 0.0, 500.0, 80000.0);
        let mut across1 = run("sysctl=1", "1", 630.0, 5.0, 600.0, 0.1, 320.0, 190000.0);
        for (r, cpu) in [(&mut across0, 41.5), (&mut across1, 38.25)] {
            r["guest"]["lock_contended_pct_window"] = json!(2.25);
            r["guest"]["lock_wait_us_per_s"] = json!(1234.5);
            r["guest_cpu_pct"] = json!(cpu);
        }
        across1["flows_stuck_without_filter"] = json!(3);
        vec![
            json!({
                "scenario": "llc-within",
                "runs": [
                    run("sysctl=0", "0", 800.0, 5.0, 626.4, 0.1, 485.0, 73215.0),
                    run("sysctl=1", "1", 4.0, 4.5, 0.0, 0.0, 312.0, 6787.0),
                ],
            }),
            json!({ "scenario": "llc-across", "runs": [across0, across1] }),
        ]
    }

    /// Runs and reports of every wrong shape.
    fn broken() -> Vec<Value> {
        vec![
            json!({
                "scenario": "broken, \"quoted\"",
                "runs": [
                    { "label": "empty" },
                    {
                        "label": 5,
                        "sysctls": { SYSCTL: 1 },
                        "link": null,
                        "guest": {
                            "steer_calls_per_s": "fast",
                            "adds_per_s": null,
                            "add_errors": [1, 2],
                            "lock_wait_ns": 5,
                            "rates_window_s": 0.0,
                            "system": { "proc_stat_before": { "cpu": [1, 2] }, "proc_stat_after": { "cpu": "x" } },
                        },
                        "flows_stuck_without_filter": -1,
                    },
                    7,
                    null,
                ],
            }),
            json!({ "runs": "none" }),
            json!(null),
            json!([1, 2, 3]),
        ]
    }

    fn all_rows(reports: &[Value]) -> Vec<Row> {
        reports.iter().flat_map(rows).collect()
    }

    #[test]
    fn rows_take_fields_and_fallbacks() {
        let rs = all_rows(&reports());
        assert_eq!(rs.len(), 4);
        let w0 = &rs[0];
        assert_eq!((w0.scenario.as_str(), w0.label.as_str(), w0.sysctl.as_str()), ("llc-within", "sysctl=0", "0"));
        assert_eq!(w0.steer_c_per_s, Some(800.0));
        assert_eq!(w0.add_per_s, Some(5.0));
        assert_eq!(w0.mod_per_s, Some(626.4));
        assert_eq!(w0.del_per_s, Some(0.1));
        assert_eq!(w0.add_errors, Some(3));
        assert_eq!(w0.lock_contended_pct, Some(3.5));
        // 2e9 ns over a 10 s window.
        assert_eq!(w0.lock_wait_us_per_s, Some(200_000.0));
        assert_eq!(w0.rtt_p50_us, Some(485.0));
        assert_eq!(w0.rtt_p99_us, Some(73215.0));
        // Δtotal = 200 - 100 (guest column ignored), Δ(idle+iowait) = 110 - 70 → 60 % busy.
        let cpu = w0.guest_cpu_pct.unwrap();
        assert!((cpu - 60.0).abs() < 1e-9, "{cpu}");
        assert_eq!(w0.stuck_flows, Some(0));
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
    fn no_ratio_without_pair() {
        let mut r = reports().remove(0);
        r["runs"].as_array_mut().unwrap().pop();
        let t = table(&rows(&r));
        assert!(!t.contains("Steer-C/s at sysctl=1"), "{t}");
        let mut z = reports().remove(0);
        z["runs"][0]["guest"]["steer_calls_per_s"] = json!(0.0);
        assert!(table(&rows(&z)).contains("llc-within: Steer-C/s at sysctl=1 vs sysctl=0: n/a"));
    }

    #[test]
    fn csv_lines_and_numbers() {
        let c = csv(&all_rows(&reports()));
        let lines: Vec<&str> = c.lines().collect();
        assert_eq!(lines.len(), 5);
        assert!(lines[0].starts_with("scenario,label,sysctl,steer_c_per_s,"));
        assert_eq!(lines[0].split(',').count(), 14);
        assert_eq!(lines[1], "llc-within,sysctl=0,0,800,5,626.4,0.1,3,3.5,200000,485,73215,60,0");
        assert_eq!(lines[4], "llc-across,sysctl=1,1,630,5,600,0.1,3,2.25,1234.5,320,190000,38.25,3");
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
    fn missing_and_malformed_fields_are_dashes() {
        let rs = all_rows(&broken());
        assert_eq!(rs.len(), 4);
        assert_eq!(rs[0].scenario, "broken, \"quoted\"");
        assert_eq!((rs[0].label.as_str(), rs[0].sysctl.as_str()), ("empty", "-"));
        assert_eq!(rs[1].label, "5");
        assert_eq!(rs[1].sysctl, "1");
        assert_eq!(rs[2].label, "-");
        for r in &rs {
            assert_eq!(r.steer_c_per_s, None);
            assert_eq!(r.add_per_s, None);
            assert_eq!(r.add_errors, None);
            assert_eq!(r.lock_wait_us_per_s, None);
            assert_eq!(r.rtt_p50_us, None);
            assert_eq!(r.guest_cpu_pct, None);
            assert_eq!(r.stuck_flows, None);
        }
        let t = table(&rs);
        let row = t.lines().find(|l| l.starts_with("broken") && l.contains(" 1 ")).unwrap();
        assert_eq!(row.split_whitespace().filter(|c| *c == "-").count(), 11, "{row}");
        assert!(!t.contains("Steer-C/s at sysctl=1"));
        let c = csv(&rs);
        assert_eq!(c.lines().nth(1).unwrap(), "\"broken, \"\"quoted\"\"\",empty,-,,,,,,,,,,,");
        let svg = svg_chart(&rs, "t").unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("arfs_llc_affinity unset"));
        assert!(svg_chart(&[], "empty").unwrap().starts_with("<svg"));
        assert!(table(&[]).starts_with("scenario"));
    }

    #[test]
    fn cpu_pct_edge_cases() {
        assert_eq!(cpu_busy_pct(&json!([1, 2, 3, 4]), &json!([1, 2, 3, 4])), None);
        assert_eq!(cpu_busy_pct(&json!([0, 0, 0, 0]), &json!([50, 0, 0, 50])), Some(50.0));
        assert_eq!(cpu_busy_pct(&json!([5, 0, 0, 0]), &json!([0, 0, 0, 0])), None);
        assert_eq!(cpu_busy_pct(&json!([0, 0, 0]), &json!([1, 1, 1])), None);
    }

    #[test]
    fn write_outputs_writes_three_files() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("out/nested");
        let mut rs = reports();
        rs.extend(broken());
        let o = write_outputs(&sub, &rs).unwrap();
        let doc: Value = serde_json::from_slice(&std::fs::read(&o.json).unwrap()).unwrap();
        assert_eq!(doc["rows"].as_array().unwrap().len(), 8);
        assert_eq!(doc["reports"].as_array().unwrap().len(), rs.len());
        assert_eq!(doc["rows"][0]["steer_c_per_s"], json!(800.0));
        assert_eq!(doc["rows"][4]["steer_c_per_s"], Value::Null);
        assert_eq!(std::fs::read_to_string(&o.csv).unwrap().lines().count(), 9);
        assert!(std::fs::read_to_string(&o.svg).unwrap().starts_with("<svg"));
    }
}
