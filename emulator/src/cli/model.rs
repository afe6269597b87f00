//! `arfsnic model`: a scenario in model mode (src/twin/, docs/model.md), `--fidelity`,
//! the twin against VM reports, and `--contention`, the `arfs_lock` curve over CPU counts.

use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ModelArgs {
    /// Scenario: a name in configs/scenarios/ (llc-within) or a file.
    /// With --contention: the curve's unit (default: contention).
    #[arg(long, required_unless_present_any = ["fidelity", "contention", "bench"])]
    pub scenario: Option<String>,
    /// Write the JSON report here.
    #[arg(long, value_name = "OUT", conflicts_with_all = ["fidelity", "contention", "bench"])]
    pub json: Option<PathBuf>,
    /// Seed of the flows' hashes and packet phases (run i uses SEED + i).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The guest's CPU costs: a name in configs/twin/ (tcg: the VMs of CI; native: bare
    /// metal estimates) or a TOML file.
    #[arg(long, default_value = "tcg")]
    pub twin: String,
    /// Compare the twin with VM reports (default: the committed docs/results/fidelity/*.json,
    /// VM runs that carry their boot's rule table): the fidelity table of docs/model.md.
    /// Exits 1 when a cell disagrees beyond its tolerance.
    #[arg(long)]
    pub fidelity: bool,
    /// --fidelity: seeds per run.
    #[arg(long, default_value_t = 16)]
    pub seeds: u32,
    /// --fidelity: VM report files.
    #[arg(value_name = "REPORT")]
    pub reports: Vec<PathBuf>,
    /// The `arfs_lock` contention curve: the scenario (one LLC, configs/scenarios/
    /// contention.toml) scaled to each of --cpus at constant per-CPU load, every run in
    /// the twin, the runs spread over the cores.
    #[arg(long, conflicts_with = "fidelity")]
    pub contention: bool,
    /// The speed benchmark: configs/scenarios/model-bench.toml (256 CPUs, 12 288 flows)
    /// at 1 M requests/s for 10 simulated seconds and at 10 M/s for 2, one run on one
    /// core each: simulated time against wall time, and the process's peak memory.
    #[arg(long, conflicts_with_all = ["fidelity", "contention"])]
    pub bench: bool,
    /// --contention: CPU counts.
    #[arg(long, value_delimiter = ',', default_values_t = crate::twin::contention::CPUS)]
    pub cpus: Vec<u32>,
    /// Write the plot as SVG: with --contention the curve (contended % against CPUs), for
    /// a scenario whose runs vary `rps_flow_cnt` Steer-C against it.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["fidelity", "bench"])]
    pub svg: Option<PathBuf>,
    /// Write the table (runs, fidelity or contention) between `<!-- results:NAME -->`
    /// markers of FILE.
    #[arg(long, value_name = "FILE", requires = "name")]
    pub update: Option<PathBuf>,
    #[arg(long, requires = "update")]
    pub name: Option<String>,
}

pub fn run(a: &ModelArgs) -> anyhow::Result<()> {
    let root = crate::runner::env::repo_root()?;
    let twin = crate::twin::load_twin_profile(&a.twin, &root)?;
    if a.fidelity {
        return model_fidelity(a, &root, twin);
    }
    let default = match (a.contention, a.bench) {
        (true, _) => "contention",
        (_, true) => "model-bench",
        _ => "",
    };
    let spec = a.scenario.as_deref().unwrap_or(default);
    let path = if spec.contains('/') || spec.ends_with(".toml") {
        PathBuf::from(spec)
    } else {
        root.join("configs/scenarios").join(format!("{spec}.toml"))
    };
    let s = crate::runner::scenario::Scenario::load(&path)?;
    let dir = path.parent().unwrap_or(std::path::Path::new("."));
    let opts = crate::twin::Options { seed: a.seed, twin };
    if a.contention {
        return model_contention(a, &root, &path, &s, &opts);
    }
    if a.bench {
        return model_bench(a, &root, &path, &s, &opts);
    }
    let report = crate::twin::run_scenario(&s, &root, dir, &opts)?;
    println!("{}", crate::report::results::table(&crate::report::results::rows(&report)).trim_end());
    eprintln!("model: {} run(s) in {:.2} s wall", report.runs.len(), report.wall_s);
    // A sweep of rps_flow_cnt in Krishna Kumar's shape, else the runs' rates.
    let sweep = crate::report::sweep::sweep(&report);
    if let (Some(file), Some(name)) = (&a.update, &a.name) {
        let rel = [path.strip_prefix(&root).unwrap_or(&path).to_path_buf()];
        let generator = format!("arfsnic model --scenario {} --twin {}", s.name, a.twin);
        let table = sweep.as_ref().map_or_else(|| runs_markdown(&report), crate::report::sweep::markdown);
        super::update_between_markers(file, name, &table, &rel, report.runs.len(), &generator)?;
    }
    if let Some(out) = &a.svg {
        let sw = sweep.as_ref().ok_or_else(|| {
            anyhow::anyhow!("--svg: {} has no plot (its runs do not vary rps_flow_cnt; --contention has one)", s.name)
        })?;
        std::fs::write(out, crate::report::sweep::svg(sw)?)
            .map_err(|e| anyhow::anyhow!("--svg {}: {e}", out.display()))?;
        eprintln!("wrote {}", out.display());
    }
    if let Some(out) = &a.json {
        std::fs::write(out, report.to_json_pretty()).map_err(|e| anyhow::anyhow!("--json {}: {e}", out.display()))?;
        eprintln!("wrote {}", out.display());
    }
    Ok(())
}

/// The committed VM reports the fidelity table compares with by default: the VM runs that
/// carry their boot's rule table (docs/results/fidelity/*.json).
pub fn default_fidelity_reports(root: &std::path::Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root.join("docs/results/fidelity"))
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "json")).collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn model_fidelity(a: &ModelArgs, root: &std::path::Path, twin: crate::twin::driver::TwinProfile) -> anyhow::Result<()> {
    let reports = if a.reports.is_empty() { default_fidelity_reports(root) } else { a.reports.clone() };
    anyhow::ensure!(!reports.is_empty(), "--fidelity: no VM report given and none under docs/results/fidelity/");
    anyhow::ensure!(a.seeds > 0, "--seeds: must be at least 1");
    let (cells, skipped) = crate::twin::fidelity::compare(root, &reports, a.seeds, twin)?;
    let table = crate::twin::fidelity::markdown(&cells, &skipped, a.seeds);
    let bad = crate::twin::fidelity::disagreements(&cells).len();
    match (&a.update, &a.name) {
        (Some(file), Some(name)) => {
            // Report paths relative to the repository in the generated note.
            let rel: Vec<PathBuf> = reports.iter().map(|p| p.strip_prefix(root).unwrap_or(p).to_path_buf()).collect();
            super::update_between_markers(file, name, &table, &rel, cells.len(), "arfsnic model --fidelity")?
        }
        _ => print!("{table}"),
    }
    anyhow::ensure!(bad == 0, "{bad} of {} fidelity cells disagree beyond their tolerance", cells.len());
    Ok(())
}

/// The contention curve: its table (stdout or between markers) and SVG.
fn model_contention(
    a: &ModelArgs,
    root: &std::path::Path,
    path: &std::path::Path,
    base: &crate::runner::scenario::Scenario,
    opts: &crate::twin::Options,
) -> anyhow::Result<()> {
    use crate::twin::contention;
    let dir = path.parent().unwrap_or(std::path::Path::new("."));
    anyhow::ensure!(!a.cpus.is_empty(), "--cpus: give at least one CPU count");
    let t0 = std::time::Instant::now();
    let points = contention::curve(root, dir, base, &a.cpus, opts)?;
    let table = contention::markdown(&points);
    let sim_s: f64 = points.iter().map(|p| p.wall_s).sum();
    eprintln!(
        "model: {} runs, {:.1} s of simulation on {} thread(s), {:.1} s wall",
        points.len(),
        sim_s,
        rayon::current_num_threads(),
        t0.elapsed().as_secs_f64()
    );
    match (&a.update, &a.name) {
        (Some(file), Some(name)) => {
            let rel = [path.strip_prefix(root).unwrap_or(path).to_path_buf()];
            super::update_between_markers(file, name, &table, &rel, points.len(), "arfsnic model --contention")?
        }
        _ => print!("{table}"),
    }
    if let Some(out) = &a.svg {
        let series = contention_series(&points);
        let svg = crate::report::chart::log2_lines(
            &format!("{}: arfs_lock contention vs CPUs (model, twin {})", base.name, a.twin),
            "CPUs (constant load per CPU, one pod per LLC)",
            "arfs_lock acquisitions contended (%)",
            &series,
        )?;
        std::fs::write(out, svg).map_err(|e| anyhow::anyhow!("--svg {}: {e}", out.display()))?;
        eprintln!("wrote {}", out.display());
    }
    Ok(())
}

/// A model report's runs in a few columns: the steer, rule and lock rates.
pub fn runs_markdown(r: &crate::report::schema::Report) -> String {
    let mut out = String::from(
        "| run | kernel | arfs_llc_affinity | Steer-C/s | Add/s | Mod/s | Del/s | arfs_lock contended % |\n|---|---|---|---:|---:|---:|---:|---:|\n",
    );
    let f = |v: Option<f64>| v.map_or_else(|| "-".into(), |x| format!("{x:.1}"));
    for run in &r.runs {
        let d = run.driver();
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            run.label,
            run.kernel.as_deref().unwrap_or(&r.kernel),
            run.sysctls.get(crate::twin::LLC_SYSCTL).map_or("-", String::as_str),
            f(d.and_then(|d| d.steer_calls_per_s)),
            f(d.and_then(|d| d.adds_per_s)),
            f(d.and_then(|d| d.mods_per_s)),
            f(d.and_then(|d| d.dels_per_s)),
            f(d.and_then(|d| d.lock_contended_pct_window)),
        ));
    }
    out
}

/// `arfsnic demo --model`: the seed-scale tables without a kernel build or QEMU — the
/// seed's test bed (configs/scenarios/seed-testbed.toml) and the `arfs_lock` contention
/// curve (contention.toml at 4 … 256 CPUs), twin `native`, and Krishna Kumar's table
/// (krishna-ice.toml), twin `ice`; reports, tables and plots in `out`.
pub fn demo_model(out: &std::path::Path) -> anyhow::Result<()> {
    use crate::twin::{contention, Options};
    let t0 = std::time::Instant::now();
    let root = crate::runner::env::repo_root()?;
    let twin = crate::twin::load_twin_profile("native", &root)?;
    let opts = Options { seed: 1, twin };
    let dir = root.join("configs/scenarios");
    std::fs::create_dir_all(out).map_err(|e| anyhow::anyhow!("--out {}: {e}", out.display()))?;
    let write = |name: &str, text: &str| {
        let p = out.join(name);
        std::fs::write(&p, text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))
    };
    let seed = crate::runner::scenario::Scenario::load(&dir.join("seed-testbed.toml"))?;
    let report = crate::twin::run_scenario(&seed, &root, &dir, &opts)?;
    write("seed-testbed.json", &report.to_json_pretty())?;
    let seed_table = runs_markdown(&report);
    println!("The seed's test bed in the twin (256 CPUs, 16-CPU pod, 4096 pooled TCP connections; seed-testbed.toml):");
    println!("{seed_table}");
    println!("The posting measured ~200 000 steers/s with the sysctl off and ~10/s with it on (mlx5, 7.x).\n");
    let base = crate::runner::scenario::Scenario::load(&dir.join("contention.toml"))?;
    let points = contention::curve(&root, &dir, &base, &contention::CPUS, &opts)?;
    let curve = contention::markdown(&points);
    println!("arfs_lock contention at constant per-CPU load (contention.toml scaled to 4 ... 256 CPUs):");
    println!("{curve}");
    let svg = crate::report::chart::log2_lines(
        "arfs_lock contention vs CPUs (model, twin native)",
        "CPUs (constant load per CPU, one pod per LLC)",
        "arfs_lock acquisitions contended (%)",
        &contention_series(&points),
    )?;
    write("contention.svg", &svg)?;
    let krishna = crate::runner::scenario::Scenario::load(&dir.join("krishna-ice.toml"))?;
    let ice = Options { seed: 1, twin: crate::twin::load_twin_profile("ice", &root)? };
    let report = crate::twin::run_scenario(&krishna, &root, &dir, &ice)?;
    write("krishna-ice.json", &report.to_json_pretty())?;
    let sw = crate::report::sweep::sweep(&report)
        .ok_or_else(|| anyhow::anyhow!("krishna-ice.toml: its runs do not vary rps_flow_cnt"))?;
    let krishna_table = crate::report::sweep::markdown(&sw);
    println!(
        "Krishna Kumar's table in the twin (ice, 144 CPUs = 144 queues, 12 288 TCP flows; krishna-ice.toml, twin ice):"
    );
    println!("{krishna_table}");
    println!("The posting (8 min per size): old 121.7 M Steer-C at 256 falling to 965.1 K at 32768, new 11-15 K everywhere.\n");
    write("krishna-ice.svg", &crate::report::sweep::svg(&sw)?)?;
    write(
        "model.md",
        &format!(
            "# arfsnic demo --model\n\n## Seed test bed\n\n{seed_table}\n## Contention\n\n{curve}\n## Krishna Kumar's table\n\n{krishna_table}"
        ),
    )?;
    println!(
        "docs/model.md says what the twin models and how far it agrees with the VM. Wrote {}/{{seed-testbed.json,krishna-ice.json,model.md,contention.svg,krishna-ice.svg}} in {:.1} s.",
        out.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// One line per (kernel, sysctl): contended % against CPUs.
pub fn contention_series(points: &[crate::twin::contention::Point]) -> Vec<(String, Vec<(u64, f64)>)> {
    let mut series: Vec<(String, Vec<(u64, f64)>)> = Vec::new();
    for p in points {
        let name = format!("{} sysctl={}", p.kernel, p.sysctl);
        let pt = (u64::from(p.cpus), p.contended_pct);
        match series.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => v.push(pt),
            None => series.push((name, vec![pt])),
        }
    }
    series
}

/// `--bench`: the scenario as written, then at 10× its rate for a fifth of its duration;
/// per pass the simulated seconds per wall second.
fn model_bench(
    a: &ModelArgs,
    root: &std::path::Path,
    path: &std::path::Path,
    base: &crate::runner::scenario::Scenario,
    opts: &crate::twin::Options,
) -> anyhow::Result<()> {
    let dir = path.parent().unwrap_or(std::path::Path::new("."));
    let mut fast = base.clone();
    fast.traffic.rate_pps = base.traffic.rate_pps.saturating_mul(10);
    fast.duration_s = (base.duration_s / 5.0).max(2.0);
    fast.warmup_s = fast.warmup_s.min(fast.duration_s - 1.0);
    fast.validate().map_err(|e| anyhow::anyhow!("--bench at 10x the rate: {e}"))?;
    let mut table = String::from(
        "| CPUs | flows | requests/s | simulated s | wall s | × real time | events | events/s of wall |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    // One run at a time on this thread: the figure is one core's.
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    for s in [base, &fast] {
        let r = pool.install(|| crate::twin::run_scenario(s, root, dir, opts))?;
        let events: u64 = r.runs.iter().filter_map(|x| x.driver()?.counters.get("twin_events").copied()).sum();
        let sim_s = s.duration_s * r.runs.len() as f64;
        table.push_str(&format!(
            "| {} | {} | {} | {} | {:.2} | {:.1} | {} | {:.2} M |\n",
            s.vm.vcpus,
            s.traffic.flows,
            s.traffic.rate_pps,
            sim_s,
            r.wall_s,
            sim_s / r.wall_s,
            events,
            events as f64 / r.wall_s / 1e6
        ));
    }
    let peak = peak_rss_mib();
    let note = format!(
        "\nPeak resident memory of the process: {}.\n",
        peak.map_or("unknown".into(), |m| format!("{m:.0} MiB"))
    );
    match (&a.update, &a.name) {
        (Some(file), Some(name)) => {
            let rel = [path.strip_prefix(root).unwrap_or(path).to_path_buf()];
            super::update_between_markers(file, name, &format!("{table}{note}"), &rel, 2, "arfsnic model --bench")?
        }
        _ => print!("{table}{note}"),
    }
    Ok(())
}

/// `VmHWM` of /proc/self/status in MiB.
fn peak_rss_mib() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: f64 =
        s.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb / 1024.0)
}
