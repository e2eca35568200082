//! Opening a backing file safely: no symlinks, no special files, nothing
//! another user could have written into.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use anyhow::{bail, Result};
use nix::fcntl::{fcntl, FcntlArg, OFlag};

/// Opens `path` for use as a loop backing file and checks the opened file
/// (not the path, which could change under us) is a regular, root-owned
/// file that neither group nor others can write.
pub fn open_backing_file(path: &Path, read_only: bool) -> Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(!read_only)
        // O_NONBLOCK: opening a FIFO planted at the path must not hang us.
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| describe_open_error(path, e))?;
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

fn describe_open_error(path: &Path, error: std::io::Error) -> anyhow::Error {
    match error.raw_os_error() {
        Some(libc::ELOOP) => anyhow::anyhow!("backing file {} is a symbolic link", path.display()),
        Some(libc::ENOENT) => anyhow::anyhow!("backing file {} does not exist", path.display()),
        _ => anyhow::anyhow!("opening backing file {}: {error}", path.display()),
    }
}
