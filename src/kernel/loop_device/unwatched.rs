//! Opening a loop device for writing without udev re-reading its
//! partition table when we close it.
//!
//! udev watches `/dev/loopN` with inotify for `IN_CLOSE_WRITE`
//! (60-block.rules, `OPTIONS+="watch"`). When a writer closes the node,
//! systemd-udevd (252: `on_inotify` → `synthesize_change` →
//! `blockdev_reread_partition_table`) takes the disk's BSD lock, which our
//! close has just released, and issues `BLKRRPART`: the kernel drops and
//! re-adds `loopNp1` while a consumer (fsck, mount) may already have
//! started on the first one, and that consumer fails.
//!
//! The kernel reports a close on the inode that was opened, and udev
//! watches only the one in `/dev`. A second node of the same device, made
//! in a private directory and unlinked as soon as it is open, lets us
//! configure the device and close it without that event.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use nix::sys::stat::{mknod, Mode, SFlag};

/// Where the private node is made: device nodes work on devtmpfs, while
/// `/run` and `/tmp` are often mounted `nodev`. The directory exists for
/// the few microseconds between `mknod` and `open`.
const PARENT: &str = "/dev";

/// Opens the device behind `node` (an open `/dev/loopN`) for reading and
/// writing through a private node, so that closing it does not wake udev's
/// watch on `/dev/loopN`.
pub fn open_read_write(node: &File) -> Result<File> {
    let meta = node.metadata().context("inspecting the device node")?;
    let kind = if meta.file_type().is_block_device() {
        SFlag::S_IFBLK
    } else if meta.file_type().is_char_device() {
        SFlag::S_IFCHR
    } else {
        anyhow::bail!("not a device node");
    };
    open_in(Path::new(PARENT), kind, meta.rdev())
}

/// A directory made for the node (mode 0700, by `mkdtemp`), removed when
/// dropped: it holds nothing by then, so one `rmdir` does, where a
/// recursive removal would list it first.
struct PrivateDirectory(PathBuf);

impl PrivateDirectory {
    fn new(parent: &Path) -> Result<Self> {
        let template = parent.join(".sparse-volume-XXXXXX");
        nix::unistd::mkdtemp(&template)
            .map(Self)
            .with_context(|| format!("creating a private directory in {}", parent.display()))
    }
}

impl Drop for PrivateDirectory {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir(&self.0) {
            tracing::warn!("removing {}: {e}", self.0.display());
        }
    }
}

fn open_in(parent: &Path, kind: SFlag, device: u64) -> Result<File> {
    let directory = PrivateDirectory::new(parent)?;
    let path = directory.0.join("device");
    mknod(&path, kind, Mode::S_IRUSR | Mode::S_IWUSR, device)
        .with_context(|| format!("creating the device node {}", path.display()))?;
    let opened = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()));
    // The open file outlives its name; the directory goes on drop.
    let removed = std::fs::remove_file(&path);
    let file = opened?;
    removed.with_context(|| format!("removing {}", path.display()))?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(directory: &Path) -> usize {
        std::fs::read_dir(directory).unwrap().count()
    }

    /// The tests make device nodes: root only, and a file system that
    /// allows them (the temporary directory's, not a `nodev` mount).
    fn parent() -> tempfile::TempDir {
        assert!(nix::unistd::geteuid().is_root(), "these tests run as root");
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn the_private_node_opens_the_same_device_and_leaves_nothing() {
        if crate::kernel::skipped_without_root() {
            return;
        }
        let parent = parent();
        let null = File::open("/dev/null").unwrap();
        let file = open_in(
            parent.path(),
            SFlag::S_IFCHR,
            null.metadata().unwrap().rdev(),
        )
        .expect("opening /dev/null through a private node");
        let meta = file.metadata().unwrap();
        assert!(meta.file_type().is_char_device());
        assert_eq!(meta.rdev(), null.metadata().unwrap().rdev());
        assert_eq!(
            entries(parent.path()),
            0,
            "a private directory or node was left"
        );
    }

    #[test]
    fn a_device_that_does_not_open_leaves_nothing() {
        if crate::kernel::skipped_without_root() {
            return;
        }
        let parent = parent();
        // Block major 0 belongs to no driver: mknod works, open fails.
        let failed = open_in(parent.path(), SFlag::S_IFBLK, nix::sys::stat::makedev(0, 0));
        let error = format!("{:#}", failed.expect_err("block device 0:0 opened"));
        assert!(error.contains("opening"), "{error}");
        assert_eq!(
            entries(parent.path()),
            0,
            "a private directory or node was left"
        );
    }
}
