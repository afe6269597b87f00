//! The run report: what `arfsnic run --json` writes and everything else reads (the
//! results table, `compare`, the demo, the fidelity tests). Typed and versioned: a field
//! renamed here breaks its readers at compile time, and a report written by another
//! schema version is refused with a clear message instead of being half-read.
//!
//! Layering: the runner fills these structs; the rest of `report/` only reads them.
//! Nothing here imports the runner. Counter structs of the layers below (link partner,
//! device snapshot, engine) are embedded as they are, as firecracker embeds its metrics.
//!
//! docs/measuring.md defines every number.

use crate::device::guest::BucketPercentile;
use crate::device::snapshot::{FilterSummary, FrameCounters};
use crate::model::engine::EngineStats;
use crate::model::filter::PartitionStats;
use crate::traffic::partner::LinkStats;
use crate::traffic::remote::RemoteStats;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The version this build writes and reads. Bump it when a field changes meaning or
/// disappears (adding an optional field does not need a bump).
pub const SCHEMA_VERSION: u32 = 1;

/// One scenario: its setting and one entry per run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub schema_version: u32,
    pub scenario: String,
    /// `debian-6.12`, `patched`, or the image path's label.
    pub kernel: String,
    pub kernel_image: PathBuf,
    /// `tcg` or `kvm`.
    pub accel: String,
    /// QEMU's `-accel` argument (`tcg,thread=single`): how the vCPUs ran on the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qemu_accel: Option<String>,
    pub queues: u16,
    pub vcpus: u32,
    /// `sockets=S dies=D cores=C threads=T cpu=MODEL[ l3_per=X]`.
    pub topology: String,
    /// Wall time of the whole scenario (all runs, boots included).
    pub wall_s: f64,
    pub backend: BackendSummary,
    pub runs: Vec<RunReport>,
    /// False when the scenario was stopped (SIGINT/SIGTERM) before its last run ended:
    /// `runs` then holds only the runs that finished. Reports without the field are
    /// complete.
    #[serde(default = "complete_default")]
    pub complete: bool,
    /// The signal that stopped it (`SIGINT`, `SIGTERM`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<String>,
    /// `model` for a report of the model-mode twin (`arfsnic model`, docs/model.md); absent
    /// for a VM run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

fn complete_default() -> bool {
    true
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendSummary {
    /// QEMU connections the one backend served.
    pub connections: u64,
    pub protocol_errors: u64,
}

/// One run: one boot of the guest with one set of sysctls and one profile.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    pub label: String,
    /// The sysctls the guest set before the workload (scenario's plus the run's).
    pub sysctls: BTreeMap<String, String>,
    /// Seconds of offered traffic (`None` when the traffic never started).
    pub duration_s: Option<f64>,
    pub profile: String,
    /// The guest kernel this run booted (`patched-7.3`, `debian-6.12`), when the run
    /// chose its own; the report's `kernel` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// `rps_flow_cnt` written to every RX queue of the guest for this run, when the run
    /// set its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rps_flow_cnt: Option<u32>,
    /// The built-in link partner's view: requests, responses, RTT, per-flow records.
    pub link: LinkStats,
    pub device: DeviceReport,
    /// Per RX queue, what the guest's own counters say it received.
    pub guest_rx_packets_per_queue: Vec<u64>,
    pub guest: GuestReport,
    /// Per flow, at the end of the run.
    pub flows: Vec<FlowView>,
    /// `None` when the guest module did not run.
    pub flows_stuck_without_filter: Option<u64>,
    /// The device's filter table sampled over the run (runner/occupancy.rs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter_table: Option<FilterTimeline>,
    /// Busy share of all guest CPUs over the workload (`/proc/stat`).
    pub guest_cpu_pct: Option<f64>,
    /// RPS IPIs the guest's CPUs received per second of the workload: `received_rps` of
    /// `/proc/net/softnet_stat`, summed over CPUs, after minus before, over the echo
    /// server's run time (docs/measuring.md, "Trade-off columns").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rps_ipi_per_s: Option<f64>,
    /// Requests processed in softirq (`SO_INCOMING_CPU`) on another CPU than the IRQ CPU
    /// of the RX queue they arrived on (`SO_INCOMING_NAPI_ID`), i.e. handed to another
    /// CPU's backlog by RPS/RFS, as a share of the requests counted (%).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_pct: Option<f64>,
    /// Requests whose RX queue's IRQ CPU is in another LLC than the CPU that served them
    /// (`sched_getcpu()`), as a share of the requests counted (%).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cross_llc_pct: Option<f64>,
    /// RFS misses: requests processed in softirq (`SO_INCOMING_CPU`) on another CPU than
    /// the one whose thread read them (`sched_getcpu()`), as a share of the requests
    /// counted (%). RFS exists to make these two the same CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rfs_miss_pct: Option<f64>,
    pub logs: RunLogs,
    /// Boots this run needed (2 after one boot failure).
    pub boot_attempts: u32,
    /// The first line of each failed boot.
    pub boot_failures: Vec<String>,
    /// QEMU's vCPU threads on the host over the traffic after the warm-up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostReport>,
    /// Whether the run measured what it meant to (docs/measuring.md, "Run health").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<Health>,
    /// The request rate the link partner offered, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offered_load: Option<OfferedLoad>,
    /// Earlier attempts of this run that were not `ok` and were run again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub discarded: Vec<Discarded>,
    /// The second guest NIC on the wire (`vm.remote`): frames each way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_port: Option<RemoteStats>,
}

/// An attempt of a run that was not `ok` and was replaced by a new attempt.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Discarded {
    pub verdict: Verdict,
    pub reasons: Vec<String>,
    /// What its Steer-C/s would have been (not a result).
    pub steer_calls_per_s: Option<f64>,
    pub serial_log: PathBuf,
}

/// QEMU's vCPU threads as the host scheduled them and the backend's own CPU time
/// (`/proc/PID/task/TID/schedstat`), over the same window (docs/measuring.md, "E2E cost
/// per packet"). The backend fields are absent in reports made before they existed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostReport {
    pub host_cores: u32,
    /// Seconds between the two readings.
    pub window_s: f64,
    pub vcpu_threads: Vec<VcpuThread>,
    /// Share of the vCPU threads' runnable time spent waiting for a host CPU.
    pub vcpu_wait_pct: Option<f64>,
    /// Busy share of all host CPUs.
    pub host_cpu_busy_pct: Option<f64>,
    /// The vCPU threads' time on a host CPU over the window, summed, as a share of one
    /// core (200 = two cores busy): what the guest cost the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpu_cpu_pct: Option<f64>,
    /// CPU time of every thread of the arfsnic process over the window: the vhost-user
    /// backend (vring workers, connection thread), the device's control plane, the link
    /// partner and the runner's own bookkeeping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_cpu_ms: Option<f64>,
    /// `backend_cpu_ms` as a share of one core over the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_cpu_pct: Option<f64>,
    /// `backend_cpu_ms` by thread name (trailing index dropped: `vhost-w0`, `vhost-w1` ->
    /// `vhost-w`), most CPU first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backend_threads: Vec<ThreadGroup>,
    /// Frames the device wrote into the guest's RX vrings plus frames it took from the
    /// guest's TX vrings, read at the same two moments as the CPU times.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_frames: Option<u64>,
    /// Backend CPU ns per frame: `backend_cpu_ms` / `backend_frames`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_ns_per_frame: Option<f64>,
}

/// Threads of the arfsnic process with one name (trailing index dropped).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ThreadGroup {
    pub name: String,
    pub threads: u32,
    pub cpu_ms: f64,
    /// `cpu_ms` as a share of one core over the window.
    pub cpu_pct: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VcpuThread {
    /// QEMU's thread name: `CPU 0/TCG`, or `ALL CPUs/TCG` for single-threaded TCG.
    pub name: String,
    pub run_ms: f64,
    pub wait_ms: f64,
}

/// A run's health verdict.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    #[default]
    Ok,
    Degraded,
    Invalid,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Degraded => "degraded",
            Verdict::Invalid => "invalid",
        }
    }
}

/// The verdict, its reasons and the signals it was drawn from (docs/measuring.md).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Health {
    pub verdict: Verdict,
    /// One line per limit crossed, naming the signal, its value and the limit.
    pub reasons: Vec<String>,
    pub replies_lost_pct: Option<f64>,
    /// `steer_same` calls as a share of the steer calls in the rates' window (whole run without one).
    pub steer_same_pct: Option<f64>,
    pub lock_wait_ms_per_s: Option<f64>,
    /// Mean time from a steer that queued a rule's work to its command being sent.
    pub work_delay_ms_mean: Option<f64>,
    pub work_delay_ms_max: Option<f64>,
    pub guest_cpu_pct: Option<f64>,
    pub vcpu_wait_pct: Option<f64>,
}

/// What the link partner offered: the scenario's rate, or a rate fitted to what the guest
/// sustained in a probe.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OfferedLoad {
    pub requested_pps: u64,
    pub chosen_pps: u64,
    /// Responses per second the guest sustained in the probe (closed loop), if probed.
    pub probed_pps: Option<f64>,
    pub reason: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunLogs {
    pub serial: PathBuf,
    pub qemu_stderr: PathBuf,
}

/// The device side of a run: per-queue counters (differences over the run), filter and
/// control-plane counters.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceReport {
    pub rx_packets_per_queue: Vec<u64>,
    pub rss_delivered_per_queue: Vec<u64>,
    pub filter_delivered_per_queue: Vec<u64>,
    pub control_delivered_per_queue: Vec<u64>,
    pub rx_dropped_no_buffer_per_queue: Vec<u64>,
    pub rss_delivered: u64,
    pub filter_delivered: u64,
    pub rx_dropped_no_buffer: u64,
    pub dropped_by_filter: u64,
    pub malformed: u64,
    /// Wire-side frames dropped for looking like the device's control frames (the
    /// control EtherType behind any tags, or the device's MAC as source).
    #[serde(default)]
    pub rx_spoofed_dropped: u64,
    /// Frames taken from each TX queue.
    pub tx_packets_per_queue: Vec<u64>,
    /// Flows whose last packet reached another queue than the device chose.
    pub flows_misdelivered: u64,
    pub flows_compared_with_guest: u64,
    pub profile: String,
    /// RSS contexts the device holds at the end of the run (`ethtool -X … context new`;
    /// a module that unloads removes its own).
    #[serde(default)]
    pub rss_contexts: u64,
    pub filter: FilterReport,
    pub control: ControlReport,
}

/// `filter_table`: the device's rule count from the traffic's start to the guest's
/// report, and how long after their flow's last packet the rules that went were removed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FilterTimeline {
    pub sample_ms: u64,
    /// (seconds since the traffic started, rules in the table).
    pub rules: Vec<(f64, u64)>,
    pub peak: u64,
    /// At the last sample (after the expiry wait, when the scenario has one).
    pub at_end: u64,
    /// Rules that were live at one sample and gone at the next.
    pub gone: u64,
    /// Time from such a rule's last matching packet to the sample that found it gone
    /// (an upper bound within `sample_ms`): for a closed TCP connection, close → filter gone.
    pub gone_after_last_packet_ms_p50: Option<f64>,
    pub gone_after_last_packet_ms_p90: Option<f64>,
    pub gone_after_last_packet_ms_max: Option<f64>,
}

/// `device.filter`: the command engine's filter counters.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FilterReport {
    #[serde(flatten)]
    pub summary: FilterSummary,
    /// Rules the device aged out by itself.
    pub aged_out: u64,
}

/// `device.control`: control frames, the engine and its table partitions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ControlReport {
    pub frames: FrameCounters,
    pub engine: EngineStats,
    pub partitions: Vec<PartitionStats>,
}

/// `guest`: the driver's counters from its STATS frames (when the module ran) and the
/// guest system's own JSON block (`system`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawGuest")]
pub struct GuestReport {
    /// Whether the `arfs_virtio` driver reported (STATS frames arrived).
    pub module: bool,
    pub system: GuestSystem,
    #[serde(flatten)]
    pub driver: Option<DriverReport>,
}

/// `guest` as it is on disk: the driver's fields sit next to `module` and `system`. A
/// driver field of the wrong type is an error naming it, never a silently missing driver.
#[derive(Deserialize)]
struct RawGuest {
    module: bool,
    system: GuestSystem,
    #[serde(flatten)]
    driver: serde_json::Map<String, Value>,
}

impl TryFrom<RawGuest> for GuestReport {
    type Error = String;

    fn try_from(r: RawGuest) -> Result<Self, String> {
        let driver = match r.driver.is_empty() {
            true => None,
            false => Some(
                serde_path_to_error::deserialize(Value::Object(r.driver))
                    .map_err(|e| format!("{}: {}", e.path(), e.inner()))?,
            ),
        };
        Ok(GuestReport { module: r.module, system: r.system, driver })
    }
}

/// What the guest's init printed about itself. The fields readers use are typed; the
/// rest (IRQs, softnet, /proc/stat, workload records, …) is kept as the guest wrote it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GuestSystem {
    /// The sysctls as the guest read them back after setting them.
    #[serde(default)]
    pub sysctls: BTreeMap<String, String>,
    /// `MODULE ok` / `MODULE failed …` per module unloaded during the run.
    #[serde(default)]
    pub rmmod: Vec<String>,
    /// Kernel log lines at warning level or worse.
    #[serde(default)]
    pub dmesg_warnings: u64,
    /// bcc's `funccount -i 1 FUNC` beside the run (`guest.funccount`, Debian guest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub funccount: Option<FuncCount>,
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// What bcc's funccount counted in the guest, and the module's own count of steer calls
/// over the same interval (read right after funccount attached and right before it was
/// stopped; the workload's traffic runs entirely inside it).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FuncCount {
    pub function: String,
    /// One count per `-i 1` interval; the last is the part interval up to SIGINT.
    #[serde(default)]
    pub per_interval: Vec<u64>,
    pub total: u64,
    pub module_steer_calls_before: Option<u64>,
    pub module_steer_calls_after: Option<u64>,
    /// Seconds from starting funccount until it attached (its BPF compile).
    #[serde(default)]
    pub attach_s: Option<f64>,
    /// A second funccount without `-i`: one count, never cleared, printed at SIGINT.
    /// `-i 1` reads and then clears its count every second and loses the calls in between
    /// (docs/measuring.md); this one does not.
    #[serde(default)]
    pub total_exact: Option<u64>,
    /// The exact funccount's count of `rps_trigger_softirq`, the RPS IPI handler that
    /// increments softnet_stat's `received_rps`.
    #[serde(default)]
    pub rps_trigger_softirq_exact: Option<u64>,
    /// `received_rps` summed over CPUs from /proc/net/softnet_stat, read with the module's
    /// counter (the source of the `RPS IPI/s` column).
    #[serde(default)]
    pub softnet_received_rps_before: Option<u64>,
    #[serde(default)]
    pub softnet_received_rps_after: Option<u64>,
}

impl FuncCount {
    /// The module's steer calls over funccount's interval.
    pub fn module_calls(&self) -> Option<u64> {
        self.module_steer_calls_after?.checked_sub(self.module_steer_calls_before?)
    }

    /// |exact funccount total − module| as a percentage of the module's count.
    pub fn disagreement_pct(&self) -> Option<f64> {
        pct_off(self.total_exact?, self.module_calls()?)
    }

    /// softnet_stat's `received_rps` over funccount's interval.
    pub fn softnet_rps(&self) -> Option<u64> {
        self.softnet_received_rps_after?.checked_sub(self.softnet_received_rps_before?)
    }

    /// |funccount of rps_trigger_softirq − softnet_stat received_rps| as a percentage of the
    /// latter.
    pub fn rps_disagreement_pct(&self) -> Option<f64> {
        pct_off(self.rps_trigger_softirq_exact?, self.softnet_rps()?)
    }

    /// What `-i 1` lost between reading and clearing its count: (module − sum of the
    /// intervals) as a percentage of the module's count.
    pub fn interval_loss_pct(&self) -> Option<f64> {
        let m = self.module_calls()?;
        (m > 0).then(|| 100.0 * (m as f64 - self.total as f64) / m as f64)
    }
}

fn pct_off(x: u64, reference: u64) -> Option<f64> {
    (reference > 0).then(|| 100.0 * (x as f64 - reference as f64).abs() / reference as f64)
}

/// The driver's counters of one run (docs/measuring.md). Rates are over the traffic
/// window after the scenario's warm-up; `None` when fewer than two STATS samples fell in
/// it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DriverReport {
    pub steer_calls: u64,
    pub steer_calls_per_s: Option<f64>,
    pub adds_per_s: Option<f64>,
    pub mods_per_s: Option<f64>,
    pub dels_per_s: Option<f64>,
    pub lock_contended_pct_window: Option<f64>,
    pub lock_wait_us_per_s: Option<f64>,
    /// `steer_same` share of the steer calls in the rates' window (% ).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steer_same_pct_window: Option<f64>,
    /// Mean steer-to-command delay of the rule works run in the rates' window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_delay_ms_mean_window: Option<f64>,
    pub rates_window_s: Option<f64>,
    /// Start of the rates' window, seconds after the traffic started.
    pub rates_from_s: Option<f64>,
    /// Second by second over the traffic, like `funccount -i 1`.
    pub per_second: Vec<PerSecond>,
    pub steer_new: u64,
    pub steer_update: u64,
    pub steer_same: u64,
    pub adds_ok: u64,
    pub mods_ok: u64,
    pub dels_ok: u64,
    pub add_errors: BTreeMap<String, u64>,
    pub mod_errors: BTreeMap<String, u64>,
    pub del_errors: BTreeMap<String, u64>,
    pub lock_acquired: u64,
    pub lock_contended: u64,
    /// Over the whole run (the window's figure is `lock_contended_pct_window`).
    pub lock_contended_pct: f64,
    pub lock_wait_ns: u64,
    pub lock_wait_ns_max: u64,
    pub rules_now: u64,
    pub rules_peak: u64,
    pub expire_scans: u64,
    pub expire_scanned: u64,
    pub cmd_timeouts: u64,
    pub cmd_latency_us_p50: Option<BucketPercentile>,
    pub cmd_latency_us_p90: Option<BucketPercentile>,
    pub cmd_latency_us_p99: Option<BucketPercentile>,
    pub cmd_latency_hist_log2_us: Vec<u64>,
    pub stats_reports: u64,
    /// Every counter of the latest STATS frame by protocol name.
    pub counters: BTreeMap<String, u64>,
}

/// One second of the driver's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PerSecond {
    pub t_s: u64,
    pub steer_calls: u64,
    pub adds: u64,
    pub mods: u64,
    pub dels: u64,
}

/// One flow at the end of a run, as device and guest saw it (docs/measuring.md).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlowView {
    pub flow: u32,
    /// `udp PARTNER:PORT GUEST:PORT`, the packets the guest receives.
    pub tuple: String,
    pub responses: u64,
    /// RX queue of the flow's last packet (device side).
    pub queue: Option<u16>,
    /// A filter exists for the flow in the device table at the end of the run.
    pub filter: Option<u32>,
    pub filter_queue: Option<u16>,
    /// Seconds from the start of the traffic until the filter was installed (negative:
    /// before the traffic started).
    pub filter_since_s: Option<f64>,
    /// Guest CPU that served the flow's last request (from the echo replies).
    pub app_cpu: Option<u32>,
    /// The CPU the IRQ of `queue` is delivered to (guest's effective affinity).
    pub irq_cpu: Option<u32>,
    /// app_cpu and irq_cpu share a last-level cache (guest's LLC groups).
    pub same_llc: Option<bool>,
    /// How long before the end of sending the flow's requests had all gone through RSS
    /// (no filter hit), in ms; `None` when its last request hit a filter.
    pub via_rss_only_ms: Option<u64>,
    pub stuck_without_filter: bool,
}

/// Why a file is not a report this build can read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{source_name}: cannot read: {err}")]
    Read { source_name: String, err: std::io::Error },
    #[error("{source_name}: not valid JSON: {err}")]
    Json { source_name: String, err: serde_json::Error },
    #[error(
        "{source_name}: no `schema_version`: written before arfsnic's reports were versioned; \
         re-run the scenario with this arfsnic to compare it"
    )]
    NoVersion { source_name: String },
    #[error(
        "{source_name}: schema_version {found}, this arfsnic reads version {SCHEMA_VERSION}; \
         use the arfsnic that wrote it, or re-run the scenario"
    )]
    Version { source_name: String, found: Value },
    #[error("{source_name}: `{path}`: {err}")]
    Shape { source_name: String, path: String, err: String },
}

impl Report {
    /// Parse a report; `source_name` names it in errors (`baseline base.json`). The
    /// version is checked before the shape, so an old report says so instead of naming
    /// the first field that moved.
    pub fn from_json(text: &str, source_name: &str) -> Result<Report, LoadError> {
        let source_name = source_name.to_string();
        let v: Value =
            serde_json::from_str(text).map_err(|err| LoadError::Json { source_name: source_name.clone(), err })?;
        Report::from_value(v, &source_name)
    }

    /// As [`Report::from_json`], from a parsed value.
    pub fn from_value(v: Value, source_name: &str) -> Result<Report, LoadError> {
        let source_name = source_name.to_string();
        match v.get("schema_version") {
            None => return Err(LoadError::NoVersion { source_name }),
            Some(x) if x.as_u64() == Some(u64::from(SCHEMA_VERSION)) => {}
            Some(x) => return Err(LoadError::Version { source_name, found: x.clone() }),
        }
        serde_path_to_error::deserialize(v).map_err(|e| LoadError::Shape {
            source_name,
            path: e.path().to_string(),
            err: e.inner().to_string(),
        })
    }

    /// Read a report file; `role` (`baseline`, `report`) and the path name it in errors.
    pub fn load(path: &Path, role: &str) -> Result<Report, LoadError> {
        let source_name = format!("{role} {}", path.display());
        let text =
            std::fs::read_to_string(path).map_err(|err| LoadError::Read { source_name: source_name.clone(), err })?;
        Report::from_json(&text, &source_name)
    }

    pub fn to_json_pretty(&self) -> String {
        // Plain data (strings, numbers, maps with string keys): serialisation cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// The report without its per-flow records (`link.per_flow`, `flows`, the guest
    /// workload's `flows`): what a committed results file needs for the tables, a tenth
    /// or less of the size with hundreds of flows.
    pub fn without_per_flow(mut self) -> Report {
        for r in &mut self.runs {
            r.link.per_flow.clear();
            r.flows.clear();
            if let Some(w) = r.guest.system.other.get_mut("workload").and_then(Value::as_object_mut) {
                w.remove("flows");
            }
        }
        self
    }
}

impl RunReport {
    /// The driver's counters, when the guest module ran.
    pub fn driver(&self) -> Option<&DriverReport> {
        self.guest.driver.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The funccount comparison: counts over the bracket, relative differences, and
    /// nothing when a side is missing or the reference is zero.
    #[test]
    fn funccount_against_the_module_and_softnet() {
        let f: FuncCount = serde_json::from_value(serde_json::json!({
            "function": "arfs_rx_flow_steer", "per_interval": [100, 200, 190], "total": 490,
            "module_steer_calls_before": 10, "module_steer_calls_after": 510, "attach_s": 21.5,
            "total_exact": 495, "rps_trigger_softirq_exact": 1010,
            "softnet_received_rps_before": 0, "softnet_received_rps_after": 1000
        }))
        .unwrap();
        assert_eq!(f.module_calls(), Some(500));
        assert_eq!(f.disagreement_pct(), Some(1.0));
        assert_eq!(f.interval_loss_pct(), Some(2.0));
        assert_eq!(f.softnet_rps(), Some(1000));
        assert_eq!(f.rps_disagreement_pct(), Some(1.0));
        // A guest without the counters (older init, no module): no numbers, no panic.
        let bare: FuncCount =
            serde_json::from_value(serde_json::json!({"function": "f", "total": 3, "module_steer_calls_before": null,
                "module_steer_calls_after": 7}))
            .unwrap();
        assert_eq!((bare.module_calls(), bare.disagreement_pct(), bare.rps_disagreement_pct()), (None, None, None));
        // A counter that went backwards (module reloaded) is no count.
        let back = FuncCount { module_steer_calls_before: Some(9), module_steer_calls_after: Some(3), ..f.clone() };
        assert_eq!((back.module_calls(), back.interval_loss_pct()), (None, None));
        let zero = FuncCount { module_steer_calls_before: Some(3), module_steer_calls_after: Some(3), ..f };
        assert_eq!((zero.module_calls(), zero.disagreement_pct()), (Some(0), None));
    }

    const EXAMPLE: &str = include_str!("../../tests/data/report-v1.json");

    /// The committed example (a real `steer` scenario report on Debian 6.12, trimmed to
    /// four flows, log paths made relative) parses and writes back to the same value.
    #[test]
    fn example_report_round_trips() {
        let r = Report::from_json(EXAMPLE, "example").unwrap();
        assert_eq!(r.schema_version, SCHEMA_VERSION);
        assert_eq!(r.runs.len(), 1);
        let back: Value = serde_json::from_str(&r.to_json_pretty()).unwrap();
        let orig: Value = serde_json::from_str(EXAMPLE).unwrap();
        assert_eq!(back, orig);
        let r2 = Report::from_value(back, "again").unwrap();
        assert_eq!(r, r2);
        assert!(r.runs[0].driver().is_some_and(|d| d.steer_calls_per_s.is_some()));
    }

    #[test]
    fn other_versions_are_refused_by_name() {
        let mut v: Value = serde_json::from_str(EXAMPLE).unwrap();
        v["schema_version"] = 99.into();
        let e = Report::from_value(v.clone(), "baseline b.json").unwrap_err().to_string();
        assert!(e.contains("baseline b.json: schema_version 99, this arfsnic reads version 1"), "{e}");
        v.as_object_mut().unwrap().remove("schema_version");
        let e = Report::from_value(v, "old.json").unwrap_err().to_string();
        assert!(e.starts_with("old.json: no `schema_version`"), "{e}");
    }

    #[test]
    fn a_broken_field_is_named_with_its_path() {
        let mut v: Value = serde_json::from_str(EXAMPLE).unwrap();
        v["runs"][0]["link"]["responses"] = "many".into();
        let e = Report::from_value(v, "r.json").unwrap_err().to_string();
        assert!(e.starts_with("r.json: `runs[0].link.responses`: invalid type"), "{e}");
    }

    /// Every committed report (docs/results/**) loads with this build's schema, the ones
    /// made before the backend was sampled without its fields, and writes back unchanged.
    #[test]
    fn committed_reports_load_with_or_without_the_backend_cost() {
        fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "json") {
                    out.push(p);
                }
            }
        }
        let mut files = Vec::new();
        walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/results"), &mut files);
        assert!(files.len() >= 20, "{files:?}");
        let mut hosts = 0;
        for f in files {
            let r = Report::load(&f, "committed report").unwrap_or_else(|e| panic!("{e}"));
            let again = Report::from_json(&r.to_json_pretty(), "rewritten").unwrap();
            assert_eq!(again, r, "{}", f.display());
            hosts += r.runs.iter().filter(|x| x.host.is_some()).count();
        }
        assert!(hosts > 0);
        let h = HostReport {
            vcpu_cpu_pct: Some(180.0),
            backend_cpu_ms: Some(10.0),
            backend_cpu_pct: Some(2.0),
            backend_threads: vec![ThreadGroup { name: "vhost-w".into(), threads: 2, cpu_ms: 7.0, cpu_pct: Some(1.4) }],
            backend_frames: Some(20_000),
            backend_ns_per_frame: Some(500.0),
            ..Default::default()
        };
        let back: HostReport = serde_json::from_str(&serde_json::to_string(&h).unwrap()).unwrap();
        assert_eq!(back, h);
        let old: HostReport = serde_json::from_str(
            r#"{"host_cores": 2, "window_s": 8.0, "vcpu_threads": [], "vcpu_wait_pct": 1.0, "host_cpu_busy_pct": 50.0}"#,
        )
        .unwrap();
        assert_eq!((old.backend_cpu_pct, old.backend_frames, old.backend_threads.len()), (None, None, 0));
    }
}
