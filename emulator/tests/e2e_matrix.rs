//! The topology matrix (docs/results.md, "Topology matrix"): the LLC-affinity patch on
//! 3, 4, 6, 8 and 16 vCPUs in 1 to 4 LLCs (sockets x cores), workers hopping inside their
//! LLC and across LLCs every 400 ms (160 flow moves/s whatever the vCPU count), 64 flows
//! at 1000 requests/s, net.core.arfs_llc_affinity at 0 and 1, at CI size on a 2-core host.
//! Every run must be healthy (`ok`), hops inside an LLC must lose >= 95 % of their steer
//! calls with the sysctl on, hops across LLCs must keep theirs within 25 %. Shape and
//! health only: no timing. Ignored by a plain `cargo test`; `guest-tests/run-tests.sh`
//! runs it with `--ignored` after building the patched kernel.
//!
//! `ARFSNIC_MATRIX_OUT=DIR` copies each scenario's report into DIR (docs/results/matrix/
//! holds the committed ones the docs' table is generated from).

mod common;

use arfsnic::report::schema::Verdict;
use arfsnic::report::{Report, RunReport};
use common::run_scenario;

const SYSCTL: &str = "net.core.arfs_llc_affinity";

/// (vCPUs, sockets, cores per socket): one LLC per socket.
const TOPOLOGIES: [(u32, u32, u32); 5] = [(3, 1, 3), (4, 2, 2), (6, 3, 2), (8, 4, 2), (16, 4, 4)];

fn scenario_text(name: &str, (vcpus, sockets, cores): (u32, u32, u32), pattern: &str) -> String {
    let queues = vcpus.min(16);
    format!(
        r#"name = "{name}"
description = "topology matrix: {vcpus} vCPUs as {sockets} sockets x {cores} cores ({sockets} LLCs), {pattern}"
kernel = "patched-7.3"
profile = "mlx5-cx6"
duration_s = 6
warmup_s = 2

[vm]
vcpus = {vcpus}
sockets = {sockets}
cores = {cores}
memory_mb = 1024
accel = "auto"

[nic]
queues = {queues}

[traffic]
flows = 64
rate_pps = 1000
mode = "open"

[guest]
workers = {vcpus}
pattern = "{pattern}"
period_ms = 400
module = true

[[runs]]
label = "sysctl=0"
sysctls = {{ "{SYSCTL}" = "0" }}

[[runs]]
label = "sysctl=1"
sysctls = {{ "{SYSCTL}" = "1" }}
"#
    )
}

fn steer(r: &Report, v: &str) -> f64 {
    let run: &RunReport = r
        .runs
        .iter()
        .find(|x| x.sysctls.get(SYSCTL).map(String::as_str) == Some(v))
        .unwrap_or_else(|| panic!("{}: no run with {SYSCTL}={v}", r.scenario));
    run.driver().and_then(|d| d.steer_calls_per_s).unwrap_or_else(|| panic!("{}: no steer rate", r.scenario))
}

#[test]
#[ignore = "needs QEMU 10 and the patched kernel: run through guest-tests/run-tests.sh"]
fn topology_matrix_is_healthy_and_keeps_its_shape() {
    let out = std::env::var_os("ARFSNIC_MATRIX_OUT").map(std::path::PathBuf::from);
    let mut lines = Vec::new();
    let mut failures = Vec::new();
    for topo in TOPOLOGIES {
        let (vcpus, sockets, _) = topo;
        // Hops across LLCs need two of them, hops inside one need two CPUs in it.
        let patterns: &[&str] = if sockets == 1 { &["hop-within-llc"] } else { &["hop-within-llc", "hop-across-llc"] };
        for pattern in patterns {
            let within = *pattern == "hop-within-llc";
            let name = format!("matrix-{vcpus}cpu-{sockets}llc-{}", if within { "within" } else { "across" });
            let r = run_scenario(&name, &scenario_text(&name, topo, pattern), &[]);
            if let Some(dir) = &out {
                std::fs::create_dir_all(dir).unwrap();
                std::fs::write(dir.join(format!("{name}.json")), r.to_json_pretty()).unwrap();
            }
            for run in &r.runs {
                let h = run.health.as_ref().expect("every run has a health verdict");
                if h.verdict != Verdict::Ok {
                    failures.push(format!("{name} {}: {} ({})", run.label, h.verdict.as_str(), h.reasons.join("; ")));
                }
            }
            let (s0, s1) = (steer(&r, "0"), steer(&r, "1"));
            let ratio = if s0 > 0.0 { s1 / s0 } else { f64::NAN };
            lines.push(format!("{name}: Steer-C/s {s0:.1} -> {s1:.1} ({:.1}%)", 100.0 * ratio));
            if s0 < 20.0 {
                failures.push(format!("{name}: hops must steer with the sysctl off: {s0:.1}/s"));
            } else if within && ratio > 0.05 {
                failures.push(format!("{name}: sysctl=1 must cut Steer-C/s by >= 95%: {s1:.1} vs {s0:.1}"));
            } else if !within && !(0.75..=1.25).contains(&ratio) {
                failures.push(format!("{name}: sysctl=1 must stay within 25% of sysctl=0: {s1:.1} vs {s0:.1}"));
            }
        }
    }
    println!("topology matrix:\n  {}", lines.join("\n  "));
    assert!(failures.is_empty(), "topology matrix:\n  {}", failures.join("\n  "));
}
