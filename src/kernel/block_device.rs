//! Block-device ioctls that are not about loop devices (sector size,
//! flushing the page cache, resizing a partition), and the sector size of
//! the disk under a file, from sysfs.

use std::fs;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::Path;

use linux_raw_sys::ioctl as abi;
use nix::errno::Errno;

use crate::kernel::sysfs::read_number;

fn check(result: libc::c_int) -> Result<libc::c_int, Errno> {
    Errno::result(result)
}

const BLKFLSBUF: libc::c_ulong = abi::BLKFLSBUF as libc::c_ulong;
const BLKSSZGET: libc::c_ulong = abi::BLKSSZGET as libc::c_ulong;

/// The logical sector size of a block device (`BLKSSZGET`).
pub fn logical_block_size(device: BorrowedFd<'_>) -> Result<u32, Errno> {
    let mut size: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one `int` into the buffer, which lives
    // across the call.
    check(unsafe { libc::ioctl(device.as_raw_fd(), BLKSSZGET, &mut size as *mut libc::c_int) })?;
    u32::try_from(size).map_err(|_| Errno::EINVAL)
}

/// Writes back and drops the block device's page cache (`BLKFLSBUF`), so
/// that readers see what was written to the backing file behind its back.
pub fn flush_buffers(device: BorrowedFd<'_>) -> Result<(), Errno> {
    // SAFETY: BLKFLSBUF takes no argument.
    check(unsafe { libc::ioctl(device.as_raw_fd(), BLKFLSBUF, 0) }).map(drop)
}

const BLKPG: libc::c_ulong = abi::BLKPG as libc::c_ulong;
const BLKPG_RESIZE_PARTITION: libc::c_int = 3;

/// `struct blkpg_partition`.
#[repr(C)]
struct BlkpgPartition {
    start: libc::c_longlong,
    length: libc::c_longlong,
    pno: libc::c_int,
    devname: [u8; 64],
    volname: [u8; 64],
}

/// `struct blkpg_ioctl_arg`.
#[repr(C)]
struct BlkpgIoctlArg {
    op: libc::c_int,
    flags: libc::c_int,
    datalen: libc::c_int,
    data: *mut libc::c_void,
}

/// Tells the kernel a partition of `disk` is now `length` bytes long.
/// Unlike re-reading the table, this works while the partition is mounted.
pub fn resize_partition(
    disk: BorrowedFd<'_>,
    number: i32,
    start: u64,
    length: u64,
) -> Result<(), Errno> {
    let mut partition = BlkpgPartition {
        start: i64::try_from(start).map_err(|_| Errno::EINVAL)?,
        length: i64::try_from(length).map_err(|_| Errno::EINVAL)?,
        pno: number,
        devname: [0; 64],
        volname: [0; 64],
    };
    let argument = BlkpgIoctlArg {
        op: BLKPG_RESIZE_PARTITION,
        flags: 0,
        datalen: std::mem::size_of::<BlkpgPartition>() as libc::c_int,
        data: (&mut partition as *mut BlkpgPartition).cast(),
    };
    // SAFETY: `argument` points at a live, correctly sized
    // `struct blkpg_partition`; both outlive the call.
    check(unsafe { libc::ioctl(disk.as_raw_fd(), BLKPG, &argument as *const BlkpgIoctlArg) })
        .map(drop)
}

/// The logical block size of the block device under the file system that
/// holds `path` (or its nearest existing ancestor, for a file not made
/// yet), from sysfs. `None` when no block device is behind it (tmpfs,
/// overlay, network and btrfs file systems show anonymous device numbers):
/// the caller decides the default.
pub fn backing_logical_block_size(path: &Path) -> Option<u32> {
    let meta = path.ancestors().find_map(|p| fs::metadata(p).ok())?;
    logical_block_size_of_device(std::os::unix::fs::MetadataExt::dev(&meta))
}

/// The logical block size of the block device `dev` (a file's `st_dev`),
/// from sysfs; `None` for an anonymous device (see above).
pub fn logical_block_size_of_device(dev: u64) -> Option<u32> {
    let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
    // The link's target, read once and used as it is (`../../devices/…`
    // below /sys/dev/block): the kernel resolves it at each open, where a
    // canonicalized path would cost a readlink per component.
    let link = Path::new("/sys/dev/block").join(format!("{major}:{minor}"));
    let device = link.parent()?.join(fs::read_link(&link).ok()?);
    // A partition has no queue of its own: its disk's sector size applies.
    let disk = if device.join("partition").exists() {
        device.join("..")
    } else {
        device
    };
    read_number(&disk.join("queue/logical_block_size"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_layouts_match_the_kernel_abi() {
        assert_eq!(std::mem::size_of::<BlkpgPartition>(), 152);
        assert_eq!(std::mem::size_of::<BlkpgIoctlArg>(), 24);
    }

    #[test]
    fn logical_block_size_of_a_real_file_system() {
        // Wherever the tests run, a size is a power of two ≥ 512 or unknown.
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("not/yet/made");
        let size = backing_logical_block_size(&missing);
        assert_eq!(size, backing_logical_block_size(dir.path()));
        assert!(
            size.is_none_or(|s| s >= 512 && s.is_power_of_two()),
            "{size:?}"
        );
        assert_eq!(backing_logical_block_size(Path::new("/proc/self")), None);
    }
}
