//! Where things live, and the `SPARSE_VOLUME_ROOT` override that moves all
//! of it under one directory for tests and packaging.
//!
//! Paths written in the registry are *logical* (as seen on the installed
//! system, e.g. `/var/lib/sparse-volume/<UUID>`); [`SystemRoot::host_path`]
//! maps them to where they really are.

use std::path::{Path, PathBuf};

use crate::volume::id::VolumeId;

pub const ROOT_ENV: &str = "SPARSE_VOLUME_ROOT";
pub const CONFIG_DIR: &str = "/etc/sparse-volume";
pub const CONFIG_FILE: &str = "/etc/sparse-volume/config.toml";
pub const VOLUMES_DIR: &str = "/etc/sparse-volume/volumes.d";
pub const DEFAULT_STORAGE_ROOT: &str = "/var/lib/sparse-volume";
/// Where `create --encrypt` puts the key files it makes (root only).
pub const KEYS_DIR: &str = "/etc/sparse-volume/keys";
/// Locks live on tmpfs: they mean nothing across a reboot.
pub const RUN_DIR: &str = "/run/sparse-volume";

#[derive(Clone, Debug)]
pub struct SystemRoot {
    prefix: Option<PathBuf>,
}

impl SystemRoot {
    /// The real system, or the directory named by `SPARSE_VOLUME_ROOT`.
    pub fn from_env() -> Self {
        match std::env::var_os(ROOT_ENV) {
            Some(dir) if !dir.is_empty() => Self::at(PathBuf::from(dir)),
            _ => Self { prefix: None },
        }
    }

    pub fn at(prefix: PathBuf) -> Self {
        Self {
            prefix: Some(prefix),
        }
    }

    pub fn is_overridden(&self) -> bool {
        self.prefix.is_some()
    }

    /// Maps a logical absolute path to the path to open on this host.
    pub fn host_path(&self, logical: impl AsRef<Path>) -> PathBuf {
        let logical = logical.as_ref();
        match &self.prefix {
            None => logical.to_path_buf(),
            Some(prefix) => prefix.join(logical.strip_prefix("/").unwrap_or(logical)),
        }
    }

    pub fn config_file(&self) -> PathBuf {
        self.host_path(CONFIG_FILE)
    }

    pub fn volumes_dir(&self) -> PathBuf {
        self.host_path(VOLUMES_DIR)
    }

    pub fn volume_file(&self, id: &VolumeId) -> PathBuf {
        self.volumes_dir().join(format!("{id}.toml"))
    }

    pub fn run_dir(&self) -> PathBuf {
        self.host_path(RUN_DIR)
    }
}

/// True when `path` is absolute and free of `.`/`..` components and
/// repeated separators, so prefix checks on it mean what they say.
pub fn is_normal_absolute(path: &Path) -> bool {
    let text = path.as_os_str().to_string_lossy();
    let Some(rest) = text.strip_prefix('/') else {
        return false;
    };
    rest.is_empty() || rest.split('/').all(|part| !matches!(part, "" | "." | ".."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_moves_logical_paths() {
        let root = SystemRoot::at(PathBuf::from("/tmp/fixture"));
        assert_eq!(
            root.host_path("/var/lib/sparse-volume/x"),
            PathBuf::from("/tmp/fixture/var/lib/sparse-volume/x")
        );
        let real = SystemRoot { prefix: None };
        assert_eq!(real.host_path("/etc/a"), PathBuf::from("/etc/a"));
    }

    #[test]
    fn normal_absolute_paths() {
        assert!(is_normal_absolute(Path::new("/var/lib/x")));
        assert!(!is_normal_absolute(Path::new("var/lib/x")));
        assert!(!is_normal_absolute(Path::new("/var/lib/../x")));
        assert!(!is_normal_absolute(Path::new("/var/./x")));
        assert!(!is_normal_absolute(Path::new("/var//x")));
        assert!(!is_normal_absolute(Path::new("/var/x/")));
    }
}
