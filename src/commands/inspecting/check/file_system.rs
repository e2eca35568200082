//! Findings about the file system inside a filesystem volume: errors its
//! superblock recorded, and a file system the kernel shut down. Repairing
//! either is the file system's own tool's work on the unmounted file
//! system, never ours: the findings say which command, on which device.

use std::fs;
use std::path::Path;

use anyhow::Result;

use super::{subject, Audit};
use crate::engine::inspect::utc;
use crate::kernel::fs_health::FsHealth;
use crate::registry::Volume;
use crate::volume::probe::ext4_recorded_errors;
use crate::volume::spec::{FsType, Mode};

const READ_ONLY_VOLUME: &str = "; the volume is read-only, so nothing here may repair it: repair the file system it was copied from, or make it writable (`sparse-volume apply --read-only false`) and repair it then";

fn e2fsck(target: &str) -> String {
    format!("`e2fsck -f {target}` at a terminal (it asks before each repair; `-y` repairs without asking)")
}

/// "; unmount it (/srv/a, /srv/b)".
fn unmount_from(health: &FsHealth) -> String {
    let points: Vec<String> = health
        .mount_points
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    format!("; unmount it ({})", points.join(", "))
}

/// An ext4 volume whose file system recorded errors: its data may be
/// damaged, and writes may already fail (errors=remount-ro). Mounted, the
/// kernel's count is read (sysfs); otherwise the superblock's, which stays
/// until e2fsck repaired the file system. Repairing it is e2fsck's work on
/// the unmounted file system, never ours.
pub(super) fn file_system_errors(
    audit: &mut Audit,
    volume: &Volume,
    file: &fs::File,
    devices: &[u32],
    path: &Path,
) -> Result<()> {
    // Mounted through any device that holds the file (a duplicate may be
    // the mounted one): that mount's count, and that device's name.
    let mounted = devices
        .iter()
        .find_map(|&n| FsHealth::of_mounted(&format!("loop{n}"), &audit.mounts).map(|h| (n, h)));
    let recorded = match mounted.as_ref().and_then(|(_, h)| h.errors) {
        Some(0) => None,
        Some(count) => mounted
            .as_ref()
            .map(|(_, h)| (count, h.first_error_time, h.last_error_time)),
        None => ext4_recorded_errors(file)?.map(|e| (u64::from(e.count), e.first, e.last)),
    };
    let Some((count, first, last)) = recorded else {
        return Ok(());
    };
    let when = match (first, last) {
        (Some(first), Some(last)) if first != last => {
            format!(" (the first at {}, the last at {})", utc(first), utc(last))
        }
        (_, Some(last)) => format!(" (the last at {})", utc(last)),
        _ => String::new(),
    };
    let errors = if count == 1 {
        "1 error".to_string()
    } else {
        format!("{count} errors")
    };
    let unmount = |health: &FsHealth| {
        let read_only = if health.read_only && !volume.read_only {
            "; the kernel has turned it read-only"
        } else {
            ""
        };
        format!("{read_only}{}", unmount_from(health))
    };
    // e2fsck only on the one device that holds the file, never beside a
    // second one it cannot see (one may be mounted), and never on a file
    // that is meant to stay as it is.
    let todo = if volume.read_only {
        READ_ONLY_VOLUME.to_string()
    } else {
        match (&mounted, devices) {
            (Some((number, health)), [_]) => format!(
                "{}, run {} and mount it again",
                unmount(health),
                e2fsck(&format!("/dev/loop{number}"))
            ),
            (Some((_, health)), _) => format!(
                "{} and, once one device alone holds the file (see the other findings), run `e2fsck -f` on it",
                unmount(health)
            ),
            (None, []) => format!(
                "; run {} before it is attached and mounted again",
                e2fsck(&path.display().to_string())
            ),
            (None, [number]) => format!(
                "; run {} before it is mounted again",
                e2fsck(&format!("/dev/loop{number}"))
            ),
            (None, _) => "; once one device alone holds the file (see the other findings), run `e2fsck -f` on it before it is mounted again".to_string(),
        }
    };
    audit.report(
        "file-system-errors",
        Some(volume),
        Some(path),
        format!(
            "{}: its ext4 file system recorded {errors}{when}{todo}",
            subject(volume)
        ),
    );
    Ok(())
}

/// A file system the kernel shut down after an error (xfs does where ext4
/// would turn read-only; ext4 after a forced shutdown): every access its
/// consumers make fails until it is unmounted.
pub(super) fn file_system_shut_down(
    audit: &mut Audit,
    volume: &Volume,
    devices: &[u32],
    path: &Path,
) {
    let Mode::Filesystem { fs_type, .. } = &volume.mode else {
        return;
    };
    let Some((number, health)) = devices.iter().find_map(|&n| {
        FsHealth::of_mounted(&format!("loop{n}"), &audit.mounts)
            .filter(|h| h.shut_down)
            .map(|h| (n, h))
    }) else {
        return;
    };
    let device = format!("/dev/loop{number}");
    let repair = match (volume.read_only, devices.len() == 1, fs_type) {
        (true, _, _) => READ_ONLY_VOLUME.to_string(),
        (false, false, _) => {
            " and, once one device alone holds the file (see the other findings), repair it"
                .to_string()
        }
        (false, true, FsType::Xfs) => format!(
            ", mount it once and unmount it again (that replays its log; if the mount fails, xfs_repair says what it needs), then run `xfs_repair -n {device}` to see the damage and `xfs_repair {device}` to repair it"
        ),
        (false, true, FsType::Ext4) => format!(", run {} and mount it again", e2fsck(&device)),
    };
    audit.report(
        "file-system-shut-down",
        Some(volume),
        Some(path),
        format!(
            "{}: the kernel shut its {fs_type} file system down after an error, so every access to it fails{}{repair}",
            subject(volume),
            unmount_from(&health)
        ),
    );
}
