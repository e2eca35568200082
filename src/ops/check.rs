//! `sparse-volume check [--repair]`: audit the registry against the files
//! and loop devices, and with `--repair` fix what is safe to fix. Data is
//! never deleted here except our own never-registered temporaries.

use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;

use super::Report;

use super::activate::bring_up_now;
use super::create::{clear_creating_mark, has_creating_mark, CREATING_SUFFIX};
use super::detach::detach_device;
use crate::backing::open_backing_file;
use crate::capacity;
use crate::inuse::users_of_loop;
use crate::loopdev::{self, LoopDevice};
use crate::paths::SystemRoot;
use crate::probe::{expected_content, identifies, probe};
use crate::registry::{Registry, Volume};
use crate::size::format_size;

#[derive(Debug, Serialize)]
pub struct Finding {
    pub kind: &'static str,
    pub uuid: Option<String>,
    pub path: Option<PathBuf>,
    pub message: String,
    pub repaired: bool,
}

#[derive(Debug, Serialize)]
pub struct CheckReport {
    pub changed: bool,
    /// True when nothing is left to report after repairs.
    pub clean: bool,
    pub findings: Vec<Finding>,
}

impl Report for CheckReport {
    fn succeeded(&self) -> bool {
        self.clean
    }

    fn human(&self) -> String {
        if self.findings.is_empty() {
            return "no problems found".to_string();
        }
        self.findings
            .iter()
            .map(|f| {
                format!(
                    "{}{}: {}",
                    if f.repaired { "repaired " } else { "" },
                    f.kind,
                    f.message
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

struct Audit<'a> {
    root: &'a SystemRoot,
    repair: bool,
    findings: Vec<Finding>,
}

impl Audit<'_> {
    fn report(
        &mut self,
        kind: &'static str,
        volume: Option<&Volume>,
        path: Option<&Path>,
        message: String,
    ) {
        self.findings.push(Finding {
            kind,
            uuid: volume.map(|v| v.id.to_string()),
            path: path.map(Path::to_path_buf),
            message,
            repaired: false,
        });
    }

    /// Reports, and with `--repair` runs `fix`; the finding says how it went.
    fn repairable(
        &mut self,
        kind: &'static str,
        volume: Option<&Volume>,
        path: Option<&Path>,
        message: String,
        fix: impl FnOnce() -> Result<()>,
    ) {
        let mut finding = Finding {
            kind,
            uuid: volume.map(|v| v.id.to_string()),
            path: path.map(Path::to_path_buf),
            message,
            repaired: false,
        };
        if self.repair {
            match fix() {
                Ok(()) => finding.repaired = true,
                Err(e) => finding
                    .message
                    .push_str(&format!(" (repair failed: {e:#})")),
            }
        }
        self.findings.push(finding);
    }
}

pub fn check(root: &SystemRoot, repair: bool) -> Result<CheckReport> {
    let registry = Registry::open(root.clone())?;
    let _lock = registry.lock()?;
    let mut audit = Audit {
        root,
        repair,
        findings: Vec::new(),
    };

    let mut volumes = Vec::new();
    for entry in registry.entries()? {
        match entry.volume {
            Ok(volume) => volumes.push(volume),
            Err(error) => audit.report(
                "invalid-registry-file",
                None,
                Some(&entry.file),
                error.to_string(),
            ),
        }
    }
    registry_temporaries(&mut audit);

    let mut owned = HashSet::new();
    for volume in &volumes {
        if let Some(identity) = audit_volume(&mut audit, volume)? {
            owned.insert(identity);
        }
    }
    storage_root_leftovers(&mut audit, &registry, &owned)?;
    overcommitment(&mut audit, &registry, &volumes)?;

    let clean = audit.findings.iter().all(|f| f.repaired);
    Ok(CheckReport {
        changed: audit.findings.iter().any(|f| f.repaired),
        clean,
        findings: audit.findings,
    })
}

/// Hidden temporaries of interrupted atomic registry writes.
fn registry_temporaries(audit: &mut Audit) {
    let dir = audit.root.volumes_dir();
    for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') && name.ends_with(".tmp") {
            let path = entry.path();
            audit.repairable(
                "registry-temporary",
                None,
                Some(&path),
                format!(
                    "{} is left over from an interrupted registry write",
                    path.display()
                ),
                || fs::remove_file(&path).map_err(Into::into),
            );
        }
    }
}

/// Checks one volume; returns its backing file's (device, inode).
fn audit_volume(audit: &mut Audit, volume: &Volume) -> Result<Option<(u64, u64)>> {
    let path = audit.root.host_path(&volume.path);
    let meta = match fs::symlink_metadata(&path) {
        Ok(meta) => meta,
        Err(_) => {
            audit.report(
                "missing-backing-file",
                Some(volume),
                Some(&path),
                format!(
                    "{}: backing file {} does not exist",
                    volume.id,
                    path.display()
                ),
            );
            return Ok(None);
        }
    };
    let file = match open_backing_file(&path, true) {
        Ok(file) => file,
        Err(e) => {
            audit.report(
                "unsafe-backing-file",
                Some(volume),
                Some(&path),
                format!("{}: {e:#}", volume.id),
            );
            return Ok(Some((meta.dev(), meta.ino())));
        }
    };
    if meta.len() != volume.size {
        let hint = if meta.len() > volume.size {
            "an interrupted resize; run `sparse-volume resize` again to finish it"
        } else {
            "the file shrank; data beyond its end is gone"
        };
        audit.report(
            "size-mismatch",
            Some(volume),
            Some(&path),
            format!(
                "{}: the file has {} bytes, the registry records {} ({hint})",
                volume.id,
                meta.len(),
                volume.size
            ),
        );
    }
    if has_creating_mark(&path) {
        audit.repairable(
            "stale-create-mark",
            Some(volume),
            Some(&path),
            format!(
                "{}: still marked as being created although it is registered",
                volume.id
            ),
            || clear_creating_mark(&path),
        );
    }
    let content = probe(&file)?;
    if !identifies(&content, &volume.mode, volume.id.uuid()) {
        audit.report(
            "content-mismatch",
            Some(volume),
            Some(&path),
            format!(
                "{}: {} holds {}, not {}",
                volume.id,
                path.display(),
                content.describe(),
                expected_content(&volume.mode, volume.id.uuid())
            ),
        );
        return Ok(Some((meta.dev(), meta.ino())));
    }

    let devices = loopdev::devices_backed_by(&path)?;
    if devices.len() > 1 {
        // Keep the one in use (or the first); drop the others.
        let keep = devices
            .iter()
            .copied()
            .find(|&n| !users_of_loop(n).is_empty())
            .unwrap_or(devices[0]);
        let extra: Vec<u32> = devices.iter().copied().filter(|&n| n != keep).collect();
        let names: Vec<String> = extra
            .iter()
            .map(|&n| LoopDevice::path_of(n).display().to_string())
            .collect();
        audit.repairable(
            "duplicate-loop-devices",
            Some(volume),
            Some(&path),
            format!(
                "{}: {} also attach the file (kept /dev/loop{keep})",
                volume.id,
                names.join(", ")
            ),
            || extra.iter().try_for_each(|&n| detach_device(n)),
        );
    } else if devices.is_empty() && volume.enabled {
        let root = audit.root.clone();
        audit.repairable(
            "not-attached",
            Some(volume),
            Some(&path),
            format!("{}: enabled but not attached", volume.id),
            || bring_up_now(&root, &volume.id).map(drop),
        );
    }
    Ok(Some((meta.dev(), meta.ino())))
}

/// Interrupted creates, and loop devices on storage-root files no volume owns.
fn storage_root_leftovers(
    audit: &mut Audit,
    registry: &Registry,
    owned: &HashSet<(u64, u64)>,
) -> Result<()> {
    let roots: Vec<PathBuf> = registry
        .config()
        .storage_roots
        .iter()
        .map(|r| audit.root.host_path(r))
        .collect();
    for root in &roots {
        for entry in fs::read_dir(root).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            let Ok(meta) = fs::symlink_metadata(&path) else {
                continue;
            };
            if !meta.is_file() || owned.contains(&(meta.dev(), meta.ino())) {
                continue;
            }
            if (name.starts_with('.') && name.ends_with(CREATING_SUFFIX))
                || has_creating_mark(&path)
            {
                audit.repairable(
                    "interrupted-create",
                    None,
                    Some(&path),
                    format!("{} is left over from an interrupted create", path.display()),
                    || fs::remove_file(&path).map_err(Into::into),
                );
            } else if !name.starts_with('.') {
                audit.report(
                    "unregistered-file",
                    None,
                    Some(&path),
                    format!(
                        "{} is in a storage root but no volume owns it (register it, or delete it if it is not needed)",
                        path.display()
                    ),
                );
            }
        }
    }
    for (number, status) in loopdev::bound_statuses()? {
        if owned.contains(&(status.backing_dev, status.backing_inode)) {
            continue;
        }
        let backing = fs::read_to_string(format!("/sys/block/loop{number}/loop/backing_file"))
            .unwrap_or_default();
        let backing = PathBuf::from(backing.trim_end().trim_end_matches(" (deleted)"));
        if !roots.iter().any(|root| backing.starts_with(root)) {
            continue;
        }
        audit.repairable(
            "unowned-loop-device",
            None,
            Some(&backing),
            format!(
                "/dev/loop{number} attaches {}, which no volume owns",
                backing.display()
            ),
            || detach_device(number),
        );
    }
    Ok(())
}

/// What the volumes on each file system may still grow into, against
/// what that file system can give.
fn overcommitment(audit: &mut Audit, registry: &Registry, volumes: &[Volume]) -> Result<()> {
    let mut seen = HashSet::new();
    for volume in volumes {
        let path = audit.root.host_path(&volume.path);
        let Some(directory) = path.parent() else {
            continue;
        };
        let Ok(meta) = fs::metadata(directory) else {
            continue;
        };
        if !seen.insert(meta.dev()) {
            continue;
        }
        let capacity = capacity::measure(registry, directory, None)?;
        if capacity.committed > capacity.promisable {
            audit.report(
                "overcommitted",
                None,
                Some(directory),
                format!(
                    "volumes on the file system of {} may still grow by {}, but only {} can be promised ({} free, {} reserved)",
                    directory.display(),
                    format_size(capacity.committed),
                    format_size(capacity.promisable),
                    format_size(capacity.free),
                    format_size(capacity.reserve)
                ),
            );
        }
    }
    Ok(())
}
