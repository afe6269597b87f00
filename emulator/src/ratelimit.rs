//! Rate-limited log lines for hostile input: every drop is counted where it happens, and
//! at most one line per second per call site says so, with the number of similar lines
//! left out since the last one. Imports nothing of the crate (usable from every layer).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::Instant;

/// Nanoseconds on a process-wide monotonic clock.
fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// One call site's limiter (a `static`, see [`warn_ratelimited!`]).
pub struct RateLimit {
    next_ns: AtomicU64,
    suppressed: AtomicU64,
}

impl RateLimit {
    pub const PERIOD_NS: u64 = 1_000_000_000;

    pub const fn new() -> Self {
        RateLimit { next_ns: AtomicU64::new(0), suppressed: AtomicU64::new(0) }
    }

    /// `Some(n)`: this call may log; `n` lines were suppressed since the last one.
    pub fn allow(&self) -> Option<u64> {
        let now = now_ns();
        let next = self.next_ns.load(Relaxed);
        if now >= next && self.next_ns.compare_exchange(next, now + Self::PERIOD_NS, Relaxed, Relaxed).is_ok() {
            return Some(self.suppressed.swap(0, Relaxed));
        }
        self.suppressed.fetch_add(1, Relaxed);
        None
    }
}

impl Default for RateLimit {
    fn default() -> Self {
        Self::new()
    }
}

/// `log::warn!`, at most once per second per call site.
#[macro_export]
macro_rules! warn_ratelimited {
    ($($arg:tt)+) => {{
        static RL: $crate::ratelimit::RateLimit = $crate::ratelimit::RateLimit::new();
        if let Some(n) = RL.allow() {
            if n > 0 {
                log::warn!("{} ({n} similar lines suppressed)", format_args!($($arg)+));
            } else {
                log::warn!($($arg)+);
            }
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_period_and_the_count_of_the_rest() {
        let rl = RateLimit::new();
        assert_eq!(rl.allow(), Some(0));
        for _ in 0..5 {
            assert_eq!(rl.allow(), None);
        }
        rl.next_ns.store(0, Relaxed); // the period is over
        assert_eq!(rl.allow(), Some(5));
    }
}
