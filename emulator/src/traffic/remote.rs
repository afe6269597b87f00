//! A remote end on the emulated wire: a second, plain NIC of the same guest (QEMU's own
//! virtio-net on a `-netdev dgram` socket) shares the wire with the built-in link partner.
//! The kernel's NIC selftests need such a "remote" host (`NetDrvEpEnv`: LOCAL_V4/REMOTE_V4,
//! REMOTE_TYPE=netns): the guest moves the second NIC into a network namespace, and what
//! it sends crosses the wire and enters the emulated NIC like any frame from the network —
//! through RSS, the aRFS table and the ntuple rules, onto an RX queue.
//!
//! [`RemotePort`] owns two unix datagram sockets: one bound at `ours` (QEMU's
//! `remote.path`), read by one thread that hands each frame to the NIC ([`ToGuest`]), and an
//! unbound, non-blocking one that sends the guest's frames to QEMU's `local.path`. One
//! datagram is one Ethernet frame (QEMU's dgram framing). A frame that does not fit the
//! fixed buffer, or is shorter than an Ethernet header, is dropped and counted; a send QEMU
//! cannot take (not started yet, socket queue full) is dropped and counted too, as a full
//! switch port would.
//!
//! [`Segment`] is the wire seen from the guest: the partner and the remote port as one
//! [`GuestPeer`]. A guest frame goes to the remote port when addressed to its MAC, to both
//! when broadcast or multicast (ARP, neighbour discovery), to the partner otherwise. Frames
//! from the remote port addressed to the partner are dropped (the partner talks only to
//! the guest NIC under test).

use crate::traffic::{GuestPeer, ToGuest};
use crate::wire::ethernet::MacAddr;
use serde::{Deserialize, Serialize};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Largest frame taken from the remote NIC (64 KiB plus Ethernet and VLAN headers, as the
/// tap reader).
const MAX_FRAME: usize = 65550;
const ETH_HLEN: usize = 14;
/// How often the reader looks at its stop flag.
const POLL: Duration = Duration::from_millis(100);

/// Counters of the remote port (snapshot).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteStats {
    /// Guest frames handed to the remote NIC.
    pub to_remote_frames: u64,
    /// Guest frames the remote NIC's socket did not take (QEMU not up yet, queue full).
    pub to_remote_dropped: u64,
    /// Frames read from the remote NIC.
    pub from_remote_frames: u64,
    /// Of those, frames the NIC delivered to the guest.
    pub from_remote_delivered: u64,
    /// Of those, frames the NIC did not deliver (drop rule, no buffers, link down).
    pub from_remote_not_delivered: u64,
    /// Frames shorter than an Ethernet header or longer than the buffer.
    pub from_remote_malformed: u64,
    /// Frames addressed to the link partner (dropped).
    pub from_remote_to_partner: u64,
}

#[derive(Default)]
struct Counters {
    to_remote_frames: AtomicU64,
    to_remote_dropped: AtomicU64,
    from_remote_frames: AtomicU64,
    from_remote_delivered: AtomicU64,
    from_remote_not_delivered: AtomicU64,
    from_remote_malformed: AtomicU64,
    from_remote_to_partner: AtomicU64,
}

/// One end of a `-netdev dgram` pair of unix sockets.
pub struct RemotePort {
    ours: PathBuf,
    theirs: PathBuf,
    mac: MacAddr,
    rx: UnixDatagram,
    tx: UnixDatagram,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    reader: Mutex<Option<JoinHandle<()>>>,
}

impl RemotePort {
    /// Bind `ours` (a stale socket there is replaced; anything else is refused) for frames
    /// from the remote NIC whose MAC is `mac`; frames to it go to `theirs`.
    pub fn bind(ours: &Path, theirs: &Path, mac: MacAddr) -> std::io::Result<RemotePort> {
        if let Ok(m) = std::fs::symlink_metadata(ours) {
            use std::os::unix::fs::FileTypeExt;
            if !m.file_type().is_socket() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not a socket", ours.display()),
                ));
            }
            std::fs::remove_file(ours)?;
        }
        let rx = UnixDatagram::bind(ours)?;
        rx.set_read_timeout(Some(POLL))?;
        let tx = UnixDatagram::unbound()?;
        tx.set_nonblocking(true)?;
        Ok(RemotePort {
            ours: ours.to_path_buf(),
            theirs: theirs.to_path_buf(),
            mac,
            rx,
            tx,
            counters: Arc::default(),
            stop: Arc::new(AtomicBool::new(false)),
            reader: Mutex::new(None),
        })
    }

    pub fn mac(&self) -> MacAddr {
        self.mac
    }

    /// Start the reader: frames from the remote NIC go to `nic` unless they are addressed
    /// to `partner_mac`.
    pub fn start(&self, nic: Arc<dyn ToGuest>, partner_mac: MacAddr) -> std::io::Result<()> {
        let mut r = crate::sync::lock(&self.reader);
        if r.is_some() {
            return Ok(());
        }
        let sock = self.rx.try_clone()?;
        let c = self.counters.clone();
        let stop = self.stop.clone();
        let h = std::thread::Builder::new()
            .name("remote-port".into())
            .spawn(move || reader_loop(&sock, &*nic, partner_mac, &c, &stop))?;
        *r = Some(h);
        Ok(())
    }

    /// Send one guest frame to the remote NIC (never blocks).
    pub fn send(&self, frame: &[u8]) {
        match self.tx.send_to(frame, &self.theirs) {
            Ok(_) => self.counters.to_remote_frames.fetch_add(1, Relaxed),
            Err(_) => self.counters.to_remote_dropped.fetch_add(1, Relaxed),
        };
    }

    pub fn stats(&self) -> RemoteStats {
        let c = &self.counters;
        RemoteStats {
            to_remote_frames: c.to_remote_frames.load(Relaxed),
            to_remote_dropped: c.to_remote_dropped.load(Relaxed),
            from_remote_frames: c.from_remote_frames.load(Relaxed),
            from_remote_delivered: c.from_remote_delivered.load(Relaxed),
            from_remote_not_delivered: c.from_remote_not_delivered.load(Relaxed),
            from_remote_malformed: c.from_remote_malformed.load(Relaxed),
            from_remote_to_partner: c.from_remote_to_partner.load(Relaxed),
        }
    }

    /// Stop the reader and remove our socket file.
    pub fn stop(&self) {
        self.stop.store(true, SeqCst);
        if let Some(h) = crate::sync::lock(&self.reader).take() {
            let _ = h.join();
        }
        let _ = std::fs::remove_file(&self.ours);
    }
}

impl Drop for RemotePort {
    fn drop(&mut self) {
        self.stop();
    }
}

fn reader_loop(sock: &UnixDatagram, nic: &dyn ToGuest, partner_mac: MacAddr, c: &Counters, stop: &AtomicBool) {
    // One byte more than the largest frame: a datagram that fills it was truncated.
    let mut buf = vec![0u8; MAX_FRAME + 1];
    while !stop.load(SeqCst) {
        let n = match sock.recv(&mut buf) {
            Ok(n) => n,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                log::warn!("remote port: recv: {e}; stopping the reader");
                return;
            }
        };
        c.from_remote_frames.fetch_add(1, Relaxed);
        if !(ETH_HLEN..=MAX_FRAME).contains(&n) {
            c.from_remote_malformed.fetch_add(1, Relaxed);
            continue;
        }
        let frame = &buf[..n];
        if frame[..6] == partner_mac.0 {
            c.from_remote_to_partner.fetch_add(1, Relaxed);
            continue;
        }
        if nic.to_guest(frame).delivered {
            c.from_remote_delivered.fetch_add(1, Relaxed);
        } else {
            c.from_remote_not_delivered.fetch_add(1, Relaxed);
        }
    }
}

/// The wire as the guest NIC sees it when a remote port shares it with the partner.
pub struct Segment {
    pub partner: Arc<dyn GuestPeer>,
    pub remote: Arc<RemotePort>,
}

impl GuestPeer for Segment {
    fn from_guest(&self, pair: u16, frame: &[u8]) {
        let Some(dst) = frame.get(..6) else {
            // Too short to route: the partner counts it.
            self.partner.from_guest(pair, frame);
            return;
        };
        if dst[0] & 1 == 1 {
            self.remote.send(frame);
            self.partner.from_guest(pair, frame);
        } else if dst == self.remote.mac.0 {
            self.remote.send(frame);
        } else {
            self.partner.from_guest(pair, frame);
        }
    }

    fn link(&self, up: bool) {
        self.partner.link(up);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Delivery;
    use std::sync::atomic::AtomicUsize;

    #[derive(Default)]
    struct Sink {
        frames: Mutex<Vec<Vec<u8>>>,
    }
    impl ToGuest for Sink {
        fn to_guest(&self, frame: &[u8]) -> Delivery {
            crate::sync::lock(&self.frames).push(frame.to_vec());
            Delivery { queue: Some(0), delivered: true, filter: None }
        }
    }
    #[derive(Default)]
    struct Partner {
        n: AtomicUsize,
    }
    impl GuestPeer for Partner {
        fn from_guest(&self, _pair: u16, _frame: &[u8]) {
            self.n.fetch_add(1, Relaxed);
        }
    }

    const REMOTE: MacAddr = MacAddr([0x52, 0x54, 0, 0x72, 0x6d, 0x74]);
    const PARTNER: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 1]);

    fn frame(dst: MacAddr, len: usize) -> Vec<u8> {
        let mut f = vec![0u8; len];
        f[..6].copy_from_slice(&dst.0);
        f[12] = 0x08;
        f
    }

    fn wait_for(what: impl Fn() -> bool) {
        for _ in 0..200 {
            if what() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("timed out");
    }

    #[test]
    fn frames_cross_both_ways_and_bad_ones_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        let (ours, theirs) = (dir.path().join("a"), dir.path().join("q"));
        // QEMU's side: a socket bound at `theirs`, sending to `ours`.
        let qemu = UnixDatagram::bind(&theirs).unwrap();
        qemu.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let port = Arc::new(RemotePort::bind(&ours, &theirs, REMOTE).unwrap());
        let sink = Arc::new(Sink::default());
        port.start(sink.clone(), PARTNER).unwrap();

        let partner = Arc::new(Partner::default());
        let seg = Segment { partner: partner.clone(), remote: port.clone() };
        seg.from_guest(0, &frame(REMOTE, 60)); // remote only
        seg.from_guest(0, &frame(MacAddr([0xff; 6]), 60)); // both
        seg.from_guest(0, &frame(PARTNER, 60)); // partner only
        seg.from_guest(0, &[1, 2]); // partner counts the runt
        let mut b = [0u8; 128];
        assert_eq!(qemu.recv(&mut b).unwrap(), 60);
        assert_eq!(b[..6], REMOTE.0);
        assert_eq!(qemu.recv(&mut b).unwrap(), 60);
        assert_eq!(b[..6], [0xff; 6]);
        assert_eq!(partner.n.load(Relaxed), 3);

        qemu.send_to(&frame(MacAddr([0x52, 0x54, 0, 0, 0, 1]), 64), &ours).unwrap();
        qemu.send_to(&[0u8; 13], &ours).unwrap();
        qemu.send_to(&frame(PARTNER, 64), &ours).unwrap();
        qemu.send_to(&vec![0u8; MAX_FRAME + 100], &ours).unwrap();
        wait_for(|| port.stats().from_remote_frames == 4);
        let s = port.stats();
        assert_eq!(
            (s.to_remote_frames, s.from_remote_delivered, s.from_remote_malformed, s.from_remote_to_partner),
            (2, 1, 2, 1)
        );
        assert_eq!(crate::sync::lock(&sink.frames).len(), 1);

        // QEMU gone: sends are counted as dropped, nothing blocks.
        drop(qemu);
        seg.from_guest(0, &frame(REMOTE, 60));
        assert_eq!(port.stats().to_remote_dropped, 1);
        port.stop();
        assert!(!ours.exists());
    }

    #[test]
    fn bind_refuses_a_path_that_is_not_a_socket() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("file");
        std::fs::write(&f, b"keep me").unwrap();
        assert!(RemotePort::bind(&f, &dir.path().join("q"), REMOTE).is_err());
        assert_eq!(std::fs::read(&f).unwrap(), b"keep me");
    }
}
