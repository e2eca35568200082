//! Opening a backing file safely: no symlinks, no special files, nothing
//! another user could have written into.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use anyhow::{bail, Context, Result};
use nix::fcntl::{fallocate, FallocateFlags};
use nix::fcntl::{fcntl, FcntlArg, OFlag};

/// Refuses a backing path that passes through a symbolic link between its
/// storage root `root` and the file (`open_backing_file` refuses a link at
/// the file itself): every check of the path (below a storage root,
/// `RequiresMountsFor=`) judges it as written, and a link would take the
/// file from anywhere. The storage root itself may be a link, as nodes set
/// up that way must keep booting: that comes back as a warning.
pub fn refuse_links_below_root(root: &Path, path: &Path) -> Result<Option<String>> {
    let Ok(below) = path.strip_prefix(root) else {
        return Ok(None);
    };
    let mut directory = root.to_path_buf();
    let components: Vec<_> = below.components().collect();
    for component in components.iter().take(components.len().saturating_sub(1)) {
        directory.push(component);
        if std::fs::symlink_metadata(&directory).is_ok_and(|m| m.file_type().is_symlink()) {
            bail!(
                "backing file {} is reached through a symbolic link ({}); below a storage root only real directories are followed",
                path.display(),
                directory.display()
            );
        }
    }
    let root_is_link = std::fs::symlink_metadata(root).is_ok_and(|m| m.file_type().is_symlink());
    Ok(root_is_link.then(|| {
        format!(
            "storage root {} is a symbolic link; the checks and RequiresMountsFor= see the link, not where it points",
            root.display()
        )
    }))
}

/// Opens `path` for use as a loop backing file and checks the opened file
/// (not the path, which could change under us) is a regular, root-owned
/// file that neither group nor others can write.
pub fn open_backing_file(path: &Path, read_only: bool) -> Result<File> {
    let file = open_without_hanging(path, read_only).map_err(|e| describe_open_error(path, e))?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        bail!("backing file {} is not a regular file", path.display());
    }
    if meta.uid() != 0 {
        bail!(
            "backing file {} is owned by uid {}, not by root",
            path.display(),
            meta.uid()
        );
    }
    if meta.mode() & 0o022 != 0 {
        bail!(
            "backing file {} is writable by group or others (mode {:04o})",
            path.display(),
            meta.mode() & 0o7777
        );
    }
    fcntl(file.as_raw_fd(), FcntlArg::F_SETFL(OFlag::empty()))?;
    Ok(file)
}

/// How often an open that met a lease being broken is tried again, a
/// millisecond apart.
const LEASE_BREAK_RETRIES: u32 = 200;

/// O_NONBLOCK, so that a FIFO planted at the path cannot hang us (and
/// O_NOCTTY, so that a terminal planted there cannot become ours). On a
/// regular file it has one other effect: while another process holds a
/// lease on the file, the open fails with `EWOULDBLOCK` instead of waiting
/// for the lease to go. Attach holds one for two system calls (see
/// `loop_device::held_elsewhere`), so that open is simply tried again.
pub fn open_without_hanging(path: &Path, read_only: bool) -> std::io::Result<File> {
    let mut retries = 0;
    loop {
        let opened = OpenOptions::new()
            .read(true)
            .write(!read_only)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path);
        match opened {
            Err(error)
                if error.raw_os_error() == Some(libc::EWOULDBLOCK)
                    && retries < LEASE_BREAK_RETRIES =>
            {
                retries += 1;
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            other => return other,
        }
    }
}

fn describe_open_error(path: &Path, error: std::io::Error) -> anyhow::Error {
    match error.raw_os_error() {
        Some(libc::ELOOP) => anyhow::anyhow!("backing file {} is a symbolic link", path.display()),
        Some(libc::ENOENT) => anyhow::anyhow!("backing file {} does not exist", path.display()),
        _ => anyhow::anyhow!("opening backing file {}: {error}", path.display()),
    }
}

/// Sparse (`ftruncate`) or reserved (`fallocate`) up to `size`.
pub fn allocate(file: &File, size: u64, preallocate: bool) -> Result<()> {
    if preallocate {
        let length = i64::try_from(size).context("size too large")?;
        fallocate(
            std::os::fd::AsRawFd::as_raw_fd(file),
            FallocateFlags::empty(),
            0,
            length,
        )
        .context("reserving space with fallocate")?;
    }
    file.set_len(size).context("setting the file size")
}
