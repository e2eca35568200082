//! Mounting a file system for one tool only: the tool's process enters a
//! mount namespace of its own between fork and exec and mounts there, so
//! no one else sees the mount, and it ends with the tool's process.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};

/// Makes `command`'s process mount `device` (a file system of `fs_type`)
/// on `mount_point` in a new mount namespace before it execs. A failure to
/// mount fails the spawn with the mount's error.
pub fn mount_before_exec(
    command: &mut Command,
    device: &Path,
    mount_point: &Path,
    fs_type: &str,
) -> Result<()> {
    // Made before the fork: between fork and exec only async-signal-safe
    // calls are allowed, and allocating is not one.
    let device = c_path(device)?;
    let mount_point = c_path(mount_point)?;
    let fs_type = CString::new(fs_type).context("a file system type with a NUL byte")?;
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    // SAFETY: the closure runs in the forked child before exec and makes
    // only system calls (unshare, mount) on memory prepared above.
    unsafe {
        command.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(io::Error::last_os_error());
            }
            // Without this the mount below would propagate to the peer
            // group of the caller's namespace (systemd makes / shared).
            if libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            if libc::mount(
                device.as_ptr(),
                mount_point.as_ptr(),
                fs_type.as_ptr(),
                flags,
                std::ptr::null(),
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

fn c_path(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .with_context(|| format!("a path with a NUL byte: {}", path.display()))
}
