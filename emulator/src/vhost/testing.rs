//! Test and benchmark harness: a scripted vhost-user **frontend** and **guest driver** in one
//! process, for driving a real [`Backend`](super::Backend) without QEMU.
//!
//! Not used by the device itself. The regression test `tests/vhost_frontend_order.rs` and the
//! loopback benchmark `benches/loopback.rs` use it; it is public so both (and other tests)
//! share one implementation of the driver side.
//!
//! * [`GuestMem`]: guest memory in a memfd, mapped here and shared with the backend through
//!   SET_MEM_TABLE (as QEMU's `memory-backend-memfd,share=on` does).
//! * [`DrvRing`]: the driver's view of one split virtqueue laid out in that memory: writing
//!   descriptors, posting chains (direct or indirect) to the avail ring, reading used
//!   elements, re-posting used RX buffers, re-arming the used-event index.
//! * [`Frontend`]: raw vhost-user messages over a `UnixStream` (fds passed with SCM_RIGHTS),
//!   and [`Frontend::qemu_startup`] / [`Frontend::qemu_shutdown`], which replay QEMU's message
//!   order (QEMU 7.2 and 10.0 with `queues=N`, measured):
//!   GET_FEATURES, GET/SET_PROTOCOL_FEATURES, GET_QUEUE_NUM, SET_OWNER, SET_VRING_CALL/ERR per
//!   vring, SET_VRING_ENABLE (pair 0 → 1, pairs ≥ 1 → 0) **before any SET_FEATURES**, then at
//!   DRIVER_OK: SET_FEATURES once per pair, SET_MEM_TABLE (need_reply), per vring
//!   NUM/BASE/ADDR/KICK/CALL, SET_VRING_ENABLE on all vrings; at shutdown GET_VRING_BASE per
//!   vring.
//!
//! Errors of the backend (a dropped connection, a NACK, a wrong GET_QUEUE_NUM) come back as
//! `io::Error`s. The `DrvRing` helpers write to addresses the harness itself chose and panic
//! if those are outside guest memory (a harness bug, not a backend one).

use std::fs::File;
use std::io::{self, Read};
use std::num::Wrapping;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap, MmapRegion};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use super::features;

/// vhost-user request codes (front-end → back-end) used by the harness.
pub mod req {
    pub const GET_FEATURES: u32 = 1;
    pub const SET_FEATURES: u32 = 2;
    pub const SET_OWNER: u32 = 3;
    pub const SET_MEM_TABLE: u32 = 5;
    pub const SET_VRING_NUM: u32 = 8;
    pub const SET_VRING_ADDR: u32 = 9;
    pub const SET_VRING_BASE: u32 = 10;
    pub const GET_VRING_BASE: u32 = 11;
    pub const SET_VRING_KICK: u32 = 12;
    pub const SET_VRING_CALL: u32 = 13;
    pub const SET_VRING_ERR: u32 = 14;
    pub const GET_PROTOCOL_FEATURES: u32 = 15;
    pub const SET_PROTOCOL_FEATURES: u32 = 16;
    pub const GET_QUEUE_NUM: u32 = 17;
    pub const SET_VRING_ENABLE: u32 = 18;
}

/// Header flag: the front-end wants a REPLY_ACK.
pub const NEED_REPLY: u32 = 0x8;
/// Protocol feature bits the harness negotiates.
pub const PROTO_MQ: u64 = 1 << 0;
pub const PROTO_REPLY_ACK: u64 = 1 << 3;
/// Pretend front-end virtual address of guest physical 0 (what QEMU puts in `userspace_addr`
/// and in SET_VRING_ADDR).
pub const USER_BASE: u64 = 0x7f12_0000_0000;
/// Size of `virtio_net_hdr_mrg_rxbuf`.
pub const NET_HDR_LEN: usize = 12;

const DESC_F_NEXT: u16 = 1;
const DESC_F_WRITE: u16 = 2;
const DESC_F_INDIRECT: u16 = 4;

// ---------------------------------------------------------------------------------------------
// Guest memory.

/// Guest memory: one region at guest physical 0 in a memfd.
pub struct GuestMem {
    file: File,
    mem: GuestMemoryMmap,
    size: u64,
}

fn memfd(size: u64) -> io::Result<File> {
    let name = c"arfsnic-harness-guest";
    // SAFETY: memfd_create with a valid NUL-terminated name; the returned fd is owned by the
    // File constructed below and by nothing else.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh, valid file descriptor we own exclusively.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(size)?;
    Ok(f)
}

impl GuestMem {
    /// `size` bytes of zeroed guest memory.
    pub fn new(size: u64) -> io::Result<Self> {
        let file = memfd(size)?;
        let len = usize::try_from(size).map_err(io::Error::other)?;
        let region =
            MmapRegion::<()>::from_file(FileOffset::new(file.try_clone()?, 0), len).map_err(io::Error::other)?;
        let region = GuestRegionMmap::new(region, GuestAddress(0)).ok_or_else(|| io::Error::other("guest region"))?;
        let mem = GuestMemoryMmap::from_regions(vec![region]).map_err(io::Error::other)?;
        Ok(GuestMem { file, mem, size })
    }

    /// The mapping (the driver's side of guest memory).
    pub fn mem(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    /// The memfd (sent with SET_MEM_TABLE).
    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Writes `data` at guest physical `addr`. Panics outside guest memory.
    pub fn write(&self, data: &[u8], addr: u64) {
        self.mem.write_slice(data, GuestAddress(addr)).unwrap_or_else(|e| panic!("harness write at {addr:#x}: {e}"));
    }

    /// Reads `out.len()` bytes at guest physical `addr`. Panics outside guest memory.
    pub fn read(&self, out: &mut [u8], addr: u64) {
        self.mem.read_slice(out, GuestAddress(addr)).unwrap_or_else(|e| panic!("harness read at {addr:#x}: {e}"));
    }
}

// ---------------------------------------------------------------------------------------------
// Driver side of a split ring.

/// Driver-side view of one split ring: descriptor table, avail ring and used ring in guest
/// memory, plus the driver's private indices.
#[derive(Clone, Debug)]
pub struct DrvRing {
    pub size: u16,
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
    /// Next free descriptor for `add_chain`/`add_indirect` (they allocate linearly).
    pub next_desc: u16,
    /// The driver's avail index (next slot to fill).
    pub avail_idx: u16,
    /// Used elements consumed so far.
    pub last_used: u16,
}

fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

impl DrvRing {
    /// Bytes one ring of `size` entries takes in the layout of [`DrvRing::at`] (a multiple of
    /// 4 KiB).
    pub fn footprint(size: u16) -> u64 {
        let q = u64::from(size);
        let used_off = align_up(18 * q + 6, 0x800);
        align_up(used_off + 8 * q + 6, 0x1000)
    }

    /// A ring of `size` entries at guest physical `base` (4 KiB aligned): descriptors at
    /// `base`, avail ring right after them, used ring at the next 2 KiB boundary.
    pub fn at(base: u64, size: u16) -> Self {
        let q = u64::from(size);
        DrvRing {
            size,
            desc: base,
            avail: base + 16 * q,
            used: base + align_up(18 * q + 6, 0x800),
            next_desc: 0,
            avail_idx: 0,
            last_used: 0,
        }
    }

    /// The ring of vring `v` in the harness's standard layout: vring 0 at 0x1000, then one
    /// [`footprint`](Self::footprint) per vring.
    pub fn for_vring(v: usize, size: u16) -> Self {
        Self::at(0x1000 + Self::footprint(size) * v as u64, size)
    }

    /// First guest address after the rings of `nvrings` vrings in the standard layout.
    pub fn layout_end(nvrings: usize, size: u16) -> u64 {
        0x1000 + Self::footprint(size) * nvrings as u64
    }

    /// Writes descriptor `i` of the table at `table`: (addr, len, flags, next).
    pub fn write_desc(&self, g: &GuestMem, table: u64, i: u16, d: (u64, u32, u16, u16)) {
        let (addr, len, flags, next) = d;
        let mut raw = [0u8; 16];
        raw[0..8].copy_from_slice(&addr.to_le_bytes());
        raw[8..12].copy_from_slice(&len.to_le_bytes());
        raw[12..14].copy_from_slice(&flags.to_le_bytes());
        raw[14..16].copy_from_slice(&next.to_le_bytes());
        g.write(&raw, table + 16 * u64::from(i));
    }

    /// Adds a chain of (addr, len, device-writable) segments from the next free descriptors
    /// and makes it available; returns the head index.
    pub fn add_chain(&mut self, g: &GuestMem, segs: &[(u64, u32, bool)]) -> u16 {
        let head = self.next_desc;
        for (k, &(addr, len, w)) in segs.iter().enumerate() {
            let i = self.next_desc;
            let last = k + 1 == segs.len();
            let flags = if last { 0 } else { DESC_F_NEXT } | if w { DESC_F_WRITE } else { 0 };
            self.write_desc(g, self.desc, i, (addr, len, flags, i.wrapping_add(1)));
            self.next_desc = self.next_desc.wrapping_add(1);
        }
        self.publish(g, head);
        head
    }

    /// Adds a chain through an indirect table at `table` (read-only segments).
    pub fn add_indirect(&mut self, g: &GuestMem, table: u64, segs: &[(u64, u32)]) -> u16 {
        self.add_indirect_dir(g, table, segs, false)
    }

    /// [`DrvRing::add_indirect`] with every segment device-writable (`writable`: RX buffers).
    pub fn add_indirect_dir(&mut self, g: &GuestMem, table: u64, segs: &[(u64, u32)], writable: bool) -> u16 {
        for (k, &(addr, len)) in segs.iter().enumerate() {
            let last = k + 1 == segs.len();
            let flags = if last { 0 } else { DESC_F_NEXT } | if writable { DESC_F_WRITE } else { 0 };
            self.write_desc(g, table, k as u16, (addr, len, flags, k as u16 + 1));
        }
        let head = self.next_desc;
        let tlen = 16 * segs.len() as u32;
        self.write_desc(g, self.desc, head, (table, tlen, DESC_F_INDIRECT, 0));
        self.next_desc = self.next_desc.wrapping_add(1);
        self.publish(g, head);
        head
    }

    /// Puts `head` into the next avail slot and publishes it (release store of `avail.idx`).
    pub fn publish(&mut self, g: &GuestMem, head: u16) {
        self.put_avail(g, head);
        self.flush_avail(g);
    }

    /// Puts `head` into the next avail slot without publishing it (see `flush_avail`).
    pub fn put_avail(&mut self, g: &GuestMem, head: u16) {
        let slot = u64::from(self.avail_idx % self.size);
        g.write(&head.to_le_bytes(), self.avail + 4 + 2 * slot);
        self.avail_idx = self.avail_idx.wrapping_add(1);
    }

    /// Publishes every slot filled so far with one release store of `avail.idx`.
    pub fn flush_avail(&self, g: &GuestMem) {
        g.mem
            .store(self.avail_idx.to_le(), GuestAddress(self.avail + 2), Ordering::Release)
            .unwrap_or_else(|e| panic!("harness avail idx store: {e}"));
    }

    /// Posts the device-writable buffer `(addr, len)` as a one-descriptor chain using
    /// descriptor `id` (RX refill; with `id` = buffer number the used element's id names the
    /// buffer).
    pub fn post_rx(&mut self, g: &GuestMem, id: u16, addr: u64, len: u32) {
        self.write_desc(g, self.desc, id, (addr, len, DESC_F_WRITE, 0));
        self.publish(g, id);
    }

    /// The device's `used.idx` (acquire load).
    pub fn used_idx(&self, g: &GuestMem) -> u16 {
        let v: u16 = g
            .mem
            .load(GuestAddress(self.used + 2), Ordering::Acquire)
            .unwrap_or_else(|e| panic!("harness used idx load: {e}"));
        u16::from_le(v)
    }

    /// Pops the next used element (id, len).
    pub fn pop_used(&mut self, g: &GuestMem) -> Option<(u32, u32)> {
        if self.used_idx(g) == self.last_used {
            return None;
        }
        Some(self.take_used(g))
    }

    fn take_used(&mut self, g: &GuestMem) -> (u32, u32) {
        let slot = u64::from(self.last_used % self.size);
        let mut raw = [0u8; 8];
        g.read(&mut raw, self.used + 4 + 8 * slot);
        self.last_used = self.last_used.wrapping_add(1);
        let id = u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
        let len = u32::from_le_bytes([raw[4], raw[5], raw[6], raw[7]]);
        (id, len)
    }

    /// RX recycling as a polling driver does it: every used element is handed straight back
    /// to the avail ring (same descriptor, same buffer), published with one `avail.idx` store.
    /// Returns the number of buffers recycled.
    pub fn recycle_used(&mut self, g: &GuestMem) -> u16 {
        let end = self.used_idx(g);
        let n = (Wrapping(end) - Wrapping(self.last_used)).0;
        for _ in 0..n {
            let (id, _) = self.take_used(g);
            self.put_avail(g, id as u16);
        }
        if n > 0 {
            self.flush_avail(g);
        }
        n
    }

    /// EVENT_IDX: asks for an interrupt at the next used element (`used_event = last_used`),
    /// as virtio_net does when NAPI completes (`virtqueue_enable_cb_prepare`).
    pub fn arm_interrupt(&self, g: &GuestMem) {
        g.write(&self.last_used.to_le_bytes(), self.avail + 4 + 2 * u64::from(self.size));
    }
}

// ---------------------------------------------------------------------------------------------
// Raw vhost-user front-end.

/// `struct vhost_vring_state` body: (index, num).
pub fn vring_state(index: u32, num: u32) -> Vec<u8> {
    let mut b = index.to_le_bytes().to_vec();
    b.extend_from_slice(&num.to_le_bytes());
    b
}

fn proto_err(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// One vhost-user front-end connection.
pub struct Frontend {
    pub sock: UnixStream,
    /// REPLY_ACK negotiated: `req(.., need_reply = true)` waits for the ack.
    pub reply_ack: bool,
    /// The virtio features SET_FEATURES acks: by default what QEMU's virtio-net acks
    /// without `hash=on` (everything offered but HASH_REPORT).
    pub acked: u64,
}

/// The eventfds and driver rings of one started device.
pub struct Vrings {
    pub kicks: Vec<EventFd>,
    pub calls: Vec<EventFd>,
    pub errs: Vec<EventFd>,
    pub rings: Vec<DrvRing>,
}

impl Vrings {
    /// Fresh eventfds and rings (standard layout, `size` entries) for `pairs` queue pairs.
    pub fn new(pairs: u16, size: u16) -> io::Result<Self> {
        let nv = 2 * usize::from(pairs);
        let efds = || -> io::Result<Vec<EventFd>> { (0..nv).map(|_| EventFd::new(libc::EFD_NONBLOCK)).collect() };
        Ok(Vrings {
            kicks: efds()?,
            calls: efds()?,
            errs: efds()?,
            rings: (0..nv).map(|v| DrvRing::for_vring(v, size)).collect(),
        })
    }
}

impl Frontend {
    /// Connects to the back-end's socket, retrying for up to `timeout` while it is not there
    /// yet. Replies are waited for at most 5 s.
    pub fn connect(path: &Path, timeout: Duration) -> io::Result<Self> {
        let t = Instant::now();
        loop {
            match UnixStream::connect(path) {
                Ok(sock) => {
                    sock.set_read_timeout(Some(Duration::from_secs(5)))?;
                    return Ok(Frontend { sock, reply_ack: false, acked: features::OFFERED & !features::HASH_REPORT });
                }
                Err(_) if t.elapsed() < timeout => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends one message (the version bit is always set) with `fds` attached.
    pub fn send(&self, code: u32, flags: u32, body: &[u8], fds: &[RawFd]) -> io::Result<()> {
        let mut msg = Vec::with_capacity(12 + body.len());
        msg.extend_from_slice(&code.to_le_bytes());
        msg.extend_from_slice(&(0x1 | flags).to_le_bytes());
        msg.extend_from_slice(&(body.len() as u32).to_le_bytes());
        msg.extend_from_slice(body);
        let n = self
            .sock
            .send_with_fds(&[&msg[..]], fds)
            .map_err(|e| io::Error::other(format!("send request {code}: back-end dropped the connection? {e}")))?;
        if n != msg.len() {
            return Err(proto_err(format!("request {code}: short send {n}")));
        }
        Ok(())
    }

    /// Reads the reply to `code` and returns its body.
    pub fn recv_reply(&self, code: u32) -> io::Result<Vec<u8>> {
        let ctx =
            |e: io::Error| io::Error::new(e.kind(), format!("reply to {code}: back-end dropped the connection? {e}"));
        let mut hdr = [0u8; 12];
        (&self.sock).read_exact(&mut hdr).map_err(ctx)?;
        let rcode = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
        let flags = u32::from_le_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]);
        let size = u32::from_le_bytes([hdr[8], hdr[9], hdr[10], hdr[11]]) as usize;
        if rcode != code || flags & 0x4 == 0 || size > 4096 {
            return Err(proto_err(format!("reply to {code}: got code {rcode} flags {flags:#x} size {size}")));
        }
        let mut body = vec![0u8; size];
        (&self.sock).read_exact(&mut body).map_err(ctx)?;
        Ok(body)
    }

    fn u64_of(code: u32, b: &[u8]) -> io::Result<u64> {
        b.get(..8)
            .and_then(|s| s.try_into().ok())
            .map(u64::from_le_bytes)
            .ok_or_else(|| proto_err(format!("reply to {code}: {} bytes", b.len())))
    }

    /// A request answered with a u64 (GET_FEATURES, GET_PROTOCOL_FEATURES, GET_QUEUE_NUM).
    pub fn get_u64(&self, code: u32) -> io::Result<u64> {
        self.send(code, 0, &[], &[])?;
        Self::u64_of(code, &self.recv_reply(code)?)
    }

    /// Sends a request; with REPLY_ACK negotiated and `need_reply`, waits for the ack and
    /// fails on a NACK.
    pub fn req(&self, code: u32, body: &[u8], fds: &[RawFd], need_reply: bool) -> io::Result<()> {
        let nr = need_reply && self.reply_ack;
        self.send(code, if nr { NEED_REPLY } else { 0 }, body, fds)?;
        if nr {
            let v = Self::u64_of(code, &self.recv_reply(code)?)?;
            if v != 0 {
                return Err(proto_err(format!("NACK ({v}) for request {code}")));
            }
        }
        Ok(())
    }

    /// SET_VRING_KICK / SET_VRING_CALL / SET_VRING_ERR for vring `index` with `fd`.
    pub fn vring_fd(&self, code: u32, index: usize, fd: RawFd) -> io::Result<()> {
        self.req(code, &(index as u64).to_le_bytes(), &[fd], false)
    }

    /// A request with a reply that returns only after every earlier message was handled.
    pub fn barrier(&self) -> io::Result<()> {
        let f = self.get_u64(req::GET_FEATURES)?;
        if f != features::OFFERED {
            return Err(proto_err(format!("GET_FEATURES {f:#x}")));
        }
        Ok(())
    }

    /// Replays QEMU's start-up for `pairs` queue pairs with rings of `qsize` entries in `g`
    /// (standard layout, see [`DrvRing::for_vring`]) and returns the driver's rings.
    /// `first`: a new connection (QEMU start); otherwise a guest reboot on the same
    /// connection, where QEMU goes straight to the early SET_VRING_ENABLE and DRIVER_OK.
    pub fn qemu_startup(&mut self, g: &GuestMem, pairs: u16, qsize: u16, first: bool) -> io::Result<Vrings> {
        let v = Vrings::new(pairs, qsize)?;
        if DrvRing::layout_end(v.rings.len(), qsize) > g.size() {
            return Err(io::Error::other("guest memory too small for the rings"));
        }
        if first {
            self.qemu_connect_sequence(&v, pairs)?;
        }
        self.qemu_driver_ok(g, &v, pairs)?;
        Ok(v)
    }

    /// QEMU's messages on a new connection, up to SET_VRING_CALL/ERR. Checks the offered
    /// features and that GET_QUEUE_NUM answers in queue *pairs* (QEMU reads it that way).
    pub fn qemu_connect_sequence(&mut self, v: &Vrings, pairs: u16) -> io::Result<()> {
        let f = self.get_u64(req::GET_FEATURES)?;
        if f != features::OFFERED {
            return Err(proto_err(format!("offered features {f:#x}, expected {:#x}", features::OFFERED)));
        }
        let pf = self.get_u64(req::GET_PROTOCOL_FEATURES)?;
        if pf & (PROTO_MQ | PROTO_REPLY_ACK) != PROTO_MQ | PROTO_REPLY_ACK {
            return Err(proto_err(format!("protocol features {pf:#x} lack MQ/REPLY_ACK")));
        }
        let proto = PROTO_MQ | PROTO_REPLY_ACK;
        self.req(req::SET_PROTOCOL_FEATURES, &proto.to_le_bytes(), &[], false)?;
        self.reply_ack = true;
        let qn = self.get_u64(req::GET_QUEUE_NUM)?;
        if qn != u64::from(pairs) {
            return Err(proto_err(format!("GET_QUEUE_NUM must be pairs: got {qn}, expected {pairs}")));
        }
        self.req(req::SET_OWNER, &[], &[], false)?;
        for i in 0..v.rings.len() {
            self.vring_fd(req::SET_VRING_CALL, i, v.calls[i].as_raw_fd())?;
            self.vring_fd(req::SET_VRING_ERR, i, v.errs[i].as_raw_fd())?;
        }
        Ok(())
    }

    /// The early SET_VRING_ENABLE (before any SET_FEATURES, need_reply = 0, as QEMU sends it
    /// on a new connection and again at every device reset), then DRIVER_OK: features, memory
    /// table, rings, enable all; ends with a barrier.
    pub fn qemu_driver_ok(&mut self, g: &GuestMem, v: &Vrings, pairs: u16) -> io::Result<()> {
        let nv = v.rings.len();
        for i in 0..nv {
            let on = u32::from(i / 2 == 0);
            self.send(req::SET_VRING_ENABLE, 0, &vring_state(i as u32, on), &[])?;
        }
        let acked = self.acked;
        for _ in 0..pairs {
            self.req(req::SET_FEATURES, &acked.to_le_bytes(), &[], false)?;
        }
        let mut mt = Vec::new();
        mt.extend_from_slice(&1u32.to_le_bytes()); // num_regions
        mt.extend_from_slice(&0u32.to_le_bytes()); // padding
        mt.extend_from_slice(&0u64.to_le_bytes()); // guest_phys_addr
        mt.extend_from_slice(&g.size().to_le_bytes()); // memory_size
        mt.extend_from_slice(&USER_BASE.to_le_bytes()); // userspace_addr
        mt.extend_from_slice(&0u64.to_le_bytes()); // mmap_offset
        self.req(req::SET_MEM_TABLE, &mt, &[g.file().as_raw_fd()], true)?;
        for (i, r) in v.rings.iter().enumerate() {
            let size = u32::from(r.size);
            self.req(req::SET_VRING_NUM, &vring_state(i as u32, size), &[], false)?;
            self.req(req::SET_VRING_BASE, &vring_state(i as u32, 0), &[], false)?;
            let mut a = Vec::new();
            a.extend_from_slice(&(i as u32).to_le_bytes());
            a.extend_from_slice(&0u32.to_le_bytes()); // flags
            a.extend_from_slice(&(USER_BASE + r.desc).to_le_bytes());
            a.extend_from_slice(&(USER_BASE + r.used).to_le_bytes());
            a.extend_from_slice(&(USER_BASE + r.avail).to_le_bytes());
            a.extend_from_slice(&0u64.to_le_bytes()); // log
            self.req(req::SET_VRING_ADDR, &a, &[], false)?;
            self.vring_fd(req::SET_VRING_KICK, i, v.kicks[i].as_raw_fd())?;
            self.vring_fd(req::SET_VRING_CALL, i, v.calls[i].as_raw_fd())?;
        }
        for i in 0..nv {
            self.send(req::SET_VRING_ENABLE, 0, &vring_state(i as u32, 1), &[])?;
        }
        // A request with a reply is answered only after the ones before it.
        self.barrier()
    }

    /// QEMU's shutdown: GET_VRING_BASE per vring; returns the bases (consumed avail index).
    pub fn qemu_shutdown(&self, pairs: u16) -> io::Result<Vec<u32>> {
        (0..2 * u32::from(pairs))
            .map(|i| {
                self.send(req::GET_VRING_BASE, 0, &vring_state(i, 0), &[])?;
                let b = self.recv_reply(req::GET_VRING_BASE)?;
                if b.len() < 8 || u32::from_le_bytes([b[0], b[1], b[2], b[3]]) != i {
                    return Err(proto_err(format!("GET_VRING_BASE {i}: reply {b:?}")));
                }
                Ok(u32::from_le_bytes([b[4], b[5], b[6], b[7]]))
            })
            .collect()
    }
}
