//! What a command's volume argument stands for when no volume carries it
//! as its name: a loop device or one of its partitions (`/dev/loop0`,
//! `loop0`, `/dev/loop0p1`, a `/dev/disk/by-*` link to one), resolved by
//! the kernel's record of the backing file, never by a name; a backing
//! file's path, exactly as the registry records it (no link followed); or
//! the beginning of a UUID, as `list` shows it for an unnamed volume. A
//! registry file that does not read may be the one meant: a prefix or a
//! path it could match is refused, naming it.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};

use super::{Registry, ResolvedBy, Volume};
use crate::kernel::loop_device::{parent_loop_of, LoopDevice};
use crate::volume::id::VolumeId;
use crate::volume::reference::{reads_as_loop_device, reads_as_uuid_prefix};

impl Registry {
    /// The volume `text` stands for other than by name, if it reads as
    /// one of the other ways; an error says why a device or a path names
    /// no volume, or which volumes a beginning of a UUID could be.
    pub(super) fn resolve_other_than_by_name(
        &self,
        text: &str,
    ) -> Result<Option<(VolumeId, ResolvedBy)>> {
        if text.starts_with("/dev/") || reads_as_loop_device(text) {
            let device = if text.starts_with('/') {
                // A /dev/disk/by-* link counts as the device it points at.
                fs::canonicalize(text).map_err(|e| {
                    anyhow!("{text} names no volume: the device cannot be found ({e})")
                })?
            } else {
                Path::new("/dev").join(text)
            };
            return self
                .volume_on_device(text, &device)
                .map(|(id, number)| Some((id, ResolvedBy::Device(number))));
        }
        if text.starts_with('/') {
            return Ok(self.volume_at_path(text)?.map(|id| (id, ResolvedBy::Path)));
        }
        if reads_as_uuid_prefix(text) {
            return Ok(self
                .volume_by_uuid_prefix(text)?
                .map(|id| (id, ResolvedBy::UuidPrefix)));
        }
        Ok(None)
    }

    fn readable_volumes(&self) -> Result<Vec<Volume>> {
        Ok(self
            .entries()?
            .into_iter()
            .filter_map(|entry| entry.volume.ok())
            .collect())
    }

    fn volume_on_device(&self, text: &str, device: &Path) -> Result<(VolumeId, u32)> {
        let number = parent_loop_of(device)
            .ok_or_else(|| anyhow!("{text} is not a loop device, so it holds no volume"))?;
        let volumes = self.readable_volumes()?;
        let (backing, holders): (String, Vec<&Volume>) = match LoopDevice::open(number, false) {
            Ok(loop_device) => {
                let status = loop_device
                    .status()
                    .with_context(|| format!("reading the status of /dev/loop{number}"))?
                    .ok_or_else(|| {
                        anyhow!("/dev/loop{number} is bound to no file, so it holds no volume")
                    })?;
                let holders = volumes
                    .iter()
                    .filter(|volume| {
                        fs::metadata(self.root.host_path(&volume.path))
                            .is_ok_and(|meta| status.is_backed_by(meta.dev(), meta.ino()))
                    })
                    .collect();
                (backing_file_of(number), holders)
            }
            // Without root the device does not open: the kernel's record
            // of the backing file's path (what losetup shows) has to do.
            Err(_) => {
                let backing = backing_file_of(number);
                if backing.is_empty() {
                    bail!("/dev/loop{number} is bound to no file, so it holds no volume");
                }
                let holders = volumes
                    .iter()
                    .filter(|volume| {
                        canonical(&self.root.host_path(&volume.path)) == Path::new(&backing)
                    })
                    .collect();
                (backing, holders)
            }
        };
        let holders: Vec<VolumeId> = holders.iter().map(|volume| volume.id).collect();
        let holder = at_most_one(&holders, |several| {
            format!(
                "/dev/loop{number} is bound to the backing file of {several}; name one by its UUID"
            )
        })?;
        match holder {
            Some(id) => Ok((id, number)),
            None => {
                bail!(
                "/dev/loop{number} is bound to {}, which is no registered volume's backing file",
                if backing.is_empty() { "a file" } else { &backing }
            )
            }
        }
    }

    fn volume_at_path(&self, text: &str) -> Result<Option<VolumeId>> {
        let wanted = Path::new(text.trim_end_matches('/'));
        let mut found = Vec::new();
        for entry in self.entries()? {
            match entry.volume {
                Ok(volume) if volume.path == wanted => found.push(volume.id),
                Ok(_) => {}
                Err(error) if entry.named_path.as_deref() == Some(wanted) => bail!(
                    "{text} is named by {}, which does not read ({error}); fix that file first",
                    entry.file.display()
                ),
                Err(_) => {}
            }
        }
        at_most_one(&found, |several| {
            format!("{text} is the backing file of {several}; name one by its UUID")
        })
    }

    fn volume_by_uuid_prefix(&self, text: &str) -> Result<Option<VolumeId>> {
        let prefix = text.to_ascii_lowercase();
        let mut found = Vec::new();
        for entry in self.entries()? {
            let stem = entry
                .file
                .file_stem()
                .map(|stem| stem.to_string_lossy().into_owned())
                .unwrap_or_default();
            match entry.volume {
                Ok(volume) if volume.id.to_string().starts_with(&prefix) => found.push(volume.id),
                Ok(_) => {}
                Err(error) if stem.starts_with(&prefix) => bail!(
                    "{text:?} begins the name of {}, which does not read ({error}); fix that file first",
                    entry.file.display()
                ),
                Err(_) => {}
            }
        }
        at_most_one(&found, |several| {
            format!("{text:?} begins the UUIDs of {several}; give more of it")
        })
    }
}

/// The kernel's record of loop device `number`'s backing file, or empty.
fn backing_file_of(number: u32) -> String {
    fs::read_to_string(format!("/sys/block/loop{number}/loop/backing_file"))
        .map(|text| text.trim_end_matches('\n').to_string())
        .unwrap_or_default()
}

fn canonical(path: &Path) -> PathBuf {
    fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// The one volume found, none, or an error made by `ambiguity` from "N
/// volumes (UUID, UUID…)".
fn at_most_one(
    found: &[VolumeId],
    ambiguity: impl FnOnce(String) -> String,
) -> Result<Option<VolumeId>> {
    match found {
        [] => Ok(None),
        [id] => Ok(Some(*id)),
        several => {
            let ids: Vec<_> = several.iter().map(VolumeId::to_string).collect();
            bail!(ambiguity(format!(
                "{} volumes ({})",
                several.len(),
                ids.join(", ")
            )))
        }
    }
}
