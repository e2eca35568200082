//! One volume's registry file: `/etc/sparse-volume/volumes.d/<UUID>.toml`.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use toml::Spanned;

use super::config::Config;
use super::error::RegistryError;
use crate::paths::is_normal_absolute;
use crate::volume_id::VolumeId;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum FsType {
    Ext4,
    Xfs,
}

impl fmt::Display for FsType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FsType::Ext4 => "ext4",
            FsType::Xfs => "xfs",
        })
    }
}

/// What the backing file holds, and so how the volume is identified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// A file system whose UUID is the volume UUID (`/dev/disk/by-uuid`).
    Filesystem {
        fs_type: FsType,
        mkfs_options: Vec<String>,
    },
    /// A GPT whose first partition's unique GUID is the volume UUID
    /// (`/dev/disk/by-partuuid`), with no file system.
    Block,
}

impl Mode {
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Filesystem { .. } => "filesystem",
            Mode::Block => "block",
        }
    }

    pub fn is_block(&self) -> bool {
        matches!(self, Mode::Block)
    }

    /// The udev link consumers use to find this volume's device.
    pub fn udev_link(&self, id: &VolumeId) -> PathBuf {
        match self {
            Mode::Filesystem { .. } => PathBuf::from(format!("/dev/disk/by-uuid/{id}")),
            Mode::Block => PathBuf::from(format!("/dev/disk/by-partuuid/{id}")),
        }
    }
}

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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ModeName {
    Filesystem,
    Block,
}

/// The file as written by operators and by us; validated into [`Volume`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VolumeFile {
    uuid: Spanned<String>,
    path: Spanned<String>,
    size: Spanned<i64>,
    mode: ModeName,
    fs_type: Option<Spanned<FsType>>,
    enabled: Option<bool>,
    read_only: Option<bool>,
    direct_io: Option<bool>,
    preallocated: Option<bool>,
    name: Option<Spanned<String>>,
    mkfs_options: Option<Spanned<Vec<String>>>,
}

/// What we write: every field explicit, so the file reads as the truth.
#[derive(Serialize)]
struct VolumeFileOut<'a> {
    uuid: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    path: &'a Path,
    size: u64,
    mode: ModeName,
    #[serde(skip_serializing_if = "Option::is_none")]
    fs_type: Option<FsType>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mkfs_options: Option<&'a [String]>,
    enabled: bool,
    read_only: bool,
    direct_io: bool,
    preallocated: bool,
}

impl Volume {
    /// Parses and validates the text of `file` (its logical name is used for
    /// the file-name/uuid check and for messages).
    pub fn parse(file: &Path, text: &str, config: &Config) -> Result<Self, RegistryError> {
        let raw: VolumeFile =
            toml::from_str(text).map_err(|e| RegistryError::from_toml(file, text, &e))?;
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

        let path = PathBuf::from(raw.path.get_ref());
        check_path(&path, config).map_err(|reason| fail(raw.path.span(), reason))?;
        let size = u64::try_from(*raw.size.get_ref()).map_err(|_| {
            fail(
                raw.size.span(),
                format!("size {} must be positive", raw.size.get_ref()),
            )
        })?;
        check_size(size).map_err(|reason| fail(raw.size.span(), reason))?;

        let mode = match raw.mode {
            ModeName::Filesystem => Mode::Filesystem {
                fs_type: raw.fs_type.map_or(FsType::Ext4, Spanned::into_inner),
                mkfs_options: raw
                    .mkfs_options
                    .map(Spanned::into_inner)
                    .unwrap_or_default(),
            },
            ModeName::Block => {
                if let Some(fs_type) = raw.fs_type {
                    return Err(fail(
                        fs_type.span(),
                        "fs_type is only valid for mode = \"filesystem\"".into(),
                    ));
                }
                if let Some(options) = raw.mkfs_options {
                    return Err(fail(
                        options.span(),
                        "mkfs_options is only valid for mode = \"filesystem\"".into(),
                    ));
                }
                Mode::Block
            }
        };

        let name = match raw.name {
            Some(name) if name.get_ref().chars().any(char::is_control) => {
                return Err(fail(
                    name.span(),
                    "name must not contain control characters".into(),
                ));
            }
            other => other.map(Spanned::into_inner),
        };

        Ok(Volume {
            id,
            path,
            size,
            mode,
            enabled: raw.enabled.unwrap_or(true),
            read_only: raw.read_only.unwrap_or(false),
            direct_io: raw.direct_io.unwrap_or(config.direct_io),
            preallocated: raw.preallocated.unwrap_or(false),
            name,
        })
    }

    pub fn to_toml(&self) -> String {
        let (mode, fs_type, mkfs_options) = match &self.mode {
            Mode::Filesystem {
                fs_type,
                mkfs_options,
            } => (
                ModeName::Filesystem,
                Some(*fs_type),
                Some(mkfs_options.as_slice()).filter(|o| !o.is_empty()),
            ),
            Mode::Block => (ModeName::Block, None, None),
        };
        let out = VolumeFileOut {
            uuid: self.id.to_string(),
            name: self.name.as_deref(),
            path: &self.path,
            size: self.size,
            mode,
            fs_type,
            mkfs_options,
            enabled: self.enabled,
            read_only: self.read_only,
            direct_io: self.direct_io,
            preallocated: self.preallocated,
        };
        // Serialising plain strings, integers and booleans cannot fail.
        toml::to_string(&out).unwrap_or_else(|e| unreachable!("volume serialisation: {e}"))
    }
}

/// A backing file path must be a normalised absolute path inside a
/// storage root: that is what keeps `check` and the capacity accounting
/// from missing a volume.
pub fn check_path(path: &Path, config: &Config) -> Result<(), String> {
    if !is_normal_absolute(path) {
        return Err(format!(
            "path \"{}\" must be a normalised absolute path",
            path.display()
        ));
    }
    // Such a path cannot be written into a unit file (RequiresMountsFor=).
    if path.to_string_lossy().chars().any(char::is_control) {
        return Err(format!("path {path:?} must not contain control characters"));
    }
    if config.storage_root_of(path).is_none() {
        let roots: Vec<_> = config
            .storage_roots
            .iter()
            .map(|r| r.display().to_string())
            .collect();
        return Err(format!(
            "path {} is not inside a storage root ({})",
            path.display(),
            roots.join(", ")
        ));
    }
    Ok(())
}

/// Loop devices and partition tables work in 512-byte sectors.
pub fn check_size(size: u64) -> Result<(), String> {
    if size == 0 || !size.is_multiple_of(512) {
        return Err(format!(
            "size {size} must be a positive multiple of 512 bytes"
        ));
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
        Volume::parse(&file(), text, &Config::default())
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
    }

    #[test]
    fn round_trips_through_toml() {
        let volume = parse(&minimal("fs_type = \"xfs\"\nname = \"db data\"\nread_only = true\npreallocated = true\nmkfs_options = [\"-m\", \"crc=1\"]\n")).unwrap();
        assert!(volume.preallocated);
        assert_eq!(parse(&volume.to_toml()).unwrap(), volume);
        let block = parse(&minimal("").replace("filesystem", "block")).unwrap();
        assert_eq!(block.mode, Mode::Block);
        assert_eq!(parse(&block.to_toml()).unwrap(), block);
    }

    #[test]
    fn rejects_with_file_line_and_reason() {
        let cases = [
            (
                minimal("").replace(ID, "6F1C2A8E-3B4D-4E5F-8A9B-0C1D2E3F4A5B"),
                1,
                "canonical",
            ),
            (
                minimal("").replace("/var/lib/sparse-volume", "/home/x"),
                2,
                "storage root",
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
                "unknown variant",
            ),
            (minimal("colour = 1\n"), 5, "unknown field"),
            (minimal("fs_type = \"btrfs\"\n"), 5, "unknown variant"),
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
    fn file_name_must_match_uuid() {
        let other =
            Path::new("/etc/sparse-volume/volumes.d/0e2f7c5a-1111-4222-8333-444455556666.toml");
        let err = Volume::parse(other, &minimal(""), &Config::default()).unwrap_err();
        assert!(err.reason.contains("does not match the file name"), "{err}");
    }
}
