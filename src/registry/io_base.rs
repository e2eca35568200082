//! The I/O counters of a volume's loop device at its attach
//! (`/run/sparse-volume/<uuid>.io-base`), so that reports count what the
//! volume did since: the kernel counts from the device's creation, and
//! loop devices are reused attach after attach. Replaced whole (atomically)
//! by attach, readable by anyone; a reader believes it only while the
//! device's disk sequence number, which the kernel changes at every attach
//! and detach, is the one it was taken with.

use std::path::{Path, PathBuf};

use crate::kernel::block_stat::{loop_disk_sequence, loop_stat_text, IoCounters};
use crate::kernel::files::replace_for_readers;
use crate::registry::paths::SystemRoot;
use crate::volume::id::VolumeId;

const SUFFIX: &str = ".io-base";

fn path(root: &SystemRoot, id: &VolumeId) -> PathBuf {
    root.run_dir().join(format!("{id}{SUFFIX}"))
}

/// Takes the base of this attach of `/dev/loopN`, unless one was taken
/// for it already (an attach that found the volume attached keeps
/// counting from the first). Best effort: without it, reports show no
/// I/O for the volume until its next attach.
pub fn record(root: &SystemRoot, id: &VolumeId, number: u32) {
    if since_attach(root, id, number).is_some() {
        return;
    }
    let (Some(sequence), Some(stat)) = (loop_disk_sequence(number), loop_stat_text(number)) else {
        tracing::debug!(
            "no I/O counters for /dev/loop{number} (a kernel before 5.15 has no diskseq)"
        );
        return;
    };
    let text = format!("loop{number} {sequence}\n{stat}");
    let path = path(root, id);
    if let Err(error) = replace_for_readers(&path, text.as_bytes(), 0o644) {
        tracing::warn!(
            "noting the I/O counters in {}: {error:#}; reports show no I/O for this attach",
            path.display()
        );
    }
}

/// What the volume attached to `/dev/loopN` did since its attach; None
/// without a base of this very attach.
pub fn since_attach(root: &SystemRoot, id: &VolumeId, number: u32) -> Option<IoCounters> {
    let text = read_small_file(&path(root, id))?;
    let (head, stat) = text.split_once('\n')?;
    let (device, sequence) = head.split_once(' ')?;
    if device != format!("loop{number}") || sequence.parse().ok() != loop_disk_sequence(number) {
        return None;
    }
    IoCounters::of_loop_device(number)?.since(&IoCounters::parse(stat)?)
}

/// Drops the base once the volume is detached (best effort: a stale one
/// is never believed, its disk sequence number having changed).
pub fn forget(root: &SystemRoot, id: &VolumeId) {
    let path = path(root, id);
    match std::fs::remove_file(&path) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            tracing::debug!("removing {}: {error}", path.display());
        }
        _ => {}
    }
}

/// The file's text if it is a regular file of at most a page: never
/// through a link, never blocking on a FIFO planted in its place.
fn read_small_file(path: &Path) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = String::new();
    file.take(4096).read_to_string(&mut text).ok()?;
    Some(text)
}
