//! `sparse-volume clone`: on storage that shares extents (xfs with
//! reflink, btrfs) and on storage that does not (ext4), of volumes mounted,
//! attached and detached, in both modes. The witnesses are not ours:
//! `blkid` and `sgdisk` read the identities, `e2fsck` the copied file
//! systems, a mount of the clone its data, `losetup` the devices.

mod common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::{loops_of, tool, DetachOnDrop, Fixture, Mounted};
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// A file of `bytes` pseudo-random bytes under `dir`, synced; its content.
fn write_synced(dir: &Path, name: &str, bytes: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    let data: Vec<u8> = (0..bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    let mut file = fs::File::create(dir.join(name)).unwrap();
    file.write_all(&data).unwrap();
    file.sync_all().unwrap();
    data
}

fn blkid(path: &Path, tag: &str) -> String {
    tool(
        "blkid",
        &["-p", "-o", "value", "-s", tag, path.to_str().unwrap()],
    )
    .trim()
    .to_string()
}

/// The clone's data as a mount of it reads it: attached, mounted
/// read-only, read, unmounted, detached.
fn read_through_clone(fx: &Fixture, clone: &str, file: &str) -> Vec<u8> {
    let device = fx.run_ok(&["attach", clone, "--json"]).json()["device"]
        .as_str()
        .unwrap()
        .to_string();
    let _detach = DetachOnDrop::new(device.clone());
    let mounted = Mounted::new(fx, &device, &["-o", "ro"]).expect("mounting the clone");
    let data = fs::read(mounted.0.join(file)).unwrap();
    drop(mounted);
    fx.run_ok(&["detach", clone]);
    data
}

fn committed_growth(fx: &Fixture) -> u64 {
    fx.run_ok(&["list", "--json"]).json()["storage_roots"][0]["committed_growth"]
        .as_u64()
        .unwrap()
}

/// Files in the storage root, the hidden ones included.
fn stored_files(fx: &Fixture) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(fx.host("/var/lib/sparse-volume"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "lost+found")
        .collect();
    names.sort();
    names
}

fn created(fx: &Fixture, args: &[&str]) -> (String, String) {
    let made = fx
        .run_ok(&[&["create", "--now", "--json"], args].concat())
        .json();
    (
        made["uuid"].as_str().unwrap().to_string(),
        made["device"].as_str().unwrap().to_string(),
    )
}

#[test]
fn a_mounted_ext4_on_reflink_storage_is_cloned_frozen_with_its_own_uuid_and_the_same_data() {
    needs_root!();
    for storage in ["xfs", "btrfs"] {
        let fx = Fixture::new();
        let _storage = fx.mount_reflink_storage(2048 * MIB, storage);
        let (source, device) = created(&fx, &["--size", "256M", "--name", "pg"]);
        let _detach = DetachOnDrop::new(device.clone());
        let mounted = Mounted::new(&fx, &device, &[]).expect("mounting pg");
        let data = write_synced(&mounted.0, "data", 24 * MIB as usize, 7);
        let before = committed_growth(&fx);

        let report = fx
            .run_ok(&["clone", "pg", "--name", "pg-copy", "--json"])
            .json();
        assert_eq!(report["changed"], true, "{storage}: {report}");
        assert_eq!(report["method"], "reflink", "{storage}: {report}");
        assert_eq!(report["consistency"], "frozen", "{storage}: {report}");
        assert_eq!(report["origin"], source.as_str());
        let frozen_ms = report["frozen_ms"].as_u64().expect("frozen_ms");
        let clone = report["uuid"].as_str().unwrap().to_string();
        assert_ne!(clone, source);

        // Two identities, each carried by its own file.
        assert_eq!(blkid(&fx.backing(&source), "UUID"), source, "{storage}");
        assert_eq!(blkid(&fx.backing(&clone), "UUID"), clone, "{storage}");
        // ext4 with metadata_csum: every checksum was rewritten for the
        // new UUID, or e2fsck would find them wrong.
        let features = tool("dumpe2fs", &["-h", fx.backing(&clone).to_str().unwrap()]);
        assert!(features.contains("metadata_csum"), "{features}");
        tool("e2fsck", &["-fn", fx.backing(&clone).to_str().unwrap()]);

        // The source is still mounted and written; the clone holds what
        // was synced at the instant.
        write_synced(&mounted.0, "later", MIB as usize, 8);
        assert!(
            read_through_clone(&fx, &clone, "data") == data,
            "{storage}: data"
        );
        assert!(fs::read(mounted.0.join("data")).unwrap() == data);

        // The shared extents are counted once: the clone commits its
        // size (less the few blocks it owns already, its own metadata),
        // and the source's data, now shared, is not counted again.
        let after = committed_growth(&fx);
        assert!(
            after + 16 * MIB >= before + 256 * MIB && after <= before + 257 * MIB,
            "{storage}: committed growth {before} -> {after}"
        );
        let listed = fx.run_ok(&["list", "--json"]).json();
        let volumes = listed["volumes"].as_array().unwrap();
        assert_eq!(volumes[0]["uuid"], source.as_str());
        assert_eq!(volumes[1]["origin"], source.as_str());
        let table = fx.run_ok(&["list"]).stdout;
        assert!(table.contains("└ pg-copy"), "{table}");
        eprintln!("{storage}: frozen for {frozen_ms} ms; committed growth {before} -> {after}");
        drop(mounted);
        fx.run_ok(&["detach", "pg"]);
    }
}

#[test]
fn an_unmounted_xfs_and_a_block_volume_in_use_are_cloned_by_reflink_with_identities_of_their_own() {
    needs_root!();
    let fx = Fixture::new();
    let _storage = fx.mount_reflink_storage(2048 * MIB, "xfs");

    // xfs: mounted, it is refused (its frozen log would keep the old
    // UUID), and nothing is left behind; unmounted, it is cloned.
    let (source, device) = created(&fx, &["--size", "320M", "--fs", "xfs", "--name", "logs"]);
    let _detach = DetachOnDrop::new(device.clone());
    let mounted = Mounted::new(&fx, &device, &[]).expect("mounting logs");
    let data = write_synced(&mounted.0, "data", 8 * MIB as usize, 9);
    let files = stored_files(&fx);
    let refused = fx.run(&["clone", "logs", "--name", "logs-copy"]);
    assert_eq!(refused.code, 1, "{}", refused.stdout);
    assert!(refused.stderr.contains("unmount it"), "{}", refused.stderr);
    assert_eq!(stored_files(&fx), files);
    drop(mounted);
    let report = fx
        .run_ok(&["clone", "logs", "--name", "logs-copy", "--json"])
        .json();
    assert_eq!(report["method"], "reflink");
    assert_eq!(report["consistency"], "crash-consistent", "{report}");
    let clone = report["uuid"].as_str().unwrap().to_string();
    assert_eq!(blkid(&fx.backing(&clone), "UUID"), clone);
    assert_eq!(blkid(&fx.backing(&source), "UUID"), source);
    assert!(read_through_clone(&fx, &clone, "data") == data);
    fx.run_ok(&["detach", "logs"]);

    // Block: attached, written through the device, cloned as it is.
    let (block, device) = created(&fx, &["--size", "64M", "--mode", "block", "--name", "raw"]);
    let _detach = DetachOnDrop::new(device.clone());
    let pattern: Vec<u8> = (0..4 * MIB as usize).map(|i| (i % 251) as u8).collect();
    {
        let mut disk = fs::OpenOptions::new().write(true).open(&device).unwrap();
        std::io::Seek::seek(&mut disk, std::io::SeekFrom::Start(MIB)).unwrap();
        disk.write_all(&pattern).unwrap();
        disk.sync_all().unwrap();
    }
    let report = fx
        .run_ok(&["clone", "raw", "--name", "raw-copy", "--json"])
        .json();
    assert_eq!(report["consistency"], "crash-consistent", "{report}");
    let clone = report["uuid"].as_str().unwrap().to_string();
    let sgdisk = |uuid: &str, args: &[&str]| {
        tool(
            "sgdisk",
            &[args, &[fx.backing(uuid).to_str().unwrap()]].concat(),
        )
    };
    let partition = sgdisk(&clone, &["-i", "1"]);
    assert!(
        partition.contains(&clone.to_uppercase()) && partition.contains(&format!("'{clone}'")),
        "{partition}"
    );
    let disk_guid = |uuid: &str| {
        sgdisk(uuid, &["-p"])
            .lines()
            .find(|l| l.starts_with("Disk identifier (GUID)"))
            .unwrap()
            .to_string()
    };
    assert_ne!(disk_guid(&clone), disk_guid(&block));
    assert!(sgdisk(&block, &["-i", "1"]).contains(&block.to_uppercase()));
    let copied = fs::read(fx.backing(&clone)).unwrap();
    assert!(copied[MIB as usize..5 * MIB as usize] == pattern[..]);
    fx.run_ok(&["detach", "raw"]);
}

#[test]
fn on_storage_without_reflink_a_volume_in_use_is_copied_only_frozen_for_the_whole_copy() {
    needs_root!();
    let fx = Fixture::new();
    let _storage = fx.mount_storage(1024 * MIB);
    let (source, device) = created(&fx, &["--size", "128M", "--name", "pg"]);
    let _detach = DetachOnDrop::new(device.clone());
    let mounted = Mounted::new(&fx, &device, &[]).expect("mounting pg");
    let data = write_synced(&mounted.0, "data", 16 * MIB as usize, 11);
    let files = stored_files(&fx);

    let refused = fx.run(&["clone", "pg", "--name", "copy"]);
    assert_eq!(refused.code, 1, "{}", refused.stdout);
    assert!(
        refused.stderr.contains("--freeze-during-copy") && refused.stderr.contains("no reflink"),
        "{}",
        refused.stderr
    );
    assert_eq!(stored_files(&fx), files, "a refused clone left files");
    assert!(!fx.run_ok(&["list", "--names"]).stdout.contains("copy"));

    let report = fx
        .run_ok(&[
            "clone",
            "pg",
            "--name",
            "copy",
            "--freeze-during-copy",
            "--json",
        ])
        .json();
    assert_eq!(report["method"], "copy", "{report}");
    assert_eq!(report["consistency"], "frozen", "{report}");
    assert!(report["copied_bytes"].as_u64().unwrap() >= 16 * MIB);
    let clone = report["uuid"].as_str().unwrap().to_string();
    // Holes kept: the copy takes about what the source takes.
    let (source_blocks, clone_blocks) = (
        fs::metadata(fx.backing(&source)).unwrap().blocks() * 512,
        fs::metadata(fx.backing(&clone)).unwrap().blocks() * 512,
    );
    assert!(
        clone_blocks <= source_blocks + 4 * MIB && clone_blocks < 64 * MIB,
        "source {source_blocks} bytes on disk, copy {clone_blocks}"
    );
    assert_eq!(blkid(&fx.backing(&clone), "UUID"), clone);
    drop(mounted);

    // Attached and not mounted: only a reflink would be consistent.
    let refused = fx.run(&["clone", "pg", "--name", "copy2"]);
    assert_eq!(refused.code, 1);
    assert!(
        refused.stderr.contains("detach it first"),
        "{}",
        refused.stderr
    );
    fx.run_ok(&["detach", "pg"]);
    let offline = fx
        .run_ok(&["clone", "pg", "--name", "copy2", "--json"])
        .json();
    assert_eq!(offline["consistency"], "offline", "{offline}");
    assert!(read_through_clone(&fx, &clone, "data") == data);
    let clone2 = offline["uuid"].as_str().unwrap();
    assert!(read_through_clone(&fx, clone2, "data") == data);
    assert!(loops_of(&fx.backing(&source)).is_empty());
}

#[test]
fn a_repeated_clone_changes_nothing_and_a_snapshot_is_read_only_and_not_enabled() {
    needs_root!();
    let fx = Fixture::new();
    let source = fx
        .run_ok(&["create", "--size", "32M", "--name", "db", "--json"])
        .json()["uuid"]
        .as_str()
        .unwrap()
        .to_string();
    fx.run_ok(&["create", "--size", "32M", "--name", "other"]);

    let planned = fx.run_ok(&[
        "clone",
        "db",
        "--name",
        "snap",
        "--snapshot",
        "--dry-run",
        "--json",
    ]);
    assert_eq!(planned.json()["changed"], true);
    assert!(!fx.run_ok(&["list", "--names"]).stdout.contains("snap"));

    let made = fx
        .run_ok(&["clone", "db", "--name", "snap", "--snapshot", "--json"])
        .json();
    let snap = made["uuid"].as_str().unwrap().to_string();
    let text = fs::read_to_string(fx.registry_file(&snap)).unwrap();
    let entry: toml::Value = toml::from_str(&text).unwrap();
    assert_eq!(entry["read_only"].as_bool(), Some(true), "{text}");
    assert_eq!(entry["enabled"].as_bool(), Some(false), "{text}");
    assert_eq!(entry["origin"].as_str(), Some(source.as_str()), "{text}");
    assert_eq!(
        entry.get("preallocated").and_then(|p| p.as_bool()),
        Some(false)
    );

    let again: Value = fx
        .run_ok(&["clone", "db", "--name", "snap", "--snapshot", "--json"])
        .json();
    assert_eq!(again["changed"], false, "{again}");
    assert_eq!(again["uuid"], snap.as_str());
    // The same name with other properties, or a name another volume has.
    let differs = fx.run(&["clone", "db", "--name", "snap"]);
    assert_eq!(differs.code, 1);
    assert!(
        differs.stderr.contains("read_only = true"),
        "{}",
        differs.stderr
    );
    let taken = fx.run(&["clone", "db", "--name", "other"]);
    assert_eq!(taken.code, 1);
    assert!(taken.stderr.contains("not a clone of"), "{}", taken.stderr);
    // A snapshot is attached read-only when asked.
    let device = fx.run_ok(&["attach", "snap", "--json"]).json()["device"]
        .as_str()
        .unwrap()
        .to_string();
    let _detach = DetachOnDrop::new(device.clone());
    assert_eq!(common::sysfs_flag(&device, "ro"), "1");
    fx.run_ok(&["detach", "snap"]);
    let check = fx.run(&["check", "--json"]);
    assert_eq!(check.json()["clean"], true, "{}", check.stdout);
}

/// Config management makes clones through `apply` (the Ansible module and
/// the Salt state call it): `clone_of` with a name, and the rest settled
/// as for any volume.
#[test]
fn apply_makes_a_clone_once_and_settles_it_like_any_volume() {
    needs_root!();
    let fx = Fixture::new();
    let source = fx
        .run_ok(&["create", "--size", "32M", "--name", "db", "--json"])
        .json()["uuid"]
        .as_str()
        .unwrap()
        .to_string();
    fx.run_ok(&["create", "--size", "32M", "--name", "other"]);
    let args = [
        "apply",
        "--name",
        "db-copy",
        "--clone-of",
        "db",
        "--size",
        "64M",
        "--enabled",
        "false",
        "--json",
    ];
    let planned = fx.run_ok(&[&args[..], &["--dry-run"]].concat()).json();
    assert_eq!(planned["changed"], true, "{planned}");
    assert!(!fx.run_ok(&["list", "--names"]).stdout.contains("db-copy"));

    let made = fx.run_ok(&args).json();
    let actions: Vec<&str> = made["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(actions[0], format!("clone {source}"), "{made}");
    assert!(actions.iter().any(|a| a.starts_with("resize")), "{made}");
    let clone = made["uuid"].as_str().unwrap().to_string();
    let entry: toml::Value =
        toml::from_str(&fs::read_to_string(fx.registry_file(&clone)).unwrap()).unwrap();
    assert_eq!(entry["origin"].as_str(), Some(source.as_str()));
    assert_eq!(entry["size"].as_integer(), Some(64 * MIB as i64));
    assert_eq!(entry["enabled"].as_bool(), Some(false));
    assert_eq!(blkid(&fx.backing(&clone), "UUID"), clone);

    let again = fx.run_ok(&args).json();
    assert_eq!(again["changed"], false, "{again}");
    // A document says the same; an existing volume never becomes a clone.
    let document = r#"{"name": "db-copy", "clone_of": "db", "size": "64M", "enabled": false}"#;
    let from_stdin = fx
        .command(&["apply", "--stdin", "--json"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            child.stdin.take().unwrap().write_all(document.as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    let report: Value = serde_json::from_slice(&from_stdin.stdout).unwrap();
    assert_eq!(report["changed"], false, "{report}");
    let refused = fx.run(&["apply", "--name", "other", "--clone-of", "db"]);
    assert_eq!(refused.code, 1);
    assert!(
        refused.stderr.contains("not a clone of"),
        "{}",
        refused.stderr
    );
    let usage = fx.run(&["apply", "--name", "x", "--clone-of", "db", "--fs", "xfs"]);
    assert_eq!(usage.code, 2, "{}", usage.stderr);
}

/// The source's mount point covered by another mount: its path leads to
/// that file system, which must not be frozen in the source's place (the
/// reviewer's case: the storage root itself mounted over it, where the
/// copy then waited on its own freeze).
#[test]
fn a_covered_mount_point_refuses_the_clone_instead_of_freezing_what_covers_it() {
    needs_root!();
    let fx = Fixture::new();
    let (_, device) = created(&fx, &["--size", "32M", "--name", "pg"]);
    let _detach = DetachOnDrop::new(device.clone());
    let mounted = Mounted::new(&fx, &device, &[]).expect("mounting pg");
    let cover = Mounted::new(&fx, "cover", &["-t", "tmpfs"]).expect("a tmpfs");
    tool(
        "mount",
        &[
            "--bind",
            cover.0.to_str().unwrap(),
            mounted.0.to_str().unwrap(),
        ],
    );
    let refused = fx.run_within(
        60,
        &["clone", "pg", "--name", "copy", "--freeze-during-copy"],
    );
    let _ = std::process::Command::new("umount")
        .arg(&mounted.0)
        .status();
    assert_eq!(refused.code, 1, "{}{}", refused.stdout, refused.stderr);
    assert!(
        refused.stderr.contains("a mount covers it"),
        "{}",
        refused.stderr
    );
    assert!(!fx.run_ok(&["list", "--names"]).stdout.contains("copy"));
    drop(cover);
    drop(mounted);
    fx.run_ok(&["detach", "pg"]);
}

/// A file system the consumer made inside a block volume's partition is
/// an identity too: an ext4 there gets a new UUID in the clone, an xfs
/// (whose tools take no offset into a file) makes the clone refused.
#[test]
fn a_file_system_inside_a_block_volume_gets_its_own_uuid_or_the_clone_is_refused() {
    needs_root!();
    let fx = Fixture::new();
    let _storage = fx.mount_reflink_storage(2048 * MIB, "xfs");
    let ext4_inside = fx
        .run_ok(&[
            "create", "--size", "64M", "--mode", "block", "--name", "raw", "--json",
        ])
        .json()["uuid"]
        .as_str()
        .unwrap()
        .to_string();
    let file = fx.backing(&ext4_inside);
    let inside = format!("{}?offset={MIB}", file.display());
    tool(
        "mkfs.ext4",
        &[
            "-q",
            "-F",
            "-E",
            &format!("offset={MIB}"),
            file.to_str().unwrap(),
            "60M",
        ],
    );
    let blkid_inside = |path: &Path| {
        tool(
            "blkid",
            &[
                "-p",
                "-O",
                &MIB.to_string(),
                "-o",
                "value",
                "-s",
                "UUID",
                path.to_str().unwrap(),
            ],
        )
        .trim()
        .to_string()
    };
    let consumers = blkid_inside(&file);
    let report = fx
        .run_ok(&["clone", "raw", "--name", "raw-copy", "--json"])
        .json();
    let clone = report["uuid"].as_str().unwrap().to_string();
    let renewed = report["consumer_fs_uuid"]
        .as_str()
        .expect("consumer_fs_uuid")
        .to_string();
    assert_eq!(blkid_inside(&fx.backing(&clone)), renewed);
    assert_ne!(renewed, consumers);
    assert_eq!(blkid_inside(&file), consumers, "the source's changed");
    tool(
        "e2fsck",
        &[
            "-fn",
            &format!("{}?offset={MIB}", fx.backing(&clone).display()),
        ],
    );
    tool("e2fsck", &["-fn", &inside]);

    let xfs_inside = fx
        .run_ok(&[
            "create", "--size", "320M", "--mode", "block", "--name", "raw-xfs", "--json",
        ])
        .json()["uuid"]
        .as_str()
        .unwrap()
        .to_string();
    let image = fx.host("/xfs.img");
    fx.sparse_file_of(&image, 300 * MIB);
    tool("mkfs.xfs", &["-q", image.to_str().unwrap()]);
    tool(
        "dd",
        &[
            &format!("if={}", image.display()),
            &format!("of={}", fx.backing(&xfs_inside).display()),
            "bs=1M",
            "seek=1",
            "conv=notrunc,sparse",
            "status=none",
        ],
    );
    let files = stored_files(&fx);
    let refused = fx.run(&["clone", "raw-xfs", "--name", "raw-xfs-copy"]);
    assert_eq!(refused.code, 1, "{}", refused.stdout);
    assert!(
        refused.stderr.contains("holds an xfs"),
        "{}",
        refused.stderr
    );
    assert_eq!(stored_files(&fx), files);
}

/// A source whose resize was interrupted (its file longer than the
/// registry says) is not cloned at either size.
#[test]
fn a_source_with_an_interrupted_resize_is_refused() {
    needs_root!();
    let fx = Fixture::new();
    let source = fx
        .run_ok(&["create", "--size", "32M", "--name", "db", "--json"])
        .json()["uuid"]
        .as_str()
        .unwrap()
        .to_string();
    fs::OpenOptions::new()
        .write(true)
        .open(fx.backing(&source))
        .unwrap()
        .set_len(48 * MIB)
        .unwrap();
    let refused = fx.run(&["clone", "db", "--name", "copy"]);
    assert_eq!(refused.code, 1);
    assert!(
        refused.stderr.contains("an interrupted resize"),
        "{}",
        refused.stderr
    );
    fx.run_ok(&["resize", "db", "--size", "48M"]);
    fx.run_ok(&["clone", "db", "--name", "copy"]);
}
