//! A volume taken over from another unit (`replaces_unit`): that unit must
//! be masked and inactive, or its ExecStop can still detach the volume's
//! device under its consumers and its ExecStart bind a second device. A
//! take-over interrupted before its live steps leaves exactly that until
//! the next boot; the repair finishes them.

use std::path::Path;

use crate::commands::inspecting::check::Audit;
use crate::engine::take_over::{take_over_now, MASKED};
use crate::registry::Volume;
use crate::systemd::kernel_cmdline::Skip;
use crate::systemd::Systemd;

pub(super) fn audit_replaced_unit(audit: &mut Audit, volume: &Volume, path: &Path) {
    let Some(unit) = volume.replaces_unit.as_deref() else {
        return;
    };
    // Without systemd nothing runs the old unit; the generator masks it
    // from the first boot on.
    let Ok(systemd) = Systemd::connect() else {
        return;
    };
    let (Ok(load_state), Ok(state)) = (systemd.load_state(unit), systemd.unit_state(unit)) else {
        return;
    };
    // With sparse_volume=off the generator wrote no masks in this boot:
    // only a running old unit is wrong then (the take-over disabled it).
    let masks_written = !matches!(audit.this_boot.skips(&volume.id), Some(Skip::Off));
    if state.is_inactive() && (load_state == MASKED || !masks_written) {
        return;
    }
    let why = if load_state == MASKED {
        format!("is {} although masked", state.active_state)
    } else {
        format!(
            "is not masked (load state {load_state}, {}): its ExecStop can detach the device under the consumers, and its start bind a second one",
            state.active_state
        )
    };
    let registry = audit.registry;
    let id = volume.id;
    let unit = unit.to_string();
    audit.repairable(
        "replaced-unit-not-retired",
        Some(volume),
        Some(path),
        format!(
            "{}: {unit}, which it was taken over from, {why}; `--repair` finishes the take-over (as `sparse-volume register --replaces-unit` again)",
            volume.id
        ),
        || take_over_now(registry, Some(&systemd), &id, &unit, false).map(|_| ()),
    );
}
