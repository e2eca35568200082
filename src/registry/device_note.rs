//! The loop device a volume was last attached to, noted by attach in the
//! volume's lock file (`/run/sparse-volume/<uuid>.lock`) so that detach can
//! go to it at once instead of asking every bound device which file it
//! holds. A note, not a record: it is read and written only by holders of
//! the volume lock (so no reader sees half of one), a reader believes it
//! only after the device itself names the volume's file, and `/run` starts
//! empty at every boot.

use std::os::unix::fs::FileExt;

use crate::kernel::files::ExclusiveLock;

/// Notes `number` in the volume's lock file, through the lock the caller
/// holds. Best effort: without the note, detach looks at every device as
/// before.
pub fn record(lock: &ExclusiveLock, number: u32) {
    let text = format!("loop{number}\n");
    let file = lock.file();
    let written = file
        .write_all_at(text.as_bytes(), 0)
        .and_then(|()| file.set_len(text.len() as u64));
    if let Err(error) = written {
        tracing::debug!("noting the device in {}: {error}", lock.path().display());
    }
}

/// The number noted in the volume's lock file, read through the lock the
/// caller holds, if any.
pub fn recorded(lock: &ExclusiveLock) -> Option<u32> {
    // One read: a note is a few bytes, and one that does not read whole
    // in 64 is no note of ours.
    let mut buffer = [0u8; 64];
    let length = lock.file().read_at(&mut buffer, 0).ok()?;
    std::str::from_utf8(&buffer[..length])
        .ok()?
        .trim_end()
        .strip_prefix("loop")?
        .parse()
        .ok()
}
