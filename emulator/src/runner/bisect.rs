//! `arfsnic run --bisect`: build the kernel tree a `git bisect run` has checked out, so the
//! run that follows boots exactly that commit (docs/ci.md, "git bisect").
//!
//! The tree keeps its own `.config` (a bisect answers new symbols with `make
//! olddefconfig`, as kernel developers do); a tree without one is configured the way
//! `guest-tests/kernel/build.sh` configures the pipeline's kernels: `make tinyconfig`, then
//! `guest-tests/kernel/config.fragment` (and `config-<major.minor>.fragment` where there is
//! one) merged in. Builds are incremental: the objects of the previous bisect step stay.
//!
//! A build that fails is the commit's fault, not the run's ([`BuildError::Failed`]: `git
//! bisect run` skips the commit); a tree that is not a kernel tree, or a machine without
//! the build tools, is the caller's ([`BuildError::Setup`]: the bisect stops).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// A built tree: the kernel to boot and the tree to build the guest module against.
#[derive(Debug)]
pub struct TreeBuild {
    pub bzimage: PathBuf,
    /// `git describe --always --dirty` of the tree, when it is a git work tree.
    pub commit: Option<String>,
    pub kernelversion: String,
    pub seconds: f64,
}

#[derive(Debug)]
pub enum BuildError {
    /// Not the commit's fault: no kernel tree there, build tools missing, log not writable.
    Setup(String),
    /// This commit does not configure or build (the last lines of the log are in the message).
    Failed(String),
}

impl std::fmt::Display for BuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BuildError::Setup(m) | BuildError::Failed(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for BuildError {}

/// Host tools a kernel build needs, with the Debian package that has each.
const TOOLS: &[(&str, &str)] =
    &[("make", "make"), ("gcc", "gcc"), ("flex", "flex"), ("bison", "bison"), ("bc", "bc"), ("perl", "perl")];

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

/// The last `n` lines of a file, for error messages.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Run one step of the build with its output appended to `log`; `Failed` names the step.
fn step(tree: &Path, log: &Path, what: &str, args: &[&str], program: &str) -> Result<(), BuildError> {
    let open = || {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| BuildError::Setup(format!("cannot write the build log {}: {e}", log.display())))
    };
    let (out, err) = (open()?, open()?);
    let status = Command::new(program)
        .args(args)
        .current_dir(tree)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .status()
        .map_err(|e| BuildError::Setup(format!("cannot start {program}: {e}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(BuildError::Failed(format!(
            "{what} failed in {} ({status}); last lines of {}:\n{}",
            tree.display(),
            log.display(),
            tail(log, 15)
        )))
    }
}

/// `make -s kernelversion` of a tree, e.g. `7.3.4`.
fn kernelversion(tree: &Path) -> Option<String> {
    let o = Command::new("make").args(["-s", "kernelversion"]).current_dir(tree).stderr(Stdio::null()).output().ok()?;
    let v = String::from_utf8_lossy(&o.stdout).trim().to_string();
    (o.status.success() && !v.is_empty()).then_some(v)
}

fn git_describe(tree: &Path) -> Option<String> {
    let o = Command::new("git")
        .args(["describe", "--always", "--dirty"])
        .current_dir(tree)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let v = String::from_utf8_lossy(&o.stdout).trim().to_string();
    (o.status.success() && !v.is_empty()).then_some(v)
}

/// Configure (when the tree has no `.config`) and build `tree` for x86_64: `bzImage`,
/// `modules` and `modules_prepare`, with `jobs` parallel jobs, all output in `log`.
/// `fragments` is the repository's `guest-tests/kernel` directory.
pub fn build_tree(tree: &Path, fragments: &Path, jobs: usize, log: &Path) -> Result<TreeBuild, BuildError> {
    if !tree.join("Kbuild").is_file() || !tree.join("arch/x86").is_dir() {
        return Err(BuildError::Setup(format!(
            "--kdir {}: not a kernel source tree (no Kbuild or arch/x86 there); give the tree `git bisect` checks out",
            tree.display()
        )));
    }
    let missing: Vec<String> =
        TOOLS.iter().filter(|(t, _)| !on_path(t)).map(|(t, p)| format!("{t} (Debian package {p})")).collect();
    if !missing.is_empty() {
        return Err(BuildError::Setup(format!(
            "building the kernel needs {}; install them (apt-get install flex bison bc libelf-dev libssl-dev build-essential)",
            missing.join(", ")
        )));
    }
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir).map_err(|e| BuildError::Setup(format!("cannot create {}: {e}", dir.display())))?;
    }
    std::fs::write(log, "")
        .map_err(|e| BuildError::Setup(format!("cannot write the build log {}: {e}", log.display())))?;
    let start = Instant::now();
    let version = kernelversion(tree)
        .ok_or_else(|| BuildError::Failed(format!("`make kernelversion` fails in {}", tree.display())))?;
    if tree.join(".config").is_file() {
        step(tree, log, "make olddefconfig", &["olddefconfig"], "make")?;
    } else {
        let fragment = fragments.join("config.fragment");
        if !fragment.is_file() {
            return Err(BuildError::Setup(format!("config fragment missing: {}", fragment.display())));
        }
        step(tree, log, "make tinyconfig", &["tinyconfig"], "make")?;
        let mut merge = vec!["scripts/kconfig/merge_config.sh".to_string(), "-m".into(), ".config".into()];
        merge.push(fragment.display().to_string());
        let minor: String = version.split('.').take(2).collect::<Vec<_>>().join(".");
        let overlay = fragments.join(format!("config-{minor}.fragment"));
        if overlay.is_file() {
            merge.push(overlay.display().to_string());
        }
        let args: Vec<&str> = merge.iter().map(String::as_str).collect();
        step(tree, log, "merging the config fragment", &args, "bash")?;
        step(tree, log, "make olddefconfig", &["olddefconfig"], "make")?;
    }
    let j = format!("-j{}", jobs.max(1));
    step(tree, log, "make bzImage modules modules_prepare", &[&j, "bzImage", "modules", "modules_prepare"], "make")?;
    let bzimage = tree.join("arch/x86/boot/bzImage");
    if !bzimage.is_file() {
        return Err(BuildError::Failed(format!("the build left no {}", bzimage.display())));
    }
    Ok(TreeBuild {
        bzimage,
        commit: git_describe(tree),
        kernelversion: version,
        seconds: start.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_that_is_no_kernel_tree_is_a_setup_error() {
        let d = tempfile::tempdir().unwrap();
        let e = build_tree(d.path(), d.path(), 2, &d.path().join("log")).unwrap_err();
        assert!(matches!(e, BuildError::Setup(_)), "{e}");
        assert!(e.to_string().contains("not a kernel source tree"), "{e}");
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("log");
        std::fs::write(&f, "a\nb\nc\nd\n").unwrap();
        assert_eq!(tail(&f, 2), "c\nd");
        assert_eq!(tail(&f, 10), "a\nb\nc\nd");
        assert_eq!(tail(&d.path().join("none"), 3), "");
    }
}
