//! The `arfsnic` command line.

pub mod classify;
pub mod model;
pub mod serve;
pub mod signals;

use anyhow::Context;
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
    /// Provision, build the patched 7.3 kernel (cached), run llc-within and llc-across with
    /// net.core.arfs_llc_affinity 0 and 1, print the steer-rate table, write JSON/CSV/SVG.
    /// --patch builds a kernel with your patch instead.
    Demo(DemoArgs),
    /// Show where the emulated NIC would deliver one flow (RSS hash, slot, queue, filter).
    Classify(classify::ClassifyArgs),
    /// Check what runs need (QEMU 10 with vhost-user, KVM or TCG, memfd, sockets, host
    /// tools, guest kernels, disk) and print what to install on Debian/Ubuntu and Fedora;
    /// exits 1 when a check fails.
    Doctor,
    /// Compare a run report with a baseline report; exits non-zero when a metric regressed (docs/ci.md).
    Compare(CompareArgs),
    /// A CI matrix (kernels x scenarios x profiles, configs/matrices/default.toml): list its cells
    /// or run one shard of them, one report per cell (docs/ci.md, "Matrices").
    Matrix(MatrixArgs),
    /// Model mode: run a scenario in the discrete-event twin of RFS/aRFS and the device
    /// model, without QEMU or a kernel build (docs/model.md); prints the steer-rate table,
    /// writes the same JSON report as `run` with `mode = "model"`.
    Model(model::ModelArgs),
    /// Work with NIC profiles.
    Profile {
        #[command(subcommand)]
        command: ProfileCommand,
    },
    /// Print the steer-rate table of report files (`arfsnic run --json`, the demo's NAME.json), as text or markdown,
    /// or (--email) as a plain-text block to paste into a patch email.
    #[command(alias = "report")]
    Results(ResultsArgs),
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
    /// Guest kernel: a name (patched-7.3, patched-6.12, vanilla-7.3, vanilla-6.12,
    /// debian-6.1, debian-6.12, debian-7.3) or a bzImage path; overrides the scenario.
    #[arg(long)]
    pub kernel: Option<String>,
    /// Kernel tree to build the guest module against (with --kernel PATH).
    #[arg(long)]
    pub kdir: Option<PathBuf>,
    /// Directory for serial logs and QEMU command lines (default: .cache/runs/<scenario>).
    #[arg(long)]
    pub logdir: Option<PathBuf>,
    /// Guest user space: initramfs (busybox) or debian (the trixie image with ethtool,
    /// bcc, python3); overrides the scenario's vm.guest.
    #[arg(long, value_parser = ["initramfs", "debian"])]
    pub guest: Option<String>,
    /// Count this kernel function with bcc's `funccount -i 1` in the guest beside the
    /// run (e.g. arfs_rx_flow_steer); needs --guest debian.
    #[arg(long, value_name = "FUNC")]
    pub funccount: Option<String>,
    /// No progress spinner.
    #[arg(long)]
    pub quiet: bool,
    /// After the run, compare the report with this baseline report (docs/ci.md); exit non-zero on a regression.
    #[arg(long, value_name = "B.json")]
    pub baseline: Option<PathBuf>,
    /// With --baseline: allowed worsening of a metric, in percent (default 10); a metric must also exceed its floor.
    #[arg(long, value_name = "PCT", requires = "baseline", value_parser = crate::report::baseline::parse_max_regress)]
    pub max_regress: Option<f64>,
    /// Also write the run's health verdicts (and, with --baseline, one case per run ×
    /// metric) as KTAP version 1 test cases to FILE.
    #[arg(long, value_name = "FILE")]
    pub ktap: Option<PathBuf>,
    /// The same cases as JUnit XML (GitLab and GitHub render it) to FILE.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Serve the live counters (per-queue packets, filter commands and errors, the
    /// driver's steer calls and lock contention, the partner's RTT) in Prometheus text on
    /// http://ADDR/metrics during the run, e.g. 127.0.0.1:9464.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// For `git bisect run`: build the kernel tree --kdir first (incrementally; a tree
    /// without .config gets the pipeline's), boot it, compare with --baseline and exit 0
    /// (good), 1 (a --bisect-on metric regressed) or 125 (skip: the tree does not build,
    /// the module does not build, the guest does not boot or the run is not healthy);
    /// 128 stops the bisect (bad arguments, scenario or baseline; a doctor check fails).
    #[arg(long, requires_all = ["baseline", "kdir"], conflicts_with = "kernel")]
    pub bisect: bool,
    /// With --bisect: the metrics that decide good or bad, comma-separated (names as in
    /// `arfsnic compare`'s table, docs/ci.md).
    #[arg(long, value_name = "METRIC,...", requires = "bisect", value_delimiter = ',', default_value = "guest.steer_calls_per_s", value_parser = crate::report::baseline::parse_metric_name)]
    pub bisect_on: Vec<String>,
    /// With --bisect: parallel make jobs for the kernel build (default: the number of CPUs).
    #[arg(long, value_name = "N", requires = "bisect")]
    pub jobs: Option<usize>,
}

#[derive(clap::Args, Debug)]
pub struct CompareArgs {
    /// Baseline report (`arfsnic run --json` of the reference kernel).
    #[arg(long, value_name = "B.json", required_unless_present = "merge", conflicts_with = "merge")]
    pub baseline: Option<PathBuf>,
    /// Report to check (`arfsnic run --json` of the kernel under test).
    #[arg(long, value_name = "A.json", required_unless_present = "merge", conflicts_with = "merge")]
    pub report: Option<PathBuf>,
    /// Join the reports of a matrix's shards (files, or directories of *.json) into one
    /// steer-rate table across kernels; with --out also results.json, results.csv and
    /// steer-rate.svg there. Refuses the same cell twice and cells of one scenario that
    /// cannot be compared.
    #[arg(long, value_name = "REPORT.json|DIR", num_args = 1..)]
    pub merge: Vec<PathBuf>,
    /// With --merge: write results.json, results.csv and steer-rate.svg here.
    #[arg(long, value_name = "DIR", requires = "merge")]
    pub out: Option<PathBuf>,
    /// Allowed worsening of a metric, in percent; a metric must also exceed its floor.
    #[arg(long, value_name = "PCT", default_value_t = crate::report::baseline::DEFAULT_MAX_REGRESS_PCT, value_parser = crate::report::baseline::parse_max_regress)]
    pub max_regress: f64,
    /// Also write the report's health verdicts and one case per run × compared metric as KTAP version 1 test cases to FILE.
    #[arg(long, value_name = "FILE")]
    pub ktap: Option<PathBuf>,
    /// The same cases as JUnit XML (GitLab and GitHub render it) to FILE.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct MatrixArgs {
    /// The matrix file.
    #[arg(long, value_name = "FILE", default_value = "configs/matrices/default.toml")]
    pub matrix: PathBuf,
    /// Print the cells (`I/N KERNEL SCENARIO PROFILE`) and exit.
    #[arg(long, conflicts_with = "shard")]
    pub list: bool,
    /// Run shard I of N: the cells whose number is I modulo N (1 <= I <= N).
    #[arg(long, value_name = "I/N", value_parser = crate::runner::matrix::parse_shard, required_unless_present = "list")]
    pub shard: Option<(usize, usize)>,
    /// Where the cells' reports go (SCENARIO@KERNEL@PROFILE.json) with their logs.
    #[arg(long, value_name = "DIR", default_value = "matrix-out")]
    pub out: PathBuf,
    /// auto (KVM if it really works, else TCG), kvm or tcg; overrides the scenarios.
    #[arg(long)]
    pub accel: Option<String>,
    /// No progress spinner.
    #[arg(long)]
    pub quiet: bool,
}

#[derive(clap::Args, Debug)]
pub struct ResultsArgs {
    /// Report files; their runs become the table's rows, in this order.
    #[arg(required = true, value_name = "REPORT.json")]
    pub reports: Vec<PathBuf>,
    /// Print a markdown table (for README and docs/results.md) instead of the aligned text.
    #[arg(long)]
    pub markdown: bool,
    /// Print each report as a block to paste into a patch email: ASCII, at most 80
    /// columns, one row per run (Latency, CPU, Add, Del, Steer-C in K/M units, Steer-C/s,
    /// health) under a header with the kernel, topology, profile and arfsnic version.
    #[arg(long, conflicts_with_all = ["markdown", "update", "sweep"])]
    pub email: bool,
    /// Replace the lines between `<!-- results:NAME -->` and `<!-- /results:NAME -->` in FILE with the table instead of printing it (NAME is --name).
    #[arg(long, value_name = "FILE", requires = "name")]
    pub update: Option<PathBuf>,
    /// The marker name for --update.
    #[arg(long)]
    pub name: Option<String>,
    /// Print the rps_flow_cnt sweep of each report (one row per rps_flow_cnt, a column
    /// group per kernel, the old/new Steer-C ratio) instead of the steer-rate table.
    #[arg(long)]
    pub sweep: bool,
    /// With --sweep: also write the Steer-C vs rps_flow_cnt line plot here (SVG).
    #[arg(long, value_name = "FILE", requires = "sweep")]
    pub svg: Option<PathBuf>,
    /// Also write the reports as one self-contained HTML page to FILE (what `demo` writes
    /// as index.html): the table, the plots, the per-flow view and the runs' settings.
    #[arg(long, value_name = "FILE", conflicts_with = "email")]
    pub html: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Output directory: results.json, results.csv, steer-rate.svg, index.html (table, plots, per-flow view and settings in one page), one report per scenario, logs/.
    #[arg(long, default_value = "demo-out")]
    pub out: PathBuf,
    /// Scenarios to run (names in configs/scenarios/ or files), comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = crate::runner::demo::DEFAULT_SCENARIOS.map(String::from))]
    pub scenarios: Vec<String>,
    /// Also run the seed's TCP pod after the scenarios: brpc-pod (16 vCPUs in 2 LLCs)
    /// and brpc-pod-1llc (one LLC), 512 pooled connections, work stealing (README says
    /// what it costs in time).
    #[arg(long)]
    pub full: bool,
    /// auto (KVM if it really works, else TCG), kvm or tcg.
    #[arg(long, value_parser = ["auto", "kvm", "tcg"])]
    pub accel: Option<String>,
    /// Guest kernel instead of the scenarios' (patched-7.3): a kernel name (patched-6.12,
    /// debian-7.3, …) or a bzImage (with --kdir).
    #[arg(long, conflicts_with = "patch")]
    pub kernel: Option<String>,
    /// The tree a --kernel bzImage was built from (to build the guest module against).
    #[arg(long, requires = "kernel")]
    pub kdir: Option<PathBuf>,
    /// Bring your own patch: build (cached by content) a kernel from Debian's source of
    /// --base with this patch, or with every *.patch of this directory in name order,
    /// instead of the LLC-affinity patch; repeatable.
    #[arg(long, value_name = "FILE|DIR")]
    pub patch: Vec<PathBuf>,
    /// With --patch: the Debian source to apply it to.
    #[arg(long, value_parser = ["7.3", "6.12"], default_value = "7.3", requires = "patch")]
    pub base: String,
    /// Replace each scenario's runs with one run per value of a sysctl: KEY=V0,V1,…
    /// (e.g. net.core.arfs_llc_affinity=0,1).
    #[arg(long, value_name = "KEY=V0,V1", value_parser = crate::runner::demo::parse_sysctl_sweep)]
    pub sysctl: Option<(String, Vec<String>)>,
    /// Guest user space: initramfs (busybox, default) or debian (the trixie image; bcc's
    /// `funccount -i 1 arfs_rx_flow_steer` then counts the steers beside each run).
    #[arg(long, value_parser = ["initramfs", "debian"])]
    pub guest: Option<String>,
    /// Do not run guest-tests/provision.sh (it runs when the demo runs as root).
    #[arg(long)]
    pub no_provision: bool,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
    /// Run each scenario N times; the ratio lines give the median of the valid runs and their spread.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,
    /// Model mode instead of VMs: the seed-scale tables from the RFS/aRFS twin (the
    /// seed's 256-CPU test bed, the arfs_lock contention curve) in seconds, no kernel
    /// build, no QEMU (docs/model.md).
    #[arg(long, conflicts_with_all = ["full", "accel", "kernel", "kdir", "patch", "sysctl", "guest", "repeat"])]
    pub model: bool,
}

#[derive(Subcommand, Debug)]
pub enum ProfileCommand {
    /// Validate a profile; exits non-zero with a message naming the file and field.
    Check {
        /// Profile file (TOML), e.g. configs/mlx5-cx6.toml.
        file: PathBuf,
    },
}

/// `git bisect run`'s exit codes, as `run --bisect` uses them (docs/ci.md, "git bisect").
pub mod bisect_exit {
    /// The commit is good: no --bisect-on metric regressed against the baseline.
    pub const GOOD: u8 = 0;
    /// The commit is bad: a --bisect-on metric regressed.
    pub const BAD: u8 = 1;
    /// The commit cannot be judged: it does not build or boot, or its run is not healthy.
    pub const SKIP: u8 = 125;
    /// Stop the bisect: the command, its files or the machine are wrong, not the commit.
    pub const ABORT: u8 = 128;
}

/// `run --bisect`: this commit cannot be judged (exit 125).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BisectSkip(pub String);

/// A metric regressed against the baseline (`run --baseline`, `compare`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Regressed(pub String);

pub fn main() -> ExitCode {
    let bisect_arg = std::env::args().any(|a| a == "--bisect");
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        // A mistyped `git bisect run arfsnic run --bisect …` must stop the bisect, not
        // mark every commit bad (clap's usage errors exit 2).
        Err(e) if bisect_arg && e.use_stderr() => {
            let _ = e.print();
            return ExitCode::from(bisect_exit::ABORT);
        }
        Err(e) => e.exit(),
    };
    let bisect = matches!(&cli.command, Command::Run(a) if a.bisect);
    // The demo prints a table; the backend's connection messages would only interleave.
    let level = if matches!(cli.command, Command::Demo(_)) { "warn" } else { "info" };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level)).init();
    let long_running = matches!(cli.command, Command::Demo(_) | Command::Run(_) | Command::Serve(_));
    let interrupt = match long_running.then(signals::install).transpose() {
        Ok(i) => i.unwrap_or_default(),
        Err(e) => {
            eprintln!("arfsnic: error: installing the SIGINT/SIGTERM handlers: {e}");
            return ExitCode::FAILURE;
        }
    };
    let r = match cli.command {
        Command::Classify(a) => classify::run(&a),
        Command::Demo(a) => demo(&a, &interrupt),
        Command::Compare(a) => compare(&a),
        Command::Profile { command: ProfileCommand::Check { file } } => profile_check(&file),
        Command::Results(a) => results(&a),
        Command::Doctor => doctor(),
        Command::Matrix(a) => matrix(&a, &interrupt),
        Command::Model(a) => model::run(&a),
        Command::Run(a) => run(&a, &interrupt),
        Command::Serve(a) => serve::run(&a, &interrupt),
    };
    match r {
        Ok(()) if bisect => {
            eprintln!("arfsnic: bisect: good (exit {})", bisect_exit::GOOD);
            ExitCode::from(bisect_exit::GOOD)
        }
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<crate::runner::Interrupted>().is_some() => {
            eprintln!("arfsnic: {e}; the report holds the runs that finished (complete = false)");
            ExitCode::from(interrupt.exit_code())
        }
        Err(e) if bisect => {
            let (what, code) = if e.downcast_ref::<Regressed>().is_some() {
                ("bad", bisect_exit::BAD)
            } else if e.downcast_ref::<BisectSkip>().is_some() || e.downcast_ref::<Unhealthy>().is_some() {
                ("skip", bisect_exit::SKIP)
            } else {
                ("stop the bisect", bisect_exit::ABORT)
            };
            eprintln!("arfsnic: {e:#}");
            eprintln!("arfsnic: bisect: {what} (exit {code})");
            ExitCode::from(code)
        }
        Err(e) if e.downcast_ref::<Unhealthy>().is_some() => {
            eprintln!("arfsnic: {e}");
            ExitCode::from(3)
        }
        Err(e) => {
            eprintln!("arfsnic: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs that did not reach `ok` (after their retries): exit code 3 (docs/measuring.md,
/// "Run health").
#[derive(Debug)]
pub struct Unhealthy(pub String);

impl std::fmt::Display for Unhealthy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not every run is ok; its numbers are flagged in the table:\n{}", self.0)
    }
}

impl std::error::Error for Unhealthy {}

fn run(a: &RunArgs, interrupt: &crate::runner::Interrupt) -> anyhow::Result<()> {
    // A bad baseline fails before the (long) run, not after it.
    let baseline = a.baseline.as_deref().map(|p| crate::report::baseline::Report::load(p, "baseline")).transpose()?;
    if let Some(b) = &baseline {
        let name = crate::runner::scenario::Scenario::load(&a.scenario)?.name;
        if name != b.scenario {
            anyhow::bail!("{} is for scenario {:?}, {} is {:?}", b.source, b.scenario, a.scenario.display(), name);
        }
    }
    // The module is built with `make -C guest-tests/module KDIR=…`: a relative tree
    // would be taken relative to that directory.
    let kdir = a
        .kdir
        .as_deref()
        .map(|d| std::fs::canonicalize(d).with_context(|| format!("--kdir {}: no such directory", d.display())))
        .transpose()?;
    let opts = crate::runner::RunOptions {
        accel: a.accel.clone(),
        kernel: a.kernel.clone(),
        kdir: kdir.clone(),
        logdir: a.logdir.clone(),
        guest: a.guest.clone(),
        funccount: a.funccount.clone(),
        quiet: a.quiet,
        metrics: a.metrics.clone(),
        profile: None,
        interrupt: interrupt.clone(),
    };
    // A scenario that does not load is the file's fault; past that, a failing run may be
    // the machine's: say which of doctor's checks fail.
    let scenario = crate::runner::scenario::Scenario::load(&a.scenario)?;
    let mut opts = opts;
    if let (true, Some(tree)) = (a.bisect, &kdir) {
        opts.kernel = Some(bisect_build(a, tree, &scenario.name)?);
    }
    let report = crate::runner::run_scenario(&a.scenario, &opts).map_err(|e| {
        let fails: Vec<String> = crate::runner::env::repo_root()
            .map(|root| {
                crate::runner::doctor::checks(&root)
                    .into_iter()
                    .filter(|c| c.status == crate::runner::doctor::Status::Fail)
                    .map(|c| c.to_string())
                    .collect()
            })
            .unwrap_or_default();
        if !fails.is_empty() {
            eprintln!("arfsnic doctor: this machine fails {} check(s):\n{}", fails.len(), fails.join("\n"));
        }
        // The commit's kernel or module did not make it to a result; unless the machine
        // is the cause, `git bisect` skips the commit.
        if a.bisect && fails.is_empty() && !interrupt.requested() {
            BisectSkip(format!("the run did not finish: {e:#}")).into()
        } else {
            e
        }
    })?;
    let text = report.to_json_pretty();
    match &a.json {
        Some(p) => {
            std::fs::write(p, &text)?;
            eprintln!("report written to {}", p.display());
        }
        None => println!("{text}"),
    }
    print!("{}", crate::report::table::summary_table(&report));
    if let Some(sw) = crate::report::sweep::sweep(&report) {
        print!("\n{}", crate::report::sweep::table(&sw));
    }
    if let Some(sig) = &report.interrupted {
        return Err(crate::runner::Interrupted(sig.clone()).into());
    }
    let mut cases = crate::report::cases::health_cases(&report);
    let unhealthy = crate::report::table::unhealthy(&report);
    if a.bisect {
        if let Some(m) = &unhealthy {
            // Numbers of a run that is not ok judge nothing: neither good nor bad.
            crate::report::cases::write(a.ktap.as_deref(), a.junit.as_deref(), &suite_name(&report), &cases)?;
            return Err(BisectSkip(format!("not every run is ok, so this commit cannot be judged:\n{m}")).into());
        }
    }
    let mut regressed = Ok(());
    if let Some(b) = &baseline {
        let source = a.json.as_ref().map_or_else(|| "report".to_string(), |p| format!("report {}", p.display()));
        let current = crate::report::baseline::Report::from_report(&report, &source).map_err(anyhow::Error::msg)?;
        let max = a.max_regress.unwrap_or(crate::report::baseline::DEFAULT_MAX_REGRESS_PCT);
        let mut o = crate::report::baseline::compare(b, &current, max)?;
        if a.bisect {
            o.retain_metrics(&a.bisect_on);
        }
        cases.extend(crate::report::cases::comparison_cases(&o));
        regressed = baseline_verdict(b, &o);
    }
    crate::report::cases::write(a.ktap.as_deref(), a.junit.as_deref(), &suite_name(&report), &cases)?;
    regressed?;
    match unhealthy {
        Some(m) => Err(Unhealthy(m).into()),
        None => Ok(()),
    }
}

fn suite_name(report: &crate::report::Report) -> String {
    format!("arfsnic {} on {}", report.scenario, report.kernel)
}

/// `run --bisect`: build the checked-out tree (--kdir); the bzImage to boot. A tree that
/// does not build is [`BisectSkip`]; no kernel tree or no build tools stop the bisect.
fn bisect_build(a: &RunArgs, tree: &std::path::Path, scenario: &str) -> anyhow::Result<String> {
    use crate::runner::bisect::{build_tree, BuildError};
    let root = crate::runner::env::repo_root()?;
    let logdir = a.logdir.clone().unwrap_or_else(|| crate::runner::env::cache_dir(&root).join("runs").join(scenario));
    let log = logdir.join("kernel-build.log");
    let jobs = a.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, usize::from));
    eprintln!("arfsnic: bisect: building {} (make -j{jobs}; log {})", tree.display(), log.display());
    match build_tree(tree, &root.join("guest-tests/kernel"), jobs, &log) {
        Ok(b) => {
            eprintln!(
                "arfsnic: bisect: built {} {} in {:.0} s",
                b.kernelversion,
                b.commit.as_deref().unwrap_or("(not a git tree)"),
                b.seconds
            );
            Ok(b.bzimage.display().to_string())
        }
        Err(BuildError::Failed(m)) => Err(BisectSkip(format!("this commit does not build: {m}")).into()),
        Err(e) => Err(e.into()),
    }
}

fn matrix(a: &MatrixArgs, interrupt: &crate::runner::Interrupt) -> anyhow::Result<()> {
    use crate::runner::matrix;
    let root = crate::runner::env::repo_root()?;
    let path = if a.matrix.is_absolute() || a.matrix.exists() { a.matrix.clone() } else { root.join(&a.matrix) };
    let m = matrix::Matrix::load(&path, &root)?;
    let cells = m.cells();
    let Some(sh) = a.shard else {
        for c in &cells {
            println!("{}/{} {} {} {}", c.index, c.total, c.kernel, c.scenario, c.profile);
        }
        return Ok(());
    };
    let mine = matrix::shard(&cells, sh);
    anyhow::ensure!(
        !mine.is_empty(),
        "--shard {}/{}: {} has {} cells, so this shard has none",
        sh.0,
        sh.1,
        path.display(),
        cells.len()
    );
    eprintln!(
        "matrix {}: shard {}/{}: cells {:?} of {}",
        path.display(),
        sh.0,
        sh.1,
        mine.iter().map(|c| c.index).collect::<Vec<_>>(),
        cells.len()
    );
    let opts = crate::runner::RunOptions {
        accel: a.accel.clone(),
        quiet: a.quiet,
        interrupt: interrupt.clone(),
        ..Default::default()
    };
    let files = matrix::run_cells(&root, &mine, &a.out, &opts)?;
    for f in &files {
        println!("{}", f.display());
    }
    if interrupt.requested() {
        return Err(crate::runner::Interrupted(interrupt.signal_name()).into());
    }
    Ok(())
}

fn merge(a: &CompareArgs) -> anyhow::Result<()> {
    let mut files = Vec::new();
    for p in &a.merge {
        if p.is_dir() {
            files.extend(crate::report::merge::reports_in(p)?);
        } else {
            files.push(p.clone());
        }
    }
    let reports = crate::report::merge::merge(&files)?;
    let rows: Vec<_> = reports.iter().flat_map(crate::report::results::rows).collect();
    print!("{}", crate::report::results::table(&rows));
    if let Some(out) = &a.out {
        let o = crate::report::results::write_outputs(out, &reports)?;
        eprintln!("merged {} reports: {}, {}, {}", reports.len(), o.json.display(), o.csv.display(), o.svg.display());
    }
    Ok(())
}

fn compare(a: &CompareArgs) -> anyhow::Result<()> {
    if !a.merge.is_empty() {
        return merge(a);
    }
    let (Some(base), Some(rep)) = (&a.baseline, &a.report) else {
        anyhow::bail!("compare needs --baseline and --report, or --merge");
    };
    let b = crate::report::baseline::Report::load(base, "baseline")?;
    let current = crate::report::baseline::Report::load(rep, "report")?;
    let o = crate::report::baseline::compare(&b, &current, a.max_regress)?;
    if a.ktap.is_some() || a.junit.is_some() {
        let full = crate::report::Report::load(rep, "report")?;
        let mut cases = crate::report::cases::health_cases(&full);
        cases.extend(crate::report::cases::comparison_cases(&o));
        let suite = format!("arfsnic {} on {} against {}", full.scenario, full.kernel, b.source);
        crate::report::cases::write(a.ktap.as_deref(), a.junit.as_deref(), &suite, &cases)?;
    }
    baseline_verdict(&b, &o)
}

/// Print the comparison table; an error naming every regressed metric.
fn baseline_verdict(b: &crate::report::baseline::Report, o: &crate::report::baseline::Outcome) -> anyhow::Result<()> {
    print!("{}", crate::report::baseline::render_table(o));
    match o.regression_message() {
        Some(m) => Err(Regressed(format!("against {}: {m}", b.source)).into()),
        None => Ok(()),
    }
}

fn demo(a: &DemoArgs, interrupt: &crate::runner::Interrupt) -> anyhow::Result<()> {
    if a.model {
        return model::demo_model(&a.out);
    }
    let o = crate::runner::demo::DemoOptions {
        out: a.out.clone(),
        scenarios: {
            let mut v = a.scenarios.clone();
            if a.full {
                v.extend(
                    crate::runner::demo::FULL_EXTRA_SCENARIOS
                        .iter()
                        .map(|s| s.to_string())
                        .filter(|s| !a.scenarios.contains(s)),
                );
            }
            v
        },
        accel: a.accel.clone(),
        kernel: a.kernel.clone(),
        kdir: a.kdir.clone(),
        patch: a.patch.clone(),
        base: a.base.clone(),
        sysctl: a.sysctl.clone(),
        guest: a.guest.clone(),
        no_provision: a.no_provision,
        quiet: a.quiet,
        repeat: a.repeat,
        interrupt: interrupt.clone(),
    };
    let r = crate::runner::demo::run_demo(&o)?;
    let outputs = crate::report::results::write_outputs(&o.out, &r.reports)?;
    let html = o.out.join("index.html");
    let sources: Vec<String> = r.reports.iter().map(|x| format!("{}.json", x.scenario)).collect();
    crate::report::html::write_page(&html, &r.reports, &sources)?;
    let rows: Vec<_> = r.reports.iter().flat_map(crate::report::results::rows).collect();
    // One setup line per distinct (kernel, topology, traffic time): `--full` adds the
    // 16-vCPU pod to the 4-vCPU UDP pair.
    let mut setups: Vec<(String, Vec<&str>)> = Vec::new();
    for rep in &r.reports {
        let duration = rep.runs.first().and_then(|x| x.duration_s).map_or_else(|| "-".into(), |d| d.to_string());
        let line = format!(
            "{} ({}, {} vCPUs: {}), {duration} s of traffic per run",
            rep.kernel, rep.accel, rep.vcpus, rep.topology
        );
        match setups.iter_mut().find(|(l, _)| *l == line) {
            Some((_, names)) => names.push(&rep.scenario),
            None => setups.push((line, vec![&rep.scenario])),
        }
    }
    println!();
    for (line, names) in &setups {
        match setups.len() {
            1 => println!("steer rate of {line}"),
            _ => println!("steer rate of {line}: {}", names.join(", ")),
        }
    }
    println!();
    print!("{}", crate::report::results::table(&rows));
    for rep in &r.reports {
        for line in crate::report::table::scenario_funccount_lines(rep) {
            println!("  {line}");
        }
    }
    println!();
    for p in [&outputs.json, &outputs.csv, &outputs.svg, &html] {
        println!("wrote {}", p.display());
    }
    println!(
        "wall time {:.0} s (provisioning {:.0} s, kernel {:.0} s, runs {:.0} s)",
        r.wall_s, r.provision_s, r.kernel_s, r.runs_s
    );
    if let Some(sig) = r.reports.iter().find_map(|x| x.interrupted.clone()) {
        return Err(crate::runner::Interrupted(sig).into());
    }
    let bad: Vec<String> = r.reports.iter().filter_map(crate::report::table::unhealthy).collect();
    match bad.is_empty() {
        true => Ok(()),
        false => Err(Unhealthy(bad.join("\n")).into()),
    }
}

/// `arfsnic results`: the steer-rate table of report files, printed or written between
/// a document's markers, so README and docs/results.md are regenerated, not retyped.
fn doctor() -> anyhow::Result<()> {
    let root = crate::runner::env::repo_root()?;
    let checks = crate::runner::doctor::checks(&root);
    for c in &checks {
        println!("{c}");
    }
    let failed = checks.iter().filter(|c| c.status == crate::runner::doctor::Status::Fail).count();
    anyhow::ensure!(failed == 0, "{failed} check(s) failed (the lines marked FAIL say what to install)");
    Ok(())
}

fn results(a: &ResultsArgs) -> anyhow::Result<()> {
    if let Some(file) = &a.html {
        let mut reports = Vec::new();
        for p in &a.reports {
            reports.push(crate::report::Report::load(p, "report")?);
        }
        let sources: Vec<String> = a.reports.iter().map(|p| p.display().to_string()).collect();
        crate::report::html::write_page(file, &reports, &sources)?;
        eprintln!("wrote {}", file.display());
    }
    if a.sweep {
        return sweep_results(a);
    }
    if a.email {
        let mut blocks = Vec::new();
        for p in &a.reports {
            let report = crate::report::Report::load(p, "report")?;
            blocks.push(crate::report::email::email(&report, env!("CARGO_PKG_VERSION")));
        }
        print!("{}", blocks.join("\n"));
        return Ok(());
    }
    let mut rows = Vec::new();
    // bcc funccount beside a run (the Debian guest): one line per run under the table.
    let mut funccount = Vec::new();
    for p in &a.reports {
        let report = crate::report::Report::load(p, "report")?;
        rows.extend(crate::report::results::rows(&report));
        funccount.extend(crate::report::table::scenario_funccount_lines(&report));
    }
    let mut table = match (a.markdown, a.update.is_some()) {
        (true, _) => crate::report::results::markdown(&rows),
        // Text inside a document goes in a code block.
        (false, true) => format!("```\n{}```\n", crate::report::results::table(&rows)),
        (false, false) => crate::report::results::table(&rows),
    };
    if !funccount.is_empty() {
        let bullet = if a.markdown { "- " } else { "  " };
        let lines: Vec<String> = funccount.iter().map(|l| format!("{bullet}{l}\n")).collect();
        table.push_str(&format!("\n{}", lines.concat()));
    }
    let (Some(file), Some(name)) = (&a.update, &a.name) else {
        print!("{table}");
        return Ok(());
    };
    update_between_markers(file, name, &table, &a.reports, rows.len(), "arfsnic results")
}

/// Replace what stands between `<!-- results:NAME -->` and `<!-- /results:NAME -->` in
/// FILE with `table`, noting the report files it came from.
pub(super) fn update_between_markers(
    file: &std::path::Path,
    name: &str,
    table: &str,
    reports: &[PathBuf],
    rows: usize,
    generator: &str,
) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(file).map_err(|e| anyhow::anyhow!("--update {}: {e}", file.display()))?;
    let (open, close) = (format!("<!-- results:{name} -->"), format!("<!-- /results:{name} -->"));
    let (Some(i), Some(j)) = (text.find(&open), text.find(&close)) else {
        anyhow::bail!("--update {}: no {open} ... {close} markers in it", file.display());
    };
    anyhow::ensure!(i < j, "--update {}: {close} comes before {open}", file.display());
    let sources: Vec<String> = reports.iter().map(|p| p.display().to_string()).collect();
    let new = format!(
        "{}{open}\n<!-- generated by `{generator}` from {}; do not edit by hand -->\n{table}{}",
        &text[..i],
        sources.join(", "),
        &text[j..]
    );
    std::fs::write(file, new).map_err(|e| anyhow::anyhow!("--update {}: {e}", file.display()))?;
    eprintln!("updated {} ({name}: {rows} rows)", file.display());
    Ok(())
}

/// `arfsnic results --sweep`: Krishna's table from sweep reports.
fn sweep_results(a: &ResultsArgs) -> anyhow::Result<()> {
    let (mut text, mut rows) = (String::new(), 0);
    for p in &a.reports {
        let r = crate::report::Report::load(p, "report")?;
        let s = crate::report::sweep::sweep(&r).ok_or_else(|| {
            anyhow::anyhow!(
                "{}: its runs do not vary rps_flow_cnt (no sweep; see configs/scenarios/rps-flow-cnt-sweep.toml)",
                p.display()
            )
        })?;
        rows += s.sizes.len();
        text += &match (a.markdown, a.update.is_some()) {
            (true, _) => crate::report::sweep::markdown(&s),
            (false, true) => format!("```\n{}```\n", crate::report::sweep::table(&s)),
            (false, false) => crate::report::sweep::table(&s),
        };
        if let Some(svg) = &a.svg {
            std::fs::write(svg, crate::report::sweep::svg(&s)?)
                .map_err(|e| anyhow::anyhow!("--svg {}: {e}", svg.display()))?;
            eprintln!("wrote {}", svg.display());
        }
    }
    match (&a.update, &a.name) {
        (Some(file), Some(name)) => {
            update_between_markers(file, name, &text, &a.reports, rows, "arfsnic results --sweep")
        }
        _ => {
            print!("{text}");
            Ok(())
        }
    }
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
