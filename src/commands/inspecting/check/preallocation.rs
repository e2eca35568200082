//! A preallocated volume's promise, audited: its backing file owns every
//! byte of its size, and no loop device of it passes discards, which the
//! loop driver would turn into hole punches.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use anyhow::{bail, Context, Result};
use nix::fcntl::{fallocate, FallocateFlags};

use crate::commands::inspecting::check::Audit;
use crate::kernel::extents::allocated_bytes;
use crate::kernel::loop_device::{self, forbid_discards, DiscardLimits, LoopDevice};
use crate::registry::{Registry, Volume};
use crate::volume::backing_file::open_backing_file;
use crate::volume::size::format_size;

pub(super) fn audit_preallocation(
    audit: &mut Audit,
    volume: &Volume,
    file: &File,
    path: &Path,
) -> Result<()> {
    let meta = file.metadata().context("inspecting the backing file")?;
    let size = meta.len();
    let identity = (meta.dev(), meta.ino());
    match allocated_bytes(file, size) {
        Ok(allocated) if allocated < size => {
            let missing = size - allocated;
            let root = audit.root.clone();
            audit.repairable(
                "preallocation-holes",
                Some(volume),
                Some(path),
                format!(
                    "{}: {} ({missing} bytes) of its {} are holes although the volume is preallocated; the space was handed back to {}",
                    volume.id,
                    format_size(missing),
                    format_size(size),
                    path.parent().unwrap_or(path).display()
                ),
                || {
                    // The volume lock keeps a resize or remove away while
                    // the file is being filled.
                    let _lock = Registry::volume_lock(&root, &volume.id)?;
                    refill(path, identity, size, missing)
                },
            );
        }
        Ok(_) => {}
        Err(errno) => audit.warn(
            "content-not-verified",
            Some(path),
            format!(
                "{}: the file system cannot tell which parts of {} are allocated ({errno}); preallocation not verified",
                volume.id,
                path.display()
            ),
        ),
    }
    let audit_root = &audit.root.clone();
    for number in loop_device::devices_backed_by(path)? {
        if DiscardLimits::of(number).is_some_and(|limits| limits.passes_discards()) {
            audit.repairable(
                "discards-allowed",
                Some(volume),
                Some(path),
                format!(
                    "{}: /dev/loop{number} passes discards, so a consumer's fstrim punches holes into the preallocated file",
                    volume.id
                ),
                || {
                    // The number may have been released and reused since;
                    // the device lock keeps a new bind away while we look.
                    let _lock = Registry::volume_lock(audit_root, &volume.id)?;
                    let Ok(device) = LoopDevice::open(number, false) else {
                        return Ok(());
                    };
                    let device = device.lock()?;
                    match device.status() {
                        Ok(Some(status)) if status.is_backed_by(identity.0, identity.1) => {
                            forbid_discards(number)
                        }
                        _ => Ok(()),
                    }
                },
            );
        }
    }
    Ok(())
}

/// Allocates the holes again; what was written stays as it is. Only in
/// the file that was audited, and never beyond its size.
fn refill(path: &Path, identity: (u64, u64), size: u64, missing: u64) -> Result<()> {
    let directory = path.parent().unwrap_or(path);
    let stats = nix::sys::statvfs::statvfs(directory)
        .with_context(|| format!("measuring free space of {}", directory.display()))?;
    let free = stats.blocks_available() * stats.fragment_size();
    if free < missing {
        bail!(
            "{} needs {} free but has {}",
            directory.display(),
            format_size(missing),
            format_size(free)
        );
    }
    let file = open_backing_file(path, false)?;
    let meta = file.metadata().context("inspecting the backing file")?;
    if (meta.dev(), meta.ino()) != identity {
        bail!("{} was replaced since it was audited", path.display());
    }
    let length = i64::try_from(size).context("size too large")?;
    fallocate(
        file.as_raw_fd(),
        FallocateFlags::FALLOC_FL_KEEP_SIZE,
        0,
        length,
    )
    .with_context(|| format!("allocating {}", path.display()))?;
    file.sync_all()
        .with_context(|| format!("syncing {}", path.display()))
}
