//! Puts the planned files and links into the output directory. systemd
//! hands a generator empty directories and reads nothing of them before it
//! exits, but a generator killed part way still leaves what it wrote, so:
//! every file is written before any link, a link is made in one step, and
//! a file is created (`O_EXCL`) and written with one write of a few hundred
//! bytes, which a kill does not cut in two on a tmpfs. A kill between a
//! drop-in's create and its write leaves it empty, but then no link pulls
//! its unit in: the volume is not started at that boot, as if the
//! generator had not reached it, and never started without its ordering.
//! Each directory is made once. Only a repeated run (by hand, tests) finds
//! outputs already there, and replaces them whole (under a temporary name,
//! then renamed). No fsync: the output lives on /run (tmpfs) and is made
//! anew at every boot and daemon-reload.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::{Context, Result};
use nix::errno::Errno;
use nix::fcntl::renameat;
use nix::sys::stat::{mkdirat, Mode};
use nix::unistd::{symlinkat, unlinkat, UnlinkatFlags};
use sparse_volume::kernel::files::create_new_at;

use crate::units::{Output, Outputs};

pub fn write_all(dir: &Path, outputs: &Outputs) -> Result<()> {
    if outputs.is_empty() {
        return Ok(());
    }
    // Every call below names its path relative to the output directory, so
    // the kernel does not walk from / down to it twice per volume.
    fs::create_dir_all(dir).with_context(|| format!("creating directory {}", dir.display()))?;
    let dir_handle = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)
        .with_context(|| format!("opening directory {}", dir.display()))?;
    let at = dir_handle.as_raw_fd();
    let mut made_directories = HashSet::new();
    // Files first: a link must never pull in a unit whose drop-in is not
    // written yet.
    let files = outputs.iter().filter(|(_, o)| matches!(o, Output::File(_)));
    let links = outputs
        .iter()
        .filter(|(_, o)| matches!(o, Output::Symlink(_)));
    for (relative, output) in files.chain(links) {
        if let Some((parent, _)) = relative.rsplit_once('/') {
            if made_directories.insert(parent) {
                make_directory(at, parent).with_context(|| {
                    format!("creating directory {}", dir.join(parent).display())
                })?;
            }
        }
        match output {
            Output::File(text) => write_whole(at, relative, text)
                .with_context(|| format!("writing {}", dir.join(relative).display()))?,
            Output::Symlink(target) => make(at, relative, |name| {
                Ok(symlinkat(target.as_path(), Some(at), name)?)
            })
            .with_context(|| {
                format!(
                    "linking {} to {}",
                    dir.join(relative).display(),
                    target.display()
                )
            })?,
        }
    }
    Ok(())
}

fn make_directory(at: RawFd, relative: &str) -> io::Result<()> {
    match mkdirat(Some(at), relative, Mode::from_bits_truncate(0o755)) {
        // A repeated run; a file in the way fails at the first write into it.
        Ok(()) | Err(Errno::EEXIST) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Makes `relative` with `make`, which must fail if something is already
/// there.
fn make(at: RawFd, relative: &str, make: impl Fn(&str) -> io::Result<()>) -> io::Result<()> {
    match make(relative) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => replace(at, relative, make),
        other => other,
    }
}

/// A file made with one write (see the module's comment); one already
/// there (a repeated run) is replaced whole, under a temporary name.
fn write_whole(at: RawFd, relative: &str, text: &str) -> io::Result<()> {
    make(at, relative, |name| write_new(at, name, text))
}

fn temporary_name(relative: &str) -> String {
    match relative.rsplit_once('/') {
        Some((parent, name)) => [parent, "/.", name, ".tmp"].concat(),
        None => [".", relative, ".tmp"].concat(),
    }
}

/// A new file holding `text`, or none.
fn write_new(at: RawFd, relative: &str, text: &str) -> io::Result<()> {
    let file = create_new_at(at, relative, 0o644)?;
    io::Write::write_all(&mut &file, text.as_bytes()).inspect_err(|_| {
        let _ = unlinkat(Some(at), relative, UnlinkatFlags::NoRemoveDir);
    })
}

/// Makes `relative` with `make` under a temporary name, then renames it
/// over what is there.
fn replace(at: RawFd, relative: &str, make: impl Fn(&str) -> io::Result<()>) -> io::Result<()> {
    let temp = temporary_name(relative);
    match unlinkat(Some(at), temp.as_str(), UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => {}
        Err(e) => return Err(e.into()),
    }
    make(&temp)?;
    Ok(
        renameat(Some(at), temp.as_str(), Some(at), relative).inspect_err(|_| {
            let _ = unlinkat(Some(at), temp.as_str(), UnlinkatFlags::NoRemoveDir);
        })?,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn writes_files_and_links_and_can_repeat() {
        let dir = tempfile::tempdir().unwrap();
        let mut outputs = Outputs::new();
        outputs.insert(
            "a.target.wants/b.service".to_string(),
            Output::Symlink(PathBuf::from("/usr/lib/systemd/system/b.service")),
        );
        outputs.insert(
            "b.service.d/x.conf".to_string(),
            Output::File("[Unit]\n".into()),
        );
        for _ in 0..2 {
            write_all(dir.path(), &outputs).unwrap();
        }
        assert_eq!(
            fs::read_link(dir.path().join("a.target.wants/b.service")).unwrap(),
            PathBuf::from("/usr/lib/systemd/system/b.service")
        );
        assert_eq!(
            fs::read_to_string(dir.path().join("b.service.d/x.conf")).unwrap(),
            "[Unit]\n"
        );
        let names: Vec<_> = fs::read_dir(dir.path().join("a.target.wants"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["b.service"], "no temporary file is left behind");
    }

    #[test]
    fn a_repeated_run_replaces_what_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let drop_in = "b.service.d/x.conf".to_string();
        let link = "a.target.wants/b.service".to_string();
        for (text, target) in [("[Unit]\n", "/old"), ("[Service]\n", "/new")] {
            let mut outputs = Outputs::new();
            outputs.insert(drop_in.clone(), Output::File(text.into()));
            outputs.insert(link.clone(), Output::Symlink(PathBuf::from(target)));
            write_all(dir.path(), &outputs).unwrap();
        }
        assert_eq!(
            fs::read_to_string(dir.path().join(&drop_in)).unwrap(),
            "[Service]\n"
        );
        assert_eq!(
            fs::read_link(dir.path().join(&link)).unwrap(),
            PathBuf::from("/new")
        );
    }

    #[test]
    fn a_file_in_the_way_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let not_a_dir = dir.path().join("file");
        fs::write(&not_a_dir, "").unwrap();
        let mut outputs = Outputs::new();
        outputs.insert("x.d/y.conf".to_string(), Output::File(String::new()));
        let err = write_all(&not_a_dir, &outputs).unwrap_err();
        assert!(format!("{err:#}").contains("creating directory"), "{err:#}");
        // A file where a drop-in directory belongs.
        fs::remove_file(&not_a_dir).unwrap();
        fs::create_dir(&not_a_dir).unwrap();
        fs::write(not_a_dir.join("x.d"), "").unwrap();
        let err = write_all(&not_a_dir, &outputs).unwrap_err();
        assert!(format!("{err:#}").contains("writing"), "{err:#}");
        assert_eq!(fs::read_to_string(not_a_dir.join("x.d")).unwrap(), "");
    }
}
