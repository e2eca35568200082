//! Growing a mounted volume (issue 25, item 3): what can be known to fail
//! is refused before anything grows, in the dry run too; a grow that fails
//! after the file grew says what is left and the one command that
//! finishes it, and that command does.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;

use common::{DetachOnDrop, Fixture, Mounted};

/// A mounted ext4 volume "pg" of 32 MiB, and what to undo afterwards.
fn mounted_volume(fx: &Fixture) -> (String, DetachOnDrop, Mounted) {
    let made = fx.run_ok(&["create", "--size", "32M", "--name", "pg", "--now", "--json"]);
    let uuid = made.json()["uuid"].as_str().unwrap().to_string();
    let device = made.json()["device"].as_str().unwrap().to_string();
    let detach = DetachOnDrop::new(device.clone());
    let mounted = Mounted::new(fx, &device, &[]).expect("mounting the volume");
    (uuid, detach, mounted)
}

fn registered_size(fx: &Fixture, uuid: &str) -> u64 {
    let text = fs::read_to_string(fx.registry_file(uuid)).unwrap();
    let table: toml::Table = toml::from_str(&text).unwrap();
    table["size"].as_integer().unwrap() as u64
}

#[test]
fn an_online_grow_without_the_capability_is_refused_before_anything_grows() {
    needs_root!();
    let fx = Fixture::new();
    let (uuid, _detach, _mounted) = mounted_volume(&fx);
    let file_size = || fs::metadata(fx.backing(&uuid)).unwrap().len();
    for extra in [&["--dry-run"][..], &[]] {
        // As in a container without CAP_SYS_RESOURCE: resize2fs would grow
        // nothing after the file and the device grew (issue 25's report).
        let args = [&["resize", "pg", "--size", "64M"][..], extra].concat();
        let run: common::Run = fx
            .wrapped(&["setpriv", "--bounding-set", "-sys_resource", "--"], &args)
            .output()
            .unwrap()
            .into();
        assert_eq!(run.code, 1, "{extra:?}: {}{}", run.stdout, run.stderr);
        assert!(
            run.stderr.contains("CAP_SYS_RESOURCE") && run.stderr.contains("unmount"),
            "{extra:?}: {}",
            run.stderr
        );
        assert_eq!(file_size(), 32 << 20, "{extra:?}: the file grew");
        assert_eq!(registered_size(&fx, &uuid), 32 << 20);
    }
    if common::has_cap_sys_resource() {
        // With the capability, the same command grows it online.
        fx.run_ok(&["resize", "pg", "--size", "64M"]);
        assert_eq!(registered_size(&fx, &uuid), 64 << 20);
    }
}

/// A stand-in xfs_growfs that fails, next to the real refusal above: the
/// failure after the file grew (xfs, whose online grow asks only for
/// CAP_SYS_ADMIN, which root holds here).
#[test]
fn a_grow_that_fails_after_the_file_grew_says_how_to_finish_it() {
    needs_root!();
    let fx = Fixture::new();
    let made = fx.run_ok(&[
        "create", "--size", "320M", "--fs", "xfs", "--name", "logs", "--now", "--json",
    ]);
    let uuid = made.json()["uuid"].as_str().unwrap().to_string();
    let device = made.json()["device"].as_str().unwrap().to_string();
    let _detach = DetachOnDrop::new(device.clone());
    let _mounted = Mounted::new(&fx, &device, &[]).expect("mounting the volume");
    let tools = fx.host("/refusing-tools");
    fs::create_dir_all(&tools).unwrap();
    let stand_in = tools.join("xfs_growfs");
    fs::write(
        &stand_in,
        "#!/bin/sh\necho 'xfs_growfs: XFS_IOC_FSGROWFSDATA xfsctl failed: Operation not permitted' >&2\nexit 1\n",
    )
    .unwrap();
    fs::set_permissions(&stand_in, fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", tools.display(), std::env::var("PATH").unwrap());
    let run: common::Run = fx
        .command(&["resize", "logs", "--size", "384M", "--json"])
        .env("PATH", &path)
        .output()
        .unwrap()
        .into();
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("Operation not permitted"),
        "the tool's reason: {}",
        run.stderr
    );
    assert!(
        run.stderr
            .contains(&format!("`sparse-volume resize {uuid} --size 384M`")),
        "no command that finishes it: {}",
        run.stderr
    );
    let report = run.json();
    assert_eq!(report["changed"], true, "{report}");
    assert_eq!(report["uuid"], uuid.as_str(), "{report}");
    assert_eq!(registered_size(&fx, &uuid), 320 << 20);
    // The command it named finishes the grow.
    fx.run_ok(&["resize", &uuid, "--size", "384M"]);
    assert_eq!(registered_size(&fx, &uuid), 384 << 20);
    let check = fx.run(&["check", "--json"]);
    assert!(!check.stdout.contains("size-mismatch"), "{}", check.stdout);
}
