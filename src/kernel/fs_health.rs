//! What the kernel says about a mounted file system's health: the error
//! counters ext4 keeps in its superblock and shows in sysfs
//! (`/sys/fs/ext4/<device>/`), and whether the superblock is read-only
//! (mountinfo's super options), as after `errors=remount-ro`.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::kernel::holders::unescape_mount_path;
use crate::kernel::sysfs::{read_attribute, read_number};

/// The mount table, read once for every device looked up in it.
pub struct MountTable {
    text: String,
}

impl MountTable {
    /// This process's mount namespace; empty when it cannot be read.
    pub fn read() -> Self {
        Self {
            text: std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default(),
        }
    }

    #[cfg(test)]
    fn from_text(text: &str) -> Self {
        Self {
            text: text.to_string(),
        }
    }

    /// Mounts of the device numbered `major:minor`: (mount point, file
    /// system type, superblock read-only).
    fn mounts_of(&self, device_number: &str) -> Vec<(PathBuf, String, bool)> {
        self.text
            .lines()
            .filter_map(|line| {
                let (before, after) = line.split_once(" - ")?;
                let fields: Vec<&str> = before.split(' ').collect();
                if fields.get(2) != Some(&device_number) {
                    return None;
                }
                let point = PathBuf::from(unescape_mount_path(fields.get(4)?));
                let mut after = after.split(' ');
                let fs_type = after.next()?.to_string();
                let super_options = after.nth(1).unwrap_or("");
                let read_only = super_options.split(',').any(|o| o == "ro");
                Some((point, fs_type, read_only))
            })
            .collect()
    }
}

/// The health of the file system on a mounted block device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FsHealth {
    /// Where it is mounted, as this process's mount namespace sees it.
    pub mount_points: Vec<PathBuf>,
    /// The kernel holds the file system read-only (mounted so, or turned
    /// read-only after an error).
    pub read_only: bool,
    /// ext4: errors recorded in its superblock, kept across mounts until
    /// e2fsck clears them; null for a file system that keeps no count (xfs).
    pub errors: Option<u64>,
    /// ext4: when the first and the last recorded error happened (Unix
    /// time); null when none was recorded.
    pub first_error_time: Option<u64>,
    pub last_error_time: Option<u64>,
}

impl FsHealth {
    /// The health of the file system on `/dev/<device>` (`loop3`); None
    /// when it is not mounted.
    pub fn of_mounted(device: &str, mounts: &MountTable) -> Option<Self> {
        let sys = Path::new("/sys/class/block").join(device);
        let number = read_attribute(&sys.join("dev")).ok()?;
        let found = mounts.mounts_of(number.trim());
        let (_, fs_type, _) = found.first()?;
        let ext4 = (fs_type == "ext4").then(|| Path::new("/sys/fs/ext4").join(device));
        let ext4_number = |name: &str| -> Option<u64> { read_number(&ext4.as_ref()?.join(name)) };
        // A time of 0 means no error was recorded.
        let time = |name: &str| ext4_number(name).filter(|t| *t != 0);
        Some(Self {
            read_only: found.iter().all(|(_, _, read_only)| *read_only),
            errors: ext4_number("errors_count"),
            first_error_time: time("first_error_time"),
            last_error_time: time("last_error_time"),
            mount_points: found.into_iter().map(|(point, _, _)| point).collect(),
        })
    }

    /// Errors are recorded: the file system needs a check.
    pub fn has_errors(&self) -> bool {
        self.errors.is_some_and(|n| n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro
96 22 7:3 / /srv/pg\\040data rw,relatime shared:50 - ext4 /dev/loop3 ro,errors=remount-ro
97 22 7:3 / /mnt/again rw,relatime shared:51 - ext4 /dev/loop3 ro,errors=remount-ro
98 22 7:4 / /srv/logs ro,relatime shared:52 - xfs /dev/loop4 rw,attr2,inode64
";

    #[test]
    fn mounts_are_found_by_device_number_with_the_superblocks_state() {
        let table = MountTable::from_text(MOUNTINFO);
        assert_eq!(
            table.mounts_of("7:3"),
            vec![
                (PathBuf::from("/srv/pg data"), "ext4".to_string(), true),
                (PathBuf::from("/mnt/again"), "ext4".to_string(), true),
            ]
        );
        // Read-only is the superblock's state, not one mount's flag.
        assert_eq!(
            table.mounts_of("7:4"),
            vec![(PathBuf::from("/srv/logs"), "xfs".to_string(), false)]
        );
        assert!(table.mounts_of("7:5").is_empty());
        assert!(table.mounts_of("7:").is_empty());
    }
}
