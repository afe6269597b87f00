//! TCP end to end on the patched 7.3 kernel (v11 as posted) with the arfs_virtio module:
//! the link partner's smoltcp connections into the guest's `arfs-echo --proto tcp`
//! (configs/scenarios/tcp-rr.toml, tcp-crr.toml; docs/scenarios.md, "TCP"). Ignored by a
//! plain `cargo test`; guest-tests/run-tests.sh runs them with `--ignored`.

mod common;

use arfsnic::report::{Report, RunReport};
use common::{root, run_scenario};

const SYSCTL: &str = "net.core.arfs_llc_affinity";

fn scenario(name: &str) -> Report {
    let text = std::fs::read_to_string(root().join(format!("configs/scenarios/{name}.toml"))).unwrap();
    run_scenario(name, &text, &[])
}

fn steer_rate(run: &RunReport) -> f64 {
    run.driver().and_then(|d| d.steer_calls_per_s).unwrap_or_else(|| panic!("no steer rate in {}", run.label))
}

#[test]
#[ignore = "boots QEMU with the patched 7.3 kernel; run by guest-tests/run-tests.sh"]
fn tcp_rr_pooled_connections_under_work_stealing_steer_at_both_settings() {
    let r = scenario("tcp-rr");
    let mut rates = Vec::new();
    for run in &r.runs {
        let tcp = run.link.tcp.as_ref().unwrap_or_else(|| panic!("{}: no link.tcp", run.label));
        println!(
            "{}: {} connections, {} responses ({:.0}/s), RTT p50 {} us p99 {} us, {} retransmits, Steer-C {:.1}/s, Add {:?}/s, guest accepted {}",
            run.label,
            tcp.established,
            run.link.responses,
            run.link.responses_per_s,
            run.link.rtt_us_p50,
            run.link.rtt_us_p99,
            tcp.retransmits,
            steer_rate(run),
            run.driver().and_then(|d| d.adds_per_s),
            run.guest.system.other["workload"]["tcp"]["accepted"],
        );
        assert_eq!((tcp.established, tcp.connect_errors, tcp.resets), (64, 0, 0), "{}: {tcp:?}", run.label);
        assert!(run.link.responses > 1000, "{}: too little traffic: {:?}", run.label, run.link);
        assert_eq!(run.link.bad_responses, 0);
        assert_eq!(
            run.guest.system.other["workload"]["tcp"]["accepted"], 64,
            "{}: the guest accepted every connection",
            run.label
        );
        // Every connection is a flow the module steers: its rule is for the TCP 4-tuple.
        assert!(run.flows.iter().all(|f| f.tuple.starts_with("tcp ")), "{}", run.label);
        assert!(run.device.filter.summary.adds > 0, "{}: no filter was added", run.label);
        rates.push((run.sysctls.get(SYSCTL).cloned().unwrap_or_default(), steer_rate(run)));
    }
    let of = |v: &str| rates.iter().find(|(s, _)| s == v).map(|r| r.1).unwrap();
    let (s0, s1) = (of("0"), of("1"));
    println!("tcp-rr Steer-C/s: sysctl=0 {s0:.1}, sysctl=1 {s1:.1} ({:.0} % fewer)", 100.0 * (1.0 - s1 / s0));
    assert!(s0 > 0.0 && s1 > 0.0, "connections moving between CPUs must steer, across LLCs with the sysctl on too");
    // Work stealing over 4 CPUs in 2 LLCs moves a third of the connections' CPU changes
    // inside an LLC, and UDP loses about that share with the sysctl on (brpc-like: 1476 ->
    // 974/s). TCP, measured: 502.8 -> 479.4/s, MODs 5152 vs 4982: the cause is open
    // (docs/results.md, "TCP"), so the ratio is printed, not asserted.
}

#[test]
#[ignore = "boots QEMU with the patched 7.3 kernel; run by guest-tests/run-tests.sh"]
fn tcp_crr_filters_come_and_go_without_leaks() {
    let r = scenario("tcp-crr");
    let run = &r.runs[0];
    let tcp = run.link.tcp.as_ref().expect("link.tcp");
    let d = run.driver().expect("the module reported");
    let ft = run.filter_table.as_ref().expect("filter_table");
    println!(
        "tcp-crr: {} connections ({} completed, {} cut at stop, {} errors, {} no free socket), connect p50 {} us, CRR p50 {} us p99 {} us, \
         Add {:?}/s Del {:?}/s, filter table peak {} end {}, {} rules gone {:?}/{:?}/{:?} ms (p50/p90/max) after their last packet, module rules {} (peak {})",
        tcp.connects,
        tcp.crr_completed,
        tcp.cut_at_stop,
        tcp.connect_errors,
        tcp.no_free_socket,
        tcp.connect_us_p50,
        tcp.crr_us_p50,
        tcp.crr_us_p99,
        d.adds_per_s,
        d.dels_per_s,
        ft.peak,
        ft.at_end,
        ft.gone,
        ft.gone_after_last_packet_ms_p50,
        ft.gone_after_last_packet_ms_p90,
        ft.gone_after_last_packet_ms_max,
        d.rules_now,
        d.rules_peak,
    );
    assert!(tcp.connects >= 1500, "300 connections/s for 10 s: {tcp:?}");
    assert_eq!((tcp.connect_errors, tcp.resets, tcp.no_free_socket), (0, 0, 0), "{tcp:?}");
    // The drain waits for handshakes and responses, so a connection is cut at the stop only
    // if the guest kept it waiting past the drain.
    assert_eq!(
        tcp.crr_completed + tcp.cut_at_stop,
        tcp.connects,
        "every connection did its request and closed: {tcp:?}"
    );
    assert!(tcp.cut_at_stop * 100 <= tcp.connects, "more than 1 % cut at the stop: {tcp:?}");
    let w = &run.guest.system.other["workload"]["tcp"];
    assert_eq!(w["accepted"].as_u64(), Some(tcp.established), "{w}");
    assert_eq!(w["open_at_end"], 0, "{w}");
    // Connections steer and get filters, which are deleted as their flows expire.
    assert!(d.adds_ok > 0 && d.dels_ok > 0, "{d:?}");
    assert!(ft.gone > 0 && ft.peak > 0);
    // No leak: after the expiry wait nothing is live, so neither the device's table nor the
    // module holds a rule.
    assert_eq!(ft.at_end, 0, "rules left in the device after the expiry wait: {:?}", ft.rules.last());
    assert_eq!(d.rules_now, 0, "rules left in the module after the expiry wait");
}

#[test]
#[ignore = "boots QEMU with the patched 7.3 kernel; run by guest-tests/run-tests.sh"]
fn tcp_rr_workers_hopping_inside_their_llc_stop_steering_with_the_sysctl() {
    // tcp-rr with workers hopping inside their own LLC every 200 ms instead of stealing:
    // every move stays in an LLC, so the sysctl must remove (nearly) every steer, as for UDP.
    let text = std::fs::read_to_string(root().join("configs/scenarios/tcp-rr.toml")).unwrap();
    let text = text
        .replace("name = \"tcp-rr\"", "name = \"tcp-rr-within\"")
        .replace("pattern = \"work-stealing\"", "pattern = \"hop-within-llc\"\nperiod_ms = 200");
    let r = run_scenario("tcp-rr-within", &text, &[]);
    let of = |v: &str| {
        let run = r.runs.iter().find(|x| x.sysctls.get(SYSCTL).map(String::as_str) == Some(v)).unwrap();
        assert!(run.link.responses > 1000, "{}: {:?}", run.label, run.link);
        assert_eq!(run.link.tcp.as_ref().map(|t| (t.established, t.resets)), Some((64, 0)), "{}", run.label);
        steer_rate(run)
    };
    let (s0, s1) = (of("0"), of("1"));
    println!("tcp-rr, hop-within-llc: Steer-C/s {s0:.1} -> {s1:.1}");
    assert!(s0 >= 20.0, "hops must steer with the sysctl off: {s0:.1}/s");
    assert!(s1 <= 0.05 * s0, "moves inside an LLC must stop steering with the sysctl on: {s0:.1} -> {s1:.1}");
}
