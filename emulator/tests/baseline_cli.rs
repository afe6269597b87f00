//! `arfsnic compare` and `arfsnic results`: small synthetic reports, written as the typed
//! report serialises, then bent where a test needs a broken file.

use arfsnic::report::schema::{DriverReport, GuestReport};
use arfsnic::report::{Report, RunReport, SCHEMA_VERSION};
use arfsnic::traffic::partner::LinkStats;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn arfsnic(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_arfsnic")).args(args).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// One run as `arfsnic run --json` writes it.
fn run(label: &str, steer_per_s: f64) -> Value {
    let r = RunReport {
        label: label.into(),
        sysctls: [("net.core.arfs_llc_affinity".to_string(), "0".to_string())].into_iter().collect(),
        profile: "mlx5-cx6".into(),
        link: LinkStats {
            requests: 20022,
            responses: 20022,
            rtt_us_p50: 485.0,
            rtt_us_p99: 73215.0,
            responses_per_s: 1999.9,
            ..Default::default()
        },
        guest: GuestReport {
            module: true,
            driver: Some(DriverReport {
                steer_calls_per_s: Some(steer_per_s),
                adds_per_s: Some(4.9),
                mods_per_s: Some(12.0),
                dels_per_s: Some(0.1),
                lock_contended_pct: 3.9,
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

fn report(scenario: &str, runs: Vec<Value>) -> Value {
    let r = Report {
        schema_version: SCHEMA_VERSION,
        scenario: scenario.into(),
        kernel: "patched-6.12".into(),
        accel: "tcg".into(),
        queues: 4,
        complete: true,
        ..Default::default()
    };
    let mut v = serde_json::to_value(r).unwrap();
    v["runs"] = Value::Array(runs);
    v
}

fn write(dir: &Path, name: &str, v: &Value) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_string_pretty(v).unwrap()).unwrap();
    p
}

/// `arfsnic compare --baseline B --report A [extra...]`.
fn compare(base: &Value, cur: &Value, extra: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let b = write(dir.path(), "baseline.json", base);
    let a = write(dir.path(), "report.json", cur);
    let mut args = vec!["compare", "--baseline", b.to_str().unwrap(), "--report", a.to_str().unwrap()];
    args.extend_from_slice(extra);
    arfsnic(&args)
}

fn baseline() -> Value {
    report("llc-within", vec![run("sysctl=0", 680.0), run("sysctl=1", 100.0)])
}

#[test]
fn identical_reports_pass() {
    let o = compare(&baseline(), &baseline(), &[]);
    assert!(o.status.success(), "{o:?}");
    let out = stdout(&o);
    assert!(out.contains("guest.steer_calls_per_s"), "{out}");
    // No lock_wait_us_per_s (no rate window): listed as skipped.
    assert!(out.contains("skipped: sysctl=0/guest.lock_wait_us_per_s, sysctl=1/guest.lock_wait_us_per_s"), "{out}");
}

#[test]
fn steer_rate_increase_beyond_max_regress_fails() {
    let cur = report("llc-within", vec![run("sysctl=0", 680.0), run("sysctl=1", 150.0)]);
    let o = compare(&baseline(), &cur, &["--max-regress", "10"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let err = stderr(&o);
    assert!(err.contains("run sysctl=1: guest.steer_calls_per_s 100 -> 150 (+50.0%)"), "{err}");
    assert!(!err.contains("sysctl=0"), "{err}");
    assert!(stdout(&o).contains("REGRESSED"), "{o:?}");

    // The same change is allowed with a larger percentage.
    let o = compare(&baseline(), &cur, &["--max-regress", "60"]);
    assert!(o.status.success(), "{o:?}");
}

#[test]
fn increase_under_the_floor_passes() {
    // 3.7 -> 4.1 Steer-C/s: +11 %, but 0.4/s is under the 10/s floor.
    let base = report("llc-within", vec![run("sysctl=1", 3.7)]);
    let cur = report("llc-within", vec![run("sysctl=1", 4.1)]);
    let o = compare(&base, &cur, &["--max-regress", "10"]);
    assert!(o.status.success(), "{o:?}");
}

#[test]
fn missing_run_label_fails_naming_it() {
    let cur = report("llc-within", vec![run("sysctl=0", 680.0)]);
    let o = compare(&baseline(), &cur, &[]);
    assert!(!o.status.success(), "{o:?}");
    let err = stderr(&o);
    assert!(err.contains("\"sysctl=1\""), "{err}");
}

#[test]
fn mismatched_scenario_fails() {
    let cur = report("llc-across", vec![run("sysctl=0", 680.0), run("sysctl=1", 100.0)]);
    let o = compare(&baseline(), &cur, &[]);
    assert!(!o.status.success(), "{o:?}");
    let err = stderr(&o);
    assert!(err.contains("llc-within") && err.contains("llc-across"), "{err}");
}

#[test]
fn bad_inputs_name_the_file_field_or_flag() {
    let dir = tempfile::tempdir().unwrap();
    let good = write(dir.path(), "report.json", &baseline());
    let good = good.to_str().unwrap();

    let broken = dir.path().join("broken.json");
    std::fs::write(&broken, "{ \"scenario\": ").unwrap();
    let o = arfsnic(&["compare", "--baseline", broken.to_str().unwrap(), "--report", good]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("baseline") && stderr(&o).contains("broken.json"), "{o:?}");

    let mut v = baseline();
    v["runs"][1].as_object_mut().unwrap().remove("label");
    let nolabel = write(dir.path(), "nolabel.json", &v);
    let o = arfsnic(&["compare", "--baseline", nolabel.to_str().unwrap(), "--report", good]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("nolabel.json") && stderr(&o).contains("`runs[1]`: missing field `label`"), "{o:?}");

    // A report of another schema version is refused by name.
    let mut v = baseline();
    v["schema_version"] = 7.into();
    let other = write(dir.path(), "v7.json", &v);
    let o = arfsnic(&["compare", "--baseline", other.to_str().unwrap(), "--report", good]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("v7.json: schema_version 7, this arfsnic reads version 1"), "{o:?}");

    let o = arfsnic(&["compare", "--baseline", good, "--report", good, "--max-regress=-5"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("'--max-regress <PCT>': expected a percentage >= 0"), "{o:?}");
    let o = arfsnic(&["compare", "--baseline", good, "--report", good, "--max-regress", "lots"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--max-regress"), "{o:?}");

    // `run --max-regress` without `--baseline` is a usage error (clap, before anything runs;
    // the scenario does not exist either, so nothing could start).
    let o = arfsnic(&["run", "--scenario", "no-such-scenario.toml", "--max-regress", "10"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(stderr(&o).contains("--baseline"), "{o:?}");
}

/// `arfsnic results` prints the table of report files and regenerates a document's
/// marked section from them.
#[test]
fn results_prints_and_updates_a_document() {
    let dir = tempfile::tempdir().unwrap();
    let mut v = baseline();
    v["runs"][1]["sysctls"]["net.core.arfs_llc_affinity"] = "1".into();
    let r = write(dir.path(), "llc-within.json", &v);
    let r = r.to_str().unwrap();
    let o = arfsnic(&["results", r]);
    assert!(o.status.success(), "{o:?}");
    assert!(stdout(&o).contains("llc-within: Steer-C/s at sysctl=1 is"), "{o:?}");
    let o = arfsnic(&["results", "--markdown", r]);
    assert!(stdout(&o).starts_with("| scenario | sysctl | Steer-C/s |"), "{o:?}");

    let doc = dir.path().join("doc.md");
    std::fs::write(&doc, "# t\n<!-- results:demo -->\nold\n<!-- /results:demo -->\ntail\n").unwrap();
    let o = arfsnic(&["results", "--markdown", "--update", doc.to_str().unwrap(), "--name", "demo", r]);
    assert!(o.status.success(), "{o:?}");
    let text = std::fs::read_to_string(&doc).unwrap();
    assert!(text.starts_with("# t\n<!-- results:demo -->\n<!-- generated by `arfsnic results`"), "{text}");
    assert!(
        !text.contains("old")
            && text.contains("| llc-within | 0 | 680.0 |")
            && text.ends_with("<!-- /results:demo -->\ntail\n"),
        "{text}"
    );
    let o = arfsnic(&["results", "--update", doc.to_str().unwrap(), "--name", "other", r]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no <!-- results:other --> ... <!-- /results:other --> markers"), "{o:?}");
}

/// `run --bisect` stops the bisect (128) when the fault is not the commit's: usage
/// errors (which clap would report with 2, "bad" to `git bisect run`), a metric name
/// that does not exist, a tree that is no kernel tree. No VM is started.
#[test]
fn bisect_stops_on_errors_that_are_not_the_commits() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let scenario = root.join("configs/scenarios/llc-bisect.toml");
    let scenario = scenario.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let base = write(dir.path(), "base.json", &report("llc-bisect", vec![run("sysctl=1", 0.5)]));
    let base = base.to_str().unwrap();
    let not_a_tree = dir.path().to_str().unwrap();

    // `arfsnic run --bisect --scenario S --kdir DIR` and `extra`: exit code and stderr.
    let bisect = |extra: &[&str]| {
        let mut a = vec!["run", "--bisect", "--scenario", scenario, "--kdir", not_a_tree];
        a.extend_from_slice(extra);
        let o = arfsnic(&a);
        (o.status.code(), stderr(&o))
    };

    let (code, e) = bisect(&[]);
    assert_eq!(code, Some(128), "{e}");
    assert!(e.contains("--baseline"), "{e}");

    let (code, e) = bisect(&["--baseline", base, "--bisect-on", "guest.nosuch"]);
    assert_eq!(code, Some(128), "{e}");
    assert!(e.contains("unknown metric \"guest.nosuch\"; valid: guest.steer_calls_per_s"), "{e}");

    let (code, e) = bisect(&["--baseline", base]);
    assert_eq!(code, Some(128), "{e}");
    assert!(e.contains("not a kernel source tree") && e.contains("bisect: stop the bisect (exit 128)"), "{e}");

    let other = write(dir.path(), "other.json", &report("llc-within", vec![run("sysctl=1", 0.5)]));
    let (code, e) = bisect(&["--baseline", other.to_str().unwrap()]);
    assert_eq!(code, Some(128), "{e}");
    assert!(e.contains("is for scenario \"llc-within\""), "{e}");

    // Without --bisect a usage error stays clap's 2.
    let o = arfsnic(&["run", "--scenario", scenario, "--bisect-on", "guest.adds_per_s"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
}
