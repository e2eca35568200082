//! Bringing a volume up or down "now" from provisioning commands: through
//! systemd when it is reachable, so the unit's state tells the truth, and
//! directly (attach/detach) on systems without it.

use anyhow::{bail, Result};

use super::attach::attach;
use super::detach::{detach, find_devices};
use super::start::{bring_down, bring_up};
use crate::inuse::users_of_loop;
use crate::loopdev::{devices_backed_by, LoopDevice};
use crate::paths::SystemRoot;
use crate::registry::Registry;
use crate::systemd::{unit_name, Systemd};
use crate::volume_id::VolumeId;

pub struct Activation {
    pub changed: bool,
    pub device: Option<std::path::PathBuf>,
    pub how: String,
}

/// Starts the volume's unit after a reload (so the generator has seen the
/// new registry entry), or attaches directly when systemd is not there.
pub fn bring_up_now(root: &SystemRoot, id: &VolumeId) -> Result<Activation> {
    match Systemd::connect() {
        Ok(systemd) => {
            systemd.reload()?;
            let unit = unit_name(id);
            let outcome = bring_up(&systemd, &unit)?;
            Ok(Activation {
                changed: outcome.changed,
                device: attached_device(root, id),
                how: format!("started {unit}"),
            })
        }
        Err(reason) => {
            let attached = attach(root, id)?;
            Ok(Activation {
                changed: attached.changed,
                device: Some(attached.device),
                how: format!("attached directly ({reason:#})"),
            })
        }
    }
}

/// Stops the unit when systemd is there, then makes sure the device is
/// gone (a failed unit never ran its ExecStop). Returns the detached
/// devices.
pub fn bring_down_now(root: &SystemRoot, id: &VolumeId) -> Result<Vec<std::path::PathBuf>> {
    // Refuse before stopping anything: a stop whose detach then fails
    // would leave a failed unit and a device still in use.
    let (devices, _) = find_devices(root, id)?;
    for number in devices {
        let users = users_of_loop(number);
        if !users.is_empty() {
            bail!(
                "{} is in use: {}; unmount it first",
                LoopDevice::path_of(number).display(),
                users.join("; ")
            );
        }
    }
    if let Ok(systemd) = Systemd::connect() {
        bring_down(&systemd, &unit_name(id))?;
    }
    Ok(detach(root, id)?.devices)
}

/// Tells systemd the registry changed, when systemd is there to listen.
pub fn reload_if_reachable() -> Result<()> {
    match Systemd::connect() {
        Ok(systemd) => systemd.reload(),
        Err(_) => Ok(()),
    }
}

fn attached_device(root: &SystemRoot, id: &VolumeId) -> Option<std::path::PathBuf> {
    let registry = Registry::open(root.clone()).ok()?;
    let volume = registry.get(id).ok()??;
    let number = *devices_backed_by(&root.host_path(&volume.path))
        .ok()?
        .first()?;
    Some(LoopDevice::path_of(number))
}
