//! Taking a volume over from the unit that attached it so far (a
//! MetalK8s-style `losetup --find` unit), with its consumers mounted: the
//! old unit must never run its ExecStop again (it would detach the device
//! under them) nor start at a later boot (a second loop device for the
//! same file), and sparse-volume's unit adopts the device that is there.
//!
//! The registry entry's `replaces_unit` is what makes it safe: from the
//! moment it is written the generator masks that unit at every boot and
//! reload, so one write switches the volume over and a crash at any later
//! step leaves a node that boots right. The live steps (disable, reload,
//! stop, start) only bring the running system to the same place, and
//! repeat harmlessly.

use std::path::PathBuf;

use anyhow::{bail, Result};
use serde::Serialize;

use crate::engine::activate::{attached_devices, bring_down, start_attached};
use crate::engine::attach::attach;
use crate::registry::Registry;
use crate::systemd::{unit_name, Systemd};
use crate::volume::id::VolumeId;

/// systemd's `LoadState` of a unit whose file is a link to /dev/null.
pub const MASKED: &str = "masked";
/// The `LoadState` of a unit whose file systemd read.
const LOADED: &str = "loaded";

#[derive(Debug, Default, Serialize)]
pub struct TakeOverReport {
    /// The unit taken over from.
    pub unit: String,
    /// Its enablement links were removed (`systemctl disable`).
    pub disabled: bool,
    /// systemd shows it masked (by the generator) after the reload.
    pub masked: bool,
    /// It was active and was stopped, its ExecStop masked away.
    pub stopped: bool,
    /// sparse-volume's unit was started, adopting the device.
    pub started: bool,
    /// The loop device the volume is attached to afterwards.
    pub device: Option<PathBuf>,
    /// What could not be done now (no systemd, a disable that failed).
    pub notes: Vec<String>,
}

impl TakeOverReport {
    pub fn changed(&self) -> bool {
        self.disabled || self.stopped || self.started
    }

    pub fn human(&self) -> String {
        let mut done = Vec::new();
        if self.masked {
            done.push("masked at every boot");
        }
        if self.disabled {
            done.push("disabled");
        }
        if self.stopped {
            done.push("stopped without its ExecStop");
        }
        // Without systemd nothing was done to the unit yet.
        let mut said = if self.masked {
            format!("took over from {}", self.unit)
        } else {
            format!("{} masked from the next boot on", self.unit)
        };
        if !done.is_empty() {
            said.push_str(&format!(" ({})", done.join(", ")));
        }
        if let Some(device) = &self.device {
            let how = if self.started { "now holds" } else { "holds" };
            said.push_str(&format!("; sparse-volume {how} {}", device.display()));
        }
        said
    }
}

/// The unit must be the one that attached this volume, which its name
/// says: MetalK8s names its instances by the UUID, and a unit named by a
/// file's systemd-escaped path carries the UUID with `\x2d` for each
/// hyphen. A typo or an unrelated service (`dbus.service`) would otherwise
/// be stopped now and masked at every boot.
pub fn refuse_unrelated_unit(unit: &str, id: &VolumeId) -> Result<()> {
    let uuid = id.to_string();
    let named = unit.to_ascii_lowercase();
    if named.contains(&uuid) || named.contains(&uuid.replace('-', "\\x2d")) {
        return Ok(());
    }
    bail!(
        "{unit} does not name the volume's UUID {uuid}: the unit to take over is the one that attached this volume (for MetalK8s, metalk8s-sparse-volume@{uuid}.service)"
    )
}

/// Read-only, before anything is written: systemd must know the unit (a
/// misspelt name is `not-found`), or have it masked already (a repeat).
pub fn refuse_unknown_unit(systemd: &Systemd, unit: &str) -> Result<()> {
    let state = systemd.load_state(unit)?;
    if state == LOADED || state == MASKED {
        return Ok(());
    }
    bail!("systemd has no unit {unit} (its load state is {state}); name the unit that attached the volume")
}

/// What refuses a take-over before anything is written: two loop devices
/// for the file (which one do the consumers use?).
pub fn refuse_unless_one_device(registry: &Registry, id: &VolumeId, unit: &str) -> Result<()> {
    let devices = attached_devices(registry, id)?;
    if devices.len() > 1 {
        bail!(
            "the backing file is attached {} times ({}); a take-over adopts one device: detach the ones no consumer uses (`losetup -d`), then take over from {unit}",
            devices.len(),
            devices
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}

/// What a take-over without systemd leaves for later.
pub fn unmanaged_note(unit: &str) -> String {
    format!(
        "systemd is not reachable: {unit} is masked by the generator from the next boot on; once systemd runs, repeat the command to disable it"
    )
}

/// For a dry run: whether the live steps still have something to do (an
/// interrupted take-over, or one not begun).
pub fn live_steps_pending(
    registry: &Registry,
    systemd: &Systemd,
    id: &VolumeId,
    unit: &str,
) -> Result<bool> {
    if systemd.load_state(unit)? != MASKED || !systemd.unit_state(unit)?.is_inactive() {
        return Ok(true);
    }
    let attached = !attached_devices(registry, id)?.is_empty();
    Ok(attached && !systemd.unit_state(&unit_name(id))?.is_active())
}

/// The live steps, once the registry entry names `unit`. `start` asks for
/// sparse-volume's unit to run even when no device is bound (`--now`);
/// one that is bound is always adopted, so the device has an owner that
/// detaches it at shutdown after its consumers.
pub fn take_over_now(
    registry: &Registry,
    systemd: Option<&Systemd>,
    id: &VolumeId,
    unit: &str,
    start: bool,
) -> Result<TakeOverReport> {
    let mut report = TakeOverReport {
        unit: unit.to_string(),
        ..TakeOverReport::default()
    };
    let before = attached_devices(registry, id)?;
    let Some(systemd) = systemd else {
        // A machine systemd did not boot: nothing runs the old unit now,
        // and the generator masks it from the first boot on.
        report.notes.push(unmanaged_note(unit));
        if start || !before.is_empty() {
            let attached = attach(registry, id)?;
            report.started = attached.changed;
            report.device = Some(attached.device);
        }
        return Ok(report);
    };
    // Every time, masked or not: a boot without the generator's masks
    // (sparse_volume=off, the package removed) must not start it again.
    match systemd.disable_unit_files(unit) {
        Ok(changes) => report.disabled = removes_an_enablement_link(&changes, unit),
        Err(error) => report.notes.push(format!(
            "{error:#}; it stays masked at every boot all the same"
        )),
    }
    // Masked already: an earlier run got past the reload.
    if systemd.load_state(unit)? != MASKED {
        systemd.reload()?;
        let load_state = systemd.load_state(unit)?;
        if load_state != MASKED {
            // Stopping it now would run its ExecStop under the consumers.
            bail!(
                "after the reload systemd shows {unit} {load_state}, not masked (does the generator run: is sparse-volume-generator installed in systemd's generator directory?); {unit} is left running so that its ExecStop cannot detach the device; the volume is registered: repeat the command once the generator runs"
            );
        }
    }
    report.masked = true;
    report.stopped = bring_down(systemd, unit)?.changed;
    if start || !before.is_empty() {
        let activation = start_attached(registry, systemd, id)?;
        report.started = activation.changed;
        if let (Some(was), Some(now)) = (before.first(), activation.device.as_ref()) {
            if was != now {
                bail!(
                    "{} started on {} although {} held the volume before; two devices may now attach the file: see `sparse-volume check`",
                    unit_name(id),
                    now.display(),
                    was.display()
                );
            }
        }
        report.device = activation.device;
    }
    Ok(report)
}

/// Whether systemd's answer to a disable names a removed `.wants/` (or
/// `.requires/`, `.upholds/`) link of `unit`: it may list other things
/// for a masked unit, which are no change of its enablement.
fn removes_an_enablement_link(changes: &[(String, String, String)], unit: &str) -> bool {
    for (kind, file, _) in changes {
        tracing::info!("systemd: {kind} {file}");
    }
    changes.iter().any(|(kind, file, _)| {
        let (dir, name) = file.rsplit_once('/').unwrap_or(("", file));
        kind == "unlink"
            && name == unit
            && [".wants", ".requires", ".upholds"]
                .iter()
                .any(|suffix| dir.ends_with(suffix))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b";

    #[test]
    fn the_unit_must_name_the_volume() {
        let id: VolumeId = UUID.parse().unwrap();
        for unit in [
            format!("metalk8s-sparse-volume@{UUID}.service"),
            format!("metalk8s-sparse-volume@{}.service", UUID.to_uppercase()),
            "losetup@var-lib-x-6f1c2a8e\\x2d3b4d\\x2d4e5f\\x2d8a9b\\x2d0c1d2e3f4a5b.service".into(),
        ] {
            assert!(refuse_unrelated_unit(&unit, &id).is_ok(), "{unit}");
        }
        for unit in ["dbus.service", "metalk8s-sparse-volume@6f1c2a8e.service"] {
            let said = refuse_unrelated_unit(unit, &id).unwrap_err().to_string();
            assert!(said.contains("does not name the volume's UUID"), "{said}");
        }
    }

    #[test]
    fn only_a_removed_enablement_link_is_a_change() {
        let unit = format!("metalk8s-sparse-volume@{UUID}.service");
        let change = |kind: &str, file: String| (kind.to_string(), file, String::new());
        let wants = change(
            "unlink",
            format!("/etc/systemd/system/multi-user.target.wants/{unit}"),
        );
        assert!(removes_an_enablement_link(&[wants], &unit));
        for other in [
            change("unlink", format!("/etc/systemd/system/{unit}")),
            change(
                "unlink",
                "/etc/systemd/system/multi-user.target.wants/x.service".into(),
            ),
            change(
                "symlink",
                format!("/etc/systemd/system/a.target.wants/{unit}"),
            ),
        ] {
            assert!(
                !removes_an_enablement_link(std::slice::from_ref(&other), &unit),
                "{other:?}"
            );
        }
    }
}
