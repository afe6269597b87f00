//! The guest driver's counters as the device learns them from STATS frames: the latest
//! value of every counter, a bounded time series of the cumulative ones, rates between
//! samples and percentiles of the driver's command latency histogram.

use crate::wire::control::{counter, CounterId, LAT_HIST_BUCKETS};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};

/// Samples of the guest's cumulative counters kept for rate computations (at the
/// driver's 100 ms period: about 1.8 hours). The oldest are dropped beyond this.
pub const MAX_SERIES: usize = 1 << 16;

/// One sample of the guest's cumulative counters, taken when a STATS frame arrived.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StatsSample {
    /// Device clock (ns) at arrival.
    pub t_ns: u64,
    pub steer_calls: u64,
    pub adds_ok: u64,
    pub mods_ok: u64,
    pub dels_ok: u64,
    pub lock_acquired: u64,
    pub lock_contended: u64,
    pub lock_wait_ns: u64,
    pub steer_same: u64,
    pub work_runs: u64,
    pub work_delay_ns: u64,
}

/// `part` as a percentage of `whole` (`None` when `whole` is 0).
fn share(part: u64, whole: u64) -> Option<f64> {
    (whole > 0).then(|| 100.0 * part as f64 / whole as f64)
}

/// Rates between two STATS samples.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct GuestRates {
    pub from_ns: u64,
    pub to_ns: u64,
    pub window_s: f64,
    pub steer_calls_per_s: f64,
    pub adds_per_s: f64,
    pub mods_per_s: f64,
    pub dels_per_s: f64,
    /// Contended `arfs_lock` acquisitions in the window, % of all acquisitions.
    pub lock_contended_pct: f64,
    /// Time spent waiting for `arfs_lock` in the window, µs per second of wall time.
    pub lock_wait_us_per_s: f64,
    /// `steer_same` calls in the window, % of its steer calls (`None` without any).
    pub steer_same_pct: Option<f64>,
    /// Mean delay from a steer queuing a rule's work to the work sending its command, of
    /// the works run in the window (`None` without any).
    pub work_delay_ms_mean: Option<f64>,
}

/// A latency percentile from the guest's log2 histogram: the bucket it falls in,
/// `[lo_us, hi_us)` (`hi_us` is `None` for the last, open bucket).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct BucketPercentile {
    pub lo_us: f64,
    pub hi_us: Option<f64>,
}

/// Percentile `q` (0..=1) of a log2 µs histogram (`buckets[i]` counts [2^i, 2^(i+1)) µs,
/// bucket 0 also < 1 µs). `None` when it is empty.
pub fn hist_percentile(buckets: &[u64], q: f64) -> Option<BucketPercentile> {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
    let mut seen = 0u64;
    for (i, &n) in buckets.iter().enumerate() {
        seen += n;
        if seen >= rank {
            let lo = if i == 0 { 0.0 } else { (1u64 << i.min(63)) as f64 };
            let hi = (i + 1 < buckets.len()).then(|| (1u64 << (i + 1).min(63)) as f64);
            return Some(BucketPercentile { lo_us: lo, hi_us: hi });
        }
    }
    None
}

/// The guest driver's counters from its latest STATS frame.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GuestStats {
    /// Device clock (ns) when the latest STATS frame arrived.
    pub received_ns: u64,
    /// STATS frames received.
    pub reports: u64,
    /// Latest value of every counter except the latency buckets, by protocol name
    /// (`steer_calls`, …, `add_err_ENOSPC`, `unknown_0x0815`).
    pub counters: BTreeMap<String, u64>,
    /// Command round trips as seen by the driver: bucket i = [2^i, 2^(i+1)) µs.
    pub lat_hist_us: Vec<u64>,
    pub lat_us_p50: Option<BucketPercentile>,
    pub lat_us_p90: Option<BucketPercentile>,
    pub lat_us_p99: Option<BucketPercentile>,
    /// ADD/MOD/DEL failures by errno name (from ids 0x200/0x300/0x400 + errno).
    pub add_errors: BTreeMap<String, u64>,
    pub mod_errors: BTreeMap<String, u64>,
    pub del_errors: BTreeMap<String, u64>,
    /// Rates over the whole time series (first to last sample).
    pub rates: Option<GuestRates>,
}

/// The report name of a STATS counter id: `steer_calls`, `lat_hist_3`, `add_err_ENOSPC`,
/// `unknown_0x0815`.
pub fn counter_name(c: CounterId) -> String {
    match c {
        CounterId::Named(n) => n.to_string(),
        CounterId::LatBucket(i) => format!("lat_hist_{i}"),
        CounterId::AddErr(e) => format!("add_err_{}", errno_name(e)),
        CounterId::ModErr(e) => format!("mod_err_{}", errno_name(e)),
        CounterId::DelErr(e) => format!("del_err_{}", errno_name(e)),
        CounterId::Unknown(id) => format!("unknown_{id:#06x}"),
    }
}

/// Errno name as used in error counter names: `ENOSPC`, `E200`, and `other` for 255,
/// which collects every errno >= 255.
pub fn errno_name(e: i32) -> Cow<'static, str> {
    if e >= 255 {
        Cow::Borrowed("other")
    } else {
        crate::model::errno::name(e)
    }
}

#[derive(Default)]
pub(crate) struct Guest {
    /// Counter id → (latest value, device time it arrived).
    pub(crate) latest: BTreeMap<u16, (u64, u64)>,
    pub(crate) received_ns: u64,
    pub(crate) reports: u64,
    pub(crate) series: VecDeque<StatsSample>,
}

impl Guest {
    pub(crate) fn value(&self, id: u16) -> u64 {
        self.latest.get(&id).map_or(0, |v| v.0)
    }

    pub(crate) fn store(&mut self, entries: &[(u16, u64)], now: u64) {
        for &(id, v) in entries {
            self.latest.insert(id, (v, now));
        }
        self.received_ns = now;
        self.reports += 1;
        if self.series.len() >= MAX_SERIES {
            self.series.pop_front();
        }
        self.series.push_back(StatsSample {
            t_ns: now,
            steer_calls: self.value(counter::STEER_CALLS),
            adds_ok: self.value(counter::ADDS_OK),
            mods_ok: self.value(counter::MODS_OK),
            dels_ok: self.value(counter::DELS_OK),
            lock_acquired: self.value(counter::LOCK_ACQUIRED),
            lock_contended: self.value(counter::LOCK_CONTENDED),
            lock_wait_ns: self.value(counter::LOCK_WAIT_NS_TOTAL),
            steer_same: self.value(counter::STEER_SAME),
            work_runs: self.value(counter::WORK_RUNS),
            work_delay_ns: self.value(counter::WORK_DELAY_NS_TOTAL),
        });
    }

    pub(crate) fn rates(&self, from_ns: u64, to_ns: u64) -> Option<GuestRates> {
        let a = self.series.iter().find(|s| s.t_ns >= from_ns)?;
        let b = self.series.iter().rev().find(|s| s.t_ns <= to_ns)?;
        if b.t_ns <= a.t_ns {
            return None;
        }
        let dt = (b.t_ns - a.t_ns) as f64 / 1e9;
        let r = |x: u64, y: u64| y.saturating_sub(x) as f64 / dt;
        let acquired = b.lock_acquired.saturating_sub(a.lock_acquired);
        let contended = b.lock_contended.saturating_sub(a.lock_contended);
        Some(GuestRates {
            from_ns: a.t_ns,
            to_ns: b.t_ns,
            window_s: dt,
            steer_calls_per_s: r(a.steer_calls, b.steer_calls),
            adds_per_s: r(a.adds_ok, b.adds_ok),
            mods_per_s: r(a.mods_ok, b.mods_ok),
            dels_per_s: r(a.dels_ok, b.dels_ok),
            lock_contended_pct: if acquired > 0 { 100.0 * contended as f64 / acquired as f64 } else { 0.0 },
            lock_wait_us_per_s: r(a.lock_wait_ns, b.lock_wait_ns) / 1000.0,
            steer_same_pct: share(
                b.steer_same.saturating_sub(a.steer_same),
                b.steer_calls.saturating_sub(a.steer_calls),
            ),
            work_delay_ms_mean: {
                let runs = b.work_runs.saturating_sub(a.work_runs);
                (runs > 0).then(|| b.work_delay_ns.saturating_sub(a.work_delay_ns) as f64 / runs as f64 / 1e6)
            },
        })
    }

    pub(crate) fn stats(&self) -> Option<GuestStats> {
        if self.reports == 0 {
            return None;
        }
        let mut g = GuestStats {
            received_ns: self.received_ns,
            reports: self.reports,
            lat_hist_us: vec![0; LAT_HIST_BUCKETS],
            ..Default::default()
        };
        for (&id, &(v, _)) in &self.latest {
            let c = CounterId::classify(id);
            match c {
                CounterId::LatBucket(i) => g.lat_hist_us[i] = v,
                _ => {
                    g.counters.insert(counter_name(c), v);
                }
            }
            match c {
                CounterId::AddErr(e) => {
                    g.add_errors.insert(errno_name(e).into_owned(), v);
                }
                CounterId::ModErr(e) => {
                    g.mod_errors.insert(errno_name(e).into_owned(), v);
                }
                CounterId::DelErr(e) => {
                    g.del_errors.insert(errno_name(e).into_owned(), v);
                }
                _ => {}
            }
        }
        g.lat_us_p50 = hist_percentile(&g.lat_hist_us, 0.5);
        g.lat_us_p90 = hist_percentile(&g.lat_hist_us, 0.9);
        g.lat_us_p99 = hist_percentile(&g.lat_hist_us, 0.99);
        g.rates = self.rates(0, u64::MAX);
        Some(g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_log2_buckets() {
        let mut b = vec![0u64; LAT_HIST_BUCKETS];
        assert_eq!(hist_percentile(&b, 0.5), None);
        b[0] = 1;
        b[6] = 8; // [64, 128) µs
        b[23] = 1;
        assert_eq!(hist_percentile(&b, 0.5), Some(BucketPercentile { lo_us: 64.0, hi_us: Some(128.0) }));
        assert_eq!(hist_percentile(&b, 0.0), Some(BucketPercentile { lo_us: 0.0, hi_us: Some(2.0) }));
        assert_eq!(hist_percentile(&b, 1.0), Some(BucketPercentile { lo_us: (1u64 << 23) as f64, hi_us: None }));
    }

    #[test]
    fn guest_rates_over_samples() {
        let mut g = Guest::default();
        g.store(&[(counter::STEER_CALLS, 100), (counter::ADDS_OK, 10)], 1_000_000_000);
        g.store(&[(counter::STEER_CALLS, 1100)], 2_000_000_000);
        g.store(&[(counter::STEER_CALLS, 3100), (counter::ADDS_OK, 50)], 3_000_000_000);
        let r = g.rates(0, u64::MAX).unwrap();
        assert_eq!((r.window_s, r.steer_calls_per_s, r.adds_per_s), (2.0, 1500.0, 20.0));
        let r = g.rates(1_500_000_000, 2_500_000_000);
        assert_eq!(r, None, "one sample in the window");
        let s = g.stats().unwrap();
        assert_eq!(s.counters["steer_calls"], 3100);
        assert_eq!(s.reports, 3);
    }

    #[test]
    fn counter_names() {
        let name = |id| counter_name(CounterId::classify(id));
        assert_eq!(name(1), "steer_calls");
        assert_eq!(name(20), "hold_ns");
        assert_eq!(name(0x100 + 3), "lat_hist_3");
        assert_eq!(name(0x200 + libc::ENOSPC as u16), "add_err_ENOSPC");
        assert_eq!(name(0x300 + libc::ENOENT as u16), "mod_err_ENOENT");
        assert_eq!(name(0x400 + 200), "del_err_E200");
        assert_eq!(name(0x200 + 255), "add_err_other");
        assert_eq!(name(0), "unknown_0x0000");
    }
}
