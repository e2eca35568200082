//! A stop request (SIGTERM from systemd when a start times out or the unit
//! is stopped, SIGINT from a terminal) turned into a flag while attach
//! might hold a device only it knows about, so that it can release that
//! device instead of dying with it bound.

use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::signal::{raise, sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

static REQUESTED: AtomicBool = AtomicBool::new(false);

const STOP_SIGNALS: [Signal; 2] = [Signal::SIGTERM, Signal::SIGINT];

extern "C" fn note_request(_: libc::c_int) {
    REQUESTED.store(true, Ordering::SeqCst);
}

fn set_handler(handler: SigHandler, flags: SaFlags) {
    let action = SigAction::new(handler, flags, SigSet::empty());
    for signal in STOP_SIGNALS {
        // SAFETY: the handlers are the default one or `note_request`,
        // which only stores to an atomic (async-signal-safe).
        if let Err(errno) = unsafe { sigaction(signal, &action) } {
            tracing::debug!("cannot change the handler of {signal}: {errno}");
        }
    }
}

/// While the guard lives, SIGTERM and SIGINT set the flag [`requested`]
/// reads, and interrupt blocking calls (no `SA_RESTART`: a wait for a
/// lock ends with `EINTR` instead of going on). When it is dropped, the
/// default handlers come back, and a stop that was requested meanwhile
/// and not acted on ends the process as it would have.
pub struct StopRequests(());

pub fn catch_stop_requests() -> StopRequests {
    REQUESTED.store(false, Ordering::SeqCst);
    set_handler(SigHandler::Handler(note_request), SaFlags::empty());
    StopRequests(())
}

impl Drop for StopRequests {
    fn drop(&mut self) {
        set_handler(SigHandler::SigDfl, SaFlags::empty());
        if REQUESTED.swap(false, Ordering::SeqCst) {
            let _ = raise(Signal::SIGTERM);
        }
    }
}

impl StopRequests {
    /// Marks the request as handled (the caller failed because of it), so
    /// dropping the guard does not end the process.
    pub fn acknowledge(&self) {
        REQUESTED.store(false, Ordering::SeqCst);
    }
}

/// Whether a stop was requested while a [`StopRequests`] guard lives.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}
