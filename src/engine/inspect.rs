//! What `list` and `status` show about a volume: the registry entry, the
//! backing file, the loop device and udev link, and systemd's unit state.
//! Everything here only reads, works without root where file permissions
//! allow, and turns what it cannot see into `null`/`unknown` plus a
//! problem line instead of failing the whole listing.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use serde::Serialize;

use crate::engine::capacity::BackingFs;
use crate::kernel::loop_device::{devices_of_file, LoopDevice};
use crate::registry::paths::SystemRoot;
use crate::registry::Volume;
use crate::systemd::{unit_name, Systemd, UnitState};
use crate::volume::size::format_size;

/// Shown for unit states when systemd cannot be asked.
pub const UNKNOWN: &str = "unknown";

/// One volume as `list --json` and `status --json` print it. The field
/// names are a stable interface (docs/reference/json.md).
#[derive(Debug, Clone, Serialize)]
pub struct VolumeInfo {
    pub uuid: String,
    pub name: Option<String>,
    /// `filesystem` or `block`.
    pub mode: &'static str,
    /// `ext4`/`xfs` in filesystem mode, null in block mode.
    pub fs_type: Option<String>,
    /// Registered size in bytes.
    pub size: u64,
    /// Bytes the backing file occupies on disk (st_blocks * 512); null
    /// when the file cannot be inspected.
    pub allocated: Option<u64>,
    /// Logical path of the backing file, as written in the registry.
    pub path: PathBuf,
    pub enabled: bool,
    pub read_only: bool,
    /// What the kernel says of the attached device, which differs from
    /// `read_only` until the next attach after the flag changed; null
    /// when not attached.
    pub device_read_only: Option<bool>,
    /// The loop device the backing file is attached to, null if none.
    pub device: Option<PathBuf>,
    /// Block mode: the partition consumers use (`/dev/loopNp1`) when it exists.
    pub partition: Option<PathBuf>,
    /// The udev link consumers use: `/dev/disk/by-uuid/U` or `by-partuuid/U`.
    pub link: PathBuf,
    /// `linked` (resolves to `partition` or `device`), `missing`, or
    /// `elsewhere` (resolves to another device).
    pub link_state: &'static str,
    /// Where the link resolves to, null when it does not exist.
    pub link_target: Option<PathBuf>,
    /// `sparse-volume@<UUID>.service`.
    pub unit: String,
    /// systemd's ActiveState, or `unknown` when systemd cannot be asked.
    pub active_state: String,
    /// systemd's SubState, or `unknown`.
    pub sub_state: String,
    /// The service's Result (`success`, `exit-code`, ...), null when unknown.
    pub unit_result: Option<String>,
    /// The file system under the backing file: its free bytes against
    /// what the volumes on it may still grow into (`short` when that is
    /// more than is free); null when it cannot be measured.
    pub backing_fs: Option<BackingFs>,
    /// What could not be determined or looks wrong, one sentence each.
    pub problems: Vec<String>,
    /// The problem that says the backing file could not be read without
    /// root: a listing says it once for all volumes.
    #[serde(skip)]
    pub needs_root: Option<String>,
}

/// What systemd said about a volume's unit.
pub enum UnitLookup {
    Known(UnitState),
    /// systemd was not asked (it cannot be reached): `unknown`, no problem
    /// line per volume (the listing says why once).
    NotAsked,
    /// Asking failed: `unknown`, and why as a problem line.
    Failed(String),
}

impl UnitLookup {
    /// Asks `systemd` (if there is one) about the volume's unit. After a
    /// failure the caller should stop asking: a systemd that did not
    /// answer once would make every further volume wait as long.
    pub fn ask(systemd: Option<&Systemd>, volume: &Volume) -> Self {
        match systemd.map(|s| s.unit_state(&unit_name(&volume.id))) {
            Some(Ok(state)) => UnitLookup::Known(state),
            Some(Err(e)) => UnitLookup::Failed(format!("{e:#}")),
            None => UnitLookup::NotAsked,
        }
    }
}

/// Gathers everything about `volume`, with systemd's answer about its unit.
pub fn inspect(root: &SystemRoot, volume: &Volume, unit_lookup: UnitLookup) -> VolumeInfo {
    let mut problems = Vec::new();
    let mut needs_root = None;
    let host_path = root.host_path(&volume.path);

    let allocated = match fs::symlink_metadata(&host_path) {
        Ok(meta) if meta.file_type().is_file() => Some(meta.blocks() * 512),
        Ok(_) => {
            problems.push(format!(
                "backing file {} is not a regular file",
                host_path.display()
            ));
            None
        }
        Err(e) => {
            let problem = format!("cannot inspect backing file {}: {e}", host_path.display());
            if e.kind() == std::io::ErrorKind::PermissionDenied {
                needs_root = Some(problem.clone());
            }
            problems.push(problem);
            None
        }
    };

    let devices = match devices_of_file(&host_path) {
        Ok(devices) => devices,
        Err(e) => {
            problems.push(format!("cannot read the loop devices: {e:#}"));
            Vec::new()
        }
    };
    if devices.len() > 1 {
        problems.push(format!(
            "the backing file is attached {} times ({}); `sparse-volume check --repair` removes the extra devices",
            devices.len(),
            devices
                .iter()
                .map(|n| LoopDevice::path_of(*n).display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let device = devices.first().map(|n| LoopDevice::path_of(*n));
    let device_read_only = devices.first().and_then(|n| LoopDevice::is_read_only(*n));
    let partition = device
        .as_ref()
        .filter(|_| volume.mode.is_block())
        .map(|d| PathBuf::from(format!("{}p1", d.display())))
        .filter(|p| p.exists());

    let link = volume.mode.udev_link(&volume.id);
    let link_target = fs::canonicalize(&link).ok();
    let expected = partition.as_ref().or(device.as_ref());
    let link_state = match (&link_target, expected) {
        (None, _) => "missing",
        (Some(target), Some(expected)) if target == expected => "linked",
        (Some(_), _) => "elsewhere",
    };

    let unit = unit_name(&volume.id);
    let (active_state, sub_state, unit_result) = match unit_lookup {
        UnitLookup::Known(state) => (state.active_state, state.sub_state, Some(state.result)),
        UnitLookup::Failed(error) => {
            problems.push(error);
            (UNKNOWN.to_string(), UNKNOWN.to_string(), None)
        }
        UnitLookup::NotAsked => (UNKNOWN.to_string(), UNKNOWN.to_string(), None),
    };

    let fs_type = volume.mode.fs_type_name();
    VolumeInfo {
        uuid: volume.id.to_string(),
        name: volume.name.clone(),
        mode: volume.mode.name(),
        fs_type,
        size: volume.size,
        allocated,
        path: volume.path.clone(),
        enabled: volume.enabled,
        read_only: volume.read_only,
        device_read_only,
        device,
        partition,
        link,
        link_state,
        link_target,
        unit,
        active_state,
        sub_state,
        unit_result,
        backing_fs: None,
        problems,
        needs_root,
    }
}

impl VolumeInfo {
    /// Adds what is known about the backing file system (see
    /// [`crate::engine::capacity::backing_file_systems`]); a short one is a problem.
    pub fn with_backing_fs(mut self, backing_fs: Option<&BackingFs>) -> Self {
        if let Some(fs) = backing_fs.filter(|fs| fs.short) {
            self.problems.push(format!(
                "the file system of {} has {} free, but its volumes may still grow by {}: writes inside them fail once it is full",
                fs.directory.display(),
                format_size(fs.free),
                format_size(fs.committed_growth)
            ));
        }
        self.backing_fs = backing_fs.cloned();
        self
    }

    /// `active (exited)`, `inactive (dead)`, `unknown`.
    pub fn unit_state(&self) -> String {
        if self.active_state == UNKNOWN {
            UNKNOWN.to_string()
        } else {
            format!("{} ({})", self.active_state, self.sub_state)
        }
    }

    /// Several lines, like `systemctl status`.
    pub fn describe(&self) -> String {
        let mut lines = vec![match &self.name {
            Some(name) => format!("{} ({name})", self.uuid),
            None => self.uuid.clone(),
        }];
        let mut row = |key: &str, value: String| lines.push(format!("  {key:<9} {value}"));
        row(
            "mode:",
            match &self.fs_type {
                Some(fs) => format!("{} ({fs})", self.mode),
                None => self.mode.to_string(),
            },
        );
        row(
            "size:",
            format!(
                "{} ({} allocated)",
                format_size(self.size),
                self.allocated.map_or(UNKNOWN.to_string(), format_size)
            ),
        );
        row("path:", self.path.display().to_string());
        if let Some(fs) = &self.backing_fs {
            row(
                "backing:",
                format!(
                    "{} free of {}; its volumes may still grow by {}{}",
                    format_size(fs.free),
                    format_size(fs.total),
                    format_size(fs.committed_growth),
                    if fs.short {
                        " (more than is free!)"
                    } else {
                        ""
                    }
                ),
            );
        }
        row(
            "enabled:",
            format!("{}{}", yes_no(self.enabled), self.read_only_words()),
        );
        row(
            "device:",
            match (&self.device, &self.partition) {
                (Some(d), Some(p)) => format!("{} (partition {})", d.display(), p.display()),
                (Some(d), None) => d.display().to_string(),
                (None, _) => "not attached".to_string(),
            },
        );
        row(
            "link:",
            match &self.link_target {
                Some(target) => format!(
                    "{} -> {} ({})",
                    self.link.display(),
                    target.display(),
                    self.link_state
                ),
                None => format!("{} (missing)", self.link.display()),
            },
        );
        let mut unit = format!("{}: {}", self.unit, self.unit_state());
        if let Some(result) = self.unit_result.as_deref().filter(|r| *r != "success") {
            unit.push_str(&format!(", result {result}"));
        }
        row("unit:", unit);
        for problem in &self.problems {
            lines.push(format!("  problem:  {problem}"));
        }
        lines.join("\n")
    }
}

impl VolumeInfo {
    /// Read-only as the device has it now, for the table's `ro`.
    pub fn is_read_only_now(&self) -> bool {
        self.device_read_only.unwrap_or(self.read_only)
    }

    /// ", read-only", or the change that waits for the next attach.
    fn read_only_words(&self) -> &'static str {
        match (self.device_read_only, self.read_only) {
            (Some(false), true) => ", read-write now, read-only from the next attach",
            (Some(true), false) => ", read-only now, read-write from the next attach",
            (_, true) => ", read-only",
            (_, false) => "",
        }
    }
}

pub fn yes_no(value: bool) -> String {
    if value { "yes" } else { "no" }.to_string()
}

/// Reading never requires systemd: without it, unit states are unknown.
pub fn connect_for_reading(needed: bool) -> (Option<Systemd>, Option<String>) {
    if !needed {
        return (None, None);
    }
    match Systemd::connect() {
        Ok(systemd) => (Some(systemd), None),
        Err(e) => (None, Some(format!("{e:#}"))),
    }
}
