//! `sparse-volume detach U`: what the unit's ExecStop does (the engine's
//! detach), usable by hand, and its dry run.

use crate::commands::report::{Failure, Outcome, Report};
use crate::engine::detach::{self, DetachReport};
use crate::registry::Registry;
use crate::volume::id::VolumeId;

/// A failed detach reports what it could not release; what it released
/// before is no longer attached, which the next detach reports as such.
pub fn detach(registry: &Registry, id: &VolumeId) -> Outcome<DetachReport> {
    detach::detach(registry, id).map_err(Failure::Unchanged)
}

pub fn plan_detach(registry: &Registry, id: &VolumeId) -> Outcome<DetachReport> {
    detach::plan_detach(registry, id).map_err(Failure::Unchanged)
}

impl Report for DetachReport {
    fn human(&self) -> String {
        if self.devices.is_empty() {
            return format!("{} is not attached", self.uuid);
        }
        let devices: Vec<_> = self
            .devices
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        match &self.closed {
            Some(mapping) => format!(
                "detached {} ({}; closed {} first)",
                self.uuid,
                devices.join(", "),
                mapping.display()
            ),
            None => format!("detached {} ({})", self.uuid, devices.join(", ")),
        }
    }

    fn planned(&self) -> String {
        match self.human().strip_prefix("detached ") {
            Some(rest) => format!("would detach {rest}"),
            None => self.human(),
        }
    }
}
