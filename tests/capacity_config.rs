//! The capacity settings of config.toml (`overcommit_ratio`, `reserve`)
//! at their exact boundaries, and `create --mkfs-option`. The storage root
//! is a small ext4 file system of its own, so its free space is known
//! (statvfs, not our code) and moves only when these tests write to it.

mod common;

use std::fs;
use std::path::Path;

use common::{free_and_total, new_uuid, tool, Fixture, MountedStorage, Run};

const MIB: u64 = 1 << 20;
/// Small enough to be cheap, large enough for several 4 KiB-block ext4
/// volumes and their journals.
const STORAGE: u64 = 128 * MIB;

fn write_config(fx: &Fixture, text: &str) {
    fs::write(fx.host("/etc/sparse-volume/config.toml"), text).unwrap();
}

fn create(fx: &Fixture, uuid: &str, size: u64) -> Run {
    fx.run(&["create", "--size", &size.to_string(), "--uuid", uuid])
}

/// What is in the storage root besides the file system's own lost+found.
fn storage_listing(storage: &MountedStorage) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(&storage.mount_point)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "lost+found")
        .collect();
    names.sort();
    names
}

/// A refused create: exit 1, one line that says why and how to allow
/// more, and nothing left behind on disk or in the registry.
fn assert_refused_for_space(fx: &Fixture, storage: &MountedStorage, uuid: &str, run: &Run) {
    assert_eq!(run.code, 1, "{uuid} was created: {}", run.stdout);
    assert_eq!(run.stderr.trim().lines().count(), 1, "{}", run.stderr);
    for needle in ["not enough space", "overcommit_ratio", "reserve"] {
        assert!(run.stderr.contains(needle), "{needle}: {}", run.stderr);
    }
    assert_eq!(storage_listing(storage), Vec::<String>::new());
    assert!(!fx.registry_file(uuid).exists());
}

fn assert_created(fx: &Fixture, uuid: &str, size: u64, run: &Run) {
    assert_eq!(run.code, 0, "{size} bytes refused: {}", run.stderr);
    assert_eq!(fs::metadata(fx.backing(uuid)).unwrap().len(), size);
    assert!(fx.registry_file(uuid).exists());
}

/// Bytes a volume's file has allocated, as stat(2) says.
fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(path).unwrap().blocks() * 512
}

#[test]
fn by_default_a_create_may_take_the_free_space_and_not_a_mib_more() {
    needs_root!();
    let fx = Fixture::new();
    let storage = fx.mount_storage(STORAGE);
    let free = storage.free();
    let whole_mibs = free / MIB * MIB;

    let too_big = new_uuid();
    let run = create(&fx, &too_big, whole_mibs + MIB);
    assert_refused_for_space(&fx, &storage, &too_big, &run);

    let fits = new_uuid();
    let run = create(&fx, &fits, whole_mibs);
    assert_created(&fx, &fits, whole_mibs, &run);
}

#[test]
fn a_reserve_in_bytes_is_kept_to_the_byte() {
    needs_root!();
    let fx = Fixture::new();
    let storage = fx.mount_storage(STORAGE);
    let free = storage.free();
    let size = free / MIB / 2 * MIB;
    let uuid = new_uuid();

    // One byte too much reserve for `size` to fit ...
    write_config(&fx, &format!("reserve = {}\n", free - size + 1));
    assert_eq!(storage.free(), free, "the storage moved under the test");
    let run = create(&fx, &uuid, size);
    assert_refused_for_space(&fx, &storage, &uuid, &run);

    // ... and exactly enough.
    write_config(&fx, &format!("reserve = {}\n", free - size));
    assert_eq!(storage.free(), free, "the storage moved under the test");
    let run = create(&fx, &uuid, size);
    assert_created(&fx, &uuid, size, &run);
}

#[test]
fn a_reserve_in_percent_is_taken_from_the_file_system_size() {
    needs_root!();
    let fx = Fixture::new();
    let storage = fx.mount_storage(STORAGE);
    write_config(&fx, "reserve = \"25%\"\n");
    let (free, total) = free_and_total(&storage.mount_point);
    let reserve = total / 4;
    let headroom = free - reserve;
    let fits = headroom / MIB * MIB;
    // Refused only because of the reserve: it would fit in the free space.
    assert!(fits + MIB < free, "the storage is too full: {free}");

    let too_big = new_uuid();
    let run = create(&fx, &too_big, fits + MIB);
    assert_refused_for_space(&fx, &storage, &too_big, &run);
    assert!(
        !run.stderr.contains("(0 B reserved"),
        "the reserve was not applied: {}",
        run.stderr
    );

    let uuid = new_uuid();
    let run = create(&fx, &uuid, fits);
    assert_created(&fx, &uuid, fits, &run);
}

#[test]
fn overcommit_ratio_two_promises_twice_the_free_space_and_counts_other_volumes() {
    needs_root!();
    let fx = Fixture::new();
    let storage = fx.mount_storage(STORAGE);
    let free = storage.free();
    // More than the file system has free, less than twice that.
    let size = free * 3 / 2 / MIB * MIB;
    assert!(size > free);
    let first = new_uuid();

    write_config(&fx, "overcommit_ratio = 1.0\n");
    let run = create(&fx, &first, size);
    assert_refused_for_space(&fx, &storage, &first, &run);

    // With ratio 2, promisable is 2 × free − reserve: a reserve one byte
    // above the slack refuses, exactly the slack accepts.
    write_config(
        &fx,
        &format!(
            "overcommit_ratio = 2.0\nreserve = {}\n",
            2 * free - size + 1
        ),
    );
    let run = create(&fx, &first, size);
    assert_refused_for_space(&fx, &storage, &first, &run);
    write_config(
        &fx,
        &format!("overcommit_ratio = 2.0\nreserve = {}\n", 2 * free - size),
    );
    assert_eq!(storage.free(), free, "the storage moved under the test");
    let run = create(&fx, &first, size);
    assert_created(&fx, &first, size, &run);

    // The first volume may still grow into what it has not allocated;
    // a second create is weighed against that, not only against free.
    write_config(&fx, "overcommit_ratio = 2.0\n");
    let free_now = storage.free();
    let potential = size - allocated(&fx.backing(&first));
    let headroom = 2 * free_now - potential;
    let fits = headroom / MIB * MIB;
    assert!(
        fits + MIB <= free_now,
        "the test needs a request that fits the free space alone: {fits} of {free_now}"
    );
    let second = new_uuid();
    let run = create(&fx, &second, fits + MIB);
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(
        run.stderr.contains("already committed to other volumes"),
        "{}",
        run.stderr
    );
    assert!(!fx.backing(&second).exists() && !fx.registry_file(&second).exists());
    let run = create(&fx, &second, fits);
    assert_created(&fx, &second, fits, &run);
}

#[test]
fn settings_that_do_not_validate_refuse_creates_with_file_and_line() {
    needs_root!();
    let fx = Fixture::new();
    let storage = fx.mount_storage(STORAGE);
    for (text, reason) in [
        (
            "reserve = 0\novercommit_ratio = 0.5\n",
            "overcommit_ratio must be a number >= 1.0",
        ),
        ("reserve = \"150%\"\n", "below 100%"),
    ] {
        write_config(&fx, text);
        let uuid = new_uuid();
        let run = create(&fx, &uuid, 16 * MIB);
        assert_eq!(run.code, 1, "{text}: {}", run.stdout);
        let config = fx.host("/etc/sparse-volume/config.toml");
        let line = text.lines().count();
        assert!(
            run.stderr
                .contains(&format!("{}:{line}:", config.display()))
                && run.stderr.contains(reason),
            "{text}: {}",
            run.stderr
        );
        assert_eq!(storage_listing(&storage), Vec::<String>::new());
        assert!(!fx.registry_file(&uuid).exists());
    }
}

// --- create --mkfs-option ---------------------------------------------------

fn blkid_value(path: &Path, tag: &str) -> String {
    tool(
        "blkid",
        &["-p", "-o", "value", "-s", tag, path.to_str().unwrap()],
    )
    .trim()
    .to_string()
}

fn recorded_mkfs_options(fx: &Fixture, uuid: &str) -> Vec<String> {
    let entry: toml::Table = fs::read_to_string(fx.registry_file(uuid))
        .unwrap()
        .parse()
        .unwrap();
    entry
        .get("mkfs_options")
        .and_then(|v| v.as_array())
        .map(|a| {
            a.iter()
                .map(|v| v.as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn mkfs_options_reach_mkfs_ext4_and_are_recorded() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    fx.run_ok(&[
        "create",
        "--size",
        "32M",
        "--uuid",
        &uuid,
        "--mkfs-option=-L",
        "--mkfs-option=pgdata",
        "--mkfs-option=-O",
        "--mkfs-option=^has_journal",
    ]);
    let path = fx.backing(&uuid);
    assert_eq!(blkid_value(&path, "LABEL"), "pgdata");
    assert_eq!(blkid_value(&path, "UUID"), uuid, "an option took the UUID");
    let header = tool("dumpe2fs", &["-h", path.to_str().unwrap()]);
    let features = header
        .lines()
        .find(|l| l.starts_with("Filesystem features:"))
        .expect("dumpe2fs lists the features");
    assert!(!features.contains("has_journal"), "{features}");
    assert!(
        header
            .lines()
            .any(|l| l.starts_with("Filesystem volume name:") && l.ends_with("pgdata")),
        "{header}"
    );
    assert_eq!(
        recorded_mkfs_options(&fx, &uuid),
        ["-L", "pgdata", "-O", "^has_journal"]
    );
}

#[test]
fn mkfs_options_reach_mkfs_xfs() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    fx.run_ok(&[
        "create",
        "--size",
        "320M",
        "--fs",
        "xfs",
        "--uuid",
        &uuid,
        "--mkfs-option=-L",
        "--mkfs-option=xlogs",
    ]);
    let path = fx.backing(&uuid);
    assert_eq!(blkid_value(&path, "TYPE"), "xfs");
    assert_eq!(blkid_value(&path, "UUID"), uuid);
    let label = tool("xfs_admin", &["-l", path.to_str().unwrap()]);
    assert_eq!(label.trim(), "label = \"xlogs\"");
    assert_eq!(recorded_mkfs_options(&fx, &uuid), ["-L", "xlogs"]);
}

/// A create whose mkfs fails on an option mkfs.ext4 does not know.
fn create_with_bad_option(fx: &Fixture, uuid: &str) -> Run {
    let run = fx.run(&[
        "create",
        "--size",
        "16M",
        "--uuid",
        uuid,
        "--mkfs-option=-Z",
    ]);
    assert_eq!(run.code, 1, "{}", run.stdout);
    run
}

#[test]
fn a_bad_mkfs_option_is_refused_with_the_reason_mkfs_gave() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    let run = create_with_bad_option(&fx, &uuid);
    assert_eq!(run.stderr.trim().lines().count(), 1, "{}", run.stderr);
    assert!(
        run.stderr.contains(&uuid) && run.stderr.contains("mkfs.ext4 failed"),
        "{}",
        run.stderr
    );
    // mkfs.ext4 says "invalid option -- 'Z'" first, then its usage text.
    assert!(
        run.stderr.contains("invalid option"),
        "the reason is lost: {}",
        run.stderr
    );
}

#[test]
fn a_bad_mkfs_option_leaves_no_file_and_no_entry() {
    needs_root!();
    let fx = Fixture::new();
    let storage = fx.mount_storage(STORAGE);
    let uuid = new_uuid();
    create_with_bad_option(&fx, &uuid);
    assert!(!fx.registry_file(&uuid).exists());
    assert_eq!(
        storage_listing(&storage),
        Vec::<String>::new(),
        "a failed create left files behind"
    );
    let check = fx.run(&["check", "--json"]);
    assert_eq!(
        check.json()["findings"],
        serde_json::json!([]),
        "{}",
        check.stdout
    );
}

#[test]
fn an_mkfs_option_cannot_give_the_volume_a_foreign_uuid() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    let foreign = new_uuid();
    let run = fx.run(&[
        "create",
        "--size",
        "16M",
        "--uuid",
        &uuid,
        "--mkfs-option=-U",
        &format!("--mkfs-option={foreign}"),
    ]);
    let path = fx.backing(&uuid);
    if run.code == 0 {
        // Accepted: then the file system must still be the volume.
        assert_eq!(
            blkid_value(&path, "UUID"),
            uuid,
            "create registered a volume whose file system is {foreign}"
        );
    } else {
        assert!(!path.exists() && !fx.registry_file(&uuid).exists());
    }
}
