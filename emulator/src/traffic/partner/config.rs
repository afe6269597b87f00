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
        if u32::from(self.guest_base_port) + self.flows > 65536 {
            return bad(format!("guest_base_port {} + flows {} exceeds port 65535", self.guest_base_port, self.flows));
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
        let j = serde_json::to_string(&c).unwrap();
        assert!(j.contains("\"02:a5:f1:00:00:01\""), "{j}");
        assert!(j.contains("\"10.99.0.1\""), "{j}");
    }
}
