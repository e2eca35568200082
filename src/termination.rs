//! A stop request (SIGTERM from systemd when a start times out or the unit
//! is stopped, SIGINT from a terminal) turned into a flag, for the one
//! long wait that holds a device only we know about: attach waiting for
//! its udev link. Caught there, the request lets attach release the device
//! it bound instead of dying with it bound.

use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

static REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn note_request(_: libc::c_int) {
    REQUESTED.store(true, Ordering::SeqCst);
}

/// From now on SIGTERM and SIGINT only set the flag [`requested`] reads.
pub fn catch_stop_requests() {
    let action = SigAction::new(
        SigHandler::Handler(note_request),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for signal in [Signal::SIGTERM, Signal::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe.
        if let Err(errno) = unsafe { sigaction(signal, &action) } {
            tracing::debug!("cannot catch {signal}: {errno}");
        }
    }
}

/// Whether a stop was requested since [`catch_stop_requests`].
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}
