//! arfsnic: a multiqueue NIC emulator with RSS, an aRFS ntuple filter table and
//! firmware-like command latency, served to QEMU over vhost-user.
//!
//! Layers, bottom up; each imports only those below it (`tests/layers.rs` checks it):
//! [`wire`] (bytes ↔ typed values) → [`model`] (RSS, filter table, command engine) →
//! [`device`] (the emulated NIC assembled, control runtime) → [`vhost`] (vhost-user
//! adapter) and [`traffic`] (link partner, tap) → [`report`]'s [`report::schema`] (the
//! typed run report) → [`runner`] (scenarios, QEMU, one run, the demo) → the rest of
//! [`report`] (tables, chart, compare) and [`cli`]. [`twin`] (model mode: the
//! discrete-event twin of RFS/aRFS on the real device model) sits beside the runner. docs/architecture.md draws it.
//! [`sync`] and [`ratelimit`] import nothing of the crate and serve every layer.

pub mod cli;
pub mod device;
pub mod model;
pub mod ratelimit;
pub mod report;
pub mod runner;
pub mod sync;
pub mod traffic;
pub mod twin;
pub mod vhost;
pub mod wire;
