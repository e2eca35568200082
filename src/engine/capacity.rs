//! Capacity accounting for `create` and `resize`.
//!
//! A sparse volume can grow into free space at any time, so free space is
//! not what is left to promise: every registered volume on the same file
//! system may still claim `size - allocated`. A request fits only if those
//! claims plus the request fit in the free space (times the overcommit
//! ratio) minus the host's reserve. Callers hold the registry lock, so
//! concurrent requests see each other's results.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use nix::sys::statvfs::statvfs;
use serde::Serialize;

use crate::kernel::extents::{shared_ranges, union_length};
use crate::registry::paths::{SystemRoot, CONFIG_FILE};
use crate::registry::{Config, Registry, Volume};
use crate::volume::backing_file::open_without_hanging;
use crate::volume::id::VolumeId;
use crate::volume::size::format_size;

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
    /// The volumes counted in `committed` (those that may still grow).
    pub growing: Vec<String>,
}

impl Capacity {
    pub fn headroom(&self) -> u64 {
        self.promisable.saturating_sub(self.committed)
    }
}

/// One look at each volume's backing file (its file system, its
/// allocated bytes), shared by everything that weighs volumes against file
/// systems: a listing of a thousand volumes looked at each file ten times.
/// A snapshot: callers that change files look again.
pub struct BackingFiles {
    facts: HashMap<VolumeId, FileFacts>,
    /// Per file system (`st_dev`): the blocks that clones and their
    /// origins share, counted once. Each sharer counts them as not its
    /// own (a write there takes new space); all of them together take
    /// that much new space at most once more than they hold now, so the
    /// committed growth gives it back once.
    shared_once: HashMap<u64, u64>,
}

#[derive(Clone, Copy)]
struct FileFacts {
    /// `st_dev` of the file, or of its nearest existing ancestor.
    device: Option<u64>,
    /// `st_blocks * 512`; None when the file is missing.
    allocated: Option<u64>,
    /// Bytes of its extents that another file shares (a clone and its
    /// origin after a reflink): allocated, but not its own, since a write
    /// there takes new space.
    shared: u64,
}

impl BackingFiles {
    pub fn look(root: &SystemRoot, volumes: &[Volume]) -> Self {
        // Only files of a clone family can share extents with our files;
        // the extent map of every other file is not asked for.
        let origins: HashSet<VolumeId> = volumes.iter().filter_map(|v| v.origin).collect();
        let mut shared_ranges: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
        let facts = volumes
            .iter()
            .map(|volume| {
                let host_path = root.host_path(&volume.path);
                let facts = match std::fs::metadata(&host_path) {
                    Ok(meta) => {
                        let in_family = volume.origin.is_some() || origins.contains(&volume.id);
                        let ranges = if in_family {
                            shared_ranges_of(&host_path, meta.len())
                        } else {
                            Vec::new()
                        };
                        let shared = ranges.iter().map(|(_, length)| length).sum();
                        shared_ranges.entry(meta.dev()).or_default().extend(ranges);
                        FileFacts {
                            device: Some(meta.dev()),
                            allocated: Some(meta.blocks() * 512),
                            shared,
                        }
                    }
                    Err(_) => FileFacts {
                        device: device_of(&host_path).ok(),
                        allocated: None,
                        shared: 0,
                    },
                };
                (volume.id, facts)
            })
            .collect();
        let shared_once = shared_ranges
            .into_iter()
            .map(|(device, ranges)| (device, union_length(ranges)))
            .collect();
        Self { facts, shared_once }
    }

    /// The file system holding the volume's file (or where it would be).
    pub fn device(&self, volume: &Volume) -> Option<u64> {
        self.facts.get(&volume.id)?.device
    }

    /// Bytes the volume may still take from its file system: what it does
    /// not own of its size (a shared extent is re-taken when written).
    fn growth_potential(&self, volume: &Volume) -> u64 {
        let Some(facts) = self.facts.get(&volume.id) else {
            return volume.size;
        };
        if volume.preallocated {
            return facts.shared;
        }
        match facts.allocated {
            Some(allocated) => volume
                .size
                .saturating_sub(allocated.saturating_sub(facts.shared)),
            // A missing file will be re-created at its full size.
            None => volume.size,
        }
    }
}

/// Shared extents of the file at `path` (none when they cannot be read:
/// a file system without FIEMAP shares nothing).
fn shared_ranges_of(path: &Path, size: u64) -> Vec<(u64, u64)> {
    open_without_hanging(path, true)
        .ok()
        .and_then(|file| shared_ranges(&file, size).ok())
        .unwrap_or_default()
}

/// The file system's identity (`st_dev`) of a path or its nearest
/// existing ancestor.
pub fn device_of(path: &Path) -> Result<u64> {
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
    let (free, total) = free_and_total(directory)?;
    let device = device_of(directory)?;
    let volumes: Vec<Volume> = registry
        .entries()?
        .into_iter()
        .filter_map(|entry| entry.volume.ok())
        .filter(|volume| Some(&volume.id) != excluded)
        .collect();
    let files = BackingFiles::look(registry.root(), &volumes);
    let (committed, growing) = growth_on(&files, device, &volumes);

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
        growing,
    })
}

/// Bytes unprivileged writers can still get (`f_bavail`; root and the
/// loop driver may dip into the file system's reserved blocks beyond it)
/// and the size, of the file system holding `directory`.
fn free_and_total(directory: &Path) -> Result<(u64, u64)> {
    let stats = statvfs(directory)
        .with_context(|| format!("measuring free space of {}", directory.display()))?;
    let fragment = stats.fragment_size();
    Ok((
        stats.blocks_available() * fragment,
        stats.blocks() * fragment,
    ))
}

/// What the `volumes` on file system `device` may still grow into, and
/// which of them may grow.
fn growth_on(files: &BackingFiles, device: u64, volumes: &[Volume]) -> (u64, Vec<String>) {
    let mut committed = 0u64;
    let mut growing = Vec::new();
    for volume in volumes {
        if files.device(volume) != Some(device) {
            continue;
        }
        let growth = files.growth_potential(volume);
        if growth > 0 {
            committed = committed.saturating_add(growth);
            growing.push(volume.id.to_string());
        }
    }
    let shared_once = files.shared_once.get(&device).copied().unwrap_or(0);
    (committed.saturating_sub(shared_once), growing)
}

/// The file system under some backing files, against what their volumes
/// may still grow into: `list`, `status` and `check` show it, because a
/// file system that fills up turns a consumer's writes into I/O errors.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BackingFs {
    /// Where it was measured: the directory of the first volume's file.
    pub directory: PathBuf,
    /// Free bytes (for unprivileged writers: `f_bavail`).
    pub free: u64,
    pub total: u64,
    /// Sum of `size - allocated` of its sparse volumes.
    pub committed_growth: u64,
    /// The volumes that may still grow (UUIDs). Not in JSON: every
    /// volume's report carries this record, and a list of all the others
    /// in each made `list --json` grow with the square of the volumes
    /// (40 MB at 1,000); the `overcommitted` finding names them in `uuids`.
    #[serde(skip)]
    pub volumes: Vec<String>,
    /// `committed_growth > free`: if the volumes grow, writes inside them
    /// fail.
    pub short: bool,
}

/// The backing file systems of `volumes`, keyed by `st_dev`. A volume
/// whose file system cannot be measured has no entry.
pub fn backing_file_systems(
    root: &SystemRoot,
    volumes: &[Volume],
    files: &BackingFiles,
) -> BTreeMap<u64, Arc<BackingFs>> {
    let mut found = BTreeMap::new();
    for volume in volumes {
        let Some(device) = files.device(volume) else {
            continue;
        };
        if found.contains_key(&device) {
            continue;
        }
        let host_path = root.host_path(&volume.path);
        let Some(directory) = host_path
            .ancestors()
            .skip(1)
            .find(|p| p.is_dir())
            .map(Path::to_path_buf)
        else {
            continue;
        };
        let Ok((free, total)) = free_and_total(&directory) else {
            continue;
        };
        let (committed_growth, growing) = growth_on(files, device, volumes);
        found.insert(
            device,
            Arc::new(BackingFs {
                directory,
                free,
                total,
                committed_growth,
                volumes: growing,
                short: committed_growth > free,
            }),
        );
    }
    found
}

/// The entry of [`backing_file_systems`] that holds `volume`'s file.
pub fn backing_fs_of<'a>(
    files: &BackingFiles,
    file_systems: &'a BTreeMap<u64, Arc<BackingFs>>,
    volume: &Volume,
) -> Option<&'a Arc<BackingFs>> {
    file_systems.get(&files.device(volume)?)
}

fn reserve_bytes(config: &Config, total: u64) -> u64 {
    config.reserve.bytes_of(total)
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

/// One backing file system as the operator configured it: named by its
/// storage root, with what its volumes may still grow into and the
/// `warn_headroom` threshold. `metrics`, `check` and `list` show this.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StorageRootUsage {
    /// The storage root (logical path); when several share one file
    /// system, the first of them in `storage_roots`.
    pub storage_root: PathBuf,
    /// The other storage roots on the same file system.
    pub also: Vec<PathBuf>,
    /// Free bytes for unprivileged writers (`f_bavail`).
    pub free: u64,
    pub total: u64,
    /// Sum of `size - allocated` of its sparse volumes.
    pub committed_growth: u64,
    /// Registered volumes whose backing file is on it.
    pub volumes: usize,
    /// `warn_headroom` in bytes for this file system (0 when unset).
    pub warn_headroom: u64,
}

impl StorageRootUsage {
    /// Free space left once every volume has grown to its size; negative
    /// when the volumes can grow beyond the free space.
    pub fn headroom(&self) -> i64 {
        let headroom = i128::from(self.free) - i128::from(self.committed_growth);
        headroom.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
    }

    /// Below the operator's threshold (or below zero when none is set).
    pub fn under_pressure(&self) -> bool {
        i128::from(self.headroom()) < i128::from(self.warn_headroom)
    }

    /// One sentence with the numbers an operator acts on (`check`'s
    /// finding and the metrics timer's journal line).
    pub fn pressure_message(&self) -> String {
        let headroom = self.headroom();
        let left = if headroom < 0 {
            format!("{} short", format_size(headroom.unsigned_abs()))
        } else {
            format!("{} left", format_size(headroom.unsigned_abs()))
        };
        format!(
            "storage root {} is short of space: {} ({} bytes) free, its volumes may still grow by {} ({} bytes), {} once they do (warn_headroom {})",
            self.storage_root.display(),
            format_size(self.free),
            self.free,
            format_size(self.committed_growth),
            self.committed_growth,
            left,
            format_size(self.warn_headroom)
        )
    }
}

/// The file systems of the configured storage roots that exist, in
/// `storage_roots` order, each once.
pub fn storage_root_usage(
    root: &SystemRoot,
    config: &Config,
    volumes: &[Volume],
    files: &BackingFiles,
) -> Vec<StorageRootUsage> {
    let mut found: Vec<(u64, StorageRootUsage)> = Vec::new();
    for storage_root in &config.storage_roots {
        let host = root.host_path(storage_root);
        let Ok(device) = std::fs::metadata(&host).map(|m| m.dev()) else {
            continue;
        };
        if let Some((_, usage)) = found.iter_mut().find(|(d, _)| *d == device) {
            usage.also.push(storage_root.clone());
            continue;
        }
        let Ok((free, total)) = free_and_total(&host) else {
            continue;
        };
        let (committed_growth, _) = growth_on(files, device, volumes);
        let on_it = volumes
            .iter()
            .filter(|v| files.device(v) == Some(device))
            .count();
        found.push((
            device,
            StorageRootUsage {
                storage_root: storage_root.clone(),
                also: Vec::new(),
                free,
                total,
                committed_growth,
                volumes: on_it,
                warn_headroom: config.warn_headroom.map_or(0, |t| t.bytes_of(total)),
            },
        ));
    }
    found.into_iter().map(|(_, usage)| usage).collect()
}
