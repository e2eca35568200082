//! `/etc/sparse-volume/config.toml`: global settings, every key optional.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::error::RegistryError;
use super::lenient::{from_toml, RegistryWarning};
use crate::registry::paths::{is_normal_absolute, DEFAULT_STORAGE_ROOT};
use crate::volume::size::parse_size;

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Directories that may hold backing files; `create` uses the first.
    pub storage_roots: Vec<PathBuf>,
    pub overcommit_ratio: f64,
    pub reserve: Reserve,
    pub udev_timeout: Duration,
    /// Default for volumes that do not say.
    pub direct_io: bool,
    /// Below this headroom (free space minus what the volumes on a file
    /// system may still grow into) `check` and the metrics timer warn;
    /// `None` warns only once the growth exceeds the free space.
    pub warn_headroom: Option<Reserve>,
    /// Where `metrics --textfile` writes without a directory argument:
    /// node_exporter's textfile collector directory.
    pub metrics_textfile_directory: PathBuf,
}

/// Debian's prometheus-node-exporter reads its textfile collector here.
pub const DEFAULT_METRICS_TEXTFILE_DIRECTORY: &str = "/var/lib/prometheus/node-exporter";

/// An amount of a backing file system: bytes, or a share of its size
/// (`reserve`, `warn_headroom`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reserve {
    Bytes(u64),
    Percent(f64),
}

impl Reserve {
    /// The amount in bytes on a file system of `total` bytes.
    pub fn bytes_of(&self, total: u64) -> u64 {
        match *self {
            Reserve::Bytes(bytes) => bytes,
            Reserve::Percent(percent) => ((total as f64) * percent / 100.0) as u64,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            storage_roots: vec![PathBuf::from(DEFAULT_STORAGE_ROOT)],
            overcommit_ratio: 1.0,
            reserve: Reserve::Bytes(0),
            udev_timeout: Duration::from_secs(30),
            direct_io: true,
            warn_headroom: None,
            metrics_textfile_directory: PathBuf::from(DEFAULT_METRICS_TEXTFILE_DIRECTORY),
        }
    }
}

/// Unknown keys are warnings (see `lenient`), so no `deny_unknown_fields`.
#[derive(Deserialize)]
struct ConfigFile {
    storage_roots: Option<Spanned<Vec<String>>>,
    overcommit_ratio: Option<Spanned<f64>>,
    reserve: Option<Spanned<toml::Value>>,
    udev_timeout_sec: Option<Spanned<i64>>,
    direct_io: Option<bool>,
    warn_headroom: Option<Spanned<toml::Value>>,
    metrics_textfile_directory: Option<Spanned<String>>,
}

pub const KNOWN_KEYS: &[&str] = &[
    "storage_roots",
    "overcommit_ratio",
    "reserve",
    "udev_timeout_sec",
    "direct_io",
    "warn_headroom",
    "metrics_textfile_directory",
];

/// Longer than any boot should wait for a udev link; also keeps the
/// deadline arithmetic (`Instant + Duration`) far from overflowing.
const MAX_UDEV_TIMEOUT_SEC: i64 = 3600;

impl Config {
    pub fn parse(file: &Path, text: &str) -> Result<Self, RegistryError> {
        Self::parse_with_warnings(file, text).map(|(config, _)| config)
    }

    pub fn parse_with_warnings(
        file: &Path,
        text: &str,
    ) -> Result<(Self, Vec<RegistryWarning>), RegistryError> {
        let (raw, warnings): (ConfigFile, _) = from_toml(file, text, KNOWN_KEYS)?;
        let fail = |span, reason: String| RegistryError::at(file, text, Some(span), reason);
        let mut config = Self::default();

        if let Some(roots) = raw.storage_roots {
            let span = roots.span();
            let roots = roots.into_inner();
            if roots.is_empty() {
                return Err(fail(
                    span,
                    "storage_roots must name at least one directory".into(),
                ));
            }
            config.storage_roots = Vec::with_capacity(roots.len());
            for root in roots {
                let path = PathBuf::from(&root);
                if !is_normal_absolute(&path) || path == Path::new("/") {
                    return Err(fail(
                        span.clone(),
                        format!("storage root {root:?} must be a normalised absolute directory other than /"),
                    ));
                }
                // Such a root could never hold a valid volume path, and
                // it would end up in messages and unit files.
                if root.chars().any(char::is_control) {
                    return Err(fail(
                        span.clone(),
                        format!("storage root {root:?} must not contain control characters"),
                    ));
                }
                config.storage_roots.push(path);
            }
        }
        if let Some(ratio) = raw.overcommit_ratio {
            let value = *ratio.get_ref();
            if !(value.is_finite() && value >= 1.0) {
                return Err(fail(
                    ratio.span(),
                    format!("overcommit_ratio must be a number >= 1.0, not {value}"),
                ));
            }
            config.overcommit_ratio = value;
        }
        if let Some(reserve) = raw.reserve {
            let span = reserve.span();
            config.reserve = parse_amount("reserve", reserve.into_inner())
                .map_err(|reason| fail(span, reason))?;
        }
        if let Some(timeout) = raw.udev_timeout_sec {
            let seconds = *timeout.get_ref();
            let seconds = u64::try_from(seconds)
                .ok()
                .filter(|_| seconds <= MAX_UDEV_TIMEOUT_SEC)
                .ok_or_else(|| {
                    fail(
                        timeout.span(),
                        format!(
                            "udev_timeout_sec must be between 0 and {MAX_UDEV_TIMEOUT_SEC}, not {seconds}"
                        ),
                    )
                })?;
            config.udev_timeout = Duration::from_secs(seconds);
        }
        if let Some(direct_io) = raw.direct_io {
            config.direct_io = direct_io;
        }
        if let Some(threshold) = raw.warn_headroom {
            let span = threshold.span();
            config.warn_headroom = Some(
                parse_amount("warn_headroom", threshold.into_inner())
                    .map_err(|reason| fail(span, reason))?,
            );
        }
        if let Some(directory) = raw.metrics_textfile_directory {
            let path = PathBuf::from(directory.get_ref());
            if !is_normal_absolute(&path) || directory.get_ref().chars().any(char::is_control) {
                return Err(fail(
                    directory.span(),
                    format!(
                        "metrics_textfile_directory {:?} must be a normalised absolute directory",
                        directory.get_ref()
                    ),
                ));
            }
            config.metrics_textfile_directory = path;
        }
        Ok((config, warnings))
    }

    /// The storage root that contains `path`, if any.
    pub fn storage_root_of(&self, path: &Path) -> Option<&Path> {
        self.storage_roots
            .iter()
            .map(PathBuf::as_path)
            .find(|root| path.starts_with(root) && path != *root)
    }
}

fn parse_amount(key: &str, value: toml::Value) -> Result<Reserve, String> {
    match value {
        toml::Value::Integer(bytes) => u64::try_from(bytes)
            .map(Reserve::Bytes)
            .map_err(|_| format!("{key} {bytes} must not be negative")),
        toml::Value::String(text) => {
            if let Some(percent) = text.trim().strip_suffix('%') {
                let value: f64 = percent
                    .trim()
                    .parse()
                    .map_err(|_| format!("{key} \"{text}\" is not a percentage"))?;
                if !(0.0..100.0).contains(&value) {
                    return Err(format!(
                        "{key} \"{text}\" must be at least 0% and below 100%"
                    ));
                }
                Ok(Reserve::Percent(value))
            } else {
                parse_size(&text)
                    .map(Reserve::Bytes)
                    .map_err(|e| format!("{key}: {e}"))
            }
        }
        other => Err(format!(
            "{key} must be a number of bytes or a string such as \"10G\" or \"5%\", not a {}",
            other.type_str()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, RegistryError> {
        Config::parse(Path::new("/etc/sparse-volume/config.toml"), text)
    }

    #[test]
    fn empty_file_gives_defaults() {
        assert_eq!(parse("").unwrap(), Config::default());
    }

    #[test]
    fn every_key_is_read() {
        let config = parse(
            "storage_roots = [\"/srv/a\", \"/srv/b\"]\novercommit_ratio = 1.5\nreserve = \"5%\"\nudev_timeout_sec = 7\ndirect_io = false\n",
        )
        .unwrap();
        assert_eq!(
            config.storage_roots,
            vec![PathBuf::from("/srv/a"), PathBuf::from("/srv/b")]
        );
        assert_eq!(config.overcommit_ratio, 1.5);
        assert_eq!(config.reserve, Reserve::Percent(5.0));
        assert_eq!(config.udev_timeout, Duration::from_secs(7));
        assert!(!config.direct_io);
        let config =
            parse("warn_headroom = \"2G\"\nmetrics_textfile_directory = \"/run/textfiles\"\n")
                .unwrap();
        assert_eq!(config.warn_headroom, Some(Reserve::Bytes(2 << 30)));
        assert_eq!(
            config.metrics_textfile_directory,
            PathBuf::from("/run/textfiles")
        );
        assert_eq!(
            parse("warn_headroom = \"10%\"").unwrap().warn_headroom,
            Some(Reserve::Percent(10.0))
        );
        assert_eq!(
            parse("reserve = \"1G\"").unwrap().reserve,
            Reserve::Bytes(1 << 30)
        );
        assert_eq!(
            parse("reserve = 4096").unwrap().reserve,
            Reserve::Bytes(4096)
        );
    }

    #[test]
    fn unknown_keys_are_ignored_with_a_suggestion() {
        let (config, warnings) = Config::parse_with_warnings(
            Path::new("/etc/sparse-volume/config.toml"),
            "direct_io = false\novercommit = 2.0\n",
        )
        .unwrap();
        assert!(!config.direct_io);
        assert_eq!(config.overcommit_ratio, 1.0);
        assert_eq!(
            warnings[0].to_string(),
            "/etc/sparse-volume/config.toml:2: unknown key \"overcommit\" (did you mean \"overcommit_ratio\"?); ignored"
        );
    }

    #[test]
    fn errors_name_the_line() {
        let err = parse("direct_io = true\nreserve = [1]\n").unwrap_err();
        assert_eq!(err.line, Some(2));
        let err = parse("\n\novercommit_ratio = 0.5\n").unwrap_err();
        assert_eq!(err.line, Some(3));
        assert!(parse("storage_roots = [\"relative\"]").is_err());
        assert!(parse("storage_roots = [\"/srv/../etc\"]").is_err());
        assert!(parse("storage_roots = []").is_err());
        assert!(parse("reserve = \"150%\"").is_err());
    }

    #[test]
    fn bad_values_are_named() {
        for (text, reason) in [
            ("reserve = [1]", "reserve must be a number of bytes"),
            ("reserve = true", "not a boolean"),
            ("reserve = -1", "must not be negative"),
            ("udev_timeout_sec = -1", "between 0 and 3600, not -1"),
            // Instant + this would overflow while waiting for udev.
            (
                "udev_timeout_sec = 9223372036854775807",
                "between 0 and 3600",
            ),
            ("storage_roots = [\"/srv/a\\nb\"]", "control characters"),
            (
                "warn_headroom = -5",
                "warn_headroom -5 must not be negative",
            ),
            ("warn_headroom = \"lots\"", "warn_headroom: "),
            (
                "metrics_textfile_directory = \"relative\"",
                "normalised absolute directory",
            ),
            ("storage_roots = [\"/srv/\\u0000\"]", "control characters"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.reason.contains(reason), "{text}: {err}");
            assert!(!err.to_string().contains('\n'), "{err}");
        }
        assert_eq!(
            parse("udev_timeout_sec = 3600").unwrap().udev_timeout,
            Duration::from_secs(3600)
        );
    }

    #[test]
    fn storage_root_of_requires_a_proper_descendant() {
        let config = parse("storage_roots = [\"/srv/vol\"]").unwrap();
        assert_eq!(
            config.storage_root_of(Path::new("/srv/vol/a")),
            Some(Path::new("/srv/vol"))
        );
        assert_eq!(config.storage_root_of(Path::new("/srv/volume/a")), None);
        assert_eq!(config.storage_root_of(Path::new("/srv/vol")), None);
    }
}
