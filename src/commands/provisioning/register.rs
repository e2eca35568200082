//! `sparse-volume register`: adopt an existing backing file (for example
//! one an older config-management setup made) after checking its content
//! carries the volume UUID.

use std::path::PathBuf;

use anyhow::{bail, Result};
use serde::Serialize;

use crate::commands::report::{Failure, Outcome, Report};
use crate::engine::activate::{bring_up_now, systemd_unless_absent};
use crate::engine::attach::refuse_if_skipped;
use crate::engine::take_over::{
    live_steps_pending, refuse_unknown_unit, refuse_unless_one_device, refuse_unrelated_unit,
    take_over_now, unmanaged_note, TakeOverReport,
};
use crate::kernel::block_device::backing_logical_block_size;
use crate::registry::{check_path, check_size, Registry, Volume};
use crate::volume::backing_file::open_backing_file;
use crate::volume::id::VolumeId;
use crate::volume::probe::{probe, Content, Identity};
use crate::volume::size::format_size;
use crate::volume::spec::{FsType, Mode, DEFAULT_SECTOR_SIZE};

/// What the caller says the file holds; left open is read from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegisterMode {
    /// Whatever the content is: a file system, or a GPT (block).
    Detected,
    /// A file system; its type is detected when not given.
    Filesystem(Option<FsType>),
    Block,
}

#[derive(Debug, Clone)]
pub struct RegisterRequest {
    pub uuid: VolumeId,
    pub path: PathBuf,
    pub mode: RegisterMode,
    pub name: Option<String>,
    /// Every check, nothing registered.
    pub dry_run: bool,
    /// Detected from the content when not given; refused when the content
    /// does not read with it.
    pub sector_size: Option<u32>,
    /// The unit that attached the file so far, taken over (see
    /// `take_over`).
    pub replaces_unit: Option<String>,
    /// Start the volume's unit afterwards.
    pub now: bool,
}

#[derive(Debug, Serialize)]
pub struct RegisterReport {
    pub changed: bool,
    pub uuid: String,
    pub path: PathBuf,
    pub size: u64,
    pub mode: &'static str,
    pub fs_type: Option<String>,
    pub sector_size: u32,
    /// The take-over from `replaces_unit`, when asked.
    pub take_over: Option<TakeOverReport>,
    /// The loop device after `--now` (or a take-over of an attached file).
    pub device: Option<PathBuf>,
    /// How it was started (`--now`), for the sentence.
    #[serde(skip)]
    pub started: Option<String>,
    /// The registry entry was written (`changed` also counts the steps
    /// after it).
    #[serde(skip)]
    pub registered: bool,
}

impl Report for RegisterReport {
    fn human(&self) -> String {
        let mut said = self.registration();
        if let Some(take_over) = &self.take_over {
            said.push_str("; ");
            said.push_str(&take_over.human());
        } else if let (Some(how), Some(device)) = (&self.started, &self.device) {
            said.push_str(&format!("; {how}, attached as {}", device.display()));
        }
        said
    }

    fn warnings(&self) -> Vec<String> {
        self.take_over
            .as_ref()
            .map(|t| t.notes.clone())
            .unwrap_or_default()
    }

    fn planned(&self) -> String {
        let said = self.registration();
        let mut planned = match said.strip_prefix("registered ") {
            Some(rest) => format!("would register {rest}"),
            None => said,
        };
        if let Some(take_over) = &self.take_over {
            let unit = &take_over.unit;
            planned.push_str(&if take_over.notes.is_empty() {
                format!("; would take over from {unit} (masked at every boot, disabled, stopped without its ExecStop, its device adopted)")
            } else {
                format!("; would have the generator mask {unit} from the next boot on")
            });
        }
        planned
    }
}

impl RegisterReport {
    fn registration(&self) -> String {
        if self.changed {
            format!(
                "registered {} ({}, {} bytes) at {}",
                self.uuid,
                format_size(self.size),
                self.size,
                self.path.display()
            )
        } else {
            format!(
                "{} is already registered for {}",
                self.uuid,
                self.path.display()
            )
        }
    }
}

pub fn register(registry: &Registry, request: &RegisterRequest) -> Outcome<RegisterReport> {
    // As `enable`: no systemd is a machine it did not boot; a bus that
    // does not answer on one it booted is refused before anything.
    let systemd = if request.replaces_unit.is_some() || request.now {
        systemd_unless_absent(registry)
            .map_err(Failure::Unchanged)?
            .ok()
    } else {
        None
    };
    if let Some(unit) = &request.replaces_unit {
        refuse_unrelated_unit(unit, &request.uuid).map_err(Failure::Unchanged)?;
        // The live steps would end in an attach the switch refuses: the
        // old unit stopped and nothing holding the device.
        refuse_if_skipped(registry, &request.uuid).map_err(Failure::Unchanged)?;
        if let Some(systemd) = &systemd {
            refuse_unknown_unit(systemd, unit).map_err(Failure::Unchanged)?;
        }
    }
    let mut report = adopt(registry, request).map_err(Failure::Unchanged)?;
    report.registered = report.changed;
    if request.dry_run {
        if let Some(unit) = &request.replaces_unit {
            if let Some(systemd) = &systemd {
                report.changed |= live_steps_pending(registry, systemd, &request.uuid, unit)
                    .map_err(Failure::Unchanged)?;
            }
            report.take_over = Some(TakeOverReport {
                unit: unit.clone(),
                notes: systemd
                    .is_none()
                    .then(|| unmanaged_note(unit))
                    .into_iter()
                    .collect(),
                ..TakeOverReport::default()
            });
        }
        return Ok(report);
    }
    let id = request.uuid;
    let partly = |report: &RegisterReport, error: anyhow::Error| {
        if report.changed {
            Failure::PartlyApplied {
                uuid: id,
                actions: vec!["register".to_string()],
                error,
            }
        } else {
            Failure::Unchanged(error)
        }
    };
    if let Some(unit) = &request.replaces_unit {
        let take_over = take_over_now(registry, systemd.as_ref(), &id, unit, request.now)
            .map_err(|error| partly(&report, error))?;
        report.changed |= take_over.changed();
        report.device = take_over.device.clone();
        report.take_over = Some(take_over);
    } else if request.now {
        let activation =
            bring_up_now(registry, &id, true).map_err(|error| partly(&report, error))?;
        report.changed |= activation.changed;
        report.device = activation.device;
        report.started = Some(activation.how);
    }
    Ok(report)
}

/// Checks the file and writes its entry, under the registry lock; nothing
/// changes until the entry is written.
fn adopt(registry: &Registry, request: &RegisterRequest) -> Result<RegisterReport> {
    let root = registry.root();
    let config = registry.provisioning_config()?;
    check_path(&request.path, config).map_err(anyhow::Error::msg)?;
    registry.refuse_links_in_backing_path(&root.host_path(&request.path))?;
    let id = request.uuid;
    let report = |changed, volume: &Volume| RegisterReport {
        changed,
        uuid: id.to_string(),
        path: volume.path.clone(),
        size: volume.size,
        mode: volume.mode.name(),
        fs_type: volume.mode.fs_type_name(),
        sector_size: volume.sector_size,
        take_over: None,
        device: None,
        started: None,
        registered: false,
    };

    let _lock = registry.lock()?;
    if let Some(existing) = registry.get(&id)? {
        let same_name = request.name.is_none() || request.name == existing.name;
        if existing.path == request.path && same_spec(&existing, request) && same_name {
            if let Some(unit) = &request.replaces_unit {
                refuse_unless_one_device(registry, &id, unit)?;
            }
            return match (&request.replaces_unit, &existing.replaces_unit) {
                // The first unit would lose its mask at the next reload.
                (Some(unit), Some(earlier)) if unit != earlier => bail!(
                    "the volume was taken over from {earlier} already; a volume replaces one unit"
                ),
                (Some(unit), None) => {
                    // A volume registered before: the take-over is one more
                    // key in its entry.
                    let volume = Volume {
                        replaces_unit: Some(unit.clone()),
                        ..existing
                    };
                    volume.validate()?;
                    if !request.dry_run {
                        registry.put(&volume)?;
                    }
                    Ok(report(true, &volume))
                }
                _ => Ok(report(false, &existing)),
            };
        }
        if !same_name {
            let named = existing
                .name
                .as_ref()
                .map_or("without a name".to_string(), |name| {
                    format!("named {name:?}")
                });
            bail!(
                "the volume is already registered, {named} (name it with `sparse-volume apply --uuid {id} --name NEW`)"
            );
        }
        bail!(
            "the volume is already registered as a {} volume at {}",
            existing.mode.name(),
            existing.path.display()
        );
    }

    if let Some(name) = &request.name {
        registry.ensure_name_free(name, &id)?;
    }
    let host_path = root.host_path(&request.path);
    let file = open_backing_file(&host_path, true)?;
    let size = file.metadata()?.len();
    check_size(size)
        .map_err(|reason| anyhow::anyhow!("backing file {}: {reason}", host_path.display()))?;
    let content = probe(&file)?;
    let mode = adopted_mode(&content, request.mode)
        .map_err(|what| anyhow::anyhow!("backing file {} holds {what}", host_path.display()))?;
    if !Identity::plain(&mode, id.uuid()).is_held_by(&content) {
        bail!(
            "backing file {} holds {}, which does not carry the volume UUID {id} (is it the file or the UUID you meant?)",
            host_path.display(),
            content.describe()
        );
    }
    let sector_size = adopted_sector_size(&content, request.sector_size, &host_path)?;

    let volume = Volume {
        id,
        path: request.path.clone(),
        size,
        mode,
        enabled: true,
        read_only: false,
        direct_io: config.direct_io,
        preallocated: false,
        name: request.name.clone(),
        sector_size,
        origin: None,
        replaces_unit: request.replaces_unit.clone(),
        encryption: None,
    };
    volume.validate()?;
    if let Some(unit) = &request.replaces_unit {
        refuse_unless_one_device(registry, &id, unit)?;
    }
    if request.dry_run {
        return Ok(report(true, &volume));
    }
    registry.put(&volume)?;
    // An adopted file that still carries a create's mark must not look
    // like a leftover to `check --repair`.
    crate::volume::creating_mark::clear_creating_mark(&host_path)?;
    Ok(report(true, &volume))
}

/// A repeated register is a no-op when it asks for nothing else than what
/// is registered (what it leaves open was detected the first time).
fn same_spec(existing: &Volume, request: &RegisterRequest) -> bool {
    let mode = match (&existing.mode, request.mode) {
        (_, RegisterMode::Detected) | (Mode::Block, RegisterMode::Block) => true,
        (Mode::Filesystem { fs_type, .. }, RegisterMode::Filesystem(asked)) => {
            asked.is_none_or(|asked| asked == *fs_type)
        }
        _ => false,
    };
    mode && request
        .sector_size
        .is_none_or(|asked| asked == existing.sector_size)
}

/// The mode to register: the file system type is what the content holds
/// unless the caller named one; a named type that differs is refused
/// with what was found (`Err` completes "backing file … holds …").
fn adopted_mode(content: &Content, asked: RegisterMode) -> Result<Mode, String> {
    let found = match content {
        Content::Filesystem { fs_type, .. } => Some(*fs_type),
        _ => None,
    };
    match (asked, found) {
        (RegisterMode::Detected, None) if matches!(content, Content::PartitionTable { .. }) => {
            Ok(Mode::Block)
        }
        (RegisterMode::Detected, found) => Ok(Mode::Filesystem {
            // Without a file system, `identifies` refuses whatever we say.
            fs_type: found.unwrap_or(FsType::Ext4),
            mkfs_options: Vec::new(),
        }),
        (RegisterMode::Block, _) => Ok(Mode::Block),
        (RegisterMode::Filesystem(Some(asked)), Some(found)) if asked != found => {
            Err(format!("an {found} file system, not {asked}"))
        }
        (RegisterMode::Filesystem(asked), found) => Ok(Mode::Filesystem {
            // Without a file system, `identifies` refuses whatever we say.
            fs_type: asked.or(found).unwrap_or(FsType::Ext4),
            mkfs_options: Vec::new(),
        }),
    }
}

/// The sector size the content was made for, or the one asked for if the
/// content reads with it.
fn adopted_sector_size(
    content: &Content,
    asked: Option<u32>,
    host_path: &std::path::Path,
) -> Result<u32> {
    match asked {
        Some(size) if !content.works_with_sector_size(size) => bail!(
            "backing file {} holds {}, which does not read with {size}-byte sectors",
            host_path.display(),
            content.sector_requirement()
        ),
        Some(size) => Ok(size),
        None => {
            let backing = backing_logical_block_size(host_path).unwrap_or(DEFAULT_SECTOR_SIZE);
            Ok(content.preferred_sector_size(backing))
        }
    }
}
