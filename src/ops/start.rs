//! `sparse-volume start U` / `stop U`: the volume's unit through systemd,
//! waiting for the job result. Also the `--now` half of enable/disable.

use anyhow::{anyhow, Result};
use serde::Serialize;

use super::Report;
use crate::paths::SystemRoot;
use crate::registry::Registry;
use crate::systemd::{job_wait, last_journal_lines, unit_name, Systemd, UnitState, JOB_DONE};
use crate::volume_id::VolumeId;

/// Enough journal to show why an attach failed, short enough to read.
const JOURNAL_LINES: usize = 10;

#[derive(Debug, Serialize)]
pub struct StartReport {
    pub changed: bool,
    pub uuid: String,
    pub unit: String,
    /// The job's result (`done`), null when no job was needed.
    pub job_result: Option<String>,
    pub active_state: String,
    pub sub_state: String,
}

impl Report for StartReport {
    fn human(&self) -> String {
        let state = format!("{} ({})", self.active_state, self.sub_state);
        match (&self.job_result, self.changed) {
            (Some(_), _) | (None, true) => format!("{}: {state}", self.unit),
            (None, false) => format!("{} was already {state}", self.unit),
        }
    }
}

/// How a unit ended up after bring_up/bring_down.
pub(super) struct UnitOutcome {
    pub changed: bool,
    pub job_result: Option<String>,
    pub state: UnitState,
}

pub fn start(root: &SystemRoot, id: &VolumeId) -> Result<StartReport> {
    // The unit's attach refuses unregistered volumes too; saying so here
    // is clearer than a failed job.
    let registry = Registry::open(root.clone())?;
    registry.require(id)?;
    let systemd = Systemd::connect()?;
    let unit = unit_name(id);
    report(id, unit.clone(), bring_up(&systemd, &unit)?)
}

/// Needs no registry entry: like `detach`, a volume's unit must be
/// stoppable after its configuration is gone.
pub fn stop(_root: &SystemRoot, id: &VolumeId) -> Result<StartReport> {
    let systemd = Systemd::connect()?;
    let unit = unit_name(id);
    report(id, unit.clone(), bring_down(&systemd, &unit)?)
}

fn report(id: &VolumeId, unit: String, outcome: UnitOutcome) -> Result<StartReport> {
    Ok(StartReport {
        changed: outcome.changed,
        uuid: id.to_string(),
        unit,
        job_result: outcome.job_result,
        active_state: outcome.state.active_state,
        sub_state: outcome.state.sub_state,
    })
}

/// Starts the unit unless it is active already, and waits for the job.
pub(super) fn bring_up(systemd: &Systemd, unit: &str) -> Result<UnitOutcome> {
    let before = systemd.unit_state(unit)?;
    if before.is_active() {
        return Ok(UnitOutcome {
            changed: false,
            job_result: None,
            state: before,
        });
    }
    if before.is_failed() {
        // An explicit start should not be refused by the start rate limit
        // that earlier failures (at boot, say) used up.
        systemd.reset_failed(unit)?;
    }
    tracing::info!("starting {unit} (was {})", before.active_state);
    let result = systemd.start_unit(unit, job_wait(before.start_timeout()))?;
    finish(systemd, unit, "start", result)
}

/// Stops the unit unless it is stopped already, and waits for the job. A
/// failed unit is only reset: there is nothing running to stop, and the
/// reset makes it read as stopped.
pub(super) fn bring_down(systemd: &Systemd, unit: &str) -> Result<UnitOutcome> {
    let before = systemd.unit_state(unit)?;
    if before.is_inactive() {
        return Ok(UnitOutcome {
            changed: false,
            job_result: None,
            state: before,
        });
    }
    if before.is_failed() {
        systemd.reset_failed(unit)?;
        return Ok(UnitOutcome {
            changed: true,
            job_result: None,
            state: systemd.unit_state(unit)?,
        });
    }
    tracing::info!("stopping {unit} (was {})", before.active_state);
    let result = systemd.stop_unit(unit, job_wait(before.stop_timeout()))?;
    finish(systemd, unit, "stop", result)
}

fn finish(systemd: &Systemd, unit: &str, verb: &str, result: String) -> Result<UnitOutcome> {
    let state = systemd.unit_state(unit);
    if result != JOB_DONE {
        return Err(job_failed(unit, verb, &result, state.ok()));
    }
    Ok(UnitOutcome {
        changed: true,
        job_result: Some(result),
        state: state?,
    })
}

/// "sparse-volume@U.service: the start job ended with result "failed";
/// the unit is failed (failed), its result "exit-code"", then the unit's
/// last journal lines when they can be read.
fn job_failed(unit: &str, verb: &str, result: &str, state: Option<UnitState>) -> anyhow::Error {
    let mut message = format!("{unit}: the {verb} job ended with result \"{result}\"");
    if let Some(state) = state {
        message.push_str(&format!(
            "; the unit is {} ({}), its result \"{}\"",
            state.active_state, state.sub_state, state.result
        ));
    }
    let journal = last_journal_lines(unit, JOURNAL_LINES);
    if !journal.is_empty() {
        message.push_str(&format!("\nlast journal lines of {unit}:"));
        for line in journal {
            message.push_str("\n  ");
            message.push_str(&line);
        }
    }
    anyhow!(message)
}
