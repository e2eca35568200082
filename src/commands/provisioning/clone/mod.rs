//! `sparse-volume clone SOURCE --name NEW`: a new volume whose content is
//! SOURCE's at one instant, under an identity of its own. Made as `create`
//! makes a volume (a hidden, marked file; renamed; registered; unmarked),
//! so a crash at any point leaves nothing or what `check --repair`
//! removes, and never a consumer's file system frozen (see `copy`).

pub(in crate::commands::provisioning) mod copy;

use std::fs;
use std::path::{Path, PathBuf};

use uuid::Uuid;

use anyhow::{bail, Context, Result};
use nix::fcntl::{renameat2, RenameFlags};
use serde::Serialize;

use self::copy::{copy_consistently, Copied, InUse};
use crate::commands::report::{Failure, Outcome, Report};
use crate::engine::activate::bring_up_now;
use crate::engine::capacity;
use crate::engine::encryption::refuse_if_encrypted;
use crate::engine::identity::{consumer_file_system, renew_identity};
use crate::hooks::{self, Crash};
use crate::kernel::files::sync_dir;
use crate::registry::{check_path, Registry, Volume};
use crate::volume::backing_file::open_backing_file;
use crate::volume::creating_mark::{clear_creating_mark, create_marked, creating_path};
use crate::volume::id::VolumeId;
use crate::volume::probe::probe;
use crate::volume::spec::{FsType, Mode};

#[derive(Debug, Clone)]
pub struct CloneRequest {
    pub source: VolumeId,
    pub name: String,
    pub uuid: Option<VolumeId>,
    pub read_only: bool,
    pub enabled: bool,
    /// Keep a mounted source frozen for a whole copy, where the storage
    /// cannot share extents.
    pub freeze_during_copy: bool,
    /// The size the clone is grown to right after (`apply`): its space is
    /// checked with the clone's, before anything is made.
    pub grow_to: Option<u64>,
    pub now: bool,
    pub dry_run: bool,
}

#[derive(Debug, Serialize)]
pub struct CloneReport {
    pub changed: bool,
    /// The clone's UUID; null in a dry run that would choose it.
    pub uuid: Option<String>,
    pub name: String,
    pub origin: String,
    pub path: PathBuf,
    pub size: u64,
    pub read_only: bool,
    pub enabled: bool,
    /// `reflink` (extents shared with the source) or `copy` (the data
    /// ranges copied, holes kept); null when nothing was copied.
    pub method: Option<&'static str>,
    /// `offline` (nothing had the source attached), `frozen` (its file
    /// system was frozen for the copy) or `crash-consistent` (in use and
    /// not frozen: what a power cut would have left).
    pub consistency: Option<&'static str>,
    /// How long the source's file system was frozen.
    pub frozen_ms: Option<u64>,
    /// Data bytes the copy wrote (0 for a reflink).
    pub copied_bytes: Option<u64>,
    /// Block mode: the new UUID of the ext4 the consumer made in the
    /// partition (a copy under the old one would fight the source's for
    /// its `/dev/disk/by-uuid` link); null when there is none.
    pub consumer_fs_uuid: Option<String>,
    /// With `--now`: the loop device the clone is attached to.
    pub device: Option<PathBuf>,
    pub note: Option<String>,
}

impl Report for CloneReport {
    fn human(&self) -> String {
        let uuid = self.uuid.as_deref().unwrap_or("a new UUID");
        let mut text = match self.method {
            // A repeat: the copy made before is kept, not taken again.
            None => format!(
                "{} ({uuid}) is already a clone of {}: nothing copied (the copy made before is kept; remove it first for a new one)",
                self.name, self.origin
            ),
            Some(method) => format!(
                "cloned {} into {} ({uuid}) at {} by {method}, {}",
                self.origin,
                self.name,
                self.path.display(),
                self.how_consistent()
            ),
        };
        if self.method.is_some() && self.read_only && !self.enabled {
            text.push_str("; a snapshot: read-only, not attached at boot");
        }
        if let Some(device) = &self.device {
            text.push_str(&format!(", attached as {}", device.display()));
        }
        if let Some(note) = &self.note {
            text.push_str(&format!("; {note}"));
        }
        text
    }

    fn planned(&self) -> String {
        if !self.changed {
            return self.human();
        }
        let mut text = format!(
            "would clone {} into {} at {}",
            self.origin,
            self.name,
            self.path.display()
        );
        if let Some(method) = self.method {
            text.push_str(&format!(" by {method}, {}", self.how_consistent()));
        }
        text
    }
}

impl CloneReport {
    /// `frozen for 4 ms`, `crash-consistent`, `offline`.
    fn how_consistent(&self) -> String {
        match (self.consistency, self.frozen_ms) {
            (Some("frozen"), Some(ms)) => format!("frozen for {ms} ms"),
            (Some(consistency), _) => consistency.to_string(),
            (None, _) => String::new(),
        }
    }
}

/// `clone`, and with `--now` the clone attached. A failed attach after
/// the clone was made reports the clone as made.
pub fn clone(registry: &Registry, request: &CloneRequest) -> Outcome<CloneReport> {
    let (mut report, _) = clone_volume(registry, request).map_err(Failure::Unchanged)?;
    if request.dry_run && report.changed && request.uuid.is_none() {
        // The real run chooses its own UUID: this one would mislead.
        report.uuid = None;
        return Ok(report);
    }
    if !request.now || request.dry_run {
        return Ok(report);
    }
    let Some(id) = report
        .uuid
        .as_deref()
        .and_then(|u| u.parse::<VolumeId>().ok())
    else {
        return Ok(report);
    };
    let activation = bring_up_now(registry, &id, true).map_err(|error| {
        if report.changed {
            Failure::PartlyApplied {
                uuid: id,
                actions: vec!["clone".into()],
                error,
            }
        } else {
            Failure::Unchanged(error)
        }
    })?;
    report.changed |= activation.changed;
    report.device = activation.device;
    report.note = Some(activation.how);
    Ok(report)
}

/// Everything but `--now`, under the registry lock: the step `apply`
/// composes. Returns the volume as registered (in a dry run, as it would
/// be).
pub fn clone_volume(registry: &Registry, request: &CloneRequest) -> Result<(CloneReport, Volume)> {
    let root = registry.root();
    // Capacity decisions and the new name are serialised with every other
    // create, and the source is read under the same lock: a resize of it
    // queued first must not leave the clone recorded at the old size.
    let _registry_lock = registry.lock()?;
    let source = registry.require(&request.source)?;
    refuse_if_encrypted(&source, "cloning")?;
    let clone = clone_of(registry, &source, request)?;
    let report = |changed: bool, volume: &Volume, made: Option<&Made>| CloneReport {
        changed,
        uuid: Some(volume.id.to_string()),
        name: request.name.clone(),
        origin: source.id.to_string(),
        path: volume.path.clone(),
        size: volume.size,
        read_only: volume.read_only,
        enabled: volume.enabled,
        method: made.map(|m| m.copied.method.name()),
        consistency: made.map(|m| m.copied.consistency.name()),
        frozen_ms: made
            .and_then(|m| m.copied.frozen_for)
            .map(|d| d.as_millis() as u64),
        copied_bytes: made.map(|m| m.copied.copied_bytes),
        consumer_fs_uuid: made.and_then(|m| m.consumer_fs_uuid.map(|u| u.to_string())),
        device: None,
        note: None,
    };
    if let Some(named) = registry.volume_named(&request.name)? {
        already_cloned(&named, &source, request)?;
        // A clone killed after registering but before unmarking, now
        // repeated: the mark must not outlive it (as for `create`).
        if !request.dry_run {
            clear_creating_mark(&root.host_path(&named.path))?;
        }
        return Ok((report(false, &named, None), named));
    }
    registry.ensure_name_free(&request.name, &clone.id)?;
    if registry.get(&clone.id)?.is_some() {
        bail!(
            "the UUID {} is already a volume's; choose another, or leave --uuid out",
            clone.id
        );
    }
    let host_path = root.host_path(&clone.path);
    if fs::symlink_metadata(&host_path).is_ok() {
        bail!(
            "{} already exists; clone never overwrites a file",
            host_path.display()
        );
    }
    let temporary = creating_path(&host_path);
    let made = copy_source(registry, &source, &clone, request, &temporary)?;
    if request.dry_run {
        return Ok((report(true, &clone, Some(&made)), clone));
    }
    hooks::crash_at(Crash::CloneBeforeRename);
    renameat2(
        None,
        &temporary,
        None,
        &host_path,
        RenameFlags::RENAME_NOREPLACE,
    )
    .with_context(|| {
        format!(
            "renaming {} to {}",
            temporary.display(),
            host_path.display()
        )
    })?;
    if let Some(directory) = host_path.parent() {
        sync_dir(directory)?;
    }
    hooks::crash_at(Crash::CloneBeforeRegistry);
    registry.put(&clone)?;
    hooks::crash_at(Crash::CloneBeforeUnmark);
    clear_creating_mark(&host_path)?;
    Ok((report(true, &clone, Some(&made)), clone))
}

/// The clone's registry entry: the source's spec under its own UUID, name
/// and flags, its file beside the source's (a reflink shares extents only
/// within one file system), checked as `create` checks a path.
fn clone_of(registry: &Registry, source: &Volume, request: &CloneRequest) -> Result<Volume> {
    let id = request
        .uuid
        .unwrap_or_else(|| VolumeId::new(uuid::Uuid::new_v4()));
    let path = source
        .path
        .parent()
        .context("the source's backing file path has no directory")?
        .join(id.to_string());
    let clone = Volume {
        id,
        path,
        name: Some(request.name.clone()),
        enabled: request.enabled,
        read_only: request.read_only,
        origin: Some(source.id),
        replaces_unit: None,
        encryption: None,
        // Shared or copied, a clone's extents are no reservation: it
        // takes space as it is written, like any sparse volume.
        preallocated: false,
        ..source.clone()
    };
    clone.validate()?;
    // Outside every storage root, `check` would never see the clone (nor
    // a leftover of it), and the capacity of its storage would not count.
    check_path(&clone.path, registry.provisioning_config()?)
        .map_err(anyhow::Error::msg)
        .context("the clone's file goes beside its source's")?;
    registry.refuse_links_in_backing_path(&registry.root().host_path(&clone.path))?;
    Ok(clone)
}

/// What copying made: how, and the new UUID of a file system the
/// consumer made inside a block volume.
struct Made {
    copied: Copied,
    consumer_fs_uuid: Option<Uuid>,
}

/// Copies the source into `temporary` and gives the copy the clone's
/// identity; in a dry run, every check and no copy. The source's lock is
/// held while its file is read (no resize, attach or detach of it
/// meanwhile), not while the copy is checked and renamed.
fn copy_source(
    registry: &Registry,
    source: &Volume,
    clone: &Volume,
    request: &CloneRequest,
    temporary: &Path,
) -> Result<Made> {
    let source_path = registry.root().host_path(&source.path);
    let source_lock = Registry::volume_lock(registry.root(), &source.id)?;
    let source_file = open_backing_file(&source_path, true)?;
    let content = probe(&source_file)?;
    if !source.identity().is_held_by(&content) {
        bail!(
            "{} holds {}, not {}; not cloning it (`sparse-volume check` says more)",
            source_path.display(),
            content.describe(),
            source.identity().describe()
        );
    }
    let length = source_file.metadata()?.len();
    if length != source.size {
        bail!(
            "{} has {length} bytes, the registry {}: an interrupted resize; finish it (`sparse-volume resize {} --size {length}`) before cloning",
            source_path.display(),
            source.size,
            source.id
        );
    }
    let in_use = InUse::of(&source_path)?;
    refuse_what_cannot_be_renamed(source, &in_use)?;
    let consumer_fs = consumer_file_system(&source_file, source)?;
    let capacity = capacity::measure(registry, &source_path, None)?;
    // A clone commits its size, or what apply will grow it to.
    let promise = clone.size.max(request.grow_to.unwrap_or(0));
    let fits = || capacity::ensure_fits(&capacity, promise, &source_path);
    if request.dry_run {
        let copied = copy::plan(
            &source_file,
            &source_path,
            &in_use,
            request.freeze_during_copy,
        )?;
        fits()?;
        return Ok(Made {
            copied,
            consumer_fs_uuid: None,
        });
    }

    let target = create_marked(temporary, &clone.id)?;
    let made = copy_consistently(
        &source_file,
        &target,
        &in_use,
        request.freeze_during_copy,
        fits,
    )
    .and_then(|copied| {
        // A reflink took no space before this check; a copy was checked
        // before it took any.
        fits()?;
        hooks::crash_at(Crash::CloneAfterCopy);
        Ok(copied)
    })
    .inspect_err(|_| remove_ours(temporary));
    drop(source_lock);
    let copied = made?;
    let consumer_fs_uuid = renew_identity(temporary, &target, source, clone, consumer_fs)
        .and_then(|renewed| {
            target
                .sync_all()
                .with_context(|| format!("syncing {}", temporary.display()))?;
            Ok(renewed)
        })
        .inspect_err(|_| remove_ours(temporary))?;
    Ok(Made {
        copied,
        consumer_fs_uuid,
    })
}

/// Made with O_EXCL under the registry lock: ours to remove on failure.
fn remove_ours(temporary: &Path) {
    let _ = fs::remove_file(temporary);
}

/// The name is taken: by a clone of this source with what is asked, a
/// repeated clone (unchanged); by anything else, a refusal.
fn already_cloned(named: &Volume, source: &Volume, request: &CloneRequest) -> Result<()> {
    if named.id == source.id {
        bail!(
            "{:?} is the volume to copy itself; give the clone a name of its own",
            request.name
        );
    }
    if named.origin != Some(source.id) {
        bail!(
            "the name {:?} is already given to volume {}, which is not a clone of {}; a name names one volume on a node",
            request.name,
            named.id,
            source.id
        );
    }
    let mut differences = Vec::new();
    if request.uuid.is_some_and(|u| u != named.id) {
        differences.push(format!("its UUID is {}", named.id));
    }
    if named.read_only != request.read_only {
        differences.push(format!("read_only = {}", named.read_only));
    }
    if named.enabled != request.enabled {
        differences.push(format!("enabled = {}", named.enabled));
    }
    if differences.is_empty() {
        return Ok(());
    }
    bail!(
        "{:?} is already a clone of {}, with {}; `sparse-volume apply` changes read_only and enabled",
        request.name,
        source.id,
        differences.join(", ")
    )
}

/// A mounted xfs (or one held where this process cannot see its mount: a
/// pod's mount namespace): its freeze leaves changes in the log that only
/// a mount of the copy would replay, and until the log is replayed the
/// copy's UUID cannot change (xfs_admin refuses). Mounting the copy would
/// show the source's identity to udev: not done.
fn refuse_what_cannot_be_renamed(source: &Volume, in_use: &InUse) -> Result<()> {
    let xfs = matches!(
        source.mode,
        Mode::Filesystem {
            fs_type: FsType::Xfs,
            ..
        }
    );
    if !xfs {
        return Ok(());
    }
    let place = match (in_use.mount_point(), in_use.held_unseen) {
        (Some(point), _) => format!("mounted on {}", point.display()),
        (None, true) => {
            "held by someone this process cannot see (mounted in another mount namespace?)"
                .to_string()
        }
        (None, false) => return Ok(()),
    };
    bail!(
        "{} is an xfs {place}: the copy of an xfs in use keeps changes in its log that only a mount replays, and its UUID cannot change before; unmount it for the clone (a snapshot of an unmounted xfs is consistent), or use ext4",
        source.id
    )
}
