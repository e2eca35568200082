//! Exit codes of the generator's invocations: 2 for usage errors, 1 only
//! when the output directory cannot be written, 0 otherwise.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn generator(root: &Path, args: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sparse-volume-generator"))
        .args(args)
        .env("SPARSE_VOLUME_ROOT", root)
        .output()
        .expect("running sparse-volume-generator")
}

/// A fixture with enabled volumes, so that there is something to write.
fn registry_with_volumes() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/03-both-modes")
}

#[test]
fn wrong_number_of_directories_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for args in [&[][..], &[d, d], &[d, d, d, d]] {
        let out = generator(&registry_with_volumes(), args);
        assert_eq!(out.status.code(), Some(2), "{} arguments", args.len());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("usage: sparse-volume-generator"),
            "{stderr}"
        );
        assert!(
            std::fs::read_dir(d).unwrap().next().is_none(),
            "a usage error wrote output"
        );
    }
}

#[test]
fn options_are_usage_errors_except_help() {
    let out = generator(&registry_with_volumes(), &[Path::new("--bogus")]);
    assert_eq!(out.status.code(), Some(2));
    let out = generator(&registry_with_volumes(), &[Path::new("--help")]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("usage:"));
}

#[test]
fn one_or_three_directories_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let dirs: Vec<PathBuf> = ["a", "b", "c"].iter().map(|n| dir.path().join(n)).collect();
    for d in &dirs {
        std::fs::create_dir(d).unwrap();
    }
    let all: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();
    for args in [&all[..1], &all[..]] {
        let out = generator(&registry_with_volumes(), args);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        assert!(dirs[0].join("sparse-volumes.target.wants").is_dir());
    }
}

#[test]
fn unwritable_output_directory_fails() {
    let dir = tempfile::tempdir().unwrap();
    // Tests run as root, so permissions would not stop us: a regular file
    // where the directory should be does.
    let not_a_dir = dir.path().join("file");
    std::fs::write(&not_a_dir, "").unwrap();
    let out = generator(
        &registry_with_volumes(),
        &[&not_a_dir, &not_a_dir, &not_a_dir],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("writing units to"), "{stderr}");
}

#[test]
fn nothing_to_write_needs_no_writable_directory() {
    let empty_root = tempfile::tempdir().unwrap();
    let out = generator(empty_root.path(), &[Path::new("/nonexistent/normal")]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(!Path::new("/nonexistent").exists());
}

#[test]
fn with_one_directory_the_masks_go_there_too() {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/23-replaced-unit");
    let out = generator(&root, &[dir.path()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let mask = dir
        .path()
        .join("metalk8s-sparse-volume@5d0e4c1a-7b2f-4e8a-9c3d-1f6a2b8e4d70.service");
    assert_eq!(
        std::fs::read_link(&mask).ok(),
        Some(PathBuf::from("/dev/null"))
    );
    assert!(dir.path().join("sparse-volumes.target.wants").is_dir());
}

#[test]
fn an_early_directory_that_cannot_be_written_fails_before_the_volumes_are_pulled_in() {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/23-replaced-unit");
    let normal = dir.path().join("normal");
    std::fs::create_dir(&normal).unwrap();
    let not_a_dir = dir.path().join("file");
    std::fs::write(&not_a_dir, "").unwrap();
    let out = generator(&root, &[&normal, &not_a_dir, &not_a_dir]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    // Without the mask, the old unit could bind the file a second time:
    // no volume is pulled into the boot either.
    assert!(!normal.join("sparse-volumes.target.wants").exists());
}
