//! Control frames (completions and events) that found no RX buffer: they wait here and
//! are sent again, in order, before anything newer — a NIC's command channel does not
//! lose an answer because its data rings are full (docs/control-protocol.md §3.5).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

use super::control::ControlSink;
use super::ports::RxError;
use super::snapshot::FrameCounters;

/// Frames the backlog holds at most; an older one goes (counted as dropped) for a newer.
const MAX_FRAMES: usize = 256;
/// How long a frame may wait for an RX buffer: the module's default command timeout, after
/// which its waiter has given up.
const MAX_AGE_NS: u64 = 2_000_000_000;
/// How often the owner retries while frames wait.
pub const RETRY: Duration = Duration::from_millis(1);

/// A frame to send once the runtime's lock is released.
pub struct Outgoing {
    pub pair: u16,
    pub frame: Vec<u8>,
    pub event: bool,
}

/// A waiting frame and the clock when it first found no buffer (`None`: not tried yet).
struct Waiting {
    out: Outgoing,
    since: Option<u64>,
}

#[derive(Default)]
pub struct Backlog {
    frames: Mutex<VecDeque<Waiting>>,
    nonempty: AtomicBool,
}

impl Backlog {
    /// Frames are waiting: the owner should call [`Backlog::send`] within [`RETRY`].
    pub fn waiting(&self) -> bool {
        self.nonempty.load(Relaxed)
    }

    /// Forget what waits (a device reset: it was for the old driver instance).
    pub fn clear(&self) {
        crate::sync::lock(&self.frames).clear();
        self.nonempty.store(false, Relaxed);
    }

    /// Sends what waits, then `out`, in order through `sink`; what finds no RX buffer
    /// waits (at most [`MAX_FRAMES`], each at most [`MAX_AGE_NS`]). Returns the frame
    /// counts of this call.
    pub fn send(&self, sink: &dyn ControlSink, now: u64, out: Vec<Outgoing>) -> FrameCounters {
        let mut c = FrameCounters::default();
        if out.is_empty() && !self.waiting() {
            return c;
        }
        let mut q = crate::sync::lock(&self.frames);
        q.extend(out.into_iter().map(|out| Waiting { out, since: None }));
        while let Some(w) = q.front() {
            match sink.send(w.out.pair, &w.out.frame) {
                Ok(_) if w.out.event => c.events_sent += 1,
                Ok(_) => c.completions_sent += 1,
                Err(RxError::NoBuffers) if w.since.is_none_or(|t| now.saturating_sub(t) < MAX_AGE_NS) => break,
                Err(e) => count_drop(&mut c, &w.out, e),
            }
            q.pop_front();
        }
        for w in q.iter_mut().filter(|w| w.since.is_none()) {
            w.since = Some(now);
            c.frames_deferred += 1;
        }
        while q.len() > MAX_FRAMES {
            if let Some(w) = q.pop_front() {
                count_drop(&mut c, &w.out, RxError::NoBuffers);
            }
        }
        self.nonempty.store(!q.is_empty(), Relaxed);
        c
    }
}

fn count_drop(c: &mut FrameCounters, o: &Outgoing, e: RxError) {
    if o.event {
        c.events_dropped += 1;
    } else {
        c.completions_dropped += 1;
        c.completions_dropped_no_buffer += u64::from(e == RxError::NoBuffers);
    }
}
