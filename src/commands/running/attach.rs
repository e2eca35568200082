//! `sparse-volume attach U`: what the unit's ExecStart does (the engine's
//! attach), usable by hand, and its dry run.

use crate::commands::report::{Failure, Outcome, Report};
use crate::engine::attach::{self, AttachPlan, AttachReport};
use crate::registry::Registry;
use crate::volume::id::VolumeId;

/// A failed attach leaves nothing behind (it releases a device it bound),
/// so its failure changed nothing.
pub fn attach(registry: &Registry, id: &VolumeId) -> Outcome<AttachReport> {
    attach::attach(registry, id).map_err(Failure::Unchanged)
}

pub fn plan_attach(registry: &Registry, id: &VolumeId) -> Outcome<AttachPlan> {
    attach::plan_attach(registry, id).map_err(Failure::Unchanged)
}

impl Report for AttachReport {
    fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }

    fn human(&self) -> String {
        let mut text = if self.changed {
            format!("attached {} as {}", self.uuid, self.device.display())
        } else {
            format!(
                "{} was already attached as {}",
                self.uuid,
                self.device.display()
            )
        };
        if let Some(opened) = &self.opened {
            text.push_str(&format!(", opened as {}", opened.display()));
        }
        if self.link_state == "no-udev" {
            text.push_str(&format!(
                " (udev is not running: not waiting for {})",
                self.link.display()
            ));
        }
        text
    }
}

impl Report for AttachPlan {
    fn human(&self) -> String {
        match (&self.device, self.changed) {
            (Some(device), false) => format!("{} is attached as {}", self.uuid, device.display()),
            (Some(device), true) => format!(
                "{} is attached as {}, whose pending detach would be cancelled",
                self.uuid,
                device.display()
            ),
            (None, _) => format!("{} would be attached to a free loop device", self.uuid),
        }
    }
}
