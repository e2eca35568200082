//! What the kernel says about a mounted file system's health: the error
//! counters ext4 keeps in its superblock and shows in sysfs
//! (`/sys/fs/ext4/<device>/`), whether the superblock is read-only
//! (mountinfo's super options), as after `errors=remount-ro`, and whether
//! the kernel shut the file system down after an error. xfs never turns
//! read-only: it shuts down, and keeps no error count the kernel shows.

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

    /// Mounts of the device numbered `major:minor`.
    fn mounts_of(&self, device_number: &str) -> Vec<Mount> {
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
                let super_options: Vec<&str> = after.nth(1).unwrap_or("").split(',').collect();
                Some(Mount {
                    point,
                    fs_type,
                    read_only: super_options.contains(&"ro"),
                    // ext4 says so here (kernels from 6.6); xfs does not.
                    shut_down: super_options.contains(&"shutdown"),
                })
            })
            .collect()
    }
}

/// One line of the mount table.
#[derive(Debug, PartialEq, Eq)]
struct Mount {
    point: PathBuf,
    fs_type: String,
    /// The superblock's state, not this mount's flag.
    read_only: bool,
    shut_down: bool,
}

/// A shut-down xfs refuses to open anything on it, its root included
/// (EIO), and says so nowhere else. Opening a directory costs no I/O.
fn refuses_access(point: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NONBLOCK)
        .open(point)
        .is_err_and(|e| e.raw_os_error() == Some(libc::EIO))
}

/// The health of the file system on a mounted block device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FsHealth {
    /// Where it is mounted, as this process's mount namespace sees it.
    pub mount_points: Vec<PathBuf>,
    /// The kernel holds the file system read-only (mounted so, or turned
    /// read-only after an error).
    pub read_only: bool,
    /// The kernel shut the file system down after an error (xfs, or ext4
    /// after a forced shutdown): every access fails with an I/O error
    /// until it is unmounted.
    pub shut_down: bool,
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
        let first = found.first()?;
        let ext4 = (first.fs_type == "ext4").then(|| Path::new("/sys/fs/ext4").join(device));
        let ext4_number = |name: &str| -> Option<u64> { read_number(&ext4.as_ref()?.join(name)) };
        // A time of 0 means no error was recorded.
        let time = |name: &str| ext4_number(name).filter(|t| *t != 0);
        Some(Self {
            read_only: found.iter().all(|m| m.read_only),
            shut_down: first.shut_down || (first.fs_type == "xfs" && refuses_access(&first.point)),
            errors: ext4_number("errors_count"),
            first_error_time: time("first_error_time"),
            last_error_time: time("last_error_time"),
            mount_points: found.into_iter().map(|m| m.point).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro
95 22 7:2 / /srv/down rw,relatime shared:49 - ext4 /dev/loop2 rw,shutdown
96 22 7:3 / /srv/pg\\040data rw,relatime shared:50 - ext4 /dev/loop3 ro,errors=remount-ro
97 22 7:3 / /mnt/again rw,relatime shared:51 - ext4 /dev/loop3 ro,errors=remount-ro
98 22 7:4 / /srv/logs ro,relatime shared:52 - xfs /dev/loop4 rw,attr2,inode64
";

    fn mount(point: &str, fs_type: &str, read_only: bool, shut_down: bool) -> Mount {
        Mount {
            point: PathBuf::from(point),
            fs_type: fs_type.to_string(),
            read_only,
            shut_down,
        }
    }

    #[test]
    fn mounts_are_found_by_device_number_with_the_superblocks_state() {
        let table = MountTable::from_text(MOUNTINFO);
        assert_eq!(
            table.mounts_of("7:3"),
            vec![
                mount("/srv/pg data", "ext4", true, false),
                mount("/mnt/again", "ext4", true, false),
            ]
        );
        // Read-only is the superblock's state, not one mount's flag.
        assert_eq!(
            table.mounts_of("7:4"),
            vec![mount("/srv/logs", "xfs", false, false)]
        );
        assert_eq!(
            table.mounts_of("7:2"),
            vec![mount("/srv/down", "ext4", false, true)]
        );
        assert!(table.mounts_of("7:5").is_empty());
        assert!(table.mounts_of("7:").is_empty());
    }
}
