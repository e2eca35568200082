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
use super::detach::{detach_device, recovery_hint};
use crate::backing::open_backing_file;
use crate::capacity;
use crate::creating_mark::{
    clear_creating_mark, has_creating_mark, is_creating_name, marked_for, CREATING_SUFFIX,
};
use crate::inuse::users_of_loop;
use crate::loopdev::{self, LoopDevice};
use crate::paths::SystemRoot;
use crate::probe::{expected_content, identifies, probe};
use crate::registry::{Registry, Volume};
use crate::size::format_size;
use crate::volume_id::VolumeId;

#[derive(Debug, Serialize)]
pub struct Finding {
    pub kind: &'static str,
    /// `error`, or `warning` for what needs a look but keeps `clean`.
    pub severity: &'static str,
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
                let prefix = match (f.repaired, f.severity) {
                    (true, _) => "repaired ",
                    (false, "warning") => "warning: ",
                    (false, _) => "",
                };
                format!("{prefix}{}: {}", f.kind, f.message)
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
            severity: "error",
            uuid: volume.map(|v| v.id.to_string()),
            path: path.map(Path::to_path_buf),
            message,
            repaired: false,
        });
    }

    fn warn(&mut self, kind: &'static str, path: Option<&Path>, message: String) {
        self.findings.push(Finding {
            kind,
            severity: "warning",
            uuid: None,
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
            severity: "error",
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
    let registry = Registry::open(root.clone());
    // A read-only audit by a user who cannot take the lock is a snapshot
    // that may catch a create in flight; a repair always holds it.
    let _lock = match registry.lock() {
        Ok(lock) => Some(lock),
        Err(e) if !repair && !nix::unistd::geteuid().is_root() => {
            tracing::debug!("auditing without the registry lock: {e:#}");
            None
        }
        Err(e) => return Err(e),
    };
    let mut audit = Audit {
        root,
        repair,
        findings: Vec::new(),
    };

    if let Some(problem) = registry.config_problem() {
        audit.report(
            "invalid-config",
            None,
            Some(&problem.file),
            format!(
                "{problem}; registered volumes still attach, with built-in defaults for the rest"
            ),
        );
    }
    for warning in registry.config_warnings() {
        audit.warn("unknown-key", Some(&warning.file), warning.to_string());
    }

    let mut volumes = Vec::new();
    // Files any registry file names, valid or not, and the default file
    // of every UUID that has a registry file: never leftovers.
    let mut owned = HashSet::new();
    let mut registered = HashSet::new();
    for entry in registry.entries()? {
        if let Some(stem) = entry
            .file
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
        {
            for storage_root in &registry.config().storage_roots {
                if let Ok(meta) = fs::metadata(root.host_path(storage_root.join(&stem))) {
                    owned.insert((meta.dev(), meta.ino()));
                }
            }
            registered.insert(stem);
        }
        for warning in &entry.warnings {
            audit.warn("unknown-key", Some(&entry.file), warning.to_string());
        }
        if let Some(named) = &entry.named_path {
            if let Ok(meta) = fs::metadata(root.host_path(named)) {
                owned.insert((meta.dev(), meta.ino()));
            }
        }
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

    for volume in &volumes {
        audit_volume(&mut audit, volume)?;
    }
    storage_root_leftovers(&mut audit, &registry, &owned, &registered)?;
    overcommitment(&mut audit, &registry, &volumes)?;

    let clean = audit
        .findings
        .iter()
        .all(|f| f.repaired || f.severity == "warning");
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

/// Checks one volume against its file and devices.
fn audit_volume(audit: &mut Audit, volume: &Volume) -> Result<()> {
    let path = audit.root.host_path(&volume.path);
    let meta = match fs::symlink_metadata(&path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            audit.warn(
                "content-not-verified",
                Some(&path),
                format!(
                    "{}: {} cannot be inspected without root",
                    volume.id,
                    path.display()
                ),
            );
            return Ok(());
        }
        Err(_) => {
            let still_held = devices_by_reference(&volume.id)?;
            let hint = match still_held.first() {
                Some(number) => format!(
                    "; /dev/loop{number} still holds its data: {}",
                    recovery_hint(*number)
                ),
                None => String::new(),
            };
            audit.report(
                "missing-backing-file",
                Some(volume),
                Some(&path),
                format!(
                    "{}: backing file {} does not exist{hint}",
                    volume.id,
                    path.display()
                ),
            );
            return Ok(());
        }
    };
    let file = match open_backing_file(&path, true) {
        Ok(file) => Some(file),
        // Data files are root's alone; an unprivileged audit skips the
        // content and still looks at the devices.
        Err(_) if !nix::unistd::geteuid().is_root() => {
            audit.warn(
                "content-not-verified",
                Some(&path),
                format!("{}: reading the content needs root", volume.id),
            );
            None
        }
        Err(e) => {
            audit.report(
                "unsafe-backing-file",
                Some(volume),
                Some(&path),
                format!("{}: {e:#}", volume.id),
            );
            return Ok(());
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
    let content = file.as_ref().map(probe).transpose()?;
    if let Some(content) = content.filter(|c| !identifies(c, &volume.mode, volume.id.uuid())) {
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
        return Ok(());
    }

    // Without root, devices are matched by the path sysfs shows.
    let devices = loopdev::devices_of_file(&path)?;
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
        let root = audit.root.clone();
        audit.repairable(
            "duplicate-loop-devices",
            Some(volume),
            Some(&path),
            format!(
                "{}: {} also attach the file (kept /dev/loop{keep})",
                volume.id,
                names.join(", ")
            ),
            || {
                // Keeps a concurrent attach of this volume away.
                let _lock = Registry::volume_lock(&root, &volume.id)?;
                extra.iter().try_for_each(|&n| detach_device(n))
            },
        );
    } else if devices.is_empty() && volume.enabled {
        let root = audit.root.clone();
        audit.repairable(
            "not-attached",
            Some(volume),
            Some(&path),
            format!("{}: enabled but not attached", volume.id),
            || bring_up_now(&root, &volume.id, false).map(drop),
        );
    }
    Ok(())
}

/// Bound devices whose `lo_file_name` names this volume.
fn devices_by_reference(id: &VolumeId) -> Result<Vec<u32>> {
    let reference = id.loop_reference();
    Ok(loopdev::bound_statuses()?
        .into_iter()
        .filter(|(_, status)| status.reference == reference)
        .map(|(number, _)| number)
        .collect())
}

/// Interrupted creates, and loop devices on storage-root files no volume owns.
fn storage_root_leftovers(
    audit: &mut Audit,
    registry: &Registry,
    owned: &HashSet<(u64, u64)>,
    registered: &HashSet<String>,
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
            // The volume a leftover was made for: if that volume has a
            // registry file at all (even one that does not read), or a
            // device has the file, it is not ours to delete.
            let made_for = marked_for(&path).or_else(|| {
                name.strip_prefix('.')
                    .and_then(|n| n.strip_suffix(CREATING_SUFFIX))
                    .map(str::to_string)
            });
            let claimed = made_for.as_ref().is_some_and(|id| registered.contains(id))
                || !loopdev::devices_of_file(&path)?.is_empty();
            if (is_creating_name(&name) || has_creating_mark(&path)) && claimed {
                audit.report(
                    "unregistered-file",
                    None,
                    Some(&path),
                    format!(
                        "{} is marked as an interrupted create, but its volume is registered or it is attached; left alone (check the registry file)",
                        path.display()
                    ),
                );
            } else if is_creating_name(&name) || has_creating_mark(&path) {
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
        let shown = fs::read_to_string(format!("/sys/block/loop{number}/loop/backing_file"))
            .unwrap_or_default();
        let shown = shown.trim_end();
        let backing = PathBuf::from(shown.trim_end_matches(" (deleted)"));
        if !roots.iter().any(|root| backing.starts_with(root)) {
            continue;
        }
        let deleted = shown.ends_with(" (deleted)")
            || fs::metadata(&backing)
                .map(|m| (m.dev(), m.ino()) != (status.backing_dev, status.backing_inode))
                .unwrap_or(true);
        if deleted {
            // Never repaired: detaching would destroy the last copy.
            audit.report(
                "deleted-backing-file",
                None,
                Some(&backing),
                format!(
                    "/dev/loop{number} attaches {}, which was deleted; {}",
                    backing.display(),
                    recovery_hint(number)
                ),
            );
            continue;
        }
        let root = audit.root.clone();
        let volume_id = VolumeId::from_loop_reference(&status.reference);
        audit.repairable(
            "unowned-loop-device",
            None,
            Some(&backing),
            format!(
                "/dev/loop{number} attaches {}, which no volume owns",
                backing.display()
            ),
            || {
                let _lock = volume_id
                    .map(|id| Registry::volume_lock(&root, &id))
                    .transpose()?;
                detach_device(number)
            },
        );
    }
    Ok(())
}

/// What the volumes on each file system may still grow into, against
/// what that file system can give.
fn overcommitment(audit: &mut Audit, registry: &Registry, volumes: &[Volume]) -> Result<()> {
    if registry.config_problem().is_some() {
        // Reported above; without the settings there is nothing to weigh.
        return Ok(());
    }
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
