//! The runtime directory (`/run/sparse-volume`) holds the locks, and attach
//! writes the device note into a volume's lock file: root truncates files
//! there. Issue 24 item 3: made under `umask 000` it was 0777, and a lock
//! file planted as a link made root truncate and write the link's target.

mod common;

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;

use common::{loops_of, new_uuid, Fixture, Run};

const VICTIM_TEXT: &str = "root's data, not a lock\n";

fn run_under_umask(umask: &str, fx: &Fixture, args: &[&str]) -> Run {
    let script = format!("umask {umask}; exec \"$0\" \"$@\"");
    fx.wrapped(&["sh", "-c", &script], args)
        .output()
        .expect("running sh")
        .into()
}

fn mode_of(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

fn victim(fx: &Fixture) -> std::path::PathBuf {
    let victim = fx.host("/var/tmp/victim");
    fs::create_dir_all(victim.parent().unwrap()).unwrap();
    fs::write(&victim, VICTIM_TEXT).unwrap();
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o600)).unwrap();
    victim
}

#[test]
fn the_runtime_directory_is_made_0755_whatever_the_umask() {
    needs_root!();
    for umask in ["000", "077", "027"] {
        let fx = Fixture::new();
        let uuid = new_uuid();
        let created = run_under_umask(umask, &fx, &["create", "--size", "16M", "--uuid", &uuid]);
        assert_eq!(created.code, 0, "{umask}: {}", created.stderr);
        let run_dir = fx.host("/run/sparse-volume");
        assert_eq!(mode_of(&run_dir), 0o755, "umask {umask}");
        assert_eq!(fs::metadata(&run_dir).unwrap().uid(), 0);
    }
}

#[test]
fn a_runtime_directory_others_can_write_is_refused_and_nothing_is_followed() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    fx.run_ok(&["create", "--size", "16M", "--uuid", &uuid]);
    let run_dir = fx.host("/run/sparse-volume");
    let victim = victim(&fx);
    let lock = run_dir.join(format!("{uuid}.lock"));
    let _ = fs::remove_file(&lock);
    // What a version that honoured the umask left, and what a local user
    // could then plant in it.
    fs::set_permissions(&run_dir, fs::Permissions::from_mode(0o777)).unwrap();
    symlink(&victim, &lock).unwrap();

    let refused = fx.run(&["attach", &uuid]);
    assert_eq!(refused.code, 1, "{}", refused.stdout);
    let line = refused.stderr.trim_end();
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(
        line.contains("mode 0777") && line.contains("chmod go-w"),
        "the reason and the fix: {line}"
    );
    assert_eq!(fs::read_to_string(&victim).unwrap(), VICTIM_TEXT);
    assert!(loops_of(&fx.backing(&uuid)).is_empty());

    // Fixed as the line says, a link still is never followed.
    fs::set_permissions(&run_dir, fs::Permissions::from_mode(0o755)).unwrap();
    let refused = fx.run(&["attach", &uuid]);
    assert_eq!(refused.code, 1, "{}", refused.stdout);
    assert!(
        refused.stderr.contains("symbolic link"),
        "{}",
        refused.stderr
    );
    assert_eq!(fs::read_to_string(&victim).unwrap(), VICTIM_TEXT);
    assert!(loops_of(&fx.backing(&uuid)).is_empty());

    // A lock file somebody else owns is refused too.
    fs::remove_file(&lock).unwrap();
    fs::write(&lock, "").unwrap();
    std::os::unix::fs::chown(&lock, Some(65534), None).unwrap();
    let refused = fx.run(&["attach", &uuid]);
    assert_eq!(refused.code, 1, "{}", refused.stdout);
    assert!(
        refused.stderr.contains("owned by uid 65534"),
        "{}",
        refused.stderr
    );
    assert!(loops_of(&fx.backing(&uuid)).is_empty());

    fs::remove_file(&lock).unwrap();
    fx.run_ok(&["attach", &uuid]);
    fx.run_ok(&["detach", &uuid]);
}
