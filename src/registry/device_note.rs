//! The loop device a volume was last attached to, noted by attach in the
//! volume's lock file (`/run/sparse-volume/<uuid>.lock`) so that detach can
//! go to it at once instead of asking every bound device which file it
//! holds. A note, not a record: it is read and written only by holders of
//! the volume lock (so no reader sees half of one), a reader believes it
//! only after the device itself names the volume's file, and `/run` starts
//! empty at every boot.

use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};

use crate::registry::paths::SystemRoot;
use crate::registry::Registry;
use crate::volume::id::VolumeId;

/// Notes `number` for the volume. Best effort: without the note, detach
/// looks at every device as before.
pub fn record(root: &SystemRoot, id: &VolumeId, number: u32) {
    let path = Registry::volume_lock_path(root, id);
    let text = format!("loop{number}\n");
    let written = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(&path)
        .and_then(|file| {
            file.write_all_at(text.as_bytes(), 0)?;
            file.set_len(text.len() as u64)
        });
    if let Err(error) = written {
        tracing::debug!("noting the device in {}: {error}", path.display());
    }
}

/// The number noted for the volume, if any.
pub fn recorded(root: &SystemRoot, id: &VolumeId) -> Option<u32> {
    let mut text = String::new();
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(Registry::volume_lock_path(root, id))
        .ok()?
        .take(64)
        .read_to_string(&mut text)
        .ok()?;
    text.trim_end().strip_prefix("loop")?.parse().ok()
}
