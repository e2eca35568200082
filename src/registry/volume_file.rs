//! One volume's registry file: `/etc/sparse-volume/volumes.d/<UUID>.toml`.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use toml::Spanned;

use super::config::Config;
use super::error::RegistryError;
use super::lenient::{from_toml, RegistryWarning};
use crate::kernel::dm_crypt::mapper_path;
use crate::registry::paths::is_normal_absolute;
use crate::volume::creating_mark::CREATING_SUFFIX;
use crate::volume::id::VolumeId;
use crate::volume::luks::mapping_name;
use crate::volume::probe::Identity;
use crate::volume::spec::{Encryption, FsType, Mode, ModeKind, DEFAULT_SECTOR_SIZE, SECTOR_SIZES};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    pub id: VolumeId,
    /// Logical path of the backing file (see `paths::SystemRoot`).
    pub path: PathBuf,
    pub size: u64,
    pub mode: Mode,
    pub enabled: bool,
    pub read_only: bool,
    pub direct_io: bool,
    /// Space was reserved with fallocate: the volume cannot grow into free
    /// space any more, and a resize must reserve the new range too.
    pub preallocated: bool,
    pub name: Option<String>,
    /// The logical sector size the volume's GPT or file system was made
    /// for; always passed to the kernel, never left to its default.
    pub sector_size: u32,
    /// The volume this one was cloned from (its content at one instant,
    /// under an identity of its own); None for a volume made otherwise.
    pub origin: Option<VolumeId>,
    /// The unit that attached this backing file before sparse-volume took
    /// it over (`register --replaces-unit`): the generator masks it at
    /// every boot, so it never binds a second loop device for the file nor
    /// detaches ours under its consumers.
    pub replaces_unit: Option<String>,
    /// LUKS2 inside the backing file, and how it unlocks; None for a
    /// volume whose backing file holds its content in the clear.
    pub encryption: Option<Encryption>,
}

/// `mode` and `fs_type` are read as strings and matched by the spec's
/// own parsers: serde's enum errors say "wanted string or table" for
/// `mode = 1`, which names neither the key nor the choices.
fn mode_name(value: &str) -> Result<ModeKind, String> {
    value.parse()
}

fn fs_type_name(value: &str) -> Result<FsType, String> {
    value.parse()
}

/// The file as written by operators and by us; validated into [`Volume`].
/// Unknown keys are warnings (see `lenient`), so no `deny_unknown_fields`.
#[derive(Deserialize)]
struct VolumeFile {
    uuid: Spanned<String>,
    path: Spanned<String>,
    size: Spanned<i64>,
    mode: Spanned<String>,
    fs_type: Option<Spanned<String>>,
    enabled: Option<bool>,
    read_only: Option<bool>,
    direct_io: Option<bool>,
    preallocated: Option<bool>,
    name: Option<Spanned<String>>,
    mkfs_options: Option<Spanned<Vec<String>>>,
    sector_size: Option<Spanned<i64>>,
    origin: Option<Spanned<String>>,
    replaces_unit: Option<Spanned<String>>,
    luks_uuid: Option<Spanned<String>>,
    key_file: Option<Spanned<String>>,
}

pub const KNOWN_KEYS: &[&str] = &[
    "uuid",
    "path",
    "size",
    "mode",
    "fs_type",
    "enabled",
    "read_only",
    "direct_io",
    "preallocated",
    "name",
    "mkfs_options",
    "sector_size",
    "origin",
    "replaces_unit",
    "luks_uuid",
    "key_file",
];

/// What we write: every field explicit, so the file reads as the truth.
#[derive(Serialize)]
struct VolumeFileOut<'a> {
    uuid: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    path: &'a str,
    size: u64,
    mode: ModeKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    fs_type: Option<FsType>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mkfs_options: Option<&'a [String]>,
    /// Left out at the old default, so that an older version (which
    /// refused unknown keys) still reads what this one writes.
    #[serde(skip_serializing_if = "is_default_sector_size")]
    sector_size: u32,
    enabled: bool,
    read_only: bool,
    direct_io: bool,
    preallocated: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    origin: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    replaces_unit: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    luks_uuid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key_file: Option<&'a str>,
}

fn is_default_sector_size(size: &u32) -> bool {
    *size == DEFAULT_SECTOR_SIZE
}

/// A rule a volume breaks, and the registry key it is about (so that a
/// parse error can point at the line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub key: &'static str,
    pub reason: String,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for Invalid {}

fn invalid(key: &'static str, reason: String) -> Invalid {
    Invalid { key, reason }
}

/// A parsed volume file: the volume, and the keys that were ignored.
pub struct Parsed {
    pub volume: Volume,
    pub warnings: Vec<RegistryWarning>,
}

impl Volume {
    /// Parses and validates the text of `file` (its logical name is used for
    /// the file-name/uuid check and for messages). Unknown keys are ignored
    /// and reported in [`Parsed::warnings`].
    pub fn parse(file: &Path, text: &str, config: &Config) -> Result<Parsed, RegistryError> {
        let (raw, warnings): (VolumeFile, _) = from_toml(file, text, KNOWN_KEYS)?;
        let fail = |span: std::ops::Range<usize>, reason: String| {
            RegistryError::at(file, text, Some(span), reason)
        };

        let id: VolumeId = raw
            .uuid
            .get_ref()
            .parse()
            .map_err(|reason| fail(raw.uuid.span(), format!("uuid: {reason}")))?;
        let expected_name = format!("{id}.toml");
        if file.file_name().and_then(|n| n.to_str()) != Some(expected_name.as_str()) {
            return Err(fail(
                raw.uuid.span(),
                format!("uuid {id} does not match the file name (expected {expected_name})"),
            ));
        }
        let size = u64::try_from(*raw.size.get_ref()).map_err(|_| {
            fail(
                raw.size.span(),
                format!("size {} must be positive", raw.size.get_ref()),
            )
        })?;
        let sector_size = match &raw.sector_size {
            None => DEFAULT_SECTOR_SIZE,
            Some(value) => u32::try_from(*value.get_ref())
                .ok()
                .filter(|s| SECTOR_SIZES.contains(s))
                .ok_or_else(|| {
                    fail(
                        value.span(),
                        format!("sector_size {} must be 512 or 4096", value.get_ref()),
                    )
                })?,
        };

        let origin = match &raw.origin {
            None => None,
            Some(value) => Some(
                value
                    .get_ref()
                    .parse::<VolumeId>()
                    .map_err(|reason| fail(value.span(), format!("origin: {reason}")))?,
            ),
        };

        let mode_name =
            mode_name(raw.mode.get_ref()).map_err(|reason| fail(raw.mode.span(), reason))?;
        let fs_type = match &raw.fs_type {
            None => FsType::Ext4,
            Some(value) => {
                fs_type_name(value.get_ref()).map_err(|reason| fail(value.span(), reason))?
            }
        };
        let mode = match mode_name {
            ModeKind::Filesystem => Mode::Filesystem {
                fs_type,
                mkfs_options: raw
                    .mkfs_options
                    .as_ref()
                    .map(|o| o.get_ref().clone())
                    .unwrap_or_default(),
            },
            ModeKind::Block => {
                if let Some(fs_type) = &raw.fs_type {
                    return Err(fail(
                        fs_type.span(),
                        "fs_type is only valid for mode = \"filesystem\"".into(),
                    ));
                }
                if let Some(options) = &raw.mkfs_options {
                    return Err(fail(
                        options.span(),
                        "mkfs_options is only valid for mode = \"filesystem\"".into(),
                    ));
                }
                Mode::Block
            }
        };

        let encryption = match (&raw.luks_uuid, &raw.key_file) {
            (None, None) => None,
            (Some(luks_uuid), Some(key_file)) => Some(Encryption {
                luks_uuid: luks_uuid
                    .get_ref()
                    .parse()
                    .map_err(|e| fail(luks_uuid.span(), format!("luks_uuid: {e}")))?,
                key_file: PathBuf::from(key_file.get_ref()),
            }),
            (Some(luks_uuid), None) => {
                return Err(fail(
                    luks_uuid.span(),
                    "luks_uuid needs key_file (the key that unlocks the volume at boot)".into(),
                ))
            }
            (None, Some(key_file)) => {
                return Err(fail(
                    key_file.span(),
                    "key_file needs luks_uuid (the UUID of the volume's LUKS2 header)".into(),
                ))
            }
        };

        let volume = Volume {
            id,
            path: PathBuf::from(raw.path.get_ref()),
            size,
            mode,
            enabled: raw.enabled.unwrap_or(true),
            read_only: raw.read_only.unwrap_or(false),
            direct_io: raw.direct_io.unwrap_or(config.direct_io),
            preallocated: raw.preallocated.unwrap_or(false),
            name: raw.name.as_ref().map(|n| n.get_ref().clone()),
            sector_size,
            origin,
            replaces_unit: raw.replaces_unit.as_ref().map(|u| u.get_ref().clone()),
            encryption,
        };
        volume.validate().map_err(|Invalid { key, reason }| {
            let span = match key {
                "path" => Some(raw.path.span()),
                "size" => Some(raw.size.span()),
                "name" => raw.name.as_ref().map(Spanned::span),
                "mkfs_options" => raw.mkfs_options.as_ref().map(Spanned::span),
                "sector_size" => raw.sector_size.as_ref().map(Spanned::span),
                "origin" => raw.origin.as_ref().map(Spanned::span),
                "replaces_unit" => raw.replaces_unit.as_ref().map(Spanned::span),
                "luks_uuid" => raw.luks_uuid.as_ref().map(Spanned::span),
                "key_file" => raw.key_file.as_ref().map(Spanned::span),
                _ => Some(raw.uuid.span()),
            };
            RegistryError::at(file, text, span, reason)
        })?;
        Ok(Parsed { volume, warnings })
    }

    /// The rules every registered volume obeys. The parser applies them to
    /// every file it reads, and `create`/`register` to what they are about
    /// to write: nothing the CLI accepts can make an unreadable entry.
    pub fn validate(&self) -> Result<(), Invalid> {
        check_volume_path(&self.path).map_err(|r| invalid("path", r))?;
        if !SECTOR_SIZES.contains(&self.sector_size) {
            return Err(invalid(
                "sector_size",
                format!("sector_size {} must be 512 or 4096", self.sector_size),
            ));
        }
        check_size(self.size).map_err(|r| invalid("size", r))?;
        if !self.size.is_multiple_of(u64::from(self.sector_size)) {
            return Err(invalid(
                "size",
                format!(
                    "size {} must be a multiple of the sector size {}",
                    self.size, self.sector_size
                ),
            ));
        }
        if let Some(name) = &self.name {
            Self::check_name(name).map_err(|r| invalid("name", r))?;
        }
        if self.origin == Some(self.id) {
            return Err(invalid(
                "origin",
                "origin names the volume itself; a clone's origin is the volume it was cloned from"
                    .into(),
            ));
        }
        if let Some(unit) = &self.replaces_unit {
            check_replaced_unit(unit).map_err(|r| invalid("replaces_unit", r))?;
        }
        if let Mode::Filesystem { mkfs_options, .. } = &self.mode {
            for option in mkfs_options {
                Self::check_mkfs_option(option).map_err(|r| invalid("mkfs_options", r))?;
            }
        }
        if let Some(encryption) = &self.encryption {
            self.check_encryption(encryption)?;
        }
        Ok(())
    }

    /// The path consumers find the volume's device by: udev's link for
    /// its mode, or an encrypted block volume's opened device (its
    /// partition's links name the ciphertext; dm-crypt devices have no
    /// partition UUID of their own, and the mapping's name is stable).
    pub fn consumer_path(&self) -> PathBuf {
        match (&self.mode, &self.encryption) {
            (Mode::Block, Some(_)) => mapper_path(&mapping_name(&self.id)),
            _ => self.mode.udev_link(&self.id),
        }
    }

    /// What the volume's backing file holds when it is this volume.
    pub fn identity(&self) -> Identity<'_> {
        Identity {
            mode: &self.mode,
            uuid: self.id.uuid(),
            luks_uuid: self.encryption.as_ref().map(|e| e.luks_uuid),
        }
    }

    fn check_encryption(&self, encryption: &Encryption) -> Result<(), Invalid> {
        if encryption.luks_uuid == self.id.uuid() {
            // Two by-uuid links of one name would fight over which device
            // consumers get.
            return Err(invalid(
                "luks_uuid",
                "luks_uuid must differ from the volume's uuid (the file system inside carries that)"
                    .into(),
            ));
        }
        check_volume_path(&encryption.key_file)
            .map_err(|r| invalid("key_file", r.replacen("path", "key_file", 1)))
    }

    /// The rules for a volume's free-text label.
    fn check_name(name: &str) -> Result<(), String> {
        if name.chars().any(char::is_control) {
            return Err("name must not contain control characters".into());
        }
        let length = name.chars().count();
        if length > MAX_NAME_CHARS {
            return Err(format!(
                "name is {length} characters long; at most {MAX_NAME_CHARS} are allowed"
            ));
        }
        Ok(())
    }

    /// The rules for one extra `mkfs` argument.
    fn check_mkfs_option(option: &str) -> Result<(), String> {
        if option.chars().any(char::is_control) {
            return Err("mkfs_options must not contain control characters".into());
        }
        Ok(())
    }

    pub fn to_toml(&self) -> Result<String, Invalid> {
        self.validate()?;
        let (mode, fs_type, mkfs_options) = match &self.mode {
            Mode::Filesystem {
                fs_type,
                mkfs_options,
            } => (
                ModeKind::Filesystem,
                Some(*fs_type),
                Some(mkfs_options.as_slice()).filter(|o| !o.is_empty()),
            ),
            Mode::Block => (ModeKind::Block, None, None),
        };
        let path = self.path.to_str().ok_or_else(|| {
            invalid(
                "path",
                format!("path {:?} is not valid UTF-8", self.path.display()),
            )
        })?;
        let out = VolumeFileOut {
            uuid: self.id.to_string(),
            name: self.name.as_deref(),
            path,
            size: self.size,
            mode,
            fs_type,
            mkfs_options,
            sector_size: self.sector_size,
            enabled: self.enabled,
            read_only: self.read_only,
            direct_io: self.direct_io,
            preallocated: self.preallocated,
            origin: self.origin.map(|o| o.to_string()),
            replaces_unit: self.replaces_unit.as_deref(),
            luks_uuid: self.encryption.as_ref().map(|e| e.luks_uuid.to_string()),
            key_file: self.encryption.as_ref().and_then(|e| e.key_file.to_str()),
        };
        toml::to_string(&out).map_err(|e| invalid("uuid", format!("cannot be written: {e}")))
    }
}

/// systemd's limit on a unit name (`UNIT_NAME_MAX`).
const UNIT_NAME_MAX: usize = 255;

/// The rules for a unit another tool used to attach a volume with, which
/// the generator masks once sparse-volume owns the volume: a service
/// instance or plain service (a template would mask every instance), in
/// systemd's unit-name alphabet, and never one of sparse-volume's own.
pub fn check_replaced_unit(name: &str) -> Result<(), String> {
    let Some(stem) = name.strip_suffix(".service") else {
        return Err(format!(
            "replaces_unit {name:?} must name a service (NAME.service)"
        ));
    };
    if name.len() > UNIT_NAME_MAX {
        return Err(format!(
            "replaces_unit is {} bytes long; a unit name has at most {UNIT_NAME_MAX}",
            name.len()
        ));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || ":-_.\\".contains(c);
    let (prefix, instance) = match stem.split_once('@') {
        Some((prefix, instance)) => (prefix, Some(instance)),
        None => (stem, None),
    };
    if prefix.is_empty()
        || !prefix.chars().all(allowed)
        || instance.is_some_and(|i| !i.chars().all(|c| allowed(c) || c == '@'))
    {
        return Err(format!("replaces_unit {name:?} is not a valid unit name"));
    }
    if instance == Some("") {
        return Err(format!(
            "replaces_unit {name:?} is a template; name the instance that attached this volume ({prefix}@<instance>.service)"
        ));
    }
    // sparse-volume@, sparse-volume-metrics, ...: masking one of ours
    // would take volumes or their upkeep away.
    if prefix.starts_with("sparse-volume") {
        return Err(format!(
            "replaces_unit {name:?} is one of sparse-volume's own units"
        ));
    }
    Ok(())
}

/// The shape of a backing file path, whatever the configuration says: a
/// normalised absolute UTF-8 path (it is written into TOML and unit files).
pub fn check_volume_path(path: &Path) -> Result<(), String> {
    let Some(text) = path.to_str() else {
        return Err(format!(
            "path {:?} is not valid UTF-8",
            path.to_string_lossy()
        ));
    };
    // Quoted with escapes: the path may hold a newline, the message may not.
    if !is_normal_absolute(path) || path == Path::new("/") {
        return Err(format!("path {text:?} must be a normalised absolute path"));
    }
    if text.len() > MAX_PATH_BYTES {
        return Err(format!(
            "path is {} bytes long; at most {MAX_PATH_BYTES} are allowed",
            text.len()
        ));
    }
    // Such a path cannot be written into a unit file (RequiresMountsFor=).
    if text.chars().any(char::is_control) {
        return Err(format!("path {text:?} must not contain control characters"));
    }
    Ok(())
}

/// The kernel's `PATH_MAX` less the terminating NUL: a longer path
/// cannot be opened.
const MAX_PATH_BYTES: usize = 4095;

/// A label is shown in `list` tables and journal lines: one short line.
const MAX_NAME_CHARS: usize = 255;

/// Where `create` and `register` may put or adopt a file: inside a storage
/// root, which keeps `check` and the capacity accounting from missing a
/// volume. Not a rule of the registry: a registered volume attaches even
/// after `config.toml` changed or went away.
///
/// Hidden and `.creating` names are refused here too: they are `create`'s
/// temporaries. Not a parse error, so that an entry written before this
/// rule keeps attaching.
pub fn check_path(path: &Path, config: &Config) -> Result<(), String> {
    check_volume_path(path)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name.starts_with('.') || name.ends_with(CREATING_SUFFIX) {
        return Err(format!(
            "path \"{}\": names starting with \".\" or ending in \"{CREATING_SUFFIX}\" are reserved for temporary files",
            path.display()
        ));
    }
    if config.storage_root_of(path).is_none() {
        let roots: Vec<_> = config
            .storage_roots
            .iter()
            .map(|r| r.display().to_string())
            .collect();
        return Err(format!(
            "path {} is not inside a storage root ({}); storage_roots in /etc/sparse-volume/config.toml lists them",
            path.display(),
            roots.join(", ")
        ));
    }
    Ok(())
}

/// Loop devices and partition tables work in 512-byte sectors at least;
/// the registry stores sizes as TOML integers (i64).
pub fn check_size(size: u64) -> Result<(), String> {
    if size == 0 || !size.is_multiple_of(512) {
        return Err(format!(
            "size {size} must be a positive multiple of 512 bytes"
        ));
    }
    if i64::try_from(size).is_err() {
        return Err(format!("size {size} is too large"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b";

    fn file() -> PathBuf {
        PathBuf::from(format!("/etc/sparse-volume/volumes.d/{ID}.toml"))
    }

    fn parse(text: &str) -> Result<Volume, RegistryError> {
        Volume::parse(&file(), text, &Config::default()).map(|parsed| parsed.volume)
    }

    fn minimal(extra: &str) -> String {
        format!("uuid = \"{ID}\"\npath = \"/var/lib/sparse-volume/{ID}\"\nsize = 1048576\nmode = \"filesystem\"\n{extra}")
    }

    #[test]
    fn minimal_file_gets_defaults() {
        let volume = parse(&minimal("")).unwrap();
        assert_eq!(volume.id.to_string(), ID);
        assert_eq!(
            volume.mode,
            Mode::Filesystem {
                fs_type: FsType::Ext4,
                mkfs_options: vec![]
            }
        );
        assert!(volume.enabled && !volume.read_only && volume.direct_io);
        assert_eq!(volume.sector_size, 512);
    }

    #[test]
    fn round_trips_through_toml() {
        let volume = parse(&minimal("fs_type = \"xfs\"\nname = \"db data\"\nread_only = true\npreallocated = true\nmkfs_options = [\"-m\", \"crc=1\"]\n")).unwrap();
        assert!(volume.preallocated);
        assert_eq!(parse(&volume.to_toml().unwrap()).unwrap(), volume);
        let block = parse(&minimal("sector_size = 4096\n").replace("filesystem", "block")).unwrap();
        assert_eq!(block.mode, Mode::Block);
        assert_eq!(block.sector_size, 4096);
        assert_eq!(parse(&block.to_toml().unwrap()).unwrap(), block);
    }

    #[test]
    fn rejects_with_file_line_and_reason() {
        let cases = [
            (
                minimal("").replace(ID, "6F1C2A8E-3B4D-4E5F-8A9B-0C1D2E3F4A5B"),
                1,
                "canonical",
            ),
            (minimal("sector_size = 1024\n"), 5, "512 or 4096"),
            (
                minimal("sector_size = 4096\n").replace("1048576", "1049088"),
                3,
                "multiple of the sector size",
            ),
            (
                minimal("").replace("/var/lib/sparse-volume", "/var/lib/sparse-volume/../../etc"),
                2,
                "normalised",
            ),
            (minimal("").replace("1048576", "1000"), 3, "multiple of 512"),
            (
                minimal("").replace("sparse-volume/", "sparse-volume/a\\tb/"),
                2,
                "control characters",
            ),
            (minimal("").replace("1048576", "0"), 3, "positive"),
            (minimal("").replace("1048576", "-512"), 3, "positive"),
            (
                minimal("").replace("\"filesystem\"", "\"raw\""),
                4,
                "is not \"filesystem\" or \"block\"",
            ),
            (
                minimal("").replace("\"filesystem\"", "1"),
                4,
                "expected a string",
            ),
            (
                minimal("fs_type = \"btrfs\"\n"),
                5,
                "is not \"ext4\" or \"xfs\"",
            ),
            (
                minimal("fs_type = \"EXT4\"\n"),
                5,
                "is not \"ext4\" or \"xfs\"",
            ),
            (
                minimal("fs_type = \"ext4\"\n").replace("\"filesystem\"", "\"block\""),
                5,
                "only valid",
            ),
            (minimal("name = \"a\\nb\"\n"), 5, "control"),
            ("uuid = \"x\"\nsize = [".to_string(), 2, ""),
        ];
        for (text, line, reason) in cases {
            let err = parse(&text).expect_err(&text);
            assert_eq!(err.line, Some(line), "{err}");
            assert!(err.reason.contains(reason), "{err} lacks {reason}");
            assert!(
                err.to_string()
                    .starts_with(&format!("{}:{line}: ", file().display())),
                "{err}"
            );
        }
    }

    #[test]
    fn names_and_paths_fit_on_a_line() {
        let long_name = minimal(&format!("name = \"{}\"\n", "n".repeat(MAX_NAME_CHARS + 1)));
        let err = parse(&long_name).unwrap_err();
        assert_eq!(err.line, Some(5));
        assert!(err.reason.contains("at most 255"), "{err}");
        assert!(parse(&minimal(&format!(
            "name = \"{}\"\n",
            "é".repeat(MAX_NAME_CHARS)
        )))
        .is_ok());
        let long_path = format!("/var/lib/sparse-volume/{}", "p/".repeat(2100));
        let text = minimal("").replace(
            &format!("/var/lib/sparse-volume/{ID}"),
            long_path.trim_end_matches('/'),
        );
        assert!(parse(&text).unwrap_err().reason.contains("at most 4095"));
        let err =
            parse(&minimal("").replace(&format!("\"/var/lib/sparse-volume/{ID}\""), "\"a\\nb\""))
                .unwrap_err();
        assert!(!err.to_string().contains('\n'), "{err}");
    }

    #[test]
    fn file_name_must_match_uuid() {
        let other =
            Path::new("/etc/sparse-volume/volumes.d/0e2f7c5a-1111-4222-8333-444455556666.toml");
        let err = Volume::parse(other, &minimal(""), &Config::default())
            .err()
            .unwrap();
        assert!(err.reason.contains("does not match the file name"), "{err}");
    }

    #[test]
    fn unknown_keys_are_warnings_and_the_volume_is_kept() {
        let parsed = Volume::parse(
            &file(),
            &minimal("colour = 1\nsector_sise = 4096\n"),
            &Config::default(),
        )
        .unwrap();
        assert_eq!(parsed.volume.id.to_string(), ID);
        let shown: Vec<String> = parsed.warnings.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                format!("{}:5: unknown key \"colour\"; ignored", file().display()),
                format!(
                    "{}:6: unknown key \"sector_sise\" (did you mean \"sector_size\"?); ignored",
                    file().display()
                ),
            ]
        );
    }

    #[test]
    fn temporary_names_are_refused_for_new_volumes_but_old_entries_read() {
        let volume = parse(&minimal("").replace(&format!("/{ID}\""), "/.hidden\"")).unwrap();
        assert!(check_path(&volume.path, &Config::default())
            .unwrap_err()
            .contains("reserved"));
        let path = PathBuf::from("/var/lib/sparse-volume/b.creating");
        assert!(check_path(&path, &Config::default()).is_err());
    }

    #[test]
    fn a_path_outside_every_storage_root_still_reads() {
        // Containment is for create and register; a registered volume
        // must not vanish because config.toml changed or was purged.
        let volume =
            parse(&minimal("").replace("/var/lib/sparse-volume", "/srv/elsewhere")).unwrap();
        assert!(check_path(&volume.path, &Config::default()).is_err());
    }

    #[test]
    fn what_cannot_be_read_back_cannot_be_written() {
        use std::os::unix::ffi::OsStrExt;
        let mut volume = parse(&minimal("")).unwrap();
        volume.name = Some("a\tb".into());
        assert_eq!(volume.to_toml().unwrap_err().key, "name");
        volume.name = None;
        volume.path = PathBuf::from(std::ffi::OsStr::from_bytes(b"/var/lib/sparse-volume/\xff"));
        assert!(volume.to_toml().unwrap_err().reason.contains("UTF-8"));
        volume.path = PathBuf::from("/var/lib/sparse-volume/x");
        volume.size = u64::MAX - 511;
        assert!(volume.to_toml().unwrap_err().reason.contains("too large"));
    }

    #[test]
    fn a_replaced_unit_is_a_foreign_service_instance_or_service() {
        for good in [
            "metalk8s-sparse-volume@6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b.service",
            "loop-data.service",
            "attach@var-lib-x\\x2dy.service",
        ] {
            assert_eq!(check_replaced_unit(good), Ok(()), "{good}");
        }
        for (bad, says) in [
            ("metalk8s-sparse-volume@.service", "is a template"),
            ("loop-data.mount", "must name a service"),
            ("loop data.service", "not a valid unit name"),
            ("../x.service", "not a valid unit name"),
            ("@x.service", "not a valid unit name"),
            (
                "sparse-volume@6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b.service",
                "own units",
            ),
            ("sparse-volume-metrics.service", "own units"),
        ] {
            let said = check_replaced_unit(bad).expect_err(bad);
            assert!(said.contains(says), "{bad}: {said}");
        }
        let long = format!("{}.service", "a".repeat(250));
        assert!(check_replaced_unit(&long)
            .unwrap_err()
            .contains("at most 255"));
    }
}
