//! `sparse-volume resize U --size S`: grow only. The new size reaches the
//! registry last, after the file, the loop device, the partition and the
//! file system all grew, so the registry never records a size that was
//! not applied. An interrupted resize is finished by running it again.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::commands::report::{Failure, Outcome, Report};
use crate::engine::capacity;
use crate::engine::detach::detach_device;
use crate::engine::encryption::mapping_name;
use crate::hooks::{self, Crash};
use crate::kernel::capabilities::{has_effective, CAP_SYS_ADMIN, CAP_SYS_RESOURCE};
use crate::kernel::dm_crypt;
use crate::kernel::holders::{mounts_of_device, mounts_of_loop};
use crate::kernel::loop_device::{self, BindOptions, LoopDevice};
use crate::registry::paths::SystemRoot;
use crate::registry::run_dir;
use crate::registry::{check_size, Registry, Volume};
use crate::volume::backing_file::{allocate, open_backing_file};
use crate::volume::filesystem::{
    grow_mounted_ext4, grow_mounted_xfs, grow_unmounted_ext4, grow_unmounted_xfs,
};
use crate::volume::gpt_layout;
use crate::volume::growing_mark::clear_growing_mark;
use crate::volume::id::VolumeId;
use crate::volume::size::format_size;
use crate::volume::size::round_up_to_mib;
use crate::volume::spec::{FsType, Mode};

#[derive(Debug, Serialize)]
pub struct ResizeReport {
    pub changed: bool,
    pub uuid: String,
    pub old_size: u64,
    pub size: u64,
    /// Loop devices whose capacity was refreshed.
    pub devices: Vec<String>,
}

impl Report for ResizeReport {
    fn human(&self) -> String {
        if self.changed {
            format!(
                "grew {} from {} to {}",
                self.uuid,
                format_size(self.old_size),
                format_size(self.size)
            )
        } else {
            format!("{} already has {}", self.uuid, format_size(self.size))
        }
    }

    fn planned(&self) -> String {
        if !self.changed {
            return self.human();
        }
        format!(
            "would grow {} from {} to {}",
            self.uuid,
            format_size(self.old_size),
            format_size(self.size)
        )
    }
}

/// With `dry_run`, every check runs (under the same locks) and nothing
/// grows.
pub fn resize(
    registry: &Registry,
    id: &VolumeId,
    requested: u64,
    dry_run: bool,
) -> Outcome<ResizeReport> {
    grow(registry, id, requested, dry_run).map_err(|error| {
        if error.is::<PartlyGrown>() {
            Failure::PartlyApplied {
                uuid: *id,
                actions: vec![PartlyGrown::ACTION.into()],
                error,
            }
        } else {
            Failure::Unchanged(error)
        }
    })
}

/// A grow that failed after the backing file (and its loop device) grew:
/// what is left, and the command that finishes it.
#[derive(Debug)]
pub struct PartlyGrown {
    message: String,
}

impl PartlyGrown {
    /// In the words of `apply`'s actions.
    pub const ACTION: &'static str = "resize (the backing file only)";

    fn new(error: &anyhow::Error, id: &VolumeId, old_size: u64, size: u64) -> Self {
        Self {
            message: format!(
                "{error:#}; the backing file now has {new}, while the registry (and perhaps the file system or partition) still has {old}: `sparse-volume resize {id} --size {arg}` finishes the grow (if a mounted file system refuses to grow, unmount it first: it then grows offline)",
                new = format_size(size),
                old = format_size(old_size),
                arg = size_argument(size),
            ),
        }
    }
}

impl std::fmt::Display for PartlyGrown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for PartlyGrown {}

/// A size as `--size` takes it back: whole GiB or MiB (sizes are whole
/// MiB), else bytes.
fn size_argument(size: u64) -> String {
    match size {
        s if s % (1 << 30) == 0 => format!("{}G", s >> 30),
        s if s % (1 << 20) == 0 => format!("{}M", s >> 20),
        s => s.to_string(),
    }
}

/// [`resize`] as a step of `apply`.
pub fn grow(
    registry: &Registry,
    id: &VolumeId,
    requested: u64,
    dry_run: bool,
) -> Result<ResizeReport> {
    let root = registry.root();
    let size = round_up_to_mib(requested)?;
    check_size(size).map_err(anyhow::Error::msg)?;
    let _lock = registry.lock()?;
    // Lock order registry → volume, as everywhere: no attach, detach or
    // repair touches the file or its device while it grows (an offline
    // e2fsck/resize2fs, or the temporary xfs device, must not race them).
    let _volume_lock = Registry::volume_lock(root, id)?;
    let mut volume = registry.require(id)?;
    let old_size = volume.size;
    if size < old_size {
        bail!(
            "shrinking is not supported ({} is smaller than the current {}); data would be lost",
            format_size(size),
            format_size(old_size)
        );
    }
    let report = |changed, devices| ResizeReport {
        changed,
        uuid: id.to_string(),
        old_size,
        size,
        devices,
    };
    if size == old_size {
        return Ok(report(false, Vec::new()));
    }
    if volume.read_only {
        bail!("the volume is read-only; make it writable before growing it");
    }

    let host_path = root.host_path(&volume.path);
    let file = open_backing_file(&host_path, false)?;
    let directory = host_path
        .parent()
        .context("the backing file has no directory")?;
    let allocated = file.metadata()?.blocks() * 512;
    let capacity = capacity::measure(registry, directory, Some(id))?;
    capacity::ensure_fits(&capacity, size.saturating_sub(allocated), directory)?;

    // Grown through one device while a consumer has it mounted through
    // another, e2fsck and an offline resize2fs would write to a live file
    // system; and the kernel would then write its old size back.
    let devices = loop_device::devices_backed_by(&host_path)?;
    if devices.len() > 1 {
        bail!(
            "the backing file is attached through {} loop devices ({}); `sparse-volume check --repair` removes the extra ones, then resize again",
            devices.len(),
            devices
                .iter()
                .map(|&n| LoopDevice::path_of(n).display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }

    let fs_device = file_system_device(&volume, &devices)?;
    refuse_what_would_fail_half_way(&volume, fs_device.as_ref())?;

    if dry_run {
        return Ok(report(true, device_paths(&devices)));
    }
    if file.metadata()?.len() < size {
        tracing::info!(
            progress = true,
            "growing the backing file to {}",
            format_size(size)
        );
        allocate(&file, size, volume.preallocated)?;
    }
    // From here on the file is larger than the registry says: a failure
    // says what is left and how to finish it.
    let finished = (|| {
        file.sync_all().context("syncing the grown backing file")?;
        hooks::crash_at(Crash::ResizeAfterFile);
        grow_what_the_file_holds(
            root,
            &volume,
            &file,
            &host_path,
            &devices,
            fs_device.as_ref(),
        )?;
        hooks::crash_at(Crash::ResizeBeforeRegistry);
        volume.size = size;
        registry.put(&volume)
    })();
    finished.map_err(|error| anyhow::Error::new(PartlyGrown::new(&error, id, old_size, size)))?;
    Ok(report(true, device_paths(&devices)))
}

/// The loop device's capacity, then the partition or file system, once
/// the backing file has grown.
fn grow_what_the_file_holds(
    root: &SystemRoot,
    volume: &Volume,
    file: &File,
    host_path: &Path,
    devices: &[u32],
    fs_device: Option<&FileSystemDevice>,
) -> Result<()> {
    for &number in devices {
        LoopDevice::open(number, false)?.refresh_capacity()?;
        // Older kernels recompute the discard limit when the capacity
        // changes; a preallocated volume must keep refusing discards.
        if volume.preallocated {
            loop_device::forbid_discards(number)?;
        }
    }
    // The mapping grows to the end of what holds it: the loop device, or
    // in block mode the partition, once that has grown.
    let grow_mapping = || -> Result<()> {
        match (&volume.encryption, fs_device) {
            (Some(encryption), Some(_)) => {
                tracing::info!(progress = true, "growing the encrypted mapping");
                dm_crypt::resize(
                    &mapping_name(&volume.id),
                    &root.host_path(&encryption.key_file),
                )
            }
            _ => Ok(()),
        }
    };
    match &volume.mode {
        Mode::Block => {
            tracing::info!(progress = true, "growing the partition");
            grow_partition(file, volume, devices)?;
            grow_mapping()
        }
        Mode::Filesystem { fs_type, .. } => {
            grow_mapping()?;
            tracing::info!(progress = true, "growing the {fs_type} file system");
            grow_filesystem(root, volume, *fs_type, file, host_path, fs_device)
        }
    }
}

/// A file system tool that the kernel will refuse leaves the file grown
/// and the file system not: said before anything grows (and in the dry
/// run), with the way that works.
fn refuse_what_would_fail_half_way(
    volume: &Volume,
    fs_device: Option<&FileSystemDevice>,
) -> Result<()> {
    let Mode::Filesystem { fs_type, .. } = &volume.mode else {
        return Ok(());
    };
    let mounted = fs_device.and_then(|d| d.mounted.clone());
    match (fs_type, mounted) {
        (FsType::Ext4, Some(point)) if !has_effective(CAP_SYS_RESOURCE) => bail!(
            "the ext4 mounted on {} grows online through the kernel, which asks for CAP_SYS_RESOURCE, and this process lacks it (a container?); nothing was changed: unmount it and run the command again (it then grows offline), or run it with that capability",
            point.display()
        ),
        (FsType::Xfs, _) if !has_effective(CAP_SYS_ADMIN) => bail!(
            "xfs grows only while mounted, which asks for CAP_SYS_ADMIN, and this process lacks it (a container?); nothing was changed: run the command where it has that capability"
        ),
        _ => Ok(()),
    }
}

fn device_paths(devices: &[u32]) -> Vec<String> {
    devices
        .iter()
        .map(|&n| LoopDevice::path_of(n).display().to_string())
        .collect()
}

fn grow_partition(file: &File, volume: &Volume, devices: &[u32]) -> Result<()> {
    let extent = gpt_layout::grow_to_end(file, volume.id.uuid(), volume.sector_size)?;
    // The loop device may read the file with direct I/O: the new table
    // must be on disk, not only in the page cache, before the kernel uses it.
    file.sync_all().context("syncing the partition table")?;
    for &number in devices {
        // The table was rewritten behind the device's back: while anyone
        // holds the device open, its page cache still has the old one.
        LoopDevice::open(number, false)?.flush_buffers()?;
        // Kernels without partition support never made the partition.
        if Path::new(&format!("/sys/block/loop{number}/loop{number}p1")).exists() {
            LoopDevice::open(number, false)?.resize_partition(
                1,
                extent.start_bytes(),
                extent.length_bytes(),
            )?;
        }
    }
    Ok(())
}

/// The device a filesystem-mode volume's file system is read through, and
/// where it is mounted: the loop device, or an encrypted volume's mapping
/// over it.
struct FileSystemDevice {
    path: PathBuf,
    mounted: Option<PathBuf>,
}

/// None for a volume that is not attached. An encrypted volume grows only
/// attached and open (its file system is inside the mapping): refused
/// before anything changes otherwise.
fn file_system_device(volume: &Volume, devices: &[u32]) -> Result<Option<FileSystemDevice>> {
    let Some(&number) = devices.first() else {
        // A detached encrypted block volume grows like a plain one: its
        // mapping takes the partition's new size when it is next opened.
        if volume.encryption.is_some() && !volume.mode.is_block() {
            bail!(
                "volume {} is encrypted and grows only while attached (its file system is inside the opened mapping); nothing was changed: attach it, then resize again",
                volume.id
            );
        }
        return Ok(None);
    };
    if volume.encryption.is_none() {
        return Ok(Some(FileSystemDevice {
            path: LoopDevice::path_of(number),
            mounted: mounts_of_loop(number)
                .into_iter()
                .next()
                .map(|(_, point)| point),
        }));
    }
    let name = mapping_name(&volume.id);
    let Some(kernel_name) = dm_crypt::mapping_on_loop(number, &name) else {
        bail!(
            "volume {} is encrypted and its mapping {name} is not open on /dev/loop{number}; nothing was changed: attach it (which opens it), then resize again",
            volume.id
        );
    };
    Ok(Some(FileSystemDevice {
        path: dm_crypt::mapper_path(&name),
        mounted: mounts_of_device(&kernel_name).into_iter().next(),
    }))
}

fn grow_filesystem(
    root: &SystemRoot,
    volume: &Volume,
    fs_type: FsType,
    file: &File,
    host_path: &Path,
    fs_device: Option<&FileSystemDevice>,
) -> Result<()> {
    let mounted = fs_device.and_then(|d| d.mounted.clone());
    match (fs_type, fs_device, mounted) {
        (FsType::Ext4, Some(device), Some(_)) => {
            grow_mounted_ext4(&device.path)?;
            // The kernel grew it whole: an old mark vouches for nothing now.
            clear_growing_mark(file)
        }
        (FsType::Ext4, Some(device), None) => grow_unmounted_ext4(&device.path, file),
        (FsType::Ext4, None, _) => grow_unmounted_ext4(host_path, file),
        (FsType::Xfs, _, Some(point)) => grow_mounted_xfs(&point),
        (FsType::Xfs, Some(device), None) => grow_xfs_privately_mounted(root, &device.path),
        (FsType::Xfs, None, None) => {
            // xfs grows only while mounted: attach for the duration.
            let bound = loop_device::bind_to_free_device(
                file,
                &BindOptions {
                    read_only: false,
                    partition_scan: false,
                    direct_io: false,
                    block_size: volume.sector_size,
                    reference: volume.id.loop_reference(),
                    discard: !volume.preallocated,
                },
            )?;
            // Read while bound: a preallocated volume's device refuses
            // discards, and the number must not keep that once released.
            let discard_limits = loop_device::DiscardLimits::of(bound.number);
            // Killed from here on, this process must not leave the file
            // attached: the last close (ours, or that of the grow's
            // private mount) releases the device.
            let grown =
                loop_device::release_at_last_close(bound.number, file).and_then(|_holder| {
                    hooks::crash_at(Crash::ResizeXfsDeviceBound);
                    grow_xfs_privately_mounted(root, &LoopDevice::path_of(bound.number))
                });
            // Usually the release came first and detach finds nothing
            // left to do, nor to renew.
            let detached = detach_device(bound.number, bound.status.backing());
            let renewed = loop_device::renew_if_discards_left_off(bound.number, discard_limits);
            grown.and(detached).and(renewed)
        }
    }
}

/// The mount point is shared by every grow and never removed: each mount
/// lives in its own tool's mount namespace (mkfs::grow_unmounted_xfs).
fn grow_xfs_privately_mounted(root: &SystemRoot, device: &Path) -> Result<()> {
    let mount_point = run_dir::ensure(root)?.join("grow");
    std::fs::create_dir_all(&mount_point)
        .with_context(|| format!("creating {}", mount_point.display()))?;
    grow_unmounted_xfs(device, &mount_point)
}
