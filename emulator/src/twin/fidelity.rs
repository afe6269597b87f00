//! Model vs VM: the twin runs each run of committed (or fresh) VM reports — same
//! scenario file, same kernel, same sysctls — over many seeds, and its mean is held to the
//! VM's mean: within ±10 %, or ±3/s for rates under 30/s (stuck flows: ±3 flows), or
//! within the twin's own prediction interval where its seeds spread wider than that.
//!
//! Seeds, because the VM's flow hashes are keyed per boot: whether two of the 64 flows
//! share an `rps_dev_flow` slot (and fight over it) changes from boot to boot, and the
//! twin draws its hashes per seed the same way.

use super::driver::TwinProfile;
use super::rfs::KernelRfs;
use super::{run_specs, sim, topology, Options};
use crate::model::profile::Profile;
use crate::report::schema::{Report, RunReport, Verdict};
use crate::runner::scenario::Scenario;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A number both a VM report and the twin's report carry.
pub struct Metric {
    pub name: &'static str,
    pub read: fn(&RunReport) -> Option<f64>,
}

/// The `Steer-C/s` cell of a VM run whose *same* answers exceed this share of its steer
/// calls is not held to the twin (see [`Cell::exempt`]).
pub const SAME_PCT_EXEMPT: f64 = 5.0;

pub const METRICS: [Metric; 5] = [
    Metric { name: "Steer-C/s", read: |r| r.driver().and_then(|d| d.steer_calls_per_s) },
    Metric {
        name: "Steer-C/s w/o same",
        read: |r| Some(r.driver()?.steer_calls_per_s? * (1.0 - same_pct(r)? / 100.0)),
    },
    Metric { name: "Add/s", read: |r| r.driver().and_then(|d| d.adds_per_s) },
    Metric { name: "Del/s", read: |r| r.driver().and_then(|d| d.dels_per_s) },
    Metric { name: "stuck", read: |r| r.flows_stuck_without_filter.map(|n| n as f64) },
];

/// The *same* answers' share (%) of a run's steer calls over the rates' window; `None` in
/// reports made before that figure existed (their whole-run share mixes in the warm-up).
pub fn same_pct(r: &RunReport) -> Option<f64> {
    r.driver()?.steer_same_pct_window
}

/// A run degraded by its steer-to-command delay alone, whose module kept the delays over
/// time (`work_delays`): the twin replays exactly what strained it, the rule works'
/// lateness bin by bin, so it is compared (marked in the table). A loaded guest's runs
/// are the ones whose steers the delays shape (brpc-like on this machine: 5 of 8 runs
/// over 50 ms); any other reason (replies lost, lock wait, a busy guest or host) is
/// something the twin does not replay, and the run stays out.
pub fn late_works_only(run: &RunReport) -> bool {
    run.health.as_ref().is_some_and(crate::runner::health::degraded_by_delay_only) && !vm_work_delays(run).is_empty()
}

/// One metric of one (scenario, kernel, run label).
#[derive(Clone, Debug)]
pub struct Cell {
    pub scenario: String,
    pub kernel: String,
    pub label: String,
    pub metric: &'static str,
    /// One value per VM report that had this run.
    pub vm: Vec<f64>,
    /// One value per seed (for every VM report).
    pub model: Vec<f64>,
    /// Per VM report: flows whose `rps_dev_flow` slot the twin replayed from it.
    pub replayed: Vec<usize>,
    /// Per VM report, under work stealing: its share of reads on the flow's previous CPU.
    pub reread: Vec<Option<f64>>,
    /// Per VM report: compared though its health is degraded, by [`late_works_only`].
    pub late: Vec<bool>,
    pub flows: u32,
    /// The highest *same* share (%) of the VM runs' steer calls.
    pub vm_same_pct: f64,
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

impl Cell {
    pub fn vm_mean(&self) -> f64 {
        mean(&self.vm)
    }

    pub fn model_mean(&self) -> f64 {
        mean(&self.model)
    }

    /// ±10 %, or ±3 (per second, or flows) under 30; or, when wider, the twin's own
    /// prediction interval for the VM mean ([`Cell::spread`]).
    pub fn tolerance(&self) -> f64 {
        let v = self.vm_mean().abs();
        let fixed = if v < 30.0 { 3.0 } else { 0.1 * v };
        fixed.max(self.spread())
    }

    /// How far the mean of this cell's VM runs may land from the twin's mean by chance
    /// alone: 2 standard deviations of the twin's seeds, scaled to the difference of
    /// two means (`s * sqrt(1/m + 1/n)` for m VM runs and n seeds). Replaying a boot's
    /// slots fixes which flows fight, not when: a fighting pair's churn depends on the
    /// interleaving of its packets with the expiry scans, and with a handful of pairs
    /// (6.12 at 1024–4096 slots per queue) a single VM run is one draw from a spread the
    /// seeds show (one CI run: 4096 slots, VM 11.3/s against seeds 3.7–11.8).
    ///
    /// The seeds' variance is taken within each VM run's seeds (pooled): runs fed
    /// different inputs (a loaded guest's late works, another boot's slots) differ by
    /// those inputs, which the twin replays, not by chance. Taken over all values, a cell
    /// of brpc-like runs at 304–856 Steer-C/s widened its band to ±256.
    pub fn spread(&self) -> f64 {
        let (n, runs) = (self.model.len(), self.vm.len());
        if n < 2 || runs == 0 {
            return 0.0;
        }
        // The seeds of each VM run follow each other; one group when they do not divide.
        let per = if n % runs == 0 && n / runs >= 2 { n / runs } else { n };
        let groups = n / per;
        let ss: f64 = self
            .model
            .chunks(per)
            .map(|g| {
                let m = mean(g);
                g.iter().map(|x| (x - m).powi(2)).sum::<f64>()
            })
            .sum();
        let var = ss / (n - groups) as f64;
        2.0 * var.sqrt() * (1.0 / runs as f64 + 1.0 / n as f64).sqrt()
    }

    /// Not held to the twin: `Steer-C/s` of VM runs where more than
    /// [`SAME_PCT_EXEMPT`] % of the calls were *same* answers. 6.12 calls
    /// `ndo_rx_flow_steer` again for every packet that still arrives on the old queue
    /// while the move is queued; how many depends on the tail of a loaded TCG guest's
    /// workqueue delays, which the twin does not model (it takes their mean). The
    /// `Steer-C/s w/o same` cell of the same run is held. Kernels with the active-flow
    /// check (≥ 6.18) are always held: after one *same* answer the target slot holds the
    /// flow on that CPU and `set_rps_cpu()` skips the repeats.
    pub fn exempt(&self) -> bool {
        self.metric == "Steer-C/s"
            && self.vm_same_pct > SAME_PCT_EXEMPT
            && self.vm_mean() >= 30.0
            && KernelRfs::of_kernel(&self.kernel) != Some(KernelRfs::V7_3)
    }

    pub fn ok(&self) -> bool {
        self.exempt() || (self.model_mean() - self.vm_mean()).abs() <= self.tolerance()
    }
}

/// One line per cell outside its tolerance: where, VM mean, twin mean, tolerance.
pub fn disagreements(cells: &[Cell]) -> Vec<String> {
    cells
        .iter()
        .filter(|c| !c.ok())
        .map(|c| {
            format!(
                "{} {} {} {}: VM {:.1}, twin {:.1} ± {:.1}",
                c.scenario,
                c.kernel,
                c.label,
                c.metric,
                c.vm_mean(),
                c.model_mean(),
                c.tolerance()
            )
        })
        .collect()
}

/// A VM report (or run) the comparison left out, and why.
#[derive(Clone, Debug)]
pub struct Skipped {
    pub source: String,
    pub reason: String,
}

/// The workload's setting as the guest printed it, against the scenario file's: a VM
/// report made with an older scenario file is not this scenario.
fn workload_differs(run: &RunReport, s: &Scenario) -> Option<String> {
    let cfg = run.guest.system.other.get("workload")?.get("config")?;
    let want = [
        ("flows", Value::from(s.traffic.flows)),
        ("workers", Value::from(s.guest.workers)),
        ("pattern", Value::from(s.guest.pattern.clone())),
        ("period_ms", Value::from(s.guest.period_ms)),
    ];
    want.into_iter()
        .find(|(k, v)| cfg.get(*k).is_some_and(|x| x != v))
        .map(|(k, v)| format!("the guest ran {k} = {} but the scenario file says {v}", cfg[k]))
}

/// Per flow, the `flow_id` (its `rps_dev_flow` slot) the VM's driver gave its rule, from
/// the guest's dump of the module's debugfs `rules` and `expired` at the end of the run
/// (`files` in the guest JSON); `None` for a flow that never had a rule there.
pub fn vm_slots(run: &RunReport, flows: u32) -> Vec<Option<u32>> {
    use crate::runner::run::{EXPIRED_DEBUGFS, RULES_DEBUGFS};
    let mut slots = vec![None; flows as usize];
    let Some(files) = run.guest.system.other.get("files") else { return slots };
    for name in [EXPIRED_DEBUGFS, RULES_DEBUGFS] {
        let Some(text) = files.get(name).and_then(Value::as_str) else { continue };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(dport), Some(id)) =
                (f.get(5).and_then(|x| x.parse::<u16>().ok()), f.last().and_then(|x| x.parse::<u32>().ok()))
            else {
                continue;
            };
            let flow = usize::from(dport.wrapping_sub(crate::runner::GUEST_BASE_PORT));
            if f.len() >= 8 && flow < slots.len() {
                slots[flow] = Some(id);
            }
        }
    }
    slots
}

/// How late the VM run's rule works ran, per 10 ms bin (the module's debugfs
/// `work_delays`: bin start, longest delay in ms, and since the module counts them the
/// bin's works and the sum of their delays in µs; bins without delay left out): the
/// works' mean delay in ms where the bin has it, else the longest; empty for a report
/// without it. At most the module's [`sim::WORK_DELAY_BINS`].
pub fn vm_work_delays(run: &RunReport) -> Vec<u16> {
    let text = run.guest.system.other.get("files").and_then(|f| f.get(crate::runner::run::WORK_DELAYS_DEBUGFS));
    let Some(text) = text.and_then(Value::as_str) else { return Vec::new() };
    let bin_ms = sim::WORK_DELAY_BIN_NS / 1_000_000;
    let mut bins = Vec::new();
    for l in text.lines().skip(1) {
        let mut f = l.split_whitespace().map(|x| x.parse::<u64>().ok());
        let (Some(start), Some(max)) = (f.next().flatten(), f.next().flatten()) else { continue };
        let ms = match (f.next().flatten(), f.next().flatten()) {
            // Rounded to the nearest ms, never above the bin's longest.
            (Some(works), Some(sum_us)) if works > 0 => ((sum_us / works).saturating_add(500) / 1000).min(max),
            _ => max,
        };
        let i = (start / bin_ms) as usize;
        if i < sim::WORK_DELAY_BINS {
            if bins.len() <= i {
                bins.resize(i + 1, 0);
            }
            bins[i] = u16::try_from(ms).unwrap_or(u16::MAX);
        }
    }
    bins
}

/// Per worker, the time between its hops in the VM run: arfs-echo's run time over the
/// worker's `hops` + 1; empty without the counts (or without hops).
pub fn vm_hop_periods(run: &RunReport) -> Vec<u64> {
    let Some(w) = run.guest.system.other.get("workload") else { return Vec::new() };
    let Some(elapsed) = w.get("elapsed_s").and_then(Value::as_f64).filter(|x| *x > 0.0) else { return Vec::new() };
    let Some(workers) = w.get("workers").and_then(Value::as_array) else { return Vec::new() };
    let hops: Vec<u64> = workers.iter().map(|x| x.get("hops").and_then(Value::as_u64).unwrap_or(0)).collect();
    if hops.iter().all(|&h| h == 0) {
        return Vec::new();
    }
    hops.iter().take(4096).map(|&h| (elapsed * 1e9 / (h + 1) as f64) as u64).collect()
}

/// Per worker, when it hopped in the VM run (arfs-echo's `hop_us`, µs after the hops'
/// epoch), at most [`sim::HOP_LOG`] each and never before an earlier one; empty for a
/// report without them.
pub fn vm_hop_times(run: &RunReport) -> Vec<Vec<u64>> {
    let Some(w) = run.guest.system.other.get("workload") else { return Vec::new() };
    let Some(workers) = w.get("workers").and_then(Value::as_array) else { return Vec::new() };
    let times: Vec<Vec<u64>> = workers
        .iter()
        .take(4096)
        .map(|x| {
            let us = x.get("hop_us").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
            let mut prev = 0;
            us.iter()
                .take(sim::HOP_LOG)
                .map_while(Value::as_u64)
                .map(|t| {
                    // In order and inside an hour: a bogus entry cannot reorder or stall.
                    prev = (t.min(3_600_000_000) * 1_000).max(prev);
                    prev
                })
                .collect()
        })
        .collect();
    if times.iter().all(Vec::is_empty) {
        return Vec::new();
    }
    times
}

/// When the VM run's first request was read, after the workers' common start
/// (arfs-echo's `first_request_s`); 0 for a report without it.
pub fn vm_traffic_start_ns(run: &RunReport) -> u64 {
    let w = run.guest.system.other.get("workload");
    let s = w.and_then(|w| w.get("first_request_s")).and_then(Value::as_f64).filter(|x| x.is_finite() && *x > 0.0);
    // At most an hour: the twin simulates the time before the traffic too, and a bogus
    // value must not make that unbounded.
    s.map_or(0, |s| (s.min(3600.0) * 1e9) as u64)
}

/// The share of the flows' reads that arfs-echo did on the CPU of the flow's previous
/// read (its per-flow `cpu_changes` over `requests - 1`); `None` for a report without
/// the counter (arfs-echo before it) or without reads.
pub fn vm_reread(run: &RunReport) -> Option<f64> {
    let flows = run.guest.system.other.get("workload")?.get("flows")?.as_array()?;
    let (mut changes, mut reads) = (0u64, 0u64);
    for f in flows {
        changes += f.get("cpu_changes")?.as_u64()?;
        reads += f.get("requests").and_then(Value::as_u64).unwrap_or(0).saturating_sub(1);
    }
    (reads > 0).then(|| 1.0 - changes.min(reads) as f64 / reads as f64)
}

/// Compare the twin with the VM reports at `reports` (scenarios from `root`'s
/// configs/scenarios/), `seeds` seeds per run.
pub fn compare(
    root: &Path,
    reports: &[PathBuf],
    seeds: u32,
    twin: TwinProfile,
) -> anyhow::Result<(Vec<Cell>, Vec<Skipped>)> {
    let mut cells: BTreeMap<(String, String, String, usize), Cell> = BTreeMap::new();
    let mut skipped = Vec::new();
    for path in reports {
        let src = path.display().to_string();
        let r = Report::load(path, "VM report")?;
        if r.mode.as_deref() == Some("model") {
            skipped.push(Skipped { source: src, reason: "a model-mode report, not a VM run".into() });
            continue;
        }
        let spath = root.join("configs/scenarios").join(format!("{}.toml", r.scenario));
        let scenario = match Scenario::load(&spath) {
            Ok(s) => s,
            Err(e) => {
                skipped.push(Skipped { source: src, reason: format!("scenario: {e}") });
                continue;
            }
        };
        for run in &r.runs {
            let kernel = run.kernel.clone().unwrap_or_else(|| r.kernel.clone());
            let late_only = late_works_only(run);
            if let Some(h) = run.health.as_ref().filter(|h| h.verdict != Verdict::Ok && !late_only) {
                let why = format!("run health {}: not a measurement ({})", h.verdict.as_str(), h.reasons.join("; "));
                skipped.push(Skipped { source: format!("{src} {}", run.label), reason: why });
                continue;
            }
            // The scenario's run of that label, or (runs repeated under other labels, as
            // the interleaved CI rounds) the one with the same sysctls and rps_flow_cnt.
            let runs = scenario.runs();
            let same = |x: &&crate::runner::scenario::Run| {
                scenario.sysctls_for(x) == run.sysctls
                    && run.rps_flow_cnt.is_none_or(|n| n == scenario.rps_flow_cnt_for(x))
                    && scenario.kernel_for(x) == kernel
            };
            let Some(srun) = runs.iter().find(|x| x.label == run.label).or_else(|| runs.iter().find(same)) else {
                let reason = "no run of that label or setting in the scenario file".into();
                skipped.push(Skipped { source: format!("{src} {}", run.label), reason });
                continue;
            };
            if let Some(why) = workload_differs(run, &scenario) {
                skipped.push(Skipped { source: format!("{src} {}", run.label), reason: why });
                continue;
            }
            let mut s = scenario.clone();
            s.kernel = kernel.clone();
            s.runs = vec![crate::runner::scenario::Run { kernel: None, ..srun.clone() }];
            if let Some(n) = run.rps_flow_cnt {
                s.runs[0].rps_flow_cnt = Some(n);
            }
            // The rate the link partner offered (the warm-up probe may have halved it).
            if let Some(o) = &run.offered_load {
                s.traffic.rate_pps = u32::try_from(o.chosen_pps).unwrap_or(u32::MAX);
            }
            // The guest's speed is an input, not an output: the workqueue delay the VM
            // run measured (queue_work() to the work running, mean over the run) — a
            // loaded TCG guest runs its works milliseconds late, and 6.12 then calls
            // ndo_rx_flow_steer again for every packet still arriving on the old queue.
            // A run whose module kept the delays over time (`work_delays`) gives them bin
            // by bin instead: one mean spreads a few long stalls over every work.
            let work_delays = vm_work_delays(run);
            let twin = match run.driver().map(|d| (d.counters.get("work_delay_ns_total"), d.counters.get("work_runs")))
            {
                Some((Some(&total), Some(&runs))) if runs > 0 && work_delays.is_empty() => {
                    TwinProfile { wq_delay_ns: total / runs, ..twin }
                }
                _ => twin,
            };
            let slots = vm_slots(run, s.traffic.flows);
            let replayed = slots.iter().filter(|x| x.is_some()).count();
            // Under work stealing, which worker epoll hands a request to is the guest's
            // scheduling, not RFS: the twin takes the share of reads that stayed on the
            // flow's previous CPU from the VM run.
            let reread = vm_reread(run).filter(|_| s.guest.pattern == "work-stealing");
            let hop_periods_ns = vm_hop_periods(run);
            let traffic_start_ns = vm_traffic_start_ns(run);
            let hop_times_ns = vm_hop_times(run);
            let inputs =
                VmInputs { slots: &slots, reread, work_delays, hop_periods_ns, traffic_start_ns, hop_times_ns };
            let model = match model_runs(root, &s, seeds, twin, &inputs) {
                Ok(m) => m,
                Err(e) => {
                    skipped.push(Skipped {
                        source: format!("{src} {}", run.label),
                        reason: format!("the twin cannot run it: {e}"),
                    });
                    continue;
                }
            };
            for (i, m) in METRICS.iter().enumerate() {
                let Some(v) = (m.read)(run) else { continue };
                // Grouped by the scenario's run: repeated rounds of one run are one cell.
                let key = (r.scenario.clone(), kernel.clone(), srun.label.clone(), i);
                let cell = cells.entry(key).or_insert_with(|| Cell {
                    scenario: r.scenario.clone(),
                    kernel: kernel.clone(),
                    label: srun.label.clone(),
                    metric: m.name,
                    vm: Vec::new(),
                    model: Vec::new(),
                    replayed: Vec::new(),
                    reread: Vec::new(),
                    late: Vec::new(),
                    flows: s.traffic.flows,
                    vm_same_pct: 0.0,
                });
                cell.vm_same_pct = cell.vm_same_pct.max(same_pct(run).unwrap_or(0.0));
                cell.vm.push(v);
                cell.model.extend(model.iter().filter_map(|x| (m.read)(x)));
                cell.replayed.push(replayed);
                cell.reread.push(reread);
                cell.late.push(late_only);
            }
        }
    }
    Ok((cells.into_values().collect(), skipped))
}

/// What the twin takes from a VM run besides the scenario and the guest's speed.
struct VmInputs<'a> {
    slots: &'a [Option<u32>],
    reread: Option<f64>,
    work_delays: Vec<u16>,
    hop_periods_ns: Vec<u64>,
    traffic_start_ns: u64,
    hop_times_ns: Vec<Vec<u64>>,
}

/// The twin's run of a one-run scenario, once per seed.
fn model_runs(
    root: &Path,
    s: &Scenario,
    seeds: u32,
    twin: TwinProfile,
    vm: &VmInputs,
) -> anyhow::Result<Vec<RunReport>> {
    let topo = topology(s)?;
    let dir = root.join("configs/scenarios");
    let run = &s.runs()[0];
    let pname = run.profile.as_deref().unwrap_or(&s.profile);
    let profile = Profile::load(&crate::runner::resolve_profile(pname, root, &dir)?)?;
    let mut out = Vec::new();
    for seed in 0..u64::from(seeds) {
        let opts = Options { seed: seed + 1, twin };
        let (label, sysctls, mut spec) = run_specs(s, opts.seed)?.remove(0);
        spec.slots = vm.slots.to_vec();
        spec.reread = vm.reread;
        spec.work_delays = vm.work_delays.clone();
        spec.hop_periods_ns = vm.hop_periods_ns.clone();
        spec.traffic_start_ns = vm.traffic_start_ns;
        spec.hop_times_ns = vm.hop_times_ns.clone();
        let o = sim::simulate(&spec, &topo, &profile, s.nic.queues, super::driver::Driver::new(twin))?;
        out.push(super::run_report(label, sysctls, &spec, &profile.name, &s.kernel, &o));
    }
    Ok(out)
}

/// The fidelity table in markdown.
pub fn markdown(cells: &[Cell], skipped: &[Skipped], seeds: u32) -> String {
    let mut t = format!(
        "| scenario | kernel | run | metric | VM mean (runs) | VM values | slots replayed (· reads on the previous CPU) | model mean ({seeds} seeds per VM run) | model min–max | tolerance | agrees |\n|---|---|---|---|---:|---|---|---:|---|---:|---|\n"
    );
    for c in cells {
        let lo = c.model.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = c.model.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let vals: Vec<String> =
            c.vm.iter()
                .zip(c.late.iter().chain(std::iter::repeat(&false)))
                .map(|(v, &late)| if late { format!("{v:.1} (late works)") } else { format!("{v:.1}") })
                .collect();
        let rep: Vec<String> = c
            .replayed
            .iter()
            .zip(c.reread.iter().chain(std::iter::repeat(&None)))
            .map(|(n, q)| match q {
                Some(q) => format!("{n}/{} · {:.1} %", c.flows, 100.0 * q),
                None => format!("{n}/{}", c.flows),
            })
            .collect();
        t.push_str(&format!(
            "| {} | {} | {} | {} | {:.1} ({}) | {} | {} | {:.1} | {:.1}–{:.1} | ±{:.1} | {} |\n",
            c.scenario,
            c.kernel,
            c.label,
            c.metric,
            c.vm_mean(),
            c.vm.len(),
            vals.join(", "),
            rep.join(", "),
            c.model_mean(),
            lo,
            hi,
            c.tolerance(),
            match (c.exempt(), c.ok()) {
                (true, _) => format!("not held: VM same {:.0} %", c.vm_same_pct),
                (false, true) => "yes".into(),
                (false, false) => "**no**".into(),
            }
        ));
    }
    if cells.iter().any(|c| c.late.contains(&true)) {
        t.push_str(
            "\n(late works): a run degraded by its steer-to-command delay alone; the twin replays its works' delays.\n",
        );
    }
    for s in skipped {
        t.push_str(&format!("\nNot compared: {}: {}\n", s.source, s.reason));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(vm: &[f64], model: &[f64]) -> Cell {
        Cell {
            scenario: "s".into(),
            kernel: "k".into(),
            label: "l".into(),
            metric: "Add/s",
            vm: vm.to_vec(),
            model: model.to_vec(),
            replayed: vec![0; vm.len()],
            reread: Vec::new(),
            late: Vec::new(),
            flows: 64,
            vm_same_pct: 0.0,
        }
    }

    #[test]
    fn a_run_degraded_by_late_works_alone_is_compared_when_it_has_their_bins() {
        use crate::report::schema::Health;
        let health = |verdict, reasons: &[&str]| {
            Some(Health { verdict, reasons: reasons.iter().map(|x| x.to_string()).collect(), ..Health::default() })
        };
        let delay = "steer-to-command delay 142 ms > 50 ms (mean)";
        let mut run = RunReport { health: health(Verdict::Degraded, &[delay]), ..RunReport::default() };
        // Without the bins the twin would replay one mean: not what strained the run.
        assert!(!late_works_only(&run));
        run.guest.system.other.insert(
            "files".into(),
            serde_json::json!({ crate::runner::run::WORK_DELAYS_DEBUGFS: "h\n0 140 3 400000\n" }),
        );
        assert!(late_works_only(&run));
        for (verdict, reasons) in [
            (Verdict::Degraded, vec![delay, "guest CPU 93% busy > 90%"]),
            (Verdict::Degraded, vec!["replies lost 0.70% > 0.5%"]),
            (Verdict::Invalid, vec!["steer-to-command delay 300 ms > 250 ms (mean)"]),
            (Verdict::Degraded, vec![]),
            (Verdict::Ok, vec![]),
        ] {
            run.health = health(verdict, &reasons);
            assert!(!late_works_only(&run), "{verdict:?} {reasons:?}");
        }
    }

    #[test]
    fn a_vm_runs_work_delays_and_reread_share_are_read_from_its_report() {
        let mut run = RunReport::default();
        assert!(vm_work_delays(&run).is_empty());
        assert_eq!(vm_reread(&run), None);
        let text = "bin_start_ms max_delay_ms (bins of 10 ms; 0 ms bins left out)\n0 56\n20 151\nx y\n\
                    30\n70000 3\n40960 9\n40950 70000\n";
        run.guest
            .system
            .other
            .insert("files".into(), serde_json::json!({ crate::runner::run::WORK_DELAYS_DEBUGFS: text }));
        let bins = vm_work_delays(&run);
        // Garbage and bins past the module's 4096 are skipped; a delay past u16 saturates.
        assert_eq!(bins.len(), 4096);
        assert_eq!((bins[0], bins[1], bins[2], bins[3], bins[4095]), (56, 0, 151, 0, u16::MAX));
        // A module that counts the bin's works gives their mean (rounded, never above the
        // longest); a bin without works, or a sum that is not a number, its longest.
        let text = "bin_start_ms max_delay_ms works sum_delay_us (bins of 10 ms; 0 ms bins left out)\n\
                    0 112 4 250400\n10 9 3 4499\n20 7 0 0\n30 5 2 x\n40 3 1 90000000\n";
        run.guest
            .system
            .other
            .insert("files".into(), serde_json::json!({ crate::runner::run::WORK_DELAYS_DEBUGFS: text }));
        assert_eq!(vm_work_delays(&run), [63, 1, 7, 5, 3]);
        // A hostile sum does not overflow the rounding.
        let text = format!("h\n0 9 1 {}\n", u64::MAX);
        run.guest
            .system
            .other
            .insert("files".into(), serde_json::json!({ crate::runner::run::WORK_DELAYS_DEBUGFS: text }));
        assert_eq!(vm_work_delays(&run), [9]);
        run.guest.system.other.insert(
            "workload".into(),
            serde_json::json!({ "flows": [
                { "requests": 11, "cpu_changes": 6 },
                { "requests": 11, "cpu_changes": 9 },
                { "requests": 0, "cpu_changes": 0 },
            ] }),
        );
        assert!((vm_reread(&run).unwrap() - 0.25).abs() < 1e-9);
        // An arfs-echo without the counter: no share, the twin draws uniformly.
        run.guest.system.other.insert("workload".into(), serde_json::json!({ "flows": [{ "requests": 11 }] }));
        assert_eq!(vm_reread(&run), None);
        // When the traffic began against the hops: arfs-echo's first request; an older
        // arfs-echo (or a bogus value) starts it with the hops.
        assert_eq!(vm_traffic_start_ns(&run), 0);
        for (v, ns) in
            [(serde_json::json!(0.974), 974_000_000), (serde_json::json!(-1.0), 0), (serde_json::json!("x"), 0)]
        {
            run.guest.system.other.insert("workload".into(), serde_json::json!({ "first_request_s": v }));
            assert_eq!(vm_traffic_start_ns(&run), ns);
        }
    }

    #[test]
    fn a_vm_runs_hop_times_are_read_in_order_and_bounded() {
        let mut run = RunReport::default();
        assert!(vm_hop_times(&run).is_empty());
        // Workers without times (an older arfs-echo, or a pattern without hops): none.
        run.guest.system.other.insert("workload".into(), serde_json::json!({ "workers": [{ "hops": 3 }] }));
        assert!(vm_hop_times(&run).is_empty());
        let long: Vec<u64> = (1..=5000).collect();
        run.guest.system.other.insert(
            "workload".into(),
            serde_json::json!({ "workers": [
                { "hop_us": [100_000, 250_000, 200_000, u64::MAX, 5] },
                { "hop_us": [100_000, "x", 300_000] },
                { "hops": 0 },
                { "hop_us": long },
            ] }),
        );
        let t = vm_hop_times(&run);
        // An earlier entry after a later one keeps the later time; past an hour is an
        // hour; a non-number ends the worker's list; at most arfs-echo's log each.
        assert_eq!(t[0], [100_000_000, 250_000_000, 250_000_000, 3_600_000_000_000, 3_600_000_000_000]);
        assert_eq!(t[1], [100_000_000]);
        assert!(t[2].is_empty());
        assert_eq!((t[3].len(), t[3][4095]), (sim::HOP_LOG, 4_096_000));
    }

    #[test]
    fn steer_rates_with_many_same_answers_are_held_on_kernels_with_the_active_flow_check() {
        let same = |kernel: &str| Cell {
            metric: "Steer-C/s",
            kernel: kernel.into(),
            vm_same_pct: 7.0,
            ..cell(&[300.0], &[500.0, 501.0])
        };
        assert!(same("patched-6.12").exempt() && same("patched-6.12").ok());
        assert!(!same("patched-7.3").exempt() && !same("patched-7.3").ok());
        assert!(!Cell { vm_same_pct: 4.0, ..same("patched-6.12") }.exempt());
    }

    #[test]
    fn tolerance_is_the_fixed_band_until_the_seeds_spread_wider() {
        // tight seeds: ±10 % of the VM mean
        let c = cell(&[300.0], &[317.0, 318.0, 316.0, 317.0]);
        assert!((c.tolerance() - 30.0).abs() < 1e-9);
        assert!(c.ok());
        assert!(!cell(&[0.0], &[317.0, 318.0, 316.0, 317.0]).ok());
        // a CI run that failed on the fixed band: 4096 slots, VM 11.3, 8 seeds 3.7–11.8
        // (mean 7.7; the values between are illustrative)
        let seeds = [3.7, 5.9, 7.0, 7.4, 8.1, 8.6, 9.1, 11.8];
        let c = cell(&[11.3], &seeds);
        assert!(c.spread() > 3.0 && c.tolerance() == c.spread());
        assert!(c.ok(), "{}", c.spread());
        // but not anything: 25/s lies outside what those seeds predict
        assert!(!cell(&[25.0], &seeds).ok());
        // more VM runs narrow the interval
        assert!(cell(&[11.3, 11.3, 11.3], &seeds).spread() < c.spread());
        // one seed has no spread
        assert_eq!(cell(&[11.3], &[7.7]).spread(), 0.0);
        // Two VM runs with different inputs: the twin's seeds are tight around each run's
        // own value, and the distance between the runs is not chance.
        let two = cell(&[300.0, 600.0], &[298.0, 301.0, 300.0, 599.0, 602.0, 600.0]);
        assert!(two.spread() < 5.0, "{}", two.spread());
        assert!(two.ok());
        assert!(!cell(&[300.0, 800.0], &[298.0, 301.0, 300.0, 599.0, 602.0, 600.0]).ok());
    }
}
