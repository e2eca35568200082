//! What `list` and `status` show about a volume: the registry entry, the
//! backing file, the loop device and udev link, and systemd's unit state.
//! Everything here only reads, works without root where file permissions
//! allow, and turns what it cannot see into `null`/`unknown` plus a
//! problem line instead of failing the whole listing.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Result;
use serde::Serialize;

use crate::engine::boot_verdict::{not_attached, ThisBoot, UnitSaid};
use crate::engine::capacity::BackingFs;
use crate::engine::encryption::mapping_name;
use crate::kernel::block_stat::IoCounters;
use crate::kernel::dm_crypt;
use crate::kernel::fs_health::{FsHealth, MountTable};
use crate::kernel::loop_device::{BoundLoops, LoopDevice};
use crate::registry::io_base;
use crate::registry::paths::SystemRoot;
use crate::registry::Volume;
use crate::systemd::{unit_name, Systemd, UnitActivity};
use crate::volume::size::format_size;

/// What `list`/`status --json` say of an encrypted volume.
#[derive(Debug, Clone, Serialize)]
pub struct EncryptionInfo {
    /// The LUKS2 header's UUID (the file system inside carries the
    /// volume's).
    pub luks_uuid: String,
    /// How it is opened unattended: `key-file`.
    pub unlock: &'static str,
    pub key_file: PathBuf,
    /// `/dev/mapper/sparse-volume-<UUID>` while it is open, else null.
    pub opened: Option<PathBuf>,
}

/// Shown for unit states when systemd cannot be asked.
pub const UNKNOWN: &str = "unknown";

/// One volume as `list --json` and `status --json` print it. The field
/// names are a stable interface (docs/reference/json.md).
#[derive(Debug, Clone, Serialize)]
pub struct VolumeInfo {
    pub uuid: String,
    pub name: Option<String>,
    /// The UUID of the volume this one was cloned from; null for a volume
    /// made otherwise.
    pub origin: Option<String>,
    /// The unit this volume was taken over from (masked at every boot);
    /// null for a volume sparse-volume attached from the start.
    pub replaces_unit: Option<String>,
    /// `filesystem` or `block`.
    pub mode: &'static str,
    /// An encrypted volume's header, how it unlocks and its opened
    /// device; null for a volume that is not encrypted.
    pub encryption: Option<EncryptionInfo>,
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
    /// What went through the loop device since the attach (the whole
    /// device in block mode); null when not attached.
    pub io: Option<IoCounters>,
    /// Filesystem mode: the mounted file system's health (its mount
    /// points, read-only, ext4's error counters); null when not mounted.
    pub fs_health: Option<FsHealth>,
    /// `sparse-volume@<UUID>.service`.
    pub unit: String,
    /// systemd's ActiveState, or `unknown` when systemd cannot be asked.
    pub active_state: String,
    /// systemd's SubState, or `unknown`.
    pub sub_state: String,
    /// The service's Result (`success`, `exit-code`, ...), null when unknown.
    pub unit_result: Option<String>,
    /// Enabled, not attached, and this boot should have attached it (its
    /// unit failed, runs without the device, or is inactive although the
    /// volume was registered before the boot); false for a volume created
    /// since the boot or skipped by the kernel command line; null when the
    /// unit's state is unknown.
    pub attach_missed: Option<bool>,
    /// The file system under the backing file: its free bytes against
    /// what the volumes on it may still grow into (`short` when that is
    /// more than is free); null when it cannot be measured.
    /// Shared by every volume on that file system (a thousand volumes
    /// would otherwise each copy the list of all that may grow).
    pub backing_fs: Option<Arc<BackingFs>>,
    /// What could not be determined or looks wrong, one sentence each.
    pub problems: Vec<String>,
    /// The problem that says the backing file could not be read without
    /// root: a listing says it once for all volumes.
    #[serde(skip)]
    pub needs_root: Option<String>,
}

/// What systemd said about a volume's unit.
pub enum UnitLookup {
    Known {
        active_state: String,
        sub_state: String,
        /// The service's `Result`.
        result: String,
    },
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
            Some(Ok(state)) => UnitLookup::Known {
                active_state: state.active_state,
                sub_state: state.sub_state,
                result: state.result,
            },
            Some(Err(e)) => UnitLookup::Failed(format!("{e:#}")),
            None => UnitLookup::NotAsked,
        }
    }

    /// The volume's unit as one listing of every volume unit has it
    /// ([`Systemd::loaded_units_matching`]), so that a thousand volumes
    /// cost one call instead of ten each. A listing has no `Result`:
    /// systemd keeps it `success` unless the unit is failed (a start and a
    /// reset-failed both clear it), so only a failed unit is asked. A unit
    /// systemd has not loaded is, to systemd, inactive and dead.
    pub fn from_listing(
        systemd: &Systemd,
        listed: &BTreeMap<String, UnitActivity>,
        volume: &Volume,
    ) -> Self {
        let known = |active_state: &str, sub_state: &str| UnitLookup::Known {
            active_state: active_state.to_string(),
            sub_state: sub_state.to_string(),
            result: "success".to_string(),
        };
        match listed.get(&unit_name(&volume.id)) {
            Some(unit) if unit.active_state == "failed" => Self::ask(Some(systemd), volume),
            Some(unit) => known(&unit.active_state, &unit.sub_state),
            None => known("inactive", "dead"),
        }
    }
}

/// What the kernel says of every volume, read once for all the volumes a
/// command inspects: the bound loop devices (or why they could not be
/// read), the mount table, and this boot's start and command line.
pub struct KernelView {
    loops: Result<BoundLoops>,
    mounts: MountTable,
    this_boot: ThisBoot,
}

impl KernelView {
    pub fn read(root: &SystemRoot) -> Self {
        Self {
            loops: BoundLoops::read(),
            mounts: MountTable::read(),
            this_boot: ThisBoot::read(root),
        }
    }
}

/// Gathers everything about `volume`, with systemd's answer about its unit.
pub fn inspect(
    root: &SystemRoot,
    volume: &Volume,
    kernel: &KernelView,
    unit_lookup: UnitLookup,
) -> VolumeInfo {
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

    let devices = match &kernel.loops {
        Ok(loops) => loops.devices_of_file(&host_path),
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
    let io = devices
        .first()
        .and_then(|n| io_base::since_attach(root, &volume.id, *n));
    // An encrypted volume's consumers use its mapping over the device.
    let mapping = volume.encryption.as_ref().and_then(|_| {
        devices
            .iter()
            .find_map(|n| dm_crypt::mapping_on_loop(*n, &mapping_name(&volume.id)))
    });
    // A block volume's file system, if any, is its consumer's business.
    // Any device holding the file may be the mounted one.
    let fs_health = match &mapping {
        Some(kernel_name) => FsHealth::of_mounted(kernel_name, &kernel.mounts),
        None => devices
            .iter()
            .filter(|_| !volume.mode.is_block())
            .find_map(|n| FsHealth::of_mounted(&format!("loop{n}"), &kernel.mounts)),
    };
    let partition = device
        .as_ref()
        .filter(|_| volume.mode.is_block())
        .map(|d| PathBuf::from(format!("{}p1", d.display())))
        .filter(|p| p.exists());

    let link = volume.consumer_path();
    let link_target = fs::canonicalize(&link).ok();
    let opened_node = mapping.as_ref().map(|name| Path::new("/dev").join(name));
    let expected = opened_node
        .as_ref()
        .or(partition.as_ref())
        .or(device.as_ref());
    let link_state = match (&link_target, expected) {
        (None, _) => "missing",
        (Some(target), Some(expected)) if target == expected => "linked",
        (Some(_), _) => "elsewhere",
    };

    let unit = unit_name(&volume.id);
    let (active_state, sub_state, unit_result) = match unit_lookup {
        UnitLookup::Known {
            active_state,
            sub_state,
            result,
        } => (active_state, sub_state, Some(result)),
        UnitLookup::Failed(error) => {
            problems.push(error);
            (UNKNOWN.to_string(), UNKNOWN.to_string(), None)
        }
        UnitLookup::NotAsked => (UNKNOWN.to_string(), UNKNOWN.to_string(), None),
    };

    let attach_missed =
        if !volume.enabled || device.is_some() || kernel.this_boot.skips(&volume.id).is_some() {
            Some(false)
        } else if active_state == UNKNOWN {
            // Not a "no": without the unit's state nobody can say.
            None
        } else {
            let said = UnitSaid::State(&active_state);
            Some(not_attached(&kernel.this_boot, root, &volume.id, said).missed)
        };
    let fs_type = volume.mode.fs_type_name();
    VolumeInfo {
        uuid: volume.id.to_string(),
        name: volume.name.clone(),
        origin: volume.origin.map(|o| o.to_string()),
        replaces_unit: volume.replaces_unit.clone(),
        mode: volume.mode.name(),
        encryption: volume.encryption.as_ref().map(|e| EncryptionInfo {
            luks_uuid: e.luks_uuid.to_string(),
            unlock: "key-file",
            key_file: e.key_file.clone(),
            opened: mapping
                .as_ref()
                .map(|_| dm_crypt::mapper_path(&mapping_name(&volume.id))),
        }),
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
        io,
        fs_health,
        unit,
        active_state,
        sub_state,
        unit_result,
        attach_missed,
        backing_fs: None,
        problems,
        needs_root,
    }
}

impl VolumeInfo {
    /// Adds what is known about the backing file system (see
    /// [`crate::engine::capacity::backing_file_systems`]); a short one is a problem.
    pub fn with_backing_fs(mut self, backing_fs: Option<&Arc<BackingFs>>) -> Self {
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
        if let Some(origin) = &self.origin {
            row("origin:", format!("a clone of {origin}"));
        }
        if let Some(unit) = &self.replaces_unit {
            row("replaces:", format!("{unit} (masked at every boot)"));
        }
        if let Some(encryption) = &self.encryption {
            row(
                "luks2:",
                format!(
                    "encrypted; header {}, unlocked by key file {}{}",
                    encryption.luks_uuid,
                    encryption.key_file.display(),
                    encryption
                        .opened
                        .as_ref()
                        .map_or(String::new(), |o| format!("; open as {}", o.display()))
                ),
            );
        }
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
        match (&self.io, &self.device) {
            (Some(io), _) => row(
                "i/o:",
                format!(
                    "read {} in {} requests, wrote {} in {}, discarded {} (since the attach)",
                    format_size(io.read_bytes),
                    io.reads,
                    format_size(io.written_bytes),
                    io.writes,
                    format_size(io.discarded_bytes)
                ),
            ),
            (None, Some(_)) => row(
                "i/o:",
                "not counted for this attach: it was made other than by sparse-volume (by hand, or by a version that did not count; `sparse-volume attach` counts from now), or the kernel has no disk sequence numbers (before 5.15)".to_string(),
            ),
            (None, None) => {}
        }
        if let Some(health) = &self.fs_health {
            row("mounted:", describe_fs_health(health));
        }
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

/// `on /srv/pg, read-only, 2 errors recorded (the last at 2026-12-05
/// 12:35:20 UTC)`.
fn describe_fs_health(health: &FsHealth) -> String {
    let points: Vec<String> = health
        .mount_points
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let mut text = format!("on {}", points.join(", "));
    if health.shut_down {
        text.push_str(", shut down after an error: every access fails (`sparse-volume check` says what to do)");
    } else if health.read_only {
        text.push_str(", read-only");
    }
    let errors = |n: u64| match n {
        1 => "1 error recorded".to_string(),
        n => format!("{n} errors recorded"),
    };
    match (health.errors, health.last_error_time) {
        (Some(0), _) => text.push_str(", no errors recorded"),
        (Some(n), Some(last)) => text.push_str(&format!(
            ", {} (the last at {}; `sparse-volume check` says what to do)",
            errors(n),
            utc(last)
        )),
        (Some(n), None) => text.push_str(&format!(", {}", errors(n))),
        (None, _) => {}
    }
    text
}

/// Unix time as `2026-12-05 12:35:20 UTC` (days to a civil date counted
/// from 0000-03-01, so that a leap day ends its year).
pub fn utc(seconds: u64) -> String {
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    let from_march_0000 = days + 719_468;
    let era = from_march_0000 / 146_097;
    let day_of_era = from_march_0000 % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = era * 400 + year_of_era + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_time_reads_as_a_utc_date() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(951_868_799), "2000-02-29 23:59:59 UTC");
        assert_eq!(utc(1_796_474_120), "2026-12-05 12:35:20 UTC");
        assert_eq!(utc(4_107_542_400), "2100-03-01 00:00:00 UTC");
    }
}
