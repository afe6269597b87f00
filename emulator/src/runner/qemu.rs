//! Building and running the QEMU command line for a guest on the emulated NIC.

use anyhow::{bail, Context};
use crossbeam_channel::{bounded, Receiver};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct QemuSpec {
    pub binary: PathBuf,
    pub accel: String,
    pub cpu: String,
    pub vcpus: u32,
    pub sockets: u32,
    pub dies: u32,
    pub cores: u32,
    pub threads: u32,
    pub memory_mb: u32,
    /// QEMU `smp-cache.0.topology` for the L3, if set.
    pub l3_per: Option<String>,
    pub socket: PathBuf,
    pub queues: u16,
    pub mac: String,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub append: String,
    /// A raw disk image attached read-only as virtio-blk (the Debian guest's root).
    pub disk: Option<PathBuf>,
    /// A second, plain virtio-net NIC on a `-netdev dgram` unix socket pair (`vm.remote`).
    pub remote: Option<RemoteNic>,
}

/// The remote NIC: QEMU binds `qemu_path` and sends to `backend_path`.
#[derive(Clone, Debug)]
pub struct RemoteNic {
    pub mac: String,
    pub qemu_path: PathBuf,
    pub backend_path: PathBuf,
}

impl QemuSpec {
    /// The argument list (without the binary).
    pub fn args(&self) -> Vec<String> {
        let m = self.memory_mb;
        let n = self.queues;
        let mut args = vec![
            "-nodefaults".into(),
            "-nographic".into(),
            "-no-reboot".into(),
            // Thread names ("CPU 0/TCG", "ALL CPUs/TCG"): how the runner finds the vCPU
            // threads for their host-side run and wait times.
            "-name".into(),
            "arfsnic,debug-threads=on".into(),
            "-accel".into(),
            self.accel.clone(),
            "-machine".into(),
            match &self.l3_per {
                Some(l) => format!("q35,memory-backend=mem,smp-cache.0.cache=l3,smp-cache.0.topology={l}"),
                None => "q35,memory-backend=mem".into(),
            },
            "-cpu".into(),
            self.cpu.clone(),
            "-smp".into(),
            format!(
                "{},sockets={},dies={},cores={},threads={}",
                self.vcpus, self.sockets, self.dies, self.cores, self.threads
            ),
            "-m".into(),
            format!("{m}M"),
            // vhost-user needs guest memory the backend can map: memfd with share=on.
            "-object".into(),
            format!("memory-backend-memfd,id=mem,size={m}M,share=on"),
            "-chardev".into(),
            format!("socket,id=c0,path={}", self.socket.display()),
            "-netdev".into(),
            format!("vhost-user,id=n0,chardev=c0,queues={n}"),
            // 2N+2 MSI-X vectors: one per RX and TX queue plus config and control. `hash=on`:
            // the guest may negotiate HASH_REPORT, which the backend offers (each frame's RSS
            // hash in its header: ethtool's `rxhash`, off in the guest until turned on).
            "-device".into(),
            format!("virtio-net-pci,netdev=n0,mq=on,hash=on,vectors={},mac={}", 2 * u32::from(n) + 2, self.mac),
            "-kernel".into(),
            self.kernel.display().to_string(),
            "-initrd".into(),
            self.initrd.display().to_string(),
            "-append".into(),
            self.append.clone(),
            "-serial".into(),
            "stdio".into(),
        ];
        if let Some(d) = &self.disk {
            // Read-only: concurrent runs share the image; the guest writes only to tmpfs.
            args.push("-drive".into());
            args.push(format!("file={},if=virtio,format=raw,readonly=on", d.display()));
        }
        if let Some(r) = &self.remote {
            // After the NIC under test on the command line: a later PCI slot, so the guest
            // probes it second (the init finds it by MAC anyway).
            args.push("-netdev".into());
            args.push(format!(
                "dgram,id=r0,local.type=unix,local.path={},remote.type=unix,remote.path={}",
                r.qemu_path.display(),
                r.backend_path.display()
            ));
            args.push("-device".into());
            args.push(format!("virtio-net-pci,netdev=r0,mac={}", r.mac));
        }
        args
    }

    /// The command as a shell line (for logs and docs).
    pub fn shell_line(&self) -> String {
        let mut s = self.binary.display().to_string();
        for a in self.args() {
            if a.contains([' ', ',', '=']) && a.contains(' ') {
                s.push_str(&format!(" '{a}'"));
            } else {
                s.push(' ');
                s.push_str(&a);
            }
        }
        s
    }
}

/// A running QEMU: serial console lines arrive on `lines` (and go to the log file).
pub struct QemuProcess {
    pub child: Child,
    pub lines: Receiver<String>,
    pub serial_log: PathBuf,
    pub stderr_log: PathBuf,
    pub started: Instant,
}

/// Longest console line handed to the run loop; longer ones arrive in pieces.
pub const MAX_SERIAL_LINE: usize = 64 * 1024;
/// Console lines waiting for the run loop.
pub const SERIAL_BACKLOG: usize = 4096;
/// Size at which a run's serial log file stops growing.
pub const MAX_SERIAL_LOG: usize = 64 << 20;

impl QemuProcess {
    pub fn spawn(spec: &QemuSpec, logdir: &Path, tag: &str) -> anyhow::Result<QemuProcess> {
        let serial_log = logdir.join(format!("{tag}.serial.log"));
        let stderr_log = logdir.join(format!("{tag}.qemu-stderr.log"));
        let mut child = Command::new(&spec.binary)
            .args(spec.args())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(File::create(&stderr_log)?)
            .spawn()
            .with_context(|| format!("starting {}", spec.binary.display()))?;
        let out = child.stdout.take().context("QEMU stdout")?;
        // Bounded everywhere the guest controls the size (docs/security.md): lines are cut
        // at MAX_SERIAL_LINE bytes, at most SERIAL_BACKLOG lines wait for the run loop (the
        // reader, and so QEMU's console, waits when it lags), and the log file stops
        // growing at MAX_SERIAL_LOG bytes.
        let (tx, rx) = bounded(SERIAL_BACKLOG);
        let mut log = File::create(&serial_log)?;
        std::thread::Builder::new().name("qemu-serial".into()).spawn(move || {
            let mut r = BufReader::new(out);
            let mut buf = Vec::new();
            let mut logged = 0usize;
            loop {
                buf.clear();
                match Read::by_ref(&mut r).take(MAX_SERIAL_LINE as u64).read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if logged < MAX_SERIAL_LOG {
                            let _ = log.write_all(&buf);
                            logged += n;
                            if logged >= MAX_SERIAL_LOG {
                                let _ = writeln!(log, "\n[arfsnic: serial log cut at {MAX_SERIAL_LOG} bytes]");
                            }
                        }
                        let line = String::from_utf8_lossy(&buf).trim_end_matches(['\r', '\n']).to_string();
                        if tx.send(line).is_err() {
                            break;
                        }
                    }
                }
            }
        })?;
        Ok(QemuProcess { child, lines: rx, serial_log, stderr_log, started: Instant::now() })
    }

    /// The last `n` lines of the serial log.
    pub fn serial_tail(&self, n: usize) -> String {
        tail(&self.serial_log, n)
    }

    pub fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr_log).unwrap_or_default()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Wait for QEMU to exit by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for QemuProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Major version of a QEMU binary.
pub fn qemu_major(binary: &Path) -> anyhow::Result<u32> {
    let out = Command::new(binary).arg("--version").output().with_context(|| {
        format!("{} not found: run `bash guest-tests/provision.sh` (QEMU 10 from bookworm-backports)", binary.display())
    })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v = text
        .split_whitespace()
        .skip_while(|w| *w != "version")
        .nth(1)
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse().ok());
    match v {
        Some(m) => Ok(m),
        None => bail!("cannot read the version of {}: {text}", binary.display()),
    }
}

/// Whether KVM really works: `/dev/kvm` can exist and still hang a guest (nested
/// virtualisation). Boots `kernel` with no init under KVM; a working KVM reaches the
/// "no init" panic within seconds and QEMU exits (-no-reboot, panic=-1).
pub fn kvm_works(binary: &Path, kernel: &Path, timeout: Duration) -> bool {
    if std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm").is_err() {
        return false;
    }
    let child = Command::new(binary)
        .args(["-nodefaults", "-nographic", "-no-reboot", "-accel", "kvm", "-m", "256M", "-serial", "stdio", "-kernel"])
        .arg(kernel)
        .args(["-append", "console=ttyS0 panic=-1 rdinit=/arfsnic-kvm-probe-no-such-init"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let Ok(mut child) = child else { return false };
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if let Ok(Some(_)) = child.try_wait() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_has_the_vhost_user_essentials() {
        let s = QemuSpec {
            binary: "qemu-system-x86_64".into(),
            accel: "tcg".into(),
            cpu: "Skylake-Server".into(),
            vcpus: 4,
            sockets: 1,
            dies: 2,
            cores: 2,
            threads: 1,
            memory_mb: 1024,
            l3_per: None,
            socket: "/tmp/x.sock".into(),
            queues: 3,
            mac: "52:54:00:12:34:56".into(),
            kernel: "k".into(),
            initrd: "i".into(),
            append: "console=ttyS0".into(),
            disk: None,
            remote: None,
        };
        let a = s.args().join(" ");
        assert!(a.contains("memory-backend-memfd,id=mem,size=1024M,share=on"));
        assert!(a.contains("q35,memory-backend=mem"));
        assert!(a.contains("vhost-user,id=n0,chardev=c0,queues=3"));
        assert!(a.contains("virtio-net-pci,netdev=n0,mq=on,hash=on,vectors=8,"));
        assert!(a.contains("-smp 4,sockets=1,dies=2,cores=2,threads=1"));
        assert!(a.starts_with("-nodefaults"));
    }
}
