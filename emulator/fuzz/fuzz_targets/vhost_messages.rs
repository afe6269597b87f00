//! vhost-user message sequences against a real `vhost::Backend` over its unix socket, sent
//! with the `vhost::testing` frontend, plus writes into the shared guest memory so rings
//! started by those messages carry fuzzer-chosen descriptor chains.
//!
//! One backend (2 queue pairs, profile-free counting hooks) and one 256 KiB memfd of guest
//! memory live for the whole run. Per input: guest memory is zeroed, the records below are
//! played on a fresh connection followed by one complete GET_FEATURES, the data path is nudged (a kick on every vring, one frame
//! delivered to each RX queue), the connection is closed, and a new connection must get an
//! answer to GET_FEATURES; every 16th input it must also complete QEMU's whole start-up
//! (`Frontend::qemu_startup`) and shutdown. Each connection is opened before the previous one
//! closes, so the backend never sleeps in its accept loop.
//!
//! Input: records until the end (little-endian, missing bytes read as 0):
//! ```text
//! u8 0xff, u32 address, u16 n, n bytes        write into guest memory
//! u8 sel, u8 flags, u8 fds, u16 size, u16 n, n bytes
//!     one message: request code sel % 48 (0 and 41..47 are not vhost-user requests),
//!     header flags `flags`, header size `size` (may differ from the n body bytes sent),
//!     attached fds: bit 0 an eventfd, bit 1 the guest memfd, bit 2 another eventfd,
//!     bit 3 the memfd again (never on SET_VRING_ENABLE, see below)
//! ```
//! Property: no panic, no crash of the backend (a SIGBUS on guest memory included), and
//! the backend keeps serving new connections.

#![no_main]

use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use arfsnic::vhost::testing::{Frontend, GuestMem};
use arfsnic::vhost::{Backend, DeviceHooks, RxPort, ServeConfig};
use libfuzzer_sys::fuzz_target;
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

const PAIRS: u16 = 2;
const QSIZE: u16 = 64;
const MEM_SIZE: u64 = 256 << 10;

#[derive(Default)]
struct Hooks {
    tx: AtomicU64,
}

impl DeviceHooks for Hooks {
    fn on_tx(&self, _pair: u16, frame: &[u8]) {
        assert!(frame.len() <= arfsnic::vhost::MAX_FRAME);
        self.tx.fetch_add(1, Relaxed);
    }
    fn on_queue_state(&self, pair: u16, _enabled: bool) {
        assert!(pair < PAIRS);
    }
    fn on_link(&self, _up: bool) {}
}

struct World {
    path: PathBuf,
    guest: GuestMem,
    efd: EventFd,
    efd2: EventFd,
    rx: RxPort,
    next: Mutex<Option<Frontend>>,
    inputs: AtomicU64,
}

static STOP: AtomicBool = AtomicBool::new(false);

static WORLD: LazyLock<World> = LazyLock::new(|| {
    // libFuzzer's main is not Rust's: writes to a socket the backend closed must fail with
    // EPIPE instead of killing the process.
    // SAFETY: setting a signal disposition to SIG_IGN, before any other thread exists here.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let dir = std::env::temp_dir().join(format!("arfsnic-fuzz-vhost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("socket directory");
    let path = dir.join("vhost.sock");
    let _ = std::fs::remove_file(&path);
    let mut cfg = ServeConfig::new(&path, PAIRS);
    cfg.threads = Some(1);
    let backend = Backend::new(cfg, Arc::new(Hooks::default())).expect("backend");
    let rx = backend.rx_port();
    let backend: &'static Backend = Box::leak(Box::new(backend));
    std::thread::Builder::new()
        .name("fuzz-serve".into())
        .spawn(move || backend.serve(&STOP).expect("backend serve loop"))
        .expect("serve thread");
    World {
        path,
        guest: GuestMem::new(MEM_SIZE).expect("guest memory"),
        efd: EventFd::new(libc::EFD_NONBLOCK).expect("eventfd"),
        efd2: EventFd::new(libc::EFD_NONBLOCK).expect("eventfd"),
        rx,
        next: Mutex::new(None),
        inputs: AtomicU64::new(0),
    }
});

fn connect(w: &World) -> Frontend {
    Frontend::connect(&w.path, Duration::from_secs(5)).expect("backend accepts connections")
}

struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
    fn u8(&mut self) -> u8 {
        self.bytes(1).first().copied().unwrap_or(0)
    }
    fn u16(&mut self) -> u16 {
        let mut b = [0u8; 2];
        let s = self.bytes(2);
        b[..s.len()].copy_from_slice(s);
        u16::from_le_bytes(b)
    }
    fn u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        let s = self.bytes(4);
        b[..s.len()].copy_from_slice(s);
        u32::from_le_bytes(b)
    }
}

/// A UDP-ish frame for the RX queues (content does not matter to the backend).
const FRAME: [u8; 60] = {
    let mut f = [0u8; 60];
    f[0] = 0x52;
    f[12] = 0x08;
    f
};

static ZEROS: [u8; MEM_SIZE as usize] = [0; MEM_SIZE as usize];

fuzz_target!(|data: &[u8]| {
    let w = &*WORLD;
    let n = w.inputs.fetch_add(1, Relaxed);
    w.guest.mem().write_slice(&ZEROS, GuestAddress(0)).expect("zero guest memory");
    let fe = w.next.lock().unwrap().take().unwrap_or_else(|| connect(w));
    // The checking connection waits in the backlog from the start: if the backend drops
    // the fuzzed connection early, it accepts this one at once instead of sleeping in its
    // accept loop.
    let mut check = connect(w);

    let mut c = Cursor(data);
    let mut open = true;
    while !c.0.is_empty() {
        let sel = c.u8();
        if sel == 0xff {
            let addr = u64::from(c.u32());
            let len = usize::from(c.u16());
            let bytes = c.bytes(len).to_vec();
            let _ = w.guest.mem().write_slice(&bytes, GuestAddress(addr));
            continue;
        }
        let code = u32::from(sel % 48);
        let flags = u32::from(c.u8());
        let fdsel = c.u8();
        let size = u32::from(c.u16());
        let len = usize::from(c.u16());
        let body = c.bytes(len).to_vec();
        if !open {
            continue;
        }
        let mut msg = Vec::with_capacity(12 + body.len());
        msg.extend_from_slice(&code.to_le_bytes());
        msg.extend_from_slice(&flags.to_le_bytes());
        msg.extend_from_slice(&size.to_le_bytes());
        msg.extend_from_slice(&body);
        let mut fds: Vec<RawFd> = Vec::new();
        // No fds on SET_VRING_ENABLE: a peek cannot see past an fd boundary, so the
        // backend's early-enable peek (before SET_FEATURES) would wait out its 100 ms window
        // on nearly every such input. Harmless, but it would slow this target 100-fold.
        let fdsel = if code == 18 { 0 } else { fdsel };
        if fdsel & 1 != 0 {
            fds.push(w.efd.as_raw_fd());
        }
        if fdsel & 2 != 0 {
            fds.push(w.guest.file().as_raw_fd());
        }
        if fdsel & 4 != 0 {
            fds.push(w.efd2.as_raw_fd());
        }
        if fdsel & 8 != 0 {
            fds.push(w.guest.file().as_raw_fd());
        }
        // The backend may have dropped the connection (a protocol error it does not
        // tolerate): then the rest of the input is not sent.
        if fe.sock.send_with_fds(&[&msg[..]], &fds).is_err() {
            open = false;
        }
    }

    // A complete GET_FEATURES after the records: a truncated SET_VRING_ENABLE at the end
    // would otherwise hold the backend in its 100 ms peek window (harmless, but it would
    // cost every such input 100 ms).
    if open {
        let mut trailer = Vec::with_capacity(12);
        for v in [1u32, 1, 0] {
            trailer.extend_from_slice(&v.to_le_bytes());
        }
        let _ = fe.sock.send_with_fds(&[&trailer[..]], &[]);
    }

    // Nudge the data path: kick every vring (all kick fds are these two eventfds) and offer a
    // frame to each RX queue.
    let _ = w.efd.write(1);
    let _ = w.efd2.write(1);
    for pair in 0..PAIRS {
        let _ = w.rx.deliver(pair, &FRAME);
    }

    // The backend must still serve: the checking connection gets its answers once the
    // fuzzed one is closed.
    drop(fe);
    if let Err(e) = check.barrier() {
        panic!("backend stopped serving after a fuzzed connection: {e}");
    }
    if n % 16 == 0 {
        if let Err(e) = check.qemu_startup(&w.guest, PAIRS, QSIZE, true) {
            panic!("QEMU start-up failed after a fuzzed connection: {e}");
        }
        for pair in 0..PAIRS {
            let _ = w.rx.deliver(pair, &FRAME);
        }
        if let Err(e) = check.qemu_shutdown(PAIRS) {
            panic!("QEMU shutdown failed after a fuzzed connection: {e}");
        }
    }
    *w.next.lock().unwrap() = Some(connect(w));
    drop(check);
});
