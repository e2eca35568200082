//! `sparse-volume register`: adopt an existing backing file (for example
//! one an older config-management setup made) after checking its content
//! carries the volume UUID.

use std::path::PathBuf;

use anyhow::{bail, Result};
use serde::Serialize;

use super::Report;

use crate::backing::open_backing_file;
use crate::paths::SystemRoot;
use crate::probe::{identifies, probe};
use crate::registry::{check_path, check_size, Mode, Registry, Volume};
use crate::volume_id::VolumeId;

#[derive(Debug, Clone)]
pub struct RegisterRequest {
    pub uuid: VolumeId,
    pub path: PathBuf,
    pub mode: Mode,
    pub name: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct RegisterReport {
    pub changed: bool,
    pub uuid: String,
    pub path: PathBuf,
    pub size: u64,
    pub mode: &'static str,
}

impl Report for RegisterReport {
    fn human(&self) -> String {
        if self.changed {
            format!(
                "registered {} ({} bytes at {})",
                self.uuid,
                self.size,
                self.path.display()
            )
        } else {
            format!(
                "{} is already registered for {}",
                self.uuid,
                self.path.display()
            )
        }
    }
}

pub fn register(root: &SystemRoot, request: &RegisterRequest) -> Result<RegisterReport> {
    let registry = Registry::open(root.clone());
    let config = registry.provisioning_config()?;
    check_path(&request.path, config).map_err(anyhow::Error::msg)?;
    let id = request.uuid;
    let report = |changed, volume: &Volume| RegisterReport {
        changed,
        uuid: id.to_string(),
        path: volume.path.clone(),
        size: volume.size,
        mode: volume.mode.name(),
    };

    let _lock = registry.lock()?;
    if let Some(existing) = registry.get(&id)? {
        if existing.path == request.path && existing.mode.name() == request.mode.name() {
            return Ok(report(false, &existing));
        }
        bail!(
            "the volume is already registered as a {} volume at {}",
            existing.mode.name(),
            existing.path.display()
        );
    }

    let host_path = root.host_path(&request.path);
    let file = open_backing_file(&host_path, true)?;
    let size = file.metadata()?.len();
    check_size(size)
        .map_err(|reason| anyhow::anyhow!("backing file {}: {reason}", host_path.display()))?;
    let content = probe(&file)?;
    let carries_uuid = identifies(&content, &request.mode, id.uuid());
    if !carries_uuid {
        bail!(
            "backing file {} holds {}, which does not carry the volume UUID",
            host_path.display(),
            content.describe()
        );
    }

    let volume = Volume {
        id,
        path: request.path.clone(),
        size,
        mode: request.mode.clone(),
        enabled: true,
        read_only: false,
        direct_io: config.direct_io,
        preallocated: false,
        name: request.name.clone(),
        sector_size: crate::registry::DEFAULT_SECTOR_SIZE,
    };
    volume.validate()?;
    registry.put(&volume)?;
    Ok(report(true, &volume))
}
