//! Traffic sources: what sits on the other end of the emulated wire. The built-in link
//! partner (default) or a host tap device. Both talk to the NIC through two small
//! traits, so the NIC never knows which one is plugged in.

pub mod partner;
pub mod tap;

pub use partner::{LinkPartner, LinkStats, PartnerConfig};
pub use tap::TapPeer;

/// The result of offering one frame to the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// RX queue the NIC chose (None: a drop filter matched).
    pub queue: Option<u16>,
    /// Whether the frame reached the guest (false: drop filter, no buffers, link down).
    pub delivered: bool,
    /// Id of the filter that steered it.
    pub filter: Option<u32>,
}

/// The NIC's receive side as a traffic source sees it: classify and deliver one frame.
pub trait ToGuest: Send + Sync + 'static {
    #[allow(clippy::wrong_self_convention)] // "to the guest", not a conversion
    fn to_guest(&self, frame: &[u8]) -> Delivery;
}

/// What a traffic source gets from the NIC: the guest's transmitted data frames
/// (control frames never reach it) and link state.
pub trait GuestPeer: Send + Sync + 'static {
    #[allow(clippy::wrong_self_convention)] // "from the guest", not a conversion
    fn from_guest(&self, pair: u16, frame: &[u8]);
    fn link(&self, _up: bool) {}
}
