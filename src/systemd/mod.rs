//! systemd's side of a volume: the unit instance that attaches it, and a
//! small client for systemd's D-Bus API.
//!
//! The client needs zbus and so lives behind the `dbus` feature; the unit
//! naming and the journal tail do not, so the generator (built without
//! that feature) shares them. Without the feature, [`Systemd::connect`]
//! fails with a clear message, so every caller builds either way.

mod journal;
mod unit;

pub use journal::last_journal_lines;
pub use unit::{unit_name, UnitState, JOB_DONE};

#[cfg(feature = "dbus")]
mod client;
#[cfg(feature = "dbus")]
mod proxy;
#[cfg(feature = "dbus")]
pub use client::Systemd;

#[cfg(not(feature = "dbus"))]
mod without_dbus;
#[cfg(not(feature = "dbus"))]
pub use without_dbus::Systemd;

/// How long to wait for a job systemd runs for us, unless
/// [`JOB_TIMEOUT_ENV`] says otherwise. The unit's own start timeout is
/// systemd's default of 90 s, so this is where a healthy start has ended.
pub const DEFAULT_JOB_TIMEOUT_SEC: u64 = 90;
/// Overrides [`DEFAULT_JOB_TIMEOUT_SEC`] (whole seconds).
pub const JOB_TIMEOUT_ENV: &str = "SPARSE_VOLUME_JOB_TIMEOUT_SEC";

/// The job wait in force: the environment's override if it parses.
pub fn job_timeout() -> std::time::Duration {
    let seconds = std::env::var(JOB_TIMEOUT_ENV)
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok())
        .unwrap_or(DEFAULT_JOB_TIMEOUT_SEC);
    std::time::Duration::from_secs(seconds)
}
