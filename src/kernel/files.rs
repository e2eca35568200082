//! File primitives the registry and the engine rely on: atomic
//! replacement of a file, durable renames, and exclusive advisory locks.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use nix::errno::Errno;
use nix::fcntl::{openat, Flock, FlockArg, OFlag};

/// Replaces `path` with `contents` so that a reader (or a crash) sees either
/// the old file or the new one, never a mix: write a temporary file in the
/// same directory, fsync it, rename it over the target, fsync the directory.
pub fn write_atomically(path: &Path, contents: &[u8], mode: u32) -> Result<()> {
    replace(path, contents, mode, true)
}

/// [`write_atomically`] for files under /run, which a reboot removes
/// anyway: readers see the old file or the new one, and nothing is
/// forced to disk (the unit writes one at every attach).
pub fn replace_for_readers(path: &Path, contents: &[u8], mode: u32) -> Result<()> {
    replace(path, contents, mode, false)
}

fn replace(path: &Path, contents: &[u8], mode: u32, durable: bool) -> Result<()> {
    let dir = parent_dir(path)?;
    // Hidden temporary name: registry readers skip dot files, and `check`
    // can recognise leftovers of an interrupted write.
    let mut temp = tempfile::Builder::new()
        .prefix(".")
        .suffix(".tmp")
        .tempfile_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    temp.as_file()
        .set_permissions(fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of a temporary file in {}", dir.display()))?;
    temp.write_all(contents)
        .and_then(|()| match durable {
            true => temp.as_file().sync_all(),
            false => Ok(()),
        })
        .with_context(|| format!("writing a temporary file in {}", dir.display()))?;
    temp.persist(path)
        .map_err(|e| e.error)
        .with_context(|| format!("renaming a temporary file to {}", path.display()))?;
    if durable {
        sync_dir(dir)?;
    }
    Ok(())
}

/// A file without a name in `directory` (`O_TMPFILE`), open for reading
/// and writing: whatever happens to the process, it vanishes unless
/// [`name_unnamed`] gives it a name.
pub fn unnamed_file_in(directory: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
        .open(directory)
        .with_context(|| format!("making an unnamed file in {}", directory.display()))
}

/// Gives a file made by [`unnamed_file_in`] the name `path` (in the same
/// directory), durably; never replaces a file (`EEXIST`).
pub fn name_unnamed(file: &File, path: &Path) -> Result<()> {
    let descriptor = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    nix::unistd::linkat(
        None,
        descriptor.as_path(),
        None,
        path,
        nix::fcntl::AtFlags::AT_SYMLINK_FOLLOW,
    )
    .with_context(|| format!("naming {}", path.display()))?;
    sync_dir(parent_dir(path)?)
}

/// Creates `relative` (which must not exist) in the directory open as
/// `dir`, for writing: a path looked up from that directory, not from /.
pub fn create_new_at(dir: RawFd, relative: &str, mode: u32) -> std::io::Result<File> {
    let fd = openat(
        Some(dir),
        relative,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::from_bits_truncate(mode),
    )?;
    // SAFETY: openat returned a new descriptor that nothing else owns.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Opens `name` in the directory open as `dir` with `flags` (and
/// `O_CLOEXEC`): the kernel looks up one name instead of walking a whole
/// path, which the generator does for thousands of files at every boot.
pub fn open_in(dir: &File, name: &std::ffi::OsStr, flags: OFlag) -> std::io::Result<File> {
    let fd = openat(
        Some(std::os::fd::AsRawFd::as_raw_fd(dir)),
        name,
        flags | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    // SAFETY: openat returned a new descriptor that nothing else owns.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// A file that lives in memory only and goes with its last descriptor
/// (never on a disk, never in a directory), and the path another process
/// opens it by while this one holds it.
pub fn memory_file(name: &str) -> Result<(File, PathBuf)> {
    let name = std::ffi::CString::new(name).context("a memory file's name")?;
    let fd = nix::sys::memfd::memfd_create(&name, nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC)
        .context("making a memory file (memfd_create)")?;
    let path = PathBuf::from(format!(
        "/proc/{}/fd/{}",
        std::process::id(),
        fd.as_raw_fd()
    ));
    Ok((File::from(fd), path))
}

/// Makes a rename or unlink in `dir` durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing directory {}", dir.display()))
}

fn parent_dir(path: &Path) -> Result<&Path> {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .with_context(|| format!("{} has no parent directory", path.display()))
}

/// Opens (creating) a lock file: never through a link, and only a regular
/// file of ours.
fn open_lock_file(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => anyhow!(
                "refused: it is a symbolic link; if no sparse-volume command runs, remove it: rm {}",
                path.display()
            ),
            _ => e.into(),
        })
        .and_then(|file| {
            let meta = file.metadata()?;
            if !meta.is_file() {
                bail!(
                    "refused: not a regular file; if no sparse-volume command runs, remove it: rm {}",
                    path.display()
                );
            }
            if meta.uid() != nix::unistd::geteuid().as_raw() {
                bail!(
                    "refused: owned by uid {}, not by us; if no sparse-volume command runs, remove it: rm {}",
                    meta.uid(),
                    path.display()
                );
            }
            Ok(file)
        })
        .with_context(|| format!("opening lock file {}", path.display()))
}

/// Who holds the `flock` on `file`, from `/proc/locks`: "process PID
/// (its command name)", or "another process" when that cannot be read.
fn holder_of(file: &File) -> String {
    let Ok(meta) = file.metadata() else {
        return "another process".into();
    };
    // /proc/locks names a file as MAJOR:MINOR:INODE, the numbers in hex,
    // hex and decimal.
    let wanted = format!(
        "{:02x}:{:02x}:{}",
        libc::major(meta.dev()),
        libc::minor(meta.dev()),
        meta.ino()
    );
    let locks = fs::read_to_string("/proc/locks").unwrap_or_default();
    let pid = locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // "1: FLOCK ADVISORY WRITE PID DEV:INO 0 EOF"; waiters have "->".
        (fields.get(1) == Some(&"FLOCK") && fields.get(5) == Some(&wanted.as_str()))
            .then(|| fields.get(4).map(|pid| pid.to_string()))
            .flatten()
    });
    let Some(pid) = pid else {
        return "another process".into();
    };
    // The command name, not the whole command line: reading a process's
    // cmdline takes its memory map's lock, which a busy or stuck process
    // may hold for long; comm is kept apart from it.
    match fs::read_to_string(format!("/proc/{pid}/comm")) {
        Ok(name) if !name.trim().is_empty() => format!("process {pid} ({})", name.trim()),
        _ => format!("process {pid}"),
    }
}

/// An exclusive `flock` held for as long as the value lives.
#[derive(Debug)]
pub struct ExclusiveLock {
    lock: Flock<File>,
    path: PathBuf,
}

impl ExclusiveLock {
    /// Blocks until the lock on `path` (created if missing, in a directory
    /// that must exist) is ours. The holder writes notes into the file, so
    /// a link or a file somebody else made in its place is refused, never
    /// followed or truncated.
    pub fn acquire(path: &Path) -> Result<Self> {
        Self::acquire_within(path, None, |_| {})
    }

    /// [`ExclusiveLock::acquire`] that, when the lock is taken, first tells
    /// `waiting` once who holds it, and with a `limit` gives up after that
    /// long with an error that names the holder.
    pub fn acquire_within(
        path: &Path,
        limit: Option<Duration>,
        waiting: impl FnOnce(&str),
    ) -> Result<Self> {
        let file = open_lock_file(path)?;
        let file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(Self::held(lock, path)),
            Err((file, Errno::EWOULDBLOCK)) => file,
            Err((_, errno)) => {
                return Err(errno).with_context(|| format!("locking {}", path.display()))
            }
        };
        // Counted from the first refusal, so the time the holder's name
        // takes to read is part of the bound.
        let started = Instant::now();
        let holder = holder_of(&file);
        waiting(&holder);
        let Some(limit) = limit else {
            let lock = Flock::lock(file, FlockArg::LockExclusive)
                .map_err(|(_, errno)| errno)
                .with_context(|| format!("locking {}", path.display()))?;
            return Ok(Self::held(lock, path));
        };
        // Polled, since a blocking flock cannot be given a deadline.
        let deadline = started + limit;
        let mut file = file;
        let mut pause = Duration::from_millis(1);
        loop {
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => return Ok(Self::held(lock, path)),
                Err((returned, Errno::EWOULDBLOCK)) if Instant::now() < deadline => {
                    file = returned;
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                Err((_, Errno::EWOULDBLOCK)) => bail!(
                    "gave up waiting for {} after {} s: still held by {holder}",
                    path.display(),
                    limit.as_secs()
                ),
                Err((_, errno)) => {
                    return Err(errno).with_context(|| format!("locking {}", path.display()))
                }
            }
        }
    }

    /// The lock on `path` if nobody holds it now; None if somebody does.
    pub fn try_acquire(path: &Path) -> Result<Option<Self>> {
        match Flock::lock(open_lock_file(path)?, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(Some(Self::held(lock, path))),
            Err((_, Errno::EWOULDBLOCK)) => Ok(None),
            Err((_, errno)) => Err(errno).with_context(|| format!("locking {}", path.display())),
        }
    }

    fn held(lock: Flock<File>, path: &Path) -> Self {
        Self {
            lock,
            path: path.to_path_buf(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The locked file, open for reading and writing: a note kept in it is
    /// read and written only by the holder of the lock.
    pub fn file(&self) -> &File {
        &self.lock
    }
}

/// Starts writing `length` bytes of `file` from `offset` back to disk
/// without waiting (`sync_file_range` with `SYNC_FILE_RANGE_WRITE`), so a
/// long write overlaps its own write-back. Only a hint: it guarantees
/// nothing, and an error is left for the `fsync` that must follow.
pub fn start_write_back(file: &File, offset: u64, length: usize) {
    let (Ok(offset), Ok(length)) = (i64::try_from(offset), i64::try_from(length)) else {
        return;
    };
    // SAFETY: the descriptor is open for the call's duration, and the
    // call only reads its arguments.
    unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            offset,
            length,
            libc::SYNC_FILE_RANGE_WRITE,
        );
    }
}

/// A sequential writer into `file` that starts the write-back of each
/// `WRITE_BEHIND_STEP` written ([`start_write_back`]), so that the disk
/// writes while the data is still produced and the `fsync` that makes the
/// file durable finds little left.
pub struct WriteBehind<'a> {
    file: &'a File,
    written: u64,
    /// Where the write-back was last started up to.
    started: u64,
}

/// How much is written between two write-back starts.
const WRITE_BEHIND_STEP: u64 = 32 << 20;

impl<'a> WriteBehind<'a> {
    pub fn new(file: &'a File) -> Self {
        Self {
            file,
            written: 0,
            started: 0,
        }
    }
}

impl Write for WriteBehind<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let wrote = (&mut &*self.file).write(buf)?;
        self.written += wrote as u64;
        let pending = self.written - self.started;
        if pending >= WRITE_BEHIND_STEP {
            if let Ok(length) = usize::try_from(pending) {
                start_write_back(self.file, self.started, length);
            }
            self.started = self.written;
        }
        Ok(wrote)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        (&mut &*self.file).flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_leaves_no_temporary_file() {
        type Write = fn(&Path, &[u8], u32) -> Result<()>;
        for write in [write_atomically as Write, replace_for_readers] {
            let dir = tempfile::tempdir().unwrap();
            let target = dir.path().join("v.toml");
            write(&target, b"one", 0o644).unwrap();
            write(&target, b"two", 0o600).unwrap();
            assert_eq!(fs::read(&target).unwrap(), b"two");
            let mode = fs::metadata(&target).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
            let names: Vec<_> = fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(names, vec![std::ffi::OsString::from("v.toml")]);
        }
    }

    #[test]
    fn lock_excludes_a_second_holder_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let held = ExclusiveLock::acquire(&path).unwrap();
        let probe = File::open(&path).unwrap();
        let busy = Flock::lock(probe, FlockArg::LockExclusiveNonblock);
        let probe = match busy {
            Ok(_) => panic!("a second exclusive lock was granted"),
            Err((file, _)) => file,
        };
        drop(held);
        assert!(Flock::lock(probe, FlockArg::LockExclusiveNonblock).is_ok());
    }

    #[test]
    fn a_lock_file_that_is_a_link_or_not_a_file_is_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        fs::write(&target, "data").unwrap();
        let link = dir.path().join("link.lock");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let refused = ExclusiveLock::acquire(&link).unwrap_err();
        assert!(
            format!("{refused:#}").contains("symbolic link"),
            "{refused:#}"
        );
        assert_eq!(fs::read(&target).unwrap(), b"data");
        let fifo = dir.path().join("fifo.lock");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let refused = ExclusiveLock::acquire(&fifo).unwrap_err();
        assert!(
            format!("{refused:#}").contains("not a regular file"),
            "{refused:#}"
        );
    }
}
