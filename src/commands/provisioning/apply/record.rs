//! What `apply` shows of a volume before and after: its registry record,
//! and the device and unit it runs as (what `--diff` shows).

use std::path::PathBuf;

use anyhow::Result;
use serde::Serialize;

use crate::engine::activate::attached_devices;
use crate::engine::inspect::UNKNOWN;
use crate::registry::Registry;
use crate::registry::Volume;
use crate::systemd::{unit_name, Systemd};

/// A volume's registry record and what runs of it: what `--diff` shows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VolumeRecord {
    pub uuid: Option<String>,
    pub name: Option<String>,
    pub path: PathBuf,
    pub size: u64,
    pub mode: &'static str,
    pub fs_type: Option<String>,
    pub enabled: bool,
    pub read_only: bool,
    pub preallocated: bool,
    pub sector_size: u32,
    /// LUKS2 inside the backing file.
    pub encrypted: bool,
    /// The key file that unlocks an encrypted volume (its path; a key
    /// itself is never part of a record).
    pub key_file: Option<PathBuf>,
    /// The loop device the backing file is attached to.
    pub device: Option<PathBuf>,
    /// systemd's ActiveState of the unit, `unknown` without systemd.
    pub active_state: String,
}

pub fn record(
    registry: &Registry,
    systemd: Option<&Systemd>,
    volume: &Volume,
) -> Result<VolumeRecord> {
    let mut record = record_without_runtime(volume);
    record.device = attached_devices(registry, &volume.id)?.into_iter().next();
    record.active_state = match systemd {
        Some(systemd) => systemd
            .unit_state(&unit_name(&volume.id))
            .map_or_else(|_| UNKNOWN.to_string(), |state| state.active_state),
        None => UNKNOWN.to_string(),
    };
    Ok(record)
}

pub fn record_without_runtime(volume: &Volume) -> VolumeRecord {
    VolumeRecord {
        uuid: Some(volume.id.to_string()),
        name: volume.name.clone(),
        path: volume.path.clone(),
        size: volume.size,
        mode: volume.mode.name(),
        fs_type: volume.mode.fs_type_name(),
        enabled: volume.enabled,
        read_only: volume.read_only,
        preallocated: volume.preallocated,
        sector_size: volume.sector_size,
        encrypted: volume.encryption.is_some(),
        key_file: volume.encryption.as_ref().map(|e| e.key_file.clone()),
        device: None,
        active_state: UNKNOWN.to_string(),
    }
}
