//! NIC profiles (`configs/*.toml`): RSS defaults, filter table layout, command engine
//! timing and faults. Unknown fields are rejected; every error names the file and the
//! field (`engine.latency.add.median_us`). Field reference: docs/profiles.md.

use super::errno;
use super::filter::Layout;
use super::latency::LatencySpec;
use super::rss::{HashTypes, Rss, RssError, MAX_KEY_LEN, MICROSOFT_KEY, MIN_KEY_LEN};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub device: DeviceSection,
    #[serde(default)]
    pub rss: RssSection,
    pub filter: FilterSection,
    #[serde(default)]
    pub engine: EngineSection,
    #[serde(default)]
    pub faults: FaultSection,
    #[serde(default)]
    pub aging: AgingSection,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DeviceSection {
    /// Queue pairs the device offers (`serve --queues` overrides).
    #[serde(default = "d_queues")]
    pub queues: u16,
}
fn d_queues() -> u16 {
    4
}
impl Default for DeviceSection {
    fn default() -> Self {
        DeviceSection { queues: d_queues() }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RssSection {
    /// Toeplitz key in hex (>= 40 bytes). Default: the Microsoft verification key.
    #[serde(default = "d_key")]
    pub key: String,
    #[serde(default = "d_indir")]
    pub indirection_size: usize,
    /// Any of ipv4, tcpv4, udpv4, ipv6, tcpv6, udpv6.
    #[serde(default = "d_types")]
    pub hash_types: Vec<String>,
    /// Additional RSS contexts (`ethtool -X … context new`): the exclusive upper bound of
    /// their IDs, as the driver's `rxfh_max_num_contexts` (mlx5 `MLX5E_MAX_NUM_RSS` 16:
    /// contexts 1-15). 0: the device has only its default context.
    #[serde(default)]
    pub max_contexts: u32,
}
fn d_key() -> String {
    hex::encode(MICROSOFT_KEY)
}
fn d_indir() -> usize {
    128
}
fn d_types() -> Vec<String> {
    HashTypes::NAMES.iter().map(|(n, _)| n.to_string()).collect()
}
impl Default for RssSection {
    fn default() -> Self {
        RssSection { key: d_key(), indirection_size: d_indir(), hash_types: d_types(), max_contexts: 0 }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FilterSection {
    pub layout: Layout,
    /// Rules per table (per-type layout) or in the one shared table.
    pub capacity: usize,
    /// What a rule does whose queue the guest disabled (`ethtool -L` to fewer channels).
    #[serde(default)]
    pub disabled_queue: DisabledQueue,
}

/// Where a filter steers packets whose queue the guest disabled.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DisabledQueue {
    /// To that queue, where they are lost (mlx5: the direct TIR of an inactive channel
    /// points at the drop RQ).
    #[default]
    Drop,
    /// To the queue RSS picks among the enabled ones.
    Rss,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Overflow {
    /// A command arriving at a full queue completes at once with EBUSY.
    Reject,
    /// A command arriving at a full queue is dropped silently (the driver times out).
    Drop,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EngineSection {
    /// Commands executing in parallel (1 = a serialised firmware mailbox).
    #[serde(default = "d_slots")]
    pub slots: usize,
    /// Commands that may wait for a slot.
    #[serde(default = "d_depth")]
    pub queue_depth: usize,
    #[serde(default = "d_overflow")]
    pub overflow: Overflow,
    /// ADDs queued or executing at once; more answer EBUSY at once. 0 = no cap.
    #[serde(default)]
    pub max_inflight_adds: usize,
    #[serde(default = "d_seed")]
    pub seed: u64,
    #[serde(default)]
    pub latency: LatencySection,
}
fn d_slots() -> usize {
    1
}
fn d_depth() -> usize {
    1024
}
fn d_overflow() -> Overflow {
    Overflow::Reject
}
fn d_seed() -> u64 {
    1
}
impl Default for EngineSection {
    fn default() -> Self {
        EngineSection {
            slots: d_slots(),
            queue_depth: d_depth(),
            overflow: d_overflow(),
            max_inflight_adds: 0,
            seed: d_seed(),
            latency: LatencySection::default(),
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LatencySection {
    #[serde(default)]
    pub add: LatencySpec,
    #[serde(default, rename = "mod")]
    pub modify: LatencySpec,
    #[serde(default)]
    pub del: LatencySpec,
    #[serde(default)]
    pub flush: LatencySpec,
    #[serde(default)]
    pub query: LatencySpec,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ErrorFault {
    /// Probability in [0, 1] that a command of this kind fails.
    pub rate: f64,
    /// ENOSPC, EPERM, ENOMEM, EIO or EBUSY.
    pub errno: String,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FaultSection {
    /// Start with the engine disabled: every ADD answers EPERM.
    #[serde(default)]
    pub disabled: bool,
    /// Probability that a command executes but its completion is never sent.
    #[serde(default)]
    pub lost_completion_rate: f64,
    #[serde(default)]
    pub add: Option<ErrorFault>,
    #[serde(default, rename = "mod")]
    pub modify: Option<ErrorFault>,
    #[serde(default)]
    pub del: Option<ErrorFault>,
    /// Faults applied at a time after the engine starts.
    #[serde(default)]
    pub schedule: Vec<ScheduledFault>,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ScheduledAction {
    Disable,
    Enable,
    Stall,
    Flush,
    Errors,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ScheduledFault {
    /// Milliseconds after engine start.
    pub at_ms: u64,
    pub action: ScheduledAction,
    /// `stall`: how long.
    #[serde(default)]
    pub ms: Option<u64>,
    /// `errors`: add, mod or del.
    #[serde(default)]
    pub op: Option<String>,
    /// `errors`: new rate (0 turns the fault off).
    #[serde(default)]
    pub rate: Option<f64>,
    /// `errors`: errno name.
    #[serde(default)]
    pub errno: Option<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AgingSection {
    /// Remove a rule idle for this long and emit an event; 0 = no device-side aging.
    #[serde(default)]
    pub idle_ms: u64,
    /// How often the device scans for idle rules.
    #[serde(default = "d_scan")]
    pub scan_ms: u64,
}
fn d_scan() -> u64 {
    100
}
impl Default for AgingSection {
    fn default() -> Self {
        AgingSection { idle_ms: 0, scan_ms: d_scan() }
    }
}

/// A profile error: which file, which field, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: Option<PathBuf>,
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(p) = &self.file {
            write!(f, "{}: ", p.display())?;
        }
        if self.field.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "field `{}`: {}", self.field, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

fn err(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError { file: None, field: field.into(), message: message.into() }
}

/// Deserialize TOML text with field paths in errors (shared with scenarios and rules).
pub fn from_toml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, ConfigError> {
    let de = toml::Deserializer::new(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let line = inner
            .span()
            .map(|s| text.as_bytes()[..s.start.min(text.len())].iter().filter(|&&b| b == b'\n').count() + 1);
        let mut msg = inner.message().to_string();
        if let Some(l) = line {
            msg.push_str(&format!(" (line {l})"));
        }
        err(if path == "." { String::new() } else { path }, msg)
    })
}

/// Read and parse a TOML file, attaching the path to errors.
pub fn load_toml<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: Some(path.to_path_buf()),
        field: String::new(),
        message: format!("cannot read: {e}"),
    })?;
    from_toml(&text).map_err(|e| ConfigError { file: Some(path.to_path_buf()), ..e })
}

impl Profile {
    pub fn load(path: &Path) -> Result<Profile, ConfigError> {
        let p: Profile = load_toml(path)?;
        p.validate().map_err(|e| ConfigError { file: Some(path.to_path_buf()), ..e })?;
        Ok(p)
    }

    pub fn parse(text: &str) -> Result<Profile, ConfigError> {
        let p: Profile = from_toml(text)?;
        p.validate()?;
        Ok(p)
    }

    /// An ideal NIC: no latency, no limits worth hitting.
    pub fn ideal() -> Profile {
        Profile {
            name: "ideal".into(),
            description: String::new(),
            device: DeviceSection::default(),
            rss: RssSection::default(),
            filter: FilterSection { layout: Layout::Shared, capacity: 1 << 20, disabled_queue: DisabledQueue::Rss },
            engine: EngineSection { slots: 64, queue_depth: 1 << 16, ..Default::default() },
            faults: FaultSection::default(),
            aging: AgingSection::default(),
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.name.trim().is_empty() {
            return Err(err("name", "must not be empty"));
        }
        if self.device.queues == 0 || self.device.queues > 256 {
            return Err(err("device.queues", "must be between 1 and 256"));
        }
        let key = self.rss_key()?;
        if !(MIN_KEY_LEN..=MAX_KEY_LEN).contains(&key.len()) {
            return Err(err("rss.key", format!("is {} bytes; needs {MIN_KEY_LEN} to {MAX_KEY_LEN}", key.len())));
        }
        let n = self.rss.indirection_size;
        if !n.is_power_of_two() || n > 65536 {
            return Err(err("rss.indirection_size", format!("{n} is not a power of two between 1 and 65536")));
        }
        // Each context holds a key, a table and Toeplitz lookup tables: the bound keeps a
        // guest that creates every one it may within a few MiB.
        if self.rss.max_contexts > MAX_RSS_CONTEXTS {
            return Err(err(
                "rss.max_contexts",
                format!("{} is above {MAX_RSS_CONTEXTS} (0: no RSS contexts)", self.rss.max_contexts),
            ));
        }
        self.hash_types()?;
        if self.filter.capacity == 0 || self.filter.capacity > (1 << 24) {
            return Err(err("filter.capacity", "must be between 1 and 16777216"));
        }
        let e = &self.engine;
        if e.slots == 0 || e.slots > 4096 {
            return Err(err("engine.slots", "must be between 1 and 4096"));
        }
        if e.queue_depth > (1 << 20) {
            return Err(err("engine.queue_depth", "must be at most 1048576"));
        }
        for (name, spec) in [
            ("add", &e.latency.add),
            ("mod", &e.latency.modify),
            ("del", &e.latency.del),
            ("flush", &e.latency.flush),
            ("query", &e.latency.query),
        ] {
            spec.validate().map_err(|(f, m)| err(format!("engine.latency.{name}.{f}"), m))?;
        }
        let f = &self.faults;
        check_rate("faults.lost_completion_rate", f.lost_completion_rate)?;
        for (name, ef) in [("add", &f.add), ("mod", &f.modify), ("del", &f.del)] {
            if let Some(ef) = ef {
                check_rate(&format!("faults.{name}.rate"), ef.rate)?;
                check_errno(&format!("faults.{name}.errno"), &ef.errno)?;
            }
        }
        for (i, s) in f.schedule.iter().enumerate() {
            let at = |field: &str| format!("faults.schedule[{i}].{field}");
            check_ms(&at("at_ms"), s.at_ms)?;
            check_ms(&at("ms"), s.ms.unwrap_or(0))?;
            match s.action {
                ScheduledAction::Stall if s.ms.is_none() => return Err(err(at("ms"), "a stall needs `ms`")),
                ScheduledAction::Errors => {
                    let op = s.op.as_deref().ok_or_else(|| err(at("op"), "`errors` needs `op` (add, mod or del)"))?;
                    if !matches!(op, "add" | "mod" | "del") {
                        return Err(err(at("op"), format!("{op:?} is not add, mod or del")));
                    }
                    check_rate(&at("rate"), s.rate.ok_or_else(|| err(at("rate"), "`errors` needs `rate`"))?)?;
                    check_errno(&at("errno"), s.errno.as_deref().unwrap_or("ENOSPC"))?;
                }
                _ => {}
            }
        }
        check_ms("aging.idle_ms", self.aging.idle_ms)?;
        check_ms("aging.scan_ms", self.aging.scan_ms)?;
        if self.aging.idle_ms > 0 && self.aging.scan_ms == 0 {
            return Err(err("aging.scan_ms", "must be > 0 when aging.idle_ms is set"));
        }
        Ok(())
    }

    pub fn rss_key(&self) -> Result<Vec<u8>, ConfigError> {
        let k: String = self.rss.key.chars().filter(|c| !c.is_whitespace() && *c != ':').collect();
        hex::decode(&k).map_err(|e| err("rss.key", format!("not hex: {e}")))
    }

    pub fn hash_types(&self) -> Result<HashTypes, ConfigError> {
        let mut bits = 0;
        for (i, n) in self.rss.hash_types.iter().enumerate() {
            bits |= HashTypes::from_name(n).ok_or_else(|| {
                err(format!("rss.hash_types[{i}]"), format!("{n:?} is not one of ipv4 tcpv4 udpv4 ipv6 tcpv6 udpv6"))
            })?;
        }
        Ok(HashTypes(bits))
    }

    /// The RSS function of this profile for `queues` queues.
    pub fn build_rss(&self, queues: u16) -> Result<Rss, RssError> {
        let key = self.rss_key().map_err(|_| RssError::KeyLength(0))?;
        let types = self.hash_types().unwrap_or(HashTypes::ALL);
        Rss::new(&key, types, self.rss.indirection_size, queues)
    }
}

/// Largest `rss.max_contexts` a profile may give (bnxt has 33, mlx5 16).
pub const MAX_RSS_CONTEXTS: u32 = 64;

/// Largest millisecond value (about 49 days): the engine turns these into nanoseconds and
/// adds them to its clock, which must not overflow (an `at_ms` near 2^63 panicked in
/// `Engine::new`; tests/fuzz_regressions.rs).
pub const MAX_MS: u64 = 1 << 32;

fn check_ms(field: &str, ms: u64) -> Result<(), ConfigError> {
    if ms <= MAX_MS {
        Ok(())
    } else {
        Err(err(field, format!("{ms} is more than {MAX_MS} ms")))
    }
}

fn check_rate(field: &str, r: f64) -> Result<(), ConfigError> {
    if (0.0..=1.0).contains(&r) {
        Ok(())
    } else {
        Err(err(field, format!("{r} is not a probability in [0, 1]")))
    }
}

fn check_errno(field: &str, name: &str) -> Result<(), ConfigError> {
    if errno::INJECTABLE.iter().any(|(n, _)| n.eq_ignore_ascii_case(name)) {
        Ok(())
    } else {
        Err(err(field, format!("{name:?} is not one of ENOSPC, EPERM, ENOMEM, EIO, EBUSY")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "name = \"t\"\n[filter]\nlayout = \"shared\"\ncapacity = 8\n";

    #[test]
    fn minimal_profile_gets_defaults() {
        let p = Profile::parse(MINIMAL).unwrap();
        assert_eq!(p.rss.indirection_size, 128);
        assert_eq!(p.rss_key().unwrap(), MICROSOFT_KEY.to_vec());
        assert_eq!(p.engine.slots, 1);
        assert_eq!(p.hash_types().unwrap(), HashTypes::ALL);
    }

    #[test]
    fn unknown_field_is_named() {
        let e = Profile::parse(&format!("{MINIMAL}[engine]\nslotz = 2\n")).unwrap_err();
        assert_eq!(e.field, "engine.slotz");
        assert!(e.message.contains("slotz"), "{e}");
        assert!(e.message.contains("line 6"), "{e}");
    }

    #[test]
    fn wrong_type_is_named() {
        let e = Profile::parse(&format!("{MINIMAL}[engine]\nslots = \"two\"\n")).unwrap_err();
        assert_eq!(e.field, "engine.slots", "{e}");
        let e = Profile::parse(&format!(
            "{MINIMAL}[engine.latency]\nadd = {{ dist = \"lognormal\", median_us = \"x\", sigma = 1 }}\n"
        ))
        .unwrap_err();
        assert!(e.field.starts_with("engine.latency.add"), "{e}");
    }

    #[test]
    fn semantic_errors_are_named() {
        let cases = [
            ("[rss]\nkey = \"00\"\n", "rss.key"),
            ("[rss]\nindirection_size = 100\n", "rss.indirection_size"),
            ("[rss]\nmax_contexts = 65\n", "rss.max_contexts"),
            ("[rss]\nhash_types = [\"ipv4\", \"sctp\"]\n", "rss.hash_types[1]"),
            ("[engine]\nslots = 0\n", "engine.slots"),
            ("[engine.latency]\ndel = { dist = \"uniform\", min_us = 5, max_us = 1 }\n", "engine.latency.del.max_us"),
            ("[faults]\nadd = { rate = 1.5, errno = \"ENOSPC\" }\n", "faults.add.rate"),
            ("[faults]\nadd = { rate = 0.5, errno = \"EWHAT\" }\n", "faults.add.errno"),
            ("[[faults.schedule]]\nat_ms = 1\naction = \"stall\"\n", "faults.schedule[0].ms"),
        ];
        for (extra, field) in cases {
            let e = Profile::parse(&format!("{MINIMAL}{extra}")).unwrap_err();
            assert_eq!(e.field, field, "{extra}: {e}");
        }
    }

    #[test]
    fn load_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.toml");
        std::fs::write(&p, format!("{MINIMAL}[filter2]\n")).unwrap();
        let e = Profile::load(&p).unwrap_err();
        assert!(e.to_string().starts_with(&p.display().to_string()), "{e}");
    }
}
