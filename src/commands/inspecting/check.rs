//! `sparse-volume check [--repair]`: audit the registry against the files
//! and loop devices, and with `--repair` fix what is safe to fix. Data is
//! never deleted here except our own never-registered temporaries.

use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;

use crate::commands::report::{Failure, Outcome, Report};
use crate::engine::activate::bring_up_now;
use crate::engine::attach::{unfit_message, unfit_reasons};
use crate::engine::boot_verdict::{not_attached, NotAttached, ThisBoot, UnitSaid};
use crate::engine::capacity::{self, BackingFs};
use crate::engine::detach::{detach_device_or_leave_it, recovery_hint};
use crate::hooks::{self, Stop};
use crate::kernel::fs_health::MountTable;
use crate::kernel::holders::users_of_loop;
use crate::kernel::loop_device::{self, LoopDevice};
use crate::registry::paths::SystemRoot;
use crate::registry::{Registry, Volume};
use crate::systemd::{unit_name, Systemd};
use crate::volume::backing_file::open_backing_file;
use crate::volume::creating_mark::{
    clear_creating_mark, has_creating_mark, is_creating_name, marked_for, CREATING_SUFFIX,
};
use crate::volume::gpt_layout;
use crate::volume::id::VolumeId;
use crate::volume::kept_mark::kept_for;
use crate::volume::probe::probe;
use crate::volume::size::format_size;
use crate::volume::spec::Mode;

mod encryption;
mod file_system;
mod last_check;
mod leftover_nodes;
mod preallocation;
mod replaced_unit;

pub use last_check::LastCheck;

#[derive(Debug, Serialize)]
pub struct Finding {
    pub kind: &'static str,
    /// `error` (something is wrong: exit status 1), `warning` (needs a
    /// look) or `note` (worth knowing); the last two keep `clean`.
    pub severity: &'static str,
    /// The volume the finding is about; null when it concerns several
    /// (see `uuids`) or none.
    pub uuid: Option<String>,
    /// That volume's name, when it has one.
    pub name: Option<String>,
    /// Every volume the finding concerns.
    pub uuids: Vec<String>,
    pub path: Option<PathBuf>,
    pub message: String,
    pub repaired: bool,
    /// `overcommitted`: the numbers of the backing file system.
    pub backing_fs: Option<BackingFs>,
}

impl Finding {
    fn new(kind: &'static str, severity: &'static str, message: String) -> Self {
        Self {
            kind,
            severity,
            uuid: None,
            name: None,
            uuids: Vec::new(),
            path: None,
            message,
            repaired: false,
            backing_fs: None,
        }
    }

    fn about(mut self, volume: Option<&Volume>, path: Option<&Path>) -> Self {
        if let Some(volume) = volume {
            self.uuid = Some(volume.id.to_string());
            self.name = volume.name.clone();
            self.uuids = vec![volume.id.to_string()];
        }
        self.path = path.map(Path::to_path_buf);
        self
    }
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
                    (false, "note") => "note: ",
                    (false, _) => "",
                };
                format!("{prefix}{}: {}", f.kind, f.message)
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

struct Audit<'a> {
    registry: &'a Registry,
    root: &'a SystemRoot,
    repair: bool,
    findings: Vec<Finding>,
    /// What an audit without root could not read, said once at the end.
    unseen: Vec<(String, VolumeId)>,
    /// This boot's start and command line, and the mount table: read once
    /// for every volume.
    this_boot: ThisBoot,
    mounts: MountTable,
}

impl Audit<'_> {
    fn add(&mut self, finding: Finding) {
        self.findings.push(finding);
    }

    fn report(
        &mut self,
        kind: &'static str,
        volume: Option<&Volume>,
        path: Option<&Path>,
        message: String,
    ) {
        self.add(Finding::new(kind, "error", message).about(volume, path));
    }

    fn warn(&mut self, kind: &'static str, path: Option<&Path>, message: String) {
        self.add(Finding::new(kind, "warning", message).about(None, path));
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
        self.repairable_noting(kind, "error", volume, path, message, || {
            fix().map(|()| String::new())
        });
    }

    /// [`Audit::repairable`] for a fix that says how it was done: a
    /// non-empty note is added to the message.
    fn repairable_noting(
        &mut self,
        kind: &'static str,
        severity: &'static str,
        volume: Option<&Volume>,
        path: Option<&Path>,
        message: String,
        fix: impl FnOnce() -> Result<String>,
    ) {
        let mut finding = Finding::new(kind, severity, message).about(volume, path);
        if self.repair {
            match fix() {
                Ok(note) => {
                    finding.repaired = true;
                    if !note.is_empty() {
                        // After a semicolon, not in parentheses: the note
                        // may hold a tool's or systemd's own.
                        finding.message.push_str(&format!("; {note}"));
                    }
                }
                Err(e) => finding.message.push_str(&format!("; repair failed: {e:#}")),
            }
        }
        self.add(finding);
    }
}

pub fn check(registry: &Registry, repair: bool) -> Outcome<CheckReport> {
    audit(registry, repair).map_err(Failure::Unchanged)
}

fn audit(registry: &Registry, repair: bool) -> Result<CheckReport> {
    let root = registry.root();
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
        registry,
        root,
        repair,
        findings: Vec::new(),
        unseen: Vec::new(),
        this_boot: ThisBoot::read(root),
        mounts: MountTable::read(),
    };

    if let Some(problem) = registry.config_problem() {
        audit.report(
            if problem.untrusted {
                "untrusted-config"
            } else {
                "invalid-config"
            },
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
    let mut refused_in_directory = Vec::new();
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
            // Said once, for the directory, below.
            Err(_) if registry.directory_problem().is_some() => {
                refused_in_directory.push(entry.file.clone())
            }
            Err(error) => audit.report(
                if error.untrusted {
                    "untrusted-registry-file"
                } else {
                    "invalid-registry-file"
                },
                None,
                Some(&entry.file),
                format!("{error}; the volume is skipped at boot"),
            ),
        }
    }
    untrusted_directory(&mut audit, registry, &refused_in_directory);
    registry_temporaries(&mut audit);
    leftover_nodes::audit_leftover_nodes(&mut audit);

    for volume in &volumes {
        audit_volume(&mut audit, volume)?;
    }
    duplicate_backing_files(&mut audit, &volumes);
    duplicate_names(&mut audit, &volumes);
    storage_root_leftovers(&mut audit, registry, &owned, &registered)?;
    overcommitment(&mut audit, registry, &volumes);
    low_headroom(&mut audit, registry, &volumes);

    incomplete_audit(&mut audit);
    let clean = audit
        .findings
        .iter()
        .all(|f| f.repaired || f.severity != "error");
    let report = CheckReport {
        changed: audit.findings.iter().any(|f| f.repaired),
        clean,
        findings: audit.findings,
    };
    LastCheck::of(&report).record(root);
    Ok(report)
}

/// A registry directory anyone but root can change: one finding for all
/// the volume files it refuses.
fn untrusted_directory(audit: &mut Audit, registry: &Registry, refused: &[PathBuf]) {
    let Some(problem) = registry.directory_problem() else {
        return;
    };
    let names: Vec<String> = refused
        .iter()
        .filter_map(|file| file.file_name())
        .map(|name| name.to_string_lossy().into_owned())
        .collect();
    let skipped = match names.len() {
        0 => "it holds no volume file yet, and nothing can be registered".to_string(),
        _ => format!(
            "every volume file in it is refused and skipped at boot ({})",
            names.join(", ")
        ),
    };
    let mut finding = Finding::new(
        "untrusted-registry-directory",
        "error",
        format!("{problem}; {skipped}"),
    )
    .about(None, Some(&problem.file));
    finding.uuids = names
        .iter()
        .filter_map(|name| name.strip_suffix(".toml"))
        .map(str::to_string)
        .collect();
    audit.add(finding);
}

/// Registry files naming one backing file (the same path, or paths that
/// resolve to the same file). Its content carries one UUID, so attach
/// refuses all but one of them; the others are registry mistakes.
fn duplicate_backing_files(audit: &mut Audit, volumes: &[Volume]) {
    let mut by_file: Vec<(BackingKey, Vec<&Volume>)> = Vec::new();
    for volume in volumes {
        let path = audit.root.host_path(&volume.path);
        let key = match fs::metadata(&path) {
            Ok(meta) => BackingKey::Inode(meta.dev(), meta.ino()),
            Err(_) => BackingKey::Path(path),
        };
        match by_file.iter_mut().find(|(k, _)| *k == key) {
            Some((_, sharing)) => sharing.push(volume),
            None => by_file.push((key, vec![volume])),
        }
    }
    for (_, sharing) in by_file.into_iter().filter(|(_, v)| v.len() > 1) {
        let mut paths: Vec<String> = sharing
            .iter()
            .map(|v| v.path.display().to_string())
            .collect();
        paths.dedup();
        let uuids: Vec<String> = sharing.iter().map(|v| v.id.to_string()).collect();
        let mut finding = Finding::new(
            "duplicate-backing-file",
            "error",
            format!(
                "volumes {} name the same backing file ({}); only the volume whose UUID its content carries attaches: delete the registry file of the other (do not `remove` it, which would stop the device of the file)",
                uuids.join(", "),
                paths.join(", ")
            ),
        )
        .about(None, Some(&audit.root.host_path(&sharing[0].path)));
        finding.uuids = uuids;
        audit.add(finding);
    }
}

/// A name is an identity (commands and config management look volumes up
/// by it), so two volumes with one name make every such lookup fail.
/// They still attach: a warning, and nothing to repair automatically,
/// since only the operator knows which one the name is meant for.
fn duplicate_names(audit: &mut Audit, volumes: &[Volume]) {
    let mut by_name: Vec<(&str, Vec<String>)> = Vec::new();
    for volume in volumes {
        let Some(name) = volume.name.as_deref() else {
            continue;
        };
        match by_name.iter_mut().find(|(n, _)| *n == name) {
            Some((_, uuids)) => uuids.push(volume.id.to_string()),
            None => by_name.push((name, vec![volume.id.to_string()])),
        }
    }
    for (name, uuids) in by_name.into_iter().filter(|(_, u)| u.len() > 1) {
        let mut finding = Finding::new(
            "duplicate-name",
            "warning",
            format!(
                "volumes {} all have the name {name:?}; commands that name a volume by it refuse to guess: rename all but one (`sparse-volume apply --uuid U --name NEW`)",
                uuids.join(", ")
            ),
        );
        finding.uuids = uuids;
        audit.add(finding);
    }
}

#[derive(PartialEq)]
enum BackingKey {
    Inode(u64, u64),
    /// A file that does not exist (yet): only the same path is the same.
    Path(PathBuf),
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
            audit
                .unseen
                .push((format!("{} (its file)", subject(volume)), volume.id));
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
                    subject(volume),
                    path.display()
                ),
            );
            return Ok(());
        }
    };
    if let Err(refused) = audit.registry.refuse_links_in_backing_path(&path) {
        audit.report(
            "linked-directory-in-path",
            Some(volume),
            Some(&path),
            format!(
                "{}: {refused:#}; attach refuses it: move the file into a real directory and `sparse-volume register` it there, or make the link's target a storage root of its own",
                subject(volume)
            ),
        );
    }
    let file = match open_backing_file(&path, true) {
        Ok(file) => Some(file),
        // Data files are root's alone; an unprivileged audit skips the
        // content and still looks at the devices.
        Err(_) if !nix::unistd::geteuid().is_root() => {
            audit
                .unseen
                .push((format!("{} (its content)", subject(volume)), volume.id));
            None
        }
        Err(e) => {
            audit.report(
                "unsafe-backing-file",
                Some(volume),
                Some(&path),
                format!("{}: {e:#}", subject(volume)),
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
                "{}: the file has {} ({} bytes), the registry records {} ({} bytes): {hint}",
                subject(volume),
                format_size(meta.len()),
                meta.len(),
                format_size(volume.size),
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
                subject(volume)
            ),
            || clear_creating_mark(&path),
        );
    }
    let content = file.as_ref().map(probe).transpose()?;
    if let Some(content) = content.filter(|c| !volume.identity().is_held_by(c)) {
        audit.report(
            "content-mismatch",
            Some(volume),
            Some(&path),
            format!(
                "{}: {} holds {}, not {}",
                subject(volume),
                path.display(),
                content.describe(),
                volume.identity().describe()
            ),
        );
        return Ok(());
    }

    if let (Mode::Block, Some(file)) = (&volume.mode, &file) {
        shared_partition_name(audit, volume, file, &path);
    }
    if let (true, Some(file)) = (volume.preallocated, &file) {
        preallocation::audit_preallocation(audit, volume, file, &path)?;
    }
    replaced_unit::audit_replaced_unit(audit, volume, &path);
    // Key files and headers are root's alone, like the content: an
    // unprivileged audit has said already that it did not see them.
    if file.is_some() {
        encryption::audit_encryption(audit, volume, &path);
    }

    // Without root, devices are matched by the path sysfs shows.
    let devices = loop_device::devices_of_file(&path)?;
    let weighed = candidates(&devices, volume);
    for unfit in weighed.iter().filter(|c| !c.fits()) {
        audit.report(
            "unfit-loop-device",
            Some(volume),
            Some(&path),
            format!(
                "{}: {}",
                subject(volume),
                unfit_message(unfit.number, &unfit.differs)
            ),
        );
    }
    for fitting in weighed.iter().filter(|c| c.fits()) {
        read_only_pending(audit, volume, fitting.number, &path);
    }
    if let (Some(file), false) = (&file, volume.mode.is_block()) {
        file_system::file_system_errors(audit, volume, file, &devices, &path)?;
        file_system::file_system_shut_down(audit, volume, &devices, &path);
    }
    if let Some((keep, extra)) = duplicates(&weighed) {
        let root = audit.root.clone();
        audit.repairable_noting(
            "duplicate-loop-devices",
            "error",
            Some(volume),
            Some(&path),
            format!(
                "{}: {} also attach the file (kept /dev/loop{keep})",
                subject(volume),
                device_names(&extra)
            ),
            || {
                hooks::stop_at(Stop::CheckBeforeDuplicateRepair);
                // What was seen before the lock may have been detached,
                // attached again or replaced meanwhile (attach and detach
                // do not take the registry lock check holds): decided
                // again under the lock that keeps them away.
                let _lock = Registry::volume_lock(&root, &volume.id)?;
                let meta = fs::symlink_metadata(&path)?;
                let now = candidates(&loop_device::devices_of_file(&path)?, volume);
                let Some((keep_now, extra_now)) = duplicates(&now) else {
                    return Ok("no longer so under the volume lock: nothing detached".into());
                };
                extra_now
                    .iter()
                    .try_for_each(|&n| detach_device_or_leave_it(n, (meta.dev(), meta.ino())))?;
                Ok(if keep_now == keep && extra_now == extra {
                    String::new()
                } else {
                    format!(
                        "under the volume lock: detached {}, kept /dev/loop{keep_now}",
                        device_names(&extra_now)
                    )
                })
            },
        );
    } else if devices.is_empty() && volume.enabled {
        // Booted with the emergency switch: detached on purpose, and
        // attach would refuse it anyway until the next boot.
        if let Some(skip) = audit.this_boot.skips(&volume.id) {
            audit.add(
                Finding::new(
                    "skipped-by-kernel-cmdline",
                    "warning",
                    format!(
                        "{}: enabled but not attached: skipped by {skip}",
                        subject(volume)
                    ),
                )
                .about(Some(volume), Some(&path)),
            );
            return Ok(());
        }
        let registry = audit.registry;
        let unit = unit_name(&volume.id);
        let asked = Systemd::connect().and_then(|systemd| systemd.unit_state(&unit));
        let said = match &asked {
            Ok(state) => UnitSaid::State(&state.active_state),
            Err(e) => UnitSaid::Unknown(format!("{e:#}")),
        };
        let NotAttached { missed, why } =
            not_attached(&audit.this_boot, audit.root, &volume.id, said);
        audit.repairable_noting(
            "not-attached",
            if missed { "error" } else { "warning" },
            Some(volume),
            Some(&path),
            format!("{}: enabled but not attached: {why}", subject(volume)),
            || bring_up_now(registry, &volume.id, false).map(|activation| activation.how),
        );
    }
    Ok(())
}

/// An audit that could not read everything cannot say the node is clean:
/// one finding for all it missed, which fails the audit.
fn incomplete_audit(audit: &mut Audit) {
    if audit.unseen.is_empty() {
        return;
    }
    let what: Vec<&str> = audit.unseen.iter().map(|(what, _)| what.as_str()).collect();
    let message = format!(
        "not verified without root: {}; run `sudo sparse-volume check` for the whole audit",
        what.join(", ")
    );
    let mut finding = Finding::new("content-not-verified", "error", message);
    finding.uuids = audit.unseen.iter().map(|(_, id)| id.to_string()).collect();
    audit.add(finding);
}

/// A read-only flag changed while the volume was attached: the device
/// keeps what it was attached with until the next attach.
fn read_only_pending(audit: &mut Audit, volume: &Volume, number: u32, path: &Path) {
    let Some(device_read_only) = LoopDevice::is_read_only(number) else {
        return;
    };
    if device_read_only == volume.read_only {
        return;
    }
    let access = |read_only: bool| if read_only { "read-only" } else { "read-write" };
    let (now, then) = (access(device_read_only), access(volume.read_only));
    audit.add(
        Finding::new(
            "read-only-pending",
            "warning",
            format!(
                "{who}: /dev/loop{number} is {now}, the registry says {then}, which takes effect at the next attach (`sparse-volume stop {id}` and `start {id}`, or `detach` and `attach` without systemd)",
                who = subject(volume),
                id = volume.id
            ),
        )
        .about(Some(volume), Some(path)),
    );
}

/// How a finding names a volume: by its name and UUID, or its UUID.
pub(super) fn subject(volume: &Volume) -> String {
    match &volume.name {
        Some(name) => format!("{name} ({})", volume.id),
        None => volume.id.to_string(),
    }
}

/// A block volume made before 0.3, whose partition has the name every
/// block volume had: a warning with the rename (while detached, since the
/// kernel reads partition names only when it scans the table).
fn shared_partition_name(audit: &mut Audit, volume: &Volume, file: &fs::File, path: &Path) {
    if gpt_layout::partition_name(file, volume.sector_size).as_deref()
        != Some(gpt_layout::SHARED_PARTITION_NAME)
    {
        return;
    }
    audit.add(
        Finding::new(
            "shared-partition-name",
            "warning",
            format!(
                "{id}: its partition is named \"{shared}\" like every block volume made before 0.3, so they all contend for /dev/disk/by-partlabel/{shared}; rename it while detached: sparse-volume stop {id}; sgdisk -c 1:{id} {file}; sparse-volume start {id}",
                id = volume.id,
                shared = gpt_layout::SHARED_PARTITION_NAME,
                file = path.display()
            ),
        )
        .about(Some(volume), Some(path)),
    );
}

/// A device bound to a volume's file, as a duplicate repair weighs it.
struct Candidate {
    number: u32,
    in_use: bool,
    /// How it fails to show the volume as registered
    /// (`engine::attach::unfit_reasons`); empty when it fits, or when its
    /// status cannot be read (without root).
    differs: Vec<String>,
}

impl Candidate {
    fn fits(&self) -> bool {
        self.differs.is_empty()
    }
}

fn candidates(numbers: &[u32], volume: &Volume) -> Vec<Candidate> {
    numbers
        .iter()
        .map(|&number| Candidate {
            number,
            in_use: !users_of_loop(number).is_empty(),
            differs: LoopDevice::open(number, false)
                .ok()
                .and_then(|device| device.status().ok().flatten())
                .map(|status| unfit_reasons(&status, volume))
                .unwrap_or_default(),
        })
        .collect()
}

/// Of several devices on one file that show the volume as registered, the
/// one to keep (the one in use, else the first) and the others. None for
/// fewer than two, and while a device that does not fit is in use: that
/// one is reported as unfit, for a person to sort out, and never weighed.
fn duplicates(candidates: &[Candidate]) -> Option<(u32, Vec<u32>)> {
    if candidates.iter().any(|c| c.in_use && !c.fits()) {
        return None;
    }
    let fitting: Vec<&Candidate> = candidates.iter().filter(|c| c.fits()).collect();
    if fitting.len() < 2 {
        return None;
    }
    let keep = fitting
        .iter()
        .find(|c| c.in_use)
        .unwrap_or(&fitting[0])
        .number;
    Some((
        keep,
        fitting
            .iter()
            .map(|c| c.number)
            .filter(|&n| n != keep)
            .collect(),
    ))
}

fn device_names(numbers: &[u32]) -> String {
    numbers
        .iter()
        .map(|&n| LoopDevice::path_of(n).display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Bound devices whose `lo_file_name` names this volume.
fn devices_by_reference(id: &VolumeId) -> Result<Vec<u32>> {
    let reference = id.loop_reference();
    Ok(loop_device::bound_statuses()?
        .into_iter()
        .filter(|(_, status)| status.reference == reference)
        .map(|(number, _)| number)
        .collect())
}

/// Every regular file below `root` at any depth (`create --path` may put
/// a file in a subdirectory), without following symbolic links and
/// without entering a directory twice (bind mounts), sorted.
fn files_below(root: &Path) -> Vec<(PathBuf, fs::Metadata)> {
    let mut files = Vec::new();
    let mut entered = HashSet::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(meta) = fs::metadata(&dir) else {
            continue;
        };
        if !entered.insert((meta.dev(), meta.ino())) {
            continue;
        }
        for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            match fs::symlink_metadata(&path) {
                Ok(meta) if meta.is_dir() => pending.push(path),
                Ok(meta) if meta.is_file() => files.push((path, meta)),
                _ => {}
            }
        }
    }
    files.sort_by(|a, b| a.0.cmp(&b.0));
    files
}

/// Interrupted creates, and loop devices on storage-root files no volume owns,
/// at any depth below a storage root.
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
    // Nested storage roots would show a file twice.
    let mut seen = HashSet::new();
    for root in &roots {
        for (path, meta) in files_below(root) {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if owned.contains(&(meta.dev(), meta.ino())) || !seen.insert((meta.dev(), meta.ino())) {
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
                || !loop_device::devices_of_file(&path)?.is_empty();
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
                    format!(
                        "{} is left over from an interrupted create, clone or import",
                        path.display()
                    ),
                    || fs::remove_file(&path).map_err(Into::into),
                );
            } else if let Some(removed) = kept_for(&path) {
                // What `remove` without `--delete-data` kept, as it said:
                // worth knowing (it takes space), not a fault.
                audit.add(
                    Finding::new(
                        "unregistered-file",
                        "note",
                        format!(
                            "{} is the data `remove` kept of volume {removed} (`sparse-volume register` it again, or delete it if it is not needed)",
                            path.display()
                        ),
                    )
                    .about(None, Some(&path)),
                );
            } else if !name.starts_with('.') {
                // Nobody said to keep it: a volume whose registry file was
                // lost would not come back at the next boot.
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
    for (number, status) in loop_device::bound_statuses()? {
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
                detach_device_or_leave_it(number, status.backing())
            },
        );
    }
    Ok(())
}

/// What the volumes on each file system may still grow into, against
/// what that file system can give. Beyond what may be promised (free
/// space times `overcommit_ratio`, less the reserve) it is an error;
/// beyond the free space but within an allowed overcommit it is a
/// warning: the operator chose it, but if the volumes grow, writes in
/// them fail.
/// A storage root whose headroom is below `warn_headroom` while its
/// volumes still fit (once they do not, `overcommitted` says so).
fn low_headroom(audit: &mut Audit, registry: &Registry, volumes: &[Volume]) {
    if registry.config().warn_headroom.is_none() {
        return;
    }
    let files = capacity::BackingFiles::look(audit.root, volumes);
    for usage in capacity::storage_root_usage(audit.root, registry.config(), volumes, &files) {
        if usage.under_pressure() && usage.headroom() >= 0 {
            let path = usage.storage_root.clone();
            audit.warn("low-headroom", Some(&path), usage.pressure_message());
        }
    }
}

fn overcommitment(audit: &mut Audit, registry: &Registry, volumes: &[Volume]) {
    let files = capacity::BackingFiles::look(audit.root, volumes);
    for fs_usage in capacity::backing_file_systems(audit.root, volumes, &files).into_values() {
        let directory = fs_usage.directory.clone();
        let numbers = format!(
            "volumes on the file system of {} ({}) may still grow by {} ({} bytes), but it has {} ({} bytes) free",
            directory.display(),
            fs_usage.volumes.join(", "),
            format_size(fs_usage.committed_growth),
            fs_usage.committed_growth,
            format_size(fs_usage.free),
            fs_usage.free
        );
        // Without usable settings only the free space itself is a fact.
        let capacity = registry
            .provisioning_config()
            .ok()
            .and_then(|_| capacity::measure(registry, &directory, None).ok());
        let (severity, message) = match &capacity {
            Some(c) if c.committed > c.promisable => (
                "error",
                format!(
                    "{numbers}; only {} can be promised ({} reserved, overcommit_ratio {}): writes inside these volumes fail once the file system is full",
                    format_size(c.promisable),
                    format_size(c.reserve),
                    c.overcommit_ratio
                ),
            ),
            Some(c) if fs_usage.short => (
                "warning",
                format!(
                    "{numbers}; overcommit_ratio {} allows this, but if they grow that far, writes inside them fail",
                    c.overcommit_ratio
                ),
            ),
            None if fs_usage.short => (
                "warning",
                format!("{numbers}; if they grow that far, writes inside them fail"),
            ),
            _ => continue,
        };
        let mut finding =
            Finding::new("overcommitted", severity, message).about(None, Some(&directory));
        finding.uuids = fs_usage.volumes.clone();
        finding.backing_fs = Some(std::sync::Arc::unwrap_or_clone(fs_usage));
        audit.add(finding);
    }
}
