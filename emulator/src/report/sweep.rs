//! The `rps_flow_cnt` sweep in the shape of Krishna Kumar's table ("net: Prevent RPS
//! table overwrite of active flows"): one row per table size, per kernel the latency,
//! guest CPU, filter adds and deletes and `ndo_rx_flow_steer` calls over the run, and the
//! old/new ratio of the steer calls; plus a line plot of Steer-C against the table size.
//! Built from one report whose runs carry `rps_flow_cnt` and `kernel`
//! (configs/scenarios/rps-flow-cnt-sweep.toml). Only valid runs are shown.

use super::schema::{Report, RunReport, Verdict};
use std::fmt::Write as _;

/// One run of the sweep.
#[derive(Clone, Debug, PartialEq)]
pub struct Cell {
    pub label: String,
    /// `ndo_rx_flow_steer` calls over the whole traffic (warm-up included, as the seed's
    /// counts over a run).
    pub steer_calls: u64,
    pub steer_per_s: Option<f64>,
    pub adds: u64,
    pub dels: u64,
    /// `None` without requests on the link (a model report).
    pub rtt_p50_us: Option<f64>,
    pub guest_cpu_pct: Option<f64>,
}

/// The sweep of one report: kernels in the order their first run appears, sizes ascending.
#[derive(Clone, Debug, PartialEq)]
pub struct Sweep {
    pub scenario: String,
    pub kernels: Vec<String>,
    pub sizes: Vec<u32>,
    /// (size, kernel) -> the first valid run; absent when every run of it was invalid.
    pub cells: Vec<((u32, String), Cell)>,
    /// Runs left out (invalid), as `label: reasons`.
    pub left_out: Vec<String>,
}

fn cell_of(r: &RunReport) -> Option<Cell> {
    let d = r.driver()?;
    Some(Cell {
        label: r.label.clone(),
        steer_calls: d.steer_calls,
        steer_per_s: d.steer_calls_per_s,
        adds: d.adds_ok,
        dels: d.dels_ok,
        rtt_p50_us: (r.link.requests > 0).then_some(r.link.rtt_us_p50),
        guest_cpu_pct: r.guest_cpu_pct,
    })
}

/// The sweep in a report, or None when its runs do not vary `rps_flow_cnt`.
pub fn sweep(report: &Report) -> Option<Sweep> {
    let mut s = Sweep {
        scenario: report.scenario.clone(),
        kernels: Vec::new(),
        sizes: Vec::new(),
        cells: Vec::new(),
        left_out: Vec::new(),
    };
    for r in &report.runs {
        let Some(size) = r.rps_flow_cnt else { continue };
        let kernel = r.kernel.clone().unwrap_or_else(|| report.kernel.clone());
        if !s.kernels.contains(&kernel) {
            s.kernels.push(kernel.clone());
        }
        if !s.sizes.contains(&size) {
            s.sizes.push(size);
        }
        let valid = r.health.as_ref().is_none_or(|h| h.verdict != Verdict::Invalid);
        if !valid {
            let reasons = r.health.as_ref().map(|h| h.reasons.join("; ")).unwrap_or_default();
            s.left_out.push(format!("{}: invalid ({reasons})", r.label));
            continue;
        }
        if s.cells.iter().any(|(k, _)| k.0 == size && k.1 == kernel) {
            continue;
        }
        if let Some(c) = cell_of(r) {
            s.cells.push(((size, kernel), c));
        }
    }
    s.sizes.sort_unstable();
    (s.sizes.len() >= 2).then_some(s)
}

impl Sweep {
    pub fn cell(&self, size: u32, kernel: &str) -> Option<&Cell> {
        self.cells.iter().find(|(k, _)| k.0 == size && k.1 == kernel).map(|(_, c)| c)
    }

    /// Steer-C of the first kernel over the second's at one size (the seed's old/new).
    pub fn ratio(&self, size: u32) -> Option<f64> {
        let [old, new, ..] = self.kernels.as_slice() else { return None };
        let (o, n) = (self.cell(size, old)?, self.cell(size, new)?);
        (n.steer_calls > 0).then(|| o.steer_calls as f64 / n.steer_calls as f64)
    }

    /// The first kernel's Steer-C per size, then the second's (for the plot and checks).
    pub fn series(&self, kernel: &str) -> Vec<(u32, u64)> {
        self.sizes.iter().filter_map(|&n| Some((n, self.cell(n, kernel)?.steer_calls))).collect()
    }

    /// What the issue expects of Krishna's table at CI size; an empty list when it holds.
    /// `tol` is the run-to-run spread allowed for "non-increasing" (0.25: a size may show
    /// up to 25 % more calls than the one before it).
    pub fn shape_failures(&self, tol: f64) -> Vec<String> {
        let mut f = Vec::new();
        let [old, new, ..] = self.kernels.as_slice() else {
            return vec![format!("the sweep needs two kernels, has {:?}", self.kernels)];
        };
        let (so, sn) = (self.series(old), self.series(new));
        if so.len() != self.sizes.len() || sn.len() != self.sizes.len() {
            f.push(format!(
                "missing valid runs: {old} has {} of {} sizes, {new} {}",
                so.len(),
                self.sizes.len(),
                sn.len()
            ));
            return f;
        }
        for w in so.windows(2) {
            if w[1].1 as f64 > w[0].1 as f64 * (1.0 + tol) {
                f.push(format!(
                    "{old}: Steer-C rises from {} at {} to {} at {} (more than {:.0}%)",
                    w[0].1,
                    w[0].0,
                    w[1].1,
                    w[1].0,
                    tol * 100.0
                ));
            }
        }
        match self.ratio(self.sizes[0]) {
            Some(r) if r >= 5.0 => {}
            r => f.push(format!("{old}/{new} Steer-C at {} is {r:.2?}, expected >= 5", self.sizes[0])),
        }
        let mut v: Vec<f64> = sn.iter().map(|x| x.1 as f64).collect();
        v.sort_by(f64::total_cmp);
        let mid = v[v.len() / 2];
        for (n, c) in &sn {
            if mid > 0.0 && ((*c as f64 - mid) / mid).abs() > 0.30 {
                f.push(format!("{new}: Steer-C {c} at {n} is more than 30% from its median {mid:.0}"));
            }
        }
        f
    }
}

fn opt(v: Option<f64>, d: usize) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.d$}"))
}

fn cells_of(s: &Sweep, size: u32) -> Vec<String> {
    let mut out = vec![size.to_string()];
    for k in &s.kernels {
        match s.cell(size, k) {
            Some(c) => out.extend([
                opt(c.rtt_p50_us, 0),
                opt(c.guest_cpu_pct, 1),
                c.adds.to_string(),
                c.dels.to_string(),
                c.steer_calls.to_string(),
                opt(c.steer_per_s, 1),
            ]),
            None => out.extend(["invalid".to_string(), "-".into(), "-".into(), "-".into(), "-".into(), "-".into()]),
        }
    }
    out.push(opt(s.ratio(size), 1));
    out
}

fn header(s: &Sweep) -> Vec<String> {
    let mut h = vec!["rps_flow_cnt".to_string()];
    for k in &s.kernels {
        for c in ["RTT p50 us", "CPU %", "Add", "Del", "Steer-C", "Steer-C/s"] {
            h.push(format!("{k} {c}"));
        }
    }
    let ratio = match s.kernels.as_slice() {
        [a, b, ..] => format!("Steer-C {a}/{b}"),
        _ => "ratio".into(),
    };
    h.push(ratio);
    h
}

/// Aligned text: the kernel names over their column groups.
pub fn table(s: &Sweep) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "rps_flow_cnt sweep ({}): per kernel RTT p50 us, guest CPU %, Add, Del, Steer-C (calls over the run), Steer-C/s", s.scenario);
    let mut line = format!("{:>12}", "");
    for k in &s.kernels {
        let _ = write!(line, " | {k:<49}");
    }
    let _ = writeln!(out, "{line} |");
    let mut h = format!("{:>12}", "rps_flow_cnt");
    for _ in &s.kernels {
        let _ = write!(
            h,
            " | {:>10} {:>5} {:>6} {:>6} {:>8} {:>9}",
            "RTT p50us", "CPU%", "Add", "Del", "Steer-C", "Steer-C/s"
        );
    }
    let _ = writeln!(out, "{h} | old/new");
    for &n in &s.sizes {
        let c = cells_of(s, n);
        let mut l = format!("{:>12}", c[0]);
        for g in c[1..c.len() - 1].chunks(6) {
            let _ = write!(l, " | {:>10} {:>5} {:>6} {:>6} {:>8} {:>9}", g[0], g[1], g[2], g[3], g[4], g[5]);
        }
        let _ = writeln!(out, "{l} | {}", c[c.len() - 1]);
    }
    for l in &s.left_out {
        let _ = writeln!(out, "left out: {l}");
    }
    out
}

/// Markdown, for docs/results.md.
pub fn markdown(s: &Sweep) -> String {
    let h = header(s);
    let mut out = format!("| {} |\n|{}\n", h.join(" | "), "---:|".repeat(h.len()));
    for &n in &s.sizes {
        let _ = writeln!(out, "| {} |", cells_of(s, n).join(" | "));
    }
    for l in &s.left_out {
        let _ = writeln!(out, "\nLeft out: {l}");
    }
    out
}

/// Steer-C against rps_flow_cnt (log2 x axis), one line per kernel.
pub fn svg(s: &Sweep) -> anyhow::Result<String> {
    let series: Vec<(String, Vec<(u64, f64)>)> = s
        .kernels
        .iter()
        .map(|k| (k.clone(), s.series(k).into_iter().map(|(n, v)| (u64::from(n), v as f64)).collect()))
        .collect();
    super::chart::log2_lines(
        &format!("{}: Steer-C vs rps_flow_cnt", s.scenario),
        "rps_flow_cnt (per RX queue)",
        "Steer-C (ndo_rx_flow_steer calls over the run)",
        &series,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::schema::{DriverReport, GuestReport, Health};

    fn run(label: &str, kernel: &str, size: u32, steer: u64, verdict: Verdict) -> RunReport {
        let mut r = RunReport { label: label.into(), ..Default::default() };
        r.kernel = Some(kernel.into());
        r.rps_flow_cnt = Some(size);
        r.guest = GuestReport {
            module: true,
            driver: Some(DriverReport { steer_calls: steer, adds_ok: steer / 2, ..Default::default() }),
            ..Default::default()
        };
        r.health = Some(Health { verdict, ..Default::default() });
        r
    }

    fn report(runs: Vec<RunReport>) -> Report {
        Report { scenario: "sweep".into(), kernel: "debian-6.12".into(), runs, ..Default::default() }
    }

    fn krishna_like() -> Report {
        report(vec![
            run("old-256", "debian-6.12", 256, 9000, Verdict::Ok),
            run("new-256", "debian-7.3", 256, 1100, Verdict::Ok),
            run("old-1024", "debian-6.12", 1024, 4000, Verdict::Ok),
            run("new-1024", "debian-7.3", 1024, 1050, Verdict::Ok),
            run("old-32768", "debian-6.12", 32768, 1200, Verdict::Degraded),
            run("new-32768", "debian-7.3", 32768, 1040, Verdict::Ok),
        ])
    }

    #[test]
    fn rows_per_size_columns_per_kernel_and_the_ratio() {
        let s = sweep(&krishna_like()).unwrap();
        assert_eq!(s.kernels, ["debian-6.12", "debian-7.3"]);
        assert_eq!(s.sizes, [256, 1024, 32768]);
        assert_eq!(s.ratio(256).map(|r| (r * 100.0).round()), Some(818.0));
        let t = table(&s);
        assert!(t.contains("debian-6.12") && t.contains("debian-7.3"), "{t}");
        let row = t.lines().find(|l| l.trim_start().starts_with("256 ")).unwrap();
        assert!(row.contains("9000") && row.contains("1100") && row.ends_with("8.2"), "{row}");
        assert!(s.shape_failures(0.25).is_empty(), "{:?}", s.shape_failures(0.25));
        let md = markdown(&s);
        assert_eq!(md.lines().filter(|l| l.starts_with("| 256 ") || l.starts_with("| 1024 ")).count(), 2, "{md}");
        let svg = svg(&s).unwrap();
        assert!(svg.contains("<svg") && svg.contains("debian-7.3") && svg.contains("32768"), "{}", &svg[..200]);
    }

    #[test]
    fn invalid_runs_are_left_out_and_break_the_shape() {
        let mut r = krishna_like();
        r.runs[0].health =
            Some(Health { verdict: Verdict::Invalid, reasons: vec!["lost 40%".into()], ..Default::default() });
        let s = sweep(&r).unwrap();
        assert!(s.cell(256, "debian-6.12").is_none());
        assert!(table(&s).contains("invalid") && table(&s).contains("left out: old-256: invalid (lost 40%)"));
        assert!(s.shape_failures(0.25).iter().any(|f| f.contains("missing valid runs")));
    }

    #[test]
    fn each_expectation_can_fail() {
        let mut r = krishna_like();
        r.runs[4] = run("old-32768", "debian-6.12", 32768, 6000, Verdict::Ok); // rises
        r.runs[1] = run("new-256", "debian-7.3", 256, 2500, Verdict::Ok); // ratio 3.6, new not flat
        let f = sweep(&r).unwrap().shape_failures(0.25);
        assert!(f.iter().any(|x| x.contains("rises from 4000 at 1024 to 6000")), "{f:?}");
        assert!(f.iter().any(|x| x.contains("expected >= 5")), "{f:?}");
        assert!(f.iter().any(|x| x.contains("more than 30% from its median")), "{f:?}");
    }

    #[test]
    fn no_sweep_without_sizes() {
        let mut r = krishna_like();
        for x in &mut r.runs {
            x.rps_flow_cnt = None;
        }
        assert!(sweep(&r).is_none());
    }
}
