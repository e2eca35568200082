//! `sparse-volume apply`: converges one volume to a desired state, for
//! config management. It decides what to do from the registry and the
//! device, then does it through the same operations as `create`, `resize`,
//! `enable`/`disable`, `start`/`stop` and `remove`, so every rule and every
//! refusal of those holds here too. With `--dry-run` each step runs its
//! checks and stops before changing anything.

pub mod desired;
mod encryption;
mod record;

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;

use crate::commands::provisioning::clone::{clone_volume, CloneRequest};
use crate::commands::provisioning::create::{
    create_volume, keep_in_error, recovery_key_lines, spec_differences, AskedSpec, CreateRequest,
    UUID_PLACEHOLDER,
};
use crate::commands::provisioning::register::{register, RegisterMode, RegisterRequest};
use crate::commands::provisioning::{remove, resize};
use crate::commands::report::{Failure, Outcome, Report};
use crate::engine::activate::{
    attached_devices, bring_down_now, bring_up_now, flag_without_systemd, refuse_if_in_use,
    reload_if_reachable, systemd_agrees, systemd_unless_absent,
};
use crate::engine::attach::{attach_planned, refuse_if_skipped};
use crate::engine::inspect::UNKNOWN;
use crate::hooks::{self, Stop};
use crate::kernel::files::ExclusiveLock;
use crate::registry::{Registry, Volume};
use crate::systemd::Systemd;
use crate::volume::id::VolumeId;
use crate::volume::reference::VolumeRef;
use crate::volume::size::format_size;
use crate::volume::size::round_up_to_mib;
use crate::volume::spec::{FsType, Mode, ModeKind};
use desired::{Desired, State};
pub use record::VolumeRecord;
use record::{record, record_without_runtime};

#[derive(Debug, Serialize)]
pub struct ApplyReport {
    pub changed: bool,
    /// Null when the volume neither exists nor will (absent), or when a
    /// dry run would create it under a UUID chosen then.
    pub uuid: Option<String>,
    pub name: Option<String>,
    pub state: State,
    /// For the human summary; the JSON gets `dry_run` from main's output,
    /// as every report does.
    #[serde(skip)]
    pub dry_run: bool,
    /// What was done (or, in a dry run, would be), in order.
    pub actions: Vec<String>,
    pub before: Option<VolumeRecord>,
    pub after: Option<VolumeRecord>,
    /// An encrypted volume's recovery key, set only by the run that
    /// created it (the one time it is shown; nothing keeps a copy).
    pub recovery_key: Option<String>,
    #[serde(skip)]
    warnings: Vec<String>,
}

impl Report for ApplyReport {
    fn human(&self) -> String {
        let who = match (&self.name, &self.uuid) {
            (Some(name), Some(uuid)) => format!("{name} ({uuid})"),
            (Some(name), None) => name.clone(),
            (None, Some(uuid)) => uuid.clone(),
            (None, None) => "the volume".into(),
        };
        let summary = match (self.actions.is_empty(), self.dry_run) {
            (true, _) => format!("{who} is already as asked ({})", state_name(self.state)),
            (false, false) => format!("{who}: {}", self.actions.join(", ")),
            (false, true) => format!("{who} would change: {}", self.actions.join(", ")),
        };
        match &self.recovery_key {
            Some(key) => format!("{summary}\n{}", recovery_key_lines(key)),
            None => summary,
        }
    }

    fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }
}

fn state_name(state: State) -> &'static str {
    match state {
        State::Present => "present",
        State::Absent => "absent",
    }
}

/// The first words of a failure's line: which volume it was about.
pub fn doing(desired: &Desired) -> String {
    match (&desired.name, &desired.uuid) {
        (_, Some(id)) => format!("applying {id}"),
        (Some(name), None) => format!("applying {name:?}"),
        (None, None) => "applying".to_string(),
    }
}

/// The volume the desired state names, when it is known before anything
/// runs (so that a refusal still names it): its UUID, or the one the name
/// stands for.
pub fn known_uuid(registry: &Registry, desired: &Desired) -> Option<VolumeId> {
    desired.uuid.or_else(|| {
        let name = desired.name.as_deref()?;
        Some(registry.volume_named(name).ok()??.id)
    })
}

pub fn apply(registry: &Registry, desired: &Desired, dry_run: bool) -> Outcome<ApplyReport> {
    desired
        .check()
        .map_err(|reason| Failure::Unchanged(anyhow!(reason)))?;
    // Every step's checks first, so that what can be refused (a stop while
    // mounted, a skipped volume, no space) is refused before the first
    // step changes anything.
    if !dry_run {
        converge(registry, desired, true)?;
    }
    converge(registry, desired, dry_run)
}

fn converge(registry: &Registry, desired: &Desired, dry_run: bool) -> Outcome<ApplyReport> {
    // As `enable`: no systemd is a machine it did not boot; a bus that
    // does not answer on one it booted is refused.
    let systemd = systemd_unless_absent(registry)
        .map_err(Failure::Unchanged)?
        .ok();
    let existing = find(registry, desired).map_err(Failure::Unchanged)?;
    let before = existing
        .as_ref()
        .map(|volume| record(registry, systemd.as_ref(), volume))
        .transpose()
        .map_err(Failure::Unchanged)?;
    let mut converge = Converge {
        registry,
        desired,
        dry_run,
        systemd: systemd.as_ref(),
        actions: Vec::new(),
        warnings: Vec::new(),
        uuid: existing.as_ref().map(|v| v.id),
        recovery_key: None,
    };
    let planned = match (desired.state, existing) {
        (State::Absent, None) => Ok(None),
        (State::Absent, Some(volume)) => converge.remove(&volume, before.as_ref()).map(|()| None),
        (State::Present, None) => converge.create().map(Some),
        (State::Present, Some(volume)) => converge.update(volume, before.as_ref()).map(Some),
    };
    // A failure after a change says what was changed, and on which volume.
    let planned = match (planned, converge.uuid) {
        (Err(error), Some(uuid)) if !converge.actions.is_empty() && !dry_run => {
            return Err(Failure::PartlyApplied {
                uuid,
                actions: converge.actions,
                error: keep_in_error(error, converge.recovery_key.as_deref()),
            });
        }
        (planned, _) => planned.map_err(Failure::Unchanged)?,
    };
    // From here on the changes are made; what is left only reads them.
    let after = read_after(
        registry,
        &converge,
        desired,
        before.as_ref(),
        planned,
        dry_run,
    )
    .map_err(|error| match converge.uuid {
        Some(uuid) if !converge.actions.is_empty() && !dry_run => Failure::PartlyApplied {
            uuid,
            actions: converge.actions.clone(),
            error: keep_in_error(error, converge.recovery_key.as_deref()),
        },
        _ => Failure::Unchanged(error),
    })?;
    let uuid = after
        .as_ref()
        .or(before.as_ref())
        .and_then(|r| r.uuid.clone())
        .or_else(|| desired.uuid.map(|id| id.to_string()));
    Ok(ApplyReport {
        changed: !converge.actions.is_empty(),
        uuid,
        name: after
            .as_ref()
            .or(before.as_ref())
            .and_then(|r| r.name.clone())
            .or_else(|| desired.name.clone()),
        state: desired.state,
        dry_run,
        actions: converge.actions,
        before,
        after,
        recovery_key: converge.recovery_key,
        warnings: converge.warnings,
    })
}

/// The volume's record after the steps: read back from the registry and
/// the device, or (in a dry run, which changed nothing) what the steps
/// planned.
fn read_after(
    registry: &Registry,
    converge: &Converge,
    desired: &Desired,
    before: Option<&VolumeRecord>,
    planned: Option<Volume>,
    dry_run: bool,
) -> Result<Option<VolumeRecord>> {
    Ok(match planned {
        // A dry run changed nothing to read back: what the registry would
        // say, with the device and unit as they are or as a planned stop
        // leaves them (a planned start's device is not known before the
        // attach picks it).
        Some(volume) if dry_run => {
            let mut after = record_without_runtime(&volume);
            if let Some(before) = before {
                after.device = before.device.clone();
                after.active_state = before.active_state.clone();
            }
            let systemd_seen = after.active_state != UNKNOWN;
            if converge.actions.iter().any(|a| a == "stop") {
                after.device = None;
                if systemd_seen {
                    after.active_state = "inactive".into();
                }
            } else if converge.actions.iter().any(|a| a == "start") && systemd_seen {
                after.active_state = "active".into();
            }
            // The UUID (and the default file name made of it) is chosen
            // when the volume is made, not now.
            if desired.uuid.is_none() && before.is_none() {
                after.uuid = None;
                if desired.path.is_none() {
                    after.path.set_file_name(UUID_PLACEHOLDER);
                }
                if let Some(key_file) = after
                    .key_file
                    .as_mut()
                    .filter(|_| desired.key_file.is_none())
                {
                    key_file.set_file_name(format!("{UUID_PLACEHOLDER}.key"));
                }
            }
            Some(after)
        }
        Some(volume) => Some(record(
            registry,
            converge.systemd,
            &registry.require(&volume.id)?,
        )?),
        None => None,
    })
}

/// The volume the desired state is about: by UUID, by name, or by both
/// when they agree. A UUID whose volume has another name is renamed when
/// present, but never removed: a stale UUID must not take another
/// volume's data away.
fn find(registry: &Registry, desired: &Desired) -> Result<Option<Volume>> {
    let named = match &desired.name {
        Some(name) => registry.volume_named(name)?,
        None => None,
    };
    match desired.uuid {
        Some(id) => {
            if let Some(other) = named.filter(|v| v.id != id) {
                bail!(
                    "the name {:?} is already given to volume {}; a name names one volume on a node",
                    desired.name.as_deref().unwrap_or_default(),
                    other.id
                );
            }
            let volume = registry.get(&id)?;
            if let (State::Absent, Some(name), Some(volume)) =
                (desired.state, &desired.name, &volume)
            {
                if volume.name.as_ref() != Some(name) {
                    bail!(
                        "volume {id} is named {:?}, not {name:?}; nothing is removed",
                        volume.name.as_deref().unwrap_or_default()
                    );
                }
            }
            Ok(volume)
        }
        None => Ok(named),
    }
}

struct Converge<'a> {
    registry: &'a Registry,
    desired: &'a Desired,
    dry_run: bool,
    systemd: Option<&'a Systemd>,
    actions: Vec<String>,
    warnings: Vec<String>,
    /// The volume's UUID once it exists (for [`Failure::PartlyApplied`]).
    uuid: Option<VolumeId>,
    /// Set by the create that enrolled it: for the report, or for the
    /// failure of a later step.
    recovery_key: Option<String>,
}

impl Converge<'_> {
    fn create(&mut self) -> Result<Volume> {
        let registry = self.registry;
        let desired = self.desired;
        if let Some(source) = &desired.clone_of {
            return self.clone_from(source);
        }
        if let Some(unit) = &desired.replaces_unit {
            return self.take_over(unit);
        }
        let size = desired
            .size
            .context("the volume does not exist; a size is needed to create it")?;
        let mode = desired
            .mode
            .unwrap_or(ModeKind::Filesystem)
            .to_mode(
                desired.fs_type,
                desired.mkfs_options.clone().unwrap_or_default(),
            )
            .map_err(|reason| anyhow!(reason))?;
        let created = create_volume(
            registry,
            &CreateRequest {
                size,
                mode: mode.clone(),
                uuid: desired.uuid,
                name: desired.name.clone(),
                path: desired.path.clone(),
                preallocate: desired.preallocate.unwrap_or(false),
                sector_size: desired.sector_size,
                now: false,
                dry_run: self.dry_run,
                encryption: encryption::request(desired),
            },
        )?;
        let id: VolumeId = created
            .uuid
            .as_deref()
            .context("create_volume reports the UUID it made")?
            .parse()
            .map_err(|e: String| anyhow!(e))?;
        self.uuid = Some(id);
        self.recovery_key = created.recovery_key.clone();
        if created.changed {
            let kind = match created.key_file {
                Some(_) => "an encrypted",
                None => "a",
            };
            self.actions.push(format!(
                "create {kind} {} volume of {}",
                describe_mode(&mode),
                format_size(created.size)
            ));
        }
        let volume = if self.dry_run {
            let encryption = encryption::planned(&created)?;
            Volume {
                id,
                path: created.path,
                size: created.size,
                mode,
                enabled: true,
                read_only: false,
                direct_io: registry.config().direct_io,
                preallocated: created.preallocated,
                name: desired.name.clone(),
                sector_size: created.sector_size,
                origin: None,
                replaces_unit: None,
                encryption,
            }
        } else {
            registry.require(&id)?
        };
        self.settle(volume, None, created.changed)
    }

    /// The existing file registered and taken over from `unit` (see
    /// `take_over`); then settled like a created one by the same steps.
    fn take_over(&mut self, unit: &str) -> Result<Volume> {
        let (changed, volume) = self.register_taking_over(unit)?;
        let mut volume = volume;
        self.grow_if_asked(&mut volume)?;
        self.settle(volume, None, changed)
    }

    /// `register --replaces-unit` with the desired uuid, path and spec:
    /// whether it changed anything, and the volume as registered (as it
    /// would be, in a dry run).
    fn register_taking_over(&mut self, unit: &str) -> Result<(bool, Volume)> {
        let registry = self.registry;
        let desired = self.desired;
        let (Some(id), Some(path)) = (desired.uuid, desired.path.clone()) else {
            bail!("replaces_unit needs the uuid the file carries and its path");
        };
        let mode = match (desired.mode, desired.fs_type) {
            (Some(ModeKind::Block), _) => RegisterMode::Block,
            (None, None) => RegisterMode::Detected,
            (_, fs_type) => RegisterMode::Filesystem(fs_type),
        };
        let registered_before = registry.get(&id)?;
        self.uuid = Some(id);
        let report = register(
            registry,
            &RegisterRequest {
                uuid: id,
                path: path.clone(),
                mode,
                // A registered volume is renamed by the steps after this
                // one, like any other.
                name: match registered_before {
                    Some(_) => None,
                    None => desired.name.clone(),
                },
                dry_run: self.dry_run,
                sector_size: desired.sector_size,
                replaces_unit: Some(unit.to_string()),
                now: false,
            },
        );
        let report = match report {
            Ok(report) => report,
            Err(Failure::Unchanged(error)) => return Err(error),
            Err(Failure::PartlyApplied { error, .. }) => {
                // The entry was written: the caller reports the failure as
                // partly applied, with this action.
                self.actions.push(format!(
                    "register {} and take it over from {unit}",
                    path.display()
                ));
                return Err(error);
            }
        };
        if report.registered {
            self.actions.push(format!(
                "register {} and take it over from {unit}",
                path.display()
            ));
        } else if report.changed {
            self.actions.push(format!("take over from {unit}"));
        }
        let volume = match registry.get(&id)? {
            Some(volume) if !self.dry_run || volume.replaces_unit.as_deref() == Some(unit) => {
                volume
            }
            registered => {
                // A dry run: what the register would write.
                let mode = match (report.mode, report.fs_type.as_deref()) {
                    ("block", _) => Mode::Block,
                    (_, fs_type) => Mode::Filesystem {
                        fs_type: fs_type
                            .map(str::parse)
                            .transpose()
                            .map_err(|e: String| anyhow!(e))?
                            .unwrap_or(FsType::Ext4),
                        mkfs_options: Vec::new(),
                    },
                };
                Volume {
                    replaces_unit: Some(unit.to_string()),
                    ..registered.unwrap_or(Volume {
                        id,
                        path,
                        size: report.size,
                        mode,
                        enabled: true,
                        read_only: false,
                        direct_io: registry.config().direct_io,
                        preallocated: false,
                        name: desired.name.clone(),
                        sector_size: report.sector_size,
                        origin: None,
                        replaces_unit: None,
                        encryption: None,
                    })
                }
            }
        };
        Ok((report.changed, volume))
    }

    /// The volume made as a clone; then settled like a created one (grown,
    /// started) by the same steps.
    fn clone_from(&mut self, source: &VolumeRef) -> Result<Volume> {
        let registry = self.registry;
        let desired = self.desired;
        let source = registry.resolve(source)?.id;
        let name = desired
            .name
            .clone()
            .context("a clone needs a name (it is how a repeated apply finds it)")?;
        let request = CloneRequest {
            source,
            name,
            uuid: desired.uuid,
            read_only: desired.read_only.unwrap_or(false),
            enabled: desired.enabled.unwrap_or(true),
            freeze_during_copy: desired.freeze_during_copy,
            grow_to: desired.size.map(round_up_to_mib).transpose()?,
            now: false,
            dry_run: self.dry_run,
        };
        let (cloned, volume) = clone_volume(registry, &request)?;
        self.uuid = Some(volume.id);
        let mut volume = if self.dry_run {
            volume
        } else {
            registry.require(&volume.id)?
        };
        if cloned.changed {
            self.actions.push(format!("clone {source}"));
        }
        match (self.dry_run && cloned.changed, desired.size) {
            // A clone not made yet cannot run resize's checks: the plan
            // says the grow, the real run checks it.
            (true, Some(asked)) => {
                let asked = round_up_to_mib(asked)?;
                if asked < volume.size {
                    bail!(
                        "the clone has its source's size, {}; volumes never shrink",
                        format_size(volume.size)
                    );
                }
                if asked > volume.size {
                    self.actions.push(format!(
                        "resize {} to {}",
                        format_size(volume.size),
                        format_size(asked)
                    ));
                }
            }
            _ => self.grow_if_asked(&mut volume)?,
        }
        self.settle(volume, None, cloned.changed)
    }

    fn update(&mut self, volume: Volume, before: Option<&VolumeRecord>) -> Result<Volume> {
        let desired = self.desired;
        if let Some(asked) = &desired.clone_of {
            let origin = volume.origin.map_or("none".to_string(), |o| o.to_string());
            match (self.registry.resolve(asked), volume.origin) {
                (Ok(resolved), Some(own)) if resolved.id == own => {}
                // A clone outlives its source: a name nobody has now
                // cannot be checked, and is no reason to stop converging.
                (Err(_), Some(_)) => self.warnings.push(format!(
                    "{asked} names no volume now; {} is a clone of {origin}, not checked against it",
                    volume.id
                )),
                (Ok(resolved), _) => bail!(
                    "the volume exists and is not a clone of {} (its origin: {origin}); a volume cannot become a clone",
                    resolved.id
                ),
                (Err(error), None) => return Err(error),
            }
        }
        let (fs_type, mkfs_options) = match desired.mode {
            Some(ModeKind::Block) => (None, None),
            _ => (desired.fs_type, desired.mkfs_options.as_deref()),
        };
        let differences = spec_differences(
            &volume,
            &AskedSpec {
                mode: desired.mode.map(ModeKind::name),
                fs_type,
                mkfs_options,
                path: desired.path.as_deref(),
                preallocate: desired.preallocate,
                sector_size: desired.sector_size,
                encrypt: desired.encrypt,
                key_file: desired.key_file.as_deref(),
            },
        );
        if !differences.is_empty() {
            bail!(
                "the volume exists with a different spec that cannot be changed: {}",
                differences.join(", ")
            );
        }
        let mut volume = volume;
        if let Some(unit) = &desired.replaces_unit {
            volume = self.register_taking_over(unit)?.1;
        }
        self.grow_if_asked(&mut volume)?;
        self.settle(volume, before, false)
    }

    /// Grows the volume to the size asked, when that differs (a smaller
    /// one is refused, with both sizes, like `resize`).
    fn grow_if_asked(&mut self, volume: &mut Volume) -> Result<()> {
        let Some(asked) = self.desired.size else {
            return Ok(());
        };
        // Exactly the registered size is no change, whole MiB or not.
        if asked == volume.size || round_up_to_mib(asked)? == volume.size {
            return Ok(());
        }
        let grown =
            resize::grow(self.registry, &volume.id, asked, self.dry_run).inspect_err(|error| {
                if error.is::<resize::PartlyGrown>() {
                    self.actions.push(resize::PartlyGrown::ACTION.into());
                }
            })?;
        self.actions.push(format!(
            "resize {} to {}",
            format_size(grown.old_size),
            format_size(grown.size)
        ));
        volume.size = grown.size;
        Ok(())
    }

    /// The registry flags and, with `now`, the unit: the same for a volume
    /// just created and one that existed.
    fn settle(
        &mut self,
        mut volume: Volume,
        before: Option<&VolumeRecord>,
        created: bool,
    ) -> Result<Volume> {
        let desired = self.desired;
        let mut changes = Vec::new();
        if let Some(name) = desired
            .name
            .as_ref()
            .filter(|n| volume.name.as_ref() != Some(*n))
        {
            changes.push(format!("rename to {name:?}"));
        }
        if let Some(enabled) = desired.enabled.filter(|e| *e != volume.enabled) {
            changes.push(if enabled { "enable" } else { "disable" }.to_string());
        }
        if let Some(read_only) = desired.read_only.filter(|r| *r != volume.read_only) {
            changes.push(if read_only { "read-only" } else { "read-write" }.to_string());
            if before.is_some_and(|b| b.device.is_some()) {
                self.warnings.push(
                    "the read_only flag takes effect when the volume is next attached".into(),
                );
            }
        }
        let enabled_changed = desired.enabled.is_some_and(|e| e != volume.enabled);
        let enabled_after = desired.enabled.unwrap_or(volume.enabled);
        // As `enable` does: a flag that matches but that systemd has not
        // seen (edited by hand, or a reload that failed) gets a reload.
        let stale = !created
            && !enabled_changed
            && desired.enabled.is_some()
            && self
                .systemd
                .is_some_and(|s| !systemd_agrees(self.registry, s, &volume.id, enabled_after));
        // Stopped first, like `disable --now`: a stop refused (the volume
        // is mounted) then leaves the flags as they were, not half a change;
        // and under the registry lock until the flags are written, which
        // keeps `check --repair` from attaching it again meanwhile.
        let held = if desired.now && !enabled_after {
            // A dry run changes nothing that a repair could undo.
            let lock = if self.dry_run {
                None
            } else {
                Some(self.registry.lock()?)
            };
            self.stop_if_running(&volume, before, created)?;
            if !self.dry_run {
                hooks::stop_at(Stop::DisableAfterStop);
            }
            lock
        } else {
            None
        };
        if !changes.is_empty() {
            volume = self.set_flags(volume, created, held)?;
            self.actions.extend(changes);
        } else {
            drop(held);
        }
        if stale {
            self.actions.push("reload".into());
        }
        if enabled_changed && self.systemd.is_none() {
            self.warnings.push(flag_without_systemd(enabled_after));
        }
        if (enabled_changed || created || stale) && !self.dry_run {
            reload_if_reachable()?;
        }
        if desired.now && enabled_after {
            self.start_unless_running(&volume, before, created)?;
        }
        Ok(volume)
    }

    /// Writes the flags under the registry lock (`held`, when the caller
    /// took it already), where a concurrent create cannot take the name
    /// meanwhile. A dry run of a create has no entry
    /// to write yet: its flags change in memory only.
    fn set_flags(
        &self,
        mut volume: Volume,
        created: bool,
        held: Option<ExclusiveLock>,
    ) -> Result<Volume> {
        let desired = self.desired;
        let apply_to = |volume: &mut Volume| {
            if let Some(name) = &desired.name {
                volume.name = Some(name.clone());
            }
            if let Some(enabled) = desired.enabled {
                volume.enabled = enabled;
            }
            if let Some(read_only) = desired.read_only {
                volume.read_only = read_only;
            }
        };
        if self.dry_run && created {
            apply_to(&mut volume);
            return Ok(volume);
        }
        let registry = self.registry;
        let _lock = match held {
            Some(lock) => lock,
            None => registry.lock()?,
        };
        if let Some(name) = &desired.name {
            registry.ensure_name_free(name, &volume.id)?;
        }
        // A dry run keeps what earlier steps planned (a size not written);
        // a real one starts from what they wrote.
        if !self.dry_run {
            volume = registry.require(&volume.id)?;
        }
        apply_to(&mut volume);
        volume.validate()?;
        if !self.dry_run {
            registry.put(&volume)?;
        }
        Ok(volume)
    }

    /// Whether the volume's backing file is attached, and whether its unit
    /// is known to be active (`None`: systemd was not asked).
    fn running(
        &self,
        volume: &Volume,
        before: Option<&VolumeRecord>,
        created: bool,
    ) -> Result<(bool, Option<bool>)> {
        let attached = if self.dry_run && created {
            false
        } else {
            !attached_devices(self.registry, &volume.id)?.is_empty()
        };
        let unit_active = before
            .filter(|b| b.active_state != UNKNOWN)
            .map(|b| b.active_state == "active");
        Ok((attached, unit_active))
    }

    /// `now` for an enabled volume: attached, its unit started.
    fn start_unless_running(
        &mut self,
        volume: &Volume,
        before: Option<&VolumeRecord>,
        created: bool,
    ) -> Result<()> {
        let (attached, unit_active) = self.running(volume, before, created)?;
        if attached && unit_active != Some(false) {
            return Ok(());
        }
        if !self.dry_run {
            // `settle` reloaded systemd after a create already.
            bring_up_now(self.registry, &volume.id, false)?;
        } else if created {
            // Nothing to verify yet but what needs no file.
            refuse_if_skipped(self.registry, &volume.id)?;
        } else {
            attach_planned(self.registry, &volume.id)?;
        }
        self.actions.push("start".into());
        Ok(())
    }

    /// `now` for a disabled volume: its unit stopped, detached; refused
    /// while something has it mounted.
    fn stop_if_running(
        &mut self,
        volume: &Volume,
        before: Option<&VolumeRecord>,
        created: bool,
    ) -> Result<()> {
        let (attached, unit_active) = self.running(volume, before, created)?;
        if !attached && unit_active != Some(true) {
            return Ok(());
        }
        if self.dry_run {
            refuse_if_in_use(self.registry, &volume.id)?;
        } else {
            bring_down_now(self.registry, &volume.id)?;
        }
        self.actions.push("stop".into());
        Ok(())
    }

    fn remove(&mut self, volume: &Volume, before: Option<&VolumeRecord>) -> Result<()> {
        let removed = remove::remove_volume(
            self.registry,
            &volume.id,
            self.desired.name.as_deref(),
            None,
            self.desired.delete_data,
            self.dry_run,
        )?;
        if before.is_some_and(|b| b.device.is_some() || b.active_state == "active") {
            self.actions.push("stop".into());
        }
        self.actions.push("remove".into());
        if removed.data_deleted {
            self.actions.push("delete-data".into());
        }
        Ok(())
    }
}

fn describe_mode(mode: &Mode) -> String {
    match mode {
        Mode::Filesystem { fs_type, .. } => format!("filesystem ({fs_type})"),
        Mode::Block => "block".into(),
    }
}
