//! A copy of a volume's backing file gets an identity of its own (a
//! clone, an import under a new UUID): `/dev/disk/by-uuid` and
//! `by-partuuid` must each lead to one volume, so nothing that reads the
//! copy may see the original's. Works on a file that nothing attaches.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use uuid::Uuid;

use crate::registry::Volume;
use crate::volume::filesystem::renew_uuid;
use crate::volume::gpt_layout;
use crate::volume::probe::{filesystem_at, probe, Content};
use crate::volume::spec::{FsType, Mode};

/// An ext4 its consumer made in a block volume's partition: its UUID,
/// and where the partition starts in the file.
#[derive(Debug, Clone, Copy)]
pub struct ConsumerFs {
    pub uuid: Uuid,
    pub start: u64,
}

/// A file system the consumer made inside a block volume's partition: a
/// copy would carry its UUID (two `/dev/disk/by-uuid` links fighting for
/// it). ext4 gets a new one in the copy; xfs cannot (its tools take no
/// offset into a file), so such a volume is refused.
pub fn consumer_file_system(file: &File, source: &Volume) -> Result<Option<ConsumerFs>> {
    if !source.mode.is_block() {
        return Ok(None);
    }
    let Some(start) = gpt_layout::partition_start(file, source.sector_size) else {
        return Ok(None);
    };
    let Some(Content::Filesystem { fs_type, uuid, .. }) = filesystem_at(file, start)? else {
        return Ok(None);
    };
    if fs_type == FsType::Xfs {
        bail!(
            "the partition of block volume {} holds an xfs (UUID {uuid}) that its consumer made: a copy would carry that UUID too (xfs refuses to mount the second, and /dev/disk/by-uuid/{uuid} would lead to either), and xfs_admin cannot change it inside a partition; refused",
            source.id
        );
    }
    Ok(Some(ConsumerFs { uuid, start }))
}

/// The copy's identity becomes `clone`'s (the copy holds `from`'s): a new file system UUID, or a
/// new GPT (disk GUID, partition GUID and name) and a new UUID for an
/// ext4 its consumer made in the partition; then read back, because one
/// of the tools says success when it refused. Returns that ext4's UUID.
pub fn renew_identity(
    temporary: &Path,
    file: &File,
    from: &Volume,
    clone: &Volume,
    consumer_fs: Option<ConsumerFs>,
) -> Result<Option<Uuid>> {
    match &clone.mode {
        Mode::Filesystem { fs_type, .. } => {
            tracing::info!(progress = true, "giving the copy's {fs_type} its own UUID");
            renew_uuid(temporary, *fs_type, clone.id.uuid())?;
        }
        Mode::Block => {
            tracing::info!(progress = true, "giving the copy's GPT its own GUIDs");
            gpt_layout::renew_identity(file, from.id.uuid(), clone.id.uuid(), clone.sector_size)?;
        }
    }
    let content = probe(file)?;
    if !clone.identity().is_held_by(&content) {
        bail!(
            "the copy holds {} after its identity was changed, not {}",
            content.describe(),
            clone.identity().describe()
        );
    }
    let Some(ConsumerFs { uuid: old, start }) = consumer_fs else {
        return Ok(None);
    };
    let fs_type = FsType::Ext4;
    let new = Uuid::new_v4();
    tracing::info!(
        progress = true,
        "giving the {fs_type} in the copy's partition its own UUID"
    );
    // e2fsprogs open a file system at an offset into an image this way.
    let inside = PathBuf::from(format!("{}?offset={start}", temporary.display()));
    renew_uuid(&inside, fs_type, new)?;
    match filesystem_at(file, start)? {
        Some(Content::Filesystem { uuid, .. }) if uuid == new => Ok(Some(new)),
        other => bail!(
            "the {fs_type} in the copy's partition still has {} after its UUID was changed (was {old})",
            other.map_or("no file system".to_string(), |c| c.describe())
        ),
    }
}
