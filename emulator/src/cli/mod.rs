//! The `arfsnic` command line.

pub mod classify;
pub mod serve;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(name = "arfsnic", version, about = "NIC emulator with RSS and an aRFS filter table, for kernel developers")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Provision, build the patched kernel (cached), run llc-within and llc-across with
    /// net.core.arfs_llc_affinity 0 and 1, print the steer-rate table, write JSON/CSV/SVG.
    Demo(DemoArgs),
    /// Show where the emulated NIC would deliver one flow (RSS hash, slot, queue, filter).
    Classify(classify::ClassifyArgs),
    /// Compare a run report with a baseline report; exits non-zero when a metric regressed (docs/ci.md).
    Compare(CompareArgs),
    /// Work with NIC profiles.
    Profile {
        #[command(subcommand)]
        command: ProfileCommand,
    },
    /// Run a scenario: backend + QEMU + guest kernel, traffic, JSON report.
    Run(RunArgs),
    /// Serve the emulated NIC on a vhost-user socket for a QEMU you start yourself (see qemu/README.md).
    Serve(serve::ServeArgs),
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Scenario file, e.g. configs/scenarios/smoke.toml.
    #[arg(long)]
    pub scenario: PathBuf,
    /// Write the JSON report here.
    #[arg(long, value_name = "OUT")]
    pub json: Option<PathBuf>,
    /// auto (KVM if it really works, else TCG), kvm or tcg; overrides the scenario.
    #[arg(long)]
    pub accel: Option<String>,
    /// Guest kernel: debian-6.1, debian-6.12 or a bzImage path; overrides the scenario.
    #[arg(long)]
    pub kernel: Option<String>,
    /// Kernel tree to build the guest module against (with --kernel PATH).
    #[arg(long)]
    pub kdir: Option<PathBuf>,
    /// Directory for serial logs and QEMU command lines (default: .cache/runs/<scenario>).
    #[arg(long)]
    pub logdir: Option<PathBuf>,
    /// No progress spinner.
    #[arg(long)]
    pub quiet: bool,
    /// After the run, compare the report with this baseline report (docs/ci.md); exit non-zero on a regression.
    #[arg(long, value_name = "B.json")]
    pub baseline: Option<PathBuf>,
    /// With --baseline: allowed worsening of a metric, in percent (default 10); a metric must also exceed its floor.
    #[arg(long, value_name = "PCT", requires = "baseline", value_parser = crate::baseline::parse_max_regress)]
    pub max_regress: Option<f64>,
}

#[derive(clap::Args, Debug)]
pub struct CompareArgs {
    /// Baseline report (`arfsnic run --json` of the reference kernel).
    #[arg(long, value_name = "B.json")]
    pub baseline: PathBuf,
    /// Report to check (`arfsnic run --json` of the kernel under test).
    #[arg(long, value_name = "A.json")]
    pub report: PathBuf,
    /// Allowed worsening of a metric, in percent; a metric must also exceed its floor.
    #[arg(long, value_name = "PCT", default_value_t = crate::baseline::DEFAULT_MAX_REGRESS_PCT, value_parser = crate::baseline::parse_max_regress)]
    pub max_regress: f64,
}

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Output directory: results.json, results.csv, steer-rate.svg, one report per scenario, logs/.
    #[arg(long, default_value = "demo-out")]
    pub out: PathBuf,
    /// Scenarios to run (names in configs/scenarios/ or files), comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = crate::demo::DEFAULT_SCENARIOS.map(String::from))]
    pub scenarios: Vec<String>,
    /// auto (KVM if it really works, else TCG), kvm or tcg.
    #[arg(long, value_parser = ["auto", "kvm", "tcg"])]
    pub accel: Option<String>,
    /// Bring your own kernel: a bzImage to boot instead of the built patched-6.12.
    #[arg(long, requires = "kdir")]
    pub kernel: Option<String>,
    /// The tree the --kernel was built from (to build the guest module against).
    #[arg(long, requires = "kernel")]
    pub kdir: Option<PathBuf>,
    /// Do not run guest-tests/provision.sh (it runs when the demo runs as root).
    #[arg(long)]
    pub no_provision: bool,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Subcommand, Debug)]
pub enum ProfileCommand {
    /// Validate a profile; exits non-zero with a message naming the file and field.
    Check {
        /// Profile file (TOML), e.g. configs/mlx5-cx6.toml.
        file: PathBuf,
    },
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // The demo prints a table; the backend's connection messages would only interleave.
    let level = if matches!(cli.command, Command::Demo(_)) { "warn" } else { "info" };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level)).init();
    let r = match cli.command {
        Command::Classify(a) => classify::run(&a),
        Command::Demo(a) => demo(&a),
        Command::Compare(a) => compare(&a),
        Command::Profile { command: ProfileCommand::Check { file } } => profile_check(&file),
        Command::Run(a) => run(&a),
        Command::Serve(a) => serve::run(&a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("arfsnic: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(a: &RunArgs) -> anyhow::Result<()> {
    // A bad baseline fails before the (long) run, not after it.
    let baseline = a.baseline.as_deref().map(|p| crate::baseline::Report::load(p, "baseline")).transpose()?;
    if let Some(b) = &baseline {
        let name = crate::scenario::Scenario::load(&a.scenario)?.name;
        if name != b.scenario {
            anyhow::bail!("{} is for scenario {:?}, {} is {:?}", b.source, b.scenario, a.scenario.display(), name);
        }
    }
    let opts = crate::runner::RunOptions {
        accel: a.accel.clone(),
        kernel: a.kernel.clone(),
        kdir: a.kdir.clone(),
        logdir: a.logdir.clone(),
        quiet: a.quiet,
    };
    let report = crate::runner::run_scenario(&a.scenario, &opts)?;
    let text = serde_json::to_string_pretty(&report)?;
    match &a.json {
        Some(p) => {
            std::fs::write(p, &text)?;
            eprintln!("report written to {}", p.display());
        }
        None => println!("{text}"),
    }
    print!("{}", crate::report::summary_table(&report));
    if let Some(b) = &baseline {
        let source = a.json.as_ref().map_or_else(|| "report".to_string(), |p| format!("report {}", p.display()));
        let current = crate::baseline::Report::from_value(&report, &source).map_err(anyhow::Error::msg)?;
        check_baseline(b, &current, a.max_regress.unwrap_or(crate::baseline::DEFAULT_MAX_REGRESS_PCT))?;
    }
    Ok(())
}

fn compare(a: &CompareArgs) -> anyhow::Result<()> {
    let b = crate::baseline::Report::load(&a.baseline, "baseline")?;
    let current = crate::baseline::Report::load(&a.report, "report")?;
    check_baseline(&b, &current, a.max_regress)
}

/// Print the comparison table; an error naming every regressed metric.
fn check_baseline(
    b: &crate::baseline::Report,
    current: &crate::baseline::Report,
    max_regress: f64,
) -> anyhow::Result<()> {
    let o = crate::baseline::compare(b, current, max_regress)?;
    print!("{}", crate::baseline::render_table(&o));
    match o.regression_message() {
        Some(m) => anyhow::bail!("against {}: {m}", b.source),
        None => Ok(()),
    }
}

fn demo(a: &DemoArgs) -> anyhow::Result<()> {
    let o = crate::demo::DemoOptions {
        out: a.out.clone(),
        scenarios: a.scenarios.clone(),
        accel: a.accel.clone(),
        kernel: a.kernel.clone(),
        kdir: a.kdir.clone(),
        no_provision: a.no_provision,
        quiet: a.quiet,
    };
    let r = crate::demo::run_demo(&o)?;
    let rows: Vec<_> = r.reports.iter().flat_map(crate::results::rows).collect();
    let first = &r.reports[0];
    println!(
        "\nsteer rate of {} ({}, {} vCPUs: {}), {} s of traffic per run\n",
        first["kernel"].as_str().unwrap_or("?"),
        first["accel"].as_str().unwrap_or("?"),
        first["vcpus"],
        first["topology"].as_str().unwrap_or("?"),
        first["runs"][0]["duration_s"],
    );
    print!("{}", crate::results::table(&rows));
    println!();
    for p in [&r.outputs.json, &r.outputs.csv, &r.outputs.svg] {
        println!("wrote {}", p.display());
    }
    println!(
        "wall time {:.0} s (provisioning {:.0} s, kernel {:.0} s, runs {:.0} s)",
        r.wall_s, r.provision_s, r.kernel_s, r.runs_s
    );
    Ok(())
}

fn profile_check(file: &std::path::Path) -> anyhow::Result<()> {
    let p = crate::model::profile::Profile::load(file)?;
    let caps = match p.filter.layout {
        crate::model::filter::Layout::PerType => format!("4 x {} rules (per type)", p.filter.capacity),
        crate::model::filter::Layout::Shared => format!("{} rules (shared)", p.filter.capacity),
    };
    println!(
        "{}: ok: profile {:?}, {} queue pairs, filter table {}, {} engine slot(s), add latency mean {:.1} us",
        file.display(),
        p.name,
        p.device.queues,
        caps,
        p.engine.slots,
        p.engine.latency.add.mean_us()
    );
    Ok(())
}
