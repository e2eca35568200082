//! Waiting for the `/dev/disk/by-*` link udev makes for a volume.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// udev's control socket exists exactly while systemd-udevd runs.
pub fn is_running() -> bool {
    Path::new("/run/udev/control").exists()
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkOutcome {
    /// The link resolves to the expected device.
    Linked,
    /// No udev on this system: nobody will make the link, so we did not wait.
    NoUdev,
    /// The timeout passed; the link was missing or pointed elsewhere.
    TimedOut { points_to: Option<PathBuf> },
}

/// Polls until `link` resolves to `device`. Polling (not inotify) keeps
/// this simple: links appear within milliseconds on a healthy system and
/// the wait is bounded either way.
pub fn wait_for_link(link: &Path, device: &Path, timeout: Duration) -> LinkOutcome {
    if !is_running() {
        return LinkOutcome::NoUdev;
    }
    let deadline = Instant::now() + timeout;
    loop {
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
