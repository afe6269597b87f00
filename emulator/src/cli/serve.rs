//! `arfsnic serve`: the emulated NIC on a vhost-user socket, for a hand-launched QEMU.

use crate::device::clock::Clock;
use crate::device::EmulatedNic;
use crate::model::nic::Nic;
use crate::model::profile::Profile;
use crate::vhost::{Backend, ServeConfig};
use crate::wire::MacAddr;
use anyhow::{anyhow, Context};
use clap::Args;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

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
    /// Stop after serving this many QEMU connections (default: run until killed).
    #[arg(long)]
    pub connections: Option<u64>,
}

fn parse_mode(s: &str) -> Result<u32, String> {
    match u32::from_str_radix(s.trim_start_matches("0o"), 8) {
        Ok(m) if m <= 0o777 => Ok(m),
        _ => Err(format!("{s:?} is not an octal mode between 000 and 777 (e.g. 600, 660)")),
    }
}

pub fn run(a: &ServeArgs) -> anyhow::Result<()> {
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
    let backend = Backend::new(cfg, emu.clone()).with_context(|| format!("--socket {}", a.socket.display()))?;
    emu.attach_rx(Arc::new(backend.rx_port()));
    let ctl = crate::device::control::ControlRuntime::attach(
        &profile,
        &emu,
        queues,
        crate::device::control::Schedule::FromStart,
    )
    .context("starting the control plane")?;
    if let Some(m) = cfg_mac {
        ctl.set_guest_mac(m);
    }
    if let Some(tap) = &a.tap {
        let peer = crate::traffic::tap::TapPeer::open(tap, queues).with_context(|| format!("--tap {tap}"))?;
        peer.start(emu.clone()).with_context(|| format!("--tap {tap}"))?;
        emu.set_peer(Some(peer));
    }
    log::info!(
        "serving profile {:?} with {queues} queue pairs on {} ({})",
        profile.name,
        a.socket.display(),
        if a.tap.is_some() { "tap" } else { "no traffic source: frames from the guest are counted and dropped" }
    );
    // `serve` ends after --connections frontends or when killed; nothing else stops it.
    let never = AtomicBool::new(false);
    let mut served = 0u64;
    loop {
        if backend.serve_one(&never)? {
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
                emu.counters.rx_spoofed_dropped.load(std::sync::atomic::Ordering::Relaxed)
            );
        }
        if a.connections.is_some_and(|n| served >= n) {
            return Ok(());
        }
    }
}
