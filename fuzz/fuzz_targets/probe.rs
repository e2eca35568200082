//! The content probe: the first blocks of a backing file, which may hold
//! anything (a foreign image, a damaged or forged table).
//!
//! Each input is probed twice: as it is, and with its GPT CRCs made right
//! (the fuzzer cannot forge a CRC32, so without this it would never get
//! past the headers into the entry parsing).
//!
//! Properties: never panics, never reads outside the image (ASan), and
//! what it finds is consistent: the same answer from a file with these
//! bytes as from the image; file system block/sector sizes within what
//! the formats allow; a GPT only at a supported sector size, with its
//! partitions numbered from 1 and its own sector size preferred; whatever
//! is found identifies the volume it names.
#![no_main]

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sparse_volume::volume::probe::{probe, probe_image, Content, Identity};
use sparse_volume::volume::spec::{FsType, Mode, SECTOR_SIZES};

const CRC: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);
const HEADER_BYTES: usize = 92;

fn u32_at(image: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(image[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(image: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(image[at..at + 8].try_into().expect("8 bytes"))
}

/// Rewrites the entry-array CRC and the header CRC of a GPT header at
/// `at`, if there is one, so that the parser trusts it.
fn fix_header(image: &mut [u8], at: usize, sector_size: usize) {
    if image.len() < at + HEADER_BYTES || &image[at..at + 8] != b"EFI PART" {
        return;
    }
    let start = u64_at(image, at + 72).checked_mul(sector_size as u64);
    let length = u64::from(u32_at(image, at + 80)) * u64::from(u32_at(image, at + 84));
    if let Some(end) = start.and_then(|s| s.checked_add(length)) {
        if end <= image.len() as u64 {
            let entries = &image[start.unwrap_or(0) as usize..end as usize];
            let crc = CRC.checksum(entries);
            image[at + 88..at + 92].copy_from_slice(&crc.to_le_bytes());
        }
    }
    image[at + 16..at + 20].fill(0);
    let crc = CRC.checksum(&image[at..at + HEADER_BYTES]);
    image[at + 16..at + 20].copy_from_slice(&crc.to_le_bytes());
}

fn with_fixed_crcs(data: &[u8]) -> Vec<u8> {
    let mut image = data.to_vec();
    for sector_size in SECTOR_SIZES.map(|s| s as usize) {
        fix_header(&mut image, sector_size, sector_size);
        let backup = (image.len() / sector_size).saturating_sub(1) * sector_size;
        if backup > sector_size {
            fix_header(&mut image, backup, sector_size);
        }
    }
    image
}

/// One file per process, rewritten for every input.
fn scratch() -> &'static File {
    static FILE: OnceLock<File> = OnceLock::new();
    FILE.get_or_init(|| tempfile::tempfile().expect("a temporary file"))
}

fn check(image: &[u8]) {
    let content = probe_image(image);
    assert_eq!(probe_image(image), content, "not deterministic");

    let file = scratch();
    file.set_len(0).expect("truncating the scratch file");
    file.write_all_at(image, 0)
        .expect("writing the scratch file");
    assert_eq!(probe(file).expect("reading the scratch file"), content);

    assert!(!content.describe().is_empty());
    assert!(!content.sector_requirement().is_empty());
    match &content {
        Content::Filesystem {
            fs_type,
            uuid,
            max_sector_size,
        } => {
            match fs_type {
                FsType::Ext4 => assert!(
                    max_sector_size.is_power_of_two() && (1024..=65536).contains(max_sector_size),
                    "ext4 block size {max_sector_size}"
                ),
                FsType::Xfs => assert!(*max_sector_size >= 512),
            }
            assert!(content.works_with_sector_size(512));
            let mode = Mode::Filesystem {
                fs_type: *fs_type,
                mkfs_options: Vec::new(),
            };
            assert!(Identity::plain(&mode, *uuid).is_held_by(&content));
            assert!(!Identity::plain(&Mode::Block, *uuid).is_held_by(&content));
        }
        Content::PartitionTable {
            partitions,
            sector_size,
            header_inside,
        } => {
            assert!(SECTOR_SIZES.contains(sector_size));
            assert!(content.works_with_sector_size(*sector_size));
            assert_eq!(content.preferred_sector_size(512), *sector_size);
            assert!(partitions.windows(2).all(|w| w[0].0 < w[1].0));
            assert!(partitions.iter().all(|(number, _)| *number >= 1));
            if let Some((1, guid)) = partitions.first() {
                // A header inside partition 1 makes it an encrypted block
                // volume's, and only that.
                let encrypted = Identity {
                    mode: &Mode::Block,
                    uuid: *guid,
                    luks_uuid: *header_inside,
                };
                assert!(encrypted.is_held_by(&content));
                assert_eq!(
                    Identity::plain(&Mode::Block, *guid).is_held_by(&content),
                    header_inside.is_none()
                );
            }
        }
        Content::Luks2 { uuid } => {
            let mode = Mode::Filesystem {
                fs_type: FsType::Ext4,
                mkfs_options: Vec::new(),
            };
            let encrypted = Identity {
                mode: &mode,
                uuid: *uuid,
                luks_uuid: Some(*uuid),
            };
            assert!(encrypted.is_held_by(&content));
            assert!(!encrypted.inside().is_held_by(&content));
        }
        Content::Unrecognised => {
            assert!(SECTOR_SIZES
                .iter()
                .all(|&s| content.works_with_sector_size(s)));
        }
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    let fixed = with_fixed_crcs(data);
    if fixed != data {
        check(&fixed);
    }
});
