//! `sparse-volume start U` / `stop U`: the volume's unit through systemd,
//! waiting for the job result, and reporting what is true of the device.

use std::path::PathBuf;

use anyhow::Result;
use serde::Serialize;

use crate::commands::report::{Failure, Outcome, Report};
use crate::engine::activate::{
    attached_devices, refuse_if_in_use, start_attached, stop_detached, UnitOutcome,
};
use crate::engine::attach::attach_planned;
use crate::registry::Registry;
use crate::systemd::{unit_name, Systemd, UnitState};
use crate::volume::id::VolumeId;

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
    /// `start` or `stop`, for a dry run's sentence.
    #[serde(skip)]
    pub action: &'static str,
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

    fn planned(&self) -> String {
        let state = format!("{} ({})", self.active_state, self.sub_state);
        if self.changed {
            format!("would {} {}, which is {state} now", self.action, self.unit)
        } else {
            format!("{} is already {state}", self.unit)
        }
    }
}

pub fn start(registry: &Registry, id: &VolumeId, dry_run: bool) -> Outcome<StartReport> {
    start_unit(registry, id, dry_run).map_err(Failure::Unchanged)
}

/// Needs no registry entry: like `detach`, a volume's unit must be
/// stoppable after its configuration is gone.
pub fn stop(registry: &Registry, id: &VolumeId, dry_run: bool) -> Outcome<StartReport> {
    stop_unit(registry, id, dry_run).map_err(Failure::Unchanged)
}

fn start_unit(registry: &Registry, id: &VolumeId, dry_run: bool) -> Result<StartReport> {
    // The unit's attach refuses unregistered volumes too; saying so here
    // is clearer than a failed job.
    registry.require(id)?;
    let systemd = Systemd::connect()?;
    if dry_run {
        let device = attach_planned(registry, id)?;
        let state = systemd.unit_state(&unit_name(id))?;
        let changed = device.is_none() || !state.is_active();
        return Ok(planned(id, "start", changed, state, device));
    }
    let activation = start_attached(registry, &systemd, id)?;
    Ok(report(id, "start", activation.unit, activation.device))
}

fn stop_unit(registry: &Registry, id: &VolumeId, dry_run: bool) -> Result<StartReport> {
    let systemd = Systemd::connect()?;
    if dry_run {
        refuse_if_in_use(registry, id)?;
        let state = systemd.unit_state(&unit_name(id))?;
        let changed = !state.is_inactive() || !attached_devices(registry, id)?.is_empty();
        return Ok(planned(id, "stop", changed, state, None));
    }
    let deactivation = stop_detached(registry, Some(&systemd), id)?;
    let mut report = report(id, "stop", deactivation.unit, None);
    report.changed |= deactivation.changed;
    Ok(report)
}

/// A dry run's report: the unit as it is, and whether it would change.
fn planned(
    id: &VolumeId,
    action: &'static str,
    changed: bool,
    state: UnitState,
    device: Option<PathBuf>,
) -> StartReport {
    report(
        id,
        action,
        Some(UnitOutcome {
            changed,
            job_result: None,
            state,
        }),
        device,
    )
}

fn report(
    id: &VolumeId,
    action: &'static str,
    outcome: Option<UnitOutcome>,
    device: Option<PathBuf>,
) -> StartReport {
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
        action,
    }
}
