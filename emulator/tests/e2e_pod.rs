//! The seed's shape on the emulated NIC (configs/scenarios/brpc-pod*.toml): 16 vCPUs, a
//! brpc-shaped TCP server (16 pinned workers stealing 512 pooled connections from one
//! shared one-shot epoll set), the patched 7.3 with net.core.arfs_llc_affinity at 0 and 1.
//! A connection's next worker is a random other CPU, so the share of moves that stay in
//! an LLC follows from the topology the guest reports: sum over LLC groups of
//! L(L-1) / N(N-1). With the sysctl on exactly those stop steering, so the Steer-C
//! reduction must match that share within 5 points (2 LLCs of 8: 7/15 = 46.7 %; a pair
//! outside is followed by a second, judged pooled with the first), and with the pod in one
//! LLC be >= 99 % (the seed: ~200 000 -> ~10 /s). docs/results.md, "TCP".
//! Ignored by a plain `cargo test`; guest-tests/run-tests.sh runs it with `--ignored`.

mod common;

use arfsnic::report::schema::Verdict;
use arfsnic::report::{Report, RunReport};
use arfsnic::runner::health::degraded_by_delay_only;
use common::{root, run_scenario};

const SYSCTL: &str = "net.core.arfs_llc_affinity";

fn scenario(name: &str) -> Report {
    let text = std::fs::read_to_string(root().join(format!("configs/scenarios/{name}.toml"))).unwrap();
    run_scenario(name, &text, &[])
}

fn run_with<'a>(r: &'a Report, v: &str) -> &'a RunReport {
    r.runs.iter().find(|x| x.sysctls.get(SYSCTL).map(String::as_str) == Some(v)).unwrap()
}

/// The share of moves to a uniformly random other CPU that stay in the LLC, from the
/// guest's LLC groups.
fn within_llc_share(run: &RunReport) -> f64 {
    let groups = run.guest.system.other["workload"]["llc_groups"].as_array().expect("llc_groups").clone();
    let sizes: Vec<f64> = groups.iter().map(|g| g.as_array().map_or(0, Vec::len) as f64).collect();
    let n: f64 = sizes.iter().sum();
    sizes.iter().map(|l| l * (l - 1.0)).sum::<f64>() / (n * (n - 1.0))
}

/// Steer-C/s at sysctl 0 and 1, and the predicted reduction; every run healthy, every
/// connection up.
fn check(name: &str) -> (f64, f64, f64) {
    let r = scenario(name);
    for run in &r.runs {
        let h = run.health.as_ref().expect("health verdict");
        // 16 vCPUs share one TCG thread: the vCPU that runs the driver's rule work is
        // sometimes left waiting, and a run's steer-to-command delay crosses 50 ms in
        // attempt after attempt (a fresh clone: 163, 474, 421 and 190 ms). The steer calls
        // are counted when the kernel makes them, so such a run still counts them; it is
        // taken, said so, when that delay (under the 250 ms that makes a run invalid) is
        // its only reason. Anything else is not.
        match h.verdict {
            Verdict::Ok => {}
            _ if degraded_by_delay_only(h) => println!("{name} {}: taken though degraded: {:?}", run.label, h.reasons),
            _ => panic!("{name} {}: {:?}: {:?}", run.label, h.verdict, h.reasons),
        }
        let tcp = run.link.tcp.as_ref().expect("link.tcp");
        assert_eq!((tcp.established, tcp.resets), (512, 0), "{name} {}: {tcp:?}", run.label);
    }
    // Steer calls per offered request: when the guest falls behind in the warm-up the
    // link partner offers one run less (`offered_load`), and per second the two runs
    // would then compare different loads. At equal loads this is Steer-C/s over a constant.
    let rate = |v: &str| {
        let run = run_with(&r, v);
        let per_s = run.driver().and_then(|d| d.steer_calls_per_s).expect("steer rate");
        let o = run.offered_load.as_ref().expect("offered load");
        if o.chosen_pps != o.requested_pps {
            println!(
                "{name} {}: offered {} requests/s, not the scenario's {}: Steer-C/s scaled by the ratio",
                run.label, o.chosen_pps, o.requested_pps
            );
        }
        per_s * o.requested_pps as f64 / o.chosen_pps.max(1) as f64
    };
    let (s0, s1) = (rate("0"), rate("1"));
    let share = within_llc_share(run_with(&r, "0"));
    println!(
        "{name}: Steer-C/s at the scenario's rate {s0:.1} -> {s1:.1} ({:.1} % fewer), within-LLC share of moves predicted {:.1} %",
        100.0 * (1.0 - s1 / s0),
        100.0 * share
    );
    (s0, s1, share)
}

#[test]
#[ignore = "boots QEMU with 16 vCPUs and the patched 7.3 kernel; run by guest-tests/run-tests.sh"]
fn brpc_pod_in_one_llc_loses_its_steers_as_in_the_seed() {
    let (s0, s1, share) = check("brpc-pod-1llc");
    assert_eq!(share, 1.0, "one LLC: every move stays in it");
    assert!(s0 >= 100.0, "work stealing over 16 CPUs must steer with the sysctl off: {s0:.1}/s");
    assert!(s1 <= 0.01 * s0, "the seed's >= 99 %: {s0:.1} -> {s1:.1}");
}

/// How far the measured Steer-C reduction may sit from the within-LLC share of moves.
/// Over 11 pairs measured here (docs/results.md) the reduction spread 44.8–51.8 % around a
/// mean of 47.7 % (σ ≈ 2.1 points): the kernel's re-steer gate and TCG's timing move it,
/// not counting noise (~5 000 steers a run). A flow judged against the wrong CPU would
/// land at the across-LLC share (53.3 %), a patch without effect at 0 %.
const TOLERANCE: f64 = 0.05;

#[test]
#[ignore = "boots QEMU with 16 vCPUs and the patched 7.3 kernel; run by guest-tests/run-tests.sh"]
fn brpc_pod_in_two_llcs_loses_the_within_llc_share() {
    let (mut s0, mut s1, share) = check("brpc-pod");
    assert!((share - 7.0 / 15.0).abs() < 1e-9, "2 LLCs of 8: {share}");
    assert!(s0 >= 100.0, "{s0:.1}/s");
    if ((1.0 - s1 / s0) - share).abs() > TOLERANCE {
        // One pair is one sample of a spread of σ ≈ 2 points (CI once measured 40.0 %):
        // a pair outside the tolerance is followed by a second one, and the two are judged
        // together (their steers pooled), never by the better of them.
        println!("brpc-pod: outside {:.0} points; a second pair, judged pooled with the first", 100.0 * TOLERANCE);
        let (t0, t1, _) = check("brpc-pod");
        (s0, s1) = (s0 + t0, s1 + t1);
    }
    let reduction = 1.0 - s1 / s0;
    assert!(
        (reduction - share).abs() <= TOLERANCE,
        "the Steer-C reduction {:.1} % must match the within-LLC share of moves {:.1} % within {:.0} points",
        100.0 * reduction,
        100.0 * share,
        100.0 * TOLERANCE
    );
}
