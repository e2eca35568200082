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
//! watches only the one in `/dev`. A second node of the same device lets
//! us configure the device and close it without that event. It is made in
//! a tmpfs that is mounted nowhere (`fsopen` + `fsmount`, Linux 5.2): the
//! file system exists only as our descriptors and goes with the last of
//! them, so a kill at any moment leaves no node behind. Where that is not
//! allowed (older kernels, containers without mounts) the node is made in
//! a private directory under `/dev` and unlinked once open, as versions up
//! to 0.2 always did; a SIGKILL between `mknod` and `unlink` leaves it
//! there, and `check` reports it.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use linux_raw_sys::general::{fsconfig_command, FSMOUNT_CLOEXEC, FSOPEN_CLOEXEC};
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{mknodat, Mode, SFlag};

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
    open_through_private_node(kind, meta.rdev()).or_else(|unmounted| {
        // Kernels before 5.2, or a container that may make device nodes but
        // not mounts: the node goes in a private directory under /dev, as
        // versions up to 0.2 did (a kill between its mknod and unlink leaves
        // it there; `check` reports it).
        open_in_directory(Path::new(DEV), kind, meta.rdev())
            .map_err(|in_dev| anyhow::anyhow!("{unmounted:#}; {in_dev:#}"))
    })
}

/// Where the fallback's node is made: device nodes work on devtmpfs, while
/// `/run` and `/tmp` are often mounted `nodev`.
const DEV: &str = "/dev";

/// A directory made for the fallback's node (mode 0700, by `mkdtemp`),
/// removed when dropped: it holds nothing by then, so one `rmdir` does.
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

fn open_in_directory(parent: &Path, kind: SFlag, device: u64) -> Result<File> {
    let directory = PrivateDirectory::new(parent)?;
    let path = directory.0.join("device");
    nix::sys::stat::mknod(&path, kind, Mode::S_IRUSR | Mode::S_IWUSR, device)
        .with_context(|| format!("creating the device node {}", path.display()))?;
    let opened = std::fs::OpenOptions::new()
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

/// The result of a raw system call that returns a new descriptor.
fn new_descriptor(result: libc::c_long, call: &str) -> Result<OwnedFd> {
    if result < 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("{call} failed"));
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(result as RawFd) })
}

/// A new, empty tmpfs mounted nowhere; the descriptor is its root.
fn unmounted_tmpfs() -> Result<OwnedFd> {
    // SAFETY: fsopen reads the NUL-terminated name and takes flags; it
    // returns a new descriptor or -1.
    let context = new_descriptor(
        unsafe { libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), FSOPEN_CLOEXEC) },
        "fsopen(tmpfs)",
    )?;
    // SAFETY: FSCONFIG_CMD_CREATE reads no key, value or auxiliary
    // argument; the null pointers and zero are what it expects.
    let created = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            context.as_raw_fd(),
            fsconfig_command::FSCONFIG_CMD_CREATE as libc::c_uint,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0 as libc::c_int,
        )
    };
    if created < 0 {
        return Err(std::io::Error::last_os_error()).context("creating a tmpfs");
    }
    // SAFETY: fsmount takes the context descriptor, flags and mount
    // attributes (none); it returns a new descriptor or -1.
    new_descriptor(
        unsafe { libc::syscall(libc::SYS_fsmount, context.as_raw_fd(), FSMOUNT_CLOEXEC, 0) },
        "fsmount",
    )
}

fn open_through_private_node(kind: SFlag, device: u64) -> Result<File> {
    let tmpfs = unmounted_tmpfs().context("making a private file system for the device node")?;
    mknodat(
        Some(tmpfs.as_raw_fd()),
        "device",
        kind,
        Mode::S_IRUSR | Mode::S_IWUSR,
        device,
    )
    .context("creating a private device node")?;
    let fd = openat(
        Some(tmpfs.as_raw_fd()),
        "device",
        OFlag::O_RDWR | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .context("opening the private device node")?;
    // SAFETY: openat returned a new descriptor that nothing else owns. The
    // open file keeps the tmpfs alive until it is closed.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_private_node_opens_the_same_device() {
        if crate::kernel::skipped_without_root() {
            return;
        }
        let null = File::open("/dev/null").unwrap();
        let file = open_read_write(&null).expect("opening /dev/null through a private node");
        let meta = file.metadata().unwrap();
        assert!(meta.file_type().is_char_device());
        assert_eq!(meta.rdev(), null.metadata().unwrap().rdev());
        // Not a node anywhere in the tree: its path is the one name in a
        // file system that no mount shows.
        let path = std::path::Path::new(&format!("/proc/self/fd/{}", file.as_raw_fd()))
            .read_link()
            .unwrap();
        assert_eq!(path, std::path::Path::new("/device"));
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let device = format!(" {}:{} ", libc::major(meta.dev()), libc::minor(meta.dev()));
        assert!(!mounts.contains(&device), "mounted: {device}");
    }

    #[test]
    fn the_fallback_opens_the_same_device_and_leaves_nothing() {
        if crate::kernel::skipped_without_root() {
            return;
        }
        let parent = tempfile::tempdir().unwrap();
        let null = File::open("/dev/null").unwrap();
        let rdev = null.metadata().unwrap().rdev();
        let file = open_in_directory(parent.path(), SFlag::S_IFCHR, rdev).unwrap();
        assert_eq!(file.metadata().unwrap().rdev(), rdev);
        assert_eq!(std::fs::read_dir(parent.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_device_that_does_not_open_fails_with_the_reason() {
        if crate::kernel::skipped_without_root() {
            return;
        }
        // Block major 0 belongs to no driver: mknod works, open fails.
        let failed = open_through_private_node(SFlag::S_IFBLK, nix::sys::stat::makedev(0, 0));
        let error = format!("{:#}", failed.expect_err("block device 0:0 opened"));
        assert!(error.contains("opening"), "{error}");
    }
}
