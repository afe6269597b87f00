//! Wire formats: what the NIC needs to know about a frame (parsing) and frames the
//! device builds itself (link partner traffic, control completions).
//!
//! Header validation is done by `etherparse`, behind a hand-written fast path for the
//! common frames that gives the same answers (`parse`); this module decides which fields
//! feed RSS and the filter table. Measured cost is in `docs/performance.md`.

pub mod control;
pub mod echo;
pub mod ethernet;
pub mod flow;
pub mod hash;
pub mod parse;
pub mod rule;

pub use ethernet::MacAddr;
pub use flow::{FlowKey, FlowSpecError, IpVersion, L4Proto};
pub use parse::{parse_frame, Ip, L4Ports, PacketInfo, ParseError, CONTROL_ETHERTYPE};
