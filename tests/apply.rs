//! `apply`, `--dry-run` and names as identities, with real files, real
//! mkfs and real loop devices. The dry-run invariant is checked for every
//! state-changing command: a dry run leaves the registry, the backing
//! files and the loop devices exactly as they were (compared by bytes,
//! inode, size, blocks and mtime, and `losetup`'s listing), and says what
//! the real run then does: the same `changed`, the same actions, the same
//! refusal.

mod common;

use std::fs;
use std::process::Command;

use common::{loops_of, new_uuid, tool, Fixture, Run};
use serde_json::Value;

/// Everything a state change could touch, as other tools see it: each
/// file under the registry and the storage root (name, inode, size,
/// blocks, mode, mtime, SHA-256) and the loop devices with their files.
/// The run directory (lock files) is left out: taking a lock is no change.
fn snapshot(fx: &Fixture) -> String {
    let mut listing = String::new();
    for dir in ["/etc/sparse-volume", "/var/lib/sparse-volume"] {
        let dir = fx.host(dir);
        listing += &tool(
            "find",
            &[dir.to_str().unwrap(), "-printf", "%p %i %s %b %m %T@\\n"],
        );
        listing += &tool(
            "find",
            &[
                dir.to_str().unwrap(),
                "-type",
                "f",
                "-exec",
                "sha256sum",
                "{}",
                "+",
            ],
        );
    }
    let mut devices: Vec<String> = tool(
        "losetup",
        &[
            "--list",
            "--noheadings",
            "--output",
            "NAME,BACK-FILE,RO,DIO",
        ],
    )
    .lines()
    .filter(|line| line.contains(&*fx.root.path().to_string_lossy()))
    // Columns are padded to the longest file of any test's device.
    .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
    .collect();
    devices.sort();
    listing + &devices.join("\n")
}

/// `args` with `--dry-run`, then for real. The dry run must change nothing
/// and agree with the real run: exit status, `changed`, the actions of
/// `apply`, and a refusal's message.
fn dry_then_real(fx: &Fixture, args: &[&str]) -> (Run, Run) {
    let before = snapshot(fx);
    let dry = fx.run(&[args, &["--dry-run", "--json"]].concat());
    assert_eq!(
        snapshot(fx),
        before,
        "the dry run of {args:?} changed something: {}",
        dry.stdout
    );
    let real = fx.run(&[args, &["--json"]].concat());
    assert_eq!(
        dry.code, real.code,
        "{args:?}: dry run exit {} ({}), real run exit {} ({})",
        dry.code, dry.stderr, real.code, real.stderr
    );
    let (dry_report, real_report) = (dry.json(), real.json());
    for run in [&dry, &real] {
        // serde_json keeps the last of two equal keys; other parsers refuse
        // the object or keep the first.
        assert_eq!(
            run.stdout.matches("\"dry_run\":").count(),
            1,
            "{args:?}: `dry_run` not said exactly once: {}",
            run.stdout
        );
    }
    if real.code == 0 {
        assert_eq!(dry_report["dry_run"], true, "{}", dry.stdout);
        assert_eq!(real_report["dry_run"], false, "{}", real.stdout);
        assert_eq!(
            dry_report["changed"], real_report["changed"],
            "{args:?}: the dry run said changed = {}, the real run {}",
            dry_report["changed"], real_report["changed"]
        );
        assert_eq!(dry_report["actions"], real_report["actions"], "{args:?}");
    } else {
        assert_eq!(dry_report["error"], real_report["error"], "{args:?}");
    }
    (dry, real)
}

/// `apply`'s planned registry record against the one written (a create
/// without a UUID has none in its plan; device and unit are runtime).
fn assert_planned_record(dry: &Run, real: &Run) {
    // A planned stop leaves no device: the plan says so (a planned start's
    // device is only known once attached).
    let stops = real.json()["actions"]
        .as_array()
        .is_some_and(|actions| actions.iter().any(|a| a == "stop"));
    if stops {
        assert!(
            dry.json()["after"]["device"].is_null() && real.json()["after"]["device"].is_null(),
            "a stop: the planned or the real after still has a device: {} / {}",
            dry.stdout,
            real.stdout
        );
    }
    let strip = |run: &Run| {
        let mut after = run.json()["after"].clone();
        if let Some(record) = after.as_object_mut() {
            record.remove("device");
            record.remove("active_state");
            if dry_created_without_uuid(&run.json()) {
                record.remove("uuid");
            }
        }
        after
    };
    let (planned, mut written) = (strip(dry), strip(real));
    if let (Some(p), Some(w)) = (planned.as_object(), written.as_object_mut()) {
        if p.get("uuid").is_none() {
            // The plan names the file after a UUID not chosen yet.
            let uuid = w.remove("uuid").expect("the real run's UUID");
            let path = w["path"]
                .as_str()
                .expect("path")
                .replace(uuid.as_str().expect("uuid"), "<uuid>");
            w.insert("path".into(), path.into());
        }
    }
    assert_eq!(
        planned, written,
        "the dry run planned another record than the real run wrote"
    );
}

fn dry_created_without_uuid(report: &Value) -> bool {
    report["dry_run"] == true && report["before"].is_null() && report["uuid"].is_null()
}

fn apply(fx: &Fixture, document: &str, dry_run: bool) -> Run {
    let mut command = fx.command(&["apply", "--stdin", "--json"]);
    if dry_run {
        command.arg("--dry-run");
    }
    let output = command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(document.as_bytes())?;
            child.wait_with_output()
        })
        .expect("running sparse-volume apply");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// `apply` with a document, dry and real, as [`dry_then_real`] does.
fn apply_dry_then_real(fx: &Fixture, document: &str) -> (Run, Run) {
    let before = snapshot(fx);
    let dry = apply(fx, document, true);
    assert_eq!(
        snapshot(fx),
        before,
        "the dry run of {document} changed something: {}",
        dry.stdout
    );
    let real = apply(fx, document, false);
    assert_eq!(
        dry.code, real.code,
        "{document}: {} / {}",
        dry.stderr, real.stderr
    );
    if real.code == 0 {
        assert_eq!(dry.json()["changed"], real.json()["changed"], "{document}");
        assert_eq!(dry.json()["actions"], real.json()["actions"], "{document}");
        assert_planned_record(&dry, &real);
    } else {
        assert_eq!(dry.json()["error"], real.json()["error"], "{document}");
    }
    (dry, real)
}

fn actions(run: &Run) -> Vec<String> {
    run.json()["actions"]
        .as_array()
        .expect("actions is a list")
        .iter()
        .map(|a| a.as_str().expect("an action is text").to_string())
        .collect()
}

fn registry_entry(fx: &Fixture, uuid: &str) -> toml::Table {
    toml::from_str(&fs::read_to_string(fx.registry_file(uuid)).expect("registry file"))
        .expect("registry TOML")
}

#[test]
fn every_state_changing_command_dry_runs_like_it_runs() {
    needs_root!();
    let fx = Fixture::new();
    let (_, created) = dry_then_real(&fx, &["create", "--size", "64M", "--name", "alpha"]);
    let alpha = created.json()["uuid"].as_str().expect("uuid").to_string();
    assert!(fx.backing(&alpha).exists());
    // Repeated, and with another spec under the same name.
    let (_, again) = dry_then_real(&fx, &["create", "--size", "64M", "--name", "alpha"]);
    assert_eq!(again.json()["changed"], false);
    let (_, refused) = dry_then_real(&fx, &["create", "--size", "1G", "--name", "alpha"]);
    assert_eq!(refused.code, 1);
    assert!(refused.stderr.contains(&alpha), "{}", refused.stderr);

    dry_then_real(&fx, &["resize", "alpha", "--size", "96M"]);
    assert_eq!(
        registry_entry(&fx, &alpha)["size"].as_integer(),
        Some(96 << 20)
    );
    let (_, shrink) = dry_then_real(&fx, &["resize", "alpha", "--size", "64M"]);
    assert!(
        shrink.stderr.contains("shrinking is not supported"),
        "{}",
        shrink.stderr
    );

    let (_, attached) = dry_then_real(&fx, &["attach", "alpha"]);
    assert_eq!(attached.json()["changed"], true);
    assert_eq!(loops_of(&fx.backing(&alpha)).len(), 1);
    let (_, reattached) = dry_then_real(&fx, &["attach", &alpha]);
    assert_eq!(reattached.json()["changed"], false);
    dry_then_real(&fx, &["detach", "alpha"]);
    assert!(loops_of(&fx.backing(&alpha)).is_empty());
    let (_, detached) = dry_then_real(&fx, &["detach", "alpha"]);
    assert_eq!(detached.json()["changed"], false);

    // register: a file carrying the UUID is adopted; one that does not is
    // refused, by the dry run too (content verification).
    let beta = new_uuid();
    fx.make_ext4(&beta);
    let path = fx.logical_backing(&beta);
    dry_then_real(
        &fx,
        &[
            "register", "--uuid", &beta, "--path", &path, "--name", "beta",
        ],
    );
    let stranger = new_uuid();
    fx.sparse_file(&fx.backing(&stranger));
    let stranger_path = fx.logical_backing(&stranger);
    let (_, foreign) = dry_then_real(
        &fx,
        &["register", "--uuid", &stranger, "--path", &stranger_path],
    );
    assert_eq!(foreign.code, 1);

    // Without systemd these are refused, and the dry run says so too.
    for args in [&["start", "beta"][..], &["stop", "beta"]] {
        let (_, run) = dry_then_real(&fx, args);
        assert_eq!(run.code, 1, "{args:?}");
    }
    let before = snapshot(&fx);
    let audit = fx.run(&["check", "--repair", "--dry-run", "--json"]);
    assert_eq!(
        snapshot(&fx),
        before,
        "check --repair --dry-run repaired: {}",
        audit.stdout
    );

    dry_then_real(&fx, &["remove", "beta"]);
    assert!(
        fx.backing(&beta).exists(),
        "remove without --delete-data deleted the file"
    );
    let (_, removed) = dry_then_real(&fx, &["remove", "alpha", "--delete-data"]);
    assert_eq!(removed.json()["data_deleted"], true);
    assert!(!fx.backing(&alpha).exists());
}

#[test]
fn apply_converges_a_volume_step_by_step_and_its_dry_run_plans_each_step() {
    needs_root!();
    let fx = Fixture::new();
    let (_, created) = apply_dry_then_real(
        &fx,
        r#"{"name": "pg-data", "size": "64M", "enabled": false, "read_only": null, "uuid": null}"#,
    );
    assert_eq!(
        actions(&created),
        ["create a filesystem (ext4) volume of 64.0 MiB", "disable"]
    );
    let report = created.json();
    let uuid = report["uuid"].as_str().expect("uuid").to_string();
    assert!(report["before"].is_null());
    assert_eq!(report["after"]["enabled"], false);
    assert_eq!(registry_entry(&fx, &uuid)["enabled"].as_bool(), Some(false));
    let probed = tool(
        "blkid",
        &[
            "-o",
            "value",
            "-s",
            "UUID",
            fx.backing(&uuid).to_str().unwrap(),
        ],
    );
    assert_eq!(probed.trim(), uuid, "the file holds another file system");

    let (_, unchanged) = apply_dry_then_real(
        &fx,
        r#"{"name": "pg-data", "size": 67108864, "enabled": false}"#,
    );
    assert_eq!(unchanged.json()["changed"], false);
    assert_eq!(unchanged.json()["before"], unchanged.json()["after"]);

    // Grow, enable, make read-only and rename it, found by its UUID.
    let document = format!(
        "uuid = \"{uuid}\"\nname = \"pg-main\"\nsize = \"128M\"\nenabled = true\nread_only = true\n"
    );
    let (_, converged) = apply_dry_then_real(&fx, &document);
    assert_eq!(
        actions(&converged),
        [
            "resize 64.0 MiB to 128.0 MiB",
            "rename to \"pg-main\"",
            "enable",
            "read-only"
        ]
    );
    let entry = registry_entry(&fx, &uuid);
    assert_eq!(entry["size"].as_integer(), Some(128 << 20));
    assert_eq!(entry["name"].as_str(), Some("pg-main"));
    assert_eq!(
        fs::metadata(fx.backing(&uuid)).expect("backing").len(),
        128 << 20
    );

    // Refusals: smaller, another file system, a name another volume has.
    let (_, shrink) = apply_dry_then_real(&fx, r#"{"name": "pg-main", "size": "64M"}"#);
    assert!(
        shrink.stderr.contains("shrinking is not supported"),
        "{}",
        shrink.stderr
    );
    let (_, other_fs) = apply_dry_then_real(&fx, r#"{"name": "pg-main", "fs_type": "xfs"}"#);
    assert!(
        other_fs.stderr.contains("file system ext4 (asked xfs)"),
        "{}",
        other_fs.stderr
    );
    let (_, no_size) = apply_dry_then_real(&fx, r#"{"name": "new-one"}"#);
    assert!(
        no_size.stderr.contains("a size is needed"),
        "{}",
        no_size.stderr
    );

    // Absent keeps the data unless asked; absent twice is no change.
    let (_, removed) = apply_dry_then_real(&fx, r#"{"name": "pg-main", "state": "absent"}"#);
    assert_eq!(actions(&removed), ["remove"]);
    assert!(fx.backing(&uuid).exists());
    assert!(!fx.registry_file(&uuid).exists());
    let (_, gone) = apply_dry_then_real(&fx, r#"{"name": "pg-main", "state": "absent"}"#);
    assert_eq!(gone.json()["changed"], false);
}

#[test]
fn apply_with_flags_and_now_attaches_and_detaches_without_systemd() {
    needs_root!();
    let fx = Fixture::new();
    let (_, up) = dry_then_real(
        &fx,
        &[
            "apply", "--name", "blk", "--size", "64M", "--mode", "block", "--now",
        ],
    );
    assert_eq!(actions(&up), ["create a block volume of 64.0 MiB", "start"]);
    let uuid = up.json()["uuid"].as_str().expect("uuid").to_string();
    assert_eq!(loops_of(&fx.backing(&uuid)).len(), 1);
    let (_, steady) = dry_then_real(&fx, &["apply", "--name", "blk", "--now"]);
    assert_eq!(steady.json()["changed"], false);
    let (dry_down, down) = dry_then_real(
        &fx,
        &["apply", "--name", "blk", "--enabled", "false", "--now"],
    );
    assert_eq!(actions(&down), ["stop", "disable"]);
    assert_planned_record(&dry_down, &down);
    assert!(loops_of(&fx.backing(&uuid)).is_empty());
    let (_, deleted) = dry_then_real(
        &fx,
        &[
            "apply",
            "--name",
            "blk",
            "--state",
            "absent",
            "--delete-data",
        ],
    );
    assert_eq!(actions(&deleted), ["remove", "delete-data"]);
    assert!(!fx.backing(&uuid).exists());
}

/// Issue 25, item 13: without systemd, `enable`/`disable` and `apply
/// --enabled` do the same: write the flag (the generator reads it at the
/// next boot) and say that nothing was reloaded; with `--now` they attach
/// and detach directly, as `apply --now` always did.
#[test]
fn enable_and_disable_without_systemd_do_what_apply_does() {
    needs_root!();
    let fx = Fixture::new();
    let created = fx.run_ok(&["create", "--size", "16M", "--name", "pg", "--json"]);
    let uuid = created.json()["uuid"].as_str().expect("uuid").to_string();
    let enabled = |fx: &Fixture| registry_entry(fx, &uuid)["enabled"].as_bool();
    let (_, disabled) = dry_then_real(&fx, &["disable", "pg"]);
    assert_eq!(disabled.code, 0, "{}", disabled.stderr);
    assert_eq!(enabled(&fx), Some(false));
    assert!(
        disabled.stderr.contains("at the next boot"),
        "no word that nothing was reloaded: {}",
        disabled.stderr
    );
    let (_, applied) = dry_then_real(&fx, &["apply", "--name", "pg", "--enabled", "true"]);
    assert_eq!(enabled(&fx), Some(true));
    assert!(
        applied.stderr.contains("at the next boot"),
        "apply says less than disable: {}",
        applied.stderr
    );
    let (_, now) = dry_then_real(&fx, &["enable", "pg", "--now"]);
    assert_eq!(now.code, 0, "{}", now.stderr);
    assert_eq!(loops_of(&fx.backing(&uuid)).len(), 1);
    let (_, down) = dry_then_real(&fx, &["disable", "pg", "--now"]);
    assert_eq!(down.code, 0, "{}", down.stderr);
    assert!(loops_of(&fx.backing(&uuid)).is_empty());
    assert_eq!(enabled(&fx), Some(false));
}

/// `enable --now` refuses what the attach would refuse before it writes
/// the flag; on a machine systemd booted, a bus that does not answer is
/// refused, not taken for "no systemd" (review of issue 25, item 13).
#[test]
fn enable_now_refuses_before_the_flag_and_a_silent_bus_is_not_no_systemd() {
    needs_root!();
    let fx = Fixture::new();
    let created = fx.run_ok(&["create", "--size", "16M", "--name", "db", "--json"]);
    let uuid = created.json()["uuid"].as_str().expect("uuid").to_string();
    fx.run_ok(&["disable", "db"]);
    let cmdline = fx.host("/proc/cmdline");
    fs::create_dir_all(cmdline.parent().unwrap()).unwrap();
    fs::write(&cmdline, format!("quiet sparse_volume.skip={uuid}\n")).unwrap();
    let refused = fx.run(&["enable", "db", "--now", "--json"]);
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert_eq!(refused.json()["changed"], false);
    assert_eq!(registry_entry(&fx, &uuid)["enabled"].as_bool(), Some(false));
    fs::remove_file(&cmdline).unwrap();

    fs::create_dir_all(fx.host("/run/systemd/system")).unwrap();
    for args in [
        &["enable", "db"][..],
        &["apply", "--name", "db", "--enabled", "true"],
    ] {
        let silent = fx.run(args);
        assert_eq!(silent.code, 1, "{args:?}: {}", silent.stderr);
        assert!(
            silent.stderr.contains("does not answer"),
            "{args:?}: {}",
            silent.stderr
        );
        assert_eq!(registry_entry(&fx, &uuid)["enabled"].as_bool(), Some(false));
    }
}

/// Without systemd, `enable --now` attaches under the registry lock, so a
/// `disable --now` at the same time cannot leave a disabled volume
/// attached (the review reproduced that once in 80 runs).
#[test]
fn enable_now_and_disable_now_at_once_never_leave_a_disabled_volume_attached() {
    needs_root!();
    let fx = Fixture::new();
    let created = fx.run_ok(&["create", "--size", "16M", "--name", "db", "--json"]);
    let uuid = created.json()["uuid"].as_str().expect("uuid").to_string();
    for round in 0..100 {
        let mut up = fx.command(&["enable", "db", "--now"]);
        let mut down = fx.command(&["disable", "db", "--now"]);
        let (up, down) = (up.spawn().unwrap(), down.spawn().unwrap());
        let (up, down) = (
            up.wait_with_output().unwrap(),
            down.wait_with_output().unwrap(),
        );
        let enabled = registry_entry(&fx, &uuid)["enabled"].as_bool();
        let attached = !loops_of(&fx.backing(&uuid)).is_empty();
        assert!(
            enabled == Some(true) || !attached,
            "round {round}: disabled but attached ({:?} / {:?})",
            String::from_utf8_lossy(&up.stderr),
            String::from_utf8_lossy(&down.stderr)
        );
        fx.run_ok(&["disable", "db", "--now"]);
    }
}

#[test]
fn a_dry_run_refuses_what_the_real_run_refuses_mounted_and_out_of_space() {
    needs_root!();
    let fx = Fixture::new();
    let storage = fx.mount_storage(256 << 20);
    let (_, space) = apply_dry_then_real(&fx, r#"{"name": "big", "size": "1G"}"#);
    assert_eq!(space.code, 1);
    assert!(
        space.stderr.contains("big") || space.stderr.contains("space"),
        "{}",
        space.stderr
    );

    let (_, created) = apply_dry_then_real(&fx, r#"{"name": "used", "size": "64M", "now": true}"#);
    let uuid = created.json()["uuid"].as_str().expect("uuid").to_string();
    let device = &loops_of(&fx.backing(&uuid))[0];
    let mount_point = fx.host("/mnt");
    fs::create_dir_all(&mount_point).unwrap();
    // Read-only, so the consumer never writes the backing file itself
    // (journal commits would change it under the snapshots).
    tool(
        "mount",
        &["-o", "ro,noload", device, mount_point.to_str().unwrap()],
    );
    let (_, mounted) = apply_dry_then_real(&fx, r#"{"name": "used", "state": "absent"}"#);
    let (_, stop) = apply_dry_then_real(&fx, r#"{"name": "used", "enabled": false, "now": true}"#);
    let (_, detach) = dry_then_real(&fx, &["detach", "used"]);
    assert_eq!(
        detach.code, 1,
        "a mounted volume was detached: {}",
        detach.stdout
    );
    let _ = Command::new("umount").arg(&mount_point).status();
    assert_eq!(mounted.code, 1);
    assert!(
        mounted.stderr.contains("is mounted on") && mounted.stderr.contains("unmount it first"),
        "{}",
        mounted.stderr
    );
    assert_eq!(stop.code, 1);
    assert!(fx.registry_file(&uuid).exists());
    // The refused stop left the flag as it was, not half a change.
    assert_eq!(registry_entry(&fx, &uuid)["enabled"].as_bool(), Some(true));
    drop(storage);
}

#[test]
fn a_name_names_one_volume_and_every_command_takes_it() {
    needs_root!();
    let fx = Fixture::new();
    let first = fx.run_ok(&["create", "--size", "64M", "--name", "pg-data", "--json"]);
    let uuid = first.json()["uuid"].as_str().expect("uuid").to_string();
    // The guide's line run twice makes one volume (docs/guide/volumes.md).
    let second = fx.run_ok(&["create", "--size", "64M", "--name", "pg-data", "--json"]);
    assert_eq!(second.json()["changed"], false);
    assert_eq!(second.json()["uuid"], uuid.as_str());
    let listed = fx.run_ok(&["list", "--json"]).json();
    assert_eq!(
        listed["volumes"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );

    let other = new_uuid();
    let taken = fx.run(&[
        "create", "--size", "64M", "--name", "pg-data", "--uuid", &other,
    ]);
    assert_eq!(taken.code, 1);
    assert!(taken.stderr.contains(&uuid), "{}", taken.stderr);
    let uuid_like = fx.run(&["create", "--size", "64M", "--name", &new_uuid()]);
    // A usage error, as in apply (issue 25, item 16).
    assert_eq!(
        uuid_like.code, 2,
        "a name that reads as a UUID: {}",
        uuid_like.stderr
    );
    let applied = fx.run(&["apply", "--size", "64M", "--name", &new_uuid()]);
    assert_eq!(applied.code, 2, "{}", applied.stderr);

    fx.run_ok(&["status", "pg-data"]);
    fx.run_ok(&["resize", "pg-data", "--size", "80M"]);
    fx.run_ok(&["attach", "pg-data"]);
    assert_eq!(loops_of(&fx.backing(&uuid)).len(), 1);
    fx.run_ok(&["detach", "pg-data"]);
    let unknown = fx.run(&["status", "no-such-name"]);
    assert_eq!(unknown.code, 1);
    assert!(
        unknown.stderr.contains("no volume is named"),
        "{}",
        unknown.stderr
    );

    // Two entries with one name, as older versions or a hand edit could
    // leave: a lookup by that name names both and picks neither.
    let twin = new_uuid();
    fx.make_ext4(&twin);
    fx.register(
        &twin,
        "filesystem",
        "fs_type = \"ext4\"\nname = \"pg-data\"\n",
    );
    for args in [
        &["status", "pg-data"][..],
        &["apply", "--name", "pg-data", "--size", "80M"],
    ] {
        let run = fx.run(args);
        assert_eq!(run.code, 1, "{args:?}");
        assert!(
            run.stderr.contains(&uuid) && run.stderr.contains(&twin),
            "{}",
            run.stderr
        );
    }
    fx.run_ok(&["remove", &twin]);
    fx.run_ok(&["remove", "pg-data"]);
}

// From a hostile review: each of these changed or deleted what it should
// not, or promised in a dry run what the real run then refused.

#[test]
fn absent_with_a_uuid_and_a_name_that_disagree_removes_nothing() {
    needs_root!();
    let fx = Fixture::new();
    let created = fx.run_ok(&["create", "--size", "64M", "--name", "pg", "--json"]);
    let uuid = created.json()["uuid"].as_str().expect("uuid").to_string();
    let (_, refused) = dry_then_real(
        &fx,
        &[
            "apply",
            "--uuid",
            &uuid,
            "--name",
            "web",
            "--state",
            "absent",
            "--delete-data",
        ],
    );
    assert_eq!(refused.code, 1);
    assert!(
        refused.stderr.contains("is named \"pg\", not \"web\""),
        "{}",
        refused.stderr
    );
    assert!(fx.backing(&uuid).exists() && fx.registry_file(&uuid).exists());
}

#[test]
fn remove_by_name_refuses_when_the_name_moved_to_another_volume_meanwhile() {
    needs_root!();
    let fx = Fixture::new();
    let first = fx
        .run_ok(&["create", "--size", "64M", "--name", "pg", "--json"])
        .json();
    let second = fx
        .run_ok(&["create", "--size", "64M", "--name", "pg-new", "--json"])
        .json();
    let (first, second) = (
        first["uuid"].as_str().unwrap(),
        second["uuid"].as_str().unwrap(),
    );
    // The remove resolves "pg" to the first volume, then waits three
    // seconds before its first lock; meanwhile the name moves.
    let mut remove = Command::new("strace");
    remove
        .args(["-f", "-qq", "-o", "/dev/null", "-e", "trace=flock"])
        .args(["-e", "inject=flock:delay_enter=3000000:when=1"])
        .arg(env!("CARGO_BIN_EXE_sparse-volume"))
        .args(["remove", "pg", "--delete-data"])
        .env("SPARSE_VOLUME_ROOT", fx.root.path())
        .env("DBUS_SYSTEM_BUS_ADDRESS", fx.absent_bus())
        .stderr(std::process::Stdio::piped());
    let running = remove.spawn().expect("strace");
    std::thread::sleep(std::time::Duration::from_millis(500));
    fx.run_ok(&["apply", "--uuid", first, "--name", "pg-old"]);
    fx.run_ok(&["apply", "--uuid", second, "--name", "pg"]);
    let output = running.wait_with_output().expect("remove");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "the remove went ahead: {stderr}");
    assert!(
        stderr.contains("is named \"pg-old\", not \"pg\""),
        "{stderr}"
    );
    for uuid in [first, second] {
        assert!(fx.backing(uuid).exists(), "{uuid} lost its data");
        assert!(fx.registry_file(uuid).exists());
    }
}

#[test]
fn a_name_in_a_registry_file_that_does_not_read_is_not_given_again() {
    needs_root!();
    let fx = Fixture::new();
    let created = fx.run_ok(&["create", "--size", "64M", "--name", "dup", "--json"]);
    let uuid = created.json()["uuid"].as_str().expect("uuid").to_string();
    let file = fx.registry_file(&uuid);
    let text = fs::read_to_string(&file).unwrap();
    fs::write(&file, format!("{text}direct_io = \"yes\"\n")).unwrap();
    let run = fx.run(&["apply", "--name", "dup", "--size", "64M"]);
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(run.stderr.contains("does not read"), "{}", run.stderr);
    let volumes = tool(
        "find",
        &[
            fx.host("/etc/sparse-volume/volumes.d").to_str().unwrap(),
            "-name",
            "*.toml",
        ],
    );
    assert_eq!(
        volumes.lines().count(),
        1,
        "a second volume was registered: {volumes}"
    );
}

#[test]
fn refusals_come_before_any_change_and_a_late_failure_says_what_was_done() {
    needs_root!();
    let fx = Fixture::new();
    fs::create_dir_all(fx.host("/proc")).unwrap();
    fs::write(fx.host("/proc/cmdline"), "ro sparse_volume=off\n").unwrap();
    // Skipped by the emergency switch: the dry run and the real run both
    // refuse to start it, and the real run refuses before creating it.
    let (_, skipped) = apply_dry_then_real(&fx, r#"{"name": "later", "size": "64M", "now": true}"#);
    assert_eq!(skipped.code, 1);
    assert!(skipped.stderr.contains("skipped"), "{}", skipped.stderr);
    assert_eq!(
        fs::read_dir(fx.host("/etc/sparse-volume/volumes.d"))
            .unwrap()
            .count(),
        0
    );
    // `create --now` checks nothing ahead: its report names the volume it
    // made before the start failed.
    let late = fx.run(&["create", "--size", "64M", "--now", "--json"]);
    assert_eq!(late.code, 1);
    let report = late.json();
    assert_eq!(report["changed"], true, "{report}");
    assert_eq!(report["actions"], serde_json::json!(["create"]));
    let uuid = report["uuid"]
        .as_str()
        .expect("the UUID of the volume made");
    assert!(fx.registry_file(uuid).exists());
    // The sentence says it too, for whoever runs it without --json.
    let said = format!("sparse-volume: creating a volume: {uuid} after: create: ");
    assert!(late.stderr.starts_with(&said), "{}", late.stderr);
    assert_eq!(
        report["error"].as_str(),
        late.stderr
            .strip_prefix("sparse-volume: ")
            .map(str::trim_end)
    );
}

#[test]
fn what_a_volume_cannot_become_is_refused_not_ignored() {
    needs_root!();
    let fx = Fixture::new();
    fx.run_ok(&["apply", "--name", "blk", "--size", "64M", "--mode", "block"]);
    let (_, fs_on_block) = dry_then_real(&fx, &["apply", "--name", "blk", "--fs", "xfs"]);
    assert_eq!(fs_on_block.code, 1);
    assert!(
        fs_on_block.stderr.contains("mode block"),
        "{}",
        fs_on_block.stderr
    );

    // register of a registered volume under another name.
    let uuid = new_uuid();
    fx.make_ext4(&uuid);
    let path = fx.logical_backing(&uuid);
    fx.run_ok(&["register", "--uuid", &uuid, "--path", &path, "--name", "a"]);
    let renamed = fx.run(&["register", "--uuid", &uuid, "--path", &path, "--name", "b"]);
    assert_eq!(renamed.code, 1, "{}", renamed.stdout);
    assert!(renamed.stderr.contains("named \"a\""), "{}", renamed.stderr);

    // A size that is not whole MiB, asked exactly, is no change.
    let odd = new_uuid();
    let file = fx.backing(&odd);
    fx.sparse_file_of(&file, (64 << 20) + 4096);
    tool(
        "mkfs.ext4",
        &["-q", "-F", "-U", &odd, file.to_str().unwrap()],
    );
    fx.register(&odd, "filesystem", "fs_type = \"ext4\"\n");
    let exact = ((64 << 20) + 4096).to_string();
    let (_, same) = dry_then_real(&fx, &["apply", "--uuid", &odd, "--size", &exact]);
    assert_eq!(same.json()["changed"], false, "{}", same.stdout);
}

#[test]
fn a_stop_then_a_failed_flag_write_reports_the_stop() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    fx.run_ok(&["create", "--size", "32M", "--uuid", &uuid, "--now"]);
    let file = fx.backing(&uuid);
    assert_eq!(loops_of(&file).len(), 1);
    // The flag write (a rename into volumes.d) fails; the stop before it
    // has happened and must be reported.
    let entries = fx.host("/etc/sparse-volume/volumes.d");
    tool("chattr", &["+i", entries.to_str().unwrap()]);
    let document = format!(r#"{{"uuid": "{uuid}", "enabled": false, "now": true}}"#);
    let failed = apply(&fx, &document, false);
    tool("chattr", &["-i", entries.to_str().unwrap()]);
    assert_eq!(failed.code, 1, "{}", failed.stderr);
    assert!(loops_of(&file).is_empty());
    assert_eq!(failed.json()["changed"], true, "{}", failed.stdout);
    assert_eq!(actions(&failed), vec!["stop"], "{}", failed.stdout);
}

/// Issue 24 item 4: `apply --enabled false --now` stopped the volume before
/// taking the registry lock, and a `check --repair` in between attached it
/// again (it attaches every enabled volume it finds detached): the end
/// state was disabled and attached.
#[test]
fn a_repair_cannot_attach_again_what_disable_now_is_stopping() {
    needs_root!();
    let fx = Fixture::new();
    let up = fx.run_ok(&[
        "apply", "--name", "racy", "--size", "16M", "--now", "--json",
    ]);
    let uuid = up.json()["uuid"].as_str().expect("uuid").to_string();
    assert_eq!(loops_of(&fx.backing(&uuid)).len(), 1);

    let disabling = fx.run_until(
        sparse_volume::hooks::Stop::DisableAfterStop,
        &[
            "apply",
            "--name",
            "racy",
            "--enabled",
            "false",
            "--now",
            "--json",
        ],
    );
    let check = fx
        .command(&["check", "--repair", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting check");
    assert!(
        common::ends_or_waits_for_a_lock(check.id()),
        "check --repair did not wait for the registry lock"
    );
    let apply = disabling.resume();
    let check = check.wait_with_output().expect("reaping check");
    assert_eq!(apply.code, 0, "{}", apply.stderr);
    assert_eq!(actions(&apply), ["stop", "disable"]);
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    let left = loops_of(&fx.backing(&uuid));
    for device in &left {
        tool("losetup", &["-d", device]);
    }
    assert!(
        left.is_empty(),
        "disabled and attached again: check said {}",
        String::from_utf8_lossy(&check.stdout)
    );
}

/// Whether this kernel can make device-mapper devices (an encrypted
/// filesystem-mode create opens its header to make the file system).
fn has_device_mapper() -> bool {
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/mapper/control")
        .is_ok()
}

/// What must be left after a create that failed: no backing file, no key
/// file, no registry entry, nothing in the storage root.
fn assert_nothing_made(fx: &Fixture, uuid: &str) {
    assert!(!fx.backing(uuid).exists());
    assert!(
        !fx.host(&format!("/etc/sparse-volume/keys/{uuid}.key"))
            .exists(),
        "the key file it made is removed again"
    );
    assert!(!fx.registry_file(uuid).exists());
    let leftovers: Vec<_> = fs::read_dir(fx.host("/var/lib/sparse-volume"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn apply_encrypt_plans_an_encrypted_create_and_shows_its_recovery_key_once() {
    needs_root!();
    let fx = Fixture::new();
    // Without a UUID the plan names the key file after the UUID to come.
    let before = snapshot(&fx);
    let unnamed = apply(
        &fx,
        r#"{"name": "vault", "size": "64M", "encrypt": true}"#,
        true,
    );
    assert_eq!(snapshot(&fx), before, "the dry run made something");
    assert_eq!(unnamed.code, 0, "{}", unnamed.stderr);
    let plan = unnamed.json();
    assert_eq!(
        actions(&unnamed),
        ["create an encrypted filesystem (ext4) volume of 64.0 MiB"]
    );
    assert_eq!(plan["after"]["encrypted"], true, "{plan}");
    assert_eq!(
        plan["after"]["key_file"], "/etc/sparse-volume/keys/<uuid>.key",
        "{plan}"
    );
    assert!(plan["recovery_key"].is_null(), "a plan enrolls no key");
    assert!(unnamed.stdout.contains("\"recovery_key\":null"));
    // The same with flags, and in words.
    let human = fx.run(&[
        "apply",
        "--name",
        "vault",
        "--size",
        "64M",
        "--encrypt",
        "--dry-run",
    ]);
    assert!(
        human
            .stdout
            .contains("vault would change: create an encrypted"),
        "{}",
        human.stdout
    );

    let uuid = new_uuid();
    let document =
        format!(r#"{{"name": "vault", "uuid": "{uuid}", "size": "64M", "encrypt": true}}"#);
    let dry = apply(&fx, &document, true);
    assert_eq!(
        dry.json()["after"]["key_file"],
        format!("/etc/sparse-volume/keys/{uuid}.key").as_str()
    );
    let real = apply(&fx, &document, false);
    if has_device_mapper() {
        assert_eq!(real.code, 0, "{}", real.stderr);
        let report = real.json();
        assert_eq!(report["actions"], dry.json()["actions"]);
        assert_eq!(report["after"]["encrypted"], true);
        assert_eq!(report["recovery_key"].as_str().map(str::len), Some(71));
        let entry = registry_entry(&fx, &uuid);
        assert!(entry.contains_key("luks_uuid"), "{entry:?}");
        // Shown once: the same state again changes nothing and shows none.
        let again = apply(&fx, &document, false);
        assert_eq!(again.json()["changed"], false, "{}", again.stdout);
        assert!(again.json()["recovery_key"].is_null(), "{}", again.stdout);
        assert!(again.json()["before"]["encrypted"] == true);
    } else {
        // The file system is made through the opened header: this kernel
        // cannot, and the create leaves nothing behind.
        assert_eq!(real.code, 1, "{}", real.stdout);
        assert!(
            real.stderr.contains("this kernel offers no device-mapper"),
            "{}",
            real.stderr
        );
        assert_eq!(real.json()["changed"], false, "{}", real.stdout);
        assert!(real.json()["recovery_key"].is_null(), "{}", real.stdout);
        assert_nothing_made(&fx, &uuid);
    }
}

#[test]
fn apply_refuses_an_operators_key_file_others_can_read_in_the_plan_too() {
    needs_root!();
    let fx = Fixture::new();
    let key = fx.host("/root/vault.key");
    fs::create_dir_all(key.parent().unwrap()).unwrap();
    fs::write(&key, [7u8; 64]).unwrap();
    let uuid = new_uuid();
    let document = format!(
        r#"{{"name": "vault", "uuid": "{uuid}", "size": "64M", "encrypt": true,
             "key_file": "/root/vault.key"}}"#
    );
    for mode in [0o644, 0o440] {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&key, fs::Permissions::from_mode(mode)).unwrap();
        let (_, refused) = apply_dry_then_real(&fx, &document);
        assert_eq!(refused.code, 1, "{mode:o}: {}", refused.stdout);
        assert!(
            refused
                .stderr
                .contains("must belong to root and be readable by nobody else"),
            "{}",
            refused.stderr
        );
        assert!(!fx.backing(&uuid).exists());
        assert!(!fx.registry_file(&uuid).exists());
    }
    // A key file is a path: with it, the plan names it (no default is made).
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&key, fs::Permissions::from_mode(0o400)).unwrap();
    let plan = apply(&fx, &document, true);
    assert_eq!(plan.code, 0, "{}", plan.stderr);
    assert_eq!(plan.json()["after"]["key_file"], "/root/vault.key");
    assert!(!fx.host("/etc/sparse-volume/keys").exists());
    // A key file needs encrypt, on the command line as in a document.
    let flags = fx.run(&[
        "apply",
        "--name",
        "v",
        "--size",
        "64M",
        "--key-file",
        "/root/vault.key",
    ]);
    assert_eq!(flags.code, 2, "{}", flags.stderr);
    let document = r#"{"name": "v", "size": "64M", "key_file": "/root/vault.key"}"#;
    let refused = apply(&fx, document, false);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("needs encrypt = true"),
        "{}",
        refused.stderr
    );
}

#[test]
fn an_existing_volumes_encryption_is_compared_like_the_rest_of_its_spec() {
    needs_root!();
    let fx = Fixture::new();
    fx.run_ok(&["apply", "--name", "plain", "--size", "64M"]);
    let (_, plain) = dry_then_real(&fx, &["apply", "--name", "plain", "--encrypt"]);
    assert_eq!(plain.code, 1, "{}", plain.stdout);
    assert!(
        plain
            .stderr
            .contains("different spec that cannot be changed: not encrypted (asked to encrypt)"),
        "{}",
        plain.stderr
    );
    let said_plain = apply(&fx, r#"{"name": "plain", "encrypt": false}"#, false);
    assert_eq!(said_plain.json()["changed"], false, "{}", said_plain.stderr);
    assert_eq!(said_plain.json()["after"]["encrypted"], false);
    assert!(said_plain.json()["after"]["key_file"].is_null());

    // An encrypted volume as `create --encrypt` registers one (what apply
    // compares is the registry's; no header is opened).
    let uuid = new_uuid();
    fx.sparse_file_of(&fx.backing(&uuid), 64 << 20);
    let key_file = format!("/etc/sparse-volume/keys/{uuid}.key");
    fx.register(
        &uuid,
        "filesystem",
        &format!(
            "name = \"sealed\"\nluks_uuid = \"{}\"\nkey_file = \"{key_file}\"\n",
            new_uuid()
        ),
    );
    let same = apply(
        &fx,
        &format!(r#"{{"name": "sealed", "encrypt": true, "key_file": "{key_file}"}}"#),
        false,
    );
    assert_eq!(same.code, 0, "{}", same.stderr);
    assert_eq!(same.json()["changed"], false, "{}", same.stdout);
    assert_eq!(same.json()["before"]["encrypted"], true);
    assert_eq!(same.json()["before"]["key_file"], key_file.as_str());
    assert!(same.json()["recovery_key"].is_null());
    for (document, difference) in [
        (
            r#"{"name": "sealed", "encrypt": false}"#.to_string(),
            "encrypted (asked not to)".to_string(),
        ),
        (
            r#"{"name": "sealed", "encrypt": true, "key_file": "/root/other.key"}"#.to_string(),
            format!("key file {key_file} (asked /root/other.key)"),
        ),
    ] {
        let before = fs::read_to_string(fx.registry_file(&uuid)).unwrap();
        let (_, refused) = apply_dry_then_real(&fx, &document);
        assert_eq!(refused.code, 1, "{document}: {}", refused.stdout);
        assert!(refused.stderr.contains(&difference), "{}", refused.stderr);
        assert_eq!(fs::read_to_string(fx.registry_file(&uuid)).unwrap(), before);
    }
}
