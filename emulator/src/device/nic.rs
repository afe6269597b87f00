//! The emulated NIC assembled: the vhost-user backend's hooks wired to the NIC model,
//! the traffic source and the control plane.

use super::clock::Clock;
use super::ports::{
    Burst, ControlPlane, Delivery, DeviceHooks, GuestPeer, GuestRx, RxError, RxHash, ToGuest, MAX_BATCH,
};
use crate::model::nic::{Classifier, Decision, Nic};
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

impl EmulatedNic {
    /// The NIC's verdict on one wire frame before delivery: dropped here (forged control
    /// frame, unparsable, drop filter) with its `Delivery`, or the decision to deliver.
    fn classify_wire(&self, c: &Classifier<'_>, frame: &[u8], now_ns: u64) -> Result<Decision, Delivery> {
        let none = Delivery { queue: None, delivered: false, filter: None };
        if is_spoofed_control(frame) {
            self.counters.rx_spoofed_dropped.fetch_add(1, Relaxed);
            crate::warn_ratelimited!(
                "device: wire frame that could pass for a control frame dropped (counted in rx_spoofed_dropped)"
            );
            return Err(none);
        }
        let Ok(d) = c.decide_frame(frame, now_ns) else {
            self.counters.rx_errors.fetch_add(1, Relaxed);
            return Err(none);
        };
        if d.queue.is_none() {
            self.nic.record(&d, frame.len(), false);
            return Err(Delivery { filter: d.filter, ..none });
        }
        Ok(d)
    }

    /// Counts what became of a frame the NIC chose queue `q` for.
    fn delivered(&self, d: &Decision, q: u16, len: usize, r: Option<&Result<(), RxError>>) -> Delivery {
        let delivered = match r {
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
        self.nic.record(d, len, delivered);
        Delivery { queue: Some(q), delivered, filter: d.filter }
    }
}

impl ToGuest for EmulatedNic {
    fn to_guest(&self, frame: &[u8]) -> Delivery {
        let d = match self.classify_wire(&self.nic.classifier(), frame, self.clock.now_ns()) {
            Ok(d) => d,
            Err(done) => return done,
        };
        let q = d.queue.unwrap_or_default();
        let r = self.rx.get().map(|rx| {
            let mut res = [Ok(())];
            rx.deliver_batch(q, &[frame], &[d.rss.hash], &mut res);
            let [r] = res;
            r
        });
        self.delivered(&d, q, frame.len(), r.as_ref())
    }

    /// One clock read for the batch; the frames of each queue go to the guest in one
    /// `deliver_batch` (one ring lock, one `used.idx` publication, one interrupt decision),
    /// in their order within the batch.
    fn to_guest_batch(&self, frames: &[&[u8]], out: &mut [Delivery]) {
        let n = frames.len().min(out.len()).min(MAX_BATCH);
        let now = self.clock.now_ns();
        let mut dec: [Option<Decision>; MAX_BATCH] = [None; MAX_BATCH];
        let c = self.nic.classifier();
        for i in 0..n {
            match self.classify_wire(&c, frames[i], now) {
                Ok(d) => dec[i] = Some(d),
                Err(done) => out[i] = done,
            }
        }
        let rx = self.rx.get();
        let mut idx = [0usize; MAX_BATCH];
        let mut group: [&[u8]; MAX_BATCH] = [&[]; MAX_BATCH];
        let mut hashes: [RxHash; MAX_BATCH] = [None; MAX_BATCH];
        let mut res: [Result<(), RxError>; MAX_BATCH] = [const { Ok(()) }; MAX_BATCH];
        for i in 0..n {
            let Some(q) = dec[i].and_then(|d| d.queue) else { continue };
            // Gather the rest of the batch's frames for queue q (taking them out of `dec`).
            let mut m = 0;
            for j in i..n {
                if let Some(d) = dec[j].filter(|d| d.queue == Some(q)) {
                    idx[m] = j;
                    group[m] = frames[j];
                    hashes[m] = d.rss.hash;
                    m += 1;
                    out[j] = Delivery { queue: Some(q), delivered: false, filter: d.filter };
                }
            }
            if let Some(rx) = rx {
                rx.deliver_batch(q, &group[..m], &hashes[..m], &mut res[..m]);
            }
            // Delivered frames are counted together; the rest one by one.
            let (mut ok, mut bytes, mut via_filter) = (0u64, 0u64, 0u64);
            for k in 0..m {
                let j = idx[k];
                let Some(d) = dec[j].take() else { continue };
                if rx.is_some() && res[k].is_ok() {
                    ok += 1;
                    bytes += frames[j].len() as u64;
                    via_filter += u64::from(d.filter.is_some() || d.rule.is_some());
                    out[j] = Delivery { queue: Some(q), delivered: true, filter: d.filter };
                } else {
                    out[j] = self.delivered(&d, q, frames[j].len(), rx.map(|_| &res[k]));
                }
            }
            self.nic.record_delivered(q, ok, bytes, via_filter);
        }
    }
}

impl EmulatedNic {
    /// A frame of the in-band control protocol from the guest: to the control plane.
    /// Returns false for a data frame.
    fn tx_control(&self, pair: u16, frame: &[u8]) -> bool {
        if ethertype(frame).map(|(et, _)| et) != Some(CONTROL_ETHERTYPE) {
            return false;
        }
        self.counters.control_frames.fetch_add(1, Relaxed);
        let c = crate::sync::read(&self.control).clone();
        if let Some(c) = c {
            c.on_control_frame(pair, frame);
        }
        true
    }
}

impl DeviceHooks for EmulatedNic {
    fn on_tx(&self, pair: u16, frame: &[u8]) {
        if self.tx_control(pair, frame) {
            return;
        }
        self.counters.data_frames_tx.fetch_add(1, Relaxed);
        if let Some(p) = self.peer() {
            p.from_guest(pair, frame);
        }
    }

    /// Control frames go to the control plane as they come; the data frames of the burst
    /// go to the peer as one burst of their own, counted once.
    fn on_tx_burst(&self, pair: u16, burst: &mut Burst<'_>) {
        let mut data = 0u64;
        match self.peer() {
            Some(p) => p.from_guest_burst(pair, &mut |sink| {
                burst(&mut |frame| {
                    if !self.tx_control(pair, frame) {
                        data += 1;
                        sink(frame);
                    }
                })
            }),
            None => burst(&mut |frame| {
                if !self.tx_control(pair, frame) {
                    data += 1;
                }
            }),
        }
        if data > 0 {
            self.counters.data_frames_tx.fetch_add(data, Relaxed);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::profile::Profile;
    use std::sync::Mutex;

    /// A guest with room for `cap` frames per queue, recording what it got.
    struct Capture {
        got: Mutex<Vec<Vec<Vec<u8>>>>,
        cap: usize,
    }
    impl GuestRx for Capture {
        fn deliver(&self, pair: u16, frame: &[u8]) -> Result<(), RxError> {
            let mut g = self.got.lock().unwrap();
            let q = g.get_mut(usize::from(pair)).ok_or(RxError::NoSuchQueue)?;
            if q.len() >= self.cap {
                return Err(RxError::NoBuffers);
            }
            q.push(frame.to_vec());
            Ok(())
        }
        fn enabled_pairs(&self) -> Vec<bool> {
            vec![true; 4]
        }
    }

    fn nic() -> (Arc<EmulatedNic>, Arc<Capture>) {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let profile = Profile::load(&root.join("configs/mlx5-cx6.toml")).unwrap();
        let emu = EmulatedNic::new(Arc::new(Nic::new(&profile, 4).unwrap()), Clock::new());
        let cap = Arc::new(Capture { got: Mutex::new(vec![Vec::new(); 4]), cap: 20 });
        emu.attach_rx(cap.clone());
        (emu, cap)
    }

    #[test]
    fn a_batch_goes_where_single_frames_go_in_the_same_order() {
        let mut frames: Vec<Vec<u8>> = (0..150u16)
            .map(|i| {
                let mut v = Vec::new();
                etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [0x52, 0x54, 0, 0x12, 0x34, 0x56])
                    .ipv4([10, 1, (i >> 8) as u8, i as u8], [10, 2, 0, 1], 64)
                    .udp(1000 + i, 80)
                    .write(&mut v, &i.to_le_bytes())
                    .unwrap();
                v
            })
            .collect();
        frames[7] = vec![0u8; 5]; // unparsable
        frames[9][12..14].copy_from_slice(&crate::wire::CONTROL_ETHERTYPE.to_be_bytes()); // forged control frame
        let (one, cap1) = nic();
        let (batch, cap2) = nic();
        let single: Vec<Delivery> = frames.iter().map(|f| one.to_guest(f)).collect();
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let mut batched = vec![Delivery { queue: None, delivered: false, filter: None }; frames.len()];
        for (c, o) in refs.chunks(MAX_BATCH).zip(batched.chunks_mut(MAX_BATCH)) {
            batch.to_guest_batch(c, o);
        }
        assert_eq!(single, batched);
        assert_eq!(*cap1.got.lock().unwrap(), *cap2.got.lock().unwrap());
        // Every queue filled up, so both delivered and refused frames are compared.
        assert!(single.iter().any(|d| d.queue.is_some() && !d.delivered));
        let delivered = single.iter().filter(|d| d.delivered).count();
        assert_eq!(delivered, cap1.got.lock().unwrap().iter().map(Vec::len).sum::<usize>());
        assert!(delivered > 60, "{delivered}");
        assert_eq!(one.counters.rx_errors.load(Relaxed), batch.counters.rx_errors.load(Relaxed));
        assert_eq!(batch.counters.rx_spoofed_dropped.load(Relaxed), 1);
        let (s1, s2) = (one.nic.snapshot(), batch.nic.snapshot());
        assert_eq!(s1.queues, s2.queues);
        // More than MAX_BATCH frames: the rest is left alone.
        let mut out = vec![Delivery { queue: Some(9), delivered: true, filter: None }; MAX_BATCH + 1];
        let many = vec![refs[0]; MAX_BATCH + 1];
        batch.to_guest_batch(&many, &mut out);
        assert_eq!(out[MAX_BATCH], Delivery { queue: Some(9), delivered: true, filter: None });
    }

    /// A peer recording the guest's frames and how many bursts they came in.
    #[derive(Default)]
    struct Rec {
        frames: Mutex<Vec<(u16, Vec<u8>)>>,
        bursts: AtomicU64,
    }
    impl GuestPeer for Rec {
        fn from_guest(&self, pair: u16, frame: &[u8]) {
            self.frames.lock().unwrap().push((pair, frame.to_vec()));
        }
        fn from_guest_burst(&self, pair: u16, burst: &mut Burst<'_>) {
            self.bursts.fetch_add(1, Relaxed);
            burst(&mut |f| self.from_guest(pair, f));
        }
    }

    #[test]
    fn a_tx_burst_reaches_the_peer_as_single_frames_do() {
        // Data frames, and two control frames (no control plane attached: counted, dropped).
        let mut frames: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 60]).collect();
        for i in [2, 7] {
            frames[i][12..14].copy_from_slice(&CONTROL_ETHERTYPE.to_be_bytes());
        }
        let (one, _) = nic();
        let (batch, _) = nic();
        let (r1, r2) = (Arc::new(Rec::default()), Arc::new(Rec::default()));
        one.set_peer(Some(r1.clone()));
        batch.set_peer(Some(r2.clone()));
        for f in &frames {
            one.on_tx(3, f);
        }
        batch.on_tx_burst(3, &mut |sink| frames.iter().for_each(|f| sink(f)));
        assert_eq!(*r1.frames.lock().unwrap(), *r2.frames.lock().unwrap());
        assert_eq!(r2.frames.lock().unwrap().len(), 8);
        assert_eq!((r1.bursts.load(Relaxed), r2.bursts.load(Relaxed)), (0, 1));
        for (a, b) in [
            (&one.counters.data_frames_tx, &batch.counters.data_frames_tx),
            (&one.counters.control_frames, &batch.counters.control_frames),
        ] {
            assert_eq!(a.load(Relaxed), b.load(Relaxed));
        }
        assert_eq!(batch.counters.control_frames.load(Relaxed), 2);
        // Without a peer the burst is still taken and counted.
        batch.set_peer(None);
        batch.on_tx_burst(3, &mut |sink| frames.iter().for_each(|f| sink(f)));
        assert_eq!(batch.counters.data_frames_tx.load(Relaxed), 16);
    }
}
