//! The NIC model: RSS, the ntuple filter table, the firmware command engine and the
//! counters. No vhost code here; everything is testable alone and driven by explicit
//! timestamps (nanoseconds on a caller-chosen clock).

pub mod engine;
pub mod errno;
pub mod filter;
pub mod latency;
pub mod nic;
pub mod ntuple;
pub mod profile;
pub mod rss;
