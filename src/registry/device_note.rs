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
    // One read: a note is a few bytes, and one that does not read whole
    // in 64 is no note of ours.
    let mut buffer = [0u8; 64];
    let length = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(Registry::volume_lock_path(root, id))
        .ok()?
        .read(&mut buffer)
        .ok()?;
    std::str::from_utf8(&buffer[..length])
        .ok()?
        .trim_end()
        .strip_prefix("loop")?
        .parse()
        .ok()
}
