//! The "being grown" mark on a backing file: an extended attribute set,
//! durably, right before an offline resize2fs of its ext4 file system and
//! removed after it. resize2fs is not atomic: killed part way, it leaves a
//! file system that `e2fsck -p` does not repair unattended (exit 4,
//! "Resize inode not valid"). The mark tells the next resize that this
//! damage is its own unfinished grow, which `e2fsck -y` repairs, rather
//! than damage of unknown origin, which no one should repair unattended.
//!
//! The mark holds the file system's last mount time as it was when the
//! grow began. Once the file system has been mounted since (attached and
//! used with the damage in it), the times differ and the mark no longer
//! vouches for anything.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use anyhow::{Context, Result};

pub const GROWING_MARK: &str = "user.sparse-volume.growing";

/// Where ext4 keeps the last mount time: `s_mtime` (low 32 bits) and
/// `s_mtime_hi` (the next 8), in the superblock at byte 1024.
const S_MTIME: u64 = 1024 + 0x2C;
const S_MTIME_HI: u64 = 1024 + 0x274;

/// The last mount time recorded in the ext4 superblock on `target`.
pub fn last_mount_time(target: &Path) -> Result<u64> {
    let device = File::open(target).with_context(|| format!("opening {}", target.display()))?;
    let mut low = [0u8; 4];
    let mut high = [0u8; 1];
    device
        .read_exact_at(&mut low, S_MTIME)
        .and_then(|()| device.read_exact_at(&mut high, S_MTIME_HI))
        .with_context(|| format!("reading the ext4 superblock of {}", target.display()))?;
    Ok(u64::from(u32::from_le_bytes(low)) | u64::from(high[0]) << 32)
}

/// Whether `file` carries the mark of a grow that began when the file
/// system's last mount time was `last_mount`.
pub fn interrupted_grow(file: &File, last_mount: u64) -> bool {
    matches!(
        xattr::FileExt::get_xattr(file, GROWING_MARK),
        Ok(Some(value)) if value == last_mount.to_string().as_bytes()
    )
}

/// Marks the file and makes the mark durable. Without user xattrs on the
/// storage file system the grow goes on unmarked: an interrupted one then
/// needs the e2fsck that the error message names.
pub fn set_growing_mark(file: &File, last_mount: u64) -> Result<()> {
    if let Err(e) = xattr::FileExt::set_xattr(file, GROWING_MARK, last_mount.to_string().as_bytes())
    {
        tracing::debug!("cannot mark the backing file as being grown: {e}");
        return Ok(());
    }
    file.sync_all().context("syncing the growing mark")
}

pub fn clear_growing_mark(file: &File) -> Result<()> {
    match xattr::FileExt::remove_xattr(file, GROWING_MARK) {
        Ok(()) => file.sync_all().context("syncing the cleared growing mark"),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENODATA) | Some(libc::ENOTSUP)) => Ok(()),
        Err(e) => Err(e).context("clearing the growing mark"),
    }
}
