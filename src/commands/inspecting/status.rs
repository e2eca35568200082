//! `sparse-volume status U`: one volume in detail (the same fields as a
//! `list` row).

use anyhow::Result;
use serde::Serialize;

use crate::commands::report::{Failure, Outcome, Report};
use crate::engine::capacity::{backing_file_systems, backing_fs_of, BackingFiles};
use crate::engine::inspect::connect_for_reading;
use crate::engine::inspect::{inspect, KernelView, UnitLookup, VolumeInfo};
use crate::registry::Registry;
use crate::volume::id::VolumeId;

#[derive(Debug, Serialize)]
pub struct StatusReport {
    /// Always false: status changes nothing.
    pub changed: bool,
    #[serde(flatten)]
    pub volume: VolumeInfo,
    /// Null when systemd answered; otherwise why the unit state is `unknown`.
    pub systemd_error: Option<String>,
}

pub fn status(registry: &Registry, id: &VolumeId) -> Outcome<StatusReport> {
    inspect_one(registry, id).map_err(Failure::Unchanged)
}

fn inspect_one(registry: &Registry, id: &VolumeId) -> Result<StatusReport> {
    let root = registry.root();
    let volume = registry.require(id)?;
    let (systemd, systemd_error) = connect_for_reading(true);
    // Every volume on the same file system counts towards its growth.
    let all: Vec<_> = registry
        .entries()?
        .into_iter()
        .filter_map(|entry| entry.volume.ok())
        .collect();
    let files = BackingFiles::look(root, &all);
    let file_systems = backing_file_systems(root, &all, &files);
    Ok(StatusReport {
        changed: false,
        volume: inspect(
            root,
            &volume,
            &KernelView::read(root),
            UnitLookup::ask(systemd.as_ref(), &volume),
        )
        .with_backing_fs(backing_fs_of(&files, &file_systems, &volume)),
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
