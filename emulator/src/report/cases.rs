//! Results as test cases for CI systems (`run`/`compare` `--ktap FILE`, `--junit FILE`):
//! one case per run for its health verdict and, against a baseline, one case per run ×
//! compared metric. A run that is `invalid` or a metric that regressed past its threshold
//! (percentage and floor, docs/ci.md) is a failed case whose message has the numbers; a
//! metric absent on one side is skipped.
//!
//! KTAP is the kernel's version 1 (Documentation/dev-tools/ktap.rst), flat: `KTAP version
//! 1`, the plan, one `ok`/`not ok` line per case with `# SKIP` for skips and the numbers as
//! `# ` diagnostic lines before a failure. JUnit is the XML GitLab and GitHub render: one
//! `testsuite` per report, `testcase classname="SCENARIO.RUN" name="METRIC"`, `failure`
//! and `skipped` elements.

use super::baseline::{self, Outcome};
use super::schema::{Report, Verdict};
use std::fmt::Write as _;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Pass,
    Fail,
    Skip,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    /// `SCENARIO.RUN` (JUnit's classname).
    pub group: String,
    /// `health` or the metric's name.
    pub name: String,
    pub status: Status,
    /// The numbers: why it failed or was skipped, or what passed.
    pub message: String,
}

impl Case {
    /// The KTAP test name: `SCENARIO.RUN.NAME` with every character KTAP gives a meaning
    /// (space, `#`) replaced.
    pub fn ktap_name(&self) -> String {
        format!("{}.{}", self.group, self.name)
            .chars()
            .map(|c| if c.is_whitespace() || c == '#' { '_' } else { c })
            .collect()
    }
}

/// One case per run: its health verdict (`degraded` passes with the reasons in its
/// message, `invalid` fails, no verdict is skipped).
pub fn health_cases(report: &Report) -> Vec<Case> {
    report
        .runs
        .iter()
        .map(|r| {
            let group = format!("{}.{}", report.scenario, r.label);
            let (status, message) = match &r.health {
                None => (Status::Skip, "no health verdict in the report".to_string()),
                Some(h) => {
                    let reasons =
                        if h.reasons.is_empty() { String::new() } else { format!(": {}", h.reasons.join("; ")) };
                    let st = if h.verdict == Verdict::Invalid { Status::Fail } else { Status::Pass };
                    (st, format!("{}{reasons}", h.verdict.as_str()))
                }
            };
            Case { group, name: "health".into(), status, message }
        })
        .collect()
}

/// One case per run × metric of a baseline comparison.
pub fn comparison_cases(o: &Outcome) -> Vec<Case> {
    o.comparisons
        .iter()
        .map(|c| {
            let status = match c.verdict {
                baseline::Verdict::Regressed => Status::Fail,
                baseline::Verdict::Skipped => Status::Skip,
                baseline::Verdict::Ok | baseline::Verdict::Improved => Status::Pass,
            };
            let rule = format!(
                "worse when {} by more than {}% and {}",
                c.direction.worse(),
                baseline::fmt_num(o.max_regress_pct),
                baseline::fmt_num(c.floor)
            );
            let message = match c.verdict {
                baseline::Verdict::Skipped => "absent in the baseline or the report".to_string(),
                v => format!(
                    "{} ({}; {rule})",
                    c.line(),
                    serde_json::to_value(v).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default()
                ),
            };
            Case { group: format!("{}.{}", o.scenario, c.run), name: c.metric.into(), status, message }
        })
        .collect()
}

/// KTAP version 1.
pub fn ktap(cases: &[Case]) -> String {
    let mut s = String::from("KTAP version 1\n");
    let _ = writeln!(s, "1..{}", cases.len());
    for (i, c) in cases.iter().enumerate() {
        let n = i + 1;
        let msg = c.message.replace(['\n', '\r'], " ");
        match c.status {
            Status::Pass => {
                let _ = writeln!(s, "# {msg}");
                let _ = writeln!(s, "ok {n} {}", c.ktap_name());
            }
            Status::Fail => {
                let _ = writeln!(s, "# {msg}");
                let _ = writeln!(s, "not ok {n} {}", c.ktap_name());
            }
            Status::Skip => {
                let _ = writeln!(s, "ok {n} {} # SKIP {msg}", c.ktap_name());
            }
        }
    }
    s
}

fn xml(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            // Characters XML 1.0 does not allow at all.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => o.push('?'),
            c => o.push(c),
        }
    }
    o
}

/// JUnit XML, one `testsuite` named `suite`.
pub fn junit(suite: &str, cases: &[Case]) -> String {
    let fails = cases.iter().filter(|c| c.status == Status::Fail).count();
    let skips = cases.iter().filter(|c| c.status == Status::Skip).count();
    let mut s = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(s, "<testsuites tests=\"{}\" failures=\"{fails}\" skipped=\"{skips}\">", cases.len());
    let _ = writeln!(
        s,
        "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{fails}\" errors=\"0\" skipped=\"{skips}\">",
        xml(suite),
        cases.len()
    );
    for c in cases {
        let open = format!("    <testcase classname=\"{}\" name=\"{}\"", xml(&c.group), xml(&c.name));
        match c.status {
            Status::Pass => {
                let _ = writeln!(s, "{open}>\n      <system-out>{}</system-out>\n    </testcase>", xml(&c.message));
            }
            Status::Fail => {
                let _ = writeln!(
                    s,
                    "{open}>\n      <failure message=\"{}\">{}</failure>\n    </testcase>",
                    xml(&c.message),
                    xml(&c.message)
                );
            }
            Status::Skip => {
                let _ = writeln!(s, "{open}>\n      <skipped message=\"{}\"/>\n    </testcase>", xml(&c.message));
            }
        }
    }
    s.push_str("  </testsuite>\n</testsuites>\n");
    s
}

/// Write `--ktap` / `--junit` files for these cases (either may be absent).
pub fn write(
    ktap_file: Option<&std::path::Path>,
    junit_file: Option<&std::path::Path>,
    suite: &str,
    cases: &[Case],
) -> anyhow::Result<()> {
    use anyhow::Context;
    if let Some(p) = ktap_file {
        std::fs::write(p, ktap(cases)).with_context(|| format!("--ktap {}", p.display()))?;
    }
    if let Some(p) = junit_file {
        std::fs::write(p, junit(suite, cases)).with_context(|| format!("--junit {}", p.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cases() -> Vec<Case> {
        vec![
            Case {
                group: "llc-within.sysctl=0".into(),
                name: "health".into(),
                status: Status::Pass,
                message: "ok".into(),
            },
            Case {
                group: "llc-within.sysctl=1".into(),
                name: "guest.steer_calls_per_s".into(),
                status: Status::Fail,
                message: "run sysctl=1: guest.steer_calls_per_s 0 -> 320.1 (+inf %) <&\"'>".into(),
            },
            Case { group: "x y".into(), name: "link.lost".into(), status: Status::Skip, message: "absent".into() },
        ]
    }

    #[test]
    fn ktap_has_the_plan_and_one_line_per_case() {
        let k = ktap(&cases());
        let lines: Vec<&str> = k.lines().collect();
        assert_eq!(lines[..2], ["KTAP version 1", "1..3"]);
        assert!(lines.contains(&"ok 1 llc-within.sysctl=0.health"));
        assert!(lines.contains(&"not ok 2 llc-within.sysctl=1.guest.steer_calls_per_s"));
        assert!(lines.contains(&"ok 3 x_y.link.lost # SKIP absent"), "{k}");
    }

    #[test]
    fn junit_counts_and_escapes() {
        let j = junit("arfsnic llc-within", &cases());
        assert!(
            j.contains("<testsuite name=\"arfsnic llc-within\" tests=\"3\" failures=\"1\" errors=\"0\" skipped=\"1\">"),
            "{j}"
        );
        assert!(j.contains("&lt;&amp;&quot;&apos;&gt;") && !j.contains("<&"), "{j}");
        assert!(j.contains("<skipped message=\"absent\"/>"));
    }
}
