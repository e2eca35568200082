//! Freezing a mounted file system for a moment (`FIFREEZE`/`FITHAW`), for
//! a point-in-time copy of a file on it, such that no kill of the caller,
//! `SIGKILL` included, leaves it frozen: a frozen file system hangs every
//! process on the node that writes to it, and the kernel does not thaw it
//! when the freezer dies.
//!
//! So nothing is frozen before a guardian exists: a child process, forked
//! before the freeze, in a session of its own, that holds the mount point
//! open and waits on a pipe whose only write end is the caller's. When the
//! caller thaws, it stands the guardian down with a byte; when the caller
//! dies, however, the kernel closes that write end, the guardian reads end
//! of file and thaws; and when `limit` passes first (the caller hangs, or
//! is stopped), the guardian thaws too, and the caller's own thaw then says
//! the freeze did not last.
//!
//! What it cannot cover: a `SIGKILL` of the guardian itself together with
//! the caller (a kill of every process of a cgroup); the stop signals that
//! precede one (systemd's `SIGTERM` to a unit's processes) it ignores, and
//! it thaws as soon as the caller has died of them.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::unistd::pipe2;

/// `_IOWR('X', 119, int)`, from `<linux/fs.h>`.
const FIFREEZE: libc::c_ulong = linux_raw_sys::ioctl::FIFREEZE as libc::c_ulong;
/// `_IOWR('X', 120, int)`, from `<linux/fs.h>`.
const FITHAW: libc::c_ulong = linux_raw_sys::ioctl::FITHAW as libc::c_ulong;

/// The guardian's exit statuses.
const STOOD_DOWN: libc::c_int = 0;
/// It thawed the file system: its limit passed, or its caller went away.
const THAWED: libc::c_int = 3;
/// It tried to thaw, and the file system was not frozen (any more).
const FOUND_THAWED: libc::c_int = 4;

/// A file system frozen by [`freeze`]; [`Frozen::thaw`] thaws it, and so
/// does dropping it (best effort, for the paths that return early).
#[derive(Debug)]
pub struct Frozen {
    mount_point: PathBuf,
    file_system: File,
    limit: Duration,
    frozen_at: Instant,
    /// `None` once thawed.
    guardian: Option<Guardian>,
}

#[derive(Debug)]
struct Guardian {
    pid: libc::pid_t,
    /// The pipe's only write end outside the guardian's own, closed copy.
    stand_down: OwnedFd,
}

/// Freezes the file system on the block device `device` (`st_rdev`),
/// reached through `mount_point`, and makes sure it is thawed within
/// `limit` of this call whatever happens to the caller (the time
/// `FIFREEZE` takes to write back dirty data counts). Fails when another
/// file system is what the path reaches (a mount on top of that one), when
/// it is frozen already (by another tool, or another freeze of ours:
/// `EBUSY`), when it cannot be frozen (`EOPNOTSUPP`), or without
/// `CAP_SYS_ADMIN`.
pub fn freeze(mount_point: &Path, device: u64, limit: Duration) -> Result<Frozen> {
    let file_system = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(mount_point)
        .with_context(|| format!("opening {}", mount_point.display()))?;
    // The path may lead elsewhere (a mount covers it): freezing that file
    // system could be freezing the storage the caller is about to write.
    let reached = file_system
        .metadata()
        .with_context(|| format!("inspecting {}", mount_point.display()))?
        .dev();
    if reached != device {
        bail!(
            "{} leads to another file system (device {}:{}, not {}:{}): a mount covers it; not freezing",
            mount_point.display(),
            libc::major(reached),
            libc::minor(reached),
            libc::major(device),
            libc::minor(device)
        );
    }
    // Close-on-exec (as `File`s are): a tool the caller runs later while
    // frozen must not inherit the write end, or the caller's death would
    // leave one open and the guardian would never see end of file.
    let (read_end, write_end) =
        pipe2(OFlag::O_CLOEXEC).context("making the pipe to a freeze's guardian")?;
    let limit_ms = i64::try_from(limit.as_millis()).unwrap_or(i64::MAX);
    // Everything the child uses is computed here: after a fork in a process
    // with other threads, it may make system calls only (another thread may
    // have held the allocator's lock at the fork).
    let (directory, stand_down, its_write_end) = (
        file_system.as_raw_fd(),
        read_end.as_raw_fd(),
        write_end.as_raw_fd(),
    );
    // SAFETY: in the child, `guard` makes only async-signal-safe system
    // calls on descriptors that are open in it, never returns, and ends
    // with `_exit` (no destructors, no atexit handlers, no flushing of the
    // parent's buffers).
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        guard(directory, stand_down, its_write_end, limit_ms);
    }
    if pid < 0 {
        return Err(Errno::last()).context("starting the guardian of a freeze");
    }
    // Only the guardian reads; our copy of the read end would serve nothing.
    drop(read_end);
    let guardian = Guardian {
        pid,
        stand_down: write_end,
    };
    // The freeze comes only now that a guardian exists, so that there is no
    // moment at which a kill leaves the file system frozen and no one to
    // thaw it. (A kill before the freeze has the guardian thaw a file system
    // we never froze: a harmless EINVAL, unless another tool froze it
    // meanwhile; no order avoids that, and the cost is its consistency, not
    // a hang.)
    // SAFETY: FIFREEZE takes no argument (the int is unused); the
    // descriptor is valid for the duration of the call.
    let frozen = Errno::result(unsafe { libc::ioctl(file_system.as_raw_fd(), FIFREEZE, 0) });
    let frozen_at = Instant::now();
    if let Err(errno) = frozen {
        // Stood down, not left to see end of file: an EBUSY freeze is
        // someone else's, which the guardian must not thaw.
        guardian.stand_down();
        let place = mount_point.display();
        return Err(errno).with_context(|| match errno {
            Errno::EBUSY => format!("{place} is already frozen (by another tool?)"),
            Errno::EOPNOTSUPP => format!("the file system at {place} cannot be frozen"),
            Errno::EPERM => format!("freezing {place} needs CAP_SYS_ADMIN"),
            _ => format!("freezing {place}"),
        });
    }
    Ok(Frozen {
        mount_point: mount_point.to_path_buf(),
        file_system,
        limit,
        frozen_at,
        guardian: Some(guardian),
    })
}

impl Frozen {
    /// Thaws the file system; returns how long it was frozen. An error
    /// means that it may have been thawed before this call (the guardian's
    /// limit passed): what was read while "frozen" may then be
    /// inconsistent, and the caller must not trust it.
    pub fn thaw(mut self) -> Result<Duration> {
        self.thaw_once()
    }

    fn thaw_once(&mut self) -> Result<Duration> {
        let Some(guardian) = self.guardian.take() else {
            return Err(anyhow!("{} was thawed already", self.mount_point.display()));
        };
        // Thaw first, stand the guardian down after: the window stays as
        // short as it can be, and a kill between the two leaves a guardian
        // that thaws a thawed file system (EINVAL, harmless). The other
        // order would leave it frozen with no one to thaw it.
        // SAFETY: FITHAW takes no argument (the int is unused); the
        // descriptor is valid for the duration of the call.
        let thawed = Errno::result(unsafe { libc::ioctl(self.file_system.as_raw_fd(), FITHAW, 0) });
        let window = self.frozen_at.elapsed();
        let guardian_exit = guardian.stand_down();
        let place = self.mount_point.display();
        let limit = self.limit;
        match thawed {
            // Our thaw worked and the guardian's did not happen (or found
            // nothing to thaw, having raced ours): frozen throughout.
            Ok(_) if guardian_exit != Some(THAWED) => Ok(window),
            // Ours worked only because the file system was frozen again
            // after the guardian thawed it (by someone else).
            Ok(_) => Err(anyhow!(
                "the freeze of {place} did not last for the whole operation: its guardian thawed it after {limit:?}"
            )),
            Err(Errno::EINVAL) => Err(anyhow!(
                "the freeze of {place} did not last for the whole operation: it was thawed before the operation ended (its guardian's limit, {limit:?}, passed)"
            )),
            Err(errno) => Err(errno).with_context(|| format!("thawing {place}")),
        }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if self.guardian.is_some() {
            if let Err(error) = self.thaw_once() {
                tracing::warn!("{error:#}");
            }
        }
    }
}

impl Guardian {
    /// Sends the stand-down byte and waits for the guardian to end; its
    /// exit status, when it exited.
    fn stand_down(self) -> Option<libc::c_int> {
        // Any other failure is EPIPE (the Rust runtime ignores SIGPIPE):
        // the guardian ended already, its limit passed; its status says so.
        while let Err(Errno::EINTR) = nix::unistd::write(&self.stand_down, &[1]) {}
        // Closed before the wait, so that a guardian that somehow missed
        // the byte sees end of file instead of waiting for its limit.
        drop(self.stand_down);
        let mut status: libc::c_int = 0;
        loop {
            // SAFETY: the guardian is our child and not yet reaped (only
            // this function waits for it, once); `status` outlives the call.
            let reaped = unsafe { libc::waitpid(self.pid, &mut status, 0) };
            if reaped == self.pid {
                break;
            }
            if reaped < 0 && Errno::last() == Errno::EINTR {
                continue;
            }
            // ECHILD: reaped by someone else (SIGCHLD ignored).
            return None;
        }
        libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status))
    }
}

/// The guardian: waits for the stand-down byte on `stand_down` until
/// `limit_ms` has passed, and thaws the file system open as `directory`
/// unless the byte came. Runs in the child of a `fork` of a process that
/// may have other threads: async-signal-safe system calls only, no
/// allocation, nothing that can panic, and it closes nothing but its copy
/// of the write end.
fn guard(directory: RawFd, stand_down: RawFd, its_write_end: RawFd, limit_ms: i64) -> ! {
    // SAFETY: each call below is an async-signal-safe system call on
    // descriptors this process holds (`directory` and `stand_down` stay
    // open until `_exit`), with pointers to locals that outlive the call.
    unsafe {
        // Our copy of the write end would keep the pipe open after the
        // caller died: end of file would never come. Other descriptors we
        // inherited stay open until we exit, among them the write ends of
        // freezes the caller holds on other file systems; their guardians
        // still see end of file when the caller dies, since we exit then.
        libc::close(its_write_end);
        // A signal to the caller's process group or session (Ctrl-C in its
        // terminal, a kill of its group, the terminal hanging up) must not
        // reach the one process that thaws after it. The stop signals sent
        // to this process by pid are ignored for the same reason: it ends
        // on its own within the limit.
        libc::setsid();
        for signal in [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGTERM] {
            libc::signal(signal, libc::SIG_IGN);
        }
        let deadline = monotonic_ms().saturating_add(limit_ms);
        loop {
            let remaining = deadline.saturating_sub(monotonic_ms());
            if remaining <= 0 {
                break;
            }
            let mut ready = libc::pollfd {
                fd: stand_down,
                events: libc::POLLIN,
                revents: 0,
            };
            let timeout = remaining.min(i64::from(libc::c_int::MAX)) as libc::c_int;
            let polled = libc::poll(&mut ready, 1, timeout);
            if polled == 0 || (polled < 0 && Errno::last() == Errno::EINTR) {
                continue;
            }
            if polled < 0 {
                // Unable to watch the caller: thawing early costs it a
                // failed operation, staying frozen could hang the node.
                break;
            }
            let mut byte = 0u8;
            let read = libc::read(stand_down, (&mut byte as *mut u8).cast(), 1);
            if read == 1 {
                libc::_exit(STOOD_DOWN);
            }
            if read < 0 && Errno::last() == Errno::EINTR {
                continue;
            }
            // End of file: the caller died (or dropped us without standing
            // us down).
            break;
        }
        let status = match libc::ioctl(directory, FITHAW, 0) {
            0 => THAWED,
            _ => FOUND_THAWED,
        };
        libc::_exit(status)
    }
}

/// Milliseconds of `CLOCK_MONOTONIC` (async-signal-safe, unlike `Instant`'s
/// guarantees on paper).
fn monotonic_ms() -> i64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `now`, which outlives
    // the call; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec
        .saturating_mul(1000)
        .saturating_add(now.tv_nsec / 1_000_000)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::freeze;

    #[test]
    fn a_path_that_is_no_directory_is_refused_before_anything_starts() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let error = freeze(file.path(), 0, Duration::from_secs(1)).unwrap_err();
        assert!(format!("{error:#}").contains("opening"), "{error:#}");
        let error = freeze(&file.path().join("missing"), 0, Duration::from_secs(1)).unwrap_err();
        assert!(format!("{error:#}").contains("opening"), "{error:#}");
    }
}
