//! `sparse-volume list`: every registered volume, one row each, plus one
//! error row per registry file that does not read, and a footer with the
//! free space of each storage root. Exits 1 when there is an error row
//! (the generator skips that volume at boot, so it will not come back),
//! but still shows every volume that reads.

mod cells;
mod families;
mod footer;
pub mod names;
mod table;
mod terminal;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;

use crate::commands::report::{Failure, Outcome, Report};
use crate::engine::capacity::{
    backing_file_systems, backing_fs_of, storage_root_usage, BackingFiles, BackingFs,
    StorageRootUsage,
};
use crate::engine::inspect::{connect_for_reading, inspect, KernelView, UnitLookup, VolumeInfo};
use crate::registry::paths::SystemRoot;
use crate::registry::{Config, Registry, RegistryError, Volume};
use crate::systemd::all_volume_units;
use terminal::Style;

#[derive(Debug, Serialize)]
pub struct ListReport {
    /// Always false: listing changes nothing.
    pub changed: bool,
    pub volumes: Vec<VolumeInfo>,
    /// Registry files that failed to parse or validate.
    pub errors: Vec<RegistryErrorRow>,
    /// Null when systemd answered; otherwise why unit states are `unknown`.
    pub systemd_error: Option<String>,
    /// The file system of each configured storage root that exists: free
    /// space against what its volumes may still grow into.
    pub storage_roots: Vec<StorageRootUsage>,
    /// File systems holding backing files but no configured storage root
    /// (volumes registered before `storage_roots` changed), named by the
    /// first such volume's directory; footer lines like storage roots.
    #[serde(skip)]
    other_file_systems: Vec<StorageRootUsage>,
    /// What deserves a line on stderr about single volumes: their
    /// problems, less what the footer and `systemd_error` already say.
    #[serde(skip)]
    volume_warnings: Vec<String>,
    /// `--wide`: every column, however long the lines get.
    #[serde(skip)]
    wide: bool,
}

#[derive(Debug, Serialize)]
pub struct RegistryErrorRow {
    pub file: String,
    /// 1-based line of the problem, null when it concerns the whole file.
    pub line: Option<usize>,
    pub reason: String,
}

impl From<&RegistryError> for RegistryErrorRow {
    fn from(error: &RegistryError) -> Self {
        Self {
            file: error.file_for_display(),
            line: error.line,
            reason: error.reason.clone(),
        }
    }
}

pub fn list(registry: &Registry, wide: bool) -> Outcome<ListReport> {
    listing(registry, wide).map_err(Failure::Unchanged)
}

/// [`list`]'s report, which `metrics` exposes too.
pub fn listing(registry: &Registry, wide: bool) -> Result<ListReport> {
    let root = registry.root();
    let entries = registry.entries()?;
    let (systemd, mut systemd_error) = connect_for_reading(!entries.is_empty());
    // One call for every unit's state; a systemd that fails it (or a later
    // question) is asked nothing more.
    let mut units = systemd.as_ref().and_then(|systemd| {
        match systemd.loaded_units_matching(&all_volume_units()) {
            Ok(listed) => Some((systemd, listed)),
            Err(e) => {
                systemd_error = Some(format!("{e:#}"));
                None
            }
        }
    });
    let valid: Vec<_> = entries
        .iter()
        .filter_map(|e| e.volume.as_ref().ok().cloned())
        .collect();
    let files = BackingFiles::look(root, &valid);
    let file_systems = backing_file_systems(root, &valid, &files);
    let kernel = KernelView::read(root);
    let mut volumes = Vec::new();
    let mut volume_warnings = Vec::new();
    let mut unreadable = 0;
    let mut errors = Vec::new();
    for entry in &entries {
        match &entry.volume {
            Ok(volume) => {
                let lookup = match &units {
                    Some((systemd, listed)) => UnitLookup::from_listing(systemd, listed, volume),
                    None => UnitLookup::NotAsked,
                };
                let mut said_once = None;
                if let UnitLookup::Failed(error) = &lookup {
                    // Stop asking: one slow answer is enough to wait for.
                    systemd_error = Some(error.clone());
                    said_once = Some(error.clone());
                    units = None;
                }
                let info = inspect(root, volume, &kernel, lookup);
                // Taken before the backing file system is added: a short
                // one is the footer's to say, once, not once per volume.
                unreadable += usize::from(info.needs_root.is_some());
                volume_warnings.extend(
                    info.problems
                        .iter()
                        .filter(|p| {
                            Some(*p) != said_once.as_ref() && Some(*p) != info.needs_root.as_ref()
                        })
                        .map(|p| format!("{}: {p}", info.uuid)),
                );
                volumes.push(info.with_backing_fs(backing_fs_of(&files, &file_systems, volume)));
            }
            Err(error) => errors.push(RegistryErrorRow::from(error)),
        }
    }
    if unreadable > 0 {
        volume_warnings.push(format!(
            "the backing files of {unreadable} volume(s) cannot be read without root, so their ALLOC shows ?; `sudo sparse-volume list` shows everything"
        ));
    }
    let config = registry.config();
    Ok(ListReport {
        changed: false,
        volumes: families::clones_after_origins(volumes),
        errors,
        systemd_error,
        storage_roots: storage_root_usage(root, config, &valid, &files),
        other_file_systems: other_file_systems(root, config, &valid, &files, &file_systems),
        volume_warnings,
        wide,
    })
}

/// The backing file systems of `volumes` that hold no configured storage
/// root, so that the footer accounts for every volume.
fn other_file_systems(
    root: &SystemRoot,
    config: &Config,
    volumes: &[Volume],
    files: &BackingFiles,
    file_systems: &std::collections::BTreeMap<u64, std::sync::Arc<BackingFs>>,
) -> Vec<StorageRootUsage> {
    let roots: Vec<u64> = config
        .storage_roots
        .iter()
        .filter_map(|r| std::fs::metadata(root.host_path(r)).ok())
        .map(|m| m.dev())
        .collect();
    let mut found: Vec<(u64, StorageRootUsage)> = Vec::new();
    for volume in volumes {
        let Some(device) = files.device(volume) else {
            continue;
        };
        if roots.contains(&device) {
            continue;
        }
        if let Some((_, usage)) = found.iter_mut().find(|(d, _)| *d == device) {
            usage.volumes += 1;
            continue;
        }
        let Some(fs) = file_systems.get(&device) else {
            continue;
        };
        found.push((
            device,
            StorageRootUsage {
                storage_root: volume
                    .path
                    .parent()
                    .map_or_else(|| PathBuf::from("/"), Path::to_path_buf),
                also: Vec::new(),
                free: fs.free,
                total: fs.total,
                committed_growth: fs.committed_growth,
                volumes: 1,
                warn_headroom: config.warn_headroom.map_or(0, |t| t.bytes_of(fs.total)),
            },
        ));
    }
    found.into_iter().map(|(_, usage)| usage).collect()
}

impl Report for ListReport {
    fn human(&self) -> String {
        table::render(self, &Style::detect())
    }

    fn warnings(&self) -> Vec<String> {
        let mut warnings = self.volume_warnings.clone();
        if let Some(error) = &self.systemd_error {
            warnings.push(format!("unit states are unknown: {error}"));
        }
        warnings
    }

    fn succeeded(&self) -> bool {
        self.errors.is_empty()
    }
}
