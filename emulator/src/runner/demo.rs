//! `arfsnic demo`: the whole story in one command. Provision what is missing (QEMU 10,
//! Debian guest kernels, busybox; guest-tests/provision.sh), build the kernel carrying the
//! LLC-affinity patch once (Debian's linux-source-7.3 + v11 as posted;
//! guest-tests/kernel/build.sh, cached), run the `llc-within` and `llc-across` scenarios
//! with net.core.arfs_llc_affinity at 0 and 1, print the steer-rate table (the CLI writes
//! JSON, CSV and an SVG chart into the output directory). `--patch` builds a kernel with
//! the developer's own patch or series instead, `--sysctl KEY=V0,V1` sets the runs.

use crate::report::schema::Report;
use crate::runner::scenario::{Run, Scenario};
use crate::runner::{self, env, RunOptions};
use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const DEFAULT_SCENARIOS: [&str; 2] = ["llc-within", "llc-across"];

/// What `demo --full` adds: the seed's pod, TCP (docs/scenarios.md, "The seed's pod").
pub const FULL_EXTRA_SCENARIOS: [&str; 2] = ["brpc-pod", "brpc-pod-1llc"];

/// What `--guest debian` counts with bcc's funccount: the module's ndo_rx_flow_steer.
pub const FUNCCOUNT_FUNCTION: &str = "arfs_rx_flow_steer";

#[derive(Clone, Debug, Default)]
pub struct DemoOptions {
    pub out: PathBuf,
    /// Scenario names (configs/scenarios/NAME.toml) or paths.
    pub scenarios: Vec<String>,
    pub accel: Option<String>,
    /// Another kernel than the scenarios': a name (`patched-6.12`, …) or a bzImage.
    pub kernel: Option<String>,
    pub kdir: Option<PathBuf>,
    /// Bring your own patch (files or directories of *.patch), built on `base`.
    pub patch: Vec<PathBuf>,
    pub base: String,
    /// One run per value of this sysctl instead of each scenario's runs.
    pub sysctl: Option<(String, Vec<String>)>,
    /// `debian`: the Debian guest image, with bcc's funccount counting the module's
    /// `arfs_rx_flow_steer` beside each run.
    pub guest: Option<String>,
    /// Skip guest-tests/provision.sh even when running as root.
    pub no_provision: bool,
    pub quiet: bool,
    /// Run each scenario this many times (its runs relabelled `rK:LABEL` from the second
    /// on); the table shows each setting's median over the valid runs with their spread.
    pub repeat: u32,
    /// A stop request: the demo ends after the current run with what it has.
    pub interrupt: runner::Interrupt,
}

/// What the demo did and how long each part took.
#[derive(Debug)]
pub struct DemoResult {
    /// One report per scenario, each also written to `out/NAME.json`.
    pub reports: Vec<Report>,
    pub provision_s: f64,
    pub kernel_s: f64,
    pub runs_s: f64,
    pub wall_s: f64,
}

fn is_root() -> bool {
    // SAFETY: geteuid takes no arguments, touches no memory and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Install QEMU 10, the Debian kernels and the image tools when missing (root only);
/// without root, check that an earlier provisioning left what the runs need.
fn provision(root: &Path, o: &DemoOptions) -> anyhow::Result<()> {
    if is_root() && !o.no_provision {
        eprintln!("demo: provisioning (guest-tests/provision.sh: QEMU 10 from bookworm-backports, Debian 6.1/6.12 kernels, busybox)");
        let st = Command::new("bash")
            .arg(root.join("guest-tests/provision.sh"))
            .stdout(Stdio::null())
            .status()
            .context("running guest-tests/provision.sh")?;
        if !st.success() {
            bail!("guest-tests/provision.sh failed ({st}); see its messages above");
        }
        return Ok(());
    }
    let qemu = env::qemu_binary(root);
    let major = runner::qemu::qemu_major(&qemu).with_context(|| {
        "QEMU 10 is not installed: run `sudo bash guest-tests/provision.sh` once (or run the demo as root)"
    })?;
    if major < 10 {
        bail!(
            "{} is QEMU {major}; the demo needs QEMU 10: run `sudo bash guest-tests/provision.sh` once",
            qemu.display()
        );
    }
    env::read_env_file(&env::cache_dir(root).join("kernels.env"))?;
    Ok(())
}

/// `--sysctl KEY=V0,V1,…`.
pub fn parse_sysctl_sweep(s: &str) -> Result<(String, Vec<String>), String> {
    let (k, vs) =
        s.split_once('=').ok_or_else(|| format!("{s:?}: expected KEY=V0,V1 (e.g. net.core.arfs_llc_affinity=0,1)"))?;
    let k = k.trim();
    if k.is_empty() || k.contains([' ', ',']) {
        return Err(format!("{s:?}: the sysctl name is empty or holds spaces or commas"));
    }
    let vals: Vec<String> = vs.split(',').map(|v| v.trim().to_string()).collect();
    if vals.iter().any(|v| v.is_empty() || v.contains([' ', '='])) {
        return Err(format!("{s:?}: values are a comma-separated list without spaces, e.g. {k}=0,1"));
    }
    Ok((k.to_string(), vals))
}

/// A kernel the demo builds itself: the build.sh arguments for a kernel name, or for
/// --patch; None for kernels it does not build (stock Debian ones, a bzImage).
fn build_args(o: &DemoOptions) -> anyhow::Result<Option<Vec<String>>> {
    if !o.patch.is_empty() {
        let mut a = vec!["--base".to_string(), o.base.clone()];
        for p in &o.patch {
            if !p.exists() {
                bail!("--patch {}: no such file or directory", p.display());
            }
            a.push("--patch".into());
            a.push(p.display().to_string());
        }
        return Ok(Some(a));
    }
    let name = o.kernel.as_deref().unwrap_or("patched-7.3");
    Ok(env::build_sh_args(name).map(|args| args.iter().map(|s| s.to_string()).collect()))
}

/// Build a kernel (or find it in the cache) with a progress bar drawn from build.sh's
/// `building: NN%` lines; returns build.sh's `KEY=value` lines (KERNEL, KDIR, KEY, …).
fn build_kernel(root: &Path, args: &[String], quiet: bool) -> anyhow::Result<BTreeMap<String, String>> {
    let mut child = Command::new("bash")
        .arg(root.join("guest-tests/kernel/build.sh"))
        .args(args)
        .env("BUILD_PROGRESS_STEP", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running guest-tests/kernel/build.sh")?;
    let bar = if quiet { ProgressBar::hidden() } else { ProgressBar::new(100) };
    bar.set_style(
        ProgressStyle::with_template("building the kernel {bar:40} {pos:>3}% [{elapsed_precise}] {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(Duration::from_millis(500));
    let mut cached = false;
    // Without a terminal the bar draws nothing: print build.sh's messages (and every 10%)
    // as lines, so a log shows them, errors included.
    let plain = bar.is_hidden();
    let mut shown_pct = None;
    if let Some(err) = child.stderr.take() {
        for line in std::io::BufReader::new(err).lines() {
            let line = line.unwrap_or_default();
            if let Some(rest) = line.strip_prefix("build.sh: building: ") {
                let pct: u64 = rest.split('%').next().unwrap_or("").trim().parse().unwrap_or(0);
                bar.set_position(pct);
                bar.set_message(
                    rest.split_once('(').map(|(_, m)| m.trim_end_matches(')').to_string()).unwrap_or_default(),
                );
                if plain && !quiet && shown_pct.is_none_or(|s| pct >= s + 10) {
                    shown_pct = Some(pct);
                    eprintln!("{line}");
                }
            } else if line.starts_with("build.sh: cached") {
                cached = true;
            } else if plain {
                eprintln!("{line}");
            } else {
                bar.println(&line);
            }
        }
    }
    let out = child.wait_with_output().context("waiting for guest-tests/kernel/build.sh")?;
    if !out.status.success() {
        bar.abandon();
        bail!("guest-tests/kernel/build.sh failed ({}); see its messages above", out.status);
    }
    if cached {
        bar.finish_and_clear();
        eprintln!("demo: kernel found in the cache ({})", args.join(" "));
    } else {
        bar.set_position(100);
        bar.finish();
    }
    Ok(env::parse_env_lines(&String::from_utf8_lossy(&out.stdout)))
}

/// The scenario file a demo run uses: the scenario itself, or with `--sysctl` a copy
/// (in `out/scenarios/`) whose runs are one per value.
fn scenario_for_run(path: &Path, o: &DemoOptions) -> anyhow::Result<PathBuf> {
    let Some((key, vals)) = &o.sysctl else { return Ok(path.to_path_buf()) };
    let mut s = Scenario::load(path)?;
    s.runs = vals
        .iter()
        .map(|v| Run {
            label: format!("{}={v}", key.rsplit('.').next().unwrap_or(key)),
            sysctls: BTreeMap::from([(key.clone(), v.clone())]),
            profile: None,
            kernel: None,
            rps_flow_cnt: None,
        })
        .collect();
    s.validate().map_err(|e| anyhow::anyhow!("--sysctl: {e}"))?;
    let dir = o.out.join("scenarios");
    std::fs::create_dir_all(&dir)?;
    let file = dir.join(path.file_name().unwrap_or_default());
    std::fs::write(&file, toml::to_string(&s).context("writing the scenario for --sysctl")?)
        .with_context(|| format!("writing {}", file.display()))?;
    Ok(file)
}

/// configs/scenarios/NAME.toml, or a path.
pub fn scenario_path(root: &Path, spec: &str) -> anyhow::Result<PathBuf> {
    let p = if spec.contains('/') || spec.ends_with(".toml") {
        PathBuf::from(spec)
    } else {
        root.join("configs/scenarios").join(format!("{spec}.toml"))
    };
    if !p.is_file() {
        bail!("--scenarios: {spec:?} is neither a scenario name in configs/scenarios/ nor a scenario file");
    }
    Ok(p)
}

pub fn run_demo(o: &DemoOptions) -> anyhow::Result<DemoResult> {
    let t0 = Instant::now();
    let root = env::repo_root()?;
    let paths: Vec<PathBuf> = o.scenarios.iter().map(|s| scenario_path(&root, s)).collect::<anyhow::Result<_>>()?;
    std::fs::create_dir_all(&o.out).with_context(|| format!("--out {}: cannot create it", o.out.display()))?;

    provision(&root, o)?;
    let provision_s = t0.elapsed().as_secs_f64();

    let t1 = Instant::now();
    if let Some(k) = &o.kernel {
        let named = env::KERNEL_NAMES.contains(&k.as_str());
        if !named && o.kdir.is_none() {
            bail!(
                "--kernel {k}: not a kernel name ({}); a bzImage also needs --kdir TREE",
                env::KERNEL_NAMES.join(", ")
            );
        }
    }
    // The kernel the runs boot: --kernel as given, the one built from --patch, or each
    // scenario's own (patched-7.3 for the default scenarios; built here with a progress bar).
    let (mut kernel, mut kdir) = (o.kernel.clone(), o.kdir.clone());
    if let Some(args) = build_args(o)? {
        let built = build_kernel(&root, &args, o.quiet)?;
        if !o.patch.is_empty() {
            let get = |k: &str| built.get(k).cloned().with_context(|| format!("build.sh printed no {k}="));
            eprintln!("demo: your kernel: {} (cache key {})", get("KERNEL")?, get("KEY")?);
            kernel = Some(get("KERNEL")?);
            kdir = Some(PathBuf::from(get("KDIR")?));
        }
    }
    let kernel_s = t1.elapsed().as_secs_f64();

    let t2 = Instant::now();
    let mut reports = Vec::new();
    for (spec, path) in o.scenarios.iter().zip(&paths) {
        let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| spec.clone());
        eprintln!("demo: scenario {name} ({})", path.display());
        let path = &scenario_for_run(path, o)?;
        let opts = RunOptions {
            accel: o.accel.clone(),
            kernel: kernel.clone(),
            kdir: kdir.clone(),
            logdir: Some(o.out.join("logs").join(&name)),
            guest: o.guest.clone(),
            funccount: (o.guest.as_deref() == Some("debian")).then(|| FUNCCOUNT_FUNCTION.to_string()),
            quiet: o.quiet,
            metrics: None,
            profile: None,
            interrupt: o.interrupt.clone(),
        };
        let mut report = runner::run_scenario(path, &opts).with_context(|| format!("scenario {name}"))?;
        for k in 2..=o.repeat.max(1) {
            if !report.complete {
                break;
            }
            eprintln!("demo: scenario {name}, round {k} of {}", o.repeat);
            let more = runner::run_scenario(path, &opts).with_context(|| format!("scenario {name}, round {k}"))?;
            if report.runs.iter().all(|r| !r.label.starts_with("r1:")) {
                for r in &mut report.runs {
                    r.label = format!("r1:{}", r.label);
                }
            }
            report.wall_s += more.wall_s;
            report.complete = more.complete;
            report.interrupted = more.interrupted;
            report.runs.extend(more.runs.into_iter().map(|mut r| {
                r.label = format!("r{k}:{}", r.label);
                r
            }));
        }
        let file = o.out.join(format!("{name}.json"));
        std::fs::write(&file, report.to_json_pretty()).with_context(|| format!("writing {}", file.display()))?;
        let complete = report.complete;
        reports.push(report);
        if !complete {
            break;
        }
    }
    let runs_s = t2.elapsed().as_secs_f64();
    Ok(DemoResult { reports, provision_s, kernel_s, runs_s, wall_s: t0.elapsed().as_secs_f64() })
}
