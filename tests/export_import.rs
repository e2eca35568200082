//! `export` and `import`: round trips of every mode and file system, the
//! stream read by GNU tar as well, holes kept, and damaged or cut streams
//! refused with nothing registered. Witnesses: `cmp`, `du`, `blkid`, `tar`.

mod common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};

use common::{tool, DetachOnDrop, Fixture, Mounted};

const MIB: u64 = 1 << 20;

fn uuid_of(run: &common::Run) -> String {
    run.json()["uuid"].as_str().unwrap().to_string()
}

/// A volume with data written through its file system (or, in block
/// mode, through its device), detached again.
fn volume_with_data(fx: &Fixture, args: &[&str]) -> String {
    let made = fx.run_ok(&[&["create", "--now", "--json"], args].concat());
    let uuid = uuid_of(&made);
    let device = made.json()["device"].as_str().unwrap().to_string();
    let _detach = DetachOnDrop::new(device.clone());
    if args.contains(&"block") {
        let mut disk = fs::OpenOptions::new().write(true).open(&device).unwrap();
        std::io::Seek::seek(&mut disk, std::io::SeekFrom::Start(3 * MIB)).unwrap();
        disk.write_all(&vec![0x5a; 2 * MIB as usize]).unwrap();
        disk.sync_all().unwrap();
    } else {
        let mounted = Mounted::new(fx, &device, &[]).expect("mounting");
        let data: Vec<u8> = (0..6 * MIB as usize)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        fs::write(mounted.0.join("data"), data).unwrap();
    }
    fx.run_ok(&["detach", &uuid]);
    uuid
}

fn allocated(path: &Path) -> u64 {
    fs::metadata(path).unwrap().blocks() * 512
}

#[test]
fn every_mode_and_file_system_round_trips_with_its_holes_and_reads_in_gnu_tar() {
    needs_root!();
    for args in [
        &["--size", "64M", "--name", "e"][..],
        &["--size", "320M", "--fs", "xfs", "--name", "x"][..],
        &["--size", "64M", "--mode", "block", "--name", "b"][..],
    ] {
        let (here, there) = (Fixture::new(), Fixture::new());
        let uuid = volume_with_data(&here, args);
        let stream = here.host("/export.tar");
        let report = here
            .run_ok(&[
                "export",
                &uuid,
                "--output",
                stream.to_str().unwrap(),
                "--json",
            ])
            .json();
        assert_eq!(report["consistency"], "offline", "{report}");
        let data_bytes = report["data_bytes"].as_u64().unwrap();
        let source = here.backing(&uuid);
        // The stream carries the data, not the size.
        let size = fs::metadata(&source).unwrap().len();
        assert!(
            fs::metadata(&stream).unwrap().len() < data_bytes + MIB && data_bytes < size / 2,
            "{args:?}: a stream of {} bytes for {data_bytes} bytes of data",
            fs::metadata(&stream).unwrap().len()
        );

        let imported = there
            .run_ok(&["import", "--input", stream.to_str().unwrap(), "--json"])
            .json();
        assert_eq!(imported["uuid"], uuid.as_str(), "{imported}");
        let copy = there.backing(&uuid);
        tool("cmp", &[source.to_str().unwrap(), copy.to_str().unwrap()]);
        assert!(
            allocated(&copy) <= allocated(&source) + MIB && allocated(&copy) < size / 2,
            "{args:?}: holes lost: {} bytes allocated for the source's {}",
            allocated(&copy),
            allocated(&source)
        );
        // The imported volume attaches under its UUID.
        there.run_ok(&["attach", &uuid]);
        there.run_ok(&["detach", &uuid]);

        // GNU tar extracts the same file, sparse.
        let extracted = here.host("/extracted");
        fs::create_dir_all(&extracted).unwrap();
        tool(
            "tar",
            &[
                "-xf",
                stream.to_str().unwrap(),
                "-C",
                extracted.to_str().unwrap(),
            ],
        );
        let image = extracted.join(format!("{uuid}.img"));
        tool("cmp", &[source.to_str().unwrap(), image.to_str().unwrap()]);
        assert!(
            allocated(&image) < size / 2,
            "{args:?}: tar filled the holes"
        );
        let sums = tool("sha256sum", &[image.to_str().unwrap()]);
        assert!(!sums.is_empty());
    }
}

#[test]
fn a_pipe_moves_a_volume_and_a_new_uuid_makes_a_copy_beside_it() {
    needs_root!();
    let (here, there) = (Fixture::new(), Fixture::new());
    let uuid = volume_with_data(&here, &["--size", "64M", "--name", "pg"]);
    let cli = env!("CARGO_BIN_EXE_sparse-volume");
    let moved = Command::new("bash")
        .args([
            "-euo",
            "pipefail",
            "-c",
            &format!(
                "SPARSE_VOLUME_ROOT={} {cli} export pg | SPARSE_VOLUME_ROOT={} {cli} import --keep-uuid --json",
                here.root.path().display(),
                there.root.path().display()
            ),
        ])
        .env("DBUS_SYSTEM_BUS_ADDRESS", here.absent_bus())
        .output()
        .unwrap();
    assert!(moved.status.success(), "{moved:?}");
    let report: serde_json::Value = serde_json::from_slice(&moved.stdout).unwrap();
    assert_eq!(report["uuid"], uuid.as_str());
    assert!(String::from_utf8_lossy(&moved.stderr).contains(&format!("exported {uuid}")));
    tool(
        "cmp",
        &[
            here.backing(&uuid).to_str().unwrap(),
            there.backing(&uuid).to_str().unwrap(),
        ],
    );

    // Beside the original: nothing to do while it holds what the stream
    // does; refused once it was written; a copy under a new UUID.
    let stream = here.host("/pg.tar");
    here.run_ok(&["export", "pg", "--output", stream.to_str().unwrap()]);
    let same = here
        .run_ok(&["import", "--input", stream.to_str().unwrap(), "--json"])
        .json();
    assert_eq!(same["changed"], false, "{same}");
    let device = here.run_ok(&["attach", "pg", "--json"]).json()["device"]
        .as_str()
        .unwrap()
        .to_string();
    let _detach = DetachOnDrop::new(device.clone());
    let mounted = Mounted::new(&here, &device, &[]).expect("mounting pg");
    fs::write(mounted.0.join("later"), b"written after the export").unwrap();
    drop(mounted);
    here.run_ok(&["detach", "pg"]);
    let refused = here.run(&["import", "--input", stream.to_str().unwrap()]);
    assert_eq!(refused.code, 1);
    assert!(refused.stderr.contains("--new-uuid"), "{}", refused.stderr);
    let copy = here
        .run_ok(&[
            "import",
            "--input",
            stream.to_str().unwrap(),
            "--new-uuid",
            "--name",
            "pg-copy",
            "--json",
        ])
        .json();
    let new = copy["uuid"].as_str().unwrap().to_string();
    assert_ne!(new, uuid);
    assert_eq!(copy["exported_uuid"], uuid.as_str());
    let blkid = |path: &Path| {
        tool(
            "blkid",
            &["-p", "-o", "value", "-s", "UUID", path.to_str().unwrap()],
        )
        .trim()
        .to_string()
    };
    assert_eq!(blkid(&here.backing(&new)), new);
    assert_eq!(blkid(&here.backing(&uuid)), uuid);
    // An existing export file is never replaced.
    let again = here.run(&["export", "pg", "--output", stream.to_str().unwrap()]);
    assert_eq!(again.code, 1);
    assert!(again.stderr.contains("never replaces"), "{}", again.stderr);
}

#[test]
fn a_damaged_or_cut_stream_is_refused_with_one_line_and_nothing_registered() {
    needs_root!();
    let here = Fixture::new();
    let uuid = volume_with_data(&here, &["--size", "64M", "--name", "pg"]);
    let stream = here.host("/pg.tar");
    here.run_ok(&["export", "pg", "--output", stream.to_str().unwrap()]);
    let bytes = fs::read(&stream).unwrap();
    // A byte of the data changed (the pattern written is 6 MiB long).
    let at = bytes.len() / 2;
    let mut damaged = bytes.clone();
    damaged[at] ^= 0xff;
    let cut = &bytes[..bytes.len() / 3];
    for (what, stream_bytes, says) in [
        ("damaged", &damaged[..], "checksum"),
        ("cut", cut, "the stream ends"),
    ] {
        let there = Fixture::new();
        let input = there.host("/in.tar");
        fs::write(&input, stream_bytes).unwrap();
        for dry in [true, false] {
            let mut args = vec!["import", "--input", input.to_str().unwrap()];
            if dry {
                args.push("--dry-run");
            }
            let refused = there.run(&args);
            assert_eq!(refused.code, 1, "{what}: {}", refused.stdout);
            let lines: Vec<&str> = refused.stderr.lines().collect();
            assert_eq!(lines.len(), 1, "{what}: {}", refused.stderr);
            assert!(lines[0].contains(says), "{what}: {}", refused.stderr);
        }
        assert!(!there.registry_file(&uuid).exists(), "{what}: registered");
        let storage = there.host("/var/lib/sparse-volume");
        let left: Vec<_> = fs::read_dir(&storage)
            .map(|d| d.map(|e| e.unwrap().file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{what}: left {left:?}");
        assert_eq!(there.run(&["check", "--json"]).json()["clean"], true);
    }
    // The whole stream, dry: checked, not written.
    let there = Fixture::new();
    let input = there.host("/in.tar");
    fs::write(&input, &bytes).unwrap();
    let planned = there
        .run_ok(&[
            "import",
            "--input",
            input.to_str().unwrap(),
            "--dry-run",
            "--json",
        ])
        .json();
    assert_eq!(planned["uuid"], uuid.as_str());
    assert!(!there.registry_file(&uuid).exists());
}

#[test]
fn a_volume_in_use_is_exported_from_one_instant() {
    needs_root!();
    // Storage that shares extents: a frozen reflink, then the writing.
    let here = Fixture::new();
    let _storage = here.mount_reflink_storage(1024 * MIB, "xfs");
    let made = here.run_ok(&["create", "--size", "64M", "--name", "pg", "--now", "--json"]);
    let uuid = uuid_of(&made);
    let device = made.json()["device"].as_str().unwrap().to_string();
    let _detach = DetachOnDrop::new(device.clone());
    let mounted = Mounted::new(&here, &device, &[]).expect("mounting");
    fs::write(mounted.0.join("data"), vec![7u8; 3 * MIB as usize]).unwrap();
    let stream = here.host("/pg.tar");
    let report = here
        .run_ok(&[
            "export",
            "pg",
            "--output",
            stream.to_str().unwrap(),
            "--json",
        ])
        .json();
    assert_eq!(report["consistency"], "frozen", "{report}");
    let there = Fixture::new();
    there.run_ok(&["import", "--input", stream.to_str().unwrap()]);
    let imported = there.run_ok(&["attach", &uuid, "--json"]).json()["device"]
        .as_str()
        .unwrap()
        .to_string();
    let _detach_there = DetachOnDrop::new(imported.clone());
    let copy = Mounted::new(&there, &imported, &["-o", "ro"]).expect("mounting the import");
    assert!(fs::read(copy.0.join("data")).unwrap() == vec![7u8; 3 * MIB as usize]);
    drop(copy);
    there.run_ok(&["detach", &uuid]);
    drop(mounted);
    here.run_ok(&["detach", "pg"]);

    // Storage without reflink: only frozen for the whole copy.
    let plain = Fixture::new();
    let made = plain.run_ok(&["create", "--size", "32M", "--name", "pg", "--now", "--json"]);
    let device = made.json()["device"].as_str().unwrap().to_string();
    let _detach = DetachOnDrop::new(device.clone());
    let mounted = Mounted::new(&plain, &device, &[]).expect("mounting");
    let output = plain.host("/pg.tar");
    let refused = plain.run(&["export", "pg", "--output", output.to_str().unwrap()]);
    assert_eq!(refused.code, 1);
    assert!(
        refused.stderr.contains("--freeze-during-copy"),
        "{}",
        refused.stderr
    );
    assert!(!output.exists());
    let frozen = plain
        .run_ok(&[
            "export",
            "pg",
            "--output",
            output.to_str().unwrap(),
            "--freeze-during-copy",
            "--json",
        ])
        .json();
    assert_eq!(frozen["consistency"], "frozen", "{frozen}");
    drop(mounted);
    plain.run_ok(&["detach", "pg"]);
    let _ = Stdio::null();
}

/// What the reviews found: an xfs exported in use cannot change its UUID
/// (refused before any data is read, dry run included), a repeated import
/// is done already, a snapshot comes back not enabled, and a failure of
/// an export to standard output writes nothing into the stream.
#[test]
fn an_import_keeps_the_contract_of_the_other_commands() {
    needs_root!();
    let here = Fixture::new();
    let _storage = here.mount_reflink_storage(1024 * MIB, "xfs");
    let made = here.run_ok(&[
        "create", "--size", "320M", "--fs", "xfs", "--name", "logs", "--now", "--json",
    ]);
    let uuid = uuid_of(&made);
    let device = made.json()["device"].as_str().unwrap().to_string();
    let _detach = DetachOnDrop::new(device.clone());
    let mounted = Mounted::new(&here, &device, &[]).expect("mounting");
    fs::write(mounted.0.join("data"), b"kept").unwrap();
    let stream = here.host("/logs.tar");
    let report = here
        .run_ok(&[
            "export",
            "logs",
            "--output",
            stream.to_str().unwrap(),
            "--json",
        ])
        .json();
    assert_eq!(report["consistency"], "frozen");
    drop(mounted);
    here.run_ok(&["detach", "logs"]);
    let there = Fixture::new();
    for dry in [true, false] {
        let mut args = vec![
            "import",
            "--input",
            stream.to_str().unwrap(),
            "--new-uuid",
            "--name",
            "copy",
        ];
        if dry {
            args.push("--dry-run");
        }
        let refused = there.run(&args);
        assert_eq!(refused.code, 1, "dry {dry}: {}", refused.stdout);
        assert!(refused.stderr.contains("--keep-uuid"), "{}", refused.stderr);
    }
    // Under its own UUID it is a move; the same again is done already.
    let first = there
        .run_ok(&["import", "--input", stream.to_str().unwrap(), "--json"])
        .json();
    assert_eq!(first["changed"], true);
    let again = there
        .run_ok(&["import", "--input", stream.to_str().unwrap(), "--json"])
        .json();
    assert_eq!(again["changed"], false, "{again}");
    assert_eq!(again["uuid"], uuid.as_str());

    // A snapshot is exported and imported as one: not enabled.
    let plain = Fixture::new();
    plain.run_ok(&["create", "--size", "32M", "--name", "db"]);
    plain.run_ok(&["clone", "db", "--name", "snap", "--snapshot"]);
    let snap = plain.host("/snap.tar");
    plain.run_ok(&["export", "snap", "--output", snap.to_str().unwrap()]);
    let other = Fixture::new();
    let imported = other
        .run_ok(&["import", "--input", snap.to_str().unwrap(), "--json"])
        .json();
    let entry: toml::Value = toml::from_str(
        &fs::read_to_string(other.registry_file(imported["uuid"].as_str().unwrap())).unwrap(),
    )
    .unwrap();
    assert_eq!(entry["enabled"].as_bool(), Some(false));
    assert_eq!(entry["read_only"].as_bool(), Some(true));

    // A failed export to standard output: nothing on it, the object on
    // standard error.
    let failed = plain.run(&["export", "nosuch", "--json"]);
    assert_eq!(failed.code, 1);
    assert!(failed.stdout.is_empty(), "{:?}", failed.stdout);
    assert!(
        failed.stderr.contains("\"changed\":false"),
        "{}",
        failed.stderr
    );
    // A refused export to a file leaves nothing in its directory.
    let out_dir = plain.host("/out");
    fs::create_dir_all(&out_dir).unwrap();
    let made = plain.run_ok(&["attach", "db", "--json"]).json();
    let db_device = made["device"].as_str().unwrap().to_string();
    let _db = DetachOnDrop::new(db_device.clone());
    let db_mounted = Mounted::new(&plain, &db_device, &[]).expect("mounting db");
    let refused = plain.run(&[
        "export",
        "db",
        "--output",
        out_dir.join("db.tar").to_str().unwrap(),
    ]);
    assert_eq!(refused.code, 1);
    assert_eq!(fs::read_dir(&out_dir).unwrap().count(), 0);
    drop(db_mounted);
    plain.run_ok(&["detach", "db"]);
}
