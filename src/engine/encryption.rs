//! An encrypted volume's dm-crypt mapping over its loop device: attach
//! opens it once the loop device is bound, detach closes it before the
//! loop device goes, both under the volume lock. The mapping's name comes
//! from the volume UUID, so it is found again after any crash.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::kernel::dm_crypt::{self, mapper_path, OpenOptions};
use crate::kernel::holders::{in_use, users_of_device};
use crate::kernel::loop_device::LoopDevice;
use crate::registry::{Registry, Volume};
use crate::volume::gpt_layout;
use crate::volume::id::VolumeId;
use crate::volume::luks;
pub use crate::volume::luks::mapping_name;
use crate::volume::probe::{luks2_at, probe};
use crate::volume::spec::Encryption;

/// Where the recovery of a volume whose key is lost is described.
pub const RECOVERY_GUIDE: &str = "the encryption guide, \"Recovering a volume\": docs/guide/encryption.md, installed in /usr/share/doc/sparse-volume";

/// Refuses what is not built for encrypted volumes yet (a clone's new
/// header identity, streams of ciphertext), rather than doing it half.
pub fn refuse_if_encrypted(volume: &Volume, what: &str) -> Result<()> {
    if volume.encryption.is_some() {
        bail!(
            "volume {} is encrypted, and {what} of encrypted volumes is not supported yet",
            volume.id
        );
    }
    Ok(())
}

/// The opened device of an encrypted volume.
#[derive(Debug)]
pub struct Opened {
    /// `/dev/mapper/sparse-volume-<UUID>`.
    pub path: PathBuf,
    /// The kernel's node (`/dev/dm-3`), which udev's links point at.
    pub node: PathBuf,
    /// Opened by this call (so a failure after it closes it again).
    pub opened_here: bool,
}

/// Opens the volume's LUKS2 header on `loopN` with its key file, or finds
/// it open already, and checks that what it holds is the volume.
pub fn open_on(
    registry: &Registry,
    volume: &Volume,
    encryption: &Encryption,
    number: u32,
) -> Result<Opened> {
    let name = mapping_name(&volume.id);
    let mut opened_here = false;
    let kernel_name = match dm_crypt::mapping_on_loop(number, &name) {
        Some(kernel_name) => kernel_name,
        None => {
            let header_device = header_device(volume, encryption, number)?;
            if dm_crypt::exists(&name) {
                bail!(
                    "a device-mapper device named {name} exists on another device than {}; `dmsetup info {name}` shows it",
                    header_device.display()
                );
            }
            let key_file = registry.root().host_path(&encryption.key_file);
            require_key_file(&key_file, &volume.id)?;
            tracing::info!(progress = true, "opening the encrypted volume as {name}");
            dm_crypt::open(
                &header_device,
                &name,
                &key_file,
                OpenOptions {
                    read_only: volume.read_only,
                    allow_discards: !volume.preallocated,
                },
            )?;
            opened_here = true;
            match dm_crypt::mapping_on_loop(number, &name) {
                Some(kernel_name) => kernel_name,
                None => {
                    let failure = anyhow::anyhow!(
                        "cryptsetup opened {name}, but sysfs does not show it on loop{number}"
                    );
                    return Err(close_after_failure(&name, true, failure));
                }
            }
        }
    };
    let opened = Opened {
        path: mapper_path(&name),
        node: Path::new("/dev").join(&kernel_name),
        opened_here,
    };
    // A block volume's opened device holds whatever its consumer wrote.
    if !volume.mode.is_block() {
        if let Err(failure) = require_volume_inside(volume, &opened.path) {
            return Err(close_after_failure(&name, opened_here, failure));
        }
    }
    Ok(opened)
}

/// The device whose LUKS2 header is opened: the loop device in filesystem
/// mode; in block mode its partition (device-mapper devices get no
/// partitions, so the header is inside the partition, not around it),
/// which must hold the volume's header.
fn header_device(volume: &Volume, encryption: &Encryption, number: u32) -> Result<PathBuf> {
    let device = LoopDevice::path_of(number);
    if !volume.mode.is_block() {
        return Ok(device);
    }
    let partition = PathBuf::from(format!("{}p1", device.display()));
    let file = match std::fs::File::open(&partition) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "the kernel made no partition device for {} (does it parse GPT partition tables?), and the encrypted block volume's LUKS2 header is inside that partition",
            device.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("opening {}", partition.display())),
    };
    let found = luks2_at(&file, 0).with_context(|| format!("reading {}", partition.display()))?;
    if found != Some(encryption.luks_uuid) {
        bail!(
            "partition {} holds {}, not the volume's LUKS2 header {}",
            partition.display(),
            found.map_or("no LUKS2 header".to_string(), |uuid| format!(
                "a LUKS2 header with UUID {uuid}"
            )),
            encryption.luks_uuid
        );
    }
    Ok(partition)
}

/// Runs `work` on the LUKS2 header of the volume whose backing file is at
/// `host_path`: on the file itself in filesystem mode, on a copy of its
/// partition's header area in block mode (what `work` changed in it
/// written back only when the caller `writes`).
pub fn on_header<T>(
    volume: &Volume,
    host_path: &Path,
    writes: bool,
    work: impl FnOnce(&Path) -> Result<T>,
) -> Result<T> {
    if !volume.mode.is_block() {
        return work(host_path);
    }
    // As every backing file is opened: never through a symlink.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(writes)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(host_path)
        .with_context(|| format!("opening {}", host_path.display()))?;
    let start = gpt_layout::partition_start(&file, volume.sector_size).with_context(|| {
        format!(
            "{} has no partition table for {}-byte sectors",
            host_path.display(),
            volume.sector_size
        )
    })?;
    luks::with_header_at(&file, start, writes, work)
}

fn require_key_file(key_file: &Path, id: &VolumeId) -> Result<()> {
    match std::fs::metadata(key_file) {
        Ok(meta) if meta.is_file() => Ok(()),
        Ok(_) => bail!("key file {} of volume {id} is not a regular file", key_file.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "key file {} of volume {id} is missing, so it cannot be unlocked unattended; its recovery key opens it ({RECOVERY_GUIDE})",
            key_file.display()
        ),
        Err(e) => Err(e).with_context(|| format!("reading key file {}", key_file.display())),
    }
}

/// The opened device must hold the file system carrying the volume UUID:
/// a header with the right UUID over someone else's data is not it.
fn require_volume_inside(volume: &Volume, opened: &Path) -> Result<()> {
    let device =
        std::fs::File::open(opened).with_context(|| format!("opening {}", opened.display()))?;
    let content = probe(&device).with_context(|| format!("reading {}", opened.display()))?;
    let inside = volume.identity().inside();
    if !inside.is_held_by(&content) {
        bail!(
            "the encrypted volume opened as {} holds {}, not {}",
            opened.display(),
            content.describe(),
            inside.describe()
        );
    }
    Ok(())
}

/// A failure after the mapping was opened: closes it when this call
/// opened it, and says whether that worked, in the one error sentence.
pub fn close_after_failure(name: &str, opened_here: bool, failure: anyhow::Error) -> anyhow::Error {
    if !opened_here {
        return failure;
    }
    match dm_crypt::close(name) {
        Ok(()) => anyhow::anyhow!("{failure:#}; closed {name} again, which this attach had opened"),
        Err(close_error) => anyhow::anyhow!(
            "{failure:#}; closing {name} (opened by this attach) failed too: {close_error:#}"
        ),
    }
}

/// Before `loopN` of volume `id` is released: its mapping, if one is open
/// on it, is closed (with `really`) or only checked to be closable.
/// Refused, naming the user, while anything mounts or holds the mapping.
/// True when a mapping was there.
pub fn close_on(id: &VolumeId, number: u32, really: bool) -> Result<bool> {
    let name = mapping_name(id);
    let Some(kernel_name) = dm_crypt::mapping_on_loop(number, &name) else {
        return Ok(false);
    };
    let users = users_of_device(&kernel_name);
    if !users.is_empty() {
        bail!(
            "{} ({}) is in use: {}",
            mapper_path(&name).display(),
            kernel_name,
            in_use(&users)
        );
    }
    if really {
        tracing::info!(progress = true, "closing {name}");
        dm_crypt::close(&name)?;
    }
    Ok(true)
}
