//! The emergency switch on the kernel command line: `sparse_volume=off`
//! (no volume is attached at boot) and `sparse_volume.skip=<UUID>[,...]`
//! (these volumes are not). An operator whose boot hangs or crashes
//! because of a volume types it at the boot loader, repairs, and reboots
//! without it. The generator, `attach` and `check` all ask this module, so
//! the switch means the same thing everywhere.
//!
//! Parsed the way systemd parses its own options (`proc_cmdline_parse`):
//! words separated by whitespace, single or double quotes group (also in
//! the middle of a word), `-` and `_` in a key are the same, the last
//! `sparse_volume=` wins, and `sparse_volume.skip=` may repeat and
//! accumulates.

use std::collections::BTreeSet;
use std::fmt;
use std::io::ErrorKind;

use uuid::Uuid;

use crate::registry::paths::SystemRoot;
use crate::volume::id::VolumeId;

pub const CMDLINE: &str = "/proc/cmdline";
const OFF_KEY: &str = "sparse_volume";
const SKIP_KEY: &str = "sparse_volume.skip";

/// What the kernel command line asks of the volumes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EmergencySwitch {
    off: bool,
    skipped: BTreeSet<Uuid>,
    problems: Vec<String>,
}

/// Why a volume is left alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// `sparse_volume=off`: every volume.
    Off,
    /// `sparse_volume.skip=` names this volume.
    Listed,
}

impl Skip {
    /// The switch as the operator typed it, to name in messages.
    pub fn switch(self) -> &'static str {
        match self {
            Skip::Off => "sparse_volume=off",
            Skip::Listed => "sparse_volume.skip=",
        }
    }
}

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on the kernel command line", self.switch())
    }
}

impl EmergencySwitch {
    /// Reads `/proc/cmdline` below `root`. A missing file (a container, a
    /// test root without one) skips nothing; an unreadable one is reported
    /// in [`problems`](Self::problems) and skips nothing either, because
    /// guessing would take volumes down.
    pub fn read(root: &SystemRoot) -> Self {
        let path = root.host_path(CMDLINE);
        match std::fs::read(&path) {
            Ok(bytes) => Self::parse(&String::from_utf8_lossy(&bytes)),
            Err(e) if e.kind() == ErrorKind::NotFound => Self::default(),
            Err(e) => Self {
                problems: vec![format!(
                    "reading {}: {e}; the kernel command line switches are ignored",
                    path.display()
                )],
                ..Self::default()
            },
        }
    }

    pub fn parse(cmdline: &str) -> Self {
        let mut switch = Self::default();
        for word in words(cmdline) {
            let (key, value) = match word.split_once('=') {
                Some((key, value)) => (key, Some(value)),
                None => (word.as_str(), None),
            };
            if key_eq(key, OFF_KEY) {
                switch.set_enabled(value);
            } else if key_eq(key, SKIP_KEY) {
                switch.add_skips(value.unwrap_or(""));
            }
        }
        switch
    }

    /// A bare `sparse_volume` means "on", as systemd's boolean options do.
    fn set_enabled(&mut self, value: Option<&str>) {
        match value.map_or(Some(true), parse_boolean) {
            Some(enabled) => self.off = !enabled,
            None => self.problems.push(format!(
                "{OFF_KEY}={}: not a boolean (expected off or on); ignored",
                value.unwrap_or_default()
            )),
        }
    }

    fn add_skips(&mut self, list: &str) {
        for item in list.split(',').filter(|item| !item.is_empty()) {
            match Uuid::try_parse(item) {
                Ok(uuid) => {
                    self.skipped.insert(uuid);
                }
                Err(_) => self
                    .problems
                    .push(format!("{SKIP_KEY}=: \"{item}\" is not a UUID; ignored")),
            }
        }
    }

    /// Whether `sparse_volume=off` is in force.
    pub fn is_off(&self) -> bool {
        self.off
    }

    /// Why the volume must be left alone, or `None` when it may attach.
    pub fn skips(&self, id: &VolumeId) -> Option<Skip> {
        if self.off {
            Some(Skip::Off)
        } else if self.skipped.contains(&id.uuid()) {
            Some(Skip::Listed)
        } else {
            None
        }
    }

    /// The UUIDs `sparse_volume.skip=` names, canonical.
    pub fn skipped(&self) -> impl Iterator<Item = VolumeId> + '_ {
        self.skipped.iter().map(|uuid| VolumeId::new(*uuid))
    }

    /// What could not be understood (each was ignored), for the log.
    pub fn problems(&self) -> &[String] {
        &self.problems
    }
}

/// `Some(reason)` when the volume must not be attached now: the one call
/// for commands that act on one volume.
pub fn skip_reason(root: &SystemRoot, id: &VolumeId) -> Option<Skip> {
    EmergencySwitch::read(root).skips(id)
}

/// systemd's `parse_boolean`.
fn parse_boolean(value: &str) -> Option<bool> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "yes" | "y" | "true" | "t" | "on" => Some(true),
        "0" | "no" | "n" | "false" | "f" | "off" => Some(false),
        _ => None,
    }
}

/// systemd's `proc_cmdline_key_streq`: `-` and `_` are interchangeable.
fn key_eq(key: &str, wanted: &str) -> bool {
    let normal = |c: char| if c == '-' { '_' } else { c };
    key.len() == wanted.len() && key.chars().map(normal).eq(wanted.chars().map(normal))
}

/// The command line's words: whitespace separates, quotes group and are
/// removed, an unterminated quote runs to the end (systemd's
/// `EXTRACT_UNQUOTE | EXTRACT_RELAX`). Backslashes are kept as they are
/// (`EXTRACT_RETAIN_ESCAPE`); no value of ours contains one.
fn words(cmdline: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in cmdline.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => word.push(c),
            None if c == '"' || c == '\'' => {
                quote = Some(c);
                in_word = true;
            }
            None if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            None => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b";
    const B: &str = "9e4f8a9d-86f6-4c02-8728-3f79df764478";

    fn id(text: &str) -> VolumeId {
        text.parse().unwrap()
    }

    #[test]
    fn splits_words_like_systemd() {
        assert_eq!(
            words("  a b=\"c d\"  'e f'g \"h\n"),
            ["a", "b=c d", "e fg", "h\n"]
        );
        assert_eq!(words("x=\"\""), ["x="]);
        assert!(words(" \t\n").is_empty());
    }

    #[test]
    fn nothing_on_the_command_line_skips_nothing() {
        let switch = EmergencySwitch::parse("BOOT_IMAGE=/vmlinuz root=/dev/vda1 ro quiet\n");
        assert_eq!(switch, EmergencySwitch::default());
        assert_eq!(switch.skips(&id(A)), None);
    }

    #[test]
    fn off_skips_every_volume_and_the_last_word_wins() {
        let switch = EmergencySwitch::parse("quiet sparse_volume=off");
        assert!(switch.is_off());
        assert_eq!(switch.skips(&id(A)), Some(Skip::Off));
        for on in [
            "sparse_volume=off sparse_volume=1",
            "sparse-volume=no sparse_volume",
        ] {
            assert!(!EmergencySwitch::parse(on).is_off(), "{on}");
        }
        assert!(EmergencySwitch::parse("sparse_volume=on \"sparse-volume=0\"").is_off());
    }

    #[test]
    fn a_bad_boolean_is_reported_and_changes_nothing() {
        let switch = EmergencySwitch::parse("sparse_volume=off sparse_volume=maybe");
        assert!(switch.is_off());
        assert_eq!(switch.problems().len(), 1);
        assert!(
            switch.problems()[0].contains("maybe"),
            "{:?}",
            switch.problems()
        );
    }

    #[test]
    fn skip_lists_accumulate_and_compare_canonically() {
        let upper = B.to_uppercase();
        let switch = EmergencySwitch::parse(&format!(
            "sparse_volume.skip={A} sparse-volume.skip='{{{upper}}}',,"
        ));
        assert!(!switch.is_off());
        assert_eq!(switch.skips(&id(A)), Some(Skip::Listed));
        assert_eq!(switch.skips(&id(B)), Some(Skip::Listed));
        assert_eq!(
            switch.skipped().map(|v| v.to_string()).collect::<Vec<_>>(),
            [A, B]
        );
        assert!(switch.problems().is_empty(), "{:?}", switch.problems());
    }

    #[test]
    fn a_bad_uuid_is_reported_and_the_others_apply() {
        let switch = EmergencySwitch::parse(&format!("sparse_volume.skip=nonsense,{A}"));
        assert_eq!(switch.skips(&id(A)), Some(Skip::Listed));
        assert_eq!(switch.skips(&id(B)), None);
        assert_eq!(switch.problems().len(), 1);
        assert!(switch.problems()[0].contains("nonsense"));
    }

    #[test]
    fn similar_keys_are_not_the_switch() {
        let switch = EmergencySwitch::parse(&format!(
            "sparse_volumes=off rd.sparse_volume=off sparse_volume.skipx={A} xsparse_volume.skip={A}"
        ));
        assert_eq!(switch, EmergencySwitch::default());
    }

    #[test]
    fn reads_below_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = SystemRoot::at(dir.path().to_path_buf());
        assert_eq!(EmergencySwitch::read(&root), EmergencySwitch::default());
        std::fs::create_dir(dir.path().join("proc")).unwrap();
        std::fs::write(dir.path().join("proc/cmdline"), "sparse_volume=off\n").unwrap();
        assert_eq!(skip_reason(&root, &id(A)), Some(Skip::Off));
    }

    #[test]
    fn names_the_switch() {
        assert_eq!(
            Skip::Listed.to_string(),
            "sparse_volume.skip= on the kernel command line"
        );
        assert_eq!(Skip::Off.switch(), "sparse_volume=off");
    }
}
