//! Binding a backing file to a free loop device, in systemd's order:
//! lock `/dev/loop-control`, take a free device, lock the device, configure
//! it, verify what the kernel really did, and only then let udev see it.
//! Unlike systemd's, a block volume's partition must appear exactly once,
//! as consumers start on it at boot: the device is configured through a
//! descriptor whose close udev does not watch (see `unwatched`), and its
//! partitions are scanned in a single step (`scan_partitions_once`).

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use nix::errno::Errno;

use super::device::{LockedControl, LockedLoopDevice, LoopDevice, LoopStatus};
use super::discard::{forbid_discards, renew_device, DiscardLimits};
use super::ioctl::{
    LoopInfo64, LO_FLAGS_AUTOCLEAR, LO_FLAGS_DIRECT_IO, LO_FLAGS_PARTSCAN, LO_FLAGS_READ_ONLY,
};
use crate::hooks::{self, Fault};
use crate::kernel::signals;

/// Another process (one that ignores the control lock, such as `losetup`)
/// can take the device we were handed; we then ask again.
const MAX_ATTEMPTS: u32 = 64;
/// How often a sparse volume is moved off devices that carry a
/// preallocated volume's discard limit before it keeps one.
const MAX_RESIDUE_MOVES: u32 = 4;

#[derive(Clone, Debug)]
pub struct BindOptions {
    pub read_only: bool,
    pub partition_scan: bool,
    pub direct_io: bool,
    /// The logical sector size the device must present (512 or 4096).
    /// Always passed to the kernel: its default follows the backing disk
    /// under direct I/O on 6.14+, which a volume's GPT or xfs may not fit.
    pub block_size: u32,
    /// Stored in `lo_file_name`, so the device can be found without the file.
    pub reference: String,
    /// Whether discards may punch holes into the backing file. Off for
    /// preallocated volumes: their space is a promise a consumer's `fstrim`
    /// must not quietly break.
    pub discard: bool,
}

#[derive(Clone, Debug)]
pub struct Bound {
    pub number: u32,
    pub status: LoopStatus,
    /// How the kernel was asked: `LOOP_CONFIGURE` or the pre-5.8 fallback.
    pub legacy_ioctls: bool,
    /// What the caller should pass on to the user.
    pub warnings: Vec<String>,
}

impl BindOptions {
    fn info(&self, direct_io: bool) -> LoopInfo64 {
        let mut info = LoopInfo64::default();
        info.set_file_name(&self.reference);
        if self.read_only {
            info.lo_flags |= LO_FLAGS_READ_ONLY;
        }
        if self.partition_scan {
            info.lo_flags |= LO_FLAGS_PARTSCAN;
        }
        if direct_io {
            info.lo_flags |= LO_FLAGS_DIRECT_IO;
        }
        info
    }
}

/// Binds `backing` (opened read-write, or read-only for a read-only
/// volume) to a new loop device.
pub fn bind_to_free_device(backing: &File, options: &BindOptions) -> Result<Bound> {
    let mut warnings = Vec::new();
    let mut moves = 0;
    for attempt in 0..MAX_ATTEMPTS {
        if signals::requested() {
            bail!("stopped (SIGTERM or SIGINT) before a loop device was bound");
        }
        let control = LockedControl::acquire()?;
        let number = control.get_free()?;
        let device = LockedLoopDevice::claim(number, !options.read_only)?;
        // Someone bound it between GET_FREE and our lock: ask again.
        if matches!(device.status(), Ok(Some(_))) {
            drop(device);
            drop(control);
            back_off(attempt);
            continue;
        }
        // A preallocated volume left its "no discards" on this number;
        // a sparse volume must not inherit it, and only a new device of
        // that number is rid of it. Decided before binding: a device we
        // bound and then released could stay bound while another opener
        // holds it, leaving the file on two devices.
        let limits = (options.discard && moves < MAX_RESIDUE_MOVES)
            .then(|| DiscardLimits::of(number))
            .flatten();
        if limits.is_some_and(|limits| limits.turned_off()) {
            drop(device);
            renew_device(&control, number);
            moves += 1;
            continue;
        }
        // Seen free of the residue before binding: a bind gives it none.
        let residue_ruled_out = limits.is_some();
        match configure(&device, backing, options) {
            Ok(legacy_ioctls) => {
                let status = verify(&device, backing, options)?;
                match settle_discards(&device, options, residue_ruled_out) {
                    Discards::AsWanted => {}
                    Discards::NotForbidden(warning) => warnings.push(warning),
                    Discards::LeftOff => warnings.push(format!(
                        "{} does not pass discards (an earlier preallocated volume turned them off and the device could not be renewed); fstrim in this volume returns no space",
                        LoopDevice::path_of(number).display()
                    )),
                }
                warnings.extend(device.writer_warning());
                if !options.partition_scan {
                    warnings.extend(announce(number));
                }
                return Ok(Bound {
                    number,
                    status,
                    legacy_ioctls,
                    warnings,
                });
            }
            Err(Errno::EBUSY) => {
                drop(device);
                drop(control);
                back_off(attempt);
            }
            Err(errno) => {
                return Err(errno).with_context(|| {
                    format!("configuring {}", LoopDevice::path_of(number).display())
                });
            }
        }
    }
    bail!("no free loop device could be claimed after {MAX_ATTEMPTS} attempts")
}

/// Returns whether the legacy ioctls were needed.
fn configure(
    device: &LockedLoopDevice,
    backing: &File,
    options: &BindOptions,
) -> Result<bool, Errno> {
    let block_size = options.block_size;
    // Bound with partition scanning off: `scan_partitions_once` turns it on.
    let info = |direct_io| {
        let mut info = options.info(direct_io);
        info.lo_flags &= !LO_FLAGS_PARTSCAN;
        info
    };
    let first = configure_once(device, backing, info(options.direct_io), block_size);
    let result = match first {
        // Some kernels refuse direct I/O outright when the backing file
        // system cannot do it; buffered I/O still works.
        Err(Errno::EINVAL) if options.direct_io => {
            configure_once(device, backing, info(false), block_size)
        }
        other => other,
    };
    let legacy_ioctls = match result {
        Ok(()) => false,
        // Kernels before 5.8 do not know LOOP_CONFIGURE.
        Err(Errno::EINVAL | Errno::ENOTTY) => {
            device.set_fd_then_status(backing, &info(false), block_size)?;
            // Direct I/O is switched on separately there, and is only a
            // preference: buffered I/O still works where it is refused.
            if options.direct_io && device.set_direct_io(true).is_err() {
                tracing::debug!(
                    "the kernel refused direct I/O on {}",
                    device.path().display()
                );
            }
            true
        }
        Err(errno) => return Err(errno),
    };
    if options.partition_scan {
        scan_partitions_once(device);
    }
    Ok(legacy_ioctls)
}

/// Sends udev a "change" event for the device, as the kernel itself does
/// only since "loop: properly send KOBJ_CHANGED uevent for disk device"
/// (6.15, and stable backports): before it, a bind without partitions
/// sends no uevent at all, and the close of a writable descriptor (udev's
/// inotify watch) used to stand in for one. Without an event udev never
/// makes the `/dev/disk/by-uuid` link. Sent under the device's lock: udev
/// handles it once we let go. Returns a warning when it cannot be sent.
fn announce(number: u32) -> Option<String> {
    let uevent = format!("/sys/block/loop{number}/uevent");
    match std::fs::write(&uevent, "change") {
        Ok(()) => None,
        Err(e) => Some(format!(
            "cannot tell udev about {} ({uevent}: {e}); on kernels that send no event of their own its link may not appear",
            LoopDevice::path_of(number).display()
        )),
    }
}

/// Turns partition scanning on so that the kernel adds the partitions
/// exactly once; `verify` checks that it is on.
///
/// Binding leaves a partition scan pending (`disk_force_media_change`
/// sets `GD_NEED_PART_SCAN`), which the next open of the whole device
/// runs. Were scanning on while bound, an open racing the bind's own scan
/// (udev's worker opens `/dev/loopN` to try our lock as soon as the bind's
/// uevent arrives) would add the partitions, and the bind's scan would
/// remove and add them again, under a consumer already started on the
/// first ones. So the pending scan runs in an open of ours while scanning
/// is still off, where it finds nothing; turning scanning on then scans
/// once, and later opens find nothing pending. (Where a bind leaves no
/// scan pending, as on Linux 7.1, this costs one open.)
fn scan_partitions_once(device: &LockedLoopDevice) {
    if let Err(error) = LoopDevice::open(device.number(), false) {
        tracing::debug!("{error:#}");
    }
    let mut info = match device.raw_status() {
        Ok(info) => info,
        Err(errno) => {
            tracing::debug!("reading the status of {}: {errno}", device.path().display());
            return;
        }
    };
    // As a kernel would that ignores the flag: `verify` then sets it.
    if hooks::fails(Fault::FlagsIgnored) {
        return;
    }
    info.lo_flags |= LO_FLAGS_PARTSCAN;
    if let Err(errno) = device.set_status(&info) {
        tracing::debug!(
            "turning partition scanning on for {}: {errno}",
            device.path().display()
        );
    }
}

/// One `LOOP_CONFIGURE`, or the failure a fault point asks for.
fn configure_once(
    device: &LockedLoopDevice,
    backing: &File,
    mut info: LoopInfo64,
    block_size: u32,
) -> Result<(), Errno> {
    if hooks::fails(Fault::ConfigureUnsupported) {
        return Err(Errno::EINVAL);
    }
    if info.lo_flags & LO_FLAGS_DIRECT_IO != 0 && hooks::fails(Fault::DirectIoRefused) {
        return Err(Errno::EINVAL);
    }
    if hooks::fails(Fault::DeviceTaken) {
        return Err(Errno::EBUSY);
    }
    if hooks::fails(Fault::FlagsIgnored) {
        info.lo_flags &= !(LO_FLAGS_READ_ONLY | LO_FLAGS_PARTSCAN);
    }
    device.configure(backing, info, block_size)
}

enum Discards {
    AsWanted,
    /// A preallocated volume's device still passes discards (the warning).
    NotForbidden(String),
    /// A sparse volume landed on a device whose discards were left off.
    LeftOff,
}

/// Applies the volume's discard policy while udev still waits for our
/// lock, so no consumer ever sees the device with the wrong one. A sparse
/// volume's device is looked at again only when the residue was not ruled
/// out before the bind (the renewals ran out, or its limits did not read).
fn settle_discards(
    device: &LockedLoopDevice,
    options: &BindOptions,
    residue_ruled_out: bool,
) -> Discards {
    if options.discard && residue_ruled_out {
        return Discards::AsWanted;
    }
    if !options.discard {
        return match forbid_discards(device.number()) {
            Ok(()) => Discards::AsWanted,
            Err(error) => Discards::NotForbidden(format!(
                "{error:#}; a consumer's fstrim can hand the preallocated space back"
            )),
        };
    }
    match DiscardLimits::of(device.number()) {
        Some(limits) if limits.turned_off() => Discards::LeftOff,
        _ => Discards::AsWanted,
    }
}

/// Older kernels silently ignore flags they do not know; check the device
/// is bound to our file with the flags we need, fixing what can be fixed.
fn verify(device: &LockedLoopDevice, backing: &File, options: &BindOptions) -> Result<LoopStatus> {
    let path = device.path();
    let meta = backing.metadata().context("inspecting the backing file")?;
    let mut info = device
        .raw_status()
        .with_context(|| format!("reading back the status of {}", path.display()))?;
    let status = LoopStatus::from(info);
    if !status.is_backed_by(meta.dev(), meta.ino()) {
        bail!("{} is bound to another file than ours", path.display());
    }
    verify_sector_size(device, options.block_size)?;
    let required = options.info(false).lo_flags & (LO_FLAGS_READ_ONLY | LO_FLAGS_PARTSCAN);
    if status.flags & required == required {
        return Ok(status);
    }
    info.lo_flags |= required;
    let fixed = device
        .set_status(&info)
        .and_then(|()| device.raw_status())
        .map(LoopStatus::from);
    match fixed {
        Ok(status) if status.flags & required == required => Ok(status),
        _ => {
            let _ = device.clear();
            bail!(
                "the kernel did not apply the flags {:#x} to {} (it kept {:#x}); detached it again",
                required,
                path.display(),
                status.flags
            )
        }
    }
}

/// Like systemd's loop-util: a device with other sectors than the volume
/// was made for would hide its partition table or refuse its file system.
fn verify_sector_size(device: &LockedLoopDevice, wanted: u32) -> Result<()> {
    let found = device.logical_block_size();
    if found == Ok(wanted) {
        return Ok(());
    }
    let _ = device.clear();
    let found = match found {
        Ok(size) => format!("{size}-byte sectors"),
        Err(errno) => format!("no readable sector size ({errno})"),
    };
    bail!(
        "{} came up with {found} instead of the {wanted}-byte sectors the volume is made for; detached it again",
        device.path().display()
    )
}

/// What asking a bound device to switch autoclear came to.
enum Autoclear {
    /// The device no longer holds the file.
    Released,
    /// The kernel kept the flag as it was.
    Refused,
    /// The flag is as asked; the device's status.
    Set(LoopStatus),
}

/// Sets (`on`) or clears autoclear on a device bound to the file
/// `backing` (device, inode), and reads it back.
fn switch_autoclear(device: &LockedLoopDevice, backing: (u64, u64), on: bool) -> Result<Autoclear> {
    let ours = |info: &LoopInfo64| LoopStatus::from(*info).is_backed_by(backing.0, backing.1);
    let as_asked = |info: &LoopInfo64| (info.lo_flags & LO_FLAGS_AUTOCLEAR != 0) == on;
    let Some(mut info) = device.raw_status().ok().filter(ours) else {
        return Ok(Autoclear::Released);
    };
    if as_asked(&info) {
        return Ok(Autoclear::Set(info.into()));
    }
    info.lo_flags ^= LO_FLAGS_AUTOCLEAR;
    Ok(device
        .set_status(&info)
        .and_then(|()| device.raw_status())
        .ok()
        .filter(|info| ours(info) && as_asked(info))
        .map_or(Autoclear::Refused, |info| Autoclear::Set(info.into())))
}

/// Keeps an existing device bound whose detach is pending: after a
/// `LOOP_CLR_FD` while another process held it open, the kernel leaves it
/// bound with autoclear set and releases it at that process's last close.
/// Clearing the flag (and reading it back) cancels that. Returns the
/// device's status afterwards. `backing` is the file's (device, inode).
pub fn cancel_pending_detach(number: u32, backing: (u64, u64)) -> Result<LoopStatus> {
    let device = LoopDevice::open(number, false)?.lock()?;
    let path = device.path();
    match switch_autoclear(&device, backing, false)? {
        Autoclear::Set(status) => Ok(status),
        Autoclear::Released => bail!("{} was released while attaching", path.display()),
        Autoclear::Refused => bail!(
            "{} is being detached (another program still holds it open) and its pending detach could not be cancelled; retry once that program has closed it",
            path.display()
        ),
    }
}

/// Undoes [`cancel_pending_detach`]: the device goes again at its last
/// holder's close, as it would have without us. `backing` is the file's
/// (device, inode).
pub fn restore_pending_detach(number: u32, backing: (u64, u64)) -> Result<()> {
    let device = LoopDevice::open(number, false)?.lock()?;
    match switch_autoclear(&device, backing, true)? {
        Autoclear::Set(_) | Autoclear::Released => Ok(()),
        Autoclear::Refused => bail!(
            "{} did not take the autoclear flag",
            device.path().display()
        ),
    }
}

/// The opposite of `cancel_pending_detach`, for a device bound for one job
/// only: with autoclear set, the kernel releases the device at its last
/// close, so a kill of this process cannot leave the file attached. The
/// returned descriptor keeps the device bound until it is dropped.
pub fn release_at_last_close(number: u32, backing: &File) -> Result<LoopDevice> {
    let meta = backing.metadata().context("inspecting the backing file")?;
    let holder = LoopDevice::open(number, false)?;
    let device = LoopDevice::open(number, false)?.lock()?;
    let path = device.path();
    match switch_autoclear(&device, (meta.dev(), meta.ino()), true)? {
        Autoclear::Set(_) => Ok(holder),
        Autoclear::Released => bail!("{} was released early", path.display()),
        Autoclear::Refused => bail!("{} did not take the autoclear flag", path.display()),
    }
}

/// Randomised, growing pause so that racing allocators spread out.
fn back_off(attempt: u32) {
    let jitter = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() % 10_000)
        .unwrap_or(0);
    let base = 1_000 * u64::from(attempt.min(10) + 1);
    std::thread::sleep(Duration::from_micros(base + u64::from(jitter)));
}

/// Whether a bound device actually does direct I/O.
pub fn uses_direct_io(status: &LoopStatus) -> bool {
    status.has(LO_FLAGS_DIRECT_IO)
}
