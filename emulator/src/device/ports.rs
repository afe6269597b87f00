//! The device's boundary: the traits through which the layers above plug into the
//! emulated NIC. The vhost-user adapter implements [`GuestRx`] and calls [`DeviceHooks`];
//! a traffic source implements [`GuestPeer`] and calls [`ToGuest`]; the control runtime
//! implements [`ControlPlane`]. Nothing here knows vrings, sockets or QEMU.

use crate::model::rss::HashKind;

/// The RSS hash of a received frame and the kind of input it was computed over (`None`:
/// the frame was not hashed).
pub type RxHash = Option<(u32, HashKind)>;

/// A burst of frames handed over one at a time: called with a sink, it calls the sink once
/// per frame. The frames may share one buffer, so none outlives its call.
pub type Burst<'a> = dyn FnMut(&mut dyn FnMut(&[u8])) + 'a;

/// Implemented by the upper layers (NIC model + traffic). Called from the backend's threads.
pub trait DeviceHooks: Send + Sync + 'static {
    /// One frame the guest transmitted on TX vring of queue pair `pair` (virtio-net header
    /// already stripped). Called from the worker thread owning that pair, with that TX vring
    /// locked: it may call `GuestRx::deliver` (RX vrings have their own locks) but should not
    /// block for long.
    fn on_tx(&self, pair: u16, frame: &[u8]);
    /// The frames of one TX batch of queue pair `pair`, in ring order: `burst` calls the
    /// sink it is given once per frame (each frame borrowed for that call only), so the
    /// hooks can take per-burst state — a classifier, a clock read, counters — once. Same
    /// thread and locking as [`DeviceHooks::on_tx`], which the default calls per frame.
    fn on_tx_burst(&self, pair: u16, burst: &mut Burst<'_>) {
        burst(&mut |frame| self.on_tx(pair, frame));
    }
    /// The guest enabled/disabled queue pair `pair` (SET_VRING_ENABLE on its vrings, e.g. from
    /// `ethtool -L`). A pair counts as enabled when both its RX and TX vrings are enabled.
    fn on_queue_state(&self, pair: u16, enabled: bool);
    /// Driver became ready (memory mapped, at least one pair enabled and all vrings of enabled
    /// pairs started) / device went away (reset, GET_VRING_BASE, disconnect).
    fn on_link(&self, up: bool);
}

/// Why `GuestRx::deliver` did not put a frame into the guest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RxError {
    /// The RX vring has not enough available buffers (the caller counts the drop).
    #[error("no RX buffers available")]
    NoBuffers,
    /// No frontend, no memory table, or the RX vring is not started.
    #[error("RX queue not ready")]
    NotReady,
    /// The guest disabled this queue pair.
    #[error("RX queue disabled by the guest")]
    QueueDisabled,
    /// Frame larger than `MAX_FRAME`, or (without MRG_RXBUF) than the next buffer.
    #[error("frame too large")]
    TooLarge,
    /// `pair` is not below the number of queue pairs.
    #[error("no such queue pair")]
    NoSuchQueue,
    /// The guest's ring or buffers are malformed (counted as a descriptor error).
    #[error("guest memory / descriptor error: {0}")]
    Memory(String),
}

/// The guest's receive side as the device sees it: put one frame into an RX queue. The
/// vhost-user adapter's `RxPort` implements it; tests implement it with a capture.
pub trait GuestRx: Send + Sync + 'static {
    /// Writes `frame` (an Ethernet frame, no virtio header) into the RX queue of `pair`.
    /// Never blocks on the guest.
    fn deliver(&self, pair: u16, frame: &[u8]) -> Result<(), RxError>;
    /// Writes `frames` into the RX queue of `pair` in order; `out[i]` (`out` at least as long
    /// as `frames`) is what `deliver` would have returned for `frames[i]`. The vhost-user
    /// adapter publishes the whole batch at once and decides on one interrupt for it.
    /// `hashes[i]`, when given, is the RSS hash the NIC computed for `frames[i]`: reported to a
    /// guest that asked for it (virtio-net `HASH_REPORT`), ignored otherwise.
    fn deliver_batch(&self, pair: u16, frames: &[&[u8]], hashes: &[RxHash], out: &mut [Result<(), RxError>]) {
        let _ = hashes;
        for (f, o) in frames.iter().zip(out.iter_mut()) {
            *o = self.deliver(pair, f);
        }
    }
    /// Per pair: enabled by the guest.
    fn enabled_pairs(&self) -> Vec<bool>;
}

/// Receives the guest's control frames (EtherType 0x88B5) from any TX queue.
pub trait ControlPlane: Send + Sync + 'static {
    fn on_control_frame(&self, pair: u16, frame: &[u8]);
    /// A new driver instance started on the device (link came up after being down):
    /// forget everything the previous one set up.
    fn on_device_reset(&self) {}
}

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
    /// `to_guest` for up to [`MAX_BATCH`] frames at once (more are refused: `out` untouched
    /// past them); `out[i]` is the delivery of `frames[i]`.
    #[allow(clippy::wrong_self_convention)]
    fn to_guest_batch(&self, frames: &[&[u8]], out: &mut [Delivery]) {
        for (f, o) in frames.iter().zip(out.iter_mut()) {
            *o = self.to_guest(f);
        }
    }
}

/// Most frames one `to_guest_batch` call takes.
pub const MAX_BATCH: usize = 64;

/// What a traffic source gets from the NIC: the guest's transmitted data frames
/// (control frames never reach it) and link state.
pub trait GuestPeer: Send + Sync + 'static {
    #[allow(clippy::wrong_self_convention)] // "from the guest", not a conversion
    fn from_guest(&self, pair: u16, frame: &[u8]);
    /// The data frames of one TX batch (see [`DeviceHooks::on_tx_burst`]); the default
    /// calls [`GuestPeer::from_guest`] per frame.
    #[allow(clippy::wrong_self_convention)]
    fn from_guest_burst(&self, pair: u16, burst: &mut Burst<'_>) {
        burst(&mut |frame| self.from_guest(pair, frame));
    }
    fn link(&self, _up: bool) {}
}
