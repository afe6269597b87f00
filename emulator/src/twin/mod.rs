//! Model mode (`arfsnic model`): a discrete-event twin of the guest's RFS/aRFS path that
//! runs a scenario without QEMU. The kernel side (`rfs.rs`) follows `net/core/dev.c` of
//! 6.12 and 7.3 with the v11 LLC skip; the driver (`driver.rs`) follows our guest module,
//! itself shaped as mlx5's `en_arfs.c`; the device is the real `model` code — RSS, the
//! filter table and the command engine with the profile's latency — not a copy. It writes
//! the same typed report as a VM run (`mode = "model"`), so `results` and `compare` read
//! it unchanged. docs/model.md: what is modelled, what is not, and how far it agrees with
//! the VM.
//!
//! Layering: beside the runner; it reads scenarios through `runner::scenario` and writes
//! `report::schema`.

pub mod contention;
pub mod driver;
pub mod fidelity;
pub mod rfs;
pub mod sim;
pub mod topo;

use crate::model::profile::Profile;
use crate::report::schema::{DeviceReport, DriverReport, GuestReport, PerSecond, Report, RunReport, SCHEMA_VERSION};
use crate::runner::scenario::{LoopMode, Scenario};
use driver::{Driver, TwinProfile};
use rfs::KernelRfs;
use sim::{Pattern, Proto, RunSpec, Sample};
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use topo::{L3Per, Topology};

/// A scenario the twin cannot run as written: the field and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TwinError {
    pub field: String,
    pub message: String,
}

impl TwinError {
    pub fn field(field: &str, message: impl Into<String>) -> TwinError {
        TwinError { field: field.into(), message: message.into() }
    }
}

impl fmt::Display for TwinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for TwinError {}

/// What `arfsnic model` takes besides the scenario.
#[derive(Clone, Debug)]
pub struct Options {
    pub seed: u64,
    pub twin: TwinProfile,
}

impl Default for Options {
    fn default() -> Self {
        Options { seed: 1, twin: TwinProfile::default() }
    }
}

/// A twin profile by name (`tcg` → configs/twin/tcg.toml) or path, checked.
pub fn load_twin_profile(spec: &str, root: &Path) -> anyhow::Result<TwinProfile> {
    let path = if spec.contains('/') || spec.ends_with(".toml") {
        std::path::PathBuf::from(spec)
    } else {
        root.join("configs/twin").join(format!("{spec}.toml"))
    };
    if !path.is_file() {
        anyhow::bail!("--twin {spec}: {} not found (a name in configs/twin/ or a path to a TOML file)", path.display());
    }
    let p: TwinProfile = crate::model::profile::load_toml(&path)?;
    p.validate().map_err(|(f, m)| anyhow::anyhow!("{}: {f}: {m}", path.display()))?;
    Ok(p)
}

/// The sysctl of the v11 patch.
pub const LLC_SYSCTL: &str = "net.core.arfs_llc_affinity";

/// The topology of a scenario's VM.
pub fn topology(s: &Scenario) -> Result<Topology, TwinError> {
    let v = &s.vm;
    let l3 = L3Per::parse("vm.l3_per", v.l3_per.as_deref())?;
    Topology::new(v.sockets, v.dies, v.cores, v.threads, l3, s.nic.queues, v.numa == "socket")
}

/// A run's label, its sysctls and what the twin runs.
pub type LabelledRun = (String, BTreeMap<String, String>, RunSpec);

/// The runs of a scenario as the twin runs them; every key that would change a VM run's
/// outcome and that the twin does not model is an error naming it.
pub fn run_specs(s: &Scenario, seed: u64) -> Result<Vec<LabelledRun>, TwinError> {
    let t = &s.traffic;
    let g = &s.guest;
    if t.mode != LoopMode::Open {
        return Err(TwinError::field("traffic.mode", "closed loop is not modelled yet (open only)"));
    }
    if t.pattern != "rr" {
        return Err(TwinError::field(
            "traffic.pattern",
            format!("{:?} is not modelled yet (rr: UDP flows or pooled TCP connections)", t.pattern),
        ));
    }
    let proto = match g.proto.as_str() {
        "udp" => Proto::Udp,
        "tcp" => Proto::Tcp,
        p => return Err(TwinError::field("guest.proto", format!("{p:?} is not udp or tcp"))),
    };
    let pattern = match g.pattern.as_str() {
        "none" => Pattern::None,
        "hop-within-llc" => Pattern::HopWithinLlc,
        "hop-across-llc" => Pattern::HopAcrossLlc,
        "work-stealing" => Pattern::WorkStealing,
        p => {
            return Err(TwinError::field(
                "guest.pattern",
                format!("{p:?} is not modelled yet (none, hop-within-llc, hop-across-llc, work-stealing)"),
            ))
        }
    };
    for (k, v) in [
        ("guest.hook", g.hook.is_some()),
        ("guest.rmmod_at_s", g.rmmod_at_s.is_some()),
        ("guest.expire_after_load_s", g.expire_after_load_s.is_some()),
        ("guest.module_params", !g.module_params.is_empty()),
        ("vm.remote", s.vm.remote),
    ] {
        if v {
            return Err(TwinError::field(k, "not modelled: the twin would silently run a different scenario"));
        }
    }
    if g.workers == 0 {
        return Err(TwinError::field("guest.workers", "must be at least 1"));
    }
    if s.duration_s <= 0.0 || s.warmup_s < 0.0 || s.warmup_s >= s.duration_s {
        return Err(TwinError::field("warmup_s", "needs 0 <= warmup_s < duration_s"));
    }
    let mut out = Vec::new();
    for (i, run) in s.runs().iter().enumerate() {
        let kname = s.kernel_for(run);
        let kernel = KernelRfs::of_kernel(kname).ok_or_else(|| {
            TwinError::field(
                &format!("runs[{i}].kernel"),
                format!("{kname:?}: the twin models 6.10-6.15 (as 6.12), 6.16-6.17 and >= 6.18 (as 7.3)"),
            )
        })?;
        let sysctls = s.sysctls_for(run);
        let mut llc_skip = false;
        for (k, v) in &sysctls {
            if k != LLC_SYSCTL {
                return Err(TwinError::field(&format!("runs[{i}].sysctls"), format!("{k} is not modelled")));
            }
            if !kname.starts_with("patched") {
                return Err(TwinError::field(
                    &format!("runs[{i}].sysctls"),
                    format!("{k} exists only in patched kernels, not {kname}"),
                ));
            }
            llc_skip = match v.as_str() {
                "0" => false,
                "1" => true,
                o => return Err(TwinError::field(&format!("runs[{i}].sysctls.{k}"), format!("{o:?} is not 0 or 1"))),
            };
        }
        let flow_cnt = s.rps_flow_cnt_for(run);
        for (f, n) in [("guest.rps_flow_cnt", flow_cnt), ("guest.rps_sock_flow_entries", g.rps_sock_flow_entries)] {
            if n != 0 && !n.is_power_of_two() {
                return Err(TwinError::field(f, format!("{n} is not a power of two")));
            }
        }
        out.push((
            run.label.clone(),
            sysctls,
            RunSpec {
                proto,
                kernel,
                llc_skip,
                arfs: g.module,
                flows: t.flows,
                rate_pps: f64::from(t.rate_pps),
                payload: t.payload,
                workers: g.workers,
                pods: g.pods,
                pattern,
                period_ns: u64::from(g.period_ms.max(1)) * 1_000_000,
                sock_entries: g.rps_sock_flow_entries,
                flow_cnt,
                duration_ns: (s.duration_s * 1e9) as u64,
                warmup_ns: (s.warmup_s * 1e9) as u64,
                seed: seed.wrapping_add(i as u64),
                slots: Vec::new(),
                reread: None,
                work_delays: Vec::new(),
                hop_periods_ns: Vec::new(),
                traffic_start_ns: 0,
                hop_times_ns: Vec::new(),
            },
        ));
    }
    Ok(out)
}

/// Run every run of the scenario at `path` in the twin; the typed report.
pub fn run_scenario(s: &Scenario, root: &Path, scenario_dir: &Path, opts: &Options) -> anyhow::Result<Report> {
    let t0 = std::time::Instant::now();
    let topo = topology(s)?;
    let specs = run_specs(s, opts.seed)?;
    // The runs are independent: one per core (rayon), in the scenario's order.
    use rayon::prelude::*;
    let runs = specs
        .into_iter()
        .zip(s.runs())
        .collect::<Vec<_>>()
        .into_par_iter()
        .map(|((label, sysctls, spec), run)| {
            let pname = run.profile.as_deref().unwrap_or(&s.profile);
            let ppath = crate::runner::resolve_profile(pname, root, scenario_dir)?;
            let profile = Profile::load(&ppath)?;
            let o = sim::simulate(&spec, &topo, &profile, s.nic.queues, Driver::new(opts.twin))?;
            Ok(run_report(label, sysctls, &spec, &profile.name, s.kernel_for(&run), &o))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let v = &s.vm;
    Ok(Report {
        schema_version: SCHEMA_VERSION,
        scenario: s.name.clone(),
        kernel: s.kernel.clone(),
        kernel_image: Default::default(),
        accel: "model".into(),
        qemu_accel: None,
        queues: s.nic.queues,
        vcpus: v.vcpus,
        topology: format!(
            "sockets={} dies={} cores={} threads={} l3_per={}",
            v.sockets,
            v.dies,
            v.cores,
            v.threads,
            v.l3_per.as_deref().unwrap_or("die")
        ),
        wall_s: t0.elapsed().as_secs_f64(),
        runs,
        complete: true,
        mode: Some("model".into()),
        ..Default::default()
    })
}

fn rate(a: u64, b: u64, s: f64) -> Option<f64> {
    (s > 0.0).then(|| b.saturating_sub(a) as f64 / s)
}

pub(crate) fn run_report(
    label: String,
    sysctls: BTreeMap<String, String>,
    spec: &RunSpec,
    profile: &str,
    kernel: &str,
    o: &sim::Outcome,
) -> RunReport {
    let c = &o.driver.ctr;
    let from = (spec.warmup_ns / 1_000_000_000) as usize;
    let to = ((spec.duration_ns / 1_000_000_000) as usize).min(o.samples.len() - 1);
    let (a, b) = (o.samples.get(from).copied().unwrap_or_default(), o.samples[to]);
    let window = to.saturating_sub(from) as f64;
    let per_second = o
        .samples
        .windows(2)
        .enumerate()
        .map(|(i, w)| PerSecond {
            t_s: i as u64 + 1,
            steer_calls: w[1].steer_calls - w[0].steer_calls,
            adds: w[1].adds - w[0].adds,
            mods: w[1].mods - w[0].mods,
            dels: w[1].dels - w[0].dels,
        })
        .collect();
    let contended_pct = |a: &Sample, b: &Sample| {
        let acq = b.lock_acquired - a.lock_acquired;
        (acq > 0).then(|| 100.0 * (b.lock_contended - a.lock_contended) as f64 / acq as f64)
    };
    let errs = |n: u64| if n > 0 { BTreeMap::from([("error".to_string(), n)]) } else { BTreeMap::new() };
    let mut counters = BTreeMap::new();
    counters.insert("steer_eperm".into(), c.steer_eperm);
    counters.insert("rfs_set_rps_cpu".into(), o.rfs.set_rps_cpu);
    counters.insert("rfs_llc_skipped".into(), o.rfs.llc_skipped);
    counters.insert("rfs_same_queue".into(), o.rfs.same_queue);
    counters.insert("rfs_slot_busy".into(), o.rfs.slot_busy);
    counters.insert("rfs_backlog".into(), o.rfs.backlog);
    counters.insert("twin_events".into(), o.events);
    counters.insert("twin_packets".into(), o.packets);
    let driver = DriverReport {
        steer_calls: c.steer_calls,
        steer_calls_per_s: rate(a.steer_calls, b.steer_calls, window),
        adds_per_s: rate(a.adds, b.adds, window),
        mods_per_s: rate(a.mods, b.mods, window),
        dels_per_s: rate(a.dels, b.dels, window),
        lock_contended_pct_window: contended_pct(&a, &b),
        lock_wait_us_per_s: rate(a.lock_wait_ns, b.lock_wait_ns, window).map(|x| x / 1000.0),
        steer_same_pct_window: {
            let calls = b.steer_calls - a.steer_calls;
            (calls > 0).then(|| 100.0 * (b.steer_same - a.steer_same) as f64 / calls as f64)
        },
        work_delay_ms_mean_window: None,
        rates_window_s: Some(window),
        rates_from_s: Some(from as f64),
        per_second,
        steer_new: c.steer_new,
        steer_update: c.steer_update,
        steer_same: c.steer_same,
        adds_ok: c.adds_ok,
        mods_ok: c.mods_ok,
        dels_ok: c.dels_ok,
        add_errors: errs(c.add_errors),
        mod_errors: errs(c.mod_errors),
        del_errors: errs(c.del_errors),
        lock_acquired: c.lock_acquired,
        lock_contended: c.lock_contended,
        lock_contended_pct: if c.lock_acquired > 0 {
            100.0 * c.lock_contended as f64 / c.lock_acquired as f64
        } else {
            0.0
        },
        lock_wait_ns: c.lock_wait_ns,
        lock_wait_ns_max: c.lock_wait_ns_max,
        rules_now: o.driver.rules.len() as u64,
        rules_peak: c.rules_peak,
        expire_scans: c.expire_scans,
        expire_scanned: c.expire_scanned,
        counters,
        ..Default::default()
    };
    let filter_delivered: u64 = o.filter_per_queue.iter().sum();
    let device = DeviceReport {
        rx_packets_per_queue: o.rx_per_queue.clone(),
        rss_delivered_per_queue: o.rx_per_queue.iter().zip(&o.filter_per_queue).map(|(a, b)| a - b).collect(),
        filter_delivered_per_queue: o.filter_per_queue.clone(),
        rss_delivered: o.packets - filter_delivered,
        filter_delivered,
        profile: profile.into(),
        control: crate::report::schema::ControlReport {
            engine: o.engine.clone(),
            partitions: o.partitions.clone(),
            ..Default::default()
        },
        ..Default::default()
    };
    RunReport {
        label,
        sysctls,
        duration_s: Some(spec.duration_ns as f64 / 1e9),
        profile: profile.into(),
        kernel: Some(kernel.into()),
        rps_flow_cnt: Some(spec.flow_cnt),
        device,
        guest: GuestReport { module: spec.arfs, system: Default::default(), driver: spec.arfs.then_some(driver) },
        flows_stuck_without_filter: spec.arfs.then_some(o.stuck),
        ..Default::default()
    }
}
