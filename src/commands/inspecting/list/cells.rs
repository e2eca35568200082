//! The compact table's cells: what a person reads at a glance, derived
//! from the same [`VolumeInfo`] that `--json` prints.

use crate::commands::inspecting::list::families::depths;
use crate::commands::inspecting::list::terminal::{sanitise, truncate, width, Paint};
use crate::engine::inspect::VolumeInfo;

/// The hex digits that name a volume without a name (a UUID's first
/// group); more where two volumes share them.
const SHORT_ID: usize = 8;

/// What a volume is doing, most urgent first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Its unit failed (whether or not a device is left).
    Failed,
    /// A loop device holds its backing file.
    Attached,
    /// Not enabled and not attached: as intended.
    Disabled,
    /// Enabled but not attached: it is not there for its consumers.
    Detached,
}

impl State {
    pub fn of(volume: &VolumeInfo) -> Self {
        if volume.active_state == "failed" {
            State::Failed
        } else if volume.device.is_some() {
            State::Attached
        } else if !volume.enabled {
            State::Disabled
        } else {
            State::Detached
        }
    }

    pub fn word(self) -> &'static str {
        match self {
            State::Failed => "failed",
            State::Attached => "attached",
            State::Disabled => "disabled",
            State::Detached => "detached",
        }
    }

    pub fn paint(self) -> Paint {
        match self {
            State::Failed => Paint::Red,
            State::Attached => Paint::Green,
            State::Disabled => Paint::Dim,
            State::Detached => Paint::Yellow,
        }
    }
}

/// `ext4`, `xfs` or `block`, with ` ro` for a volume read-only now (its
/// device's state when attached; `status` and `check` say what changes at
/// the next attach).
pub fn mode(volume: &VolumeInfo) -> String {
    let kind = volume.fs_type.as_deref().unwrap_or(volume.mode);
    if volume.is_read_only_now() {
        format!("{kind} ro")
    } else {
        kind.to_string()
    }
}

/// `512B`, `64M`, `1.5G`, `20G`: binary units, at most five characters
/// below 1024 PiB, like lsblk.
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "K", "M", "G", "T", "P", "E"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    let rounded_tenths = (value * 10.0).round() / 10.0;
    if unit > 0 && rounded_tenths < 10.0 && rounded_tenths.fract() != 0.0 {
        format!("{rounded_tenths:.1}{}", UNITS[unit])
    } else {
        format!("{:.0}{}", value.round(), UNITS[unit])
    }
}

/// The allocated share of the size: `0%` only when nothing is allocated,
/// `<1%` below one percent, else whole percent rounded down (so `100%`
/// means fully allocated); `?` when the file cannot be inspected.
pub fn share(allocated: Option<u64>, size: u64) -> String {
    match allocated {
        None => "?".to_string(),
        Some(0) => "0%".to_string(),
        Some(bytes) => {
            let percent = u128::from(bytes) * 100 / u128::from(size.max(1));
            if percent == 0 {
                "<1%".to_string()
            } else {
                format!("{percent}%")
            }
        }
    }
}

/// `loop3`, or `loop3p1` for a block volume's partition; `-` when none.
pub fn device(volume: &VolumeInfo) -> String {
    volume
        .partition
        .as_ref()
        .or(volume.device.as_ref())
        .and_then(|path| path.file_name())
        .map_or("-".to_string(), |name| name.to_string_lossy().into_owned())
}

/// `r 1.2M w 96M`: bytes read and written since the attach; `-` when not
/// attached.
pub fn io(volume: &VolumeInfo) -> String {
    volume.io.map_or("-".to_string(), |io| {
        format!("r {} w {}", size(io.read_bytes), size(io.written_bytes))
    })
}

/// Whether the volume's backing file system has less free space than its
/// volumes may still grow into (the `!` marker).
pub fn short(volume: &VolumeInfo) -> bool {
    volume.backing_fs.as_ref().is_some_and(|fs| fs.short)
}

/// How a volume is named in the table: its name, else its short UUID. A
/// name that two volumes share carries the short UUID too, so that every
/// row still names one volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Label {
    /// How many listed origins stand above the volume: a clone is drawn
    /// under the volume it was cloned from.
    depth: usize,
    /// The name, or empty for a volume without one.
    name: String,
    /// The short UUID: alone without a name, in parentheses after a
    /// shared one, absent after a unique one.
    id: Option<String>,
}

impl Label {
    /// The label in at most `max` columns: a long name is cut with `…`,
    /// the short UUID never.
    pub fn fit(&self, max: usize) -> String {
        let indent = match self.depth {
            0 => String::new(),
            depth => format!("{}└ ", "  ".repeat(depth - 1)),
        };
        let max = max.saturating_sub(width(&indent)).max(1);
        let label = match (&self.id, self.name.is_empty()) {
            (Some(id), true) => id.clone(),
            (Some(id), false) => {
                let suffix = format!(" ({id})");
                let room = max.saturating_sub(width(&suffix)).max(1);
                format!("{}{suffix}", truncate(&self.name, room))
            }
            (None, _) => truncate(&self.name, max),
        };
        format!("{indent}{label}")
    }
}

/// The volume `v` was cloned from, by its name when it is listed with
/// one, else by its UUID; `-` for a volume that is no clone.
pub fn origin(v: &VolumeInfo, volumes: &[VolumeInfo]) -> String {
    let Some(origin) = v.origin.as_deref() else {
        return "-".into();
    };
    volumes
        .iter()
        .find(|o| o.uuid == origin)
        .and_then(|o| o.name.as_deref())
        .map_or_else(|| origin.to_string(), sanitise)
}

/// The labels of `volumes`, in their order.
pub fn labels(volumes: &[VolumeInfo]) -> Vec<Label> {
    // A short id is typed back as the beginning of a UUID: it must begin
    // no other volume's UUID and be no volume's name (an older version
    // gave names such as `2183af89`).
    let taken: Vec<&str> = volumes
        .iter()
        .map(|v| v.uuid.as_str())
        .chain(volumes.iter().filter_map(|v| v.name.as_deref()))
        .collect();
    volumes
        .iter()
        .zip(depths(volumes))
        .map(|(v, depth)| {
            let name = v.name.as_deref().map(sanitise).unwrap_or_default();
            let shared = !name.is_empty()
                && volumes
                    .iter()
                    .filter(|other| other.name.as_deref().map(sanitise).as_ref() == Some(&name))
                    .count()
                    > 1;
            Label {
                depth,
                id: (name.is_empty() || shared).then(|| short_id(&v.uuid, &taken)),
                name,
            }
        })
        .collect()
}

/// The shortest run of whole groups of `uuid` (at least the first, of
/// [`SHORT_ID`] digits) that no other of `all` (UUIDs and names) starts
/// with.
pub fn short_id(uuid: &str, all: &[&str]) -> String {
    let ends = (SHORT_ID.min(uuid.len())..=uuid.len())
        .filter(|&end| end == uuid.len() || uuid.as_bytes()[end] == b'-');
    for end in ends {
        let prefix = &uuid[..end];
        if !all
            .iter()
            .any(|other| *other != uuid && other.starts_with(prefix))
        {
            return prefix.to_string();
        }
    }
    uuid.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_like_lsblk() {
        assert_eq!(size(512), "512B");
        assert_eq!(size(0), "0B");
        assert_eq!(size(64 << 20), "64M");
        assert_eq!(size(320 << 20), "320M");
        assert_eq!(size(3 << 29), "1.5G");
        assert_eq!(size(10 << 30), "10G");
        assert_eq!(size((1 << 40) - (1 << 20)), "1024G");
        assert_eq!(size(u64::MAX), "16E");
        assert_eq!(size((10 << 30) - 1), "10G");
    }

    #[test]
    fn shares_never_round_to_a_lie() {
        assert_eq!(share(None, 100), "?");
        assert_eq!(share(Some(0), 100), "0%");
        assert_eq!(share(Some(1), 1 << 30), "<1%");
        assert_eq!(share(Some(12), 100), "12%");
        assert_eq!(share(Some(999), 1000), "99%");
        assert_eq!(share(Some(100), 100), "100%");
        assert_eq!(share(Some(5), 0), "500%");
    }

    #[test]
    fn short_ids_grow_until_they_are_unique() {
        let a = "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b";
        let b = "6f1c2a8e-3b4e-4e5f-8a9b-0c1d2e3f4a5b";
        let c = "0e2f7c5a-1111-4222-8333-444455556666";
        assert_eq!(short_id(c, &[a, b, c]), "0e2f7c5a");
        assert_eq!(short_id(a, &[a, b, c]), "6f1c2a8e-3b4d");
        let d = "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5c";
        assert_eq!(short_id(d, &[a, d]), d);
        assert_eq!(short_id(b, &[a, b, c]), "6f1c2a8e-3b4e");
        // A volume named like the short id: one more group.
        assert_eq!(short_id(c, &[c, "0e2f7c5a"]), &c[..13]);
    }

    #[test]
    fn a_shared_name_keeps_its_id_when_cut() {
        let label = Label {
            depth: 0,
            name: "postgres-data".into(),
            id: Some("6f1c2a8e".into()),
        };
        assert_eq!(label.fit(100), "postgres-data (6f1c2a8e)");
        assert_eq!(label.fit(16), "post… (6f1c2a8e)");
        // A clone's label is indented under its origin, in the same room.
        let clone = Label { depth: 2, ..label };
        assert_eq!(clone.fit(100), "  └ postgres-data (6f1c2a8e)");
        assert_eq!(clone.fit(20), "  └ post… (6f1c2a8e)");
    }
}
