//! systemd's side of a volume: the unit instance that attaches it, and a
//! small client for systemd's D-Bus API.
//!
//! The client needs zbus and so lives behind the `dbus` feature; the unit
//! naming and the journal tail do not, so the generator (built without
//! that feature) shares them. Without the feature, [`Systemd::connect`]
//! fails with a clear message, so every caller builds either way.

use std::time::Duration;

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

/// How long to wait for a job systemd runs for us when the unit does not
/// say (and for a daemon-reload), unless [`JOB_TIMEOUT_ENV`] says
/// otherwise: systemd's default start timeout.
pub const DEFAULT_JOB_TIMEOUT_SEC: u64 = 90;
/// Overrides every job wait (whole seconds), e.g. for tests.
pub const JOB_TIMEOUT_ENV: &str = "SPARSE_VOLUME_JOB_TIMEOUT_SEC";
/// Past the unit's own timeout, so that systemd's verdict (job result
/// `timeout`) arrives before we stop waiting for it.
const JOB_TIMEOUT_MARGIN: Duration = Duration::from_secs(10);

/// The job wait in force: the environment's override if it parses, else
/// the unit's own timeout plus a margin, at least the default.
pub fn job_wait(unit_timeout: Option<Duration>) -> Duration {
    let from_env = std::env::var(JOB_TIMEOUT_ENV)
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok());
    if let Some(seconds) = from_env {
        return Duration::from_secs(seconds);
    }
    let default = Duration::from_secs(DEFAULT_JOB_TIMEOUT_SEC);
    unit_timeout.map_or(default, |t| default.max(t + JOB_TIMEOUT_MARGIN))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_wait_outlasts_the_units_own_timeout() {
        if std::env::var_os(JOB_TIMEOUT_ENV).is_some() {
            return; // overridden for the whole run
        }
        let default = Duration::from_secs(DEFAULT_JOB_TIMEOUT_SEC);
        assert_eq!(job_wait(None), default);
        assert_eq!(job_wait(Some(Duration::from_secs(30))), default);
        assert_eq!(
            job_wait(Some(Duration::from_secs(300))),
            Duration::from_secs(310)
        );
    }
}
