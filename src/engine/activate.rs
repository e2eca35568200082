//! Bringing a volume up or down "now": through systemd when it is
//! reachable, so the unit's state tells the truth, and directly
//! (attach/detach) on systems without it. Every answer is checked against
//! the device itself: a oneshot unit stays "active" after someone detached
//! its device by hand, and a failed unit may still hold one.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Result};

use crate::engine::attach::attach;
use crate::engine::detach::{backing_file_deleted, detach, find_devices, recovery_hint};
use crate::kernel::holders::{in_use, users_of_loop};
use crate::kernel::loop_device::LoopDevice;
use crate::registry::Registry;
use crate::systemd::kernel_cmdline::skip_reason;
use crate::systemd::unit::VOLUMES_TARGET;
use crate::systemd::{
    job_wait, last_error_of_run, last_journal_lines, unit_name, Systemd, UnitState, JOB_DONE,
};
use crate::volume::id::VolumeId;

/// Enough journal to show why an attach failed, short enough to read.
const JOURNAL_LINES: usize = 10;

/// How a unit ended up after a start or stop.
pub struct UnitOutcome {
    pub changed: bool,
    /// The job's result (`done`), `None` when no job was needed.
    pub job_result: Option<String>,
    pub state: UnitState,
}

pub struct Activation {
    pub changed: bool,
    /// The loop device the volume is attached to afterwards.
    pub device: Option<PathBuf>,
    /// The unit's outcome, when systemd did the work.
    pub unit: Option<UnitOutcome>,
    pub how: String,
}

pub struct Deactivation {
    pub changed: bool,
    /// Devices detached here, besides what the unit's ExecStop did.
    pub detached: Vec<PathBuf>,
    pub unit: Option<UnitOutcome>,
}

/// The loop devices the volume is attached to right now.
pub fn attached_devices(registry: &Registry, id: &VolumeId) -> Result<Vec<PathBuf>> {
    let (numbers, _) = find_devices(registry, id)?;
    Ok(numbers.into_iter().map(LoopDevice::path_of).collect())
}

/// Starts the volume (after a daemon-reload when `reload`, so that the
/// generator has seen a new registry entry) and returns once its device
/// is there; attaches directly when systemd is not reachable.
pub fn bring_up_now(registry: &Registry, id: &VolumeId, reload: bool) -> Result<Activation> {
    match Systemd::connect() {
        Ok(systemd) => {
            if reload {
                systemd.reload()?;
            }
            start_attached(registry, &systemd, id)
        }
        Err(reason) => attach_directly(registry, id, &reason),
    }
}

/// Without systemd (`reason` says why it is not reachable): the attach a
/// unit would have run.
pub fn attach_directly(
    registry: &Registry,
    id: &VolumeId,
    reason: &anyhow::Error,
) -> Result<Activation> {
    let attached = attach(registry, id)?;
    Ok(Activation {
        changed: attached.changed,
        device: Some(attached.device),
        unit: None,
        how: format!("attached directly ({reason:#})"),
    })
}

/// systemd, or why there is none to ask: `Err` only on a machine systemd
/// did not boot (a chroot, an image build, a container), where the
/// registry's flag is all there is. On a machine it booted, a bus that
/// does not answer is an error, not "no systemd": a flag or a device
/// changed behind its back would leave units that do not know.
pub fn systemd_unless_absent(registry: &Registry) -> Result<Result<Systemd>> {
    match Systemd::connect() {
        Ok(systemd) => Ok(Ok(systemd)),
        Err(reason) if registry.root().host_path(SYSTEMD_BOOTED).exists() => Err(reason.context(
            "systemd runs on this machine but does not answer on the system bus; nothing was changed",
        )),
        Err(reason) => Ok(Err(reason)),
    }
}

/// What `sd_booted()` looks at: present only when systemd is PID 1.
const SYSTEMD_BOOTED: &str = "/run/systemd/system";

/// What `enable`, `disable` and `apply` say when they write the flag
/// without systemd: only the generator at the next boot will read it.
pub fn flag_without_systemd(enabled: bool) -> String {
    format!(
        "systemd is not reachable, so nothing was reloaded: enabled = {enabled} takes effect at the next boot (or at `systemctl daemon-reload` once systemd runs)"
    )
}

/// Starts the unit, restarting it when it claims to be active but the
/// device is gone, and fails unless the device is there afterwards.
pub fn start_attached(registry: &Registry, systemd: &Systemd, id: &VolumeId) -> Result<Activation> {
    let unit = unit_name(id);
    let had_device = !attached_devices(registry, id)?.is_empty();
    let before = systemd.unit_state(&unit)?;
    let restarted = before.is_active() && !had_device;
    if restarted {
        tracing::info!("{unit} is active but its device is gone; restarting it");
        let result = systemd.stop_unit(&unit, job_wait(before.stop_timeout()))?;
        finish(systemd, &unit, "stop", result, &before)?;
    }
    let mut outcome = bring_up(systemd, &unit)?;
    outcome.changed |= restarted;
    let Some(device) = attached_devices(registry, id)?.into_iter().next() else {
        bail!(
            "{unit} is {} ({}), but {id} has no loop device (see `journalctl -u {unit}`)",
            outcome.state.active_state,
            outcome.state.sub_state
        );
    };
    Ok(Activation {
        changed: outcome.changed,
        device: Some(device),
        how: format!("started {unit}"),
        unit: Some(outcome),
    })
}

/// Stops the unit when systemd is given, then makes sure no device of the
/// volume is left (a unit that failed after binding never runs its
/// ExecStop; a device may have been attached by hand). Refuses, changing
/// nothing, while the volume is in use.
pub fn stop_detached(
    registry: &Registry,
    systemd: Option<&Systemd>,
    id: &VolumeId,
) -> Result<Deactivation> {
    refuse_if_in_use(registry, id)?;
    let name = unit_name(id);
    let mut unit = systemd
        .map(|systemd| bring_down(systemd, &name))
        .transpose()?;
    // The device's truth, with detach's own reason when it stays.
    let detached = detach(registry, id)?.devices;
    if let (Some(systemd), Some(outcome)) = (systemd, unit.as_mut()) {
        if outcome.state.is_failed() {
            // Its ExecStop failed, but the device is gone now.
            systemd.reset_failed(&name)?;
            outcome.state = systemd.unit_state(&name)?;
        }
    }
    Ok(Deactivation {
        changed: !detached.is_empty() || unit.as_ref().is_some_and(|u| u.changed),
        detached,
        unit,
    })
}

/// [`stop_detached`] through systemd when it is reachable.
pub fn bring_down_now(registry: &Registry, id: &VolumeId) -> Result<Deactivation> {
    let systemd = Systemd::connect().ok();
    stop_detached(registry, systemd.as_ref(), id)
}

/// A stop whose detach then fails would leave a failed unit and a device
/// still in use: say why before touching anything. A device whose backing
/// file was deleted holds the only copy of the data: stopping the volume
/// would destroy it (a by-hand `detach` still does what it is told).
pub fn refuse_if_in_use(registry: &Registry, id: &VolumeId) -> Result<()> {
    let (devices, _) = find_devices(registry, id)?;
    for number in devices {
        if backing_file_deleted(number) {
            bail!(
                "{}: its backing file was deleted and it holds the only copy of the data; {}",
                LoopDevice::path_of(number).display(),
                recovery_hint(number)
            );
        }
        let users = users_of_loop(number);
        if !users.is_empty() {
            bail!(in_use(&users));
        }
    }
    Ok(())
}

/// Tells systemd the registry changed, when systemd is there to listen.
pub fn reload_if_reachable() -> Result<()> {
    match Systemd::connect() {
        Ok(systemd) => systemd.reload(),
        Err(_) => Ok(()),
    }
}

/// Starts the unit unless it is active already, and waits for the job.
pub fn bring_up(systemd: &Systemd, unit: &str) -> Result<UnitOutcome> {
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
    finish(systemd, unit, "start", result, &before)
}

/// Stops the unit unless it is stopped already, and waits for the job. A
/// failed unit is only reset: there is nothing running to stop, and the
/// reset makes it read as stopped.
pub fn bring_down(systemd: &Systemd, unit: &str) -> Result<UnitOutcome> {
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
    finish(systemd, unit, "stop", result, &before)
}

fn finish(
    systemd: &Systemd,
    unit: &str,
    verb: &str,
    result: String,
    before: &UnitState,
) -> Result<UnitOutcome> {
    let state = systemd.unit_state(unit);
    if result != JOB_DONE {
        return Err(job_failed(unit, verb, &result, state.ok(), before));
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
fn job_failed(
    unit: &str,
    verb: &str,
    result: &str,
    state: Option<UnitState>,
    before: &UnitState,
) -> anyhow::Error {
    let mut message = format!("{unit}: the {verb} job ended with result \"{result}\"");
    if let Some(state) = &state {
        message.push_str(&format!(
            "; the unit is {} ({}), its result \"{}\"",
            state.active_state, state.sub_state, state.result
        ));
        // Why, in the program's own words, on the same line: the run's
        // last error in the journal ("sparse-volume: attaching U: ...", or
        // systemd's own line when the program could not be run). Only for
        // a run this job made: a job that ran nothing (a dependency
        // failed) leaves the previous run's ID in place.
        let this_run = state
            .invocation_id
            .as_deref()
            .filter(|id| before.invocation_id.as_deref() != Some(*id));
        if let Some(reason) = this_run.and_then(last_error_of_run) {
            let reason = reason.strip_prefix("sparse-volume: ").unwrap_or(&reason);
            message.push_str(&format!(": {reason}"));
        }
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

/// True when systemd's loaded configuration already reflects the flag: the
/// generator's link from `sparse-volumes.target` (a `.wants` link; older
/// versions made `.requires`) shows in the unit's `RequiredBy`/`WantedBy` exactly when the
/// volume is enabled and the kernel command line does not skip it (then
/// no reload would ever make it show). When in doubt, say no (a needless
/// reload is harmless, a missing one is not).
pub fn systemd_agrees(
    registry: &Registry,
    systemd: &Systemd,
    id: &VolumeId,
    enabled: bool,
) -> bool {
    let unit = unit_name(id);
    let pulled_in = enabled && skip_reason(registry.root(), id).is_none();
    match systemd.unit_state(&unit) {
        Ok(state) => state.is_pulled_in_by(VOLUMES_TARGET) == pulled_in,
        Err(e) => {
            tracing::debug!("cannot compare systemd's view of {unit}: {e:#}");
            false
        }
    }
}
