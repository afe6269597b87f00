//! `arfsnic model`: a scenario in model mode (src/twin/, docs/model.md), and `--fidelity`,
//! the twin against VM reports.

use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ModelArgs {
    /// Scenario: a name in configs/scenarios/ (llc-within) or a file.
    #[arg(long, required_unless_present = "fidelity")]
    pub scenario: Option<String>,
    /// Write the JSON report here.
    #[arg(long, value_name = "OUT")]
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
    /// --fidelity: write the table between `<!-- results:NAME -->` markers of FILE.
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
    let spec = a.scenario.as_deref().unwrap_or_default();
    let path = if spec.contains('/') || spec.ends_with(".toml") {
        PathBuf::from(spec)
    } else {
        root.join("configs/scenarios").join(format!("{spec}.toml"))
    };
    let s = crate::runner::scenario::Scenario::load(&path)?;
    let dir = path.parent().unwrap_or(std::path::Path::new("."));
    let opts = crate::twin::Options { seed: a.seed, twin };
    let report = crate::twin::run_scenario(&s, &root, dir, &opts)?;
    println!("{}", crate::report::results::table(&crate::report::results::rows(&report)).trim_end());
    eprintln!("model: {} run(s) in {:.2} s wall", report.runs.len(), report.wall_s);
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
