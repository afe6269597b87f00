//! The `arfs_lock` contention curve: one scenario (configs/scenarios/contention.toml, an
//! LLC-sized unit of CPUs) scaled to 4 … 256 CPUs at constant per-CPU load, every run of
//! it (kernel × `net.core.arfs_llc_affinity`) in the twin, and per point the lock's
//! contended share of acquisitions and the time spent waiting for it.
//!
//! Scaling keeps per CPU what the unit has per CPU: workers, connections, requests/s, and
//! one work-stealing pod per LLC. RX queues grow with the CPUs up to the scenario
//! limit (64, IRQs on CPUs 0–63, as in seed-testbed.toml). Below one unit the CPUs
//! must divide it (one LLC, fewer cores).

use super::{run_scenario, Options, TwinError, LLC_SYSCTL};
use crate::report::schema::Report;
use crate::runner::scenario::Scenario;
use std::path::Path;

/// The CPU counts of the curve.
pub const CPUS: [u32; 5] = [4, 16, 64, 128, 256];

/// RX queues stop growing here (the scenario limit).
pub const MAX_QUEUES: u32 = 64;

/// Dies (LLCs) per socket before a second socket is added, as on the seed's machine.
pub const DIES_PER_SOCKET: u32 = 8;

/// One run of the scaled scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub cpus: u32,
    pub queues: u16,
    pub kernel: String,
    pub sysctl: String,
    pub steer_per_s: f64,
    pub contended_pct: f64,
    /// Summed over the CPUs that waited.
    pub wait_us_per_s: f64,
    pub wall_s: f64,
}

/// `base` (one LLC-sized unit: one socket, one die) scaled to `cpus` CPUs.
pub fn scale(base: &Scenario, cpus: u32) -> Result<Scenario, TwinError> {
    let v = &base.vm;
    if v.sockets != 1 || v.dies != 1 || base.guest.pods != 1 || base.guest.pattern != "work-stealing" {
        return Err(TwinError::field(
            "vm",
            "the curve's base is one LLC: sockets = 1, dies = 1, guest.pods = 1, guest.pattern = \"work-stealing\"",
        ));
    }
    let unit = v.vcpus;
    let mut s = base.clone();
    let per_cpu = |n: u32, what: &str| -> Result<u32, TwinError> {
        let scaled = u64::from(n) * u64::from(cpus);
        if !scaled.is_multiple_of(u64::from(unit)) {
            return Err(TwinError::field(what, format!("{n} per {unit} CPUs does not scale to {cpus} CPUs")));
        }
        u32::try_from(scaled / u64::from(unit)).map_err(|_| TwinError::field(what, "too large"))
    };
    if cpus >= unit {
        if !cpus.is_multiple_of(unit) {
            return Err(TwinError::field("--cpus", format!("{cpus} is not a multiple of the LLC size {unit}")));
        }
        let llcs = cpus / unit;
        let sockets = llcs.div_ceil(DIES_PER_SOCKET);
        if !llcs.is_multiple_of(sockets) {
            return Err(TwinError::field("--cpus", format!("{llcs} LLCs do not split evenly over {sockets} sockets")));
        }
        (s.vm.sockets, s.vm.dies) = (sockets, llcs / sockets);
        s.guest.pods = llcs;
    } else {
        if !unit.is_multiple_of(cpus) || !cpus.is_multiple_of(v.threads) {
            return Err(TwinError::field(
                "--cpus",
                format!(
                    "{cpus} CPUs: below the LLC size {unit} the count must divide it in whole cores of {}",
                    v.threads
                ),
            ));
        }
        s.vm.cores = cpus / v.threads;
    }
    s.vm.vcpus = cpus;
    s.guest.workers = per_cpu(base.guest.workers, "guest.workers")?;
    s.traffic.flows = per_cpu(base.traffic.flows, "traffic.flows")?;
    s.traffic.rate_pps = per_cpu(base.traffic.rate_pps, "traffic.rate_pps")?;
    s.nic.queues = per_cpu(u32::from(base.nic.queues), "nic.queues")?.min(MAX_QUEUES) as u16;
    s.name = format!("{}-{cpus}", base.name);
    s.validate().map_err(|e| TwinError::field(&e.field, e.message))?;
    Ok(s)
}

/// One scaled scenario per CPU count, each run of it separately (so the runs can go to
/// different cores): (CPUs, single-run scenario).
pub fn jobs(base: &Scenario, cpus: &[u32]) -> Result<Vec<(u32, Scenario)>, TwinError> {
    let mut out = Vec::new();
    for &n in cpus {
        let s = scale(base, n)?;
        for run in s.runs() {
            let mut one = s.clone();
            one.runs = vec![run];
            out.push((n, one));
        }
    }
    Ok(out)
}

/// The point of a one-run twin report.
pub fn point(cpus: u32, r: &Report) -> Option<Point> {
    let run = r.runs.first()?;
    let d = run.driver()?;
    let wait = d.lock_wait_us_per_s.unwrap_or(0.0);
    Some(Point {
        cpus,
        queues: r.queues,
        kernel: run.kernel.clone().unwrap_or_default(),
        sysctl: run.sysctls.get(LLC_SYSCTL).cloned().unwrap_or_else(|| "-".into()),
        steer_per_s: d.steer_calls_per_s.unwrap_or(0.0),
        contended_pct: d.lock_contended_pct_window.unwrap_or(0.0),
        wait_us_per_s: wait,
        wall_s: r.wall_s,
    })
}

/// Run one job in the twin.
pub fn run_job(root: &Path, scenario_dir: &Path, cpus: u32, s: &Scenario, opts: &Options) -> anyhow::Result<Point> {
    let r = run_scenario(s, root, scenario_dir, opts)?;
    point(cpus, &r).ok_or_else(|| anyhow::anyhow!("{}: the twin's report has no driver numbers", s.name))
}

/// The whole curve, its runs spread over the machine's cores (rayon); points in the order
/// of `cpus`, then of the scenario's runs.
pub fn curve(
    root: &Path,
    scenario_dir: &Path,
    base: &Scenario,
    cpus: &[u32],
    opts: &Options,
) -> anyhow::Result<Vec<Point>> {
    use rayon::prelude::*;
    let jobs = jobs(base, cpus)?;
    jobs.par_iter().map(|(n, s)| run_job(root, scenario_dir, *n, s, opts)).collect()
}

/// The curve as a markdown table: a row per CPU count, a column per run (kernel and
/// sysctl), each cell "contended % · lock wait ms/s (summed over the CPUs) · Steer-C/s".
pub fn markdown(points: &[Point]) -> String {
    let mut series: Vec<(String, String)> = Vec::new();
    for p in points {
        let k = (p.kernel.clone(), p.sysctl.clone());
        if !series.contains(&k) {
            series.push(k);
        }
    }
    let mut cpus: Vec<u32> = points.iter().map(|p| p.cpus).collect();
    cpus.dedup();
    let mut out = String::from("| CPUs | RX queues |");
    for (k, v) in &series {
        out.push_str(&format!(" {k}, sysctl {v} |"));
    }
    out.push_str("\n|---:|---:|");
    out.push_str(&"---:|".repeat(series.len()));
    out.push('\n');
    for n in cpus {
        let queues = points.iter().find(|p| p.cpus == n).map_or(0, |p| p.queues);
        out.push_str(&format!("| {n} | {queues} |"));
        for (k, v) in &series {
            match points.iter().find(|p| p.cpus == n && &p.kernel == k && &p.sysctl == v) {
                Some(p) => out.push_str(&format!(
                    " {:.1} % · {:.1} ms/s · {:.0}/s |",
                    p.contended_pct,
                    p.wait_us_per_s / 1000.0,
                    p.steer_per_s
                )),
                None => out.push_str(" – |"),
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Scenario {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        Scenario::load(&root.join("configs/scenarios/contention.toml")).unwrap()
    }

    #[test]
    fn scaling_keeps_the_per_cpu_load_and_one_pod_per_llc() {
        let b = base();
        let unit = b.vm.vcpus;
        for n in CPUS {
            let s = scale(&b, n).unwrap();
            assert_eq!(s.vm.vcpus, n);
            assert_eq!(s.vm.sockets * s.vm.dies * s.vm.cores * s.vm.threads, n);
            assert_eq!(u64::from(s.traffic.rate_pps) * u64::from(unit), u64::from(b.traffic.rate_pps) * u64::from(n));
            assert_eq!(s.guest.workers, n);
            assert_eq!(s.guest.pods, (n / unit).max(1));
            assert_eq!(u32::from(s.nic.queues), n.min(MAX_QUEUES));
            let topo = super::super::topology(&s).unwrap();
            assert_eq!(topo.groups.len() as u32, s.guest.pods, "{n}: one pod per LLC");
        }
        assert_eq!(scale(&b, 256).unwrap().vm.sockets, 2);
    }

    #[test]
    fn counts_that_do_not_scale_name_the_field() {
        let b = base();
        assert_eq!(scale(&b, 24).unwrap_err().field, "--cpus");
        assert_eq!(scale(&b, 3).unwrap_err().field, "--cpus");
        let mut two = b.clone();
        two.vm.dies = 2;
        assert_eq!(scale(&two, 64).unwrap_err().field, "vm");
    }
}
