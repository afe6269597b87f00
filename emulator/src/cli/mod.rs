//! The `arfsnic` command line.

pub mod classify;

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
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("arfsnic: error: {e:#}");
            ExitCode::FAILURE
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
