//! A volume's spec: what its backing file holds (a file system of a type,
//! or a GPT for a raw block volume) and the sector size it was made for.
//! One enum each; the registry, the CLI and the engine all use these.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::volume::id::VolumeId;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
        self.kind().name()
    }

    /// `ext4`/`xfs` in filesystem mode, `None` in block mode (as reports
    /// print it).
    pub fn fs_type_name(&self) -> Option<String> {
        match self {
            Mode::Filesystem { fs_type, .. } => Some(fs_type.to_string()),
            Mode::Block => None,
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

/// An encrypted volume's LUKS2 header and the key that opens it
/// unattended (a file only root reads).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encryption {
    /// The header's own UUID: never the volume UUID, which the file
    /// system inside carries.
    pub luks_uuid: Uuid,
    pub key_file: PathBuf,
}

/// A mode without its details, as a command line or a desired state
/// names it (`--mode filesystem|block`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModeKind {
    Filesystem,
    Block,
}

impl ModeKind {
    pub const ALL: [ModeKind; 2] = [ModeKind::Filesystem, ModeKind::Block];

    pub fn name(self) -> &'static str {
        match self {
            ModeKind::Filesystem => "filesystem",
            ModeKind::Block => "block",
        }
    }

    /// Combines the mode with a file system type and mkfs options into a
    /// [`Mode`], refusing contradictions (ext4 is the default).
    pub fn to_mode(
        self,
        fs_type: Option<FsType>,
        mkfs_options: Vec<String>,
    ) -> Result<Mode, String> {
        match self {
            ModeKind::Filesystem => Ok(Mode::Filesystem {
                fs_type: fs_type.unwrap_or(FsType::Ext4),
                mkfs_options,
            }),
            ModeKind::Block if fs_type.is_some() => {
                Err("--fs is only valid with --mode filesystem".into())
            }
            ModeKind::Block if !mkfs_options.is_empty() => {
                Err("--mkfs-option is only valid with --mode filesystem".into())
            }
            ModeKind::Block => Ok(Mode::Block),
        }
    }
}

impl Mode {
    pub fn kind(&self) -> ModeKind {
        match self {
            Mode::Filesystem { .. } => ModeKind::Filesystem,
            Mode::Block => ModeKind::Block,
        }
    }
}

impl FsType {
    pub const ALL: [FsType; 2] = [FsType::Ext4, FsType::Xfs];
}

/// The one reading of a file system type, for the registry, documents on
/// stdin and the command line alike.
impl FromStr for FsType {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "ext4" => Ok(FsType::Ext4),
            "xfs" => Ok(FsType::Xfs),
            other => Err(format!("fs_type {other:?} is not \"ext4\" or \"xfs\"")),
        }
    }
}

/// The one reading of a mode (see [`FsType`]'s).
impl FromStr for ModeKind {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "filesystem" => Ok(ModeKind::Filesystem),
            "block" => Ok(ModeKind::Block),
            other => Err(format!("mode {other:?} is not \"filesystem\" or \"block\"")),
        }
    }
}

/// The sector size of volumes whose file predates the `sector_size` key.
pub const DEFAULT_SECTOR_SIZE: u32 = 512;
pub const SECTOR_SIZES: [u32; 2] = [512, 4096];
