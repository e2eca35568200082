//! Capacity accounting for `create` and `resize`.
//!
//! A sparse volume can grow into free space at any time, so free space is
//! not what is left to promise: every registered volume on the same file
//! system may still claim `size - allocated`. A request fits only if those
//! claims plus the request fit in the free space (times the overcommit
//! ratio) minus the host's reserve. Callers hold the registry lock, so
//! concurrent requests see each other's results.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use nix::sys::statvfs::statvfs;
use serde::Serialize;

use crate::paths::CONFIG_FILE;
use crate::registry::{Config, Registry, Reserve, Volume};
use crate::size::format_size;
use crate::volume_id::VolumeId;

#[derive(Debug, Clone, Serialize)]
pub struct Capacity {
    /// Bytes the file system can still hand out to unprivileged writers.
    pub free: u64,
    pub total: u64,
    /// What registered volumes on this file system may still grow into.
    pub committed: u64,
    pub reserve: u64,
    /// `free * overcommit_ratio - reserve`.
    pub promisable: u64,
    pub overcommit_ratio: f64,
}

impl Capacity {
    pub fn headroom(&self) -> u64 {
        self.promisable.saturating_sub(self.committed)
    }
}

/// Bytes the volume may still take from its file system.
pub fn growth_potential(volume: &Volume, host_path: &Path) -> u64 {
    if volume.preallocated {
        return 0;
    }
    match std::fs::metadata(host_path) {
        Ok(meta) => volume.size.saturating_sub(meta.blocks() * 512),
        // A missing file will be re-created at its full size.
        Err(_) => volume.size,
    }
}

/// The file system's identity (`st_dev`) of a path or its nearest
/// existing ancestor.
fn device_of(path: &Path) -> Result<u64> {
    let mut current = Some(path);
    while let Some(candidate) = current {
        if let Ok(meta) = std::fs::metadata(candidate) {
            return Ok(meta.dev());
        }
        current = candidate.parent();
    }
    bail!("no part of {} exists", path.display())
}

/// The capacity of the file system holding `directory` (a host path),
/// not counting the volume `excluded` (the one being resized, whose own
/// potential the caller accounts for).
pub fn measure(
    registry: &Registry,
    directory: &Path,
    excluded: Option<&VolumeId>,
) -> Result<Capacity> {
    let stats = statvfs(directory)
        .with_context(|| format!("measuring free space of {}", directory.display()))?;
    let fragment = stats.fragment_size();
    let free = stats.blocks_available() * fragment;
    let total = stats.blocks() * fragment;
    let device = device_of(directory)?;

    let mut committed = 0u64;
    for entry in registry.entries()? {
        let Ok(volume) = entry.volume else { continue };
        if Some(&volume.id) == excluded {
            continue;
        }
        let host_path: PathBuf = registry.root().host_path(&volume.path);
        if device_of(&host_path).ok() == Some(device) {
            committed = committed.saturating_add(growth_potential(&volume, &host_path));
        }
    }

    // A broken config.toml must not silently mean "no reserve".
    let config = registry.provisioning_config()?;
    let reserve = reserve_bytes(config, total);
    let promisable = ((free as f64) * config.overcommit_ratio) as u64;
    Ok(Capacity {
        free,
        total,
        committed,
        reserve,
        promisable: promisable.saturating_sub(reserve),
        overcommit_ratio: config.overcommit_ratio,
    })
}

fn reserve_bytes(config: &Config, total: u64) -> u64 {
    match config.reserve {
        Reserve::Bytes(bytes) => bytes,
        Reserve::Percent(percent) => ((total as f64) * percent / 100.0) as u64,
    }
}

/// Fails with the numbers an operator needs when `request` does not fit.
pub fn ensure_fits(capacity: &Capacity, request: u64, directory: &Path) -> Result<()> {
    if request <= capacity.headroom() {
        return Ok(());
    }
    bail!(
        "not enough space on the file system of {}: asked for {}, {} already committed to other volumes, {} free ({} reserved for the host); to allow more, raise overcommit_ratio (now {}) or lower reserve in {}",
        directory.display(),
        format_size(request),
        format_size(capacity.committed),
        format_size(capacity.free),
        format_size(capacity.reserve),
        capacity.overcommit_ratio,
        CONFIG_FILE,
    )
}
