//! Waiting for the `/dev/disk/by-*` link udev makes for a volume.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use crate::kernel::files::ExclusiveLock;
use crate::kernel::signals;

/// How many inotify instances all our waiting processes hold at most.
/// The kernel's `fs.inotify.max_user_instances` (128 on Debian) counts
/// every instance of root's, so a hundred volumes starting at once, each
/// with its own, left other root services starting at that moment without
/// one (EMFILE). A waiter without a slot looks at the link every
/// [`SLOTLESS_POLL`] instead.
pub const INOTIFY_SLOTS: u32 = 32;

/// udev's control socket exists exactly while systemd-udevd runs.
pub const CONTROL_SOCKET: &str = "/run/udev/control";

/// Whether udev runs, asked of its control socket (the caller says where
/// it is: below `SPARSE_VOLUME_ROOT` a test can make attach wait for a
/// link that never comes; the links themselves are the host's).
pub fn is_running(control_socket: &Path) -> bool {
    control_socket.exists()
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkOutcome {
    /// The link resolves to the expected device.
    Linked,
    /// No udev on this system: nobody will make the link, so we did not wait.
    NoUdev,
    /// The timeout passed; the link was missing or pointed elsewhere.
    TimedOut { points_to: Option<PathBuf> },
    /// A stop was requested (see [`crate::kernel::signals`]) before either.
    Stopped,
}

/// Waits until `link` resolves to `device`, waking when udev changes the
/// link's directory. At boot a hundred attaches wait at once while udev
/// works through their devices, on machines whose CPUs udev needs: a poll
/// every 50 ms each was a path resolution 20 times a second per waiting
/// volume. The link is still looked at every [`RECHECK`] in case an event
/// is missed (a directory made or replaced while we wait).
/// `slots` is a directory for the lock files that share out
/// [`INOTIFY_SLOTS`] among our processes.
pub fn wait_for_link(
    control_socket: &Path,
    slots: &Path,
    link: &Path,
    device: &Path,
    timeout: Duration,
) -> LinkOutcome {
    if signals::requested() {
        return LinkOutcome::Stopped;
    }
    if !is_running(control_socket) {
        return LinkOutcome::NoUdev;
    }
    let deadline = Instant::now() + timeout;
    // Watching before the first look: a link made in between wakes us.
    let mut watch = DirectoryWatch::new(link, slots);
    loop {
        // A stop wins over a link that appears at the same moment.
        if signals::requested() {
            return LinkOutcome::Stopped;
        }
        let points_to = std::fs::canonicalize(link).ok();
        if points_to.as_deref() == Some(device) {
            return LinkOutcome::Linked;
        }
        let now = Instant::now();
        if now >= deadline {
            return LinkOutcome::TimedOut { points_to };
        }
        let remaining = deadline - now;
        match watch.as_mut() {
            Some(watch) => watch.wait(remaining.min(RECHECK)),
            None => std::thread::sleep(remaining.min(UNWATCHED_POLL)),
        }
    }
}

/// The longest a waiting attach goes without looking at the link.
const RECHECK: Duration = Duration::from_millis(500);
/// How often the link is looked at when its directory cannot be watched
/// (it does not exist yet: the first volume of its kind on this system).
const UNWATCHED_POLL: Duration = Duration::from_millis(50);
/// How often a waiter without an inotify slot looks at the link.
const SLOTLESS_POLL: Duration = Duration::from_millis(100);

/// The lock of slot `index` (modulo [`INOTIFY_SLOTS`]) if it is free.
fn take_slot_at(slots: &Path, index: u32) -> Option<ExclusiveLock> {
    let path = slots.join(format!("inotify-slot-{}", index % INOTIFY_SLOTS));
    match ExclusiveLock::try_acquire(&path) {
        Ok(slot) => slot,
        Err(e) => {
            tracing::debug!("inotify slot {}: {e:#}", path.display());
            None
        }
    }
}

/// The lock of any free one of the [`INOTIFY_SLOTS`], tried from a place
/// that depends on the process so that concurrent waiters spread out.
fn take_slot(slots: &Path) -> Option<ExclusiveLock> {
    let first = std::process::id();
    (0..INOTIFY_SLOTS).find_map(|i| take_slot_at(slots, first.wrapping_add(i)))
}

/// inotify on the directory a link lives in, for the changes udev makes
/// there (it writes a link under a temporary name and renames it). The
/// instance is made only once the directory exists and a slot is ours.
struct DirectoryWatch {
    directory: PathBuf,
    slots: PathBuf,
    /// The instance watching the directory, and the slot it holds.
    watching: Option<(Inotify, ExclusiveLock)>,
    /// No slot (or no instance) could be had: the link is looked at every
    /// [`SLOTLESS_POLL`], and one slot is tried again every [`RECHECK`].
    slotless: Option<Slotless>,
}

/// A waiter's turn at the slots while it has none.
struct Slotless {
    next_slot: u32,
    next_try: Instant,
}

impl DirectoryWatch {
    fn new(link: &Path, slots: &Path) -> Option<Self> {
        let mut watch = Self {
            directory: link.parent()?.to_path_buf(),
            slots: slots.to_path_buf(),
            watching: None,
            slotless: None,
        };
        if watch.directory.is_dir() {
            let slot = take_slot(&watch.slots);
            watch.watch_with(slot);
        }
        Some(watch)
    }

    /// Watches the directory holding `slot`; without a slot, or when the
    /// kernel gives no instance (EMFILE: the very shortage the slots are
    /// for), the waiter polls and tries one slot again later.
    fn watch_with(&mut self, slot: Option<ExclusiveLock>) {
        let changes = AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_MOVED_FROM;
        self.watching = slot.and_then(|slot| {
            Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)
                .ok()
                .filter(|inotify| inotify.add_watch(&self.directory, changes).is_ok())
                .map(|inotify| (inotify, slot))
        });
        self.slotless = match (&self.watching, self.slotless.take()) {
            (Some(_), _) => None,
            (None, Some(turn)) => Some(Slotless {
                next_slot: turn.next_slot.wrapping_add(1),
                next_try: Instant::now() + RECHECK,
            }),
            (None, None) => Some(Slotless {
                next_slot: std::process::id(),
                next_try: Instant::now() + RECHECK,
            }),
        };
    }

    /// Returns after a change in the directory, after `timeout`, or when a
    /// signal (a stop request) interrupts the wait.
    fn wait(&mut self, timeout: Duration) {
        let Some((inotify, _slot)) = &self.watching else {
            match &self.slotless {
                Some(turn) => {
                    std::thread::sleep(timeout.min(SLOTLESS_POLL));
                    if Instant::now() >= turn.next_try {
                        let slot = take_slot_at(&self.slots, turn.next_slot);
                        self.watch_with(slot);
                    }
                }
                None => {
                    // The directory may exist by now.
                    std::thread::sleep(timeout.min(UNWATCHED_POLL));
                    if self.directory.is_dir() {
                        let slot = take_slot(&self.slots);
                        self.watch_with(slot);
                    }
                }
            }
            return;
        };
        let mut fds = [PollFd::new(inotify.as_fd(), PollFlags::POLLIN)];
        let millis = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        if matches!(poll(&mut fds, PollTimeout::from(millis)), Ok(n) if n > 0) {
            // Drained, so that the next wait sleeps until the next change.
            while matches!(inotify.read_events(), Ok(events) if !events.is_empty()) {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_udev_nothing_waits() {
        let dir = tempfile::tempdir().unwrap();
        let outcome = wait_for_link(
            &dir.path().join("run/udev/control"),
            dir.path(),
            Path::new("/nonexistent/link"),
            Path::new("/dev/null"),
            Duration::from_secs(3600),
        );
        assert_eq!(outcome, LinkOutcome::NoUdev);
    }

    #[test]
    fn a_link_renamed_into_place_ends_the_wait_before_its_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("by-uuid").join("volume");
        std::fs::create_dir(link.parent().unwrap()).unwrap();
        let mut watch = DirectoryWatch::new(&link, dir.path()).expect("a watch");
        assert!(watch.watching.is_some());
        let maker = {
            let link = link.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                // As udev does: a temporary name, then a rename.
                let temporary = link.with_file_name(".#volume");
                std::os::unix::fs::symlink("/dev/null", &temporary).unwrap();
                std::fs::rename(&temporary, &link).unwrap();
            })
        };
        let timeout = Duration::from_secs(60);
        let started = Instant::now();
        watch.wait(timeout);
        maker.join().unwrap();
        assert!(
            started.elapsed() < timeout,
            "the wait ran into its timeout instead of waking at the rename"
        );
        assert!(link.exists());
    }

    #[test]
    fn without_a_free_slot_or_a_directory_no_inotify_instance_is_made() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("by-uuid").join("volume");
        let missing = DirectoryWatch::new(&link, dir.path()).expect("a watch");
        assert!(missing.watching.is_none() && missing.slotless.is_none());
        std::fs::create_dir(link.parent().unwrap()).unwrap();
        let held: Vec<_> = (0..INOTIFY_SLOTS)
            .map(|_| take_slot(dir.path()).expect("a free slot"))
            .collect();
        let mut slotless = DirectoryWatch::new(&link, dir.path()).expect("a watch");
        assert!(slotless.watching.is_none() && slotless.slotless.is_some());
        // A slot freed later is taken at a later turn.
        drop(held);
        let deadline = Instant::now() + Duration::from_secs(10);
        while slotless.watching.is_none() {
            assert!(Instant::now() < deadline, "a freed slot was never taken");
            slotless.wait(Duration::from_millis(100));
        }
        let watching = DirectoryWatch::new(&link, dir.path()).expect("a watch");
        assert!(watching.watching.is_some());
    }

    #[test]
    fn with_udev_a_link_is_followed() {
        let dir = tempfile::tempdir().unwrap();
        let control = dir.path().join("run/udev/control");
        std::fs::create_dir_all(control.parent().unwrap()).unwrap();
        std::fs::write(&control, "").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/dev/null", &link).unwrap();
        assert_eq!(
            wait_for_link(
                &control,
                dir.path(),
                &link,
                Path::new("/dev/null"),
                Duration::ZERO
            ),
            LinkOutcome::Linked
        );
        assert_eq!(
            wait_for_link(
                &control,
                dir.path(),
                &link,
                Path::new("/dev/zero"),
                Duration::ZERO
            ),
            LinkOutcome::TimedOut {
                points_to: Some(PathBuf::from("/dev/null"))
            }
        );
    }
}
