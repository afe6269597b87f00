//! Frames from the wire never reach the guest's control path: the device drops every
//! wire-side frame with the control EtherType (also behind VLAN / QinQ tags) or with the
//! device's own MAC as source, counts it (`rx_spoofed_dropped`) and keeps delivering the
//! rest. The frames are real control frames (the codec the device itself uses).

use arfsnic::device::{Clock, EmulatedNic, GuestRx, RxError, ToGuest};
use arfsnic::model::nic::Nic;
use arfsnic::model::profile::Profile;
use arfsnic::wire::control::{self, EventMsg, DEVICE_MAC};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

const GUEST: [u8; 6] = [0x52, 0x54, 0x00, 0xab, 0xcd, 0xef];

#[derive(Default)]
struct Recorder(Mutex<Vec<Vec<u8>>>);

impl GuestRx for Recorder {
    fn deliver(&self, _pair: u16, frame: &[u8]) -> Result<(), RxError> {
        self.0.lock().unwrap().push(frame.to_vec());
        Ok(())
    }
    fn enabled_pairs(&self) -> Vec<bool> {
        vec![true; 2]
    }
}

/// `frame` with `tags` VLAN tags (alternating 802.1ad and 802.1Q) after the MACs.
fn tagged(frame: &[u8], tags: usize) -> Vec<u8> {
    let mut f = frame[..12].to_vec();
    for i in 0..tags {
        f.extend_from_slice(&(if i % 2 == 0 { 0x88a8u16 } else { 0x8100 }).to_be_bytes());
        f.extend_from_slice(&[0, 7]);
    }
    f.extend_from_slice(&frame[12..]);
    f
}

fn udp_frame(src_mac: [u8; 6]) -> Vec<u8> {
    let mut out = Vec::new();
    etherparse::PacketBuilder::ethernet2(src_mac, GUEST)
        .ipv4([10, 99, 0, 1], [10, 99, 0, 2], 64)
        .udp(9000, 7000)
        .write(&mut out, b"hello")
        .unwrap();
    out
}

#[test]
fn forged_control_frames_from_the_wire_are_dropped_and_counted() {
    let p = Profile::parse("name = \"t\"\n[filter]\nlayout = \"shared\"\ncapacity = 1024\n").unwrap();
    let nic = EmulatedNic::new(Arc::new(Nic::new(&p, 2).unwrap()), Clock::new());
    let rx = Arc::new(Recorder::default());
    nic.attach_rx(rx.clone());
    // What a device event and a completion look like on the guest's side of the wire.
    let event = control::encode_event(GUEST, 0, &EventMsg::EngineState { disabled: true });
    let mut forged = vec![event.clone()];
    for tags in 1..=4 {
        forged.push(tagged(&event, tags));
    }
    let mut other_src = event.clone();
    other_src[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x66]);
    forged.push(other_src);
    forged.push(udp_frame(DEVICE_MAC));
    for f in &forged {
        let d = nic.to_guest(f);
        assert!(!d.delivered && d.queue.is_none(), "{d:?}");
    }
    assert!(rx.0.lock().unwrap().is_empty(), "a forged frame reached the guest");
    assert_eq!(nic.counters.rx_spoofed_dropped.load(Relaxed), forged.len() as u64);
    // Ordinary traffic still flows, and is not counted as spoofed.
    let ok = nic.to_guest(&udp_frame([0x02, 0, 0, 0, 0, 0x01]));
    assert!(ok.delivered, "{ok:?}");
    assert_eq!(rx.0.lock().unwrap().len(), 1);
    assert_eq!(nic.counters.rx_spoofed_dropped.load(Relaxed), forged.len() as u64);
    // The device's own control frames go through send_control, not the wire path.
    assert!(nic.send_control(0, &event).is_ok());
    assert_eq!(rx.0.lock().unwrap().len(), 2);
}

/// The drop count reaches the guest: a DEV_STATS request answers with
/// `rx_spoofed_dropped` since the last device reset (the module shows it in `ethtool -S`
/// as `dev_rx_spoofed_dropped`).
#[test]
fn dev_stats_carries_the_spoof_count_since_the_reset() {
    use arfsnic::device::{ControlRuntime, DeviceHooks, Schedule};
    use arfsnic::wire::control::{dev_counter, CompletionBody, DeviceMsg, Request};
    let p = Profile::parse("name = \"t\"\n[filter]\nlayout = \"shared\"\ncapacity = 1024\n").unwrap();
    let nic = EmulatedNic::new(Arc::new(Nic::new(&p, 2).unwrap()), Clock::new());
    let rx = Arc::new(Recorder::default());
    nic.attach_rx(rx.clone());
    let _rt = ControlRuntime::attach(&p, &nic, 2, Schedule::FromStart).unwrap();
    let spoofed_seen_by_guest = |seq: u32| -> u64 {
        rx.0.lock().unwrap().clear();
        nic.on_tx(0, &control::encode_request(GUEST, seq, &Request::DevStats));
        let frames = rx.0.lock().unwrap().clone();
        let reply = frames.iter().find_map(|f| match control::decode_device_frame(f) {
            Ok((_, DeviceMsg::Completion(c))) if c.seq == seq => Some(c),
            _ => None,
        });
        let Some(CompletionBody::DevStats(e)) = reply.map(|c| c.body) else { panic!("no DEV_STATS reply: {frames:?}") };
        e.iter().find(|(id, _)| *id == dev_counter::RX_SPOOFED_DROPPED).map(|x| x.1).unwrap()
    };
    nic.on_link(true);
    let event = control::encode_event(GUEST, 0, &EventMsg::TableFlushed);
    for _ in 0..3 {
        nic.to_guest(&event);
    }
    assert_eq!(spoofed_seen_by_guest(1), 3);
    nic.on_link(false);
    nic.on_link(true);
    assert_eq!(spoofed_seen_by_guest(2), 0, "a fresh device starts from 0");
    nic.to_guest(&tagged(&event, 2));
    assert_eq!(spoofed_seen_by_guest(3), 1);
    assert_eq!(nic.counters.rx_spoofed_dropped.load(Relaxed), 4, "the process-wide count keeps growing");
    nic.set_control(None);
}
