//! The "being created" mark on a new backing file: an extended attribute
//! set before the file has a registry entry and cleared (durably) once it
//! has one. `check --repair` deletes only files that carry the mark and
//! that no registry file names, so data kept unregistered on purpose
//! (`remove` without `--delete-data`) is never taken for a leftover.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::volume::id::VolumeId;

/// The suffix of a backing file's hidden name while `create` makes it.
pub const CREATING_SUFFIX: &str = ".creating";

pub const CREATING_MARK: &str = "user.sparse-volume.creating";

/// The hidden name a backing file has while it is being made.
pub fn creating_path(final_path: &Path) -> PathBuf {
    let name = final_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    final_path.with_file_name(format!(".{name}{CREATING_SUFFIX}"))
}

/// Whether `name` is the hidden name of a file `create` was making.
pub fn is_creating_name(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(CREATING_SUFFIX)
}

pub fn has_creating_mark(path: &Path) -> bool {
    matches!(xattr::get(path, CREATING_MARK), Ok(Some(_)))
}

/// The volume a marked file was being created for.
pub fn marked_for(path: &Path) -> Option<String> {
    let value = xattr::get(path, CREATING_MARK).ok()??;
    String::from_utf8(value).ok()
}

/// Marks a new file. Without user xattrs on the storage file system, an
/// interrupted create is still found by its hidden name until the rename.
pub fn set_creating_mark(file: &File, id: &VolumeId) {
    if let Err(e) = xattr::FileExt::set_xattr(file, CREATING_MARK, id.to_string().as_bytes()) {
        tracing::debug!("cannot mark a new backing file as being created: {e}");
    }
}

/// The new, empty file at `temporary` (a hidden name), open for reading
/// and writing, marked as being made for `id`; refused when the name is
/// taken (a leftover of an earlier, interrupted run to this very UUID,
/// which `check --repair` decides about, the whole registry in view).
pub fn create_marked(temporary: &Path, id: &VolumeId) -> Result<File> {
    if std::fs::symlink_metadata(temporary).is_ok() {
        anyhow::bail!(
            "{} is left over from an interrupted create, clone or import; `sparse-volume check --repair` removes it",
            temporary.display()
        );
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(temporary)
        .with_context(|| format!("creating {}", temporary.display()))?;
    set_creating_mark(&file, id);
    Ok(file)
}

/// Removes the mark and makes that durable: a mark that comes back after
/// a crash would make a registered volume's file look like a leftover.
pub fn clear_creating_mark(path: &Path) -> Result<()> {
    if !has_creating_mark(path) {
        return Ok(());
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    match xattr::FileExt::remove_xattr(&file, CREATING_MARK) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
        Err(e) => {
            return Err(e)
                .with_context(|| format!("clearing the creating mark of {}", path.display()))
        }
    }
    file.sync_all()
        .with_context(|| format!("syncing {}", path.display()))
}
