//! Puts the planned files and links into the output directory. systemd
//! hands a generator empty directories and reads nothing of them before it
//! exits, but a generator killed part way still leaves what it wrote: a
//! link is made in one step, a file is created under a temporary name
//! (`O_EXCL`), written with one write and renamed; each directory is made
//! once. Only a repeated run (by hand, tests) finds outputs already there,
//! and those are replaced whole. systemd never reads half a drop-in. No
//! fsync: the output lives on /run (tmpfs) and is made anew at every boot
//! and daemon-reload.

use std::collections::HashSet;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::symlink;
use std::path::Path;

use anyhow::{Context, Result};

use crate::units::{Output, Outputs};

pub fn write_all(dir: &Path, outputs: &Outputs) -> Result<()> {
    let mut made_directories = HashSet::new();
    for (relative, output) in outputs {
        let path = dir.join(relative);
        if let Some((parent, _)) = relative.rsplit_once('/') {
            if made_directories.insert(parent) {
                let parent = dir.join(parent);
                fs::create_dir_all(&parent)
                    .with_context(|| format!("creating directory {}", parent.display()))?;
            }
        }
        match output {
            Output::File(text) => {
                write_whole(&path, text).with_context(|| format!("writing {}", path.display()))?
            }
            Output::Symlink(target) => make(&path, |at| symlink(target, at))
                .with_context(|| format!("linking {} to {}", path.display(), target.display()))?,
        }
    }
    Ok(())
}

/// Makes `path` with `make`, which must fail if something is already there.
fn make(path: &Path, make: impl Fn(&Path) -> io::Result<()>) -> io::Result<()> {
    match make(path) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => replace(path, make),
        other => other,
    }
}

/// A file appears under its name only whole: written under a temporary
/// name, then renamed (a generator killed between its create and its
/// write would otherwise leave an empty drop-in that systemd reads).
fn write_whole(path: &Path, text: &str) -> io::Result<()> {
    let temp = temporary_name(path);
    match write_new(&temp, text) {
        Ok(()) => fs::rename(&temp, path).inspect_err(|_| {
            let _ = fs::remove_file(&temp);
        }),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            replace(path, |at| write_new(at, text))
        }
        Err(e) => Err(e),
    }
}

fn temporary_name(path: &Path) -> std::path::PathBuf {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    path.with_file_name(format!(".{name}.tmp"))
}

/// A new file holding `text`, or none.
fn write_new(path: &Path, text: &str) -> io::Result<()> {
    let mut file = OpenOptions::new().write(true).create_new(true).open(path)?;
    file.write_all(text.as_bytes()).inspect_err(|_| {
        let _ = fs::remove_file(path);
    })
}

/// Makes `path` with `make` under a temporary name, then renames it over
/// what is there.
fn replace(path: &Path, make: impl Fn(&Path) -> io::Result<()>) -> io::Result<()> {
    let temp = temporary_name(path);
    match fs::remove_file(&temp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    make(&temp)?;
    fs::rename(&temp, path).inspect_err(|_| {
        let _ = fs::remove_file(&temp);
    })
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
    }
}
