//! Why the backend has its own vhost-user request loop (docs/architecture.md, "The
//! vhost-user layer"), measured against the newest `vhost-user-backend` on crates.io
//! (0.24): its daemon, serving a null net device with 2 queue pairs, gets QEMU's start-up
//! messages (`arfsnic::vhost::testing::Frontend`) in QEMU's order. QEMU sends
//! SET_VRING_ENABLE before SET_FEATURES; the daemon must refuse it
//! (`VHOST_USER_F_PROTOCOL_FEATURES` not yet acked) and drop the connection. The same
//! messages with SET_FEATURES first are served, so the order is the cause.
//!
//! When this test fails because the daemon now serves QEMU's order, a newer
//! `vhost-user-backend` is worth adopting: see docs/architecture.md.

use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use arfsnic::vhost::testing::{req, vring_state, Frontend, Vrings, PROTO_MQ};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VhostUserDaemon, VringRwLock};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;

const PAIRS: u16 = 2;

/// A net device that does nothing: only the request handling is under test.
#[derive(Clone)]
struct NullNet;

impl VhostUserBackend for NullNet {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        2 * usize::from(PAIRS)
    }
    fn max_queue_size(&self) -> usize {
        256
    }
    fn features(&self) -> u64 {
        // VERSION_1, MRG_RXBUF, MQ, EVENT_IDX, and vhost-user's PROTOCOL_FEATURES.
        (1 << 32) | (1 << 15) | (1 << 22) | (1 << 29) | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }
    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ
    }
    fn set_event_idx(&self, _enabled: bool) {}
    fn update_memory(&self, _mem: GuestMemoryAtomic<GuestMemoryMmap>) -> io::Result<()> {
        Ok(())
    }
    fn handle_event(&self, _ev: u16, _set: EventSet, _vrings: &[VringRwLock], _thread: usize) -> io::Result<()> {
        Ok(())
    }
}

/// Serves one connection on `sock` in a thread; the daemon's result arrives on the channel
/// when it ends (the first, served daemon is left running: the test process ends it).
fn daemon(sock: &Path) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let sock = sock.to_path_buf();
    std::thread::spawn(move || {
        let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
        match VhostUserDaemon::new("null-net".into(), NullNet, mem) {
            Ok(mut d) => {
                let r = d.serve(&sock);
                let _ = tx.send(format!("{r:?}"));
                // Its drop waits for vring worker threads no exit event reaches here.
                std::mem::forget(d);
            }
            Err(e) => {
                let _ = tx.send(format!("new: {e:?}"));
            }
        }
    });
    rx
}

/// QEMU's messages on a new connection up to SET_VRING_CALL/ERR, then SET_VRING_ENABLE of
/// pair 0 either before (QEMU's order) or after SET_FEATURES; then a request with a reply.
/// Returns GET_QUEUE_NUM's answer and whether the last request was answered.
fn start_up(fe: &Frontend, enable_before_features: bool) -> io::Result<(u64, bool)> {
    let v = Vrings::new(PAIRS, 256)?;
    let offered = fe.get_u64(req::GET_FEATURES)?;
    let _ = fe.get_u64(req::GET_PROTOCOL_FEATURES)?;
    fe.req(req::SET_PROTOCOL_FEATURES, &PROTO_MQ.to_le_bytes(), &[], false)?;
    let queues = fe.get_u64(req::GET_QUEUE_NUM)?;
    fe.req(req::SET_OWNER, &[], &[], false)?;
    for i in 0..v.rings.len() {
        fe.vring_fd(req::SET_VRING_CALL, i, v.calls[i].as_raw_fd())?;
        fe.vring_fd(req::SET_VRING_ERR, i, v.errs[i].as_raw_fd())?;
    }
    let enable = || fe.send(req::SET_VRING_ENABLE, 0, &vring_state(0, 1), &[]);
    if enable_before_features {
        enable()?;
    }
    fe.req(req::SET_FEATURES, &offered.to_le_bytes(), &[], false)?;
    if !enable_before_features {
        enable()?;
    }
    let last = fe.get_u64(req::GET_FEATURES);
    if let Err(e) = &last {
        println!("  GET_FEATURES after SET_VRING_ENABLE: {e}");
    }
    Ok((queues, last.is_ok()))
}

#[test]
fn vhost_user_backend_drops_qemus_early_vring_enable() {
    let dir = tempfile::tempdir().unwrap();

    // SET_FEATURES first: served, so the harness speaks the protocol the daemon expects.
    let sock = dir.path().join("ok.sock");
    let _served = daemon(&sock);
    let fe = Frontend::connect(&sock, Duration::from_secs(5)).unwrap();
    let (queues, answered) = start_up(&fe, false).unwrap();
    assert!(answered, "the daemon must serve SET_FEATURES before SET_VRING_ENABLE");
    // GET_QUEUE_NUM counts vrings; QEMU's vhost-user-net reads it as queue pairs
    // (our backend answers pairs).
    assert_eq!(queues, 2 * u64::from(PAIRS), "GET_QUEUE_NUM");
    println!("SET_FEATURES first: served, GET_QUEUE_NUM {queues}");

    // QEMU's order: the daemon refuses SET_VRING_ENABLE and leaves the connection.
    let sock = dir.path().join("qemu.sock");
    let done = daemon(&sock);
    let fe = Frontend::connect(&sock, Duration::from_secs(5)).unwrap();
    let answered = matches!(start_up(&fe, true), Ok((_, true)));
    let r = done.recv_timeout(Duration::from_secs(30)).expect("the daemon ends on QEMU's order");
    println!("QEMU's order (SET_VRING_ENABLE before SET_FEATURES): answered {answered}; daemon: {r}");
    assert!(
        !answered && r.contains("InactiveFeature"),
        "vhost-user-backend now serves QEMU's message order (answered {answered}, daemon {r}): \
         its daemon is worth adopting, see docs/architecture.md"
    );
}
