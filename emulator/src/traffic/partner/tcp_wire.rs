//! The TCP engine's side of the emulated wire, as smoltcp's [`Device`]: segments from the
//! guest wait in a queue the vhost worker fills ([`super::LinkPartner`]'s `from_guest`);
//! segments smoltcp sends get an Ethernet header to the guest's MAC and go into the NIC's
//! receive path, which classifies them like any frame from the network. Every segment sent
//! is checked against what was sent before on its port, which counts retransmissions as
//! they appear on the wire (smoltcp keeps no such counter).

use super::Inner;
use crate::traffic::Delivery;
use crate::wire::ethernet::MacAddr;
use smoltcp::phy::{self, Device, DeviceCapabilities, Medium};
use smoltcp::time::Instant as SmolInstant;
use smoltcp::wire::{IpProtocol, Ipv4Packet, TcpPacket};
use std::collections::{HashMap, VecDeque};

/// IP MTU of the emulated wire (the guest's default).
pub(super) const MTU: usize = 1500;

/// What is sent: the way to the guest, the retransmission check and where the NIC put
/// each segment (for the per-flow queue and filter records).
pub(super) struct Tx<'a> {
    inner: &'a Inner,
    pub(super) guest_mac: Option<MacAddr>,
    partner_mac: MacAddr,
    frame: Vec<u8>,
    ip: Vec<u8>,
    /// Per partner port: the connection's initial sequence number and the highest
    /// sequence number sent so far (end of the segment).
    sent: HashMap<u16, (u32, u32)>,
    /// (partner port, where the NIC put it), drained by the engine after each poll.
    pub(super) deliveries: Vec<(u16, Delivery)>,
    pub(super) segments: u64,
    pub(super) retransmits: u64,
    pub(super) no_mac: u64,
}

/// smoltcp's device: the input queue and the sending side.
pub(super) struct Wire<'a> {
    pub(super) rx: VecDeque<Vec<u8>>,
    pub(super) tx: Tx<'a>,
}

impl<'a> Wire<'a> {
    pub(super) fn new(inner: &'a Inner, partner_mac: MacAddr) -> Self {
        Wire {
            rx: VecDeque::new(),
            tx: Tx {
                inner,
                guest_mac: None,
                partner_mac,
                frame: Vec::with_capacity(MTU + 14),
                ip: Vec::with_capacity(MTU),
                sent: HashMap::new(),
                deliveries: Vec::new(),
                segments: 0,
                retransmits: 0,
                no_mac: 0,
            },
        }
    }
}

impl Tx<'_> {
    /// One IPv4 packet from smoltcp onto the wire.
    fn emit(&mut self) {
        let Some(dst) = self.guest_mac else {
            // The guest's MAC is not known yet: the segment is lost, smoltcp sends it again.
            self.no_mac += 1;
            return;
        };
        let port = self.check_retransmit();
        self.frame.clear();
        self.frame.extend_from_slice(&dst.0);
        self.frame.extend_from_slice(&self.partner_mac.0);
        self.frame.extend_from_slice(&0x0800u16.to_be_bytes());
        self.frame.extend_from_slice(&self.ip);
        let d = self.inner.to_guest.to_guest(&self.frame);
        self.segments += 1;
        if let Some(p) = port {
            self.deliveries.push((p, d));
        }
    }

    /// Count the segment in `self.ip` as a retransmission when it is one. Returns the
    /// partner port.
    fn check_retransmit(&mut self) -> Option<u16> {
        let (port, again) = classify(&mut self.sent, &self.ip)?;
        if again {
            self.retransmits += 1;
        }
        Some(port)
    }
}

/// A TCP segment the partner sends (an IPv4 packet): its source port, and whether it is a
/// retransmission — its sequence range ends at or before what its connection has sent
/// already, or it is the same SYN again. `sent` holds per port the connection's initial
/// sequence number and the end of what was sent so far. `None`: not IPv4/TCP.
fn classify(sent: &mut HashMap<u16, (u32, u32)>, ip: &[u8]) -> Option<(u16, bool)> {
    let ip = Ipv4Packet::new_checked(ip).ok()?;
    if ip.next_header() != IpProtocol::Tcp {
        return None;
    }
    let tcp = TcpPacket::new_checked(ip.payload()).ok()?;
    let port = tcp.src_port();
    let seq = tcp.seq_number().0 as u32;
    let len = tcp.segment_len() as u32;
    if len == 0 {
        return Some((port, false));
    }
    let end = seq.wrapping_add(len);
    if tcp.syn() && !tcp.ack() {
        // A new connection on this port starts its own sequence space.
        if sent.get(&port).is_some_and(|&(isn, _)| isn == seq) {
            return Some((port, true));
        }
        sent.insert(port, (seq, end));
        return Some((port, false));
    }
    match sent.get_mut(&port) {
        Some((_, max)) if (end.wrapping_sub(*max) as i32) <= 0 => Some((port, true)),
        Some((_, max)) => {
            *max = end;
            Some((port, false))
        }
        None => {
            sent.insert(port, (seq, end));
            Some((port, false))
        }
    }
}

pub(super) struct RxTok(Vec<u8>);
pub(super) struct TxTok<'a, 'b>(&'a mut Tx<'b>);

impl phy::RxToken for RxTok {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl phy::TxToken for TxTok<'_, '_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let tx = self.0;
        let mut ip = std::mem::take(&mut tx.ip);
        ip.clear();
        ip.resize(len, 0);
        let r = f(&mut ip);
        tx.ip = ip;
        tx.emit();
        r
    }
}

impl<'b> Device for Wire<'b> {
    type RxToken<'a>
        = RxTok
    where
        Self: 'a;
    type TxToken<'a>
        = TxTok<'a, 'b>
    where
        Self: 'a;

    fn receive(&mut self, _t: SmolInstant) -> Option<(RxTok, TxTok<'_, 'b>)> {
        let buf = self.rx.pop_front()?;
        Some((RxTok(buf), TxTok(&mut self.tx)))
    }

    fn transmit(&mut self, _t: SmolInstant) -> Option<TxTok<'_, 'b>> {
        Some(TxTok(&mut self.tx))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut c = DeviceCapabilities::default();
        c.medium = Medium::Ip;
        c.max_transmission_unit = MTU;
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::PacketBuilder;

    fn segment(port: u16, seq: u32, syn: bool, payload: &[u8]) -> Vec<u8> {
        let b = PacketBuilder::ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64).tcp(port, 7000, seq, 1024);
        let b = if syn { b.syn() } else { b.ack(1) };
        let mut v = Vec::new();
        b.write(&mut v, payload).unwrap();
        v
    }

    #[test]
    fn retransmissions_are_segments_sent_before() {
        let mut sent = HashMap::new();
        let mut c = |ip: &[u8]| classify(&mut sent, ip);
        assert_eq!(c(&segment(9000, 100, true, b"")), Some((9000, false)), "SYN");
        assert_eq!(c(&segment(9000, 100, true, b"")), Some((9000, true)), "the same SYN again");
        assert_eq!(c(&segment(9000, 101, false, &[0; 64])), Some((9000, false)));
        assert_eq!(c(&segment(9000, 101, false, &[0; 64])), Some((9000, true)), "the same data again");
        assert_eq!(c(&segment(9000, 165, false, b"")), Some((9000, false)), "a pure ACK is never one");
        assert_eq!(c(&segment(9000, 165, false, &[0; 64])), Some((9000, false)));
        assert_eq!(c(&segment(9001, 5, false, &[0; 8])), Some((9001, false)), "another connection");
        assert_eq!(c(&segment(9000, 7000, true, b"")), Some((9000, false)), "a new connection on the port");
        assert_eq!(c(&segment(9000, u32::MAX - 3, false, &[0; 8])), Some((9000, true)), "before the new ISN");
        assert_eq!(c(&[0x45, 0, 0]), None, "not a packet");
    }
}
