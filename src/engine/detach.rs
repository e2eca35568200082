//! Detaching a volume: finding its loop devices by the backing file, the
//! tag in `lo_file_name` or the udev link, and releasing them. Works
//! without the registry, so a volume can be torn down after its
//! configuration is gone. The unit's ExecStop and `sparse-volume detach`
//! both run this.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use nix::errno::Errno;
use serde::Serialize;

use crate::engine::encryption::{close_on, mapping_name};
use crate::kernel::dm_crypt::mapper_path;
use crate::kernel::files::ExclusiveLock;
use crate::kernel::holders::{in_use, users_of_loop};
use crate::kernel::loop_device::{
    self, ioctl::LO_FLAGS_AUTOCLEAR, renew_if_discards_left_off, DiscardLimits, LoopDevice,
    LoopStatus,
};
use crate::registry::Registry;
use crate::registry::{device_note, io_base};
use crate::volume::backing_file::open_without_hanging;
use crate::volume::id::VolumeId;

#[derive(Debug, Serialize)]
pub struct DetachReport {
    pub changed: bool,
    pub uuid: String,
    pub devices: Vec<PathBuf>,
    /// How the devices were found: `backing-file`, `reference`,
    /// `udev-link`, or null when nothing was attached.
    pub found_by: Option<&'static str>,
    /// An encrypted volume's opened device, closed before its loop device
    /// was released (`/dev/mapper/sparse-volume-<UUID>`); null otherwise.
    pub closed: Option<PathBuf>,
}

pub fn detach(registry: &Registry, id: &VolumeId) -> Result<DetachReport> {
    let lock = Registry::volume_lock(registry.root(), id)?;
    detach_locked(registry, id, &lock)
}

/// `detach --dry-run`: the devices a detach would release.
pub fn plan_detach(registry: &Registry, id: &VolumeId) -> Result<DetachReport> {
    let lock = Registry::volume_lock(registry.root(), id)?;
    release(registry, id, &lock, false)
}

/// [`detach`] for a caller that holds the volume's `lock` already.
pub fn detach_locked(
    registry: &Registry,
    id: &VolumeId,
    lock: &ExclusiveLock,
) -> Result<DetachReport> {
    let report = release(registry, id, lock, true)?;
    if report.changed {
        io_base::forget(registry.root(), id);
    }
    Ok(report)
}

fn release(
    registry: &Registry,
    id: &VolumeId,
    lock: &ExclusiveLock,
    really: bool,
) -> Result<DetachReport> {
    let mut numbers = Vec::new();
    let mut found_by = None;
    let mut closed = false;
    // The noted device's file, kept open until the end: looked for below
    // by (device, inode), where a rename meanwhile would hide it from a
    // lookup by path, and an inode number freed by our close could name
    // another file by then.
    let mut noted = None;
    // Read once (the registry entry names one of them), for the shortcut
    // and the full scan alike.
    let candidates = candidate_backing_files(registry, id);
    if really {
        if let Some(device) = noted_device(lock, id, &candidates) {
            closed |= close_on(id, device.number, true)?;
            detach_device(device.number, device.status.backing())?;
            crate::hooks::stop_at(crate::hooks::Stop::DetachAfterNotedRelease);
            numbers.push(device.number);
            found_by = Some("backing-file");
            // The usual case ends here: no other device holds the file.
            if device.file_held_by_nothing() {
                return Ok(report(id, numbers, found_by, closed));
            }
            noted = Some(device);
        }
    }
    let known_file = noted.as_ref().map(|device| device.status.backing());
    let (mut devices, by) = find_bound(id, &candidates, known_file)?;
    // Found by its file already: weaker evidence (a tag, a link) is not
    // looked at, as `find_bound` would not have looked at it either.
    if found_by.is_some() && by != "backing-file" {
        devices.clear();
    }
    for (number, status) in &devices {
        // An encrypted volume's mapping goes first: it holds the device.
        let had_mapping = close_on(id, *number, really)?;
        closed |= had_mapping;
        if really {
            detach_device(*number, status.backing())?;
        } else if !had_mapping {
            // The refusal a real detach would meet; closed again at once.
            open_to_detach(*number)?;
        }
        if !numbers.contains(number) {
            numbers.push(*number);
        }
    }
    if !devices.is_empty() {
        found_by = found_by.or(Some(by));
    }
    Ok(report(id, numbers, found_by, closed))
}

fn report(
    id: &VolumeId,
    numbers: Vec<u32>,
    found_by: Option<&'static str>,
    closed: bool,
) -> DetachReport {
    DetachReport {
        changed: !numbers.is_empty(),
        uuid: id.to_string(),
        devices: numbers.iter().map(|&n| LoopDevice::path_of(n)).collect(),
        found_by,
        closed: closed.then(|| mapper_path(&mapping_name(id))),
    }
}

/// The device attach noted for the volume (`device_note`), and its
/// backing file, opened before the device is released.
struct NotedDevice {
    number: u32,
    status: LoopStatus,
    file: File,
}

impl NotedDevice {
    /// True when the kernel says nothing holds the file open any more
    /// (see `loop_device::held_by_us_alone`), so no other device does. Asked
    /// through the descriptor opened before the release: a rename
    /// meanwhile cannot point the question at another file. A failure to
    /// ask is no answer (the caller looks at every device).
    fn file_held_by_nothing(&self) -> bool {
        loop_device::held_by_us_alone(&self.file).unwrap_or_else(|error| {
            tracing::warn!("{error:#}; looking at every loop device instead");
            false
        })
    }
}

/// The device attach noted for the volume, with its status, when it is
/// the only place the volume's file can be: it still holds a candidate
/// backing file, carries no other volume's tag, and no other candidate
/// path names another file (a copy in another storage root, which another
/// device may hold: then every device is asked, as `find_bound` would).
/// The candidates are only looked up (`lstat`), never opened, except the
/// noted one: a storage root on a dead NFS server or FUSE daemon costs no
/// more than the full scan's own lookups. The device is closed again, as
/// a detach needs.
fn noted_device(
    lock: &ExclusiveLock,
    id: &VolumeId,
    candidates: &[PathBuf],
) -> Option<NotedDevice> {
    let number = device_note::recorded(lock)?;
    let status = LoopDevice::open(number, false).ok()?.status().ok()??;
    if tagged_for_another(&status, id) {
        return None;
    }
    let mut noted_path = None;
    for path in candidates {
        match std::fs::symlink_metadata(path) {
            Ok(meta)
                if meta.file_type().is_file() && status.is_backed_by(meta.dev(), meta.ino()) =>
            {
                noted_path = Some(path);
            }
            // Something else is there: let the full scan judge it.
            Ok(_) => return None,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {}
            Err(_) => return None,
        }
    }
    let file = open_without_hanging(noted_path?, true).ok()?;
    let meta = file.metadata().ok()?;
    (meta.file_type().is_file() && status.is_backed_by(meta.dev(), meta.ino())).then_some(
        NotedDevice {
            number,
            status,
            file,
        },
    )
}

/// A registry file may (wrongly) name another volume's backing file: a
/// device that another volume tagged as its own is never this one's.
fn tagged_for_another(status: &LoopStatus, id: &VolumeId) -> bool {
    VolumeId::from_loop_reference(&status.reference).is_some_and(|other| &other != id)
}

/// Where the backing file may be: the registry's path if the entry still
/// reads, and the default file name in every storage root.
fn candidate_backing_files(registry: &Registry, id: &VolumeId) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    if let Ok(Some(volume)) = registry.get(id) {
        paths.push(registry.root().host_path(&volume.path));
    }
    for storage_root in &registry.config().storage_roots {
        let path = registry.root().host_path(storage_root.join(id.to_string()));
        // The registry's path is usually one of them: looked up once.
        if !paths.contains(&path) {
            paths.push(path);
        }
    }
    paths
}

/// The devices of this volume, by the most reliable evidence available.
pub fn find_devices(registry: &Registry, id: &VolumeId) -> Result<(Vec<u32>, &'static str)> {
    let candidates = candidate_backing_files(registry, id);
    let (devices, found_by) = find_bound(id, &candidates, None)?;
    Ok((
        devices.into_iter().map(|(number, _)| number).collect(),
        found_by,
    ))
}

/// [`find_devices`], with what each device was bound to when found, by
/// the `candidates` (`candidate_backing_files`); `known_file` is one more
/// backing file, by (device, inode), to look for beside them.
fn find_bound(
    id: &VolumeId,
    candidates: &[PathBuf],
    known_file: Option<(u64, u64)>,
) -> Result<(Vec<(u32, LoopStatus)>, &'static str)> {
    let statuses = loop_device::bound_statuses()?;
    let with_status = |numbers: Vec<u32>| -> Vec<(u32, LoopStatus)> {
        statuses
            .iter()
            .filter(|(n, _)| numbers.contains(n))
            .cloned()
            .collect()
    };

    let files: Vec<(u64, u64)> = candidates
        .iter()
        .filter_map(|path| std::fs::metadata(path).ok())
        .map(|meta| (meta.dev(), meta.ino()))
        .chain(known_file)
        .collect();
    let mut by_file = Vec::new();
    for (dev, ino) in files {
        by_file.extend(
            statuses
                .iter()
                .filter(|(_, s)| s.is_backed_by(dev, ino) && !tagged_for_another(s, id))
                .map(|(n, _)| *n),
        );
    }
    by_file.sort_unstable();
    by_file.dedup();
    if !by_file.is_empty() {
        return Ok((with_status(by_file), "backing-file"));
    }

    let reference = id.loop_reference();
    let by_reference: Vec<u32> = statuses
        .iter()
        .filter(|(_, s)| s.reference == reference)
        .map(|(n, _)| *n)
        .collect();
    if !by_reference.is_empty() {
        return Ok((with_status(by_reference), "reference"));
    }

    let mut by_link = Vec::new();
    for link in [
        format!("/dev/disk/by-uuid/{id}"),
        format!("/dev/disk/by-partuuid/{id}"),
    ] {
        if let Some(number) = std::fs::canonicalize(&link)
            .ok()
            .as_deref()
            .and_then(loop_device::parent_loop_of)
        {
            if statuses.iter().any(|(n, _)| *n == number) {
                by_link.push(number);
            }
        }
    }
    by_link.dedup();
    Ok((with_status(by_link), "udev-link"))
}

/// How to keep the data of a device whose backing file was deleted: the
/// device is then its only copy, and detaching it destroys it.
pub fn recovery_hint(number: u32) -> String {
    format!(
        "copy it to a new file before anything detaches it (`dd if=/dev/loop{number} of=<storage root>/<file> bs=1M conv=sparse`), then `sparse-volume register` that file"
    )
}

/// Whether the kernel says the device's backing file was deleted.
pub fn backing_file_deleted(number: u32) -> bool {
    std::fs::read_to_string(format!("/sys/block/loop{number}/loop/backing_file"))
        .is_ok_and(|text| text.trim_end().ends_with(" (deleted)"))
}

/// How long a device may stay bound after `LOOP_CLR_FD` while a brief
/// opener (udev's probe, `blkid`) lets go.
const RELEASE_GRACE: Duration = Duration::from_secs(3);

/// `/dev/loop<number>` opened exclusively, `None` when it is gone. O_EXCL
/// makes the kernel answer "is it mounted or held?" atomically and keeps
/// anyone from mounting it while it is torn down; a device in use is an
/// error naming its users.
fn open_to_detach(number: u32) -> Result<Option<LoopDevice>> {
    let path = LoopDevice::path_of(number);
    match LoopDevice::open_exclusive(number) {
        Ok(device) => Ok(Some(device)),
        Err(Errno::ENOENT | Errno::ENXIO) => Ok(None),
        Err(Errno::EBUSY) => {
            let users = users_of_loop(number);
            if users.is_empty() {
                bail!(
                    "{} is in use (opened exclusively by another program)",
                    path.display()
                );
            }
            bail!(in_use(&users));
        }
        Err(errno) => bail!("opening {}: {errno}", path.display()),
    }
}

/// Detaches `/dev/loop<number>` if it still attaches the file `backing`
/// (device, inode) named by whoever found it: between finding a device and
/// locking it, the number can be released and reused for another file,
/// which is then none of our business. Gone or reused counts as detached.
pub(crate) fn detach_device(number: u32, backing: (u64, u64)) -> Result<()> {
    let path = LoopDevice::path_of(number);
    tracing::info!(progress = true, "detaching {}", path.display());
    let Some(device) = open_to_detach(number)? else {
        return Ok(());
    };
    let device = device.lock()?;
    let bound = match device.status() {
        Ok(None) => return Ok(()),
        Ok(Some(status)) if !status.is_backed_by(backing.0, backing.1) => return Ok(()),
        Ok(Some(status)) => status,
        Err(errno) => bail!("reading the status of {}: {errno}", path.display()),
    };
    let discard_limits = DiscardLimits::of(number);
    if let Err(errno) = device.clear() {
        bail!("detaching {}: {errno}", path.display());
    }
    // Current kernels finish the detach when the last opener closes the
    // device, which should be us.
    drop(device);
    wait_until_released(number, &path, &bound)?;
    renew_if_discards_left_off(number, discard_limits)
}

/// [`detach_device`] for a repair, which must not leave half a change: a
/// device another program still holds open (the kernel then only marks it
/// to go at that program's last close) gets its pending detach cancelled
/// again, unless it had one before.
pub(crate) fn detach_device_or_leave_it(number: u32, backing: (u64, u64)) -> Result<()> {
    let pending_before = LoopDevice::open(number, false)
        .ok()
        .and_then(|device| device.status().ok().flatten())
        .is_some_and(|status| status.has(LO_FLAGS_AUTOCLEAR));
    let Err(failure) = detach_device(number, backing) else {
        return Ok(());
    };
    if pending_before {
        return Err(failure);
    }
    match loop_device::cancel_pending_detach(number, backing) {
        Ok(_) => Err(anyhow!("{failure:#}; left attached as it was")),
        Err(e) => {
            tracing::debug!("/dev/loop{number} left as the kernel has it: {e:#}");
            Err(failure)
        }
    }
}

/// `loopN/loop/` (with `backing_file`) is there while a device is bound
/// and early in its release (the kernel drops it before it lets go of the
/// file itself).
fn release_in_progress(number: u32) -> bool {
    Path::new(&format!("/sys/block/loop{number}/loop")).exists()
}

fn wait_until_released(number: u32, path: &Path, bound: &LoopStatus) -> Result<()> {
    let deadline = Instant::now() + RELEASE_GRACE;
    loop {
        let status = match LoopDevice::open(number, false) {
            Ok(device) => device.status()?,
            Err(_) => None,
        };
        // Once released, the number may at once be reused for another file.
        let unbound = status.is_none();
        let still_ours = status.filter(|s| s.is_backed_by(bound.backing_dev, bound.backing_inode));
        match still_ours {
            // The kernel answers "unbound" as soon as the release starts;
            // sysfs (and so losetup) still names the file on this device
            // for a moment after. Done only once that is gone, so that an
            // attach after ours never shows the file on two devices.
            None if unbound && release_in_progress(number) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(2));
            }
            None => return Ok(()),
            Some(status) if Instant::now() >= deadline => {
                if status.has(LO_FLAGS_AUTOCLEAR) {
                    bail!(
                        "{} is still open by another program; the kernel will detach it when that program closes it",
                        path.display()
                    );
                }
                bail!("{} is still attached after LOOP_CLR_FD", path.display());
            }
            Some(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}
