//! The block-mode layout: a protective MBR and a GPT with one partition
//! spanning the disk, whose unique partition GUID is the volume UUID.

use std::collections::BTreeMap;
use std::fs::File;

use anyhow::{anyhow, bail, Context, Result};
use gpt::disk::LogicalBlockSize;
use gpt::mbr::ProtectiveMBR;
use gpt::partition::Partition;
use gpt::partition_types;
use uuid::Uuid;

use crate::registry::SECTOR_SIZES;

/// 1 MiB, where every partitioning tool starts the first partition.
const ALIGNMENT_BYTES: u64 = 1 << 20;
const PARTITION_NAME: &str = "sparse-volume";

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
        name: PARTITION_NAME.to_string(),
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

/// The GPT in `file` (a backing file or a loop device) read with
/// `sector_size`-byte LBAs, read only.
pub fn read(file: &File, sector_size: u32) -> Option<gpt::GptDisk<&File>> {
    gpt::GptConfig::new()
        .writable(false)
        .logical_block_size(block_size(sector_size).ok()?)
        .open_from_device(file)
        .ok()
}

/// The GPT in `file` at whichever sector size it was written for (512
/// tried first), with that size.
pub fn read_any(file: &File) -> Option<(gpt::GptDisk<&File>, u32)> {
    SECTOR_SIZES
        .into_iter()
        .find_map(|size| read(file, size).map(|disk| (disk, size)))
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
