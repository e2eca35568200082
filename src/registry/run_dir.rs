//! The runtime directory (`/run/sparse-volume`): the locks, the device
//! notes kept in the volume locks, and what `check` and `metrics` record
//! between runs. Root truncates and writes files there, so it gets the
//! registry's trust rule: a directory only root can change, made with a
//! fixed mode (not 0777 less whatever umask the first command ran under),
//! and refused with the fix when it is anything else.

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context, Result};

use super::paths::SystemRoot;
use super::trust;
use crate::hooks;
use crate::kernel::files::ExclusiveLock;

/// How long this process waits for a lock, once bounded.
static WAIT_LIMIT: OnceLock<Duration> = OnceLock::new();

/// Bounds every later wait for a lock in this process. The units' program
/// does: systemd kills a start or stop that outlasts its timeout without a
/// word in the journal, where a bounded wait fails naming the holder.
/// Commands run by hand wait as long as it takes (an offline `e2fsck`
/// under `resize` may take hours), saying once what they wait for.
pub fn bound_lock_waits(limit: Duration) {
    let _ = WAIT_LIMIT.set(hooks::lock_wait().unwrap_or(limit));
}

/// The runtime directory, made if missing (also by the package's
/// tmpfiles.d entry) and refused when anyone but root can change it.
pub fn ensure(root: &SystemRoot) -> Result<PathBuf> {
    let dir = root.run_dir();
    let meta = match fs::symlink_metadata(&dir) {
        Err(e) if e.kind() == ErrorKind::NotFound => {
            // Group and others may read (metrics' summary), never write;
            // set after mkdir, which the umask would narrow.
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&dir)
                .and_then(|()| fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)))
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

/// The exclusive lock `name` in the runtime directory. A wait for it is
/// announced once, on stderr, with the process that holds it.
pub fn lock(root: &SystemRoot, name: &str) -> Result<ExclusiveLock> {
    let path = ensure(root)?.join(name);
    ExclusiveLock::acquire_within(&path, WAIT_LIMIT.get().copied(), |holder| {
        tracing::warn!("waiting for {}, held by {holder}", path.display());
    })
}
