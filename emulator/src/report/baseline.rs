//! Regression check of a run report against a stored baseline report (docs/ci.md).
//!
//! Both sides are reports as `arfsnic run --json` writes them. Runs are matched by
//! `label`; for every run a fixed list of metrics ([`METRICS`]) is compared. Each metric
//! has a direction (which way is worse) and an absolute floor: a metric *regresses* when
//! it is worse than the baseline by more than `max_regress_pct` percent of the baseline
//! value **and** by more than its floor, so nearly idle metrics (0 → 1 stuck flow,
//! 3.7 → 4.1 Steer-C/s) do not fire on noise. Metrics a run does not have on either side
//! (no guest module, no rates) are skipped and listed as skipped. Both reports are read
//! as typed reports ([`schema::Report`]), so a report of another schema version is
//! refused by name.

use super::schema::{self, RunReport};
use serde::Serialize;
use std::fmt::Write;
use std::path::Path;

/// `--max-regress` when not given, in percent.
pub const DEFAULT_MAX_REGRESS_PCT: f64 = 10.0;

/// Which way a metric gets worse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    HigherIsWorse,
    LowerIsWorse,
}

impl Direction {
    /// `higher` or `lower`: the direction in which the metric is worse.
    pub fn worse(self) -> &'static str {
        match self {
            Direction::HigherIsWorse => "higher",
            Direction::LowerIsWorse => "lower",
        }
    }
}

/// One compared metric.
#[derive(Clone, Copy, Debug)]
pub struct MetricDef {
    /// The metric's name in tables and messages: its JSON path inside a run
    /// (`guest.add_errors` is the total over all errnos).
    pub name: &'static str,
    pub direction: Direction,
    /// Absolute change (in the metric's unit) that a regression must exceed as well.
    pub floor: f64,
    pub unit: &'static str,
    /// The value in one run of a report; `None` when the run does not have it (no guest
    /// module, no rates).
    pub read: fn(&RunReport) -> Option<f64>,
}

const fn m(
    name: &'static str,
    read: fn(&RunReport) -> Option<f64>,
    direction: Direction,
    floor: f64,
    unit: &'static str,
) -> MetricDef {
    MetricDef { name, direction, floor, unit, read }
}

use Direction::{HigherIsWorse as Hi, LowerIsWorse as Lo};

/// The compared metrics, their directions and floors (the table in docs/ci.md).
pub const METRICS: &[MetricDef] = &[
    m("guest.steer_calls_per_s", |r| r.driver()?.steer_calls_per_s, Hi, 10.0, "/s"),
    m("guest.adds_per_s", |r| r.driver()?.adds_per_s, Hi, 5.0, "/s"),
    m("guest.mods_per_s", |r| r.driver()?.mods_per_s, Hi, 5.0, "/s"),
    m("guest.dels_per_s", |r| r.driver()?.dels_per_s, Hi, 5.0, "/s"),
    m("guest.add_errors", |r| Some(r.driver()?.add_errors.values().sum::<u64>() as f64), Hi, 5.0, ""),
    m("guest.lock_contended_pct", |r| Some(r.driver()?.lock_contended_pct), Hi, 5.0, "%"),
    m("guest.lock_wait_us_per_s", |r| r.driver()?.lock_wait_us_per_s, Hi, 100.0, "us/s"),
    m("link.responses_per_s", |r| Some(r.link.responses_per_s), Lo, 20.0, "/s"),
    m("link.rtt_us_p50", |r| Some(r.link.rtt_us_p50), Hi, 500.0, "us"),
    m("link.rtt_us_p99", |r| Some(r.link.rtt_us_p99), Hi, 2000.0, "us"),
    m("link.lost", |r| Some(r.link.lost as f64), Hi, 50.0, ""),
    m("flows_stuck_without_filter", |r| r.flows_stuck_without_filter.map(|n| n as f64), Hi, 1.0, ""),
    m("device.flows_misdelivered", |r| Some(r.device.flows_misdelivered as f64), Hi, 0.0, ""),
    m("device.rx_dropped_no_buffer", |r| Some(r.device.rx_dropped_no_buffer as f64), Hi, 50.0, ""),
];

/// The outcome of one metric of one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Within the allowed change (or better, but not by more than the thresholds).
    Ok,
    /// Better than the baseline by more than the percentage and the floor.
    Improved,
    /// Worse than the baseline by more than the percentage and the floor.
    Regressed,
    /// Absent or `null` on at least one side.
    Skipped,
}

/// One metric of one run, baseline against current.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    pub run: String,
    pub metric: &'static str,
    pub direction: Direction,
    pub floor: f64,
    pub baseline: Option<f64>,
    pub current: Option<f64>,
    /// (current - baseline) / |baseline| in percent; `None` when skipped, or when the
    /// baseline is 0 and the current value is not (an infinite change).
    pub change_pct: Option<f64>,
    pub verdict: Verdict,
}

impl Comparison {
    /// `run LABEL: METRIC BASE -> CUR (+X%)`.
    pub fn line(&self) -> String {
        format!(
            "run {}: {} {} -> {} ({})",
            self.run,
            self.metric,
            fmt_value(self.baseline),
            fmt_value(self.current),
            fmt_change(self)
        )
    }
}

/// The result of comparing two reports.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    pub scenario: String,
    pub max_regress_pct: f64,
    pub comparisons: Vec<Comparison>,
    /// Differences in the setup that make the numbers less comparable (kernel, accel, ...).
    pub notes: Vec<String>,
}

impl Outcome {
    pub fn regressions(&self) -> impl Iterator<Item = &Comparison> {
        self.comparisons.iter().filter(|c| c.verdict == Verdict::Regressed)
    }

    pub fn skipped(&self) -> impl Iterator<Item = &Comparison> {
        self.comparisons.iter().filter(|c| c.verdict == Verdict::Skipped)
    }

    pub fn passed(&self) -> bool {
        self.regressions().next().is_none()
    }

    /// The error text when something regressed: one `run LABEL: METRIC BASE -> CUR (+X%)`
    /// line per regressed metric.
    /// Keep only the comparisons of these metrics (`run --bisect-on`): the others neither
    /// regress nor show in the table.
    pub fn retain_metrics(&mut self, names: &[String]) {
        self.comparisons.retain(|c| names.iter().any(|n| n == c.metric));
    }

    pub fn regression_message(&self) -> Option<String> {
        let lines: Vec<String> = self.regressions().map(|c| format!("  {}", c.line())).collect();
        if lines.is_empty() {
            return None;
        }
        Some(format!(
            "{} metric(s) regressed by more than {}% and their floor:\n{}",
            lines.len(),
            fmt_num(self.max_regress_pct),
            lines.join("\n")
        ))
    }
}

/// One run of a report: its label and the value of every metric in [`METRICS`] order.
#[derive(Clone, Debug)]
struct RunValues {
    label: String,
    values: Vec<Option<f64>>,
}

/// A report reduced to what the comparison needs, checked for shape.
#[derive(Clone, Debug)]
pub struct Report {
    /// What the report is called in messages, e.g. `baseline baseline/llc-within.json`.
    pub source: String,
    pub scenario: String,
    pub kernel: Option<String>,
    pub accel: Option<String>,
    runs: Vec<RunValues>,
}

impl Report {
    /// Reduce a run report to its metrics; `source` names it in messages. Errors: a run
    /// label that appears twice (runs are matched by label).
    pub fn from_report(r: &schema::Report, source: &str) -> Result<Report, String> {
        if !r.complete {
            return Err(format!(
                "{source}: the scenario was interrupted ({}) and the report holds only the runs that finished; \
                 compare a complete run",
                r.interrupted.as_deref().unwrap_or("complete = false")
            ));
        }
        let mut runs: Vec<RunValues> = Vec::with_capacity(r.runs.len());
        for run in &r.runs {
            if let Some(h) = run.health.as_ref().filter(|h| h.verdict == schema::Verdict::Invalid) {
                return Err(format!(
                    "{source}: run {:?} is invalid ({}): its numbers are not a result, so it is not compared; \
                     run it again (docs/measuring.md, \"Run health\")",
                    run.label,
                    h.reasons.join("; ")
                ));
            }
            if runs.iter().any(|x| x.label == run.label) {
                return Err(format!("{source}: run label {:?} appears twice (runs are matched by label)", run.label));
            }
            let values = METRICS.iter().map(|m| (m.read)(run).filter(|x| x.is_finite())).collect();
            runs.push(RunValues { label: run.label.clone(), values });
        }
        Ok(Report {
            source: source.to_string(),
            scenario: r.scenario.clone(),
            kernel: Some(r.kernel.clone()),
            accel: Some(r.accel.clone()),
            runs,
        })
    }

    /// Read and check a report file; `role` is `baseline` or `report` (used in messages
    /// together with the path).
    pub fn load(path: &Path, role: &str) -> anyhow::Result<Report> {
        let r = schema::Report::load(path, role)?;
        Report::from_report(&r, &format!("{role} {}", path.display())).map_err(anyhow::Error::msg)
    }

    pub fn labels(&self) -> impl Iterator<Item = &str> {
        self.runs.iter().map(|r| r.label.as_str())
    }
}

fn judge(m: &MetricDef, base: f64, cur: f64, max_regress_pct: f64) -> Verdict {
    // Positive: worse than the baseline.
    let worse = match m.direction {
        Direction::HigherIsWorse => cur - base,
        Direction::LowerIsWorse => base - cur,
    };
    let pct_limit = base.abs() * max_regress_pct / 100.0;
    if worse > pct_limit && worse > m.floor {
        Verdict::Regressed
    } else if -worse > pct_limit && -worse > m.floor {
        Verdict::Improved
    } else {
        Verdict::Ok
    }
}

fn change_pct(base: f64, cur: f64) -> Option<f64> {
    if base == 0.0 {
        (cur == 0.0).then_some(0.0)
    } else {
        Some((cur - base) / base.abs() * 100.0)
    }
}

/// Compare `current` against `baseline`. Errors: different scenario names, or a run
/// label present on one side only (every such label is named).
pub fn compare(baseline: &Report, current: &Report, max_regress_pct: f64) -> anyhow::Result<Outcome> {
    if !(max_regress_pct.is_finite() && max_regress_pct >= 0.0) {
        anyhow::bail!("the maximum regression must be a number >= 0 (percent), got {max_regress_pct}");
    }
    if baseline.scenario != current.scenario {
        anyhow::bail!(
            "different scenarios: {} is {:?}, {} is {:?}",
            baseline.source,
            baseline.scenario,
            current.source,
            current.scenario
        );
    }
    let only_in = |a: &Report, b: &Report| -> Vec<String> {
        a.runs.iter().filter(|r| !b.runs.iter().any(|x| x.label == r.label)).map(|r| format!("{:?}", r.label)).collect()
    };
    let mut missing = Vec::new();
    let not_in_current = only_in(baseline, current);
    if !not_in_current.is_empty() {
        missing.push(format!("run {} in {} but not in {}", not_in_current.join(", "), baseline.source, current.source));
    }
    let not_in_baseline = only_in(current, baseline);
    if !not_in_baseline.is_empty() {
        missing.push(format!(
            "run {} in {} but not in {}",
            not_in_baseline.join(", "),
            current.source,
            baseline.source
        ));
    }
    if !missing.is_empty() {
        anyhow::bail!("runs do not match (they are matched by label): {}", missing.join("; "));
    }
    let mut notes = Vec::new();
    for (what, b, c) in [("kernel", &baseline.kernel, &current.kernel), ("accel", &baseline.accel, &current.accel)] {
        if b != c {
            let show = |x: &Option<String>| x.clone().unwrap_or_else(|| "?".into());
            notes.push(format!("{what} differs: baseline {}, report {}", show(b), show(c)));
        }
    }
    let mut comparisons = Vec::new();
    for br in &baseline.runs {
        let Some(cr) = current.runs.iter().find(|r| r.label == br.label) else { continue };
        for (i, m) in METRICS.iter().enumerate() {
            let (b, c) = (br.values[i], cr.values[i]);
            let (verdict, change) = match (b, c) {
                (Some(b), Some(c)) => (judge(m, b, c, max_regress_pct), change_pct(b, c)),
                _ => (Verdict::Skipped, None),
            };
            comparisons.push(Comparison {
                run: br.label.clone(),
                metric: m.name,
                direction: m.direction,
                floor: m.floor,
                baseline: b,
                current: c,
                change_pct: change,
                verdict,
            });
        }
    }
    Ok(Outcome { scenario: baseline.scenario.clone(), max_regress_pct, comparisons, notes })
}

/// Parser of a metric name (`--bisect-on`): one of [`METRICS`].
pub fn parse_metric_name(s: &str) -> Result<String, String> {
    let t = s.trim();
    if METRICS.iter().any(|m| m.name == t) {
        Ok(t.to_string())
    } else {
        let names: Vec<&str> = METRICS.iter().map(|m| m.name).collect();
        Err(format!("unknown metric {t:?}; valid: {}", names.join(", ")))
    }
}

/// Parser of `--max-regress` (clap names the flag in its error): a percentage >= 0
/// (`25`, `2.5`, `25%`).
pub fn parse_max_regress(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let t = t.strip_suffix('%').unwrap_or(t).trim();
    t.parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && *x >= 0.0)
        .ok_or_else(|| format!("expected a percentage >= 0 (e.g. 10, 2.5 or 25%), got {s:?}"))
}

pub fn fmt_num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

fn fmt_value(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), fmt_num)
}

fn fmt_change(c: &Comparison) -> String {
    match (c.change_pct, c.baseline, c.current) {
        (Some(p), _, _) => format!("{p:+.1}%"),
        (None, Some(_), Some(cur)) => (if cur > 0.0 { "+inf%" } else { "-inf%" }).to_string(),
        _ => "-".to_string(),
    }
}

/// The comparison as a table, one line per run and metric, then a summary line.
pub fn render_table(o: &Outcome) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "baseline comparison, scenario {}: a metric regresses when worse by more than {}% and by more than its floor",
        o.scenario,
        fmt_num(o.max_regress_pct)
    );
    for n in &o.notes {
        let _ = writeln!(s, "note: {n}");
    }
    let run_w = o.comparisons.iter().map(|c| c.run.len()).max().unwrap_or(3).max(3);
    let met_w = METRICS.iter().map(|m| m.name.len()).max().unwrap_or(6);
    let _ = writeln!(
        s,
        "{:<run_w$}  {:<met_w$}  {:>6}  {:>12}  {:>12}  {:>9}  {:>7}  verdict",
        "run", "metric", "worse", "baseline", "current", "change", "floor"
    );
    for c in &o.comparisons {
        let verdict = match c.verdict {
            Verdict::Ok => "ok",
            Verdict::Improved => "improved",
            Verdict::Regressed => "REGRESSED",
            Verdict::Skipped => "skipped",
        };
        let _ = writeln!(
            s,
            "{:<run_w$}  {:<met_w$}  {:>6}  {:>12}  {:>12}  {:>9}  {:>7}  {}",
            c.run,
            c.metric,
            c.direction.worse(),
            fmt_value(c.baseline),
            fmt_value(c.current),
            fmt_change(c),
            fmt_num(c.floor),
            verdict
        );
    }
    let count = |v: Verdict| o.comparisons.iter().filter(|c| c.verdict == v).count();
    let _ = writeln!(
        s,
        "{} compared: {} ok, {} improved, {} regressed, {} skipped (absent or null on one side)",
        o.comparisons.len() - count(Verdict::Skipped),
        count(Verdict::Ok),
        count(Verdict::Improved),
        count(Verdict::Regressed),
        count(Verdict::Skipped),
    );
    let skipped: Vec<String> = o.skipped().map(|c| format!("{}/{}", c.run, c.metric)).collect();
    if !skipped.is_empty() {
        let _ = writeln!(s, "skipped: {}", skipped.join(", "));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::schema::{DriverReport, GuestReport};
    use crate::traffic::partner::LinkStats;
    use serde_json::{json, Value};

    /// A run as JSON, so the tests can bend single fields the way a file could.
    fn run(label: &str, steer: f64) -> Value {
        let r = RunReport {
            label: label.into(),
            link: LinkStats {
                responses: 20000,
                rtt_us_p50: 400.0,
                rtt_us_p99: 7000.0,
                responses_per_s: 2000.0,
                ..Default::default()
            },
            guest: GuestReport {
                module: true,
                driver: Some(DriverReport {
                    steer_calls_per_s: Some(steer),
                    adds_per_s: Some(4.5),
                    mods_per_s: Some(0.0),
                    dels_per_s: Some(0.0),
                    add_errors: [("ENOSPC".to_string(), 2)].into_iter().collect(),
                    lock_contended_pct: 2.5,
                    lock_wait_us_per_s: None,
                    ..Default::default()
                }),
                ..Default::default()
            },
            flows_stuck_without_filter: Some(0),
            filter_table: None,
            ..Default::default()
        };
        serde_json::to_value(r).unwrap()
    }

    fn report(runs: Vec<Value>) -> Value {
        let r = schema::Report {
            schema_version: schema::SCHEMA_VERSION,
            scenario: "llc-within".into(),
            kernel: "k".into(),
            accel: "tcg".into(),
            complete: true,
            ..Default::default()
        };
        let mut v = serde_json::to_value(r).unwrap();
        v["runs"] = Value::Array(runs);
        v
    }

    /// [`compare`] on two reports as JSON values (parsed as typed reports first).
    fn compare_values(baseline: &Value, current: &Value, max_regress_pct: f64) -> anyhow::Result<Outcome> {
        let parse = |v: &Value, name: &str| -> anyhow::Result<Report> {
            let r = schema::Report::from_value(v.clone(), name)?;
            Report::from_report(&r, name).map_err(anyhow::Error::msg)
        };
        compare(&parse(baseline, "baseline")?, &parse(current, "report")?, max_regress_pct)
    }

    fn get<'a>(o: &'a Outcome, run: &str, metric: &str) -> &'a Comparison {
        o.comparisons.iter().find(|c| c.run == run && c.metric == metric).expect("comparison present")
    }

    #[test]
    fn an_invalid_run_is_refused_on_either_side() {
        let ok = report(vec![run("sysctl=0", 680.0), run("sysctl=1", 3.7)]);
        let mut bad = ok.clone();
        bad["runs"][1]["health"] = json!({"verdict": "invalid", "reasons": ["replies lost 99.4% > 5%"]});
        for (b, c) in [(&ok, &bad), (&bad, &ok)] {
            let e = compare_values(b, c, 10.0).unwrap_err().to_string();
            assert!(e.contains("run \"sysctl=1\" is invalid (replies lost 99.4% > 5%)"), "{e}");
            assert!(e.contains("not compared"), "{e}");
        }
        // degraded runs are compared
        bad["runs"][1]["health"]["verdict"] = json!("degraded");
        assert!(compare_values(&ok, &bad, 10.0).unwrap().passed());
    }

    #[test]
    fn an_interrupted_report_is_refused_and_old_reports_are_complete() {
        let ok = report(vec![run("sysctl=0", 680.0)]);
        let mut cut = ok.clone();
        cut["complete"] = json!(false);
        cut["interrupted"] = json!("SIGINT");
        let e = compare_values(&ok, &cut, 10.0).unwrap_err().to_string();
        assert!(e.contains("interrupted (SIGINT)"), "{e}");
        let mut old = ok.clone();
        old.as_object_mut().unwrap().remove("complete");
        assert!(compare_values(&old, &ok, 10.0).unwrap().passed(), "a report without the field is complete");
    }

    #[test]
    fn identical_reports_pass_and_null_is_skipped() {
        let r = report(vec![run("sysctl=0", 680.0), run("sysctl=1", 3.7)]);
        let o = compare_values(&r, &r, 10.0).unwrap();
        assert!(o.passed());
        assert_eq!(o.comparisons.len(), 2 * METRICS.len());
        assert_eq!(get(&o, "sysctl=0", "guest.lock_wait_us_per_s").verdict, Verdict::Skipped);
        assert_eq!(o.skipped().count(), 2);
        assert_eq!(get(&o, "sysctl=1", "guest.add_errors").baseline, Some(2.0));
        assert!(o.regression_message().is_none());
        let t = render_table(&o);
        assert!(t.contains("skipped: sysctl=0/guest.lock_wait_us_per_s, sysctl=1/guest.lock_wait_us_per_s"), "{t}");
    }

    #[test]
    fn steer_increase_beyond_pct_and_floor_regresses() {
        let b = report(vec![run("sysctl=0", 680.0), run("sysctl=1", 100.0)]);
        let c = report(vec![run("sysctl=0", 690.0), run("sysctl=1", 150.0)]);
        let o = compare_values(&b, &c, 10.0).unwrap();
        assert!(!o.passed());
        let x = get(&o, "sysctl=1", "guest.steer_calls_per_s");
        assert_eq!(x.verdict, Verdict::Regressed);
        assert_eq!(x.change_pct, Some(50.0));
        assert_eq!(get(&o, "sysctl=0", "guest.steer_calls_per_s").verdict, Verdict::Ok);
        let msg = o.regression_message().unwrap();
        assert!(msg.contains("run sysctl=1: guest.steer_calls_per_s 100 -> 150 (+50.0%)"), "{msg}");
        assert!(!msg.contains("sysctl=0"), "{msg}");
        // A larger allowance lets it pass; the reverse direction is an improvement.
        assert!(compare_values(&b, &c, 60.0).unwrap().passed());
        let back = compare_values(&c, &b, 10.0).unwrap();
        assert_eq!(get(&back, "sysctl=1", "guest.steer_calls_per_s").verdict, Verdict::Improved);
        assert!(back.passed());
    }

    #[test]
    fn floors_suppress_small_absolute_changes() {
        // 3.7 -> 4.1 Steer-C/s is +11% but 0.4/s, under the 10/s floor.
        let o = compare_values(&report(vec![run("a", 3.7)]), &report(vec![run("a", 4.1)]), 10.0).unwrap();
        assert_eq!(get(&o, "a", "guest.steer_calls_per_s").verdict, Verdict::Ok);
        // 3.7 -> 14 is above the floor.
        let o = compare_values(&report(vec![run("a", 3.7)]), &report(vec![run("a", 14.0)]), 10.0).unwrap();
        assert_eq!(get(&o, "a", "guest.steer_calls_per_s").verdict, Verdict::Regressed);

        // Stuck flows: 0 -> 1 passes, 0 -> 2 fails (floor 1, infinite change).
        let b = report(vec![run("a", 3.7)]);
        let mut c = b.clone();
        c["runs"][0]["flows_stuck_without_filter"] = json!(1);
        assert!(compare_values(&b, &c, 10.0).unwrap().passed());
        c["runs"][0]["flows_stuck_without_filter"] = json!(2);
        let o = compare_values(&b, &c, 10.0).unwrap();
        let x = get(&o, "a", "flows_stuck_without_filter");
        assert_eq!((x.verdict, x.change_pct), (Verdict::Regressed, None));
        assert!(o.regression_message().unwrap().contains("run a: flows_stuck_without_filter 0 -> 2 (+inf%)"));

        // Misdelivery has no floor: any flow is a regression.
        let mut c = b.clone();
        c["runs"][0]["device"]["flows_misdelivered"] = json!(1);
        assert!(!compare_values(&b, &c, 10.0).unwrap().passed());
    }

    #[test]
    fn lower_is_worse_for_responses() {
        let b = report(vec![run("a", 3.7)]);
        let mut c = b.clone();
        c["runs"][0]["link"]["responses_per_s"] = json!(1500.0);
        let o = compare_values(&b, &c, 10.0).unwrap();
        let x = get(&o, "a", "link.responses_per_s");
        assert_eq!(x.verdict, Verdict::Regressed);
        assert!(x.line().ends_with("2000 -> 1500 (-25.0%)"), "{}", x.line());
        c["runs"][0]["link"]["responses_per_s"] = json!(2500.0);
        assert_eq!(get(&compare_values(&b, &c, 10.0).unwrap(), "a", "link.responses_per_s").verdict, Verdict::Improved);
    }

    #[test]
    fn add_errors_summed_and_absent_guest_skipped() {
        let b = report(vec![run("a", 3.7)]);
        let mut c = b.clone();
        c["runs"][0]["guest"]["add_errors"] = json!({ "ENOSPC": 2, "EBUSY": 9 });
        let o = compare_values(&b, &c, 10.0).unwrap();
        let x = get(&o, "a", "guest.add_errors");
        assert_eq!((x.baseline, x.current, x.verdict), (Some(2.0), Some(11.0), Verdict::Regressed));

        // No guest module: the guest metrics are absent, stuck flows null.
        let mut c = b.clone();
        c["runs"][0]["guest"] = json!({ "module": false, "system": {} });
        c["runs"][0]["flows_stuck_without_filter"] = Value::Null;
        let o = compare_values(&b, &c, 10.0).unwrap();
        assert!(o.passed());
        assert_eq!(o.skipped().count(), 8);
        assert_eq!(get(&o, "a", "flows_stuck_without_filter").verdict, Verdict::Skipped);
    }

    #[test]
    fn structural_errors_name_runs_and_paths() {
        let b = report(vec![run("sysctl=0", 1.0), run("sysctl=1", 1.0)]);
        let c = report(vec![run("sysctl=0", 1.0), run("sysctl=2", 1.0)]);
        let e = compare_values(&b, &c, 10.0).unwrap_err().to_string();
        assert!(e.contains("\"sysctl=1\" in baseline but not in report"), "{e}");
        assert!(e.contains("\"sysctl=2\" in report but not in baseline"), "{e}");

        let mut c = b.clone();
        c["scenario"] = json!("llc-across");
        let e = compare_values(&b, &c, 10.0).unwrap_err().to_string();
        assert!(e.contains("different scenarios") && e.contains("llc-across"), "{e}");

        let mut c = b.clone();
        c["runs"][1].as_object_mut().unwrap().remove("label");
        let e = compare_values(&b, &c, 10.0).unwrap_err().to_string();
        assert_eq!(e, "report: `runs[1]`: missing field `label`");

        let mut c = b.clone();
        c["runs"][0]["guest"]["steer_calls_per_s"] = json!("fast");
        let e = compare_values(&c, &b, 10.0).unwrap_err().to_string();
        assert!(e.starts_with("baseline: `runs[0].guest`: steer_calls_per_s: invalid type: string \"fast\""), "{e}");

        let e = compare_values(&json!([1]), &b, 10.0).unwrap_err().to_string();
        assert!(e.contains("no `schema_version`"), "{e}");
        let e = compare_values(&json!({"schema_version": 1, "scenario": "x"}), &b, 10.0).unwrap_err().to_string();
        assert!(e.contains("missing field"), "{e}");
        let c = report(vec![run("a", 1.0), run("a", 2.0)]);
        assert!(compare_values(&c, &c, 10.0).unwrap_err().to_string().contains("appears twice"));
    }

    #[test]
    fn zero_pct_and_max_regress_parser() {
        let b = report(vec![run("a", 100.0)]);
        let c = report(vec![run("a", 111.0)]);
        assert!(!compare_values(&b, &c, 0.0).unwrap().passed());
        assert!(compare_values(&b, &c, -1.0).is_err());
        assert_eq!(parse_max_regress("25"), Ok(25.0));
        assert_eq!(parse_max_regress("2.5%"), Ok(2.5));
        assert_eq!(parse_max_regress("0"), Ok(0.0));
        for bad in ["-1", "abc", "", "nan", "inf"] {
            let e = parse_max_regress(bad).unwrap_err();
            assert!(e.contains("expected a percentage >= 0"), "{bad}: {e}");
        }
    }

    #[test]
    fn notes_on_setup_differences() {
        let b = report(vec![run("a", 1.0)]);
        let mut c = b.clone();
        c["accel"] = json!("kvm");
        let o = compare_values(&b, &c, 10.0).unwrap();
        assert_eq!(o.notes, vec!["accel differs: baseline tcg, report kvm".to_string()]);
        assert!(render_table(&o).contains("note: accel differs"));
    }
}
