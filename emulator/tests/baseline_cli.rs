//! `arfsnic compare`: a report against a baseline, on small synthetic reports.

use serde_json::{json, Value};
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

/// One run as `arfsnic run --json` writes it (the fields the comparison reads, plus a few).
fn run(label: &str, steer_per_s: f64) -> Value {
    json!({
        "label": label,
        "sysctls": { "net.core.arfs_llc_affinity": "0" },
        "profile": "mlx5-cx6",
        "link": {
            "requests": 20022, "responses": 20022, "lost": 0,
            "rtt_us_p50": 485.0, "rtt_us_p99": 73215.0, "responses_per_s": 1999.9
        },
        "guest": {
            "module": true,
            "steer_calls_per_s": steer_per_s, "adds_per_s": 4.9, "mods_per_s": 12.0, "dels_per_s": 0.1,
            "add_errors": {}, "lock_contended_pct": 3.9
        },
        "device": { "flows_misdelivered": 0, "rx_dropped_no_buffer": 0, "flows_compared_with_guest": 64 },
        "flows_stuck_without_filter": 0
    })
}

fn report(scenario: &str, runs: Vec<Value>) -> Value {
    json!({ "scenario": scenario, "kernel": "patched-6.12", "accel": "tcg", "queues": 4, "runs": runs })
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
    // lock_wait_us_per_s is absent (an older report): listed as skipped.
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
    assert!(stderr(&o).contains("nolabel.json") && stderr(&o).contains("runs[1].label"), "{o:?}");

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
