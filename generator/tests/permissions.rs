//! The generator and registry permissions: a volume file (or directory)
//! that anyone but root can change is skipped with a log line that names
//! it, the owner and mode found and the fix, while every other volume is
//! still generated. Git cannot carry owners and modes, so each case builds
//! its tree at run time (as root, like the rest of the suite).

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

const GOOD: &str = "53ca3910-b376-4076-95e0-d56a0f20e36e";
const BAD: &str = "b509373d-5761-4662-b3ef-04c74fc51fac";
/// `nobody` on Debian; any uid but root's does.
const OTHER_UID: u32 = 65534;

struct Tree {
    root: TempDir,
}

struct Outcome {
    success: bool,
    stderr: String,
    generated: Vec<String>,
}

impl Tree {
    /// A tree owned by root, or `None` (said on stderr) without root: the
    /// tests give files to other users.
    fn new() -> Option<Self> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!(
                "skipped: needs root (it gives files to other users); tests/run runs it as root"
            );
            return None;
        }
        let root = TempDir::new().unwrap();
        let tree = Self { root };
        fs::create_dir_all(tree.volumes_dir()).unwrap();
        for dir in [tree.config_dir(), tree.volumes_dir()] {
            fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).unwrap();
        }
        for id in [GOOD, BAD] {
            let file = tree.volume_file(id);
            fs::write(
                &file,
                format!(
                    "uuid = \"{id}\"\npath = \"/var/lib/sparse-volume/{id}\"\nsize = 1073741824\nmode = \"filesystem\"\nfs_type = \"ext4\"\nenabled = true\n"
                ),
            )
            .unwrap();
            fs::set_permissions(&file, fs::Permissions::from_mode(0o644)).unwrap();
        }
        Some(tree)
    }

    fn config_dir(&self) -> PathBuf {
        self.root.path().join("etc/sparse-volume")
    }

    fn volumes_dir(&self) -> PathBuf {
        self.config_dir().join("volumes.d")
    }

    fn volume_file(&self, id: &str) -> PathBuf {
        self.volumes_dir().join(format!("{id}.toml"))
    }

    fn run(&self) -> Outcome {
        let out = TempDir::new().unwrap();
        let result = Command::new(env!("CARGO_BIN_EXE_sparse-volume-generator"))
            .arg(out.path())
            .env("SPARSE_VOLUME_ROOT", self.root.path())
            .output()
            .expect("running sparse-volume-generator");
        let wants = out.path().join("sparse-volumes.target.wants");
        let mut generated: Vec<String> = fs::read_dir(&wants)
            .into_iter()
            .flatten()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        generated.sort();
        Outcome {
            success: result.status.success(),
            stderr: String::from_utf8_lossy(&result.stderr).into_owned(),
            generated,
        }
    }
}

fn instance(id: &str) -> String {
    format!("sparse-volume@{id}.service")
}

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// The generator skipped exactly `BAD`, with one log line that names its
/// file and contains every one of `says`.
fn assert_only_bad_skipped(outcome: &Outcome, bad_file: &Path, says: &[&str]) {
    assert!(outcome.success, "{}", outcome.stderr);
    assert_eq!(
        outcome.generated,
        vec![instance(GOOD)],
        "{}",
        outcome.stderr
    );
    let lines: Vec<&str> = outcome.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", outcome.stderr);
    let line = lines[0];
    assert!(
        line.contains(&bad_file.display().to_string()) && line.contains("volume skipped"),
        "{line}"
    );
    for word in says {
        assert!(line.contains(word), "lacks {word:?}: {line}");
    }
}

#[test]
fn a_trusted_tree_generates_both_volumes_silently() {
    let Some(tree) = Tree::new() else {
        return;
    };
    let outcome = tree.run();
    assert!(outcome.success);
    assert_eq!(outcome.generated, vec![instance(GOOD), instance(BAD)]);
    assert_eq!(outcome.stderr, "");
}

#[test]
fn group_or_world_writable_volume_files_are_skipped() {
    for mode in [0o664, 0o646, 0o620] {
        let Some(tree) = Tree::new() else {
            return;
        };
        let bad = tree.volume_file(BAD);
        chmod(&bad, mode);
        let fix = format!("chown root: {p}; chmod go-w {p}", p = bad.display());
        assert_only_bad_skipped(
            &tree.run(),
            &bad,
            &[&format!("mode {mode:04o}"), "owner uid 0", &fix],
        );
    }
}

#[test]
fn a_volume_file_owned_by_another_user_is_skipped() {
    let Some(tree) = Tree::new() else {
        return;
    };
    let bad = tree.volume_file(BAD);
    std::os::unix::fs::chown(&bad, Some(OTHER_UID), None).unwrap();
    assert_only_bad_skipped(
        &tree.run(),
        &bad,
        &[
            &format!("owner uid {OTHER_UID}"),
            "mode 0644",
            "chown root:",
        ],
    );
}

#[test]
fn a_symlinked_volume_file_is_skipped() {
    let Some(tree) = Tree::new() else {
        return;
    };
    let bad = tree.volume_file(BAD);
    let elsewhere = tree.root.path().join("elsewhere.toml");
    fs::rename(&bad, &elsewhere).unwrap();
    symlink(&elsewhere, &bad).unwrap();
    assert_only_bad_skipped(&tree.run(), &bad, &["refused: a symbolic link"]);
}

#[test]
fn a_writable_registry_directory_skips_every_volume() {
    for (dir, mode) in [("volumes.d", 0o777), ("sparse-volume", 0o775)] {
        let Some(tree) = Tree::new() else {
            return;
        };
        let dir_path = match dir {
            "volumes.d" => tree.volumes_dir(),
            _ => tree.config_dir(),
        };
        chmod(&dir_path, mode);
        let outcome = tree.run();
        assert!(outcome.success, "{}", outcome.stderr);
        assert_eq!(
            outcome.generated,
            Vec::<String>::new(),
            "{}",
            outcome.stderr
        );
        for id in [GOOD, BAD] {
            let file = tree.volume_file(id).display().to_string();
            assert!(
                outcome.stderr.lines().any(|line| line.contains(&file)
                    && line.contains("volume skipped")
                    && line.contains(&format!("its directory {}", dir_path.display()))
                    && line.contains(&format!("mode {mode:04o}"))
                    && line.contains(&format!("chmod go-w {}", dir_path.display()))),
                "{dir}: no line skips {id}: {}",
                outcome.stderr
            );
        }
    }
}

#[test]
fn a_writable_config_falls_back_to_defaults_and_says_so() {
    let Some(tree) = Tree::new() else {
        return;
    };
    let config = tree.config_dir().join("config.toml");
    // A setting whose loss shows: without it, the default storage root
    // applies.
    fs::write(&config, "storage_roots = [\"/srv/elsewhere\"]\n").unwrap();
    chmod(&config, 0o666);
    let outcome = tree.run();
    assert!(outcome.success, "{}", outcome.stderr);
    assert_eq!(outcome.generated, vec![instance(GOOD), instance(BAD)]);
    let lines: Vec<&str> = outcome.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{}", outcome.stderr);
    for word in [
        &config.display().to_string(),
        "mode 0666",
        "chmod go-w",
        "using built-in defaults",
    ] {
        assert!(lines[0].contains(word), "lacks {word:?}: {}", lines[0]);
    }
}
