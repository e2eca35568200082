//! The registry: global settings plus one TOML file per volume.
//!
//! Reads never take a lock (writes are atomic renames, so a reader sees a
//! whole file); read-modify-write sequences hold [`Registry::lock`].

mod config;
mod error;
mod volume;

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

pub use config::{Config, Reserve};
pub use error::RegistryError;
pub use volume::{check_path, check_size, FsType, Mode, Volume};

use crate::fsutil::{write_atomically, ExclusiveLock};
use crate::paths::SystemRoot;
use crate::volume_id::VolumeId;

pub struct Registry {
    root: SystemRoot,
    config: Config,
}

/// One registry file and what became of it.
pub struct Entry {
    pub file: PathBuf,
    pub volume: Result<Volume, RegistryError>,
}

impl Registry {
    pub fn open(root: SystemRoot) -> Result<Self, RegistryError> {
        let config = Config::load(&root.config_file())?;
        Ok(Self { root, config })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn root(&self) -> &SystemRoot {
        &self.root
    }

    /// Every `*.toml` in `volumes.d`, sorted by name, each parsed on its
    /// own so that one bad file never hides the others.
    pub fn entries(&self) -> Result<Vec<Entry>> {
        let dir = self.root.volumes_dir();
        let listing = match fs::read_dir(&dir) {
            Ok(listing) => listing,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
        };
        let mut files = Vec::new();
        for item in listing {
            let item = item.with_context(|| format!("reading {}", dir.display()))?;
            let name = item.file_name();
            let name = name.to_string_lossy();
            // Dot files are temporaries of interrupted atomic writes.
            if name.ends_with(".toml") && !name.starts_with('.') {
                files.push(item.path());
            }
        }
        files.sort();
        Ok(files
            .into_iter()
            .map(|file| {
                let volume = self.read_file(&file);
                Entry { file, volume }
            })
            .collect())
    }

    /// The volume registered under `id`, `Ok(None)` if there is none.
    pub fn get(&self, id: &VolumeId) -> Result<Option<Volume>, RegistryError> {
        let file = self.root.volume_file(id);
        if !file.exists() {
            return Ok(None);
        }
        self.read_file(&file).map(Some)
    }

    /// The volume registered under `id`; its absence is an error that
    /// names the file that would have to exist.
    pub fn require(&self, id: &VolumeId) -> Result<Volume> {
        self.get(id)?.with_context(|| {
            format!(
                "the volume is not registered (no {})",
                self.root.volume_file(id).display()
            )
        })
    }

    fn read_file(&self, file: &Path) -> Result<Volume, RegistryError> {
        let text = fs::read_to_string(file)
            .map_err(|e| RegistryError::new(file, None, format!("cannot be read: {e}")))?;
        Volume::parse(file, &text, &self.config)
    }

    /// Writes (creates or replaces) a volume's file atomically.
    pub fn put(&self, volume: &Volume) -> Result<()> {
        let dir = self.root.volumes_dir();
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        write_atomically(
            &self.root.volume_file(&volume.id),
            volume.to_toml().as_bytes(),
            0o644,
        )
    }

    /// Serialises registry read-modify-write and capacity decisions.
    pub fn lock(&self) -> Result<ExclusiveLock> {
        ExclusiveLock::acquire(&self.root.run_dir().join("registry.lock"))
    }

    /// Serialises device work (attach/detach) on one volume.
    pub fn volume_lock(root: &SystemRoot, id: &VolumeId) -> Result<ExclusiveLock> {
        ExclusiveLock::acquire(&root.run_dir().join(format!("{id}.lock")))
    }
}
