//! `sparse-volume remove U [--delete-data]`: detach, optionally delete the
//! backing file, unregister. The data goes before the registry entry, so
//! an interrupted remove leaves a registered volume with a missing file
//! (which `check` reports and a repeated remove finishes), never an
//! unowned file nobody would delete.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::commands::report::{Failure, Outcome, Report};
use crate::engine::activate::{
    attached_devices, bring_down_now, refuse_if_in_use, reload_if_reachable,
};
use crate::engine::detach::detach_locked;
use crate::hooks::{self, Crash};
use crate::kernel::files::sync_dir;
use crate::kernel::loop_device::{devices_backed_by, devices_of_file};
use crate::registry::paths::{SystemRoot, KEYS_DIR};
use crate::registry::{NoSuchVolume, Registry, ResolvedBy, Volume};
use crate::volume::backing_file::open_backing_file;
use crate::volume::creating_mark::clear_creating_mark;
use crate::volume::id::VolumeId;
use crate::volume::kept_mark::set_kept_mark;
use crate::volume::probe::probe;

#[derive(Debug, Serialize)]
pub struct RemoveReport {
    pub changed: bool,
    /// Null when nothing answered to the name given: nothing to remove.
    pub uuid: Option<String>,
    pub detached: Vec<PathBuf>,
    pub data_deleted: bool,
    pub path: Option<PathBuf>,
    /// Why there was nothing to remove, when no volume has the name given
    /// (so that a typo shows); null otherwise.
    pub note: Option<String>,
}

impl RemoveReport {
    /// A remove repeated by name finds nothing: done already, as a
    /// repeated remove by UUID is.
    pub fn nothing_answers_to(missing: &NoSuchVolume) -> Self {
        Self {
            changed: false,
            uuid: None,
            detached: Vec::new(),
            data_deleted: false,
            path: None,
            note: Some(missing.to_string()),
        }
    }
}

impl Report for RemoveReport {
    fn human(&self) -> String {
        let Some(uuid) = &self.uuid else {
            return format!(
                "nothing to remove: {}",
                self.note.as_deref().unwrap_or_default()
            );
        };
        if !self.changed {
            return format!("{uuid} is not registered");
        }
        let data = match (&self.path, self.data_deleted) {
            (Some(path), true) => format!("; deleted {}", path.display()),
            (Some(path), false) => format!("; kept its data at {}", path.display()),
            (None, _) => String::new(),
        };
        format!("removed {uuid}{data}")
    }

    fn planned(&self) -> String {
        let (Some(uuid), true) = (&self.uuid, self.changed) else {
            return self.human();
        };
        let data = match (&self.path, self.data_deleted) {
            (Some(path), true) => format!(" and delete {}", path.display()),
            (Some(path), false) => format!("; its data would stay at {}", path.display()),
            (None, _) => String::new(),
        };
        format!("would remove {uuid}{data}")
    }
}

/// With `dry_run`, the checks (the file is this volume's, nothing has the
/// volume mounted) run under the same lock, and nothing changes.
/// `how`: how the caller found the volume, checked again under the lock:
/// a name that moved to another volume meanwhile, or a device that now
/// holds another one, must not remove (or delete the data of) the volume
/// it stood for before.
pub fn remove(
    registry: &Registry,
    id: &VolumeId,
    how: &ResolvedBy,
    delete_data: bool,
    dry_run: bool,
) -> Outcome<RemoveReport> {
    let (named, on_device) = match how {
        ResolvedBy::Name(name) => (Some(name.as_str()), None),
        ResolvedBy::Device(number) => (None, Some(*number)),
        _ => (None, None),
    };
    remove_volume(registry, id, named, on_device, delete_data, dry_run).map_err(Failure::Unchanged)
}

/// [`remove`] as a step of `apply`.
pub fn remove_volume(
    registry: &Registry,
    id: &VolumeId,
    named: Option<&str>,
    on_device: Option<u32>,
    delete_data: bool,
    dry_run: bool,
) -> Result<RemoveReport> {
    let root = registry.root();
    let _lock = registry.lock()?;
    let entry = registry.get(id)?;
    if let (Some(name), Some(volume)) = (named, &entry) {
        if volume.name.as_deref() != Some(name) {
            bail!(
                "volume {id} is named {:?}, not {name:?} (renamed meanwhile?); nothing was removed",
                volume.name.as_deref().unwrap_or_default()
            );
        }
    }
    if let (Some(number), Some(volume)) = (on_device, &entry) {
        if !devices_of_file(&root.host_path(&volume.path))?.contains(&number) {
            bail!(
                "/dev/loop{number} no longer holds volume {id} (detached or bound again meanwhile?); nothing was removed"
            );
        }
    }
    let Some(volume) = entry else {
        return Ok(RemoveReport {
            changed: false,
            uuid: Some(id.to_string()),
            detached: Vec::new(),
            data_deleted: false,
            path: None,
            note: None,
        });
    };
    let host_path = root.host_path(&volume.path);
    if delete_data {
        // Before anything is stopped: an entry pointing at another
        // volume's file must not even detach that volume.
        verify_identity(&volume, &host_path)?;
    }
    if dry_run {
        refuse_if_in_use(registry, id)?;
        return Ok(RemoveReport {
            changed: true,
            uuid: Some(id.to_string()),
            detached: attached_devices(registry, id)?,
            data_deleted: delete_data && host_path.exists(),
            path: Some(volume.path),
            note: None,
        });
    }
    // Refuses (and changes nothing) while the volume is mounted. The
    // unit's ExecStop takes the volume lock itself, so it is not held yet.
    let mut detached = bring_down_now(registry, id)?.detached;
    hooks::crash_at(Crash::RemoveAfterDetach);

    // Held until the entry is gone: attach reads the registry again under
    // this lock, so a start racing with us either finishes before (and is
    // detached below) or finds the volume unregistered.
    let volume_lock = Registry::volume_lock(root, id)?;
    detached.extend(detach_locked(registry, id, &volume_lock)?.devices);

    let directory = host_path
        .parent()
        .context("the backing file has no directory")?;
    let mut data_deleted = false;
    if delete_data {
        data_deleted = delete_backing_file(&volume, &host_path)?;
        sync_dir(directory)?;
        delete_own_key_file(root, &volume)?;
    } else if host_path.exists() {
        // Kept on purpose: it must never look like an interrupted create,
        // nor like a volume whose registry file was lost.
        clear_creating_mark(&host_path)?;
        set_kept_mark(&host_path, id);
    }
    hooks::crash_at(Crash::RemoveBeforeRegistry);

    let entry = root.volume_file(id);
    std::fs::remove_file(&entry).with_context(|| format!("deleting {}", entry.display()))?;
    sync_dir(&root.volumes_dir())?;
    // The generator drops the instance at the next reload; do it now.
    reload_if_reachable()?;
    Ok(RemoveReport {
        changed: true,
        uuid: Some(id.to_string()),
        detached,
        data_deleted,
        path: Some(volume.path),
        note: None,
    })
}

/// Deletes the backing file only if it is this volume's (its content
/// carries the volume UUID) and nothing has it attached; a hand-edited
/// entry pointing at another volume's file must not delete that volume.
/// Returns false when there was no file.
fn delete_backing_file(volume: &Volume, host_path: &Path) -> Result<bool> {
    let Some(file) = verify_identity(volume, host_path)? else {
        return Ok(false);
    };
    let devices = devices_backed_by(host_path)?;
    if let Some(number) = devices.first() {
        bail!(
            "not deleting {}: /dev/loop{number} still attaches it",
            host_path.display()
        );
    }
    // The name must still be the file we verified.
    let opened = file.metadata().context("inspecting the backing file")?;
    let current = std::fs::symlink_metadata(host_path)
        .with_context(|| format!("inspecting {}", host_path.display()))?;
    if (opened.dev(), opened.ino()) != (current.dev(), current.ino()) {
        bail!(
            "not deleting {}: it was replaced while being checked",
            host_path.display()
        );
    }
    std::fs::remove_file(host_path).with_context(|| format!("deleting {}", host_path.display()))?;
    Ok(true)
}

/// With its data gone, the key file `create --encrypt` made for the volume
/// opens nothing: it goes too (the recovery key still opens any copy of
/// the data). A key file of the operator's (`--key-file`) is theirs.
fn delete_own_key_file(root: &SystemRoot, volume: &Volume) -> Result<()> {
    let Some(encryption) = &volume.encryption else {
        return Ok(());
    };
    let own = Path::new(KEYS_DIR).join(format!("{}.key", volume.id));
    if encryption.key_file != own {
        return Ok(());
    }
    let host = root.host_path(&own);
    match std::fs::remove_file(&host) {
        Ok(()) => sync_dir(&root.host_path(KEYS_DIR)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("deleting key file {}", host.display())),
    }
}

/// The backing file, opened, if its content carries the volume UUID;
/// `None` when there is no file; an error naming what it holds otherwise.
fn verify_identity(volume: &Volume, host_path: &Path) -> Result<Option<std::fs::File>> {
    let file = match open_backing_file(host_path, true) {
        Ok(file) => file,
        Err(_) if !host_path.exists() => return Ok(None),
        Err(e) => return Err(e.context("not deleting the backing file")),
    };
    let content = probe(&file).with_context(|| format!("reading {}", host_path.display()))?;
    volume
        .identity()
        .require_in(&content, host_path)
        .context("not deleting it; the volume stays registered")?;
    Ok(Some(file))
}
