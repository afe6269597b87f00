//! The runtime's timer thread sleeps while nothing is due: no busy loop with a command
//! pending far in the future, none with nothing pending. Alone in its own test binary so
//! that only one timer thread exists in the process.

use arfsnic::device::clock::Clock;
use arfsnic::device::control::{ControlRuntime, ControlSink};
use arfsnic::model::filter::FilterTable;
use arfsnic::model::profile::Profile;
use arfsnic::vhost::RxError;
use arfsnic::wire::control::{self as wire, AddRequest, Request};
use arfsnic::wire::{FlowKey, L4Proto};
use std::sync::Arc;
use std::time::Duration;

struct Discard;

impl ControlSink for Discard {
    fn send(&self, pair: u16, _frame: &[u8]) -> Result<u16, RxError> {
        Ok(pair)
    }
}

/// CPU time (clock ticks, user + system) of the thread named `arfsnic-ctl`.
fn timer_thread_ticks() -> u64 {
    for t in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = t.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim() == "arfsnic-ctl" {
            let stat = std::fs::read_to_string(dir.join("stat")).unwrap();
            // Fields after the parenthesised name: state is field 3, utime 14, stime 15.
            let rest = &stat[stat.rfind(')').unwrap() + 2..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            return f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
        }
    }
    panic!("no arfsnic-ctl thread");
}

#[test]
fn timer_thread_sleeps_until_the_deadline() {
    let p = Profile::parse(
        "name = \"idle\"\n[filter]\nlayout = \"shared\"\ncapacity = 16\n\
         [engine.latency]\nadd = { dist = \"fixed\", us = 2000000 }\n",
    )
    .unwrap();
    let clock = Clock::new();
    let table = Arc::new(FilterTable::new(p.filter.layout, p.filter.capacity));
    let rt = ControlRuntime::new(&p, table.clone(), 1, clock, Arc::new(Discard)).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let t0 = timer_thread_ticks();
    std::thread::sleep(Duration::from_millis(300));
    let idle = timer_thread_ticks() - t0;
    let key = FlowKey::v4(L4Proto::Tcp, [1, 1, 1, 1], 1, [2, 2, 2, 2], 2);
    let add = Request::Add(AddRequest { filter_id: 1, rxq: 0, key });
    rt.handle_frame(0, &wire::encode_request([2, 0, 0, 0, 0, 1], 1, &add));
    let t1 = timer_thread_ticks();
    std::thread::sleep(Duration::from_millis(300));
    let pending = timer_thread_ticks() - t1;
    eprintln!("timer thread CPU over 300 ms: idle {idle} ticks, command pending {pending} ticks");
    assert!(idle <= 3 && pending <= 3, "busy timer thread: {idle} / {pending} ticks in 300 ms");
    assert!(!table.contains_id(1), "the 2 s ADD has not completed");
}
