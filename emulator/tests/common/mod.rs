//! Shared by the end-to-end test files: run `arfsnic run` on a scenario and read the
//! typed report.

#![allow(dead_code)]

use arfsnic::report::Report;
use std::path::PathBuf;
use std::process::Command;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Write `toml` (and `extra_files`, e.g. profiles it names) into a temp dir, run it, and
/// return the report. Logs go to `.cache/e2e/<name>/`.
pub fn run_scenario(name: &str, toml: &str, extra_files: &[(&str, String)]) -> Report {
    let dir = tempfile::tempdir().unwrap();
    for (f, text) in extra_files {
        std::fs::write(dir.path().join(f), text).unwrap();
    }
    let scen = dir.path().join(format!("scenario-{name}.toml"));
    std::fs::write(&scen, toml).unwrap();
    // The report stays next to the serial logs for a look after a failure.
    let logdir = root().join(".cache/e2e").join(name);
    std::fs::create_dir_all(&logdir).unwrap();
    let out = logdir.join("report.json");
    let o = Command::new(env!("CARGO_BIN_EXE_arfsnic"))
        .args(["run", "--quiet", "--scenario"])
        .arg(&scen)
        .arg("--json")
        .arg(&out)
        .arg("--logdir")
        .arg(&logdir)
        .current_dir(root())
        .output()
        .unwrap();
    // Exit code 3: the report was written, but a run did not reach `ok` (the callers
    // that require health assert it on the report).
    assert!(
        o.status.success() || (o.status.code() == Some(3) && out.is_file()),
        "arfsnic run {name} failed:\n{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    println!("{}", String::from_utf8_lossy(&o.stdout));
    if !o.status.success() {
        println!("{}", String::from_utf8_lossy(&o.stderr));
    }
    Report::load(&out, "report").unwrap()
}

/// A guest hook's output split into its steps: each step prints `== <name>`, the
/// command's output and `rc=<status>`. Step name → (output, rc).
pub fn hook_steps(output: &str) -> Vec<(String, String, i32)> {
    let mut out: Vec<(String, String, i32)> = Vec::new();
    for line in output.lines() {
        if let Some(name) = line.strip_prefix("== ") {
            out.push((name.to_string(), String::new(), -1));
        } else if let (Some(rc), Some(last)) = (line.strip_prefix("rc="), out.last_mut()) {
            last.2 = rc.trim().parse().unwrap();
        } else if let Some(last) = out.last_mut() {
            last.1 += line;
            last.1.push('\n');
        }
    }
    out
}

/// Whether this process runs as root (the tap and namespace tests need it).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0")))
        .unwrap_or(false)
}

/// Run iproute2's `ip` with `args`; a failure fails the test with ip's message.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running `ip` (iproute2 must be installed)");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// Model mode against fresh VM reports (docs/model.md, "Fidelity"): the twin replays
/// each healthy run's boot slots from its rule dump, and every Steer-C/s, Add/s, Del/s and
/// stuck-flow cell, pooled over the reports, must agree within its tolerance. `scenario`
/// names the file of configs/scenarios/ the reports were run from (they may carry another
/// name). Returns the disagreements and the table.
fn twin_against(reports: &[Report], scenario: &str) -> (Vec<String>, String) {
    use arfsnic::twin::{fidelity, load_twin_profile};
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<_> = reports
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let path = dir.path().join(format!("vm{i}.json"));
            let mut r = r.clone();
            r.scenario = scenario.to_string();
            std::fs::write(&path, r.to_json_pretty()).unwrap();
            path
        })
        .collect();
    let twin = load_twin_profile("tcg", &root()).unwrap();
    let (cells, skipped) = fidelity::compare(&root(), &paths, 8, twin).unwrap();
    let table = fidelity::markdown(&cells, &skipped, 8);
    println!("model mode against {} run(s):\n{table}", reports.len());
    assert!(!cells.is_empty(), "no run of the reports compared:\n{table}");
    (fidelity::disagreements(&cells), table)
}

pub fn assert_twin_agrees(r: &Report, scenario: &str) {
    let (bad, table) = twin_against(std::slice::from_ref(r), scenario);
    assert!(bad.is_empty(), "the twin disagrees with the VM:\n  {}\n{table}", bad.join("\n  "));
}

/// [`assert_twin_agrees`], where one VM run is one draw: a report the twin disagrees with
/// is followed by a second run of the scenario (`rerun`), and the two are judged pooled,
/// never by the better of them. A guest whose rule works ran late for a stretch of the
/// run can sit 15 % from the twin that replays those delays (CI: llc-within on 7.3, VM
/// 305.4 Steer-C/s, twin 258.8; 317.5 without the delays; docs/model.md, "Open").
pub fn assert_twin_agrees_or_rerun(r: &Report, scenario: &str, rerun: impl FnOnce() -> Report) {
    let (bad, _) = twin_against(std::slice::from_ref(r), scenario);
    if bad.is_empty() {
        return;
    }
    println!("the twin disagrees with this run ({}); a second run, judged pooled with the first", bad.join("; "));
    let (bad, table) = twin_against(&[r.clone(), rerun()], scenario);
    assert!(bad.is_empty(), "the twin disagrees with the VM, two runs pooled:\n  {}\n{table}", bad.join("\n  "));
}
