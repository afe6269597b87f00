//! The device's filter table over a run: how many rules it holds, sampled every
//! [`SAMPLE_EVERY`] from the traffic's start until the guest's report (the expiry wait
//! after the load included), and how long rules outlive their flow's traffic. A rule
//! that disappears between two samples expired (or was deleted) about `now -
//! last_active_ns` after the last packet that matched it: for a TCP connection that packet
//! is the close handshake's, so this is the "connection close → filter gone" time within
//! one sampling interval (docs/measuring.md, "Filter table over time").

use crate::device::snapshot::RuleView;
use crate::report::schema::FilterTimeline;
use hdrhistogram::Histogram;
use std::collections::HashMap;
use std::time::Duration;

pub const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// At most this many samples are kept (an hour at 4 a second); later ones are dropped.
const MAX_SAMPLES: usize = 14_400;

pub struct Occupancy {
    /// Live rules at the last sample: id -> last activity (device clock, ns).
    live: HashMap<u32, u64>,
    series: Vec<(f64, u64)>,
    gone_ms: Histogram<u64>,
    gone: u64,
    peak: u64,
}

impl Default for Occupancy {
    fn default() -> Self {
        Occupancy {
            live: HashMap::new(),
            series: Vec::new(),
            gone_ms: Histogram::new_with_bounds(1, 3_600_000, 3).expect("static histogram bounds are valid"),
            gone: 0,
            peak: 0,
        }
    }
}

impl Occupancy {
    /// One sample at `now_ns` (device clock); `t_s` is the time since the traffic started.
    pub fn sample(&mut self, t_s: f64, now_ns: u64, rules: &[RuleView]) {
        let mut next = HashMap::with_capacity(rules.len());
        for r in rules {
            next.insert(r.id, r.last_active_ns);
        }
        for (id, last) in &self.live {
            if !next.contains_key(id) {
                self.gone += 1;
                let ms = now_ns.saturating_sub(*last) / 1_000_000;
                self.gone_ms.saturating_record(ms.max(1));
            }
        }
        self.live = next;
        let n = rules.len() as u64;
        self.peak = self.peak.max(n);
        if self.series.len() < MAX_SAMPLES {
            self.series.push(((t_s * 1000.0).round() / 1000.0, n));
        }
    }

    pub fn report(&self) -> FilterTimeline {
        let q = |p: f64| (!self.gone_ms.is_empty()).then(|| self.gone_ms.value_at_quantile(p) as f64);
        FilterTimeline {
            sample_ms: SAMPLE_EVERY.as_millis() as u64,
            rules: self.series.clone(),
            peak: self.peak,
            at_end: self.series.last().map_or(0, |s| s.1),
            gone: self.gone,
            gone_after_last_packet_ms_p50: q(0.5),
            gone_after_last_packet_ms_p90: q(0.9),
            gone_after_last_packet_ms_max: (!self.gone_ms.is_empty()).then(|| self.gone_ms.max() as f64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::flow::{FlowKey, L4Proto};

    fn rule(id: u32, last_active_ns: u64) -> RuleView {
        RuleView {
            id,
            flow: String::new(),
            key: FlowKey::v4(L4Proto::Tcp, [0; 4], 0, [0; 4], 0),
            queue: Some(0),
            installed_ns: 0,
            hits: 0,
            bytes: 0,
            last_active_ns,
        }
    }

    #[test]
    fn counts_rules_and_times_the_ones_that_went() {
        let mut o = Occupancy::default();
        let s = 1_000_000_000u64;
        o.sample(0.0, 0, &[]);
        o.sample(0.25, s, &[rule(1, s), rule(2, s)]);
        o.sample(0.5, 2 * s, &[rule(2, 2 * s), rule(3, 2 * s)]);
        // Rule 1 went between the samples, 1 s after its last packet; 2 and 3 after 3 s.
        o.sample(0.75, 5 * s, &[]);
        let r = o.report();
        assert_eq!(r.rules, vec![(0.0, 0), (0.25, 2), (0.5, 2), (0.75, 0)]);
        assert_eq!((r.peak, r.at_end, r.gone), (2, 0, 3));
        // The histogram keeps 3 significant digits.
        let near = |v: Option<f64>, x: f64| v.is_some_and(|v| (v - x).abs() <= x / 500.0);
        assert!(near(r.gone_after_last_packet_ms_p50, 3000.0), "{r:?}");
        assert!(near(r.gone_after_last_packet_ms_max, 3000.0), "{r:?}");
        let empty = Occupancy::default().report();
        assert_eq!((empty.gone, empty.gone_after_last_packet_ms_p50), (0, None));
    }
}
