//! Whether anything besides us holds a backing file open, asked of the
//! kernel in two calls instead of asking every bound loop device which
//! file it holds (an open, an ioctl and a close each: with a thousand
//! devices bound, most of an attach).
//!
//! A loop device keeps its backing file open for as long as it is bound,
//! and the kernel grants a write lease only on a file whose inode no other
//! open file description has open for reading or writing (so hard links,
//! bind mounts and other mount namespaces are all seen). A lease granted
//! means no loop device holds the file; the lease is dropped at once,
//! before anything else happens. A refusal proves nothing (a reader, a file
//! system without leases, `fs.leases-enable = 0`): the caller then looks at
//! every device as before.
//!
//! The lease counts the opens of one in-memory inode, while devices are
//! matched by the (device, inode number) they report. Only on file systems
//! that keep one in-memory inode per inode number are the two the same:
//! FUSE and overlayfs can show two hard links as two inodes with one
//! number, a device bound through the other one unseen by the lease. There
//! the question is not asked. Nor does a lease see a device bound through
//! a descriptor opened with access mode 3 (neither read nor write, which
//! `LOOP_CONFIGURE` takes as read-only): no tool binds that way, and the
//! devices are asked whenever the file is opened the usual way.

use std::fs::File;
use std::os::fd::AsRawFd;

use anyhow::{bail, Result};

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::sys::statfs::{
    fstatfs, FsType, BTRFS_SUPER_MAGIC, EXT4_SUPER_MAGIC, TMPFS_MAGIC, XFS_SUPER_MAGIC,
};

/// True only when the kernel says no other open file description holds
/// `file` (which must be the caller's only descriptor of it). Changes the
/// process's SIGIO disposition for the two calls: for a caller with no
/// other thread that could start a program meanwhile. An error
/// when the lease could not be dropped again: `file` must not go on to a
/// loop device with it, as every later open of the file would stall.
pub fn held_by_us_alone(file: &File) -> Result<bool> {
    if !one_inode_per_number(file) {
        return Ok(false);
    }
    // Someone opening the file while we hold the lease makes the kernel
    // signal us (SIGIO, whose default action ends the process) and wait
    // until we let go, which is at once. The signal is ignored meanwhile.
    let ignore = SigAction::new(SigHandler::SigIgn, SaFlags::empty(), SigSet::empty());
    // SAFETY: ignoring a signal installs no handler code.
    let Ok(previous) = (unsafe { sigaction(Signal::SIGIO, &ignore) }) else {
        return Ok(false);
    };
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor `file` keeps open, integer arguments.
    let granted = unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_WRLCK) } == 0;
    let dropped = !granted
        // SAFETY: as above.
        || unsafe {
            libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK) == 0
                && libc::fcntl(fd, libc::F_GETLEASE) == libc::F_UNLCK
        };
    let drop_error = std::io::Error::last_os_error();
    // SAFETY: puts back the disposition read above.
    if let Err(errno) = unsafe { sigaction(Signal::SIGIO, &previous) } {
        tracing::debug!("cannot restore the SIGIO disposition: {errno}");
    }
    if !dropped {
        bail!(
            "cannot drop the lease taken to see whether the backing file is attached: {drop_error}"
        );
    }
    Ok(granted)
}

/// Whether `file` lives on a file system known to keep one in-memory
/// inode per inode number (see the module's comment).
fn one_inode_per_number(file: &File) -> bool {
    const TRUSTED: [FsType; 4] = [
        EXT4_SUPER_MAGIC,
        XFS_SUPER_MAGIC,
        BTRFS_SUPER_MAGIC,
        TMPFS_MAGIC,
    ];
    fstatfs(file).is_ok_and(|fs| TRUSTED.contains(&fs.filesystem_type()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_open_of_the_file_is_seen_and_none_left_is_not() {
        // tmpfs, where the lease is asked (TMPDIR may be on any file system).
        let file = tempfile::NamedTempFile::new_in("/dev/shm").expect("a temporary file");
        let ours = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(file.path())
            .expect("opened");
        // The NamedTempFile's own descriptor is the other holder.
        assert!(!held_by_us_alone(&ours).expect("lease dropped"));
        let path = file.path().to_path_buf();
        let (handle, kept) = file.keep().expect("kept");
        drop(handle);
        assert!(held_by_us_alone(&ours).expect("lease dropped"));
        // Read-only holders count as well.
        let reader = File::open(&kept).expect("opened");
        assert!(!held_by_us_alone(&ours).expect("lease dropped"));
        drop(reader);
        assert!(held_by_us_alone(&ours).expect("lease dropped"));
        std::fs::remove_file(path).expect("removed");
    }

    /// overlayfs can give one inode number two in-memory inodes (hard
    /// links of a lower layer), so the lease is not asked there. Needs
    /// root, as the whole suite does.
    #[test]
    fn an_overlayfs_file_is_never_called_unheld() {
        if crate::kernel::skipped_without_root() {
            return;
        }
        let dir = tempfile::tempdir().expect("a directory");
        let [lower, upper, work, merged] =
            ["lower", "upper", "work", "merged"].map(|name| dir.path().join(name));
        for directory in [&lower, &upper, &work, &merged] {
            std::fs::create_dir(directory).expect("made");
        }
        std::fs::write(lower.join("volume"), b"data").expect("written");
        let options = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.display(),
            upper.display(),
            work.display()
        );
        nix::mount::mount(
            Some("overlay"),
            &merged,
            Some("overlay"),
            nix::mount::MsFlags::empty(),
            Some(options.as_str()),
        )
        .expect("an overlayfs mount (root, overlay module)");
        let alone = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(merged.join("volume"))
            .map(|file| held_by_us_alone(&file));
        nix::mount::umount(&merged).expect("unmounted");
        assert!(!alone.expect("opened").expect("lease dropped"));
    }
}
