//! Scenarios (`configs/scenarios/*.toml`): the VM, the NIC, the traffic, the guest
//! workload and a list of runs (e.g. the same scenario with a sysctl at 0 and 1).
//! Unknown fields are rejected; errors name the file and the field.

use super::env::KERNEL_NAMES;
use crate::model::profile::{load_toml, ConfigError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// A kernel name (`patched-7.3`, `debian-7.3`, … see `runner::env::KERNEL_NAMES`) or
    /// a path to a bzImage.
    pub kernel: String,
    /// For a bzImage: the built kernel tree (to build the guest module against).
    #[serde(default)]
    pub kdir: Option<PathBuf>,
    /// NIC profile: a name in configs/ (`mlx5-cx6`) or a path to a TOML file.
    pub profile: String,
    /// Seconds of traffic per run.
    #[serde(default = "d_duration")]
    pub duration_s: f64,
    /// Seconds at the start of the traffic left out of the guest's rates (Steer-C/s,
    /// Add/s, ...): the flows' first steers and filter inserts happen there.
    #[serde(default)]
    pub warmup_s: f64,
    #[serde(default)]
    pub timeouts: Timeouts,
    pub vm: Vm,
    pub nic: NicCfg,
    pub traffic: Traffic,
    pub guest: Guest,
    /// Sysctls for every run (a run's own sysctls override these).
    #[serde(default)]
    pub sysctls: BTreeMap<String, String>,
    #[serde(default)]
    pub runs: Vec<Run>,
    /// A scenario only model mode runs (`arfsnic model`, docs/model.md): sizes no VM
    /// here reaches (up to 4096 CPUs and workers); `arfsnic run` refuses it.
    #[serde(default)]
    pub model_only: bool,
}

/// Largest guest a VM scenario may ask for, and a model-only one.
pub const MAX_VM_CPUS: u32 = 64;
pub const MAX_MODEL_CPUS: u32 = 4096;

fn d_duration() -> f64 {
    10.0
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Timeouts {
    /// From QEMU start until the workload says it is ready.
    #[serde(default = "d_boot")]
    pub boot_s: u64,
    /// After the traffic ends, until QEMU has exited.
    #[serde(default = "d_finish")]
    pub finish_s: u64,
}
fn d_boot() -> u64 {
    180
}
fn d_finish() -> u64 {
    120
}
impl Default for Timeouts {
    fn default() -> Self {
        Timeouts { boot_s: d_boot(), finish_s: d_finish() }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Vm {
    pub vcpus: u32,
    #[serde(default = "one")]
    pub sockets: u32,
    #[serde(default = "one")]
    pub dies: u32,
    pub cores: u32,
    #[serde(default = "one")]
    pub threads: u32,
    /// QEMU -cpu model (`max`; `Skylake-Server` for two LLCs inside one package).
    #[serde(default = "d_cpu")]
    pub cpu: String,
    #[serde(default = "d_mem")]
    pub memory_mb: u32,
    /// auto (KVM when it really works, else TCG), kvm or tcg.
    #[serde(default = "d_accel")]
    pub accel: String,
    /// Which topology level shares an L3 (QEMU `smp-cache.0.topology`): `core`, `die`,
    /// `socket`, … Unset: QEMU's default for the CPU model. With QEMU 10.0 an Intel model
    /// and `dies=2` aborts QEMU; two LLCs in one package are `sockets=1, cores=2,
    /// threads=2, cpu = "Skylake-Server", l3_per = "core"` (qemu/README.md).
    #[serde(default)]
    pub l3_per: Option<String>,
    /// TCG only: `single` runs every vCPU on one host thread (`-accel tcg,thread=single`),
    /// `multi` one host thread per vCPU (MTTCG), `auto` picks single when the vCPUs
    /// outnumber the host cores left after the backend (docs/measuring.md, "Run health":
    /// with more vCPU threads than cores, a preempted `arfs_lock` holder livelocks the
    /// guest's softirqs).
    #[serde(default = "d_tcg_threads")]
    pub tcg_threads: String,
    /// The guest's user space: `initramfs` (busybox, the fast CI guest) or `debian` (the
    /// trixie disk image of guest-tests/image/build-debian.sh: ethtool, bcc, python3, …,
    /// mounted read-only as the root after the initramfs loaded the drivers).
    #[serde(default = "d_guest_os")]
    pub guest: String,
    /// A second, plain virtio-net NIC on the emulated wire (QEMU's own backend on a
    /// `-netdev dgram` socket pair), which the guest moves into the network namespace
    /// `remote`: the remote end of the kernel's NIC selftests (docs/selftests.md). Its
    /// frames reach the NIC under test like any frame from the network. Needs `debian`.
    #[serde(default)]
    pub remote: bool,
    /// NUMA nodes: `one` (QEMU without `-numa`: every CPU in node 0) or, model mode only,
    /// `socket` (a host with one node per socket, NPS1): `cpu_rmap` looks for the
    /// nearest RX queue IRQ only inside a CPU's node.
    #[serde(default = "d_numa")]
    pub numa: String,
}

fn d_numa() -> String {
    "one".into()
}
fn d_guest_os() -> String {
    "initramfs".into()
}
fn d_tcg_threads() -> String {
    "auto".into()
}
fn one() -> u32 {
    1
}
fn d_cpu() -> String {
    "max".into()
}
fn d_mem() -> u32 {
    1024
}
fn d_accel() -> String {
    "auto".into()
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NicCfg {
    /// Queue pairs.
    pub queues: u16,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LoopMode {
    Open,
    Closed,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Traffic {
    pub flows: u32,
    /// Offered requests per second over all flows (open loop); 0 = window-limited.
    #[serde(default = "d_rate")]
    pub rate_pps: u32,
    #[serde(default = "d_payload")]
    pub payload: usize,
    #[serde(default = "d_mode")]
    pub mode: LoopMode,
    /// Closed loop: outstanding requests per flow.
    #[serde(default = "one")]
    pub window: u32,
    /// Offer `rate_pps` whatever the guest sustains. Unset (false): the first half of
    /// the warm-up probes whether the guest answers the open loop's rate, and a guest that
    /// does not gets half of what it answered for the rest of the run (docs/measuring.md,
    /// "Offered load").
    #[serde(default)]
    pub pin_rate: bool,
    /// `rr` (request/response; UDP or pooled TCP connections), `crr` (TCP: connect, one
    /// request/response, close, at `rate_pps` connections/s over `flows` sockets) or
    /// `stream` (TCP: bulk one way into the guest). TCP needs `guest.proto = "tcp"`
    /// (docs/scenarios.md, "TCP").
    #[serde(default = "d_traffic_pattern")]
    pub pattern: String,
    /// TCP: the partner's ports cycle through this many from its base port (0: all up to
    /// 65535). A small range against the guest's one listener port makes 4-tuples recur.
    #[serde(default)]
    pub ports: u32,
    /// TCP `crr`: `fin` (the partner closes with FIN and keeps TIME-WAIT 10 s) or `rst`
    /// (it resets after the response; its port is free at once).
    #[serde(default = "d_close")]
    pub close: String,
}
fn d_close() -> String {
    "fin".into()
}
fn d_traffic_pattern() -> String {
    "rr".into()
}
fn d_rate() -> u32 {
    2000
}
fn d_payload() -> usize {
    64
}
fn d_mode() -> LoopMode {
    LoopMode::Open
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Guest {
    /// Worker threads of the echo server.
    pub workers: u32,
    /// The echo server's protocol: `udp` (a connected socket per flow) or `tcp` (one
    /// listening port, a connection per flow; brpc-shaped workers, see `pattern`).
    #[serde(default = "d_proto")]
    pub proto: String,
    /// none | scheduler | hop-within-llc | hop-across-llc | work-stealing (pinned workers
    /// sharing one epoll set of one-shot flow sockets: a flow is served by whichever CPU is
    /// free, brpc-like).
    #[serde(default = "d_pattern")]
    pub pattern: String,
    /// work-stealing only: the workers split into this many equal pods, each stealing
    /// only its own connections (flow i belongs to pod i mod pods). Above 1 model mode
    /// only: arfs-echo has one epoll set.
    #[serde(default = "d_pods")]
    pub pods: u32,
    #[serde(default = "d_period")]
    pub period_ms: u32,
    #[serde(default = "d_sock_flow")]
    pub rps_sock_flow_entries: u32,
    #[serde(default = "d_flow_cnt")]
    pub rps_flow_cnt: u32,
    /// Load the guest aRFS module (guest-tests/module).
    #[serde(default)]
    pub module: bool,
    /// Extra module parameters (name = value).
    #[serde(default)]
    pub module_params: BTreeMap<String, String>,
    /// A shell script (relative to the scenario file) the guest's init runs once with the
    /// interface name, after the modules are loaded and before the workload
    /// (build-initramfs.sh --hook); its status and output are in the guest JSON as `hook`.
    #[serde(default)]
    pub hook: Option<PathBuf>,
    /// Unload the module this many seconds into the workload (under load).
    #[serde(default)]
    pub rmmod_at_s: Option<f64>,
    /// After the load: set rps_flow_cnt to 0 and wait this many whole seconds, so the
    /// driver's expiry removes its rules (they never expire on an idle CPU otherwise).
    #[serde(default)]
    pub expire_after_load_s: Option<u32>,
    /// Count this kernel function's calls with bcc's `funccount -i 1` beside the run (the
    /// seed author's method; needs `vm.guest = "debian"`), e.g. `arfs_rx_flow_steer`.
    #[serde(default)]
    pub funccount: Option<String>,
}
fn d_pods() -> u32 {
    1
}

fn d_pattern() -> String {
    "none".into()
}
fn d_proto() -> String {
    "udp".into()
}
fn d_period() -> u32 {
    100
}
fn d_sock_flow() -> u32 {
    32768
}
fn d_flow_cnt() -> u32 {
    4096
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Run {
    pub label: String,
    #[serde(default)]
    pub sysctls: BTreeMap<String, String>,
    /// A different profile for this run.
    #[serde(default)]
    pub profile: Option<String>,
    /// A different guest kernel for this run (a name, as the scenario's `kernel`).
    #[serde(default)]
    pub kernel: Option<String>,
    /// A different `guest.rps_flow_cnt` for this run.
    #[serde(default)]
    pub rps_flow_cnt: Option<u32>,
}

fn err(field: &str, message: impl Into<String>) -> ConfigError {
    ConfigError { file: None, field: field.into(), message: message.into() }
}

/// A kernel name from `KERNEL_NAMES`, or something that looks like a path (checked when
/// the run starts: relative paths are taken from the current directory).
/// Kernels only model mode runs (no image of them is built): `vanilla-6.17` is the RFS
/// code of 6.16–6.17, `rfs_slot()`'s `hash_32` without the active-flow check (the "org
/// code" of Krishna Kumar's table).
pub const MODEL_ONLY_KERNELS: [&str; 1] = ["vanilla-6.17"];

fn check_kernel(field: &str, k: &str, model_only: bool) -> Result<(), ConfigError> {
    if KERNEL_NAMES.contains(&k) || k.contains('/') || Path::new(k).exists() {
        return Ok(());
    }
    if MODEL_ONLY_KERNELS.contains(&k) {
        if model_only {
            return Ok(());
        }
        return Err(err(
            field,
            format!("{k:?} exists in model mode only (model_only = true): no image of it is built"),
        ));
    }
    Err(err(field, format!("{k:?} is not a kernel name; valid: {}, or a path to a bzImage", KERNEL_NAMES.join(", "))))
}

/// The kernel rounds RFS table sizes up to a power of two; a scenario says what it gets.
fn check_pow2(field: &str, n: u32, zero_ok: bool) -> Result<(), ConfigError> {
    if (n == 0 && zero_ok) || (n.is_power_of_two() && n <= 1 << 24) {
        return Ok(());
    }
    let up = n.checked_next_power_of_two().unwrap_or(1 << 24).min(1 << 24);
    Err(err(field, format!("{n} is not a power of two up to 16777216 (the kernel would use {up}); write {up}")))
}

pub const PATTERNS: [&str; 5] = ["none", "scheduler", "hop-within-llc", "hop-across-llc", "work-stealing"];

impl Scenario {
    pub fn load(path: &Path) -> Result<Scenario, ConfigError> {
        let s: Scenario = load_toml(path)?;
        s.validate().map_err(|e| ConfigError { file: Some(path.to_path_buf()), ..e })?;
        Ok(s)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let v = &self.vm;
        let max_cpus = if self.model_only { MAX_MODEL_CPUS } else { MAX_VM_CPUS };
        if v.vcpus == 0 || v.vcpus > max_cpus {
            let hint = if self.model_only { "" } else { " (model_only = true: up to 4096, model mode only)" };
            return Err(err("vm.vcpus", format!("must be between 1 and {max_cpus}{hint}")));
        }
        if v.sockets * v.dies * v.cores * v.threads != v.vcpus {
            return Err(err(
                "vm.vcpus",
                format!(
                    "{} != sockets {} x dies {} x cores {} x threads {}",
                    v.vcpus, v.sockets, v.dies, v.cores, v.threads
                ),
            ));
        }
        if !matches!(v.accel.as_str(), "auto" | "kvm" | "tcg") {
            return Err(err("vm.accel", format!("{:?} is not auto, kvm or tcg", v.accel)));
        }
        if !matches!(v.tcg_threads.as_str(), "auto" | "single" | "multi") {
            return Err(err("vm.tcg_threads", format!("{:?} is not auto, single or multi", v.tcg_threads)));
        }
        if let Some(l) = &v.l3_per {
            if !matches!(l.as_str(), "thread" | "core" | "module" | "cluster" | "die" | "socket") {
                return Err(err("vm.l3_per", format!("{l:?} is not thread, core, module, cluster, die or socket")));
            }
        }
        if v.dies > 1 && v.cpu != "max" && !v.cpu.starts_with("EPYC") && v.cpu != "qemu64" {
            return Err(err(
                "vm.dies",
                "QEMU 10.0 aborts with an Intel CPU model and dies > 1 (cpuid 0x1f assertion); \
                 for two LLCs in one package use cores = 2, threads = 2, l3_per = \"core\"",
            ));
        }
        if v.memory_mb < 256 {
            return Err(err("vm.memory_mb", "needs at least 256"));
        }
        if !matches!(v.guest.as_str(), "initramfs" | "debian") {
            return Err(err("vm.guest", format!("{:?} is not initramfs or debian", v.guest)));
        }
        if v.remote && v.guest != "debian" {
            return Err(err("vm.remote", "needs vm.guest = \"debian\" (the guest moves the NIC with ip netns)"));
        }
        if let Some(f) = &self.guest.funccount {
            if v.guest != "debian" {
                return Err(err("guest.funccount", "needs vm.guest = \"debian\" (bcc is in the Debian image)"));
            }
            if f.is_empty() || !f.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(err("guest.funccount", format!("{f:?} is not a kernel function name")));
            }
        }
        let max_queues = if self.model_only { MAX_MODEL_CPUS } else { 64 };
        if self.nic.queues == 0 || u32::from(self.nic.queues) > max_queues {
            let hint = if self.model_only { "" } else { " (model_only = true: up to 4096, model mode only)" };
            return Err(err("nic.queues", format!("must be between 1 and {max_queues}{hint}")));
        }
        if self.traffic.flows == 0 || self.traffic.flows > 16384 {
            return Err(err("traffic.flows", "must be between 1 and 16384"));
        }
        let tcp = match self.guest.proto.as_str() {
            "udp" => false,
            "tcp" => true,
            p => return Err(err("guest.proto", format!("{p:?} is not udp or tcp"))),
        };
        match (self.traffic.pattern.as_str(), tcp) {
            ("rr", _) | ("crr" | "stream", true) => {}
            (p @ ("crr" | "stream"), false) => {
                return Err(err("traffic.pattern", format!("{p:?} is TCP traffic: it needs guest.proto = \"tcp\"")))
            }
            (p, _) => return Err(err("traffic.pattern", format!("{p:?} is not rr, crr or stream"))),
        }
        match (self.traffic.close.as_str(), self.traffic.pattern.as_str()) {
            ("fin", _) | ("rst", "crr") => {}
            ("rst", p) => {
                return Err(err(
                    "traffic.close",
                    format!("\"rst\" is for crr, not {p} (pooled connections close with FIN)"),
                ))
            }
            (c, _) => return Err(err("traffic.close", format!("{c:?} is not fin or rst"))),
        }
        if self.traffic.ports != 0 && !tcp {
            return Err(err("traffic.ports", "is for TCP (UDP flow i uses port base + i)"));
        }
        if self.traffic.ports != 0 && self.traffic.ports < self.traffic.flows {
            return Err(err(
                "traffic.ports",
                format!(
                    "{} ports for {} connections: every connection needs a port of its own",
                    self.traffic.ports, self.traffic.flows
                ),
            ));
        }
        if self.traffic.pattern == "crr" && self.traffic.rate_pps == 0 {
            return Err(err("traffic.rate_pps", "crr needs a rate (connections per second)"));
        }
        let max_payload = if tcp { 65536 } else { 1400 };
        if !(16..=max_payload).contains(&self.traffic.payload) {
            return Err(err("traffic.payload", format!("must be between 16 and {max_payload} bytes")));
        }
        if tcp && self.vm.remote {
            return Err(err("guest.proto", "tcp runs do not take vm.remote yet"));
        }
        if self.traffic.window == 0 {
            return Err(err("traffic.window", "must be at least 1"));
        }
        if !(self.duration_s > 0.0 && self.duration_s <= 3600.0) {
            return Err(err("duration_s", "must be > 0 and <= 3600"));
        }
        if !(self.warmup_s >= 0.0 && self.warmup_s <= self.duration_s - 1.0) {
            return Err(err("warmup_s", "must be >= 0 and leave at least 1 s of duration_s"));
        }
        let max_workers = if self.model_only { MAX_MODEL_CPUS } else { 256 };
        if self.guest.workers == 0 || self.guest.workers > max_workers {
            return Err(err("guest.workers", format!("must be between 1 and {max_workers}")));
        }
        if self.guest.rmmod_at_s.is_some_and(|t| !(t >= 0.0 && t < self.duration_s)) {
            return Err(err("guest.rmmod_at_s", "must be >= 0 and shorter than duration_s"));
        }
        if self.guest.rmmod_at_s.is_some() && !self.guest.module {
            return Err(err("guest.rmmod_at_s", "needs guest.module = true"));
        }
        if !PATTERNS.contains(&self.guest.pattern.as_str()) {
            return Err(err(
                "guest.pattern",
                format!("{:?} is not one of {}", self.guest.pattern, PATTERNS.join(", ")),
            ));
        }
        match (v.numa.as_str(), self.model_only) {
            ("one", _) | ("socket", true) => {}
            ("socket", false) => {
                return Err(err("vm.numa", "\"socket\" is model mode only (model_only = true): the VMs boot one node"))
            }
            (o, _) => return Err(err("vm.numa", format!("{o:?} is not one or socket"))),
        }
        let pods = self.guest.pods;
        if pods == 0 || !self.guest.workers.is_multiple_of(pods) {
            return Err(err(
                "guest.pods",
                format!("{pods} must be at least 1 and divide guest.workers {}", self.guest.workers),
            ));
        }
        if pods > 1 && self.guest.pattern != "work-stealing" {
            return Err(err("guest.pods", "more than one pod needs guest.pattern = \"work-stealing\""));
        }
        if pods > 1 && !self.model_only {
            return Err(err(
                "guest.pods",
                "more than one pod is model mode only (model_only = true): arfs-echo has one epoll set",
            ));
        }
        check_kernel("kernel", &self.kernel, self.model_only)?;
        check_pow2("guest.rps_flow_cnt", self.guest.rps_flow_cnt, true)?;
        check_pow2("guest.rps_sock_flow_entries", self.guest.rps_sock_flow_entries, true)?;
        for (i, r) in self.runs.iter().enumerate() {
            if r.label.is_empty() || r.label.contains(char::is_whitespace) || r.label.contains(['/', '\\']) {
                return Err(err(
                    &format!("runs[{i}].label"),
                    "must be a non-empty word without '/' (it names log files)",
                ));
            }
            if let Some(k) = &r.kernel {
                check_kernel(&format!("runs[{i}].kernel"), k, self.model_only)?;
            }
            if let Some(n) = r.rps_flow_cnt {
                check_pow2(&format!("runs[{i}].rps_flow_cnt"), n, true)?;
            }
        }
        // What the link partner will be asked to do, checked before any VM boots (model
        // mode runs no link partner: its socket buffers do not exist there).
        if !self.model_only {
            super::run::partner_config(self).validate().map_err(|e| err("traffic", e.to_string()))?;
        }
        for (k, val) in self.sysctls.iter().chain(self.runs.iter().flat_map(|r| r.sysctls.iter())) {
            if k.contains(['=', ',', ' ']) || val.contains([',', ' ']) {
                return Err(err("sysctls", format!("{k}={val}: names and values may not contain '=', ',' or spaces")));
            }
        }
        Ok(())
    }

    /// The runs, or one run named "default" when none are listed.
    pub fn runs(&self) -> Vec<Run> {
        if self.runs.is_empty() {
            vec![Run {
                label: "default".into(),
                sysctls: BTreeMap::new(),
                profile: None,
                kernel: None,
                rps_flow_cnt: None,
            }]
        } else {
            self.runs.clone()
        }
    }

    /// The kernel a run boots.
    pub fn kernel_for<'a>(&'a self, run: &'a Run) -> &'a str {
        run.kernel.as_deref().unwrap_or(&self.kernel)
    }

    /// The `rps_flow_cnt` a run sets on every RX queue.
    pub fn rps_flow_cnt_for(&self, run: &Run) -> u32 {
        run.rps_flow_cnt.unwrap_or(self.guest.rps_flow_cnt)
    }

    /// Scenario sysctls overlaid with a run's.
    pub fn sysctls_for(&self, run: &Run) -> BTreeMap<String, String> {
        let mut m = self.sysctls.clone();
        m.extend(run.sysctls.clone());
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
name = "t"
kernel = "patched-7.3"
profile = "mlx5-cx6"
[vm]
vcpus = 2
cores = 2
[nic]
queues = 2
[traffic]
flows = 8
[guest]
workers = 2
"#;

    fn with(traffic: &str, guest: &str) -> Result<(), ConfigError> {
        let base = if traffic.contains("flows") { BASE.replace("flows = 8\n", "") } else { BASE.to_string() };
        let t = base
            .replace("[traffic]\n", &format!("[traffic]\n{traffic}\n"))
            .replace("[guest]\n", &format!("[guest]\n{guest}\n"));
        let s: Scenario = toml::from_str(&t).unwrap();
        s.validate()
    }

    #[test]
    fn tcp_keys_are_checked_by_name() {
        with("", "").unwrap();
        with("pattern = \"crr\"\nrate_pps = 100", "proto = \"tcp\"").unwrap();
        with("pattern = \"stream\"\npayload = 65536", "proto = \"tcp\"").unwrap();
        let cases = [
            ("pattern = \"crr\"", "", "traffic.pattern", "needs guest.proto"),
            ("pattern = \"rrr\"", "", "traffic.pattern", "not rr, crr or stream"),
            ("", "proto = \"sctp\"", "guest.proto", "not udp or tcp"),
            ("pattern = \"crr\"\nrate_pps = 0", "proto = \"tcp\"", "traffic.rate_pps", "connections per second"),
            (
                "pattern = \"crr\"\nrate_pps = 10\nflows = 64\nports = 32",
                "proto = \"tcp\"",
                "traffic.ports",
                "needs a port",
            ),
            ("ports = 100", "", "traffic.ports", "is for TCP"),
            ("close = \"rst\"", "proto = \"tcp\"", "traffic.close", "is for crr"),
            (
                "pattern = \"crr\"\nrate_pps = 10\nclose = \"abort\"",
                "proto = \"tcp\"",
                "traffic.close",
                "not fin or rst",
            ),
            ("payload = 2000", "", "traffic.payload", "16 and 1400"),
            ("payload = 70000", "proto = \"tcp\"", "traffic.payload", "16 and 65536"),
            (
                "flows = 16384\npayload = 65536\nmode = \"closed\"\nwindow = 4",
                "proto = \"tcp\"",
                "traffic",
                "exceeds 512 MiB",
            ),
        ];
        for (t, g, field, msg) in cases {
            let e = with(t, g).unwrap_err();
            assert_eq!(e.field, field, "{t} {g}");
            assert!(e.message.contains(msg), "{t} {g}: {}", e.message);
        }
    }
}
