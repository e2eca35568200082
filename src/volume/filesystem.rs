//! The file system tools: mkfs at create, growing at resize, a new UUID
//! for a clone.

use std::ffi::OsString;
use std::fs::File;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};
use uuid::Uuid;

use crate::kernel::child_process::{finish, run, run_command, tool_command};
use crate::kernel::private_mount;
use crate::volume::growing_mark::{
    clear_growing_mark, interrupted_grow, last_mount_time, set_growing_mark,
};
use crate::volume::spec::FsType;

/// The smallest xfs that mkfs.xfs (5.19 and later: Debian 12 and 13 ship
/// 6.x) makes; smaller ones fail after the backing file was made.
pub const XFS_MIN_SIZE: u64 = 300 << 20;

/// What mkfs is known to refuse, said before anything is made.
pub fn refuse_known_mkfs_failures(fs_type: FsType, size: u64) -> Result<()> {
    if fs_type == FsType::Xfs && size < XFS_MIN_SIZE {
        anyhow::bail!(
            "an xfs volume needs at least 300 MiB (mkfs.xfs refuses smaller file systems); ask for --size 300M or more, or use ext4"
        );
    }
    Ok(())
}

/// Makes a file system whose UUID is the volume UUID, for a device with
/// `sector_size`-byte logical sectors. Discards are off: on a file they
/// punch holes, which would undo a preallocation. ext4 gets 4 KiB blocks
/// even when small: volumes are made to grow, current kernels refuse to
/// grow 1 KiB-block ext4 online, and 4 KiB blocks mount on 512- and
/// 4096-byte sectors alike. xfs is told the sector size: on a file it
/// cannot see the device it will be mounted from.
pub fn make_filesystem(
    target: &Path,
    fs_type: FsType,
    uuid: Uuid,
    sector_size: u32,
    options: &[String],
) -> Result<()> {
    let uuid = uuid.hyphenated().to_string();
    let (program, mut args): (&str, Vec<OsString>) = match fs_type {
        FsType::Ext4 => (
            "mkfs.ext4",
            ["-q", "-F", "-b", "4096", "-E", "nodiscard", "-U", &uuid]
                .map(OsString::from)
                .into(),
        ),
        FsType::Xfs => (
            "mkfs.xfs",
            [
                "-q",
                "-K",
                "-m",
                &format!("uuid={uuid}"),
                "-s",
                &format!("size={sector_size}"),
            ]
            .map(OsString::from)
            .into(),
        ),
    };
    args.extend(options.iter().map(OsString::from));
    args.push(target.as_os_str().to_owned());
    tracing::info!(
        progress = true,
        "making the {fs_type} file system ({program})"
    );
    run(program, args)
}

/// Grows an ext4 file system that is mounted (by a consumer) to fill its
/// device: resize2fs asks the kernel, which grows it online (journaled).
pub fn grow_mounted_ext4(device: &Path) -> Result<()> {
    run("resize2fs", [device.as_os_str()])
}

/// Grows an ext4 file system that nothing mounts, on `target` (its loop
/// device or its backing file), to fill it. resize2fs insists on a fresh
/// fsck first. Neither tool is atomic, so both run so that a kill or a
/// crash at any point leaves something the next call repairs:
/// - `UNIX_IO_FORCE_BOUNCE`: e2fsprogs (1.46.2 and later) then writes the
///   superblock whole, in one write, as a side effect of its bounce-buffer
///   I/O path. Otherwise it rewrites only the changed fields, a few bytes
///   at a time and the checksum last, and a kill in between leaves a
///   superblock that neither the kernel nor e2fsck opens (one-group file
///   systems have no backup superblock to fall back on);
/// - resize2fs runs under the growing mark (growing_mark.rs), so that the
///   next grow repairs what an interrupted one left with `e2fsck -y`.
pub fn grow_unmounted_ext4(target: &Path, backing: &File) -> Result<()> {
    let last_mount = last_mount_time(target)?;
    check_before_grow(target, interrupted_grow(backing, last_mount))?;
    set_growing_mark(backing, last_mount)?;
    let mut resize = e2fsprogs_command("resize2fs");
    resize.arg(target);
    run_command("resize2fs", resize, &[0])?;
    clear_growing_mark(backing)
}

/// The fresh `e2fsck -f` resize2fs wants: `-p`, which repairs only what is
/// safe unattended, and `-y` only for what our own interrupted grow left.
fn check_before_grow(target: &Path, after_interrupted_grow: bool) -> Result<()> {
    let fsck = |answer: &str| {
        let mut command = e2fsprogs_command("e2fsck");
        command.args([OsString::from("-f"), answer.into(), target.into()]);
        finish("e2fsck", command)
    };
    // Exit status 1 is "errors corrected", 4 "errors left uncorrected".
    let preen = fsck("-p")?;
    match preen.code() {
        Some(0 | 1) => Ok(()),
        Some(4) if after_interrupted_grow => {
            let repaired = fsck("-y")?;
            if matches!(repaired.code(), Some(0 | 1)) {
                return Ok(());
            }
            Err(repaired.failure().context(format!(
                "repairing what an interrupted grow left on {}",
                target.display()
            )))
        }
        Some(4) => Err(preen.failure().context(format!(
            "the file system on {t} has damage that is not repaired unattended; check it with `e2fsck -f {t}`, then resize again",
            t = target.display()
        ))),
        _ => Err(preen.failure()),
    }
}

/// Gives the file system in `target` (a copy of a volume, which nothing
/// mounts) the UUID `to`. ext4: with `metadata_csum` (the default) every
/// checksum is seeded with the UUID, so tune2fs rewrites them all, and it
/// does so only on a file system checked since its last mount: e2fsck
/// first, repairing only what is safe unattended. xfs: xfs_admin writes the
/// new UUID beside the one its metadata keeps, but only with a clean log,
/// and it exits 0 when it refuses: the caller must read the UUID back.
pub fn renew_uuid(target: &Path, fs_type: FsType, to: Uuid) -> Result<()> {
    let uuid = to.hyphenated().to_string();
    match fs_type {
        FsType::Ext4 => {
            let mut fsck = e2fsprogs_command("e2fsck");
            fsck.args([OsString::from("-f"), "-p".into(), target.into()]);
            let checked = finish("e2fsck", fsck)?;
            if !matches!(checked.code(), Some(0 | 1)) {
                return Err(checked.failure().context(
                    "the copied file system has damage that is not repaired unattended (the source's file system needs a check)",
                ));
            }
            let mut tune = e2fsprogs_command("tune2fs");
            tune.args([OsString::from("-U"), uuid.into(), target.into()]);
            run_command("tune2fs", tune, &[0])
        }
        FsType::Xfs => run(
            "xfs_admin",
            [OsString::from("-U"), uuid.into(), target.into()],
        ),
    }
}

/// A command for an e2fsprogs tool that writes superblocks whole.
fn e2fsprogs_command(program: &str) -> Command {
    let mut command = tool_command(program);
    command.env("UNIX_IO_FORCE_BOUNCE", "1");
    command
}

/// xfs grows only while mounted, addressed by its mount point.
pub fn grow_mounted_xfs(mount_point: &Path) -> Result<()> {
    run("xfs_growfs", [mount_point.as_os_str()])
}

/// Grows the xfs on `device`, which nothing mounts: xfs grows only while
/// mounted, so xfs_growfs runs in a mount namespace of its own with the
/// file system mounted on `mount_point`. The namespace ends with the tool,
/// and with it the mount, however the tool or its caller ends: nothing is
/// left mounted for the next command to trip over.
pub fn grow_unmounted_xfs(device: &Path, mount_point: &Path) -> Result<()> {
    let mut command = tool_command("xfs_growfs");
    command.arg(mount_point);
    private_mount::mount_before_exec(&mut command, device, mount_point, "xfs")
        .with_context(|| format!("preparing to mount {} to grow it", device.display()))?;
    // A failed unshare or mount fails the start of xfs_growfs.
    run_command("xfs_growfs", command, &[0]).with_context(|| {
        format!(
            "mounting {} in a private mount namespace and growing it there",
            device.display()
        )
    })
}
