//! Inputs the fuzz targets (`emulator/fuzz`, docs/fuzzing.md) found crashing, replayed as
//! plain tests against the fixed code.

use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arfsnic::vhost::testing::{Frontend, GuestMem};
use arfsnic::vhost::{Backend, DeviceHooks, ServeConfig};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

struct NoHooks;

impl DeviceHooks for NoHooks {
    fn on_tx(&self, _pair: u16, _frame: &[u8]) {}
    fn on_queue_state(&self, _pair: u16, _enabled: bool) {}
    fn on_link(&self, _up: bool) {}
}

/// Plays an input of the `vhost_messages` fuzz target on `fe` (its record format:
/// `0xff, u32 address, u16 n, n bytes` writes guest memory; `sel, flags, fds, u16 size,
/// u16 n, n bytes` sends request `sel % 48` with header size `size`, fds by bit: 1 an
/// eventfd, 2 the memfd, 4 another eventfd, 8 the memfd again).
fn replay(fe: &Frontend, g: &GuestMem, efds: &[EventFd; 2], input: &[u8]) {
    let mut rest = input;
    let mut take = |n: usize| {
        let (a, b) = rest.split_at(n.min(rest.len()));
        rest = b;
        a.to_vec()
    };
    let le = |b: &[u8]| b.iter().rev().fold(0u64, |acc, &x| (acc << 8) | u64::from(x));
    loop {
        let Some(&sel) = take(1).first() else { return };
        if sel == 0xff {
            let addr = le(&take(4));
            let n = le(&take(2)) as usize;
            g.write(&take(n), addr);
            continue;
        }
        let hdr = take(6);
        let (flags, fdsel, size, n) = (hdr[0], hdr[1], le(&hdr[2..4]) as u32, le(&hdr[4..6]) as usize);
        let mut msg = u32::from(sel % 48).to_le_bytes().to_vec();
        msg.extend_from_slice(&u32::from(flags).to_le_bytes());
        msg.extend_from_slice(&size.to_le_bytes());
        msg.extend_from_slice(&take(n));
        let all: [RawFd; 4] = [efds[0].as_raw_fd(), g.file().as_raw_fd(), efds[1].as_raw_fd(), g.file().as_raw_fd()];
        let fds: Vec<RawFd> = (0..4).filter(|b| fdsel & (1 << b) != 0).map(|b| all[b]).collect();
        fe.sock.send_with_fds(&[&msg[..]], &fds).expect("the backend keeps the connection");
    }
}

fn backend(path: &Path) -> (Arc<Backend>, Arc<AtomicBool>, std::thread::JoinHandle<()>) {
    let mut cfg = ServeConfig::new(path, 2);
    cfg.threads = Some(1);
    let b = Arc::new(Backend::new(cfg, Arc::new(NoHooks)).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let (b2, s2) = (b.clone(), stop.clone());
    let h = std::thread::spawn(move || b2.serve(&s2).unwrap());
    (b, stop, h)
}

/// fuzz/vhost_messages, SIGBUS: SET_MEM_TABLE with a region at `mmap_offset` 0x97000000 of a
/// 256 KiB memfd (mmap accepts a mapping past the end of the file), then SET_VRING_NUM,
/// SET_VRING_ADDR and SET_VRING_KICK on vring 2: starting the ring read its used index from
/// the unbacked page and the backend died of SIGBUS. Now the memory table is refused, the
/// ring cannot start, and the backend keeps serving.
#[test]
fn memory_region_past_the_end_of_its_file_is_refused() {
    const CRASH: &str = "050902280028000100000000000000000000000000000000000400000000000000000012\
                         7f0000000000970000000008010008000800020000004000000009010028002800020000\
                         000000000000300000127f000000020000127f000000340000127f000000000000000000\
                         000c0101080008000200";
    let input = hex::decode(CRASH).unwrap();
    assert_eq!(input.len(), 118);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vhost.sock");
    let (b, stop, h) = backend(&path);
    let g = GuestMem::new(256 << 10).unwrap();
    let efds = [EventFd::new(libc::EFD_NONBLOCK).unwrap(), EventFd::new(libc::EFD_NONBLOCK).unwrap()];

    let fe = Frontend::connect(&path, Duration::from_secs(5)).unwrap();
    replay(&fe, &g, &efds, &input);
    // As the target does: one complete GET_FEATURES after the records (the input's last
    // message claims more body bytes than it has), then a new connection.
    fe.send(1, 0, &[], &[]).unwrap();
    drop(fe);

    let mut fe = Frontend::connect(&path, Duration::from_secs(5)).unwrap();
    fe.barrier().expect("the backend still serves after the bad memory table");
    assert!(b.counters().protocol_errors >= 1, "the memory table was not refused");
    fe.qemu_startup(&g, 2, 64, true).expect("a new connection starts normally");
    assert!(b.counters().link_up);
    fe.qemu_shutdown(2).unwrap();
    drop(fe);

    stop.store(true, Ordering::Release);
    h.join().unwrap();
}

/// config_toml: a scheduled fault at `at_ms` = 2^63 - 1 passed validation and overflowed
/// `at_ms * 1_000_000` in `Engine::new` (a panic with overflow checks, a nonsense schedule
/// without). Millisecond fields are now bounded by `MAX_MS`.
#[test]
fn huge_millisecond_fields_are_refused() {
    use arfsnic::model::engine::Engine;
    use arfsnic::model::filter::FilterTable;
    use arfsnic::model::profile::{Profile, MAX_MS};

    let profile = |extra: &str| format!("name = \"x\"\n[filter]\nlayout = \"shared\"\ncapacity = 1\n{extra}");
    let cases = [
        ("faults.schedule[0].at_ms", "[[faults.schedule]]\nat_ms = 9223372036854775807\naction = \"flush\"\n"),
        ("faults.schedule[0].ms", "[[faults.schedule]]\nat_ms = 0\naction = \"stall\"\nms = 18446744073709\n"),
        ("aging.idle_ms", "[aging]\nidle_ms = 18446744073709\nscan_ms = 1\n"),
        ("aging.scan_ms", "[aging]\nidle_ms = 1\nscan_ms = 18446744073709\n"),
    ];
    for (field, extra) in cases {
        let e = Profile::parse(&profile(extra)).expect_err(field);
        assert_eq!(e.field, field);
    }
    // The bound itself is accepted, and the engine handles it.
    let text = profile(&format!(
        "[[faults.schedule]]\nat_ms = {MAX_MS}\naction = \"stall\"\nms = {MAX_MS}\n[aging]\nidle_ms = {MAX_MS}\nscan_ms = {MAX_MS}\n"
    ));
    let p = Profile::parse(&text).unwrap();
    let table = Arc::new(FilterTable::new(p.filter.layout, p.filter.capacity));
    let mut e = Engine::new(&p, table, u64::MAX / 2);
    let mut out = Vec::new();
    e.arm_schedule(u64::MAX / 2, &mut out);
    if let Some(d) = e.next_deadline() {
        e.advance(d, &mut out);
    }
}
