//! `sparse-volume attach U`: the unit's ExecStart, usable by hand.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::Report;

use crate::backing::open_backing_file;
use crate::fsutil::backing_logical_block_size;
use crate::loopdev::sys::{LO_FLAGS_AUTOCLEAR, LO_FLAGS_PARTSCAN, LO_FLAGS_READ_ONLY};
use crate::loopdev::{self, BindOptions, LoopDevice, LoopStatus};
use crate::paths::SystemRoot;
use crate::probe::{probe, require_identity};
use crate::registry::{Registry, Volume};
use crate::udev::{wait_for_link, LinkOutcome};
use crate::volume_id::VolumeId;

#[derive(Debug, Serialize)]
pub struct AttachReport {
    pub changed: bool,
    pub uuid: String,
    pub device: PathBuf,
    /// Block mode: the partition device consumers use.
    pub partition: Option<PathBuf>,
    pub link: PathBuf,
    /// `linked`, or `no-udev` when no udev runs to make the link.
    pub link_state: &'static str,
    pub direct_io: bool,
    pub read_only: bool,
    pub warnings: Vec<String>,
}

impl Report for AttachReport {
    fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }

    fn human(&self) -> String {
        let mut text = if self.changed {
            format!("attached {} as {}", self.uuid, self.device.display())
        } else {
            format!(
                "{} was already attached as {}",
                self.uuid,
                self.device.display()
            )
        };
        if self.link_state == "no-udev" {
            text.push_str(&format!(
                " (udev is not running: not waiting for {})",
                self.link.display()
            ));
        }
        text
    }
}

pub fn attach(root: &SystemRoot, id: &VolumeId) -> Result<AttachReport> {
    let registry = Registry::open(root.clone());
    // The entry is read under the volume lock: a remove holds that lock
    // from its detach until the entry is gone, so an attach waiting here
    // then finds the volume unregistered instead of binding a file that
    // is about to be deleted.
    let _lock = Registry::volume_lock(root, id)?;
    let volume = registry.require(id)?;

    let path = root.host_path(&volume.path);
    let backing = open_backing_file(&path, volume.read_only)?;
    verify_content(&backing, &volume, &path)?;
    let mut warnings = size_warning(&backing, &volume)
        .into_iter()
        .collect::<Vec<_>>();

    let meta = backing.metadata().context("inspecting the backing file")?;
    let existing: Vec<(u32, LoopStatus)> = loopdev::bound_statuses()?
        .into_iter()
        .filter(|(_, status)| status.is_backed_by(meta.dev(), meta.ino()))
        .collect();

    let (number, status, changed) = match existing.split_first() {
        Some(((number, status), duplicates)) => {
            for (other, _) in duplicates {
                warnings.push(format!(
                    "{} is a second loop device for the same file; `sparse-volume check --repair` removes it",
                    LoopDevice::path_of(*other).display()
                ));
            }
            let (status, cancelled) = keep_bound(*number, status, &backing)?;
            if cancelled {
                warnings.push(format!(
                    "{} had a pending detach (another program still holds it open); cancelled it so the device stays attached",
                    LoopDevice::path_of(*number).display()
                ));
            }
            warnings.extend(flag_mismatches(&status, &volume));
            warnings.extend(sector_size_mismatch(*number, &volume));
            (*number, status, cancelled)
        }
        None => {
            // The kernel silently drops direct I/O when the loop device's
            // sectors are smaller than the backing device's; say why.
            let sector_warning = backing_logical_block_size(&path)
                .filter(|_| volume.direct_io)
                .and_then(|backing| sector_size_blocks_direct_io(volume.sector_size, backing));
            let options = BindOptions {
                read_only: volume.read_only,
                partition_scan: volume.mode.is_block(),
                direct_io: volume.direct_io && sector_warning.is_none(),
                block_size: volume.sector_size,
                reference: id.loop_reference(),
            };
            let bound = loopdev::bind_to_free_device(&backing, &options)?;
            if let Some(warning) = sector_warning {
                warnings.push(warning);
            } else if volume.direct_io && !loopdev::uses_direct_io(&bound.status) {
                warnings.push(
                    "the backing file system does not support direct I/O; using buffered I/O"
                        .into(),
                );
            }
            (bound.number, bound.status, true)
        }
    };

    let device = LoopDevice::path_of(number);
    let partition = volume
        .mode
        .is_block()
        .then(|| PathBuf::from(format!("{}p1", device.display())));
    let link = volume.mode.udev_link(id);
    let target = partition.clone().unwrap_or_else(|| device.clone());
    let timeout = registry.config().udev_timeout;
    let link_state = match wait_for_link(&link, &target, timeout) {
        LinkOutcome::Linked => "linked",
        LinkOutcome::NoUdev => "no-udev",
        LinkOutcome::TimedOut { points_to } => bail!(
            "{} is attached, but udev did not point {} at {} within {} s{}",
            device.display(),
            link.display(),
            target.display(),
            timeout.as_secs(),
            points_to.map_or(String::new(), |p| format!(
                " (it points at {})",
                p.display()
            ))
        ),
    };

    Ok(AttachReport {
        changed,
        uuid: id.to_string(),
        device,
        partition,
        link,
        link_state,
        direct_io: loopdev::uses_direct_io(&status),
        read_only: status.has(LO_FLAGS_READ_ONLY),
        warnings,
    })
}

/// The content must carry the volume's UUID: attaching someone else's data
/// under this volume's name would hand it to the wrong consumer. It must
/// also read with the recorded sector size, or consumers would wait for a
/// partition or mount that never comes.
fn verify_content(backing: &File, volume: &Volume, path: &std::path::Path) -> Result<()> {
    let content = probe(backing).with_context(|| format!("reading {}", path.display()))?;
    require_identity(&content, &volume.mode, volume.id.uuid(), path)?;
    if !content.works_with_sector_size(volume.sector_size) {
        bail!(
            "backing file {} holds {}, which does not read with the {}-byte sectors the registry records (sector_size)",
            path.display(),
            content.sector_requirement(),
            volume.sector_size
        );
    }
    Ok(())
}

/// Why direct I/O cannot be used, when the volume's sectors are smaller
/// than those of the device under its backing file.
pub(super) fn sector_size_blocks_direct_io(sector_size: u32, backing: u32) -> Option<String> {
    (sector_size < backing).then(|| {
        format!(
            "direct I/O off: the volume's {sector_size}-byte sectors are smaller than the backing device's {backing}-byte sectors"
        )
    })
}

/// An existing device whose detach is pending would vanish when its last
/// holder closes it: cancel the detach (reported as a change), or refuse
/// to adopt the device.
fn keep_bound(number: u32, status: &LoopStatus, backing: &File) -> Result<(LoopStatus, bool)> {
    if !status.has(LO_FLAGS_AUTOCLEAR) {
        return Ok((status.clone(), false));
    }
    Ok((loopdev::cancel_pending_detach(number, backing)?, true))
}

/// A device bound by an older version or by hand may have other sectors
/// than the volume is made for.
fn sector_size_mismatch(number: u32, volume: &Volume) -> Option<String> {
    let found = LoopDevice::open(number, false)
        .and_then(|device| device.logical_block_size())
        .ok()?;
    (found != volume.sector_size).then(|| {
        format!(
            "the existing loop device has {found}-byte sectors but the volume is made for {}-byte sectors; detach and attach again",
            volume.sector_size
        )
    })
}

fn size_warning(backing: &File, volume: &Volume) -> Option<String> {
    let actual = backing.metadata().ok()?.len();
    (actual != volume.size).then(|| {
        format!(
            "the backing file is {actual} bytes but the registry records {}; `sparse-volume check` reports it",
            volume.size
        )
    })
}

fn flag_mismatches(status: &LoopStatus, volume: &Volume) -> Vec<String> {
    let mut warnings = Vec::new();
    if volume.read_only && !status.has(LO_FLAGS_READ_ONLY) {
        warnings
            .push("the existing loop device is writable although the volume is read-only".into());
    }
    if volume.mode.is_block() && !status.has(LO_FLAGS_PARTSCAN) {
        warnings.push(
            "the existing loop device does not scan partitions; detach and attach again".into(),
        );
    }
    warnings
}
