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

const SECTOR: u64 = 512;
/// 1 MiB, where every partitioning tool starts the first partition.
const ALIGNMENT_SECTORS: u64 = 2048;
const PARTITION_NAME: &str = "sparse-volume";

/// The partition as the table describes it, in 512-byte sectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionExtent {
    pub first_sector: u64,
    pub last_sector: u64,
}

impl PartitionExtent {
    pub fn start_bytes(&self) -> u64 {
        self.first_sector * SECTOR
    }

    pub fn length_bytes(&self) -> u64 {
        (self.last_sector - self.first_sector + 1) * SECTOR
    }
}

fn config() -> gpt::GptConfig {
    gpt::GptConfig::new()
        .writable(true)
        .logical_block_size(LogicalBlockSize::Lb512)
}

fn protective_mbr(size_bytes: u64) -> ProtectiveMBR {
    let sectors = (size_bytes / SECTOR).saturating_sub(1);
    ProtectiveMBR::with_lb_size(u32::try_from(sectors).unwrap_or(u32::MAX))
}

fn gpt_error(what: &str) -> impl FnOnce(gpt::GptError) -> anyhow::Error + '_ {
    move |e| anyhow!("{what}: {e}")
}

/// Writes a new table on an all-zero file of its final size.
pub fn write_new(file: &File, volume: Uuid) -> Result<PartitionExtent> {
    let size = file
        .metadata()
        .context("inspecting the new backing file")?
        .len();
    let mut device = file;
    protective_mbr(size)
        .overwrite_lba0(&mut device)
        .map_err(|e| anyhow!("writing the protective MBR: {e}"))?;
    let mut disk = config()
        .create_from_device(file, None)
        .map_err(gpt_error("creating the GPT"))?;
    let first = disk
        .header()
        .first_usable
        .next_multiple_of(ALIGNMENT_SECTORS);
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
    })
}

/// After the file grew: moves the backup GPT to the new end and extends
/// partition 1 (which must carry `volume`) to the last usable sector.
/// Data stays where it is: only the partition's end moves.
pub fn grow_to_end(file: &File, volume: Uuid) -> Result<PartitionExtent> {
    let size = file
        .metadata()
        .context("inspecting the backing file")?
        .len();
    let mut disk = config()
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
    protective_mbr(size)
        .overwrite_lba0(&mut device)
        .map_err(|e| anyhow!("writing the protective MBR: {e}"))?;
    Ok(PartitionExtent {
        first_sector: partition.first_lba,
        last_sector: last,
    })
}

/// The GPT in `file` (a backing file or a loop device), read only.
pub fn read(file: &File) -> Option<gpt::GptDisk<&File>> {
    gpt::GptConfig::new()
        .writable(false)
        .logical_block_size(LogicalBlockSize::Lb512)
        .open_from_device(file)
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Partition 1 of the table in `file`, if it carries `volume`.
    fn volume_partition(file: &File, volume: Uuid) -> Option<PartitionExtent> {
        let disk = read(file)?;
        let partition = disk
            .partitions()
            .get(&1)
            .filter(|p| p.part_guid == volume)?;
        Some(PartitionExtent {
            first_sector: partition.first_lba,
            last_sector: partition.last_lba,
        })
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
        let path = dir.path().join("disk");
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.set_len(32 << 20).unwrap();
        let volume = Uuid::new_v4();
        let extent = write_new(&file, volume).unwrap();
        assert_eq!(extent.first_sector, 2048);
        assert_eq!(volume_partition(&file, volume), Some(extent));
        assert!(sgdisk(&["-v"], &path).contains("No problems found"));
        let info = sgdisk(&["-i", "1"], &path);
        assert!(
            info.contains(&volume.hyphenated().to_string().to_uppercase()),
            "{info}"
        );

        file.set_len(64 << 20).unwrap();
        let grown = grow_to_end(&file, volume).unwrap();
        assert_eq!(grown.first_sector, extent.first_sector);
        assert!(grown.last_sector > extent.last_sector + 60_000);
        assert!(
            sgdisk(&["-v"], &path).contains("No problems found"),
            "{}",
            sgdisk(&["-v"], &path)
        );
        assert_eq!(volume_partition(&file, volume), Some(grown));
        assert!(grow_to_end(&file, Uuid::new_v4()).is_err());
    }
}
