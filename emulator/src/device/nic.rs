//! The emulated NIC assembled: the vhost-user backend's hooks wired to the NIC model,
//! the traffic source and the control plane.

use super::clock::Clock;
use super::ports::{ControlPlane, Delivery, DeviceHooks, GuestPeer, GuestRx, RxError, ToGuest};
use crate::model::nic::Nic;
use crate::wire::control::DEVICE_MAC;
use crate::wire::ethernet::{ethertype, innermost_ethertype, source_mac, MacAddr};
use crate::wire::CONTROL_ETHERTYPE;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock, RwLock};

/// Counters of the glue itself.
#[derive(Default, Debug)]
pub struct GlueCounters {
    pub control_frames: AtomicU64,
    pub data_frames_tx: AtomicU64,
    pub rx_not_ready: AtomicU64,
    pub rx_errors: AtomicU64,
    /// Wire-side frames dropped because they could pass for the device's control path:
    /// the control EtherType (behind any VLAN tags) or the device's MAC as source.
    pub rx_spoofed_dropped: AtomicU64,
    /// Device resets: the link came up after being down (a new driver instance: guest
    /// boot or reboot, a new frontend). Each empties the filter table, restarts the
    /// command engine and returns RSS to the profile's configuration.
    pub device_resets: AtomicU64,
}

/// Whether a frame from the wire could pass for one of the device's control frames.
/// Only the device sends those; from the wire they are forgeries.
pub fn is_spoofed_control(frame: &[u8]) -> bool {
    innermost_ethertype(frame) == Some(CONTROL_ETHERTYPE) || source_mac(frame) == Some(MacAddr(DEVICE_MAC))
}

pub struct EmulatedNic {
    pub nic: Arc<Nic>,
    pub clock: Clock,
    rx: OnceLock<Arc<dyn GuestRx>>,
    peer: RwLock<Option<Arc<dyn GuestPeer>>>,
    control: RwLock<Option<Arc<dyn ControlPlane>>>,
    link_up: std::sync::atomic::AtomicBool,
    /// Data counters at the last device reset (DEV_STATS reports the growth since).
    reset_base: std::sync::Mutex<super::control::DataCounters>,
    pub counters: GlueCounters,
}

impl EmulatedNic {
    pub fn new(nic: Arc<Nic>, clock: Clock) -> Arc<Self> {
        Arc::new(EmulatedNic {
            nic,
            clock,
            rx: OnceLock::new(),
            peer: RwLock::new(None),
            control: RwLock::new(None),
            link_up: std::sync::atomic::AtomicBool::new(false),
            reset_base: std::sync::Mutex::new(Default::default()),
            counters: GlueCounters::default(),
        })
    }

    /// Connect the backend's RX port (once, after the backend exists).
    pub fn attach_rx(&self, rx: Arc<dyn GuestRx>) {
        let _ = self.rx.set(rx);
    }

    /// Plug in (or replace, between runs) the traffic source.
    pub fn set_peer(&self, peer: Option<Arc<dyn GuestPeer>>) {
        *crate::sync::write(&self.peer) = peer;
    }

    /// Plug in (or replace, between runs) the control plane.
    pub fn set_control(&self, c: Option<Arc<dyn ControlPlane>>) {
        *crate::sync::write(&self.control) = c;
    }

    fn peer(&self) -> Option<Arc<dyn GuestPeer>> {
        crate::sync::read(&self.peer).clone()
    }

    fn data_counters(&self) -> super::control::DataCounters {
        super::control::DataCounters {
            rx_spoofed_dropped: self.counters.rx_spoofed_dropped.load(Relaxed),
            rx_packets: self.nic.snapshot().queues.iter().map(|q| q.rx_packets).sum(),
            rx_not_ready: self.counters.rx_not_ready.load(Relaxed),
        }
    }

    /// The data path's counters since the last device reset.
    pub fn data_counters_since_reset(&self) -> super::control::DataCounters {
        let now = self.data_counters();
        let base = *crate::sync::lock(&self.reset_base);
        super::control::DataCounters {
            rx_spoofed_dropped: now.rx_spoofed_dropped.saturating_sub(base.rx_spoofed_dropped),
            rx_packets: now.rx_packets.saturating_sub(base.rx_packets),
            rx_not_ready: now.rx_not_ready.saturating_sub(base.rx_not_ready),
        }
    }

    /// Put a device-generated frame (control completion, event) on queue `pair`,
    /// bypassing classification; falls back to the lowest enabled queue when that one
    /// is disabled.
    pub fn send_control(&self, pair: u16, frame: &[u8]) -> Result<u16, RxError> {
        let rx = self.rx.get().ok_or(RxError::NotReady)?;
        let enabled = rx.enabled_pairs();
        let q = if enabled.get(usize::from(pair)).copied().unwrap_or(false) {
            pair
        } else {
            enabled.iter().position(|&e| e).ok_or(RxError::NotReady)? as u16
        };
        let r = rx.deliver(q, frame);
        self.nic.record_control(q, frame.len(), r.is_ok());
        r.map(|_| q)
    }
}

impl ToGuest for EmulatedNic {
    fn to_guest(&self, frame: &[u8]) -> Delivery {
        if is_spoofed_control(frame) {
            self.counters.rx_spoofed_dropped.fetch_add(1, Relaxed);
            crate::warn_ratelimited!(
                "device: wire frame that could pass for a control frame dropped (counted in rx_spoofed_dropped)"
            );
            return Delivery { queue: None, delivered: false, filter: None };
        }
        let Ok((_, d)) = self.nic.classify_frame(frame, self.clock.now_ns()) else {
            self.counters.rx_errors.fetch_add(1, Relaxed);
            return Delivery { queue: None, delivered: false, filter: None };
        };
        let Some(q) = d.queue else {
            self.nic.record(&d, frame.len(), false);
            return Delivery { queue: None, delivered: false, filter: d.filter };
        };
        let delivered = match self.rx.get().map(|rx| rx.deliver(q, frame)) {
            Some(Ok(())) => true,
            Some(Err(RxError::NoBuffers)) => false,
            Some(Err(RxError::NotReady | RxError::QueueDisabled)) | None => {
                self.counters.rx_not_ready.fetch_add(1, Relaxed);
                return Delivery { queue: Some(q), delivered: false, filter: d.filter };
            }
            Some(Err(_)) => {
                self.counters.rx_errors.fetch_add(1, Relaxed);
                false
            }
        };
        self.nic.record(&d, frame.len(), delivered);
        Delivery { queue: Some(q), delivered, filter: d.filter }
    }
}

impl DeviceHooks for EmulatedNic {
    fn on_tx(&self, pair: u16, frame: &[u8]) {
        if ethertype(frame).map(|(et, _)| et) == Some(CONTROL_ETHERTYPE) {
            self.counters.control_frames.fetch_add(1, Relaxed);
            let c = crate::sync::read(&self.control).clone();
            if let Some(c) = c {
                c.on_control_frame(pair, frame);
            }
            return;
        }
        self.counters.data_frames_tx.fetch_add(1, Relaxed);
        if let Some(p) = self.peer() {
            p.from_guest(pair, frame);
        }
    }

    fn on_queue_state(&self, _pair: u16, _enabled: bool) {
        if let Some(rx) = self.rx.get() {
            self.nic.set_enabled_queues(&rx.enabled_pairs());
        }
    }

    fn on_link(&self, up: bool) {
        let was_up = self.link_up.swap(up, Relaxed);
        if let Some(rx) = self.rx.get() {
            if up && !was_up {
                // A new driver instance: a fresh device for it (state is kept across the
                // down period, so reports read after QEMU exits still see it).
                self.counters.device_resets.fetch_add(1, Relaxed);
                *crate::sync::lock(&self.reset_base) = self.data_counters();
                self.nic.reset_rss(&rx.enabled_pairs());
                let c = crate::sync::read(&self.control).clone();
                if let Some(c) = c {
                    c.on_device_reset();
                }
            } else {
                self.nic.set_enabled_queues(&rx.enabled_pairs());
            }
        }
        if let Some(p) = self.peer() {
            p.link(up);
        }
    }
}
