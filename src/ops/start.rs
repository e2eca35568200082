//! `sparse-volume start U` / `stop U`: the volume's unit through systemd,
//! waiting for the job result, and reporting what is true of the device.

use std::path::PathBuf;

use anyhow::Result;
use serde::Serialize;

use super::activate::{start_attached, stop_detached, UnitOutcome};
use super::Report;
use crate::paths::SystemRoot;
use crate::registry::Registry;
use crate::systemd::{unit_name, Systemd};
use crate::volume_id::VolumeId;

#[derive(Debug, Serialize)]
pub struct StartReport {
    pub changed: bool,
    pub uuid: String,
    pub unit: String,
    /// The job's result (`done`), null when no job was needed.
    pub job_result: Option<String>,
    pub active_state: String,
    pub sub_state: String,
    /// The loop device afterwards: set after a start, null after a stop.
    pub device: Option<PathBuf>,
}

impl Report for StartReport {
    fn human(&self) -> String {
        let state = format!("{} ({})", self.active_state, self.sub_state);
        let device = self
            .device
            .as_ref()
            .map_or(String::new(), |d| format!(", attached as {}", d.display()));
        if self.changed {
            format!("{}: {state}{device}", self.unit)
        } else {
            format!("{} was already {state}{device}", self.unit)
        }
    }
}

pub fn start(root: &SystemRoot, id: &VolumeId) -> Result<StartReport> {
    // The unit's attach refuses unregistered volumes too; saying so here
    // is clearer than a failed job.
    Registry::open(root.clone()).require(id)?;
    let systemd = Systemd::connect()?;
    let activation = start_attached(root, &systemd, id)?;
    Ok(report(id, activation.unit, activation.device))
}

/// Needs no registry entry: like `detach`, a volume's unit must be
/// stoppable after its configuration is gone.
pub fn stop(root: &SystemRoot, id: &VolumeId) -> Result<StartReport> {
    let systemd = Systemd::connect()?;
    let deactivation = stop_detached(root, Some(&systemd), id)?;
    let mut report = report(id, deactivation.unit, None);
    report.changed |= deactivation.changed;
    Ok(report)
}

fn report(id: &VolumeId, outcome: Option<UnitOutcome>, device: Option<PathBuf>) -> StartReport {
    let (changed, job_result, active_state, sub_state) = match outcome {
        Some(o) => (
            o.changed,
            o.job_result,
            o.state.active_state,
            o.state.sub_state,
        ),
        None => (false, None, "unknown".into(), "unknown".into()),
    };
    StartReport {
        changed,
        uuid: id.to_string(),
        unit: unit_name(id),
        job_result,
        active_state,
        sub_state,
        device,
    }
}
