//! Tap mode: the emulated wire ends in a host tap device instead of the built-in link
//! partner, so host tools (netperf, rpc_press, ping, a namespace's sockets) talk to the guest.
//!
//! [`TapPeer::open`] opens `/dev/net/tun` once per queue pair with
//! `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR | IFF_MULTI_QUEUE` on the same interface name and sets
//! the vnet header size to 12 (`struct virtio_net_hdr_mrg_rxbuf`). It configures nothing else:
//! addresses, link state and namespaces are the user's business (`ip link set NAME up`, ...).
//! No offloads are enabled (no `TUNSETOFFLOAD`), so the kernel hands us complete,
//! checksummed, unsegmented frames; a frame that still asks for a checksum
//! (`VIRTIO_NET_HDR_F_NEEDS_CSUM`) gets it computed here, a GSO frame is dropped and counted.
//!
//! * guest → host: [`GuestPeer::from_guest`] writes a zero vnet header plus the frame to queue
//!   `pair % queues` (one `writev`, so one packet).
//! * host → guest: one reader thread per queue reads a frame, strips the vnet header and hands
//!   it to [`ToGuest::to_guest`]; the NIC model decides the RX queue. Each reader owns one
//!   fixed buffer; nothing is queued in between.
//!
//! The interface exists as long as the fds are open (it is not made persistent).

use crate::traffic::{GuestPeer, ToGuest};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{IoSlice, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Size of the vnet header we configure (`virtio_net_hdr_mrg_rxbuf`).
const VNET_HDR_LEN: usize = 12;
/// Largest frame read from the tap (64 KiB plus Ethernet/VLAN headers).
const MAX_TAP_FRAME: usize = 65550;
/// Most queues one tap may have (the kernel's MAX_TAP_QUEUES is 256).
const MAX_TAP_QUEUES: u16 = 256;

const TUN_PATH: &str = "/dev/net/tun";
// _IOW('T', 202, int) and _IOW('T', 216, int) from <linux/if_tun.h>.
const TUNSETIFF: u64 = 0x4004_54ca;
const TUNSETVNETHDRSZ: u64 = 0x4004_54d8;
const VIRTIO_NET_HDR_F_NEEDS_CSUM: u8 = 1;
const VIRTIO_NET_HDR_GSO_NONE: u8 = 0;

/// `struct ifreq` as TUNSETIFF reads it: name, then the flags member of the union.
#[repr(C)]
struct IfReqFlags {
    name: [libc::c_char; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

#[derive(Debug, thiserror::Error)]
pub enum TapError {
    #[error("invalid tap name {0:?}: 1..15 bytes, no '/', whitespace or NUL")]
    Name(String),
    #[error("tap queues must be 1..={MAX_TAP_QUEUES}, got {0}")]
    Queues(u16),
    #[error("open {TUN_PATH}: {0} (is the tun module loaded, are we root or CAP_NET_ADMIN?)")]
    Open(std::io::Error),
    #[error("TUNSETIFF {name} (queue {queue}): {source}")]
    SetIff { name: String, queue: u16, source: std::io::Error },
    #[error("TUNSETVNETHDRSZ on {name}: {source}")]
    VnetHdr { name: String, source: std::io::Error },
    #[error("tap reader setup: {0}")]
    Io(#[from] std::io::Error),
    #[error("tap {0} is already started")]
    Running(String),
}

/// Counters of the tap peer (snapshot).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TapStats {
    pub name: String,
    pub queues: u16,
    /// Frames read from the tap and offered to the guest.
    pub to_guest_frames: u64,
    pub to_guest_bytes: u64,
    /// Of those, frames the NIC did not deliver (no buffers, drop filter, link down).
    pub to_guest_dropped: u64,
    /// Reads shorter than the vnet header or failing.
    pub read_errors: u64,
    /// Frames with a GSO type (cannot happen without offloads; dropped).
    pub gso_dropped: u64,
    /// Frames whose checksum we completed (NEEDS_CSUM).
    pub csum_completed: u64,
    /// Guest frames written to the tap.
    pub from_guest_frames: u64,
    pub from_guest_bytes: u64,
    /// Writes that failed or were short (e.g. EIO while the interface is down).
    pub write_errors: u64,
    /// Reads per tap queue.
    pub per_queue_reads: Vec<u64>,
}

#[derive(Default)]
struct Counters {
    to_guest_frames: AtomicU64,
    to_guest_bytes: AtomicU64,
    to_guest_dropped: AtomicU64,
    read_errors: AtomicU64,
    gso_dropped: AtomicU64,
    csum_completed: AtomicU64,
    from_guest_frames: AtomicU64,
    from_guest_bytes: AtomicU64,
    write_errors: AtomicU64,
}

/// A multiqueue tap device as the NIC's traffic peer.
pub struct TapPeer {
    name: String,
    fds: Vec<Arc<File>>,
    counters: Arc<Counters>,
    per_queue_reads: Arc<Vec<AtomicU64>>,
    stop: Arc<AtomicBool>,
    wake: Mutex<Option<EventFd>>,
    readers: Mutex<Vec<JoinHandle<()>>>,
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() < libc::IFNAMSIZ
        && !name.bytes().any(|b| b == b'/' || b == 0 || b.is_ascii_whitespace())
        && name != "."
        && name != ".."
}

impl TapPeer {
    /// Create (or attach to) tap `name` with `queues` queues. Needs CAP_NET_ADMIN.
    pub fn open(name: &str, queues: u16) -> Result<Arc<Self>, TapError> {
        if !valid_name(name) {
            return Err(TapError::Name(name.to_string()));
        }
        if queues == 0 || queues > MAX_TAP_QUEUES {
            return Err(TapError::Queues(queues));
        }
        let mut fds = Vec::with_capacity(usize::from(queues));
        for q in 0..queues {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open(TUN_PATH)
                .map_err(TapError::Open)?;
            let mut req = IfReqFlags { name: [0; libc::IFNAMSIZ], flags: 0, _pad: [0; 22] };
            for (d, s) in req.name.iter_mut().zip(name.bytes()) {
                *d = s as libc::c_char;
            }
            req.flags = (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR | libc::IFF_MULTI_QUEUE) as libc::c_short;
            // SAFETY: `f` is an open /dev/net/tun fd; TUNSETIFF reads (and may write back the
            // name into) a `struct ifreq`, and `req` is a properly sized, initialised
            // `#[repr(C)]` ifreq (16-byte name, flags, padding to 40 bytes) that outlives the call.
            let r = unsafe { libc::ioctl(f.as_raw_fd(), TUNSETIFF as _, &mut req as *mut IfReqFlags) };
            if r < 0 {
                return Err(TapError::SetIff {
                    name: name.to_string(),
                    queue: q,
                    source: std::io::Error::last_os_error(),
                });
            }
            let hdr: libc::c_int = VNET_HDR_LEN as libc::c_int;
            // SAFETY: TUNSETVNETHDRSZ reads one `int` through the pointer; `hdr` is a live
            // c_int on our stack for the duration of the call.
            let r = unsafe { libc::ioctl(f.as_raw_fd(), TUNSETVNETHDRSZ as _, &hdr as *const libc::c_int) };
            if r < 0 {
                return Err(TapError::VnetHdr { name: name.to_string(), source: std::io::Error::last_os_error() });
            }
            fds.push(Arc::new(f));
        }
        Ok(Arc::new(TapPeer {
            name: name.to_string(),
            per_queue_reads: Arc::new((0..queues).map(|_| AtomicU64::new(0)).collect()),
            fds,
            counters: Arc::new(Counters::default()),
            stop: Arc::new(AtomicBool::new(false)),
            wake: Mutex::new(None),
            readers: Mutex::new(Vec::new()),
        }))
    }

    pub fn queues(&self) -> u16 {
        self.fds.len() as u16
    }

    /// Start one reader thread per queue; frames go to `to_guest`.
    pub fn start(&self, to_guest: Arc<dyn ToGuest>) -> Result<(), TapError> {
        let mut readers = crate::sync::lock(&self.readers);
        if !readers.is_empty() {
            return Err(TapError::Running(self.name.clone()));
        }
        self.stop.store(false, SeqCst);
        let wake = EventFd::new(EFD_NONBLOCK)?;
        for (q, f) in self.fds.iter().enumerate() {
            let epoll = Epoll::new()?;
            epoll.ctl(ControlOperation::Add, f.as_raw_fd(), EpollEvent::new(EventSet::IN, 1))?;
            epoll.ctl(ControlOperation::Add, wake.as_raw_fd(), EpollEvent::new(EventSet::IN, 0))?;
            let r = Reader {
                fd: f.clone(),
                queue: q,
                epoll,
                to_guest: to_guest.clone(),
                counters: self.counters.clone(),
                reads: self.per_queue_reads.clone(),
                stop: self.stop.clone(),
            };
            let h = std::thread::Builder::new().name(format!("tap-rx{q}")).spawn(move || r.run());
            match h {
                Ok(h) => readers.push(h),
                Err(e) => {
                    drop(readers);
                    self.stop_readers(Some(wake));
                    return Err(TapError::Io(e));
                }
            }
        }
        *crate::sync::lock(&self.wake) = Some(wake);
        Ok(())
    }

    /// Stop and join the reader threads (the tap stays open; `start` may be called again).
    pub fn stop(&self) {
        let wake = crate::sync::lock(&self.wake).take();
        self.stop_readers(wake);
    }

    fn stop_readers(&self, wake: Option<EventFd>) {
        self.stop.store(true, SeqCst);
        if let Some(w) = &wake {
            let _ = w.write(1);
        }
        let hs: Vec<_> = crate::sync::lock(&self.readers).drain(..).collect();
        for h in hs {
            let _ = h.join();
        }
    }

    pub fn stats(&self) -> TapStats {
        let c = &self.counters;
        TapStats {
            name: self.name.clone(),
            queues: self.queues(),
            to_guest_frames: c.to_guest_frames.load(Relaxed),
            to_guest_bytes: c.to_guest_bytes.load(Relaxed),
            to_guest_dropped: c.to_guest_dropped.load(Relaxed),
            read_errors: c.read_errors.load(Relaxed),
            gso_dropped: c.gso_dropped.load(Relaxed),
            csum_completed: c.csum_completed.load(Relaxed),
            from_guest_frames: c.from_guest_frames.load(Relaxed),
            from_guest_bytes: c.from_guest_bytes.load(Relaxed),
            write_errors: c.write_errors.load(Relaxed),
            per_queue_reads: self.per_queue_reads.iter().map(|a| a.load(Relaxed)).collect(),
        }
    }
}

impl Drop for TapPeer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl GuestPeer for TapPeer {
    fn from_guest(&self, pair: u16, frame: &[u8]) {
        let Some(f) = self.fds.get(usize::from(pair) % self.fds.len().max(1)) else {
            return;
        };
        if frame.is_empty() || frame.len() > MAX_TAP_FRAME {
            self.counters.write_errors.fetch_add(1, Relaxed);
            return;
        }
        let hdr = [0u8; VNET_HDR_LEN];
        let want = VNET_HDR_LEN + frame.len();
        match (&**f).write_vectored(&[IoSlice::new(&hdr), IoSlice::new(frame)]) {
            Ok(n) if n == want => {
                self.counters.from_guest_frames.fetch_add(1, Relaxed);
                self.counters.from_guest_bytes.fetch_add(frame.len() as u64, Relaxed);
            }
            _ => {
                self.counters.write_errors.fetch_add(1, Relaxed);
            }
        }
    }
}

struct Reader {
    fd: Arc<File>,
    queue: usize,
    epoll: Epoll,
    to_guest: Arc<dyn ToGuest>,
    counters: Arc<Counters>,
    reads: Arc<Vec<AtomicU64>>,
    stop: Arc<AtomicBool>,
}

impl Reader {
    fn run(self) {
        let mut buf = vec![0u8; VNET_HDR_LEN + MAX_TAP_FRAME];
        let mut events = [EpollEvent::default(); 2];
        while !self.stop.load(SeqCst) {
            // The timeout is only a safety net; `stop` also writes the wake eventfd.
            let n = match self.epoll.wait(200, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.counters.read_errors.fetch_add(1, Relaxed);
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                }
            };
            if !events[..n].iter().any(|e| e.data() == 1) {
                continue;
            }
            // Drain what is ready (bounded per wakeup so `stop` is noticed).
            for _ in 0..1024 {
                if self.stop.load(Relaxed) {
                    return;
                }
                match (&*self.fd).read(&mut buf) {
                    Ok(len) => self.frame(&mut buf[..len]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        // EBADFD/EIO while the tap is detached or going down: back off.
                        self.counters.read_errors.fetch_add(1, Relaxed);
                        std::thread::sleep(std::time::Duration::from_millis(10));
                        break;
                    }
                }
            }
        }
    }

    fn frame(&self, data: &mut [u8]) {
        if let Some(r) = self.reads.get(self.queue) {
            r.fetch_add(1, Relaxed);
        }
        if data.len() < VNET_HDR_LEN + 14 {
            self.counters.read_errors.fetch_add(1, Relaxed);
            crate::warn_ratelimited!("tap: frame shorter than an Ethernet header dropped (counted in read_errors)");
            return;
        }
        let (hdr, frame) = data.split_at_mut(VNET_HDR_LEN);
        if hdr[1] & 0x7f != VIRTIO_NET_HDR_GSO_NONE {
            self.counters.gso_dropped.fetch_add(1, Relaxed);
            crate::warn_ratelimited!(
                "tap: GSO frame dropped (counted in gso_dropped; turn off GSO/TSO on the tap's peer)"
            );
            return;
        }
        if hdr[0] & VIRTIO_NET_HDR_F_NEEDS_CSUM != 0 {
            let start = usize::from(u16::from_le_bytes([hdr[6], hdr[7]]));
            let off = usize::from(u16::from_le_bytes([hdr[8], hdr[9]]));
            if !complete_checksum(frame, start, off) {
                self.counters.read_errors.fetch_add(1, Relaxed);
                crate::warn_ratelimited!(
                    "tap: frame with checksum offsets outside it dropped (counted in read_errors)"
                );
                return;
            }
            self.counters.csum_completed.fetch_add(1, Relaxed);
        }
        self.counters.to_guest_frames.fetch_add(1, Relaxed);
        self.counters.to_guest_bytes.fetch_add(frame.len() as u64, Relaxed);
        let d = self.to_guest.to_guest(frame);
        if !d.delivered {
            self.counters.to_guest_dropped.fetch_add(1, Relaxed);
        }
    }
}

/// Finish a partial checksum as a device does for NEEDS_CSUM: the 16-bit one's complement
/// sum of `frame[start..]` (the pseudo-header sum is already in the checksum field) stored
/// at `start + off`. Returns false when the offsets do not fit the frame.
fn complete_checksum(frame: &mut [u8], start: usize, off: usize) -> bool {
    let Some(at) = start.checked_add(off) else {
        return false;
    };
    if start >= frame.len() || at.checked_add(2).is_none_or(|e| e > frame.len()) {
        return false;
    }
    let mut sum: u64 = 0;
    let mut chunks = frame[start..].chunks_exact(2);
    for c in &mut chunks {
        sum += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [b] = chunks.remainder() {
        sum += u64::from(*b) << 8;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let c = !(sum as u16);
    frame[at..at + 2].copy_from_slice(&c.to_be_bytes());
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(valid_name("arfs0"));
        assert!(!valid_name(""));
        assert!(!valid_name("a/b"));
        assert!(!valid_name("sixteen-chars-xx"));
        assert!(!valid_name("a b"));
        assert!(matches!(TapPeer::open("a/b", 1), Err(TapError::Name(_))));
        assert!(matches!(TapPeer::open("ok0", 0), Err(TapError::Queues(0))));
    }

    #[test]
    fn checksum_completion_is_bounded() {
        let mut f = vec![0u8; 20];
        assert!(!complete_checksum(&mut f, 20, 0));
        assert!(!complete_checksum(&mut f, 10, 9));
        assert!(!complete_checksum(&mut f, usize::MAX, 2));
        assert!(complete_checksum(&mut f, 10, 8));
        // Sum over [10..20] with the checksum field included must now be 0xffff.
        let mut s: u32 = f[10..].chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], c[1]]))).sum();
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        assert_eq!(s, 0xffff);
    }
}
