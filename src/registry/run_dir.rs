//! The runtime directory (`/run/sparse-volume`): the locks, the device
//! notes kept in the volume locks, and what `check` and `metrics` record
//! between runs. Root truncates and writes files there, so it gets the
//! registry's trust rule: a directory only root can change, made with a
//! fixed mode (not 0777 less whatever umask the first command ran under),
//! and refused with the fix when it is anything else.

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;

use anyhow::{Context, Result};

use super::paths::SystemRoot;
use super::trust;
use crate::kernel::files::ExclusiveLock;

/// The runtime directory, made if missing (also by the package's
/// tmpfiles.d entry) and refused when anyone but root can change it.
pub fn ensure(root: &SystemRoot) -> Result<PathBuf> {
    let dir = root.run_dir();
    let meta = match fs::symlink_metadata(&dir) {
        Err(e) if e.kind() == ErrorKind::NotFound => {
            // Group and others may read (metrics' summary), never write.
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&dir)
                .with_context(|| format!("creating {}", dir.display()))?;
            fs::symlink_metadata(&dir)
        }
        other => other,
    }
    .with_context(|| format!("reading {}", dir.display()))?;
    match trust::untrusted_directory(&dir, &meta) {
        Some(refused) => Err(refused.into()),
        None => Ok(dir),
    }
}

/// The exclusive lock `name` in the runtime directory.
pub fn lock(root: &SystemRoot, name: &str) -> Result<ExclusiveLock> {
    ExclusiveLock::acquire(&ensure(root)?.join(name))
}
