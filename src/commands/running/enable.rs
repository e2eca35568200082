//! `sparse-volume enable U [--now]` / `disable U [--now]`: the registry's
//! `enabled` flag (what the generator turns into a boot-time wants link),
//! a daemon-reload so systemd sees it, and with `--now` the unit itself.

use anyhow::{Context, Result};
use serde::Serialize;

use crate::commands::report::{Failure, Outcome, Report};
use crate::engine::activate::{
    attach_directly, attached_devices, flag_without_systemd, refuse_if_in_use, start_attached,
    stop_detached, systemd_agrees, systemd_unless_absent, UnitOutcome,
};
use crate::engine::attach::attach_planned;
use crate::hooks::{self, Stop};
use crate::kernel::files::ExclusiveLock;
use crate::registry::Registry;
use crate::systemd::{unit_name, Systemd};
use crate::volume::id::VolumeId;

#[derive(Debug, Serialize)]
pub struct EnableReport {
    /// The registry flag changed, systemd was reloaded, or (with `--now`)
    /// the unit was started or stopped.
    pub changed: bool,
    pub uuid: String,
    pub unit: String,
    pub enabled: bool,
    /// systemd was reloaded (the flag changed, or systemd's view of the
    /// unit disagreed with the registry).
    pub reloaded: bool,
    /// With `--now`: the start/stop job's result, null when none was needed.
    pub job_result: Option<String>,
    /// With `--now`: the unit's state afterwards, else null.
    pub active_state: Option<String>,
    pub sub_state: Option<String>,
    pub warnings: Vec<String>,
}

impl Report for EnableReport {
    fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }

    fn human(&self) -> String {
        let what = if self.enabled { "enabled" } else { "disabled" };
        let mut text = if self.changed {
            format!("{} is {what}", self.uuid)
        } else {
            format!("{} was already {what}", self.uuid)
        };
        if let (Some(active), Some(sub)) = (&self.active_state, &self.sub_state) {
            text.push_str(&format!("; {} is {active} ({sub})", self.unit));
        }
        text
    }

    fn planned(&self) -> String {
        let (what, now) = if self.enabled {
            ("enable", "start")
        } else {
            ("disable", "stop")
        };
        if !self.changed {
            return self.human().replace(" was already ", " is already ");
        }
        let mut text = format!("would {what} {}", self.uuid);
        if let (Some(active), Some(sub)) = (&self.active_state, &self.sub_state) {
            text.push_str(&format!(
                " and {now} {} if needed (it is {active} ({sub}) now)",
                self.unit
            ));
        }
        text
    }
}

pub fn enable(
    registry: &Registry,
    id: &VolumeId,
    now: bool,
    dry_run: bool,
) -> Outcome<EnableReport> {
    set_enabled(registry, id, true, now, dry_run)
}

pub fn disable(
    registry: &Registry,
    id: &VolumeId,
    now: bool,
    dry_run: bool,
) -> Outcome<EnableReport> {
    set_enabled(registry, id, false, now, dry_run)
}

fn set_enabled(
    registry: &Registry,
    id: &VolumeId,
    enabled: bool,
    now: bool,
    dry_run: bool,
) -> Outcome<EnableReport> {
    // Check what can fail before changing anything: an unknown volume, a
    // bus that does not answer on a machine systemd runs. Without systemd
    // the flag is still written (the generator reads it at the next boot),
    // and `--now` attaches or detaches directly, as `apply` does.
    registry.require(id).map_err(Failure::Unchanged)?;
    let systemd = systemd_unless_absent(registry).map_err(Failure::Unchanged)?;
    let warnings = match &systemd {
        Ok(_) => Vec::new(),
        Err(reason) => {
            tracing::info!("{reason:#}");
            vec![flag_without_systemd(enabled)]
        }
    };
    if dry_run {
        let mut report = planned(registry, systemd.as_ref().ok(), id, enabled, now)
            .map_err(Failure::Unchanged)?;
        report.warnings = warnings;
        return Ok(report);
    }
    // What the attach would refuse (a volume the kernel command line
    // skips, a missing file, content that is not the volume) is refused
    // before the flag changes.
    if now && enabled {
        attach_planned(registry, id).map_err(Failure::Unchanged)?;
    }
    // Held from the stop to the write: `check --repair` attaches every
    // enabled volume it finds detached, under this lock, so a stop outside
    // it could be undone before the flag says disabled.
    let lock = registry.lock().map_err(Failure::Unchanged)?;
    // disable --now stops first: a stop that fails (the volume is in use)
    // then leaves the flag as it was, not half a change.
    let stopped = if now && !enabled {
        let deactivation =
            stop_detached(registry, systemd.as_ref().ok(), id).map_err(Failure::Unchanged)?;
        hooks::stop_at(Stop::DisableAfterStop);
        Some((deactivation.unit, deactivation.changed))
    } else {
        None
    };
    let flag_changed = write_flag(registry, id, enabled).map_err(Failure::Unchanged)?;
    // From here on the flag is written: a failure says so.
    let rest = finish_after_the_flag(registry, &systemd, id, enabled, now, flag_changed, lock);
    let (reloaded, outcome, unit_changed) = match rest {
        Ok(rest) => rest,
        Err(error) if flag_changed => {
            return Err(Failure::PartlyApplied {
                uuid: *id,
                actions: vec![if enabled { "enable" } else { "disable" }.into()],
                error,
            })
        }
        Err(error) => return Err(Failure::Unchanged(error)),
    };
    let (outcome, unit_changed) = match stopped {
        Some(stopped) => stopped,
        None => (outcome, unit_changed),
    };
    let (job_result, active_state, sub_state) = match outcome {
        Some(o) => (
            o.job_result,
            Some(o.state.active_state),
            Some(o.state.sub_state),
        ),
        None => (None, None, None),
    };
    Ok(EnableReport {
        changed: flag_changed || reloaded || unit_changed,
        uuid: id.to_string(),
        unit: unit_name(id),
        enabled,
        reloaded,
        job_result,
        active_state,
        sub_state,
        warnings,
    })
}

/// Writes the registry's flag; true when it changed.
fn write_flag(registry: &Registry, id: &VolumeId, enabled: bool) -> Result<bool> {
    let mut volume = registry.require(id)?;
    let changed = volume.enabled != enabled;
    if changed {
        volume.enabled = enabled;
        registry.put(&volume)?;
    }
    Ok(changed)
}

/// The reload and, with `enable --now`, the start: through systemd after
/// the registry lock is let go (the unit's attach takes the volume's
/// lock), or without systemd still under it, so that a `disable --now`
/// cannot come between the flag and the attach and leave a disabled
/// volume attached.
fn finish_after_the_flag(
    registry: &Registry,
    systemd: &Result<Systemd>,
    id: &VolumeId,
    enabled: bool,
    now: bool,
    flag_changed: bool,
    lock: ExclusiveLock,
) -> Result<(bool, Option<UnitOutcome>, bool)> {
    let unit = unit_name(id);
    let systemd = match systemd {
        Ok(systemd) => systemd,
        Err(reason) => {
            let attached = if now && enabled {
                attach_directly(registry, id, reason)?.changed
            } else {
                false
            };
            drop(lock);
            return Ok((false, None, attached));
        }
    };
    drop(lock);
    // A reload reruns every generator, so skip it when systemd already
    // agrees with the registry; but a flag edited by hand (or a reload
    // that failed last time) still gets one.
    let reloaded = flag_changed || !systemd_agrees(registry, systemd, id, enabled);
    if reloaded {
        tracing::info!("reloading systemd (daemon-reload) for {unit}");
        systemd.reload().with_context(|| {
            format!(
                "the registry says enabled = {enabled}, but systemd does not know yet (run `systemctl daemon-reload`)"
            )
        })?;
    }
    if now && enabled {
        let activation = start_attached(registry, systemd, id)?;
        return Ok((reloaded, activation.unit, activation.changed));
    }
    Ok((reloaded, None, false))
}

/// What `set_enabled` would change, after the checks it runs first (the
/// volume registered, systemd reachable; for a start, the content; for a
/// stop, nothing holding the volume).
fn planned(
    registry: &Registry,
    systemd: Option<&Systemd>,
    id: &VolumeId,
    enabled: bool,
    now: bool,
) -> Result<EnableReport> {
    let unit = unit_name(id);
    let flag_changed = registry.require(id)?.enabled != enabled;
    let reloaded =
        systemd.is_some_and(|s| flag_changed || !systemd_agrees(registry, s, id, enabled));
    let state = systemd.map(|s| s.unit_state(&unit)).transpose()?;
    let unit_changes = match (now, enabled) {
        (false, _) => false,
        (true, true) => {
            let attached = attach_planned(registry, id)?.is_some();
            !attached || state.as_ref().is_some_and(|s| !s.is_active())
        }
        (true, false) => {
            refuse_if_in_use(registry, id)?;
            state.as_ref().is_some_and(|s| !s.is_inactive())
                || !attached_devices(registry, id)?.is_empty()
        }
    };
    let state = state.filter(|_| now);
    Ok(EnableReport {
        changed: flag_changed || reloaded || unit_changes,
        uuid: id.to_string(),
        unit,
        enabled,
        reloaded,
        job_result: None,
        active_state: state.as_ref().map(|s| s.active_state.clone()),
        sub_state: state.map(|s| s.sub_state),
        warnings: Vec::new(),
    })
}
