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
    /// Show where the emulated NIC would deliver one flow (RSS hash, slot, queue, filter).
    Classify(classify::ClassifyArgs),
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
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Classify(a) => classify::run(&a),
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
