//! One source of truth for the in-band control protocol: the guest module's
//! `guest-tests/module/arfs_proto.h`. Every constant it defines is checked here against
//! the Rust codec in `wire::control`: plain values against the crate's public constants,
//! layout offsets and lengths against the bytes the encoders write, and frames built
//! purely from the header's offsets against what the decoders read.
//!
//! A constant added to the header that no check here knows fails the suite, and so does a
//! public constant added to `wire/control.rs` that has no header counterpart (or is not
//! listed as Rust-only): a protocol change on one side forces the other.

use arfsnic::model::errno;
use arfsnic::wire::control::{
    self as wire, counter, decode_device_frame, decode_request, dev_counter, encode_completion, encode_event,
    encode_request, op, AddRequest, Caps, CompletionBody, CompletionMsg, CounterId, DeviceMsg, EventMsg, Header,
    Request, RssConfig, RssSet,
};
use arfsnic::wire::{FlowKey, L4Proto, CONTROL_ETHERTYPE};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

#[path = "proto_header/ctx.rs"]
mod ctx;
#[path = "proto_header/hash.rs"]
mod hash;
#[path = "proto_header/rules.rs"]
mod rules;

/// Relative to `CARGO_MANIFEST_DIR`.
const HEADER_PATH: &str = "../guest-tests/module/arfs_proto.h";
const CONTROL_RS_PATH: &str = "src/wire/control.rs";
const RULE_RS_PATH: &str = "src/wire/rule.rs";
const HASH_RS_PATH: &str = "src/wire/hash.rs";
/// The header's include guard: the one `#define ARFS_*` without a value.
const INCLUDE_GUARD: &str = "ARFS_PROTO_H";
/// Untagged Ethernet header: dst[6] src[6] ethertype[2]; the control header follows.
const ETH_HDR: usize = 6 + 6 + 2;
const BROADCAST: [u8; 6] = [0xff; 6];
const GUEST: [u8; 6] = [0x52, 0x54, 0x00, 0xab, 0xcd, 0xef];

// ---- the header -----------------------------------------------------------------------

/// Parse every `#define ARFS_<NAME> <integer literal> [/* comment */]` line. Any other
/// `#define` (an expression, a suffix, an octal-looking literal, a macro with arguments,
/// a name outside `ARFS_`, a duplicate) is an error naming the line, so that the header
/// stays readable by tools that are not a C preprocessor.
fn parse_defines(text: &str) -> Result<BTreeMap<String, u64>, String> {
    let mut defs = BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        let err = |why: &str| format!("arfs_proto.h:{}: {why}: {raw:?}", i + 1);
        let Some(rest) = raw.trim_start().strip_prefix('#') else { continue };
        let Some(rest) = rest.trim_start().strip_prefix("define") else { continue };
        if !rest.starts_with([' ', '\t']) {
            return Err(err("malformed #define"));
        }
        let rest = strip_comment(rest).map_err(&err)?;
        let mut words = rest.split_whitespace();
        let name = words.next().ok_or_else(|| err("#define without a name"))?;
        let value = words.next();
        if words.next().is_some() {
            return Err(err("the value is not one integer literal"));
        }
        if !name.starts_with("ARFS_") {
            return Err(err("protocol constants are named ARFS_*"));
        }
        if !name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_') {
            return Err(err("the name is not an upper-case identifier (a macro with arguments?)"));
        }
        let Some(value) = value else {
            if name == INCLUDE_GUARD {
                continue;
            }
            return Err(err("#define without a value"));
        };
        let v =
            parse_literal(value).ok_or_else(|| err("the value is not a plain decimal or 0x hex integer literal"))?;
        if defs.insert(name.to_string(), v).is_some() {
            return Err(err("defined twice"));
        }
    }
    if defs.is_empty() {
        return Err("arfs_proto.h defines no ARFS_ constant".into());
    }
    Ok(defs)
}

/// The line without its optional trailing `/* comment */`.
fn strip_comment(s: &str) -> Result<&str, &'static str> {
    if s.trim_end().ends_with('\\') {
        return Err("continued #define");
    }
    if s.contains("//") {
        return Err("only a trailing /* comment */ may follow the value");
    }
    let Some(start) = s.find("/*") else { return Ok(s) };
    let Some(len) = s[start..].find("*/") else { return Err("comment not closed on the same line") };
    if !s[start + len + 2..].trim().is_empty() {
        return Err("text after the comment");
    }
    Ok(&s[..start])
}

/// Decimal without a leading zero (C would read it as octal) or `0x` hex; no suffix.
fn parse_literal(s: &str) -> Option<u64> {
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        return u64::from_str_radix(hex, 16).ok();
    }
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || (s.len() > 1 && s.starts_with('0')) {
        return None;
    }
    s.parse().ok()
}

/// The header's constants, recording which ones the checks have looked at.
struct Proto {
    defs: BTreeMap<String, u64>,
    used: RefCell<BTreeSet<String>>,
}

impl Proto {
    fn load() -> Proto {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(HEADER_PATH);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {HEADER_PATH}: {e}"));
        let defs = parse_defines(&text).unwrap_or_else(|e| panic!("{e}"));
        Proto { defs, used: RefCell::default() }
    }

    fn get(&self, name: &str) -> u64 {
        self.used.borrow_mut().insert(name.to_string());
        self.defs.get(name).copied().unwrap_or_else(|| panic!("{name} is not defined in arfs_proto.h"))
    }

    /// The value in a narrower type (an op code in a u8, ...).
    fn val<T: TryFrom<u64>>(&self, name: &str) -> T {
        let v = self.get(name);
        T::try_from(v).unwrap_or_else(|_| panic!("{name} = {v:#x} does not fit {}", std::any::type_name::<T>()))
    }

    fn off(&self, name: &str) -> usize {
        self.val(name)
    }

    /// Header names starting with `prefix`.
    fn names(&self, prefix: &str) -> Vec<String> {
        self.defs.keys().filter(|n| n.starts_with(prefix)).cloned().collect()
    }
}

// ---- plain values ---------------------------------------------------------------------

/// `(header name, Rust name, Rust value)`. The Rust names are those of `wire::control`
/// (an index into an array is written `NAME[i]`).
fn rust_values() -> Vec<(&'static str, &'static str, u64)> {
    let z = |n: usize| n as u64;
    let mut v = rules::rust_values();
    v.extend(hash::rust_values());
    v.extend(ctx::rust_values());
    v.extend([
        ("ARFS_ETH_P", "ETHERTYPE", u64::from(wire::ETHERTYPE)),
        ("ARFS_PROTO_VERSION", "VERSION", u64::from(wire::VERSION)),
        ("ARFS_PROTO_VERSION_MIN", "MIN_VERSION", u64::from(wire::MIN_VERSION)),
        ("ARFS_DEVICE_MAC_0", "DEVICE_MAC[0]", u64::from(wire::DEVICE_MAC[0])),
        ("ARFS_DEVICE_MAC_1", "DEVICE_MAC[1]", u64::from(wire::DEVICE_MAC[1])),
        ("ARFS_DEVICE_MAC_2", "DEVICE_MAC[2]", u64::from(wire::DEVICE_MAC[2])),
        ("ARFS_DEVICE_MAC_3", "DEVICE_MAC[3]", u64::from(wire::DEVICE_MAC[3])),
        ("ARFS_DEVICE_MAC_4", "DEVICE_MAC[4]", u64::from(wire::DEVICE_MAC[4])),
        ("ARFS_DEVICE_MAC_5", "DEVICE_MAC[5]", u64::from(wire::DEVICE_MAC[5])),
        ("ARFS_HDR_LEN", "HDR_LEN", z(wire::HDR_LEN)),
        ("ARFS_FLAG_NO_REPLY", "FLAG_NO_REPLY", u64::from(wire::FLAG_NO_REPLY)),
        ("ARFS_OP_HELLO", "op::HELLO", u64::from(op::HELLO)),
        ("ARFS_OP_ADD", "op::ADD", u64::from(op::ADD)),
        ("ARFS_OP_MOD", "op::MOD", u64::from(op::MOD)),
        ("ARFS_OP_DEL", "op::DEL", u64::from(op::DEL)),
        ("ARFS_OP_FLUSH", "op::FLUSH", u64::from(op::FLUSH)),
        ("ARFS_OP_STATS", "op::STATS", u64::from(op::STATS)),
        ("ARFS_OP_QUERY", "op::QUERY", u64::from(op::QUERY)),
        ("ARFS_OP_DEV_STATS", "op::DEV_STATS", u64::from(op::DEV_STATS)),
        ("ARFS_OP_RSS_GET", "op::RSS_GET", u64::from(op::RSS_GET)),
        ("ARFS_OP_RSS_SET", "op::RSS_SET", u64::from(op::RSS_SET)),
        ("ARFS_RSS_SET_HDR_LEN", "RSS_SET_HDR_LEN", z(wire::RSS_SET_HDR_LEN)),
        ("ARFS_RSS_REPLY_HDR_LEN", "RSS_REPLY_HDR_LEN", z(wire::RSS_REPLY_HDR_LEN)),
        ("ARFS_RSS_KEY_MAX", "RSS_KEY_MAX", z(wire::RSS_KEY_MAX)),
        ("ARFS_RSS_INDIR_MAX", "RSS_INDIR_MAX", z(wire::RSS_INDIR_MAX)),
        ("ARFS_RSS_HFUNC_NO_CHANGE", "RSS_HFUNC_NO_CHANGE", u64::from(wire::RSS_HFUNC_NO_CHANGE)),
        ("ARFS_RSS_HFUNC_TOEPLITZ", "RSS_HFUNC_TOEPLITZ", u64::from(wire::RSS_HFUNC_TOEPLITZ)),
        ("ARFS_DEV_STATS_MAX_ENTRIES", "DEV_STATS_MAX_ENTRIES", z(wire::DEV_STATS_MAX_ENTRIES)),
        (
            "ARFS_DEV_CTR_RX_SPOOFED_DROPPED",
            "dev_counter::RX_SPOOFED_DROPPED",
            u64::from(dev_counter::RX_SPOOFED_DROPPED),
        ),
        ("ARFS_DEV_CTR_CTRL_REQUESTS", "dev_counter::CTRL_REQUESTS", u64::from(dev_counter::CTRL_REQUESTS)),
        ("ARFS_DEV_CTR_CTRL_BAD", "dev_counter::CTRL_BAD", u64::from(dev_counter::CTRL_BAD)),
        ("ARFS_DEV_CTR_FILTER_ADDS", "dev_counter::FILTER_ADDS", u64::from(dev_counter::FILTER_ADDS)),
        ("ARFS_DEV_CTR_FILTER_MODS", "dev_counter::FILTER_MODS", u64::from(dev_counter::FILTER_MODS)),
        ("ARFS_DEV_CTR_FILTER_DELS", "dev_counter::FILTER_DELS", u64::from(dev_counter::FILTER_DELS)),
        ("ARFS_DEV_CTR_FILTER_REJECTS", "dev_counter::FILTER_REJECTS", u64::from(dev_counter::FILTER_REJECTS)),
        ("ARFS_DEV_CTR_FILTER_RULES", "dev_counter::FILTER_RULES", u64::from(dev_counter::FILTER_RULES)),
        ("ARFS_DEV_CTR_EVENTS_SENT", "dev_counter::EVENTS_SENT", u64::from(dev_counter::EVENTS_SENT)),
        ("ARFS_DEV_CTR_RX_PACKETS", "dev_counter::RX_PACKETS", u64::from(dev_counter::RX_PACKETS)),
        ("ARFS_DEV_CTR_RX_NOT_READY", "dev_counter::RX_NOT_READY", u64::from(dev_counter::RX_NOT_READY)),
        ("ARFS_OP_COMPLETION", "op::COMPLETION", u64::from(op::COMPLETION)),
        ("ARFS_EV_RULE_AGED", "op::EV_RULE_AGED", u64::from(op::EV_RULE_AGED)),
        ("ARFS_EV_TABLE_FLUSHED", "op::EV_TABLE_FLUSHED", u64::from(op::EV_TABLE_FLUSHED)),
        ("ARFS_EV_ENGINE_STATE", "op::EV_ENGINE_STATE", u64::from(op::EV_ENGINE_STATE)),
        ("ARFS_ADD_BODY_LEN", "ADD_BODY_LEN", z(wire::ADD_BODY_LEN)),
        ("ARFS_MOD_BODY_LEN", "MOD_BODY_LEN", z(wire::MOD_BODY_LEN)),
        ("ARFS_DEL_BODY_LEN", "ID_BODY_LEN", z(wire::ID_BODY_LEN)),
        ("ARFS_QUERY_BODY_LEN", "ID_BODY_LEN", z(wire::ID_BODY_LEN)),
        ("ARFS_STATS_ENTRY_LEN", "STATS_ENTRY_LEN", z(wire::STATS_ENTRY_LEN)),
        ("ARFS_TS_LEN", "TIMESTAMPS_LEN", z(wire::TIMESTAMPS_LEN)),
        ("ARFS_PROFILE_LEN", "PROFILE_NAME_LEN", z(wire::PROFILE_NAME_LEN)),
        ("ARFS_CAPS_LAYOUT_PER_TYPE", "LAYOUT_PER_TYPE", u64::from(wire::LAYOUT_PER_TYPE)),
        ("ARFS_CAPS_LAYOUT_SHARED", "LAYOUT_SHARED", u64::from(wire::LAYOUT_SHARED)),
        ("ARFS_HIST_BUCKETS", "LAT_HIST_BUCKETS", z(wire::LAT_HIST_BUCKETS)),
        ("ARFS_CTR_STEER_CALLS", "counter::STEER_CALLS", u64::from(counter::STEER_CALLS)),
        ("ARFS_CTR_STEER_NEW", "counter::STEER_NEW", u64::from(counter::STEER_NEW)),
        ("ARFS_CTR_STEER_UPDATE", "counter::STEER_UPDATE", u64::from(counter::STEER_UPDATE)),
        ("ARFS_CTR_STEER_SAME", "counter::STEER_SAME", u64::from(counter::STEER_SAME)),
        ("ARFS_CTR_ADDS_OK", "counter::ADDS_OK", u64::from(counter::ADDS_OK)),
        ("ARFS_CTR_MODS_OK", "counter::MODS_OK", u64::from(counter::MODS_OK)),
        ("ARFS_CTR_DELS_OK", "counter::DELS_OK", u64::from(counter::DELS_OK)),
        ("ARFS_CTR_LOCK_ACQUIRED", "counter::LOCK_ACQUIRED", u64::from(counter::LOCK_ACQUIRED)),
        ("ARFS_CTR_LOCK_CONTENDED", "counter::LOCK_CONTENDED", u64::from(counter::LOCK_CONTENDED)),
        ("ARFS_CTR_LOCK_WAIT_NS_TOTAL", "counter::LOCK_WAIT_NS_TOTAL", u64::from(counter::LOCK_WAIT_NS_TOTAL)),
        ("ARFS_CTR_LOCK_WAIT_NS_MAX", "counter::LOCK_WAIT_NS_MAX", u64::from(counter::LOCK_WAIT_NS_MAX)),
        ("ARFS_CTR_RULES_NOW", "counter::RULES_NOW", u64::from(counter::RULES_NOW)),
        ("ARFS_CTR_RULES_PEAK", "counter::RULES_PEAK", u64::from(counter::RULES_PEAK)),
        ("ARFS_CTR_EXPIRE_SCANS", "counter::EXPIRE_SCANS", u64::from(counter::EXPIRE_SCANS)),
        ("ARFS_CTR_EXPIRE_SCANNED", "counter::EXPIRE_SCANNED", u64::from(counter::EXPIRE_SCANNED)),
        ("ARFS_CTR_CMD_TIMEOUTS", "counter::CMD_TIMEOUTS", u64::from(counter::CMD_TIMEOUTS)),
        ("ARFS_CTR_STEER_EPERM", "counter::STEER_EPERM", u64::from(counter::STEER_EPERM)),
        ("ARFS_CTR_STEER_ENOMEM", "counter::STEER_ENOMEM", u64::from(counter::STEER_ENOMEM)),
        ("ARFS_CTR_STEER_EPROTONOSUPPORT", "counter::STEER_EPROTONOSUPPORT", u64::from(counter::STEER_EPROTONOSUPPORT)),
        ("ARFS_CTR_HOLD_NS", "counter::HOLD_NS", u64::from(counter::HOLD_NS)),
        ("ARFS_CTR_LOCK_HOLD_NS_TOTAL", "counter::LOCK_HOLD_NS_TOTAL", u64::from(counter::LOCK_HOLD_NS_TOTAL)),
        ("ARFS_CTR_LOCK_HOLD_NS_MAX", "counter::LOCK_HOLD_NS_MAX", u64::from(counter::LOCK_HOLD_NS_MAX)),
        ("ARFS_CTR_WORK_RUNS", "counter::WORK_RUNS", u64::from(counter::WORK_RUNS)),
        ("ARFS_CTR_WORK_DELAY_NS_TOTAL", "counter::WORK_DELAY_NS_TOTAL", u64::from(counter::WORK_DELAY_NS_TOTAL)),
        ("ARFS_CTR_WORK_DELAY_NS_MAX", "counter::WORK_DELAY_NS_MAX", u64::from(counter::WORK_DELAY_NS_MAX)),
        ("ARFS_HIST_ID_BASE", "counter::LAT_HIST", u64::from(counter::LAT_HIST)),
        ("ARFS_ADD_ERR_ID_BASE", "counter::ADD_ERR", u64::from(counter::ADD_ERR)),
        ("ARFS_MOD_ERR_ID_BASE", "counter::MOD_ERR", u64::from(counter::MOD_ERR)),
        ("ARFS_DEL_ERR_ID_BASE", "counter::DEL_ERR", u64::from(counter::DEL_ERR)),
        ("ARFS_DEV_CTR_USER_RULES", "dev_counter::USER_RULES", u64::from(dev_counter::USER_RULES)),
        ("ARFS_DEV_CTR_USER_RULE_HITS", "dev_counter::USER_RULE_HITS", u64::from(dev_counter::USER_RULE_HITS)),
    ]);
    v
}

/// Public constants of `wire/control.rs` (and `wire/hash.rs`) with no `arfs_proto.h`
/// counterpart: the module takes them from the kernel (`eth_broadcast_addr()`,
/// `ETH_ZLEN`); the flow type names and `HashMsg::KEEP` are conveniences of the Rust side.
const RUST_ONLY: [&str; 4] = ["BROADCAST_MAC", "MIN_FRAME_LEN", "hash::FLOW_TYPES", "hash::KEEP"];

fn check_rust_values(p: &Proto) {
    assert_eq!(wire::ETHERTYPE, CONTROL_ETHERTYPE, "wire::control::ETHERTYPE and wire::parse::CONTROL_ETHERTYPE");
    let bad: Vec<String> = rust_values()
        .into_iter()
        .filter_map(|(h, r, v)| {
            let got = p.get(h);
            (got != v).then(|| format!("{h} = {got:#x} in arfs_proto.h, but {r} = {v:#x} in wire::control"))
        })
        .collect();
    assert!(bad.is_empty(), "arfs_proto.h and the Rust codec disagree:\n  {}", bad.join("\n  "));
}

/// How the codec classifies an error counter id (`CounterId::AddErr`, ...).
type ErrKind = fn(i32) -> CounterId;

/// Constants the Rust side has no named counterpart for, checked against what the codec
/// does with counter ids and statuses.
fn check_counter_ids(p: &Proto) {
    // The named counters are exactly 1 .. ARFS_CTR_NR - 1, one header name each.
    let nr = p.val::<u16>("ARFS_CTR_NR");
    let mut ids: Vec<u64> = p.names("ARFS_CTR_").iter().filter(|n| *n != "ARFS_CTR_NR").map(|n| p.get(n)).collect();
    ids.sort_unstable();
    assert_eq!(ids, (1..u64::from(nr)).collect::<Vec<_>>(), "ARFS_CTR_* ids are not exactly 1 .. ARFS_CTR_NR - 1");
    for id in 1..nr {
        assert!(matches!(CounterId::classify(id), CounterId::Named(_)), "counter id {id} < ARFS_CTR_NR has no name");
    }
    assert_eq!(
        CounterId::classify(nr),
        CounterId::Unknown(nr),
        "ARFS_CTR_NR = {nr} is \"one past the last named id\", but the codec names it"
    );

    // The device's counters are exactly 1 .. ARFS_DEV_CTR_NR - 1, each with a name.
    let nr = p.val::<u16>("ARFS_DEV_CTR_NR");
    let mut ids: Vec<u64> =
        p.names("ARFS_DEV_CTR_").iter().filter(|n| *n != "ARFS_DEV_CTR_NR").map(|n| p.get(n)).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        (1..u64::from(nr)).collect::<Vec<_>>(),
        "ARFS_DEV_CTR_* ids are not exactly 1 .. ARFS_DEV_CTR_NR - 1"
    );
    for id in 1..nr {
        assert!(wire::dev_counter_name(id).is_some(), "device counter id {id} < ARFS_DEV_CTR_NR has no name");
    }
    assert_eq!(wire::dev_counter_name(nr), None, "ARFS_DEV_CTR_NR = {nr}: the codec names it");
    assert!(usize::from(nr) - 1 <= wire::DEV_STATS_MAX_ENTRIES, "every device counter fits one DEV_STATS reply");

    let base = p.val::<u16>("ARFS_HIST_ID_BASE");
    let buckets = p.val::<u16>("ARFS_HIST_BUCKETS");
    for i in 0..buckets {
        assert_eq!(CounterId::classify(base + i), CounterId::LatBucket(usize::from(i)), "histogram id base + {i}");
    }
    let past = base + buckets;
    assert_eq!(
        CounterId::classify(past),
        CounterId::Unknown(past),
        "ARFS_HIST_BUCKETS = {buckets}: one bucket too many"
    );

    let slots = p.val::<u16>("ARFS_ERR_SLOTS");
    let kinds: [(&str, ErrKind); 3] = [
        ("ARFS_ADD_ERR_ID_BASE", CounterId::AddErr),
        ("ARFS_MOD_ERR_ID_BASE", CounterId::ModErr),
        ("ARFS_DEL_ERR_ID_BASE", CounterId::DelErr),
    ];
    for (name, kind) in kinds {
        let base = p.val::<u16>(name);
        assert_eq!(CounterId::classify(base), CounterId::Unknown(base), "{name} + 0 (errno 0) is not an error counter");
        for e in 1..slots {
            assert_eq!(CounterId::classify(base + e), kind(i32::from(e)), "{name} + {e} (ARFS_ERR_SLOTS = {slots})");
        }
        let next = std::mem::discriminant(&CounterId::classify(base + slots));
        let same = next == std::mem::discriminant(&kind(1));
        assert!(!same, "{name}: the codec has more than ARFS_ERR_SLOTS = {slots} slots");
    }

    // Statuses are u16 on the wire; every errno the device can answer with is in
    // 1 ..= ARFS_STATUS_MAX, which the module takes as the limit of a sane status.
    let max = p.get("ARFS_STATUS_MAX");
    assert!(max <= u64::from(u16::MAX), "ARFS_STATUS_MAX = {max} does not fit the u16 status field");
    let answered = [libc::EPROTO, libc::EOPNOTSUPP, libc::EINVAL, libc::EEXIST, libc::ENOENT, libc::ENOSPC, libc::EIO];
    for e in answered.into_iter().chain(errno::INJECTABLE.map(|(_, e)| e)) {
        assert!((1..=max).contains(&(e as u64)), "the device may answer errno {e}, beyond ARFS_STATUS_MAX = {max}");
    }
}

/// The public constants of `wire/control.rs`, as `module::NAME` inside a `pub mod`; the
/// unit tests at the end of the file are not read.
fn rust_constants() -> Vec<String> {
    let mut out = constants_of(CONTROL_RS_PATH);
    // wire/rule.rs: its top-level constants as `rule::NAME`; the body offsets of its
    // `off` module are checked against the encoder's bytes instead.
    out.extend(constants_of(RULE_RS_PATH).into_iter().filter(|n| !n.contains("::")).map(|n| format!("rule::{n}")));
    out.extend(constants_of(HASH_RS_PATH).into_iter().filter(|n| !n.contains("::")).map(|n| format!("hash::{n}")));
    out
}

fn constants_of(file: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    let src = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {file}: {e}"));
    let mut module: Option<&str> = None;
    let mut out = Vec::new();
    for line in src.lines() {
        if line.starts_with("#[cfg(test)]") {
            break;
        }
        if let Some(m) = line.strip_prefix("pub mod ").and_then(|r| r.strip_suffix(" {")) {
            module = Some(m);
        } else if line == "}" {
            module = None;
        } else if let Some(rest) = line.trim_start().strip_prefix("pub const ") {
            let name = rest.split(':').next().unwrap_or_default().trim();
            out.push(module.map_or_else(|| name.to_string(), |m| format!("{m}::{name}")));
        }
    }
    out
}

// ---- layout ---------------------------------------------------------------------------

/// A part of an encoded frame that a group of header offsets is relative to.
struct Region<'a> {
    p: &'a Proto,
    what: &'a str,
    frame: &'a [u8],
    /// Frame offset the header's offsets count from.
    base: usize,
}

impl Region<'_> {
    fn header<'a>(p: &'a Proto, what: &'a str, frame: &'a [u8]) -> Region<'a> {
        Region { p, what, frame, base: ETH_HDR }
    }

    fn body<'a>(p: &'a Proto, what: &'a str, frame: &'a [u8]) -> Region<'a> {
        Region { p, what, frame, base: ETH_HDR + p.off("ARFS_HDR_LEN") }
    }

    fn at(&self, extra: usize) -> Region<'_> {
        Region { base: self.base + extra, ..*self }
    }

    /// The bytes at offset `name` are `want`.
    fn bytes(&self, name: &str, want: &[u8]) {
        let off = self.p.off(name);
        let at = self.base + off;
        let got = self.frame.get(at..at + want.len());
        if got != Some(want) {
            let got = match got {
                Some(g) => format!("{g:02x?}"),
                None => format!("past the end of the {}-byte frame", self.frame.len()),
            };
            // Where the codec put the value instead, when it is distinctive.
            let found = match self.frame.windows(want.len()).position(|w| w == want) {
                _ if want.iter().all(|&b| b == 0) => String::new(),
                Some(i) => format!("; the codec's bytes are at offset {}", i as i64 - self.base as i64),
                None => "; the codec's bytes are nowhere in the frame".into(),
            };
            panic!(
                "{}: {name} = {off} in arfs_proto.h, but the {} bytes there are {got}, not the codec's {want:02x?}{found}",
                self.what,
                want.len()
            );
        }
    }

    /// A big-endian field of `width` bytes at offset `name` holds `value`.
    fn uint(&self, name: &str, width: usize, value: u64) {
        assert!(width <= 8 && (width == 8 || value >> (8 * width) == 0), "{value:#x} is not a {width}-byte value");
        self.bytes(name, &value.to_be_bytes()[8 - width..]);
    }

    fn zero(&self, name: &str, width: usize) {
        self.bytes(name, &vec![0; width]);
    }
}

/// The fields `(offset name, width)` cover `[start, end)` exactly, in some order, without
/// gap or overlap: pads and reserved fields sit where the header says although their
/// bytes (zero) cannot be told apart.
fn tiles(p: &Proto, what: &str, start: usize, fields: &[(&str, usize)], end: usize, end_is: &str) {
    let mut sorted: Vec<(usize, &str, usize)> = fields.iter().map(|&(n, w)| (p.off(n), n, w)).collect();
    sorted.sort_unstable();
    let mut at = start;
    for (off, name, width) in sorted {
        assert_eq!(off, at, "{what}: {name} = {off}, but the field before it ends at {at}");
        at += width;
    }
    assert_eq!(at, end, "{what}: the fields end at {at}, but {end_is} = {end}");
}

/// The `length` field the codec wrote, minus the 16-byte header, equals `want` (`how` says
/// which header constants it comes from).
fn body_len(h: &Header, what: &str, want: usize, how: &str) {
    let got = usize::from(h.length) - wire::HDR_LEN;
    assert_eq!(got, want, "{what}: the codec's length field gives a {got}-byte body, but {how} = {want}");
}

fn request_header(f: &[u8]) -> Header {
    decode_request(f).expect("the codec decodes its own request").0
}

fn device_header(f: &[u8]) -> Header {
    decode_device_frame(f).expect("the codec decodes its own device frame").0
}

fn v6_add() -> AddRequest {
    let src = [0x20, 0x01, 0x0d, 0xb8, 0x51, 0x52, 0x53, 0x54, 0x55, 0x56, 0x57, 0x58, 0x59, 0x5a, 0x5b, 0x5c];
    let dst = [0xfd, 0x00, 0x61, 0x62, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69, 0x6a, 0x6b, 0x6c, 0x6d, 0x6e];
    AddRequest { filter_id: 0x1122_3344, rxq: 0x0a0b, key: FlowKey::v6(L4Proto::Udp, src, 0xc1c2, dst, 0xd1d2) }
}

fn v4_add() -> AddRequest {
    AddRequest {
        filter_id: 0x0102_0304,
        rxq: 0x0506,
        key: FlowKey::v4(L4Proto::Tcp, [10, 11, 12, 13], 0xe1e2, [192, 168, 14, 15], 0xf1f2),
    }
}

fn check_ethernet_and_header(p: &Proto) {
    assert_eq!(wire::ETH_HLEN, ETH_HDR, "the control header follows an untagged 14-byte Ethernet header");
    let eth_p = p.val::<u16>("ARFS_ETH_P").to_be_bytes();
    let device_mac: Vec<u8> = (0..6).map(|i| p.val::<u8>(&format!("ARFS_DEVICE_MAC_{i}"))).collect();

    let add = encode_request(GUEST, 0xa1b2_c3d4, &Request::Add(v6_add()));
    assert_eq!(&add[0..6], &BROADCAST, "requests go to the broadcast address");
    assert_eq!(&add[6..12], &GUEST, "requests come from the guest MAC");
    assert_eq!(add[12..14], eth_p, "EtherType of a request (ARFS_ETH_P)");
    assert_eq!(wire::eth_info(&add).expect("control frame").offset, ETH_HDR);

    let what = "ADD request header";
    let h = Region::header(p, what, &add);
    h.uint("ARFS_HDR_OFF_VERSION", 1, u64::from(wire::VERSION));
    h.uint("ARFS_HDR_OFF_OP", 1, u64::from(op::ADD));
    h.uint("ARFS_HDR_OFF_LENGTH", 2, (wire::HDR_LEN + wire::ADD_BODY_LEN) as u64);
    h.uint("ARFS_HDR_OFF_SEQ", 4, 0xa1b2_c3d4);
    h.zero("ARFS_HDR_OFF_STATUS", 2);
    h.zero("ARFS_HDR_OFF_FLAGS", 2);
    h.zero("ARFS_HDR_OFF_RESERVED", 4);
    let fields = [
        ("ARFS_HDR_OFF_VERSION", 1),
        ("ARFS_HDR_OFF_OP", 1),
        ("ARFS_HDR_OFF_LENGTH", 2),
        ("ARFS_HDR_OFF_SEQ", 4),
        ("ARFS_HDR_OFF_STATUS", 2),
        ("ARFS_HDR_OFF_FLAGS", 2),
        ("ARFS_HDR_OFF_RESERVED", 4),
    ];
    tiles(p, what, 0, &fields, p.off("ARFS_HDR_LEN"), "ARFS_HDR_LEN");

    let stats = encode_request(GUEST, 0x0d0e_0f10, &Request::Stats(vec![]));
    let h = Region::header(p, "STATS request header", &stats);
    h.uint("ARFS_HDR_OFF_FLAGS", 2, u64::from(wire::FLAG_NO_REPLY));
    h.uint("ARFS_HDR_OFF_OP", 1, u64::from(op::STATS));

    let c = CompletionMsg {
        req_op: op::DEL,
        seq: 0x2132_4354,
        status: 0x0bcd,
        enqueue_ns: 0,
        start_ns: 0,
        finish_ns: 0,
        body: CompletionBody::None,
    };
    let f = encode_completion(GUEST, &c);
    assert_eq!(&f[0..6], &GUEST, "device frames go to the guest MAC");
    assert_eq!(f[6..12], device_mac, "source of device frames (ARFS_DEVICE_MAC_0..5)");
    assert_eq!(f[12..14], eth_p, "EtherType of a completion (ARFS_ETH_P)");
    let h = Region::header(p, "DEL completion header", &f);
    h.uint("ARFS_HDR_OFF_OP", 1, u64::from(op::COMPLETION | op::DEL));
    h.uint("ARFS_HDR_OFF_SEQ", 4, 0x2132_4354);
    h.uint("ARFS_HDR_OFF_STATUS", 2, 0x0bcd);
    h.zero("ARFS_HDR_OFF_FLAGS", 2);
    h.zero("ARFS_HDR_OFF_RESERVED", 4);
}

fn check_request_layout(p: &Proto) {
    let addr_len = p.off("ARFS_ADD_ADDR_LEN");
    assert_eq!(addr_len, v6_add().key.src.len(), "ARFS_ADD_ADDR_LEN vs the codec's address field");
    for (a, version, what) in [
        (v6_add(), "ARFS_ADD_IP_VERSION_6", "ADD request (IPv6/UDP)"),
        (v4_add(), "ARFS_ADD_IP_VERSION_4", "ADD request (IPv4/TCP)"),
    ] {
        let f = encode_request(GUEST, 1, &Request::Add(a));
        let b = Region::body(p, what, &f);
        b.uint("ARFS_ADD_OFF_FILTER_ID", 4, u64::from(a.filter_id));
        b.uint("ARFS_ADD_OFF_RXQ", 2, u64::from(a.rxq));
        b.uint("ARFS_ADD_OFF_IP_VERSION", 1, p.get(version));
        b.uint("ARFS_ADD_OFF_L4_PROTO", 1, u64::from(a.key.proto.number()));
        b.bytes("ARFS_ADD_OFF_SRC_ADDR", &a.key.src);
        b.bytes("ARFS_ADD_OFF_DST_ADDR", &a.key.dst);
        b.uint("ARFS_ADD_OFF_SRC_PORT", 2, u64::from(a.key.sport));
        b.uint("ARFS_ADD_OFF_DST_PORT", 2, u64::from(a.key.dport));
        let fields = [
            ("ARFS_ADD_OFF_FILTER_ID", 4),
            ("ARFS_ADD_OFF_RXQ", 2),
            ("ARFS_ADD_OFF_IP_VERSION", 1),
            ("ARFS_ADD_OFF_L4_PROTO", 1),
            ("ARFS_ADD_OFF_SRC_ADDR", addr_len),
            ("ARFS_ADD_OFF_DST_ADDR", addr_len),
            ("ARFS_ADD_OFF_SRC_PORT", 2),
            ("ARFS_ADD_OFF_DST_PORT", 2),
        ];
        tiles(p, what, 0, &fields, p.off("ARFS_ADD_BODY_LEN"), "ARFS_ADD_BODY_LEN");
        body_len(&request_header(&f), what, p.off("ARFS_ADD_BODY_LEN"), "ARFS_ADD_BODY_LEN");
    }
    // IPv4 addresses take the first four bytes of the 16-byte fields, the rest zero.
    let f = encode_request(GUEST, 1, &Request::Add(v4_add()));
    let b = Region::body(p, "ADD request (IPv4/TCP)", &f);
    b.bytes("ARFS_ADD_OFF_SRC_ADDR", &[10, 11, 12, 13, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    b.bytes("ARFS_ADD_OFF_DST_ADDR", &[192, 168, 14, 15, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);

    let what = "MOD request";
    let f = encode_request(GUEST, 2, &Request::Mod { filter_id: 0x2233_4455, rxq: 0x0c0d });
    let b = Region::body(p, what, &f);
    b.uint("ARFS_MOD_OFF_FILTER_ID", 4, 0x2233_4455);
    b.uint("ARFS_MOD_OFF_RXQ", 2, 0x0c0d);
    b.zero("ARFS_MOD_OFF_PAD", 2);
    let fields = [("ARFS_MOD_OFF_FILTER_ID", 4), ("ARFS_MOD_OFF_RXQ", 2), ("ARFS_MOD_OFF_PAD", 2)];
    tiles(p, what, 0, &fields, p.off("ARFS_MOD_BODY_LEN"), "ARFS_MOD_BODY_LEN");
    body_len(&request_header(&f), what, p.off("ARFS_MOD_BODY_LEN"), "ARFS_MOD_BODY_LEN");

    let what = "DEL request";
    let f = encode_request(GUEST, 3, &Request::Del { filter_id: 0x3344_5566 });
    Region::body(p, what, &f).uint("ARFS_DEL_OFF_FILTER_ID", 4, 0x3344_5566);
    tiles(p, what, 0, &[("ARFS_DEL_OFF_FILTER_ID", 4)], p.off("ARFS_DEL_BODY_LEN"), "ARFS_DEL_BODY_LEN");
    body_len(&request_header(&f), what, p.off("ARFS_DEL_BODY_LEN"), "ARFS_DEL_BODY_LEN");

    let what = "QUERY request";
    let f = encode_request(GUEST, 4, &Request::Query { filter_id: 0x4455_6677 });
    Region::body(p, what, &f).uint("ARFS_QUERY_OFF_FILTER_ID", 4, 0x4455_6677);
    tiles(p, what, 0, &[("ARFS_QUERY_OFF_FILTER_ID", 4)], p.off("ARFS_QUERY_BODY_LEN"), "ARFS_QUERY_BODY_LEN");
    body_len(&request_header(&f), what, p.off("ARFS_QUERY_BODY_LEN"), "ARFS_QUERY_BODY_LEN");

    for (req, name) in [
        (Request::Hello, "ARFS_HELLO_BODY_LEN"),
        (Request::Flush, "ARFS_FLUSH_BODY_LEN"),
        (Request::DevStats, "ARFS_DEV_STATS_BODY_LEN"),
        (Request::RssGet, "ARFS_RSS_GET_BODY_LEN"),
    ] {
        let f = encode_request(GUEST, 5, &req);
        body_len(&request_header(&f), &format!("{req} request"), p.off(name), name);
    }

    let what = "STATS request";
    let entries = vec![(0x0123, 0x0102_0304_0506_0708), (counter::ADD_ERR + 28, 0x1112_1314_1516_1718)];
    let f = encode_request(GUEST, 6, &Request::Stats(entries.clone()));
    let b = Region::body(p, what, &f);
    b.uint("ARFS_STATS_OFF_COUNT", 2, entries.len() as u64);
    b.zero("ARFS_STATS_OFF_PAD", 2);
    let hdr_len = p.off("ARFS_STATS_HDR_LEN");
    let fields = [("ARFS_STATS_OFF_COUNT", 2), ("ARFS_STATS_OFF_PAD", 2)];
    tiles(p, what, 0, &fields, hdr_len, "ARFS_STATS_HDR_LEN");
    let entry_len = p.off("ARFS_STATS_ENTRY_LEN");
    for (k, &(id, value)) in entries.iter().enumerate() {
        let e = b.at(hdr_len + k * entry_len);
        e.uint("ARFS_STATS_ENTRY_OFF_ID", 2, u64::from(id));
        e.zero("ARFS_STATS_ENTRY_OFF_PAD", 6);
        e.uint("ARFS_STATS_ENTRY_OFF_VALUE", 8, value);
    }
    let fields = [("ARFS_STATS_ENTRY_OFF_ID", 2), ("ARFS_STATS_ENTRY_OFF_PAD", 6), ("ARFS_STATS_ENTRY_OFF_VALUE", 8)];
    tiles(p, "STATS entry", 0, &fields, entry_len, "ARFS_STATS_ENTRY_LEN");
    let want = hdr_len + entries.len() * entry_len;
    body_len(&request_header(&f), what, want, "ARFS_STATS_HDR_LEN + 2 * ARFS_STATS_ENTRY_LEN");
    let f = encode_request(GUEST, 7, &Request::Stats(vec![]));
    body_len(&request_header(&f), "empty STATS request", hdr_len, "ARFS_STATS_HDR_LEN");

    let what = "RSS_SET request";
    let set = RssSet { hfunc: 0x5a, key: (0xa0..0xa0 + 40).collect(), indir: vec![0x0102, 0x0304, 0x0506, 0x0708] };
    let f = encode_request(GUEST, 8, &Request::RssSet(set.clone()));
    let b = Region::body(p, what, &f);
    b.uint("ARFS_RSS_SET_OFF_HFUNC", 1, u64::from(set.hfunc));
    b.zero("ARFS_RSS_SET_OFF_PAD", 1);
    b.uint("ARFS_RSS_SET_OFF_KEY_LEN", 2, set.key.len() as u64);
    b.uint("ARFS_RSS_SET_OFF_INDIR_SIZE", 2, set.indir.len() as u64);
    b.zero("ARFS_RSS_SET_OFF_PAD2", 2);
    b.bytes("ARFS_RSS_SET_OFF_KEY", &set.key);
    let hdr_len = p.off("ARFS_RSS_SET_HDR_LEN");
    let fields = [
        ("ARFS_RSS_SET_OFF_HFUNC", 1),
        ("ARFS_RSS_SET_OFF_PAD", 1),
        ("ARFS_RSS_SET_OFF_KEY_LEN", 2),
        ("ARFS_RSS_SET_OFF_INDIR_SIZE", 2),
        ("ARFS_RSS_SET_OFF_PAD2", 2),
    ];
    tiles(p, what, 0, &fields, hdr_len, "ARFS_RSS_SET_HDR_LEN");
    assert_eq!(p.off("ARFS_RSS_SET_OFF_KEY"), hdr_len, "{what}: the key follows the head");
    let entry = p.off("ARFS_RSS_INDIR_ENTRY_LEN");
    for (i, &q) in set.indir.iter().enumerate() {
        b.at(set.key.len() + i * entry).uint("ARFS_RSS_SET_OFF_KEY", entry, u64::from(q));
    }
    let want = hdr_len + set.key.len() + set.indir.len() * entry;
    body_len(&request_header(&f), what, want, "ARFS_RSS_SET_HDR_LEN + key + 4 * ARFS_RSS_INDIR_ENTRY_LEN");
}

const TS: [(&str, u64); 3] = [
    ("ARFS_TS_OFF_ENQUEUE_NS", 0x1111_2222_3333_4444),
    ("ARFS_TS_OFF_START_NS", 0x5555_6666_7777_8888),
    ("ARFS_TS_OFF_FINISH_NS", 0x9999_aaaa_bbbb_cccc),
];

fn completion(req_op: u8, status: u16, body: CompletionBody) -> CompletionMsg {
    CompletionMsg { req_op, seq: 0x0bad_f00d, status, enqueue_ns: TS[0].1, start_ns: TS[1].1, finish_ns: TS[2].1, body }
}

fn check_timestamps(p: &Proto, what: &str, f: &[u8]) {
    let b = Region::body(p, what, f);
    for (name, value) in TS {
        b.uint(name, 8, value);
    }
    let fields = TS.map(|(name, _)| (name, 8));
    tiles(p, what, 0, &fields, p.off("ARFS_TS_LEN"), "ARFS_TS_LEN");
}

fn check_completion_layout(p: &Proto) {
    let ts_len = p.off("ARFS_TS_LEN");

    let what = "ADD completion with an error status";
    let f = encode_completion(GUEST, &completion(op::ADD, libc::EEXIST as u16, CompletionBody::None));
    check_timestamps(p, what, &f);
    body_len(&device_header(&f), what, ts_len, "ARFS_TS_LEN");

    let what = "HELLO completion (CAPS)";
    let caps = Caps {
        queue_pairs: 0x0607,
        layout: wire::LAYOUT_SHARED,
        capacity: [0x1000_0001, 0x2000_0002, 0x3000_0003, 0x4000_0004],
        profile: "proto-header-check".into(),
    };
    let f = encode_completion(GUEST, &completion(op::HELLO, 0, CompletionBody::Caps(caps.clone())));
    check_timestamps(p, what, &f);
    let b = Region::body(p, what, &f);
    b.uint("ARFS_CAPS_OFF_QUEUE_PAIRS", 2, u64::from(caps.queue_pairs));
    b.uint("ARFS_CAPS_OFF_LAYOUT", 2, u64::from(caps.layout));
    let nr = p.off("ARFS_CAPS_CAPACITY_NR");
    assert_eq!(nr, caps.capacity.len(), "ARFS_CAPS_CAPACITY_NR vs Caps::capacity");
    for (i, &cap) in caps.capacity.iter().enumerate() {
        b.at(4 * i).uint("ARFS_CAPS_OFF_CAPACITY", 4, u64::from(cap));
    }
    let profile_len = p.off("ARFS_PROFILE_LEN");
    let mut name = caps.profile.clone().into_bytes();
    name.resize(profile_len, 0);
    b.bytes("ARFS_CAPS_OFF_PROFILE", &name);
    let fields = [
        ("ARFS_CAPS_OFF_QUEUE_PAIRS", 2),
        ("ARFS_CAPS_OFF_LAYOUT", 2),
        ("ARFS_CAPS_OFF_CAPACITY", 4 * nr),
        ("ARFS_CAPS_OFF_PROFILE", profile_len),
    ];
    let caps_len = p.off("ARFS_CAPS_LEN");
    tiles(p, what, ts_len, &fields, ts_len + caps_len, "ARFS_TS_LEN + ARFS_CAPS_LEN");
    let h = device_header(&f);
    body_len(&h, what, ts_len + caps_len, "ARFS_TS_LEN + ARFS_CAPS_LEN");
    assert_eq!(h.op, op::COMPLETION | op::HELLO);

    let what = "QUERY completion";
    let f = encode_completion(
        GUEST,
        &completion(op::QUERY, 0, CompletionBody::Query { rxq: 0x0e0f, hits: 0x0102_0304_0506_0708 }),
    );
    check_timestamps(p, what, &f);
    let b = Region::body(p, what, &f);
    b.uint("ARFS_QUERY_OFF_RXQ", 2, 0x0e0f);
    b.zero("ARFS_QUERY_OFF_PAD", 2);
    b.uint("ARFS_QUERY_OFF_HITS", 8, 0x0102_0304_0506_0708);
    let fields = [("ARFS_QUERY_OFF_RXQ", 2), ("ARFS_QUERY_OFF_PAD", 2), ("ARFS_QUERY_OFF_HITS", 8)];
    let reply_len = p.off("ARFS_QUERY_REPLY_LEN");
    tiles(p, what, ts_len, &fields, ts_len + reply_len, "ARFS_TS_LEN + ARFS_QUERY_REPLY_LEN");
    body_len(&device_header(&f), what, ts_len + reply_len, "ARFS_TS_LEN + ARFS_QUERY_REPLY_LEN");

    let what = "DEV_STATS completion";
    let entries = vec![(dev_counter::RX_SPOOFED_DROPPED, 0x0102_0304_0506_0708), (dev_counter::RX_NOT_READY, 9)];
    let f = encode_completion(GUEST, &completion(op::DEV_STATS, 0, CompletionBody::DevStats(entries.clone())));
    check_timestamps(p, what, &f);
    let b = Region::body(p, what, &f);
    b.uint("ARFS_DEV_STATS_OFF_COUNT", 2, entries.len() as u64);
    b.zero("ARFS_DEV_STATS_OFF_PAD", 2);
    let at = p.off("ARFS_DEV_STATS_OFF_ENTRIES");
    let fields = [("ARFS_DEV_STATS_OFF_COUNT", 2), ("ARFS_DEV_STATS_OFF_PAD", 2)];
    tiles(p, what, ts_len, &fields, at, "ARFS_DEV_STATS_OFF_ENTRIES");
    let entry_len = p.off("ARFS_STATS_ENTRY_LEN");
    for (k, &(id, value)) in entries.iter().enumerate() {
        let e = b.at(at + k * entry_len);
        e.uint("ARFS_STATS_ENTRY_OFF_ID", 2, u64::from(id));
        e.uint("ARFS_STATS_ENTRY_OFF_VALUE", 8, value);
    }
    body_len(&device_header(&f), what, at + entries.len() * entry_len, "ARFS_DEV_STATS_OFF_ENTRIES + 2 entries");

    let what = "RSS_GET completion";
    let rss = RssConfig { hfunc: 0x01, queues: 0x0a0b, key: (0x40..0x40 + 40).collect(), indir: vec![0x0c0d, 0x0e0f] };
    let f = encode_completion(GUEST, &completion(op::RSS_GET, 0, CompletionBody::Rss(rss.clone())));
    check_timestamps(p, what, &f);
    let b = Region::body(p, what, &f);
    b.uint("ARFS_RSS_OFF_HFUNC", 1, u64::from(rss.hfunc));
    b.zero("ARFS_RSS_OFF_PAD", 1);
    b.uint("ARFS_RSS_OFF_KEY_LEN", 2, rss.key.len() as u64);
    b.uint("ARFS_RSS_OFF_INDIR_SIZE", 2, rss.indir.len() as u64);
    b.uint("ARFS_RSS_OFF_QUEUES", 2, u64::from(rss.queues));
    b.bytes("ARFS_RSS_OFF_KEY", &rss.key);
    let key_at = p.off("ARFS_RSS_OFF_KEY");
    let fields = [
        ("ARFS_RSS_OFF_HFUNC", 1),
        ("ARFS_RSS_OFF_PAD", 1),
        ("ARFS_RSS_OFF_KEY_LEN", 2),
        ("ARFS_RSS_OFF_INDIR_SIZE", 2),
        ("ARFS_RSS_OFF_QUEUES", 2),
    ];
    tiles(p, what, ts_len, &fields, key_at, "ARFS_RSS_OFF_KEY");
    assert_eq!(key_at, ts_len + p.off("ARFS_RSS_REPLY_HDR_LEN"), "{what}: ARFS_RSS_OFF_KEY");
    let entry = p.off("ARFS_RSS_INDIR_ENTRY_LEN");
    for (i, &q) in rss.indir.iter().enumerate() {
        b.at(rss.key.len() + i * entry).uint("ARFS_RSS_OFF_KEY", entry, u64::from(q));
    }
    let want = key_at + rss.key.len() + rss.indir.len() * entry;
    body_len(&device_header(&f), what, want, "ARFS_RSS_OFF_KEY + key + 2 * ARFS_RSS_INDIR_ENTRY_LEN");
}

fn check_event_layout(p: &Proto) {
    let what = "RULE_AGED event";
    let f = encode_event(GUEST, 0x7172_7374, &EventMsg::RuleAged { filter_id: 0x5566_7788 });
    Region::header(p, what, &f).uint("ARFS_HDR_OFF_SEQ", 4, 0x7172_7374);
    Region::body(p, what, &f).uint("ARFS_EV_RULE_AGED_OFF_FILTER_ID", 4, 0x5566_7788);
    let len = p.off("ARFS_EV_RULE_AGED_BODY_LEN");
    tiles(p, what, 0, &[("ARFS_EV_RULE_AGED_OFF_FILTER_ID", 4)], len, "ARFS_EV_RULE_AGED_BODY_LEN");
    body_len(&device_header(&f), what, len, "ARFS_EV_RULE_AGED_BODY_LEN");

    let what = "TABLE_FLUSHED event";
    let f = encode_event(GUEST, 2, &EventMsg::TableFlushed);
    body_len(&device_header(&f), what, p.off("ARFS_EV_TABLE_FLUSHED_BODY_LEN"), "ARFS_EV_TABLE_FLUSHED_BODY_LEN");

    let len = p.off("ARFS_EV_ENGINE_STATE_BODY_LEN");
    for disabled in [true, false] {
        let what = format!("ENGINE_STATE event (disabled: {disabled})");
        let f = encode_event(GUEST, 3, &EventMsg::EngineState { disabled });
        let b = Region::body(p, &what, &f);
        b.uint("ARFS_EV_ENGINE_STATE_OFF_DISABLED", 2, u64::from(disabled));
        b.zero("ARFS_EV_ENGINE_STATE_OFF_PAD", 2);
        let fields = [("ARFS_EV_ENGINE_STATE_OFF_DISABLED", 2), ("ARFS_EV_ENGINE_STATE_OFF_PAD", 2)];
        tiles(p, &what, 0, &fields, len, "ARFS_EV_ENGINE_STATE_BODY_LEN");
        body_len(&device_header(&f), &what, len, "ARFS_EV_ENGINE_STATE_BODY_LEN");
    }
}

// ---- frames built from the header alone -----------------------------------------------

/// A control frame written purely from the header's offsets and values.
struct Built<'a> {
    p: &'a Proto,
    what: String,
    f: Vec<u8>,
    header: Header,
}

impl<'a> Built<'a> {
    /// `op` is a header constant name, or two joined by `|`.
    fn new(p: &'a Proto, op: &str, seq: u32, status: u16, flags: u16, body_len: usize) -> Built<'a> {
        let opv = op.split('|').map(|n| p.val::<u8>(n.trim())).fold(0, |a, b| a | b);
        let what = format!("frame built from arfs_proto.h ({op} = {opv:#04x})");
        let device = opv >= p.val::<u8>("ARFS_EV_RULE_AGED");
        let (dst, src) = if device {
            (GUEST, std::array::from_fn(|i| p.val::<u8>(&format!("ARFS_DEVICE_MAC_{i}"))))
        } else {
            (BROADCAST, GUEST)
        };
        let hdr_len = p.off("ARFS_HDR_LEN");
        let length = u16::try_from(hdr_len + body_len).expect("message fits a frame");
        let mut f = vec![0; ETH_HDR + hdr_len + body_len];
        f[0..6].copy_from_slice(&dst);
        f[6..12].copy_from_slice(&src);
        f[12..14].copy_from_slice(&p.val::<u16>("ARFS_ETH_P").to_be_bytes());
        let version = p.val::<u8>("ARFS_PROTO_VERSION");
        let header = Header { version, op: opv, length, seq, status, flags, reserved: 0 };
        let mut b = Built { p, what, f, header };
        b.put(ETH_HDR, "ARFS_HDR_OFF_VERSION", 1, u64::from(version));
        b.put(ETH_HDR, "ARFS_HDR_OFF_OP", 1, u64::from(opv));
        b.put(ETH_HDR, "ARFS_HDR_OFF_LENGTH", 2, u64::from(length));
        b.put(ETH_HDR, "ARFS_HDR_OFF_SEQ", 4, u64::from(seq));
        b.put(ETH_HDR, "ARFS_HDR_OFF_STATUS", 2, u64::from(status));
        b.put(ETH_HDR, "ARFS_HDR_OFF_FLAGS", 2, u64::from(flags));
        b.put(ETH_HDR, "ARFS_HDR_OFF_RESERVED", 4, 0);
        b
    }

    fn put_bytes(&mut self, base: usize, name: &str, bytes: &[u8]) {
        let off = self.p.off(name);
        let at = base + off;
        let len = self.f.len();
        assert!(at + bytes.len() <= len, "{}: {name} = {off} puts {} bytes beyond the message", self.what, bytes.len());
        self.f[at..at + bytes.len()].copy_from_slice(bytes);
    }

    fn put(&mut self, base: usize, name: &str, width: usize, value: u64) {
        self.put_bytes(base, name, &value.to_be_bytes()[8 - width..]);
    }

    fn body(&mut self, name: &str, width: usize, value: u64) -> &mut Self {
        let base = ETH_HDR + self.p.off("ARFS_HDR_LEN");
        self.put(base, name, width, value);
        self
    }

    fn body_bytes(&mut self, name: &str, bytes: &[u8]) -> &mut Self {
        let base = ETH_HDR + self.p.off("ARFS_HDR_LEN");
        self.put_bytes(base, name, bytes);
        self
    }

    /// The frame, zero-padded to the Ethernet minimum as a sender would.
    fn frame(&self) -> Vec<u8> {
        let mut f = self.f.clone();
        f.resize(f.len().max(60), 0);
        f
    }

    fn decodes_to(&self, want: Request) {
        assert_eq!(decode_request(&self.frame()), Ok((self.header, want)), "{}", self.what);
    }

    fn decodes_to_device(&self, want: DeviceMsg) {
        assert_eq!(decode_device_frame(&self.frame()), Ok((self.header, want)), "{}", self.what);
    }
}

fn check_built_requests(p: &Proto) {
    let body = |n: &str| p.off(n);
    for (a, version) in [(v4_add(), "ARFS_ADD_IP_VERSION_4"), (v6_add(), "ARFS_ADD_IP_VERSION_6")] {
        let mut b = Built::new(p, "ARFS_OP_ADD", 0x0a0b_0c0d, 0, 0, body("ARFS_ADD_BODY_LEN"));
        b.body("ARFS_ADD_OFF_FILTER_ID", 4, u64::from(a.filter_id))
            .body("ARFS_ADD_OFF_RXQ", 2, u64::from(a.rxq))
            .body("ARFS_ADD_OFF_IP_VERSION", 1, p.get(version))
            .body("ARFS_ADD_OFF_L4_PROTO", 1, u64::from(a.key.proto.number()))
            .body("ARFS_ADD_OFF_SRC_PORT", 2, u64::from(a.key.sport))
            .body("ARFS_ADD_OFF_DST_PORT", 2, u64::from(a.key.dport));
        let n = if version.ends_with('4') { 4 } else { p.off("ARFS_ADD_ADDR_LEN") };
        b.body_bytes("ARFS_ADD_OFF_SRC_ADDR", &a.key.src[..n]).body_bytes("ARFS_ADD_OFF_DST_ADDR", &a.key.dst[..n]);
        b.what += &format!(", {version}");
        b.decodes_to(Request::Add(a));
    }

    let mut b = Built::new(p, "ARFS_OP_MOD", 0x1a1b_1c1d, 0, 0, body("ARFS_MOD_BODY_LEN"));
    b.body("ARFS_MOD_OFF_FILTER_ID", 4, 0x2233_4455).body("ARFS_MOD_OFF_RXQ", 2, 0x0c0d);
    b.decodes_to(Request::Mod { filter_id: 0x2233_4455, rxq: 0x0c0d });

    let mut b = Built::new(p, "ARFS_OP_DEL", 0x2a2b_2c2d, 0, 0, body("ARFS_DEL_BODY_LEN"));
    b.body("ARFS_DEL_OFF_FILTER_ID", 4, 0x3344_5566);
    b.decodes_to(Request::Del { filter_id: 0x3344_5566 });

    let mut b = Built::new(p, "ARFS_OP_QUERY", 0x3a3b_3c3d, 0, 0, body("ARFS_QUERY_BODY_LEN"));
    b.body("ARFS_QUERY_OFF_FILTER_ID", 4, 0x4455_6677);
    b.decodes_to(Request::Query { filter_id: 0x4455_6677 });

    Built::new(p, "ARFS_OP_HELLO", 0x4a4b_4c4d, 0, 0, body("ARFS_HELLO_BODY_LEN")).decodes_to(Request::Hello);
    Built::new(p, "ARFS_OP_FLUSH", 0x5a5b_5c5d, 0, 0, body("ARFS_FLUSH_BODY_LEN")).decodes_to(Request::Flush);
    Built::new(p, "ARFS_OP_DEV_STATS", 0x5c5d_5e5f, 0, 0, body("ARFS_DEV_STATS_BODY_LEN"))
        .decodes_to(Request::DevStats);

    let entries = vec![(p.val::<u16>("ARFS_CTR_RULES_NOW"), 0x0102_0304_0506_0708), (0x0423, u64::MAX - 1)];
    let (hdr_len, entry_len) = (body("ARFS_STATS_HDR_LEN"), body("ARFS_STATS_ENTRY_LEN"));
    let flags = p.val::<u16>("ARFS_FLAG_NO_REPLY");
    let mut b = Built::new(p, "ARFS_OP_STATS", 0x6a6b_6c6d, 0, flags, hdr_len + entries.len() * entry_len);
    b.body("ARFS_STATS_OFF_COUNT", 2, entries.len() as u64);
    let entries_at = ETH_HDR + p.off("ARFS_HDR_LEN") + hdr_len;
    for (k, &(id, value)) in entries.iter().enumerate() {
        b.put(entries_at + k * entry_len, "ARFS_STATS_ENTRY_OFF_ID", 2, u64::from(id));
        b.put(entries_at + k * entry_len, "ARFS_STATS_ENTRY_OFF_VALUE", 8, value);
    }
    b.decodes_to(Request::Stats(entries));

    Built::new(p, "ARFS_OP_RSS_GET", 0x7c7d_7e7f, 0, 0, body("ARFS_RSS_GET_BODY_LEN")).decodes_to(Request::RssGet);
    let key: Vec<u8> = (1..=40).collect();
    let indir = [3u16, 2, 1, 0];
    let entry = body("ARFS_RSS_INDIR_ENTRY_LEN");
    let len = body("ARFS_RSS_SET_HDR_LEN") + key.len() + indir.len() * entry;
    let mut b = Built::new(p, "ARFS_OP_RSS_SET", 0x8c8d_8e8f, 0, 0, len);
    b.body("ARFS_RSS_SET_OFF_HFUNC", 1, p.get("ARFS_RSS_HFUNC_TOEPLITZ"))
        .body("ARFS_RSS_SET_OFF_KEY_LEN", 2, key.len() as u64)
        .body("ARFS_RSS_SET_OFF_INDIR_SIZE", 2, indir.len() as u64)
        .body_bytes("ARFS_RSS_SET_OFF_KEY", &key);
    let indir_at = ETH_HDR + p.off("ARFS_HDR_LEN") + key.len();
    for (i, &q) in indir.iter().enumerate() {
        b.put(indir_at + i * entry, "ARFS_RSS_SET_OFF_KEY", entry, u64::from(q));
    }
    let hfunc = p.val::<u8>("ARFS_RSS_HFUNC_TOEPLITZ");
    b.decodes_to(Request::RssSet(RssSet { hfunc, key, indir: indir.to_vec() }));
    // hfunc 0 keeps the hash function; sizes 0 keep key and table.
    let mut b = Built::new(p, "ARFS_OP_RSS_SET", 0x8c8d_8e90, 0, 0, body("ARFS_RSS_SET_HDR_LEN"));
    b.body("ARFS_RSS_SET_OFF_HFUNC", 1, p.get("ARFS_RSS_HFUNC_NO_CHANGE"));
    b.decodes_to(Request::RssSet(RssSet::default()));
    // A version 1 frame has no RSS ops; every other op decodes in it.
    let v1 = p.val::<u8>("ARFS_PROTO_VERSION_MIN");
    let mut f = Built::new(p, "ARFS_OP_RSS_GET", 1, 0, 0, 0).frame();
    f[ETH_HDR + p.off("ARFS_HDR_OFF_VERSION")] = v1;
    assert!(matches!(decode_request(&f), Err(wire::DecodeError::UnknownOp { .. })), "RSS_GET in version {v1}");
    let mut f = Built::new(p, "ARFS_OP_HELLO", 1, 0, 0, 0).frame();
    f[ETH_HDR + p.off("ARFS_HDR_OFF_VERSION")] = v1;
    assert_eq!(decode_request(&f).map(|r| r.1), Ok(Request::Hello), "HELLO in version {v1}");
}

fn check_built_device_frames(p: &Proto) {
    let ts_len = p.off("ARFS_TS_LEN");
    let ts = |b: &mut Built| {
        for (name, value) in TS {
            b.body(name, 8, value);
        }
    };
    let msg = |req_op: u8, seq: u32, status: u16, body: CompletionBody| {
        DeviceMsg::Completion(CompletionMsg {
            req_op,
            seq,
            status,
            enqueue_ns: TS[0].1,
            start_ns: TS[1].1,
            finish_ns: TS[2].1,
            body,
        })
    };

    let caps = Caps {
        queue_pairs: 0x0203,
        layout: p.val("ARFS_CAPS_LAYOUT_PER_TYPE"),
        capacity: [0x0a00_0001, 0x0b00_0002, 0x0c00_0003, 0x0d00_0004],
        profile: "built-from-the-header".into(),
    };
    let op = "ARFS_OP_COMPLETION | ARFS_OP_HELLO";
    let mut b = Built::new(p, op, 0x7a7b_7c7d, 0, 0, ts_len + p.off("ARFS_CAPS_LEN"));
    ts(&mut b);
    b.body("ARFS_CAPS_OFF_QUEUE_PAIRS", 2, u64::from(caps.queue_pairs))
        .body("ARFS_CAPS_OFF_LAYOUT", 2, u64::from(caps.layout))
        .body_bytes("ARFS_CAPS_OFF_PROFILE", caps.profile.as_bytes());
    let cap_at = ETH_HDR + p.off("ARFS_HDR_LEN");
    for (i, &cap) in caps.capacity.iter().enumerate() {
        b.put(cap_at + 4 * i, "ARFS_CAPS_OFF_CAPACITY", 4, u64::from(cap));
    }
    b.decodes_to_device(msg(p.val("ARFS_OP_HELLO"), 0x7a7b_7c7d, 0, CompletionBody::Caps(caps)));

    let op = "ARFS_OP_COMPLETION | ARFS_OP_QUERY";
    let mut b = Built::new(p, op, 0x8a8b_8c8d, 0, 0, ts_len + p.off("ARFS_QUERY_REPLY_LEN"));
    ts(&mut b);
    b.body("ARFS_QUERY_OFF_RXQ", 2, 0x0304).body("ARFS_QUERY_OFF_HITS", 8, 0x1020_3040_5060_7080);
    let want = CompletionBody::Query { rxq: 0x0304, hits: 0x1020_3040_5060_7080 };
    b.decodes_to_device(msg(p.val("ARFS_OP_QUERY"), 0x8a8b_8c8d, 0, want));

    let op = "ARFS_OP_COMPLETION | ARFS_OP_DEV_STATS";
    let entries = vec![(p.val::<u16>("ARFS_DEV_CTR_FILTER_RULES"), 0x0a0b_0c0d_0e0f_1011)];
    let at = p.off("ARFS_DEV_STATS_OFF_ENTRIES");
    let entry_len = p.off("ARFS_STATS_ENTRY_LEN");
    let mut b = Built::new(p, op, 0x8c8d_8e8f, 0, 0, at + entries.len() * entry_len);
    ts(&mut b);
    b.body("ARFS_DEV_STATS_OFF_COUNT", 2, entries.len() as u64);
    let entries_at = ETH_HDR + p.off("ARFS_HDR_LEN") + at;
    for (k, &(id, value)) in entries.iter().enumerate() {
        b.put(entries_at + k * entry_len, "ARFS_STATS_ENTRY_OFF_ID", 2, u64::from(id));
        b.put(entries_at + k * entry_len, "ARFS_STATS_ENTRY_OFF_VALUE", 8, value);
    }
    b.decodes_to_device(msg(p.val("ARFS_OP_DEV_STATS"), 0x8c8d_8e8f, 0, CompletionBody::DevStats(entries)));

    let op = "ARFS_OP_COMPLETION | ARFS_OP_RSS_GET";
    let key: Vec<u8> = (0x80..0x80 + 40).collect();
    let indir = [1u16, 0, 1, 0, 1, 0, 1, 0];
    let entry = p.off("ARFS_RSS_INDIR_ENTRY_LEN");
    let key_at = p.off("ARFS_RSS_OFF_KEY");
    let mut b = Built::new(p, op, 0x8e8f_9091, 0, 0, key_at + key.len() + indir.len() * entry);
    ts(&mut b);
    b.body("ARFS_RSS_OFF_HFUNC", 1, p.get("ARFS_RSS_HFUNC_TOEPLITZ"))
        .body("ARFS_RSS_OFF_KEY_LEN", 2, key.len() as u64)
        .body("ARFS_RSS_OFF_INDIR_SIZE", 2, indir.len() as u64)
        .body("ARFS_RSS_OFF_QUEUES", 2, 2)
        .body_bytes("ARFS_RSS_OFF_KEY", &key);
    let indir_at = ETH_HDR + p.off("ARFS_HDR_LEN") + key.len();
    for (i, &q) in indir.iter().enumerate() {
        b.put(indir_at + i * entry, "ARFS_RSS_OFF_KEY", entry, u64::from(q));
    }
    let rss = RssConfig { hfunc: p.val("ARFS_RSS_HFUNC_TOEPLITZ"), queues: 2, key, indir: indir.to_vec() };
    b.decodes_to_device(msg(p.val("ARFS_OP_RSS_GET"), 0x8e8f_9091, 0, CompletionBody::Rss(rss)));

    // The largest status the module accepts still decodes as that status.
    let status = p.val::<u16>("ARFS_STATUS_MAX");
    let mut b = Built::new(p, "ARFS_OP_COMPLETION | ARFS_OP_MOD", 0x9a9b_9c9d, status, 0, ts_len);
    ts(&mut b);
    b.decodes_to_device(msg(p.val("ARFS_OP_MOD"), 0x9a9b_9c9d, status, CompletionBody::None));

    let mut b = Built::new(p, "ARFS_EV_RULE_AGED", 11, 0, 0, p.off("ARFS_EV_RULE_AGED_BODY_LEN"));
    b.body("ARFS_EV_RULE_AGED_OFF_FILTER_ID", 4, 0x6677_8899);
    b.decodes_to_device(DeviceMsg::Event { seq: 11, event: EventMsg::RuleAged { filter_id: 0x6677_8899 } });

    let b = Built::new(p, "ARFS_EV_TABLE_FLUSHED", 12, 0, 0, p.off("ARFS_EV_TABLE_FLUSHED_BODY_LEN"));
    b.decodes_to_device(DeviceMsg::Event { seq: 12, event: EventMsg::TableFlushed });

    for disabled in [true, false] {
        let mut b = Built::new(p, "ARFS_EV_ENGINE_STATE", 13, 0, 0, p.off("ARFS_EV_ENGINE_STATE_BODY_LEN"));
        b.body("ARFS_EV_ENGINE_STATE_OFF_DISABLED", 2, u64::from(disabled));
        b.decodes_to_device(DeviceMsg::Event { seq: 13, event: EventMsg::EngineState { disabled } });
    }
}

// ---- tests ----------------------------------------------------------------------------

const CHECKS: [fn(&Proto); 14] = [
    ctx::check_ctx_layout,
    ctx::check_built_ctx,
    hash::check_hash_layout,
    hash::check_built_hash,
    rules::check_rule_layout,
    rules::check_built_rules,
    check_rust_values,
    check_counter_ids,
    check_ethernet_and_header,
    check_request_layout,
    check_completion_layout,
    check_event_layout,
    check_built_requests,
    check_built_device_frames,
];

#[test]
fn ctx_layout_matches_the_encoder_and_decoder() {
    let p = Proto::load();
    ctx::check_ctx_layout(&p);
    ctx::check_built_ctx(&p);
}

#[test]
fn hash_layout_matches_the_encoder_and_decoder() {
    let p = Proto::load();
    hash::check_hash_layout(&p);
    hash::check_built_hash(&p);
}

#[test]
fn rule_layout_matches_the_encoder_and_decoder() {
    let p = Proto::load();
    rules::check_rule_layout(&p);
    rules::check_built_rules(&p);
}

#[test]
fn header_values_match_rust_constants() {
    check_rust_values(&Proto::load());
}

#[test]
fn counter_ids_and_status_limit_match_the_codec() {
    check_counter_ids(&Proto::load());
}

#[test]
fn ethernet_and_control_header_layout() {
    check_ethernet_and_header(&Proto::load());
}

#[test]
fn request_layout_matches_the_encoder() {
    check_request_layout(&Proto::load());
}

#[test]
fn completion_layout_matches_the_encoder() {
    check_completion_layout(&Proto::load());
}

#[test]
fn event_layout_matches_the_encoder() {
    check_event_layout(&Proto::load());
}

#[test]
fn requests_built_from_the_header_decode() {
    check_built_requests(&Proto::load());
}

#[test]
fn device_frames_built_from_the_header_decode() {
    check_built_device_frames(&Proto::load());
}

/// A constant added to the header must be known here: compared with a Rust constant in
/// `rust_values()` or checked against the codec's bytes.
#[test]
fn every_header_constant_is_checked() {
    let p = Proto::load();
    for check in CHECKS {
        check(&p);
    }
    let used = p.used.borrow();
    let unknown: Vec<&String> = p.defs.keys().filter(|n| !used.contains(*n)).collect();
    assert!(
        unknown.is_empty(),
        "arfs_proto.h defines constants this test does not check: {unknown:?}; add each to rust_values() with its \
         Rust counterpart, or check it against the codec's frames"
    );
}

/// A public constant added to `wire/control.rs` must have its header counterpart (or be
/// listed in `RUST_ONLY`).
#[test]
fn every_rust_constant_has_a_header_counterpart() {
    let mapped: BTreeSet<&str> =
        rust_values().into_iter().map(|(_, r, _)| r.split('[').next().unwrap_or(r)).chain(RUST_ONLY).collect();
    let found = rust_constants();
    assert!(found.len() > 40, "found only {found:?} in {CONTROL_RS_PATH}: did its layout change?");
    let missing: Vec<&String> = found.iter().filter(|r| !mapped.contains(r.as_str())).collect();
    assert!(
        missing.is_empty(),
        "{CONTROL_RS_PATH} has public constants without an arfs_proto.h counterpart: {missing:?}; add them to the \
         header and to rust_values(), or to RUST_ONLY"
    );
    let stale: Vec<&&str> = mapped.iter().filter(|m| !found.iter().any(|r| r == *m)).collect();
    assert!(stale.is_empty(), "rust_values()/RUST_ONLY name constants {CONTROL_RS_PATH} no longer has: {stale:?}");
}

#[test]
fn parser_takes_plain_literals_only() {
    let ok = "#ifndef ARFS_PROTO_H\n#define ARFS_PROTO_H\n#define ARFS_A\t\t0x88B5\t/* c */\n# define ARFS_B 0\n\
              #define ARFS_C 4095 /* x */  \n#include <x.h>\n";
    let defs = parse_defines(ok).expect("valid header");
    assert_eq!(
        defs.into_iter().collect::<Vec<_>>(),
        [("ARFS_A".into(), 0x88b5), ("ARFS_B".into(), 0), ("ARFS_C".into(), 4095)]
    );
    for bad in [
        "#define ARFS_X (1 << 3)",
        "#define ARFS_X ARFS_Y",
        "#define ARFS_X 1U",
        "#define ARFS_X 010",
        "#define ARFS_X 0x",
        "#define ARFS_X -1",
        "#define ARFS_X 16 + 4",
        "#define ARFS_X",
        "#define ARFS_X(a) (a)",
        "#define ARFS_X 1 // c",
        "#define ARFS_X 1 /* c",
        "#define ARFS_X /* c */ 1",
        "#define ARFS_X \\\n 1",
        "#define OTHER 1",
        "#define ARFS_X 1\n#define ARFS_X 2",
    ] {
        let e = parse_defines(bad).expect_err(bad);
        assert!(e.starts_with("arfs_proto.h:"), "{e}");
    }
}
