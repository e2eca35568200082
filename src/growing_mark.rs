//! The "being grown" mark on a backing file: an extended attribute set,
//! durably, before an offline grow of its ext4 file system and removed
//! after it. resize2fs is not atomic: killed part way, it leaves a file
//! system that `e2fsck -p` will not repair unattended (exit 4, "Resize
//! inode not valid"). The mark tells the next resize that the damage is
//! its own unfinished grow, which `e2fsck -y` repairs, rather than damage
//! of unknown origin, which no one should repair unattended.

use std::fs::File;

use anyhow::{Context, Result};

pub const GROWING_MARK: &str = "user.sparse-volume.growing";

pub fn has_growing_mark(file: &File) -> bool {
    matches!(xattr::FileExt::get_xattr(file, GROWING_MARK), Ok(Some(_)))
}

/// Marks the file and makes the mark durable. Without user xattrs on the
/// storage file system the grow goes on unmarked: an interrupted one then
/// needs the e2fsck that the error message names.
pub fn set_growing_mark(file: &File) -> Result<()> {
    if let Err(e) = xattr::FileExt::set_xattr(file, GROWING_MARK, b"1") {
        tracing::debug!("cannot mark the backing file as being grown: {e}");
        return Ok(());
    }
    file.sync_all().context("syncing the growing mark")
}

pub fn clear_growing_mark(file: &File) -> Result<()> {
    match xattr::FileExt::remove_xattr(file, GROWING_MARK) {
        Ok(()) => file.sync_all().context("syncing the cleared growing mark"),
        Err(e) if e.raw_os_error() == Some(libc::ENODATA) => Ok(()),
        Err(e) => Err(e).context("clearing the growing mark"),
    }
}
