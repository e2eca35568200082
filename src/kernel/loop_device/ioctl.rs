//! The kernel's loop ioctl interface (`<linux/loop.h>`), each call a safe
//! function; the numbers and flags come from `linux-raw-sys`.

use std::os::fd::{AsRawFd, BorrowedFd};

use nix::errno::Errno;

pub const LOOP_MAJOR: u32 = 7;
pub const LO_NAME_SIZE: usize = 64;
const LO_KEY_SIZE: usize = 32;

use linux_raw_sys::loop_device as abi;

pub const LO_FLAGS_READ_ONLY: u32 = abi::LO_FLAGS_READ_ONLY as u32;
pub const LO_FLAGS_AUTOCLEAR: u32 = abi::LO_FLAGS_AUTOCLEAR as u32;
pub const LO_FLAGS_PARTSCAN: u32 = abi::LO_FLAGS_PARTSCAN as u32;
pub const LO_FLAGS_DIRECT_IO: u32 = abi::LO_FLAGS_DIRECT_IO as u32;

const LOOP_SET_FD: libc::c_ulong = abi::LOOP_SET_FD as libc::c_ulong;
const LOOP_CLR_FD: libc::c_ulong = abi::LOOP_CLR_FD as libc::c_ulong;
const LOOP_SET_STATUS64: libc::c_ulong = abi::LOOP_SET_STATUS64 as libc::c_ulong;
const LOOP_GET_STATUS64: libc::c_ulong = abi::LOOP_GET_STATUS64 as libc::c_ulong;
const LOOP_SET_CAPACITY: libc::c_ulong = abi::LOOP_SET_CAPACITY as libc::c_ulong;
const LOOP_SET_DIRECT_IO: libc::c_ulong = abi::LOOP_SET_DIRECT_IO as libc::c_ulong;
const LOOP_SET_BLOCK_SIZE: libc::c_ulong = abi::LOOP_SET_BLOCK_SIZE as libc::c_ulong;
const LOOP_CONFIGURE: libc::c_ulong = abi::LOOP_CONFIGURE as libc::c_ulong;
const LOOP_CTL_REMOVE: libc::c_ulong = abi::LOOP_CTL_REMOVE as libc::c_ulong;
const LOOP_CTL_GET_FREE: libc::c_ulong = abi::LOOP_CTL_GET_FREE as libc::c_ulong;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_layouts_match_the_kernel_abi() {
        // Sizes from <linux/loop.h> on every Linux architecture, and
        // the layouts linux-raw-sys generated from it.
        assert_eq!(std::mem::size_of::<LoopInfo64>(), 232);
        assert_eq!(std::mem::size_of::<LoopConfig>(), 304);
        assert_eq!(
            std::mem::size_of::<LoopInfo64>(),
            std::mem::size_of::<abi::loop_info64>()
        );
        assert_eq!(
            std::mem::size_of::<LoopConfig>(),
            std::mem::size_of::<abi::loop_config>()
        );
        assert_eq!(
            std::mem::offset_of!(LoopInfo64, lo_flags),
            std::mem::offset_of!(abi::loop_info64, lo_flags)
        );
        assert_eq!(
            std::mem::offset_of!(LoopConfig, info),
            std::mem::offset_of!(abi::loop_config, info)
        );
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
