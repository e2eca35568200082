//! `list` as a person reads it, on a real registry: 200 volumes fit 100
//! columns, colour only on a terminal that wants it, `--json` keeps its
//! keys, and a warning is said once, not once per volume.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;
use std::process::Command;

use common::{Fixture, Run};

const COUNT: usize = 200;
const SIZES: [u64; 5] = [64 << 20, 1 << 30, 10 << 30, 3 << 29, 320 << 20];
const SECOND_ROOT: &str = "/srv/volumes";

/// Volume `i`'s UUID: fixed, so the listing is; every twentieth shares its
/// first group with the others, so their short ids must grow.
fn uuid(i: usize) -> String {
    let first = if i.is_multiple_of(20) {
        "c0ffee00".to_string()
    } else {
        format!("{:08x}", 0x1000_0000 + i * 0x0101_0101)
    };
    format!("{first}-{i:04x}-4000-8000-{i:012x}")
}

fn name(i: usize) -> Option<String> {
    match i % 4 {
        _ if i == 5 => Some(format!("データベース-{i}")),
        0 => None,
        1 => Some(format!("pvc-{i}")),
        2 => Some(format!(
            "analytics-warehouse-replica-{i}-for-the-reporting-cluster-in-availability-zone-b"
        )),
        _ => Some(format!("app-{}", i % 7)),
    }
}

/// Columns a line takes on a terminal: the test's names are ASCII but
/// for one Japanese name, whose characters take two.
fn columns(line: &str) -> usize {
    line.chars()
        .map(|c| {
            if ('\u{3000}'..='\u{9fff}').contains(&c) {
                2
            } else {
                1
            }
        })
        .sum()
}

/// 200 volumes: the first made by `create` (its registry file is the
/// template for the others, so they are what the CLI writes), 150 on a
/// small file system mounted over the first storage root (short of
/// space), 50 small ones under a second storage root; every backing file a real
/// sparse file.
struct Registry200<'a> {
    fx: &'a Fixture,
    _storage: common::MountedStorage<'a>,
}

impl<'a> Registry200<'a> {
    fn new(fx: &'a Fixture) -> Self {
        let storage = fx.mount_storage(64 << 20);
        fs::create_dir_all(fx.host(SECOND_ROOT)).unwrap();
        fs::write(
            fx.host("/etc/sparse-volume/config.toml"),
            format!("storage_roots = [\"/var/lib/sparse-volume\", \"{SECOND_ROOT}\"]\n"),
        )
        .unwrap();
        let first = uuid(0);
        fx.run_ok(&["create", "--size", "16M", "--uuid", &first]);
        let template = fs::read_to_string(fx.registry_file(&first)).unwrap();
        assert!(template.contains("direct_io = true"), "{template}");
        for i in 1..COUNT {
            let id = uuid(i);
            let directory = if i < 150 {
                "/var/lib/sparse-volume"
            } else {
                SECOND_ROOT
            };
            let path = format!("{directory}/{id}");
            // Small under the second root: its file system is the
            // machine's, and must not be short wherever the test runs.
            let size = if i < 150 {
                SIZES[i % SIZES.len()]
            } else {
                1 << 20
            };
            fx.sparse_file_of(&fx.host(&path), size);
            let mut text = template
                .replace(&first, &id)
                .replace(&format!("/var/lib/sparse-volume/{id}"), &path)
                .replace("size = 16777216", &format!("size = {size}"));
            if i % 5 == 4 {
                text = text.replace("enabled = true", "enabled = false");
            }
            if i.is_multiple_of(9) {
                text = text.replace("read_only = false", "read_only = true");
            }
            if i.is_multiple_of(3) {
                text = text
                    .replace("mode = \"filesystem\"\n", "mode = \"block\"\n")
                    .replace("fs_type = \"ext4\"\n", "");
            }
            if let Some(name) = name(i) {
                // Where the CLI puts it: right after the UUID.
                text = text.replacen('\n', &format!("\nname = \"{name}\"\n"), 1);
            }
            fs::write(fx.registry_file(&id), text).unwrap();
        }
        let listed = fx.run(&["list", "--json"]);
        assert_eq!(listed.code, 0, "{}", listed.stderr);
        assert_eq!(listed.json()["volumes"].as_array().unwrap().len(), COUNT);
        Self {
            fx,
            _storage: storage,
        }
    }
}

/// `list` with its output piped, at `columns` (None: `COLUMNS` unset).
fn list(fx: &Fixture, columns: Option<&str>, args: &[&str]) -> Run {
    let mut command = fx.command(&[&["list"], args].concat());
    command.env_remove("NO_COLOR").env("TERM", "xterm");
    match columns {
        Some(c) => command.env("COLUMNS", c),
        None => command.env_remove("COLUMNS"),
    };
    let output = command.output().expect("running sparse-volume");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Loop device numbers and the footer's free-space figures (they depend
/// on the machine) as `N`; everything else exactly.
fn normalise(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let footer = !line.contains("  ") && line.contains(" free of ");
        let mut chars = line.chars().peekable();
        let mut word = String::new();
        while let Some(c) = chars.next() {
            word.push(c);
            if c == ' ' || chars.peek().is_none() {
                out.push_str(&normalise_word(&word, footer));
                word.clear();
            }
        }
        out.push('\n');
    }
    out
}

fn normalise_word(word: &str, footer: bool) -> String {
    let (body, space) = match word.strip_suffix(' ') {
        Some(body) => (body, " "),
        None => (word, ""),
    };
    if let Some(number) = body.strip_prefix("loop") {
        let digits = number.trim_end_matches("p1");
        if !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit()) {
            // Padded to the name's width, so the column stays aligned
            // whether the kernel gave loop7 or loop14.
            let normalised = format!("loopN{}", &number[digits.len()..]);
            let pad = " ".repeat(body.len().saturating_sub(normalised.len()));
            return format!("{normalised}{pad}{space}");
        }
    }
    if footer {
        let number = body.trim_end_matches([';', ':', ',']);
        let tail = &body[number.len()..];
        if let Some(digits) = number.strip_suffix(['B', 'K', 'M', 'G', 'T', 'P', 'E']) {
            if !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit() || c == '.') {
                return format!("N{tail}{space}");
            }
        }
    }
    word.to_string()
}

fn golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/list_layout")
        .join(name);
    if std::env::var_os("SPARSE_VOLUME_BLESS").is_some() {
        fs::write(&path, actual).expect("writing the golden file");
    }
    let expected =
        fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    assert!(
        actual == expected,
        "{name} differs; after a deliberate change run with SPARSE_VOLUME_BLESS=1 and review the diff\n--- actual\n{actual}"
    );
}

#[test]
fn two_hundred_volumes_fit_a_hundred_columns() {
    needs_root!();
    let fx = Fixture::new();
    let world = Registry200::new(&fx);
    let device = common::tool(
        "losetup",
        &[
            "--find",
            "--show",
            world.fx.backing(&uuid(0)).to_str().unwrap(),
        ],
    );
    let device = device.trim();
    // A device made by losetup, not by attach: it shows all the same.
    let _detach = Detach(device.to_string());

    for width in [Some("100"), None] {
        let run = list(&fx, width, &[]);
        assert_eq!(run.code, 0, "{}", run.stderr);
        let lines: Vec<&str> = run.stdout.lines().collect();
        assert_eq!(lines.len(), 1 + COUNT + 1 + 3, "{}", run.stdout);
        for line in &lines {
            assert!(columns_fit(line, 100), "{} columns: {line}", columns(line));
        }
        assert!(!run.stdout.contains('\x1b'), "colour in a pipe");
        golden("200-volumes.txt", &normalise(&run.stdout));
    }
    // A narrower terminal cuts names, never a column.
    let narrow = list(&fx, Some("80"), &[]);
    for line in narrow.stdout.lines().take(1 + COUNT) {
        assert!(columns_fit(line, 80), "{} columns: {line}", columns(line));
        assert!(
            ["STATE", "attached", "detached", "disabled"]
                .iter()
                .any(|s| line.ends_with(s)),
            "{line}"
        );
    }
    // --wide is every column, however long.
    let wide = list(&fx, Some("100"), &["--wide"]);
    assert!(wide.stdout.starts_with("UUID  "), "{}", wide.stdout);
    // Every column: the compact table's too (issue 25, item 17).
    let header: Vec<&str> = wide
        .stdout
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    for column in [
        "NAME", "MODE", "FS", "RO", "SIZE", "ALLOC", "ENABLED", "DEVICE", "STATE", "UNIT", "PATH",
    ] {
        assert!(header.contains(&column), "{column} missing: {header:?}");
    }
    assert!(wide.stdout.lines().any(|l| l.starts_with(&uuid(0))));
    assert!(wide
        .stdout
        .contains(&format!("{SECOND_ROOT}/{}", uuid(199))));
    assert!(wide.stdout.contains(device), "{}", wide.stdout);
}

fn columns_fit(line: &str, limit: usize) -> bool {
    columns(line) <= limit
}

struct Detach(String);

impl Drop for Detach {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// `list` under a pseudo-terminal (util-linux `script`), so that standard
/// output is a terminal.
fn list_on_a_terminal(fx: &Fixture, no_color: Option<&str>, term: &str) -> String {
    let binary = env!("CARGO_BIN_EXE_sparse-volume");
    let mut command = Command::new("script");
    command
        .args(["-qec", &format!("'{binary}' list"), "/dev/null"])
        .env("SPARSE_VOLUME_ROOT", fx.root.path())
        .env("DBUS_SYSTEM_BUS_ADDRESS", fx.absent_bus())
        .env("TERM", term)
        .env_remove("JOURNAL_STREAM")
        .env_remove("NO_COLOR");
    if let Some(value) = no_color {
        command.env("NO_COLOR", value);
    }
    let output = command.output().expect("running script");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn colour_only_on_a_terminal_that_wants_it() {
    let fx = Fixture::new();
    let (enabled, disabled) = (common::new_uuid(), common::new_uuid());
    for (id, extra) in [(&enabled, ""), (&disabled, "enabled = false\n")] {
        fx.make_ext4(id);
        fx.register(id, "filesystem", extra);
    }
    let on_terminal = list_on_a_terminal(&fx, None, "xterm");
    assert!(
        on_terminal.contains("\x1b[33mdetached\x1b[0m"),
        "{on_terminal:?}"
    );
    assert!(
        on_terminal.contains("\x1b[2mdisabled\x1b[0m"),
        "{on_terminal:?}"
    );
    // An empty NO_COLOR is as good as none (no-color.org).
    assert!(list_on_a_terminal(&fx, Some(""), "xterm").contains('\x1b'));
    for (no_color, term) in [(Some("1"), "xterm"), (None, "dumb")] {
        let plain = list_on_a_terminal(&fx, no_color, term);
        assert!(plain.contains("detached"), "{plain:?}");
        assert!(!plain.contains('\x1b'), "{no_color:?} {term}: {plain:?}");
    }
    let piped = list(&fx, None, &[]);
    assert!(piped.stdout.contains("detached"), "{}", piped.stdout);
    assert!(!piped.stdout.contains('\x1b'), "{:?}", piped.stdout);
    let json = list(&fx, None, &["--json"]);
    assert!(!json.stdout.contains('\x1b'), "{:?}", json.stdout);
}

#[test]
fn json_keys_are_kept() {
    let fx = Fixture::new();
    let id = common::new_uuid();
    fx.make_ext4(&id);
    fx.register(&id, "filesystem", "name = \"db\"\n");
    let listed = list(&fx, None, &["--json"]).json();
    let keys = |value: &serde_json::Value| -> BTreeSet<String> {
        value
            .as_object()
            .expect("an object")
            .keys()
            .cloned()
            .collect()
    };
    // The keys `list --json` had before the compact table; only additions
    // are allowed.
    let before_volume = [
        "uuid",
        "name",
        // Issue 26: the volume a clone was made from.
        "origin",
        // Issue 26: the unit a volume was taken over from.
        "replaces_unit",
        "mode",
        // Issue 28: an encrypted volume's header, unlock and mapping.
        "encryption",
        "fs_type",
        "size",
        "allocated",
        "path",
        "enabled",
        "read_only",
        // Issue 25, item 2: what the attached device is now.
        "device_read_only",
        "device",
        "partition",
        "link",
        "link_state",
        "link_target",
        // Issue 27: what went through the device since the attach, and
        // the mounted file system's health.
        "io",
        "fs_health",
        "unit",
        "active_state",
        "sub_state",
        "unit_result",
        "attach_missed",
        "backing_fs",
        "problems",
    ];
    let volume = keys(&listed["volumes"][0]);
    for key in before_volume {
        assert!(volume.contains(key), "volume lost {key}: {volume:?}");
    }
    assert_eq!(volume.len(), before_volume.len(), "{volume:?}");
    // The order too: a row reads uuid first, and line-based scripts (the
    // VM suite's among them) split rows there. A report passed through a
    // sorted map once made every row start with "active_state".
    let raw = list(&fx, None, &["--json"]).stdout;
    let first_row = raw
        .split_once("\"volumes\":[")
        .map(|(_, rows)| rows)
        .unwrap_or_default();
    assert!(first_row.starts_with("{\"uuid\":"), "{raw}");
    assert!(raw.starts_with("{\"changed\":"), "{raw}");
    let top = keys(&listed);
    for key in ["changed", "volumes", "errors", "systemd_error"] {
        assert!(top.contains(key), "lost {key}: {top:?}");
    }
    assert_eq!(
        listed["storage_roots"][0]["storage_root"],
        "/var/lib/sparse-volume"
    );
    assert_eq!(listed["storage_roots"][0]["volumes"], 1);
    assert_eq!(listed["volumes"][0]["name"], "db");
}

#[test]
fn a_warning_is_said_once_not_once_per_volume() {
    needs_root!();
    let fx = Fixture::new();
    let storage = fx.mount_storage(64 << 20);
    let ids: Vec<String> = (0..3).map(|_| common::new_uuid()).collect();
    for id in &ids {
        // Sparse and far larger than the file system: it is short.
        fx.sparse_file_of(&fx.backing(id), 1 << 30);
        fx.register(id, "filesystem", "");
    }
    fx.open_directories_to_everyone();
    let run = fx.run_as_nobody(&["list"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let said: Vec<String> = run
        .stderr
        .lines()
        .map(|line| {
            let line = line.trim_start_matches("sparse-volume: warning: ");
            ids.iter()
                .find_map(|id| line.strip_prefix(&format!("{id}: ")))
                .unwrap_or(line)
                .to_string()
        })
        .collect();
    let distinct: BTreeSet<&String> = said.iter().collect();
    assert_eq!(distinct.len(), said.len(), "repeated:\n{}", run.stderr);
    assert_eq!(
        said.iter()
            .filter(|l| l.starts_with("unit states are unknown"))
            .count(),
        1,
        "{}",
        run.stderr
    );
    let about_space: Vec<&str> = run
        .stdout
        .lines()
        .chain(run.stderr.lines())
        .filter(|l| l.contains(" free"))
        .collect();
    assert_eq!(
        about_space.len(),
        1,
        "stdout:\n{}\nstderr:\n{}",
        run.stdout,
        run.stderr
    );
    assert!(
        about_space[0].starts_with("! /var/lib/sparse-volume: "),
        "{}",
        about_space[0]
    );
    assert!(about_space[0].contains("short by"), "{}", about_space[0]);
    // Each row marks its volume as one on the short file system.
    assert_eq!(
        run.stdout.lines().filter(|l| l.contains("% !")).count(),
        3,
        "{}",
        run.stdout
    );
    drop(storage);
}

#[test]
fn every_file_system_holding_volumes_gets_a_footer_line() {
    needs_root!();
    let fx = Fixture::new();
    let _storage = fx.mount_storage(64 << 20);
    // The volume's directory is no storage root any more (config.toml
    // changed after it was registered); its file system still counts.
    fs::create_dir_all(fx.host(SECOND_ROOT)).unwrap();
    fs::write(
        fx.host("/etc/sparse-volume/config.toml"),
        format!("storage_roots = [\"{SECOND_ROOT}\"]\n"),
    )
    .unwrap();
    let id = common::new_uuid();
    fx.sparse_file_of(&fx.backing(&id), 1 << 30);
    fx.register(&id, "filesystem", "");
    let run = list(&fx, None, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let footer: Vec<&str> = run
        .stdout
        .lines()
        .filter(|l| l.contains(" free of "))
        .collect();
    assert_eq!(footer.len(), 2, "{}", run.stdout);
    assert!(
        footer[0].starts_with(&format!("{SECOND_ROOT}: ")) && footer[0].contains("0 volumes"),
        "{}",
        run.stdout
    );
    assert!(
        footer[1].starts_with("! /var/lib/sparse-volume: ")
            && footer[1].contains("1 volume may grow by 1G: short by"),
        "{}",
        run.stdout
    );
    let json = list(&fx, None, &["--json"]).json();
    assert_eq!(json["storage_roots"].as_array().unwrap().len(), 1, "{json}");
}

/// Issue 25, item 11: without root, the backing files in a storage root
/// that only root may enter cannot be read: one line says so, not one per
/// volume.
#[test]
fn a_listing_without_root_says_once_what_it_could_not_read() {
    needs_root!();
    let fx = Fixture::new();
    for name in ["a", "b", "c"] {
        fx.run_ok(&["create", "--size", "16M", "--name", name]);
    }
    fx.open_directories_to_everyone();
    std::fs::set_permissions(
        fx.host("/var/lib/sparse-volume"),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let run = fx.run_as_nobody(&["list"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let about_root: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("root") || l.contains("Permission denied"))
        .collect();
    assert_eq!(about_root.len(), 1, "{}", run.stderr);
    assert!(about_root[0].contains("3 volume"), "{}", run.stderr);
}

/// `list --names`: the words the shell completions offer, from the
/// registry alone (no root, no devices), the same in JSON.
#[test]
fn names_are_each_uuid_and_name_one_per_line() {
    let fx = Fixture::new();
    let named = uuid(1);
    let unnamed = uuid(2);
    fx.register(&named, "filesystem", "name = \"pg-data\"\n");
    fx.register(&unnamed, "block", "");
    fs::write(fx.registry_file(&uuid(3)), "uuid = [\n").unwrap();
    let run = list(&fx, None, &["--names"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let mut expected = vec![named.clone(), unnamed.clone(), "pg-data".to_string()];
    expected.sort();
    assert_eq!(run.stdout.lines().collect::<Vec<_>>(), expected);
    let json = list(&fx, None, &["--names", "--json"]).json();
    assert_eq!(json["volumes"].as_array().unwrap().len(), 2, "{json}");
    assert!(json["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|v| v["uuid"] == named && v["name"] == "pg-data"));
    // --names and --wide do not go together.
    assert_eq!(list(&fx, None, &["--names", "--wide"]).code, 2);
}
