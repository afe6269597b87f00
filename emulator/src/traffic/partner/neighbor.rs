//! Neighbour handling: the guest's MAC (configured, or learnt from its ARP traffic and
//! IPv4 frames), ARP requests for the guest while it is unknown, and answers to the
//! guest's ARP requests and IPv6 neighbour solicitations for the partner's addresses.

use super::{Inner, PartnerConfig};
use crate::wire::ethernet::MacAddr;
use etherparse::{
    icmpv6::NeighborAdvertisementHeader, ArpHardwareId, ArpOperation, ArpPacket, ArpPacketSlice, EtherType, Icmpv6Type,
    PacketBuilder,
};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Interval of ARP requests while the guest MAC is unknown.
pub(super) const ARP_RETRY: Duration = Duration::from_millis(200);

const MAC_KNOWN: u64 = 1 << 63;

/// The guest's MAC, readable from any thread: 0 = unknown, else the MAC in the low 48 bits
/// | 1 << 63.
pub(super) struct GuestMac(AtomicU64);

fn slot(mac: Option<MacAddr>) -> u64 {
    mac.map(|m| m.to_u64() | MAC_KNOWN).unwrap_or(0)
}

impl GuestMac {
    pub(super) fn new(configured: Option<MacAddr>) -> Self {
        GuestMac(AtomicU64::new(slot(configured)))
    }

    pub(super) fn get(&self) -> Option<MacAddr> {
        let v = self.0.load(Relaxed);
        (v & MAC_KNOWN != 0).then(|| MacAddr::from_u64(v & !MAC_KNOWN))
    }

    /// Store `mac`; whether it differs from what was known.
    fn set(&self, mac: MacAddr) -> bool {
        let v = mac.to_u64() | MAC_KNOWN;
        self.0.swap(v, Relaxed) != v
    }

    /// Back to the configured MAC, or to unknown (learn it again).
    pub(super) fn reset(&self, configured: Option<MacAddr>) {
        self.0.store(slot(configured), Relaxed);
    }
}

impl Inner {
    pub(super) fn guest_mac(&self) -> Option<MacAddr> {
        self.guest_mac.get()
    }

    pub(super) fn learn(&self, mac: MacAddr) {
        if mac.is_unicast() && self.guest_mac.set(mac) {
            log::debug!("link partner: guest MAC is {mac}");
            self.run.load().wake_sender();
        }
    }

    pub(super) fn send_arp_request(&self, cfg: &PartnerConfig) {
        let arp = ArpPacket::new(
            ArpHardwareId::ETHERNET,
            EtherType::IPV4,
            ArpOperation::REQUEST,
            &cfg.partner_mac.0,
            &cfg.partner_ipv4.octets(),
            &[0; 6],
            &cfg.guest_ipv4.octets(),
        );
        let Ok(arp) = arp else { return };
        let mut buf = Vec::with_capacity(42);
        if PacketBuilder::ethernet2(cfg.partner_mac.0, MacAddr::BROADCAST.0).arp(arp).write(&mut buf).is_ok() {
            self.arp_sent.fetch_add(1, Relaxed);
            let _ = self.to_guest.to_guest(&buf);
        }
    }

    pub(super) fn handle_arp(&self, cfg: &PartnerConfig, a: &ArpPacketSlice<'_>) {
        if a.hw_addr_type() != ArpHardwareId::ETHERNET
            || a.proto_addr_type() != EtherType::IPV4
            || a.hw_addr_size() != 6
            || a.proto_addr_size() != 4
        {
            self.other.fetch_add(1, Relaxed);
            return;
        }
        let (Ok(smac), Ok(sip), Ok(tip)) = (
            <[u8; 6]>::try_from(a.sender_hw_addr()),
            <[u8; 4]>::try_from(a.sender_protocol_addr()),
            <[u8; 4]>::try_from(a.target_protocol_addr()),
        ) else {
            self.other.fetch_add(1, Relaxed);
            return;
        };
        if Ipv4Addr::from(sip) == cfg.guest_ipv4 {
            self.learn(MacAddr(smac));
        }
        if a.operation() == ArpOperation::REQUEST && Ipv4Addr::from(tip) == cfg.partner_ipv4 {
            let smac = MacAddr(smac);
            if !smac.is_unicast() {
                return;
            }
            let Ok(reply) = ArpPacket::new(
                ArpHardwareId::ETHERNET,
                EtherType::IPV4,
                ArpOperation::REPLY,
                &cfg.partner_mac.0,
                &cfg.partner_ipv4.octets(),
                &smac.0,
                &sip,
            ) else {
                return;
            };
            let mut buf = Vec::with_capacity(42);
            if PacketBuilder::ethernet2(cfg.partner_mac.0, smac.0).arp(reply).write(&mut buf).is_ok() {
                self.arp_answered.fetch_add(1, Relaxed);
                let _ = self.to_guest.to_guest(&buf);
            }
        }
    }

    /// Neighbour solicitation for our IPv6 address -> solicited neighbour advertisement.
    pub(super) fn handle_ns(&self, cfg: &PartnerConfig, eth_src: [u8; 6], src: Ipv6Addr, body: &[u8]) {
        let Some(ours) = cfg.partner_ipv6 else {
            self.other.fetch_add(1, Relaxed);
            return;
        };
        let Some(target) = body.get(..16).and_then(|t| <[u8; 16]>::try_from(t).ok()) else {
            self.other.fetch_add(1, Relaxed);
            return;
        };
        if Ipv6Addr::from(target) != ours {
            return;
        }
        // Source link-layer address option (type 1), else the Ethernet source.
        let mut opts = body.get(16..).unwrap_or(&[]);
        let mut dst_mac = eth_src;
        while opts.len() >= 8 {
            let len = usize::from(opts[1]) * 8;
            if len == 0 || len > opts.len() {
                break;
            }
            if opts[0] == 1 && len >= 8 {
                dst_mac.copy_from_slice(&opts[2..8]);
            }
            opts = &opts[len..];
        }
        let unspecified = src.is_unspecified();
        // DAD probe (source ::): answer to all-nodes, not solicited (RFC 4861 7.2.4).
        let (dst_ip, dst_mac) = if unspecified {
            (Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1), [0x33, 0x33, 0, 0, 0, 1])
        } else {
            (src, dst_mac)
        };
        if !unspecified && !MacAddr(dst_mac).is_unicast() {
            return;
        }
        let mut body = [0u8; 24];
        body[..16].copy_from_slice(&ours.octets());
        body[16] = 2; // target link-layer address
        body[17] = 1;
        body[18..24].copy_from_slice(&cfg.partner_mac.0);
        let na = Icmpv6Type::NeighborAdvertisement(NeighborAdvertisementHeader {
            router: false,
            solicited: !unspecified,
            r#override: true,
        });
        let mut buf = Vec::with_capacity(86);
        if PacketBuilder::ethernet2(cfg.partner_mac.0, dst_mac)
            .ipv6(ours.octets(), dst_ip.octets(), 255)
            .icmpv6(na)
            .write(&mut buf, &body)
            .is_ok()
        {
            self.nd_answered.fetch_add(1, Relaxed);
            let _ = self.to_guest.to_guest(&buf);
        }
    }
}
