//! Scenario and profile TOML: arbitrary text through the loaders' parse-from-string paths
//! (`model::profile::from_toml` + `Scenario::validate`, i.e. what `Scenario::load` does after
//! reading the file; `Profile::parse`, i.e. `Profile::load` after reading), and what a
//! valid profile is used for next: the RSS function, the NIC model and the command engine
//! (built, armed, fed a few commands and advanced through its deadlines, so every latency,
//! fault and aging setting goes through the engine's time arithmetic).
//!
//! Input: bytes; non-UTF-8 input is skipped (the loaders read files as UTF-8 and fail
//! before parsing).
//!
//! Property: no panic, and no allocation beyond what the validated bounds allow.

#![no_main]

use std::sync::Arc;

use arfsnic::model::engine::{Command, Engine};
use arfsnic::model::filter::{Action, FilterTable};
use arfsnic::model::nic::Nic;
use arfsnic::model::profile::{from_toml, Profile};
use arfsnic::runner::scenario::Scenario;
use arfsnic::wire::{FlowKey, L4Proto};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };

    if let Ok(s) = from_toml::<Scenario>(text) {
        if s.validate().is_ok() {
            for run in s.runs() {
                let _ = s.sysctls_for(&run);
            }
        }
    }

    match Profile::parse(text) {
        Ok(p) => {
            let _ = p.rss_key();
            let _ = p.hash_types();
            let queues = p.device.queues;
            if let Ok(nic) = Nic::new(&p, queues) {
                let _ = nic.snapshot();
            }
            // The engine is built on the profile's own filter table, as the device does.
            // A table of the largest allowed capacity is still only reserved lazily.
            let table = Arc::new(FilterTable::new(p.filter.layout, p.filter.capacity));
            let mut engine = Engine::new(&p, table, 0);
            let mut out = Vec::new();
            engine.arm_schedule(0, &mut out);
            let key = FlowKey::v4(L4Proto::Tcp, [10, 0, 0, 1], 1, [10, 0, 0, 2], 2);
            let cmds = [
                Command::Add { id: 1, key, action: Action::Queue(0) },
                Command::Query { id: 1 },
                Command::Mod { id: 1, action: Action::Drop },
                Command::Del { id: 1 },
                Command::Flush,
            ];
            for (tag, cmd) in cmds.into_iter().enumerate() {
                engine.submit(tag as u64, cmd, 0, &mut out);
            }
            // Follow the deadlines (commands, stalls, the schedule, aging scans) a bounded
            // number of times.
            for _ in 0..16 {
                let Some(d) = engine.next_deadline() else { break };
                engine.advance(d, &mut out);
            }
            let _ = engine.stats();
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
