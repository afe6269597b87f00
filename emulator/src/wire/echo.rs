//! The echo workload's UDP payload: the request the link partner sends on a flow and the
//! response the guest's echo server (`guest-tests/workload/arfs-echo.c`) sends back. Pure
//! parse/emit, no I/O; payloads are hostile input and parsing never panics.
//!
//! Layout (all fields u32 big endian):
//!
//! | bytes  | request           | response                      |
//! |--------|-------------------|-------------------------------|
//! | 0..4   | `"ARFS"`          | as in the request             |
//! | 4..8   | flow index        | as in the request             |
//! | 8..12  | sequence number   | as in the request             |
//! | 12..16 | zero              | the CPU that served it        |
//! | 16..   | padding           | as in the request             |
//!
//! The guest echoes the whole payload on the reversed 5-tuple and only rewrites bytes
//! 12..16; it drops payloads shorter than [`HEADER_LEN`] or without [`MAGIC`].

use etherparse::{LinkSlice, NetSlice, PacketBuilder, SlicedPacket, TransportSlice};

/// Magic at the start of every request/response payload.
pub const MAGIC: [u8; 4] = *b"ARFS";
/// Bytes of the header (magic, flow, sequence, CPU).
pub const HEADER_LEN: usize = 16;
/// Smallest payload that holds the header fields.
pub const MIN_PAYLOAD: usize = HEADER_LEN;
/// Largest payload that fits a 1500-byte IPv4 MTU.
pub const MAX_PAYLOAD: usize = 1472;

mod field {
    use std::ops::Range;

    pub const MAGIC: Range<usize> = 0..4;
    pub const FLOW: Range<usize> = 4..8;
    pub const SEQ: Range<usize> = 8..12;
    pub const CPU: Range<usize> = 12..16;
}

/// Why a payload is not a request or response of this protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("echo payload shorter than {HEADER_LEN} bytes")]
    Truncated,
    #[error("echo payload does not start with \"ARFS\"")]
    BadMagic,
}

/// The header of a request (`cpu` 0) or a response (`cpu` = the guest CPU that served it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub flow: u32,
    pub seq: u32,
    pub cpu: u32,
}

impl Header {
    /// The header of request `seq` on flow `flow`.
    pub fn request(flow: u32, seq: u32) -> Self {
        Header { flow, seq, cpu: 0 }
    }

    /// Read the header at the start of a UDP payload; what follows it is padding.
    pub fn parse(payload: &[u8]) -> Result<Self, Error> {
        let h = payload.get(..HEADER_LEN).ok_or(Error::Truncated)?;
        if h[field::MAGIC] != MAGIC {
            return Err(Error::BadMagic);
        }
        let be = |r: std::ops::Range<usize>| {
            u32::from_be_bytes([h[r.start], h[r.start + 1], h[r.start + 2], h[r.start + 3]])
        };
        Ok(Header { flow: be(field::FLOW), seq: be(field::SEQ), cpu: be(field::CPU) })
    }

    /// Write magic and fields into the first [`HEADER_LEN`] bytes of `payload`; the padding
    /// after them is left as it is.
    ///
    /// # Panics
    /// If `payload` is shorter than [`HEADER_LEN`].
    pub fn emit(&self, payload: &mut [u8]) {
        payload[field::MAGIC].copy_from_slice(&MAGIC);
        payload[field::FLOW].copy_from_slice(&self.flow.to_be_bytes());
        payload[field::SEQ].copy_from_slice(&self.seq.to_be_bytes());
        payload[field::CPU].copy_from_slice(&self.cpu.to_be_bytes());
    }
}

/// Build the guest side's answer to a request frame, as the guest workload does it: swap
/// MACs, addresses and ports, keep the payload and write `cpu` into bytes 12..16. Returns
/// `None` for anything that is not an IPv4 UDP request of this protocol. Used by tests and
/// by tools that play the guest.
pub fn echo_response(request: &[u8], cpu: u32) -> Option<Vec<u8>> {
    let p = SlicedPacket::from_ethernet(request).ok()?;
    let Some(LinkSlice::Ethernet2(eth)) = &p.link else {
        return None;
    };
    let Some(NetSlice::Ipv4(ip)) = &p.net else {
        return None;
    };
    let Some(TransportSlice::Udp(u)) = &p.transport else {
        return None;
    };
    let payload = u.payload();
    let req = Header::parse(payload).ok()?;
    let mut pl = payload.to_vec();
    Header { cpu, ..req }.emit(&mut pl);
    let h = ip.header();
    let mut out = Vec::with_capacity(request.len());
    PacketBuilder::ethernet2(eth.destination(), eth.source())
        .ipv4(h.destination(), h.source(), 64)
        .udp(u.destination_port(), u.source_port())
        .write(&mut out, &pl)
        .ok()?;
    Some(out)
}

/// Flow index and sequence number of a request frame built by the partner (for tests and
/// guest emulations).
pub fn request_ids(frame: &[u8]) -> Option<(u32, u32)> {
    let p = SlicedPacket::from_ethernet(frame).ok()?;
    let Some(TransportSlice::Udp(u)) = &p.transport else {
        return None;
    };
    let h = Header::parse(u.payload()).ok()?;
    Some((h.flow, h.seq))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Request 0x01020304 on flow 7 with four bytes of padding, as the partner sends it.
    const REQUEST: [u8; 20] = [
        0x41, 0x52, 0x46, 0x53, // "ARFS"
        0x00, 0x00, 0x00, 0x07, // flow
        0x01, 0x02, 0x03, 0x04, // sequence
        0x00, 0x00, 0x00, 0x00, // zero in a request
        0x10, 0x11, 0x12, 0x13, // padding
    ];
    /// The guest's answer from CPU 5.
    const RESPONSE: [u8; 20] = [
        0x41, 0x52, 0x46, 0x53, 0x00, 0x00, 0x00, 0x07, 0x01, 0x02, 0x03, 0x04, 0x00, 0x00, 0x00, 0x05, 0x10, 0x11,
        0x12, 0x13,
    ];

    #[test]
    fn request_vector_parses_and_emits() {
        assert_eq!(Header::parse(&REQUEST), Ok(Header { flow: 7, seq: 0x0102_0304, cpu: 0 }));
        let mut b = [0u8; 20];
        b[16..].copy_from_slice(&REQUEST[16..]);
        Header::request(7, 0x0102_0304).emit(&mut b);
        assert_eq!(b, REQUEST);
        Header { flow: 7, seq: 0x0102_0304, cpu: 5 }.emit(&mut b);
        assert_eq!(b, RESPONSE);
        assert_eq!(Header::parse(&RESPONSE).map(|h| h.cpu), Ok(5));
    }

    #[test]
    fn short_or_foreign_payloads_are_rejected() {
        assert_eq!(Header::parse(&REQUEST[..HEADER_LEN - 1]), Err(Error::Truncated));
        assert_eq!(Header::parse(&[]), Err(Error::Truncated));
        assert!(Header::parse(&REQUEST[..HEADER_LEN]).is_ok(), "the header alone is a valid payload");
        let mut b = REQUEST;
        b[0] = b'a';
        assert_eq!(Header::parse(&b), Err(Error::BadMagic));
    }

    fn request_frame(payload: &[u8]) -> Vec<u8> {
        let mut f = Vec::new();
        PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
            .udp(6007, 5007)
            .write(&mut f, payload)
            .unwrap();
        f
    }

    #[test]
    fn frames_are_echoed_on_the_reversed_tuple() {
        let req = request_frame(&REQUEST);
        assert_eq!(request_ids(&req), Some((7, 0x0102_0304)));
        let resp = echo_response(&req, 5).unwrap();
        let p = SlicedPacket::from_ethernet(&resp).unwrap();
        let Some(LinkSlice::Ethernet2(eth)) = &p.link else { panic!("not Ethernet II") };
        assert_eq!((eth.source(), eth.destination()), ([2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 1]));
        let Some(NetSlice::Ipv4(ip)) = &p.net else { panic!("not IPv4") };
        assert_eq!((ip.header().source(), ip.header().destination()), ([10, 0, 0, 2], [10, 0, 0, 1]));
        let Some(TransportSlice::Udp(u)) = &p.transport else { panic!("not UDP") };
        assert_eq!((u.source_port(), u.destination_port()), (5007, 6007));
        assert_eq!(u.payload(), RESPONSE);
        assert_eq!(echo_response(&request_frame(&REQUEST[..15]), 5), None);
        assert_eq!(request_ids(&request_frame(&RESPONSE[..15])), None);
        assert_eq!(echo_response(&req[..20], 5), None);
    }
}
