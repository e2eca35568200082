//! `sparse-volume status U`: one volume in detail (the same fields as a
//! `list` row).

use anyhow::Result;
use serde::Serialize;

use super::inspect::{inspect, UnitLookup, VolumeInfo};
use super::list::connect_for_reading;
use super::Report;
use crate::capacity::{backing_file_systems, backing_fs_of};
use crate::paths::SystemRoot;
use crate::registry::Registry;
use crate::volume_id::VolumeId;

#[derive(Debug, Serialize)]
pub struct StatusReport {
    /// Always false: status changes nothing.
    pub changed: bool,
    #[serde(flatten)]
    pub volume: VolumeInfo,
    /// Null when systemd answered; otherwise why the unit state is `unknown`.
    pub systemd_error: Option<String>,
}

pub fn status(root: &SystemRoot, id: &VolumeId) -> Result<StatusReport> {
    let registry = Registry::open(root.clone());
    let volume = registry.require(id)?;
    let (systemd, systemd_error) = connect_for_reading(true);
    // Every volume on the same file system counts towards its growth.
    let all: Vec<_> = registry
        .entries()?
        .into_iter()
        .filter_map(|entry| entry.volume.ok())
        .collect();
    let file_systems = backing_file_systems(root, &all);
    Ok(StatusReport {
        changed: false,
        volume: inspect(root, &volume, UnitLookup::ask(systemd.as_ref(), &volume))
            .with_backing_fs(backing_fs_of(root, &file_systems, &volume)),
        systemd_error,
    })
}

impl Report for StatusReport {
    fn human(&self) -> String {
        self.volume.describe()
    }

    fn warnings(&self) -> Vec<String> {
        self.systemd_error
            .iter()
            .map(|e| format!("the unit state is unknown: {e}"))
            .collect()
    }
}
