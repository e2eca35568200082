//! Private device nodes that versions up to 0.2 made under `/dev` to bind
//! a writable loop device (see `kernel::loop_device::unwatched`), left in
//! a `.sparse-volume-XXXXXX` directory when that process was killed
//! between `mknod` and `unlink`. Nothing makes them any more, and an older
//! process that still did kept one for microseconds: one untouched for a
//! minute has no owner left.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Result};

use super::Audit;

const PREFIX: &str = ".sparse-volume-";
const NODE: &str = "device";
/// Far longer than an older version kept its node.
const OWNERLESS_AFTER: Duration = Duration::from_secs(60);

pub(super) fn audit_leftover_nodes(audit: &mut Audit) {
    let dev = audit.root.host_path("/dev");
    let Ok(entries) = fs::read_dir(&dev) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(PREFIX) {
            continue;
        }
        let dir = entry.path();
        let Ok(meta) = fs::symlink_metadata(&dir) else {
            continue;
        };
        let ownerless = meta
            .modified()
            .ok()
            .and_then(|at| SystemTime::now().duration_since(at).ok())
            .is_some_and(|age| age >= OWNERLESS_AFTER);
        if !meta.is_dir() || meta.uid() != 0 || !ownerless {
            continue;
        }
        audit.repairable(
            "leftover-device-node",
            None,
            Some(&dir),
            format!(
                "{} is left over from an attach that was killed (a private device node of an older version)",
                dir.display()
            ),
            || remove_leftover(&dir),
        );
    }
}

/// Removes the directory and the one device node it may hold; anything
/// else in it is somebody's, and the directory is left alone.
fn remove_leftover(dir: &Path) -> Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if entry.file_name() != NODE || !(kind.is_block_device() || kind.is_char_device()) {
            bail!(
                "it holds {}, which is not a device node of ours; left alone",
                entry.path().display()
            );
        }
    }
    match fs::remove_file(dir.join(NODE)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
        _ => {}
    }
    fs::remove_dir(dir)?;
    Ok(())
}
