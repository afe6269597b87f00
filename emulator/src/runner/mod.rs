//! `arfsnic run`: backend + QEMU + guest, per scenario run, into a JSON report.
//!
//! One backend process serves all runs of a scenario: QEMU connects, the guest boots,
//! the workload reports `ready`, the link partner offers traffic for the scenario's
//! duration, the guest prints its JSON block and powers off, QEMU exits, the next run
//! connects to the same socket. Every phase has a timeout; a failure names the phase
//! and shows the tail of the serial log.

pub mod bisect;
pub mod delivery;
pub mod demo;
pub mod doctor;
pub mod env;
pub mod flows;
pub mod health;
pub mod hoststat;
pub mod matrix;
pub mod metrics;
pub mod occupancy;
pub mod qemu;
pub mod run;
pub mod scenario;

use crate::device::clock::Clock;
use crate::device::EmulatedNic;
use crate::model::nic::Nic;
use crate::model::profile::Profile;
use crate::report::schema::{BackendSummary, Discarded, Report, Verdict, SCHEMA_VERSION};
use crate::vhost::{Backend, ServeConfig};
use crate::wire::MacAddr;
use anyhow::{anyhow, bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use run::{run_one, BootFailed, BOOT_ATTEMPTS};
use scenario::Scenario;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const GUEST_IP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);
pub const PARTNER_IP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
pub const GUEST_MAC: MacAddr = MacAddr([0x52, 0x54, 0x00, 0xa5, 0xf1, 0x02]);
/// The remote NIC (`vm.remote`) and the addresses of both ends in the selftests' terms
/// (LOCAL_V4/V6 on the NIC under test, REMOTE_V4/V6 in the guest's `remote` namespace).
pub const REMOTE_MAC: MacAddr = MacAddr([0x52, 0x54, 0x00, 0xa5, 0xf1, 0x03]);
pub const REMOTE_IP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 3);
pub const GUEST_IP6: &str = "fd00:99::2";
pub const REMOTE_IP6: &str = "fd00:99::3";
pub const GUEST_BASE_PORT: u16 = 7000;
pub const PARTNER_BASE_PORT: u16 = 9000;
/// Seconds the guest keeps serving after the link partner stops offering load.
pub const GUEST_TAIL_S: f64 = 2.0;
/// How many times a run that is not `ok` is run again before its last attempt stands
/// (flagged).
pub const HEALTH_RETRIES: u32 = 3;

/// Options of `arfsnic run` that are not in the scenario.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Override the scenario's acceleration (kvm, tcg, auto).
    pub accel: Option<String>,
    /// Override the scenario's kernel (bzImage path or debian-6.x).
    pub kernel: Option<String>,
    pub kdir: Option<PathBuf>,
    /// Where logs go (default: a directory next to the JSON output).
    pub logdir: Option<PathBuf>,
    /// Override the scenario's `vm.guest` (`initramfs` or `debian`).
    pub guest: Option<String>,
    /// Override the scenario's `guest.funccount` (needs the Debian guest).
    pub funccount: Option<String>,
    pub quiet: bool,
    /// Serve the live counters in Prometheus text on http://ADDR/metrics (`--metrics`).
    pub metrics: Option<String>,
    /// Replace the scenario's `profile` (runs that name their own keep it): a matrix cell.
    pub profile: Option<String>,
    /// Polled between phases and every 50 ms of a run: when set, the QEMU of the current
    /// run is killed and the report holds the runs finished so far (`complete = false`).
    pub interrupt: Interrupt,
}

/// A stop request from outside (the command line's SIGINT/SIGTERM handlers).
#[derive(Clone, Debug, Default)]
pub struct Interrupt {
    /// Set by the first signal.
    pub stop: Arc<AtomicBool>,
    /// Its number.
    pub signal: Arc<std::sync::atomic::AtomicUsize>,
}

impl Interrupt {
    pub fn requested(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
    /// `SIGINT`, `SIGTERM`, or `signal N`.
    pub fn signal_name(&self) -> String {
        match self.signal.load(Ordering::Acquire) {
            2 => "SIGINT".into(),
            15 => "SIGTERM".into(),
            n => format!("signal {n}"),
        }
    }
    /// The shell's exit status for a process ended by this signal (130, 143).
    pub fn exit_code(&self) -> u8 {
        128u8.saturating_add(self.signal.load(Ordering::Acquire).min(127) as u8)
    }
}

/// The run was stopped by [`Interrupt`] (not a failure of the run itself).
#[derive(Debug)]
pub struct Interrupted(pub String);

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "interrupted by {}", self.0)
    }
}

impl std::error::Error for Interrupted {}

pub(crate) struct Ctx {
    pub(crate) root: PathBuf,
    pub(crate) scenario: Scenario,
    pub(crate) scenario_dir: PathBuf,
    pub(crate) logdir: PathBuf,
    pub(crate) qemu_bin: PathBuf,
    pub(crate) accel: String,
    /// QEMU's `-accel` argument (`tcg,thread=single`, …).
    pub(crate) qemu_accel: String,
    pub(crate) kernel: env::GuestKernel,
    pub(crate) initrd: PathBuf,
    /// The Debian guest's root image (`vm.guest = "debian"`), attached read-only.
    pub(crate) disk: Option<PathBuf>,
    pub(crate) socket: PathBuf,
    pub(crate) progress: ProgressBar,
    pub(crate) interrupt: Interrupt,
    /// What `--metrics` reads; the run in progress registers its control plane here.
    pub(crate) metrics: Option<Arc<metrics::Sources>>,
}

/// Resolve a profile name (`mlx5-cx6` → configs/mlx5-cx6.toml) or path.
pub fn resolve_profile(spec: &str, root: &Path, scenario_dir: &Path) -> anyhow::Result<PathBuf> {
    let looks_like_path = spec.contains('/') || spec.ends_with(".toml");
    let candidates = if looks_like_path {
        vec![PathBuf::from(spec), scenario_dir.join(spec), root.join(spec)]
    } else {
        vec![root.join("configs").join(format!("{spec}.toml"))]
    };
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .ok_or_else(|| anyhow!("profile {spec:?} not found (a name in configs/ or a path to a TOML file)"))
}

fn sh(cmd: &mut std::process::Command, what: &str) -> anyhow::Result<()> {
    let out = cmd.output().with_context(|| format!("{what}: cannot start"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Build the guest module the way a Debian user of that release does: the module source
/// copied into the release's chroot, `make` there against its linux-headers package.
fn build_module_in_chroot(mdir: &Path, chroot: &Path, kdir: &Path) -> anyhow::Result<PathBuf> {
    let build = chroot.join("build/arfs_virtio");
    let _ = std::fs::remove_dir_all(&build);
    std::fs::create_dir_all(&build).with_context(|| format!("creating {}", build.display()))?;
    for e in std::fs::read_dir(mdir).with_context(|| format!("reading {}", mdir.display()))? {
        let p = e?.path();
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let source = name == "Makefile" || name == "Kbuild" || name.ends_with(".c") || name.ends_with(".h");
        if p.is_file() && source {
            std::fs::copy(&p, build.join(&name)).with_context(|| format!("copying {}", p.display()))?;
        }
    }
    // objtool reads /proc: a private mount namespace with /proc mounted in the chroot,
    // gone when make exits.
    sh(
        std::process::Command::new("unshare")
            .args(["--mount", "--fork", "sh", "-c"])
            .arg(r#"mount -t proc proc "$1/proc" && exec chroot "$1" make -C /build/arfs_virtio KDIR="$2""#)
            .arg("sh")
            .arg(chroot)
            .arg(kdir),
        &format!("building the guest module in {} (guest-tests/kernel/debian-kernel.sh)", chroot.display()),
    )?;
    Ok(build.join("arfs_virtio.ko"))
}

/// Build the initramfs for a kernel (and the guest module when asked).
fn build_initramfs(
    root: &Path,
    k: &env::GuestKernel,
    module: bool,
    disk_root: bool,
    hook: Option<&Path>,
    out: &Path,
) -> anyhow::Result<()> {
    let mut cmd = std::process::Command::new("bash");
    cmd.arg(root.join("guest-tests/image/build-initramfs.sh"));
    cmd.arg(k.moddir.as_ref().map_or("none".to_string(), |m| m.display().to_string()));
    cmd.arg(out);
    if let Some(h) = hook {
        cmd.arg("--hook").arg(h);
    }
    if disk_root {
        cmd.arg("--disk-root");
    }
    if module {
        let kdir = k.kdir.as_ref().context("the guest module needs a kernel tree or headers (--kdir)")?;
        let mdir = root.join("guest-tests/module");
        let ko = match &k.chroot {
            None => {
                sh(
                    std::process::Command::new("make").arg("-C").arg(&mdir).arg(format!("KDIR={}", kdir.display())),
                    "building the guest module (guest-tests/module)",
                )?;
                mdir.join("arfs_virtio.ko")
            }
            Some(chroot) => build_module_in_chroot(&mdir, chroot, kdir)?,
        };
        cmd.arg("--module").arg(ko);
    }
    sh(&mut cmd, "building the initramfs (guest-tests/image/build-initramfs.sh)")
}

/// The KVM probe costs up to its 20 s timeout on hosts where /dev/kvm hangs; its answer
/// is kept per host boot (boot_id) in the cache.
fn kvm_works_cached(root: &Path, qemu_bin: &Path, kernel: &Path) -> bool {
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let key = format!("{} {}", boot_id.trim(), qemu_bin.display());
    let file = env::cache_dir(root).join("kvm-probe");
    if let Ok(text) = std::fs::read_to_string(&file) {
        if let Some((k, v)) = text.rsplit_once(' ') {
            if k == key {
                return v.trim() == "kvm";
            }
        }
    }
    let works = qemu::kvm_works(qemu_bin, kernel, Duration::from_secs(20));
    let _ = std::fs::create_dir_all(env::cache_dir(root));
    let _ = std::fs::write(&file, format!("{key} {}\n", if works { "kvm" } else { "tcg" }));
    works
}

/// Run a scenario; returns the JSON report.
pub fn run_scenario(path: &Path, opts: &RunOptions) -> anyhow::Result<Report> {
    let root = env::repo_root()?;
    let mut scenario = Scenario::load(path)?;
    if scenario.model_only {
        bail!(
            "{}: model_only = true: run it with `arfsnic model --scenario` (no VM here has its size)",
            path.display()
        );
    }
    if let Some(k) = &opts.kernel {
        scenario.kernel = k.clone();
    }
    if let Some(d) = &opts.kdir {
        scenario.kdir = Some(d.clone());
    }
    if let Some(p) = &opts.profile {
        scenario.profile = p.clone();
    }
    if let Some(g) = &opts.guest {
        scenario.vm.guest = g.clone();
    }
    if let Some(f) = &opts.funccount {
        scenario.guest.funccount = Some(f.clone());
    }
    if opts.guest.is_some() || opts.funccount.is_some() {
        scenario.validate().map_err(|e| anyhow!("--guest/--funccount: {e}"))?;
    }
    let scenario_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    // `[guest] hook` is relative to the scenario file.
    let hook = scenario.guest.hook.as_ref().map(|h| scenario_dir.join(h));
    let logdir = match &opts.logdir {
        Some(d) => d.clone(),
        None => env::cache_dir(&root).join("runs").join(&scenario.name),
    };
    std::fs::create_dir_all(&logdir)?;
    let progress = if opts.quiet { ProgressBar::hidden() } else { ProgressBar::new_spinner() };
    progress.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    progress.enable_steady_tick(Duration::from_millis(200));

    // The user's input first (a kernel name that does not exist is a one-line error
    // whatever the machine has), then the machine, then the kernel (which may be built).
    env::check_kernel_spec(&scenario.kernel)?;
    let qemu_bin = env::qemu_binary(&root);
    let major = qemu::qemu_major(&qemu_bin)?;
    if major < 10 {
        bail!(
            "{} is QEMU {major}; QEMU 7.2 segfaults under TCG with vhost-user + MSI-X. Install QEMU 10 from bookworm-backports (bash guest-tests/provision.sh)",
            qemu_bin.display()
        );
    }
    let kernel = env::resolve_kernel(&scenario.kernel, scenario.kdir.as_deref(), &root)?;
    let accel = match opts.accel.as_deref().unwrap_or(&scenario.vm.accel) {
        "auto" => {
            progress.set_message("probing KVM");
            if kvm_works_cached(&root, &qemu_bin, &kernel.image) {
                "kvm"
            } else {
                "tcg"
            }
        }
        "kvm" => "kvm",
        "tcg" => "tcg",
        other => bail!("--accel {other:?}: expected auto, kvm or tcg"),
    }
    .to_string();
    progress.set_message(format!("building the initramfs for {}", kernel.label));
    let initrd = logdir.join("initramfs.cpio.gz");
    let debian = scenario.vm.guest == "debian";
    build_initramfs(&root, &kernel, scenario.guest.module, debian, hook.as_deref(), &initrd)?;
    let disk = if debian {
        progress.set_message("building the Debian guest image (guest-tests/image/build-debian.sh)");
        Some(env::debian_image(&root)?)
    } else {
        None
    };
    // Runs that boot another kernel (`[[runs]] kernel = …`): each kernel resolved (built or
    // fetched) and its initramfs made once, before the first run.
    let mut run_kernels: Vec<(env::GuestKernel, PathBuf)> = Vec::new();
    for run in scenario.runs() {
        let spec = scenario.kernel_for(&run).to_string();
        if spec == kernel.label || run_kernels.iter().any(|(k, _)| k.label == spec) {
            continue;
        }
        progress.set_message(format!("building the initramfs for {spec} (run {})", run.label));
        let k = env::resolve_kernel(&spec, None, &root).with_context(|| format!("run {:?}", run.label))?;
        let i = logdir.join(format!("initramfs-{}.cpio.gz", run_kernels.len() + 1));
        build_initramfs(&root, &k, scenario.guest.module, debian, hook.as_deref(), &i)?;
        run_kernels.push((k, i));
    }
    let scenario_kernel = (kernel.clone(), initrd.clone());

    let first_profile = Profile::load(&resolve_profile(&scenario.profile, &root, &scenario_dir)?)?;
    let nic = Arc::new(
        Nic::new(&first_profile, scenario.nic.queues).map_err(|e| anyhow!("profile {}: {e}", first_profile.name))?,
    );
    let emu = EmulatedNic::new(nic, Clock::new());
    let sockdir = tempfile::Builder::new().prefix("arfsnic-").tempdir()?;
    let socket = sockdir.path().join("vhost-user.sock");
    let backend = Arc::new(Backend::new(ServeConfig::new(&socket, scenario.nic.queues), emu.clone())?);
    emu.attach_rx(Arc::new(backend.rx_port()));
    let stop = Arc::new(AtomicBool::new(false));
    let server = {
        let (b, s) = (backend.clone(), stop.clone());
        std::thread::Builder::new().name("vhost-serve".into()).spawn(move || b.serve(&s))?
    };
    let qemu_accel = hoststat::accel_arg(&accel, &scenario.vm.tcg_threads, scenario.vm.vcpus, hoststat::host_cores());
    if let Some(w) = hoststat::vcpu_warning(&qemu_accel, scenario.vm.vcpus, hoststat::host_cores()) {
        progress.suspend(|| eprintln!("arfsnic: warning: scenario {}: {w}", scenario.name));
    }
    let interrupt = opts.interrupt.clone();
    let sources = opts.metrics.as_ref().map(|_| metrics::Sources::new(emu.clone(), backend.clone()));
    let _metrics_server = match (&opts.metrics, &sources) {
        (Some(addr), Some(src)) => {
            let src = src.clone();
            let srv = metrics::serve(addr, move || src.sample())?;
            progress.suspend(|| eprintln!("arfsnic: metrics on http://{}/metrics", srv.addr));
            Some(srv)
        }
        _ => None,
    };
    let mut ctx = Ctx {
        root,
        scenario,
        scenario_dir,
        logdir,
        qemu_bin,
        accel,
        qemu_accel,
        kernel,
        initrd,
        disk,
        socket,
        progress,
        interrupt,
        metrics: sources,
    };
    let started = Instant::now();
    let mut runs = Vec::new();
    let mut result = Ok(());
    let mut interrupted = None;
    'runs: for (i, run) in ctx.scenario.runs().iter().enumerate() {
        let spec = ctx.scenario.kernel_for(run).to_string();
        let (k, rd) = run_kernels.iter().find(|(k, _)| k.label == spec).unwrap_or(&scenario_kernel);
        (ctx.kernel, ctx.initrd) = (k.clone(), rd.clone());
        let mut boot_failures: Vec<String> = Vec::new();
        let mut discarded: Vec<Discarded> = Vec::new();
        let mut boots_failed = 0;
        // Log files are numbered by attempt (boot failures and re-runs alike).
        for attempt in 1.. {
            if ctx.interrupt.requested() {
                interrupted = Some(ctx.interrupt.signal_name());
                break 'runs;
            }
            match run_one(&ctx, &emu, &backend, run, i, attempt) {
                Ok(mut v) => {
                    v.kernel = Some(ctx.kernel.label.clone());
                    v.rps_flow_cnt = Some(ctx.scenario.rps_flow_cnt_for(run));
                    v.boot_attempts = boots_failed + 1;
                    v.boot_failures = std::mem::take(&mut boot_failures);
                    let health = v.health.clone().unwrap_or_default();
                    if health.verdict != Verdict::Ok && (discarded.len() as u32) < HEALTH_RETRIES {
                        log::warn!(
                            "scenario {}, run {:?}: {} ({}); running it again ({} of {HEALTH_RETRIES})",
                            ctx.scenario.name,
                            run.label,
                            health.verdict.as_str(),
                            health.reasons.join("; "),
                            discarded.len() + 1
                        );
                        discarded.push(Discarded {
                            verdict: health.verdict,
                            reasons: health.reasons,
                            steer_calls_per_s: v.driver().and_then(|d| d.steer_calls_per_s),
                            serial_log: v.logs.serial.clone(),
                        });
                        boots_failed = 0;
                        continue;
                    }
                    v.discarded = discarded;
                    runs.push(v);
                    continue 'runs;
                }
                Err(e) if e.downcast_ref::<Interrupted>().is_some() => {
                    log::warn!("scenario {}, run {:?}: {e}; its QEMU was stopped", ctx.scenario.name, run.label);
                    interrupted = Some(ctx.interrupt.signal_name());
                    break 'runs;
                }
                Err(e) if boots_failed + 1 < BOOT_ATTEMPTS && e.downcast_ref::<BootFailed>().is_some() => {
                    let first = e.to_string().lines().next().unwrap_or_default().to_string();
                    log::warn!(
                        "scenario {}, run {:?}: boot {} failed ({first}; logs in {}), booting again",
                        ctx.scenario.name,
                        run.label,
                        boots_failed + 1,
                        ctx.logdir.display()
                    );
                    boot_failures.push(first);
                    boots_failed += 1;
                }
                Err(e) => {
                    let earlier = match boot_failures.is_empty() {
                        true => String::new(),
                        false => format!(" (boot {}; boot 1: {})", boots_failed + 1, boot_failures.join("; boot 2: ")),
                    };
                    result = Err(e.context(format!("scenario {}, run {:?}{earlier}", ctx.scenario.name, run.label)));
                    break 'runs;
                }
            }
        }
    }
    stop.store(true, Ordering::Release);
    let _ = server.join();
    ctx.progress.finish_and_clear();
    result?;
    let topology = format!(
        "sockets={} dies={} cores={} threads={} cpu={}{}",
        ctx.scenario.vm.sockets,
        ctx.scenario.vm.dies,
        ctx.scenario.vm.cores,
        ctx.scenario.vm.threads,
        ctx.scenario.vm.cpu,
        ctx.scenario.vm.l3_per.as_ref().map(|l| format!(" l3_per={l}")).unwrap_or_default()
    );
    let counters = backend.counters();
    Ok(Report {
        schema_version: SCHEMA_VERSION,
        scenario: ctx.scenario.name.clone(),
        kernel: scenario_kernel.0.label.clone(),
        kernel_image: scenario_kernel.0.image.clone(),
        accel: ctx.accel.clone(),
        qemu_accel: Some(ctx.qemu_accel.clone()),
        queues: ctx.scenario.nic.queues,
        vcpus: ctx.scenario.vm.vcpus,
        topology,
        wall_s: started.elapsed().as_secs_f64(),
        backend: BackendSummary { connections: counters.connections, protocol_errors: counters.protocol_errors },
        runs,
        complete: interrupted.is_none(),
        interrupted,
        mode: None,
    })
}
