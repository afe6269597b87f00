//! Service-time distributions of the command engine. Samples come from a seeded
//! ChaCha RNG, so a run is reproducible from the profile's seed.

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, LogNormal};
use serde::{Deserialize, Serialize};

/// A service-time distribution, in microseconds.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(tag = "dist", rename_all = "lowercase", deny_unknown_fields)]
pub enum LatencySpec {
    /// Always `us`.
    Fixed { us: f64 },
    /// Uniform in [min_us, max_us].
    Uniform { min_us: f64, max_us: f64 },
    /// Log-normal with the given median and shape (sigma of the underlying normal).
    Lognormal { median_us: f64, sigma: f64 },
    /// Empirical histogram: buckets `[lo_us, hi_us, weight]`; a bucket is chosen by
    /// weight, then a value uniformly inside it (lo = hi gives a point).
    Histogram { buckets: Vec<[f64; 3]> },
}

impl Default for LatencySpec {
    fn default() -> Self {
        LatencySpec::Fixed { us: 0.0 }
    }
}

impl LatencySpec {
    /// Check the parameters; the error names the offending field (relative).
    pub fn validate(&self) -> Result<(), (String, String)> {
        let bad = |f: &str, m: &str| Err((f.to_string(), m.to_string()));
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        match self {
            LatencySpec::Fixed { us } if !ok(*us) => bad("us", "must be a finite number >= 0"),
            LatencySpec::Uniform { min_us, .. } if !ok(*min_us) => bad("min_us", "must be a finite number >= 0"),
            LatencySpec::Uniform { min_us, max_us } if !ok(*max_us) || max_us < min_us => {
                bad("max_us", "must be a finite number >= min_us")
            }
            LatencySpec::Lognormal { median_us, .. } if !(median_us.is_finite() && *median_us > 0.0) => {
                bad("median_us", "must be a finite number > 0")
            }
            LatencySpec::Lognormal { sigma, .. } if !ok(*sigma) => bad("sigma", "must be a finite number >= 0"),
            LatencySpec::Histogram { buckets } if buckets.is_empty() => bad("buckets", "needs at least one bucket"),
            LatencySpec::Histogram { buckets } => {
                for (i, [lo, hi, w]) in buckets.iter().enumerate() {
                    if !ok(*lo) || !ok(*hi) || hi < lo {
                        return bad(&format!("buckets[{i}]"), "needs 0 <= lo_us <= hi_us");
                    }
                    if !(w.is_finite() && *w > 0.0) {
                        return bad(&format!("buckets[{i}]"), "weight must be > 0");
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Mean in microseconds (for reports).
    pub fn mean_us(&self) -> f64 {
        match self {
            LatencySpec::Fixed { us } => *us,
            LatencySpec::Uniform { min_us, max_us } => (min_us + max_us) / 2.0,
            LatencySpec::Lognormal { median_us, sigma } => median_us * (sigma * sigma / 2.0).exp(),
            LatencySpec::Histogram { buckets } => {
                let tw: f64 = buckets.iter().map(|b| b[2]).sum();
                buckets.iter().map(|b| (b[0] + b[1]) / 2.0 * b[2]).sum::<f64>() / tw
            }
        }
    }

    /// A sampler for a validated spec.
    pub fn sampler(&self) -> Sampler {
        match self {
            LatencySpec::Fixed { us } => Sampler::Fixed(us_to_ns(*us)),
            LatencySpec::Uniform { min_us, max_us } => Sampler::Uniform(*min_us, *max_us),
            LatencySpec::Lognormal { median_us, sigma } => match LogNormal::new(median_us.ln(), *sigma) {
                Ok(d) => Sampler::LogNormal(d),
                Err(_) => Sampler::Fixed(us_to_ns(*median_us)),
            },
            LatencySpec::Histogram { buckets } => {
                let total: f64 = buckets.iter().map(|b| b[2]).sum();
                let mut acc = 0.0;
                let cum = buckets
                    .iter()
                    .map(|b| {
                        acc += b[2] / total;
                        (acc, b[0], b[1])
                    })
                    .collect();
                Sampler::Histogram(cum)
            }
        }
    }
}

fn us_to_ns(us: f64) -> u64 {
    (us * 1000.0).round().clamp(0.0, u64::MAX as f64) as u64
}

/// Draws service times in nanoseconds.
#[derive(Clone, Debug)]
pub enum Sampler {
    Fixed(u64),
    Uniform(f64, f64),
    LogNormal(LogNormal<f64>),
    /// (cumulative probability, lo_us, hi_us)
    Histogram(Vec<(f64, f64, f64)>),
}

impl Sampler {
    /// One service time. Every variant except `Fixed` consumes RNG output, so the
    /// sequence is a pure function of the seed and the order of calls.
    pub fn sample_ns(&self, rng: &mut ChaCha8Rng) -> u64 {
        match self {
            Sampler::Fixed(ns) => *ns,
            Sampler::Uniform(lo, hi) => us_to_ns(lo + (hi - lo) * rng.random::<f64>()),
            Sampler::LogNormal(d) => us_to_ns(d.sample(rng)),
            Sampler::Histogram(cum) => {
                let u: f64 = rng.random();
                let (_, lo, hi) =
                    cum.iter().find(|(c, _, _)| u < *c).or(cum.last()).copied().unwrap_or((1.0, 0.0, 0.0));
                us_to_ns(lo + (hi - lo) * rng.random::<f64>())
            }
        }
    }

    /// Lower bound of any sample (what tests compare latency against).
    pub fn min_ns(&self) -> u64 {
        match self {
            Sampler::Fixed(ns) => *ns,
            Sampler::Uniform(lo, _) => us_to_ns(*lo),
            Sampler::LogNormal(_) => 0,
            Sampler::Histogram(cum) => cum.iter().map(|c| us_to_ns(c.1)).min().unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn fixed_uniform_histogram_ranges() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        assert_eq!(LatencySpec::Fixed { us: 50.0 }.sampler().sample_ns(&mut rng), 50_000);
        let u = LatencySpec::Uniform { min_us: 10.0, max_us: 20.0 }.sampler();
        for _ in 0..1000 {
            let v = u.sample_ns(&mut rng);
            assert!((10_000..=20_000).contains(&v));
        }
        let h = LatencySpec::Histogram { buckets: vec![[5.0, 5.0, 1.0], [100.0, 200.0, 3.0]] }.sampler();
        let (mut low, mut high) = (0, 0);
        for _ in 0..4000 {
            match h.sample_ns(&mut rng) {
                5_000 => low += 1,
                v if (100_000..=200_000).contains(&v) => high += 1,
                v => panic!("sample {v} outside the buckets"),
            }
        }
        assert!((800..1200).contains(&low), "low bucket drawn {low} of 4000 times");
        assert_eq!(low + high, 4000);
    }

    #[test]
    fn lognormal_median_is_close() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let s = LatencySpec::Lognormal { median_us: 40.0, sigma: 0.5 }.sampler();
        let mut v: Vec<u64> = (0..20001).map(|_| s.sample_ns(&mut rng)).collect();
        v.sort_unstable();
        let median = v[10000] as f64 / 1000.0;
        assert!((37.0..43.0).contains(&median), "median {median}");
    }

    #[test]
    fn validation_names_the_field() {
        assert_eq!(LatencySpec::Uniform { min_us: 5.0, max_us: 1.0 }.validate().unwrap_err().0, "max_us");
        assert_eq!(LatencySpec::Lognormal { median_us: 0.0, sigma: 1.0 }.validate().unwrap_err().0, "median_us");
        assert_eq!(
            LatencySpec::Histogram { buckets: vec![[1.0, 2.0, 1.0], [3.0, 1.0, 1.0]] }.validate().unwrap_err().0,
            "buckets[1]"
        );
    }
}
