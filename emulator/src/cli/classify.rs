//! `arfsnic classify`: one flow through the NIC model.

use crate::model::filter::{Action, FilterTable};
use crate::model::nic::Nic;
use crate::model::profile::{load_toml, Profile};
use crate::model::rss::Rss;
use crate::wire::{FlowKey, PacketInfo};
use anyhow::{bail, Context};
use clap::Args;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct ClassifyArgs {
    /// NIC profile (TOML), e.g. configs/mlx5-cx6.toml.
    #[arg(long)]
    pub profile: PathBuf,
    /// The flow as "PROTO SRC:PORT DST:PORT" (tcp or udp; IPv6 as [addr]:port), as the
    /// NIC receives it.
    #[arg(long)]
    pub flow: String,
    /// Toeplitz key in hex (>= 40 bytes); overrides the profile.
    #[arg(long, value_name = "HEX")]
    pub key: Option<String>,
    /// Indirection table size (power of two); overrides the profile.
    #[arg(long, value_name = "N")]
    pub indir_size: Option<usize>,
    /// Number of RX queues; default: the profile's device.queues.
    #[arg(long, value_name = "N")]
    pub queues: Option<u16>,
    /// A rules file (TOML, [[rule]] id, flow, queue or drop) installed before classifying.
    #[arg(long, value_name = "FILE")]
    pub rules: Option<PathBuf>,
    /// Print JSON instead of the text line.
    #[arg(long)]
    pub json: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RulesFile {
    #[serde(default)]
    rule: Vec<RuleSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleSpec {
    id: u32,
    flow: String,
    #[serde(default)]
    queue: Option<u16>,
    #[serde(default)]
    drop: bool,
}

/// Install the rules of a rules file into `table`.
pub fn load_rules(path: &Path, table: &FilterTable, queues: u16) -> anyhow::Result<usize> {
    let f: RulesFile = load_toml(path)?;
    for (i, r) in f.rule.iter().enumerate() {
        let at = |field: &str| format!("{}: field `rule[{i}].{field}`", path.display());
        let key: FlowKey = r.flow.parse().with_context(|| at("flow"))?;
        let action = match (r.queue, r.drop) {
            (Some(q), false) if q < queues => Action::Queue(q),
            (Some(q), false) => bail!("{}: queue {q} does not exist ({queues} queues)", at("queue")),
            (None, true) => Action::Drop,
            _ => bail!("{}: give exactly one of `queue = N` or `drop = true`", at("queue")),
        };
        table.insert(r.id, key, action, 0).with_context(|| at("id"))?;
    }
    Ok(f.rule.len())
}

pub fn run(a: &ClassifyArgs) -> anyhow::Result<()> {
    let profile = Profile::load(&a.profile)?;
    let key_hex = a.key.clone().unwrap_or_else(|| profile.rss.key.clone());
    let key = hex::decode(key_hex.replace([':', ' '], "")).context("--key: not a hex string")?;
    let indir = a.indir_size.unwrap_or(profile.rss.indirection_size);
    let queues = a.queues.unwrap_or(profile.device.queues);
    let types = profile.hash_types()?;
    let rss = Rss::new(&key, types, indir, queues).map_err(|e| {
        let flag = match e {
            crate::model::rss::RssError::KeyLength(_) => "--key",
            crate::model::rss::RssError::IndirSize(_) => "--indir-size",
            _ => "--queues",
        };
        anyhow::anyhow!("{flag}: {e}")
    })?;
    let table = Arc::new(FilterTable::new(profile.filter.layout, profile.filter.capacity));
    if let Some(r) = &a.rules {
        load_rules(r, &table, queues)?;
    }
    let flow: FlowKey = a.flow.parse().context("--flow")?;
    let nic = Nic::with_parts(rss, table);
    let d = nic.classify(&PacketInfo::from_flow(&flow), 0, 0);
    let hash = d.rss.hash.map(|h| format!("{:#010x}", h.0)).unwrap_or_else(|| "none".into());
    let slot = d.rss.slot.map_or("none".to_string(), |s| s.to_string());
    let queue = d.queue.map_or("drop".to_string(), |q| q.to_string());
    if a.json {
        let v = serde_json::json!({
            "flow": flow.to_string(),
            "hash": d.rss.hash.map(|h| format!("{:#010x}", h.0)),
            "hash_type": d.rss.hash.map(|h| h.1.name()),
            "slot": d.rss.slot,
            "queue": d.queue,
            "action": if d.queue.is_some() { "queue" } else { "drop" },
            "rss_queue": d.rss.queue,
            "filter": d.filter,
            "queues": queues,
            "indirection_size": indir,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        let mut line = format!("hash={hash} slot={slot} queue={queue}");
        if let Some(id) = d.filter {
            line.push_str(&format!(" filter={id}"));
        }
        println!("{line}");
    }
    Ok(())
}
