//! What a backing file or device holds, read from its first blocks:
//! the identities sparse-volume relies on (ext4/xfs UUID, GPT partition
//! GUIDs, a LUKS2 header's UUID), never more.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use anyhow::{Context, Result};
use uuid::Uuid;

use crate::volume::gpt_layout;
use crate::volume::spec::{FsType, Mode};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    Filesystem {
        fs_type: FsType,
        uuid: Uuid,
        /// The largest logical sector size it mounts on: ext4's block
        /// size, xfs's sector size (`sb_sectsize`).
        max_sector_size: u32,
    },
    /// A GPT; `partitions` are (number, unique partition GUID).
    PartitionTable {
        partitions: Vec<(u32, Uuid)>,
        /// The sector size its LBAs count in: it is seen only on a device
        /// with exactly these sectors.
        sector_size: u32,
        /// The UUID of a LUKS2 header at the start of partition 1 (an
        /// encrypted block volume's): such a partition holds ciphertext,
        /// which a plain block volume must never hand a consumer.
        header_inside: Option<Uuid>,
    },
    /// A LUKS2 header (an encrypted volume's backing file); what it
    /// holds is only seen once opened.
    Luks2 { uuid: Uuid },
    /// No signature we know (which is not proof of emptiness).
    Unrecognised,
}

impl Content {
    pub fn describe(&self) -> String {
        match self {
            Content::Filesystem { fs_type, uuid, .. } => {
                format!("an {fs_type} file system with UUID {uuid}")
            }
            Content::PartitionTable {
                partitions,
                header_inside,
                ..
            } => match (partitions.first(), header_inside) {
                (Some((number, guid)), Some(header)) => format!(
                    "a GPT whose partition {number} has GUID {guid} and holds a LUKS2 header with UUID {header}"
                ),
                (Some((number, guid)), None) => {
                    format!("a GPT whose partition {number} has GUID {guid}")
                }
                (None, _) => "a GPT without partitions".to_string(),
            },
            Content::Luks2 { uuid } => format!("a LUKS2 header with UUID {uuid}"),
            Content::Unrecognised => "no recognised file system or partition table".to_string(),
        }
    }

    /// Whether it reads on a loop device with `sector_size`-byte sectors.
    pub fn works_with_sector_size(&self, sector_size: u32) -> bool {
        match self {
            Content::Filesystem {
                max_sector_size, ..
            } => sector_size <= *max_sector_size,
            Content::PartitionTable {
                sector_size: own, ..
            } => sector_size == *own,
            // The header sets its own encryption sector size (create
            // passes the volume's); what reads inside is the file system's.
            Content::Luks2 { .. } | Content::Unrecognised => true,
        }
    }

    /// The sector sizes it reads with, in words, for refusals.
    pub fn sector_requirement(&self) -> String {
        match self {
            Content::Filesystem {
                fs_type,
                max_sector_size,
                ..
            } => format!(
                "an {fs_type} file system that needs sectors of at most {max_sector_size} bytes"
            ),
            Content::PartitionTable { sector_size, .. } => {
                format!("a GPT written for {sector_size}-byte sectors")
            }
            Content::Luks2 { .. } => "a LUKS2 header".to_string(),
            Content::Unrecognised => "no recognised content".to_string(),
        }
    }

    /// The sector size adopted content was made for, given the logical
    /// block size of the device under the backing file: a GPT's own; xfs's
    /// `sb_sectsize` (4096 when it is that large, else 512); ext4 works on
    /// 512 with any block size, so 4096 only when its blocks and the
    /// backing device both are, which keeps direct I/O possible there.
    pub fn preferred_sector_size(&self, backing_block_size: u32) -> u32 {
        match self {
            Content::PartitionTable { sector_size, .. } => *sector_size,
            Content::Filesystem {
                fs_type: FsType::Xfs,
                max_sector_size,
                ..
            } if *max_sector_size >= 4096 => 4096,
            Content::Filesystem {
                fs_type: FsType::Ext4,
                max_sector_size,
                ..
            } if *max_sector_size >= 4096 && backing_block_size >= 4096 => 4096,
            _ => 512,
        }
    }
}

/// What a volume's backing file holds when it is this volume: the file
/// system or partition carrying the volume UUID, or for an encrypted
/// volume the LUKS2 header with its own UUID (the volume UUID is inside).
#[derive(Debug, Clone, Copy)]
pub struct Identity<'a> {
    pub mode: &'a Mode,
    pub uuid: Uuid,
    pub luks_uuid: Option<Uuid>,
}

impl<'a> Identity<'a> {
    /// A volume that is not encrypted.
    pub fn plain(mode: &'a Mode, uuid: Uuid) -> Self {
        Identity {
            mode,
            uuid,
            luks_uuid: None,
        }
    }

    /// What an encrypted volume's opened device holds: the plain identity.
    pub fn inside(&self) -> Identity<'a> {
        Identity::plain(self.mode, self.uuid)
    }

    /// Whether `content` is this volume's backing file (or, for
    /// [`Identity::inside`], its opened device).
    pub fn is_held_by(&self, content: &Content) -> bool {
        // A block volume's header is inside its partition: the backing
        // file holds the partition table, as a plain block volume's does.
        if let (Some(luks_uuid), Mode::Filesystem { .. }) = (self.luks_uuid, self.mode) {
            return *content == Content::Luks2 { uuid: luks_uuid };
        }
        match (self.mode, content) {
            (
                Mode::Filesystem { fs_type, .. },
                Content::Filesystem {
                    fs_type: found,
                    uuid: found_uuid,
                    ..
                },
            ) => fs_type == found && *found_uuid == self.uuid,
            (
                Mode::Block,
                Content::PartitionTable {
                    partitions,
                    header_inside,
                    ..
                },
            ) => partitions.contains(&(1, self.uuid)) && *header_inside == self.luks_uuid,
            _ => false,
        }
    }

    /// Fails, naming what `path` holds, unless `content` is this volume.
    pub fn require_in(&self, content: &Content, path: &Path) -> Result<()> {
        if !self.is_held_by(content) {
            anyhow::bail!(
                "backing file {} holds {}, not {}",
                path.display(),
                content.describe(),
                self.describe()
            );
        }
        Ok(())
    }

    /// What `is_held_by` looks for, in words.
    pub fn describe(&self) -> String {
        if let (Some(luks_uuid), Mode::Filesystem { .. }) = (self.luks_uuid, self.mode) {
            return format!("a LUKS2 header with UUID {luks_uuid}");
        }
        match self.mode {
            Mode::Filesystem { fs_type, .. } => {
                format!("an {fs_type} file system with UUID {}", self.uuid)
            }
            Mode::Block => match self.luks_uuid {
                Some(header) => format!(
                    "a GPT whose partition 1 has GUID {} and holds a LUKS2 header with UUID {header}",
                    self.uuid
                ),
                None => format!("a GPT whose partition 1 has GUID {}", self.uuid),
            },
        }
    }
}

const EXT_SUPERBLOCK: u64 = 1024;
const EXT_LOG_BLOCK_SIZE_OFFSET: usize = 0x18;
const EXT_MAGIC_OFFSET: usize = 0x38;
const EXT_UUID_OFFSET: usize = 0x68;
const EXT_MAGIC: u16 = 0xEF53;
const XFS_MAGIC: &[u8; 4] = b"XFSB";
const XFS_UUID_OFFSET: usize = 32;
/// `sb_sectsize`, big-endian u16.
const XFS_SECTSIZE_OFFSET: usize = 102;

/// How much of the start `probe` reads for file system signatures.
const HEAD_BYTES: usize = 4096;

/// Reads the signatures at the start of `file` (a regular file or a block
/// device; both are read the same way).
pub fn probe(file: &File) -> Result<Content> {
    let mut head = [0u8; HEAD_BYTES];
    let length = read_up_to(file, &mut head, 0)?;
    if let Some(content) = luks2_in(&head[..length]).or_else(|| filesystem_in(&head[..length])) {
        return Ok(content);
    }
    let Some((disk, sector_size)) = gpt_layout::read_any(file) else {
        return Ok(Content::Unrecognised);
    };
    let header_inside = match first_partition_start(&disk, sector_size) {
        Some(start) => luks2_at(file, start)?,
        None => None,
    };
    Ok(gpt_content(&disk, sector_size, header_inside))
}

/// The UUID of the LUKS2 header at `offset` in `file` (an encrypted block
/// volume's, at the start of its partition), if one is there.
pub fn luks2_at(file: &File, offset: u64) -> Result<Option<Uuid>> {
    let mut head = [0u8; HEAD_BYTES];
    let length = read_up_to(file, &mut head, offset)?;
    Ok(match luks2_in(&head[..length]) {
        Some(Content::Luks2 { uuid }) => Some(uuid),
        _ => None,
    })
}

/// The file system whose first block is at `offset` in `file` (one a
/// consumer made in a block volume's partition), if any.
pub fn filesystem_at(file: &File, offset: u64) -> Result<Option<Content>> {
    let mut head = [0u8; HEAD_BYTES];
    let length = read_up_to(file, &mut head, offset)?;
    Ok(filesystem_in(&head[..length]))
}

/// [`probe`] of a file whose whole content is `image`: the same parsers
/// without a file, for fuzzing them.
pub fn probe_image(image: &[u8]) -> Content {
    let head = &image[..image.len().min(HEAD_BYTES)];
    if let Some(content) = luks2_in(head).or_else(|| filesystem_in(head)) {
        return content;
    }
    let Some((disk, sector_size)) = gpt_layout::read_any_in_image(image) else {
        return Content::Unrecognised;
    };
    let header_inside = first_partition_start(&disk, sector_size)
        .and_then(|start| usize::try_from(start).ok())
        .and_then(|start| image.get(start..))
        .and_then(|rest| match luks2_in(&rest[..rest.len().min(HEAD_BYTES)]) {
            Some(Content::Luks2 { uuid }) => Some(uuid),
            _ => None,
        });
    gpt_content(&disk, sector_size, header_inside)
}

const LUKS_MAGIC: &[u8; 6] = b"LUKS\xba\xbe";
const LUKS_VERSION_OFFSET: usize = 6;
/// The UUID as text (36 characters, NUL-padded to 40) in the binary header.
const LUKS_UUID_OFFSET: usize = 168;
const LUKS_UUID_LENGTH: usize = 40;

/// A LUKS2 binary header. Only its magic, version and UUID are read: the
/// rest is cryptsetup's to interpret.
fn luks2_in(head: &[u8]) -> Option<Content> {
    if head.len() < LUKS_UUID_OFFSET + LUKS_UUID_LENGTH || &head[..6] != LUKS_MAGIC {
        return None;
    }
    let version = u16::from_be_bytes([head[LUKS_VERSION_OFFSET], head[LUKS_VERSION_OFFSET + 1]]);
    if version != 2 {
        return None;
    }
    let field = &head[LUKS_UUID_OFFSET..LUKS_UUID_OFFSET + LUKS_UUID_LENGTH];
    let text = field.split(|b| *b == 0).next().unwrap_or_default();
    let uuid = std::str::from_utf8(text).ok()?.parse().ok()?;
    Some(Content::Luks2 { uuid })
}

fn filesystem_in(head: &[u8]) -> Option<Content> {
    if head.len() >= XFS_SECTSIZE_OFFSET + 2 && &head[..4] == XFS_MAGIC {
        let sector_size =
            u16::from_be_bytes([head[XFS_SECTSIZE_OFFSET], head[XFS_SECTSIZE_OFFSET + 1]]);
        return Some(Content::Filesystem {
            fs_type: FsType::Xfs,
            uuid: uuid_at(head, XFS_UUID_OFFSET),
            // A damaged value: assume the smallest, which xfs always reads.
            max_sector_size: u32::from(sector_size).max(512),
        });
    }
    let superblock = EXT_SUPERBLOCK as usize;
    if head.len() >= superblock + EXT_UUID_OFFSET + 16 {
        let ext = &head[superblock..];
        let magic = u16::from_le_bytes([ext[EXT_MAGIC_OFFSET], ext[EXT_MAGIC_OFFSET + 1]]);
        if magic == EXT_MAGIC {
            let offset = EXT_LOG_BLOCK_SIZE_OFFSET;
            let log = u32::from_le_bytes([
                ext[offset],
                ext[offset + 1],
                ext[offset + 2],
                ext[offset + 3],
            ]);
            return Some(Content::Filesystem {
                fs_type: FsType::Ext4,
                uuid: uuid_at(ext, EXT_UUID_OFFSET),
                // Block size 1024 << s_log_block_size (at most 64 KiB).
                max_sector_size: 1024u32.checked_shl(log.min(6)).unwrap_or(1024),
            });
        }
    }
    None
}

/// The errors an ext4 file system recorded in its superblock (the kernel
/// counts them there, and e2fsck clears them once it repaired them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordedErrors {
    pub count: u32,
    /// When the first and the last happened (Unix time); None when unset.
    pub first: Option<u64>,
    pub last: Option<u64>,
}

/// `s_error_count`, and the times of the first and last error (low 32
/// bits: good until 2106).
const EXT_ERROR_COUNT_OFFSET: usize = 0x194;
const EXT_FIRST_ERROR_TIME_OFFSET: usize = 0x198;
const EXT_LAST_ERROR_TIME_OFFSET: usize = 0x1CC;

/// What the ext4 superblock at the start of `file` recorded of errors;
/// None when it holds no ext4, or recorded none.
pub fn ext4_recorded_errors(file: &File) -> Result<Option<RecordedErrors>> {
    let mut head = [0u8; HEAD_BYTES];
    let length = read_up_to(file, &mut head, 0)?;
    Ok(recorded_errors_in(&head[..length]))
}

fn recorded_errors_in(head: &[u8]) -> Option<RecordedErrors> {
    let ext = head.get(EXT_SUPERBLOCK as usize..)?;
    let u16_at = |offset: usize| {
        Some(u16::from_le_bytes(
            ext.get(offset..offset + 2)?.try_into().ok()?,
        ))
    };
    let u32_at = |offset: usize| {
        Some(u32::from_le_bytes(
            ext.get(offset..offset + 4)?.try_into().ok()?,
        ))
    };
    if u16_at(EXT_MAGIC_OFFSET)? != EXT_MAGIC {
        return None;
    }
    // The kernel counts every error it records. The "errors" bit of
    // s_state alone is also set by tools while they work (resize2fs, until
    // it is done), so that an interrupted run gets checked: the command
    // that was interrupted finishes it (`resize` runs e2fsck first).
    let count = u32_at(EXT_ERROR_COUNT_OFFSET)?;
    if count == 0 {
        return None;
    }
    let time = |offset| u32_at(offset).filter(|t| *t != 0).map(u64::from);
    Some(RecordedErrors {
        count,
        first: time(EXT_FIRST_ERROR_TIME_OFFSET),
        last: time(EXT_LAST_ERROR_TIME_OFFSET),
    })
}

fn uuid_at(buffer: &[u8], offset: usize) -> Uuid {
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&buffer[offset..offset + 16]);
    Uuid::from_bytes(bytes)
}

/// GPT headers store GUIDs in mixed-endian form; the `gpt` crate decodes
/// them into the same `Uuid` that udev prints in `by-partuuid`.
fn gpt_content<D>(
    disk: &gpt::GptDisk<D>,
    sector_size: u32,
    header_inside: Option<Uuid>,
) -> Content {
    let partitions = disk
        .partitions()
        .iter()
        .filter(|(_, p)| p.is_used())
        .map(|(number, p)| (*number, p.part_guid))
        .collect();
    Content::PartitionTable {
        partitions,
        sector_size,
        header_inside,
    }
}

/// Where partition 1 starts, in bytes.
fn first_partition_start<D>(disk: &gpt::GptDisk<D>, sector_size: u32) -> Option<u64> {
    disk.partitions()
        .get(&1)
        .filter(|p| p.is_used())?
        .first_lba
        .checked_mul(u64::from(sector_size))
}

fn read_up_to(file: &File, buffer: &mut [u8], offset: u64) -> Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        let n = file
            .read_at(&mut buffer[filled..], offset + filled as u64)
            .context("reading the volume's first blocks")?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_with(bytes_at: &[(usize, &[u8])], len: usize) -> File {
        let mut image = vec![0u8; len];
        for (offset, bytes) in bytes_at {
            image[*offset..offset + bytes.len()].copy_from_slice(bytes);
        }
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&image).unwrap();
        file
    }

    const UUID: &str = "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b";

    #[test]
    fn reads_ext4_identity() {
        let uuid = Uuid::parse_str(UUID).unwrap();
        let file = file_with(
            &[
                (1024 + 0x18, &[2, 0, 0, 0]),
                (1024 + 0x38, &[0x53, 0xEF]),
                (1024 + 0x68, uuid.as_bytes()),
            ],
            8192,
        );
        let content = probe(&file).unwrap();
        assert_eq!(
            content,
            Content::Filesystem {
                fs_type: FsType::Ext4,
                uuid,
                max_sector_size: 4096,
            }
        );
        assert!(content.works_with_sector_size(512) && content.works_with_sector_size(4096));
        assert_eq!(content.preferred_sector_size(512), 512);
        assert_eq!(content.preferred_sector_size(4096), 4096);
    }

    #[test]
    fn reads_xfs_identity() {
        let uuid = Uuid::parse_str(UUID).unwrap();
        let file = file_with(&[(0, b"XFSB"), (32, uuid.as_bytes()), (102, &[2, 0])], 8192);
        let content = probe(&file).unwrap();
        assert_eq!(
            content,
            Content::Filesystem {
                fs_type: FsType::Xfs,
                uuid,
                max_sector_size: 512,
            }
        );
        assert!(!content.works_with_sector_size(4096));
        assert_eq!(content.preferred_sector_size(4096), 512);
        let file = file_with(
            &[(0, b"XFSB"), (32, uuid.as_bytes()), (102, &[16, 0])],
            8192,
        );
        assert_eq!(probe(&file).unwrap().preferred_sector_size(512), 4096);
    }

    #[test]
    fn reads_a_luks2_header_uuid_and_nothing_of_luks1() {
        let uuid = Uuid::parse_str(UUID).unwrap();
        let text = uuid.to_string();
        let header = |version: &[u8]| {
            file_with(
                &[(0, b"LUKS\xba\xbe"), (6, version), (168, text.as_bytes())],
                8192,
            )
        };
        let content = probe(&header(&[0, 2])).unwrap();
        assert_eq!(content, Content::Luks2 { uuid });
        let mode = Mode::Filesystem {
            fs_type: FsType::Ext4,
            mkfs_options: Vec::new(),
        };
        let encrypted = Identity {
            mode: &mode,
            uuid: Uuid::nil(),
            luks_uuid: Some(uuid),
        };
        assert!(encrypted.is_held_by(&content));
        assert!(!encrypted.inside().is_held_by(&content));
        assert!(!Identity::plain(&mode, uuid).is_held_by(&content));
        // A block volume's header is inside its partition: its backing
        // file holds the partition table, never the header itself.
        let block = Identity {
            mode: &Mode::Block,
            uuid: Uuid::nil(),
            luks_uuid: Some(uuid),
        };
        assert!(!block.is_held_by(&content));
        assert_eq!(probe(&header(&[0, 1])).unwrap(), Content::Unrecognised);
    }

    #[test]
    fn a_gpt_with_a_luks2_header_in_its_partition_is_only_the_encrypted_volume() {
        let uuid = Uuid::parse_str(UUID).unwrap();
        let luks = Uuid::new_v4();
        let text = luks.to_string();
        for sector_size in [512, 4096] {
            let file = tempfile::tempfile().unwrap();
            file.set_len(8 << 20).unwrap();
            let partition = gpt_layout::write_new(&file, uuid, sector_size).unwrap();
            let at = partition.start_bytes();
            for (offset, bytes) in [
                (at, &b"LUKS\xba\xbe"[..]),
                (at + 6, &[0, 2][..]),
                (at + 168, text.as_bytes()),
            ] {
                file.write_all_at(bytes, offset).unwrap();
            }
            let content = probe(&file).unwrap();
            let encrypted = Identity {
                mode: &Mode::Block,
                uuid,
                luks_uuid: Some(luks),
            };
            assert!(encrypted.is_held_by(&content), "{content:?}");
            // Registered plain, its partition would hand out ciphertext.
            assert!(!Identity::plain(&Mode::Block, uuid).is_held_by(&content));
            assert!(content.describe().contains(&text), "{}", content.describe());
        }
    }

    #[test]
    fn finds_a_luks2_header_at_an_offset() {
        let uuid = Uuid::parse_str(UUID).unwrap();
        let text = uuid.to_string();
        let at = 1 << 20;
        let file = file_with(
            &[
                (at, b"LUKS\xba\xbe"),
                (at + 6, &[0, 2]),
                (at + 168, text.as_bytes()),
            ],
            (2 << 20) as usize,
        );
        assert_eq!(luks2_at(&file, at as u64).unwrap(), Some(uuid));
        assert_eq!(luks2_at(&file, 0).unwrap(), None);
    }

    #[test]
    fn finds_a_gpt_at_either_sector_size() {
        let uuid = Uuid::parse_str(UUID).unwrap();
        for sector_size in [512, 4096] {
            let file = tempfile::tempfile().unwrap();
            file.set_len(8 << 20).unwrap();
            gpt_layout::write_new(&file, uuid, sector_size).unwrap();
            let content = probe(&file).unwrap();
            assert_eq!(
                content,
                Content::PartitionTable {
                    partitions: vec![(1, uuid)],
                    sector_size,
                    header_inside: None,
                }
            );
            assert!(Identity::plain(&Mode::Block, uuid).is_held_by(&content));
            assert!(content.works_with_sector_size(sector_size));
            assert!(!content.works_with_sector_size(4608 - sector_size));
            assert_eq!(content.preferred_sector_size(512), sector_size);
        }
    }

    /// The fuzzed entry point reads what the product's reads.
    #[test]
    fn image_and_file_probes_agree() {
        let uuid = Uuid::parse_str(UUID).unwrap();
        let gpt = tempfile::tempfile().unwrap();
        gpt.set_len(2 << 20).unwrap();
        gpt_layout::write_new(&gpt, uuid, 512).unwrap();
        let mut gpt_image = vec![0u8; 2 << 20];
        gpt.read_exact_at(&mut gpt_image, 0).unwrap();
        let mut ext4 = vec![0u8; 8192];
        ext4[1024 + 0x38..][..2].copy_from_slice(&[0x53, 0xEF]);
        let mut xfs = vec![0u8; 4096];
        xfs[..4].copy_from_slice(b"XFSB");
        for (image, expected) in [
            (gpt_image, "GPT"),
            (ext4, "ext4"),
            (xfs, "xfs"),
            (vec![0u8; 100], "no recognised"),
        ] {
            let from_image = probe_image(&image);
            assert!(from_image.describe().contains(expected), "{from_image:?}");
            assert_eq!(
                probe(&file_with(&[(0, &image)], image.len())).unwrap(),
                from_image
            );
        }
    }

    #[test]
    fn reads_the_errors_an_ext4_superblock_recorded() {
        let mut image = vec![0u8; 4096];
        image[1024 + 0x38..][..2].copy_from_slice(&[0x53, 0xEF]);
        assert_eq!(recorded_errors_in(&image), None, "a clean file system");
        image[1024 + 0x194..][..4].copy_from_slice(&3u32.to_le_bytes());
        image[1024 + 0x198..][..4].copy_from_slice(&1_796_000_000u32.to_le_bytes());
        image[1024 + 0x1CC..][..4].copy_from_slice(&1_796_476_127u32.to_le_bytes());
        assert_eq!(
            recorded_errors_in(&image),
            Some(RecordedErrors {
                count: 3,
                first: Some(1_796_000_000),
                last: Some(1_796_476_127)
            })
        );
        // Marked "with errors" by a tool at work (resize2fs), not counted
        // by the kernel: not a recorded error.
        let mut marked = vec![0u8; 4096];
        marked[1024 + 0x38..][..2].copy_from_slice(&[0x53, 0xEF]);
        marked[1024 + 0x3A..][..2].copy_from_slice(&2u16.to_le_bytes());
        assert_eq!(recorded_errors_in(&marked), None);
        image[1024 + 0x38] = 0;
        assert_eq!(recorded_errors_in(&image), None, "no ext4");
        assert_eq!(recorded_errors_in(&image[..1100]), None, "short");
    }

    #[test]
    fn zeros_and_short_files_are_unrecognised() {
        assert_eq!(
            probe(&file_with(&[], 1 << 20)).unwrap(),
            Content::Unrecognised
        );
        assert_eq!(probe(&file_with(&[], 100)).unwrap(), Content::Unrecognised);
    }
}
