//! Waiting for the `/dev/disk/by-*` link udev makes for a volume.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::paths::SystemRoot;
use crate::termination;

/// udev's control socket exists exactly while systemd-udevd runs.
pub const CONTROL_SOCKET: &str = "/run/udev/control";

/// Whether udev runs. The socket is looked up below `SPARSE_VOLUME_ROOT`
/// like every other path, so a test can make attach wait for a link that
/// never comes (the links themselves are the host's: devices are real).
pub fn is_running(root: &SystemRoot) -> bool {
    root.host_path(CONTROL_SOCKET).exists()
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkOutcome {
    /// The link resolves to the expected device.
    Linked,
    /// No udev on this system: nobody will make the link, so we did not wait.
    NoUdev,
    /// The timeout passed; the link was missing or pointed elsewhere.
    TimedOut { points_to: Option<PathBuf> },
    /// A stop was requested (see [`crate::termination`]) before either.
    Stopped,
}

/// Polls until `link` resolves to `device`. Polling (not inotify) keeps
/// this simple: links appear within milliseconds on a healthy system and
/// the wait is bounded either way.
pub fn wait_for_link(
    root: &SystemRoot,
    link: &Path,
    device: &Path,
    timeout: Duration,
) -> LinkOutcome {
    if termination::requested() {
        return LinkOutcome::Stopped;
    }
    if !is_running(root) {
        return LinkOutcome::NoUdev;
    }
    let deadline = Instant::now() + timeout;
    loop {
        // A stop wins over a link that appears at the same moment.
        if termination::requested() {
            return LinkOutcome::Stopped;
        }
        let points_to = std::fs::canonicalize(link).ok();
        if points_to.as_deref() == Some(device) {
            return LinkOutcome::Linked;
        }
        if Instant::now() >= deadline {
            return LinkOutcome::TimedOut { points_to };
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_udev_nothing_waits() {
        let dir = tempfile::tempdir().unwrap();
        let root = SystemRoot::at(dir.path().to_path_buf());
        let outcome = wait_for_link(
            &root,
            Path::new("/nonexistent/link"),
            Path::new("/dev/null"),
            Duration::from_secs(3600),
        );
        assert_eq!(outcome, LinkOutcome::NoUdev);
    }

    #[test]
    fn with_udev_a_link_is_followed() {
        let dir = tempfile::tempdir().unwrap();
        let root = SystemRoot::at(dir.path().to_path_buf());
        let control = root.host_path(CONTROL_SOCKET);
        std::fs::create_dir_all(control.parent().unwrap()).unwrap();
        std::fs::write(&control, "").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/dev/null", &link).unwrap();
        assert_eq!(
            wait_for_link(&root, &link, Path::new("/dev/null"), Duration::ZERO),
            LinkOutcome::Linked
        );
        assert_eq!(
            wait_for_link(&root, &link, Path::new("/dev/zero"), Duration::ZERO),
            LinkOutcome::TimedOut {
                points_to: Some(PathBuf::from("/dev/null"))
            }
        );
    }
}
