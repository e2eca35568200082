//! The block-mode layout: a protective MBR and a GPT with one partition
//! spanning the disk, whose unique partition GUID is the volume UUID.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Cursor, Read, Seek, SeekFrom, Write};

use anyhow::{anyhow, bail, Context, Result};
use gpt::disk::LogicalBlockSize;
use gpt::mbr::ProtectiveMBR;
use gpt::partition::Partition;
use gpt::partition_types;
use gpt::DiskDevice;
use uuid::Uuid;

use crate::volume::spec::SECTOR_SIZES;

/// 1 MiB, where every partitioning tool starts the first partition.
const ALIGNMENT_BYTES: u64 = 1 << 20;
/// What every block volume's partition was named before 0.3: N volumes
/// then contend for one /dev/disk/by-partlabel link (and udev slows down
/// badly on many partitions of one name, systemd issue 20212). New
/// partitions are named with the volume's UUID (36 characters, the most a
/// GPT name holds): unique, and unchanged by a rename of the volume.
pub const SHARED_PARTITION_NAME: &str = "sparse-volume";

/// The partition as the table describes it, in sectors of `sector_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionExtent {
    pub first_sector: u64,
    pub last_sector: u64,
    pub sector_size: u32,
}

impl PartitionExtent {
    pub fn start_bytes(&self) -> u64 {
        self.first_sector * u64::from(self.sector_size)
    }

    pub fn length_bytes(&self) -> u64 {
        (self.last_sector - self.first_sector + 1) * u64::from(self.sector_size)
    }
}

/// A GPT's LBAs are logical sectors of the disk it is read on: a table
/// written for 512-byte sectors is invisible on a 4096-byte device.
fn block_size(sector_size: u32) -> Result<LogicalBlockSize> {
    match sector_size {
        512 => Ok(LogicalBlockSize::Lb512),
        4096 => Ok(LogicalBlockSize::Lb4096),
        other => bail!("{other}-byte sectors are not supported (512 or 4096)"),
    }
}

fn config(sector_size: u32) -> Result<gpt::GptConfig> {
    Ok(gpt::GptConfig::new()
        .writable(true)
        .logical_block_size(block_size(sector_size)?))
}

/// The protective MBR covers the disk in its own sectors (capped, as the
/// UEFI spec asks, at what 32 bits hold).
fn protective_mbr(size_bytes: u64, sector_size: u32) -> ProtectiveMBR {
    let sectors = (size_bytes / u64::from(sector_size)).saturating_sub(1);
    ProtectiveMBR::with_lb_size(u32::try_from(sectors).unwrap_or(u32::MAX))
}

fn gpt_error(what: &str) -> impl FnOnce(gpt::GptError) -> anyhow::Error + '_ {
    move |e| anyhow!("{what}: {e}")
}

/// Writes a new table for `sector_size`-byte sectors on an all-zero file of
/// its final size.
pub fn write_new(file: &File, volume: Uuid, sector_size: u32) -> Result<PartitionExtent> {
    let size = file
        .metadata()
        .context("inspecting the new backing file")?
        .len();
    let mut disk = config(sector_size)?
        .create_from_device(file, None)
        .map_err(gpt_error("creating the GPT"))?;
    let mut device = file;
    protective_mbr(size, sector_size)
        .overwrite_lba0(&mut device)
        .map_err(|e| anyhow!("writing the protective MBR: {e}"))?;
    let first = disk
        .header()
        .first_usable
        .next_multiple_of(ALIGNMENT_BYTES / u64::from(sector_size));
    let last = disk.header().last_usable;
    if first > last {
        bail!("{size} bytes is too small for a partition table");
    }
    let partition = Partition {
        part_type_guid: partition_types::LINUX_FS,
        part_guid: volume,
        first_lba: first,
        last_lba: last,
        flags: 0,
        name: volume.hyphenated().to_string(),
    };
    disk.update_partitions(BTreeMap::from([(1, partition)]))
        .map_err(gpt_error("laying out the partition"))?;
    disk.write_inplace().map_err(gpt_error("writing the GPT"))?;
    Ok(PartitionExtent {
        first_sector: first,
        last_sector: last,
        sector_size,
    })
}

/// After the file grew: moves the backup GPT to the new end and extends
/// partition 1 (which must carry `volume`) to the last usable sector.
/// Data stays where it is: only the partition's end moves.
pub fn grow_to_end(file: &File, volume: Uuid, sector_size: u32) -> Result<PartitionExtent> {
    let size = file
        .metadata()
        .context("inspecting the backing file")?
        .len();
    if !header_is_sane(&mut &*file, u64::from(sector_size)).context("reading the GPT")? {
        bail!("the GPT has an entry array this version cannot read");
    }
    let mut disk = config(sector_size)?
        .open_from_device(file)
        .map_err(gpt_error("reading the GPT"))?;
    let mut partitions = disk.partitions().clone();
    let Some(partition) = partitions
        .get(&1)
        .filter(|p| p.part_guid == volume)
        .cloned()
    else {
        bail!("partition 1 does not carry the volume UUID {volume}");
    };
    // Rebuilding the headers against the new size moves the backup header
    // and raises the last usable sector.
    disk.update_partitions(partitions.clone())
        .map_err(gpt_error("recomputing the GPT headers"))?;
    let last = disk.header().last_usable;
    if last < partition.last_lba {
        bail!("the partition table is larger than the file");
    }
    partitions.insert(
        1,
        Partition {
            last_lba: last,
            ..partition.clone()
        },
    );
    disk.update_partitions(partitions)
        .map_err(gpt_error("extending the partition"))?;
    disk.write_inplace().map_err(gpt_error("writing the GPT"))?;
    let mut device = file;
    protective_mbr(size, sector_size)
        .overwrite_lba0(&mut device)
        .map_err(|e| anyhow!("writing the protective MBR: {e}"))?;
    Ok(PartitionExtent {
        first_sector: partition.first_lba,
        last_sector: last,
        sector_size,
    })
}

/// Gives a copy of a block volume an identity of its own: a new disk GUID,
/// and partition 1 (which must carry `from`) the GUID and the name of
/// `to`. Only the table changes: the partition keeps its place and data.
pub fn renew_identity(file: &File, from: Uuid, to: Uuid, sector_size: u32) -> Result<()> {
    if !header_is_sane(&mut &*file, u64::from(sector_size)).context("reading the GPT")? {
        bail!("the GPT has an entry array this version cannot read");
    }
    let mut disk = config(sector_size)?
        .open_from_device(file)
        .map_err(gpt_error("reading the GPT"))?;
    let mut partitions = disk.partitions().clone();
    let Some(partition) = partitions.get(&1).filter(|p| p.part_guid == from).cloned() else {
        bail!("partition 1 does not carry the volume UUID {from}");
    };
    partitions.insert(
        1,
        Partition {
            part_guid: to,
            name: to.hyphenated().to_string(),
            ..partition
        },
    );
    disk.update_guid(Some(Uuid::new_v4()));
    disk.update_partitions(partitions)
        .map_err(gpt_error("renaming the partition"))?;
    disk.write_inplace().map_err(gpt_error("writing the GPT"))
}

/// Where partition 1 of the GPT in `file` starts, in bytes.
pub fn partition_start(file: &File, sector_size: u32) -> Option<u64> {
    let disk = read(file, sector_size)?;
    let first = disk.partitions().get(&1)?.first_lba;
    first.checked_mul(u64::from(sector_size))
}

/// The name of partition 1 of the GPT in `file`, if it reads.
pub fn partition_name(file: &File, sector_size: u32) -> Option<String> {
    let disk = read(file, sector_size)?;
    disk.partitions().get(&1).map(|p| p.name.clone())
}

/// The GPT in `file` (a backing file or a loop device) read with
/// `sector_size`-byte LBAs, read only.
pub fn read(file: &File, sector_size: u32) -> Option<gpt::GptDisk<&File>> {
    open_read_only(file, sector_size)
}

/// The GPT in `file` at whichever sector size it was written for (512
/// tried first), with that size.
pub fn read_any(file: &File) -> Option<(gpt::GptDisk<&File>, u32)> {
    read_any_with(|| file)
}

/// [`read_any`] of a file whose whole content is `image`.
pub fn read_any_in_image(image: &[u8]) -> Option<(gpt::GptDisk<Image<'_>>, u32)> {
    read_any_with(|| Image(Cursor::new(image)))
}

fn read_any_with<D: DiskDevice>(device: impl Fn() -> D) -> Option<(gpt::GptDisk<D>, u32)> {
    SECTOR_SIZES
        .into_iter()
        .find_map(|size| open_read_only(device(), size).map(|disk| (disk, size)))
}

fn open_read_only<D: DiskDevice>(mut device: D, sector_size: u32) -> Option<gpt::GptDisk<D>> {
    let block_size = block_size(sector_size).ok()?;
    if !header_is_sane(&mut device, u64::from(sector_size)).ok()? {
        return None;
    }
    gpt::GptConfig::new()
        .writable(false)
        .logical_block_size(block_size)
        .open_from_device(device)
        .ok()
}

/// An in-memory disk image, read only: what the `gpt` crate reads when
/// there is no file (tests and fuzzing of the parser).
#[derive(Debug)]
pub struct Image<'a>(Cursor<&'a [u8]>);

impl Read for Image<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buffer)
    }
}

impl Seek for Image<'_> {
    fn seek(&mut self, position: SeekFrom) -> std::io::Result<u64> {
        self.0.seek(position)
    }
}

impl Write for Image<'_> {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        Err(std::io::ErrorKind::PermissionDenied.into())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

const GPT_SIGNATURE: &[u8; 8] = b"EFI PART";
/// The part of a GPT header its CRC covers (UEFI 2.x revision 1.0).
const GPT_HEADER_BYTES: usize = 92;
const GPT_HEADER_CRC_OFFSET: usize = 16;
const GPT_ENTRY_COUNT_OFFSET: usize = 80;
const GPT_ENTRY_SIZE_OFFSET: usize = 84;
/// The only entry size the `gpt` crate reads (it panics on any other).
const GPT_ENTRY_BYTES: u32 = 128;
/// The `gpt` crate reads and buffers the whole entry array; a forged
/// count would have it read up to 512 GiB. No table that leaves the first
/// partition at 1 MiB is larger than this.
const GPT_MAX_ENTRY_ARRAY: u64 = 1 << 20;

/// Whether the header the `gpt` crate would choose (the primary at LBA 1
/// when its CRC holds, else the backup in the device's last LBA) has
/// entries it can read without panicking or exhausting memory. Headers
/// with a wrong CRC are skipped, as the crate skips them.
fn header_is_sane<D: Read + Seek>(device: &mut D, sector_size: u64) -> std::io::Result<bool> {
    let length = device.seek(SeekFrom::End(0))?;
    let backup = (length / sector_size).saturating_sub(1) * sector_size;
    for offset in [sector_size, backup] {
        if let Some(header) = valid_header_at(device, offset)? {
            let field = |at: usize| {
                u32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
            };
            let entries = u64::from(field(GPT_ENTRY_COUNT_OFFSET));
            return Ok(field(GPT_ENTRY_SIZE_OFFSET) == GPT_ENTRY_BYTES
                && entries * u64::from(GPT_ENTRY_BYTES) <= GPT_MAX_ENTRY_ARRAY);
        }
    }
    // Neither header is valid: the crate finds no table either.
    Ok(true)
}

/// The GPT header at `offset` if its signature and CRC are right.
fn valid_header_at<D: Read + Seek>(
    device: &mut D,
    offset: u64,
) -> std::io::Result<Option<[u8; GPT_HEADER_BYTES]>> {
    let mut header = [0u8; GPT_HEADER_BYTES];
    device.seek(SeekFrom::Start(offset))?;
    match device.read_exact(&mut header) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    if &header[..GPT_SIGNATURE.len()] != GPT_SIGNATURE {
        return Ok(None);
    }
    let crc_field = GPT_HEADER_CRC_OFFSET..GPT_HEADER_CRC_OFFSET + 4;
    let stored = u32::from_le_bytes([
        header[crc_field.start],
        header[crc_field.start + 1],
        header[crc_field.start + 2],
        header[crc_field.start + 3],
    ]);
    let mut zeroed = header;
    zeroed[crc_field].fill(0);
    Ok((crc32(&zeroed) == stored).then_some(header))
}

/// CRC-32 as GPT uses it (IEEE 802.3, reflected, as in zlib).
fn crc32(bytes: &[u8]) -> u32 {
    const POLYNOMIAL: u32 = 0xEDB8_8320;
    let mut crc = u32::MAX;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            let carry = crc & 1;
            crc >>= 1;
            if carry == 1 {
                crc ^= POLYNOMIAL;
            }
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Partition 1 of the table in `file`, if it carries `volume`.
    fn volume_partition(file: &File, volume: Uuid, sector_size: u32) -> Option<PartitionExtent> {
        let disk = read(file, sector_size)?;
        let partition = disk
            .partitions()
            .get(&1)
            .filter(|p| p.part_guid == volume)?;
        Some(PartitionExtent {
            first_sector: partition.first_lba,
            last_sector: partition.last_lba,
            sector_size,
        })
    }

    fn sized_file(dir: &tempfile::TempDir, size: u64) -> (std::path::PathBuf, File) {
        let path = dir.path().join("disk");
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.set_len(size).unwrap();
        (path, file)
    }

    fn sgdisk(args: &[&str], file: &std::path::Path) -> String {
        let output = Command::new("sgdisk")
            .args(args)
            .arg(file)
            .output()
            .expect("sgdisk");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    #[test]
    fn new_table_is_valid_for_sgdisk_and_grows() {
        let dir = tempfile::tempdir().unwrap();
        let (path, file) = sized_file(&dir, 32 << 20);
        let volume = Uuid::new_v4();
        let extent = write_new(&file, volume, 512).unwrap();
        assert_eq!(extent.first_sector, 2048);
        assert_eq!(extent.start_bytes(), 1 << 20);
        assert_eq!(volume_partition(&file, volume, 512), Some(extent));
        assert!(read(&file, 4096).is_none());
        assert!(sgdisk(&["-v"], &path).contains("No problems found"));
        let info = sgdisk(&["-i", "1"], &path);
        assert!(
            info.contains(&volume.hyphenated().to_string().to_uppercase()),
            "{info}"
        );

        file.set_len(64 << 20).unwrap();
        let grown = grow_to_end(&file, volume, 512).unwrap();
        assert_eq!(grown.first_sector, extent.first_sector);
        assert!(grown.last_sector > extent.last_sector + 60_000);
        assert!(
            sgdisk(&["-v"], &path).contains("No problems found"),
            "{}",
            sgdisk(&["-v"], &path)
        );
        assert_eq!(volume_partition(&file, volume, 512), Some(grown));
        assert!(grow_to_end(&file, Uuid::new_v4(), 512).is_err());
    }

    #[test]
    fn a_renewed_identity_changes_every_guid_and_the_name_but_not_the_extent() {
        for sector_size in [512, 4096] {
            let dir = tempfile::tempdir().unwrap();
            let (path, file) = sized_file(&dir, 32 << 20);
            let (from, to) = (Uuid::new_v4(), Uuid::new_v4());
            let extent = write_new(&file, from, sector_size).unwrap();
            let disk_guid = *read(&file, sector_size).unwrap().guid();
            assert!(renew_identity(&file, to, Uuid::new_v4(), sector_size).is_err());
            renew_identity(&file, from, to, sector_size).unwrap();
            assert_eq!(volume_partition(&file, to, sector_size), Some(extent));
            assert_eq!(volume_partition(&file, from, sector_size), None);
            assert_eq!(
                partition_name(&file, sector_size),
                Some(to.hyphenated().to_string())
            );
            assert_ne!(*read(&file, sector_size).unwrap().guid(), disk_guid);
            if sector_size == 512 {
                assert!(sgdisk(&["-v"], &path).contains("No problems found"));
            }
        }
    }

    /// A table of ours whose primary header is rewritten by `patch`, with
    /// its CRC made right again, as an image.
    fn image_with_primary(patch: impl Fn(&mut [u8])) -> Vec<u8> {
        let file = tempfile::tempfile().unwrap();
        file.set_len(2 << 20).unwrap();
        write_new(&file, Uuid::new_v4(), 512).unwrap();
        let mut image = vec![0u8; 2 << 20];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut image, 0).unwrap();
        let header = &mut image[512..512 + GPT_HEADER_BYTES];
        patch(header);
        header[GPT_HEADER_CRC_OFFSET..GPT_HEADER_CRC_OFFSET + 4].fill(0);
        let crc = crc32(header);
        header[GPT_HEADER_CRC_OFFSET..GPT_HEADER_CRC_OFFSET + 4]
            .copy_from_slice(&crc.to_le_bytes());
        image
    }

    #[test]
    fn crc32_is_the_ieee_one() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    /// The `gpt` crate asserts 128-byte entries and allocates the whole
    /// array a header declares: such tables are not read at all.
    #[test]
    fn entry_layouts_the_crate_cannot_read_are_refused() {
        let untouched = image_with_primary(|_| {});
        assert!(read_any_in_image(&untouched).is_some());
        let wide = image_with_primary(|h| h[GPT_ENTRY_SIZE_OFFSET] = 0);
        assert!(read_any_in_image(&wide).is_none());
        let huge = image_with_primary(|h| h[GPT_ENTRY_COUNT_OFFSET..][..4].fill(0xff));
        assert!(read_any_in_image(&huge).is_none());
        // Through a file as well, where resize reads it.
        let file = tempfile::tempfile().unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, &wide, 0).unwrap();
        assert!(read_any(&file).is_none());
        assert!(grow_to_end(&file, Uuid::new_v4(), 512).is_err());
    }

    /// A primary header with a wrong CRC is skipped, for the backup.
    #[test]
    fn a_damaged_primary_falls_back_to_the_backup() {
        let mut image = image_with_primary(|_| {});
        image[512 + GPT_HEADER_CRC_OFFSET] ^= 1;
        let (disk, size) = read_any_in_image(&image).unwrap();
        assert_eq!(size, 512);
        assert_eq!(disk.partitions().len(), 1);
        let mut image = image_with_primary(|h| h[GPT_ENTRY_SIZE_OFFSET] = 0);
        image[512 + GPT_HEADER_CRC_OFFSET] ^= 1;
        assert!(read_any_in_image(&image).is_some());
    }

    /// sgdisk reads a file as 512-byte sectors, so the 4096-byte layout is
    /// checked here by the numbers and through a 4K loop device in
    /// tests/sector_size.rs.
    #[test]
    fn tables_for_4096_byte_sectors_align_to_1_mib_and_grow() {
        let dir = tempfile::tempdir().unwrap();
        let (_, file) = sized_file(&dir, 32 << 20);
        let volume = Uuid::new_v4();
        let extent = write_new(&file, volume, 4096).unwrap();
        // Backup header plus 16 KiB of entries: 5 sectors at the end.
        let sectors = (32 << 20) / 4096;
        assert_eq!(
            (extent.first_sector, extent.last_sector),
            (256, sectors - 6)
        );
        assert_eq!(extent.start_bytes(), 1 << 20);
        assert_eq!(extent.length_bytes(), (sectors - 6 - 255) * 4096);
        assert!(read(&file, 512).is_none());
        let (_, found) = read_any(&file).unwrap();
        assert_eq!(found, 4096);
        assert_eq!(volume_partition(&file, volume, 4096), Some(extent));
        let mut mbr = [0u8; 512];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut mbr, 0).unwrap();
        // Partition record 1: type 0xEE, size in 4096-byte sectors.
        assert_eq!(mbr[446 + 4], 0xEE);
        let mbr_sectors = u32::from_le_bytes(mbr[446 + 12..446 + 16].try_into().unwrap());
        assert_eq!(u64::from(mbr_sectors), sectors - 1);

        file.set_len(64 << 20).unwrap();
        let grown = grow_to_end(&file, volume, 4096).unwrap();
        assert_eq!(grown.first_sector, 256);
        assert_eq!(grown.last_sector, (64 << 20) / 4096 - 6);
        assert_eq!(volume_partition(&file, volume, 4096), Some(grown));
        assert!(write_new(&file, volume, 1024).is_err());
    }
}
