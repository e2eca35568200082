//! Copying a source's backing file as it was at one instant: by reflink
//! where the storage shares extents (no data copied, in time that grows
//! with the file's extents, and atomic against the source's writers),
//! else by copying its data ranges with the holes kept. A mounted source is frozen for the moment of the copy; the
//! freeze outlives no kill of ours (`kernel::freeze`).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use nix::errno::Errno;

use crate::hooks::{self, Crash};
use crate::kernel::extents::allocated_bytes;
use crate::kernel::file_clone::{copy_keeping_holes, reflink};
use crate::kernel::files::unnamed_file_in;
use crate::kernel::freeze::{self as file_system_freeze, Frozen};
use crate::kernel::holders::mounted_device_numbers_of_loop;
use crate::kernel::loop_device::{self, LoopDevice};
use crate::volume::size::format_size;

/// A reflink takes milliseconds; a freeze that lasts this long means
/// something hangs, and the guardian thaws (the clone then fails).
const REFLINK_FREEZE_LIMIT: Duration = Duration::from_secs(30);
/// `--freeze-during-copy` asked for writers to wait for the whole copy:
/// a minute, and a second per 10 MiB of data, which a copy on the same
/// storage outpaces many times; a copy that takes longer fails (thawed)
/// rather than hold writers for ever.
fn whole_copy_freeze_limit(data_bytes: u64) -> Duration {
    Duration::from_secs(60 + data_bytes / (10 << 20))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Reflink,
    Copy,
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Method::Reflink => "reflink",
            Method::Copy => "copy",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consistency {
    /// No loop device had the source.
    Offline,
    /// Its file system was frozen for the copy.
    Frozen,
    /// In use and not frozen (a block volume, or a file system attached
    /// and not mounted): what a power cut at that instant would leave.
    CrashConsistent,
}

impl Consistency {
    pub fn name(self) -> &'static str {
        match self {
            Consistency::Offline => "offline",
            Consistency::Frozen => "frozen",
            Consistency::CrashConsistent => "crash-consistent",
        }
    }
}

#[derive(Debug)]
pub struct Copied {
    pub method: Method,
    pub consistency: Consistency,
    pub frozen_for: Option<Duration>,
    /// Data bytes written by a copy (0 for a reflink).
    pub copied_bytes: u64,
}

/// Who has the source now: its loop devices, and where they (or their
/// partitions) are mounted.
pub struct InUse {
    devices: Vec<u32>,
    /// The mounted device (`st_rdev`) and where, as this process sees it.
    mounts: Vec<(u64, PathBuf)>,
    /// A device is held (an exclusive open is refused) although nothing
    /// here mounts it: mounted in another mount namespace (a pod's), or
    /// held by another driver. Nothing can be frozen from here.
    pub held_unseen: bool,
}

impl InUse {
    pub fn of(source_path: &Path) -> Result<Self> {
        let devices = loop_device::devices_of_file(source_path)?;
        let mounts: Vec<(u64, PathBuf)> = devices
            .iter()
            .flat_map(|&n| mounted_device_numbers_of_loop(n))
            .collect();
        // The whole disk's exclusive open is refused while it or any of
        // its partitions is claimed.
        let held_unseen = mounts.is_empty()
            && devices
                .iter()
                .any(|&n| LoopDevice::open_exclusive(n).is_err_and(|e| e == Errno::EBUSY));
        Ok(Self {
            devices,
            mounts,
            held_unseen,
        })
    }

    /// A mount point of the source's file system (freezing one freezes
    /// the file system wherever it is mounted).
    pub fn mount_point(&self) -> Option<&Path> {
        self.mounts.first().map(|(_, point)| point.as_path())
    }

    /// Freezes the source's file system, through the first of its mount
    /// points, making sure the path leads to it.
    fn freeze(&self, limit: Duration) -> Result<Option<Frozen>> {
        let Some((device, point)) = self.mounts.first() else {
            return Ok(None);
        };
        tracing::info!(
            progress = true,
            "freezing the file system on {}",
            point.display()
        );
        file_system_freeze::freeze(point, *device, limit)
            .with_context(|| format!("freezing the file system on {}", point.display()))
            .map(Some)
    }

    /// A loop device has the file.
    pub fn attached(&self) -> bool {
        !self.devices.is_empty()
    }

    fn device_names(&self) -> String {
        self.devices
            .iter()
            .map(|n| format!("/dev/loop{n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn consistency(&self, frozen: bool) -> Consistency {
        match (frozen, self.devices.is_empty()) {
            (true, _) => Consistency::Frozen,
            (false, true) => Consistency::Offline,
            (false, false) => Consistency::CrashConsistent,
        }
    }
}

/// Errors of FICLONE that mean "this storage cannot share extents".
fn cannot_share(error: Errno) -> bool {
    matches!(
        error,
        Errno::EOPNOTSUPP | Errno::EXDEV | Errno::EINVAL | Errno::ENOTTY | Errno::EBADF
    )
}

/// Copies `source` into the empty `target`. `before_copy` runs before a
/// copy (not a reflink) takes space: the caller's capacity check.
pub fn copy_consistently(
    source: &File,
    target: &File,
    in_use: &InUse,
    freeze_during_copy: bool,
    before_copy: impl FnOnce() -> Result<()>,
) -> Result<Copied> {
    // Frozen only for a reflink known to work: a first, unfrozen one
    // (constant time) finds out, and is dropped.
    let shares = match reflink(source, target) {
        Ok(()) => true,
        Err(error) if cannot_share(error) => false,
        Err(error) => return Err(error).context("cloning the backing file (FICLONE)"),
    };
    if shares {
        let Some(frozen) = in_use.freeze(REFLINK_FREEZE_LIMIT)? else {
            return Ok(reflinked(in_use, None));
        };
        target
            .set_len(0)
            .context("emptying the copy taken before the freeze")?;
        hooks::crash_at(Crash::CloneWhileFrozen);
        let shared = reflink(source, target);
        let frozen_for = frozen.thaw()?;
        shared.context("cloning the backing file (FICLONE) while frozen")?;
        return Ok(reflinked(in_use, Some(frozen_for)));
    }

    let frozen = match point_to_freeze_for_a_copy(source, in_use, freeze_during_copy)? {
        Some(_) => in_use.freeze(whole_copy_freeze_limit(allocated_bytes_of(source)?))?,
        None => None,
    };
    if frozen.is_some() {
        hooks::crash_at(Crash::CloneWhileFrozen);
    }
    let copied = before_copy().and_then(|()| copy_keeping_holes(source, target));
    let frozen_for = frozen.map(Frozen::thaw).transpose()?;
    Ok(Copied {
        method: Method::Copy,
        consistency: in_use.consistency(frozen_for.is_some()),
        frozen_for,
        copied_bytes: copied.context("copying the backing file")?,
    })
}

/// What [`copy_consistently`] would do, doing nothing: the reflink is
/// tried into a file without a name, which vanishes.
pub fn plan(
    source: &File,
    source_path: &Path,
    in_use: &InUse,
    freeze_during_copy: bool,
) -> Result<Copied> {
    let unnamed = unnamed_file_beside(source_path)?;
    let shares = match reflink(source, &unnamed) {
        Ok(()) => true,
        Err(error) if cannot_share(error) => false,
        Err(error) => return Err(error).context("trying a clone of the backing file (FICLONE)"),
    };
    if shares {
        return Ok(Copied {
            method: Method::Reflink,
            consistency: in_use.consistency(in_use.mount_point().is_some()),
            frozen_for: None,
            copied_bytes: 0,
        });
    }
    let frozen = point_to_freeze_for_a_copy(source, in_use, freeze_during_copy)?.is_some();
    Ok(Copied {
        method: Method::Copy,
        consistency: in_use.consistency(frozen),
        frozen_for: None,
        copied_bytes: 0,
    })
}

/// A file without a name in `path`'s directory (on its file system, so a
/// reflink to it can work), which vanishes when closed, whatever happens.
pub fn unnamed_file_beside(path: &Path) -> Result<File> {
    let directory = path
        .parent()
        .context("the backing file path has no directory")?;
    unnamed_file_in(directory)
}

/// A copy of a source in use is consistent only while its file system is
/// frozen for the whole copy, which the operator must ask for: where to
/// freeze, None for a source nothing has, or the refusal.
fn point_to_freeze_for_a_copy<'a>(
    source: &File,
    in_use: &'a InUse,
    freeze_during_copy: bool,
) -> Result<Option<&'a Path>> {
    if in_use.devices.is_empty() {
        return Ok(None);
    }
    match in_use.mount_point() {
        Some(point) if freeze_during_copy => Ok(Some(point)),
        Some(point) => bail!(
            "the storage cannot share extents (no reflink: ext4, or xfs made without reflink), so {} of data must be copied, and the file system is mounted on {}: a copy while it is written would not be consistent; add --freeze-during-copy to freeze it for the whole copy (its writers wait until the copy ends), or unmount and detach it first",
            format_size(allocated_bytes_of(source)?),
            point.display()
        ),
        None => bail!(
            "the storage cannot share extents (no reflink: ext4, or xfs made without reflink), and the volume is attached ({}) but not mounted: a copy of a device in use is consistent only by reflink; detach it first",
            in_use.device_names()
        ),
    }
}

fn reflinked(in_use: &InUse, frozen_for: Option<Duration>) -> Copied {
    Copied {
        method: Method::Reflink,
        consistency: in_use.consistency(frozen_for.is_some()),
        frozen_for,
        copied_bytes: 0,
    }
}

fn allocated_bytes_of(file: &File) -> Result<u64> {
    let size = file.metadata()?.len();
    Ok(allocated_bytes(file, size)?)
}
