//! The emulated NIC assembled, with no vhost-user or traffic code: [`EmulatedNic`] joins
//! the NIC model to whatever delivers frames to the guest ([`GuestRx`]) and whatever sits
//! on the wire ([`GuestPeer`]); [`ControlRuntime`] turns decoded control frames into
//! engine commands and completions/events back into frames; [`guest`] keeps the driver's
//! counters from its STATS frames; [`snapshot`] holds the counter structs the report is
//! made of; [`clock`] is the device clock every timestamp comes from; `backlog` holds control frames
//! that found no RX buffer until the guest posts one.
//!
//! The layers above plug in through [`ports`]: the vhost-user adapter implements
//! [`GuestRx`] and calls [`DeviceHooks`]; traffic sources implement [`GuestPeer`] and call
//! [`ToGuest`].

mod backlog;
pub mod clock;
pub mod control;
pub mod guest;
pub mod nic;
pub mod ports;
pub mod snapshot;

pub use clock::Clock;
pub use control::{ControlRuntime, ControlSink, Schedule};
pub use nic::EmulatedNic;
pub use ports::{Burst, ControlPlane, Delivery, DeviceHooks, GuestPeer, GuestRx, RxError, RxHash, ToGuest, MAX_BATCH};
