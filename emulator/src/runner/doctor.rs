//! `arfsnic doctor`: what a run needs, checked in one go, with what to install on
//! Debian/Ubuntu and on Fedora. `arfsnic run` prints the failing checks when a run
//! fails for a reason other than its scenario file.
//!
//! Checks: QEMU (present, version ≥ 10, the vhost-user netdev and dgram netdev built in),
//! KVM (usable, or the TCG fallback), memfd with sealing (the guest memory the backend
//! maps), hugepages (optional), a unix socket in the temp dir, the host tools the
//! initramfs, the guest module and kernel builds need (static busybox, cpio, xz, make,
//! gcc, flex, bison, bc, patch, ethtool, libelf and libssl headers), the provisioned guest kernels, mmdebstrap for the Debian guest,
//! and free disk for the kernel builds.

use super::env::{cache_dir, qemu_binary};
use super::qemu::qemu_major;
use std::fmt;
use std::path::Path;
use std::process::Command;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ok,
    /// Works, with a limitation (TCG instead of KVM, no hugepages).
    Warn,
    /// A run (or one kind of run) cannot work.
    Fail,
}

/// What to install, per distribution family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fix {
    pub debian: String,
    pub fedora: String,
}

fn fix(debian: impl Into<String>, fedora: impl Into<String>) -> Option<Fix> {
    Some(Fix { debian: debian.into(), fedora: fedora.into() })
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
    pub fix: Option<Fix>,
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tag = match self.status {
            Status::Ok => "ok  ",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        };
        write!(f, "{tag} {:<10} {}", self.name, self.detail)?;
        if let (Some(fix), false) = (&self.fix, self.status == Status::Ok) {
            write!(f, "\n     {:<10} Debian/Ubuntu: {}\n     {:<10} Fedora: {}", "", fix.debian, "", fix.fedora)?;
        }
        Ok(())
    }
}

fn qemu_fix() -> Option<Fix> {
    fix(
        "bash guest-tests/provision.sh (QEMU 10 from bookworm-backports; on trixie or Ubuntu >= 25.04: apt install qemu-system-x86)",
        "dnf install qemu-system-x86-core (Fedora >= 42 ships QEMU >= 10)",
    )
}

fn check(name: &'static str, status: Status, detail: impl Into<String>, fix: Option<Fix>) -> Check {
    Check { name, status, detail: detail.into(), fix }
}

fn on_path(cmd: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(cmd)).find(|p| p.is_file())
}

fn qemu(root: &Path) -> Vec<Check> {
    let bin = qemu_binary(root);
    let major = match qemu_major(&bin) {
        Ok(m) => m,
        Err(e) => return vec![check("qemu", Status::Fail, format!("{e:#}"), qemu_fix())],
    };
    if major < 10 {
        return vec![check(
            "qemu",
            Status::Fail,
            format!("{} is QEMU {major}: vhost-user with MSI-X under TCG needs 10 (7.2 segfaults)", bin.display()),
            qemu_fix(),
        )];
    }
    let help = Command::new(&bin)
        .args(["-netdev", "help"])
        .output()
        .map(|o| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
        .unwrap_or_default();
    let missing: Vec<&str> =
        ["vhost-user", "dgram"].into_iter().filter(|n| !help.lines().any(|l| l.trim() == *n)).collect();
    if missing.is_empty() {
        vec![check("qemu", Status::Ok, format!("{} (QEMU {major}, vhost-user and dgram netdevs)", bin.display()), None)]
    } else {
        vec![check(
            "qemu",
            Status::Fail,
            format!("{} (QEMU {major}) lacks the netdev(s) {}", bin.display(), missing.join(", ")),
            qemu_fix(),
        )]
    }
}

fn kvm() -> Check {
    let how = "modprobe kvm_intel (or kvm_amd) and add yourself to group kvm (TCG works without)";
    match std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm") {
        Ok(_) => {
            check("kvm", Status::Ok, "/dev/kvm opens; `accel = auto` still probes a boot (nested KVM can hang)", None)
        }
        Err(e) => {
            check("kvm", Status::Warn, format!("/dev/kvm: {e}: runs use TCG (slower, still valid)"), fix(how, how))
        }
    }
}

fn memfd() -> Check {
    let name = c"arfsnic-doctor";
    // SAFETY: memfd_create with a valid NUL-terminated name; the fd is closed below.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return check(
            "memfd",
            Status::Fail,
            format!("memfd_create: {e}: QEMU's memory-backend-memfd (shared with the backend) cannot work"),
            fix("a kernel with CONFIG_MEMFD_CREATE (every stock kernel)", "the same"),
        );
    }
    // SAFETY: fd was returned by memfd_create above and is not used after this.
    unsafe { libc::close(fd) };
    check("memfd", Status::Ok, "memfd_create works (guest memory shared with the backend)", None)
}

fn hugepages() -> Check {
    let n = std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(0);
    if n > 0 {
        check("hugepages", Status::Ok, format!("{n} 2 MiB pages reserved (optional)"), None)
    } else {
        check("hugepages", Status::Ok, "none reserved: optional, runs use memfd in 4 KiB pages", None)
    }
}

fn socket_dir() -> Check {
    let dir = std::env::temp_dir();
    let probe = tempfile::Builder::new().prefix("arfsnic-doctor-").tempdir();
    let Ok(d) = probe else {
        return check(
            "sockets",
            Status::Fail,
            format!("cannot create a directory in {}: set TMPDIR to a writable directory", dir.display()),
            None,
        );
    };
    let p = d.path().join("qemu.sock");
    if p.as_os_str().len() >= 100 {
        return check(
            "sockets",
            Status::Fail,
            format!("{} is too long for a unix socket path: set TMPDIR to a shorter directory", p.display()),
            None,
        );
    }
    match std::os::unix::net::UnixListener::bind(&p) {
        Ok(_) => check("sockets", Status::Ok, format!("unix sockets bind in {}", dir.display()), None),
        Err(e) => check("sockets", Status::Fail, format!("bind {}: {e}: set TMPDIR elsewhere", p.display()), None),
    }
}

/// Host tools and headers: (command or header under /usr/include, what needs it, Debian
/// package, Fedora package).
const TOOLS: [(&str, &str, &str, &str); 11] = [
    ("cpio", "the initramfs", "cpio", "cpio"),
    ("xz", "the initramfs and kernel sources", "xz-utils", "xz"),
    ("make", "the guest module and kernels", "build-essential", "make"),
    ("gcc", "the guest module and kernels", "build-essential", "gcc"),
    ("flex", "kernel builds", "flex", "flex"),
    ("bison", "kernel builds", "bison", "bison"),
    ("bc", "kernel builds", "bc", "bc"),
    ("patch", "patched kernels", "patch", "patch"),
    ("ethtool", "the initramfs guest's ethtool", "ethtool", "ethtool"),
    ("gelf.h", "kernel builds (objtool)", "libelf-dev", "elfutils-libelf-devel"),
    ("openssl/ssl.h", "kernel builds (module signing tools)", "libssl-dev", "openssl-devel"),
];

fn present(what: &str) -> bool {
    if what.ends_with(".h") {
        ["/usr/include", "/usr/include/x86_64-linux-gnu"].iter().any(|d| Path::new(d).join(what).is_file())
    } else {
        on_path(what).is_some()
    }
}

fn tools() -> Vec<Check> {
    let mut out = Vec::new();
    let bb = on_path("busybox");
    let static_bb = bb.as_ref().is_some_and(|p| {
        Command::new("file").arg("-L").arg(p).output().is_ok_and(|o| {
            let t = String::from_utf8_lossy(&o.stdout);
            t.contains("statically linked") || t.contains("static-pie")
        })
    });
    out.push(match (&bb, static_bb) {
        (Some(p), true) => check("busybox", Status::Ok, format!("{} (static)", p.display()), None),
        (Some(p), false) => check(
            "busybox",
            Status::Fail,
            format!(
                "{} is not statically linked (or `file` is missing): the initramfs needs a static one",
                p.display()
            ),
            fix("apt install busybox-static file", "dnf install busybox file"),
        ),
        (None, _) => check(
            "busybox",
            Status::Fail,
            "not found: the initramfs guest is built from it",
            fix("apt install busybox-static", "dnf install busybox"),
        ),
    });
    let missing: Vec<_> = TOOLS.iter().filter(|t| !present(t.0)).collect();
    if missing.is_empty() {
        let all: Vec<&str> = TOOLS.iter().map(|t| t.0).collect();
        out.push(check("tools", Status::Ok, all.join(", "), None));
    } else {
        let names: Vec<String> = missing.iter().map(|t| format!("{} ({})", t.0, t.1)).collect();
        let mut deb: Vec<&str> = missing.iter().map(|t| t.2).collect();
        let mut fed: Vec<&str> = missing.iter().map(|t| t.3).collect();
        deb.dedup();
        fed.dedup();
        out.push(check(
            "tools",
            Status::Fail,
            format!("missing: {}", names.join(", ")),
            fix(format!("apt install {}", deb.join(" ")), format!("dnf install {}", fed.join(" "))),
        ));
    }
    out
}

fn kernels(root: &Path) -> Check {
    let env = cache_dir(root).join("kernels.env");
    if env.is_file() {
        check("kernels", Status::Ok, format!("stock guest kernels provisioned ({})", env.display()), None)
    } else {
        check(
            "kernels",
            Status::Fail,
            format!("{} missing: the stock Debian guest kernels are not provisioned", env.display()),
            fix(
                "bash guest-tests/provision.sh (as root; Debian 12 hosts)",
                "no provisioning script: pass --kernel PATH/bzImage --kdir TREE of a kernel you built",
            ),
        )
    }
}

fn mmdebstrap() -> Check {
    match on_path("mmdebstrap") {
        Some(p) => check("mmdebstrap", Status::Ok, format!("{} (the Debian guest image)", p.display()), None),
        None => check(
            "mmdebstrap",
            Status::Warn,
            "not found: only `vm.guest = \"debian\"` needs it (build-debian.sh installs it as root)",
            fix("apt install mmdebstrap", "dnf install mmdebstrap"),
        ),
    }
}

fn disk(root: &Path) -> Check {
    let c = cache_dir(root);
    let dir = if c.exists() { c } else { root.to_path_buf() };
    let Ok(cpath) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return check("disk", Status::Warn, format!("{}: path has a NUL byte", dir.display()), None);
    };
    // SAFETY: statvfs writes into the zeroed struct; cpath is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the pointers are valid for the call.
    if unsafe { libc::statvfs(cpath.as_ptr(), &mut st) } != 0 {
        return check(
            "disk",
            Status::Warn,
            format!("statvfs {}: {}", dir.display(), std::io::Error::last_os_error()),
            None,
        );
    }
    let free_gib = st.f_bavail as f64 * st.f_frsize as f64 / (1u64 << 30) as f64;
    if free_gib >= 6.0 {
        check("disk", Status::Ok, format!("{free_gib:.1} GiB free under {}", dir.display()), None)
    } else {
        check(
            "disk",
            Status::Warn,
            format!(
                "{free_gib:.1} GiB free under {}: a kernel build needs about 1.6 GiB, the test suite 12",
                dir.display()
            ),
            None,
        )
    }
}

/// Every check, in order.
pub fn checks(root: &Path) -> Vec<Check> {
    let mut v = qemu(root);
    v.push(kvm());
    v.push(memfd());
    v.push(hugepages());
    v.push(socket_dir());
    v.extend(tools());
    v.push(kernels(root));
    v.push(mmdebstrap());
    v.push(disk(root));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_check_names_the_packages_for_both_families() {
        let c = check("qemu", Status::Fail, "qemu-system-x86_64 not found", qemu_fix());
        let s = c.to_string();
        assert!(s.starts_with("FAIL qemu       qemu-system-x86_64 not found"), "{s}");
        assert!(s.contains("Debian/Ubuntu: bash guest-tests/provision.sh") && s.contains("Fedora: dnf install"), "{s}");
        let ok = check("memfd", Status::Ok, "works", qemu_fix()).to_string();
        assert_eq!(ok, "ok   memfd      works");
    }

    #[test]
    fn memfd_and_sockets_work_here() {
        assert_eq!(memfd().status, Status::Ok);
        assert_eq!(socket_dir().status, Status::Ok, "{}", socket_dir());
    }
}
