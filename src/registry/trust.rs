//! Who may change the registry. Its files decide what root attaches at
//! boot, so a file or directory that anyone but root can change is refused
//! (the same rule as for backing files): with a one-line reason that names
//! the owner and mode found and the commands that fix it.

use std::ffi::OsStr;
use std::fs::{self, File, Metadata, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use nix::fcntl::OFlag;

use super::error::RegistryError;
use crate::kernel::files::open_in;

/// A registry file's bytes, and why they must not be acted on, if so.
pub struct Contents {
    /// Empty when the file was not read (a link or a special file).
    pub bytes: Vec<u8>,
    pub refused: Option<String>,
}

/// Root, and the user running us when that is not root (tests, packaging
/// builds): such a run cannot do root's work, so its own files are as
/// trustworthy as it is.
fn trusted_owner(uid: u32) -> bool {
    uid == 0 || uid == nix::unistd::geteuid().as_raw()
}

fn owner(uid: u32) -> String {
    match nix::unistd::User::from_uid(uid.into()) {
        Ok(Some(user)) => format!("uid {uid} ({})", user.name),
        _ => format!("uid {uid}"),
    }
}

/// Why someone other than root can change `path`, if they can: one
/// clause with the owner and mode found and the fix.
fn untrusted(path: &Path, meta: &Metadata) -> Option<String> {
    if trusted_owner(meta.uid()) && meta.mode() & 0o022 == 0 {
        return None;
    }
    Some(format!(
        "writable by someone other than root (owner {}, mode {:04o}); fix: chown root: {p}; chmod go-w {p}",
        owner(meta.uid()),
        meta.mode() & 0o7777,
        p = path.display()
    ))
}

/// A registry directory anyone but root can change (anyone who can
/// rename files in it can replace every file it holds). A missing
/// directory is no problem: it holds nothing.
pub fn check_directory(dir: &Path) -> Option<RegistryError> {
    untrusted_directory(dir, &fs::metadata(dir).ok()?)
}

/// [`check_directory`] of a directory whose metadata is in hand (taken
/// without following a link where a link is no directory either).
pub fn untrusted_directory(dir: &Path, meta: &Metadata) -> Option<RegistryError> {
    if !meta.is_dir() {
        return Some(RegistryError::untrusted(dir, "refused: not a directory"));
    }
    untrusted(dir, meta).map(|reason| RegistryError::new(dir, None, format!("refused: {reason}")))
}

/// The error of a file in a refused directory: it names the directory,
/// whose fix is the operator's job.
pub fn in_refused_directory(file: &Path, directory: &RegistryError) -> RegistryError {
    RegistryError::untrusted(
        file,
        format!(
            "refused: its directory {} is {}",
            directory.file.display(),
            directory
                .reason
                .strip_prefix("refused: ")
                .unwrap_or(&directory.reason)
        ),
    )
}

/// Reads a registry file without following a symbolic link and checks
/// the file it opened (not the path, which could change in between).
/// A refused regular file is still read: what it names is somebody's
/// data even when the entry is not trusted.
/// Far above any real volume or config file (a few hundred bytes), and
/// above the 10 MiB files the bad-input corpus feeds in.
const MAX_REGISTRY_FILE_BYTES: u64 = 64 << 20;

pub fn read(file: &Path) -> io::Result<Contents> {
    read_opened(
        file,
        OpenOptions::new()
            .read(true)
            .custom_flags(OPEN_FLAGS.bits())
            .open(file),
    )
}

/// [`read`] of `name` in the directory open as `dir` (whose path joined
/// with `name` is `file`, for messages): one name looked up, not a path.
pub fn read_in(dir: &File, name: &OsStr, file: &Path) -> io::Result<Contents> {
    read_opened(file, open_in(dir, name, OFlag::O_RDONLY | OPEN_FLAGS))
}

/// No symbolic link, and O_NONBLOCK: a FIFO planted in the registry must
/// not hang boot.
const OPEN_FLAGS: OFlag = OFlag::O_CLOEXEC
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_NONBLOCK);

fn read_opened(file: &Path, opened: io::Result<File>) -> io::Result<Contents> {
    let mut handle = match opened {
        Ok(handle) => handle,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Ok(Contents {
                bytes: Vec::new(),
                refused: Some(format!(
                    "refused: a symbolic link (its target's directory may be writable by others); fix: cp --remove-destination \"$(readlink -f {p})\" {p}",
                    p = file.display()
                )),
            })
        }
        Err(e) => return Err(e),
    };
    let meta = handle.metadata()?;
    if meta.is_dir() {
        // What reading it would have said.
        return Err(io::Error::from_raw_os_error(libc::EISDIR));
    }
    if !meta.is_file() {
        return Ok(Contents {
            bytes: Vec::new(),
            refused: Some("refused: not a regular file".to_string()),
        });
    }
    // One read of one byte more than the metadata in hand says, never past
    // the cap (a sparse 10 TB file must be one unreadable entry, not an
    // aborted boot): a regular file that gives exactly its size has no
    // more, so the read that would say so is not made (the generator reads
    // thousands of these at every boot). A file that changed meanwhile, or
    // a short read, is read on to its end.
    let expected = meta.len().min(MAX_REGISTRY_FILE_BYTES) as usize;
    let mut bytes = vec![0; expected + 1];
    let first = loop {
        match handle.read(&mut bytes) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => break other?,
        }
    };
    bytes.truncate(first);
    if first != expected {
        (&mut handle)
            .take(MAX_REGISTRY_FILE_BYTES + 1 - first as u64)
            .read_to_end(&mut bytes)?;
    }
    if bytes.len() as u64 > MAX_REGISTRY_FILE_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {} MiB", MAX_REGISTRY_FILE_BYTES >> 20),
        ));
    }
    Ok(Contents {
        bytes,
        refused: untrusted(file, &meta).map(|reason| format!("refused: {reason}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_huge_sparse_file_is_an_error_not_an_abort() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("huge.toml");
        std::fs::File::create(&file)
            .unwrap()
            .set_len(1 << 40)
            .unwrap();
        let error = read(&file).err().expect("a 1 TiB file was read");
        assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{error}");
    }

    #[test]
    fn group_or_world_writable_files_are_refused_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("v.toml");
        fs::write(&file, "x").unwrap();
        fs::set_permissions(&file, fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(read(&file).unwrap().refused, None);
        for mode in [0o664, 0o646, 0o666] {
            fs::set_permissions(&file, fs::Permissions::from_mode(mode)).unwrap();
            let contents = read(&file).unwrap();
            let reason = contents.refused.expect("refused");
            assert!(reason.contains(&format!("mode {mode:04o}")), "{reason}");
            assert!(reason.contains(&format!("chmod go-w {}", file.display())));
            assert_eq!(contents.bytes, b"x");
        }
    }

    #[test]
    fn links_and_special_files_are_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        fs::write(&target, "x").unwrap();
        let link = dir.path().join("link.toml");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let contents = read(&link).unwrap();
        assert!(contents.refused.unwrap().contains("symbolic link"));
        assert!(contents.bytes.is_empty());
        let fifo = dir.path().join("fifo.toml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(read(&fifo).unwrap().refused.unwrap().contains("regular"));
    }

    #[test]
    fn directories_writable_by_others_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(check_directory(dir.path()), None);
        assert_eq!(check_directory(&dir.path().join("missing")), None);
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o1777)).unwrap();
        let error = check_directory(dir.path()).expect("refused");
        assert!(error.reason.contains("mode 1777"), "{error}");
        let inside = in_refused_directory(&dir.path().join("a.toml"), &error);
        assert!(
            inside.reason.starts_with(&format!(
                "refused: its directory {} is writable",
                dir.path().display()
            )),
            "{inside}"
        );
    }
}
