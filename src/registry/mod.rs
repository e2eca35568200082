//! The registry: global settings plus one TOML file per volume.
//!
//! Reads never take a lock (writes are atomic renames, so a reader sees a
//! whole file); read-modify-write sequences hold [`Registry::lock`].

mod config;
pub mod device_note;
mod error;
pub mod io_base;
mod lenient;
mod lookup;
pub mod paths;
pub mod run_dir;
mod trust;
mod volume_file;

use std::fs::{self, File};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

pub use config::{Config, Reserve, KNOWN_KEYS as CONFIG_KEYS};
pub use error::{NoSuchVolume, RegistryError};
pub use lenient::RegistryWarning;
pub use volume_file::{
    check_path, check_replaced_unit, check_size, check_volume_path, Invalid, Parsed, Volume,
    KNOWN_KEYS as VOLUME_KEYS,
};

use crate::kernel::files::{write_atomically, ExclusiveLock};
use crate::registry::paths::{SystemRoot, CONFIG_DIR};
use crate::volume::backing_file::refuse_links_below_root;
use crate::volume::id::VolumeId;
use crate::volume::reference::{check_name_to_give, VolumeRef};

pub struct Registry {
    root: SystemRoot,
    config: Config,
    /// Why `config.toml` could not be used (then `config` is the defaults).
    config_problem: Option<RegistryError>,
    config_warnings: Vec<RegistryWarning>,
    /// Why no volume file can be trusted: `/etc/sparse-volume` or
    /// `volumes.d` is writable by someone other than root.
    directory_problem: Option<RegistryError>,
}

/// One registry file and what became of it.
pub struct Entry {
    pub file: PathBuf,
    pub volume: Result<Volume, RegistryError>,
    /// Keys of this file that were ignored.
    pub warnings: Vec<RegistryWarning>,
    /// The backing file the entry names, even when the entry is invalid:
    /// such a file is still somebody's data and never ours to delete.
    pub named_path: Option<PathBuf>,
}

impl Registry {
    /// Opens the registry. A `config.toml` that cannot be read, does not
    /// validate or is writable by someone other than root never takes
    /// registered volumes down: the built-in defaults apply (volume files
    /// carry their own settings) and [`Registry::config_problem`] says why.
    pub fn open(root: SystemRoot) -> Self {
        let config_dir_problem = trust::check_directory(&root.host_path(CONFIG_DIR));
        let directory_problem = config_dir_problem
            .clone()
            .or_else(|| trust::check_directory(&root.volumes_dir()));
        let loaded = match &config_dir_problem {
            Some(problem) => Err(trust::in_refused_directory(&root.config_file(), problem)),
            None => load_config(&root.config_file()),
        };
        let (config, config_problem, config_warnings) = match loaded {
            Ok((config, warnings)) => (config, None, warnings),
            Err(problem) => (Config::default(), Some(problem), Vec::new()),
        };
        Self {
            root,
            config,
            config_problem,
            config_warnings,
            directory_problem,
        }
    }

    /// Why every volume file is refused: its directory (or
    /// `/etc/sparse-volume`) is writable by someone other than root. The
    /// error names that directory.
    pub fn directory_problem(&self) -> Option<&RegistryError> {
        self.directory_problem.as_ref()
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The configuration for decisions that depend on it (where files go,
    /// how much space may be promised): a broken `config.toml` is an error
    /// there, not a reason to fall back to defaults.
    pub fn provisioning_config(&self) -> Result<&Config, RegistryError> {
        match &self.config_problem {
            Some(problem) => Err(problem.clone()),
            None => Ok(&self.config),
        }
    }

    pub fn config_problem(&self) -> Option<&RegistryError> {
        self.config_problem.as_ref()
    }

    pub fn config_warnings(&self) -> &[RegistryWarning] {
        &self.config_warnings
    }

    pub fn root(&self) -> &SystemRoot {
        &self.root
    }

    /// Every `*.toml` in `volumes.d`, sorted by name, each parsed on its
    /// own so that one bad file never hides the others.
    pub fn entries(&self) -> Result<Vec<Entry>> {
        let dir = self.root.volumes_dir();
        let opened = File::open(&dir).and_then(|handle| Ok((fs::read_dir(&dir)?, handle)));
        let (listing, handle) = match opened {
            Ok(opened) => opened,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
        };
        let mut names = Vec::new();
        for item in listing {
            let item = item.with_context(|| format!("reading {}", dir.display()))?;
            let name = item.file_name();
            let text = name.to_string_lossy();
            // Dot files are temporaries of interrupted atomic writes.
            if text.ends_with(".toml") && !text.starts_with('.') {
                names.push(name);
            }
        }
        // By bytes: the same order as by path (one directory, names without
        // slashes), at a fraction of the cost.
        names.sort_unstable();
        Ok(names
            .into_iter()
            .filter_map(|name| {
                let file = dir.join(&name);
                self.read_entry(trust::read_in(&handle, &name, &file), file)
            })
            .collect())
    }

    /// `None` when the file is gone: a concurrent `remove` unregistered the
    /// volume between listing and reading, which is no broken entry.
    fn read_entry(&self, read: std::io::Result<trust::Contents>, file: PathBuf) -> Option<Entry> {
        let unreadable = |file: PathBuf, reason: String, named_path| Entry {
            volume: Err(RegistryError::new(&file, None, reason)),
            file,
            warnings: Vec::new(),
            named_path,
        };
        let contents = match read {
            Ok(contents) => contents,
            // Gone meanwhile, or `volumes.d` is no directory (a problem of
            // the directory, reported as such).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => return None,
            Err(e) => return Some(unreadable(file, format!("cannot be read: {e}"), None)),
        };
        // A refused file still names somebody's data.
        let refusal = match (&self.directory_problem, contents.refused) {
            (Some(problem), _) => Some(trust::in_refused_directory(&file, problem)),
            (None, Some(reason)) => Some(RegistryError::untrusted(&file, reason)),
            (None, None) => None,
        };
        if let Some(error) = refusal {
            return Some(Entry {
                named_path: named_path(&String::from_utf8_lossy(&contents.bytes)),
                volume: Err(error),
                warnings: Vec::new(),
                file,
            });
        }
        let text = match String::from_utf8(contents.bytes) {
            Ok(text) => text,
            Err(e) => {
                // Still somebody's volume: keep what it names.
                let named = named_path(&String::from_utf8_lossy(e.as_bytes()));
                return Some(unreadable(file, "is not valid UTF-8".into(), named));
            }
        };
        Some(match Volume::parse(&file, &text, &self.config) {
            Ok(parsed) => Entry {
                named_path: Some(parsed.volume.path.clone()),
                volume: Ok(parsed.volume),
                warnings: parsed.warnings,
                file,
            },
            Err(error) => Entry {
                named_path: named_path(&text),
                volume: Err(error),
                warnings: Vec::new(),
                file,
            },
        })
    }

    /// Every backing file any registry file names, valid or not (host
    /// paths). Nothing in this set may be deleted as a leftover.
    pub fn named_backing_files(&self) -> Result<Vec<PathBuf>> {
        Ok(self
            .entries()?
            .into_iter()
            .filter_map(|entry| entry.named_path)
            .map(|path| self.root.host_path(path))
            .collect())
    }

    /// The registry file of `id` and what became of it, if there is one.
    pub fn entry(&self, id: &VolumeId) -> Option<Entry> {
        let file = self.root.volume_file(id);
        // A missing file is no entry; a symbolic link (even a dangling
        // one) is one, and a refused one (`trust::read` opens without
        // following it).
        self.read_entry(trust::read(&file), file)
    }

    /// The volume registered under `id`, `Ok(None)` if there is none. In
    /// a refused registry directory nothing can be said, and nothing may
    /// be registered: that is an error too.
    pub fn get(&self, id: &VolumeId) -> Result<Option<Volume>, RegistryError> {
        match self.entry(id) {
            Some(entry) => entry.volume.map(Some),
            None => match &self.directory_problem {
                Some(problem) => Err(problem.clone()),
                None => Ok(None),
            },
        }
    }

    /// The volume registered under `id`; its absence is an error that
    /// names the file that would have to exist.
    pub fn require(&self, id: &VolumeId) -> Result<Volume> {
        Ok(self.require_with_warnings(id)?.0)
    }

    /// [`Registry::require`], with what was ignored in the volume's file.
    pub fn require_with_warnings(&self, id: &VolumeId) -> Result<(Volume, Vec<RegistryWarning>)> {
        let missing = || {
            anyhow::anyhow!(
                "the volume is not registered (no {})",
                self.root.volume_file(id).display()
            )
        };
        match self.entry(id) {
            Some(entry) => Ok((entry.volume?, entry.warnings)),
            None => match &self.directory_problem {
                Some(problem) => Err(problem.clone().into()),
                None => Err(missing()),
            },
        }
    }

    /// Every readable volume that carries `name`. More than one is an
    /// ambiguity made by hand (or before names were unique): commands that
    /// look a volume up by name refuse it rather than guess.
    pub fn named(&self, name: &str) -> Result<Vec<Volume>> {
        Ok(self
            .entries()?
            .into_iter()
            .filter_map(|entry| entry.volume.ok())
            .filter(|volume| volume.name.as_deref() == Some(name))
            .collect())
    }

    /// The one volume that carries `name`, if any; several are an error
    /// naming them all. So is a registry file that carries the name but
    /// does not read: the name may be that volume's, and a new volume
    /// under it would be a second one once the file is fixed.
    pub fn volume_named(&self, name: &str) -> Result<Option<Volume>> {
        for entry in self.entries()? {
            if let Err(error) = &entry.volume {
                if raw_name(&entry.file).as_deref() == Some(name) {
                    bail!(
                        "the name {name:?} is in {}, which does not read ({error}); fix that file first",
                        entry.file.display()
                    );
                }
            }
        }
        let mut found = self.named(name)?;
        match found.len() {
            0 | 1 => Ok(found.pop()),
            several => bail!(
                "the name {name:?} is given to {several} volumes ({}); name one by its UUID",
                found
                    .iter()
                    .map(|v| v.id.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    /// Refuses to give `name` to volume `id` when another volume has it.
    /// Call under [`Registry::lock`], so that no create can take the name
    /// between this check and the write.
    /// A name the volume already carries stays its own, even one that a
    /// newer version would not give (see [`check_name_to_give`]).
    pub fn ensure_name_free(&self, name: &str, id: &VolumeId) -> Result<()> {
        match self.volume_named(name)? {
            Some(other) if other.id != *id => bail!(
                "the name {name:?} is already given to volume {}; a name names one volume on a node",
                other.id
            ),
            Some(_) => Ok(()),
            None => check_name_to_give(name).map_err(anyhow::Error::msg),
        }
    }

    /// The volume a command's volume argument stands for. A UUID stands
    /// for itself, registered or not (detach needs no entry); a name must
    /// name exactly one registered volume; failing that, a loop device,
    /// a backing path or the beginning of a UUID names the one volume it
    /// belongs to ([`lookup`]). A name that also reads as one of those and
    /// reaches another volume that way is refused: an older version gave
    /// such names.
    pub fn resolve(&self, volume: &VolumeRef) -> Result<Resolved> {
        let text = match volume {
            VolumeRef::Id(id) => {
                return Ok(Resolved {
                    id: *id,
                    how: ResolvedBy::Uuid,
                })
            }
            VolumeRef::Name(name) => name,
        };
        let looking_up = || format!("looking up {text:?}");
        if let Some(volume) = self.volume_named(text).with_context(looking_up)? {
            if let Ok(Some((other, how))) = self.resolve_other_than_by_name(text) {
                if other != volume.id {
                    bail!(
                        "{text:?} is the name of volume {} and also reaches volume {other} as {}; name the one meant by its UUID",
                        volume.id,
                        match how {
                            ResolvedBy::UuidPrefix => "the beginning of its UUID",
                            _ => "a device or path",
                        }
                    );
                }
            }
            return Ok(Resolved {
                id: volume.id,
                how: ResolvedBy::Name(text.clone()),
            });
        }
        if let Some(problem) = &self.directory_problem {
            return Err(anyhow::Error::from(problem.clone()).context(looking_up()));
        }
        match self.resolve_other_than_by_name(text)? {
            Some((id, how)) => Ok(Resolved { id, how }),
            None => Err(NoSuchVolume {
                reference: text.clone(),
                as_path: text.starts_with('/'),
            }
            .into()),
        }
    }

    /// Writes (creates or replaces) a volume's file atomically.
    pub fn put(&self, volume: &Volume) -> Result<()> {
        if let Some(problem) = &self.directory_problem {
            // Anyone who can write there could replace the new file.
            return Err(problem.clone().into());
        }
        let dir = self.root.volumes_dir();
        // Explicit 0755, not 0777 less the umask: a umask such as 0002
        // would make directories that the trust check then refuses.
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        let text = volume
            .to_toml()
            .with_context(|| format!("registering {}", volume.id))?;
        write_atomically(&self.root.volume_file(&volume.id), text.as_bytes(), 0o644)
    }

    /// Refuses the host path `path` of a backing file when it passes
    /// through a symbolic link below the configured storage root holding
    /// it; a warning when that storage root is itself a link (see
    /// [`refuse_links_below_root`]). A path outside every root passes.
    pub fn refuse_links_in_backing_path(&self, path: &Path) -> Result<Option<String>> {
        let root = self
            .config()
            .storage_roots
            .iter()
            .map(|root| self.root.host_path(root))
            .filter(|root| path.starts_with(root))
            // The deepest, when roots nest.
            .max_by_key(|root| root.components().count());
        match root {
            Some(root) => refuse_links_below_root(&root, path),
            None => Ok(None),
        }
    }

    /// Serialises registry read-modify-write and capacity decisions.
    pub fn lock(&self) -> Result<ExclusiveLock> {
        run_dir::lock(&self.root, "registry.lock")
    }

    /// Serialises device and data work on one volume (attach, detach,
    /// resize, deleting its file). Lock order: [`Registry::lock`] first,
    /// then this, never the other way round.
    pub fn volume_lock(root: &SystemRoot, id: &VolumeId) -> Result<ExclusiveLock> {
        run_dir::lock(root, &format!("{id}.lock"))
    }
}

/// What a command's volume argument stood for, and how it was found.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub id: VolumeId,
    pub how: ResolvedBy,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolvedBy {
    Uuid,
    /// By this name: a command that acts under the lock checks that the
    /// volume still carries it (it may have been renamed meanwhile).
    Name(String),
    /// By the loop device it was attached to: a command that acts under
    /// the lock checks that the device still holds it.
    Device(u32),
    Path,
    UuidPrefix,
}

/// `config.toml` read like a volume file: refused when anyone but root
/// can change it; a missing file means all defaults.
fn load_config(file: &Path) -> Result<(Config, Vec<RegistryWarning>), RegistryError> {
    let contents = match trust::read(file) {
        Ok(contents) => contents,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok((Config::default(), Vec::new()))
        }
        Err(e) => {
            return Err(RegistryError::new(
                file,
                None,
                format!("cannot be read: {e}"),
            ))
        }
    };
    if let Some(reason) = contents.refused {
        return Err(RegistryError::untrusted(file, reason));
    }
    let text = String::from_utf8(contents.bytes)
        .map_err(|_| RegistryError::new(file, None, "cannot be read: it is not valid UTF-8"))?;
    Config::parse_with_warnings(file, &text)
}

/// The `name` of a registry file that does not validate, read through the
/// trusted reader like every registry file: a link or a FIFO planted in
/// `volumes.d` names nothing (and must not hang or flood the lookup).
fn raw_name(file: &Path) -> Option<String> {
    let contents = trust::read(file).ok()?;
    // Lossy, as the path lookup reads them: a stray byte elsewhere in the
    // file must not hide the name it holds.
    raw_string(&String::from_utf8_lossy(&contents.bytes), "name")
}

/// The `path` of a registry file that does not validate.
fn named_path(text: &str) -> Option<PathBuf> {
    raw_string(text, "path").map(PathBuf::from)
}

/// A string key of a file that does not validate: from its TOML if that
/// is readable at all, else from a plain `key = "..."` line.
fn raw_string(text: &str, key: &str) -> Option<String> {
    if let Ok(table) = toml::from_str::<toml::Table>(text) {
        return table.get(key)?.as_str().map(str::to_string);
    }
    text.lines().find_map(|line| {
        let value = line.trim_start().strip_prefix(key)?.trim_start();
        let quoted = value.strip_prefix('=')?.trim().strip_prefix('"')?;
        quoted.split_once('"').map(|(value, _)| value.to_string())
    })
}
