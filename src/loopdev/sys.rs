//! The kernel's loop ioctl interface (`<linux/loop.h>`). All unsafe code of
//! the crate lives here; everything above works with safe wrappers.

use std::os::fd::{AsRawFd, BorrowedFd};

use nix::errno::Errno;

pub const LOOP_MAJOR: u32 = 7;
pub const LO_NAME_SIZE: usize = 64;
const LO_KEY_SIZE: usize = 32;

pub const LO_FLAGS_READ_ONLY: u32 = 1;
pub const LO_FLAGS_AUTOCLEAR: u32 = 4;
pub const LO_FLAGS_PARTSCAN: u32 = 8;
pub const LO_FLAGS_DIRECT_IO: u32 = 16;

const LOOP_SET_FD: libc::c_ulong = 0x4C00;
const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
const LOOP_SET_STATUS64: libc::c_ulong = 0x4C04;
const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;
const LOOP_SET_CAPACITY: libc::c_ulong = 0x4C07;
const LOOP_SET_DIRECT_IO: libc::c_ulong = 0x4C08;
const LOOP_SET_BLOCK_SIZE: libc::c_ulong = 0x4C09;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LOOP_CTL_REMOVE: libc::c_ulong = 0x4C81;
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;

/// `struct loop_info64`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct LoopInfo64 {
    pub lo_device: u64,
    pub lo_inode: u64,
    pub lo_rdevice: u64,
    pub lo_offset: u64,
    pub lo_sizelimit: u64,
    pub lo_number: u32,
    pub lo_encrypt_type: u32,
    pub lo_encrypt_key_size: u32,
    pub lo_flags: u32,
    pub lo_file_name: [u8; LO_NAME_SIZE],
    pub lo_crypt_name: [u8; LO_NAME_SIZE],
    pub lo_encrypt_key: [u8; LO_KEY_SIZE],
    pub lo_init: [u64; 2],
}

impl Default for LoopInfo64 {
    fn default() -> Self {
        Self {
            lo_device: 0,
            lo_inode: 0,
            lo_rdevice: 0,
            lo_offset: 0,
            lo_sizelimit: 0,
            lo_number: 0,
            lo_encrypt_type: 0,
            lo_encrypt_key_size: 0,
            lo_flags: 0,
            lo_file_name: [0; LO_NAME_SIZE],
            lo_crypt_name: [0; LO_NAME_SIZE],
            lo_encrypt_key: [0; LO_KEY_SIZE],
            lo_init: [0; 2],
        }
    }
}

impl LoopInfo64 {
    /// Stores `name` NUL-terminated, cut to fit.
    pub fn set_file_name(&mut self, name: &str) {
        let bytes = name.as_bytes();
        let len = bytes.len().min(LO_NAME_SIZE - 1);
        self.lo_file_name = [0; LO_NAME_SIZE];
        self.lo_file_name[..len].copy_from_slice(&bytes[..len]);
    }

    pub fn file_name(&self) -> String {
        let end = self
            .lo_file_name
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(LO_NAME_SIZE);
        String::from_utf8_lossy(&self.lo_file_name[..end]).into_owned()
    }
}

/// `struct loop_config` (for `LOOP_CONFIGURE`, Linux 5.8+).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct LoopConfig {
    pub fd: u32,
    pub block_size: u32,
    pub info: LoopInfo64,
    reserved: [u64; 8],
}

impl LoopConfig {
    /// `block_size` is the logical sector size; 0 would let the kernel
    /// choose, which on 6.14+ follows the backing disk under direct I/O.
    pub fn new(backing: BorrowedFd<'_>, info: LoopInfo64, block_size: u32) -> Self {
        Self {
            fd: backing.as_raw_fd() as u32,
            block_size,
            info,
            reserved: [0; 8],
        }
    }
}

fn check(result: libc::c_int) -> Result<libc::c_int, Errno> {
    Errno::result(result)
}

pub fn ctl_get_free(control: BorrowedFd<'_>) -> Result<u32, Errno> {
    // SAFETY: LOOP_CTL_GET_FREE takes no argument and the fd is valid for
    // the duration of the call.
    let number = check(unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) })?;
    Ok(number as u32)
}

/// Deletes an unbound, unopened loop device (`EBUSY` otherwise).
pub fn ctl_remove(control: BorrowedFd<'_>, number: u32) -> Result<(), Errno> {
    // SAFETY: LOOP_CTL_REMOVE takes the device number by value.
    check(unsafe {
        libc::ioctl(
            control.as_raw_fd(),
            LOOP_CTL_REMOVE,
            libc::c_ulong::from(number),
        )
    })
    .map(drop)
}

pub fn configure(device: BorrowedFd<'_>, config: &LoopConfig) -> Result<(), Errno> {
    // SAFETY: the kernel reads a `struct loop_config`, which `LoopConfig`
    // mirrors with `repr(C)`; the reference outlives the call.
    check(unsafe {
        libc::ioctl(
            device.as_raw_fd(),
            LOOP_CONFIGURE,
            config as *const LoopConfig,
        )
    })
    .map(drop)
}

pub fn set_fd(device: BorrowedFd<'_>, backing: BorrowedFd<'_>) -> Result<(), Errno> {
    // SAFETY: LOOP_SET_FD takes the backing file descriptor by value.
    check(unsafe {
        libc::ioctl(
            device.as_raw_fd(),
            LOOP_SET_FD,
            backing.as_raw_fd() as libc::c_ulong,
        )
    })
    .map(drop)
}

pub fn set_status(device: BorrowedFd<'_>, info: &LoopInfo64) -> Result<(), Errno> {
    // SAFETY: the kernel reads a `struct loop_info64` that `LoopInfo64`
    // mirrors; the reference outlives the call.
    check(unsafe {
        libc::ioctl(
            device.as_raw_fd(),
            LOOP_SET_STATUS64,
            info as *const LoopInfo64,
        )
    })
    .map(drop)
}

/// The device's status, or `ENXIO` when nothing is attached to it.
pub fn get_status(device: BorrowedFd<'_>) -> Result<LoopInfo64, Errno> {
    let mut info = LoopInfo64::default();
    // SAFETY: the kernel writes one `struct loop_info64` into the buffer,
    // which is exactly that large and lives across the call.
    check(unsafe {
        libc::ioctl(
            device.as_raw_fd(),
            LOOP_GET_STATUS64,
            &mut info as *mut LoopInfo64,
        )
    })?;
    Ok(info)
}

pub fn clear_fd(device: BorrowedFd<'_>) -> Result<(), Errno> {
    // SAFETY: LOOP_CLR_FD takes no argument.
    check(unsafe { libc::ioctl(device.as_raw_fd(), LOOP_CLR_FD, 0) }).map(drop)
}

pub fn set_capacity(device: BorrowedFd<'_>) -> Result<(), Errno> {
    // SAFETY: LOOP_SET_CAPACITY takes no argument.
    check(unsafe { libc::ioctl(device.as_raw_fd(), LOOP_SET_CAPACITY, 0) }).map(drop)
}

/// Direct I/O on or off, for a kernel without `LOOP_CONFIGURE`.
pub fn set_direct_io(device: BorrowedFd<'_>, on: bool) -> Result<(), Errno> {
    // SAFETY: LOOP_SET_DIRECT_IO takes the switch by value.
    check(unsafe {
        libc::ioctl(
            device.as_raw_fd(),
            LOOP_SET_DIRECT_IO,
            libc::c_ulong::from(on),
        )
    })
    .map(drop)
}

/// The logical sector size, for a kernel without `LOOP_CONFIGURE`.
pub fn set_block_size(device: BorrowedFd<'_>, block_size: u32) -> Result<(), Errno> {
    // SAFETY: LOOP_SET_BLOCK_SIZE takes the size by value.
    check(unsafe {
        libc::ioctl(
            device.as_raw_fd(),
            LOOP_SET_BLOCK_SIZE,
            libc::c_ulong::from(block_size),
        )
    })
    .map(drop)
}

const BLKFLSBUF: libc::c_ulong = 0x1261;
const BLKSSZGET: libc::c_ulong = 0x1268;

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

const BLKPG: libc::c_ulong = 0x1269;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_layouts_match_the_kernel_abi() {
        // Sizes from <linux/loop.h> on every Linux architecture.
        assert_eq!(std::mem::size_of::<LoopInfo64>(), 232);
        assert_eq!(std::mem::size_of::<LoopConfig>(), 304);
        assert_eq!(std::mem::size_of::<BlkpgPartition>(), 152);
        assert_eq!(std::mem::size_of::<BlkpgIoctlArg>(), 24);
    }

    #[test]
    fn file_name_is_nul_terminated_and_cut() {
        let mut info = LoopInfo64::default();
        info.set_file_name(&"x".repeat(100));
        assert_eq!(info.file_name().len(), LO_NAME_SIZE - 1);
        info.set_file_name("sparse-volume:abc");
        assert_eq!(info.file_name(), "sparse-volume:abc");
    }
}
