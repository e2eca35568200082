//! Regressions for defects that could lose data or leave an unreadable
//! registry (issue 9): each test reproduces a report on the code before
//! its fix. Real loop devices, real files, root.

mod common;

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{loops_of, new_uuid, tool, Fixture};

fn storage_root_names(fx: &Fixture) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(fx.host("/var/lib/sparse-volume"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn findings(fx: &Fixture) -> String {
    fx.run(&["check", "--json"]).json()["findings"].to_string()
}

fn device_of(run: &common::Run) -> String {
    run.json()["device"].as_str().unwrap().to_string()
}

/// The loop devices whose backing file lies inside this fixture (also
/// deleted ones, which `losetup -j` can no longer find by path).
fn devices_in_fixture(fx: &Fixture) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for entry in fs::read_dir("/sys/block").unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Ok(backing) = fs::read_to_string(entry.path().join("loop/backing_file")) {
            if backing.starts_with(fx.root.path().to_str().unwrap()) {
                found.push((format!("/dev/{name}"), backing.trim_end().to_string()));
            }
        }
    }
    found
}

fn detach_all_in_fixture(fx: &Fixture) {
    for (device, _) in devices_in_fixture(fx) {
        let _ = Command::new("losetup").args(["-d", &device]).status();
    }
}

#[test]
fn a_name_the_parser_refuses_is_refused_before_anything_is_created() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    let run = fx.run(&["create", "--size", "16M", "--uuid", &uuid, "--name", "a\tb"]);
    // A usage error (issue 25, item 16), as in apply.
    assert_eq!(run.code, 2, "accepted a control character: {}", run.stdout);
    assert!(run.stderr.contains("control characters"), "{}", run.stderr);
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    assert!(!fx.registry_file(&uuid).exists());
    assert!(
        storage_root_names(&fx).is_empty(),
        "{:?}",
        storage_root_names(&fx)
    );
}

#[test]
fn a_non_utf8_path_is_refused_in_one_line_leaving_nothing() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    let path = std::ffi::OsStr::from_bytes(b"/var/lib/sparse-volume/\xff");
    let output = fx
        .command(&["create", "--size", "16M", "--uuid", &uuid, "--path"])
        .arg(path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("UTF-8"), "{stderr}");
    assert!(
        storage_root_names(&fx).is_empty(),
        "{:?}",
        storage_root_names(&fx)
    );
    assert!(!fx.registry_file(&uuid).exists());
}

#[test]
fn hidden_and_creating_names_cannot_be_volume_paths() {
    needs_root!();
    // Was: create A at ".B.creating", then `create --uuid B` deleted A's
    // file as B's stale temporary.
    let fx = Fixture::new();
    let (a, b) = (new_uuid(), new_uuid());
    let hidden = format!("/var/lib/sparse-volume/.{b}.creating");
    let run = fx.run(&["create", "--size", "16M", "--uuid", &a, "--path", &hidden]);
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(run.stderr.contains("reserved"), "{}", run.stderr);
    assert!(storage_root_names(&fx).is_empty());
    fx.run_ok(&["create", "--size", "16M", "--uuid", &b]);
    assert_eq!(storage_root_names(&fx), vec![b]);
}

#[test]
fn remove_never_deletes_a_file_that_is_not_the_volumes() {
    needs_root!();
    let fx = Fixture::new();
    let (mine, neighbour) = (new_uuid(), new_uuid());
    fx.run_ok(&["create", "--size", "16M", "--uuid", &mine]);
    fx.run_ok(&["create", "--size", "16M", "--uuid", &neighbour]);
    // A hand-edited entry that points at the neighbour's file.
    let entry = fs::read_to_string(fx.registry_file(&mine)).unwrap();
    let edited = entry.replace(
        &format!("sparse-volume/{mine}\""),
        &format!("sparse-volume/{neighbour}\""),
    );
    assert_ne!(entry, edited);
    fs::write(fx.registry_file(&mine), edited).unwrap();

    let neighbours_device = device_of(&fx.run_ok(&["attach", &neighbour, "--json"]));
    let run = fx.run(&["remove", &mine, "--delete-data"]);
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(run.stderr.contains("not deleting"), "{}", run.stderr);
    assert_eq!(
        loops_of(&fx.backing(&neighbour)),
        vec![neighbours_device],
        "the refused remove detached the neighbour"
    );
    fx.run_ok(&["detach", &neighbour]);
    assert!(
        fx.backing(&neighbour).exists(),
        "the neighbour's data is gone"
    );
    assert!(
        fx.registry_file(&mine).exists(),
        "unregistered after a refusal"
    );
}

#[test]
fn an_attach_racing_remove_delete_data_never_binds_the_deleted_file() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    fx.run_ok(&["create", "--size", "16M", "--uuid", &uuid]);
    // Slow down every unlink of the remove, so that an attach starts in
    // the window between its detach and the deletion of the file.
    let remove = Command::new("strace")
        .args([
            "-f",
            "-o",
            "/dev/null",
            "-e",
            "inject=unlink,unlinkat:delay_enter=1500000",
        ])
        .arg(env!("CARGO_BIN_EXE_sparse-volume"))
        .args(["remove", &uuid, "--delete-data"])
        .env("SPARSE_VOLUME_ROOT", fx.root.path())
        .env("DBUS_SYSTEM_BUS_ADDRESS", fx.absent_bus())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let attach = fx.run(&["attach", &uuid]);
    let removed = remove.wait_with_output().unwrap();
    assert!(
        removed.status.success(),
        "{}",
        String::from_utf8_lossy(&removed.stderr)
    );
    let left = devices_in_fixture(&fx);
    detach_all_in_fixture(&fx);
    assert!(
        left.is_empty(),
        "a loop device is bound to the deleted file: {left:?}"
    );
    assert_eq!(attach.code, 1, "attach reported success: {}", attach.stdout);
    assert!(
        attach.stderr.contains("not registered"),
        "{}",
        attach.stderr
    );
}

/// Holds the per-volume lock the way another sparse-volume would, until
/// the returned shell's stdin is closed.
fn hold_volume_lock(fx: &Fixture, uuid: &str) -> std::process::Child {
    let lock = fx.host(&format!("/run/sparse-volume/{uuid}.lock"));
    fs::create_dir_all(lock.parent().unwrap()).unwrap();
    let mut holder = Command::new("sh")
        .args([
            "-c",
            "exec 9>\"$1\" && flock 9 && echo locked && read _",
            "sh",
        ])
        .arg(&lock)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "locked");
    holder
}

fn release(mut holder: std::process::Child) {
    drop(holder.stdin.take());
    holder.wait().unwrap();
}

/// Spawns `args` and reports whether it was still waiting after a while.
fn waits_for_the_lock(fx: &Fixture, args: &[&str]) -> (bool, std::process::Child) {
    let mut child = fx
        .command(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let waiting = child.try_wait().unwrap().is_none();
    (waiting, child)
}

#[test]
fn resize_and_repair_wait_for_the_volume_lock() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    fx.run_ok(&["create", "--size", "16M", "--uuid", &uuid]);

    let holder = hold_volume_lock(&fx, &uuid);
    let (waited, mut resize) = waits_for_the_lock(&fx, &["resize", &uuid, "--size", "32M"]);
    let size_meanwhile = fs::metadata(fx.backing(&uuid)).unwrap().len();
    release(holder);
    assert!(resize.wait().unwrap().success());
    assert!(
        waited,
        "resize ran while another process held the volume lock"
    );
    assert_eq!(size_meanwhile, 16 << 20, "the file grew under a held lock");

    // Two devices on the file: check --repair detaches one, under the lock.
    let file = fx.backing(&uuid);
    tool("losetup", &["-f", file.to_str().unwrap()]);
    tool("losetup", &["-f", file.to_str().unwrap()]);
    let holder = hold_volume_lock(&fx, &uuid);
    let (waited, mut repair) = waits_for_the_lock(&fx, &["check", "--repair"]);
    let devices_meanwhile = loops_of(&file).len();
    release(holder);
    repair.wait().unwrap();
    assert!(
        waited,
        "check --repair detached while the volume lock was held"
    );
    assert_eq!(devices_meanwhile, 2);
    assert_eq!(loops_of(&file).len(), 1);
}

/// A create killed after its registry entry was written but before the
/// creating mark was cleared.
fn create_killed_before_unmark(fx: &Fixture, uuid: &str) {
    let status = fx
        .command(&["create", "--size", "16M", "--uuid", uuid])
        .env(sparse_volume::hooks::CRASH_ENV, "create:before-unmark")
        .status()
        .unwrap();
    assert!(!status.success(), "not killed");
    assert!(fx.registry_file(uuid).exists());
}

#[test]
fn data_kept_by_remove_is_never_taken_for_an_interrupted_create() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    create_killed_before_unmark(&fx, &uuid);
    fx.run_ok(&["remove", &uuid]);
    let report = fx.run(&["check", "--repair", "--json"]);
    assert!(
        fx.backing(&uuid).exists(),
        "check --repair deleted data that remove kept: {}",
        report.stdout
    );
    assert!(
        report.stdout.contains("unregistered-file"),
        "{}",
        report.stdout
    );
}

#[test]
fn rerunning_an_interrupted_create_clears_the_mark() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    create_killed_before_unmark(&fx, &uuid);
    let again = fx
        .run_ok(&["create", "--size", "16M", "--uuid", &uuid, "--json"])
        .json();
    assert_eq!(again["changed"], false);
    assert!(
        !findings(&fx).contains("stale-create-mark"),
        "{}",
        findings(&fx)
    );
}

#[test]
fn a_file_named_by_an_unreadable_registry_file_is_owned() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    create_killed_before_unmark(&fx, &uuid);
    let device = device_of(&fx.run_ok(&["attach", &uuid, "--json"]));
    let text = fs::read_to_string(fx.registry_file(&uuid)).unwrap();
    let broken = text.replace("size = ", "size = \"oops\"\nsizes = ");
    fs::write(fx.registry_file(&uuid), broken).unwrap();

    let found = findings(&fx);
    assert!(found.contains("invalid-registry-file"), "{found}");
    for wrong in [
        "unregistered-file",
        "unowned-loop-device",
        "interrupted-create",
    ] {
        assert!(!found.contains(wrong), "{wrong}: {found}");
    }
    fx.run(&["check", "--repair"]);
    assert!(
        fx.backing(&uuid).exists(),
        "check --repair deleted a live file"
    );
    assert_eq!(loops_of(&fx.backing(&uuid)), vec![device]);
}

#[test]
fn check_never_detaches_the_last_copy_of_deleted_data() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    fx.run_ok(&["create", "--size", "16M", "--uuid", &uuid]);
    let device = device_of(&fx.run_ok(&["attach", &uuid, "--json"]));
    fs::remove_file(fx.backing(&uuid)).unwrap();

    let found = findings(&fx);
    let repaired = fx.run(&["check", "--repair", "--json"]);
    let still = devices_in_fixture(&fx);
    detach_all_in_fixture(&fx);
    assert!(found.contains("deleted-backing-file"), "{found}");
    assert!(found.contains("register"), "no recovery advice: {found}");
    assert_eq!(repaired.code, 1, "{}", repaired.stdout);
    assert_eq!(
        still.iter().map(|(d, _)| d.clone()).collect::<Vec<_>>(),
        vec![device],
        "the device holding the only copy was detached"
    );
}

#[test]
fn unknown_keys_warn_and_keep_every_volume_working() {
    needs_root!();
    let fx = Fixture::new();
    fs::write(
        fx.host("/etc/sparse-volume/config.toml"),
        "overcommit = 2.0\n",
    )
    .unwrap();
    let uuid = new_uuid();
    let created = fx.run_ok(&["create", "--size", "16M", "--uuid", &uuid]);
    assert!(
        created
            .stderr
            .contains("unknown key \"overcommit\" (did you mean \"overcommit_ratio\"?)"),
        "{}",
        created.stderr
    );
    let mut entry = fs::OpenOptions::new()
        .append(true)
        .open(fx.registry_file(&uuid))
        .unwrap();
    std::io::Write::write_all(&mut entry, b"frobnicate = 1\n").unwrap();
    let attached = fx.run_ok(&["attach", &uuid]);
    assert!(
        attached.stderr.contains("frobnicate"),
        "{}",
        attached.stderr
    );
    let check = fx.run(&["check", "--json"]);
    assert_eq!(check.code, 0, "{}", check.stdout);
    assert!(check.stdout.contains("unknown-key"), "{}", check.stdout);
    fx.run_ok(&["detach", &uuid]);
}

#[test]
fn a_broken_config_leaves_registered_volumes_attaching_and_stops_provisioning() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    fx.run_ok(&["create", "--size", "16M", "--uuid", &uuid]);
    fs::write(
        fx.host("/etc/sparse-volume/config.toml"),
        "storage_roots = [\n",
    )
    .unwrap();
    let attached = fx.run_ok(&["attach", &uuid]);
    assert!(
        attached.stderr.contains("built-in defaults"),
        "{}",
        attached.stderr
    );
    fx.run_ok(&["detach", &uuid]);
    let refused = fx.run(&["create", "--size", "16M"]);
    assert_eq!(refused.code, 1);
    assert!(refused.stderr.contains("config.toml"), "{}", refused.stderr);
}

#[test]
fn a_volume_outside_the_configured_roots_still_attaches() {
    needs_root!();
    // `apt-get purge` removes config.toml and with it a second root.
    let fx = Fixture::new();
    let second = fx.host("/srv/volumes");
    fs::create_dir_all(&second).unwrap();
    let config = fx.host("/etc/sparse-volume/config.toml");
    fs::write(
        &config,
        "storage_roots = [\"/var/lib/sparse-volume\", \"/srv/volumes\"]\n",
    )
    .unwrap();
    let uuid = new_uuid();
    let path = format!("/srv/volumes/{uuid}");
    fx.run_ok(&["create", "--size", "16M", "--uuid", &uuid, "--path", &path]);
    fs::remove_file(&config).unwrap();
    let attached = fx.run(&["attach", &uuid]);
    if let Some(device) = loops_of(&second.join(&uuid)).first() {
        let _ = Command::new("losetup").args(["-d", device]).status();
    }
    assert_eq!(attached.code, 0, "{}", attached.stderr);
}

#[test]
fn capacity_refusals_say_how_to_allow_more() {
    needs_root!();
    let fx = Fixture::new();
    let run = fx.run(&["create", "--size", "1P"]);
    assert_eq!(run.code, 1);
    for needle in ["overcommit_ratio", "reserve", "config.toml"] {
        assert!(run.stderr.contains(needle), "{needle}: {}", run.stderr);
    }
}

#[test]
fn non_root_gets_one_clear_line_and_can_still_read() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    fx.run_ok(&["create", "--size", "16M", "--uuid", &uuid]);
    fx.open_directories_to_everyone();
    let create = fx.run_as_nobody(&["create", "--size", "16M"]);
    assert_eq!(create.code, 1);
    assert!(create.stderr.contains("needs root"), "{}", create.stderr);
    assert_eq!(create.stderr.lines().count(), 1, "{}", create.stderr);
    let device = device_of(&fx.run_ok(&["attach", &uuid, "--json"]));
    for args in [&["list"][..], &["status", &uuid]] {
        let run = fx.run_as_nobody(args);
        assert!(
            !run.stderr.contains("Permission denied"),
            "{args:?}: {}",
            run.stderr
        );
        assert!(
            run.stdout.contains(device.trim_start_matches("/dev/")),
            "{args:?} misses the device: {}",
            run.stdout
        );
    }
    // The data is root's (0600): the audit says so (and so cannot call the
    // node clean), and still sees the device.
    let check = fx.run_as_nobody(&["check"]);
    assert_eq!(check.code, 1, "{}{}", check.stdout, check.stderr);
    assert!(
        check.stdout.contains("not verified without root"),
        "{}",
        check.stdout
    );
    assert!(!check.stdout.contains("not-attached"), "{}", check.stdout);
    fx.run_ok(&["detach", &uuid]);
}

#[test]
fn a_registry_file_that_is_not_even_text_still_owns_its_file() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    create_killed_before_unmark(&fx, &uuid);
    let mut bytes = fs::read(fx.registry_file(&uuid)).unwrap();
    bytes.extend_from_slice(b"name = \"caf\xe9\"\n");
    fs::write(fx.registry_file(&uuid), bytes).unwrap();
    let repaired = fx.run(&["check", "--repair", "--json"]);
    assert!(
        fx.backing(&uuid).exists(),
        "check --repair deleted a registered volume's file: {}",
        repaired.stdout
    );
}

#[test]
fn stop_and_remove_never_detach_the_last_copy_of_deleted_data() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    fx.run_ok(&["create", "--size", "16M", "--uuid", &uuid]);
    let device = device_of(&fx.run_ok(&["attach", &uuid, "--json"]));
    fs::remove_file(fx.backing(&uuid)).unwrap();
    let removed = fx.run(&["remove", &uuid]);
    let still = devices_in_fixture(&fx);
    detach_all_in_fixture(&fx);
    assert_eq!(removed.code, 1, "{}", removed.stdout);
    assert!(removed.stderr.contains("only copy"), "{}", removed.stderr);
    assert_eq!(
        still.iter().map(|(d, _)| d.clone()).collect::<Vec<_>>(),
        vec![device]
    );
    assert!(fx.registry_file(&uuid).exists());
}

/// A file attached twice (by hand) may be mounted through the device
/// resize would not use: growing it then would run e2fsck and an offline
/// resize2fs against a live file system. resize refuses and changes nothing.
#[test]
fn resize_refuses_a_file_attached_through_two_devices() {
    needs_root!();
    let fx = Fixture::new();
    let created = fx
        .run_ok(&["create", "--size", "64M", "--now", "--json"])
        .json();
    let uuid = created["uuid"].as_str().unwrap().to_string();
    let file = fx.backing(&uuid);
    let second = tool("losetup", &["--find", "--show", file.to_str().unwrap()])
        .trim()
        .to_string();
    let registry_before = fs::read(fx.registry_file(&uuid)).unwrap();

    let run = fx.run(&["resize", &uuid, "--size", "128M"]);
    let _ = Command::new("losetup").args(["-d", &second]).status();
    assert_eq!(run.code, 1, "resize should refuse: {}", run.stdout);
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    assert!(run.stderr.contains("2 loop devices"), "{}", run.stderr);
    assert!(run.stderr.contains(&second), "{}", run.stderr);
    assert_eq!(
        fs::metadata(&file).unwrap().len(),
        64 << 20,
        "the file grew"
    );
    assert_eq!(fs::read(fx.registry_file(&uuid)).unwrap(), registry_before);
    fx.run_ok(&["detach", &uuid]);
}

/// Issue 24 item 10: a command waiting for a lock said nothing; now it
/// says once, on stderr, what it waits for and which process holds it,
/// and by hand it waits as long as it takes.
#[test]
fn a_command_waiting_for_a_lock_says_once_who_holds_it() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    fx.run_ok(&["create", "--size", "16M", "--uuid", &uuid]);
    // flock(1) holds the lock itself while its command runs.
    let lock = fx.host(&format!("/run/sparse-volume/{uuid}.lock"));
    // -o: the command does not inherit the lock, so a kill of flock(1)
    // releases it.
    let mut holder = Command::new("flock")
        .arg("-o")
        .arg(&lock)
        .args(["sleep", "60"])
        .spawn()
        .unwrap();
    let holder_pid = holder.id();
    while !fs::read_to_string("/proc/locks")
        .unwrap()
        .contains(&format!(" {holder_pid} "))
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    let attach = fx
        .command(&["attach", &uuid])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        common::ends_or_waits_for_a_lock(attach.id()),
        "attach did not wait for the held lock"
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
    let output = attach.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let waiting: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("waiting for"))
        .collect();
    assert_eq!(waiting.len(), 1, "{stderr}");
    assert!(
        waiting[0].contains(&format!(
            "{uuid}.lock, held by process {holder_pid} (flock)"
        )),
        "{stderr}"
    );
    fx.run_ok(&["detach", &uuid]);
}
