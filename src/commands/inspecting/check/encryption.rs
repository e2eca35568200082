//! An encrypted volume can only come back at boot if its key file is
//! there, root's alone, and its header still has the keyslots `create`
//! filled: the key file's and the recovery key's. None of this is
//! repaired: a key is never made up, and a keyslot never removed.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::commands::inspecting::check::{subject, Audit};
use crate::engine::encryption::{on_header, RECOVERY_GUIDE};
use crate::registry::Volume;
use crate::volume::luks::{self, KEY_FILE_SLOT, RECOVERY_SLOT};

pub(super) fn audit_encryption(audit: &mut Audit, volume: &Volume, path: &Path) {
    let Some(encryption) = &volume.encryption else {
        return;
    };
    let key_file = audit.root.host_path(&encryption.key_file);
    match std::fs::metadata(&key_file) {
        Err(e) => audit.report(
            "key-file-missing",
            Some(volume),
            Some(path),
            format!(
                "{}: key file {} cannot be read ({e}): the volume will not unlock at boot; its recovery key opens it ({RECOVERY_GUIDE})",
                subject(volume),
                key_file.display()
            ),
        ),
        Ok(meta) if meta.uid() != 0 || meta.mode() & 0o077 != 0 => audit.report(
            "key-file-exposed",
            Some(volume),
            Some(path),
            format!(
                "{}: key file {} is owned by uid {} with mode {:04o}: anyone who can read it can read the volume; chown root and chmod 0400 it",
                subject(volume),
                key_file.display(),
                meta.uid(),
                meta.mode() & 0o7777
            ),
        ),
        Ok(_) => {}
    }
    match on_header(volume, path, false, luks::keyslots) {
        Ok(slots) => {
            for (slot, what) in [
                (KEY_FILE_SLOT, "the key file's"),
                (RECOVERY_SLOT, "the recovery key's"),
            ] {
                if !slots.contains(&slot) {
                    audit.report(
                        "keyslot-missing",
                        Some(volume),
                        Some(path),
                        format!(
                            "{}: its LUKS2 header has no keyslot {slot} ({what}); keyslots in use: {slots:?}",
                            subject(volume)
                        ),
                    );
                }
            }
        }
        Err(e) => audit.report(
            "unreadable-luks-header",
            Some(volume),
            Some(path),
            format!(
                "{}: its LUKS2 header cannot be read: {e:#}",
                subject(volume)
            ),
        ),
    }
}
