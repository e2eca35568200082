//! systemd's side of a volume: the unit instance that attaches it, the
//! emergency switch on the kernel command line, the journal, and a small
//! client for systemd's D-Bus API.
//!
//! The client needs zbus and so lives behind the `dbus` feature; the unit
//! naming and the journal tail do not, so the generator (built without
//! that feature) shares them. Without the feature, [`Systemd::connect`]
//! fails with a clear message, so every caller builds either way.

use std::time::Duration;

mod journal;
pub mod kernel_cmdline;
pub mod unit;

pub use journal::{last_error_of_run, last_journal_lines};
pub use unit::{all_volume_units, unit_name, UnitActivity, UnitState, JOB_DONE};

#[cfg(feature = "dbus")]
mod client;
#[cfg(feature = "dbus")]
mod proxy;
#[cfg(feature = "dbus")]
pub use client::Systemd;
#[cfg(feature = "dbus")]
pub use proxy::ListedUnit;

#[cfg(not(feature = "dbus"))]
mod without_dbus;
#[cfg(not(feature = "dbus"))]
pub use without_dbus::Systemd;

/// How long to wait for a job systemd runs for us when the unit does not
/// say (and for a daemon-reload): systemd's default start timeout.
pub const DEFAULT_JOB_TIMEOUT_SEC: u64 = 90;
/// Past the unit's own timeout, so that systemd's verdict (job result
/// `timeout`) arrives before we stop waiting for it.
const JOB_TIMEOUT_MARGIN: Duration = Duration::from_secs(10);

/// The job wait in force: the unit's own timeout plus a margin, at least
/// the default (a test may shorten it: `hooks::job_wait`).
pub fn job_wait(unit_timeout: Option<Duration>) -> Duration {
    if let Some(wait) = crate::hooks::job_wait() {
        return wait;
    }
    let default = Duration::from_secs(DEFAULT_JOB_TIMEOUT_SEC);
    unit_timeout.map_or(default, |t| default.max(t + JOB_TIMEOUT_MARGIN))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_wait_outlasts_the_units_own_timeout() {
        if crate::hooks::job_wait().is_some() {
            return; // shortened for the whole run
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
