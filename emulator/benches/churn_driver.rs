//! Churn driver shared by `benches/churn.rs` (1 M flows, printed) and `tests/bounds.rs`
//! (CI-sized, asserted): distinct UDP flows, one after another, go through the NIC's
//! classify and, the way aRFS drives a device, an ADD per new flow, with the oldest rule
//! deleted once the table is 90 % full (the driver's expiry). Device time advances by a
//! fixed step per flow (healthy or overloaded engine).

use arfsnic::model::engine::{Command, Engine, Output};
use arfsnic::model::filter::Action;
use arfsnic::model::nic::Nic;
use arfsnic::model::profile::Profile;
use arfsnic::wire::{FlowKey, L4Proto, PacketInfo};
use std::collections::VecDeque;
use std::path::Path;

/// One checkpoint of the churn.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub flows: u64,
    pub rules: usize,
    pub pending: usize,
    pub vm_rss_kb: u64,
    pub adds_rejected: u64,
}

pub fn vm_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Device time between two new flows: 10 000 new flows/s, which the mlx5-cx6 engine
/// keeps up with; 1 µs overloads it (queue at its depth, ADDs refused with EBUSY).
pub const HEALTHY_STEP_NS: u64 = 100_000;
pub const OVERLOAD_STEP_NS: u64 = 1_000;

fn key(i: u64) -> FlowKey {
    let ip = [10, (i >> 16) as u8, (i >> 8) as u8, i as u8];
    FlowKey::v4(L4Proto::Udp, ip, 1024 + (i >> 24) as u16, [10, 99, 0, 2], 7000)
}

/// The profile (repository-relative path), its capacity and queue depth.
pub fn profile(root: &Path) -> Profile {
    Profile::load(&root.join("configs/mlx5-cx6.toml")).expect("configs/mlx5-cx6.toml")
}

/// Run `flows` distinct flows, one every `step_ns` of device time; every `every` flows,
/// push a [`Sample`].
pub fn churn(p: &Profile, flows: u64, every: u64, step_ns: u64) -> Vec<Sample> {
    let queues = 4u16;
    let nic = Nic::new(p, queues).expect("NIC");
    let mut engine = Engine::new(p, nic.table().clone(), 0);
    let high = p.filter.capacity * 9 / 10;
    let mut live: VecDeque<u32> = VecDeque::with_capacity(p.filter.capacity);
    let mut out: Vec<Output> = Vec::new();
    let mut samples = Vec::new();
    let mut rejected = 0u64;
    for i in 0..flows {
        let now = i * step_ns;
        let k = key(i);
        let d = nic.classify(&PacketInfo::from_flow(&k), 64, now);
        std::hint::black_box(d);
        let id = i as u32;
        out.clear();
        engine.submit(
            i,
            Command::Add { id, key: k, action: Action::Queue((i % u64::from(queues)) as u16) },
            now,
            &mut out,
        );
        live.push_back(id);
        if live.len() > high {
            if let Some(old) = live.pop_front() {
                engine.submit(u64::MAX - i, Command::Del { id: old }, now, &mut out);
            }
        }
        rejected += out
            .iter()
            .filter(|o| matches!(o, Output::Completion(c) if c.status != 0 && c.op == arfsnic::model::engine::Op::Add))
            .count() as u64;
        if (i + 1) % every == 0 {
            engine.advance(now, &mut out);
            let s = engine.stats();
            samples.push(Sample {
                flows: i + 1,
                rules: nic.table().len(),
                pending: s.queue_depth_now,
                vm_rss_kb: vm_rss_kb(),
                adds_rejected: rejected,
            });
        }
    }
    samples
}
