//! Puts the planned files and links into the output directory, each one
//! whole or not at all: it is made under a temporary name and renamed into
//! place, so systemd never reads half a drop-in. No fsync: the output lives
//! on /run (tmpfs) and is made anew at every boot and daemon-reload.

use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::Path;

use anyhow::{Context, Result};

use crate::units::{Output, Outputs};

pub fn write_all(dir: &Path, outputs: &Outputs) -> Result<()> {
    for (relative, output) in outputs {
        let path = dir.join(relative);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)
                .with_context(|| format!("creating directory {}", parent.display()))?;
        }
        match output {
            Output::File(text) => replace(&path, |temp| fs::write(temp, text))
                .with_context(|| format!("writing {}", path.display()))?,
            Output::Symlink(target) => replace(&path, |temp| symlink(target, temp))
                .with_context(|| format!("linking {} to {}", path.display(), target.display()))?,
        }
    }
    Ok(())
}

/// Makes `path` with `make` under a temporary name, then renames it over
/// whatever is there (systemd hands generators empty directories, but a
/// run by hand may repeat itself).
fn replace(path: &Path, make: impl FnOnce(&Path) -> io::Result<()>) -> io::Result<()> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let temp = path.with_file_name(format!(".{name}.tmp"));
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
            PathBuf::from("a.target.wants/b.service"),
            Output::Symlink(PathBuf::from("/usr/lib/systemd/system/b.service")),
        );
        outputs.insert(
            PathBuf::from("b.service.d/x.conf"),
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
    fn a_file_in_the_way_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let not_a_dir = dir.path().join("file");
        fs::write(&not_a_dir, "").unwrap();
        let mut outputs = Outputs::new();
        outputs.insert(PathBuf::from("x.d/y.conf"), Output::File(String::new()));
        let err = write_all(&not_a_dir, &outputs).unwrap_err();
        assert!(format!("{err:#}").contains("creating directory"), "{err:#}");
    }
}
