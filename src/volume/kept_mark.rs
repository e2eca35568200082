//! The mark `remove` leaves on a backing file it keeps: `check` then tells
//! data kept on purpose (a note) from a volume whose registry file was
//! lost (an error: it would not come back at the next boot).

use std::path::Path;

use crate::volume::id::VolumeId;

pub const KEPT_MARK: &str = "user.sparse-volume.removed";

/// Marks the file as the kept data of volume `id`. Without user xattrs on
/// the storage file system, `check` reports the file as unowned.
pub fn set_kept_mark(path: &Path, id: &VolumeId) {
    if let Err(e) = xattr::set(path, KEPT_MARK, id.to_string().as_bytes()) {
        tracing::debug!("cannot mark {} as kept by remove: {e}", path.display());
    }
}

/// The volume whose `remove` kept this file, if one did.
pub fn kept_for(path: &Path) -> Option<String> {
    let value = xattr::get(path, KEPT_MARK).ok()??;
    String::from_utf8(value).ok()
}
