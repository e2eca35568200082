//! Every kind of `check` finding, produced with real files and real loop
//! devices: its kind, severity, volume and path, and what `--repair` does
//! with it (fixes it, or leaves the data exactly as it was). The last test
//! fails when `check` learns a kind that no test in tests/ produces.

mod common;

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use common::{loops_of, new_uuid, sysfs_flag, tool, Fixture, Run, SIZE};
use serde_json::Value;

/// The name `create` marks an unregistered backing file with.
const CREATING_MARK: &str = "user.sparse-volume.creating";

fn check(fx: &Fixture, repair: bool) -> (Run, Value) {
    let mut args = vec!["check", "--json"];
    if repair {
        args.push("--repair");
    }
    let run = fx.run(&args);
    let report = run.json();
    let clean = report["clean"].as_bool().expect("clean is a boolean");
    assert_eq!(
        run.code,
        if clean { 0 } else { 1 },
        "exit status must follow `clean`: {}",
        run.stdout
    );
    (run, report)
}

fn findings_of<'a>(report: &'a Value, kind: &str) -> Vec<&'a Value> {
    report["findings"]
        .as_array()
        .expect("findings is a list")
        .iter()
        .filter(|f| f["kind"] == kind)
        .collect()
}

/// The one finding of `kind`, with its severity, volume and path checked.
fn the_finding<'a>(
    report: &'a Value,
    kind: &str,
    severity: &str,
    uuid: Option<&str>,
    path: &Path,
) -> &'a Value {
    let found = findings_of(report, kind);
    assert_eq!(found.len(), 1, "one {kind} expected: {report}");
    let finding = found[0];
    assert_eq!(finding["severity"], severity, "{finding}");
    match uuid {
        Some(uuid) => assert_eq!(finding["uuid"], uuid, "{finding}"),
        None => assert!(finding["uuid"].is_null(), "{finding}"),
    }
    assert_eq!(finding["path"], path.to_str().unwrap(), "{finding}");
    finding
}

fn kinds(report: &Value) -> Vec<String> {
    report["findings"]
        .as_array()
        .expect("findings is a list")
        .iter()
        .map(|f| f["kind"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// A registered ext4 volume that nothing is wrong with (not enabled, so
/// that "not attached" is no finding).
fn healthy_volume(fx: &Fixture) -> String {
    let uuid = new_uuid();
    fx.make_ext4(&uuid);
    fx.register(&uuid, "filesystem", "enabled = false\n");
    uuid
}

fn filesystem_uuid(path: &Path) -> String {
    tool(
        "blkid",
        &["-p", "-o", "value", "-s", "UUID", path.to_str().unwrap()],
    )
    .trim()
    .to_string()
}

#[test]
fn a_healthy_registry_is_clean() {
    needs_root!();
    // The control for every test below: without the fault, no finding.
    let fx = Fixture::new();
    healthy_volume(&fx);
    let (_, report) = check(&fx, false);
    assert_eq!(report["clean"], true, "{report}");
    assert_eq!(kinds(&report), Vec::<String>::new());
}

#[test]
fn an_unreadable_registry_file_is_named_and_never_hides_the_others() {
    needs_root!();
    let fx = Fixture::new();
    let good = healthy_volume(&fx);
    let bad = new_uuid();
    let bad_file = fx.registry_file(&bad);
    let text = format!(
        "uuid = \"{bad}\"\npath = \"{}\"\nsize = \"lots\"\nmode = \"filesystem\"\n",
        fx.logical_backing(&bad)
    );
    fs::write(&bad_file, &text).unwrap();

    let (_, report) = check(&fx, false);
    let finding = the_finding(&report, "invalid-registry-file", "error", None, &bad_file);
    let message = finding["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("{}:3:", bad_file.display())),
        "file and line: {message}"
    );
    assert_eq!(kinds(&report), ["invalid-registry-file"], "{report}");

    // Nothing safe to do: the file stays as the operator wrote it.
    let (_, repaired) = check(&fx, true);
    let finding = the_finding(&repaired, "invalid-registry-file", "error", None, &bad_file);
    assert_eq!(finding["repaired"], false);
    assert_eq!(fs::read_to_string(&bad_file).unwrap(), text);
    // The good volume still works.
    let status = fx.run_ok(&["status", &good, "--json"]).json();
    assert_eq!(status["uuid"], good.as_str());
}

#[test]
fn a_leftover_registry_temporary_is_removed_by_repair() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = healthy_volume(&fx);
    let temporary = fx.host(&format!("/etc/sparse-volume/volumes.d/.{uuid}.toml.tmp"));
    fs::write(&temporary, "half a registry entry").unwrap();

    let (_, report) = check(&fx, false);
    the_finding(&report, "registry-temporary", "error", None, &temporary);
    assert!(temporary.exists(), "a plain check changed something");

    let (run, repaired) = check(&fx, true);
    let finding = the_finding(&repaired, "registry-temporary", "error", None, &temporary);
    assert_eq!(finding["repaired"], true, "{}", run.stdout);
    assert_eq!(repaired["changed"], true);
    assert!(!temporary.exists(), "repair left the temporary");
    assert!(
        fx.registry_file(&uuid).exists(),
        "repair took the real entry"
    );
    let (_, after) = check(&fx, false);
    assert_eq!(kinds(&after), Vec::<String>::new());
}

#[test]
fn a_missing_backing_file_is_reported_and_its_entry_kept() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    fx.register(&uuid, "filesystem", "enabled = true\n");
    let path = fx.backing(&uuid);

    let (_, report) = check(&fx, false);
    let finding = the_finding(&report, "missing-backing-file", "error", Some(&uuid), &path);
    assert!(
        finding["message"]
            .as_str()
            .unwrap()
            .contains("does not exist"),
        "{finding}"
    );
    // Not "not attached" on top: there is nothing to attach.
    assert_eq!(kinds(&report), ["missing-backing-file"], "{report}");

    let (_, repaired) = check(&fx, true);
    let finding = the_finding(
        &repaired,
        "missing-backing-file",
        "error",
        Some(&uuid),
        &path,
    );
    assert_eq!(finding["repaired"], false);
    assert!(!path.exists(), "repair invented a backing file");
    assert!(fx.registry_file(&uuid).exists(), "repair dropped the entry");
}

/// Detaches a device whose backing file a test deleted (the fixture
/// finds devices by the files that are still there).
struct DeviceGuard(String);

impl Drop for DeviceGuard {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).output();
    }
}

#[test]
fn a_deleted_backing_file_still_attached_names_the_device_that_holds_the_data() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    let created = fx
        .run_ok(&[
            "create", "--size", "16M", "--uuid", &uuid, "--now", "--json",
        ])
        .json();
    let device = created["device"].as_str().expect("a device").to_string();
    let _guard = DeviceGuard(device.clone());
    let path = fx.backing(&uuid);
    fs::remove_file(&path).unwrap();

    let (_, report) = check(&fx, true);
    let finding = the_finding(&report, "missing-backing-file", "error", Some(&uuid), &path);
    let message = finding["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("{device} still holds its data")),
        "{message}"
    );
    assert_eq!(finding["repaired"], false);
    // The device is the last copy of the data: repair must not drop it.
    let name = device.trim_start_matches("/dev/");
    let backing = fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
        .expect("the device is still bound");
    assert!(backing.contains(&uuid), "{device} now backs {backing}");
}

#[test]
fn an_unsafe_backing_file_is_refused_and_left_alone() {
    needs_root!();
    for (fault, expected) in [
        ("symlink", "is a symbolic link"),
        ("group-writable", "writable by group or others"),
        ("foreign-owner", "owned by uid 65534"),
    ] {
        let fx = Fixture::new();
        let uuid = new_uuid();
        let path = fx.make_ext4(&uuid);
        // Enabled, so that a careless repair would attach it.
        fx.register(&uuid, "filesystem", "enabled = true\n");
        match fault {
            "symlink" => {
                let real = fx.host("/elsewhere");
                fs::rename(&path, &real).unwrap();
                symlink(&real, &path).unwrap();
            }
            "group-writable" => {
                fs::set_permissions(&path, fs::Permissions::from_mode(0o660)).unwrap()
            }
            _ => std::os::unix::fs::chown(&path, Some(65534), None).unwrap(),
        }
        let before = fs::symlink_metadata(&path).unwrap();

        let (_, report) = check(&fx, false);
        let finding = the_finding(&report, "unsafe-backing-file", "error", Some(&uuid), &path);
        assert!(
            finding["message"].as_str().unwrap().contains(expected),
            "{fault}: {finding}"
        );
        assert_eq!(kinds(&report), ["unsafe-backing-file"], "{fault}: {report}");

        let (_, repaired) = check(&fx, true);
        let finding = the_finding(
            &repaired,
            "unsafe-backing-file",
            "error",
            Some(&uuid),
            &path,
        );
        assert_eq!(finding["repaired"], false, "{fault}");
        let after = fs::symlink_metadata(&path).unwrap();
        assert_eq!(
            (before.mode(), before.uid(), before.file_type().is_symlink()),
            (after.mode(), after.uid(), after.file_type().is_symlink()),
            "{fault}: repair changed the file"
        );
        assert!(
            loops_of(&fx.host("/elsewhere")).is_empty() && loops_of(&path).is_empty(),
            "{fault}: repair attached an unsafe file"
        );
    }
}

#[test]
fn a_backing_file_of_another_size_than_recorded_is_reported_both_ways() {
    needs_root!();
    for (delta, hint) in [
        (1i64 << 20, "interrupted resize"),
        (-(1i64 << 20), "the file shrank"),
    ] {
        let fx = Fixture::new();
        let uuid = healthy_volume(&fx);
        let path = fx.backing(&uuid);
        let actual = (SIZE as i64 + delta) as u64;
        fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(actual)
            .unwrap();
        let entry = fs::read_to_string(fx.registry_file(&uuid)).unwrap();

        let (_, report) = check(&fx, true);
        let finding = the_finding(&report, "size-mismatch", "error", Some(&uuid), &path);
        let message = finding["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("({actual} bytes), the registry records "))
                && message.contains(&format!("({SIZE} bytes)"))
                && message.contains(hint),
            "{message}"
        );
        assert_eq!(finding["repaired"], false);
        assert_eq!(fs::metadata(&path).unwrap().len(), actual);
        assert_eq!(fs::read_to_string(fx.registry_file(&uuid)).unwrap(), entry);
    }
}

#[test]
fn a_create_mark_on_a_registered_file_is_cleared_by_repair() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = healthy_volume(&fx);
    let path = fx.backing(&uuid);
    xattr::set(&path, CREATING_MARK, uuid.as_bytes()).expect("user xattrs in the fixture");

    let (_, report) = check(&fx, false);
    the_finding(&report, "stale-create-mark", "error", Some(&uuid), &path);
    // Registered, so never mistaken for an interrupted create.
    assert_eq!(kinds(&report), ["stale-create-mark"], "{report}");

    let (_, repaired) = check(&fx, true);
    let finding = the_finding(&repaired, "stale-create-mark", "error", Some(&uuid), &path);
    assert_eq!(finding["repaired"], true);
    assert_eq!(xattr::get(&path, CREATING_MARK).unwrap(), None);
    assert_eq!(filesystem_uuid(&path), uuid, "repair touched the data");
    let (_, after) = check(&fx, false);
    assert_eq!(kinds(&after), Vec::<String>::new());
}

#[test]
fn content_that_is_not_the_volume_is_never_attached_or_rewritten() {
    needs_root!();
    for (mode, content) in [
        ("filesystem", "ext4 of another uuid"),
        ("block", "ext4 of its own uuid"),
        ("filesystem", "zeros"),
    ] {
        let fx = Fixture::new();
        let uuid = new_uuid();
        let path = fx.backing(&uuid);
        match content {
            "ext4 of another uuid" => {
                fx.sparse_file(&path);
                tool(
                    "mkfs.ext4",
                    &["-q", "-F", "-U", &new_uuid(), path.to_str().unwrap()],
                );
            }
            "ext4 of its own uuid" => {
                fx.make_ext4(&uuid);
            }
            _ => fx.sparse_file(&path),
        }
        fx.register(&uuid, mode, "enabled = true\n");
        let data = fs::read(&path).unwrap();

        let (_, report) = check(&fx, true);
        let finding = the_finding(&report, "content-mismatch", "error", Some(&uuid), &path);
        let message = finding["message"].as_str().unwrap();
        assert!(message.contains(", not "), "{content}: {message}");
        assert!(message.contains(&uuid), "{content}: {message}");
        assert_eq!(finding["repaired"], false, "{content}");
        assert_eq!(
            kinds(&report),
            ["content-mismatch"],
            "{content}: no attach attempt either: {report}"
        );
        assert!(loops_of(&path).is_empty(), "{content}: repair attached it");
        assert!(fs::read(&path).unwrap() == data, "{content}: repair wrote");
    }
}

#[test]
fn committed_growth_beyond_free_space_is_overcommitted() {
    needs_root!();
    let fx = Fixture::new();
    let storage = fx.mount_storage(128 << 20);
    healthy_volume(&fx);
    let (_, report) = check(&fx, false);
    assert!(
        findings_of(&report, "overcommitted").is_empty(),
        "{SIZE} bytes of growth at most on {} free bytes: {report}",
        storage.free()
    );

    // A sparse volume that may grow far beyond the file system.
    let big = new_uuid();
    let path = fx.backing(&big);
    fx.sparse_file_of(&path, 256 << 20);
    tool(
        "mkfs.ext4",
        &["-q", "-F", "-U", &big, path.to_str().unwrap()],
    );
    fx.register(&big, "filesystem", "enabled = false\n");

    let (_, report) = check(&fx, true);
    let finding = the_finding(
        &report,
        "overcommitted",
        "error",
        None,
        &storage.mount_point,
    );
    assert!(
        finding["message"]
            .as_str()
            .unwrap()
            .contains("may still grow by"),
        "{finding}"
    );
    assert_eq!(finding["repaired"], false);
    assert!(path.exists() && fx.registry_file(&big).exists());
}

#[test]
fn two_volumes_with_one_name_are_reported_and_left_as_they_are() {
    needs_root!();
    let fx = Fixture::new();
    let (first, second) = (new_uuid(), new_uuid());
    for uuid in [&first, &second] {
        fx.make_ext4(uuid);
        fx.register(uuid, "filesystem", "enabled = false\nname = \"pg-data\"\n");
    }
    let before: Vec<String> = [&first, &second]
        .iter()
        .map(|u| fs::read_to_string(fx.registry_file(u)).unwrap())
        .collect();
    let (_, report) = check(&fx, true);
    let found = findings_of(&report, "duplicate-name");
    assert_eq!(found.len(), 1, "{report}");
    assert_eq!(found[0]["severity"], "warning");
    let mut uuids = found[0]["uuids"].as_array().unwrap().clone();
    uuids.sort_by_key(|u| u.to_string());
    let mut expected = vec![Value::from(first.clone()), Value::from(second.clone())];
    expected.sort_by_key(|u| u.to_string());
    assert_eq!(uuids, expected);
    assert_eq!(found[0]["repaired"], false);
    // A warning: the volumes are fine otherwise, and nothing was touched.
    assert_eq!(report["clean"], true, "{report}");
    let after: Vec<String> = [&first, &second]
        .iter()
        .map(|u| fs::read_to_string(fx.registry_file(u)).unwrap())
        .collect();
    assert_eq!(before, after);
}

#[test]
fn a_config_that_does_not_validate_is_reported_with_file_and_line() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = healthy_volume(&fx);
    let config = fx.host("/etc/sparse-volume/config.toml");
    let text = "reserve = 0\novercommit_ratio = 0.5\n";
    fs::write(&config, text).unwrap();

    let (_, report) = check(&fx, true);
    let finding = the_finding(&report, "invalid-config", "error", None, &config);
    let message = finding["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("{}:2:", config.display()))
            && message.contains("overcommit_ratio")
            && message.contains("registered volumes still attach"),
        "{message}"
    );
    assert_eq!(finding["repaired"], false);
    assert_eq!(fs::read_to_string(&config).unwrap(), text);
    // The volumes are still audited and still work.
    assert_eq!(kinds(&report), ["invalid-config"], "{report}");
    fx.run_ok(&["attach", &uuid]);
    assert_eq!(loops_of(&fx.backing(&uuid)).len(), 1);
}

/// `check --json` as an unprivileged user.
fn check_as_nobody(fx: &Fixture) -> (Run, Value) {
    let run = fx.run_as_nobody(&["check", "--json"]);
    let report = run.json();
    (run, report)
}

/// Issue 25, item 11: an audit without root says once what it could not
/// read, and does not call the node clean.
#[test]
fn an_unprivileged_audit_says_once_what_it_could_not_verify_and_fails() {
    needs_root!();
    for hidden in ["file", "directory"] {
        let fx = Fixture::new();
        // The registry is world-readable on a real system.
        fs::set_permissions(fx.root.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let uuid = healthy_volume(&fx);
        let other = healthy_volume(&fx);
        let storage = fx.host("/var/lib/sparse-volume");
        let (mode, expected) = match hidden {
            "file" => (0o755, "(its content)"),
            _ => (0o700, "(its file)"),
        };
        fs::set_permissions(&storage, fs::Permissions::from_mode(mode)).unwrap();

        let (run, report) = check_as_nobody(&fx);
        let found = findings_of(&report, "content-not-verified");
        assert_eq!(found.len(), 1, "{hidden}: said more than once: {report}");
        let finding = found[0];
        assert_eq!(finding["severity"], "error", "{finding}");
        let message = finding["message"].as_str().unwrap();
        for id in [&uuid, &other] {
            assert!(
                message.contains(&format!("{id} {expected}")),
                "{hidden}: {message}"
            );
        }
        assert!(message.contains("sudo sparse-volume check"), "{message}");
        assert_eq!(report["clean"], false, "{hidden}: {report}");
        assert_eq!(run.code, 1, "{hidden}: {}", run.stderr);
    }
}

/// Issue 25, item 10: the README's own steps, done without `--now` and
/// with a remove that keeps the data, leave a node that checks clean;
/// what is worth knowing is a warning or a note, naming the volume.
#[test]
fn documented_use_checks_clean_with_warnings_and_notes_that_name_the_volume() {
    needs_root!();
    let fx = Fixture::new();
    let made = fx.run_ok(&["create", "--size", "16M", "--name", "pg-data", "--json"]);
    let uuid = made.json()["uuid"].as_str().unwrap().to_string();
    let gone = fx.run_ok(&["create", "--size", "16M", "--name", "old", "--json"]);
    let gone_uuid = gone.json()["uuid"].as_str().unwrap().to_string();
    fx.run_ok(&["remove", "old"]);

    let (run, report) = check(&fx, false);
    assert_eq!(report["clean"], true, "{report}");
    assert_eq!(run.code, 0);
    let waiting = the_finding(
        &report,
        "not-attached",
        "warning",
        Some(&uuid),
        &fx.backing(&uuid),
    );
    assert_eq!(waiting["name"], "pg-data", "{waiting}");
    let message = waiting["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!("pg-data ({uuid}): "))
            && message.contains("`sparse-volume attach"),
        "{message}"
    );
    the_finding(
        &report,
        "unregistered-file",
        "note",
        None,
        &fx.backing(&gone_uuid),
    );
    let text = fx.run(&["check"]);
    assert_eq!(text.code, 0, "{}", text.stdout);
    assert!(
        text.stdout.contains("warning: not-attached: pg-data ("),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout.contains("note: unregistered-file: "),
        "{}",
        text.stdout
    );
}

// --- without systemd -------------------------------------------------------

const DIRECTLY: &str = "attached directly (cannot reach systemd on the system bus";

#[test]
fn create_now_without_a_bus_says_it_attached_directly() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    let json = fx
        .run_ok(&[
            "create", "--size", "16M", "--uuid", &uuid, "--now", "--json",
        ])
        .json();
    let note = json["note"].as_str().unwrap_or_default();
    assert!(note.starts_with(DIRECTLY), "{json}");
    assert_eq!(loops_of(&fx.backing(&uuid)).len(), 1);

    let other = new_uuid();
    let text = fx.run_ok(&["create", "--size", "16M", "--uuid", &other, "--now"]);
    assert!(text.stdout.contains(DIRECTLY), "{}", text.stdout);
    assert_eq!(loops_of(&fx.backing(&other)).len(), 1);
}

#[test]
fn check_repair_without_a_bus_says_it_attached_directly() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    fx.make_ext4(&uuid);
    fx.register(&uuid, "filesystem", "enabled = true\n");

    let (_, report) = check(&fx, true);
    // No systemd to say the unit failed: the next boot would attach it.
    let finding = the_finding(
        &report,
        "not-attached",
        "warning",
        Some(&uuid),
        &fx.backing(&uuid),
    );
    assert_eq!(finding["repaired"], true);
    assert_eq!(loops_of(&fx.backing(&uuid)).len(), 1);
    assert!(
        finding["message"].as_str().unwrap().contains(DIRECTLY),
        "how the repair was done is not said: {finding}"
    );
    // Issue 25, item 16: how it was repaired follows a semicolon, so
    // systemd's reason is in one pair of parentheses, not two.
    let message = finding["message"].as_str().unwrap();
    assert!(
        message.contains("; attached directly (") && !message.contains("(attached directly"),
        "{finding}"
    );

    for device in loops_of(&fx.backing(&uuid)) {
        tool("losetup", &["-d", &device]);
    }
    let text = fx.run_ok(&["check", "--repair"]);
    assert!(text.stdout.contains(DIRECTLY), "{}", text.stdout);
}

// --- the finding kinds themselves ----------------------------------------

/// The string literals of Rust source, outside comments; enough of a
/// tokenizer for our own code (escapes, raw strings, `'"'`).
fn literals(source: &str) -> Vec<String> {
    let chars: Vec<char> = source.chars().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
            continue;
        }
        if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            i += 3;
            continue;
        }
        if c == '\'' && next == Some('\\') && chars.get(i + 3) == Some(&'\'') {
            i += 4;
            continue;
        }
        let identifier_before = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
        if c == 'r' && !identifier_before && matches!(next, Some('"') | Some('#')) {
            let mut hashes = 0;
            let mut j = i + 1;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) == Some(&'"') {
                let close: String = std::iter::once('"')
                    .chain(std::iter::repeat_n('#', hashes))
                    .collect();
                let rest: String = chars[j + 1..].iter().collect();
                let end = rest.find(&close).unwrap_or(rest.len());
                found.push(rest[..end].to_string());
                i = j + 1 + rest[..end].chars().count() + close.chars().count();
                continue;
            }
        }
        if c == '"' {
            let mut text = String::new();
            let mut j = i + 1;
            while j < chars.len() && chars[j] != '"' {
                // Escapes stay as written: no kind has a backslash.
                if chars[j] == '\\' {
                    text.push('\\');
                    j += 1;
                }
                if let Some(&ch) = chars.get(j) {
                    text.push(ch);
                }
                j += 1;
            }
            found.push(text);
            i = j + 1;
            continue;
        }
        i += 1;
    }
    found
}

/// The finding kinds in `check`'s source: every lowercase kebab-case
/// (or one-word) string literal but the two severities. Kinds are passed
/// around in more ways than one (call arguments, `if` arms, constants),
/// and such literals are almost only kinds there; one that is not makes
/// this test fail loudly rather than pass blindly.
fn finding_kinds(source: &str) -> Vec<String> {
    let mut kinds: Vec<String> = literals(source)
        .into_iter()
        .filter(|text| {
            !text.is_empty()
                && !text.starts_with('-')
                && !text.ends_with('-')
                && !text.contains("--")
                && text.chars().all(|c| c.is_ascii_lowercase() || c == '-')
                && text != "error"
                && text != "warning"
        })
        .collect();
    kinds.sort();
    kinds.dedup();
    kinds
}

/// The sources `check` reports from: check.rs, and a check/ module
/// directory should it be split up.
fn check_sources() -> String {
    let ops = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/commands/inspecting");
    let mut text = fs::read_to_string(ops.join("check.rs")).unwrap_or_default();
    if let Ok(listing) = fs::read_dir(ops.join("check")) {
        for entry in listing.flatten() {
            text.push_str(&fs::read_to_string(entry.path()).unwrap_or_default());
        }
    }
    text
}

#[test]
fn every_finding_kind_check_can_report_is_produced_by_a_test() {
    let reported = finding_kinds(&check_sources());
    // Guards the scanner: an empty list would make this test pass blindly.
    for known in ["content-mismatch", "not-attached", "overcommitted"] {
        assert!(
            reported.iter().any(|k| k == known),
            "scanner missed {known}: {reported:?}"
        );
    }

    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut covered = Vec::new();
    for entry in fs::read_dir(&tests).unwrap().flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "rs") {
            let source = fs::read_to_string(&path).unwrap();
            covered.extend(literals(&source));
        }
    }
    eprintln!("finding kinds in check: {reported:?}");
    // Guards the comparison: a kind no test names is not covered.
    let unheard_of = ["never", "produced"].join("-");
    assert!(!covered.contains(&unheard_of));
    let missing: Vec<&String> = reported.iter().filter(|k| !covered.contains(k)).collect();
    assert!(
        missing.is_empty(),
        "check reports {missing:?}, which no test in tests/*.rs names; add a test that produces it"
    );
}

#[test]
fn the_kind_scanner_reads_literals_not_fragments() {
    let source = "audit.report(\n \"size-mismatch\", x); // f(\"in-comment\")\n\
                  let y = \"a \\\"not-this\\\" b\"; let q = '\"'; g(\"one-two\", \"error\");\n\
                  Finding { kind: \"three\", severity: \"warning\" }; s.join(\"\\n\");\n\
                  if x { \"four-five\" } else { \"Not-Kind\" }; h(r#\"raw-x\"#)";
    assert_eq!(
        finding_kinds(source),
        ["four-five", "one-two", "raw-x", "size-mismatch", "three"]
    );
}

/// Issue 24 item 1: the duplicate-devices repair chose the device to keep
/// before taking the volume lock. A detach, another file bound to the kept
/// device and an attach in that window made it detach the volume's only
/// device and say "repaired".
#[test]
fn a_duplicate_repair_decides_again_under_the_volume_lock() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    fx.run_ok(&["create", "--size", "16M", "--uuid", &uuid]);
    let backing = fx.backing(&uuid);
    let attached = fx.run_ok(&["attach", &uuid, "--json"]).json();
    let first = attached["device"].as_str().unwrap().to_string();
    let duplicate = common::bound_by_hand(&backing, &[]);

    let stopped = fx.run_until(
        sparse_volume::hooks::Stop::CheckBeforeDuplicateRepair,
        &["check", "--repair", "--json"],
    );
    fx.run_ok(&["detach", &uuid]);
    assert!(loops_of(&backing).is_empty());
    // Somebody else's file takes the device check meant to keep.
    let filler = fx.host("/var/tmp/filler");
    fs::create_dir_all(filler.parent().unwrap()).unwrap();
    fx.sparse_file(&filler);
    tool("losetup", &[&first, filler.to_str().unwrap()]);
    let _filler = common::DetachOnDrop::new(first.clone());
    let reattached = fx.run_ok(&["attach", &uuid, "--json"]).json();
    let now = reattached["device"].as_str().unwrap().to_string();
    assert_ne!(now, first);

    let check = stopped.resume();
    let _detach = common::DetachOnDrop::new(now.clone());
    assert_eq!(
        loops_of(&backing),
        vec![now.clone()],
        "check said {}",
        check.stdout
    );
    assert_eq!(loops_of(&filler), vec![first.clone()]);
    let report = check.json();
    let finding = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "duplicate-loop-devices")
        .unwrap_or_else(|| panic!("{report}"))
        .clone();
    assert!(
        finding["message"]
            .as_str()
            .unwrap()
            .contains("no longer so under the volume lock"),
        "{finding}"
    );
    let _ = duplicate;
}

/// Issue 24 item 8: the unowned-device repair ran `LOOP_CLR_FD` on a device
/// another program held open (not exclusively, so no mount or holder shows
/// it): the kernel then set autoclear and released the device when that
/// program closed it, after check had said "repair failed". A repair that
/// cannot finish leaves the device as it was.
#[test]
fn a_repair_that_cannot_detach_an_open_device_leaves_it_as_it_was() {
    needs_root!();
    let fx = Fixture::new();
    let stray = fx.host("/var/lib/sparse-volume/stray");
    fx.sparse_file(&stray);
    let device = common::bound_by_hand(&stray, &[]);
    let _release = common::DetachOnDrop::new(device.clone());
    let holder = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&device)
        .unwrap();

    let (run, report) = check(&fx, true);
    let finding = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "unowned-loop-device")
        .unwrap_or_else(|| panic!("{}", run.stdout))
        .clone();
    assert_eq!(finding["repaired"], false, "{finding}");
    assert!(
        finding["message"].as_str().unwrap().contains("still open"),
        "{finding}"
    );
    assert_eq!(
        sysfs_flag(&device, "loop/autoclear"),
        "0",
        "a detach was left pending"
    );
    drop(holder);
    // A release at the last close happens at once; watched for a second.
    for _ in 0..10 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert_eq!(
            loops_of(&stray),
            vec![device.clone()],
            "released at the holder's close"
        );
    }
}

/// Issue 24 item 5: versions up to 0.2 made a private device node under
/// `/dev` for each writable bind; a kill between its `mknod` and `unlink`
/// left it there (this machine's `/dev` had seven such directories from
/// test runs, three with a `brw------- 7,0` node). Check reports those
/// nobody can still own and `--repair` removes them, never anything else.
#[test]
fn leftover_private_device_nodes_are_reported_and_removed() {
    needs_root!();
    let fx = Fixture::new();
    let dev = fx.host("/dev");
    let plant = |name: &str, content: &str, minutes_ago: u32| {
        let dir = dev.join(name);
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        match content {
            "node" => tool(
                "mknod",
                &[
                    "-m",
                    "0600",
                    dir.join("device").to_str().unwrap(),
                    "b",
                    "7",
                    "250",
                ],
            ),
            "file" => {
                fs::write(dir.join("notes"), "kept").unwrap();
                String::new()
            }
            _ => String::new(),
        };
        let at = format!("{minutes_ago} minutes ago");
        tool("touch", &["-d", &at, dir.to_str().unwrap()]);
        dir
    };
    let with_node = plant(".sparse-volume-AAAAAA", "node", 5);
    let empty = plant(".sparse-volume-BBBBBB", "", 5);
    let foreign = plant(".sparse-volume-CCCCCC", "file", 5);
    let young = plant(".sparse-volume-DDDDDD", "node", 0);

    let (_, report) = check(&fx, false);
    let found: Vec<String> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "leftover-device-node")
        .map(|f| f["path"].as_str().unwrap().to_string())
        .collect();
    let mut expected: Vec<String> = [&with_node, &empty, &foreign]
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    expected.sort();
    let mut found_sorted = found.clone();
    found_sorted.sort();
    assert_eq!(found_sorted, expected, "{report}");

    let (_, repaired) = check(&fx, true);
    assert!(!with_node.exists() && !empty.exists(), "{repaired}");
    assert!(foreign.join("notes").exists(), "removed somebody's file");
    assert!(
        young.join("device").exists(),
        "removed a node that may be in use"
    );
    let refused = repaired["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == foreign.display().to_string().as_str())
        .unwrap()
        .clone();
    assert_eq!(refused["repaired"], false, "{refused}");
    assert!(
        refused["message"].as_str().unwrap().contains("left alone"),
        "{refused}"
    );
}

/// The partition name sgdisk reads from partition 1 of `file`.
fn partition_name(file: &Path) -> String {
    let info = tool("sgdisk", &["-i", "1", file.to_str().unwrap()]);
    info.lines()
        .find_map(|line| line.strip_prefix("Partition name: '"))
        .and_then(|rest| rest.strip_suffix('\''))
        .unwrap_or_else(|| panic!("no partition name in: {info}"))
        .to_string()
}

/// Issue 24 item 9: every block volume's partition was named
/// `sparse-volume`, so N volumes contended for one
/// /dev/disk/by-partlabel/sparse-volume (udev slows down badly on many
/// partitions of one name, systemd issue 20212). A new volume's partition
/// is named with its UUID; an existing one keeps its name and check says
/// how to rename it.
#[test]
fn block_volumes_get_partition_names_of_their_own() {
    needs_root!();
    let fx = Fixture::new();
    let (first, second) = (new_uuid(), new_uuid());
    for uuid in [&first, &second] {
        fx.run_ok(&["create", "--size", "16M", "--mode", "block", "--uuid", uuid]);
        assert_eq!(partition_name(&fx.backing(uuid)), *uuid);
    }
    let (_, clean) = check(&fx, false);
    assert!(
        !clean["findings"]
            .to_string()
            .contains("shared-partition-name"),
        "{clean}"
    );

    // A volume made by an older version, as it named its partition.
    let old = new_uuid();
    let file = fx.make_gpt(&old);
    tool("sgdisk", &["-c", "1:sparse-volume", file.to_str().unwrap()]);
    fx.register(&old, "block", "");
    let (_, report) = check(&fx, false);
    let finding = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "shared-partition-name")
        .unwrap_or_else(|| panic!("{report}"))
        .clone();
    assert_eq!(finding["severity"], "warning", "{finding}");
    assert_eq!(finding["uuid"], old.as_str(), "{finding}");
    let message = finding["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("sgdisk -c 1:{old} ")),
        "{message}"
    );
    // The fix it gives works, and the warning goes.
    tool(
        "sgdisk",
        &["-c", &format!("1:{old}"), file.to_str().unwrap()],
    );
    let (_, fixed) = check(&fx, false);
    assert!(
        !fixed["findings"]
            .to_string()
            .contains("shared-partition-name"),
        "{fixed}"
    );
}

/// Review of issue 24 (H1): a device bound by hand with an offset beside
/// the volume's own was weighed as a duplicate, and the repair could keep
/// it and detach the volume's real device. Such a device is reported as
/// unfit, never kept and never detached by a repair.
#[test]
fn a_device_that_does_not_fit_is_reported_and_never_weighed_as_a_duplicate() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    fx.run_ok(&["create", "--size", "16M", "--uuid", &uuid]);
    let backing = fx.backing(&uuid);
    let own = fx.run_ok(&["attach", &uuid, "--json"]).json()["device"]
        .as_str()
        .unwrap()
        .to_string();
    let unfit = common::bound_by_hand(&backing, &["-o", "1048576"]);
    let _release = (
        common::DetachOnDrop::new(unfit.clone()),
        common::DetachOnDrop::new(own.clone()),
    );

    let (_, report) = check(&fx, true);
    let mut bound = loops_of(&backing);
    bound.sort();
    let mut both = vec![own.clone(), unfit.clone()];
    both.sort();
    assert_eq!(bound, both, "a repair detached one: {report}");
    let findings = report["findings"].as_array().unwrap();
    assert!(
        !findings
            .iter()
            .any(|f| f["kind"] == "duplicate-loop-devices"),
        "{report}"
    );
    let reported = findings
        .iter()
        .find(|f| f["kind"] == "unfit-loop-device")
        .unwrap_or_else(|| panic!("{report}"));
    assert_eq!(reported["repaired"], false, "{reported}");
    let message = reported["message"].as_str().unwrap();
    assert!(
        message.contains(&unfit) && message.contains("offset 1048576"),
        "{message}"
    );
    assert_eq!(report["clean"], false);
}

/// Review of issue 24 (H2): attach refuses a backing path through a
/// symlinked directory below its storage root, so create and register
/// refuse it too, and check reports a volume registered that way before
/// (its unit would fail at the next boot).
#[test]
fn a_backing_path_through_a_linked_directory_is_refused_and_reported() {
    needs_root!();
    let fx = Fixture::new();
    let real = fx.host("/var/lib/real-data");
    fs::create_dir_all(&real).unwrap();
    std::os::unix::fs::symlink(&real, fx.host("/var/lib/sparse-volume/sub")).unwrap();
    let uuid = new_uuid();
    let path = format!("/var/lib/sparse-volume/sub/{uuid}");
    let refused = fx.run(&["create", "--size", "16M", "--uuid", &uuid, "--path", &path]);
    assert_eq!(refused.code, 1, "{}", refused.stdout);
    assert!(
        refused.stderr.contains("symbolic link"),
        "{}",
        refused.stderr
    );
    assert!(
        fs::read_dir(&real).unwrap().next().is_none(),
        "create made a file"
    );

    // As an older version let it be made: check says what attach will do.
    let file = real.join(&uuid);
    fx.sparse_file(&file);
    tool(
        "mkfs.ext4",
        &["-q", "-F", "-U", &uuid, file.to_str().unwrap()],
    );
    let registered = fx.run(&["register", "--uuid", &uuid, "--path", &path]);
    assert_eq!(registered.code, 1, "{}", registered.stdout);
    fs::write(
        fx.registry_file(&uuid),
        format!("uuid = \"{uuid}\"\npath = \"{path}\"\nsize = {SIZE}\nmode = \"filesystem\"\n"),
    )
    .unwrap();
    let (_, report) = check(&fx, false);
    let finding = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "linked-directory-in-path")
        .unwrap_or_else(|| panic!("{report}"))
        .clone();
    assert_eq!(finding["uuid"], uuid.as_str());
    assert!(
        finding["message"]
            .as_str()
            .unwrap()
            .contains("attach refuses it"),
        "{finding}"
    );
}

/// Issue 25, item 2: reports say what is true of the device. A volume
/// made read-only while attached stays read-write until its next attach:
/// `list` and `status` say so, and `check` warns of the difference.
#[test]
fn a_read_only_flag_that_waits_for_the_next_attach_is_reported_as_such() {
    needs_root!();
    let fx = Fixture::new();
    let made = fx.run_ok(&["create", "--size", "16M", "--name", "pg", "--now", "--json"]);
    let uuid = made.json()["uuid"].as_str().unwrap().to_string();
    let _detach = common::DetachOnDrop::new(made.json()["device"].as_str().unwrap().to_string());
    fx.run_ok(&["apply", "--name", "pg", "--read-only", "true"]);

    let listed = fx.run_ok(&["list", "--json"]).json();
    assert_eq!(listed["volumes"][0]["read_only"], true, "{listed}");
    assert_eq!(listed["volumes"][0]["device_read_only"], false, "{listed}");
    let table = fx.run_ok(&["list"]);
    assert!(!table.stdout.contains(" ro"), "{}", table.stdout);
    let status = fx.run_ok(&["status", "pg"]);
    assert!(
        status
            .stdout
            .contains("read-write now, read-only from the next attach"),
        "{}",
        status.stdout
    );
    let (_, report) = check(&fx, false);
    let pending = the_finding(
        &report,
        "read-only-pending",
        "warning",
        Some(&uuid),
        &fx.backing(&uuid),
    );
    let message = pending["message"].as_str().unwrap();
    assert!(message.contains("next attach"), "{pending}");
    // What the device is now, in the scanner's words too.
    assert!(
        message.contains(&format!("is {}", "read-write")),
        "{pending}"
    );

    fx.run_ok(&["detach", "pg"]);
    let attached = fx.run_ok(&["attach", "pg", "--json"]).json();
    let _detach_again = common::DetachOnDrop::new(attached["device"].as_str().unwrap().to_string());
    let listed = fx.run_ok(&["list", "--json"]).json();
    assert_eq!(listed["volumes"][0]["device_read_only"], true, "{listed}");
    assert!(fx.run_ok(&["list"]).stdout.contains("ext4 ro"));
    let (_, report) = check(&fx, false);
    assert!(
        findings_of(&report, "read-only-pending").is_empty(),
        "{report}"
    );
    fx.run_ok(&["detach", "pg"]);
}
