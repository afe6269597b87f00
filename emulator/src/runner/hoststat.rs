//! The host's side of a run: how much CPU QEMU's vCPU threads got and how long they waited
//! for it (`/proc/PID/task/TID/schedstat`: time on the CPU, time runnable but waiting on a
//! run queue), how much CPU arfsnic's own threads used (the backend's cost per frame), and
//! how busy the host was (`/proc/stat`). A vCPU thread that waits while it is runnable is a
//! vCPU the guest believes is running: if it holds a spinlock, every other vCPU that wants
//! the lock spins (docs/measuring.md, "Run health").

use crate::report::schema::{HostReport, ThreadGroup, VcpuThread};
use std::collections::BTreeMap;
use std::path::Path;

/// One reading of QEMU's vCPU threads, of every thread of arfsnic's own process, of the
/// frames the device moved so far and of the host's CPU counters.
#[derive(Clone, Debug, Default)]
pub struct HostSample {
    /// QEMU's vCPU threads: tid -> (thread name, ns on CPU, ns runnable and waiting)
    threads: BTreeMap<u32, (String, u64, u64)>,
    /// Every thread of the backend's process: tid -> (thread name, ns on CPU)
    own: BTreeMap<u32, (String, u64)>,
    /// Frames the device has put into the guest's RX vrings plus frames it has taken from
    /// its TX vrings, read by the caller at the same moment.
    frames: u64,
    /// host /proc/stat "cpu" line: (busy, total) in jiffies
    cpu: (u64, u64),
}

/// QEMU names its vCPU threads "CPU N/TCG", "CPU N/KVM", or "ALL CPUs/TCG" for
/// single-threaded TCG.
fn is_vcpu_thread(comm: &str) -> bool {
    (comm.starts_with("CPU ") || comm.starts_with("ALL CPUs")) && comm.contains('/')
}

/// The group a thread of arfsnic is reported in: its name without a trailing index
/// (`vhost-w0`, `vhost-w1` -> `vhost-w`; `tap-rx3` -> `tap-rx`). The kernel keeps 15
/// bytes of a name (`link-partner-tcp` reads `link-partner-tc`).
fn thread_group(comm: &str) -> String {
    let g = comm.trim_end_matches(|c: char| c.is_ascii_digit()).trim_end_matches('-');
    if g.is_empty() { comm } else { g }.to_string()
}

/// Every thread of `task_dir` whose name `keep` accepts: tid -> (name, ns on CPU, ns waiting).
fn read_tasks(task_dir: &Path, keep: impl Fn(&str) -> bool) -> BTreeMap<u32, (String, u64, u64)> {
    let mut threads = BTreeMap::new();
    if let Ok(rd) = std::fs::read_dir(task_dir) {
        for e in rd.flatten() {
            let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
            let comm = comm.trim();
            if !keep(comm) {
                continue;
            }
            let st = std::fs::read_to_string(e.path().join("schedstat")).unwrap_or_default();
            if let Some((run, wait)) = read_schedstat(&st) {
                threads.insert(tid, (comm.to_string(), run, wait));
            }
        }
    }
    threads
}

fn read_schedstat(text: &str) -> Option<(u64, u64)> {
    let mut it = text.split_whitespace().map(|w| w.parse::<u64>().ok());
    Some((it.next()??, it.next()??))
}

fn read_host_cpu(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line.split_whitespace().skip(1).filter_map(|w| w.parse().ok()).collect();
    if v.len() < 5 {
        return None;
    }
    let total: u64 = v.iter().take(8).sum();
    let idle = v[3] + v[4];
    Some((total - idle, total))
}

impl HostSample {
    /// Read the vCPU threads of QEMU's `pid` (none if the process is gone or has no such
    /// threads), every thread of this process, and the host's CPU counters; `frames` is
    /// the device's RX delivered + TX taken count read just before.
    pub fn read(pid: u32, frames: u64) -> HostSample {
        Self::read_from(Path::new("/proc"), pid, std::process::id(), frames)
    }

    fn read_from(proc_root: &Path, pid: u32, own_pid: u32, frames: u64) -> HostSample {
        let threads = read_tasks(&proc_root.join(pid.to_string()).join("task"), is_vcpu_thread);
        let own = read_tasks(&proc_root.join(own_pid.to_string()).join("task"), |_| true)
            .into_iter()
            .map(|(tid, (name, run, _))| (tid, (name, run)))
            .collect();
        let cpu =
            std::fs::read_to_string(proc_root.join("stat")).ok().and_then(|t| read_host_cpu(&t)).unwrap_or((0, 0));
        HostSample { threads, own, frames, cpu }
    }

    /// What happened between `self` (earlier) and `later`, over `wall_s` seconds.
    pub fn delta(&self, later: &HostSample, wall_s: f64, host_cores: u32) -> HostReport {
        let mut vcpu_threads = Vec::new();
        let (mut run_sum, mut wait_sum) = (0u64, 0u64);
        for (tid, (name, run1, wait1)) in &later.threads {
            let (run0, wait0) = self.threads.get(tid).map_or((0, 0), |(_, r, w)| (*r, *w));
            let (run, wait) = (run1.saturating_sub(run0), wait1.saturating_sub(wait0));
            run_sum += run;
            wait_sum += wait;
            vcpu_threads.push(VcpuThread { name: name.clone(), run_ms: run as f64 / 1e6, wait_ms: wait as f64 / 1e6 });
        }
        // Every thread of this process present at the later reading: its time on a CPU
        // since the earlier one (all of it for a thread started in between).
        let mut groups: BTreeMap<String, (u32, u64)> = BTreeMap::new();
        for (tid, (name, run1)) in &later.own {
            let run0 = self.own.get(tid).map_or(0, |(_, r)| *r);
            let g = groups.entry(thread_group(name)).or_default();
            g.0 += 1;
            g.1 += run1.saturating_sub(run0);
        }
        let backend_ns: u64 = groups.values().map(|g| g.1).sum();
        let mut backend_threads: Vec<ThreadGroup> = groups
            .into_iter()
            .map(|(name, (threads, ns))| ThreadGroup {
                name,
                threads,
                cpu_ms: ns as f64 / 1e6,
                cpu_pct: (wall_s > 0.0).then(|| pct_of_core(ns, wall_s)),
            })
            .collect();
        backend_threads.sort_by(|a, b| b.cpu_ms.total_cmp(&a.cpu_ms).then_with(|| a.name.cmp(&b.name)));
        let have_own = !later.own.is_empty();
        let frames = later.frames.saturating_sub(self.frames);
        let (busy, total) = (later.cpu.0.saturating_sub(self.cpu.0), later.cpu.1.saturating_sub(self.cpu.1));
        HostReport {
            host_cores,
            window_s: wall_s,
            vcpu_threads,
            vcpu_wait_pct: (run_sum + wait_sum > 0).then(|| 100.0 * wait_sum as f64 / (run_sum + wait_sum) as f64),
            host_cpu_busy_pct: (total > 0).then(|| 100.0 * busy as f64 / total as f64),
            vcpu_cpu_pct: (!later.threads.is_empty() && wall_s > 0.0).then(|| pct_of_core(run_sum, wall_s)),
            backend_cpu_ms: have_own.then(|| backend_ns as f64 / 1e6),
            backend_cpu_pct: (have_own && wall_s > 0.0).then(|| pct_of_core(backend_ns, wall_s)),
            backend_threads,
            backend_frames: have_own.then_some(frames),
            backend_ns_per_frame: (have_own && frames > 0).then(|| backend_ns as f64 / frames as f64),
        }
    }
}

/// `ns` of CPU time over `wall_s` seconds as a share of one core (200 = two cores busy).
fn pct_of_core(ns: u64, wall_s: f64) -> f64 {
    100.0 * ns as f64 / (wall_s * 1e9)
}

/// Online host CPUs.
pub fn host_cores() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

/// The `-accel` argument: for TCG with `tcg_threads = auto`, one host thread for all vCPUs
/// (`thread=single`) unless every vCPU thread can have a host core of its own next to the
/// backend's (vcpus + 1 <= host cores). Measured in docs/measuring.md ("Run health"): with
/// more vCPU threads than cores, lock-holder preemption livelocks the guest.
pub fn accel_arg(accel: &str, tcg_threads: &str, vcpus: u32, host_cores: u32) -> String {
    if accel != "tcg" {
        return accel.to_string();
    }
    let single = match tcg_threads {
        "single" => true,
        "multi" => false,
        _ => vcpus + 1 > host_cores,
    };
    format!("tcg,thread={}", if single { "single" } else { "multi" })
}

/// The most vCPUs a run was measured to stay `ok` with on a 2-core host, single-threaded
/// TCG (the topology matrix in docs/results.md).
pub const MEASURED_MAX_VCPUS: u32 = 16;

/// The warning printed before a scenario whose vCPUs the host cannot carry, or `None`.
pub fn vcpu_warning(qemu_accel: &str, vcpus: u32, host_cores: u32) -> Option<String> {
    if qemu_accel == "tcg,thread=multi" && vcpus + 1 > host_cores {
        return Some(format!(
            "vm.vcpus = {vcpus} with vm.tcg_threads = \"multi\" on a {host_cores}-core host: {vcpus} vCPU threads and the \
             backend share {host_cores} cores, at most {} vCPU(s) get a core of their own; preempted arfs_lock holders \
             livelock such runs (docs/measuring.md, \"Run health\"); use tcg_threads = \"auto\"",
            host_cores.saturating_sub(1)
        ));
    }
    if qemu_accel.starts_with("tcg") && vcpus > MEASURED_MAX_VCPUS {
        return Some(format!(
            "vm.vcpus = {vcpus}: runs were measured to stay ok up to {MEASURED_MAX_VCPUS} vCPUs on a 2-core host under TCG \
             (docs/results.md, topology matrix); expect degraded or invalid runs"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warns_about_vcpus_the_host_cannot_carry() {
        assert!(vcpu_warning("tcg,thread=multi", 6, 2).unwrap().contains("at most 1 vCPU(s)"));
        assert!(vcpu_warning("tcg,thread=multi", 3, 4).is_none());
        assert!(vcpu_warning("tcg,thread=single", 16, 2).is_none());
        assert!(vcpu_warning("tcg,thread=single", 32, 2).unwrap().contains("up to 16 vCPUs"));
        assert!(vcpu_warning("kvm", 32, 2).is_none());
    }

    #[test]
    fn auto_is_single_threaded_when_vcpus_outnumber_free_cores() {
        assert_eq!(accel_arg("tcg", "auto", 4, 2), "tcg,thread=single");
        assert_eq!(accel_arg("tcg", "auto", 2, 2), "tcg,thread=single");
        assert_eq!(accel_arg("tcg", "auto", 4, 8), "tcg,thread=multi");
        assert_eq!(accel_arg("tcg", "multi", 16, 2), "tcg,thread=multi");
        assert_eq!(accel_arg("tcg", "single", 2, 64), "tcg,thread=single");
        assert_eq!(accel_arg("kvm", "single", 4, 2), "kvm");
    }

    #[test]
    fn reads_vcpu_threads_and_host_cpu_from_a_proc_tree() {
        let d = tempfile::tempdir().unwrap();
        let task = d.path().join("42/task");
        for (tid, comm, st) in [
            (42, "qemu-system-x86", "5 5 1"),
            (43, "CPU 0/TCG", "1000000 500000 10"),
            (44, "CPU 1/TCG", "3000000 0 10"),
        ] {
            std::fs::create_dir_all(task.join(tid.to_string())).unwrap();
            std::fs::write(task.join(tid.to_string()).join("comm"), format!("{comm}\n")).unwrap();
            std::fs::write(task.join(tid.to_string()).join("schedstat"), st).unwrap();
        }
        // the backend's own process, pid 99: every thread counts
        let own = d.path().join("99/task");
        let thread = |tid: u32, comm: &str, st: &str| {
            std::fs::create_dir_all(own.join(tid.to_string())).unwrap();
            std::fs::write(own.join(tid.to_string()).join("comm"), format!("{comm}\n")).unwrap();
            std::fs::write(own.join(tid.to_string()).join("schedstat"), st).unwrap();
        };
        thread(99, "arfsnic", "1000000 0 1");
        thread(100, "vhost-w0", "5000000 0 1");
        thread(101, "vhost-w1", "7000000 0 1");
        thread(102, "link-partner", "2000000 0 1");
        std::fs::write(d.path().join("stat"), "cpu  10 0 10 70 10 0 0 0 0 0\ncpu0 1 2 3\n").unwrap();
        let a = HostSample::read_from(d.path(), 42, 99, 1000);
        assert_eq!(a.threads.len(), 2);
        assert_eq!(a.own.len(), 4);
        assert_eq!(a.cpu, (20, 100));
        std::fs::write(task.join("43/schedstat"), "3000000 2500000 20").unwrap();
        std::fs::write(d.path().join("stat"), "cpu  40 0 20 120 20 0 0 0 0 0\n").unwrap();
        // 0.5 ms main thread, 3 + 4 ms vhost workers, 1.5 ms partner, and a thread started
        // in between whose 1 ms all falls in the window
        thread(99, "arfsnic", "1500000 0 2");
        thread(100, "vhost-w0", "8000000 0 2");
        thread(101, "vhost-w1", "11000000 0 2");
        thread(102, "link-partner", "3500000 0 2");
        thread(103, "arfsnic-ctl", "1000000 0 1");
        let b = HostSample::read_from(d.path(), 42, 99, 21_000);
        let r = a.delta(&b, 0.5, 2);
        // thread 43: 2 ms run, 2 ms wait; thread 44: nothing
        assert_eq!(r.vcpu_threads.len(), 2);
        assert!((r.vcpu_wait_pct.unwrap() - 50.0).abs() < 1e-9);
        // 2 ms of vCPU time in 0.5 s: 0.4 % of a core
        assert!((r.vcpu_cpu_pct.unwrap() - 0.4).abs() < 1e-9);
        // busy 20 -> 60 of total 100 -> 200
        assert!((r.host_cpu_busy_pct.unwrap() - 40.0).abs() < 1e-9);
        // backend: 0.5 + 7 + 1.5 + 1 = 10 ms in 0.5 s = 2 % of a core, over 20 000 frames
        assert!((r.backend_cpu_ms.unwrap() - 10.0).abs() < 1e-9);
        assert!((r.backend_cpu_pct.unwrap() - 2.0).abs() < 1e-9);
        assert_eq!(r.backend_frames, Some(20_000));
        assert!((r.backend_ns_per_frame.unwrap() - 500.0).abs() < 1e-9);
        let groups: Vec<(&str, u32, f64)> =
            r.backend_threads.iter().map(|g| (g.name.as_str(), g.threads, g.cpu_ms)).collect();
        assert_eq!(
            groups,
            [("vhost-w", 2, 7.0), ("link-partner", 1, 1.5), ("arfsnic-ctl", 1, 1.0), ("arfsnic", 1, 0.5)]
        );
        assert!((r.backend_threads[0].cpu_pct.unwrap() - 1.4).abs() < 1e-9);
        // a vanished process reads as no threads, and no backend numbers
        let gone = HostSample::read_from(d.path(), 7, 8, 0);
        assert!(gone.threads.is_empty() && gone.own.is_empty());
        let r = gone.delta(&gone, 1.0, 2);
        assert_eq!((r.vcpu_cpu_pct, r.backend_cpu_pct, r.backend_ns_per_frame), (None, None, None));
    }

    #[test]
    fn thread_groups_drop_the_trailing_index() {
        assert_eq!(thread_group("vhost-w12"), "vhost-w");
        assert_eq!(thread_group("tap-rx3"), "tap-rx");
        assert_eq!(thread_group("pktgen-0"), "pktgen");
        assert_eq!(thread_group("arfsnic"), "arfsnic");
        assert_eq!(thread_group("7"), "7");
    }

    #[test]
    fn reads_this_process_threads_from_proc() {
        let s = HostSample::read(u32::MAX, 0);
        assert!(s.threads.is_empty());
        assert!(!s.own.is_empty(), "no thread of this process in /proc");
    }
}
