//! One run of a scenario: boot the guest on the shared backend, offer the traffic when
//! the workload is ready, collect the guest's JSON block and the device's counters, and
//! build the run's part of the typed report.

use super::occupancy::{Occupancy, SAMPLE_EVERY};
use super::scenario::{self, Run, Scenario};
use super::{
    flows, health, hoststat, qemu, resolve_profile, Ctx, GUEST_BASE_PORT, GUEST_IP, GUEST_IP6, GUEST_MAC, GUEST_TAIL_S,
    PARTNER_BASE_PORT, PARTNER_IP, REMOTE_IP, REMOTE_IP6, REMOTE_MAC,
};
use crate::device::control::{ControlRuntime, Schedule};
use crate::device::snapshot::ControlSnapshot;
use crate::device::EmulatedNic;
use crate::model::nic::NicSnapshot;
use crate::model::profile::Profile;
use crate::report::schema::{
    ControlReport, DeviceReport, DriverReport, FilterReport, GuestReport, GuestSystem, OfferedLoad, PerSecond, RunLogs,
    RunReport,
};
use crate::traffic::partner::{LinkPartner, LoopMode, PartnerConfig, Proto, TcpClose, TcpPattern};
use crate::traffic::remote::{RemotePort, Segment};
use crate::vhost::{Backend, BackendCounters};
use anyhow::{anyhow, bail, Context};
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest guest JSON block accepted (docs/security.md): the guest controls its size.
pub const MAX_GUEST_JSON: usize = 16 << 20;

/// The guest module's rule table in debugfs, and its last expired rules.
pub const RULES_DEBUGFS: &str = "/sys/kernel/debug/arfs_virtio/rules";
pub const EXPIRED_DEBUGFS: &str = "/sys/kernel/debug/arfs_virtio/expired";
pub const WORK_DELAYS_DEBUGFS: &str = "/sys/kernel/debug/arfs_virtio/work_delays";

fn append_line(s: &Scenario, run: &Run) -> String {
    let g = &s.guest;
    let sysctls: Vec<String> = s.sysctls_for(run).iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut a = vec![
        "console=ttyS0".to_string(),
        "loglevel=4".into(),
        "panic=-1".into(),
        format!("arfs.ip={GUEST_IP}/24"),
        format!("arfs.peer={PARTNER_IP}"),
        format!("arfs.flows={}", s.traffic.flows),
        format!("arfs.base_port={GUEST_BASE_PORT}"),
        format!("arfs.peer_base_port={PARTNER_BASE_PORT}"),
        format!("arfs.workers={}", g.workers),
        format!("arfs.pattern={}", g.pattern),
        format!("arfs.period_ms={}", g.period_ms),
        // The echo server outlives the offered load by GUEST_TAIL_S, so the last requests
        // (and the console's lag in reporting `ready`) never meet a closed socket.
        format!("arfs.duration={}", s.duration_s + GUEST_TAIL_S),
        format!("arfs.rps_sock_flow_entries={}", g.rps_sock_flow_entries),
        format!("arfs.rps_flow_cnt={}", s.rps_flow_cnt_for(run)),
    ];
    if !sysctls.is_empty() {
        a.push(format!("arfs.sysctl={}", sysctls.join(",")));
    }
    if g.proto == "tcp" {
        a.push("arfs.proto=tcp".into());
        a.push(format!("arfs.msg_size={}", s.traffic.payload));
        let mode = if s.traffic.pattern == "stream" { "sink" } else { "echo" };
        a.push(format!("arfs.tcp_mode={mode}"));
        // Every socket of a CRR run may be connected at once.
        a.push(format!("arfs.max_conns={}", s.traffic.flows.max(64)));
    }
    if s.vm.guest == "debian" {
        a.push("arfs.root=/dev/vda".into());
    }
    if s.vm.remote {
        a.push(format!("arfs.remote={REMOTE_MAC}"));
        a.push(format!("arfs.remote_ip={REMOTE_IP}/24"));
        a.push(format!("arfs.ip6={GUEST_IP6}/64"));
        a.push(format!("arfs.remote_ip6={REMOTE_IP6}/64"));
    }
    if let Some(f) = &g.funccount {
        a.push(format!("arfs.funccount={f}"));
    }
    if g.module {
        // The driver's rule table at the end and the rules expiry removed (filter id,
        // 5-tuple, queue, flow_id): which flows shared an rps_dev_flow slot in this boot,
        // for model mode's fidelity check (docs/model.md), and how late its works ran
        // over the run, which the twin replays. In the guest JSON, `files`.
        a.push(format!("arfs.dump={RULES_DEBUGFS},{EXPIRED_DEBUGFS},{WORK_DELAYS_DEBUGFS}"));
        a.push("arfs.modarg=arfs_virtio.irqs=@INPUT_IRQS@".into());
        a.push("arfs.modarg=arfs_virtio.ifname=@IFNAME@".into());
        for (k, v) in &g.module_params {
            a.push(format!("arfs.modarg=arfs_virtio.{k}={v}"));
        }
        if let Some(t) = g.rmmod_at_s {
            a.push(format!("arfs.rmmod_at={t}"));
        }
        if let Some(t) = g.expire_after_load_s {
            a.push(format!("arfs.expire_wait={t}"));
        }
    }
    a.join(" ")
}

pub(super) fn partner_config(s: &Scenario) -> PartnerConfig {
    PartnerConfig {
        partner_ipv4: PARTNER_IP,
        guest_ipv4: GUEST_IP,
        flows: s.traffic.flows,
        guest_base_port: GUEST_BASE_PORT,
        partner_base_port: PARTNER_BASE_PORT,
        rate_pps: u64::from(s.traffic.rate_pps),
        payload: s.traffic.payload,
        mode: match s.traffic.mode {
            scenario::LoopMode::Closed => LoopMode::Closed,
            scenario::LoopMode::Open => LoopMode::Open,
        },
        window: s.traffic.window,
        drain_ms: 500,
        proto: if s.guest.proto == "tcp" { Proto::Tcp } else { Proto::Udp },
        tcp_pattern: match s.traffic.pattern.as_str() {
            "crr" => TcpPattern::Crr,
            "stream" => TcpPattern::Stream,
            _ => TcpPattern::Rr,
        },
        tcp_ports: s.traffic.ports,
        tcp_close: if s.traffic.close == "rst" { TcpClose::Rst } else { TcpClose::Fin },
        ..PartnerConfig::default()
    }
}

/// Per-queue differences of two snapshots (the rest of the device report is filled in
/// by the caller).
fn nic_delta(a: &NicSnapshot, b: &NicSnapshot) -> DeviceReport {
    let q = |f: &dyn Fn(&crate::model::nic::QueueSnapshot) -> u64| -> Vec<u64> {
        b.queues.iter().zip(&a.queues).map(|(y, x)| f(y) - f(x)).collect()
    };
    DeviceReport {
        rx_packets_per_queue: q(&|s| s.rx_packets),
        rss_delivered_per_queue: q(&|s| s.rss_delivered),
        filter_delivered_per_queue: q(&|s| s.filter_delivered),
        control_delivered_per_queue: q(&|s| s.control_delivered),
        rx_dropped_no_buffer_per_queue: q(&|s| s.dropped_no_buffer),
        rss_delivered: q(&|s| s.rss_delivered).iter().sum::<u64>(),
        filter_delivered: q(&|s| s.filter_delivered).iter().sum::<u64>(),
        rx_dropped_no_buffer: q(&|s| s.dropped_no_buffer).iter().sum::<u64>(),
        dropped_by_filter: q(&|s| s.dropped_by_filter).iter().sum::<u64>(),
        malformed: b.malformed - a.malformed,
        ..DeviceReport::default()
    }
}

fn tx_delta(a: &BackendCounters, b: &BackendCounters) -> Vec<u64> {
    b.pairs.iter().zip(&a.pairs).map(|(y, x)| y.tx_frames - x.tx_frames).collect()
}

/// Frames the backend wrote into the guest's RX vrings plus frames it took from the TX
/// vrings, all queue pairs, so far.
fn frames_moved(c: &BackendCounters) -> u64 {
    c.pairs.iter().map(|p| p.rx_frames + p.tx_frames).sum()
}

fn phase(ctx: &Ctx, msg: impl Into<std::borrow::Cow<'static, str>>) {
    ctx.progress.set_message(msg);
}

/// The progress line during the traffic: elapsed time, the steer rate the driver's
/// latest STATS frames give, and the replies per second, refreshed once a second.
#[derive(Default)]
struct LiveRate {
    last: Option<(Instant, u64, u64)>,
}

impl LiveRate {
    fn tick(
        &mut self,
        ctx: &Ctx,
        what: &str,
        elapsed: Duration,
        total: Duration,
        ctl: &ControlRuntime,
        p: &LinkPartner,
    ) {
        let now = Instant::now();
        if self.last.is_some_and(|(t, _, _)| now.duration_since(t) < Duration::from_secs(1)) {
            return;
        }
        let steer = ctl.guest_counter(crate::wire::control::counter::STEER_CALLS).map_or(0, |(v, _)| v);
        let replies = p.stats().responses;
        let rates = self.last.map(|(t, s0, r0)| {
            let dt = now.duration_since(t).as_secs_f64().max(1e-3);
            (steer.saturating_sub(s0) as f64 / dt, replies.saturating_sub(r0) as f64 / dt)
        });
        self.last = Some((now, steer, replies));
        let shown = rates.map_or_else(String::new, |(sc, rr)| format!(", Steer-C/s {sc:.0}, replies/s {rr:.0}"));
        phase(ctx, format!("{what}: traffic {:.0}/{:.0} s{shown}", elapsed.as_secs_f64(), total.as_secs_f64()));
    }
}

fn fail_with_tail(q: &qemu::QemuProcess, what: &str) -> anyhow::Error {
    anyhow!(
        "{what}\n--- last serial lines ({}):\n{}\n--- QEMU stderr:\n{}",
        q.serial_log.display(),
        q.serial_tail(25),
        q.stderr_text().lines().rev().take(10).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    )
}

/// How often a run may boot its guest: one more boot after a boot failure.
/// Shortest warm-up whose first half is a load probe.
const PROBE_MIN_WARMUP_S: f64 = 1.0;
/// A guest that answers at least this share of the offered rate in the probe keeps it.
const PROBE_KEEP_SHARE: f64 = 0.95;
/// A guest that does not gets this share of what it answered.
const PROBE_SAFE_SHARE: f64 = 0.5;

/// The load probe (first half of the warm-up, at the scenario's rate): keep the rate when
/// the guest answers it, else offer half of what it answered from now on.
fn fit_load(partner: &LinkPartner, load: &mut OfferedLoad, probe_s: f64) {
    let st = partner.stats();
    fit_decision(load, st.requests, st.responses, probe_s);
    if load.chosen_pps != load.requested_pps {
        let _ = partner.set_rate(load.chosen_pps);
    }
}

/// What the probe's counts mean for the rate (`load.chosen_pps`, `probed_pps`, `reason`).
fn fit_decision(load: &mut OfferedLoad, requests: u64, responses: u64, probe_s: f64) {
    let answered = responses as f64 / probe_s;
    let offered = requests as f64 / probe_s;
    load.probed_pps = Some(answered);
    if requests == 0 || answered >= PROBE_KEEP_SHARE * offered {
        load.chosen_pps = load.requested_pps;
        load.reason = format!(
            "probed: the guest answered {answered:.0} of {offered:.0} requests/s in the first {probe_s:.1} s of the warm-up; rate kept"
        );
        return;
    }
    let chosen = ((PROBE_SAFE_SHARE * answered) as u64).max(1);
    load.chosen_pps = chosen;
    load.reason = format!(
        "probed: the guest answered only {answered:.0} of {offered:.0} requests/s in the first {probe_s:.1} s of the warm-up; \
         offering {chosen}/s ({:.0}% of what it answered) for the rest of the run",
        100.0 * PROBE_SAFE_SHARE
    );
}

pub(crate) const BOOT_ATTEMPTS: u32 = 2;

/// The guest never got to `ready`: QEMU died or hung while booting. Nothing was measured
/// yet, so the run may boot again. Seen under TCG on a loaded 2-core host: QEMU 10.0.2
/// aborting in `iotlb_to_section`, and a guest hung in an RCU stall whose vCPU timer
/// never fired. A failure after `ready` (or a guest-reported error) is never retried.
#[derive(Debug)]
pub(crate) struct BootFailed(String);

impl std::fmt::Display for BootFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BootFailed {}

/// `fail_with_tail`, marked as a boot failure (retryable) while the guest was not ready.
fn run_failed(q: &qemu::QemuProcess, booting: bool, what: &str) -> anyhow::Error {
    let e = fail_with_tail(q, what);
    if booting {
        anyhow::Error::new(BootFailed(e.to_string()))
    } else {
        e
    }
}

pub(crate) fn run_one(
    ctx: &Ctx,
    emu: &Arc<EmulatedNic>,
    backend: &Backend,
    run: &Run,
    idx: usize,
    attempt: u32,
) -> anyhow::Result<RunReport> {
    let s = &ctx.scenario;
    let profile_spec = run.profile.clone().unwrap_or_else(|| s.profile.clone());
    let profile_path = resolve_profile(&profile_spec, &ctx.root, &ctx.scenario_dir)?;
    let profile = Profile::load(&profile_path)?;
    emu.nic.table().flush();
    // The profile's [[faults.schedule]] counts from the start of the traffic, not from
    // the guest's boot (whose length depends on the host).
    let ctl =
        ControlRuntime::attach(&profile, emu, s.nic.queues, Schedule::Held).context("starting the control plane")?;
    ctl.set_guest_mac(GUEST_MAC.0);

    let partner = LinkPartner::new(partner_config(s), emu.clone()).map_err(|e| anyhow!("traffic: {e}"))?;
    // With vm.remote the partner shares the wire with the guest's second NIC; the socket
    // directory lives as long as this run.
    let remote = if s.vm.remote { Some(remote_port(emu, &partner)?) } else { None };
    match &remote {
        Some((_, port, _)) => emu.set_peer(Some(Arc::new(Segment { partner: partner.clone(), remote: port.clone() }))),
        None => emu.set_peer(Some(partner.clone())),
    }
    if let Some(m) = &ctx.metrics {
        m.set_live(Some((ctl.clone(), Some(partner.clone()))));
    }
    let nic0 = emu.nic.snapshot();
    let be0 = backend.counters();
    let spoofed0 = emu.counters.rx_spoofed_dropped.load(std::sync::atomic::Ordering::Relaxed);

    let tag = match attempt {
        1 => format!("{:02}-{}", idx, run.label),
        n => format!("{:02}-{}.try{n}", idx, run.label),
    };
    let spec = qemu::QemuSpec {
        binary: ctx.qemu_bin.clone(),
        accel: ctx.qemu_accel.clone(),
        cpu: s.vm.cpu.clone(),
        vcpus: s.vm.vcpus,
        sockets: s.vm.sockets,
        dies: s.vm.dies,
        cores: s.vm.cores,
        threads: s.vm.threads,
        memory_mb: s.vm.memory_mb,
        l3_per: s.vm.l3_per.clone(),
        socket: ctx.socket.clone(),
        queues: s.nic.queues,
        mac: GUEST_MAC.to_string(),
        kernel: ctx.kernel.image.clone(),
        initrd: ctx.initrd.clone(),
        append: append_line(s, run),
        disk: ctx.disk.clone(),
        remote: remote.as_ref().map(|(nic, _, _)| nic.clone()),
    };
    std::fs::write(ctx.logdir.join(format!("{tag}.qemu-cmdline")), spec.shell_line())?;
    phase(ctx, format!("run {} [{}]: booting the guest", idx + 1, run.label));
    let mut q = qemu::QemuProcess::spawn(&spec, &ctx.logdir, &tag)?;
    let boot_deadline = Instant::now() + Duration::from_secs(s.timeouts.boot_s);
    let mut traffic_started: Option<Instant> = None;
    let mut traffic_stopped = false;
    let mut guest_json = String::new();
    let mut in_json = false;
    let mut got_json = false;
    let traffic_for = Duration::from_secs_f64(s.duration_s);
    let mut finish_deadline: Option<Instant> = None;
    // Device-clock window of the traffic (for rates).
    let mut window = (0u64, 0u64);
    // QEMU's vCPU threads and the backend's threads on the host over the traffic (after
    // the warm-up), with the frames the device moved in the same window.
    let qemu_pid = q.child.id();
    let mut host0: Option<(hoststat::HostSample, Instant)> = None;
    let mut host_report = None;
    let mut load = OfferedLoad { requested_pps: u64::from(s.traffic.rate_pps), ..Default::default() };
    let mut probe_at = None;
    match (s.traffic.mode, s.traffic.rate_pps, s.traffic.pin_rate) {
        (scenario::LoopMode::Closed, _, _) => load.reason = "closed loop: the guest's answers pace the requests".into(),
        (_, _, true) => load.reason = "pinned by the scenario (traffic.pin_rate)".into(),
        _ if s.warmup_s < PROBE_MIN_WARMUP_S => {
            load.reason = format!("not probed: warmup_s {} < {PROBE_MIN_WARMUP_S} s", s.warmup_s)
        }
        _ => probe_at = Some(Duration::from_secs_f64(s.warmup_s / 2.0)),
    }
    load.chosen_pps = load.requested_pps;
    let mut live = LiveRate::default();
    let mut occ = Occupancy::default();
    let mut next_sample = Instant::now();
    loop {
        if ctx.interrupt.requested() {
            // Dropping `q` kills this run's QEMU.
            let _ = partner.stop();
            return Err(super::Interrupted(ctx.interrupt.signal_name()).into());
        }
        if traffic_started.is_none() && Instant::now() > boot_deadline {
            return Err(run_failed(
                &q,
                true,
                &format!("the guest workload was not ready within {} s (timeouts.boot_s)", s.timeouts.boot_s),
            ));
        }
        if traffic_started.is_some() && Instant::now() >= next_sample {
            let now_ns = emu.clock.now_ns();
            occ.sample(now_ns.saturating_sub(window.0) as f64 / 1e9, now_ns, &ctl.rules());
            next_sample = Instant::now() + SAMPLE_EVERY;
        }
        if let Some(t) = traffic_started {
            if let Some(at) = probe_at.filter(|at| t.elapsed() >= *at) {
                probe_at = None;
                fit_load(&partner, &mut load, at.as_secs_f64());
                if load.chosen_pps != load.requested_pps {
                    phase(ctx, format!("run {} [{}]: {}", idx + 1, run.label, load.reason));
                }
            }
            if !traffic_stopped {
                live.tick(ctx, &format!("run {} [{}]", idx + 1, run.label), t.elapsed(), traffic_for, &ctl, &partner);
            }
            if host0.is_none() && t.elapsed().as_secs_f64() >= s.warmup_s {
                host0 = Some((hoststat::HostSample::read(qemu_pid, frames_moved(&backend.counters())), Instant::now()));
            }
            if !traffic_stopped && t.elapsed() >= traffic_for {
                if let Some((h0, t0)) = &host0 {
                    let h1 = hoststat::HostSample::read(qemu_pid, frames_moved(&backend.counters()));
                    host_report = Some(h0.delta(&h1, t0.elapsed().as_secs_f64(), hoststat::host_cores()));
                }
                phase(ctx, format!("run {} [{}]: draining, waiting for the guest report", idx + 1, run.label));
                window.1 = emu.clock.now_ns();
                let _ = partner.stop();
                traffic_stopped = true;
                finish_deadline = Some(Instant::now() + Duration::from_secs(s.timeouts.finish_s));
            }
        }
        if finish_deadline.is_some_and(|d| Instant::now() > d) {
            return Err(fail_with_tail(
                &q,
                &format!(
                    "the guest did not finish within {} s after the traffic (timeouts.finish_s)",
                    s.timeouts.finish_s
                ),
            ));
        }
        match q.lines.recv_timeout(Duration::from_millis(50)) {
            Ok(line) => {
                if line.contains("ARFSNIC-GUEST-ERROR") {
                    let _ = partner.stop();
                    return Err(fail_with_tail(&q, &format!("the guest reported an error: {}", line.trim())));
                }
                if line.contains("ARFSNIC-GUEST-JSON-BEGIN") {
                    in_json = true;
                } else if line.contains("ARFSNIC-GUEST-JSON-END") {
                    in_json = false;
                    got_json = true;
                } else if in_json {
                    if guest_json.len() + line.len() >= MAX_GUEST_JSON {
                        let _ = partner.stop();
                        return Err(fail_with_tail(
                            &q,
                            &format!("the guest's JSON block exceeds {} MiB", MAX_GUEST_JSON >> 20),
                        ));
                    }
                    // No newline between pieces: the reader cuts console lines longer
                    // than MAX_SERIAL_LINE (a 1024-flow report is ~260 KB on one line), and
                    // between JSON tokens a newline is only whitespace.
                    guest_json.push_str(&line);
                } else if line.contains("arfs-echo: ready") && traffic_started.is_none() {
                    partner.start().map_err(|e| anyhow!("traffic: {e}"))?;
                    ctl.arm_schedule();
                    traffic_started = Some(Instant::now());
                    window.0 = emu.clock.now_ns();
                    phase(ctx, format!("run {} [{}]: traffic for {:.0} s", idx + 1, run.label, s.duration_s));
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                if q.stderr_text().contains("falling back on userspace virtio") {
                    return Err(fail_with_tail(&q, "QEMU fell back to in-process virtio: the vhost-user backend sees nothing (guest memory must be a memfd backend with share=on)"));
                }
                if let Ok(Some(st)) = q.child.try_wait() {
                    if !got_json {
                        let _ = partner.stop();
                        let what = format!("QEMU exited ({st}) before the guest printed its report");
                        return Err(run_failed(&q, traffic_started.is_none(), &what));
                    }
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                if !got_json {
                    let _ = partner.stop();
                    let what = "QEMU's console closed before the guest printed its report";
                    return Err(run_failed(&q, traffic_started.is_none(), what));
                }
                break;
            }
        }
    }
    if !traffic_stopped {
        let _ = partner.stop();
    }
    if q.wait_exit(Duration::from_secs(30)).is_none() {
        q.kill();
    }
    emu.set_peer(None);
    if let Some(m) = &ctx.metrics {
        m.set_live(None);
    }
    let remote_port = remote.map(|(_, port, _dir)| {
        port.stop();
        port.stats()
    });
    let snap = ctl.snapshot();
    let rules = ctl.rules();
    let now_ns = emu.clock.now_ns();
    occ.sample(now_ns.saturating_sub(window.0) as f64 / 1e9, now_ns, &rules);
    let warmup_ns = (s.warmup_s * 1e9) as u64;
    let rates = ctl.guest_rates(window.0 + warmup_ns, window.1);
    emu.set_control(None);
    ctl.shutdown();
    let guest: Value = serde_json::from_str(&guest_json)
        .with_context(|| format!("the guest's JSON block does not parse (see {})", q.serial_log.display()))?;
    let nic1 = emu.nic.snapshot();
    let be1 = backend.counters();
    let link = partner.stats();
    if link.responses == 0 {
        let tx: u64 = tx_delta(&be0, &be1).iter().sum();
        let rx: u64 = be1.pairs.iter().zip(&be0.pairs).map(|(b, a)| b.rx_frames - a.rx_frames).sum();
        bail!(
            "no traffic passed: {} requests offered, 0 answered; the backend took {tx} frames from the guest and put {rx} into it. \
             If both are 0, QEMU is not sharing guest memory with the backend (memory-backend-memfd needs share=on); \
             serial log: {}",
            link.requests,
            q.serial_log.display()
        );
    }
    let (misdelivered, compared) = flows::flows_misdelivered(&link, &guest);
    // Guest and device must agree on what each RX queue received.
    let guest_q: Vec<u64> = guest["rx_packets_per_queue"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    let device = DeviceReport {
        tx_packets_per_queue: tx_delta(&be0, &be1),
        flows_misdelivered: misdelivered,
        flows_compared_with_guest: compared,
        rx_spoofed_dropped: emu.counters.rx_spoofed_dropped.load(std::sync::atomic::Ordering::Relaxed) - spoofed0,
        profile: profile.name.clone(),
        rss_contexts: emu.nic.contexts().len() as u64,
        filter: FilterReport { summary: snap.filter.clone(), aged_out: snap.engine.aged_out },
        control: ControlReport {
            frames: snap.frames.clone(),
            engine: snap.engine.clone(),
            partitions: snap.partitions.clone(),
        },
        ..nic_delta(&nic0, &nic1)
    };
    let flows = flows::flow_view(&link, &guest, &rules, window.0);
    let stuck = flows.iter().filter(|f| f.stuck_without_filter).count() as u64;
    let guest_cpu_pct = flows::guest_cpu_pct(&guest);
    // The trade-off columns (docs/measuring.md): RPS IPIs/s and where requests went.
    let rps_ipi_per_s = super::delivery::rps_ipi_per_s(&guest);
    let deliveries = super::delivery::deliveries(&guest);
    let system: GuestSystem = serde_json::from_value(guest)
        .with_context(|| format!("the guest's JSON block has an unexpected shape (see {})", q.serial_log.display()))?;
    let mut report = RunReport {
        label: run.label.clone(),
        sysctls: s.sysctls_for(run),
        duration_s: traffic_started.map(|_| traffic_for.as_secs_f64()),
        profile: profile.name.clone(),
        kernel: None,
        rps_flow_cnt: None,
        link,
        device,
        guest_rx_packets_per_queue: guest_q,
        guest: guest_report(&snap, rates, system, window),
        flows,
        flows_stuck_without_filter: s.guest.module.then_some(stuck),
        filter_table: Some(occ.report()),
        guest_cpu_pct,
        rps_ipi_per_s,
        remote_pct: deliveries.and_then(|d| d.remote_pct()),
        cross_llc_pct: deliveries.and_then(|d| d.cross_llc_pct()),
        rfs_miss_pct: deliveries.and_then(|d| d.rfs_miss_pct()),
        logs: RunLogs { serial: q.serial_log.clone(), qemu_stderr: q.stderr_log.clone() },
        boot_attempts: 0,
        boot_failures: Vec::new(),
        host: host_report,
        health: None,
        offered_load: Some(load),
        discarded: Vec::new(),
        remote_port,
    };
    report.health = Some(health::assess(&report, s.vm.vcpus, &health::LIMITS));
    Ok(report)
}

/// The remote NIC's socket pair in a fresh directory (unix socket paths must stay under
/// 108 bytes, so it is made under the temp dir, not the log dir), its port started.
fn remote_port(
    emu: &Arc<EmulatedNic>,
    partner: &LinkPartner,
) -> anyhow::Result<(qemu::RemoteNic, Arc<RemotePort>, tempfile::TempDir)> {
    let dir = tempfile::Builder::new().prefix("arfsnic-remote-").tempdir().context("vm.remote: socket directory")?;
    let nic = qemu::RemoteNic {
        mac: REMOTE_MAC.to_string(),
        qemu_path: dir.path().join("qemu.sock"),
        backend_path: dir.path().join("nic.sock"),
    };
    if nic.qemu_path.as_os_str().len() >= 100 {
        bail!(
            "vm.remote: socket path {} is too long for a unix socket; set TMPDIR to a shorter directory",
            nic.qemu_path.display()
        );
    }
    let port = Arc::new(
        RemotePort::bind(&nic.backend_path, &nic.qemu_path, REMOTE_MAC)
            .with_context(|| format!("vm.remote: binding {}", nic.backend_path.display()))?,
    );
    port.start(emu.clone(), partner.config().partner_mac).context("vm.remote: starting the port's reader")?;
    Ok((nic, port, dir))
}

/// The report's `guest` object: the driver's counters from its STATS frames (when the
/// guest module ran) and the guest system's own view (`system`).
fn guest_report(
    snap: &ControlSnapshot,
    rates: Option<crate::device::guest::GuestRates>,
    system: GuestSystem,
    (traffic_start_ns, traffic_end_ns): (u64, u64),
) -> GuestReport {
    let driver = snap.guest.as_ref().map(|st| {
        let c = |k: &str| st.counters.get(k).copied().unwrap_or(0);
        let acq = c("lock_acquired");
        DriverReport {
            steer_calls: c("steer_calls"),
            steer_calls_per_s: rates.map(|r| r.steer_calls_per_s),
            adds_per_s: rates.map(|r| r.adds_per_s),
            mods_per_s: rates.map(|r| r.mods_per_s),
            dels_per_s: rates.map(|r| r.dels_per_s),
            lock_contended_pct_window: rates.map(|r| r.lock_contended_pct),
            lock_wait_us_per_s: rates.map(|r| r.lock_wait_us_per_s),
            steer_same_pct_window: rates.and_then(|r| r.steer_same_pct),
            work_delay_ms_mean_window: rates.and_then(|r| r.work_delay_ms_mean),
            rates_window_s: rates.map(|r| r.window_s),
            rates_from_s: rates.map(|r| (r.from_ns as f64 - traffic_start_ns as f64) / 1e9),
            per_second: per_second(&snap.series, traffic_start_ns, traffic_end_ns),
            steer_new: c("steer_new"),
            steer_update: c("steer_update"),
            steer_same: c("steer_same"),
            adds_ok: c("adds_ok"),
            mods_ok: c("mods_ok"),
            dels_ok: c("dels_ok"),
            add_errors: st.add_errors.clone(),
            mod_errors: st.mod_errors.clone(),
            del_errors: st.del_errors.clone(),
            lock_acquired: acq,
            lock_contended: c("lock_contended"),
            lock_contended_pct: if acq > 0 { 100.0 * c("lock_contended") as f64 / acq as f64 } else { 0.0 },
            lock_wait_ns: c("lock_wait_ns_total"),
            lock_wait_ns_max: c("lock_wait_ns_max"),
            rules_now: c("rules_now"),
            rules_peak: c("rules_peak"),
            expire_scans: c("expire_scans"),
            expire_scanned: c("expire_scanned"),
            cmd_timeouts: c("cmd_timeouts"),
            cmd_latency_us_p50: st.lat_us_p50,
            cmd_latency_us_p90: st.lat_us_p90,
            cmd_latency_us_p99: st.lat_us_p99,
            cmd_latency_hist_log2_us: st.lat_hist_us.clone(),
            stats_reports: st.reports,
            counters: st.counters.clone(),
        }
    });
    GuestReport { module: snap.guest.is_some(), system, driver }
}

/// The driver's counters second by second over the traffic (like `funccount -i 1`):
/// for second k, the difference between the last STATS samples at or before
/// start + k s and start + (k+1) s. Seconds without a sample on either side are left out.
pub fn per_second(series: &[crate::device::guest::StatsSample], start_ns: u64, end_ns: u64) -> Vec<PerSecond> {
    let at = |t: u64| series.iter().rev().find(|x| x.t_ns <= t);
    let mut out = Vec::new();
    let mut k = 0u64;
    while start_ns + (k + 1) * 1_000_000_000 <= end_ns + 50_000_000 {
        let (a, b) = (at(start_ns + k * 1_000_000_000), at(start_ns + (k + 1) * 1_000_000_000));
        if let (Some(a), Some(b)) = (a, b) {
            out.push(PerSecond {
                t_s: k + 1,
                steer_calls: b.steer_calls.saturating_sub(a.steer_calls),
                adds: b.adds_ok.saturating_sub(a.adds_ok),
                mods: b.mods_ok.saturating_sub(a.mods_ok),
                dels: b.dels_ok.saturating_sub(a.dels_ok),
            });
        }
        k += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::guest::StatsSample;

    fn sample(t_ms: u64, steer: u64, adds: u64) -> StatsSample {
        StatsSample { t_ns: t_ms * 1_000_000, steer_calls: steer, adds_ok: adds, ..Default::default() }
    }

    #[test]
    fn the_probe_keeps_a_sustained_rate_and_halves_what_an_overloaded_guest_answered() {
        let mut l = OfferedLoad { requested_pps: 2000, ..Default::default() };
        fit_decision(&mut l, 1000, 990, 0.5);
        assert_eq!((l.chosen_pps, l.probed_pps), (2000, Some(1980.0)));
        assert!(
            l.reason.contains("answered 1980 of 2000 requests/s") && l.reason.ends_with("rate kept"),
            "{}",
            l.reason
        );
        fit_decision(&mut l, 1000, 700, 0.5);
        assert_eq!(l.chosen_pps, 700);
        assert!(l.reason.contains("answered only 1400 of 2000") && l.reason.contains("offering 700/s"), "{}", l.reason);
        // Nothing sent yet (no guest MAC learnt): nothing to judge, the rate stays.
        fit_decision(&mut l, 0, 0, 0.5);
        assert_eq!(l.chosen_pps, 2000);
        // A silent guest still gets a rate above 0 (an open loop needs one).
        fit_decision(&mut l, 1000, 0, 0.5);
        assert_eq!(l.chosen_pps, 1);
    }

    #[test]
    fn per_second_differences_of_the_last_samples() {
        // STATS every 100 ms from 0.05 s; traffic from 0 to 3 s.
        let series: Vec<StatsSample> = (0..31).map(|i| sample(50 + i * 100, i * 10, (i / 10).min(2))).collect();
        let v = per_second(&series, 100_000_000, 3_100_000_000);
        let steer: Vec<u64> = v.iter().map(|x| x.steer_calls).collect();
        let adds: Vec<u64> = v.iter().map(|x| x.adds).collect();
        assert_eq!(steer, vec![100, 100, 100]);
        assert_eq!(adds, vec![1, 1, 0]);
        assert_eq!(v[2].t_s, 3);
        // Before the first sample there is nothing to difference.
        assert_eq!(per_second(&series, 0, 1_000_000_000).len(), 0);
        assert!(per_second(&[], 0, 5_000_000_000).is_empty());
    }
}
