//! The in-band control protocol (`wire::control`), both directions, and the device's control
//! runtime (`device::control::ControlRuntime`) with hostile guest frames.
//!
//! Input: a sequence of records `pair: u8, len: u16 (big-endian), frame: len bytes`; a
//! record whose length runs past the input takes what is left. Each frame goes through
//! - the guest→device decoder (`decode_request_eth`, `eth_info`, STATS counter ids), and a
//!   decoded request must survive encode → decode unchanged;
//! - the device→guest decoder (`decode_device_frame`), and a decoded completion or event
//!   must survive encode → decode unchanged (CAPS: all but the lossy profile name);
//! - `ControlRuntime::handle_frame` on queue pair `pair % 4` of one runtime (profile
//!   configs/mlx5-cx6.toml, its timer thread running), kept across inputs so the engine sees
//!   long command sequences. Every frame the device sends back must decode as a device frame.
//!   The sink holds the device's RSS (the profile's), so RSS_GET answers and RSS_SET
//!   changes it; an RSS configuration it accepts must always be a valid one. RULE_SET /
//!   RULE_DEL go to the same filter table as the aRFS commands (seeded in the corpus).
//!
//! Property: no panic; the device only ever emits well-formed frames.

#![no_main]

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, LazyLock, Mutex};

use arfsnic::device::control::{ControlRuntime, ControlSink};
use arfsnic::device::{Clock, RxError};
use arfsnic::model::filter::FilterTable;
use arfsnic::model::profile::Profile;
use arfsnic::model::rss::Rss;
use arfsnic::wire::control::{self as wire, CompletionBody, CounterId, DeviceMsg, Request};
use libfuzzer_sys::fuzz_target;

const PROFILE: &str = include_str!("../../../configs/mlx5-cx6.toml");
const PAIRS: u16 = 4;

/// Where the runtime's completions and events go: checked and counted. Holds the
/// device's RSS for RSS_GET / RSS_SET.
struct Check {
    frames: AtomicU64,
    rss: Mutex<Arc<Rss>>,
}

impl ControlSink for Check {
    fn send(&self, pair: u16, frame: &[u8]) -> Result<u16, RxError> {
        assert!(pair < PAIRS, "device frame for queue pair {pair}");
        if let Err(e) = wire::decode_device_frame(frame) {
            panic!("the device sent a frame it cannot decode itself ({e}): {frame:02x?}");
        }
        self.frames.fetch_add(1, Relaxed);
        Ok(pair)
    }
    fn rss(&self) -> Option<Arc<Rss>> {
        Some(self.rss.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }
    fn set_rss(&self, rss: Rss) {
        assert!(rss.indirection().iter().all(|&q| q < PAIRS), "RSS_SET accepted a queue beyond the device");
        *self.rss.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(rss);
    }
}

static RUNTIME: LazyLock<Arc<ControlRuntime>> = LazyLock::new(|| {
    let profile = Profile::parse(PROFILE).expect("configs/mlx5-cx6.toml parses");
    let table = Arc::new(FilterTable::new(profile.filter.layout, profile.filter.capacity));
    let rss = profile.build_rss(PAIRS).expect("the profile's RSS");
    let sink: Arc<dyn ControlSink> = Arc::new(Check { frames: AtomicU64::new(0), rss: Mutex::new(Arc::new(rss)) });
    ControlRuntime::new(&profile, table, PAIRS, Clock::new(), sink).expect("control runtime")
});

fn guest_side(frame: &[u8]) {
    let _ = wire::eth_info(frame);
    match wire::decode_request_eth(frame) {
        Ok((eth, header, req)) => {
            assert_eq!(header.op, req.op());
            if let Request::Stats(entries) = &req {
                for &(id, _) in entries {
                    let _ = CounterId::classify(id);
                }
            }
            let again = wire::encode_request(eth.src, header.seq, &req);
            let (h2, r2) = wire::decode_request(&again).expect("a re-encoded request decodes");
            assert_eq!((h2.seq, &r2), (header.seq, &req));
            let _ = req.to_string();
        }
        Err(e) => {
            let _ = (e.header(), e.errno(), e.kind(), e.to_string());
        }
    }
}

fn device_side(frame: &[u8]) {
    match wire::decode_device_frame(frame) {
        Ok((header, msg)) => {
            let again = match &msg {
                DeviceMsg::Completion(c) => wire::encode_completion([2, 0, 0, 0, 0, 1], c),
                DeviceMsg::Event { seq, event } => wire::encode_event([2, 0, 0, 0, 0, 1], *seq, event),
            };
            let (h2, m2) = wire::decode_device_frame(&again).expect("a re-encoded device frame decodes");
            assert_eq!((h2.op, h2.seq), (header.op, header.seq));
            match (&msg, &m2) {
                (DeviceMsg::Completion(a), DeviceMsg::Completion(b)) => {
                    assert_eq!(
                        (a.req_op, a.seq, a.status, a.enqueue_ns, a.start_ns, a.finish_ns),
                        (b.req_op, b.seq, b.status, b.enqueue_ns, b.start_ns, b.finish_ns)
                    );
                    match (&a.body, &b.body) {
                        (CompletionBody::Caps(x), CompletionBody::Caps(y)) => {
                            // The name is decoded lossily and cut to 31 bytes: not compared.
                            assert_eq!((x.queue_pairs, x.layout, x.capacity), (y.queue_pairs, y.layout, y.capacity));
                        }
                        (x, y) => assert_eq!(x, y),
                    }
                }
                (a, b) => assert_eq!(a, b),
            }
        }
        Err(e) => {
            let _ = (e.header(), e.errno(), e.kind(), e.to_string());
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let rt = &*RUNTIME;
    let mut rest = data;
    while !rest.is_empty() {
        let pair = u16::from(rest[0]) % PAIRS;
        let len = match rest.get(1..3) {
            Some(l) => usize::from(u16::from_be_bytes([l[0], l[1]])),
            None => usize::MAX,
        };
        let body = rest.get(3..).unwrap_or(&[]);
        let n = len.min(body.len());
        let frame = &body[..n];
        rest = &body[n..];

        guest_side(frame);
        device_side(frame);
        rt.handle_frame(pair, frame);
    }
});
