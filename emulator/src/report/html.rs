//! The HTML report (`demo-out/index.html`, `arfsnic results --html FILE`): one
//! self-contained page — no external URL, no script library, the plots inlined as the
//! SVG [`super::chart`] draws — with a header (arfsnic version, kernel, topology,
//! profile, when the page was written), the steer-rate table of [`super::results`] (one
//! row per run, the same columns), the plots (the steer-rate bar chart, each scenario's
//! steer calls per second, an `rps_flow_cnt` sweep's curve), the per-flow view and each
//! run's settings. Every text that comes from a report is escaped.
//!
//! A small inline script at the end checks, once the page is laid out, that every
//! `<svg>` has a non-empty bounding box and counts the table's rows, and writes the
//! result on `<body>` (`data-svgs`, `data-svgs-rendered`, `data-table-rows`,
//! `data-check="done"`): a headless browser's `--dump-dom` shows whether the browser
//! really drew the plots (tests/html_report.rs).

use super::results::{self, Row, SYSCTL};
use super::schema::{FlowView, Report, RunReport};
use anyhow::Context;
use serde_json::Value;
use std::fmt::Write;
use std::path::Path;

/// What the page says about itself besides the reports.
#[derive(Clone, Debug, Default)]
pub struct Meta {
    /// arfsnic's version.
    pub version: String,
    /// When the page was written (`2026-12-05 14:03:11 UTC`), if known.
    pub written: Option<String>,
    /// The report files, in the order of `reports` (empty when they have no files).
    pub sources: Vec<String>,
}

/// `s` with `&`, `<`, `>`, `"` and `'` replaced by entities: safe as element text and
/// inside quoted attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Seconds since the epoch as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn utc(secs: u64) -> String {
    let (mut days, rem) = (secs / 86_400, secs % 86_400);
    let leap = |y: u64| (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400);
    let mut year = 1970;
    loop {
        let len = if leap(year) { 366 } else { 365 };
        if days < len {
            break;
        }
        days -= len;
        year += 1;
    }
    let feb = if leap(year) { 29 } else { 28 };
    let mut month = 1;
    for len in [31, feb, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31] {
        if days < len {
            break;
        }
        days -= len;
        month += 1;
    }
    format!("{year:04}-{month:02}-{:02} {:02}:{:02}:{:02} UTC", days + 1, rem / 3600, rem % 3600 / 60, rem % 60)
}

/// The current time for [`Meta::written`] (`None` with a clock before 1970).
pub fn now_utc() -> Option<String> {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?;
    Some(utc(d.as_secs()))
}

/// Write the page for `reports` to `path`, with this arfsnic's version and the time.
pub fn write_page(path: &Path, reports: &[Report], sources: &[String]) -> anyhow::Result<()> {
    let meta = Meta { version: env!("CARGO_PKG_VERSION").into(), written: now_utc(), sources: sources.to_vec() };
    let page = render(reports, &meta)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, page).with_context(|| format!("writing {}", path.display()))
}

/// Distinct values in order of first appearance.
fn distinct<'a>(it: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut v: Vec<&str> = Vec::new();
    for s in it {
        if !v.contains(&s) {
            v.push(s);
        }
    }
    v
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |x| x.to_string())
}

fn opt_f(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.decimals$}"))
}

/// The guest's own view of the workload (`guest.system.workload`), when it wrote one.
fn workload(run: &RunReport) -> Option<&Value> {
    run.guest.system.other.get("workload")
}

/// A run's kernel: its own, or the report's, with the guest's `uname -r` when known.
fn kernel_of(report: &Report, run: &RunReport) -> String {
    let name = run.kernel.as_deref().unwrap_or(&report.kernel);
    match run.guest.system.other.get("kernel").and_then(Value::as_str) {
        Some(uname) if !uname.is_empty() && uname != name => format!("{name} ({uname})"),
        _ => name.to_string(),
    }
}

const STYLE: &str = "\
body{font-family:sans-serif;margin:1.5em auto;max-width:1400px;padding:0 1em;color:#222}
h1{margin-bottom:.2em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}
dl.meta{display:grid;grid-template-columns:max-content auto;gap:.2em 1em}dl.meta dt{font-weight:bold}dl.meta dd{margin:0}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}
th,td{border:1px solid #ccc;padding:.2em .5em;text-align:right;white-space:nowrap}
th{background:#f0f0f0}td.t,th.t{text-align:left}
tr.degraded td{background:#fff6d5}tr.invalid td{background:#fbe0dc}
figure{margin:1em 0}figure svg{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.9em;color:#555}code{font-size:.9em;word-break:break-all}
div.wide{overflow-x:auto}details{margin:.4em 0}summary{cursor:pointer}nav a{margin-right:1em}
.note{color:#555;font-size:.9em}
";

/// The check the test reads through `--dump-dom`: every `<svg>` laid out with a
/// non-empty bounding box, and the table's row count, written on `<body>`.
const SCRIPT: &str = "\
(function () {
  function check() {
    var svgs = document.getElementsByTagName('svg');
    var rendered = 0;
    for (var i = 0; i < svgs.length; i++) {
      try {
        var b = svgs[i].getBBox();
        if (b && b.width > 0 && b.height > 0) { rendered++; }
      } catch (e) { /* not laid out: not rendered */ }
    }
    var body = document.body;
    body.setAttribute('data-svgs', String(svgs.length));
    body.setAttribute('data-svgs-rendered', String(rendered));
    body.setAttribute('data-table-rows', String(document.querySelectorAll('#steer-rate tbody tr').length));
    body.setAttribute('data-check', 'done');
  }
  check();
  window.addEventListener('load', check);
})();
";

/// The whole page for `reports`.
pub fn render(reports: &[Report], meta: &Meta) -> anyhow::Result<String> {
    let rows: Vec<Row> = reports.iter().flat_map(results::rows).collect();
    let mut h = String::new();
    let scenarios = distinct(reports.iter().map(|r| r.scenario.as_str())).join(", ");
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>arfsnic steer rate: {}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n",
        escape(&scenarios)
    );
    header(&mut h, reports, meta);
    let _ = writeln!(
        h,
        "<nav><a href=\"#table\">Steer rate</a><a href=\"#plots\">Plots</a>\
         <a href=\"#flows\">Per flow</a><a href=\"#settings\">Settings</a></nav>"
    );
    table(&mut h, reports, &rows);
    plots(&mut h, reports, &rows)?;
    flows(&mut h, reports);
    settings(&mut h, reports);
    let _ = write!(h, "<script>\n{SCRIPT}</script>\n</body>\n</html>\n");
    Ok(h)
}

fn header(h: &mut String, reports: &[Report], meta: &Meta) {
    let runs = || reports.iter().flat_map(|r| r.runs.iter().map(move |x| (r, x)));
    let kernels: Vec<String> = runs().map(|(r, x)| kernel_of(r, x)).collect();
    let kernels = distinct(kernels.iter().map(String::as_str)).join(", ");
    let topologies: Vec<String> =
        reports.iter().map(|r| format!("{} vCPUs, {} queues: {}", r.vcpus, r.queues, r.topology)).collect();
    let topologies = distinct(topologies.iter().map(String::as_str)).join("; ");
    let profiles = distinct(runs().map(|(_, x)| x.profile.as_str())).join(", ");
    let accels: Vec<String> = reports
        .iter()
        .map(|r| match &r.qemu_accel {
            Some(q) => format!("{} ({q})", r.accel),
            None => r.accel.clone(),
        })
        .collect();
    let accels = distinct(accels.iter().map(String::as_str)).join(", ");
    let _ = writeln!(h, "<header>\n<h1>arfsnic: aRFS steer rate</h1>\n<dl class=\"meta\">");
    let mut item = |k: &str, v: &str| {
        let _ = writeln!(h, "<dt>{}</dt><dd>{}</dd>", escape(k), escape(v));
    };
    item("arfsnic", &meta.version);
    item("kernel", &kernels);
    item("topology", &topologies);
    item("accel", &accels);
    item("profile", &profiles);
    item("scenarios", &distinct(reports.iter().map(|r| r.scenario.as_str())).join(", "));
    item("runs", &runs().count().to_string());
    if !meta.sources.is_empty() {
        item("reports", &meta.sources.join(", "));
    }
    item("written", meta.written.as_deref().unwrap_or("-"));
    let _ = writeln!(h, "</dl>\n</header>");
}

fn table(h: &mut String, reports: &[Report], rows: &[Row]) {
    let _ = writeln!(h, "<section id=\"table\">\n<h2>Steer rate</h2>");
    let _ = writeln!(
        h,
        "<p class=\"note\">One row per run; rates per second of traffic after the warm-up, from the \
         driver's counters (README.md, \"Reading the table\"; docs/measuring.md defines every number).</p>"
    );
    let _ = write!(h, "<div class=\"wide\">\n<table id=\"steer-rate\">\n<thead><tr>");
    for (i, c) in results::HEADER.iter().enumerate() {
        let class = if i < 2 { " class=\"t\"" } else { "" };
        let _ = write!(h, "<th{class}>{}</th>", escape(c));
    }
    let _ = writeln!(h, "</tr></thead>\n<tbody>");
    let runs = reports.iter().flat_map(|r| r.runs.iter());
    for (row, run) in rows.iter().zip(runs) {
        let reasons = run.health.as_ref().map(|x| x.reasons.join("; ")).unwrap_or_default();
        let title = if reasons.is_empty() { String::new() } else { format!(" title=\"{}\"", escape(&reasons)) };
        let _ = write!(h, "<tr class=\"{}\"{title}>", escape(&row.health));
        for (i, c) in results::cells(row).iter().enumerate() {
            let class = if i < 2 { " class=\"t\"" } else { "" };
            let _ = write!(h, "<td{class}>{}</td>", escape(c));
        }
        let _ = writeln!(h, "</tr>");
    }
    let _ = writeln!(h, "</tbody>\n</table>\n</div>");
    let groups = results::by_scenario(rows);
    let mut notes: Vec<String> = groups.iter().filter_map(|(s, g)| results::ratio_line(s, g)).collect();
    for r in reports {
        notes.extend(super::table::scenario_funccount_lines(r));
        for run in &r.runs {
            for d in &run.discarded {
                notes.push(format!(
                    "{} {}: an earlier attempt was {} and ran again: {}",
                    r.scenario,
                    run.label,
                    d.verdict.as_str(),
                    d.reasons.join("; ")
                ));
            }
            if let Some(x) = run.health.as_ref().filter(|x| !x.reasons.is_empty()) {
                notes.push(format!("{} {}: {}: {}", r.scenario, run.label, x.verdict.as_str(), x.reasons.join("; ")));
            }
        }
    }
    if !notes.is_empty() {
        let _ = writeln!(h, "<ul class=\"ratios\">");
        for n in notes {
            let _ = writeln!(h, "<li>{}</li>", escape(&n));
        }
        let _ = writeln!(h, "</ul>");
    }
    let _ = writeln!(h, "</section>");
}

fn figure(h: &mut String, svg: &str, caption: &str) {
    let _ = writeln!(h, "<figure>\n{}\n<figcaption>{}</figcaption>\n</figure>", svg.trim(), escape(caption));
}

fn plots(h: &mut String, reports: &[Report], rows: &[Row]) -> anyhow::Result<()> {
    let _ = writeln!(h, "<section id=\"plots\">\n<h2>Plots</h2>");
    let title = format!("aRFS steering rate by {SYSCTL}");
    figure(h, &super::chart::svg_chart(rows, &title)?, "Steer-C/s per run, grouped by scenario (steer-rate.svg).");
    for r in reports {
        if let Some(svg) = super::chart::per_second_chart(r)? {
            figure(
                h,
                &svg,
                &format!(
                    "{}: ndo_rx_flow_steer calls in each second of traffic (guest.per_second, the funccount -i 1 view).",
                    r.scenario
                ),
            );
        }
        if let Some(s) = super::sweep::sweep(r) {
            figure(h, &super::sweep::svg(&s)?, &format!("{}: Steer-C over the run vs rps_flow_cnt.", r.scenario));
        }
    }
    let _ = writeln!(h, "</section>");
    Ok(())
}

/// `<table>` with a header row; `cells` are escaped, the first `text_cols` left-aligned.
fn simple_table(h: &mut String, class: &str, head: &[&str], text_cols: usize, body: &[Vec<String>]) {
    let _ = write!(h, "<div class=\"wide\">\n<table class=\"{class}\">\n<thead><tr>");
    for (i, c) in head.iter().enumerate() {
        let class = if i < text_cols { " class=\"t\"" } else { "" };
        let _ = write!(h, "<th{class}>{}</th>", escape(c));
    }
    let _ = writeln!(h, "</tr></thead>\n<tbody>");
    for line in body {
        let _ = write!(h, "<tr>");
        for (i, c) in line.iter().enumerate() {
            let class = if i < text_cols { " class=\"t\"" } else { "" };
            let _ = write!(h, "<td{class}>{}</td>", escape(c));
        }
        let _ = writeln!(h, "</tr>");
    }
    let _ = writeln!(h, "</tbody>\n</table>\n</div>");
}

const FLOW_HEADER: [&str; 14] = [
    "flow",
    "tuple",
    "responses",
    "queue",
    "IRQ CPU",
    "app CPU",
    "same LLC",
    "filter",
    "filter queue",
    "filter since s",
    "via filter %",
    "queues used",
    "RSS only ms",
    "stuck",
];

fn flow_cells(f: &FlowView, run: &RunReport) -> Vec<String> {
    let rec = run.link.per_flow.iter().find(|p| p.flow == f.flow);
    let via_filter = rec.and_then(|p| {
        let delivered = p.requests.saturating_sub(p.not_delivered);
        (delivered > 0).then(|| 100.0 * p.via_filter as f64 / delivered as f64)
    });
    let yes_no = |b: bool| if b { "yes" } else { "no" }.to_string();
    vec![
        f.flow.to_string(),
        f.tuple.clone(),
        f.responses.to_string(),
        opt(f.queue),
        opt(f.irq_cpu),
        opt(f.app_cpu),
        f.same_llc.map_or("-".into(), yes_no),
        opt(f.filter),
        opt(f.filter_queue),
        opt_f(f.filter_since_s, 2),
        opt_f(via_filter, 1),
        opt(rec.map(|p| p.queue_counts.iter().filter(|n| **n > 0).count())),
        opt(f.via_rss_only_ms),
        yes_no(f.stuck_without_filter),
    ]
}

/// Per RX queue: what the device delivered (by RSS, by a filter) and the guest counted.
fn queue_table(h: &mut String, run: &RunReport) {
    let d = &run.device;
    let n = d.rx_packets_per_queue.len().max(run.guest_rx_packets_per_queue.len());
    if n == 0 {
        return;
    }
    let at = |v: &[u64], i: usize| opt(v.get(i));
    let body: Vec<Vec<String>> = (0..n)
        .map(|i| {
            vec![
                i.to_string(),
                at(&d.rx_packets_per_queue, i),
                at(&d.rss_delivered_per_queue, i),
                at(&d.filter_delivered_per_queue, i),
                at(&run.guest_rx_packets_per_queue, i),
                at(&d.tx_packets_per_queue, i),
                at(&d.rx_dropped_no_buffer_per_queue, i),
            ]
        })
        .collect();
    simple_table(
        h,
        "queues",
        &["queue", "RX packets", "via RSS", "via filter", "guest RX", "TX packets", "dropped (no buffer)"],
        0,
        &body,
    );
}

/// Per worker of the guest's echo server (`guest.system.workload.workers`).
fn worker_table(h: &mut String, run: &RunReport) {
    let Some(workers) = workload(run).and_then(|w| w.get("workers")).and_then(Value::as_array) else { return };
    if workers.is_empty() {
        return;
    }
    let field = |w: &Value, k: &str| match w.get(k) {
        Some(Value::Null) | None => "-".to_string(),
        Some(v) => v.to_string(),
    };
    let body: Vec<Vec<String>> = workers
        .iter()
        .map(|w| {
            ["worker", "flows", "start_cpu", "last_cpu", "hops", "migrations", "served"]
                .iter()
                .map(|k| field(w, k))
                .collect()
        })
        .collect();
    simple_table(
        h,
        "workers",
        &["worker", "flows", "start CPU", "last CPU", "hops", "migrations", "requests served"],
        0,
        &body,
    );
}

fn flows(h: &mut String, reports: &[Report]) {
    let _ = writeln!(h, "<section id=\"flows\">\n<h2>Per flow</h2>");
    let _ = writeln!(
        h,
        "<p class=\"note\">Each flow at the end of the run as device and guest saw it (report field \
         <code>flows</code>, joined with the link partner's <code>link.per_flow</code>), then per RX queue \
         and per worker of the guest's echo server.</p>"
    );
    for r in reports {
        for run in &r.runs {
            let stuck = run.flows.iter().filter(|f| f.stuck_without_filter).count();
            let filtered = run.flows.iter().filter(|f| f.filter.is_some()).count();
            let cross = run.flows.iter().filter(|f| f.same_llc == Some(false)).count();
            let summary = match run.flows.len() {
                0 => format!("{} {}: no per-flow records", r.scenario, run.label),
                n => format!(
                    "{} {}: {n} flows, {filtered} with a filter, {cross} served in another LLC than their IRQ CPU, {stuck} stuck",
                    r.scenario, run.label
                ),
            };
            let _ = writeln!(h, "<details class=\"run\" open>\n<summary>{}</summary>", escape(&summary));
            if run.flows.is_empty() {
                let _ = writeln!(
                    h,
                    "<p class=\"note\">This report holds no per-flow records (committed results are kept \
                     without them); the closest view it has is per RX queue and per worker below. \
                     <code>arfsnic run --json</code> and <code>demo</code> keep them.</p>"
                );
            } else {
                let body: Vec<Vec<String>> = run.flows.iter().map(|f| flow_cells(f, run)).collect();
                simple_table(h, "flows", &FLOW_HEADER, 2, &body);
            }
            queue_table(h, run);
            worker_table(h, run);
            let _ = writeln!(h, "</details>");
        }
    }
    let _ = writeln!(h, "</section>");
}

fn kv(h: &mut String, items: &[(&str, String)]) {
    let _ = writeln!(h, "<dl class=\"meta\">");
    for (k, v) in items {
        let _ = writeln!(h, "<dt>{}</dt><dd>{}</dd>", escape(k), escape(v));
    }
    let _ = writeln!(h, "</dl>");
}

fn sysctl_list(m: &std::collections::BTreeMap<String, String>) -> String {
    if m.is_empty() {
        return "-".into();
    }
    m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
}

fn settings(h: &mut String, reports: &[Report]) {
    let _ = writeln!(h, "<section id=\"settings\">\n<h2>Settings</h2>");
    for r in reports {
        let _ = writeln!(h, "<h3>{}</h3>", escape(&r.scenario));
        let first = r.runs.first();
        let wl = first.and_then(workload);
        let llc = wl.and_then(|w| w.get("llc_groups")).map_or("-".to_string(), Value::to_string);
        let host = first.and_then(|x| x.host.as_ref()).map_or("-".to_string(), |x| x.host_cores.to_string());
        let state = match (&r.interrupted, r.complete) {
            (Some(sig), _) => format!("stopped by {sig}"),
            (None, true) => "complete".into(),
            (None, false) => "incomplete".into(),
        };
        kv(
            h,
            &[
                ("kernel", r.kernel.clone()),
                ("kernel image", r.kernel_image.display().to_string()),
                ("accel", r.qemu_accel.clone().map_or_else(|| r.accel.clone(), |q| format!("{} ({q})", r.accel))),
                ("vCPUs", r.vcpus.to_string()),
                ("topology", r.topology.clone()),
                ("LLC groups (guest)", llc),
                ("queues", r.queues.to_string()),
                ("host cores", host),
                ("wall time", format!("{:.1} s", r.wall_s)),
                ("report", state),
            ],
        );
        let body: Vec<Vec<String>> = r
            .runs
            .iter()
            .map(|run| {
                let cfg = workload(run).and_then(|w| w.get("config"));
                let c = |k: &str| {
                    cfg.and_then(|c| c.get(k))
                        .map_or("-".to_string(), |v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
                };
                let d = run.driver();
                let load = run.offered_load.as_ref().map_or("-".to_string(), |l| {
                    if l.chosen_pps == l.requested_pps {
                        l.chosen_pps.to_string()
                    } else {
                        format!("{} of {}", l.chosen_pps, l.requested_pps)
                    }
                });
                let read_back = &run.guest.system.sysctls;
                vec![
                    run.label.clone(),
                    run.profile.clone(),
                    kernel_of(r, run),
                    sysctl_list(&run.sysctls),
                    sysctl_list(read_back),
                    opt(run.rps_flow_cnt),
                    opt_f(run.duration_s, 1),
                    opt_f(d.and_then(|d| d.rates_from_s), 1),
                    run.link.flows.to_string(),
                    load,
                    c("pattern"),
                    c("period_ms"),
                    c("workers"),
                    run.boot_attempts.to_string(),
                    run.health.as_ref().map_or("-", |x| x.verdict.as_str()).to_string(),
                ]
            })
            .collect();
        simple_table(
            h,
            "settings",
            &[
                "run",
                "profile",
                "kernel",
                "sysctls set",
                "sysctls read back",
                "rps_flow_cnt",
                "traffic s",
                "rates from s",
                "flows",
                "requests/s",
                "pattern",
                "hop period ms",
                "workers",
                "boots",
                "health",
            ],
            5,
            &body,
        );
        for run in &r.runs {
            if let Some(cmdline) = run.guest.system.other.get("cmdline").and_then(Value::as_str) {
                let _ = writeln!(
                    h,
                    "<p class=\"note\">{} guest command line: <code>{}</code></p>",
                    escape(&run.label),
                    escape(cmdline)
                );
            }
            if let Some(l) = run.offered_load.as_ref().filter(|l| !l.reason.is_empty()) {
                let _ = writeln!(h, "<p class=\"note\">{} offered load: {}</p>", escape(&run.label), escape(&l.reason));
            }
        }
    }
    let _ = writeln!(h, "</section>");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(rel: &str) -> Report {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
        Report::load(&p, "report").unwrap()
    }

    fn demo() -> Vec<Report> {
        vec![load("docs/results/demo-7.3/llc-within.json"), load("docs/results/demo-7.3/llc-across.json")]
    }

    fn meta() -> Meta {
        Meta { version: "9.9.9".into(), written: Some(utc(0)), sources: vec!["a.json".into(), "b.json".into()] }
    }

    /// The text between `<tag` … `</tag>` of the element whose opening tag contains `attr`.
    fn element<'a>(page: &'a str, tag: &str, attr: &str) -> &'a str {
        let open = if attr.is_empty() { format!("<{tag}>") } else { format!("<{tag} {attr}") };
        let i = page.find(&open).unwrap_or_else(|| panic!("no {open}"));
        let close = format!("</{tag}>");
        let j = page[i..].find(&close).unwrap();
        &page[i..i + j + close.len()]
    }

    #[test]
    fn escaping_covers_markup_and_quotes() {
        assert_eq!(escape("<a href=\"x\">'&'</a>"), "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
        assert_eq!(escape("plain 7.3.4 ü"), "plain 7.3.4 ü");
        // A report whose names hold markup: none of it reaches the page as markup.
        let mut r = load("emulator/tests/data/report-v1.json");
        r.scenario = "<script>alert(1)</script>".into();
        r.kernel = "k\"><img src=x onerror=alert(2)>".into();
        r.kernel_image = "/tmp/<b>bz</b>".into();
        r.runs[0].label = "run<&>".into();
        r.runs[0].profile = "p'q".into();
        r.runs[0].sysctls.insert(SYSCTL.into(), "<1>".into());
        let page = render(&[r], &meta()).unwrap();
        assert_eq!(page.matches("<script").count(), 1, "only the page's own check script");
        assert!(!page.contains("<img") && !page.contains("<b>bz"), "unescaped markup in the page");
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(page.contains("k&quot;&gt;&lt;img src=x onerror=alert(2)&gt;"));
        assert!(page.contains("/tmp/&lt;b&gt;bz&lt;/b&gt;"));
        assert!(page.contains("run&lt;&amp;&gt;") && page.contains("p&#39;q"));
    }

    #[test]
    fn the_table_has_one_row_per_run_with_the_text_tables_cells() {
        let reports = demo();
        let page = render(&reports, &meta()).unwrap();
        let table = element(&page, "table", "id=\"steer-rate\"");
        let runs: usize = reports.iter().map(|r| r.runs.len()).sum();
        assert_eq!(runs, 4);
        assert_eq!(table.matches("<tr class=").count(), runs, "{table}");
        assert_eq!(table.matches("</th>").count(), results::HEADER.len());
        // The same numbers as the text table (docs/results.md, demo-7.3).
        let rows: Vec<Row> = reports.iter().flat_map(results::rows).collect();
        for (row, line) in rows.iter().zip(table.split("<tr class=").skip(1)) {
            for c in results::cells(row) {
                assert!(line.contains(&format!(">{}</td>", escape(&c))), "{c} not in {line}");
            }
        }
        assert!(table.contains("<td>320.2</td>") && table.contains("<td>5872.7</td>"));
        assert!(page.contains("llc-within: Steer-C/s at sysctl=1 is 0.0% of sysctl=0 (0.0 vs 320.2 calls/s)"));
    }

    #[test]
    fn every_plot_is_inlined() {
        let reports = demo();
        let page = render(&reports, &meta()).unwrap();
        let plots = element(&page, "section", "id=\"plots\"");
        // The bar chart plus one per-second chart per scenario, nothing else drawn.
        assert_eq!(page.matches("<svg").count(), 3);
        assert_eq!(plots.matches("<svg").count(), 3);
        assert_eq!(plots.matches("</svg>").count(), 3);
        assert!(plots.contains("aRFS steering rate by net.core.arfs_llc_affinity"));
        for s in ["llc-within: steer calls per second", "llc-across: steer calls per second"] {
            assert!(plots.contains(s), "no {s}");
        }
        assert!(plots.contains("sysctl=0 (arfs_llc_affinity=0)") && plots.contains("rates from 2.0 s"));
        // Self-contained: nothing is fetched.
        for s in ["src=", "<link", "href=\"http", "url(", "@import"] {
            assert!(!page.contains(s), "page holds {s}");
        }
        // A sweep report gets its curve too.
        let sweep = load("docs/results/sweep/rps-flow-cnt-sweep.json");
        let page = render(std::slice::from_ref(&sweep), &meta()).unwrap();
        assert!(page.contains("Steer-C vs rps_flow_cnt"));
    }

    #[test]
    fn header_and_settings_name_the_setup() {
        let page = render(&demo(), &meta()).unwrap();
        let header = element(&page, "header", "");
        for s in [
            "<dd>9.9.9</dd>",
            "patched-7.3 (7.3.4)",
            "4 vCPUs, 4 queues: sockets=2 dies=1 cores=2 threads=1 cpu=max",
            "<dd>mlx5-cx6</dd>",
            "tcg (tcg,thread=single)",
            "<dd>a.json, b.json</dd>",
            "<dd>1970-01-01 00:00:00 UTC</dd>",
        ] {
            assert!(header.contains(s), "header lacks {s}: {header}");
        }
        let settings = element(&page, "section", "id=\"settings\"");
        for s in ["net.core.arfs_llc_affinity=1", "hop-within-llc", "hop-across-llc", "[[0,1],[2,3]]", "<td>200</td>"] {
            assert!(settings.contains(s), "settings lack {s}");
        }
        assert!(settings.contains("arfs.pattern=hop-within-llc"), "guest command line");
    }

    #[test]
    fn per_flow_view_or_the_closest_the_report_has() {
        // Committed reports are kept without flows: per queue and per worker instead.
        let page = render(&demo(), &meta()).unwrap();
        let flows = element(&page, "section", "id=\"flows\"");
        assert_eq!(flows.matches("no per-flow records").count(), 4 * 2);
        assert_eq!(flows.matches("<table class=\"queues\">").count(), 4);
        assert_eq!(flows.matches("<table class=\"workers\">").count(), 4);
        assert!(!flows.contains("<table class=\"flows\">"));
        // A report with flows gets a table per run, one row per flow.
        let r = load("emulator/tests/data/report-v1.json");
        let n = r.runs[0].flows.len();
        assert!(n > 0);
        let page = render(std::slice::from_ref(&r), &meta()).unwrap();
        let t = element(&page, "table", "class=\"flows\"");
        assert_eq!(t.matches("<tr>").count(), n + 1, "{t}");
        assert!(t.contains("<td class=\"t\">udp 10.99.0.1:9000 10.99.0.2:7000</td>"), "{t}");
        let f = FlowView { stuck_without_filter: true, ..r.runs[0].flows[0].clone() };
        let cells = flow_cells(&f, &r.runs[0]);
        assert_eq!(cells.len(), FLOW_HEADER.len());
        assert_eq!(cells.last().unwrap(), "yes");
    }

    #[test]
    fn the_check_script_writes_its_result_on_body() {
        let page = render(&demo(), &meta()).unwrap();
        let script = &page[page.rfind("<script>").unwrap()..];
        for s in ["getBBox", "data-svgs-rendered", "data-table-rows", "#steer-rate tbody tr", "data-check"] {
            assert!(script.contains(s), "{s}");
        }
        assert!(page.trim_end().ends_with("</html>"));
    }

    #[test]
    fn dates_are_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_700_000_000), "2023-11-14 22:13:20 UTC");
        assert_eq!(utc(4_102_444_799), "2099-12-31 23:59:59 UTC");
    }

    #[test]
    fn write_page_creates_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/index.html");
        write_page(&p, &demo(), &[]).unwrap();
        let page = std::fs::read_to_string(&p).unwrap();
        assert!(page.starts_with("<!DOCTYPE html>") && page.contains(env!("CARGO_PKG_VERSION")));
        assert!(!page.contains("<dt>reports</dt>"));
    }
}
