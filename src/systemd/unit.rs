//! The unit instance of a volume and what systemd says about it.

use std::time::Duration;

use crate::volume::id::VolumeId;

/// The job result that means success (`systemctl` treats it the same way).
pub const JOB_DONE: &str = "done";

/// The template unit every volume's unit is an instance of.
pub const UNIT_TEMPLATE: &str = "sparse-volume@.service";
/// Reached once every enabled volume's start job has finished.
pub const VOLUMES_TARGET: &str = "sparse-volumes.target";

/// `sparse-volume@<UUID>.service`: the instance of [`UNIT_TEMPLATE`] for
/// the volume. A canonical UUID needs no unit-name escaping (hex digits and
/// hyphens only), which is why [`VolumeId`] is the only input accepted.
pub fn unit_name(id: &VolumeId) -> String {
    // The template constant is the single source of the unit's name.
    match UNIT_TEMPLATE.split_once('@') {
        Some((prefix, suffix)) => {
            let mut name = String::with_capacity(UNIT_TEMPLATE.len() + 36);
            name.push_str(prefix);
            name.push('@');
            id.push_to(&mut name);
            name.push_str(suffix);
            name
        }
        None => unreachable!("UNIT_TEMPLATE {UNIT_TEMPLATE} is not a template unit name"),
    }
}

/// Every volume's unit, as a shell glob for systemd's unit listings.
pub fn all_volume_units() -> String {
    UNIT_TEMPLATE.replacen('@', "@*", 1)
}

/// A loaded unit's states as one listing of systemd gives them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitActivity {
    pub active_state: String,
    pub sub_state: String,
}

/// A unit's state as systemd reports it (`org.freedesktop.systemd1.Unit`
/// and `.Service` properties).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitState {
    /// `active`, `inactive`, `failed`, `activating`, `deactivating`, ...
    pub active_state: String,
    /// The unit-type specific state, e.g. `exited` or `dead`.
    pub sub_state: String,
    /// The service's `Result` (`success`, `exit-code`, `timeout`, ...).
    pub result: String,
    /// Units that want this one (`.wants/` links, `Wants=`).
    pub wanted_by: Vec<String>,
    /// Units that require this one (`.requires/` links, `Requires=`).
    pub required_by: Vec<String>,
    /// The service's `TimeoutStartUSec`/`TimeoutStopUSec` (0 or
    /// `u64::MAX`: no timeout).
    pub timeout_start_usec: u64,
    pub timeout_stop_usec: u64,
    /// The unit's current `InvocationID` in hex (its journal lines carry it
    /// as `_SYSTEMD_INVOCATION_ID`); None when systemd did not say.
    pub invocation_id: Option<String>,
}

impl UnitState {
    pub fn is_active(&self) -> bool {
        self.active_state == "active"
    }

    /// Stopped cleanly: nothing for a stop job to do.
    pub fn is_inactive(&self) -> bool {
        self.active_state == "inactive"
    }

    pub fn is_failed(&self) -> bool {
        self.active_state == "failed"
    }

    /// Its start job runs now.
    pub fn is_activating(&self) -> bool {
        self.active_state == "activating"
    }

    /// How long systemd gives a start job, `None` when unlimited.
    pub fn start_timeout(&self) -> Option<Duration> {
        finite(self.timeout_start_usec)
    }

    pub fn stop_timeout(&self) -> Option<Duration> {
        finite(self.timeout_stop_usec)
    }

    /// True when `unit` pulls this one in (wants or requires it), as the
    /// generator's link from `sparse-volumes.target` does for an enabled
    /// volume once systemd has reloaded.
    pub fn is_pulled_in_by(&self, unit: &str) -> bool {
        self.wanted_by
            .iter()
            .chain(&self.required_by)
            .any(|u| u == unit)
    }
}

/// systemd's "infinity" is `u64::MAX` µs, and 0 disables a timeout.
fn finite(usec: u64) -> Option<Duration> {
    (usec != 0 && usec != u64::MAX).then(|| Duration::from_micros(usec))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_name_comes_from_the_template() {
        let id: VolumeId = "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b".parse().unwrap();
        assert_eq!(
            unit_name(&id),
            "sparse-volume@6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b.service"
        );
    }

    #[test]
    fn the_glob_matches_every_instance_and_nothing_else() {
        assert_eq!(all_volume_units(), "sparse-volume@*.service");
    }

    #[test]
    fn wants_and_requires_both_pull_a_unit_in() {
        let mut state = UnitState {
            active_state: "inactive".into(),
            sub_state: "dead".into(),
            result: "success".into(),
            wanted_by: vec![],
            required_by: vec!["sparse-volumes.target".into()],
            timeout_start_usec: 90_000_000,
            timeout_stop_usec: u64::MAX,
            invocation_id: None,
        };
        assert_eq!(state.start_timeout(), Some(Duration::from_secs(90)));
        assert_eq!(state.stop_timeout(), None);
        assert!(state.is_pulled_in_by("sparse-volumes.target"));
        state.required_by.clear();
        assert!(!state.is_pulled_in_by("sparse-volumes.target"));
        state.wanted_by.push("sparse-volumes.target".into());
        assert!(state.is_pulled_in_by("sparse-volumes.target"));
    }
}
