//! Whether this boot should have attached an enabled volume that no device
//! holds: the one verdict behind `check`'s `not-attached` severity and the
//! `attach_missed` that `list --json` and `metrics` report (which the
//! SparseVolumeNotAttached alert watches). A volume registered or changed
//! since the boot (a `create` without `--now`) was not missed: the next
//! boot attaches it, or the operator does now.

use std::fs;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::registry::paths::SystemRoot;
use crate::systemd::kernel_cmdline::{EmergencySwitch, Skip};
use crate::systemd::unit_name;
use crate::volume::id::VolumeId;

/// What is known of this boot, read once for every volume weighed.
pub struct ThisBoot {
    /// When it began: the kernel's `btime`.
    began: Option<SystemTime>,
    switch: EmergencySwitch,
}

impl ThisBoot {
    pub fn read(root: &SystemRoot) -> Self {
        Self {
            began: boot_time(),
            switch: EmergencySwitch::read(root),
        }
    }

    /// Why the kernel command line keeps the volume detached, if it does.
    pub fn skips(&self, id: &VolumeId) -> Option<Skip> {
        self.switch.skips(id)
    }

    /// Whether the volume's registry file was last written before this
    /// boot began, so that the generator saw it as it is.
    fn saw_the_volume(&self, root: &SystemRoot, id: &VolumeId) -> bool {
        let written = fs::metadata(root.volume_file(id)).and_then(|m| m.modified());
        match (written, self.began) {
            (Ok(written), Some(began)) => written < began,
            _ => false,
        }
    }
}

/// What systemd said of the volume's unit.
pub enum UnitSaid<'a> {
    /// Its `ActiveState`.
    State(&'a str),
    /// systemd could not be asked, or did not answer (why).
    Unknown(String),
}

/// An enabled, detached volume that the kernel command line does not
/// skip: whether this boot missed it (its unit failed, runs without a
/// device, or is inactive although the volume was registered before the
/// boot: a dependency failed, a condition was not met), and why it is not
/// attached, in words.
pub struct NotAttached {
    pub missed: bool,
    pub why: String,
}

pub fn not_attached(
    this_boot: &ThisBoot,
    root: &SystemRoot,
    id: &VolumeId,
    unit: UnitSaid,
) -> NotAttached {
    let name = unit_name(id);
    let journal = format!("see `journalctl -b -u {name}`");
    let (missed, why) = match unit {
        UnitSaid::State("failed") => (true, format!("{name} failed ({journal})")),
        UnitSaid::State("active") => (
            true,
            format!("{name} is active, but its device is gone (detached by hand?)"),
        ),
        UnitSaid::State("activating") => (false, format!("{name} is attaching it now")),
        UnitSaid::State(state @ ("deactivating" | "reloading")) => {
            (false, format!("{name} is {state} now"))
        }
        UnitSaid::State(state) if this_boot.saw_the_volume(root, id) => (
            true,
            format!(
                "{name} is {state} although this boot should have attached it (a dependency that failed? {journal})"
            ),
        ),
        UnitSaid::State(_) => (
            false,
            format!("registered or changed since this boot, so not attached yet; the next boot attaches it, or `sparse-volume start {id}` now"),
        ),
        UnitSaid::Unknown(reason) => (
            false,
            format!("the state of {name} is unknown ({reason}); `sparse-volume attach {id}` attaches it now"),
        ),
    };
    NotAttached { missed, why }
}

/// When this boot began: the kernel's `btime` in /proc/stat.
fn boot_time() -> Option<SystemTime> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    let seconds: u64 = stat
        .lines()
        .find_map(|line| line.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(UNIX_EPOCH + Duration::from_secs(seconds))
}
