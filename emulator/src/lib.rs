//! arfsnic: a multiqueue NIC emulator with RSS, an aRFS ntuple filter table and
//! firmware-like command latency, served to QEMU over vhost-user.
//!
//! Layers, bottom up: [`wire`] (frame formats) → [`model`] (RSS, filter table, command
//! engine, counters; no vhost imports) → `vhost` (vhost-user adapter) → traffic
//! sources → reports.

pub mod baseline;
pub mod cli;
pub mod demo;
pub mod device;
pub mod model;
pub mod report;
pub mod results;
pub mod runner;
pub mod scenario;
pub mod traffic;
pub mod vhost;
pub mod wire;
