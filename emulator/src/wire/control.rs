//! The in-band control protocol v2 (v1 peers accepted): frames on EtherType 0x88B5 between the guest's aRFS
//! driver and the device's command engine. Pure encode/decode, no I/O. The protocol is
//! documented in docs/control-protocol.md; this module is its reference implementation
//! on the device side, plus the guest-side encoders and device-frame decoders that tests
//! (and a Rust test driver) use.
//!
//! Layout (all multi-byte fields big-endian):
//!
//! ```text
//! Ethernet: dst[6] src[6] ethertype=0x88B5   (one 802.1Q/802.1ad tag accepted on input)
//! header:   u8 version=2 (1 accepted) | u8 op | u16 length (header + body) | u32 seq
//!           u16 status (0 or a positive Linux errno) | u16 flags | u32 reserved
//! body:     op specific, `length - 16` bytes; the frame may be padded beyond it
//! ```
//!
//! Frames are hostile input: every decoder returns a value or an error, never panics,
//! and allocates at most in proportion to the frame it was given.

use super::ethernet;
use super::flow::{FlowKey, IpVersion, L4Proto};
use super::hash::{HashMsg, HASH_BODY_LEN};
use super::parse::CONTROL_ETHERTYPE;
use super::rule::{RuleBodyError, RuleSpec, RULE_DEL_BODY_LEN, RULE_SET_BODY_LEN};
use std::fmt;

/// The EtherType of control frames.
pub const ETHERTYPE: u16 = CONTROL_ETHERTYPE;
/// Protocol version this module speaks (RSS_GET / RSS_SET are new in 2, RULE_SET /
/// RULE_DEL / HASH_GET / HASH_SET in 3, CTX_SET / CTX_DEL in 4).
pub const VERSION: u8 = 4;
/// Oldest version still accepted: each version is the next without its new ops.
pub const MIN_VERSION: u8 = 1;
/// Source MAC of every device-generated control frame.
pub const DEVICE_MAC: [u8; 6] = [0x02, 0xa5, 0xf1, 0xc0, 0x00, 0x01];
/// Destination MAC of guest requests.
pub const BROADCAST_MAC: [u8; 6] = [0xff; 6];
pub use super::ethernet::ETH_HLEN;
/// Control header.
pub const HDR_LEN: usize = 16;
/// Frames are padded to the Ethernet minimum (without FCS).
pub const MIN_FRAME_LEN: usize = 60;
/// Size of the three device timestamps every completion body starts with.
pub const TIMESTAMPS_LEN: usize = 24;
/// Bytes of the profile name in CAPS.
pub const PROFILE_NAME_LEN: usize = 32;
/// Buckets of the guest's command latency histogram.
pub const LAT_HIST_BUCKETS: usize = 24;

/// Request op codes (guest → device).
pub mod op {
    pub const HELLO: u8 = 0x01;
    pub const ADD: u8 = 0x02;
    pub const MOD: u8 = 0x03;
    pub const DEL: u8 = 0x04;
    pub const FLUSH: u8 = 0x05;
    pub const STATS: u8 = 0x06;
    pub const QUERY: u8 = 0x07;
    /// The device's counters (answered at once, not through the command engine).
    pub const DEV_STATS: u8 = 0x08;
    /// The device's RSS configuration (version 2; answered at once).
    pub const RSS_GET: u8 = 0x09;
    /// Change the device's RSS key / indirection table / hash function (version 2).
    pub const RSS_SET: u8 = 0x0a;
    /// Insert or replace an ethtool ntuple rule (version 3; `wire::rule`).
    pub const RULE_SET: u8 = 0x0b;
    /// Remove an ethtool ntuple rule, or all of them (version 3).
    pub const RULE_DEL: u8 = 0x0c;
    /// The RSS hash fields per flow type and the input transformation (version 3;
    /// `wire::hash`; answered at once).
    pub const HASH_GET: u8 = 0x0d;
    /// Change them (version 3).
    pub const HASH_SET: u8 = 0x0e;
    /// Create or change an additional RSS context (version 4; answered at once).
    pub const CTX_SET: u8 = 0x0f;
    /// Remove an RSS context (version 4).
    pub const CTX_DEL: u8 = 0x10;
    /// A completion's op is `COMPLETION | request op`.
    pub const COMPLETION: u8 = 0x80;
    /// Unsolicited device events.
    pub const EV_RULE_AGED: u8 = 0x40;
    pub const EV_TABLE_FLUSHED: u8 = 0x41;
    pub const EV_ENGINE_STATE: u8 = 0x42;
}

/// Header flag: the sender expects no completion (set on STATS).
pub const FLAG_NO_REPLY: u16 = 0x0001;

/// Body sizes of the fixed-size requests.
pub const ADD_BODY_LEN: usize = 44;
pub const MOD_BODY_LEN: usize = 8;
pub const ID_BODY_LEN: usize = 4;
/// STATS: u16 count, u16 pad, then `count` entries of this size.
pub const STATS_ENTRY_LEN: usize = 16;

/// RSS_SET body before the key and the table; RSS_GET reply after the timestamps.
pub const RSS_SET_HDR_LEN: usize = 8;
pub const RSS_REPLY_HDR_LEN: usize = 8;
/// CTX_SET body before the RSS_SET body: the u32 context ID.
pub const CTX_SET_HDR_LEN: usize = 4;
/// Longest RSS key the protocol carries (bytes).
pub const RSS_KEY_MAX: usize = 64;
/// Largest indirection table the protocol carries (entries, u16 each).
pub const RSS_INDIR_MAX: usize = 128;
/// Hash functions (`hfunc`): 0 in RSS_SET keeps the current one; 1 Toeplitz (the
/// values of Linux's `ETH_RSS_HASH_NO_CHANGE` / `ETH_RSS_HASH_TOP`).
pub const RSS_HFUNC_NO_CHANGE: u8 = 0;
pub const RSS_HFUNC_TOEPLITZ: u8 = 1;

/// Most entries in a DEV_STATS completion (one per [`dev_counter`] id).
pub const DEV_STATS_MAX_ENTRIES: usize = 16;

/// DEV_STATS counter ids: the device's own counters since its last reset, which the
/// module shows in `ethtool -S` as `dev_<name>`.
pub mod dev_counter {
    pub const RX_SPOOFED_DROPPED: u16 = 1;
    pub const CTRL_REQUESTS: u16 = 2;
    pub const CTRL_BAD: u16 = 3;
    pub const FILTER_ADDS: u16 = 4;
    pub const FILTER_MODS: u16 = 5;
    pub const FILTER_DELS: u16 = 6;
    pub const FILTER_REJECTS: u16 = 7;
    pub const FILTER_RULES: u16 = 8;
    pub const EVENTS_SENT: u16 = 9;
    pub const RX_PACKETS: u16 = 10;
    pub const RX_NOT_READY: u16 = 11;
    /// A gauge: the ethtool ntuple rules installed (RULE_SET).
    pub const USER_RULES: u16 = 12;
    /// Packets steered or dropped by them.
    pub const USER_RULE_HITS: u16 = 13;

    /// Names of ids 1.. in order.
    pub(super) const NAMES: [&str; 13] = [
        "rx_spoofed_dropped",
        "ctrl_requests",
        "ctrl_bad",
        "filter_adds",
        "filter_mods",
        "filter_dels",
        "filter_rejects",
        "filter_rules",
        "events_sent",
        "rx_packets",
        "rx_not_ready",
        "user_rules",
        "user_rule_hits",
    ];
}

/// The name of a DEV_STATS counter id.
pub fn dev_counter_name(id: u16) -> Option<&'static str> {
    usize::from(id).checked_sub(1).and_then(|i| dev_counter::NAMES.get(i)).copied()
}

/// STATS counter ids (guest driver counters).
pub mod counter {
    pub const STEER_CALLS: u16 = 1;
    pub const STEER_NEW: u16 = 2;
    pub const STEER_UPDATE: u16 = 3;
    pub const STEER_SAME: u16 = 4;
    pub const ADDS_OK: u16 = 5;
    pub const MODS_OK: u16 = 6;
    pub const DELS_OK: u16 = 7;
    pub const LOCK_ACQUIRED: u16 = 8;
    pub const LOCK_CONTENDED: u16 = 9;
    pub const LOCK_WAIT_NS_TOTAL: u16 = 10;
    pub const LOCK_WAIT_NS_MAX: u16 = 11;
    pub const RULES_NOW: u16 = 12;
    pub const RULES_PEAK: u16 = 13;
    pub const EXPIRE_SCANS: u16 = 14;
    pub const EXPIRE_SCANNED: u16 = 15;
    pub const CMD_TIMEOUTS: u16 = 16;
    pub const STEER_EPERM: u16 = 17;
    pub const STEER_ENOMEM: u16 = 18;
    pub const STEER_EPROTONOSUPPORT: u16 = 19;
    pub const HOLD_NS: u16 = 20;
    pub const LOCK_HOLD_NS_TOTAL: u16 = 21;
    pub const LOCK_HOLD_NS_MAX: u16 = 22;
    pub const WORK_RUNS: u16 = 23;
    pub const WORK_DELAY_NS_TOTAL: u16 = 24;
    pub const WORK_DELAY_NS_MAX: u16 = 25;
    /// `LAT_HIST + i`: command round trips in [2^i, 2^(i+1)) µs (bucket 0 also < 1 µs).
    pub const LAT_HIST: u16 = 0x100;
    /// `ADD_ERR + errno`: ADD completions that failed with that errno.
    pub const ADD_ERR: u16 = 0x200;
    pub const MOD_ERR: u16 = 0x300;
    pub const DEL_ERR: u16 = 0x400;

    pub(super) const NAMES: [&str; 25] = [
        "steer_calls",
        "steer_new",
        "steer_update",
        "steer_same",
        "adds_ok",
        "mods_ok",
        "dels_ok",
        "lock_acquired",
        "lock_contended",
        "lock_wait_ns_total",
        "lock_wait_ns_max",
        "rules_now",
        "rules_peak",
        "expire_scans",
        "expire_scanned",
        "cmd_timeouts",
        "steer_eperm",
        "steer_enomem",
        "steer_eprotonosupport",
        "hold_ns",
        "lock_hold_ns_total",
        "lock_hold_ns_max",
        "work_runs",
        "work_delay_ns_total",
        "work_delay_ns_max",
    ];
}

/// What a STATS counter id means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CounterId {
    /// One of the named counters 1..=25.
    Named(&'static str),
    /// Latency histogram bucket `i` (0..24).
    LatBucket(usize),
    AddErr(i32),
    ModErr(i32),
    DelErr(i32),
    Unknown(u16),
}

impl CounterId {
    pub fn classify(id: u16) -> CounterId {
        let named = usize::from(id).checked_sub(1).and_then(|i| counter::NAMES.get(i));
        if let Some(n) = named {
            return CounterId::Named(n);
        }
        let (base, low) = (id & 0xff00, i32::from(id & 0xff));
        match base {
            counter::LAT_HIST if (low as usize) < LAT_HIST_BUCKETS => CounterId::LatBucket(low as usize),
            counter::ADD_ERR if low > 0 => CounterId::AddErr(low),
            counter::MOD_ERR if low > 0 => CounterId::ModErr(low),
            counter::DEL_ERR if low > 0 => CounterId::DelErr(low),
            _ => CounterId::Unknown(id),
        }
    }
}

/// The 16-byte control header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub version: u8,
    pub op: u8,
    /// Header + body bytes.
    pub length: u16,
    pub seq: u32,
    pub status: u16,
    pub flags: u16,
    pub reserved: u32,
}

impl Header {
    fn write(&self, out: &mut Vec<u8>) {
        out.push(self.version);
        out.push(self.op);
        out.extend_from_slice(&self.length.to_be_bytes());
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(&self.status.to_be_bytes());
        out.extend_from_slice(&self.flags.to_be_bytes());
        out.extend_from_slice(&self.reserved.to_be_bytes());
    }

    fn read(b: &[u8; HDR_LEN]) -> Header {
        Header {
            version: b[0],
            op: b[1],
            length: be16(b, 2),
            seq: be32(b, 4),
            status: be16(b, 8),
            flags: be16(b, 10),
            reserved: be32(b, 12),
        }
    }
}

/// ADD: install filter `filter_id` steering `key` to RX queue `rxq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddRequest {
    pub filter_id: u32,
    pub rxq: u16,
    pub key: FlowKey,
}

/// A decoded guest request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Hello,
    Add(AddRequest),
    Mod {
        filter_id: u32,
        rxq: u16,
    },
    Del {
        filter_id: u32,
    },
    Flush,
    /// The driver's counters, `(id, value)` in frame order.
    Stats(Vec<(u16, u64)>),
    Query {
        filter_id: u32,
    },
    DevStats,
    RssGet,
    RssSet(RssSet),
    RuleSet(RuleSpec),
    RuleDel {
        location: u32,
    },
    HashGet,
    HashSet(HashMsg),
    /// CTX_SET: RSS context `context` (≥ 1) created with, or changed to, `set` (an empty
    /// key or table: the device's default key, the table spread over the enabled queues
    /// for a new context; unchanged for an existing one).
    CtxSet {
        context: u32,
        set: RssSet,
    },
    CtxDel {
        context: u32,
    },
}

/// RSS_SET: what to change. An empty key or table keeps the current one; `hfunc` 0 keeps
/// the hash function. The device checks `hfunc`, the sizes and the entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RssSet {
    pub hfunc: u8,
    /// At most [`RSS_KEY_MAX`] bytes.
    pub key: Vec<u8>,
    /// At most [`RSS_INDIR_MAX`] entries.
    pub indir: Vec<u16>,
}

/// The device's RSS configuration (RSS_GET's completion).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RssConfig {
    pub hfunc: u8,
    /// Queue pairs the table may point at.
    pub queues: u16,
    /// At most [`RSS_KEY_MAX`] bytes.
    pub key: Vec<u8>,
    /// At most [`RSS_INDIR_MAX`] entries.
    pub indir: Vec<u16>,
}

impl Request {
    pub fn op(&self) -> u8 {
        match self {
            Request::Hello => op::HELLO,
            Request::Add(_) => op::ADD,
            Request::Mod { .. } => op::MOD,
            Request::Del { .. } => op::DEL,
            Request::Flush => op::FLUSH,
            Request::Stats(_) => op::STATS,
            Request::Query { .. } => op::QUERY,
            Request::DevStats => op::DEV_STATS,
            Request::RssGet => op::RSS_GET,
            Request::RssSet(_) => op::RSS_SET,
            Request::RuleSet(_) => op::RULE_SET,
            Request::RuleDel { .. } => op::RULE_DEL,
            Request::HashGet => op::HASH_GET,
            Request::HashSet(_) => op::HASH_SET,
            Request::CtxSet { .. } => op::CTX_SET,
            Request::CtxDel { .. } => op::CTX_DEL,
        }
    }

    /// Whether the device answers it (everything but STATS).
    pub fn expects_reply(&self) -> bool {
        !matches!(self, Request::Stats(_))
    }
}

/// Why a frame is not a valid request. Every variant except `TooShort` and
/// `NotControl` carries the readable header, so the device can answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Shorter than an Ethernet header (with its VLAN tag): no answer is possible.
    #[error("frame of {len} bytes is too short for an Ethernet header")]
    TooShort { len: usize },
    #[error("EtherType {0:#06x} is not the control EtherType")]
    NotControl(u16),
    /// Fewer than 16 control header bytes. The readable fields are kept, the rest is
    /// zero (seq is 0 unless all of it was present).
    #[error("truncated control header ({have} of 16 bytes)")]
    TruncatedHeader { header: Header, have: usize },
    #[error("protocol version {} is not {MIN_VERSION} to {VERSION}", header.version)]
    BadVersion { header: Header },
    #[error("unknown op {:#04x}", header.op)]
    UnknownOp { header: Header },
    #[error("reserved header field is {:#x}, not 0", header.reserved)]
    BadReserved { header: Header },
    /// `length` is below 16 or beyond the frame.
    #[error("length field {} does not fit a frame with {available} control bytes", header.length)]
    BadLength { header: Header, available: usize },
    /// The body size does not match the op.
    #[error("op {:#04x}: body of {got} bytes, expected {expected}", header.op)]
    BadBody { header: Header, got: usize, expected: &'static str },
    #[error("ip_version {value} is not 4 or 6")]
    BadIpVersion { header: Header, value: u8 },
    #[error("l4_proto {value} is not 6 (TCP) or 17 (UDP)")]
    BadL4Proto { header: Header, value: u8 },
    /// An IPv4 ADD with non-zero bytes after the first four of an address.
    #[error("IPv4 address with non-zero bytes 4..16")]
    BadAddress { header: Header },
    /// RSS_SET with a key or table longer than the protocol carries.
    #[error("RSS_SET key of {key_len} bytes / table of {indir_size} entries exceeds 64 / 128")]
    RssTooLarge { header: Header, key_len: usize, indir_size: usize },
    /// A HASH_SET body with non-zero padding.
    #[error("HASH_SET: padding is not zero")]
    BadHash { header: Header },
    /// A RULE_SET body with a field out of range.
    #[error("RULE_SET: {error}")]
    BadRule { header: Header, error: RuleBodyError },
}

impl DecodeError {
    /// The header, when enough of it was readable to answer (seq echoed).
    pub fn header(&self) -> Option<&Header> {
        match self {
            DecodeError::TooShort { .. } | DecodeError::NotControl(_) => None,
            DecodeError::TruncatedHeader { header, .. }
            | DecodeError::BadVersion { header }
            | DecodeError::UnknownOp { header }
            | DecodeError::BadReserved { header }
            | DecodeError::BadLength { header, .. }
            | DecodeError::BadBody { header, .. }
            | DecodeError::BadIpVersion { header, .. }
            | DecodeError::BadL4Proto { header, .. }
            | DecodeError::BadAddress { header }
            | DecodeError::RssTooLarge { header, .. }
            | DecodeError::BadRule { header, .. }
            | DecodeError::BadHash { header } => Some(header),
        }
    }

    /// The status of the error completion, or `None` when the frame gets no answer.
    pub fn errno(&self) -> Option<i32> {
        match self {
            DecodeError::TooShort { .. } | DecodeError::NotControl(_) => None,
            DecodeError::BadVersion { .. } => Some(libc::EPROTO),
            DecodeError::UnknownOp { .. } => Some(libc::EOPNOTSUPP),
            DecodeError::BadRule { error: RuleBodyError::IpVersion(_) | RuleBodyError::L4Proto(_), .. } => {
                Some(libc::EPROTONOSUPPORT)
            }
            _ => Some(libc::EINVAL),
        }
    }

    /// Counter name of this kind of error.
    pub fn kind(&self) -> &'static str {
        match self {
            DecodeError::TooShort { .. } => "too_short",
            DecodeError::NotControl(_) => "not_control",
            DecodeError::TruncatedHeader { .. } => "truncated_header",
            DecodeError::BadVersion { .. } => "bad_version",
            DecodeError::UnknownOp { .. } => "unknown_op",
            DecodeError::BadReserved { .. } => "bad_reserved",
            DecodeError::BadLength { .. } => "bad_length",
            DecodeError::BadBody { .. } => "bad_body",
            DecodeError::BadIpVersion { .. } => "bad_ip_version",
            DecodeError::BadL4Proto { .. } => "bad_l4_proto",
            DecodeError::BadAddress { .. } => "bad_address",
            DecodeError::RssTooLarge { .. } => "rss_too_large",
            DecodeError::BadRule { .. } => "bad_rule",
            DecodeError::BadHash { .. } => "bad_hash",
        }
    }
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

/// A parsed Ethernet header of a control frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EthInfo {
    pub dst: [u8; 6],
    pub src: [u8; 6],
    /// Offset of the control header (14, or 18 behind one VLAN tag).
    pub offset: usize,
}

/// The Ethernet part: addresses and where the control header starts.
pub fn eth_info(frame: &[u8]) -> Result<EthInfo, DecodeError> {
    let too_short = DecodeError::TooShort { len: frame.len() };
    if frame.len() < ETH_HLEN {
        return Err(too_short);
    }
    let mut dst = [0u8; 6];
    let mut src = [0u8; 6];
    dst.copy_from_slice(&frame[0..6]);
    src.copy_from_slice(&frame[6..12]);
    let (et, offset) = ethernet::ethertype(frame).ok_or(too_short)?;
    if et != ETHERTYPE {
        return Err(DecodeError::NotControl(et));
    }
    Ok(EthInfo { dst, src, offset })
}

/// Split a control frame into its header and its body (`length - 16` bytes, padding
/// removed). Checks, in the documented order: the 16-byte header is present, version 1 or 2,
/// `16 <= length <= bytes present`, `reserved == 0`. The op is not looked at.
fn split(frame: &[u8]) -> Result<(EthInfo, Header, &[u8]), DecodeError> {
    let eth = eth_info(frame)?;
    let ctl = &frame[eth.offset..];
    let have = ctl.len().min(HDR_LEN);
    let mut h = [0u8; HDR_LEN];
    h[..have].copy_from_slice(&ctl[..have]);
    let mut header = Header::read(&h);
    if have < HDR_LEN {
        if have < 8 {
            // A partly present seq is not echoed.
            header.seq = 0;
        }
        return Err(DecodeError::TruncatedHeader { header, have });
    }
    if !(MIN_VERSION..=VERSION).contains(&header.version) {
        return Err(DecodeError::BadVersion { header });
    }
    let len = usize::from(header.length);
    if len < HDR_LEN || len > ctl.len() {
        return Err(DecodeError::BadLength { header, available: ctl.len() });
    }
    if header.reserved != 0 {
        return Err(DecodeError::BadReserved { header });
    }
    Ok((eth, header, &ctl[HDR_LEN..len]))
}

/// Bodies may be longer than the op needs (the extra bytes are ignored), never shorter.
fn expect_min(header: &Header, body: &[u8], n: usize, expected: &'static str) -> Result<(), DecodeError> {
    if body.len() >= n {
        Ok(())
    } else {
        Err(DecodeError::BadBody { header: *header, got: body.len(), expected })
    }
}

fn expect_len(header: &Header, body: &[u8], n: usize, expected: &'static str) -> Result<(), DecodeError> {
    if body.len() == n {
        Ok(())
    } else {
        Err(DecodeError::BadBody { header: *header, got: body.len(), expected })
    }
}

/// Decode a guest request. Order of checks (docs/control-protocol.md §1.1): Ethernet
/// header and EtherType (else no answer is possible), the 16-byte header, version
/// (EPROTO), length, reserved, then the op (EOPNOTSUPP) and its body (EINVAL).
pub fn decode_request(frame: &[u8]) -> Result<(Header, Request), DecodeError> {
    decode_request_eth(frame).map(|(_, h, r)| (h, r))
}

/// As [`decode_request`], also returning the Ethernet addresses.
pub fn decode_request_eth(frame: &[u8]) -> Result<(EthInfo, Header, Request), DecodeError> {
    let (eth, header, body) = split(frame)?;
    let h = &header;
    let req = match header.op {
        op::HELLO => Request::Hello,
        op::FLUSH => Request::Flush,
        op::DEV_STATS => Request::DevStats,
        // Version 1 has no RSS ops.
        op::RSS_GET if header.version >= 2 => Request::RssGet,
        op::RSS_SET if header.version >= 2 => Request::RssSet(decode_rss_set(h, body)?),
        // Version 3: ethtool ntuple rules.
        op::RULE_SET if header.version >= 3 => {
            expect_min(h, body, RULE_SET_BODY_LEN, ">= 84")?;
            // `flags` and `context` are padding before version 4.
            if header.version < 4 && body[7..8].iter().chain(&body[10..12]).any(|&b| b != 0) {
                return Err(DecodeError::BadRule { header, error: RuleBodyError::Padding });
            }
            Request::RuleSet(RuleSpec::decode(body).map_err(|error| DecodeError::BadRule { header, error })?)
        }
        op::RULE_DEL if header.version >= 3 => {
            expect_min(h, body, RULE_DEL_BODY_LEN, ">= 4")?;
            Request::RuleDel { location: be32(body, 0) }
        }
        // Version 4: RSS contexts.
        op::CTX_SET if header.version >= 4 => {
            expect_min(h, body, CTX_SET_HDR_LEN + RSS_SET_HDR_LEN, ">= 4 + 8 + key_len + 2 * indir_size")?;
            Request::CtxSet { context: be32(body, 0), set: decode_rss_set(h, &body[CTX_SET_HDR_LEN..])? }
        }
        op::CTX_DEL if header.version >= 4 => {
            expect_min(h, body, ID_BODY_LEN, ">= 4")?;
            Request::CtxDel { context: be32(body, 0) }
        }
        op::HASH_GET if header.version >= 3 => Request::HashGet,
        op::HASH_SET if header.version >= 3 => {
            expect_min(h, body, HASH_BODY_LEN, ">= 28")?;
            Request::HashSet(HashMsg::decode(body).map_err(|_| DecodeError::BadHash { header })?)
        }
        op::ADD => {
            expect_min(h, body, ADD_BODY_LEN, ">= 44")?;
            Request::Add(decode_add(h, body)?)
        }
        op::MOD => {
            expect_min(h, body, MOD_BODY_LEN, ">= 8")?;
            Request::Mod { filter_id: be32(body, 0), rxq: be16(body, 4) }
        }
        op::DEL => {
            expect_min(h, body, ID_BODY_LEN, ">= 4")?;
            Request::Del { filter_id: be32(body, 0) }
        }
        op::QUERY => {
            expect_min(h, body, ID_BODY_LEN, ">= 4")?;
            Request::Query { filter_id: be32(body, 0) }
        }
        op::STATS => {
            expect_min(h, body, 4, ">= 4 + 16 * count")?;
            let n = STATS_ENTRY_LEN * usize::from(be16(body, 0));
            expect_min(h, body, 4 + n, ">= 4 + 16 * count")?;
            // `count` is bounded by the frame length checked just above.
            let entries = body[4..4 + n].chunks_exact(STATS_ENTRY_LEN).map(|e| (be16(e, 0), be64(e, 8))).collect();
            Request::Stats(entries)
        }
        _ => return Err(DecodeError::UnknownOp { header }),
    };
    Ok((eth, header, req))
}

/// RSS_SET body: u8 hfunc, u8 pad, u16 key_len, u16 indir_size, u16 pad, the key, then
/// `indir_size` u16 entries. Sizes are checked against the frame and the protocol
/// limits before anything is allocated.
fn decode_rss_set(h: &Header, b: &[u8]) -> Result<RssSet, DecodeError> {
    expect_min(h, b, RSS_SET_HDR_LEN, ">= 8 + key_len + 2 * indir_size")?;
    let key_len = usize::from(be16(b, 2));
    let indir_size = usize::from(be16(b, 4));
    if key_len > RSS_KEY_MAX || indir_size > RSS_INDIR_MAX {
        return Err(DecodeError::RssTooLarge { header: *h, key_len, indir_size });
    }
    expect_min(h, b, RSS_SET_HDR_LEN + key_len + 2 * indir_size, ">= 8 + key_len + 2 * indir_size")?;
    let key = b[RSS_SET_HDR_LEN..RSS_SET_HDR_LEN + key_len].to_vec();
    let at = RSS_SET_HDR_LEN + key_len;
    let indir = b[at..at + 2 * indir_size].chunks_exact(2).map(|e| be16(e, 0)).collect();
    Ok(RssSet { hfunc: b[0], key, indir })
}

fn decode_add(h: &Header, b: &[u8]) -> Result<AddRequest, DecodeError> {
    let filter_id = be32(b, 0);
    let rxq = be16(b, 4);
    let version = match b[6] {
        4 => IpVersion::V4,
        6 => IpVersion::V6,
        value => return Err(DecodeError::BadIpVersion { header: *h, value }),
    };
    let proto = L4Proto::from_number(b[7]).ok_or(DecodeError::BadL4Proto { header: *h, value: b[7] })?;
    let mut src = [0u8; 16];
    let mut dst = [0u8; 16];
    src.copy_from_slice(&b[8..24]);
    dst.copy_from_slice(&b[24..40]);
    if version == IpVersion::V4 && (src[4..].iter().any(|&x| x != 0) || dst[4..].iter().any(|&x| x != 0)) {
        return Err(DecodeError::BadAddress { header: *h });
    }
    let key = FlowKey { version, proto, src, dst, sport: be16(b, 40), dport: be16(b, 42) };
    Ok(AddRequest { filter_id, rxq, key })
}

fn frame_start(dst: [u8; 6], src: [u8; 6], cap: usize) -> Vec<u8> {
    let mut f = Vec::with_capacity(cap.max(MIN_FRAME_LEN));
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ETHERTYPE.to_be_bytes());
    f
}

fn finish_frame(mut f: Vec<u8>, header: Header, body: &[u8]) -> Vec<u8> {
    let length = u16::try_from(HDR_LEN + body.len()).unwrap_or(u16::MAX);
    Header { length, ..header }.write(&mut f);
    f.extend_from_slice(body);
    if f.len() < MIN_FRAME_LEN {
        f.resize(MIN_FRAME_LEN, 0);
    }
    f
}

/// Build a raw control frame with an explicit header (its `length` is computed from the
/// body). Tests use it to make malformed frames.
pub fn encode_raw(dst: [u8; 6], src: [u8; 6], header: Header, body: &[u8]) -> Vec<u8> {
    finish_frame(frame_start(dst, src, ETH_HLEN + HDR_LEN + body.len()), header, body)
}

/// Body bytes of a request.
pub fn request_body(req: &Request) -> Vec<u8> {
    let mut b = Vec::new();
    match req {
        Request::Hello | Request::Flush | Request::DevStats | Request::RssGet | Request::HashGet => {}
        Request::HashSet(m) => m.encode(&mut b),
        Request::CtxSet { context, set } => {
            b.extend_from_slice(&context.to_be_bytes());
            b.extend_from_slice(&request_body(&Request::RssSet(set.clone())));
        }
        Request::CtxDel { context } => b.extend_from_slice(&context.to_be_bytes()),
        Request::RssSet(r) => {
            // Longer keys / tables than a frame may carry are cut to the limits.
            let key = &r.key[..r.key.len().min(RSS_KEY_MAX)];
            let indir = &r.indir[..r.indir.len().min(RSS_INDIR_MAX)];
            b.extend_from_slice(&[r.hfunc, 0]);
            b.extend_from_slice(&(key.len() as u16).to_be_bytes());
            b.extend_from_slice(&(indir.len() as u16).to_be_bytes());
            b.extend_from_slice(&[0, 0]);
            b.extend_from_slice(key);
            for q in indir {
                b.extend_from_slice(&q.to_be_bytes());
            }
        }
        Request::Add(a) => {
            b.extend_from_slice(&a.filter_id.to_be_bytes());
            b.extend_from_slice(&a.rxq.to_be_bytes());
            b.push(match a.key.version {
                IpVersion::V4 => 4,
                IpVersion::V6 => 6,
            });
            b.push(a.key.proto.number());
            b.extend_from_slice(&a.key.src);
            b.extend_from_slice(&a.key.dst);
            b.extend_from_slice(&a.key.sport.to_be_bytes());
            b.extend_from_slice(&a.key.dport.to_be_bytes());
        }
        Request::Mod { filter_id, rxq } => {
            b.extend_from_slice(&filter_id.to_be_bytes());
            b.extend_from_slice(&rxq.to_be_bytes());
            b.extend_from_slice(&[0, 0]);
        }
        Request::Del { filter_id } | Request::Query { filter_id } => b.extend_from_slice(&filter_id.to_be_bytes()),
        Request::RuleSet(r) => r.encode(&mut b),
        Request::RuleDel { location } => b.extend_from_slice(&location.to_be_bytes()),
        Request::Stats(entries) => {
            // A frame cannot carry more than u16::MAX entries; extra ones are left out.
            let n = entries.len().min(usize::from(u16::MAX));
            b.extend_from_slice(&(n as u16).to_be_bytes());
            b.extend_from_slice(&[0, 0]);
            for (id, v) in &entries[..n] {
                b.extend_from_slice(&id.to_be_bytes());
                b.extend_from_slice(&[0; 6]);
                b.extend_from_slice(&v.to_be_bytes());
            }
        }
    }
    b
}

/// Guest side: a request frame from `guest_mac` to the broadcast address.
pub fn encode_request(guest_mac: [u8; 6], seq: u32, req: &Request) -> Vec<u8> {
    let flags = if req.expects_reply() { 0 } else { FLAG_NO_REPLY };
    let header = Header { version: VERSION, op: req.op(), seq, flags, ..Default::default() };
    encode_raw(BROADCAST_MAC, guest_mac, header, &request_body(req))
}

/// What the device announces in HELLO's completion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caps {
    pub queue_pairs: u16,
    /// 0 = per-type tables, 1 = one shared table.
    pub layout: u16,
    /// IPv4/TCP, IPv4/UDP, IPv6/TCP, IPv6/UDP (the shared layout repeats its one capacity).
    pub capacity: [u32; 4],
    /// At most 31 bytes are sent (the field is 32 bytes and always NUL-terminated).
    pub profile: String,
}

pub const LAYOUT_PER_TYPE: u16 = 0;
pub const LAYOUT_SHARED: u16 = 1;

/// Op-specific part of a completion after the timestamps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompletionBody {
    None,
    Caps(Caps),
    /// QUERY: the rule's queue (0xffff for a drop rule) and hit count.
    Query {
        rxq: u16,
        hits: u64,
    },
    /// DEV_STATS: `(id, value)` pairs, at most [`DEV_STATS_MAX_ENTRIES`].
    DevStats(Vec<(u16, u64)>),
    /// RSS_GET: the device's RSS configuration.
    Rss(RssConfig),
    /// HASH_GET: the hash fields per flow type and the input transformation.
    Hash(HashMsg),
}

/// A device completion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompletionMsg {
    /// The request op (without the 0x80 bit; `op::COMPLETION | op` goes on the wire).
    pub req_op: u8,
    pub seq: u32,
    /// 0 or a positive Linux errno.
    pub status: u16,
    pub enqueue_ns: u64,
    pub start_ns: u64,
    pub finish_ns: u64,
    pub body: CompletionBody,
}

/// Device events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventMsg {
    RuleAged { filter_id: u32 },
    TableFlushed,
    EngineState { disabled: bool },
}

impl EventMsg {
    pub fn op(&self) -> u8 {
        match self {
            EventMsg::RuleAged { .. } => op::EV_RULE_AGED,
            EventMsg::TableFlushed => op::EV_TABLE_FLUSHED,
            EventMsg::EngineState { .. } => op::EV_ENGINE_STATE,
        }
    }
}

/// Device side: a completion frame from the device MAC to `guest_mac`.
pub fn encode_completion(guest_mac: [u8; 6], c: &CompletionMsg) -> Vec<u8> {
    encode_completion_version(guest_mac, VERSION, c)
}

/// As [`encode_completion`] with an explicit header version (a version 1 request gets
/// a version 1 answer).
pub fn encode_completion_version(guest_mac: [u8; 6], version: u8, c: &CompletionMsg) -> Vec<u8> {
    let mut b = Vec::with_capacity(TIMESTAMPS_LEN + 8 + 16 + PROFILE_NAME_LEN);
    b.extend_from_slice(&c.enqueue_ns.to_be_bytes());
    b.extend_from_slice(&c.start_ns.to_be_bytes());
    b.extend_from_slice(&c.finish_ns.to_be_bytes());
    match &c.body {
        CompletionBody::None => {}
        CompletionBody::Caps(caps) => {
            b.extend_from_slice(&caps.queue_pairs.to_be_bytes());
            b.extend_from_slice(&caps.layout.to_be_bytes());
            for cap in caps.capacity {
                b.extend_from_slice(&cap.to_be_bytes());
            }
            let mut name = [0u8; PROFILE_NAME_LEN];
            let n = caps.profile.len().min(PROFILE_NAME_LEN - 1);
            name[..n].copy_from_slice(&caps.profile.as_bytes()[..n]);
            b.extend_from_slice(&name);
        }
        CompletionBody::Hash(m) => m.encode(&mut b),
        CompletionBody::Query { rxq, hits } => {
            b.extend_from_slice(&rxq.to_be_bytes());
            b.extend_from_slice(&[0, 0]);
            b.extend_from_slice(&hits.to_be_bytes());
        }
        CompletionBody::DevStats(entries) => {
            let entries = &entries[..entries.len().min(DEV_STATS_MAX_ENTRIES)];
            b.extend_from_slice(&(entries.len() as u16).to_be_bytes());
            b.extend_from_slice(&[0, 0]);
            for &(id, value) in entries {
                b.extend_from_slice(&id.to_be_bytes());
                b.extend_from_slice(&[0; 6]);
                b.extend_from_slice(&value.to_be_bytes());
            }
        }
        CompletionBody::Rss(r) => {
            let key = &r.key[..r.key.len().min(RSS_KEY_MAX)];
            let indir = &r.indir[..r.indir.len().min(RSS_INDIR_MAX)];
            b.extend_from_slice(&[r.hfunc, 0]);
            b.extend_from_slice(&(key.len() as u16).to_be_bytes());
            b.extend_from_slice(&(indir.len() as u16).to_be_bytes());
            b.extend_from_slice(&r.queues.to_be_bytes());
            b.extend_from_slice(key);
            for q in indir {
                b.extend_from_slice(&q.to_be_bytes());
            }
        }
    }
    let header = Header { version, op: op::COMPLETION | c.req_op, seq: c.seq, status: c.status, ..Default::default() };
    encode_raw(guest_mac, DEVICE_MAC, header, &b)
}

/// Device side: an event frame; `seq` is the device's event counter.
pub fn encode_event(guest_mac: [u8; 6], seq: u32, e: &EventMsg) -> Vec<u8> {
    encode_event_version(guest_mac, VERSION, seq, e)
}

/// As [`encode_event`] with an explicit header version.
pub fn encode_event_version(guest_mac: [u8; 6], version: u8, seq: u32, e: &EventMsg) -> Vec<u8> {
    let body: Vec<u8> = match e {
        EventMsg::RuleAged { filter_id } => filter_id.to_be_bytes().to_vec(),
        EventMsg::TableFlushed => Vec::new(),
        EventMsg::EngineState { disabled } => vec![0, u8::from(*disabled), 0, 0],
    };
    let header = Header { version, op: e.op(), seq, ..Default::default() };
    encode_raw(guest_mac, DEVICE_MAC, header, &body)
}

/// A decoded device frame (guest side).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceMsg {
    Completion(CompletionMsg),
    Event { seq: u32, event: EventMsg },
}

/// Guest side: decode a completion or event. Completions with a non-zero status carry
/// only the timestamps; an op-specific part is decoded when present.
pub fn decode_device_frame(frame: &[u8]) -> Result<(Header, DeviceMsg), DecodeError> {
    let (_, header, body) = split(frame)?;
    let h = &header;
    if header.op & op::COMPLETION != 0 {
        if body.len() < TIMESTAMPS_LEN {
            return Err(DecodeError::BadBody { header, got: body.len(), expected: ">= 24" });
        }
        let rest = &body[TIMESTAMPS_LEN..];
        let req_op = header.op & !op::COMPLETION;
        let cbody = match (req_op, rest.len()) {
            (_, 0) => CompletionBody::None,
            (op::HELLO, n) if n == 4 + 16 + PROFILE_NAME_LEN => {
                let name = &rest[20..];
                let end = name.iter().position(|&c| c == 0).unwrap_or(name.len());
                CompletionBody::Caps(Caps {
                    queue_pairs: be16(rest, 0),
                    layout: be16(rest, 2),
                    capacity: std::array::from_fn(|i| be32(rest, 4 + 4 * i)),
                    profile: String::from_utf8_lossy(&name[..end]).into_owned(),
                })
            }
            (op::QUERY, 12) => CompletionBody::Query { rxq: be16(rest, 0), hits: be64(rest, 4) },
            (op::HASH_GET, HASH_BODY_LEN) => {
                CompletionBody::Hash(HashMsg::decode(rest).map_err(|_| DecodeError::BadBody {
                    header,
                    got: body.len(),
                    expected: "HASH_GET reply",
                })?)
            }
            (op::DEV_STATS, n)
                if n >= 4
                    && usize::from(be16(rest, 0)) <= DEV_STATS_MAX_ENTRIES
                    && n == 4 + STATS_ENTRY_LEN * usize::from(be16(rest, 0)) =>
            {
                let entries = rest[4..].chunks_exact(STATS_ENTRY_LEN).map(|e| (be16(e, 0), be64(e, 8))).collect();
                CompletionBody::DevStats(entries)
            }
            (op::RSS_GET, n) if n >= RSS_REPLY_HDR_LEN => {
                let key_len = usize::from(be16(rest, 2));
                let indir_size = usize::from(be16(rest, 4));
                if key_len > RSS_KEY_MAX
                    || indir_size > RSS_INDIR_MAX
                    || n != RSS_REPLY_HDR_LEN + key_len + 2 * indir_size
                {
                    return Err(DecodeError::BadBody { header, got: TIMESTAMPS_LEN + n, expected: "RSS_GET reply" });
                }
                let key = rest[RSS_REPLY_HDR_LEN..RSS_REPLY_HDR_LEN + key_len].to_vec();
                let indir = rest[RSS_REPLY_HDR_LEN + key_len..].chunks_exact(2).map(|e| be16(e, 0)).collect();
                CompletionBody::Rss(RssConfig { hfunc: rest[0], queues: be16(rest, 6), key, indir })
            }
            (_, n) => return Err(DecodeError::BadBody { header, got: TIMESTAMPS_LEN + n, expected: "op specific" }),
        };
        return Ok((
            header,
            DeviceMsg::Completion(CompletionMsg {
                req_op,
                seq: header.seq,
                status: header.status,
                enqueue_ns: be64(body, 0),
                start_ns: be64(body, 8),
                finish_ns: be64(body, 16),
                body: cbody,
            }),
        ));
    }
    let event = match header.op {
        op::EV_RULE_AGED => {
            expect_len(h, body, 4, "4")?;
            EventMsg::RuleAged { filter_id: be32(body, 0) }
        }
        op::EV_TABLE_FLUSHED => {
            expect_len(h, body, 0, "0")?;
            EventMsg::TableFlushed
        }
        op::EV_ENGINE_STATE => {
            expect_len(h, body, 4, "4")?;
            EventMsg::EngineState { disabled: be16(body, 0) != 0 }
        }
        _ => return Err(DecodeError::UnknownOp { header }),
    };
    Ok((header, DeviceMsg::Event { seq: header.seq, event }))
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Request::Hello => write!(f, "HELLO"),
            Request::Add(a) => write!(f, "ADD id={} rxq={} {}", a.filter_id, a.rxq, a.key),
            Request::Mod { filter_id, rxq } => write!(f, "MOD id={filter_id} rxq={rxq}"),
            Request::Del { filter_id } => write!(f, "DEL id={filter_id}"),
            Request::Flush => write!(f, "FLUSH"),
            Request::Stats(e) => write!(f, "STATS ({} counters)", e.len()),
            Request::Query { filter_id } => write!(f, "QUERY id={filter_id}"),
            Request::DevStats => write!(f, "DEV_STATS"),
            Request::RssGet => write!(f, "RSS_GET"),
            Request::RssSet(r) => {
                write!(f, "RSS_SET hfunc={} key={}B indir={} entries", r.hfunc, r.key.len(), r.indir.len())
            }
            Request::RuleSet(r) => write!(f, "RULE_SET {r}"),
            Request::RuleDel { location: super::rule::RULE_LOC_ALL } => write!(f, "RULE_DEL all"),
            Request::RuleDel { location } => write!(f, "RULE_DEL loc {location}"),
            Request::HashGet => write!(f, "HASH_GET"),
            Request::HashSet(m) => write!(f, "HASH_SET {:x?} xfrm {}", m.fields, m.xfrm),
            Request::CtxSet { context, set } => write!(
                f,
                "CTX_SET ctx={context} hfunc={} key={}B indir={} entries",
                set.hfunc,
                set.key.len(),
                set.indir.len()
            ),
            Request::CtxDel { context } => write!(f, "CTX_DEL ctx={context}"),
        }
    }
}

#[cfg(test)]
#[path = "control_tests.rs"]
mod tests;
