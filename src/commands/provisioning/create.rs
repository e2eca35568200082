//! `sparse-volume create`: a new backing file, formatted or partitioned,
//! then registered — in an order where a crash at any point leaves
//! either nothing or a hidden `.<UUID>.creating` file that `check`
//! reports and `check --repair` removes.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use nix::fcntl::{renameat2, RenameFlags};
use serde::Serialize;

use crate::commands::report::{Failure, Outcome, Report};
use crate::engine::activate::{attached_devices, bring_up_now};
use crate::engine::attach::sector_size_blocks_direct_io;
use crate::engine::capacity;
use crate::engine::encryption::{mapping_name, on_header, RECOVERY_GUIDE};
use crate::hooks::{self, Crash};
use crate::kernel::block_device::backing_logical_block_size;
use crate::kernel::dm_crypt;
use crate::kernel::files::{sync_dir, write_atomically};
use crate::kernel::loop_device::{self, LoopDevice};
use crate::registry::paths::{SystemRoot, KEYS_DIR};
use crate::registry::{check_path, check_size, Registry, Volume};
use crate::volume::backing_file::{allocate, open_backing_file};
use crate::volume::creating_mark::{
    clear_creating_mark, creating_path, has_creating_mark, marked_for, set_creating_mark,
};
use crate::volume::filesystem::{make_filesystem, refuse_known_mkfs_failures};
use crate::volume::gpt_layout;
use crate::volume::id::VolumeId;
use crate::volume::luks;
use crate::volume::probe::{probe, Content};
use crate::volume::size::{format_size, round_up_to_mib};
use crate::volume::spec::{Encryption, FsType, Mode, DEFAULT_SECTOR_SIZE, SECTOR_SIZES};

/// Stands for the UUID a dry run of a create cannot know, in the default
/// path made of it.
pub const UUID_PLACEHOLDER: &str = "<uuid>";

#[derive(Debug, Clone)]
pub struct CreateRequest {
    pub size: u64,
    pub mode: Mode,
    pub uuid: Option<VolumeId>,
    pub name: Option<String>,
    pub path: Option<PathBuf>,
    pub preallocate: bool,
    /// The logical sector size; by default the backing device's.
    pub sector_size: Option<u32>,
    /// Also attach it (and report the device).
    pub now: bool,
    /// Every check, nothing made: the report says what would be.
    pub dry_run: bool,
    /// LUKS2 inside the backing file (`--encrypt`).
    pub encryption: Option<EncryptRequest>,
}

/// How an encrypted volume is to unlock at boot.
#[derive(Debug, Clone, Default)]
pub struct EncryptRequest {
    /// A key file of the operator's; None makes one in the keys directory.
    pub key_file: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
pub struct CreateReport {
    pub changed: bool,
    /// Null in a dry run that would choose the UUID: the real run chooses
    /// its own, and the default path ends in `<uuid>` then.
    pub uuid: Option<String>,
    pub path: PathBuf,
    pub size: u64,
    pub requested_size: u64,
    pub mode: &'static str,
    pub fs_type: Option<String>,
    pub preallocated: bool,
    /// The logical sector size the volume is made for.
    pub sector_size: u32,
    /// With `--now`: the loop device the volume is attached to.
    pub device: Option<PathBuf>,
    /// Set when an interrupted create was completed instead of a new one.
    pub note: Option<String>,
    /// An encrypted volume's LUKS2 header UUID (never the volume UUID).
    pub luks_uuid: Option<String>,
    pub key_file: Option<PathBuf>,
    /// Shown once, by the create that enrolled it; never stored by us.
    pub recovery_key: Option<String>,
    pub warnings: Vec<String>,
}

impl Report for CreateReport {
    fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }

    fn human(&self) -> String {
        let what = if self.changed {
            "created"
        } else {
            "already exists:"
        };
        self.sentence(what)
    }

    fn planned(&self) -> String {
        if self.changed {
            self.sentence("would create a")
        } else {
            self.human()
        }
    }
}

impl CreateReport {
    fn sentence(&self, what: &str) -> String {
        let uuid = self
            .uuid
            .as_deref()
            .unwrap_or("under a UUID chosen when it is created");
        let mut text = format!(
            "{what} {} volume {uuid} ({}) at {}",
            self.mode,
            format_size(self.size),
            self.path.display()
        );
        if self.size != self.requested_size {
            text.push_str(&format!(
                " (size rounded up from {} bytes to whole MiB)",
                self.requested_size
            ));
        }
        if let Some(key_file) = &self.key_file {
            let header = self
                .luks_uuid
                .as_ref()
                .map_or(String::new(), |uuid| format!("LUKS2 header {uuid}, "));
            text.push_str(&format!(
                ", encrypted ({header}unlocked by {})",
                key_file.display()
            ));
        }
        if let Some(device) = &self.device {
            text.push_str(&format!(", attached as {}", device.display()));
        }
        if let Some(note) = &self.note {
            text.push_str(&format!("; {note}"));
        }
        if let Some(recovery_key) = &self.recovery_key {
            text.push('\n');
            text.push_str(&recovery_key_lines(recovery_key));
        }
        text
    }
}

/// The lines a human report ends with when a create enrolled a recovery
/// key (`create`'s and `apply`'s).
pub fn recovery_key_lines(recovery_key: &str) -> String {
    format!(
        "recovery key: {recovery_key}\n\
         Store it away from this machine now: it is shown only this once, and it opens \
         the volume when the key file is lost ({RECOVERY_GUIDE})."
    )
}

/// A step that failed after the create must not lose the recovery key,
/// shown by no later run: the failure says it.
pub fn keep_in_error(error: anyhow::Error, recovery_key: Option<&str>) -> anyhow::Error {
    match recovery_key {
        Some(key) => error.context(format!(
            "the volume was created; its recovery key, shown only now, is {key} (store it away from this machine)"
        )),
        None => error,
    }
}

/// `create`: the volume, and with `--now` attached. A failed attach after
/// a volume was made reports that volume as made.
pub fn create(registry: &Registry, request: &CreateRequest) -> Outcome<CreateReport> {
    let mut report = create_volume(registry, request).map_err(Failure::Unchanged)?;
    let id = report
        .uuid
        .as_deref()
        .map(str::parse::<VolumeId>)
        .transpose()
        .map_err(|e| Failure::Unchanged(anyhow::anyhow!(e)))?;
    if request.dry_run && report.changed && request.uuid.is_none() {
        // The real run chooses its own UUID: this one would mislead.
        report.uuid = None;
        if request.path.is_none() {
            report.path.set_file_name(UUID_PLACEHOLDER);
        }
        report.luks_uuid = None;
        let default_key_file = request
            .encryption
            .as_ref()
            .is_some_and(|asked| asked.key_file.is_none());
        if let Some(key_file) = report.key_file.as_mut().filter(|_| default_key_file) {
            key_file.set_file_name(format!("{UUID_PLACEHOLDER}.key"));
        }
        return Ok(report);
    }
    let Some(id) = id else {
        return Ok(report);
    };
    if request.now && !request.dry_run {
        let activation = bring_up_now(registry, &id, true).map_err(|error| {
            // The only time the recovery key is shown must not be lost to
            // a failed start.
            let error = keep_in_error(error, report.recovery_key.as_deref());
            if report.changed {
                Failure::PartlyApplied {
                    uuid: id,
                    actions: vec!["create".into()],
                    error,
                }
            } else {
                Failure::Unchanged(error)
            }
        })?;
        report.changed |= activation.changed;
        report.device = activation.device;
        report.note = Some(activation.how);
    } else if !report.changed {
        // A repeated create says where the volume is, as `--now` does.
        report.device = attached_devices(registry, &id)
            .ok()
            .and_then(|devices| devices.into_iter().next());
    }
    Ok(report)
}

/// Everything but `--now`, under the registry lock: the step `apply`
/// composes.
pub fn create_volume(registry: &Registry, request: &CreateRequest) -> Result<CreateReport> {
    let root = registry.root();
    if request.size == 0 {
        bail!("the size must be greater than zero");
    }
    let size = round_up_to_mib(request.size)?;
    let config = registry.provisioning_config()?;
    let id = request
        .uuid
        .unwrap_or_else(|| VolumeId::new(uuid::Uuid::new_v4()));
    let default_path = config.storage_roots[0].join(id.to_string());
    let path = request.path.clone().unwrap_or(default_path);
    check_path(&path, config).map_err(anyhow::Error::msg)?;
    registry.refuse_links_in_backing_path(&root.host_path(&path))?;
    check_size(size).map_err(anyhow::Error::msg)?;
    let backing_block_size = backing_logical_block_size(&root.host_path(&path));
    let sector_size = request
        .sector_size
        .unwrap_or_else(|| default_sector_size(backing_block_size));
    let warnings = backing_block_size
        .filter(|_| config.direct_io)
        .and_then(|backing| sector_size_blocks_direct_io(sector_size, backing))
        .into_iter()
        .collect::<Vec<_>>();

    let encryption = request.encryption.as_ref().map(|asked| Encryption {
        luks_uuid: uuid::Uuid::new_v4(),
        key_file: asked
            .key_file
            .clone()
            .unwrap_or_else(|| Path::new(KEYS_DIR).join(format!("{id}.key"))),
    });
    let volume = Volume {
        id,
        path: path.clone(),
        size,
        mode: request.mode.clone(),
        enabled: true,
        read_only: false,
        direct_io: config.direct_io,
        preallocated: request.preallocate,
        name: request.name.clone(),
        sector_size,
        origin: None,
        replaces_unit: None,
        encryption,
    };
    // The parser's own rules, before anything exists on disk.
    volume.validate()?;
    let report = |changed: bool, volume: &Volume, note: Option<String>| CreateReport {
        changed,
        uuid: Some(volume.id.to_string()),
        path: volume.path.clone(),
        size: volume.size,
        requested_size: request.size,
        mode: volume.mode.name(),
        fs_type: volume.mode.fs_type_name(),
        preallocated: volume.preallocated,
        sector_size: volume.sector_size,
        device: None,
        note,
        luks_uuid: volume.encryption.as_ref().map(|e| e.luks_uuid.to_string()),
        key_file: volume.encryption.as_ref().map(|e| e.key_file.clone()),
        recovery_key: None,
        warnings: if changed {
            warnings.clone()
        } else {
            Vec::new()
        },
    };

    // One lock around the whole decision and the work: concurrent creates
    // must see each other's space, and two creates of one UUID must not
    // both format.
    let _lock = registry.lock()?;
    if let Some(name) = &request.name {
        if let Some(named) = registry.volume_named(name)?.filter(|v| v.id != id) {
            // Without a UUID, the name is the identity: the same spec again
            // is the same volume, as a repeated create by UUID is.
            if request.uuid.is_some() {
                registry.ensure_name_free(name, &id)?;
            }
            ensure_same_spec(&named, request, size)
                .with_context(|| format!("the name {name:?} is volume {}", named.id))?;
            let mut again = report(false, &named, None);
            if !request.dry_run {
                again.recovery_key = finish_registered(root, &named)?;
            }
            return Ok(again);
        }
        registry.ensure_name_free(name, &id)?;
    }
    if let Some(existing) = registry.get(&id)? {
        ensure_same_spec(&existing, request, size)?;
        let mut again = report(false, &existing, None);
        if !request.dry_run {
            again.recovery_key = finish_registered(root, &existing)?;
        }
        return Ok(again);
    }

    let host_path = root.host_path(&path);
    let directory = host_path
        .parent()
        .context("the backing file path has no directory")?
        .to_path_buf();
    if fs::symlink_metadata(&host_path).is_ok() {
        let volume = adopt_interrupted(&host_path, volume)?;
        if request.dry_run {
            return Ok(report(
                true,
                &volume,
                Some("would complete an interrupted create".into()),
            ));
        }
        // Its recovery key was never shown: a new one takes its slot.
        let recovery_key = renew_recovery_key(root, &host_path, &volume)?;
        registry.put(&volume)?;
        clear_creating_mark(&host_path)?;
        let mut adopted = report(
            true,
            &volume,
            Some("completed an interrupted create".into()),
        );
        adopted.recovery_key = recovery_key;
        return Ok(adopted);
    }

    // Only for a file about to be made: an existing volume stays as it is.
    if let Mode::Filesystem { fs_type, .. } = &volume.mode {
        let file_system_size = match &volume.encryption {
            Some(_) => size
                .checked_sub(luks::DATA_OFFSET)
                .filter(|s| *s > 0)
                .with_context(|| {
                    format!(
                        "an encrypted volume needs more than {} (its LUKS2 header)",
                        format_size(luks::DATA_OFFSET)
                    )
                })?,
            None => size,
        };
        refuse_known_mkfs_failures(*fs_type, file_system_size)?;
    }
    // The partition table's room (1 MiB of alignment before the partition,
    // the backup table after it) and the header's.
    let smallest_encrypted_block = luks::DATA_OFFSET + (2 << 20);
    if volume.mode.is_block() && volume.encryption.is_some() && size <= smallest_encrypted_block {
        bail!(
            "an encrypted block volume needs more than {} (its partition table and LUKS2 header); ask for a larger size",
            format_size(smallest_encrypted_block)
        );
    }
    if request.dry_run {
        // The directory is not made; the file system it would be made on
        // is the one its nearest existing ancestor is on.
        let existing = directory
            .ancestors()
            .find(|d| d.is_dir())
            .context("no directory of the backing file path exists")?;
        let capacity = capacity::measure(registry, existing, None)?;
        capacity::ensure_fits(&capacity, size, &directory)?;
        if let Some(asked) = request
            .encryption
            .as_ref()
            .and_then(|e| e.key_file.as_ref())
        {
            check_operators_key_file(&root.host_path(asked))?;
        }
        return Ok(report(true, &volume, None));
    }
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&directory)
        .with_context(|| format!("creating {}", directory.display()))?;
    let capacity = capacity::measure(registry, &directory, None)?;
    capacity::ensure_fits(&capacity, size, &directory)?;

    let temporary = creating_path(&host_path);
    remove_stale_temporary(registry, &temporary)?;
    let secrets = match &volume.encryption {
        Some(encryption) => {
            let key_file = root.host_path(&encryption.key_file);
            let ours = request
                .encryption
                .as_ref()
                .is_some_and(|asked| asked.key_file.is_none());
            let made_key_file = prepare_key_file(&key_file, ours)?;
            Some(Secrets {
                key_file,
                made_key_file,
                recovery_key: luks::new_recovery_key()?,
            })
        }
        None => None,
    };
    make_backing_file(&temporary, &volume, secrets.as_ref()).inspect_err(|_| {
        // A key that opens nothing is not left behind.
        if let Some(secrets) = secrets.as_ref().filter(|s| s.made_key_file) {
            let _ = fs::remove_file(&secrets.key_file);
        }
    })?;
    hooks::crash_at(Crash::CreateBeforeRename);
    // NOREPLACE: never clobber a file that appeared meanwhile.
    renameat2(
        None,
        &temporary,
        None,
        &host_path,
        RenameFlags::RENAME_NOREPLACE,
    )
    .with_context(|| {
        format!(
            "renaming {} to {}",
            temporary.display(),
            host_path.display()
        )
    })?;
    sync_dir(&directory)?;
    hooks::crash_at(Crash::CreateBeforeRegistry);
    tracing::info!(progress = true, "registering {}", volume.id);
    registry.put(&volume)?;
    hooks::crash_at(Crash::CreateBeforeUnmark);
    clear_creating_mark(&host_path)?;
    let mut made = report(true, &volume, None);
    made.recovery_key = secrets.map(|s| s.recovery_key);
    Ok(made)
}

/// What a new encrypted volume is made with: the key file (host path)
/// and the recovery key to enroll and show.
struct Secrets {
    key_file: PathBuf,
    /// Made by this create (so removed again if it fails).
    made_key_file: bool,
    recovery_key: String,
}

/// The key file a new encrypted volume opens with: one of the operator's
/// must exist and be root's alone; ours is made (root, 0400) unless an
/// interrupted create of this volume made it already (nothing else writes
/// in the keys directory under this volume's name). True when made here.
fn prepare_key_file(key_file: &Path, ours: bool) -> Result<bool> {
    match fs::symlink_metadata(key_file) {
        Ok(_) => check_operators_key_file(key_file).map(|()| false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && ours => {
            let directory = key_file
                .parent()
                .context("the key file path has no directory")?;
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(directory)
                .with_context(|| format!("creating {}", directory.display()))?;
            write_atomically(key_file, &luks::new_key()?, 0o400)
                .with_context(|| format!("writing key file {}", key_file.display()))?;
            Ok(true)
        }
        Err(_) => check_operators_key_file(key_file).map(|()| false),
    }
}

/// A key file must be a regular file of root's that nobody else can read.
fn check_operators_key_file(key_file: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = fs::symlink_metadata(key_file)
        .with_context(|| format!("key file {}", key_file.display()))?;
    if !meta.is_file() {
        bail!("key file {} is not a regular file", key_file.display());
    }
    if meta.uid() != 0 || meta.mode() & 0o077 != 0 {
        bail!(
            "key file {} must belong to root and be readable by nobody else (it is owned by uid {} with mode {:04o}); chown root and chmod 0400 it",
            key_file.display(),
            meta.uid(),
            meta.mode() & 0o7777
        );
    }
    Ok(())
}

/// A create killed after registering but before unmarking, now repeated:
/// the mark must not outlive it, and an encrypted volume's recovery key,
/// which that create never got to show, is replaced by one shown now.
fn finish_registered(root: &SystemRoot, volume: &Volume) -> Result<Option<String>> {
    let host_path = root.host_path(&volume.path);
    if !has_creating_mark(&host_path) {
        return Ok(None);
    }
    let recovery_key = renew_recovery_key(root, &host_path, volume)?;
    clear_creating_mark(&host_path)?;
    Ok(recovery_key)
}

/// A new recovery key in an encrypted volume's recovery keyslot, for a
/// create that enrolled one but never got to show it; None when the
/// volume is not encrypted.
fn renew_recovery_key(
    root: &SystemRoot,
    host_path: &Path,
    volume: &Volume,
) -> Result<Option<String>> {
    let Some(encryption) = &volume.encryption else {
        return Ok(None);
    };
    // Lock order registry → volume, as everywhere (the caller holds the
    // registry's): no attach opens the header while it is rewritten.
    let _volume_lock = Registry::volume_lock(root, &volume.id)?;
    // An attached volume's header is read through its device, whose cache
    // would not see a rewrite of the file behind it.
    let devices = loop_device::devices_backed_by(host_path)?;
    if let Some(number) = devices.first() {
        bail!(
            "volume {} was attached ({}) before its interrupted create showed a recovery key; detach it and run the same create again, which replaces its recovery key and shows the new one",
            volume.id,
            LoopDevice::path_of(*number).display()
        );
    }
    let recovery_key = luks::new_recovery_key()?;
    let key_file = root.host_path(&encryption.key_file);
    on_header(volume, host_path, true, |header| {
        luks::replace_recovery_key(header, &key_file, &recovery_key)
    })?;
    Ok(Some(recovery_key))
}

fn ensure_same_spec(existing: &Volume, request: &CreateRequest, size: u64) -> Result<()> {
    let mut differences = Vec::new();
    if existing.size != size {
        differences.push(format!(
            "size {} (asked {})",
            format_size(existing.size),
            format_size(size)
        ));
    }
    let (fs_type, mkfs_options) = match &request.mode {
        Mode::Filesystem {
            fs_type,
            mkfs_options,
        } => (Some(*fs_type), Some(mkfs_options.as_slice())),
        Mode::Block => (None, None),
    };
    differences.extend(spec_differences(
        existing,
        &AskedSpec {
            mode: Some(request.mode.name()),
            fs_type,
            mkfs_options,
            path: request.path.as_deref(),
            preallocate: Some(request.preallocate),
            sector_size: request.sector_size,
            encrypt: Some(request.encryption.is_some()),
            key_file: request
                .encryption
                .as_ref()
                .and_then(|e| e.key_file.as_deref()),
        },
    ));
    if request.name.is_some() && request.name != existing.name {
        differences.push("name".to_string());
    }
    if differences.is_empty() {
        return Ok(());
    }
    let hint = if existing.size < size && differences.len() == 1 {
        "; use `sparse-volume resize` to grow it"
    } else {
        ""
    };
    bail!(
        "the volume already exists with a different spec: {}{hint}",
        differences.join(", ")
    )
}

/// What a caller asks of a volume that exists already, beyond its size
/// and name; `None` means "as it is".
pub struct AskedSpec<'a> {
    pub mode: Option<&'static str>,
    pub fs_type: Option<FsType>,
    /// Empty asks for nothing in particular.
    pub mkfs_options: Option<&'a [String]>,
    pub path: Option<&'a Path>,
    pub preallocate: Option<bool>,
    pub sector_size: Option<u32>,
    pub encrypt: Option<bool>,
    /// With `encrypt`: the key file asked for (none: any).
    pub key_file: Option<&'a Path>,
}

/// The properties fixed when a volume was made (no command changes them)
/// in which it differs from what is asked, one phrase each.
pub fn spec_differences(existing: &Volume, asked: &AskedSpec) -> Vec<String> {
    let mut differences = Vec::new();
    if let Some(mode) = asked.mode.filter(|m| *m != existing.mode.name()) {
        differences.push(format!("mode {} (asked {mode})", existing.mode.name()));
    }
    if let Mode::Filesystem {
        fs_type,
        mkfs_options,
    } = &existing.mode
    {
        if let Some(asked_type) = asked.fs_type.filter(|t| t != fs_type) {
            differences.push(format!("file system {fs_type} (asked {asked_type})"));
        }
        if asked
            .mkfs_options
            .is_some_and(|o| !o.is_empty() && o != mkfs_options.as_slice())
        {
            differences.push("mkfs options".to_string());
        }
    }
    if existing.mode.is_block()
        && asked.mode.is_none()
        && (asked.fs_type.is_some() || asked.mkfs_options.is_some_and(|o| !o.is_empty()))
    {
        differences.push("mode block (asked a file system)".to_string());
    }
    if let Some(path) = asked.path.filter(|p| *p != existing.path) {
        differences.push(format!(
            "path {} (asked {})",
            existing.path.display(),
            path.display()
        ));
    }
    if asked
        .preallocate
        .is_some_and(|p| p != existing.preallocated)
    {
        differences.push(format!("preallocated = {}", existing.preallocated));
    }
    if let Some(sector_size) = asked.sector_size.filter(|s| *s != existing.sector_size) {
        differences.push(format!(
            "sector size {} (asked {sector_size})",
            existing.sector_size
        ));
    }
    match (&existing.encryption, asked.encrypt) {
        (None, Some(true)) => differences.push("not encrypted (asked to encrypt)".to_string()),
        (Some(_), Some(false)) => differences.push("encrypted (asked not to)".to_string()),
        (Some(existing), Some(true)) => {
            if let Some(key_file) = asked.key_file.filter(|k| *k != existing.key_file) {
                differences.push(format!(
                    "key file {} (asked {})",
                    existing.key_file.display(),
                    key_file.display()
                ));
            }
        }
        _ => {}
    }
    differences
}

/// A file at the final path but no registry entry: a create that crashed
/// after its rename. Adopt it only if it still carries the creating mark
/// and is exactly what we would have made; anything else is someone's
/// data and is never touched.
fn adopt_interrupted(host_path: &Path, mut volume: Volume) -> Result<Volume> {
    if marked_for(host_path).as_deref() != Some(volume.id.to_string().as_str()) {
        bail!(
            "{} already exists; create never overwrites a file (use `sparse-volume register` to adopt it)",
            host_path.display()
        );
    }
    let file = open_backing_file(host_path, true)?;
    let content = probe(&file)?;
    let length = file.metadata()?.len();
    // The header's UUID was chosen by the create that was interrupted
    // (which renames the file into place only once it is whole).
    if let Some(encryption) = &mut volume.encryption {
        match &content {
            Content::Luks2 { uuid }
            | Content::PartitionTable {
                header_inside: Some(uuid),
                ..
            } => encryption.luks_uuid = *uuid,
            _ => {}
        }
    }
    let expected = volume.identity().is_held_by(&content)
        && content.works_with_sector_size(volume.sector_size);
    if !expected || length != volume.size {
        bail!(
            "{} already exists and holds {}; create never overwrites a file (use `sparse-volume register` to adopt it)",
            host_path.display(),
            content.describe()
        );
    }
    Ok(volume)
}

/// A leftover of an earlier crash of this same create: never renamed, so
/// only ours if no registry file (valid or not) names it; we hold the
/// registry lock, so none can start to.
fn remove_stale_temporary(registry: &Registry, temporary: &Path) -> Result<()> {
    if fs::symlink_metadata(temporary).is_err() {
        return Ok(());
    }
    if registry
        .named_backing_files()?
        .iter()
        .any(|named| named == temporary)
    {
        bail!(
            "{} is named by a registry file; not removing it",
            temporary.display()
        );
    }
    fs::remove_file(temporary).with_context(|| format!("removing stale {}", temporary.display()))
}

fn make_backing_file(temporary: &Path, volume: &Volume, secrets: Option<&Secrets>) -> Result<()> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(temporary)
        .with_context(|| format!("creating {}", temporary.display()))?;
    // From here on the file is ours (made with O_EXCL under the registry
    // lock): a failure must not leave it for `check` to find.
    fill_backing_file(&file, temporary, volume, secrets).inspect_err(|_| {
        let _ = fs::remove_file(temporary);
    })
}

fn fill_backing_file(
    file: &File,
    temporary: &Path,
    volume: &Volume,
    secrets: Option<&Secrets>,
) -> Result<()> {
    set_creating_mark(file, &volume.id);
    if volume.preallocated {
        tracing::info!(
            progress = true,
            "sizing the backing file: reserving {} (preallocation)",
            format_size(volume.size)
        );
    } else {
        tracing::info!(
            progress = true,
            "sizing the backing file: {} (sparse)",
            format_size(volume.size)
        );
    }
    allocate(file, volume.size, volume.preallocated)
        .with_context(|| format!("sizing {}", temporary.display()))?;
    hooks::crash_at(Crash::CreateAfterAllocate);
    match (&volume.mode, &volume.encryption, secrets) {
        (Mode::Filesystem { .. }, Some(encryption), Some(secrets)) => {
            fill_encrypted(temporary, volume, encryption, secrets)?;
        }
        (Mode::Filesystem { .. } | Mode::Block, Some(_), None) => {
            bail!("an encrypted volume is made with its key file")
        }
        (
            Mode::Filesystem {
                fs_type,
                mkfs_options,
            },
            None,
            _,
        ) => {
            make_filesystem(
                temporary,
                *fs_type,
                volume.id.uuid(),
                volume.sector_size,
                mkfs_options,
            )?;
            // An mkfs option can pick blocks or sectors smaller than the
            // volume's sectors: such a file system would never mount.
            let content = probe(file)?;
            // An mkfs option (-U, -m uuid=) can override the UUID: such a
            // volume would never attach under its own name.
            if !volume.identity().is_held_by(&content) {
                bail!(
                    "mkfs made {}, not {}; the mkfs options must not set the UUID",
                    content.describe(),
                    volume.identity().describe()
                );
            }
            if !content.works_with_sector_size(volume.sector_size) {
                bail!(
                    "mkfs made {}, which does not mount on the volume's {}-byte sectors; check the mkfs options",
                    content.sector_requirement(),
                    volume.sector_size
                );
            }
        }
        (Mode::Block, Some(encryption), Some(secrets)) => {
            tracing::info!(progress = true, "writing the partition table");
            let partition = gpt_layout::write_new(file, volume.id.uuid(), volume.sector_size)
                .with_context(|| format!("partitioning {}", temporary.display()))?;
            format_in_partition(file, partition, volume, encryption, secrets)?;
        }
        (Mode::Block, None, _) => {
            tracing::info!(progress = true, "writing the partition table");
            gpt_layout::write_new(file, volume.id.uuid(), volume.sector_size)
                .with_context(|| format!("partitioning {}", temporary.display()))?;
        }
    }
    hooks::crash_at(Crash::CreateAfterFormat);
    file.sync_all()
        .with_context(|| format!("syncing {}", temporary.display()))
}

/// An encrypted block volume's LUKS2 header, at the start of its
/// partition (consumers get the opened device raw, as they get a plain
/// block volume's partition).
fn format_in_partition(
    file: &File,
    partition: gpt_layout::PartitionExtent,
    volume: &Volume,
    encryption: &Encryption,
    secrets: &Secrets,
) -> Result<()> {
    if partition.length_bytes() <= luks::DATA_OFFSET {
        bail!(
            "an encrypted block volume needs a partition larger than {} (its LUKS2 header); ask for a larger size",
            format_size(luks::DATA_OFFSET)
        );
    }
    luks::with_header_at(file, partition.start_bytes(), true, |header| {
        luks::format(
            header,
            encryption.luks_uuid,
            volume.sector_size,
            &secrets.key_file,
        )?;
        luks::enroll_recovery_key(header, &secrets.key_file, &secrets.recovery_key)
    })
}

/// An encrypted volume's content: the LUKS2 header with the key file and
/// the recovery key enrolled, then the file system made inside through a
/// mapping opened for the purpose (cryptsetup binds a loop device of its
/// own for the file, released when the mapping closes).
fn fill_encrypted(
    temporary: &Path,
    volume: &Volume,
    encryption: &Encryption,
    secrets: &Secrets,
) -> Result<()> {
    let Mode::Filesystem {
        fs_type,
        mkfs_options,
    } = &volume.mode
    else {
        bail!("an encrypted block volume's header is made in its partition");
    };
    let name = mapping_name(&volume.id);
    if dm_crypt::exists(&name) {
        bail!(
            "a device-mapper device named {name} exists already (left by an interrupted create of this volume?); `cryptsetup close {name}`, then create again"
        );
    }
    luks::format(
        temporary,
        encryption.luks_uuid,
        volume.sector_size,
        &secrets.key_file,
    )?;
    luks::enroll_recovery_key(temporary, &secrets.key_file, &secrets.recovery_key)?;
    dm_crypt::open(
        temporary,
        &name,
        &secrets.key_file,
        dm_crypt::OpenOptions {
            read_only: false,
            allow_discards: !volume.preallocated,
        },
    )?;
    let opened = dm_crypt::mapper_path(&name);
    let made = make_filesystem(
        &opened,
        *fs_type,
        volume.id.uuid(),
        volume.sector_size,
        mkfs_options,
    )
    .and_then(|()| {
        let inside = volume.identity().inside();
        let content =
            probe(&File::open(&opened).with_context(|| format!("opening {}", opened.display()))?)?;
        if !inside.is_held_by(&content) {
            bail!(
                "mkfs made {}, not {}; the mkfs options must not set the UUID",
                content.describe(),
                inside.describe()
            );
        }
        Ok(())
    });
    // Closed whatever happened: the backing file is removed after a failure.
    let closed = dm_crypt::close(&name);
    made?;
    closed
}

/// The backing device's logical block size, so that the loop device can
/// use direct I/O (the smallest supported size at least that large);
/// 512 when no block device is behind the storage (tmpfs, overlay, …).
fn default_sector_size(backing_block_size: Option<u32>) -> u32 {
    let Some(backing) = backing_block_size else {
        tracing::debug!(
            "the storage's block device is unknown (tmpfs, overlay, network or btrfs); \
             using {DEFAULT_SECTOR_SIZE}-byte sectors"
        );
        return DEFAULT_SECTOR_SIZE;
    };
    SECTOR_SIZES
        .iter()
        .copied()
        .find(|&size| size >= backing)
        .unwrap_or(SECTOR_SIZES[SECTOR_SIZES.len() - 1])
}
