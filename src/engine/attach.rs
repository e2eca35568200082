//! Attaching a volume: the registry entry read under the volume lock, the
//! backing file verified to hold the volume, a loop device bound (or the
//! one already bound reused), and the wait for udev's link. The unit's
//! ExecStart and `sparse-volume attach` both run this.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;

use crate::engine::detach::detach_device;
use crate::engine::encryption;
use crate::kernel::block_device::logical_block_size_of_device;
use crate::kernel::loop_device::ioctl::{
    LO_FLAGS_AUTOCLEAR, LO_FLAGS_PARTSCAN, LO_FLAGS_READ_ONLY,
};
use crate::kernel::loop_device::{
    self, forbid_discards, BindOptions, DiscardLimits, LoopDevice, LoopStatus,
};
use crate::kernel::signals;
use crate::kernel::udev_link::{wait_for_link, LinkOutcome, CONTROL_SOCKET};
use crate::registry::{device_note, io_base};
use crate::registry::{Registry, Volume};
use crate::systemd::kernel_cmdline;
use crate::volume::backing_file::open_backing_file;
use crate::volume::id::VolumeId;
use crate::volume::probe::probe;
use crate::volume::spec::Mode;

#[derive(Debug, Serialize)]
pub struct AttachReport {
    pub changed: bool,
    pub uuid: String,
    pub device: PathBuf,
    /// Block mode: the partition device consumers use, when the kernel
    /// made one (sysfs shows it); `None` otherwise.
    pub partition: Option<PathBuf>,
    pub link: PathBuf,
    /// An encrypted volume: its opened device (`/dev/mapper/...`), which
    /// the link points at.
    pub opened: Option<PathBuf>,
    /// `linked`, or `no-udev` when no udev runs to make the link.
    pub link_state: &'static str,
    pub direct_io: bool,
    pub read_only: bool,
    pub warnings: Vec<String>,
    /// Keys of the volume's registry file that were ignored (the CLI says
    /// them for every command about the volume; the unit's attach says
    /// them here).
    #[serde(skip)]
    pub registry_warnings: Vec<String>,
}

/// `attach --dry-run`: the device the volume is attached to already, or
/// that a device would be bound.
#[derive(Debug, Serialize)]
pub struct AttachPlan {
    pub changed: bool,
    pub uuid: String,
    pub device: Option<PathBuf>,
}

pub fn plan_attach(registry: &Registry, id: &VolumeId) -> Result<AttachPlan> {
    let found = bound_after_checks(registry, id)?;
    Ok(AttachPlan {
        // The real attach cancels a pending detach (see `keep_bound`).
        changed: found
            .as_ref()
            .is_none_or(|(_, status)| status.has(LO_FLAGS_AUTOCLEAR)),
        uuid: id.to_string(),
        device: found.map(|(number, _)| LoopDevice::path_of(number)),
    })
}

/// What an attach would do, after the checks it runs before binding
/// anything (skip switch, registry entry, backing file, content): the
/// device the file is attached to already, or None when it would bind one.
pub fn attach_planned(registry: &Registry, id: &VolumeId) -> Result<Option<PathBuf>> {
    Ok(bound_after_checks(registry, id)?.map(|(number, _)| LoopDevice::path_of(number)))
}

fn bound_after_checks(registry: &Registry, id: &VolumeId) -> Result<Option<(u32, LoopStatus)>> {
    refuse_if_skipped(registry, id)?;
    let _lock = Registry::volume_lock(registry.root(), id)?;
    let VerifiedBacking {
        volume,
        file: backing,
        ..
    } = verified_backing(registry, id)?;
    let meta = backing.metadata().context("inspecting the backing file")?;
    let found = loop_device::devices_holding(&backing, &meta)?
        .into_iter()
        .next();
    if let Some((number, status)) = &found {
        refuse_unfit_device(*number, status, &volume)?;
    }
    Ok(found)
}

/// How a device bound to the volume's file fails to show the volume as
/// registered (made by hand: `losetup -o`, `--sizelimit`, `-r` on a
/// read-write volume); empty when it shows it. A device that attach bound
/// read-only before the volume was made read-write (it carries the
/// volume's reference) is the volume's own: that difference is a warning
/// until the next attach, not a reason.
pub fn unfit_reasons(status: &LoopStatus, volume: &Volume) -> Vec<String> {
    let mut differs = Vec::new();
    if status.offset != 0 {
        differs.push(format!("offset {}", status.offset));
    }
    if status.size_limit != 0 {
        differs.push(format!("size limit {}", status.size_limit));
    }
    if !volume.read_only
        && status.has(LO_FLAGS_READ_ONLY)
        && status.reference != volume.id.loop_reference()
    {
        differs.push("read-only (the volume is read-write)".to_string());
    }
    differs
}

/// A device that does not show the volume as registered is never adopted:
/// consumers would find no file system there, or one they cannot write,
/// and a later stop would detach somebody else's device.
fn refuse_unfit_device(number: u32, status: &LoopStatus, volume: &Volume) -> Result<()> {
    let differs = unfit_reasons(status, volume);
    if differs.is_empty() {
        return Ok(());
    }
    bail!("{}", unfit_message(number, &differs))
}

/// "/dev/loopN is bound to the volume's file with …", with the way out.
pub fn unfit_message(number: u32, differs: &[String]) -> String {
    let device = LoopDevice::path_of(number);
    format!(
        "{} is bound to the volume's file with {}, so it does not hold the volume as registered; if nothing uses it, `losetup -d {}` and attach again",
        device.display(),
        differs.join(", "),
        device.display()
    )
}

/// The volume's entry, its backing file opened and verified to hold the
/// volume, and what the entry's file had that was ignored; read under the
/// volume lock, which the caller holds.
fn verified_backing(registry: &Registry, id: &VolumeId) -> Result<VerifiedBacking> {
    let (volume, ignored) = registry.require_with_warnings(id)?;
    let path = registry.root().host_path(&volume.path);
    let linked_root = registry.refuse_links_in_backing_path(&path)?;
    let backing = open_backing_file(&path, volume.read_only)?;
    verify_content(&backing, &volume, &path)?;
    Ok(VerifiedBacking {
        volume,
        file: backing,
        registry_warnings: ignored.iter().map(ToString::to_string).collect(),
        warnings: linked_root.into_iter().collect(),
    })
}

/// A volume's entry and its backing file, opened and verified.
struct VerifiedBacking {
    volume: Volume,
    file: File,
    /// What the entry's file had that was ignored.
    registry_warnings: Vec<String>,
    /// What the operator should know about the path.
    warnings: Vec<String>,
}

/// Where the kernel shows block devices and their partitions.
const SYS_BLOCK: &str = "/sys/block";

/// The operator's way past a volume that breaks the boot: honoured by
/// hand, too, so nothing brings the volume back before the reboot.
pub fn refuse_if_skipped(registry: &Registry, id: &VolumeId) -> Result<()> {
    if let Some(skip) = kernel_cmdline::skip_reason(registry.root(), id) {
        bail!(
            "the volume is skipped by {skip}; reboot without {} to attach it",
            skip.switch()
        );
    }
    Ok(())
}

pub fn attach(registry: &Registry, id: &VolumeId) -> Result<AttachReport> {
    refuse_if_skipped(registry, id)?;
    // The entry is read under the volume lock: a remove holds that lock
    // from its detach until the entry is gone, so an attach waiting here
    // then finds the volume unregistered instead of binding a file that
    // is about to be deleted.
    let lock = Registry::volume_lock(registry.root(), id)?;
    let VerifiedBacking {
        volume,
        file: backing,
        registry_warnings,
        mut warnings,
    } = verified_backing(registry, id)?;
    let meta = backing.metadata().context("inspecting the backing file")?;
    warnings.extend(size_warning(meta.len(), &volume));

    // systemd stops a start that takes too long with SIGTERM. From here
    // on (before anything is bound) it is caught: it ends the udev wait,
    // and the device this call bound is released like after any other
    // failure.
    let stop_requests = signals::catch_stop_requests();
    let existing = loop_device::devices_holding(&backing, &meta)?;

    // `bound_here`: a device this call bound, and so must release again
    // if attaching fails after all; a device found bound is left alone.
    let (number, status, changed, bound_here) = match existing.split_first() {
        Some(((number, status), duplicates)) => {
            refuse_unfit_device(*number, status, &volume)?;
            for (other, _) in duplicates {
                warnings.push(format!(
                    "{} is a second loop device for the same file; `sparse-volume check --repair` removes it",
                    LoopDevice::path_of(*other).display()
                ));
            }
            let (status, cancelled) = keep_bound(*number, status, &backing)?;
            if cancelled {
                warnings.push(format!(
                    "{} had a pending detach (another program still holds it open); cancelled it so the device stays attached",
                    LoopDevice::path_of(*number).display()
                ));
            }
            warnings.extend(flag_mismatches(&status, &volume));
            warnings.extend(sector_size_mismatch(*number, &volume));
            warnings.extend(discard_policy_of_existing(*number, &volume));
            (*number, status, cancelled, false)
        }
        None => {
            // The kernel silently drops direct I/O when the loop device's
            // sectors are smaller than the backing device's; say why.
            let sector_warning = logical_block_size_of_device(meta.dev())
                .filter(|_| volume.direct_io)
                .and_then(|backing| sector_size_blocks_direct_io(volume.sector_size, backing));
            let options = BindOptions {
                read_only: volume.read_only,
                partition_scan: volume.mode.is_block(),
                direct_io: volume.direct_io && sector_warning.is_none(),
                block_size: volume.sector_size,
                reference: id.loop_reference(),
                discard: !volume.preallocated,
            };
            tracing::info!(
                progress = true,
                "binding {} to a free loop device",
                volume.path.display()
            );
            let bound = loop_device::bind_to_free_device(&backing, &options)?;
            tracing::info!("bound to {}", LoopDevice::path_of(bound.number).display());
            warnings.extend(bound.warnings);
            if let Some(warning) = sector_warning {
                warnings.push(warning);
            } else if volume.direct_io && !loop_device::uses_direct_io(&bound.status) {
                warnings.push(
                    "the backing file system does not support direct I/O; using buffered I/O"
                        .into(),
                );
            }
            (bound.number, bound.status, true, true)
        }
    };

    let device = LoopDevice::path_of(number);
    let partition = match volume.mode {
        Mode::Block => {
            let found = partition_of(Path::new(SYS_BLOCK), number);
            if found.is_none() {
                warnings.push(format!(
                    "the kernel made no partition device for {} (does it parse GPT partition tables?); consumers of {} will not find the volume",
                    device.display(),
                    volume.consumer_path().display()
                ));
            }
            found
        }
        Mode::Filesystem { .. } => None,
    };
    let link = volume.consumer_path();
    // An encrypted volume's link points at its opened device, not at the
    // loop device or partition (whose own links name the LUKS2 header).
    let (opened, waited) = match &volume.encryption {
        Some(encryption) => match encryption::open_on(registry, &volume, encryption, number) {
            Ok(opened) => (Some(opened), Ok(())),
            Err(failure) => (None, Err(failure)),
        },
        None => (None, Ok(())),
    };
    let waited = waited.and_then(|()| {
        let target = match &opened {
            Some(opened) => opened.node.clone(),
            None => link_target(&volume, &device),
        };
        await_link(
            registry,
            &volume,
            &device,
            partition.is_some(),
            &link,
            &target,
        )
    });
    // A stop that came after the wait ended is a failure too.
    let waited = waited.and_then(|state| {
        if signals::requested() {
            bail!("stopped (SIGTERM or SIGINT) while attaching");
        }
        Ok(state)
    });
    if waited.is_err() {
        // The failure below is the answer to the stop request.
        stop_requests.acknowledge();
    }
    let waited = waited.map_err(|failure| match &opened {
        Some(opened) => encryption::close_after_failure(
            &encryption::mapping_name(id),
            opened.opened_here,
            failure,
        ),
        None => failure,
    });
    let link_state = match waited {
        Ok(state) => state,
        Err(failure) if bound_here => {
            return Err(release(number, (meta.dev(), meta.ino()), failure))
        }
        Err(failure) if changed => {
            // The device was found with a pending detach, which this call
            // cancelled: it goes at its holder's close again, as before.
            let restored = loop_device::restore_pending_detach(number, (meta.dev(), meta.ino()));
            return Err(match restored {
                Ok(()) => anyhow!(
                    "{failure:#}; {} stays attached until the program holding it closes it (its pending detach is restored)",
                    device.display()
                ),
                Err(e) => anyhow!(
                    "{failure:#}; {} stays attached: its pending detach, cancelled by this call, could not be restored ({e:#})",
                    device.display()
                ),
            });
        }
        Err(failure) => {
            return Err(anyhow!(
                "{failure:#}; {} was attached before this call and stays attached",
                device.display()
            ))
        }
    };
    device_note::record(&lock, number);
    io_base::record(registry.root(), id, number);

    Ok(AttachReport {
        changed,
        uuid: id.to_string(),
        device,
        partition,
        link,
        opened: opened.map(|o| o.path),
        link_state,
        direct_io: loop_device::uses_direct_io(&status),
        read_only: status.has(LO_FLAGS_READ_ONLY),
        warnings,
        registry_warnings,
    })
}

/// Waits for udev's link to the device consumers use to point at
/// `target`.
fn await_link(
    registry: &Registry,
    volume: &Volume,
    device: &Path,
    has_partition: bool,
    link: &Path,
    target: &Path,
) -> Result<&'static str> {
    let timeout = registry.config().udev_timeout;
    let control_socket = registry.root().host_path(CONTROL_SOCKET);
    let slots = registry.root().run_dir();
    tracing::info!(
        progress = true,
        "waiting for udev's link {}",
        link.display()
    );
    match wait_for_link(&control_socket, &slots, link, target, timeout) {
        LinkOutcome::Linked => Ok("linked"),
        LinkOutcome::NoUdev => Ok("no-udev"),
        LinkOutcome::Stopped => bail!(
            "stopped (SIGTERM or SIGINT) while waiting for udev to point {} at {}",
            link.display(),
            target.display()
        ),
        LinkOutcome::TimedOut { points_to } => {
            let seen = points_to.map_or(String::new(), |p| {
                format!(" (it points at {})", p.display())
            });
            // A failed attach shows no warnings; the likely cause must be
            // in the error itself.
            let cause = if volume.mode.is_block() && !has_partition {
                format!(
                    ", and the kernel made no partition device for {}",
                    device.display()
                )
            } else {
                String::new()
            };
            bail!(
                "udev did not point {} at {} within {} s{seen}{cause}",
                link.display(),
                target.display(),
                timeout.as_secs(),
            )
        }
    }
}

/// The node udev's link to a plain volume points at: the partition in
/// block mode (named even before the kernel shows it, as it may still
/// come), the whole device otherwise.
fn link_target(volume: &Volume, device: &Path) -> PathBuf {
    match volume.mode {
        Mode::Block => PathBuf::from(format!("{}p1", device.display())),
        Mode::Filesystem { .. } => device.to_path_buf(),
    }
}

/// A failed start leaves nothing behind: detaches the device this call
/// bound, and says whether that worked, in the one error sentence.
fn release(number: u32, backing: (u64, u64), failure: anyhow::Error) -> anyhow::Error {
    let device = LoopDevice::path_of(number);
    match detach_device(number, backing) {
        Ok(()) => anyhow!(
            "{failure:#}; detached {} again, which this attach had bound",
            device.display()
        ),
        Err(release_error) => anyhow!(
            "{failure:#}; releasing {} (bound by this attach) failed too: {release_error:#}",
            device.display()
        ),
    }
}

/// The first partition of `loopN` as the kernel shows it in sysfs
/// (`<sys_block>/loopN/loopNp1`), as the `/dev` node consumers open.
/// Without partition parsers (or a table it reads) the kernel makes none.
fn partition_of(sys_block: &Path, number: u32) -> Option<PathBuf> {
    let name = format!("loop{number}p1");
    sys_block
        .join(format!("loop{number}"))
        .join(&name)
        .is_dir()
        .then(|| Path::new("/dev").join(name))
}

/// The content must carry the volume's UUID: attaching someone else's data
/// under this volume's name would hand it to the wrong consumer. It must
/// also read with the recorded sector size, or consumers would wait for a
/// partition or mount that never comes.
fn verify_content(backing: &File, volume: &Volume, path: &std::path::Path) -> Result<()> {
    let content = probe(backing).with_context(|| format!("reading {}", path.display()))?;
    volume.identity().require_in(&content, path)?;
    if !content.works_with_sector_size(volume.sector_size) {
        bail!(
            "backing file {} holds {}, which does not read with the {}-byte sectors the registry records (sector_size)",
            path.display(),
            content.sector_requirement(),
            volume.sector_size
        );
    }
    Ok(())
}

/// Why direct I/O cannot be used, when the volume's sectors are smaller
/// than those of the device under its backing file.
pub fn sector_size_blocks_direct_io(sector_size: u32, backing: u32) -> Option<String> {
    (sector_size < backing).then(|| {
        format!(
            "direct I/O off: the volume's {sector_size}-byte sectors are smaller than the backing device's {backing}-byte sectors"
        )
    })
}

/// An existing device whose detach is pending would vanish when its last
/// holder closes it: cancel the detach (reported as a change), or refuse
/// to adopt the device.
fn keep_bound(number: u32, status: &LoopStatus, backing: &File) -> Result<(LoopStatus, bool)> {
    if !status.has(LO_FLAGS_AUTOCLEAR) {
        return Ok((status.clone(), false));
    }
    let meta = backing.metadata().context("inspecting the backing file")?;
    Ok((
        loop_device::cancel_pending_detach(number, (meta.dev(), meta.ino()))?,
        true,
    ))
}

/// A device bound by an older version or by hand may have other sectors
/// than the volume is made for.
fn sector_size_mismatch(number: u32, volume: &Volume) -> Option<String> {
    let found = LoopDevice::open(number, false)
        .and_then(|device| device.logical_block_size())
        .ok()?;
    (found != volume.sector_size).then(|| {
        format!(
            "the existing loop device has {found}-byte sectors but the volume is made for {}-byte sectors; detach and attach again",
            volume.sector_size
        )
    })
}

fn size_warning(actual: u64, volume: &Volume) -> Option<String> {
    (actual != volume.size).then(|| {
        format!(
            "the backing file is {actual} bytes but the registry records {}; `sparse-volume check` reports it",
            volume.size
        )
    })
}

/// A device bound by hand or by an older version may pass discards into
/// a preallocated file (turned off here), or may carry a preallocated
/// volume's "no discards" into a sparse one (which only a new device fixes).
fn discard_policy_of_existing(number: u32, volume: &Volume) -> Option<String> {
    if volume.preallocated {
        return forbid_discards(number).err().map(|error| {
            format!("{error:#}; a consumer's fstrim can hand the preallocated space back")
        });
    }
    DiscardLimits::of(number)
        .filter(DiscardLimits::turned_off)
        .map(|_| {
            format!(
                "{} does not pass discards, so fstrim in this sparse volume returns no space; detach and attach again",
                LoopDevice::path_of(number).display()
            )
        })
}

fn flag_mismatches(status: &LoopStatus, volume: &Volume) -> Vec<String> {
    let mut warnings = Vec::new();
    if volume.read_only && !status.has(LO_FLAGS_READ_ONLY) {
        warnings
            .push("the existing loop device is writable although the volume is read-only".into());
    }
    if !volume.read_only && status.has(LO_FLAGS_READ_ONLY) {
        warnings.push(
            "the existing loop device is read-only although the volume is now read-write; stop and start the volume to change that".into(),
        );
    }
    if volume.mode.is_block() && !status.has(LO_FLAGS_PARTSCAN) {
        warnings.push(
            "the existing loop device does not scan partitions; detach and attach again".into(),
        );
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_is_what_sysfs_shows() {
        let sys = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(sys.path().join("loop7/loop7p1")).unwrap();
        std::fs::create_dir_all(sys.path().join("loop8/queue")).unwrap();
        // A partition of another device, or a file of that name, is not it.
        std::fs::create_dir_all(sys.path().join("loop9")).unwrap();
        std::fs::create_dir_all(sys.path().join("loop19/loop19p1")).unwrap();
        std::fs::write(sys.path().join("loop9/loop9p1"), "").unwrap();
        assert_eq!(
            partition_of(sys.path(), 7),
            Some(PathBuf::from("/dev/loop7p1"))
        );
        assert_eq!(partition_of(sys.path(), 8), None);
        assert_eq!(partition_of(sys.path(), 9), None);
        assert_eq!(partition_of(sys.path(), 1), None);
    }
}
