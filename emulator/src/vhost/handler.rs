//! The vhost-user request handler (our implementation of the `vhost` crate's
//! `VhostUserBackendReqHandler`) and the per-connection request loop with the early
//! SET_VRING_ENABLE workaround (see the module documentation of `vhost`).

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserConfigFlags, VhostUserInflight, VhostUserLog,
    VhostUserMemoryRegion, VhostUserProtocolFeatures, VhostUserShMemConfig, VhostUserSharedMsg,
    VhostUserSingleMemoryRegion, VhostUserVringAddrFlags, VhostUserVringState,
};
use vhost::vhost_user::{
    BackendReqHandler, Error as VuError, GpuBackend, Result as VuResult, VhostUserBackendReqHandler,
    VhostUserVirtioFeatures,
};
use vhost::VhostUserMemoryRegionBase;
use vm_memory::{GuestAddress, GuestMemoryMmap, GuestRegionMmap};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use super::device::Device;
use super::features;

// vhost-user wire constants (vhost-user spec, "Message specification").
const REQ_SET_VRING_ENABLE: u32 = 18;
const HDR_SIZE: usize = 12;
const FLAG_VERSION: u32 = 0x1;
const FLAG_REPLY: u32 = 0x4;
const FLAG_NEED_REPLY: u32 = 0x8;

/// What one frontend connection negotiated.
#[derive(Default)]
struct ConnState {
    acked_features: Option<u64>,
    acked_protocol: u64,
    /// (frontend virtual address, size, guest physical address) per memory region.
    mappings: Vec<(u64, u64, u64)>,
    /// Set by handler methods that returned an error the crate has already answered (NACK):
    /// the request loop keeps the connection for those.
    handler_error: bool,
}

pub(crate) struct NetHandler {
    dev: Arc<Device>,
    conn: Mutex<ConnState>,
}

fn herr(msg: &str) -> VuError {
    VuError::ReqHandlerError(std::io::Error::other(msg.to_string()))
}

impl NetHandler {
    pub fn new(dev: Arc<Device>) -> Self {
        NetHandler { dev, conn: Mutex::new(ConnState::default()) }
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, ConnState> {
        crate::sync::lock(&self.conn)
    }

    /// Marks a handler-level failure (answered by the crate) and returns it.
    fn fail<T>(&self, e: VuError) -> VuResult<T> {
        self.conn().handler_error = true;
        Err(e)
    }

    fn vring_index(&self, index: u32) -> VuResult<usize> {
        let i = index as usize;
        if i < self.dev.vrings.len() {
            Ok(i)
        } else {
            self.fail(VuError::InvalidParam)
        }
    }

    fn va_to_gpa(&self, va: u64) -> Option<u64> {
        self.conn().mappings.iter().find(|&&(u, s, _)| va >= u && va - u < s).map(|&(u, _, g)| va - u + g)
    }

    fn protocol_features_acked(&self) -> bool {
        self.conn().acked_features.is_some_and(|f| f & features::PROTOCOL_FEATURES != 0)
    }

    /// Applies a SET_VRING_ENABLE (also the early one the crate refuses).
    fn apply_enable(&self, index: u32, enable: bool) -> VuResult<()> {
        let i = self.vring_index(index)?;
        {
            let mut st = self.dev.lock_vring(i);
            self.dev.set_enabled(i, &mut st, enable);
        }
        self.dev.update_state();
        Ok(())
    }
}

impl VhostUserBackendReqHandler for NetHandler {
    fn set_owner(&self) -> VuResult<()> {
        Ok(())
    }

    fn reset_owner(&self) -> VuResult<()> {
        self.dev.reset(false);
        self.conn().acked_features = None;
        Ok(())
    }

    fn reset_device(&self) -> VuResult<()> {
        self.reset_owner()
    }

    fn get_features(&self) -> VuResult<u64> {
        Ok(features::OFFERED)
    }

    fn set_features(&self, f: u64) -> VuResult<()> {
        if f & !features::OFFERED != 0 {
            return self.fail(VuError::InvalidParam);
        }
        self.conn().acked_features = Some(f);
        self.dev.set_acked_features(f);
        Ok(())
    }

    fn set_mem_table(
        &self,
        ctx: &[VhostUserMemoryRegion],
        files: Vec<File>,
        _postcopy: Option<bool>,
    ) -> VuResult<Option<Vec<VhostUserMemoryRegionBase>>> {
        let mut regions = Vec::with_capacity(ctx.len());
        let mut mappings = Vec::with_capacity(ctx.len());
        for (r, file) in ctx.iter().zip(files) {
            if usize::try_from(r.memory_size).is_err()
                || r.guest_phys_addr.checked_add(r.memory_size).is_none()
                || r.user_addr.checked_add(r.memory_size).is_none()
            {
                return self.fail(VuError::InvalidParam);
            }
            // mmap accepts a region past the end of its file, but touching it raises SIGBUS
            // and kills the backend (found by fuzz/vhost_messages): the file must cover it.
            let past_eof = match file.metadata() {
                Ok(m) if m.is_file() => r.mmap_offset.checked_add(r.memory_size).is_none_or(|end| end > m.len()),
                Ok(_) => false,
                Err(_) => true,
            };
            if past_eof {
                return self.fail(herr("memory region beyond the end of its file"));
            }
            let region = match r.mmap_region::<()>(file) {
                Ok(m) => m,
                Err(e) => return self.fail(e),
            };
            let Some(g) = GuestRegionMmap::new(region, GuestAddress(r.guest_phys_addr)) else {
                return self.fail(herr("guest region overflows"));
            };
            regions.push(g);
            mappings.push((r.user_addr, r.memory_size, r.guest_phys_addr));
        }
        let mem = match GuestMemoryMmap::from_regions(regions) {
            Ok(m) => m,
            Err(e) => return self.fail(herr(&format!("bad memory table: {e}"))),
        };
        self.dev.set_mem(Some(mem));
        self.conn().mappings = mappings;
        self.dev.update_state();
        Ok(None)
    }

    fn set_vring_num(&self, index: u32, num: u32) -> VuResult<()> {
        let i = self.vring_index(index)?;
        if num == 0 || num > u32::from(super::ring::MAX_QUEUE_SIZE) || !num.is_power_of_two() {
            return self.fail(VuError::InvalidParam);
        }
        self.dev.lock_vring(i).addrs.size = num as u16;
        Ok(())
    }

    fn set_vring_addr(
        &self,
        index: u32,
        _flags: VhostUserVringAddrFlags,
        descriptor: u64,
        used: u64,
        available: u64,
        _log: u64,
    ) -> VuResult<()> {
        let i = self.vring_index(index)?;
        let (Some(d), Some(u), Some(a)) = (self.va_to_gpa(descriptor), self.va_to_gpa(used), self.va_to_gpa(available))
        else {
            return self.fail(herr("vring address not in the memory table"));
        };
        let mut st = self.dev.lock_vring(i);
        st.addrs.desc = d;
        st.addrs.used = u;
        st.addrs.avail = a;
        st.addrs_set = true;
        Ok(())
    }

    fn set_vring_base(&self, index: u32, base: u32) -> VuResult<()> {
        let i = self.vring_index(index)?;
        let Ok(b) = u16::try_from(base) else {
            return self.fail(VuError::InvalidParam);
        };
        self.dev.lock_vring(i).base = b;
        Ok(())
    }

    fn get_vring_base(&self, index: u32) -> VuResult<VhostUserVringState> {
        let i = self.vring_index(index)?;
        let base = {
            let mut st = self.dev.lock_vring(i);
            self.dev.stop_ring(i, &mut st)
        };
        self.dev.update_state();
        Ok(VhostUserVringState::new(index, u32::from(base)))
    }

    fn set_vring_kick(&self, index: u8, fd: Option<File>) -> VuResult<()> {
        let i = self.vring_index(u32::from(index))?;
        let res = {
            let mut st = self.dev.lock_vring(i);
            self.dev.replace_kick(i, &mut st, fd);
            // The ring starts when it gets its kick fd (vhost-user spec "Starting and stopping
            // rings").
            self.dev.start_ring(i, &mut st)
        };
        self.dev.update_state();
        match res {
            Ok(()) => Ok(()),
            Err(e) => self.fail(herr(&format!("cannot start vring {i}: {e}"))),
        }
    }

    fn set_vring_call(&self, index: u8, fd: Option<File>) -> VuResult<()> {
        let i = self.vring_index(u32::from(index))?;
        self.dev.lock_vring(i).call = fd;
        Ok(())
    }

    fn set_vring_err(&self, index: u8, fd: Option<File>) -> VuResult<()> {
        let i = self.vring_index(u32::from(index))?;
        self.dev.lock_vring(i).err = fd;
        Ok(())
    }

    fn get_protocol_features(&self) -> VuResult<VhostUserProtocolFeatures> {
        Ok(VhostUserProtocolFeatures::MQ | VhostUserProtocolFeatures::REPLY_ACK)
    }

    fn set_protocol_features(&self, f: u64) -> VuResult<()> {
        self.conn().acked_protocol = f;
        Ok(())
    }

    /// QEMU reads this as the number of queue *pairs* (net/vhost-user.c compares it with
    /// `queues=`), not vrings.
    fn get_queue_num(&self) -> VuResult<u64> {
        Ok(u64::from(self.dev.pairs))
    }

    fn set_vring_enable(&self, index: u32, enable: bool) -> VuResult<()> {
        self.apply_enable(index, enable)
    }

    fn get_config(&self, _o: u32, _s: u32, _f: VhostUserConfigFlags) -> VuResult<Vec<u8>> {
        self.fail(VuError::InvalidOperation("config space is owned by the frontend"))
    }

    fn set_config(&self, _o: u32, _b: &[u8], _f: VhostUserConfigFlags) -> VuResult<()> {
        self.fail(VuError::InvalidOperation("config space is owned by the frontend"))
    }

    fn set_gpu_socket(&self, _g: GpuBackend) -> VuResult<()> {
        self.fail(VuError::InvalidOperation("not a GPU"))
    }

    fn get_shared_object(&self, _u: VhostUserSharedMsg) -> VuResult<File> {
        self.fail(VuError::InvalidOperation("unsupported"))
    }

    fn get_inflight_fd(&self, _i: &VhostUserInflight) -> VuResult<(VhostUserInflight, File)> {
        self.fail(VuError::InvalidOperation("unsupported"))
    }

    fn set_inflight_fd(&self, _i: &VhostUserInflight, _f: File) -> VuResult<()> {
        self.fail(VuError::InvalidOperation("unsupported"))
    }

    fn get_max_mem_slots(&self) -> VuResult<u64> {
        self.fail(VuError::InvalidOperation("unsupported"))
    }

    fn add_mem_region(
        &self,
        _r: &VhostUserSingleMemoryRegion,
        _f: File,
        _p: Option<bool>,
    ) -> VuResult<Option<VhostUserMemoryRegionBase>> {
        self.fail(VuError::InvalidOperation("unsupported"))
    }

    fn remove_mem_region(&self, _r: &VhostUserSingleMemoryRegion) -> VuResult<()> {
        self.fail(VuError::InvalidOperation("unsupported"))
    }

    fn set_device_state_fd(
        &self,
        _d: VhostTransferStateDirection,
        _p: VhostTransferStatePhase,
        _f: File,
    ) -> VuResult<Option<File>> {
        self.fail(VuError::InvalidOperation("unsupported"))
    }

    fn check_device_state(&self) -> VuResult<()> {
        self.fail(VuError::InvalidOperation("unsupported"))
    }

    fn get_shmem_config(&self) -> VuResult<VhostUserShMemConfig> {
        self.fail(VuError::InvalidOperation("unsupported"))
    }

    fn set_log_base(&self, _l: &VhostUserLog, _f: File) -> VuResult<()> {
        self.fail(VuError::InvalidOperation("unsupported"))
    }
}

/// A SET_VRING_ENABLE the crate is about to refuse because SET_FEATURES has not been seen.
struct EarlyEnable {
    index: u32,
    num: u32,
    need_reply: bool,
}

/// Peeks (without consuming) at the next message; returns it if it is a complete
/// SET_VRING_ENABLE header + body.
fn peek_set_vring_enable(sock: &UnixStream) -> Option<EarlyEnable> {
    let mut buf = [0u8; HDR_SIZE + 8];
    // QEMU writes header and body with one sendmsg; allow a short wait if they arrive split.
    for _ in 0..50 {
        // SAFETY: recv(2) with MSG_PEEK into a stack buffer of exactly `buf.len()` bytes;
        // the fd is kept open by `sock`. std's UnixStream::peek is not stable.
        let n = unsafe {
            libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_PEEK | libc::MSG_DONTWAIT)
        };
        if n < 4 {
            return None;
        }
        let code = u32::from_le_bytes(buf[0..4].try_into().ok()?);
        if code != REQ_SET_VRING_ENABLE {
            return None;
        }
        if n as usize >= buf.len() {
            let flags = u32::from_le_bytes(buf[4..8].try_into().ok()?);
            let size = u32::from_le_bytes(buf[8..12].try_into().ok()?);
            if size != 8 {
                return None;
            }
            return Some(EarlyEnable {
                index: u32::from_le_bytes(buf[12..16].try_into().ok()?),
                num: u32::from_le_bytes(buf[16..20].try_into().ok()?),
                need_reply: flags & FLAG_NEED_REPLY != 0,
            });
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

fn send_u64_reply(sock: &UnixStream, code: u32, value: u64) -> std::io::Result<()> {
    let mut msg = [0u8; HDR_SIZE + 8];
    msg[0..4].copy_from_slice(&code.to_le_bytes());
    msg[4..8].copy_from_slice(&(FLAG_VERSION | FLAG_REPLY).to_le_bytes());
    msg[8..12].copy_from_slice(&8u32.to_le_bytes());
    msg[12..20].copy_from_slice(&value.to_le_bytes());
    let mut s: &UnixStream = sock;
    s.write_all(&msg)
}

/// How a connection ended.
#[derive(Debug)]
pub(crate) enum ConnEnd {
    /// The frontend closed the socket.
    Disconnected,
    /// `stop` was set.
    Stopped,
    /// A protocol error the backend does not tolerate.
    Error(VuError),
}

/// Serves one connected frontend until it disconnects, errs, or `stop` is set.
pub(crate) fn serve_connection(dev: &Arc<Device>, stream: UnixStream, stop: &AtomicBool) -> ConnEnd {
    let handler = Arc::new(NetHandler::new(dev.clone()));
    let Ok(peek_sock) = stream.try_clone() else {
        return ConnEnd::Error(herr("cannot clone connection"));
    };
    let mut req = BackendReqHandler::from_stream(stream, handler.clone());
    let poll = match Epoll::new() {
        Ok(p) => p,
        Err(e) => return ConnEnd::Error(herr(&format!("epoll: {e}"))),
    };
    if let Err(e) = poll.ctl(ControlOperation::Add, peek_sock.as_raw_fd(), EpollEvent::new(EventSet::IN, 1)) {
        return ConnEnd::Error(herr(&format!("epoll add: {e}")));
    }
    let mut events = [EpollEvent::default(); 1];
    loop {
        if stop.load(Ordering::Acquire) {
            return ConnEnd::Stopped;
        }
        match poll.wait(200, &mut events) {
            Ok(0) | Err(_) => continue,
            Ok(_) => {}
        }
        let early = if handler.protocol_features_acked() { None } else { peek_set_vring_enable(&peek_sock) };
        handler.conn().handler_error = false;
        match req.handle_request() {
            Ok(()) => {}
            // In vhost 0.18 only SET_VRING_ENABLE raises InactiveFeature(PROTOCOL_FEATURES)
            // (`check_feature` has no other caller), after consuming the whole message.
            Err(VuError::InactiveFeature(f)) if f == VhostUserVirtioFeatures::PROTOCOL_FEATURES => {
                // The workaround: the crate refused the message only because SET_FEATURES has
                // not arrived yet. Apply it ourselves from the peeked copy.
                let Some(e) = early else {
                    // Could not read the body (header and body never arrived together within
                    // the peek window): the enable state is unknown. QEMU enables all vrings
                    // again at DRIVER_OK, so keep the connection.
                    dev.protocol_errors.fetch_add(1, Ordering::Relaxed);
                    log::warn!("vhost: early SET_VRING_ENABLE whose body could not be peeked");
                    continue;
                };
                let ok = e.num <= 1 && handler.apply_enable(e.index, e.num == 1).is_ok();
                dev.early_enables.fetch_add(1, Ordering::Relaxed);
                log::debug!(
                    "vhost: early SET_VRING_ENABLE vring {} = {} (before SET_FEATURES) applied",
                    e.index,
                    e.num
                );
                let reply_ack = handler.conn().acked_protocol & VhostUserProtocolFeatures::REPLY_ACK.bits() != 0;
                if e.need_reply && reply_ack {
                    if let Err(err) = send_u64_reply(&peek_sock, REQ_SET_VRING_ENABLE, u64::from(!ok)) {
                        return ConnEnd::Error(VuError::SocketError(err));
                    }
                }
            }
            Err(VuError::Disconnected) | Err(VuError::PartialMessage) => return ConnEnd::Disconnected,
            Err(VuError::SocketBroken(_)) => return ConnEnd::Disconnected,
            Err(e) if handler.conn().handler_error => {
                // Our handler refused the request; the crate has already NACKed it if the
                // frontend asked for a reply. Keep the connection.
                dev.protocol_errors.fetch_add(1, Ordering::Relaxed);
                log::warn!("vhost: request refused: {e}");
            }
            Err(e) => {
                dev.protocol_errors.fetch_add(1, Ordering::Relaxed);
                return ConnEnd::Error(e);
            }
        }
    }
}
