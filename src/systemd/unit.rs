//! The unit instance of a volume and what systemd says about it.

use crate::paths::UNIT_TEMPLATE;
use crate::volume_id::VolumeId;

/// The job result that means success (`systemctl` treats it the same way).
pub const JOB_DONE: &str = "done";

/// `sparse-volume@<UUID>.service`: the instance of [`UNIT_TEMPLATE`] for
/// the volume. A canonical UUID needs no unit-name escaping (hex digits and
/// hyphens only), which is why [`VolumeId`] is the only input accepted.
pub fn unit_name(id: &VolumeId) -> String {
    // The template constant is the single source of the unit's name.
    match UNIT_TEMPLATE.split_once('@') {
        Some((prefix, suffix)) => format!("{prefix}@{id}{suffix}"),
        None => unreachable!("UNIT_TEMPLATE {UNIT_TEMPLATE} is not a template unit name"),
    }
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
    /// Units that want this one; the generator's wants link shows here as
    /// `sparse-volumes.target` once systemd has reloaded.
    pub wanted_by: Vec<String>,
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
}
