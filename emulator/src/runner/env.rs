//! Where things are: the repository (scripts, configs), the cache, the guest kernels.

use anyhow::{bail, Context};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The repository root: the first directory, from the current one upwards and then
/// from the executable's upwards, that holds `guest-tests/image/build-initramfs.sh`.
pub fn repo_root() -> anyhow::Result<PathBuf> {
    let marker = Path::new("guest-tests/image/build-initramfs.sh");
    let mut starts = vec![std::env::current_dir()?];
    if let Ok(exe) = std::env::current_exe() {
        starts.push(exe);
    }
    for s in starts {
        for dir in s.ancestors() {
            if dir.join(marker).is_file() {
                return Ok(dir.to_path_buf());
            }
        }
    }
    bail!("cannot find the arfsnic repository (guest-tests/image/build-initramfs.sh); run from inside it")
}

pub fn cache_dir(root: &Path) -> PathBuf {
    std::env::var_os("ARFSNIC_CACHE").map(PathBuf::from).unwrap_or_else(|| root.join(".cache"))
}

/// A guest kernel and what goes with it.
#[derive(Clone, Debug)]
pub struct GuestKernel {
    pub label: String,
    pub image: PathBuf,
    /// Module directory (`/lib/modules/<release>`) or None for a kernel with virtio built in.
    pub moddir: Option<PathBuf>,
    /// Tree or headers to build the guest module against.
    pub kdir: Option<PathBuf>,
    pub release: Option<String>,
    /// A Debian chroot whose toolchain and headers build modules for this kernel (a
    /// stock trixie kernel's kbuild tools do not run on the bookworm host); `kdir` is
    /// then a path inside it.
    pub chroot: Option<PathBuf>,
}

/// The kernel names a scenario's `kernel` key and `--kernel` take (besides a path).
pub const KERNEL_NAMES: [&str; 7] =
    ["patched-7.3", "vanilla-7.3", "patched-6.12", "vanilla-6.12", "debian-6.1", "debian-6.12", "debian-7.3"];

fn valid_kernels() -> String {
    format!("{}, or a path to a bzImage", KERNEL_NAMES.join(", "))
}

/// `KEY=value` lines written by guest-tests/provision.sh.
pub fn read_env_file(path: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "{} is missing: run `bash guest-tests/provision.sh` first (installs QEMU 10 and the Debian guest kernels)",
            path.display()
        )
    })?;
    Ok(parse_env_lines(&text))
}

/// `KEY=value` lines (comments skipped, values unquoted): kernels.env and what the kernel
/// scripts print on stdout.
pub fn parse_env_lines(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().trim_matches('"').to_string()))
        .collect()
}

/// The guest-tests/kernel/build.sh arguments of the kernel names it builds.
pub fn build_sh_args(name: &str) -> Option<&'static [&'static str]> {
    Some(match name {
        // linux-source-7.3 (trixie-backports) + tinyconfig fragment + v11 as posted (cached).
        "patched-7.3" => &["--base", "7.3"],
        // linux-source-6.12 + tinyconfig fragment + v11 adapted to 6.12 (cached).
        "patched-6.12" => &["--base", "6.12"],
        // The same trees without the patch: the baselines.
        "vanilla-7.3" => &["--base", "7.3", "--no-patch"],
        "vanilla-6.12" => &["--base", "6.12", "--no-patch"],
        _ => return None,
    })
}

/// Run one of the kernel scripts (build.sh, debian-kernel.sh); its stdout is `KEY=value`
/// lines (KERNEL, KDIR, ...), its progress goes to stderr.
fn kernel_script(script: &str, args: &[&str], root: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    let out = std::process::Command::new("bash")
        .arg(root.join(script))
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {script}"))?;
    if !out.status.success() {
        bail!("{script} failed ({}); see its messages above", out.status);
    }
    Ok(parse_env_lines(&String::from_utf8_lossy(&out.stdout)))
}

fn need(vars: &BTreeMap<String, String>, script: &str, k: &str) -> anyhow::Result<String> {
    vars.get(k).cloned().with_context(|| format!("{script} printed no {k}="))
}

/// Build (or take from the cache) a kernel with guest-tests/kernel/build.sh.
fn built_kernel(label: &str, extra_args: &[&str], root: &Path) -> anyhow::Result<GuestKernel> {
    const S: &str = "guest-tests/kernel/build.sh";
    let v = kernel_script(S, extra_args, root)?;
    Ok(GuestKernel {
        label: label.to_string(),
        image: PathBuf::from(need(&v, S, "KERNEL")?),
        moddir: None,
        kdir: Some(PathBuf::from(need(&v, S, "KDIR")?)),
        release: v.get("VERSION").cloned(),
        chroot: None,
    })
}

/// A stock trixie(-backports) kernel with a chroot to build modules in
/// (guest-tests/kernel/debian-kernel.sh, cached).
fn debian_trixie_kernel(label: &str, series: &str, root: &Path) -> anyhow::Result<GuestKernel> {
    const S: &str = "guest-tests/kernel/debian-kernel.sh";
    let v = kernel_script(S, &[series], root)?;
    Ok(GuestKernel {
        label: label.to_string(),
        image: PathBuf::from(need(&v, S, "KERNEL")?),
        moddir: Some(PathBuf::from(need(&v, S, "MODDIR")?)),
        kdir: Some(PathBuf::from(need(&v, S, "KDIR")?)),
        release: v.get("KREL").cloned(),
        chroot: Some(PathBuf::from(need(&v, S, "CHROOT")?)),
    })
}

/// A kernel name [`resolve_kernel`] knows, or an existing file; checked before anything is
/// built or looked up on the machine.
pub fn check_kernel_spec(spec: &str) -> anyhow::Result<()> {
    let named = build_sh_args(spec).is_some() || matches!(spec, "debian-7.3" | "debian-6.1" | "debian-6.12");
    if !named && !Path::new(spec).is_file() {
        bail!("kernel {spec:?}: no such kernel name or file; valid: {}", valid_kernels());
    }
    Ok(())
}

pub fn resolve_kernel(spec: &str, kdir: Option<&Path>, root: &Path) -> anyhow::Result<GuestKernel> {
    if let Some(args) = build_sh_args(spec) {
        return built_kernel(spec, args, root);
    }
    if spec == "debian-7.3" {
        // The newest stock Debian 7.3 kernel (trixie-backports).
        return debian_trixie_kernel(spec, "7.3", root);
    }
    let suffix = match spec {
        "debian-6.1" => Some("6_1"),
        "debian-6.12" => Some("6_12"),
        _ => None,
    };
    if let Some(sfx) = suffix {
        let env = read_env_file(&cache_dir(root).join("kernels.env"))?;
        let get = |k: &str| -> anyhow::Result<String> {
            env.get(&format!("{k}_{sfx}"))
                .cloned()
                .with_context(|| format!("kernels.env has no {k}_{sfx}: rerun guest-tests/provision.sh"))
        };
        let image = PathBuf::from(get("KERNEL")?);
        if !image.is_file() {
            bail!("kernel image {} is missing: rerun guest-tests/provision.sh", image.display());
        }
        return Ok(GuestKernel {
            label: spec.to_string(),
            image,
            moddir: Some(PathBuf::from(get("MODDIR")?)),
            kdir: Some(PathBuf::from(get("KDIR")?)),
            release: Some(get("KREL")?),
            chroot: None,
        });
    }
    let image = PathBuf::from(spec);
    if !image.is_file() {
        bail!("kernel {spec:?}: no such kernel name or file; valid: {}", valid_kernels());
    }
    Ok(GuestKernel {
        label: spec.to_string(),
        image,
        moddir: None,
        kdir: kdir.map(Path::to_path_buf),
        release: None,
        chroot: None,
    })
}

/// The Debian guest's root image (guest-tests/image/build-debian.sh: made once, cached
/// under a key of its inputs), for the stock trixie kernel's headers.
pub fn debian_image(root: &Path) -> anyhow::Result<PathBuf> {
    const S: &str = "guest-tests/image/build-debian.sh";
    let v = kernel_script(S, &[], root)?;
    let img = PathBuf::from(need(&v, S, "IMAGE")?);
    if !img.is_file() {
        bail!("{S} printed IMAGE={} but it is missing", img.display());
    }
    Ok(img)
}

/// The QEMU binary: QEMU from kernels.env, else the one on PATH.
pub fn qemu_binary(root: &Path) -> PathBuf {
    read_env_file(&cache_dir(root).join("kernels.env"))
        .ok()
        .and_then(|e| e.get("QEMU").cloned())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("qemu-system-x86_64"))
}
