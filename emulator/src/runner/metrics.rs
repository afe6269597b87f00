//! `--metrics ADDR` of `serve` and `run`: the device's and the guest driver's counters in
//! Prometheus/OpenMetrics text on `http://ADDR/metrics`, read from the live snapshots at
//! each scrape ([`Sources`]; nothing is kept between scrapes). The counters are the
//! device's since `serve`/`run` started, except the filter and guest ones, which restart
//! with each run of `run` and each device reset (as in the report). Encoded with the `prometheus-client`
//! crate, served by `tiny_http` on one thread.
//!
//! The families and their sources are listed in docs/ci.md ("Live metrics").

use crate::device::guest::GuestStats;
use crate::device::snapshot::FilterSummary;
use crate::device::{ControlRuntime, EmulatedNic};
use crate::traffic::partner::{LinkPartner, LinkStats};
use crate::vhost::Backend;
use anyhow::Context;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// What one scrape shows.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub rx_packets: Vec<u64>,
    pub tx_frames: Vec<u64>,
    pub filter: FilterSummary,
    pub rx_spoofed_dropped: u64,
    pub guest: Option<GuestStats>,
    pub link: Option<LinkStats>,
}

type Labels = Vec<(String, String)>;

fn counter(reg: &mut Registry, name: &str, help: &str, v: u64) {
    let c: Counter = Counter::default();
    c.inc_by(v);
    reg.register(name, help, c);
}

fn labelled(reg: &mut Registry, name: &str, help: &str, label: &str, values: impl IntoIterator<Item = (String, u64)>) {
    let f = Family::<Labels, Counter>::default();
    for (l, v) in values {
        f.get_or_create(&vec![(label.to_string(), l)]).inc_by(v);
    }
    reg.register(name, help, f);
}

/// The OpenMetrics text of one sample.
pub fn encode_sample(s: &Sample) -> String {
    let mut reg = Registry::default();
    let per_queue = |v: &[u64]| v.iter().enumerate().map(|(q, n)| (q.to_string(), *n)).collect::<Vec<_>>();
    labelled(
        &mut reg,
        "arfsnic_rx_packets",
        "Frames the NIC put into each RX queue",
        "queue",
        per_queue(&s.rx_packets),
    );
    labelled(&mut reg, "arfsnic_tx_frames", "Frames taken from each TX queue", "queue", per_queue(&s.tx_frames));
    let f = &s.filter;
    labelled(
        &mut reg,
        "arfsnic_filter_commands",
        "Filter commands completed",
        "op",
        [("add", f.adds), ("mod", f.mods), ("del", f.dels), ("flush", f.flushes)].map(|(o, n)| (o.to_string(), n)),
    );
    labelled(&mut reg, "arfsnic_filter_rejects", "Filter commands that failed", "errno", f.rejects.clone());
    let rules: Gauge = Gauge::default();
    rules.set(i64::try_from(f.rules_now).unwrap_or(i64::MAX));
    reg.register("arfsnic_filter_rules", "Filters installed now", rules);
    counter(
        &mut reg,
        "arfsnic_rx_spoofed_dropped",
        "Wire frames dropped as forged control frames",
        s.rx_spoofed_dropped,
    );
    if let Some(g) = &s.guest {
        let c = |n: &str| g.counters.get(n).copied().unwrap_or(0);
        counter(&mut reg, "arfsnic_guest_steer_calls", "ndo_rx_flow_steer calls (guest driver)", c("steer_calls"));
        counter(&mut reg, "arfsnic_guest_lock_acquired", "arfs_lock acquisitions (guest driver)", c("lock_acquired"));
        counter(&mut reg, "arfsnic_guest_lock_contended", "Contended arfs_lock acquisitions", c("lock_contended"));
        let wait: Counter<f64, AtomicU64> = Counter::default();
        wait.inc_by(c("lock_wait_ns_total") as f64 / 1e9);
        reg.register("arfsnic_guest_lock_wait_seconds", "Time the guest driver waited for arfs_lock", wait);
        let all = Family::<Labels, Gauge>::default();
        for (name, v) in &g.counters {
            all.get_or_create(&vec![("name".into(), name.clone())]).set(i64::try_from(*v).unwrap_or(i64::MAX));
        }
        reg.register("arfsnic_guest_counter", "Every counter of the guest driver's latest STATS frame", all);
    }
    if let Some(l) = &s.link {
        counter(&mut reg, "arfsnic_link_requests", "Requests the link partner sent", l.requests);
        counter(&mut reg, "arfsnic_link_responses", "Responses it received", l.responses);
        counter(&mut reg, "arfsnic_link_lost", "Requests given up as lost", l.lost);
        let rtt = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        rtt.get_or_create(&vec![("quantile".into(), "0.5".into())]).set(l.rtt_us_p50);
        rtt.get_or_create(&vec![("quantile".into(), "0.99".into())]).set(l.rtt_us_p99);
        reg.register("arfsnic_link_rtt_microseconds", "Request/response round trip of the link partner", rtt);
    }
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut out, &reg);
    out
}

/// The control plane of the current run and, in `run`, its link partner.
pub type Live = (Arc<ControlRuntime>, Option<Arc<LinkPartner>>);

/// The device, the backend and (while a run of `run` is on) its control plane and link
/// partner: where a scrape reads its sample.
pub struct Sources {
    pub emu: Arc<EmulatedNic>,
    pub backend: Arc<Backend>,
    /// Set for the duration of a run; `serve` keeps its control plane here for good.
    pub live: Mutex<Option<Live>>,
}

impl Sources {
    pub fn new(emu: Arc<EmulatedNic>, backend: Arc<Backend>) -> Arc<Sources> {
        Arc::new(Sources { emu, backend, live: Mutex::new(None) })
    }

    pub fn set_live(&self, v: Option<Live>) {
        *crate::sync::lock(&self.live) = v;
    }

    pub fn sample(&self) -> Sample {
        let c = self.backend.counters();
        let n = self.emu.nic.snapshot();
        let live = crate::sync::lock(&self.live).clone();
        let (filter, guest, link) = match &live {
            Some((ctl, partner)) => {
                let s = ctl.snapshot();
                (s.filter, s.guest, partner.as_ref().map(|p| p.stats()))
            }
            None => (FilterSummary::default(), None, None),
        };
        Sample {
            rx_packets: n.queues.iter().map(|q| q.rx_packets).collect(),
            tx_frames: c.pairs.iter().map(|p| p.tx_frames).collect(),
            filter,
            rx_spoofed_dropped: self.emu.counters.rx_spoofed_dropped.load(Relaxed),
            guest,
            link,
        }
    }
}

/// The HTTP endpoint; stops (and joins its thread) when dropped.
pub struct MetricsServer {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Listen on `addr` (`127.0.0.1:9464`, port 0 for any) and answer `GET /metrics` with
/// `sample()`; any other path gets 404.
pub fn serve(addr: &str, sample: impl Fn() -> Sample + Send + 'static) -> anyhow::Result<MetricsServer> {
    let server = tiny_http::Server::http(addr).map_err(|e| anyhow::anyhow!("--metrics {addr}: {e}"))?;
    let bound = server.server_addr().to_ip().with_context(|| format!("--metrics {addr}: not an IP address"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let thread = std::thread::Builder::new().name("arfsnic-metrics".into()).spawn(move || {
        while !s.load(Relaxed) {
            let Ok(Some(req)) = server.recv_timeout(Duration::from_millis(200)) else { continue };
            let resp = if req.url() == "/metrics" {
                let ct = tiny_http::Header::from_bytes(
                    "Content-Type",
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                )
                .expect("a valid header");
                tiny_http::Response::from_string(encode_sample(&sample())).with_header(ct)
            } else {
                tiny_http::Response::from_string("arfsnic: metrics are on /metrics\n").with_status_code(404)
            };
            let _ = req.respond(resp);
        }
    })?;
    Ok(MetricsServer { addr: bound, stop, thread: Some(thread) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn sample() -> Sample {
        let mut g = GuestStats::default();
        g.counters.insert("steer_calls".into(), 6403);
        g.counters.insert("lock_wait_ns_total".into(), 2_500_000_000);
        let mut f = FilterSummary { adds: 64, dels: 3, rules_now: 61, ..Default::default() };
        f.rejects.insert("ENOSPC".into(), 2);
        let link = LinkStats {
            requests: 100,
            responses: 99,
            lost: 1,
            rtt_us_p50: 237.0,
            rtt_us_p99: 950.5,
            ..Default::default()
        };
        Sample {
            rx_packets: vec![10, 20],
            tx_frames: vec![1, 2],
            filter: f,
            rx_spoofed_dropped: 0,
            guest: Some(g),
            link: Some(link),
        }
    }

    #[test]
    fn the_text_has_every_family_with_its_values() {
        let t = encode_sample(&sample());
        for line in [
            "arfsnic_rx_packets_total{queue=\"1\"} 20",
            "arfsnic_tx_frames_total{queue=\"0\"} 1",
            "arfsnic_filter_commands_total{op=\"add\"} 64",
            "arfsnic_filter_rejects_total{errno=\"ENOSPC\"} 2",
            "arfsnic_filter_rules 61",
            "arfsnic_guest_steer_calls_total 6403",
            "arfsnic_guest_lock_wait_seconds_total 2.5",
            "arfsnic_guest_counter{name=\"steer_calls\"} 6403",
            "arfsnic_link_lost_total 1",
            "arfsnic_link_rtt_microseconds{quantile=\"0.99\"} 950.5",
            "# EOF",
        ] {
            assert!(t.lines().any(|l| l == line), "no {line:?} in\n{t}");
        }
    }

    #[test]
    fn scraped_over_http() {
        let n = Arc::new(AtomicU64::new(0));
        let m = n.clone();
        let srv = serve("127.0.0.1:0", move || {
            m.fetch_add(1, Relaxed);
            sample()
        })
        .unwrap();
        let get = |path: &str| {
            let mut c = std::net::TcpStream::connect(srv.addr).unwrap();
            write!(c, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
            let mut r = String::new();
            c.read_to_string(&mut r).unwrap();
            r
        };
        let r = get("/metrics");
        assert!(r.starts_with("HTTP/1.0 200") || r.starts_with("HTTP/1.1 200"), "{r}");
        assert!(r.contains("openmetrics-text") && r.contains("arfsnic_guest_steer_calls_total 6403"), "{r}");
        assert!(get("/").contains(" 404 "));
        assert_eq!(n.load(Relaxed), 1, "one sample per scrape of /metrics");
        assert!(serve(&srv.addr.to_string(), sample).is_err(), "the port is taken");
    }
}
