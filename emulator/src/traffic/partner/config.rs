//! What a run of the link partner is asked to do: addresses, flows, rate, loop mode and
//! bounds, with the validation [`LinkPartner::new`](super::LinkPartner::new) applies.

use crate::wire::echo::{MAX_PAYLOAD, MIN_PAYLOAD};
use crate::wire::ethernet::MacAddr;
use serde::{Deserialize, Serialize};
use std::net::{Ipv4Addr, Ipv6Addr};

/// Open loop: requests leave at `rate_pps` whatever the guest answers. Closed loop: at most
/// `window` outstanding requests per flow (and at most `rate_pps` if it is non-zero).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LoopMode {
    Open,
    #[default]
    Closed,
}

/// What the partner speaks to the guest: UDP datagrams, one 5-tuple per flow (the default),
/// or TCP connections to one guest port (`tcp.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    #[default]
    Udp,
    Tcp,
}

/// The shape of TCP traffic (docs/scenarios.md, "TCP").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TcpPattern {
    /// `flows` pooled connections, each a request/response loop (rpc_press-like).
    #[default]
    Rr,
    /// Connect, one request/response, close, at `rate_pps` connections/s (TCP_CRR-like).
    Crr,
    /// `flows` connections sending bulk one way, as fast as the guest acknowledges.
    Stream,
}

/// How a TCP connection of the partner ends (`crr`; pooled connections end only at the
/// end of the run, always with FIN).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TcpClose {
    /// FIN handshake; the partner's socket then spends smoltcp's 10 s TIME-WAIT before
    /// its port is used again.
    #[default]
    Fin,
    /// Reset after the response (SO_LINGER 0-like): the port is free at once, so a small
    /// `tcp_ports` range recycles 4-tuples within a fraction of a second.
    Rst,
}

/// Largest TCP message (request/response) in bytes.
pub const MAX_TCP_MSG: usize = 65536;
/// Most TCP sockets a run may hold (each is a smoltcp socket with its buffers).
pub const MAX_TCP_SOCKETS: u32 = 16384;
/// Most memory all TCP socket buffers of a run may take.
pub const MAX_TCP_BUFFERS: u64 = 512 << 20;

/// Link partner configuration (filled by the runner from a scenario).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PartnerConfig {
    pub partner_mac: MacAddr,
    pub partner_ipv4: Ipv4Addr,
    /// When set, neighbour solicitations for it are answered.
    pub partner_ipv6: Option<Ipv6Addr>,
    pub guest_ipv4: Ipv4Addr,
    /// Known guest MAC (skips learning); normally learnt.
    pub guest_mac: Option<MacAddr>,
    /// Number of flows (distinct 5-tuples).
    pub flows: u32,
    /// Flow i is guest UDP port `guest_base_port + i`.
    pub guest_base_port: u16,
    /// Flow i is partner UDP port `partner_base_port + i`.
    pub partner_base_port: u16,
    /// Total offered requests/s over all flows; 0 = as fast as the window allows (closed loop only).
    pub rate_pps: u64,
    /// UDP payload bytes per request (16..=1472).
    pub payload: usize,
    pub mode: LoopMode,
    /// Closed loop: outstanding requests per flow.
    pub window: u32,
    /// Seconds of sending, counted from the first request; 0 = until `stop()`.
    pub duration_s: f64,
    /// A request unanswered for this long is dropped from the in-flight table (lost).
    pub loss_timeout_ms: u64,
    /// `stop()` waits this long at most for the last responses.
    pub drain_ms: u64,
    /// Open loop: in-flight table size per flow.
    pub max_in_flight_per_flow: u32,
    /// UDP (flow i = ports `partner_base_port + i` -> `guest_base_port + i`) or TCP
    /// (connections to `guest_base_port`; flow i = connection slot i).
    pub proto: Proto,
    /// TCP only: what the connections do. `flows` is the number of pooled connections
    /// (`rr`, `stream`) or of sockets cycling through connect/close (`crr`, where
    /// `rate_pps` counts connections per second).
    pub tcp_pattern: TcpPattern,
    /// TCP only: the partner's ports are `partner_base_port ..
    /// partner_base_port + tcp_ports` (0: every port up to 65535). A small range makes
    /// 4-tuples recur (`crr`), as a load tester against one listener port does.
    pub tcp_ports: u32,
    /// TCP `crr` only: how each connection ends.
    pub tcp_close: TcpClose,
}

impl Default for PartnerConfig {
    fn default() -> Self {
        PartnerConfig {
            partner_mac: MacAddr([0x02, 0xa5, 0xf1, 0x00, 0x00, 0x01]),
            partner_ipv4: Ipv4Addr::new(10, 99, 0, 1),
            partner_ipv6: None,
            guest_ipv4: Ipv4Addr::new(10, 99, 0, 2),
            guest_mac: None,
            flows: 64,
            guest_base_port: 5000,
            partner_base_port: 6000,
            rate_pps: 0,
            payload: 64,
            mode: LoopMode::Closed,
            window: 1,
            duration_s: 0.0,
            loss_timeout_ms: 1000,
            drain_ms: 1000,
            max_in_flight_per_flow: 1024,
            proto: Proto::Udp,
            tcp_pattern: TcpPattern::Rr,
            tcp_ports: 0,
            tcp_close: TcpClose::Fin,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartnerError {
    #[error("invalid link partner config: {0}")]
    Config(String),
    #[error("link partner is already running")]
    Running,
    #[error("cannot start the sender thread: {0}")]
    Spawn(String),
}

impl PartnerConfig {
    pub fn validate(&self) -> Result<(), PartnerError> {
        let bad = |m: String| Err(PartnerError::Config(m));
        if self.flows == 0 {
            return bad("flows must be >= 1".into());
        }
        if self.proto == Proto::Tcp {
            self.validate_tcp()?;
        } else {
            if u32::from(self.guest_base_port) + self.flows > 65536 {
                return bad(format!(
                    "guest_base_port {} + flows {} exceeds port 65535",
                    self.guest_base_port, self.flows
                ));
            }
            if u32::from(self.partner_base_port) + self.flows > 65536 {
                return bad(format!(
                    "partner_base_port {} + flows {} exceeds port 65535",
                    self.partner_base_port, self.flows
                ));
            }
            if !(MIN_PAYLOAD..=MAX_PAYLOAD).contains(&self.payload) {
                return bad(format!("payload must be {MIN_PAYLOAD}..={MAX_PAYLOAD} bytes, got {}", self.payload));
            }
        }
        if !self.partner_mac.is_unicast() {
            return bad(format!("partner_mac {} must be a unicast address", self.partner_mac));
        }
        if let Some(m) = self.guest_mac {
            if !m.is_unicast() {
                return bad(format!("guest_mac {m} must be a unicast address"));
            }
        }
        if self.partner_ipv4 == self.guest_ipv4 {
            return bad("partner_ipv4 and guest_ipv4 must differ".into());
        }
        match self.mode {
            LoopMode::Closed if self.window == 0 => return bad("closed loop needs window >= 1".into()),
            LoopMode::Open if self.rate_pps == 0 => {
                return bad(
                    "open loop needs rate_pps > 0 (0 means \"as fast as the window allows\", closed loop only)".into()
                )
            }
            LoopMode::Open if self.max_in_flight_per_flow == 0 => {
                return bad("max_in_flight_per_flow must be >= 1".into())
            }
            _ => {}
        }
        if !self.duration_s.is_finite() || self.duration_s < 0.0 {
            return bad(format!("duration_s must be a finite number >= 0, got {}", self.duration_s));
        }
        if self.loss_timeout_ms == 0 {
            return bad("loss_timeout_ms must be >= 1".into());
        }
        Ok(())
    }

    fn validate_tcp(&self) -> Result<(), PartnerError> {
        let bad = |m: String| Err(PartnerError::Config(m));
        if self.flows > MAX_TCP_SOCKETS {
            return bad(format!("TCP runs hold at most {MAX_TCP_SOCKETS} sockets, flows is {}", self.flows));
        }
        if self.guest_base_port == 0 {
            return bad("guest_base_port (the guest's TCP server port) must not be 0".into());
        }
        // Pooled connections use ports base+i; CRR cycles through base..=65535 and needs a
        // port per socket at least.
        if self.partner_base_port < 1024 || u32::from(self.partner_base_port) + self.flows > 65536 {
            return bad(format!(
                "partner_base_port {} + flows {} must lie within 1024..=65535 for TCP",
                self.partner_base_port, self.flows
            ));
        }
        let span = u32::from(u16::MAX - self.partner_base_port) + 1;
        if self.tcp_ports > span {
            return bad(format!(
                "tcp_ports {} exceeds the {span} ports from partner_base_port {} to 65535",
                self.tcp_ports, self.partner_base_port
            ));
        }
        if self.tcp_ports != 0 && self.tcp_ports < self.flows {
            return bad(format!(
                "tcp_ports {} is fewer than flows {}: every connection needs its own port",
                self.tcp_ports, self.flows
            ));
        }
        if self.tcp_close == TcpClose::Rst && self.tcp_pattern != TcpPattern::Crr {
            return bad("tcp_close = rst is for crr (pooled connections close with FIN)".into());
        }
        if !(MIN_PAYLOAD..=MAX_TCP_MSG).contains(&self.payload) {
            return bad(format!(
                "payload (the TCP message) must be {MIN_PAYLOAD}..={MAX_TCP_MSG} bytes, got {}",
                self.payload
            ));
        }
        if self.tcp_pattern == TcpPattern::Crr && self.rate_pps == 0 {
            return bad("tcp-crr needs rate_pps > 0 (connections per second)".into());
        }
        let (rx, tx) = super::tcp::buffer_sizes(self.tcp_pattern, self.payload, self.in_flight_cap());
        let total = (rx + tx) as u64 * u64::from(self.flows);
        if total > MAX_TCP_BUFFERS {
            return bad(format!(
                "flows {} x socket buffers {} KiB = {} MiB exceeds {} MiB: fewer flows, a smaller payload or window",
                self.flows,
                (rx + tx) >> 10,
                total >> 20,
                MAX_TCP_BUFFERS >> 20
            ));
        }
        Ok(())
    }

    /// Size of a flow's in-flight table.
    pub(super) fn in_flight_cap(&self) -> usize {
        match self.mode {
            LoopMode::Closed => self.window as usize,
            LoopMode::Open => self.max_in_flight_per_flow as usize,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_and_validation() {
        let c = PartnerConfig::default();
        c.validate().unwrap();
        let c2: PartnerConfig = serde_json::from_str(r#"{"flows": 8, "mode": "open", "rate_pps": 1000}"#).unwrap();
        assert_eq!(c2.flows, 8);
        assert_eq!(c2.mode, LoopMode::Open);
        assert_eq!(c2.partner_mac, c.partner_mac);
        c2.validate().unwrap();
        let bad = [
            PartnerConfig { flows: 0, ..c.clone() },
            PartnerConfig { payload: 15, ..c.clone() },
            PartnerConfig { payload: 1473, ..c.clone() },
            PartnerConfig { guest_base_port: 65500, flows: 64, ..c.clone() },
            PartnerConfig { window: 0, ..c.clone() },
            PartnerConfig { mode: LoopMode::Open, rate_pps: 0, ..c.clone() },
            PartnerConfig { duration_s: f64::NAN, ..c.clone() },
        ];
        for b in bad {
            assert!(b.validate().is_err(), "{b:?}");
        }
        let tcp = PartnerConfig { proto: Proto::Tcp, ..c.clone() };
        tcp.validate().unwrap();
        PartnerConfig { payload: 65536, ..tcp.clone() }.validate().unwrap();
        let bad_tcp = [
            (PartnerConfig { payload: 65537, ..tcp.clone() }, "payload"),
            (PartnerConfig { tcp_pattern: TcpPattern::Crr, rate_pps: 0, ..tcp.clone() }, "rate_pps"),
            (PartnerConfig { partner_base_port: 65000, flows: 1000, ..tcp.clone() }, "partner_base_port"),
            (PartnerConfig { partner_base_port: 80, ..tcp.clone() }, "partner_base_port"),
            (PartnerConfig { flows: MAX_TCP_SOCKETS + 1, partner_base_port: 1024, ..tcp.clone() }, "sockets"),
            (PartnerConfig { flows: 4096, payload: 65536, window: 16, ..tcp.clone() }, "MiB"),
            (PartnerConfig { guest_base_port: 0, ..tcp.clone() }, "guest_base_port"),
            (PartnerConfig { tcp_ports: 8, flows: 64, ..tcp.clone() }, "fewer than flows"),
            (PartnerConfig { tcp_ports: 65000, ..tcp.clone() }, "exceeds"),
            (PartnerConfig { tcp_close: TcpClose::Rst, ..tcp.clone() }, "for crr"),
        ];
        for (b, field) in bad_tcp {
            let e = b.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{field}: {e}");
        }
        let j = serde_json::to_string(&c).unwrap();
        assert!(j.contains("\"02:a5:f1:00:00:01\""), "{j}");
        assert!(j.contains("\"10.99.0.1\""), "{j}");
    }
}
