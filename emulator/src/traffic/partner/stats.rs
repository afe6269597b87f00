//! What a run of the link partner reports: per-flow records, the run's totals, and the
//! RTT histogram they are summarised from.

use super::lock;
use crate::wire::ethernet::MacAddr;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::sync::Mutex;
use std::time::Duration;

/// Per-flow record of a run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowRecord {
    pub flow: u32,
    pub guest_port: u16,
    pub partner_port: u16,
    pub requests: u64,
    pub responses: u64,
    /// Requests the NIC did not put into the guest (drop filter, no RX buffers, link down).
    pub not_delivered: u64,
    /// Requests per RX queue the NIC chose (index = queue).
    pub queue_counts: Vec<u64>,
    pub last_queue: Option<u16>,
    /// Requests steered by a filter (rest: RSS).
    pub via_filter: u64,
    pub last_filter: Option<u32>,
    /// How long, in ms up to the end of sending (or to now while running), the flow's
    /// delivered requests have all gone through RSS, none through a filter; `None` when its
    /// last delivered request hit a filter or none was delivered. Tells a flow that lost
    /// its filter a moment ago (a re-steer on the way) from one left without any.
    pub via_rss_only_ms: Option<u64>,
    /// Guest CPU that served the last response.
    pub last_cpu: Option<u32>,
    /// Responses per guest CPU (index = CPU).
    pub cpu_counts: Vec<u64>,
}

/// Link partner statistics (serializable; the runner copies them into the JSON report).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkStats {
    pub flows: u32,
    pub requests: u64,
    pub responses: u64,
    /// After `stop()`: requests - responses. While running: requests dropped from the
    /// in-flight table so far (timeout or overflow).
    pub lost: u64,
    /// Requests still waiting for a response (0 after `stop()`).
    pub in_flight: u64,
    pub rtt_us_p50: f64,
    pub rtt_us_p99: f64,
    pub rtt_us_max: f64,
    pub rtt_us_mean: f64,
    /// The RTT histogram: entry i counts round trips of 2^i up to 2^(i+1) µs (entry 0: up
    /// to 2 µs), trailing empty entries left out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rtt_hist_log2_us: Vec<u64>,
    /// Seconds from the first request to the end of sending (or now).
    pub duration_s: f64,
    pub requests_per_s: f64,
    pub responses_per_s: f64,
    pub not_delivered: u64,
    pub per_flow: Vec<FlowRecord>,
    pub arp_requests_answered: u64,
    pub arp_requests_sent: u64,
    pub nd_solicitations_answered: u64,
    pub guest_mac: Option<MacAddr>,
    /// Frames on a flow's ports that are not a valid response to that flow.
    pub bad_responses: u64,
    /// Valid responses whose request was no longer outstanding.
    pub late_responses: u64,
    /// ICMP port-unreachable messages from the guest (requests that found no socket,
    /// typically sent before the guest workload was listening).
    pub port_unreachable: u64,
    /// Frames from the guest that are neither ARP/ND nor flow traffic.
    pub other_frames: u64,
    pub running: bool,
    /// TCP runs: connections, retransmits, throughput (absent for UDP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<TcpStats>,
}

/// What a TCP run's connections did. Requests, responses and RTTs are in [`LinkStats`] as
/// for UDP; a request is one message of `payload` bytes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TcpStats {
    /// `rr`, `crr` or `stream`.
    pub pattern: String,
    /// Connection attempts (SYNs sent, not counting their retransmissions).
    pub connects: u64,
    /// Attempts that reached ESTABLISHED.
    pub established: u64,
    /// Attempts that did not: reset (no listener) or timed out.
    pub connect_errors: u64,
    /// Established connections that ended without our close: reset by the guest or timed out.
    pub resets: u64,
    /// Connections we closed that completed the FIN handshake.
    pub closes: u64,
    /// Closes that did not complete within the close timeout (aborted, counted here only).
    pub close_timeouts: u64,
    /// Segments sent again (the sequence range was sent before; SYN and FIN included).
    pub retransmits: u64,
    /// Segments sent in all.
    pub segments_sent: u64,
    /// Segments from the guest dropped because the partner's input queue was full.
    pub rx_dropped: u64,
    /// CRR: connections not started because every socket was busy (TIME-WAIT included).
    pub no_free_socket: u64,
    /// CRR: connect, request, response and close all done.
    pub crr_completed: u64,
    /// Connections aborted when the run stopped: still in their handshake, or (CRR) still
    /// waiting for their response, after the drain.
    #[serde(default)]
    pub cut_at_stop: u64,
    /// Connection setup time (SYN sent to ESTABLISHED), µs.
    pub connect_us_p50: f64,
    pub connect_us_p99: f64,
    /// CRR: SYN sent to the response read (before our close), µs.
    pub crr_us_p50: f64,
    pub crr_us_p99: f64,
    /// Payload bytes queued to the sockets and acknowledged by the guest.
    pub bytes_sent: u64,
    pub bytes_acked: u64,
    /// Payload bytes received from the guest.
    pub bytes_received: u64,
    /// Acknowledged payload over the sending time, Mbit/s.
    pub throughput_mbps: f64,
    /// Established connections now (at the end of a stopped run: still open after the
    /// close timeout).
    pub open: u64,
    /// Sockets in TIME-WAIT now (smoltcp holds it 10 s).
    pub time_wait: u64,
}

/// Round-trip times of one run in µs: 1 µs .. 60 s, 3 significant digits.
pub(super) struct Rtt(pub(super) Mutex<Histogram<u64>>);

/// Quantiles of a run's round-trip times in µs (all 0 before the first response).
pub(super) struct RttSummary {
    pub(super) p50: f64,
    pub(super) p99: f64,
    pub(super) max: f64,
    pub(super) mean: f64,
    pub(super) log2_us: Vec<u64>,
}

impl Rtt {
    pub(super) fn new() -> Self {
        Rtt(Mutex::new(Histogram::new_with_bounds(1, 60_000_000, 3).expect("static histogram bounds are valid")))
    }

    /// One round trip (counted as at least 1 µs; beyond the bounds it saturates).
    pub(super) fn record(&self, rtt: Duration) {
        let us = rtt.as_micros().max(1);
        lock(&self.0).saturating_record(u64::try_from(us).unwrap_or(u64::MAX));
    }

    pub(super) fn summary(&self) -> RttSummary {
        let h = lock(&self.0);
        if h.is_empty() {
            RttSummary { p50: 0.0, p99: 0.0, max: 0.0, mean: 0.0, log2_us: Vec::new() }
        } else {
            RttSummary {
                p50: h.value_at_quantile(0.5) as f64,
                p99: h.value_at_quantile(0.99) as f64,
                max: h.max() as f64,
                mean: h.mean(),
                log2_us: log2_buckets(&h),
            }
        }
    }
}

/// Counts per power-of-two bucket of µs (bucket i: 2^i up to 2^(i+1)), as far as the
/// last non-empty bucket.
fn log2_buckets(h: &Histogram<u64>) -> Vec<u64> {
    let mut b = Vec::new();
    for v in h.iter_recorded() {
        let i = (63 - v.value_iterated_to().max(1).leading_zeros()) as usize;
        if b.len() <= i {
            b.resize(i + 1, 0);
        }
        b[i] += v.count_at_value();
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rtt_histogram_counts_per_power_of_two() {
        let r = Rtt::new();
        for us in [1u64, 3, 3, 100, 1000, 1023, 1024] {
            r.record(Duration::from_micros(us));
        }
        let s = r.summary();
        // 1 -> [1,2); 3 -> [2,4); 100 -> [64,128); 1000, 1023 -> [512,1024); 1024 -> [1024,2048)
        let mut want = vec![0u64; 11];
        want[0] = 1;
        want[1] = 2;
        want[6] = 1;
        want[9] = 2;
        want[10] = 1;
        assert_eq!(s.log2_us, want);
        assert_eq!(s.log2_us.iter().sum::<u64>(), 7);
        assert!(Rtt::new().summary().log2_us.is_empty());
    }
}
