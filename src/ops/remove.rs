//! `sparse-volume remove U [--delete-data]`: detach, optionally delete the
//! backing file, unregister. The data goes before the registry entry, so
//! an interrupted remove leaves a registered volume with a missing file
//! (which `check` reports and a repeated remove finishes), never an
//! unowned file nobody would delete.

use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::Serialize;

use super::Report;

use super::activate::{bring_down_now, reload_if_reachable};
use crate::crashpoint;
use crate::fsutil::sync_dir;
use crate::paths::SystemRoot;
use crate::registry::Registry;
use crate::volume_id::VolumeId;

#[derive(Debug, Serialize)]
pub struct RemoveReport {
    pub changed: bool,
    pub uuid: String,
    pub detached: Vec<PathBuf>,
    pub data_deleted: bool,
    pub path: Option<PathBuf>,
}

impl Report for RemoveReport {
    fn human(&self) -> String {
        if !self.changed {
            return format!("{} is not registered", self.uuid);
        }
        let data = match (&self.path, self.data_deleted) {
            (Some(path), true) => format!("; deleted {}", path.display()),
            (Some(path), false) => format!("; kept its data at {}", path.display()),
            (None, _) => String::new(),
        };
        format!("removed {}{data}", self.uuid)
    }
}

pub fn remove(root: &SystemRoot, id: &VolumeId, delete_data: bool) -> Result<RemoveReport> {
    let registry = Registry::open(root.clone())?;
    let _lock = registry.lock()?;
    let Some(volume) = registry.get(id)? else {
        return Ok(RemoveReport {
            changed: false,
            uuid: id.to_string(),
            detached: Vec::new(),
            data_deleted: false,
            path: None,
        });
    };
    // Refuses (and changes nothing) while the volume is mounted.
    let detached = bring_down_now(root, id)?;
    crashpoint::here("remove:after-detach");

    let host_path = root.host_path(&volume.path);
    let directory = host_path
        .parent()
        .context("the backing file has no directory")?;
    let mut data_deleted = false;
    if delete_data {
        match std::fs::remove_file(&host_path) {
            Ok(()) => data_deleted = true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("deleting {}", host_path.display())),
        }
        sync_dir(directory)?;
    }
    crashpoint::here("remove:before-registry");

    let entry = root.volume_file(id);
    std::fs::remove_file(&entry).with_context(|| format!("deleting {}", entry.display()))?;
    sync_dir(&root.volumes_dir())?;
    // The generator drops the instance at the next reload; do it now.
    reload_if_reachable()?;
    Ok(RemoveReport {
        changed: true,
        uuid: id.to_string(),
        detached,
        data_deleted,
        path: Some(volume.path),
    })
}
