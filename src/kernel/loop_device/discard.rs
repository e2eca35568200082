//! Whether a loop device passes discards (`fstrim`, `blkdiscard`) on to its
//! backing file, where the loop driver turns them into hole punches.
//!
//! A preallocated volume must keep its space, so its device gets a discard
//! limit of 0 through sysfs. Since 6.x kernels keep that limit on the
//! device number after the device is detached, and refuse to raise it
//! again, a device that carries it is deleted (`LOOP_CTL_REMOVE`) when it
//! is detached, and a sparse volume that lands on such a device anyway
//! (detached by another tool, or by a crash) is moved to another one.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use nix::errno::Errno;

use super::device::LockedControl;
use crate::kernel::sysfs::read_number;

fn queue_file(number: u32, name: &str) -> PathBuf {
    PathBuf::from(format!("/sys/block/loop{number}/queue/{name}"))
}

fn read_limit(number: u32, name: &str) -> Option<u64> {
    read_number(&queue_file(number, name))
}

/// Discard limits of a device, in bytes: what it accepts now, and what
/// its backing file could take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiscardLimits {
    pub max_bytes: u64,
    pub hardware_max_bytes: u64,
}

impl DiscardLimits {
    pub fn of(number: u32) -> Option<Self> {
        Some(Self {
            max_bytes: read_limit(number, "discard_max_bytes")?,
            hardware_max_bytes: read_limit(number, "discard_max_hw_bytes")?,
        })
    }

    /// Discards would reach the backing file.
    pub fn passes_discards(&self) -> bool {
        self.max_bytes > 0
    }

    /// Someone turned discards off although the backing file takes them:
    /// the limit a preallocated volume leaves behind.
    pub fn turned_off(&self) -> bool {
        self.max_bytes == 0 && self.hardware_max_bytes > 0
    }
}

/// Makes the device refuse discards, and reads back that it does.
pub fn forbid_discards(number: u32) -> Result<()> {
    let file = queue_file(number, "discard_max_bytes");
    std::fs::write(&file, "0").with_context(|| {
        format!(
            "turning discards off on /dev/loop{number} (writing 0 to {})",
            file.display()
        )
    })?;
    match DiscardLimits::of(number) {
        Some(limits) if !limits.passes_discards() => Ok(()),
        found => bail!(
            "/dev/loop{number} still accepts discards after writing 0 to {} ({found:?})",
            file.display()
        ),
    }
}

/// Deletes a device that was just released, so its number comes back with
/// the kernel's default discard limit. udev may still hold it open for a
/// moment; if it never lets go, the next bind moves on or lands here again.
pub(super) fn renew_device(control: &LockedControl, number: u32) {
    for _ in 0..40 {
        // Bound again meanwhile: someone else's device now, which the
        // kernel would refuse to delete for as long as it stays bound.
        if Path::new(&format!("/sys/block/loop{number}/loop")).exists() {
            return;
        }
        match control.remove(number) {
            Ok(()) | Err(Errno::ENODEV | Errno::ENXIO | Errno::ENOENT) => return,
            Err(_) => std::thread::sleep(Duration::from_millis(25)),
        }
    }
    tracing::debug!("could not delete /dev/loop{number} to renew its discard limit");
}

/// After detaching a device whose discards were turned off: delete it, so
/// that whatever binds that number next (also `losetup`) gets discards.
pub fn renew_if_discards_left_off(number: u32, limits_before: Option<DiscardLimits>) -> Result<()> {
    if !limits_before.is_some_and(|limits| limits.turned_off()) {
        return Ok(());
    }
    let control = LockedControl::acquire()?;
    // Asked again under the lock: a number already renewed (by detach) and
    // handed out again has the default limit, and is left alone.
    if DiscardLimits::of(number).is_some_and(|limits| limits.turned_off()) {
        renew_device(&control, number);
    }
    Ok(())
}
