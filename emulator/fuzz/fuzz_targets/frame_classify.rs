//! Arbitrary bytes as an Ethernet frame from the wire: the frame parser (`wire::parse`), the
//! hand-read Ethernet helpers (`wire::ethernet`), the spoof check (`device::nic`), the NIC's
//! classification (`model::nic::Nic::classify_frame` and `Classifier::decide_frame`, RSS and the ntuple table) and the
//! whole receive path of the emulated NIC (`EmulatedNic::to_guest`) with a guest that takes
//! every frame. The NIC is built once from configs/mlx5-cx6.toml.
//!
//! Input: the frame, byte for byte. When the frame parses to a TCP/UDP flow, a rule for that
//! flow is installed first (the last byte picks a queue beyond the device, a drop rule or
//! a real queue), so the filter paths are reached too.
//!
//! Property: no panic, the NIC's answers stay inside the device (a queue below the
//! number of queues; spoofed frames never delivered), and `Classifier::decide_frame` (the
//! datapath's call) decides as `classify_frame`.

#![no_main]

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, LazyLock};

use arfsnic::device::nic::is_spoofed_control;
use arfsnic::device::{Clock, EmulatedNic, GuestRx, RxError, ToGuest};
use arfsnic::model::filter::Action;
use arfsnic::model::nic::Nic;
use arfsnic::model::profile::Profile;
use arfsnic::wire::{ethernet, parse_frame, CONTROL_ETHERTYPE};
use libfuzzer_sys::fuzz_target;

const PROFILE: &str = include_str!("../../../configs/mlx5-cx6.toml");

/// A guest with every queue enabled that accepts every frame (and counts them).
#[derive(Default)]
struct Sink(AtomicU64);

impl GuestRx for Sink {
    fn deliver(&self, _pair: u16, _frame: &[u8]) -> Result<(), RxError> {
        self.0.fetch_add(1, Relaxed);
        Ok(())
    }
    fn enabled_pairs(&self) -> Vec<bool> {
        vec![true; 4]
    }
}

struct World {
    nic: Arc<EmulatedNic>,
    sink: Arc<Sink>,
}

static WORLD: LazyLock<World> = LazyLock::new(|| {
    let profile = Profile::parse(PROFILE).expect("configs/mlx5-cx6.toml parses");
    let nic = Nic::new(&profile, profile.device.queues).expect("NIC from the profile");
    let nic = EmulatedNic::new(Arc::new(nic), Clock::new());
    let sink = Arc::new(Sink::default());
    nic.attach_rx(sink.clone());
    World { nic, sink }
});

fuzz_target!(|frame: &[u8]| {
    let w = &*WORLD;
    let nic = &w.nic.nic;
    let queues = nic.num_queues();

    // The hand-read helpers.
    let _ = ethernet::ethertype(frame);
    let inner = ethernet::innermost_ethertype(frame);
    let src = ethernet::source_mac(frame);
    let spoofed = is_spoofed_control(frame);
    assert_eq!(
        spoofed,
        inner == Some(CONTROL_ETHERTYPE) || src.map(|m| m.0) == Some(arfsnic::wire::control::DEVICE_MAC)
    );

    // The parser and the NIC model.
    let parsed = parse_frame(frame);
    if let Ok(info) = &parsed {
        let _ = info.ip_version();
        let _ = info.is_control();
        if let Some(key) = info.flow_key() {
            let action = match frame.last().copied().unwrap_or(0) % 4 {
                0 => Action::Drop,
                1 => Action::Queue(queues + u16::from(frame[0])),
                _ => Action::Queue(u16::from(frame[0]) % queues),
            };
            // Keep the table small: one rule id per low byte of the source port.
            let id = u32::from(key.sport & 0xff);
            let _ = nic.table().delete(id);
            let _ = nic.table().insert(id, key, action, 0);
        }
    }
    match nic.classify_frame(frame, 1) {
        Ok((info, d)) => {
            assert_eq!(Ok(info), parsed);
            if let Some(q) = d.queue {
                assert!(q < queues, "classify chose queue {q} of {queues}");
            }
            assert!(d.rss.queue < queues, "RSS chose queue {} of {queues}", d.rss.queue);
            nic.record(&d, frame.len(), true);
        }
        Err(_) => assert!(parsed.is_err()),
    }
    // The datapath's call (its key-only fast path) decides as the full one.
    let c = nic.classifier();
    assert_eq!(c.decide_frame(frame, 1), c.classify_frame(frame, 1).map(|(_, d)| d));
    drop(c);

    // The device's receive path: spoofed frames are dropped and never delivered.
    let before = w.sink.0.load(Relaxed);
    let dropped = w.nic.counters.rx_spoofed_dropped.load(Relaxed);
    let d = w.nic.to_guest(frame);
    if spoofed {
        assert!(!d.delivered && d.queue.is_none());
        assert_eq!(w.sink.0.load(Relaxed), before);
        assert_eq!(w.nic.counters.rx_spoofed_dropped.load(Relaxed), dropped + 1);
    } else if let Some(q) = d.queue {
        assert!(q < queues);
    }
});
