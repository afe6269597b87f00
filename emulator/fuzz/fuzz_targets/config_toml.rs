//! Scenario and profile TOML: arbitrary text through the loaders' parse-from-string paths
//! (`model::profile::from_toml` + `Scenario::validate`, i.e. what `Scenario::load` does after
//! reading the file; `Profile::parse`, i.e. `Profile::load` after reading), and what a
//! valid profile is used for next: the RSS function, the NIC model and the command engine.
//!
//! Input: bytes; non-UTF-8 input is skipped (the loaders read files as UTF-8 and fail
//! before parsing).
//!
//! Property: no panic, and no allocation beyond what the validated bounds allow.

#![no_main]

use std::sync::Arc;

use arfsnic::model::engine::Engine;
use arfsnic::model::filter::FilterTable;
use arfsnic::model::nic::Nic;
use arfsnic::model::profile::{from_toml, Profile};
use arfsnic::runner::scenario::Scenario;
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
            let engine = Engine::new(&p, table, 0);
            let _ = engine.next_deadline();
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
