//! Traffic sources: what sits on the other end of the emulated wire. The built-in link
//! partner (default), a host tap device, or a packet generator for throughput benchmarks. Both talk to the NIC through two small
//! traits, so the NIC never knows which one is plugged in.

pub mod partner;
pub mod pktgen;
pub mod remote;
pub mod tap;

pub use crate::device::{Burst, Delivery, GuestPeer, ToGuest};
