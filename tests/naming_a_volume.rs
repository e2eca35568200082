//! Every way a command may name a volume (issue 25, items 7, 9 and 16):
//! its UUID in any case, its name, the beginning of its UUID that `list`
//! shows for an unnamed volume, its loop device (`/dev/loopN`, `loopN`),
//! and its backing file's path; with real files and real loop devices.
//! The kernel's answer decides for a device, not a name.

mod common;

use common::{loops_of, Fixture};

/// A volume made with `create` (not attached), and its UUID.
fn created(fx: &Fixture, extra: &[&str]) -> String {
    let mut args = vec!["create", "--size", "16M"];
    args.extend_from_slice(extra);
    args.push("--json");
    let run = fx.run_ok(&args);
    run.json()["uuid"].as_str().expect("a uuid").to_string()
}

fn uuid_of_status(fx: &Fixture, reference: &str) -> String {
    let run = fx.run_ok(&["status", reference, "--json"]);
    run.json()["uuid"].as_str().expect("a uuid").to_string()
}

#[test]
fn an_upper_case_uuid_names_the_volume() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = created(&fx, &[]);
    assert_eq!(uuid_of_status(&fx, &uuid.to_uppercase()), uuid);
    // And a new volume's UUID: stored and reported in lower case.
    let chosen = "6F1C2A8E-3B4D-4E5F-8A9B-0C1D2E3F4A5B";
    assert_eq!(created(&fx, &["--uuid", chosen]), chosen.to_lowercase());
    assert!(fx.registry_file(&chosen.to_lowercase()).is_file());
}

#[test]
fn the_short_id_list_shows_names_the_volume_and_an_ambiguous_one_is_refused() {
    needs_root!();
    let fx = Fixture::new();
    let first = "2183af89-0000-4000-8000-000000000001";
    let second = "2183af89-1111-4000-8000-000000000002";
    created(&fx, &["--uuid", first]);
    created(&fx, &["--uuid", second]);
    let other = created(&fx, &[]);
    // What list shows for an unnamed volume, typed back.
    assert_eq!(uuid_of_status(&fx, &other[..8]), other);
    assert_eq!(uuid_of_status(&fx, "2183af89-0"), first);
    assert_eq!(uuid_of_status(&fx, "2183AF89-1"), second);
    let ambiguous = fx.run(&["status", "2183af89"]);
    assert_eq!(ambiguous.code, 1, "{}", ambiguous.stderr);
    assert!(
        ambiguous.stderr.contains(first) && ambiguous.stderr.contains(second),
        "the refusal names both candidates: {}",
        ambiguous.stderr
    );
    // Too short to be told from a word.
    let short = fx.run(&["status", &other[..4]]);
    assert_eq!(short.code, 1, "{}", short.stderr);
    // A name that could be read as such a beginning is refused.
    let hexlike = fx.run(&["create", "--size", "16M", "--name", "2183af89"]);
    assert_eq!(hexlike.code, 1, "{}", hexlike.stderr);
    assert!(
        hexlike.stderr.contains("beginning of a UUID"),
        "{}",
        hexlike.stderr
    );
    // Dates stay names: hyphens where a UUID has none.
    let dated = created(&fx, &["--name", "2024-01-01"]);
    assert_eq!(uuid_of_status(&fx, "2024-01-01"), dated);
    // A name an older version gave, which also begins another volume's
    // UUID: refused, naming both, rather than either guessed.
    let entry = fx.registry_file(&dated);
    let text = std::fs::read_to_string(&entry).unwrap();
    std::fs::write(
        &entry,
        text.replace(
            "name = \"2024-01-01\"",
            &format!("name = \"{}\"", &other[..8]),
        ),
    )
    .unwrap();
    let both = fx.run(&["status", &other[..8]]);
    assert_eq!(both.code, 1, "{}", both.stderr);
    assert!(
        both.stderr.contains(&dated) && both.stderr.contains(&other),
        "{}",
        both.stderr
    );
}

#[test]
fn a_loop_device_or_a_backing_path_names_its_volume() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = created(&fx, &["--name", "pg-data"]);
    fx.run_ok(&["attach", &uuid]);
    let device = loops_of(&fx.backing(&uuid)).pop().expect("attached");
    let short = device.trim_start_matches("/dev/");
    assert_eq!(uuid_of_status(&fx, &device), uuid);
    assert_eq!(uuid_of_status(&fx, short), uuid);
    let backing = fx.logical_backing(&uuid);
    assert_eq!(uuid_of_status(&fx, &backing), uuid);

    // detach by device: the kernel's answer, then the volume's own detach.
    fx.run_ok(&["detach", &device]);
    assert!(loops_of(&fx.backing(&uuid)).is_empty());

    // remove by device, with its data: the device is checked again under
    // the lock, and the volume goes.
    fx.run_ok(&["attach", &uuid]);
    let device = loops_of(&fx.backing(&uuid)).pop().expect("attached");
    let removed = fx
        .run_ok(&["remove", &device, "--delete-data", "--json"])
        .json();
    assert_eq!(removed["uuid"], uuid.as_str(), "{removed}");
    assert_eq!(removed["data_deleted"], true, "{removed}");
    assert!(!fx.backing(&uuid).exists());
    // And by backing path.
    let second = created(&fx, &[]);
    fx.run_ok(&["remove", &fx.logical_backing(&second)]);
    assert!(!fx.registry_file(&second).exists());

    // A device that holds no volume: said so, naming what it holds.
    let stray = fx.host("/var/lib/sparse-volume/stray");
    fx.sparse_file_of(&stray, 16 << 20);
    let bound = common::DetachOnDrop::new(common::bound_by_hand(&stray, &[]));
    let refused = fx.run(&["status", bound.device()]);
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("no registered volume"),
        "{}",
        refused.stderr
    );
    // A name with a slash or a loop device's name is refused as a name.
    for name in ["/srv/pg", "loop7"] {
        let run = fx.run(&["create", "--size", "16M", "--name", name]);
        assert_eq!(run.code, 1, "{name}: {}", run.stderr);
    }
}

#[test]
fn an_unknown_name_says_where_the_names_are() {
    needs_root!();
    let fx = Fixture::new();
    let run = fx.run(&["status", "nope"]);
    assert_eq!(run.code, 1);
    assert!(
        run.stderr.contains("no volume is named \"nope\"")
            && run.stderr.contains("sparse-volume list"),
        "{}",
        run.stderr
    );
    assert_eq!(
        run.stderr.matches("nope").count(),
        1,
        "the name once: {}",
        run.stderr
    );
}

/// Issue 25, item 8: a repeated `remove` by name changes nothing and
/// succeeds, as it does by UUID; it says that nothing was removed, so a
/// mistyped name shows. Commands that need the volume still refuse.
#[test]
fn a_repeated_remove_by_name_succeeds_and_says_nothing_was_removed() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = created(&fx, &["--name", "pg2"]);
    let first = fx.run_ok(&["remove", "pg2", "--json"]).json();
    assert_eq!(first["changed"], true, "{first}");
    assert_eq!(first["uuid"], uuid.as_str());
    let again = fx.run(&["remove", "pg2", "--json"]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    let report = again.json();
    assert_eq!(report["changed"], false, "{report}");
    assert!(report["uuid"].is_null(), "{report}");
    // Said in the JSON too, so that config management sees a typo.
    assert!(
        report["note"]
            .as_str()
            .unwrap_or_default()
            .contains("no volume is named \"pg2\""),
        "{report}"
    );
    let human = fx.run_ok(&["remove", "pg2"]);
    assert!(
        human.stdout.contains("nothing to remove") && human.stdout.contains("pg2"),
        "{}",
        human.stdout
    );
    let status = fx.run(&["status", "pg2"]);
    assert_eq!(status.code, 1, "{}", status.stderr);
    // A path or a device that resolves to nothing may be a volume's,
    // written another way: not "nothing to remove".
    let other = created(&fx, &[]);
    let roundabout = format!("/var/lib/sparse-volume/../sparse-volume/{other}");
    for reference in [roundabout.as_str(), "loop4099"] {
        let refused = fx.run(&["remove", reference]);
        assert_eq!(refused.code, 1, "{reference}: {}", refused.stdout);
    }
    assert!(fx.registry_file(&other).exists());
    // A name held by a registry file that does not read is not "nothing to
    // remove": that volume may well exist.
    let broken = created(&fx, &["--name", "pg3"]);
    std::fs::write(fx.registry_file(&broken), "name = \"pg3\"\nsize = [\n").unwrap();
    let refused = fx.run(&["remove", "pg3"]);
    assert_eq!(refused.code, 1, "{}{}", refused.stdout, refused.stderr);
    assert!(
        refused.stderr.contains("does not read"),
        "{}",
        refused.stderr
    );
    // Nor when a stray byte that is not UTF-8 breaks the file.
    let web = created(&fx, &["--name", "web"]);
    let mut bytes = std::fs::read(fx.registry_file(&web)).unwrap();
    bytes.extend_from_slice(b"# \xff\n");
    std::fs::write(fx.registry_file(&web), bytes).unwrap();
    let refused = fx.run(&["remove", "web"]);
    assert_eq!(refused.code, 1, "{}{}", refused.stdout, refused.stderr);
    assert!(fx.registry_file(&web).exists());
}
