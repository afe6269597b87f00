//! `arfsnic serve`: the emulated NIC on a vhost-user socket, for a hand-launched QEMU.

use crate::device::clock::Clock;
use crate::device::ControlRuntime;
use crate::device::EmulatedNic;
use crate::model::nic::Nic;
use crate::model::profile::Profile;
use crate::runner::Interrupt;
use crate::traffic::pktgen::Pktgen;
use crate::vhost::{Backend, ServeConfig};
use crate::wire::MacAddr;
use anyhow::{anyhow, Context};
use clap::Args;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PktgenDir {
    Both,
    Tx,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// vhost-user socket path to create (QEMU: -chardev socket,path=PATH). Only a stale
    /// socket there (nothing listening) is replaced; anything else is an error.
    #[arg(long)]
    pub socket: PathBuf,
    /// Permission bits of the socket, octal (default 600: only its owner may connect).
    #[arg(long, value_name = "OCTAL", value_parser = parse_mode)]
    pub socket_mode: Option<u32>,
    /// Group of the socket, name or number (with --socket-mode 660 its members may connect).
    #[arg(long, value_name = "GROUP")]
    pub socket_group: Option<String>,
    /// NIC profile (TOML), e.g. configs/mlx5-cx6.toml.
    #[arg(long)]
    pub profile: PathBuf,
    /// Queue pairs (default: the profile's device.queues). QEMU's queues= must match.
    #[arg(long)]
    pub queues: Option<u16>,
    /// The guest's MAC (QEMU's mac=): device-initiated control events are addressed to it.
    #[arg(long)]
    pub mac: Option<String>,
    /// Worker threads (default: one per queue pair).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Connect the wire to this host tap device (multiqueue, vnet header) instead of the
    /// built-in link partner.
    #[arg(long)]
    pub tap: Option<String>,
    /// Throughput mode: instead of a link partner, offer UDP frames of BYTES bytes (60..=9018,
    /// no FCS) from 1024 flows, a quarter of them steered by ntuple filters, to the RX queues
    /// as fast as the frontend posts buffers (one generator thread per worker thread);
    /// frames from the guest are parsed, classified, counted and dropped. For benchmarks
    /// against a polling frontend (guest-tests/perf/vs-dpdk.sh).
    #[arg(long, value_name = "BYTES", conflicts_with = "tap")]
    pub pktgen: Option<usize>,
    /// With --pktgen: `both` (default), or `tx`: no generator, only classify, count and drop
    /// what the guest sends (so the generator does not compete for the CPU in a guest-TX
    /// benchmark).
    #[arg(long, value_name = "DIR", value_enum, default_value = "both", requires = "pktgen")]
    pub pktgen_dir: PktgenDir,
    /// Stop after serving this many QEMU connections (default: until SIGINT/SIGTERM).
    #[arg(long)]
    pub connections: Option<u64>,
    /// Keep a JSON file of the device's state here, rewritten every 0.5 s and at the end
    /// (docs/security.md lists the fields): device resets, filter table, RSS, counters,
    /// the process's memory, fds and threads.
    #[arg(long, value_name = "FILE")]
    pub stats: Option<PathBuf>,
    /// Serve the device's counters (per-queue packets, filter commands and errors, the
    /// guest driver's steer calls and lock contention) in Prometheus text on
    /// http://ADDR/metrics, e.g. 127.0.0.1:9464 (port 0: any; stderr says which).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
}

/// What `--stats` writes.
#[derive(Serialize, Debug)]
struct ServeStats {
    /// False until `serve` ended on its own (--connections reached); a signal or an
    /// error leaves it false.
    complete: bool,
    /// The signal that stopped `serve`.
    stopped_by: Option<String>,
    pid: u32,
    /// Frontend connections accepted so far.
    connections: u64,
    link_up: bool,
    /// New driver instances (link up after down); each reset the device.
    device_resets: u64,
    enabled_pairs: Vec<bool>,
    /// RSS is the profile's configuration (spread over the enabled pairs).
    rss_default: bool,
    /// The filter table and command engine since the last device reset.
    filter: crate::device::snapshot::FilterSummary,
    /// Control frames since the last device reset.
    control_frames: crate::device::snapshot::FrameCounters,
    /// Since `serve` started: frames the NIC put into each RX queue, frames taken from
    /// each TX queue.
    rx_packets: Vec<u64>,
    tx_frames: Vec<u64>,
    /// Wire-side frames dropped as forged control frames (docs/security.md).
    rx_spoofed_dropped: u64,
    /// Descriptor/ring errors and refused vhost-user requests, since `serve` started.
    desc_errors: u64,
    protocol_errors: u64,
    /// `--pktgen`: frames offered, delivered and dropped towards the guest; frames from the
    /// guest classified.
    #[serde(skip_serializing_if = "Option::is_none")]
    pktgen: Option<crate::traffic::pktgen::PktgenCounters>,
    /// This process, from /proc/self.
    vm_rss_kb: u64,
    fds: u64,
    threads: u64,
}

/// VmRSS (kB), open fds and threads of this process.
fn proc_self() -> (u64, u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let fds = std::fs::read_dir("/proc/self/fd").map(|d| d.count() as u64).unwrap_or(0);
    (field("VmRSS:"), fds, field("Threads:"))
}

/// Write `text` to `path` through a temporary file and a rename (readers never see half).
fn write_atomic(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

fn parse_mode(s: &str) -> Result<u32, String> {
    match u32::from_str_radix(s.trim_start_matches("0o"), 8) {
        Ok(m) if m <= 0o777 => Ok(m),
        _ => Err(format!("{s:?} is not an octal mode between 000 and 777 (e.g. 600, 660)")),
    }
}

fn stats(
    backend: &Backend,
    emu: &EmulatedNic,
    ctl: &ControlRuntime,
    pktgen: Option<&Pktgen>,
    end: Option<(bool, Option<String>)>,
) -> ServeStats {
    let c = backend.counters();
    let n = emu.nic.snapshot();
    let snap = ctl.snapshot();
    let enabled = backend.rx_port().enabled_pairs();
    let (vm_rss_kb, fds, threads) = proc_self();
    let (complete, stopped_by) = end.unwrap_or((false, None));
    ServeStats {
        complete,
        stopped_by,
        pid: std::process::id(),
        connections: c.connections,
        link_up: c.link_up,
        device_resets: emu.counters.device_resets.load(Relaxed),
        rss_default: emu.nic.rss_is_default(&enabled),
        enabled_pairs: enabled,
        filter: snap.filter,
        control_frames: snap.frames,
        rx_packets: n.queues.iter().map(|q| q.rx_packets).collect(),
        tx_frames: c.pairs.iter().map(|p| p.tx_frames).collect(),
        rx_spoofed_dropped: emu.counters.rx_spoofed_dropped.load(Relaxed),
        desc_errors: c.pairs.iter().map(|p| p.desc_errors).sum(),
        protocol_errors: c.protocol_errors,
        pktgen: pktgen.map(Pktgen::counters),
        vm_rss_kb,
        fds,
        threads,
    }
}

fn write_stats(path: &std::path::Path, s: &ServeStats) {
    let text = serde_json::to_string_pretty(s).unwrap_or_default() + "\n";
    if let Err(e) = write_atomic(path, &text) {
        log::warn!("--stats {}: {e}", path.display());
    }
}

pub fn run(a: &ServeArgs, interrupt: &Interrupt) -> anyhow::Result<()> {
    let profile = Profile::load(&a.profile)?;
    let queues = a.queues.unwrap_or(profile.device.queues);
    let nic = Arc::new(Nic::new(&profile, queues).map_err(|e| anyhow!("--queues {queues}: {e}"))?);
    let emu = EmulatedNic::new(nic, Clock::new());
    let mut cfg = ServeConfig::new(&a.socket, queues);
    cfg.threads = a.threads;
    cfg.socket_mode = a.socket_mode;
    cfg.socket_gid = a
        .socket_group
        .as_deref()
        .map(crate::vhost::socket::group_id)
        .transpose()
        .map_err(|e| anyhow!("--socket-group: {e}"))?;
    cfg.mac =
        a.mac.as_deref().map(|m| m.parse::<MacAddr>().map(|m| m.0).map_err(|e| anyhow!("--mac: {e}"))).transpose()?;
    let cfg_mac = cfg.mac;
    if let Some(p) = &a.stats {
        write_atomic(p, "{}\n").map_err(|e| anyhow!("--stats {}: {e}", p.display()))?;
    }
    let backend = Arc::new(Backend::new(cfg, emu.clone()).with_context(|| format!("--socket {}", a.socket.display()))?);
    emu.attach_rx(Arc::new(backend.rx_port()));
    let ctl = ControlRuntime::attach(&profile, &emu, queues, crate::device::control::Schedule::FromStart)
        .context("starting the control plane")?;
    if let Some(m) = cfg_mac {
        ctl.set_guest_mac(m);
    }
    if let Some(tap) = &a.tap {
        let peer = crate::traffic::tap::TapPeer::open(tap, queues).with_context(|| format!("--tap {tap}"))?;
        peer.start(emu.clone()).with_context(|| format!("--tap {tap}"))?;
        emu.set_peer(Some(peer));
    }
    let pktgen = match a.pktgen {
        Some(len) => {
            let threads = a.threads.unwrap_or(usize::from(queues)).clamp(1, usize::from(queues));
            let g = Pktgen::new(emu.clone(), len, threads).map_err(|e| anyhow!("--pktgen {len}: {e}"))?;
            if a.pktgen_dir != PktgenDir::Tx {
                g.start().context("--pktgen")?;
            }
            emu.set_peer(Some(g.clone()));
            Some(g)
        }
        None => None,
    };
    log::info!(
        "serving profile {:?} with {queues} queue pairs on {} ({})",
        profile.name,
        a.socket.display(),
        match (&a.tap, a.pktgen) {
            (Some(_), _) => "tap".to_string(),
            (None, Some(len)) => format!(
                "packet generator: {len}-byte UDP frames from {} flows, 1 in {} steered by a filter; frames from the \
                 guest are classified, counted and dropped",
                crate::traffic::pktgen::FLOWS,
                crate::traffic::pktgen::STEER_EVERY
            ),
            (None, None) => "no traffic source: frames from the guest are counted and dropped".to_string(),
        }
    );
    let _metrics_server = match &a.metrics {
        Some(addr) => {
            let src = crate::runner::metrics::Sources::new(emu.clone(), backend.clone());
            src.set_live(Some((ctl.clone(), None)));
            let srv = crate::runner::metrics::serve(addr, move || src.sample())?;
            eprintln!("arfsnic serve: metrics on http://{}/metrics", srv.addr);
            Some(srv)
        }
        None => None,
    };
    let done = Arc::new(AtomicBool::new(false));
    let writer = a.stats.clone().map(|path| {
        let (b, e, c, d, g) = (backend.clone(), emu.clone(), ctl.clone(), done.clone(), pktgen.clone());
        std::thread::Builder::new().name("arfsnic-stats".into()).spawn(move || {
            while !d.load(Relaxed) {
                write_stats(&path, &stats(&b, &e, &c, g.as_deref(), None));
                std::thread::sleep(Duration::from_millis(500));
            }
        })
    });
    let writer = writer.transpose().context("starting the --stats writer")?;
    // `serve` ends after --connections frontends or at SIGINT/SIGTERM.
    let mut served = 0u64;
    let result = loop {
        match backend.serve_one(&interrupt.stop) {
            Ok(true) => {}
            Ok(false) => break Ok(()),
            Err(e) => break Err(anyhow::Error::from(e)),
        }
        served += 1;
        let c = backend.counters();
        let n = emu.nic.snapshot();
        let f = ctl.snapshot().filter;
        log::info!(
            "frontend {served} disconnected: tx {:?} rx {:?}; filters: {} adds, {} mods, {} dels, rejects {:?}, {} live; \
             wire frames dropped as spoofed control frames: {}",
            c.pairs.iter().map(|p| p.tx_frames).collect::<Vec<_>>(),
            n.queues.iter().map(|q| q.rx_packets).collect::<Vec<_>>(),
            f.adds,
            f.mods,
            f.dels,
            f.rejects,
            f.rules_now,
            emu.counters.rx_spoofed_dropped.load(Relaxed)
        );
        if interrupt.requested() || a.connections.is_some_and(|n| served >= n) {
            break Ok(());
        }
    };
    done.store(true, Relaxed);
    if let Some(w) = writer {
        let _ = w.join();
    }
    let stopped_by = interrupt.requested().then(|| interrupt.signal_name());
    if let Some(sig) = &stopped_by {
        log::info!("{sig}: stopping; {served} frontend(s) served");
    }
    if let Some(p) = &a.stats {
        let complete = result.is_ok() && stopped_by.is_none();
        write_stats(p, &stats(&backend, &emu, &ctl, pktgen.as_deref(), Some((complete, stopped_by))));
    }
    if let Some(g) = &pktgen {
        g.stop();
        log::info!("pktgen: {:?}", g.counters());
    }
    emu.set_peer(None);
    emu.set_control(None);
    ctl.shutdown();
    // The last reference: dropping the backend stops its workers and removes the socket.
    drop(backend);
    result
}
