//! `sparse-volume export VOLUME [--output FILE|-]`: the volume as one
//! stream (`volume::archive`: a tar that standard tools read), holes
//! never in it, from one instant of the volume, with its spec and a
//! checksum. `import` is the other end.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::commands::provisioning::clone::copy::{copy_consistently, unnamed_file_beside, InUse};
use crate::commands::report::{Failure, Outcome, Report};
use crate::engine::capacity;
use crate::engine::encryption::refuse_if_encrypted;
use crate::kernel::file_clone::data_ranges;
use crate::kernel::file_clone::reflink;
use crate::kernel::files::{name_unnamed, unnamed_file_in, ExclusiveLock, WriteBehind};
use crate::registry::{Registry, Volume};
use crate::volume::archive::{Manifest, Writer, FORMAT, VERSION};
use crate::volume::backing_file::open_backing_file;
use crate::volume::id::VolumeId;
use crate::volume::probe::probe;
use crate::volume::size::format_size;
use crate::volume::spec::Mode;

#[derive(Debug, Clone)]
pub struct ExportRequest {
    pub volume: VolumeId,
    /// None: standard output.
    pub output: Option<PathBuf>,
    /// Where the storage cannot share extents, freeze a mounted volume for
    /// the whole copy the export is made from.
    pub freeze_during_copy: bool,
}

#[derive(Debug, Serialize)]
pub struct ExportReport {
    pub changed: bool,
    pub uuid: String,
    /// The file written, or `-` for standard output.
    pub output: String,
    pub size: u64,
    pub data_bytes: u64,
    /// The stream's checksum (BLAKE3), as its last member.
    pub blake3: String,
    /// `offline`, `frozen` or `crash-consistent` (as for a clone).
    pub consistency: &'static str,
}

impl Report for ExportReport {
    fn human(&self) -> String {
        format!(
            "exported {} ({}, {} of data, {}) to {}",
            self.uuid,
            format_size(self.size),
            format_size(self.data_bytes),
            self.consistency,
            self.output
        )
    }
}

pub fn export(registry: &Registry, request: &ExportRequest) -> Outcome<ExportReport> {
    write_export(registry, request).map_err(Failure::Unchanged)
}

fn write_export(registry: &Registry, request: &ExportRequest) -> Result<ExportReport> {
    let (image, consistency, lock) = instant_of(registry, request)?;
    let manifest_of = |data_bytes| manifest(&image.volume, data_bytes, consistency);
    let report = match &request.output {
        None => {
            let stdout = std::io::stdout().lock();
            stream(&image.file, manifest_of, stdout, "-".into(), consistency)
        }
        Some(output) => to_file(&image.file, manifest_of, output, consistency),
    };
    drop(lock);
    report
}

/// The volume, and the file that holds the instant to export.
struct Image {
    volume: Volume,
    file: File,
}

/// The instant the export is of: a reflink taken for it (frozen for that
/// moment when mounted), or a copy made while the file system stays
/// frozen (`--freeze-during-copy`), both without a name, so that the
/// volume's lock is free again for the long writing; or, for a volume
/// nothing attaches on storage without reflink, its own file, read under
/// its lock (an attach waits meanwhile). Returns that lock when it is
/// still needed.
fn instant_of(
    registry: &Registry,
    request: &ExportRequest,
) -> Result<(Image, &'static str, Option<ExclusiveLock>)> {
    // Lock order: the registry (the copy's space is weighed against the
    // other volumes'), then the volume (no resize, attach or detach while
    // the instant is taken).
    let registry_lock = registry.lock()?;
    let volume = registry.require(&request.volume)?;
    refuse_if_encrypted(&volume, "export")?;
    let path = registry.root().host_path(&volume.path);
    let lock = Registry::volume_lock(registry.root(), &volume.id)?;
    let file = open_backing_file(&path, true)?;
    let content = probe(&file)?;
    if !volume.identity().is_held_by(&content) {
        bail!(
            "{} holds {}, not {}; not exporting it",
            path.display(),
            content.describe(),
            volume.identity().describe()
        );
    }
    if file.metadata()?.len() != volume.size {
        bail!(
            "{} is not {} bytes long, as registered: an interrupted resize; finish it first",
            path.display(),
            volume.size
        );
    }
    let in_use = InUse::of(&path)?;
    let snapshot = unnamed_file_beside(&path)?;
    if !in_use.attached() {
        return match reflink(&file, &snapshot) {
            Ok(()) => Ok((image(volume, snapshot), "offline", None)),
            Err(_) => Ok((image(volume, file), "offline", Some(lock))),
        };
    }
    // While the export is written, the source's writes to what the
    // instant shares (or the copy itself) take space: as much as the
    // volume holds, weighed as a new volume would be.
    let capacity = capacity::measure(registry, &path, Some(&volume.id))?;
    let held = file.metadata()?.blocks() * 512;
    capacity::ensure_fits(&capacity, held, &path)
        .context("the export's instant would need that space while it is written")?;
    let copied = copy_consistently(
        &file,
        &snapshot,
        &in_use,
        request.freeze_during_copy,
        || Ok(()),
    )?;
    drop((lock, registry_lock));
    Ok((image(volume, snapshot), copied.consistency.name(), None))
}

fn image(volume: Volume, file: File) -> Image {
    Image { volume, file }
}

fn manifest(volume: &Volume, data_bytes: u64, consistency: &str) -> Manifest {
    let (fs_type, mkfs_options) = match &volume.mode {
        Mode::Filesystem {
            fs_type,
            mkfs_options,
        } => (Some(fs_type.to_string()), mkfs_options.clone()),
        Mode::Block => (None, Vec::new()),
    };
    Manifest {
        format: FORMAT.into(),
        version: VERSION,
        uuid: volume.id.to_string(),
        name: volume.name.clone(),
        mode: volume.mode.name().into(),
        fs_type,
        mkfs_options,
        size: volume.size,
        sector_size: volume.sector_size,
        read_only: volume.read_only,
        enabled: volume.enabled,
        consistency: consistency.into(),
        data_bytes,
    }
}

/// The stream of `image` to `out`.
fn stream(
    image: &File,
    manifest_of: impl Fn(u64) -> Manifest,
    out: impl Write,
    output: String,
    consistency: &'static str,
) -> Result<ExportReport> {
    let size = image.metadata()?.len();
    let ranges = data_ranges(image, size)?;
    let manifest = manifest_of(ranges.iter().map(|(_, length)| length).sum());
    let mut writer = Writer::new(std::io::BufWriter::with_capacity(1 << 20, out));
    writer.manifest(&manifest)?;
    let blake3 = writer.image(&manifest, &ranges, |offset, buffer| {
        image.read_exact_at(buffer, offset)
    })?;
    writer
        .finish(&manifest, &blake3)?
        .flush()
        .context("writing the export")?;
    Ok(ExportReport {
        changed: false,
        uuid: manifest.uuid,
        output,
        size: manifest.size,
        data_bytes: manifest.data_bytes,
        blake3,
        consistency,
    })
}

/// Written to a file without a name in `output`'s directory and named
/// only when complete: a file named `output` is always a whole export,
/// and an interrupted export leaves nothing. An existing one is not
/// replaced.
fn to_file(
    image: &File,
    manifest_of: impl Fn(u64) -> Manifest,
    output: &Path,
    consistency: &'static str,
) -> Result<ExportReport> {
    if output.exists() {
        bail!("{} exists; export never replaces a file", output.display());
    }
    let directory = match output.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let unnamed = unnamed_file_in(directory)?;
    let report = stream(
        image,
        manifest_of,
        WriteBehind::new(&unnamed),
        output.display().to_string(),
        consistency,
    )?;
    unnamed
        .sync_all()
        .with_context(|| format!("syncing the export to {}", output.display()))?;
    name_unnamed(&unnamed, output)?;
    Ok(report)
}
