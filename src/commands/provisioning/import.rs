//! `sparse-volume import [--input FILE|-] [--name N] [--keep-uuid|--new-uuid]`:
//! a volume from an `export` stream. Made as `create` makes one (a hidden,
//! marked file; renamed; registered; unmarked), with the same capacity
//! checks, never over existing data, and registered only once the whole
//! stream read back with its checksum: an interrupted or damaged import
//! leaves nothing but what `check --repair` removes.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, FileExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use nix::fcntl::{renameat2, RenameFlags};
use serde::Serialize;

use crate::commands::report::{Failure, Outcome, Report};
use crate::engine::activate::bring_up_now;
use crate::engine::capacity;
use crate::engine::identity::{consumer_file_system, renew_identity};
use crate::hooks::{self, Crash};
use crate::kernel::direct_write::DirectWriter;
use crate::kernel::file_clone::data_ranges;
use crate::kernel::files::sync_dir;
use crate::registry::{check_path, Registry, Volume};
use crate::volume::archive::{data_checksum, ImageSums, Manifest, Reader, CHUNK as IMAGE_CHUNK};
use crate::volume::backing_file::open_backing_file;
use crate::volume::creating_mark::{clear_creating_mark, create_marked, creating_path};
use crate::volume::id::VolumeId;
use crate::volume::probe::probe;
use crate::volume::size::format_size;
use crate::volume::spec::{FsType, Mode, ModeKind};

#[derive(Debug, Clone)]
pub struct ImportRequest {
    /// None: standard input.
    pub input: Option<PathBuf>,
    /// The name on this node (default: the exported volume's).
    pub name: Option<String>,
    /// Under a new UUID (a copy beside the original) instead of the
    /// exported one (a move).
    pub new_uuid: bool,
    pub now: bool,
    /// Every check, the whole stream read and its checksum verified,
    /// nothing written.
    pub dry_run: bool,
}

#[derive(Debug, Serialize)]
pub struct ImportReport {
    pub changed: bool,
    /// Null in a dry run of `--new-uuid` (the real run chooses its own).
    pub uuid: Option<String>,
    /// The UUID the volume had where it was exported.
    pub exported_uuid: String,
    pub name: Option<String>,
    pub path: PathBuf,
    pub size: u64,
    pub data_bytes: u64,
    /// The stream's checksum (BLAKE3), verified.
    pub blake3: String,
    pub device: Option<PathBuf>,
    pub note: Option<String>,
}

impl Report for ImportReport {
    fn human(&self) -> String {
        let uuid = self.uuid.as_deref().unwrap_or(&self.exported_uuid);
        let mut text = if self.changed {
            format!(
                "imported {uuid} ({}, {} of data) at {}",
                format_size(self.size),
                format_size(self.data_bytes),
                self.path.display()
            )
        } else {
            format!(
                "{uuid} is imported already from this stream (the same data, not written since): nothing to do"
            )
        };
        if uuid != self.exported_uuid {
            text.push_str(&format!(" (exported as {})", self.exported_uuid));
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
        format!(
            "would import {} ({}, {} of data, checksum verified) at {}",
            self.uuid.as_deref().unwrap_or("under a new UUID"),
            format_size(self.size),
            format_size(self.data_bytes),
            self.path.display()
        )
    }
}

pub fn import(registry: &Registry, request: &ImportRequest) -> Outcome<ImportReport> {
    let mut report = match &request.input {
        None => import_from(registry, request, std::io::stdin().lock()),
        Some(path) => fs::File::open(path)
            .with_context(|| format!("opening {}", path.display()))
            .and_then(|file| import_from(registry, request, std::io::BufReader::new(file))),
    }
    .map_err(Failure::Unchanged)?;
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
    let activation = bring_up_now(registry, &id, true).map_err(|error| Failure::PartlyApplied {
        uuid: id,
        actions: vec!["import".into()],
        error,
    })?;
    report.device = activation.device;
    report.note = Some(activation.how);
    Ok(report)
}

fn import_from(
    registry: &Registry,
    request: &ImportRequest,
    input: impl Read,
) -> Result<ImportReport> {
    let mut reader = Reader::new(input);
    let manifest = reader.manifest()?;
    let exported = exported_volume(registry, &manifest)?;
    refuse_what_cannot_be_renamed(&exported, &manifest, request)?;
    let volume = Volume {
        id: if request.new_uuid {
            VolumeId::new(uuid::Uuid::new_v4())
        } else {
            exported.id
        },
        name: request.name.clone().or_else(|| exported.name.clone()),
        ..exported.clone()
    };
    let path = registry.provisioning_config()?.storage_roots[0].join(volume.id.to_string());
    let volume = Volume { path, ..volume };
    volume.validate()?;
    check_path(&volume.path, registry.provisioning_config()?).map_err(anyhow::Error::msg)?;
    let root = registry.root();
    let host_path = root.host_path(&volume.path);
    registry.refuse_links_in_backing_path(&host_path)?;
    let report = |sums: &ImageSums, changed: bool, volume: &Volume| ImportReport {
        changed,
        uuid: (!(request.dry_run && request.new_uuid)).then(|| volume.id.to_string()),
        exported_uuid: manifest.uuid.clone(),
        name: volume.name.clone(),
        path: volume.path.clone(),
        size: volume.size,
        data_bytes: manifest.data_bytes,
        blake3: sums.stream.clone(),
        device: None,
        note: None,
    };

    // Held while the stream is read: a stalled stream keeps other creates
    // waiting, which is the price of weighing its space against theirs.
    let _lock = registry.lock()?;
    if let Some(registered) = registry.get(&volume.id)? {
        // The same stream again: done already, if the volume here is what
        // it made and has not been written since.
        let sums = reader.image(&manifest, |_, _| Ok(()))?;
        verify_checksum(&mut reader, &manifest, &sums.stream)?;
        if registered.size == volume.size
            && registered.mode == volume.mode
            && registered.sector_size == volume.sector_size
            && data_checksum_of(registry, &registered)? == sums.data
        {
            if !request.dry_run {
                clear_creating_mark(&root.host_path(&registered.path))?;
            }
            return Ok(report(&sums, false, &registered));
        }
        bail!(
            "volume {} is registered here already, with other content; `import --new-uuid` makes a copy of the stream under a UUID of its own",
            volume.id
        );
    }
    if let Some(name) = &volume.name {
        registry
            .ensure_name_free(name, &volume.id)
            .with_context(|| "give the imported volume another name with --name".to_string())?;
    }
    refuse_a_uuid_the_node_has(&volume)?;
    if fs::symlink_metadata(&host_path).is_ok() {
        bail!(
            "{} already exists; import never overwrites a file",
            host_path.display()
        );
    }
    let directory = host_path
        .parent()
        .context("the backing file path has no directory")?
        .to_path_buf();
    // A dry run makes no directory: the space is that of the nearest one
    // that exists.
    let existing = directory
        .ancestors()
        .find(|d| d.is_dir())
        .context("no directory of the backing file path exists")?;
    let capacity = capacity::measure(registry, existing, None)?;
    capacity::ensure_fits(&capacity, volume.size, &directory)?;
    if request.dry_run {
        let sums = reader.image(&manifest, |_, _| Ok(()))?;
        verify_checksum(&mut reader, &manifest, &sums.stream)?;
        return Ok(report(&sums, true, &volume));
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&directory)
        .with_context(|| format!("creating {}", directory.display()))?;

    let temporary = creating_path(&host_path);
    let sums =
        write_image(&mut reader, &manifest, &temporary, &exported, &volume).inspect_err(|_| {
            // Made with O_EXCL under the registry lock: ours to remove.
            let _ = fs::remove_file(&temporary);
        })?;
    hooks::crash_at(Crash::ImportBeforeRename);
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
    sync_dir(&directory)?;
    registry.put(&volume)?;
    clear_creating_mark(&host_path)?;
    Ok(report(&sums, true, &volume))
}

/// An xfs taken while in use holds changes in its log that only a mount
/// replays, and its UUID cannot change before: under its own UUID only.
fn refuse_what_cannot_be_renamed(
    exported: &Volume,
    manifest: &Manifest,
    request: &ImportRequest,
) -> Result<()> {
    let xfs = matches!(
        exported.mode,
        Mode::Filesystem {
            fs_type: FsType::Xfs,
            ..
        }
    );
    if request.new_uuid && xfs && manifest.consistency != "offline" {
        bail!(
            "this xfs was exported in use ({}): its log holds changes that only a mount replays, so its UUID cannot change here; import it with --keep-uuid (a move), or export it again detached",
            manifest.consistency
        );
    }
    Ok(())
}

/// A UUID another device of this node carries (its udev link exists):
/// a second claimant would make the link lead to either.
fn refuse_a_uuid_the_node_has(volume: &Volume) -> Result<()> {
    let link = match volume.mode {
        Mode::Filesystem { .. } => Path::new("/dev/disk/by-uuid"),
        Mode::Block => Path::new("/dev/disk/by-partuuid"),
    }
    .join(volume.id.to_string());
    if fs::symlink_metadata(&link).is_ok() {
        bail!(
            "{} exists: a device of this node has that UUID already; `import --new-uuid` gives the volume one of its own",
            link.display()
        );
    }
    Ok(())
}

/// The data-only checksum of a registered volume's backing file.
fn data_checksum_of(registry: &Registry, volume: &Volume) -> Result<String> {
    let file = open_backing_file(&registry.root().host_path(&volume.path), true)?;
    let ranges = data_ranges(&file, volume.size)?;
    data_checksum(&ranges, |offset, buffer| file.read_exact_at(buffer, offset))
}

/// The volume as it was exported, checked by the registry's own rules.
fn exported_volume(registry: &Registry, manifest: &Manifest) -> Result<Volume> {
    let id: VolumeId = manifest
        .uuid
        .parse()
        .map_err(|e: String| anyhow::anyhow!("the manifest's uuid: {e}"))?;
    let kind: ModeKind = manifest.mode.parse().map_err(anyhow::Error::msg)?;
    let mode = match kind {
        ModeKind::Filesystem => {
            let fs_type: FsType = manifest
                .fs_type
                .as_deref()
                .context("the manifest names no file system type")?
                .parse()
                .map_err(anyhow::Error::msg)?;
            Mode::Filesystem {
                fs_type,
                mkfs_options: manifest.mkfs_options.clone(),
            }
        }
        ModeKind::Block => Mode::Block,
    };
    let volume = Volume {
        id,
        path: PathBuf::from("/"),
        size: manifest.size,
        mode,
        enabled: manifest.enabled,
        read_only: manifest.read_only,
        direct_io: registry.config().direct_io,
        preallocated: false,
        name: manifest.name.clone(),
        sector_size: manifest.sector_size,
        origin: None,
        replaces_unit: None,
        encryption: None,
    };
    Ok(volume)
}

/// The image into a new marked file at `temporary`, its checksum
/// verified, then given `volume`'s identity if it is a new one.
fn write_image(
    reader: &mut Reader<impl Read>,
    manifest: &Manifest,
    temporary: &Path,
    exported: &Volume,
    volume: &Volume,
) -> Result<ImageSums> {
    let file = create_marked(temporary, &volume.id)?;
    file.set_len(manifest.size)
        .with_context(|| format!("sizing {}", temporary.display()))?;
    tracing::info!(
        progress = true,
        "writing {} of data",
        format_size(manifest.data_bytes)
    );
    // Around the page cache: the fsync before the rename then finds
    // little left (an import cost the stream plus a whole fsync), and the
    // cost is the disk's, not the page cache's (see the module).
    let written = || format!("writing {}", temporary.display());
    let mut writer = DirectWriter::new(&file, IMAGE_CHUNK).with_context(written)?;
    let sums = reader.image(manifest, |offset, data| {
        writer.write_all_at(data, offset).with_context(written)
    })?;
    writer.finish().with_context(written)?;
    verify_checksum(reader, manifest, &sums.stream)?;
    hooks::crash_at(Crash::ImportAfterData);
    let content = probe(&file)?;
    ensure!(
        exported.identity().is_held_by(&content),
        "the exported image holds {}, not {}",
        content.describe(),
        exported.identity().describe()
    );
    if volume.id != exported.id {
        let consumer_fs = consumer_file_system(&file, exported)?;
        renew_identity(temporary, &file, exported, volume, consumer_fs)?;
    }
    file.sync_all()
        .with_context(|| format!("syncing {}", temporary.display()))?;
    Ok(sums)
}

fn verify_checksum(reader: &mut Reader<impl Read>, manifest: &Manifest, sum: &str) -> Result<()> {
    let recorded = reader.checksum(manifest)?;
    ensure!(
        recorded == sum,
        "the stream's checksum does not match its data (BLAKE3 {sum}, recorded {recorded}): it was damaged on the way; nothing was imported"
    );
    Ok(())
}
