//! End-to-end tests of the guest aRFS path: the `arfs_virtio` module in stock Debian
//! 7.3 (trixie-backports; the module built in a trixie chroot against its headers),
//! 6.12 and 6.1 guests, steering through the in-band control protocol. Ignored by a
//! plain `cargo test`; `guest-tests/run-tests.sh` runs them with `--ignored`.

mod common;

use arfsnic::report::Report;
use common::{root, run_scenario};

/// The steer scenario: 4 vCPUs as 2 LLCs, 4 queues, RFS configured, workers hopping
/// across LLCs, the module loaded.
fn steer_toml(kernel: &str, duration: u32) -> String {
    std::fs::read_to_string(root().join("configs/scenarios/steer.toml"))
        .unwrap()
        .replace("kernel = \"debian-6.12\"", &format!("kernel = \"{kernel}\""))
        .replace("duration_s = 10", &format!("duration_s = {duration}"))
}

fn check_steering(r: &Report) {
    let run = &r.runs[0];
    let g = run.driver().expect("the guest module must have reported STATS");
    let f = &run.device.filter.summary;
    assert!(run.guest.module);
    assert!(g.steer_calls > 0, "steer_calls: {g:?}");
    assert!(f.adds > 0, "device adds: {f:?}");
    assert_eq!(run.link.lost, 0);
    assert_eq!(run.device.flows_misdelivered, 0);
    assert!(run.device.flows_compared_with_guest > 0);
    // Guest and device agree on completed commands; the last STATS frame may be up to
    // 100 ms old, so allow the few commands that can complete in that time.
    for (gk, gv, dk, dv) in [
        ("adds_ok", g.adds_ok, "adds", f.adds),
        ("mods_ok", g.mods_ok, "mods", f.mods),
        ("dels_ok", g.dels_ok, "dels", f.dels),
    ] {
        let (gv, dv) = (gv as i64, dv as i64);
        assert!((gv - dv).abs() <= 4, "{gk} {gv} (guest) vs {dk} {dv} (device)");
    }
    // Per flow: once a filter was installed, the flow's packets were steered by it.
    // The link partner records the filter that steered each flow's last packet; a flow
    // with a live filter must show that filter, unless its ADD completed after the last
    // packet (then no packet could use it). Together with flows_misdelivered == 0 (the
    // guest received every flow's last packet on the queue the device chose) this checks
    // steering end to end.
    let mut steered = 0;
    for fl in &run.flows {
        let Some(id) = fl.filter else { continue };
        let lf = &run.link.per_flow[fl.flow as usize];
        match lf.last_filter {
            Some(last) if last == id => steered += 1,
            // Another filter steered the last packet: the live one must have been
            // installed after the traffic ended (the old rule expired, a new ADD landed).
            Some(_) => {
                let since = fl.filter_since_s.unwrap();
                let end = run.duration_s.unwrap();
                assert!(since >= end - 0.1, "flow {fl:?}: last packet steered by another filter ({lf:?})");
            }
            // Its live filter was installed after the flow's last packet.
            None => {}
        }
    }
    assert!(steered > 0, "no flow was steered by its live filter at the end");
    assert!(run.device.filter_delivered > 0);
}

#[test]
#[ignore = "needs QEMU 10 and guest kernels: run through guest-tests/run-tests.sh"]
fn steering_on_debian_6_12() {
    check_steering(&run_scenario("arfs-6.12", &steer_toml("debian-6.12", 8), &[]));
}

/// The newest stock Debian kernel (7.3 from trixie-backports), the module built the way
/// a Debian 13 user builds it (guest-tests/kernel/debian-kernel.sh).
#[test]
#[ignore = "needs root, QEMU 10 and the trixie kernel: run through guest-tests/run-tests.sh"]
fn steering_on_debian_7_3() {
    let r = run_scenario("arfs-7.3", &steer_toml("debian-7.3", 8), &[]);
    assert_eq!(r.kernel, "debian-7.3");
    assert!(r.kernel_image.to_string_lossy().contains("+deb13-amd64"), "{}", r.kernel_image.display());
    check_steering(&r);
}

#[test]
#[ignore = "needs QEMU 10 and guest kernels: run through guest-tests/run-tests.sh"]
fn steering_on_debian_6_1() {
    check_steering(&run_scenario("arfs-6.1", &steer_toml("debian-6.1", 8), &[]));
}

fn profile_with(extra: &str) -> String {
    let base = std::fs::read_to_string(root().join("configs/mlx5-cx6.toml")).unwrap();
    let base = base.replace("name = \"mlx5-cx6\"", "name = \"test\"");
    format!("{base}\n{extra}")
}

/// With a fixed 50 us ADD latency the driver waits at least that long.
#[test]
#[ignore = "needs QEMU 10 and guest kernels: run through guest-tests/run-tests.sh"]
fn driver_sees_the_device_latency() {
    let prof = profile_with("")
        .replace("add = { dist = \"lognormal\", median_us = 40, sigma = 0.5 }", "add = { dist = \"fixed\", us = 50 }");
    assert!(prof.contains("us = 50 }"));
    let t = steer_toml("debian-6.12", 6).replace("profile = \"mlx5-cx6\"", "profile = \"lat50.toml\"");
    let r = run_scenario("lat50", &t, &[("lat50.toml", prof)]);
    let run = &r.runs[0];
    assert!(run.device.filter.summary.cmd_latency_us_p50 >= 50.0);
    // The driver's p50 lies in a log2 bucket; its lower edge must be >= 50 us.
    let p50 = run.driver().unwrap().cmd_latency_us_p50.unwrap();
    assert!(p50.lo_us >= 50.0, "driver-observed p50 bucket {p50:?}");
}

/// 30 % of ADDs fail with ENOSPC: the driver counts exactly the device's rejects.
#[test]
#[ignore = "needs QEMU 10 and guest kernels: run through guest-tests/run-tests.sh"]
fn enospc_counts_agree() {
    let prof = profile_with("")
        .replace("[faults]\ndisabled = false", "[faults]\nadd = { rate = 0.3, errno = \"ENOSPC\" }\ndisabled = false");
    assert!(prof.contains("ENOSPC"));
    let t = steer_toml("debian-6.12", 6).replace("profile = \"mlx5-cx6\"", "profile = \"enospc.toml\"");
    let r = run_scenario("enospc", &t, &[("enospc.toml", prof)]);
    let run = &r.runs[0];
    let dev = run.device.filter.summary.add_rejects["ENOSPC"];
    let guest = run.driver().unwrap().add_errors["ENOSPC"];
    assert!(dev > 0);
    assert_eq!(guest, dev, "guest ENOSPC count vs device rejects");
}

/// `rmmod` under load: no BUG/WARN in the guest, and the module's FLUSH empties the
/// device table.
#[test]
#[ignore = "needs QEMU 10 and guest kernels: run through guest-tests/run-tests.sh"]
fn rmmod_under_load_is_clean() {
    // An RSS context is left for the unload: the module removes it from the device and
    // from the ethtool core (virtio_net, whose ops come back, has no context ops).
    let hook = "#!/bin/sh\nethtool -X \"$1\" context new equal 2\n";
    let t =
        steer_toml("debian-6.12", 8).replace("module = true", "module = true\nrmmod_at_s = 4\nhook = \"ctx-hook.sh\"");
    let r = run_scenario("rmmod", &t, &[("ctx-hook.sh", hook.to_string())]);
    let run = &r.runs[0];
    let h = &run.guest.system.other["hook"];
    assert!(h.to_string().contains("New RSS context is 1"), "hook: {h}");
    assert_eq!(run.device.rss_contexts, 0, "the module's RSS context is still on the device after rmmod");
    let sys = &run.guest.system;
    assert_eq!(sys.dmesg_warnings, 0, "guest kernel log: {}", sys.dmesg_warnings);
    let rm = sys.rmmod.join("; ");
    assert!(rm.contains("ok") && !rm.contains("failed"), "rmmod: {rm}");
    assert!(run.device.filter.summary.adds > 0, "steering happened before the unload");
    assert_eq!(run.device.filter.summary.rules_now, 0, "device table after unload");
    assert!(run.link.responses > 0);
}

/// After the load stops (and RFS lets go of the flows), the driver expires every rule
/// and the device table ends empty, with guest and device agreeing.
#[test]
#[ignore = "needs QEMU 10 and guest kernels: run through guest-tests/run-tests.sh"]
fn rules_expire_after_the_load() {
    let t = steer_toml("debian-6.12", 6).replace("module = true", "module = true\nexpire_after_load_s = 4");
    let r = run_scenario("expire", &t, &[]);
    let run = &r.runs[0];
    let f = &run.device.filter.summary;
    let g = run.driver().unwrap();
    assert!(f.adds > 0);
    assert_eq!(f.rules_now, 0, "device table after the load: {f:?}");
    assert_eq!(g.rules_now, 0, "driver's table after the load");
    assert_eq!(g.dels_ok, f.dels);
}
