//! SIGINT and SIGTERM for the long-running commands (`run`, `demo`, `serve`): the first
//! signal sets a flag they poll, so they stop their QEMU, write what they have (marked
//! `complete = false`) and remove their socket; a second signal exits at once with the
//! shell's code for it (130, 143).

use crate::runner::Interrupt;
use signal_hook::consts::{SIGINT, SIGTERM};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Install the handlers; the returned flag is what the commands poll.
pub fn install() -> std::io::Result<Interrupt> {
    let int = Interrupt::default();
    for sig in [SIGINT, SIGTERM] {
        // Registered first, so it runs before this signal's flag is set below: it exits
        // only when an earlier signal has already set `seen`.
        let seen: Arc<AtomicBool> = int.stop.clone();
        signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, seen)?;
        signal_hook::flag::register_usize(sig, int.signal.clone(), sig as usize)?;
        signal_hook::flag::register(sig, int.stop.clone())?;
    }
    Ok(int)
}
