//! A run's health verdict (docs/measuring.md, "Run health"): did the run measure the
//! kernel under test, or the host it ran on? The signals are read from the finished run
//! report; each limit crossed adds a reason naming the signal, its value and the limit.
//!
//! - `invalid`: the guest did not keep up with the offered load (replies lost), or the
//!   filter lock or the rule work stalled the way a descheduled lock holder or waiter
//!   stalls them (lock wait as a share of the guest's CPU time, steer-to-command delay).
//!   Its Steer-C/s is not a result.
//! - `degraded`: the numbers are usable but something was strained (a few replies lost,
//!   a saturated guest, vCPU threads waiting for the host, most steer calls repeating a
//!   rule's pending queue); the reasons say what.
//! - `ok`: none of the limits crossed.

use crate::report::schema::{Health, RunReport, Verdict};

/// The limits, in the signals' units. Measured on 2-core hosts under TCG: healthy runs
/// and livelocked runs lie orders of magnitude apart on lock wait and work delay
/// (docs/measuring.md has the numbers).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub lost_pct_degraded: f64,
    pub lost_pct_invalid: f64,
    /// `arfs_lock` wait as a share of the guest's CPU time (ms/s per vCPU / 10).
    pub lock_wait_pct_degraded: f64,
    pub lock_wait_pct_invalid: f64,
    pub work_delay_ms_mean_degraded: f64,
    pub work_delay_ms_mean_invalid: f64,
    pub steer_same_pct_degraded: f64,
    pub guest_cpu_pct_degraded: f64,
    pub vcpu_wait_pct_degraded: f64,
}

pub const LIMITS: Limits = Limits {
    lost_pct_degraded: 0.5,
    lost_pct_invalid: 5.0,
    lock_wait_pct_degraded: 2.5,
    lock_wait_pct_invalid: 7.5,
    work_delay_ms_mean_degraded: 50.0,
    work_delay_ms_mean_invalid: 250.0,
    steer_same_pct_degraded: 75.0,
    guest_cpu_pct_degraded: 90.0,
    vcpu_wait_pct_degraded: 50.0,
};

/// How the steer-to-command delay's reason begins.
const DELAY_REASON: &str = "steer-to-command delay";

/// `degraded` by the steer-to-command delay alone: the guest's rule works ran late and no
/// other limit was crossed. The steer calls are still counted as the kernel makes them,
/// and model mode replays exactly that lateness (docs/model.md, "Fidelity").
pub fn degraded_by_delay_only(h: &Health) -> bool {
    h.verdict == Verdict::Degraded && !h.reasons.is_empty() && h.reasons.iter().all(|x| x.starts_with(DELAY_REASON))
}

/// Flag a signal: `Invalid` above `invalid` (when it has one), else `Degraded` above
/// `degraded`; `reason(verdict, value, limit)` says which limit it crossed.
fn grade(
    h: &mut Health,
    value: Option<f64>,
    degraded: f64,
    invalid: Option<f64>,
    reason: impl Fn(Verdict, f64, f64) -> String,
) {
    let Some(x) = value else { return };
    let (v, limit) = match invalid {
        Some(i) if x > i => (Verdict::Invalid, i),
        _ if x > degraded => (Verdict::Degraded, degraded),
        _ => return,
    };
    h.verdict = h.verdict.max(v);
    h.reasons.push(reason(v, x, limit));
}

/// The verdict of a finished run of a guest with `vcpus` CPUs.
pub fn assess(r: &RunReport, vcpus: u32, lim: &Limits) -> Health {
    let mut h = Health::default();
    let l = &r.link;
    h.replies_lost_pct = (l.requests > 0).then(|| 100.0 * l.lost as f64 / l.requests as f64);
    if let Some(d) = r.driver() {
        // Over the rates' window (after the warm-up, whose first steers queue one ADD per
        // flow at once) when the report has it, else over the whole run.
        let whole_same = (d.steer_calls > 0).then(|| 100.0 * d.steer_same as f64 / d.steer_calls as f64);
        h.steer_same_pct = if d.rates_window_s.is_some() { d.steer_same_pct_window } else { whole_same };
        h.lock_wait_ms_per_s = d.lock_wait_us_per_s.map(|x| x / 1000.0);
        let c = |k: &str| d.counters.get(k).copied();
        let whole_delay = match (c("work_runs"), c("work_delay_ns_total")) {
            (Some(runs), Some(total)) if runs > 0 => Some(total as f64 / runs as f64 / 1e6),
            _ => None,
        };
        h.work_delay_ms_mean = if d.rates_window_s.is_some() { d.work_delay_ms_mean_window } else { whole_delay };
        h.work_delay_ms_max = c("work_delay_ns_max").map(|x| x as f64 / 1e6);
    }
    h.guest_cpu_pct = r.guest_cpu_pct;
    h.vcpu_wait_pct = r.host.as_ref().and_then(|x| x.vcpu_wait_pct);

    let (lost, same, cpu, vcpu_wait) = (h.replies_lost_pct, h.steer_same_pct, h.guest_cpu_pct, h.vcpu_wait_pct);
    grade(&mut h, lost, lim.lost_pct_degraded, Some(lim.lost_pct_invalid), |v, x, limit| match v {
        Verdict::Invalid => format!("replies lost {x:.1}% > {limit}%"),
        _ => format!("replies lost {x:.2}% > {limit}%"),
    });
    // The wait is summed over the CPUs that take the lock: as a share of the guest's
    // CPU time it compares across topologies.
    let vcpu_time = 10.0 * f64::from(vcpus.max(1));
    let wait = h.lock_wait_ms_per_s;
    grade(
        &mut h,
        wait.map(|ms| ms / vcpu_time),
        lim.lock_wait_pct_degraded,
        Some(lim.lock_wait_pct_invalid),
        |_, x, limit| {
            format!("arfs_lock wait {:.0} ms/s = {x:.1}% of {vcpus} vCPUs' time > {limit}%", wait.unwrap_or_default())
        },
    );
    let delay = h.work_delay_ms_mean;
    grade(&mut h, delay, lim.work_delay_ms_mean_degraded, Some(lim.work_delay_ms_mean_invalid), |_, x, limit| {
        format!("{DELAY_REASON} {x:.0} ms > {limit} ms (mean)")
    });
    grade(&mut h, same, lim.steer_same_pct_degraded, None, |_, x, limit| {
        format!("steer_same {x:.0}% of steer calls > {limit}%")
    });
    grade(&mut h, cpu, lim.guest_cpu_pct_degraded, None, |_, x, limit| format!("guest CPU {x:.0}% busy > {limit}%"));
    grade(&mut h, vcpu_wait, lim.vcpu_wait_pct_degraded, None, |_, x, limit| {
        format!("vCPU threads waited {x:.0}% of their runnable time for a host CPU > {limit}%")
    });
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::schema::{DriverReport, GuestReport, HostReport};
    use crate::traffic::partner::LinkStats;

    fn run(requests: u64, lost: u64, steer: u64, same: u64, wait_us_s: f64, delay_ns: u64) -> RunReport {
        RunReport {
            link: LinkStats { requests, responses: requests - lost, lost, ..Default::default() },
            guest: GuestReport {
                module: true,
                driver: Some(DriverReport {
                    steer_calls: steer,
                    steer_same: same,
                    lock_wait_us_per_s: Some(wait_us_s),
                    counters: [("work_runs".to_string(), 10), ("work_delay_ns_total".to_string(), 10 * delay_ns)]
                        .into_iter()
                        .collect(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            guest_cpu_pct: Some(40.0),
            ..Default::default()
        }
    }

    #[test]
    fn a_healthy_run_is_ok() {
        let h = assess(&run(18_000, 0, 6000, 600, 5_000.0, 2_000_000), 4, &LIMITS);
        assert_eq!(h.verdict, Verdict::Ok, "{:?}", h.reasons);
        assert!(h.reasons.is_empty());
        assert_eq!(h.replies_lost_pct, Some(0.0));
        assert_eq!(h.steer_same_pct, Some(10.0));
        assert_eq!(h.work_delay_ms_mean, Some(2.0));
    }

    #[test]
    fn the_issue_12_livelock_is_invalid_with_every_reason() {
        // 103 of 17 995 answered, 7655 of 7740 steers steer_same, 5.8 s lock wait per s.
        let h = assess(&run(17_995, 17_892, 7740, 7655, 5_800_000.0, 900_000_000), 6, &LIMITS);
        assert_eq!(h.verdict, Verdict::Invalid);
        let all = h.reasons.join("; ");
        for what in [
            "replies lost 99.4%",
            "arfs_lock wait 5800 ms/s = 96.7% of 6 vCPUs' time",
            "steer-to-command delay 900 ms",
            "steer_same 99%",
        ] {
            assert!(all.contains(what), "{what} missing in {all}");
        }
    }

    #[test]
    fn strain_alone_is_degraded() {
        let mut r = run(10_000, 10, 1000, 100, 150_000.0, 1_000_000);
        r.host = Some(HostReport { vcpu_wait_pct: Some(70.0), ..Default::default() });
        let h = assess(&r, 4, &LIMITS);
        assert_eq!(h.verdict, Verdict::Degraded);
        assert_eq!(h.reasons.len(), 2, "{:?}", h.reasons);
        // The same wait spread over 16 vCPUs is below the limit.
        assert_eq!(assess(&r, 16, &LIMITS).reasons.len(), 1);
        // No module, no requests: nothing to judge, ok.
        let h = assess(&RunReport::default(), 2, &LIMITS);
        assert_eq!((h.verdict, h.replies_lost_pct, h.steer_same_pct), (Verdict::Ok, None, None));
    }
}
